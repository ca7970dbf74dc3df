#!/usr/bin/python3
"""Checks `duet plan --format svg` against the text table of the same plan
(tests/run_plan_svg.sh).

  plan_svg_check.py SVG TABLE SCHEDULE M [CAPACITY]

SVG parses as XML; it has one forward and one backward box per (stage,
micro-batch) and one optimizer box per stage; within a stage the boxes do
not overlap and follow the schedule (GPipe: every forward before the first
backward; 1F1B: min(S - s, M) forwards before it); F(s, m) starts after
F(s-1, m) ends, B(s, m) after B(s+1, m), B(S-1, m) after F(S-1, m); the
boxes' widths are proportional to their durations, which are the table's
forward / backward / optimizer times (to the table's 0.001 ms); each
stage's memory bar stacks weights, grads, optimizer state, activations
(and caches) whose heights are proportional to their bytes (one px/byte
ratio for all, to 1e-4), whose bytes are the table's MiB (to its 0.005)
and sum to the table's total.  CAPACITY (bytes): a capacity line at that
height on every bar.  Prints the stage-0 activation bytes; exit 1 with the
reasons when anything fails."""
import re
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"


def table(path):
    st, cur = [], None
    for line in open(path):
        if re.match(r"^stage \d+ on ", line):
            cur = {}
            st.append(cur)
        m = re.search(r"forward ([0-9.]+) ms \+ backward ([0-9.]+) ms per micro-batch, optimizer ([0-9.]+) ms", line)
        if m and cur is not None:
            cur["fwd"], cur["bwd"], cur["opt"] = map(float, m.groups())
        m = re.search(r"memory: weights ([0-9.]+) MiB, grads ([0-9.]+) MiB .*optimizer state ([0-9.]+) MiB, "
                      r"activations ([0-9.]+) MiB .*\): ([0-9.]+) MiB", line)
        if m and cur is not None:
            cur["weights"], cur["grads"], cur["state"], cur["activations"], cur["need"] = map(float, m.groups())
    return st


def main():
    svg, tab, sched, M = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    cap = int(sys.argv[5]) if len(sys.argv) > 5 else None
    errs = []
    root = ET.parse(svg).getroot()
    if root.tag != NS + "svg":
        errs.append("root %s" % root.tag)
    T = table(tab)
    S = len(T)
    if S == 0 or any(len(t) != 8 for t in T):
        print("FAIL: the table has no stages or misses figures:", T)
        return 1
    if root.get("data-schedule") != sched or int(root.get("data-stages")) != S or \
       int(root.get("data-micro-batches")) != M:
        errs.append("header %s" % root.attrib)
    boxes = {"fwd": {}, "bwd": {}, "opt": {}}
    ratios = []
    for r in root.iter(NS + "rect"):
        c = r.get("class")
        if c in boxes:
            key = (int(r.get("data-stage")), int(r.get("data-mb")))
            if key in boxes[c]:
                errs.append("two %s boxes for %s" % (c, key))
            b = (float(r.get("data-start-ms")), float(r.get("data-ms")), float(r.get("x")), float(r.get("width")))
            boxes[c][key] = b
            if b[1] > 0:
                ratios.append(b[3] / b[1])
    want = {(s, m) for s in range(S) for m in range(M)}
    for c in ("fwd", "bwd"):
        if set(boxes[c]) != want:
            errs.append("%s boxes %s, want one per (stage, micro-batch): %d" % (c, sorted(boxes[c]), len(want)))
    if set(boxes["opt"]) != {(s, -1) for s in range(S)}:
        errs.append("optimizer boxes %s" % sorted(boxes["opt"]))
    if errs:
        print("\n".join("FAIL: " + e for e in errs))
        return 1
    if max(ratios) - min(ratios) > 1e-3 * max(ratios):
        errs.append("box widths not proportional to durations: px/ms from %g to %g" % (min(ratios), max(ratios)))
    eps = 5e-6  # data-start-ms and data-ms are printed to 1e-6 ms
    end = lambda b: b[0] + b[1]
    for s in range(S):
        for m in range(M):
            f, b = boxes["fwd"][(s, m)], boxes["bwd"][(s, m)]
            if abs(f[1] - T[s]["fwd"]) > 0.0005 + eps or abs(b[1] - T[s]["bwd"]) > 0.0005 + eps:
                errs.append("stage %d mb %d: %g/%g ms, the table says %g/%g" % (s, m, f[1], b[1], T[s]["fwd"],
                                                                               T[s]["bwd"]))
            if s > 0 and f[0] < end(boxes["fwd"][(s - 1, m)]) - eps:
                errs.append("F(%d,%d) starts before F(%d,%d) ends" % (s, m, s - 1, m))
            if s < S - 1 and b[0] < end(boxes["bwd"][(s + 1, m)]) - eps:
                errs.append("B(%d,%d) starts before B(%d,%d) ends" % (s, m, s + 1, m))
            if s == S - 1 and b[0] < end(f) - eps:
                errs.append("B(%d,%d) starts before its forward ends" % (s, m))
        o = boxes["opt"][(s, -1)]
        if abs(o[1] - T[s]["opt"]) > 0.0005 + eps:
            errs.append("stage %d optimizer %g ms, the table says %g" % (s, o[1], T[s]["opt"]))
        lane = sorted([boxes[c][k] for c in ("fwd", "bwd", "opt") for k in boxes[c] if k[0] == s])
        for a, b in zip(lane, lane[1:]):
            if b[0] < end(a) - eps:
                errs.append("stage %d: boxes overlap at %g ms" % (s, b[0]))
        first_b = min(boxes["bwd"][(s, m)][0] for m in range(M))
        n_before = sum(1 for m in range(M) if boxes["fwd"][(s, m)][0] < first_b)
        want_n = M if sched == "gpipe" else min(S - s, M)
        if n_before != want_n:
            errs.append("stage %d: %d forwards before the first backward, %s runs %d" % (s, n_before, sched, want_n))
        if o[0] < max(end(boxes["bwd"][(s, m)]) for m in range(M)) - eps:
            errs.append("stage %d: the optimizer starts before the last backward ends" % s)
    # memory bars
    px = []
    for s in range(S):
        segs = [r for r in root.iter(NS + "rect") if r.get("class") == "mem" and int(r.get("data-stage")) == s]
        kinds = {r.get("data-kind"): int(r.get("data-bytes")) for r in segs}
        for k in ("weights", "grads", "state", "activations"):
            if k not in kinds:
                errs.append("stage %d: no %s segment" % (s, k))
            elif abs(kinds[k] / 1048576 - T[s][k]) > 0.005 + 1e-9:
                errs.append("stage %d %s: %d bytes = %.4f MiB, the table says %.2f" % (s, k, kinds[k],
                                                                                      kinds[k] / 1048576, T[s][k]))
        total = sum(kinds.values())
        if abs(total / 1048576 - T[s]["need"]) > 0.005 + 1e-9:
            errs.append("stage %d: the bar is %.4f MiB, the table's total %.2f" % (s, total / 1048576, T[s]["need"]))
        need = [t for t in root.iter(NS + "text") if t.get("class") == "need" and int(t.get("data-stage")) == s]
        if len(need) != 1 or int(need[0].get("data-bytes")) != total:
            errs.append("stage %d: the bar's label is not its bytes %d" % (s, total))
        base = None
        for r in segs:  # stacked from the bottom, in document order
            y, h = float(r.get("y")), float(r.get("height"))
            px.append(h / int(r.get("data-bytes")))
            if base is not None and abs(y + h - base) > 1e-3:
                errs.append("stage %d: segment %s not stacked on the one below" % (s, r.get("data-kind")))
            base = y
        if cap is not None:
            lines = [l for l in root.iter(NS + "line") if l.get("class") == "capacity" and int(l.get("data-stage")) == s]
            if len(lines) != 1 or int(lines[0].get("data-bytes")) != cap:
                errs.append("stage %d: no capacity line of %d bytes" % (s, cap))
            elif segs:
                bottom = float(segs[0].get("y")) + float(segs[0].get("height"))
                if abs((bottom - float(lines[0].get("y1"))) / cap - px[0]) > 1e-4 * px[0]:
                    errs.append("stage %d: the capacity line is not at its bytes' height" % s)
    if px and max(px) - min(px) > 1e-4 * max(px):
        errs.append("bar heights not proportional to bytes: px/byte from %g to %g" % (min(px), max(px)))
    for e in errs:
        print("FAIL:", e)
    if not errs:
        acts = [int(r.get("data-bytes")) for r in root.iter(NS + "rect")
                if r.get("class") == "mem" and r.get("data-stage") == "0" and r.get("data-kind") == "activations"]
        print(acts[0])
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
