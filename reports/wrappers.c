/* wrappers.c - allocator wrappers: functions whose job is to call malloc
 * (Perl_safesysmalloc, PyMem_Malloc, g_malloc, xmalloc, operator new, a
 * program's own my_malloc).  A report names an allocation by the first frame
 * of its stack that is none of them, so that a table of perl's leaks does
 * not say Perl_safesyscalloc on every row, and a callsite is where the
 * program asked for memory.  The stacks themselves keep every frame.
 *
 * The rule: a function is a wrapper when its name matches a glob of the list
 * below, or ends with malloc, calloc, realloc, zalloc, strdup or strndup
 * (case-insensitive: emalloc, safe_malloc, XtMalloc).
 * TAGALLOC_ALLOC_WRAPPERS replaces the list (comma-separated globs; "none":
 * no wrappers at all, the suffix rule included) or, starting with "+", adds
 * to it.  Read at load (environ may be gone at an audited process's exit). */
#include "model.h"

#include <fnmatch.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const default_list[] = {
  "Perl_safesys*", "Perl_malloc", "Perl_calloc", "Perl_realloc", "Perl_newSV*body*",
  "PyMem_*", "_PyMem_*", "PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "_PyObject_Malloc",
  "_PyObject_Calloc", "_PyObject_Realloc", "pymalloc_*", "_PyObject_GC_Alloc*", "gc_alloc",
  "g_malloc*", "g_try_malloc*", "g_realloc*", "g_try_realloc*", "g_slice_alloc*", "g_memdup*", "g_strdup*",
  "g_strndup", "xmalloc", "xcalloc", "xrealloc", "xzalloc", "xstrdup", "xstrndup", "xmemdup", "xnmalloc",
  "xcharalloc", "ximalloc", "xicalloc",
  "operator new*", "operator new[]*", "__gnu_cxx::new_allocator*", "std::__new_allocator*",
  "std::allocator<*>::allocate*", "std::allocator_traits<*>::allocate*", "__rust_alloc*", "__rdl_alloc*",
  "alloc::alloc::*", "CRYPTO_malloc", "CRYPTO_zalloc", "CRYPTO_realloc", "CRYPTO_clear_realloc",
  "CRYPTO_strdup", "CRYPTO_strndup", "sqlite3Malloc*", "sqlite3_malloc*", "sqlite3DbMalloc*",
  "uv__malloc", "uv__calloc", "uv__realloc", "uv__strdup",
};

static const char *const suffixes[] = { "malloc", "calloc", "realloc", "zalloc", "strdup", "strndup" };

static char *user_list;       /* TAGALLOC_ALLOC_WRAPPERS as given, or NULL */
static bool  user_adds;       /* it started with "+" */
static bool  none;            /* "none": nothing is a wrapper */

__attribute__((constructor)) static void wrappers_init(void) {
  const char *e = getenv("TAGALLOC_ALLOC_WRAPPERS");
  if (!e) return;
  if (strcmp(e, "none") == 0 || !*e) {
    none = true;
    return;
  }
  user_adds = e[0] == '+';
  user_list = strdup(e + user_adds);
}

/* name's last part, without a C++ parameter list: "ns::f(int)" -> compared
 * by fnmatch whole, so only the suffix rule needs the bare name. */
static bool suffix_rule(const char *name) {
  size_t n = strcspn(name, "(");
  for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
    size_t k = strlen(suffixes[i]);
    if (n >= k && strncasecmp(name + n - k, suffixes[i], k) == 0) return true;
  }
  return false;
}

static bool in_user_list(const char *name) {
  for (const char *p = user_list; p && *p;) {
    const char *c = strchr(p, ',');
    size_t n = c ? (size_t)(c - p) : strlen(p);
    char pat[256];
    if (n && n < sizeof pat) {
      memcpy(pat, p, n);
      pat[n] = '\0';
      if (fnmatch(pat, name, 0) == 0) return true;
    }
    if (!c) break;
    p = c + 1;
  }
  return false;
}

bool report_function_is_wrapper(const char *name) {
  if (!name || !*name || none) return false;
  if (user_list && !user_adds) return in_user_list(name);
  if (in_user_list(name) || suffix_rule(name)) return true;
  for (size_t i = 0; i < sizeof default_list / sizeof *default_list; i++)
    if (fnmatch(default_list[i], name, 0) == 0) return true;
  return false;
}
