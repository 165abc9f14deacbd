/* plain.c - libplain.so for nocuda.c: found through its RUNPATH only. */
int plain_twice(int x) { return 2 * x; }
