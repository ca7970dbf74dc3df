/* tests/test_precision.c: mixed precision on the CPU.
 *
 *  1. conversions (runtime/duet_half.h, the same text the C emitter pastes
 *     into kernels): f32 -> f16 and f32 -> bf16 against reference bit
 *     patterns from numpy and torch (tests/ref/half_ref.h, written by
 *     tools/gen_half_ref.py: edge values, subnormals, overflow, ties, random
 *     values); NaNs by property; every f16 -> f32 against ldexp; every f16
 *     and bf16 round-trips;
 *  2. the device table and the `auto` rules, and the bf16-below-sm_80 error;
 *  3. ops in fp16 and bf16 against the same model in fp32 (same inputs and
 *     params): loss and every param gradient, max |g16 - g32| <= tol *
 *     max |g32| with tol = D u16 + 2^-17, D the 16-bit roundings on the
 *     longest chain computing that gradient, u16 = 2^-11 (fp16) or 2^-8
 *     (bf16) (round16_tol, tests/test_util.c);
 *  4. numerical faults: long sums and GEMMs accumulate in f32; Adam's
 *     second moments of tiny gradients stay f32 (and fp16 gradients that
 *     small need the loss scale); softmax / cross-entropy with logits near
 *     the f16 limit; layernorm of nearly constant rows.  (Gradient
 *     accumulation over micro-batches does not exist in duet yet.) */
#include <stdlib.h>
#include <string.h>

#include "../runtime/duet_half.h"
#include "test_util.h"
#include "ref/half_ref.h"

static int fails;

static void expect_u16(const char *what, uint32_t in, unsigned got, unsigned want) {
  if (got != want) {
    fprintf(stderr, "FAIL %s of 0x%08x (%.9g): got 0x%04x, want 0x%04x\n", what, in, duet_bits_f32(in), got, want);
    fails++;
  }
}

static void conversions(void) {
  int n = (int)(sizeof half_ref / sizeof half_ref[0]);
  for (int i = 0; i < n; i++) {
    float f = duet_bits_f32(half_ref[i][0]);
    expect_u16("f16", half_ref[i][0], duet_f16_from_f32(f), half_ref[i][1]);
    expect_u16("bf16", half_ref[i][0], duet_bf16_from_f32(f), half_ref[i][2]);
  }
  /* NaN: stays NaN, keeps its sign, quiet bit set */
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fffffffu};
  for (int i = 0; i < 6; i++) {
    float f = duet_bits_f32(nans[i]);
    unsigned h = duet_f16_from_f32(f), b = duet_bf16_from_f32(f);
    if ((h & 0x7e00u) != 0x7e00u || (h >> 15) != (nans[i] >> 31) || (b & 0x7fc0u) != 0x7fc0u ||
        (b >> 15) != (nans[i] >> 31)) {
      fprintf(stderr, "FAIL NaN 0x%08x -> f16 0x%04x, bf16 0x%04x: not a quiet NaN of the same sign\n", nans[i], h, b);
      fails++;
    }
  }
  /* every f16 widens exactly (reference: ldexp) and narrows back to itself */
  for (unsigned h = 0; h < 65536; h++) {
    unsigned e = (h >> 10) & 31, m = h & 1023;
    double want = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, (int)e - 25);
    if (h & 0x8000) want = -want;
    float got = duet_f32_from_f16((uint16_t)h);
    bool ok = e == 31 && m ? got != got : (double)got == want && !signbit(got) == !signbit(want);
    if (!ok || (!(e == 31 && m) && duet_f16_from_f32(got) != h)) {
      fprintf(stderr, "FAIL f16 0x%04x: widened to %.9g (want %.9g) or does not round-trip\n", h, got, want);
      fails++;
    }
    float bg = duet_f32_from_bf16((uint16_t)h);
    if (bg == bg && duet_bf16_from_f32(bg) != h) {
      fprintf(stderr, "FAIL bf16 0x%04x does not round-trip\n", h);
      fails++;
    }
  }
  printf("%s conversions: %d reference values, 6 NaNs, all 65536 f16 and bf16 values\n", fails ? "FAIL" : "ok", n);
}

static void device_rules(void) {
  struct {
    const char *target, *req;
    DType storage, compute;
    bool scaling;
  } rules[] = {
      {"cpu", "auto", DT_F32, DT_F32, false},   {NULL, NULL, DT_F32, DT_F32, false},
      {"cpu", "fp16", DT_F16, DT_F32, true},    {"cpu", "bf16", DT_BF16, DT_F32, false},
      {"sm_60", "auto", DT_F16, DT_F16, true},  {"sm_61", "auto", DT_F16, DT_F32, true},
      {"sm_70", "auto", DT_F16, DT_F16, true},  {"sm_75", "auto", DT_F16, DT_F16, true},
      {"sm_80", "auto", DT_BF16, DT_BF16, false}, {"sm_86", "auto", DT_BF16, DT_BF16, false},
      {"sm_90", "auto", DT_BF16, DT_BF16, false}, {"sm_90", "fp16", DT_F16, DT_F16, true},
      {"sm_60", "fp32", DT_F32, DT_F32, false},
  };
  int before = fails;
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
    PrecisionChoice pc;
    char err[256];
    if (precision_resolve(rules[i].target, rules[i].req, &pc, err, sizeof err) || pc.storage != rules[i].storage ||
        pc.compute != rules[i].compute || pc.loss_scaling != rules[i].scaling) {
      fprintf(stderr, "FAIL precision %s on %s\n", rules[i].req ? rules[i].req : "(default)",
              rules[i].target ? rules[i].target : "(default)");
      fails++;
    }
  }
  struct {
    const char *target, *req, *msg;
  } errs[] = {
      {"sm_60", "bf16", "bf16 needs compute capability 8.0 or newer; sm_60 (Tesla P100) has no bf16 arithmetic: use "
                        "--precision fp16"},
      {"sm_75", "bf16", "bf16 needs compute capability 8.0 or newer; sm_75 (Tesla T4 / GeForce RTX 20xx) has no bf16 "
                        "arithmetic: use --precision fp16"},
      {"sm_62", "auto", "unknown target `sm_62` (targets: cpu, sm_60, sm_61, sm_70, sm_75, sm_80, sm_86, sm_89, sm_90)"},
      {"cpu", "fp8", "unknown precision `fp8` (auto, fp32, fp16, bf16)"},
  };
  for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
    PrecisionChoice pc;
    char err[256] = "";
    if (!precision_resolve(errs[i].target, errs[i].req, &pc, err, sizeof err) || strcmp(err, errs[i].msg)) {
      fprintf(stderr, "FAIL %s on %s: got \"%s\"\n  want \"%s\"\n", errs[i].req, errs[i].target, err, errs[i].msg);
      fails++;
    }
  }
  printf("%s device table and auto rules\n", fails > before ? "FAIL" : "ok");
}

/* ----------------------------------------------------- models vs fp32 */

/* Fills inputs and params alike in every model: params in +-[0.2, 1],
 * float inputs N(0, 1), those whose name starts with x or q times `scale`,
 * plus `offset`; i32 inputs in [0, classes). */
static void fill(TModel *t, uint64_t seed, int classes, double scale, double offset) {
  DuetRng r;
  duet_rng_seed(&r, seed, 0);
  Graph *g = t->g;
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    int id = tmodel_tensor(t, v);
    if (id < 0 || (v->op != OP_INPUT && v->op != OP_PARAM)) continue;
    /* a pipelined session's data inputs hold all micro-batches */
    int64_t n = shape_numel(&v->shape) * (v->op == OP_INPUT && g->train.micro_batches > 1 ? g->train.micro_batches : 1);
    void *p = duet_session_tensor(t->s, id);
    for (int64_t j = 0; j < n; j++) {
      if (v->dtype == DT_I32) {
        ((int32_t *)p)[j] = (int32_t)(duet_rng_next(&r) % (uint64_t)(classes ? classes : 1));
        continue;
      }
      double x = v->op == OP_PARAM ? (0.2 + 0.8 * duet_rng_uniform(&r)) * (duet_rng_next(&r) & 1 ? 1 : -1)
                                   : strchr("xq", v->attr.name[0]) ? offset + scale * duet_rng_normal(&r)
                                                                    : duet_rng_normal(&r);
      ((float *)p)[j] = (float)x;
    }
  }
}

static int run_grad(TModel *t) {
  if (duet_session_run(t->s, DUET_RUN_GRAD)) {
    fprintf(stderr, "FAIL run: %s\n", duet_session_error(t->s));
    return 1;
  }
  return 0;
}

static float loss_of(TModel *t) { return *(float *)duet_session_tensor(t->s, tmodel_tensor(t, t->g->loss)); }

/* Every param's gradient normwise (max |g - g32| <= round16_tol x max
 * |g32|, its own depth: D x u16 + 2^-17, tests/test_util.c), and the loss
 * (|l - l32| <= round16_tol x max(|l32|, 1)).  Measured: at most 0.74 of
 * the bound (the attention case's query weights in fp16, where the
 * softmax's backward amplifies most), 0.1 to 0.4 elsewhere. */
static void compare(const char *name, const char *prec, TModel *t, TModel *t32) {
  double worst = 0; /* the largest fraction of its tolerance a tensor used */
  int before = fails;
  const char *worst_p = "loss";
  const int *depth = tmodel_round16_depth(t);
  double tl = round16_tol(prec, depth[t->g->loss->id]);
  double dl = fabs(loss_of(t) - loss_of(t32)) / fmax(fabs(loss_of(t32)), 1);
  if (!(dl <= tl)) {
    fprintf(stderr, "FAIL %s %s: loss %.7g, fp32 %.7g (tolerance %.3g relative, depth %d)\n", name, prec, loss_of(t),
            loss_of(t32), tl, depth[t->g->loss->id]);
    fails++;
  }
  worst = dl / tl;
  for (int i = 0; i < t32->g->n_values; i++) {
    Value *p32 = t32->g->values[i];
    if (p32->op != OP_PARAM || !p32->grad) continue;
    Value *p = tmodel_param(t, p32->attr.name);
    if (!p || !p->grad || p->grad->dtype != DT_F32) {
      fprintf(stderr, "FAIL %s %s: param %s has no f32 gradient\n", name, prec, p32->attr.name);
      fails++;
      continue;
    }
    const float *g = duet_session_tensor(t->s, tmodel_tensor(t, p->grad));
    const float *g32 = duet_session_tensor(t32->s, tmodel_tensor(t32, p32->grad));
    int64_t n = shape_numel(&p->shape);
    char what[200];
    snprintf(what, sizeof what, "%s %s: d loss / d %s", name, prec, p32->attr.name);
    double tol = round16_tol(prec, depth[p->grad->id]);
    double used; /* of the bound: max |g - g32| / (tol max |g32|); NaN and infinity fail */
    if (check_normwise(what, g, g32, n, tol, 0, &used)) fails++;
    if (used > worst) worst = used, worst_p = p32->attr.name;
  }
  printf("%s %s %s: worst error %.2f of its tolerance (%s)\n", fails > before ? "FAIL" : "ok", name, prec, worst,
         worst_p);
}

typedef struct Case {
  const char *name, *src;
  int classes;
} Case;

#define HEAD "model t\n"
static const Case cases[] = {
    {"mlp", HEAD "input x: f32[16,12]\ninput y: i32[16]\n"
                 "block linear(h, out) {\n  param w: [dim(h, -1), out] = xavier_uniform\n"
                 "  param b: [out] = normal(0.1)\n  return h @ w + b\n}\n"
                 "loss = cross_entropy(linear(relu(linear(x, 32)), 5), y)\n", 5},
    {"gelu_residual", HEAD "input x: f32[8,16]\nparam w: [16,16]\nparam v: [16,16]\ninput r: f32[8,16]\n"
                           "h = x + gelu(x @ w) @ v\nloss = mean(h * r)\n", 0},
    {"layernorm", HEAD "input x: f32[6,16]\nparam w0: [16,16]\nparam w: [16]\nparam b: [16]\ninput r: f32[6,16]\n"
                  "loss = mean(layernorm(x @ w0, w, b) * r)\n", 0},
    {"attention", HEAD "input x: f32[2,8,16]\nparam wq: [16,16]\nparam wk: [16,16]\nparam wv: [16,16]\n"
                  "input r: f32[2,8,16]\n"
                  "loss = mean(attention(x @ wq, x @ wk, x @ wv, heads = 2, causal = true) * r)\n", 0},
    {"embedding_tied", HEAD "param e: [11,8]\ninput i: i32[4,6]\ninput y: i32[4,6]\nparam w: [8,8]\n"
                       "loss = cross_entropy((embedding(e, i) @ w) @ transpose(e), y)\n", 11},
    {"conv_pool", HEAD "input x: f32[2,3,8,8]\nparam w: [4,3,3,3]\nparam b: [4]\ninput r: f32[2,4,3,3]\n"
                  "loss = mean(max_pool2d(relu(conv2d(x, w, b, padding = 1)), 2, stride = 3) * r)\n", 0},
    /* issue 19: a LLaMA block (rmsnorm, rope, grouped-query attention,
     * SwiGLU), the elementwise ops and softmax on a 16-bit GEMM's result,
     * and mse_loss */
    {"llama_block", HEAD "input x: f32[2,8,16]\nparam wq: [16,16]\nparam wk: [16,8]\nparam wv: [16,8]\nparam g: [16]\n"
                    "param w1: [16,32]\nparam w3: [16,32]\nparam w2: [32,16]\ninput r: f32[2,8,16]\n"
                    "h = rmsnorm(x, g)\nq = rope(h @ wq, heads = 4)\nk = rope(h @ wk, heads = 2)\n"
                    "a = x + attention(q, k, h @ wv, heads = 4, kv_heads = 2, causal = true)\n"
                    "loss = mean((a + (silu(a @ w1) * (a @ w3)) @ w2) * r)\n", 0},
    {"elementwise", HEAD "input x: f32[8,16]\nparam w: [16,16]\ninput r: f32[8,16]\nh = x @ w\n"
                    "loss = mean((tanh(h) + sigmoid(h) * 2 + exp(h * 0.25) + log(h * h + 1) + softmax(h) * 4 + "
                    "softmax(h, axis = 0) * 3) * r)\n", 0},
    {"mse_loss", HEAD "input x: f32[8,16]\nparam w: [16,4]\ninput y: f32[8,4]\nloss = mse_loss(x @ w, y)\n", 0},
    {"views", HEAD "input x: f32[4,6]\nparam w: [6,6]\nparam u: [6,2]\ninput r: f32[4,5]\n"
              "h = x @ w\na, c = split(h, 2)\nloss = mean(concat(a * c, reshape(transpose(h @ u), 4, 2), axis = 1) * r) + "
              "mean(sum(h, axis = 0)) + mean(max(h, axis = 1))\n", 0},
};

static void model_cases(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const Case *c = &cases[i];
    const char *precs[2] = {"fp16", "bf16"};
    FrontendOptions fo = {.float_dtype = DT_F32};
    TModel t32;
    if (tmodel_open_prec(&t32, c->name, c->src, &fo, "fp32")) {
      fails++;
      continue;
    }
    fill(&t32, 42, c->classes, 1, 0);
    if (run_grad(&t32)) fails++;
    for (int k = 0; k < 2; k++) {
      TModel t;
      if (tmodel_open_prec(&t, c->name, c->src, &fo, precs[k])) {
        fails++;
        continue;
      }
      fill(&t, 42, c->classes, 1, 0);
      /* a fixed loss scale of 2^10: at the default 2^16 the views case's
       * gradients (up to ~1e5 scaled) overflow f16, and a gradient run has
       * no scaler to back off */
      DuetScaler sc = {.scale = 1024};
      duet_session_set_scaler(t.s, &sc);
      if (run_grad(&t)) fails++;
      else compare(c->name, precs[k], &t, &t32);
      tmodel_close(&t);
    }
    tmodel_close(&t32);
  }
}

/* The precision classes of the ops of issue 19 (ir/ops.def's prec column)
 * in an fp16 program, after the precision pass: on a 16-bit GEMM's result,
 * tanh, sigmoid and silu store fp16 (PyTorch's autocast runs them in the
 * input's dtype); exp and log (autocast's fp32 list: their range), softmax,
 * rmsnorm's normalisation, rope, attention and mse_loss compute in f32 and
 * give f32; and the gradients of rmsnorm, softmax and rope too. */
static void classes(void) {
  const char *src = HEAD "input x: f32[2,8,16]\nparam w: [16,16]\nparam g: [16]\ninput y: f32[2,8,16]\nh = x @ w\n"
                         "loss = mean(tanh(h) + sigmoid(h) + silu(h) + exp(h) + log(h * h + 1) + softmax(h) + "
                         "rmsnorm(h, g) + attention(rope(h, 4), rope(h, 4), h, heads = 4, causal = true) * y) + "
                         "mse_loss(h, y)\n";
  static const OpKind ops[] = {OP_TANH, OP_SIGMOID, OP_SILU, OP_EXP, OP_LOG, OP_SOFTMAX, OP_RMS_NORM, OP_ROPE,
                               OP_ATTENTION, OP_MSE_LOSS, OP_SOFTMAX_GRAD, OP_RMS_NORM_GRAD, OP_ROPE_GRAD, OP_MATMUL};
  static const DType want[] = {DT_F16, DT_F16, DT_F16, DT_F32, DT_F32, DT_F32, DT_F32, DT_F32,
                               DT_F32, DT_F32, DT_F32, DT_F32, DT_F32, DT_F16};
  Arena *a = arena_new(1 << 16);
  Diag d = {.out = stderr};
  Source s = {.name = "classes", .text = src, .len = strlen(src)};
  FrontendOptions fo = {.float_dtype = DT_F32};
  Graph *g = frontend_compile(a, &d, &s, &fo);
  PassCtx pc = {.diag = &d, .verify = true, .stop_after = "precision", .precision = "fp16"};
  int before = fails;
  if (!g || passes_run(g, &pc)) {
    fprintf(stderr, "FAIL precision classes: does not compile\n");
    fails++;
  }
  for (int k = 0; g && k < (int)(sizeof ops / sizeof *ops); k++) {
    int seen = 0;
    for (int i = 0; i < g->n_values; i++) {
      const Value *v = g->values[i];
      if (v->op != ops[k]) continue;
      seen++;
      if (v->dtype != want[k]) {
        fprintf(stderr, "FAIL precision classes: %s %%%d is %s in fp16, want %s\n", op_info[ops[k]].name, v->id,
                dtype_name(v->dtype), dtype_name(want[k]));
        fails++;
      }
    }
    if (!seen) {
      fprintf(stderr, "FAIL precision classes: no %s in the graph\n", op_info[ops[k]].name);
      fails++;
    }
  }
  printf("%s precision classes of the issue-19 ops in fp16\n", fails > before ? "FAIL" : "ok");
  arena_free(a);
}

/* ---------------------------------------------------- numerical faults */

/* 65536 terms of about 0.01: an f16 running sum stalls near 32 (its ulp
 * there exceeds twice the term); duet's GEMMs and sums accumulate in f32 and
 * round once, so fp16 gives the f32 result to f16 precision (2^-11). */
static void long_sums(void) {
  const char *src = HEAD "input x: f32[1,65536]\nparam w: [65536,1] = ones\nparam a: [65536] = ones\n"
                         "loss = mean(x @ w) + sum(reshape(x, 65536) * a) * 0.001\n";
  FrontendOptions fo = {.float_dtype = DT_F32};
  TModel t;
  if (tmodel_open_prec(&t, "long_sums", src, &fo, "fp16")) {
    fails++;
    return;
  }
  float *x = duet_session_tensor(t.s, tmodel_tensor(&t, t.g->values[0]));
  for (int j = 0; j < 65536; j++) x[j] = 0.01f;
  if (run_grad(&t)) {
    fails++;
    return;
  }
  double term = duet_f32_from_f16(duet_f16_from_f32(0.01f)); /* x as the GEMM sees it */
  double want = 65536 * term + 65536 * 0.01 * 0.001;
  int before = fails;
  fails += check_close("fp16: sum of 65536 small terms", loss_of(&t), want, 0, 1e-3);
  printf("%s long sums in fp16: %.6g (exact %.6g)\n", fails > before ? "FAIL" : "ok", loss_of(&t), want);
  tmodel_close(&t);
}

/* Gradients of about 1e-8 (the loss times 1e-7): in fp16 without loss
 * scaling the output gradient (1e-7 / 32) is below half of f16's smallest
 * subnormal (2^-25 ~ 3e-8) and flushes to zero; with the default scale 2^16
 * it survives, and Adam's moments (the second ~1e-17, far below f16's
 * range) are kept in f32, so one AdamW step matches fp32's to the
 * precision of the fp16 gradient (x rounded to f16, a few roundings: 1e-2). */
static void tiny_gradients(void) {
  const char *src = HEAD "input x: f32[8,16]\nparam w: [16,4]\nloss = mean(x @ w) * 0.0000001\n"
                         "train {\n  optimizer = adamw(lr = 0.001)\n  batch = 8\n}\n";
  FrontendOptions fo = {.float_dtype = DT_F32};
  TModel t32, t16, t1;
  if (tmodel_open_prec(&t32, "tiny", src, &fo, "fp32") || tmodel_open_prec(&t16, "tiny", src, &fo, "fp16") ||
      tmodel_open_prec(&t1, "tiny", src, &fo, "fp16")) {
    fails++;
    return;
  }
  DuetScaler one = {.scale = 1};
  duet_session_set_scaler(t1.s, &one);
  TModel *ts[3] = {&t32, &t16, &t1};
  for (int k = 0; k < 3; k++) {
    fill(ts[k], 3, 0, 1, 0);
    if (duet_session_run(ts[k]->s, DUET_RUN_TRAIN)) {
      fprintf(stderr, "FAIL tiny gradients: %s\n", duet_session_error(ts[k]->s));
      fails++;
      return;
    }
  }
  int before = fails;
  const char *names[3] = {"w", "w.exp_avg", "w.exp_avg_sq"};
  for (int q = 0; q < 3; q++) {
    int id32 = -1, id16 = -1;
    for (int i = 0; i < t32.cp->prog.n_tensors; i++)
      if (!strcmp(t32.cp->prog.tensors[i].name, names[q])) id32 = i;
    for (int i = 0; i < t16.cp->prog.n_tensors; i++)
      if (!strcmp(t16.cp->prog.tensors[i].name, names[q])) id16 = i;
    if (id32 < 0 || id16 < 0 || t16.cp->prog.tensors[id16].dtype != DUET_F32) {
      fprintf(stderr, "FAIL tiny gradients: %s missing or not f32 in the fp16 program\n", names[q]);
      fails++;
      continue;
    }
    const float *a = duet_session_tensor(t32.s, id32), *b = duet_session_tensor(t16.s, id16);
    for (int j = 0; j < 64; j++) {
      char what[64];
      snprintf(what, sizeof what, "fp16 %s[%d] after one AdamW step", names[q], j);
      /* w moves by about lr = 1e-3, its update as precise as the gradient (1e-2): atol 1e-5 */
      fails += check_close(what, b[j], a[j], q == 0 ? 1e-5 : 0, q == 0 ? 0 : q == 1 ? 1e-2 : 2e-2);
    }
    if (q == 2) printf("   second moment: fp32 %.3g, fp16 %.3g\n", a[0], b[0]);
  }
  /* without the scale, the fp16 gradient is flushed to zero */
  Value *w1 = tmodel_param(&t1, "w");
  const float *g1 = duet_session_tensor(t1.s, tmodel_tensor(&t1, w1->grad));
  int zeros = 0;
  for (int j = 0; j < 64; j++) zeros += g1[j] == 0;
  if (zeros < 64) {
    fprintf(stderr, "FAIL tiny gradients: with loss scale 1 only %d of 64 fp16 gradients underflowed\n", zeros);
    fails++;
  }
  printf("%s tiny gradients and Adam state (scale 1: %d of 64 gradients flushed to zero)\n",
         fails > before ? "FAIL" : "ok", zeros);
  for (int k = 0; k < 3; k++) tmodel_close(ts[k]);
}

/* Logits of up to ~3e4 (f16 holds them; exp() of them does not) and
 * attention scores as large: softmax and cross-entropy run in f32 with the
 * maximum subtracted, so fp16 gives fp32's loss and gradients.  (The loss
 * scale is 1 here: these gradients reach 1e4, and 2^16 times that overflows
 * f16, which the scaler would answer by skipping the step.) */
static void large_logits(void) {
  const char *src = HEAD "input x: f32[8,16]\ninput y: i32[8]\nparam w: [16,6]\n"
                         "input q: f32[1,4,8]\nparam wq: [8,8]\ninput r: f32[1,4,8]\n"
                         "loss = cross_entropy(x @ w, y) + mean(attention(q @ wq, q, q, heads = 1) * r)\n";
  FrontendOptions fo = {.float_dtype = DT_F32};
  TModel t32, t16;
  if (tmodel_open_prec(&t32, "large", src, &fo, "fp32") || tmodel_open_prec(&t16, "large", src, &fo, "fp16")) {
    fails++;
    return;
  }
  fill(&t32, 5, 6, 3000, 0);
  fill(&t16, 5, 6, 3000, 0);
  DuetScaler one = {.scale = 1};
  duet_session_set_scaler(t16.s, &one);
  if (run_grad(&t32) || run_grad(&t16)) {
    fails++;
    return;
  }
  int before = fails;
  if (!isfinite(loss_of(&t16))) {
    fprintf(stderr, "FAIL large logits: fp16 loss %g\n", loss_of(&t16));
    fails++;
  }
  compare("large_logits", "fp16", &t16, &t32);
  printf("%s large logits: loss fp16 %.6g, fp32 %.6g\n", fails > before ? "FAIL" : "ok", loss_of(&t16), loss_of(&t32));
  tmodel_close(&t32);
  tmodel_close(&t16);
}

/* Rows 1000 + 1e-3 noise: two-pass f32 statistics give a small positive
 * variance (a one-pass E[x^2] - E[x]^2 in 16 bits would give garbage or a
 * negative number).  An f32 input normalises as in fp32; after a 16-bit
 * GEMM (whose f16 result cannot hold the noise) the output stays finite. */
static void constant_rows(void) {
  const char *src = HEAD "input x: f32[4,64]\nparam w: [64] = ones\nparam b: [64] = zeros\nparam e: [64,64]\n"
                         "input r: f32[4,64]\n"
                         "loss = mean(layernorm(x, w, b) * r) + mean(layernorm(x @ e, w, b) * r) * 0.001\n";
  FrontendOptions fo = {.float_dtype = DT_F32};
  TModel t32, t16;
  if (tmodel_open_prec(&t32, "rows", src, &fo, "fp32") || tmodel_open_prec(&t16, "rows", src, &fo, "fp16")) {
    fails++;
    return;
  }
  fill(&t32, 9, 0, 1e-3, 1000);
  fill(&t16, 9, 0, 1e-3, 1000);
  /* e: identity plus small noise */
  for (int k = 0; k < 2; k++) {
    TModel *t = k ? &t16 : &t32;
    float *e = duet_session_tensor(t->s, tmodel_tensor(t, tmodel_param(t, "e")));
    for (int i = 0; i < 64 * 64; i++) e[i] = i / 64 == i % 64 ? 1.0f : 0.0f;
  }
  if (run_grad(&t32) || run_grad(&t16)) {
    fails++;
    return;
  }
  int before = fails;
  Value *w = tmodel_param(&t16, "w");
  const float *gw = duet_session_tensor(t16.s, tmodel_tensor(&t16, w->grad));
  bool finite = isfinite(loss_of(&t16));
  for (int j = 0; j < 64; j++) finite &= isfinite(gw[j]) != 0;
  if (!finite) {
    fprintf(stderr, "FAIL constant rows: fp16 loss or gradients not finite\n");
    fails++;
  }
  fails += check_close("constant rows: fp16 loss (f32-input layernorm dominates)", loss_of(&t16), loss_of(&t32), 1e-3,
                       1e-2);
  printf("%s nearly constant layernorm rows: loss fp16 %.6g, fp32 %.6g\n", fails > before ? "FAIL" : "ok",
         loss_of(&t16), loss_of(&t32));
  tmodel_close(&t32);
  tmodel_close(&t16);
}

/* Dynamic loss scaling in the runtime: an overflowing step leaves params
 * and Adam state untouched, does not count as an AdamW step, halves the
 * scale and names the first param whose gradient overflowed; good steps
 * update, and 2,000 of them in a row double the scale (GradScaler). */
static void scaler_steps(void) {
  const char *src = HEAD "input x: f32[8,16]\ninput y: i32[8]\nparam w: [16,4]\nparam b: [4] = zeros\n"
                         "loss = cross_entropy(x @ w + b, y)\ntrain {\n  batch = 8\n}\n";
  FrontendOptions fo = {.float_dtype = DT_F32};
  TModel t;
  if (tmodel_open_prec(&t, "scaler", src, &fo, "fp16")) {
    fails++;
    return;
  }
  int before = fails;
  fill(&t, 11, 4, 1, 0);
  Value *w = tmodel_param(&t, "w");
  float *pw = duet_session_tensor(t.s, tmodel_tensor(&t, w));
  float w0[64];
  memcpy(w0, pw, sizeof w0);
  DuetScaler big = {.scale = 0x1p40};
  duet_session_set_scaler(t.s, &big);
  if (duet_session_run(t.s, DUET_RUN_TRAIN)) {
    fprintf(stderr, "FAIL scaler: %s\n", duet_session_error(t.s));
    fails++;
    return;
  }
  DuetScaler sc = duet_session_scaler(t.s);
  if (!sc.last_skipped || sc.skipped != 1 || sc.scale != 0x1p39 || sc.growth != 0 || !sc.first_overflow ||
      strcmp(sc.first_overflow, "w") || memcmp(w0, pw, sizeof w0)) {
    fprintf(stderr, "FAIL scaler: an overflow at 2^40 gave skipped %d/%lld, scale %g, first %s, params %s\n",
            sc.last_skipped, (long long)sc.skipped, sc.scale, sc.first_overflow ? sc.first_overflow : "(none)",
            memcmp(w0, pw, sizeof w0) ? "changed" : "unchanged");
    fails++;
  }
  DuetScaler mid = {.scale = 1024, .skipped = 1};
  duet_session_set_scaler(t.s, &mid);
  for (int i = 0; i < DUET_SCALE_GROWTH_INTERVAL; i++) {
    if (duet_session_run(t.s, DUET_RUN_TRAIN)) {
      fprintf(stderr, "FAIL scaler: %s\n", duet_session_error(t.s));
      fails++;
      return;
    }
    sc = duet_session_scaler(t.s);
    if (i == 0 && (sc.last_skipped || sc.growth != 1 || !memcmp(w0, pw, sizeof w0))) {
      fprintf(stderr, "FAIL scaler: a good step at 1024 was skipped or did not update\n");
      fails++;
    }
    if (i == DUET_SCALE_GROWTH_INTERVAL - 2 && sc.scale != 1024) {
      fprintf(stderr, "FAIL scaler: the scale grew before 2000 good steps\n");
      fails++;
    }
  }
  if (sc.scale != 2048 || sc.growth != 0 || sc.skipped != 1 || duet_session_step(t.s) != 2001) {
    fprintf(stderr, "FAIL scaler: after 2000 good steps scale %g growth %lld skipped %lld step %lld\n", sc.scale,
            (long long)sc.growth, (long long)sc.skipped, (long long)duet_session_step(t.s));
    fails++;
  }
  printf("%s loss scaler: overflow skips and halves, 2000 good steps double\n", fails > before ? "FAIL" : "ok");
  tmodel_close(&t);
}

/* Gradient accumulation over micro-batches with fp16 loss scaling: the
 * loss must be scaled by S once and divided by M once, and each
 * micro-batch's gradients unscaled once before they are summed.  One SGD
 * step (lr 0.5, no momentum or decay) of the pipelined session with M
 * micro-batches recovers the gradient as (w0 - w1) / lr, which must match
 * the fp32 gradient of the whole batch in one piece (normwise within
 * round16_tol of its depth, and the f32 rounding of the recovery); a
 * factor of M or S anywhere misses by orders of magnitude.  Then an overflow in any
 * micro-batch skips the whole step once, naming the param. */
static void micro_batches(void) {
  const char *src = HEAD "input x: f32[batch,12]\ninput y: i32[batch]\n"
                         "block linear(h, out) {\n  param w: [dim(h, -1), out] = xavier_uniform\n"
                         "  param b: [out] = normal(0.1)\n  return h @ w + b\n}\n"
                         "loss = cross_entropy(linear(relu(linear(x, 32)), 5), y)\n"
                         "train {\n  batch = 16\n  optimizer = sgd(lr = 0.5, momentum = 0, weight_decay = 0)\n}\n";
  const double lr = 0.5;
  FrontendOptions fo = {.float_dtype = DT_F32};
  TModel ref;
  if (tmodel_open_prec(&ref, "micro", src, &fo, "fp32")) {
    fails++;
    return;
  }
  fill(&ref, 7, 5, 1, 0);
  if (run_grad(&ref)) {
    fails++;
    tmodel_close(&ref);
    return;
  }
  static const struct {
    const char *prec;
    int M;
  } runs[] = {{"fp32", 4}, {"fp16", 4}, {"fp16", 2}, {"bf16", 4}};
  for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
    int before = fails;
    FrontendOptions fm = {.float_dtype = DT_F32, .micro_batches = runs[r].M};
    TModel t;
    if (tmodel_open_prec(&t, "micro", src, &fm, runs[r].prec)) {
      fails++;
      continue;
    }
    fill(&t, 7, 5, 1, 0);
    if (!strcmp(runs[r].prec, "fp16")) duet_session_set_scaler(t.s, &(DuetScaler){.scale = 1024});
    /* params before the step */
    float *w0[8] = {0};
    int np = 0;
    for (int i = 0; i < ref.g->n_values && np < 8; i++) {
      Value *p = ref.g->values[i];
      if (p->op != OP_PARAM) continue;
      Value *q = tmodel_param(&t, p->attr.name);
      int64_t n = shape_numel(&p->shape);
      w0[np] = malloc((size_t)n * sizeof(float));
      memcpy(w0[np++], duet_session_tensor(t.s, tmodel_tensor(&t, q)), (size_t)n * sizeof(float));
    }
    if (duet_session_run(t.s, DUET_RUN_TRAIN)) {
      fprintf(stderr, "FAIL micro-batches %s M=%d: %s\n", runs[r].prec, runs[r].M, duet_session_error(t.s));
      fails++;
    } else {
      double worst = 0; /* the largest fraction of its tolerance a tensor used */
      const int *depth = tmodel_round16_depth(&t);
      if (check_close("micro-batches: mean loss", loss_of(&t), loss_of(&ref), 0,
                      round16_tol(runs[r].prec, depth[t.g->loss->id])))
        fails++;
      np = 0;
      for (int i = 0; i < ref.g->n_values && np < 8; i++) {
        Value *p = ref.g->values[i];
        if (p->op != OP_PARAM) continue;
        const float *g32 = duet_session_tensor(ref.s, tmodel_tensor(&ref, p->grad));
        const float *w1 = duet_session_tensor(t.s, tmodel_tensor(&t, tmodel_param(&t, p->attr.name)));
        const float *w = w0[np++];
        int64_t n = shape_numel(&p->shape);
        float *step = malloc((size_t)n * sizeof *step); /* the gradient the SGD step applied */
        double big_w = 0, big_g = 0;
        for (int64_t j = 0; j < n; j++) {
          step[j] = (float)((w[j] - w1[j]) / lr);
          big_w = fmax(big_w, fabs(w[j]));
          big_g = fmax(big_g, fabs(g32[j])); /* a NaN here fails check_normwise below */
        }
        /* round16_tol of the gradient, and the recovery (w0 - w1) / lr: w1 is
         * rounded to f32, an error of up to 2^-24 |w| each side, over lr */
        double tol = round16_tol(runs[r].prec, depth[tmodel_param(&t, p->attr.name)->grad->id]) +
                     (big_g > 0 ? 0x1p-24 * 2 * big_w / lr / big_g : 0);
        char what[200];
        snprintf(what, sizeof what, "micro-batches %s M=%d: d loss / d %s", runs[r].prec, runs[r].M, p->attr.name);
        double used;
        if (check_normwise(what, step, g32, n, tol, 0, &used)) fails++;
        if (used > worst) worst = used; /* infinite on a NaN: printed as inf */
        free(step);
      }
      printf("%s micro-batches %s M=%d: gradients from one SGD step vs fp32 whole batch, worst %.2f of the tolerance\n",
             fails > before ? "FAIL" : "ok", runs[r].prec, runs[r].M, worst);
    }
    /* an overflow in the micro-batches: one skipped step, params untouched */
    if (!strcmp(runs[r].prec, "fp16") && fails == before) {
      float *w1 = duet_session_tensor(t.s, tmodel_tensor(&t, tmodel_param(&t, "linear1.w")));
      memcpy(w0[0], w1, 12 * 32 * sizeof(float));
      duet_session_set_scaler(t.s, &(DuetScaler){.scale = 0x1p40});
      DuetScaler sc = {0};
      if (duet_session_run(t.s, DUET_RUN_TRAIN) == 0) sc = duet_session_scaler(t.s);
      if (!sc.last_skipped || sc.skipped != 1 || sc.scale != 0x1p39 || !sc.first_overflow ||
          strcmp(sc.first_overflow, "linear1.w") || memcmp(w0[0], w1, 12 * 32 * sizeof(float))) {
        fprintf(stderr, "FAIL micro-batches %s M=%d: an overflow at 2^40 gave skipped %d/%lld, scale %g, first %s\n",
                runs[r].prec, runs[r].M, sc.last_skipped, (long long)sc.skipped, sc.scale,
                sc.first_overflow ? sc.first_overflow : "(none)");
        fails++;
      } else {
        printf("ok micro-batches %s M=%d: an overflow skips the step once (scale 2^40 -> 2^39, first linear1.w)\n",
               runs[r].prec, runs[r].M);
      }
    }
    for (int k = 0; k < np; k++) free(w0[k]);
    tmodel_close(&t);
  }
  tmodel_close(&ref);
}

int main(void) {
  conversions();
  device_rules();
  model_cases();
  classes();
  long_sums();
  tiny_gradients();
  large_logits();
  constant_rows();
  scaler_steps();
  micro_batches();
  printf("%s\n", fails ? "FAILED" : "all passed");
  return fails != 0;
}
