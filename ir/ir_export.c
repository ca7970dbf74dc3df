/* ir/ir_export.c: the graph for other tools: Graphviz (`duet ir --format
 * dot`) and JSON (`--format json`, written with cJSON).  Neither is read
 * back; the text form (ir.c, ir_parse.c) is the one that round-trips. */
#include "ir.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define NUM(x) ir_num_str((x), (char[32]){0}, 32)

/* ------------------------------------------------------------- dot */

/* User text inside a DOT string: quotes and backslashes escaped, control
 * bytes shown as '?'. */
static void dot_text(const char *s, FILE *out) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
    else if (*p < 0x20 || *p == 0x7F) fputc('?', out);
    else fputc(*p, out);
  }
}

/* Appends printf output to a fixed buffer (truncating). */
typedef struct Buf {
  char s[512];
  size_t n;
} Buf;

static void bput(Buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (b->n < sizeof b->s) {
    int k = vsnprintf(b->s + b->n, sizeof b->s - b->n, fmt, ap);
    if (k > 0) b->n = b->n + (size_t)k < sizeof b->s ? b->n + (size_t)k : sizeof b->s - 1;
  }
  va_end(ap);
}

/* The key attributes of v, one short line (no user text). */
static void dot_attrs(const Value *v, Buf *out) {
  char b[160];
  const Attr *a = &v->attr;
  switch (v->op) {
  case OP_PARAM:
    bput(out, "%s", init_name(a->init));
    if (a->init == INIT_NORMAL) bput(out, "(%s)", NUM(a->init_a));
    if (a->init == INIT_UNIFORM) bput(out, "(%s, %s)", NUM(a->init_a), NUM(a->init_b));
    break;
  case OP_STATE:
    if (a->kv_cache) bput(out, "kv_cache");
    if (a->init == INIT_ONES) bput(out, "ones (mask)");
    break;
  case OP_CONST:
    bput(out, "%s", NUM(a->value));
    break;
  case OP_MATMUL:
    if (a->trans_a || a->trans_b) bput(out, "%s%s%s", a->trans_a ? "A^T" : "", a->trans_a && a->trans_b ? " " : "",
                                       a->trans_b ? "B^T" : "");
    break;
  case OP_BROADCAST: case OP_SUM_TO: case OP_MAX_TO: case OP_RESHAPE:
    bput(out, "to %s", shape_str(&a->shape, b, sizeof b));
    break;
  case OP_ATTENTION: case OP_ATTENTION_GRAD: case OP_ATTENTION_DECODE:
    bput(out, "heads=%" PRId64, a->heads);
    if (ir_kv_heads(a) != a->heads) bput(out, " kv_heads=%" PRId64, a->kv_heads);
    bput(out, "%s", a->causal ? " causal" : "");
    break;
  case OP_ROPE: case OP_ROPE_GRAD:
    bput(out, "heads=%" PRId64 " base=%s", a->heads, NUM(a->base));
    break;
  case OP_SOFTMAX: case OP_SOFTMAX_GRAD:
    bput(out, "axis=%d", a->axis);
    break;
  case OP_SLICE: case OP_SLICE_GRAD:
    bput(out, "axis=%d start=%" PRId64 "%s", a->axis, a->index, a->squeeze ? " squeeze" : "");
    break;
  case OP_CONCAT:
    bput(out, "axis=%d", a->axis);
    break;
  case OP_PERMUTE:
    bput(out, "perm=");
    for (int d = 0; d < a->shape.rank; d++) bput(out, "%s%d", d ? "," : "", a->perm[d]);
    break;
  case OP_IM2COL: case OP_COL2IM: case OP_MAXPOOL: case OP_MAXPOOL_GRAD: case OP_AVGPOOL: case OP_AVGPOOL_GRAD:
    bput(out, "k=%" PRId64 "x%" PRId64 " s=%" PRId64 "x%" PRId64 " p=%" PRId64 "x%" PRId64, a->kh, a->kw, a->sh,
         a->sw, a->ph, a->pw);
    if (a->dh != 1 || a->dw != 1) bput(out, " d=%" PRId64 "x%" PRId64, a->dh, a->dw);
    break;
  case OP_DROPOUT:
    bput(out, "p=%s", NUM(a->p));
    break;
  case OP_NORM: case OP_NORM_GRAD: case OP_RMS_NORM: case OP_RMS_NORM_GRAD:
    bput(out, "eps=%s", NUM(a->eps));
    break;
  case OP_ADAMW: case OP_SGD:
    if (a->no_decay) bput(out, "no decay");
    if (a->sharded) bput(out, "%sshard %d", a->no_decay ? ", " : "", a->shard);
    break;
  case OP_CAST:
    bput(out, "to %s", dtype_name(v->dtype));
    break;
  case OP_UNSCALE:
    bput(out, "flag %d", a->slot);
    break;
  case OP_ALLREDUCE:
  case OP_REDUCE_SCATTER:
    bput(out, "bucket %d, %" PRId64 " bytes", a->bucket, a->bytes);
    break;
  case OP_ALL_GATHER:
    bput(out, "bucket %d", a->bucket);
    break;
  case OP_PRUNE_MASK:
    if (a->axis >= 0) bput(out, "out axis %d", a->axis);
    break;
  case OP_FUSED: { /* the ops of the program; loads and constants left out */
    int shown = 0;
    for (int k = 0; k < a->prog->n; k++) {
      const FusedInstr *fi = &a->prog->ins[k];
      if (fi->op == OP_COUNT || fi->op == OP_CONST) continue;
      if (shown == 8) {
        bput(out, " ...");
        break;
      }
      bput(out, "%s%s", shown++ ? " " : "", op_info[fi->op].name);
    }
    break;
  }
  default:
    break;
  }
}

static void dot_node(const Graph *g, const Value *v, FILE *out, const char *indent) {
  char b[160];
  fprintf(out, "%sn%d [label=\"", indent, v->id);
  if (v->dtype != DT_VOID) fprintf(out, "%%%d ", v->id);
  fputs(op_info[v->op].name, out);
  if (v->op == OP_INPUT || v->op == OP_PARAM || v->op == OP_STATE) {
    fputs("\\n", out);
    dot_text(v->attr.name, out);
  }
  Buf at = {.n = 0};
  dot_attrs(v, &at);
  if (at.n) fprintf(out, "\\n%s", at.s);
  if (v->op == OP_INPUT || v->op == OP_PARAM || v->op == OP_STATE || v->op == OP_CONST)
    fprintf(out, "\\n%s%s", dtype_name(v->dtype), shape_str(&v->shape, b, sizeof b));
  if (v->region != MEM_NONE) fprintf(out, "\\n@%s+%" PRId64, mem_region_name(v->region), v->offset);
  fputc('"', out);
  static const char *const role_fill[] = {"white", "#fde2e4", "#fff3cd", "#d1e7dd"};
  switch (v->op) {
  case OP_INPUT: fputs(", shape=invhouse, fillcolor=\"#e2e3e5\"", out); break;
  case OP_PARAM: fputs(", shape=ellipse, fillcolor=\"#cfe2ff\"", out); break;
  case OP_STATE: fprintf(out, ", shape=ellipse, fillcolor=\"%s\"", v->attr.kv_cache ? "#e2d9f3" : "#ffe5b4"); break;
  case OP_CONST: fputs(", shape=plain", out); break;
  case OP_ALLREDUCE: case OP_REDUCE_SCATTER: case OP_ALL_GATHER:
    fputs(", shape=box3d, fillcolor=\"#cff4fc\"", out);
    break;
  default:
    fprintf(out, ", fillcolor=\"%s\"", role_fill[(unsigned)v->role < 4 ? v->role : 0]);
    if (op_info[v->op].flags & OPF_SIDE) fputs(", shape=box3d", out);
  }
  if (v == g->loss) fputs(", peripheries=2, penwidth=2", out);
  fputs("];\n", out);
}

void ir_print_dot(const Graph *g, FILE *out) {
  char b[160];
  fputs("digraph \"", out);
  dot_text(g->model_name ? g->model_name : "?", out);
  fputs("\" {\n  graph [rankdir=TB, labelloc=t, fontname=\"Helvetica\", label=\"", out);
  dot_text(g->model_name ? g->model_name : "?", out);
  if (g->after_pass) fprintf(out, " after %s", g->after_pass);
  if (g->replicas > 1) fprintf(out, ", %d replicas", g->replicas);
  if (g->zero) fprintf(out, ", ZeRO stage %d", g->zero);
  fputs("\"", out);
  /* large graphs: bounded crossing minimisation and network simplex keep dot
   * to seconds (gpt_kjv: minutes otherwise) */
  if (g->n_values > 100) fputs(", mclimit=0.1, nslimit=2, nslimit1=2", out);
  fputs("];\n  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\", fontsize=10];\n"
        "  edge [fontname=\"Helvetica\", fontsize=8, color=\"#555555\"];\n", out);
  int max_dev = -1;
  for (int i = 0; i < g->n_values; i++)
    if (g->values[i]->device > max_dev) max_dev = g->values[i]->device;
  for (int d = 0; d <= max_dev; d++) {
    bool any = false;
    for (int i = 0; i < g->n_values && !any; i++) any = g->values[i]->device == d;
    if (!any) continue;
    fprintf(out, "  subgraph cluster_device%d {\n    label=\"device %d\"; style=\"rounded,dashed\"; color=\"#0d6efd\";\n", d, d);
    for (int i = 0; i < g->n_values; i++)
      if (g->values[i]->device == d) dot_node(g, g->values[i], out, "    ");
    fputs("  }\n", out);
  }
  for (int i = 0; i < g->n_values; i++)
    if (g->values[i]->device < 0) dot_node(g, g->values[i], out, "  ");
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    for (int j = 0; j < v->n_in; j++) {
      const Value *x = v->in[j];
      /* xlabel: placed after layout, which labels would slow down several-fold */
      fprintf(out, "  n%d -> n%d [xlabel=\"%s%s\"%s];\n", x->id, v->id, dtype_name(x->dtype),
              shape_str(&x->shape, b, sizeof b), x->op == OP_PARAM || x->op == OP_STATE ? ", style=dashed" : "");
    }
  }
  fputs("}\n", out);
}

/* ------------------------------------------------------------ json */

typedef struct J {
  bool ok; /* false after an allocation failed */
} J;

static cJSON *jchk(J *j, cJSON *x) {
  if (!x) j->ok = false;
  return x;
}

static void jnum(J *j, cJSON *o, const char *k, double x) { jchk(j, cJSON_AddNumberToObject(o, k, x)); }
static void jstr(J *j, cJSON *o, const char *k, const char *s) { jchk(j, cJSON_AddStringToObject(o, k, s)); }
static void jbool(J *j, cJSON *o, const char *k, bool b) { jchk(j, cJSON_AddBoolToObject(o, k, b)); }
static void jnull(J *j, cJSON *o, const char *k) { jchk(j, cJSON_AddNullToObject(o, k)); }

/* Integers as JSON numbers while doubles hold them exactly, else strings. */
static void jint(J *j, cJSON *o, const char *k, int64_t x) {
  if (x > ((int64_t)1 << 53) || x < -((int64_t)1 << 53)) {
    char b[32];
    snprintf(b, sizeof b, "%" PRId64, x);
    jstr(j, o, k, b);
  } else {
    jnum(j, o, k, (double)x);
  }
}

static void jshape(J *j, cJSON *o, const char *k, const Shape *s) {
  cJSON *a = jchk(j, cJSON_AddArrayToObject(o, k));
  for (int d = 0; a && d < s->rank; d++) {
    cJSON *n = jchk(j, cJSON_CreateNumber((double)s->dim[d]));
    if (n) cJSON_AddItemToArray(a, n);
  }
}

static void jpair(J *j, cJSON *o, const char *k, int64_t x, int64_t y) {
  Shape s = {.rank = 2, .dim = {x, y}};
  jshape(j, o, k, &s);
}

static void json_attrs(J *j, cJSON *o, const Value *v) {
  const Attr *a = &v->attr;
  switch (v->op) {
  case OP_INPUT:
    jstr(j, o, "name", a->name);
    break;
  case OP_STATE:
    jstr(j, o, "name", a->name);
    jbool(j, o, "kv_cache", a->kv_cache);
    jstr(j, o, "init", init_name(a->init));
    break;
  case OP_PARAM:
    jstr(j, o, "name", a->name);
    jstr(j, o, "init", init_name(a->init));
    if (a->init == INIT_NORMAL) jnum(j, o, "std", a->init_a);
    if (a->init == INIT_UNIFORM) jnum(j, o, "a", a->init_a), jnum(j, o, "b", a->init_b);
    break;
  case OP_CONST:
    jnum(j, o, "value", a->value);
    break;
  case OP_MATMUL:
    jbool(j, o, "trans_a", a->trans_a);
    jbool(j, o, "trans_b", a->trans_b);
    break;
  case OP_BROADCAST: case OP_SUM_TO: case OP_MAX_TO: case OP_MAX_TO_GRAD: case OP_EMBEDDING_GRAD: case OP_RESHAPE:
    jshape(j, o, "shape", &a->shape);
    break;
  case OP_ATTENTION: case OP_ATTENTION_GRAD: case OP_ATTENTION_DECODE:
    jint(j, o, "heads", a->heads);
    jint(j, o, "kv_heads", ir_kv_heads(a));
    jbool(j, o, "causal", a->causal);
    break;
  case OP_ROPE: case OP_ROPE_GRAD:
    jint(j, o, "heads", a->heads);
    jnum(j, o, "base", a->base);
    break;
  case OP_SOFTMAX: case OP_SOFTMAX_GRAD:
    jnum(j, o, "axis", a->axis);
    break;
  case OP_SLICE: case OP_SLICE_GRAD:
    jnum(j, o, "axis", a->axis);
    jint(j, o, "start", a->index);
    jbool(j, o, "squeeze", a->squeeze);
    jshape(j, o, "shape", &a->shape);
    break;
  case OP_CONCAT:
    jnum(j, o, "axis", a->axis);
    jshape(j, o, "shape", &a->shape);
    break;
  case OP_PERMUTE: {
    Shape p = {.rank = a->shape.rank};
    for (int d = 0; d < p.rank; d++) p.dim[d] = a->perm[d];
    jshape(j, o, "perm", &p);
    break;
  }
  case OP_IM2COL: case OP_COL2IM: case OP_MAXPOOL: case OP_MAXPOOL_GRAD: case OP_AVGPOOL: case OP_AVGPOOL_GRAD:
    jpair(j, o, "kernel", a->kh, a->kw);
    jpair(j, o, "stride", a->sh, a->sw);
    jpair(j, o, "padding", a->ph, a->pw);
    jpair(j, o, "dilation", a->dh, a->dw);
    break;
  case OP_DROPOUT:
    jnum(j, o, "p", a->p);
    jint(j, o, "site", a->site);
    break;
  case OP_NORM: case OP_NORM_GRAD: case OP_RMS_NORM: case OP_RMS_NORM_GRAD:
    jnum(j, o, "eps", a->eps);
    break;
  case OP_ADAMW: case OP_SGD:
    jbool(j, o, "no_decay", a->no_decay);
    if (a->sharded) jnum(j, o, "shard", a->shard);
    break;
  case OP_UNSCALE:
    jnum(j, o, "slot", a->slot);
    break;
  case OP_ALLREDUCE:
  case OP_REDUCE_SCATTER:
    jnum(j, o, "bucket", a->bucket);
    jint(j, o, "bytes", a->bytes);
    break;
  case OP_ALL_GATHER:
    jnum(j, o, "bucket", a->bucket);
    break;
  case OP_PRUNE_MASK:
    if (a->axis >= 0) jnum(j, o, "out_axis", a->axis);
    else jnull(j, o, "out_axis");
    break;
  case OP_FUSED: {
    cJSON *prog = jchk(j, cJSON_AddArrayToObject(o, "program"));
    for (int k = 0; prog && k < a->prog->n; k++) {
      const FusedInstr *fi = &a->prog->ins[k];
      cJSON *in = jchk(j, cJSON_CreateObject());
      if (!in) break;
      cJSON_AddItemToArray(prog, in);
      if (fi->op == OP_COUNT) {
        jstr(j, in, "op", "load");
        jnum(j, in, "input", fi->a);
        continue;
      }
      jstr(j, in, "op", op_info[fi->op].name);
      if (fi->op == OP_CONST) {
        jnum(j, in, "value", fi->value);
        continue;
      }
      if (op_info[fi->op].arity > 0) jnum(j, in, "a", fi->a);
      if (op_info[fi->op].arity > 1) jnum(j, in, "b", fi->b);
      if (fi->op == OP_DROPOUT) jnum(j, in, "p", fi->value), jint(j, in, "site", fi->site);
      if (fi->op == OP_CAST) jstr(j, in, "dtype", dtype_name((DType)fi->site));
    }
    break;
  }
  default:
    break;
  }
}

static void json_train(J *j, cJSON *o, const TrainSpec *t) {
  if (t->data == DATA_FASHION_MNIST || t->data == DATA_TEXT || t->data == DATA_TOKENS) {
    jstr(j, o, "data", t->data == DATA_TEXT ? "text" : t->data == DATA_TOKENS ? "tokens" : "fashion_mnist");
    jstr(j, o, "data_path", t->data_path ? t->data_path : "");
    if (t->data != DATA_FASHION_MNIST) jint(j, o, "block", t->block);
    else if (t->val_fraction > 0) jnum(j, o, "val_fraction", t->val_fraction);
  } else if (t->data == DATA_NPY) {
    jstr(j, o, "data", "npy");
    jstr(j, o, "data_path", t->data_path ? t->data_path : "");
    jstr(j, o, "data_y", t->data_y ? t->data_y : "");
    if (t->val_fraction > 0) jnum(j, o, "val_fraction", t->val_fraction);
    if (t->val_x) jstr(j, o, "val_x", t->val_x);
    if (t->val_y) jstr(j, o, "val_y", t->val_y);
  } else {
    jnull(j, o, "data");
  }
  jstr(j, o, "optimizer", t->optimizer == OPTIM_SGD ? "sgd" : "adamw");
  jnum(j, o, "lr", t->lr);
  jnum(j, o, "weight_decay", t->weight_decay);
  if (t->optimizer == OPTIM_SGD) {
    jnum(j, o, "momentum", t->momentum);
  } else {
    jnum(j, o, "beta1", t->beta1);
    jnum(j, o, "beta2", t->beta2);
    jnum(j, o, "eps", t->eps);
    jstr(j, o, "state", t->state_int8 ? "int8" : "f32");
  }
  jstr(j, o, "decay", t->decay_matrices_only ? "matrices" : "all");
  jint(j, o, "batch", t->batch);
  jint(j, o, "epochs", t->epochs);
  jint(j, o, "steps", t->steps);
  if (t->seed > ((uint64_t)1 << 53)) {
    char b[32];
    snprintf(b, sizeof b, "%" PRIu64, t->seed);
    jstr(j, o, "seed", b);
  } else {
    jnum(j, o, "seed", (double)t->seed);
  }
  jint(j, o, "log_every", t->log_every);
  jbool(j, o, "eval", t->eval);
  jint(j, o, "eval_every", t->eval_every);
  jint(j, o, "eval_batches", t->eval_batches);
  if (t->precision) jstr(j, o, "precision", t->precision);
  if (t->recompute) jstr(j, o, "recompute", t->recompute);
  if (t->offload) jstr(j, o, "offload", t->offload);
  static const char *const sched[] = {"constant", "cosine", "linear"};
  jstr(j, o, "lr_schedule", sched[t->lr_schedule]);
  jint(j, o, "warmup", t->warmup);
  jnum(j, o, "min_lr", t->min_lr);
  jnum(j, o, "clip_grad_norm", t->clip_grad_norm);
}

static bool in_graph(const Graph *g, const Value *v) {
  return v && v->id >= 0 && v->id < g->n_values && g->values[v->id] == v;
}

static void jref(J *j, cJSON *o, const char *k, const Graph *g, const Value *v) {
  if (in_graph(g, v)) jnum(j, o, k, v->id);
  else jnull(j, o, k);
}

int ir_print_json(const Graph *g, FILE *out) {
  J j = {.ok = true};
  cJSON *root = jchk(&j, cJSON_CreateObject());
  if (!root) return -1;
  jstr(&j, root, "model", g->model_name ? g->model_name : "?");
  if (g->after_pass) jstr(&j, root, "after", g->after_pass);
  else jnull(&j, root, "after");
  jstr(&j, root, "float_dtype", dtype_name(g->float_dtype));
  jbool(&j, root, "decode", g->decode);
  jnum(&j, root, "stages", g->n_stages > 1 ? g->n_stages : 1);
  jnum(&j, root, "replicas", g->replicas > 1 ? g->replicas : 1);
  if (g->zero) jnum(&j, root, "zero", g->zero);
  if (g->decode) jint(&j, root, "context", g->context);
  cJSON *train = jchk(&j, cJSON_AddObjectToObject(root, "train"));
  if (train) json_train(&j, train, &g->train);
  if (g->prune.mode != PRUNE_NONE) { /* the fields given (all after the prune pass) */
    const PruneSpec *p = &g->prune;
    char m[32];
    cJSON *pr = jchk(&j, cJSON_AddObjectToObject(root, "prune"));
    if (pr) {
      jstr(&j, pr, "mode", prune_mode_str(p, m, sizeof m));
      if (p->set & PRUNE_SET_SPARSITY) jnum(&j, pr, "sparsity", p->sparsity);
      if (p->set & PRUNE_SET_INITIAL) jnum(&j, pr, "initial", p->initial);
      if (p->set & PRUNE_SET_START) jint(&j, pr, "start", p->start);
      if (p->set & PRUNE_SET_END) jint(&j, pr, "end", p->end);
      if (p->set & PRUNE_SET_EVERY) jint(&j, pr, "every", p->every);
      if (p->params) jstr(&j, pr, "params", p->params);
    }
  }
  cJSON *regions = jchk(&j, cJSON_AddObjectToObject(root, "regions"));
  for (int r = 1; regions && r < MEM_COUNT; r++) jint(&j, regions, mem_region_name((MemRegion)r), g->region_bytes[r]);
  jref(&j, root, "loss", g, g->loss);
  jref(&j, root, "logits", g, g->logits);
  jref(&j, root, "labels", g, g->labels);
  cJSON *values = jchk(&j, cJSON_AddArrayToObject(root, "values"));
  for (int i = 0; values && i < g->n_values; i++) {
    const Value *v = g->values[i];
    cJSON *o = jchk(&j, cJSON_CreateObject());
    if (!o) break;
    cJSON_AddItemToArray(values, o);
    jnum(&j, o, "id", v->id);
    jstr(&j, o, "op", op_info[v->op].name);
    cJSON *ins = jchk(&j, cJSON_AddArrayToObject(o, "inputs"));
    for (int k = 0; ins && k < v->n_in; k++) {
      cJSON *n = jchk(&j, cJSON_CreateNumber(v->in[k]->id));
      if (n) cJSON_AddItemToArray(ins, n);
    }
    jstr(&j, o, "dtype", dtype_name(v->dtype));
    if (v->dtype == DT_VOID) jnull(&j, o, "shape");
    else jshape(&j, o, "shape", &v->shape);
    cJSON *attrs = jchk(&j, cJSON_AddObjectToObject(o, "attrs"));
    if (attrs) json_attrs(&j, attrs, v);
    jstr(&j, o, "role", role_name(v->role));
    if (v->block > 0) jnum(&j, o, "block", v->block);
    if (v->device >= 0) jnum(&j, o, "device", v->device);
    else jnull(&j, o, "device");
    if (v->region != MEM_NONE) {
      jstr(&j, o, "region", mem_region_name(v->region));
      jint(&j, o, "offset", v->offset);
    } else {
      jnull(&j, o, "region");
      jnull(&j, o, "offset");
    }
    if (v->op == OP_PARAM && in_graph(g, v->grad)) jnum(&j, o, "grad", v->grad->id);
  }
  char *text = j.ok ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (!text) return -1;
  fputs(text, out);
  fputc('\n', out);
  cJSON_free(text);
  return 0;
}
