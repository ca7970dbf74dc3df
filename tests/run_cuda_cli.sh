#!/bin/sh
# The CUDA backend's command-line behaviour on a machine without a GPU
# (CI): device selection errors, `duet devices`, and, through the toolkit's
# libcuda stub (whose cuInit fails with CUDA_ERROR_STUB_LIBRARY = 34), the
# whole path duet -> dlopen(libduet_cuda.so) -> driver call, for `duet run`
# and for an executable written by `duet compile`.
# usage: run_cuda_cli.sh path/to/duet have_cuda(0|1)   (from the repository root)
DUET=${1:?usage: run_cuda_cli.sh path/to/duet have_cuda}
HAVE_CUDA=${2:-0}
M=models/fmnist_mlp.model
pass=0 fail=0
# a part this machine cannot check: the run ends with exit 77 (ctest: skipped)
skipped=0
skip() { echo "skip: $*"; skipped=$((skipped + 1)); }
expect() { # name want_rc want_text command...
  name=$1 want_rc=$2 want=$3; shift 3
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" = "$want_rc" ] && printf '%s\n' "$out" | grep -qxF -- "$want"; then
    echo "ok $name"; pass=$((pass + 1))
  else
    echo "FAIL $name: exit $rc (want $want_rc), output:"; printf '%s\n' "$out" | head -10
    echo "  wanted the line: $want"; fail=$((fail + 1))
  fi
}
expect bad_device 1 "duet: error: --devices: bad item 'tpu' (expected cpu, cpu:N, cuda, cuda:N, or a capacity such as 16GiB:sm_60 or 2x16GiB:sm_60)" "$DUET" run $M --devices tpu --steps 1
expect bad_ordinal 1 "duet: error: --devices: bad item 'cuda:x' (expected cpu, cpu:N, cuda, cuda:N, or a capacity such as 16GiB:sm_60 or 2x16GiB:sm_60)" "$DUET" run $M --devices cuda:x
expect devices_cpu 0 "cpu     $(nproc) cores (OpenMP kernels, OpenBLAS GEMMs)" "$DUET" devices
expect devices_args 1 "duet: error: unexpected argument 'x' (see duet devices --help)" "$DUET" devices x
# --gemm-accumulate fp16: opt-in, fp16 GEMMs only, CUDA devices only, reported by duet plan
expect gemm_acc_value 1 "duet: error: unknown --gemm-accumulate \`fp8\` (fp32, fp16)" "$DUET" run $M --gemm-accumulate fp8
expect gemm_acc_no_fp16 1 "duet: error: --gemm-accumulate fp16 needs fp16 GEMMs (--precision fp16); this program has none" \
  "$DUET" run $M --gemm-accumulate fp16 --steps 1
expect gemm_acc_cpu 1 "duet: error: --gemm-accumulate fp16 runs on CUDA devices only (cuBLAS CUBLAS_COMPUTE_16F); the cpu backend accumulates fp16 GEMMs in fp32" \
  "$DUET" run $M --gemm-accumulate fp16 --precision fp16 --steps 1
expect gemm_acc_plan 0 "gemm accumulate: fp16 (--gemm-accumulate fp16: fp16 GEMMs use cuBLAS CUBLAS_COMPUTE_16F, about 2x the fp32-accumulate rate on sm_60, partial sums rounded to fp16; CUDA devices only)" \
  "$DUET" plan $M --devices 16GiB:sm_60 --precision fp16 --gemm-accumulate fp16
expect gemm_acc_plan_no_fp16 1 "duet: error: --gemm-accumulate fp16 needs fp16 GEMMs (--precision fp16); this program has none" \
  "$DUET" plan $M --gemm-accumulate fp16
# ir, emit and check refuse it the same way (before printing anything); ir also after a pass before precision
for cmd in "emit $M" "emit $M --target cuda" "ir $M" "ir $M --after memplan" "check $M"; do
  # shellcheck disable=SC2086 # $cmd is words
  expect "gemm_acc_no_fp16 ($cmd)" 1 "duet: error: --gemm-accumulate fp16 needs fp16 GEMMs (--precision fp16); this program has none" \
    "$DUET" $cmd --gemm-accumulate fp16
  # shellcheck disable=SC2086
  if [ -z "$("$DUET" $cmd --gemm-accumulate fp16 2>/dev/null)" ]; then echo "ok gemm_acc_no_output ($cmd)"; pass=$((pass + 1))
  else echo "FAIL gemm_acc_no_output ($cmd): printed on stdout before the error"; fail=$((fail + 1)); fi
done
expect gemm_acc_ir_fp16 0 "after shape" "$DUET" ir $M --precision fp16 --gemm-accumulate fp16
expect gemm_acc_emit_fp16 0 "#include <math.h>" "$DUET" emit $M --precision fp16 --gemm-accumulate fp16
expect gemm_acc_plan_default 0 "gemm accumulate: fp32 (16-bit GEMMs: 16-bit inputs, fp32 accumulation)" \
  "$DUET" plan $M --devices 16GiB:sm_60

if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  skip "a CUDA driver is installed: the no-driver checks (the gpu-labelled tests cover it)"
else
  expect no_driver 1 "duet: error: no CUDA driver on this machine (libcuda.so.1: cannot open shared object file: No such file or directory)" \
    "$DUET" run $M --devices cuda --steps 1
  # checked before the C kernels of the CPU stage are compiled: no "duet: kernels" line
  expect no_driver_mixed 1 "duet: error: no CUDA driver on this machine (libcuda.so.1: cannot open shared object file: No such file or directory)" \
    "$DUET" run $M --devices cpu:0,cuda:0 --steps 1
  if "$DUET" run $M --devices cpu:0,cuda:0 --steps 1 2>&1 | grep -q '^duet: kernels'; then
    echo "FAIL no_driver_before_compile: the kernels were compiled first"; fail=$((fail + 1))
  else echo "ok no_driver_before_compile"; pass=$((pass + 1)); fi
  expect devices_no_driver 0 "cuda    none: no CUDA driver on this machine (libcuda.so.1: cannot open shared object file: No such file or directory)" \
    "$DUET" devices
  # an executable compiled for GPUs keeps them as its default devices
  if "$DUET" compile $M -o "${TMPDIR:-/tmp}/duet-cudaexe.$$" --devices cuda:0,cuda:1 > /dev/null; then
    expect compiled_default_devices 1 "duet: error: no CUDA driver on this machine (libcuda.so.1: cannot open shared object file: No such file or directory)" \
      "${TMPDIR:-/tmp}/duet-cudaexe.$$" --steps 1
    rm -f "${TMPDIR:-/tmp}/duet-cudaexe.$$"
  else
    echo "FAIL duet compile --devices cuda:0,cuda:1"; fail=$((fail + 1))
  fi
  STUB=/usr/local/cuda/lib64/stubs/libcuda.so
  if [ "$HAVE_CUDA" = 1 ] && [ -f "$STUB" ]; then
    tmp=$(mktemp -d) || exit 1
    trap 'rm -rf "$tmp"' EXIT
    ln -s "$STUB" "$tmp/libcuda.so.1"
    expect stub_run 1 "duet: error: cuInit(0) failed: unknown CUDA error (CUresult 34)" \
      env LD_LIBRARY_PATH="$tmp" "$DUET" run $M --devices cuda:0 --steps 1
    # 16-bit programs reach the plugin too (CUDA kernels for fp16 and bf16)
    expect stub_run_fp16 1 "duet: error: cuInit(0) failed: unknown CUDA error (CUresult 34)" \
      env LD_LIBRARY_PATH="$tmp" "$DUET" run $M --devices cuda:0 --precision fp16 --gemm-accumulate fp16 --steps 1
    expect stub_run_bf16 1 "duet: error: cuInit(0) failed: unknown CUDA error (CUresult 34)" \
      env LD_LIBRARY_PATH="$tmp" "$DUET" run $M --devices cuda:0 --precision bf16 --steps 1
    expect stub_run_mixed 1 "duet: error: cuInit(0) failed: unknown CUDA error (CUresult 34)" \
      env LD_LIBRARY_PATH="$tmp" "$DUET" run $M --devices cpu:0,cuda:0 --steps 1
    if env LD_LIBRARY_PATH="$tmp" "$DUET" run $M --devices cpu:0,cuda:0 --steps 1 2>&1 | grep -q '^duet: kernels'; then
      echo "FAIL stub_before_compile: the kernels were compiled first"; fail=$((fail + 1))
    else echo "ok stub_before_compile"; pass=$((pass + 1)); fi
    expect stub_devices 0 "cuda    none: cuInit failed: unknown CUDA error (CUresult 34)" \
      env LD_LIBRARY_PATH="$tmp" "$DUET" devices
    expect plugin_env_missing 1 "duet: error: DUET_CUDA_PLUGIN=$tmp/nosuch.so cannot be loaded: $tmp/nosuch.so: cannot open shared object file: No such file or directory" \
      env LD_LIBRARY_PATH="$tmp" DUET_CUDA_PLUGIN="$tmp/nosuch.so" "$DUET" run $M --devices cuda --steps 1
    expect plugin_env_foreign 1 "duet: error: DUET_CUDA_PLUGIN=$STUB is not a compatible duet CUDA plugin" \
      env LD_LIBRARY_PATH="$tmp" DUET_CUDA_PLUGIN="$STUB" "$DUET" run $M --devices cuda --steps 1
    if "$DUET" compile $M -o "$tmp/mlp" > /dev/null; then
      expect stub_compiled 1 "duet: error: cuInit(0) failed: unknown CUDA error (CUresult 34)" \
        env LD_LIBRARY_PATH="$tmp" "$tmp/mlp" --devices cuda --steps 1
    else
      echo "FAIL duet compile"; fail=$((fail + 1))
    fi
  else
    skip "no CUDA plugin or libcuda stub: the checks through the stub"
  fi
fi
echo "$pass passed, $fail failed, $skipped parts skipped"
[ $fail -eq 0 ] || exit 1
if [ "$skipped" -gt 0 ]; then
  echo "$skipped parts were skipped (above): reported as skipped (exit 77), not passed"
  exit 77
fi
