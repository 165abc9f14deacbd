/* tags.c - the tags: names given by ta_tag_get, an id each (0 is "any"),
 * at most TA_MAX_TAGS.  Ids are handed out under a lock and read without
 * one: _ta_tag_count only grows, and a name is stored before its id is. */
#include "internal.h"

#include <string.h>

static pthread_mutex_t tag_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *tag_names[TA_MAX_TAGS] = { "any" };
TA_HIDDEN _Atomic uint32_t _ta_tag_count = 1;

ta_tag ta_tag_get(const char *name) {
  _ta_ensure();
  if (name == NULL || *name == '\0') {
    _ta_error(TA_EINVAL, "ta_tag_get: a tag needs a non-empty name");
    return TA_ANY;
  }
  uint32_t n = atomic_load_explicit(&_ta_tag_count, memory_order_acquire);
  for (uint32_t i = 1; i < n; i++)
    if (strcmp(tag_names[i], name) == 0) return i;
  pthread_mutex_lock(&tag_lock);
  n = atomic_load(&_ta_tag_count);
  ta_tag found = TA_ANY;
  for (uint32_t i = 1; i < n && !found; i++)
    if (strcmp(tag_names[i], name) == 0) found = i;
  if (!found && n < TA_MAX_TAGS) {
    tag_names[n] = _ta_meta_strdup(name);
    found = n;
    atomic_store_explicit(&_ta_tag_count, n + 1, memory_order_release);
    _ta_trace_tag(found, name);
  }
  pthread_mutex_unlock(&tag_lock);
  if (!found) _ta_error(TA_EINVAL, "ta_tag_get: no room for tag \"%s\" (%d tags at most)", name, TA_MAX_TAGS);
  return found;
}

const char *ta_tag_name(ta_tag tag) {
  return tag < atomic_load(&_ta_tag_count) ? tag_names[tag] : "?";
}

ta_tag _ta_tag_realloc;         /* the tag of ta_realloc(NULL, n) */

void _ta_tags_init(void) {
  _ta_tag_realloc = ta_tag_get("realloc");
}

void _ta_tags_fork(int phase) {
  if (phase == TA_FORK_PREPARE) pthread_mutex_lock(&tag_lock);
  else pthread_mutex_unlock(&tag_lock);
}
