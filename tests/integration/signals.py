"""Termination signals under `tagalloc run` (itest.py runs these checks).

progs/term_wait loses 100 blocks of 1,000 bytes, says "ready" and waits.
Each check starts `tagalloc run --json F -- term_wait` in a process group of
its own, sends a signal the way a user would, and asserts the exact result:
the program reports as at exit (100,000 bytes in 100 blocks definitely
lost, nothing reachable: the roots are the interrupted context), dies of
the same signal, the report names it (text: "killed by SIGINT"; JSON:
"signal": 2, "signal_name": "SIGINT", "clean_exit": false), and tagalloc
run exits as the program did.

  terminal      SIGINT to the process group (a terminal's Ctrl-C reaches
                tagalloc run and the program both)
  Ctrl-C        the same through a pseudo-terminal: ^C typed on it (the
                kernel's SIGINT, which tagalloc run does not pass on)
  to tagalloc   SIGINT, SIGTERM, SIGHUP, SIGQUIT to tagalloc run alone: it
                passes them on
  handler       the program's own SIGINT handler runs; the program then
                returns 3: an ordinary exit report, no signal
  twice         a second SIGINT while the first one's scan runs (seen by
                /proc/PID/pagemap open in the program): the program dies
                at once, no scan (its summary is all zero)
"""
import json
import os
import pty
import resource
import signal
import subprocess
import time

LOST = (100000, 100)
TIMEOUT = 120


def _no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # SIGQUIT dumps core


def _child_of(pid):
    """The program: tagalloc run's only child."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
        return int(kids[0]) if kids else None
    except OSError:
        return None


def _scanning(pid):
    """Is the program's exit scan running (it holds /proc/self/pagemap open)?"""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            if os.readlink(f"/proc/{pid}/fd/{fd}").endswith("/pagemap"):
                return True
    except OSError:
        pass
    return False


def _start(tagalloc, prog, args, jf):
    p = subprocess.Popen([tagalloc, "run", "--json", jf, "--", prog] + args,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, start_new_session=True,
                         preexec_fn=_no_core)
    line = p.stdout.readline()
    return p, line


def _finish(p, res):
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        res.problems.append(f"timed out after {TIMEOUT}s")
    return out, err.decode(errors="replace")


def _entry(jf, res):
    try:
        with open(jf) as f:
            procs = json.load(f).get("processes") or []
    except (OSError, ValueError) as e:
        res.problems.append(f"JSON: {e}")
        return None
    if len(procs) != 1:
        res.problems.append(f"{len(procs)} process entries, expected 1")
        return None
    return procs[0]


def _numbers(entry, kind):
    d = (entry.get("summary") or {}).get(kind) or {}
    return (d.get("bytes"), d.get("blocks"))


def _check_killed(res, p, err, entry, sig, lost=LOST):
    name = signal.Signals(sig).name
    if p.returncode != -sig:
        res.problems.append(f"tagalloc run ended with {p.returncode}, expected -{sig} ({name})"
                            + "\n      " + "\n      ".join(err.strip().splitlines()[-8:]))
    if f"killed by {name}" not in err:
        res.problems.append(f"the text report does not say 'killed by {name}'")
    if entry is None:
        return
    want = {"signal": sig, "signal_name": name, "clean_exit": False, "exit_code": None}
    for k, v in want.items():
        if entry.get(k) != v:
            res.problems.append(f"JSON {k}: {entry.get(k)!r}, expected {v!r}")
    if _numbers(entry, "direct") != lost:
        res.problems.append(f"direct: {_numbers(entry, 'direct')}, expected {lost}")
    for kind in ("indirect", "possible", "reachable"):
        if _numbers(entry, kind) != (0, 0):
            res.problems.append(f"{kind}: {_numbers(entry, kind)}, expected (0, 0)")


def signal_tasks(Result, tagalloc, prog, tmp):
    tasks = []

    def killed(label, sig, group):
        def t():
            res = Result("term_wait", label)
            t0 = time.time()
            jf = os.path.join(tmp, f"term_wait.{label.replace(' ', '_')}.json")
            p, line = _start(tagalloc, prog, [], jf)
            if line != b"ready\n":
                res.problems.append(f"program said {line!r}")
            if group:
                os.killpg(p.pid, sig)
            else:
                os.kill(p.pid, sig)
            out, err = _finish(p, res)
            res.secs = time.time() - t0
            _check_killed(res, p, err, _entry(jf, res), sig)
            return res
        return t

    tasks.append(("term_wait", killed("SIGINT terminal", signal.SIGINT, True)))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        tasks.append(("term_wait", killed(f"{sig.name} to tagalloc", sig, False)))

    def ctrl_c():
        res = Result("term_wait", "Ctrl-C on a terminal")
        t0 = time.time()
        jf = os.path.join(tmp, "term_wait.ctrlc.json")
        pid, fd = pty.fork()
        if pid == 0:                      # the session leader, on the terminal
            try:
                _no_core()
                os.execv(tagalloc, [tagalloc, "run", "--json", jf, "--", prog])
            finally:
                os._exit(127)
        out = b""
        typed = False
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            try:
                chunk = os.read(fd, 65536)
            except OSError:               # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            out += chunk
            if not typed and b"ready" in out:
                os.write(fd, b"\x03")     # the line discipline sends SIGINT
                typed = True
        os.close(fd)
        _, status = os.waitpid(pid, 0)
        res.secs = time.time() - t0

        class Ended:
            returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if not typed:
            res.problems.append(f"the program never said ready: {out[-300:]!r}")
        _check_killed(res, Ended, out.decode(errors="replace"), _entry(jf, res), signal.SIGINT)
        return res
    tasks.append(("term_wait", ctrl_c))

    def handler():
        res = Result("term_wait", "SIGINT handler")
        t0 = time.time()
        jf = os.path.join(tmp, "term_wait.handler.json")
        p, line = _start(tagalloc, prog, ["handler"], jf)
        os.killpg(p.pid, signal.SIGINT)
        out, err = _finish(p, res)
        res.secs = time.time() - t0
        if p.returncode != 3:
            res.problems.append(f"tagalloc run ended with {p.returncode}, expected 3")
        if out != b"handled\n":
            res.problems.append(f"stdout {out!r}, expected the handler's 'handled'")
        if "killed by" in err:
            res.problems.append("the text report names a signal; the program exited")
        entry = _entry(jf, res)
        if entry is not None:
            for k, v in {"signal": None, "exit_code": 3, "clean_exit": True}.items():
                if entry.get(k) != v:
                    res.problems.append(f"JSON {k}: {entry.get(k)!r}, expected {v!r}")
            if _numbers(entry, "direct") != LOST:
                res.problems.append(f"direct: {_numbers(entry, 'direct')}, expected {LOST}")
        return res
    tasks.append(("term_wait", handler))

    def twice():
        res = Result("term_wait", "SIGINT twice")
        t0 = time.time()
        jf = os.path.join(tmp, "term_wait.twice.json")
        # 400,000 more blocks kept reachable: a scan long enough to be seen
        p, line = _start(tagalloc, prog, ["big", "400000"], jf)
        child = _child_of(p.pid)
        os.killpg(p.pid, signal.SIGINT)
        seen = False
        deadline = time.time() + 60
        while child and not seen and time.time() < deadline and p.poll() is None:
            seen = _scanning(child)
            if not seen:
                time.sleep(0.001)
        if not seen:
            res.skipped = "the scan ended before it was seen (a busy machine?)"
        os.killpg(p.pid, signal.SIGINT)
        out, err = _finish(p, res)
        res.secs = time.time() - t0
        if res.skipped:
            return res
        # no scan: nothing classified (the leak report made from the trace
        # by tagalloc run counts blocks, not kinds)
        _check_killed(res, p, err, _entry(jf, res), signal.SIGINT, lost=(0, 0))
        return res
    tasks.append(("term_wait", twice))
    return tasks
