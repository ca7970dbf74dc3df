/* codegen/lower.c: planned Graph -> runtime program tables + kernel IR. */
#include <inttypes.h>
#include <string.h>

#include "codegen.h"
#include "../runtime/duet_q8.h"

typedef struct Lower {
  Graph *g;
  Arena *a;
  CgProgram *cp;
  int cap_kernels;
} Lower;

/* Index terms that broadcast a tensor of shape `in` over the flat index of
 * shape `out` (numpy rules: `in` right-aligned, size-1 axes repeat). */
static int index_terms(const Shape *in, const Shape *out, KIndexTerm *terms) {
  int r = out->rank, n = 0;
  int64_t ostride = 1, istride = 1;
  for (int d = r - 1; d >= 0; d--) {
    int di = in->rank - r + d;
    int64_t od = out->dim[d], id = di >= 0 ? in->dim[di] : 1;
    if (od != 1 && id == od) {
      /* merge with the previous (inner) term when contiguous in both */
      if (n > 0 && terms[n - 1].div * terms[n - 1].mod == ostride &&
          terms[n - 1].mul * terms[n - 1].mod == istride) {
        terms[n - 1].mod *= od;
      } else {
        terms[n++] = (KIndexTerm){ostride, od, istride};
      }
    }
    ostride *= od;
    istride *= id;
  }
  /* the outermost term needs no modulo */
  if (n > 0 && terms[n - 1].div * terms[n - 1].mod == ostride) terms[n - 1].mod = 0;
  return n;
}

static Kernel *new_kernel(Lower *L, KernelKind kind, DType dt) {
  CgProgram *cp = L->cp;
  if (cp->n_kernels == L->cap_kernels) {
    int cap = L->cap_kernels ? 2 * L->cap_kernels : 64;
    Kernel *nk = arena_alloc(L->a, (size_t)cap * sizeof *nk);
    if (cp->n_kernels) memcpy(nk, cp->kernels, (size_t)cp->n_kernels * sizeof *nk);
    cp->kernels = nk;
    L->cap_kernels = cap;
  }
  Kernel *k = &cp->kernels[cp->n_kernels];
  memset(k, 0, sizeof *k);
  k->kind = kind;
  k->index = cp->n_kernels++;
  k->dtype = dt;
  return k;
}

static int add_buf(Kernel *k, int tensor, DType dt, const Shape *shape, const Shape *out) {
  for (int i = 0; i < k->n_bufs; i++)
    if (k->bufs[i].tensor == tensor) return i;
  DUET_ASSERT(k->n_bufs < KMAX_BUFS);
  KBuf *b = &k->bufs[k->n_bufs];
  b->tensor = tensor;
  b->dtype = dt;
  b->n_terms = out ? index_terms(shape, out, b->terms) : 0;
  return k->n_bufs++;
}

typedef struct InsBuf {
  KInstr ins[KMAX_INS];
  int n;
} InsBuf;

static int ins(InsBuf *b, KOp op, int x, int y, double value) {
  DUET_ASSERT(b->n < KMAX_INS);
  b->ins[b->n] = (KInstr){op, x, y, value};
  return b->n++;
}

static void finish_ew(Lower *L, Kernel *k, InsBuf *b, int64_t n) {
  k->n = n;
  k->n_ins = b->n;
  k->ins = arena_alloc(L->a, (size_t)b->n * sizeof *k->ins);
  memcpy(k->ins, b->ins, (size_t)b->n * sizeof *k->ins);
}

/* Each op's kernel-IR opcode (ops.def's kop column), -1 for none. */
static const int op_kop[OP_COUNT] = {
#define KI(x) KI_##x
#define NO_KI -1
#define OP(id, name, n, rule, flags, surface, prec, kop) [OP_##id] = kop,
#include "../ir/ops.def"
#undef OP
#undef NO_KI
#undef KI
};

int kop_op(KOp k) {
  for (int i = 0; i < OP_COUNT; i++)
    if (op_kop[i] == (int)k) return i;
  return -1;
}

int kop_operands(KOp k) {
  if (k == KI_SQRT) return 1;
  int op = kop_op(k);
  return op < 0 ? 0 : op_info[op].arity;
}

static KOp kop_of(OpKind op) {
  DUET_ASSERT(op_kop[op] >= 0);
  return (KOp)op_kop[op];
}

static int tid(Lower *L, const Value *v) {
  int t = L->cp->tensor_of[v->id];
  DUET_ASSERT(t >= 0);
  return t;
}

/* Elementwise kernel for a single EW op, a FUSED op or a materialised CONST. */
static int lower_elementwise(Lower *L, Value *v) {
  Kernel *k = new_kernel(L, KK_ELEMENTWISE, v->dtype);
  InsBuf b = {.n = 0};
  int res;
  if (v->op == OP_CONST) {
    res = ins(&b, KI_CONST, 0, 0, v->attr.value);
  } else if (v->op == OP_LOSS_SCALE) {
    res = ins(&b, KI_SCALAR, DUET_S_LOSS_SCALE, 0, 0);
  } else if (v->op == OP_FUSED) {
    const FusedProg *p = v->attr.prog;
    int *map = arena_alloc(L->a, (size_t)p->n * sizeof *map);
    for (int i = 0; i < p->n; i++) {
      const FusedInstr *f = &p->ins[i];
      if (f->op == OP_COUNT) {
        Value *x = v->in[f->a];
        map[i] = ins(&b, KI_LOAD, add_buf(k, tid(L, x), x->dtype, &x->shape, &v->shape), 0, 0);
      } else if (f->op == OP_CONST) {
        map[i] = ins(&b, KI_CONST, 0, 0, f->value);
      } else if (f->op == OP_BROADCAST) {
        map[i] = map[f->a];
      } else if (f->op == OP_LOSS_SCALE) {
        map[i] = ins(&b, KI_SCALAR, DUET_S_LOSS_SCALE, 0, 0);
      } else if (f->op == OP_CAST) {
        map[i] = ins(&b, KI_CAST, map[f->a], 0, (double)f->site);
      } else {
        map[i] = f->op == OP_DROPOUT ? ins(&b, KI_DROPOUT, map[f->a], (int)f->site, f->value)
                                     : ins(&b, kop_of(f->op), map[f->a], op_info[f->op].arity > 1 ? map[f->b] : 0, 0);
      }
    }
    res = map[p->n - 1];
  } else {
    int opnd[2] = {0, 0};
    for (int j = 0; j < v->n_in; j++) {
      Value *x = v->in[j];
      opnd[j] = x->op == OP_CONST && x->region == MEM_NONE
                    ? ins(&b, KI_CONST, 0, 0, x->attr.value)
                    : ins(&b, KI_LOAD, add_buf(k, tid(L, x), x->dtype, &x->shape, &v->shape), 0, 0);
    }
    res = v->op == OP_BROADCAST ? opnd[0]
          : v->op == OP_CAST    ? ins(&b, KI_CAST, opnd[0], 0, (double)v->dtype)
          : v->op == OP_DROPOUT ? ins(&b, KI_DROPOUT, opnd[0], (int)v->attr.site, v->attr.p)
                                : ins(&b, kop_of(v->op), opnd[0], opnd[1], 0);
  }
  /* a final rounding to the output's own dtype is the store's */
  if (res == b.n - 1 && b.ins[res].op == KI_CAST && (DType)(int)b.ins[res].value == v->dtype) res = b.ins[--b.n].a;
  int out = add_buf(k, tid(L, v), v->dtype, &v->shape, &v->shape);
  ins(&b, KI_STORE, out, res, 0);
  finish_ew(L, k, &b, shape_numel(&v->shape));
  return k->index;
}

_Static_assert(IR_Q8_BLOCK == DUET_Q8_BLOCK, "the IR's and the runtime's 8-bit state block sizes differ");

/* AdamW exactly as torch.optim.AdamW (single-tensor path, torch 2.x):
 *   p *= 1 - lr*wd;  m = m + (1-b1)(g - m);  v = b2 v + (1-b2) g^2
 *   p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
 * SGD as torch.optim.SGD (dampening 0, no Nesterov):
 *   d = g + wd p;  buf = momentum buf + d;  p -= lr buf */
static int lower_adamw8(Lower *L, Value *v) {
  Kernel *k = new_kernel(L, KK_ADAMW8, DT_F32);
  for (int j = 0; j < 6; j++) add_buf(k, tid(L, v->in[j]), v->in[j]->dtype, NULL, NULL);
  k->n = shape_numel(&v->in[0]->shape);
  k->no_decay = v->attr.no_decay;
  return k->index;
}

static int lower_optimizer(Lower *L, Value *v) {
  if (v->op == OP_ADAMW && v->n_in == 6) return lower_adamw8(L, v); /* 8-bit state */
  Kernel *k = new_kernel(L, KK_ELEMENTWISE, v->in[0]->dtype);
  InsBuf b = {.n = 0};
  const Shape *s = &v->in[0]->shape;
  int bp = add_buf(k, tid(L, v->in[0]), v->in[0]->dtype, s, s);
  int bg = add_buf(k, tid(L, v->in[1]), v->in[1]->dtype, s, s);
  int p = ins(&b, KI_LOAD, bp, 0, 0), g = ins(&b, KI_LOAD, bg, 0, 0);
  if (v->op == OP_ADAMW) {
    int bm = add_buf(k, tid(L, v->in[2]), v->in[2]->dtype, s, s);
    int bv = add_buf(k, tid(L, v->in[3]), v->in[3]->dtype, s, s);
    int m = ins(&b, KI_LOAD, bm, 0, 0), vv = ins(&b, KI_LOAD, bv, 0, 0);
    int b2 = ins(&b, KI_SCALAR, DUET_S_BETA2, 0, 0), eps = ins(&b, KI_SCALAR, DUET_S_EPS, 0, 0);
    int omb1 = ins(&b, KI_SCALAR, DUET_S_ONE_MINUS_BETA1, 0, 0), omb2 = ins(&b, KI_SCALAR, DUET_S_ONE_MINUS_BETA2, 0, 0);
    int ss = ins(&b, KI_SCALAR, DUET_S_STEP_SIZE, 0, 0), bc2 = ins(&b, KI_SCALAR, DUET_S_BC2_SQRT, 0, 0);
    int p1 = v->attr.no_decay ? p : ins(&b, KI_MUL, p, ins(&b, KI_SCALAR, DUET_S_DECAY, 0, 0), 0);
    int m1 = ins(&b, KI_ADD, m, ins(&b, KI_MUL, ins(&b, KI_SUB, g, m, 0), omb1, 0), 0);
    int v1 = ins(&b, KI_ADD, ins(&b, KI_MUL, b2, vv, 0), ins(&b, KI_MUL, omb2, ins(&b, KI_MUL, g, g, 0), 0), 0);
    int den = ins(&b, KI_ADD, ins(&b, KI_DIV, ins(&b, KI_SQRT, v1, 0, 0), bc2, 0), eps, 0);
    int p2 = ins(&b, KI_SUB, p1, ins(&b, KI_MUL, ss, ins(&b, KI_DIV, m1, den, 0), 0), 0);
    ins(&b, KI_STORE, bm, m1, 0);
    ins(&b, KI_STORE, bv, v1, 0);
    ins(&b, KI_STORE, bp, p2, 0);
  } else {
    int bm = add_buf(k, tid(L, v->in[2]), v->in[2]->dtype, s, s);
    int buf = ins(&b, KI_LOAD, bm, 0, 0);
    int mom = ins(&b, KI_SCALAR, DUET_S_MOMENTUM, 0, 0);
    int lr = ins(&b, KI_SCALAR, DUET_S_LR, 0, 0), wd = ins(&b, KI_SCALAR, DUET_S_WEIGHT_DECAY, 0, 0);
    int d = v->attr.no_decay ? g : ins(&b, KI_ADD, g, ins(&b, KI_MUL, wd, p, 0), 0);
    int buf1 = ins(&b, KI_ADD, ins(&b, KI_MUL, mom, buf, 0), d, 0);
    int p1 = ins(&b, KI_SUB, p, ins(&b, KI_MUL, lr, buf1, 0), 0);
    ins(&b, KI_STORE, bm, buf1, 0);
    ins(&b, KI_STORE, bp, p1, 0);
  }
  finish_ew(L, k, &b, shape_numel(s));
  return k->index;
}

/* A pruning mask applied after the optimizer step: the param and its
 * optimizer state (in[0], in[2..]) keep their values where the mask in[1]
 * is 1 and become +0 where it is 0: mask > 0 ? x : 0, the kernel IR's
 * select (KI_RELU_GRAD's x > 0 ? dy : 0 with the mask as x).  A multiply
 * would leave -0 for a negative weight and NaN for an infinite one. */
static int lower_prune_mask(Lower *L, Value *v) {
  Kernel *k = new_kernel(L, KK_ELEMENTWISE, v->in[0]->dtype);
  InsBuf b = {.n = 0};
  const Shape *s = &v->in[0]->shape;
  int bm = add_buf(k, tid(L, v->in[1]), v->in[1]->dtype, s, s);
  int m = ins(&b, KI_LOAD, bm, 0, 0);
  for (int j = 0; j < v->n_in; j++) {
    if (j == 1) continue;
    int bx = add_buf(k, tid(L, v->in[j]), v->in[j]->dtype, s, s);
    ins(&b, KI_STORE, bx, ins(&b, KI_RELU_GRAD, ins(&b, KI_LOAD, bx, 0, 0), m, 0), 0);
  }
  finish_ew(L, k, &b, shape_numel(s));
  return k->index;
}

/* The program's shrink table (DuetProgram.shrink) from the graph's
 * (passes/shrink.c); NULL without one. */
static const DuetShrink *lower_shrink_table(Lower *L) {
  Graph *g = L->g;
  if (!g->n_shrink) return NULL;
  DuetShrink *sh = arena_alloc(L->a, sizeof *sh);
  DuetShrinkAxis *ax = arena_alloc(L->a, (size_t)g->n_shrink * sizeof *ax);
  sh->sparsity = g->prune.sparsity;
  sh->n = g->n_shrink;
  sh->axes = ax;
  for (int k = 0; k < g->n_shrink; k++) {
    const ShrinkAxis *x = &g->shrink[k];
    int ids[3] = {-1, -1, -1};
    for (int i = 0; i < g->n_values; i++) {
      const Value *v = g->values[i];
      if (v->op != OP_PARAM || !v->attr.name || L->cp->tensor_of[v->id] < 0) continue;
      if (!strcmp(v->attr.name, x->param)) ids[0] = tid(L, v);
      if (!strcmp(v->attr.name, x->source)) ids[1] = tid(L, v);
      if (x->next_bias && !strcmp(v->attr.name, x->next_bias)) ids[2] = tid(L, v);
    }
    if (ids[0] < 0 || ids[1] < 0 || (x->next_bias && ids[2] < 0))
      duet_fatal(__FILE__, __LINE__, "codegen: shrink: no param `%s`",
                 ids[0] < 0 ? x->param : ids[1] < 0 ? x->source : x->next_bias);
    ax[k] = (DuetShrinkAxis){.param = ids[0], .axis = x->axis, .full = x->full, .group = x->group, .source = ids[1],
                             .kind = x->kind, .next_out = x->next_out, .next_bias = ids[2],
                             .acts = x->acts ? x->acts : "", .fold = x->fold};
  }
  return sh;
}

/* The program's pruning table (DuetProgram.prune) from the prune_mask ops
 * and the graph's prune spec; NULL without pruning. */
static const DuetPrune *lower_prune_table(Lower *L) {
  Graph *g = L->g;
  int n = 0;
  for (int i = 0; i < g->n_values; i++) n += g->values[i]->op == OP_PRUNE_MASK;
  if (!n) return NULL;
  PruneSpec spec = g->prune;
  char err[400];
  if (prune_spec_resolve(&spec, err, sizeof err)) duet_fatal(__FILE__, __LINE__, "codegen: prune spec: %s", err);
  DuetPrune *pr = arena_alloc(L->a, sizeof *pr);
  DuetPruneParam *pp = arena_alloc(L->a, (size_t)n * sizeof *pp);
  pr->mode = spec.mode == PRUNE_GLOBAL ? DUET_PRUNE_GLOBAL : spec.mode == PRUNE_NM ? DUET_PRUNE_NM
           : spec.mode == PRUNE_CHANNELS ? DUET_PRUNE_CHANNELS : DUET_PRUNE_UNSTRUCTURED;
  pr->nm_n = spec.nm_n;
  pr->nm_m = spec.nm_m;
  pr->initial = spec.initial;
  pr->final = spec.sparsity;
  pr->start = spec.start;
  pr->end = spec.end;
  pr->every = spec.every;
  pr->n_params = n;
  pr->params = pp;
  for (int i = 0, k = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    if (v->op != OP_PRUNE_MASK) continue;
    DuetPruneParam *q = &pp[k++];
    const Shape *s = &v->in[0]->shape;
    int64_t numel = shape_numel(s);
    q->param = tid(L, v->in[0]);
    q->mask = tid(L, v->in[1]);
    q->state[0] = v->n_in > 2 ? tid(L, v->in[2]) : -1;
    q->state[1] = v->n_in > 3 ? tid(L, v->in[3]) : -1;
    if (v->attr.axis < 0 || s->rank == 0) { /* no channels: one row of inputs */
      q->out_n = 1, q->out_stride = numel, q->in_n = numel, q->in_stride = 1;
    } else if (v->attr.axis == 0) { /* [out, inputs...] */
      q->out_n = s->dim[0], q->out_stride = numel / s->dim[0], q->in_n = numel / s->dim[0], q->in_stride = 1;
    } else { /* [inputs..., out] */
      q->out_n = s->dim[s->rank - 1], q->out_stride = 1, q->in_n = numel / s->dim[s->rank - 1];
      q->in_stride = s->dim[s->rank - 1];
    }
    if (pr->mode == DUET_PRUNE_NM && (v->attr.axis < 0 || q->in_n % pr->nm_m))
      duet_fatal(__FILE__, __LINE__, "codegen: %%%d: %d:%d pruning of %" PRId64 " inputs", v->id, pr->nm_n, pr->nm_m,
                 q->in_n);
  }
  return pr;
}

/* g * (1 / loss scale) in f32, and flag `slot` set when any element is not
 * finite (the overflow check of dynamic loss scaling, fused into this pass
 * over the gradient). */
static int lower_unscale(Lower *L, Value *v) {
  Kernel *k = new_kernel(L, KK_UNSCALE, DT_F32);
  add_buf(k, tid(L, v->in[0]), v->in[0]->dtype, NULL, NULL);
  add_buf(k, tid(L, v), v->dtype, NULL, NULL);
  k->n = shape_numel(&v->shape);
  k->slot = v->attr.slot;
  return k->index;
}

/* Gradient clipping (the train section's clip_grad_norm > 0): for every
 * gradient an optimizer reads, a sum-of-squares kernel and an in-place
 * scale kernel, in no schedule (DuetProgram.n_clip: the runtime launches
 * them when --clip-grad-norm is in effect).  Their doubles follow the
 * n_unscale overflow flags in the flags buffer (duet_clip_word). */
static void lower_clip(Lower *L, DuetProgram *p) {
  Graph *g = L->g;
  int n = 0;
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    n += (v->op == OP_ADAMW || v->op == OP_SGD) && tid(L, v->in[1]) >= 0;
  }
  int32_t *grad = arena_alloc(L->a, (size_t)(n + 1) * sizeof *grad);
  int32_t *sq = arena_alloc(L->a, (size_t)(n + 1) * sizeof *sq), *sc = arena_alloc(L->a, (size_t)(n + 1) * sizeof *sc);
  p->n_clip = n;
  for (int i = 0, j = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    if ((v->op != OP_ADAMW && v->op != OP_SGD) || tid(L, v->in[1]) < 0) continue;
    Value *gv = v->in[1];
    DUET_ASSERT(gv->dtype == DT_F32 || gv->dtype == DT_F64); /* the optimizer's gradients: never 16-bit */
    Kernel *k = new_kernel(L, KK_SUMSQ, gv->dtype);
    add_buf(k, tid(L, gv), gv->dtype, NULL, NULL);
    k->n = shape_numel(&gv->shape);
    k->slot = duet_clip_word(p, j);
    sq[j] = k->index;
    k = new_kernel(L, KK_CLIP_SCALE, gv->dtype);
    add_buf(k, tid(L, gv), gv->dtype, NULL, NULL);
    k->n = shape_numel(&gv->shape);
    k->slot = duet_clip_word(p, n);
    sc[j] = k->index;
    grad[j++] = tid(L, gv);
  }
  p->clip_grad = grad;
  p->clip_sumsq = sq;
  p->clip_scale = sc;
}

/* Reduction of `in` to `out` (SUM_TO, or MEAN with scale 1/n): the reduced
 * axes must form one contiguous run once size-1 axes are dropped. */
static int lower_reduce(Lower *L, Value *v, double scale) {
  Value *x = v->op == OP_MAX_TO_GRAD ? v->in[1] : v->in[0];
  Shape to = v->op == OP_MEAN ? (Shape){0} : v->op == OP_MAX_TO_GRAD ? v->in[0]->shape : v->attr.shape;
  int r = x->shape.rank;
  int64_t outer = 1, red = 1, inner = 1;
  int phase = 0; /* 0: outer, 1: reduced, 2: inner */
  for (int d = 0; d < r; d++) {
    int dt = to.rank - r + d;
    int64_t xd = x->shape.dim[d], td = dt >= 0 ? to.dim[dt] : 1;
    if (xd == 1) continue;
    bool reduced = td == 1;
    if (reduced && phase == 2) duet_fatal(__FILE__, __LINE__, "unsupported reduction pattern");
    if (reduced) phase = 1;
    else if (phase == 1) phase = 2;
    if (phase == 0) outer *= xd;
    else if (phase == 1) red *= xd;
    else inner *= xd;
  }
  Kernel *k = new_kernel(L, v->op == OP_MAX_TO_GRAD ? KK_MAX_GRAD : KK_REDUCE, v->dtype);
  k->reduce_max = v->op == OP_MAX_TO;
  for (int j = 0; j < v->n_in; j++) add_buf(k, tid(L, v->in[j]), v->in[j]->dtype, NULL, NULL);
  add_buf(k, tid(L, v), v->dtype, NULL, NULL);
  k->outer = outer;
  k->red = red;
  k->inner = inner;
  k->scale = scale;
  return k->index;
}

/* Kernels over rows of the last axis of in[0] (for embeddings: of the
 * output).  Every input and the output become buffers, in order. */
static Kernel *lower_rows_k(Lower *L, Value *v, KernelKind kind) {
  const Value *shaped = kind == KK_EMBED_FWD ? v : v->in[0];
  Kernel *k = new_kernel(L, kind, v->in[0]->dtype);
  for (int j = 0; j < v->n_in; j++) {
    KBuf *b = &k->bufs[k->n_bufs++];
    b->tensor = tid(L, v->in[j]);
    b->dtype = v->in[j]->dtype;
  }
  KBuf *b = &k->bufs[k->n_bufs++];
  b->tensor = tid(L, v);
  b->dtype = v->dtype;
  k->cols = shaped->shape.dim[shaped->shape.rank - 1];
  k->rows = shape_numel(&shaped->shape) / k->cols;
  return k;
}

static int lower_rows(Lower *L, Value *v, KernelKind kind) { return lower_rows_k(L, v, kind)->index; }

static int lower_embedding(Lower *L, Value *v) {
  Kernel *k = lower_rows_k(L, v, v->op == OP_EMBEDDING ? KK_EMBED_FWD : KK_EMBED_BWD);
  const Shape *table = v->op == OP_EMBEDDING ? &v->in[0]->shape : &v->shape;
  k->dtype = v->op == OP_EMBEDDING ? v->dtype : v->in[0]->dtype;
  k->outer = table->dim[0];
  return k->index;
}

static int lower_attention(Lower *L, Value *v, KernelKind kind) {
  Kernel *k = lower_rows_k(L, v, kind);
  const Shape *q = &v->in[v->op == OP_ATTENTION ? 0 : 1]->shape;
  k->batch = q->dim[0];
  k->time = q->dim[1];
  k->cols = q->dim[2];
  k->heads = v->attr.heads;
  k->kv_heads = ir_kv_heads(&v->attr);
  k->causal = v->attr.causal;
  return k->index;
}

/* Softmax over `axis` as [outer, red, inner]; its gradient from dy and y. */
static int lower_softmax(Lower *L, Value *v) {
  Kernel *k = new_kernel(L, v->op == OP_SOFTMAX ? KK_SOFTMAX : KK_SOFTMAX_BWD, v->dtype);
  for (int j = 0; j < v->n_in; j++) add_buf(k, tid(L, v->in[j]), v->in[j]->dtype, NULL, NULL);
  add_buf(k, tid(L, v), v->dtype, NULL, NULL);
  const Shape *s = &v->shape;
  k->outer = k->inner = 1;
  for (int d = 0; d < s->rank; d++) {
    if (d < v->attr.axis) k->outer *= s->dim[d];
    if (d > v->attr.axis) k->inner *= s->dim[d];
  }
  k->red = s->dim[v->attr.axis];
  return k->index;
}

/* The sum of squared differences of a whole tensor, times 1/n. */
static int lower_mse(Lower *L, Value *v) {
  Kernel *k = new_kernel(L, KK_MSE, v->dtype);
  for (int j = 0; j < 2; j++) add_buf(k, tid(L, v->in[j]), v->in[j]->dtype, NULL, NULL);
  add_buf(k, tid(L, v), v->dtype, NULL, NULL);
  k->n = shape_numel(&v->in[0]->shape);
  k->scale = 1.0 / (double)k->n;
  return k->index;
}

/* Element strides of a row-major shape. */
static void strides_of(const Shape *s, int64_t *st) {
  int64_t x = 1;
  for (int d = s->rank - 1; d >= 0; d--) {
    st[d] = x;
    x *= s->dim[d];
  }
}

/* Terms of the map from the flat index of `out` to sum_d coord_d * istride[d]
 * (a strided view: permutations, slices), adjacent axes merged when
 * contiguous in both. */
static int strided_terms(const Shape *out, const int64_t *istride, KIndexTerm *terms) {
  int n = 0;
  int64_t ostride = 1;
  for (int d = out->rank - 1; d >= 0; d--) {
    int64_t od = out->dim[d];
    if (od != 1) {
      if (n > 0 && terms[n - 1].div * terms[n - 1].mod == ostride && terms[n - 1].mul * terms[n - 1].mod == istride[d])
        terms[n - 1].mod *= od;
      else
        terms[n++] = (KIndexTerm){ostride, od, istride[d]};
    }
    ostride *= od;
  }
  if (n > 0 && terms[n - 1].div * terms[n - 1].mod == ostride) terms[n - 1].mod = 0;
  return n;
}

/* A copy over the elements of `dom`: out[map_out(i)] = in[map_in(i)], each map
 * a strided view (NULL: contiguous). */
static int lower_copy(Lower *L, DType dt, int tin, int tout, const Shape *dom, const int64_t *in_stride,
                      int64_t in_base, const int64_t *out_stride, int64_t out_base) {
  Kernel *k = new_kernel(L, KK_ELEMENTWISE, dt);
  InsBuf b = {.n = 0};
  int64_t cont[IR_MAX_RANK];
  strides_of(dom, cont);
  KBuf *bi = &k->bufs[k->n_bufs++];
  bi->tensor = tin;
  bi->dtype = dt;
  bi->base = in_base;
  bi->n_terms = strided_terms(dom, in_stride ? in_stride : cont, bi->terms);
  KBuf *bo = &k->bufs[k->n_bufs++];
  bo->tensor = tout;
  bo->dtype = dt;
  bo->base = out_base;
  bo->n_terms = strided_terms(dom, out_stride ? out_stride : cont, bo->terms);
  ins(&b, KI_STORE, 1, ins(&b, KI_LOAD, 0, 0, 0), 0);
  finish_ew(L, k, &b, shape_numel(dom));
  return k->index;
}

static int lower_fill0(Lower *L, const Value *v) {
  Kernel *k = new_kernel(L, KK_ELEMENTWISE, v->dtype);
  InsBuf b = {.n = 0};
  int out = add_buf(k, tid(L, v), v->dtype, &v->shape, &v->shape);
  ins(&b, KI_STORE, out, ins(&b, KI_CONST, 0, 0, 0.0), 0);
  finish_ew(L, k, &b, shape_numel(&v->shape));
  return k->index;
}

/* The strides into x (shape xs) of the view x.narrow(axis, start, len),
 * optionally without the axis; returns the base offset. */
static int64_t slice_view(const Shape *xs, int axis, int64_t start, bool squeeze, int64_t *vstride) {
  int64_t st[IR_MAX_RANK];
  strides_of(xs, st);
  int k = 0;
  for (int d = 0; d < xs->rank; d++)
    if (!(squeeze && d == axis)) vstride[k++] = st[d];
  return start * st[axis];
}

static int lower_window(Lower *L, Value *v, KernelKind kind) {
  Kernel *k = lower_rows_k(L, v, kind);
  const Attr *a = &v->attr;
  /* xs: the forward input [N,C,H,W]; ys: the window grid [N,C,OH,OW] */
  bool grad = kind == KK_COL2IM || kind == KK_MAXPOOL_GRAD || kind == KK_AVGPOOL_GRAD;
  k->xs = grad ? v->shape : v->in[0]->shape;
  int64_t oh = (k->xs.dim[2] + 2 * a->ph - a->dh * (a->kh - 1) - 1) / a->sh + 1;
  int64_t ow = (k->xs.dim[3] + 2 * a->pw - a->dw * (a->kw - 1) - 1) / a->sw + 1;
  k->ys = k->xs;
  k->ys.dim[2] = oh;
  k->ys.dim[3] = ow;
  int64_t w[8] = {a->kh, a->kw, a->sh, a->sw, a->ph, a->pw, a->dh, a->dw};
  memcpy(k->win, w, sizeof w);
  return k->index;
}

typedef struct StepList {
  DuetStep *s;
  int n;
} StepList;

static void push_step(Lower *L, StepList *l, DuetStep st) {
  (void)L;
  l->s[l->n++] = st;
}

CgProgram *codegen_lower(Graph *g, Arena *a) {
  CgProgram *cp = arena_alloc(a, sizeof *cp);
  Lower L = {.g = g, .a = a, .cp = cp};
  DuetProgram *p = &cp->prog;
  p->api_version = DUET_RT_API_VERSION;
  p->model_name = g->model_name;
  cp->tensor_of = arena_alloc(a, (size_t)(g->n_values + 1) * sizeof *cp->tensor_of);
  DuetTensor *tensors = arena_alloc(a, (size_t)(g->n_values + 1) * sizeof *tensors);
  int nt = 0;
  for (int i = 0; i < g->n_values; i++) cp->tensor_of[i] = -1;
  /* transfers' tensors last, so that every other tensor has the id it has
   * on one device (params are initialised from streams keyed by their id) */
  for (int pass = 0; pass < 2; pass++)
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    if ((v->op == OP_TRANSFER) != (pass == 1)) continue;
    if (v->region == MEM_NONE) continue;
    DuetTensor *t = &tensors[nt];
    t->name = v->attr.name && (v->op == OP_PARAM || v->op == OP_STATE || v->op == OP_INPUT)
                  ? v->attr.name : arena_printf(a, "%%%d", v->id);
    t->region = (int)v->region;
    t->dtype = (int)v->dtype;
    t->rank = v->shape.rank;
    for (int d = 0; d < v->shape.rank; d++) t->shape[d] = v->shape.dim[d];
    t->offset = v->offset;
    t->nbytes = (int64_t)dtype_size(v->dtype) * shape_numel(&v->shape);
    t->init = (int)v->attr.init;
    t->init_a = v->attr.init_a;
    t->init_b = v->attr.init_b;
    t->stage = v->device > 0 && g->n_stages > 1 ? v->device : 0;
    cp->tensor_of[i] = nt++;
  }
  int n_grads = 0;
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    if (!(v->op == OP_ADAMW || v->op == OP_SGD)) continue;
    Value *gv = v->in[1];
    if (gv->role == ROLE_OPTIMIZER) { /* a tied weight's gradient, added once per step from its parts (partition.c) */
      for (int j = 0; j < gv->n_in; j++) {
        Value *x = gv->in[j]->op == OP_TRANSFER && gv->in[j]->role == ROLE_OPTIMIZER ? gv->in[j]->in[0] : gv->in[j];
        if (cp->tensor_of[x->id] >= 0) tensors[cp->tensor_of[x->id]].is_grad = 1, n_grads++;
      }
      continue;
    }
    if (cp->tensor_of[gv->id] >= 0) tensors[cp->tensor_of[gv->id]].is_grad = 1, n_grads++;
  }
  p->n_tensors = nt;
  p->tensors = tensors;
  for (int r = 0; r < DUET_MEM_COUNT; r++) p->region_bytes[r] = g->region_bytes[r];

  size_t cap = 1; /* a value lowers to at most 1 + n_in steps (concat, slice_grad) */
  for (int i = 0; i < g->n_values; i++) cap += 1 + (size_t)g->values[i]->n_in;
  StepList tr = {arena_alloc(a, cap * sizeof(DuetStep)), 0};
  StepList ev = {arena_alloc(a, cap * sizeof(DuetStep)), 0};
  StepList gr = {arena_alloc(a, cap * sizeof(DuetStep)), 0};
  p->input_x = p->input_y = p->loss = p->metrics = p->logits = -1;
  int n_inputs = 0, n_unscale = 0;
  const char **unscale_names = arena_alloc(a, (size_t)(g->n_values + 1) * sizeof *unscale_names);
  p->update_from = -1;
  /* pipelines: per stage forward, backward, optimizer and eval lists */
  /* --offload optimizer runs on the pipeline's stages (runtime/offload.c), even one */
  bool piped = g->n_stages > 1 || g->train.micro_batches > 1 || train_offload(&g->train);
  int S = g->n_stages > 1 ? g->n_stages : 1;
  StepList *sl = piped ? arena_alloc(a, (size_t)S * 4 * sizeof *sl) : NULL;
  for (int k = 0; piped && k < 4 * S; k++) sl[k].s = arena_alloc(a, cap * sizeof(DuetStep));
  DuetTransfer *xfers = arena_alloc(a, ((size_t)g->n_values + 1) * sizeof *xfers);
  int n_xfers = 0;
  /* data parallelism: each bucket's gradient tensors */
  int32_t *bucket_off = arena_alloc(a, ((size_t)g->n_values + 1) * sizeof *bucket_off);
  int32_t *bucket_tensors = arena_alloc(a, ((size_t)g->n_values + 1) * sizeof *bucket_tensors);
  int n_buckets = 0, n_btensors = 0;
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    DuetStep pre[KMAX_BUFS + 1];
    int n_pre = 0;
    DuetStep st = {.kind = DUET_STEP_KERNEL, .dtype = (int)v->dtype};
    bool has_step = true;
    switch (v->op) {
    case OP_INPUT:
      if (n_inputs == 0) p->input_x = tid(&L, v);
      if (n_inputs == 1) p->input_y = tid(&L, v);
      n_inputs++;
      has_step = false;
      break;
    case OP_PARAM:
    case OP_STATE:
      has_step = false;
      break;
    case OP_ALL_GATHER: { /* --zero 1: after the bucket's updates, on its stage's optimizer schedule */
      DUET_ASSERT(piped && g->zero);
      int stg = v->device > 0 && g->n_stages > 1 ? v->device : 0;
      DuetStep ag = {.kind = DUET_STEP_ALLGATHER, .a = v->attr.bucket};
      push_step(&L, &sl[stg * 4 + 2], ag);
      has_step = false;
      break;
    }
    case OP_REDUCE_SCATTER:
    case OP_ALLREDUCE: { /* the stage's backward posts its bucket (a pipelined program: replicas > 1) */
      DUET_ASSERT(piped && v->attr.bucket == n_buckets);
      int stg = v->device > 0 && g->n_stages > 1 ? v->device : 0;
      bucket_off[n_buckets] = n_btensors;
      for (int j = 0; j < v->n_in; j++) bucket_tensors[n_btensors++] = tid(&L, v->in[j]);
      DuetStep ar = {.kind = DUET_STEP_ALLREDUCE, .a = n_buckets++};
      push_step(&L, &sl[stg * 4 + 1], ar);
      has_step = false;
      break;
    }
    case OP_TRANSFER: { /* a send on the source's stage, a receive on this one */
      DuetTransfer *x = &xfers[n_xfers];
      x->src = tid(&L, v->in[0]);
      x->dst = tid(&L, v);
      x->from = v->in[0]->device;
      x->to = v->device;
      x->nbytes = (int64_t)dtype_size(v->dtype) * shape_numel(&v->shape);
      /* b = 1: a param sent once per step (ir_param_transfer), on the first micro-batch only */
      int once = ir_param_transfer(v) ? 1 : v->role == ROLE_OPTIMIZER ? 2 : 0;
      DuetStep send = {.kind = DUET_STEP_SEND, .a = n_xfers, .b = once},
               recv = {.kind = DUET_STEP_RECV, .a = n_xfers, .b = once};
      n_xfers++;
      int lists[2] = {v->role == ROLE_BACKWARD    ? 1
                      : v->role == ROLE_EVAL      ? 3
                      : v->role == ROLE_OPTIMIZER ? 2 /* a tied weight's gradient part, once per step */
                                                  : 0,
                      v->role == ROLE_FORWARD ? 3 : -1};
      for (int k = 0; k < 2; k++)
        if (lists[k] >= 0) {
          push_step(&L, &sl[x->from * 4 + lists[k]], send);
          push_step(&L, &sl[x->to * 4 + lists[k]], recv);
        }
      has_step = false;
      break;
    }
    case OP_CONST:
      has_step = v->region != MEM_NONE;
      if (has_step) st.kernel = lower_elementwise(&L, v);
      break;
    case OP_MATMUL: {
      Value *A = v->in[0], *B = v->in[1];
      st.kind = DUET_STEP_GEMM;
      st.ta = v->attr.trans_a;
      st.tb = v->attr.trans_b;
      /* operands as 2-D row-major matrices, leading axes merged */
      st.n = v->shape.dim[v->shape.rank - 1];
      st.m = shape_numel(&v->shape) / st.n;
      int64_t a_cols = A->shape.dim[A->shape.rank - 1];
      st.k = st.ta ? shape_numel(&A->shape) / a_cols : a_cols;
      st.a = tid(&L, A);
      st.b = tid(&L, B);
      st.c = tid(&L, v);
      if (v->role != ROLE_EVAL) p->gemm_flops += 2 * st.m * st.n * st.k;
      break;
    }
    case OP_MATMUL_I8: { /* the int8 GEMM (passes/quantize.c, --calibrate) */
      Kernel *k = new_kernel(&L, KK_GEMM_I8, DT_F32);
      for (int j = 0; j < 4; j++) add_buf(k, tid(&L, v->in[j]), v->in[j]->dtype, NULL, NULL);
      add_buf(k, tid(&L, v), v->dtype, NULL, NULL);
      k->cols = v->shape.dim[v->shape.rank - 1];
      k->rows = shape_numel(&v->shape) / k->cols;
      k->red = v->in[0]->shape.dim[v->in[0]->shape.rank - 1];
      k->trans_b = v->attr.trans_b;
      k->n = shape_numel(&v->in[2]->shape); /* weight scales: cols, or 1 */
      st.kernel = k->index;
      break;
    }
    case OP_UNSCALE:
      st.kernel = lower_unscale(&L, v);
      DUET_ASSERT(v->attr.slot >= 0 && v->attr.slot < g->n_values);
      if (v->attr.slot + 1 > n_unscale) n_unscale = v->attr.slot + 1;
      break;
    case OP_EMBEDDING:
    case OP_EMBEDDING_GRAD:
      st.kernel = lower_embedding(&L, v);
      if (v->op == OP_EMBEDDING && v->in[1]->op == OP_INPUT) { /* a data input indexes this table */
        int64_t rows = v->in[0]->shape.dim[0];
        int r = rows > INT32_MAX ? INT32_MAX : (int)rows;
        if (!p->vocab || r < p->vocab) p->vocab = r;
      }
      break;
    case OP_NORM:
    case OP_NORM_GRAD: {
      Kernel *k = lower_rows_k(&L, v, v->op == OP_NORM ? KK_NORM_FWD : KK_NORM_BWD);
      k->eps = v->attr.eps;
      st.kernel = k->index;
      break;
    }
    case OP_ATTENTION:
      st.kernel = lower_attention(&L, v, KK_ATTN_FWD);
      break;
    case OP_SOFTMAX:
    case OP_SOFTMAX_GRAD:
      st.kernel = lower_softmax(&L, v);
      break;
    case OP_RMS_NORM:
    case OP_RMS_NORM_GRAD: {
      Kernel *k = lower_rows_k(&L, v, v->op == OP_RMS_NORM ? KK_RMSNORM_FWD : KK_RMSNORM_BWD);
      k->eps = v->attr.eps;
      st.kernel = k->index;
      break;
    }
    case OP_ROPE:
    case OP_ROPE_GRAD: {
      Kernel *k = lower_rows_k(&L, v, KK_ROPE);
      k->batch = v->shape.dim[0];
      k->time = v->shape.dim[1];
      k->cols = v->shape.dim[2];
      k->heads = v->attr.heads;
      k->base = v->attr.base;
      k->inverse = v->op == OP_ROPE_GRAD;
      st.kernel = k->index;
      break;
    }
    case OP_MSE_LOSS:
      st.kernel = lower_mse(&L, v);
      break;
    case OP_ATTENTION_GRAD: /* query rows (dq, statistics), then key rows (dk, dv) */
      pre[n_pre] = st;
      pre[n_pre++].kernel = lower_attention(&L, v, KK_ATTN_BWD);
      st.kernel = lower_attention(&L, v, KK_ATTN_BWD_KV);
      break;
    case OP_SLICE: {
      int64_t vs[IR_MAX_RANK];
      int64_t base = slice_view(&v->in[0]->shape, v->attr.axis, v->attr.index, v->attr.squeeze, vs);
      st.kernel = lower_copy(&L, v->dtype, tid(&L, v->in[0]), tid(&L, v), &v->shape, vs, base, NULL, 0);
      break;
    }
    case OP_SLICE_GRAD: { /* zeros, then dy copied into its window */
      int64_t vs[IR_MAX_RANK];
      int64_t base = slice_view(&v->shape, v->attr.axis, v->attr.index, v->attr.squeeze, vs);
      pre[n_pre] = st;
      pre[n_pre++].kernel = lower_fill0(&L, v);
      st.kernel = lower_copy(&L, v->dtype, tid(&L, v->in[0]), tid(&L, v), &v->in[0]->shape, NULL, 0, vs, base);
      break;
    }
    case OP_CONCAT: { /* each input copied into its window of the output */
      int64_t start = 0;
      for (int j = 0; j < v->n_in; j++) {
        int64_t vs[IR_MAX_RANK];
        int64_t base = slice_view(&v->shape, v->attr.axis, start, false, vs);
        DuetStep cp_st = st;
        cp_st.kernel = lower_copy(&L, v->dtype, tid(&L, v->in[j]), tid(&L, v), &v->in[j]->shape, NULL, 0, vs, base);
        if (j + 1 < v->n_in) pre[n_pre++] = cp_st;
        else st = cp_st;
        start += v->in[j]->shape.dim[v->attr.axis];
      }
      break;
    }
    case OP_RESHAPE:
      st.kernel = lower_copy(&L, v->dtype, tid(&L, v->in[0]), tid(&L, v), &v->shape, NULL, 0, NULL, 0);
      break;
    case OP_PERMUTE: {
      int64_t xs[IR_MAX_RANK], vs[IR_MAX_RANK];
      strides_of(&v->in[0]->shape, xs);
      for (int d = 0; d < v->shape.rank; d++) vs[d] = xs[v->attr.perm[d]];
      st.kernel = lower_copy(&L, v->dtype, tid(&L, v->in[0]), tid(&L, v), &v->shape, vs, 0, NULL, 0);
      break;
    }
    case OP_IM2COL: st.kernel = lower_window(&L, v, KK_IM2COL); break;
    case OP_COL2IM: st.kernel = lower_window(&L, v, KK_COL2IM); break;
    case OP_MAXPOOL: st.kernel = lower_window(&L, v, KK_MAXPOOL); break;
    case OP_MAXPOOL_GRAD: st.kernel = lower_window(&L, v, KK_MAXPOOL_GRAD); break;
    case OP_AVGPOOL: st.kernel = lower_window(&L, v, KK_AVGPOOL); break;
    case OP_AVGPOOL_GRAD: st.kernel = lower_window(&L, v, KK_AVGPOOL_GRAD); break;
    case OP_TRANSPOSE:
      st.kernel = lower_rows(&L, v, KK_TRANSPOSE);
      break;
    case OP_POSITIONS: {
      Kernel *k = lower_rows_k(&L, v, KK_POSITIONS);
      k->rows = v->shape.dim[0];
      st.kernel = k->index;
      break;
    }
    case OP_ATTENTION_DECODE: {
      Kernel *k = lower_rows_k(&L, v, KK_ATTN_DECODE);
      k->batch = v->shape.dim[0];
      k->time = v->in[3]->shape.dim[1];
      k->cols = v->shape.dim[2];
      k->heads = v->attr.heads;
      k->kv_heads = ir_kv_heads(&v->attr);
      k->causal = true;
      st.kernel = k->index;
      break;
    }
    case OP_SUM_TO:
    case OP_MAX_TO:
    case OP_MAX_TO_GRAD:
      st.kernel = lower_reduce(&L, v, 1.0);
      break;
    case OP_MEAN:
      st.kernel = lower_reduce(&L, v, 1.0 / (double)shape_numel(&v->in[0]->shape));
      break;
    case OP_CROSS_ENTROPY:
      st.kernel = lower_rows(&L, v, KK_XENT_FWD);
      break;
    case OP_CROSS_ENTROPY_GRAD:
      st.kernel = lower_rows(&L, v, KK_XENT_BWD);
      break;
    case OP_EVAL_METRICS:
      st.kernel = lower_rows(&L, v, KK_EVAL_METRICS);
      p->metrics = tid(&L, v);
      { /* saturated, not wrapped: labels are i32, so a count past INT32_MAX only misjudges the label INT32_MAX */
        int64_t nc = v->in[0]->shape.dim[v->in[0]->shape.rank - 1];
        p->n_classes = nc > INT32_MAX ? INT32_MAX : (int)nc;
      }
      break;
    case OP_ADAMW:
    case OP_SGD:
      st.kernel = lower_optimizer(&L, v);
      break;
    case OP_PRUNE_MASK:
      st.kernel = lower_prune_mask(&L, v);
      break;
    default: /* the elementwise ops (ops.def's EW flag): one loop, or a fused one */
      if (!(op_info[v->op].flags & OPF_EW)) duet_fatal(__FILE__, __LINE__, "codegen: no lowering for op %d", (int)v->op);
      st.kernel = lower_elementwise(&L, v);
    }
    if (!has_step) continue;
    if (ir_tied_add(v)) st.b = 2; /* a tied weight's gradient: after the parts are summed (DuetStep) */
    if (piped) {
      int stg = v->device > 0 && g->n_stages > 1 ? v->device : 0;
      int lists[2] = {v->role == ROLE_FORWARD ? 0 : v->role == ROLE_BACKWARD ? 1 : v->role == ROLE_OPTIMIZER ? 2 : 3,
                      v->role == ROLE_FORWARD ? 3 : -1};
      for (int k = 0; k < 2; k++)
        if (lists[k] >= 0) {
          for (int j = 0; j < n_pre; j++) push_step(&L, &sl[stg * 4 + lists[k]], pre[j]);
          push_step(&L, &sl[stg * 4 + lists[k]], st);
        }
    }
    for (int j = 0; j < n_pre; j++) {
      if (v->role != ROLE_EVAL) push_step(&L, &tr, pre[j]);
      if (v->role == ROLE_FORWARD || v->role == ROLE_EVAL) push_step(&L, &ev, pre[j]);
      if (v->role == ROLE_FORWARD || v->role == ROLE_BACKWARD) push_step(&L, &gr, pre[j]);
    }
    if ((v->op == OP_ADAMW || v->op == OP_SGD) && p->update_from < 0) p->update_from = tr.n;
    if (v->role != ROLE_EVAL) push_step(&L, &tr, st);
    if (v->role == ROLE_FORWARD || v->role == ROLE_EVAL) push_step(&L, &ev, st);
    if (v->role == ROLE_FORWARD || v->role == ROLE_BACKWARD) push_step(&L, &gr, st);
  }
  if (g->loss) p->loss = tid(&L, g->loss);
  /* the param names of the overflow flags, from the params whose gradient
   * each unscale reads (slot order = param order) */
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    if (v->op == OP_PARAM && v->grad && v->grad->op == OP_UNSCALE) unscale_names[v->grad->attr.slot] = v->attr.name;
  }
  for (int j = 0; j < n_unscale; j++)
    if (!unscale_names[j]) unscale_names[j] = arena_printf(a, "flag %d", j);
  p->n_unscale = n_unscale;
  p->unscale_names = unscale_names;
  p->clip_from = p->update_from; /* the first optimizer update */
  if (!n_unscale) p->update_from = -1;
  if (g->train.clip_grad_norm > 0) lower_clip(&L, p); /* after n_unscale: its words follow the flags */
  p->logits = g->logits && cp->tensor_of[g->logits->id] >= 0 ? cp->tensor_of[g->logits->id] : -1;
  p->decode = g->decode;
  p->context = g->context;
  p->prune = lower_prune_table(&L);
  p->shrink = lower_shrink_table(&L);
  /* from the graph, not the pass context, so that a dump of an evaluation
   * program read back (duet run G.ir) is one too */
  p->eval_program = graph_is_eval_program(g);
  p->train = tr.s, p->n_train = tr.n;
  p->eval = ev.s, p->n_eval = ev.n;
  p->grad = gr.s, p->n_grad = gr.n;
  p->n_kernels = cp->n_kernels;
  /* each kernel's arguments: its buffers, and an unscale's overflow flag */
  int32_t *arg_off = arena_alloc(a, (size_t)(cp->n_kernels + 1) * sizeof *arg_off);
  int n_args = 0;
  for (int k = 0; k < cp->n_kernels; k++) {
    arg_off[k] = n_args;
    KernelKind kk = cp->kernels[k].kind;
    n_args += cp->kernels[k].n_bufs + (kk == KK_UNSCALE || kk == KK_SUMSQ || kk == KK_CLIP_SCALE);
    DUET_ASSERT(n_args - arg_off[k] <= DUET_MAX_KERNEL_ARGS);
  }
  arg_off[cp->n_kernels] = n_args;
  int32_t *args = arena_alloc(a, (size_t)(n_args + 1) * sizeof *args);
  for (int k = 0; k < cp->n_kernels; k++) {
    const Kernel *kk = &cp->kernels[k];
    for (int j = 0; j < kk->n_bufs; j++) args[arg_off[k] + j] = kk->bufs[j].tensor;
    if (kk->kind == KK_UNSCALE || kk->kind == KK_SUMSQ || kk->kind == KK_CLIP_SCALE)
      args[arg_off[k] + kk->n_bufs] = p->n_tensors + kk->slot; /* a flag, or a clipping double */
  }
  p->kernel_arg_off = arg_off;
  p->kernel_args = args;
  if (piped) {
    DuetStage *stages = arena_alloc(a, (size_t)S * sizeof *stages);
    for (int k = 0; k < S; k++) {
      DuetStage *d = &stages[k];
      d->fwd = sl[4 * k].s, d->n_fwd = sl[4 * k].n;
      d->bwd = sl[4 * k + 1].s, d->n_bwd = sl[4 * k + 1].n;
      d->opt = sl[4 * k + 2].s, d->n_opt = sl[4 * k + 2].n;
      d->eval = sl[4 * k + 3].s, d->n_eval = sl[4 * k + 3].n;
      for (int r = 0; r < DUET_MEM_COUNT; r++)
        d->region_bytes[r] = g->n_stages > 1 ? g->stage_bytes[k][r] : g->region_bytes[r];
    }
    if (g->n_stages > 1) /* the whole model, for messages; each stage allocates its own */
      for (int r = 0; r < DUET_MEM_COUNT; r++) {
        p->region_bytes[r] = 0;
        for (int k = 0; k < S; k++) p->region_bytes[r] += stages[k].region_bytes[r];
      }
    p->n_stages = S;
    p->stages = stages;
    p->n_transfers = n_xfers;
    p->transfers = xfers;
    p->micro_batches = g->train.micro_batches > 1 ? (int)g->train.micro_batches : 1;
    p->replicas = g->replicas > 1 ? g->replicas : 1;
    bucket_off[n_buckets] = n_btensors;
    p->n_buckets = n_buckets;
    p->bucket_off = bucket_off;
    p->bucket_tensors = bucket_tensors;
  }
  if (g->zero && piped) { /* ZeRO stage 1: each tensor's shard; each bucket gradient's param */
    int32_t *shard = arena_alloc(a, ((size_t)nt + 1) * sizeof *shard);
    int32_t *bparams = arena_alloc(a, ((size_t)n_btensors + 1) * sizeof *bparams);
    int32_t *param_of = arena_alloc(a, ((size_t)nt + 1) * sizeof *param_of);
    for (int i = 0; i < nt; i++) shard[i] = -1, param_of[i] = -1;
    for (int i = 0; i < g->n_values; i++) {
      Value *v = g->values[i];
      if ((v->op != OP_ADAMW && v->op != OP_SGD) || !v->attr.sharded) continue;
      for (int j = 0; j < v->n_in; j++)
        if (cp->tensor_of[v->in[j]->id] >= 0) shard[cp->tensor_of[v->in[j]->id]] = v->attr.shard;
      if (v->in[1]->role != ROLE_OPTIMIZER) {
        param_of[tid(&L, v->in[1])] = tid(&L, v->in[0]);
        continue;
      }
      /* a tied weight's parts (partition.c): the first on the param's stage
       * gathers the param; any other gathers itself (the all-gather's
       * entries follow the reduce-scatter's; the copy is not read) */
      bool first = true;
      for (int j = 0; j < v->in[1]->n_in; j++) {
        Value *x = v->in[1]->in[j];
        if (x->op == OP_TRANSFER && x->role == ROLE_OPTIMIZER) x = x->in[0];
        int t = tid(&L, x);
        shard[t] = v->attr.shard;
        bool home = g->n_stages <= 1 || x->device == v->device;
        param_of[t] = first && home ? tid(&L, v->in[0]) : t;
        if (home) first = false;
      }
    }
    for (int j = 0; j < n_btensors; j++) {
      bparams[j] = param_of[bucket_tensors[j]];
      DUET_ASSERT(bparams[j] >= 0);
    }
    p->zero = g->zero;
    p->tensor_shard = shard;
    p->bucket_params = bparams;
  }
  /* every gradient in a bucket (the verifier's rule for graphs with buckets;
   * a graph of several replicas without any is refused before lowering) */
  DUET_ASSERT(g->replicas <= 1 || n_btensors == n_grads);

  const TrainSpec *t = &g->train;
  DuetConfig *c = &p->defaults;
  c->data = t->data == DATA_FASHION_MNIST ? DUET_DATA_FASHION_MNIST
          : t->data == DATA_TEXT        ? DUET_DATA_TEXT
          : t->data == DATA_NPY         ? DUET_DATA_NPY
          : t->data == DATA_TOKENS      ? DUET_DATA_TOKENS
                                        : DUET_DATA_NONE;
  c->block = t->block;
  c->eval_every = t->eval_every;
  c->eval_batches = t->eval_batches;
  c->data_path = t->data_path;
  c->data_y = t->data_y;
  c->val_x = t->val_x;
  c->val_y = t->val_y;
  c->val_fraction = t->val_fraction;
  c->optimizer = t->optimizer == OPTIM_SGD ? DUET_OPTIM_SGD : DUET_OPTIM_ADAMW;
  c->lr = t->lr;
  c->weight_decay = t->weight_decay;
  c->beta1 = t->beta1;
  c->beta2 = t->beta2;
  c->eps = t->eps;
  c->momentum = t->momentum;
  c->batch = t->batch * (t->micro_batches > 1 ? t->micro_batches : 1); /* the whole batch */
  c->epochs = t->epochs;
  c->steps = t->steps;
  c->log_every = t->log_every;
  c->seed = t->seed;
  c->eval = t->eval && p->metrics >= 0;
  _Static_assert((int)LR_CONSTANT == DUET_LR_CONSTANT && (int)LR_COSINE == DUET_LR_COSINE &&
                     (int)LR_LINEAR == DUET_LR_LINEAR,
                 "LrSchedule and DUET_LR_* share their numbering");
  c->lr_schedule = (int)t->lr_schedule;
  c->warmup = t->warmup;
  c->min_lr = t->min_lr;
  c->clip_grad_norm = t->clip_grad_norm;
  c->offload = train_offload(t) ? 1 + DUET_OFFLOAD_OPTIMIZER : 0;
  c->calibrate = g->calibrate;
  return cp;
}
