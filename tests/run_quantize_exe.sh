#!/bin/sh
# Evaluation executables with their weights inside (issue 15, item 2):
# duet compile M.model [--quantize int8|int8-tensor] --checkpoint CK -o EXE.
#
# fmnist_mlp trained 20 steps (seed 1, --threads 2) and saved as CK, then
# compiled with CK's weights embedded: E8 (--quantize int8), E8T
# (int8-tensor) and E32 (f32, no --quantize).
#   - ./E8 with no flag (and with --eval-only) prints the test accuracy and
#     loss `duet run M --eval-only --checkpoint CK --quantize int8` prints,
#     as text (the line after the name of the weights) and as --metrics
#     (byte for byte); E8T the same for int8-tensor, E32 for f32;
#   - ./E8 --checkpoint CK2 (CK resumed 5 steps more) evaluates CK2, as
#     duet run does, not its embedded weights;
#   - sizes: E32 - E8 is, within 8 KiB (section alignment, the headers of
#     the embedded files), the weight bytes int8 saves, 3 bytes per int8
#     weight minus the bytes of their f32 scales, computed from the shapes
#     `duet ir --after quantize --quantize int8` prints, plus the code only
#     E32 has (E32 - E8 of the two compiled without --checkpoint: both
#     evaluation programs, E32's from the dump of `duet ir M --eval-only
#     --after evalonly`, as duet compile --checkpoint compiles it, so its
#     training kernels are gone); the embedded file (its size on the "wrote" line) holds the
#     params' bytes (int8 weights, f32 scales, f32 biases) plus a safetensors
#     header of at most 4 KiB; and each executable is that file's size
#     (within 4 KiB: section alignment) larger than the one compiled without
#     --checkpoint;
#   - stripped (strip), E8 keeps its weights (.rodata) and evaluates the same;
#   - exact one-line errors: a checkpoint of another model, a missing
#     checkpoint, --checkpoint with a flag that configures only training
#     (--clip-grad-norm, the --prune flags), -o naming the checkpoint, and
#     the executable given --save; a failed link keeps the old executable
#     (it is linked under a temporary name, then renamed); no temporary
#     file is left next to the executable, after a failure or a success.
# The CUDA path (the same embedded file copied to the device at load) is
# checked by tests/gpu/run_quantize_gpu.sh (the fake GPU: ctest fakegpu_prune).
# Exits 77 without the data.
# usage: run_quantize_exe.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_quantize_exe.sh path/to/duet}
FM=/usr/share/datasets/fashion-mnist
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST (Debian package dataset-fashion-mnist)"; exit 77; }
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-quantize-exe.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
T="--threads 2"
size() { wc -c < "$1" | tr -d ' '; }

"$DUET" run $M $T --seed 1 --quiet --steps 20 --save "$d/ck.st" > "$d/train.out" 2>&1 || { bad training; cat "$d/train.out"; exit 1; }
"$DUET" run $M $T --seed 1 --quiet --steps 25 --resume "$d/ck.st" --save "$d/ck2.st" > "$d/train2.out" 2>&1 ||
  { bad "training CK2"; cat "$d/train2.out"; exit 1; }
echo "trained: duet run $M $T --seed 1 --steps 20 --save CK (and --steps 25 --resume CK --save CK2)"
for e in E8:int8 E8T:int8-tensor E32:none; do
  n=${e%%:*} q=${e#*:}
  "$DUET" compile $M --quantize $q --checkpoint "$d/ck.st" -o "$d/$n" > "$d/$n.compile" 2>&1 ||
    { bad "compile $n"; cat "$d/$n.compile"; }
  # the same program without weights: --quantize's is an evaluation program; f32's, compiled from
  # the dump of duet ir --eval-only (duet compile --checkpoint compiles the evaluation program)
  if [ $q = none ]; then
    "$DUET" ir $M --eval-only --after evalonly > "$d/eval.ir" && "$DUET" compile "$d/eval.ir" -o "$d/${n}bare" > /dev/null 2>&1
  else
    "$DUET" compile $M --quantize $q -o "$d/${n}bare" > /dev/null 2>&1
  fi || bad "compile ${n}bare"
  "$DUET" run $M $T --eval-only --checkpoint "$d/ck.st" --quantize $q --metrics "$d/$n.ref.jsonl" > "$d/$n.ref" 2>&1 ||
    { bad "duet run --quantize $q"; cat "$d/$n.ref"; }
  "$d/$n" $T --metrics "$d/$n.jsonl" > "$d/$n.out" 2>&1 || { bad "./$n"; cat "$d/$n.out"; }
  # the line's numbers after "duet: NAME (step N): "
  want=$(sed -n 's/^duet: .* (step 20): //p' "$d/$n.ref") got=$(sed -n 's/^duet: embedded weights (step 20): //p' "$d/$n.out")
  [ -n "$want" ] && [ "$want" = "$got" ] && cmp -s "$d/$n.jsonl" "$d/$n.ref.jsonl" &&
    ok "$n: ./$n prints what duet run --eval-only --checkpoint CK --quantize $q prints: $got" ||
    { bad "$n: ./$n differs from duet run --quantize $q"; echo "  duet run: $want"; echo "  ./$n:     $got"; }
done
"$d/E8" $T --eval-only --metrics "$d/E8e.jsonl" > /dev/null 2>&1 && cmp -s "$d/E8e.jsonl" "$d/E8.ref.jsonl" &&
  ok "./E8 --eval-only: the same" || bad "./E8 --eval-only differs"
grep -q "^duet: int8 weights: 3 tensors, 1861632 bytes and 8232 bytes of f32 scales" "$d/E8.out" && ok int8_line ||
  bad int8_line
"$d/E8" --help 2>&1 | grep -q "^This executable holds its weights (1879[0-9]* bytes, compiled with --checkpoint)" &&
  ok "./E8 --help says it holds its weights" || bad "./E8 --help"
# --quantize is fixed at compile time: the compiled mode is taken, another refused (and --help lists it)
"$d/E8" $T --quantize int8 --metrics "$d/E8q.jsonl" > /dev/null 2>&1 && cmp -s "$d/E8q.jsonl" "$d/E8.ref.jsonl" &&
  ok "./E8 --quantize int8 (its own mode): the same" || bad "./E8 --quantize int8"
"$d/E8" --quantize int8-tensor > /dev/null 2> "$d/E8q.err"
[ "$(cat "$d/E8q.err")" = "duet: error: --quantize is fixed at compile time: int8 (this program was compiled with it; to change it, compile again: duet compile M.model --quantize int8-tensor; duet run takes it directly)" ] &&
  ok "./E8 --quantize int8-tensor: fixed at compile time" || { bad "./E8 --quantize int8-tensor"; cat "$d/E8q.err"; }
"$d/E8T" --quantize none > /dev/null 2> "$d/E8Tq.err"
[ "$(cat "$d/E8Tq.err")" = "duet: error: --quantize is fixed at compile time: int8-tensor (this program was compiled with it; for f32 weights, compile again without --quantize; duet run takes it directly)" ] &&
  ok "./E8T --quantize none: fixed at compile time" || { bad "./E8T --quantize none"; cat "$d/E8Tq.err"; }
"$d/E8T" --shrink > /dev/null 2> "$d/E8Ts.err"
[ "$(cat "$d/E8Ts.err")" = "duet: error: --shrink is fixed at compile time: this program's layers are not shrunk (its weights are int8, and --shrink does not go with --quantize yet)" ] &&
  ok "./E8T --shrink: int8 and not shrunk" || { bad "./E8T --shrink"; cat "$d/E8Ts.err"; }
"$d/E8bare" --help 2>&1 | head -1 | grep -qxF "This program evaluates a trained checkpoint and cannot train (compiled with --quantize: its weights are int8): $d/E8bare --eval-only --checkpoint CK." &&
  ok "./E8bare --help: says it evaluates and cannot train" || { bad "./E8bare --help"; "$d/E8bare" --help 2>&1 | head -2; }
"$d/E8T" --help 2>&1 | grep -qxF "  --quantize         int8-tensor" && ok "./E8T --help: --quantize int8-tensor" ||
  bad "./E8T --help lists --quantize"
# --checkpoint overrides the embedded weights
S="--test-subset 2000" # (the first 2,000 test images, for speed)
"$d/E8" $T $S --checkpoint "$d/ck2.st" --metrics "$d/E8o.jsonl" > /dev/null 2>&1
"$DUET" run $M $T $S --eval-only --checkpoint "$d/ck2.st" --quantize int8 --metrics "$d/ck2.jsonl" > /dev/null 2>&1
grep -q '^{"step":25,' "$d/ck2.jsonl" && cmp -s "$d/E8o.jsonl" "$d/ck2.jsonl" && ok "./E8 --checkpoint CK2 evaluates CK2" ||
  { bad "./E8 --checkpoint CK2"; cat "$d/E8o.jsonl" "$d/ck2.jsonl"; }

# sizes, from the shapes of the quantized program's params
"$DUET" ir $M --after quantize --quantize int8 > "$d/q.ir" 2>&1 || bad "duet ir"
shapes=$(awk '/= param "/ {
    t = $0; sub(/.* : /, "", t); sub(/ .*/, "", t); dt = substr(t, 1, index(t, "[") - 1); sub(/^[a-z0-9]*\[/, "", t); sub(/\]$/, "", t)
    k = split(t, dims, ","); n = 1; for (i = 1; i <= k; i++) n *= dims[i]
    if (dt == "i8") q += n; else if ($4 ~ /\.scale"$/) s += 4 * n; else o += 4 * n }
  END { printf "%d %d %d", q, s, o }' "$d/q.ir")
set -- $shapes
nq=$1 sbytes=$2 obytes=$3
echo "fmnist_mlp: $nq int8 weights, $sbytes bytes of scales, $obytes bytes of other f32 params"
[ "$nq" = 1861632 ] && [ "$sbytes" = 8232 ] || bad "shapes from duet ir: $shapes"
s8=$(size "$d/E8") s32=$(size "$d/E32") s8b=$(size "$d/E8bare") s32b=$(size "$d/E32bare")
res=$(awk -v a="$s32" -v b="$s8" -v ab="$s32b" -v bb="$s8b" -v q="$nq" -v s="$sbytes" 'BEGIN {
  want = 3 * q - s; got = a - b; code = ab - bb; dev = got - code - want; if (dev < 0) dev = -dev
  printf "%s E32 %d bytes - E8 %d bytes = %d; weight bytes saved 3 x %d - %d = %d, plus the code only E32 has %d (the executables without weights): %d apart (at most 8192)\n",
    (dev <= 8192 ? "ok" : "FAIL"), a, b, got, q, s, want, code, dev; exit !(dev <= 8192) }')
rc=$?
echo "$res"
if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
for e in E8:$nq E32:$((4 * nq)); do
  n=${e%%:*} wq=${e#*:}
  blob=$(sed -n 's/.* embedded: \([0-9]*\) bytes)$/\1/p' "$d/$n.compile")
  if [ $n = E8 ]; then params=$((wq + sbytes + obytes)); else params=$((wq + obytes)); fi
  grown=$(( $(size "$d/$n") - $(size "$d/${n}bare") ))
  hdr=$((blob - params)) extra=$((grown - blob))
  [ -n "$blob" ] && [ "$hdr" -ge 0 ] && [ "$hdr" -lt 4096 ] && [ "$extra" -gt -4096 ] && [ "$extra" -lt 4096 ] &&
    ok "$n: embedded file $blob bytes = params $params + header $hdr; the executable grew $grown bytes" ||
    bad "$n: embedded file '$blob' bytes, params $params, the executable grew $grown bytes"
done
echo "sizes: E8 $s8, E32 $s32, without weights $s8b and $s32b bytes"
# stripped: the weights are data, not symbols
if command -v strip > /dev/null 2>&1; then
  strip -o "$d/E8s" "$d/E8" && "$d/E8s" $T $S --metrics "$d/E8s.jsonl" > /dev/null 2>&1 &&
    "$d/E8" $T $S --metrics "$d/E8ss.jsonl" > /dev/null 2>&1 && cmp -s "$d/E8s.jsonl" "$d/E8ss.jsonl" &&
    ok "stripped E8 ($(size "$d/E8s") bytes) evaluates the same" || bad "stripped E8"
fi

# errors
expect() {
  name=$1 want=$2; shift 2
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -eq 1 ] && [ "$out" = "$want" ]; then ok "$name"
  else bad "$name: exit $rc, output:"; printf '%s\n' "$out" | head -5; echo "  want: $want"; fi
}
sed 's/^model fmnist_mlp$/model fmnist_other/' $M > "$d/other.model"
expect other_model "duet: error: cannot load $d/ck.st: it is a checkpoint of model \`fmnist_mlp\`, not \`fmnist_other\`" \
  "$DUET" compile "$d/other.model" --quantize int8 --checkpoint "$d/ck.st" -o "$d/X"
expect missing_checkpoint "duet: error: cannot load the checkpoint: cannot open $d/none.st: No such file or directory" \
  "$DUET" compile $M --quantize int8 --checkpoint "$d/none.st" -o "$d/X"
expect clip_grad_norm "duet: error: --clip-grad-norm configures training, and duet compile --checkpoint writes an evaluation executable (it evaluates the checkpoint's weights and trains nothing): leave out --clip-grad-norm, or --checkpoint to compile a training executable" \
  "$DUET" compile $M --checkpoint "$d/ck.st" --clip-grad-norm 1 -o "$d/X"
expect prune "duet: error: the --prune flags configure training, and duet compile --checkpoint writes an evaluation executable (it evaluates the checkpoint's weights and trains nothing): leave out the --prune flags, or --checkpoint to compile a training executable" \
  "$DUET" compile $M --quantize int8 --checkpoint "$d/ck.st" --prune 0.5 -o "$d/X"
expect output_is_checkpoint "duet: error: -o $d/ck.st names the input file; choose another output path" \
  "$DUET" compile $M --quantize int8 --checkpoint "$d/ck.st" -o "$d/ck.st"
expect exe_save "duet: error: this executable evaluates its embedded weights (compiled with --checkpoint) and trains nothing: it takes no --save; to train, compile without --checkpoint" \
  "$d/E8" --save "$d/x.st"
# a failed link (a C compiler that writes part of its output, then fails)
# leaves the old executable as it was
cp "$d/E8" "$d/E8old" && cp "$d/E8" "$d/E8keep"
printf '#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && printf partial > "$2"; shift; done\nexit 1\n' > "$d/badcc"
chmod +x "$d/badcc"
DUET_CC="$d/badcc" "$DUET" compile $M --quantize int8 --checkpoint "$d/ck.st" -o "$d/E8old" > "$d/link.out" 2>&1 &&
  bad "a failing C compiler: compile succeeded" ||
  { grep -q "^duet: error: linking the evaluation executable failed ($d/badcc exited with 1):" "$d/link.out" &&
    cmp -s "$d/E8old" "$d/E8keep" && ok "failed link: error, the old executable kept" ||
    { bad "failed link"; cat "$d/link.out"; }; }
left=$(ls -a "$d" | grep 'duet-' | head -3)
[ -z "$left" ] && [ ! -e "$d/X" ] && ok "no temporaries left" || bad "left next to the executables: $left"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
