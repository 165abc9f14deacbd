/* test_gpu_select.c - choosing the backend: TAGALLOC_GPU=host|cuda|auto and
 * a bad word; the CUDA backend's shared object found through
 * TAGALLOC_GPU_CUDA_LIB and beside the program, refused when of another
 * table version, and the fallback of auto to the host backend, with its one
 * line, when there is no shared object, no driver or no device (a stand-in
 * shared object, libstandin-cuda.so, plays each case).  Where the real CUDA
 * backend was built (build/libtagalloc-gpu-cuda.so) and this machine has no
 * driver, auto falls back from it too.
 *
 * gpu_backend_get chooses once per process, so its cases run in a child:
 * this program run again with --get, which prints "selected <name>". */
#include "harness.h"
#include "gpu.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char self[PATH_MAX], dir[PATH_MAX], standin[PATH_MAX + 32];

/* Runs prog --get with env (NAME=VALUE ...; NULL ends) and the rest of the
 * environment minus TAGALLOC_GPU*; out receives stdout and stderr. */
static int child(const char *prog, char *out, size_t len, const char **env) {
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    unsetenv("TAGALLOC_GPU");
    unsetenv("TAGALLOC_GPU_CUDA_LIB");
    unsetenv("STANDIN_MODE");
    for (const char **e = env; e && *e; e++) putenv((char *)*e);
    dup2(fd[1], 1);
    dup2(fd[1], 2);
    close(fd[0]);
    execl(prog, prog, "--get", (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  size_t n = 0;
  ssize_t r;
  while (n + 1 < len && (r = read(fd[0], out + n, len - 1 - n)) > 0) n += (size_t)r;
  out[n] = 0;
  close(fd[0]);
  int status;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static void test_select_words(void **state) {
  (void)state;
  char why[512], note[512];
  unsetenv("TAGALLOC_GPU_CUDA_LIB");
  const gpu_backend *b = gpu_backend_select("host", why, sizeof why, note, sizeof note);
  assert_non_null(b);
  assert_string_equal(b->name, "host");
  assert_string_equal(note, "");
  assert_null(gpu_backend_select("opencl", why, sizeof why, note, sizeof note));
  assert_string_equal(why, "TAGALLOC_GPU=opencl: not cuda, host or auto");
  /* No shared object anywhere it is looked for. */
  setenv("TAGALLOC_GPU_CUDA_LIB", "/nonexistent/libtagalloc-gpu-cuda.so", 1);
  b = gpu_backend_select("auto", why, sizeof why, note, sizeof note);
  assert_non_null(b);
  assert_string_equal(b->name, "host");
  assert_non_null(strstr(note, "tagalloc: gpu: no CUDA backend (TAGALLOC_GPU_CUDA_LIB=/nonexistent/libtagalloc-gpu-cuda.so: "));
  assert_non_null(strstr(note, "): using the host backend"));
  assert_null(strchr(note, '\n'));
  gpu_status st;
  assert_null(gpu_backend_cuda(&st, why, sizeof why));
  assert_int_equal(st, GPU_EBACKEND);
  assert_null(gpu_backend_select("cuda", why, sizeof why, note, sizeof note));
  assert_non_null(strstr(why, "TAGALLOC_GPU=cuda: the CUDA backend cannot run: TAGALLOC_GPU_CUDA_LIB="));
  unsetenv("TAGALLOC_GPU_CUDA_LIB");
}

static void test_standin_cases(void **state) {
  (void)state;
  char why[512], note[512];
  gpu_status st;
  setenv("TAGALLOC_GPU_CUDA_LIB", standin, 1);
  setenv("STANDIN_MODE", "ok", 1);
  const gpu_backend *b = gpu_backend_cuda(&st, why, sizeof why);
  assert_non_null(b);
  assert_int_equal(st, GPU_OK);
  assert_string_equal(b->name, "standin");
  b = gpu_backend_select("auto", why, sizeof why, note, sizeof note);
  assert_string_equal(b->name, "standin");
  assert_string_equal(note, "");

  setenv("STANDIN_MODE", "nodriver", 1);
  assert_null(gpu_backend_cuda(&st, why, sizeof why));
  assert_int_equal(st, GPU_ENODRIVER);
  b = gpu_backend_select("auto", why, sizeof why, note, sizeof note);
  assert_string_equal(b->name, "host");
  assert_string_equal(note, "tagalloc: gpu: no usable CUDA driver or device (cudaErrorInsufficientDriver: CUDA driver "
                            "version is insufficient for CUDA runtime version): using the host backend");

  setenv("STANDIN_MODE", "nodevice", 1);
  assert_null(gpu_backend_cuda(&st, why, sizeof why));
  assert_int_equal(st, GPU_ENODEVICE);
  b = gpu_backend_select("auto", why, sizeof why, note, sizeof note);
  assert_string_equal(b->name, "host");
  assert_string_equal(note, "tagalloc: gpu: no usable CUDA driver or device (cudaGetDeviceCount: cudaErrorNoDevice: "
                            "no CUDA-capable device is detected): using the host backend");
  assert_null(gpu_backend_select("cuda", why, sizeof why, note, sizeof note));
  assert_string_equal(why, "TAGALLOC_GPU=cuda: the CUDA backend cannot run: cudaGetDeviceCount: cudaErrorNoDevice: "
                           "no CUDA-capable device is detected");

  setenv("STANDIN_MODE", "abi", 1);
  assert_null(gpu_backend_cuda(&st, why, sizeof why));
  assert_int_equal(st, GPU_EBACKEND);
  char want[128];
  snprintf(want, sizeof want, "libtagalloc-gpu-cuda.so: backend table version %d, this program wants %d (rebuild both)",
           GPU_BACKEND_ABI + 1, GPU_BACKEND_ABI);
  assert_string_equal(why, want);
  unsetenv("STANDIN_MODE");
  unsetenv("TAGALLOC_GPU_CUDA_LIB");
}

/* gpu_backend_get in a child: the one line of auto, the word of
 * TAGALLOC_GPU, cuda's error. */
static void test_get_prints_one_line(void **state) {
  (void)state;
  char out[2048], lib[PATH_MAX + 64];
  snprintf(lib, sizeof lib, "TAGALLOC_GPU_CUDA_LIB=%s", standin);
  const char *host[] = { "TAGALLOC_GPU=host", NULL };
  assert_int_equal(child(self, out, sizeof out, host), 0);
  assert_string_equal(out, "selected host\n");
  const char *nodriver[] = { "TAGALLOC_GPU=auto", lib, "STANDIN_MODE=nodriver", NULL };
  assert_int_equal(child(self, out, sizeof out, nodriver), 0);
  assert_int_equal(count_lines(out), 2);
  assert_non_null(strstr(out, "tagalloc: gpu: no usable CUDA driver or device (cudaErrorInsufficientDriver"));
  assert_non_null(strstr(out, "selected host\n"));
  const char *dflt[] = { lib, "STANDIN_MODE=ok", NULL };   /* auto is the default */
  assert_int_equal(child(self, out, sizeof out, dflt), 0);
  assert_string_equal(out, "selected standin\n");
  const char *cuda[] = { "TAGALLOC_GPU=cuda", lib, "STANDIN_MODE=nodevice", NULL };
  assert_int_equal(child(self, out, sizeof out, cuda), 0);
  assert_string_equal(out, "tagalloc: gpu: TAGALLOC_GPU=cuda: the CUDA backend cannot run: cudaGetDeviceCount: "
                           "cudaErrorNoDevice: no CUDA-capable device is detected\nselected (none)\n");
  const char *bad[] = { "TAGALLOC_GPU=metal", lib, "STANDIN_MODE=ok", NULL };
  assert_int_equal(child(self, out, sizeof out, bad), 0);
  assert_string_equal(out, "tagalloc: gpu: TAGALLOC_GPU=metal: not cuda, host or auto; using auto\nselected standin\n");
}

/* The shared object beside the program, found with no variable set: this
 * program hard-linked into a directory with the stand-in under the real
 * name. */
static void test_found_beside_the_program(void **state) {
  (void)state;
  char tmp[PATH_MAX + 32], prog[PATH_MAX + 64], so[PATH_MAX + 64], out[1024];
  snprintf(tmp, sizeof tmp, "%s/beside.XXXXXX", dir);
  assert_non_null(mkdtemp(tmp));
  snprintf(prog, sizeof prog, "%s/prog", tmp);
  snprintf(so, sizeof so, "%s/libtagalloc-gpu-cuda.so", tmp);
  assert_int_equal(link(self, prog), 0);
  assert_int_equal(link(standin, so), 0);
  const char *env[] = { "STANDIN_MODE=ok", NULL };
  int rc = child(prog, out, sizeof out, env);
  unlink(prog);
  unlink(so);
  rmdir(tmp);
  assert_int_equal(rc, 0);
  assert_string_equal(out, "selected standin\n");
}

/* The real CUDA backend, where it was built, on a machine with no driver:
 * auto falls back with its one line; with a driver it runs. */
static void test_real_cuda_backend(void **state) {
  (void)state;
  char so[PATH_MAX + 64], env1[PATH_MAX + 96], out[2048];
  snprintf(so, sizeof so, "%s/../../libtagalloc-gpu-cuda.so", dir);
  if (access(so, F_OK) != 0) {
    print_message("SKIP the CUDA backend was not built (%s: no such file; nvcc was not found)\n", so);
    skip();
  }
  snprintf(env1, sizeof env1, "TAGALLOC_GPU_CUDA_LIB=%s", so);
  const char *env[] = { env1, NULL };
  assert_int_equal(child(self, out, sizeof out, env), 0);
  char why[512];
  gpu_status st;
  setenv("TAGALLOC_GPU_CUDA_LIB", so, 1);
  const gpu_backend *b = gpu_backend_cuda(&st, why, sizeof why);
  unsetenv("TAGALLOC_GPU_CUDA_LIB");
  if (b) {
    assert_string_equal(out, "selected cuda\n");
  } else {
    print_message("the CUDA backend does not run here: %s\n", why);
    assert_true(st == GPU_ENODRIVER || st == GPU_ENODEVICE);
    assert_int_equal(count_lines(out), 2);
    /* the backend's reason, said once */
    assert_non_null(strstr(out, st == GPU_ENODRIVER ? "tagalloc: gpu: no usable CUDA driver ("
                                                    : "tagalloc: gpu: no CUDA device ("));
    assert_null(strstr(out, "(no usable"));
    assert_null(strstr(out, "(no CUDA device"));
    assert_non_null(strstr(out, "selected host\n"));
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--get") == 0) {
    const gpu_backend *b = gpu_backend_get();
    fflush(stderr);
    printf("selected %s\n", b ? b->name : "(none)");
    return 0;
  }
  if (realpath("/proc/self/exe", self) == NULL) return 1;
  char copy[PATH_MAX];
  snprintf(copy, sizeof copy, "%s", self);
  snprintf(dir, sizeof dir, "%s", dirname(copy));
  snprintf(standin, sizeof standin, "%s/libstandin-cuda.so", dir);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_select_words),
    cmocka_unit_test(test_standin_cases),
    cmocka_unit_test(test_get_prints_one_line),
    cmocka_unit_test(test_found_beside_the_program),
    cmocka_unit_test(test_real_cuda_backend),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
