/* runtime/duet_half.h: conversions between binary32 (float) and the two
 * 16-bit float formats duet stores, as static inline C99 with no other
 * dependency.  The runtime (16-bit GEMMs) includes this file, and the C
 * emitter pastes its text into generated kernels (build/gen/duet_half_src.c
 * holds it as a string), so both use the same code.
 *
 *   f16:  IEEE 754-2008 binary16: 1 sign, 5 exponent (bias 15), 10 fraction
 *         bits; largest finite 65504, smallest normal 2^-14, smallest
 *         subnormal 2^-24.
 *   bf16: bfloat16: the upper 16 bits of a binary32 (8 exponent bits, 7
 *         fraction bits), as in TensorFlow and PyTorch.
 *
 * Narrowing rounds to nearest, ties to even (IEEE 754 default rounding),
 * including into and within the f16 subnormals; values at or beyond the
 * rounding boundary of the largest finite number (65520 for f16) become
 * infinity; a NaN stays a NaN of the same sign with the quiet bit set and
 * the top payload bits kept.  Widening is exact.  The f16 subnormal path
 * uses the float adder to round (add 0.5, whose ulp is 2^-24: Giesen,
 * "float->half variants", 2016), so it needs the default rounding mode and no
 * flush-to-zero, which C programs get unless they ask otherwise. */
#ifndef DUET_HALF_H
#define DUET_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t duet_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float duet_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* c ? a : b as bit masks: gcc turns a chain of ?: into branches, which stop
 * loops from vectorising (unsigned -> float conversions too, hence the
 * int32_t casts). */
static inline uint32_t duet_select_u32(int c, uint32_t a, uint32_t b) {
  uint32_t m = 0u - (uint32_t)(c != 0);
  return (a & m) | (b & ~m);
}

/* Written without branches (every case computed, then selected) so that
 * loops over tensors vectorise. */
#pragma omp declare simd notinbranch
static inline uint16_t duet_f16_from_f32(float f) {
  uint32_t x = duet_f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  /* normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to
   * nearest even; a carry out of the fraction correctly bumps the exponent.
   * 0xc8000fff = (15 - 127) << 23 (mod 2^32) plus half an ulp minus one. */
  uint32_t normal = (ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13;
  /* below 2^-14: a subnormal or zero; 0.5 + |f| rounds |f| to a multiple of 2^-24 */
  uint32_t sub = duet_f32_bits(duet_bits_f32(ax) + 0.5f) - 0x3f000000u;
  uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu); /* quiet, top payload bits kept */
  uint32_t r = duet_select_u32(ax < 0x38800000u, sub, normal);
  r = duet_select_u32(ax >= 0x477ff000u, 0x7c00u, r); /* >= 65520 and inf: inf */
  r = duet_select_u32(ax > 0x7f800000u, nan, r);
  return (uint16_t)(sign | r);
}

#pragma omp declare simd notinbranch
static inline float duet_f32_from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t normal = ((e + 112u) << 23) | (m << 13);
  uint32_t special = 0x7f800000u | (m << 13);                 /* inf, NaN */
  uint32_t sub = duet_f32_bits((float)(int32_t)m * 0x1p-24f); /* zero, subnormal: m * 2^-24, exact */
  uint32_t r = duet_select_u32(e == 31u, special, normal);
  r = duet_select_u32(e == 0u, sub, r);
  return duet_bits_f32(sign | r);
}

#pragma omp declare simd notinbranch
static inline uint16_t duet_bf16_from_f32(float f) {
  uint32_t x = duet_f32_bits(f);
  uint32_t nan = (x >> 16) | 0x40u, r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16; /* NaN quiet; nearest even */
  return (uint16_t)duet_select_u32((x & 0x7fffffffu) > 0x7f800000u, nan, r);
}

#pragma omp declare simd notinbranch
static inline float duet_f32_from_bf16(uint16_t h) { return duet_bits_f32((uint32_t)h << 16); }

#endif
