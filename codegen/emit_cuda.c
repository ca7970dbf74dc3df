/* codegen/emit_cuda.c: kernel IR -> CUDA C for NVRTC, and each kernel's
 * launch configuration.
 *
 * Every function is `extern "C" __global__ void duet_k<f>(duet_args t,
 * duet_scalars sv)`: t.p[j] is the kernel's argument j (a tensor's
 * address), sv.v the runtime scalars (DUET_S_*), both
 * passed by value: cuLaunchKernel copies parameters at the launch, so a
 * queued kernel keeps the scalars of its launch while the host changes
 * them for the next micro-batch (a copy from pageable host memory to a
 * device buffer is not guaranteed to have read its source when
 * cuMemcpyHtoDAsync returns).  Kernels that differ only in their tensors (the
 * repeated layers of a model) share one function.  The source
 * includes no header (NVRTC ships none that duet needs): integer types are
 * typedef'd here and the math functions are NVRTC built-ins.  GPU-only
 * constructs live in the few helpers of the prelude (warp and block
 * reductions). */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "../runtime/duet_q8.h"

#define D64 "%" PRId64

static const char *cutype(DType t) {
  switch (t) {
  case DT_F32: return "float";
  case DT_F64: return "double";
  case DT_I32: return "duet_i32";
  case DT_F16: case DT_BF16: return "duet_u16"; /* raw bits; see PRELUDE_HALF */
  case DT_U8: return "unsigned char";            /* 8-bit AdamW state codes */
  case DT_I8: return "signed char";              /* quantized weights (passes/quantize.c) */
  default: unreachable();
  }
}

static int64_t dsize(DType t) { return t == DT_F64 ? 8 : t == DT_F16 || t == DT_BF16 ? 2 : t == DT_U8 || t == DT_I8 ? 1 : 4; }

static bool is16(DType t) { return t == DT_F16 || t == DT_BF16; }

/* Arithmetic type of a kernel of (storage) dtype t: 16-bit values widen to
 * f32 (as the C emitter: fp32 arithmetic and accumulation). */
static DType compute_dtype(DType t) { return is16(t) ? DT_F32 : t; }

/* Widening of a loaded element and narrowing of a stored one (PRELUDE_HALF). */
static const char *load_fn(DType t) { return t == DT_F16 ? "duet_f32_from_f16" : t == DT_BF16 ? "duet_f32_from_bf16" : ""; }
static const char *store_fn(DType t) { return t == DT_F16 ? "duet_f16_from_f32" : t == DT_BF16 ? "duet_bf16_from_f32" : ""; }

/* -------------------------------------------------------- launch sizes */

/* A buffer read or written at element i itself (plus an even base): with
 * 16-bit storage, two neighbours share one aligned 32-bit word (tensors are
 * 64-byte aligned by the memory planner). */
static bool pair_buf(const KBuf *kb) {
  if (!is16(kb->dtype) || kb->n_terms != 1 || kb->base % 2) return false;
  const KIndexTerm *x = &kb->terms[0];
  return x->div == 1 && x->mul == 1 && !x->mod;
}

/* An elementwise kernel that takes two elements per thread (see
 * emit_elementwise): an even count and some pair buffer. */
static bool ew_paired(const Kernel *k) {
  bool pairs = false;
  for (int i = 0; i < k->n_bufs; i++) pairs |= pair_buf(&k->bufs[i]);
  return pairs && k->n % 2 == 0;
}

#define EW_BLOCK 256
#define MAX_GRID 65535 /* grid-stride loops cover the rest */

static uint32_t grid_for(int64_t work, int64_t per_block) {
  int64_t g = (work + per_block - 1) / per_block;
  if (g < 1) g = 1;
  if (g > MAX_GRID) g = MAX_GRID;
  return (uint32_t)g;
}

/* Blocks of a kernel with one block per item (block_loop): one per item,
 * at most CUDA's 2^31 - 1 (gridDim.x); the kernel loops over the rest. */
static uint32_t block_grid(int64_t items) {
  return (uint32_t)(items < 1 ? 1 : items > INT32_MAX ? INT32_MAX : items);
}

/* Dynamic shared memory bytes, saturated: a size past 32 bits stays past
 * every card's limit, which the runtime checks, instead of wrapping. */
static uint32_t shared_bytes(int64_t bytes) { return (uint32_t)(bytes > UINT32_MAX ? UINT32_MAX : bytes); }

/* threads of a row kernel: a multiple of 32 (the reduction helpers use
 * full-warp shuffles), at most 256 */
static uint32_t row_block(int64_t cols) {
  int64_t b = (cols + 31) / 32 * 32;
  return (uint32_t)(b > 256 ? 256 : b < 32 ? 32 : b);
}

/* blocks of the loss and metrics kernels: a warp per row, 32 rows per
 * block and pass, at most 256 blocks (their partial sums are combined in
 * order by the last block to finish) */
static uint32_t xent_grid(int64_t rows) {
  int64_t g = (rows + 31) / 32;
  return (uint32_t)(g < 1 ? 1 : g > 256 ? 256 : g);
}

/* A sum of a whole tensor (see emit_reduce): a grid of up to 1024 blocks
 * of 256 threads, at least 16 elements per thread, the blocks' partial
 * sums in a module-scope array of that size. */
static bool reduce_whole(const Kernel *k) {
  return k->kind == KK_REDUCE && !k->reduce_max && k->outer == 1 && k->inner == 1;
}

static uint32_t whole_grid(int64_t n) {
  uint32_t g = grid_for(n, 16 * EW_BLOCK);
  return g < 1024 ? g : 1024;
}

/* Embedding backward: vocabulary rows split into this many chunks, so
 * about 64K threads (column, chunk) share the work; each scans every token
 * id (a broadcast read) and adds only those in its chunk. */
static int64_t embed_chunks(const Kernel *k) {
  int64_t J = k->cols > 0 ? 65536 / k->cols : 1;
  if (J < 1) J = 1;
  return J < k->outer ? J : k->outer > 0 ? k->outer : 1;
}

void codegen_cuda_launch(const Kernel *k, DuetLaunch *l) {
  int64_t ts = dsize(k->dtype);
  l->shared = 0;
  l->block = EW_BLOCK;
  switch (k->kind) {
  case KK_ELEMENTWISE: l->grid = grid_for(ew_paired(k) ? k->n / 2 : k->n, EW_BLOCK); break;
  case KK_REDUCE:
  case KK_MAX_GRAD:
    if (reduce_whole(k)) l->grid = whole_grid(k->red);
    else if (k->kind == KK_REDUCE && !k->reduce_max && k->inner == 1) l->grid = grid_for(k->outer, 1);
    else l->grid = grid_for(k->outer * k->inner, EW_BLOCK);
    break;
  case KK_XENT_FWD:
  case KK_EVAL_METRICS: l->grid = xent_grid(k->rows), l->block = 1024; break;
  case KK_XENT_BWD:
  case KK_NORM_FWD:
  case KK_NORM_BWD: l->grid = grid_for(k->rows, 1), l->block = row_block(k->cols); break;
  case KK_EMBED_FWD: l->grid = grid_for(k->rows * k->cols, EW_BLOCK); break;
  case KK_EMBED_BWD: l->grid = grid_for(k->cols * embed_chunks(k), EW_BLOCK); break;
  case KK_ATTN_FWD:
    l->grid = block_grid(k->batch * k->heads * k->time), l->block = 128, l->shared = shared_bytes(k->time * ts);
    break;
  case KK_ATTN_BWD:
  case KK_ATTN_BWD_KV: /* key rows of grouped-query attention: a block per key/value head's row */
    l->grid = block_grid(k->batch * (k->kind == KK_ATTN_BWD_KV && k->kv_heads > 0 ? k->kv_heads : k->heads) * k->time);
    l->block = 128, l->shared = shared_bytes(2 * k->time * ts);
    break;
  case KK_SOFTMAX:
  case KK_SOFTMAX_BWD: /* a block per row of the last axis, else a thread per column */
    if (k->inner == 1) l->grid = grid_for(k->outer, 1), l->block = row_block(k->red);
    else l->grid = grid_for(k->outer * k->inner, EW_BLOCK);
    break;
  case KK_RMSNORM_FWD:
  case KK_RMSNORM_BWD: l->grid = grid_for(k->rows, 1), l->block = row_block(k->cols); break;
  case KK_ROPE: l->grid = grid_for(k->batch * k->time * (k->cols / 2), EW_BLOCK); break;
  case KK_MSE: l->grid = whole_grid(k->n); break;
  case KK_ATTN_DECODE:
    l->grid = block_grid(k->batch * k->heads), l->block = 128, l->shared = shared_bytes(k->time * ts);
    break;
  case KK_TRANSPOSE: l->grid = block_grid(((k->rows + 31) / 32) * ((k->cols + 31) / 32)); break;
  case KK_POSITIONS: l->grid = grid_for(k->rows, EW_BLOCK); break;
  case KK_UNSCALE: l->grid = grid_for(k->n, EW_BLOCK); break;
  case KK_SUMSQ: l->grid = whole_grid(k->n); break;
  case KK_CLIP_SCALE: l->grid = grid_for(k->n, EW_BLOCK); break;
  case KK_ADAMW8: l->grid = block_grid(duet_q8_blocks(k->n)); break; /* a block per quantization block */
  case KK_GEMM_I8: l->grid = block_grid(((k->rows + 15) / 16) * ((k->cols + 15) / 16)); break; /* 16 x 16 tiles */
  case KK_IM2COL: {
    int64_t n = k->xs.dim[0] * k->ys.dim[2] * k->ys.dim[3] * k->xs.dim[1] * k->win[0] * k->win[1];
    l->grid = grid_for(n, EW_BLOCK);
    break;
  }
  case KK_COL2IM:
  case KK_MAXPOOL_GRAD:
  case KK_AVGPOOL_GRAD:
    l->grid = grid_for(k->xs.dim[0] * k->xs.dim[1] * k->xs.dim[2] * k->xs.dim[3], EW_BLOCK);
    break;
  case KK_MAXPOOL:
  case KK_AVGPOOL: l->grid = grid_for(k->ys.dim[0] * k->ys.dim[1] * k->ys.dim[2] * k->ys.dim[3], EW_BLOCK); break;
  default: unreachable();
  }
}

/* ---------------------------------------------------------- the kernels */

#define BUF(i, cst) cst, T, cst, T, (i) /* the kernel's argument i */
/* grid-stride loop over `n` items with index variable `v` */
#define GRID_LOOP(b, v, n)                                                                                   \
  bprintf(b, "  for (duet_i64 " v " = blockIdx.x * (duet_i64)blockDim.x + threadIdx.x; " v " < " D64 "; " v \
             " += (duet_i64)blockDim.x * gridDim.x) {\n",                                                      \
          (int64_t)(n))

static void emit_const(Buf *b, DType t, double v) {
  if (isnan(v)) bprintf(b, "(%s)__longlong_as_double(0x7ff8000000000000ll)", cutype(t));
  else if (isinf(v)) bprintf(b, "(%s)__longlong_as_double(0x%sff0000000000000ll)", cutype(t), v < 0 ? "f" : "7");
  else bprintf(b, "(%s)%a", cutype(t), v); /* hexadecimal: exact (C++17) */
}

/* Largest element index a buffer reaches over i in [0, n). */
static int64_t max_index(const KBuf *kb, int64_t n) {
  int64_t m = kb->base;
  for (int t = 0; t < kb->n_terms; t++) {
    const KIndexTerm *x = &kb->terms[t];
    int64_t q = (n - 1) / x->div;
    if (x->mod && q > x->mod - 1) q = x->mod - 1;
    m += q * x->mul;
  }
  return m;
}

static void index_expr(Buf *b, const KBuf *kb, const char *iv) {
  if (kb->base) bprintf(b, D64 " + ", kb->base);
  if (kb->n_terms == 0) {
    bprintf(b, "0");
    return;
  }
  for (int t = 0; t < kb->n_terms; t++) {
    const KIndexTerm *x = &kb->terms[t];
    bprintf(b, "%s", t ? " + " : "");
    bool paren = x->mul != 1 && (x->div != 1 || x->mod);
    bprintf(b, "%s", paren ? "(" : "");
    if (x->div != 1) bprintf(b, "%s / " D64, iv, x->div);
    else bprintf(b, "%s", iv);
    if (x->mod) bprintf(b, " %% " D64, x->mod);
    bprintf(b, "%s", paren ? ")" : "");
    if (x->mul != 1) bprintf(b, " * " D64, x->mul);
  }
}

/* Instruction i of an elementwise kernel (not a load or store) in f32
 * (or the kernel's float type) for element `iv`, as register r<i><sfx>;
 * operands are r<a><sfx>, r<b><sfx>. */
static void emit_ew_op(Buf *b, const Kernel *k, int i, const char *iv, const char *sfx) {
  const DType KD = compute_dtype(k->dtype);
  const char *T = cutype(KD);
  const char *sq = KD == DT_F32 ? "sqrtf" : "sqrt";
  const char *th = KD == DT_F32 ? "tanhf" : "tanh";
  const KInstr *x = &k->ins[i];
  bprintf(b, "    const %s r%d%s = ", T, i, sfx);
#define R(n) (n), sfx
  switch (x->op) {
  case KI_CONST: emit_const(b, KD, x->value); break;
  case KI_CAST: { /* round to the 16-bit dtype, keep computing in f32 (as the C emitter) */
    DType to = (DType)(int)x->value;
    if (is16(to)) bprintf(b, "%s(%s(r%d%s))", load_fn(to), store_fn(to), R(x->a));
    else bprintf(b, "(%s)r%d%s", T, R(x->a));
    break;
  }
  case KI_SCALAR: bprintf(b, "s%d", i); break;
  case KI_ADD: bprintf(b, "r%d%s + r%d%s", R(x->a), R(x->b)); break;
  case KI_SUB: bprintf(b, "r%d%s - r%d%s", R(x->a), R(x->b)); break;
  case KI_MUL: bprintf(b, "r%d%s * r%d%s", R(x->a), R(x->b)); break;
  case KI_DEQUANTIZE: bprintf(b, "r%d%s * r%d%s", R(x->a), R(x->b)); break; /* int8 (exact in f32) x scale */
  case KI_FAKE_QUANT: bprintf(b, "duet_fake_quant(r%d%s, r%d%s)", R(x->a), R(x->b)); break; /* PRELUDE_FAKE_QUANT */
  case KI_DIV: bprintf(b, "r%d%s / r%d%s", R(x->a), R(x->b)); break;
  case KI_NEG: bprintf(b, "-r%d%s", R(x->a)); break;
  case KI_RELU: bprintf(b, "r%d%s < 0 ? (%s)0 : r%d%s", R(x->a), T, R(x->a)); break; /* NaN passes through */
  case KI_RELU_GRAD: bprintf(b, "r%d%s > 0 ? r%d%s : (%s)0", R(x->b), R(x->a), T); break;
  case KI_SQRT: bprintf(b, "%s(r%d%s)", sq, R(x->a)); break;
  /* GELU, tanh approximation (Hendrycks & Gimpel 2016, as GPT-2); the
   * same formula as the C emitter */
  case KI_GELU:
    bprintf(b, "(%s)0.5 * r%d%s * (1 + %s((%s)0.7978845608028654 * (r%d%s + (%s)0.044715 * r%d%s * r%d%s * r%d%s)))",
            T, R(x->a), th, T, R(x->a), T, R(x->a), R(x->a), R(x->a));
    break;
  case KI_GELU_GRAD: bprintf(b, "duet_gelu_grad(r%d%s, r%d%s)", R(x->a), R(x->b)); break;
  /* exp, log (log 0 = -inf, of a negative or NaN: NaN), tanh: the CUDA
   * math library's; sigmoid and silu from exp(-|x|) (PRELUDE_SIGMOID), as
   * the C emitter */
  case KI_EXP: bprintf(b, "%s(r%d%s)", KD == DT_F32 ? "expf" : "exp", R(x->a)); break;
  case KI_LOG: bprintf(b, "%s(r%d%s)", KD == DT_F32 ? "logf" : "log", R(x->a)); break;
  case KI_TANH: bprintf(b, "%s(r%d%s)", th, R(x->a)); break;
  case KI_TANH_GRAD: bprintf(b, "r%d%s * (1 - r%d%s * r%d%s)", R(x->a), R(x->b), R(x->b)); break;
  case KI_SIGMOID: bprintf(b, "duet_sigmoid(r%d%s)", R(x->a)); break;
  case KI_SIGMOID_GRAD: bprintf(b, "r%d%s * (r%d%s * (1 - r%d%s))", R(x->a), R(x->b), R(x->b)); break;
  case KI_SILU: bprintf(b, "r%d%s * duet_sigmoid(r%d%s)", R(x->a), R(x->a)); break;
  case KI_SILU_GRAD: bprintf(b, "duet_silu_grad(r%d%s, r%d%s)", R(x->a), R(x->b)); break;
  /* dropout: the C emitter's hash of (step seed, site, flat index), so
   * both backends draw the same mask */
  case KI_DROPOUT: {
    double scaled = x->value * 18446744073709551616.0; /* p * 2^64 */
    uint64_t thr = scaled >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)scaled;
    bprintf(b, "!training ? r%d%s : duet_dropout_keep(drop_seed, " D64 "ull, (duet_u64)%s, %" PRIu64
               "ull) ? r%d%s * (%s)%a : (%s)0",
            R(x->a), (int64_t)x->b, iv, thr, R(x->a), T, 1.0 / (1.0 - x->value), T);
    break;
  }
#undef R
  default: unreachable();
  }
  bprintf(b, ";\n");
}

/* The instructions of an elementwise kernel for element `iv` (a variable
 * name), registers r<n><sfx>; with `pairs`, loads of pair buffers take half
 * `h` of the word w<buf> and stores to them are left to the caller. */
static void emit_ew_body(Buf *b, const Kernel *k, const char *iv, const char *sfx, bool pairs, int h) {
  const char *T = cutype(compute_dtype(k->dtype));
  for (int i = 0; i < k->n_ins; i++) {
    const KInstr *x = &k->ins[i];
    if (x->op == KI_STORE || x->op == KI_LOAD) {
      const KBuf *kb = &k->bufs[x->a];
      if (pairs && pair_buf(kb)) {
        if (x->op == KI_LOAD)
          bprintf(b, "    const %s r%d%s = %s((duet_u16)(w%d >> %d));\n", T, i, sfx, load_fn(kb->dtype), x->a, 16 * h);
        continue;
      }
      if (x->op == KI_STORE) bprintf(b, "    b%d[", x->a);
      else bprintf(b, "    const %s r%d%s = %s%sb%d[", T, i, sfx, load_fn(kb->dtype), is16(kb->dtype) ? "(" : "", x->a);
      index_expr(b, kb, iv);
      if (x->op == KI_STORE && is16(kb->dtype)) bprintf(b, "] = %s(r%d%s);\n", store_fn(kb->dtype), x->b, sfx);
      else if (x->op == KI_STORE) bprintf(b, "] = r%d%s;\n", x->b, sfx);
      else bprintf(b, "]%s;\n", is16(kb->dtype) ? ")" : "");
      continue;
    }
    emit_ew_op(b, k, i, iv, sfx);
  }
}

/* ---------------------------------------------------------------- half2
 *
 * fp16 elementwise kernels computed on paired binary16 values (two
 * elements in one 32-bit word, element 2p in the low half) wherever that
 * gives the C kernel's results bit for bit.  The C kernel widens every
 * fp16 operand to f32, computes in f32 and rounds to fp16 at each cast and
 * at the store.  For binary16 a and b, RNE16(RNE32(a op b)) equals
 * RNE16(a op b) for op in + - * (binary32 has 24 >= 2 * 11 + 2 significand
 * bits, so double rounding is innocuous: Figueroa, "When is double rounding
 * innocuous?", SIGNUM Newsletter 30(3), 1995; checked by
 * tests/test_half2_rounding.c), so an f32 add/sub/mul of two fp16 values
 * whose every use rounds it to fp16 is one PTX add/sub/mul.rn.f16x2 per
 * pair.  The explicit .rn keeps ptxas from contracting a mul and an add
 * into an fma, which rounds once where the C kernel rounds twice.
 *
 * Forms of an instruction's value (H2Plan.form):
 *   HF_H  an fp16 value: the C kernel's f32 register holds exactly
 *         widen(h) for the bits h kept in the pair word (loads of fp16
 *         buffers, fp16-exact constants, casts to fp16, and these through
 *         negation, relu, relu's gradient and casts to f32);
 *   HF_P  add/sub/mul of two HF_H values, every use of which rounds it to
 *         fp16 (a cast to fp16 or a store to an fp16 buffer, possibly
 *         through casts to f32): the pair word holds the rounded result;
 *   HF_F  anything else, in two f32 lanes as emit_ew_body.
 * Negation (sign bit), relu (x < 0 ? +0 : x) and its gradient (x > 0 ? dy :
 * +0) are bit operations on the pair, exact as the C kernel's f32 code on
 * every input, -0 and NaN included; PTX max.f16x2 (sm_80 and later only)
 * returns the other operand for a NaN and neg.f16x2 an unspecified NaN,
 * so neither is used.  A NaN loaded from memory and stored again comes
 * out quiet (duet_h2quiet), as widening and narrowing makes it.  NaN
 * results of add/sub/mul are a NaN of unspecified sign and payload, as
 * from the f32 path on a GPU (whose canonical NaN already differs from the
 * CPU's propagated payloads).  bf16 has no arithmetic before sm_80: its
 * values are HF_F. */

typedef enum HForm { HF_F, HF_H, HF_P } HForm;

typedef struct H2Plan {
  unsigned char form[KMAX_INS];
  bool need_h[KMAX_INS]; /* the value is needed as a pair word h<i> */
  bool need_f[KMAX_INS]; /* ... and as two f32 lanes r<i>_0, r<i>_1 */
  bool quiet[KMAX_INS];  /* the word holds no signalling NaN */
  int level;             /* CG_HALF2_* */
} H2Plan;

/* The instruction operands of x (not buffers, scalar slots or sites). */
static int ew_operands(const KInstr *x, int op[2]) {
  if (x->op == KI_STORE) {
    op[0] = x->b;
    return 1;
  }
  int n = kop_operands(x->op);
  op[0] = x->a, op[1] = x->b;
  return n;
}

static bool cast_to(const KInstr *x, DType t) { return x->op == KI_CAST && (DType)(int)x->value == t; }

/* Every use of instruction i rounds it to fp16: a cast to f16 or a store
 * to an f16 buffer, or a cast to f32 (an identity in f32 kernels) whose
 * every use does; and it has a use. */
static bool only_rounded(const Kernel *k, int i) {
  bool used = false;
  for (int j = i + 1; j < k->n_ins; j++) {
    const KInstr *x = &k->ins[j];
    int op[2], n = ew_operands(x, op);
    for (int o = 0; o < n; o++) {
      if (op[o] != i) continue;
      used = true;
      if (cast_to(x, DT_F16) || (x->op == KI_STORE && k->bufs[x->a].dtype == DT_F16)) continue;
      if (cast_to(x, DT_F32) && only_rounded(k, j)) continue;
      return false;
    }
  }
  return used;
}

/* The fp16 bits of constant v when (float)v (the C kernel's value) is
 * exactly an fp16 value: +-0, +-inf, or m * 2^e with an 11-bit m. */
static bool f16_const(double v, uint16_t *bits) {
  float f = (float)v;
  uint16_t sign = signbit(f) ? 0x8000u : 0;
  double a = fabs((double)f);
  if (isnan(f) || a > 65504 || (a > 0 && a < 0x1p-24)) return false;
  if (a == 0 || isinf(f)) {
    *bits = sign | (a == 0 ? 0 : 0x7c00u);
    return true;
  }
  int e;
  frexp(a, &e); /* a in [2^(e-1), 2^e) */
  e -= 1;
  if (e < -14) { /* subnormal: a multiple of 2^-24 */
    double m = ldexp(a, 24);
    if (m != floor(m)) return false;
    *bits = sign | (uint16_t)m;
    return true;
  }
  double m = ldexp(a, 10 - e); /* in [1024, 2048) */
  if (m != floor(m)) return false;
  *bits = sign | (uint16_t)((e + 15) << 10) | (uint16_t)((int)m - 1024);
  return true;
}

/* Forms, needs and level of kernel k (level CG_HALF2_NONE when the half2
 * path does not apply: not a paired f32-computed kernel, or nothing to do
 * on pairs). */
static void h2_plan(const Kernel *k, H2Plan *pl) {
  memset(pl, 0, sizeof *pl);
  pl->level = CG_HALF2_NONE;
  if (k->kind != KK_ELEMENTWISE || compute_dtype(k->dtype) != DT_F32 || !ew_paired(k)) return;
  DUET_ASSERT(k->n_ins <= KMAX_INS);
  unsigned char *F = pl->form;
  for (int i = 0; i < k->n_ins; i++) {
    const KInstr *x = &k->ins[i];
    uint16_t bits;
    F[i] = HF_F;
    switch (x->op) {
    case KI_LOAD: F[i] = k->bufs[x->a].dtype == DT_F16 ? HF_H : HF_F; break;
    case KI_CONST:
      if (f16_const(x->value, &bits)) F[i] = HF_H, pl->quiet[i] = true;
      break;
    case KI_CAST:
      if (cast_to(x, DT_F32)) F[i] = F[x->a], pl->quiet[i] = pl->quiet[x->a];
      else if (cast_to(x, DT_F16)) F[i] = HF_H, pl->quiet[i] = true; /* rounding quiets a NaN */
      break;
    case KI_ADD: case KI_SUB: case KI_MUL:
      if (F[x->a] == HF_H && F[x->b] == HF_H && only_rounded(k, i)) F[i] = HF_P, pl->quiet[i] = true;
      break;
    case KI_NEG: case KI_RELU:
      if (F[x->a] == HF_H) F[i] = HF_H, pl->quiet[i] = pl->quiet[x->a];
      break;
    case KI_RELU_GRAD:
      if (F[x->a] == HF_H && F[x->b] == HF_H) F[i] = HF_H, pl->quiet[i] = pl->quiet[x->a];
      break;
    default: break;
    }
  }
  /* needs, from the stores back */
  bool bits_work = false;
  for (int i = k->n_ins - 1; i >= 0; i--) {
    const KInstr *x = &k->ins[i];
    if (x->op == KI_STORE) {
      bool f16 = k->bufs[x->a].dtype == DT_F16;
      if (f16 && F[x->b] != HF_F) pl->need_h[x->b] = true;
      else pl->need_f[x->b] = true;
      /* an fp16 value moved to fp16 memory without an f32 round trip */
      if (f16 && F[x->b] == HF_H && k->ins[x->b].op == KI_LOAD) bits_work = true;
      continue;
    }
    if (pl->need_f[i] && F[i] != HF_F) pl->need_h[i] = true; /* lanes widened from the word */
    DUET_ASSERT(!pl->need_f[i] || F[i] != HF_P);
    if (!pl->need_h[i] && !pl->need_f[i]) continue;
    int op[2], n = ew_operands(x, op);
    for (int o = 0; o < n; o++) {
      bool word = F[i] != HF_F && !(cast_to(x, DT_F16) && F[op[o]] == HF_F); /* a cast of lanes narrows them */
      if (word) pl->need_h[op[o]] = true;
      else pl->need_f[op[o]] = true;
    }
    if (F[i] == HF_P) pl->level = CG_HALF2_ARITH;
    if (F[i] == HF_H && (x->op == KI_NEG || x->op == KI_RELU || x->op == KI_RELU_GRAD ||
                         (cast_to(x, DT_F16) && F[x->a] == HF_H && !pl->quiet[x->a])))
      bits_work = true;
  }
  if (pl->level == CG_HALF2_NONE && bits_work) pl->level = CG_HALF2_BITS;
}

int codegen_cuda_half2(const Kernel *k) {
  H2Plan pl;
  h2_plan(k, &pl);
  return pl.level;
}

/* The word of a value in HF_H/HF_P form as it is stored to fp16 memory. */
static void h2_word_out(Buf *b, const H2Plan *pl, int v) {
  if (pl->form[v] == HF_H && !pl->quiet[v]) bprintf(b, "duet_h2quiet(h%d)", v);
  else bprintf(b, "h%d", v);
}

/* The loop body of a half2 kernel for pair p (elements i0, i1): the words
 * of the pair buffers it loads are w<buf>; pair words h<i>, f32 lanes
 * r<i>_0 and r<i>_1; every store at the end (as the paired f32 path). */
static void emit_h2_body(Buf *b, const Kernel *k, const H2Plan *pl) {
  for (int i = 0; i < k->n_ins; i++) {
    const KInstr *x = &k->ins[i];
    if (x->op == KI_STORE || (!pl->need_h[i] && !pl->need_f[i])) continue;
    if (pl->form[i] == HF_F) {
      if (x->op == KI_LOAD) { /* f32 (or bf16) memory, element by element */
        const KBuf *kb = &k->bufs[x->a];
        for (int h = 0; h < 2; h++) {
          const char *iv = h ? "i1" : "i0";
          if (pair_buf(kb)) {
            bprintf(b, "    const float r%d_%d = %s((duet_u16)(w%d >> %d));\n", i, h, load_fn(kb->dtype), x->a, 16 * h);
            continue;
          }
          bprintf(b, "    const float r%d_%d = %s%sb%d[", i, h, load_fn(kb->dtype), is16(kb->dtype) ? "(" : "", x->a);
          index_expr(b, kb, iv);
          bprintf(b, "]%s;\n", is16(kb->dtype) ? ")" : "");
        }
      } else {
        emit_ew_op(b, k, i, "i0", "_0");
        emit_ew_op(b, k, i, "i1", "_1");
      }
      continue;
    }
    bprintf(b, "    const duet_u32 h%d = ", i);
    uint16_t bits;
    switch (x->op) {
    case KI_LOAD: {
      const KBuf *kb = &k->bufs[x->a];
      if (pair_buf(kb)) {
        bprintf(b, "w%d", x->a);
        break;
      }
      const KIndexTerm *t0 = &kb->terms[0];
      if (kb->n_terms == 1 && t0->div == 1 && t0->mul == 1 && t0->mod % 2 == 0 && kb->base % 2 == 0) {
        /* i % mod with an even mod (a bias along the last axis): i0 and i1
         * are neighbours in one aligned word */
        bprintf(b, "((const duet_u32 *)(b%d + " D64 "))[p %% " D64 "]", x->a, kb->base, t0->mod / 2);
        break;
      }
      bprintf(b, "(duet_u32)b%d[", x->a);
      index_expr(b, kb, "i0");
      bprintf(b, "] | (duet_u32)b%d[", x->a);
      index_expr(b, kb, "i1");
      bprintf(b, "] << 16");
      break;
    }
    case KI_CONST:
      DUET_ASSERT(f16_const(x->value, &bits));
      bprintf(b, "0x%08xu", (unsigned)bits * 0x10001u);
      break;
    case KI_CAST:
      if (cast_to(x, DT_F16) && pl->form[x->a] == HF_F) /* lanes narrowed: the C kernel's rounding */
        bprintf(b, "(duet_u32)duet_f16_from_f32(r%d_0) | (duet_u32)duet_f16_from_f32(r%d_1) << 16", x->a, x->a);
      else if (cast_to(x, DT_F16))
        h2_word_out(b, pl, x->a);
      else
        bprintf(b, "h%d", x->a); /* to f32: the same value */
      break;
    case KI_ADD: bprintf(b, "duet_h2add(h%d, h%d)", x->a, x->b); break;
    case KI_SUB: bprintf(b, "duet_h2sub(h%d, h%d)", x->a, x->b); break;
    case KI_MUL: bprintf(b, "duet_h2mul(h%d, h%d)", x->a, x->b); break;
    case KI_NEG: bprintf(b, "h%d ^ 0x80008000u", x->a); break;
    case KI_RELU: bprintf(b, "duet_h2relu(h%d)", x->a); break;
    case KI_RELU_GRAD: bprintf(b, "duet_h2relu_grad(h%d, h%d)", x->a, x->b); break;
    default: unreachable();
    }
    bprintf(b, ";\n");
    if (pl->need_f[i])
      bprintf(b, "    const float r%d_0 = duet_f32_from_f16((duet_u16)h%d), r%d_1 = duet_f32_from_f16((duet_u16)(h%d >> 16));\n",
              i, i, i, i);
  }
  for (int i = 0; i < k->n_ins; i++) {
    const KInstr *x = &k->ins[i];
    if (x->op != KI_STORE) continue;
    const KBuf *kb = &k->bufs[x->a];
    int v = x->b;
    if (!is16(kb->dtype)) {
      for (int h = 0; h < 2; h++) {
        bprintf(b, "    b%d[", x->a);
        index_expr(b, kb, h ? "i1" : "i0");
        bprintf(b, "] = r%d_%d;\n", v, h);
      }
      continue;
    }
    bprintf(b, "    const duet_u32 o%d = ", i);
    if (kb->dtype == DT_F16 && pl->form[v] != HF_F) h2_word_out(b, pl, v);
    else bprintf(b, "(duet_u32)%s(r%d_0) | (duet_u32)%s(r%d_1) << 16", store_fn(kb->dtype), v, store_fn(kb->dtype), v);
    bprintf(b, ";\n");
    if (pair_buf(kb)) {
      bprintf(b, "    ((duet_u32 *)(b%d + " D64 "))[p] = o%d;\n", x->a, kb->base, i);
      continue;
    }
    bprintf(b, "    b%d[", x->a);
    index_expr(b, kb, "i0");
    bprintf(b, "] = (duet_u16)o%d;\n    b%d[", i, x->a);
    index_expr(b, kb, "i1");
    bprintf(b, "] = (duet_u16)(o%d >> 16);\n", i);
  }
}

/* Whether the C text s (NULL: none) names the identifier `name`. */
static bool uses_name(const char *s, const char *name) {
  size_t n = strlen(name);
  for (const char *p = s; p && (p = strstr(p, name)); p += n) {
    bool before = p > s && (isalnum((unsigned char)p[-1]) || p[-1] == '_');
    bool after = isalnum((unsigned char)p[n]) || p[n] == '_';
    if (!before && !after) return true;
  }
  return false;
}

/* One thread per element, grid-stride.  The element index is 32-bit when
 * every index it produces (and the loop's stride past the end) fits.
 *
 * 16-bit storage: elements are stored as raw binary16/bfloat16 bits and
 * the arithmetic is f32 (the C emitter's choice, so results match the CPU
 * backend bit for bit where the f32 operations are the same).  When the
 * element count is even and some 16-bit buffer is read or written at i
 * itself (pair_buf), each thread takes two neighbouring elements: those
 * buffers move as one 32-bit word per pair (the paired `half2` access),
 * the other buffers element by element.  The arithmetic is two f32
 * lanes, except in fp16 kernels that take the half2 path (h2, from
 * h2_plan; "half2" above): there the pairs stay in their words wherever
 * that is bit-identical (f16x2 add/sub/mul each rounding once, exact bit
 * operations), and only the rest runs in f32 lanes.  No fma is formed:
 * a fused a*b+c rounds once where the C kernel rounds twice. */
static void emit_elementwise(Buf *b, const Kernel *k, const DuetLaunch *l, const H2Plan *h2) {
  const char *T = cutype(compute_dtype(k->dtype));
  bool stored[KMAX_BUFS] = {0};
  for (int i = 0; i < k->n_ins; i++)
    if (k->ins[i].op == KI_STORE) stored[k->ins[i].a] = true;
  bool pairs = ew_paired(k);
  for (int i = 0; i < k->n_bufs; i++)
    bprintf(b, "  %s%s *b%d = (%s%s *)t.p[%d];\n", stored[i] ? "" : "const ", cutype(k->bufs[i].dtype), i,
            stored[i] ? "" : "const ", cutype(k->bufs[i].dtype), i);
  for (int i = 0; i < k->n_ins; i++)
    if (k->ins[i].op == KI_SCALAR) bprintf(b, "  const %s s%d = (%s)sv.v[%d];\n", T, i, T, k->ins[i].a);
  for (int i = 0; i < k->n_ins; i++)
    if (k->ins[i].op == KI_DROPOUT) {
      bprintf(b, "  const int training = sv.v[%d] != 0;\n  const duet_u64 drop_seed = (duet_u64)sv.v[%d];\n",
              DUET_S_TRAINING, DUET_S_DROP_SEED);
      break;
    }
  int64_t lim = k->n + (int64_t)l->grid * l->block * (pairs ? 2 : 1);
  for (int i = 0; i < k->n_bufs; i++) {
    int64_t m = max_index(&k->bufs[i], k->n);
    if (m > lim) lim = m;
  }
  const char *I = lim < INT32_MAX ? "int" : "duet_i64";
  if (!pairs) {
    bprintf(b, "  for (%s i = blockIdx.x * (%s)blockDim.x + threadIdx.x; i < " D64 "; i += (%s)blockDim.x * gridDim.x) {\n",
            I, I, k->n, I);
    emit_ew_body(b, k, "i", "", false, 0);
    bprintf(b, "  }\n");
    return;
  }
  bprintf(b, "  for (%s p = blockIdx.x * (%s)blockDim.x + threadIdx.x; p < " D64 "; p += (%s)blockDim.x * gridDim.x) {\n",
          I, I, k->n / 2, I);
  /* the body first: the element indices i0, i1 are declared only when it
   * uses them (word-only kernels address pairs by p; NVRTC warns about an
   * unused variable) */
  Buf body = {.a = b->a};
  bool loaded[KMAX_BUFS] = {0};
  for (int i = 0; i < k->n_ins; i++)
    if (k->ins[i].op == KI_LOAD) loaded[k->ins[i].a] = true;
  for (int i = 0; i < k->n_bufs; i++)
    if (loaded[i] && pair_buf(&k->bufs[i]))
      bprintf(&body, "    const duet_u32 w%d = ((const duet_u32 *)(b%d + " D64 "))[p];\n", i, i, k->bufs[i].base);
  if (h2->level != CG_HALF2_NONE) {
    emit_h2_body(&body, k, h2);
  } else {
    emit_ew_body(&body, k, "i0", "_0", true, 0);
    emit_ew_body(&body, k, "i1", "_1", true, 1);
    for (int i = 0; i < k->n_ins; i++) {
      const KInstr *x = &k->ins[i];
      const KBuf *kb = &k->bufs[x->a];
      if (x->op == KI_STORE && pair_buf(kb))
        bprintf(&body, "    ((duet_u32 *)(b%d + " D64 "))[p] = (duet_u32)%s(r%d_0) | (duet_u32)%s(r%d_1) << 16;\n",
                x->a, kb->base, store_fn(kb->dtype), x->b, store_fn(kb->dtype), x->b);
    }
  }
  bool u0 = uses_name(body.s, "i0"), u1 = uses_name(body.s, "i1");
  if (u0 && u1) bprintf(b, "    const %s i0 = 2 * p, i1 = 2 * p + 1;\n", I);
  else if (u0 || u1) bprintf(b, "    const %s %s;\n", I, u0 ? "i0 = 2 * p" : "i1 = 2 * p + 1");
  bprintf(b, "%s  }\n", body.s ? body.s : "");
}

/* Unscale and overflow check in one pass, as the C emitter (torch's
 * _amp_foreach_non_finite_check_and_unscale_): y = g * (1/S) in f32, the
 * flag an OR over the elements, so deterministic.  Across blocks: each
 * block ORs its verdict (__syncthreads_or) into the module-scope word
 * duet_flag<f> of the function, and the last block to finish writes the
 * param's flag (argument 2) and resets the word and the counter for the
 * next launch (the threadFenceReduction pattern of the xent kernels;
 * launches on one stream never overlap, so instances may share them). */
static void emit_unscale(Buf *b, const Kernel *k) {
  const KBuf *g = &k->bufs[0];
  const char *G = cutype(g->dtype);
  bprintf(b, "  const %s *x = (const %s *)t.p[0];\n  float *y = (float *)t.p[1];\n", G, G);
  bprintf(b, "  duet_i32 *overflow = (duet_i32 *)t.p[2]; /* this param's flag */\n");
  bprintf(b, "  const float inv = (float)sv.v[%d];\n  __shared__ int last;\n  int bad = 0;\n", DUET_S_INV_LOSS_SCALE);
  GRID_LOOP(b, "i", k->n);
  bprintf(b, "    const float v = %s%sx[i]%s * inv;\n", load_fn(g->dtype), is16(g->dtype) ? "(" : "",
          is16(g->dtype) ? ")" : "");
  bprintf(b, "    bad |= !(v <= 3.40282347e+38f && v >= -3.40282347e+38f);\n    y[i] = v;\n  }\n");
  bprintf(b, "  bad = __syncthreads_or(bad);\n  if (threadIdx.x == 0) {\n");
  bprintf(b, "    if (bad) atomicOr(&duet_flag" FN ", 1);\n");
  bprintf(b, "    __threadfence();\n    last = atomicAdd(&duet_done" FN ", 1u) == gridDim.x - 1;\n  }\n");
  bprintf(b, "  __syncthreads();\n  if (!last || threadIdx.x != 0) return;\n  __threadfence();\n");
  bprintf(b, "  *overflow = atomicExch(&duet_flag" FN ", 0);\n");
  bprintf(b, "  duet_done" FN " = 0; /* ready for the next launch */\n");
}

/* The end of a sum over a whole tensor (reduce_whole, KK_MSE), once each
 * thread holds its grid-stride terms' sum in `acc` (double): each block's
 * sum, then the last block to finish sums the blocks' partials, a fixed
 * tree for a given grid (threadFenceReduction, as the loss kernels), and
 * writes y[0] = tot * scale rounded once to T. */
static void emit_whole_sum_tail(Buf *b, const char *T, double scale) {
  bprintf(b, "  acc = duet_block_sum(acc, red);\n");
  bprintf(b, "  if (threadIdx.x == 0) {\n    duet_part" FN "[blockIdx.x] = acc;\n");
  bprintf(b, "    __threadfence();\n    last = atomicAdd(&duet_done" FN ", 1u) == gridDim.x - 1;\n  }\n");
  bprintf(b, "  __syncthreads();\n  if (!last) return;\n  __threadfence();\n");
  bprintf(b, "  const volatile double *part = duet_part" FN ";\n  double tot = 0;\n");
  bprintf(b, "  for (unsigned g = threadIdx.x; g < gridDim.x; g += blockDim.x) tot += part[g];\n");
  bprintf(b, "  tot = duet_block_sum(tot, red);\n");
  bprintf(b, "  if (threadIdx.x == 0) {\n    y[0] = (%s)(tot * %a);\n", T, scale);
  bprintf(b, "    duet_done" FN " = 0; /* ready for the next launch */\n  }\n");
}

/* mean((pred - target)^2) over the whole tensor: each difference and its
 * square in double, then the whole-tensor sum (as the mean's). */
static void emit_mse(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  bprintf(b, "  %s%s *p = (%s%s *)t.p[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *q = (%s%s *)t.p[%d];\n", BUF(1, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t.p[%d];\n", BUF(2, ""));
  bprintf(b, "  __shared__ double red[32];\n  __shared__ int last;\n  double acc = 0;\n");
  GRID_LOOP(b, "r", k->n);
  bprintf(b, "    const double d = (double)p[r] - (double)q[r];\n    acc += d * d;\n  }\n");
  emit_whole_sum_tail(b, T, k->scale);
}

/* Gradient clipping: the sum of squares of g in double, spread over the
 * grid as the whole-tensor sum of emit_reduce (grid-stride sums per
 * thread, block sums, the last block adding the blocks' partials in a
 * tree fixed by the launch: deterministic), to the double in the flags
 * buffer (argument 1). */
static void emit_sumsq(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  bprintf(b, "  const %s *x = (const %s *)t.p[0];\n", T, T);
  bprintf(b, "  double *out = (double *)t.p[1]; /* in the flags buffer */\n");
  bprintf(b, "  __shared__ double red[32];\n  __shared__ int last;\n  double acc = 0;\n");
  GRID_LOOP(b, "r", k->n);
  bprintf(b, "    const double v = (double)x[r];\n    acc += v * v;\n  }\n");
  bprintf(b, "  acc = duet_block_sum(acc, red);\n");
  bprintf(b, "  if (threadIdx.x == 0) {\n    duet_part" FN "[blockIdx.x] = acc;\n");
  bprintf(b, "    __threadfence();\n    last = atomicAdd(&duet_done" FN ", 1u) == gridDim.x - 1;\n  }\n");
  bprintf(b, "  __syncthreads();\n  if (!last) return;\n  __threadfence();\n");
  bprintf(b, "  const volatile double *part = duet_part" FN ";\n  double tot = 0;\n");
  bprintf(b, "  for (unsigned g = threadIdx.x; g < gridDim.x; g += blockDim.x) tot += part[g];\n");
  bprintf(b, "  tot = duet_block_sum(tot, red);\n");
  bprintf(b, "  if (threadIdx.x == 0) {\n    *out = tot;\n");
  bprintf(b, "    duet_done" FN " = 0; /* ready for the next launch */\n  }\n");
}

/* Gradient clipping: g *= the coefficient (a double in the flags buffer,
 * argument 1), rounded to g's dtype first, as the C emitter. */
static void emit_clip_scale(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  bprintf(b, "  %s *x = (%s *)t.p[0];\n  const %s c = (%s)*(const double *)t.p[1]; /* in the flags buffer */\n", T, T,
          T, T);
  GRID_LOOP(b, "i", k->n);
  bprintf(b, "    x[i] = x[i] * c;\n  }\n");
}

/* AdamW with 8-bit block-wise state, the C emitter's kernel: a CUDA block
 * of EW_BLOCK threads per quantization block (looping over the blocks past
 * the grid), each thread DUET_Q8_BLOCK / EW_BLOCK of its values in
 * registers.  The AdamW arithmetic is written with the round-to-nearest
 * intrinsics (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn), so
 * no fma is formed and every operation rounds as the C kernel's f32 code:
 * params, scales and codes come out bit-identical.  The block's scales
 * are a max (exact whatever the order, NaN propagating) over the block
 * (duet_block_max); every thread has read the old scale before the
 * reduction's barriers, after which thread 0 writes the new one. */
static void emit_adamw8(Buf *b, const Kernel *k) {
  int64_t N = k->n, NB = duet_q8_blocks(N);
  int per = DUET_Q8_BLOCK / EW_BLOCK;
  bprintf(b, "  float *p = (float *)t.p[0];\n  const float *g = (const float *)t.p[1];\n");
  bprintf(b, "  unsigned char *mq = (unsigned char *)t.p[2], *vq = (unsigned char *)t.p[3];\n");
  bprintf(b, "  float *ma = (float *)t.p[4], *va = (float *)t.p[5];\n");
  bprintf(b, "  const float decay = (float)sv.v[%d], b2 = (float)sv.v[%d], eps = (float)sv.v[%d];\n", DUET_S_DECAY,
          DUET_S_BETA2, DUET_S_EPS);
  bprintf(b, "  const float omb1 = (float)sv.v[%d], omb2 = (float)sv.v[%d], ss = (float)sv.v[%d], bc2 = (float)sv.v[%d];\n",
          DUET_S_ONE_MINUS_BETA1, DUET_S_ONE_MINUS_BETA2, DUET_S_STEP_SIZE, DUET_S_BC2_SQRT);
  if (k->no_decay) bprintf(b, "  (void)decay;\n");
  bprintf(b, "  __shared__ float red[32];\n");
  bprintf(b, "  for (duet_i64 blk = blockIdx.x; blk < " D64 "; blk += gridDim.x) {\n", NB);
  bprintf(b, "    const duet_i64 lo = blk * %d;\n", DUET_Q8_BLOCK);
  bprintf(b, "    const int len = lo + %d <= " D64 " ? %d : (int)(" D64 " - lo);\n", DUET_Q8_BLOCK, N, DUET_Q8_BLOCK, N);
  bprintf(b, "    const float am = ma[blk], av = va[blk];\n    float m1[%d], v1[%d], nm = 0, nv = 0;\n", per, per);
  bprintf(b, "    for (int k = 0; k < %d; k++) {\n", per);
  bprintf(b, "      const int j = (int)threadIdx.x + k * %d;\n      if (j >= len) break;\n", EW_BLOCK);
  bprintf(b, "      const duet_i64 i = lo + j;\n");
  bprintf(b, "      const float m = __fmul_rn(duet_q8_dec_s[mq[i]], am), v = __fmul_rn(duet_q8_dec_u[vq[i]], av), gi = g[i];\n");
  bprintf(b, "      const float p1 = %s;\n", k->no_decay ? "p[i]" : "__fmul_rn(p[i], decay)");
  bprintf(b, "      const float mn = __fadd_rn(m, __fmul_rn(__fsub_rn(gi, m), omb1));\n");
  bprintf(b, "      const float vn = __fadd_rn(__fmul_rn(b2, v), __fmul_rn(omb2, __fmul_rn(gi, gi)));\n");
  bprintf(b, "      const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vn), bc2), eps);\n");
  bprintf(b, "      p[i] = __fsub_rn(p1, __fmul_rn(ss, __fdiv_rn(mn, den)));\n");
  bprintf(b, "      m1[k] = mn;\n      v1[k] = vn;\n");
  bprintf(b, "      nm = duet_q8_amax(nm, mn);\n      nv = duet_q8_amax(nv, vn);\n    }\n");
  bprintf(b, "    nm = duet_block_max(nm, red);\n    nv = duet_block_max(nv, red);\n");
  bprintf(b, "    if (threadIdx.x == 0) {\n      ma[blk] = nm;\n      va[blk] = nv;\n    }\n");
  bprintf(b, "    for (int k = 0; k < %d; k++) {\n", per);
  bprintf(b, "      const int j = (int)threadIdx.x + k * %d;\n      if (j >= len) break;\n", EW_BLOCK);
  bprintf(b, "      mq[lo + j] = duet_q8_enc(duet_q8_lut_s, duet_q8_thr_s, duet_q8_code_s, 1, nm == 0 ? 0.0f : __fdiv_rn(m1[k], nm));\n");
  bprintf(b, "      vq[lo + j] = duet_q8_enc(duet_q8_lut_u, duet_q8_thr_u, duet_q8_code_u, 0, nv == 0 ? 0.0f : __fdiv_rn(v1[k], nv));\n");
  bprintf(b, "    }\n  }\n");
}

/* out[o, j] = scale * sum_r in[o, r, j]; max_r when reduce_max; the max
 * gradient routes dy to the first maximum (NaN propagates as on the CPU).
 * Sums accumulate in double, as the C emitter's, and are rounded once.
 * The sum of a whole tensor (sum or mean of everything: reduce_whole)
 * spreads over the grid: each thread sums its grid-stride elements, each
 * block its threads' sums (warp shuffles, then across warps), and the last
 * block to finish the blocks' partial sums, in a tree fixed by the launch
 * (so the result is deterministic).  A summation of n terms in any order
 * errs by at most gamma_{n-1} * sum |x_i|, gamma_k = k u / (1 - k u) with
 * u = 2^-53 in double (Higham, "Accuracy and Stability of Numerical
 * Algorithms", 2nd ed., sec. 4.2), and the rounding to f32 adds 2^-24 of
 * the result: |y - s| <= 2^-24 |s| + gamma_{n-1} sum |x_i| (at n = 2^24,
 * gamma = 1.9e-9), whatever the grid; tests/test_cuda_emu.c checks it
 * at 2^24 elements.  (One block summing serially in f32, as before, was
 * 0.25% off for 2^24 copies of 0.1f.) */
static void emit_reduce(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  int64_t O = k->outer, R = k->red, I = k->inner;
  if (k->reduce_max || k->kind == KK_MAX_GRAD) {
    bool grad = k->kind == KK_MAX_GRAD;
    if (grad) bprintf(b, "  %s%s *dy = (%s%s *)t.p[%d];\n", BUF(0, "const "));
    bprintf(b, "  %s%s *x = (%s%s *)t.p[%d];\n", BUF(grad ? 1 : 0, "const "));
    bprintf(b, "  %s%s *y = (%s%s *)t.p[%d];\n", BUF(grad ? 2 : 1, ""));
    GRID_LOOP(b, "oj", O * I);
    bprintf(b, "    const duet_i64 o = oj / " D64 ", j = oj %% " D64 ";\n", I, I);
    bprintf(b, "    const %s *xr = x + o * " D64 " + j;\n", T, R * I);
    bprintf(b, "    %s m = xr[0];\n%s", T, grad ? "    duet_i64 am = 0;\n" : ""); /* the max: only its value */
    bprintf(b, "    for (duet_i64 r = 1; r < " D64 "; r++) if (xr[r * " D64 "] > m || m != m) { m = xr[r * " D64
               "];%s }\n", R, I, I, grad ? " am = r;" : "");
    if (!grad) bprintf(b, "    y[oj] = m;\n  }\n");
    else
      bprintf(b, "    for (duet_i64 r = 0; r < " D64 "; r++) y[o * " D64 " + r * " D64 " + j] = r == am ? dy[oj] : (%s)0;\n  }\n",
              R, R * I, I, T);
    return;
  }
  bprintf(b, "  const %s *x = (const %s *)t.p[%d];\n  %s *y = (%s *)t.p[%d];\n", T, T, 0, T, T,
          1);
  /* the scale (1/n for a mean) multiplies in double; one rounding to T */
  if (reduce_whole(k)) { /* every block, then the last one */
    bprintf(b, "  __shared__ double red[32];\n  __shared__ int last;\n  double acc = 0;\n");
    GRID_LOOP(b, "r", R);
    bprintf(b, "    acc += x[r];\n  }\n");
    emit_whole_sum_tail(b, T, k->scale);
    return;
  }
  if (I == 1) { /* a block per output row, reduced across the block */
    bprintf(b, "  __shared__ double red[32];\n");
    bprintf(b, "  for (duet_i64 o = blockIdx.x; o < " D64 "; o += gridDim.x) {\n", O);
    bprintf(b, "    double acc = 0;\n");
    bprintf(b, "    for (duet_i64 r = threadIdx.x; r < " D64 "; r += blockDim.x) acc += x[o * " D64 " + r];\n", R, R);
    bprintf(b, "    acc = duet_block_sum(acc, red);\n");
    bprintf(b, "    if (threadIdx.x == 0) y[o] = (%s)(acc * %a);\n  }\n", T, k->scale);
    return;
  }
  /* a thread per output, the reduced axis in order (coalesced over j) */
  GRID_LOOP(b, "oj", O * I);
  bprintf(b, "    const duet_i64 o = oj / " D64 ", j = oj %% " D64 ";\n", I, I);
  bprintf(b, "    double acc = 0;\n");
  bprintf(b, "    for (duet_i64 r = 0; r < " D64 "; r++) acc += x[(o * " D64 " + r) * " D64 " + j];\n", R, R, I);
  bprintf(b, "    y[oj] = (%s)(acc * %a);\n  }\n", T, k->scale);
}

/* Softmax cross-entropy with integer labels, stabilised by the row maximum
 * (log-sum-exp), as the C emitter:
 *   loss = mean_r (log sum_c exp(x_rc - m_r) - (x_r,y_r - m_r))
 * (the shifted label logit first, in double: adding log(se) to a large m_r
 * would round it away; see the C emitter)
 *   dx_rc = (softmax_rc - [c == y_r]) * dloss / R
 * Forward and metrics: one block, a warp per row, partial sums in double
 * combined in a fixed order.  Backward: a block per row. */
static void emit_rows(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  const char *ex = k->dtype == DT_F32 ? "expf" : "exp";
  int64_t R = k->rows, C = k->cols;
  bprintf(b, "  const %s *x = (const %s *)t.p[%d];\n  const duet_i32 *y = (const duet_i32 *)t.p[%d];\n", T, T,
          0, 1);
  if (k->kind == KK_XENT_BWD) {
    bprintf(b, "  const %s *dl = (const %s *)t.p[%d];\n  %s *dx = (%s *)t.p[%d];\n", T, T, 2, T, T,
            3);
    bprintf(b, "  __shared__ %s red[32];\n", T);
    bprintf(b, "  const %s g = dl[0] / (%s)" D64 ";\n", T, T, R);
    bprintf(b, "  for (duet_i64 r = blockIdx.x; r < " D64 "; r += gridDim.x) {\n", R);
    bprintf(b, "    const %s *row = x + r * " D64 ";\n    %s *drow = dx + r * " D64 ";\n", T, C, T, C);
    bprintf(b, "    %s m = row[0];\n", T);
    bprintf(b, "    for (duet_i64 j = threadIdx.x; j < " D64 "; j += blockDim.x) m = duet_max(m, row[j]);\n", C);
    bprintf(b, "    m = duet_block_max(m, red);\n    %s se = 0;\n", T);
    bprintf(b, "    for (duet_i64 j = threadIdx.x; j < " D64 "; j += blockDim.x) { drow[j] = %s(row[j] - m); se += drow[j]; }\n",
            C, ex);
    bprintf(b, "    const %s inv = 1 / duet_block_sum(se, red);\n", T);
    bprintf(b, "    const duet_i32 yr = y[r];\n");
    bprintf(b, "    for (duet_i64 j = threadIdx.x; j < " D64 "; j += blockDim.x) drow[j] = (drow[j] * inv - (%s)(j == yr)) * g;\n  }\n",
            C, T);
    return;
  }
  bool metrics = k->kind == KK_EVAL_METRICS;
  bprintf(b, "  %s *out = (%s *)t.p[%d];\n", T, T, 2);
  bprintf(b, "  __shared__ double red[32];\n  __shared__ int last;\n");
  if (metrics) bprintf(b, "  duet_i64 nv = (duet_i64)sv.v[%d];\n  if (nv > " D64 ") nv = " D64 ";\n", DUET_S_N_VALID, R, R);
  else bprintf(b, "  const duet_i64 nv = " D64 ";\n", R);
  bprintf(b, "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;\n");
  bprintf(b, metrics ? "  double nll = 0, correct = 0;\n" : "  double nll = 0;\n");
  bprintf(b, "  for (duet_i64 r = (duet_i64)blockIdx.x * nwarps + warp; r < nv; r += (duet_i64)gridDim.x * nwarps) {\n");
  bprintf(b, "    const %s *row = x + r * " D64 ";\n", T, C);
  if (metrics) {
    /* the first maximum wins, as the C emitter's strict > scan */
    bprintf(b, "    %s m = row[0];\n    duet_i64 am = 0;\n", T);
    bprintf(b, "    for (duet_i64 j = lane; j < " D64 "; j += 32) if (row[j] > m || (row[j] == m && j < am)) { m = row[j]; am = j; }\n",
            C);
    bprintf(b, "    duet_warp_argmax(m, am);\n");
  } else {
    bprintf(b, "    %s m = row[0];\n", T);
    bprintf(b, "    for (duet_i64 j = lane; j < " D64 "; j += 32) m = duet_max(m, row[j]);\n", C);
    bprintf(b, "    m = duet_warp_max(m);\n");
  }
  bprintf(b, "    %s se = 0;\n", T);
  bprintf(b, "    for (duet_i64 j = lane; j < " D64 "; j += 32) se += %s(row[j] - m);\n", C, ex);
  bprintf(b, "    se = duet_warp_sum(se);\n");
  bprintf(b, "    if (lane == 0) {\n      nll += log((double)se) - ((double)row[y[r]] - (double)m);\n");
  if (metrics) bprintf(b, "      correct += am == y[r];\n");
  bprintf(b, "    }\n  }\n");
  /* per-block partials; the last block to finish adds them in block order
   * (CUDA programming guide, "memory fence functions": threadFenceReduction) */
  bprintf(b, "  nll = duet_block_sum(nll, red);\n");
  if (metrics) bprintf(b, "  correct = duet_block_sum(correct, red);\n");
  bprintf(b, "  if (threadIdx.x == 0) {\n");
  bprintf(b, "    duet_part" FN "[blockIdx.x] = nll;\n");
  if (metrics) bprintf(b, "    duet_part" FN "[gridDim.x + blockIdx.x] = correct;\n");
  bprintf(b, "    __threadfence();\n    last = atomicAdd(&duet_done" FN ", 1u) == gridDim.x - 1;\n  }\n");
  bprintf(b, "  __syncthreads();\n  if (!last || threadIdx.x != 0) return;\n");
  bprintf(b, "  __threadfence();\n");
  bprintf(b, "  const volatile double *part = duet_part" FN ";\n  double tot = 0;\n");
  bprintf(b, "  for (unsigned g = 0; g < gridDim.x; g++) tot += part[g];\n");
  if (metrics) {
    bprintf(b, "  double tc = 0;\n  for (unsigned g = 0; g < gridDim.x; g++) tc += part[gridDim.x + g];\n");
    bprintf(b, "  out[0] = (%s)tc;\n  out[1] = (%s)tot;\n", T, T);
  } else {
    bprintf(b, "  out[0] = (%s)(tot / " D64 ");\n", T, R);
  }
  bprintf(b, "  duet_done" FN " = 0; /* ready for the next launch */\n");
}

/* Embedding lookup (ids outside the table read zeros), and its gradient as
 * a deterministic scatter-add: a thread per column visits the rows in
 * order, so no atomics and the C emitter's summation order.  The row
 * offset id * C is 64-bit (a table may hold 2^32 or more elements; ids
 * are 32-bit), as every other index here. */
static void emit_embed(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  int64_t R = k->rows, C = k->cols, V = k->outer;
  bprintf(b, "  %s%s *%s = (%s%s *)t.p[%d];\n", k->kind == KK_EMBED_FWD ? "const " : "const ", T,
          k->kind == KK_EMBED_FWD ? "tab" : "dy", "const ", T, 0);
  bprintf(b, "  const duet_i32 *ix = (const duet_i32 *)t.p[%d];\n  %s *out = (%s *)t.p[%d];\n", 1, T, T,
          2);
  if (k->kind == KK_EMBED_FWD) {
    GRID_LOOP(b, "e", R * C);
    bprintf(b, "    const duet_i64 r = e / " D64 ", c = e %% " D64 ";\n", C, C);
    bprintf(b, "    const duet_u32 id = (duet_u32)ix[r];\n");
    bprintf(b, "    out[e] = id < " D64 "u ? tab[(duet_i64)id * " D64 " + c] : (%s)0;\n  }\n", V, C, T);
    return;
  }
  /* a thread per (column c, chunk of vocabulary rows): zeroes its rows,
   * then adds the tokens whose id falls in them, in token order, so each
   * sum is taken in the CPU's order (no atomics) */
  int64_t J = embed_chunks(k), W = (V + J - 1) / J;
  GRID_LOOP(b, "e", C * J);
  bprintf(b, "    const duet_i64 c = e %% " D64 ", lo = e / " D64 " * " D64 ";\n", C, C, W);
  bprintf(b, "    const duet_i64 hi = lo + " D64 " < " D64 " ? lo + " D64 " : " D64 ";\n", W, V, W, V);
  bprintf(b, "    for (duet_i64 v = lo; v < hi; v++) out[v * " D64 " + c] = 0;\n", C);
  bprintf(b, "    for (duet_i64 r = 0; r < " D64 "; r++) {\n      const duet_u32 id = (duet_u32)ix[r];\n", R);
  bprintf(b, "      if (id >= (duet_u64)lo && id < (duet_u64)hi) out[(duet_i64)id * " D64 " + c] += dy[r * " D64 " + c];\n"
             "    }\n  }\n", C, C);
}

/* Normalisation over the last axis, a block per row, two-pass statistics
 * (mean, then the mean of squared deviations), as the C emitter:
 *   y = (x - mean) * rstd;  dx = rstd * (dy - mean(dy) - xh * mean(dy * xh)). */
static void emit_norm(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  const char *sq = k->dtype == DT_F32 ? "sqrtf" : "sqrt";
  int64_t R = k->rows, C = k->cols;
  bool fwd = k->kind == KK_NORM_FWD;
  bprintf(b, "  %s%s *x = (%s%s *)t.p[%d];\n", BUF(fwd ? 0 : 1, "const "));
  if (!fwd) bprintf(b, "  %s%s *dy = (%s%s *)t.p[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t.p[%d];\n", BUF(fwd ? 1 : 2, ""));
  bprintf(b, "  __shared__ %s red[32];\n", T);
  bprintf(b, "  for (duet_i64 r = blockIdx.x; r < " D64 "; r += gridDim.x) {\n", R);
  bprintf(b, "    const %s *xr = x + r * " D64 ";\n    %s *yr = y + r * " D64 ";\n", T, C, T, C);
  bprintf(b, "    %s acc = 0;\n", T);
  bprintf(b, "    for (duet_i64 c = threadIdx.x; c < " D64 "; c += blockDim.x) acc += xr[c];\n", C);
  bprintf(b, "    const %s m = duet_block_sum(acc, red) / (%s)" D64 ";\n", T, T, C);
  bprintf(b, "    acc = 0;\n");
  bprintf(b, "    for (duet_i64 c = threadIdx.x; c < " D64 "; c += blockDim.x) acc += (xr[c] - m) * (xr[c] - m);\n", C);
  bprintf(b, "    const %s rstd = 1 / %s(duet_block_sum(acc, red) / (%s)" D64 " + (%s)%a);\n", T, sq, T, C, T, k->eps);
  if (fwd) {
    bprintf(b, "    for (duet_i64 c = threadIdx.x; c < " D64 "; c += blockDim.x) yr[c] = (xr[c] - m) * rstd;\n  }\n", C);
    return;
  }
  bprintf(b, "    const %s *dr = dy + r * " D64 ";\n    %s sdy = 0, sdyx = 0;\n", T, C, T);
  bprintf(b, "    for (duet_i64 c = threadIdx.x; c < " D64 "; c += blockDim.x) { sdy += dr[c]; sdyx += dr[c] * (xr[c] - m) * rstd; }\n",
          C);
  bprintf(b, "    const %s a = duet_block_sum(sdy, red) / (%s)" D64 ";\n", T, T, C);
  bprintf(b, "    const %s bb = duet_block_sum(sdyx, red) / (%s)" D64 ";\n", T, T, C);
  bprintf(b, "    for (duet_i64 c = threadIdx.x; c < " D64 "; c += blockDim.x) yr[c] = rstd * (dr[c] - a - (xr[c] - m) * rstd * bb);\n  }\n",
          C);
}

/* Softmax over the middle axis of [outer, red, inner] (formulas as the C
 * emitter: the maximum subtracted before exp; the gradient y (dy - sum dy
 * y)).  The last axis (inner 1): a block per row, reduced across the
 * block; another axis: a thread per (o, j) column, serial over the axis
 * in double (coalesced over j), as the C kernel sums. */
static void emit_softmax(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  const char *ex = k->dtype == DT_F32 ? "expf" : "exp";
  int64_t O = k->outer, R = k->red, I = k->inner;
  bool fwd = k->kind == KK_SOFTMAX;
  if (fwd) {
    bprintf(b, "  %s%s *x = (%s%s *)t.p[%d];\n", BUF(0, "const "));
    bprintf(b, "  %s%s *y = (%s%s *)t.p[%d];\n", BUF(1, ""));
  } else {
    bprintf(b, "  %s%s *dy = (%s%s *)t.p[%d];\n", BUF(0, "const "));
    bprintf(b, "  %s%s *y = (%s%s *)t.p[%d];\n", BUF(1, "const "));
    bprintf(b, "  %s%s *dx = (%s%s *)t.p[%d];\n", BUF(2, ""));
  }
  if (I == 1) {
    bprintf(b, "  __shared__ %s red[32];\n", T);
    bprintf(b, "  for (duet_i64 o = blockIdx.x; o < " D64 "; o += gridDim.x) {\n", O);
    if (fwd) {
      bprintf(b, "    const %s *xr = x + o * " D64 ";\n    %s *yr = y + o * " D64 ";\n    %s m = xr[0];\n", T, R, T, R, T);
      bprintf(b, "    for (duet_i64 r = threadIdx.x; r < " D64 "; r += blockDim.x) m = duet_max(m, xr[r]);\n", R);
      bprintf(b, "    m = duet_block_max(m, red);\n    %s se = 0;\n", T);
      bprintf(b, "    for (duet_i64 r = threadIdx.x; r < " D64 "; r += blockDim.x) { const %s e = %s(xr[r] - m); yr[r] = e; se += e; }\n",
              R, T, ex);
      bprintf(b, "    const %s inv = 1 / duet_block_sum(se, red);\n", T);
      bprintf(b, "    for (duet_i64 r = threadIdx.x; r < " D64 "; r += blockDim.x) yr[r] *= inv;\n  }\n", R);
      return;
    }
    bprintf(b, "    const %s *dr = dy + o * " D64 ", *yr = y + o * " D64 ";\n    %s *xr = dx + o * " D64 ";\n    %s acc = 0;\n", T,
            R, R, T, R, T);
    bprintf(b, "    for (duet_i64 r = threadIdx.x; r < " D64 "; r += blockDim.x) acc += dr[r] * yr[r];\n", R);
    bprintf(b, "    const %s d = duet_block_sum(acc, red);\n", T);
    bprintf(b, "    for (duet_i64 r = threadIdx.x; r < " D64 "; r += blockDim.x) xr[r] = yr[r] * (dr[r] - d);\n  }\n", R);
    return;
  }
  GRID_LOOP(b, "oj", O * I);
  bprintf(b, "    const duet_i64 base = oj / " D64 " * " D64 " + oj %% " D64 ";\n", I, R * I, I);
  if (fwd) {
    bprintf(b, "    const %s *xr = x + base;\n    %s *yr = y + base;\n    %s m = xr[0];\n    double sum = 0;\n", T, T, T);
    bprintf(b, "    for (duet_i64 r = 1; r < " D64 "; r++) m = duet_max(m, xr[r * " D64 "]);\n", R, I);
    bprintf(b, "    for (duet_i64 r = 0; r < " D64 "; r++) { const %s e = %s(xr[r * " D64 "] - m); yr[r * " D64 "] = e; sum += e; }\n",
            R, T, ex, I, I);
    bprintf(b, "    const %s inv = (%s)(1 / sum);\n", T, T);
    bprintf(b, "    for (duet_i64 r = 0; r < " D64 "; r++) yr[r * " D64 "] *= inv;\n  }\n", R, I);
    return;
  }
  bprintf(b, "    const %s *dr = dy + base, *yr = y + base;\n    %s *xr = dx + base;\n    double dot = 0;\n", T, T);
  bprintf(b, "    for (duet_i64 r = 0; r < " D64 "; r++) dot += (double)dr[r * " D64 "] * yr[r * " D64 "];\n", R, I, I);
  bprintf(b, "    const %s d = (%s)dot;\n", T, T);
  bprintf(b, "    for (duet_i64 r = 0; r < " D64 "; r++) xr[r * " D64 "] = yr[r * " D64 "] * (dr[r * " D64 "] - d);\n  }\n", R, I,
          I, I);
}

/* RMS normalisation over the last axis, a block per row (formulas as the
 * C emitter): y = x rs, rs = 1 / sqrt(mean(x^2) + eps);
 * dx = rs (dy - x rs^2 mean(dy x)). */
static void emit_rmsnorm(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  const char *sq = k->dtype == DT_F32 ? "sqrtf" : "sqrt";
  int64_t R = k->rows, C = k->cols;
  bool fwd = k->kind == KK_RMSNORM_FWD;
  bprintf(b, "  %s%s *x = (%s%s *)t.p[%d];\n", BUF(fwd ? 0 : 1, "const "));
  if (!fwd) bprintf(b, "  %s%s *dy = (%s%s *)t.p[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t.p[%d];\n", BUF(fwd ? 1 : 2, ""));
  bprintf(b, "  __shared__ %s red[32];\n", T);
  bprintf(b, "  for (duet_i64 r = blockIdx.x; r < " D64 "; r += gridDim.x) {\n", R);
  bprintf(b, "    const %s *xr = x + r * " D64 ";\n    %s *yr = y + r * " D64 ";\n    %s acc = 0;\n", T, C, T, C, T);
  bprintf(b, "    for (duet_i64 c = threadIdx.x; c < " D64 "; c += blockDim.x) acc += xr[c] * xr[c];\n", C);
  bprintf(b, "    const %s rs = 1 / %s(duet_block_sum(acc, red) / (%s)" D64 " + (%s)%a);\n", T, sq, T, C, T, k->eps);
  if (fwd) {
    bprintf(b, "    for (duet_i64 c = threadIdx.x; c < " D64 "; c += blockDim.x) yr[c] = xr[c] * rs;\n  }\n", C);
    return;
  }
  bprintf(b, "    const %s *dr = dy + r * " D64 ";\n    %s sdx = 0;\n", T, C, T);
  bprintf(b, "    for (duet_i64 c = threadIdx.x; c < " D64 "; c += blockDim.x) sdx += dr[c] * xr[c];\n", C);
  bprintf(b, "    const %s bb = duet_block_sum(sdx, red) / (%s)" D64 " * rs * rs;\n", T, T, C);
  bprintf(b, "    for (duet_i64 c = threadIdx.x; c < " D64 "; c += blockDim.x) yr[c] = rs * (dr[c] - xr[c] * bb);\n  }\n", C);
}

/* Rotary position embedding (the C emitter's formulas: pairs (2i, 2i+1) of
 * each head turned by (s[POS] + t) base^(-2i/D), the angle, its cosine and
 * sine in double, rounded once), a thread per pair. */
static void emit_rope(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  int64_t B = k->batch, N = k->time, C = k->cols, H = k->heads, D = C / H, P = D / 2;
  bprintf(b, "  %s%s *x = (%s%s *)t.p[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t.p[%d];\n", BUF(1, ""));
  bprintf(b, "  const duet_i64 pos = (duet_i64)sv.v[%d];\n", DUET_S_POS);
  GRID_LOOP(b, "e", B * N * H * P);
  bprintf(b, "    const duet_i64 i = e %% " D64 ", bth = e / " D64 ", bt = bth / " D64 ";\n", P, P, H);
  bprintf(b, "    const double a = (double)(pos + bt %% " D64 ") * pow(%a, -(double)(2 * i) / " D64 ");\n", N, k->base, D);
  bprintf(b, "    const %s cs = (%s)cos(a), sn = (%s)%ssin(a);\n", T, T, T, k->inverse ? "-" : "");
  bprintf(b, "    const duet_i64 o = bt * " D64 " + bth %% " D64 " * " D64 " + 2 * i;\n", C, H, D);
  bprintf(b, "    const %s x0 = x[o], x1 = x[o + 1];\n", T);
  bprintf(b, "    y[o] = x0 * cs - x1 * sn;\n    y[o + 1] = x0 * sn + x1 * cs;\n  }\n");
}

/* A kernel that gives each block one item (a query row, a key row, a
 * (batch, head) pair, a tile) loops over the items with the block index
 * blk, so that any grid covers them: codegen_cuda_launch gives one block
 * per item, capped at CUDA's 2^31 - 1 blocks (block_grid).  `body` is the
 * code of one item, indented by two spaces, naming the item `blk`; a
 * barrier ends each item, as the next one reuses the shared memory. */
static void block_loop(Buf *b, int64_t items, const char *body) {
  bprintf(b, "  for (duet_i64 blk = blockIdx.x; blk < " D64 "; blk += gridDim.x) {\n", items);
  for (const char *p = body; p && *p;) {
    const char *e = strchr(p, '\n');
    size_t len = e ? (size_t)(e - p) + 1 : strlen(p);
    bprintf(b, "  %.*s", (int)len, p);
    p += len;
  }
  bprintf(b, "    __syncthreads(); /* the next item reuses the shared memory */\n  }\n");
}

/* The type of a loop index below `bound`: int when every value fits. */
static const char *index_type(int64_t bound) { return bound < INT32_MAX ? "int" : "duet_i64"; }

/* The key-row kernel of grouped-query attention's backward: a block per
 * (batch, key/value head hk, key row j) (items of block_loop), which for
 * each query head h of the group in order recomputes p_ij and ds_ij from
 * the query rows' statistics (as the ungrouped kernel below) and adds
 * dk_j += sum_i ds_ij q_i, dv_j += sum_i p_ij dy_i; each element has one
 * writer.  `u` receives the item's body. */
static void emit_attention_gqa_kv(Buf *b, const Kernel *k, Buf *u) {
  const char *T = cutype(k->dtype);
  const char *ex = k->dtype == DT_F32 ? "expf" : "exp";
  int64_t B = k->batch, N = k->time, C = k->cols, H = k->heads, D = C / H;
  int64_t KV = k->kv_heads, RP = H / KV, Ckv = KV * D, W = C + 2 * Ckv;
  const char *DI = index_type(D);
  bprintf(u, "  const duet_i64 j = blk %% " D64 ", bg = blk / " D64 ";\n", N, N);
  bprintf(u, "  const duet_i64 b = bg / " D64 ", hk = bg %% " D64 ", i0 = %s;\n", KV, KV, k->causal ? "j" : "0");
  bprintf(u, "  const %s *kj = k + (b * " D64 " + j) * " D64 " + hk * " D64 ", *vj = v + (b * " D64 " + j) * " D64 " + hk * " D64
             ";\n", T, N, Ckv, D, N, Ckv, D);
  bprintf(u, "  for (duet_i64 h = hk * " D64 "; h < (hk + 1) * " D64 "; h++) {\n", RP, RP);
  bprintf(u, "    const %s *qh = q + b * " D64 " + h * " D64 ", *dyh = dy + b * " D64 " + h * " D64 ";\n", T, N * C, D, N * C, D);
  bprintf(u, "    const %s *st = stats + (b * " D64 " + h) * " D64 ";\n", T, H, 3 * N);
  bprintf(u, "    for (duet_i64 i = i0 + threadIdx.x; i < " D64 "; i += blockDim.x) {\n", N);
  bprintf(u, "      %s acc = 0, g = 0;\n", T);
  bprintf(u, "      for (%s d = 0; d < " D64 "; d++) { acc += qh[i * " D64 " + d] * kj[d]; g += dyh[i * " D64 " + d] * vj[d]; }\n",
          DI, D, C, C);
  bprintf(u, "      %s pij = acc * scale;\n      pij = %s(pij - st[i * 3]);\n      pij *= st[i * 3 + 1];\n", T, ex);
  bprintf(u, "      p[i - i0] = pij;\n      ds[i - i0] = pij * (g - st[i * 3 + 2]) * scale;\n    }\n");
  bprintf(u, "    __syncthreads();\n");
  bprintf(u, "    for (%s d = threadIdx.x; d < " D64 "; d += blockDim.x) {\n", DI, D);
  bprintf(u, "      %s ak = 0, av = 0;\n", T);
  bprintf(u, "      for (duet_i64 i = i0; i < " D64 "; i++) { ak += ds[i - i0] * qh[i * " D64 " + d]; av += p[i - i0] * dyh[i * " D64
             " + d]; }\n", N, C, C);
  bprintf(u, "      const duet_i64 o = (b * " D64 " + j) * " D64 " + hk * " D64 " + d;\n", N, W, D);
  bprintf(u, "      if (h == hk * " D64 ") { out[" D64 " + o] = ak; out[" D64 " + o] = av; }\n", RP, C, C + Ckv);
  bprintf(u, "      else { out[" D64 " + o] += ak; out[" D64 " + o] += av; }\n    }\n", C, C + Ckv);
  bprintf(u, "    __syncthreads(); /* the next query head reuses p and ds */\n  }\n");
  block_loop(b, B * KV * N, u->s);
}

/* Causal multi-head attention (formulas as the C emitter):
 *   out_i = sum_j softmax_j(q_i . k_j / sqrt(D)) v_j,  j <= i when causal.
 * Forward: a block per (batch, head, query row), the probabilities of the
 * row in shared memory.  Backward: two kernels of a block per row (below),
 * so each output element has one writer: no atomics, deterministic:
 *   dv_j += P_ij dy_i;  dP_ij = dy_i . v_j;  dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij)
 *   dq_i = sum_j dS_ij k_j / sqrt(D);  dk_j += dS_ij q_i / sqrt(D)
 * Rows are items of block_loop; channel indices d < D are int when D fits.
 * Grouped-query attention (kv_heads KV < H): query head h reads key/value
 * head hk = h / (H / KV) of k and v [B, N, KV D]; the gradient packs dq,
 * dk, dv along the channels of rows of C + 2 KV D, and the key-row kernel
 * takes a block per key/value head's row, summing over its query heads in
 * order. */
static void emit_attention(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  const char *ex = k->dtype == DT_F32 ? "expf" : "exp";
  int64_t B = k->batch, N = k->time, C = k->cols, H = k->heads, D = C / H;
  int64_t KV = k->kv_heads > 0 ? k->kv_heads : H, RP = H / KV, Ckv = KV * D;
  bool gqa = RP > 1;
  /* the gradient: row stride W of dq (and dk, dv: emit_attention_gqa_kv), where the statistics start */
  int64_t W = gqa ? C + 2 * Ckv : C, ST = gqa ? B * N * W : 3 * B * N * C;
  const char *kh = gqa ? "hk" : "h"; /* the key/value head */
  const char *DI = index_type(D);
  bool fwd = k->kind == KK_ATTN_FWD;
  int o = fwd ? 0 : 1;
  if (!fwd) bprintf(b, "  %s%s *dy = (%s%s *)t.p[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *q = (%s%s *)t.p[%d];\n", BUF(o, "const "));
  bprintf(b, "  %s%s *k = (%s%s *)t.p[%d];\n", BUF(o + 1, "const "));
  bprintf(b, "  %s%s *v = (%s%s *)t.p[%d];\n", BUF(o + 2, "const "));
  bprintf(b, "  %s%s *out = (%s%s *)t.p[%d];\n", BUF(o + 3, ""));
  bprintf(b, "  const %s scale = (%s)%a;\n", T, T, 1.0 / sqrt((double)D));
  bprintf(b, "  extern __shared__ double duet_smem[];\n  %s *p = (%s *)duet_smem;\n", T, T);
  if (k->kind != KK_ATTN_BWD_KV) bprintf(b, "  __shared__ %s red[32];\n", T); /* key rows reduce nothing */
  Buf body = {.a = b->a}, *u = &body; /* one row */
  if (fwd) {
    bprintf(u, "  const duet_i64 i = blk %% " D64 ", bh = blk / " D64 ";\n", N, N);
    bprintf(u, "  const duet_i64 b = bh / " D64 ", h = bh %% " D64 ";\n", H, H);
    if (gqa) bprintf(u, "  const duet_i64 hk = h / " D64 ";\n", RP);
    if (k->causal) bprintf(u, "  const duet_i64 n = i + 1;\n");
    else bprintf(u, "  const duet_i64 n = " D64 ";\n", N);
    bprintf(u, "  const %s *qi = q + (b * " D64 " + i) * " D64 " + h * " D64 ";\n", T, N, C, D);
    bprintf(u, "  %s lm = -DUET_INF;\n", T);
    bprintf(u, "  for (duet_i64 j = threadIdx.x; j < n; j += blockDim.x) {\n");
    bprintf(u, "    const %s *kj = k + (b * " D64 " + j) * " D64 " + %s * " D64 ";\n", T, N, Ckv, kh, D);
    bprintf(u, "    %s acc = 0;\n    for (%s d = 0; d < " D64 "; d++) acc += qi[d] * kj[d];\n", T, DI, D);
    bprintf(u, "    p[j] = acc * scale;\n    lm = duet_max(lm, p[j]);\n  }\n");
    bprintf(u, "  const %s m = duet_block_max(lm, red);\n  %s ls = 0;\n", T, T);
    bprintf(u, "  for (duet_i64 j = threadIdx.x; j < n; j += blockDim.x) { p[j] = %s(p[j] - m); ls += p[j]; }\n", ex);
    bprintf(u, "  const %s inv = 1 / duet_block_sum(ls, red);\n  __syncthreads();\n", T);
    bprintf(u, "  %s *oi = out + (b * " D64 " + i) * " D64 " + h * " D64 ";\n", T, N, C, D);
    bprintf(u, "  for (%s d = threadIdx.x; d < " D64 "; d += blockDim.x) {\n", DI, D);
    bprintf(u, "    %s acc = 0;\n", T);
    bprintf(u, "    for (duet_i64 j = 0; j < n; j++) acc += p[j] * v[(b * " D64 " + j) * " D64 " + %s * " D64 " + d];\n",
            N, Ckv, kh, D);
    bprintf(u, "    oi[d] = acc * inv;\n  }\n");
    block_loop(b, B * H * N, body.s);
    return;
  }
  /* backward in two kernels of a block per row (FlashAttention-2's split,
   * Dao 2023, without tiling): query row i (this kernel) recomputes its
   * softmax row p and dp = dy_i . v_j, writes dq_i = sum_j ds_ij k_j and the
   * row's max, 1 / sum and sum_j p_ij dp_ij into the workspace after out;
   * key row j (KK_ATTN_BWD_KV) then recomputes p_ij and ds_ij from them and
   * sums dk_j = sum_i ds_ij q_i, dv_j = sum_i p_ij dy_i over i in order.
   * No atomics: each output element has one writer. */
  bprintf(b, "  %s *ds = p + " D64 ";\n", T, N);
  bprintf(b, "  %s *stats = out + " D64 "; /* [batch * heads * time][3]: max, 1 / sum, sum p dp */\n", T, ST);
  if (gqa && k->kind == KK_ATTN_BWD_KV) {
    emit_attention_gqa_kv(b, k, u);
    return;
  }
  bprintf(u, "  const duet_i64 rw = blk %% " D64 ", bh = blk / " D64 ";\n", N, N);
  bprintf(u, "  const duet_i64 b = bh / " D64 ", h = bh %% " D64 ";\n", H, H);
  if (gqa) bprintf(u, "  const duet_i64 hk = h / " D64 ";\n", RP);
  bprintf(u, "  const %s *qh = q + b * " D64 " + h * " D64 ", *kh = k + b * " D64 " + %s * " D64 ";\n", T, N * C, D, N * Ckv,
          kh, D);
  bprintf(u, "  const %s *vh = v + b * " D64 " + %s * " D64 ", *dyh = dy + b * " D64 " + h * " D64 ";\n", T, N * Ckv, kh, D,
          N * C, D);
  if (k->kind == KK_ATTN_BWD) {
    if (k->causal) bprintf(u, "  const duet_i64 i = rw, n = i + 1;\n");
    else bprintf(u, "  const duet_i64 i = rw, n = " D64 ";\n", N);
    bprintf(u, "  const %s *qi = qh + i * " D64 ", *dyi = dyh + i * " D64 ";\n", T, C, C);
    bprintf(u, "  %s lm = -DUET_INF;\n", T);
    bprintf(u, "  for (duet_i64 j = threadIdx.x; j < n; j += blockDim.x) {\n");
    bprintf(u, "    %s acc = 0, g = 0;\n", T);
    bprintf(u, "    for (%s d = 0; d < " D64 "; d++) { acc += qi[d] * kh[j * " D64 " + d]; g += dyi[d] * vh[j * " D64 " + d]; }\n",
            DI, D, Ckv, Ckv);
    bprintf(u, "    p[j] = acc * scale;\n    ds[j] = g;\n    lm = duet_max(lm, p[j]);\n  }\n");
    bprintf(u, "  const %s m = duet_block_max(lm, red);\n  %s ls = 0;\n", T, T);
    bprintf(u, "  for (duet_i64 j = threadIdx.x; j < n; j += blockDim.x) { p[j] = %s(p[j] - m); ls += p[j]; }\n", ex);
    bprintf(u, "  const %s inv = 1 / duet_block_sum(ls, red);\n  %s ld = 0;\n", T, T);
    bprintf(u, "  for (duet_i64 j = threadIdx.x; j < n; j += blockDim.x) { p[j] *= inv; ld += p[j] * ds[j]; }\n");
    bprintf(u, "  const %s dot = duet_block_sum(ld, red);\n", T);
    bprintf(u, "  for (duet_i64 j = threadIdx.x; j < n; j += blockDim.x) ds[j] = p[j] * (ds[j] - dot) * scale;\n");
    bprintf(u, "  __syncthreads();\n");
    bprintf(u, "  for (%s d = threadIdx.x; d < " D64 "; d += blockDim.x) {\n", DI, D);
    bprintf(u, "    %s acc = 0;\n    for (duet_i64 j = 0; j < n; j++) acc += ds[j] * kh[j * " D64 " + d];\n", T, Ckv);
    bprintf(u, "    out[(b * " D64 " + i) * " D64 " + h * " D64 " + d] = acc;\n  }\n", N, W, D);
    bprintf(u, "  if (threadIdx.x == 0) { %s *st = stats + blk * 3; st[0] = m; st[1] = inv; st[2] = dot; }\n", T);
    block_loop(b, B * H * N, body.s);
    return;
  }
  /* KK_ATTN_BWD_KV: key row j */
  bprintf(u, "  const duet_i64 j = rw, i0 = %s;\n", k->causal ? "j" : "0");
  bprintf(u, "  const %s *st = stats + bh * " D64 ";\n", T, 3 * N);
  bprintf(u, "  const %s *kj = kh + j * " D64 ", *vj = vh + j * " D64 ";\n", T, C, C);
  bprintf(u, "  for (duet_i64 i = i0 + threadIdx.x; i < " D64 "; i += blockDim.x) {\n", N);
  bprintf(u, "    %s acc = 0, g = 0;\n", T);
  bprintf(u, "    for (%s d = 0; d < " D64 "; d++) { acc += qh[i * " D64 " + d] * kj[d]; g += dyh[i * " D64 " + d] * vj[d]; }\n",
          DI, D, C, C);
  bprintf(u, "    %s pij = acc * scale;\n    pij = %s(pij - st[i * 3]);\n    pij *= st[i * 3 + 1];\n", T, ex);
  bprintf(u, "    p[i - i0] = pij;\n    ds[i - i0] = pij * (g - st[i * 3 + 2]) * scale;\n  }\n");
  bprintf(u, "  __syncthreads();\n");
  bprintf(u, "  for (%s d = threadIdx.x; d < " D64 "; d += blockDim.x) {\n", DI, D);
  bprintf(u, "    %s ak = 0, av = 0;\n", T);
  bprintf(u, "    for (duet_i64 i = i0; i < " D64 "; i++) { ak += ds[i - i0] * qh[i * " D64 " + d]; av += p[i - i0] * dyh[i * " D64 " + d]; }\n",
          N, C, C);
  bprintf(u, "    const duet_i64 o = (b * " D64 " + j) * " D64 " + h * " D64 " + d;\n", N, C, D);
  bprintf(u, "    out[" D64 " + o] = ak;\n    out[" D64 " + o] = av;\n  }\n", B * N * C, 2 * B * N * C);
  block_loop(b, B * H * N, body.s);
}

/* Generation: the new token's key and value go into row s[POS] of the
 * caches (each block writes its head's slice), then its query attends to
 * rows 0..s[POS]; a block per (batch, head) (items of block_loop).  With
 * grouped-query attention (caches of KV < H heads), the first query head
 * of each group writes its key/value head's slice, and every head reads
 * row s[POS] from k and v themselves (the same values), so that no block
 * reads what another writes in the same launch. */
static void emit_attn_decode(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  const char *ex = k->dtype == DT_F32 ? "expf" : "exp";
  int64_t B = k->batch, N = k->time, C = k->cols, H = k->heads, D = C / H;
  int64_t KV = k->kv_heads > 0 ? k->kv_heads : H, RP = H / KV, Ckv = KV * D;
  const char *DI = index_type(D);
  bprintf(b, "  %s%s *q = (%s%s *)t.p[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *k = (%s%s *)t.p[%d];\n", BUF(1, "const "));
  bprintf(b, "  %s%s *v = (%s%s *)t.p[%d];\n", BUF(2, "const "));
  bprintf(b, "  %s%s *kc = (%s%s *)t.p[%d];\n", BUF(3, ""));
  bprintf(b, "  %s%s *vc = (%s%s *)t.p[%d];\n", BUF(4, ""));
  bprintf(b, "  %s%s *out = (%s%s *)t.p[%d];\n", BUF(5, ""));
  bprintf(b, "  const duet_i64 pos = (duet_i64)sv.v[%d];\n  if (pos < 0 || pos >= " D64 ") return;\n", DUET_S_POS, N);
  bprintf(b, "  const %s scale = (%s)%a;\n", T, T, 1.0 / sqrt((double)D));
  bprintf(b, "  extern __shared__ double duet_smem[];\n  %s *p = (%s *)duet_smem;\n", T, T);
  bprintf(b, "  __shared__ %s red[32];\n", T);
  Buf body = {.a = b->a}, *u = &body; /* one (batch, head) */
  if (RP > 1) {
    bprintf(u, "  const duet_i64 bb = blk / " D64 ", h = blk %% " D64 ", hk = h / " D64 ";\n", H, H, RP);
    bprintf(u, "  const %s *kn = k + bb * " D64 " + hk * " D64 ", *vn = v + bb * " D64 " + hk * " D64 ";\n", T, Ckv, D, Ckv, D);
    bprintf(u, "  if (h %% " D64 " == 0)\n", RP);
    bprintf(u, "    for (%s d = threadIdx.x; d < " D64 "; d += blockDim.x) {\n", DI, D);
    bprintf(u, "      kc[(bb * " D64 " + pos) * " D64 " + hk * " D64 " + d] = kn[d];\n", N, Ckv, D);
    bprintf(u, "      vc[(bb * " D64 " + pos) * " D64 " + hk * " D64 " + d] = vn[d];\n    }\n", N, Ckv, D);
    bprintf(u, "  const %s *qi = q + bb * " D64 " + h * " D64 ";\n  %s lm = -DUET_INF;\n", T, C, D, T);
    bprintf(u, "  for (duet_i64 j = threadIdx.x; j <= pos; j += blockDim.x) {\n");
    bprintf(u, "    const %s *kj = j == pos ? kn : kc + (bb * " D64 " + j) * " D64 " + hk * " D64 ";\n", T, N, Ckv, D);
    bprintf(u, "    %s acc = 0;\n    for (%s d = 0; d < " D64 "; d++) acc += qi[d] * kj[d];\n", T, DI, D);
    bprintf(u, "    p[j] = acc * scale;\n    lm = duet_max(lm, p[j]);\n  }\n");
    bprintf(u, "  const %s m = duet_block_max(lm, red);\n  %s ls = 0;\n", T, T);
    bprintf(u, "  for (duet_i64 j = threadIdx.x; j <= pos; j += blockDim.x) { p[j] = %s(p[j] - m); ls += p[j]; }\n", ex);
    bprintf(u, "  const %s sum = duet_block_sum(ls, red);\n  __syncthreads();\n", T);
    bprintf(u, "  for (%s d = threadIdx.x; d < " D64 "; d += blockDim.x) {\n    %s acc = 0;\n", DI, D, T);
    bprintf(u, "    for (duet_i64 j = 0; j <= pos; j++) acc += p[j] / sum * (j == pos ? vn[d] : vc[(bb * " D64 " + j) * " D64
               " + hk * " D64 " + d]);\n", N, Ckv, D);
    bprintf(u, "    out[bb * " D64 " + h * " D64 " + d] = acc;\n  }\n", C, D);
    block_loop(b, B * H, body.s);
    return;
  }
  bprintf(u, "  const duet_i64 bb = blk / " D64 ", h = blk %% " D64 ";\n", H, H);
  bprintf(u, "  for (%s d = threadIdx.x; d < " D64 "; d += blockDim.x) {\n", DI, D);
  bprintf(u, "    kc[(bb * " D64 " + pos) * " D64 " + h * " D64 " + d] = k[bb * " D64 " + h * " D64 " + d];\n", N, C, D, C, D);
  bprintf(u, "    vc[(bb * " D64 " + pos) * " D64 " + h * " D64 " + d] = v[bb * " D64 " + h * " D64 " + d];\n  }\n", N, C, D, C,
          D);
  bprintf(u, "  __syncthreads();\n");
  bprintf(u, "  const %s *qi = q + bb * " D64 " + h * " D64 ";\n  %s lm = -DUET_INF;\n", T, C, D, T);
  bprintf(u, "  for (duet_i64 j = threadIdx.x; j <= pos; j += blockDim.x) {\n");
  bprintf(u, "    const %s *kj = kc + (bb * " D64 " + j) * " D64 " + h * " D64 ";\n", T, N, C, D);
  bprintf(u, "    %s acc = 0;\n    for (%s d = 0; d < " D64 "; d++) acc += qi[d] * kj[d];\n", T, DI, D);
  bprintf(u, "    p[j] = acc * scale;\n    lm = duet_max(lm, p[j]);\n  }\n");
  bprintf(u, "  const %s m = duet_block_max(lm, red);\n  %s ls = 0;\n", T, T);
  bprintf(u, "  for (duet_i64 j = threadIdx.x; j <= pos; j += blockDim.x) { p[j] = %s(p[j] - m); ls += p[j]; }\n", ex);
  bprintf(u, "  const %s sum = duet_block_sum(ls, red);\n  __syncthreads();\n", T);
  bprintf(u, "  for (%s d = threadIdx.x; d < " D64 "; d += blockDim.x) {\n    %s acc = 0;\n", DI, D, T);
  bprintf(u, "    for (duet_i64 j = 0; j <= pos; j++) acc += p[j] / sum * vc[(bb * " D64 " + j) * " D64 " + h * " D64 " + d];\n",
          N, C, D);
  bprintf(u, "    out[bb * " D64 " + h * " D64 " + d] = acc;\n  }\n", C, D);
  block_loop(b, B * H, body.s);
}

/* A block per 32 x 32 tile (items of block_loop), through shared memory. */
static void emit_transpose(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  int64_t R = k->rows, C = k->cols, nct = (C + 31) / 32;
  bprintf(b, "  %s%s *x = (%s%s *)t.p[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t.p[%d];\n", BUF(1, ""));
  bprintf(b, "  __shared__ %s tile[32][33];\n", T);
  bprintf(b, "  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;\n");
  Buf body = {.a = b->a}, *u = &body; /* one tile */
  bprintf(u, "  const duet_i64 r0 = blk / " D64 " * 32, c0 = blk %% " D64 " * 32;\n", nct, nct);
  bprintf(u, "  for (int e = ty; e < 32; e += blockDim.x >> 5)\n");
  bprintf(u, "    if (r0 + e < " D64 " && c0 + tx < " D64 ") tile[e][tx] = x[(r0 + e) * " D64 " + c0 + tx];\n", R, C, C);
  bprintf(u, "  __syncthreads();\n");
  bprintf(u, "  for (int e = ty; e < 32; e += blockDim.x >> 5)\n");
  bprintf(u, "    if (c0 + e < " D64 " && r0 + tx < " D64 ") y[(c0 + e) * " D64 " + r0 + tx] = tile[tx][e];\n", C, R, R);
  block_loop(b, ((R + 31) / 32) * nct, body.s);
}

static void emit_positions(Buf *b, const Kernel *k) {
  bprintf(b, "  duet_i32 *out = (duet_i32 *)t.p[%d];\n", 1);
  bprintf(b, "  const duet_i32 base = (duet_i32)sv.v[%d];\n", DUET_S_POS);
  GRID_LOOP(b, "i", k->rows);
  bprintf(b, "    out[i] = base + (duet_i32)i;\n  }\n");
}

/* Sliding windows over [N,C,H,W] (the C emitter's semantics).  Every
 * kernel is a gather: the backward ones give each input element a thread
 * that sums over the windows covering it (tap ki covers ih when
 * ih + PH - ki*DH is a non-negative multiple of SH below OH*SH), so there
 * are no atomics and results do not depend on scheduling. */
static void emit_window(Buf *b, const Kernel *k) {
  const char *T = cutype(k->dtype);
  int64_t N = k->xs.dim[0], C = k->xs.dim[1], H = k->xs.dim[2], W = k->xs.dim[3];
  int64_t OH = k->ys.dim[2], OW = k->ys.dim[3];
  bprintf(b, "  const duet_i64 N_ = " D64 ", C_ = " D64 ", H_ = " D64 ", W_ = " D64 ", OH = " D64 ", OW = " D64 ";\n", N,
          C, H, W, OH, OW);
  bprintf(b, "  const duet_i64 KH = " D64 ", KW = " D64 ", SH = " D64 ", SW = " D64 ", PH = " D64 ", PW = " D64
             ", DH = " D64 ", DW = " D64 ";\n",
          k->win[0], k->win[1], k->win[2], k->win[3], k->win[4], k->win[5], k->win[6], k->win[7]);
  bprintf(b, "  (void)N_; (void)C_; (void)H_; (void)W_; (void)OH; (void)OW; (void)KH; (void)KW;\n");
  bprintf(b, "  (void)SH; (void)SW; (void)PH; (void)PW; (void)DH; (void)DW;\n");
  /* for a gather over the windows covering (ih, iw) of plane nc */
  const char *cover =
      "    for (duet_i64 ki = 0; ki < KH; ki++) {\n"
      "      const duet_i64 th = ih + PH - ki * DH;\n"
      "      if (th < 0 || th %% SH || th / SH >= OH) continue;\n"
      "      const duet_i64 oh = th / SH;\n"
      "      for (duet_i64 kj = 0; kj < KW; kj++) {\n"
      "        const duet_i64 tw = iw + PW - kj * DW;\n"
      "        if (tw < 0 || tw %% SW || tw / SW >= OW) continue;\n"
      "        const duet_i64 ow = tw / SW, o = (nc * OH + oh) * OW + ow;\n"
      "        (void)o;\n";
  switch (k->kind) {
  case KK_IM2COL:
    bprintf(b, "  const %s *x = (const %s *)t.p[%d];\n  %s *cols = (%s *)t.p[%d];\n", T, T, 0, T, T,
            1);
    GRID_LOOP(b, "e", N * OH * OW * C * k->win[0] * k->win[1]);
    bprintf(b, "    const duet_i64 r = e / (C_ * KH * KW), q = e %% (C_ * KH * KW);\n");
    bprintf(b, "    const duet_i64 c = q / (KH * KW), ki = q / KW %% KH, kj = q %% KW;\n");
    bprintf(b, "    const duet_i64 n = r / (OH * OW), oh = r / OW %% OH, ow = r %% OW;\n");
    bprintf(b, "    const duet_i64 ih = oh * SH - PH + ki * DH, iw = ow * SW - PW + kj * DW;\n");
    bprintf(b, "    cols[e] = ih >= 0 && ih < H_ && iw >= 0 && iw < W_ ? x[((n * C_ + c) * H_ + ih) * W_ + iw] : (%s)0;\n  }\n",
            T);
    return;
  case KK_COL2IM:
    bprintf(b, "  const %s *cols = (const %s *)t.p[%d];\n  %s *dx = (%s *)t.p[%d];\n", T, T, 0, T, T,
            1);
    GRID_LOOP(b, "e", N * C * H * W);
    bprintf(b, "    const duet_i64 nc = e / (H_ * W_), ih = e / W_ %% H_, iw = e %% W_, n = nc / C_, c = nc %% C_;\n");
    bprintf(b, "    %s acc = 0;\n", T);
    bprintf(b, cover);
    bprintf(b, "        acc += cols[((n * OH + oh) * OW + ow) * (C_ * KH * KW) + (c * KH + ki) * KW + kj];\n");
    bprintf(b, "      }\n    }\n    dx[e] = acc;\n  }\n");
    return;
  case KK_MAXPOOL:
  case KK_AVGPOOL: {
    bool mx = k->kind == KK_MAXPOOL;
    bprintf(b, "  const %s *x = (const %s *)t.p[%d];\n  %s *y = (%s *)t.p[%d];\n", T, T, 0, T, T,
            1);
    GRID_LOOP(b, "o", N * C * OH * OW);
    bprintf(b, "    const duet_i64 nc = o / (OH * OW), oh = o / OW %% OH, ow = o %% OW;\n");
    bprintf(b, "    const %s *xp = x + nc * H_ * W_;\n", T);
    if (mx) bprintf(b, "    %s m = -DUET_INF;\n    duet_i64 am = -1;\n", T);
    else bprintf(b, "    %s acc = 0;\n", T);
    bprintf(b, "    for (duet_i64 ki = 0; ki < KH; ki++) {\n      const duet_i64 ih = oh * SH - PH + ki * DH;\n");
    bprintf(b, "      if (ih < 0 || ih >= H_) continue;\n");
    bprintf(b, "      for (duet_i64 kj = 0; kj < KW; kj++) {\n        const duet_i64 iw = ow * SW - PW + kj * DW;\n");
    bprintf(b, "        if (iw < 0 || iw >= W_) continue;\n");
    if (mx) bprintf(b, "        if (xp[ih * W_ + iw] > m || am < 0) { m = xp[ih * W_ + iw]; am = ih * W_ + iw; }\n");
    else bprintf(b, "        acc += xp[ih * W_ + iw];\n");
    bprintf(b, "      }\n    }\n");
    if (mx) bprintf(b, "    y[o] = m;\n  }\n");
    else bprintf(b, "    y[o] = acc / (%s)(KH * KW);\n  }\n", T);
    return;
  }
  case KK_MAXPOOL_GRAD:
  case KK_AVGPOOL_GRAD: {
    bool mx = k->kind == KK_MAXPOOL_GRAD;
    bprintf(b, "  const %s *dy = (const %s *)t.p[%d];\n", T, T, 0);
    if (mx) bprintf(b, "  const %s *x = (const %s *)t.p[%d];\n", T, T, 1);
    bprintf(b, "  %s *dx = (%s *)t.p[%d];\n", T, T, mx ? 2 : 1);
    GRID_LOOP(b, "e", N * C * H * W);
    bprintf(b, "    const duet_i64 nc = e / (H_ * W_), ih = e / W_ %% H_, iw = e %% W_;\n");
    if (mx) bprintf(b, "    const %s *xp = x + nc * H_ * W_;\n", T);
    bprintf(b, "    %s acc = 0;\n", T);
    bprintf(b, cover);
    if (mx) {
      /* the window's first maximum (the forward's scan) */
      bprintf(b, "        %s m = -DUET_INF;\n        duet_i64 am = -1;\n", T);
      bprintf(b, "        for (duet_i64 a = 0; a < KH; a++) {\n          const duet_i64 h2 = oh * SH - PH + a * DH;\n");
      bprintf(b, "          if (h2 < 0 || h2 >= H_) continue;\n");
      bprintf(b, "          for (duet_i64 c2 = 0; c2 < KW; c2++) {\n            const duet_i64 w2 = ow * SW - PW + c2 * DW;\n");
      bprintf(b, "            if (w2 < 0 || w2 >= W_) continue;\n");
      bprintf(b, "            if (xp[h2 * W_ + w2] > m || am < 0) { m = xp[h2 * W_ + w2]; am = h2 * W_ + w2; }\n");
      bprintf(b, "          }\n        }\n");
      bprintf(b, "        if (am == ih * W_ + iw) acc += dy[o];\n");
    } else {
      bprintf(b, "        acc += dy[o] / (%s)(KH * KW);\n", T);
    }
    bprintf(b, "      }\n    }\n    dx[e] = acc;\n  }\n");
    return;
  }
  default: unreachable();
  }
}

/* The helpers every kernel may use.  Reductions need blockDim.x to be a
 * multiple of 32 (every launch in codegen_cuda_launch is). */
static const char *PRELUDE =
    "typedef int duet_i32;\n"
    "typedef unsigned int duet_u32;\n"
    "typedef long long duet_i64;\n"
    "typedef unsigned long long duet_u64;\n"
    "#define DUET_INF __int_as_float(0x7f800000)\n"
    "\n"
    "/* max that propagates NaN (a comparison with NaN keeps the NaN) */\n"
    "template <typename T> __device__ __forceinline__ T duet_max(T a, T b) { return a > b || a != a ? a : b; }\n"
    "template <typename T> __device__ __forceinline__ T duet_warp_sum(T v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  return v;\n}\n"
    "template <typename T> __device__ __forceinline__ T duet_warp_max(T v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v = duet_max(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "  return v;\n}\n"
    "/* the largest value and, among equal values, the smallest index */\n"
    "template <typename T> __device__ __forceinline__ void duet_warp_argmax(T &m, duet_i64 &am) {\n"
    "  for (int o = 16; o > 0; o >>= 1) {\n"
    "    const T m2 = __shfl_xor_sync(0xffffffffu, m, o);\n"
    "    const duet_i64 a2 = __shfl_xor_sync(0xffffffffu, am, o);\n"
    "    if (m2 > m || (m2 == m && a2 < am)) { m = m2; am = a2; }\n"
    "  }\n}\n"
    "/* block-wide sum and max: warp shuffles, then one value per warp through\n"
    " * shared memory `sh` (32 entries); every thread gets the result */\n"
    "template <typename T> __device__ T duet_block_sum(T v, T *sh) {\n"
    "  v = duet_warp_sum(v);\n"
    "  __syncthreads();\n"
    "  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  v = (threadIdx.x & 31) < (blockDim.x >> 5) ? sh[threadIdx.x & 31] : (T)0;\n"
    "  return duet_warp_sum(v);\n}\n"
    "template <typename T> __device__ T duet_block_max(T v, T *sh) {\n"
    "  v = duet_warp_max(v);\n"
    "  __syncthreads();\n"
    "  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  v = sh[(threadIdx.x & 31) < (blockDim.x >> 5) ? (threadIdx.x & 31) : 0];\n"
    "  return duet_warp_max(v);\n}\n"
    "/* GELU (tanh approximation) gradient, as the C emitter */\n"
    "template <typename T> __device__ __forceinline__ T duet_gelu_grad(T dy, T x) {\n"
    "  const T c = (T)0.7978845608028654, a = (T)0.044715, th = tanh(c * (x + a * x * x * x));\n"
    "  return dy * ((T)0.5 * (1 + th) + (T)0.5 * x * (1 - th * th) * c * (1 + 3 * a * x * x));\n}\n"
    "/* dropout masks: the C emitter's splitmix64-style hash of (step seed, site, element) (Steele et al. 2014) */\n"
    "__device__ __forceinline__ int duet_dropout_keep(duet_u64 seed, duet_u64 site, duet_u64 i, duet_u64 thr) {\n"
    "  duet_u64 z = seed ^ (site * 0xD1B54A32D192ED03ull) ^ (i * 0x9E3779B97F4A7C15ull);\n"
    "  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;\n"
    "  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;\n"
    "  return (z ^ (z >> 31)) >= thr;\n}\n\n";

/* The logistic function and silu's gradient, as the C emitter (exp of
 * -|x| only: no overflow for any x; NaN stays NaN), printed when a kernel
 * uses sigmoid, silu or silu's gradient. */
static const char *PRELUDE_SIGMOID =
    "/* sigmoid from exp(-|x|), and silu'(x) = s (1 + x (1 - s)), s = sigmoid(x): as the C emitter */\n"
    "template <typename T> __device__ __forceinline__ T duet_sigmoid(T x) {\n"
    "  const T e = exp(-fabs(x));\n"
    "  return (x >= 0 ? (T)1 : e) / (1 + e);\n}\n"
    "template <typename T> __device__ __forceinline__ T duet_silu_grad(T dy, T x) {\n"
    "  const T s = duet_sigmoid(x);\n"
    "  return dy * (s * (1 + x * (1 - s)));\n}\n\n";

/* Quantization-aware training: the C emitter's fake_quant_T (duet_quantize_i8's
 * numbers), printed when a kernel uses it. */
/* The int8 GEMM's four-byte dot product: c + the sum of the products of
 * the signed bytes of a and b.  DP4A (__dp4a) arrived with sm_61; on sm_60
 * (the P100) and under DUET_NO_DP4A (a test of this path on the host
 * emulator) it is four multiplies and adds, the same exact int32 sum. */
static const char *PRELUDE_DOT4 =
    "__device__ __forceinline__ int duet_dot4(int a, int b, int c) {\n"
    "#if defined(DUET_NO_DP4A) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 610)\n"
    "  for (int j = 0; j < 4; j++) c += (int)(signed char)(a >> (8 * j)) * (int)(signed char)(b >> (8 * j));\n"
    "  return c;\n"
    "#else\n"
    "  return __dp4a(a, b, c);\n"
    "#endif\n"
    "}\n\n";

static const char *PRELUDE_FAKE_QUANT =
    "/* w quantized to int8 and back, scale m / 127 (m: its channel's max |w|): as the C emitter */\n"
    "template <typename T> __device__ __forceinline__ T duet_fake_quant(T x, T m) {\n"
    "  T s = m / (T)127;\n"
    "  if (!(m > 0 && m <= (T)3.40282346638528859812e+38f)) s = 1;\n"
    "  else if (s < (T)1.17549435082228750797e-38f) s = (T)1.17549435082228750797e-38f;\n"
    "  T q = rint(x / s);\n"
    "  q = q > (T)127 ? (T)127 : q < (T)-127 ? (T)-127 : q;\n"
    "  return q * s;\n}\n\n";

/* Conversions for 16-bit storage, printed when a program has 16-bit
 * tensors.  Choice: raw uint16 bits converted here, not cuda_fp16.h /
 * cuda_bf16.h.  These are runtime/duet_half.h's algorithms (the code the
 * CPU backend's kernels and GEMMs run), so both backends round alike bit
 * for bit: RNE including the f16 subnormals, overflow to inf at 65520, a
 * NaN kept quiet with its sign and top payload bits (the toolkit's
 * __float2half returns one canonical NaN).  The source still includes
 * nothing, so NVRTC needs no include path (cuda_fp16.h is found only with
 * -I<toolkit>/include, and NVRTC bundles it only from 13.3 on:
 * shared/FACTS.md) and any toolkit (11.8 to 13) compiles it for any
 * architecture, compute_60 included.  The f16
 * subnormal path rounds with the f32 adder (__fadd_rn: round to nearest,
 * never contracted); NVRTC's default -ftz=false keeps it exact. */
static const char *PRELUDE_HALF =
    "typedef unsigned short duet_u16;\n"
    "/* binary16 and bfloat16 <-> binary32, round to nearest even: runtime/duet_half.h */\n"
    "__device__ __forceinline__ duet_u16 duet_f16_from_f32(float f) {\n"
    "  const duet_u32 x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;\n"
    "  const duet_u32 normal = (ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13;\n"
    "  const duet_u32 sub = __float_as_uint(__fadd_rn(__uint_as_float(ax), 0.5f)) - 0x3f000000u;\n"
    "  const duet_u32 nan = 0x7e00u | ((ax >> 13) & 0x3ffu);\n"
    "  duet_u32 r = ax < 0x38800000u ? sub : normal;\n"
    "  r = ax >= 0x477ff000u ? 0x7c00u : r;\n"
    "  r = ax > 0x7f800000u ? nan : r;\n"
    "  return (duet_u16)(sign | r);\n}\n"
    "__device__ __forceinline__ float duet_f32_from_f16(duet_u16 h) {\n"
    "  const duet_u32 sign = (duet_u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;\n"
    "  duet_u32 r = e == 31u ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13);\n"
    "  r = e == 0u ? __float_as_uint(__fmul_rn((float)(int)m, 5.9604644775390625e-8f)) : r; /* m * 2^-24 */\n"
    "  return __uint_as_float(sign | r);\n}\n"
    "__device__ __forceinline__ duet_u16 duet_bf16_from_f32(float f) {\n"
    "  const duet_u32 x = __float_as_uint(f);\n"
    "  return (duet_u16)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : (x + 0x7fffu + ((x >> 16) & 1u)) >> 16);\n}\n"
    "__device__ __forceinline__ float duet_f32_from_bf16(duet_u16 h) { return __uint_as_float((duet_u32)h << 16); }\n\n";

const char *codegen_cuda_half_prelude(void) { return PRELUDE_HALF; }

/* The half2 helpers ("half2" above), printed after PRELUDE_HALF when a
 * kernel takes the half2 path.  The arithmetic has three versions:
 * sm_53 and later (f16x2 arithmetic exists from sm_53: PTX ISA) except
 * sm_61, the f16x2 instructions with an explicit .rn; older targets and
 * sm_61 (P40, GTX 10xx: fp16 at 1/64 of the fp32 rate, shared/FACTS.md;
 * ggml also treats only cc >= 600, != 610 as fast fp16), two f32 lanes
 * each rounded once (the same results, by the double-rounding argument);
 * a host compiler (no __CUDA_ARCH__: tests/cuda_emu), the includer's
 * duet_emu_f16x2.  The bit operations are the same everywhere. */
static const char *PRELUDE_HALF2 =
    "/* half2: two binary16 values in a 32-bit word, element 2p in the low half;\n"
    " * add/sub/mul round once to nearest even, as f32 arithmetic rounded to f16 */\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 530 && __CUDA_ARCH__ != 610\n"
    "__device__ __forceinline__ duet_u32 duet_h2add(duet_u32 a, duet_u32 b) {\n"
    "  duet_u32 d;\n  asm(\"add.rn.f16x2 %0, %1, %2;\" : \"=r\"(d) : \"r\"(a), \"r\"(b));\n  return d;\n}\n"
    "__device__ __forceinline__ duet_u32 duet_h2sub(duet_u32 a, duet_u32 b) {\n"
    "  duet_u32 d;\n  asm(\"sub.rn.f16x2 %0, %1, %2;\" : \"=r\"(d) : \"r\"(a), \"r\"(b));\n  return d;\n}\n"
    "__device__ __forceinline__ duet_u32 duet_h2mul(duet_u32 a, duet_u32 b) {\n"
    "  duet_u32 d;\n  asm(\"mul.rn.f16x2 %0, %1, %2;\" : \"=r\"(d) : \"r\"(a), \"r\"(b));\n  return d;\n}\n"
    "#elif defined(__CUDA_ARCH__)\n"
    "/* no f16x2 arithmetic before sm_53, and sm_61's runs at 1/64 of f32's:\n"
    " * f32 lanes, each rounded once to f16 */\n"
    "__device__ __forceinline__ duet_u32 duet_h2f32(duet_u32 a, duet_u32 b, int op) {\n"
    "  duet_u32 d = 0;\n"
    "  for (int l = 0; l < 32; l += 16) {\n"
    "    const float x = duet_f32_from_f16((duet_u16)(a >> l)), y = duet_f32_from_f16((duet_u16)(b >> l));\n"
    "    d |= (duet_u32)duet_f16_from_f32(op == 0 ? __fadd_rn(x, y) : op == 1 ? __fsub_rn(x, y) : __fmul_rn(x, y)) << l;\n"
    "  }\n"
    "  return d;\n}\n"
    "__device__ __forceinline__ duet_u32 duet_h2add(duet_u32 a, duet_u32 b) { return duet_h2f32(a, b, 0); }\n"
    "__device__ __forceinline__ duet_u32 duet_h2sub(duet_u32 a, duet_u32 b) { return duet_h2f32(a, b, 1); }\n"
    "__device__ __forceinline__ duet_u32 duet_h2mul(duet_u32 a, duet_u32 b) { return duet_h2f32(a, b, 2); }\n"
    "#else /* a host compiler (tests/cuda_emu): the includer emulates the f16x2 instructions */\n"
    "__device__ __forceinline__ duet_u32 duet_h2add(duet_u32 a, duet_u32 b) { return duet_emu_f16x2(a, b, '+'); }\n"
    "__device__ __forceinline__ duet_u32 duet_h2sub(duet_u32 a, duet_u32 b) { return duet_emu_f16x2(a, b, '-'); }\n"
    "__device__ __forceinline__ duet_u32 duet_h2mul(duet_u32 a, duet_u32 b) { return duet_emu_f16x2(a, b, '*'); }\n"
    "#endif\n"
    "/* exact bit operations, as the C kernels' f32 code on widened values:\n"
    " * a NaN lane gets the quiet bit (widening and rounding back sets it) */\n"
    "__device__ __forceinline__ duet_u32 duet_h2quiet(duet_u32 h) {\n"
    "  return h | ((h & 0x7fffu) > 0x7c00u ? 0x0200u : 0u) | ((h >> 16 & 0x7fffu) > 0x7c00u ? 0x02000000u : 0u);\n}\n"
    "/* 0xffff in each lane holding a value below (sign 1) or above (sign 0)\n"
    " * zero: a nonzero magnitude up to inf's, so never -0, +0 or NaN */\n"
    "__device__ __forceinline__ duet_u32 duet_h2sgn(duet_u32 h, duet_u32 sign) {\n"
    "  duet_u32 m = 0;\n"
    "  if ((h & 0x8000u) == sign && (h & 0x7fffu) - 1u < 0x7c00u) m |= 0xffffu;\n"
    "  if ((h >> 16 & 0x8000u) == sign && (h >> 16 & 0x7fffu) - 1u < 0x7c00u) m |= 0xffff0000u;\n"
    "  return m;\n}\n"
    "/* relu: x < 0 ? +0 : x (-0 and NaN pass) */\n"
    "__device__ __forceinline__ duet_u32 duet_h2relu(duet_u32 x) { return x & ~duet_h2sgn(x, 0x8000u); }\n"
    "/* its gradient: x > 0 ? dy : +0 */\n"
    "__device__ __forceinline__ duet_u32 duet_h2relu_grad(duet_u32 dy, duet_u32 x) { return dy & duet_h2sgn(x, 0u); }\n\n";

const char *codegen_cuda_half2_prelude(void) { return PRELUDE_HALF2; }

/* The int8 GEMM (KK_GEMM_I8; the C kernel in emit_c.c gives the
 * semantics): a block of 256 threads per 16 x 16 tile of y (looping over
 * the tiles beyond the grid), one output per thread.  Per 64 inputs the
 * block packs its 16 rows of x, quantized (x / sa with __fdiv_rn, rintf:
 * half to even, clamped, NaN to 0: the C kernel's numbers), and its 16
 * output channels of q into shared words of 4 bytes along k, and each
 * thread adds 16 four-byte dot products (duet_dot4: DP4A from sm_61) to
 * its int32 sum: exact, so the same bits as the C kernel in any order.
 * The output is __fmul_rn((float)acc, sa) times sw.  Calibration (sa <=
 * 0): each thread sums its output in f32, k ascending, with __fmul_rn /
 * __fadd_rn (no fma: the C kernel's roundings), and the tiles of the first
 * column of tiles take max|x| over their rows into sa as -max by an
 * atomicMax on the bits (a negative float's bits grow with its magnitude,
 * and exceed +0's). */
static void emit_gemm_i8(Buf *b, const Kernel *k) {
  int64_t M = k->rows, N = k->cols, K = k->red, TN = (N + 15) / 16, NT = ((M + 15) / 16) * TN;
  bool tb = k->trans_b;
  const char *sw = k->n == 1 ? "sw[0]" : "sw[n]";
  char qi[96];
  snprintf(qi, sizeof qi, tb ? "n * (duet_i64)%" PRId64 " + kk" : "kk * (duet_i64)%" PRId64 " + n", tb ? K : N);
  bprintf(b, "  const float *x = (const float *)t.p[0];\n  const signed char *q = (const signed char *)t.p[1];\n");
  bprintf(b, "  const float *sw = (const float *)t.p[2];\n  float *sa = (float *)t.p[3];\n  float *y = (float *)t.p[4];\n");
  bprintf(b, "  (void)sv;\n  const float a = sa[0];\n  const int tx = threadIdx.x %% 16, ty = threadIdx.x / 16;\n");
  bprintf(b, "  __shared__ int xs[16][17], qs[16][17];\n");
  bprintf(b, "  for (duet_i64 tile = blockIdx.x; tile < " D64 "; tile += gridDim.x) {\n", NT);
  bprintf(b, "    const duet_i64 r0 = tile / " D64 " * 16, n0 = tile %% " D64 " * 16;\n", TN, TN);
  bprintf(b, "    const duet_i64 r = r0 + ty, n = n0 + tx;\n");
  bprintf(b, "    if (!(a > 0)) { /* calibration */\n");
  bprintf(b, "      if (n0 == 0) {\n        float m = 0;\n");
  bprintf(b, "        const duet_i64 lim = (" D64 " - r0 < 16 ? " D64 " - r0 : 16) * " D64 ";\n", M, M, K);
  bprintf(b, "        for (duet_i64 i = threadIdx.x; i < lim; i += blockDim.x) m = fmaxf(m, fabsf(x[r0 * " D64
             " + i]));\n", K);
  bprintf(b, "        atomicMax((unsigned *)sa, __float_as_uint(-m));\n      }\n");
  bprintf(b, "      if (r < " D64 " && n < " D64 ") {\n        float acc = 0;\n", M, N);
  bprintf(b, "        for (duet_i64 kk = 0; kk < " D64 "; kk++)\n", K);
  bprintf(b, "          acc = __fadd_rn(acc, __fmul_rn(x[r * " D64 " + kk], __fmul_rn((float)q[%s], %s)));\n", K, qi,
          sw);
  bprintf(b, "        y[r * " D64 " + n] = acc;\n      }\n      continue;\n    }\n", N);
  bprintf(b, "    int acc = 0;\n");
  bprintf(b, "    for (duet_i64 k0 = 0; k0 < " D64 "; k0 += 64) {\n", K);
  bprintf(b, "      unsigned wx = 0, wq = 0;\n      const duet_i64 rr = r0 + ty, nn = n0 + ty;\n");
  bprintf(b, "      for (int j = 0; j < 4; j++) {\n        const duet_i64 kk = k0 + tx * 4 + j;\n");
  bprintf(b, "        int v = 0, w = 0;\n        if (rr < " D64 " && kk < " D64 ") {\n", M, K);
  bprintf(b, "          const float f = rintf(__fdiv_rn(x[rr * " D64 " + kk], a));\n", K);
  bprintf(b, "          v = f != f ? 0 : f > 127 ? 127 : f < -127 ? -127 : (int)f;\n        }\n");
  char qn[96];
  snprintf(qn, sizeof qn, tb ? "nn * (duet_i64)%" PRId64 " + kk" : "kk * (duet_i64)%" PRId64 " + nn", tb ? K : N);
  bprintf(b, "        if (nn < " D64 " && kk < " D64 ") w = q[%s];\n", N, K, qn);
  bprintf(b, "        wx |= (unsigned)(v & 255) << (8 * j);\n        wq |= (unsigned)(w & 255) << (8 * j);\n      }\n");
  bprintf(b, "      xs[ty][tx] = (int)wx;\n      qs[ty][tx] = (int)wq;\n      __syncthreads();\n");
  bprintf(b, "      for (int w = 0; w < 16; w++) acc = duet_dot4(xs[ty][w], qs[tx][w], acc);\n      __syncthreads();\n    }\n");
  bprintf(b, "    if (r < " D64 " && n < " D64 ") y[r * " D64 " + n] = __fmul_rn(__fmul_rn((float)acc, a), %s);\n  }\n",
          M, N, N, sw);
}

static const char *kind_name(KernelKind k) {
  static const char *const names[] = {
      [KK_ELEMENTWISE] = "elementwise", [KK_REDUCE] = "reduce",         [KK_MAX_GRAD] = "max_grad",
      [KK_XENT_FWD] = "xent_fwd",       [KK_XENT_BWD] = "xent_bwd",     [KK_EVAL_METRICS] = "eval_metrics",
      [KK_EMBED_FWD] = "embed_fwd",     [KK_EMBED_BWD] = "embed_bwd",   [KK_NORM_FWD] = "norm_fwd",
      [KK_NORM_BWD] = "norm_bwd",       [KK_ATTN_FWD] = "attn_fwd",     [KK_ATTN_BWD] = "attn_bwd",   [KK_ATTN_BWD_KV] = "attn_bwd_kv",
      [KK_TRANSPOSE] = "transpose",     [KK_POSITIONS] = "positions",   [KK_IM2COL] = "im2col",
      [KK_COL2IM] = "col2im",           [KK_MAXPOOL] = "maxpool",       [KK_MAXPOOL_GRAD] = "maxpool_grad",
      [KK_AVGPOOL] = "avgpool",         [KK_AVGPOOL_GRAD] = "avgpool_grad", [KK_ATTN_DECODE] = "attn_decode",
      [KK_UNSCALE] = "unscale",         [KK_SOFTMAX] = "softmax",       [KK_SOFTMAX_BWD] = "softmax_bwd",
      [KK_RMSNORM_FWD] = "rmsnorm_fwd", [KK_RMSNORM_BWD] = "rmsnorm_bwd", [KK_ROPE] = "rope",
      [KK_MSE] = "mse",
      [KK_SUMSQ] = "sumsq",           [KK_CLIP_SCALE] = "clip_scale",
      [KK_ADAMW8] = "adamw8",         [KK_GEMM_I8] = "gemm_i8",
  };
  return (unsigned)k < sizeof names / sizeof *names && names[k] ? names[k] : "?";
}

char *codegen_emit_cuda(const CgProgram *cp, Arena *a, int32_t *fn_of, int *n_fns) {
  Buf b = {.a = a};
  bool half = false;
  for (int i = 0; i < cp->n_kernels; i++) {
    const Kernel *k = &cp->kernels[i];
    bool h = is16(k->dtype);
    for (int j = 0; j < k->n_bufs; j++) h |= is16(k->bufs[j].dtype);
    for (int j = 0; j < k->n_ins; j++) h |= k->ins[j].op == KI_CAST;
    /* the precision pass leaves 16-bit data to elementwise kernels (casts
     * fused in), unscale and GEMMs; any other kernel kind computes in f32 */
    DUET_ASSERT(!h || k->kind == KK_ELEMENTWISE || k->kind == KK_UNSCALE || k->kind == KK_TRANSPOSE);
    half |= h;
  }
  bool half2 = false;
  for (int i = 0; i < cp->n_kernels; i++) half2 |= codegen_cuda_half2(&cp->kernels[i]) != CG_HALF2_NONE;
  /* one function per distinct kernel text (module-scope partial sums and
   * flags belong to the function: launches on one stream never overlap) */
  KernelFuncs funcs = {.a = a};
  for (int i = 0; i < cp->n_kernels; i++) {
    const Kernel *k = &cp->kernels[i];
    DuetLaunch l;
    codegen_cuda_launch(k, &l);
    H2Plan h2;
    h2_plan(k, &h2);
    Buf u = {.a = a};
    bprintf(&u, "/* %s%s: grid %u, block %u, dynamic shared %u bytes */\n", kind_name(k->kind),
            h2.level == CG_HALF2_ARITH ? ", half2 arithmetic" : h2.level == CG_HALF2_BITS ? ", half2" : "", l.grid,
            l.block, l.shared);
    if (k->kind == KK_XENT_FWD || k->kind == KK_EVAL_METRICS) /* the blocks' partial sums */
      bprintf(&u, "__device__ double duet_part" FN "[%u];\n__device__ unsigned int duet_done" FN ";\n", 2 * l.grid);
    if (reduce_whole(k) || k->kind == KK_MSE || k->kind == KK_SUMSQ)
      bprintf(&u, "__device__ double duet_part" FN "[%u];\n__device__ unsigned int duet_done" FN ";\n", l.grid);
    if (k->kind == KK_UNSCALE) /* the blocks' overflow verdicts */
      bprintf(&u, "__device__ int duet_flag" FN ";\n__device__ unsigned int duet_done" FN ";\n");
    bprintf(&u, "extern \"C\" __global__ void __launch_bounds__(%u) duet_k" FN "(duet_args t, duet_scalars sv) {\n",
            l.block);
    switch (k->kind) {
    case KK_ELEMENTWISE: emit_elementwise(&u, k, &l, &h2); break;
    case KK_REDUCE: case KK_MAX_GRAD: emit_reduce(&u, k); break;
    case KK_EMBED_FWD: case KK_EMBED_BWD: emit_embed(&u, k); break;
    case KK_NORM_FWD: case KK_NORM_BWD: emit_norm(&u, k); break;
    case KK_ATTN_FWD: case KK_ATTN_BWD: case KK_ATTN_BWD_KV: emit_attention(&u, k); break;
    case KK_TRANSPOSE: emit_transpose(&u, k); break;
    case KK_POSITIONS: emit_positions(&u, k); break;
    case KK_IM2COL: case KK_COL2IM: case KK_MAXPOOL: case KK_MAXPOOL_GRAD: case KK_AVGPOOL: case KK_AVGPOOL_GRAD:
      emit_window(&u, k);
      break;
    case KK_ATTN_DECODE: emit_attn_decode(&u, k); break;
    case KK_XENT_FWD: case KK_XENT_BWD: case KK_EVAL_METRICS: emit_rows(&u, k); break;
    case KK_UNSCALE: emit_unscale(&u, k); break;
    case KK_SOFTMAX: case KK_SOFTMAX_BWD: emit_softmax(&u, k); break;
    case KK_RMSNORM_FWD: case KK_RMSNORM_BWD: emit_rmsnorm(&u, k); break;
    case KK_ROPE: emit_rope(&u, k); break;
    case KK_MSE: emit_mse(&u, k); break;
    case KK_SUMSQ: emit_sumsq(&u, k); break;
    case KK_CLIP_SCALE: emit_clip_scale(&u, k); break;
    case KK_ADAMW8: emit_adamw8(&u, k); break;
    case KK_GEMM_I8: emit_gemm_i8(&u, k); break;
    default: unreachable();
    }
    bprintf(&u, "}\n\n");
    int f = kfuncs_add(&funcs, u.s);
    if (fn_of) fn_of[i] = f;
  }
  if (n_fns) *n_fns = funcs.n;
  bprintf(&b, "/* generated by duet (codegen/emit_cuda.c): %d kernels, %d functions, CUDA C for NVRTC */\n",
          cp->n_kernels, funcs.n);
  bprintf(&b, "%s", PRELUDE);
  bprintf(&b, "typedef struct { void *p[%d]; } duet_args; /* a kernel's tensors, by value */\n",
          DUET_MAX_KERNEL_ARGS);
  bprintf(&b, "typedef struct { double v[%d]; } duet_scalars; /* the runtime scalars, by value */\n\n",
          DUET_S_COUNT);
  /* the runtime's gradient accumulation over micro-batches (the device's
   * accumulate op): a = b (first) or a += b, one add per element */
  for (int w = 0; w < 2; w++)
    bprintf(&b, "extern \"C\" __global__ void duet_accumulate_%s(%s *a, const %s *b, duet_i64 n, int first) {\n"
                "  for (duet_i64 i = blockIdx.x * (duet_i64)blockDim.x + threadIdx.x; i < n; i += (duet_i64)blockDim.x * gridDim.x)\n"
                "    a[i] = first ? b[i] : a[i] + b[i];\n}\n\n",
            w ? "f64" : "f32", w ? "double" : "float", w ? "double" : "float");
  bool sigmoid = false, fq = false; /* PRELUDE_SIGMOID, PRELUDE_FAKE_QUANT: only where used */
  for (int i = 0; i < cp->n_kernels; i++)
    for (int j = 0; j < cp->kernels[i].n_ins; j++) {
      KOp op = cp->kernels[i].ins[j].op;
      sigmoid |= op == KI_SIGMOID || op == KI_SILU || op == KI_SILU_GRAD;
      fq |= op == KI_FAKE_QUANT;
    }
  if (sigmoid) bprintf(&b, "%s", PRELUDE_SIGMOID);
  if (fq) bprintf(&b, "%s", PRELUDE_FAKE_QUANT);
  bool i8gemm = false;
  for (int i = 0; i < cp->n_kernels; i++) i8gemm |= cp->kernels[i].kind == KK_GEMM_I8;
  if (i8gemm) bprintf(&b, "%s", PRELUDE_DOT4);
  if (half) bprintf(&b, "%s", PRELUDE_HALF);
  if (half2) bprintf(&b, "%s", PRELUDE_HALF2);
  bool q8 = false; /* 8-bit AdamW state: the maps' tables (device memory) and encoder */
  for (int i = 0; i < cp->n_kernels; i++) q8 |= cp->kernels[i].kind == KK_ADAMW8;
  if (q8) codegen_q8_tables(&b, "__device__ const", "__device__ __forceinline__");
  kfuncs_write(&funcs, &b);
  return b.s;
}

DuetLaunch *codegen_cuda_launch_table(const CgProgram *cp, Arena *a) {
  DuetLaunch *l = arena_alloc(a, sizeof *l * (size_t)(cp->n_kernels ? cp->n_kernels : 1));
  for (int i = 0; i < cp->n_kernels; i++) codegen_cuda_launch(&cp->kernels[i], &l[i]);
  return l;
}

void codegen_attach_cuda(CgProgram *cp, Arena *a) {
  int32_t *fn = arena_alloc(a, (size_t)(cp->n_kernels + 1) * sizeof *fn);
  cp->prog.cuda_source = codegen_emit_cuda(cp, a, fn, &cp->prog.cuda_n_fns);
  cp->prog.cuda_fn = fn;
  cp->prog.cuda_launch = codegen_cuda_launch_table(cp, a);
}
