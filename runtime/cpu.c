#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* runtime/cpu.c: the CPU device (kernels as C function pointers, GEMM
 * through CBLAS), the RNG, and sessions (a program loaded on a device). */
#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "duet_half.h"
#include "duet_rt.h"
#include "dist.h"
#include "pipeline.h"

/* OpenBLAS's own thread-count setter (OpenMP build: the same pool). */
void openblas_set_num_threads(int n);

/* ------------------------------------------------------------------ rng */

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void duet_rng_seed(DuetRng *r, uint64_t seed, uint64_t stream) {
  uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t duet_rng_next(DuetRng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double duet_rng_uniform(DuetRng *r) { return (double)(duet_rng_next(r) >> 11) * 0x1.0p-53; }

double duet_rng_normal(DuetRng *r) {
  double u1 = duet_rng_uniform(r), u2 = duet_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ----------------------------------------------------------- cpu device */

typedef struct CpuCtx {
  const DuetKernelFn *kernels;
  int n;
  float *scratch;   /* 16-bit GEMMs: the operands and result widened to f32 */
  size_t scratch_n; /* floats */
} CpuCtx;

static void *cpu_alloc(DuetDevice *d, size_t bytes) {
  size_t n = (bytes + 63) & ~(size_t)63;
  void *p = aligned_alloc(64, n ? n : 64);
  if (!p) {
    snprintf(d->err, sizeof d->err, "out of host memory allocating %zu bytes", bytes);
    return NULL;
  }
  memset(p, 0, n ? n : 64);
  return p;
}

static void cpu_free(DuetDevice *d, void *p) {
  (void)d;
  free(p);
}

static int cpu_copy(DuetDevice *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  memcpy(dst, src, bytes);
  return 0;
}

/* Two CPU devices share the host's memory: a direct copy is one memcpy
 * between their arenas. */
static int cpu_peer_path(DuetDevice *src_dev, DuetDevice *dst_dev) {
  if (src_dev->ops != dst_dev->ops) {
    snprintf(src_dev->err, sizeof src_dev->err, "peer_path between a %s and a %s device", src_dev->ops->name,
             dst_dev->ops->name);
    return -1;
  }
  return DUET_PEER_HOST_MEMORY;
}

static int cpu_copy_peer(DuetDevice *src_dev, void *dst, DuetDevice *dst_dev, const void *src, size_t bytes) {
  (void)src_dev;
  (void)dst_dev;
  memcpy(dst, src, bytes);
  return 0;
}

static int cpu_launch(DuetDevice *d, int kernel, void *const *t, const double *s) {
  CpuCtx *c = d->ctx;
  if (kernel < 0 || kernel >= c->n) {
    snprintf(d->err, sizeof d->err, "kernel %d out of range (program has %d)", kernel, c->n);
    return -1;
  }
  c->kernels[kernel](t, s);
  return 0;
}

/* n elements of a 16-bit tensor to f32, and back (round to nearest even). */
static void widen16(float *dst, const uint16_t *src, int64_t n, int dtype) {
  if (dtype == DUET_F16) {
    #pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++) dst[i] = duet_f32_from_f16(src[i]);
  } else {
    #pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++) dst[i] = duet_f32_from_bf16(src[i]);
  }
}

static void narrow16(uint16_t *dst, const float *src, int64_t n, int dtype) {
  if (dtype == DUET_F16) {
    #pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++) dst[i] = duet_f16_from_f32(src[i]);
  } else {
    #pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++) dst[i] = duet_bf16_from_f32(src[i]);
  }
}

/* A GEMM of 16-bit operands with f32 accumulation: A and B widened exactly
 * to f32, cblas_sgemm, the result rounded to the 16-bit dtype.  (OpenBLAS's
 * cblas_sbgemm covers bf16 inputs only, with an f32 result; one path for
 * both dtypes keeps their numerics alike.) */
static int cpu_gemm16(DuetDevice *d, const DuetStep *st, void *const *t, int m, int n, int k) {
  CpuCtx *c = d->ctx;
  size_t na = (size_t)m * (size_t)k, nb = (size_t)k * (size_t)n, nc = (size_t)m * (size_t)n, need = na + nb + nc;
  if (need > c->scratch_n) {
    free(c->scratch);
    c->scratch_n = 0;
    if (!(c->scratch = malloc(need * sizeof(float)))) {
      snprintf(d->err, sizeof d->err, "out of host memory for a %zu-element GEMM workspace", need);
      return -1;
    }
    c->scratch_n = need;
  }
  float *A = c->scratch, *B = A + na, *C = B + nb;
  widen16(A, t[st->a], (int64_t)na, st->dtype);
  widen16(B, t[st->b], (int64_t)nb, st->dtype);
  enum CBLAS_TRANSPOSE ta = st->ta ? CblasTrans : CblasNoTrans, tb = st->tb ? CblasTrans : CblasNoTrans;
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, A, st->ta ? m : k, B, st->tb ? k : n, 0.0f, C, n);
  narrow16(t[st->c], C, (int64_t)nc, st->dtype);
  return 0;
}

static int cpu_gemm(DuetDevice *d, const DuetStep *st, void *const *t) {
  int m = (int)st->m, n = (int)st->n, k = (int)st->k;
  if (st->m > INT32_MAX || st->n > INT32_MAX || st->k > INT32_MAX) {
    snprintf(d->err, sizeof d->err, "GEMM %lldx%lldx%lld exceeds CBLAS's int dimensions", (long long)st->m,
             (long long)st->n, (long long)st->k);
    return -1;
  }
  enum CBLAS_TRANSPOSE ta = st->ta ? CblasTrans : CblasNoTrans, tb = st->tb ? CblasTrans : CblasNoTrans;
  int lda = st->ta ? m : k, ldb = st->tb ? k : n;
  if (st->dtype == DUET_F32)
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, t[st->a], lda, t[st->b], ldb, 0.0f, t[st->c], n);
  else if (st->dtype == DUET_F64)
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, t[st->a], lda, t[st->b], ldb, 0.0, t[st->c], n);
  else if (st->dtype == DUET_F16 || st->dtype == DUET_BF16)
    return cpu_gemm16(d, st, t, m, n, k);
  else {
    snprintf(d->err, sizeof d->err, "GEMM of dtype %d is not supported on the CPU", st->dtype);
    return -1;
  }
  return 0;
}

/* elementwise, so the threads may split it without changing a bit */
void duet_host_accumulate(void *dst, const void *src, int64_t n, int dtype, int first) {
  if (first) {
    memcpy(dst, src, (size_t)n * (dtype == DUET_F64 ? 8 : 4));
  } else if (dtype == DUET_F64) {
    double *a = dst;
    const double *b = src;
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t k = 0; k < n; k++) a[k] += b[k];
  } else {
    float *a = dst;
    const float *b = src;
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t k = 0; k < n; k++) a[k] += b[k];
  }
}

static int cpu_accumulate(DuetDevice *d, void *dst, const void *src, int64_t n, int dtype, int first) {
  if (dtype != DUET_F32 && dtype != DUET_F64) {
    snprintf(d->err, sizeof d->err, "accumulate: dtype %d is not f32 or f64", dtype);
    return -1;
  }
  duet_host_accumulate(dst, src, n, dtype, first);
  return 0;
}

static int cpu_sync(DuetDevice *d) {
  (void)d;
  return 0;
}

static void cpu_destroy(DuetDevice *d) {
  if (!d) return;
  if (d->ctx) free(((CpuCtx *)d->ctx)->scratch);
  free(d->ctx);
  free(d);
}

static const DuetDeviceOps cpu_ops = {
    .api_version = DUET_RT_API_VERSION,
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .launch = cpu_launch,
    .gemm = cpu_gemm,
    .sync = cpu_sync,
    .destroy = cpu_destroy,
    .allreduce = NULL,
    .peer_path = cpu_peer_path,
    .copy_peer = cpu_copy_peer,
    .host_alloc = NULL,
    .host_free = NULL,
    .accumulate = cpu_accumulate,
};

DuetDevice *duet_cpu_device(const DuetKernelFn *kernels, int n, int threads) {
  DuetDevice *d = calloc(1, sizeof *d);
  CpuCtx *c = calloc(1, sizeof *c);
  if (!d || !c) {
    free(d);
    free(c);
    return NULL;
  }
  c->kernels = kernels;
  c->n = n;
  d->ops = &cpu_ops;
  d->ctx = c;
  if (threads > 0) {
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    openblas_set_num_threads(threads);
  }
  return d;
}

/* ------------------------------------------------------------- sessions */

struct DuetSession {
  const DuetProgram *p;
  DuetDevice *dev;
  DuetConfig cfg;
  void *region[DUET_MEM_COUNT];
  void **ptr; /* tensor id -> address */
  double s[DUET_S_COUNT];
  int64_t step; /* training steps taken (skipped ones included) */
  int64_t total; /* the run's steps, for the learning-rate schedule (0: unknown) */
  double grad_norm; /* --clip-grad-norm: the last step's global norm (NaN: none) */
  DuetScaler scaler; /* dynamic loss scaling (p->n_unscale > 0) */
  int32_t *overflow; /* device memory: the unscale kernels' flags, t[n_tensors] */
  double *prof; /* DUET_PROFILE=1: seconds per train step entry, summed */
  int64_t prof_runs;
  DuetPipe *pipe; /* a pipelined program (p->n_stages >= 1); dev is then a
                   * CPU device of its own for host copies (checkpoints) */
  int64_t n_valid;
  bool own_dev; /* the pipeline's host-copy device, freed with the session */
  int64_t rss_growth; /* VmRSS after allocating the regions (and, for a pipeline, making it) less before; -1: unknown */
  void *staging; /* duet_session_staging */
  size_t staging_bytes;
  bool dp_check;      /* DUET_DP_CHECK=1: replicas compared after every training step */
  int64_t dp_checked; /* steps compared so far */
  char err[800];
};

static double mono_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Fans: a matrix is [in, out] (duet multiplies x @ w); a convolution
 * weight is [out, in, kh, kw] as in torch, whose
 * _calculate_fan_in_and_fan_out multiplies by the receptive field. */
static void fan(const DuetTensor *t, double *fan_in, double *fan_out) {
  *fan_in = t->rank >= 1 ? (double)t->shape[0] : 1;
  *fan_out = t->rank >= 2 ? (double)t->shape[1] : 1;
  if (t->rank >= 3) {
    double rf = 1;
    for (int d = 2; d < t->rank; d++) rf *= (double)t->shape[d];
    *fan_in = (double)t->shape[1] * rf;
    *fan_out = (double)t->shape[0] * rf;
  }
}

static void init_tensor(const DuetTensor *t, void *mem, uint64_t seed, uint64_t stream) {
  if (t->dtype == DUET_I8) { /* int8 weights of a quantized program: zeros until a checkpoint fills them */
    memset(mem, 0, (size_t)t->nbytes);
    return;
  }
  int64_t n = t->nbytes / (t->dtype == DUET_F64 ? 8 : 4);
  DuetRng r;
  duet_rng_seed(&r, seed, stream);
  double fi, fo, lo = 0, hi = 0;
  fan(t, &fi, &fo);
  switch (t->init) {
  case DUET_INIT_KAIMING_UNIFORM: hi = sqrt(6.0 / fi), lo = -hi; break;
  case DUET_INIT_XAVIER_UNIFORM: hi = sqrt(6.0 / (fi + fo)), lo = -hi; break;
  case DUET_INIT_UNIFORM: lo = t->init_a, hi = t->init_b; break;
  default: break;
  }
  for (int64_t i = 0; i < n; i++) {
    double x;
    switch (t->init) {
    case DUET_INIT_ONES: x = 1; break;
    case DUET_INIT_NORMAL: x = t->init_a * duet_rng_normal(&r); break;
    case DUET_INIT_UNIFORM:
    case DUET_INIT_KAIMING_UNIFORM:
    case DUET_INIT_XAVIER_UNIFORM: x = lo + (hi - lo) * duet_rng_uniform(&r); break;
    default: x = 0; break;
    }
    if (t->dtype == DUET_F64) ((double *)mem)[i] = x;
    else ((float *)mem)[i] = (float)x;
  }
}

int duet_session_init_params(DuetSession *s, uint64_t seed) {
  const DuetProgram *p = s->p;
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *t = &p->tensors[i];
    if (t->region != DUET_MEM_PARAM && t->region != DUET_MEM_STATE) continue;
    void *h = duet_session_staging(s, (size_t)t->nbytes);
    if (!h) return -1;
    if (t->region == DUET_MEM_PARAM) init_tensor(t, h, seed, (uint64_t)i + 1);
    else if (t->init == DUET_INIT_ONES) init_tensor(t, h, seed, 0); /* pruning masks: nothing pruned yet */
    else memset(h, 0, (size_t)t->nbytes);
    if (duet_session_write(s, i, 0, h, (size_t)t->nbytes)) return -1;
  }
  s->step = 0;
  s->grad_norm = NAN;
  /* GradScaler(init_scale=2**16) unless --loss-scale says otherwise */
  s->scaler = (DuetScaler){.scale = p->n_unscale ? (s->cfg.loss_scale > 0 ? s->cfg.loss_scale : 65536.0) : 0};
  s->s[DUET_S_LOSS_SCALE] = p->n_unscale ? s->scaler.scale : 1.0;
  s->s[DUET_S_INV_LOSS_SCALE] = 1.0 / s->s[DUET_S_LOSS_SCALE];
  return 0;
}

/* This process's resident memory (VmRSS in /proc/self/status), bytes; -1
 * when unreadable. */
static int64_t vm_rss(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) break;
  fclose(f);
  return kb >= 0 ? (int64_t)kb * 1024 : -1;
}

DuetSession *duet_session_new(const DuetProgram *p, DuetDevice *dev, const DuetConfig *cfg, char *err,
                              size_t errlen) {
  if (p->api_version != DUET_RT_API_VERSION) {
    snprintf(err, errlen, "program built for runtime API %d, this runtime is %d", p->api_version,
             DUET_RT_API_VERSION);
    return NULL;
  }
  if (duet_gemm_acc_check(p, dev->ops->name, err, errlen)) return NULL;
  DuetSession *s = calloc(1, sizeof *s);
  if (s) s->grad_norm = NAN;
  if (!s || !(s->ptr = calloc((size_t)p->n_tensors + 1, sizeof *s->ptr))) {
    free(s);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  s->p = p;
  s->dev = dev;
  s->cfg = *cfg;
  int64_t rss0 = vm_rss();
  for (int r = 1; r < DUET_MEM_COUNT; r++) {
    s->region[r] = dev->ops->alloc(dev, (size_t)p->region_bytes[r]);
    if (!s->region[r]) {
      snprintf(err, errlen, "%s", dev->err);
      duet_session_free(s);
      return NULL;
    }
  }
  int64_t rss1 = vm_rss();
  s->rss_growth = rss0 >= 0 && rss1 >= 0 ? rss1 - rss0 : -1;
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *t = &p->tensors[i];
    if (t->region <= 0 || t->region >= DUET_MEM_COUNT || t->offset < 0 ||
        t->offset + t->nbytes > p->region_bytes[t->region]) {
      snprintf(err, errlen, "tensor %s lies outside its planned region", t->name);
      duet_session_free(s);
      return NULL;
    }
    s->ptr[i] = (char *)s->region[t->region] + t->offset;
  }
  if (p->n_unscale > 0) {
    if (p->update_from < 0 || p->update_from > p->n_train || !p->unscale_names) {
      snprintf(err, errlen, "program has %d overflow flags but no optimizer updates to skip", p->n_unscale);
      duet_session_free(s);
      return NULL;
    }
  }
  if (p->n_clip > 0 && (p->clip_from < 0 || p->clip_from > p->n_train || !p->clip_grad || !p->clip_sumsq ||
                        !p->clip_scale)) {
    snprintf(err, errlen, "program has %d clipping kernels but no optimizer updates", p->n_clip);
    duet_session_free(s);
    return NULL;
  }
  if (duet_flag_words(p) > 0) { /* overflow flags, clipping doubles */
    s->overflow = dev->ops->alloc(dev, (size_t)duet_flag_words(p) * sizeof(int32_t));
    if (!s->overflow) {
      snprintf(err, errlen, "%s", dev->err);
      duet_session_free(s);
      return NULL;
    }
    s->ptr[p->n_tensors] = s->overflow;
  }
  if (duet_session_init_params(s, cfg->seed)) {
    snprintf(err, errlen, "initialising the params: %s", s->err);
    duet_session_free(s);
    return NULL;
  }
  const char *prof = getenv("DUET_PROFILE");
  if (prof && *prof && strcmp(prof, "0")) s->prof = calloc((size_t)p->n_train + 1, sizeof *s->prof);
  return s;
}

/* DUET_PROFILE=1: the training schedule's entries by total time. */
static void print_profile(const DuetSession *s) {
  const DuetProgram *p = s->p;
  double total = 0;
  for (int i = 0; i < p->n_train; i++) total += s->prof[i];
  if (total <= 0 || s->prof_runs == 0) return;
  fprintf(stderr, "duet: profile of %lld training steps, %.2f ms per step:\n", (long long)s->prof_runs,
          1e3 * total / (double)s->prof_runs);
  int *order = malloc((size_t)p->n_train * sizeof *order);
  if (!order) return;
  for (int i = 0; i < p->n_train; i++) order[i] = i;
  for (int i = 0; i < p->n_train; i++) /* selection of the top 25 */
    for (int j = i + 1; j < p->n_train; j++)
      if (s->prof[order[j]] > s->prof[order[i]]) {
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
      }
  double gemm = 0;
  for (int i = 0; i < p->n_train; i++)
    if (p->train[i].kind == DUET_STEP_GEMM) gemm += s->prof[i];
  fprintf(stderr, "  GEMMs %.1f%%, generated kernels %.1f%%\n", 100 * gemm / total, 100 * (total - gemm) / total);
  for (int r = 0; r < p->n_train && r < 60; r++) {
    const DuetStep *st = &p->train[order[r]];
    double ms = 1e3 * s->prof[order[r]] / (double)s->prof_runs;
    if (st->kind == DUET_STEP_GEMM)
      fprintf(stderr, "  %6.2f%% %8.3f ms  gemm %s%s m=%lld n=%lld k=%lld -> %s (%.1f GFLOP/s)\n",
              100 * s->prof[order[r]] / total, ms, st->ta ? "T" : "N", st->tb ? "T" : "N", (long long)st->m,
              (long long)st->n, (long long)st->k, p->tensors[st->c].name, 2e-6 * (double)(st->m * st->n * st->k) / ms);
    else
      fprintf(stderr, "  %6.2f%% %8.3f ms  kernel duet_k%d\n", 100 * s->prof[order[r]] / total, ms, st->kernel);
  }
  free(order);
}

DuetSession *duet_session_new_pipeline(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg,
                                       char *err, size_t errlen) {
  return duet_session_new_ranks(p, kernels, cfg, NULL, err, errlen);
}

DuetSession *duet_session_new_ranks(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg,
                                    DuetDist *dist, char *err, size_t errlen) {
  if (p->api_version != DUET_RT_API_VERSION || p->n_stages < 1) {
    snprintf(err, errlen, "not a pipelined program for runtime API %d", DUET_RT_API_VERSION);
    return NULL;
  }
  DuetSession *s = calloc(1, sizeof *s);
  if (s) s->grad_norm = NAN;
  if (!s || !(s->ptr = calloc((size_t)p->n_tensors + 1, sizeof *s->ptr))) {
    free(s);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  s->p = p;
  s->cfg = *cfg;
  if (!(s->dev = duet_cpu_device(kernels, p->n_kernels, 0))) {
    snprintf(err, errlen, "out of host memory");
    duet_session_free(s);
    return NULL;
  }
  s->own_dev = true;
  int64_t rss0 = vm_rss();
  if (!(s->pipe = duet_pipe_new_ranks(p, kernels, cfg, dist, err, errlen))) {
    duet_session_free(s);
    return NULL;
  }
  int64_t rss1 = vm_rss();
  s->rss_growth = rss0 >= 0 && rss1 >= 0 ? rss1 - rss0 : -1;
  for (int i = 0; i < p->n_tensors; i++) s->ptr[i] = duet_pipe_tensor(s->pipe, i);
  DuetPipeEnv env;
  s->dp_check = !duet_pipe_env(&env, cfg->timeout, err, errlen) && env.dp_check && p->replicas > 1;
  if (duet_session_init_params(s, cfg->seed)) {
    snprintf(err, errlen, "initialising the params: %s", s->err);
    duet_session_free(s);
    return NULL;
  }
  return s;
}

void duet_session_free(DuetSession *s) {
  if (!s) return;
  if (s->dp_checked > 0) {
    int64_t asym = duet_pipe_asym_overflows(s->pipe);
    fprintf(stderr, "duet: data-parallel check: the params%s of the %d replicas%s were bit-identical after each of "
            "%" PRId64 " training steps", s->p->zero ? " (the optimizer state is sharded: each holds its own)"
                                                    : " and optimizer state",
            s->p->replicas, duet_pipe_replicas(s->pipe) < s->p->replicas ? " (ranks; hashes compared)" : "",
            s->dp_checked);
    if (s->p->n_unscale > 0)
      fprintf(stderr, "; %" PRId64 " replica-stage%s found no overflow of its own in a step another replica "
              "overflowed (and skipped it too)", asym, asym == 1 ? "" : "s");
    fprintf(stderr, "\n");
  }
  if (s->own_dev) {
    duet_pipe_free(s->pipe);
    if (s->dev) s->dev->ops->destroy(s->dev);
    s->dev = NULL;
  }
  if (s->prof) {
    print_profile(s);
    free(s->prof);
  }
  for (int r = 1; r < DUET_MEM_COUNT; r++)
    if (s->region[r] && s->dev) s->dev->ops->free(s->dev, s->region[r]);
  if (s->overflow && s->dev) s->dev->ops->free(s->dev, s->overflow);
  free(s->staging);
  free(s->ptr);
  free(s);
}

bool duet_session_offload_pinned(const DuetSession *s) { return s->pipe && duet_pipe_offload_pinned(s->pipe); }

int duet_session_allocated(const DuetSession *s, int64_t *bytes, int max) {
  if (s->pipe) return duet_pipe_allocated(s->pipe, bytes, max);
  if (max < 1) return 0;
  bytes[0] = 0;
  for (int r = 1; r < DUET_MEM_COUNT; r++) bytes[0] += s->p->region_bytes[r];
  return 1;
}

void duet_session_print_allocated(const DuetSession *s, FILE *out) {
  int64_t b[DUET_MAX_DEVICES];
  int n = duet_session_allocated(s, b, DUET_MAX_DEVICES);
  int64_t sum = 0;
  for (int i = 0; i < n; i++) sum += b[i];
  fprintf(out, "duet: allocated: %" PRId64 " bytes", sum);
  if (n > 1) {
    fprintf(out, " (");
    for (int i = 0; i < n; i++) fprintf(out, "%s%" PRId64, i ? " + " : "", b[i]);
    fprintf(out, " on the %d devices)", n);
  }
  fprintf(out, " for params, optimizer state, activations and gradient accumulators (duet plan's totals)");
  if (s->rss_growth >= 0 && !strcmp(s->dev->ops->name, "cpu") && !(s->cfg.devices && strstr(s->cfg.devices, "cuda")))
    fprintf(out, "; resident memory grew by %" PRId64 " bytes%s", s->rss_growth,
            s->pipe ? " (the stages' CPU devices, with their transfer staging)" : "");
  fprintf(out, "\n");
}

const char *duet_session_transfers(const DuetSession *s) { return s->pipe ? duet_pipe_transfers(s->pipe) : NULL; }

const char *duet_session_collective(const DuetSession *s) {
  return s->pipe && s->p->replicas > 1 ? duet_pipe_collective(s->pipe) : NULL;
}

void *duet_session_tensor(DuetSession *s, int id) {
  return id >= 0 && id < s->p->n_tensors ? s->ptr[id] : NULL;
}

void *duet_session_staging(DuetSession *s, size_t bytes) {
  if (bytes > s->staging_bytes) {
    void *b = realloc(s->staging, bytes);
    if (!b) {
      snprintf(s->err, sizeof s->err, "out of host memory (a staging buffer of %zu bytes)", bytes);
      return NULL;
    }
    s->staging = b;
    s->staging_bytes = bytes;
  }
  return s->staging ? s->staging : (s->staging = malloc(1));
}

/* One copy between tensor id's memory and the host: the device that holds
 * the tensor (a pipeline's stage device), or memcpy for a pipeline's host
 * buffers.  Data parallelism: a write goes to every replica (replica -1),
 * a read comes from `replica`. */
static int session_copy(DuetSession *s, int replica, int id, size_t off, void *host, size_t n, bool to_device) {
  const DuetProgram *p = s->p;
  /* a pipeline's data inputs hold the whole batch: micro_batches times the
   * tensor (duet_pipe_tensor) */
  size_t cap = id >= 0 && id < p->n_tensors ? (size_t)p->tensors[id].nbytes : 0;
  if (s->pipe && (id == p->input_x || id == p->input_y) && p->micro_batches > 1) cap *= (size_t)p->micro_batches;
  if (id < 0 || id >= p->n_tensors || off > cap || n > cap - off) {
    snprintf(s->err, sizeof s->err, "%s of %zu bytes at %zu outside tensor %d", to_device ? "write" : "read", n, off,
             id);
    return -1;
  }
  if (n == 0) return 0;
  int R = s->pipe ? duet_pipe_replicas(s->pipe) : 1;
  if (replica >= R) {
    snprintf(s->err, sizeof s->err, "replica %d of a program of %d", replica, R);
    return -1;
  }
  if (s->pipe && duet_pipe_sharded(s->pipe, id) && !to_device) { /* ZeRO: from the replica that holds it */
    char e[700];
    if (duet_pipe_read_state(s->pipe, id, off, host, n, e, sizeof e)) {
      snprintf(s->err, sizeof s->err, "%s", e);
      return -1;
    }
    return 0;
  }
  if (s->pipe && to_device) duet_pipe_param_written(s->pipe, id); /* --offload: the host's copy is stale */
  for (int r = replica < 0 ? 0 : replica; r < (replica < 0 ? R : replica + 1); r++) {
    if (s->pipe && !duet_pipe_tensor_at(s->pipe, r, id)) continue; /* ZeRO: another replica's state */
    char *mem = (char *)(s->pipe ? duet_pipe_tensor_at(s->pipe, r, id) : s->ptr[id]) + off;
    DuetDevice *d = s->pipe ? duet_pipe_tensor_device_at(s->pipe, r, id) : s->dev;
    if (!d) { /* a pipeline's host buffer: one for all replicas */
      if (to_device) memcpy(mem, host, n);
      else memcpy(host, mem, n);
      return 0;
    }
    if (to_device ? d->ops->copy_to_device(d, mem, host, n) : d->ops->copy_to_host(d, host, mem, n)) {
      if (R > 1)
        snprintf(s->err, sizeof s->err, "%s tensor %s of replica %d: %s", to_device ? "writing" : "reading",
                 p->tensors[id].name, r, d->err);
      else
        snprintf(s->err, sizeof s->err, "%s tensor %s: %s", to_device ? "writing" : "reading", p->tensors[id].name,
                 d->err);
      return -1;
    }
  }
  return 0;
}

int duet_session_read(DuetSession *s, int id, size_t off, void *dst, size_t n) {
  return session_copy(s, 0, id, off, dst, n, false);
}

int duet_session_read_replica(DuetSession *s, int replica, int id, size_t off, void *dst, size_t n) {
  if (replica < 0) {
    snprintf(s->err, sizeof s->err, "replica %d", replica);
    return -1;
  }
  return session_copy(s, replica, id, off, dst, n, false);
}

int duet_session_write(DuetSession *s, int id, size_t off, const void *src, size_t n) {
  return session_copy(s, -1, id, off, (void *)src, n, true);
}

int duet_session_serve_states(DuetSession *s) {
  if (!s->pipe) return 0;
  char e[700];
  if (duet_pipe_serve_states(s->pipe, e, sizeof e)) {
    snprintf(s->err, sizeof s->err, "%s", e);
    return -1;
  }
  return 0;
}

int duet_session_replicas(const DuetSession *s) { return s->pipe ? duet_pipe_replicas(s->pipe) : 1; }

void duet_session_set_valid(DuetSession *s, int64_t n_valid) {
  s->s[DUET_S_N_VALID] = (double)n_valid;
  s->n_valid = n_valid;
}
void duet_session_set_pos(DuetSession *s, int64_t pos) { s->s[DUET_S_POS] = (double)pos; }

const char *duet_session_error(const DuetSession *s) { return s->err; }
int64_t duet_session_step(const DuetSession *s) { return s->step; }
void duet_session_set_step(DuetSession *s, int64_t step) { s->step = step; }
void duet_session_set_total(DuetSession *s, int64_t total) { s->total = total; }
int64_t duet_session_total(const DuetSession *s) { return s->total; }
double duet_session_grad_norm(const DuetSession *s) { return s->grad_norm; }
double duet_session_lr(const DuetSession *s) { return duet_lr_at(&s->cfg, s->step > 0 ? s->step : 1, s->total); }
DuetScaler duet_session_scaler(const DuetSession *s) { return s->scaler; }
int duet_session_config_quiet(const DuetSession *s) { return s->cfg.quiet; }
const DuetConfig *duet_session_config(const DuetSession *s) { return &s->cfg; }
void duet_session_set_scaler(DuetSession *s, const DuetScaler *sc) {
  if (!s->p->n_unscale) return;
  s->scaler = *sc;
  s->s[DUET_S_LOSS_SCALE] = sc->scale;
  s->s[DUET_S_INV_LOSS_SCALE] = 1.0 / sc->scale;
}
DuetDevice *duet_session_device(DuetSession *s) { return s->dev; }
const DuetProgram *duet_session_program(const DuetSession *s) { return s->p; }

/* Before the optimizer updates of a training step, given the first
 * overflow flag set (-1: none): 1 when the step is to be skipped (the scale
 * backs off), 0 when it goes on (the scale may grow), -1 with a message
 * when the scale fell below the floor.  GradScaler.update() with its
 * defaults: backoff 0.5, growth 2 after 2,000 consecutive good steps. */
static int scaler_update(DuetSession *s, int first) {
  const DuetProgram *p = s->p;
  DuetScaler *sc = &s->scaler;
  sc->last_skipped = first >= 0;
  if (first < 0) {
    if (++sc->growth == DUET_SCALE_GROWTH_INTERVAL) sc->scale *= DUET_SCALE_GROWTH, sc->growth = 0;
  } else {
    sc->first_overflow = p->unscale_names[first];
    sc->skipped++;
    sc->growth = 0;
    sc->scale *= DUET_SCALE_BACKOFF;
    double floor = s->cfg.min_loss_scale > 0 ? s->cfg.min_loss_scale : 1.0;
    if (sc->scale < floor) {
      snprintf(s->err, sizeof s->err,
               "the loss scale fell below %g (--min-loss-scale): the gradient of %s keeps overflowing (inf or NaN) "
               "at step %lld; fp16 cannot represent it (try --precision bf16 or fp32, or a lower --lr)",
               floor, sc->first_overflow, (long long)s->step);
      return -1;
    }
  }
  s->s[DUET_S_LOSS_SCALE] = sc->scale;
  s->s[DUET_S_INV_LOSS_SCALE] = 1.0 / sc->scale;
  return first >= 0;
}

/* The first overflow flag the unscale kernels of this step set, -1 if
 * none; -2 with a message when the flags cannot be read. */
static int first_overflow(DuetSession *s) {
  const DuetProgram *p = s->p;
  DuetDevice *d = s->dev;
  int32_t flags[64];
  for (int j0 = 0; j0 < p->n_unscale; j0 += 64) {
    int nj = p->n_unscale - j0 < 64 ? p->n_unscale - j0 : 64;
    if (d->ops->copy_to_host(d, flags, s->overflow + j0, (size_t)nj * sizeof *flags)) {
      snprintf(s->err, sizeof s->err, "reading the overflow flags: %s", d->err);
      return -2;
    }
    for (int j = 0; j < nj; j++)
      if (flags[j]) return j0 + j;
  }
  return -1;
}

/* The clip coefficient of global norm `norm` for --clip-grad-norm `max`
 * (torch.nn.utils.clip_grad_norm_: max / (norm + 1e-6), clamped to 1),
 * in double; 1 (no clipping) when the norm is within the limit. */
static double clip_coef(double norm, double max) {
  double c = max / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

/* Gradient clipping on one device, after the gradients are final: the
 * sum of squares of every gradient (clip_sumsq kernels), read back and
 * added in gradient order in double, the norm its square root (in
 * s->grad_norm); when above --clip-grad-norm, the coefficient written to
 * the device and every gradient scaled (clip_scale kernels).  0, or -1
 * with a message. */
static int clip_grads(DuetSession *s) {
  const DuetProgram *p = s->p;
  DuetDevice *d = s->dev;
  for (int j = 0; j < p->n_clip; j++)
    if (d->ops->launch(d, p->clip_sumsq[j], s->ptr, s->s)) {
      snprintf(s->err, sizeof s->err, "gradient clipping: %s", d->err);
      return -1;
    }
  double part[64], sum = 0;
  for (int j0 = 0; j0 < p->n_clip; j0 += 64) {
    int nj = p->n_clip - j0 < 64 ? p->n_clip - j0 : 64;
    if (d->ops->copy_to_host(d, part, s->overflow + duet_clip_word(p, j0), (size_t)nj * sizeof *part)) {
      snprintf(s->err, sizeof s->err, "gradient clipping: reading the sums of squares: %s", d->err);
      return -1;
    }
    for (int j = 0; j < nj; j++) sum += part[j];
  }
  s->grad_norm = sqrt(sum);
  double c = clip_coef(s->grad_norm, s->cfg.clip_grad_norm);
  if (!(c < 1.0)) return 0; /* within the limit (or not finite: the update shows it) */
  if (d->ops->copy_to_device(d, s->overflow + duet_clip_word(p, p->n_clip), &c, sizeof c)) {
    snprintf(s->err, sizeof s->err, "gradient clipping: writing the coefficient: %s", d->err);
    return -1;
  }
  for (int j = 0; j < p->n_clip; j++)
    if (d->ops->launch(d, p->clip_scale[j], s->ptr, s->s)) {
      snprintf(s->err, sizeof s->err, "gradient clipping: %s", d->err);
      return -1;
    }
  return 0;
}

int duet_session_run(DuetSession *s, int which) {
  const DuetProgram *p = s->p;
  const DuetStep *steps = which == DUET_RUN_TRAIN ? p->train : which == DUET_RUN_EVAL ? p->eval : p->grad;
  int n = which == DUET_RUN_TRAIN ? p->n_train : which == DUET_RUN_EVAL ? p->n_eval : p->n_grad;
  s->s[DUET_S_TRAINING] = which != DUET_RUN_EVAL;
  {
    uint64_t x = s->cfg.seed ^ 0x64726f706f7574ull, y = (uint64_t)s->step + (which == DUET_RUN_TRAIN);
    s->s[DUET_S_DROP_SEED] = (double)((splitmix64(&x) ^ (y * 0x9E3779B97F4A7C15ull)) >> 12); /* exact in a double */
  }
  if (which == DUET_RUN_TRAIN) {
    const DuetConfig *c = &s->cfg;
    ++s->step;
    int64_t t = s->step - s->scaler.skipped; /* AdamW's step count: skipped steps do not count */
    double lr = duet_lr_at(c, s->step, s->total); /* the schedule's rate of this step */
    s->s[DUET_S_LR] = lr;
    s->s[DUET_S_WEIGHT_DECAY] = c->weight_decay;
    s->s[DUET_S_BETA1] = c->beta1;
    s->s[DUET_S_BETA2] = c->beta2;
    s->s[DUET_S_EPS] = c->eps;
    s->s[DUET_S_MOMENTUM] = c->momentum;
    s->s[DUET_S_STEP_SIZE] = lr / (1.0 - pow(c->beta1, (double)t));
    s->s[DUET_S_BC2_SQRT] = sqrt(1.0 - pow(c->beta2, (double)t));
    s->s[DUET_S_ONE_MINUS_BETA1] = 1.0 - c->beta1;
    s->s[DUET_S_ONE_MINUS_BETA2] = 1.0 - c->beta2;
    s->s[DUET_S_DECAY] = 1.0 - lr * c->weight_decay;
  }
  bool clip = which == DUET_RUN_TRAIN && p->n_clip > 0 && s->cfg.clip_grad_norm > 0;
  if (which == DUET_RUN_TRAIN) s->grad_norm = NAN; /* until clipping measures it (not on a skipped step) */
  if (s->pipe) {
    if (which != DUET_RUN_TRAIN || (!p->n_unscale && !clip)) {
      if (duet_pipe_run(s->pipe, which, s->s, s->n_valid, s->err, sizeof s->err)) return -1;
    } else {
      /* fp16: every stage's gradients and flags (OR-ed over the replicas),
       * then one verdict for all; clipping: every stage's sums of squares,
       * then one norm for all (before any update) */
      duet_pipe_set_clip(s->pipe, clip, 1.0);
      if (duet_pipe_run(s->pipe, DUET_PIPE_GRADS, s->s, s->n_valid, s->err, sizeof s->err)) return -1;
      int rc = p->n_unscale ? scaler_update(s, duet_pipe_first_overflow(s->pipe)) : 0;
      if (rc < 0) return -1;
      double sum, c = 1.0;
      if (!rc && clip) {
        if (duet_pipe_grad_sumsq(s->pipe, &sum, s->err, sizeof s->err)) return -1;
        s->grad_norm = sqrt(sum);
        c = clip_coef(s->grad_norm, s->cfg.clip_grad_norm);
      }
      duet_pipe_set_clip(s->pipe, 0, c < 1.0 ? c : 1.0);
      if (!rc && duet_pipe_run(s->pipe, DUET_PIPE_STEP, s->s, s->n_valid, s->err, sizeof s->err)) return -1;
    }
    if (which == DUET_RUN_TRAIN && s->dp_check) { /* DUET_DP_CHECK=1 */
      char err[600];
      if (duet_pipe_compare_replicas(s->pipe, err, sizeof err)) {
        snprintf(s->err, sizeof s->err, "data-parallel check after step %" PRId64 ": %s", s->step, err);
        return -1;
      }
      s->dp_checked++;
    }
    return 0;
  }
  DuetDevice *d = s->dev;
  bool prof = s->prof && which == DUET_RUN_TRAIN;
  if (prof) s->prof_runs++;
  for (int i = 0; i < n; i++) {
    const DuetStep *st = &steps[i];
    if (which == DUET_RUN_TRAIN && p->n_unscale && i == p->update_from) {
      int first = first_overflow(s);
      if (first < -1) return -1;
      int rc = scaler_update(s, first);
      if (rc < 0) return -1;
      if (rc > 0) break; /* overflow: no update this step */
    }
    if (which == DUET_RUN_TRAIN && clip && i == p->clip_from && clip_grads(s)) return -1;
    double t0 = prof ? mono_seconds() : 0;
    int rc = st->kind == DUET_STEP_GEMM ? d->ops->gemm(d, st, s->ptr) : d->ops->launch(d, st->kernel, s->ptr, s->s);
    if (prof) s->prof[i] += mono_seconds() - t0;
    if (rc) {
      snprintf(s->err, sizeof s->err, "step %d: %s", i, d->err);
      return -1;
    }
  }
  return d->ops->sync(d);
}

