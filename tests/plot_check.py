#!/usr/bin/python3
"""Checks what `duet plot` produced (tests/run_plot.sh).

  plot_check.py script GP METRICS...   the gnuplot script GP (duet plot --script)
      holds, for metrics file i and each quantity, the datablock $d<i>_<name>
      with exactly the (step, value) pairs of the file's lines that carry it
      (null skipped), in file order; no other datablock; each is plotted.
  plot_check.py svg SVG GP [LABEL...]  SVG parses as XML, has one plot group id
      (gnuplot_plot_*) per datablock of GP, and each LABEL in its text.
Exit 0 when all holds, else 1 with the reasons."""
import json
import re
import sys
import xml.etree.ElementTree as ET

PANELS = [("loss", ("loss",)), ("val_loss", ("val_loss",)), ("val_accuracy", ("val_accuracy",)),
          ("test_accuracy", ("test_accuracy",)),
          ("lr", ("lr",)), ("throughput", ("samples_per_s", "tokens_per_s"))]


def blocks(gp_text):
    out, name = {}, None
    for line in gp_text.splitlines():
        m = re.match(r"^\$(d\d+_\w+) << EOD$", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif line == "EOD":
            name = None
        elif name is not None:
            step, val = line.split()
            out[name].append((int(step), float(val)))
    return out


def check_script(gp, files):
    text = open(gp).read()
    got, errs = blocks(text), []
    want = {}
    for i, f in enumerate(files):
        rows = [json.loads(l) for l in open(f) if l.strip()]
        for name, keys in PANELS:
            pts = [(r["step"], float(r[k])) for r in rows for k in keys if r.get(k) is not None]
            if pts:
                want["d%d_%s" % (i, name)] = pts
    if set(got) != set(want):
        errs.append("datablocks %s, expected %s" % (sorted(got), sorted(want)))
    for name, pts in want.items():
        if name in got and got[name] != pts:
            errs.append("%s: %d points differ from the metrics' %d" % (name, len(got[name]), len(pts)))
    plotted = set(re.findall(r"\$(d\d+_\w+) using", "\n".join(l for l in text.splitlines() if l.startswith("plot "))))
    if plotted != set(want):
        errs.append("plotted %s, expected %s" % (sorted(plotted), sorted(want)))
    return errs, len(want)


def check_svg(svg, gp, labels):
    errs = []
    root = ET.parse(svg).getroot()
    if root.tag != "{http://www.w3.org/2000/svg}svg":
        errs.append("root element %s" % root.tag)
    # one id per series (gnuplot repeats a group for an opaque key: ids counted once)
    groups = {g.get("id") for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("id", "").startswith("gnuplot_plot_")}
    n = len(blocks(open(gp).read()))
    if len(groups) != n:
        errs.append("%d plot groups, %d series" % (len(groups), n))
    texts = {"".join(t.itertext()).strip() for t in root.iter("{http://www.w3.org/2000/svg}text")}
    for label in labels:
        if label not in texts:
            errs.append("label %r not in the legend" % label)
    return errs


def main():
    if sys.argv[1] == "script":
        errs, n = check_script(sys.argv[2], sys.argv[3:])
        if not errs:
            print("script: %d series equal to the metrics" % n)
    else:
        errs = check_svg(sys.argv[2], sys.argv[3], sys.argv[4:])
    for e in errs:
        print("FAIL:", e)
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
