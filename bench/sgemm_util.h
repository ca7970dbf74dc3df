/* bench/sgemm_util.h: what bench/sgemm_peak.c and bench/sgemm_gpt.c share:
 * a GEMM shape, a monotonic clock, random operands, one row-major SGEMM. */
#ifndef DUET_BENCH_SGEMM_UTIL_H
#define DUET_BENCH_SGEMM_UTIL_H

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* C[m,n] = op(A) @ op(B), row-major; `count` calls of it per training step
 * (0 where the caller does not use it). */
typedef struct {
  const char *name, *what;
  int ta, tb, m, n, k, count;
} Shape;

/* seconds, monotonic */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* n floats in [-0.5, 0.5), 64-byte aligned, from an LCG (Numerical Recipes'
 * constants); exits when out of memory */
static float *fill(size_t n, unsigned *seed) {
  size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
  float *p = aligned_alloc(64, bytes ? bytes : 64);
  if (!p) {
    fprintf(stderr, "bench: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    p[i] = (float)((*seed >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
  return p;
}

/* one call, exactly as runtime/cpu.c makes it */
static void gemm(const Shape *s, const float *a, const float *b, float *c) {
  int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
  cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, s->m, s->n, s->k,
              1.0f, a, lda, b, ldb, 0.0f, c, s->n);
}

#endif
