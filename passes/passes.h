/* passes/passes.h: Graph -> Graph passes, run as one named, linear list. */
#ifndef DUET_PASSES_H
#define DUET_PASSES_H

#include "../ir/ir.h"

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
} PassCtx;

typedef void (*PassFn)(Graph *g, PassCtx *cx);
typedef struct Pass {
  const char *name;
  PassFn run;
  const char *what; /* one line for `duet ir --help` */
} Pass;

/* The pipeline, in order: shape, autodiff, optimizer, eval, precision, fuse,
 * memplan. */
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
void pass_optimizer(Graph *g, PassCtx *cx); /* append AdamW / SGD updates */
void pass_eval(Graph *g, PassCtx *cx);      /* append accuracy metrics */
void pass_precision(Graph *g, PassCtx *cx); /* 16-bit storage, f32 master weights, casts */
void pass_fuse(Graph *g, PassCtx *cx);      /* fuse elementwise chains */
void pass_memplan(Graph *g, PassCtx *cx);   /* offsets in param/state/arena */

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

#endif
