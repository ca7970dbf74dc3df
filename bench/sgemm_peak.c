/* bench/sgemm_peak.c: the machine's SGEMM speed (OpenBLAS, OpenMP build) for
 * the GEMM shapes of one fmnist_mlp training step (784-1024-1024-10, batch
 * 256, weights stored [in,out] as duet stores them) and for a large square
 * GEMM.  Prints one line per shape and the "exact-GEMM ceiling": the
 * samples/s a training step would reach if it did only its GEMMs at the
 * measured speed (batch / sum of the best per-shape times).
 *
 * Build (bench/run.sh does this):
 *   cc -O2 -fopenmp bench/sgemm_peak.c -o build/sgemm_peak \
 *      -I/usr/include/x86_64-linux-gnu/openblas-openmp \
 *      /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so
 * Usage: sgemm_peak [threads (default 2)] [square size (default 2048)]
 *
 * Output lines (whitespace separated, easy to parse):
 *   gemm NAME TA TB M N K best_ms GFLOP/s
 *   square N best_ms GFLOP/s
 *   step_gemm_ms X
 *   step_gemm_gflop X        (GFLOP in one step's GEMMs)
 *   step_gemm_gflops X       (their average speed)
 *   ceiling_samples_per_s X
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sgemm_util.h"

void openblas_set_num_threads(int n);

#define BATCH 256

/* Row-major, C[m,n] = op(A) op(B), as runtime/cpu.c calls cblas_sgemm. */
static const Shape step_shapes[] = {
    /* forward: h @ w, w stored [in, out] */
    {"fwd1", "X[256,784]@W1[784,1024]", 0, 0, BATCH, 1024, 784, 1},
    {"fwd2", "H1[256,1024]@W2[1024,1024]", 0, 0, BATCH, 1024, 1024, 1},
    {"fwd3", "H2[256,1024]@W3[1024,10]", 0, 0, BATCH, 10, 1024, 1},
    /* backward dX = dY @ W^T (B transposed); none for layer 1's input */
    {"dX3", "dZ3[256,10]@W3^T", 0, 1, BATCH, 1024, 10, 1},
    {"dX2", "dZ2[256,1024]@W2^T", 0, 1, BATCH, 1024, 1024, 1},
    /* backward dW = H^T @ dY (A transposed) */
    {"dW3", "H2^T@dZ3[256,10]", 1, 0, 1024, 10, BATCH, 1},
    {"dW2", "H1^T@dZ2[256,1024]", 1, 0, 1024, 1024, BATCH, 1},
    {"dW1", "X^T@dZ1[256,1024]", 1, 0, 784, 1024, BATCH, 1},
};
#define N_SHAPES (int)(sizeof step_shapes / sizeof step_shapes[0])

/* Best time of one call, in seconds: `reps` timed trials after a warm-up;
 * a trial repeats the call enough times to last >= ~2 ms. */
static double best_time(const Shape *s, int reps) {
  unsigned seed = 12345;
  float *a = fill((size_t)s->m * s->k, &seed), *b = fill((size_t)s->k * s->n, &seed);
  float *c = fill((size_t)s->m * s->n, &seed);
  for (int i = 0; i < 3; i++) gemm(s, a, b, c);
  double t0 = now();
  gemm(s, a, b, c);
  double one = now() - t0;
  int inner = one > 2e-3 ? 1 : (int)(2e-3 / (one > 1e-7 ? one : 1e-7)) + 1;
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    t0 = now();
    for (int i = 0; i < inner; i++) gemm(s, a, b, c);
    double t = (now() - t0) / inner;
    if (t < best) best = t;
  }
  free(a);
  free(b);
  free(c);
  return best;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  int sq = argc > 2 ? atoi(argv[2]) : 2048;
  if (threads < 1 || sq < 1) {
    fprintf(stderr, "usage: sgemm_peak [threads] [square size]\n");
    return 2;
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  printf("threads %d\n", threads);

  double total_t = 0, total_flop = 0;
  for (int i = 0; i < N_SHAPES; i++) {
    const Shape *s = &step_shapes[i];
    double t = best_time(s, 15);
    double flop = 2.0 * s->m * s->n * s->k;
    total_t += t;
    total_flop += flop;
    printf("gemm %-5s %c %c %5d %5d %5d %9.4f ms %7.1f GFLOP/s   # %s\n", s->name, s->ta ? 'T' : 'N',
           s->tb ? 'T' : 'N', s->m, s->n, s->k, t * 1e3, flop / t * 1e-9, s->what);
  }
  Shape square = {"square", "", 0, 0, sq, sq, sq, 1};
  double tsq = best_time(&square, 5);
  double sq_gflops = 2.0 * sq * sq * sq / tsq * 1e-9;
  printf("square %d %.3f ms %.1f GFLOP/s\n", sq, tsq * 1e3, sq_gflops);
  printf("step_gemm_ms %.4f\n", total_t * 1e3);
  printf("step_gemm_gflop %.4f\n", total_flop * 1e-9);
  printf("step_gemm_gflops %.1f\n", total_flop / total_t * 1e-9);
  printf("ceiling_samples_per_s %.0f\n", BATCH / total_t);
  return 0;
}
