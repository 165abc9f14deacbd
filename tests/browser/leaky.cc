// leaky.cc - the program of the browser test (tests/browser/run.sh), built
// under a file name that is HTML: "<img src=x onerror=...>.cc".  Its
// function names are C++ templates (< > &), it takes an argument that is
// HTML, marks 6 iterations (ta_mark_now, from the preload, when there is
// one) in which a tape grows by 128 bytes, and leaks 3 blocks.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

extern "C" uint64_t ta_mark_now(void) __attribute__((weak));

template <typename T, typename U>
__attribute__((noinline)) T *make_leak(const U &n) {
  return static_cast<T *>(malloc(n * sizeof(T)));
}

static std::vector<void *> tape;

__attribute__((noinline)) static void iteration(int i) {
  void *t = malloc(4096);
  memset(t, i, 4096);
  free(t);
  tape.push_back(malloc(128));
}

int main(int argc, char **argv) {
  tape.reserve(64);
  for (int it = 0; it < 6; it++) {
    if (ta_mark_now) ta_mark_now();
    iteration(it);
  }
  if (ta_mark_now) ta_mark_now();
  void *volatile leaked = make_leak<std::pair<int, char>>(argc * 10);
  leaked = make_leak<char>(std::strlen(argv[argc - 1]) + 1);
  leaked = make_leak<std::pair<int, char>>(3);
  leaked = nullptr;
  return 0;
}
