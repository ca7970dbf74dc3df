#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep, pthread_rwlock */
/* runtime/cuda/nccl.c: the NCCL collective between the GPUs of the
 * replicas of a data-parallel run (runtime/collective.h's table), part of
 * the CUDA plugin.  NCCL is loaded with dlopen when a run asks for it
 * (duet_nccl_open, runtime/cuda/nccl_lib.c), so the plugin loads where
 * NCCL is absent.
 *
 * One communicator per stage: ncclCommInitAll over the GPUs of the
 * stage's replicas, in replica order (rank r = replica r).  Each GPU gets a
 * communication stream of its own.  A bucket's all-reduce starts at once,
 * on that stream, after the work queued so far on the device's compute
 * stream (an event recorded there, waited for by the communication
 * stream): one ncclAllReduce per gradient tensor, in place, summed, the
 * calls of a bucket in one ncclGroupStart/End (NCCL aggregates a group's
 * operations into one launch; the tensors stay where the memory planner
 * put them: no flattening copy into a bucket buffer, no extra memory),
 * then an event that marks its end.  The compute stream goes on with the
 * rest of the backward pass meanwhile.  The wait, before the optimizer,
 * polls that event (and ncclCommGetAsyncError) until `timeout` seconds
 * have passed, then calls ncclCommAbort on every communicator, so that
 * no rank hangs in a collective whose peer is gone; the optimizer's
 * kernels are queued only after the host has seen the event complete.
 *
 * Calls with host buffers (the losses and the fp16 overflow flags),
 * barriers and host broadcasts go to the host collective given at
 * creation (exact sums of a few numbers; no GPU round trip): shared
 * memory in one process, MPI across processes.
 *
 * Across the ranks of an MPI run (duet_cuda_plugin_nccl_rank, then
 * duet_cuda_plugin_nccl_connect) the collective holds one local rank: the
 * same code, with its ranks r0 .. r0 + L - 1 (L = 1) of R.  Rank 0 makes
 * an ncclUniqueId per stage, the runtime broadcasts them over MPI
 * (runtime/pipeline.c, nccl_ranks), and each rank joins the stage's
 * communicator with ncclCommInitRank on its GPU (NCCL takes the device
 * of the calling thread's current context).
 *
 * Summation order: NCCL's (its ring, or tree, and protocol choice): every
 * rank gets the same bytes, in an order that is not 0..R-1 in general.
 * With two ranks each element is one add, a + b = b + a exactly, so the
 * result equals the shared-memory collective's bit for bit.
 *
 * ZeRO stage 1 (runtime/collective.h's parts of whole buffers): the
 * reduce-scatter is the bucket's all-reduce (every rank receives every
 * sum, a superset of what it needs: the same bits as the run without
 * --zero, at twice a reduce-scatter's traffic; ncclReduceScatter needs
 * equal parts, and a tensor is one rank's), the all-gather one
 * ncclBroadcast per tensor from the rank that owns it, in one group. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../collective.h"
#include "cuda_plugin.h"
#include "duet_nccl.h"

#define EXPORT __attribute__((visibility("default")))

_Static_assert(DUET_COLL_NCCL_ID_BYTES == DUET_NCCL_UNIQUE_ID_BYTES, "runtime/collective.h's size of an NCCL unique id");

/* ------------------------------------------------------------ collective */

enum { IDLE = 0, ON_HOST = 1, ON_GPU = 2 };

typedef struct Rank {
  DuetDevice *d;
  int ordinal;
  CUcontext ctx;
  CUstream compute, comm; /* the device's stream; this collective's */
  void *nc;               /* ncclComm_t; NULL after an abort */
  CUevent ready;          /* recorded on the compute stream before each start */
  CUevent *done, *begin;  /* [n_tags + 1]: a start's end (and, profiling, its beginning) on the comm stream */
  double gpu_ms;          /* profiling: summed elapsed time of the collectives */
  double bytes;
  int64_t calls;
} Rank;

typedef struct Nccl {
  DuetNccl api;
  int R, S, n_tags;
  int L, r0;       /* the ranks in this process: r0 .. r0 + L - 1 (all R in one process; one per MPI rank) */
  int *tag_stage;  /* [n_tags] */
  int *state;      /* [L * (n_tags + 1)]: IDLE, ON_HOST, ON_GPU (tag n_tags: device broadcasts) */
  Rank *rk;        /* [s * L + r - r0] */
  DuetColl *host;
  bool host_borrowed; /* an MPI run's: the caller destroys it after this collective */
  double timeout;
  bool profile;
  pthread_rwlock_t lock; /* NCCL calls (read) against an abort (write) */
  bool lock_ok, aborted;
  char why[512];
} Nccl;

#define CU(call, what)                                                                                    \
  do {                                                                                                    \
    CUresult r_ = (call);                                                                                 \
    if (r_ != CUDA_SUCCESS) {                                                                             \
      const char *s_ = NULL;                                                                              \
      if (cuGetErrorString(r_, &s_) != CUDA_SUCCESS || !s_) s_ = "unknown CUDA error";                    \
      snprintf(err, errlen, "%s: %s failed: %s (CUresult %d)", what, #call, s_, (int)r_);               \
      goto fail;                                                                                          \
    }                                                                                                     \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int nccl_type(int dtype) {
  return dtype == DUET_F32 ? DUET_NCCL_FLOAT32 : dtype == DUET_F64 ? DUET_NCCL_FLOAT64
                                              : dtype == DUET_I32 ? DUET_NCCL_INT32 : -1;
}

static size_t dtype_size(int dtype) { return dtype == DUET_F64 ? 8 : 4; }

static void nc_abort(DuetColl *c, const char *why) {
  Nccl *x = c->ctx;
  pthread_rwlock_wrlock(&x->lock);
  if (!x->aborted) {
    x->aborted = true;
    snprintf(x->why, sizeof x->why, "%s", why);
    for (int k = 0; k < x->L * x->S; k++) {
      Rank *rk = &x->rk[k];
      if (!rk->nc) continue;
      cuCtxSetCurrent(rk->ctx);
      int r = x->api.comm_abort(rk->nc); /* ends the rank's collectives on its GPU */
      if (r != DUET_NCCL_SUCCESS) fprintf(stderr, "duet: warning: ncclCommAbort on cuda:%d returned %d\n", rk->ordinal, r);
      rk->nc = NULL;
    }
  }
  pthread_rwlock_unlock(&x->lock);
  x->host->ops->abort(x->host, why);
}

/* The rank's state of tag t (t == n_tags: device broadcasts). */
static int *state_of(Nccl *x, int rank, int t) {
  return &x->state[(size_t)(rank - x->r0) * (size_t)(x->n_tags + 1) + (size_t)t];
}

/* Rank `rank`'s (a rank of this process) view of stage s. */
static Rank *rank_of(Nccl *x, int s, int rank) { return &x->rk[s * x->L + rank - x->r0]; }

/* Whether `rank` is one of this process's ranks. */
static bool local_rank(const Nccl *x, int rank) { return rank >= x->r0 && rank < x->r0 + x->L; }

/* Queues rank `rank`'s part of an operation on the GPU buffers b of stage
 * s (root < 0: an all-reduce, else a broadcast from root) under slot t of
 * its events.  0, or -1 with a message. */
static int gpu_start(Nccl *x, int rank, int s, int t, int root, const int *roots, DuetDevice *dev, const DuetCollBuf *b,
                     int n, char *err, size_t errlen) {
  Rank *k = rank_of(x, s, rank);
  if (dev != k->d) {
    snprintf(err, errlen, "replica %d passes buffers of another device than its stage %d's", rank, s);
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (nccl_type(b[i].dtype) < 0 || b[i].n < 0) {
      snprintf(err, errlen, "buffer %d: %lld elements of dtype %d (f32, f64 and i32 are summed)", i, (long long)b[i].n,
               b[i].dtype);
      return -1;
    }
  pthread_rwlock_rdlock(&x->lock);
  if (x->aborted) {
    snprintf(err, errlen, "aborted: %s", x->why);
    goto fail;
  }
  CU(cuCtxSetCurrent(k->ctx), "NCCL");
  CU(cuEventRecord(k->ready, k->compute), "NCCL");
  CU(cuStreamWaitEvent(k->comm, k->ready, 0), "NCCL");
  if (x->profile) CU(cuEventRecord(k->begin[t], k->comm), "NCCL");
  int r = x->api.group_start(), bad = -1;
  double bytes = 0;
  for (int i = 0; i < n && r == DUET_NCCL_SUCCESS; i++) {
    bytes += (double)b[i].n * (double)dtype_size(b[i].dtype);
    int rt = roots ? roots[i] : root; /* roots: each buffer's (ZeRO's all-gather) */
    r = rt < 0 ? x->api.all_reduce(b[i].ptr, b[i].ptr, (size_t)b[i].n, nccl_type(b[i].dtype), DUET_NCCL_SUM, k->nc,
                                   k->comm)
               : x->api.broadcast(b[i].ptr, b[i].ptr, (size_t)b[i].n, nccl_type(b[i].dtype), rt, k->nc, k->comm);
    if (r != DUET_NCCL_SUCCESS) bad = i, root = rt;
  }
  int g = x->api.group_end(); /* always: a group is closed even after a failed call */
  if (r != DUET_NCCL_SUCCESS || g != DUET_NCCL_SUCCESS) {
    char m[600];
    duet_nccl_error(&x->api, k->nc, r != DUET_NCCL_SUCCESS ? r : g, m, sizeof m);
    if (bad >= 0)
      snprintf(err, errlen, "%s of buffer %d (%lld elements) on cuda:%d: %s", root < 0 ? "ncclAllReduce" : "ncclBroadcast",
               bad, (long long)b[bad].n, k->ordinal, m);
    else
      snprintf(err, errlen, "ncclGroupEnd on cuda:%d: %s", k->ordinal, m);
    goto fail;
  }
  CU(cuEventRecord(k->done[t], k->comm), "NCCL");
  k->bytes += bytes;
  pthread_rwlock_unlock(&x->lock);
  return 0;
fail:
  pthread_rwlock_unlock(&x->lock);
  return -1;
}

/* Waits for rank `rank`'s operation under slot t of stage s: polls its end
 * (and NCCL's asynchronous errors) for at most x->timeout seconds, then
 * aborts every communicator.  0, or -1 with a message. */
static int gpu_wait(DuetColl *c, int rank, int s, int t, char *err, size_t errlen) {
  Nccl *x = c->ctx;
  Rank *k = rank_of(x, s, rank);
  double deadline = now_s() + x->timeout;
  long nap = 20000; /* ns: doubled up to 1 ms */
  for (;;) {
    pthread_rwlock_rdlock(&x->lock);
    if (x->aborted) {
      snprintf(err, errlen, "aborted: %s", x->why);
      goto fail;
    }
    CU(cuCtxSetCurrent(k->ctx), "NCCL");
    CUresult q = cuEventQuery(k->done[t]);
    if (q == CUDA_SUCCESS) {
      if (x->profile) {
        float ms = 0;
        CU(cuEventElapsedTime(&ms, k->begin[t], k->done[t]), "NCCL");
        k->gpu_ms += ms;
        k->calls++;
      }
      pthread_rwlock_unlock(&x->lock);
      return 0;
    }
    if (q != CUDA_ERROR_NOT_READY) CU(q, "NCCL: the end of the collective");
    int ae = DUET_NCCL_SUCCESS;
    int r = x->api.comm_get_async_error(k->nc, &ae);
    if (r != DUET_NCCL_SUCCESS || (ae != DUET_NCCL_SUCCESS && ae != DUET_NCCL_IN_PROGRESS)) {
      char m[600];
      duet_nccl_error(&x->api, k->nc, r != DUET_NCCL_SUCCESS ? r : ae, m, sizeof m);
      snprintf(err, errlen, "NCCL on cuda:%d reports %s", k->ordinal, m);
      pthread_rwlock_unlock(&x->lock);
      nc_abort(c, err);
      return -1;
    }
    pthread_rwlock_unlock(&x->lock);
    if (now_s() > deadline) {
      char why[300];
      snprintf(why, sizeof why, "an NCCL collective of stage %d timed out on replica %d", s, rank);
      nc_abort(c, why);
      snprintf(err, errlen, "NCCL did not complete it within %.3g s; ncclCommAbort ended the communicators of every "
               "stage (raise DUET_PIPE_TIMEOUT if a replica is legitimately this slow)", x->timeout);
      return -1;
    }
    struct timespec ts = {0, nap};
    nanosleep(&ts, NULL);
    if (nap < 1000000) nap *= 2;
  }
fail:
  pthread_rwlock_unlock(&x->lock);
  return -1;
}

static int nc_allreduce_start(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n, char *err,
                              size_t errlen) {
  Nccl *x = c->ctx;
  if (!local_rank(x, rank) || tag < 0 || tag >= x->n_tags) {
    snprintf(err, errlen, "rank %d or tag %d out of range", rank, tag);
    return -1;
  }
  if (!dev) {
    *state_of(x, rank, tag) = ON_HOST;
    return x->host->ops->allreduce_start(x->host, rank, tag, NULL, b, n, err, errlen);
  }
  if (x->tag_stage[tag] < 0) {
    snprintf(err, errlen, "tag %d was made for host buffers", tag);
    return -1;
  }
  if (gpu_start(x, rank, x->tag_stage[tag], tag, -1, NULL, dev, b, n, err, errlen)) return -1;
  *state_of(x, rank, tag) = ON_GPU;
  return 0;
}

/* ZeRO: the parts split (R + 1 buffer indices) in order. */
static int parts_ok(const Nccl *x, const int *split, int n, char *err, size_t errlen) {
  bool ok = split && split[0] == 0 && split[x->R] == n;
  for (int k = 0; ok && k < x->R; k++) ok = split[k] <= split[k + 1];
  if (!ok) snprintf(err, errlen, "the parts of %d buffers among %d ranks are not in order", n, x->R);
  return ok ? 0 : -1;
}

/* ZeRO's reduce-scatter: the all-reduce (see the file's comment). */
static int nc_reduce_scatter_start(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                                   const int *split, char *err, size_t errlen) {
  Nccl *x = c->ctx;
  if (parts_ok(x, split, n, err, errlen)) return -1;
  if (!dev && local_rank(x, rank) && tag >= 0 && tag < x->n_tags) {
    *state_of(x, rank, tag) = ON_HOST;
    return x->host->ops->reduce_scatter_start(x->host, rank, tag, NULL, b, n, split, err, errlen);
  }
  return nc_allreduce_start(c, rank, tag, dev, b, n, err, errlen);
}

/* ZeRO's all-gather: one ncclBroadcast per buffer from the rank of its part. */
static int nc_all_gather_start(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                               const int *split, char *err, size_t errlen) {
  Nccl *x = c->ctx;
  if (!local_rank(x, rank) || tag < 0 || tag >= x->n_tags) {
    snprintf(err, errlen, "rank %d or tag %d out of range", rank, tag);
    return -1;
  }
  if (parts_ok(x, split, n, err, errlen)) return -1;
  if (!dev) {
    *state_of(x, rank, tag) = ON_HOST;
    return x->host->ops->all_gather_start(x->host, rank, tag, NULL, b, n, split, err, errlen);
  }
  if (x->tag_stage[tag] < 0) {
    snprintf(err, errlen, "tag %d was made for host buffers", tag);
    return -1;
  }
  int *roots = malloc(((size_t)n + 1) * sizeof *roots);
  if (!roots) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  for (int k = 0; k < x->R; k++)
    for (int i = split[k]; i < split[k + 1]; i++) roots[i] = k;
  int rc = gpu_start(x, rank, x->tag_stage[tag], tag, -1, roots, dev, b, n, err, errlen);
  free(roots);
  if (rc) return -1;
  *state_of(x, rank, tag) = ON_GPU;
  return 0;
}

static int nc_allreduce_wait(DuetColl *c, int rank, int tag, char *err, size_t errlen) {
  Nccl *x = c->ctx;
  if (!local_rank(x, rank) || tag < 0 || tag >= x->n_tags) {
    snprintf(err, errlen, "rank %d or tag %d out of range", rank, tag);
    return -1;
  }
  int *st = state_of(x, rank, tag), was = *st;
  *st = IDLE;
  if (was == ON_HOST) return x->host->ops->allreduce_wait(x->host, rank, tag, err, errlen);
  if (was != ON_GPU) {
    snprintf(err, errlen, "no all-reduce was started under tag %d", tag);
    return -1;
  }
  return gpu_wait(c, rank, x->tag_stage[tag], tag, err, errlen);
}

static int nc_broadcast(DuetColl *c, int rank, int root, DuetDevice *dev, const DuetCollBuf *b, int n, char *err,
                        size_t errlen) {
  Nccl *x = c->ctx;
  if (!local_rank(x, rank) || root < 0 || root >= x->R) {
    snprintf(err, errlen, "rank %d or root %d out of range", rank, root);
    return -1;
  }
  if (!dev) return x->host->ops->broadcast(x->host, rank, root, NULL, b, n, err, errlen);
  for (int s = 0; s < x->S; s++) /* the stage whose replica `rank` is on dev */
    if (rank_of(x, s, rank)->d == dev) {
      if (gpu_start(x, rank, s, x->n_tags, root, NULL, dev, b, n, err, errlen)) return -1;
      return gpu_wait(c, rank, s, x->n_tags, err, errlen);
    }
  snprintf(err, errlen, "replica %d has no stage on this device", rank);
  return -1;
}

static int nc_barrier(DuetColl *c, int rank, char *err, size_t errlen) {
  Nccl *x = c->ctx;
  return x->host->ops->barrier(x->host, rank, err, errlen);
}

static void nc_destroy(DuetColl *c) {
  if (!c) return;
  Nccl *x = c->ctx;
  if (x) {
    if (x->profile && x->rk)
      for (int s = 0; s < x->S; s++) {
        const Rank *k = &x->rk[s * x->L]; /* the first local replica's view of the stage */
        if (!k->calls) continue;
        double busbw = k->gpu_ms > 0 ? 2.0 * (x->R - 1) / x->R * k->bytes / (k->gpu_ms * 1e-3) / 1e9 : 0;
        fprintf(stderr, "duet: NCCL profile: stage %d: %lld collectives, %.2f MiB, %.3f ms on the communication "
                "stream of cuda:%d (bus bandwidth 2(R-1)/R x bytes / time = %.2f GB/s)\n", s, (long long)k->calls,
                k->bytes / 1048576.0, k->gpu_ms, k->ordinal, busbw);
      }
    for (int i = 0; x->rk && i < x->L * x->S; i++) {
      Rank *k = &x->rk[i];
      if (!k->ctx) continue;
      cuCtxSetCurrent(k->ctx);
      if (k->comm) cuStreamSynchronize(k->comm);
      if (k->nc) {
        int r = x->api.comm_destroy(k->nc);
        if (r != DUET_NCCL_SUCCESS) fprintf(stderr, "duet: warning: ncclCommDestroy on cuda:%d returned %d\n", k->ordinal, r);
      }
      for (int t = 0; t <= x->n_tags; t++) {
        if (k->done && k->done[t]) cuEventDestroy(k->done[t]);
        if (k->begin && k->begin[t]) cuEventDestroy(k->begin[t]);
      }
      if (k->ready) cuEventDestroy(k->ready);
      if (k->comm) cuStreamDestroy(k->comm);
      free(k->done);
      free(k->begin);
    }
    if (x->host && !x->host_borrowed) x->host->ops->destroy(x->host);
    duet_nccl_close(&x->api);
    if (x->lock_ok) pthread_rwlock_destroy(&x->lock);
    free(x->rk);
    free(x->tag_stage);
    free(x->state);
    free(x);
  }
  free(c);
}

static const DuetCollOps nccl_ops = {
    .name = "NCCL",
    .allreduce_start = nc_allreduce_start,
    .allreduce_wait = nc_allreduce_wait,
    .broadcast = nc_broadcast,
    .barrier = nc_barrier,
    .abort = nc_abort,
    .reduce_scatter_start = nc_reduce_scatter_start,
    .all_gather_start = nc_all_gather_start,
    .destroy = nc_destroy,
};

/* The rank's stream and events in its GPU's context.  0, or -1. */
static int rank_setup(Nccl *x, Rank *k, char *err, size_t errlen) {
  unsigned flags = x->profile ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING;
  if (!(k->done = calloc((size_t)x->n_tags + 1, sizeof *k->done)) ||
      !(k->begin = calloc((size_t)x->n_tags + 1, sizeof *k->begin))) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  CU(cuCtxSetCurrent(k->ctx), "NCCL");
  CU(cuStreamCreate(&k->comm, CU_STREAM_NON_BLOCKING), "NCCL");
  CU(cuEventCreate(&k->ready, CU_EVENT_DISABLE_TIMING), "NCCL");
  for (int t = 0; t <= x->n_tags; t++) {
    if (t < x->n_tags && x->tag_stage[t] < 0) continue; /* host tags */
    CU(cuEventCreate(&k->done[t], flags), "NCCL");
    if (x->profile) CU(cuEventCreate(&k->begin[t], CU_EVENT_DEFAULT), "NCCL");
  }
  return 0;
fail:
  return -1;
}

/* The part of a collective that needs no peer: its L local ranks r0 ..
 * r0 + L - 1 of R, on devs[s * L + r - r0] (distinct GPUs per stage among
 * the local ones), NCCL loaded and able to drive every local GPU, the
 * streams and events made; no communicator yet, no host collective.  NULL
 * with a message. */
static DuetColl *prepare(DuetDevice *const *devs, int R, int L, int r0, int S, const int *tag_stage, int n_tags,
                         double timeout, bool profile, char *err, size_t errlen) {
  if (R < 2 || L < 1 || r0 < 0 || r0 + L > R || S < 1 || n_tags < 0 || !(timeout > 0)) {
    snprintf(err, errlen, "an NCCL collective of %d ranks (%d here from %d), %d stages, %d tags, timeout %g s", R, L, r0,
             S, n_tags, timeout);
    return NULL;
  }
  DuetColl *c = calloc(1, sizeof *c);
  Nccl *x = calloc(1, sizeof *x);
  if (!c || !x) {
    free(c);
    free(x);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  c->ops = &nccl_ops;
  c->n_ranks = R;
  c->ctx = x;
  x->R = R, x->L = L, x->r0 = r0, x->S = S, x->n_tags = n_tags, x->timeout = timeout, x->profile = profile;
  if (pthread_rwlock_init(&x->lock, NULL)) {
    snprintf(err, errlen, "cannot create the NCCL collective's lock");
    goto fail;
  }
  x->lock_ok = true;
  if (!(x->rk = calloc((size_t)(L * S), sizeof *x->rk)) ||
      !(x->tag_stage = calloc((size_t)n_tags + 1, sizeof *x->tag_stage)) ||
      !(x->state = calloc((size_t)L * (size_t)(n_tags + 1), sizeof *x->state))) {
    snprintf(err, errlen, "out of host memory");
    goto fail;
  }
  for (int t = 0; t < n_tags; t++) {
    x->tag_stage[t] = tag_stage[t];
    if (tag_stage[t] < -1 || tag_stage[t] >= S) {
      snprintf(err, errlen, "tag %d on stage %d of %d", t, tag_stage[t], S);
      goto fail;
    }
  }
  /* the devices: this plugin's, one GPU per replica of each stage */
  for (int s = 0; s < S; s++)
    for (int r = r0; r < r0 + L; r++) {
      Rank *k = rank_of(x, s, r);
      k->d = devs[s * L + r - r0];
      CUcontext ctx;
      if (duet_cuda_handles(k->d, &k->ordinal, &ctx, &k->compute)) {
        snprintf(err, errlen, "replica %d's stage %d is not a CUDA device", r, s);
        goto fail;
      }
      for (int o = r0; o < r; o++)
        if (rank_of(x, s, o)->ordinal == k->ordinal) {
          snprintf(err, errlen, "replicas %d and %d of stage %d are both on cuda:%d, and NCCL allows one rank per GPU", o,
                   r, s, k->ordinal);
          goto fail;
        }
    }
  if (duet_nccl_open(&x->api, err, errlen)) goto fail;
  /* an NCCL built with CUDA 13 has no kernels for cards before sm_75 */
  int min_cc = duet_nccl_min_cc(x->api.cuda_major);
  for (int i = 0; i < L * S; i++) {
    Rank *k = &x->rk[i];
    int ma = 0, mi = 0;
    char name[256] = "";
    CUresult q = cuDeviceGetAttribute(&ma, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, (CUdevice)k->ordinal);
    if (q == CUDA_SUCCESS) q = cuDeviceGetAttribute(&mi, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, (CUdevice)k->ordinal);
    if (q == CUDA_SUCCESS) q = cuDeviceGetName(name, sizeof name, (CUdevice)k->ordinal);
    CU(q, "NCCL: the GPU's compute capability");
    if (10 * ma + mi < min_cc) {
      snprintf(err, errlen, "NCCL %d.%d.%d at %s was built with CUDA %d.%d, whose NCCL supports sm_%d and newer: it "
               "cannot drive cuda:%d %s (sm_%d%d); install an NCCL built with CUDA 12 (pip's nvidia-nccl-cu12, or "
               "libnccl2 for CUDA 12.x) and point DUET_NCCL_LIBRARY at its libnccl.so.2", x->api.major, x->api.minor,
               x->api.patch, x->api.path, x->api.cuda_major, x->api.cuda_minor, min_cc, k->ordinal, name, ma, mi);
      goto fail;
    }
  }
  /* streams and events in each GPU's context */
  for (int i = 0; i < L * S; i++) {
    Rank *k = &x->rk[i];
    int ord;
    CUstream cs;
    duet_cuda_handles(k->d, &ord, &k->ctx, &cs);
    if (rank_setup(x, k, err, errlen)) goto fail;
  }
  return c;
fail:
  nc_destroy(c);
  return NULL;
}

/* The start-up line's description of the collective c. */
static void describe(const Nccl *x, char *desc, size_t desclen) {
  char build[64] = "";
  const char *base = strrchr(x->api.path, '/');
  if (x->api.cuda_major) snprintf(build, sizeof build, ", built with CUDA %d.%d", x->api.cuda_major, x->api.cuda_minor);
  /* the file, and the name asked for when the file is called otherwise (a link) */
  bool same = !strcmp(base ? base + 1 : x->api.path, strrchr(x->api.name, '/') ? strrchr(x->api.name, '/') + 1 : x->api.name);
  snprintf(desc, desclen, "NCCL %d.%d.%d (%s%s%s%s) in its own order (ring or tree), on a communication stream per GPU",
           x->api.major, x->api.minor, x->api.patch, same ? "" : x->api.name, same ? "" : " = ", x->api.path, build);
}

/* duet_coll_nccl_new (runtime/collective.h): every replica in this
 * process, ncclCommInitAll per stage; host owned on success. */
EXPORT DuetColl *duet_cuda_plugin_nccl(DuetDevice *const *devs, int R, int S, const int *tag_stage, int n_tags,
                                       double timeout, bool profile, DuetColl *host, char *desc, size_t desclen,
                                       char *err, size_t errlen) {
  if (!host) {
    snprintf(err, errlen, "an NCCL collective needs a host collective");
    return NULL;
  }
  DuetColl *c = prepare(devs, R, R, 0, S, tag_stage, n_tags, timeout, profile, err, errlen);
  if (!c) return NULL;
  Nccl *x = c->ctx;
  /* one communicator per stage over its replicas' GPUs */
  for (int s = 0; s < S; s++) {
    int devlist[64];
    void *comms[64];
    if (R > 64) {
      snprintf(err, errlen, "%d replicas: at most 64 per NCCL communicator here", R);
      goto fail;
    }
    for (int r = 0; r < R; r++) devlist[r] = x->rk[s * R + r].ordinal;
    int r = x->api.comm_init_all(comms, R, devlist);
    if (r != DUET_NCCL_SUCCESS) {
      char m[600], gpus[300];
      size_t len = 0;
      gpus[0] = 0;
      for (int i = 0; i < R && len < sizeof gpus; i++)
        len += (size_t)snprintf(gpus + len, sizeof gpus - len, "%scuda:%d", i ? "," : "", devlist[i]);
      duet_nccl_error(&x->api, NULL, r, m, sizeof m);
      snprintf(err, errlen, "ncclCommInitAll over %s (stage %d) with NCCL %d.%d.%d (%s) failed: %s", gpus, s,
               x->api.major, x->api.minor, x->api.patch, x->api.path, m);
      goto fail;
    }
    for (int i = 0; i < R; i++) x->rk[s * R + i].nc = comms[i];
  }
  x->host = host; /* owned from here on */
  describe(x, desc, desclen);
  return c;
fail:
  nc_destroy(c); /* host is still the caller's */
  return NULL;
}

/* duet_coll_nccl_rank_new (runtime/collective.h): this process's one
 * rank of R on its S stage devices devs[0 .. S-1]; rank 0 fills ids with
 * S unique ids.  Not connected: duet_cuda_plugin_nccl_connect joins. */
EXPORT DuetColl *duet_cuda_plugin_nccl_rank(DuetDevice *const *devs, int R, int rank, int S, const int *tag_stage,
                                            int n_tags, double timeout, bool profile, void *ids, char *desc,
                                            size_t desclen, char *err, size_t errlen) {
  DuetColl *c = prepare(devs, R, 1, rank, S, tag_stage, n_tags, timeout, profile, err, errlen);
  if (!c) return NULL;
  Nccl *x = c->ctx;
  if (rank == 0)
    for (int s = 0; s < S; s++) {
      DuetNcclUniqueId id;
      int r = x->api.get_unique_id(&id);
      if (r != DUET_NCCL_SUCCESS) {
        char m[600];
        duet_nccl_error(&x->api, NULL, r, m, sizeof m);
        snprintf(err, errlen, "ncclGetUniqueId with NCCL %d.%d.%d (%s) failed: %s", x->api.major, x->api.minor,
                 x->api.patch, x->api.path, m);
        nc_destroy(c);
        return NULL;
      }
      memcpy((char *)ids + (size_t)s * DUET_NCCL_UNIQUE_ID_BYTES, id.internal, DUET_NCCL_UNIQUE_ID_BYTES);
    }
  describe(x, desc, desclen);
  return c;
}

/* duet_coll_nccl_connect (runtime/collective.h): ncclCommInitRank per
 * stage with ids (rank 0's, broadcast), host borrowed from then on.  0, or
 * -1 with a message (c keeps the communicators made so far: destroy it). */
EXPORT int duet_cuda_plugin_nccl_connect(DuetColl *c, const void *ids, DuetColl *host, char *err, size_t errlen) {
  Nccl *x = c->ctx;
  if (c->ops != &nccl_ops || x->L != 1 || x->host || !host) {
    snprintf(err, errlen, "not an unconnected NCCL collective of one rank, or no host collective");
    return -1;
  }
  for (int s = 0; s < x->S; s++) {
    Rank *k = &x->rk[s];
    DuetNcclUniqueId id;
    memcpy(id.internal, (const char *)ids + (size_t)s * DUET_NCCL_UNIQUE_ID_BYTES, DUET_NCCL_UNIQUE_ID_BYTES);
    CU(cuCtxSetCurrent(k->ctx), "NCCL"); /* NCCL takes the calling thread's device */
    int r = x->api.comm_init_rank(&k->nc, x->R, id, x->r0);
    if (r != DUET_NCCL_SUCCESS) {
      char m[600];
      k->nc = NULL;
      duet_nccl_error(&x->api, NULL, r, m, sizeof m);
      snprintf(err, errlen, "ncclCommInitRank (rank %d of %d, stage %d, cuda:%d) with NCCL %d.%d.%d (%s) failed: %s",
               x->r0, x->R, s, k->ordinal, x->api.major, x->api.minor, x->api.patch, x->api.path, m);
      return -1;
    }
  }
  x->host = host; /* borrowed: the caller's to destroy after c */
  x->host_borrowed = true;
  return 0;
fail:
  return -1;
}
