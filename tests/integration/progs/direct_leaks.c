/* The dummy-buffer bug: a view allocates a 4-byte buffer and then points at
 * its parent's data instead, 10,000 times.  Expect 10,000 direct leaks of 4
 * bytes, all from dummy_buffer(). */
#include <stdlib.h>
#include "common.h"

struct view { char *data; };
static char parent_data[64];

NOINLINE void dummy_buffer(struct view *v) {
  v->data = malloc(4);
  escape(v->data);
  v->data[0] = 1;
  v->data = parent_data;          /* the buffer is lost here */
}

NOINLINE void make_views(int n) {
  struct view v;
  for (int i = 0; i < n; i++) dummy_buffer(&v);
  escape(&v);
}

int main(void) {
  make_views(10000);
  clobber_stack();
  say("made %d views\n", 10000);
  return 0;
}
