#define _DEFAULT_SOURCE /* realpath */
/* frontend/elaborate.c: syntax tree -> forward Graph.
 *
 * Elaboration evaluates the program the way an interpreter would: consts are
 * folded to numbers, block calls are inlined (each call gets fresh
 * parameters named after the block and its call count), and every tensor
 * expression becomes a Value appended to the graph, whose shape rule reports
 * shape errors at the expression's location. */
#include "frontend.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ast.h"

int frontend_parse_source(ParseCtx *cx); /* lexer.l */

typedef enum { EV_TENSOR, EV_NUM, EV_STR, EV_TUPLE } EvKind;
typedef struct EVal EVal;
struct EVal {
  EvKind kind;
  EVal *items;     /* EV_TUPLE: n_items values */
  int n_items;
  Value *v;        /* EV_TENSOR */
  double num;      /* EV_NUM */
  bool is_int;     /* EV_NUM: integral literal or integral result */
  const char *str; /* EV_STR, or EV_NUM from true/false */
  Loc loc;
};

typedef struct Binding {
  const char *name;
  EVal val;
  Loc loc;
  bool is_const;
  struct Binding *next;
} Binding;

/* Names are looked up in hash maps (NameMap), never in lists: a list
 * scanned per name made elaboration quadratic in the model's size. */
typedef struct Scope {
  Binding *vars;      /* newest first (for hints) */
  NameMap index;      /* name -> its Binding in vars */
  struct Scope *parent;
  const char *prefix; /* "" at top level, "mlp1." inside a call of mlp */
  NameMap params;     /* parameter names declared in this scope (-> their Node) */
} Scope;

typedef struct Active {
  const Node *block;
  struct Active *up;
} Active;

typedef struct Elab {
  Arena *a;
  Diag *d;
  Graph *g;
  List stmts;
  NameMap blocks;      /* block name -> its first definition (a Node) */
  NameMap imported;    /* real paths of the imported files (-> their marker Node) */
  NameMap counters;    /* calls of each block, keyed by scope prefix + block (-> int) */
  NameMap param_names; /* full names of the parameters so far (-> their Value) */
  int64_t n_calls;     /* block calls so far */
  Active *active; /* blocks being expanded, innermost first */
  int depth;      /* expression nesting */
  int n_inputs;
  Value *inputs[8];
  int64_t n_dropout; /* dropout sites so far */
  int n_instances;   /* outermost block instances so far (Value.block) */
  Loc batch_loc;     /* the train section's `batch = N` value (line 0: none) */
} Elab;

#define MAX_EXPR_DEPTH 2000
/* Blocks and repeat are expanded inline: a few lines can ask for 2^100 calls
 * (the graph is capped at 2^18 values by graph_add). */
#define MAX_BLOCK_CALLS (1 << 18)
#define MAX_PREFIX 256 /* of the names inside a block call, "layer3.attn1." */

/* The count of `key` in m (inserted with count 0 when absent). */
static int *name_count(Arena *a, NameMap *m, const char *key) {
  void **slot = namemap_slot(a, m, key);
  if (!*slot) *slot = arena_alloc(a, sizeof(int));
  return *slot;
}

/* ---------------------------------------------------------------- hints */

typedef struct Hint {
  const char *best;
  int dist;
} Hint;

static void hint_try(Hint *h, const char *want, const char *cand) {
  int d = ir_edit_distance(want, cand);
  int limit = strlen(want) <= 3 ? 1 : 2;
  if (d <= limit && (!h->best || d < h->dist)) {
    h->best = cand;
    h->dist = d;
  }
}

static const char *hint_text(Elab *e, const Hint *h) {
  return h->best ? arena_printf(e->a, " (did you mean `%s`?)", h->best) : "";
}

/* ------------------------------------------------------------- builtins */

/* The plain built-ins (relu, gelu, matmul, ...) are the ops with a surface
 * name in the op table (ir/ops.def): op_info[op].surface, called with
 * op_info[op].arity positional tensors. */

/* Built-ins with named arguments (handled in eval_call). */
static const char *const attention_args[] = {"q", "k", "v", "heads", "causal", "kv_heads"};
static const char *const rmsnorm_args[] = {"x", "w", "eps"};
static const char *const rope_args[] = {"x", "heads", "base"};
static const char *const softmax_args[] = {"x", "axis"};
static const char *const layernorm_args[] = {"x", "w", "b", "eps"};
static const char *const dropout_args[] = {"x", "p"};
static const char *const conv_args[] = {"x", "w", "b", "stride", "padding", "dilation", "groups"};
static const char *const pool_args[] = {"x", "kernel", "stride", "padding"};

static const char *const functions[] = {"dim",     "sqrt",    "attention", "layernorm",  "dropout",    "reshape",
                                        "flatten", "permute", "concat",    "conv2d",     "max_pool2d", "avg_pool2d",
                                        "sum",     "max",     "split",     "repeat",    "softmax",    "rmsnorm",
                                        "rope"};
static const char *const train_keys[] = {"data", "optimizer", "lr", "weight_decay", "momentum",
                                         "batch", "epochs", "steps", "seed", "log_every", "eval",
                                         "eval_every", "eval_batches", "precision", "recompute", "lr_schedule",
                                         "clip_grad_norm", "offload"};
#define N_TRAIN_KEYS (int)(sizeof train_keys / sizeof train_keys[0])

/* -------------------------------------------------------------- helpers */

/* The first definition of block `name` (e->blocks is filled before
 * elaboration starts, so a block may be called above its definition). */
static const Node *find_block(Elab *e, const char *name) { return namemap_get(&e->blocks, name); }

static Binding *lookup(Scope *s, const char *name) {
  for (; s; s = s->parent) {
    Binding *b = namemap_get(&s->index, name);
    if (b) return b;
  }
  return NULL;
}

static void bind(Elab *e, Scope *s, const char *name, EVal v, Loc loc, bool is_const) {
  void **slot = namemap_slot(e->a, &s->index, name);
  if (*slot) {
    Binding *b = *slot;
    if (b->is_const || is_const)
      diag_error(e->d, loc, "`%s` is already defined%s", name, b->is_const ? " as a const" : "");
    b->val = v;
    b->loc = loc;
    return;
  }
  Binding *b = *slot = arena_alloc(e->a, sizeof *b);
  b->name = name;
  b->val = v;
  b->loc = loc;
  b->is_const = is_const;
  b->next = s->vars;
  s->vars = b;
}

static const char *unknown_name_hint(Elab *e, Scope *s, const char *name) {
  Hint h = {0};
  for (Scope *t = s; t; t = t->parent)
    for (Binding *b = t->vars; b; b = b->next) hint_try(&h, name, b->name);
  return hint_text(e, &h);
}

static const char *unknown_call_hint(Elab *e, const char *name) {
  Hint h = {0};
  for (int i = 0; i < OP_COUNT; i++)
    if (op_info[i].surface) hint_try(&h, name, op_info[i].surface);
  for (size_t i = 0; i < sizeof functions / sizeof *functions; i++) hint_try(&h, name, functions[i]);
  for (Node *s = e->stmts.head; s; s = s->next)
    if (s->kind == N_BLOCK) hint_try(&h, name, s->name);
  return hint_text(e, &h);
}

static const char *evkind_name(EvKind k) {
  return k == EV_TENSOR ? "a tensor" : k == EV_NUM ? "a number" : k == EV_STR ? "a string" : "a tuple";
}

static double want_num(Elab *e, EVal v, const char *what) {
  if (v.kind != EV_NUM) diag_error(e->d, v.loc, "%s must be a number, got %s", what, evkind_name(v.kind));
  return v.num;
}

static int64_t want_int(Elab *e, EVal v, const char *what, int64_t lo) {
  double x = want_num(e, v, what);
  if (x != floor(x))
    diag_error(e->d, v.loc, "%s must be an integer, got %.17g", what, x);
  if (fabs(x) > 9.0e18)
    diag_error(e->d, v.loc, "%s is out of range: %.17g (the limit is 9e18)", what, x);
  if ((int64_t)x < lo)
    diag_error(e->d, v.loc, "%s must be at least %lld, got %lld", what, (long long)lo, (long long)x);
  return (int64_t)x;
}

static Value *want_tensor(Elab *e, EVal v, const char *what) {
  if (v.kind != EV_TENSOR)
    diag_error(e->d, v.loc, "%s must be a tensor, got %s", what, evkind_name(v.kind));
  return v.v;
}

static Value *const_value(Elab *e, double x, Loc loc) {
  Attr at = {.value = x, .dtype = e->g->float_dtype};
  return graph_add(e->g, OP_CONST, NULL, 0, &at, loc);
}

/* Tensor for a binary op operand: numbers become scalar constants. */
static Value *as_tensor(Elab *e, EVal v) {
  if (v.kind == EV_NUM) return const_value(e, v.num, v.loc);
  if (v.kind == EV_STR) diag_error(e->d, v.loc, "a string cannot be used in arithmetic");
  if (v.kind == EV_TUPLE)
    diag_error(e->d, v.loc, "a tuple of %d values cannot be used here; unpack it, as in `a, b = ...`", v.n_items);
  return v.v;
}

/* ---------------------------------------------------------- expressions */

static EVal eval(Elab *e, Scope *s, const Node *n);
static EVal call_block(Elab *e, Scope *s, const Node *blk, const Node *call);
static EVal invoke_block(Elab *e, Scope *s, const Node *blk, EVal *vals, bool *set, Loc call_loc,
                         const char *prefix);
static void set_devices(Elab *e, int from, int device, Loc hint);
static const char *hinted_block(Elab *e, int from);

static EVal eval_binop(Elab *e, Scope *s, const Node *n) {
  EVal a = eval(e, s, n->a), b = eval(e, s, n->b);
  EVal r = {.loc = n->loc};
  if (a.kind == EV_NUM && b.kind == EV_NUM) {
    r.kind = EV_NUM;
    switch (n->op) {
    case '+': r.num = a.num + b.num; break;
    case '-': r.num = a.num - b.num; break;
    case '*': r.num = a.num * b.num; break;
    case '/':
      if (b.num == 0) diag_error(e->d, n->loc, "division by zero in a constant expression");
      r.num = a.num / b.num;
      break;
    case '@': diag_error(e->d, n->loc, "`@` needs tensors, got two numbers"); break;
    }
    if (!isfinite(r.num)) diag_error(e->d, n->loc, "constant expression overflows (result %g)", r.num);
    r.is_int = a.is_int && b.is_int && r.num == floor(r.num);
    return r;
  }
  OpKind op = n->op == '+' ? OP_ADD : n->op == '-' ? OP_SUB : n->op == '*' ? OP_MUL
            : n->op == '/' ? OP_DIV : OP_MATMUL;
  if (op == OP_MATMUL && (a.kind != EV_TENSOR || b.kind != EV_TENSOR))
    diag_error(e->d, n->loc, "`@` needs two tensors, got %s and %s", evkind_name(a.kind), evkind_name(b.kind));
  Value *in[2] = {as_tensor(e, a), as_tensor(e, b)};
  Attr at = {0};
  if (op == OP_MATMUL && in[1]->shape.rank != 2) {
    char b1[160];
    diag_error(e->d, n->loc, "the right operand of `@` must have rank 2 [K, N], got %s (batched matmul is not "
               "supported)", shape_str(&in[1]->shape, b1, sizeof b1));
  }
  if (op == OP_MATMUL && in[1]->op == OP_TRANSPOSE) { /* x @ transpose(w): one GEMM with w^T */
    in[1] = in[1]->in[0];
    at.trans_b = true;
  }
  r.kind = EV_TENSOR;
  r.v = graph_add(e->g, op, in, 2, &at, n->loc);
  return r;
}

/* Binds a call's positional and named arguments to `names`; the first
 * `n_required` must be given.  Unknown, repeated or surplus arguments are
 * errors. */
static void bind_args(Elab *e, Scope *s, const Node *n, const char *const *names, int n_names, int n_required,
                      EVal *out, bool *given) {
  int pos = 0;
  for (int i = 0; i < n_names; i++) given[i] = false;
  for (Node *a = n->args.head; a; a = a->next) {
    int idx = -1;
    if (a->kind == N_NAMED) {
      for (int i = 0; i < n_names; i++)
        if (!strcmp(names[i], a->name)) idx = i;
      if (idx < 0) {
        Hint h = {0};
        for (int i = 0; i < n_names; i++) hint_try(&h, a->name, names[i]);
        diag_error(e->d, a->loc, "%s has no argument named `%s`%s", n->name, a->name, hint_text(e, &h));
      }
    } else {
      if (pos >= n_names)
        diag_error(e->d, a->loc, "%s takes at most %d arguments, got %d", n->name, n_names, n->args.n);
      idx = pos++;
    }
    if (given[idx]) diag_error(e->d, a->loc, "argument `%s` of %s given twice", names[idx], n->name);
    out[idx] = eval(e, s, a->kind == N_NAMED ? a->a : a);
    given[idx] = true;
  }
  for (int i = 0; i < n_required; i++)
    if (!given[i]) diag_error(e->d, n->loc, "%s is missing argument `%s`", n->name, names[i]);
}

static bool want_bool(Elab *e, EVal v, const char *what) {
  if (v.kind != EV_NUM || (v.num != 0 && v.num != 1))
    diag_error(e->d, v.loc, "%s must be true or false", what);
  return v.num != 0;
}

static Value *op1(Elab *e, OpKind op, Value *x, const Attr *at, Loc loc) {
  return graph_add(e->g, op, &x, 1, at, loc);
}

/* Axis argument: -rank..rank-1, negative counting from the end. */
static int want_axis(Elab *e, EVal v, int rank, const char *what) {
  int64_t a = want_int(e, v, what, -(int64_t)rank);
  if (a < 0) a += rank;
  if (a >= rank) diag_error(e->d, v.loc, "%s %lld is out of range for rank %d", what, (long long)a, rank);
  return (int)a;
}

/* Output size of a sliding window; an error (naming both shapes) below 1. */
static int64_t window_out(Elab *e, const Node *n, const Value *x, int64_t in, int64_t k, int64_t st, int64_t pad,
                          int64_t dil) {
  /* (in + 2 pad - dil (k - 1) - 1) / st + 1, without overflow */
  int64_t span, o;
  if (__builtin_mul_overflow(dil, k - 1, &span)) span = INT64_MAX; /* no window fits */
  if (__builtin_mul_overflow(pad, 2, &o) || __builtin_add_overflow(o, in - 1, &o))
    diag_error(e->d, n->loc, "%s: padding %lld is out of range", n->name, (long long)pad);
  o = o < span ? 0 : (o - span) / st + 1;
  if (o < 1) {
    char b[160];
    diag_error(e->d, n->loc, "%s of %s with kernel %lld, stride %lld, padding %lld, dilation %lld: output size %lld "
               "is below 1", n->name, shape_str(&x->shape, b, sizeof b), (long long)k, (long long)st, (long long)pad,
               (long long)dil, (long long)o);
  }
  return o;
}

/* reshape, flatten, permute, transpose(x, a, b), concat, conv2d, pools. */
static Value *eval_shape_op(Elab *e, Scope *s, const Node *n) {
  char b1[160], b2[160];
  int na = n->args.n;
  EVal a[16];
  bool given[16];
  if (!strcmp(n->name, "conv2d") || !strcmp(n->name, "max_pool2d") || !strcmp(n->name, "avg_pool2d")) {
    bool conv = n->name[0] == 'c';
    bind_args(e, s, n, conv ? conv_args : pool_args, conv ? 7 : 4, 2, a, given);
    Value *x = want_tensor(e, a[0], "x");
    if (x->shape.rank != 4)
      diag_error(e->d, a[0].loc, "%s expects x of rank 4 [N,C,H,W], got %s", n->name, shape_str(&x->shape, b1, 160));
    int64_t N = x->shape.dim[0], C = x->shape.dim[1], H = x->shape.dim[2], W = x->shape.dim[3];
    Attr at = {.dh = 1, .dw = 1};
    if (!conv) {
      at.kh = at.kw = want_int(e, a[1], "kernel", 1);
      at.sh = at.sw = given[2] ? want_int(e, a[2], "stride", 1) : at.kh;
      at.ph = at.pw = given[3] ? want_int(e, a[3], "padding", 0) : 0;
      if (at.ph > at.kh / 2)
        diag_error(e->d, a[3].loc, "%s: padding %lld is more than half the kernel %lld", n->name, (long long)at.ph,
                   (long long)at.kh);
      int64_t oh = window_out(e, n, x, H, at.kh, at.sh, at.ph, 1), ow = window_out(e, n, x, W, at.kw, at.sw, at.pw, 1);
      at.shape = x->shape;
      at.shape.dim[2] = oh;
      at.shape.dim[3] = ow;
      return op1(e, n->name[0] == 'm' ? OP_MAXPOOL : OP_AVGPOOL, x, &at, n->loc);
    }
    Value *w = want_tensor(e, a[1], "w");
    int64_t groups = given[6] ? want_int(e, a[6], "groups", 1) : 1;
    at.sh = at.sw = given[3] ? want_int(e, a[3], "stride", 1) : 1;
    at.ph = at.pw = given[4] ? want_int(e, a[4], "padding", 0) : 0;
    at.dh = at.dw = given[5] ? want_int(e, a[5], "dilation", 1) : 1;
    if (w->shape.rank != 4 || C % groups || w->shape.dim[0] % groups || w->shape.dim[1] != C / groups)
      diag_error(e->d, a[1].loc, "conv2d of %s with weight %s and %lld group%s: the weight must be [out, %lld, kh, kw] "
                 "with out divisible by the groups", shape_str(&x->shape, b1, 160), shape_str(&w->shape, b2, 160),
                 (long long)groups, groups == 1 ? "" : "s", (long long)(C % groups ? 0 : C / groups));
    if (groups > 32) diag_error(e->d, a[6].loc, "conv2d supports at most 32 groups, got %lld", (long long)groups);
    int64_t O = w->shape.dim[0], G = groups, Cg = C / G, Og = O / G;
    at.kh = w->shape.dim[2];
    at.kw = w->shape.dim[3];
    int64_t oh = window_out(e, n, x, H, at.kh, at.sh, at.ph, at.dh), ow = window_out(e, n, x, W, at.kw, at.sw, at.pw, at.dw);
    int64_t rows; /* of im2col: N*OH*OW */
    if (__builtin_mul_overflow(N, oh, &rows) || __builtin_mul_overflow(rows, ow, &rows))
      diag_error(e->d, n->loc, "conv2d of %s: the output has more elements than fit in 64 bits",
                 shape_str(&x->shape, b1, 160));
    Value *parts[32];
    for (int64_t g = 0; g < G; g++) {
      Value *xg = x, *wg = w;
      if (G > 1) {
        Attr sx = {.axis = 1, .index = g * Cg, .shape = x->shape}, sw = {.axis = 0, .index = g * Og, .shape = w->shape};
        sx.shape.dim[1] = Cg;
        sw.shape.dim[0] = Og;
        xg = op1(e, OP_SLICE, x, &sx, n->loc);
        wg = op1(e, OP_SLICE, w, &sw, n->loc);
      }
      Attr ic = at; /* im2col: [N*OH*OW, Cg*KH*KW] */
      ic.shape = (Shape){.rank = 2, .dim = {rows, Cg * at.kh * at.kw}};
      Value *cols = op1(e, OP_IM2COL, xg, &ic, n->loc);
      Attr rw = {.shape = {.rank = 2, .dim = {Og, Cg * at.kh * at.kw}}};
      Value *in[2] = {cols, op1(e, OP_RESHAPE, wg, &rw, n->loc)};
      Attr mm = {.trans_b = true};
      Value *y = graph_add(e->g, OP_MATMUL, in, 2, &mm, n->loc); /* [N*OH*OW, Og] */
      Attr ry = {.shape = {.rank = 4, .dim = {N, oh, ow, Og}}};
      y = op1(e, OP_RESHAPE, y, &ry, n->loc);
      Attr pm = {.shape = {.rank = 4, .dim = {N, Og, oh, ow}}, .perm = {0, 3, 1, 2}};
      parts[g] = op1(e, OP_PERMUTE, y, &pm, n->loc);
    }
    Value *y = parts[0];
    if (G > 1) {
      Attr cat = {.axis = 1, .shape = {.rank = 4, .dim = {N, O, oh, ow}}};
      y = graph_add(e->g, OP_CONCAT, parts, (int)G, &cat, n->loc);
    }
    if (given[2]) {
      Value *bias = want_tensor(e, a[2], "b");
      if (bias->shape.rank != 1 || bias->shape.dim[0] != O)
        diag_error(e->d, a[2].loc, "conv2d bias must be [%lld], got %s", (long long)O, shape_str(&bias->shape, b1, 160));
      Attr rb = {.shape = {.rank = 3, .dim = {O, 1, 1}}};
      Value *in[2] = {y, op1(e, OP_RESHAPE, bias, &rb, n->loc)};
      y = graph_add(e->g, OP_ADD, in, 2, NULL, n->loc);
    }
    return y;
  }
  if (na < 1 || na > 16) diag_error(e->d, n->loc, "%s takes 1 to 16 arguments, got %d", n->name, na);
  int k = 0, axis_arg = -1;
  for (Node *p = n->args.head; p; p = p->next, k++) {
    if (p->kind == N_NAMED) {
      bool ok = (!strcmp(n->name, "concat") && !strcmp(p->name, "axis")) ||
                (!strcmp(n->name, "flatten") && !strcmp(p->name, "start"));
      if (!ok) diag_error(e->d, p->loc, "%s has no argument named `%s`", n->name, p->name);
      axis_arg = k;
      a[k] = eval(e, s, p->a);
    } else {
      a[k] = eval(e, s, p);
    }
  }
  if (!strcmp(n->name, "concat")) {
    Value *xs[16];
    int m = 0;
    for (int i = 0; i < na; i++)
      if (i != axis_arg) xs[m++] = want_tensor(e, a[i], "a concat operand");
    if (m == 0) diag_error(e->d, n->loc, "concat needs at least one tensor");
    int axis = axis_arg >= 0 ? want_axis(e, a[axis_arg], xs[0]->shape.rank, "axis") : 0;
    Attr at = {.axis = axis, .shape = xs[0]->shape};
    at.shape.dim[axis] = 0;
    for (int i = 0; i < m; i++) {
      Shape t = xs[i]->shape, u = xs[0]->shape;
      t.dim[axis] = u.dim[axis] = 0;
      if (t.rank != u.rank || !shape_eq(&t, &u))
        diag_error(e->d, a[i].loc, "concat of %s and %s along axis %d: the other dimensions differ",
                   shape_str(&xs[0]->shape, b1, 160), shape_str(&xs[i]->shape, b2, 160), axis);
      if (__builtin_add_overflow(at.shape.dim[axis], xs[i]->shape.dim[axis], &at.shape.dim[axis]))
        diag_error(e->d, a[i].loc, "concat along axis %d: the result has more elements than fit in 64 bits", axis);
    }
    if (m == 1) return xs[0];
    return graph_add(e->g, OP_CONCAT, xs, m, &at, n->loc);
  }
  Value *x = want_tensor(e, a[0], "the first argument");
  int r = x->shape.rank;
  if (!strcmp(n->name, "flatten")) {
    int start = axis_arg >= 0 ? want_axis(e, a[axis_arg], r, "start") : (na > 1 ? want_axis(e, a[1], r, "start") : 1);
    if (r < 2 && axis_arg < 0 && na == 1) start = 0;
    Attr at = {.shape = {.rank = start + 1}};
    for (int d = 0; d < start; d++) at.shape.dim[d] = x->shape.dim[d];
    at.shape.dim[start] = 1;
    for (int d = start; d < r; d++) at.shape.dim[start] *= x->shape.dim[d];
    return op1(e, OP_RESHAPE, x, &at, n->loc);
  }
  if (!strcmp(n->name, "reshape")) {
    Attr at = {.shape = {.rank = na - 1}};
    int infer = -1;
    int64_t known = 1;
    if (na - 1 > IR_MAX_RANK || na < 2) diag_error(e->d, n->loc, "reshape takes 1 to %d dimensions", IR_MAX_RANK);
    for (int i = 1; i < na; i++) {
      int64_t d = want_int(e, a[i], "a dimension", -1);
      if (d == -1) {
        if (infer >= 0) diag_error(e->d, a[i].loc, "reshape: only one dimension may be -1");
        infer = i - 1;
      } else if (d == 0) {
        diag_error(e->d, a[i].loc, "reshape: dimension %d is 0", i - 1);
      } else {
        known = known > INT64_MAX / d ? INT64_MAX : known * d; /* saturates: then no match */
      }
      at.shape.dim[i - 1] = d;
    }
    int64_t total = shape_numel(&x->shape);
    if (infer >= 0) {
      if (total % known) diag_error(e->d, n->loc, "reshape of %s: %lld elements do not divide into the given dims",
                                    shape_str(&x->shape, b1, 160), (long long)total);
      at.shape.dim[infer] = total / known;
    }
    return op1(e, OP_RESHAPE, x, &at, n->loc);
  }
  /* permute(x, p0, p1, ...) and transpose(x, a, b) */
  Attr at = {.shape = {.rank = r}};
  for (int d = 0; d < r; d++) at.perm[d] = d;
  if (!strcmp(n->name, "transpose")) {
    int p = want_axis(e, a[1], r, "axis"), q = want_axis(e, a[2], r, "axis");
    at.perm[p] = q;
    at.perm[q] = p;
  } else {
    if (na - 1 != r) diag_error(e->d, n->loc, "permute of a rank-%d tensor takes %d axes, got %d", r, r, na - 1);
    int seen = 0;
    for (int d = 0; d < r; d++) {
      at.perm[d] = want_axis(e, a[d + 1], r, "axis");
      if (seen & (1 << at.perm[d])) diag_error(e->d, a[d + 1].loc, "permute: axis %d appears twice", at.perm[d]);
      seen |= 1 << at.perm[d];
    }
  }
  for (int d = 0; d < r; d++) at.shape.dim[d] = x->shape.dim[at.perm[d]];
  return op1(e, OP_PERMUTE, x, &at, n->loc);
}

static EVal eval_call(Elab *e, Scope *s, const Node *n) {
  EVal r = {.loc = n->loc};
  if (!strcmp(n->name, "dim")) {
    if (n->args.n != 2 || n->args.head->kind == N_NAMED || n->args.tail->kind == N_NAMED)
      diag_error(e->d, n->loc, "dim takes 2 positional arguments (tensor, axis), got %d", n->args.n);
    Value *x = want_tensor(e, eval(e, s, n->args.head), "the first argument of dim");
    EVal ax = eval(e, s, n->args.tail);
    int64_t i = want_int(e, ax, "the axis of dim", -x->shape.rank);
    if (i < 0) i += x->shape.rank;
    if (i >= x->shape.rank)
      diag_error(e->d, ax.loc, "axis %lld is out of range for a tensor of rank %d", (long long)i, x->shape.rank);
    r.kind = EV_NUM;
    r.num = (double)x->shape.dim[i];
    r.is_int = true;
    return r;
  }
  if (!strcmp(n->name, "sqrt")) {
    if (n->args.n != 1 || n->args.head->kind == N_NAMED)
      diag_error(e->d, n->loc, "sqrt takes 1 argument (a number), got %d", n->args.n);
    EVal x = eval(e, s, n->args.head);
    double v = want_num(e, x, "the argument of sqrt");
    if (v < 0) diag_error(e->d, x.loc, "sqrt of a negative number (%g)", v);
    r.kind = EV_NUM;
    r.num = sqrt(v);
    r.is_int = r.num == floor(r.num) && x.is_int;
    return r;
  }
  if (!strcmp(n->name, "attention")) {
    EVal a[6];
    bool given[6];
    bind_args(e, s, n, attention_args, 6, 4, a, given);
    Value *in[3];
    for (int i = 0; i < 3; i++) in[i] = want_tensor(e, a[i], attention_args[i]);
    Attr at = {.heads = want_int(e, a[3], "heads", 1), .causal = given[4] && want_bool(e, a[4], "causal")};
    if (given[5]) { /* grouped-query attention: query head h reads key/value head h / (heads / kv_heads) */
      int64_t kvh = want_int(e, a[5], "kv_heads", 1);
      if (at.heads % kvh)
        diag_error(e->d, a[5].loc, "attention: kv_heads %lld does not divide heads %lld", (long long)kvh,
                   (long long)at.heads);
      at.kv_heads = kvh == at.heads ? 0 : kvh;
    }
    r.kind = EV_TENSOR;
    if (e->g->decode) {
      /* one new token attends to itself and the cached keys and values of
       * the tokens before it */
      if (!at.causal) diag_error(e->d, n->loc, "generation needs causal attention");
      Value *in5[5] = {in[0], in[1], in[2], NULL, NULL};
      for (int c = 0; c < 2; c++) {
        Attr ca = {.dtype = in[0]->dtype, .kv_cache = true, .init = INIT_ZEROS};
        ca.shape.rank = 3;
        ca.shape.dim[0] = in[0]->shape.dim[0];
        ca.shape.dim[1] = e->g->context;
        ca.shape.dim[2] = in[1]->shape.rank == 3 ? in[1]->shape.dim[2] : 1; /* k's channels (kv_heads heads) */
        ca.name = arena_printf(e->a, "kv_cache.%d.%s", e->g->n_values, c ? "v" : "k");
        in5[3 + c] = graph_add(e->g, OP_STATE, NULL, 0, &ca, n->loc);
      }
      r.v = graph_add(e->g, OP_ATTENTION_DECODE, in5, 5, &at, n->loc);
    } else {
      r.v = graph_add(e->g, OP_ATTENTION, in, 3, &at, n->loc);
    }
    return r;
  }
  if (!strcmp(n->name, "repeat")) { /* repeat(N, block, x): x = block(x), N times, params block.i. */
    if (n->args.n != 3 || n->args.head->kind == N_NAMED || n->args.head->next->kind != N_IDENT ||
        n->args.tail->kind == N_NAMED)
      diag_error(e->d, n->loc, "repeat takes 3 positional arguments: a count, a block and its input");
    EVal cnt = eval(e, s, n->args.head);
    int64_t times = want_int(e, cnt, "the repeat count", INT64_MIN + 1);
    if (times < 1) diag_error(e->d, cnt.loc, "repeat count must be at least 1, got %lld", (long long)times);
    if (times > 100000) diag_error(e->d, cnt.loc, "repeat count %lld is too large (at most 100000)", (long long)times);
    const Node *bn = n->args.head->next;
    const Node *blk = find_block(e, bn->name);
    if (!blk) diag_error(e->d, bn->loc, "unknown block `%s`%s", bn->name, unknown_call_hint(e, bn->name));
    if (blk->args.n < 1) diag_error(e->d, bn->loc, "block `%s` takes no argument to repeat over", blk->name);
    r = eval(e, s, n->args.tail);
    /* a second repeat of the same block in this scope continues the count */
    int *rc = name_count(e->a, &e->counters, arena_printf(e->a, "%s%s#repeat", s->prefix, blk->name));
    int64_t first = *rc;
    *rc += (int)times;
    for (int64_t i = first; i < first + times; i++) {
      EVal *vals = arena_alloc(e->a, (size_t)blk->args.n * sizeof *vals);
      bool *set = arena_alloc(e->a, (size_t)blk->args.n * sizeof *set);
      vals[0] = r;
      set[0] = true;
      r = invoke_block(e, s, blk, vals, set, n->loc,
                       arena_printf(e->a, "%s%s.%lld.", s->prefix, blk->name, (long long)i));
      if (r.kind == EV_TUPLE) diag_error(e->d, n->loc, "repeat needs a block with one result, `%s` returns a tuple",
                                         blk->name);
    }
    r.loc = n->loc;
    return r;
  }
  if (!strcmp(n->name, "split")) { /* split(t, n, axis = -1): n equal slices, a tuple */
    static const char *const split_args[] = {"x", "n", "axis"};
    EVal a[3];
    bool given[3];
    bind_args(e, s, n, split_args, 3, 2, a, given);
    Value *x = want_tensor(e, a[0], "x");
    int64_t parts = want_int(e, a[1], "the number of parts", 1);
    int axis = given[2] ? want_axis(e, a[2], x->shape.rank, "axis") : x->shape.rank - 1;
    if (x->shape.rank < 1 || x->shape.dim[axis] % parts) {
      char b[160];
      diag_error(e->d, a[1].loc, "split of %s into %lld parts along axis %d: %lld is not divisible by %lld",
                 shape_str(&x->shape, b, sizeof b), (long long)parts, axis, (long long)(x->shape.rank ? x->shape.dim[axis] : 0),
                 (long long)parts);
    }
    if (parts > 1024) diag_error(e->d, a[1].loc, "split into at most 1024 parts, got %lld", (long long)parts);
    int64_t len = x->shape.dim[axis] / parts;
    r.kind = EV_TUPLE;
    r.n_items = (int)parts;
    r.items = arena_alloc(e->a, (size_t)parts * sizeof *r.items);
    for (int64_t i = 0; i < parts; i++) {
      Attr at = {.axis = axis, .index = i * len, .shape = x->shape};
      at.shape.dim[axis] = len;
      r.items[i] = (EVal){.kind = EV_TENSOR, .v = op1(e, OP_SLICE, x, &at, n->loc), .loc = n->loc};
    }
    return r;
  }
  if ((!strcmp(n->name, "sum") || !strcmp(n->name, "mean") || !strcmp(n->name, "max")) &&
      (n->args.n == 2 || !strcmp(n->name, "sum") || !strcmp(n->name, "max"))) {
    /* sum/mean/max over one axis (dropped), or sum/max of all elements */
    static const char *const red_args[] = {"x", "axis"};
    EVal a[2];
    bool given[2];
    bind_args(e, s, n, red_args, 2, 1, a, given);
    Value *x = want_tensor(e, a[0], "x");
    if (!dtype_is_float(x->dtype))
      diag_error(e->d, a[0].loc, "%s expects a float tensor, got %s", n->name, dtype_name(x->dtype));
    Shape keep = x->shape, out = {0};
    int axis = -1;
    if (given[1]) {
      axis = want_axis(e, a[1], x->shape.rank, "axis");
      keep.dim[axis] = 1;
      for (int d = 0; d < x->shape.rank; d++)
        if (d != axis) out.dim[out.rank++] = x->shape.dim[d];
    } else {
      for (int d = 0; d < keep.rank; d++) keep.dim[d] = 1;
    }
    Attr kt = {.shape = keep};
    Value *y = op1(e, !strcmp(n->name, "max") ? OP_MAX_TO : OP_SUM_TO, x, &kt, n->loc);
    if (!strcmp(n->name, "mean")) {
      Value *in[2] = {y, const_value(e, 1.0 / (double)x->shape.dim[axis], n->loc)};
      y = graph_add(e->g, OP_MUL, in, 2, NULL, n->loc);
    }
    Attr rt = {.shape = out};
    r.kind = EV_TENSOR;
    r.v = op1(e, OP_RESHAPE, y, &rt, n->loc);
    return r;
  }
  if (!strcmp(n->name, "dropout")) { /* dropout(x, p): zero with probability p, scale by 1/(1-p) */
    EVal a[2];
    bool given[2];
    bind_args(e, s, n, dropout_args, 2, 2, a, given);
    Value *x = want_tensor(e, a[0], "x");
    double pr = want_num(e, a[1], "p");
    if (!(pr >= 0 && pr < 1)) diag_error(e->d, a[1].loc, "dropout probability must be in [0, 1), got %g", pr);
    r.kind = EV_TENSOR;
    if (pr == 0 || e->g->decode) { /* no-op, and never when generating */
      r.v = x;
      return r;
    }
    Attr at = {.p = pr, .site = ++e->n_dropout};
    r.v = graph_add(e->g, OP_DROPOUT, &x, 1, &at, n->loc);
    return r;
  }
  if (!strcmp(n->name, "reshape") || !strcmp(n->name, "permute") || !strcmp(n->name, "flatten") ||
      !strcmp(n->name, "concat") || !strcmp(n->name, "conv2d") || !strcmp(n->name, "max_pool2d") ||
      !strcmp(n->name, "avg_pool2d") || (!strcmp(n->name, "transpose") && n->args.n == 3)) {
    r.kind = EV_TENSOR;
    r.v = eval_shape_op(e, s, n);
    return r;
  }
  if (!strcmp(n->name, "rmsnorm")) { /* rms_norm(x) * w over the last axis (Zhang & Sennrich 2019) */
    EVal a[3];
    bool given[3];
    bind_args(e, s, n, rmsnorm_args, 3, 2, a, given);
    Value *x = want_tensor(e, a[0], "x"), *w = want_tensor(e, a[1], "w");
    if (x->shape.rank < 1) diag_error(e->d, a[0].loc, "rmsnorm of a scalar: x needs a last axis to normalise");
    Shape bs;
    if (!shape_broadcast(&x->shape, &w->shape, &bs) || !shape_eq(&bs, &x->shape)) {
      char b1[160], b2[160];
      diag_error(e->d, a[1].loc, "rmsnorm of %s: the gain w %s does not broadcast to it (as [%lld])",
                 shape_str(&x->shape, b1, sizeof b1), shape_str(&w->shape, b2, sizeof b2),
                 (long long)x->shape.dim[x->shape.rank - 1]);
    }
    Attr at = {.eps = 1e-5}; /* Meta's LLaMA reference (ModelArgs.norm_eps) */
    if (given[2]) {
      at.eps = want_num(e, a[2], "eps");
      if (!(at.eps > 0)) diag_error(e->d, a[2].loc, "eps must be positive, got %g", at.eps);
    }
    Value *in[2] = {graph_add(e->g, OP_RMS_NORM, &x, 1, &at, n->loc), w};
    r.kind = EV_TENSOR;
    r.v = graph_add(e->g, OP_MUL, in, 2, NULL, n->loc);
    return r;
  }
  if (!strcmp(n->name, "rope")) { /* rotary position embedding (Su et al. 2021), pairs (2i, 2i+1) */
    EVal a[3];
    bool given[3];
    bind_args(e, s, n, rope_args, 3, 2, a, given);
    Value *x = want_tensor(e, a[0], "x");
    Attr at = {.heads = want_int(e, a[1], "heads", 1), .base = 10000};
    if (given[2]) {
      at.base = want_num(e, a[2], "base");
      if (!(at.base > 0)) diag_error(e->d, a[2].loc, "rope: base must be positive, got %g", at.base);
    }
    r.kind = EV_TENSOR;
    r.v = graph_add(e->g, OP_ROPE, &x, 1, &at, n->loc);
    return r;
  }
  if (!strcmp(n->name, "softmax")) { /* softmax(x, axis = -1) */
    EVal a[2];
    bool given[2];
    bind_args(e, s, n, softmax_args, 2, 1, a, given);
    Value *x = want_tensor(e, a[0], "x");
    if (x->shape.rank < 1) diag_error(e->d, a[0].loc, "softmax of a scalar: x needs an axis");
    Attr at = {.axis = given[1] ? want_axis(e, a[1], x->shape.rank, "axis") : x->shape.rank - 1};
    r.kind = EV_TENSOR;
    r.v = graph_add(e->g, OP_SOFTMAX, &x, 1, &at, n->loc);
    return r;
  }
  if (!strcmp(n->name, "layernorm")) { /* norm(x) * w + b, normalising the last axis */
    EVal a[4];
    bool given[4];
    bind_args(e, s, n, layernorm_args, 4, 3, a, given);
    Value *x = want_tensor(e, a[0], "x"), *w = want_tensor(e, a[1], "w"), *b = want_tensor(e, a[2], "b");
    Attr at = {.eps = 1e-5}; /* torch.nn.LayerNorm's default */
    if (given[3]) {
      at.eps = want_num(e, a[3], "eps");
      if (!(at.eps > 0)) diag_error(e->d, a[3].loc, "eps must be positive, got %g", at.eps);
    }
    Value *nx = graph_add(e->g, OP_NORM, &x, 1, &at, n->loc);
    Value *in1[2] = {nx, w};
    Value *y = graph_add(e->g, OP_MUL, in1, 2, NULL, n->loc);
    Value *in2[2] = {y, b};
    r.kind = EV_TENSOR;
    r.v = graph_add(e->g, OP_ADD, in2, 2, NULL, n->loc);
    return r;
  }
  for (int i = 0; i < OP_COUNT; i++) {
    if (!op_info[i].surface || strcmp(op_info[i].surface, n->name)) continue;
    OpKind op = (OpKind)i;
    int arity = op_info[i].arity;
    if (n->args.n != arity)
      diag_error(e->d, n->loc, "%s takes %d argument%s, got %d", n->name, arity, arity == 1 ? "" : "s", n->args.n);
    Value *in[4];
    int k = 0;
    for (Node *a = n->args.head; a; a = a->next) {
      if (a->kind == N_NAMED) diag_error(e->d, a->loc, "%s has no argument named `%s`", n->name, a->name);
      EVal v = eval(e, s, a);
      if (v.kind != EV_TENSOR && op_info[op].rule != SHAPE_BROADCAST) /* add, sub, mul, div take numbers */
        diag_error(e->d, v.loc, "argument %d of %s must be a tensor, got %s", k + 1, n->name, evkind_name(v.kind));
      in[k++] = as_tensor(e, v);
    }
    if (op == OP_MATMUL && in[1]->shape.rank != 2) {
      char b1[160];
      diag_error(e->d, n->loc, "the second operand of matmul must have rank 2 [K, N], got %s (batched matmul is "
                 "not supported)", shape_str(&in[1]->shape, b1, sizeof b1));
    }
    r.kind = EV_TENSOR;
    r.v = graph_add(e->g, op, in, k, NULL, n->loc);
    return r;
  }
  const Node *blk = find_block(e, n->name);
  if (blk) return call_block(e, s, blk, n);
  diag_error(e->d, n->loc, "unknown op or block `%s`%s", n->name, unknown_call_hint(e, n->name));
  return r;
}

static EVal eval(Elab *e, Scope *s, const Node *n) {
  if (++e->depth > MAX_EXPR_DEPTH)
    diag_error(e->d, n->loc, "expression nested more than %d levels deep", MAX_EXPR_DEPTH);
  EVal r = {.loc = n->loc};
  switch (n->kind) {
  case N_NUM:
    r.kind = EV_NUM;
    r.num = n->num;
    r.is_int = n->num_is_int;
    if (!isfinite(r.num)) diag_error(e->d, n->loc, "number out of range");
    break;
  case N_STR:
    r.kind = EV_STR;
    r.str = n->str;
    break;
  case N_IDENT: {
    Binding *b = lookup(s, n->name);
    if (!b) {
      if (find_block(e, n->name))
        diag_error(e->d, n->loc, "block `%s` used as a value: call it, as in `%s(x)`", n->name, n->name);
      diag_error(e->d, n->loc, "unknown name `%s`%s", n->name, unknown_name_hint(e, s, n->name));
    }
    r = b->val;
    r.loc = n->loc;
    break;
  }
  case N_CALL:
    r = eval_call(e, s, n);
    r.loc = n->loc;
    break;
  case N_BINOP:
    r = eval_binop(e, s, n);
    break;
  case N_NEG: {
    EVal a = eval(e, s, n->a);
    if (a.kind == EV_NUM) {
      r = a;
      r.num = -a.num;
    } else {
      Value *in[1] = {as_tensor(e, a)};
      r.kind = EV_TENSOR;
      r.v = graph_add(e->g, OP_NEG, in, 1, NULL, n->loc);
    }
    r.loc = n->loc;
    break;
  }
  case N_NAMED:
    diag_error(e->d, n->loc, "named argument `%s` is not allowed here", n->name);
    break;
  case N_TUPLE: {
    r.kind = EV_TUPLE;
    r.n_items = n->args.n;
    r.items = arena_alloc(e->a, (size_t)r.n_items * sizeof *r.items);
    int i = 0;
    for (Node *x = n->args.head; x; x = x->next) {
      r.items[i] = eval(e, s, x);
      if (r.items[i].kind == EV_TUPLE) diag_error(e->d, x->loc, "tuples cannot be nested");
      i++;
    }
    break;
  }
  case N_HINT: { /* @device(N) expr: the values of expr belong to device N */
    if (strcmp(n->name, "device"))
      diag_error(e->d, n->loc, "unknown hint `@%s`; the only hint is @device(N)", n->name);
    EVal dv = eval(e, s, n->b);
    double dev = want_num(e, dv, "the device of @device");
    int from = e->g->n_values;
    r = eval(e, s, n->a);
    if (!(dev >= 0 && dev < IR_MAX_STAGES && dev == floor(dev))) { /* --devices lists at most IR_MAX_STAGES */
      const char *b = hinted_block(e, from);
      diag_error(e->d, dv.loc, "@device%s%s%s expects a device index 0..%d, got %.15g", b ? " on block `" : "",
                 b ? b : "", b ? "`" : "", IR_MAX_STAGES - 1, dev);
    }
    set_devices(e, from, (int)dev, n->loc);
    break;
  }
  default:
    unreachable();
  }
  e->depth--;
  return r;
}

/* Values created since `from` without a device hint get `device` (and the
 * hint's location, for the partition pass's messages). */
static void set_devices(Elab *e, int from, int device, Loc hint) {
  for (int i = from; i < e->g->n_values; i++)
    if (e->g->values[i]->device < 0) {
      e->g->values[i]->device = device;
      e->g->values[i]->device_loc = hint;
    }
}

/* The block whose params were all created since `from` (the longest dotted
 * prefix they share: "linear2" of linear2.w and linear2.b), or NULL. */
static const char *hinted_block(Elab *e, int from) {
  const char *first = NULL;
  size_t len = 0; /* of the shared prefix, without its final '.' */
  for (int i = from; i < e->g->n_values; i++) {
    const Value *v = e->g->values[i];
    if (v->op != OP_PARAM || !v->attr.name) continue;
    const char *nm = v->attr.name;
    if (!first) {
      const char *dot = strrchr(nm, '.');
      if (!dot) return NULL;
      first = nm, len = (size_t)(dot - nm);
    }
    while (len > 0 && (strncmp(nm, first, len) || nm[len] != '.')) {
      while (len > 0 && first[len - 1] != '.') len--;
      if (len > 0) len--; /* drop the '.' */
    }
    if (!len) return NULL;
  }
  return first ? arena_printf(e->a, "%.*s", (int)len, first) : NULL;
}

/* ---------------------------------------------------------- statements */

static void read_dims(Elab *e, Scope *s, const Node *n, Shape *sh) {
  if (n->args.n > IR_MAX_RANK)
    diag_error(e->d, n->loc, "tensors have at most %d dimensions, `%s` has %d", IR_MAX_RANK, n->name, n->args.n);
  sh->rank = 0;
  for (Node *d = n->args.head; d; d = d->next) {
    EVal v = eval(e, s, d);
    int64_t x = want_int(e, v, "a dimension", INT64_MIN + 1);
    if (x < 1) diag_error(e->d, v.loc, "dimension %d of `%s` is %lld: dimensions must be at least 1",
                          sh->rank, n->name, (long long)x);
    sh->dim[sh->rank++] = x;
  }
  if (shape_numel(sh) < 0) {
    char b[160];
    diag_error(e->d, n->loc, "`%s` has shape %s, whose element count overflows 64 bits", n->name,
               shape_str(sh, b, sizeof b));
  }
}

static DType read_dtype(Elab *e, const Node *n, bool allow_int) {
  if (!n->dtype) return e->g->float_dtype;
  int t = dtype_from_name(n->dtype);
  if (t < 0 || t == DT_VOID || t == DT_U8 || t == DT_I8) { /* u8: optimizer state codes only; i8: quantized weights */
    Hint h = {0};
    hint_try(&h, n->dtype, "f32");
    hint_try(&h, n->dtype, "i32");
    diag_error(e->d, n->dtype_loc, "unknown dtype `%s`%s", n->dtype, hint_text(e, &h));
  }
  if (t == DT_I32 && !allow_int)
    diag_error(e->d, n->dtype_loc, "parameters must have a float dtype, got i32");
  if (t == DT_F64 && e->g->float_dtype != DT_F64)
    diag_error(e->d, n->dtype_loc, "f64 tensors are not supported in models yet: float tensors are f32");
  /* float tensors follow the compilation's float dtype (f64 in gradient tests) */
  return t == DT_I32 ? DT_I32 : e->g->float_dtype;
}

static void read_init(Elab *e, Scope *s, const Node *init, Attr *at) {
  at->init = INIT_KAIMING_UNIFORM;
  if (!init) return;
  const char *name = init->kind == N_IDENT || init->kind == N_CALL ? init->name : NULL;
  int k = -1;
  for (int i = 0; name && i < INIT_COUNT; i++)
    if (!strcmp(name, init_name((InitKind)i))) k = i;
  if (k < 0) {
    Hint h = {0};
    for (int i = 0; name && i < INIT_COUNT; i++) hint_try(&h, name, init_name((InitKind)i));
    diag_error(e->d, init->loc, "unknown initialiser%s%s%s; expected zeros, ones, normal(std), "
               "uniform(a, b), kaiming_uniform or xavier_uniform%s",
               name ? " `" : "", name ? name : "", name ? "`" : "", hint_text(e, &h));
  }
  at->init = (InitKind)k;
  at->init_a = k == INIT_NORMAL ? 1.0 : 0.0; /* torch.nn.init.normal_ std=1, uniform_ (0, 1) */
  at->init_b = 1.0;
  int n_args = init->kind == N_CALL ? init->args.n : 0;
  int max_args = k == INIT_NORMAL ? 1 : k == INIT_UNIFORM ? 2 : 0;
  if (n_args > max_args)
    diag_error(e->d, init->loc, "%s takes %d argument%s, got %d", name, max_args, max_args == 1 ? "" : "s", n_args);
  int pos = 0;
  for (Node *a = init->kind == N_CALL ? init->args.head : NULL; a; a = a->next, pos++) {
    const char *key = a->kind == N_NAMED ? a->name : NULL;
    EVal v = eval(e, s, a->kind == N_NAMED ? a->a : a);
    double x = want_num(e, v, "an initialiser argument");
    if (k == INIT_NORMAL && (!key || !strcmp(key, "std"))) {
      if (x < 0) diag_error(e->d, v.loc, "normal: std must be non-negative, got %g", x);
      at->init_a = x;
    } else if (k == INIT_UNIFORM && ((!key && pos == 0) || (key && !strcmp(key, "a")))) {
      at->init_a = x;
    } else if (k == INIT_UNIFORM && ((!key && pos == 1) || (key && !strcmp(key, "b")))) {
      at->init_b = x;
    } else {
      diag_error(e->d, a->loc, "%s has no argument named `%s`", name, key ? key : "?");
    }
  }
  if (k == INIT_UNIFORM && !(at->init_a < at->init_b))
    diag_error(e->d, init->loc, "uniform(a, b) needs a < b, got (%g, %g)", at->init_a, at->init_b);
}

static void declare_param(Elab *e, Scope *s, const Node *n) {
  void **declared = namemap_slot(e->a, &s->params, n->name);
  if (*declared) diag_error(e->d, n->loc, "parameter `%s` is already defined", n->name);
  *declared = (void *)n;
  Attr at = {0};
  read_dims(e, s, n, &at.shape);
  at.dtype = read_dtype(e, n, false);
  at.name = arena_printf(e->a, "%s%s", s->prefix, n->name);
  read_init(e, s, n->a, &at);
  void **named = namemap_slot(e->a, &e->param_names, at.name);
  if (*named) diag_error(e->d, n->loc, "parameter name `%s` collides with another parameter", at.name);
  Value *v = *named = graph_add(e->g, OP_PARAM, NULL, 0, &at, n->loc);
  EVal ev = {.kind = EV_TENSOR, .v = v, .loc = n->loc};
  bind(e, s, n->name, ev, n->loc, false);
}

static void exec_stmt(Elab *e, Scope *s, const Node *n, bool top) {
  switch (n->kind) {
  case N_CONST: {
    EVal v = eval(e, s, n->a);
    if (v.kind == EV_TENSOR) diag_error(e->d, n->a->loc, "const `%s` must be a number or string, not a tensor", n->name);
    bind(e, s, n->name, v, n->loc, true);
    break;
  }
  case N_ASSIGN: {
    EVal v = eval(e, s, n->a);
    bind(e, s, n->name, v, n->loc, false);
    break;
  }
  case N_DESTRUCT: {
    EVal v = eval(e, s, n->a);
    if (v.kind != EV_TUPLE || v.n_items != n->args.n)
      diag_error(e->d, n->a->loc, "%d names on the left, but the right side is %s%s", n->args.n,
                 v.kind == EV_TUPLE ? "a tuple of " : evkind_name(v.kind),
                 v.kind == EV_TUPLE ? arena_printf(e->a, "%d", v.n_items) : "");
    int i = 0;
    for (Node *x = n->args.head; x; x = x->next, i++) bind(e, s, x->name, v.items[i], x->loc, false);
    break;
  }
  case N_SECTION:
  case N_IMPORT:
    if (!top) diag_error(e->d, n->loc, "`%s` must be at the top level", n->kind == N_IMPORT ? "import" : n->name);
    break; /* read before the body */
  case N_PARAM:
    declare_param(e, s, n);
    break;
  case N_INPUT: {
    if (!top) diag_error(e->d, n->loc, "inputs must be declared at the top level, not inside a block");
    Attr at = {0};
    read_dims(e, s, n, &at.shape);
    at.dtype = read_dtype(e, n, true);
    at.name = n->name;
    if (lookup(s, n->name)) diag_error(e->d, n->loc, "`%s` is already defined", n->name);
    if (e->g->decode && at.shape.rank >= 2) { /* one token at a time */
      if (e->g->context && e->g->context != at.shape.dim[1])
        diag_error(e->d, n->loc, "generation needs every input's axis 1 to be the same context length");
      e->g->context = at.shape.dim[1];
      at.shape.dim[1] = 1;
    }
    Value *v = graph_add(e->g, OP_INPUT, NULL, 0, &at, n->loc);
    if (e->n_inputs == 8) diag_error(e->d, n->loc, "at most 8 inputs are supported");
    e->inputs[e->n_inputs++] = v;
    EVal ev = {.kind = EV_TENSOR, .v = v, .loc = n->loc};
    bind(e, s, n->name, ev, n->loc, false);
    break;
  }
  case N_BLOCK:
    if (!top) diag_error(e->d, n->loc, "blocks must be defined at the top level");
    {
      const Node *o = find_block(e, n->name);
      if (o != n) diag_error(e->d, n->loc, "block `%s` is already defined (first at line %d)", n->name, o->loc.line);
      NameMap args = {0};
      for (Node *p = n->args.head; p; p = p->next) {
        void **seen = namemap_slot(e->a, &args, p->name);
        if (*seen) diag_error(e->d, p->loc, "duplicate argument name `%s`", p->name);
        *seen = p;
      }
    }
    for (int i = 0; i < OP_COUNT; i++)
      if (op_info[i].surface && !strcmp(op_info[i].surface, n->name))
        diag_error(e->d, n->loc, "block `%s` has the name of a built-in op", n->name);
    for (size_t i = 0; i < sizeof functions / sizeof *functions; i++)
      if (!strcmp(functions[i], n->name))
        diag_error(e->d, n->loc, "block `%s` has the name of a built-in function", n->name);
    break;
  case N_TRAIN:
    if (!top) diag_error(e->d, n->loc, "the train section must be at the top level");
    break; /* read before the body, see read_train */
  default:
    unreachable();
  }
}

static EVal call_block(Elab *e, Scope *s, const Node *blk, const Node *call) {
  int n_par = blk->args.n, pos = 0;
  EVal *vals = arena_alloc(e->a, (size_t)(n_par + 1) * sizeof *vals);
  bool *set = arena_alloc(e->a, (size_t)(n_par + 1) * sizeof *set);
  for (Node *a = call->args.head; a; a = a->next) {
    int idx = -1;
    if (a->kind == N_NAMED) {
      int i = 0;
      for (Node *p = blk->args.head; p; p = p->next, i++)
        if (!strcmp(p->name, a->name)) idx = i;
      if (idx < 0) {
        Hint h = {0};
        for (Node *p = blk->args.head; p; p = p->next) hint_try(&h, a->name, p->name);
        diag_error(e->d, a->loc, "block `%s` has no argument named `%s`%s", blk->name, a->name, hint_text(e, &h));
      }
      if (set[idx]) diag_error(e->d, a->loc, "argument `%s` given twice", a->name);
      vals[idx] = eval(e, s, a->a);
    } else {
      if (pos >= n_par)
        diag_error(e->d, a->loc, "block `%s` takes %d argument%s, got %d", blk->name, n_par,
                   n_par == 1 ? "" : "s", call->args.n);
      idx = pos++;
      vals[idx] = eval(e, s, a);
    }
    set[idx] = true;
  }
  return invoke_block(e, s, blk, vals, set, call->loc, NULL);
}

/* Runs block blk with arguments vals (set[i]: given; others take their
 * defaults).  Parameters are named <prefix><block><count>. (the count of
 * calls of this block in this scope, after the arguments are evaluated, so
 * that in f(f(x)) the inner call, which runs first, is f1), or `prefix` when
 * given (repeat). */
static EVal invoke_block(Elab *e, Scope *s, const Node *blk, EVal *vals, bool *set, Loc call_loc,
                         const char *prefix) {
  for (Active *a = e->active; a; a = a->up)
    if (a->block == blk)
      diag_error(e->d, call_loc, "block `%s` calls itself (recursion is not allowed)", blk->name);
  if (++e->n_calls > MAX_BLOCK_CALLS)
    diag_error(e->d, call_loc, "more than %d block calls (blocks and repeat are expanded inline)", MAX_BLOCK_CALLS);
  const char *key = arena_printf(e->a, "%s%s", s->prefix, blk->name);
  int *calls = name_count(e->a, &e->counters, key);
  if (!prefix) ++*calls;
  Scope inner = {.parent = NULL, .prefix = prefix ? prefix : arena_printf(e->a, "%s%d.", key, *calls)};
  if (strlen(inner.prefix) > MAX_PREFIX)
    diag_error(e->d, call_loc, "block calls nested too deeply: parameter names would start with `%.40s...`, "
               "over %d characters", inner.prefix, MAX_PREFIX);
  /* the block sees the globals (top-level scope) and its own names */
  Scope *global = s;
  while (global->parent) global = global->parent;
  inner.parent = global;

  /* the values an outermost call adds form one block instance (Value.block:
   * the unit that activation recomputation keeps the inputs of) */
  bool outermost = !e->active;
  int first_value = e->g->n_values;
  Active act = {blk, e->active};
  e->active = &act;
  int i = 0;
  for (Node *p = blk->args.head; p; p = p->next, i++) {
    if (!set[i]) {
      if (p->kind != N_NAMED)
        diag_error(e->d, call_loc, "block `%s` is missing argument `%s`", blk->name, p->name);
      vals[i] = eval(e, &inner, p->a);
    }
    bind(e, &inner, p->name, vals[i], p->loc, false);
  }
  for (Node *st = blk->body.head; st; st = st->next) exec_stmt(e, &inner, st, false);
  EVal r = eval(e, &inner, blk->a);
  e->active = act.up;
  Graph *g = e->g;
  if (outermost) {
    int id = ++e->n_instances;
    for (int k = first_value; k < g->n_values; k++) {
      Value *v = g->values[k];
      if (v->op != OP_PARAM && v->op != OP_INPUT && v->op != OP_STATE) v->block = id;
    }
  }
  const EVal *first = r.kind == EV_TUPLE && r.n_items ? &r.items[0] : &r;
  if (first->kind == EV_TENSOR) {
    if (g->n_layers == g->cap_layers) {
      int cap = g->cap_layers ? 2 * g->cap_layers : 32;
      LayerInfo *nl = arena_alloc(e->a, (size_t)cap * sizeof *nl);
      if (g->n_layers) memcpy(nl, g->layers, (size_t)g->n_layers * sizeof *nl);
      g->layers = nl;
      g->cap_layers = cap;
    }
    int depth = 0;
    for (Active *a = e->active; a; a = a->up) depth++;
    const char *pfx = inner.prefix;
    g->layers[g->n_layers++] =
        (LayerInfo){arena_printf(e->a, "%.*s", (int)strlen(pfx) - 1, pfx), depth, first->v->shape, first->v->dtype};
  }
  return r;
}

/* --------------------------------------------------------------- train */

static bool is_ident(const Node *n, const char *name) {
  return n->kind == N_IDENT && !strcmp(n->name, name);
}

static void read_optimizer(Elab *e, Scope *s, const Node *v, TrainSpec *t) {
  if (v->kind != N_CALL && v->kind != N_IDENT)
    diag_error(e->d, v->loc, "optimizer must be adamw(...) or sgd(...)");
  if (!strcmp(v->name, "adamw")) {
    t->optimizer = OPTIM_ADAMW;
  } else if (!strcmp(v->name, "sgd")) {
    t->optimizer = OPTIM_SGD;
    if (!t->has_weight_decay) t->weight_decay = 0.0; /* torch.optim.SGD default */
  } else {
    Hint h = {0};
    hint_try(&h, v->name, "adamw");
    hint_try(&h, v->name, "sgd");
    diag_error(e->d, v->loc, "unknown optimizer `%s`; expected adamw or sgd%s", v->name, hint_text(e, &h));
  }
  if (v->kind != N_CALL) return;
  for (Node *a = v->args.head; a; a = a->next) {
    if (a->kind != N_NAMED)
      diag_error(e->d, a->loc, "optimizer arguments are named, as in adamw(lr = 1e-3)");
    for (Node *o = v->args.head; o != a; o = o->next)
      if (o->kind == N_NAMED && !strcmp(o->name, a->name))
        diag_error(e->d, a->loc, "%s argument `%s` is given twice", v->name, a->name);
    static const char *const keys[] = {"lr", "weight_decay", "momentum", "beta1", "beta2", "eps", "decay", "state"};
    bool known = false;
    for (int i = 0; i < 8; i++) known |= !strcmp(a->name, keys[i]);
    if (!known) {
      Hint h = {0};
      for (int i = 0; i < 8; i++) hint_try(&h, a->name, keys[i]);
      diag_error(e->d, a->loc, "%s has no argument named `%s`%s", v->name, a->name, hint_text(e, &h));
    }
    if (!strcmp(a->name, "state")) { /* AdamW's moments: f32, or 8-bit block-wise quantized */
      if (t->optimizer != OPTIM_ADAMW)
        diag_error(e->d, a->loc, "%s has no argument `state` (8-bit state is adamw's: state = int8)", v->name);
      if (!is_ident(a->a, "int8") && !is_ident(a->a, "f32"))
        diag_error(e->d, a->a->loc, "adamw state must be int8 or f32");
      t->state_int8 = is_ident(a->a, "int8");
      continue;
    }
    EVal x = eval(e, s, a->a);
    if (!strcmp(a->name, "decay")) { /* which params weight decay applies to */
      if (x.kind != EV_STR || (strcmp(x.str, "all") && strcmp(x.str, "matrices")))
        diag_error(e->d, x.loc, "decay must be \"all\" or \"matrices\" (params of rank 2 or more)");
      t->decay_matrices_only = !strcmp(x.str, "matrices");
      continue;
    }
    double num = want_num(e, x, a->name);
    if (!strcmp(a->name, "lr")) t->lr = num, t->has_lr = true;
    else if (!strcmp(a->name, "weight_decay")) t->weight_decay = num, t->has_weight_decay = true;
    else if (!strcmp(a->name, "momentum") && t->optimizer == OPTIM_SGD) t->momentum = num;
    else if (!strcmp(a->name, "beta1") && t->optimizer == OPTIM_ADAMW) t->beta1 = num;
    else if (!strcmp(a->name, "beta2") && t->optimizer == OPTIM_ADAMW) t->beta2 = num;
    else if (!strcmp(a->name, "eps") && t->optimizer == OPTIM_ADAMW) t->eps = num;
    else {
      if (!strcmp(a->name, "momentum") || !strcmp(a->name, "beta1") || !strcmp(a->name, "beta2") ||
          !strcmp(a->name, "eps"))
        diag_error(e->d, a->loc, "%s has no argument `%s` (it belongs to %s)", v->name, a->name,
                   t->optimizer == OPTIM_SGD ? "adamw" : "sgd");
      diag_error(e->d, a->loc, "%s has no argument named `%s`", v->name, a->name); /* not reached: keys above */
    }
    if (num < 0 || !isfinite(num)) diag_error(e->d, x.loc, "%s must be a non-negative number, got %g", a->name, num);
    if (!strcmp(a->name, "momentum") && num >= 1) diag_error(e->d, x.loc, "momentum must be in [0, 1), got %g", num);
  }
  if (t->beta1 >= 1 || t->beta2 >= 1) diag_error(e->d, v->loc, "adamw betas must be below 1");
}

/* lr_schedule = constant | constant(warmup = N) | cosine(warmup = N, min_lr = X)
 * | linear(warmup = N, min_lr = X): the rate of each step (duet_lr_at in
 * runtime/duet_rt.h); warmup and min_lr default to 0.  The checks that need
 * the run's length and lr (warm-up longer than the run, min_lr above lr)
 * are the runtime's, since --steps and --lr may change them. */
static void read_lr_schedule(Elab *e, Scope *s, const Node *v, TrainSpec *t) {
  static const char *const names[] = {"constant", "cosine", "linear"};
  int kind = 3;
  if (v->kind == N_CALL || v->kind == N_IDENT)
    for (kind = 0; kind < 3 && strcmp(names[kind], v->name); kind++) {}
  if (kind == 3) {
    Hint h = {0};
    for (int i = 0; (v->kind == N_CALL || v->kind == N_IDENT) && i < 3; i++) hint_try(&h, v->name, names[i]);
    diag_error(e->d, v->loc, "lr_schedule must be constant, cosine(warmup = N, min_lr = X) or linear(warmup = N, "
               "min_lr = X)%s", hint_text(e, &h));
  }
  t->lr_schedule = (LrSchedule)kind;
  if (v->kind != N_CALL) return;
  for (Node *a = v->args.head; a; a = a->next) {
    if (a->kind != N_NAMED) diag_error(e->d, a->loc, "lr_schedule arguments are named, as in cosine(warmup = 100)");
    for (Node *o = v->args.head; o != a; o = o->next)
      if (o->kind == N_NAMED && !strcmp(o->name, a->name))
        diag_error(e->d, a->loc, "%s argument `%s` is given twice", v->name, a->name);
    EVal x = eval(e, s, a->a);
    if (!strcmp(a->name, "warmup")) {
      t->warmup = want_int(e, x, "warmup", 0);
    } else if (!strcmp(a->name, "min_lr") && kind != LR_CONSTANT) {
      t->min_lr = want_num(e, x, "min_lr");
      if (!(t->min_lr >= 0) || !isfinite(t->min_lr))
        diag_error(e->d, x.loc, "min_lr must be a non-negative number, got %g", t->min_lr);
    } else {
      Hint h = {0};
      hint_try(&h, a->name, "warmup");
      if (kind != LR_CONSTANT) hint_try(&h, a->name, "min_lr");
      diag_error(e->d, a->loc, "%s has no argument named `%s` (%s)%s", v->name, a->name,
                 kind == LR_CONSTANT ? "it takes warmup" : "it takes warmup and min_lr", hint_text(e, &h));
    }
  }
}

static void read_train(Elab *e, Scope *s, const Node *n, TrainSpec *t) {
  for (Node *kv = n->body.head; kv; kv = kv->next) {
    const char *k = kv->name;
    for (Node *o = n->body.head; o != kv; o = o->next)
      if (!strcmp(o->name, k)) diag_error(e->d, kv->loc, "train key `%s` is set twice", k);
    const Node *v = kv->a;
    if (!strcmp(k, "data") && v->kind == N_CALL && (!strcmp(v->name, "text") || !strcmp(v->name, "tokens"))) {
      /* text("FILE", block = T): byte-level windows of T tokens; tokens("FILE", block = T): llm.c token files */
      static const char *const text_args[] = {"path", "block"};
      EVal a[2];
      bool given[2];
      bind_args(e, s, v, text_args, 2, 2, a, given);
      if (a[0].kind != EV_STR) diag_error(e->d, a[0].loc, "%s: the path must be a string", v->name);
      t->data = !strcmp(v->name, "text") ? DATA_TEXT : DATA_TOKENS;
      t->data_path = a[0].str;
      t->block = want_int(e, a[1], "block", 1);
    } else if (!strcmp(k, "data") && v->kind == N_CALL && !strcmp(v->name, "npy")) {
      /* npy("X", "Y", val_fraction = F | val_x = "VX", val_y = "VY"): NumPy arrays, samples on axis 0 */
      static const char *const npy_args[] = {"x", "y", "val_fraction", "val_x", "val_y"};
      EVal a[5];
      bool given[5];
      bind_args(e, s, v, npy_args, 5, 2, a, given);
      for (int i = 0; i < 5; i++)
        if (given[i] && i != 2 && a[i].kind != EV_STR)
          diag_error(e->d, a[i].loc, "npy: `%s` must be a string (a file path)", npy_args[i]);
      t->data = DATA_NPY;
      t->data_path = a[0].str;
      t->data_y = a[1].str;
      if (given[2]) {
        if (given[3] || given[4])
          diag_error(e->d, a[2].loc, "npy: give either val_fraction or val_x and val_y, not both");
        t->val_fraction = want_num(e, a[2], "val_fraction");
        if (!(t->val_fraction > 0 && t->val_fraction < 1))
          diag_error(e->d, a[2].loc, "npy: val_fraction must be between 0 and 1 (exclusive), got %g", t->val_fraction);
      }
      if (given[3] != given[4])
        diag_error(e->d, v->loc, "npy: val_x and val_y go together (the validation inputs and their targets)");
      if (given[3]) t->val_x = a[3].str, t->val_y = a[4].str;
    } else if (!strcmp(k, "data")) {
      if ((v->kind != N_CALL && v->kind != N_IDENT) || strcmp(v->name, "fashion_mnist"))
        diag_error(e->d, v->loc, "unknown data source; expected fashion_mnist(\"DIR\"), text(\"FILE\", block = T), "
                   "tokens(\"FILE\", block = T) or npy(\"X.npy\", \"Y.npy\")");
      t->data = DATA_FASHION_MNIST;
      t->data_path = "/usr/share/datasets/fashion-mnist";
      if (v->kind == N_CALL) { /* fashion_mnist("DIR", val_fraction = F) */
        static const char *const fm_args[] = {"dir", "val_fraction"};
        EVal a[2];
        bool given[2];
        bind_args(e, s, v, fm_args, 2, 0, a, given);
        if (given[0] && a[0].kind != EV_STR) diag_error(e->d, a[0].loc, "fashion_mnist: the directory must be a string");
        if (given[0]) t->data_path = a[0].str;
        if (given[1]) {
          t->val_fraction = want_num(e, a[1], "val_fraction");
          if (!(t->val_fraction > 0 && t->val_fraction < 1))
            diag_error(e->d, a[1].loc, "fashion_mnist: val_fraction must be between 0 and 1 (exclusive), got %g",
                       t->val_fraction);
        }
      }
    } else if (!strcmp(k, "optimizer")) {
      read_optimizer(e, s, v, t);
    } else if (!strcmp(k, "lr_schedule")) {
      read_lr_schedule(e, s, v, t);
    } else if (!strcmp(k, "eval")) {
      if (is_ident(v, "true")) t->eval = true;
      else if (is_ident(v, "false")) t->eval = false;
      else diag_error(e->d, v->loc, "eval must be true or false");
    } else {
      int known = 0;
      for (int i = 0; i < N_TRAIN_KEYS; i++) known |= !strcmp(train_keys[i], k);
      if (!known) {
        Hint h = {0};
        for (int i = 0; i < N_TRAIN_KEYS; i++) hint_try(&h, k, train_keys[i]);
        diag_error(e->d, kv->loc, "unknown train key `%s`%s", k, hint_text(e, &h));
      }
      EVal x = eval(e, s, v);
      if (!strcmp(k, "lr")) {
        t->lr = want_num(e, x, "lr"), t->has_lr = true;
        if (!(t->lr > 0) || !isfinite(t->lr)) diag_error(e->d, x.loc, "lr must be positive, got %g", t->lr);
      } else if (!strcmp(k, "weight_decay")) {
        t->weight_decay = want_num(e, x, "weight_decay"), t->has_weight_decay = true;
        if (t->weight_decay < 0) diag_error(e->d, x.loc, "weight_decay must be non-negative, got %g", t->weight_decay);
      } else if (!strcmp(k, "momentum")) {  /* train-section key; sgd(momentum =) is checked below */
        t->momentum = want_num(e, x, "momentum");
        if (t->momentum < 0 || t->momentum >= 1) diag_error(e->d, x.loc, "momentum must be in [0, 1), got %g", t->momentum);
      } else if (!strcmp(k, "batch")) t->batch = want_int(e, x, "batch", 1), e->batch_loc = x.loc;
      else if (!strcmp(k, "epochs")) t->epochs = want_int(e, x, "epochs", 1);
      else if (!strcmp(k, "steps")) t->steps = want_int(e, x, "steps", 1);
      else if (!strcmp(k, "seed")) t->seed = (uint64_t)want_int(e, x, "seed", 0);
      else if (!strcmp(k, "log_every")) t->log_every = want_int(e, x, "log_every", 1);
      else if (!strcmp(k, "eval_every")) t->eval_every = want_int(e, x, "eval_every", 1);
      else if (!strcmp(k, "eval_batches")) t->eval_batches = want_int(e, x, "eval_batches", 1);
      else if (!strcmp(k, "clip_grad_norm")) {
        t->clip_grad_norm = want_num(e, x, "clip_grad_norm");
        if (!(t->clip_grad_norm > 0) || !isfinite(t->clip_grad_norm))
          diag_error(e->d, x.loc, "clip_grad_norm must be a number > 0, got %g", t->clip_grad_norm);
      }
      else if (!strcmp(k, "precision")) { /* the command line's --precision wins */
        if (x.kind != EV_STR || (strcmp(x.str, "auto") && strcmp(x.str, "fp32") && strcmp(x.str, "fp16") &&
                                 strcmp(x.str, "bf16")))
          diag_error(e->d, x.loc, "precision must be \"auto\", \"fp32\", \"fp16\" or \"bf16\"");
        t->precision = x.str;
      } else if (!strcmp(k, "recompute")) { /* the command line's --recompute wins */
        if (x.kind != EV_STR || (strcmp(x.str, "none") && strcmp(x.str, "blocks") && strcmp(x.str, "auto")))
          diag_error(e->d, x.loc, "recompute must be \"none\", \"blocks\" or \"auto\"");
        t->recompute = x.str;
      } else if (!strcmp(k, "offload")) { /* the command line's --offload wins */
        if (x.kind != EV_STR || (strcmp(x.str, "none") && strcmp(x.str, "optimizer")))
          diag_error(e->d, x.loc, "offload must be \"none\" or \"optimizer\"");
        t->offload = x.str;
      }
    }
  }
}

/* eval { every = N  batches = N  enabled = true }: when and how much to
 * evaluate (text: validation loss every N steps over N fixed batches). */
static void read_eval(Elab *e, Scope *s, const Node *n, TrainSpec *t) {
  static const char *const keys[] = {"every", "batches", "enabled"};
  for (Node *kv = n->body.head; kv; kv = kv->next) {
    for (Node *o = n->body.head; o != kv; o = o->next)
      if (!strcmp(o->name, kv->name)) diag_error(e->d, kv->loc, "eval key `%s` is set twice", kv->name);
    EVal x = eval(e, s, kv->a);
    if (!strcmp(kv->name, "every")) t->eval_every = want_int(e, x, "every", 1);
    else if (!strcmp(kv->name, "batches")) t->eval_batches = want_int(e, x, "batches", 1);
    else if (!strcmp(kv->name, "enabled")) t->eval = want_bool(e, x, "enabled");
    else {
      Hint h = {0};
      for (int i = 0; i < 3; i++) hint_try(&h, kv->name, keys[i]);
      diag_error(e->d, kv->loc, "unknown eval key `%s`; keys are every, batches and enabled%s", kv->name,
                 hint_text(e, &h));
    }
  }
}

/* prune { sparsity = S  mode = "..."  start = N  end = N  every = N
 *         initial_sparsity = S  params = "GLOB, !GLOB" }: magnitude pruning
 * (passes/prune.c), each value checked here; the command line's --prune
 * flags override it field by field. */
static void read_prune(Elab *e, Scope *s, const Node *n, PruneSpec *p) {
  static const char *const keys[] = {"sparsity", "mode", "start", "end", "every", "initial_sparsity", "params"};
  static const unsigned bits[] = {PRUNE_SET_SPARSITY, PRUNE_SET_MODE, PRUNE_SET_START, PRUNE_SET_END,
                                  PRUNE_SET_EVERY, PRUNE_SET_INITIAL, PRUNE_SET_PARAMS};
  p->mode = PRUNE_UNSTRUCTURED;
  p->loc = n->loc;
  for (Node *kv = n->body.head; kv; kv = kv->next) {
    for (Node *o = n->body.head; o != kv; o = o->next)
      if (!strcmp(o->name, kv->name)) diag_error(e->d, kv->loc, "prune key `%s` is set twice", kv->name);
    int k = 0;
    while (k < 7 && strcmp(keys[k], kv->name)) k++;
    if (k == 7) {
      Hint h = {0};
      for (int i = 0; i < 7; i++) hint_try(&h, kv->name, keys[i]);
      diag_error(e->d, kv->loc, "unknown prune key `%s`; keys are sparsity, mode, start, end, every, initial_sparsity "
                 "and params%s", kv->name, hint_text(e, &h));
    }
    EVal x = eval(e, s, kv->a);
    p->set |= bits[k];
    if (k == 0 || k == 5) {
      double v = want_num(e, x, kv->name);
      if (!(v >= 0 && v < 1))
        diag_error(e->d, x.loc, "prune %s must be in [0, 1), got %s", k ? "initial_sparsity" : "sparsity",
                   ir_num_str(v, (char[32]){0}, 32));
      *(k ? &p->initial : &p->sparsity) = v;
    } else if (k == 1 || k == 6) {
      if (x.kind != EV_STR)
        diag_error(e->d, x.loc, k == 1 ? "prune mode must be a string: \"unstructured\", \"global\", \"channels\" "
                   "or N:M such as \"2:4\"" : "prune params must be a string of patterns such as \"*.w, !head.w\"");
      int nm_a, nm_b, nm_used = 0;
      if (k == 6) {
        p->params = x.str;
      } else if (x.kind == EV_STR && prune_mode_parse(x.str, &p->mode, &p->nm_n, &p->nm_m) &&
                 sscanf(x.str, "%d:%d%n", &nm_a, &nm_b, &nm_used) == 2 && !x.str[nm_used] && nm_a >= nm_b &&
                 nm_a >= 1 && nm_b <= 64) { /* as --prune-mode (passes/prune.c) */
        diag_error(e->d, x.loc, "prune mode `%s`: N must be less than M (N:M keeps N of every M weights, such as 2:4)",
                   x.str);
      } else if (prune_mode_parse(x.str, &p->mode, &p->nm_n, &p->nm_m)) {
        Hint h = {0};
        const char *modes[] = {"unstructured", "global", "channels", "2:4"};
        for (int i = 0; i < 4; i++) hint_try(&h, x.str, modes[i]);
        diag_error(e->d, x.loc, "unknown prune mode `%s`; modes are unstructured, global, channels and N:M such as "
                   "2:4%s", x.str, hint_text(e, &h));
      }
    } else {
      int64_t v = want_int(e, x, kv->name, k == 4 ? 1 : 0);
      if (v > INT64_MAX / 4) /* as the IR parser reads it back */
        diag_error(e->d, x.loc, "prune %s is out of range: %lld steps (the limit is 2^61 - 1)", kv->name, (long long)v);
      *(k == 2 ? &p->start : k == 3 ? &p->end : &p->every) = v;
    }
  }
}

/* quantize { weights = int8  mode = qat  granularity = channel|tensor }:
 * quantization-aware training (passes/quantize.c, pass_qat); int8 weights
 * per output channel by default.  Post-training quantization is not a
 * section: it is --quantize int8 on duet run --eval-only. */
static void read_quantize(Elab *e, const Node *n, Graph *g) {
  static const char *const keys[] = {"weights", "mode", "granularity"};
  bool qat = false;
  g->qat = 1; /* QUANT_INT8_CHANNEL */
  g->qat_loc = n->loc;
  for (Node *kv = n->body.head; kv; kv = kv->next) {
    for (Node *o = n->body.head; o != kv; o = o->next)
      if (!strcmp(o->name, kv->name)) diag_error(e->d, kv->loc, "quantize key `%s` is set twice", kv->name);
    int k = 0;
    while (k < 3 && strcmp(keys[k], kv->name)) k++;
    if (k == 3) {
      Hint h = {0};
      for (int i = 0; i < 3; i++) hint_try(&h, kv->name, keys[i]);
      diag_error(e->d, kv->loc, "unknown quantize key `%s`; keys are weights, mode and granularity%s", kv->name,
                 hint_text(e, &h));
    }
    if (k == 0 && !is_ident(kv->a, "int8"))
      diag_error(e->d, kv->a->loc, "quantize weights must be int8");
    if (k == 1 && !is_ident(kv->a, "qat"))
      diag_error(e->d, kv->a->loc, "quantize mode must be qat (quantization-aware training); post-training "
                 "quantization of a trained checkpoint is duet run --eval-only --checkpoint CK --quantize int8");
    if (k == 2 && !is_ident(kv->a, "channel") && !is_ident(kv->a, "tensor"))
      diag_error(e->d, kv->a->loc, "quantize granularity must be channel or tensor");
    if (k == 1) qat = true;
    if (k == 2) g->qat = is_ident(kv->a, "tensor") ? 2 : 1; /* QUANT_INT8_TENSOR : QUANT_INT8_CHANNEL */
  }
  if (!qat)
    diag_error(e->d, n->loc, "the quantize section needs mode = qat (quantization-aware training); post-training "
               "quantization of a trained checkpoint is duet run --eval-only --checkpoint CK --quantize int8");
}

static void check_data_inputs(Elab *e, Loc model_loc) {
  TrainSpec *t = &e->g->train;
  char b[160];
  if (t->data == DATA_TEXT || t->data == DATA_TOKENS) {
    const char *src = t->data == DATA_TEXT ? "text" : "tokens";
    if (e->n_inputs != 2)
      diag_error(e->d, e->n_inputs ? e->inputs[0]->loc : model_loc,
                 "%s feeds two inputs (tokens and next tokens, i32[batch,%lld]); the model declares %d", src,
                 (long long)t->block, e->n_inputs);
    for (int i = 0; i < 2; i++) {
      Value *x = e->inputs[i];
      if (x->dtype != DT_I32 || x->shape.rank != 2 || x->shape.dim[0] != t->batch || x->shape.dim[1] != t->block)
        diag_error(e->d, x->loc, "%s windows are i32[%lld,%lld] (batch, block); `%s` is %s%s", src, (long long)t->batch,
                   (long long)t->block, x->attr.name, dtype_name(x->dtype), shape_str(&x->shape, b, sizeof b));
    }
    return;
  }
  if (t->data == DATA_NPY) {
    if (e->n_inputs != 2)
      diag_error(e->d, e->n_inputs ? e->inputs[0]->loc : model_loc,
                 "npy feeds two inputs (the samples of x.npy and of y.npy); the model declares %d", e->n_inputs);
    for (int i = 0; i < 2; i++) {
      Value *x = e->inputs[i];
      if ((x->dtype != DT_F32 && x->dtype != DT_I32) || x->shape.rank < 1 || x->shape.dim[0] != t->batch)
        diag_error(e->d, x->loc, "npy feeds f32 or i32 inputs [%lld, ...] (batch first); `%s` is %s%s",
                   (long long)t->batch, x->attr.name, dtype_name(x->dtype), shape_str(&x->shape, b, sizeof b));
    }
    return;
  }
  if (t->data != DATA_FASHION_MNIST) return;
  if (e->n_inputs != 2)
    diag_error(e->d, e->n_inputs ? e->inputs[0]->loc : model_loc,
               "fashion_mnist feeds two inputs (images f32[batch,784] and labels i32[batch]); "
               "the model declares %d", e->n_inputs);
  Value *x = e->inputs[0], *y = e->inputs[1];
  int64_t nx = shape_numel(&x->shape);
  if (!dtype_is_float(x->dtype) || x->shape.rank < 2 || x->shape.dim[0] != t->batch ||
      nx / x->shape.dim[0] != 784)
    diag_error(e->d, x->loc, "fashion_mnist images are f32[%lld,784] (batch, 28*28 pixels); `%s` is %s%s",
               (long long)t->batch, x->attr.name, dtype_name(x->dtype), shape_str(&x->shape, b, sizeof b));
  if (y->dtype != DT_I32 || y->shape.rank != 1 || y->shape.dim[0] != t->batch)
    diag_error(e->d, y->loc, "fashion_mnist labels are i32[%lld]; `%s` is %s%s", (long long)t->batch,
               y->attr.name, dtype_name(y->dtype), shape_str(&y->shape, b, sizeof b));
}

/* -------------------------------------------------------------- imports */

typedef struct ImportFrame {
  const char *real; /* realpath of the file being imported */
  struct ImportFrame *up;
} ImportFrame;

/* Appends to *out the blocks and consts of the files that `stmts` import
 * (recursively, imported files' own imports first), with paths relative to
 * the importing file.  Import cycles and other statements are errors. */
static void gather_imports(Elab *e, const Source *from, List stmts, ImportFrame *up, List *out) {
  for (Node *st = stmts.head; st; st = st->next) {
    if (st->kind != N_IMPORT) continue;
    char path[4096];
    const char *slash = strrchr(from->name, '/');
    if (st->str[0] == '/' || !slash) snprintf(path, sizeof path, "%s", st->str);
    else snprintf(path, sizeof path, "%.*s/%s", (int)(slash - from->name), from->name, st->str);
    char real[4096];
    if (!realpath(path, real))
      diag_error(e->d, st->loc, "cannot import \"%s\": %s (paths are relative to the importing file)", st->str,
                 strerror(errno));
    for (ImportFrame *f = up; f; f = f->up)
      if (!strcmp(f->real, real)) diag_error(e->d, st->loc, "import cycle: \"%s\" is already being imported by a file that imports this one", st->str);
    if (namemap_get(&e->imported, real)) goto next; /* imported twice (a diamond): once is enough */
    Source *src = frontend_read_file(e->a, e->d, path);
    if (!src) diag_error(e->d, st->loc, "cannot import \"%s\"", st->str);
    ParseCtx cx = {.arena = e->a, .diag = e->d, .src = src};
    jmp_buf *saved = e->d->jmp;
    if (frontend_parse_source(&cx)) {
      e->d->jmp = saved;
      diag_error(e->d, st->loc, "in the file imported here");
    }
    ImportFrame frame = {arena_strdup(e->a, real), up};
    gather_imports(e, src, cx.stmts, &frame, out);
    Node *mark = ast_new(&cx, N_IMPORT, st->loc); /* remembers the file (real path) */
    mark->str = frame.real;
    *out = list_push(*out, mark);
    *namemap_slot(e->a, &e->imported, frame.real) = mark;
    for (Node *x = cx.stmts.head, *nx; x; x = nx) {
      nx = x->next;
      if (x->kind == N_IMPORT) continue;
      if (x->kind != N_BLOCK && x->kind != N_CONST)
        diag_error(e->d, x->loc, "an imported file may define only blocks and consts");
      x->next = NULL;
      *out = list_push(*out, x);
    }
  next:;
  }
}

/* ---------------------------------------------------------------- entry */

Source *frontend_read_file(Arena *a, Diag *d, const char *path) {
  Source *src = arena_alloc(a, sizeof *src);
  src->name = arena_strdup(a, path);
  Loc file_loc = {src, 0, 0};
  jmp_buf *saved = d->jmp;
  d->jmp = NULL;
  struct stat fst;
  if (!stat(path, &fst) && S_ISDIR(fst.st_mode)) {
    diag_error(d, file_loc, "this is a directory, not a .model file");
    d->jmp = saved;
    return NULL;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    diag_error(d, file_loc, "cannot open file: %s", strerror(errno));
    d->jmp = saved;
    return NULL;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap + 1);
  size_t got;
  while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap) {
      char *nb = cap > ((size_t)1 << 30) ? NULL : realloc(buf, 2 * cap + 1);
      if (!nb) { free(buf); buf = NULL; break; }
      buf = nb;
      cap *= 2;
    }
  }
  int read_err = ferror(f);
  fclose(f);
  Source *ret = NULL;
  if (!buf) {
    diag_error(d, file_loc, "file is too large (over 1 GiB)");
  } else if (read_err) {
    diag_error(d, file_loc, "cannot read file");
  } else {
    size_t off = len >= 3 && (unsigned char)buf[0] == 0xEF && (unsigned char)buf[1] == 0xBB &&
                 (unsigned char)buf[2] == 0xBF ? 3 : 0;
    if (memchr(buf, 0, len)) {
      diag_error(d, file_loc, "this is a binary file (it contains NUL bytes), not a .model source");
    } else if (strspn(buf + off, " \t\r\n") == len - off) {
      diag_error(d, file_loc, "file is empty: a model starts with `model NAME`");
    } else {
      char *text = arena_alloc(a, len - off + 1);
      memcpy(text, buf + off, len - off);
      src->text = text;
      src->len = len - off;
      ret = src;
    }
  }
  free(buf);
  d->jmp = saved;
  return ret;
}

/* frontend_compile's work, under the caller's setjmp: a diagnostic's
 * longjmp leaves it (none of its locals is used afterwards, so none can
 * be clobbered). */
static Graph *compile_source(Arena *a, Diag *d, const Source *src, const FrontendOptions *opt) {
  ParseCtx cx = {.arena = a, .diag = d, .src = src};
  Graph *g = NULL;
  if (frontend_parse_source(&cx)) return NULL;
  Elab e = {.a = a, .d = d, .stmts = cx.stmts};
  {
    /* imported blocks and consts come first, then the file's own */
    List imported = {0};
    char real[4096];
    ImportFrame top = {realpath(src->name, real) ? arena_strdup(a, real) : src->name, NULL};
    gather_imports(&e, src, cx.stmts, &top, &imported);
    if (imported.head) {
      List all = {0};
      for (Node *x = imported.head, *nx; x; x = nx) {
        nx = x->next;
        x->next = NULL;
        if (x->kind != N_IMPORT) all = list_push(all, x);
      }
      for (Node *x = cx.stmts.head, *nx; x; x = nx) {
        nx = x->next;
        x->next = NULL;
        all = list_push(all, x);
      }
      e.stmts = cx.stmts = all;
    }
  }
  for (Node *st = cx.stmts.head; st; st = st->next)
    if (st->kind == N_BLOCK) {
      void **first = namemap_slot(a, &e.blocks, st->name);
      if (!*first) *first = st;
    }
  g = graph_new(a, d);
  e.g = g;
  g->model_name = cx.model_name;
  if (opt && opt->float_dtype != DT_VOID) g->float_dtype = opt->float_dtype;
  if (opt) g->decode = opt->decode;
  Scope global = {.prefix = ""};
  EVal tv = {.kind = EV_NUM, .num = 1, .is_int = true, .loc = cx.model_loc}, fv = tv;
  fv.num = 0;
  bind(&e, &global, "true", tv, cx.model_loc, true);
  bind(&e, &global, "false", fv, cx.model_loc, true);
  /* consts first (they are numbers and strings, and the train section may
   * use them), then the train section (it binds `batch`), then the rest */
  for (Node *st = cx.stmts.head; st; st = st->next)
    if (st->kind == N_CONST) exec_stmt(&e, &global, st, true);
  int n_train = 0, n_eval = 0, n_prune = 0, n_quant = 0;
  for (Node *st = cx.stmts.head; st; st = st->next)
    if (st->kind == N_TRAIN) {
      if (n_train++) diag_error(d, st->loc, "only one train section is allowed");
      read_train(&e, &global, st, &g->train);
    }
  for (Node *st = cx.stmts.head; st; st = st->next)
    if (st->kind == N_SECTION) {
      if (!strcmp(st->name, "prune")) {
        if (n_prune++) diag_error(d, st->loc, "only one prune section is allowed");
        read_prune(&e, &global, st, &g->prune);
        continue;
      }
      if (!strcmp(st->name, "quantize")) {
        if (n_quant++) diag_error(d, st->loc, "only one quantize section is allowed");
        read_quantize(&e, st, g);
        continue;
      }
      if (strcmp(st->name, "eval")) {
        Hint h = {0};
        hint_try(&h, st->name, "eval");
        hint_try(&h, st->name, "prune");
        hint_try(&h, st->name, "quantize");
        diag_error(d, st->loc, "unknown section `%s`; sections are `train { }`, `eval { }`, `prune { }` and "
                   "`quantize { }`%s",
                   st->name, hint_text(&e, &h));
      }
      if (n_eval++) diag_error(d, st->loc, "only one eval section is allowed");
      read_eval(&e, &global, st, &g->train);
    }
  if (opt && opt->batch > 0) g->train.batch = opt->batch;
  /* data parallelism: R replicas, each M micro-batches, R x M micro-batches
   * of one global batch in all (replica r computes r*M .. r*M+M-1) */
  long long R = opt && opt->replicas > 1 ? (long long)opt->replicas : 1;
  long long Ml = opt && opt->micro_batches > 1 ? (long long)opt->micro_batches : 1;
  if (R * Ml > 1) { /* `batch` names one micro-batch from here on */
    long long B = (long long)g->train.batch, M = R * Ml;
    char by[160];
    bool ranks = opt->mpi_ranks && R > 1;
    if (R == 1) snprintf(by, sizeof by, "--micro-batches %lld", M);
    else if (ranks && Ml == 1) snprintf(by, sizeof by, "the %lld MPI ranks (each rank is one replica: they split each "
                                        "global batch)", R);
    else if (ranks) snprintf(by, sizeof by, "the %lld MPI ranks x --micro-batches %lld = %lld (the ranks' "
                             "micro-batches split each global batch)", R, Ml, M);
    else if (Ml == 1) snprintf(by, sizeof by, "--data-parallel %lld (the replicas split each global batch)", R);
    else snprintf(by, sizeof by, "--data-parallel %lld x --micro-batches %lld = %lld (the replicas' micro-batches split "
                  "each global batch)", R, Ml, M);
    if (B % M) { /* point at where the batch was set */
      if (opt->batch > 0) diag_error_noloc(d, "--batch %lld is not a multiple of %s", B, by);
      else if (ranks && e.batch_loc.line > 0) /* each rank: "duet: rank N: error: ..." (a line that starts "duet: ") */
        diag_error_noloc(d, "batch %lld (%s:%d) is not a multiple of %s", B, src->name, e.batch_loc.line, by);
      else if (ranks)
        diag_error_noloc(d, "the default batch %lld is not a multiple of %s (no `batch = N` in the train section: set "
                         "one, or use --batch)", B, by);
      else if (e.batch_loc.line > 0) diag_error(d, e.batch_loc, "batch %lld is not a multiple of %s", B, by);
      else diag_error(d, (Loc){src, 0, 0}, "the default batch %lld is not a multiple of %s (no `batch = N` in the "
                      "train section: set one, or use --batch)", B, by);
    }
    g->train.batch /= M;
    g->train.micro_batches = M;
    g->replicas = (int)R;
  }
  EVal bv = {.kind = EV_NUM, .num = (double)g->train.batch, .is_int = true, .loc = cx.model_loc};
  bind(&e, &global, "batch", bv, cx.model_loc, true);
  for (Node *st = cx.stmts.head; st; st = st->next)
    if (st->kind != N_CONST) exec_stmt(&e, &global, st, true);

  Binding *lb = namemap_get(&global.index, "loss");
  if (!lb)
    diag_error(d, cx.model_loc, "model `%s` defines no `loss`: assign the training objective to `loss`",
               cx.model_name);
  if (lb->val.kind != EV_TENSOR || lb->val.v->shape.rank != 0) {
    char b[160];
    diag_error(d, lb->loc, "`loss` must be a scalar tensor, got %s",
               lb->val.kind == EV_TENSOR ? shape_str(&lb->val.v->shape, b, sizeof b) : evkind_name(lb->val.kind));
  }
  g->loss = lb->val.v;
  /* evaluation reports the loss's cross_entropy term: the loss itself, or
   * its only cross_entropy (as with an added regulariser) */
  Value *ce = g->loss->op == OP_CROSS_ENTROPY ? g->loss : NULL;
  int n_ce = 0;
  for (int i = 0; i < g->n_values && !ce; i++)
    if (g->values[i]->op == OP_CROSS_ENTROPY) n_ce++;
  for (int i = 0; i < g->n_values && !ce && n_ce == 1; i++)
    if (g->values[i]->op == OP_CROSS_ENTROPY) ce = g->values[i];
  if (ce) {
    g->logits = ce->in[0];
    g->labels = ce->in[1];
  } else if (g->train.data != DATA_NONE && g->train.eval) {
    diag_warning(d, lb->loc, "the loss has %s cross_entropy term, so there is no accuracy to evaluate; "
                 "set `eval = false` in the train section", n_ce ? "more than one" : "no");
  }
  if (!g->decode) check_data_inputs(&e, cx.model_loc);
  return g;
}

Graph *frontend_compile(Arena *a, Diag *d, const Source *src, const FrontendOptions *opt) {
  jmp_buf jb, *saved = d->jmp;
  Graph *volatile g = NULL;
  d->jmp = &jb;
  if (!setjmp(jb)) g = compile_source(a, d, src, opt);
  d->jmp = saved;
  return g;
}
