#!/usr/bin/env python3
"""Real programs under the auditor (real.sh calls it).

Each program runs bare and under `tagalloc run --json`; its stdout, the files
it writes and its exit status must be identical.  A table of what each process
leaks follows.  A program that is not installed is skipped (SKIP line).

Usage: real.py BUILD_DIR [--jobs N] [--keep] [NAME...]
Ends with "N passed, N failed, N skipped".
"""
import concurrent.futures
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import itest   # beside this file: the suite's way of running a program

TIMEOUT = 180


def which(*names):
    for n in names:
        if os.path.isabs(n):
            if os.access(n, os.X_OK):
                return n
        else:
            p = shutil.which(n)
            if p:
                return p
    return None


class Case:
    def __init__(self, name, argv, setup=None, outputs=(), cwd_files=None, images=(), expect=None):
        self.name = name
        # {image: (direct, indirect, possible)}, each (bytes, blocks): the
        # numbers memcheck gives (real_vs_memcheck.py shows them)
        self.expect = expect or {}
        self.images = images        # exec'd images that must have their own entry
        self.argv = argv            # None: not installed
        self.setup = setup          # fn(workdir) run once, bare, before both runs
        self.outputs = outputs      # files (relative to the run's cwd) to compare
        self.cwd_files = cwd_files or {}


def cases(tmp):
    # Debian's python3, not a pyenv shim (a shell script that execs another
    # python, which would test the shim, not the interpreter).
    py = which("/usr/bin/python3", "python3")
    script = (
        "import json, collections, re\n"
        "d = {str(i): i * i for i in range(20000)}\n"
        "c = collections.Counter(len(k) for k in d)\n"
        "words = re.findall(r'[a-z]+', 'the quick brown fox jumps over the lazy dog ' * 200)\n"
        "print(sum(d.values()), sorted(c.items()), len(words))\n"
        "print(json.dumps({'a': [1, 2, {'b': None}]}, sort_keys=True))\n"
        "class Node:\n"
        "    def __init__(s, n): s.kids = [Node(n - 1) for _ in range(2)] if n else []\n"
        "def count(t): return 1 + sum(count(k) for k in t.kids)\n"
        "print(count(Node(12)))\n")
    perl = which("perl")
    perl_script = (
        'my %h = map { $_ => $_ * 2 } 1 .. 20000; my $s = 0; $s += $_ for values %h;'
        ' my @k = sort { $a <=> $b } keys %h; my $t = join(",", @k[0 .. 4]);'
        ' (my $u = "hello world " x 100) =~ s/o/0/g; print "$s $t ", length($u), "\\n";')
    git = which("git")
    gcc = which("gcc")
    node = which("node", "nodejs")
    make = which("make")
    sort = which("sort")

    def git_repo(wd):
        env = dict(os.environ, GIT_AUTHOR_NAME="T", GIT_AUTHOR_EMAIL="t@example.com",
                   GIT_COMMITTER_NAME="T", GIT_COMMITTER_EMAIL="t@example.com",
                   GIT_AUTHOR_DATE="2020-01-01T00:00:00Z", GIT_COMMITTER_DATE="2020-01-01T00:00:00Z",
                   GIT_CONFIG_NOSYSTEM="1", HOME=wd)
        repo = os.path.join(wd, "repo")
        os.makedirs(repo)
        subprocess.run([git, "init", "-q", "-b", "main", repo], check=True, env=env)
        for i in range(3):
            with open(os.path.join(repo, f"f{i}.txt"), "w") as f:
                f.write(f"file {i}\n" * (i + 1))
            subprocess.run([git, "-C", repo, "add", "."], check=True, env=env)
            subprocess.run([git, "-C", repo, "commit", "-q", "-m", f"commit {i}"], check=True, env=env)

    def c_file(wd):
        with open(os.path.join(wd, "small.c"), "w") as f:
            f.write("#include <stdio.h>\n#include <stdlib.h>\n"
                    "struct p { int x, y; };\n"
                    "static int sq(int v) { return v * v; }\n"
                    "int main(void) { struct p *q = malloc(sizeof *q); q->x = sq(3); q->y = 4;\n"
                    "  printf(\"%d\\n\", q->x + q->y); free(q); return 0; }\n")

    def makefile(wd):
        with open(os.path.join(wd, "tiny.mk"), "w") as f:
            f.write("all: a b\n\t@echo done $^\n"
                    "a:\n\t@echo making a; echo $$((6 * 7))\n"
                    "b: a\n\t@printf '%s\\n' b1 b2 | sort -r\n"
                    ".PHONY: all a b\n")

    def sort_input(wd):
        import random
        rnd = random.Random(42)
        with open(os.path.join(wd, "input.txt"), "w") as f:
            for i in range(200000):
                f.write(f"{rnd.randrange(10**9):09d} line {i}\n")

    def doc_tree(wd):
        d = os.path.join(wd, "d")
        os.makedirs(os.path.join(d, "sub"))
        for i in (1, 2, 3):
            with open(os.path.join(d, f"f{i}.txt"), "w") as f:
                f.write("".join(f"{n}\n" for n in range(1, i * 500 + 1)))
        shutil.copy(os.path.join(d, "f1.txt"), os.path.join(d, "sub", "g.txt"))

    tar = which("tar")
    out = [
        # tar loses a block whose last pointer died deep in its calls
        # (the exit scan's roots start at its call of exit)
        Case("tar czf", tar and [tar, "czf", "out.tgz", "-C", "@WD@", "d"], setup=doc_tree,
             images=("gzip",), expect={"tar": ((72, 1), (9, 3), (0, 0))}),
        Case("python3", py and [py, "-c", script]),
        Case("perl", perl and [perl, "-e", perl_script]),
        Case("git --version", git and [git, "--version"]),
        Case("git log", git and [git, "-C", "@WD@/repo", "log", "--stat", "--format=%H %an %s"],
             setup=git_repo),
        Case("gcc -c (cc1, as)", gcc and [gcc, "-O1", "-c", "@WD@/small.c", "-o", "small.o"],
             setup=c_file, outputs=["small.o"], images=("cc1", "as")),
        Case("node", node and [node, "-e",
                                "const m = new Map(); for (let i = 0; i < 20000; i++) m.set('k' + i, i);"
                                " let s = 0; for (const v of m.values()) s += v;"
                                " console.log(s, JSON.stringify([1, 2, 3].map(x => x * x)))"]),
        Case("make", make and [make, "--no-print-directory", "-f", "@WD@/tiny.mk"], setup=makefile,
             images=("sh", "sort")),
        Case("sort", sort and [sort, "-S", "8M", "--parallel=2", "@WD@/input.txt"], setup=sort_input),
    ]
    return out


def more_cases(tmp):
    """The other real programs of `make compare-memcheck` (not in real.sh: each
    is another Debian package under memcheck, slow).  Each works on files in
    its working directory (@WD@), made by its setup."""
    def tree(wd):
        d = os.path.join(wd, "d")
        os.makedirs(os.path.join(d, "sub"))
        for i in (1, 2, 3):
            with open(os.path.join(d, f"f{i}.txt"), "w") as f:
                f.write("".join(f"{n} line {n * 7 % 13} of file {i}\n" for n in range(1, i * 500 + 1)))
        with open(os.path.join(d, "sub", "g.txt"), "w") as f:
            f.write("alpha\nbeta\ngamma\n" * 50)
        with open(os.path.join(wd, "a.txt"), "w") as f:
            f.write("".join(f"line {n}\n" for n in range(300)))
        with open(os.path.join(wd, "b.txt"), "w") as f:
            f.write("".join(f"line {n}\n" for n in range(300) if n % 17) + "tail\n")
        subprocess.run(["diff", "-u", "a.txt", "b.txt"], cwd=wd, stdout=open(os.path.join(wd, "ab.diff"), "w"))
        with open(os.path.join(wd, "small.c"), "w") as f:
            f.write("#include <stdio.h>\n#include <stdlib.h>\n"
                    "static int sq(int v) { return v * v; }\n"
                    "int main(void) { int *q = malloc(2 * sizeof *q); q[0] = sq(3); q[1] = 4;\n"
                    "  printf(\"%d\\n\", q[0] + q[1]); free(q); return 0; }\n")
        with open(os.path.join(wd, "small.cc"), "w") as f:
            f.write("#include <map>\n#include <string>\n#include <vector>\n#include <iostream>\n"
                    "template <class T> T sum(const std::vector<T> &v) { T s{}; for (auto x : v) s += x; return s; }\n"
                    "int main() { std::map<std::string, int> m; for (int i = 0; i < 10; i++) m[std::to_string(i)] = i;\n"
                    "  std::vector<int> v; for (auto &p : m) v.push_back(p.second); std::cout << sum(v) << '\\n'; }\n")
        with open(os.path.join(wd, "q.sql"), "w") as f:
            f.write("create table t(a integer primary key, b text);\n"
                    "with recursive c(x) as (select 1 union all select x + 1 from c where x < 2000)\n"
                    "  insert into t select x, printf('row %d', x) from c;\n"
                    "create index tb on t(b);\n"
                    "select count(*), sum(a), max(b) from t where b like 'row 1%';\n")
        with open(os.path.join(wd, "j.json"), "w") as f:
            json.dump({"items": [{"id": i, "name": f"n{i}", "tags": ["x", "y"][: i % 3]} for i in range(200)]}, f)
        with open(os.path.join(wd, "s.py"), "w") as f:
            f.write("import re, json, sys\n"
                    "words = re.findall(r'[a-z]+', open(sys.argv[1]).read())\n"
                    "print(len(words), json.dumps(sorted(set(words))[:5]))\n")
        with open(os.path.join(wd, "s.pl"), "w") as f:
            f.write('my %c; while (<>) { $c{$1}++ while /(\\w+)/g } '
                    'print join(",", map { "$_=$c{$_}" } (sort keys %c)[0 .. 4]), "\\n";\n')
        with open(os.path.join(wd, "s.sh"), "w") as f:
            f.write("declare -A h; for i in $(seq 1 300); do h[k$i]=$((i * i)); done\n"
                    "s=0; for k in \"${!h[@]}\"; do s=$((s + h[$k])); done\n"
                    "arr=(one two three); echo \"$s ${#arr[@]} $(echo sub | tr a-z A-Z)\"\n")
        with open(os.path.join(wd, "b.txt.bc"), "w") as f:
            f.write("scale=40\npi = 4 * a(1)\npi\ns(1) + c(1)\nsqrt(2) ^ 2\nquit\n")
        subprocess.run(["tar", "czf", os.path.join(wd, "d.tgz"), "-C", wd, "d"], check=True)
        subprocess.run(["gzip", "-k", os.path.join(wd, "a.txt")], check=True)

    py = which("/usr/bin/python3", "python3")
    c = lambda name, prog, *args, **kw: Case(name, which(prog) and [which(prog)] + list(args), setup=tree, **kw)
    return [
        c("tar xzf", "tar", "xzf", "@WD@/d.tgz", images=("gzip",)),
        c("tar cf", "tar", "cf", "out.tar", "-C", "@WD@", "d"),
        c("gzip -c", "gzip", "-c", "@WD@/b.txt"),
        c("gzip -dc", "gzip", "-dc", "@WD@/a.txt.gz"),
        c("bzip2 -c", "bzip2", "-c", "@WD@/b.txt"),
        c("xz -c", "xz", "-c", "@WD@/b.txt"),
        c("zstd -c", "zstd", "-q", "-c", "@WD@/b.txt"),
        c("bash script", "bash", "@WD@/s.sh"),
        c("dash -c", "dash", "-c", "for i in 1 2 3; do echo $i; done | wc -l"),
        c("ls -l", "ls", "-l", "--time-style=+", "@WD@/d"),
        c("find", "find", "@WD@/d", "-name", "*.txt", "-size", "-100k"),
        c("grep -r", "grep", "-rc", "line 3", "@WD@/d"),
        c("sed", "sed", "-e", "s/line/LINE/g", "-e", "/5/d", "@WD@/a.txt"),
        c("awk", "awk", "{ s += $1 } END { print s, NR }", "@WD@/d/f3.txt"),
        c("diff -u", "diff", "-u", "@WD@/a.txt", "@WD@/b.txt"),
        c("patch", "patch", "-o", "patched.txt", "@WD@/a.txt", "@WD@/ab.diff"),
        c("sort | uniq (uniq -c)", "uniq", "-c", "@WD@/d/sub/g.txt"),
        c("wc", "wc", "@WD@/d/f1.txt", "@WD@/d/f2.txt"),
        c("sha256sum", "sha256sum", "@WD@/a.txt", "@WD@/b.txt"),
        c("od", "od", "-An", "-tx1", "-N", "256", "@WD@/a.txt"),
        c("cut", "cut", "-d", " ", "-f", "2,3", "@WD@/d/f2.txt"),
        c("g++ -c (cc1plus, as)", "g++", "-O1", "-c", "@WD@/small.cc", "-o", "small.o", images=("cc1plus", "as")),
        c("gcc link (collect2, ld)", "gcc", "-O1", "@WD@/small.c", "-o", "small", images=("collect2", "ld")),
        c("cpp", "cpp", "@WD@/small.c"),
        c("sqlite3", "sqlite3", ":memory:", ".read @WD@/q.sql"),
        c("objdump -d", "objdump", "-d", "/bin/true"),
        c("readelf -a", "readelf", "-a", "/bin/true"),
        c("nm -D", "nm", "-D", "/bin/true"),
        c("jq", "jq", "-c", "[.items[] | select(.id % 50 == 0) | {id, n: (.tags | length)}]", "@WD@/j.json"),
        c("bc", "bc", "-l", "@WD@/b.txt.bc"),
        c("file", "file", "/bin/true", "@WD@/d.tgz", "@WD@/a.txt"),
        c("openssl dgst", "openssl", "dgst", "-sha256", "@WD@/a.txt"),
        # its libraries' destructors (GnuTLS, p11-kit, ...) free 694 blocks after the preload's finalization
        c("curl file://", "curl", "-s", "-o", "out.txt", "file://@WD@/a.txt"),
        Case("python3 script", py and [py, "@WD@/s.py", "@WD@/a.txt"], setup=tree),
        c("perl script", "perl", "@WD@/s.pl", "@WD@/d/f1.txt"),
        c("git diff --no-index", "git", "diff", "--no-index", "--stat", "@WD@/a.txt", "@WD@/b.txt"),
    ]


def run(argv, cwd, env, timeout=TIMEOUT):
    r = itest.run(argv, timeout, env=env, cwd=cwd)
    return r.status, r.stdout, r.stderr, r.timed_out


def one(case, tagalloc, tmp):
    res = {"name": case.name, "status": None, "problems": [], "procs": [], "secs": (0, 0)}
    if not case.argv:
        res["status"] = "SKIP"
        res["problems"].append("not installed")
        return res
    wd = tempfile.mkdtemp(prefix="real.", dir=tmp)
    if case.setup:
        try:
            case.setup(wd)
        except Exception as e:
            res["status"] = "SKIP"
            res["problems"].append(f"setup failed: {e}")
            return res
    argv = [a.replace("@WD@", wd) for a in case.argv]
    env = dict(os.environ, LC_ALL="C", PYTHONHASHSEED="0", HOME=wd, GIT_CONFIG_NOSYSTEM="1")
    for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):   # an outer make (make -j2 test) is not the case's
        env.pop(k, None)
    bare_dir = os.path.join(wd, "bare")
    aud_dir = os.path.join(wd, "audited")
    os.makedirs(bare_dir)
    os.makedirs(aud_dir)
    t0 = time.time()
    bst, bout, berr, bto = run(argv, bare_dir, env)
    t1 = time.time()
    jf = os.path.join(wd, "report.json")
    ast, aout, aerr, ato = run([tagalloc, "run", "--json", jf, "--"] + argv, aud_dir, env)
    t2 = time.time()
    res["secs"] = (t1 - t0, t2 - t1)
    p = res["problems"]
    if bto:
        p.append(f"the bare run timed out after {TIMEOUT}s")
    if ato:
        p.append(f"the audited run timed out after {TIMEOUT}s")
    if bst != ast:
        p.append(f"exit status {ast} under tagalloc, {bst} bare" + tail(aerr))
    if bout != aout:
        p.append(f"stdout differs: {aout[:200]!r} under tagalloc vs {bout[:200]!r} bare")
    for o in case.outputs:
        a, b = os.path.join(aud_dir, o), os.path.join(bare_dir, o)
        if not (os.path.exists(a) and os.path.exists(b) and filecmp.cmp(a, b, shallow=False)):
            p.append(f"output file {o} differs or is missing")
    try:
        with open(jf) as f:
            doc = json.load(f)
        procs = doc.get("processes")
        if not isinstance(procs, list) or not procs:
            p.append("JSON has no processes")
            procs = []
    except (OSError, ValueError) as e:
        p.append(f"JSON: {e}" + tail(aerr))
        procs = []
    names = [os.path.basename(str((pr.get("argv") or [""])[0])) for pr in procs]
    for img in case.images:
        if img not in names:
            p.append(f"no process entry for the exec'd image {img!r} (entries: {names})")
    for img, want in case.expect.items():
        entries = [pr for pr in procs if os.path.basename(str((pr.get("argv") or [""])[0])) == img]
        for pr in entries:
            s = pr.get("summary") or {}
            got = tuple(((s.get(k) or {}).get("bytes"), (s.get(k) or {}).get("blocks"))
                        for k in ("direct", "indirect", "possible"))
            if got != want:
                p.append(f"{img}: definitely, indirectly, possibly lost {got}, expected {want} (memcheck's)")
        if not entries:
            p.append(f"no process entry for {img!r}")
    for pr in procs:
        if not pr.get("argv"):
            p.append(f"process {pr.get('pid')} (ppid {pr.get('ppid')}) has no argv: its command is not labelled")
    for pr in procs:
        s = pr.get("summary") or {}
        row = {"pid": pr.get("pid"), "ppid": pr.get("ppid"),
               "argv0": os.path.basename(str((pr.get("argv") or ["(no argv)"])[0])),
               "exit": pr.get("exit_code") if pr.get("signal") in (None, 0) else f"sig {pr.get('signal')}"}
        for k in ("direct", "indirect", "possible", "reachable"):
            v = s.get(k) or {}
            row[k] = (v.get("bytes"), v.get("blocks"))
        errs = [f for f in pr.get("findings") or [] if not str(f.get("kind", "")).startswith("leak.")]
        row["errors"] = sum(int(f.get("blocks") or 1) for f in errs)
        row["error_kinds"] = sorted({f.get("kind") for f in errs})
        top = [f for f in pr.get("findings") or [] if f.get("kind") == "leak.direct"]
        top.sort(key=lambda f: -int(f.get("bytes") or 0))
        row["top"] = ""
        if top:
            st = top[0].get("stack") or [{}]
            fr = st[0] if st and isinstance(st[0], dict) else {}
            where = fr.get("function") or \
                f"{os.path.basename(str(fr.get('module') or '?'))}+{fr.get('address') or '?'} (no symbol)"
            row["top"] = f"{top[0].get('bytes')} B in {top[0].get('blocks')} from {where}"
        res["procs"].append(row)
    res["status"] = "FAIL" if p else "PASS"
    if not os.environ.get("ITEST_KEEP"):
        shutil.rmtree(wd, ignore_errors=True)
    return res


def tail(err, n=8):
    t = err.decode(errors="replace").strip().splitlines()[-n:]
    return ("\n      stderr: " + "\n      ".join(t)) if t else ""


def fmt(v):
    b, n = v
    if b is None:
        return "-"
    return f"{b}/{n}"


def main(argv):
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("ITEST_JOBS", os.cpu_count() or 2)))
    ap.add_argument("names", nargs="*")
    a = ap.parse_intermixed_args(argv)
    build = os.path.abspath(a.build_dir)
    tagalloc = os.path.join(build, "tagalloc")
    preload = os.path.join(build, "libtagalloc-preload.so")
    missing = [x for x in (tagalloc, preload) if not os.path.exists(x)]
    if missing:
        print(f"FAIL real programs: {', '.join(missing)} not built")
        print("0 passed, 1 failed, 0 skipped")
        return 1
    os.makedirs(os.path.join(build, "itest"), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="real.", dir=os.path.join(build, "itest"))
    cs = [c for c in cases(tmp) if not a.names or any(n in c.name for n in a.names)]
    t0 = time.time()
    results = []
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as ex:
        for r in ex.map(lambda c: one(c, tagalloc, tmp), cs):
            results.append(r)
            if r["status"] == "SKIP":
                print(f"SKIP {r['name']}: {'; '.join(r['problems'])}", flush=True)
            elif r["status"] == "PASS":
                b, t = r["secs"]
                print(f"PASS {r['name']} (bare {b:.2f}s, tagalloc {t:.2f}s)", flush=True)
            else:
                print(f"FAIL {r['name']}\n" + "\n".join("    " + x for x in r["problems"]), flush=True)
    # what each leaks
    print()
    print("What each process leaks (bytes/blocks; definitely, indirectly, possibly lost, still reachable):")
    hdr = f"{'program':<18} {'pid':>7} {'image':<12} {'exit':>5} {'definitely':>14} {'indirectly':>12} {'possibly':>12} {'reachable':>14} {'errors':>6}  largest direct leak"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        for row in r["procs"]:
            print(f"{r['name'][:18]:<18} {str(row['pid']):>7} {row['argv0'][:12]:<12} {str(row['exit']):>5} "
                  f"{fmt(row['direct']):>14} {fmt(row['indirect']):>12} {fmt(row['possible']):>12} "
                  f"{fmt(row['reachable']):>14} {row['errors']:>6}  {row['top']}"
                  + (f" [{', '.join(row['error_kinds'])}]" if row["error_kinds"] else ""))
    shutil.rmtree(tmp, ignore_errors=True)
    passed = sum(r["status"] == "PASS" for r in results)
    failed = sum(r["status"] == "FAIL" for r in results)
    skipped = sum(r["status"] == "SKIP" for r in results)
    print(f"({time.time() - t0:.1f}s)")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
