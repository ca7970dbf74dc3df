/* tests/test_gradcheck.c: every op's backward against central finite
 * differences of its forward, both computed by the generated C kernels in
 * float64.  For each case, loss L(params); for every element p_j:
 *   numeric_j = (L(p + h e_j) - L(p - h e_j)) / (2h),  h = 1e-6
 * and |analytic_j - numeric_j| <= 1e-8 + 1e-6 |numeric_j|.  (Truncation
 * error is O(h^2) ~ 1e-12 and rounding O(eps/h) ~ 1e-10 for losses of order
 * one, so these tolerances leave two orders of margin.)  The same model is
 * then compiled in float32 and its analytic gradients are compared with the
 * float64 ones (rtol 1e-3, atol 1e-5: float32 rounding of sums over at most a
 * few dozen terms). */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "op_cases.h"

static void fill(TModel *t, DuetRng *r, int classes) {
  Graph *g = t->g;
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    int id = tmodel_tensor(t, v);
    if (id < 0 || (v->op != OP_INPUT && v->op != OP_PARAM)) continue;
    int64_t n = shape_numel(&v->shape);
    void *p = duet_session_tensor(t->s, id);
    for (int64_t j = 0; j < n; j++) {
      if (v->dtype == DT_I32) {
        ((int32_t *)p)[j] = (int32_t)(duet_rng_next(r) % (uint64_t)(classes ? classes : 1));
        continue;
      }
      /* params: magnitudes in [0.2, 1] keep relu and division away from
       * their kinks and poles */
      double x = v->op == OP_PARAM ? (0.2 + 0.8 * duet_rng_uniform(r)) * (duet_rng_next(r) & 1 ? 1 : -1)
                                   : duet_rng_normal(r);
      if (v->dtype == DT_F64) ((double *)p)[j] = x;
      else ((float *)p)[j] = (float)x;
    }
  }
}

static double get(TModel *t, int id, int64_t j, DType dt) {
  void *p = duet_session_tensor(t->s, id);
  return dt == DT_F64 ? ((double *)p)[j] : ((float *)p)[j];
}

static double loss_at(TModel *t) {
  if (duet_session_run(t->s, DUET_RUN_GRAD)) {
    fprintf(stderr, "run failed: %s\n", duet_session_error(t->s));
    exit(1);
  }
  return get(t, tmodel_tensor(t, t->g->loss), 0, t->g->loss->dtype);
}

static int run_case(const Case *c) {
  TModel t64, t32;
  int fails = 0;
  if (tmodel_open(&t64, c->name, c->src, DT_F64) || tmodel_open(&t32, c->name, c->src, DT_F32)) {
    fprintf(stderr, "FAIL %s: does not compile\n", c->name);
    return 1;
  }
  DuetRng r64, r32;
  duet_rng_seed(&r64, 42, 0);
  duet_rng_seed(&r32, 42, 0);
  fill(&t64, &r64, c->classes);
  fill(&t32, &r32, c->classes);
  loss_at(&t64);
  loss_at(&t32);
  const double h = 1e-6;
  int n_checked = 0;
  for (int i = 0; i < t64.g->n_values; i++) {
    Value *p = t64.g->values[i];
    if (p->op != OP_PARAM) continue;
    if (!p->grad) {
      fprintf(stderr, "FAIL %s: param %s has no gradient\n", c->name, p->attr.name);
      fails++;
      continue;
    }
    Value *p32 = tmodel_param(&t32, p->attr.name);
    int pid = tmodel_tensor(&t64, p), gid = tmodel_tensor(&t64, p->grad);
    int gid32 = tmodel_tensor(&t32, p32->grad);
    int64_t n = shape_numel(&p->shape);
    double *analytic = malloc((size_t)n * sizeof *analytic);
    loss_at(&t64); /* gradients at the unperturbed point */
    for (int64_t j = 0; j < n; j++) analytic[j] = get(&t64, gid, j, DT_F64);
    for (int64_t j = 0; j < n; j++) {
      double *x = (double *)duet_session_tensor(t64.s, pid) + j;
      double x0 = *x;
      *x = x0 + h;
      double lp = loss_at(&t64);
      *x = x0 - h;
      double lm = loss_at(&t64);
      *x = x0;
      double numeric = (lp - lm) / (2 * h);
      char what[160];
      snprintf(what, sizeof what, "%s: d loss / d %s[%lld] (f64 vs finite difference)", c->name, p->attr.name,
               (long long)j);
      fails += check_close(what, analytic[j], numeric, 1e-8, 1e-6);
      snprintf(what, sizeof what, "%s: d loss / d %s[%lld] (f32 vs f64)", c->name, p->attr.name, (long long)j);
      fails += check_close(what, get(&t32, gid32, j, DT_F32), analytic[j], 1e-5, 1e-3);
      n_checked++;
    }
    free(analytic);
  }
  printf("%s %s: %d gradient entries checked\n", fails ? "FAIL" : "ok", c->name, n_checked);
  tmodel_close(&t64);
  tmodel_close(&t32);
  return fails != 0;
}

/* Dropout's statistics: with loss = mean(dropout(x, 0.25)), d loss / d x_j
 * is 0 for dropped elements and 1/(0.75 n) for kept ones; over n = 20000
 * elements the dropped fraction is 0.25 +- 0.003 (one standard deviation),
 * so we allow 0.02.  Evaluation is the identity; the mask changes with the
 * step and is the same in forward and backward (checked above by finite
 * differences). */
static int dropout_stats(void) {
  TModel t;
  if (tmodel_open(&t, "dropout", "model d\nparam x: [20000] = ones\nloss = mean(dropout(x, 0.25))\n", DT_F64)) return 1;
  Value *x = tmodel_param(&t, "x");
  int fails = 0;
  if (duet_session_run(t.s, DUET_RUN_GRAD)) return 1;
  double *g = duet_session_tensor(t.s, tmodel_tensor(&t, x->grad));
  int64_t zeros = 0, bad = 0;
  for (int j = 0; j < 20000; j++) {
    if (g[j] == 0) zeros++;
    else if (!close_enough(g[j], 1.0 / (0.75 * 20000), 1e-15, 0)) bad++; /* a NaN is bad too */
  }
  fails += check_close("dropped fraction", (double)zeros / 20000, 0.25, 0.02, 0);
  fails += check_close("kept gradients equal to 1/((1-p) n)", (double)bad, 0, 0, 0);
  if (duet_session_run(t.s, DUET_RUN_EVAL)) return 1;
  fails += check_close("evaluation is the identity", *(double *)duet_session_tensor(t.s, tmodel_tensor(&t, t.g->loss)),
                       1.0, 1e-15, 0);
  printf("%s dropout statistics: %lld of 20000 dropped\n", fails ? "FAIL" : "ok", (long long)zeros);
  tmodel_close(&t);
  return fails != 0;
}

int main(void) {
  int failed = 0, n = (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n; i++) failed += run_case(&cases[i]);
  failed += dropout_stats(), n++;
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed != 0;
}
