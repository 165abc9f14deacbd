/* trace_format.h - the records of a tagalloc trace (see TRACE.md).
 * Little-endian, native layout of x86-64; every record starts with a
 * tr_header whose size covers the header, the fixed part and any trailing
 * strings, padded to 8 bytes.  Readers skip record types they don't know. */
#ifndef TAGALLOC_TRACE_FORMAT_H
#define TAGALLOC_TRACE_FORMAT_H

#include <stdint.h>

#define TR_MAGIC   0x31434f4c4c414754ull   /* "TGALLOC1" read as little-endian bytes */
#define TR_VERSION 2                      /* 2: stacks as FRAME records */

typedef struct {
  uint64_t magic;
  uint32_t version;
  uint32_t header_size;      /* bytes of this header; records follow */
  uint32_t pid, ppid;
  uint64_t start_ns;         /* CLOCK_MONOTONIC at open */
} tr_file_header;

typedef struct {
  uint32_t size;             /* of the whole record, header included */
  uint8_t  type;
  uint8_t  pad[3];
} tr_header;

enum {
  TR_MODULE = 1, TR_STACK = 2, TR_TAG = 3, TR_ALLOC = 4, TR_FREE = 5, TR_REALLOC = 6,
  TR_REF = 7, TR_HOLD = 8, TR_ARENA_RESET = 9, TR_MARK = 10, TR_THREAD_START = 11,
  TR_THREAD_END = 12, TR_TIME = 13, TR_FINDING_EVENT = 14, TR_FINDING = 15, TR_END = 16,
  TR_PACKED = 17, TR_FRAME = 18, TR_DEVICE_ALLOC = 19, TR_DEVICE_FREE = 20,
  TR_COMMAND = 24,           /* 21..23 are kept for further device records */
  TR_SUMMARY = 25, TR_REF_SITE = 26, TR_EXIT = 27,
};

/* PACKED: a run of one thread's ALLOC and FREE events, varint-encoded (see
 * TRACE.md): the fixed part, then the events, then zero bytes to the end. */
typedef struct { uint32_t thread, pad; } tr_packed;
enum { TR_PK_ALLOC = 1, TR_PK_ARENA = 2, TR_PK_FREE = 4 };
#define TR_PK_EVENT_MAX 64          /* bytes an encoded event may take, at most */

typedef struct { uint64_t lo, hi, offset; /* then the path, NUL-terminated */ } tr_module;
typedef struct { uint32_t id; uint16_t n, pad; /* then n uint64 return addresses */ } tr_stack;   /* version 1 */
typedef struct { uint32_t id, parent; uint64_t pc; } tr_frame;   /* stack id: pc called from stack parent (0: none) */
typedef struct { uint32_t id; /* then the name */ } tr_tag;
typedef struct { uint64_t seq, addr, size; uint32_t stack; uint16_t tag; uint8_t arena, pad; uint32_t thread; } tr_alloc;
typedef struct { uint64_t seq, addr; uint32_t stack, thread; } tr_free;
typedef struct { uint64_t seq, old, addr, size; uint32_t stack, thread; } tr_realloc;
typedef struct { uint64_t seq, obj; int64_t count; int32_t delta; uint32_t stack, thread, pad; } tr_ref;
typedef struct { uint64_t seq, holder, ptr; uint32_t stack, thread; /* then the slot; ptr 0: unhold */ } tr_hold;
typedef struct { uint64_t seq, arena, generation; uint32_t stack, thread; /* generation 0: freed */ } tr_arena_reset;
typedef struct { uint64_t seq, mark, ns; uint32_t thread, pad; } tr_mark;
typedef struct { uint64_t seq; uint32_t thread, tid; } tr_thread;
typedef struct { uint64_t seq, ns; } tr_time;
typedef struct { uint64_t seq, addr; uint32_t stack, thread; /* then the kind */ } tr_finding_event;
typedef struct {
  uint64_t bytes, blocks, addr, holder;
  uint32_t stack, alloc_stack, free_stack, aux_stack;
  uint16_t tag, pad16;
  uint32_t pad32;
  /* then kind, slot and detail, each NUL-terminated */
} tr_finding;
typedef struct { uint64_t seq, ns; } tr_end;
/* REF_SITE: one callsite of the refcount balance of the FINDING before it
 * (ta_ref_site, as the ledger computed it at exit). */
typedef struct {
  uint64_t transitions;
  int64_t  balance;
  uint32_t stack, paired;    /* paired: UINT32_MAX when none */
  int32_t  delta, extra;
} tr_ref_site;
/* EXIT: how the process image ended, as the preload saw it, just before
 * END: exit_code -1 when it did not exit (an exec, a fatal signal), signal
 * the fatal signal (0: none). */
typedef struct { int32_t exit_code, signal; } tr_exit;
/* SUMMARY: ta_summary_get() at exit, just before END (the exit scan's
 * numbers: what the process's own report printed). */
typedef struct {
  uint64_t direct_bytes, direct_blocks, indirect_bytes, indirect_blocks;
  uint64_t possible_bytes, possible_blocks, reachable_bytes, reachable_blocks;
  uint64_t orphan_bytes, orphan_blocks, allocs, frees, live_bytes, peak_bytes, errors;
} tr_summary;
/* Device memory (ta_device_alloc, ta_device_free): keyed by (tag, device, addr). */
typedef struct {
  uint64_t seq, addr, size;
  uint32_t stack, thread;
  uint16_t tag, pad16;
  int32_t  device;
  uint32_t flags, pad32;     /* flags: TR_DEVICE_RESERVE (tagalloc.h's TA_DEVICE_RESERVE) */
} tr_device_alloc;
#define TR_DEVICE_RESERVE 1u
typedef struct { uint64_t seq, addr; uint32_t stack, thread; uint16_t tag, pad16; int32_t device; } tr_device_free;
/* COMMAND: the process's command line at open (/proc/self/cmdline): argc
 * NUL-terminated arguments follow; truncated: 1 when the line was longer
 * than the record may be (the arguments that fit are kept whole). */
typedef struct { uint32_t argc, truncated; } tr_command;

#endif
