/* tests/test_quantize.c: post-training int8 weight quantization (the
 * quantize pass, passes/quantize.c; duet_quantize_i8, runtime/quant.c;
 * loading a checkpoint's f32 weights into int8 ones, runtime/checkpoint.c).
 *
 *   quantizer  duet_quantize_i8 against hand-worked values: scale = max|w| /
 *              127 per output channel (or per tensor), rounding half to even
 *              (63.5 -> 64, 2.5 -> 2, -2.5 -> -2, 0.5 -> 0), an all-zero
 *              channel (scale 1, q 0), a near-zero one (max|w| / 127 below
 *              FLT_MIN: scale FLT_MIN, never 0 or NaN), and on random
 *              weights every w within scale / 2 of q x scale, |q| <= 127
 *              with the channel's largest |w| at +-127; bad shapes refused.
 *   pass       which weights become i8 params with which scale shapes (a
 *              convolution [out, in, kh, kw], x @ w [in, out], x @
 *              transpose(v) [out, in]); biases stay f32; no backward, no
 *              optimizer state is left.
 *   forward    an f32 checkpoint loaded into the quantized program
 *              (duet_checkpoint_load_weights) gives the int8 weights and
 *              scales duet_quantize_i8 gives, and logits equal, within f32
 *              rounding (1e-5 + 1e-5 |ref|), to those of the unmodified f32
 *              program run on the dequantized weights q x scale: the
 *              dequantize kernel and the load path are right.  Against the
 *              f32 weights, per-channel scales are closer than per-tensor
 *              ones on weights whose channels differ in magnitude (x100
 *              between channels).  An all-zero weight channel loads to
 *              finite logits.
 *   errors     a checkpoint of another model is refused (exact text). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

static int fails;
#define CHECK(c, ...)                          \
  do {                                         \
    if (!(c)) {                                \
      fprintf(stderr, "FAIL: " __VA_ARGS__);   \
      fputc('\n', stderr);                     \
      fails++;                                 \
    }                                          \
  } while (0)

static int test_quantizer(void) {
  int f0 = fails;
  /* per output channel of a [6, 2] weight (x @ w: the channels are the columns) */
  const float w[12] = {127, 0, 63.5f, 0, -63.5f, 0, 0.5f, 0, 1.5f, 0, -2.5f, 0};
  const int64_t shape[2] = {6, 2}, ssh[2] = {1, 2};
  signed char q[12];
  float s[2];
  CHECK(!duet_quantize_i8(w, 2, shape, ssh, q, s), "quantizer refused a good shape");
  const signed char want[6] = {127, 64, -64, 0, 2, -2}; /* half to even: 63.5 -> 64, 0.5 -> 0, 1.5 -> 2, -2.5 -> -2 */
  CHECK(s[0] == 1.0f, "scale of channel 0: %a, want 1 (127 / 127)", s[0]);
  for (int i = 0; i < 6; i++) CHECK(q[2 * i] == want[i], "q[%d] = %d, want %d", i, q[2 * i], want[i]);
  /* the all-zero channel: scale 1, q 0 */
  CHECK(s[1] == 1.0f, "all-zero channel: scale %a, want 1", s[1]);
  for (int i = 0; i < 6; i++) CHECK(q[2 * i + 1] == 0, "all-zero channel: q %d", q[2 * i + 1]);
  /* 2.5 rounds to 2 (even), 3.5 to 4 */
  const float w2[3] = {127, 2.5f, 3.5f};
  const int64_t sh2[1] = {3}, ss2[1] = {1};
  signed char q2[3];
  float s2;
  duet_quantize_i8(w2, 1, sh2, ss2, q2, &s2);
  CHECK(q2[1] == 2 && q2[2] == 4, "2.5 -> %d (want 2), 3.5 -> %d (want 4)", q2[1], q2[2]);
  /* near-zero channels: max / 127 below FLT_MIN */
  const float w3[4] = {1e-40f, -1e-40f, 1e-37f, -5e-38f};
  const int64_t sh3[2] = {2, 2}, ss3[2] = {2, 1};
  signed char q3[4];
  float s3[2];
  duet_quantize_i8(w3, 2, sh3, ss3, q3, s3);
  for (int c = 0; c < 2; c++) {
    CHECK(isfinite(s3[c]) && s3[c] >= FLT_MIN, "near-zero channel %d: scale %a, want >= FLT_MIN", c, s3[c]);
    for (int i = 0; i < 2; i++) {
      double err = fabs((double)w3[2 * c + i] - (double)q3[2 * c + i] * s3[c]);
      CHECK(err <= s3[c] / 2.0, "near-zero channel %d: |w - q s| = %g > s / 2", c, err);
    }
  }
  CHECK(q3[0] == 0 && q3[1] == 0, "a channel of +-1e-40: q %d %d, want 0", q3[0], q3[1]);
  CHECK(q3[2] == 9 && q3[3] == -4, "1e-37, -5e-38 with scale FLT_MIN: q %d %d, want 9, -4 (8.507, -4.254)", q3[2],
        q3[3]);
  /* random [40, 7] weights, per channel (columns) and per tensor */
  enum { R = 40, C = 7 };
  float *wr = malloc(R * C * sizeof *wr), sc[C], st;
  signed char *qr = malloc(R * C);
  DuetRng rng;
  duet_rng_seed(&rng, 5, 0);
  for (int i = 0; i < R * C; i++) wr[i] = (float)(duet_rng_normal(&rng) * pow(10.0, i % C - 3));
  const int64_t shr[2] = {R, C}, ssc[2] = {1, C}, sst[2] = {1, 1};
  for (int per = 0; per < 2; per++) {
    CHECK(!duet_quantize_i8(wr, 2, shr, per ? sst : ssc, qr, per ? &st : sc), "random weights refused");
    for (int c = 0; c < C; c++) {
      float sj = per ? st : sc[c];
      double m = 0;
      for (int r = 0; r < R; r++)
        if (fabs(wr[r * C + c]) > m) m = fabs(wr[r * C + c]);
      if (!per) CHECK(sj == (float)m / 127.0f, "channel %d: scale %a, want max/127 = %a", c, sj, (float)m / 127.0f);
      int top = 0;
      for (int r = 0; r < R; r++) {
        double e = fabs((double)wr[r * C + c] - (double)qr[r * C + c] * sj);
        CHECK(e <= sj * (0.5 + 1e-6), "%s: w[%d,%d] off by %g > s/2 = %g", per ? "tensor" : "channel", r, c, e,
              sj / 2);
        CHECK(qr[r * C + c] >= -127 && qr[r * C + c] <= 127, "q out of range");
        top |= fabs(wr[r * C + c]) == m && abs(qr[r * C + c]) == 127;
      }
      if (!per) CHECK(top, "channel %d: its largest |w| is not +-127", c);
    }
  }
  free(wr), free(qr);
  const int64_t bad[2] = {1, 3};
  CHECK(duet_quantize_i8(w, 2, shape, bad, q, s) == -1, "scales [1, 3] for a [6, 2] weight accepted");
  printf("%s quantizer\n", fails == f0 ? "ok" : "FAIL");
  return fails != f0;
}

static const char *model_text(const char *name, char *buf, size_t n) {
  snprintf(buf, n,
           "model %s\n"
           "input x: f32[8, 18]\n"
           "input y: i32[8]\n"
           "param cw: [4, 2, 2, 2] = kaiming_uniform\n"
           "param w: [16, 6] = kaiming_uniform\n"
           "param b: [6] = zeros\n"
           "param v: [5, 6] = kaiming_uniform\n"
           "c = conv2d(reshape(x, 8, 2, 3, 3), cw, padding = 0)\n"
           "h = relu(flatten(c) @ w + b)\n"
           "loss = cross_entropy(h @ transpose(v), y)\n"
           "train {\n  batch = 8\n}\n",
           name);
  return buf;
}

static const DuetTensor *tensor(const DuetProgram *p, const char *name, int *id) {
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].name && !strcmp(p->tensors[i].name, name)) {
      if (id) *id = i;
      return &p->tensors[i];
    }
  return NULL;
}

static int test_pass(void) {
  int f0 = fails;
  char text[1024];
  FrontendOptions fo = {0};
  for (int per = 0; per < 2; per++) {
    TModel t;
    if (tmodel_open_quant(&t, "q.model", model_text("q", text, sizeof text), &fo, NULL, per ? "int8-tensor" : "int8")) {
      CHECK(0, "the quantized model does not compile");
      return 1;
    }
    const DuetProgram *p = &t.cp->prog;
    static const char *const names[3] = {"cw", "w", "v"};
    static const int64_t want[2][3][4] = {{{4, 1, 1, 1}, {1, 6}, {5, 1}}, {{1, 1, 1, 1}, {1, 1}, {1, 1}}};
    for (int k = 0; k < 3; k++) {
      char sn[32];
      snprintf(sn, sizeof sn, "%s.scale", names[k]);
      const DuetTensor *q = tensor(p, names[k], NULL), *s = tensor(p, sn, NULL);
      CHECK(q && q->dtype == DUET_I8 && q->region == DUET_MEM_PARAM && q->nbytes >= 1, "%s: not an i8 param", names[k]);
      CHECK(s && s->dtype == DUET_F32 && s->region == DUET_MEM_PARAM && q && s->rank == q->rank, "%s: no scales",
            names[k]);
      for (int d = 0; s && d < s->rank; d++)
        CHECK(s->shape[d] == want[per][k][d], "%s (%s) axis %d: %lld, want %lld", sn, per ? "tensor" : "channel", d,
              (long long)s->shape[d], (long long)want[per][k][d]);
    }
    const DuetTensor *b = tensor(p, "b", NULL);
    CHECK(b && b->dtype == DUET_F32, "the bias is no longer f32");
    CHECK(p->region_bytes[DUET_MEM_STATE] == 0, "optimizer state left: %lld bytes",
          (long long)p->region_bytes[DUET_MEM_STATE]);
    for (int i = 0; i < p->n_train; i++)
      CHECK(p->train[i].kind != DUET_STEP_GEMM || p->train[i].dtype == DUET_F32, "a non-f32 GEMM");
    CHECK(duet_program_quantized(p), "duet_program_quantized says no");
    tmodel_close(&t);
  }
  printf("%s pass\n", fails == f0 ? "ok" : "FAIL");
  return fails != f0;
}

/* Reads tensor `name` of session s into a malloc'd buffer. */
static void *read_tensor(TModel *t, DuetSession *s, const char *name) {
  int id;
  const DuetTensor *x = tensor(&t->cp->prog, name, &id);
  if (!x) return NULL;
  void *h = malloc((size_t)x->nbytes + 1);
  if (h && duet_session_read(s, id, 0, h, (size_t)x->nbytes)) h = (free(h), NULL);
  return h;
}

static int write_tensor(TModel *t, DuetSession *s, const char *name, const void *h) {
  int id;
  const DuetTensor *x = tensor(&t->cp->prog, name, &id);
  return !x || duet_session_write(s, id, 0, h, (size_t)x->nbytes);
}

/* logits of an evaluation of t's session over every row, into out[40] */
static int eval_logits(TModel *t, float *out) {
  duet_session_set_valid(t->s, INT32_MAX);
  if (duet_session_run(t->s, DUET_RUN_EVAL)) {
    fprintf(stderr, "FAIL: evaluation: %s\n", duet_session_error(t->s));
    return 1;
  }
  return duet_session_read(t->s, t->cp->prog.logits, 0, out, 40 * sizeof *out);
}

static int test_forward(const char *dir) {
  int f0 = fails;
  char text[1024], path[512], err[1024];
  snprintf(path, sizeof path, "%s/q.safetensors", dir);
  FrontendOptions fo = {0};
  TModel f, ref;
  if (tmodel_open(&f, "q.model", model_text("q", text, sizeof text), DT_F32) ||
      tmodel_open(&ref, "q.model", model_text("q", text, sizeof text), DT_F32)) {
    CHECK(0, "the f32 model does not compile");
    return 1;
  }
  DuetRng r;
  duet_rng_seed(&r, 3, 0);
  tmodel_fill(&f, f.s, &r, 5);
  /* channels of w differ by x100 (per-channel scales matter); channel 5 of w
   * all zero (a safe scale) */
  float *w = read_tensor(&f, f.s, "w");
  for (int i = 0; i < 16 * 6; i++) w[i] *= i % 6 == 5 ? 0.0f : i % 6 == 0 ? 100.0f : 1.0f;
  CHECK(!write_tensor(&f, f.s, "w", w), "writing w");
  free(w);
  DuetTrainState st = {0};
  if (duet_checkpoint_save(f.s, path, &st, err, sizeof err)) {
    CHECK(0, "saving: %s", err);
    return 1;
  }
  float lf[40], lq[2][40], lr[40];
  CHECK(!eval_logits(&f, lf), "f32 evaluation");
  static const char *const names[3] = {"cw", "w", "v"};
  static const char *const modes[2] = {"int8", "int8-tensor"};
  for (int per = 0; per < 2; per++) {
    TModel q;
    if (tmodel_open_quant(&q, "q.model", model_text("q", text, sizeof text), &fo, NULL, modes[per])) {
      CHECK(0, "the quantized model does not compile");
      return 1;
    }
    if (duet_checkpoint_load_weights(q.s, path, err, sizeof err)) {
      CHECK(0, "%s: loading the f32 checkpoint: %s", modes[per], err);
      tmodel_close(&q);
      continue;
    }
    /* the same inputs in every session; the reference: f32 weights q x scale */
    for (int k = 0; k < 2; k++) {
      const char *in = k ? "y" : "x";
      void *h = read_tensor(&f, f.s, in);
      CHECK(h && !write_tensor(&q, q.s, in, h) && !write_tensor(&ref, ref.s, in, h), "inputs");
      free(h);
    }
    void *bias = read_tensor(&f, f.s, "b");
    CHECK(bias && !write_tensor(&ref, ref.s, "b", bias), "bias");
    free(bias);
    for (int k = 0; k < 3; k++) {
      char sn[32];
      snprintf(sn, sizeof sn, "%s.scale", names[k]);
      int id, sid;
      const DuetTensor *qt = tensor(&q.cp->prog, names[k], &id), *stt = tensor(&q.cp->prog, sn, &sid);
      float *wf = read_tensor(&f, f.s, names[k]), *sl = read_tensor(&q, q.s, sn), *sw = malloc((size_t)stt->nbytes);
      signed char *ql = read_tensor(&q, q.s, names[k]), *qw = malloc((size_t)qt->nbytes);
      duet_quantize_i8(wf, qt->rank, qt->shape, stt->shape, qw, sw);
      CHECK(!memcmp(ql, qw, (size_t)qt->nbytes) && !memcmp(sl, sw, (size_t)stt->nbytes),
            "%s, %s: the loaded int8 weights or scales differ from duet_quantize_i8's", modes[per], names[k]);
      int64_t n = qt->nbytes, ns = stt->nbytes / 4; /* dequantized: q x scale, broadcast as the kernel does */
      for (int64_t e = 0; e < n; e++) {
        int64_t j = ns == 1 ? 0 : qt->rank == 4 ? e / (n / ns) : stt->shape[0] == 1 ? e % ns : e / (n / ns);
        CHECK(isfinite(sl[j]) && sl[j] > 0, "%s: scale %lld is %a", sn, (long long)j, sl[j]);
        wf[e] = (float)ql[e] * sl[j];
      }
      CHECK(!write_tensor(&ref, ref.s, names[k], wf), "reference weights");
      free(wf), free(sl), free(sw), free(ql), free(qw);
    }
    CHECK(!eval_logits(&q, lq[per]) && !eval_logits(&ref, lr), "evaluations");
    double worst = 0;
    for (int i = 0; i < 40; i++) {
      double e = fabs((double)lq[per][i] - lr[i]), tol = 1e-5 + 1e-5 * fabs(lr[i]);
      CHECK(isfinite(lq[per][i]) && e <= tol, "%s: logit %d is %.9g, the f32 program on q x scale gives %.9g",
            modes[per], i, lq[per][i], lr[i]);
      if (e / tol > worst) worst = e / tol;
    }
    printf("%s: logits within %.3g of their bound of the f32 program on dequantized weights\n", modes[per], worst);
    tmodel_close(&q);
  }
  double dc = 0, dt = 0;
  for (int i = 0; i < 40; i++) {
    dc = fmax(dc, fabs((double)lq[0][i] - lf[i]));
    dt = fmax(dt, fabs((double)lq[1][i] - lf[i]));
  }
  printf("largest |logit - f32 logit|: per channel %.3g, per tensor %.3g\n", dc, dt);
  CHECK(dc > 0 && dc < dt, "per-channel error %g not below per-tensor %g (or zero)", dc, dt);
  /* a checkpoint of another model */
  TModel o;
  if (!tmodel_open_quant(&o, "r.model", model_text("r", text, sizeof text), &fo, NULL, "int8")) {
    int rc = duet_checkpoint_load_weights(o.s, path, err, sizeof err);
    char want[700];
    snprintf(want, sizeof want, "cannot load %s: it is a checkpoint of model `q`, not `r`", path);
    CHECK(rc && !strcmp(err, want), "another model's checkpoint: rc %d, '%s'", rc, rc ? err : "");
    tmodel_close(&o);
  }
  unlink(path);
  tmodel_close(&f);
  tmodel_close(&ref);
  printf("%s forward\n", fails == f0 ? "ok" : "FAIL");
  return fails != f0;
}

/* Quantization-aware training: the forward pass of the model with a
 * quantize section (weights fake-quantized) equals, within f32 rounding,
 * the plain model's on the weights duet_quantize_i8 gives dequantized (so
 * the QAT run evaluates what --quantize int8 evaluates); its gradients
 * w.r.t. the weights equal the plain model's there (straight-through:
 * identity), and the biases' too. */
static int test_qat(void) {
  int f0 = fails;
  char text[1024], qtext[1200];
  model_text("q", text, sizeof text);
  for (int per = 0; per < 2; per++) {
    snprintf(qtext, sizeof qtext, "%squantize {\n  weights = int8\n  mode = qat\n  granularity = %s\n}\n", text,
             per ? "tensor" : "channel");
    TModel q, f;
    if (tmodel_open(&q, "qat.model", qtext, DT_F32) || tmodel_open(&f, "q.model", text, DT_F32)) {
      CHECK(0, "the QAT model does not compile");
      return 1;
    }
    DuetRng r;
    duet_rng_seed(&r, 9, 0);
    tmodel_fill(&q, q.s, &r, 5);
    static const char *const names[5] = {"x", "y", "b", "cw", "w"};
    for (int k = 0; k < 6; k++) { /* inputs and bias as they are; weights fake-quantized */
      const char *nm = k < 5 ? names[k] : "v";
      void *h = read_tensor(&q, q.s, nm);
      if (k >= 3) {
        const DuetTensor *x = tensor(&q.cp->prog, nm, NULL);
        int64_t sh[4] = {1, 1, 1, 1}, n = x->nbytes / 4;
        for (int d = 0; d < x->rank && !per; d++) sh[d] = x->shape[d];
        if (!per) /* per channel: the output axis (first of cw and v, last of w) */
          for (int d = 0; d < x->rank; d++) sh[d] = (d == 0) == (k != 4) ? x->shape[d] : 1;
        float *w = h, sc[64];
        signed char *qq = malloc((size_t)n);
        duet_quantize_i8(w, x->rank, x->shape, sh, qq, sc);
        int64_t ns = 1;
        for (int d = 0; d < x->rank; d++) ns *= sh[d];
        for (int64_t e = 0; e < n; e++) w[e] = (float)qq[e] * sc[ns == 1 ? 0 : k == 4 ? e % ns : e / (n / ns)];
        free(qq);
      }
      CHECK(h && !write_tensor(&f, f.s, nm, h), "copying %s", nm);
      free(h);
    }
    CHECK(!duet_session_run(q.s, DUET_RUN_GRAD) && !duet_session_run(f.s, DUET_RUN_GRAD), "gradient runs");
    float lq, lf;
    duet_session_read(q.s, q.cp->prog.loss, 0, &lq, 4);
    duet_session_read(f.s, f.cp->prog.loss, 0, &lf, 4);
    CHECK(fabsf(lq - lf) <= 1e-6f + 1e-6f * fabsf(lf), "%s: QAT loss %.9g, plain loss on q x scale %.9g",
          per ? "tensor" : "channel", lq, lf);
    double worst = 0;
    for (int k = 2; k < 6; k++) {
      const char *nm = k < 5 ? names[k] : "v";
      Value *pq = tmodel_param(&q, nm), *pf = tmodel_param(&f, nm);
      int iq = pq && pq->grad ? tmodel_tensor(&q, pq->grad) : -1, jf = pf && pf->grad ? tmodel_tensor(&f, pf->grad) : -1;
      if (iq < 0 || jf < 0) {
        CHECK(0, "%s: no gradient tensor", nm);
        continue;
      }
      int64_t n = q.cp->prog.tensors[iq].nbytes / 4;
      float *gq = malloc((size_t)n * 4), *gf = malloc((size_t)n * 4);
      duet_session_read(q.s, iq, 0, gq, (size_t)n * 4);
      duet_session_read(f.s, jf, 0, gf, (size_t)n * 4);
      double gmax = 0;
      for (int64_t e = 0; e < n; e++) gmax = fmax(gmax, fabs(gf[e]));
      for (int64_t e = 0; e < n; e++) {
        double d = fabs((double)gq[e] - gf[e]), tol = 1e-5 * gmax + 1e-7;
        if (d / tol > worst) worst = d / tol;
        CHECK(d <= tol, "%s: d loss / d %s[%lld] = %.9g with QAT, %.9g on q x scale", per ? "tensor" : "channel", nm,
              (long long)e, gq[e], gf[e]);
      }
      free(gq), free(gf);
    }
    printf("qat (%s): loss %.9g = %.9g; gradients within %.3g of their bound\n", per ? "tensor" : "channel", lq, lf,
           worst);
    tmodel_close(&q);
    tmodel_close(&f);
  }
  printf("%s qat\n", fails == f0 ? "ok" : "FAIL");
  return fails != f0;
}

int main(void) {
  char dir[] = "/tmp/duet_quantize_XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_quantizer();
  test_pass();
  test_forward(dir);
  test_qat();
  rmdir(dir);
  return fails != 0;
}
