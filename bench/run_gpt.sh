#!/bin/sh
# bench/run_gpt.sh: training throughput of duet's gpt_kjv (the byte-level GPT
# of models/gpt_kjv.model) against the same model in PyTorch
# (bench/gpt_kjv_torch.py) and against the machine's SGEMM speed.  A
# benchmark, not a test: it never fails on a slow result.  Run from the
# repository root (make bench-gpt does, after make data):
#
#     sh bench/run_gpt.sh
#
# Environment: STEPS (default 30), RUNS (default 3), THREADS (default 2),
# WARMUP (PyTorch's untimed steps, default 3), BUILD_DIR (default build),
# PYTHON (default: the first of python3, /usr/bin/python3 that can import
# torch).  Writes bench/results_gpt.json.  About 3-4 minutes on 2 cores.
set -eu

STEPS=${STEPS:-30}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
WARMUP=${WARMUP:-3}
BUILD_DIR=${BUILD_DIR:-build}
MODEL=models/gpt_kjv.model
DATA=data/kjv.txt
OUT_JSON=bench/results_gpt.json
# the model's dimensions (models/gpt_kjv.model), for the FLOP count
BATCH=16 BLOCK=128 EMBD=256 LAYERS=4 HEADS=4 VOCAB=256

# duet's setting: idle OpenMP workers sleep instead of spinning against
# OpenBLAS's threads.  PyTorch is measured with it and without it.
OMP_WAIT_POLICY=PASSIVE
export OMP_WAIT_POLICY

if [ ! -f "$MODEL" ] || [ ! -d bench ]; then
  echo "bench/run_gpt.sh: run me from the repository root" >&2
  exit 2
fi
if [ ! -f "$DATA" ]; then
  echo "bench/run_gpt.sh: $DATA missing; 'make data' writes it" >&2
  exit 2
fi

. bench/common.sh
interference_start

# ---------------------------------------------------------------- sgemm
SGEMM="$BUILD_DIR/sgemm_gpt"
echo "bench: compiling bench/sgemm_gpt.c -> $SGEMM"
cc -O2 -fopenmp bench/sgemm_gpt.c -o "$SGEMM" -I"$OPENBLAS_INC" "$OPENBLAS_LIB"

# ----------------------------------------------------------------- duet
DUET_ARGS="run $MODEL --steps $STEPS --no-eval --threads $THREADS --log-every $STEPS"
echo "bench: duet: $RUNS x 'OMP_WAIT_POLICY=PASSIVE $BUILD_DIR/duet $DUET_ARGS'"
"$BUILD_DIR/duet" run "$MODEL" --steps 2 --no-eval --threads "$THREADS" --quiet >/dev/null # compile/cache kernels
: >"$tmp/duet"
i=0
while [ "$i" -lt "$RUNS" ]; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  line=$("$BUILD_DIR/duet" $DUET_ARGS | grep 'duet: trained')
  echo "  run $i: $line"
  echo "$line" | rate_of tokens >>"$tmp/duet"
done
duet_tps=$(median <"$tmp/duet")

# -------------------------------------------------------------- pytorch
py=""
for cand in ${PYTHON:-python3 /usr/bin/python3}; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import torch, numpy' >/dev/null 2>&1; then
    py=$cand
    break
  fi
done
torch_tps=""
torch_ver=""
torch_passive=""
torch_unset=""
if [ -n "$py" ]; then
  torch_ver=$("$py" -c 'import torch; print(torch.__version__)')
  TORCH_ARGS="bench/gpt_kjv_torch.py --steps $STEPS --warmup $WARMUP --threads $THREADS"
  echo "bench: pytorch $torch_ver ($py): $RUNS x '$TORCH_ARGS'"
  # PyTorch is measured with OMP_WAIT_POLICY=PASSIVE (the configuration
  # duet runs in) and with it unset; the faster median is the peer.
  torch_tps=0
  for policy in PASSIVE unset; do
    : >"$tmp/torch"
    i=0
    while [ "$i" -lt "$RUNS" ]; do
      i=$((i + 1))
      # shellcheck disable=SC2086
      if [ "$policy" = unset ]; then
        line=$(env -u OMP_WAIT_POLICY "$py" $TORCH_ARGS | grep 'torch: trained')
      else
        line=$(OMP_WAIT_POLICY=PASSIVE "$py" $TORCH_ARGS | grep 'torch: trained')
      fi
      echo "  OMP_WAIT_POLICY=$policy run $i: $line"
      echo "$line" | rate_of tokens >>"$tmp/torch"
    done
    m=$(median <"$tmp/torch")
    echo "  OMP_WAIT_POLICY=$policy: median $m tokens/s"
    if [ "$policy" = unset ]; then torch_unset=$m; else torch_passive=$m; fi
    torch_tps=$(awk -v a="$m" -v b="$torch_tps" 'BEGIN { print (a > b ? a : b) }')
  done
else
  echo "bench: pytorch: skipped (no python3 that can 'import torch, numpy')"
fi

# ---------------------------------------------------------------- sgemm
echo "bench: sgemm_gpt $THREADS"
"$SGEMM" "$THREADS" 2048 | tee "$tmp/sgemm" | sed 's/^/  /'
field() { awk -v k="$1" '$1 == k { print $2 }' "$tmp/sgemm"; }
ceiling=$(field ceiling_tokens_per_s)
ceil_ms=$(field step_ms)
ceil_gflops=$(field step_gflops)
gemm_ms=$(field step_gemm_ms)
gemm_gflops=$(field step_gemm_gflops)
attn_ms=$(field step_attn_ms)
sgemm_gflop=$(field step_gflop)
sq_gflops=$(awk '$1 == "square" { print $5 }' "$tmp/sgemm")
if [ -z "$ceiling" ] || [ -z "$sq_gflops" ] || [ -z "$duet_tps" ] || [ "$duet_tps" = nan ]; then
  echo "bench/run_gpt.sh: a measurement is missing (see above)" >&2
  exit 1
fi

# ---------------------------------------------------------------- table
interference_end
awk -v busy0="$idle_busy" -v others="$others" -v steal="$steal" -v duet="$duet_tps" -v torch="${torch_tps:-}" \
  -v tpas="$torch_passive" -v tuns="$torch_unset" -v ceil="$ceiling" -v cms="$ceil_ms" -v cgf="$ceil_gflops" \
  -v gms="$gemm_ms" -v ggf="$gemm_gflops" -v ams="$attn_ms" -v sgf="$sgemm_gflop" -v sq="$sq_gflops" \
  -v steps="$STEPS" -v runs="$RUNS" -v thr="$THREADS" -v tver="$torch_ver" -v json="$OUT_JSON" \
  -v B="$BATCH" -v T="$BLOCK" -v C="$EMBD" -v L="$LAYERS" -v H="$HEADS" -v V="$VOCAB" '
function row(name, tps) {
  printf "%-26s %10.0f %9.1f %9.1f %10.1f%% %10.1f%%\n", name, tps, 1000 * tok / tps,
    tps * gf / tok, 100 * tps / ceil, 100 * (tps * gf / tok) / sq
}
BEGIN {
  tok = B * T                                    # tokens (GEMM rows) per step
  # weight GEMMs, 2*m*n*k each; forward per layer: q, k, v and the attention
  # projection (C x C each), MLP up (C x 4C) and down (4C x C)
  blk_fwd = L * 2 * tok * C * C * (3 + 1 + 4 + 4)
  head_fwd = 2 * tok * C * V                     # logits = ln(x) @ wte^T
  fwd = blk_fwd + head_fwd
  dx = fwd; dw = fwd                             # backward: dX = dY W^T and dW = X^T dY
  wg = fwd + dx + dw
  # attention per layer and (batch, head): Q K^T and P V forward; dP, dV, dQ,
  # dK backward; 2 * D FLOPs per score, over the causal lower triangle
  D = C / H
  tri = T * (T + 1) / 2
  a_fwd = L * B * H * 2 * (2 * D * tri)
  a_bwd = L * B * H * 4 * (2 * D * tri)
  a_full = (a_fwd + a_bwd) * T * T / tri
  att = a_fwd + a_bwd
  gf = (wg + att) / 1e9                          # GFLOP per step
  if (sgf != "" && (sgf - gf > 1e-3 || gf - sgf > 1e-3))
    printf "bench: warning: sgemm_gpt counts %.4f GFLOP per step, this script %.4f\n", sgf, gf
  sqceil = sq * tok / gf
  printf "\ngpt_kjv training, batch %d x %d tokens, %d threads, median of %d runs of %d steps\n", B, T, thr, runs, steps
  printf "%-26s %10s %9s %9s %11s %11s\n", "", "tokens/s", "ms/step", "GFLOP/s", "of ceiling", "of sq peak"
  row("duet", duet)
  if (torch != "") row("pytorch " tver, torch)
  else printf "%-26s %10s\n", "pytorch", "skipped"
  printf "%-26s %10.0f %9.1f %9.1f %10.1f%% %10.1f%%\n", "exact-GEMM ceiling", ceil, cms, cgf, 100, 100 * cgf / sq
  printf "%-26s %10.0f %9.1f %9.1f %11s %10.1f%%\n", "square SGEMM peak (2048^3)", sqceil, 1000 * tok / sqceil, sq, "", 100
  if (torch != "") printf "duet / pytorch: %.2fx   (pytorch medians: OMP_WAIT_POLICY=PASSIVE %.0f, unset %.0f tokens/s)\n", duet / torch, tpas, tuns
  printf "(one step = %.3f GFLOP counted: weight GEMMs %.3f = forward %.3f (blocks %.3f, tied head %.3f) + backward dX %.3f + dW %.3f;\n", gf, wg / 1e9, fwd / 1e9, blk_fwd / 1e9, head_fwd / 1e9, dx / 1e9, dw / 1e9
  printf " attention %.3f = forward %.3f (QK^T, PV) + backward %.3f (dP, dV, dQ, dK), causal lower triangle T(T+1)/2 per head;\n", att / 1e9, a_fwd / 1e9, a_bwd / 1e9
  printf " the full T*T would be %.3f.  Every linear'"'"'s dX is counted, the head'"'"'s included; the embedding lookups are gathers, no GEMM, no dX.\n", a_full / 1e9
  printf " Not counted: layernorm, GELU, softmax, biases, residuals, cross-entropy, AdamW.  PyTorch computes the full T*T and masks it.)\n"
  printf "(the ceiling = %d tokens / %.2f ms: the best per-shape SGEMM times of the step'"'"'s 75 weight GEMMs, %.2f ms at %.1f GFLOP/s,\n", tok, cms, gms, ggf
  printf " plus attention'"'"'s products as dense 128x128x64 GEMMs in parallel over batch x heads, scaled to the triangle, %.2f ms)\n", ams
  printf "(other processes: %s%% of a core busy just before; %s CPU-s used by them during the run, %s s VM steal; well above 0 means skewed figures)\n", busy0, others, steal

  printf "{\n" > json
  printf "  \"model\": \"gpt_kjv\", \"batch\": %d, \"block\": %d, \"tokens_per_step\": %d, \"threads\": %d, \"steps\": %d, \"runs\": %d,\n", B, T, tok, thr, steps, runs > json
  printf "  \"step_gflop\": %.4f, \"step_weight_gemm_gflop\": %.4f, \"step_attention_gflop\": %.4f, \"attention_counted\": \"causal lower triangle\",\n", gf, wg / 1e9, att / 1e9 > json
  printf "  \"duet_tokens_per_s\": %.0f, \"duet_gflops\": %.1f,\n", duet, duet * gf / tok > json
  if (torch != "") {
    printf "  \"torch_version\": \"%s\", \"torch_tokens_per_s\": %.0f, \"torch_gflops\": %.1f,\n", tver, torch, torch * gf / tok > json
    printf "  \"torch_tokens_per_s_passive\": %.0f, \"torch_tokens_per_s_unset\": %.0f,\n", tpas, tuns > json
    printf "  \"duet_over_torch\": %.4f,\n", duet / torch > json
    printf "  \"torch_fraction_of_gemm_ceiling\": %.4f, \"torch_fraction_of_square_peak\": %.4f,\n", torch / ceil, (torch * gf / tok) / sq > json
  } else printf "  \"torch_tokens_per_s\": null,\n" > json
  printf "  \"duet_fraction_of_gemm_ceiling\": %.4f, \"duet_fraction_of_square_peak\": %.4f,\n", duet / ceil, (duet * gf / tok) / sq > json
  printf "  \"gemm_ceiling_tokens_per_s\": %.0f, \"ceiling_step_ms\": %.4f, \"ceiling_weight_gemm_ms\": %.4f, \"ceiling_attention_ms\": %.4f, \"ceiling_gflops\": %.1f,\n", ceil, cms, gms, ams, cgf > json
  printf "  \"square_sgemm_gflops\": %.1f, \"square_n\": 2048,\n", sq > json
  printf "  \"busy_percent_before\": %s, \"other_processes_cpu_s\": %s, \"steal_s\": %s\n", busy0, others, steal > json
  printf "}\n" > json
}'
echo "bench: wrote $OUT_JSON"
