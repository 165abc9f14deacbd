/* A block whose only pointer is a __thread variable of a dlopen()ed
 * library: ld.so keeps that variable in a dynamic TLS block, found through
 * the thread's DTV.  The main thread's first DTV is in memory ld.so took
 * before libc's malloc: no module's segment, no mapping of the program's.
 * The main thread's block (222 bytes) is still reachable at exit, as
 * memcheck finds it; a thread's (111 bytes) is lost when the thread ends
 * and ld.so frees its TLS block. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include "common.h"

static void (*keep)(size_t);

static void *thread_main(void *arg) {
  (void)arg;
  keep(111);
  return NULL;
}

int main(int argc, char **argv) {
  (void)argc;
  if (chdir_to_program(argv[0]) != 0) { say("chdir failed\n"); return 2; }
  void *h = dlopen("./libdltls.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) { say("dlopen failed\n"); return 2; }
  keep = (void (*)(size_t))dlsym(h, "tls_keep");
  if (!keep) { say("dlsym failed\n"); return 2; }
  keep(222);
  pthread_t t;
  if (pthread_create(&t, NULL, thread_main, NULL) != 0 || pthread_join(t, NULL) != 0) {
    say("thread failed\n");
    return 2;
  }
  h = NULL;
  keep = NULL;
  clobber_stack();
  say("library kept\n");
  return 0;
}
