/* passes/quantize.c: post-training int8 weight quantization (the
 * `quantize` pass, --quantize int8 | int8-tensor).
 *
 * The program it makes evaluates a trained checkpoint with int8 weights;
 * it does not train (the CLI refuses --quantize with a training run).  So
 * the pass first drops the backward graph and the optimizer (their values,
 * the optimizer state, the pruning masks), then replaces each quantized
 * weight W (f32 [...]) by
 *
 *   - a param W of dtype i8 and W's shape and name (the int8 weights q),
 *   - a param `W.scale`, f32, of W's rank: one scale per output channel
 *     (the output-channel axis keeps its length, the others are 1: [1, out]
 *     for x @ W of an [in, out] W, [out, 1] for x @ transpose(W), [out, 1,
 *     1, 1] for a convolution's [out, in, kh, kw]), or one per tensor
 *     (every axis 1) with int8-tensor,
 *   - a `dequantize` op (q x scale, broadcast: f32 of W's shape) that
 *     every former reader of W reads instead.
 *
 * The dequantize op is an elementwise kernel that writes the whole f32
 * weight into the activation arena just before its GEMM (the memory plan
 * reuses that space once the GEMM has read it), and the GEMM then runs in
 * f32 (or in 16 bits after the precision pass's casts): what int8 saves is
 * the weights' stored bytes (the param region, checkpoints, the weight file
 * of a compiled program), 4x for f32, not compute.  The scales and the
 * int8 values are computed by the runtime when it loads a checkpoint's f32
 * weights (duet_quantize_i8 in runtime/duet_rt.h: scale = max |w| / 127,
 * round half to even, safe scales for all-zero channels).
 *
 * Which weights: those of matmuls and convolutions, as the prune pass finds
 * them (prune_weight_axis: the second operand of a forward matmul, directly
 * or reshaped from a convolution's weight), of rank 2 or more; never
 * biases, norms, or embedding tables (a table tied to an output projection,
 * as GPT's wte, stays f32: its gather reads it too).  Activations stay f32. */
#include <string.h>

#include "passes.h"

int quantize_mode_parse(const char *s) {
  if (!s || !strcmp(s, "none")) return QUANT_NONE;
  if (!strcmp(s, "int8") || !strcmp(s, "int8-channel")) return QUANT_INT8_CHANNEL;
  if (!strcmp(s, "int8-tensor")) return QUANT_INT8_TENSOR;
  return -1;
}

void pass_quantize(Graph *g, PassCtx *cx) {
  int mode = quantize_mode_parse(cx->quantize);
  if (mode < 0)
    diag_error_noloc(g->diag, "unknown --quantize '%s'; modes are int8 (one scale per output channel), int8-tensor "
                     "(one scale per tensor) and none", cx->quantize);
  if (mode == QUANT_NONE) return;
  Arena *a = g->arena;
  int n = g->n_values;
  Value **old = arena_alloc(a, ((size_t)n + 1) * sizeof *old);
  memcpy(old, g->values, (size_t)n * sizeof *old);

  /* evaluation only: the backward graph and the optimizer go */
  bool *drop = arena_alloc(a, (size_t)n + 1);
  for (int i = 0; i < n; i++) drop[i] = old[i]->role == ROLE_BACKWARD || old[i]->role == ROLE_OPTIMIZER;
  /* state only they read (optimizer moments, pruning masks) goes with them */
  int *live_uses = arena_alloc(a, ((size_t)n + 1) * sizeof *live_uses);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < old[i]->n_in && !drop[i]; j++) live_uses[old[i]->in[j]->id]++;
  for (int i = 0; i < n; i++) {
    if (old[i]->op == OP_STATE && !live_uses[i]) drop[i] = true;
    if (old[i]->op == OP_PARAM) old[i]->grad = NULL;
  }

  /* forward uses of every kept value (prune_weight_axis) and the names of
   * the tensors (a scale's name must be new) */
  int *cnt = arena_alloc(a, ((size_t)n + 2) * sizeof *cnt), *fill = arena_alloc(a, ((size_t)n + 1) * sizeof *fill);
  NameMap names = {0};
  for (int i = 0; i < n; i++) {
    Value *v = old[i];
    if (drop[i]) continue;
    if ((v->op == OP_PARAM || v->op == OP_STATE || v->op == OP_INPUT) && v->attr.name)
      *namemap_slot(a, &names, v->attr.name) = v;
    if (v->role != ROLE_FORWARD) continue;
    for (int j = 0; j < v->n_in; j++) cnt[v->in[j]->id + 1]++;
  }
  for (int i = 0; i < n; i++) cnt[i + 1] += cnt[i];
  Value **use = arena_alloc(a, ((size_t)cnt[n] + 1) * sizeof *use);
  for (int i = 0; i < n; i++) {
    Value *v = old[i];
    if (drop[i] || v->role != ROLE_FORWARD) continue;
    for (int j = 0; j < v->n_in; j++) use[cnt[v->in[j]->id] + fill[v->in[j]->id]++] = v;
  }

  /* the new order: each quantized weight becomes its int8 param, its
   * scales and their dequantize, where the weight was */
  int cap = n + 8;
  for (int i = 0; i < n; i++) cap += 2 * (old[i]->op == OP_PARAM);
  Value **order = arena_alloc(a, (size_t)cap * sizeof *order);
  Value **subst = arena_alloc(a, ((size_t)n + 1) * sizeof *subst);
  int k = 0, n_quant = 0;
  for (int i = 0; i < n; i++) {
    Value *v = old[i];
    if (drop[i]) continue;
    for (int j = 0; j < v->n_in; j++)
      if (v->in[j]->id < n && old[v->in[j]->id] == v->in[j] && subst[v->in[j]->id]) v->in[j] = subst[v->in[j]->id];
    int axis = v->op == OP_PARAM && v->dtype == DT_F32 && v->shape.rank >= 2 ? prune_weight_axis(v, use, cnt) : -1;
    bool embedding = false;
    for (int j = cnt[i]; axis >= 0 && j < cnt[i + 1]; j++) embedding |= use[j]->op == OP_EMBEDDING && use[j]->in[0] == v;
    if (axis < 0 || embedding) {
      order[k++] = v;
      continue;
    }
    Attr qa = {.dtype = DT_I8, .name = v->attr.name, .shape = v->shape, .init = INIT_ZEROS};
    Attr sa = {.dtype = DT_F32, .shape = v->shape, .init = INIT_ONES};
    for (int d = 0; d < sa.shape.rank; d++)
      if (mode == QUANT_INT8_TENSOR || d != axis) sa.shape.dim[d] = 1;
    sa.name = arena_printf(a, "%s.scale", v->attr.name);
    void **slot = namemap_slot(a, &names, sa.name);
    if (*slot) {
      const Value *x = *slot;
      diag_error(g->diag, x->loc, "%s `%s` has the name of the int8 scales of parameter `%s` (line %d): rename one "
                 "of them", x->op == OP_PARAM ? "parameter" : x->op == OP_INPUT ? "input" : "tensor", sa.name,
                 v->attr.name, v->loc.line);
    }
    Value *in[2];
    in[0] = graph_add(g, OP_PARAM, NULL, 0, &qa, v->loc);
    in[1] = graph_add(g, OP_PARAM, NULL, 0, &sa, v->loc);
    *slot = in[1];
    Value *dq = graph_add(g, OP_DEQUANTIZE, in, 2, NULL, v->loc);
    for (int j = 0; j < 3; j++) {
      Value *x = j < 2 ? in[j] : dq;
      x->role = v->role;
      x->block = v->block;
      x->device = v->device;
      order[k++] = x;
    }
    subst[i] = dq;
    n_quant++;
  }
  if (!n_quant)
    diag_error_noloc(g->diag, "--quantize %s: the model has no matmul or convolution weight to quantize", cx->quantize);
  g->values = order;
  g->n_values = k;
  g->cap_values = cap;
  graph_renumber(g);
  graph_count_uses(g);
}

/* Quantization-aware training (the `qat` pass, from the model's `quantize {
 * weights = int8  mode = qat }` section, before autodiff): each weight W the
 * quantize pass would quantize is read through
 *
 *   m = max_to(relu(W) + relu(-W))   (max |W| per output channel, or per
 *                                     tensor: the scales' shape above)
 *   fake_quantize(W, m)               (W to int8 and back with scale m / 127,
 *                                     duet_quantize_i8's numbers)
 *
 * in the forward pass (training and evaluation), so the run trains and
 * reports the accuracy of the int8 weights `--quantize int8` evaluates its
 * checkpoint with.  The backward pass is the straight-through estimator
 * (Bengio et al. 2013; Jacob et al. 2018): d/dW is the gradient at the
 * fake-quantized weight, unchanged (no |W| exceeds its channel's maximum,
 * so nothing is clipped), and none flows into m.  With --quantize (an
 * evaluation of a checkpoint) nothing is inserted: the quantize pass
 * quantizes the weights themselves. */
void pass_qat(Graph *g, PassCtx *cx) {
  if (!g->qat || g->decode || quantize_mode_parse(cx->quantize) > 0) return;
  Arena *a = g->arena;
  int n = g->n_values;
  Value **old = arena_alloc(a, ((size_t)n + 1) * sizeof *old);
  memcpy(old, g->values, (size_t)n * sizeof *old);
  int *cnt = arena_alloc(a, ((size_t)n + 2) * sizeof *cnt), *fill = arena_alloc(a, ((size_t)n + 1) * sizeof *fill);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < old[i]->n_in; j++) cnt[old[i]->in[j]->id + 1]++;
  for (int i = 0; i < n; i++) cnt[i + 1] += cnt[i];
  Value **use = arena_alloc(a, ((size_t)cnt[n] + 1) * sizeof *use);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < old[i]->n_in; j++) use[cnt[old[i]->in[j]->id] + fill[old[i]->in[j]->id]++] = old[i];
  int cap = n + 8;
  for (int i = 0; i < n; i++) cap += 6 * (old[i]->op == OP_PARAM);
  Value **order = arena_alloc(a, (size_t)cap * sizeof *order);
  Value **subst = arena_alloc(a, ((size_t)n + 1) * sizeof *subst);
  int k = 0, n_fq = 0;
  for (int i = 0; i < n; i++) {
    Value *v = old[i];
    for (int j = 0; j < v->n_in; j++)
      if (v->in[j]->id < n && old[v->in[j]->id] == v->in[j] && subst[v->in[j]->id]) v->in[j] = subst[v->in[j]->id];
    order[k++] = v;
    int axis = v->op == OP_PARAM && dtype_is_float(v->dtype) && v->shape.rank >= 2 ? prune_weight_axis(v, use, cnt) : -1;
    bool embedding = false;
    for (int j = cnt[i]; axis >= 0 && j < cnt[i + 1]; j++) embedding |= use[j]->op == OP_EMBEDDING && use[j]->in[0] == v;
    if (axis < 0 || embedding) continue;
    Attr ma = {.dtype = v->dtype, .shape = v->shape};
    for (int d = 0; d < ma.shape.rank; d++)
      if (g->qat == QUANT_INT8_TENSOR || d != axis) ma.shape.dim[d] = 1;
    Value *x[6];
    x[0] = graph_add(g, OP_NEG, &v, 1, NULL, v->loc);
    x[1] = graph_add(g, OP_RELU, &v, 1, NULL, v->loc);
    x[2] = graph_add(g, OP_RELU, &x[0], 1, NULL, v->loc);
    Value *in[2] = {x[1], x[2]};
    x[3] = graph_add(g, OP_ADD, in, 2, NULL, v->loc);
    x[4] = graph_add(g, OP_MAX_TO, &x[3], 1, &ma, v->loc);
    in[0] = v, in[1] = x[4];
    x[5] = graph_add(g, OP_FAKE_QUANT, in, 2, NULL, v->loc);
    for (int j = 0; j < 6; j++) order[k++] = x[j];
    subst[i] = x[5];
    n_fq++;
  }
  if (!n_fq)
    diag_error(g->diag, g->qat_loc, "quantize section: the model has no matmul or convolution weight to quantize");
  g->values = order;
  g->n_values = k;
  g->cap_values = cap;
  graph_renumber(g);
  graph_count_uses(g);
}
