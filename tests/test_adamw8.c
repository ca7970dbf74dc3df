/* tests/test_adamw8.c: 8-bit AdamW state (runtime/duet_q8.h, the KK_ADAMW8
 * kernel of codegen/emit_c.c), against references written here.
 *
 *  1. the maps: all 256 values of each against the paper's definition,
 *     evaluated here from (exponent, fraction) pairs in long double (each
 *     duet value within half an f32 ulp of it), sorted, distinct, the
 *     extremes (1, 10^-6 signed, 10^-7 unsigned, code 0 = +0), the signed
 *     map symmetric;
 *  2. the encoder against a brute-force search (the nearest of the 256
 *     decoded values by scanning them, ties to the smaller magnitude, a
 *     positive value in the unsigned map never 0) on 2^20 random values
 *     (uniform and log-uniform magnitudes, both signs), every map value,
 *     every midpoint and its neighbouring f32 values, 0, -0, denormals,
 *     1, -1;
 *  3. blocks (duet_q8_quantize_block): zeros (scale 0, codes 0, decoded
 *     0, no NaN), denormal values (scale denormal, decoded within the
 *     nearest-code bound plus the denormal spacing), huge values (3e38:
 *     finite scale and values), and every element within the
 *     nearest-code bound: |decode - x| <= absmax * (gap of the two map
 *     values around |x| / absmax) / 2 (the unsigned map's (0, 10^-7):
 *     the whole gap, as a positive value rounds up to 10^-7), plus one
 *     rounding of the decode's multiply (2^-24 relative);
 *  4. one step of the generated kernel against the f32 AdamW kernel, on a
 *     param of 3 blocks (2 x 2048 + 5 values: the last block partial),
 *     whose blocks hold mixed magnitudes, only zeros (g = 0, w = 0), and
 *     huge and tiny gradients.  The 8-bit kernel decodes its state, does
 *     the f32 kernel's arithmetic, then quantizes: so from the same
 *     decoded state, params and weight decay, the new params must equal
 *     the f32 kernel's bit for bit, and the new state decoded must be
 *     within the nearest-code bound (3.) of the f32 kernel's new state;
 *     in fact its scales and codes must be exactly duet_q8.h's
 *     quantization of the f32 kernel's new state.
 *     Step 1 starts from zero state on both; before step 2 the f32
 *     session's state is set to the 8-bit session's decoded state.  Also:
 *     the zero block keeps scale 0 and codes 0 and its params 0, and no
 *     value anywhere is NaN or infinite.
 * The one-step bound is what the quantization adds per step; what it does
 * to training is measured by tests/run_adamw8_accuracy.sh. */
#include <stdlib.h>
#include <string.h>

#include "../runtime/duet_q8.h"
#include "test_util.h"

static int fails;
#define CHECK(c, ...) \
  do { \
    if (!(c)) { \
      printf("FAIL: " __VA_ARGS__); \
      printf("\n"); \
      fails++; \
    } \
  } while (0)

/* ------------------------------------------------------------ 1. maps */

/* The definition, evaluated apart from the header: sign bit (signed map),
 * E zero bits, the indicator, F fraction bits f: 10^-E (0.1 + 0.9 (f+1) / 2^F). */
static void ref_map(int sg, long double *val) {
  int bits = sg ? 7 : 8;
  for (int c = 0; c < 256; c++) val[c] = 0;
  for (int e = 0; e < bits; e++) {
    int F = bits - 1 - e;
    for (int f = 0; f < (1 << F); f++) {
      int code = (1 << F) | f; /* the indicator right after e zeros */
      long double v = powl(10.0L, -e) * (0.1L + 0.9L * (f + 1) / (long double)(1 << F));
      val[code] = v;
      if (sg) val[code | 0x80] = -v;
    }
  }
}

static void test_maps(void) {
  for (int sg = 0; sg < 2; sg++) {
    long double ref[256];
    ref_map(sg, ref);
    DuetQ8Map m;
    CHECK(duet_q8_map(&m, sg) == 0, "map %d: a table cell holds two thresholds", sg);
    for (int c = 0; c < 256; c++) {
      float v = duet_q8_value(sg, c);
      float ulp = nextafterf(fabsf(v), INFINITY) - fabsf(v);
      CHECK(fabsl((long double)v - ref[c]) <= ulp / 2 * 1.0001L, "map %d code %d: %.9g, definition %.12Lg", sg, c, v,
            ref[c]);
      CHECK(m.dec[c] == v, "map %d code %d: table", sg, c);
      if (sg && c >= 0x80) CHECK(v == -duet_q8_value(1, c - 0x80), "signed map code %d not symmetric", c);
    }
    CHECK(m.n == (sg ? 128 : 256), "map %d: %d magnitudes", sg, m.n);
    for (int k = 1; k < m.n; k++) CHECK(m.val[k] > m.val[k - 1], "map %d: magnitudes not increasing at %d", sg, k);
    CHECK(m.val[0] == 0 && !signbit(m.val[0]) && m.code[0] == 0, "map %d: code 0 is not +0", sg);
    CHECK(m.val[m.n - 1] == 1.0f, "map %d: the largest value is %.9g, not 1", sg, m.val[m.n - 1]);
    CHECK(m.val[1] == (sg ? 1e-6f : 1e-7f), "map %d: the smallest non-zero value is %.9g", sg, m.val[1]);
  }
}

/* --------------------------------------------------------- 2. encoder */

/* The nearest decoded value by scanning all 256 codes; `alt` gets a second
 * code at the same distance (a tie), else the first. */
static int brute(int sg, float x, int *alt) {
  int best = -1;
  long double bd = 0;
  *alt = -1;
  for (int c = 0; c < 256; c++) {
    float v = duet_q8_value(sg, c);
    if (!sg && x > 0 && v == 0) continue; /* a positive second moment never rounds to 0 */
    long double d = fabsl((long double)x - (long double)v);
    if (best < 0 || d < bd) best = c, bd = d, *alt = -1;
    else if (d == bd && fabsf(v) != fabsf(duet_q8_value(sg, best))) *alt = c;
  }
  if (*alt >= 0 && fabsf(duet_q8_value(sg, *alt)) < fabsf(duet_q8_value(sg, best))) { /* ties: smaller magnitude */
    int t = best;
    best = *alt;
    *alt = t;
  }
  if (*alt < 0) *alt = best;
  return best;
}

static int enc_checks;
static void check_enc(const DuetQ8Map *m, int sg, float x) {
  if (!sg) x = fabsf(x); /* the unsigned map encodes second moments, >= 0 */
  int alt, want = brute(sg, x, &alt);
  int got = duet_q8_encode(m, x);
  float gv = duet_q8_value(sg, got), wv = duet_q8_value(sg, want);
  enc_checks++;
  /* codes 0x00 and 0x80 are both 0: the encoder writes 0x00 */
  CHECK(got == want || gv == wv, "map %d: x = %a (%.9g) encoded %d (%.9g), nearest %d (%.9g)", sg, x, x, got, gv, want,
        wv);
  CHECK(!sg || got != 0x80, "map %d: x = %a encoded as the second zero 0x80", sg, x);
}

static void test_encoder(void) {
  DuetRng r;
  duet_rng_seed(&r, 7, 0);
  for (int sg = 0; sg < 2; sg++) {
    DuetQ8Map m;
    duet_q8_map(&m, sg);
    for (int i = 0; i < (1 << 19); i++) {
      float u = (float)duet_rng_uniform(&r) * 2 - 1;
      check_enc(&m, sg, u);
      float lg = (float)(pow(10.0, -9.0 * duet_rng_uniform(&r)) * (duet_rng_uniform(&r) < 0.5 ? -1 : 1));
      check_enc(&m, sg, lg);
    }
    for (int k = 0; k < m.n; k++) {
      for (int s = -1; s <= 1; s += 2) {
        check_enc(&m, sg, s * m.val[k]);
        if (k + 1 < m.n) { /* the midpoints and their neighbours */
          float t = m.thr[k];
          check_enc(&m, sg, s * t);
          check_enc(&m, sg, s * nextafterf(t, INFINITY));
          check_enc(&m, sg, s * nextafterf(t, -INFINITY));
          check_enc(&m, sg, s * (float)m.mid[k]);
        }
      }
    }
    float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 1e-45f, -1e-45f, 1e-40f, 1.17549435e-38f, 5e-8f, 4.9999997e-8f, 5e-7f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) check_enc(&m, sg, special[i]);
    CHECK(duet_q8_encode(&m, 0.0f) == 0 && duet_q8_encode(&m, -0.0f) == 0, "map %d: 0 and -0 are not code 0", sg);
  }
  printf("%s encoder: %d values against the brute-force nearest code\n", fails ? "FAIL" : "ok", enc_checks);
}

/* ----------------------------------------------------------- 3. blocks */

/* The nearest-code bound of x given its block's scale a: half the gap of
 * the two map magnitudes around |x| / a, times a, plus one rounding of
 * the decode's product. */
static double q8_bound(const DuetQ8Map *m, float x, float a) {
  if (a == 0) return 0;
  double y = fabs((double)x / (double)a);
  int k = 0;
  while (k + 1 < m->n && m->val[k + 1] < y) k++;
  double hi = k + 1 < m->n ? m->val[k + 1] : m->val[k];
  /* unsigned: (0, 1e-7] rounds up to 1e-7, an error of up to the whole gap */
  double err = k == 0 && m->n == 256 ? hi : (hi - m->val[k]) / 2;
  return err * (double)a * (1 + 1e-6) + fabs((double)x) * 0x1p-24 + 1.5e-45;
}

static void check_block(const char *what, int sg, const float *x, int n) {
  DuetQ8Map m;
  duet_q8_map(&m, sg);
  unsigned char codes[DUET_Q8_BLOCK];
  float a = duet_q8_quantize_block(&m, x, n, codes);
  float want = 0;
  for (int i = 0; i < n; i++) want = fabsf(x[i]) > want ? fabsf(x[i]) : want;
  CHECK(a == want, "%s: scale %a, largest |x| %a", what, a, want);
  for (int i = 0; i < n; i++) {
    float d = m.dec[codes[i]] * a;
    CHECK(isfinite(d), "%s: element %d decodes to %g", what, i, d);
    CHECK(fabs((double)d - x[i]) <= q8_bound(&m, x[i], a), "%s: element %d: %a decodes to %a (bound %g)", what, i, x[i],
          d, q8_bound(&m, x[i], a));
    if (x[i] == 0) CHECK(codes[i] == 0 && d == 0, "%s: element %d: 0 is code %d", what, i, codes[i]);
  }
}

static void test_blocks(void) {
  static float x[DUET_Q8_BLOCK];
  DuetRng r;
  duet_rng_seed(&r, 11, 0);
  for (int sg = 0; sg < 2; sg++) {
    memset(x, 0, sizeof x);
    check_block("zeros", sg, x, DUET_Q8_BLOCK);
    for (int i = 0; i < DUET_Q8_BLOCK; i++) x[i] = (float)(duet_rng_uniform(&r) * 1e-40) * (sg && i % 2 ? -1 : 1);
    check_block("denormals", sg, x, DUET_Q8_BLOCK);
    for (int i = 0; i < DUET_Q8_BLOCK; i++) x[i] = (float)(duet_rng_uniform(&r) * 3e38) * (sg && i % 3 ? -1 : 1);
    x[5] = sg ? -3.4e38f : 3.4e38f;
    check_block("huge", sg, x, DUET_Q8_BLOCK);
    for (int i = 0; i < DUET_Q8_BLOCK; i++)
      x[i] = (float)(pow(10.0, -12.0 * duet_rng_uniform(&r)) * (sg && i % 2 ? -1 : 1));
    check_block("mixed magnitudes", sg, x, 1000);
  }
  printf("%s blocks: zeros, denormals, huge, mixed magnitudes\n", fails ? "FAIL" : "ok");
}

/* ------------------------------------------------------- 4. the kernel */

#define NP (2 * DUET_Q8_BLOCK + 5)

static int find_tensor(const TModel *t, const char *name) {
  const DuetProgram *p = &t->cp->prog;
  for (int i = 0; i < p->n_tensors; i++)
    if (!strcmp(p->tensors[i].name, name)) return i;
  printf("FAIL: no tensor %s\n", name);
  exit(1);
}

static float *tf(TModel *t, const char *name) { return duet_session_tensor(t->s, find_tensor(t, name)); }

static void test_kernel(void) {
  char a8[512], a32[512];
  const char *fmt = "model opt\ninput x: f32[%d]\nparam w: [%d] = uniform(-1, 1)\nloss = mean(w * x)\n"
                    "train {\n  optimizer = adamw(lr = 0.01, weight_decay = 0.1%s)\n}\n";
  snprintf(a8, sizeof a8, fmt, NP, NP, ", state = int8");
  snprintf(a32, sizeof a32, fmt, NP, NP, "");
  TModel q, f;
  if (tmodel_open(&q, "q8.model", a8, DT_F32) || tmodel_open(&f, "f32.model", a32, DT_F32)) {
    fails++;
    return;
  }
  bool has = false;
  for (int i = 0; i < q.cp->n_kernels; i++) has |= q.cp->kernels[i].kind == KK_ADAMW8;
  CHECK(has, "the int8 model has no adamw8 kernel");
  DuetRng r;
  duet_rng_seed(&r, 3, 0);
  float *wq = tf(&q, "w"), *wf = tf(&f, "w");
  float *xq = duet_session_tensor(q.s, q.cp->prog.input_x), *xf = duet_session_tensor(f.s, f.cp->prog.input_x);
  for (int i = 0; i < NP; i++) {
    int blk = i / DUET_Q8_BLOCK;
    double mag = blk == 0 ? pow(10.0, -6.0 * duet_rng_uniform(&r)) : blk == 1 ? 0 : i % 2 ? 1e17 : 1e-30;
    xq[i] = xf[i] = (float)(mag * (duet_rng_uniform(&r) < 0.5 ? -1 : 1));
    wq[i] = wf[i] = blk == 1 ? 0.0f : (float)(duet_rng_uniform(&r) * 2 - 1);
  }
  DuetQ8Map ms, mu;
  duet_q8_map(&ms, 1);
  duet_q8_map(&mu, 0);
  for (int step = 1; step <= 2; step++) {
    if (duet_session_run(q.s, DUET_RUN_TRAIN) || duet_session_run(f.s, DUET_RUN_TRAIN)) {
      fails++;
      break;
    }
    const unsigned char *mc = (const unsigned char *)tf(&q, "w.exp_avg.codes"),
                        *vc = (const unsigned char *)tf(&q, "w.exp_avg_sq.codes");
    float *ma = tf(&q, "w.exp_avg.absmax"), *va = tf(&q, "w.exp_avg_sq.absmax");
    float *mf = tf(&f, "w.exp_avg"), *vf = tf(&f, "w.exp_avg_sq");
    int bad_w = 0, bad_s = 0;
    for (int i = 0; i < NP; i++) {
      int b = i / DUET_Q8_BLOCK;
      float m = ms.dec[mc[i]] * ma[b], v = mu.dec[vc[i]] * va[b];
      if (memcmp(&wq[i], &wf[i], 4) && bad_w++ < 5)
        printf("FAIL: step %d w[%d]: int8 state %a, f32 state %a (the same decoded state: must be equal)\n", step, i,
               wq[i], wf[i]);
      bool ok = fabs((double)m - mf[i]) <= q8_bound(&ms, mf[i], ma[b]) &&
                fabs((double)v - vf[i]) <= q8_bound(&mu, vf[i], va[b]) && isfinite(m) && isfinite(v) && isfinite(wq[i]);
      if (!ok && bad_s++ < 5)
        printf("FAIL: step %d element %d: decoded state (%a, %a), f32 kernel's (%a, %a), scales (%a, %a)\n", step, i, m, v,
               mf[i], vf[i], ma[b], va[b]);
      if (b == 1 && (mc[i] || vc[i] || wq[i] != 0) && bad_s++ < 5)
        printf("FAIL: step %d element %d of the zero block: codes %d %d, w %a\n", step, i, mc[i], vc[i], wq[i]);
    }
    CHECK(ma[1] == 0 && va[1] == 0, "step %d: the zero block's scales are %g, %g", step, ma[1], va[1]);
    /* the f32 kernel's new state is the 8-bit kernel's before quantization
     * (the same arithmetic on the same inputs): its scales and codes must
     * be this header's quantization of it, exactly */
    for (int b = 0; b < 3; b++) {
      int lo = b * DUET_Q8_BLOCK, n = lo + DUET_Q8_BLOCK <= NP ? DUET_Q8_BLOCK : NP - lo;
      unsigned char cm[DUET_Q8_BLOCK], cv[DUET_Q8_BLOCK];
      float am = duet_q8_quantize_block(&ms, mf + lo, n, cm), av = duet_q8_quantize_block(&mu, vf + lo, n, cv);
      CHECK(am == ma[b] && av == va[b], "step %d block %d: scales %a %a, of the f32 state %a %a", step, b, ma[b], va[b],
            am, av);
      int diff = 0;
      for (int i = 0; i < n; i++) diff += cm[i] != mc[lo + i] || cv[i] != vc[lo + i];
      CHECK(!diff, "step %d block %d: %d codes differ from duet_q8.h's quantization of the f32 state", step, b, diff);
    }
    fails += bad_w + bad_s;
    printf("%s step %d: params bit-identical to the f32 kernel's, state within the nearest-code bound (%d elements, 3 "
           "blocks)\n", bad_w + bad_s ? "FAIL" : "ok", step, NP);
    /* the f32 kernel continues from the 8-bit kernel's decoded state */
    for (int i = 0; i < NP; i++) {
      int b = i / DUET_Q8_BLOCK;
      mf[i] = ms.dec[mc[i]] * ma[b];
      vf[i] = mu.dec[vc[i]] * va[b];
    }
  }
  tmodel_close(&q);
  tmodel_close(&f);
}

int main(void) {
  test_maps();
  printf("%s maps: 256 values each against the definition\n", fails ? "FAIL" : "ok");
  test_encoder();
  test_blocks();
  test_kernel();
  printf("%s\n", fails ? "FAILED" : "all passed");
  return fails != 0;
}
