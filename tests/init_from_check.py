#!/usr/bin/env python3
"""Checks a checkpoint written by `duet run --init-from A --steps 1 --lr 0
--save B` against A (tests/run_init_from.sh).  Pure Python (no numpy).

  init_from_check.py A B BETA1 BETA2

- B's "step" metadata is 1 (the run counted its steps from 0, not from A's);
- every param of A is in B with the same bytes (lr 0: the update moves
  nothing, so B's params are A's, loaded);
- B's AdamW moments are those of one step from zero state: m = (1 - b1) g,
  v = (1 - b2) g^2, so v = (1 - b2) / (1 - b1)^2 * m^2 for every element
  (relative tolerance 1e-4: m and v are rounded to f32 separately, and
  v's g^2 against m^2 loses a few ulps; elements with |m| < 1e-30 are
  skipped: the product underflows).  A's moments (10 steps of averaging)
  must break that relation somewhere, or the check could not tell fresh
  state from carried-over state.
Exits 1 with a line naming the first failure."""
import array
import json
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, t in header.items():
        lo, hi = t["data_offsets"]
        out[name] = (t["dtype"], raw[base + lo:base + hi])
    return meta, out


def f32(blob):
    a = array.array("f")
    a.frombytes(blob)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def fresh(m, v, ratio):
    """Index of the first element where v != ratio * m^2 (or -1)."""
    for i, (mi, vi) in enumerate(zip(m, v)):
        if abs(mi) < 1e-30:
            continue
        want = ratio * mi * mi
        if abs(vi - want) > 1e-4 * abs(want):
            return i
    return -1


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: init_from_check.py A B BETA1 BETA2")
    a_meta, a = load(sys.argv[1])
    b_meta, b = load(sys.argv[2])
    b1, b2 = float(sys.argv[3]), float(sys.argv[4])
    ratio = (1 - b2) / (1 - b1) ** 2
    if b_meta.get("step") != "1":
        sys.exit("FAIL: %s's step is %r, want 1" % (sys.argv[2], b_meta.get("step")))
    params = [k for k in a if k + ".exp_avg" in a]
    if not params:
        sys.exit("FAIL: %s holds no AdamW state" % sys.argv[1])
    a_broken = False
    for k in params:
        if k not in b or b[k] != a[k]:
            sys.exit("FAIL: param %s of %s differs from %s's" % (k, sys.argv[2], sys.argv[1]))
        i = fresh(f32(b[k + ".exp_avg"][1]), f32(b[k + ".exp_avg_sq"][1]), ratio)
        if i >= 0:
            sys.exit("FAIL: %s.exp_avg_sq[%d] of %s is not (1-b2)/(1-b1)^2 * exp_avg^2: not one step from zero" %
                     (k, i, sys.argv[2]))
        a_broken |= fresh(f32(a[k + ".exp_avg"][1]), f32(a[k + ".exp_avg_sq"][1]), ratio) >= 0
    if not a_broken:
        sys.exit("FAIL: %s's moments also look like one step from zero: the check cannot tell" % sys.argv[1])
    print("%d params equal, step 1, fresh AdamW moments" % len(params))


main()
