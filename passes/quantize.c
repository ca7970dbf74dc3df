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
#include <inttypes.h>
#include <string.h>

#include "passes.h"

/* The largest reduction length of an int8 GEMM: K * 127 * 127 < 2^31, so
 * the int32 sums of int8 products cannot overflow (and are exact in any
 * order: the C and CUDA kernels agree bit for bit). */
#define QUANT_I8_MAX_K (INT32_MAX / (127 * 127))

static void quantize_activations(Graph *g, PassCtx *cx);

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
  DataKind dk = g->train.data;
  if (cx->calibrate > 0 && dk != DATA_FASHION_MNIST && dk != DATA_NONE) /* runtime/calibrate.c reads images */
    diag_error_noloc(g->diag, "--calibrate %" PRId64 " calibrates int8 activations on Fashion-MNIST training images, "
                     "and this model's data is %s(\"%s\"): drop --calibrate (--quantize %s alone gives int8 weights)",
                     cx->calibrate, dk == DATA_TEXT ? "text" : dk == DATA_TOKENS ? "tokens" : "npy",
                     g->train.data_path ? g->train.data_path : "", cx->quantize);
  /* evaluation only: the backward graph, the optimizer and the state only
   * they read (optimizer moments, pruning masks) go (passes/evalonly.c) */
  graph_drop_training(g);
  Arena *a = g->arena;
  int n = g->n_values;
  Value **old = arena_alloc(a, ((size_t)n + 1) * sizeof *old);
  memcpy(old, g->values, (size_t)n * sizeof *old);

  /* forward uses of every kept value (prune_weight_axis) and the names of
   * the tensors (a scale's name must be new) */
  int *cnt = arena_alloc(a, ((size_t)n + 2) * sizeof *cnt), *fill = arena_alloc(a, ((size_t)n + 1) * sizeof *fill);
  NameMap names = {0};
  for (int i = 0; i < n; i++) {
    Value *v = old[i];
    if ((v->op == OP_PARAM || v->op == OP_STATE || v->op == OP_INPUT) && v->attr.name)
      *namemap_slot(a, &names, v->attr.name) = v;
    if (v->role != ROLE_FORWARD) continue;
    for (int j = 0; j < v->n_in; j++) cnt[v->in[j]->id + 1]++;
  }
  for (int i = 0; i < n; i++) cnt[i + 1] += cnt[i];
  Value **use = arena_alloc(a, ((size_t)cnt[n] + 1) * sizeof *use);
  for (int i = 0; i < n; i++) {
    Value *v = old[i];
    if (v->role != ROLE_FORWARD) continue;
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
  if (cx->calibrate > 0) quantize_activations(g, cx);
  g->calibrate = cx->calibrate > 0 ? cx->calibrate : 0;
}

/* --calibrate N: int8 activations too.  Each forward matmul x @ W (or x @
 * transpose(W)) whose weight the pass above quantized (its operand is the
 * dequantize op itself: convolutions read theirs through a reshape, and
 * keep f32 activations) becomes
 *
 *   matmul_i8(x, q, W.scale, W.act_scale)
 *
 * with a new f32 param `W.act_scale` [1]: the activation scale max|x| / 127,
 * 0 until the runtime calibrates it on N training batches before the
 * evaluation (runtime/calibrate.c; the kernel records -max|x| in it while it
 * is <= 0).  A dequantize op left without readers goes.  A weight read by
 * several matmuls gets W.act_scale, W.act_scale2, ... */
static void quantize_activations(Graph *g, PassCtx *cx) {
  Arena *a = g->arena;
  int n = g->n_values;
  Value **old = arena_alloc(a, ((size_t)n + 1) * sizeof *old);
  memcpy(old, g->values, (size_t)n * sizeof *old);
  Value **subst = arena_alloc(a, ((size_t)n + 1) * sizeof *subst), **scale = arena_alloc(a, ((size_t)n + 1) * sizeof *scale);
  int *dq_uses = arena_alloc(a, ((size_t)n + 1) * sizeof *dq_uses), *n_act = arena_alloc(a, ((size_t)n + 1) * sizeof *n_act);
  int n_conv = 0;
  for (int i = 0; i < n; i++) {
    Value *v = old[i];
    Value *dq = v->n_in == 2 ? v->in[1] : NULL;
    if (v->op != OP_MATMUL || v->role != ROLE_FORWARD || v->attr.trans_a || dq->op != OP_DEQUANTIZE ||
        v->in[0]->dtype != DT_F32 || dq->shape.rank != 2)
      continue;
    int64_t K = dq->shape.dim[v->attr.trans_b ? 1 : 0];
    const char *w = dq->in[0]->attr.name;
    if (K > QUANT_I8_MAX_K)
      diag_error(g->diag, v->loc, "--calibrate: the matmul by `%s` sums over %" PRId64 " inputs; int8 x int8 "
                 "products summed in int32 can overflow beyond %d: quantize without --calibrate", w, K,
                 QUANT_I8_MAX_K);
    Attr sa = {.dtype = DT_F32, .shape = {.rank = 1, .dim = {1}}, .init = INIT_ZEROS};
    int c = ++n_act[dq->id];
    sa.name = c == 1 ? arena_printf(a, "%s.act_scale", w) : arena_printf(a, "%s.act_scale%d", w, c);
    for (int j = 0; j < n; j++)
      if ((old[j]->op == OP_PARAM || old[j]->op == OP_STATE || old[j]->op == OP_INPUT) && old[j]->attr.name &&
          !strcmp(old[j]->attr.name, sa.name))
        diag_error(g->diag, old[j]->loc, "tensor `%s` has the name of the activation scale of parameter `%s`: "
                   "rename it", sa.name, w);
    scale[i] = graph_add(g, OP_PARAM, NULL, 0, &sa, v->loc);
    Value *in[4] = {v->in[0], dq->in[0], dq->in[1], scale[i]};
    Attr ma = {.trans_b = v->attr.trans_b};
    subst[i] = graph_add(g, OP_MATMUL_I8, in, 4, &ma, v->loc);
    for (int j = 0; j < 2; j++) {
      Value *x = j ? subst[i] : scale[i];
      x->role = v->role;
      x->block = j ? v->block : 0; /* params belong to no block instance (as the int8 weights) */
      x->device = v->device;
    }
    n_conv++;
  }
  if (!n_conv)
    diag_error_noloc(g->diag, "--calibrate: the model has no matmul whose weight --quantize %s quantizes (the "
                     "activations of convolutions stay f32)", cx->quantize);
  /* readers of the converted matmuls read the int8 GEMMs; a dequantize
   * op nothing reads any more goes */
  for (int i = 0; i < n; i++) {
    Value *v = old[i];
    if (subst[i]) continue;
    for (int j = 0; j < v->n_in; j++) {
      Value *x = v->in[j];
      if (x->id < n && old[x->id] == x && subst[x->id]) v->in[j] = subst[x->id];
      if (v->in[j]->op == OP_DEQUANTIZE && v->in[j]->id < n) dq_uses[v->in[j]->id]++;
    }
  }
  for (int i = 0; i < n; i++) /* the graph's named values (a classifier's logits: a matmul's output) */
    if (subst[i]) {
      if (g->logits == old[i]) g->logits = subst[i];
      if (g->loss == old[i]) g->loss = subst[i];
      if (g->labels == old[i]) g->labels = subst[i];
    }
  int cap = n + n_conv + 8, k = 0;
  Value **order = arena_alloc(a, (size_t)cap * sizeof *order);
  for (int i = 0; i < n; i++) {
    Value *v = old[i];
    if (v->op == OP_DEQUANTIZE && !dq_uses[i]) continue;
    if (subst[i]) {
      order[k++] = scale[i];
      order[k++] = subst[i];
    } else {
      order[k++] = v;
    }
  }
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
