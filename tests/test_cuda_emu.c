/* tests/test_cuda_emu.c: the generated CUDA C runs correctly, checked
 * without a GPU.  Each program's CUDA source is compiled as C++ for the host
 * behind tests/cuda_emu/cuda_emu.h (a fiber per CUDA thread; __syncthreads
 * and warp shuffles as barriers), launched with the emitter's block sizes
 * (up to 1024 threads) and grids (grid-stride kernels: the whole grid up
 * to 65,536 threads, fewer blocks beyond, which also checks their loops
 * with a smaller grid: cuda_emu_grid), GEMMs by a plain triple loop.  The
 * emulator runs the blocks in a random order and releases the threads
 * at each barrier in a random order, from a seed printed first
 * (DUET_EMU_SEED=N replays a run), and fills shared memory at the start of
 * every block with bytes 0xff (NaN), so that an output that depends on
 * the order, on uninitialised shared memory or on what another block left
 * shows; the `emulator` part proves each of these bites with deliberately
 * wrong kernels (check_emulator).  (The emulated device's allocations are
 * zeroed, as DuetDeviceOps.alloc promises and the CUDA plugin does over
 * the fake GPU's NaN-filled cuMemAlloc.)  The same program runs on the CPU
 * backend.  Every kernel and GEMM is checked alone: the device is wrapped
 * by lockstep_device (tests/test_util.h), which runs the C kernel of the
 * same index on a copy of the memory the emulated kernel started from and
 * bounds the difference by what the two evaluations' f32 order (and, for
 * a 16-bit result, one flip) allows, and the GEMMs against the exact
 * product.  After forward + backward, after evaluation (metrics) and after
 * one AdamW step (with eps = lr: see run_case; 8-bit AdamW state: two
 * steps, its adamw8 kernels bit for bit in lockstep) every tensor must agree
 * (compare_sessions_stats: f32 and f64 elementwise; in 16-bit programs
 * normwise within 2 (D u16 + 2^-17) of the tensor's largest magnitude, D
 * its roundings to 16 bits: tmodel_session_tol16); each case prints the
 * largest fraction of its bounds used.  --perturb KIND REL multiplies one
 * kernel's outputs by 1 + REL (ctest cuda_emu_catches_*: must fail).
 * Covers every op case of tests/op_cases.h in f32 and f64,
 * tests/models/gpt_tiny.model, int8 weights (--quantize: the dequantize
 * kernels, evaluation only, f32 and fp16), int8 activations (--calibrate:
 * the int8 GEMM, its calibration and its int8 path, outputs bit for bit,
 * with __dp4a and with the sm_60 loop), a two-layer GPT with dropout under
 * activation recomputation (gpt_mini_recompute) and six of the larger
 * cases (multi-block paths) in f32; decoding (attention_decode with
 * key/value caches, rope at the step's position, grouped-query caches) of
 * gpt_tiny and llama_tiny, 6 tokens, each step against the C backend; the
 * rope case at decoding position 7; ten op cases, a one-layer LLaMA, a one-layer
 * GPT and a forced gradient overflow with 16-bit storage (--precision fp16
 * with loss scaling, bf16), where GEMMs are emulated as the CPU computes
 * them (16-bit operands, a wide sum, one rounding) and the loss scale and
 * skipped steps must match; it prints how many 16-bit elements are
 * bit-identical.  In fp16, every kernel that takes the half2 path also
 * runs alone on random bits (specials included) on both backends and must
 * write the same bits (check_half2_kernels; half2_ops covers each half2
 * operation).  First, the CUDA prelude's fp16/bf16 conversions against
 * runtime/duet_half.h, bit for bit, and its half2 helpers (emulated f16x2
 * instructions, and the f32-lane version of sm_61 and below sm_53)
 * against the C kernels' arithmetic.  This checks the kernels' logic
 * (indices, reductions, barriers), not the CUDA driver path or the real
 * hardware (README, "CUDA backend", lists what the emulator cannot
 * model): the gpu-labelled tests do that.  Exits 77 when no C++ compiler
 * is installed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/duet_half.h"
#include "cuda_emu/cuda_emu_source.h"
#include "cuda_emu/cuda_emu_traps.h"
#include "op_cases.h"
#include "scale_cases.h"
#include "test_util.h"

typedef void (*EmuKernel)(void *const *t, const double *s);
typedef int (*EmuLaunch)(EmuKernel fn, unsigned grid, unsigned block, void *const *t, const double *s);
typedef int (*EmuLaunchEx)(EmuKernel fn, unsigned grid, unsigned block, unsigned shared, void *const *t,
                           const double *s);

typedef struct Emu {
  void *handle;
  EmuLaunch launch;
  EmuLaunchEx launch_ex; /* with the dynamic shared memory the launch asks for */
  EmuKernel *fn; /* per kernel: its function, called with the kernel's arguments */
  EmuKernel acc; /* duet_accumulate_f32 */
  const DuetLaunch *cfg;
  const Kernel *kernels;
  const DuetProgram *p;
  int n;
  int perturb_k; /* --perturb: this kernel's outputs times 1 + perturb_rel after every launch (-1: none) */
  double perturb_rel;
} Emu;

/* --perturb KIND REL: the first kernel of KIND (tests/test_util.c's
 * kernel_kind_name; KIND/16: the first of them with a 16-bit buffer among
 * its outputs) in each program, its outputs multiplied by 1 + REL after
 * every launch (16-bit outputs rounded again): the checks must catch it
 * (ctest cuda_emu_catches_*). */
static const char *perturb_kind;
static double perturb_rel;
/* The decoding position s[POS] both sessions of run_case run at (rope
 * turns row t by the angles of position run_pos + t; 0 when training). */
static int64_t run_pos;
/* When > 0: run_case compiles the model for decoding (batch 1, key/value
 * caches) and runs this many steps, one token each at positions 0, 1, ...,
 * instead of a training step. */
static int run_decode;
/* When set: run_case compiles the model with --quantize run_quantize (int8
 * weights: an evaluation program) and runs only the evaluation. */
static const char *run_quantize;
/* With run_quantize: int8 activations too (--calibrate: the int8 GEMMs).
 * run_case then calibrates both sessions on their first batch (the GEMMs'
 * f32 path and -max|x|, which must be the same bits), sets the scales
 * max|x| / 127, evaluates (the int8 path) and requires the logits bit for
 * bit equal.  emu_no_dp4a: the emulated source is compiled with
 * DUET_NO_DP4A (the sm_60 path: four multiplies instead of __dp4a). */
static bool run_calibrate, emu_no_dp4a;
/* When > 0: run_case compiles the model with --prune-mode channels --prune
 * run_shrink --shrink (passes/shrink.c: an evaluation program with smaller
 * layers) and runs only the evaluation. */
static double run_shrink;

/* Whether kernel K writes its buffer b: a stored buffer (elementwise), or
 * its last one. */
static bool kernel_writes(const Kernel *K, int b) {
  bool out = K->kind != KK_ELEMENTWISE && b == K->n_bufs - 1;
  for (int i = 0; K->kind == KK_ELEMENTWISE && i < K->n_ins; i++) out |= K->ins[i].op == KI_STORE && K->ins[i].a == b;
  return out;
}

/* Multiplies the tensors kernel k wrote by 1 + perturb_rel. */
static void perturb_outputs(const Emu *e, int k, void *const *t) {
  const Kernel *K = &e->kernels[k];
  for (int b = 0; b < K->n_bufs; b++) {
    bool out = kernel_writes(K, b);
    bool dup = false; /* a buffer listed twice */
    for (int c = 0; c < b; c++) dup |= K->bufs[c].tensor == K->bufs[b].tensor;
    if (!out || dup) continue;
    const DuetTensor *tt = &e->p->tensors[K->bufs[b].tensor];
    void *x = t[K->bufs[b].tensor];
    double f = 1 + e->perturb_rel;
    if (tt->dtype == DUET_F32)
      for (int64_t i = 0; i < tt->nbytes / 4; i++) ((float *)x)[i] = (float)(((float *)x)[i] * f);
    else if (tt->dtype == DUET_F64)
      for (int64_t i = 0; i < tt->nbytes / 8; i++) ((double *)x)[i] *= f;
    else if (tt->dtype == DUET_F16)
      for (int64_t i = 0; i < tt->nbytes / 2; i++)
        ((uint16_t *)x)[i] = duet_f16_from_f32((float)(duet_f32_from_f16(((uint16_t *)x)[i]) * f));
    else if (tt->dtype == DUET_BF16)
      for (int64_t i = 0; i < tt->nbytes / 2; i++)
        ((uint16_t *)x)[i] = duet_bf16_from_f32((float)(duet_f32_from_bf16(((uint16_t *)x)[i]) * f));
  }
}

/* Kernels whose grid is part of their indexing (a block per tile, per
 * query row, per (batch, head)) get the emitter's grid; every other kind
 * loops grid-stride and gets the emitter's grid up to
 * CUDA_EMU_FULL_THREADS threads, fewer blocks beyond (cuda_emu_grid). */
static unsigned emu_grid(const Kernel *k, unsigned grid, unsigned block) {
  switch (k->kind) {
  case KK_TRANSPOSE: case KK_ATTN_FWD: case KK_ATTN_BWD: case KK_ATTN_BWD_KV: case KK_ATTN_DECODE: return grid;
  default: return cuda_emu_grid(grid, block, 1);
  }
}

/* The schedule's seed (cuda_emu_seed), printed by main; every emulated
 * module starts from it. */
static unsigned long long emu_seed_value;

static const char *cxx;

static void *emu_alloc(DuetDevice *d, size_t bytes) {
  (void)d;
  size_t n = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, n ? n : 64);
  if (p) memset(p, 0, n ? n : 64);
  return p;
}
static void emu_free(DuetDevice *d, void *p) {
  (void)d;
  free(p);
}
static int emu_copy(DuetDevice *d, void *dst, const void *src, size_t n) {
  (void)d;
  memcpy(dst, src, n);
  return 0;
}
static int emu_launch_op(DuetDevice *d, int k, void *const *t, const double *s) {
  Emu *e = d->ctx;
  unsigned block = e->cfg[k].block;
  if (e->cfg[k].shared > sizeof(double) << 17) {
    snprintf(d->err, sizeof d->err, "kernel %d: %u bytes of shared memory exceed the emulator's", k, e->cfg[k].shared);
    return -1;
  }
  /* the kernel's arguments from the tensor table, as the CUDA plugin picks them */
  const DuetProgram *p = e->p;
  void *a[DUET_MAX_KERNEL_ARGS] = {0};
  duet_kernel_argv(p->kernel_arg_off, p->kernel_args, p->n_tensors, k, t, a);
  if (e->launch_ex(e->fn[k], emu_grid(&e->kernels[k], e->cfg[k].grid, block), block, e->cfg[k].shared, a, s)) {
    snprintf(d->err, sizeof d->err, "emulated launch of kernel %d failed", k);
    return -1;
  }
  if (k == e->perturb_k) perturb_outputs(e, k, t);
  return 0;
}
static double emu_ld(const void *p, int64_t i, int dtype) {
  switch (dtype) {
  case DUET_F64: return ((const double *)p)[i];
  case DUET_F16: return duet_f32_from_f16(((const uint16_t *)p)[i]);
  case DUET_BF16: return duet_f32_from_bf16(((const uint16_t *)p)[i]);
  default: return ((const float *)p)[i];
  }
}

/* row-major C[m,n] = op(A) op(B), accumulated in double; 16-bit operands
 * widened exactly, the result rounded to f32 and then to 16 bits (the CPU
 * backend: sgemm on the widened operands, then narrowed) */
static int emu_gemm(DuetDevice *d, const DuetStep *st, void *const *t) {
  (void)d;
  bool f64 = st->dtype == DUET_F64;
  if (st->dtype == DUET_F16 || st->dtype == DUET_BF16) {
    for (int64_t i = 0; i < st->m; i++)
      for (int64_t j = 0; j < st->n; j++) {
        double acc = 0;
        for (int64_t k = 0; k < st->k; k++) {
          int64_t ia = st->ta ? k * st->m + i : i * st->k + k, ib = st->tb ? j * st->k + k : k * st->n + j;
          acc += emu_ld(t[st->a], ia, st->dtype) * emu_ld(t[st->b], ib, st->dtype);
        }
        ((uint16_t *)t[st->c])[i * st->n + j] =
            st->dtype == DUET_F16 ? duet_f16_from_f32((float)acc) : duet_bf16_from_f32((float)acc);
      }
    return 0;
  }
  for (int64_t i = 0; i < st->m; i++)
    for (int64_t j = 0; j < st->n; j++) {
      double acc = 0;
      for (int64_t k = 0; k < st->k; k++) {
        int64_t ia = st->ta ? k * st->m + i : i * st->k + k, ib = st->tb ? j * st->k + k : k * st->n + j;
        double a = f64 ? ((double *)t[st->a])[ia] : ((float *)t[st->a])[ia];
        double b = f64 ? ((double *)t[st->b])[ib] : ((float *)t[st->b])[ib];
        acc += a * b;
      }
      if (f64) ((double *)t[st->c])[i * st->n + j] = acc;
      else ((float *)t[st->c])[i * st->n + j] = (float)acc;
    }
  return 0;
}
static int emu_sync(DuetDevice *d) {
  (void)d;
  return 0;
}
static void emu_destroy(DuetDevice *d) { free(d); }
static const DuetDeviceOps emu_ops = {
    .api_version = DUET_RT_API_VERSION, .name = "cuda-emu", .alloc = emu_alloc, .free = emu_free,
    .copy_to_device = emu_copy, .copy_to_host = emu_copy, .launch = emu_launch_op, .gemm = emu_gemm,
    .sync = emu_sync, .destroy = emu_destroy,
};

/* writes the CUDA source behind the emulation header, with a host entry
 * point emu_call_k<f>(args, s) per function that passes the arguments and
 * the scalars by value as duet_args and duet_scalars; compiles, loads; kernel i calls function fn_of[i] */
static int emu_build(Emu *e, const char *cuda, const int32_t *fn_of, int n_fns, const DuetLaunch *cfg, int n,
                     const char *dir) {
  char src[1200], so[1200], log[16384];
  snprintf(src, sizeof src, "%s/k.cpp", dir);
  snprintf(so, sizeof so, "%s/k.so", dir);
  FILE *f = fopen(src, "w");
  if (!f) return -1;
  if (cuda_emu_write_source(f, cuda)) {
    fclose(f);
    return -1;
  }
  /* the runtime's accumulate kernels: t = {a, b}, s = {n, first} */
  fprintf(f, "extern \"C\" void emu_call_acc(void *const *t, const double *s) {\n"
             "  duet_accumulate_f32((float *)t[0], (const float *)t[1], (duet_i64)s[0], (int)s[1]);\n}\n");
  for (int i = 0; i < n_fns; i++)
    fprintf(f, "extern \"C\" void emu_call_k%d(void *const *t, const double *s) {\n"
               "  duet_args a;\n  for (int j = 0; j < %d; j++) a.p[j] = t[j];\n"
               "  duet_scalars sv;\n  for (int j = 0; j < %d; j++) sv.v[j] = s[j];\n  duet_k%d(a, sv);\n}\n",
            i, DUET_MAX_KERNEL_ARGS, DUET_S_COUNT, i);
  if (fclose(f)) return -1;
  char inc[1200];
  snprintf(inc, sizeof inc, "-I%s/tests/cuda_emu", DUET_SOURCE_DIR);
  char *argv[] = {(char *)cxx, "-std=c++17", "-O0", "-w", "-shared", "-fPIC", "-pthread", inc, "-o", so, src, NULL};
  int rc = jit_run(argv, log, sizeof log);
  if (rc) {
    fprintf(stderr, "%s failed (%d):\n%s\n", cxx, rc, log);
    return -1;
  }
  e->handle = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!e->handle) {
    fprintf(stderr, "dlopen %s: %s\n", so, dlerror());
    return -1;
  }
  e->launch = (EmuLaunch)dlsym(e->handle, "emu_launch");
  e->launch_ex = (EmuLaunchEx)dlsym(e->handle, "emu_launch_ex");
  void (*seed)(unsigned long long) = (void (*)(unsigned long long))dlsym(e->handle, "emu_seed");
  if (seed) seed(emu_seed_value);
  e->acc = (EmuKernel)dlsym(e->handle, "emu_call_acc");
  e->fn = calloc((size_t)(n ? n : 1), sizeof *e->fn);
  e->cfg = cfg;
  e->n = n;
  for (int i = 0; i < n; i++) {
    char nm[32];
    snprintf(nm, sizeof nm, "emu_call_k%d", fn_of[i]);
    if (fn_of[i] < 0 || fn_of[i] >= n_fns || !(e->fn[i] = (EmuKernel)dlsym(e->handle, nm))) {
      fprintf(stderr, "no %s in the emulated module\n", nm);
      return -1;
    }
  }
  return e->launch && e->launch_ex && seed ? 0 : -1;
}

/* The CUDA prelude's conversions (compiled for the host behind
 * cuda_emu.h) against runtime/duet_half.h, bit for bit: every f16 and bf16
 * pattern widened, and f32 -> f16/bf16 for every 16-bit pattern's
 * neighbourhood (the value, +-1 and +-0x1000 in the bits: ties, rounding
 * boundaries, subnormals, overflow to inf, NaN payloads) plus a stride of
 * 2^32 / 7919. */
static int check_conversions(const char *dir) {
  char src[1200], so[1200], log[16384];
  snprintf(src, sizeof src, "%s/conv.cpp", dir);
  snprintf(so, sizeof so, "%s/conv.so", dir);
  FILE *f = fopen(src, "w");
  if (!f) return 1;
  fprintf(f, "#include \"cuda_emu.h\"\ntypedef unsigned int duet_u32;\n%s\n", codegen_cuda_half_prelude());
  fprintf(f, "extern \"C\" unsigned short conv_f16(float x) { return duet_f16_from_f32(x); }\n"
             "extern \"C\" unsigned short conv_bf16(float x) { return duet_bf16_from_f32(x); }\n"
             "extern \"C\" float wide_f16(unsigned short h) { return duet_f32_from_f16(h); }\n"
             "extern \"C\" float wide_bf16(unsigned short h) { return duet_f32_from_bf16(h); }\n"
             "EmuDim threadIdx, blockIdx, blockDim, gridDim;\n"
             "int emu_sync_or_word;\n");
  if (fclose(f)) return 1;
  char inc[1200];
  snprintf(inc, sizeof inc, "-I%s/tests/cuda_emu", DUET_SOURCE_DIR);
  char *argv[] = {(char *)cxx, "-std=c++17", "-O1", "-w", "-shared", "-fPIC", "-pthread", inc, "-o", so, src, NULL};
  if (jit_run(argv, log, sizeof log)) {
    fprintf(stderr, "FAIL conversions: %s failed:\n%s\n", cxx, log);
    return 1;
  }
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "FAIL conversions: dlopen %s: %s\n", so, dlerror());
    return 1;
  }
  uint16_t (*n16)(float) = (uint16_t(*)(float))dlsym(h, "conv_f16");
  uint16_t (*nb16)(float) = (uint16_t(*)(float))dlsym(h, "conv_bf16");
  float (*w16)(uint16_t) = (float (*)(uint16_t))dlsym(h, "wide_f16");
  float (*wb16)(uint16_t) = (float (*)(uint16_t))dlsym(h, "wide_bf16");
  int bad = 0;
  long long checked = 0;
  if (!n16 || !nb16 || !w16 || !wb16) bad = 1;
  for (uint32_t v = 0; v < 65536 && !bad; v++) {
    float a = w16((uint16_t)v), b = duet_f32_from_f16((uint16_t)v);
    float c = wb16((uint16_t)v), d = duet_f32_from_bf16((uint16_t)v);
    if (duet_f32_bits(a) != duet_f32_bits(b) || duet_f32_bits(c) != duet_f32_bits(d)) {
      fprintf(stderr, "FAIL conversions: widening 0x%04x\n", v);
      bad = 1;
    }
    uint32_t base[2] = {duet_f32_bits(b), duet_f32_bits(d)};
    static const int32_t off[] = {0, 1, -1, 0x1000, -0x1000, 0xfff, 0x1001};
    for (int bi = 0; bi < 2 && !bad; bi++)
      for (int o = 0; o < 7 && !bad; o++) {
        float x = duet_bits_f32(base[bi] + (uint32_t)off[o]);
        checked++;
        if (n16(x) != duet_f16_from_f32(x) || nb16(x) != duet_bf16_from_f32(x)) {
          fprintf(stderr, "FAIL conversions: narrowing bits 0x%08x: cuda %04x %04x, c %04x %04x\n",
                  duet_f32_bits(x), n16(x), nb16(x), duet_f16_from_f32(x), duet_bf16_from_f32(x));
          bad = 1;
        }
      }
  }
  for (uint64_t u = 0; u < (1ull << 32) && !bad; u += 7919) {
    float x = duet_bits_f32((uint32_t)u);
    checked++;
    if (n16(x) != duet_f16_from_f32(x) || nb16(x) != duet_bf16_from_f32(x)) {
      fprintf(stderr, "FAIL conversions: narrowing bits 0x%08x\n", (uint32_t)u);
      bad = 1;
    }
  }
  dlclose(h);
  printf("%s conversions: 65536 f16 and bf16 patterns widened, %lld f32 values narrowed, as runtime/duet_half.h\n",
         bad ? "FAIL" : "ok", checked);
  return bad;
}

/* The C kernels' fp16 arithmetic for one element: widen, the f32
 * operation, round to fp16 (runtime/duet_half.h).  op: 0 add, 1 sub,
 * 2 mul, 3 relu(a), 4 relu'(dy = a, x = b), 5 a itself (a copy),
 * 6 negation. */
static uint16_t c_kernel_f16(uint16_t a, uint16_t b, int op) {
  float x = duet_f32_from_f16(a), y = duet_f32_from_f16(b);
  volatile float z; /* one f32 operation, rounded, then narrowed */
  switch (op) {
  case 0: z = x + y; break;
  case 1: z = x - y; break;
  case 2: z = x * y; break;
  case 3: z = x < 0 ? 0 : x; break;
  case 4: z = y > 0 ? x : 0; break;
  case 5: z = x; break;
  default: z = -x; break;
  }
  return duet_f16_from_f32(z);
}

static bool f16_nan(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }

/* The half2 helpers of the CUDA prelude (codegen_cuda_half2_prelude)
 * compiled for the host twice: as the emulated kernels use them
 * (cuda_emu.h's duet_emu_f16x2 for the f16x2 instructions) and as sm_61
 * and targets below sm_53 compile them (-D__CUDA_ARCH__=610: two f32
 * lanes each rounded once).  Each must give the C kernels' fp16 results (c_kernel_f16)
 * for every fp16 pattern against 64 chosen partners (zeros, subnormals,
 * the normal boundary, 1 and its neighbours, 2048's (where the ulp
 * reaches 2), the largest finite, infinities, quiet and signalling NaNs)
 * in both lanes and both orders, and for 2^20 random pairs: bit for bit,
 * except that a NaN from add/sub/mul need only be a NaN (PTX leaves its
 * payload unspecified); the bit operations, NaN quieting included,
 * exactly. */
static int check_half2_helpers(const char *dir) {
  static const char *const variants[] = {"", "-D__CUDA_ARCH__=610"};
  static const char *const names[] = {"emulated f16x2", "f32 lanes (sm_61, below sm_53)"};
  int bad = 0;
  for (int v = 0; v < 2 && !bad; v++) {
    char src[1200], so[1200], log[16384];
    snprintf(src, sizeof src, "%s/h2_%d.cpp", dir, v);
    snprintf(so, sizeof so, "%s/h2_%d.so", dir, v);
    FILE *f = fopen(src, "w");
    if (!f) return 1;
    fprintf(f, "#include \"cuda_emu.h\"\ntypedef unsigned int duet_u32;\n%s\n%s\n", codegen_cuda_half_prelude(),
            codegen_cuda_half2_prelude());
    fprintf(f, "extern \"C\" unsigned h2(unsigned a, unsigned b, int op) {\n"
               "  switch (op) {\n  case 0: return duet_h2add(a, b);\n  case 1: return duet_h2sub(a, b);\n"
               "  case 2: return duet_h2mul(a, b);\n  case 3: return duet_h2quiet(duet_h2relu(a));\n"
               "  case 4: return duet_h2quiet(duet_h2relu_grad(a, b));\n  case 5: return duet_h2quiet(a);\n"
               "  default: return duet_h2quiet(a ^ 0x80008000u);\n  }\n}\n"
               "EmuDim threadIdx, blockIdx, blockDim, gridDim;\n"
               "int emu_sync_or_word;\n");
    if (fclose(f)) return 1;
    char inc[1200];
    snprintf(inc, sizeof inc, "-I%s/tests/cuda_emu", DUET_SOURCE_DIR);
    char *argv[16] = {(char *)cxx, "-std=c++17", "-O1", "-w", "-shared", "-fPIC", "-pthread", inc};
    int na = 8;
    if (*variants[v]) argv[na++] = (char *)variants[v];
    argv[na++] = "-o", argv[na++] = so, argv[na++] = src, argv[na] = NULL;
    if (jit_run(argv, log, sizeof log)) {
      fprintf(stderr, "FAIL half2 helpers (%s): %s failed:\n%s\n", names[v], cxx, log);
      return 1;
    }
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      fprintf(stderr, "FAIL half2 helpers: dlopen %s: %s\n", so, dlerror());
      return 1;
    }
    unsigned (*h2)(unsigned, unsigned, int) = (unsigned (*)(unsigned, unsigned, int))dlsym(h, "h2");
    if (!h2) {
      fprintf(stderr, "FAIL half2 helpers: no h2 in %s\n", so);
      dlclose(h);
      return 1;
    }
    uint16_t partners[64] = {0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x0401,
                             0x07ff, 0x3c00, 0xbc00, 0x3c01, 0x3bff, 0xbbff, 0x3800, 0x4000, 0x6800, 0x6801,
                             0xe800, 0x67ff, 0x7bff, 0xfbff, 0x7bfe, 0x7800, 0x7c00, 0xfc00, 0x7e00, 0xfe00,
                             0x7c01, 0xfc01, 0x7d55, 0x1400, 0x1401, 0x9400, 0x0200, 0x5640, 0xd640, 0x2e66};
    DuetRng r;
    duet_rng_seed(&r, 2024, 7);
    for (int i = 40; i < 64; i++) partners[i] = (uint16_t)duet_rng_next(&r);
    long long n = 0;
    for (int op = 0; op < 7 && !bad; op++) {
      bool arith = op < 3;
      for (uint32_t a = 0; a < 65536 && !bad; a++)
        for (int j = 0; j < 64 + 16 && !bad; j++) {
          /* the 64 partners, then random ones */
          uint16_t b = j < 64 ? partners[j] : (uint16_t)duet_rng_next(&r);
          uint32_t got = h2(a | (uint32_t)b << 16, b | a << 16, op);
          uint16_t want[2] = {c_kernel_f16((uint16_t)a, b, op), c_kernel_f16(b, (uint16_t)a, op)};
          for (int l = 0; l < 2; l++) {
            uint16_t g = (uint16_t)(got >> 16 * l);
            n++;
            if (g == want[l] || (arith && f16_nan(g) && f16_nan(want[l]))) continue;
            fprintf(stderr, "FAIL half2 helpers (%s): op %d of 0x%04x and 0x%04x: 0x%04x, the C kernel's 0x%04x\n",
                    names[v], op, l ? b : a, l ? a : b, g, want[l]);
            bad = 1;
          }
        }
    }
    dlclose(h);
    printf("%s half2 helpers, %s: %lld lanes (add, sub, mul, relu, relu', copy, neg) as the C kernels\n",
           bad ? "FAIL" : "ok", names[v], n);
  }
  return bad;
}

/* The accumulate kernel (gradient sums over micro-batches on a GPU) on 3
 * blocks of 64 threads over 1000 elements: a = b, then a += b twice, as
 * the CPU device's loop computes it, bit for bit. */
static int check_accumulate(const Emu *e) {
  enum { N = 1000 };
  static float a[N], b[N], want[N];
  DuetRng r;
  duet_rng_seed(&r, 5, 1);
  for (int i = 0; i < N; i++) a[i] = -1, b[i] = (float)duet_rng_normal(&r);
  void *t[2] = {a, b};
  int bad = !e->acc;
  for (int k = 0; k < 3 && !bad; k++) {
    double s[2] = {N, k == 0};
    bad = e->launch(e->acc, 3, 64, t, s) != 0;
    for (int i = 0; i < N; i++) want[i] = k == 0 ? b[i] : want[i] + b[i];
  }
  bad = bad || memcmp(a, want, sizeof a) != 0;
  printf("%s accumulate kernel: a = b, a += b, a += b over %d elements as the CPU sums\n", bad ? "FAIL" : "ok", N);
  return bad;
}

/* The kernels of cuda_emu_traps.h through the launcher, each wrong one
 * caught and its twin right (but `fresh`, which the fake GPU's
 * allocations catch: tests/fakegpu/test_fakegpu.c), each writing into
 * memory filled with bytes 0xff as a driver's fresh memory is on the fake
 * GPU; then: the order of 64 blocks is a
 * permutation, not the identity, the same again under the same seed and
 * another under the next seed; 1024-thread blocks run every thread, and
 * 1056 threads are refused. */
static int check_emulator(const char *dir) {
  char src[1200], so[1200], log[16384], inc[1200];
  snprintf(src, sizeof src, "%s/traps.cpp", dir);
  snprintf(so, sizeof so, "%s/traps.so", dir);
  FILE *f = fopen(src, "w");
  if (!f || cuda_emu_write_source(f, cuda_emu_trap_src)) {
    if (f) fclose(f);
    fprintf(stderr, "FAIL emulator: writing %s\n", src);
    return 1;
  }
  for (int i = 0; i < CUDA_EMU_N_TRAPS + 2; i++) { /* the traps, then order and count */
    const char *nm = i < CUDA_EMU_N_TRAPS ? cuda_emu_traps[i].name : i == CUDA_EMU_N_TRAPS ? "order" : "count";
    fprintf(f, "extern \"C\" void call_%s(void *const *t, const double *s) { %s((%s *)t[0], (int)s[0]); }\n", nm,
            nm, i < CUDA_EMU_N_TRAPS ? "float" : "unsigned");
  }
  if (fclose(f)) return 1;
  snprintf(inc, sizeof inc, "-I%s/tests/cuda_emu", DUET_SOURCE_DIR);
  char *argv[] = {(char *)cxx, "-std=c++17", "-O1", "-w", "-shared", "-fPIC", "-pthread", inc, "-o", so, src, NULL};
  if (jit_run(argv, log, sizeof log)) {
    fprintf(stderr, "FAIL emulator: %s failed:\n%s\n", cxx, log);
    return 1;
  }
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "FAIL emulator: dlopen %s: %s\n", so, dlerror());
    return 1;
  }
  EmuLaunchEx launch = (EmuLaunchEx)dlsym(h, "emu_launch_ex");
  void (*seed)(unsigned long long) = (void (*)(unsigned long long))dlsym(h, "emu_seed");
  void (*stop)(void) = (void (*)(void))dlsym(h, "emu_shutdown");
  int bad = !launch || !seed || !stop;
  if (bad) fprintf(stderr, "FAIL emulator: the module lacks its launcher\n");
  if (!bad) seed(emu_seed_value);
  for (int i = 0; i < CUDA_EMU_N_TRAPS && !bad; i++) {
    const CudaEmuTrap *tr = &cuda_emu_traps[i];
    if (tr->driver) continue;
    char nm[64];
    snprintf(nm, sizeof nm, "call_%s", tr->name);
    EmuKernel fn = (EmuKernel)dlsym(h, nm);
    size_t bytes = (size_t)tr->grid * tr->block * sizeof(float);
    int wrong_right[2] = {0, 0}; /* elements off the intended value: the bug, the fixed twin */
    for (int fixed = 0; fixed < 2 && fn; fixed++) {
      float *out = aligned_alloc(64, (bytes + 63) / 64 * 64);
      if (out) memset(out, 0xff, bytes);
      double s[1] = {fixed};
      void *t[1] = {out};
      if (!out || launch(fn, tr->grid, tr->block, tr->shared, t, s)) {
        fprintf(stderr, "FAIL emulator: %s: the launch failed\n", tr->name);
        bad = 1;
      }
      if (out && !bad) wrong_right[fixed] = cuda_emu_trap_off(tr, out);
      free(out);
    }
    if (!fn || (!bad && (wrong_right[0] == 0 || wrong_right[1] != 0))) {
      fprintf(stderr, "FAIL emulator: %s: %d of %d elements off with the bug (want > 0), %d with it fixed (want 0)\n",
              tr->name, wrong_right[0], tr->n_out, wrong_right[1]);
      bad = 1;
    }
    if (!bad) printf("ok emulator: %s caught (%d of %d elements off), its fixed twin right\n", tr->name,
                     wrong_right[0], tr->n_out);
  }
  /* the block order: a permutation, not the identity, replayed by the seed */
  EmuKernel ord = (EmuKernel)dlsym(h, "call_order"), cnt = (EmuKernel)dlsym(h, "call_count");
  unsigned o[3][65];
  for (int r = 0; r < 3 && !bad; r++) {
    memset(o[r], 0, sizeof o[r]);
    void *t[1] = {o[r]};
    double s[1] = {0};
    seed(emu_seed_value + (r == 2));
    bad = !ord || launch(ord, 64, 32, 0, t, s) != 0;
  }
  if (!bad) {
    bool perm = o[0][0] == 64, ident = true, seen[64] = {false};
    for (int b = 0; b < 64 && perm; b++) {
      perm = o[0][1 + b] < 64 && !seen[o[0][1 + b]];
      if (perm) seen[o[0][1 + b]] = true;
      ident &= o[0][1 + b] == (unsigned)b;
    }
    bool same = !memcmp(o[0], o[1], sizeof o[0]), other = memcmp(o[0], o[2], sizeof o[0]) != 0;
    if (!perm || ident || !same || !other) {
      fprintf(stderr, "FAIL emulator: block order over 64 blocks: %s permutation, %s, %s under the same seed, %s "
                      "under another\n", perm ? "a" : "not a", ident ? "the identity" : "shuffled",
              same ? "the same" : "another", other ? "another" : "the same");
      bad = 1;
    } else {
      printf("ok emulator: 64 blocks run once each in a shuffled order, the same under the same seed, another "
             "under the next\n");
    }
  }
  if (!bad) {
    unsigned c[3] = {0, 0, 0};
    void *t[1] = {c};
    double s[1] = {0};
    bool refused = !cnt || launch(cnt, 1, 1056, 0, t, s) != 0;
    bad = !refused || launch(cnt, 3, 1024, 0, t, s) != 0 || c[0] != 1024 || c[1] != 1024 || c[2] != 1024;
    if (bad) fprintf(stderr, "FAIL emulator: 3 blocks of 1024 threads ran %u, %u, %u threads%s\n", c[0], c[1], c[2],
                     refused ? "" : "; 1056 threads were not refused");
    else printf("ok emulator: 3 blocks of 1024 threads ran every thread; 1056 threads are refused\n");
  }
  stop();
  dlclose(h);
  return bad;
}

/* The 16-bit elements compared over all cases and those bit-identical. */
static CompareStats stats16;

/* Random bits for a tensor of dtype dt: fp16 one of 16 specials (+-0,
 * the smallest subnormal, the largest finite, +-inf, quiet and
 * signalling NaNs) one time in eight, else any pattern (NaNs and
 * subnormals included); f32 N(0, 4), and one time in 16 +-0, +-inf or a
 * NaN; other dtypes zeros. */
static void fill_bits(void *p, int64_t bytes, int dtype, DuetRng *r) {
  static const uint16_t sp16[16] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff,
                                    0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0xfd55, 0x3c00, 0xbc00};
  static const float sp32[5] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
  if (dtype == DUET_F16) {
    for (int64_t j = 0; j < bytes / 2; j++) {
      uint64_t x = duet_rng_next(r);
      ((uint16_t *)p)[j] = (x & 7) == 0 ? sp16[(x >> 3) & 15] : (uint16_t)(x >> 16);
    }
  } else if (dtype == DUET_F32) {
    for (int64_t j = 0; j < bytes / 4; j++) {
      uint64_t x = duet_rng_next(r);
      ((float *)p)[j] = (x & 15) == 0 ? sp32[(x >> 4) % 5] : (float)(4 * duet_rng_normal(r));
    }
  } else {
    memset(p, 0, (size_t)bytes);
  }
}

/* The instructions seen in kernels that take the half2 path. */
static bool half2_ops_seen[KI_COUNT];

/* Every kernel of the program that takes the half2 path
 * (codegen_cuda_half2), run alone on the same random bits (fill_bits) by
 * the CPU backend's C kernel and by the emulated CUDA kernel: every
 * element either writes must have the same bits; only in a kernel with
 * f16x2 arithmetic may a NaN differ from a NaN (PTX leaves the NaN of
 * add/sub/mul unspecified).  Counts the kernels checked. */
static int check_half2_kernels(const TModel *t, const Emu *e, const char *what, int *checked) {
  const DuetProgram *p = &t->cp->prog;
  int bad = 0;
  DuetRng r;
  duet_rng_seed(&r, 99, 3);
  for (int ki = 0; ki < t->cp->n_kernels && !bad; ki++) {
    const Kernel *k = &t->cp->kernels[ki];
    int level = codegen_cuda_half2(k);
    if (level == CG_HALF2_NONE) continue;
    void **ta = calloc((size_t)p->n_tensors + 1, sizeof *ta), **tb = calloc((size_t)p->n_tensors + 1, sizeof *tb);
    if (!ta || !tb) {
      fprintf(stderr, "FAIL %s: out of memory\n", what);
      free(ta);
      free(tb);
      return 1;
    }
    for (int i = 0; i < k->n_bufs && !bad; i++) {
      int id = k->bufs[i].tensor;
      if (ta[id]) continue;
      const DuetTensor *tt = &p->tensors[id];
      size_t n = ((size_t)tt->nbytes + 63) / 64 * 64;
      ta[id] = aligned_alloc(64, n ? n : 64);
      tb[id] = aligned_alloc(64, n ? n : 64);
      if (!ta[id] || !tb[id]) {
        fprintf(stderr, "FAIL %s: out of memory\n", what);
        bad = 1;
        break;
      }
      fill_bits(ta[id], tt->nbytes, tt->dtype, &r);
      memcpy(tb[id], ta[id], (size_t)tt->nbytes);
    }
    double sc[DUET_S_COUNT];
    for (int i = 0; i < DUET_S_COUNT; i++) sc[i] = 0.75;
    sc[DUET_S_TRAINING] = 1;
    sc[DUET_S_DROP_SEED] = 12345;
    unsigned block = e->cfg[ki].block;
    if (!bad) {
      t->jit.fns[ki](ta, sc); /* the C kernel picks its arguments from the table */
      void *args[DUET_MAX_KERNEL_ARGS] = {0}; /* the emulated one takes them, as the plugin passes them */
      duet_kernel_argv(p->kernel_arg_off, p->kernel_args, p->n_tensors, ki, tb, args);
      if (e->launch_ex(e->fn[ki], emu_grid(k, e->cfg[ki].grid, block), block, e->cfg[ki].shared, args, sc)) {
        fprintf(stderr, "FAIL %s: emulated launch of kernel %d failed\n", what, ki);
        bad = 1;
      }
    }
    for (int i = 0; i < k->n_ins && !bad; i++) {
      if (k->ins[i].op != KI_STORE) continue;
      int id = k->bufs[k->ins[i].a].tensor;
      const DuetTensor *tt = &p->tensors[id];
      bool f16 = tt->dtype == DUET_F16;
      int64_t n = tt->nbytes / (f16 ? 2 : 4);
      for (int64_t j = 0; j < n && !bad; j++) {
        uint32_t x = f16 ? ((uint16_t *)ta[id])[j] : ((uint32_t *)ta[id])[j];
        uint32_t y = f16 ? ((uint16_t *)tb[id])[j] : ((uint32_t *)tb[id])[j];
        bool nx = f16 ? f16_nan((uint16_t)x) : (x & 0x7fffffffu) > 0x7f800000u;
        bool ny = f16 ? f16_nan((uint16_t)y) : (y & 0x7fffffffu) > 0x7f800000u;
        if (x == y || (level == CG_HALF2_ARITH && nx && ny)) continue;
        fprintf(stderr, "FAIL %s: half2 kernel %d, tensor %s[%lld]: emulated 0x%x, C kernel 0x%x\n", what, ki,
                tt->name, (long long)j, y, x);
        bad = 1;
      }
    }
    for (int i = 0; i < p->n_tensors; i++) {
      free(ta[i]);
      free(tb[i]);
    }
    free(ta);
    free(tb);
    (*checked)++;
    for (int i = 0; i < k->n_ins; i++) half2_ops_seen[k->ins[i].op] = true;
  }
  return bad;
}

/* Kernels checked by check_half2_kernels over all cases. */
static int half2_checked;

/* precision: NULL (f32 or f64 as dt), "fp16" or "bf16" */
static int run_case(const Case *c, DType dt, const char *precision, const char *dir) {
  TModel t;
  char what[160], err[1024];
  snprintf(what, sizeof what, "%s (%s)", c->name, precision ? precision : dt == DT_F64 ? "f64" : "f32");
  FrontendOptions fo = {.float_dtype = dt, .decode = run_decode > 0, .batch = run_decode > 0 ? 1 : 0};
  if (tmodel_open_opts(&t, c->name, c->src, &fo, precision ? precision : "fp32", run_quantize, run_shrink)) {
    fprintf(stderr, "FAIL %s: does not compile\n", what);
    return 1;
  }
  const DuetProgram *p = &t.cp->prog;
  Emu e = {0};
  DuetDevice *d = calloc(1, sizeof *d), *ld = NULL; /* the emulator, and lockstep over it */
  DuetSession *es = NULL;
  int fails = 0;
  int32_t *fn_of = arena_alloc(t.arena, (size_t)(t.cp->n_kernels + 1) * sizeof *fn_of);
  int n_fns = 0;
  const char *cuda = codegen_emit_cuda(t.cp, t.arena, fn_of, &n_fns);
  if (emu_no_dp4a) cuda = arena_printf(t.arena, "#define DUET_NO_DP4A 1\n%s", cuda);
  e.p = p;
  if (!d || emu_build(&e, cuda, fn_of, n_fns, codegen_cuda_launch_table(t.cp, t.arena), t.cp->n_kernels, dir)) {
    fprintf(stderr, "FAIL %s: building the emulated kernels\n", what);
    fails = 1;
    goto out;
  }
  e.kernels = t.cp->kernels;
  e.perturb_k = -1;
  char kind[32] = "";
  bool want16 = false;
  if (perturb_kind) {
    snprintf(kind, sizeof kind, "%s", perturb_kind);
    char *slash = strchr(kind, '/');
    if (slash) want16 = !strcmp(slash, "/16"), *slash = 0;
  }
  for (int i = 0; perturb_kind && i < t.cp->n_kernels && e.perturb_k < 0; i++) {
    const Kernel *K = &t.cp->kernels[i];
    bool out16 = false; /* writes a 16-bit tensor */
    for (int b = 0; b < K->n_bufs; b++)
      out16 |= (K->bufs[b].dtype == DT_F16 || K->bufs[b].dtype == DT_BF16) && kernel_writes(K, b);
    if (!strcmp(kernel_kind_name(K->kind), kind) && (!want16 || out16)) e.perturb_k = i;
  }
  e.perturb_rel = perturb_rel;
  if (perturb_kind)
    printf("%s: kernel %d (%s) perturbed by %g\n", what, e.perturb_k, perturb_kind, perturb_rel);
  static int acc_checked; /* once: every module has the same accumulate kernel */
  if (!acc_checked++ && check_accumulate(&e)) fails++;
  if (precision && !strcmp(precision, "fp16") && check_half2_kernels(&t, &e, what, &half2_checked)) {
    fails = 1;
    goto out;
  }
  d->ops = &emu_ops;
  d->ctx = &e;
  /* every kernel and GEMM also checked alone against the C kernel from
   * the same inputs (lockstep_device); it owns d from here */
  if (!(ld = lockstep_device(d, &t, what))) {
    fprintf(stderr, "FAIL %s: out of memory\n", what);
    fails = 1;
    goto out;
  }
  /* Parameters are compared after one training step.  AdamW's first
   * update is lr g / (|g| + eps) per element (m and v are g and g^2 after
   * bias correction), whose slope in g is at most lr / eps: with the
   * default eps of 1e-8 a gradient that is zero in exact arithmetic and
   * rounding noise in practice (gpt_tiny's key biases: softmax ignores a
   * constant added to every key) moves a parameter by up to lr, with the
   * noise's sign, which differs between the backends' summation orders.
   * Both sessions step with eps = lr instead: the slope is then at most
   * 1, so a parameter differs by at most what its gradient does, which
   * the comparison after forward + backward bounds with the same
   * tolerances; every part of the AdamW kernel still runs, and gradients
   * well above eps still take normalised steps. */
  DuetConfig cfg = p->defaults;
  if (cfg.optimizer == DUET_OPTIM_ADAMW && cfg.eps < cfg.lr) {
    cfg.eps = cfg.lr;
    duet_session_free(t.s);
    DuetConfig cc = cfg; /* as tmodel_open_prec made it */
    if (!t.dev) cc.quiet = 1;
    t.s = t.dev ? duet_session_new(p, t.dev, &cc, err, sizeof err)
                : duet_session_new_pipeline(p, t.jit.fns, &cc, err, sizeof err);
    if (!t.s) {
      fprintf(stderr, "FAIL %s: the CPU session: %s\n", what, err);
      fails = 1;
      goto out;
    }
  }
  if (!(es = duet_session_new(p, ld, &cfg, err, sizeof err))) {
    fprintf(stderr, "FAIL %s: %s\n", what, err);
    fails = 1;
    goto out;
  }
  DuetRng r1, r2;
  duet_rng_seed(&r1, 11, 0);
  duet_rng_seed(&r2, 11, 0);
  tmodel_fill(&t, t.s, &r1, c->classes);
  tmodel_fill(&t, es, &r2, c->classes);
  /* pruning: the same masks in both (chosen on the host from the same
   * weights), so that the training step runs the prune_mask kernels */
  if (p->prune && (duet_prune_update(t.s, p->prune->final, err, sizeof err) ||
                   duet_prune_update(es, p->prune->final, err, sizeof err))) {
    fprintf(stderr, "FAIL %s: pruning: %s\n", what, err);
    fails = 1;
    goto out;
  }
  duet_session_set_pos(t.s, run_pos);
  duet_session_set_pos(es, run_pos);
  /* eval (metrics: correct predictions, summed NLL) over every row */
  duet_session_set_valid(t.s, INT32_MAX);
  duet_session_set_valid(es, INT32_MAX);
  int n_act = 0; /* int8 activations: calibrated on this batch, then the scales set in both */
  for (int i = 0; run_calibrate && i < p->n_tensors; i++) /* 0: not calibrated (tmodel_fill drew them) */
    if (duet_is_act_scale(p, i)) duet_session_write(t.s, i, 0, &(float){0}, 4), duet_session_write(es, i, 0, &(float){0}, 4);
  if (run_calibrate && (duet_session_run(t.s, DUET_RUN_EVAL) || duet_session_run(es, DUET_RUN_EVAL))) {
    fprintf(stderr, "FAIL %s: calibration failed\n", what);
    fails++;
  }
  for (int i = 0; run_calibrate && !fails && i < p->n_tensors; i++) {
    if (!duet_is_act_scale(p, i)) continue;
    float va, vb;
    duet_session_read(t.s, i, 0, &va, 4), duet_session_read(es, i, 0, &vb, 4);
    if (memcmp(&va, &vb, 4) || !(va < 0)) {
      fprintf(stderr, "FAIL %s: calibrated %s: C %a, emulated %a (want -max|x| < 0 in both)\n", what,
              p->tensors[i].name, va, vb);
      fails++;
    }
    float sc = -va / 127.0f;
    duet_session_write(t.s, i, 0, &sc, 4), duet_session_write(es, i, 0, &sc, 4);
    n_act++;
  }
  if (run_calibrate && !n_act && !fails++) fprintf(stderr, "FAIL %s: no activation scale\n", what);
  /* evaluation before the step: AdamW's first update is +-lr whatever the
   * gradient's size, so a near-zero gradient of the other sign moves a
   * param by 2 lr, which a later forward pass amplifies */
  static const int runs[] = {DUET_RUN_GRAD, DUET_RUN_EVAL, DUET_RUN_TRAIN, DUET_RUN_TRAIN};
  const SessionTol tol16 = tmodel_session_tol16(&t); /* 16-bit programs: per tensor */
  CompareStats cs = {0};
  /* decoding: token i at position i, each step's logits and caches (and
   * every kernel alone, through lockstep) against the C backend */
  for (int i = 0; i < run_decode && !fails; i++) {
    int32_t tok = (int32_t)((i * 37 + 11) % (c->classes ? c->classes : 1));
    duet_session_set_pos(t.s, i), duet_session_set_pos(es, i);
    duet_session_set_valid(t.s, 1), duet_session_set_valid(es, 1);
    if (duet_session_write(t.s, p->input_x, 0, &tok, sizeof tok) || duet_session_write(es, p->input_x, 0, &tok, sizeof tok) ||
        duet_session_run(t.s, DUET_RUN_EVAL) || duet_session_run(es, DUET_RUN_EVAL)) {
      fprintf(stderr, "FAIL %s: decoding step %d: cpu '%s', emulated '%s'\n", what, i, duet_session_error(t.s),
              duet_session_error(es));
      fails = 1;
      break;
    }
    char w2[200];
    snprintf(w2, sizeof w2, "%s after decoding position %d", what, i);
    fails += compare_sessions_stats(w2, p, t.s, es, &tol16, &cs);
  }
  int n_runs = strncmp(c->name, "adamw8", 6) ? 3 : 4; /* 8-bit state: a second step decodes the first's */
  for (int k = 0; k < n_runs && !fails && !run_decode; k++) {
    if (runs[k] == DUET_RUN_EVAL && p->n_eval == 0) continue;
    if ((run_quantize || run_shrink > 0) && runs[k] != DUET_RUN_EVAL) continue; /* evaluation programs */
    if (duet_session_run(t.s, runs[k]) || duet_session_run(es, runs[k])) {
      fprintf(stderr, "FAIL %s: run failed: cpu '%s', emulated '%s'\n", what, duet_session_error(t.s),
              duet_session_error(es));
      fails = 1;
      break;
    }
    char w2[200];
    snprintf(w2, sizeof w2, "%s after %s", what,
             k == 1 ? "evaluation" : k == 3 ? "a second training step" : k ? "a training step" : "forward + backward");
    fails += compare_sessions_stats(w2, p, t.s, es, &tol16, &cs);
    DuetScaler a = duet_session_scaler(t.s), b = duet_session_scaler(es);
    if (!strcmp(c->name, "overflow") && runs[k] == DUET_RUN_TRAIN && b.skipped != 1) {
      fprintf(stderr, "FAIL %s: the overflow was not detected (%lld skipped steps)\n", w2, (long long)b.skipped);
      fails++;
    }
    if (a.scale != b.scale || a.skipped != b.skipped) {
      fprintf(stderr, "FAIL %s: loss scale %g, %lld skipped steps; cpu %g, %lld\n", w2, b.scale,
              (long long)b.skipped, a.scale, (long long)a.skipped);
      fails++;
    }
  }
  for (int k = 0; run_calibrate && !fails && k < t.cp->n_kernels; k++) { /* exact int32 sums: the same bits */
    const Kernel *K = &t.cp->kernels[k];
    if (K->kind != KK_GEMM_I8) continue;
    int id = K->bufs[4].tensor;
    size_t nb = (size_t)p->tensors[id].nbytes;
    unsigned char *la = malloc(nb), *lb = malloc(nb);
    if (!la || !lb || duet_session_read(t.s, id, 0, la, nb) || duet_session_read(es, id, 0, lb, nb) ||
        memcmp(la, lb, nb)) {
      fprintf(stderr, "FAIL %s: the int8 GEMM's output %s differs between the C and the emulated CUDA kernel\n",
              what, p->tensors[id].name);
      fails++;
    } else {
      printf("%s: int8 GEMM output %s bit-identical (%zu bytes)\n", what, p->tensors[id].name, nb);
    }
    free(la), free(lb);
  }
  const LockstepStats *ls = lockstep_stats(ld);
  fails += ls->fails;
  stats16.n16 += cs.n16, stats16.same16 += cs.same16;
  /* after the step, the emulated prune_mask kernels left every pruned
   * weight and its optimizer state +0.0 (within tolerance is not enough) */
  for (int i = 0; p->prune && !fails && i < p->prune->n_params; i++) {
    const DuetPruneParam *q = &p->prune->params[i];
    int ids[4] = {q->param, q->state[0], q->state[1], q->mask};
    size_t nb = (size_t)p->tensors[q->param].nbytes;
    int64_t n = q->out_n * q->in_n, pruned = 0;
    float *h[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < 4; k++)
      if (ids[k] >= 0 && (p->tensors[ids[k]].dtype == DUET_F32 || p->tensors[ids[k]].dtype == DUET_U8) &&
          (h[k] = malloc(nb)))
        duet_session_read(es, ids[k], 0, h[k], (size_t)p->tensors[ids[k]].nbytes);
    for (int64_t e = 0; h[3] && e < n; e++) {
      if (h[3][e] != 0) continue;
      pruned++;
      for (int k = 0; k < 3; k++) { /* 8-bit AdamW state: its codes must be 0 */
        uint32_t b = 0;
        if (h[k] && p->tensors[ids[k]].dtype == DUET_U8) b = ((const unsigned char *)h[k])[e];
        else if (h[k]) memcpy(&b, &h[k][e], 4);
        if (b && !fails++)
          fprintf(stderr, "FAIL %s: pruned entry %lld of %s is %a after the emulated step, not +0.0\n", what,
                  (long long)e, p->tensors[ids[k]].name, h[k][e]);
      }
    }
    if (h[3] && !pruned && !fails++) fprintf(stderr, "FAIL %s: %s prunes nothing\n", what, p->tensors[q->mask].name);
    for (int k = 0; k < 4; k++) free(h[k]);
  }
  int nh2 = 0;
  for (int i = 0; i < t.cp->n_kernels; i++) nh2 += codegen_cuda_half2(&t.cp->kernels[i]) != CG_HALF2_NONE;
  char h2[32] = "";
  if (nh2) snprintf(h2, sizeof h2, ", %d half2", nh2);
  printf("%s %s: %d kernels, %d functions%s\n", fails ? "FAIL" : "ok", what, t.cp->n_kernels, n_fns, h2);
  lockstep_print(what, ls, &cs);
out:
  duet_session_free(es);
  if (ld) ld->ops->destroy(ld); /* and d */
  else free(d);
  free(e.fn);
  if (e.handle) {
    void (*stop)(void) = (void (*)(void))dlsym(e.handle, "emu_shutdown");
    if (stop) stop();
    dlclose(e.handle);
  }
  tmodel_close(&t);
  return fails != 0;
}

/* ------------------------------------------------------------------
 * Results that go wrong only at scale (tests/scale_cases.h; the C kernels
 * run the same cases in tests/test_scale.c), on the emulated CUDA
 * kernels, each against an independent reference. */

/* The CUDA C of a lowered program built for the emulator (e->cfg: the
 * emitter's launches, e->kernels, e->p); 0, or 1 after printing why. */
static int scale_emu_build(Emu *e, const CgProgram *cp, Arena *a, const char *dir, const char *what) {
  memset(e, 0, sizeof *e);
  if (!cp) {
    fprintf(stderr, "FAIL %s: does not compile\n", what);
    return 1;
  }
  int32_t *fn_of = arena_alloc(a, (size_t)(cp->n_kernels + 1) * sizeof *fn_of);
  int n_fns = 0;
  const char *cuda = codegen_emit_cuda(cp, a, fn_of, &n_fns);
  e->p = &cp->prog;
  e->kernels = cp->kernels;
  if (emu_build(e, cuda, fn_of, n_fns, codegen_cuda_launch_table(cp, a), cp->n_kernels, dir)) {
    fprintf(stderr, "FAIL %s: building the emulated kernels\n", what);
    return 1;
  }
  return 0;
}

static void scale_emu_close(Emu *e) {
  free(e->fn);
  if (e->handle) {
    void (*stop)(void) = (void (*)(void))dlsym(e->handle, "emu_shutdown");
    if (stop) stop();
    dlclose(e->handle);
  }
  memset(e, 0, sizeof *e);
}

/* Kernel ki alone, its arguments from the tensor table t, on `grid`
 * blocks of `block` threads (0: the emitter's grid; blocks of at most 64
 * threads, as emu_launch_op runs them). */
static int scale_emu_run(const Emu *e, int ki, void *const *t, const double *s, unsigned grid, unsigned block) {
  void *args[DUET_MAX_KERNEL_ARGS] = {0};
  duet_kernel_argv(e->p->kernel_arg_off, e->p->kernel_args, e->p->n_tensors, ki, t, args);
  if (!block) block = e->cfg[ki].block < 64 ? e->cfg[ki].block : 64;
  return e->launch(e->fn[ki], grid ? grid : e->cfg[ki].grid, block, args, s);
}

/* The embedding kernels over a table of 2^32 + 320 elements in sink
 * memory (scale_sink_map), with the emitter's grids: every looked-up
 * row gathered, every gradient row the sum of its tokens. */
static int scale_embedding_emu(const char *dir) {
  const char *what = "emulated embedding over a table of 2^32 + 320 elements";
  Arena *a = arena_new(1 << 20);
  Emu e;
  const CgProgram *cp = lower_model(a, "huge_embedding", emb_src, DT_F32, false, NULL);
  int bad = scale_emu_build(&e, cp, a, dir, what);
  int kf = -1, kb = -1;
  void **t = NULL;
  float *dy = calloc(EMB_R * EMB_C, sizeof *dy), *out = calloc(EMB_R * EMB_C, sizeof *out);
  int32_t ids[EMB_R];
  memcpy(ids, emb_ids, sizeof ids);
  double s[DUET_S_COUNT] = {0};
  ScaleMap m = {0};
  if (!bad) {
    kf = scale_find_kernel(cp, KK_EMBED_FWD, 0, 0), kb = scale_find_kernel(cp, KK_EMBED_BWD, 0, 0);
    t = calloc((size_t)e.p->n_tensors + 1, sizeof *t);
    bad = kf < 0 || kb < 0 || !t || !dy || !out;
    if (bad) fprintf(stderr, "FAIL %s: no embedding kernels or no memory\n", what);
  }
  bool broken = bad;
  for (int pass = 0; pass < 2 && !broken; pass++) { /* forward, backward */
    if (emb_map(&m)) {
      perror("FAIL emulated embedding: mapping 16 GiB");
      bad = broken = true;
      break;
    }
    int ki = pass ? kb : kf;
    const Kernel *k = &cp->kernels[ki];
    memset(t, 0, ((size_t)e.p->n_tensors + 1) * sizeof *t);
    if (!pass) emb_fill((float *)m.base, dy);
    t[k->bufs[0].tensor] = pass ? (void *)dy : m.base, t[k->bufs[1].tensor] = ids;
    t[k->bufs[2].tensor] = pass ? m.base : (void *)out;
    if (scale_emu_run(&e, ki, t, s, 0, 0)) {
      fprintf(stderr, "FAIL %s: emulated launch failed\n", what);
      bad = broken = true;
    } else if (pass) {
      bad |= emb_check_bwd("emulated embedding backward, table of 2^32 + 320 elements", (const float *)m.base);
    } else {
      bad |= emb_check_fwd("emulated embedding forward, table of 2^32 + 320 elements", out);
    }
    scale_unmap(&m);
  }
  printf("%s %s: forward and backward (rows 2^26.. wrap at 32 bits)\n", bad ? "FAIL" : "ok", what);
  free(t), free(dy), free(out);
  scale_emu_close(&e);
  arena_free(a);
  return bad;
}

/* The whole-tensor mean (three data sets) and sum of 2^24 elements within
 * the summation bound of scale_cases.h, with the emitter's launch and
 * with 3 blocks of 64 threads (the bound holds for any grid). */
static int scale_sum_emu(const char *dir) {
  const char *what = "emulated sum of 2^24 elements";
  Arena *a = arena_new(1 << 20);
  Emu e;
  const CgProgram *cp = lower_model(a, "sum24", sum_src, DT_F32, false, NULL);
  int bad = scale_emu_build(&e, cp, a, dir, what);
  float *x = malloc(SUM_N * sizeof *x), y[16];
  void **t = NULL;
  double s[DUET_S_COUNT] = {0};
  int km = -1, ks = -1;
  if (!bad) {
    km = scale_find_kernel(cp, KK_REDUCE, SUM_N, 0), ks = scale_find_kernel(cp, KK_REDUCE, SUM_N, 1);
    t = calloc((size_t)e.p->n_tensors + 1, sizeof *t);
    bad = km < 0 || ks < 0 || !x || !t;
    if (bad) fprintf(stderr, "FAIL %s: no whole-tensor reductions or no memory\n", what);
    else if (e.kernels[km].scale == 1) { /* the mean is the one scaled by 2^-24 */
      int tmp = km;
      km = ks, ks = tmp;
    }
  }
  static const char *const sets[] = {"uniform [0, 1)", "mixed signs and magnitudes", "0.1f everywhere"};
  bool broken = bad;
  for (int run = 0; run < 4 && !broken; run++) {
    int set = run < 3 ? run : 0, ki = run < 3 ? km : ks;
    const Kernel *k = &e.kernels[ki];
    __int128 exact;
    double abs_sum;
    sum_fill(x, set, &exact, &abs_sum);
    t[k->bufs[0].tensor] = x, t[k->bufs[1].tensor] = y;
    for (int cfg = 0; cfg < 2 && !broken; cfg++) {
      unsigned grid = cfg ? 3 : e.cfg[ki].grid, block = 64;
      y[0] = NAN;
      if (scale_emu_run(&e, ki, t, s, grid, block)) {
        fprintf(stderr, "FAIL %s: emulated launch failed\n", what);
        bad = broken = true;
        break;
      }
      char w[200];
      double rel;
      snprintf(w, sizeof w, "emulated %s of 2^24 elements, %s, %u blocks of %u", run < 3 ? "mean" : "sum", sets[set],
               grid, block);
      int f = sum_check(w, y[0], exact, abs_sum, k->scale, &rel);
      printf("%s %s: relative error %.2g\n", f ? "FAIL" : "ok", w, rel);
      bad |= f;
    }
  }
  free(x), free(t);
  scale_emu_close(&e);
  arena_free(a);
  return bad;
}

/* The loss and evaluation NLL of huge logits (xent_cases) in f32, f64,
 * fp16 and bf16 programs on an emulated session. */
static int scale_xent_emu(const char *dir) {
  static const char *const precs[] = {"fp32", "fp32", "fp16", "bf16"};
  int bad = 0;
  for (int pi = 0; pi < 4; pi++) {
    bool f64 = pi == 1;
    const char *prec = precs[pi], *name = f64 ? "f64" : prec;
    char what[200], err[1024];
    snprintf(what, sizeof what, "emulated cross-entropy of huge logits (%s)", name);
    Arena *a = arena_new(1 << 20);
    Emu e;
    DuetSession *es = NULL;
    DuetDevice *d = calloc(1, sizeof *d);
    int fails = scale_emu_build(&e, lower_model(a, "xent_huge", xent_src, f64 ? DT_F64 : DT_F32, false, prec), a, dir,
                                what);
    int n_run = 0, wrong = 0;
    if (!fails && d) {
      d->ops = &emu_ops;
      d->ctx = &e;
      DuetConfig cfg = e.p->defaults;
      if (!(es = duet_session_new(e.p, d, &cfg, err, sizeof err))) {
        fprintf(stderr, "FAIL %s: %s\n", what, err);
        fails = 1;
      }
    }
    const DuetProgram *p = e.p;
    size_t es_b = f64 ? 8 : 4;
    int wid = -1;
    for (int i = 0; es && i < p->n_tensors; i++)
      if (!strcmp(p->tensors[i].name, "w")) wid = i;
    double w[XENT_C * XENT_C];
    float wf[XENT_C * XENT_C];
    for (int i = 0; i < XENT_C * XENT_C; i++) w[i] = wf[i] = i / XENT_C == i % XENT_C;
    if (es && (wid < 0 || duet_session_write(es, wid, 0, f64 ? (void *)w : (void *)wf, XENT_C * XENT_C * es_b))) {
      fprintf(stderr, "FAIL %s: cannot set w\n", what);
      fails = 1;
    }
    for (int c = 0; c < N_XENT_CASES && es && fails == 0; c++) {
      const XentCase *xc = &xent_cases[c];
      if (!xent_case_runs(xc, prec, f64)) continue;
      double z[XENT_C], zs[XENT_C];
      float zf[XENT_C];
      for (int j = 0; j < XENT_C; j++) {
        z[j] = xc->z[j], zf[j] = (float)xc->z[j];
        /* the logits the program stores: z through its 16-bit GEMM, or z */
        zs[j] = f64 ? z[j] : !strcmp(prec, "fp16") ? duet_f32_from_f16(duet_f16_from_f32(zf[j]))
              : !strcmp(prec, "bf16")              ? duet_f32_from_bf16(duet_bf16_from_f32(zf[j]))
                                                   : zf[j];
      }
      int32_t y = xc->y;
      double loss = NAN, met[2] = {NAN, NAN};
      float lf = NAN, mf[2] = {NAN, NAN};
      duet_session_set_valid(es, 1);
      if (duet_session_write(es, p->input_x, 0, f64 ? (void *)z : (void *)zf, XENT_C * es_b) ||
          duet_session_write(es, p->input_y, 0, &y, sizeof y) || duet_session_run(es, DUET_RUN_GRAD) ||
          duet_session_read(es, p->loss, 0, f64 ? (void *)&loss : (void *)&lf, es_b) ||
          duet_session_run(es, DUET_RUN_EVAL) ||
          duet_session_read(es, p->metrics, 0, f64 ? (void *)met : (void *)mf, 2 * es_b)) {
        fprintf(stderr, "FAIL %s, %s: %s\n", what, xc->name, duet_session_error(es));
        fails++;
        break;
      }
      if (!f64) loss = lf, met[0] = mf[0], met[1] = mf[1];
      long double ref = xent_ref(zs, y);
      char w2[300];
      snprintf(w2, sizeof w2, "%s, %s: loss", what, xc->name);
      int f = xent_check(w2, loss, ref, f64);
      snprintf(w2, sizeof w2, "%s, %s: evaluation NLL", what, xc->name);
      f += xent_check(w2, met[1], ref, f64);
      n_run++;
      wrong += f != 0; /* and on with the other cases */
    }
    printf("%s %s: %d cases, loss and evaluation NLL%s\n", fails || wrong ? "FAIL" : "ok", what, n_run,
           wrong ? " (some wrong)" : "");
    bad |= fails || wrong;
    duet_session_free(es);
    free(d);
    scale_emu_close(&e);
    arena_free(a);
  }
  return bad;
}

/* Kernels of a block per item (attention rows, decoding heads, transpose
 * tiles: block_loop) cover every item on any grid: each such kernel, in
 * program order, from the same random state, on the emitter's grid and on
 * 3 blocks (of min(block, 64) threads as the other cases), must write the
 * same bits everywhere. */
static int scale_block_loops_emu(const char *dir) {
  int bad = 0, checked = 0;
  for (int prog = 0; prog < 3 && !bad; prog++) {
    const char *what = prog == 2 ? "block loops (llama_tiny decoding)"
                       : prog    ? "block loops (gpt_tiny decoding)"
                                 : "block loops (attention, transpose)";
    Arena *a = arena_new(1 << 20);
    Emu e;
    const CgProgram *cp =
        prog ? lower_model(a, prog == 2 ? DUET_SOURCE_DIR "/tests/models/llama_tiny.model"
                                        : DUET_SOURCE_DIR "/tests/models/gpt_tiny.model", NULL, DT_F32, true, NULL)
             : lower_model(a, "loops",
                           "model t\nparam q: [2,33,16]\nparam k: [2,33,16]\nparam v: [2,33,16]\nparam w: [37,45]\n"
                           "param k2: [2,33,8]\nparam v2: [2,33,8]\ninput r: f32[2,33,16]\ninput u: f32[45,37]\n"
                           "loss = mean(attention(q, k, v, heads = 2, causal = true) * r) + "
                           "mean(attention(q, k, v, heads = 4, causal = false) * r) + mean(transpose(w) * u) + "
                           "mean(attention(q, k2, v2, heads = 4, kv_heads = 2, causal = true) * r)\n",
                           DT_F32, false, NULL);
    if (scale_emu_build(&e, cp, a, dir, what)) {
      arena_free(a);
      return 1;
    }
    /* the program's regions (attention's statistics live after its
     * gradient, in bytes the memory plan reserves), N(0, 1) floats */
    const DuetProgram *p = e.p;
    void **ta = calloc((size_t)p->n_tensors + 1, sizeof *ta), **tb = calloc((size_t)p->n_tensors + 1, sizeof *tb);
    char *ra[DUET_MEM_COUNT] = {0}, *rb[DUET_MEM_COUNT] = {0};
    DuetRng r;
    duet_rng_seed(&r, 17, 4);
    bad = !ta || !tb;
    for (int g = 0; g < DUET_MEM_COUNT && !bad; g++) {
      size_t n = ((size_t)p->region_bytes[g] + 127) / 64 * 64;
      ra[g] = aligned_alloc(64, n), rb[g] = aligned_alloc(64, n);
      bad = !ra[g] || !rb[g];
      for (size_t j = 0; j < n / 4 && !bad; j++) ((float *)ra[g])[j] = (float)duet_rng_normal(&r);
      if (!bad) memcpy(rb[g], ra[g], n);
    }
    for (int i = 0; i < p->n_tensors && !bad; i++) {
      ta[i] = ra[p->tensors[i].region] + p->tensors[i].offset;
      tb[i] = rb[p->tensors[i].region] + p->tensors[i].offset;
    }
    double s[DUET_S_COUNT] = {0};
    s[DUET_S_POS] = 5;
    for (int ki = 0; ki < cp->n_kernels && !bad; ki++) {
      KernelKind kk = cp->kernels[ki].kind;
      if (kk != KK_ATTN_FWD && kk != KK_ATTN_BWD && kk != KK_ATTN_BWD_KV && kk != KK_ATTN_DECODE && kk != KK_TRANSPOSE)
        continue;
      if (scale_emu_run(&e, ki, ta, s, 0, 0) || scale_emu_run(&e, ki, tb, s, 3, 0)) {
        fprintf(stderr, "FAIL %s: emulated launch of kernel %d failed\n", what, ki);
        bad = 1;
      }
      checked++;
    }
    for (int g = 0; g < DUET_MEM_COUNT && !bad; g++)
      if (memcmp(ra[g], rb[g], (size_t)p->region_bytes[g])) {
        fprintf(stderr, "FAIL %s: region %d differs between the emitter's grids and 3 blocks\n", what, g);
        bad = 1;
      }
    for (int g = 0; g < DUET_MEM_COUNT; g++) free(ra[g]), free(rb[g]);
    free(ta), free(tb);
    scale_emu_close(&e);
    arena_free(a);
  }
  printf("%s block loops: %d attention, decoding and transpose kernels write the same bits on 3 blocks as on their grids\n",
         bad ? "FAIL" : "ok", checked);
  return bad;
}

static int check_scale(const char *dir) {
  int bad = scale_embedding_emu(dir);
  bad += scale_sum_emu(dir);
  bad += scale_xent_emu(dir);
  bad += scale_block_loops_emu(dir);
  return bad;
}

int main(int argc, char **argv) {
  const char *env = getenv("CXX");
  static const char *cands[] = {"c++", "g++", "clang++"};
  cxx = env && *env ? env : NULL;
  for (int i = 0; !cxx && i < 3; i++) {
    char *av[] = {(char *)cands[i], "--version", NULL};
    char log[256];
    if (jit_run(av, log, sizeof log) == 0) cxx = cands[i];
  }
  if (!cxx) {
    printf("SKIP: no C++ compiler (c++, g++, clang++) to build the emulated kernels\n");
    return 77;
  }
  if (argc >= 4 && !strcmp(argv[1], "--perturb")) {
    perturb_kind = argv[2];
    perturb_rel = atof(argv[3]);
    argv += 3, argc -= 3;
  }
  if (cuda_emu_seed(&emu_seed_value)) {
    fprintf(stderr, "FAIL DUET_EMU_SEED='%s' is not a decimal integer below 2^64\n", getenv("DUET_EMU_SEED"));
    return 1;
  }
  printf("blocks and released threads run in a random order: seed %llu (DUET_EMU_SEED=%llu replays it)\n",
         emu_seed_value, emu_seed_value);
  char dir[] = "/tmp/duet-cuda-emu.XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  int failed = 0, ran = 0;
  if (argc == 1 || !strcmp(argv[1], "scale")) { /* tests/scale_cases.h */
    failed += check_scale(dir) != 0;
    ran++;
  }
  if (argc == 1 || !strcmp(argv[1], "conversions")) {
    failed += check_conversions(dir);
    ran++;
  }
  if (argc == 1 || !strcmp(argv[1], "half2")) {
    failed += check_half2_helpers(dir);
    ran++;
  }
  if (argc == 1 || !strcmp(argv[1], "emulator")) {
    failed += check_emulator(dir);
    ran++;
  }
  for (int i = 0; i < N_OP_CASES; i++)
    for (int f = 0; f < 2; f++) {
      if (argc > 1 && strcmp(argv[1], cases[i].name)) continue;
      failed += run_case(&cases[i], f ? DT_F64 : DT_F32, NULL, dir);
      ran++;
    }
  /* multi-block paths: the loss's partial sums over 10 blocks, reductions,
   * transpose tiles, embedding columns, clipping's sums of squares (the other big cases need too many
   * emulated threads) */
  for (int i = 0; i < N_BIG_CASES; i++) {
    const char *nm = big_cases[i].name;
    if (strcmp(nm, "big_cross_entropy") && strcmp(nm, "big_reductions") && strcmp(nm, "big_transpose") &&
        strcmp(nm, "big_embedding") && strcmp(nm, "big_softmax") && strcmp(nm, "big_mse") &&
        strcmp(nm, "big_clip_grad_norm"))
      continue;
    if (argc > 1 && strcmp(argv[1], nm)) continue;
    failed += run_case(&big_cases[i], DT_F32, NULL, dir);
    ran++;
  }
  if (argc == 1 || !strcmp(argv[1], "gpt_tiny")) {
    char *text = slurp(DUET_SOURCE_DIR "/tests/models/gpt_tiny.model");
    if (!text) {
      fprintf(stderr, "FAIL cannot read tests/models/gpt_tiny.model\n");
      failed++;
    } else {
      Case c = {"gpt_tiny", text, 256};
      failed += run_case(&c, DT_F32, NULL, dir);
      ran++;
      free(text);
    }
  }
  /* 16-bit storage (--precision fp16 with loss scaling, bf16): op cases
   * with 16-bit GEMMs, casts and paired elementwise kernels, and a forced
   * overflow (the gradient seed 2^16 times 1e6 / 32 exceeds fp16's 65504):
   * the multi-block unscale kernels must flag it, so that both backends
   * skip the step and halve the scale */
  static const char *const half_cases[] = {"mlp", "matmul_rank3_tied", "gelu", "dropout_broadcast", "reuse",
                                            "exp_log", "tanh", "sigmoid", "softmax_axis", "mse_loss"};
  for (int i = 0; i < N_OP_CASES; i++)
    for (int j = 0; j < (int)(sizeof half_cases / sizeof *half_cases); j++)
      if (!strcmp(cases[i].name, half_cases[j]) && (argc == 1 || !strcmp(argv[1], cases[i].name))) {
        failed += run_case(&cases[i], DT_F32, "fp16", dir);
        failed += run_case(&cases[i], DT_F32, "bf16", dir);
        ran += 2;
      }
  /* a one-layer GPT (gpt_tiny's layer, smaller) in fp16 and bf16: every
   * kernel kind of a transformer next to 16-bit GEMMs and casts (gpt_tiny
   * itself takes 20 s per precision in the emulator) */
  if (argc == 1 || !strcmp(argv[1], "gpt_mini")) {
    Case c = {"gpt_mini",
              "model gpt_mini\ninput idx: i32[2, 8]\ninput targets: i32[2, 8]\n"
              "block linear(x, out) {\n  param w: [dim(x, -1), out] = normal(0.1)\n  param b: [out] = normal(0.1)\n"
              "  return x @ w + b\n}\n"
              "block ln(x) {\n  param w: [dim(x, -1)] = ones\n  param b: [dim(x, -1)] = zeros\n"
              "  return layernorm(x, w, b)\n}\n"
              "param wte: [64, 16] = normal(0.1)\nparam wpe: [8, 16] = normal(0.1)\n"
              "x = embedding(wte, idx) + embedding(wpe, positions(idx))\nh = ln(x)\n"
              "a = attention(linear(h, 16), linear(h, 16), linear(h, 16), heads = 2, causal = true)\n"
              "x = x + linear(a, 16)\nx = x + linear(gelu(linear(ln(x), 32)), 16)\n"
              "loss = cross_entropy(ln(x) @ transpose(wte), targets)\n",
              64};
    failed += run_case(&c, DT_F32, "fp16", dir);
    failed += run_case(&c, DT_F32, "bf16", dir);
    ran += 2;
  }
  /* activation recomputation (`recompute = "blocks"`): two `repeat`
   * layers with dropout whose forward ops are copied into the backward
   * pass; the copies are ordinary kernels, so the CUDA C must agree with
   * the C backend as for any graph (and the graph must hold copies) */
  if (argc == 1 || !strcmp(argv[1], "gpt_mini_recompute")) {
    Case c = {"gpt_mini_recompute",
              "model gpt_mini_recompute\ninput idx: i32[2, 8]\ninput targets: i32[2, 8]\n"
              "block linear(x, out) {\n  param w: [dim(x, -1), out] = normal(0.1)\n  param b: [out] = normal(0.1)\n"
              "  return x @ w + b\n}\n"
              "block ln(x) {\n  param w: [dim(x, -1)] = ones\n  param b: [dim(x, -1)] = zeros\n"
              "  return layernorm(x, w, b)\n}\n"
              "block layer(x) {\n  h = ln(x)\n"
              "  a = attention(linear(h, 16), linear(h, 16), linear(h, 16), heads = 2, causal = true)\n"
              "  x = x + dropout(linear(a, 16), 0.25)\n  return x + linear(gelu(linear(ln(x), 32)), 16)\n}\n"
              "param wte: [64, 16] = normal(0.1)\nparam wpe: [8, 16] = normal(0.1)\n"
              "x = embedding(wte, idx) + embedding(wpe, positions(idx))\nx = repeat(2, layer, x)\n"
              "loss = cross_entropy(ln(x) @ transpose(wte), targets)\n"
              "train {\n  recompute = \"blocks\"\n}\n",
              64};
    TModel t;
    FrontendOptions fo = {.float_dtype = DT_F32};
    int copies = 0;
    if (tmodel_open_prec(&t, c.name, c.src, &fo, "fp32")) {
      fprintf(stderr, "FAIL gpt_mini_recompute: does not compile\n");
      failed++;
    } else {
      for (int i = 0; i < t.g->n_values; i++) copies += t.g->values[i]->block > 0 && t.g->values[i]->role == ROLE_BACKWARD;
      tmodel_close(&t);
      if (copies < 20) {
        fprintf(stderr, "FAIL gpt_mini_recompute: %d recomputed copies in the graph, expected at least 20\n", copies);
        failed++;
      }
    }
    failed += run_case(&c, DT_F32, NULL, dir);
    ran++;
  }
  /* rotary embeddings at a decoding position (7): the CUDA kernel's
   * angles follow s[POS] as the C kernel's (test_decode checks the C
   * kernel's against the full forward pass) */
  for (int i = 0; i < N_OP_CASES; i++)
    if (!strcmp(cases[i].name, "rope") && (argc == 1 || !strcmp(argv[1], "rope_pos"))) {
      Case c = cases[i];
      c.name = "rope at position 7";
      run_pos = 7;
      failed += run_case(&c, DT_F32, NULL, dir);
      run_pos = 0;
      ran++;
    }
  /* decoding with key/value caches (attention_decode; rope at the step's
   * position; grouped-query caches of 2 key/value heads for 4 query heads):
   * tests/models/llama_tiny.model and gpt_tiny, 6 tokens */
  for (int m = 0; m < 2; m++) {
    const char *nm = m ? "gpt_tiny_decode" : "llama_tiny_decode";
    if (argc > 1 && strcmp(argv[1], nm)) continue;
    char *text = slurp(m ? DUET_SOURCE_DIR "/tests/models/gpt_tiny.model" : DUET_SOURCE_DIR "/tests/models/llama_tiny.model");
    if (!text) {
      fprintf(stderr, "FAIL %s: cannot read the model\n", nm);
      failed++;
      continue;
    }
    Case c = {nm, text, 256};
    run_decode = 6;
    failed += run_case(&c, DT_F32, NULL, dir);
    run_decode = 0;
    ran++;
    free(text);
  }
  /* a one-layer LLaMA (tests/models/llama_tiny.model's layer, smaller) in
   * f32, fp16 and bf16: rmsnorm, rope on queries and keys, attention of 4
   * query heads over 2 key/value heads, a SwiGLU MLP, next to 16-bit GEMMs */
  if (argc == 1 || !strcmp(argv[1], "llama_mini")) {
    Case c = {"llama_mini",
              "model llama_mini\ninput idx: i32[2, 8]\ninput targets: i32[2, 8]\n"
              "block linear(x, out) {\n  param w: [dim(x, -1), out] = normal(0.2)\n  return x @ w\n}\n"
              "block norm(x) {\n  param w: [dim(x, -1)] = normal(1)\n  return rmsnorm(x, w)\n}\n"
              "param wte: [64, 16] = normal(0.5)\nx = embedding(wte, idx)\nh = norm(x)\n"
              "q = rope(linear(h, 16), heads = 4)\nk = rope(linear(h, 8), heads = 2)\n"
              "a = attention(q, k, linear(h, 8), heads = 4, kv_heads = 2, causal = true)\n"
              "x = x + linear(a, 16)\nh = norm(x)\nx = x + linear(silu(linear(h, 32)) * linear(h, 32), 16)\n"
              "loss = cross_entropy(linear(norm(x), 64), targets)\n",
              64};
    failed += run_case(&c, DT_F32, NULL, dir);
    failed += run_case(&c, DT_F32, "fp16", dir);
    failed += run_case(&c, DT_F32, "bf16", dir);
    ran += 3;
  }
  /* the half2 path's operations (fp16): f16x2 mul, sub and add, an fp16
   * constant, negation, relu, copies (reshape, permute), a bias word and
   * a half2 chain ending in f32 arithmetic; bf16 keeps f32 lanes */
  if (argc == 1 || !strcmp(argv[1], "half2_ops")) {
    Case c = {"half2_ops",
              "model half2_ops\nparam w: [6, 8]\nparam v: [6, 8]\nparam b: [8]\ninput x: f32[4, 6]\n"
              "input r: f32[4, 8]\np = x @ w\nq = x @ v\nh = relu(p * q - p) - q * 0.5 + -p + b\n"
              "loss = mean((h + permute(reshape(p, 8, 4), 1, 0)) * r)\n",
              0};
    failed += run_case(&c, DT_F32, "fp16", dir);
    failed += run_case(&c, DT_F32, "bf16", dir);
    ran += 2;
  }
  if (argc == 1 || !strcmp(argv[1], "overflow")) {
    Case c = {"overflow", "model t\nparam a: [4,300]\nparam b: [300,8]\ninput r: f32[4,8]\n"
                          "loss = mean((a @ b) * r) * 1000000\n", 0};
    failed += run_case(&c, DT_F32, "fp16", dir);
    ran++;
  }
  /* pruning: the prune_mask kernels (param, mask, AdamW state; param,
   * mask, momentum buffer) after a training step with masks chosen on the
   * host; in fp16 too (the f32 master weights are masked) */
  if (argc == 1 || !strcmp(argv[1], "prune")) {
    static const char *const opt[2] = {"adamw(lr = 1e-2, weight_decay = 0.1)",
                                       "sgd(lr = 0.05, momentum = 0.9, weight_decay = 0.01)"};
    for (int k = 0; k < 2; k++) {
      char text[1024];
      snprintf(text, sizeof text,
               "model prune\ninput x: f32[4, 18]\ninput y: i32[4]\nparam cw: [4, 2, 2, 2]\nparam w: [16, 8]\n"
               "param b: [8] = zeros\nc = conv2d(reshape(x, 4, 2, 3, 3), cw, padding = 1)\n"
               "loss = cross_entropy(flatten(max_pool2d(c, 2)) @ w + b, y)\n"
               "train {\n  optimizer = %s\n}\nprune {\n  sparsity = 0.5\n  params = \"cw, w, b\"\n}\n", opt[k]);
      Case c = {k ? "prune_sgd" : "prune_adamw", text, 8};
      failed += run_case(&c, DT_F32, NULL, dir);
      failed += run_case(&c, DT_F32, "fp16", dir);
      ran += 2;
    }
  }
  /* 8-bit AdamW state: the adamw8 kernels (a CUDA block per quantization
   * block; w's 4,800 values are two full blocks and a partial one, b's and
   * v's one partial block each), bit for bit against the C kernels
   * (lockstep: params, codes and scales), in fp32 and fp16 (f32 master
   * weights); and with pruning (prune_mask zeroes the u8 codes).  Two
   * training steps, so the second decodes the first's state. */
  if (argc == 1 || !strcmp(argv[1], "adamw8")) {
    for (int k = 0; k < 2; k++) {
      char text[1024];
      snprintf(text, sizeof text,
               "model adamw8\ninput x: f32[4, 48]\ninput y: i32[4]\nparam w: [48, 100]\nparam b: [100] = zeros\n"
               "param v: [100, 8]\nloss = cross_entropy(relu(x @ w + b) @ v * 0.01, y)\n"
               "train {\n  optimizer = adamw(lr = 1e-2, weight_decay = 0.1, state = int8)\n}\n%s",
               k ? "prune {\n  sparsity = 0.5\n  params = \"w, v\"\n}\n" : "");
      Case c = {k ? "adamw8_prune" : "adamw8", text, 8};
      failed += run_case(&c, DT_F32, NULL, dir);
      failed += run_case(&c, DT_F32, "fp16", dir);
      ran += 2;
    }
  }
  /* int8 weights (--quantize int8, int8-tensor): the dequantize kernels
   * (i8 weights x f32 scales broadcast per output channel of a convolution
   * [out, in, kh, kw], of x @ w [in, out], of x @ transpose(v) [out, in];
   * or one per tensor) and the GEMMs they feed, an evaluation in f32 and
   * fp16 (dequantize, then a cast to fp16) */
  if (argc == 1 || !strcmp(argv[1], "quantize")) {
    static const char *const modes[2] = {"int8", "int8-tensor"};
    for (int k = 0; k < 2; k++) {
      const char *text = "model quantize\ninput x: f32[4, 18]\ninput y: i32[4]\nparam cw: [4, 2, 2, 2]\n"
                         "param w: [64, 8]\nparam b: [8] = zeros\nparam v: [5, 8]\n"
                         "c = conv2d(reshape(x, 4, 2, 3, 3), cw, padding = 1)\n"
                         "loss = cross_entropy(relu(flatten(c) @ w + b) @ transpose(v), y)\n";
      Case c = {k ? "quantize_tensor" : "quantize", text, 5};
      run_quantize = modes[k];
      failed += run_case(&c, DT_F32, NULL, dir);
      failed += run_case(&c, DT_F32, "fp16", dir);
      run_quantize = NULL;
      ran += 2;
    }
  }
  /* int8 activations (--quantize int8 --calibrate): the int8 GEMM kernels
   * (x @ w per channel, x @ transpose(v); per tensor), K = 300 and 270
   * (blocks of 256 and 64 with a remainder), 270 output channels (two C
   * tiles, 17 CUDA tiles), 6 rows; calibration (f32 path, -max|x|), then
   * the int8 path, logits bit for bit; with __dp4a and with DUET_NO_DP4A */
  if (argc == 1 || !strcmp(argv[1], "w8a8")) {
    for (int k = 0; k < 3; k++) {
      const char *text = "model w8a8\ninput x: f32[6, 300]\ninput y: i32[6]\nparam w: [300, 270]\n"
                         "param b: [270] = zeros\nparam v: [5, 270]\n"
                         "loss = cross_entropy(relu(x @ w + b) @ transpose(v), y)\n";
      Case c = {k == 0 ? "w8a8" : k == 1 ? "w8a8_tensor" : "w8a8_no_dp4a", text, 5};
      run_quantize = k == 1 ? "int8-tensor" : "int8";
      run_calibrate = true, tmodel_calibrate = 1, emu_no_dp4a = k == 2;
      failed += run_case(&c, DT_F32, NULL, dir);
      run_quantize = NULL;
      run_calibrate = false, tmodel_calibrate = 0, emu_no_dp4a = false;
      ran++;
    }
  }
  /* --shrink (channels pruning's zero channels removed): a convolution
   * [4 -> 2 channels] through relu and flatten into x @ w (its rows in
   * groups of 16), w [64 -> 32, 8 -> 4] with its bias and relu into
   * x @ transpose(v) (v [5, 4]): the smaller GEMMs, im2col, permutes and
   * elementwise kernels of an evaluation, f32 and fp16 */
  if (argc == 1 || !strcmp(argv[1], "shrink")) {
    const char *text = "model shrink\ninput x: f32[4, 18]\ninput y: i32[4]\nparam cw: [4, 2, 2, 2]\n"
                       "param w: [64, 8]\nparam b: [8] = zeros\nparam v: [5, 8]\n"
                       "c = conv2d(reshape(x, 4, 2, 3, 3), cw, padding = 1)\n"
                       "loss = cross_entropy(relu(flatten(relu(c)) @ w + b) @ transpose(v), y)\n";
    Case c = {"shrink", text, 5};
    run_shrink = 0.5;
    failed += run_case(&c, DT_F32, NULL, dir);
    failed += run_case(&c, DT_F32, "fp16", dir);
    run_shrink = 0;
    ran += 2;
  }
  /* quantization-aware training (quantize { weights = int8  mode = qat }):
   * the fake_quantize kernels and the max_to maxima they read, forward,
   * backward (straight-through) and a training step, f32 and fp16, per
   * channel and per tensor */
  if (argc == 1 || !strcmp(argv[1], "qat")) {
    for (int k = 0; k < 2; k++) {
      char text[1024];
      snprintf(text, sizeof text,
               "model qat\ninput x: f32[4, 18]\ninput y: i32[4]\nparam cw: [4, 2, 2, 2]\n"
               "param w: [64, 8]\nparam b: [8] = zeros\nparam v: [5, 8]\n"
               "c = conv2d(reshape(x, 4, 2, 3, 3), cw, padding = 1)\n"
               "loss = cross_entropy(relu(flatten(c) @ w + b) @ transpose(v), y)\n"
               "train {\n  optimizer = adamw(lr = 1e-2)\n}\n"
               "quantize { weights = int8, mode = qat, granularity = %s }\n", k ? "tensor" : "channel");
      Case c = {k ? "qat_tensor" : "qat", text, 5};
      failed += run_case(&c, DT_F32, NULL, dir);
      failed += run_case(&c, DT_F32, "fp16", dir);
      ran += 2;
    }
  }
  if (half2_checked)
    printf("half2 kernels run alone on random bits against the C kernels: %d\n", half2_checked);
  if (argc == 1) { /* the whole run must have covered every half2 operation */
    static const KOp want[] = {KI_ADD, KI_SUB, KI_MUL, KI_NEG, KI_RELU, KI_RELU_GRAD, KI_CONST, KI_CAST};
    static const char *const names[] = {"add", "sub", "mul", "neg", "relu", "relu_grad", "const", "cast"};
    for (int i = 0; i < (int)(sizeof want / sizeof *want); i++)
      if (!half2_ops_seen[want[i]]) {
        fprintf(stderr, "FAIL no half2 kernel with a %s was checked\n", names[i]);
        failed++;
      }
  }
  if (stats16.n16)
    printf("16-bit elements: %lld of %lld bit-identical (%.2f%%)\n", stats16.same16, stats16.n16,
           100.0 * (double)stats16.same16 / (double)stats16.n16);
  char rm[256];
  snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
  if (system(rm)) fprintf(stderr, "warning: could not remove %s\n", dir);
  if (failed) fprintf(stderr, "%d of %d cases failed\n", failed, ran);
  else printf("ok: %d cases agree with the CPU backend\n", ran);
  return failed ? 1 : 0;
}
