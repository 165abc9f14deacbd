#!/usr/bin/env python3
"""check_fault.py - what a training program's report (--html FILE) says
about a run with a seeded bug (--fault NAME).

    check_fault.py PAGE KIND STACK FUNCTION FILE [TOP [ALSO]]

Reads the report model embedded in the page (the JSON block
"tagalloc-data") and checks that every finding is of KIND (no other kind,
at least one finding), and that FUNCTION in FILE (FILE:LINE: at that
line) is among the first TOP (default 3) frames, inlined ones included, of
the STACK ("stack": the headline, "aux_stack", "alloc_stack" or
"free_stack") of every one of them.  ALSO lists, comma-separated, what the
same bug leads to and must be reported beside KIND, exactly:
KIND=GROUPS, or KIND=GROUPS@STACK+FUNCTION+FILE+TOP to ask the same of
each of those groups' STACK.  With KIND "none": no finding at all.  Prints
one line; exit status 0 when it holds, 1 otherwise."""
import json
import re
import sys


def frames_of(data, idx, top):
    """(function, file, line) of the first `top` frames of stack idx, inlined frames included."""
    if idx is None or idx < 0 or idx >= len(data["stacks"]):
        return []
    strings = data["strings"]
    out = []
    for fr in data["stacks"][idx][:top]:
        fn = strings[fr[0]] if fr[0] >= 0 else "??"
        fl = strings[fr[1]] if fr[1] >= 0 else "??"
        out.append((fn, fl, fr[2]))
    return out


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    page, kind = argv[1], argv[2]
    text = open(page, encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="tagalloc-data">(.*?)</script>', text, re.S)
    if not m:
        print(f"{page}: no report data")
        return 1
    data = json.loads(m.group(1))
    findings = data["findings"]
    kinds = sorted({f["kind"] for f in findings})
    if kind == "none":
        ok = not findings
        print(f"{'ok' if ok else 'FAIL'}: findings of kinds {kinds or 'none'}, want none")
        return 0 if ok else 1
    stack, function, path = argv[3], argv[4], argv[5]
    top = int(argv[6]) if len(argv) > 6 else 3
    also = {}
    for spec in (argv[7].split(",") if len(argv) > 7 and argv[7] else []):
        k, _, rest = spec.partition("=")
        groups, _, site = rest.partition("@")
        also[k] = (int(groups), site.split("+") if site else None)
    want = sorted({kind} | set(also))
    if kinds != want:
        print(f"FAIL: findings of kinds {kinds}, want {want}")
        return 1
    msg = check_site(data, findings, kind, stack, function, path, top)
    if msg.startswith("FAIL"):
        print(msg)
        return 1
    for k, (groups, site) in sorted(also.items()):
        n = sum(1 for f in findings if f["kind"] == k)
        if n != groups:
            print(f"FAIL: {n} {k} group(s), want {groups}")
            return 1
        if site:
            m = check_site(data, findings, k, site[0], site[1], site[2], int(site[3]))
            if m.startswith("FAIL"):
                print(m)
                return 1
            msg += f"; {m[4:]}"
        else:
            msg += f"; {n} {k} group(s)"
    print(msg)
    return 0


def check_site(data, findings, kind, stack, function, path, top):
    """ok or FAIL: FUNCTION in PATH (PATH:LINE) among the top frames of STACK of every KIND finding."""
    line = None
    if re.search(r":\d+$", path):
        path, line = path.rsplit(":", 1)
        line = int(line)
    missing = []
    n = 0
    for f in findings:
        if f["kind"] != kind:
            continue
        n += 1
        fr = frames_of(data, f.get(stack), top)
        if not any(fn == function and fl.endswith(path) and line in (None, ln) for fn, fl, ln in fr):
            missing.append(fr)
    where = f"{path}:{line}" if line is not None else path
    if missing:
        return (f"FAIL: {function} ({where}) not in the top {top} frames of {len(missing)} of {n} {kind} {stack}s: "
                f"{missing[:3]}")
    return f"ok: {n} {kind} group(s), each with {function} ({where}) in the top {top} frames of its {stack}"

if __name__ == "__main__":
    sys.exit(main(sys.argv))
