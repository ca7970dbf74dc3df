/* passes/autodiff.c: reverse-mode differentiation.  Appends, after the
 * forward graph, the values d(loss)/d(v) for every v on a path from a
 * parameter to the loss, visiting values in reverse topological order and
 * summing the contributions of multiple uses (standard reverse accumulation,
 * e.g. Griewank & Walther, "Evaluating Derivatives", ch. 3). */
#include "passes.h"

static Value *mk(Graph *g, OpKind op, Value *a, Value *b, const Attr *at, Loc loc) {
  Value *in[3] = {a, b, NULL};
  int n = op_info[op].arity;
  Value *v = graph_add(g, op, in, n, at, loc);
  v->role = ROLE_BACKWARD;
  return v;
}

static Value *mk_const(Graph *g, double x, Loc loc) {
  Attr at = {.value = x, .dtype = g->float_dtype};
  Value *v = graph_add(g, OP_CONST, NULL, 0, &at, loc);
  v->role = ROLE_BACKWARD;
  return v;
}

/* d(broadcast result) -> d(operand of `shape`): sum over broadcast axes.
 * Each SUM_TO reduces one contiguous run of axes (the kernels' [outer,
 * reduced, inner] form), so separated runs (a [C,1,1] bias of [N,C,H,W])
 * become a chain, innermost run first. */
static Value *reduce_to(Graph *g, Value *dy, const Shape *shape, Loc loc) {
  if (shape_eq(&dy->shape, shape)) return dy;
  const Shape *s = &dy->shape;
  int r = s->rank;
  bool red[IR_MAX_RANK];
  for (int d = 0; d < r; d++) {
    int dt = shape->rank - r + d;
    red[d] = s->dim[d] != 1 && (dt < 0 || shape->dim[dt] == 1);
  }
  Value *cur = dy;
  Shape inter = *s;
  for (int d = r - 1; d >= 0;) {
    if (!red[d]) {
      d--;
      continue;
    }
    int lo = d;
    while (lo > 0 && (red[lo - 1] || s->dim[lo - 1] == 1)) lo--;
    bool more = false; /* another run further out? */
    for (int e = 0; e < lo; e++) more |= red[e];
    if (!more) break;
    for (int e = lo; e <= d; e++) inter.dim[e] = 1;
    Attr at = {.shape = inter};
    cur = mk(g, OP_SUM_TO, cur, NULL, &at, loc);
    d = lo - 1;
  }
  Attr at = {.shape = *shape};
  return mk(g, OP_SUM_TO, cur, NULL, &at, loc);
}

static void accumulate(Graph *g, Value **grad, Value *x, Value *dx) {
  if (!x->requires_grad) return;
  DUET_ASSERT(shape_eq(&x->shape, &dx->shape));
  grad[x->id] = grad[x->id] ? mk(g, OP_ADD, grad[x->id], dx, NULL, x->loc) : dx;
}

static Value *matmul(Graph *g, Value *a, Value *b, bool ta, bool tb, Loc loc) {
  Attr at = {.trans_a = ta, .trans_b = tb};
  return mk(g, OP_MATMUL, a, b, &at, loc);
}

void pass_autodiff(Graph *g, PassCtx *cx) {
  (void)cx;
  if (!g->loss || g->decode) return; /* a generation program has no backward */
  int n = g->n_values;
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    v->requires_grad = v->op == OP_PARAM;
    for (int j = 0; j < v->n_in; j++) v->requires_grad |= v->in[j]->requires_grad;
    if (v->op == OP_CROSS_ENTROPY || v->op == OP_EMBEDDING) v->requires_grad = v->in[0]->requires_grad;
  }
  Value **grad = arena_alloc(g->arena, (size_t)n * sizeof *grad);
  if (!g->loss->requires_grad) {
    diag_warning(g->diag, g->loss->loc, "the loss does not depend on any parameter; nothing to train");
    return;
  }
  /* micro-batches: each micro-batch's mean loss is divided by M here, once,
   * so the gradients summed over the M micro-batches are those of the whole
   * batch's mean loss (GPipe, Huang et al. 2019, gradient accumulation) */
  int64_t mb = g->train.micro_batches > 1 ? g->train.micro_batches : 1;
  grad[g->loss->id] = mk_const(g, 1.0 / (double)mb, g->loss->loc);
  for (int i = n - 1; i >= 0; i--) {
    Value *v = g->values[i], *dv = grad[i];
    if (!dv) continue;
    Loc l = v->loc;
    Value *a = v->n_in > 0 ? v->in[0] : NULL, *b = v->n_in > 1 ? v->in[1] : NULL;
    switch (v->op) {
    case OP_PARAM:
      v->grad = dv;
      break;
    case OP_INPUT:
    case OP_CONST:
    case OP_STATE:
      break;
    case OP_MATMUL: {
      bool ta = v->attr.trans_a, tb = v->attr.trans_b;
      if (a->requires_grad)
        accumulate(g, grad, a, ta ? matmul(g, b, dv, tb, true, l) : matmul(g, dv, b, false, !tb, l));
      if (b->requires_grad)
        accumulate(g, grad, b, tb ? matmul(g, dv, a, true, ta, l) : matmul(g, a, dv, !ta, false, l));
      break;
    }
    case OP_ADD:
      if (a->requires_grad) accumulate(g, grad, a, reduce_to(g, dv, &a->shape, l));
      if (b->requires_grad) accumulate(g, grad, b, reduce_to(g, dv, &b->shape, l));
      break;
    case OP_SUB:
      if (a->requires_grad) accumulate(g, grad, a, reduce_to(g, dv, &a->shape, l));
      if (b->requires_grad) accumulate(g, grad, b, reduce_to(g, mk(g, OP_NEG, dv, NULL, NULL, l), &b->shape, l));
      break;
    case OP_MUL:
      if (a->requires_grad) accumulate(g, grad, a, reduce_to(g, mk(g, OP_MUL, dv, b, NULL, l), &a->shape, l));
      if (b->requires_grad) accumulate(g, grad, b, reduce_to(g, mk(g, OP_MUL, dv, a, NULL, l), &b->shape, l));
      break;
    case OP_DIV:
      /* d(a/b)/da = 1/b;  d(a/b)/db = -(a/b)/b */
      if (a->requires_grad) accumulate(g, grad, a, reduce_to(g, mk(g, OP_DIV, dv, b, NULL, l), &a->shape, l));
      if (b->requires_grad) {
        Value *t = mk(g, OP_MUL, dv, mk(g, OP_DIV, v, b, NULL, l), NULL, l);
        accumulate(g, grad, b, reduce_to(g, mk(g, OP_NEG, t, NULL, NULL, l), &b->shape, l));
      }
      break;
    case OP_NEG:
      accumulate(g, grad, a, mk(g, OP_NEG, dv, NULL, NULL, l));
      break;
    case OP_FAKE_QUANT: /* straight-through estimator: identity for the weight, nothing for its maxima */
      if (a->requires_grad) accumulate(g, grad, a, dv);
      break;
    case OP_RELU: /* relu'(x) = [y > 0]: uses the output, so x can be fused away */
      accumulate(g, grad, a, mk(g, OP_RELU_GRAD, dv, v, NULL, l));
      break;
    case OP_MEAN: {
      Value *s = mk(g, OP_MUL, dv, mk_const(g, 1.0 / (double)shape_numel(&a->shape), l), NULL, l);
      Attr at = {.shape = a->shape};
      accumulate(g, grad, a, mk(g, OP_BROADCAST, s, NULL, &at, l));
      break;
    }
    case OP_BROADCAST:
      accumulate(g, grad, a, reduce_to(g, dv, &a->shape, l));
      break;
    case OP_MAX_TO: { /* to the first maximum of each reduced run */
      Attr at = {.shape = a->shape};
      accumulate(g, grad, a, mk(g, OP_MAX_TO_GRAD, dv, a, &at, l));
      break;
    }
    case OP_SUM_TO: {
      Attr at = {.shape = a->shape};
      accumulate(g, grad, a, mk(g, OP_BROADCAST, dv, NULL, &at, l));
      break;
    }
    case OP_DROPOUT: { /* the same mask and scale: dropout of the gradient */
      Attr at = v->attr;
      accumulate(g, grad, a, mk(g, OP_DROPOUT, dv, NULL, &at, l));
      break;
    }
    case OP_RESHAPE: {
      Attr at = {.shape = a->shape};
      accumulate(g, grad, a, mk(g, OP_RESHAPE, dv, NULL, &at, l));
      break;
    }
    case OP_PERMUTE: {
      Attr at = {.shape = a->shape};
      for (int d = 0; d < v->shape.rank; d++) at.perm[v->attr.perm[d]] = d;
      accumulate(g, grad, a, mk(g, OP_PERMUTE, dv, NULL, &at, l));
      break;
    }
    case OP_SLICE: {
      Attr at = v->attr;
      at.shape = a->shape;
      accumulate(g, grad, a, mk(g, OP_SLICE_GRAD, dv, NULL, &at, l));
      break;
    }
    case OP_CONCAT: {
      int64_t start = 0;
      for (int j = 0; j < v->n_in; j++) {
        Value *x = v->in[j];
        int64_t len = x->shape.dim[v->attr.axis];
        if (x->requires_grad) {
          Attr at = {.axis = v->attr.axis, .index = start, .shape = x->shape};
          accumulate(g, grad, x, mk(g, OP_SLICE, dv, NULL, &at, l));
        }
        start += len;
      }
      break;
    }
    case OP_IM2COL:
    case OP_AVGPOOL: {
      Attr at = v->attr;
      at.shape = a->shape;
      accumulate(g, grad, a, mk(g, v->op == OP_IM2COL ? OP_COL2IM : OP_AVGPOOL_GRAD, dv, NULL, &at, l));
      break;
    }
    case OP_MAXPOOL: {
      Attr at = v->attr;
      at.shape = a->shape;
      accumulate(g, grad, a, mk(g, OP_MAXPOOL_GRAD, dv, a, &at, l));
      break;
    }
    case OP_GELU:
      accumulate(g, grad, a, mk(g, OP_GELU_GRAD, dv, a, NULL, l));
      break;
    case OP_EXP: /* exp' = exp: the output */
      accumulate(g, grad, a, mk(g, OP_MUL, dv, v, NULL, l));
      break;
    case OP_LOG: /* 1 / x */
      accumulate(g, grad, a, mk(g, OP_DIV, dv, a, NULL, l));
      break;
    case OP_TANH: /* 1 - y^2, from the output */
      accumulate(g, grad, a, mk(g, OP_TANH_GRAD, dv, v, NULL, l));
      break;
    case OP_SIGMOID: /* y (1 - y), from the output */
      accumulate(g, grad, a, mk(g, OP_SIGMOID_GRAD, dv, v, NULL, l));
      break;
    case OP_SILU: /* s (1 + x (1 - s)), s = sigmoid(x), from the input */
      accumulate(g, grad, a, mk(g, OP_SILU_GRAD, dv, a, NULL, l));
      break;
    case OP_SOFTMAX: { /* y (dy - sum(dy y)) along the axis, from the output */
      Attr at = {.axis = v->attr.axis};
      accumulate(g, grad, a, mk(g, OP_SOFTMAX_GRAD, dv, v, &at, l));
      break;
    }
    case OP_RMS_NORM: {
      Attr at = {.eps = v->attr.eps};
      accumulate(g, grad, a, mk(g, OP_RMS_NORM_GRAD, dv, a, &at, l));
      break;
    }
    case OP_ROPE: { /* a rotation: its gradient is the inverse rotation of dy */
      Attr at = {.heads = v->attr.heads, .base = v->attr.base};
      accumulate(g, grad, a, mk(g, OP_ROPE_GRAD, dv, NULL, &at, l));
      break;
    }
    case OP_MSE_LOSS: { /* d pred = 2 (pred - target) / n * dloss; d target = -d pred */
      Value *s = mk(g, OP_MUL, dv, mk_const(g, 2.0 / (double)shape_numel(&a->shape), l), NULL, l);
      Value *dp = mk(g, OP_MUL, mk(g, OP_SUB, a, b, NULL, l), s, NULL, l);
      if (a->requires_grad) accumulate(g, grad, a, dp);
      if (b->requires_grad) accumulate(g, grad, b, mk(g, OP_NEG, dp, NULL, NULL, l));
      break;
    }
    case OP_TRANSPOSE:
      accumulate(g, grad, a, mk(g, OP_TRANSPOSE, dv, NULL, NULL, l));
      break;
    case OP_EMBEDDING: {
      Attr at = {.shape = a->shape, .dtype = a->dtype};
      accumulate(g, grad, a, mk(g, OP_EMBEDDING_GRAD, dv, b, &at, l));
      break;
    }
    case OP_NORM: {
      Attr at = {.eps = v->attr.eps};
      accumulate(g, grad, a, mk(g, OP_NORM_GRAD, dv, a, &at, l));
      break;
    }
    case OP_ATTENTION: {
      /* one kernel computes dq, dk, dv, packed [3, B, T, C]; with fewer
       * key/value heads (dk, dv [B, T, Ckv]) along the channels, [B, T,
       * C + 2 Ckv]; slices unpack */
      Attr at = {.heads = v->attr.heads, .kv_heads = v->attr.kv_heads, .causal = v->attr.causal, .dtype = v->dtype};
      bool gqa = ir_kv_heads(&v->attr) != v->attr.heads;
      int64_t C = v->shape.dim[2], Ckv = v->in[1]->shape.dim[2];
      if (gqa) {
        at.shape = v->shape;
        at.shape.dim[2] = C + 2 * Ckv;
      } else {
        at.shape.rank = v->shape.rank + 1;
        at.shape.dim[0] = 3;
        for (int d = 0; d < v->shape.rank; d++) at.shape.dim[d + 1] = v->shape.dim[d];
      }
      Value *in[4] = {dv, v->in[0], v->in[1], v->in[2]};
      Value *pk = graph_add(g, OP_ATTENTION_GRAD, in, 4, &at, l);
      pk->role = ROLE_BACKWARD;
      for (int j = 0; j < 3; j++) {
        if (!v->in[j]->requires_grad) continue;
        Attr sl = {.index = j, .axis = 0, .squeeze = true, .shape = v->in[j]->shape, .dtype = v->dtype};
        if (gqa) sl = (Attr){.index = j ? C + (j - 1) * Ckv : 0, .axis = 2, .shape = v->in[j]->shape, .dtype = v->dtype};
        accumulate(g, grad, v->in[j], mk(g, OP_SLICE, pk, NULL, &sl, l));
      }
      break;
    }
    case OP_CROSS_ENTROPY: {
      Value *in[3] = {a, b, dv};
      Value *d = graph_add(g, OP_CROSS_ENTROPY_GRAD, in, 3, NULL, l);
      d->role = ROLE_BACKWARD;
      accumulate(g, grad, a, d);
      break;
    }
    default:
      diag_error(g->diag, l, "autodiff: no gradient rule for %s", op_info[v->op].name);
    }
  }
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    if (v->op == OP_PARAM && !v->grad)
      diag_warning(g->diag, v->loc, "parameter `%s` receives no gradient (it does not affect the loss)",
                   v->attr.name);
  }
}
