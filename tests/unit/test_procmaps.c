/* test_procmaps.c - the one reader of /proc/self/maps (procmaps.c): a line's
 * fields, lines it refuses, a path with spaces, and the walk over the
 * process's own maps (the mapping of this test's code, of a stack variable,
 * stopping early). */
#include "harness.h"
#include "procmaps.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void test_parse_file_line(void **state) {
  (void)state;
  ta_maps_entry e;
  const char *l = "7f12a0000000-7f12a0021000 r-xp 00001000 08:01 1234                       /usr/lib/libc.so.6";
  assert_true(_ta_maps_parse(l, &e));
  assert_int_equal(e.lo, 0x7f12a0000000);
  assert_int_equal(e.hi, 0x7f12a0021000);
  assert_string_equal(e.perms, "r-xp");
  assert_int_equal(e.offset, 0x1000);
  assert_string_equal(e.path, "/usr/lib/libc.so.6");
  assert_ptr_equal(e.line, l);
  assert_int_equal(e.len, strlen(l));
}

static void test_parse_other_lines(void **state) {
  (void)state;
  ta_maps_entry e;
  /* anonymous: no path */
  assert_true(_ta_maps_parse("55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0 ", &e));
  assert_string_equal(e.path, "");
  assert_string_equal(e.perms, "rw-p");
  assert_true(_ta_maps_parse("7ffd5a1c0000-7ffd5a1e1000 rw-p 00000000 00:00 0                          [stack]", &e));
  assert_string_equal(e.path, "[stack]");
  /* a path with spaces, and a deleted file */
  assert_true(_ta_maps_parse("400000-401000 r--s 0000a000 fd:02 77 /tmp/my lib.so (deleted)", &e));
  assert_int_equal(e.lo, 0x400000);
  assert_int_equal(e.offset, 0xa000);
  assert_string_equal(e.perms, "r--s");
  assert_string_equal(e.path, "/tmp/my lib.so (deleted)");
  /* not a maps line */
  assert_false(_ta_maps_parse("", &e));
  assert_false(_ta_maps_parse("Name: foo", &e));
  assert_false(_ta_maps_parse("400000 401000 r-xp 0 0:0 0", &e));
  assert_false(_ta_maps_parse("400000-401000 r-x", &e));
  assert_false(_ta_maps_parse("400000-401000 r-xp zz 08:01 1", &e));
}

typedef struct {
  uintptr_t a;
  ta_maps_entry found;
  char path[4096];
  int lines;
} finder;

static int find(const ta_maps_entry *e, void *arg) {
  finder *f = arg;
  f->lines++;
  if (f->a < e->lo || f->a >= e->hi) return 0;
  f->found = *e;
  snprintf(f->path, sizeof f->path, "%s", e->path);
  return 7;
}

static void test_walk_own_maps(void **state) {
  (void)state;
  /* this function's code: an executable mapping of the test program */
  finder f = { .a = (uintptr_t)test_walk_own_maps };
  assert_int_equal(_ta_maps_each(find, &f), 7);
  assert_int_equal(f.found.perms[0], 'r');
  assert_int_equal(f.found.perms[2], 'x');
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  assert_true(n > 0);
  exe[n] = '\0';
  assert_string_equal(f.path, exe);
  /* a stack variable: a private writable mapping, "[stack]" on the main
   * thread (anonymous under valgrind, which gives the program a stack of
   * its own making) */
  int local = 0;
  finder s = { .a = (uintptr_t)&local };
  assert_int_equal(_ta_maps_each(find, &s), 7);
  assert_string_equal(s.found.perms, "rw-p");
  if (strcmp(s.path, "[stack]") != 0) assert_string_equal(s.path, "");
  /* the walk stops at the first nonzero return: the stack comes after the code */
  assert_true(s.lines > f.lines);
  /* no mapping at address 0: every line seen, 0 returned */
  finder z = { .a = 0 };
  assert_int_equal(_ta_maps_each(find, &z), 0);
  assert_true(z.lines > f.lines);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_parse_file_line),
    cmocka_unit_test(test_parse_other_lines),
    cmocka_unit_test(test_walk_own_maps),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
