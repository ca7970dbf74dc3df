/* tests/test_half2_rounding.c: the arithmetic fact the CUDA emitter's half2
 * path rests on (codegen/emit_cuda.c, "half2").  The C kernels compute an
 * fp16 a + b, a - b or a * b by widening a and b to f32, doing the f32
 * operation (rounded to nearest even) and rounding the f32 result to fp16;
 * the half2 path does one f16x2 instruction, which rounds the exact result
 * once.  Both agree when
 *
 *     RNE16(RNE32(a op b)) == RNE16(a op b)
 *
 * for all binary16 a, b (double rounding is innocuous because binary32's
 * 24-bit significand has at least 2 * 11 + 2 bits: Figueroa, "When is
 * double rounding innocuous?", SIGNUM Newsletter 30(3), 1995).  This test
 * checks it against an exactly rounded reference built independently of
 * both: every finite fp16 value as an integer multiple of 2^-48, the exact
 * result as such an integer, the nearest fp16 value found by binary search
 * in the table of all 31,744 finite magnitudes, ties by comparing the two
 * distances exactly and taking the even pattern, 65520 and beyond to inf.
 *
 * Pairs checked (both orders, each of add, sub, mul):
 *   - every fp16 pattern with each of 64 partners (zeros, subnormals, the
 *     normal boundary, 1 and its neighbours, 2048's ulp step, the largest
 *     finite, infinities, quiet and signalling NaNs, random ones);
 *   - add and sub of every pair of both signs from the subnormals with
 *     themselves and with the first normal binade, from [1, 2) with
 *     [0.5, 1), and from the top binade with itself (mul of fp16 values
 *     is exact in f32);
 *   - 2,000,000 random pairs, half of them with exponents at most 12
 *     apart (where ties and near-ties occur);
 *   - with --all, every one of the 2^32 pairs (not part of ctest: about
 *     15 minutes on one core; run 2026-11-30: all 12,884,901,888 results
 *     agree, 434,767,292 of them ties).
 * A NaN must meet a NaN (payloads are not compared: PTX leaves the NaN of
 * f16x2 arithmetic unspecified).  Controls, so that the test can be seen
 * to discriminate: the same exact results rounded first to p = 24 bits by
 * integer arithmetic must also agree (a second derivation of the claim),
 * rounded first to 21 bits (fewer than 2 * 11) must not, and a fused
 * a * b + c rounded once must differ from the C kernels' mul-then-add for
 * some triples (why the half2 path never contracts into fma).  Exits 1 on
 * any mismatch or failed control. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/duet_half.h"

#define N_FINITE 0x7c00         /* finite non-negative fp16 patterns */
#define INF_AT (0xfff0ull << 48) /* 65520 in units of 2^-48: rounds to inf */
#define NAN16 0x7e00u

/* The exact reference's table and the counts of one run. */
typedef struct Ctx {
  uint64_t *mag; /* mag[k]: the value of fp16 pattern k (0 .. 0x7bff) in units of 2^-48 */
  long long checked, bad, ties;
  long long p24_bad, p21_bad; /* the controls' mismatches */
} Ctx;

static bool is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }

/* The C kernels' operation (runtime/duet_half.h; one f32 operation, no
 * contraction possible). */
static uint16_t c_kernel(uint16_t a, uint16_t b, int op) {
  float x = duet_f32_from_f16(a), y = duet_f32_from_f16(b);
  volatile float z = op == 0 ? x + y : op == 1 ? x - y : x * y;
  return duet_f16_from_f32(z);
}

static int bitlen(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

/* The fp16 pattern nearest to sign * x (x in units of 2^-48, x < INF_AT,
 * or `huge` for x >= INF_AT), ties to the even pattern; counts ties. */
static uint16_t round16(Ctx *c, unsigned sign, uint64_t x, bool huge, bool count) {
  if (huge || x >= INF_AT) return (uint16_t)(sign << 15 | 0x7c00u);
  int lo = 0, hi = N_FINITE - 1; /* the largest k with mag[k] <= x */
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (c->mag[mid] <= x) lo = mid;
    else hi = mid - 1;
  }
  int k = lo;
  if (c->mag[k] != x && k < N_FINITE - 1) { /* between k and k + 1 (above 65504: below 65520, so k) */
    uint64_t d1 = x - c->mag[k], d2 = c->mag[k + 1] - x;
    if (d1 > d2 || (d1 == d2 && (k & 1))) k++;
    if (d1 == d2 && count) c->ties++;
  }
  return (uint16_t)(sign << 15 | (unsigned)k);
}

/* |x| rounded to p significant bits, nearest even; *huge when that
 * reaches 2^64. */
static uint64_t round_bits(uint64_t x, int p, bool *huge) {
  int n = bitlen(x);
  *huge = false;
  if (n <= p) return x;
  int sh = n - p;
  uint64_t kept = x >> sh, rem = x & ((1ull << sh) - 1), half = 1ull << (sh - 1);
  kept += rem > half || (rem == half && (kept & 1));
  if (bitlen(kept) + sh > 64) {
    *huge = true;
    return 0;
  }
  return kept << sh;
}

/* The exact result of a op b: a NaN (*nan), an infinity or a finite value
 * sign * x, x in units of 2^-48 (*huge when x >= 2^64). */
typedef struct Exact {
  bool nan, inf, huge;
  unsigned sign;
  uint64_t x;
} Exact;

/* fp16 pattern -> sign, significand, exponent: value = m * 2^e */
static void split(uint16_t h, unsigned *s, uint64_t *m, int *e) {
  unsigned f = h >> 10 & 31u;
  *s = h >> 15;
  *m = (h & 0x3ffu) | (f ? 0x400u : 0);
  *e = (int)(f ? f : 1) - 25;
}

static Exact exact(uint16_t a, uint16_t b, int op) {
  Exact r = {0};
  if (op == 1) b ^= 0x8000u;
  if (is_nan(a) || is_nan(b)) return r.nan = true, r;
  bool ia = (a & 0x7fffu) == 0x7c00u, ib = (b & 0x7fffu) == 0x7c00u;
  bool za = (a & 0x7fffu) == 0, zb = (b & 0x7fffu) == 0;
  unsigned sa, sb;
  uint64_t ma, mb;
  int ea, eb;
  split(a, &sa, &ma, &ea);
  split(b, &sb, &mb, &eb);
  if (op == 2) {
    r.sign = sa ^ sb;
    if ((ia && zb) || (ib && za)) return r.nan = true, r;
    if (ia || ib) return r.inf = true, r;
    uint64_t p = ma * mb; /* < 2^22 */
    int sh = ea + eb + 48;  /* >= 0 */
    if (p && bitlen(p) + sh > 64) r.huge = true;
    else r.x = p << sh;
    return r;
  }
  if (ia && ib && sa != sb) return r.nan = true, r;
  if (ia || ib) return r.inf = true, r.sign = ia ? sa : sb, r;
  int64_t x = (int64_t)(ma << (ea + 24)), y = (int64_t)(mb << (eb + 24)); /* units of 2^-24, < 2^41 */
  int64_t s = (sa ? -x : x) + (sb ? -y : y);
  if (s == 0) return r.sign = za && zb && sa && sb, r; /* exact zero: +0, or -0 from -0 + -0 */
  r.sign = s < 0;
  uint64_t m = (uint64_t)(s < 0 ? -s : s);
  if (m >= (0xfff0ull << 24)) r.huge = true;
  else r.x = m << 24;
  return r;
}

static uint16_t exact_round(Ctx *c, const Exact *r, bool count) {
  if (r->nan) return NAN16;
  if (r->inf) return (uint16_t)(r->sign << 15 | 0x7c00u);
  return round16(c, r->sign, r->x, r->huge, count);
}

/* One pair and op: the C kernels' result against the exact one; with
 * `controls`, also the exact result pre-rounded to 24 and 21 bits. */
static void check(Ctx *c, uint16_t a, uint16_t b, int op, bool controls) {
  Exact r = exact(a, b, op);
  uint16_t want = exact_round(c, &r, true), got = c_kernel(a, b, op);
  c->checked++;
  if (got != want && !(is_nan(got) && is_nan(want))) {
    if (c->bad++ < 10)
      fprintf(stderr, "FAIL 0x%04x %c 0x%04x: f32 then fp16 gives 0x%04x, exactly rounded 0x%04x\n", a, "+-*"[op], b,
              got, want);
  }
  if (!controls || r.nan || r.inf || r.huge || r.x == 0) return;
  for (int p = 24; p >= 21; p -= 3) {
    bool huge;
    uint64_t y = round_bits(r.x, p, &huge);
    if (round16(c, r.sign, y, huge, false) != want) (*(p == 24 ? &c->p24_bad : &c->p21_bad))++;
  }
}

static void check_both(Ctx *c, uint16_t a, uint16_t b, bool controls) {
  for (int op = 0; op < 3; op++) {
    check(c, a, b, op, controls);
    check(c, b, a, op, controls);
  }
}

/* splitmix64 (Steele, Lea and Flood 2014): the random pairs */
static uint64_t next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Fused a * b + c rounded once, against the C kernels' f32 mul then f32
 * add then fp16 (operands of exponent fields 5-20, so every exact value
 * fits 64 bits in units of 2^-48); the number of triples that differ. */
static long long fma_differs(Ctx *c, uint64_t *seed, int n) {
  long long differ = 0;
  for (int i = 0; i < n; i++) {
    uint16_t h[3];
    for (int j = 0; j < 3; j++) {
      uint64_t x = next(seed);
      h[j] = (uint16_t)((x & 0x8000u) | (5 + (x >> 16) % 16) << 10 | (x >> 32 & 0x3ffu));
    }
    unsigned s[3];
    uint64_t m[3];
    int e[3];
    for (int j = 0; j < 3; j++) split(h[j], &s[j], &m[j], &e[j]);
    int64_t p = (int64_t)((m[0] * m[1]) << (e[0] + e[1] + 48)), q = (int64_t)(m[2] << (e[2] + 48));
    int64_t sum = (s[0] ^ s[1] ? -p : p) + (s[2] ? -q : q);
    uint16_t fused = sum == 0 ? 0 : round16(c, sum < 0, (uint64_t)(sum < 0 ? -sum : sum), false, false);
    volatile float prod = duet_f32_from_f16(h[0]) * duet_f32_from_f16(h[1]);
    volatile float tot = prod + duet_f32_from_f16(h[2]);
    differ += duet_f16_from_f32(tot) != fused;
  }
  return differ;
}

int main(int argc, char **argv) {
  bool all = argc > 1 && !strcmp(argv[1], "--all");
  if (argc > 1 && !all) {
    fprintf(stderr, "usage: test_half2_rounding [--all]\n");
    return 2;
  }
  Ctx c = {.mag = malloc(N_FINITE * sizeof(uint64_t))};
  if (!c.mag) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  for (unsigned k = 0; k < N_FINITE; k++) {
    unsigned f = k >> 10, m = k & 0x3ffu;
    c.mag[k] = f ? (uint64_t)(0x400u | m) << (f + 23) : (uint64_t)m << 24;
  }
  /* the reference on its own: each finite pattern rounds to itself, and
   * the midpoint above it to the even neighbour */
  for (unsigned k = 0; k + 1 < N_FINITE; k++) {
    uint64_t mid = c.mag[k] + (c.mag[k + 1] - c.mag[k]) / 2;
    if (round16(&c, 0, c.mag[k], false, false) != k || round16(&c, 1, mid, false, false) != (0x8000u | (k + (k & 1)))) {
      fprintf(stderr, "FAIL the reference rounds 0x%04x or the midpoint above it wrongly\n", k);
      return 1;
    }
  }
  uint64_t seed = 20251130;
  if (all) {
    for (uint32_t a = 0; a < 65536; a++) {
      for (uint32_t b = 0; b < 65536; b++)
        for (int op = 0; op < 3; op++) check(&c, (uint16_t)a, (uint16_t)b, op, false);
      if (a % 4096 == 4095) fprintf(stderr, "%u/16\n", (a + 1) / 4096);
    }
  } else {
    uint16_t partners[64] = {0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x0401,
                             0x07ff, 0x3c00, 0xbc00, 0x3c01, 0x3bff, 0xbbff, 0x3800, 0x4000, 0x6800, 0x6801,
                             0xe800, 0x67ff, 0x7bff, 0xfbff, 0x7bfe, 0x7800, 0x7c00, 0xfc00, 0x7e00, 0xfe00,
                             0x7c01, 0xfc01, 0x7d55, 0x1400, 0x1401, 0x9400, 0x0200, 0x5640, 0xd640, 0x2e66};
    for (int i = 40; i < 64; i++) partners[i] = (uint16_t)next(&seed);
    for (uint32_t a = 0; a < 65536; a++)
      for (int j = 0; j < 64; j++) check_both(&c, (uint16_t)a, partners[j], true);
    /* binades (exponent fields) of a and b, every pair of both signs */
    static const unsigned binades[4][2] = {{0, 0}, {0, 1}, {15, 14}, {30, 30}};
    for (int bd = 0; bd < 4; bd++)
      for (uint32_t i = 0; i < 2048; i++)
        for (uint32_t j = 0; j < 2048; j++) {
          uint16_t a = (uint16_t)((i & 1024) << 5 | binades[bd][0] << 10 | (i & 0x3ff));
          uint16_t b = (uint16_t)((j & 1024) << 5 | binades[bd][1] << 10 | (j & 0x3ff));
          check(&c, a, b, 0, false);
          check(&c, a, b, 1, false);
        }
    for (int i = 0; i < 1000000; i++) {
      uint64_t x = next(&seed);
      uint16_t a = (uint16_t)x, b = (uint16_t)(x >> 16);
      check_both(&c, a, b, true);
      /* b within 12 binades of a, random significand and sign */
      int f = (int)(a >> 10 & 31u) + (int)((x >> 32) % 25) - 12;
      if (f < 0 || f > 30) continue;
      b = (uint16_t)((x >> 40 & 0x8000u) | (unsigned)f << 10 | (x >> 48 & 0x3ffu));
      check_both(&c, a, b, true);
    }
  }
  long long fma = all ? 0 : fma_differs(&c, &seed, 1000000);
  printf("%lld results of fp16 add/sub/mul: %lld differ from the exactly rounded ones (%lld ties)\n", c.checked, c.bad,
         c.ties);
  int fails = c.bad != 0;
  if (!all) {
    printf("controls: pre-rounded to 24 bits, %lld differ (0 wanted); to 21 bits, %lld differ (some wanted); "
           "fused mul-add, %lld of 1000000 triples differ from mul then add (some wanted)\n",
           c.p24_bad, c.p21_bad, fma);
    fails += c.p24_bad != 0 || c.p21_bad == 0 || fma == 0 || c.ties == 0;
  }
  printf(fails ? "FAIL\n" : "ok: f32 arithmetic rounded to fp16 is the exactly rounded fp16 result\n");
  free(c.mag);
  return fails ? 1 : 0;
}
