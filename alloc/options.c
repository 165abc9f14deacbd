/* options.c - one table of options, read once from TAGALLOC_<NAME>.
 *
 * Values accept decimal numbers with an optional K/M/G suffix, and on/off,
 * yes/no, true/false for flags.  A bad value warns once and keeps the
 * default.  Reading never allocates (getenv and stack buffers only). */
#include "internal.h"

#include <ctype.h>
#include <limits.h>
#include <strings.h>
#include <stdlib.h>
#include <string.h>

ta_options_t _ta_opt = {
  .unwind = TA_UNWIND_EXACT,
  .depth = 32,
  .quarantine = 64L << 20,
  .quarantine_blocks = 16384,
  .check = TA_CHECK_FULL,
  .quarantine_sample = 16,
  .report = 1,
  .scan_at_exit = 1,
  .poison = 0xDF,
  .poison_span = 256,
  .fill = -1,
  .ref_history = 1024,
  .trace_buffer = 64L << 10,
  .max_frames = 32,
  .max_groups = 100,
  .record = 1,
  .trace = NULL,
  .follow = 1,
  .clock = 1,
  .trace_events = 1,
  .guard = 0,
  .guard_slots = 65536,
  .guard_sample = 100,
  .beside = 1,
};

typedef enum { OPT_SIZE, OPT_FLAG, OPT_UNWIND, OPT_CHECK, OPT_BYTE, OPT_STRING, OPT_SPAN } opt_kind;

typedef struct {
  const char *name;   /* lower case; the variable is TAGALLOC_<NAME upper> */
  opt_kind    kind;
  long       *value;
  long        min, max;
  const char **str;
} opt_desc;

static const opt_desc opt_table[] = {
  { "unwind",        OPT_UNWIND, &_ta_opt.unwind,       0, 2, NULL },
  { "depth",         OPT_SIZE,   &_ta_opt.depth,        1, TA_MAX_DEPTH, NULL },
  { "quarantine",    OPT_SIZE,   &_ta_opt.quarantine,   0, 1L << 40, NULL },
  { "quarantine_blocks", OPT_SIZE, &_ta_opt.quarantine_blocks, 0, 1L << 22, NULL },
  { "check",         OPT_CHECK,  &_ta_opt.check,        0, 2, NULL },
  { "quarantine_sample", OPT_SIZE, &_ta_opt.quarantine_sample, 1, 1L << 20, NULL },
  { "report",        OPT_FLAG,   &_ta_opt.report,       0, 1, NULL },
  { "scan",          OPT_FLAG,   &_ta_opt.scan_at_exit, 0, 1, NULL },
  { "poison",        OPT_BYTE,   &_ta_opt.poison,       0, 255, NULL },
  { "poison_span",   OPT_SPAN,   &_ta_opt.poison_span,  0, LONG_MAX, NULL },
  { "fill",          OPT_BYTE,   &_ta_opt.fill,         -1, 255, NULL },
  { "ref_history",   OPT_SIZE,   &_ta_opt.ref_history,  2, 1L << 24, NULL },
  { "trace_buffer",  OPT_SIZE,   &_ta_opt.trace_buffer, 4096, 1L << 30, NULL },
  { "report_frames", OPT_SIZE,   &_ta_opt.max_frames,   1, TA_MAX_DEPTH, NULL },
  { "report_groups", OPT_SIZE,   &_ta_opt.max_groups,   1, 1L << 30, NULL },
  { "record",        OPT_FLAG,   &_ta_opt.record,       0, 1, NULL },
  { "trace",         OPT_STRING, NULL,                  0, 0, &_ta_opt.trace },
  { "follow",        OPT_FLAG,   &_ta_opt.follow,       0, 1, NULL },   /* the preload: exec */
  { "clock",         OPT_FLAG,   &_ta_opt.clock,        0, 1, NULL },
  { "trace_events",  OPT_FLAG,   &_ta_opt.trace_events, 0, 1, NULL },   /* trace.c: 0 writes the exit records only */
  { "guard",         OPT_FLAG,   &_ta_opt.guard,        0, 1, NULL },
  { "guard_slots",   OPT_SIZE,   &_ta_opt.guard_slots,  16, 1L << 22, NULL },
  { "guard_sample",  OPT_SIZE,   &_ta_opt.guard_sample, 1, 1L << 30, NULL },
  { "beside",        OPT_FLAG,   &_ta_opt.beside,       0, 1, NULL },
  { "suppressions",  OPT_STRING, NULL,                  0, 0, &_ta_opt.suppressions },   /* reports/suppress.c */
  { "skip",          OPT_STRING, NULL,                  0, 0, &_ta_opt.skip },   /* the preload: exec */
  { "debug_cache",   OPT_STRING, NULL,                  0, 0, &_ta_opt.debug_cache },   /* reports/symbolize.c */
  { "alloc_wrappers", OPT_STRING, NULL,                 0, 0, &_ta_opt.alloc_wrappers },   /* reports/wrappers.c */
};
#define OPT_COUNT (sizeof opt_table / sizeof opt_table[0])

static bool parse_flag(const char *s, long *out) {
  static const char *on[] = { "1", "on", "yes", "true" };
  static const char *off[] = { "0", "off", "no", "false" };
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(s, on[i]) == 0) { *out = 1; return true; }
    if (strcasecmp(s, off[i]) == 0) { *out = 0; return true; }
  }
  return false;
}

static bool parse_size(const char *s, long *out) {
  char *end;
  if (!isdigit((unsigned char)*s) && *s != '-') return false;
  long v = strtol(s, &end, 0);
  int shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
  }
  if (*end == 'i' || *end == 'I') end++;          /* KiB, MiB */
  if (*end == 'b' || *end == 'B') end++;
  if (*end != '\0') return false;
  if (shift && (v > (LONG_MAX >> shift) || v < 0)) return false;
  *out = shift ? v << shift : v;
  return true;
}

/* String values are copied: the environment may be gone when they are
 * used (the preload frees the runtime's memory at exit, as memcheck does,
 * and glibc's __libc_freeres clears the environment). */
static char strings[4][4096];
static size_t nstrings;

static bool parse_one(const opt_desc *d, const char *s) {
  long v;
  switch (d->kind) {
    case OPT_STRING:
      if (*s && strlen(s) < sizeof strings[0] && nstrings < sizeof strings / sizeof strings[0]) {
        memcpy(strings[nstrings], s, strlen(s) + 1);
        s = strings[nstrings++];
      }
      *d->str = *s ? s : NULL;
      return true;
    case OPT_FLAG:
      if (!parse_flag(s, &v)) return false;
      break;
    case OPT_UNWIND:
      if (strcmp(s, "exact") == 0) v = TA_UNWIND_EXACT;
      else if (strcmp(s, "fast") == 0) v = TA_UNWIND_FAST;
      else if (strcmp(s, "none") == 0) v = TA_UNWIND_NONE;
      else return false;
      break;
    case OPT_CHECK:
      if (strcmp(s, "leaks") == 0) v = TA_CHECK_LEAKS;
      else if (strcmp(s, "errors") == 0) v = TA_CHECK_ERRORS;
      else if (strcmp(s, "full") == 0) v = TA_CHECK_FULL;
      else return false;
      break;
    case OPT_SPAN:                                /* a size, or all */
      if (strcasecmp(s, "all") == 0) v = LONG_MAX;
      else if (!parse_size(s, &v)) return false;
      break;
    case OPT_BYTE:
      if (strcmp(s, "none") == 0 || strcmp(s, "off") == 0) v = -1;
      else if (!parse_size(s, &v)) return false;
      break;
    default:
      if (!parse_size(s, &v)) return false;
      break;
  }
  if (v < d->min || v > d->max) return false;
  *d->value = v;
  return true;
}

/* Names read outside the ledger: the command-line tool's, gpu/'s (README's
 * GPU section) and the training stack's seeded bugs. */
static const char *const other_names[] = { "preload", "gpu", "gpu_cuda_lib", "gpu_host_mem", "gpu_max_split", "gpu_cublas",
                                           "fault" };

/* The edit distance of a and b (ASCII, case-insensitive), at most 63 bytes
 * each; larger for longer ones.  No allocation. */
static size_t edit_distance(const char *a, size_t na, const char *b, size_t nb) {
  if (na > 63 || nb > 63) return 64;
  size_t row[64];
  for (size_t j = 0; j <= nb; j++) row[j] = j;
  for (size_t i = 1; i <= na; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= nb; j++) {
      size_t up = row[j];
      size_t cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
      size_t best = diag + cost;
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[nb];
}

static bool name_is(const char *name, const char *s, size_t n) {
  return strlen(name) == n && strncasecmp(name, s, n) == 0;
}

const char *ta_options_unknown(const char *entry, char *hint, size_t hintlen) {
  if (strncmp(entry, "TAGALLOC_", 9) != 0) return NULL;
  const char *name = entry + 9, *eq = strchr(name, '=');
  size_t n = eq ? (size_t)(eq - name) : strlen(name);
  const char *best = NULL;
  size_t best_d = 3;   /* "did you mean" up to two edits away */
  for (size_t i = 0; i < OPT_COUNT + sizeof other_names / sizeof *other_names; i++) {
    const char *known = i < OPT_COUNT ? opt_table[i].name : other_names[i - OPT_COUNT];
    if (name_is(known, name, n)) return NULL;
    size_t d = edit_distance(known, strlen(known), name, n);
    if (d < best_d) {
      best_d = d;
      best = known;
    }
  }
  if (hintlen) {
    size_t k = 0;
    if (best) {
      static const char pre[] = "TAGALLOC_";
      for (const char *p = pre; *p && k + 1 < hintlen; p++) hint[k++] = *p;
      for (const char *p = best; *p && k + 1 < hintlen; p++) hint[k++] = (char)toupper((unsigned char)*p);
    }
    hint[k] = '\0';
  }
  return name;
}

/* A TAGALLOC_ variable that is no option warns once (a misspelt option is
 * otherwise silently the default).  Under `tagalloc run` (it sets
 * TAGALLOC_TRACE_EVENTS) the tool has warned already, once for all
 * processes. */
static void warn_unknown(void) {
  extern char **environ;
  if (getenv("TAGALLOC_TRACE_EVENTS")) return;
  for (size_t i = 0; environ && environ[i]; i++) {
    char hint[80];
    const char *name = ta_options_unknown(environ[i], hint, sizeof hint);
    if (!name) continue;
    char var[72];
    size_t n = 0;
    while (name[n] && name[n] != '=' && n + 1 < sizeof var) {
      var[n] = name[n];
      n++;
    }
    var[n] = '\0';
    if (hint[0])
      _ta_error(TA_EOPTION, "TAGALLOC_%s is not an option (did you mean %s?); ignored", var, hint);
    else
      _ta_error(TA_EOPTION, "TAGALLOC_%s is not an option; ignored", var);
  }
}

void _ta_options_init(void) {
  static atomic_int done;
  if (atomic_load_explicit(&done, memory_order_acquire)) return;
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&lock);
  if (!atomic_load_explicit(&done, memory_order_relaxed)) {
    for (size_t i = 0; i < OPT_COUNT; i++) {
      char var[64] = "TAGALLOC_";
      size_t n = strlen(var);
      for (const char *p = opt_table[i].name; *p && n < sizeof var - 1; p++)
        var[n++] = (char)toupper((unsigned char)*p);
      var[n] = '\0';
      const char *s = getenv(var);
      if (s == NULL) continue;
      if (!parse_one(&opt_table[i], s))
        _ta_error(TA_EOPTION, "%s=%s is not a valid value; keeping the default", var, s);
    }
    warn_unknown();
    atomic_store_explicit(&done, 1, memory_order_release);
  }
  pthread_mutex_unlock(&lock);
}

const char *ta_option_string(const char *name) {
  _ta_options_init();
  for (size_t i = 0; i < OPT_COUNT; i++)
    if (opt_table[i].kind == OPT_STRING && strcmp(opt_table[i].name, name) == 0) return *opt_table[i].str;
  return NULL;
}

long ta_option(const char *name) {
  _ta_options_init();
  for (size_t i = 0; i < OPT_COUNT; i++) {
    if (strcmp(opt_table[i].name, name) != 0) continue;
    if (opt_table[i].kind == OPT_STRING) return *opt_table[i].str != NULL;
    return *opt_table[i].value;
  }
  return -1;
}
