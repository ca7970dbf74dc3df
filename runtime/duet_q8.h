/* runtime/duet_q8.h: the 8-bit block-wise quantization of AdamW's state
 * (`optimizer = adamw(..., state = int8)`, --optimizer-state int8), after
 * Dettmers, Lewis, Shleifer and Zettlemoyer, "8-bit Optimizers via
 * Block-wise Quantization" (ICLR 2022, arXiv:2110.02861).
 *
 * A moment of n values is stored as n one-byte codes and one f32 scale per
 * block of DUET_Q8_BLOCK consecutive values (the last block may be
 * shorter): value i = map[code i] * absmax of its block, where absmax is
 * the largest |value| of the block when it was quantized.  The maps are
 * the paper's dynamic ones, generated here from their definition (sec. 2
 * and Dettmers 2016, "8-Bit Approximations for Parallelism in Deep
 * Learning"):
 *
 *   first moment (signed): dynamic tree quantization.  Bit 7 is the sign.
 *     In bits 6..0, the number E (0..6) of zero bits before the first one
 *     bit (the indicator) is a decimal exponent, and the F = 6 - E bits
 *     after the indicator are a linear fraction f (0 .. 2^F - 1):
 *       |value| = 10^-E * (0.1 + 0.9 * (f + 1) / 2^F)
 *     so each decade [10^-E / 10, 10^-E] is cut into 2^F equal steps and a
 *     code holds the upper end of its step: the largest is exactly 1, the
 *     smallest non-zero 10^-6.  Bits 6..0 all zero: 0 (the code 0x80, a
 *     second zero, decodes to +0 and is never written).
 *   second moment (unsigned): dynamic quantization, the paper's variant
 *     for non-negative values: no sign bit; the same layout over all 8
 *     bits, so E is 0..7, F = 7 - E (one fraction bit more than the signed
 *     map at every exponent), the smallest non-zero value 10^-7, and 0x00
 *     is 0.
 * A value is the exact rational (2^F + 9 (f + 1)) / (10^(E+1) 2^F) rounded
 * once to f32 (numerator and denominator are exact doubles, one division,
 * one conversion), so every platform builds the same bits.
 *
 * Quantization of a block: absmax = max |x| (a NaN element makes it NaN),
 * then each x / absmax (f32 division; 0 when absmax is 0, so a block of
 * zeros stays zeros with scale 0 and no NaN) gets the code of the map
 * value nearest in magnitude, ties to the smaller magnitude, with x's sign
 * (signed map; a magnitude that rounds to 0 keeps code 0x00), except that
 * in the unsigned map a positive value never gets code 0 but the smallest
 * positive value's (10^-7 of the block's scale): the second moment is a
 * denominator, and an element whose v rounded to 0 while its m did not
 * would step by m / eps, 10^8 m (a run on 2,560 Fashion-MNIST images
 * diverged within 15 steps that way).  Among the
 * magnitudes val[0] = 0 < val[1] < ... (128 signed, 256 unsigned) the
 * nearest to y = |x| is val[k], k = the number of midpoints
 * (val[k] + val[k+1]) / 2 below y.  Those midpoints (exact in double) are
 * kept as f32 thresholds rounded down, which give the same count for every
 * f32 y (y > t_k exactly when y > mid_k: an f32 above t_k is at least the
 * next f32, which lies above mid_k).  The count is found with a table
 * indexed by y's exponent and top DUET_Q8_LUT_BITS fraction bits (from
 * 2^DUET_Q8_LUT_EMIN to 1): lut[cell] counts the thresholds below the
 * cell, and since no cell holds two thresholds (checked when the table is
 * built), k = lut[cell] + (y > thr[lut[cell]]).  A NaN gets some
 * deterministic code (its block's scale is NaN anyway).  The
 * generated kernels (codegen/emit_c.c, emit_cuda.c) do exactly this with
 * the tables of duet_q8_map printed into their source; tests/test_q8.c
 * checks this header against a brute-force search.
 *
 * Both maps decode code 0 to exactly 0, so the pruning masks zero a pruned
 * element's moments by zeroing its codes.  Header-only: included by the
 * code generator (which prints the tables), the runtime and the tests. */
#ifndef DUET_Q8_H
#define DUET_Q8_H

#include <math.h>
#include <stdint.h>

/* Values per quantization block (the paper's block size). */
#define DUET_Q8_BLOCK 2048

/* Blocks of a tensor of n values. */
static inline int64_t duet_q8_blocks(int64_t n) { return (n + DUET_Q8_BLOCK - 1) / DUET_Q8_BLOCK; }

/* The value of code c (0..255) in the signed map (is_signed = 1: the
 * first moment) or the unsigned one (0: the second moment). */
static inline float duet_q8_value(int is_signed, unsigned c) {
  int bits = is_signed ? 7 : 8;              /* bits of the exponent/fraction field */
  unsigned r = c & ((1u << bits) - 1);
  if (r == 0) return 0.0f;
  int e = 0;
  while (!(r & (1u << (bits - 1 - e)))) e++; /* zeros before the indicator */
  int f_bits = bits - 1 - e;
  unsigned f = r & ((1u << f_bits) - 1);
  double den = (double)(1u << f_bits) * 10.0;
  for (int k = 0; k < e; k++) den *= 10.0;   /* 10^(E+1) 2^F: exact, at most 1.28e10 */
  double num = (double)(1u << f_bits) + 9.0 * (double)(f + 1);
  float v = (float)(num / den);
  return is_signed && (c & 0x80u) ? -v : v;
}

/* The encoding table's cells: f32 magnitudes from 2^DUET_Q8_LUT_EMIN up to
 * 1, DUET_Q8_LUT_BITS fraction bits each (smaller magnitudes share cell 0,
 * larger ones the last). */
#define DUET_Q8_LUT_EMIN (-25)
#define DUET_Q8_LUT_BITS 8
#define DUET_Q8_LUT ((0 - DUET_Q8_LUT_EMIN) << DUET_Q8_LUT_BITS)
/* The cell of an f32 magnitude y >= 0 (its bits: exponent and top
 * fraction bits, offset and clamped). */
static inline int duet_q8_cell(float y) {
  union { float f; uint32_t u; } b = {y};
  int32_t c = (int32_t)(b.u >> (23 - DUET_Q8_LUT_BITS)) - ((127 + DUET_Q8_LUT_EMIN) << DUET_Q8_LUT_BITS);
  return c < 0 ? 0 : c >= DUET_Q8_LUT ? DUET_Q8_LUT - 1 : (int)c;
}

/* A map prepared for encoding: the n magnitudes val[0] = 0 < ... <
 * val[n-1] = 1 with their codes, the midpoints mid[k] = (val[k] +
 * val[k+1]) / 2 (exact in double) and as f32 thresholds thr[k] (mid[k]
 * rounded down; +inf from n - 1 on), lut[cell] = the thresholds below the
 * cell, and dec[c] = the value of code c. */
typedef struct DuetQ8Map {
  int n;                 /* 128 (signed: the magnitudes) or 256 */
  float val[256];
  unsigned char code[256];
  double mid[256];
  float thr[256];
  unsigned char lut[DUET_Q8_LUT];
  float dec[256];
} DuetQ8Map;

/* Builds the map; 0, or -1 if a table cell holds two thresholds (never, for
 * these maps: tests/test_q8.c). */
static inline int duet_q8_map(DuetQ8Map *m, int is_signed) {
  m->n = 0;
  for (unsigned c = 0; c < 256; c++) {
    m->dec[c] = duet_q8_value(is_signed, c);
    if (is_signed && c >= 0x80u) continue; /* the magnitudes: codes 0x00..0x7f */
    int k = m->n++;                         /* insertion sort: 256 entries, once per map */
    while (k > 0 && m->val[k - 1] > m->dec[c]) {
      m->val[k] = m->val[k - 1];
      m->code[k] = m->code[k - 1];
      k--;
    }
    m->val[k] = m->dec[c];
    m->code[k] = (unsigned char)c;
  }
  for (int k = 0; k < 256; k++) {
    if (k + 1 >= m->n) {
      m->mid[k] = m->thr[k] = (float)INFINITY;
      continue;
    }
    m->mid[k] = ((double)m->val[k] + (double)m->val[k + 1]) / 2;
    float t = (float)m->mid[k];
    if ((double)t > m->mid[k]) t = nextafterf(t, -(float)INFINITY); /* rounded down */
    m->thr[k] = t;
  }
  int rc = 0, k = 0;
  for (int c = 0; c < DUET_Q8_LUT; c++) {
    union { uint32_t u; float f; } lo = {(uint32_t)(c + ((127 + DUET_Q8_LUT_EMIN) << DUET_Q8_LUT_BITS)) << (23 - DUET_Q8_LUT_BITS)};
    union { uint32_t u; float f; } hi = {lo.u + (1u << (23 - DUET_Q8_LUT_BITS))};
    if (c == 0) lo.f = 0;                           /* cell 0 holds every smaller magnitude */
    if (c == DUET_Q8_LUT - 1) hi.f = (float)INFINITY; /* the last, every larger one */
    while (k < m->n - 1 && m->thr[k] < lo.f) k++; /* thresholds below every y of the cell */
    m->lut[c] = (unsigned char)k;
    if (k + 1 < m->n - 1 && m->thr[k + 1] < hi.f) rc = -1; /* two in one cell */
  }
  return rc;
}

/* The code of the map value nearest x in magnitude (x normally in
 * [-1, 1]; see above), as the generated kernels compute it. */
static inline unsigned char duet_q8_encode(const DuetQ8Map *m, float x) {
  float y = fabsf(x); /* +0 for -0 */
  int k = m->lut[duet_q8_cell(y)];
  k += y > m->thr[k];
  k += m->n == 256 && k == 0 && y > 0; /* unsigned: a positive value never becomes 0 */
  unsigned char c = m->code[k];
  return (unsigned char)(c | (m->n == 128 && x < 0 && k > 0 ? 0x80u : 0u));
}

/* Largest |x| with NaN propagation (the block scale's fold). */
static inline float duet_q8_absmax_step(float a, float x) {
  float ax = x < 0 ? -x : x;
  return ax > a || ax != ax ? ax : a;
}

/* Quantizes x[0..n) (n <= DUET_Q8_BLOCK: one block) into codes[0..n);
 * returns the block's scale. */
static inline float duet_q8_quantize_block(const DuetQ8Map *m, const float *x, int64_t n, unsigned char *codes) {
  float a = 0;
  for (int64_t i = 0; i < n; i++) a = duet_q8_absmax_step(a, x[i]);
  for (int64_t i = 0; i < n; i++) codes[i] = duet_q8_encode(m, a == 0 ? 0.0f : x[i] / a);
  return a;
}

#endif
