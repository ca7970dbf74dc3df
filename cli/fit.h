/* cli/fit.h: `duet plan --fit` (the search over memory and pipeline
 * settings) and `duet plan --format json` (the plan table for tools). */
#ifndef DUET_FIT_H
#define DUET_FIT_H

#include <stdio.h>

#include "../passes/passes.h"

#define FIT_MAX_DEVICES 64

/* One configuration of the search: the settings, then what its plan said. */
typedef struct FitCand {
  int stages;            /* devices per replica used (the first `stages` of each group) */
  int64_t micro_batches; /* per replica */
  bool one_f_one_b;
  const char *recompute; /* "none", "blocks", "auto" */
  const char *precision; /* "fp32", "fp16", "bf16" */
  const char *optim_state; /* "f32", "int8"; NULL: the optimizer has no state choice (SGD) */
  int zero;              /* ZeRO stage 1 (replicas > 1 only) */
  const char *offload;   /* "optimizer" (--offload optimizer), or NULL (none) */
  /* results */
  bool compiled;         /* the plan was made (else: the partition found no split within the memory, or
                          * another error; the memory figures are then those of an unbounded plan) */
  bool fits;
  double step_s;         /* the plan's estimated step time (all-reduce included) */
  double rank_s;         /* the time ranked: step_s, or on CPU devices the fp32 twin's (16 bits do not speed
                          * the CPU's kernels, which widen to f32) */
  int64_t need_most;     /* the fullest device's bytes */
  int64_t over;          /* the largest excess over a device's capacity (0: fits) */
  char over_device[64];  /* the device of that excess */
} FitCand;

/* Plans one candidate: fills its results (and *t, the plan's table, when
 * it compiled).  0, or -1 when it cannot be planned at all (then it is
 * left out: an unsupported combination). */
typedef int (*FitPlanFn)(void *ctx, FitCand *k, PlanTable *t);

/* The search space and how to print the command line. */
typedef struct FitSpace {
  const char *model;
  int64_t batch;         /* the global batch (the model's or --batch) */
  bool batch_given;      /* --batch was given: repeat it in the command line */
  int group;             /* devices per replica (--devices split into --data-parallel groups) */
  int replicas;          /* --data-parallel (1: none) */
  bool adamw;            /* the optimizer is AdamW (--optimizer-state int8 applies) */
  bool cpu;              /* the devices are CPUs (16-bit storage gains no time) */
  const char *arch;      /* the precision target: NULL/"cpu", "sm_60" ... (bf16 needs sm_80) */
  const char *run_devices[FIT_MAX_DEVICES]; /* the names duet run takes, per device of the list */
  int n_devices;
  const char *threads;   /* --threads, repeated in the command line (NULL: not given) */
  const char *device_memory; /* --device-memory as given (NULL: not given) */
} FitSpace;

/* Searches the space (cli/fit.c has the order and the cost model), prints
 * the ranked candidates and the best one's `duet run` command line (or,
 * when none fits, by how much per device and which setting helps most) to
 * out, and copies the chosen candidate to *best.  0 when one fits, 1 when
 * none does, -1 out of memory. */
int fit_search(const FitSpace *sp, FitPlanFn plan, void *ctx, FILE *out, bool quiet, FitCand *best);

/* The `duet run` command line of candidate k into buf. */
void fit_command(const FitSpace *sp, const FitCand *k, char *buf, size_t n);

/* The plan table as one JSON object (cJSON): model, stages, replicas,
 * micro_batches, batch, schedule, transfer_bytes, bubble, step_ms, fits,
 * devices: [{device, capacity, weights, master_weights, grads,
 * optimizer_state, activations, activations_per_micro_batch,
 * micro_batches_in_flight, cache, workspace, total, fits}] in bytes;
 * with `chosen` (--fit): its settings and command line.  0, or -1 when
 * out of memory. */
int plan_print_json(const PlanTable *t, const FitSpace *sp, const FitCand *chosen, FILE *out);

#endif
