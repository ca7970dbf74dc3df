#!/bin/sh
# tools/duet_to_torch.py with PyTorch (label long; exit 77 without torch):
# the weights `duet export` writes, loaded into torch.nn.Sequential
# (fmnist_mlp, strict load_state_dict) and into tests/ref/gpt_ref.py's GPT
# (gpt_tiny), give duet predict's logits and probabilities (1000 test
# images) and per-token losses (16 validation windows) within 1e-4.
# usage: run_export_torch.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_export_torch.sh path/to/duet}
/usr/bin/python3 -c "import torch" 2> /dev/null || { echo "torch is not installed: skipped"; exit 77; }
d=${TMPDIR:-/tmp}/duet-torch.$$
mkdir -p "$d" || exit 1
trap 'rm -rf "$d"' EXIT
M=models/fmnist_mlp.model G=tests/models/gpt_tiny.model
"$DUET" run $M --train-subset 2560 --steps 20 --quiet --threads 1 --no-eval --save "$d/ck.st" > /dev/null &&
  "$DUET" export $M --checkpoint "$d/ck.st" -o "$d/w.st" > /dev/null &&
  "$DUET" predict $M --checkpoint "$d/ck.st" --test-subset 1000 --threads 1 --logits -o "$d/p.jsonl" &&
  /usr/bin/python3 tools/duet_to_torch.py "$d/w.st" "$d/p.jsonl" || exit 1
"$DUET" run $G --steps 10 --quiet --threads 1 --no-eval --save "$d/g.st" > /dev/null &&
  "$DUET" export $G --checkpoint "$d/g.st" -o "$d/gw.st" > /dev/null &&
  "$DUET" predict $G --checkpoint "$d/g.st" --threads 1 -o "$d/g.jsonl" &&
  /usr/bin/python3 tools/duet_to_torch.py "$d/gw.st" "$d/g.jsonl" || exit 1
