/* forkexec.c - the browser test's page of a run with fork and exec
 * (tests/browser/run.sh): the parent leaks a node through an allocator
 * wrapper (xmalloc); the child holds a block (so that its image before the
 * exec has a report and a trace of its own) and execs this program again
 * ("child"), which allocates and frees: one pid, two images.  Nothing else
 * leaks. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p) abort();
  return p;
}

struct node { struct node *next; char name[56]; };

static char *held;   /* reachable: the forked image's own block */

__attribute__((noinline)) static struct node *make_node(const char *name) {
  struct node *n = xmalloc(sizeof *n);
  n->next = NULL;
  strncpy(n->name, name, sizeof n->name - 1);
  n->name[sizeof n->name - 1] = '\0';
  return n;
}

/* the node, lost when this returns */
__attribute__((noinline)) static void leak_node(void) {
  struct node *n = make_node("lost");
  n->next = NULL;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "child") == 0) {
    for (int i = 0; i < 100; i++) free(malloc(1000 + i));
    return 0;
  }
  void *volatile buf = malloc(200000);   /* the peak, freed before exit */
  memset(buf, 1, 4096);
  pid_t pid = fork();
  if (pid == 0) {
    held = malloc(5000);
    memset(held, 2, 5000);
    execl("/proc/self/exe", argv[0], "child", (char *)NULL);
    _exit(127);
  }
  int st;
  waitpid(pid, &st, 0);
  free(buf);
  leak_node();
  free(malloc(16));   /* the registers no longer hold the node */
  return 0;
}
