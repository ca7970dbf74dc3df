/* passes/passes.h: Graph -> Graph passes, run as one named, linear list. */
#ifndef DUET_PASSES_H
#define DUET_PASSES_H

#include "../ir/ir.h"

/* A device as the partition pass sees it (plain data; the CLI fills it from
 * --devices). */
typedef struct PartDevice {
  const char *name;  /* for messages: "cpu:0", "cuda:1", "16GiB:sm_60" */
  bool cpu;
  bool planned;      /* a capacity such as 16GiB:sm_60: for duet plan, not a device to run on */
  int sm;            /* GPUs: compute capability x 10 (60 = sm_60) */
  int64_t capacity;  /* bytes of memory; 0: unlimited */
  const char *capacity_from; /* CPU: where the capacity came from, for messages ("MemAvailable in
                              * /proc/meminfo"); NULL: as given (a planned capacity, a GPU) */
  int cores;         /* CPU: cores of this (virtual) device */
  double cpu_gflops; /* CPU: configured GFLOP/s per core (0: the default) */
} PartDevice;

/* Peak rates of one device: FLOP/s, memory bytes/s, and bytes/s of a copy
 * to another device. */
typedef struct PartRates {
  double flops, bytes_per_s, link_bytes_per_s;
} PartRates;
/* CPU defaults: OpenBLAS SGEMM reaches ~100 GFLOP/s per core on the 2-core
 * development machines (shared/DESIGN.md, measured); memory bandwidth and
 * copy rate between arenas are assumptions of ~10 GB/s per core and 5 GB/s. */
#define PART_CPU_GFLOPS_PER_CORE 100.0
#define PART_CPU_GBS_PER_CORE 10.0
#define PART_CPU_COPY_GBS 5.0
/* The rates of d from the per-compute-capability table (passes/partition.c,
 * sources there) or the CPU figures; -1 when its sm is not in the table. */
int part_device_rates(const PartDevice *d, PartRates *r);
/* FLOPs and bytes moved (inputs + result) by one op (matmul 2mnk,
 * attention 4BT^2C, elementwise ~2 per element). */
void part_op_cost(const Value *v, double *flops, double *bytes);
/* Roofline estimate: max(flops / peak, bytes / bandwidth), seconds. */
double part_op_seconds(const Value *v, const PartRates *r);

typedef struct PassCtx {
  Diag *diag;
  bool verify;            /* run ir_verify after every pass (tests, debug) */
  const char *dump_after; /* print the graph after this pass */
  FILE *dump_out;
  const char *stop_after; /* stop after this pass (NULL: run all) */
  const char *start_after; /* skip the passes up to and including this one
                            * (a graph parsed from a dump; NULL: run from the
                            * first).  When it equals dump_after the graph is
                            * printed as given; when stop_after does, or comes
                            * earlier, nothing runs. */
  const char *precision;  /* --precision auto|fp32|fp16|bf16 (NULL: the train
                           * section's `precision`, else auto) */
  const char *target;     /* --target: a name of the device table (NULL: cpu) */
  const PartDevice *devices; /* partition: the stages' devices (NULL: one CPU) */
  int n_devices;
  bool clip;                 /* partition: --clip-grad-norm given (tied gradients stay per micro-batch) */
  bool one_f_one_b;          /* partition: 1F1B keeps min(M, S - s) micro-batches'
                              * activations on stage s (GPipe: M) */
  double bucket_mb;          /* data_parallel: --bucket-mb, MiB per all-reduce bucket
                              * (0: DP_BUCKET_MB_DEFAULT) */
  const char *recompute;     /* recompute: --recompute none|blocks|auto (NULL: the train
                              * section's `recompute`, else none) */
  const PartDevice *budget_device; /* recompute auto without `devices`: the one device whose
                              * capacity bounds the graph (duet run's default CPU; NULL: none) */
  const PruneSpec *prune;    /* prune: the --prune flags (prune_parse_flag); the fields in
                              * its `set` override the model's prune section (NULL: none) */
  const char *quantize;      /* quantize: --quantize int8|int8-tensor (quantize_mode_parse; NULL: none) */
  int64_t calibrate;         /* quantize: --calibrate N (> 0: int8 activations too, their scales calibrated
                              * on N training batches: matmul_i8; 0: none) */
  bool shrink;               /* shrink: --shrink, channels pruning's removed channels taken out of the
                              * layers (an evaluation program) */
  bool eval_only;            /* evalonly: an evaluation program (duet run --eval-only, duet compile
                              * --checkpoint): no backward graph, no optimizer, no state only they read */
  const char *optim_state;   /* optimizer: --optimizer-state int8|f32, overriding the model's
                              * adamw(state = ...) (NULL: the model's; ignored for SGD) */
  int nodes;                 /* duet plan --nodes K: the replicas are spread over K
                              * machines, the all-reduce crosses their network (0, 1: one) */
  double link_gbps;          /* --link-gbps: each machine's network link, Gb/s
                              * (0: DP_LINK_GBPS_DEFAULT) */
  struct PlanSummary *summary; /* partition_report fills it when set */
} PassCtx;

/* What partition_report estimated, for duet plan's comparison of layouts. */
typedef struct PlanSummary {
  double step_s;      /* estimated step time, the all-reduce's exposed part included */
  double allreduce_s; /* the slowest stage's all-reduce per step (0: one replica) */
  double exposed_s;   /* the part of it not hidden behind the backward pass */
  int64_t need;       /* bytes the fullest device needs */
  bool fits;          /* every device's memory holds its stage */
} PlanSummary;

typedef void (*PassFn)(Graph *g, PassCtx *cx);
typedef struct Pass {
  const char *name;
  PassFn run;
  const char *what; /* one line for `duet ir --help` */
} Pass;

/* The pipeline, in order: shape, qat, autodiff, optimizer, eval, prune, shrink, quantize, evalonly, precision,
 * fuse, partition, data_parallel, recompute, memplan. */
extern const Pass duet_passes[];
extern const int duet_n_passes;

/* Runs the pipeline on g (from the pass after cx->start_after), setting
 * g->after_pass to each pass's name as it completes.  Returns 0, or 1 after a
 * user error (reported through cx->diag) or an internal verifier failure
 * (printed to stderr). */
int passes_run(Graph *g, PassCtx *cx);
/* Index of the pass called `name`, or -1. */
int passes_find(const char *name);

void pass_shape(Graph *g, PassCtx *cx);     /* re-infer and check every shape */
void pass_autodiff(Graph *g, PassCtx *cx);  /* append d(loss)/d(param) */
void pass_optimizer(Graph *g, PassCtx *cx); /* append AdamW / SGD updates (AdamW: f32 or 8-bit state) */
void pass_eval(Graph *g, PassCtx *cx);      /* append accuracy metrics */
void pass_prune(Graph *g, PassCtx *cx);     /* pruning masks and the ops that apply them */
/* --shrink's precondition, for g before or after the prune pass: channels
 * pruning, from g's prune section with the command line's flags cli (NULL:
 * merged already) over it as pass_prune merges them.  true, or false after
 * the error "--shrink removes the output channels that channels pruning
 * zeroed: it needs --prune-mode channels ... (this program's pruning: none)"
 * (duet ir stopping before `shrink` checks it too). */
bool shrink_check(Graph *g, const PruneSpec *cli);
void pass_shrink(Graph *g, PassCtx *cx);    /* --shrink: channels pruning's zero channels removed (evaluation) */
void pass_quantize(Graph *g, PassCtx *cx);  /* int8 weights (--quantize): an evaluation program */
void pass_evalonly(Graph *g, PassCtx *cx);  /* cx->eval_only: graph_drop_training (an evaluation program) */
/* Makes g an evaluation program: removes every value of the backward and
 * optimizer roles (gradients, optimizer updates, prune_mask ops, clipping)
 * and every state tensor (OP_STATE: optimizer moments, 8-bit state codes
 * and scales, pruning masks) that no remaining value reads, clears each
 * param's grad, and renumbers.  The forward pass and the metrics are kept
 * as they were, in order.  Idempotent (a graph without training values is
 * left as it is); needs dense ids (graph_renumber), as between passes.
 * Used by the evalonly, quantize and shrink passes (passes/evalonly.c). */
void graph_drop_training(Graph *g);
void pass_qat(Graph *g, PassCtx *cx);       /* fake-quantized weights (the model's quantize section) */
void pass_precision(Graph *g, PassCtx *cx); /* 16-bit storage, f32 master weights, casts */
void pass_fuse(Graph *g, PassCtx *cx);      /* fuse elementwise chains */
void pass_partition(Graph *g, PassCtx *cx); /* devices/stages + transfer ops */
void pass_data_parallel(Graph *g, PassCtx *cx); /* all-reduce buckets of the gradients */
void pass_recompute(Graph *g, PassCtx *cx); /* activation recomputation (--recompute) */
void pass_memplan(Graph *g, PassCtx *cx);   /* offsets in param/state/arena, per device */

/* `duet plan`: prints the stage assignment of a graph that went through
 * every pass (per stage: forward ops, estimated forward/backward/optimizer
 * time from part_op_seconds, memory: weights, grads, optimizer state,
 * activations x in-flight micro-batches (M for GPipe, min(M, S - s) for
 * 1F1B), gradient accumulators; transfer bytes per step; the bubble
 * fraction (S-1)/(M+S-1), GPipe, Huang et al. 2019) to out.  Returns 1
 * when a device's memory is exceeded (the report marks it; the error goes
 * through cx->diag), else 0. */
int partition_report(const Graph *g, const PassCtx *cx, FILE *out);
/* One stage of `duet plan`'s estimate, as partition_report prints it (and
 * duet plan --format svg draws it).  Times in seconds from part_op_seconds
 * (a transfer: bytes / the link rate); bytes from the memplan regions. */
typedef struct PlanStage {
  const PartDevice *device; /* NULL: the one CPU device */
  int64_t n_ops;            /* forward ops */
  const char *first, *last; /* the stage's first and last param (NULL: none) */
  double t_f, t_b, t_o;     /* forward, backward per micro-batch; optimizer per step */
  double step_s;            /* M (t_f + t_b) + t_o */
  int64_t xfer;             /* transfer bytes sent per step */
  int64_t weights, grads, state, cache; /* params (the f32 master weights), gradient accumulators,
                             * optimizer state (this device's ZeRO shard with --zero 1), KV caches */
  int64_t act, slots;       /* the activation arena of one micro-batch, and the micro-batches in
                             * flight (M for GPipe, min(M, S - s) for 1F1B) */
  int64_t need;             /* weights + grads + state + cache + act * slots: the bytes the runtime
                             * allocates on the device (its regions and gradient accumulators; op
                             * workspaces are planned inside the activation region) */
  int64_t master;           /* the part of weights that is f32 masters of params cast to 16 bits
                             * (their 16-bit copies are activations) */
  bool fits;                /* need within the device's capacity (or no capacity) */
  int64_t state_all, state_zero; /* replicas: the whole state, and the fullest ZeRO shard */
  int64_t shard[IR_MAX_REPLICAS]; /* replicas: each one's ZeRO shard */
  int64_t host_master, host_state, host_grads; /* --offload optimizer: what the host holds for the stage (its f32
                             * param region, its state, the gradient copies); state is then 0, and
                             * grads too with one micro-batch */
} PlanStage;
/* Stage s of a graph that went through every pass (0 <= s < max(1,
 * g->n_stages)) into *ps. */
void partition_plan_stage(const Graph *g, const PassCtx *cx, int s, PlanStage *ps);
/* `duet plan`'s whole table: what the text report, --format json and
 * --format svg print. */
typedef struct PlanTable {
  const char *model;
  int S, R;
  int64_t M, batch; /* micro-batches per replica; batch: one micro-batch */
  bool one_f_one_b, zero, fits;
  PlanStage stage[IR_MAX_STAGES];
  int64_t xfer_total, need_most;
  double bubble, slowest_s, step_s, balance;
  char help[400]; /* when !fits: the settings that would lower the memory */
} PlanTable;
/* Fills t from a graph after every pass (the devices, schedule and
 * capacities of cx), stage by stage as partition_plan_stage. */
void partition_plan(const Graph *g, const PassCtx *cx, PlanTable *t);
/* Micro-batches per replica (train.micro_batches, divided among the
 * replicas with data parallelism): M of the schedule. */
int64_t partition_micro_batches(const Graph *g);
/* The memory check of partition_report without the report: for each stage
 * on a device of known capacity, the memory `duet plan` counts (weights,
 * grads, optimizer state, activations x in-flight micro-batches) must fit
 * it.  For `duet run` on its default single CPU device, which the
 * partition pass never sees.  1 after an error through cx->diag naming the
 * device, the breakdown and the capacity's source, else 0. */
int partition_check_memory(const Graph *g, const PassCtx *cx);
/* The bytes stage s needs as partition_check_memory counts them (weights,
 * grads, optimizer state, caches, activations x in-flight micro-batches),
 * from the regions memplan sized. */
int64_t partition_stage_need(const Graph *g, const PassCtx *cx, int s);
/* --offload optimizer (train_offload): the host bytes of every stage (f32
 * master params, optimizer state, gradient copies: duet plan's host row);
 * 0 without offload. */
int64_t partition_offload_host_bytes(const Graph *g, const PassCtx *cx);

/* ------------------------------------------------------------ recompute */

/* --recompute: none (keep every activation), blocks (keep only the inputs
 * of each outermost block instance, recompute the rest in the backward
 * pass), auto (recompute the blocks of a device only as far as it needs to
 * fit its capacity).  passes/recompute.c has the method and its sources. */
enum { RECOMPUTE_NONE, RECOMPUTE_BLOCKS, RECOMPUTE_AUTO };
/* RECOMPUTE_* for "none", "blocks", "auto" (NULL: none); -1 for anything else. */
int recompute_mode_parse(const char *s);

/* ---------------------------------------------------------------- prune */

/* One --prune flag of the command line into *over (its field and `set`
 * bit): --prune S (the final sparsity, in [0, 1); it turns pruning on),
 * --prune-mode unstructured|global|channels|N:M, --prune-start N,
 * --prune-end N, --prune-every N (>= 1), --prune-initial S (the gradual
 * schedule's initial sparsity), --prune-params PATTERNS.  1 when `flag` is
 * one of them and val parses, 0 when `flag` is not a prune flag, -1 with
 * the message in err ("--prune expects a sparsity in [0, 1), got '1.5'"). */
int prune_parse_flag(PruneSpec *over, const char *flag, const char *val, char *err, size_t errlen);
/* The output-channel axis of param p as a matmul or convolution weight:
 * the forward matmuls that take it as their second operand, directly (x @
 * w: its last axis; x @ transpose(w) of a matrix: the first) or as a
 * convolution (a rank-4 weight reshaped, and sliced for groups, into the
 * transposed operand: the first).  -1 when p is no such weight.
 * use[cnt[id] .. cnt[id + 1]): the forward ops that read value id. */
int prune_weight_axis(const Value *p, Value *const *use, const int *cnt);

/* ------------------------------------------------------------- quantize */

/* --quantize: none, int8 (symmetric, one f32 scale per output channel),
 * int8-tensor (one scale per weight tensor).  passes/quantize.c. */
enum { QUANT_NONE, QUANT_INT8_CHANNEL, QUANT_INT8_TENSOR };
/* QUANT_* for "none", "int8" (also "int8-channel"), "int8-tensor"; NULL:
 * none; -1 for anything else. */
int quantize_mode_parse(const char *s);

/* ------------------------------------------------------------ precision */

/* What the precision pass needs to know of a device: plain data (the
 * runtime is never asked).  `sm` is the compute capability times 10 (0: the
 * CPU). */
typedef struct DeviceCaps {
  const char *name; /* "cpu", "sm_60", ... (the --target names) */
  const char *card; /* example cards, for messages */
  int sm;
  bool fast_f16;    /* fp16 arithmetic at least at the fp32 rate (half2 on sm_60) */
  bool bf16;        /* bf16 arithmetic and conversions (sm_80 and newer) */
} DeviceCaps;
extern const int precision_n_devices;
/* The table entry called `target` ("cpu", "sm_60"), NULL if none. */
const DeviceCaps *precision_device(const char *target);
/* Entry i of the table (0 <= i < precision_n_devices), NULL outside. */
const DeviceCaps *precision_device_at(int i);

/* A resolved precision: the dtype activations and weight copies are stored
 * in, the dtype elementwise arithmetic runs in (the CPU widens to f32), and
 * whether the loss is scaled (fp16 only: its range is too small for raw
 * gradients; bf16 has f32's exponent range). */
typedef struct PrecisionChoice {
  DType storage, compute;
  bool loss_scaling;
} PrecisionChoice;

/* Resolves `request` (auto, fp32, fp16, bf16; NULL = auto) for `target`
 * (NULL = cpu).  auto: fp32 on the CPU, fp16 on sm_60/61/70/75 (sm_61 with
 * f32 arithmetic), bf16 on sm_80 and newer.  Returns 0, or -1 with a message
 * in err: an unknown target or precision, or bf16 below sm_80 (naming the
 * card). */
int precision_resolve(const char *target, const char *request, PrecisionChoice *out, char *err, size_t errlen);

/* ------------------------------------------------------- data parallel */

/* The default all-reduce bucket size, MiB (PyTorch DDP's bucket_cap_mb). */
#define DP_BUCKET_MB_DEFAULT 25.0
/* The default network link of each machine for duet plan --nodes, Gb/s:
 * 10 Gigabit Ethernet (IEEE 802.3an-2006, 10GBASE-T), the common link
 * between workstations; --link-gbps 100 for EDR InfiniBand or 100 GbE. */
#define DP_LINK_GBPS_DEFAULT 10.0
/* The bucket cap of cx in bytes (--bucket-mb x 2^20, at least 1). */
int64_t data_parallel_bucket_cap(const PassCtx *cx);
/* `duet plan` for a graph of several replicas (after every pass), after
 * partition_report, whose estimated step time is step_s: per stage, its
 * buckets' gradient bytes, the ring all-reduce time 2(N-1)/N x bytes /
 * link (Patarasuk & Yuan 2009; the link of the stage's device: the copy
 * rate assumed between virtual CPU devices, or the partition table's PCIe
 * figure), how much of it the buckets hide behind the rest of the backward
 * pass (each bucket sent in order on the link from when its last gradient
 * is made in the last micro-batch's backward pass, part_op_seconds per
 * op), and the step time with what is exposed. */
/* With cx->nodes K > 1 the replicas span K machines: each stage's ring
 * crosses the machines' network, of cx->link_gbps per machine shared by
 * the S stages' all-reduces (link / S each, when that is slower than the
 * devices' own link).  Fills cx->summary's all-reduce figures and step
 * time when set. */
void data_parallel_report(const Graph *g, const PassCtx *cx, double step_s, FILE *out);
/* ZeRO stage 1 on stage s of a graph after data_parallel (and memplan):
 * the optimizer-state bytes each replica holds into per_replica[0..R)
 * (its updates' state tensors, 64-byte aligned as planned), all of them
 * into *all; returns the fullest replica's.  With g->zero the updates'
 * shards; without, the shards --zero 1 would assign (the same rule). */
int64_t data_parallel_zero_state(const Graph *g, int s, int64_t *all, int64_t *per_replica);

#endif
