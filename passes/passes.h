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
} PassCtx;

typedef void (*PassFn)(Graph *g, PassCtx *cx);
typedef struct Pass {
  const char *name;
  PassFn run;
  const char *what; /* one line for `duet ir --help` */
} Pass;

/* The pipeline, in order: shape, autodiff, optimizer, eval, fuse, memplan. */
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
void pass_fuse(Graph *g, PassCtx *cx);      /* fuse elementwise chains */
void pass_memplan(Graph *g, PassCtx *cx);   /* offsets in param/state/arena */

#endif
