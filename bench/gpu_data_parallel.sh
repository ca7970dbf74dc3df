#!/bin/sh
# bench/gpu_data_parallel.sh BUILD [OUTDIR]: data parallelism on this
# machine's GPUs (a benchmark, not a test; tests/gpu/run.sh runs it and puts
# its output, Markdown, into the report).
#  1. With two or more GPUs: NCCL's all-reduce bus bandwidth
#     (BUILD/nccl_allreduce: float32 sums from 1 MiB to $MAX_MB MiB; busbw =
#     2(N-1)/N x bytes / time, the nccl-tests definition) over 2 GPUs, over
#     all of them when there are more, and over 2 with NCCL_P2P_DISABLE=1
#     (through host memory: PCIe peer-to-peer can be slower than that,
#     shared/FACTS.md).
#  2. With two or more GPUs: $DP_MODEL (gpt_kjv) training tokens/s on
#     cuda:0 alone and on cuda:0,cuda:1 --data-parallel 2 with the same
#     global batch, with the default 25 MiB buckets and with --bucket-mb 1,
#     under DUET_PROFILE=1: C, the milliseconds per step the bucket
#     all-reduces took on the communication streams (CUDA events around each
#     bucket's NCCL group, so a rank's wait for its peer counts), E, the
#     milliseconds per step replica 0 waited for them (and for the losses)
#     before its optimizer, and the overlap achieved, 1 - E / C, the share of
#     the communication hidden behind the backward pass; `duet plan`'s
#     prediction for the same buckets beside it.
#  3. One GPU as two replicas (cuda:0,cuda:0 --data-parallel 2): tokens/s
#     with the buckets summed device-to-device and with
#     DUET_PIPE_STAGING=host (through host memory).
# Environment: STEPS (20), MAX_MB (256), DP_MODEL (models/gpt_kjv.model),
# KJV_TEXT (data/kjv.txt), DP_ITERS (20, nccl_allreduce's timed iterations).
# Exits 1 when a run fails.
# usage: sh bench/gpu_data_parallel.sh BUILD [OUTDIR]   (from the repository root)
B=${1:?usage: gpu_data_parallel.sh BUILD [OUTDIR]}
OUT=${2:-$B/dp-bench}
STEPS=${STEPS:-20} MAX_MB=${MAX_MB:-256} DP_MODEL=${DP_MODEL:-models/gpt_kjv.model} KJV_TEXT=${KJV_TEXT:-data/kjv.txt}
DP_ITERS=${DP_ITERS:-20}
mkdir -p "$OUT" || exit 1
status=0
ngpu=$("$B/duet" devices | grep -c '^cuda:[0-9]')
say() { echo "$*"; }
# tokens LOG: the tokens/s of a duet run's last line
tokens() { sed -n 's/.*trained .* (\([0-9.]*\) tokens\/s).*/\1/p' "$1" | tail -1; }
# train NAME DEVICES ARGS...: DP_MODEL for STEPS steps, profiled; the log in OUT/dp-NAME.log
train() {
  n=$1 dev=$2
  shift 2
  DUET_PROFILE=1 "$B/duet" run "$DP_MODEL" --devices "$dev" --steps "$STEPS" --no-eval --data "$KJV_TEXT" "$@" \
    > "$OUT/dp-$n.log" 2>&1 || { status=1; say "- $n: FAILED: $(tail -1 "$OUT/dp-$n.log")"; return 1; }
  return 0
}

say "## Data parallelism (bench/gpu_data_parallel.sh, $ngpu GPU(s))"
say ""
if [ "$ngpu" -ge 2 ] && [ -x "$B/nccl_allreduce" ]; then
  say "### NCCL all-reduce bandwidth"
  say ""
  say '```'
  for run in "2" "all" "2 NCCL_P2P_DISABLE=1"; do
    set -- $run
    n=$1
    [ "$n" = all ] && { [ "$ngpu" -gt 2 ] || continue; n=$ngpu; }
    log="$OUT/nccl-allreduce-$n${2:+-p2p-off}.log"
    if env ${2:-} "$B/nccl_allreduce" --gpus "$n" --max-mb "$MAX_MB" --iters "$DP_ITERS" > "$log" 2>&1; then
      say "${2:+($2) }$(head -1 "$log")"
      sed 1d "$log" | while IFS= read -r l; do say "$l"; done
    else
      status=1
      say "nccl_allreduce --gpus $n ${2:-}: FAILED: $(tail -1 "$log")"
    fi
  done
  say '```'
  say ""
  say "### $DP_MODEL, $STEPS steps, the same global batch"
  say ""
  train one cuda:0 && say "- cuda:0: $(tokens "$OUT/dp-one.log") tokens/s"
  for mb in 25 1; do
    train "pair-$mb" cuda:0,cuda:1 --data-parallel 2 --bucket-mb "$mb" || continue
    log="$OUT/dp-pair-$mb.log"
    how=$(sed -n 's/^duet: data parallel: .* summed //p' "$log")
    # C: all-reduce ms per step on the communication stream; E: replica 0's wait per step
    total=$(sed -n 's/^duet: NCCL profile: stage 0: .*, \([0-9.]*\) ms on the communication stream.*/\1/p' "$log" | head -1)
    busbw=$(sed -n 's/^duet: NCCL profile: stage 0: .* = \([0-9.]*\) GB\/s).*/\1/p' "$log" | head -1)
    wait=$(sed -n 's/^  replica 0, stage 0: computing [0-9.]*, waiting for transfers and all-reduces \([0-9.]*\)$/\1/p' "$log")
    # duet plan's stage line: "... at 14.0 GB/s (...): 0.931 ms per step, 0.884 ms of it hidden ..., 0.047 ms exposed"
    pred=$("$B/duet" plan "$DP_MODEL" --devices cuda:0,cuda:1 --data-parallel 2 --bucket-mb "$mb" 2>/dev/null |
           sed -n 's/^  stage 0 on .*: \([0-9.]* buckets\{0,1\}\), .* at \([0-9.]* GB\/s\) .*: \([0-9.]*\) ms per step, \([0-9.]*\) ms of it hidden .*/\1, \3 ms of all-reduce per step at \2, \4 ms of it hidden/p' | head -1)
    say "- cuda:0,cuda:1 --data-parallel 2 --bucket-mb $mb: $(tokens "$log") tokens/s; summed $how"
    if [ -n "$total" ] && [ -n "$wait" ]; then
      awk -v t="$total" -v s="$STEPS" -v e="$wait" -v bw="$busbw" 'BEGIN {
        c = t / s; h = c > 0 ? 1 - e / c : 0; if (h < 0) h = 0
        printf "  - all-reduce on the communication streams: %.3f ms per step (bus bandwidth %s GB/s); replica 0 waited %.3f ms per step: overlap achieved %.0f%%\n", c, bw, e, 100 * h }'
    else
      say "  - no NCCL profile in the log (the collective was not NCCL?)"
    fi
    [ -n "$pred" ] && say "  - duet plan: $pred"
  done
else
  say "- one GPU: no NCCL bandwidth, no two-GPU training (they need two GPUs)"
fi
say ""
say "### One GPU as two replicas ($DP_MODEL, $STEPS steps)"
say ""
if [ "$ngpu" -ge 1 ]; then
  train same cuda:0,cuda:0 --data-parallel 2 &&
    say "- cuda:0,cuda:0, device-to-device sums: $(tokens "$OUT/dp-same.log") tokens/s; summed $(sed -n 's/^duet: data parallel: .* summed //p' "$OUT/dp-same.log")"
  DUET_PIPE_STAGING=host train same-host cuda:0,cuda:0 --data-parallel 2 &&
    say "- cuda:0,cuda:0, DUET_PIPE_STAGING=host: $(tokens "$OUT/dp-same-host.log") tokens/s"
fi
exit $status
