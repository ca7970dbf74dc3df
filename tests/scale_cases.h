/* tests/scale_cases.h: results that go wrong only at scale (issue 17,
 * "Wrong results"), shared by tests/test_scale.c (the C kernels) and
 * tests/test_cuda_emu.c (the generated CUDA C, emulated on the host).
 * Each case is checked against an independent reference with a stated
 * tolerance, never one backend against the other.
 *
 *  1. An embedding table of 2^32 + 320 elements (16 GiB of f32) gathered
 *     and scattered through its generated kernels in about 1 MiB of
 *     memory: the table is a 16 GiB mapping whose looked-up rows are real
 *     pages and the rest one shared sink (scale_sink_map), so the kernels
 *     run on their real addresses; a 32-bit row offset id * C wraps to
 *     another row (row 2^26 to row 0), and the check sees it.
 *  2. The sum and mean of 2^24 f32 elements against the exact sum (a
 *     128-bit fixed-point accumulation), within
 *     2^-24 |s| + gamma_{n-1} sum |x_i|, gamma_k = k u / (1 - k u), u = 2^-53
 *     (any summation order in double: Higham, "Accuracy and Stability of
 *     Numerical Algorithms", 2nd ed., sec. 4.2; then one rounding to f32).
 *  3. Cross-entropy and the evaluation NLL of huge logits (equal ones,
 *     label at a maximum, label below it, mixed signs, near the format's
 *     largest value) in f32, f64, fp16 and bf16 programs, against a long
 *     double log-sum-exp of the logits the program actually stored.
 */
#ifndef DUET_SCALE_CASES_H
#define DUET_SCALE_CASES_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../codegen/codegen.h"

/* The first kernel of `kind` in cp (with a whole-tensor reduction when
 * whole), or -1. */
static int scale_find_kernel(const CgProgram *cp, KernelKind kind, int64_t red, int skip) {
  for (int i = 0; i < cp->n_kernels; i++) {
    const Kernel *k = &cp->kernels[i];
    if (k->kind != kind) continue;
    if (red && !(k->outer == 1 && k->inner == 1 && k->red == red && !k->reduce_max)) continue;
    if (skip-- > 0) continue;
    return i;
  }
  return -1;
}

/* ------------------------------------------------- 1. embedding > 2^32 */

/* A mapping of `bytes` (rounded up to SCALE_SINK bytes) whose pages all
 * alias one shared 1 MiB sink (a memfd mapped again and again, populated
 * up front: 16 GiB cost 16K mappings, below the default vm.max_map_count
 * of 65530), except the pages holding the `n_own` byte offsets `own`,
 * which get private memory of their own.  Writes anywhere else land in
 * the sink, so a kernel may sweep the whole tensor (the embedding
 * gradient zeroes it) in any order without touching the observed rows;
 * an access wrapped to another row hits the sink or another observed
 * row, and is seen.  0, or -1 with errno set. */
#define SCALE_SINK ((size_t)1 << 20)
typedef struct ScaleMap {
  char *base;
  size_t bytes;
} ScaleMap;

static int scale_sink_map(ScaleMap *m, size_t bytes, const size_t *own, int n_own) {
  size_t n = (bytes + SCALE_SINK - 1) / SCALE_SINK;
  long pg = sysconf(_SC_PAGESIZE);
  size_t page = (size_t)(pg > 0 ? pg : 4096);
  m->base = NULL;
  m->bytes = n * SCALE_SINK;
  int fd = memfd_create("duet-scale-sink", 0);
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)SCALE_SINK)) {
    close(fd);
    return -1;
  }
  char *base = mmap(NULL, m->bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  bool ok = base != MAP_FAILED;
  for (size_t i = 0; ok && i < n; i++)
    ok = mmap(base + i * SCALE_SINK, SCALE_SINK, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd,
              0) != MAP_FAILED;
  for (int i = 0; ok && i < n_own; i++) /* zero-filled private pages */
    ok = own[i] < m->bytes && mmap(base + own[i] / page * page, page, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED;
  close(fd); /* the mappings keep the sink */
  if (!ok) {
    if (base != MAP_FAILED) munmap(base, m->bytes);
    return -1;
  }
  m->base = base;
  return 0;
}

static void scale_unmap(ScaleMap *m) {
  if (m->base) munmap(m->base, m->bytes);
  m->base = NULL;
}

/* table [EMB_V, EMB_C]: 2^32 + 320 elements; token ids: rows 2^26 and
 * 2^26 + 1 and V - 1 (2^26 + 4) are where a 32-bit id * 64 wraps (to rows
 * 0, 1 and 4), row 0 is also looked up, one id repeats (its gradient is a
 * sum), -1 and V are outside the table (zeros, no gradient). */
#define EMB_V ((int64_t)(1 << 26) + 5)
#define EMB_C 64
#define EMB_R 10
static const char emb_src[] = "model huge_embedding\nparam e: [67108869, 64] = zeros\ninput i: i32[10]\n"
                              "input r: f32[10, 64]\nloss = mean(embedding(e, i) * r)\n";
static const int32_t emb_ids[EMB_R] = {67108864, 0, 67108865, 3, 67108868, 67108864, -1, 67108869, 7, 1000};

/* A table or gradient of 2^32 + 320 floats whose looked-up rows are real
 * memory (scale_sink_map). */
static int emb_map(ScaleMap *m) {
  size_t own[EMB_R];
  int n = 0;
  for (int r = 0; r < EMB_R; r++)
    if (emb_ids[r] >= 0 && emb_ids[r] < EMB_V) own[n++] = (size_t)emb_ids[r] * EMB_C * sizeof(float);
  return scale_sink_map(m, (size_t)(EMB_V * EMB_C) * sizeof(float), own, n);
}

static float emb_table_value(int64_t v, int64_t c) { return (float)(v % 4093) + (float)c / 128.0f; }
static float emb_dy_value(int64_t r, int64_t c) { return (float)(r + 1) + (float)c / 64.0f; }

/* Writes the rows the tokens look up (the others read whatever shares
 * their physical row). */
static void emb_fill(float *tab, float *dy) {
  for (int r = 0; r < EMB_R; r++) {
    int64_t v = emb_ids[r];
    for (int64_t c = 0; c < EMB_C; c++) {
      if (v >= 0 && v < EMB_V) tab[v * EMB_C + c] = emb_table_value(v, c);
      dy[r * EMB_C + c] = emb_dy_value(r, c);
    }
  }
}

/* out [EMB_R, EMB_C]: each token's row, zeros outside the table. */
static int emb_check_fwd(const char *what, const float *out) {
  for (int r = 0; r < EMB_R; r++)
    for (int64_t c = 0; c < EMB_C; c++) {
      int64_t v = emb_ids[r];
      float want = v >= 0 && v < EMB_V ? emb_table_value(v, c) : 0.0f;
      if (out[r * EMB_C + c] != want) {
        fprintf(stderr, "FAIL %s: gathered row %lld col %lld: %g, want %g\n", what, (long long)v, (long long)c,
                out[r * EMB_C + c], want);
        return 1;
      }
    }
  return 0;
}

/* grad [EMB_V, EMB_C]: at each looked-up row, the sum of its tokens' dy
 * in token order (float adds, as both kernels sum them). */
static int emb_check_bwd(const char *what, const float *grad) {
  for (int r = 0; r < EMB_R; r++) {
    int64_t v = emb_ids[r];
    if (v < 0 || v >= EMB_V) continue;
    for (int64_t c = 0; c < EMB_C; c++) {
      float want = 0;
      for (int q = 0; q < EMB_R; q++)
        if (emb_ids[q] == v) want += emb_dy_value(q, c);
      if (grad[v * EMB_C + c] != want) {
        fprintf(stderr, "FAIL %s: gradient row %lld col %lld: %g, want %g\n", what, (long long)v, (long long)c,
                grad[v * EMB_C + c], want);
        return 1;
      }
    }
  }
  return 0;
}

/* ------------------------------------------------- 2. sums of 2^24 */

#define SUM_N ((int64_t)1 << 24)
static const char sum_src[] = "model sum24\nparam x: [4096, 4096]\nparam z: [16777216]\nloss = mean(x) + sum(z)\n";

/* Data set `set` into x (SUM_N floats), with the exact sum as a 128-bit
 * integer count of 2^-64 (every value here is a multiple of 2^-64 below
 * 2^11, so the sum is below 2^99) and sum |x_i|:
 *   0: uniform in [0, 1), multiples of 2^-24 (a loss or probability);
 *   1: +-(1 + U) * 2^e, e uniform in [-30, 10] (signs and magnitudes mixed);
 *   2: every element 0.1f (the classic drift of a serial f32 sum). */
static void sum_fill(float *x, int set, __int128 *exact, double *abs_sum) {
  uint64_t st = 0x9e3779b97f4a7c15ull * (uint64_t)(set + 1);
  __int128 s = 0;
  double a = 0;
  for (int64_t i = 0; i < SUM_N; i++) {
    st = st * 6364136223846793005ull + 1442695040888963407ull; /* Knuth's MMIX LCG */
    uint32_t hi = (uint32_t)(st >> 32);
    float v;
    if (set == 0) v = (float)ldexp((double)(hi >> 8), -24);
    else if (set == 1) v = (float)ldexp((1.0 + (double)(hi & 0x7fffff) / 8388608.0) * (hi >> 31 ? -1 : 1),
                                        (int)((st >> 24) % 41) - 30);
    else v = 0.1f;
    x[i] = v;
    s += (__int128)ldexp((double)v, 64);
    a += fabs((double)v);
  }
  *exact = s;
  *abs_sum = a;
}

/* y: a sum (scale 1) or mean (scale 1 / SUM_N) of the data whose exact
 * sum is exact * 2^-64; |y - s| <= 2^-24 |s| + gamma_{n-1} sum |x_i| (in
 * units of the result, so both terms times scale). */
static int sum_check(const char *what, float y, __int128 exact, double abs_sum, double scale, double *rel) {
  long double s = (long double)exact * ldexpl(1.0L, -64) * (long double)scale;
  double n1 = (double)(SUM_N - 1), u = ldexp(1.0, -53), gamma = n1 * u / (1 - n1 * u);
  long double bound = ldexpl(fabsl(s), -24) + (long double)(gamma * abs_sum * scale);
  long double err = fabsl((long double)y - s);
  *rel = (double)(err / fabsl(s));
  if (!(err <= bound)) { /* NaN fails too */
    fprintf(stderr, "FAIL %s: %.9g, exact %.12Lg: error %.3Lg (relative %.3g) exceeds the bound %.3Lg\n", what,
            (double)y, s, err, *rel, bound);
    return 1;
  }
  return 0;
}

/* ------------------------------------------------- 3. huge logits */

/* logits = z @ w with w the identity: in fp16 and bf16 programs z and the
 * logits are stored in 16 bits (a 16-bit GEMM) and widened for the
 * cross-entropy; in f32 and f64 programs they are what z holds. */
#define XENT_C 10
static const char xent_src[] = "model xent_huge\ninput z: f32[1, 10]\ninput y: i32[1]\nparam w: [10, 10] = zeros\n"
                               "loss = cross_entropy(z @ w, y)\n";

typedef struct XentCase {
  const char *name;
  double z[XENT_C];
  int y;
  int formats; /* 1: f32, bf16, f64; 2: fp16 (|z| <= 65504); 4: f64 only */
} XentCase;

#define XE(...) {__VA_ARGS__}
static const XentCase xent_cases[] = {
    {"10 equal logits of 1e15", XE(1e15, 1e15, 1e15, 1e15, 1e15, 1e15, 1e15, 1e15, 1e15, 1e15), 3, 1},
    {"10 equal logits of 1e17", XE(1e17, 1e17, 1e17, 1e17, 1e17, 1e17, 1e17, 1e17, 1e17, 1e17), 0, 1},
    {"10 equal logits of -1e17", XE(-1e17, -1e17, -1e17, -1e17, -1e17, -1e17, -1e17, -1e17, -1e17, -1e17), 9, 1},
    {"label at one of two maxima of 3e38", XE(3e38, 3e38, 1e38, -3e38, 0, 1, -1, 2e38, -1e38, 5), 1, 1},
    {"label at the maximum, logits 1e17 - k 2^50", XE(1e17, 1e17 - 0x1p50, 1e17 - 0x1p51, 1e17 - 0x1p52, 1e17 - 0x1p53,
                                                      1e17, 1e17 - 0x1p54, 1e17 - 3 * 0x1p52, 1e17 - 0x1p55, 9e16), 5, 1},
    {"label below two maxima of 1e15", XE(1e15, 1e15, 0, 1, 2, 3, 4, 5, 6, 7), 2, 1},
    {"mixed signs, label at the maximum", XE(-1e30, 2e30, -3e30, 4e30, 1e29, 4e30, 0, -4e30, 3e30, 1), 3, 1},
    {"10 equal logits of 1e300", XE(1e300, 1e300, 1e300, 1e300, 1e300, 1e300, 1e300, 1e300, 1e300, 1e300), 4, 4},
    {"10 equal logits of 65504", XE(65504, 65504, 65504, 65504, 65504, 65504, 65504, 65504, 65504, 65504), 7, 3},
    {"10 equal logits of -65504", XE(-65504, -65504, -65504, -65504, -65504, -65504, -65504, -65504, -65504, -65504), 2,
     3},
    {"label at one of two maxima of 65504", XE(65504, 0, 65504, 65472, -65504, 1, 2, 3, 30000, -30000), 2, 3},
    {"label below the maximum 65504", XE(65504, 0, 1, 2, 3, 4, 5, 6, 7, 8), 1, 3},
    {"moderate logits", XE(1.5, -2.25, 0.5, 3, -0.75, 2.5, 0, -1, 1, 0.25), 6, 3},
};
#undef XE
#define N_XENT_CASES ((int)(sizeof xent_cases / sizeof *xent_cases))

/* Whether case c runs in a program of precision `prec` ("fp32", "fp16",
 * "bf16") with float dtype f64 (then prec is "fp32"). */
static bool xent_case_runs(const XentCase *c, const char *prec, bool f64) {
  if (f64) return c->formats & 5;
  if (!strcmp(prec, "fp16")) return c->formats & 2;
  return c->formats & 1;
}

/* Reference loss of logits z (as the program stored them) and label y:
 * log sum_j exp(z_j - m) - (z_y - m) in long double. */
static long double xent_ref(const double *z, int y) {
  long double m = z[0], se = 0;
  for (int j = 1; j < XENT_C; j++) m = z[j] > m ? z[j] : m;
  for (int j = 0; j < XENT_C; j++) se += expl((long double)z[j] - m);
  return logl(se) - ((long double)z[y] - m);
}

/* |got - ref| within the kernels' arithmetic: f32 programs sum exp() in
 * f32 (the CUDA loss kernel; expf within 2 ulps): log(se) is off by at
 * most (XENT_C + 6) 2^-24, and the f32 result rounds once (2^-24 |ref|,
 * twice that allowed); f64 programs: 1e-14 |ref| + 1e-13. */
static int xent_check(const char *what, double got, long double ref, bool f64) {
  long double tol = f64 ? 1e-14L * fabsl(ref) + 1e-13L : ldexpl(fabsl(ref), -23) + ldexpl(XENT_C + 6, -24);
  if (fabsl((long double)got - ref) <= tol) return 0; /* NaN fails */
  fprintf(stderr, "FAIL %s: %.17g, want %.17Lg (tolerance %.3Lg)\n", what, got, ref, tol);
  return 1;
}

#endif
