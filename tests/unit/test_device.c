/* test_device.c - device memory on the ledger: device blocks keyed by
 * (tag, device, addr) apart from host blocks, their sizes, visits and
 * counts (ta_since counts them, the host summary does not); a bad device
 * free is free.invalid or free.double at once; at exit every live device
 * block without TA_DEVICE_RESERVE is gpu.leak with its allocation stack;
 * ta_finding_add groups equal findings and survives scans; ta_atexit
 * functions run newest first, before the report. */
#include "harness.h"
#include "child.h"
#include "support.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int n;
  int device[8];
  uintptr_t addr[8];
  size_t size[8];
  ta_tag tag[8];
  unsigned flags[8];
  uint32_t stack[8];
} seen;

static void collect(int device, uintptr_t addr, size_t size, ta_tag tag, uint32_t stack, unsigned flags,
                    void *arg) {
  seen *s = arg;
  if (s->n == 8) return;
  s->device[s->n] = device;
  s->addr[s->n] = addr;
  s->size[s->n] = size;
  s->tag[s->n] = tag;
  s->flags[s->n] = flags;
  s->stack[s->n] = stack;
  s->n++;
}

NOIPA static void alloc_here(ta_tag tag, int device, uintptr_t addr, size_t size, unsigned flags) {
  ta_device_alloc(tag, device, addr, size, flags);
  KEEP();
}

static void test_alloc_free_each(void **state) {
  (void)state;
  ta_tag S = ta_tag_get("dev.segment"), B = ta_tag_get("dev.buffer");
  ta_summary before = ta_summary_get();
  ta_mark m = ta_mark_now();
  alloc_here(S, 0, 0x7f0000000000u, 2u << 20, TA_DEVICE_RESERVE);
  alloc_here(B, 0, 0x7f0000000000u, 4096, 0);          /* the segment's first buffer: same address */
  alloc_here(B, 1, 0x7f0000000000u, 512, 0);           /* another device, same address */
  assert_int_equal(ta_device_size(S, 0, 0x7f0000000000u), 2u << 20);
  assert_int_equal(ta_device_size(B, 0, 0x7f0000000000u), 4096);
  assert_int_equal(ta_device_size(B, 1, 0x7f0000000000u), 512);
  assert_int_equal(ta_device_size(B, 2, 0x7f0000000000u), 0);
  assert_int_equal(ta_device_size(S, 1, 0x7f0000000000u), 0);
  assert_int_equal(ta_block_size((void *)0x7f0000000000u), 0);    /* never a host block */

  seen all = { 0 };
  ta_device_each(-1, collect, &all);
  assert_int_equal(all.n, 3);                         /* oldest first */
  assert_int_equal(all.tag[0], S);
  assert_int_equal(all.size[0], 2u << 20);
  assert_int_equal(all.flags[0], TA_DEVICE_RESERVE);
  assert_int_equal(all.tag[1], B);
  assert_int_equal(all.device[1], 0);
  assert_int_equal(all.size[1], 4096);
  assert_int_equal(all.flags[1], 0);
  assert_int_equal(all.device[2], 1);
  assert_int_equal(all.addr[2], 0x7f0000000000u);
  report_ctx *ctx = report_ctx_new();
  assert_string_equal(stack_frame0(ctx, all.stack[0]), "alloc_here");
  assert_string_equal(stack_frame0(ctx, all.stack[2]), "alloc_here");
  report_ctx_free(ctx);

  seen dev1 = { 0 };
  ta_device_each(1, collect, &dev1);
  assert_int_equal(dev1.n, 1);
  assert_int_equal(dev1.size[0], 512);

  ta_counts c = ta_since(m, B);
  assert_int_equal(c.allocs, 2);
  assert_int_equal(c.frees, 0);
  assert_int_equal(c.live_blocks, 2);
  assert_int_equal(c.live_bytes, 4096 + 512);
  assert_int_equal(c.peak_bytes, 0);                  /* host bytes only */
  c = ta_since(m, TA_ANY);
  assert_int_equal(c.allocs, 3);
  assert_int_equal(c.live_blocks, 3);
  assert_int_equal(c.live_bytes, (2u << 20) + 4096 + 512);

  assert_int_equal(ta_device_free(B, 0, 0x7f0000000000u), 1);
  assert_int_equal(ta_device_size(B, 0, 0x7f0000000000u), 0);
  assert_int_equal(ta_device_size(S, 0, 0x7f0000000000u), 2u << 20);   /* the segment stays */
  assert_int_equal(ta_device_free(B, 1, 0x7f0000000000u), 1);
  assert_int_equal(ta_device_free(S, 0, 0x7f0000000000u), 1);
  c = ta_since(m, TA_ANY);
  assert_int_equal(c.allocs, 3);
  assert_int_equal(c.frees, 3);
  assert_int_equal(c.live_blocks, 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  ta_summary after = ta_summary_get();
  assert_int_equal(after.allocs - before.allocs, 0);  /* the host summary: no device block */
  assert_int_equal(after.frees - before.frees, 0);
  seen none = { 0 };
  ta_device_each(-1, collect, &none);
  assert_int_equal(none.n, 0);
  assert_int_equal(n_messages, 0);
  ta_mark_free(m);
}

static void test_each_may_free(void **state) {
  (void)state;
  ta_tag B = ta_tag_get("dev.buffer");
  for (uintptr_t i = 1; i <= 5; i++) ta_device_alloc(B, 2, i << 12, 64 * i, 0);
  ta_mark m = ta_mark_now();
  seen s = { 0 };
  ta_device_each(2, collect, &s);
  assert_int_equal(s.n, 5);
  for (int i = 0; i < s.n; i++) {
    assert_int_equal(s.addr[i], (uintptr_t)(i + 1) << 12);
    assert_int_equal(ta_device_free(s.tag[i], s.device[i], s.addr[i]), 1);
  }
  assert_int_equal(ta_since(m, B).frees, 5);
  assert_int_equal(ta_since(m, B).allocs, 0);
  ta_mark_free(m);
  assert_int_equal(n_messages, 0);
}

NOIPA static int free_here(ta_tag tag, int device, uintptr_t addr) {
  int r = ta_device_free(tag, device, addr);
  KEEP();
  return r;
}

static void test_bad_free(void **state) {
  (void)state;
  ta_tag B = ta_tag_get("dev.buffer"), S = ta_tag_get("dev.segment");
  assert_int_equal(free_here(B, 0, 0xdead000), 0);
  assert_int_equal(ta_findings_count("free.invalid"), 1);
  assert_int_equal(n_messages, 1);
  assert_string_equal(messages[0], "free.invalid at 0xdead000: device 0: not a device block of tag dev.buffer "
                                   "(the exit report has the stacks)");
  ta_finding f = the_finding("free.invalid");
  assert_int_equal(f.addr, 0xdead000);
  assert_int_equal(f.tag, B);
  report_ctx *ctx = report_ctx_new();
  assert_string_equal(stack_frame0(ctx, f.stack), "free_here");

  alloc_here(B, 1, 0xbeef000, 300, 0);
  assert_int_equal(free_here(S, 1, 0xbeef000), 0);    /* the wrong tag: not that key */
  assert_int_equal(ta_findings_count("free.invalid"), 2);
  assert_int_equal(ta_device_size(B, 1, 0xbeef000), 300);
  assert_int_equal(free_here(B, 1, 0xbeef000), 1);
  assert_int_equal(free_here(B, 1, 0xbeef000), 0);
  assert_int_equal(ta_findings_count("free.double"), 1);
  f = the_finding("free.double");
  assert_int_equal(f.bytes, 300);
  assert_int_equal(f.addr, 0xbeef000);
  assert_string_equal(f.detail, "device 1: a freed 300-byte device block");
  assert_string_equal(stack_frame0(ctx, f.stack), "free_here");
  assert_string_equal(stack_frame0(ctx, f.free_stack), "free_here");
  assert_string_equal(stack_frame0(ctx, f.alloc_stack), "alloc_here");
  report_ctx_free(ctx);
  assert_int_equal(n_messages, 3);
  /* a bad free changes no count */
  assert_int_equal(ta_device_size(B, 1, 0xbeef000), 0);
}

static void test_finding_add(void **state) {
  (void)state;
  ta_tag S = ta_tag_get("dev.segment");
  uint32_t here = ta_stack_here();
  ta_finding_add("gpu.pool-retained", S, 0x1000, 10, here, 0, "device 0");
  ta_finding_add("gpu.pool-retained", S, 0x2000, 20, here, 0, "device 0");
  ta_finding_add("gpu.pool-retained", S, 0x3000, 30, here, 0, "device 0");
  ta_finding_add("gpu.pool-retained", S, 0x4000, 40, here, 0, "device 1");   /* another detail */
  ta_finding_add("gpu.pool-retained", S, 0x5000, 50, here, 7, "device 0");   /* another aux stack */
  ta_finding_add("gpu.leak", S, 0x6000, 60, here, 0, "device 0");            /* another kind */
  assert_int_equal(ta_findings_count("gpu.pool-retained"), 5);
  assert_int_equal(ta_findings_count("gpu.leak"), 1);
  ta_scan();                                           /* not replaced by a scan */
  assert_int_equal(ta_findings_count("gpu.pool-retained"), 5);
  ta_finding f = the_finding("gpu.pool-retained");    /* largest group first */
  assert_int_equal(f.blocks, 3);
  assert_int_equal(f.bytes, 60);
  assert_int_equal(f.addr, 0x1000);
  assert_int_equal(f.stack, here);
  assert_int_equal(f.tag, S);
  assert_string_equal(f.detail, "device 0");
  assert_int_equal(n_messages, 0);                    /* said in the report, not at once */
  ta_findings_clear();
  assert_int_equal(ta_findings_count("gpu.pool-retained"), 0);
}

/* An added finding of an error kind is an error in the summary (and so in
 * the report's SUMMARY, the JSON's errors and --error-exitcode); one of a
 * leak or held-memory kind is not. */
static void test_finding_add_errors(void **state) {
  (void)state;
  ta_tag S = ta_tag_get("dev.buffer");
  uint32_t here = ta_stack_here();
  uint64_t before = ta_summary_get().errors;
  ta_finding_add("gpu.purge-referenced", S, 0x1000, 64, here, 0, "device 0");
  ta_finding_add("gpu.purge-referenced", S, 0x2000, 64, here, 0, "device 0");
  ta_finding_add("gpu.leak", S, 0x3000, 64, here, 0, "device 0");
  ta_finding_add("gpu.pool-retained", S, 0x4000, 64, here, 0, "device 0");
  assert_int_equal(ta_summary_get().errors - before, 2);
  ta_findings_clear();
  assert_int_equal(ta_summary_get().errors, 0);
}

/* Threads allocating and freeing device blocks at once: each makes 1000
 * blocks on its own device and frees the even ones. */
#define THREADS 4
#define PER_THREAD 1000

static void *device_churn(void *arg) {
  int device = (int)(intptr_t)arg;
  ta_tag B = ta_tag_get("dev.churn");
  for (uintptr_t i = 1; i <= PER_THREAD; i++) ta_device_alloc(B, device, i << 8, i, 0);
  for (uintptr_t i = 2; i <= PER_THREAD; i += 2)
    if (ta_device_free(B, device, i << 8) != 1) return (void *)1;
  return NULL;
}

typedef struct { uint64_t blocks, bytes; } dev_sum;

static void sum_churn(int device, uintptr_t addr, size_t size, ta_tag tag, uint32_t stack, unsigned flags,
                      void *arg) {
  (void)device, (void)addr, (void)stack, (void)flags;
  dev_sum *s = arg;
  if (tag != ta_tag_get("dev.churn")) return;
  s->blocks++;
  s->bytes += size;
}

static void test_threads(void **state) {
  (void)state;
  ta_tag B = ta_tag_get("dev.churn");
  ta_mark m = ta_mark_now();
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, device_churn, (void *)(intptr_t)(10 + i)), 0);
  for (int i = 0; i < THREADS; i++) {
    void *r;
    pthread_join(t[i], &r);
    assert_null(r);
  }
  ta_counts c = ta_since(m, B);
  assert_int_equal(c.allocs, THREADS * PER_THREAD);
  assert_int_equal(c.frees, THREADS * PER_THREAD / 2);
  assert_int_equal(c.live_blocks, THREADS * PER_THREAD / 2);
  /* the odd sizes 1, 3, ..., 999 on each device: 500^2 each */
  assert_int_equal(c.live_bytes, THREADS * 250000);
  dev_sum s = { 0 };
  ta_device_each(-1, sum_churn, &s);
  assert_int_equal(s.blocks, THREADS * PER_THREAD / 2);
  assert_int_equal(s.bytes, THREADS * 250000);
  for (int d = 10; d < 10 + THREADS; d++)
    for (uintptr_t i = 1; i <= PER_THREAD; i += 2) assert_int_equal(ta_device_free(B, d, i << 8), 1);
  assert_int_equal(ta_since(m, B).live_blocks, 0);
  assert_int_equal(n_messages, 0);
  ta_mark_free(m);
}

/* ---- the children: what only happens at exit ------------------------------- */

NOIPA static void leaky_device_alloc(uintptr_t addr) {
  ta_device_alloc(ta_tag_get("dev.buffer"), 3, addr, 4096, 0);
  KEEP();
}

static int child_gpu_leak(void) {
  volatile int n = 2;                                  /* a loop the compiler keeps: one stack */
  for (int i = 1; i <= n; i++) leaky_device_alloc((uintptr_t)i << 16);
  alloc_here(ta_tag_get("dev.segment"), 3, 0x10000, 1u << 20, TA_DEVICE_RESERVE);  /* not a leak */
  alloc_here(ta_tag_get("dev.buffer"), 3, 0x30000, 512, 0);
  ta_device_free(ta_tag_get("dev.buffer"), 3, 0x30000);
  return 0;
}

static void test_gpu_leak_at_exit(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_REPORT=1", NULL };
  child_exec("gpu-leak", env, &r);
  assert_true(WIFEXITED(r.status));
  assert_int_equal(WEXITSTATUS(r.status), 0);
  const char *want = "GPU leak of 8,192 byte(s) in 2 object(s) allocated from:   [tag: dev.buffer]\n    #0 0x";
  if (!strstr(r.err, want)) child_dump(&r);
  const char *g = strstr(r.err, want);
  assert_non_null(g);
  const char *eol = strchr(g + strlen(want), '\n');
  assert_non_null(strstr(g, " in leaky_device_alloc "));
  assert_true(strstr(g, " in leaky_device_alloc ") < eol);
  assert_non_null(strstr(g, "  detail: device 3\n"));
  assert_null(strstr(r.err, "dev.segment"));           /* reserved: no gpu.leak by itself */
  assert_null(strstr(r.err, "1048576"));
  assert_null(strstr(strstr(r.err, want) + 1, "GPU leak"));   /* one group */
  assert_non_null(strstr(r.err, "       device lost: 8,192 bytes in 2 blocks (gpu.leak)\n"
                                "SUMMARY: tagalloc: 0 byte(s) leaked in 0 allocation(s); 1 error(s) (1 of them "
                                "loss records"));
  child_result_free(&r);
}

static void at_exit_first(void) {
  fprintf(stderr, "atexit: first registered\n");
  fflush(stderr);
}

static void at_exit_second(void) {
  fprintf(stderr, "atexit: second registered\n");
  fflush(stderr);
  /* the pool's verdict, made at exit: in the report */
  ta_finding_add("gpu.pool-retained", ta_tag_get("dev.segment"), 0x40000, 2u << 20, ta_stack_here(), 0,
                 "device 0");
}

static int child_atexit(void) {
  ta_atexit(at_exit_first);
  ta_atexit(at_exit_second);
  return 0;
}

static void test_atexit_order(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_REPORT=1", NULL };
  child_exec("atexit", env, &r);
  assert_true(WIFEXITED(r.status));
  assert_int_equal(WEXITSTATUS(r.status), 0);
  const char *second = strstr(r.err, "atexit: second registered\n");
  const char *first = strstr(r.err, "atexit: first registered\n");
  const char *report = strstr(r.err, "GPU memory retained by the pool of 2,097,152 byte(s) in 1 object(s) "
                                     "allocated from:   [tag: dev.segment]\n    #0 0x");
  if (!second || !first || !report) child_dump(&r);
  assert_non_null(second);
  assert_non_null(first);
  assert_non_null(report);
  assert_true(second < first);                         /* newest first */
  assert_true(first < report);                         /* before the report */
  assert_true(strstr(report, " in at_exit_second ") < strchr(strstr(report, "#0"), '\n'));
  child_result_free(&r);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) {
    if (strcmp(argv[2], "gpu-leak") == 0) return child_gpu_leak();
    if (strcmp(argv[2], "atexit") == 0) return child_atexit();
    return 2;
  }
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_alloc_free_each, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_each_may_free, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_bad_free, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_finding_add, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_finding_add_errors, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_threads, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_gpu_leak_at_exit, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_atexit_order, messages_setup, messages_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
