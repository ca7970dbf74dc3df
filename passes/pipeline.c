/* passes/pipeline.c: the pass list, the shape pass, the optimizer and eval
 * passes, and the driver that verifies and dumps between passes (QBE main.c
 * style). */
#include <string.h>

#include "passes.h"

const Pass duet_passes[] = {
    {"shape", pass_shape, "infer and check the shape and dtype of every value"},
    {"qat", pass_qat, "quantization-aware training (quantize { weights = int8  mode = qat }): fake-quantized weights in the forward pass"},
    {"autodiff", pass_autodiff, "append the backward graph: d(loss)/d(param) for every param"},
    {"optimizer", pass_optimizer, "append the optimizer update (AdamW, f32 or 8-bit state; SGD) of every param"},
    {"eval", pass_eval, "append the evaluation metrics (correct predictions, summed loss)"},
    {"prune", pass_prune, "magnitude pruning (--prune): a mask per pruned weight, applied after every optimizer step"},
    {"shrink", pass_shrink, "--shrink with --prune-mode channels: the pruned channels removed from each layer and the next layer's inputs; evaluation only"},
    {"quantize", pass_quantize, "int8 weights (--quantize int8|int8-tensor): i8 params, f32 scales, a dequantize before each GEMM; with --calibrate N, int8 GEMMs (matmul_i8) with calibrated activation scales; evaluation only"},
    {"evalonly", pass_evalonly, "duet run --eval-only, duet compile --checkpoint: the backward graph, the optimizer and the state only they read (moments, pruning masks) dropped; an evaluation program"},
    {"precision", pass_precision, "choose storage dtypes (--precision): 16-bit activations, f32 master weights, casts"},
    {"fuse", pass_fuse, "fuse chains of elementwise ops into single loops"},
    {"partition", pass_partition, "assign every op a device (pipeline stage) and insert transfers at the cuts"},
    {"data_parallel", pass_data_parallel, "group the param gradients into all-reduce buckets (--data-parallel N); --zero 1: reduce-scatter, sharded updates, all-gather"},
    {"recompute", pass_recompute, "activation recomputation (--recompute): backward reads of block activations become copies"},
    {"memplan", pass_memplan, "assign byte offsets: params, optimizer state, activation arena"},
};
const int duet_n_passes = (int)(sizeof duet_passes / sizeof duet_passes[0]);

int passes_find(const char *name) {
  for (int i = 0; i < duet_n_passes; i++)
    if (!strcmp(duet_passes[i].name, name)) return i;
  return -1;
}

int passes_run(Graph *g, PassCtx *cx) {
  jmp_buf jb, *saved = cx->diag->jmp;
  cx->diag->jmp = &jb;
  if (setjmp(jb)) {
    cx->diag->jmp = saved;
    return 1;
  }
  int first = cx->start_after ? passes_find(cx->start_after) + 1 : 0;
  int stop = cx->stop_after ? passes_find(cx->stop_after) : duet_n_passes - 1;
  if (first > 0 && cx->dump_after && !strcmp(cx->dump_after, cx->start_after))
    ir_print(g, cx->dump_out ? cx->dump_out : stdout);
  for (int i = first; i < duet_n_passes && (stop < 0 || i <= stop); i++) {
    duet_passes[i].run(g, cx);
    g->after_pass = duet_passes[i].name;
    if (cx->verify && ir_verify(g, duet_passes[i].name, stderr)) {
      cx->diag->jmp = saved;
      return 1;
    }
    if (cx->dump_after && !strcmp(cx->dump_after, duet_passes[i].name))
      ir_print(g, cx->dump_out ? cx->dump_out : stdout);
  }
  cx->diag->jmp = saved;
  return 0;
}

/* Also removes dead values (an unused expression, a `transpose` folded into
 * a matmul): everything but inputs, params, the loss and side effects. */
void pass_shape(Graph *g, PassCtx *cx) {
  (void)cx;
  for (int i = 0; i < g->n_values; i++) ir_infer_shape(g, g->values[i]);
  graph_count_uses(g);
  bool changed = true;
  while (changed) {
    changed = false;
    int k = 0;
    for (int i = 0; i < g->n_values; i++) {
      Value *v = g->values[i];
      bool keep = v->n_uses > 0 || v->op == OP_INPUT || v->op == OP_PARAM || v == g->loss ||
                  (op_info[v->op].flags & OPF_SIDE);
      if (keep) {
        g->values[k++] = v;
      } else {
        for (int j = 0; j < v->n_in; j++) v->in[j]->n_uses--;
        changed = true;
      }
    }
    g->n_values = k;
  }
  /* a cross_entropy that does not feed the loss was removed with its
   * logits: there is nothing to evaluate then */
  bool logits_live = false;
  for (int i = 0; i < g->n_values && g->logits; i++) logits_live |= g->values[i] == g->logits;
  if (!logits_live) g->logits = g->labels = NULL;
  graph_renumber(g);
  graph_count_uses(g);
}

/* State tensors are named like PyTorch's optimizer state keys: the param's
 * name, a dot, the key.  Checkpoints store params and state under these
 * names, so a state must not take the name of another tensor: a block
 * param `exp_avg` in the first call of a block `w` is `w1.exp_avg`, which
 * is also the AdamW state of a param `w1`.  That is a user error at the
 * param that holds the name (`names`: the graph's named tensors). */
static Value *state_as(Graph *g, PassCtx *cx, NameMap *names, Value *p, const char *suffix, DType dt, Shape shape) {
  Attr at = {.shape = shape, .dtype = dt, .init = INIT_ZEROS};
  at.name = arena_printf(g->arena, "%s.%s", p->attr.name, suffix);
  void **slot = namemap_slot(g->arena, names, at.name);
  if (*slot) {
    const Value *o = *slot;
    const char *opt = g->train.optimizer == OPTIM_ADAMW ? "AdamW" : "SGD";
    diag_error(cx->diag, o->loc,
               "%s `%s` has the checkpoint name of the %s state `%s` of parameter `%s` (line %d): rename one of them",
               o->op == OP_PARAM ? "parameter" : o->op == OP_INPUT ? "input" : "tensor", at.name, opt, suffix,
               p->attr.name, p->loc.line);
  }
  Value *v = graph_add(g, OP_STATE, NULL, 0, &at, p->loc);
  v->role = ROLE_OPTIMIZER;
  *slot = v;
  return v;
}

static Value *state(Graph *g, PassCtx *cx, NameMap *names, Value *p, const char *suffix) {
  return state_as(g, cx, names, p, suffix, p->dtype, p->shape);
}

/* 8-bit AdamW state (runtime/duet_q8.h): per moment the codes (u8, the
 * param's shape: `w.exp_avg.codes`) and the block scales (f32, one per
 * DUET_Q8_BLOCK values: `w.exp_avg.absmax`).  The update then reads
 * p, g, exp_avg codes, exp_avg_sq codes, exp_avg absmax, exp_avg_sq absmax. */
static Value *adamw8(Graph *g, PassCtx *cx, NameMap *names, Value *p, const Attr *at) {
  if (p->dtype != DT_F32)
    diag_error(cx->diag, p->loc, "adamw state = int8 needs f32 parameters; `%s` is %s", p->attr.name,
               dtype_name(p->dtype));
  int64_t n = shape_numel(&p->shape);
  Shape sc = {.rank = 1, .dim = {(n + IR_Q8_BLOCK - 1) / IR_Q8_BLOCK}};
  Value *in[6] = {p, p->grad, state_as(g, cx, names, p, "exp_avg.codes", DT_U8, p->shape),
                  state_as(g, cx, names, p, "exp_avg_sq.codes", DT_U8, p->shape),
                  state_as(g, cx, names, p, "exp_avg.absmax", DT_F32, sc),
                  state_as(g, cx, names, p, "exp_avg_sq.absmax", DT_F32, sc)};
  return graph_add(g, OP_ADAMW, in, 6, at, p->loc);
}

void pass_optimizer(Graph *g, PassCtx *cx) {
  int n = g->n_values;
  NameMap names = {0};
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    if ((v->op == OP_PARAM || v->op == OP_STATE || v->op == OP_INPUT) && v->attr.name)
      *namemap_slot(g->arena, &names, v->attr.name) = v;
  }
  if (cx->optim_state && g->train.optimizer != OPTIM_ADAMW && !strcmp(cx->optim_state, "int8"))
    diag_error_noloc(cx->diag, "--optimizer-state int8 quantizes AdamW's moments; this model trains with sgd "
                     "(use adamw, or leave the flag out)");
  if (cx->optim_state) g->train.state_int8 = !strcmp(cx->optim_state, "int8");
  for (int i = 0; i < n && !g->decode; i++) {
    Value *p = g->values[i];
    if (p->op != OP_PARAM || !p->grad) continue;
    Value *u;
    /* decay = "matrices": biases, norms' gains and other vectors get none
     * (nanoGPT's parameter groups) */
    Attr at = {.no_decay = g->train.decay_matrices_only && p->shape.rank < 2};
    if (g->train.optimizer == OPTIM_ADAMW && g->train.state_int8) {
      u = adamw8(g, cx, &names, p, &at);
    } else if (g->train.optimizer == OPTIM_ADAMW) {
      Value *in[4] = {p, p->grad, state(g, cx, &names, p, "exp_avg"), state(g, cx, &names, p, "exp_avg_sq")};
      u = graph_add(g, OP_ADAMW, in, 4, &at, p->loc);
    } else {
      Value *in[3] = {p, p->grad, state(g, cx, &names, p, "momentum_buffer")};
      u = graph_add(g, OP_SGD, in, 3, &at, p->loc);
    }
    u->role = ROLE_OPTIMIZER;
  }
}

void pass_eval(Graph *g, PassCtx *cx) {
  (void)cx;
  if (!g->logits) return;
  Value *in[2] = {g->logits, g->labels};
  Value *v = graph_add(g, OP_EVAL_METRICS, in, 2, NULL, g->loss->loc);
  v->role = ROLE_EVAL;
  graph_count_uses(g);
}
