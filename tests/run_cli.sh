#!/bin/sh
# The CLI's behaviour on help, bad flags, missing and corrupt data: exit
# codes and exact messages.
# usage: run_cli.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_cli.sh path/to/duet}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-cli.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT
# a path that provably does not exist: inside the fresh directory above
no=$d/no-such-dir
pass=0 fail=0
# expect NAME RC "a whole line of the output" command...
expect() {
  name=$1 want_rc=$2 want=$3; shift 3
  out=$("$@" 2>&1); rc=$?
  first=$(printf '%s\n' "$out" | grep -v '^duet: kernels' | head -1)
  if [ "$rc" -eq "$want_rc" ] && printf '%s\n' "$out" | grep -Fxq -- "$want"; then
    echo "ok $name"; pass=$((pass + 1))
  else
    echo "FAIL $name: exit $rc (want $want_rc)"; echo "  got:  $first"; echo "  want: $want"; fail=$((fail + 1))
  fi
}
M=models/fmnist_mlp.model
expect no_args 1 "usage: duet <command> [args]" "$DUET"
expect help 0 "usage: duet <command> [args]" "$DUET" help
expect unknown_command 1 "duet: error: unknown command 'frob'" "$DUET" frob
expect run_help 0 "usage: duet run M.model [flags]" "$DUET" run --help
expect compile_help 0 "usage: duet compile M.model -o EXE [--batch N] [--devices SPEC] [--micro-batches M]" "$DUET" compile --help
expect ir_help 0 "usage: duet ir M.model [--after PASS] [--format text|dot|json] [--devices SPEC] [--micro-batches M] [--batch N]" "$DUET" ir --help
expect emit_help 0 "usage: duet emit M.model [--target c|cuda]" "$DUET" emit --help
expect check_help 0 "usage: duet check M.model [--data-parallel N] [--bucket-mb X] [--zero 0|1]" "$DUET" check --help
# every command that compiles lists the pruning flags it takes (as the top-level help says)
for c in compile ir emit check plan; do
  expect ${c}_help_prune 0 "--prune-initial S, --prune-params P, --shrink (as duet run --help describes them)." "$DUET" $c --help
done
expect missing_model 1 "nofile.model: error: cannot open file: No such file or directory" "$DUET" check nofile.model
expect unknown_pass 1 "duet: error: unknown pass 'nosuch'; passes: shape qat autodiff optimizer eval prune shrink quantize evalonly precision fuse partition data_parallel recompute memplan" \
  "$DUET" ir $M --after nosuch
expect unknown_target 1 "duet: error: unknown target 'ptx' (available: c, cuda)" "$DUET" emit $M --target ptx
expect bad_lr 1 "duet: error: --lr expects a number >= 0, got 'abc'" "$DUET" run $M --lr abc
expect bad_steps 1 "duet: error: --steps expects an integer >= 1, got '0'" "$DUET" run $M --steps 0
expect unknown_flag 1 "duet: error: unknown flag '--frob' (see --help)" "$DUET" run $M --frob 1
expect missing_value 1 "duet: error: --epochs needs a value (see --help)" "$DUET" run $M --epochs
# the package hint only for the package's own directory (tests/run_mounts.sh hides it to see the hint)
expect missing_data 1 "duet: error: cannot open $no/train-images-idx3-ubyte.gz: No such file or directory" \
  "$DUET" run $M --data "$no" --steps 1
# cheap checks come before the kernels are compiled: no "duet: kernels" line, nothing in a fresh kernel cache
# before_compile NAME "the error line" command...
before_compile() {
  name=$1 want=$2; shift 2
  out=$(DUET_CACHE_DIR="$d/cache-$name" "$@" 2>&1); rc=$?
  if [ "$rc" -eq 1 ] && printf '%s\n' "$out" | grep -Fxq -- "$want" && ! printf '%s\n' "$out" | grep -q '^duet: kernels' &&
     [ -z "$(ls -A "$d/cache-$name" 2>/dev/null)" ]; then
    echo "ok $name"; pass=$((pass + 1))
  else
    echo "FAIL $name: exit $rc, output:"; printf '%s\n' "$out" | head -5; echo "  want (before compiling): $want"
    ls -A "$d/cache-$name" 2>/dev/null | head -3; fail=$((fail + 1))
  fi
}
before_compile missing_data_before_compile "duet: error: cannot open $no/train-images-idx3-ubyte.gz: No such file or directory" \
  "$DUET" run $M --data "$no" --steps 1
mkdir -p "$d/train-only"
cp /usr/share/datasets/fashion-mnist/train-*.gz "$d/train-only/"
before_compile missing_test_split_before_compile "duet: error: cannot open $d/train-only/t10k-images-idx3-ubyte.gz: No such file or directory" \
  "$DUET" run $M --data "$d/train-only" --steps 1
before_compile missing_text_before_compile "duet: error: cannot open $no/kjv.txt: No such file or directory (make data builds data/kjv.txt from Debian's bible-kjv)" \
  "$DUET" run models/gpt_kjv.model --data "$no/kjv.txt" --steps 1
before_compile text_is_dir_before_compile "duet: error: cannot read $d" "$DUET" run models/gpt_kjv.model --data "$d" --steps 1
before_compile save_no_dir_before_compile "duet: error: --save $no/x.ck: cannot write into $no: No such file or directory" \
  "$DUET" run $M --steps 1 --save "$no/x.ck"
before_compile save_empty_before_compile "duet: error: --save needs a file path, got an empty one" \
  "$DUET" run $M --steps 1 --save ""
: > "$d/a_file"
before_compile save_under_file_before_compile "duet: error: --save $d/a_file/x.ck: $d/a_file is not a directory" \
  "$DUET" run $M --steps 1 --save "$d/a_file/x.ck"
before_compile planned_device_before_compile "duet: error: device 16GiB:sm_60 is a capacity for \`duet plan\`, not a device to run on (use cpu:N or cuda:N)" \
  "$DUET" run $M --steps 1 --devices 16GiB:sm_60
# the data is still loaded whole after the compile: --no-eval needs no test split, and training runs
expect train_split_only 0 "duet: trained 1 step" sh -c "'$DUET' run $M --data '$d/train-only' --no-eval --train-subset 512 --steps 1 --quiet | sed 's/ in .*//'"
# corrupt data: wrong magic, then a truncated file
mkdir -p "$d/bad" "$d/short"
printf 'not an idx file at all' | gzip > "$d/bad/train-images-idx3-ubyte.gz"
cp /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz "$d/bad/"
before_compile corrupt_magic "duet: error: corrupt IDX file $d/bad/train-images-idx3-ubyte.gz: magic 0x6e6f7420, expected 0x00000803" \
  "$DUET" run $M --data "$d/bad" --steps 1
gzip -dc /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz | head -c 100000 | gzip > "$d/short/train-images-idx3-ubyte.gz"
cp /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz /usr/share/datasets/fashion-mnist/t10k-*.gz "$d/short/"
before_compile truncated "duet: error: corrupt IDX file $d/short/train-images-idx3-ubyte.gz: file ends early (truncated)" \
  "$DUET" run $M --data "$d/short" --steps 1
# inconsistent IDX files, found before compiling from their headers and lengths:
# test labels with training images
mkdir -p "$d/mixed" "$d/long" "$d/plain" "$d/small"
cp /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz /usr/share/datasets/fashion-mnist/t10k-*.gz "$d/mixed/"
cp /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz "$d/mixed/train-labels-idx1-ubyte.gz"
before_compile idx_count_mismatch "duet: error: $d/mixed/train-images-idx3-ubyte.gz has 60000 images but $d/mixed/train-labels-idx1-ubyte.gz has 10000 labels" \
  "$DUET" run $M --data "$d/mixed" --steps 1
# bytes after the declared data (the gzip trailer's length disagrees)
cp /usr/share/datasets/fashion-mnist/*.gz "$d/long/"
{ gzip -dc /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz; printf 'x'; } | gzip > "$d/long/t10k-labels-idx1-ubyte.gz"
before_compile idx_trailing_data "duet: error: corrupt IDX file $d/long/t10k-labels-idx1-ubyte.gz: data continues after the declared size" \
  "$DUET" run $M --data "$d/long" --steps 1
# an uncompressed IDX file (zlib reads it as it is) cut short: its size disagrees
cp /usr/share/datasets/fashion-mnist/*.gz "$d/plain/"
gzip -dc /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz | head -c 5000000 > "$d/plain/t10k-images-idx3-ubyte.gz"
before_compile idx_plain_truncated "duet: error: corrupt IDX file $d/plain/t10k-images-idx3-ubyte.gz: file ends early (truncated)" \
  "$DUET" run $M --data "$d/plain" --steps 1
# images of another size than the model's input (512 images of 10x10)
{ printf '\000\000\010\003\000\000\002\000\000\000\000\012\000\000\000\012'; head -c 51200 /dev/zero; } | gzip > "$d/small/train-images-idx3-ubyte.gz"
{ printf '\000\000\010\001\000\000\002\000'; head -c 512 /dev/zero; } | gzip > "$d/small/train-labels-idx1-ubyte.gz"
cp "$d/small/train-images-idx3-ubyte.gz" "$d/small/t10k-images-idx3-ubyte.gz"
cp "$d/small/train-labels-idx1-ubyte.gz" "$d/small/t10k-labels-idx1-ubyte.gz"
before_compile idx_pixels_mismatch "duet: error: data has 100 pixels per image, the model's input takes 784" \
  "$DUET" run $M --data "$d/small" --steps 1
# a text too short for one window of block + 1 bytes (gpt_kjv: block 128)
head -c 200 data/kjv.txt > "$d/short.txt" 2>/dev/null || printf '%0200d' 0 > "$d/short.txt"
before_compile text_too_short "duet: error: $d/short.txt has 200 bytes: too short for windows of 129 bytes in both the 90% training and the 10% validation split" \
  "$DUET" run models/gpt_kjv.model --data "$d/short.txt" --steps 1
# fp16 accumulation is for CUDA devices: refused for the CPU before compiling
before_compile gemm_acc_cpu_before_compile "duet: error: --gemm-accumulate fp16 runs on CUDA devices only (cuBLAS CUBLAS_COMPUTE_16F); the cpu backend accumulates fp16 GEMMs in fp32" \
  "$DUET" run $M --gemm-accumulate fp16 --precision fp16 --steps 1
before_compile gemm_acc_cpu_stage_before_compile "duet: error: --gemm-accumulate fp16 runs on CUDA devices only (cuBLAS CUBLAS_COMPUTE_16F); the cpu backend accumulates fp16 GEMMs in fp32" \
  "$DUET" run $M --gemm-accumulate fp16 --precision fp16 --steps 1 --devices cpu:0,cpu:1
# memory: duet run on its default CPU device checks what duet plan counts against the memory available
# (DUET_HOST_MEMORY makes it machine-independent; without it, MemAvailable or the cgroup limit)
DUET_HOST_MEMORY=16MiB before_compile memory_no_fit "duet: error: the model does not fit the memory of cpu: it needs 34.16 MiB (weights 7.11, grads 0.00, optimizer state 14.22, activations 12.83 MiB), and 16.00 MiB are available (DUET_HOST_MEMORY): 19039424 bytes too many; what would help: --recompute blocks or auto, --precision fp16 (or bf16), --optimizer-state int8, more --devices (stages), --micro-batches N with --schedule 1f1b, a smaller --batch; duet plan --fit searches them" \
  "$DUET" run $M --steps 1
DUET_HOST_MEMORY=16MiB before_compile memory_no_fit_devices_cpu "duet: error: the model does not fit the memory of cpu: it needs 34.16 MiB (weights 7.11, grads 0.00, optimizer state 14.22, activations 12.83 MiB), and 16.00 MiB are available (DUET_HOST_MEMORY): 19039424 bytes too many; what would help: --recompute blocks or auto, --precision fp16 (or bf16), --optimizer-state int8, more --devices (stages), --micro-batches N with --schedule 1f1b, a smaller --batch; duet plan --fit searches them" \
  "$DUET" run $M --steps 1 --devices cpu
DUET_HOST_MEMORY=16MiB expect memory_no_fit_plan 1 "  memory: weights 7.11 MiB, grads 0.00 MiB (summed over the micro-batches), optimizer state 14.22 MiB, activations 12.83 MiB (1 micro-batch in flight x 12.83 MiB, with their gradients): 34.16 MiB of 16.00 MiB (DUET_HOST_MEMORY)  DOES NOT FIT" \
  "$DUET" plan $M
DUET_HOST_MEMORY=lots before_compile memory_bad_override "duet: error: DUET_HOST_MEMORY must be a size such as 8GiB, 512MiB or 1000000 (bytes), got 'lots'" \
  "$DUET" run $M --steps 1
DUET_HOST_MEMORY=64MiB expect memory_fits 0 "duet: trained 1 step" sh -c "'$DUET' run $M --steps 1 --no-eval --train-subset 512 --quiet | sed 's/ in .*//'"
# a model no machine holds (about 4 TiB: 0.8 TiB of weights, their gradients, Adam state, activations), against the real figure
{ printf 'model huge\ninput x: f32[batch, 784]\ninput y: i32[batch]\nparam w1: [784, 268435456] = zeros\n'
  printf 'param w2: [268435456, 10] = zeros\nloss = cross_entropy((x @ w1) @ w2, y)\ntrain {\n  batch = 8\n}\n'; } > "$d/huge.model"
out=$(DUET_CACHE_DIR="$d/cache-huge" "$DUET" run "$d/huge.model" --data /usr/share/datasets/fashion-mnist --steps 1 2>&1); rc=$?
if [ $rc -eq 1 ] && printf '%s\n' "$out" | grep -Eq '^duet: error: the model does not fit the memory of cpu: its weights alone take 813056.00 MiB \(852551008256 bytes\), more than the [0-9.]+ MiB available \((MemAvailable in /proc/meminfo|the cgroup limit in /sys/fs/cgroup/.*)\); only more --devices \(stages\) or more memory help$' &&
   ! printf '%s\n' "$out" | grep -q '^duet: kernels' && [ -z "$(ls -A "$d/cache-huge" 2>/dev/null)" ]; then
  echo "ok memory_huge_model"; pass=$((pass + 1))
else echo "FAIL memory_huge_model: exit $rc"; printf '%s\n' "$out" | head -3; fail=$((fail + 1)); fi
# a compiled executable runs duet run's checks before loading data (DUET_HOST_MEMORY: only those check it)
if "$DUET" compile $M -o "$d/exe" > /dev/null 2>&1; then
  DUET_HOST_MEMORY=16MiB expect exe_memory_no_fit 1 "duet: error: the program does not fit the memory of cpu: its memory takes 34.16 MiB (params 7.11, optimizer state 14.22, activations 12.83 MiB), and 16.00 MiB are available (DUET_HOST_MEMORY)" \
    "$d/exe" --steps 1
else echo "FAIL exe: duet compile failed"; fail=$((fail + 1)); fi
# a missing HOME is not created: the kernels are compiled without a cache, with a warning
out=$(env -u DUET_CACHE_DIR -u XDG_CACHE_HOME HOME="$no" "$DUET" run $M --steps 1 --no-eval --train-subset 512 --quiet 2>&1); rc=$?
if [ $rc -eq 0 ] && [ ! -e "$no" ] &&
   printf '%s\n' "$out" | grep -q "^duet: warning: HOME $no is not a directory (duet does not create it; set DUET_CACHE_DIR for a kernel cache); compiling the kernels in .* without caching them$"; then
  echo "ok home_missing_not_created"; pass=$((pass + 1))
else echo "FAIL home_missing_not_created: exit $rc, $no $( [ -e "$no" ] && echo exists || echo absent)"; printf '%s\n' "$out" | head -3; fail=$((fail + 1)); fi
# a damaged gzip (CRC-32 of the trailer) is an error, not silently wrong labels
mkdir -p "$d/crc"
cp /usr/share/datasets/fashion-mnist/*.gz "$d/crc/"
gzip -dc /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz | gzip > "$d/crc/l.gz"
n=$(wc -c < "$d/crc/l.gz")
{ head -c $((n - 8)) "$d/crc/l.gz"; printf '\336\255\276\357'; tail -c 4 "$d/crc/l.gz"; } > "$d/crc/train-labels-idx1-ubyte.gz"
expect corrupt_crc 1 "duet: error: corrupt IDX file $d/crc/train-labels-idx1-ubyte.gz: incorrect data check" \
  "$DUET" run $M --data "$d/crc" --steps 1
# a chain of 60 elementwise ops is split across fused kernels, never overflows one
{ printf 'model chain\ninput x: f32[batch, 784]\ninput y: i32[batch]\nparam w: [784, 10] = normal(0.01)\nh = x @ w\n'
  i=0; while [ $i -lt 60 ]; do echo 'h = relu(h * 1.001 + 0.001)'; i=$((i + 1)); done
  printf 'loss = cross_entropy(h, y)\ntrain {\n  data = fashion_mnist("/usr/share/datasets/fashion-mnist")\n  batch = 8\n}\n'; } > "$d/chain.model"
# byte-level text: the embedding the bytes index needs a row per byte value (256), not only the logits
cat > "$d/small_vocab.model" <<'EOF2'
model small_vocab
input idx: i32[batch, 8]
input targets: i32[batch, 8]
param wte: [100, 16] = normal(0.02)
param head: [16, 256] = normal(0.02)
loss = cross_entropy(embedding(wte, idx) @ head, targets)
train {
  data = text("/usr/share/common-licenses/GPL-3", block = 8)
  batch = 2
  steps = 1
}
EOF2
expect text_embedding_rows 1 "duet: error: byte-level text needs an embedding of 256 rows (one per byte value), the model's has 100" \
  "$DUET" run "$d/small_vocab.model"
expect long_chain 0 "duet: trained 2 steps" sh -c "'$DUET' run '$d/chain.model' --steps 2 --no-eval --quiet | sed 's/ in .*//'"
expect metrics_unwritable 1 "duet: error: cannot write metrics file $no/m.jsonl: No such file or directory" \
  "$DUET" run $M --steps 1 --metrics "$no/m.jsonl"
# --save is checked before training, not after it
expect save_no_dir 1 "duet: error: --save $no/x.ck: cannot write into $no: No such file or directory" \
  "$DUET" run $M --steps 1 --save "$no/x.ck"
expect save_is_dir 1 "duet: error: --save $d is a directory; give a file path" "$DUET" run $M --steps 1 --save "$d"
expect loss_scale_below_floor 1 "duet: error: --loss-scale 4 is below the floor 8 (--min-loss-scale) at which training stops" \
  "$DUET" run $M --precision fp16 --loss-scale 4 --min-loss-scale 8 --steps 1
# a dump after `precision` keeps its dtypes: --precision is refused, not ignored
"$DUET" ir $M --after precision --precision bf16 > "$d/bf16.ir"
expect dump_precision_fixed 1 "$d/bf16.ir:2:7: error: the dump was printed after \`precision\`, so its dtypes are fixed (bf16); --precision and --arch that ask for others need the .model or a dump from before \`precision\`" \
  "$DUET" run "$d/bf16.ir" --precision fp16 --steps 1
expect loss_scale_no_effect 0 "duet: warning: --loss-scale and --min-loss-scale have no effect: this program has no fp16 loss scaling" \
  "$DUET" run $M --loss-scale 4 --steps 1 --no-eval --train-subset 512
# duet compile never writes over its input
cp $M "$d/self.model"
expect compile_onto_input 1 "duet: error: -o $d/self.model names the input file; choose another output path" \
  "$DUET" compile "$d/self.model" -o "$d/self.model"
cmp -s $M "$d/self.model" && { echo "ok compile_onto_input_kept"; pass=$((pass + 1)); } ||
  { echo "FAIL compile_onto_input_kept: the input changed"; fail=$((fail + 1)); }
# flags without their value, missing required arguments, bad output paths
expect compile_o_no_value 1 "duet: error: -o needs a value (see duet compile --help)" "$DUET" compile $M -o
expect emit_target_no_value 1 "duet: error: --target needs a value (see duet emit --help)" "$DUET" emit $M --target
expect compile_no_o 1 "duet: error: no -o EXE given (the executable to write) (usage: duet compile M.model -o EXE)" \
  "$DUET" compile $M
expect sample_no_checkpoint 1 \
  "duet: error: no --checkpoint CK given (the trained weights) (usage: duet sample M.model --checkpoint CK [--prompt TEXT])" \
  "$DUET" sample models/gpt_kjv.model
expect compile_o_directory 1 "duet: error: -o $d is a directory; give the path of the executable to write" \
  "$DUET" compile $M -o "$d"
expect compile_o_missing_dir 1 "duet: error: cannot write $d/no/such/exe: No such file or directory" \
  "$DUET" compile $M -o "$d/no/such/exe"
# -o naming a FIFO or a symbolic link: refused, left as it was (the final
# rename would replace them: /dev/null became an executable once)
mkfifo "$d/fifo" && ln -s "$d/target" "$d/link" && echo keep > "$d/target"
expect compile_o_fifo 1 "duet: error: cannot write -o $d/fifo: it exists and is a FIFO, not a regular file; not replacing it" \
  "$DUET" compile $M -o "$d/fifo"
expect compile_o_symlink 1 "duet: error: cannot write -o $d/link: it exists and is a symbolic link, not a regular file; not replacing it" \
  "$DUET" compile $M -o "$d/link"
[ -p "$d/fifo" ] && [ -L "$d/link" ] && [ "$(cat "$d/target")" = keep ] && { echo "ok compile_o_special_kept"; pass=$((pass + 1)); } ||
  { echo "FAIL compile_o_special_kept"; fail=$((fail + 1)); }
# -o "-" (its temporaries used to reach cc as options) and a 250-character
# name (its temporaries used to pass NAME_MAX): written, and they run
mkdir -p "$d/dash" && long=$(printf 'e%.0s' $(seq 250))
case $DUET in /*) adu=$DUET ;; *) adu=$PWD/$DUET ;; esac
(cd "$d/dash" && "$adu" compile "$OLDPWD/$M" -o - > /dev/null 2>&1) && "$d/dash/-" --help | grep -q "^usage" &&
  "$DUET" compile $M -o "$d/dash/$long" > /dev/null 2>&1 && "$d/dash/$long" --help | grep -q "^usage" &&
  [ "$(ls -A "$d/dash" | wc -l)" -eq 2 ] && { echo "ok compile_o_dash_and_long_name"; pass=$((pass + 1)); } ||
  { echo "FAIL compile_o_dash_and_long_name: $(ls -A "$d/dash" | head -3)"; fail=$((fail + 1)); }
# duet run's flags: --steps wins over --epochs in either order; checked values
"$DUET" run $M --steps 2 --epochs 3 --no-eval --train-subset 1024 > "$d/se.out" 2>&1 &&
  grep -q '^duet: trained 2 steps' "$d/se.out" && { echo "ok steps_then_epochs"; pass=$((pass + 1)); } ||
  { echo "FAIL steps_then_epochs: $(tail -1 "$d/se.out")"; fail=$((fail + 1)); }
expect save_every_without_save 1 "duet: error: --save-every needs --save PATH (where to write the checkpoints)" \
  "$DUET" run $M --save-every 2 --steps 1
expect loss_scale_huge 1 "duet: error: --loss-scale expects a number > 0 and at most 3.40282e+38 (the largest float), got '1e300'" \
  "$DUET" run $M --precision fp16 --loss-scale 1e300
expect min_loss_scale_above_default 1 \
  "duet: error: --min-loss-scale 1e+09 is above the default initial loss scale 65536; give --loss-scale too" \
  "$DUET" run $M --precision fp16 --min-loss-scale 1e9
expect run_directory 1 "$d: error: this is a directory, not a .model file" "$DUET" run "$d"
# --threads above the cap is an error that names it, in duet run and in the commands that plan
expect threads_above_cap 1 "duet: error: --threads expects an integer from 1 to 1024, got '1025'" "$DUET" run $M --threads 1025 --steps 1
expect threads_above_cap_plan 1 "duet: error: --threads expects an integer from 1 to 1024, got '5000'" "$DUET" plan $M --devices cpu:0,cpu:1 --threads 5000
expect threads_compile_no_devices 1 "duet: error: --threads expects an integer from 1 to 1024, got 'abc'" "$DUET" compile $M -o "$d/exe_threads" --threads abc
expect threads_at_cap 0 "duet: trained 1 step" sh -c "'$DUET' run $M --threads 1024 --steps 1 --no-eval --train-subset 512 --quiet | sed 's/ in .*//'"
expect no_eval_value 1 "duet: error: --no-eval takes no value" "$DUET" run $M --no-eval=1
w=$("$DUET" run $M --train-subset 1000000 --steps 1 --no-eval 2>&1 >/dev/null | grep warning)
[ "$w" = "duet: warning: --train-subset 1000000 exceeds the 60000 training samples; using all" ] &&
  { echo "ok train_subset_too_large"; pass=$((pass + 1)); } || { echo "FAIL train_subset_too_large: $w"; fail=$((fail + 1)); }
# flags that do not apply to the program: a warning
w=$("$DUET" run $M --eval-every 5 --steps 1 --no-eval --train-subset 512 2>&1 >/dev/null | grep warning)
[ "$w" = "duet: warning: --eval-every and --eval-batches apply to text models; this one evaluates on its test split after every epoch" ] &&
  { echo "ok eval_every_on_images"; pass=$((pass + 1)); } || { echo "FAIL eval_every_on_images: $w"; fail=$((fail + 1)); }
w=$("$DUET" run $M --schedule 1f1b --steps 1 --no-eval --train-subset 512 2>&1 >/dev/null | grep warning)
[ "$w" = "duet: warning: --schedule has no effect without a pipeline (--devices with several items, or --micro-batches)" ] &&
  { echo "ok schedule_without_pipeline"; pass=$((pass + 1)); } || { echo "FAIL schedule_without_pipeline: $w"; fail=$((fail + 1)); }
# a C compiler that fails: its exit status and message in the error
printf '#!/bin/sh\necho "badcc: broken installation" >&2\nexit 3\n' > "$d/badcc"
chmod +x "$d/badcc"
DUET_CC="$d/badcc" DUET_CACHE_DIR="$d/cc-cache" expect bad_cc 1 \
  "duet: error: cannot run the C compiler '$d/badcc' (exit status 3: badcc: broken installation; set DUET_CC, or install gcc: apt-get install gcc)" \
  "$DUET" run $M --steps 1
# progress (stdout) and the error (stderr) in the order they happened, through one pipe
"$DUET" run $M --precision fp16 --loss-scale 1073741824 --min-loss-scale 536870912 --steps 5 --train-subset 2560 \
  --no-eval 2>&1 | grep -E '^step 1: gradient overflow|^duet: error: the loss scale fell' | cut -c1-20 > "$d/order"
printf 'step 1: gradient ove\nduet: error: the los\n' | cmp -s - "$d/order" && { echo "ok output_order"; pass=$((pass + 1)); } ||
  { echo "FAIL output_order: $(cat "$d/order")"; fail=$((fail + 1)); }
# an unusable kernel cache directory: a warning, the kernels compiled in a temporary directory
if DUET_CACHE_DIR=/proc/duet-cache "$DUET" run $M --steps 1 --no-eval --train-subset 512 > "$d/nc.out" 2>&1 &&
   grep -q "^duet: warning: cannot create kernel cache directory /proc/duet-cache: .*; compiling the kernels in .* without caching them$" "$d/nc.out" &&
   grep -q '^duet: trained 1 step ' "$d/nc.out"; then echo "ok cache_unusable_falls_back"; pass=$((pass + 1))
else echo "FAIL cache_unusable_falls_back"; cat "$d/nc.out"; fail=$((fail + 1)); fi
# learning-rate schedules and clipping: bad values (the run's length and
# rate are known once the data is: after compiling)
expect bad_lr_schedule 1 "duet: error: --lr-schedule expects constant, cosine or linear, got 'cosin'" \
  "$DUET" run $M --lr-schedule cosin
expect negative_warmup 1 "duet: error: --warmup expects an integer >= 0, got '-3'" "$DUET" run $M --warmup -3
expect negative_min_lr 1 "duet: error: --min-lr expects a number >= 0, got '-1e-5'" "$DUET" run $M --min-lr -1e-5
expect zero_clip 1 "duet: error: --clip-grad-norm expects a number > 0 (the largest global L2 norm of the gradients), got '0'" \
  "$DUET" run $M --clip-grad-norm 0
expect negative_clip 1 "duet: error: --clip-grad-norm expects a number > 0 (the largest global L2 norm of the gradients), got '-1'" \
  "$DUET" run $M --clip-grad-norm -1
expect warmup_longer_than_run 1 "duet: error: the warm-up (--warmup 11) is longer than the run (10 steps)" \
  "$DUET" run $M --steps 10 --warmup 11 --lr-schedule cosine --train-subset 2560
expect min_lr_above_lr 1 "duet: error: --min-lr 0.01 is above the learning rate 0.001 (--lr): the cosine schedule decays from --lr down to --min-lr" \
  "$DUET" run $M --steps 10 --lr-schedule cosine --min-lr 0.01 --train-subset 2560
expect clip_with_zero 1 "duet: error: --clip-grad-norm with --zero 1 is not supported yet: each replica holds the summed gradients of its own shard only (train without --zero, or without clipping)" \
  "$DUET" run $M --data-parallel 2 --zero 1 --clip-grad-norm 1 --steps 1 --train-subset 2560 --no-eval
expect lr_schedule_line 0 "duet: lr schedule: linear to 1e-05 after warmup 2 over 4 steps (peak 0.001); gradients clipped to global norm 1" \
  "$DUET" run $M --steps 4 --lr-schedule linear --warmup 2 --min-lr 1e-5 --clip-grad-norm 1 --train-subset 1024 --no-eval
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
