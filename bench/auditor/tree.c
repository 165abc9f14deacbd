/* tree.c - bench/auditor workload: a recursive binary tree built and freed.
 *
 *   tree [--depth D] [--iters K]
 *
 * Builds a complete binary tree of depth D (default 20: 2^20 - 1 = 1,048,575
 * nodes, one malloc each), walks it, frees it, K times (default 10).
 * Prints a checksum, and leaks one block of 4242 bytes from leak_one() on
 * purpose, for the auditors to find. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct node {
  struct node *left, *right;
  uint64_t     value;
} node;

static __attribute__((noinline)) node *build(int depth, uint64_t value) {
  node *n = malloc(sizeof *n);
  if (!n) {
    fprintf(stderr, "tree: out of memory\n");
    exit(1);
  }
  n->value = value;
  n->left = depth > 1 ? build(depth - 1, 2 * value) : NULL;
  n->right = depth > 1 ? build(depth - 1, 2 * value + 1) : NULL;
  return n;
}

static __attribute__((noinline)) uint64_t walk(const node *n) {
  return n ? n->value ^ (walk(n->left) + 3 * walk(n->right)) : 0;
}

static __attribute__((noinline)) void release(node *n) {
  if (!n) return;
  release(n->left);
  release(n->right);
  free(n);
}

void *volatile leak_sink;

/* Overwrites the dead stack below the caller, so that no stale copy of the
 * planted pointer is left for a conservative scan to find. */
static __attribute__((noinline)) void scrub_stack(void) {
  volatile uint64_t pad[4096];
  for (size_t i = 0; i < sizeof pad / sizeof pad[0]; i++) pad[i] = 0;
}

static __attribute__((noinline)) void *leak_one(void) {
  char *p = malloc(4242);
  if (p) memset(p, 0x42, 4242);
  return p;
}

int main(int argc, char **argv) {
  int depth = 20, iters = 10;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--depth") == 0 && i + 1 < argc) depth = atoi(argv[++i]);
    else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) iters = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--depth D] [--iters K]\n", argv[0]);
      return 2;
    }
  }
  if (depth < 1 || depth > 30) depth = 20;
  uint64_t sum = 0;
  for (int k = 0; k < iters; k++) {
    node *root = build(depth, 1);
    sum = sum * 31 + walk(root);
    release(root);
  }
  leak_sink = leak_one();   /* then lost: a direct leak */
  leak_sink = NULL;
  scrub_stack();
  printf("tree: depth %d (%llu nodes) x %d, checksum %016llx\n", depth, (unsigned long long)((1ull << depth) - 1),
         iters, (unsigned long long)sum);
  return 0;
}
