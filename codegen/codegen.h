/* codegen/codegen.h: planned Graph -> kernel IR + runtime program, and the
 * emitters that print the kernel IR as C (and, later, CUDA C). */
#ifndef DUET_CODEGEN_H
#define DUET_CODEGEN_H

#include "../ir/ir.h"
#include "../runtime/duet_rt.h"

/* A growing string in the arena (the emitters' output).  bprintf appends
 * printf-formatted text (NUL-terminated after the first call); it never fails
 * (arena_alloc aborts when memory runs out). */
typedef struct Buf {
  Arena *a;
  char *s;
  size_t n, cap;
} Buf;
void bprintf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Kernel sharing: kernels that differ only in their tensors (the
 * repeated layers of a transformer) are one function.  An emitter prints
 * each kernel as a unit of text that names its tensors by argument
 * position (t[0], t[1], ...) and its function by the placeholder FN; a
 * KernelFuncs collects the distinct units.  kfuncs_add returns the
 * function index of the unit (a new one when no earlier unit is equal;
 * hashed, so n kernels cost O(n) comparisons); kfuncs_write appends every
 * distinct unit to b in order, FN replaced by its index. */
#define FN "@F@"
typedef struct KernelFuncs {
  Arena *a;
  int n, cap;
  const char **text;
  uint64_t *hash;
  int *slot; /* open-addressing table of function indices, -1 free */
  int n_slot;
} KernelFuncs;
int kfuncs_add(KernelFuncs *f, const char *unit);
void kfuncs_write(const KernelFuncs *f, Buf *b);

/* ----------------------------------------------------------- kernel IR */

/* Elementwise kernels are straight-line programs run once per element i of
 * the output, over `n` elements; other kernels are fixed templates with
 * their sizes baked in.  The opcodes are those below, and one per
 * elementwise op of the op table (ir/ops.def's kop column: KI_ADD, KI_SUB,
 * KI_MUL, KI_DIV, KI_NEG, KI_RELU, KI_RELU_GRAD (a: dy, b: x), KI_GELU,
 * KI_GELU_GRAD (a: dy, b: x), KI_DROPOUT (a: x; value: p; b: site),
 * KI_CAST (a: x rounded to DType `value` (f16, bf16), kept as f32), ...),
 * whose instruction operands a (and b) are the op's operands in order. */
typedef enum KOp {
  KI_LOAD,   /* a: buffer */
  KI_CONST,  /* value */
  KI_SCALAR, /* a: index into the runtime scalars (DUET_S_*) */
  KI_SQRT,   /* a */
  KI_STORE,  /* a: buffer, b: instruction */
#define KI(x) KI_##x,
#define NO_KI
#define OP(id, name, n, rule, flags, surface, prec, kop) kop
#include "../ir/ops.def"
#undef OP
#undef NO_KI
#undef KI
  KI_COUNT
} KOp;
/* The op whose opcode k is (ops.def's kop column); -1 for the opcodes of
 * no op (load, const, scalar, sqrt, store). */
int kop_op(KOp k);
/* The instructions k reads (a, then b): 0, 1 or 2 (the op's arity; a
 * store reads its b, counted here as 1; a dropout's b is its site). */
int kop_operands(KOp k);

typedef struct KInstr {
  KOp op;
  int a, b;
  double value;
} KInstr;
#define KMAX_INS 256 /* instructions of one elementwise kernel */

/* Element index of a buffer for output element i:
 *   sum over terms of ((i / div) % mod) * mul
 * (mod = 0 means no modulo).  Broadcast axes contribute no term. */
typedef struct KIndexTerm {
  int64_t div, mod, mul;
} KIndexTerm;

#define KMAX_BUFS 32
typedef struct KBuf {
  int tensor; /* runtime tensor id */
  int64_t base; /* element offset added to every index (slices) */
  DType dtype;
  int n_terms;
  KIndexTerm terms[IR_MAX_RANK];
} KBuf;

typedef enum KernelKind {
  KK_ELEMENTWISE, /* bufs: any; ins: the program */
  KK_REDUCE,      /* bufs: in, out; out[o,j] = scale * sum_r in[o,r,j] (max_r when reduce_max) */
  KK_MAX_GRAD,    /* bufs: dy [o,j], x [o,r,j], dx: dy to the first maximum over r, 0 elsewhere */
  KK_XENT_FWD,    /* bufs: logits [rows,cols], labels [rows], out []: mean NLL */
  KK_XENT_BWD,    /* bufs: logits, labels, dloss [], out [rows,cols] */
  KK_EVAL_METRICS,/* bufs: logits, labels, out [2] = {correct, summed NLL} */
  KK_EMBED_FWD,   /* bufs: table [outer=V, cols], idx [rows], out [rows, cols] */
  KK_EMBED_BWD,   /* bufs: dy [rows, cols], idx [rows], out [V, cols] (scatter-add) */
  KK_NORM_FWD,    /* bufs: x [rows, cols], out: (x - mean) / sqrt(var + eps) per row */
  KK_NORM_BWD,    /* bufs: dy, x, out = dx */
  KK_ATTN_FWD,    /* bufs: q, k, v [batch, time, cols], out */
  KK_ATTN_BWD,    /* bufs: dy, q, k, v, out [3, batch, time, cols] = dq, dk, dv; CUDA: dq and each
                   * query row's softmax statistics (after out: ir_workspace_elems) */
  KK_TRANSPOSE,   /* bufs: in [rows, cols], out [cols, rows] */
  KK_POSITIONS,   /* bufs: out i32 [rows]: s[POS] + 0, 1, ... */
  KK_IM2COL,      /* bufs: x [N,C,H,W], cols [N*OH*OW, C*KH*KW] (xs, ys, win) */
  KK_COL2IM,      /* bufs: dcols, dx (scatter-add, per plane) */
  KK_MAXPOOL,     /* bufs: x, y */
  KK_MAXPOOL_GRAD,/* bufs: dy, x, dx (to the first maximum of each window) */
  KK_AVGPOOL,     /* bufs: x, y (divides by KH*KW, as torch's count_include_pad) */
  KK_AVGPOOL_GRAD,/* bufs: dy, dx */
  KK_ATTN_DECODE, /* bufs: q, k, v [batch, 1, cols], kcache, vcache [batch, time, cols], out */
  KK_UNSCALE,     /* bufs: g (any float), out f32 [n] = g / loss scale; overflow flag `slot`
                   * (int32 t[n_tensors][slot]) = 1 when any element is inf or NaN, else 0 */
  KK_ATTN_BWD_KV, /* after KK_ATTN_BWD, same bufs; CUDA: dk, dv from the statistics, a block
                   * per key row; C: nothing (KK_ATTN_BWD computed them) */
  KK_SOFTMAX,     /* bufs: x, y [outer, red, inner]: softmax over the red axis */
  KK_SOFTMAX_BWD, /* bufs: dy, y, dx = y (dy - sum_r dy y) */
  KK_RMSNORM_FWD, /* bufs: x [rows, cols], out: x / sqrt(mean(x^2) + eps) per row */
  KK_RMSNORM_BWD, /* bufs: dy, x, out = dx */
  KK_ROPE,        /* bufs: x, y [batch, time, cols]: pairs (2i, 2i+1) of each head turned by
                   * (s[POS] + t) base^(-2i/D); inverse: the opposite angle */
  KK_MSE,         /* bufs: pred, target [n], out []: scale * sum (pred - target)^2 */
  KK_SUMSQ,       /* bufs: g (f32 or f64) [n]; sum of g^2 in double, in a fixed order, to the double
                   * at word duet_clip_word(slot) of t[n_tensors] (gradient clipping) */
  KK_CLIP_SCALE,  /* bufs: g [n] *= the double at word duet_clip_word(slot) of t[n_tensors], rounded to
                   * g's dtype first (torch's g.mul_(clip_coef) with an f32 coefficient) */
  KK_ADAMW8,      /* bufs: p f32 [n], g f32 [n], exp_avg and exp_avg_sq codes u8 [n], their scales
                   * f32 [ceil(n / DUET_Q8_BLOCK)]: AdamW with 8-bit block-wise state (runtime/duet_q8.h);
                   * per block: decode, the AdamW step of lower_optimizer in f32, re-quantize */
} KernelKind;

typedef struct Kernel {
  KernelKind kind;
  int index;
  DType dtype; /* float dtype of the kernel */
  int64_t n;   /* KK_ELEMENTWISE: elements */
  int n_bufs;
  KBuf bufs[KMAX_BUFS];
  int n_ins;
  KInstr *ins;
  int64_t outer, red, inner; /* KK_REDUCE */
  double scale;
  bool reduce_max;           /* KK_REDUCE */
  int64_t rows, cols;        /* row kernels: rows of `cols` elements */
  double eps;                /* KK_NORM_* */
  int64_t batch, time, heads;/* KK_ATTN_*, KK_ROPE (heads: of the queries) */
  int64_t kv_heads;          /* KK_ATTN_*: key/value heads (a divisor of heads) */
  bool causal;               /* KK_ATTN_* */
  double base;               /* KK_ROPE */
  bool inverse;              /* KK_ROPE: the gradient (turns the other way) */
  Shape xs, ys;              /* KK_IM2COL .. KK_AVGPOOL_GRAD: [N,C,H,W] and [N,C,OH,OW] */
  int64_t win[8];            /* kh, kw, sh, sw, ph, pw, dh, dw */
  int slot;                  /* KK_UNSCALE: flag; KK_SUMSQ, KK_CLIP_SCALE: word of the double
                              * in the flags buffer (duet_clip_word) */
  bool no_decay;             /* KK_ADAMW8: no weight decay for this param */
} Kernel;

/* A lowered model: the runtime program (tables allocated in the arena) and
 * its kernels. */
typedef struct CgProgram {
  DuetProgram prog;
  int n_kernels;
  Kernel *kernels;
  int *tensor_of; /* value id -> tensor id, -1 if none */
  /* duet compile --checkpoint: the file of the weights to embed in the
   * executable (prog.weights_nbytes bytes; a safetensors file written by
   * duet_checkpoint_embed), NULL: none */
  const char *weights_file;
} CgProgram;

/* Lowers a graph that went through every pass (memplan last).  `cfg` holds
 * the training defaults copied into the program. */
CgProgram *codegen_lower(Graph *g, Arena *a);

/* C source of every kernel: one function `void duet_k<f>(void *const *t,
 * const double *s)` per distinct kernel (t: the kernel's arguments, see
 * DuetProgram.kernel_args), and per kernel i a wrapper duet_i<i>(void
 * *const *t, const double *s) that takes the whole tensor table, picks the
 * arguments and calls its function; `duet_kernel_table` lists the
 * wrappers (n_kernels), `duet_function_count` the functions.  Contains no
 * user text. */
char *codegen_emit_c(const CgProgram *cp, Arena *a);

/* CUDA C source of the kernels for NVRTC: one `extern "C" __global__ void
 * duet_k<f>(duet_args t, const double *s)` per distinct kernel (t.p[j]:
 * argument j, passed by value; s in device memory), each preceded by a
 * comment giving its launch configuration.  fn_of (n_kernels entries, may
 * be NULL) receives each kernel's function index; *n_fns (may be NULL) the
 * number of functions.  Includes no header and no user text. */
char *codegen_emit_cuda(const CgProgram *cp, Arena *a, int32_t *fn_of, int *n_fns);
/* Launch configuration of kernel k (grid-stride kernels cap the grid at
 * 65535 blocks, the sum of a whole tensor at 1024; kernels of a block per
 * row or tile get one block per item up to 2^31 - 1 and loop over the
 * rest; row kernels use blocks of 32..1024 threads, multiples of 32;
 * attention uses dynamic shared memory of time (forward, decode) or
 * 2 * time (backward) elements, saturated at UINT32_MAX bytes). */
void codegen_cuda_launch(const Kernel *k, DuetLaunch *l);
/* codegen_cuda_launch for every kernel, in the arena. */
DuetLaunch *codegen_cuda_launch_table(const CgProgram *cp, Arena *a);
/* Sets the program's CUDA fields (cuda_source, cuda_fn, cuda_n_fns,
 * cuda_launch), in the arena. */
void codegen_attach_cuda(CgProgram *cp, Arena *a);
/* The device functions the CUDA source of a program with 16-bit tensors
 * carries (duet_u16, duet_f16_from_f32, duet_f32_from_f16,
 * duet_bf16_from_f32, duet_f32_from_bf16: runtime/duet_half.h's
 * conversions); it needs the prelude's duet_u32.  Static text, for tests. */
const char *codegen_cuda_half_prelude(void);
/* Whether the CUDA emitter computes elementwise kernel k with paired fp16
 * values in 32-bit words (half2) instead of two f32 lanes, where that is
 * bit-identical to the C kernel (emit_cuda.c, "half2"):
 * CG_HALF2_NONE (f32 lanes), CG_HALF2_BITS (exact bit operations on the
 * pairs: relu, its gradient, negation, copies) or CG_HALF2_ARITH (also
 * f16x2 add/sub/mul, each rounding once). */
enum { CG_HALF2_NONE, CG_HALF2_BITS, CG_HALF2_ARITH };
int codegen_cuda_half2(const Kernel *k);
/* The half2 helpers (duet_h2add, duet_h2sub, duet_h2mul, duet_h2quiet,
 * duet_h2relu, duet_h2relu_grad) printed after codegen_cuda_half_prelude()
 * when a kernel takes the half2 path.  On sm_53 and later but sm_61 the
 * arithmetic is PTX add/sub/mul.rn.f16x2; below and on sm_61 (fp16 at 1/64
 * rate), two f32 lanes rounded once each; on a host compiler
 * (tests/cuda_emu) it calls duet_emu_f16x2(a, b, op), which the includer
 * defines.  Static text, for tests. */
const char *codegen_cuda_half2_prelude(void);

/* The 8-bit AdamW state maps' tables and encoder as source text
 * (emit_c.c), each declaration prefixed by `qual` (tables) or `fqual`
 * (functions); shared by the C and CUDA emitters. */
void codegen_q8_tables(Buf *b, const char *qual, const char *fqual);

/* A whole training executable's C source: the kernels, the program tables
 * (strings written as byte arrays) and main() calling duet_main().  With
 * cp->weights_file: an assembler block that pulls that file into .rodata
 * (`.incbin`, as symbol duet_embedded_weights) and the program's .weights
 * pointing at it, defaults.eval_only set (an evaluation executable). */
void codegen_write_executable_c(const CgProgram *cp, const char *kernel_src, FILE *out);

#endif
