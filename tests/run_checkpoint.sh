#!/bin/sh
# Checkpoints and the files of a run:
#   1-2. --resume continues with exactly the losses of an uninterrupted run
#        (images and text), and --metrics FILE given again continues the
#        file: the lines up to the checkpoint's step are kept (later ones of a
#        run that had gone further are dropped, as is a line cut short), new
#        ones appended; evaluation lines carry their step;
#   3.   SIGKILL during --save-every 1 saves, each kill proven to have hit a
#        save (its temp file is still there once the process is gone): the
#        checkpoint always loads; the next run removes such temps once they
#        are stale;
#   4.   bad checkpoints and run files are errors before any kernel is
#        compiled (missing, truncated, other model, step beyond the run; --save
#        a FIFO or a symbolic link; an output that is an input, compared by
#        inode: --metrics = --resume, --save / --metrics = the model source or
#        a data file; two outputs in one file), in duet run and in a compiled
#        executable;
#   5.   non-finite values: a checkpoint holding a NaN is refused naming the
#        tensor; the loss message says whether it is the first step, the first
#        after a resume, or after finite steps; a diverging run never writes a
#        non-finite checkpoint and says which one the file keeps;
#   6.   SIGINT / SIGTERM: the step finishes, the checkpoint is written and
#        named, exit 128 + the signal (without --save: said, no checkpoint); a
#        second signal aborts at once; on two virtual CPU devices the resumed
#        run ends with the uninterrupted run's metrics, bit for bit;
#   7.   another seed, train subset, precision, thread count or
#        learning-rate schedule (clipping) than the checkpoint's is a warning.
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
# before_compile NAME "the whole error line" command...: exit 1 with that
# line, no kernels compiled or loaded (no "duet: kernels" line, an empty
# fresh kernel cache)
before_compile() {
  name=$1 want=$2; shift 2
  out=$(DUET_CACHE_DIR="$d/cache-$name" "$@" 2>&1); rc=$?
  if [ "$rc" -eq 1 ] && printf '%s\n' "$out" | grep -Fxq -- "$want" && ! printf '%s\n' "$out" | grep -q '^duet: kernels' &&
     [ -z "$(ls -A "$d/cache-$name" 2>/dev/null)" ]; then ok "$name"
  else bad "$name: exit $rc, output:"; printf '%s\n' "$out" | head -5; echo "  want (before compiling): $want"; fi
}
# ck_step FILE: the step of a checkpoint, read back by duet (empty if it does not load)
ck_step() {
  "$DUET" run $M $F --resume "$1" --steps 1 2>&1 | sed -n 's/^duet: error: the checkpoint is at step \([0-9]*\), not before.*/\1/p'
}
# tensor_at FILE NAME: the byte offset of tensor NAME's data in a safetensors file
tensor_at() {
  hl=$(od -An -tu8 -N8 "$1" | tr -d ' \n')
  off=$(head -c $((8 + hl)) "$1" | tail -c +9 | sed -n "s/.*\"$2\":{[^}]*\"data_offsets\":\[\([0-9]*\),.*/\1/p")
  echo $((8 + hl + off))
}
# poke FILE OFFSET BYTES: overwrite bytes (printf octal escapes) in place
poke() { printf "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc 2> /dev/null; }

# 1. images: 25 steps straight vs 12 + resume (crosses an epoch boundary at
# 10 and 20); --metrics given again to the resumed run: the file is the
# straight run's, evaluation lines included (each with its step), plus the
# evaluation the 12-step run made at its end (kept: it happened)
E="--train-subset 2560 --test-subset 300 --log-every 1 --threads 2 --quiet"
"$DUET" run $M $E --steps 25 --metrics "$d/a.jsonl" > /dev/null &&
"$DUET" run $M $E --steps 12 --save "$d/ck.st" --metrics "$d/b.jsonl" > /dev/null &&
"$DUET" run $M $E --steps 25 --resume "$d/ck.st" --metrics "$d/b.jsonl" > /dev/null &&
grep -q '^{"step":12,"epoch":2,"test_accuracy":' "$d/b.jsonl" &&
grep -v '^{"step":12,"epoch"' "$d/b.jsonl" | cmp -s "$d/a.jsonl" - && ok resume_images ||
  { bad resume_images; diff "$d/a.jsonl" "$d/b.jsonl" | head -5; }
[ "$(grep -c '"test_accuracy"' "$d/a.jsonl")" -eq 3 ] && [ "$(grep -c '^{"step":' "$d/a.jsonl")" -eq 28 ] &&
  grep -q '^{"step":20,"epoch":2,"test_accuracy":' "$d/a.jsonl" && ok metrics_every_line_has_step ||
  { bad metrics_every_line_has_step; grep test_accuracy "$d/a.jsonl"; }
# a run that went further than its last checkpoint (to 20, saving at 12
# only), and a line cut short by a kill: resuming from step 12 drops both
# (and says so), and the file again ends as the straight run's
cp "$d/ck.st" "$d/ck12.st"
"$DUET" run $M $E --steps 20 --resume "$d/ck12.st" --metrics "$d/b.jsonl" --save "$d/ck20.st" > /dev/null &&
  printf '{"step":21,"lo' >> "$d/b.jsonl" &&
  "$DUET" run $M $E --steps 25 --resume "$d/ck12.st" --metrics "$d/b.jsonl" --quiet > /dev/null 2> "$d/m.err" &&
  [ ! -s "$d/m.err" ] || bad "metrics_resume: $(cat "$d/m.err")"
cp "$d/a.jsonl" "$d/c.jsonl" && printf '{"step":26,"lo' >> "$d/c.jsonl"
w=$("$DUET" run $M ${E%--quiet} --steps 25 --resume "$d/ck12.st" --metrics "$d/c.jsonl" 2>&1 > /dev/null)
[ "$w" = "duet: metrics: $d/c.jsonl keeps its 13 lines up to step 12 (the checkpoint's); dropped 16 after it" ] &&
  cmp -s "$d/a.jsonl" "$d/c.jsonl" && grep -v '^{"step":12,"epoch"' "$d/b.jsonl" | cmp -s "$d/a.jsonl" - &&
  ok metrics_resume_drops_later_lines ||
  { bad metrics_resume_drops_later_lines; echo "got: $w"; diff "$d/a.jsonl" "$d/c.jsonl" | head -5; }
echo 'not json' > "$d/foreign.jsonl"
out=$("$DUET" run $M $F --steps 13 --resume "$d/ck.st" --metrics "$d/foreign.jsonl" 2>&1)
[ "$out" = "duet: error: metrics file $d/foreign.jsonl: line 1 is not a JSON object; not appending to a file duet did not write (give another --metrics)" ] &&
  [ "$(cat "$d/foreign.jsonl")" = "not json" ] && ok metrics_foreign_file_kept || { bad metrics_foreign_file_kept; echo "$out"; }

# 2. text: a tiny GPT on a licence text, 30 steps straight vs 15 + resume
T="--data /usr/share/common-licenses/GPL-3 --log-every 1 --eval-every 10 --eval-batches 2 --threads 2 --quiet"
G=tests/models/gpt_tiny.model
"$DUET" run $G $T --steps 30 --metrics "$d/g1.jsonl" > /dev/null &&
"$DUET" run $G $T --steps 15 --save "$d/g.st" > /dev/null &&
"$DUET" run $G $T --steps 30 --resume "$d/g.st" --metrics "$d/g2.jsonl" > /dev/null &&
grep -v '"step":\([1-9]\|1[0-5]\),' "$d/g1.jsonl" | diff - "$d/g2.jsonl" && ok resume_text || bad resume_text

# 3. SIGKILL during checkpoint writes (runs resuming from the checkpoint
# they save to).  A kill is counted only when it is proven to have hit a
# save: once the process is gone, its temp file (PATH.tmp.<its pid>.<hex>)
# is still there.  Tries until 3 such kills (at most 12); each time the
# checkpoint must load, at a step no earlier than before.
mkdir "$d/k"
K="$d/k/k.st"
"$DUET" run $M $F --steps 2 --save "$K" > /dev/null || bad kill_setup
hits=0 tries=0 kills_ok=1 last=2
while [ $hits -lt 3 ] && [ $tries -lt 12 ]; do
  tries=$((tries + 1))
  "$DUET" run $M $F --steps 100000 --resume "$K" --save "$K" --save-every 1 > /dev/null 2>&1 &
  pid=$!
  # wait (no forks: a shell glob) until a save of this process is under way,
  # the first, second or third of the run, then a few more polls (another
  # moment of the save each try)
  n=0 saves=0 prev= seen=0
  while [ $n -lt 600000 ]; do
    n=$((n + 1))
    set -- "$K".tmp.$pid.*
    [ -e "$1" ] || continue
    [ "$1" != "$prev" ] && saves=$((saves + 1)) prev=$1 seen=0
    seen=$((seen + 1))
    [ $saves -gt $((tries % 3)) ] && [ $seen -gt $((tries % 4 * 3)) ] && break
  done
  kill -9 $pid 2> /dev/null
  wait $pid 2> /dev/null
  set -- "$K".tmp.$pid.*
  [ -e "$1" ] || continue
  hits=$((hits + 1))
  step=$(ck_step "$K")
  if [ -n "$step" ] && [ "$step" -ge $last ] && "$DUET" run $M $F --resume "$K" --steps $((step + 1)) > /dev/null 2>&1; then
    last=$step
    echo "  kill $tries hit a save ($(basename "$1"), $(wc -c < "$1") bytes written): the checkpoint of step $step loads"
  else
    kills_ok=0; echo "  kill $tries hit a save: the checkpoint does not load"
  fi
done
[ $hits -eq 3 ] && [ $kills_ok -eq 1 ] && ok "kill_during_save ($hits kills in $tries tries hit a save)" ||
  bad "kill_during_save: $hits of $tries kills proven to hit a save, checkpoints ok: $kills_ok"
# the temps the kills left behind: kept while fresh (a save may be under way
# in another PID namespace sharing the directory), removed once stale
set -- "$K".tmp.*
n_left=$#
"$DUET" run $M $F --steps 1 --save "$K" > /dev/null 2> "$d/st.err"
set -- "$K".tmp.*
[ $# -eq $n_left ] && [ ! -s "$d/st.err" ] && ok stale_temps_kept_while_fresh || { bad stale_temps_kept_while_fresh; cat "$d/st.err"; }
touch -d "@$(($(date +%s) - 1000))" "$K".tmp.*
"$DUET" run $M ${F%--quiet} --steps 1 --save "$K" > /dev/null 2> "$d/st.err"
set -- "$K".tmp.*
[ ! -e "$1" ] && grep -q "^duet: removed $n_left stale temporary files\? of saves to $K that were interrupted ($K\.tmp\.[0-9]*\.[0-9a-f]*" "$d/st.err" &&
  ok stale_temps_removed || { bad stale_temps_removed; cat "$d/st.err"; ls "$d/k"; }

# 4. bad checkpoints and run files, before compiling
out=$("$DUET" run $M $F --steps 3 --resume tests/ref/gpt_tiny.safetensors 2>&1)
echo "$out" | grep -Fxq "duet: error: cannot resume from tests/ref/gpt_tiny.safetensors: not a duet checkpoint (metadata format is missing, expected duet-checkpoint-1)" \
  && ok resume_foreign_file || { bad resume_foreign_file; echo "$out"; }
before_compile resume_other_model "duet: error: cannot resume from $d/g.st: it is a checkpoint of model \`gpt_tiny\`, not \`fmnist_mlp\`" \
  "$DUET" run $M $F --steps 3 --resume "$d/g.st"
head -c 1000 "$d/ck.st" > "$d/trunc.st"
hl=$(od -An -tu8 -N8 "$d/ck.st" | tr -d ' \n')
before_compile resume_truncated "duet: error: cannot resume: corrupt safetensors file $d/trunc.st: header length $hl exceeds the 992 bytes after the length field" \
  "$DUET" run $M $F --steps 3 --resume "$d/trunc.st"
head -c $(($(wc -c < "$d/ck.st") - 4)) "$d/ck.st" > "$d/trunc2.st"
before_compile resume_truncated_data "duet: error: cannot resume: corrupt safetensors file $d/trunc2.st: tensor \"linear3.b.exp_avg_sq\": data_offsets [22364240, 22364280] out of range (data section is 22364276 bytes)" \
  "$DUET" run $M $F --steps 3 --resume "$d/trunc2.st"
before_compile resume_missing "duet: error: cannot resume: cannot open $d/none.st: No such file or directory" \
  "$DUET" run $M $F --steps 3 --resume "$d/none.st"
before_compile resume_beyond_steps "duet: error: the checkpoint is at step 12, not before the last step 10" \
  "$DUET" run $M $F --steps 10 --resume "$d/ck.st"
before_compile resume_beyond_epochs "duet: error: the checkpoint is at step 12, not before the last step 10" \
  "$DUET" run $M $F --epochs 1 --resume "$d/ck.st"
out=$("$DUET" run $M $F --steps 3 --save /nonexistent/dir/ck.st 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -qx "duet: error: --save /nonexistent/dir/ck.st: cannot write into /nonexistent/dir: No such file or directory" && ok save_unwritable || { bad save_unwritable; echo "$out"; }
# --save replaces only a regular file (as root, --save /dev/null would have
# replaced the device: a FIFO and a symbolic link stand for it here)
mkfifo "$d/fifo"
before_compile save_fifo "duet: error: --save $d/fifo exists and is a FIFO, not a regular file: a checkpoint replaces only a regular file" \
  "$DUET" run $M $F --steps 1 --save "$d/fifo"
ln -s ck.st "$d/link.st"
before_compile save_symlink "duet: error: --save $d/link.st exists and is a symbolic link, not a regular file: a checkpoint replaces only a regular file" \
  "$DUET" run $M $F --steps 1 --save "$d/link.st"
[ -p "$d/fifo" ] && [ -L "$d/link.st" ] && ok save_targets_untouched || bad save_targets_untouched
# outputs that are inputs (the same inode, whatever the name)
cp "$d/ck.st" "$d/ck.copy"
before_compile metrics_is_resume "duet: error: --metrics $d/ck.st is the same file as --resume $d/ck.st: writing it would destroy that input" \
  "$DUET" run $M $F --steps 13 --resume "$d/ck.st" --metrics "$d/ck.st"
cmp -s "$d/ck.st" "$d/ck.copy" && ok metrics_is_resume_checkpoint_intact || bad metrics_is_resume_checkpoint_intact
cp $M "$d/mine.model"
ln "$d/mine.model" "$d/alias.model"
before_compile save_is_model "duet: error: --save $d/mine.model is the same file as the model source $d/mine.model: writing it would destroy that input" \
  "$DUET" run "$d/mine.model" $F --steps 1 --save "$d/mine.model"
before_compile metrics_is_model_by_inode "duet: error: --metrics $d/alias.model is the same file as the model source $d/mine.model: writing it would destroy that input" \
  "$DUET" run "$d/mine.model" $F --steps 1 --metrics "$d/alias.model"
cmp -s $M "$d/mine.model" && ok model_intact || bad model_intact
cp /usr/share/common-licenses/GPL-3 "$d/text.txt"
before_compile save_is_text_data "duet: error: --save $d/text.txt is the same file as the training text $d/text.txt: writing it would destroy that input" \
  "$DUET" run $G --data "$d/text.txt" --steps 1 --save "$d/text.txt"
# (never a system file as the output: a duet without the check would write
# into it; the labels here are a copy, the output a hard link to it)
FM=/usr/share/datasets/fashion-mnist
mkdir "$d/fm" && for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz; do
  ln -s "$FM/$f" "$d/fm/$f"; done
cp "$FM/t10k-labels-idx1-ubyte.gz" "$d/fm/" && ln "$d/fm/t10k-labels-idx1-ubyte.gz" "$d/labels.gz"
before_compile metrics_is_data_file "duet: error: --metrics $d/labels.gz is the same file as the data file $d/fm/t10k-labels-idx1-ubyte.gz: writing it would destroy that input" \
  "$DUET" run $M --data "$d/fm" --steps 1 --metrics "$d/labels.gz"
before_compile metrics_is_save "duet: error: --metrics $d/out.st is the same file as --save $d/out.st: each output needs its own file" \
  "$DUET" run $M $F --steps 1 --save "$d/out.st" --metrics "$d/out.st"
# --save may be --resume (read whole before the first save replaces it)
cp "$d/ck.st" "$d/self.st"
"$DUET" run $M $F --steps 14 --resume "$d/self.st" --save "$d/self.st" > /dev/null && [ "$(ck_step "$d/self.st")" = 14 ] &&
  ok save_is_resume_allowed || bad save_is_resume_allowed
# a compiled executable makes the same checks
if "$DUET" compile $M -o "$d/exe" > /dev/null 2>&1; then
  out=$("$d/exe" $F --steps 13 --resume "$d/ck.st" --metrics "$d/ck.st" 2>&1)
  [ "$out" = "duet: error: --metrics $d/ck.st is the same file as --resume $d/ck.st: writing it would destroy that input" ] &&
    cmp -s "$d/ck.st" "$d/ck.copy" && ok exe_metrics_is_resume || { bad exe_metrics_is_resume; echo "$out"; }
  out=$("$d/exe" $F --steps 1 --save "$d/exe" 2>&1)
  [ "$out" = "duet: error: --save $d/exe is the same file as the running program $d/exe: writing it would destroy that input" ] &&
    ok exe_save_is_itself || { bad exe_save_is_itself; echo "$out"; }
  out=$("$d/exe" $F --steps 10 --resume "$d/ck.st" 2>&1)
  [ "$out" = "duet: error: the checkpoint is at step 12, not before the last step 10" ] && ok exe_resume_beyond_steps ||
    { bad exe_resume_beyond_steps; echo "$out"; }
else
  bad "duet compile"
fi

# 5. non-finite values
# a checkpoint holding a NaN (element 4 of linear1.w) is refused, naming it
cp "$d/ck.st" "$d/nan.st"
poke "$d/nan.st" $(($(tensor_at "$d/nan.st" 'linear1\.w') + 16)) '\000\000\300\177'
out=$("$DUET" run $M $F --steps 20 --resume "$d/nan.st" 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$out" = "duet: error: cannot resume from $d/nan.st: tensor \`linear1.w\` holds 1 non-finite value (element 4 is NaN); the state it holds has diverged" ] &&
  ok resume_nan_refused || { bad resume_nan_refused; echo "$out"; }
# the first step of a fresh run: weights of std 1e30 overflow in the forward pass
sed 's/= kaiming_uniform/= normal(1e30)/' $M > "$d/huge.model"
out=$("$DUET" run "$d/huge.model" $F --steps 3 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$out" = "duet: error: loss is NaN at step 1, the first step, before any update: the model computes it from its initial weights and the first batch (not a learning-rate problem; check the initialisation and the data)" ] &&
  ok nonfinite_first_step || { bad nonfinite_first_step; echo "$out"; }
# the first step after a resume: finite biases of 3e38 (linear2.b, all 1024)
# make the f32 sums of the last layer overflow
cp "$d/ck.st" "$d/big.st"
i=0; while [ $i -lt 1024 ]; do printf '\346\261\141\177'; i=$((i + 1)); done > "$d/big.bin"
dd if="$d/big.bin" of="$d/big.st" bs=1 seek="$(tensor_at "$d/big.st" 'linear2\.b')" conv=notrunc 2> /dev/null
out=$("$DUET" run $M $F --steps 20 --resume "$d/big.st" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -xq "duet: error: loss is \(NaN\|infinite\) at step 13, the first after resuming from $d/big.st (whose values are finite), before any update of this run: the model computes it from that state and this batch" &&
  ok nonfinite_first_after_resume || { bad nonfinite_first_after_resume; echo "$out"; }
# --lr 1e10 diverges after finite steps; with --save-every 1 the state that
# is no longer finite is not written: the file keeps the last finite one
out=$("$DUET" run $M $F --steps 10 --lr 1e10 2>&1); rc=$?
s=$(echo "$out" | sed -n 's/^duet: error: loss is NaN at step \([0-9]*\), after \([0-9]*\) finite steps\?: training diverged (try a lower --lr)$/\1 \2/p')
[ $rc -eq 1 ] && [ -n "$s" ] && [ "${s% *}" -eq $((${s#* } + 1)) ] && [ "${s#* }" -ge 1 ] && ok "nonfinite_after_finite_steps (step ${s% *})" ||
  { bad nonfinite_after_finite_steps; echo "$out"; }
rm -f "$d/div.st"
out=$("$DUET" run $M $F --steps 10 --lr 1e10 --save "$d/div.st" --save-every 1 2>&1); rc=$?
s=$(echo "$out" | sed -n "s|^duet: error: not saving step \([0-9]*\) to $d/div.st: tensor \`[a-z0-9_.]*\` holds [0-9]* non-finite values\? (element [0-9]* is [a-zN]*): training diverged (try a lower --lr); $d/div.st keeps the checkpoint of step \([0-9]*\)\$|\1 \2|p")
[ $rc -eq 1 ] && [ -n "$s" ] && [ "${s% *}" -eq $((${s#* } + 1)) ] && [ "$(ck_step "$d/div.st")" = "${s#* }" ] &&
  "$DUET" run $M $F --steps $((${s#* } + 1)) --resume "$d/div.st" > /dev/null && ok "diverged_state_not_saved (step ${s% *})" ||
  { bad diverged_state_not_saved; echo "$out"; }

# 6. SIGTERM / SIGINT: finish the step, save, say where, exit 128 + signal
# wait_lines FILE N: until FILE has N lines (the training loop is running)
wait_lines() { i=0; while [ "$(cat "$1" 2> /dev/null | wc -l)" -lt "$2" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done; }
rm -f "$d/s.jsonl"
"$DUET" run $M $F --steps 100000 --save "$d/s.st" --metrics "$d/s.jsonl" > /dev/null 2> "$d/s.err" &
pid=$!
wait_lines "$d/s.jsonl" 3
kill -TERM $pid; wait $pid; rc=$?
n=$(tail -1 "$d/s.jsonl" | sed 's/^{"step":\([0-9]*\),.*/\1/')
[ $rc -eq 143 ] && [ "$(cat "$d/s.err")" = "duet: interrupted by SIGTERM after step $n of 100000; checkpoint of step $n saved to $d/s.st (continue with --resume $d/s.st)" ] &&
  [ "$(ck_step "$d/s.st")" = "$n" ] && ok sigterm_saves || { bad "sigterm_saves: exit $rc"; cat "$d/s.err"; }
rm -f "$d/s.jsonl"
"$DUET" run $M $F --steps 100000 --metrics "$d/s.jsonl" > /dev/null 2> "$d/s.err" &
pid=$!
wait_lines "$d/s.jsonl" 3
kill -TERM $pid; wait $pid; rc=$?
n=$(tail -1 "$d/s.jsonl" | sed 's/^{"step":\([0-9]*\),.*/\1/')
[ $rc -eq 143 ] && [ "$(cat "$d/s.err")" = "duet: interrupted by SIGTERM after step $n of 100000; no checkpoint written (--save PATH writes one when a run is interrupted)" ] &&
  ok sigterm_without_save || { bad "sigterm_without_save: exit $rc"; cat "$d/s.err"; }
# SIGINT (a background job of sh ignores it: env resets it to the default)
if env --default-signal=INT true 2> /dev/null; then
  rm -f "$d/s.jsonl"
  env --default-signal=INT "$DUET" run $M $F --steps 100000 --save "$d/s.st" --metrics "$d/s.jsonl" > /dev/null 2> "$d/s.err" &
  pid=$!
  wait_lines "$d/s.jsonl" 3
  kill -INT $pid; wait $pid; rc=$?
  n=$(tail -1 "$d/s.jsonl" | sed 's/^{"step":\([0-9]*\),.*/\1/')
  [ $rc -eq 130 ] && [ "$(cat "$d/s.err")" = "duet: interrupted by SIGINT after step $n of 100000; checkpoint of step $n saved to $d/s.st (continue with --resume $d/s.st)" ] &&
    [ "$(ck_step "$d/s.st")" = "$n" ] && ok sigint_saves || { bad "sigint_saves: exit $rc"; cat "$d/s.err"; }
else
  echo "note: env --default-signal unsupported: the SIGINT case is not run"
fi
# a second signal aborts at once: killed by it, nothing said (tried until
# the second arrives after the first was handled, before the step and the
# save end, at most 5 times: two signals pending at once are one)
aborted=0 i=0
while [ $aborted -eq 0 ] && [ $i -lt 5 ]; do
  i=$((i + 1))
  rm -f "$d/s.jsonl"
  "$DUET" run $M $F --steps 100000 --save "$d/s.st" --metrics "$d/s.jsonl" > /dev/null 2> "$d/s.err" &
  pid=$!
  wait_lines "$d/s.jsonl" 3
  kill -TERM $pid; sleep 0.005; kill -TERM $pid; wait $pid; rc=$?
  [ $rc -eq 143 ] && [ ! -s "$d/s.err" ] && aborted=1
done
[ $aborted -eq 1 ] && ok second_signal_aborts || { bad "second_signal_aborts: exit $rc"; cat "$d/s.err"; }
# a pipeline on two virtual CPU devices stops cleanly too; resumed, its
# metrics (the same file) end as the uninterrupted run's
P="--devices cpu:0,cpu:1 --micro-batches 2"
rm -f "$d/p.jsonl"
"$DUET" run $M $F $P --steps 30 --metrics "$d/pa.jsonl" > /dev/null
"$DUET" run $M $F $P --steps 100000 --save "$d/p.st" --metrics "$d/p.jsonl" > /dev/null 2> "$d/s.err" &
pid=$!
wait_lines "$d/p.jsonl" 3
kill -TERM $pid; wait $pid; rc=$?
n=$(ck_step "$d/p.st")
[ $rc -eq 143 ] && grep -q "^duet: interrupted by SIGTERM after step $n of 100000; checkpoint of step $n saved to $d/p.st" "$d/s.err" &&
  [ "$n" -lt 30 ] && "$DUET" run $M $F $P --steps 30 --resume "$d/p.st" --metrics "$d/p.jsonl" > /dev/null &&
  cmp -s "$d/pa.jsonl" "$d/p.jsonl" && ok "sigterm_pipeline (step $n)" || { bad "sigterm_pipeline: exit $rc"; cat "$d/s.err"; }

# 7. resuming with another seed or train subset: a warning (the data order changes), none when they agree
R="--train-subset 2560 --log-every 1 --no-eval --threads 2"
w=$("$DUET" run $M $R --steps 14 --resume "$d/ck.st" --seed 7 2>&1 >/dev/null | grep warning)
[ "$w" = "duet: warning: --seed 7 differs from the checkpoint's 1 ($d/ck.st): the resumed run does not continue the original one exactly where the seed still matters (the shuffle of later epochs, dropout masks; a text model's window stream is restored from the checkpoint)" ] &&
  ok resume_other_seed || { bad resume_other_seed; echo "got: $w"; }
w=$("$DUET" run $M --train-subset 1280 --log-every 1 --no-eval --threads 2 --steps 14 --resume "$d/ck.st" 2>&1 >/dev/null | grep warning)
[ "$w" = "duet: warning: --train-subset 1280 differs from the checkpoint's 2560 ($d/ck.st): the resumed run does not continue the original one exactly" ] &&
  ok resume_other_subset || { bad resume_other_subset; echo "got: $w"; }
w=$("$DUET" run $M $R --steps 14 --resume "$d/ck.st" 2>&1 >/dev/null | grep -c warning)
[ "$w" = 0 ] && ok resume_same_settings_no_warning || bad resume_same_settings_no_warning
# another learning-rate schedule or clipping (the rate of a step is a function of the step and these)
w=$("$DUET" run $M $R --steps 14 --resume "$d/ck.st" --lr-schedule cosine 2>&1 >/dev/null | grep warning)
[ "$w" = "duet: warning: the learning-rate schedule or clipping (--lr, --lr-schedule, --warmup, --min-lr, --steps, --clip-grad-norm) differs from the checkpoint's ($d/ck.st): the resumed run does not continue the original one exactly (now: cosine lr=0.001 warmup=0 min_lr=0 steps=14 clip=0; checkpoint: constant lr=0.001 warmup=0 clip=0)" ] &&
  ok resume_other_schedule || { bad resume_other_schedule; echo "got: $w"; }
# another thread count: OpenBLAS sums in another order
w=$("$DUET" run $M --train-subset 2560 --log-every 1 --no-eval --threads 1 --steps 14 --resume "$d/ck.st" 2>&1 >/dev/null | grep warning)
[ "$w" = "duet: warning: --threads 1 differs from the checkpoint's 2 ($d/ck.st): the resumed run does not continue the original one exactly (OpenBLAS's summation order follows its thread count)" ] &&
  ok resume_other_threads || { bad resume_other_threads; echo "got: $w"; }
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
