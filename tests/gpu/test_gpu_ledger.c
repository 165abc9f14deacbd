/* test_gpu_ledger.c - the ledger sees every device byte of the pool: each
 * segment a gpu.segment device block (reserved), each buffer a gpu.buffer,
 * both with the caller's host stack; a bad free of a device pointer is
 * free.invalid or free.double; and each GPU finding, exactly:
 *   gpu.leak              a buffer never freed (at exit, its allocation stack);
 *   gpu.pool-retained     a cached segment with no live buffer at exit (the
 *                         stack that made the segment), none after empty_cache;
 *   ref.leak              a device buffer kept by an extra reference;
 *   gpu.purge-referenced  gpu_pool_purge refusing a buffer still referenced,
 *                         while it frees the idle cache and the buffers
 *                         every owner released.
 * The sgemm library's workspace, for a backend that takes one (the host
 * backend's table with a 1 MiB workspace wanted): the first pool over it
 * gives it a gpu.blas-workspace block (reserved) and the second does not;
 * destroying the pool takes it back from the library and frees it.
 * Exit findings come from children (this program run with --child MODE). */
#include "harness.h"
#include "support.h"
#include "child.h"
#include "gpu_test.h"

#define MiB ((size_t)1 << 20)

static gpu_pool *P;

static int ledger_setup(void **state) {
  messages_setup(state);
  P = gpu_pool_new(gpu_backend_host(), NULL);
  return P ? 0 : -1;
}

static int ledger_teardown(void **state) {
  gpu_pool_empty_cache(P);
  gpu_pool_destroy(P);
  return messages_teardown(state);
}

/* ---- in process ---------------------------------------------------------------------- */

/* A backend that wants a workspace: the host table, recording what is set. */
static void *ws_set;
static size_t ws_set_bytes;
static int ws_calls;
static size_t ws_size(void) { return MiB; }
static gpu_status ws_take(void *ws, size_t bytes) {
  ws_set = ws;
  ws_set_bytes = bytes;
  ws_calls++;
  return GPU_OK;
}

static void test_blas_workspace(void **state) {
  (void)state;
  gpu_backend b = *gpu_backend_host();
  b.blas_workspace_size = ws_size;
  b.set_blas_workspace = ws_take;
  ta_tag ws_tag = ta_tag_get("gpu.blas-workspace");
  int dev = b.ledger_device();
  gpu_pool *p = gpu_pool_new(&b, NULL), *q = gpu_pool_new(&b, NULL);
  assert_non_null(p);
  assert_non_null(q);
  assert_int_equal(ws_calls, 1);                    /* the first pool gave it, the second did not */
  assert_non_null(ws_set);
  assert_int_equal(ws_set_bytes, MiB);
  assert_int_equal(((uintptr_t)ws_set & 255), 0);
  assert_int_equal(ta_device_size(ws_tag, dev, (uintptr_t)ws_set), MiB);
  gpu_stats st;
  gpu_pool_stats(p, &st);
  assert_int_equal(st.reserved_bytes[GPU_STAT_ALL].current, 0);   /* beside the segments, not one */
  void *ws = ws_set;
  gpu_pool_destroy(q);
  assert_int_equal(ws_calls, 1);
  gpu_pool_destroy(p);
  assert_int_equal(ws_calls, 2);                    /* taken back */
  assert_null(ws_set);
  assert_int_equal(ws_set_bytes, 0);
  assert_int_equal(ta_device_size(ws_tag, dev, (uintptr_t)ws), 0);
  /* the next pool over it gives a new one */
  p = gpu_pool_new(&b, NULL);
  assert_int_equal(ws_calls, 3);
  assert_non_null(ws_set);
  gpu_pool_destroy(p);
  assert_int_equal(ws_calls, 4);
  assert_int_equal(ta_findings_count(NULL), 0);
}

NOIPA static void *alloc_here(gpu_pool *p, size_t n) {
  void *x = gpu_pool_alloc(p, n, NULL);
  KEEP();
  return x;
}

typedef struct {
  ta_tag    tag;
  uintptr_t addr;
  uint32_t  stack;
} stack_want;

static void find_stack(int device, uintptr_t a, size_t size, ta_tag t, uint32_t stack, unsigned flags, void *arg) {
  (void)device;
  (void)size;
  (void)flags;
  stack_want *w = arg;
  if (t == w->tag && a == w->addr) w->stack = stack;
}

/* The allocation stack of the live device block (tag, addr). */
static uint32_t stack_of(const char *tag, uintptr_t addr) {
  stack_want w = { ta_tag_get(tag), addr, 0 };
  ta_device_each(GPU_HOST_DEVICE, find_stack, &w);
  return w.stack;
}

static void test_blocks_on_the_ledger(void **state) {
  (void)state;
  ta_tag SEG = ta_tag_get("gpu.segment"), BUF = ta_tag_get("gpu.buffer");
  ta_mark m = ta_mark_now();
  char *a = alloc_here(P, 1000);
  assert_int_equal(ta_device_size(BUF, GPU_HOST_DEVICE, (uintptr_t)a), 1024);
  assert_int_equal(ta_device_size(SEG, GPU_HOST_DEVICE, (uintptr_t)a), 2 * MiB);   /* same address, own key */
  assert_int_equal(ta_block_size(a), 0);                                          /* never a host block */
  ta_counts c = ta_since(m, BUF);
  assert_int_equal(c.allocs, 1);
  assert_int_equal(c.live_bytes, 1024);
  c = ta_since(m, SEG);
  assert_int_equal(c.live_bytes, 2 * MiB);
  /* Both stacks start at the pool's entry, called from alloc_here. */
  report_ctx *ctx = report_ctx_new();
  uintptr_t pcs[4];
  assert_true(ta_stack_frames(stack_of("gpu.buffer", (uintptr_t)a), pcs, 4) >= 2);
  assert_string_equal(function_at(ctx, pcs[0]), "gpu_pool_alloc");
  assert_string_equal(function_at(ctx, pcs[1]), "alloc_here");
  assert_true(ta_stack_frames(stack_of("gpu.segment", (uintptr_t)a), pcs, 4) >= 2);
  assert_string_equal(function_at(ctx, pcs[1]), "alloc_here");
  report_ctx_free(ctx);
  gpu_pool_free(P, a);
  assert_int_equal(ta_device_size(BUF, GPU_HOST_DEVICE, (uintptr_t)a), 0);
  c = ta_since(m, BUF);
  assert_int_equal(c.frees, 1);
  assert_int_equal(c.live_blocks, 0);
  gpu_pool_empty_cache(P);
  assert_int_equal(ta_device_size(SEG, GPU_HOST_DEVICE, (uintptr_t)a), 0);
  assert_int_equal(ta_findings_count(NULL), 0);
  ta_mark_free(m);
}

static void test_bad_frees(void **state) {
  (void)state;
  char *a = gpu_pool_alloc(P, 1000, NULL);
  gpu_pool_free(P, a);
  gpu_pool_free(P, a);   /* twice */
  assert_int_equal(ta_findings_count("free.double"), 1);
  gpu_pool_free(P, a + 4096);   /* never handed out */
  assert_int_equal(ta_findings_count("free.invalid"), 1);
  assert_int_equal(n_messages, 2);
  /* The pool is unharmed: the block is served again. */
  char *b = gpu_pool_alloc(P, 1000, NULL);
  assert_ptr_equal(b, a);
  gpu_pool_free(P, b);
}

/* Destroying a pool with a buffer still out returns every segment; the
 * buffer stays on the ledger (gpu.leak at exit, were it not freed here). */
static void test_destroy_with_a_live_buffer(void **state) {
  (void)state;
  ta_tag SEG = ta_tag_get("gpu.segment"), BUF = ta_tag_get("gpu.buffer");
  gpu_pool *p = gpu_pool_new(gpu_backend_host(), NULL);
  char *a = gpu_pool_alloc(p, 1000, NULL), *b = gpu_pool_alloc(p, 3 * MiB, NULL);
  gpu_pool_free(p, b);
  size_t fr0, fr1;
  gpu_backend_host()->mem_get_info(&fr0, NULL);
  gpu_pool_destroy(p);
  gpu_backend_host()->mem_get_info(&fr1, NULL);
  assert_int_equal(fr1 - fr0, 2 * MiB + 20 * MiB);
  assert_int_equal(ta_device_size(SEG, GPU_HOST_DEVICE, (uintptr_t)a), 0);
  assert_int_equal(ta_device_size(SEG, GPU_HOST_DEVICE, (uintptr_t)b), 0);
  assert_int_equal(ta_device_size(BUF, GPU_HOST_DEVICE, (uintptr_t)a), 1024);
  assert_int_equal(ta_device_free(BUF, GPU_HOST_DEVICE, (uintptr_t)a), 1);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* purge: the idle cache and released buffers go, a referenced buffer stays. */
NOIPA static void *referenced_alloc(gpu_pool *p) {
  void *x = gpu_pool_alloc(p, 4096, NULL);
  KEEP();
  return x;
}

NOIPA static size_t purge_here(gpu_pool *p) {
  size_t n = gpu_pool_purge(p);
  KEEP();
  return n;
}

static void test_purge_refuses_referenced(void **state) {
  (void)state;
  char *held = referenced_alloc(P);      /* count 1: a tensor still holds it */
  ta_ref_init(held, 1);
  char *plain = gpu_pool_alloc(P, 4096, NULL);   /* no refcount: not the purge's to judge */
  char *released = gpu_pool_alloc(P, 15 * MiB, NULL);   /* a 16 MiB segment of its own */
  ta_ref_init(released, 1);
  assert_int_equal(ta_ref_release(released), 0);   /* every owner let go, nobody gave it back */
  char *idle = gpu_pool_alloc(P, 3 * MiB, NULL);   /* a 20 MiB segment, then cached */
  gpu_pool_free(P, idle);
  gpu_stats s;
  gpu_pool_stats(P, &s);
  assert_int_equal(s.reserved_bytes[GPU_STAT_ALL].current, 2 * MiB + 16 * MiB + 20 * MiB);
  size_t back = purge_here(P);
  assert_int_equal(back, 36 * MiB);
  gpu_pool_stats(P, &s);
  assert_int_equal(s.reserved_bytes[GPU_STAT_ALL].current, 2 * MiB);
  assert_int_equal(s.allocated_bytes[GPU_STAT_ALL].current, 8192);
  assert_int_equal(gpu_pool_size(P, held), 4096);
  assert_int_equal(gpu_pool_size(P, plain), 4096);
  assert_int_equal(gpu_pool_size(P, released), 0);
  assert_int_equal(ta_findings_count("gpu.purge-referenced"), 1);
  ta_finding f = the_finding("gpu.purge-referenced");
  assert_int_equal(f.addr, (uintptr_t)held);
  assert_int_equal(f.bytes, 4096);
  assert_int_equal(f.tag, ta_tag_get("gpu.buffer"));
  assert_string_equal(f.detail, "gpu_pool_purge refused a buffer still referenced (1 reference)");
  report_ctx *ctx = report_ctx_new();
  uintptr_t pcs[4];
  assert_true(ta_stack_frames(f.stack, pcs, 4) >= 2);
  assert_string_equal(function_at(ctx, pcs[1]), "referenced_alloc");   /* where it was made */
  assert_true(ta_stack_frames(f.aux_stack, pcs, 4) >= 2);
  assert_string_equal(function_at(ctx, pcs[1]), "purge_here");          /* who asked */
  report_ctx_free(ctx);
  /* Nothing referenced: a second purge refuses nothing more. */
  assert_int_equal(ta_ref_release(held), 0);
  back = gpu_pool_purge(P);
  assert_int_equal(back, 0);   /* plain still lives in the segment */
  assert_int_equal(ta_findings_count("gpu.purge-referenced"), 1);
  assert_int_equal(gpu_pool_size(P, held), 0);
  gpu_pool_free(P, plain);
  assert_int_equal(gpu_pool_purge(P), 2 * MiB);
}

/* ---- at exit (children) ------------------------------------------------------------------- */

NOIPA static void leaky_alloc(gpu_pool *p) {
  gpu_pool_alloc(p, 3000, NULL);   /* never freed */
  KEEP();
}

static int child_leak(void) {
  gpu_pool *p = gpu_pool_new(gpu_backend_host(), NULL);
  leaky_alloc(p);
  char *ok = gpu_pool_alloc(p, 100, NULL);
  gpu_pool_free(p, ok);
  return 0;
}

NOIPA static void make_cache(gpu_pool *p) {
  void *x = gpu_pool_alloc(p, 3 * MiB, NULL);   /* a 20 MiB large-pool segment */
  gpu_pool_free(p, x);
  void *y = gpu_pool_alloc(p, 100, NULL);       /* a 2 MiB small-pool segment */
  gpu_pool_free(p, y);
  KEEP();
}

static int child_retained(void) {
  make_cache(gpu_pool_new(gpu_backend_host(), NULL));
  return 0;
}

static int child_emptied(void) {
  gpu_pool *p = gpu_pool_new(gpu_backend_host(), NULL);
  make_cache(p);
  gpu_pool_empty_cache(p);
  return 0;
}

NOIPA static void clone_reference(void *buf) {
  ta_ref_acquire(buf);   /* the clone's extra reference, never dropped */
  KEEP();
}

static int child_ref_leak(void) {
  gpu_pool *p = gpu_pool_new(gpu_backend_host(), NULL);
  void *w = gpu_pool_alloc(p, 8192, NULL);
  ta_ref_init(w, 1);
  printf("buffer %p\n", w);
  clone_reference(w);
  /* The owner lets go: the count stays 1, so the buffer never returns. */
  if (ta_ref_release(w) == 0) gpu_pool_free(p, w);
  return 0;
}

static void test_gpu_leak_at_exit(void **state) {
  (void)state;
  child_result r;
  child_exec("leak", NULL, &r);
  const char *want = "GPU leak of 3,072 byte(s) in 1 object(s) allocated from:   [tag: gpu.buffer]\n    #0 0x";
  const char *g = strstr(r.err, want);
  if (!g) child_dump(&r);
  assert_non_null(g);
  const char *f1 = strstr(g, "    #1 0x");
  assert_non_null(f1);
  assert_true(strstr(f1, " in leaky_alloc ") < strchr(f1, '\n'));
  assert_non_null(strstr(g, "  detail: device 100\n"));
  /* The segment holds a live buffer: not idle cache. */
  assert_null(strstr(r.err, "retained by the pool"));
  assert_null(strstr(g + 1, "GPU leak"));
  child_result_free(&r);
}

static void test_pool_retained_at_exit(void **state) {
  (void)state;
  child_result r;
  child_exec("retained", NULL, &r);
  const char *large = "GPU memory retained by the pool of 20,971,520 byte(s) in 1 object(s) allocated from:   "
                      "[tag: gpu.segment]\n";
  const char *small = "GPU memory retained by the pool of 2,097,152 byte(s) in 1 object(s) allocated from:   "
                      "[tag: gpu.segment]\n";
  const char *g = strstr(r.err, large), *h = strstr(r.err, small);
  if (!g || !h) child_dump(&r);
  assert_non_null(g);
  assert_non_null(h);
  assert_true(g < h);   /* largest first */
  const char *f1 = strstr(g, "    #1 0x");
  assert_true(strstr(f1, " in make_cache ") < strchr(f1, '\n'));
  assert_non_null(strstr(g, "  detail: idle cache: a large-pool segment with no live buffer\n"));
  assert_non_null(strstr(h, "  detail: idle cache: a small-pool segment with no live buffer\n"));
  assert_null(strstr(r.err, "GPU leak"));
  child_result_free(&r);
  child_exec("emptied", NULL, &r);
  if (strstr(r.err, "GPU")) child_dump(&r);
  assert_null(strstr(r.err, "GPU"));
  assert_non_null(strstr(r.err, "no leaks, no errors"));
  child_result_free(&r);
}

static void test_ref_leak_on_device_buffer(void **state) {
  (void)state;
  child_result r;
  child_exec("ref-leak", NULL, &r);
  void *buf = NULL;
  assert_int_equal(sscanf(r.out, "buffer %p", &buf), 1);
  char want[128];
  snprintf(want, sizeof want, "ref.leak: 1 object(s) with references left at exit, such as %p, last acquired at:\n",
           buf);
  const char *g = strstr(r.err, want);
  if (!g) child_dump(&r);
  assert_non_null(g);
  assert_non_null(strstr(g, "unmatched acquisitions (1, oldest first):"));
  /* And the buffer it kept is a GPU leak. */
  assert_non_null(strstr(r.err, "GPU leak of 8,192 byte(s) in 1 object(s) allocated from:   [tag: gpu.buffer]\n"));
  child_result_free(&r);
}

static int child_purge(void) {
  gpu_pool *p = gpu_pool_new(gpu_backend_host(), NULL);
  void *w = referenced_alloc(p);
  ta_ref_init(w, 1);
  printf("buffer %p\n", w);
  purge_here(p);
  ta_ref_release(w);
  gpu_pool_free(p, w);
  gpu_pool_empty_cache(p);
  return 0;
}

/* The refused purge in the exit report: the buffer's stack, then the purge's. */
static void test_purge_in_the_report(void **state) {
  (void)state;
  child_result r;
  child_exec("purge", NULL, &r);
  void *buf = NULL;
  assert_int_equal(sscanf(r.out, "buffer %p", &buf), 1);
  char want[160];
  snprintf(want, sizeof want,
           "gpu.purge-referenced: a purge refused 1 device buffer(s) still referenced, such as %p (4096-byte block), "
           "allocated at:   [tag: gpu.buffer]\n", buf);
  const char *g = strstr(r.err, want);
  if (!g) child_dump(&r);
  assert_non_null(g);
  const char *f1 = strstr(g, "    #1 0x");
  assert_true(strstr(f1, " in referenced_alloc ") < strchr(f1, '\n'));
  const char *pc = strstr(g, "purge called at:\n");
  assert_non_null(pc);
  f1 = strstr(pc, "    #1 0x");
  assert_true(strstr(f1, " in purge_here ") < strchr(f1, '\n'));
  assert_non_null(strstr(pc, "  detail: gpu_pool_purge refused a buffer still referenced (1 reference)\n"));
  assert_null(strstr(r.err, "GPU leak"));
  child_result_free(&r);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) {
    if (strcmp(argv[2], "leak") == 0) return child_leak();
    if (strcmp(argv[2], "retained") == 0) return child_retained();
    if (strcmp(argv[2], "emptied") == 0) return child_emptied();
    if (strcmp(argv[2], "ref-leak") == 0) return child_ref_leak();
    if (strcmp(argv[2], "purge") == 0) return child_purge();
    return 2;
  }
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_blocks_on_the_ledger, ledger_setup, ledger_teardown),
    cmocka_unit_test_setup_teardown(test_bad_frees, ledger_setup, ledger_teardown),
    cmocka_unit_test_setup_teardown(test_blas_workspace, ledger_setup, ledger_teardown),
    cmocka_unit_test_setup_teardown(test_destroy_with_a_live_buffer, ledger_setup, ledger_teardown),
    cmocka_unit_test_setup_teardown(test_purge_refuses_referenced, ledger_setup, ledger_teardown),
    cmocka_unit_test_setup_teardown(test_gpu_leak_at_exit, ledger_setup, ledger_teardown),
    cmocka_unit_test_setup_teardown(test_pool_retained_at_exit, ledger_setup, ledger_teardown),
    cmocka_unit_test_setup_teardown(test_ref_leak_on_device_buffer, ledger_setup, ledger_teardown),
    cmocka_unit_test_setup_teardown(test_purge_in_the_report, ledger_setup, ledger_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
