/* scope.c - scopes: the tensors made while a scope is open die at its end.
 *
 * Per thread: a stack of scopes, each a doubly linked list of the headers it
 * owns (the links live in the headers, so adopting costs no allocation).
 * tensor_free unlinks a header from its scope; tensor_escape moves it one
 * scope out. */
#include "internal.h"

#define MAX_SCOPES 64

typedef struct {
  tensor *head;       /* the newest header */
  size_t count;
} scope_level;

static __thread int depth;
static __thread scope_level levels[MAX_SCOPES + 1];   /* levels[1 .. depth] */

static void link_into(tensor *t, int d) {
  scope_level *l = &levels[d];
  t->scope = d;
  t->scope_prev = NULL;
  t->scope_next = l->head;
  if (l->head) l->head->scope_prev = t;
  l->head = t;
  l->count++;
}

void _tensor_scope_adopt(tensor *t) {
  if (depth > 0) link_into(t, depth);
}

void _tensor_scope_forget(tensor *t) {
  if (t->scope <= 0 || t->scope > depth) {
    t->scope = 0;
    return;
  }
  scope_level *l = &levels[t->scope];
  if (t->scope_prev) t->scope_prev->scope_next = t->scope_next;
  else l->head = t->scope_next;
  if (t->scope_next) t->scope_next->scope_prev = t->scope_prev;
  t->scope_prev = t->scope_next = NULL;
  t->scope = 0;
  l->count--;
}

int tensor_scope_begin(void) {
  if (depth == MAX_SCOPES) {
    _tensor_err(TENSOR_ESCOPE, "tensor_scope_begin: more than %d nested scopes", MAX_SCOPES);
    return depth;
  }
  depth++;
  levels[depth].head = NULL;
  levels[depth].count = 0;
  return depth;
}

tensor_status tensor_scope_end(void) {
  if (depth == 0) return _tensor_err(TENSOR_ESCOPE, "tensor_scope_end: no scope is open");
  /* Newest first: views go before the tensors they were made from (either
   * order is correct; this one keeps refcount histories short). */
  while (levels[depth].head) tensor_free(levels[depth].head);
  depth--;
  return TENSOR_OK;
}

void tensor_scope_end_to(int d) {
  if (d < 0) d = 0;
  while (depth > d) tensor_scope_end();
}

void tensor__scope_cleanup(int *d) { tensor_scope_end_to(*d - 1); }

int tensor_scope_depth(void) { return depth; }

size_t tensor_scope_count(void) { return depth ? levels[depth].count : 0; }

tensor *tensor_escape(tensor *t) {
  if (!_tensor_arg("tensor_escape", "t", t)) return NULL;
  char b[TENSOR_SHAPE_STR];
  if (depth == 0) {
    _tensor_err(TENSOR_ESCOPE, "tensor_escape: no scope is open (escaping %s)", _tensor_desc(t, b));
    return NULL;
  }
  if (t->scope == 0) {
    _tensor_err(TENSOR_ESCOPE, "tensor_escape: %s belongs to no scope", _tensor_desc(t, b));
    return NULL;
  }
  int to = t->scope - 1;
  _tensor_scope_forget(t);
  if (to > 0) link_into(t, to);
  return t;
}
