/* passes/evalonly.c: the evaluation program (the `evalonly` pass), and
 * graph_drop_training, which every evaluation program's pass shares.
 *
 * `duet run M.model --eval-only --checkpoint CK` and `duet compile
 * --checkpoint CK` evaluate trained params and train nothing, so the pass
 * (run when PassCtx.eval_only is set) takes the training out of the graph:
 * the backward graph, the optimizer updates, and the state only they read
 * (AdamW's moments, SGD's momentum, 8-bit state's codes and scales, the
 * pruning masks and the prune_mask ops that apply them).  What is left is
 * the forward pass and the metrics (pass_eval's): the runtime allocates the
 * params and the activation arena of the forward pass, no gradients, no
 * optimizer state, and the evaluation computes exactly what the training
 * program's evaluation schedule computes (the same ops in the same order:
 * the same kernels after fuse, the same numbers).  A program without
 * backward and optimizer values cannot train: codegen marks it
 * (DuetProgram.eval_program) and the runtime refuses training it.
 *
 * The quantize and shrink passes make evaluation programs of their own
 * and call graph_drop_training first; this pass, after them, finds
 * nothing more to drop then. */
#include <string.h>

#include "passes.h"

void graph_drop_training(Graph *g) {
  Arena *a = g->arena;
  int n = g->n_values;
  Value **v = g->values;
  bool *drop = arena_alloc(a, (size_t)n + 1);
  for (int i = 0; i < n; i++) drop[i] = v[i]->role == ROLE_BACKWARD || v[i]->role == ROLE_OPTIMIZER;
  /* state only they read goes with them; a state read by a kept value
   * stays (none is today: masks and moments are read by the optimizer) */
  int *live_uses = arena_alloc(a, ((size_t)n + 1) * sizeof *live_uses);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < v[i]->n_in && !drop[i]; j++) live_uses[v[i]->in[j]->id]++;
  for (int i = 0; i < n; i++) {
    if (v[i]->op == OP_STATE && !live_uses[i]) drop[i] = true;
    if (v[i]->op == OP_PARAM) v[i]->grad = NULL;
  }
  int k = 0;
  for (int i = 0; i < n; i++)
    if (!drop[i]) v[k++] = v[i];
  g->n_values = k;
  graph_renumber(g);
  graph_count_uses(g);
}

void pass_evalonly(Graph *g, PassCtx *cx) {
  if (cx->eval_only) graph_drop_training(g);
}
