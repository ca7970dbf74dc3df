/* runtime/duet_rt.h: the whole interface of the duet runtime.
 *
 * The runtime knows nothing of the compiler: a compiled model reaches it as a
 * DuetProgram (plain tables: tensors, steps, defaults) plus an array of
 * kernel entry points.  `duet run` builds both in memory; a training
 * executable written by `duet compile` holds them as static data.  Both call
 * duet_main(), so the two paths print the same losses for the same seed. */
#ifndef DUET_RT_H
#define DUET_RT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define DUET_RT_API_VERSION 16 /* 3: data parallelism; 4: DuetProgram.prune; 5: DuetProgram.source_hash;
                                * 6: DuetProgram.zero (ZeRO stage 1); 7: DuetConfig's npy fields, DUET_DATA_TOKENS,
                                * DuetProgram.vocab; 8: DuetConfig lr schedule, clipping; DuetProgram clipping;
                                * 9: DuetConfig eval_only, checkpoint_path, keep, keep_best;
                                * 10: DuetConfig.metrics_timing; 11: DuetConfig.offload;
                                * 12: DuetProgram.weights (embedded weights); 13: DuetConfig.calibrate;
                                * 14: DuetProgram.shrink; 15: DuetConfig.init_path;
                                * 16: DuetProgram.eval_program (evaluation programs) */
#define DUET_MAX_RANK 8

/* Element types (numbering shared with the compiler's DType).  DUET_F16 is
 * IEEE binary16, DUET_BF16 bfloat16 (2 bytes each; runtime/duet_half.h);
 * DUET_U8 bytes: the codes of 8-bit optimizer state (runtime/duet_q8.h);
 * DUET_I8 signed bytes: the int8 weights of a quantized program
 * (duet_quantize_i8). */
enum { DUET_VOID = 0, DUET_F32 = 1, DUET_F64 = 2, DUET_I32 = 3, DUET_F16 = 4, DUET_BF16 = 5, DUET_U8 = 6, DUET_I8 = 7 };

/* Where a tensor lives. */
/* DUET_MEM_CACHE: key/value caches of a decoding program, and a pipeline
 * stage's copies of params sent once per step by another stage (persistent,
 * not checkpointed, zeroed at session start). */
enum { DUET_MEM_NONE = 0, DUET_MEM_PARAM = 1, DUET_MEM_STATE = 2, DUET_MEM_ARENA = 3, DUET_MEM_CACHE = 4,
       DUET_MEM_COUNT = 5 };

/* Initialisers (numbering shared with the compiler's InitKind).  Formulas,
 * with fan_in = shape[0] and fan_out = shape[1] of an [in, out] matrix
 * (fan_in = shape[0], fan_out = 1 for vectors; for an [out, in, kh, kw]
 * convolution weight fan_in = in*kh*kw and fan_out = out*kh*kw, as torch):
 *   kaiming_uniform: U(-b, b), b = sqrt(6 / fan_in)  (He et al. 2015; torch's
 *                    kaiming_uniform_ with a = 0, i.e. gain sqrt(2))
 *   xavier_uniform:  U(-b, b), b = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010)
 *   normal(std), uniform(a, b), zeros, ones. */
enum { DUET_INIT_ZEROS, DUET_INIT_ONES, DUET_INIT_NORMAL, DUET_INIT_UNIFORM,
       DUET_INIT_KAIMING_UNIFORM, DUET_INIT_XAVIER_UNIFORM };

typedef struct DuetTensor {
  const char *name; /* hierarchical parameter name, or "%id" for activations */
  int region;       /* DUET_MEM_* */
  int dtype;        /* DUET_F32 ... */
  int rank;
  int64_t shape[DUET_MAX_RANK];
  int64_t offset;   /* bytes from the region's base */
  int64_t nbytes;
  int init;         /* params: DUET_INIT_*; state: zeros, or DUET_INIT_ONES (pruning masks) */
  double init_a, init_b;
  int stage;        /* pipeline: the stage (device) it lives on; 0 with one device */
  int is_grad;      /* pipeline: a param's gradient, summed over the micro-batches */
} DuetTensor;

/* One step of a schedule: a generated kernel, or a GEMM through the
 * device's BLAS: C[m,n] = op(A) @ op(B) with row-major operands, op(X) = X^T
 * when the trans flag is set (cblas_sgemm semantics, alpha 1, beta 0). */
/* Pipelines add DUET_STEP_SEND (a: transfer index; the sending stage copies
 * the source tensor out) and DUET_STEP_RECV (a: transfer index; the
 * receiving stage waits for it and copies it into the destination tensor);
 * b = 1 on both: a param sent once per training step, on the first
 * micro-batch only (its copy persists in DUET_MEM_CACHE; a tied weight).
 * b = 2 on a SEND, RECV or KERNEL step of a stage's optimizer schedule: a
 * tied weight's gradient, made of its parts once they are summed over the
 * micro-batches and replicas, before clipping, offload and the updates
 * (the runtime runs these steps first, apart from the others).
 * Data parallelism adds DUET_STEP_ALLREDUCE (a: bucket index, in a stage's
 * backward schedule after the bucket's last gradient: on a replica's last
 * micro-batch its gradients are final there and the bucket starts its sum
 * over the replicas; see DuetProgram.bucket_off).  ZeRO stage 1
 * (DuetProgram.zero) makes that step a reduce-scatter and adds
 * DUET_STEP_ALLGATHER (a: bucket index, in a stage's optimizer schedule
 * after the updates of the bucket's params: each replica's updated params
 * copied to every other; DuetProgram.bucket_params). */
enum { DUET_STEP_KERNEL = 0, DUET_STEP_GEMM = 1, DUET_STEP_SEND = 2, DUET_STEP_RECV = 3, DUET_STEP_ALLREDUCE = 4,
       DUET_STEP_ALLGATHER = 5 };
typedef struct DuetStep {
  int kind;
  int kernel;           /* DUET_STEP_KERNEL: index into the kernel table */
  int ta, tb;           /* DUET_STEP_GEMM */
  int64_t m, n, k;
  int a, b, c;          /* tensor ids */
  int dtype;
} DuetStep;

/* Runtime scalars passed to every kernel (double s[DUET_S_COUNT]). */
enum {
  DUET_S_LR, DUET_S_WEIGHT_DECAY, DUET_S_BETA1, DUET_S_BETA2, DUET_S_EPS, DUET_S_MOMENTUM,
  DUET_S_STEP_SIZE,   /* AdamW: lr / (1 - beta1^t) */
  DUET_S_BC2_SQRT,    /* AdamW: sqrt(1 - beta2^t) */
  DUET_S_N_VALID,     /* eval: rows of the batch that hold real samples */
  DUET_S_ONE_MINUS_BETA1, DUET_S_ONE_MINUS_BETA2, /* computed in double, as PyTorch */
  DUET_S_DECAY,       /* 1 - lr * weight_decay */
  DUET_S_POS,         /* decoding: position of the current token (0 when training) */
  DUET_S_TRAINING,    /* 1 in a training or gradient step (dropout active), 0 in evaluation */
  DUET_S_DROP_SEED,   /* dropout masks of this step: a hash of the seed and the step */
  DUET_S_LOSS_SCALE,  /* dynamic loss scaling: the gradient seed S (1 without scaling) */
  DUET_S_INV_LOSS_SCALE, /* 1 / S, applied by the unscale kernels */
  DUET_S_COUNT
};

typedef void (*DuetKernelFn)(void *const *t, const double *s);

enum { DUET_DATA_NONE = 0, DUET_DATA_FASHION_MNIST = 1, DUET_DATA_TEXT = 2, DUET_DATA_NPY = 3, DUET_DATA_TOKENS = 4 };
enum { DUET_OPTIM_ADAMW = 0, DUET_OPTIM_SGD = 1 };

/* The most threads --threads may ask for (a larger value is an error, not
 * silently lowered). */
#define DUET_MAX_THREADS 1024
/* --threads N: *out = N for an integer 1..DUET_MAX_THREADS; else prints
 * "duet: error: --threads expects an integer from 1 to 1024, got 'X'" to
 * stderr and returns 1 (duet run, compiled executables and the commands
 * that plan all parse it here). */
int duet_parse_threads(const char *val, int *out);
/* --data-parallel N: an integer 1..DUET_MAX_DEVICES, else "duet: error:
 * --data-parallel expects an integer from 1 to 64 (replicas), got 'X'";
 * --bucket-mb X: a number > 0 and at most 1e9, else "duet: error:
 * --bucket-mb expects a number of MiB > 0 (and at most 1e9), got 'X'".
 * Printed to stderr, returning 1 (duet run, compiled executables and the
 * compiling commands all parse them here). */
int duet_parse_data_parallel(const char *val, int64_t *out);
int duet_parse_bucket_mb(const char *val, double *out);
/* --zero S: 0 (no sharding) or 1 (ZeRO stage 1: optimizer state sharded
 * over the data-parallel replicas) into *out, else "duet: error: --zero
 * expects 0 or 1 (ZeRO stage 1: optimizer state sharded over the
 * replicas), got 'X'" on stderr, returning 1. */
int duet_parse_zero(const char *val, int *out);

/* Training settings: the program's defaults (from the train section),
 * overridden by command-line flags. */
typedef struct DuetConfig {
  int data;
  const char *data_path;   /* the directory (fashion_mnist), the file (text), the x file (npy) */
  const char *data_y;      /* npy: the y file */
  const char *val_x, *val_y; /* npy: validation files (NULL: none, or val_fraction) */
  double val_fraction;     /* npy: the last fraction of the samples validates (0: none) */
  int optimizer;
  double lr, weight_decay, beta1, beta2, eps, momentum;
  int64_t batch, epochs, steps, log_every;
  uint64_t seed;
  int eval;
  int threads;             /* 0: all cores; at most DUET_MAX_THREADS */
  const char *metrics_path;
  int64_t train_subset, test_subset; /* 0: whole split */
  int quiet;
  int64_t block;           /* text: tokens per window */
  int64_t eval_every;      /* text: validation loss every N steps (0: at the end) */
  int64_t eval_batches;    /* text: fixed validation batches */
  const char *save_path;   /* checkpoint written every save_every steps and at the end */
  int64_t save_every;      /* 0: only at the end */
  const char *resume_path; /* checkpoint to continue from */
  double loss_scale;       /* fp16: initial loss scale (0: 65536 = 2^16, GradScaler's init_scale) */
  double min_loss_scale;   /* fp16: training stops when the scale falls below this (0: 1) */
  const char *devices;     /* --devices SPEC (NULL: one CPU device) */
  int schedule;            /* DUET_SCHEDULE_*: pipeline schedule */
  int64_t micro_batches;   /* --micro-batches M (0: the program's) */
  double timeout;          /* pipeline: seconds a stage waits for a transfer (0: default) */
  int64_t data_parallel;   /* --data-parallel N (0: the program's; compile-time) */
  double bucket_mb;        /* --bucket-mb X (0: the program's; compile-time) */
  int zero;                /* 1 + the ZeRO stage of --zero (0: not given, the program's; compile-time) */
  int lr_schedule;         /* DUET_LR_*: --lr-schedule (duet_lr_at) */
  int64_t warmup;          /* --warmup N: steps of linear warm-up (0: none) */
  double min_lr;           /* --min-lr X: where cosine and linear decay end */
  double clip_grad_norm;   /* --clip-grad-norm X: global L2 norm limit (0: no clipping) */
  int eval_only;           /* --eval-only: evaluate checkpoint_path's params, train nothing */
  const char *checkpoint_path; /* --checkpoint CK: the checkpoint --eval-only evaluates */
  int64_t keep;            /* --keep N: keep the last N checkpoints (PATH, PATH.step-S, ...; 0: PATH only) */
  int keep_best;           /* --keep-best: PATH.best holds the checkpoint of the best evaluation */
  int metrics_timing;      /* --metrics-timing: step lines carry samples_per_s / tokens_per_s
                            * (off by default: the metrics of two runs then compare byte for byte) */
  int offload;             /* 1 + DUET_OFFLOAD_* of --offload (0: not given; a program's default: 0 or
                            * 1 + DUET_OFFLOAD_OPTIMIZER when compiled with it; runtime/offload.c) */
  int64_t calibrate;       /* --calibrate N (compile-time, with --quantize): int8 activations, their
                            * scales calibrated on the first N training batches (duet_calibrate); 0: none */
  const char *init_path;   /* --init-from CK: a new run (step 0, fresh optimizer state and data order)
                            * starting from CK's params (fine-tuning; duet_checkpoint_load_weights) */
} DuetConfig;

/* --offload: none (the default), or optimizer (ZeRO-Offload: each stage's
 * optimizer state and an f32 master copy of its params live in host
 * memory, and its update runs on the host with the C kernels;
 * runtime/offload.c).  duet_parse_offload sets *out = 1 + DUET_OFFLOAD_*,
 * else prints "duet: error: --offload expects none or optimizer (...), got
 * 'X'" and returns 1. */
enum { DUET_OFFLOAD_NONE = 0, DUET_OFFLOAD_OPTIMIZER = 1 };
int duet_parse_offload(const char *val, int *out);
/* Why --offload optimizer cannot run with a program of `replicas`
 * data-parallel replicas (> 1: refused), pruning (pruned != 0) or a
 * decoding program (decode != 0): the one-line message (the compiler and
 * the runtime print the same), or NULL when it can. */
const char *duet_offload_refusal(int replicas, int pruned, int decode);
/* --eval-only with a flag that only training reads (--steps, --epochs,
 * --offload): prints "duet: error: --eval-only trains nothing: FLAG ..."
 * (what it would do, what to give instead) on stderr and returns 1.  Used
 * where the flag is seen as given (duet_parse_flags; duet run, which reads
 * --offload itself), since DuetConfig holds the program's defaults too. */
int duet_eval_only_refuse(const char *flag);

/* Learning-rate schedules.  With base rate lr (--lr), W warm-up steps, T
 * steps in the run and k = step - 1 (0 for the first optimizer step), the
 * rate of a step is
 *   k < W (warm-up, all kinds):  lr * (k + 1) / W             (llm.c, train_gpt2.cu)
 *   constant:                    lr
 *   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * (k - W) / (T - W))) / 2
 *             (llm.c; nanoGPT's get_lr; torch CosineAnnealingLR with T_max = T - W:
 *             the last step is one step short of min_lr)
 *   linear:   min_lr + (lr - min_lr) * (T - 1 - k) / (T - 1 - W)
 *             (the last step, k = T - 1, runs at min_lr exactly; torch LinearLR with
 *             end_factor min_lr / lr, total_iters T - 1 - W; HF's
 *             get_linear_schedule_with_warmup reaches its floor one step later;
 *             the fraction is 0 when T - 1 == W)
 * in double.  T <= 0 (unknown): the rate after the warm-up is lr.  The
 * value is a function of the step only, so a resumed run computes the same
 * bits. */
enum { DUET_LR_CONSTANT = 0, DUET_LR_COSINE = 1, DUET_LR_LINEAR = 2 };
double duet_lr_at(const DuetConfig *c, int64_t step, int64_t total);
/* "constant", "cosine", "linear" (NULL for another value). */
const char *duet_lr_schedule_name(int kind);
/* --lr-schedule NAME: *out = DUET_LR_*; else prints "duet: error:
 * --lr-schedule expects constant, cosine or linear, got 'X'" and returns 1. */
int duet_parse_lr_schedule(const char *val, int *out);
/* The schedule of cfg for a run of `total` steps: -1 with the message
 * ("the warm-up (--warmup 200) is longer than the run (100 steps)",
 * "--min-lr 0.01 is above the learning rate 0.001 (--lr)") when it cannot
 * run, else 0. */
int duet_lr_schedule_check(const DuetConfig *cfg, int64_t total, char *err, size_t errlen);
/* The schedule in words, for the start-up line and checkpoints: "constant",
 * "constant, warmup 100", "cosine to 1e-05 after warmup 100 over 1000 steps". */
void duet_lr_schedule_str(const DuetConfig *cfg, int64_t total, char *buf, size_t n);

/* Pipeline schedules: GPipe fill-drain (all forwards, then all backwards;
 * Huang et al. 2019) and 1F1B (one forward, one backward; at most S - s
 * micro-batches in flight on stage s; Narayanan et al., PipeDream-Flush 2021). */
enum { DUET_SCHEDULE_GPIPE = 0, DUET_SCHEDULE_1F1B = 1 };

/* Pipelines: one tensor copied from one stage to another per micro-batch
 * (an activation forward, a gradient backward). */
typedef struct DuetTransfer {
  int src, dst;       /* tensor ids on the sending and the receiving stage */
  int from, to;       /* stages */
  int64_t nbytes;
} DuetTransfer;

/* Pipelines: the schedules of one stage, each in topological order:
 * forward of one micro-batch, backward of one micro-batch, the optimizer
 * update (once per step, after the gradients of all micro-batches are
 * summed), evaluation (forward + metrics of one micro-batch). */
typedef struct DuetStage {
  int n_fwd, n_bwd, n_opt, n_eval;
  const DuetStep *fwd, *bwd, *opt, *eval;
  int64_t region_bytes[DUET_MEM_COUNT]; /* activation region: one micro-batch */
} DuetStage;

/* Launch configuration of one generated CUDA kernel (1-D grid and block;
 * `shared`: bytes of dynamic shared memory), produced by the CUDA emitter
 * next to the source. */
typedef struct DuetLaunch {
  uint32_t grid, block, shared;
} DuetLaunch;

/* Magnitude pruning (passes/prune.c makes the table, runtime/prune.c
 * chooses the masks).  Each pruned param is a matrix of out_n output
 * channels by in_n inputs: element o * out_stride + i * in_stride.  Its
 * mask (a state tensor of its dtype: 1 keeps, 0 prunes) is applied after
 * every optimizer step by a generated kernel that zeroes the param and its
 * optimizer state where the mask is 0; the runtime recomputes the masks
 * at the schedule's steps. */
enum { DUET_PRUNE_UNSTRUCTURED = 1, DUET_PRUNE_GLOBAL = 2, DUET_PRUNE_NM = 3, DUET_PRUNE_CHANNELS = 4 };
typedef struct DuetPruneParam {
  int param, mask;            /* tensor ids */
  int state[2];               /* its optimizer state tensors (-1: none; 8-bit AdamW: the u8 codes), zeroed with it */
  int64_t out_n, out_stride;  /* output channels (channels mode) */
  int64_t in_n, in_stride;    /* inputs: N:M groups are nm_m consecutive inputs of one channel */
} DuetPruneParam;
typedef struct DuetPrune {
  int mode;                   /* DUET_PRUNE_* */
  int nm_n, nm_m;             /* DUET_PRUNE_NM: keep nm_n of every nm_m (2:4) */
  double initial, final;      /* sparsities s_i and s_f of the schedule (duet_prune_target) */
  int64_t start, end, every;  /* masks are computed after `start` steps, every `every` steps up to `end` */
  int n_params;
  const DuetPruneParam *params;
} DuetPrune;

/* Channels pruning's zero channels removed (passes/shrink.c, --shrink): axis
 * `axis` of param tensor `param` is shorter than in a checkpoint, where it
 * has `full` elements; it keeps the groups of `group` consecutive indices
 * c*group .. c*group + group - 1 of the output channels c that channels
 * pruning kept in the weight tensor `source` (its own entry, param ==
 * source, names its output axis).  runtime/shrink.c gathers them when a
 * checkpoint is loaded or exported. */
enum { DUET_SHRINK_OWN, DUET_SHRINK_BIAS, DUET_SHRINK_NEXT };
typedef struct DuetShrinkAxis {
  int param, axis;
  int64_t full, group;
  int source;
  int kind;       /* DUET_SHRINK_OWN: the source's output axis; _BIAS: its bias (one value per
                   * channel); _NEXT: the input axis of the next layer's weight */
  /* _NEXT: a removed channel c feeds the next layer the constant
   * acts(bias[c]) ("relu", "gelu tanh", ...: ops applied in order; 0 without
   * a bias), the same at every position when fold: the runtime adds
   * its products with the channel's rows of the weight to the param
   * next_bias (-1: none), or, where it cannot, refuses a nonzero one. */
  int next_out;   /* the output axis of the next weight */
  int next_bias;
  const char *acts;
  int fold;
} DuetShrinkAxis;
typedef struct DuetShrink {
  double sparsity; /* the --prune S it was compiled for: each source keeps full - round(S x full) channels */
  int n;
  const DuetShrinkAxis *axes;
} DuetShrink;

typedef struct DuetProgram {
  int api_version;
  const char *model_name;
  int n_tensors;
  const DuetTensor *tensors;
  int n_kernels;
  int n_train, n_eval, n_grad;
  const DuetStep *train; /* forward, backward, optimizer */
  const DuetStep *eval;  /* forward, metrics */
  const DuetStep *grad;  /* forward, backward (gradient tests) */
  int input_x, input_y;  /* tensor ids of the data inputs, -1 if none */
  int loss, metrics;     /* tensor ids, -1 if none */
  int logits;            /* tensor id of the evaluated cross_entropy's logits, -1 if none */
  int decode;            /* compiled for generation: inputs hold one token, attention uses caches */
  int64_t context;       /* decode: positions the caches hold */
  int n_classes;         /* logits' second dimension, 0 if no classifier */
  int vocab;             /* rows of the smallest embedding table a data input indexes, 0 if none
                          * (tokens data: every id must be below it and below n_classes) */
  int64_t region_bytes[DUET_MEM_COUNT];
  int64_t gemm_flops;    /* per training step, 2*m*n*k summed */
  int gemm_accumulate_f16; /* --gemm-accumulate fp16: fp16 GEMMs accumulate in fp16 (CUDA only:
                            * CUBLAS_COMPUTE_16F); 0: fp32 accumulation, the default */
  DuetConfig defaults;
  /* Dynamic loss scaling (fp16): n_unscale overflow flags (int32, device
   * memory the session allocates and passes as t[n_tensors]), one per param
   * gradient, named by unscale_names; the train schedule's steps from
   * update_from on are the optimizer updates, skipped when a flag is set.
   * n_unscale 0: no loss scaling (update_from -1). */
  int n_unscale;
  const char *const *unscale_names;
  int update_from;
  /* Pipelines (n_stages >= 1; 0: a plain one-device program).  Tensor shapes
   * are those of one micro-batch; defaults.batch is the whole batch,
   * micro_batches times the tensors' batch. */
  int n_stages;
  const DuetStage *stages;
  int n_transfers;
  const DuetTransfer *transfers;
  int micro_batches;
  /* CUDA: the kernels as CUDA C (codegen/emit_cuda.c; entry points
   * duet_k<i>) and their launch configurations, n_kernels of them; NULL
   * when the program was built without them (the CPU is used then). */
  const char *cuda_source;
  const DuetLaunch *cuda_launch;
  /* Kernel arguments: kernel i takes kernel_args[kernel_arg_off[i] ..
   * kernel_arg_off[i + 1]) (at most DUET_MAX_KERNEL_ARGS), each a tensor id,
   * or n_tensors + j for overflow flag j (fp16 loss scaling).  Kernels
   * that differ only in their arguments share one generated function: the
   * CUDA kernel i is function cuda_fn[i] of cuda_n_fns (entry point
   * duet_k<f>; NULL with cuda_source). */
  const int32_t *kernel_arg_off;
  const int32_t *kernel_args;
  const int32_t *cuda_fn;
  int cuda_n_fns;
  /* Data parallelism (replicas > 1; a pipelined program): `replicas`
   * copies of the stages, each on its own devices, replica r computing
   * micro-batches r*M .. r*M+M-1 of micro_batches = replicas x M in all.
   * Bucket b (b < n_buckets) is the gradient tensors
   * bucket_tensors[bucket_off[b] .. bucket_off[b + 1]), all of one stage,
   * summed over the replicas in replica order at its DUET_STEP_ALLREDUCE;
   * every is_grad tensor is in exactly one bucket.  bucket_mb: the
   * --bucket-mb the buckets were made for (0: the default, 25). */
  int replicas;
  int n_buckets;
  const int32_t *bucket_off;
  const int32_t *bucket_tensors;
  double bucket_mb;
  /* Pruning (NULL: none): the pruned params, their masks and the schedule. */
  const DuetPrune *prune;
  /* 64-bit FNV-1a of the generated C kernels (0: not known); the ranks of
   * an MPI run compare it with the rest of the program (runtime/dist.c).
   * Appended: no other member moves. */
  uint64_t source_hash;
  /* ZeRO stage 1 (zero = 1; replicas > 1; passes/data_parallel.c): the
   * optimizer state is sharded over the replicas by whole tensors.
   * tensor_shard[i] (n_tensors entries) is the replica whose optimizer
   * update reads or writes tensor i (its param, gradient and state), -1
   * for tensors of no sharded update.  Replica r allocates only the state
   * tensors of shard r (the memory plan places them together, shard by
   * shard), runs only the optimizer kernels whose tensors are all of
   * shard r or of none, and receives, at bucket b's DUET_STEP_ALLREDUCE
   * (a reduce-scatter), the replicas' sums of the gradients of shard r
   * (each bucket's gradients are grouped by shard, shard 0 first).  At
   * bucket b's DUET_STEP_ALLGATHER the params bucket_params[bucket_off[b]
   * .. bucket_off[b + 1]) (the param of each of the bucket's gradients,
   * same order) are copied from their shard's replica to every other.
   * Appended: no other member moves. */
  int zero;
  const int32_t *tensor_shard;
  const int32_t *bucket_params;
  /* Gradient clipping by global norm (compiled with clip_grad_norm; n_clip
   * 0: none).  For gradient j < n_clip (tensor clip_grad[j], the one the
   * optimizer reads, on its stage), kernel clip_sumsq[j] writes the sum of
   * its squares (a double, accumulated in double in a fixed order) at
   * int32 word duet_clip_word(p, j) of the flags buffer t[n_tensors], and
   * kernel clip_scale[j] multiplies it in place by the double at word
   * duet_clip_word(p, n_clip) (the clip coefficient the runtime writes).
   * They are in no schedule: the runtime launches them after the
   * gradients are final and before the update (train from step clip_from;
   * a pipeline stage's opt list) when DuetConfig.clip_grad_norm > 0. */
  int n_clip;
  const int32_t *clip_grad, *clip_sumsq, *clip_scale;
  int clip_from;
  /* Embedded weights (duet compile --checkpoint CK; NULL: none): a
   * safetensors file of weights_nbytes bytes in the executable's read-only
   * data, holding the params of the program as a checkpoint of it would
   * (int8 weights and their scales already quantized, for a program of
   * --quantize), with the metadata a weights-only load checks.  A program
   * with them evaluates (defaults.eval_only) these weights unless given
   * --checkpoint.  Appended: no other member moves. */
  const unsigned char *weights;
  int64_t weights_nbytes;
  /* --shrink (NULL: none): the params whose axes the shrink pass shortened.
   * Appended: no other member moves. */
  const DuetShrink *shrink;
  /* An evaluation program (passes/evalonly.c: duet run --eval-only, duet
   * compile --checkpoint, --quantize, --shrink): no backward graph, no
   * optimizer, no optimizer state or pruning masks; the train schedule is
   * the forward pass alone.  It evaluates params (--eval-only) and cannot
   * train: the runtime refuses a training run of it.  Appended: no other
   * member moves. */
  int eval_program;
} DuetProgram;

/* How messages name a program's embedded weights (DuetProgram.weights). */
#define DUET_EMBEDDED_WEIGHTS "embedded weights"

/* The flags buffer (t[n_tensors]): n_unscale int32 overflow flags, then,
 * from an even word (8-byte aligned), n_clip doubles of clipping partial
 * sums and the clip coefficient.  Word of double j, and the buffer's size
 * in int32 words. */
static inline int duet_clip_word(const DuetProgram *p, int j) { return ((p->n_unscale + 1) & ~1) + 2 * j; }
static inline int duet_flag_words(const DuetProgram *p) {
  return p->n_clip > 0 ? duet_clip_word(p, p->n_clip + 1) : p->n_unscale;
}

#define DUET_MAX_KERNEL_ARGS 40

/* Kernel k's arguments picked from the tensor table t into a[0..): t[id]
 * for a tensor id, (int32_t *)t[n_tensors] + j for overflow flag j (see
 * DuetProgram.kernel_args).  Returns their number (at most
 * DUET_MAX_KERNEL_ARGS).  For launchers that pass arguments, not the table
 * (the CUDA plugin, the CUDA emulator of the tests). */
static inline int duet_kernel_argv(const int32_t *arg_off, const int32_t *args, int n_tensors, int k, void *const *t,
                                   void **a) {
  int n = 0;
  for (int j = arg_off[k]; j < arg_off[k + 1]; j++, n++)
    a[n] = args[j] < n_tensors ? t[args[j]] : (void *)((int32_t *)t[n_tensors] + (args[j] - n_tensors));
  return n;
}

/* -------------------------------------------------------------- devices */

/* A device is reached only through this table (ggml's backend interface).
 * Every function returns 0 on success or -1 after writing a message into
 * dev->err.  Members are only ever appended, never reordered: a change of
 * the layout bumps DUET_CUDA_PLUGIN_API (below), so a plugin built against
 * another layout is refused when it is loaded. */
typedef struct DuetDevice DuetDevice;

/* How copy_peer moves a tensor from one device's memory to another's (the
 * answer of peer_path; pipelines print it for every pair of stages):
 *   DUET_PEER_NONE         no direct copy: the caller stages through host
 *                          memory (copy_to_host, then copy_to_device)
 *   DUET_PEER_HOST_MEMORY  both devices' memory is host memory (virtual CPU
 *                          devices): one memcpy between the two arenas
 *   DUET_PEER_SAME_GPU     two devices on one GPU (cuda:0,cuda:0: one
 *                          context, separate streams and arenas): a
 *                          device-to-device copy
 *   DUET_PEER_P2P          two GPUs with peer access: a peer-to-peer copy
 *                          over NVLink or PCIe, no host memory involved */
enum { DUET_PEER_NONE = 0, DUET_PEER_HOST_MEMORY = 1, DUET_PEER_SAME_GPU = 2, DUET_PEER_P2P = 3 };

typedef struct DuetDeviceOps {
  int api_version;
  const char *name;
  void *(*alloc)(DuetDevice *d, size_t bytes);   /* zeroed, 64-byte aligned */
  void (*free)(DuetDevice *d, void *p);
  int (*copy_to_device)(DuetDevice *d, void *dst, const void *src, size_t bytes);
  int (*copy_to_host)(DuetDevice *d, void *dst, const void *src, size_t bytes);
  int (*launch)(DuetDevice *d, int kernel, void *const *t, const double *s);
  int (*gemm)(DuetDevice *d, const DuetStep *st, void *const *t);
  int (*sync)(DuetDevice *d);
  void (*destroy)(DuetDevice *d);
  int (*allreduce)(DuetDevice *d, void *buf, size_t n, int dtype); /* optional: NULL */
  /* Optional (NULL: no direct copies; the caller stages through the host).
   * peer_path says whether and how copy_peer can copy from src_dev's memory
   * to dst_dev's; both devices must use this ops table (src_dev == dst_dev
   * is allowed: a copy within one device).  It returns a DUET_PEER_* kind
   * (DUET_PEER_NONE: no direct copy between these two), or -1 with a
   * message in src_dev->err; it may set the path up (CUDA: enables peer
   * access between the two GPUs once), so it is called before any
   * copy_peer between the pair, from one thread at a time. */
  int (*peer_path)(DuetDevice *src_dev, DuetDevice *dst_dev);
  /* Optional, with peer_path: copies `bytes` from src (memory of src_dev)
   * to dst (memory of dst_dev), ordered after the work already submitted
   * to src_dev and complete when it returns (dst_dev may read dst at
   * once).  Only for pairs whose peer_path is not DUET_PEER_NONE.  0, or -1
   * with a message in src_dev->err. */
  int (*copy_peer)(DuetDevice *src_dev, void *dst, DuetDevice *dst_dev, const void *src, size_t bytes);
  /* Optional (NULL: the caller uses malloc): `bytes` of zeroed host memory
   * that this backend copies to and from fastest, for staging transfers
   * (CUDA: page-locked, portable to every context; cuMemHostAlloc).  NULL
   * with a message in d->err.  host_free (non-NULL with host_alloc)
   * releases it; NULL p is ignored. */
  void *(*host_alloc)(DuetDevice *d, size_t bytes);
  void (*host_free)(DuetDevice *d, void *p);
  /* Optional (NULL: the caller sums on the host): in d's memory, dst[k] =
   * src[k] (first) or dst[k] += src[k], k < n, for n elements of dtype
   * DUET_F32 or DUET_F64; each element one add, so the order of the calls
   * is the order of the sums.  Ordered after the work submitted to d.  0,
   * or -1 with a message in d->err.  (Gradient accumulation over
   * micro-batches, kept on the device.) */
  int (*accumulate)(DuetDevice *d, void *dst, const void *src, int64_t n, int dtype, int first);
} DuetDeviceOps;

struct DuetDevice {
  const DuetDeviceOps *ops;
  void *ctx;
  char err[512];
};

/* The CPU device: kernels are the given function pointers (n of them), GEMMs
 * go through CBLAS (OpenBLAS).  `threads` sets the one OpenMP pool shared by
 * kernels and OpenBLAS (0 = keep the default).  NULL when out of memory. */
DuetDevice *duet_cpu_device(const DuetKernelFn *kernels, int n, int threads);

/* Device specs (`--devices`): comma-separated items `cpu` (= cpu:0),
 * `cpu:N`, `cuda:N`, and, for planning only, capacities `SIZE:sm_NN` or
 * `KxSIZE:sm_NN` (K devices; SIZE an integer or decimal with B, KB, MB, GB,
 * KiB, MiB, GiB or TiB, e.g. `2x16GiB:sm_60`). */
enum { DUET_DEV_CPU = 0, DUET_DEV_CUDA = 1, DUET_DEV_PLANNED = 2 };
#define DUET_MAX_DEVICES 64
typedef struct DuetDeviceSpec {
  int kind;         /* DUET_DEV_* */
  int index;        /* cpu:N, cuda:N: N */
  int sm;           /* planned: compute capability x 10 (sm_60: 60) */
  int64_t capacity; /* planned: bytes */
  char name[64];    /* the item as written (one of K: "16GiB:sm_60") */
} DuetDeviceSpec;
/* Parses spec into out[0..*n) (at most max).  0, or -1 with a message in err
 * naming the bad item. */
int duet_devices_parse(const char *spec, DuetDeviceSpec *out, int max, int *n, char *err, size_t errlen);
/* Opens a device of a parsed spec to run program p: the CPU device over
 * `kernels` (p->n_kernels of them; threads as duet_cpu_device) or a GPU
 * through duet_cuda_device (verbose: its one line about the card).  NULL
 * with a message in err (no CPU kernels, CUDA errors, planned capacities). */
DuetDevice *duet_device_open(const DuetDeviceSpec *d, const DuetProgram *p, const DuetKernelFn *kernels, int threads,
                             int verbose, char *err, size_t errlen);
/* --data-parallel R over the device list spec (NULL: R virtual CPU
 * devices, which is fine): the list must split into R equal consecutive
 * groups, one per replica, of the same kinds stage by stage (planned
 * capacities: the same size and sm); *per_group receives the group's size.
 * 0, or -1 with the message ("--data-parallel 3 does not divide the 4
 * devices of --devices ... into equal groups ...", "--data-parallel 2:
 * replica 1's stage 0 is on cuda:0, replica 0's on cpu:0; ..."). */
int duet_devices_groups(const char *spec, int replicas, int *per_group, char *err, size_t errlen);
/* 1 when spec parses and names only CUDA devices (the C kernels are then
 * not needed), else 0. */
int duet_devices_all_cuda(const char *spec);
/* Whether the devices of spec (NULL: the CPU) can be opened, without opening
 * them: a CUDA item needs the CUDA driver and plugin to load and its GPU to
 * exist (duet_cuda_gpu_count); a planned capacity is refused.  The messages
 * are duet_device_open's.  0, or -1 with a message in err. */
int duet_devices_check(const char *spec, char *err, size_t errlen);
/* duet_devices_check of cfg->devices, and what else about the devices needs
 * neither kernels nor a device: --gemm-accumulate fp16 (in p) asks only
 * CUDA devices (duet_gemm_acc_check for each item, default cpu), and a
 * pipelined program's environment parses (duet_pipe_env: DUET_PIPE_TIMEOUT,
 * DUET_PIPE_STAGING, ...).  0, or -1 with the message the later failure
 * would give. */
int duet_devices_preflight(const DuetProgram *p, const DuetConfig *cfg, char *err, size_t errlen);
/* -1 with the message when p asks for fp16 GEMM accumulation
 * (--gemm-accumulate fp16) of a device whose backend ("cpu", "cuda") is
 * not CUDA, else 0. */
int duet_gemm_acc_check(const DuetProgram *p, const char *backend, char *err, size_t errlen);
/* The host memory a CPU device may plan to use, in bytes: DUET_HOST_MEMORY
 * when set (a size: 8GiB, 512MiB, 1.5GB, bytes; anything else is an error),
 * else MemAvailable from /proc/meminfo (free pages with sysconf where the
 * kernel has no MemAvailable), lowered to the lowest cgroup memory limit
 * that applies (v2 memory.max, v1 memory.limit_in_bytes, from the mounted
 * root to the process's own cgroup).  `from` names the figure used
 * ("MemAvailable in /proc/meminfo", "the cgroup limit in /sys/fs/...",
 * "DUET_HOST_MEMORY").  0, or -1 with a message in err. */
int duet_host_memory(int64_t *bytes, char *from, size_t fromlen, char *err, size_t errlen);
/* A memory size as --devices capacities and --device-memory take it:
 * bytes ("1000000"), or a number with B, KB, MB, GB, TB (powers of 10) or
 * KiB, MiB, GiB, TiB (powers of 2), "16G"/"500M" read as GiB/MiB.  The
 * bytes, or -1 when malformed or not > 0. */
int64_t duet_parse_size(const char *s);
/* GPU `index`'s free and total memory in bytes (cuMemGetInfo through the
 * CUDA plugin) and compute capability x 10 (60 = sm_60): the default
 * --device-memory of a cuda:N device.  0, or -1 with a message (no plugin,
 * no driver, no such GPU). */
int duet_cuda_meminfo(int index, int64_t *free_b, int64_t *total_b, int *sm, char *err, size_t errlen);

/* ------------------------------------------------------------- sessions */

/* A program loaded on a device: regions allocated (sizes from the planner)
 * and the tensor pointer table built.  Params are initialised with
 * config->seed. */
typedef struct DuetSession DuetSession;
DuetSession *duet_session_new(const DuetProgram *p, DuetDevice *dev, const DuetConfig *cfg,
                              char *err, size_t errlen);
/* A pipelined program (p->n_stages >= 1: compiled with --devices or
 * --micro-batches) on the devices of cfg->devices, one worker thread each
 * (see runtime/pipeline.h); the session's tensors, runs and checkpoints
 * work as for one device: inputs take the whole batch, the loss is the mean
 * over the micro-batches.  NULL with a message in err. */
DuetSession *duet_session_new_pipeline(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg,
                                       char *err, size_t errlen);
void duet_session_free(DuetSession *s);
/* A pipelined session: how transfers move between each ordered pair of
 * stages ("stage 0 -> 1 copied between arenas (CPU), stage 1 -> 0 ...";
 * see duet_pipe_transfers in runtime/pipeline.h for the wording); "" when
 * no tensor crosses a stage; NULL for a session of one device.  Lives as
 * long as s. */
const char *duet_session_transfers(const DuetSession *s);
/* The bytes the session allocated on each device: its regions (params,
 * optimizer state, activations once per micro-batch in flight, caches)
 * and gradient accumulators, as `duet plan` totals them per device (not
 * the few bytes of overflow flags, nor host staging).  bytes[i] for device
 * i (replica r's stage k at r * S + k); returns their number (<= max). */
int duet_session_allocated(const DuetSession *s, int64_t *bytes, int max);
/* "duet: allocated: N bytes (a + b on the 2 devices) ..." to out. */
void duet_session_print_allocated(const DuetSession *s, FILE *out);
/* A data-parallel session: how the replicas' gradients are summed, the
 * words after "summed " on the start-up line ("in replica order over
 * shared memory", "by NCCL 2.26.5 (...) in its ring order ...": see
 * duet_pipe_collective in runtime/pipeline.h); NULL without replicas.
 * Lives as long as s. */
const char *duet_session_collective(const DuetSession *s);
/* Data parallelism: the number of replicas of s's program (1 for a program
 * without data parallelism).  duet_session_write writes a param, optimizer
 * state or any other device tensor into every replica; duet_session_read
 * reads replica 0's; duet_session_read_replica reads replica r's
 * (0 <= r < replicas; the data inputs, loss and metrics are the session's
 * own host buffers, the same for every r).  0, or -1 with a message in
 * duet_session_error.  ZeRO stage 1 (DuetProgram.zero): a sharded state
 * tensor is written only into the replica that holds it and read from it
 * (across MPI ranks: broadcast from its rank, every other rank taking part
 * through duet_session_serve_states, which serves every sharded state
 * tensor in id order, as a checkpoint reads them). */
int duet_session_replicas(const DuetSession *s);
int duet_session_read_replica(DuetSession *s, int replica, int id, size_t off, void *dst, size_t n);
int duet_session_serve_states(DuetSession *s);
/* Device address of tensor `id` (NULL for an id out of range).  Host
 * code may dereference it only on a CPU device; everything else goes
 * through duet_session_read / duet_session_write (CUDA regions are device
 * memory, which the host cannot address). */
void *duet_session_tensor(DuetSession *s, int id);
/* Copies n bytes at byte offset off of tensor `id` to host memory dst
 * (read) or from host memory src (write), through the copy ops of the
 * device that holds the tensor (a pipeline stage's device for a pipelined
 * session; host staging for a pipeline's inputs, loss and metrics).  The
 * copy follows the work already submitted and is complete on return.  0,
 * or -1 with a message in duet_session_error (id or range outside the
 * tensor, a device's copy failure). */
int duet_session_read(DuetSession *s, int id, size_t off, void *dst, size_t n);
int duet_session_write(DuetSession *s, int id, size_t off, const void *src, size_t n);
/* A host buffer of at least `bytes` bytes owned by the session (reused and
 * grown; valid until the next call or duet_session_free), for filling
 * inputs before duet_session_write.  NULL with a message in
 * duet_session_error when out of memory. */
void *duet_session_staging(DuetSession *s, size_t bytes);
/* Re-initialises every param (zeros optimizer state, ones pruning masks, step count): values
 * drawn on the host, written with duet_session_write.  0, or -1 with a
 * message in duet_session_error. */
int duet_session_init_params(DuetSession *s, uint64_t seed);
/* Runs a schedule: DUET_RUN_TRAIN (one optimizer step; increments the step
 * count), DUET_RUN_EVAL, DUET_RUN_GRAD.  0 on success, -1 with a message. */
enum { DUET_RUN_TRAIN, DUET_RUN_EVAL, DUET_RUN_GRAD };
int duet_session_run(DuetSession *s, int which);
/* Optimizer steps taken (AdamW's bias correction uses it); set on resume. */
int64_t duet_session_step(const DuetSession *s);
void duet_session_set_step(DuetSession *s, int64_t step);
/* The steps of the run (the learning-rate schedule's T, duet_lr_at; 0, the
 * default: unknown, the rate after the warm-up is the base rate). */
void duet_session_set_total(DuetSession *s, int64_t total);
int64_t duet_session_total(const DuetSession *s);
/* The learning rate of the last training step (duet_lr_at of its step; the
 * first step's before any). */
double duet_session_lr(const DuetSession *s);
/* --clip-grad-norm: the global L2 norm of the gradients of the last
 * training step, before clipping (NaN before any, without clipping, and on
 * a step skipped for an fp16 overflow). */
double duet_session_grad_norm(const DuetSession *s);
DuetDevice *duet_session_device(DuetSession *s);
const DuetProgram *duet_session_program(const DuetSession *s);
/* Dynamic loss scaling (fp16 programs), as torch.cuda.amp.GradScaler with
 * its defaults: the scale starts at config loss_scale (2^16); a step whose
 * gradients hold an inf or NaN is skipped (no optimizer update, no AdamW
 * step count) and halves the scale; 2,000 consecutive good steps double it.
 * When a halving takes the scale below config min_loss_scale (1), the run
 * fails with an error naming the first param whose gradient overflowed. */
typedef struct DuetScaler {
  double scale;
  int64_t growth;    /* good steps since the last change (GradScaler's growth tracker) */
  int64_t skipped;   /* steps skipped so far */
  int last_skipped;  /* the last train run was skipped */
  const char *first_overflow; /* param of the first set flag of the last skipped step */
} DuetScaler;
#define DUET_SCALE_GROWTH_INTERVAL 2000
#define DUET_SCALE_GROWTH 2.0
#define DUET_SCALE_BACKOFF 0.5
/* The session's scaler (all zero when the program has no loss scaling). */
DuetScaler duet_session_scaler(const DuetSession *s);
void duet_session_set_scaler(DuetSession *s, const DuetScaler *sc);
/* The session's config has --quiet set. */
int duet_session_config_quiet(const DuetSession *s);
/* The session's config (seed, batch, subsets, ... as the run was started). */
const DuetConfig *duet_session_config(const DuetSession *s);
/* Decoding: the position of the token the next run processes. */
void duet_session_set_pos(DuetSession *s, int64_t pos);
/* Number of rows of the current batch that hold real samples (eval). */
void duet_session_set_valid(DuetSession *s, int64_t n_valid);
const char *duet_session_error(const DuetSession *s);

/* "duet X.Y.Z (git HASH, DATE)": the release, and the commit (12 hex digits)
 * and commit date of the checkout the library was built from ("unknown"
 * outside a git checkout); generated at build time (tools/version.cmake). */
extern const char duet_version_line[];

/* Training driver: parses flags (see duet_usage), loads data, trains, logs,
 * evaluates.  --version anywhere prints duet_version_line and returns 0.
 * Returns a process exit code. */
int duet_main(const DuetProgram *p, const DuetKernelFn *kernels, const char *argv0, int argc, char **argv);
/* Byte-level text generation with a trained model: `prompt` is extended
 * by `n_tokens` bytes, each drawn from softmax(logits / temperature)
 * restricted to the top_k most likely bytes (top_k 0: all; temperature 0:
 * the most likely byte), with a generator seeded from `seed`, and written
 * to `out` as it is produced.  The program must be a byte-level (256-way)
 * language model compiled for generation (DuetProgram.decode: batch 1, one
 * token per run, attention keys and values cached): the prompt is fed one
 * byte per run, then every new byte costs one run.  When the caches
 * (context T) are full, decoding restarts from the last T/2 bytes.  Returns
 * 0, or -1 with a message in err. */
int duet_sample(DuetSession *s, const char *prompt, int64_t n_tokens, double temperature, int64_t top_k,
                uint64_t seed, FILE *out, char *err, size_t errlen);
/* 0 when p can generate text (see duet_sample), else -1 with the reason. */
int duet_sample_check(const DuetProgram *p, char *err, size_t errlen);

/* The checks of duet_main that need neither kernels nor a device, for a
 * caller about to spend seconds compiling the kernels (duet run) or, in a
 * compiled executable, loading data and opening devices: the flags parse,
 * the data (fashion_mnist: duet_check_idx on each split read, and the image
 * size against the model's input x; text: the file reads and, when it is
 * a regular file, is long enough for one window in both splits), the run's
 * files as duet_main checks them (runtime/train.c, check_run_files: --save
 * is no existing directory, symbolic link, FIFO, device or socket and its
 * directory is writable; no output (--save, --metrics) is the same file as
 * an input (the model source model_path, which `duet run` compiled (NULL:
 * none), --resume, the data files, the running program); --resume is a
 * checkpoint of p before the run's last step), and duet_devices_preflight
 * (the devices open, --gemm-accumulate fp16 only on CUDA, a pipeline's
 * environment, one CPU device's memory).  Prints nothing when all is well;
 * else prints the error duet_main would print and returns 1. */
int duet_preflight(const DuetProgram *p, const char *model_path, int argc, char **argv);
/* Applies command-line flags to cfg; returns 0, 1 on a bad flag (printed),
 * 2 when --help was printed. */
int duet_parse_flags(DuetConfig *cfg, int64_t compiled_batch, int argc, char **argv);
/* duet_parse_flags for program p (duet_main, duet_preflight): the flags
 * fixed when p was compiled (duet_fixed_flags) are accepted when their
 * value is the compiled one, else "duet: error: --precision is fixed at
 * compile time: fp32 (...)" (1). */
int duet_parse_flags_for(DuetConfig *cfg, const DuetProgram *p, int argc, char **argv);
void duet_usage(const char *argv0, FILE *out);
/* The compile-time flags of a training executable, with p's values, for
 * its --help: "Fixed at compile time ...:\n  --precision fp32\n ...". */
void duet_usage_fixed(const DuetProgram *p, FILE *out);
/* The precision p was compiled for, as --precision names it: "fp16" or
 * "bf16" (its 16-bit storage), else "fp32" ("f64" for an f64 model). */
const char *duet_program_precision(const DuetProgram *p);

/* -------------------------------------------------------------- pruning */

/* The sparsity the schedule asks for after t optimizer steps: the cubic
 * schedule of Zhu & Gupta 2017 ("To prune, or not to prune", arXiv
 * 1710.01878, eq. 1), s_t = s_f + (s_i - s_f) (1 - (t - t0) / (n dt))^3
 * with t0 = start and n dt = end - start, s_i before start and s_f from
 * end on (one-shot, end == start: s_f from start on).  N:M: its pattern's
 * (M - N) / M. */
double duet_prune_target(const DuetPrune *pr, int64_t t);
/* 1 when the masks are recomputed after t optimizer steps (before step
 * t + 1): t = start + k every < end, and t = end; else 0. */
int duet_prune_due(const DuetPrune *pr, int64_t t);
/* New masks for sparsity `target` from the weights: w[i] and mask[i] are
 * host copies of pr->params[i]'s param and mask (f32, or f64 when
 * dtype[i] is DUET_F64); mask[i] holds the current mask on entry and the
 * new one on return (1 keeps, 0 prunes).  Magnitude |w| ranks the
 * weights; a weight pruned already ranks below every other, so a
 * schedule's growing sparsity keeps it pruned; ties (equal magnitudes)
 * are broken by position: the lower index is pruned first (the lower
 * channel, in channels mode), so the count is exact.
 *   unstructured: round(target x n) weights of each param (round half to
 *                 even, as Python's round(), which torch.nn.utils.prune
 *                 uses for amounts)
 *   global:       round(target x total) weights of all params together,
 *                 by one magnitude threshold
 *   N:M:          nm_m - nm_n of every nm_m consecutive inputs of a channel
 *   channels:     round(target x out_n) output channels of each param by
 *                 their L2 norm (summed in double)
 * The k-th smallest magnitude is found by radix selection on the bits of
 * |w| (4 passes of 16 bits, no sort).  0, or -1 with a message in err (a
 * dtype other than f32/f64, out of host memory). */
int duet_prune_masks(const DuetPrune *pr, double target, const int *dtype, const void *const *w, void *const *mask,
                     char *err, size_t errlen);
/* The session's masks recomputed for `target` (duet_prune_masks on the
 * params and masks read with duet_session_read), written back, and the
 * newly pruned weights and their optimizer state set to 0.  0, or -1 with
 * a message in err. */
int duet_prune_update(DuetSession *s, double target, char *err, size_t errlen);
/* The fraction of pruned weights (mask 0) of each pruned param into
 * per_param[0..n_params) (may be NULL) and of all of them into *overall,
 * read from the session's masks; *n_weights (may be NULL): their count.
 * 0, or -1 with a message in err. */
int duet_prune_sparsity(DuetSession *s, double *per_param, double *overall, int64_t *n_weights, char *err,
                        size_t errlen);
/* ------------------------------------------------- int8 weights (quantize) */

/* Symmetric int8 quantization of the f32 weights w[numel of shape] (rank
 * dims) with one scale per element of the broadcast shape sshape (each
 * sshape[d] 1 or shape[d]: [1, out] for an [in, out] weight per output
 * channel, [out, 1, 1, 1] for a convolution's, all ones per tensor).
 * Weights are grouped by the scale element they broadcast to; per group:
 *   m = max |w| (f32),  scale = m / 127 (f32 division),
 *   q = round(w / scale) clamped to [-127, 127], rounded half to even
 *       (nearbyintf in the default rounding mode; numpy's round and
 *       torch.round round the same way),
 * so w is within scale / 2 of q x scale.  A group with m = 0 gets scale 1
 * (its q are 0, dequantized to exactly 0); one whose m / 127 is below
 * FLT_MIN (2^-126) gets FLT_MIN: never a zero, subnormal or NaN scale, and
 * q = 0 wherever |w| < FLT_MIN / 2.  -128 is never used (the range is
 * symmetric).  w must be finite (checkpoint loading refuses a NaN or an
 * infinity first); a non-finite weight gives q 0 and scale 1 for its group.
 * Returns 0, or -1 when a shape is invalid (rank outside 1..DUET_MAX_RANK,
 * a dim below 1, an sshape[d] neither 1 nor shape[d]). */
int duet_quantize_i8(const float *w, int rank, const int64_t *shape, const int64_t *sshape, signed char *q,
                     float *scale);
/* The scale tensor of int8 param i of p (the param `<name>.scale`, f32, of
 * its rank) or -1 when i is no int8 param or has none. */
int duet_quant_scale_of(const DuetProgram *p, int i);
/* Whether tensor i of p is the activation scale of an int8 GEMM (a
 * program compiled with --quantize and --calibrate; passes/quantize.c): an
 * f32 param of one element named `<weight>.act_scale` (or
 * `.act_scale2`, ... for a weight read by several matmuls).  A checkpoint
 * may lack it: it is then calibrated (duet_calibrate). */
int duet_is_act_scale(const DuetProgram *p, int i);
/* Activation calibration (runtime/calibrate.c), after the weights are
 * loaded and before the evaluation: when p has activation scales that are
 * not set (<= 0; a checkpoint of f32 weights), runs the first
 * cfg->calibrate batches of the TRAINING split (Fashion-MNIST image data,
 * in file order, never the test set) through the evaluation schedule, in
 * which each int8 GEMM computes in f32 and records max|x| of its input
 * (-max in its scale), then sets every scale to max|x| / 127 (an f32
 * division; 1 for an all-zero input, FLT_MIN below it: duet_quantize_i8's
 * safe scales) and prints them to out (NULL: not) with 9 significant
 * digits.  0 (also when p has none), or -1 with a one-line message in
 * err. */
int duet_calibrate(DuetSession *s, const DuetProgram *p, const DuetConfig *cfg, FILE *out, char *err, size_t errlen);
/* Whether p holds int8 weights (a program compiled with --quantize: it
 * evaluates only). */
int duet_program_quantized(const DuetProgram *p);
/* For a program with int8 weights, one line to out: "duet: int8 weights:
 * 3 tensors, 1861632 bytes and 4128 bytes of f32 scales (7446528 bytes in
 * f32)"; nothing for another program. */
void duet_quant_summary(const DuetProgram *p, FILE *out);

/* ------------------------------------------------------------ MPI ranks */

/* Whether an MPI launcher started this process as one of several ranks,
 * from its environment alone (no MPI call): OMPI_COMM_WORLD_SIZE/RANK
 * (Open MPI's mpirun), PMI_SIZE/PMI_RANK (MPICH's mpiexec, srun
 * --mpi=pmi2), SLURM_STEP_NUM_TASKS/SLURM_PROCID (srun; one task is no MPI
 * run).
 * Returns the number of ranks (1: not launched as one of several), *rank
 * this one's, and `var` the variable that said so ("OMPI_COMM_WORLD_SIZE=2");
 * -1 with a message in var when the variables are malformed.  Under such a
 * launcher duet_main loads MPI (the plugin libduet_mpi.so) and runs this
 * rank as one replica of a data-parallel program of that many replicas
 * (README "Data parallelism"). */
int duet_launch_ranks(int *rank, char *var, size_t varlen);
/* Under such a launcher with several ranks, stderr becomes a line-buffered
 * stream that writes to file descriptor 2 with every line that starts
 * "duet: " prefixed by "duet: rank R: " (so "duet: rank 1: error: ...");
 * otherwise (or when stderr has been replaced already) nothing changes.
 * Called by duet_main, duet_preflight and the duet CLI. */
void duet_rank_stderr(void);

/* ------------------------------------------------------------------ rng */

/* xoshiro256** (Blackman & Vigna 2018), seeded through splitmix64. */
typedef struct DuetRng {
  uint64_t s[4];
} DuetRng;
void duet_rng_seed(DuetRng *r, uint64_t seed, uint64_t stream);
uint64_t duet_rng_next(DuetRng *r);
double duet_rng_uniform(DuetRng *r);  /* [0, 1) with 53 random bits */
double duet_rng_normal(DuetRng *r);   /* Box-Muller */

/* ---------------------------------------------------------- checkpoints */

/* Where training stands, besides the tensors: enough to continue with
 * exactly the losses an uninterrupted run prints. */
typedef struct DuetTrainState {
  int64_t step;           /* optimizer steps done */
  int64_t epoch, batch;   /* images: epoch (1-based) and next batch index in it */
  DuetRng rng;            /* text: the batch generator after `step` batches */
} DuetTrainState;

/* Writes every param and optimizer-state tensor of s under its
 * hierarchical name, plus the train state, the model name and the settings
 * a resume compares (seed, batch size, train subset, precision, and, unless
 * every device is a GPU, threads per device; with pruning its schedule:
 * prune_mode, prune_sparsity, prune_initial, prune_start, prune_end,
 * prune_every) as metadata, to a safetensors file, atomically (see
 * duet_st_save).  A state holding a NaN or an infinity is never written:
 * -2, with err naming the first such tensor ("tensor `w` holds 3 non-finite
 * values (element 7 is NaN)"), and `path` left as it was.  0, or -1 with a
 * message in err. */
int duet_checkpoint_save(DuetSession *s, const char *path, const DuetTrainState *st, char *err, size_t errlen);
/* Loads a checkpoint written by duet_checkpoint_save for the same model:
 * every param and state tensor must be present with the exact dtype and
 * shape, and no other tensor may be, and every value must be finite; sets
 * the session's step.  A seed, batch size, train subset, precision or
 * number of threads per CPU device other than the checkpoint's is a warning
 * on stderr (unless quiet): the run goes on, not exactly as the
 * uninterrupted one.  A pruned checkpoint's masks and the program's
 * pruning schedule: another mode, a next update to a sparsity below the
 * one the masks reached, or another final sparsity with no update left
 * after its step is refused; another schedule that can go on from its
 * masks is a warning; masks of params the program does not prune (a run
 * without pruning, other --prune-params) are refused naming them and the
 * checkpoint's flags.  0, or -1 with a message naming the file and the
 * tensor (nothing is changed then). */
int duet_checkpoint_load(DuetSession *s, const char *path, DuetTrainState *st, char *err, size_t errlen);
/* Loads only the params of a checkpoint of the same model (exact dtype and
 * shape each, finite values); optimizer state and training position are
 * ignored.  For inference (duet sample). */
int duet_checkpoint_load_weights(DuetSession *s, const char *path, char *err, size_t errlen);
/* (duet_checkpoint_load_weights and duet_checkpoint_check_weights with path
 * NULL: the program's embedded weights, DuetProgram.weights, read from
 * memory by the same parser and checks; messages call them "embedded
 * weights".) */
/* The checks of duet_checkpoint_load that need only the file's header, with
 * its messages ("cannot resume from PATH: ..."), without a session: the
 * file opens, its header fits the file (a truncated file fails), it is a
 * checkpoint of program p with p's params and state tensors; *step receives
 * its step.  Reads the header only (cheap for a large file).  0, or -1 with
 * a message in err. */
int duet_checkpoint_check(const DuetProgram *p, const char *path, int64_t *step, char *err, size_t errlen);
/* duet_checkpoint_check for loading only the params (--eval-only, duet
 * predict, duet export): the file opens, is a duet checkpoint of model
 * p->model_name, and holds every param of p with its exact dtype and shape
 * (optimizer state, masks and other tensors are not looked at); *step
 * receives its step.  Messages "cannot load PATH: ..." name the tensor.
 * Reads the header only.  0, or -1 with a message in err. */
int duet_checkpoint_check_weights(const DuetProgram *p, const char *path, int64_t *step, char *err, size_t errlen);
/* For an evaluation of checkpoint `path` by program p (--eval-only, duet
 * predict): when the checkpoint records another precision than p's
 * (metadata "precision", written by duet_checkpoint_save), prints a line on
 * stderr saying that the numbers will differ from the training run's last
 * evaluation and which --precision repeats them.  Nothing for path NULL
 * (embedded weights), an unreadable file (the load reports it) or a
 * checkpoint without the key. */
void duet_checkpoint_precision_note(const DuetProgram *p, const char *path);
/* duet compile --checkpoint: the params of checkpoint `ck` as program p
 * loads them (checked as duet_checkpoint_check_weights checks them, values
 * finite), written atomically to `out` (duet_st_save) as a weights-only
 * checkpoint of p: f32 weights that p holds in int8 (a --quantize program)
 * are quantized here, as a load would quantize them (duet_quantize_i8: the
 * int8 tensor under the weight's name, its f32 scales as `NAME.scale`);
 * the other params as the file has them.  Metadata: the checkpoint's
 * format, model, step, epoch, batch, rng, and "source" = ck.  0, or -1
 * with the message in err ("cannot load CK: it is a checkpoint of model
 * ..."). */
int duet_checkpoint_embed(const DuetProgram *p, const char *ck, const char *out, char *err, size_t errlen);

/* ----------------------------------------------------------- evaluation */

/* The evaluation of a trained model (runtime/train.c), in pieces that a
 * caller may combine: open a session (duet_eval_open), load a checkpoint's
 * params into it (duet_checkpoint_load_weights), change them if it likes
 * (post-training quantization), evaluate (duet_evaluate). */
typedef struct DuetEvalResult {
  int text;            /* 1: a language model's validation loss; 0: a classifier's accuracy */
  const char *split;   /* "test" (fashion_mnist), "validation" (npy, text, tokens) */
  int64_t correct, n;  /* classifiers: correct predictions of n samples */
  int64_t batches;     /* text: the fixed validation batches (cfg->eval_batches) */
  double loss;         /* classifiers: mean cross-entropy per sample; text: nats per token */
} DuetEvalResult;
/* A session of p on cfg's devices (--devices, --threads) for evaluation, as
 * a training run opens it; *dev receives the device to destroy after the
 * session (NULL for a pipeline, whose session owns its devices).  NULL
 * after printing the error. */
DuetSession *duet_eval_open(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg, DuetDevice **dev);
/* The evaluation a training run makes at its end, on the session's
 * current params: classifiers on Fashion-MNIST, the test split (the first
 * cfg->test_subset samples when set) in order, batch by batch; npy data, its
 * validation samples; text and tokens, the mean next-token loss over
 * cfg->eval_batches fixed validation batches.  The data is loaded from cfg
 * (data_path, ...).  The same params, program and --threads give the same
 * bits as the training run's evaluation.  0, or -1 with a message in err. */
int duet_evaluate(DuetSession *s, const DuetConfig *cfg, DuetEvalResult *res, char *err, size_t errlen);
/* duet predict: argv holds the flags after the model (--checkpoint CK,
 * --data, -o FILE, --test-subset, --eval-batches, --logits, --threads);
 * model_path (or NULL) is the model source, an input -o may not be.
 * writes the JSON lines duet_predict_usage describes.  The exit code. */
int duet_predict_main(const DuetProgram *p, const DuetKernelFn *kernels, const char *model_path, int argc,
                      char **argv);
/* An output file `path` (named by `flag` in the message, e.g. "-o") that
 * would destroy an input of a run with cfg (p->defaults when NULL): the
 * model source model_path (or NULL), --resume, --checkpoint, the data
 * files, the running program; compared by device and inode, so links and
 * other spellings count.  0, or 1 after printing the error. */
int duet_check_output(const DuetProgram *p, const DuetConfig *cfg, const char *model_path, const char *flag,
                      const char *path);
void duet_predict_usage(FILE *out);
/* duet export: the params of checkpoint `ckpt` of program p (checked as
 * duet_checkpoint_check_weights does, values finite) as f32 tensors under
 * their names (shapes as the program's; f64, f16 and bf16 params
 * converted), with metadata {"format": "duet-weights-1", "model", "step"},
 * written atomically to `out` (duet_st_save).  0, or -1 with the message. */
int duet_export_weights(const DuetProgram *p, const char *ckpt, const char *out, char *err, size_t errlen);
/* The "format" metadata of a weights file written by duet export. */
#define DUET_WEIGHTS_FORMAT "duet-weights-1"
/* Number of NaNs and infinities among the nbytes bytes of dtype elements at
 * data (DUET_F32, F64, F16, BF16; 0 for other dtypes); *first (if not NULL)
 * receives the index of the first (-1 when none), *first_nan (if not NULL)
 * whether it is a NaN. */
int64_t duet_count_nonfinite(int dtype, const void *data, int64_t nbytes, int64_t *first, int *first_nan);
/* The CPU threads each device of a run uses: --threads (0: the online
 * cores, sysconf) split evenly among n_stages workers: pipeline stages, of
 * every data-parallel replica (at least 1 each); OpenBLAS's summation order
 * follows it. */
int duet_threads_per_device(const DuetConfig *cfg, int n_stages);

/* ----------------------------------------------------------------- data */

/* A labelled image set: `images` f32 [n, rows*cols] scaled to [0, 1],
 * `labels` i32 [n]; or (npy data, images and labels NULL) n samples of the
 * two inputs in their own dtypes (f32 or i32: 4 bytes an element), x_elems
 * and y_elems elements a sample. */
typedef struct DuetDataset {
  int64_t n;
  int rows, cols;
  float *images;
  int32_t *labels;
  void *x, *y;
  int64_t x_elems, y_elems;
} DuetDataset;
/* Loads an IDX image/label file pair (gzip-compressed, as Debian's
 * dataset-fashion-mnist ships them; format: LeCun et al., "THE MNIST
 * DATABASE", file formats section).  Returns 0, or -1 with a message naming
 * the file in err. */
int duet_load_idx(DuetDataset *ds, const char *images_path, const char *labels_path, char *err, size_t errlen);
/* What duet_check_idx learns from an IDX pair's headers. */
typedef struct DuetIdxInfo {
  int64_t n;      /* images (= labels) */
  int rows, cols; /* pixels of one image */
} DuetIdxInfo;
/* The checks of duet_load_idx that need not decompress the images, with its
 * messages: both files open and start with the right IDX header, they hold
 * as many images as labels, the image sizes are plausible, and each file's
 * data has the length its header declares (from the gzip trailer or the
 * file size; a file whose trailer disagrees is read through, so a
 * truncated file is reported as duet_load_idx reports it).  A damaged gzip
 * body with an intact trailer is left to duet_load_idx (its CRC check).
 * Fills *info (may be NULL).  Returns 0, or -1 with a message in err. */
int duet_check_idx(const char *images_path, const char *labels_path, DuetIdxInfo *info, char *err, size_t errlen);
void duet_dataset_free(DuetDataset *ds);

/* An llm.c token file (karpathy/llm.c, dev/data/data_common.py,
 * write_datafile): 256 little-endian int32 of header ([0] magic 20240520,
 * [1] version 1, [2] the token count), then that many little-endian uint16
 * token ids.  Reads it whole; *n receives the count and *tokens (unless
 * tokens is NULL: a check only) the ids, malloc'ed.  0, or -1 with a
 * one-line message naming the file: it does not open, is shorter than the
 * header, has another magic or version, holds other than 2 x count bytes
 * after the header (truncated, extra), or a token id >= vocab (its index
 * and byte offset). */
int duet_load_tokens(const char *path, int vocab, uint16_t **tokens, int64_t *n, char *err, size_t errlen);

/* NumPy .npy files (runtime/npy.c; format: numpy.lib.format, NEP 1):
 * versions 1.0, 2.0 and 3.0, C order, dtypes '<f4', '<i4', '<i8', '|u1'. */
enum { DUET_NPY_F4 = 1, DUET_NPY_I4 = 2, DUET_NPY_I8 = 3, DUET_NPY_U1 = 4 };
#define DUET_NPY_MAX_HEADER (1 << 20) /* bytes of header dict duet reads */
typedef struct DuetNpyInfo {
  int dtype, itemsize;          /* DUET_NPY_*, bytes per element */
  int rank;                     /* 1..DUET_MAX_RANK: axis 0 counts the samples */
  int64_t shape[DUET_MAX_RANK];
  int64_t data_offset, data_bytes; /* where the array starts; its size from the shape */
} DuetNpyInfo;
/* Parses the first len bytes of a .npy file (the preamble and the header
 * dict; the data need not be there).  0, or -1 with a one-line message in
 * err (no path): bad magic, unsupported version, a header longer than the
 * bytes given (truncated), a header that is not a dict literal with exactly
 * the keys 'descr', 'fortran_order' and 'shape', an unsupported descr,
 * fortran_order True, a 0-d array, more than DUET_MAX_RANK axes. */
int duet_npy_parse_header(const unsigned char *buf, size_t len, DuetNpyInfo *info, char *err, size_t errlen);
/* Opens path, parses its header and checks that the file holds exactly the
 * bytes its shape and dtype need.  0, or -1 with "PATH: ..." in err. */
int duet_npy_check(const char *path, DuetNpyInfo *info, char *err, size_t errlen);
/* Checks a file's samples (axes 1..) against input tensor t (axis 0 is the
 * batch): the same per-sample shape, and a dtype it converts from: f32 from
 * '<f4' or '|u1' (the byte's value, 0..255, not scaled), i32 from '<i4',
 * '<i8' (each value range-checked on loading) or '|u1'.  0, or -1 with the
 * message in err (`input`: the input's name). */
int duet_npy_match(const DuetNpyInfo *info, const char *path, const DuetTensor *t, const char *input, char *err,
                   size_t errlen);
/* Loads a whole file as the f32 or i32 elements of input t (checked as
 * duet_npy_check and duet_npy_match do): *out (malloc'ed, *n samples of
 * t's per-sample size) or -1 with the message. */
int duet_npy_load(const char *path, const DuetTensor *t, const char *input, int64_t *n, void **out, char *err,
                  size_t errlen);
/* The .npy descr string of a DUET_NPY_* dtype ("<f4"). */
const char *duet_npy_descr(int dtype);
/* The shape's axes from..rank as a Python tuple "(28, 28)", "(10,)", "()". */
char *duet_npy_shape_str(const DuetNpyInfo *info, int from, char *buf, size_t n);

/* The whole file at `path` in one malloc'ed buffer, NUL-terminated after its
 * *len bytes.  NULL on failure with errno set: fopen's errno when the file
 * cannot be opened, EIO when reading fails, ENOMEM when out of memory. */
void *duet_read_file(const char *path, size_t *len);
/* `path` opened for reading ("rb") when it is a regular file.  A FIFO or
 * device is opened without blocking (O_NONBLOCK: opening a FIFO with no
 * writer would wait forever), seen by fstat and closed: NULL with
 * *not_regular = 1.  NULL with *not_regular = 0 and errno set when open
 * fails. */
FILE *duet_fopen_regular(const char *path, int *not_regular);

/* ----------------------------------------------------------- safetensors */

/* safetensors files (huggingface/safetensors, "Format"): an 8-byte
 * little-endian header length N, N bytes of JSON naming each tensor's dtype,
 * shape and byte range, then the data.  duet reads and writes F32, F64,
 * I32, F16, BF16 and U8 tensors and the string-to-string "__metadata__" map. */
typedef struct DuetStTensor {
  const char *name;
  int dtype;                     /* DUET_F32, DUET_F64, DUET_I32, DUET_F16, DUET_BF16, DUET_U8 */
  int rank;                      /* 0 (a scalar) .. DUET_MAX_RANK */
  int64_t shape[DUET_MAX_RANK];  /* elements per dim, row-major */
  const void *data;              /* little-endian elements */
  int64_t nbytes;                /* bytes: elements * dtype size */
} DuetStTensor;

/* Writes the n tensors t[0..n-1] (in that order, contiguous, the header
 * padded with spaces so the data start at a multiple of 8 bytes) and n_meta
 * metadata pairs meta_kv[2i] = key, meta_kv[2i+1] = value to `path`.
 * Atomic: writes a temporary file `path`.tmp.<pid>.<16 hex digits> (a new
 * name for every attempt, created exclusively), fflush + fsync, renames it
 * over `path`, fsyncs the directory.  Only a regular file is replaced: when
 * `path` exists as anything else (a directory, a symbolic link, a FIFO, a
 * device, a socket; see duet_st_target_kind), checked before writing and
 * again just before the rename, the save fails and leaves it alone.
 * Returns 0, or -1 with a message in err naming the path and the failing
 * call (bad arguments: duplicate or reserved names, nbytes not matching the
 * shape, unsupported dtype).  On failure the temp file is removed and an
 * existing `path` is left as it was, except when only the final directory
 * fsync fails: then `path` holds the new file and err says its durability is
 * not assured. */
int duet_st_save(const char *path, const DuetStTensor *t, int n, const char *const *meta_kv, int n_meta,
                 char *err, size_t errlen);
/* What `path` is when it exists and is not a regular file, as lstat(2)
 * says, for messages: "a directory", "a symbolic link", "a FIFO", "a
 * character device", "a block device", "a socket"; NULL when it is a
 * regular file or does not exist (or cannot be examined). */
const char *duet_st_target_kind(const char *path);
/* How long (seconds) a temporary file of duet_st_save must have gone
 * unmodified before duet_st_remove_stale_temps may remove it. */
#define DUET_ST_STALE_SECONDS 900
/* Removes the temporary files that interrupted saves to `path` left in its
 * directory, and only those that are provably stale: named
 * `<name of path>.tmp.<pid>` or `<name of path>.tmp.<pid>.<16 hex digits>`,
 * a regular file (not followed through a link) owned by this user, not
 * modified for min_age_s seconds (a save being written modifies its file
 * continuously; this also covers writers in another PID namespace or on
 * another host sharing the directory), and whose pid is no live process
 * here (kill(pid, 0) fails with ESRCH) or is this process (whose saves to
 * `path` do not overlap: a PID reused by the container that left the file).
 * Returns the number removed; `first` receives the path of the first (""
 * when none).  Best effort: a file that cannot be examined is kept. */
int duet_st_remove_stale_temps(const char *path, int64_t min_age_s, char *first, size_t firstlen);

/* A loaded file: every tensor's bytes copied, 8-byte aligned, into memory
 * that lives until duet_st_close. */
typedef struct DuetStFile DuetStFile;
/* Reads and validates the whole file.  NULL with a message in err naming the
 * file (and the tensor) when it cannot be read or is corrupt: shorter than
 * 8 bytes, header length beyond the file or over 100 MB, header not a JSON
 * object, a dtype unknown to the format or other than F32/F64/I32/F16/BF16/U8, rank over
 * DUET_MAX_RANK, a shape entry not an integer >= 0, data_offsets out of the
 * data section, a byte size (elements * dtype size) different from
 * end - begin, overlapping ranges, duplicate names, non-string metadata. */
DuetStFile *duet_st_open(const char *path, char *err, size_t errlen);
/* duet_st_open reading only the header (the 8-byte length and the JSON):
 * the same checks against the file's size, no tensor data (every
 * DuetStTensor.data is NULL).  For checking a large file before using it. */
DuetStFile *duet_st_open_header(const char *path, char *err, size_t errlen);
/* duet_st_open (header_only: duet_st_open_header) of a file's n bytes held
 * in memory at data (an executable's embedded weights, duet compile
 * --checkpoint): the same parser and checks, messages naming `name` where
 * they name the file; the tensors' data are copied (data may be read-only,
 * or freed after the call). */
DuetStFile *duet_st_open_mem(const void *data, size_t n, const char *name, int header_only, char *err,
                             size_t errlen);
/* Number of tensors (not counting __metadata__). */
int duet_st_count(const DuetStFile *f);
/* Tensor i in header order (0 <= i < count), NULL outside. */
const DuetStTensor *duet_st_get(const DuetStFile *f, int i);
/* The tensor called `name`, NULL if absent. */
const DuetStTensor *duet_st_find(const DuetStFile *f, const char *name);
/* The metadata value of `key`, NULL if absent. */
const char *duet_st_meta(const DuetStFile *f, const char *key);

/* --------------------------------------------- shrunk programs (--shrink) */

/* Whether tensor i of p has axes the shrink pass shortened
 * (DuetProgram.shrink); full[rank] receives its shape in a checkpoint
 * (its own where not shrunk). */
int duet_shrink_full_shape(const DuetProgram *p, int i, int64_t *full);
/* The kept output channels of each source weight of p's shrink table, read
 * from checkpoint f (at path, for messages): the channels whose mask
 * (`NAME.mask` of the weight's shape) has a nonzero element, or, without
 * a mask, whose weights are not all zero.  A removed channel c whose
 * constant output acts(bias[c]) is not 0 (channels pruning keeps the
 * biases) adds acts(bias[c]) x (the sum of the next weight's elements of
 * its input group, per output) to the next layer's bias (kept here, added
 * by duet_shrink_gather), so the shrunk layers compute what the masked
 * ones did; where there is no bias to fold into (or zero padding on the
 * way) such a channel is an error naming it.  NULL with the message in err
 * when a source is missing or keeps another number of channels than the
 * program's shrunk axis: named from the checkpoint's metadata where they
 * explain it (trained with another --prune S or mode, without pruning,
 * saved before its last pruning update, without the source's mask:
 * --prune-params), with what to do; else the counts ("cannot load CK:
 * `conv1.w` keeps 20 of its 32 output channels there (its mask), and this
 * program was shrunk (--shrink) to 16 ..."). */
typedef struct DuetShrinkKept DuetShrinkKept;
DuetShrinkKept *duet_shrink_kept(const DuetProgram *p, const DuetStFile *f, const char *path, char *err,
                                 size_t errlen);
void duet_shrink_kept_free(DuetShrinkKept *k);
/* Gathers into out (p->tensors[i].nbytes) the elements of checkpoint
 * tensor y (tensor i's full shape, any element size) that shrunk tensor i
 * keeps: along each shrunk axis, index j is full index
 * kept[j / group] * group + j % group.  0, or -1 when y's shape is not
 * tensor i's full shape (or out of host memory). */
int duet_shrink_gather(const DuetProgram *p, const DuetShrinkKept *k, int i, const DuetStTensor *y, void *out);
/* Whether tensor i of p is loaded through duet_shrink_gather: a shrunk
 * param, or a next layer's bias that receives the removed channels'
 * constant contributions (duet_shrink_kept folds them). */
int duet_shrink_touches(const DuetProgram *p, const DuetShrinkKept *k, int i);
/* Prints, for a shrunk program (p->shrink), one line with its params and
 * their bytes against the checkpoint's full shapes: "duet: shrunk
 * (--shrink): 669706 parameters in 2678824 bytes (1863690 in 7454760
 * before)"; nothing otherwise. */
void duet_shrink_summary(const DuetProgram *p, FILE *out);
/* The pruning flags given to a compiled shrunk program (p->shrink, no
 * pruning table; runtime/train.c's fixed flags): -1 when p is not shrunk or
 * flag is not a pruning flag (the caller checks it), 0 when val is
 * accepted (--prune S of the compile, --prune-mode channels; the schedule
 * and --prune-params, which do not change an evaluation: the masks of the
 * checkpoint decide, duet_shrink_kept), else 1 after one line
 * "duet: error: --prune is fixed at compile time: S (... compile again:
 * duet compile M.model --prune-mode channels --prune VAL --shrink ...)". */
int duet_shrink_check_fixed(const DuetProgram *p, const char *flag, const char *val);
/* Frees everything of f (NULL is fine); pointers from f die with it. */
void duet_st_close(DuetStFile *f);

/* ---------------------------------------------------------- kernel cache */

/* The per-user kernel cache (used by the C JIT and the CUDA backend):
 * $DUET_CACHE_DIR (created with its missing parents), else
 * $XDG_CACHE_HOME/duet, else $HOME/.cache/duet (HOME must exist: a missing
 * home is an error, never created), else, without HOME,
 * ${TMPDIR:-/tmp}/duet-cache-UID/duet.  Directories are created with mode
 * 0700, and the cache directory must be owned by the user with no group or
 * other permissions; the temporary-directory default must pass
 * duet_dir_private as a whole path.  0, or -1 with a message in err (the
 * callers then compile without caching). */
int duet_cache_dir(char *out, size_t n, char *err, size_t errlen);
/* dir is private: a directory owned by the user with no group or other
 * permissions, and every directory above its real path is owned by root or
 * the user and writable by no one else unless sticky (as /tmp), so nobody
 * else can rename or replace it.  0, or -1 with a message in err. */
int duet_dir_private(const char *dir, char *err, size_t errlen);
/* A fresh private directory ${TMPDIR:-/tmp}/PREFIX-XXXXXX (mkdtemp, mode
 * 0700), checked with duet_dir_private (removed again when it fails), else
 * one in /tmp.  0, or -1 with a message in err. */
int duet_private_tmpdir(char *out, size_t n, const char *prefix, char *err, size_t errlen);
/* Creates BASE.PID.XXXXXX<suffix> (unique, mode 0600, close-on-exec) and
 * holds an exclusive flock on it until the returned fd is closed, so that
 * duet_cache_clean can tell a live writer's temporary from a dead one's.
 * The fd, or -1 with errno. */
int duet_cache_tmp(char *path, size_t n, const char *base, const char *suffix);
/* Removes the kernel cache's temporaries in dir (names of 16 hex digits, a
 * dot, and ending in .tmp or .c) that a dead run left: regular files of the
 * user, older than DUET_CACHE_STALE_SECONDS and not locked by a live
 * writer; a JIT source (.c) goes with its compiler output (.so.tmp) and key
 * (.key.tmp), which are kept while their .c exists.  Best effort, silent. */
#define DUET_CACHE_STALE_SECONDS 60
void duet_cache_clean(const char *dir);
/* Reads an open file to its end into one malloc'ed buffer, NUL-terminated
 * after its *len bytes.  NULL with errno (EIO, ENOMEM) on failure. */
void *duet_read_fd(int fd, size_t *len);
/* A cache entry's object checked and kept open: the key file's text
 * (keytext, keytext_len bytes) must be `key` followed by the object line,
 * and the object at path obj (a regular file of the user, not a symlink)
 * must have the size and FNV-1a hash that line records.  Returns the open
 * fd of the very file whose bytes (*bytes, malloc'ed, *len) were hashed, so
 * the caller loads what was checked (dlopen of /proc/self/fd/N); -1 on a
 * miss. */
int duet_cache_open_verified(const char *obj, const char *key, size_t keylen, const char *keytext, size_t keytext_len,
                             void **bytes, size_t *len);
/* FNV-1a, 64 bits (Fowler, Noll, Vo; constants from the FNV reference);
 * start with h = DUET_FNV_OFFSET. */
#define DUET_FNV_OFFSET 0xcbf29ce484222325ull
uint64_t duet_fnv1a(const void *p, size_t n, uint64_t h);
/* Writes n bytes to path (created 0600) and fsyncs it.  0, or -1 with errno. */
int duet_write_file_sync(const char *path, const void *data, size_t n);
/* Writes n bytes through fd (retrying short writes and EINTR) and fsyncs
 * it.  0, or -1 with errno. */
int duet_write_fd_sync(int fd, const void *data, size_t n);
/* fsync of an existing file or directory.  0, or -1 with errno. */
int duet_fsync_path(const char *path);
/* Cache entries: <hash of key>.<ext> holds the object, <hash>.<ext>.key the
 * full key text followed by "\nobject: <size> <FNV-1a of the object>\n".
 * duet_cache_get returns the object (malloc'ed, *len bytes) only when the
 * key file holds exactly `key` and the object's size and hash match; NULL
 * on a miss (a damaged entry is a miss) or when the directory is unusable
 * (message in err).  duet_cache_put writes the object then the key, each
 * to a temporary name, fsynced, then renamed (atomic); 0, or -1 with a
 * message. */
void *duet_cache_get(const char *key, size_t keylen, const char *ext, size_t *len, char *err, size_t errlen);
int duet_cache_put(const char *key, size_t keylen, const char *ext, const void *blob, size_t len, char *err,
                   size_t errlen);

/* ------------------------------------------------------------------ CUDA */

/* Interface version of libduet_cuda.so: its duet_cuda_plugin_api() returns
 * it and the loader accepts only a plugin that returns the same.  Bumped
 * whenever DuetDeviceOps, DuetDevice or DuetProgram changes its layout
 * (2: DuetDeviceOps gained peer_path, copy_peer, host_alloc, host_free; 4:
 * DuetProgram and DuetConfig gained the data-parallel fields; 5: the plugin
 * makes NCCL collectives, duet_cuda_plugin_nccl, over runtime/collective.h's
 * DuetColl; 6: DuetProgram gained prune; 7: DuetProgram gained source_hash,
 * DuetCollOps progress and stats; 8: DuetProgram gained zero, vocab and the clipping
 * tables, DuetConfig zero, the npy fields, the schedule and clipping; 9: DuetProgram gained
 * weights and shrink, DuetConfig calibrate). */
#define DUET_CUDA_PLUGIN_API 9

/* The CUDA device `ordinal` for program p: loads libduet_cuda.so
 * ($DUET_CUDA_PLUGIN, else next to the executable, else the build tree's,
 * else the loader's search path) only when libcuda.so.1 loads, compiles or
 * loads from the cache p->cuda_source, and prints one line about the card
 * and the kernels to stderr when verbose.  NULL with a message (no driver,
 * no plugin, no such GPU, an unsupported card, a failed compile). */
DuetDevice *duet_cuda_device(const DuetProgram *p, int ordinal, int verbose, char *err, size_t errlen);
/* Number of GPUs usable through the plugin; 0 (no GPU) or -1 (no driver,
 * no plugin, a driver error) with the reason in why. */
int duet_cuda_gpu_count(char *why, size_t whylen);
/* `duet devices`: one line for the CPU and one per GPU (name, compute
 * capability, memory, driver and NVRTC versions), or the reason there is
 * none.  Returns 0. */
int duet_list_devices(FILE *out);

/* What NVRTC compiles for one card. */
typedef struct DuetCudaTarget {
  int arch;          /* compute capability * 10 of the target */
  int cubin;         /* 1: SASS for the exact card (nvrtcGetCUBIN); 0: PTX, JIT-compiled by the driver */
  char arch_opt[32]; /* "-arch=sm_86" or "-arch=compute_80" */
} DuetCudaTarget;
/* Chooses the target for a card (`card`: its name, for messages) of
 * compute capability cc_major.cc_minor given the architectures NVRTC
 * supports (nvrtcGetSupportedArchs: compute capabilities * 10): the exact
 * sm_XY when listed (SASS), else PTX for the highest listed architecture
 * below the card's, else -1 with one error naming the card, the NVRTC
 * version, its oldest target and the CUDA release that supports the card
 * (12.x from sm_50, 11.x from sm_35).  Pure: no CUDA calls. */
int duet_cuda_pick_target(const char *card, int cc_major, int cc_minor, const int *archs, int n_archs,
                          int nvrtc_major, int nvrtc_minor, DuetCudaTarget *t, char *err, size_t errlen);

#endif
