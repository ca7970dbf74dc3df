/* tests/test_int8_gemm.c: the int8 GEMM of --quantize int8 --calibrate
 * (matmul_i8, KK_GEMM_I8: codegen/emit_c.c) against an independent
 * reference, on the CPU backend.
 *
 * One-matmul models (x @ w or x @ transpose(w), a scale per output channel
 * or per tensor), 6 rows, K = 300 and 270 (not multiples of the kernel's
 * 256-input blocks), 270 and 300 output channels (two 256-channel tiles),
 * with int8 weights and scales written directly:
 *
 *  - calibration: with the activation scales at 0, each evaluation keeps
 *    -max|x| of the GEMM's input over the batches seen (two batches: the
 *    running maximum), exactly; the f32 outputs of calibration match a
 *    double-precision product of x and the dequantized weights within the
 *    f32 rounding of a K-term sum;
 *  - the int8 path: with the scale max|x| / 127 of the calibration, on a
 *    third batch drawn 4x wider (batch 2: 2.5x) (so that activations clamp), the output
 *    equals, bit for bit, a
 *    naive triple loop written here: x / s (f32 division), rounded half to
 *    even by floor arithmetic, clamped to +-127, int64 sums of products,
 *    (float)sum * s * sw[n];
 *  - the pass refuses K * 127 * 127 >= 2^31 (K = 133145) with its message.
 */
#define _GNU_SOURCE /* open_memstream */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static int failures;

/* Half to even without rint/nearbyint: floor, then the tie goes to the even
 * neighbour. */
static double round_half_even(double v) {
  double f = floor(v), d = v - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return fmod(f, 2) == 0 ? f : f + 1;
}

static int8_t ref_quant(float x, float s) {
  float v = x / s;
  if (v != v) return 0;
  double r = round_half_even((double)v);
  return (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
}

/* y[m, n] = (float)(sum_k q(x[m,k]) w[k,n]) * s * sw[n] (w[n,k] when trans) */
static void ref_gemm(const float *x, const int8_t *w, const float *sw, int per_tensor, float s, int M, int K, int N,
                     int trans, float *y) {
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      int64_t acc = 0;
      for (int k = 0; k < K; k++)
        acc += (int64_t)ref_quant(x[m * K + k], s) * (int64_t)w[trans ? n * K + k : k * N + n];
      if (acc > INT32_MAX || acc < INT32_MIN) {
        fprintf(stderr, "FAIL reference sum overflows int32\n");
        failures++;
      }
      y[m * N + n] = (float)acc * s * sw[per_tensor ? 0 : n];
    }
}

static int tensor_named(const DuetProgram *p, const char *name) {
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].name && !strcmp(p->tensors[i].name, name)) return i;
  return -1;
}

static float randn(DuetRng *r) {
  float u = (float)(duet_rng_next(r) >> 40) / 16777216.0f, v = (float)(duet_rng_next(r) >> 40) / 16777216.0f;
  return sqrtf(-2 * logf(u + 1e-7f)) * cosf(6.2831853f * v);
}

/* One int8 GEMM, the model's logits (so that no later kernel reuses its
 * memory): x [6, K] @ w [K, N], or x @ transpose(w) with w [N, K]. */
static void run(const char *mode, int trans, int K, int N) {
  enum { M = 6 };
  char text[512];
  snprintf(text, sizeof text, "model g\ninput x: f32[6, %d]\ninput y: i32[6]\nparam w: [%d, %d]\n"
           "loss = cross_entropy(x @ %s, y)\n", K, trans ? N : K, trans ? K : N, trans ? "transpose(w)" : "w");
  char what[96];
  snprintf(what, sizeof what, "%s, x @ %s, K %d, N %d", mode, trans ? "transpose(w)" : "w", K, N);
  TModel t;
  FrontendOptions fo = {.float_dtype = DT_F32};
  tmodel_calibrate = 1;
  int bad = tmodel_open_quant(&t, "int8_gemm", text, &fo, "fp32", mode);
  tmodel_calibrate = 0;
  if (bad) {
    fprintf(stderr, "FAIL %s: does not compile\n", what);
    failures++;
    return;
  }
  const DuetProgram *p = &t.cp->prog;
  int ns = !strcmp(mode, "int8-tensor"); /* one weight scale */
  int iw = tensor_named(p, "w"), iws = tensor_named(p, "w.scale"), iwa = tensor_named(p, "w.act_scale");
  int out = -1, n_gemm = 0;
  for (int k = 0; k < t.cp->n_kernels; k++)
    if (t.cp->kernels[k].kind == KK_GEMM_I8) out = t.cp->kernels[k].bufs[4].tensor, n_gemm++;
  if (iw < 0 || iws < 0 || iwa < 0 || n_gemm != 1 || out != p->logits || p->tensors[iw].dtype != DUET_I8) {
    fprintf(stderr, "FAIL %s: the program lacks the int8 GEMM, its weights or scales\n", what);
    failures++;
    tmodel_close(&t);
    return;
  }
  DuetRng r;
  duet_rng_seed(&r, 7, (uint64_t)K);
  int8_t *w = malloc((size_t)K * N);
  float *ws = malloc((size_t)N * 4), *x = malloc(3 * (size_t)M * K * 4), *y = malloc((size_t)M * N * 4),
        *got = malloc((size_t)M * N * 4);
  for (int i = 0; i < K * N; i++) w[i] = (int8_t)((int)(duet_rng_next(&r) % 255) - 127);
  w[0] = 127, w[1] = -127;
  for (int i = 0; i < N; i++) ws[i] = ns ? 0.003f : 0.001f + 0.004f * (float)(duet_rng_next(&r) % 1000) / 1000;
  for (int j = 0; j < 3; j++)
    for (int i = 0; i < M * K; i++) x[j * M * K + i] = (j == 1 ? 2.5f : j == 2 ? 4.0f : 1.0f) * randn(&r);
  if (duet_session_write(t.s, iw, 0, w, (size_t)K * N) || duet_session_write(t.s, iws, 0, ws, (size_t)(ns ? 1 : N) * 4) ||
      duet_session_write(t.s, iwa, 0, &(float){0}, 4)) {
    fprintf(stderr, "FAIL %s: writing the weights\n", what);
    failures++;
  }
  duet_session_set_valid(t.s, M);
  /* calibration over two batches: the running max|x| */
  float mx = 0;
  for (int j = 0; j < 2; j++) {
    for (int i = 0; i < M * K; i++) mx = fabsf(x[j * M * K + i]) > mx ? fabsf(x[j * M * K + i]) : mx;
    float sa = 0;
    if (duet_session_write(t.s, p->input_x, 0, x + j * M * K, (size_t)M * K * 4) ||
        duet_session_run(t.s, DUET_RUN_EVAL) || duet_session_read(t.s, iwa, 0, &sa, 4) || sa != -mx) {
      fprintf(stderr, "FAIL %s: after calibration batch %d, w.act_scale is %.9g, want -max|x| = %.9g\n", what, j + 1,
              sa, -mx);
      failures++;
    }
  }
  /* the calibration's f32 output (batch 2) against a double product with
   * the dequantized weights: within K f32 roundings of the terms' sum */
  duet_session_read(t.s, out, 0, got, (size_t)M * N * 4);
  double worst = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double e = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        double term = (double)x[M * K + m * K + k] * ((double)w[trans ? n * K + k : k * N + n] * ws[ns ? 0 : n]);
        e += term, mag += fabs(term);
      }
      double err = fabs(got[m * N + n] - e) / (mag * K * 0x1p-23 + 1e-30);
      worst = err > worst ? err : worst;
    }
  if (!(worst <= 1)) {
    fprintf(stderr, "FAIL %s: calibration output off the f64 product by %.3g of its bound\n", what, worst);
    failures++;
  }
  /* the int8 path with the scale max|x| / 127 of batches 1-2, on batch 3
   * at 4x (values beyond the range clamp), against the triple loop */
  float s = mx / 127.0f;
  ref_gemm(x + 2 * M * K, w, ws, ns, s, M, K, N, trans, y);
  int clamped = 0;
  for (int i = 0; i < M * K; i++) clamped += fabsf(x[2 * M * K + i]) > mx;
  if (duet_session_write(t.s, iwa, 0, &s, 4) || duet_session_write(t.s, p->input_x, 0, x + 2 * M * K, (size_t)M * K * 4) ||
      duet_session_run(t.s, DUET_RUN_EVAL) || duet_session_read(t.s, out, 0, got, (size_t)M * N * 4)) {
    fprintf(stderr, "FAIL %s: evaluation: %s\n", what, duet_session_error(t.s));
    failures++;
  } else if (memcmp(got, y, (size_t)M * N * 4)) {
    for (int i = 0; i < M * N; i++)
      if (got[i] != y[i]) {
        fprintf(stderr, "FAIL %s: y[%d] = %.9g, reference %.9g\n", what, i, got[i], y[i]);
        break;
      }
    failures++;
  } else {
    printf("ok %s: calibrated max|x| exact, f32 path within %.2g of its bound, int8 path equal to the triple loop "
           "bit for bit (%d of %d inputs clamped)\n", what, worst, clamped, M * K);
  }
  if (!clamped) {
    fprintf(stderr, "FAIL %s: no activation clamped: the check of clamping did not run\n", what);
    failures++;
  }
  free(w), free(ws), free(x), free(y), free(got);
  tmodel_close(&t);
}

/* K * 127 * 127 >= 2^31 is refused by the pass. */
static void refuse_large_k(void) {
  const char *text = "model big\ninput x: f32[2, 133145]\ninput y: i32[2]\nparam w: [133145, 2]\n"
                     "loss = cross_entropy(x @ w, y)\n";
  Arena *a = arena_new(1 << 20);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  Diag d = {.out = f};
  Source src = {.name = "big", .text = text, .len = strlen(text)};
  FrontendOptions fo = {.float_dtype = DT_F32};
  Graph *g = f ? frontend_compile(a, &d, &src, &fo) : NULL;
  PassCtx pc = {.diag = &d, .verify = true, .quantize = "int8", .calibrate = 1};
  int rc = g ? passes_run(g, &pc) : -1;
  if (f) fclose(f);
  const char *want = "--calibrate: the matmul by `w` sums over 133145 inputs; int8 x int8 products summed in int32 "
                     "can overflow beyond 133144: quantize without --calibrate";
  if (!rc || !buf || !strstr(buf, want)) {
    fprintf(stderr, "FAIL K = 133145 not refused as expected; got:\n%s\n", buf ? buf : "(nothing)");
    failures++;
  } else {
    printf("ok K = 133145 refused\n");
  }
  free(buf);
  arena_free(a);
}

int main(void) {
  run("int8", 0, 300, 270);
  run("int8", 1, 270, 300);
  run("int8-tensor", 0, 300, 270);
  run("int8-tensor", 1, 40, 7);
  refuse_large_k();
  if (failures) fprintf(stderr, "%d failures\n", failures);
  return failures ? 1 : 0;
}
