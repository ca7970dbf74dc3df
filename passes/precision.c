/* passes/precision.c: precision selection (mixed-precision training).
 *
 * The device capability table and the `auto` rules are plain data here (the
 * runtime is never asked).  Given a storage dtype L (f16 or bf16), the pass
 * rewrites the graph the way automatic mixed precision does (Micikevicius et
 * al. 2018, "Mixed Precision Training"; PyTorch's torch.autocast op lists):
 *
 *   - params, optimizer state and inputs stay f32: the params are the master
 *     weights; a matmul reads a 16-bit copy of each weight (one `cast` per
 *     param and step, shared by the forward and backward GEMMs);
 *   - matmul: 16-bit operands, f32 accumulation, 16-bit result;
 *   - elementwise ops and views compute in f32 and store the widest dtype of
 *     their "strong" operands (activations); params and constants are "weak"
 *     and take the activation's dtype (a bias added to a 16-bit GEMM result
 *     stays 16-bit, the f32 residual stream of a transformer stays f32);
 *   - reductions (sum, mean, max), softmax inside attention and
 *     cross-entropy, layernorm (its statistics), embeddings, pooling,
 *     im2col and the evaluation metrics read f32 operands and give f32;
 *   - gradients flow in the dtype of their forward values; each param's
 *     gradient is brought back to f32 before the optimizer (`cast`, or with
 *     loss scaling `unscale`, which also records overflow).
 *
 * With fp16 storage the loss gradient seed (the constant 1 that autodiff
 * starts from) becomes `loss_scale`, a runtime scalar: every gradient is
 * computed scaled by S and `unscale` multiplies by 1/S, flagging inf/NaN so
 * the runtime can skip the step (dynamic loss scaling, PyTorch GradScaler).
 * The optimizer updates move to the end of the graph so that every flag is
 * known before the first update, and the pruning masks (prune_mask) after
 * them.  Casts are ordinary elementwise values,
 * fused into their neighbours by the fuse pass that follows. */
#include <stdio.h>
#include <string.h>

#include "passes.h"

/* ------------------------------------------------------------- the table */

/* Sources: NVIDIA's CUDA C Programming Guide, "Arithmetic Instructions"
 * throughput table (fp16 at 2x fp32 on sm_60 with half2, 1/64 on sm_61;
 * bf16 from sm_80), and shared/FACTS.md. */
static const DeviceCaps device_caps[] = {
    {"cpu", "the CPU", 0, false, false},
    {"sm_60", "Tesla P100", 60, true, false},
    {"sm_61", "Tesla P40 / GeForce GTX 10xx", 61, false, false},
    {"sm_70", "Tesla V100", 70, true, false},
    {"sm_75", "Tesla T4 / GeForce RTX 20xx", 75, true, false},
    {"sm_80", "A100", 80, true, true},
    {"sm_86", "GeForce RTX 30xx / A10", 86, true, true},
    {"sm_89", "GeForce RTX 40xx / L4", 89, true, true},
    {"sm_90", "H100", 90, true, true},
};
const int precision_n_devices = (int)(sizeof device_caps / sizeof device_caps[0]);

const DeviceCaps *precision_device(const char *target) {
  for (int i = 0; i < precision_n_devices; i++)
    if (!strcmp(device_caps[i].name, target)) return &device_caps[i];
  return NULL;
}

const DeviceCaps *precision_device_at(int i) {
  return i >= 0 && i < precision_n_devices ? &device_caps[i] : NULL;
}

int precision_resolve(const char *target, const char *request, PrecisionChoice *out, char *err, size_t errlen) {
  const char *t = target ? target : "cpu", *r = request ? request : "auto";
  const DeviceCaps *d = precision_device(t);
  if (!d) {
    char list[256] = "";
    for (int i = 0; i < precision_n_devices; i++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", device_caps[i].name);
    snprintf(err, errlen, "unknown target `%s` (targets: %s)", t, list);
    return -1;
  }
  bool is_auto = !strcmp(r, "auto");
  DType st;
  if (!strcmp(r, "fp32")) st = DT_F32;
  else if (!strcmp(r, "fp16")) st = DT_F16;
  else if (!strcmp(r, "bf16")) st = DT_BF16;
  else if (is_auto) st = d->sm == 0 ? DT_F32 : d->bf16 ? DT_BF16 : DT_F16;
  else {
    snprintf(err, errlen, "unknown precision `%s` (auto, fp32, fp16, bf16)", r);
    return -1;
  }
  if (st == DT_BF16 && d->sm && !d->bf16) {
    snprintf(err, errlen,
             "bf16 needs compute capability 8.0 or newer; %s (%s) has no bf16 arithmetic: use --precision fp16",
             d->name, d->card);
    return -1;
  }
  out->storage = st;
  /* the CPU widens 16-bit values to f32 to compute; sm_61 computes fp16 at
   * 1/64 of the fp32 rate, so it keeps fp16 storage with f32 arithmetic */
  out->compute = st == DT_F32 || d->sm == 0 || (st == DT_F16 && !d->fast_f16) ? DT_F32 : st;
  out->loss_scaling = st == DT_F16;
  return 0;
}

/* ------------------------------------------------------------- the pass */

/* Each op's class (KEEP, LOW, FOLLOW, F32, UPDATE, AFTER_UPDATE) is the prec column of
 * the op table (ir/ops.def): reductions, softmax, norms, losses,
 * embeddings, windows and metrics are F32. */

/* Wider of two float dtypes (f32 over the 16-bit ones). */
static DType wider(DType a, DType b) {
  if (a == DT_VOID) return b;
  return a == DT_F32 || b == DT_F32 ? DT_F32 : a;
}

typedef struct Prec {
  Graph *g;
  Value **order; /* the new value list */
  int n, cap;
  Value **memo;  /* [old id * DT_COUNT + dtype]: the cast of an original value */
  int n_old;
} Prec;

static void push(Prec *P, Value *v) {
  DUET_ASSERT(P->n < P->cap);
  P->order[P->n++] = v;
}

/* x as dtype `to` (x itself when it already is): a new constant for a
 * constant, else a cast placed before the value being rewritten. */
static Value *as_dtype(Prec *P, Value *x, DType to, Role role) {
  if (x->dtype == to || !dtype_is_float(x->dtype)) return x;
  Value **slot = x->id < P->n_old ? &P->memo[(size_t)x->id * DT_COUNT + to] : NULL;
  if (slot && *slot) return *slot;
  Value *c;
  if (x->op == OP_CONST) {
    Attr at = {.value = x->attr.value, .dtype = to};
    c = graph_add(P->g, OP_CONST, NULL, 0, &at, x->loc);
  } else {
    Attr at = {.dtype = to};
    c = graph_add(P->g, OP_CAST, &x, 1, &at, x->loc);
  }
  c->role = role;
  if (role == ROLE_FORWARD) c->block = x->block; /* a cast inside a block belongs to it */
  push(P, c);
  if (slot) *slot = c;
  return c;
}

void pass_precision(Graph *g, PassCtx *cx) {
  PrecisionChoice pc;
  char err[256];
  const char *req = cx->precision ? cx->precision : g->train.precision;
  if (precision_resolve(cx->target, req, &pc, err, sizeof err)) diag_error_noloc(g->diag, "%s", err);
  if (pc.storage == DT_F32 || g->float_dtype != DT_F32 || g->decode) return; /* nothing to do */
  DType L = pc.storage;
  Arena *a = g->arena;
  int n = g->n_values;
  Value **old = arena_alloc(a, ((size_t)n + 1) * sizeof *old);
  memcpy(old, g->values, (size_t)n * sizeof *old);
  Prec P = {.g = g, .n_old = n, .cap = 4 * n + 8};
  P.order = arena_alloc(a, (size_t)P.cap * sizeof *P.order);
  P.memo = arena_alloc(a, ((size_t)n + 1) * DT_COUNT * sizeof *P.memo);
  bool *weak = arena_alloc(a, (size_t)n + 1);
  Value **subst = arena_alloc(a, ((size_t)n + 1) * sizeof *subst);
  Value **updates = arena_alloc(a, ((size_t)n + 1) * sizeof *updates);
  Value **after = arena_alloc(a, ((size_t)n + 1) * sizeof *after);
  int n_updates = 0, n_after = 0;

  /* loss scaling: the seed of the backward pass (its first value, the
   * constant d loss / d loss = 1, or 1/M with M micro-batches, the loss
   * divided once by autodiff) becomes the runtime loss scale S, or S * 1/M:
   * the loss is scaled once and divided by M once, and the unscale kernels
   * multiply each micro-batch's gradients by 1/S before they are summed */
  Value *seed = NULL, *scaled_seed = NULL;
  int64_t mb = g->train.micro_batches > 1 ? g->train.micro_batches : 1;
  if (pc.loss_scaling) {
    for (int i = 0; i < n && !seed; i++)
      if (old[i]->role == ROLE_BACKWARD) seed = old[i];
    if (seed && !(seed->op == OP_CONST && seed->attr.value == 1.0 / (double)mb && seed->shape.rank == 0))
      duet_fatal(__FILE__, __LINE__, "precision: the first backward value %%%d is not the loss gradient seed", seed->id);
  }

  for (int i = 0; i < n; i++) {
    Value *v = old[i];
    if (v == seed) {
      Attr at = {.dtype = DT_F32};
      Value *ls = graph_add(g, OP_LOSS_SCALE, NULL, 0, &at, v->loc);
      ls->role = ROLE_BACKWARD;
      push(&P, ls);
      scaled_seed = ls;
      if (mb > 1) {
        Attr ca = {.value = v->attr.value, .dtype = DT_F32};
        Value *in[2] = {ls, graph_add(g, OP_CONST, NULL, 0, &ca, v->loc)};
        in[1]->role = ROLE_BACKWARD;
        push(&P, in[1]);
        scaled_seed = graph_add(g, OP_MUL, in, 2, NULL, v->loc);
        scaled_seed->role = ROLE_BACKWARD;
        push(&P, scaled_seed);
      }
      subst[v->id] = scaled_seed;
      weak[v->id] = true;
      continue;
    }
    for (int j = 0; j < v->n_in; j++)
      if (v->in[j]->id < n && subst[v->in[j]->id]) v->in[j] = subst[v->in[j]->id];
    OpPrec c = op_info[v->op].prec;
    if (c == PREC_UPDATE) {
      updates[n_updates++] = v;
      continue;
    }
    if (c == PREC_AFTER_UPDATE) { /* prune_mask: masks the f32 master weight after its update */
      after[n_after++] = v;
      continue;
    }
    if (c == PREC_KEEP) {
      weak[i] = v->op == OP_PARAM || v->op == OP_CONST || v->op == OP_LOSS_SCALE;
      push(&P, v);
      continue;
    }
    DType want = DT_F32;
    if (c == PREC_LOW) {
      want = L;
    } else if (c == PREC_FOLLOW) {
      /* the widest strong (activation) operand; all weak: f32, and weak */
      DType strong = DT_VOID;
      bool all_weak = true;
      for (int j = 0; j < v->n_in; j++) {
        Value *x = v->in[j];
        bool w = x->op == OP_LOSS_SCALE || x == scaled_seed || (x->id < n && old[x->id] == x && weak[x->id]);
        if (!w && dtype_is_float(x->dtype)) strong = wider(strong, x->dtype), all_weak = false;
      }
      want = all_weak ? DT_F32 : strong;
      weak[i] = all_weak;
    }
    for (int j = 0; j < v->n_in; j++)
      if (dtype_is_float(v->in[j]->dtype)) v->in[j] = as_dtype(&P, v->in[j], want, v->role);
    if (v->op == OP_FUSED) v->attr.dtype = want; /* not expected before fuse; kept consistent */
    ir_infer_shape(g, v);
    push(&P, v);
  }

  /* the logits the eval pass measures: their f32 version (the 16-bit value
   * may be fused away into it) */
  if (g->logits && g->logits->id < n && old[g->logits->id] == g->logits) {
    Value *l32 = P.memo[(size_t)g->logits->id * DT_COUNT + DT_F32];
    if (l32) g->logits = l32;
  }
  /* every param's gradient back to f32 (unscaled, overflow flagged) */
  int slot = 0;
  for (int k = 0; k < n_updates; k++) {
    Value *u = updates[k], *p = u->in[0], *gr = u->in[1];
    Value *f;
    if (pc.loss_scaling) {
      Attr at = {.slot = slot++};
      f = graph_add(g, OP_UNSCALE, &gr, 1, &at, p->loc);
      f->role = ROLE_BACKWARD;
      push(&P, f);
    } else {
      f = as_dtype(&P, gr, DT_F32, ROLE_BACKWARD);
    }
    u->in[1] = f;
    p->grad = f;
  }
  for (int k = 0; k < n_updates; k++) push(&P, updates[k]);
  for (int k = 0; k < n_after; k++) push(&P, after[k]);
  g->values = P.order;
  g->n_values = P.n;
  g->cap_values = P.cap;
  graph_renumber(g);
  graph_count_uses(g);
}
