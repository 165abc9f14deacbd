/* seq.c - the sequence: the number of each event (allocation, free, mark,
 * ...), from a shared counter each thread takes blocks of 256 from, or from
 * the TSC when the kernel keeps time with it (TAGALLOC_CLOCK; internal.h
 * says how the two hand over in solo mode). */
#include "internal.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

_Atomic uint64_t _ta_seq = 1;
_Atomic uint64_t _ta_seq_epoch;
bool _ta_seq_clock;
_Atomic uint64_t _ta_seq_clock_base;

void _ta_seq_raise(uint64_t v) {
  uint64_t c = atomic_load(&_ta_seq);
  while (c < v && !atomic_compare_exchange_weak(&_ta_seq, &c, v)) {}
}

/* Solo mode has ended (the revoker waited for the solo thread to leave its
 * section): TSC numbers from now on must come after every count given.
 * (The solo thread may still take a count or two outside a section, if it
 * read _ta_solo just before the revoker cleared it: CLOCK_LEAD covers them.) */
#define CLOCK_LEAD 64
void _ta_seq_clock_sync(void) {
  if (!_ta_seq_clock) return;
  uint64_t c = atomic_load(&_ta_seq) + CLOCK_LEAD, k = _ta_clock();
  if (k <= c) atomic_fetch_sub(&_ta_seq_clock_base, c - k + 1);
}

/* Solo mode begins (the registry is locked, no thread is solo yet): counts
 * from now on must come after every TSC number given. */
void _ta_seq_counter_sync(void) {
  if (_ta_seq_clock) _ta_seq_raise(_ta_clock() + 1);
}

/* The kernel keeps time with the TSC only when it is invariant and agrees
 * across CPUs (it falls back to another clocksource when a check fails). */
static bool tsc_is_clock(void) {
#if !defined(__x86_64__)
  return false;
#else
  unsigned a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000000u), "c"(0));
  if (a < 0x80000007u) return false;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000007u), "c"(0));
  if (!(d & (1u << 8))) return false;             /* invariant TSC */
  int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[16];
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  return n == 4 && memcmp(buf, "tsc\n", 4) == 0;
#endif
}

void _ta_seq_clock_init(void) {
  if (!_ta_opt.clock || !tsc_is_clock()) return;
  atomic_store(&_ta_seq_clock_base, _ta_tsc() - atomic_load(&_ta_seq) - CLOCK_LEAD);
  _ta_seq_clock = true;
}
