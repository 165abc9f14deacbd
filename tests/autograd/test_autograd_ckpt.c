/* test_autograd_ckpt.c - checkpoints: a resumed run's losses equal an
 * uninterrupted run's bit for bit (SGD with momentum, Adam); damaged,
 * truncated, foreign and mismatched files are refused and change nothing. */
#include "ag_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STEPS 12
#define CUT 5

static char path[256];

static ag_layer *make_net(uint64_t seed) {
  ag_rng r = ag_rng_new(seed);
  return ag_sequential((ag_layer *[]){ ag_linear(6, 10, &r), ag_tanh_layer(), ag_linear(10, 3, &r) }, 3);
}

static ag_optim *make_opt(ag_layer *net, int adam) {
  return adam ? ag_adam_new(net, 0.01f, 0.9f, 0.999f, 1e-8f, 1e-3f) : ag_sgd_new(net, 0.1f, 0.9f, 1e-3f);
}

/* One step on a batch drawn from rng (the generator state is part of the run). */
static float step(ag_layer *net, ag_optim *opt, ag_rng *rng) {
  tensor *x = tensor_empty(TENSOR_F32, TS(8, 6)), *y = tensor_empty(TENSOR_I32, TS(8));
  for (int i = 0; i < 48; i++) tensor_f32(x)[i] = ag_rng_normal(rng);
  for (int i = 0; i < 8; i++) tensor_i32(y)[i] = (int32_t)ag_rng_below(rng, 3);
  ag_var *loss = ag_cross_entropy(ag_layer_forward(net, ag_input(x)), y);
  float l = tensor_item(loss->value);
  ag_optim_zero_grad(opt);
  ag_backward(loss);
  ag_optim_step(opt);
  ag_tape_reset(tape);
  tensor_free(x);
  tensor_free(y);
  return l;
}

static void resume_exact(int adam) {
  float whole[STEPS], resumed[STEPS];
  ag_layer *net = make_net(1);
  ag_optim *opt = make_opt(net, adam);
  ag_rng rng = ag_rng_new(99);
  for (int i = 0; i < STEPS; i++) whole[i] = step(net, opt, &rng);
  ag_optim_free(opt);
  ag_layer_free(net);

  net = make_net(1);
  opt = make_opt(net, adam);
  rng = ag_rng_new(99);
  for (int i = 0; i < CUT; i++) resumed[i] = step(net, opt, &rng);
  const char order[] = "data order";
  ag_ckpt_state st = { .epoch = 1, .step = CUT, .rng = rng };
  assert_int_equal(ag_checkpoint_save(path, net, opt, &st, order, sizeof order), 0);
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  assert_int_equal(access(tmp, F_OK), -1);   /* renamed into place */
  ag_optim_free(opt);
  ag_layer_free(net);

  /* a different initialisation and a fresh optimizer: the file decides */
  net = make_net(12345);
  opt = make_opt(net, adam);
  ag_ckpt_state back;
  void *extra;
  size_t xlen;
  assert_int_equal(ag_checkpoint_load(path, net, opt, &back, &extra, &xlen), 0);
  assert_int_equal(back.epoch, 1);
  assert_int_equal(back.step, CUT);
  assert_int_equal(xlen, sizeof order);
  assert_memory_equal(extra, order, sizeof order);
  free(extra);
  assert_int_equal(ag_optim_steps(opt), CUT);
  rng = back.rng;
  for (int i = CUT; i < STEPS; i++) resumed[i] = step(net, opt, &rng);
  assert_memory_equal(whole, resumed, sizeof whole);   /* bit for bit */
  assert_true(whole[STEPS - 1] != whole[CUT]);
  ag_optim_free(opt);
  ag_layer_free(net);
  unlink(path);
}

static void test_resume_sgd(void **state) {
  (void)state;
  resume_exact(0);
}

static void test_resume_adam(void **state) {
  (void)state;
  resume_exact(1);
}

static void write_bytes(const char *p, const void *d, size_t n) {
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(d, 1, n, f), n);
  fclose(f);
}

static void test_refused(void **state) {
  (void)state;
  ag_layer *net = make_net(1);
  ag_optim *opt = make_opt(net, 0);
  ag_ckpt_state st = { .epoch = 2, .step = 7, .rng = ag_rng_new(5) };
  assert_int_equal(ag_checkpoint_save(path, net, opt, &st, NULL, 0), 0);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static unsigned char good[1 << 16];
  size_t n = fread(good, 1, sizeof good, f);
  fclose(f);
  assert_true(n > 32 && n < sizeof good);

  ag_layer *other = make_net(2);
  ag_optim *oopt = make_opt(other, 0);
  ag_var *p0[1];
  ag_layer_params(other, p0, 1);
  float before = tensor_f32(p0[0]->value)[0];
  ag_ckpt_state got = { 0 };
  static unsigned char bad[1 << 16];

  /* one payload byte flipped */
  memcpy(bad, good, n);
  bad[n / 2] ^= 0x10;
  write_bytes(path, bad, n);
  assert_int_equal(ag_checkpoint_load(path, other, oopt, &got, NULL, NULL), -1);
  assert_non_null(strstr(ag_error(), "checksum mismatch"));
  /* truncated */
  write_bytes(path, good, n - 9);
  assert_int_equal(ag_checkpoint_load(path, other, oopt, &got, NULL, NULL), -1);
  assert_non_null(strstr(ag_error(), "truncated"));
  /* foreign */
  const char *script = "#!/bin/sh\necho hello, not a checkpoint at all\n";
  write_bytes(path, script, strlen(script));
  assert_int_equal(ag_checkpoint_load(path, other, oopt, &got, NULL, NULL), -1);
  assert_non_null(strstr(ag_error(), "not a tagalloc checkpoint"));
  /* a newer version */
  memcpy(bad, good, n);
  bad[8] = 9;
  write_bytes(path, bad, n);
  assert_int_equal(ag_checkpoint_load(path, other, oopt, &got, NULL, NULL), -1);
  assert_non_null(strstr(ag_error(), "format version 9"));
  /* another architecture */
  write_bytes(path, good, n);
  ag_rng r = ag_rng_new(3);
  ag_layer *wider = ag_sequential((ag_layer *[]){ ag_linear(6, 11, &r), ag_tanh_layer(), ag_linear(11, 3, &r) }, 3);
  assert_int_equal(ag_checkpoint_load(path, wider, NULL, &got, NULL, NULL), -1);
  assert_non_null(strstr(ag_error(), "parameter 0 has another shape"));
  /* another optimizer */
  ag_optim *adam = make_opt(other, 1);
  assert_int_equal(ag_checkpoint_load(path, other, adam, &got, NULL, NULL), -1);
  assert_non_null(strstr(ag_error(), "the file holds SGD state, the optimizer is Adam"));
  /* nothing was changed by the refusals */
  assert_float_equal(tensor_f32(p0[0]->value)[0], before, 0);
  assert_int_equal(got.epoch, 0);
  /* and the good file loads */
  assert_int_equal(ag_checkpoint_load(path, other, oopt, &got, NULL, NULL), 0);
  assert_int_equal(got.epoch, 2);
  assert_int_equal(got.step, 7);
  ag_var *q0[1];
  ag_layer_params(net, q0, 1);
  assert_memory_equal(tensor_f32(p0[0]->value), tensor_f32(q0[0]->value), 60 * 4);
  ag_optim_free(adam);
  ag_layer_free(wider);
  ag_optim_free(oopt);
  ag_layer_free(other);
  ag_optim_free(opt);
  ag_layer_free(net);
  unlink(path);
}

int main(void) {
  snprintf(path, sizeof path, "/tmp/tagalloc-ckpt-test-%d.ckpt", (int)getpid());
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_resume_sgd, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_resume_adam, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_refused, tape_setup, tape_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
