/* runtime/cuda/plugin.c: libduet_cuda.so, the CUDA device (DuetDeviceOps)
 * over the CUDA driver API, NVRTC and cuBLAS.  Loaded by
 * runtime/cuda_loader.c with dlopen only when libcuda.so.1 loads, so the
 * duet binary never links CUDA.
 *
 * Memory: every region is device memory (cuMemAlloc): the runtime fills
 * inputs, reads losses and metrics, initialises params and saves
 * checkpoints through copy_to_device / copy_to_host (duet_session_read and
 * _write), so no page migrates between host and GPU during training, as
 * managed memory's demand paging would (on Pascal, a fault per page the
 * host touched).  tests/fakegpu maps device memory where the host cannot
 * read it, so a host dereference fails there as on a GPU.  Kernels: the program's CUDA C
 * (DuetProgram.cuda_source) compiled by NVRTC for the card (see
 * duet_cuda_pick_target) or taken from the kernel cache, launched on one
 * stream with the emitter's launch table, each kernel's tensors and the
 * runtime scalars passed by value. */
#define _POSIX_C_SOURCE 200809L
#include <cublas_v2.h>
#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../duet_rt.h"
#include "cuda_plugin.h"
#include "duet_nvrtc.h"
#include "../progress.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct Cuda {
  CUdevice dev;
  CUcontext ctx; /* the device's primary context */
  CUstream stream;
  CUmodule mod;
  CUfunction *fn;
  CUfunction acc[2]; /* duet_accumulate_f32, _f64 (the accumulate op) */
  int n_kernels, n_tensors;
  const DuetLaunch *launch;
  cublasHandle_t blas;
  const int32_t *arg_off, *args; /* each kernel's arguments (DuetProgram.kernel_args) */
  int acc16; /* --gemm-accumulate fp16 */
} Cuda;

static const char *cu_err(CUresult r) {
  const char *s = NULL;
  if (cuGetErrorString(r, &s) != CUDA_SUCCESS || !s) s = "unknown CUDA error";
  return s;
}

/* Errors 700-719 (illegal address, launch failure, ...) are sticky and
 * reported by whichever call comes next, not by the kernel that caused
 * them (CUDA driver API, CUresult) */
static const char *async_hint(CUresult r) {
  return r >= 700 && r < 720 ? "; an earlier kernel may have caused it: CUDA_LAUNCH_BLOCKING=1 makes the failing "
                               "launch report it"
                             : "";
}

#define CK(d, call)                                                                            \
  do {                                                                                         \
    CUresult r_ = (call);                                                                      \
    if (r_ != CUDA_SUCCESS) {                                                                  \
      snprintf((d)->err, sizeof (d)->err, "%s failed: %s (CUresult %d)%s", #call, cu_err(r_), (int)r_, async_hint(r_)); \
      return -1;                                                                               \
    }                                                                                          \
  } while (0)

static void *cu_alloc(DuetDevice *d, size_t bytes) {
  Cuda *c = d->ctx;
  CUdeviceptr p;
  CUresult r = cuCtxSetCurrent(c->ctx);
  if (r == CUDA_SUCCESS) r = cuMemAlloc(&p, bytes ? bytes : 1);
  if (r == CUDA_SUCCESS) r = cuMemsetD8Async(p, 0, bytes ? bytes : 1, c->stream);
  if (r == CUDA_SUCCESS) r = cuStreamSynchronize(c->stream);
  if (r != CUDA_SUCCESS) {
    snprintf(d->err, sizeof d->err, "cannot allocate %zu bytes of GPU memory: %s", bytes, cu_err(r));
    return NULL;
  }
  return (void *)(uintptr_t)p; /* 256-byte aligned (CUDA programming guide) */
}

/* Releases report nothing (void); they run in the device's context. */
static void cu_free(DuetDevice *d, void *p) {
  Cuda *c = d->ctx;
  if (!p) return;
  /* the stream's queued work may still use p (a failed pipeline stage
   * returns with work queued); cuMemFree promises no synchronisation */
  if (cuCtxSetCurrent(c->ctx) == CUDA_SUCCESS) {
    cuStreamSynchronize(c->stream);
    cuMemFree((CUdeviceptr)(uintptr_t)p);
  }
}

static int cu_copy_to_device(DuetDevice *d, void *dst, const void *src, size_t bytes) {
  Cuda *c = d->ctx;
  CK(d, cuCtxSetCurrent(c->ctx));
  CK(d, cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, bytes, c->stream));
  CK(d, cuStreamSynchronize(c->stream));
  return 0;
}

static int cu_copy_to_host(DuetDevice *d, void *dst, const void *src, size_t bytes) {
  Cuda *c = d->ctx;
  CK(d, cuCtxSetCurrent(c->ctx));
  CK(d, cuMemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, bytes, c->stream));
  CK(d, cuStreamSynchronize(c->stream));
  return 0;
}

/* Kernel `kernel` (its function c->fn[kernel]) on the device's stream:
 * its arguments picked from the tensor table t (t[n_tensors]: the
 * overflow flags) and the scalars s, both passed by value (duet_args,
 * duet_scalars): cuLaunchKernel copies them at the launch (CUDA driver API,
 * cuLaunchKernel), so s may change for the next launch at once.  Every op makes the device's context
 * current first: a pipeline calls a device from its worker thread (and
 * evaluation from the main thread), and a thread's current context is its
 * own. */
static int cu_launch(DuetDevice *d, int kernel, void *const *t, const double *s) {
  Cuda *c = d->ctx;
  if (kernel < 0 || kernel >= c->n_kernels) {
    snprintf(d->err, sizeof d->err, "kernel %d out of range (0..%d)", kernel, c->n_kernels - 1);
    return -1;
  }
  CK(d, cuCtxSetCurrent(c->ctx));
  void *a[DUET_MAX_KERNEL_ARGS] = {0};
  duet_kernel_argv(c->arg_off, c->args, c->n_tensors, kernel, t, a);
  const DuetLaunch *l = &c->launch[kernel];
  /* a: the bytes of duet_args; s: of duet_scalars (DUET_S_COUNT doubles) */
  void *params[] = {a, (void *)s};
  CK(d, cuLaunchKernel(c->fn[kernel], l->grid, 1, 1, l->block, 1, 1, l->shared, c->stream, params, NULL));
  return 0;
}

/* Row-major C[m,n] = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
 * cuBLAS gets B first, with n and m swapped (the usual transposition
 * trick); fp32 GEMMs accumulate in fp32 (cublasSgemm, default math mode:
 * no TF32).  16-bit GEMMs (fp16, bf16: A, B and C all 16-bit, as the
 * precision pass plans them and the CPU backend computes them) go through
 * cublasGemmEx with CUBLAS_COMPUTE_32F: products and sums in fp32, the
 * result rounded once to the 16-bit type (cuBLAS documentation,
 * "cublasGemmEx": the 16F/16BF inputs with 32F compute rows of its type
 * table), which is what the CPU's widen-sgemm-narrow does.  With
 * --gemm-accumulate fp16 (opt-in, never the default) fp16 GEMMs use
 * CUBLAS_COMPUTE_16F instead, whose alpha and beta are fp16 (1 = 0x3c00):
 * about twice the rate on Pascal (sm_60), with fp16 rounding of every
 * partial sum. */
static int cu_gemm(DuetDevice *d, const DuetStep *st, void *const *t) {
  Cuda *c = d->ctx;
  if (st->m > INT32_MAX || st->n > INT32_MAX || st->k > INT32_MAX) { /* cuBLAS takes int dimensions */
    snprintf(d->err, sizeof d->err, "GEMM %lldx%lldx%lld exceeds cuBLAS's int dimensions", (long long)st->m,
             (long long)st->n, (long long)st->k);
    return -1;
  }
  int m = (int)st->m, n = (int)st->n, k = (int)st->k;
  int lda = st->ta ? m : k, ldb = st->tb ? k : n;
  cublasOperation_t oa = st->ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = st->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t r;
  CK(d, cuCtxSetCurrent(c->ctx)); /* the handle's context */
  if (st->dtype == DUET_F64) {
    const double one = 1, zero = 0;
    r = cublasDgemm(c->blas, ob, oa, n, m, k, &one, t[st->b], ldb, t[st->a], lda, &zero, t[st->c], n);
  } else if (st->dtype == DUET_F32) {
    const float one = 1, zero = 0;
    r = cublasSgemm(c->blas, ob, oa, n, m, k, &one, t[st->b], ldb, t[st->a], lda, &zero, t[st->c], n);
  } else if (st->dtype == DUET_F16 || st->dtype == DUET_BF16) {
    const float one = 1, zero = 0;
    cudaDataType_t ty = st->dtype == DUET_F16 ? CUDA_R_16F : CUDA_R_16BF;
    const uint16_t one16 = 0x3c00, zero16 = 0;
    bool h = c->acc16 && st->dtype == DUET_F16;
    r = cublasGemmEx(c->blas, ob, oa, n, m, k, h ? (const void *)&one16 : (const void *)&one, t[st->b], ty, ldb,
                     t[st->a], ty, lda, h ? (const void *)&zero16 : (const void *)&zero, t[st->c], ty, n,
                     h ? CUBLAS_COMPUTE_16F : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  } else {
    snprintf(d->err, sizeof d->err, "GEMM of dtype %d is not supported on CUDA", st->dtype);
    return -1;
  }
  if (r != CUBLAS_STATUS_SUCCESS) {
    snprintf(d->err, sizeof d->err, "cuBLAS GEMM m=%d n=%d k=%d failed (cublasStatus_t %d)", m, n, k, (int)r);
    return -1;
  }
  return 0;
}

/* dst = src (first) or dst += src on the device's stream: the generated
 * duet_accumulate_f32/_f64, a grid-stride loop (at most 65535 blocks of
 * 256); asynchronous, ordered with the stream's other work. */
static int cu_accumulate(DuetDevice *d, void *dst, const void *src, int64_t n, int dtype, int first) {
  Cuda *c = d->ctx;
  if (dtype != DUET_F32 && dtype != DUET_F64) {
    snprintf(d->err, sizeof d->err, "accumulate: dtype %d is not f32 or f64", dtype);
    return -1;
  }
  if (n <= 0) return 0;
  CK(d, cuCtxSetCurrent(c->ctx));
  CUdeviceptr a = (CUdeviceptr)(uintptr_t)dst, b = (CUdeviceptr)(uintptr_t)src;
  long long nn = (long long)n;
  int f = first != 0;
  void *params[] = {&a, &b, &nn, &f};
  int64_t blocks = (n + 255) / 256;
  CK(d, cuLaunchKernel(c->acc[dtype == DUET_F64], (unsigned)(blocks < 65535 ? blocks : 65535), 1, 1, 256, 1, 1, 0,
                       c->stream, params, NULL));
  return 0;
}

static int cu_sync(DuetDevice *d) {
  Cuda *c = d->ctx;
  CK(d, cuCtxSetCurrent(c->ctx));
  CK(d, cuStreamSynchronize(c->stream));
  return 0;
}

/* --------------------------------------------------- transfers (pipelines)
 * Two duet devices on one GPU (--devices cuda:0,cuda:0) share the GPU's
 * primary context and have a stream and arenas each: a copy between them is
 * a device-to-device copy.  Two GPUs with peer access (cuDeviceCanAccessPeer:
 * NVLink, or PCIe where the platform allows it) copy peer to peer
 * (cuMemcpyPeerAsync) once access is enabled both ways.  Without it (a pair
 * of P100s on PCIe behind a root complex that does not route P2P is the
 * common case) peer_path answers DUET_PEER_NONE and the pipeline stages
 * through page-locked host memory from host_alloc: the sender's DtoH and
 * the receiver's HtoD are then DMA transfers, not copies through the
 * driver's pageable bounce buffers. */

/* Enables access from `from`'s context to `to`'s memory (once: an already
 * enabled pair counts as success).  0, or -1 with a message in d->err. */
static int enable_peer(DuetDevice *d, const Cuda *from, const Cuda *to) {
  CK(d, cuCtxSetCurrent(from->ctx));
  CUresult r = cuCtxEnablePeerAccess(to->ctx, 0);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
    snprintf(d->err, sizeof d->err, "cuCtxEnablePeerAccess(to->ctx, 0) failed: %s (CUresult %d)", cu_err(r), (int)r);
    return -1;
  }
  return 0;
}

static int cu_peer_path(DuetDevice *sd, DuetDevice *dd) {
  if (sd->ops != dd->ops) {
    snprintf(sd->err, sizeof sd->err, "peer_path between a %s and a %s device", sd->ops->name, dd->ops->name);
    return -1;
  }
  Cuda *s = sd->ctx, *t = dd->ctx;
  if (s->dev == t->dev) return DUET_PEER_SAME_GPU;
  int can = 0, back = 0;
  CK(sd, cuDeviceCanAccessPeer(&can, s->dev, t->dev));
  CK(sd, cuDeviceCanAccessPeer(&back, t->dev, s->dev));
  if (!can || !back) return DUET_PEER_NONE;
  if (enable_peer(sd, s, t) || enable_peer(sd, t, s)) return -1;
  return DUET_PEER_P2P;
}

/* On the sender's stream, so the copy follows the kernels that wrote src;
 * synchronised, so the receiver (another stream) may read dst at once. */
static int cu_copy_peer(DuetDevice *sd, void *dst, DuetDevice *dd, const void *src, size_t bytes) {
  Cuda *s = sd->ctx, *t = dd->ctx;
  CUdeviceptr to = (CUdeviceptr)(uintptr_t)dst, from = (CUdeviceptr)(uintptr_t)src;
  CK(sd, cuCtxSetCurrent(s->ctx));
  if (s->dev == t->dev) CK(sd, cuMemcpyDtoDAsync(to, from, bytes, s->stream));
  else CK(sd, cuMemcpyPeerAsync(to, t->ctx, from, s->ctx, bytes, s->stream));
  CK(sd, cuStreamSynchronize(s->stream));
  return 0;
}

static void *cu_host_alloc(DuetDevice *d, size_t bytes) {
  Cuda *c = d->ctx;
  void *p = NULL;
  CUresult r = cuCtxSetCurrent(c->ctx);
  if (r != CUDA_SUCCESS) {
    snprintf(d->err, sizeof d->err, "cuCtxSetCurrent(c->ctx) failed: %s (CUresult %d)", cu_err(r), (int)r);
    return NULL;
  }
  r = cuMemHostAlloc(&p, bytes ? bytes : 1, CU_MEMHOSTALLOC_PORTABLE);
  if (r != CUDA_SUCCESS) {
    snprintf(d->err, sizeof d->err, "cuMemHostAlloc(&p, %zu, CU_MEMHOSTALLOC_PORTABLE) failed: %s (CUresult %d)",
             bytes, cu_err(r), (int)r);
    return NULL;
  }
  memset(p, 0, bytes ? bytes : 1);
  return p;
}

static void cu_host_free(DuetDevice *d, void *p) {
  Cuda *c = d->ctx;
  if (p && cuCtxSetCurrent(c->ctx) == CUDA_SUCCESS) {
    cuStreamSynchronize(c->stream); /* as cu_free */
    cuMemFreeHost(p);
  }
}

static void cu_destroy(DuetDevice *d) {
  if (!d) return;
  Cuda *c = d->ctx;
  if (c) {
    if (c->ctx) cuCtxSetCurrent(c->ctx);
    if (c->stream) cuStreamSynchronize(c->stream);
    if (c->blas) cublasDestroy(c->blas);
    if (c->mod) cuModuleUnload(c->mod);
    if (c->stream) cuStreamDestroy(c->stream);
    if (c->ctx) cuDevicePrimaryCtxRelease(c->dev);
    free(c->fn);
    free(c);
  }
  free(d);
}

static const DuetDeviceOps cuda_ops = {
    .api_version = DUET_RT_API_VERSION,
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .copy_to_device = cu_copy_to_device,
    .copy_to_host = cu_copy_to_host,
    .launch = cu_launch,
    .gemm = cu_gemm,
    .sync = cu_sync,
    .destroy = cu_destroy,
    .allreduce = NULL,
    .peer_path = cu_peer_path,
    .copy_peer = cu_copy_peer,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .accumulate = cu_accumulate,
};

int duet_cuda_handles(DuetDevice *d, int *ordinal, CUcontext *ctx, CUstream *stream) {
  if (!d || d->ops != &cuda_ops) return -1;
  const Cuda *c = d->ctx;
  *ordinal = (int)c->dev;
  *ctx = c->ctx;
  *stream = c->stream;
  return 0;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The module image for this card: from the kernel cache (key: NVRTC
 * version, options, target, source), else compiled and stored. */
static int module_image(const char *src, const char *card, int ma, int mi, int n_kernels, int verbose, void **img,
                        size_t *len, char *msg, size_t msglen, char *err, size_t errlen) {
  int vma, vmi, archs[128];
  if (duet_nvrtc_version(&vma, &vmi)) {
    snprintf(err, errlen, "nvrtcVersion failed (is libnvrtc installed?)");
    return -1;
  }
  int n = duet_nvrtc_archs(archs, 128);
  if (n < 0) {
    snprintf(err, errlen, "nvrtcGetSupportedArchs failed (NVRTC %d.%d)", vma, vmi);
    return -1;
  }
  DuetCudaTarget tg;
  if (duet_cuda_pick_target(card, ma, mi, archs, n, vma, vmi, &tg, err, errlen)) return -1;
  size_t klen = strlen(src) + 256;
  char *key = malloc(klen);
  if (!key) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  size_t k = (size_t)snprintf(key, klen, "duet cuda kernel cache v1\nnvrtc: %d.%d\noptions: %s %s\ntarget: %s\nsource:\n%s",
                              vma, vmi, DUET_NVRTC_OPTIONS, tg.arch_opt, tg.cubin ? "cubin" : "ptx", src);
  const char *ext = tg.cubin ? "cubin" : "ptx";
  char cerr[1024];
  double t0 = now();
  *img = duet_cache_get(key, k, ext, len, cerr, sizeof cerr);
  if (*img) {
    snprintf(msg, msglen, "%s %s from the kernel cache (%.0f ms; no NVRTC compile)", tg.arch_opt + 6,
             tg.cubin ? "SASS" : "PTX", 1e3 * (now() - t0));
    free(key);
    return 0;
  }
  char what[160];
  snprintf(what, sizeof what, "compiling %d kernels with NVRTC %d.%d for %s", n_kernels, vma, vmi, tg.arch_opt + 6);
  DuetBeat *beat = duet_beat_start(stdout, !verbose, what); /* NVRTC blocks: show that it is alive */
  int bad = duet_nvrtc_compile(src, tg.arch_opt, tg.cubin, img, len, err, errlen);
  duet_beat_stop(beat);
  if (bad) {
    free(key);
    return -1;
  }
  double dt = now() - t0;
  /* PTX is loaded NUL-terminated: cache the terminator too */
  if (!tg.cubin) (*len)++;
  if (duet_cache_put(key, k, ext, *img, *len, cerr, sizeof cerr))
    fprintf(stderr, "duet: warning: %s\n", cerr);
  snprintf(msg, msglen, "%s %s compiled by NVRTC %d.%d in %.2f s (cached for the next run)", tg.arch_opt + 6,
           tg.cubin ? "SASS" : "PTX", vma, vmi, dt);
  free(key);
  return 0;
}

#define CKO(call)                                                                              \
  do {                                                                                         \
    CUresult r_ = (call);                                                                      \
    if (r_ != CUDA_SUCCESS) {                                                                  \
      snprintf(err, errlen, "%s failed: %s (CUresult %d)", #call, cu_err(r_), (int)r_);                             \
      goto fail;                                                                               \
    }                                                                                          \
  } while (0)

EXPORT int duet_cuda_plugin_api(void) { return DUET_CUDA_PLUGIN_API; }

EXPORT DuetDevice *duet_cuda_plugin_open(const DuetProgram *p, int ordinal, int verbose, char *err, size_t errlen) {
  DuetDevice *d = calloc(1, sizeof *d);
  Cuda *c = calloc(1, sizeof *c);
  void *img = NULL;
  unsigned *dyn_max = NULL; /* per function: the dynamic shared bytes to allow */
  if (!d || !c) {
    free(d);
    free(c);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  d->ops = &cuda_ops;
  d->ctx = c;
  if (!p->cuda_source || !p->cuda_launch) {
    snprintf(err, errlen, "this program carries no CUDA kernels (rebuild it with this duet)");
    goto fail;
  }
  CKO(cuInit(0));
  int count = 0;
  CKO(cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count) {
    snprintf(err, errlen, "no GPU cuda:%d (this machine has %d)", ordinal, count);
    goto fail;
  }
  CKO(cuDeviceGet(&c->dev, ordinal));
  char name[256];
  int ma, mi;
  CKO(cuDeviceGetName(name, sizeof name, c->dev));
  CKO(cuDeviceGetAttribute(&ma, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev));
  CKO(cuDeviceGetAttribute(&mi, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev));
  /* bf16 arithmetic and cuBLAS's 16BF GEMMs need compute capability 8.0
   * (the precision pass's --arch table says the same at compile time; this
   * is the check against the card actually present) */
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].dtype == DUET_BF16 && ma < 8) {
      snprintf(err, errlen,
               "this program stores bf16 tensors, which need compute capability 8.0 or later; cuda:%d %s is sm_%d%d "
               "(use --precision fp16 or fp32)",
               ordinal, name, ma, mi);
      goto fail;
    }
  /* fp16 arithmetic on sm_61 runs at 1/64 of fp32 (CUDA C Programming
   * Guide, arithmetic throughput; shared/FACTS.md: CUBLAS_COMPUTE_16F
   * 20-25x slower than SGEMM there) */
  if (p->gemm_accumulate_f16 && ma == 6 && mi == 1)
    fprintf(stderr, "duet: warning: --gemm-accumulate fp16 on %s (sm_61, fp16 at 1/64 of the fp32 rate) makes "
                    "GEMMs slower, not faster\n", name);
  CKO(cuDevicePrimaryCtxRetain(&c->ctx, c->dev));
  CKO(cuCtxSetCurrent(c->ctx));
  CKO(cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING));
  size_t len;
  char msg[512];
  if (module_image(p->cuda_source, name, ma, mi, p->n_kernels, verbose, &img, &len, msg, sizeof msg, err, errlen))
    goto fail;
  CKO(cuModuleLoadData(&c->mod, img));
  free(img);
  img = NULL;
  c->n_kernels = p->n_kernels;
  c->n_tensors = p->n_tensors;
  c->acc16 = p->gemm_accumulate_f16;
  c->launch = p->cuda_launch;
  c->arg_off = p->kernel_arg_off;
  c->args = p->kernel_args;
  c->fn = calloc((size_t)(p->n_kernels ? p->n_kernels : 1), sizeof *c->fn);
  if (!c->fn) {
    snprintf(err, errlen, "out of host memory");
    goto fail;
  }
  /* Shared memory per block: the function's static __shared__ bytes plus
   * the launch's dynamic bytes must stay within 48 KiB, or within the
   * card's opt-in maximum once CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
   * allows the dynamic part (CUDA C Programming Guide, "Shared Memory";
   * cuFuncSetAttribute).  Kernels sharing a function may ask different
   * sizes: the attribute, which belongs to the function, is the largest. */
  int max_optin = 0;
  CKO(cuDeviceGetAttribute(&max_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, c->dev));
  dyn_max = calloc((size_t)(p->cuda_n_fns > 0 ? p->cuda_n_fns : 1), sizeof *dyn_max);
  if (!dyn_max) {
    snprintf(err, errlen, "out of host memory");
    goto fail;
  }
  for (int i = 0; i < p->n_kernels; i++) {
    char fname[32];
    if (!p->cuda_fn || p->cuda_fn[i] < 0 || p->cuda_fn[i] >= p->cuda_n_fns) {
      snprintf(err, errlen, "kernel %d has no CUDA function", i);
      goto fail;
    }
    snprintf(fname, sizeof fname, "duet_k%d", p->cuda_fn[i]); /* kernels may share it */
    CUresult r = cuModuleGetFunction(&c->fn[i], c->mod, fname);
    int stat = 0;
    if (r == CUDA_SUCCESS) r = cuFuncGetAttribute(&stat, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, c->fn[i]);
    if (r != CUDA_SUCCESS) {
      snprintf(err, errlen, "%s: cuModuleGetFunction / cuFuncGetAttribute failed: %s (CUresult %d)", fname, cu_err(r),
               (int)r);
      goto fail;
    }
    unsigned dyn = p->cuda_launch[i].shared;
    if ((long long)dyn + stat > max_optin) {
      snprintf(err, errlen, "kernel %d needs %u bytes of dynamic and %d of static shared memory; %s allows %d in all", i,
               dyn, stat, name, max_optin);
      goto fail;
    }
    if (dyn + (unsigned)stat > 48 * 1024 && dyn > dyn_max[p->cuda_fn[i]]) dyn_max[p->cuda_fn[i]] = dyn;
  }
  for (int i = 0; i < p->n_kernels; i++) {
    unsigned dyn = dyn_max[p->cuda_fn[i]];
    if (!dyn) continue;
    CUresult r = cuFuncSetAttribute(c->fn[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)dyn);
    if (r != CUDA_SUCCESS) {
      snprintf(err, errlen, "cuFuncSetAttribute(duet_k%d, MAX_DYNAMIC_SHARED_SIZE_BYTES, %u) failed: %s (CUresult %d)",
               p->cuda_fn[i], dyn, cu_err(r), (int)r);
      goto fail;
    }
  }
  free(dyn_max);
  dyn_max = NULL;
  CKO(cuModuleGetFunction(&c->acc[0], c->mod, "duet_accumulate_f32"));
  CKO(cuModuleGetFunction(&c->acc[1], c->mod, "duet_accumulate_f64"));
  cublasStatus_t bs = cublasCreate(&c->blas);
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(c->blas, (cudaStream_t)c->stream);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    snprintf(err, errlen, "cuBLAS initialisation failed on %s (cublasStatus_t %d)", name, (int)bs);
    goto fail;
  }
  if (verbose)
    fprintf(stderr, "duet: cuda:%d %s (sm_%d%d): %d kernels in %d functions, %s%s\n", ordinal, name, ma, mi,
            p->n_kernels, p->cuda_n_fns, msg,
            c->acc16 ? "; fp16 GEMMs accumulate in fp16 (--gemm-accumulate fp16)" : "");
  return d;
fail:
  free(img);
  free(dyn_max);
  cu_destroy(d);
  return NULL;
}

/* Number of GPUs the driver reports (0 when cuInit finds no device), or -1
 * with a message, worded as duet_cuda_plugin_open's for the same failure
 * (duet_devices_check reports it before the device is opened). */
EXPORT int duet_cuda_plugin_count(char *err, size_t errlen) {
  CUresult r = cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) return 0;
  if (r != CUDA_SUCCESS) {
    snprintf(err, errlen, "cuInit(0) failed: %s (CUresult %d)", cu_err(r), (int)r);
    return -1;
  }
  int count = 0;
  if ((r = cuDeviceGetCount(&count)) != CUDA_SUCCESS) {
    snprintf(err, errlen, "cuDeviceGetCount(&count) failed: %s (CUresult %d)", cu_err(r), (int)r);
    return -1;
  }
  return count;
}

/* GPU `index`'s free and total memory (cuMemGetInfo in its primary
 * context, retained for the call and released) and compute capability x
 * 10.  0, or -1 with a message. */
EXPORT int duet_cuda_plugin_meminfo(int index, int64_t *free_b, int64_t *total_b, int *sm, char *err, size_t errlen) {
  CUresult r = cuInit(0);
  CUdevice dev;
  CUcontext ctx;
  int ma = 0, mi = 0;
  size_t f = 0, t = 0;
  if (r != CUDA_SUCCESS || (r = cuDeviceGet(&dev, index)) != CUDA_SUCCESS ||
      (r = cuDeviceGetAttribute(&ma, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)) != CUDA_SUCCESS ||
      (r = cuDeviceGetAttribute(&mi, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) != CUDA_SUCCESS) {
    snprintf(err, errlen, "querying GPU %d failed: %s (CUresult %d)", index, cu_err(r), (int)r);
    return -1;
  }
  if ((r = cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS) {
    snprintf(err, errlen, "cuDevicePrimaryCtxRetain for GPU %d failed: %s (CUresult %d)", index, cu_err(r), (int)r);
    return -1;
  }
  if ((r = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS || (r = cuMemGetInfo(&f, &t)) != CUDA_SUCCESS)
    snprintf(err, errlen, "cuMemGetInfo on GPU %d failed: %s (CUresult %d)", index, cu_err(r), (int)r);
  CUresult rs = cuCtxSetCurrent(NULL), rr = cuDevicePrimaryCtxRelease(dev);
  if (r != CUDA_SUCCESS) return -1;
  if (rs != CUDA_SUCCESS || rr != CUDA_SUCCESS) {
    snprintf(err, errlen, "releasing GPU %d's context failed: %s", index, cu_err(rs != CUDA_SUCCESS ? rs : rr));
    return -1;
  }
  *free_b = (int64_t)f;
  *total_b = (int64_t)t;
  *sm = ma * 10 + mi;
  return 0;
}

/* One line per GPU: name, compute capability, memory, driver and NVRTC
 * versions.  Returns the number of GPUs, or -1 with a message. */
EXPORT int duet_cuda_plugin_list(FILE *out, char *err, size_t errlen) {
  CUresult r = cuInit(0);
  if (r != CUDA_SUCCESS) {
    snprintf(err, errlen, "cuInit failed: %s (CUresult %d)", cu_err(r), (int)r);
    return -1;
  }
  int count = 0, drv = 0, vma = 0, vmi = 0;
  if ((r = cuDeviceGetCount(&count)) != CUDA_SUCCESS || (r = cuDriverGetVersion(&drv)) != CUDA_SUCCESS) {
    snprintf(err, errlen, "CUDA driver query failed: %s", cu_err(r));
    return -1;
  }
  if (duet_nvrtc_version(&vma, &vmi)) {
    snprintf(err, errlen, "nvrtcVersion failed");
    return -1;
  }
  for (int i = 0; i < count; i++) {
    CUdevice dev;
    char name[256];
    int ma, mi;
    size_t mem;
    if ((r = cuDeviceGet(&dev, i)) != CUDA_SUCCESS || (r = cuDeviceGetName(name, sizeof name, dev)) != CUDA_SUCCESS ||
        (r = cuDeviceGetAttribute(&ma, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)) != CUDA_SUCCESS ||
        (r = cuDeviceGetAttribute(&mi, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) != CUDA_SUCCESS ||
        (r = cuDeviceTotalMem(&mem, dev)) != CUDA_SUCCESS) {
      snprintf(err, errlen, "querying GPU %d failed: %s", i, cu_err(r));
      return -1;
    }
    fprintf(out, "cuda:%d  %s, compute capability %d.%d, %.1f GiB, driver %d.%d, NVRTC %d.%d\n", i, name, ma, mi,
            (double)mem / (1024.0 * 1024 * 1024), drv / 1000, drv % 1000 / 10, vma, vmi);
  }
  return count;
}
