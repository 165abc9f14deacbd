/* pagefault.c - bench/auditor: what a first touch of a page costs here.
 *
 *   pagefault [PAGES]
 *
 * Maps PAGES fresh anonymous pages (default 4,000), writes one byte into
 * each, and prints the median over 5 repetitions of the microseconds per
 * page.  Every page an auditor makes a program touch (its tables, its
 * quarantine, its libraries) costs this once: about 0.1-0.3 us on bare
 * metal, much more in some virtual machines, where it is a large part of
 * the cost of auditing a short program.  run.py prints it with the
 * machine. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  long pages = argc > 1 ? strtol(argv[1], NULL, 10) : 4000;
  if (pages <= 0) {
    fprintf(stderr, "pagefault: PAGES must be a positive number: %s\n", argv[1]);
    return 2;
  }
  size_t psize = (size_t)sysconf(_SC_PAGESIZE);
  double us[5];
  for (int r = 0; r < 5; r++) {
    volatile char *p = mmap(NULL, (size_t)pages * psize, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      perror("pagefault: mmap");
      return 1;
    }
    double t0 = now_us();
    for (long i = 0; i < pages; i++) p[(size_t)i * psize] = 1;
    us[r] = (now_us() - t0) / (double)pages;
    munmap((void *)p, (size_t)pages * psize);
  }
  qsort(us, 5, sizeof us[0], cmp_double);
  printf("%.2f\n", us[2]);
  return 0;
}
