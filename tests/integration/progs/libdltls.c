/* For dlopen_tls: a library with a thread-local variable, which ld.so puts
 * in a dynamic TLS block of each thread that touches it. */
#include <stdlib.h>
#include <string.h>

__thread char *tls_kept;

__attribute__((noinline)) void tls_keep(size_t n) {
  tls_kept = malloc(n);
  memset(tls_kept, 't', n);
}
