/* test_autograd_globals.c - a correct program that keeps its model in
 * globals until exit, trains a few steps and exits without freeing it gets
 * no finding of any kind.
 *
 * It used to get four leak.orphan ("orphaned at ag_tape_reset": the
 * parameters' only declared holds were the tape ops' input holds, which the
 * reset ends) and a ref.leak per parameter and optimizer storage.  Layers
 * and optimizers now declare what they keep (ta_hold), and a reference kept
 * by a declared hold is accounted for at exit.  Without either, this test
 * fails.  The exit report is the process's own, so the program runs as a
 * child and the test reads its report. */
#include "support.h"
#include "autograd.h"
#include "child.h"

static ag_tape *g_tape;
static ag_layer *g_net, *g_head;
static ag_optim *g_adam, *g_sgd;
static tensor *g_x, *g_y;

static int child_globals(void) {
  g_tape = ag_tape_new(0);
  ag_tape_use(g_tape);
  ag_rng rng = ag_rng_new(1);
  g_net = ag_sequential((ag_layer *[]){ ag_conv2d_layer(1, 2, 3, 1, 1, &rng), ag_relu_layer(),
                                        ag_max_pool2d_layer(2, 2), ag_flatten_layer(), ag_linear(8, 6, &rng),
                                        ag_tanh_layer() }, 6);
  g_head = ag_linear(6, 3, &rng);
  g_adam = ag_adam_new(g_net, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f);
  g_sgd = ag_sgd_new(g_head, 0.1f, 0.9f, 1e-4f);
  g_x = tensor_randn(TS(5, 1, 4, 4), 1.0f, 3);
  g_y = tensor_from_i32((int32_t[]){ 0, 1, 2, 1, 0 }, TS(5));
  float first = 0, last = 0;
  for (int s = 0; s < 8; s++) {
    ag_var *loss = ag_cross_entropy(ag_layer_forward(g_head, ag_layer_forward(g_net, ag_input(g_x))), g_y);
    if (loss == NULL) return 2;
    if (s == 0) first = tensor_item(loss->value);
    last = tensor_item(loss->value);
    ag_optim_zero_grad(g_adam);
    ag_optim_zero_grad(g_sgd);
    if (ag_backward(loss) != 0) return 3;
    ag_optim_step(g_adam);
    ag_optim_step(g_sgd);
    ag_tape_reset(g_tape);
  }
  printf("learned=%d findings=%zu\n", last < first, ta_findings_count(NULL));
  return 0;   /* the model, the optimizers, the tape and the data stay to exit */
}

static void test_model_in_globals(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_REPORT=1", NULL };
  child_exec("globals", env, &r);
  if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0 || !strstr(r.err, "tagalloc: no leaks, no errors"))
    child_dump(&r);
  assert_true(WIFEXITED(r.status));
  assert_int_equal(WEXITSTATUS(r.status), 0);
  assert_non_null(strstr(r.out, "learned=1 findings=0\n"));
  assert_non_null(strstr(r.err, "tagalloc: no leaks, no errors"));
  assert_null(strstr(r.err, "ERROR"));
  assert_null(strstr(r.err, "orphan"));
  assert_null(strstr(r.err, "ref.leak"));
  child_result_free(&r);
}

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "--child") == 0 && strcmp(argv[2], "globals") == 0) return child_globals();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_model_in_globals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
