/* passes/shrink.c: physically smaller layers after channels pruning (the
 * `shrink` pass, --shrink with --prune-mode channels).
 *
 * Channels pruning (passes/prune.c, runtime/prune.c) zeroes whole output
 * channels of a weight: after a run that reached its final sparsity S,
 * each channel-pruned weight of C output channels keeps exactly
 * K = C - round(S x C) of them (round halves to even; runtime/prune.c
 * prunes that many per weight, whatever the magnitudes), so K is known at
 * compile time.  The program this pass makes evaluates such a checkpoint
 * with those channels removed: it first drops the backward graph and the
 * optimizer (their values, the optimizer state, the pruning masks: an
 * evaluation program, as the quantize pass makes), then, for each
 * channel-pruned weight W,
 *
 *   - shrinks W's output-channel axis from C to K;
 *   - follows W's output forward, along a path of values each read once,
 *     through ops that act channel by channel: its bias add (a param of
 *     one value per channel, through reshapes; it shrinks too), unary
 *     activations (relu, gelu, tanh, sigmoid, silu, neg), permutes, max
 *     and avg pooling of [N, C, H, W] along C, reshapes where each channel
 *     stays a contiguous group of indices of one axis (flatten [N, C, 7, 7]
 *     -> [N, C*49]: channel c is indices 49c .. 49c+48), and im2col
 *     (channel c is the kh x kw taps c*kh*kw .. of a row), shrinking each
 *     value's channel axis;
 *   - at the next matmul, whose reduction (input) axis carries the
 *     channels, shrinks its weight's input axis (a param, through reshapes:
 *     a convolution's [out, in, kh, kw] loses input channels): group g of
 *     the input axis keeps the rows of the kept channels.
 *
 * A removed channel is not silent: channels pruning keeps the biases, so
 * it outputs the constant acts(bias) (the same at every position), which
 * the next layer multiplies by the channel's rows.  The runtime folds that
 * into the next layer's bias when it loads the checkpoint; zero padding on
 * the way (im2col of a padded convolution, avg pooling with padding) would
 * make the term depend on the position, so such a weight is not shrunk.
 *
 * Where the path meets anything else (a norm across channels, a residual
 * add of two activations, attention, the logits and the loss, a value or
 * param read twice, zero padding), W stays as it is (its pruned channels
 * are zeros, as without --shrink) and a note says why.  The shrunk axes are
 * listed in g->shrink (printed `shrink param=... axis=... full=...
 * group=... source=... kind=...`, docs/ir.md), and codegen passes them on
 * (DuetProgram.shrink): when the runtime loads a checkpoint (full-size
 * weights with zeroed channels, and the masks) it gathers the kept channels
 * of each source weight (those its mask keeps, or, without a mask, whose
 * weights are not all zero) into the smaller params, folds the removed
 * channels' constants into the next biases, and refuses a checkpoint that
 * keeps another number (runtime/shrink.c).
 *
 * The GEMMs then sum over fewer inputs: the results equal the masked
 * program's up to the order of the f32 sums. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "passes.h"

/* One shrunk axis of one value: its new length; for a param also the
 * ShrinkAxis entry (full length, group, source). */
typedef struct Edit {
  Value *v;
  int axis;
  int64_t dim;
  int64_t full, group; /* params */
  int kind;            /* params: SHRINK_OWN, SHRINK_BIAS, SHRINK_NEXT */
  int next_out;        /* SHRINK_NEXT: the output axis of the next weight */
  Value *next_bias;    /* SHRINK_NEXT: the next layer's bias (NULL: none) */
  const char *acts;    /* SHRINK_NEXT: the activations between */
  bool fold;           /* SHRINK_NEXT: no zero padding between */
} Edit;

typedef struct Sh {
  Graph *g;
  Value **use;   /* use[cnt[id] .. cnt[id + 1]): the kept values that read value id */
  int *cnt;
  Edit *edit;
  int n_edit, cap_edit;
  int64_t keep;  /* K, the kept channels of the walk's source */
  const char *why; /* what stopped the walk */
} Sh;

static void add_edit(Sh *S, Value *v, int axis, int64_t group) {
  if (S->n_edit == S->cap_edit) {
    int cap = S->cap_edit ? 2 * S->cap_edit : 64;
    Edit *e = arena_alloc(S->g->arena, (size_t)cap * sizeof *e);
    if (S->n_edit) memcpy(e, S->edit, (size_t)S->n_edit * sizeof *e);
    S->edit = e;
    S->cap_edit = cap;
  }
  S->edit[S->n_edit++] = (Edit){v, axis, S->keep * group, v->shape.dim[axis], group, SHRINK_OWN, -1, NULL, NULL, false};
}

/* Axis a of shape d whose index is c*G + r (channel c, r < G), seen in
 * shape e of the same elements (row-major): the axis b of e whose index is
 * c*G2 + r2, with *G2; -1 when the channels are not contiguous groups of
 * one axis of e.  With S the elements after axis a, channel c occupies
 * the blocks of B = G*S elements at c*B of every period P = d[a]*S; an
 * axis b of e with stride Se dividing B and d'[b]*Se = P indexes them
 * alike. */
static int map_axis(const Shape *d, int a, int64_t G, const Shape *e, int64_t *G2) {
  int64_t S = 1;
  for (int k = a + 1; k < d->rank; k++) S *= d->dim[k];
  int64_t B = G * S, P = d->dim[a] * S, Se = 1;
  for (int b = e->rank - 1; b >= 0 && Se <= B; Se *= e->dim[b], b--)
    if (B % Se == 0 && e->dim[b] * Se == P) {
      *G2 = B / Se;
      return b;
    }
  return -1;
}

static int n_uses(const Sh *S, const Value *v) { return S->cnt[v->id + 1] - S->cnt[v->id]; }

/* The operand o that carries the walk's channels along axis a (group G)
 * into the bias add or the next matmul: a param, directly or through
 * reshapes, each read only here; its axis shrinks (an edit of kind
 * `kind`).  The param, with its axis in *pa; NULL with S->why. */
static Value *param_chain(Sh *S, Value *o, int a, int64_t G, int kind, int *pa) {
  for (;;) {
    if (n_uses(S, o) != 1) {
      S->why = o->op == OP_PARAM ? arena_printf(S->g->arena, "param `%s` is read %d times", o->attr.name, n_uses(S, o))
                                 : "a reshape of a param is read more than once";
      return NULL;
    }
    add_edit(S, o, a, G);
    S->edit[S->n_edit - 1].kind = kind;
    if (o->op == OP_PARAM) {
      *pa = a;
      return o;
    }
    int64_t G2;
    int b = o->op == OP_RESHAPE ? map_axis(&o->shape, a, G, &o->in[0]->shape, &G2) : -1;
    if (b < 0) {
      S->why = arena_printf(S->g->arena, "it meets %s%s", op_info[o->op].name,
                            o->op == OP_RESHAPE ? " that splits the channels' groups"
                                                : ", not a param of the channels");
      return NULL;
    }
    o = o->in[0], a = b, G = G2;
  }
}

/* The bias param added to the output of matmul m (through reshapes and
 * permutes read once: the next layer's `+ b`), one value per output
 * channel; NULL when there is none. */
static Value *bias_after(Sh *S, Value *m, int64_t out) {
  Value *v = m;
  for (int depth = 0; depth < 8; depth++) {
    if (n_uses(S, v) != 1) return NULL;
    Value *u = S->use[S->cnt[v->id]];
    if (u->op == OP_RESHAPE || u->op == OP_PERMUTE) {
      v = u;
      continue;
    }
    if (u->op != OP_ADD) return NULL;
    Value *o = u->in[0] == v ? u->in[1] : u->in[0];
    while (o->op == OP_RESHAPE && n_uses(S, o) == 1) o = o->in[0];
    return o->op == OP_PARAM && o->shape.rank == 1 && o->shape.dim[0] == out && n_uses(S, o) == 1 ? o : NULL;
  }
  return NULL;
}

/* Follows the matmul output v, whose axis a carries the source's channels
 * in groups of G, to the next matmul: a path of values read once each,
 * through a bias add (first), unary activations, pooling, permutes,
 * reshapes and im2col.  A removed channel's value on it is a constant
 * (its bias through the activations, the same at every position) until
 * zero padding (im2col, avg pooling) makes it depend on the position: the
 * runtime folds the constant into the next layer's bias (fold), or, where
 * it cannot, requires it to be 0.  false with S->why. */
static bool follow(Sh *S, Value *v, int a, int64_t G) {
  char acts[128] = "";
  bool fold = true, biased = false;
  for (;;) {
    add_edit(S, v, a, G);
    if (v == S->g->loss || v == S->g->logits) {
      S->why = "its channels reach the model's output (the logits, the loss)";
      return false;
    }
    if (n_uses(S, v) != 1) {
      S->why = arena_printf(S->g->arena, "its output is read by %d ops, not one", n_uses(S, v));
      return false;
    }
    Value *u = S->use[S->cnt[v->id]];
    int64_t G2;
    int b;
    switch (u->op) {
    case OP_RELU: case OP_GELU: case OP_TANH: case OP_SIGMOID: case OP_SILU: case OP_NEG:
      if (strlen(acts) + 16 < sizeof acts)
        snprintf(acts + strlen(acts), sizeof acts - strlen(acts), "%s%s", acts[0] ? " " : "", op_info[u->op].name);
      v = u;
      break;
    case OP_ADD: {
      int au = a + u->shape.rank - v->shape.rank;
      Value *o = u->in[0] == v ? u->in[1] : u->in[0];
      int ao = au - (u->shape.rank - o->shape.rank), pa;
      if (u->in[0] != u->in[1] && au >= 0 && u->shape.dim[au] == v->shape.dim[a] && ao >= 0 &&
          o->shape.dim[ao] != 1 && o->op != OP_PARAM && o->op != OP_RESHAPE) {
        S->why = "it meets an add with another activation (a residual connection)";
        return false;
      }
      if (u->in[0] == u->in[1] || au < 0 || u->shape.dim[au] != v->shape.dim[a] || ao < 0 || o->shape.dim[ao] == 1 ||
          biased || acts[0] || G != 1) {
        S->why = "it meets an add that is not its bias (one value per channel, before the activations)";
        return false;
      }
      Value *bp = param_chain(S, o, ao, G, SHRINK_BIAS, &pa);
      if (!bp) return false;
      if (bp->shape.rank != 1) {
        S->why = arena_printf(S->g->arena, "its bias `%s` is not one value per channel", bp->attr.name);
        return false;
      }
      biased = true;
      v = u, a = au;
      break;
    }
    case OP_RESHAPE:
      b = map_axis(&v->shape, a, G, &u->shape, &G2);
      if (b < 0) {
        S->why = "it meets a reshape that does not keep each channel a contiguous group of one axis";
        return false;
      }
      v = u, a = b, G = G2;
      break;
    case OP_PERMUTE:
      b = -1;
      for (int d = 0; d < u->shape.rank; d++)
        if (u->attr.perm[d] == a) b = d;
      v = u, a = b;
      break;
    case OP_MAXPOOL: case OP_AVGPOOL: case OP_IM2COL:
      if (a != 1 || v->shape.rank != 4) {
        S->why = arena_printf(S->g->arena, "it meets %s along another axis than the channels'", op_info[u->op].name);
        return false;
      }
      /* max pooling skips the padding; zero padding makes a constant channel's taps differ */
      if (u->op != OP_MAXPOOL && (u->attr.ph || u->attr.pw)) fold = false;
      if (u->op == OP_IM2COL) G *= u->attr.kh * u->attr.kw;
      v = u;
      break;
    case OP_MATMUL: {
      /* the next layer: the channels along the reduction axis of its
       * first operand; its weight's input axis shrinks */
      if (u->in[0] != v || u->in[1] == v || u->attr.trans_a || a != v->shape.rank - 1 || u->in[1]->shape.rank != 2) {
        S->why = "it meets a matmul that does not reduce over the channels (x @ w with the channels as x's last axis)";
        return false;
      }
      if (!fold) {
        S->why = "a pruned channel still outputs a constant (its bias through the activations), and the zero "
                 "padding before the next layer makes that constant's contribution depend on the position, so it "
                 "cannot be folded into the next layer's bias";
        return false;
      }
      int pa;
      Value *w = param_chain(S, u->in[1], u->attr.trans_b ? 1 : 0, G, SHRINK_NEXT, &pa);
      if (!w) return false;
      int out = prune_weight_axis(w, S->use, S->cnt);
      if (out < 0 || out == pa) {
        S->why = arena_printf(S->g->arena, "the next layer's weight `%s` has no output axis apart from its inputs",
                              w->attr.name);
        return false;
      }
      Edit *e = &S->edit[S->n_edit - 1]; /* the param's own edit */
      e->next_out = out;
      e->next_bias = bias_after(S, u, w->shape.dim[out]);
      e->acts = arena_printf(S->g->arena, "%s", acts);
      e->fold = fold;
      return true;
    }
    default:
      S->why = arena_printf(S->g->arena, "it meets %s, which the pass cannot follow", op_info[u->op].name);
      return false;
    }
  }
}

/* The walk from channel-pruned weight w (output axis ax): through its
 * reshapes to the matmul that reads it, then the matmul's output. */
static bool walk(Sh *S, Value *w, int ax) {
  Value *x = w;
  int a = ax;
  int64_t G = 1;
  for (;;) {
    if (n_uses(S, x) != 1) {
      S->why = arena_printf(S->g->arena, "%s is read %d times (a tied or fake-quantized weight)",
                            x == w ? "it" : "its reshape",
                            n_uses(S, x));
      return false;
    }
    add_edit(S, x, a, G);
    Value *u = S->use[S->cnt[x->id]];
    if (u->op == OP_MATMUL && u->in[1] == x && u->in[0] != x && x->shape.rank == 2 &&
        a == (u->attr.trans_b ? 0 : 1))
      return follow(S, u, u->shape.rank - 1, G);
    int64_t G2;
    int b = u->op == OP_RESHAPE ? map_axis(&x->shape, a, G, &u->shape, &G2) : -1;
    if (b < 0) {
      S->why = arena_printf(S->g->arena, "it reaches its GEMM through %s", op_info[u->op].name);
      return false;
    }
    x = u, a = b, G = G2;
  }
}

bool shrink_check(Graph *g, const PruneSpec *cli) {
  PruneSpec p = g->prune; /* the command line over the prune section, as pass_prune merges them */
  if (cli && cli->set) {
    if (p.mode == PRUNE_NONE) p.mode = PRUNE_UNSTRUCTURED;
    if (cli->set & PRUNE_SET_MODE) p.mode = cli->mode, p.nm_n = cli->nm_n, p.nm_m = cli->nm_m;
  }
  if (p.mode == PRUNE_CHANNELS) return true;
  char m[32];
  diag_error_noloc(g->diag, "--shrink removes the output channels that channels pruning zeroed: it needs "
                   "--prune-mode channels and the --prune S of the training run (this program's pruning: %s)",
                   p.mode == PRUNE_NONE ? "none" : prune_mode_str(&p, m, sizeof m));
  return false;
}

void pass_shrink(Graph *g, PassCtx *cx) {
  if (!cx->shrink) return;
  char sp[32];
  shrink_check(g, NULL);
  ir_num_str(g->prune.sparsity, sp, sizeof sp);
  Arena *ar = g->arena;
  int n = g->n_values;
  Value **old = arena_alloc(ar, ((size_t)n + 1) * sizeof *old);
  memcpy(old, g->values, (size_t)n * sizeof *old);

  /* the channel-pruned weights and their output axes, from the masks */
  Value **src = arena_alloc(ar, ((size_t)n + 1) * sizeof *src);
  int *src_axis = arena_alloc(ar, ((size_t)n + 1) * sizeof *src_axis), n_src = 0;
  for (int i = 0; i < n; i++)
    if (old[i]->op == OP_PRUNE_MASK && old[i]->attr.axis >= 0) {
      src[n_src] = old[i]->in[0];
      src_axis[n_src++] = old[i]->attr.axis;
    }

  /* evaluation only: the backward graph, the optimizer, and the state only
   * they read (optimizer moments, pruning masks) go (passes/evalonly.c) */
  graph_drop_training(g);
  n = g->n_values;

  Sh S = {.g = g};
  S.cnt = arena_alloc(ar, ((size_t)n + 2) * sizeof *S.cnt);
  int *fill = arena_alloc(ar, ((size_t)n + 1) * sizeof *fill);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->values[i]->n_in; j++) S.cnt[g->values[i]->in[j]->id + 1]++;
  for (int i = 0; i < n; i++) S.cnt[i + 1] += S.cnt[i];
  S.use = arena_alloc(ar, ((size_t)S.cnt[n] + 1) * sizeof *S.use);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->values[i]->n_in; j++) {
      int x = g->values[i]->in[j]->id;
      S.use[S.cnt[x] + fill[x]++] = g->values[i];
    }

  /* the walks: each source's edits are kept only when its walk succeeds */
  ShrinkAxis *tab = NULL;
  int n_tab = 0;
  Edit *all = NULL;
  int n_all = 0, cap_all = 0;
  for (int s = 0; s < n_src; s++) {
    Value *w = src[s];
    int64_t C = w->shape.dim[src_axis[s]];
    S.keep = C - (int64_t)nearbyint(g->prune.sparsity * (double)C);
    S.n_edit = 0;
    S.why = NULL;
    if (!walk(&S, w, src_axis[s])) {
      diag_note(g->diag, w->loc, "--shrink leaves `%s` at its %" PRId64 " output channels (the pruned ones stay "
                "zeros): %s", w->attr.name, C, S.why && *S.why ? S.why : "its output cannot be followed");
      continue;
    }
    for (int e = 0; e < S.n_edit; e++) {
      if (n_all == cap_all) {
        cap_all = cap_all ? 2 * cap_all : 64;
        Edit *x = arena_alloc(ar, (size_t)cap_all * sizeof *x);
        if (n_all) memcpy(x, all, (size_t)n_all * sizeof *x);
        all = x;
      }
      all[n_all++] = S.edit[e];
      if (S.edit[e].v->op != OP_PARAM) continue;
      if (!tab || n_tab % 64 == 0) {
        ShrinkAxis *t = arena_alloc(ar, ((size_t)n_tab + 64) * sizeof *t);
        if (n_tab) memcpy(t, tab, (size_t)n_tab * sizeof *t);
        tab = t;
      }
      const Edit *x = &S.edit[e];
      tab[n_tab++] = (ShrinkAxis){.param = x->v->attr.name, .source = w->attr.name, .axis = x->axis, .full = x->full,
                                  .group = x->group, .kind = x->kind, .next_out = x->next_out,
                                  .next_bias = x->next_bias ? x->next_bias->attr.name : NULL, .acts = x->acts,
                                  .fold = x->fold};
    }
  }
  /* apply: the new lengths, then every shape again from its operands */
  for (int e = 0; e < n_all; e++) {
    Value *v = all[e].v;
    v->shape.dim[all[e].axis] = all[e].dim;
    int rule = op_info[v->op].rule;
    if (rule == SHAPE_VIEW || rule == SHAPE_ATTR) v->attr.shape.dim[all[e].axis] = all[e].dim;
  }
  for (int i = 0; i < n; i++) ir_infer_shape(g, g->values[i]);
  g->shrink = tab;
  g->n_shrink = n_tab;
  graph_count_uses(g);
}
