#!/usr/bin/env python3
"""The integration suite's runner (run.sh calls it).

For every tests/integration/progs/NAME.expect it builds progs/NAME.c (or .cc),
runs it bare and under `tagalloc run --json`, and compares the JSON with the
.expect file exactly; or, with --valgrind, runs it under memcheck and compares
memcheck's numbers with the same .expect file, which proves the expected
values.  The .expect format is described in tests/integration/README.md.

Usage: itest.py BUILD_DIR [--valgrind] [--jobs N] [--keep] [NAME...]
Prints one PASS/FAIL/SKIP line per check and ends with "N passed, N failed".
"""
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGS = os.path.join(HERE, "progs")
KINDS = ("direct", "indirect", "possible", "reachable")
SIGNALS = {"SIGSEGV": 11, "SIGABRT": 6, "SIGBUS": 7, "SIGFPE": 8, "SIGKILL": 9,
           "SIGTERM": 15, "SIGILL": 4, "SIGINT": 2}
RUN_TIMEOUT = 120           # seconds per program run (a hang is a failure)
VG_TIMEOUT = 300


# ---------------------------------------------------------------------------
# the .expect format

class Section:
    """The expectations for one process entry."""

    def __init__(self, selector):
        self.selector = selector          # "root", "child", "argv0=NAME"
        self.summary = {}                 # kind -> (bytes, blocks)
        self.findings = []                # (kind, {key: value}, line)
        self.valgrind_absent = None       # reason, when memcheck never sees it
        self.exit_code = None
        self.signal = None

    def want(self, kind):
        return self.summary.get(kind, (0, 0))


class Expect:
    def __init__(self, name, path):
        self.name = name
        self.path = path
        self.args = []
        self.exit = ("exit", 0)
        self.bare_differs = None
        self.processes = 1
        self.fast = True
        self.o2 = False
        self.valgrind_unsupported = None
        self.sections = []
        self.notes = []
        self.source = next((self.name + e for e in (".c", ".cc")
                            if os.path.exists(os.path.join(PROGS, self.name + e))), None)
        self.parse()

    def parse(self):
        cur = Section("root")
        self.sections.append(cur)
        used = False          # has the implicit first section any content?
        with open(self.path) as f:
            for lineno, raw in enumerate(f, 1):
                line = _strip_comment(raw)
                if not line:
                    continue
                try:
                    words = shlex.split(line)
                except ValueError as e:
                    raise SystemExit(f"{self.path}:{lineno}: {e}")
                key, rest = words[0], words[1:]
                where = f"{os.path.basename(self.path)}:{lineno}"
                if key == "args":
                    self.args = rest
                elif key == "link":
                    pass              # read by build(): links()
                elif key == "exit":
                    if rest[:1] == ["signal"]:
                        self.exit = ("signal", _signum(rest[1]))
                    else:
                        self.exit = ("exit", int(rest[0]))
                elif key == "bare-differs":
                    self.bare_differs = " ".join(rest) or "yes"
                elif key == "processes":
                    self.processes = int(rest[0])
                elif key == "no-fast":
                    self.fast = False
                elif key == "also-O2":
                    self.o2 = True
                elif key == "valgrind-unsupported":
                    self.valgrind_unsupported = " ".join(rest) or "yes"
                elif key == "process":
                    cur = Section(rest[0])
                    if used:
                        self.sections.append(cur)
                    else:
                        self.sections[0] = cur
                    used = True
                elif key == "valgrind-absent":
                    used = True
                    cur.valgrind_absent = " ".join(rest) or "yes"
                elif key in KINDS:
                    used = True
                    cur.summary[key] = (int(rest[0]), int(rest[1]))
                elif key == "exit_code":
                    used = True
                    cur.exit_code = int(rest[0])
                elif key == "signal":
                    used = True
                    cur.signal = _signum(rest[0])
                elif key == "finding":
                    used = True
                    kind = rest[0]
                    opts = {}
                    for w in rest[1:]:
                        if "=" not in w:
                            raise SystemExit(f"{where}: bad finding option {w!r}")
                        k, v = w.split("=", 1)
                        opts[k] = v
                    cur.findings.append((kind, opts, where))
                else:
                    raise SystemExit(f"{where}: unknown line {line!r}")


def _strip_comment(raw):
    # a comment starts with '#' at the start of a line or after white space
    m = re.search(r"(^|\s)#", raw)
    return (raw[:m.start()] if m else raw).strip()


def _signum(s):
    s = str(s)
    if s.isdigit():
        return int(s)
    s = s.upper()
    if not s.startswith("SIG"):
        s = "SIG" + s
    return SIGNALS[s]


# ---------------------------------------------------------------------------
# building

CFLAGS = ["-g", "-w", "-pthread"]
VARIANTS = {
    # exact unwinding must work without frame pointers
    "exact": ["-O0", "-fomit-frame-pointer"],
    # --unwind fast walks the frame-pointer chain
    "fast": ["-O0", "-fno-omit-frame-pointer"],
    # the same, optimised: for the programs whose .expect says also-O2
    "o2": ["-O2", "-fomit-frame-pointer"],
    "o2fast": ["-O2", "-fno-omit-frame-pointer"],
}
VARIANT_DIRS = {"exact": "", "fast": "fast", "o2": "o2", "o2fast": os.path.join("o2", "fast")}


def links(base):
    """The libraries progs/BASE.expect's `link` lines name: BASE is linked
    with each (-lNAME, progs/libNAME.c, found beside it at run time)."""
    out = []
    try:
        with open(os.path.join(PROGS, base + ".expect")) as f:
            for raw in f:
                words = _strip_comment(raw).split()
                if words[:1] == ["link"]:
                    out += words[1:]
    except OSError:
        pass
    return out


def build(build_dir, names_needed, o2_names=()):
    """Compiles every program into BUILD/itest/ (exact) and BUILD/itest/fast/,
    and those of o2_names (with the libraries) into BUILD/itest/o2/ and
    BUILD/itest/o2/fast/.  Returns {variant: dir}.  Up-to-date outputs are
    kept."""
    cc = os.environ.get("ITEST_CC", "cc")
    cxx = os.environ.get("ITEST_CXX", "c++")
    out = {}
    jobs = []
    for variant, extra in VARIANTS.items():
        d = os.path.join(build_dir, "itest", VARIANT_DIRS[variant]).rstrip("/")
        os.makedirs(d, exist_ok=True)
        out[variant] = d
        for src in sorted(os.listdir(PROGS)):
            base, ext = os.path.splitext(src)
            if ext not in (".c", ".cc"):
                continue
            if variant.startswith("o2") and not base.startswith("lib") and base not in o2_names:
                continue
            if base.startswith("ta_"):
                continue                  # linked with the ledger: api.py builds it
            srcp = os.path.join(PROGS, src)
            if base.startswith("lib"):
                target = os.path.join(d, base + ".so")
                cmd = [cc] + CFLAGS + extra + ["-fPIC", "-shared", "-o", target, srcp]
            elif ext == ".cc":
                target = os.path.join(d, base)
                cmd = [cxx] + CFLAGS + extra + ["-o", target, srcp]
            else:
                target = os.path.join(d, base)
                cmd = [cc] + CFLAGS + extra + ["-std=gnu11", "-o", target, srcp, "-ldl"]
                for lib in links(base):
                    cmd += [f"-L{d}", f"-l{lib}", f"-Wl,-rpath,{d}"]
            headers = [os.path.join(PROGS, h) for h in os.listdir(PROGS) if h.endswith(".h")]
            linked = [os.path.join(PROGS, base + ".expect")] if links(base) else []
            if _up_to_date(target, [srcp, __file__] + headers + linked):
                continue
            jobs.append((target, cmd))
    if jobs:
        # the libraries first: a program may link with one
        results = []
        for batch in ([j for j in jobs if j[0].endswith(".so")], [j for j in jobs if not j[0].endswith(".so")]):
            with concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
                results += list(ex.map(lambda j: (j, subprocess.run(
                    j[1], capture_output=True, text=True)), batch))
        bad = [(j, r) for j, r in results if r.returncode != 0]
        for (target, cmd), r in bad:
            print(f"BUILD FAILED {target}: {' '.join(cmd)}\n{r.stderr}", flush=True)
        if bad:
            raise SystemExit(1)
    return out


def _up_to_date(target, deps):
    try:
        t = os.stat(target).st_mtime
    except FileNotFoundError:
        return False
    return all(os.stat(p).st_mtime <= t for p in deps)


# ---------------------------------------------------------------------------
# running

class Run:
    def __init__(self, status, stdout, stderr, timed_out=False):
        self.status = status      # shell-style: 128+N for a signal
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out


def run(cmd, timeout, env=None, cwd=None):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)   # our own process group only
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        timed_out = True
    rc = p.returncode
    status = 128 - rc if rc < 0 else rc
    return Run(status, out, err, timed_out)


def status_text(st):
    return f"signal {st - 128}" if st > 128 else f"exit {st}"


def want_status(exp):
    kind, n = exp.exit
    return 128 + n if kind == "signal" else n


def program_cmd(exp, d):
    args = [a.replace("@ITEST@", d) for a in exp.args]
    return [os.path.join(d, exp.name)] + args


# ---------------------------------------------------------------------------
# reading tagalloc's JSON

def fn_matches(fn, want):
    """Function names: exact, or equal once the parameter list of a demangled
    C++ name is dropped ("net::build_packet(int)" matches net::build_packet)."""
    if fn is None:
        return want in ("?", "??", "???")
    if fn == want:
        return True
    return _strip_params(fn) == _strip_params(want)


def _strip_params(fn):
    s = fn.strip()
    for suffix in (" const", " volatile", " &&", " &"):
        if s.endswith(suffix):
            s = s[: -len(suffix)]
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                head = s[:i]
                # "operator()" keeps its own parentheses
                return head if not head.endswith("operator") else s
    return s


CXX_ALLOC_FRAMES = re.compile(r"^(operator new|operator delete)")


def first_frame(stack):
    """The first frame the .expect names: the program's own frame.  Leading
    C++ allocator frames (operator new/delete, which LSan shows as #0 too)
    are skipped; they are reported in the details."""
    skipped = []
    for fr in stack or []:
        f = fr.get("function") if isinstance(fr, dict) else None
        if f and CXX_ALLOC_FRAMES.match(f):
            skipped.append(f)
            continue
        return fr, skipped
    return None, skipped


def frame_fn(fr):
    return fr.get("function") if isinstance(fr, dict) else None


def select_processes(procs, exp):
    """Maps each .expect section to a JSON process entry (or None)."""
    pids = {p.get("pid") for p in procs}
    roots = [p for p in procs if p.get("ppid") not in pids]
    root_pid = roots[0].get("pid") if roots else None
    out = []
    used = set()
    for sec in exp.sections:
        cands = []
        if sec.selector == "root":
            same = [p for p in procs if p.get("pid") == root_pid]
            named = [p for p in same if _argv0(p) == exp.name]
            cands = named or same
        elif sec.selector.startswith("child"):
            cands = [p for p in procs if p.get("pid") != root_pid]
        elif sec.selector.startswith("argv0="):
            want = sec.selector.split("=", 1)[1]
            cands = [p for p in procs if _argv0(p) == want]
        cands = [p for p in cands if id(p) not in used]
        pick = cands[0] if cands else None
        if pick is not None:
            used.add(id(pick))
        out.append(pick)
    return out


def _argv0(p):
    argv = p.get("argv") or [""]
    return os.path.basename(str(argv[0]))


def check_json(exp, doc, problems, fast=False):
    if not isinstance(doc, dict) or doc.get("tool") != "tagalloc":
        problems.append(f"JSON: \"tool\" is {doc.get('tool') if isinstance(doc, dict) else None!r}, not \"tagalloc\"")
    if isinstance(doc, dict) and "version" not in doc:
        problems.append("JSON: no \"version\"")
    procs = doc.get("processes") if isinstance(doc, dict) else None
    if not isinstance(procs, list):
        problems.append("JSON: no \"processes\" list")
        return
    if len(procs) != exp.processes:
        desc = ", ".join(f"pid {p.get('pid')} ppid {p.get('ppid')} {_argv0(p)}" for p in procs)
        problems.append(f"processes: {len(procs)} entries, expected {exp.processes} ({desc})")
    for sec, proc in zip(exp.sections, select_processes(procs, exp)):
        label = f"[{sec.selector}]"
        if proc is None:
            problems.append(f"{label}: no process entry matches")
            continue
        summ = proc.get("summary") or {}
        for kind in KINDS:
            got = summ.get(kind) or {}
            g = (got.get("bytes"), got.get("blocks"))
            w = sec.want(kind)
            if g != w:
                problems.append(f"{label} {kind}: got {g[0]} bytes in {g[1]} blocks, expected {w[0]} in {w[1]}")
        if sec.exit_code is not None and proc.get("exit_code") != sec.exit_code:
            problems.append(f"{label} exit_code: {proc.get('exit_code')!r}, expected {sec.exit_code}")
        if sec.signal is not None:
            s = proc.get("signal")
            try:
                s = _signum(s) if s is not None else None
            except KeyError:
                pass
            if s != sec.signal:
                problems.append(f"{label} signal: {proc.get('signal')!r}, expected {sec.signal}")
            if proc.get("clean_exit") is not False:
                problems.append(f"{label} clean_exit: {proc.get('clean_exit')!r}, expected false (killed by a signal)")
        findings = proc.get("findings") or []
        check_findings(sec, findings, problems, label, exp.source)


def check_findings(sec, findings, problems, label, default_file=None):
    # The preload's own frames must never come first.
    for f in findings:
        st = f.get("stack") or []
        if st and isinstance(st[0], dict) and "tagalloc" in str(st[0].get("module") or ""):
            problems.append(f"{label} {f.get('kind')}: first frame is the preload's own "
                            f"({st[0].get('function')} in {st[0].get('module')})")
            break
    # Leak findings add up to the summary (fewer than 100 groups per kind here).
    for kind in ("direct", "indirect", "possible"):
        fk = "leak." + kind
        groups = [f for f in findings if f.get("kind") == fk]
        if 0 < len(groups) < 100:
            b = sum(int(f.get("bytes") or 0) for f in groups)
            n = sum(int(f.get("blocks") or 0) for f in groups)
            if (b, n) != sec.want(kind):
                problems.append(f"{label} {fk} findings add up to {b} bytes in {n} blocks, "
                                f"expected {sec.want(kind)[0]} in {sec.want(kind)[1]}")
    # Errors: exactly the kinds the .expect names.
    want_err = {k for k, _, _ in sec.findings if not k.startswith("leak.")}
    got_err = {f.get("kind") for f in findings if not str(f.get("kind", "")).startswith("leak.")}
    for k in sorted(got_err - want_err):
        ex = next(f for f in findings if f.get("kind") == k)
        problems.append(f"{label} unexpected finding {k} at {_stack_str(ex.get('stack'))}")
    for kind, opts, where in sec.findings:
        o = dict(opts)
        # the first frame is in the program's own source, with a line number
        if "function" in o and "file" not in o and default_file:
            o["file"] = default_file
        if o.get("file") == "*":
            o.pop("file")
        check_one_finding(kind, o, findings, problems, label)


def _stack_str(stack, n=4):
    parts = []
    for fr in (stack or [])[:n]:
        if isinstance(fr, dict):
            parts.append(f"{fr.get('function') or '?'}")
    return " < ".join(parts) or "(no stack)"


def check_one_finding(kind, opts, findings, problems, label):
    fn = opts.get("function")
    within = opts.get("in")
    matched = []
    notes = []
    for f in findings:
        if f.get("kind") != kind:
            continue
        fr, skipped = first_frame(f.get("stack"))
        if fn is not None and not (fr is not None and fn_matches(frame_fn(fr), fn)):
            continue
        if within is not None and not any(fn_matches(frame_fn(x), within) for x in f.get("stack") or []):
            continue
        matched.append((f, fr))
        if skipped:
            notes.append(skipped)
    what = f"{label} {kind}" + (f" function={fn}" if fn else "") + (f" in={within}" if within else "")
    if fn == "*":
        # memcheck cannot name it: the group with these numbers, any function
        matched = [(f, None) for f in findings if f.get("kind") == kind
                   and all(str(f.get(k)) == opts[k] for k in ("bytes", "blocks") if k in opts)]
        if not matched:
            problems.append(f"{what}: no group of {opts.get('bytes')} bytes in {opts.get('blocks')} blocks")
        return
    if not matched:
        same = [f for f in findings if f.get("kind") == kind]
        seen = "; ".join(_stack_str(f.get("stack")) for f in same[:5]) or "none of that kind"
        problems.append(f"{what}: no such finding (first frames seen: {seen})")
        return
    if kind.startswith("leak."):
        b = sum(int(f.get("bytes") or 0) for f, _ in matched)
        n = sum(int(f.get("blocks") or 0) for f, _ in matched)
    else:
        b = matched[0][0].get("bytes")
        n = sum(int(f.get("blocks") or 0) for f, _ in matched)
    if "bytes" in opts and str(b) != opts["bytes"]:
        problems.append(f"{what}: {b} bytes, expected {opts['bytes']}")
    if "blocks" in opts and str(n) != opts["blocks"]:
        problems.append(f"{what}: {n} blocks, expected {opts['blocks']}")
    f0, fr0 = matched[0]
    if "file" in opts:
        got = os.path.basename(str((fr0 or {}).get("file") or ""))
        line = (fr0 or {}).get("line")
        if got != opts["file"]:
            problems.append(f"{what}: file {got!r}, expected {opts['file']!r}")
        elif not (isinstance(line, int) and line > 0):
            problems.append(f"{what}: no line number in {got} ({line!r})")
    if "module" in opts:
        got = os.path.basename(str((fr0 or {}).get("module") or ""))
        if got != opts["module"]:
            problems.append(f"{what}: module {got!r}, expected {opts['module']!r}")
    for key, field in (("alloc", "alloc_stack"), ("free", "free_stack")):
        if key in opts:
            fr, _ = first_frame(f0.get(field))
            if not (fr is not None and fn_matches(frame_fn(fr), opts[key])):
                problems.append(f"{what}: {field} starts at {_stack_str(f0.get(field))}, expected {opts[key]}")


# ---------------------------------------------------------------------------
# reading memcheck's logs

VG_ALLOC_FNS = re.compile(
    r"^(malloc|calloc|realloc|reallocarray|free|memalign|posix_memalign|aligned_alloc|valloc|"
    r"pvalloc|operator new|operator delete|__builtin_new|__builtin_vec_new)(\(|\s|$)")
VG_SUMMARY = {
    "definitely lost": "direct", "indirectly lost": "indirect",
    "possibly lost": "possible", "still reachable": "reachable",
}


def _num(s):
    return int(s.replace(",", ""))


def parse_vg_log(path):
    """One memcheck log: command, parent pid, summary, loss records, errors.
    A log rewritten by an exec keeps only the last image's part."""
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    # keep from the last "Command:" on (an exec starts a new header)
    starts = [i for i, l in enumerate(lines) if re.match(r"==\d+== Command: ", l)]
    if starts:
        s = starts[-1]
        while s > 0 and not re.match(r"==\d+== Memcheck, ", lines[s]):
            s -= 1
        lines = lines[s:]
    body = [re.sub(r"^==\d+== ?", "", l) for l in lines if re.match(r"==\d+==", l)]
    log = {"command": None, "ppid": None, "summary": {k: (0, 0) for k in KINDS},
           "records": [], "errors": [], "path": path}
    for l in body:
        m = re.match(r"Command: (.*)", l)
        if m:
            log["command"] = m.group(1)
        m = re.match(r"Parent PID: (\d+)", l)
        if m:
            log["ppid"] = int(m.group(1))
        m = re.match(r"\s*(definitely lost|indirectly lost|possibly lost|still reachable): "
                     r"([\d,]+) bytes in ([\d,]+) blocks", l)
        if m:
            log["summary"][VG_SUMMARY[m.group(1)]] = (_num(m.group(2)), _num(m.group(3)))
    # blocks of text separated by empty lines
    blocks, cur = [], []
    for l in body:
        if l.strip() == "":
            if cur:
                blocks.append(cur)
            cur = []
        else:
            cur.append(l)
    if cur:
        blocks.append(cur)
    for b in blocks:
        m = re.match(r"([\d,]+)(?: \(([\d,]+) direct, ([\d,]+) indirect\))? bytes in ([\d,]+) blocks are "
                     r"(definitely lost|indirectly lost|possibly lost|still reachable) in loss record", b[0])
        if m:
            own = _num(m.group(2)) if m.group(2) else _num(m.group(1))
            log["records"].append({"kind": "leak." + VG_SUMMARY[m.group(5)], "bytes": own,
                                   "blocks": _num(m.group(4)), "stack": _vg_frames(b[1:])})
            continue
        if b[0].startswith("Invalid free()") or b[0].startswith("Invalid write") \
                or b[0].startswith("Invalid read") or b[0].startswith("Mismatched free"):
            err = {"head": b[0], "stack": [], "free_stack": [], "alloc_stack": [], "addr": ""}
            part = "stack"
            for l in b[1:]:
                if re.match(r"\s*Address 0x", l):
                    err["addr"] = l.strip()
                    part = None
                elif re.match(r"\s*Block was alloc'd at", l):
                    part = "alloc_stack"
                elif part and re.match(r"\s*(at|by) 0x", l):
                    err[part].append(l)
                elif part is None and re.match(r"\s*(at|by) 0x", l):
                    # "... free'd" is followed by the free's stack, "... alloc'd"
                    # (past a live block's end) by the allocation's
                    part = "alloc_stack" if err["addr"].endswith("alloc'd") else "free_stack"
                    err[part].append(l)
            for k in ("stack", "free_stack", "alloc_stack"):
                err[k] = _vg_frames(err[k])
            log["errors"].append(err)
    return log


def _vg_frames(lines):
    out = []
    for l in lines:
        m = re.match(r"\s*(?:at|by) 0x[0-9A-Fa-f]+: (.*?)(?: \((?:in )?([^()]*)\))?$", l)
        if not m:
            continue
        fn = m.group(1)
        where = m.group(2) or ""
        if "vgpreload" in where or "vg_replace_malloc" in where:
            continue
        fr = {"function": fn, "where": where}
        m2 = re.match(r"(.*):(\d+)$", where)
        if m2 and not l.rstrip().endswith("(in " + where + ")"):
            fr["file"], fr["line"] = m2.group(1), int(m2.group(2))
        out.append(fr)
    # leading allocator frames (operator new shows with its file in libstdc++ builds)
    while out and VG_ALLOC_FNS.match(out[0]["function"] or ""):
        out.pop(0)
    return out


def classify_vg_error(err):
    head, addr = err["head"], err["addr"]
    free_block = re.search(r"inside a block of size ([\d,]+) free'd", addr)
    if head.startswith("Invalid free()"):
        if free_block:
            return "free.double", _num(free_block.group(1))
        m = re.search(r"inside a block of size ([\d,]+) alloc'd", addr)
        return "free.invalid", _num(m.group(1)) if m else 0
    if head.startswith("Invalid write") or head.startswith("Invalid read"):
        if free_block:
            return "use.after-free", _num(free_block.group(1))
        past = re.search(r"is \d+ bytes after a block of size ([\d,]+) alloc'd", addr)
        if past:
            return "heap.overflow", _num(past.group(1))
        return None, 0      # a wild access (the crash): not a heap finding
    return None, 0


def vg_findings(log):
    """memcheck's records and errors in the JSON findings' shape."""
    out = []
    for r in log["records"]:
        out.append({"kind": r["kind"], "bytes": r["bytes"], "blocks": r["blocks"], "stack": r["stack"]})
    for e in log["errors"]:
        kind, size = classify_vg_error(e)
        if kind:
            out.append({"kind": kind, "bytes": size, "blocks": 1, "stack": e["stack"],
                        "alloc_stack": e["alloc_stack"], "free_stack": e["free_stack"]})
    return out


def check_valgrind(exp, logs, problems):
    wanted = [s for s in exp.sections if not s.valgrind_absent]
    if len(logs) != len(wanted):
        problems.append(f"memcheck logs: {len(logs)}, expected {len(wanted)} processes")
    pids = {l["pid"] for l in logs}
    root = next((l for l in logs if l["ppid"] not in pids), logs[0] if logs else None)
    used = set()
    for sec in wanted:
        label = f"[{sec.selector}]"
        cands = []
        for l in logs:
            cmd0 = os.path.basename((l["command"] or "").split(" ")[0])
            if sec.selector == "root":
                ok = l is root
            elif sec.selector.startswith("child"):
                ok = l is not root
            else:
                ok = cmd0 == sec.selector.split("=", 1)[1]
            if ok and id(l) not in used:
                cands.append(l)
        if not cands:
            problems.append(f"{label}: no memcheck log matches")
            continue
        log = cands[0]
        used.add(id(log))
        for kind in KINDS:
            g, w = log["summary"][kind], sec.want(kind)
            if g != w:
                problems.append(f"{label} {kind}: memcheck says {g[0]} bytes in {g[1]} blocks, .expect {w[0]} in {w[1]}")
        findings = vg_findings(log)
        want_err = {k for k, _, _ in sec.findings if not k.startswith("leak.")}
        for f in findings:
            if not f["kind"].startswith("leak.") and f["kind"] not in want_err:
                problems.append(f"{label} memcheck reports {f['kind']} at {_stack_str(f['stack'])}")
                want_err.add(f["kind"])
        for kind, opts, where in sec.findings:
            if kind == "leak.growth":
                continue                      # from the trace's marks: memcheck has no such kind
            o = dict(opts)
            for k in list(o):
                if k.startswith("vg-"):
                    o[k[3:]] = o.pop(k)
            for k in [k for k, v in o.items() if v == "-"]:
                o.pop(k)                      # vg-OPT=-: memcheck has no such fact
            o.pop("module", None)             # memcheck's frames do not name it
            if "function" in o and "file" not in o and exp.source:
                o["file"] = exp.source
            if o.get("file") == "*":
                o.pop("file")
            check_one_finding(kind, o, findings, problems, label)


# ---------------------------------------------------------------------------
# one program

class Result:
    def __init__(self, name, mode):
        self.name = name
        self.mode = mode
        self.problems = []
        self.skipped = None
        self.info = ""
        self.secs = 0.0

    def line(self):
        tag = f"{self.name}" + (f" [{self.mode}]" if self.mode else "")
        if self.skipped:
            return f"SKIP {tag}: {self.skipped}"
        if self.problems:
            return f"FAIL {tag}\n" + "\n".join("    " + p for p in self.problems)
        return f"PASS {tag}{self.info} ({self.secs:.1f}s)"


def bare_run(exp, dirs, cache, variant="exact"):
    key = (exp.name, variant)
    if key not in cache:
        cache[key] = run(program_cmd(exp, dirs[variant]), RUN_TIMEOUT)
    return cache[key]


def compare_with_bare(exp, bare, r, res, who):
    want = want_status(exp)
    if r.timed_out:
        res.problems.append(f"{who} timed out after {RUN_TIMEOUT}s")
        return
    if r.status != want:
        res.problems.append(f"{who} status: {status_text(r.status)}, expected {status_text(want)}"
                            + _stderr_tail(r))
    if exp.bare_differs:
        return
    if bare.status != want:
        res.problems.append(f"bare run status: {status_text(bare.status)}, expected {status_text(want)} (the .expect is wrong?)")
    if r.stdout != bare.stdout:
        res.problems.append(f"stdout differs from the bare run: {r.stdout[:300]!r} vs {bare.stdout[:300]!r}")


def _stderr_tail(r, n=15):
    tail = r.stderr.decode(errors="replace").strip().splitlines()[-n:]
    return ("\n      stderr: " + "\n      ".join(tail)) if tail else ""


def check_tagalloc(exp, tagalloc, dirs, variant, extra_args, bare, tmp, mode_label):
    res = Result(exp.name, mode_label)
    t0 = time.time()
    jf = os.path.join(tmp, f"{exp.name}.{variant}.json")
    cmd = [tagalloc, "run", "--json", jf] + extra_args + ["--"] + program_cmd(exp, dirs[variant])
    r = run(cmd, RUN_TIMEOUT)
    res.secs = time.time() - t0
    compare_with_bare(exp, bare, r, res, "tagalloc run")
    try:
        with open(jf) as f:
            doc = json.load(f)
    except FileNotFoundError:
        res.problems.append("no JSON file written" + _stderr_tail(r))
        return res
    except ValueError as e:
        res.problems.append(f"JSON does not parse: {e}")
        return res
    check_json(exp, doc, res.problems)
    # a process killed by a signal: its text report says so
    if exp.exit and exp.exit[0] == "signal":
        name = signal.Signals(exp.exit[1]).name
        want = f"the process was killed by signal {exp.exit[1]} ({name})"
        if want.encode() not in r.stderr:
            res.problems.append(f"the text report does not say {want!r}" + _stderr_tail(r))
    if res.problems and os.environ.get("ITEST_VERBOSE"):
        res.problems.append("stderr:" + _stderr_tail(r, 60))
    return res


def check_memcheck(exp, dirs, bare, tmp, variant="exact"):
    res = Result(exp.name, "memcheck" + (" -O2" if variant == "o2" else ""))
    if exp.valgrind_unsupported:
        res.skipped = exp.valgrind_unsupported
        return res
    t0 = time.time()
    logdir = tempfile.mkdtemp(prefix=exp.name + ".", dir=tmp)
    cmd = ["valgrind", "--trace-children=yes", "--leak-check=full", "--show-leak-kinds=all",
           # keeps memcheck's heap above 4 GiB, where no integer in memory can
           # pass for an interior pointer (see progs/big_leak.c)
           "--aspace-minaddr=0x100000000",
           f"--log-file={logdir}/vg.%p"] + program_cmd(exp, dirs[variant])
    r = run(cmd, VG_TIMEOUT)
    res.secs = time.time() - t0
    compare_with_bare(exp, bare, r, res, "memcheck")
    logs = []
    for fn in sorted(os.listdir(logdir)):
        log = parse_vg_log(os.path.join(logdir, fn))
        log["pid"] = int(fn.split(".")[-1])
        logs.append(log)
    check_valgrind(exp, logs, res.problems)
    return res


# ---------------------------------------------------------------------------

def load_expects(names):
    out = []
    for fn in sorted(os.listdir(PROGS)):
        if fn.endswith(".expect"):
            name = fn[:-7]
            if names and name not in names:
                continue
            out.append(Expect(name, os.path.join(PROGS, fn)))
    return out


def main(argv):
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--valgrind", action="store_true")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("ITEST_JOBS", os.cpu_count() or 2)))
    ap.add_argument("--keep", action="store_true", help="keep the JSON files and logs")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("names", nargs="*")
    a = ap.parse_intermixed_args(argv)
    build_dir = os.path.abspath(a.build_dir)
    exps = load_expects(set(a.names))
    dirs = build(build_dir, [e.name for e in exps], {e.name for e in exps if e.o2})
    if a.build_only:
        return 0
    tmp = tempfile.mkdtemp(prefix="itest.", dir=os.path.join(build_dir, "itest"))
    cache = {}
    results = []
    t0 = time.time()
    if a.valgrind:
        if not shutil.which("valgrind"):
            print("SKIP memcheck: valgrind is not installed")
            print("0 passed, 0 failed")
            return 0
        tasks = [(e.name, lambda e=e: check_memcheck(e, dirs, bare_run(e, dirs, cache), tmp)) for e in exps]
        tasks += [(e.name, lambda e=e: check_memcheck(e, dirs, bare_run(e, dirs, cache, "o2"), tmp, "o2"))
                  for e in exps if e.o2]
    else:
        tagalloc = os.path.join(build_dir, "tagalloc")
        preload = os.path.join(build_dir, "libtagalloc-preload.so")
        missing = [p for p in (tagalloc, preload) if not os.path.exists(p)]
        if missing:
            print(f"FAIL integration: {', '.join(missing)} not built")
            print("0 passed, 1 failed")
            return 1
        tasks = []
        for e in exps:
            tasks.append((e.name, lambda e=e: check_tagalloc(e, tagalloc, dirs, "exact", [],
                                                         bare_run(e, dirs, cache), tmp, "")))
            if e.fast:
                tasks.append((e.name, lambda e=e: check_tagalloc(e, tagalloc, dirs, "fast", ["--unwind", "fast"],
                                                             bare_run(e, dirs, cache), tmp, "fast")))
            if e.o2:
                tasks.append((e.name, lambda e=e: check_tagalloc(e, tagalloc, dirs, "o2", [],
                                                             bare_run(e, dirs, cache, "o2"), tmp, "-O2")))
                if e.fast:
                    tasks.append((e.name, lambda e=e: check_tagalloc(
                        e, tagalloc, dirs, "o2fast", ["--unwind", "fast"],
                        bare_run(e, dirs, cache, "o2"), tmp, "-O2 fast")))
        tasks += cli_tasks(exps, tagalloc, dirs, cache, tmp)
        if not a.names or "ta_api" in a.names:
            from api import api_tasks
            tasks += api_tasks(Result, run, tagalloc, build_dir, tmp, RUN_TIMEOUT)
        if not a.names or "term_wait" in a.names:
            from signals import signal_tasks
            tasks += signal_tasks(Result, tagalloc, os.path.join(dirs["exact"], "term_wait"), tmp)
    # the bare runs first (the checks compare with them), then the checks
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as ex:
        list(ex.map(lambda e: bare_run(e, dirs, cache), exps))
        list(ex.map(lambda e: bare_run(e, dirs, cache, "o2"), [e for e in exps if e.o2]))
        futs = [(name, ex.submit(fn)) for name, fn in tasks]
        for name, fut in futs:
            try:
                r = fut.result()
            except Exception as exc:   # a bug in the checker is a failure, not a crash
                import traceback
                r = Result(name, "")
                r.problems.append(f"checker error: {exc!r}\n" + traceback.format_exc())
            results.append(r)
            print(r.line(), flush=True)
    passed = sum(1 for r in results if not r.problems and not r.skipped)
    failed = sum(1 for r in results if r.problems)
    skipped = sum(1 for r in results if r.skipped)
    if not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"(JSON files and logs kept in {tmp})")
    print(f"({time.time() - t0:.1f}s)")
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# the CLI's options that the .expect files do not cover

def cli_tasks(exps, tagalloc, dirs, cache, tmp):
    by = {e.name: e for e in exps}
    tasks = []

    def errexit(name, want):
        def t():
            e = by[name]
            res = Result(name, "--error-exitcode 42")
            t0 = time.time()
            jf = os.path.join(tmp, f"{name}.errexit.json")
            r = run([tagalloc, "run", "--error-exitcode", "42", "--json", jf, "--"]
                    + program_cmd(e, dirs["exact"]), RUN_TIMEOUT)
            res.secs = time.time() - t0
            if r.status != want:
                res.problems.append(f"status {status_text(r.status)}, expected {status_text(want)}"
                                    + _stderr_tail(r))
            if r.stdout != bare_run(e, dirs, cache).stdout:
                res.problems.append("stdout differs from the bare run")
            # the summary agrees with the exit status: errors (loss records
            # counted as memcheck's ERROR SUMMARY does) exactly when it is N
            errs = [int(m) for m in re.findall(rb"SUMMARY: tagalloc: .*?; (\d+) error\(s\)", r.stderr)]
            if b"no leaks, no errors" in r.stderr:
                errs.append(0)
            if not errs or (sum(errs) > 0) != (want == 42):
                res.problems.append(f"the SUMMARY lines say {errs} error(s), the status is {status_text(r.status)}"
                                    + _stderr_tail(r))
            return res
        return t

    if "direct_leaks" in by:
        tasks.append(("direct_leaks", errexit("direct_leaks", 42)))
    if "clean" in by:
        tasks.append(("clean", errexit("clean", 0)))
    if "interior" in by:      # possibly lost counts, as in memcheck's ERROR SUMMARY
        tasks.append(("interior", errexit("interior", 42)))
    if "exec_parent" in by:
        def nofollow():
            e = by["exec_parent"]
            res = Result("exec_parent", "--no-follow")
            t0 = time.time()
            jf = os.path.join(tmp, "exec_parent.nofollow.json")
            r = run([tagalloc, "run", "--no-follow", "--json", jf, "--"]
                    + program_cmd(e, dirs["exact"]), RUN_TIMEOUT)
            res.secs = time.time() - t0
            compare_with_bare(e, bare_run(e, dirs, cache), r, res, "tagalloc run --no-follow")
            try:
                doc = json.load(open(jf))
            except (OSError, ValueError) as exc:
                res.problems.append(f"JSON: {exc}")
                return res
            procs = doc.get("processes") or []
            names = [_argv0(p) for p in procs]
            if "exec_child" in names:
                res.problems.append(f"--no-follow still followed the exec: {names}")
            pre = [p for p in procs if _argv0(p) == "exec_parent"]
            if len(pre) != 1:
                res.problems.append(f"expected one entry for the image that calls exec, got {names}")
            else:
                d = (pre[0].get("summary") or {}).get("direct") or {}
                if (d.get("bytes"), d.get("blocks")) != (111, 1):
                    res.problems.append(f"exec_parent direct: {d}, expected 111 bytes in 1 block")
            return res
        tasks.append(("exec_parent", nofollow))
    if "growth" in by:
        def growth_report():
            # A trace whose only finding is leak.growth: `tagalloc report`
            # says so in its header, above a summary of 0 errors.
            e = by["growth"]
            res = Result("growth", "tagalloc report")
            t0 = time.time()
            tf = os.path.join(tmp, "growth.trace")
            r = run([tagalloc, "run", "--trace", tf, "--"] + program_cmd(e, dirs["exact"]), RUN_TIMEOUT)
            if r.status != 0:
                res.problems.append(f"run: status {status_text(r.status)}" + _stderr_tail(r))
            r = run([tagalloc, "report", tf], RUN_TIMEOUT)
            out = r.stdout.decode(errors="replace")
            want = "==WARNING: tagalloc: memory that grows from iteration to iteration (no leaks, no errors)\n"
            if r.status != 0 or want not in out or "detected memory problems" in out \
                    or "SUMMARY: tagalloc: 0 byte(s) leaked in 0 allocation(s); 0 error(s).\n" not in out \
                    or "Growing memory: 64.0 byte(s) per iteration over 9 iteration(s)" not in out:
                res.problems.append(f"report: status {status_text(r.status)}, expected the header {want!r}, "
                                    f"the growth and a summary of 0; got:\n{out[:600]}")
            res.secs = time.time() - t0
            return res
        tasks.append(("growth", growth_report))
    if "direct_leaks" in by:
        def suppressions():
            # --suppressions end to end: each process reads the file at
            # start (at exit the runtime's freeres has cleared the
            # environment); a missing file is one line and exit 2, before
            # the program starts.
            e = by["direct_leaks"]
            res = Result("direct_leaks", "--suppressions")
            t0 = time.time()
            sf = os.path.join(tmp, "direct_leaks.supp")
            with open(sf, "w") as f:
                f.write("# the dummy buffers\nleak:dummy_buffer\n")
            jf = os.path.join(tmp, "direct_leaks.supp.json")
            r = run([tagalloc, "run", "--suppressions", sf, "--error-exitcode", "42", "--json", jf, "--"]
                    + program_cmd(e, dirs["exact"]), RUN_TIMEOUT)
            if r.status != 0:
                res.problems.append(f"status {status_text(r.status)}, expected exit 0 (all leaks suppressed)"
                                    + _stderr_tail(r))
            try:
                doc = json.load(open(jf))
                pr = doc["processes"][0]
                summ = pr["summary"]
                got = (summ["direct"]["bytes"], summ["direct"]["blocks"],
                       summ["suppressed"]["bytes"], summ["suppressed"]["blocks"])
                if got != (0, 0, 40000, 10000):
                    res.problems.append(f"direct, suppressed: {got}, expected (0, 0, 40000, 10000)")
                used = [(u["pattern"], u["count"], u["bytes"]) for u in pr["suppressions"]]
                if used != [("dummy_buffer", 10000, 40000)]:
                    res.problems.append(f"suppressions used: {used}")
            except (OSError, ValueError, KeyError, IndexError) as exc:
                res.problems.append(f"JSON: {exc}" + _stderr_tail(r))
            err = r.stderr.decode(errors="replace")
            if "Suppressions used:" not in err or "  10000      40000 dummy_buffer" not in err:
                res.problems.append("the text report has no 'Suppressions used' table for dummy_buffer"
                                    + _stderr_tail(r))
            missing = os.path.join(tmp, "no-such.supp")
            r = run([tagalloc, "run", "--suppressions", missing, "--"] + program_cmd(e, dirs["exact"]),
                    RUN_TIMEOUT)
            want = f"tagalloc: --suppressions {missing}: cannot open the suppressions file: No such file or directory\n"
            if r.status != 2 or r.stderr.decode(errors="replace") != want or r.stdout != b"":
                res.problems.append(f"missing file: status {status_text(r.status)}, stdout {r.stdout!r}, "
                                    f"stderr {r.stderr!r}; expected exit 2, nothing run, {want!r}")
            res.secs = time.time() - t0
            return res
        tasks.append(("direct_leaks", suppressions))

        def debug_cache():
            # The symbolizer's cache of decompressed debug files: the
            # reports with it (made, then used) are the ones without it.
            e = by["direct_leaks"]
            res = Result("direct_leaks", "TAGALLOC_DEBUG_CACHE")
            t0 = time.time()
            cdir = os.path.join(tmp, "debug-cache")
            shutil.rmtree(cdir, ignore_errors=True)
            stacks = {}
            for label, val in (("off", "off"), ("made", cdir), ("used", cdir)):
                jf = os.path.join(tmp, f"direct_leaks.debugcache.{label}.json")
                env = dict(os.environ, TAGALLOC_DEBUG_CACHE=val)
                r = run([tagalloc, "run", "--json", jf, "--"] + program_cmd(e, dirs["exact"]),
                        RUN_TIMEOUT, env=env)
                try:
                    doc = json.load(open(jf))
                except (OSError, ValueError) as exc:
                    res.problems.append(f"{label}: JSON: {exc}" + _stderr_tail(r))
                    return res
                stacks[label] = [[[{k: v for k, v in fr.items() if k != "address"}   # ASLR
                                   for fr in f.get("stack") or []]
                                  for f in p.get("findings") or []]
                                 for p in doc.get("processes") or []]
            res.secs = time.time() - t0
            for label in ("made", "used"):
                if stacks[label] != stacks["off"]:
                    res.problems.append(f"the stacks with the debug cache ({label}) differ from those without")
            return res
        tasks.append(("direct_leaks", debug_cache))
    return tasks


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
