/* tests/fakegpu/fakegpu.c: libduet_fakegpu.so, a fake GPU for running the
 * real CUDA plugin (libduet_cuda.so) end to end on a machine without one.
 *
 * One library stands in for the three the plugin links: the CUDA driver
 * (libcuda.so.1), cuBLAS and NVRTC.  tests/run_fakegpu.sh puts it on
 * LD_LIBRARY_PATH under those names (the plugin's RUNPATH does not override
 * LD_LIBRARY_PATH), so the plugin binary that a GPU machine loads is the one
 * under test: its driver calls, context handling on worker threads, stream
 * ordering, cuBLAS argument mapping (row-major C as column-major C^T) and the
 * kernel cache all run, and so do the gpu-labelled tests and scripts.
 *
 * What it models, after the CUDA driver API reference and the cuBLAS
 * documentation:
 *  - NVRTC: nvrtcCompileProgram accepts -std=c++17 and one -arch= that must
 *    be in nvrtcGetSupportedArchs (lists modelled on NVRTC 11.8, 12.x and
 *    13.0 per $DUET_FAKE_NVRTC, default 12.9); the "image" is the source
 *    compiled as C++ for the host behind tests/cuda_emu/cuda_emu.h (a block's
 *    threads are fibers) plus a trampoline per kernel, as a shared
 *    object with a small header.  CUBIN is refused for a compute_XX target.
 *  - Devices: $DUET_FAKE_GPUS (default 1) GPUs of compute capability
 *    $DUET_FAKE_CC (default 6.0, a P100), $DUET_FAKE_MEM bytes each (default
 *    16 GiB: allocations beyond it fail with CUDA_ERROR_OUT_OF_MEMORY), peer
 *    access between them only when $DUET_FAKE_P2P=1 (a PCIe pair without P2P
 *    is the default).
 *  - Contexts: a primary context per GPU; every call that needs one fails
 *    with CUDA_ERROR_INVALID_CONTEXT when the calling thread has none
 *    current, and a stream, module or function used under another GPU's
 *    context fails with CUDA_ERROR_INVALID_HANDLE.
 *  - Memory: cuMemAlloc returns addresses in a range the host cannot read
 *    (PROT_NONE): a host dereference of device memory crashes as on a real
 *    GPU.  Each allocation has a host shadow that kernels, copies and GEMMs
 *    use after translation; fresh memory (device, managed and page-locked)
 *    holds bytes 0xff, a NaN in every float type, so that a result that
 *    depends on memory nobody wrote shows.  Managed (cuMemAllocManaged)
 *    and page-locked (cuMemHostAlloc) memory is host memory.  Kernel
 *    pointer arguments and copy ranges must lie inside one live allocation
 *    (else CUDA_ERROR_ILLEGAL_ADDRESS, sticky, with a message naming the
 *    kernel).
 *  - Streams: work is queued and runs only when the stream is synchronised
 *    (or by a copy to pageable host memory, which is synchronous): host code
 *    that reads results without a sync reads stale memory.  A copy from
 *    host memory, pageable or page-locked, takes its bytes when it runs
 *    (the latest the CUDA driver API's "API synchronization behavior"
 *    allows for cuMemcpyHtoDAsync).
 *  - Launches: block size at most 1024 and at most the kernel's
 *    __launch_bounds__; dynamic shared memory at most 48 KiB minus the
 *    function's static __shared__ bytes (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
 *    summed from its __shared__ declarations) unless cuFuncSetAttribute
 *    raised the limit, which may not pass the card's opt-in maximum minus
 *    the static bytes (49152 bytes on sm_6x).  Kernels run through
 *    tests/cuda_emu's launcher with the block size of the launch, a fiber
 *    per thread; kernels that loop over gridDim (grid-stride) with their
 *    whole grid up to 65,536 threads and 65,536 / block blocks beyond, the
 *    rest with their whole grid (cuda_emu_grid); blocks in a random order
 *    and the threads a barrier releases in a random order, from a seed
 *    printed at the first launch ($DUET_EMU_SEED replays it; each launch's
 *    schedule follows from the seed, the kernel's name and its earlier
 *    launches, not from how streams interleave); shared memory, static and
 *    the launch's dynamic bytes, filled with 0xff before every block.
 *  - cuBLAS: Sgemm, Dgemm and GemmEx (16F and 16BF operands with 32F
 *    compute, 16F with 16F compute and __half alpha/beta) in column-major
 *    order with the documented argument checks; alpha and beta read when
 *    called (host pointer mode), the product computed when the stream runs,
 *    by OpenBLAS on one thread, so that a result depends on neither the
 *    host's threads nor how many devices share them (blas_one_thread).
 *
 * Not modelled: concurrency between streams (queues run one at a time)
 * and between blocks (one block runs to its end before the next starts,
 * so memory ordering between blocks cannot fail), warp-synchronous
 * execution (threads switch only at barriers), events, timing, the
 * hardware's rounding (fused multiply-adds) and math library, device-only
 * compile errors (the source is compiled as host C++), the range a kernel
 * touches behind each pointer argument (only the pointer itself is
 * checked), accesses past the dynamic shared memory a launch asked for
 * (README, "CUDA backend", has the emulator's whole list).  Stricter than CUDA: the legacy default stream,
 * GEMMs with k = 0 or mixed types, NVRTC options other than -std and
 * -arch, and unmodelled attributes are refused; an error is sticky for the
 * whole process, not one context.  This is test scaffolding, so it keeps
 * process-wide state as a driver does. */
#define _GNU_SOURCE
#include <cblas.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <omp.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/duet_half.h"
#include "../cuda_emu/cuda_emu_source.h"

extern char **environ;

#define MAX_GPUS 8
#define MAGIC "DUETFAKEGPU2"

/* ------------------------------------------------------------ bookkeeping */

enum { MEM_DEVICE, MEM_MANAGED, MEM_PINNED };

typedef struct Alloc {
  uintptr_t addr; /* what the caller sees */
  size_t bytes;
  char *host;     /* where the bytes are */
  int kind, gpu, live;
} Alloc;

struct CUctx_st {
  int gpu;
  int peer[MAX_GPUS]; /* peer access enabled to GPU j */
};

typedef struct Op Op;

struct CUstream_st {
  struct CUctx_st *ctx;
  Op *head, *tail;
  int driving; /* its queue is being run (under G.exec): a cycle of waits stops here */
};

/* An event: records counted as they are queued and as they run; a wait
 * captures the count at its call (CUDA's cuStreamWaitEvent semantics). */
struct CUevent_st {
  struct CUctx_st *ctx;
  unsigned flags;
  unsigned long long recorded, completed;
  CUstream stream;   /* of the latest record */
  double at;         /* host time at which the latest completed record ran */
  int refs, dead;    /* queued records and waits on it; destroyed (freed once refs is 0) */
};

typedef struct FakeCall FakeCall; /* one NCCL collective of a clique (below) */

typedef struct Kern { /* one kernel of a module, from the trampoline table */
  const char *name;
  int (*prep)(void *const *params);
  void (*run)(void *const *t, const double *s);
  const unsigned *sizes; /* bytes of each parameter, 0-terminated */
  int n_params, bounds, grid_stride, static_shared;
} Kern;

struct CUmod_st {
  struct CUctx_st *ctx;
  void *dl;
  int (*launch)(void (*fn)(void *const *, const double *), unsigned grid, unsigned block, unsigned shared,
                void *const *t, const double *s); /* emu_launch_ex */
  void (*seed)(unsigned long long);                /* emu_seed */
  void (*shutdown)(void);
  struct CUfunc_st *fns;
  int n;
  char path[512];
};

struct CUfunc_st {
  struct CUmod_st *mod;
  Kern k;
  int max_dynamic_shared;
  unsigned long long launches; /* run so far (under G.exec): with the name, the seed of the next one's schedule */
};

/* OP_RECORD: an event's record; OP_WAIT: a wait for an event's record
 * (pending until that record has run); OP_NCCL: a rank's part of an NCCL
 * collective (pending until every rank's part is reached on its stream) */
enum { OP_LAUNCH, OP_COPY, OP_MEMSET, OP_GEMM, OP_RECORD, OP_WAIT, OP_NCCL };

typedef struct Gemm {
  int ta, tb, m, n, k, lda, ldb, ldc;
  cudaDataType_t type;
  int compute16; /* CUBLAS_COMPUTE_16F */
  double alpha, beta;
  uintptr_t a, b, c;
} Gemm;

struct Op {
  Op *next;
  int kind;
  /* launch */
  struct CUfunc_st *fn;
  unsigned grid, block, shared;
  void *params[64];
  char *param_bytes;
  /* copy / memset: dst and src as the caller gave them (translated when
   * run) */
  uintptr_t dst, src;
  int dst_dev, src_dev; /* translate through the allocation table */
  size_t bytes;
  unsigned char value;
  Gemm g;
  /* record / wait: the event, the record's number, the stream recorded on */
  struct CUevent_st *ev;
  unsigned long long gen;
  CUstream on;
  /* NCCL: the collective and the rank */
  FakeCall *call;
  int rank;
};

static struct {
  pthread_mutex_t lock; /* the tables below */
  pthread_mutex_t exec; /* running queued work (one emulated kernel at a time) */
  pthread_cond_t moved; /* with exec: queued work was added, ran or was aborted */
  int init, n_gpus, cc, p2p, nv_major, nv_minor;
  size_t mem;
  size_t used[MAX_GPUS];
  struct CUctx_st ctx[MAX_GPUS];
  int ctx_refs[MAX_GPUS];
  Alloc *allocs;
  int n_allocs, cap_allocs;
  char *dev_base; /* reserved PROT_NONE range for cuMemAlloc addresses */
  size_t dev_off, dev_span;
  CUresult sticky; /* an error raised while running queued work */
  unsigned long long seed; /* of the emulator's schedules (cuda_emu_seed) */
  int seed_said;           /* printed, at the first launch */
  struct CUstream_st *streams[256]; /* live streams (cuMemFree waits for them all) */
  int n_streams;
} G = {.lock = PTHREAD_MUTEX_INITIALIZER, .exec = PTHREAD_MUTEX_INITIALIZER, .moved = PTHREAD_COND_INITIALIZER};

static _Thread_local struct CUctx_st *current;

static void fake_say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fakegpu: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

static size_t env_size(const char *name, size_t dflt) {
  const char *s = getenv(name);
  if (!s || !*s) return dflt;
  char *end;
  double v = strtod(s, &end);
  size_t mul = 1;
  if (!strcmp(end, "KiB")) mul = 1024;
  else if (!strcmp(end, "MiB")) mul = 1024 * 1024;
  else if (!strcmp(end, "GiB")) mul = 1024ull * 1024 * 1024;
  return (size_t)(v * (double)mul);
}

/* ------------------------------------------------------------ allocations */

/* The allocation containing [p, p + n), or NULL; under G.lock. */
static Alloc *find_alloc(uintptr_t p, size_t n) {
  for (int i = G.n_allocs - 1; i >= 0; i--) {
    Alloc *a = &G.allocs[i];
    if (a->live && p >= a->addr && p - a->addr < a->bytes && n <= a->bytes - (p - a->addr)) return a;
  }
  return NULL;
}

static int add_alloc(uintptr_t addr, size_t bytes, char *host, int kind, int gpu) {
  if (G.n_allocs == G.cap_allocs) {
    int cap = G.cap_allocs ? 2 * G.cap_allocs : 256;
    Alloc *a = realloc(G.allocs, (size_t)cap * sizeof *a);
    if (!a) return -1;
    G.allocs = a;
    G.cap_allocs = cap;
  }
  G.allocs[G.n_allocs++] = (Alloc){addr, bytes, host, kind, gpu, 1};
  return 0;
}

/* Host address of device-side address p for n bytes, or NULL (and a
 * message) when [p, p + n) is not inside one live allocation. */
static char *xlate(uintptr_t p, size_t n, const char *what) {
  pthread_mutex_lock(&G.lock);
  Alloc *a = find_alloc(p, n ? n : 1);
  char *h = a ? a->host + (p - a->addr) : NULL;
  pthread_mutex_unlock(&G.lock);
  if (!h) fake_say("%s: [0x%llx, +%zu) is not inside GPU memory", what, (unsigned long long)p, n);
  return h;
}

/* for the emulated kernels: a pointer argument; NULL stays NULL (a
 * kernel's unused argument slots) */
static int bad_kernel_pointer;
static const char *kernel_name;
static void *xlate_kernel_pointer(const void *p) {
  if (!p) return NULL;
  char what[160];
  snprintf(what, sizeof what, "kernel %s: pointer argument", kernel_name);
  char *h = xlate((uintptr_t)p, 1, what);
  if (!h) bad_kernel_pointer = 1;
  return h;
}

/* ------------------------------------------------------------ driver API */

static CUresult need_ctx(void) {
  if (!G.init) return CUDA_ERROR_NOT_INITIALIZED;
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  return G.sticky;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
  switch (r) {
  case CUDA_SUCCESS: *s = "no error"; break;
  case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
  case CUDA_ERROR_NOT_INITIALIZED: *s = "initialization error"; break;
  case CUDA_ERROR_NO_DEVICE: *s = "no CUDA-capable device is detected"; break;
  case CUDA_ERROR_INVALID_DEVICE: *s = "invalid device ordinal"; break;
  case CUDA_ERROR_INVALID_IMAGE: *s = "device kernel image is invalid"; break;
  case CUDA_ERROR_NO_BINARY_FOR_GPU: *s = "no kernel image is available for execution on the device"; break;
  case CUDA_ERROR_INVALID_CONTEXT: *s = "invalid device context"; break;
  case CUDA_ERROR_INVALID_HANDLE: *s = "invalid resource handle"; break;
  case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; break;
  case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
  case CUDA_ERROR_LAUNCH_FAILED: *s = "unspecified launch failure"; break;
  case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *s = "too many resources requested for launch"; break;
  case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: *s = "peer access is not supported between these two devices"; break;
  case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: *s = "peer access is already enabled"; break;
  default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuInit(unsigned flags) {
  if (flags) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&G.lock);
  if (!G.init) {
    const char *s = getenv("DUET_FAKE_GPUS");
    G.n_gpus = s && *s ? atoi(s) : 1;
    if (G.n_gpus < 0 || G.n_gpus > MAX_GPUS) G.n_gpus = 1;
    s = getenv("DUET_FAKE_CC");
    int ma = 6, mi = 0;
    if (s && *s) sscanf(s, "%d.%d", &ma, &mi);
    G.cc = 10 * ma + mi;
    G.p2p = getenv("DUET_FAKE_P2P") && !strcmp(getenv("DUET_FAKE_P2P"), "1");
    G.mem = env_size("DUET_FAKE_MEM", 16ull << 30);
    if (cuda_emu_seed(&G.seed)) {
      pthread_mutex_unlock(&G.lock);
      fake_say("DUET_EMU_SEED='%s' is not a decimal integer below 2^64", getenv("DUET_EMU_SEED"));
      return CUDA_ERROR_INVALID_VALUE;
    }
    for (int i = 0; i < MAX_GPUS; i++) G.ctx[i].gpu = i;
    G.dev_span = 1ull << 40;
    void *r = mmap(NULL, G.dev_span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) {
      pthread_mutex_unlock(&G.lock);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    G.dev_base = r;
    G.init = 1;
  }
  pthread_mutex_unlock(&G.lock);
  return G.n_gpus ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int *v) {
  const char *s = getenv("DUET_FAKE_DRIVER");
  *v = s && *s ? atoi(s) : 12080;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
  if (!G.init) return CUDA_ERROR_NOT_INITIALIZED;
  *n = G.n_gpus;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (!G.init) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= G.n_gpus) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

static int bad_dev(CUdevice d) { return !G.init || d < 0 || d >= G.n_gpus; }

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  if (bad_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "fakegpu sm_%d (host emulation)", G.cc);
  return CUDA_SUCCESS;
}

/* opt-in dynamic shared memory per block (CUDA C Programming Guide,
 * "Compute Capabilities", table of technical specifications) */
static int optin_shared(void) {
  if (G.cc == 80 || G.cc == 87) return 166912;
  if (G.cc == 90 || G.cc == 100 || G.cc == 103) return 232448;
  if (G.cc >= 80) return 101376; /* 8.6, 8.9, 12.x */
  return G.cc >= 75 ? 65536 : G.cc >= 70 ? 98304 : 49152;
}

CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  if (bad_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
  switch (a) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = G.cc / 10; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = G.cc % 10; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = optin_shared(); break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 56; break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
  default: fake_say("cuDeviceGetAttribute: attribute %d is not modelled", (int)a); return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice d) {
  if (bad_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = G.mem;
  return CUDA_SUCCESS;
}

/* The current context's GPU: DUET_FAKE_MEM less what is allocated on it. */
CUresult cuMemGetInfo(size_t *free_b, size_t *total_b) {
  CUresult r = need_ctx();
  if (r) return r;
  pthread_mutex_lock(&G.lock);
  *free_b = G.mem - G.used[current->gpu];
  *total_b = G.mem;
  pthread_mutex_unlock(&G.lock);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  if (bad_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&G.lock);
  G.ctx_refs[d]++;
  pthread_mutex_unlock(&G.lock);
  *c = &G.ctx[d];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
  if (bad_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&G.lock);
  CUresult r = G.ctx_refs[d] > 0 ? (G.ctx_refs[d]--, CUDA_SUCCESS) : CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_unlock(&G.lock);
  return r;
}

CUresult cuCtxSetCurrent(CUcontext c) {
  if (!G.init) return CUDA_ERROR_NOT_INITIALIZED;
  if (c && (c < &G.ctx[0] || c >= &G.ctx[G.n_gpus] || !G.ctx_refs[c->gpu])) return CUDA_ERROR_INVALID_CONTEXT;
  current = c;
  return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *s, unsigned flags) {
  CUresult r = need_ctx();
  if (r) return r;
  if (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st *st = calloc(1, sizeof *st);
  if (!st) return CUDA_ERROR_OUT_OF_MEMORY;
  st->ctx = current;
  pthread_mutex_lock(&G.exec);
  int full = G.n_streams == (int)(sizeof G.streams / sizeof *G.streams);
  if (!full) G.streams[G.n_streams++] = st;
  pthread_mutex_unlock(&G.exec);
  if (full) {
    free(st);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *s = st;
  return CUDA_SUCCESS;
}

static CUresult check_stream(CUstream s) {
  CUresult r = need_ctx();
  if (r) return r;
  if (!s) {
    fake_say("the legacy default stream is not modelled (use the stream the plugin created)");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (s->ctx != current) {
    fake_say("a stream of GPU %d used with GPU %d's context current", s->ctx->gpu, current->gpu);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  return CUDA_SUCCESS;
}

static void free_op(Op *o) {
  free(o->param_bytes);
  free(o);
}

static void run_op(Op *o); /* below, with the kernels and GEMMs */
static int op_ready(Op *o);  /* a wait or NCCL op's dependencies, below */
static void op_done(Op *o);  /* releases what a record, wait or NCCL op holds */

/* Runs the stream's queue in order until it is empty or its head waits
 * for work elsewhere (an event's record, NCCL peers: op_ready runs the
 * other streams that may provide it, as a GPU runs its streams
 * concurrently); the first error becomes sticky and drops the rest.
 * Under G.exec. */
static void run_queue(CUstream s) {
  if (s->driving) return; /* a wait on a stream already being run: it is not ready */
  s->driving = 1;
  while (s->head) {
    Op *o = s->head;
    if (!G.sticky && (o->kind == OP_WAIT || o->kind == OP_NCCL) && !op_ready(o)) break;
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    if (!G.sticky) run_op(o);
    op_done(o);
    free_op(o);
    pthread_cond_broadcast(&G.moved);
  }
  s->driving = 0;
}

/* Runs s until its queue is empty, waiting (G.exec released) while its
 * head waits for work that other threads have yet to queue: a
 * collective whose peer never comes hangs here, as cuStreamSynchronize
 * does on a GPU. */
static CUresult flush(CUstream s) {
  pthread_mutex_lock(&G.exec);
  for (run_queue(s); s->head && !G.sticky; run_queue(s)) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 2000000;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&G.moved, &G.exec, &dl);
  }
  CUresult r = G.sticky;
  pthread_mutex_unlock(&G.exec);
  return r;
}

/* every stream's work (cuMemFree and cuMemFreeHost synchronise the device) */
static void flush_all(void) {
  pthread_mutex_lock(&G.exec);
  for (int more = 1; more && !G.sticky;) {
    more = 0;
    for (int i = 0; i < G.n_streams; i++) {
      run_queue(G.streams[i]);
      more |= G.streams[i]->head != NULL;
    }
    if (more) {
      struct timespec dl;
      clock_gettime(CLOCK_REALTIME, &dl);
      dl.tv_nsec += 2000000;
      if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&G.moved, &G.exec, &dl);
    }
  }
  pthread_mutex_unlock(&G.exec);
}

/* queues are changed under G.exec: another thread's cuMemFree may run
 * them */
static CUresult enqueue(CUstream s, Op *o) {
  o->next = NULL;
  pthread_mutex_lock(&G.exec);
  if (s->tail) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  pthread_cond_broadcast(&G.moved);
  pthread_mutex_unlock(&G.exec);
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
  CUresult r = check_stream(s);
  if (r) return r;
  return flush(s);
}

/* Runs what can run of s's queue without waiting: CUDA_SUCCESS when all
 * of its work is done, else CUDA_ERROR_NOT_READY. */
CUresult cuStreamQuery(CUstream s) {
  CUresult r = check_stream(s);
  if (r) return r;
  pthread_mutex_lock(&G.exec);
  run_queue(s);
  r = G.sticky ? G.sticky : s->head ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
  pthread_mutex_unlock(&G.exec);
  return r;
}

/* ------------------------------------------------------------ events */

static double host_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

CUresult cuEventCreate(CUevent *e, unsigned flags) {
  CUresult r = need_ctx();
  if (r) return r;
  if (!e || (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING))) return CUDA_ERROR_INVALID_VALUE;
  struct CUevent_st *ev = calloc(1, sizeof *ev);
  if (!ev) return CUDA_ERROR_OUT_OF_MEMORY;
  ev->ctx = current;
  ev->flags = flags;
  *e = ev;
  return CUDA_SUCCESS;
}

/* a destroyed event lives until its queued records and waits have run */
CUresult cuEventDestroy(CUevent e) {
  if (!G.init) return CUDA_ERROR_NOT_INITIALIZED;
  if (!e || e->dead) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&G.exec);
  e->dead = 1;
  int gone = e->refs == 0;
  pthread_mutex_unlock(&G.exec);
  if (gone) free(e);
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
  CUresult r = check_stream(s);
  if (r) return r;
  if (!e || e->dead || e->ctx != current) {
    fake_say("cuEventRecord: an event of %s on a stream of GPU %d", e && !e->dead ? "another context" : "no context",
             current->gpu);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  Op *o = calloc(1, sizeof *o);
  if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
  o->kind = OP_RECORD;
  o->ev = e;
  pthread_mutex_lock(&G.exec);
  o->gen = ++e->recorded;
  e->stream = s;
  e->refs++;
  pthread_mutex_unlock(&G.exec);
  return enqueue(s, o);
}

/* Under G.exec: whether e's latest record (as of now) has run, running
 * what can run of its stream first. */
static int event_done(struct CUevent_st *e, unsigned long long gen) {
  if (e->completed >= gen) return 1;
  if (e->stream) run_queue(e->stream);
  return e->completed >= gen;
}

CUresult cuEventQuery(CUevent e) {
  if (!G.init) return CUDA_ERROR_NOT_INITIALIZED;
  if (!e || e->dead) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&G.exec);
  int done = event_done(e, e->recorded);
  CUresult r = G.sticky ? G.sticky : done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  pthread_mutex_unlock(&G.exec);
  return r;
}

CUresult cuEventSynchronize(CUevent e) {
  if (!G.init) return CUDA_ERROR_NOT_INITIALIZED;
  if (!e || e->dead) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&G.exec);
  unsigned long long gen = e->recorded;
  while (!event_done(e, gen) && !G.sticky) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 2000000;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&G.moved, &G.exec, &dl);
  }
  CUresult r = G.sticky;
  pthread_mutex_unlock(&G.exec);
  return r;
}

/* The host time between the moments the fake ran the two records (the
 * fake has no GPU clock: only the order and rough spans mean anything). */
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
  if (!G.init) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ms || !a || !b || a->dead || b->dead) return CUDA_ERROR_INVALID_HANDLE;
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) {
    fake_say("cuEventElapsedTime of an event created with CU_EVENT_DISABLE_TIMING");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  pthread_mutex_lock(&G.exec);
  int ok = a->recorded && b->recorded && a->completed >= a->recorded && b->completed >= b->recorded;
  double d = b->at - a->at;
  pthread_mutex_unlock(&G.exec);
  if (!ok) return CUDA_ERROR_NOT_READY;
  *ms = (float)(1e3 * d);
  return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
  CUresult r = check_stream(s);
  if (r) return r;
  if (!e || e->dead || flags) return !e || e->dead ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
  Op *o = calloc(1, sizeof *o);
  if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
  o->kind = OP_WAIT;
  o->ev = e;
  pthread_mutex_lock(&G.exec);
  o->gen = e->recorded; /* the latest record when called; none (0): nothing to wait for */
  o->on = e->stream;
  e->refs++;
  pthread_mutex_unlock(&G.exec);
  return enqueue(s, o);
}

CUresult cuStreamDestroy(CUstream s) {
  CUresult r = check_stream(s);
  if (r) return r;
  flush(s); /* pending work completes first (cuStreamDestroy's documentation) */
  pthread_mutex_lock(&G.exec);
  for (int i = 0; i < G.n_streams; i++)
    if (G.streams[i] == s) G.streams[i] = G.streams[--G.n_streams];
  pthread_mutex_unlock(&G.exec);
  free(s);
  return CUDA_SUCCESS;
}

static CUresult alloc_mem(CUdeviceptr *p, size_t bytes, int kind) {
  CUresult r = need_ctx();
  if (r) return r;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  int gpu = current->gpu;
  pthread_mutex_lock(&G.lock);
  if (kind != MEM_PINNED && G.used[gpu] + bytes > G.mem) {
    pthread_mutex_unlock(&G.lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  size_t span = (bytes + 4095) & ~(size_t)4095;
  char *host = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  uintptr_t addr = (uintptr_t)host;
  if (host != MAP_FAILED && kind == MEM_DEVICE) {
    if (G.dev_off + span + 65536 > G.dev_span) {
      munmap(host, span);
      host = MAP_FAILED;
    } else {
      addr = (uintptr_t)G.dev_base + G.dev_off;
      G.dev_off += span + 65536; /* a gap: neighbours never touch */
    }
  }
  if (host == MAP_FAILED || add_alloc(addr, bytes, host, kind, gpu)) {
    if (host != MAP_FAILED) munmap(host, span);
    pthread_mutex_unlock(&G.lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (kind != MEM_PINNED) G.used[gpu] += bytes;
  pthread_mutex_unlock(&G.lock);
  /* fresh memory is garbage on a GPU: make it visibly so, bytes 0xff (a
   * NaN in every float type), so that an output computed from it shows */
  memset(host, 0xff, bytes);
  *p = (CUdeviceptr)addr;
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *p, size_t bytes) { return alloc_mem(p, bytes, MEM_DEVICE); }

CUresult cuMemAllocManaged(CUdeviceptr *p, size_t bytes, unsigned flags) {
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
  return alloc_mem(p, bytes, MEM_MANAGED);
}

CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned flags) {
  (void)flags;
  CUdeviceptr d;
  CUresult r = alloc_mem(&d, bytes, MEM_PINNED);
  *p = r ? NULL : (void *)(uintptr_t)d;
  return r;
}

static CUresult free_mem(uintptr_t p, int pinned) {
  CUresult r = need_ctx();
  if (r && r != G.sticky) return r;
  flush_all();
  pthread_mutex_lock(&G.lock);
  Alloc *a = find_alloc(p, 1);
  if (!a || a->addr != p || (a->kind == MEM_PINNED) != pinned) {
    pthread_mutex_unlock(&G.lock);
    fake_say("%s of 0x%llx, which is not the start of a live allocation", pinned ? "cuMemFreeHost" : "cuMemFree",
             (unsigned long long)p);
    return CUDA_ERROR_INVALID_VALUE;
  }
  a->live = 0;
  if (a->kind != MEM_PINNED) G.used[a->gpu] -= a->bytes;
  /* keep the mapping but poison it: a queued op that still uses it reads
   * garbage rather than someone else's data */
  memset(a->host, 0x5a, a->bytes);
  pthread_mutex_unlock(&G.lock);
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p) { return free_mem((uintptr_t)p, 0); }
CUresult cuMemFreeHost(void *p) { return free_mem((uintptr_t)p, 1); }

static int is_pinned(const void *p, size_t n) {
  pthread_mutex_lock(&G.lock);
  Alloc *a = find_alloc((uintptr_t)p, n);
  int r = a && a->kind != MEM_DEVICE;
  pthread_mutex_unlock(&G.lock);
  return r;
}

static CUresult queue_copy(CUstream s, uintptr_t dst, int dst_dev, uintptr_t src, int src_dev, size_t bytes) {
  CUresult r = check_stream(s);
  if (r) return r;
  if (dst_dev && !xlate(dst, bytes, "copy destination")) return CUDA_ERROR_INVALID_VALUE;
  if (src_dev && !xlate(src, bytes, "copy source")) return CUDA_ERROR_INVALID_VALUE;
  Op *o = calloc(1, sizeof *o);
  if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
  o->kind = OP_COPY;
  o->dst = dst, o->dst_dev = dst_dev, o->src = src, o->src_dev = src_dev, o->bytes = bytes;
  return enqueue(s, o);
}

/* The driver may read even a pageable source after returning (CUDA 11.x
 * "API synchronization behavior": staged by a worker thread; 12.x: "might
 * be synchronous"): the fake takes the bytes when the copy runs, the
 * latest the documentation allows. */
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes, CUstream s) {
  return queue_copy(s, (uintptr_t)dst, 1, (uintptr_t)src, 0, bytes);
}

CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t bytes, CUstream s) {
  CUresult r = queue_copy(s, (uintptr_t)dst, 0, (uintptr_t)src, 1, bytes);
  if (r) return r;
  return is_pinned(dst, bytes) ? CUDA_SUCCESS : flush(s); /* to pageable memory: synchronous */
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  return queue_copy(s, (uintptr_t)dst, 1, (uintptr_t)src, 1, bytes);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t bytes,
                           CUstream s) {
  if (!dctx || !sctx) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&G.lock);
  Alloc *d = find_alloc((uintptr_t)dst, bytes ? bytes : 1), *a = find_alloc((uintptr_t)src, bytes ? bytes : 1);
  int ok = d && a && (d->kind != MEM_DEVICE || d->gpu == dctx->gpu) && (a->kind != MEM_DEVICE || a->gpu == sctx->gpu);
  pthread_mutex_unlock(&G.lock);
  if (!ok) {
    fake_say("cuMemcpyPeerAsync: the destination is not GPU %d's memory or the source not GPU %d's", dctx->gpu,
             sctx->gpu);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return queue_copy(s, (uintptr_t)dst, 1, (uintptr_t)src, 1, bytes);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  CUresult r = check_stream(s);
  if (r) return r;
  if (!xlate((uintptr_t)dst, n, "cuMemsetD8Async")) return CUDA_ERROR_INVALID_VALUE;
  Op *o = calloc(1, sizeof *o);
  if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
  o->kind = OP_MEMSET;
  o->dst = (uintptr_t)dst, o->dst_dev = 1, o->bytes = n, o->value = v;
  return enqueue(s, o);
}

CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
  if (bad_dev(d) || bad_dev(peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = G.p2p && d != peer;
  return CUDA_SUCCESS;
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
  CUresult r = need_ctx();
  if (r) return r;
  if (flags || !peer) return CUDA_ERROR_INVALID_VALUE;
  if (!G.p2p || peer == current) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if (current->peer[peer->gpu]) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  current->peer[peer->gpu] = 1;
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------ modules */

/* a module image: MAGIC, the target (4 bytes: 10 x major + minor), 1 for
 * SASS or 0 for PTX (4 bytes), the shared object's size (8 bytes), the
 * shared object.  Loads as the driver loads a real image: SASS for sm_XY
 * on a card of the same major version and a minor version of at least Y;
 * PTX for compute_XY on a card of compute capability XY or later (CUDA C
 * Programming Guide, "Binary Compatibility" and "PTX Compatibility");
 * otherwise CUDA_ERROR_NO_BINARY_FOR_GPU. */
CUresult cuModuleLoadData(CUmodule *m, const void *image) {
  CUresult r = need_ctx();
  if (r) return r;
  if (memcmp(image, MAGIC, sizeof MAGIC - 1)) {
    fake_say("cuModuleLoadData: not an image from the fake NVRTC");
    return CUDA_ERROR_INVALID_IMAGE;
  }
  uint32_t arch, sass;
  uint64_t n;
  const char *h = (const char *)image + sizeof MAGIC - 1;
  memcpy(&arch, h, 4);
  memcpy(&sass, h + 4, 4);
  memcpy(&n, h + 8, sizeof n);
  if (sass ? !((int)arch / 10 == G.cc / 10 && (int)arch % 10 <= G.cc % 10) : (int)arch > G.cc) {
    fake_say("cuModuleLoadData: a %s image for %s_%u does not run on sm_%d", sass ? "SASS" : "PTX",
             sass ? "sm" : "compute", arch, G.cc);
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  }
  struct CUmod_st *mod = calloc(1, sizeof *mod);
  if (!mod) return CUDA_ERROR_OUT_OF_MEMORY;
  const char *tmp = getenv("TMPDIR");
  snprintf(mod->path, sizeof mod->path, "%s/fakegpu-module-XXXXXX.so", tmp && *tmp ? tmp : "/tmp");
  int fd = mkstemps(mod->path, 3);
  const char *so = h + 8 + sizeof n;
  if (fd < 0 || write(fd, so, n) != (ssize_t)n || close(fd)) {
    fake_say("cuModuleLoadData: writing %s: %s", mod->path, strerror(errno));
    free(mod);
    return CUDA_ERROR_INVALID_IMAGE;
  }
  mod->dl = dlopen(mod->path, RTLD_NOW | RTLD_LOCAL);
  unlink(mod->path);
  if (!mod->dl) {
    fake_say("cuModuleLoadData: %s", dlerror());
    free(mod);
    return CUDA_ERROR_INVALID_IMAGE;
  }
  const Kern *table = dlsym(mod->dl, "fake_kernels");
  const int *count = dlsym(mod->dl, "fake_n_kernels");
  void *(**hook)(const void *) = dlsym(mod->dl, "fake_xlate");
  mod->launch = (int (*)(void (*)(void *const *, const double *), unsigned, unsigned, unsigned, void *const *,
                         const double *))dlsym(mod->dl, "emu_launch_ex");
  mod->seed = (void (*)(unsigned long long))dlsym(mod->dl, "emu_seed");
  mod->shutdown = (void (*)(void))dlsym(mod->dl, "emu_shutdown");
  if (!table || !count || !hook || !mod->launch || !mod->seed || !mod->shutdown ||
      !(mod->fns = calloc((size_t)(*count ? *count : 1), sizeof *mod->fns))) {
    fake_say("cuModuleLoadData: the image lacks its kernel table");
    dlclose(mod->dl);
    free(mod);
    return CUDA_ERROR_INVALID_IMAGE;
  }
  *hook = xlate_kernel_pointer;
  mod->n = *count;
  mod->ctx = current;
  for (int i = 0; i < mod->n; i++) {
    mod->fns[i].mod = mod;
    mod->fns[i].k = table[i];
    mod->fns[i].max_dynamic_shared = 48 * 1024 - table[i].static_shared;
  }
  *m = mod;
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m) {
  CUresult r = need_ctx();
  if (r && r != G.sticky) return r;
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  m->shutdown();
  dlclose(m->dl);
  free(m->fns);
  free(m);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  CUresult r = need_ctx();
  if (r) return r;
  if (!m || m->ctx != current) return CUDA_ERROR_INVALID_HANDLE;
  for (int i = 0; i < m->n; i++)
    if (!strcmp(m->fns[i].k.name, name)) {
      *f = &m->fns[i];
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_NOT_FOUND;
}

CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  CUresult r = need_ctx();
  if (r) return r;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (a != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    fake_say("cuFuncSetAttribute: attribute %d is not modelled", (int)a);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (v < 0 || v > optin_shared() - f->k.static_shared) {
    fake_say("cuFuncSetAttribute %s: %d dynamic bytes with %d static exceed the card's %d", f->k.name, v,
             f->k.static_shared, optin_shared());
    return CUDA_ERROR_INVALID_VALUE;
  }
  f->max_dynamic_shared = v;
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
  CUresult r = need_ctx();
  if (r) return r;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  switch (a) {
  case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = f->k.static_shared; break;
  case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = f->max_dynamic_shared; break;
  case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = f->k.bounds; break;
  default: fake_say("cuFuncGetAttribute: attribute %d is not modelled", (int)a); return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream s, void **params, void **extra) {
  CUresult r = check_stream(s);
  if (r) return r;
  if (!f || f->mod->ctx != current) {
    fake_say("cuLaunchKernel: a function of another GPU's module");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  const Kern *k = &f->k;
  if (extra || !params || gy != 1 || gz != 1 || by != 1 || bz != 1 || gx == 0 || gx > 0x7fffffffu || bx == 0) {
    fake_say("cuLaunchKernel %s: grid (%u,%u,%u) block (%u,%u,%u): only 1-D launches with params are modelled",
             k->name, gx, gy, gz, bx, by, bz);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (bx > 1024 || (int)bx > k->bounds) {
    fake_say("cuLaunchKernel %s: block of %u threads; __launch_bounds__ allows %d", k->name, bx, k->bounds);
    return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  }
  if ((int)shared > f->max_dynamic_shared) {
    fake_say("cuLaunchKernel %s: %u bytes of dynamic shared memory; the limit is %d", k->name, shared,
             f->max_dynamic_shared);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (bx % 32) {
    fake_say("cuLaunchKernel %s: block of %u threads is not a multiple of 32 (duet's kernels assume whole warps)",
             k->name, bx);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (shared > (1u << 20)) {
    fake_say("cuLaunchKernel %s: the emulation has 1 MiB of shared memory", k->name);
    return CUDA_ERROR_INVALID_VALUE;
  }
  Op *o = calloc(1, sizeof *o);
  size_t total = 0;
  for (int i = 0; i < k->n_params; i++) total += (k->sizes[i] + 15) & ~15u;
  if (!o || !(o->param_bytes = malloc(total ? total : 1)) || k->n_params > 64) {
    if (o) free_op(o);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* the driver copies the arguments at the launch */
  char *q = o->param_bytes;
  for (int i = 0; i < k->n_params; i++) {
    memcpy(q, params[i], k->sizes[i]);
    o->params[i] = q;
    q += (k->sizes[i] + 15) & ~15u;
  }
  o->kind = OP_LAUNCH;
  o->fn = f;
  o->grid = gx;
  o->block = bx;
  o->shared = shared;
  return enqueue(s, o);
}

/* ------------------------------------------------------------ running work */

static void gemm_run(const Gemm *g);

static void run_op(Op *o) {
  if (o->kind == OP_LAUNCH) {
    const Kern *k = &o->fn->k;
    kernel_name = k->name;
    bad_kernel_pointer = 0;
    if (k->prep(o->params) || bad_kernel_pointer) {
      G.sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
      return;
    }
    if (!G.seed_said) {
      G.seed_said = 1;
      fake_say("blocks and released threads run in a random order: seed %llu (DUET_EMU_SEED=%llu replays it)",
               G.seed, G.seed);
    }
    /* the schedule of this launch: from the seed, the kernel's name and
     * how many launches of it ran before, so that it does not depend on
     * how other streams' work interleaves (FNV-1a, then splitmix64's
     * increment) */
    unsigned long long h = 0xcbf29ce484222325ull;
    for (const char *c = k->name; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    o->fn->mod->seed(G.seed ^ h ^ o->fn->launches++ * 0x9E3779B97F4A7C15ull);
    unsigned grid = cuda_emu_grid(o->grid, o->block, k->grid_stride);
    if (o->fn->mod->launch(k->run, grid, o->block, o->shared, NULL, NULL)) {
      fake_say("kernel %s: the emulator could not launch it", k->name);
      G.sticky = CUDA_ERROR_LAUNCH_FAILED;
    }
  } else if (o->kind == OP_COPY || o->kind == OP_MEMSET) {
    char *d = o->dst_dev ? xlate(o->dst, o->bytes, "queued copy destination") : (char *)o->dst;
    const char *s = o->kind == OP_MEMSET ? NULL
                    : o->src_dev       ? xlate(o->src, o->bytes, "queued copy source")
                                       : (const char *)o->src;
    if (!d || (o->kind == OP_COPY && !s)) {
      G.sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
      return;
    }
    if (o->kind == OP_MEMSET) memset(d, o->value, o->bytes);
    else memmove(d, s, o->bytes);
  } else if (o->kind == OP_GEMM) {
    gemm_run(&o->g);
  } else if (o->kind == OP_RECORD) {
    if (o->gen > o->ev->completed) o->ev->completed = o->gen;
    o->ev->at = host_now();
  } /* OP_WAIT: its wait is over; OP_NCCL: ran when its last rank was reached (nccl_ready) */
}

/* ------------------------------------------------------------ cuBLAS */

struct cublasContext {
  struct CUctx_st *ctx;
  CUstream stream;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
  if (!current) return CUBLAS_STATUS_NOT_INITIALIZED;
  struct cublasContext *c = calloc(1, sizeof *c);
  if (!c) return CUBLAS_STATUS_ALLOC_FAILED;
  c->ctx = current;
  *h = c;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = (CUstream)s;
  return CUBLAS_STATUS_SUCCESS;
}

static float load_elem(const char *p, cudaDataType_t t, size_t i) {
  uint16_t h;
  switch (t) {
  case CUDA_R_32F: return ((const float *)p)[i];
  case CUDA_R_16F: memcpy(&h, p + 2 * i, 2); return duet_f32_from_f16(h);
  default: memcpy(&h, p + 2 * i, 2); return duet_f32_from_bf16(h);
  }
}

/* A cuBLAS result does not depend on the host's threads, but OpenBLAS's
 * summation order follows how many threads it splits a GEMM into, and
 * that count follows --threads and how many pipeline stages share the
 * host: every GEMM of the fake runs on one OpenBLAS thread, so that
 * `--devices cuda:0,cuda:0` computes exactly what `cuda:0` does.  The
 * OpenMP build of OpenBLAS takes the count from the calling thread's
 * OpenMP setting, which is changed for the call and restored; other
 * builds from a process-wide one (openblas_set_num_threads), also
 * restored: the fake's GEMMs run one at a time under G.exec, but a CPU
 * stage's GEMM at the same moment also runs on one thread.  Returns what
 * to restore. */
static int blas_one_thread(void) {
  int n;
  if (openblas_get_parallel() == 2) {
    n = omp_get_max_threads();
    omp_set_num_threads(1);
  } else {
    n = openblas_get_num_threads();
    openblas_set_num_threads(1);
  }
  return n;
}
static void blas_restore(int n) {
  if (openblas_get_parallel() == 2) omp_set_num_threads(n);
  else openblas_set_num_threads(n);
}

static void gemm_compute(const Gemm *g);

/* column-major C = alpha op(A) op(B) + beta C (cuBLAS's definition), on
 * one OpenBLAS thread (blas_one_thread) */
static void gemm_run(const Gemm *g) {
  int n = blas_one_thread();
  gemm_compute(g);
  blas_restore(n);
}

static void gemm_compute(const Gemm *g) {
  size_t es = g->type == CUDA_R_64F ? 8 : g->type == CUDA_R_32F ? 4 : 2;
  size_t ar = g->ta ? (size_t)g->k : (size_t)g->m, ac = g->ta ? (size_t)g->m : (size_t)g->k;
  size_t br = g->tb ? (size_t)g->n : (size_t)g->k, bc = g->tb ? (size_t)g->k : (size_t)g->n;
  char *a = xlate(g->a, es * ((ac - 1) * (size_t)g->lda + ar), "GEMM A");
  char *b = xlate(g->b, es * ((bc - 1) * (size_t)g->ldb + br), "GEMM B");
  char *c = xlate(g->c, es * (((size_t)g->n - 1) * (size_t)g->ldc + (size_t)g->m), "GEMM C");
  if (!a || !b || !c) {
    G.sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
    return;
  }
  CBLAS_TRANSPOSE ta = g->ta ? CblasTrans : CblasNoTrans, tb = g->tb ? CblasTrans : CblasNoTrans;
  if (g->type == CUDA_R_64F) {
    cblas_dgemm(CblasColMajor, ta, tb, g->m, g->n, g->k, g->alpha, (double *)a, g->lda, (double *)b, g->ldb, g->beta,
                (double *)c, g->ldc);
    return;
  }
  if (g->type == CUDA_R_32F) {
    cblas_sgemm(CblasColMajor, ta, tb, g->m, g->n, g->k, (float)g->alpha, (float *)a, g->lda, (float *)b, g->ldb,
                (float)g->beta, (float *)c, g->ldc);
    return;
  }
  /* 16-bit with COMPUTE_32F: products and sums in f32, one rounding of
   * the result (operands widened, SGEMM, narrowed) */
  if (!g->compute16) {
    size_t na = ac * (size_t)g->lda, nb = bc * (size_t)g->ldb, nc = (size_t)g->n * (size_t)g->ldc;
    float *fa = malloc(na * sizeof *fa), *fb = malloc(nb * sizeof *fb), *fc = malloc(nc * sizeof *fc);
    if (!fa || !fb || !fc) {
      free(fa), free(fb), free(fc);
      G.sticky = CUDA_ERROR_OUT_OF_MEMORY;
      return;
    }
    /* the last column holds only its rows: widen just those */
    for (size_t i = 0; i < (ac - 1) * (size_t)g->lda + ar; i++) fa[i] = load_elem(a, g->type, i);
    for (size_t i = 0; i < (bc - 1) * (size_t)g->ldb + br; i++) fb[i] = load_elem(b, g->type, i);
    for (size_t i = 0; i < ((size_t)g->n - 1) * (size_t)g->ldc + (size_t)g->m; i++)
      fc[i] = g->beta != 0 ? load_elem(c, g->type, i) : 0.0f;
    cblas_sgemm(CblasColMajor, ta, tb, g->m, g->n, g->k, (float)g->alpha, fa, g->lda, fb, g->ldb, (float)g->beta, fc,
                g->ldc);
    for (int j = 0; j < g->n; j++)
      for (int i = 0; i < g->m; i++) {
        size_t ci = (size_t)j * (size_t)g->ldc + (size_t)i;
        uint16_t h = g->type == CUDA_R_16F ? duet_f16_from_f32(fc[ci]) : duet_bf16_from_f32(fc[ci]);
        memcpy(c + 2 * ci, &h, 2);
      }
    free(fa), free(fb), free(fc);
    return;
  }
  /* COMPUTE_16F: every partial sum rounded to f16 */
  for (int j = 0; j < g->n; j++)
    for (int i = 0; i < g->m; i++) {
      float acc = 0;
      for (int p = 0; p < g->k; p++) {
        float x = load_elem(a, g->type, g->ta ? (size_t)i * (size_t)g->lda + (size_t)p : (size_t)p * (size_t)g->lda + (size_t)i);
        float y = load_elem(b, g->type, g->tb ? (size_t)p * (size_t)g->ldb + (size_t)j : (size_t)j * (size_t)g->ldb + (size_t)p);
        acc += x * y;
        if (g->compute16) acc = duet_f32_from_f16(duet_f16_from_f32(acc));
      }
      size_t ci = (size_t)j * (size_t)g->ldc + (size_t)i;
      float v = (float)g->alpha * acc + (g->beta != 0 ? (float)g->beta * load_elem(c, g->type, ci) : 0.0f);
      uint16_t h = g->type == CUDA_R_16F ? duet_f16_from_f32(v) : duet_bf16_from_f32(v);
      memcpy(c + 2 * ci, &h, 2);
    }
}

/* the checks cuBLAS documents for ?gemm: CUBLAS_STATUS_INVALID_VALUE when
 * m, n, k < 0 or a leading dimension is below the rows it must hold */
static cublasStatus_t gemm_queue(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                 double alpha, double beta, const void *A, int lda, const void *B, int ldb, void *C,
                                 int ldc, cudaDataType_t type, int compute16) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (current != h->ctx) {
    fake_say("cuBLAS handle of GPU %d used with %s current", h->ctx->gpu, current ? "another GPU's context" : "no context");
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) || m < 0 || n < 0 ||
      k < 0 || lda < (ta == CUBLAS_OP_N ? (m > 1 ? m : 1) : (k > 1 ? k : 1)) ||
      ldb < (tb == CUBLAS_OP_N ? (k > 1 ? k : 1) : (n > 1 ? n : 1)) || ldc < (m > 1 ? m : 1)) {
    fake_say("GEMM arguments rejected: op %d %d, m %d n %d k %d, lda %d ldb %d ldc %d", (int)ta, (int)tb, m, n, k, lda,
             ldb, ldc);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  if (k == 0) {
    fake_say("GEMM with k = 0 is not modelled");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!h->stream || check_stream(h->stream)) return CUBLAS_STATUS_EXECUTION_FAILED;
  Op *o = calloc(1, sizeof *o);
  if (!o) return CUBLAS_STATUS_ALLOC_FAILED;
  o->kind = OP_GEMM;
  o->g = (Gemm){ta == CUBLAS_OP_T, tb == CUBLAS_OP_T, m, n, k, lda, ldb, ldc, type, compute16, alpha, beta,
                (uintptr_t)A, (uintptr_t)B, (uintptr_t)C};
  enqueue(h->stream, o);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc) {
  return gemm_queue(h, ta, tb, m, n, k, *alpha, *beta, A, lda, B, ldb, C, ldc, CUDA_R_32F, 0);
}

cublasStatus_t cublasDgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const double *alpha, const double *A, int lda, const double *B, int ldb,
                              const double *beta, double *C, int ldc) {
  return gemm_queue(h, ta, tb, m, n, k, *alpha, *beta, A, lda, B, ldb, C, ldc, CUDA_R_64F, 0);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  (void)algo;
  int c16 = compute == CUBLAS_COMPUTE_16F;
  if (at != bt || at != ct || (at != CUDA_R_16F && at != CUDA_R_16BF && at != CUDA_R_32F) ||
      (compute != CUBLAS_COMPUTE_32F && !(c16 && at == CUDA_R_16F))) {
    fake_say("cublasGemmEx: types %d %d %d with compute type %d are not modelled", (int)at, (int)bt, (int)ct,
             (int)compute);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  double al, be;
  if (c16) { /* alpha and beta are __half with CUBLAS_COMPUTE_16F */
    uint16_t x, y;
    memcpy(&x, alpha, 2);
    memcpy(&y, beta, 2);
    al = duet_f32_from_f16(x), be = duet_f32_from_f16(y);
  } else {
    float x, y;
    memcpy(&x, alpha, 4);
    memcpy(&y, beta, 4);
    al = x, be = y;
  }
  return gemm_queue(h, ta, tb, m, n, k, al, be, A, lda, B, ldb, C, ldc, at, c16);
}

/* ------------------------------------------------------------ NVRTC */

struct _nvrtcProgram {
  char *src;
  char *log;
  char *image; /* MAGIC, size, shared object */
  size_t image_len;
  int is_sass, arch;
};

/* the architectures NVRTC reports: 11.8 from sm_35, 12.x from sm_50, 13.0
 * from sm_75 (NVIDIA's release notes; shared/FACTS.md) */
static int fake_archs(int *out) {
  static const int all[] = {35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 103, 120};
  const char *s = getenv("DUET_FAKE_NVRTC");
  int ma = 12, mi = 9, n = 0;
  if (s && *s) sscanf(s, "%d.%d", &ma, &mi);
  int lo = ma >= 13 ? 75 : ma == 12 ? 50 : 35, hi = ma >= 13 || (ma == 12 && mi >= 8) ? 120 : 90;
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    if (all[i] >= lo && all[i] <= hi) {
      if (out) out[n] = all[i];
      n++;
    }
  return n;
}

nvrtcResult nvrtcVersion(int *major, int *minor) {
  const char *s = getenv("DUET_FAKE_NVRTC");
  *major = 12, *minor = 9;
  if (s && *s) sscanf(s, "%d.%d", major, minor);
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetNumSupportedArchs(int *n) {
  *n = fake_archs(NULL);
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetSupportedArchs(int *a) {
  fake_archs(a);
  return NVRTC_SUCCESS;
}

const char *nvrtcGetErrorString(nvrtcResult r) {
  switch (r) {
  case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
  case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
  case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
  case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
  case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
  case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
  default: return "NVRTC_ERROR (fake)";
  }
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram *p, const char *src, const char *name, int n_headers,
                               const char *const *headers, const char *const *include_names) {
  (void)name, (void)headers, (void)include_names;
  if (!p || !src || n_headers) return NVRTC_ERROR_INVALID_INPUT;
  struct _nvrtcProgram *q = calloc(1, sizeof *q);
  if (!q || !(q->src = strdup(src))) {
    free(q);
    return NVRTC_ERROR_OUT_OF_MEMORY;
  }
  *p = q;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *p) {
  if (!p || !*p) return NVRTC_ERROR_INVALID_PROGRAM;
  free((*p)->src);
  free((*p)->log);
  free((*p)->image);
  free(*p);
  *p = NULL;
  return NVRTC_SUCCESS;
}

typedef struct Buf {
  char *s;
  size_t n, cap;
} Buf;

static void bput(Buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = (b->n + n + 1) * 2;
    char *t = realloc(b->s, cap);
    if (!t) abort(); /* test scaffolding: out of host memory is fatal */
    b->s = t, b->cap = cap;
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}

/* formatted output of at most 4 KiB */
static void bprint(Buf *b, const char *fmt, ...) {
  char tmp[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  bput(b, tmp, (size_t)(n < (int)sizeof tmp ? n : (int)sizeof tmp - 1));
}

/* Appends a trampoline per `extern "C" __global__` function of src: a
 * parameter struct fake_a_<name>, fake_prep_<name>(params) that loads the
 * launch's argument bytes into it (pointer arguments, and the pointers of
 * a duet_args, translated to host addresses), fake_run_<name> that calls
 * the kernel with them; then the table fake_kernels.  -1 when a signature
 * cannot be parsed. */
static int trampolines(const char *src, Buf *out) {
  Buf table = {0};
  int n = 0;
  const char *key = "extern \"C\" __global__ void ";
  for (const char *p = strstr(src, key); p; p = strstr(p, key)) {
    p += strlen(key);
    int bounds = 1024;
    if (!strncmp(p, "__launch_bounds__(", 18)) {
      bounds = atoi(p + 18);
      p = strchr(p, ')') + 1;
      while (*p == ' ') p++;
    }
    const char *lp = strchr(p, '(');
    if (!lp) return -1;
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(lp - p), p);
    const char *rp = strchr(lp, ')');
    const char *next = strstr(rp, key);
    const char *body_end = next ? next : rp + strlen(rp);
    int grid_stride = 0;
    for (const char *g = strstr(rp, "gridDim"); g && g < body_end; g = NULL) grid_stride = 1;
    /* parameters: "type name" separated by commas */
    char types[16][128];
    int np = 0;
    for (const char *a = lp + 1; a < rp && np < 16;) {
      const char *e = memchr(a, ',', (size_t)(rp - a));
      if (!e) e = rp;
      const char *t = e;
      while (t > a && (t[-1] == ' ')) t--;
      const char *id = t;
      while (id > a && (id[-1] == '_' || (id[-1] >= '0' && id[-1] <= '9') || (id[-1] >= 'a' && id[-1] <= 'z') ||
                        (id[-1] >= 'A' && id[-1] <= 'Z')))
        id--;
      while (*a == ' ') a++;
      if (id <= a) return -1;
      snprintf(types[np++], sizeof types[0], "%.*s", (int)(id - a), a);
      a = e + 1;
    }
    /* static shared memory: the function's __shared__ declarations as the
     * members of a struct whose size the compiler works out */
    Buf sh = {0};
    for (const char *q = strstr(rp, "__shared__ "); q && q < body_end; q = strstr(q + 1, "__shared__ ")) {
      const char *semi = strchr(q, ';');
      if (!semi || semi > body_end) break;
      if (q - rp >= 7 && !strncmp(q - 7, "extern ", 7)) continue; /* the dynamic buffer */
      bprint(&sh, " %.*s;", (int)(semi - q - 11), q + 11);
    }
    char shexpr[200] = "0";
    if (sh.n) {
      bprint(out, "struct fake_sh_%s {", name);
      bput(out, sh.s, sh.n);
      bprint(out, " };\n");
      snprintf(shexpr, sizeof shexpr, "(int)sizeof(fake_sh_%s)", name);
    }
    free(sh.s);
    bprint(out, "struct fake_a_%s {", name);
    for (int i = 0; i < np; i++) bprint(out, " %s a%d;", types[i], i);
    bprint(out, " };\nstatic fake_a_%s fake_v_%s;\nstatic const unsigned fake_s_%s[] = {", name, name, name);
    for (int i = 0; i < np; i++) bprint(out, "sizeof(%s), ", types[i]);
    bprint(out, "0};\nextern \"C\" int fake_prep_%s(void *const *pp) {\n", name);
    for (int i = 0; i < np; i++)
      bprint(out, "  memcpy(&fake_v_%s.a%d, pp[%d], sizeof fake_v_%s.a%d); fake_fix(fake_v_%s.a%d);\n", name, i, i,
             name, i, name, i);
    bprint(out, "  return 0;\n}\nextern \"C\" void fake_run_%s(void *const *t, const double *s) {\n  (void)t; (void)s;\n"
                "  %s(", name, name);
    for (int i = 0; i < np; i++) bprint(out, "%sfake_v_%s.a%d", i ? ", " : "", name, i);
    bprint(out, ");\n}\n");
    bprint(&table, "  {\"%s\", fake_prep_%s, fake_run_%s, fake_s_%s, %d, %d, %d, %s},\n", name, name, name, name, np,
           bounds, grid_stride, shexpr);
    n++;
    p = rp;
  }
  bprint(out, "struct FakeKern { const char *name; int (*prep)(void *const *); void (*run)(void *const *, const double *);"
              " const unsigned *sizes; int n_params, bounds, grid_stride, static_shared; };\n"
              "extern \"C\" const FakeKern fake_kernels[] = {\n");
  if (table.s) bput(out, table.s, table.n);
  bprint(out, "};\nextern \"C\" const int fake_n_kernels = %d;\n", n);
  free(table.s);
  return n ? 0 : -1;
}

static int run_cmd(char *const argv[], const char *log_path) {
  posix_spawn_file_actions_t fa;
  if (posix_spawn_file_actions_init(&fa)) return -1;
  posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc) return -1;
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  Buf b = {0};
  char tmp[65536];
  size_t k;
  while ((k = fread(tmp, 1, sizeof tmp, f)) > 0) bput(&b, tmp, k);
  fclose(f);
  *len = b.n;
  return b.s;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int n, const char *const *opts) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  const char *arch = NULL;
  for (int i = 0; i < n; i++) {
    if (!strncmp(opts[i], "-arch=", 6) && !arch) arch = opts[i] + 6;
    else if (strcmp(opts[i], "-std=c++17")) {
      fake_say("nvrtcCompileProgram: option %s is not modelled", opts[i]);
      return NVRTC_ERROR_INVALID_OPTION;
    }
  }
  int cc = 0, archs[64], na = fake_archs(archs), ok = 0;
  if (!arch || (sscanf(arch, "sm_%d", &cc) != 1 && sscanf(arch, "compute_%d", &cc) != 1)) return NVRTC_ERROR_INVALID_OPTION;
  for (int i = 0; i < na; i++) ok |= archs[i] == cc;
  if (!ok) return NVRTC_ERROR_INVALID_OPTION;
  p->is_sass = arch[0] == 's';
  p->arch = cc;
  /* the source as tests/cuda_emu builds it, then the pointer translation
   * and the trampolines */
  Buf src = {0};
  bprint(&src, "#include <type_traits>\nextern \"C\" { void *(*fake_xlate)(const void *); }\n"
               "template <typename T> static void fake_fix(T &v) {\n"
               "  if constexpr (std::is_pointer<T>::value) v = (T)fake_xlate((const void *)v);\n}\n");
  if (strstr(p->src, "duet_args"))
    bprint(&src, "static void fake_fix(duet_args &a) { for (auto &q : a.p) q = fake_xlate(q); }\n");
  if (trampolines(p->src, &src)) {
    free(src.s);
    free(p->log);
    p->log = strdup("fakegpu: no extern \"C\" __global__ function could be parsed\n");
    return NVRTC_ERROR_COMPILATION;
  }
  const char *tmp = getenv("TMPDIR");
  char dir[512], cpp[600], so[600], logp[600], inc[600];
  snprintf(dir, sizeof dir, "%s/fakegpu-nvrtc-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    free(src.s);
    return NVRTC_ERROR_OUT_OF_MEMORY;
  }
  snprintf(cpp, sizeof cpp, "%s/k.cpp", dir);
  snprintf(so, sizeof so, "%s/k.so", dir);
  snprintf(logp, sizeof logp, "%s/log", dir);
  snprintf(inc, sizeof inc, "-I%s", FAKEGPU_EMU_DIR);
  FILE *f = fopen(cpp, "w");
  int bad = !f || cuda_emu_write_source(f, p->src) || fwrite(src.s, 1, src.n, f) != src.n;
  if (f && fclose(f)) bad = 1;
  free(src.s);
  const char *cxx = getenv("CXX");
  char *argv[] = {(char *)(cxx && *cxx ? cxx : "c++"), "-std=c++17", "-O1", "-w", "-shared", "-fPIC", "-pthread",
                  inc, "-o", so, cpp, NULL};
  int rc = bad ? -1 : run_cmd(argv, logp);
  size_t loglen = 0;
  free(p->log);
  p->log = read_file(logp, &loglen);
  nvrtcResult r = NVRTC_SUCCESS;
  size_t solen = 0;
  char *img = rc == 0 ? read_file(so, &solen) : NULL;
  if (!img) {
    r = NVRTC_ERROR_COMPILATION;
  } else {
    uint64_t n64 = solen;
    uint32_t a32 = (uint32_t)p->arch, s32 = (uint32_t)p->is_sass;
    size_t hl = sizeof MAGIC - 1 + 8 + sizeof n64;
    p->image_len = hl + solen;
    if (!(p->image = malloc(p->image_len))) {
      r = NVRTC_ERROR_OUT_OF_MEMORY;
    } else {
      memcpy(p->image, MAGIC, sizeof MAGIC - 1);
      memcpy(p->image + sizeof MAGIC - 1, &a32, 4);
      memcpy(p->image + sizeof MAGIC + 3, &s32, 4);
      memcpy(p->image + sizeof MAGIC + 7, &n64, sizeof n64);
      memcpy(p->image + hl, img, solen);
    }
    free(img);
  }
  unlink(cpp), unlink(so), unlink(logp), rmdir(dir);
  return r;
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram p, size_t *n) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  *n = (p->log ? strlen(p->log) : 0) + 1;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram p, char *log) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  strcpy(log, p->log ? p->log : "");
  return NVRTC_SUCCESS;
}

static nvrtcResult image_size(nvrtcProgram p, size_t *n, int want_sass) {
  if (!p || !p->image) return NVRTC_ERROR_INVALID_PROGRAM;
  if (want_sass && !p->is_sass) return NVRTC_ERROR_INVALID_INPUT; /* no CUBIN for a virtual architecture */
  *n = p->image_len;
  return NVRTC_SUCCESS;
}

static nvrtcResult image_copy(nvrtcProgram p, char *out, int want_sass) {
  size_t n;
  nvrtcResult r = image_size(p, &n, want_sass);
  if (r == NVRTC_SUCCESS) memcpy(out, p->image, n);
  return r;
}

nvrtcResult nvrtcGetPTXSize(nvrtcProgram p, size_t *n) { return image_size(p, n, 0); }
nvrtcResult nvrtcGetPTX(nvrtcProgram p, char *ptx) { return image_copy(p, ptx, 0); }
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram p, size_t *n) { return image_size(p, n, 1); }
nvrtcResult nvrtcGetCUBIN(nvrtcProgram p, char *cubin) { return image_copy(p, cubin, 1); }

/* ------------------------------------------------------------ NCCL
 * (libnccl.so.2: tests/run_fakegpu.sh links that name to this library
 * too).  Communicators of a clique (ncclCommInitAll, or ncclCommInitRank
 * with an id from ncclGetUniqueId, threads of this process only) over
 * distinct fake GPUs.  A collective queues an OP_NCCL op on each rank's
 * stream; the k-th call of every rank of a clique is one FakeCall.  It
 * runs when the queues run, like the fake's kernels: when one rank's op
 * is reached (its stream synchronised or queried, or an event after it
 * queried), the other ranks' streams are run up to theirs (a GPU runs its
 * streams concurrently); once every rank's op is reached the collective
 * is computed and the ops complete.  A rank whose op is queued but
 * never reached (DUET_FAKE_NCCL_HANG) or whose call never comes leaves
 * the others pending, as a real collective's kernels spin; only
 * ncclCommAbort releases them.
 *
 * Summation order (sum, prod, min, max): a ring over the ranks in rank
 * order, as NCCL's ring all-reduce (reduce-scatter then all-gather): the
 * elements are split into R contiguous chunks (the first count % R one
 * element longer) and chunk c is reduced starting at rank c + 1: x[c+1]
 * + x[c+2] + ... + x[c] (indices mod R), left to right, one rounding per
 * operation.  Reduce-scatter reduces rank i's block in the same order
 * from rank i + 1 to rank i.  With 2 ranks that is a + b = b + a: the
 * rank-order sum's bits.  Real NCCL chooses among ring, tree and other
 * algorithms and protocols by size and topology, cycles through chunks of
 * a protocol-dependent size, and orders its ring by the topology: its
 * association differs; only "every rank gets the same bytes" holds for
 * both.
 *
 * Argument checks (NCCL documentation and behaviour): a communicator
 * that is NULL, destroyed or aborted, a datatype or reduction operation
 * out of range, a root out of range, buffers that are not device (or
 * managed) memory of the communicator's GPU for the whole count: 
 * ncclInvalidArgument; ncclCommInitAll and ncclCommInitRank with two
 * ranks on one GPU: ncclInvalidUsage ("Duplicate GPU detected"), and
 * with devices out of range, a rank out of range or an id not from
 * ncclGetUniqueId: ncclInvalidArgument; ncclGroupEnd without
 * ncclGroupStart: ncclInvalidUsage.  Stricter than NCCL: a stream of
 * another GPU than the communicator's, the legacy default stream, ncclAvg
 * and data types other than int32/int64/float32/float64 are refused;
 * ranks whose k-th calls disagree (kind, count, type, op, root) get an
 * asynchronous ncclInvalidUsage (ncclCommGetAsyncError) instead of the
 * hang or garbage of a real mismatch; ncclCommDestroy with a collective
 * of the rank still in flight (which NCCL would wait for) is refused.
 * Across processes (ncclCommInitRank with an id that another process
 * made and sent, as an MPI run broadcasts it): every rank of an id's
 * clique registers in a shared-memory file named after the id,
 * /dev/shm/duet-fakenccl-PID-K-NS (its pid and GPU; ncclCommInitRank
 * returns once all nranks have registered, polling every 2 ms, as NCCL's
 * bootstrap blocks; the file is unlinked then, and lives on while
 * mapped).  A clique whose ranks are all in one process is the
 * in-process clique above.  Otherwise each process runs its local ranks'
 * parts as above, and the k-th collective goes through the file: once
 * its local parts are reached, each local rank copies its input into its
 * slot of the file (after every rank has finished reading call k - 1
 * from the slots) and marks it posted; once every rank has posted call
 * k, each process computes the result from the slots, in the same ring
 * order and arithmetic as in one process (so every process gets the same
 * bytes as every other, and as one process with the same ranks would),
 * writes its local ranks' outputs and marks call k done.  A slot holds
 * $DUET_FAKE_NCCL_SLOT_MB MiB (default 256; the file is sparse: only what
 * is written takes memory): a larger collective is an asynchronous
 * ncclInvalidUsage.  The GPUs of different processes are different GPUs
 * (each process has its own fake GPUs: "Duplicate GPU" is checked within a
 * process only); calls of a communicator complete in order (NCCL's
 * communicators on one stream do).  A rank that dies or hangs leaves the
 * others' collectives pending (their kernels spin, as NCCL's do) until
 * they call ncclCommAbort; a rank that never joins leaves the others in
 * ncclCommInitRank.
 * Not modelled: networks and NCCL's bootstrap (the file stands in for
 * both: the processes must share /dev/shm, as on one machine), NCCL's
 * algorithms, protocols, channels, topology and timing, nonblocking
 * communicators, user buffer registration.
 *
 * Version: $DUET_FAKE_NCCL, 2.26.5 (a build for CUDA 12.9, the default)
 * or 2.28.9 (a build for CUDA 13.0): ncclGetVersion says it and the
 * library holds both version banners, "NCCL version 2.26.5+cuda12.9" and
 * "NCCL version 2.28.9+cuda13.0", as real NCCL holds its one.
 *
 * DUET_FAKE_NCCL_HANG=R:K: rank R's K-th collective (K from 1, counted
 * per communicator) never starts on its GPU, as if the GPU had died. */
#ifdef FAKEGPU_NCCL
#include <nccl.h>

#include "../../runtime/cuda/duet_nccl.h"

/* runtime/cuda/duet_nccl.h declares NCCL's ABI by hand: check it */
_Static_assert((int)DUET_NCCL_SUCCESS == (int)ncclSuccess && (int)DUET_NCCL_UNHANDLED_CUDA_ERROR == (int)ncclUnhandledCudaError &&
                   (int)DUET_NCCL_SYSTEM_ERROR == (int)ncclSystemError &&
                   (int)DUET_NCCL_INTERNAL_ERROR == (int)ncclInternalError &&
                   (int)DUET_NCCL_INVALID_ARGUMENT == (int)ncclInvalidArgument &&
                   (int)DUET_NCCL_INVALID_USAGE == (int)ncclInvalidUsage &&
                   (int)DUET_NCCL_REMOTE_ERROR == (int)ncclRemoteError && (int)DUET_NCCL_IN_PROGRESS == (int)ncclInProgress,
               "ncclResult_t");
_Static_assert((int)DUET_NCCL_INT32 == (int)ncclInt32 && (int)DUET_NCCL_FLOAT32 == (int)ncclFloat32 &&
                   (int)DUET_NCCL_FLOAT64 == (int)ncclFloat64 && (int)DUET_NCCL_SUM == (int)ncclSum,
               "ncclDataType_t, ncclRedOp_t");
_Static_assert(DUET_NCCL_UNIQUE_ID_BYTES == sizeof(ncclUniqueId) && sizeof(DuetNcclUniqueId) == sizeof(ncclUniqueId) && sizeof(ncclResult_t) == sizeof(int) &&
                   sizeof(ncclDataType_t) == sizeof(int) && sizeof(ncclRedOp_t) == sizeof(int),
               "sizes");

__attribute__((used)) static const char fake_nccl_banners[] =
    "NCCL version 2.26.5+cuda12.9\0NCCL version 2.28.9+cuda13.0";

enum { COLL_ALLREDUCE, COLL_BROADCAST, COLL_REDUCESCATTER, COLL_ALLGATHER };
static const char *const coll_name[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduceScatter", "ncclAllGather"};

typedef struct Clique Clique;

struct ncclComm {
  Clique *cq;
  int rank, gpu;
  unsigned long long seq;  /* collectives called so far */
  unsigned long long hang; /* DUET_FAKE_NCCL_HANG: this call never starts (0: none) */
  ncclResult_t async;      /* ncclCommGetAsyncError */
};

typedef struct Part { /* one rank's call */
  int in, reached, aborted, popped, hang, posted;
  int kind, root;
  const void *send;
  void *recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  CUstream stream;
} Part;

struct FakeCall {
  FakeCall *next;
  Clique *cq;
  unsigned long long seq;
  int done, popped;
  Part part[MAX_GPUS];
};

/* The shared-memory file of a clique across processes: a page of this
 * header, then a slot of hdr->slot bytes per rank.  Each rank writes its
 * own entry only (pid once, with a compare-and-swap); posted and done
 * are the last call whose input is in the rank's slot, and the last call
 * the rank has finished reading from the slots (release/acquire). */
typedef struct ShmRank {
  int pid, gpu;
  unsigned long long posted, done;
  int kind, type, op, root;
  unsigned long long count;
} ShmRank;
typedef struct ShmHdr {
  int n;
  unsigned long long slot;
  ShmRank r[MAX_GPUS];
} ShmHdr;
#define SHM_HDR_BYTES 4096
_Static_assert(sizeof(ShmHdr) <= SHM_HDR_BYTES, "the shared-memory header fits its page");

struct Clique {
  Clique *next;
  int n, joined, live;      /* ranks; joined (ncclCommInitRank); communicators alive */
  int complete, bad;         /* every rank joined; two of them on one GPU */
  int has_id;
  char id[NCCL_UNIQUE_ID_BYTES];
  struct ncclComm *comm[MAX_GPUS];
  FakeCall *calls;
  char why[200];
  /* across processes: the id's file (NULL: none, or it could not be made) */
  ShmHdr *shm;
  size_t shm_len;
  char shm_path[160];
  int span; /* ranks in other processes (known once complete) */
  int local[MAX_GPUS]; /* with span: rank j is this process's */
};

/* under G.exec */
static struct {
  Clique *cliques;
  struct ncclComm *comms[256]; /* live communicators */
  int n_comms;
  unsigned long long ids;
} N;

typedef struct Pending { /* a call inside ncclGroupStart/End */
  struct ncclComm *comm;
  Part p;
  ncclComm_t *init_out; /* ncclCommInitRank in a group: wait for its clique at the end */
} Pending;
static _Thread_local int group_depth, n_pending, cap_pending;
static _Thread_local Pending *pending;
static _Thread_local char last_error[600];

static ncclResult_t nccl_fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t nccl_fail(ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  fake_say("NCCL: %s", last_error);
  return r;
}

static int live_comm(const struct ncclComm *c) {
  for (int i = 0; i < N.n_comms; i++)
    if (N.comms[i] == c) return 1;
  return 0;
}

static int add_comm(struct ncclComm *c) {
  if (N.n_comms == (int)(sizeof N.comms / sizeof *N.comms)) return -1;
  N.comms[N.n_comms++] = c;
  return 0;
}

/* Under G.exec: frees a clique with no live communicator and no queued call. */
static void clique_release(Clique *cq) {
  if (cq->live > 0 || cq->calls) return;
  for (Clique **p = &N.cliques; *p; p = &(*p)->next)
    if (*p == cq) {
      *p = cq->next;
      break;
    }
  if (cq->shm) {
    if (!cq->complete) unlink(cq->shm_path); /* never complete: nobody else will */
    munmap(cq->shm, cq->shm_len);
  }
  free(cq);
}

/* Under G.exec: maps the shared-memory file of clique cq (named after its
 * id, made when missing) and registers rank `rank` on `gpu` in it.
 * ncclSuccess; or a failure to register (the rank is there already, the
 * file says another number of ranks); a file that cannot be made leaves
 * cq->shm NULL (the clique is then one process's, and says so). */
static ncclResult_t shm_join(Clique *cq, int rank, int gpu) {
  if (!cq->shm) {
    long long pid = 0;
    unsigned long long k = 0, ns = 0;
    if (sscanf(cq->id, "fakenccl %lld %llu %llu", &pid, &k, &ns) != 3) return ncclSuccess; /* checked by the caller */
    snprintf(cq->shm_path, sizeof cq->shm_path, "/dev/shm/duet-fakenccl-%lld-%llu-%llu", pid, k, ns);
    const char *mb = getenv("DUET_FAKE_NCCL_SLOT_MB");
    unsigned long long slot = (mb && *mb ? strtoull(mb, NULL, 10) : 256) << 20;
    if (slot == 0) slot = 256ull << 20;
    size_t len = SHM_HDR_BYTES + (size_t)cq->n * slot;
    int fd = open(cq->shm_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    void *m = MAP_FAILED;
    if (fd >= 0) {
      struct stat st;
      /* every process sizes it the same (sparse); a later one must not shrink it */
      if (fstat(fd, &st) == 0 && (st.st_size == (off_t)len || ftruncate(fd, (off_t)len) == 0))
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
    }
    if (m == MAP_FAILED) {
      fake_say("NCCL: cannot map %s (%s): the clique of this id is this process's alone", cq->shm_path, strerror(errno));
      return ncclSuccess;
    }
    cq->shm = m, cq->shm_len = len;
    int zero = 0;
    if (!__atomic_compare_exchange_n(&cq->shm->n, &zero, cq->n, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) && zero != cq->n)
      return nccl_fail(ncclInvalidArgument, "ncclCommInitRank: %d ranks, the id's clique has %d (in %s)", cq->n, zero,
                       cq->shm_path);
    unsigned long long z = 0;
    __atomic_compare_exchange_n(&cq->shm->slot, &z, slot, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  }
  ShmRank *r = &cq->shm->r[rank];
  int zero = 0;
  r->gpu = gpu;
  if (!__atomic_compare_exchange_n(&r->pid, &zero, (int)getpid(), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return nccl_fail(ncclInvalidUsage, "ncclCommInitRank: rank %d joined twice (process %d has it)", rank, zero);
  return ncclSuccess;
}

/* Under G.exec: the ranks of clique cq that have joined, in every process. */
static int joined_count(const Clique *cq) {
  if (!cq->shm) return cq->joined;
  int n = 0;
  for (int i = 0; i < cq->n; i++) n += __atomic_load_n(&cq->shm->r[i].pid, __ATOMIC_ACQUIRE) != 0;
  return n;
}

/* Under G.exec: takes c out of the registry and its clique, and frees it. */
static void comm_remove(struct ncclComm *c) {
  for (int i = 0; i < N.n_comms; i++)
    if (N.comms[i] == c) N.comms[i] = N.comms[--N.n_comms];
  Clique *cq = c->cq;
  cq->comm[c->rank] = NULL;
  cq->live--;
  free(c);
  clique_release(cq);
}

static struct ncclComm *comm_new(Clique *cq, int rank, int gpu) {
  struct ncclComm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->cq = cq, c->rank = rank, c->gpu = gpu;
  const char *h = getenv("DUET_FAKE_NCCL_HANG");
  int hr;
  unsigned long long hk;
  if (h && *h && sscanf(h, "%d:%llu", &hr, &hk) == 2 && hr == rank) c->hang = hk;
  return c;
}

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  const char *s = getenv("DUET_FAKE_NCCL");
  *version = s && !strcmp(s, "2.28.9") ? 22809 : 22605;
  if (s && *s && strcmp(s, "2.28.9") && strcmp(s, "2.26.5"))
    fake_say("DUET_FAKE_NCCL=%s is not modelled (2.26.5 or 2.28.9): 2.26.5", s);
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled CUDA error";
  case ncclSystemError: return "system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote error";
  case ncclInProgress: return "operation in progress";
  default: return "unknown result";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_error;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return nccl_fail(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
  memset(id, 0, sizeof *id);
  pthread_mutex_lock(&G.exec);
  unsigned long long k = ++N.ids;
  pthread_mutex_unlock(&G.exec);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts); /* with the pid: an id no earlier process has made */
  snprintf(id->internal, sizeof id->internal, "fakenccl %ld %llu %llu", (long)getpid(), k,
           (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
  return ncclSuccess;
}

static int ensure_init(void) { return G.init || cuInit(0) == CUDA_SUCCESS; }

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  if (!comms || ndev < 1 || ndev > MAX_GPUS) return nccl_fail(ncclInvalidArgument, "ncclCommInitAll: %d devices", ndev);
  if (!ensure_init()) return nccl_fail(ncclUnhandledCudaError, "ncclCommInitAll: no CUDA device");
  for (int i = 0; i < ndev; i++) {
    int d = devlist ? devlist[i] : i;
    if (d < 0 || d >= G.n_gpus) return nccl_fail(ncclInvalidArgument, "ncclCommInitAll: invalid device %d", d);
    for (int j = 0; j < i; j++)
      if ((devlist ? devlist[j] : j) == d)
        return nccl_fail(ncclInvalidUsage, "Duplicate GPU detected: ranks %d and %d are both on CUDA device %d", j, i, d);
  }
  Clique *cq = calloc(1, sizeof *cq);
  if (!cq) return ncclSystemError;
  cq->n = ndev;
  pthread_mutex_lock(&G.exec);
  for (int i = 0; i < ndev; i++) {
    struct ncclComm *c = comm_new(cq, i, devlist ? devlist[i] : i);
    if (!c || add_comm(c)) {
      free(c);
      for (int j = 0; j < i; j++) comm_remove(cq->comm[j]); /* frees cq with the last */
      pthread_mutex_unlock(&G.exec);
      return ncclSystemError;
    }
    cq->comm[i] = comms[i] = c;
    cq->live++, cq->joined++;
  }
  cq->complete = 1;
  cq->next = N.cliques;
  N.cliques = cq;
  pthread_mutex_unlock(&G.exec);
  return ncclSuccess;
}

/* Under G.exec: waits until the clique of c is complete; then checks its
 * GPUs.  ncclSuccess, or the failure (c is freed then). */
static ncclResult_t join_wait(struct ncclComm *c) {
  Clique *cq = c->cq;
  while (!cq->complete) {
    if (joined_count(cq) < cq->n) { /* other processes' ranks: polled */
      struct timespec dl;
      clock_gettime(CLOCK_REALTIME, &dl);
      dl.tv_nsec += 2000000;
      if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&G.moved, &G.exec, &dl);
      continue;
    }
    if (cq->joined < cq->n && cq->shm) { /* some ranks are in other processes */
      cq->span = 1;
      for (int i = 0; i < cq->n; i++) cq->local[i] = __atomic_load_n(&cq->shm->r[i].pid, __ATOMIC_ACQUIRE) == (int)getpid();
    }
    cq->complete = 1; /* the last to see every rank joined checks their GPUs, once */
    if (cq->shm) unlink(cq->shm_path); /* every rank has it mapped */
    for (int i = 0; i < cq->n; i++)
      for (int j = 0; j < i; j++)
        if (cq->comm[i] && cq->comm[j] && cq->comm[i]->gpu == cq->comm[j]->gpu && !cq->bad) {
          cq->bad = 1;
          snprintf(cq->why, sizeof cq->why, "Duplicate GPU detected: ranks %d and %d are both on CUDA device %d", j, i,
                   cq->comm[i]->gpu);
        }
    pthread_cond_broadcast(&G.moved);
  }
  if (!cq->bad) return ncclSuccess;
  snprintf(last_error, sizeof last_error, "%s", cq->why);
  fake_say("NCCL: %s", cq->why);
  comm_remove(c);
  return ncclInvalidUsage;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm || nranks < 1 || nranks > MAX_GPUS || rank < 0 || rank >= nranks)
    return nccl_fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
  if (strncmp(id.internal, "fakenccl ", 9))
    return nccl_fail(ncclInvalidArgument, "ncclCommInitRank: the id does not come from ncclGetUniqueId");
  if (!ensure_init()) return nccl_fail(ncclUnhandledCudaError, "ncclCommInitRank: no CUDA device");
  int gpu = current ? current->gpu : 0; /* the calling thread's device, as cudaGetDevice */
  pthread_mutex_lock(&G.exec);
  Clique *cq = N.cliques;
  while (cq && !(cq->has_id && !memcmp(cq->id, id.internal, sizeof cq->id))) cq = cq->next;
  if (!cq) {
    if (!(cq = calloc(1, sizeof *cq))) {
      pthread_mutex_unlock(&G.exec);
      return ncclSystemError;
    }
    cq->n = nranks;
    cq->has_id = 1;
    memcpy(cq->id, id.internal, sizeof cq->id);
    cq->next = N.cliques;
    N.cliques = cq;
  }
  ncclResult_t r = ncclSuccess;
  struct ncclComm *c = NULL;
  if (cq->n != nranks) r = nccl_fail(ncclInvalidArgument, "ncclCommInitRank: %d ranks, the id's clique has %d", nranks, cq->n);
  else if (cq->comm[rank]) r = nccl_fail(ncclInvalidUsage, "ncclCommInitRank: rank %d joined twice", rank);
  else if ((r = shm_join(cq, rank, gpu)) != ncclSuccess) c = NULL;
  else if (!(c = comm_new(cq, rank, gpu)) || add_comm(c)) r = ncclSystemError;
  if (r != ncclSuccess) {
    if (c && r == ncclSystemError) free(c);
    clique_release(cq);
    pthread_mutex_unlock(&G.exec);
    return r;
  }
  cq->comm[rank] = c;
  cq->live++, cq->joined++;
  pthread_cond_broadcast(&G.moved);
  *comm = c;
  if (group_depth > 0) { /* completed by ncclGroupEnd */
    if (n_pending == cap_pending) {
      Pending *np = realloc(pending, (size_t)(cap_pending ? 2 * cap_pending : 8) * sizeof *np);
      if (!np) {
        pthread_mutex_unlock(&G.exec);
        return ncclSystemError;
      }
      pending = np, cap_pending = cap_pending ? 2 * cap_pending : 8;
    }
    pending[n_pending++] = (Pending){.comm = c, .init_out = comm};
    pthread_mutex_unlock(&G.exec);
    return ncclSuccess;
  }
  r = join_wait(c);
  if (r != ncclSuccess) *comm = NULL;
  pthread_mutex_unlock(&G.exec);
  return r;
}

/* Under G.exec: the FakeCall of the clique with sequence number seq,
 * made when missing. */
static FakeCall *call_of(Clique *cq, unsigned long long seq) {
  FakeCall **p = &cq->calls;
  for (; *p; p = &(*p)->next)
    if ((*p)->seq == seq) return *p;
  FakeCall *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->cq = cq, c->seq = seq;
  *p = c;
  return c;
}

/* Queues comm's part p on its stream.  Under no lock. */
static ncclResult_t coll_queue(struct ncclComm *comm, const Part *p) {
  Op *o = calloc(1, sizeof *o);
  if (!o) return ncclSystemError;
  pthread_mutex_lock(&G.exec);
  if (!live_comm(comm)) {
    pthread_mutex_unlock(&G.exec);
    free(o);
    return nccl_fail(ncclInvalidArgument, "%s: the communicator was aborted or destroyed", coll_name[p->kind]);
  }
  FakeCall *c = call_of(comm->cq, ++comm->seq);
  if (!c) {
    pthread_mutex_unlock(&G.exec);
    free(o);
    return ncclSystemError;
  }
  c->part[comm->rank] = *p;
  c->part[comm->rank].in = 1;
  c->part[comm->rank].hang = comm->hang == comm->seq;
  o->kind = OP_NCCL;
  o->call = c;
  o->rank = comm->rank;
  CUstream s = p->stream;
  if (s->tail) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  pthread_cond_broadcast(&G.moved);
  pthread_mutex_unlock(&G.exec);
  return ncclSuccess;
}

static size_t nccl_size(ncclDataType_t t) {
  return t == ncclInt32 || t == ncclFloat32 ? 4 : t == ncclInt64 || t == ncclFloat64 ? 8 : 0;
}

/* The checks of a collective's arguments (send_n and recv_n elements at
 * send and recv; op < 0 or root < 0: none), then the call queued (or kept
 * for ncclGroupEnd). */
static ncclResult_t coll_call(const char *fn, int kind, const void *send, size_t send_n, void *recv, size_t recv_n,
                              size_t count, ncclDataType_t type, int op, int root, ncclComm_t comm,
                              cudaStream_t stream) {
  pthread_mutex_lock(&G.exec);
  int ok = comm && live_comm(comm), in_stream = 0;
  for (int i = 0; ok && stream && i < G.n_streams; i++) in_stream |= G.streams[i] == (CUstream)stream;
  int n = ok ? comm->cq->n : 0, gpu = ok ? comm->gpu : -1;
  pthread_mutex_unlock(&G.exec);
  if (!ok) return nccl_fail(ncclInvalidArgument, "%s: invalid communicator (NULL, destroyed or aborted)", fn);
  if ((int)type < 0 || (int)type >= (int)ncclNumTypes) return nccl_fail(ncclInvalidArgument, "%s: invalid data type %d", fn, (int)type);
  if (!nccl_size(type)) return nccl_fail(ncclInvalidArgument, "%s: data type %d is not modelled by the fake", fn, (int)type);
  if (op >= 0 && op >= (int)ncclNumOps) return nccl_fail(ncclInvalidArgument, "%s: invalid reduction operation %d", fn, op);
  if (op == (int)ncclAvg) return nccl_fail(ncclInvalidArgument, "%s: ncclAvg is not modelled by the fake", fn);
  if (kind == COLL_BROADCAST && (root < 0 || root >= n))
    return nccl_fail(ncclInvalidArgument, "%s: root %d out of range (%d ranks)", fn, root, n);
  if (!stream || !in_stream) return nccl_fail(ncclInvalidArgument, "%s: %s stream", fn, stream ? "an unknown" : "the legacy default");
  if (((CUstream)stream)->ctx->gpu != gpu)
    return nccl_fail(ncclInvalidArgument, "%s: a stream of GPU %d for a communicator of GPU %d", fn,
                     ((CUstream)stream)->ctx->gpu, gpu);
  const void *bufs[2] = {send, recv};
  size_t ns[2] = {send_n, recv_n};
  for (int k = 0; k < 2 && count > 0; k++) {
    pthread_mutex_lock(&G.lock);
    Alloc *a = bufs[k] ? find_alloc((uintptr_t)bufs[k], ns[k] * nccl_size(type)) : NULL;
    ok = a && (a->kind == MEM_MANAGED || (a->kind == MEM_DEVICE && a->gpu == gpu));
    pthread_mutex_unlock(&G.lock);
    if (!ok)
      return nccl_fail(ncclInvalidArgument, "%s: %s %p is not %zu bytes of GPU %d's memory", fn, k ? "recvbuff" : "sendbuff",
                       bufs[k], ns[k] * nccl_size(type), gpu);
  }
  if (count == 0) return ncclSuccess;
  Part p = {.kind = kind, .root = root, .send = send, .recv = recv, .count = count, .type = type,
            .op = op < 0 ? ncclSum : (ncclRedOp_t)op, .stream = (CUstream)stream};
  if (group_depth == 0) return coll_queue(comm, &p);
  if (n_pending == cap_pending) {
    Pending *np = realloc(pending, (size_t)(cap_pending ? 2 * cap_pending : 8) * sizeof *np);
    if (!np) return ncclSystemError;
    pending = np, cap_pending = cap_pending ? 2 * cap_pending : 8;
  }
  pending[n_pending++] = (Pending){.comm = comm, .p = p};
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return coll_call("ncclAllReduce", COLL_ALLREDUCE, send, count, recv, count, count, type, (int)op, -1, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return coll_call("ncclBroadcast", COLL_BROADCAST, send, count, recv, count, count, type, -1, root, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  int n = 0;
  pthread_mutex_lock(&G.exec);
  if (comm && live_comm(comm)) n = comm->cq->n;
  pthread_mutex_unlock(&G.exec);
  return coll_call("ncclReduceScatter", COLL_REDUCESCATTER, send, (size_t)n * recvcount, recv, recvcount, recvcount,
                   type, (int)op, -1, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  int n = 0;
  pthread_mutex_lock(&G.exec);
  if (comm && live_comm(comm)) n = comm->cq->n;
  pthread_mutex_unlock(&G.exec);
  return coll_call("ncclAllGather", COLL_ALLGATHER, send, sendcount, recv, (size_t)n * sendcount, sendcount, type, -1,
                   -1, comm, stream);
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return nccl_fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < n_pending; i++) { /* the group's collectives, in order */
    if (pending[i].init_out) continue;
    ncclResult_t q = coll_queue(pending[i].comm, &pending[i].p);
    if (r == ncclSuccess) r = q;
  }
  pthread_mutex_lock(&G.exec);
  for (int i = 0; i < n_pending; i++) /* then the communicators it initialised */
    if (pending[i].init_out) {
      ncclResult_t q = join_wait(pending[i].comm);
      if (q != ncclSuccess) *pending[i].init_out = NULL;
      if (r == ncclSuccess) r = q;
    }
  pthread_mutex_unlock(&G.exec);
  n_pending = 0;
  free(pending);
  pending = NULL;
  cap_pending = 0;
  return r;
}

/* dst[e] = src[0][e] op src[1][e] op ... op src[n-1][e], left to right */
static void reduce_into(char *dst, const char *const *src, int n, size_t count, ncclDataType_t t, ncclRedOp_t op) {
  for (size_t e = 0; e < count; e++) {
    if (t == ncclFloat32 || t == ncclFloat64) {
      double acc = t == ncclFloat32 ? ((const float *)src[0])[e] : ((const double *)src[0])[e];
      float accf = (float)acc;
      for (int k = 1; k < n; k++) {
        if (t == ncclFloat32) {
          float v = ((const float *)src[k])[e];
          accf = op == ncclSum ? accf + v : op == ncclProd ? accf * v : op == ncclMax ? (v > accf ? v : accf) : (v < accf ? v : accf);
        } else {
          double v = ((const double *)src[k])[e];
          acc = op == ncclSum ? acc + v : op == ncclProd ? acc * v : op == ncclMax ? (v > acc ? v : acc) : (v < acc ? v : acc);
        }
      }
      if (t == ncclFloat32) ((float *)dst)[e] = accf;
      else ((double *)dst)[e] = acc;
    } else { /* integers: unsigned arithmetic wraps, as the GPU's */
      int wide = t == ncclInt64;
      int64_t acc = wide ? ((const int64_t *)src[0])[e] : ((const int32_t *)src[0])[e];
      for (int k = 1; k < n; k++) {
        int64_t v = wide ? ((const int64_t *)src[k])[e] : ((const int32_t *)src[k])[e];
        acc = op == ncclSum ? (int64_t)((uint64_t)acc + (uint64_t)v) : op == ncclProd ? (int64_t)((uint64_t)acc * (uint64_t)v)
              : op == ncclMax ? (v > acc ? v : acc) : (v < acc ? v : acc);
        if (!wide) acc = (int32_t)(uint32_t)acc;
      }
      if (wide) ((int64_t *)dst)[e] = acc;
      else ((int32_t *)dst)[e] = (int32_t)acc;
    }
  }
}

/* Under G.exec: computes the collective once every rank's part is
 * reached (see the section's comment for the order). */
static void call_run(FakeCall *c) {
  Clique *cq = c->cq;
  int n = cq->n;
  Part all[MAX_GPUS] = {{0}}; /* every rank's call: across processes, the others' from the file */
  for (int j = 0; j < n; j++) {
    all[j] = c->part[j];
    if (cq->span && !cq->local[j]) {
      const ShmRank *r = &cq->shm->r[j];
      all[j].kind = r->kind, all[j].type = (ncclDataType_t)r->type, all[j].op = (ncclRedOp_t)r->op;
      all[j].root = r->root, all[j].count = (size_t)r->count;
    }
  }
  const Part *p0 = &all[0];
  for (int j = 1; j < n; j++) {
    const Part *q = &all[j];
    if (q->kind != p0->kind || q->count != p0->count || q->type != p0->type || q->op != p0->op || q->root != p0->root) {
      fake_say("NCCL: call %llu: rank %d's %s of %zu elements of type %d (op %d, root %d) against rank 0's %s of %zu of "
               "type %d (op %d, root %d): the ranks disagree", c->seq, j, coll_name[q->kind], q->count, (int)q->type,
               (int)q->op, q->root, coll_name[p0->kind], p0->count, (int)p0->type, (int)p0->op, p0->root);
      for (int k = 0; k < n; k++)
        if (c->cq->comm[k]) c->cq->comm[k]->async = ncclInvalidUsage;
      return;
    }
  }
  size_t es = nccl_size(p0->type), cnt = p0->count;
  size_t in_n = p0->kind == COLL_REDUCESCATTER ? (size_t)n * cnt : cnt;
  size_t out_n = p0->kind == COLL_ALLGATHER ? (size_t)n * cnt : cnt;
  const char *in[MAX_GPUS];
  char *out[MAX_GPUS];
  for (int j = 0; j < n; j++) {
    int mine = !cq->span || cq->local[j];
    /* across processes every input comes from its slot (this process's too: the same bytes) */
    in[j] = cq->span ? (const char *)cq->shm + SHM_HDR_BYTES + (size_t)j * cq->shm->slot
                     : xlate((uintptr_t)c->part[j].send, in_n * es, "NCCL sendbuff");
    out[j] = mine ? xlate((uintptr_t)c->part[j].recv, out_n * es, "NCCL recvbuff") : NULL;
    if (!in[j] || (mine && !out[j])) {
      G.sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
      return;
    }
  }
  size_t tmp_n = p0->kind == COLL_REDUCESCATTER || p0->kind == COLL_ALLGATHER ? (size_t)n * cnt : cnt;
  char *tmp = malloc(tmp_n * es > 0 ? tmp_n * es : 1);
  if (!tmp) {
    G.sticky = CUDA_ERROR_OUT_OF_MEMORY;
    return;
  }
  const char *order[MAX_GPUS];
  if (p0->kind == COLL_ALLREDUCE || p0->kind == COLL_REDUCESCATTER) {
    /* block c (an all-reduce's chunk, a reduce-scatter's rank block) from rank c + 1 round to rank c */
    for (int blk = 0; blk < n; blk++) {
      size_t lo, hi;
      if (p0->kind == COLL_ALLREDUCE) {
        lo = cnt / (size_t)n * (size_t)blk + ((size_t)blk < cnt % (size_t)n ? (size_t)blk : cnt % (size_t)n);
        hi = lo + cnt / (size_t)n + ((size_t)blk < cnt % (size_t)n ? 1 : 0);
      } else {
        lo = (size_t)blk * cnt, hi = lo + cnt;
      }
      for (int k = 0; k < n; k++) order[k] = in[(blk + 1 + k) % n] + lo * es;
      reduce_into(tmp + lo * es, order, n, hi - lo, p0->type, p0->op);
    }
    if (p0->kind == COLL_ALLREDUCE)
      for (int j = 0; j < n; j++) {
        if (out[j]) memcpy(out[j], tmp, cnt * es);
      }
    else
      for (int j = 0; j < n; j++) {
        if (out[j]) memcpy(out[j], tmp + (size_t)j * cnt * es, cnt * es);
      }
  } else if (p0->kind == COLL_BROADCAST) {
    memcpy(tmp, in[p0->root], cnt * es);
    for (int j = 0; j < n; j++)
      if (out[j]) memcpy(out[j], tmp, cnt * es);
  } else {
    for (int j = 0; j < n; j++) memcpy(tmp + (size_t)j * cnt * es, in[j], cnt * es);
    for (int j = 0; j < n; j++)
      if (out[j]) memcpy(out[j], tmp, (size_t)n * cnt * es);
  }
  free(tmp);
}

/* Under G.exec, for a clique across processes whose local parts of call c
 * are reached: posts each local rank's input in its slot of the file (once
 * every rank is done reading the previous call), then says whether every
 * rank has posted call c (1) or not yet (0: polled again). */
static int span_exchange(FakeCall *c) {
  Clique *cq = c->cq;
  ShmHdr *h = cq->shm;
  int n = cq->n;
  for (int j = 0; j < n; j++) {
    Part *p = &c->part[j];
    if (!cq->local[j] || p->posted) continue;
    for (int k = 0; k < n; k++) /* the slots are free once everyone has read call seq - 1 */
      if (__atomic_load_n(&h->r[k].done, __ATOMIC_ACQUIRE) + 1 < c->seq) return 0;
    size_t es = nccl_size(p->type), in_n = p->kind == COLL_REDUCESCATTER ? (size_t)n * p->count : p->count;
    if (in_n * es > h->slot) {
      fake_say("NCCL: call %llu: %zu bytes of rank %d exceed the fake's shared-memory slot of %llu bytes "
               "(DUET_FAKE_NCCL_SLOT_MB)", c->seq, in_n * es, j, h->slot);
      G.sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
      return 1;
    }
    const char *src = xlate((uintptr_t)p->send, in_n * es, "NCCL sendbuff");
    if (!src) {
      G.sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
      return 1;
    }
    memcpy((char *)h + SHM_HDR_BYTES + (size_t)j * h->slot, src, in_n * es);
    ShmRank *r = &h->r[j];
    r->kind = p->kind, r->type = (int)p->type, r->op = (int)p->op, r->root = p->root;
    r->count = p->count;
    __atomic_store_n(&r->posted, c->seq, __ATOMIC_RELEASE);
    p->posted = 1;
  }
  for (int k = 0; k < n; k++)
    if (__atomic_load_n(&h->r[k].posted, __ATOMIC_ACQUIRE) < c->seq) return 0;
  return 1;
}

/* Under G.exec: whether rank o->rank's part of its collective may
 * complete (see the section's comment). */
static int nccl_ready(Op *o) {
  FakeCall *c = o->call;
  Part *p = &c->part[o->rank];
  if (p->aborted || c->done) return 1;
  if (!p->reached) {
    if (p->hang) return 0; /* its GPU never gets there */
    p->reached = 1;
  }
  Clique *cq = c->cq;
  int n = cq->n;
  for (int j = 0; j < n && !c->done; j++) /* the peers' streams, up to their parts */
    if (c->part[j].in && !c->part[j].reached && !c->part[j].aborted) run_queue(c->part[j].stream);
  if (c->done) return 1;
  for (int j = 0; j < n; j++)
    if (!c->part[j].reached && (!cq->span || cq->local[j])) return 0;
  if (cq->span && !span_exchange(c)) return 0;
  if (!G.sticky) call_run(c);
  if (cq->span) /* this process has read call c->seq from the slots */
    for (int j = 0; j < n; j++)
      if (cq->local[j]) __atomic_store_n(&cq->shm->r[j].done, c->seq, __ATOMIC_RELEASE);
  c->done = 1;
  return 1;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  pthread_mutex_lock(&G.exec);
  if (!live_comm(comm)) {
    pthread_mutex_unlock(&G.exec);
    return nccl_fail(ncclInvalidArgument, "ncclCommAbort: invalid communicator");
  }
  for (FakeCall *c = comm->cq->calls; c; c = c->next) /* its kernels stop waiting */
    c->part[comm->rank].aborted = 1;
  comm_remove(comm);
  pthread_cond_broadcast(&G.moved);
  pthread_mutex_unlock(&G.exec);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  pthread_mutex_lock(&G.exec);
  if (!live_comm(comm)) {
    pthread_mutex_unlock(&G.exec);
    return nccl_fail(ncclInvalidArgument, "ncclCommDestroy: invalid communicator");
  }
  for (FakeCall *c = comm->cq->calls; c; c = c->next) {
    const Part *p = &c->part[comm->rank];
    if (p->in && !p->popped && !c->done && !p->aborted) {
      pthread_mutex_unlock(&G.exec);
      return nccl_fail(ncclInvalidUsage, "ncclCommDestroy: rank %d's %s (call %llu) is still in flight, which NCCL "
                       "would wait for (ncclCommAbort ends it)", comm->rank, coll_name[p->kind], c->seq);
    }
  }
  for (FakeCall *c = comm->cq->calls; c; c = c->next) c->part[comm->rank].aborted = 1; /* done, not yet popped */
  comm_remove(comm);
  pthread_mutex_unlock(&G.exec);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
  pthread_mutex_lock(&G.exec);
  int ok = comm && err && live_comm(comm);
  if (ok) *err = comm->async;
  pthread_mutex_unlock(&G.exec);
  return ok ? ncclSuccess : nccl_fail(ncclInvalidArgument, "ncclCommGetAsyncError: invalid communicator");
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  pthread_mutex_lock(&G.exec);
  int ok = comm && count && live_comm(comm);
  if (ok) *count = comm->cq->n;
  pthread_mutex_unlock(&G.exec);
  return ok ? ncclSuccess : nccl_fail(ncclInvalidArgument, "ncclCommCount: invalid communicator");
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  pthread_mutex_lock(&G.exec);
  int ok = comm && device && live_comm(comm);
  if (ok) *device = comm->gpu;
  pthread_mutex_unlock(&G.exec);
  return ok ? ncclSuccess : nccl_fail(ncclInvalidArgument, "ncclCommCuDevice: invalid communicator");
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  pthread_mutex_lock(&G.exec);
  int ok = comm && rank && live_comm(comm);
  if (ok) *rank = comm->rank;
  pthread_mutex_unlock(&G.exec);
  return ok ? ncclSuccess : nccl_fail(ncclInvalidArgument, "ncclCommUserRank: invalid communicator");
}

static void nccl_done(Op *o) {
  FakeCall *c = o->call;
  c->part[o->rank].popped = 1;
  int all = 1;
  for (int j = 0; j < c->cq->n; j++) all &= c->part[j].popped || (!c->part[j].in && c->done);
  if (!all) return;
  Clique *cq = c->cq;
  for (FakeCall **p = &cq->calls; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  free(c);
  clique_release(cq);
}
#else
static int nccl_ready(Op *o) {
  (void)o;
  return 1;
}
static void nccl_done(Op *o) { (void)o; }
#endif

/* Under G.exec (run_queue). */
static int op_ready(Op *o) {
  if (o->kind == OP_NCCL) return nccl_ready(o);
  if (o->ev->completed >= o->gen) return 1; /* OP_WAIT */
  if (o->on) run_queue(o->on);
  return o->ev->completed >= o->gen;
}

static void op_done(Op *o) {
  if (o->kind == OP_NCCL) {
    nccl_done(o);
  } else if (o->kind == OP_RECORD || o->kind == OP_WAIT) {
    if (--o->ev->refs == 0 && o->ev->dead) free(o->ev);
  }
}
