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
 * Nets with Sublinear Memory Cost", arXiv:1604.06174: one recomputation of
 * each segment's forward pass, with segments given here by the model's
 * blocks).
 *
 * A copy is the same op on the same operands (the kept values or earlier
 * copies), so it computes the same bits: a dropout copy has its original's
 * site and runs in the same micro-batch, whose seed keys the mask (codegen:
 * dropout_keep(step seed, site, element)).
 *
 * --recompute auto recomputes only as much as each device needs to fit
 * its capacity (PartDevice.capacity), with as few recomputed FLOPs as it
 * finds:
 *   1. greedy, single level: blocks of a device whose plan exceeds its
 *      capacity are recomputed one at a time (the scheme above), the block
 *      that frees the most activation bytes per recomputed FLOP first, and
 *      the memory planner rerun after each, until the device fits (or
 *      every block on it is recomputed: memplan's check then reports what
 *      is missing);
 *   2. on one device whose blocks form a chain (each block reads, of other
 *      blocks' values, only the previous block's outputs), the dynamic
 *      programme of Beaumont, Eyraud-Dubois, Herrmann, Joly and Shilova
 *      2019, "Optimal checkpointing for heterogeneous chains: how to train
 *      deep neural networks with limited memory" (arXiv:1911.13214; rotor),
 *      over the blocks as stages: it may also drop a block's output and
 *      recompute it from an earlier checkpoint (several levels, a block
 *      recomputed more than once).  Its memory model (each stage's outputs
 *      x and what its backward pass reads, x-bar, in ROTOR_UNITS units of
 *      the chain's total) leaves out the rest of the graph, so the schedule
 *      of every budget is lowered into copies and planned by memplan, and
 *      the one that fits with the fewest recomputed FLOPs is applied when
 *      it beats the greedy choice.
 * A copy computes the bits of its original whatever the level, so the
 * schedules train as the graph without recomputation does. */
#include <math.h>
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

static int choose_rotor(Graph *g, PassCtx *cx, const PartDevice *dev, int nb, double greedy_flops);

/* The FLOPs of the recomputed copies in the graph (backward values of a block). */
static double copy_flops(const Graph *g) {
  double sum = 0;
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    if (v->block <= 0 || v->role != ROLE_BACKWARD) continue;
    double f, by;
    part_op_cost(v, &f, &by);
    sum += f;
  }
  return sum;
}

/* The trial plans of auto leave no trace: memplan runs after this pass. */
static void clear_plan(Graph *g) {
  for (int i = 0; i < g->n_values; i++) g->values[i]->region = MEM_NONE, g->values[i]->offset = 0;
  memset(g->region_bytes, 0, sizeof g->region_bytes);
  memset(g->stage_bytes, 0, sizeof g->stage_bytes);
}

/* auto: see the file comment.  Sets sel[b] for the blocks to recompute and
 * returns false, or returns true after applying a rotor schedule. */
static bool choose_auto(Graph *g, PassCtx *cx, bool *sel, int nb) {
  int S = g->n_stages > 1 ? g->n_stages : 1;
  const PartDevice *devs = cx->devices ? cx->devices : cx->budget_device;
  int n_devs = cx->devices ? cx->n_devices : cx->budget_device ? 1 : 0;
  bool any_budget = false;
  for (int s = 0; s < S && s < n_devs; s++) any_budget |= devs[s].capacity > 0;
  if (!any_budget) {
    if (cx->diag->out)
      fprintf(cx->diag->out, "duet: note: --recompute auto has no memory budget (no device capacity is known): "
              "nothing is recomputed\n");
    return false;
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
  bool any = false;
  for (int b = 1; b <= nb; b++) any |= sel[b];
  if (S == 1 && any) { /* one device: a rotor schedule that fits with fewer recomputed FLOPs wins */
    Undo u;
    apply(g, sel, &u);
    double gf = stage_over(g, cx, devs, n_devs) < 0 ? copy_flops(g) : INFINITY;
    undo_apply(g, &u);
    if (!choose_rotor(g, cx, devs, nb, gf)) {
      clear_plan(g);
      return true;
    }
  }
  clear_plan(g);
  return false;
}

/* ------------------------------------------------------------------ rotor */

/* A chain of blocks on one device: stage i + 1 reads, of the values of
 * other blocks, only stage i's outputs (and params, inputs, constants). */
typedef struct Chain {
  int n;
  int *blk; /* block of stage i */
} Chain;

enum { ACT_FCK, ACT_FALL, ACT_B };
typedef struct Act {
  int kind, stage;
} Act;

typedef struct Rotor {
  Graph *g;
  int n;          /* values of the graph the chain was found in */
  int nb;         /* blocks */
  bool *cl;       /* cl[id]: clonable forward value of a chain block */
  bool *outv;     /* outv[id]: cl and read by a forward op outside its block (a stage output) */
  bool *bread;    /* bread[id]: read by a backward op */
  int *stage_of;  /* stage of block b in the chain, -1 when in none */
  Chain ch;
  double *uf;     /* FLOPs of stage i's forward ops */
  int *xu, *xbu;  /* memory units: stage i's outputs; its outputs and what its backward reads */
  int K;          /* budget units */
  double *C;      /* C[(s * L + t) * (K + 1) + m] */
  int *choice;    /* -1: all; s' > s: checkpoint the output of s' - 1 */
  Act *act;
  int n_act;
} Rotor;

static bool clonable(const Graph *g, const Value *x) {
  if (x->role != ROLE_FORWARD || x->block <= 0) return false;
  if (x->op == OP_INPUT || x->op == OP_PARAM || x->op == OP_STATE || x->op == OP_CONST || x->op == OP_TRANSFER ||
      (op_info[x->op].flags & OPF_SIDE) || x->dtype == DT_VOID)
    return false;
  return x != g->loss && x != g->logits && x != g->labels;
}

/* Finds the one chain of the graph's blocks (one device): 0, or -1 when
 * the blocks do not form one (a skip over a block, a block on two devices,
 * a top-level op between two blocks: the greedy choice is used then). */
static int rotor_chain(Rotor *R) {
  Graph *g = R->g;
  Arena *a = g->arena;
  int n = R->n = g->n_values, nb = R->nb;
  R->cl = arena_alloc(a, (size_t)n + 1);
  R->outv = arena_alloc(a, (size_t)n + 1);
  R->bread = arena_alloc(a, (size_t)n + 1);
  R->stage_of = arena_alloc(a, ((size_t)nb + 1) * sizeof *R->stage_of);
  int *pred = arena_alloc(a, ((size_t)nb + 1) * sizeof *pred); /* 0: none yet, -1: not a chain link */
  int *order = arena_alloc(a, ((size_t)nb + 1) * sizeof *order), n_order = 0;
  bool *seen = arena_alloc(a, (size_t)nb + 1);
  for (int i = 0; i < n; i++) R->cl[i] = clonable(g, g->values[i]);
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    if (u->block > 0 && u->role == ROLE_FORWARD && !seen[u->block]) seen[u->block] = true, order[n_order++] = u->block;
    for (int j = 0; j < u->n_in; j++) {
      Value *x = u->in[j];
      if (u->role == ROLE_BACKWARD) R->bread[x->id] = true;
      if (u->role == ROLE_BACKWARD || x->block == u->block) continue;
      if (R->cl[x->id]) R->outv[x->id] = true;
      if (u->role != ROLE_FORWARD || u->block <= 0) continue;
      /* a forward op of block u->block reads x of another block or of the top level */
      if (x->op == OP_PARAM || x->op == OP_INPUT || x->op == OP_STATE || x->op == OP_CONST) continue;
      int b = R->cl[x->id] ? x->block : -1;
      if (pred[u->block] == 0) pred[u->block] = b;
      else if (pred[u->block] != b) pred[u->block] = -1;
    }
  }
  if (n_order < 2) return -1;
  R->ch.blk = arena_alloc(a, (size_t)n_order * sizeof *R->ch.blk);
  for (int b = 0; b <= nb; b++) R->stage_of[b] = -1;
  for (int k = 0; k < n_order; k++) {
    int b = order[k];
    if (k > 0 && pred[b] != order[k - 1]) return -1;
    R->ch.blk[k] = b;
    R->stage_of[b] = k;
  }
  R->ch.n = n_order;
  /* the top level reads only the last stage's outputs of the chain (its
   * input excepted): a forward op between two blocks breaks the chain */
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    if (u->role != ROLE_FORWARD || u->block > 0) continue;
    for (int j = 0; j < u->n_in; j++)
      if (R->cl[u->in[j]->id] && u->in[j]->block != order[n_order - 1]) return -1;
  }
  return 0;
}

static double *rc_C(Rotor *R, int s, int t) { return &R->C[((size_t)s * (size_t)R->ch.n + (size_t)t) * (size_t)(R->K + 1)]; }
static int *rc_ch(Rotor *R, int s, int t) { return &R->choice[((size_t)s * (size_t)R->ch.n + (size_t)t) * (size_t)(R->K + 1)]; }

/* The dynamic programme of Beaumont et al. 2019 (rotor), without backward
 * costs (every stage's backward runs once in any schedule):
 * C(s, t, m), the least forward work to run the backward passes of stages
 * s..t with the input of s kept and m units of memory, is
 *   C(s, s, m) = uf[s]                                    (m >= xb[s])
 *   C(s, t, m) = min( uf[s] + C(s + 1, t, m - xb[s])      (m >= xb[s]: s keeps all)
 *                     min over s < s' <= t of
 *                       uf[s..s'-1] + C(s', t, m - x[s'-1]) + C(s, s'-1, m) )
 *                                                         (m >= x[s'-1]: a checkpoint)
 * O(L^3 K) time for L stages and K units. */
static void rotor_dp(Rotor *R) {
  int L = R->ch.n, K = R->K;
  size_t cells = (size_t)L * (size_t)L * (size_t)(K + 1);
  R->C = arena_alloc(R->g->arena, cells * sizeof *R->C);
  R->choice = arena_alloc(R->g->arena, cells * sizeof *R->choice);
  double *pre = arena_alloc(R->g->arena, ((size_t)L + 1) * sizeof *pre);
  for (int i = 0; i < L; i++) pre[i + 1] = pre[i] + R->uf[i];
  for (int d = 0; d < L; d++)
    for (int s = 0; s + d < L; s++) {
      int t = s + d;
      double *c = rc_C(R, s, t);
      int *ch = rc_ch(R, s, t);
      for (int m = 0; m <= K; m++) {
        double best = INFINITY;
        int bc = -1;
        if (m >= R->xbu[s]) best = d == 0 ? R->uf[s] : R->uf[s] + rc_C(R, s + 1, t)[m - R->xbu[s]];
        for (int s2 = s + 1; s2 <= t; s2++) {
          if (m < R->xu[s2 - 1]) continue;
          double v = pre[s2] - pre[s] + rc_C(R, s2, t)[m - R->xu[s2 - 1]] + rc_C(R, s, s2 - 1)[m];
          if (v < best) best = v, bc = s2;
        }
        c[m] = best;
        ch[m] = bc;
      }
    }
}

static void rotor_push(Rotor *R, int kind, int stage) { R->act[R->n_act++] = (Act){kind, stage}; }

/* The schedule of C(s, t, m) as actions: forward of a stage keeping only
 * its outputs (FCK) or all its backward reads (FALL), backward (B). */
static void rotor_emit(Rotor *R, int s, int t, int m) {
  int c = rc_ch(R, s, t)[m];
  if (c < 0) {
    rotor_push(R, ACT_FALL, s);
    if (t > s) rotor_emit(R, s + 1, t, m - R->xbu[s]);
    rotor_push(R, ACT_B, s);
    return;
  }
  for (int k = s; k < c; k++) rotor_push(R, ACT_FCK, k);
  rotor_emit(R, c, t, m - R->xu[c - 1]);
  rotor_emit(R, s, c - 1, m);
}

/* Copies stage k's forward ops (its outputs and their ancestors; with all,
 * also what its backward reads), reading the latest copies cur[] of other
 * stages, into out[]; the copies become the latest. */
static void rotor_copy(Rotor *R, int k, bool all, Value **cur, Value ***out, int *n_out, int *cap, bool *want) {
  Graph *g = R->g;
  int b = R->ch.blk[k], first = -1, last = -1;
  for (int i = 0; i < R->n; i++) {
    Value *v = g->values[i];
    want[i] = false;
    if (!R->cl[i] || v->block != b) continue;
    if (first < 0) first = i;
    last = i;
    want[i] = R->outv[i] || (all && R->bread[i]);
  }
  for (int i = last; i >= first && i >= 0; i--) {
    if (!want[i]) continue;
    Value *v = g->values[i];
    for (int q = 0; q < v->n_in; q++)
      if (R->cl[v->in[q]->id] && v->in[q]->block == b) want[v->in[q]->id] = true;
  }
  for (int i = first; i <= last && i >= 0; i++) {
    if (!want[i]) continue;
    Value *y = g->values[i], *c = arena_alloc(g->arena, sizeof *c);
    *c = *y;
    c->in = arena_alloc(g->arena, (size_t)(y->n_in ? y->n_in : 1) * sizeof *c->in);
    for (int q = 0; q < y->n_in; q++) c->in[q] = cur[y->in[q]->id] ? cur[y->in[q]->id] : y->in[q];
    c->role = ROLE_BACKWARD;
    c->n_uses = 0;
    c->grad = NULL;
    c->region = MEM_NONE;
    c->offset = 0;
    if (*n_out == *cap) {
      Value **grown = arena_alloc(g->arena, (size_t)*cap * 2 * sizeof *grown);
      memcpy(grown, *out, (size_t)*n_out * sizeof **out);
      *out = grown;
      *cap *= 2;
    }
    (*out)[(*n_out)++] = c;
    cur[i] = c;
  }
}

/* Lowers R->act into the graph; records what to undo.  The actions up to
 * the first backward action are the first sweep, which the forward pass
 * already is (every stage once, in order: FCK there only means that the
 * backward pass will not read the originals).  Every later forward action
 * copies its stage's ops (outputs and their ancestors; FALL also what the
 * backward pass reads), reading the latest copies of the other stages'
 * values; the actions between B(l + 1) and B(l) go right before the first
 * backward op that reads a value of stage l other than its outputs, and
 * every backward op reads the latest copy of each forward value.  The
 * memory planner's liveness then follows the schedule.  -1 (graph
 * unchanged) when the backward pass does not visit the stages in reverse
 * order or the actions are not such a schedule. */
static int rotor_apply(Rotor *R, Undo *undo) {
  Graph *g = R->g;
  Arena *a = g->arena;
  int n = R->n, L = R->ch.n;
  /* pos[l]: the first backward op that reads a value of stage l other than
   * its outputs (the group of actions before B(l) goes there) */
  int *pos = arena_alloc(a, ((size_t)L + 1) * sizeof *pos);
  for (int l = 0; l < L; l++) pos[l] = -1;
  int first_back = n;
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    if (u->role != ROLE_BACKWARD) continue;
    if (first_back == n) first_back = i;
    for (int j = 0; j < u->n_in; j++) {
      Value *x = u->in[j];
      if (!R->cl[x->id] || R->outv[x->id]) continue;
      int l = R->stage_of[x->block];
      if (l >= 0 && pos[l] < 0) pos[l] = i;
    }
  }
  for (int l = L - 1; l >= 0; l--) {
    if (pos[l] < 0) pos[l] = l == L - 1 ? first_back : pos[l + 1];
    if (l < L - 1 && pos[l] < pos[l + 1]) return -1;
  }
  /* the groups: actions after the first backward action, split at each B */
  int *gstart = arena_alloc(a, ((size_t)L + 1) * sizeof *gstart), *gend = arena_alloc(a, ((size_t)L + 1) * sizeof *gend);
  int k = 0, next_first = 0;
  while (k < R->n_act && R->act[k].kind != ACT_B) { /* the first sweep: every stage once, in order */
    if (R->act[k].stage != next_first) return -1;
    next_first++;
    k++;
  }
  if (next_first != L) return -1;
  for (int l = L - 1; l >= 0; l--) {
    gstart[l] = k;
    while (k < R->n_act && R->act[k].kind != ACT_B) k++;
    gend[l] = k;
    if (k >= R->n_act || R->act[k].stage != l) return -1;
    k++;
  }
  *undo = (Undo){.values = g->values, .n_values = n, .cap_values = g->cap_values};
  undo->users = arena_alloc(a, ((size_t)n + 1) * sizeof *undo->users);
  undo->old_in = arena_alloc(a, ((size_t)n + 1) * sizeof *undo->old_in);
  Value **cur = arena_alloc(a, ((size_t)n + 1) * sizeof *cur);
  bool *want = arena_alloc(a, (size_t)n + 1);
  int cap = 2 * n + 1, n_out = 0;
  Value **out = arena_alloc(a, (size_t)cap * sizeof *out);
  int l = L - 1;
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    for (; l >= 0 && pos[l] == i; l--)
      for (int q = gstart[l]; q < gend[l]; q++)
        rotor_copy(R, R->act[q].stage, R->act[q].kind == ACT_FALL, cur, &out, &n_out, &cap, want);
    if (u->role == ROLE_BACKWARD) {
      bool changed = false;
      for (int j = 0; j < u->n_in; j++) changed |= cur[u->in[j]->id] != NULL;
      if (changed) {
        Value **in = arena_alloc(a, (size_t)u->n_in * sizeof *in);
        for (int j = 0; j < u->n_in; j++) in[j] = cur[u->in[j]->id] ? cur[u->in[j]->id] : u->in[j];
        undo->users[undo->n] = u;
        undo->old_in[undo->n++] = u->in;
        u->in = in;
      }
    }
    if (n_out == cap) {
      Value **grown = arena_alloc(a, (size_t)cap * 2 * sizeof *grown);
      memcpy(grown, out, (size_t)n_out * sizeof *out);
      out = grown;
      cap *= 2;
    }
    out[n_out++] = u;
  }
  if (n_out > GRAPH_MAX_VALUES)
    diag_error_noloc(g->diag, "recomputation would make the graph more than %d values", GRAPH_MAX_VALUES);
  g->values = out;
  g->n_values = n_out;
  g->cap_values = cap;
  graph_renumber(g);
  graph_count_uses(g);
  return 0;
}

/* Units of memory of the dynamic programme (budget and sizes rounded up),
 * and the most stages it takes (its tables hold L^2 (UNITS + 1) cells and
 * it runs in O(L^3 UNITS): 10 MB and about 0.1 s at 64 stages; longer
 * chains get the greedy choice). */
#define ROTOR_UNITS 200
#define ROTOR_MAX_STAGES 64

/* auto on one device whose blocks form a chain: the schedules of the
 * dynamic programme for every budget from the least to the whole chain
 * (each distinct one once) are lowered and planned; the one that fits the
 * device with the fewest recomputed FLOPs is applied when it beats
 * greedy_flops (the greedy single-level choice's; INFINITY when that does
 * not fit).  0 when applied; -1 (graph unchanged) when the graph is no
 * chain or no schedule beats the greedy one. */
static int choose_rotor(Graph *g, PassCtx *cx, const PartDevice *dev, int nb, double greedy_flops) {
  Rotor R = {.g = g, .nb = nb};
  if (rotor_chain(&R) || R.ch.n > ROTOR_MAX_STAGES) return -1;
  int L = R.ch.n;
  Arena *a = g->arena;
  double *xb = arena_alloc(a, (size_t)L * sizeof *xb), *x = arena_alloc(a, (size_t)L * sizeof *x), total = 0;
  R.uf = arena_alloc(a, (size_t)L * sizeof *R.uf);
  for (int i = 0; i < R.n; i++) {
    Value *v = g->values[i];
    if (!R.cl[i]) continue;
    int s = R.stage_of[v->block];
    double f, by, bytes = (double)dtype_size(v->dtype) * (double)shape_numel(&v->shape);
    part_op_cost(v, &f, &by);
    R.uf[s] += f;
    if (R.outv[i]) x[s] += bytes, xb[s] += bytes;
    else if (R.bread[i]) xb[s] += bytes;
  }
  for (int s = 0; s < L; s++) total += xb[s] + x[s];
  R.K = ROTOR_UNITS;
  double unit = total / R.K > 1 ? total / R.K : 1;
  R.xu = arena_alloc(a, (size_t)L * sizeof *R.xu);
  R.xbu = arena_alloc(a, (size_t)L * sizeof *R.xbu);
  for (int s = 0; s < L; s++) R.xu[s] = (int)ceil(x[s] / unit), R.xbu[s] = (int)ceil(xb[s] / unit);
  rotor_dp(&R);
  size_t max_act = (size_t)(4 * L * L + 8);
  R.act = arena_alloc(a, max_act * sizeof *R.act);
  Act *prev = arena_alloc(a, max_act * sizeof *prev);
  int n_prev = -1, best_m = -1;
  double best = greedy_flops;
  for (int m = R.K; m >= 0; m--) {
    if (!isfinite(rc_C(&R, 0, L - 1)[m])) break;
    R.n_act = 0;
    rotor_emit(&R, 0, L - 1, m);
    if (R.n_act == n_prev && !memcmp(R.act, prev, (size_t)R.n_act * sizeof *prev)) continue;
    memcpy(prev, R.act, (size_t)R.n_act * sizeof *prev);
    n_prev = R.n_act;
    Undo u;
    if (rotor_apply(&R, &u)) return -1;
    double f = stage_over(g, cx, dev, 1) < 0 ? copy_flops(g) : INFINITY;
    undo_apply(g, &u);
    if (f < best) best = f, best_m = m;
  }
  if (best_m < 0) return -1;
  R.n_act = 0;
  rotor_emit(&R, 0, L - 1, best_m);
  Undo u;
  return rotor_apply(&R, &u);
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
  } else if (choose_auto(g, cx, sel, nb)) {
    return;
  }
  apply(g, sel, NULL);
}
