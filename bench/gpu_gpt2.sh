#!/bin/sh
# bench/gpu_gpt2.sh: GPU training throughput of models/gpt2_124m.model (GPT-2
# small shapes) in duet (--devices cuda) and in PyTorch (bench/gpt2_torch.py)
# on the same GPU in the same run, as tokens/s, model FLOP utilisation
# (MFU) and the ratio duet / PyTorch.  A benchmark, not a test.
#
# MFU = tokens/s * FLOPs per token / the card's peak float32 rate (duet
# computes in float32 without tensor cores; PyTorch is run likewise, TF32
# off).  FLOPs per token: nanoGPT's estimate (Karpathy, nanoGPT model.py
# estimate_mfu; PaLM appendix B): 6 N + 12 L C T with N the parameters less
# the position embedding: 6 * 123,689,472 + 12 * 12 * 768 * 1024 =
# 855,383,040.  Peak float32 TFLOP/s by card name (NVIDIA data sheets),
# override with PEAK_TFLOPS.
#
# usage: sh bench/gpu_gpt2.sh [BUILD_DIR [OUT_DIR]]   (from the repository root)
# Environment: STEPS (default 20), BATCH (default 8), PYTHON (default python3),
# KJV_TEXT (default data/kjv.txt).  Writes OUT_DIR/bench_gpt2.json.
set -u
BUILD=${1:-build}
OUT=${2:-bench}
STEPS=${STEPS:-20}
BATCH=${BATCH:-8}
PY=${PYTHON:-python3}
DATA=${KJV_TEXT:-data/kjv.txt}
FLOPS_PER_TOKEN=855383040
mkdir -p "$OUT"
[ -f "$DATA" ] || { echo "bench/gpu_gpt2.sh: $DATA missing ('make data' here, then carry it)" >&2; exit 2; }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
peak=${PEAK_TFLOPS:-}
if [ -z "$peak" ]; then
  case "$name" in
    *H200*|*H100*SXM*|*"H100 80GB HBM3"*) peak=66.9 ;;
    *H100*PCIe*|*H100*) peak=51.2 ;;
    *A100*) peak=19.5 ;;
    *L40S*) peak=91.6 ;;
    *L4*) peak=30.3 ;;
    *A10*) peak=31.2 ;;
    *V100*) peak=15.7 ;;
    *T4*) peak=8.1 ;;
    *P100*) peak=9.3 ;;
    *4090*) peak=82.6 ;;
    *) peak="" ;;
  esac
fi
echo "bench: $name, float32 peak ${peak:-unknown} TFLOP/s, batch $BATCH x 1024 tokens, $STEPS steps"

# duet: one short run compiles (NVRTC) and caches the kernels, the second is timed
"$BUILD/duet" run models/gpt2_124m.model --devices cuda --batch "$BATCH" --steps 2 --no-eval --data "$DATA" \
  > "$OUT/duet_gpt2_warm.log" 2>&1
rc=$?
cat "$OUT/duet_gpt2_warm.log"
"$BUILD/duet" run models/gpt2_124m.model --devices cuda --batch "$BATCH" --steps "$STEPS" --log-every 5 --no-eval \
  --data "$DATA" > "$OUT/duet_gpt2.log" 2>&1 || rc=$?
cat "$OUT/duet_gpt2.log"
duet_tps=$(sed -n 's/^duet: trained .*(\([0-9.]*\) tokens\/s).*/\1/p' "$OUT/duet_gpt2.log")

torch_tps=""
if "$PY" -c 'import torch, numpy; assert torch.cuda.is_available()' > /dev/null 2>&1; then
  "$PY" bench/gpt2_torch.py --steps "$STEPS" --batch "$BATCH" --data "$DATA" > "$OUT/torch_gpt2.log" 2>&1
  cat "$OUT/torch_gpt2.log"
  torch_tps=$(sed -n 's/^torch: trained .*(\([0-9.]*\) tokens\/s).*/\1/p' "$OUT/torch_gpt2.log")
else
  echo "bench: PyTorch with CUDA not available ($PY): skipped"
fi
awk -v d="${duet_tps:-}" -v t="${torch_tps:-}" -v peak="$peak" -v fpt=$FLOPS_PER_TOKEN -v name="$name" \
    -v b="$BATCH" -v steps="$STEPS" -v json="$OUT/bench_gpt2.json" '
function mfu(x) { return peak == "" || x == "" ? "" : sprintf("%.1f%%", 100 * x * fpt / (peak * 1e12)) }
BEGIN {
  printf "\ngpt2_124m training on %s, batch %d x 1024, %d steps, float32\n", name, b, steps
  printf "%-10s %12s %10s\n", "", "tokens/s", "MFU(fp32)"
  printf "%-10s %12s %10s\n", "duet", d == "" ? "failed" : d, mfu(d)
  printf "%-10s %12s %10s\n", "pytorch", t == "" ? "skipped" : t, mfu(t)
  if (d != "" && t != "") printf "duet / pytorch: %.3f\n", d / t
  printf "{\"gpu\": \"%s\", \"batch\": %d, \"block\": 1024, \"steps\": %d, \"flops_per_token\": %d, \"peak_fp32_tflops\": %s,\n", name, b, steps, fpt, peak == "" ? "null" : peak > json
  printf " \"duet_tokens_per_s\": %s, \"torch_tokens_per_s\": %s, \"duet_over_torch\": %s}\n", d == "" ? "null" : d, t == "" ? "null" : t, (d != "" && t != "") ? sprintf("%.4f", d / t) : "null" > json
}'
exit $rc
