/* tests/test_compare.c: the comparison helpers of the numeric tests
 * (tests/test_util.c) must fail on what is not a match: a NaN in either
 * operand, an infinity against a finite value or the other infinity, and a
 * value just beyond the tolerance; and pass on a value just within it.
 * Covered: close_enough / check_close (gradcheck, optimizer, decode,
 * precision), check_normwise (gpt_parity, precision), compare_sessions
 * (cuda_emu, gpu_ops, fakegpu_ops) on two sessions of one small program. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

static int fails, checks;

/* The helpers print a FAIL line for each mismatch they find; the mismatches
 * made here on purpose are silenced (stderr to /dev/null meanwhile). */
static int quiet_begin(void) {
  fflush(stderr);
  int saved = dup(2), null = open("/dev/null", O_WRONLY);
  if (saved >= 0 && null >= 0) dup2(null, 2);
  if (null >= 0) close(null);
  return saved;
}
static void quiet_end(int saved) {
  fflush(stderr);
  if (saved >= 0) {
    dup2(saved, 2);
    close(saved);
  }
}

/* One expectation: `failed` is what the helper said (nonzero: a mismatch). */
static void expect(const char *what, int failed, int want_fail) {
  checks++;
  if (!failed != !want_fail) {
    fprintf(stderr, "FAIL %s: the helper %s\n", what, want_fail ? "passed it" : "failed it");
    fails++;
  }
}

static void scalars(void) {
  const double tol = 1e-6; /* atol 0, rtol 1e-6 */
  struct { const char *what; double got, want; int want_fail; } c[] = {
      {"NaN against 1", NAN, 1, 1},
      {"1 against NaN", 1, NAN, 1},
      {"NaN against NaN", NAN, NAN, 1},
      {"inf against 1", INFINITY, 1, 1},
      {"1 against inf", 1, INFINITY, 1}, /* rtol * |inf| is infinite: passed before */
      {"-inf against inf", -INFINITY, INFINITY, 1},
      {"1e300 against inf", 1e300, INFINITY, 1},
      {"inf against inf", INFINITY, INFINITY, 0},
      {"just beyond the tolerance", 1 + 1.01 * tol, 1, 1},
      {"just within the tolerance", 1 + 0.99 * tol, 1, 0},
      {"exact", 0.1, 0.1, 0},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    char what[120];
    snprintf(what, sizeof what, "close_enough: %s", c[i].what);
    expect(what, !close_enough(c[i].got, c[i].want, 0, tol), c[i].want_fail);
    snprintf(what, sizeof what, "check_close: %s", c[i].what);
    int q = quiet_begin();
    int r = check_close(what, c[i].got, c[i].want, 0, tol);
    quiet_end(q);
    expect(what, r, c[i].want_fail);
  }
  /* an absolute tolerance alone */
  expect("close_enough atol: beyond", !close_enough(1e-9 + 1.01e-12, 1e-9, 1e-12, 0), 1);
  expect("close_enough atol: within", !close_enough(1e-9 + 0.99e-12, 1e-9, 1e-12, 0), 0);
}

/* check_normwise: a tensor of 8 values, scale max |want| = 2, tol 1e-3:
 * bound 2e-3 on every element. */
static void normwise(void) {
  const float want[8] = {2, -1, 0.5f, 0, 1e-6f, -2, 0.25f, 1};
  struct { const char *what; int at; double value; int want_fail; } c[] = {
      {"NaN", 3, NAN, 1},
      {"+inf", 0, INFINITY, 1},
      {"-inf", 5, -INFINITY, 1},
      {"just beyond the bound on a small entry", 4, 1e-6 + 2.02e-3, 1},
      {"just within the bound on a small entry", 4, 1e-6 + 1.98e-3, 0},
      {"just beyond the bound on the largest entry", 0, 2 + 2.02e-3, 1},
      {"the same values", 0, 2, 0},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    float got[8];
    memcpy(got, want, sizeof got);
    got[c[i].at] = (float)c[i].value;
    char what[120];
    snprintf(what, sizeof what, "check_normwise: %s", c[i].what);
    int q = quiet_begin();
    double used = 0;
    int r = check_normwise(what, got, want, 8, 1e-3, 0, &used);
    quiet_end(q);
    expect(what, r, c[i].want_fail);
  }
  /* a NaN in the reference, and a reference of zeros against nonzero values */
  float w2[4] = {1, NAN, 2, 3}, g2[4] = {1, 5, 2, 3}, z[4] = {0}, nz[4] = {0, 0, 1e-30f, 0};
  double w64[3] = {1, 2, 3}, g64[3] = {1, 2, NAN};
  int q = quiet_begin();
  int r1 = check_normwise("NaN in the reference", g2, w2, 4, 1e-3, 0, NULL);
  int r2 = check_normwise("zeros against 1e-30", nz, z, 4, 1e-3, 0, NULL);
  int r3 = check_normwise_f64("f64 NaN", g64, w64, 3, 1e-3, 0, NULL);
  quiet_end(q);
  expect("check_normwise: NaN in the reference", r1, 1);
  expect("check_normwise: zeros against 1e-30", r2, 1);
  expect("check_normwise_f64: NaN", r3, 1);
}

/* compare_sessions on two sessions of one f32 program: equal tensors pass;
 * one element of one tensor changed fails. */
static void sessions(void) {
  TModel t;
  const char *src = "model c\ninput x: f32[4, 3]\ninput y: i32[4]\nparam w: [3, 5] = normal(0.5)\n"
                    "loss = cross_entropy(x @ w, y)\n";
  if (tmodel_open(&t, "compare.model", src, DT_F32)) {
    fails++;
    return;
  }
  const DuetProgram *p = &t.cp->prog;
  DuetConfig cfg = p->defaults;
  char err[512];
  DuetSession *b = duet_session_new(p, t.dev, &cfg, err, sizeof err);
  if (!b) {
    fprintf(stderr, "FAIL second session: %s\n", err);
    fails++;
    tmodel_close(&t);
    return;
  }
  DuetRng r;
  duet_rng_seed(&r, 3, 0);
  tmodel_fill(&t, t.s, &r, 5);
  if (duet_session_run(t.s, DUET_RUN_GRAD)) {
    fprintf(stderr, "FAIL run: %s\n", duet_session_error(t.s));
    fails++;
  }
  int w = tmodel_tensor(&t, tmodel_param(&t, "w"));
  const float base = ((float *)duet_session_tensor(t.s, w))[2]; /* the element changed below */
  /* rtol of f32 tensors: 2e-3, atol 1e-4 */
  double lim = 1e-4 + 2e-3 * fabs(base);
  struct { const char *what; double a, b; int want_fail; } c[] = {
      {"equal", base, base, 0},
      {"NaN in the second", base, NAN, 1},
      {"NaN in the reference", NAN, base, 1},
      {"NaN in both (f32 program: no loss scaling)", NAN, NAN, 1},
      {"inf in the reference", INFINITY, base, 1}, /* passed before */
      {"inf in the second", base, INFINITY, 1},
      {"opposite infinities", INFINITY, -INFINITY, 1},
      {"just beyond the tolerance", base, base + 1.01 * lim, 1},
      {"just within the tolerance", base, base + 0.99 * lim, 0},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    for (int k = 0; k < p->n_tensors; k++) { /* b := a, tensor by tensor */
      const DuetTensor *x = &p->tensors[k];
      if (duet_session_write(b, k, 0, duet_session_tensor(t.s, k), (size_t)x->nbytes)) {
        fprintf(stderr, "FAIL copying %s: %s\n", x->name, duet_session_error(b));
        fails++;
      }
    }
    float *wa = duet_session_tensor(t.s, w), *wb = duet_session_tensor(b, w);
    wa[2] = (float)c[i].a;
    wb[2] = (float)c[i].b;
    char what[120];
    snprintf(what, sizeof what, "compare_sessions: %s", c[i].what);
    int q = quiet_begin();
    int differ = compare_sessions(what, p, t.s, b);
    quiet_end(q);
    expect(what, differ, c[i].want_fail);
    wa[2] = base;
  }
  duet_session_free(b);
  tmodel_close(&t);
}

int main(void) {
  scalars();
  normwise();
  sessions();
  printf("%d of %d expectations met\n", checks - fails, checks);
  printf("%s\n", fails ? "FAIL" : "all passed");
  return fails != 0;
}
