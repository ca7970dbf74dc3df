/* ir/ir.h: the whole interface of the IR layer (arena, diagnostics, the typed
 * SSA graph, shape rules, verifier, printer).  ir/ uses nothing else of duet;
 * frontend/, passes/ and codegen/ use only this header from here. */
#ifndef DUET_IR_H
#define DUET_IR_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------------- arena */

/* All IR objects of one compilation live in one arena, freed once
 * (QBE freeall(), ggml_free()).  arena_alloc returns zeroed memory aligned to
 * 16 bytes; it aborts with a message when malloc fails (out of host memory
 * while compiling is not recoverable). */
typedef struct Arena Arena;
Arena *arena_new(size_t chunk_bytes);
void *arena_alloc(Arena *a, size_t bytes);
char *arena_strdup(Arena *a, const char *s);
char *arena_printf(Arena *a, const char *fmt, ...);
void arena_free(Arena *a);

/* Internal invariant violated: a bug in duet, not in the user's model. */
#define DUET_ASSERT(c) \
  ((c) ? (void)0 : duet_fatal(__FILE__, __LINE__, "assertion failed: %s", #c))
#define unreachable() duet_fatal(__FILE__, __LINE__, "unreachable")
_Noreturn void duet_fatal(const char *file, int line, const char *fmt, ...);

/* ------------------------------------------------------------ name maps */

/* A hash map from NUL-terminated names to pointers (open addressing over
 * FNV-1a hashes; expected O(1) per operation).  Keys are not copied: they
 * must live as long as the map (arena strings do).  Zero-initialise it; its
 * tables come from the arena given to namemap_slot. */
typedef struct NameMap {
  const char **key;
  void **val;
  size_t cap, used;
} NameMap;
/* The value slot of `key`, inserted holding NULL when absent. */
void **namemap_slot(Arena *a, NameMap *m, const char *key);
/* The value of `key`; NULL when absent. */
void *namemap_get(const NameMap *m, const char *key);

/* ----------------------------------------------------- byte range sets */

/* A set of disjoint byte ranges [off, off + size) of one memory region,
 * ordered by offset (a treap with deterministic priorities: O(log n)
 * expected per operation), that also finds the lowest gap holding a given
 * size.  The memory plan allocates with it (first fit) and the verifier
 * checks with it that values live at the same time share no byte.
 * Zero-initialise it and set `arena`; nodes come from there and are reused
 * after removal. */
typedef struct RangeNode RangeNode;
typedef struct RangeSet {
  Arena *arena;
  RangeNode *root, *spare;
  uint64_t rng; /* priority stream */
} RangeSet;
/* Adds [off, off + size), size >= 1, tagged `tag` (the caller's id); it
 * must not overlap a range of the set (an internal error otherwise). */
void rangeset_insert(RangeSet *s, int64_t off, int64_t size, int tag);
/* Removes the range that starts at `off` (it must be in the set). */
void rangeset_remove(RangeSet *s, int64_t off);
/* The tag of a range of the set that shares a byte with [off, off + size)
 * (size >= 1), its bounds in *o_off and *o_size; -1 when none does. */
int rangeset_overlap(const RangeSet *s, int64_t off, int64_t size, int64_t *o_off, int64_t *o_size);
/* The lowest offset >= 0 where `size` bytes fit between the ranges of the
 * set (first fit), or the end of the last range when no gap holds them. */
int64_t rangeset_first_fit(const RangeSet *s, int64_t size);

/* ---------------------------------------------------------- diagnostics */

typedef struct Source {
  const char *name; /* path as given by the user */
  const char *text; /* whole file, NUL-terminated, BOM removed */
  size_t len;       /* bytes */
} Source;

/* A source location: 1-based line, 1-based byte column within the line.
 * The printer converts the byte column to characters (UTF-8 code points). */
typedef struct Loc {
  const Source *src;
  int line, col;
} Loc;

/* User diagnostics channel.  diag_error prints
 *   file:line:col: error: message
 *     source line
 *     ^
 * to `out`, counts it, then longjmps to `*jmp` when set (the compile entry
 * point owns recovery, like Lua's luaD_throw) and returns otherwise. */
typedef struct Diag {
  FILE *out;
  jmp_buf *jmp;
  int n_errors, n_warnings;
} Diag;
void diag_error(Diag *d, Loc loc, const char *fmt, ...);
void diag_warning(Diag *d, Loc loc, const char *fmt, ...);
void diag_note(Diag *d, Loc loc, const char *fmt, ...);
void diag_vreport(Diag *d, Loc loc, const char *kind, const char *fmt, va_list ap);
/* An error with no location (a bad file, a bad flag): "duet: error: ...". */
void diag_error_noloc(Diag *d, const char *fmt, ...);
/* Edit distance of a and b for "did you mean" hints: insertions, deletions,
 * substitutions and swaps of two neighbours (optimal string alignment, so
 * `f23` is one edit from `f32`); 99 when either is longer than 64 bytes. */
int ir_edit_distance(const char *a, const char *b);
/* Character (code point) column of byte column `col` on line `line`. */
int source_char_col(const Source *s, int line, int col);

/* -------------------------------------------------------- types, shapes */

/* DT_F16: IEEE 754 binary16; DT_BF16: bfloat16 (the top half of a binary32).
 * Both are storage types: kernels widen them to f32 to compute.  DT_U8:
 * unsigned bytes, only the codes of 8-bit optimizer state (AdamW with
 * `state = int8`: runtime/duet_q8.h), never a model's tensor.  DT_I8:
 * signed bytes, only the int8 weights of a quantized program (the quantize
 * pass, passes/quantize.c), read by its dequantize ops. */
typedef enum DType { DT_VOID, DT_F32, DT_F64, DT_I32, DT_F16, DT_BF16, DT_U8, DT_I8, DT_COUNT } DType;
const char *dtype_name(DType t);         /* "f32" ... */
size_t dtype_size(DType t);              /* bytes per element */
bool dtype_is_float(DType t);
int dtype_from_name(const char *name);   /* -1 when unknown */

#define IR_MAX_RANK 8
typedef struct Shape {
  int rank;
  int64_t dim[IR_MAX_RANK];
} Shape;
/* Element count; -1 when it overflows int64 (the caller reports it). */
int64_t shape_numel(const Shape *s);
bool shape_eq(const Shape *a, const Shape *b);
/* "[256,784]" into buf (at least 160 bytes); returns buf. */
char *shape_str(const Shape *s, char *buf, size_t n);
/* numpy broadcasting of a and b into out; false when incompatible. */
bool shape_broadcast(const Shape *a, const Shape *b, Shape *out);

/* ------------------------------------------------------------------ ops */

typedef enum ShapeRule {
  SHAPE_ATTR,      /* shape given by attr.shape, dtype by attr.dtype */
  SHAPE_VIEW,      /* shape given by attr.shape, float dtype of the inputs
                    * (copies, windows, their gradients) */
  SHAPE_SCALAR,    /* rank 0 */
  SHAPE_PAIR,      /* [2] */
  SHAPE_SAME,      /* same as in[0] */
  SHAPE_BROADCAST, /* numpy broadcast of in[0], in[1] */
  SHAPE_MATMUL,    /* [M,K]@[K,N] with attr.trans_a/trans_b */
  SHAPE_VOID,      /* no result (side effect) */
  SHAPE_EMBED,     /* table [V,C] gathered by idx [...] -> [..., C] */
  SHAPE_TRANSPOSE, /* [m,n] -> [n,m] */
  SHAPE_POSITIONS, /* idx [..., T] -> i32 [T] */
  SHAPE_CAST,      /* shape of in[0], dtype attr.dtype (a float dtype) */
  SHAPE_NONE,      /* no result; float operands of any shapes (a collective) */
  SHAPE_MATMUL_I8, /* f32 x [..., K] by i8 q [K,N] ([N,K]: attr.trans_b), f32 scales, f32 [1]: f32 [..., N] */
  SHAPE_DEQUANT,   /* i8 in[0] times f32 scales in[1] broadcast to in[0]'s shape: f32 of in[0]'s shape */
} ShapeRule;

enum { OPF_EW = 1, OPF_SIDE = 2 };
typedef enum OpKind {
#define OP(id, name, n, rule, flags, surface, prec, kop) OP_##id,
#include "ops.def"
#undef OP
  OP_COUNT
} OpKind;

/* An op's precision class in 16-bit programs (ops.def's prec column; the
 * precision pass applies it). */
typedef enum OpPrec {
  PREC_KEEP,   /* left as it is: inputs, params, state, constants, casts */
  PREC_LOW,    /* 16-bit operands, f32 accumulation, 16-bit result (GEMMs) */
  PREC_FOLLOW, /* computes in f32, stores the widest dtype of its activation operands */
  PREC_F32,    /* reads f32 operands and gives f32 (reductions, norms, softmax, losses) */
  PREC_UPDATE, /* an optimizer update */
  PREC_AFTER_UPDATE, /* after the optimizer updates, on f32 master weights (prune masks) */
} OpPrec;

typedef struct OpInfo {
  const char *name;
  int arity; /* -1: variadic */
  ShapeRule rule;
  int flags;
  const char *surface; /* the .model built-in taking `arity` positional tensors; NULL: none */
  OpPrec prec;
} OpInfo;
extern const OpInfo op_info[OP_COUNT];
int op_from_name(const char *name); /* -1 when unknown */

/* Parameter initialisers; fan_in/fan_out of a rank-2 [in, out] weight are
 * dim[0] and dim[1] (duet multiplies x @ w, PyTorch stores w as [out, in]). */
typedef enum InitKind {
  INIT_ZEROS, INIT_ONES, INIT_NORMAL, INIT_UNIFORM,
  INIT_KAIMING_UNIFORM, INIT_XAVIER_UNIFORM, INIT_COUNT
} InitKind;
const char *init_name(InitKind k);

/* A fused elementwise chain (OP_FUSED): a tiny SSA program whose operands
 * are either the fused op's inputs (FI_INPUT) or earlier instructions. */
typedef struct FusedInstr {
  OpKind op;    /* an OPF_EW op, or OP_COUNT for "load input" */
  int a, b;     /* operand instruction indices; for a load: input index */
  double value; /* OP_CONST: the literal; OP_DROPOUT: p */
  int64_t site; /* OP_DROPOUT; OP_CAST: the target DType */
} FusedInstr;
/* Bounds on one fused op, so every fused loop fits the kernel IR (at most
 * KMAX_BUFS buffers, 256 instructions per kernel): longer chains are split. */
#define FUSE_MAX_INPUTS 24
#define FUSE_MAX_INSTRS 160
typedef struct FusedProg {
  int n;
  FusedInstr *ins; /* the last one is the result */
} FusedProg;

/* Attributes; each field says which ops use it. */
typedef struct Attr {
  DType dtype;      /* INPUT, PARAM, STATE, CONST, FUSED: result dtype */
  const char *name; /* INPUT, PARAM, STATE: tensor name (hierarchical) */
  Shape shape;      /* INPUT, PARAM, STATE, BROADCAST, SUM_TO, FUSED */
  double value;     /* CONST: the literal */
  InitKind init;    /* PARAM: initialiser; STATE: zeros, or ones (a pruning mask) */
  double init_a, init_b; /* PARAM: normal(std=a) or uniform(a, b) */
  bool trans_a, trans_b; /* MATMUL: use A^T / B^T (operands viewed as 2-D:
                          * leading axes merged into rows) */
  int64_t heads;    /* ATTENTION, ATTENTION_GRAD, ATTENTION_DECODE, ROPE, ROPE_GRAD: number of (query) heads */
  int64_t kv_heads; /* ATTENTION, ATTENTION_GRAD, ATTENTION_DECODE: key/value heads, a divisor of
                     * heads (grouped-query attention); 0: as many as heads */
  double base;      /* ROPE, ROPE_GRAD: the rotary base (position p turns pair i by p base^(-2i/D)) */
  bool causal;      /* ATTENTION, ATTENTION_GRAD: mask future positions */
  int64_t index;    /* SLICE: index along axis 0 */
  double eps;       /* NORM, NORM_GRAD: added to the variance; RMS_NORM, RMS_NORM_GRAD: to the mean square */
  bool no_decay;    /* ADAMW, SGD: this param gets no weight decay */
  bool kv_cache;    /* STATE: a key/value cache of decoding (not checkpointed) */
  double p;         /* DROPOUT: probability of zeroing an element */
  int axis;         /* SLICE, SLICE_GRAD, CONCAT, SOFTMAX, SOFTMAX_GRAD: the axis (SLICE: index = start); PRUNE_MASK:
                     * the weight's output-channel axis, 0 or its last (the other axes are its
                     * inputs, the GEMM's reduction dimension), -1 when it is no matmul or
                     * convolution weight */
  bool squeeze;     /* SLICE: the sliced axis (length 1) is dropped */
  int perm[IR_MAX_RANK]; /* PERMUTE: output axis d is input axis perm[d] */
  int64_t kh, kw, sh, sw, ph, pw, dh, dw; /* IM2COL, COL2IM, pools: window, stride, padding, dilation */
  Shape in_shape;   /* SLICE_GRAD, COL2IM, pool grads: shape of the forward input */
  int64_t site;     /* DROPOUT: which dropout of the model (decorrelates masks) */
  FusedProg *prog;  /* FUSED */
  int slot;         /* UNSCALE: index of its overflow flag (param order) */
  int bucket;       /* ALLREDUCE: the bucket's index (0, 1, ... in graph order) */
  int64_t bytes;    /* ALLREDUCE, REDUCE_SCATTER: the bytes of its gradients */
  bool sharded;     /* ADAMW, SGD (--zero 1): only replica `shard` runs this update and keeps its state */
  int shard;
} Attr;

typedef enum Role { ROLE_FORWARD, ROLE_BACKWARD, ROLE_OPTIMIZER, ROLE_EVAL } Role;

/* Memory regions assigned by the memplan pass.  Params and optimizer state
 * persist across steps; MEM_CACHE holds the key/value caches of decoding and
 * a stage's copies of params received from another stage
 * (ir_param_transfer); everything else lives in the activation arena, whose
 * offsets are reused between values with disjoint lifetimes. */
typedef enum MemRegion { MEM_NONE, MEM_PARAM, MEM_STATE, MEM_ARENA, MEM_CACHE, MEM_COUNT } MemRegion;

typedef struct Value Value;
struct Value {
  int id;       /* %id; dense, in topological order */
  OpKind op;
  DType dtype;
  Shape shape;
  Value **in;   /* inputs, n_in of them */
  int n_in;
  Attr attr;
  Loc loc;      /* for diagnostics */
  Role role;
  int device;   /* -1 until a partition pass assigns one */
  Loc device_loc; /* the @device(N) hint that set device, for diagnostics (line 0: none) */
  int block;    /* elaboration: the outermost block instance that computed this value (1, 2, ...
                 * in call order; a `repeat` iteration is an instance), 0 at top level, for
                 * params, inputs and state, and for values later passes add; a recomputed
                 * copy keeps its original's (passes/recompute.c).  Printed `@block(N)` */
  bool requires_grad; /* set by autodiff */
  /* Filled by passes/: */
  int n_uses;   /* in the whole graph */
  Value *grad;  /* PARAM: its gradient, after autodiff */
  MemRegion region; /* memplan: where the value lives */
  int64_t offset;   /* memplan: byte offset in its region */
};

/* ---------------------------------------------------- training settings */

typedef enum OptimKind { OPTIM_ADAMW, OPTIM_SGD } OptimKind;
/* 8-bit AdamW state: values per quantization block, each with its own f32
 * scale (Dettmers et al. 2021; runtime/duet_q8.h's DUET_Q8_BLOCK, which
 * codegen checks it equals). */
#define IR_Q8_BLOCK 2048
typedef enum DataKind { DATA_NONE, DATA_FASHION_MNIST, DATA_TEXT, DATA_NPY, DATA_TOKENS } DataKind;
/* Learning-rate schedules (numbering shared with the runtime's DUET_LR_*;
 * formulas at duet_lr_at in runtime/duet_rt.h). */
typedef enum LrSchedule { LR_CONSTANT, LR_COSINE, LR_LINEAR } LrSchedule;

/* The `train { }` section, after defaults.  Sources of defaults: PyTorch's
 * torch.optim.AdamW (betas 0.9, 0.999, eps 1e-8, weight_decay 0.01) and
 * torch.optim.SGD (momentum 0, weight_decay 0). */
typedef struct TrainSpec {
  DataKind data;
  const char *data_path;  /* npy: the x file */
  const char *data_y;     /* npy: the y file */
  const char *val_x, *val_y; /* npy: validation files (NULL: none, or val_fraction) */
  double val_fraction;    /* npy: the last fraction of the samples validates (0: none) */
  OptimKind optimizer;
  double lr, weight_decay, beta1, beta2, eps, momentum;
  int64_t batch;
  int64_t epochs, steps; /* steps > 0 overrides epochs */
  uint64_t seed;
  int64_t log_every;
  bool eval;             /* evaluate on the test split after each epoch */
  int64_t block;         /* text: tokens per window */
  int64_t eval_every;    /* text: validation every N steps (0: at the end) */
  int64_t eval_batches;  /* text: fixed validation batches */
  bool decay_matrices_only; /* weight decay only on params of rank >= 2 */
  bool has_lr, has_weight_decay; /* set explicitly in the section */
  const char *precision; /* `precision = "fp16"` etc.; NULL: auto (the command line wins) */
  const char *recompute; /* `recompute = "blocks"` etc.; NULL: none (the command line wins) */
  int64_t micro_batches; /* pipeline: the batch is split into this many micro-batches
                          * (`batch` is then one micro-batch; gradients accumulate) */
  LrSchedule lr_schedule; /* `lr_schedule = cosine(warmup = N, min_lr = X)` */
  int64_t warmup;        /* warm-up steps (0: none) */
  double min_lr;         /* cosine, linear: the rate the decay ends at */
  double clip_grad_norm; /* `clip_grad_norm = X`: global L2 norm limit (0: none) */
  const char *offload;   /* `offload = "optimizer"` or "none"; NULL: none (the command line's --offload wins);
                          * optimizer: state and master params on the host (runtime/offload.c) */
  bool state_int8;       /* AdamW `state = int8`: its moments in 8-bit block-wise quantized codes
                          * (runtime/duet_q8.h) instead of f32; --optimizer-state overrides it */
} TrainSpec;
void train_spec_defaults(TrainSpec *t);
/* The train spec asks for optimizer offload (`offload = "optimizer"`, or
 * --offload optimizer written into it by the CLI). */
bool train_offload(const TrainSpec *t);

/* ---------------------------------------------------------------- graph */

/* Magnitude pruning (passes/prune.c): the `prune { }` section of the
 * model, overridden field by field by the --prune flags (PruneSpec.set). */
typedef enum PruneMode { PRUNE_NONE, PRUNE_UNSTRUCTURED, PRUNE_GLOBAL, PRUNE_NM, PRUNE_CHANNELS } PruneMode;
enum { /* PruneSpec.set: the fields given */
  PRUNE_SET_SPARSITY = 1, PRUNE_SET_MODE = 2, PRUNE_SET_START = 4, PRUNE_SET_END = 8, PRUNE_SET_EVERY = 16,
  PRUNE_SET_PARAMS = 32, PRUNE_SET_INITIAL = 64
};
typedef struct PruneSpec {
  PruneMode mode;     /* PRUNE_NONE: no pruning */
  double sparsity;    /* final sparsity s_f, in [0, 1); PRUNE_NM: (M - N) / M */
  double initial;     /* initial sparsity s_i of the gradual schedule, in [0, sparsity] */
  int nm_n, nm_m;     /* PRUNE_NM: keep nm_n of every nm_m weights (2:4) */
  int64_t start;      /* masks are first computed after `start` optimizer steps */
  int64_t end;        /* ... and last after `end` (end == start: one-shot) */
  int64_t every;      /* ... every `every` steps in between (Zhu & Gupta's delta t) */
  const char *params; /* which params: comma-separated globs, `!glob` excludes; NULL: the
                       * weights of matmuls and convolutions (not biases, norms, embeddings) */
  unsigned set;       /* PRUNE_SET_* of the fields given (the others take the defaults) */
  Loc loc;            /* the model's `prune` section (line 0: none, or from an IR dump) */
} PruneSpec;

/* Reads a pruning mode: "unstructured", "global", "channels" or "N:M" with
 * 1 <= N < M <= 64 (2:4).  0, or -1 when it is none of these. */
int prune_mode_parse(const char *s, PruneMode *mode, int *n, int *m);
/* The mode as prune_mode_parse reads it ("unstructured", "2:4"); returns buf
 * (at least 32 bytes). */
char *prune_mode_str(const PruneSpec *p, char *buf, size_t len);

/* Default pruning frequency (Zhu & Gupta's delta t; TensorFlow Model
 * Optimization's PolynomialDecay frequency). */
#define PRUNE_DEFAULT_EVERY 100
/* Completes a requested spec (mode != PRUNE_NONE) with the defaults of the
 * fields not given (start 0, end = start: one-shot, every
 * PRUNE_DEFAULT_EVERY, initial 0; N:M: sparsity (M - N) / M) and checks it:
 * sparsity given (but for N:M) and in [0, 1), initial in [0, sparsity],
 * 0 <= start <= end, every >= 1; N:M one-shot (end == start) with the
 * sparsity of its pattern.  Sets every PRUNE_SET_* bit.  0, or -1 with a
 * one-line message in err. */
int prune_spec_resolve(PruneSpec *p, char *err, size_t errlen);

/* One block call, recorded by the frontend for `duet check`'s summary. */
typedef struct LayerInfo {
  const char *name; /* the call's parameter prefix without the final dot: "layer1.linear2" */
  int depth;        /* nesting: 0 for calls at the top level */
  Shape out;        /* shape of the (first) result */
  DType dtype;
} LayerInfo;

/* At most this many pipeline stages (devices) per graph. */
#define IR_MAX_STAGES 64
/* At most this many data-parallel replicas (--data-parallel). */
#define IR_MAX_REPLICAS 64

typedef struct Graph {
  Arena *arena;
  LayerInfo *layers; /* block calls in order of completion (inner first) */
  int n_layers, cap_layers;
  Diag *diag;
  const char *model_name;
  Value **values; /* in topological order */
  int n_values, cap_values;
  Value *loss;    /* the scalar named `loss`; NULL when absent */
  Value *logits;  /* the first input of the loss's cross_entropy */
  Value *labels;
  TrainSpec train;
  int64_t region_bytes[MEM_COUNT]; /* memplan: bytes per region (stage 0's when partitioned) */
  int n_stages;      /* partition: number of stages (devices); 0 or 1: one device */
  int64_t stage_bytes[IR_MAX_STAGES][MEM_COUNT]; /* memplan: bytes per region and stage */
  DType float_dtype; /* dtype of params and float inputs (f32; f64 in tests) */
  bool decode;       /* compiled for one-token-at-a-time generation */
  int64_t context;   /* decode: positions the key/value caches hold */
  const char *after_pass; /* the last pass run on it (NULL: none); printed as
                           * `after NAME`, so a dump knows where to resume */
  int replicas;      /* data parallelism: replicas of the model (0 or 1: none);
                      * train.micro_batches counts all replicas' micro-batches,
                      * replica r computing micro-batches r*M .. r*M+M-1,
                      * M = micro_batches / replicas; printed `replicas N` */
  double bucket_mb;  /* data_parallel: the --bucket-mb its all-reduce buckets were
                      * made for (0: the default, 25 MiB); printed `bucket_mb X` */
  PruneSpec prune;   /* the `prune { }` section; after the prune pass, as applied */
  int qat;           /* the `quantize { weights = int8  mode = qat }` section: 1 per output channel,
                      * 2 per tensor (passes.h's QUANT_INT8_*), 0: none; the qat pass applies it */
  Loc qat_loc;
  int64_t calibrate; /* --calibrate N (the quantize pass): int8 activations calibrated on N training
                      * batches (DuetConfig.calibrate); 0: none.  Not printed in dumps */
  int zero;          /* --zero 1: optimizer state sharded over the replicas (ZeRO
                      * stage 1; needs replicas > 1); printed `zero 1` */
  struct ShrinkAxis *shrink; /* the shrink pass (--shrink): the shrunk axes of params, n_shrink
                      * of them; printed as `shrink ...` lines */
  int n_shrink;
} Graph;

/* One axis of a param that the shrink pass (passes/shrink.c) shrank: the
 * param `param` (by name) has `full` elements along `axis` in a checkpoint
 * and keeps, of them, the groups of `group` consecutive indices of the
 * output channels that channels pruning keeps in the weight `source` (its
 * own output axis is the entry whose param is the source): kept channel c
 * of the source keeps indices c*group .. c*group + group - 1. */
enum { SHRINK_OWN, SHRINK_BIAS, SHRINK_NEXT };
typedef struct ShrinkAxis {
  const char *param, *source;
  int axis;
  int64_t full, group;
  int kind;              /* SHRINK_OWN: the source's output axis; SHRINK_BIAS: its bias
                          * (one value per channel); SHRINK_NEXT: the next layer's weight's
                          * input axis */
  /* SHRINK_NEXT: what a removed channel feeds the next layer.  Its value
   * there is the constant acts(bias) (its weights are 0), the same at
   * every position when fold (no zero padding on the way): the runtime
   * adds its contribution to next_bias (NULL: none), or requires it 0. */
  int next_out;          /* the next weight's output axis */
  const char *next_bias; /* the next layer's bias param */
  const char *acts;      /* the activations between, in order ("relu", "gelu tanh", ""; ops.def names) */
  bool fold;
} ShrinkAxis;

/* The operands of an adamw_update: 4 (param, grad, exp_avg, exp_avg_sq:
 * states of the param's dtype and shape) or, with 8-bit state, 6 (param
 * f32, grad f32, the exp_avg and exp_avg_sq codes: u8 states of the
 * param's element count, their absmax scales: f32 states [ceil(n /
 * IR_Q8_BLOCK)]).  NULL when they are, else what is wrong. */
const char *ir_adamw_operands_error(Value *const *in, int n);

/* Elements of v's dtype that the memory plan reserves after v's own for its
 * kernels' scratch: attention backward keeps each query row's softmax max,
 * 1 / sum and sum(p * dp) for the CUDA key-row kernel (3 x batch x heads x
 * time); 0 for every other op. */
int64_t ir_workspace_elems(const Value *v);

/* At most this many values per graph (graph_add reports more as a user error). */
#define GRAPH_MAX_VALUES (1 << 18)

/* The key/value heads of an attention op: attr.kv_heads, or attr.heads when
 * 0 (every query head has its own). */
int64_t ir_kv_heads(const Attr *a);

Graph *graph_new(Arena *a, Diag *d);
/* Appends a value, infers its shape and dtype from the op table's rule
 * (reporting shape errors at `loc` through g->diag), and returns it.  `in` is
 * copied. */
Value *graph_add(Graph *g, OpKind op, Value **in, int n_in, const Attr *attr, Loc loc);
/* Reassigns dense ids in array order after a pass reorders or removes values. */
void graph_renumber(Graph *g);
/* Recomputes n_uses over the whole graph. */
void graph_count_uses(Graph *g);
/* Whether g is an evaluation program: a loss and params but no value of
 * the backward or optimizer role, as graph_drop_training (passes/evalonly.c)
 * leaves it.  A training graph always has them (autodiff gives every param
 * a gradient, the optimizer pass an update); a graph without a loss or
 * params, or a decoding program, is not one. */
bool graph_is_eval_program(const Graph *g);
/* A transfer sent once per step, not once per micro-batch: a param's value
 * in the forward pass (a weight used on two stages, such as a tied
 * embedding).  With micro-batches its copy on the receiving stage persists
 * across the step's micro-batches (memplan puts it in MEM_CACHE, not in
 * the per-micro-batch activation arena). */
bool ir_param_transfer(const Value *v);
/* A tied weight's gradient (passes/partition.c, tie_grads): an add of the
 * optimizer role whose two parts are each summed over the micro-batches
 * (and replicas) first; ir_tied_part(operand) is the part itself, through
 * the optimizer-role transfer that brings a part from another stage. */
bool ir_tied_add(const Value *v);
const Value *ir_tied_part(const Value *x);
/* Applies the op's shape rule to v (dtype and shape); reports errors. */
void ir_infer_shape(Graph *g, Value *v);

/* Checks SSA form, operand order, arities, dtypes and shapes against the op
 * rules, and in a planned graph (values with memory regions) that values
 * live at the same time share no byte (ir_check_memory).  Violations are
 * internal errors: prints them naming `after_pass` and returns the count
 * (0 = ok). */
int ir_verify(const Graph *g, const char *after_pass, FILE *err);

/* The all-reduce buckets of data parallelism (passes/data_parallel.c): only
 * in a graph of several replicas; each operand the gradient an optimizer
 * update reads (its in[1]), in exactly one bucket, the bucket before that
 * update and after every other op that reads the gradient (the sum
 * replaces it in place); buckets numbered 0, 1, ... in graph order, `bytes`
 * the bytes of their gradients; and once there is a bucket, every such
 * gradient in one.  With `zero 1` (--zero 1) the buckets are
 * `reduce_scatter` ops (an `allreduce` is then an error, and the reverse
 * without it) whose operands are grouped by the shard of their update,
 * every update has a shard of the replicas, and each `all_gather`'s
 * operands are params updated before it.
 * Returns 0 (also for a graph without buckets), or 1 with the first
 * violation's value in *bad and a message ("%5 is not the gradient an
 * optimizer update reads") in msg.  ir_verify and ir_parse check it. */
int ir_check_allreduce(const Graph *g, const Value **bad, char *msg, size_t n);

/* A memory-plan conflict: two values live at the same time that share
 * bytes of one region of one device. */
typedef struct MemConflict {
  const Value *a, *b; /* a is live when b is placed (a first in the check's order) */
  int a_last;         /* the position of a's last use; -1: a is never freed
                       * (inputs, the loss, eval metrics, params, state, caches) */
} MemConflict;
/* Checks the memory plan of a graph whose values have regions (after
 * memplan, or a dump of it): no two values live at the same time share a
 * byte of a region of a device.  Liveness is memplan's: a value from its
 * definition to its last use in graph order; inputs from the start of the
 * step and, like the loss and the eval metrics, to its end; params, state
 * and caches always.  A value occupies dtype size x (elements + workspace)
 * bytes from its offset.  Sweeps the values in order with a RangeSet per
 * region and device: O(n log n).  Returns 0 (also for an unplanned graph),
 * or 1 with the first conflict found in *c. */
int ir_check_memory(const Graph *g, MemConflict *c);
/* One line describing c: "%5: 64 bytes at @arena+0 overlap %3 (64 bytes at
 * @arena+0), which is still live (its last use is %6)"; returns buf. */
char *ir_memconflict_str(const Graph *g, const MemConflict *c, char *buf, size_t n);

/* Text form (docs/ir.md): a header (`model`, `after`, the `train { }`
 * section, `regions`), one value a line
 *   %3 = matmul %0, %1 : f32[256,1024]  @backward  @arena+1024
 * and trailing `loss`, `logits`, `labels` and `grad` lines.  ir_parse reads
 * it back: print(parse(print(g))) == print(g). */
void ir_print(const Graph *g, FILE *out);
/* One value line (without the header), as ir_print writes it. */
void ir_print_value(const Graph *g, const Value *v, FILE *out);

/* Parses the text form written by ir_print into a new graph in `a`.  Every
 * value is shape-checked as it is added (graph_add) and its declared type
 * compared with the inferred one; errors are reported through `d` as
 * `file:line:col: error: ...` with the source line and a caret, and NULL is
 * returned (d->jmp is used internally and restored).  g->after_pass is the
 * `after` line's pass name (not checked against the pass list; NULL when the
 * file has none). */
Graph *ir_parse(Arena *a, Diag *d, const Source *src);

/* Graphviz: a node per value (op and key attributes), an edge per use labelled
 * with the operand's dtype and shape; params, optimizer state and inputs as
 * distinct shapes and colours, one cluster per device when devices are set. */
void ir_print_dot(const Graph *g, FILE *out);
/* The graph as one JSON object: model, pass, train settings, regions, the
 * loss/logits/labels ids and an array of values (id, op, inputs, dtype,
 * shape, attrs, role, block (when in one), device, region, offset).  Returns 0, or -1 when out of
 * memory. */
int ir_print_json(const Graph *g, FILE *out);

/* Shortest decimal text that strtod reads back as exactly x ("0.1", "1e-05",
 * "inf", "-0"); buf of at least 32 bytes.  Returns buf. */
char *ir_num_str(double x, char *buf, size_t n);
/* "forward", "backward", "optimizer", "eval"; "none", "param", "state",
 * "arena", "cache". */
const char *role_name(Role r);
const char *mem_region_name(MemRegion r);

#endif
