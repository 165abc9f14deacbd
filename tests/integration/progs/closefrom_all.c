/* A program that closes every descriptor above the standard ones, as ssh
 * does at start (close_range, then closefrom), after losing 50 bytes and
 * keeping 30.  The auditor's trace (the process's report for `tagalloc
 * run`) stays open: direct 50/1, reachable 30/1. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <unistd.h>
#include "common.h"

char *g_kept;

NOINLINE void lose(void) { char *p = malloc(50); memset(p, 1, 50); escape(p); }

int main(void) {
  lose();
  g_kept = malloc(30);
  memset(g_kept, 2, 30);
  if (close_range(3, ~0U, 0) != 0) { say("close_range failed\n"); return 2; }
  closefrom(3);
  clobber_stack();
  say("closed\n");
  return 0;
}
