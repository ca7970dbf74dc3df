/* passes/recompute.c: activation recomputation (gradient checkpointing).
 *
 * The frontend marks every value an outermost block call computes with the
 * call's instance number (Value.block; each `repeat` iteration is an
 * instance).  For a block chosen for recomputation, a forward value of the
 * block is *recomputable* when no forward, eval or optimizer op outside the
 * block reads it, it is not the loss, the logits or the labels, and it is an
 * ordinary op of the block's device (not an input, param, state, constant,
 * transfer or side effect).  Everything else is kept: the inputs of the
 * block (the values of other blocks and of the top level it reads), and the
 * values later blocks read (its output).
 *
 * The backward pass then reads no recomputable value: right before the first
 * backward op that reads one of block b's (on a device), the pass inserts
 * copies of the forward ops of block b that the backward pass reads on that
 * device, with the recomputable ops they depend on, in forward order and with
 * role backward, and points every backward op at the copies.  The memory
 * planner, which frees a value after its last use in graph order, then frees
 * the block's forward activations after the forward pass; they live again
 * only while the block's backward ops run (Chen et al. 2016, "Training Deep
 * Nets with Sublinear Memory Cost", arXiv:1604.06174, section 3: one
 * recomputation of each segment's forward pass, with segments given here by
 * the model's blocks).
 *
 * A copy is the same op on the same operands (the kept values or earlier
 * copies), so it computes the same bits: a dropout copy has its original's
 * site and runs in the same micro-batch, whose seed keys the mask (codegen:
 * dropout_keep(step seed, site, element)).
 *
 * --recompute auto chooses the blocks: for each device with a capacity
 * (PartDevice.capacity) that the plan without recomputation exceeds, blocks
 * of that device are recomputed one at a time, the block that frees the
 * most activation bytes per recomputed FLOP first, and the memory planner
 * rerun after each, until the device fits (or every block of it is
 * recomputed: the memory check after memplan then reports what is missing).
 * A greedy approximation of the choice with the fewest recomputed FLOPs
 * under the budget, exact when the blocks are alike (a transformer's
 * layers: it recomputes the fewest blocks); not the optimal dynamic
 * programme of Beaumont et al. 2019 (rotor), which also chooses multi-level
 * schedules. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

int recompute_mode_parse(const char *s) {
  if (!s) return RECOMPUTE_NONE;
  if (!strcmp(s, "none")) return RECOMPUTE_NONE;
  if (!strcmp(s, "blocks")) return RECOMPUTE_BLOCKS;
  if (!strcmp(s, "auto")) return RECOMPUTE_AUTO;
  return -1;
}

/* What an application of the transformation changed, to undo it. */
typedef struct Undo {
  Value **values;
  int n_values, cap_values;
  Value **users;   /* backward ops whose operand arrays were replaced */
  Value ***old_in; /* ... and their old arrays */
  int n;
} Undo;

/* May x be recomputed, its block being chosen (sel[x->block])? */
static bool recomputable(const Graph *g, const Value *x, const bool *sel) {
  if (x->role != ROLE_FORWARD || x->block <= 0 || !sel[x->block]) return false;
  if (x->op == OP_INPUT || x->op == OP_PARAM || x->op == OP_STATE || x->op == OP_CONST || x->op == OP_TRANSFER ||
      (op_info[x->op].flags & OPF_SIDE) || x->dtype == DT_VOID)
    return false;
  return x != g->loss && x != g->logits && x != g->labels;
}

static int max_block(const Graph *g) {
  int nb = 0;
  for (int i = 0; i < g->n_values; i++)
    if (g->values[i]->block > nb) nb = g->values[i]->block;
  return nb;
}

/* Applies the transformation to the blocks b with sel[b] (0 <= b <= nb);
 * returns the number of copies made.  With undo, records what to restore. */
static int apply(Graph *g, const bool *sel, Undo *undo) {
  int n = g->n_values;
  Arena *a = g->arena;
  if (undo) {
    *undo = (Undo){.values = g->values, .n_values = n, .cap_values = g->cap_values};
    undo->users = arena_alloc(a, ((size_t)n + 1) * sizeof *undo->users);
    undo->old_in = arena_alloc(a, ((size_t)n + 1) * sizeof *undo->old_in);
  }
  /* ok[i]: values[i] is recomputable (no use by a non-backward op outside its block) */
  bool *ok = arena_alloc(a, (size_t)n + 1);
  bool *used_back = arena_alloc(a, (size_t)n + 1);
  for (int i = 0; i < n; i++) ok[i] = recomputable(g, g->values[i], sel);
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    for (int j = 0; j < u->n_in; j++) {
      Value *x = u->in[j];
      if (!ok[x->id]) continue;
      if (u->role == ROLE_BACKWARD) used_back[x->id] = true;
      else if (u->role != ROLE_FORWARD || u->block != x->block || u->device != x->device) ok[x->id] = false;
    }
  }
  int n_need = 0;
  for (int i = 0; i < n; i++) n_need += ok[i] && used_back[i];
  if (!n_need) return 0;
  /* the values of each block in graph order (a block's values are contiguous
   * lists through next[]) */
  int nb = max_block(g);
  int *head = arena_alloc(a, ((size_t)nb + 1) * sizeof *head), *tail = arena_alloc(a, ((size_t)nb + 1) * sizeof *tail);
  int *next = arena_alloc(a, ((size_t)n + 1) * sizeof *next);
  for (int b = 0; b <= nb; b++) head[b] = tail[b] = -1;
  for (int i = 0; i < n; i++) {
    next[i] = -1;
    if (!ok[i]) continue;
    int b = g->values[i]->block;
    if (tail[b] < 0) head[b] = i;
    else next[tail[b]] = i;
    tail[b] = i;
  }
  Value **copy = arena_alloc(a, ((size_t)n + 1) * sizeof *copy);
  bool *want = arena_alloc(a, (size_t)n + 1);
  int cap = 2 * n + 1;
  Value **out = arena_alloc(a, (size_t)cap * sizeof *out);
  int k = 0, made = 0;
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    if (u->role == ROLE_BACKWARD) {
      bool changed = false;
      for (int j = 0; j < u->n_in; j++) {
        Value *x = u->in[j];
        if (!ok[x->id]) continue;
        changed = true;
        if (copy[x->id]) continue;
        /* the first backward read of block b on this device: copy what the
         * backward pass reads of it there, and what that depends on */
        int b = x->block, dev = x->device;
        int m = 0;
        for (int t = head[b]; t >= 0; t = next[t]) {
          Value *y = g->values[t];
          want[t] = y->device == dev && used_back[t] && !copy[t];
          m = t;
        }
        for (int t = m; t >= head[b]; t--) {
          if (!want[t]) continue;
          Value *y = g->values[t];
          for (int q = 0; q < y->n_in; q++)
            if (ok[y->in[q]->id] && !copy[y->in[q]->id]) want[y->in[q]->id] = true;
        }
        for (int t = head[b]; t >= 0; t = next[t]) {
          if (!want[t]) continue;
          want[t] = false;
          Value *y = g->values[t], *c = arena_alloc(a, sizeof *c);
          *c = *y;
          c->in = arena_alloc(a, (size_t)(y->n_in ? y->n_in : 1) * sizeof *c->in);
          for (int q = 0; q < y->n_in; q++) c->in[q] = copy[y->in[q]->id] ? copy[y->in[q]->id] : y->in[q];
          c->role = ROLE_BACKWARD;
          c->n_uses = 0;
          c->grad = NULL;
          c->region = MEM_NONE;
          c->offset = 0;
          copy[t] = c;
          if (k == cap) {
            Value **grown = arena_alloc(a, (size_t)cap * 2 * sizeof *grown);
            memcpy(grown, out, (size_t)k * sizeof *out);
            out = grown;
            cap *= 2;
          }
          out[k++] = c;
          made++;
        }
      }
      if (changed) {
        Value **in = arena_alloc(a, (size_t)u->n_in * sizeof *in);
        for (int j = 0; j < u->n_in; j++) in[j] = ok[u->in[j]->id] ? copy[u->in[j]->id] : u->in[j];
        if (undo) {
          undo->users[undo->n] = u;
          undo->old_in[undo->n++] = u->in;
        }
        u->in = in;
      }
    }
    if (k == cap) {
      Value **grown = arena_alloc(a, (size_t)cap * 2 * sizeof *grown);
      memcpy(grown, out, (size_t)k * sizeof *out);
      out = grown;
      cap *= 2;
    }
    out[k++] = u;
  }
  if (k > GRAPH_MAX_VALUES)
    diag_error_noloc(g->diag, "recomputation would make the graph more than %d values", GRAPH_MAX_VALUES);
  g->values = out;
  g->n_values = k;
  g->cap_values = cap;
  graph_renumber(g);
  graph_count_uses(g);
  return made;
}

static void undo_apply(Graph *g, const Undo *u) {
  for (int i = u->n - 1; i >= 0; i--) u->users[i]->in = u->old_in[i];
  g->values = u->values;
  g->n_values = u->n_values;
  g->cap_values = u->cap_values;
  graph_renumber(g);
  graph_count_uses(g);
}

/* The first stage whose planned memory exceeds its device's capacity after
 * memplan, or -1. */
static int stage_over(Graph *g, PassCtx *cx, const PartDevice *devs, int n_devs) {
  int S = g->n_stages > 1 ? g->n_stages : 1;
  pass_memplan(g, cx);
  for (int s = 0; s < S && s < n_devs; s++)
    if (devs[s].capacity > 0 && partition_stage_need(g, cx, s) > devs[s].capacity) return s;
  return -1;
}

/* auto: see the file comment.  Sets sel[b] for the blocks to recompute. */
static void choose_auto(Graph *g, PassCtx *cx, bool *sel, int nb) {
  int S = g->n_stages > 1 ? g->n_stages : 1;
  const PartDevice *devs = cx->devices ? cx->devices : cx->budget_device;
  int n_devs = cx->devices ? cx->n_devices : cx->budget_device ? 1 : 0;
  bool any_budget = false;
  for (int s = 0; s < S && s < n_devs; s++) any_budget |= devs[s].capacity > 0;
  if (!any_budget) {
    if (cx->diag->out)
      fprintf(cx->diag->out, "duet: note: --recompute auto has no memory budget (no device capacity is known): "
              "nothing is recomputed\n");
    return;
  }
  /* per block: its device, the bytes of its forward values the backward pass
   * reads (freed by recomputing it), and the FLOPs of its forward ops */
  int n = g->n_values;
  int *dev = arena_alloc(g->arena, ((size_t)nb + 1) * sizeof *dev);
  double *bytes = arena_alloc(g->arena, ((size_t)nb + 1) * sizeof *bytes);
  double *flops = arena_alloc(g->arena, ((size_t)nb + 1) * sizeof *flops);
  bool *all = arena_alloc(g->arena, (size_t)nb + 1), *back = arena_alloc(g->arena, (size_t)n + 1);
  for (int b = 1; b <= nb; b++) all[b] = true, dev[b] = -1;
  for (int i = 0; i < n; i++)
    if (g->values[i]->role == ROLE_BACKWARD)
      for (int q = 0; q < g->values[i]->n_in; q++) back[g->values[i]->in[q]->id] = true;
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    if (!recomputable(g, v, all)) continue;
    double f, by;
    part_op_cost(v, &f, &by);
    flops[v->block] += f;
    if (dev[v->block] < 0) dev[v->block] = v->device < 0 ? 0 : v->device;
    if (back[i]) bytes[v->block] += (double)dtype_size(v->dtype) * (double)shape_numel(&v->shape);
  }
  for (;;) {
    Undo u;
    apply(g, sel, &u);
    int over = stage_over(g, cx, devs, n_devs);
    undo_apply(g, &u);
    if (over < 0) break;
    int best = -1;
    double best_ratio = -1;
    for (int b = 1; b <= nb; b++) {
      if (sel[b] || dev[b] != over || bytes[b] <= 0) continue;
      double r = bytes[b] / (flops[b] + 1.0);
      if (r > best_ratio) best_ratio = r, best = b;
    }
    if (best < 0) break; /* every block of the device is recomputed: memplan's check reports the rest */
    sel[best] = true;
  }
  /* the trial plans leave no trace: memplan runs after this pass */
  for (int i = 0; i < g->n_values; i++) g->values[i]->region = MEM_NONE, g->values[i]->offset = 0;
  memset(g->region_bytes, 0, sizeof g->region_bytes);
  memset(g->stage_bytes, 0, sizeof g->stage_bytes);
}

void pass_recompute(Graph *g, PassCtx *cx) {
  const char *req = cx->recompute ? cx->recompute : g->train.recompute;
  int mode = recompute_mode_parse(req);
  if (mode < 0) diag_error_noloc(g->diag, "unknown --recompute `%s` (none, blocks, auto)", req);
  if (mode == RECOMPUTE_NONE || g->decode) return;
  int nb = max_block(g);
  if (nb == 0) return;
  bool *sel = arena_alloc(g->arena, (size_t)nb + 1);
  if (mode == RECOMPUTE_BLOCKS) {
    for (int b = 1; b <= nb; b++) sel[b] = true;
  } else {
    choose_auto(g, cx, sel, nb);
  }
  apply(g, sel, NULL);
}
