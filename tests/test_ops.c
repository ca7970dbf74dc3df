/* tests/test_ops.c: the forward values of the ops of issue 19 (exp, log,
 * tanh, sigmoid, silu, softmax, rmsnorm, mse_loss, rope, grouped-query
 * attention), computed by the generated C kernels in f32 and f64, against
 * independent references computed here in double from the definitions
 * (test_gradcheck checks the gradients against finite differences of
 * these forwards; this test checks the forwards themselves):
 *
 *  - the elementwise ops on 27 points, among them 0, +-1e-30, +-20, +-88,
 *    +-100, +-1000, +-inf and NaN: NaN and the same infinity where the
 *    definition gives them (log 0 = -inf, log of a negative = NaN, as C's;
 *    silu(-inf) = -inf * 0 = NaN, as PyTorch's x * sigmoid(x)), else
 *    within 4 ulps (f32: rtol 5e-7; f64: 1e-15) plus two subnormal steps
 *    (sigmoid(-100) ~ 3.7e-44 is an f32 subnormal) times 1 + |x|; and
 *    their gradients at the same points (finite where the derivative is:
 *    sigmoid', tanh' and silu' at +-1000 are 0, not NaN), rtol 2e-6 (f32)
 *    / 1e-14, tanh' = 1 - y^2 and sigmoid' = y (1 - y) (from the output,
 *    as PyTorch's) within 8 u absolutely;
 *  - softmax along each axis of [3,4,5], and rows of 1e4 + k (exp without
 *    the maximum subtracted overflows), with -inf (masked: probability 0)
 *    and all equal;
 *  - rmsnorm x / sqrt(mean(x^2) + eps) * w, an all-zero row giving 0;
 *  - mse_loss, the mean of (pred - target)^2;
 *  - rope on [2,5,8] with 2 heads (D = 4) and with 1 head (D = 8), bases
 *    10000 and 100, at decoding positions 0 and 7: y_2i = x_2i cos(p f_i)
 *    - x_2i+1 sin(p f_i), y_2i+1 = x_2i sin + x_2i+1 cos, f_i =
 *    base^(-2i/D), p = position + t (the pairs (2i, 2i+1) of each head);
 *  - attention with 4 query heads and 2 key/value heads against the same
 *    attention with k and v repeated per group (key/value head g serves
 *    query heads 2g, 2g+1, as Meta's LLaMA repeat_kv): outputs and every
 *    gradient (the repeated model sums its copies' gradients through
 *    concat), causal and not, f32 rtol 1e-5 normwise, f64 1e-12.
 * A forward value y is read as the gradient of a param r in sum(y * r):
 * d/dr = y, exactly (the memory plan reuses the bytes of y itself once its
 * last reader has run).  Each check was seen to fail with the op broken
 * (README, "Ops of issue 19"). */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static int fails;

/* The n-th value (in graph order) of op `op`, or NULL. */
static Value *find_op(const TModel *t, OpKind op, int nth) {
  for (int i = 0; i < t->g->n_values; i++)
    if (t->g->values[i]->op == op && nth-- == 0) return t->g->values[i];
  return NULL;
}

static Value *find_input(const TModel *t, const char *name) {
  for (int i = 0; i < t->g->n_values; i++) {
    Value *v = t->g->values[i];
    if ((v->op == OP_INPUT || v->op == OP_PARAM) && !strcmp(v->attr.name, name)) return v;
  }
  return NULL;
}

static double get(const TModel *t, const Value *v, int64_t j) {
  const void *p = duet_session_tensor(t->s, tmodel_tensor(t, v));
  return v->dtype == DT_F64 ? ((const double *)p)[j] : ((const float *)p)[j];
}

static void set(TModel *t, const Value *v, int64_t j, double x) {
  void *p = duet_session_tensor(t->s, tmodel_tensor(t, v));
  if (v->dtype == DT_F64) ((double *)p)[j] = x;
  else ((float *)p)[j] = (float)x;
}

/* got against want: the same NaN-ness, the same infinity, or within atol +
 * rtol |want|. */
static void expect(const char *what, double got, double want, double atol, double rtol) {
  if ((got != got && want != want) || (isinf(want) && got == want)) return;
  if (want != want || got != got || !close_enough(got, want, atol, rtol)) {
    fprintf(stderr, "FAIL %s: got %.17g, want %.17g\n", what, got, want);
    fails++;
  }
}

static int run(TModel *t) {
  if (duet_session_run(t->s, DUET_RUN_GRAD)) {
    fprintf(stderr, "FAIL %s: run: %s\n", t->g->model_name, duet_session_error(t->s));
    fails++;
    return -1;
  }
  return 0;
}

static double ref_sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

/* ------------------------------------------------------------ elementwise */

static const double points[] = {0,     -0.0,  1e-30, -1e-30, 0.5,  -0.5,  1,    -1,   3,   -3,  20,   -20,  88,  -88,
                                100,   -100,  1000,  -1000,  0.75, -2.5,  7.25, 1e-7, -40, 40,  INFINITY, -INFINITY, NAN};
#define NP ((int)(sizeof points / sizeof points[0]))

static void elementwise(DType dt) {
  static const char *const ops[] = {"exp", "log", "tanh", "sigmoid", "silu"};
  static const OpKind kinds[] = {OP_EXP, OP_LOG, OP_TANH, OP_SIGMOID, OP_SILU};
  const char *tag = dt == DT_F64 ? "f64" : "f32";
  double rtol = dt == DT_F64 ? 1e-15 : 5e-7, atol = dt == DT_F64 ? 1e-300 : 3e-45;
  double grtol = dt == DT_F64 ? 1e-14 : 2e-6;
  for (int o = 0; o < 5; o++) {
    /* op(x) is d loss / d r, op'(p) d loss / d p */
    char src[512];
    snprintf(src, sizeof src, "model ew\ninput x: f32[%d]\nparam p: [%d]\nparam r: [%d]\n"
                              "loss = sum(%s(x) * r) + sum(%s(p))\n", NP, NP, NP, ops[o], ops[o]);
    TModel t;
    if (tmodel_open(&t, ops[o], src, dt)) {
      fails++;
      continue;
    }
    Value *x = find_input(&t, "x"), *p = find_input(&t, "p"), *r = find_input(&t, "r");
    if (!x || !p || !r || !p->grad || !r->grad || !find_op(&t, kinds[o], 0)) {
      fprintf(stderr, "FAIL %s %s: values not found\n", ops[o], tag);
      fails++;
      tmodel_close(&t);
      continue;
    }
    const Value *y = r->grad;
    for (int j = 0; j < NP; j++) set(&t, x, j, points[j]), set(&t, p, j, points[j]), set(&t, r, j, 1);
    if (run(&t)) {
      tmodel_close(&t);
      continue;
    }
    int before = fails;
    for (int j = 0; j < NP; j++) {
      /* the point as the kernel reads it (rounded to the dtype) */
      double a = dt == DT_F64 ? points[j] : (double)(float)points[j], want, dwant;
      double s = ref_sigmoid(a);
      switch (kinds[o]) {
      case OP_EXP: want = exp(a), dwant = want; break;
      case OP_LOG: want = log(a), dwant = 1 / a; break;
      case OP_TANH: want = tanh(a), dwant = 1 - want * want; break;
      case OP_SIGMOID: want = s, dwant = s * (1 - s); break;
      default: want = a * s, dwant = s * (1 + a * (1 - s)); break;
      }
      if (dt == DT_F32) want = (float)want, dwant = (float)dwant; /* overflow to inf, underflow as f32 */
      char what[160];
      snprintf(what, sizeof what, "%s(%g) %s", ops[o], a, tag);
      /* a subnormal result (sigmoid(-100)) carries its absolute rounding, times |x| in silu */
      expect(what, get(&t, y, j), want, atol * (1 + fabs(a)), rtol);
      snprintf(what, sizeof what, "d %s(x) / dx at %g %s", ops[o], a, tag);
      /* where the derivative is finite, the gradient is finite: e.g. 0 at +-1000 */
      double g = get(&t, p->grad, j);
      if (isfinite(dwant) && !isfinite(g)) {
        fprintf(stderr, "FAIL %s: got %g, want %.17g\n", what, g, dwant);
        fails++;
      } else if (isfinite(a) && a != 0 && fabs(a) > 1e-20) {
        /* tanh' and sigmoid' come from the output, as PyTorch's (1 - y^2,
         * y (1 - y)): within a few ulps of 1 absolutely (at 20 in f32,
         * sigmoid(x) rounds to 1 and the gradient to 0, true 2e-9) */
        bool from_y = kinds[o] == OP_TANH || kinds[o] == OP_SIGMOID;
        double ga = from_y ? 8 * (dt == DT_F64 ? 0x1p-53 : 0x1p-24) : atol * (1 + fabs(a));
        expect(what, g, dwant, ga, grtol);
      }
    }
    printf("%s %s %s: %d points and gradients\n", fails > before ? "FAIL" : "ok", ops[o], tag, NP);
    tmodel_close(&t);
  }
}

/* ---------------------------------------------------------------- softmax */

static void softmax(DType dt) {
  const char *tag = dt == DT_F64 ? "f64" : "f32";
  double rtol = dt == DT_F64 ? 1e-14 : 2e-6;
  for (int axis = 0; axis < 3; axis++) {
    char src[256];
    snprintf(src, sizeof src, "model sm\ninput x: f32[3,4,5]\nparam r: [3,4,5]\nloss = sum(softmax(x, axis = %d) * r)\n",
             axis);
    TModel t;
    if (tmodel_open(&t, "softmax", src, dt)) {
      fails++;
      continue;
    }
    Value *x = find_input(&t, "x"), *r = find_input(&t, "r"), *y = r ? r->grad : NULL;
    DuetRng rng;
    duet_rng_seed(&rng, 7, (uint64_t)axis);
    int dims[3] = {3, 4, 5};
    double xs[60];
    for (int j = 0; j < 60; j++) set(&t, x, j, xs[j] = 3 * duet_rng_normal(&rng));
    /* row (0, 0, :) of the last axis: large values, a masked entry, all equal */
    if (axis == 2) {
      double row0[5] = {1e4, 1e4 + 1, 1e4 - 2, -INFINITY, 1e4 + 0.5}, row1[5] = {2, 2, 2, 2, 2};
      for (int j = 0; j < 5; j++) set(&t, x, j, xs[j] = row0[j]), set(&t, x, 5 + j, xs[5 + j] = row1[j]);
    }
    if (dt == DT_F32)
      for (int j = 0; j < 60; j++) xs[j] = (float)xs[j];
    if (!x || !y || run(&t)) {
      fails++;
      tmodel_close(&t);
      continue;
    }
    int before = fails, stride = axis == 0 ? 20 : axis == 1 ? 5 : 1, len = dims[axis];
    for (int j = 0; j < 60; j++) {
      /* the column through j along the axis */
      int base = j - (j / stride % len) * stride;
      double m = -INFINITY, sum = 0;
      for (int r = 0; r < len; r++) m = fmax(m, xs[base + r * stride]);
      for (int r = 0; r < len; r++) sum += exp(xs[base + r * stride] - m);
      char what[96];
      snprintf(what, sizeof what, "softmax axis %d [%d] %s", axis, j, tag);
      expect(what, get(&t, y, j), exp(xs[j] - m) / sum, 1e-300, rtol);
    }
    printf("%s softmax axis %d %s: 60 probabilities (rows of 1e4, -inf, all equal)\n", fails > before ? "FAIL" : "ok",
           axis, tag);
    tmodel_close(&t);
  }
}

/* ---------------------------------------------------- rmsnorm, mse_loss */

static void rmsnorm_mse(DType dt) {
  const char *tag = dt == DT_F64 ? "f64" : "f32";
  double rtol = dt == DT_F64 ? 1e-14 : 2e-6;
  const char *src = "model rn\ninput x: f32[3,6]\nparam w: [6]\nparam r: [3,6]\ninput t: f32[3,6]\n"
                    "y = rmsnorm(x, w, eps = 0.01)\nloss = sum(y * r) + mse_loss(y, t)\n";
  TModel t;
  if (tmodel_open(&t, "rmsnorm", src, dt)) {
    fails++;
    return;
  }
  Value *x = find_input(&t, "x"), *w = find_input(&t, "w"), *tg = find_input(&t, "t"), *r = find_input(&t, "r");
  Value *y = r ? r->grad : NULL, *l = find_op(&t, OP_MSE_LOSS, 0);
  if (!x || !w || !tg || !r || !y || !l || !find_op(&t, OP_RMS_NORM, 0)) {
    fprintf(stderr, "FAIL rmsnorm %s: values not found\n", tag);
    fails++;
    tmodel_close(&t);
    return;
  }
  DuetRng rng;
  duet_rng_seed(&rng, 8, 0);
  double xs[18], ws[6], ts[18];
  for (int j = 0; j < 18; j++) {
    xs[j] = j < 6 ? 0 : 2 * duet_rng_normal(&rng); /* row 0: zeros (0 / sqrt(eps) = 0) */
    ts[j] = duet_rng_normal(&rng);
    set(&t, x, j, xs[j]), set(&t, tg, j, ts[j]), set(&t, r, j, 1);
    if (dt == DT_F32) xs[j] = (float)xs[j], ts[j] = (float)ts[j];
  }
  for (int j = 0; j < 6; j++) {
    set(&t, w, j, ws[j] = 0.5 + 0.25 * j);
    if (dt == DT_F32) ws[j] = (float)ws[j];
  }
  if (run(&t)) {
    tmodel_close(&t);
    return;
  }
  int before = fails;
  double mse = 0;
  for (int row = 0; row < 3; row++) {
    double ss = 0;
    for (int c = 0; c < 6; c++) ss += xs[row * 6 + c] * xs[row * 6 + c];
    double rs = 1 / sqrt(ss / 6 + 0.01);
    for (int c = 0; c < 6; c++) {
      double want = xs[row * 6 + c] * rs * ws[c], got = get(&t, y, row * 6 + c);
      char what[96];
      snprintf(what, sizeof what, "rmsnorm [%d,%d] %s", row, c, tag);
      expect(what, got, want, 1e-300, rtol);
      mse += (got - ts[row * 6 + c]) * (got - ts[row * 6 + c]) / 18;
    }
  }
  /* the loss: sum(y r) + mse, r = 1 */
  double sy = 0;
  for (int j = 0; j < 18; j++) sy += get(&t, y, j);
  expect("mse_loss", get(&t, t.g->loss, 0) - sy, mse, dt == DT_F64 ? 1e-13 : 2e-5, rtol);
  (void)l;
  printf("%s rmsnorm and mse_loss %s: 18 values (a zero row) and the loss\n", fails > before ? "FAIL" : "ok", tag);
  tmodel_close(&t);
}

/* ------------------------------------------------------------------ rope */

static void rope(DType dt) {
  const char *tag = dt == DT_F64 ? "f64" : "f32";
  double rtol = dt == DT_F64 ? 1e-14 : 2e-6;
  static const struct {
    int heads;
    double base;
  } cfg[] = {{2, 10000}, {1, 10000}, {2, 100}};
  for (int c = 0; c < 3; c++)
    for (int pos0 = 0; pos0 <= 7; pos0 += 7) {
      char src[256];
      snprintf(src, sizeof src, "model rp\ninput x: f32[2,5,8]\nparam r: [2,5,8]\nloss = sum(rope(x, heads = %d, base = %g) * r)\n",
               cfg[c].heads, cfg[c].base);
      TModel t;
      if (tmodel_open(&t, "rope", src, dt)) {
        fails++;
        continue;
      }
      Value *x = find_input(&t, "x"), *r = find_input(&t, "r"), *y = r ? r->grad : NULL;
      DuetRng rng;
      duet_rng_seed(&rng, 9, (uint64_t)c);
      double xs[80];
      for (int j = 0; j < 80; j++) {
        set(&t, x, j, xs[j] = duet_rng_normal(&rng));
        if (dt == DT_F32) xs[j] = (float)xs[j];
      }
      duet_session_set_pos(t.s, pos0); /* the decoding position: the angles' offset */
      if (!x || !y || run(&t)) {
        fails++;
        tmodel_close(&t);
        continue;
      }
      int before = fails, D = 8 / cfg[c].heads;
      for (int b = 0; b < 2; b++)
        for (int tt = 0; tt < 5; tt++)
          for (int h = 0; h < cfg[c].heads; h++)
            for (int i = 0; i < D / 2; i++) {
              int o = (b * 5 + tt) * 8 + h * D + 2 * i;
              double a = (pos0 + tt) * pow(cfg[c].base, -2.0 * i / D);
              double y0 = xs[o] * cos(a) - xs[o + 1] * sin(a), y1 = xs[o] * sin(a) + xs[o + 1] * cos(a);
              char what[128];
              snprintf(what, sizeof what, "rope heads %d base %g position %d, [%d,%d,%d] %s", cfg[c].heads, cfg[c].base,
                       pos0 + tt, b, tt, h * D + 2 * i, tag);
              expect(what, get(&t, y, o), y0, dt == DT_F32 ? 2e-6 : 1e-14, rtol);
              expect(what, get(&t, y, o + 1), y1, dt == DT_F32 ? 2e-6 : 1e-14, rtol);
            }
      printf("%s rope heads %d base %g from position %d %s: 80 values\n", fails > before ? "FAIL" : "ok", cfg[c].heads,
             cfg[c].base, pos0, tag);
      tmodel_close(&t);
    }
}

/* ------------------------------------------- grouped-query attention */

static void gqa(DType dt, bool causal) {
  const char *tag = dt == DT_F64 ? "f64" : "f32";
  double tol = dt == DT_F64 ? 1e-12 : 1e-5;
  char a_src[600], b_src[800];
  const char *head = "param r: [2,5,8]\nparam q: [2,5,8]\nparam k: [2,5,4]\nparam v: [2,5,4]\n";
  snprintf(a_src, sizeof a_src, "model gqa\n%sy = attention(q, k, v, heads = 4, kv_heads = 2, causal = %s)\n"
                                "loss = sum(y * r) + mean(y * y)\n", head, causal ? "true" : "false");
  snprintf(b_src, sizeof b_src, "model rep\n%sk0, k1 = split(k, 2)\nv0, v1 = split(v, 2)\n"
                                "y = attention(q, concat(k0, k0, k1, k1, axis = 2), concat(v0, v0, v1, v1, axis = 2), "
                                "heads = 4, causal = %s)\nloss = sum(y * r) + mean(y * y)\n", head, causal ? "true" : "false");
  TModel a, b;
  if (tmodel_open(&a, "gqa", a_src, dt) || tmodel_open(&b, "rep", b_src, dt)) {
    fails++;
    return;
  }
  DuetRng rng;
  duet_rng_seed(&rng, 10, causal);
  static const char *const names[] = {"r", "q", "k", "v"};
  for (int i = 0; i < 4; i++) {
    Value *va = find_input(&a, names[i]), *vb = find_input(&b, names[i]);
    for (int64_t j = 0; j < shape_numel(&va->shape); j++) {
      double x = duet_rng_normal(&rng);
      set(&a, va, j, x), set(&b, vb, j, x);
    }
  }
  if (run(&a) || run(&b)) {
    tmodel_close(&a), tmodel_close(&b);
    return;
  }
  int before = fails;
  /* y * r: y is d loss / d r... plus 2 y / n from mean(y * y), the same on both sides */
  const Value *ya = find_input(&a, "r")->grad, *yb = find_input(&b, "r")->grad;
  const Value *pa[4] = {ya, find_input(&a, "q")->grad, find_input(&a, "k")->grad, find_input(&a, "v")->grad};
  const Value *pb[4] = {yb, find_input(&b, "q")->grad, find_input(&b, "k")->grad, find_input(&b, "v")->grad};
  static const char *const what[] = {"output", "d q", "d k", "d v"};
  for (int i = 0; i < 4; i++) {
    int64_t n = shape_numel(&pa[i]->shape);
    double *ga = malloc((size_t)n * sizeof *ga), *gb = malloc((size_t)n * sizeof *gb);
    for (int64_t j = 0; j < n; j++) ga[j] = get(&a, pa[i], j), gb[j] = get(&b, pb[i], j);
    char w[128];
    snprintf(w, sizeof w, "attention, 4 heads over 2 key/value heads%s, %s %s", causal ? ", causal" : "", what[i], tag);
    fails += check_normwise_f64(w, ga, gb, n, tol, 0, NULL);
    free(ga), free(gb);
  }
  printf("%s grouped-query attention%s %s: output and gradients as with k and v repeated per group\n",
         fails > before ? "FAIL" : "ok", causal ? " (causal)" : "", tag);
  tmodel_close(&a), tmodel_close(&b);
}

int main(void) {
  for (int f = 0; f < 2; f++) {
    DType dt = f ? DT_F64 : DT_F32;
    elementwise(dt);
    softmax(dt);
    rmsnorm_mse(dt);
    rope(dt);
    gqa(dt, true);
    gqa(dt, false);
  }
  printf("%s: %d failures\n", fails ? "FAIL" : "ok", fails);
  return fails != 0;
}
