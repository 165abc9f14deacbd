"""bench/auditor workload for /usr/bin/python3: allocation-heavy, small.

Builds and drops many short-lived dicts, lists, tuples, strings and ints
(each a malloc or a pymalloc arena refill), sorts, joins and hashes them,
and prints a checksum that does not depend on the allocator.
Usage: python3 alloc_heavy.py [SCALE]   (default 1.0)."""
import sys
import zlib


def records(n, seed):
    out = []
    for i in range(n):
        key = "k%07d-%d" % ((i * 7919 + seed) % 1000003, seed)
        out.append({"key": key, "n": i, "tags": [key[:3], key[-3:], str(i % 97)], "pair": (i, -i)})
    return out


def main():
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    rounds = max(1, int(12 * scale))
    crc = 0
    kept = []
    for r in range(rounds):
        recs = records(40000, r)
        recs.sort(key=lambda d: d["key"])
        text = "|".join(d["key"] + ":" + ",".join(d["tags"]) for d in recs[::3])
        crc = zlib.crc32(text.encode(), crc)
        index = {d["key"]: d for d in recs}
        crc = zlib.crc32(repr(sorted(index)[:50]).encode(), crc)
        kept.append(recs[r])   # a few survive the round
        del recs, index, text
    print("python alloc_heavy: %d rounds, %d kept, crc %08x" % (rounds, len(kept), crc))


main()
