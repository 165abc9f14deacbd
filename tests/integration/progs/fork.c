/* fork: the parent leaks 100 bytes before the fork (the child inherits that
 * block, so it leaks it too), the child leaks 2 x 100 bytes of its own, the
 * parent 300 bytes after the fork.  Two process entries. */
#include <stdlib.h>
#include <sys/wait.h>
#include "common.h"

NOINLINE void parent_before_fork(void) { char *p = malloc(100); memset(p, 1, 100); escape(p); }
NOINLINE void child_leak(void)         { char *p = malloc(100); memset(p, 2, 100); escape(p); }
NOINLINE void parent_after_fork(void)  { char *p = malloc(300); memset(p, 3, 300); escape(p); }

int main(void) {
  parent_before_fork();
  clobber_stack();
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    child_leak();
    child_leak();
    clobber_stack();
    say("child done\n");
    return 0;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  parent_after_fork();
  clobber_stack();
  say("parent done, child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}
