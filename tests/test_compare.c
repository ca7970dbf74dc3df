/* tests/test_compare.c: the comparison helpers of the numeric tests
 * (tests/test_util.c) must fail on what is not a match: a NaN in either
 * operand, an infinity against a finite value or the other infinity, and a
 * value just beyond the tolerance; and pass on a value just within it.
 * Covered: close_enough / check_close (gradcheck, optimizer, decode,
 * precision), check_normwise (gpt_parity, precision), compare_sessions
 * (cuda_emu, gpu_ops, fakegpu_ops) on two sessions of one small program,
 * compare_sessions_stats with the per-tensor tolerances of a bf16 program
 * (tmodel_session_tol16), and lockstep_device (every kernel and GEMM
 * alone, from the same inputs) over the CPU device, without and with a
 * wrong kernel. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/duet_half.h"
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

/* compare_sessions_stats on a 16-bit program (bf16): every float tensor
 * normwise within its own tolerance (tmodel_session_tol16); and
 * compare_sessions, which has none, refuses such a program. */
static void sessions16(void) {
  TModel t;
  const char *src = "model c\ninput x: f32[4, 8]\ninput r: f32[4, 5]\nparam w: [8, 5] = normal(0.5)\n"
                    "loss = mean((x @ w) * r)\n";
  FrontendOptions fo = {.float_dtype = DT_F32};
  if (tmodel_open_prec(&t, "compare16.model", src, &fo, "bf16")) {
    fails++;
    return;
  }
  const DuetProgram *p = &t.cp->prog;
  DuetConfig cfg = p->defaults;
  char err[512];
  DuetSession *b = duet_session_new(p, t.dev, &cfg, err, sizeof err);
  DuetRng r;
  duet_rng_seed(&r, 5, 0);
  tmodel_fill(&t, t.s, &r, 0);
  if (!b || duet_session_run(t.s, DUET_RUN_GRAD)) {
    fprintf(stderr, "FAIL 16-bit sessions: %s\n", b ? duet_session_error(t.s) : err);
    fails++;
    duet_session_free(b);
    tmodel_close(&t);
    return;
  }
  SessionTol tol = tmodel_session_tol16(&t);
  /* w: f32; h: a bf16 tensor whose bytes no tensor of another dtype
   * shares (those are not compared) */
  int w = tmodel_tensor(&t, tmodel_param(&t, "w")), h = -1;
  for (int i = 0; i < p->n_tensors && h < 0; i++) {
    const DuetTensor *a = &p->tensors[i];
    bool alone = a->dtype == DUET_BF16;
    for (int j = 0; j < p->n_tensors && alone; j++) {
      const DuetTensor *o = &p->tensors[j];
      alone = o->region != a->region || o->dtype == a->dtype || o->offset >= a->offset + a->nbytes ||
              a->offset >= o->offset + o->nbytes;
    }
    if (alone) h = i;
  }
  if (h < 0) {
    fprintf(stderr, "FAIL 16-bit sessions: no bf16 tensor to change\n");
    fails++;
    h = w;
  }
  float *wa = duet_session_tensor(t.s, w), *wb = duet_session_tensor(b, w);
  double scale = 0;
  for (int j = 0; j < 40; j++) scale = fmax(scale, fabs(wa[j]));
  const double bound = tol.rel[w] * scale, base = wa[2];
  /* the tolerance is the depth rule's: twice round16_tol of the depth */
  expect("tmodel_session_tol16: w's tolerance", !(tol.rel[w] == 2 * round16_tol("bf16", tmodel_tensor_depth16(&t)[w]) &&
                                                  tol.rel[w] > 0),
         0);
  struct { const char *what; double b; int want_fail; } c[] = {
      {"equal", base, 0},
      {"just within the tolerance", base + 0.99 * bound, 0},
      {"just beyond the tolerance", base + 1.01 * bound, 1},
      {"NaN in the second", NAN, 1},
      {"inf in the second", INFINITY, 1},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0] + 2; i++) {
    for (int k = 0; k < p->n_tensors; k++) /* b := a */
      if (duet_session_write(b, k, 0, duet_session_tensor(t.s, k), (size_t)p->tensors[k].nbytes)) fails++;
    const char *what;
    if (i < sizeof c / sizeof c[0]) {
      wb[2] = (float)c[i].b;
      what = c[i].what;
    } else { /* a bf16 element: NaN, or off by twice its tensor's bound */
      uint16_t *hb = duet_session_tensor(b, h);
      const uint16_t *ha = duet_session_tensor(t.s, h);
      double hs = 0;
      for (int64_t j = 0; j < p->tensors[h].nbytes / 2; j++) hs = fmax(hs, fabs(duet_f32_from_bf16(ha[j])));
      float off = (float)(duet_f32_from_bf16(ha[0]) + 2 * tol.rel[h] * hs);
      hb[0] = i == sizeof c / sizeof c[0] ? 0x7fc0 : duet_bf16_from_f32(off);
      what = i == sizeof c / sizeof c[0] ? "a NaN in a bf16 tensor" : "a bf16 element off by twice its bound";
    }
    char w2[160];
    snprintf(w2, sizeof w2, "compare_sessions_stats (bf16): %s", what);
    int q = quiet_begin();
    int differ = compare_sessions_stats(w2, p, t.s, b, &tol, NULL);
    quiet_end(q);
    expect(w2, differ, i < sizeof c / sizeof c[0] ? c[i].want_fail : 1);
  }
  int q = quiet_begin();
  int r16 = compare_sessions("compare_sessions of a bf16 program", p, t.s, t.s);
  quiet_end(q);
  expect("compare_sessions of a bf16 program (no per-tensor tolerances)", r16, 1);
  duet_session_free(b);
  tmodel_close(&t);
}

/* A CPU device whose kernel `bad_kernel` multiplies its output (its last
 * buffer) by 1 + bad_rel after each launch: a wrong kernel. */
static const TModel *bad_model;
static int bad_kernel;
static double bad_rel;
static DuetDevice *bad_inner;
static DuetDeviceOps bad_ops;

static int bad_launch(DuetDevice *d, int k, void *const *t, const double *s) {
  (void)d;
  if (bad_inner->ops->launch(bad_inner, k, t, s)) return -1;
  if (k == bad_kernel) {
    const Kernel *K = &bad_model->cp->kernels[k];
    int id = K->bufs[K->n_bufs - 1].tensor;
    float *x = t[id];
    for (int64_t i = 0; i < bad_model->cp->prog.tensors[id].nbytes / 4; i++) x[i] = (float)(x[i] * (1 + bad_rel));
  }
  return 0;
}
static void bad_destroy(DuetDevice *d) {
  bad_inner->ops->destroy(bad_inner);
  free(d);
}

/* lockstep_device over the CPU device itself (f32 and fp16): its C
 * kernels from the same inputs write the same bits and its GEMMs lie
 * within their bound of the exact product, so nothing is reported; over
 * a CPU device with one wrong kernel (the first sum over an axis, its
 * output times 1 + 1e-3), that kernel is named. */
static void lockstep(void) {
  const char *src = "model c\ninput x: f32[6,4]\ninput y: i32[6]\n"
                    "block linear(h, out) {\n  param w: [dim(h, -1), out] = xavier_uniform\n"
                    "  param b: [out] = normal(0.1)\n  return h @ w + b\n}\n"
                    "loss = cross_entropy(linear(relu(linear(x, 5)), 3), y)\n";
  for (int run = 0; run < 5; run++) {
    /* run 4: fp16 with inputs of 30000, so that the first GEMM's exact
     * products exceed fp16's range: its infinities are right, not reported */
    bool fp16 = run & 1 || run == 4, bad = run == 2 || run == 3, huge = run == 4;
    TModel t;
    FrontendOptions fo = {.float_dtype = DT_F32};
    if (tmodel_open_prec(&t, "lockstep.model", src, &fo, fp16 ? "fp16" : "fp32")) {
      fails++;
      continue;
    }
    const DuetProgram *p = &t.cp->prog;
    DuetDevice *inner = duet_cpu_device(t.jit.fns, t.jit.n, 0);
    bad_kernel = -1;
    for (int k = 0; k < t.cp->n_kernels && bad_kernel < 0; k++)
      if (t.cp->kernels[k].kind == KK_REDUCE && !t.cp->kernels[k].reduce_max) bad_kernel = k;
    if (bad && inner) { /* inner becomes the wrong device */
      bad_model = &t, bad_rel = 1e-3, bad_inner = inner;
      bad_ops = *inner->ops;
      bad_ops.launch = bad_launch, bad_ops.destroy = bad_destroy;
      DuetDevice *w = calloc(1, sizeof *w);
      if (w) w->ops = &bad_ops, w->ctx = inner->ctx;
      inner = w;
    }
    char what[64], err[512];
    snprintf(what, sizeof what, "lockstep over the CPU (%s%s)", fp16 ? "fp16" : "f32",
             bad ? ", a wrong kernel" : huge ? ", GEMMs overflowing to inf" : "");
    DuetDevice *ld = inner ? lockstep_device(inner, &t, what) : NULL;
    DuetConfig cfg = p->defaults;
    DuetSession *s = ld ? duet_session_new(p, ld, &cfg, err, sizeof err) : NULL;
    if (!s) {
      fprintf(stderr, "FAIL %s: %s\n", what, ld ? err : "out of memory");
      fails++;
    } else {
      DuetRng r;
      duet_rng_seed(&r, 9, 0);
      tmodel_fill(&t, s, &r, 3);
      int xid = -1;
      for (int i = 0; i < p->n_tensors; i++)
        if (!strcmp(p->tensors[i].name, "x")) xid = i;
      float xs[24];
      for (int i = 0; i < 24; i++) xs[i] = i & 1 ? -30000.0f : 30000.0f;
      if (huge && (xid < 0 || p->tensors[xid].nbytes != (int64_t)sizeof xs || duet_session_write(s, xid, 0, xs, sizeof xs))) {
        fprintf(stderr, "FAIL %s: cannot write the input x\n", what);
        fails++;
      }
      int q = quiet_begin();
      int rc = duet_session_run(s, DUET_RUN_GRAD) || duet_session_run(s, DUET_RUN_TRAIN);
      quiet_end(q);
      const LockstepStats *st = lockstep_stats(ld);
      if (rc || st->kernels == 0 || st->gemms == 0 || bad_kernel < 0) {
        fprintf(stderr, "FAIL %s: run '%s', %lld kernels, %lld GEMMs\n", what, duet_session_error(s), st->kernels,
                st->gemms);
        fails++;
      }
      expect(what, st->fails, bad);
      char want[64];
      snprintf(want, sizeof want, "kernel %d (reduce)", bad_kernel);
      if (bad) expect("lockstep names the wrong kernel", strncmp(st->worst_what, want, strlen(want)) != 0, 0);
    }
    duet_session_free(s);
    if (ld) ld->ops->destroy(ld);
    else if (inner) inner->ops->destroy(inner);
    tmodel_close(&t);
  }
}

int main(void) {
  scalars();
  normwise();
  sessions();
  sessions16();
  lockstep();
  printf("%d of %d expectations met\n", checks - fails, checks);
  printf("%s\n", fails ? "FAIL" : "all passed");
  return fails != 0;
}
