#!/usr/bin/env python3
"""agree.py - every rendering of one run says the same (tests/cli/run.sh).

  agree.py RUN_TEXT RUN_JSON RUN_HTML REPORT_JSON REPORT_TEXT [RUN_FOLDED]

RUN_TEXT is the stderr of `tagalloc run --json RUN_JSON --html RUN_HTML
--trace T -- PROG` (the process's own report), REPORT_JSON and REPORT_TEXT
what `tagalloc report` makes of T.  Each gives its findings as (kind, bytes,
blocks, top frame's function) and its error and loss-record counts; they
must be equal, finding by finding.  RUN_FOLDED (run's --folded): its
stacks' leaked bytes, by innermost frame, are the JSON's leak groups'.  Prints one line per disagreement, then
"agree: N findings, E errors, L loss records"; exits 1 on any disagreement.
"""
import json
import re
import sys

LEAK_TITLES = {"Direct leak": "leak.direct", "Indirect leak": "leak.indirect",
               "Possible leak": "leak.possible", "Orphaned leak": "leak.orphan", "GPU leak": "gpu.leak"}


def num(s):
    return int(s.replace(",", ""))


def from_json(path):
    doc = json.load(open(path))
    p = doc["processes"][0]
    found = []
    for f in p["findings"]:
        top = f["stack"][0]["function"] if f.get("stack") else None
        found.append((f["kind"], f["bytes"], f["blocks"], top))
    return found, p["errors"], p.get("loss_records")


def from_html(path):
    page = open(path).read()
    m = re.search(r'<script type="application/json" id="tagalloc-data">(.*?)</script>', page, re.S)
    d = json.loads(m.group(1))
    found = []

    def top(g):
        st = d["stacks"][g["stack"]] if g["stack"] >= 0 else []
        return d["strings"][st[0][0]] if st and st[0][0] >= 0 else None

    for f in d["findings"]:   # a row may hold several groups (ref.underflow: "others")
        others = f.get("others", [])
        found.append((f["kind"], f["bytes"], f["blocks"] - sum(o["blocks"] for o in others), top(f)))
        found += [(f["kind"], o["bytes"], o["blocks"], top(o)) for o in others]
    return found, d["errors"], d.get("loss_records")


def from_text(path):
    """The groups of a LeakSanitizer-shaped report: (kind, bytes, blocks or
    None when the headline does not say, top function), and the SUMMARY
    line's errors (occurrences plus loss records) and loss records."""
    found, errors, loss = [], None, 0
    lines = open(path).read().split("\n")
    for i, line in enumerate(lines):
        kind = bytes_ = blocks = None
        m = re.match(r"(\w[\w ]*?) of ([\d,]+) byte\(s\) in ([\d,]+) object\(s\) allocated from:", line)
        if m and m.group(1) in LEAK_TITLES:
            kind, bytes_, blocks = LEAK_TITLES[m.group(1)], num(m.group(2)), num(m.group(3))
        m2 = re.match(r"([a-z]+\.[a-z-]+): .*?\(([\d,]+)-byte block\)", line) or \
            re.match(r"([a-z]+\.[a-z-]+): .*", line)
        if kind is None and m2 and not line.startswith(("leak.", "unclassified")):
            kind = m2.group(1)
            bytes_ = num(m2.group(2)) if m2.lastindex >= 2 else None
        if kind is None:
            m = re.match(r"SUMMARY: tagalloc: .*; ([\d,]+) error\(s\)(?: \(([\d,]+) of them loss records)?", line)
            if m:
                errors, loss = num(m.group(1)), num(m.group(2)) if m.group(2) else 0
            continue
        top = None
        for nxt in lines[i + 1:]:
            t = re.match(r"\s+#0 0x[0-9a-f]+ in (\S+)", nxt)
            if t:
                top = t.group(1)
                break
        found.append((kind, bytes_, blocks, top))
    return found, errors, loss


LEAKS = ("leak.direct", "leak.indirect", "leak.possible", "leak.orphan", "ref.leak", "gpu.leak", "gpu.pool-retained")


def from_folded(path):
    """Leaked bytes by innermost frame of the folded stacks."""
    by = {}
    for line in open(path):
        stack, n = line.rstrip("\n").rsplit(" ", 1)
        top = stack.split(";")[-1]
        by[top] = by.get(top, 0) + int(n)
    return by


def main():
    run_text, run_json, run_html, rep_json, rep_text = sys.argv[1:6]
    want, errors, loss = from_json(run_json)
    bad = []
    if len(sys.argv) > 6:
        leaked = {}
        for kind, nbytes, _, top in want:
            if kind in LEAKS:
                leaked[top] = leaked.get(top, 0) + nbytes
        got = from_folded(sys.argv[6])
        if got != leaked:
            bad.append(f"folded: leaked bytes by frame {got} != run --json's {leaked}")
    if loss is None:
        bad.append(f"{run_json}: no loss_records")
        loss = 0
    total = errors + loss   # what the text's SUMMARY line counts
    for name, (got, e, l) in (("report --json", from_json(rep_json)), ("html", from_html(run_html))):
        if sorted(got, key=repr) != sorted(want, key=repr):
            bad.append(f"{name}: findings {sorted(got, key=repr)} != run --json's {sorted(want, key=repr)}")
        if (e, l) != (errors, loss):
            bad.append(f"{name}: errors {e}, loss records {l} != run --json's {errors}, {loss}")
    for name, path in (("run's text", run_text), ("report's text", rep_text)):
        got, e, l = from_text(path)
        if len(got) != len(want):
            bad.append(f"{name}: {len(got)} groups != run --json's {len(want)}")
        for g, w in zip(got, want):   # the text shows the groups in the model's order
            if g[0] != w[0] or (g[1] is not None and g[1] != w[1]) or (g[2] is not None and g[2] != w[2]) \
                    or g[3] != w[3]:
                bad.append(f"{name}: group {g} != run --json's {w}")
        if (e, l) != (total, loss):
            bad.append(f"{name}: SUMMARY errors {e}, loss records {l} != run --json's {errors} + {loss}, {loss}")
    for b in bad:
        print(b)
    print(f"agree: {len(want)} findings, {errors} errors, {loss} loss records" if not bad else
          f"disagree: {len(bad)} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
