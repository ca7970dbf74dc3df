/* passes/prune.c: magnitude pruning (the `prune` pass).
 *
 * The pass decides which params are pruned and how their masks are laid
 * out; the masks themselves are chosen by the runtime (runtime/prune.c),
 * from the weights' magnitudes at the steps of the schedule, since they
 * depend on trained values.  For each pruned param P the pass adds
 *
 *   - a mask `P.mask`: a state tensor of P's dtype (1 keeps a weight, 0
 *     prunes it), initialised to ones and checkpointed with the optimizer
 *     state;
 *   - a `prune_mask` op in the optimizer role, after every optimizer
 *     update, that sets P and its optimizer state (AdamW's exp_avg and
 *     exp_avg_sq, SGD's momentum_buffer; with 8-bit AdamW state their
 *     codes, since code 0 decodes to exactly 0) to 0 where the mask is 0.  A
 *     pruned weight is therefore exactly 0 after every step, whatever its
 *     gradient, momentum and weight decay would do (the "regrowth" that
 *     masking the weight alone, or once, allows), and its state stays 0.
 *
 * Which params: by default the weights of matmuls and convolutions (the
 * second operand of a forward matmul, directly or reshaped from a
 * convolution's [out, in, kh, kw]), never biases, norms or embedding
 * tables (a table tied to an output projection, as GPT's wte, included).
 * `params = "GLOB, GLOB, !GLOB"` (--prune-params) picks others: the params
 * matching any pattern (default selection when there are only `!`
 * patterns), minus those matching a `!` pattern; globs as fnmatch(3),
 * `*` crossing dots.
 *
 * Layout: each pruned weight is seen as a matrix of output channels by
 * inputs, the GEMM's view.  The mask op's attribute `out` names the
 * output-channel axis: the last of an [in, out] weight (x @ w), the first
 * of an [out, in] one (x @ transpose(w)) and of a convolution's
 * [out, in/groups, kh, kw], whose inputs are the flattened
 * in/groups x kh x kw, the reduction dimension of duet's im2col GEMM.
 * N:M groups (2:4, NVIDIA's sparse tensor cores: 2 non-zeros in every 4
 * consecutive weights along the reduction dimension) run along the
 * inputs; channels mode prunes whole output channels. */
#define _GNU_SOURCE /* fnmatch */
#include <fnmatch.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

int prune_parse_flag(PruneSpec *over, const char *flag, const char *val, char *err, size_t errlen) {
  static const char *const flags[] = {"--prune", "--prune-mode", "--prune-start", "--prune-end", "--prune-every",
                                      "--prune-initial", "--prune-params"};
  static const unsigned bits[] = {PRUNE_SET_SPARSITY, PRUNE_SET_MODE, PRUNE_SET_START, PRUNE_SET_END,
                                  PRUNE_SET_EVERY, PRUNE_SET_INITIAL, PRUNE_SET_PARAMS};
  int k = 0;
  while (k < 7 && strcmp(flags[k], flag)) k++;
  if (k == 7) return 0;
  if (k == 0 || k == 5) {
    char *end;
    double x = strtod(val, &end);
    if (end == val || *end || !(x >= 0 && x < 1)) {
      snprintf(err, errlen, "%s expects a sparsity in [0, 1), got '%s'", flag, val);
      return -1;
    }
    *(k ? &over->initial : &over->sparsity) = x;
  } else if (k == 1) {
    int a, b, used = 0;
    if (prune_mode_parse(val, &over->mode, &over->nm_n, &over->nm_m) && sscanf(val, "%d:%d%n", &a, &b, &used) == 2 &&
        !val[used] && a >= b && a >= 1 && b <= 64) {
      snprintf(err, errlen, "--prune-mode %s: N must be less than M (N:M keeps N of every M weights, such as 2:4)",
               val);
      return -1;
    }
    if (prune_mode_parse(val, &over->mode, &over->nm_n, &over->nm_m)) {
      snprintf(err, errlen, "unknown --prune-mode '%s'; modes are unstructured, global, channels and N:M such as 2:4",
               val);
      return -1;
    }
  } else if (k == 6) {
    over->params = val;
  } else {
    char *end;
    long long x = strtoll(val, &end, 10);
    long long lo = k == 4 ? 1 : 0;
    if (end == val || *end || x < lo || x > INT64_MAX / 4) {
      snprintf(err, errlen, "%s expects an integer >= %lld (a step count), got '%s'", flag, lo, val);
      return -1;
    }
    *(k == 2 ? &over->start : k == 3 ? &over->end : &over->every) = x;
  }
  over->set |= bits[k];
  return 1;
}

/* The output-channel axis of param p as a weight: the forward matmuls that
 * take it as their second operand, directly (x @ w: the last axis; x @
 * transpose(w) of a matrix: the first) or as a convolution (a rank-4
 * weight reshaped, and sliced for groups, into the transposed operand:
 * the first), also through its `fake_quantize` (quantization-aware
 * training: the qat pass reads every such weight through one, of the same
 * shape).  -1 when p is no such weight.  use[cnt[id] .. cnt[id + 1]): the
 * forward ops that read value id. */
int prune_weight_axis(const Value *p, Value *const *use, const int *cnt) {
  for (int k = cnt[p->id]; k < cnt[p->id + 1]; k++) {
    const Value *c = use[k];
    if (c->op == OP_FAKE_QUANT && c->in[0] == p) {
      int axis = prune_weight_axis(c, use, cnt);
      if (axis >= 0) return axis;
    }
    if (c->op == OP_MATMUL && c->in[1] == p && c->in[0] != p) {
      if (!c->attr.trans_b) return p->shape.rank - 1;
      if (p->shape.rank == 2) return 0;
    }
    if (p->shape.rank == 4 && (c->op == OP_RESHAPE || (c->op == OP_SLICE && c->attr.axis == 0))) {
      const Value *r = c;
      if (c->op == OP_SLICE) { /* groups: the slice's reshape */
        r = NULL;
        for (int j = cnt[c->id]; j < cnt[c->id + 1] && !r; j++)
          if (use[j]->op == OP_RESHAPE) r = use[j];
        if (!r) continue;
      }
      if (r->shape.rank != 2 || r->shape.dim[0] != r->in[0]->shape.dim[0]) continue;
      for (int j = cnt[r->id]; j < cnt[r->id + 1]; j++)
        if (use[j]->op == OP_MATMUL && use[j]->in[1] == r && use[j]->attr.trans_b) return 0;
    }
  }
  return -1;
}

/* The next pattern of a comma-separated list into buf (spaces trimmed);
 * the rest of the list after it, or NULL at the end. */
static const char *next_pattern(const char *s, char *buf, size_t n) {
  while (*s == ' ' || *s == '\t') s++;
  if (!*s) return NULL;
  size_t k = strcspn(s, ",");
  size_t m = k;
  while (m > 0 && (s[m - 1] == ' ' || s[m - 1] == '\t')) m--;
  snprintf(buf, n, "%.*s", (int)(m < n ? m : n - 1), s);
  return s[k] ? s + k + 1 : s + k;
}

/* (units - 0.5) / units, the sparsity below which round(s x units) leaves
 * a unit, printed with the fewest digits (at least 6) that do not exceed it,
 * into buf (32 bytes). */
static const char *all_below(int64_t units, char *buf, size_t n) {
  double thr = ((double)units - 0.5) / (double)units;
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, thr);
    if (strtod(buf, NULL) <= thr) break;
  }
  return buf;
}

void pass_prune(Graph *g, PassCtx *cx) {
  PruneSpec *p = &g->prune;
  const PruneSpec *o = cx->prune;
  if (o && o->set) { /* the command line wins, field by field */
    if (p->mode == PRUNE_NONE) p->mode = PRUNE_UNSTRUCTURED;
    if (o->set & PRUNE_SET_MODE) p->mode = o->mode, p->nm_n = o->nm_n, p->nm_m = o->nm_m;
    if (o->set & PRUNE_SET_SPARSITY) p->sparsity = o->sparsity;
    if (o->set & PRUNE_SET_INITIAL) p->initial = o->initial;
    if (o->set & PRUNE_SET_START) p->start = o->start;
    if (o->set & PRUNE_SET_END) p->end = o->end;
    if (o->set & PRUNE_SET_EVERY) p->every = o->every;
    if (o->set & PRUNE_SET_PARAMS) p->params = o->params;
    p->set |= o->set;
  }
  if (p->mode == PRUNE_NONE) return;
  char err[400], mode[32];
  prune_mode_str(p, mode, sizeof mode);
  /* N:M is one-shot: the gradual schedule's keys are errors, not ignored
   * (before resolving: a resolved spec has every key) */
  /* errors between the keys: at the prune section when it alone set them */
  Loc at = o && o->set ? (Loc){0} : p->loc;
  if (p->mode == PRUNE_NM && (p->set & (PRUNE_SET_EVERY | PRUNE_SET_INITIAL)))
    diag_error(g->diag, at, "%s pruning is one-shot, at its start step: %s belongs to the gradual schedule of "
                     "unstructured, global and channels pruning; leave it out", mode,
                     p->set & PRUNE_SET_EVERY ? "the frequency (--prune-every, `every`)"
                                              : "the initial sparsity (--prune-initial, `initial_sparsity`)");
  if (prune_spec_resolve(p, err, sizeof err)) diag_error(g->diag, at, "%s", err);
  if (g->decode) return; /* generation: the checkpoint's weights are already pruned */

  /* forward uses of every value (prune_weight_axis) and every named tensor (the
   * masks' names must be new) */
  int n = g->n_values;
  int *cnt = arena_alloc(g->arena, ((size_t)n + 2) * sizeof *cnt), *fill = arena_alloc(g->arena, ((size_t)n + 1) * sizeof *fill);
  NameMap names = {0};
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    if ((v->op == OP_PARAM || v->op == OP_STATE || v->op == OP_INPUT) && v->attr.name)
      *namemap_slot(g->arena, &names, v->attr.name) = v;
    if (v->role != ROLE_FORWARD) continue;
    for (int j = 0; j < v->n_in; j++) cnt[v->in[j]->id + 1]++;
  }
  for (int i = 0; i < n; i++) cnt[i + 1] += cnt[i];
  Value **use = arena_alloc(g->arena, ((size_t)cnt[n] + 1) * sizeof *use);
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    if (v->role != ROLE_FORWARD) continue;
    for (int j = 0; j < v->n_in; j++) {
      int x = v->in[j]->id;
      use[cnt[x] + fill[x]++] = v;
    }
  }

  /* the candidates: trainable params (those with an optimizer update) */
  Value **upd = arena_alloc(g->arena, ((size_t)n + 1) * sizeof *upd);
  int n_upd = 0;
  for (int i = 0; i < n; i++)
    if (g->values[i]->op == OP_ADAMW || g->values[i]->op == OP_SGD) upd[n_upd++] = g->values[i];
  bool *sel = arena_alloc(g->arena, (size_t)n_upd + 1);
  int *axis = arena_alloc(g->arena, ((size_t)n_upd + 1) * sizeof *axis);
  bool positive = false;
  for (int k = 0; k < n_upd; k++) {
    const Value *w = upd[k]->in[0];
    axis[k] = prune_weight_axis(w, use, cnt);
    bool embedding = false;
    for (int j = cnt[w->id]; j < cnt[w->id + 1]; j++) embedding |= use[j]->op == OP_EMBEDDING && use[j]->in[0] == w;
    sel[k] = w->shape.rank >= 2 && axis[k] >= 0 && !embedding;
  }
  if (p->params) {
    char pat[256];
    for (const char *s = p->params; (s = next_pattern(s, pat, sizeof pat));)
      if (pat[0] && pat[0] != '!') positive = true;
    if (positive)
      for (int k = 0; k < n_upd; k++) sel[k] = false;
    for (const char *s = p->params; (s = next_pattern(s, pat, sizeof pat));) {
      if (!pat[0] || !strcmp(pat, "!"))
        diag_error_noloc(g->diag, "prune params \"%s\": an empty pattern (patterns are separated by commas)", p->params);
      bool neg = pat[0] == '!';
      int hits = 0;
      for (int k = 0; k < n_upd; k++)
        if (!fnmatch(pat + neg, upd[k]->in[0]->attr.name, 0)) {
          hits++;
          sel[k] = !neg;
        }
      if (!hits) {
        char list[300] = "";
        for (int k = 0; k < n_upd && strlen(list) < 200; k++)
          snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", upd[k]->in[0]->attr.name);
        diag_error_noloc(g->diag, "prune params: the pattern `%s` matches no trainable parameter (%s%s)", pat, list,
                         strlen(list) >= 200 ? ", ..." : "");
      }
    }
  }
  int n_sel = 0;
  for (int k = 0; k < n_upd; k++) {
    if (!sel[k]) continue;
    n_sel++;
    Value *w = upd[k]->in[0];
    char b[160];
    const char *excl = arena_printf(g->arena, "leave it out with --prune-params '!%s' (params = \"!%s\")",
                                    w->attr.name, w->attr.name);
    if ((p->mode == PRUNE_NM || p->mode == PRUNE_CHANNELS) && axis[k] < 0)
      diag_error(g->diag, w->loc, "%s pruning of `%s` %s%s: it is no matmul or convolution weight, so it has no %s; %s",
                 mode, w->attr.name, dtype_name(w->dtype), shape_str(&w->shape, b, sizeof b),
                 p->mode == PRUNE_NM ? "input dimension to group" : "output channels", excl);
    if (p->mode == PRUNE_NM) {
      int64_t out = w->shape.dim[axis[k]], in = shape_numel(&w->shape) / out;
      if (in % p->nm_m)
        diag_error(g->diag, w->loc, "%s pruning of `%s` %s%s: its input dimension (%" PRId64 ") is not divisible by %d; %s",
                   mode, w->attr.name, dtype_name(w->dtype), shape_str(&w->shape, b, sizeof b), in, p->nm_m, excl);
    }
  }
  /* a sparsity that rounds to every weight (round(s x n) = n, halves to
   * even as runtime/prune.c rounds) would leave a layer, or the model,
   * nothing to compute with: refused, naming the tensor */
  char sp[32];
  ir_num_str(p->sparsity, sp, sizeof sp);
  int64_t total = 0;
  for (int k = 0; k < n_upd; k++) {
    if (!sel[k] || p->mode == PRUNE_NM) continue;
    const Value *w = upd[k]->in[0];
    int64_t n_w = shape_numel(&w->shape);
    total += n_w;
    if (p->mode == PRUNE_GLOBAL) continue;
    bool ch = p->mode == PRUNE_CHANNELS && axis[k] >= 0;
    int64_t units = ch ? w->shape.dim[axis[k]] : n_w;
    if ((int64_t)nearbyint(p->sparsity * (double)units) >= units) {
      char b[160];
      diag_error(g->diag, w->loc, "%s pruning to sparsity %s removes every %s of `%s` %s%s: round(%s x %" PRId64
                 ") = %" PRId64 "; give a sparsity below %s, or leave it out with --prune-params '!%s'",
                 mode, sp, ch ? "output channel" : "weight", w->attr.name, dtype_name(w->dtype),
                 shape_str(&w->shape, b, sizeof b), sp, units, units, all_below(units, (char[32]){0}, 32),
                 w->attr.name);
    }
  }
  if (p->mode == PRUNE_GLOBAL && total > 0 && (int64_t)nearbyint(p->sparsity * (double)total) >= total)
    diag_error_noloc(g->diag, "global pruning to sparsity %s removes every weight of the pruned tensors: round(%s x %"
                     PRId64 ") = %" PRId64 "; give a sparsity below %s", sp, sp, total, total,
                     all_below(total, (char[32]){0}, 32));
  if (!n_sel)
    diag_error_noloc(g->diag, "pruning selects no parameter: the model has no trainable matmul or convolution weight%s "
                     "(pick params with --prune-params PATTERNS or `params = \"...\"` in the prune section)",
                     p->params ? " that the params patterns keep" : "");

  /* a mask and a prune_mask op per pruned param, after every update */
  for (int k = 0; k < n_upd; k++) {
    if (!sel[k]) continue;
    Value *u = upd[k], *w = u->in[0];
    Attr ma = {.shape = w->shape, .dtype = w->dtype, .init = INIT_ONES};
    ma.name = arena_printf(g->arena, "%s.mask", w->attr.name);
    void **slot = namemap_slot(g->arena, &names, ma.name);
    if (*slot) {
      const Value *x = *slot;
      diag_error(g->diag, x->loc, "%s `%s` has the checkpoint name of the pruning mask of parameter `%s` (line %d): "
                 "rename one of them", x->op == OP_PARAM ? "parameter" : x->op == OP_INPUT ? "input" : "tensor",
                 ma.name, w->attr.name, w->loc.line);
    }
    Value *m = graph_add(g, OP_STATE, NULL, 0, &ma, w->loc);
    m->role = ROLE_OPTIMIZER;
    *slot = m;
    Value *in[4] = {w, m};
    int n_in = 2;
    /* exp_avg, exp_avg_sq / momentum_buffer; 8-bit AdamW: their codes (code 0 decodes to exactly 0 in
     * any block, so the scales stay) */
    for (int j = 2; j < u->n_in && j < 4; j++) in[n_in++] = u->in[j];
    Attr at = {.axis = axis[k]};
    Value *op = graph_add(g, OP_PRUNE_MASK, in, n_in, &at, w->loc);
    op->role = ROLE_OPTIMIZER;
  }
  graph_count_uses(g);
}
