/* bench/sgemm_gpt.c: the machine's SGEMM speed (OpenBLAS, OpenMP build) for
 * the GEMM shapes of one gpt_kjv training step (models/gpt_kjv.model: 4
 * layers, 4 heads, n_embd 256, block 128, batch 16, vocab 256, tied
 * embedding; weights stored [in, out] as duet stores them) and for a large
 * square GEMM.  A copy of bench/sgemm_peak.c with this model's shapes.
 *
 * A step has 75 weight GEMMs in 9 distinct shapes (M = batch * block = 2048
 * rows): per layer the forward of q, k, v, attention projection, MLP up and
 * MLP down, the backward dX = dY W^T of each (every linear's input needs a
 * gradient: it descends from wte and wpe) and dW = X^T dY of each; and the
 * tied head's forward (x wte^T), dX (dlogits wte) and dW (dlogits^T x).  The
 * embedding lookups are gathers (their backward a scatter-add): no GEMMs.
 * Attention's six T x T x D products per (batch, head) and layer (forward
 * S = Q K^T, O = P V; backward dP = dO V^T, dV = P^T dO, dQ = dS K,
 * dK = dS^T Q) are timed as dense 128x128x64 GEMMs, the batch * heads of a
 * layer in parallel with single-threaded GEMMs, and then, as the FLOPs of
 * the causal lower triangle (diagonal included) are what counts, scaled by
 * (T + 1) / (2 T).
 *
 * Build (bench/run_gpt.sh does this):
 *   cc -O2 -fopenmp bench/sgemm_gpt.c -o build/sgemm_gpt \
 *      -I/usr/include/x86_64-linux-gnu/openblas-openmp \
 *      /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so
 * Usage: sgemm_gpt [threads (default 2)] [square size (default 2048)]
 *
 * Output lines (whitespace separated, easy to parse):
 *   gemm NAME TA TB M N K COUNT best_ms GFLOP/s
 *   attn NAME TA TB M N K COUNT best_ms_per_batch GFLOP/s   (one batch = B*H GEMMs)
 *   square N best_ms GFLOP/s
 *   step_gemm_ms X      step_gemm_gflop X      step_gemm_gflops X
 *   step_attn_ms X      step_attn_gflop X      (lower triangle)  step_attn_full_gflop X
 *   step_ms X           step_gflop X           step_gflops X
 *   ceiling_tokens_per_s X   (tokens / step_ms: GEMMs and attention products only)
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sgemm_util.h"

void openblas_set_num_threads(int n);

#define BATCH 16
#define BLOCK 128
#define EMBD 256
#define HEADS 4
#define LAYERS 4
#define VOCAB 256
#define ROWS (BATCH * BLOCK)
#define HD (EMBD / HEADS)

/* Row-major, C[m,n] = op(A) op(B), as runtime/cpu.c calls cblas_sgemm.
 * Shapes that occur more than once are timed once and counted `count` times. */
static const Shape step_shapes[] = {
    /* forward: x @ w, w stored [in, out] */
    {"fwd_qkvo", "x[2048,256]@W[256,256]: q,k,v,attn-proj x4 layers; + head dX dlogits@wte", 0, 0, ROWS, EMBD, EMBD,
     4 * LAYERS + 1},
    {"fwd_fc", "x[2048,256]@Wfc[256,1024] x4", 0, 0, ROWS, 4 * EMBD, EMBD, LAYERS},
    {"fwd_proj", "g[2048,1024]@Wpr[1024,256] x4", 0, 0, ROWS, EMBD, 4 * EMBD, LAYERS},
    /* backward dX = dY @ W^T (B transposed); the head's forward x @ wte^T too */
    {"dX_qkvo", "dY[2048,256]@W^T: q,k,v,attn-proj x4; + head fwd x@wte^T", 0, 1, ROWS, EMBD, EMBD, 4 * LAYERS + 1},
    {"dX_fc", "dY[2048,1024]@Wfc^T x4", 0, 1, ROWS, EMBD, 4 * EMBD, LAYERS},
    {"dX_proj", "dY[2048,256]@Wpr^T x4", 0, 1, ROWS, 4 * EMBD, EMBD, LAYERS},
    /* backward dW = X^T @ dY (A transposed) */
    {"dW_qkvo", "x^T@dY -> [256,256]: q,k,v,attn-proj x4; + head dW dlogits^T@x", 1, 0, EMBD, EMBD, ROWS,
     4 * LAYERS + 1},
    {"dW_fc", "x^T@dY -> [256,1024] x4", 1, 0, EMBD, 4 * EMBD, ROWS, LAYERS},
    {"dW_proj", "g^T@dY -> [1024,256] x4", 1, 0, 4 * EMBD, EMBD, ROWS, LAYERS},
};
#define N_SHAPES (int)(sizeof step_shapes / sizeof step_shapes[0])

/* Attention's products of one (batch, head), dense; count = per step, in
 * units of one batch of BATCH * HEADS GEMMs. */
static const Shape attn_shapes[] = {
    {"S,dP", "Q@K^T (fwd), dO@V^T (bwd): [128,64]@[64,128]", 0, 1, BLOCK, BLOCK, HD, 2 * LAYERS},
    {"O,dQ", "P@V (fwd), dS@K (bwd): [128,128]@[128,64]", 0, 0, BLOCK, HD, BLOCK, 2 * LAYERS},
    {"dV,dK", "P^T@dO, dS^T@Q (bwd): [128,128]^T@[128,64]", 1, 0, BLOCK, HD, BLOCK, 2 * LAYERS},
};
#define N_ATTN (int)(sizeof attn_shapes / sizeof attn_shapes[0])

/* `nb` independent GEMMs of shape s: one call (nb == 1, OpenBLAS's own
 * threads) or nb calls spread over the OpenMP threads (OpenBLAS runs
 * single-threaded inside a parallel region). */
static void run(const Shape *s, int nb, float *const *a, float *const *b, float *const *c) {
  if (nb == 1) {
    gemm(s, a[0], b[0], c[0]);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int i = 0; i < nb; i++) gemm(s, a[i], b[i], c[i]);
}

/* Best time of one run(), in seconds: `reps` timed trials after a warm-up;
 * a trial repeats the call enough times to last >= ~2 ms. */
static double best_time(const Shape *s, int nb, int reps) {
  unsigned seed = 12345;
  float **a = malloc(3 * (size_t)nb * sizeof *a), **b = a + nb, **c = b + nb;
  if (!a) {
    fprintf(stderr, "sgemm_gpt: out of memory\n");
    exit(1);
  }
  for (int i = 0; i < nb; i++) {
    a[i] = fill((size_t)s->m * s->k, &seed);
    b[i] = fill((size_t)s->k * s->n, &seed);
    c[i] = fill((size_t)s->m * s->n, &seed);
  }
  for (int i = 0; i < 3; i++) run(s, nb, a, b, c);
  double t0 = now();
  run(s, nb, a, b, c);
  double one = now() - t0;
  int inner = one > 2e-3 ? 1 : (int)(2e-3 / (one > 1e-7 ? one : 1e-7)) + 1;
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    t0 = now();
    for (int i = 0; i < inner; i++) run(s, nb, a, b, c);
    double t = (now() - t0) / inner;
    if (t < best) best = t;
  }
  for (int i = 0; i < nb; i++) {
    free(a[i]);
    free(b[i]);
    free(c[i]);
  }
  free(a);
  return best;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  int sq = argc > 2 ? atoi(argv[2]) : 2048;
  if (threads < 1 || sq < 1) {
    fprintf(stderr, "usage: sgemm_gpt [threads] [square size]\n");
    return 2;
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  printf("threads %d\n", threads);

  double gemm_t = 0, gemm_flop = 0;
  for (int i = 0; i < N_SHAPES; i++) {
    const Shape *s = &step_shapes[i];
    double t = best_time(s, 1, 15);
    double flop = 2.0 * s->m * s->n * s->k;
    gemm_t += s->count * t;
    gemm_flop += s->count * flop;
    printf("gemm %-8s %c %c %5d %5d %5d %3d %9.4f ms %7.1f GFLOP/s   # %s\n", s->name, s->ta ? 'T' : 'N',
           s->tb ? 'T' : 'N', s->m, s->n, s->k, s->count, t * 1e3, flop / t * 1e-9, s->what);
  }
  /* attention: dense timing, lower-triangle FLOPs and time */
  const double tri = (BLOCK + 1) / (2.0 * BLOCK);
  double attn_t = 0, attn_full = 0;
  const int nb = BATCH * HEADS;
  for (int i = 0; i < N_ATTN; i++) {
    const Shape *s = &attn_shapes[i];
    double t = best_time(s, nb, 15);
    double flop = 2.0 * s->m * s->n * s->k * nb;
    attn_t += s->count * t * tri;
    attn_full += s->count * flop;
    printf("attn %-8s %c %c %5d %5d %5d %3d %9.4f ms %7.1f GFLOP/s   # %d x %s, dense\n", s->name,
           s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->m, s->n, s->k, s->count, t * 1e3, flop / t * 1e-9, nb, s->what);
  }
  double attn_flop = attn_full * tri;
  Shape square = {"square", "", 0, 0, sq, sq, sq, 1};
  double tsq = best_time(&square, 1, 5);
  double sq_gflops = 2.0 * sq * sq * sq / tsq * 1e-9;
  printf("square %d %.3f ms %.1f GFLOP/s\n", sq, tsq * 1e3, sq_gflops);
  printf("step_gemm_ms %.4f\n", gemm_t * 1e3);
  printf("step_gemm_gflop %.4f\n", gemm_flop * 1e-9);
  printf("step_gemm_gflops %.1f\n", gemm_flop / gemm_t * 1e-9);
  printf("step_attn_ms %.4f\n", attn_t * 1e3);
  printf("step_attn_gflop %.4f\n", attn_flop * 1e-9);
  printf("step_attn_full_gflop %.4f\n", attn_full * 1e-9);
  printf("step_ms %.4f\n", (gemm_t + attn_t) * 1e3);
  printf("step_gflop %.4f\n", (gemm_flop + attn_flop) * 1e-9);
  printf("step_gflops %.1f\n", (gemm_flop + attn_flop) / (gemm_t + attn_t) * 1e-9);
  printf("ceiling_tokens_per_s %.0f\n", ROWS / (gemm_t + attn_t));
  return 0;
}
