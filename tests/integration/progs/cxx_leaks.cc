// C++: leaks through new, new[] and a container; names must be demangled.
#include <cstdlib>
#include <string>
#include <vector>
#include "common.h"

namespace net {
struct Packet {
  char payload[40];
  explicit Packet(int v) { memset(payload, v, sizeof payload); }
};

NOINLINE Packet *build_packet(int v) { return new Packet(v); }   // 40 bytes

template <typename T>
struct Pool {
  NOINLINE static T *grab(std::size_t n) { return new T[n]; }
};
}  // namespace net

struct Holder {
  std::vector<int> *items;                   // 24-byte vector, 100-int buffer
};

NOINLINE void leak_packets() {
  for (int i = 0; i < 3; i++) escape(net::build_packet(i));
}

NOINLINE void leak_array() { escape(net::Pool<int>::grab(25)); }   // 100 bytes

NOINLINE std::vector<int> *make_vector() {
  auto *v = new std::vector<int>();
  v->reserve(100);                           // 400-byte buffer from operator new
  for (int i = 0; i < 100; i++) v->push_back(i);
  return v;
}

NOINLINE void leak_vector() {
  Holder h;
  h.items = make_vector();
  escape(&h);
}

NOINLINE void no_leak() {
  std::string s(100, 'x');                   // freed
  std::vector<double> d(50, 1.0);            // freed
  auto *p = new net::Packet(9);
  delete p;
  auto *a = new long[7];
  delete[] a;
  escape(s.data());
}

int main() {
  leak_packets();
  leak_array();
  leak_vector();
  no_leak();
  clobber_stack();
  say("c++ done\n");
  return 0;
}
