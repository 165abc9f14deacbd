#!/usr/bin/env python3
"""check_timeline.py - the timeline of a training program's own page
(--html FILE, rendered in the process from the ledger's samples at its
marks, without a trace).

    check_timeline.py PAGE MARKS TAG[,TAG...]

Reads the report model embedded in the page (the JSON block
"tagalloc-data") and checks: a duration above 0, the same in the header,
the timeline and the process's end; exactly MARKS marks, in time order;
an "all tags" series and one for each TAG, every series with exactly
MARKS + 2 points (the ledger's start, one per mark, the moment the page
was written) in time order, the last at the duration; the lows never
above the highs; the peak marker at the process's peak, its by-tag list
adding up to it.  Prints one line; exit status 0 when it holds, 1
otherwise."""
import json
import re
import sys


def main():
    page, marks, tags = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    text = open(page, encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="tagalloc-data">(.*?)</script>', text, re.S)
    if not m:
        return "no report data in " + page
    d = json.loads(m.group(1))
    tl, proc = d["timeline"], d["processes"][0]
    dur = tl["duration"]
    if not dur > 0:
        return "duration %r" % dur
    if d["duration"] != dur or proc["end"] != dur:
        return "durations disagree: header %r, timeline %r, process end %r" % (d["duration"], dur, proc["end"])
    xs = [mk[1] for mk in tl["marks"]]
    if len(xs) != marks or xs != sorted(xs):
        return "marks %r, want %d in time order" % (xs, marks)
    series = {s["name"]: s for s in tl["series"]}
    for name in ["all tags"] + tags:
        s = series.get(name)
        if s is None:
            return "no series %r (have %s)" % (name, ", ".join(sorted(series)))
        if len(s["x"]) != marks + 2 or len(s["y"]) != marks + 2 or len(s["lo"]) != marks + 2:
            return "series %r has %d points, want %d" % (name, len(s["x"]), marks + 2)
        if s["x"] != sorted(s["x"]) or s["x"][0] != 0 or s["x"][-1] != dur:
            return "series %r: x %r" % (name, s["x"])
        if any(lo > hi for lo, hi in zip(s["lo"], s["y"])):
            return "series %r: a low above its high" % name
        if max(s["y"]) == 0:
            return "series %r is all 0" % name
    peak = tl.get("peak")
    if not peak or peak["y"] != proc["peak"] or max(series["all tags"]["y"]) != proc["peak"]:
        return "peak %r, the process's %r" % (peak, proc["peak"])
    if sum(b for _, b in peak["tags"]) != peak["y"]:
        return "the peak's tags %r do not add up to %d" % (peak["tags"], peak["y"])
    return None


if __name__ == "__main__":
    why = main()
    print("timeline: ok" if why is None else "timeline: " + why)
    sys.exit(0 if why is None else 1)
