#!/bin/sh
# Checkpoints: --resume continues with exactly the losses of an
# uninterrupted run (images and text); SIGKILL at random moments during
# --save-every 1 never leaves a corrupt or missing checkpoint; bad
# checkpoints are refused with a clear message; another seed, train subset
# or precision than the checkpoint's is a warning.
# usage: run_checkpoint.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_checkpoint.sh path/to/duet}
d=${TMPDIR:-/tmp}/duet-ck.$$
mkdir -p "$d" || exit 1
trap 'rm -rf "$d"' EXIT
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
F="--train-subset 2560 --log-every 1 --no-eval --threads 2 --quiet"

# 1. images: 25 steps straight vs 12 + resume (crosses an epoch boundary at 10 and 20)
"$DUET" run $M $F --steps 25 --metrics "$d/a.jsonl" > /dev/null &&
"$DUET" run $M $F --steps 12 --save "$d/ck.st" > /dev/null &&
"$DUET" run $M $F --steps 25 --resume "$d/ck.st" --metrics "$d/b.jsonl" > /dev/null &&
tail -13 "$d/a.jsonl" | diff - "$d/b.jsonl" && ok resume_images || bad resume_images

# 2. text: a tiny GPT on a licence text, 30 steps straight vs 15 + resume
T="--data /usr/share/common-licenses/GPL-3 --log-every 1 --eval-every 10 --eval-batches 2 --threads 2 --quiet"
G=tests/models/gpt_tiny.model
"$DUET" run $G $T --steps 30 --metrics "$d/g1.jsonl" > /dev/null &&
"$DUET" run $G $T --steps 15 --save "$d/g.st" > /dev/null &&
"$DUET" run $G $T --steps 30 --resume "$d/g.st" --metrics "$d/g2.jsonl" > /dev/null &&
grep -v '"step":\([1-9]\|1[0-5]\),' "$d/g1.jsonl" | diff - "$d/g2.jsonl" && ok resume_text || bad resume_text

# 3. SIGKILL during checkpoint writes: the last checkpoint always loads
"$DUET" run $M $F --steps 2 --save "$d/k.st" > /dev/null || bad kill_setup
i=0 kills_ok=1
while [ $i -lt 6 ]; do
  i=$((i + 1))
  "$DUET" run $M $F --steps 100000 --save "$d/k.st" --save-every 1 > /dev/null 2>&1 &
  pid=$!
  sleep "0.$((4 + i))"
  kill -9 $pid 2> /dev/null
  wait $pid 2> /dev/null
  step=$("$DUET" run $M $F --steps 100000000 --resume "$d/k.st" --steps 1 2>&1 | sed -n 's/.*checkpoint is at step \([0-9]*\).*/\1/p')
  if [ -z "$step" ]; then
    "$DUET" run $M $F --resume "$d/k.st" --steps 100000000 --no-eval 2>&1 | head -3 &
    kills_ok=0; echo "  kill $i: checkpoint does not load"; kill %1 2> /dev/null
  else
    echo "  kill $i: checkpoint at step $step loads"
  fi
done
[ $kills_ok -eq 1 ] && ok kill_during_save || bad kill_during_save

# 4. bad checkpoints
out=$("$DUET" run $M $F --steps 3 --resume tests/ref/gpt_tiny.safetensors 2>&1)
echo "$out" | grep -Fxq "duet: error: cannot resume from tests/ref/gpt_tiny.safetensors: not a duet checkpoint (metadata format is missing, expected duet-checkpoint-1)" \
  && ok resume_foreign_file || { bad resume_foreign_file; echo "$out"; }
out=$("$DUET" run $M $F --steps 3 --resume "$d/g.st" 2>&1)
echo "$out" | grep -Fxq "duet: error: cannot resume from $d/g.st: it is a checkpoint of model \`gpt_tiny\`, not \`fmnist_mlp\`" \
  && ok resume_other_model || { bad resume_other_model; echo "$out"; }
head -c 1000 "$d/ck.st" > "$d/trunc.st"
out=$("$DUET" run $M $F --steps 3 --resume "$d/trunc.st" 2>&1)
echo "$out" | grep -q "duet: error: cannot resume: corrupt safetensors file $d/trunc.st" \
  && ok resume_truncated || { bad resume_truncated; echo "$out"; }
out=$("$DUET" run $M $F --steps 3 --save /nonexistent/dir/ck.st 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -qx "duet: error: --save /nonexistent/dir/ck.st: cannot write into /nonexistent/dir: No such file or directory" && ok save_unwritable || { bad save_unwritable; echo "$out"; }
# resuming with another seed or train subset: a warning (the data order changes), none when they agree
R="--train-subset 2560 --log-every 1 --no-eval --threads 2"
w=$("$DUET" run $M $R --steps 14 --resume "$d/ck.st" --seed 7 2>&1 >/dev/null | grep warning)
[ "$w" = "duet: warning: --seed 7 differs from the checkpoint's 1 ($d/ck.st): the resumed run does not continue the original one exactly where the seed still matters (the shuffle of later epochs, dropout masks; a text model's window stream is restored from the checkpoint)" ] &&
  ok resume_other_seed || { bad resume_other_seed; echo "got: $w"; }
w=$("$DUET" run $M --train-subset 1280 --log-every 1 --no-eval --threads 2 --steps 14 --resume "$d/ck.st" 2>&1 >/dev/null | grep warning)
[ "$w" = "duet: warning: --train-subset 1280 differs from the checkpoint's 2560 ($d/ck.st): the resumed run does not continue the original one exactly" ] &&
  ok resume_other_subset || { bad resume_other_subset; echo "got: $w"; }
w=$("$DUET" run $M $R --steps 14 --resume "$d/ck.st" 2>&1 >/dev/null | grep -c warning)
[ "$w" = 0 ] && ok resume_same_settings_no_warning || bad resume_same_settings_no_warning
# resuming in another precision: it trains on (f32 master weights and optimizer state carry over) with a warning
"$DUET" run $M $R --steps 5 --precision fp16 --save "$d/f16.st" --quiet > /dev/null || bad precision_setup
"$DUET" run $M $R --steps 14 --resume "$d/ck.st" --precision fp16 > "$d/p.out" 2> "$d/p.err" &&
  grep -q '^duet: trained 2 steps' "$d/p.out" &&
  [ "$(grep warning "$d/p.err")" = "duet: warning: --precision fp16 differs from the checkpoint's fp32 ($d/ck.st): the resumed run does not continue the original one exactly" ] &&
  ok resume_fp32_as_fp16 || { bad resume_fp32_as_fp16; cat "$d/p.err"; tail -1 "$d/p.out"; }
"$DUET" run $M $R --steps 8 --resume "$d/f16.st" > "$d/p.out" 2> "$d/p.err" &&
  grep -q '^duet: trained 3 steps' "$d/p.out" &&
  [ "$(grep warning "$d/p.err")" = "duet: warning: --precision fp32 differs from the checkpoint's fp16 ($d/f16.st): the resumed run does not continue the original one exactly" ] &&
  ok resume_fp16_as_fp32 || { bad resume_fp16_as_fp32; cat "$d/p.err"; tail -1 "$d/p.out"; }
w=$("$DUET" run $M $R --steps 8 --resume "$d/f16.st" --precision bf16 2>&1 >/dev/null | grep warning)
[ "$w" = "duet: warning: --precision bf16 differs from the checkpoint's fp16 ($d/f16.st): the resumed run does not continue the original one exactly" ] &&
  ok resume_fp16_as_bf16 || { bad resume_fp16_as_bf16; echo "got: $w"; }
w=$("$DUET" run $M $R --steps 8 --resume "$d/f16.st" --precision fp16 2>&1 >/dev/null | grep -c warning)
[ "$w" = 0 ] && ok resume_same_precision_no_warning || bad resume_same_precision_no_warning
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
