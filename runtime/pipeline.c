#define _POSIX_C_SOURCE 200809L /* clock_gettime, pthread_cond_timedwait */
/* runtime/pipeline.c: the micro-batch pipeline.  One worker thread per
 * stage (device) runs the stage's forward and backward schedules over the
 * micro-batches (GPipe or 1F1B).  A transfer has a staging buffer of its own
 * per micro-batch: the sender copies the tensor into it and posts it, the
 * receiver waits for the post (with a timeout) and copies it into its
 * arena.  Where the two devices can copy directly (the ops table's
 * peer_path: two virtual CPU devices, one GPU acting as two, two GPUs with
 * peer access) the buffer lives on the receiving device and both copies are
 * copy_peer; otherwise (a CPU and a GPU, GPUs without peer access, or
 * DUET_PIPE_STAGING=host) it is host memory, page-locked where a device
 * offers host_alloc, filled by copy_to_host and read by copy_to_device.
 * Either way a transfer is a byte copy.  Inputs, the loss and the metrics
 * also move through the device's copies; gradients are summed on the host
 * (in place for the CPU device, whose memory is host memory; a device with
 * memory of its own copies each micro-batch's gradients out).  Gradients
 * are summed into accumulators in micro-batch order on every stage, so a
 * run on S devices performs exactly the arithmetic of the run on one device
 * with the same micro-batches.  fp16 loss scaling: each stage ORs its
 * unscale kernels' overflow flags over the micro-batches; the session runs
 * a step in two jobs (DUET_PIPE_GRADS, then DUET_PIPE_STEP unless the
 * scaler skips it), so every stage takes or skips the same update.
 *
 * Data parallelism (DuetProgram.replicas R > 1): R copies of the stages,
 * R x S workers, each replica on its own devices with its own params,
 * optimizer state, accumulators, activation slots and transfer staging;
 * the host staging buffers hold the global batch of R x M micro-batches,
 * of which replica r computes r*M .. r*M+M-1 (M local micro-batches).  At
 * a bucket's DUET_STEP_ALLREDUCE on its last local micro-batch a replica
 * sums the bucket's gradients over its micro-batches (so they are final)
 * and posts them to the collective (runtime/collective.h), which sums the
 * replicas' sums (make_collective chooses it: NCCL between distinct GPUs,
 * else shared memory in replica order, on the devices where they copy
 * directly); before its optimizer update each stage
 * waits for its buckets, then ORs its overflow flags over the replicas and
 * the loss stage gathers every replica's losses (both through the
 * collective: sums of flags, and of loss vectors that are zero but for the
 * replica's own micro-batches, which is exact).  Every replica thus
 * applies the same update to the same bytes.  Evaluation runs replica 0
 * alone over all R x M micro-batches (the replicas' params are identical).
 *
 * Across processes (an MPI run, runtime/dist.h) each rank holds one of the
 * R replicas: the pipe has L = 1 local replica, replica r0 = the rank, on
 * its own S devices, and the collective is MPI's
 * (runtime/collective_mpi.c), whose sums are the shared-memory
 * collective's bit for bit.  Arrays of workers, transfers and staging are
 * per local replica; micro-batch numbers, loss rows and collective ranks
 * are global.  Between the steps of a backward pass with buckets in flight
 * the stage calls the collective's progress, so MPI moves them on while
 * the rest of the backward pass runs.
 *
 * ZeRO stage 1 (DuetProgram.zero): the state region of replica r's
 * stage holds only the state tensors of shard r (the memory plan puts
 * them together: the region allocated is their span, st->state_lo its
 * first byte); its optimizer schedule runs only the kernels of shard r
 * (st->opt: the program's stage schedule filtered); a bucket's step in
 * the backward pass starts a reduce-scatter (each replica receives the
 * sums of its shard's gradients, added in replica order as the
 * all-reduce's: the same bits), and DUET_STEP_ALLGATHER in the optimizer
 * schedule an all-gather of the bucket's params, waited for at the end of
 * the schedule.  A sharded state tensor is read through its owner
 * (duet_pipe_read_state: across MPI ranks a broadcast from it, which every
 * rank joins in the same order: duet_pipe_serve_states).
 *
 * Environment (documented in docs/commands.md):
 *   DUET_PIPE_TIMEOUT=SECONDS   how long a stage waits for a transfer (120)
 *   DUET_PIPE_STAGING=auto|host host: every transfer staged through host
 *                               memory, even between devices that can copy
 *                               directly (auto, the default: direct where
 *                               possible)
 *   DUET_PIPE_SUMS=auto|host    host: gradients summed over the micro-batches
 *                               on the host (copied out of each device)
 *                               instead of on the device (auto, the default:
 *                               the device's accumulate op where it has one)
 *   DUET_PROFILE=1              at exit: each stage's computing and waiting
 *                               time per step
 *   DUET_PIPE_DROP_SEND=T:M     test injection: transfer T is never posted
 *                               for micro-batch M (exercises the timeout;
 *                               every other wait then gets 100x the timeout,
 *                               so the error names this wait) */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "collective.h"
#include "dist.h"
#include "pipeline.h"

void openblas_set_num_threads(int n);

typedef struct Stage {
  struct DuetPipe *q;
  int id;          /* the stage (0 .. S-1) */
  int rep;         /* the replica (0 .. R-1) */
  int lr;          /* its index among this process's replicas (0 .. L-1) */
  int in_flight;   /* buckets posted to the collective and not yet waited for */
  char who[40];    /* "stage 1", or "replica 1, stage 0", for messages */
  DuetDevice *dev;
  void *region[DUET_MEM_COUNT]; /* DUET_MEM_ARENA: n_slots activation regions */
  int64_t allocated; /* bytes of the regions and the device's gradient accumulators (duet_pipe_allocated) */
  int n_slots;
  void ***tab;     /* tab[slot][tensor id]: addresses (NULL: another stage's) */
  void *acc;       /* gradient accumulators: device memory (dev_acc), else host memory */
  void *tmp;       /* host sums, !host_mem: one gradient copied to the host */
  bool host_mem;   /* the device's memory is host memory (the CPU device) */
  bool dev_acc;    /* the device sums (ops->accumulate): the gradients stay on it */
  int64_t *acc_off; /* tensor id -> offset in acc, -1 */
  int32_t *overflow; /* device memory: the unscale kernels' flags (fp16 loss scaling), t[n_tensors] */
  int32_t *flags;    /* host: the flags OR-ed over this step's micro-batches */
  int32_t *flags_mb; /* host: one micro-batch's flags */
  int threads;
  double busy, wait; /* DUET_PROFILE: seconds computing and waiting, all runs */
  pthread_t thread;
  bool started;
  int64_t seen;    /* last job run */
  bool tied_pass;  /* run_steps runs only the optimizer schedule's tied-gradient steps (DuetStep b = 2) */
  int *buckets, n_buckets; /* data parallelism: this stage's buckets, in order */
  DuetCollBuf *cbuf;       /* a bucket's buffers, for the collective */
  int64_t state_lo;        /* ZeRO: the first byte of the state region this replica holds */
  DuetStep *opt;           /* ZeRO: the optimizer steps this replica runs (else the program's) */
  int n_opt;
  int *gathers, n_gathers; /* ZeRO: the all-gathers started in this optimizer step */
  DuetOffload *off;        /* --offload optimizer: the host's state, master params and update */
} Stage;

/* The staging of one transfer: M buffers of `stride` bytes in one block. */
typedef struct Xfer {
  int path;           /* DUET_PEER_* of its pair of stages; DUET_PEER_NONE: staged through host memory */
  char *block;
  size_t stride;
  DuetDevice *owner;  /* the device whose alloc (direct path) or host_alloc made block; NULL: calloc */
} Xfer;

struct DuetPipe {
  const DuetProgram *p;
  int S, M, schedule; /* M: micro-batches per replica */
  int R, Mt;          /* replicas; micro-batches of the global batch, R x M */
  int L, r0;          /* replicas in this process, and the first one's number (an MPI rank holds one) */
  DuetDist *dist;     /* an MPI run: the ranks; NULL: every replica is in this process */
  int phase;         /* the job's part of a training step: DUET_RUN_TRAIN (all), DUET_PIPE_GRADS, DUET_PIPE_STEP */
  Stage *st;         /* [local replica * S + stage] */
  Xfer *xfer;        /* [local replica * n_transfers + transfer] */
  bool force_host;   /* DUET_PIPE_STAGING=host */
  bool host_sums;    /* DUET_PIPE_SUMS=host */
  char paths[1024];  /* "stage 0 -> 1 copied between arenas (CPU), ..." */
  int64_t *posted;   /* [(local replica * n_transfers + transfer) * M + m]: job number that posted it */
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* posts, aborts */
  pthread_cond_t job_cv;  /* a new job, or quit */
  pthread_cond_t done_cv;
  bool sync_ok;
  int64_t job;
  int n_done;
  bool quit, abort;
  char err[700];
  double s[DUET_S_COUNT];
  double timeout;
  int drop_t, drop_m;     /* DUET_PIPE_DROP_SEND, -1: none */
  void *host_x, *host_y, *host_loss, *host_metrics;
  double *losses;         /* [replica * Mt + global micro-batch]: a replica's row holds its own micro-batches'
                           * losses (zeros elsewhere) until the collective sums the rows */
  bool profile;           /* DUET_PROFILE=1: per-stage busy and waiting time */
  int64_t runs;
  DuetColl *coll;         /* R > 1: the collective between the replicas */
  DuetColl *coll_host;    /* NCCL across MPI ranks: the MPI collective coll uses (destroyed after it) */
  int *bucket_of;         /* tensor id -> bucket, -1 */
  int drop_bucket;        /* DUET_DP_DROP (tests): this bucket is never all-reduced; -1: none */
  int64_t asym_steps;     /* steps whose overflow some replicas saw and others did not */
  int collective;         /* DUET_DP_COLLECTIVE: DUET_COLL_* */
  char coll_desc[1200];   /* duet_pipe_collective */
  int *split;             /* ZeRO: [bucket * (R + 1) + k]: bucket's first gradient of shard k */
  bool clip_on;           /* --clip-grad-norm: DUET_PIPE_GRADS measures the gradients (duet_pipe_set_clip) */
  double clip_coef;       /* DUET_PIPE_STEP: below 1, the gradients are scaled by it before the update */
  double *clip_part;      /* [local replica * n_clip + j]: sum of squares of gradient j after DUET_PIPE_GRADS */
  bool offload;           /* --offload optimizer: every stage's update runs on the host (runtime/offload.c) */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t numel(const DuetTensor *t) { return t->nbytes / (t->dtype == DUET_F64 ? 8 : 4); }

/* The transfer tr of local replica r. */
static Xfer *xf(const DuetPipe *q, int r, int tr) { return &q->xfer[(size_t)r * (size_t)q->p->n_transfers + (size_t)tr]; }
/* The staging buffer of transfer tr of local replica r for micro-batch k. */
static void *xbuf(const DuetPipe *q, int r, int tr, int k) { return xf(q, r, tr)->block + (size_t)k * xf(q, r, tr)->stride; }
/* Where local replica r posts transfer tr of micro-batch k. */
static int64_t *posted_at(const DuetPipe *q, int r, int tr, int k) {
  return &q->posted[((size_t)r * (size_t)q->p->n_transfers + (size_t)tr) * (size_t)q->M + (size_t)k];
}

/* First error wins; every waiting stage is woken to give up, the other
 * replicas' collectives too. */
static void pipe_fail(DuetPipe *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pipe_fail(DuetPipe *q, const char *fmt, ...) {
  pthread_mutex_lock(&q->mu);
  bool first = !q->abort;
  if (first) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->err, sizeof q->err, fmt, ap);
    va_end(ap);
    q->abort = true;
  }
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  if (first && q->coll) q->coll->ops->abort(q->coll, "another replica failed");
}

static bool aborted(DuetPipe *q) {
  pthread_mutex_lock(&q->mu);
  bool a = q->abort;
  pthread_mutex_unlock(&q->mu);
  return a;
}

static int bucket_post(Stage *st, int b, int m, int slot);
static int gather_post(Stage *st, int b);

/* Runs one schedule of stage st on (local) micro-batch m in activation slot
 * `slot`.  train: transfers are posted and awaited, buckets posted on the
 * last micro-batch; eval: stages run in order on one thread, so a receive
 * finds its data staged.  0, or -1 after pipe_fail. */
static int run_steps(Stage *st, const DuetStep *steps, int n, int m, int slot, const double *s, bool train) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  void **t = st->tab[slot];
  DuetDevice *d = st->dev;
  int r = st->lr, gm = st->rep * q->M + m; /* the micro-batch's place in the global batch */
  for (int i = 0; i < n; i++) {
    const DuetStep *x = &steps[i];
    int rc = 0;
    bool tied = (x->kind == DUET_STEP_KERNEL || x->kind == DUET_STEP_SEND || x->kind == DUET_STEP_RECV) && x->b == 2;
    if (tied != st->tied_pass) continue; /* a tied weight's gradient: its own pass (stage_grads) */
    if (x->kind == DUET_STEP_ALLREDUCE) {
      if (train && m == q->M - 1 && bucket_post(st, x->a, m, slot)) return -1;
      continue;
    }
    if (x->kind == DUET_STEP_ALLGATHER) {
      if (train && gather_post(st, x->a)) return -1;
      continue;
    }
    if ((x->kind == DUET_STEP_SEND || x->kind == DUET_STEP_RECV) && x->b && train && m > 0)
      continue; /* a param, sent once per step: the receiver's copy persists (DUET_MEM_CACHE) */
    if (x->kind == DUET_STEP_SEND) {
      const DuetTransfer *tr = &p->transfers[x->a];
      int k = train ? m : 0;
      void *buf = xbuf(q, r, x->a, k);
      size_t nb = (size_t)tr->nbytes;
      if (xf(q, r, x->a)->path != DUET_PEER_NONE
              ? d->ops->copy_peer(d, buf, q->st[r * q->S + tr->to].dev, t[tr->src], nb)
              : d->ops->copy_to_host(d, buf, t[tr->src], nb)) {
        pipe_fail(q, "%s, micro-batch %d: sending %s: %s", st->who, gm, p->tensors[tr->src].name, d->err);
        return -1;
      }
      if (train && !(x->a == q->drop_t && gm == q->drop_m)) {
        pthread_mutex_lock(&q->mu);
        *posted_at(q, r, x->a, k) = q->job;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
      }
      continue;
    }
    if (x->kind == DUET_STEP_RECV) {
      const DuetTransfer *tr = &p->transfers[x->a];
      int k = train ? m : 0;
      if (train) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        /* with a dropped send injected, only the wait for it has the short
         * timeout, so the failure reported is always that one */
        double to = q->drop_t >= 0 && !(x->a == q->drop_t && gm == q->drop_m) ? 100 * q->timeout : q->timeout;
        double secs = floor(to), frac = to - secs;
        dl.tv_sec += (time_t)secs;
        dl.tv_nsec += (long)(frac * 1e9);
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        double t0 = q->profile ? now_s() : 0;
        pthread_mutex_lock(&q->mu);
        int w = 0;
        int64_t *post = posted_at(q, r, x->a, k);
        while (*post != q->job && !q->abort && w != ETIMEDOUT) w = pthread_cond_timedwait(&q->cv, &q->mu, &dl);
        bool ok = *post == q->job, ab = q->abort;
        pthread_mutex_unlock(&q->mu);
        if (q->profile) st->wait += now_s() - t0;
        if (!ok) {
          if (!ab)
            pipe_fail(q, "%s timed out after %.3g s waiting for micro-batch %d of tensor %s (transfer %d from "
                      "stage %d); raise DUET_PIPE_TIMEOUT if a stage is legitimately this slow", st->who, q->timeout, gm,
                      p->tensors[tr->src].name, x->a, tr->from);
          return -1;
        }
      }
      void *buf = xbuf(q, r, x->a, k);
      size_t nb = (size_t)tr->nbytes;
      if (xf(q, r, x->a)->path != DUET_PEER_NONE ? d->ops->copy_peer(d, t[tr->dst], d, buf, nb)
                                                 : d->ops->copy_to_device(d, t[tr->dst], buf, nb)) {
        pipe_fail(q, "%s, micro-batch %d: receiving %s: %s", st->who, gm, p->tensors[tr->src].name, d->err);
        return -1;
      }
      continue;
    }
    rc = x->kind == DUET_STEP_GEMM ? d->ops->gemm(d, x, t) : d->ops->launch(d, x->kernel, t, s);
    if (rc) {
      pipe_fail(q, "%s, micro-batch %d, step %d: %s", st->who, gm, i, d->err);
      return -1;
    }
    if (st->in_flight && q->coll->ops->progress) { /* MPI moves the buckets on only inside its calls */
      char err[600];
      if (q->coll->ops->progress(q->coll, st->rep, err, sizeof err)) {
        pipe_fail(q, "%s: all-reduce: %s", st->who, err);
        return -1;
      }
    }
  }
  return 0;
}

/* Micro-batch gm of the global batch, of the data inputs this stage owns,
 * from the host staging buffers into activation slot `slot`.  0, or -1
 * after pipe_fail. */
static int copy_inputs(Stage *st, int gm, int slot) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  int ids[2] = {p->input_x, p->input_y};
  void *host[2] = {q->host_x, q->host_y};
  for (int k = 0; k < 2; k++) {
    if (ids[k] < 0 || p->tensors[ids[k]].stage != st->id) continue;
    size_t b = (size_t)p->tensors[ids[k]].nbytes;
    if (st->dev->ops->copy_to_device(st->dev, st->tab[slot][ids[k]], (char *)host[k] + (size_t)gm * b, b)) {
      pipe_fail(q, "%s, micro-batch %d: copying input %s: %s", st->who, gm, p->tensors[ids[k]].name, st->dev->err);
      return -1;
    }
  }
  return 0;
}

/* Element k of a (small) tensor of stage st as a double, through the
 * device's copy_to_host; NAN after pipe_fail. */
static double fetch_elem(Stage *st, const DuetTensor *t, const void *mem, int k) {
  double d = 0;
  float f = 0;
  size_t sz = t->dtype == DUET_F64 ? sizeof d : sizeof f;
  if (st->dev->ops->copy_to_host(st->dev, t->dtype == DUET_F64 ? (void *)&d : (void *)&f, (const char *)mem + k * sz,
                                 sz)) {
    pipe_fail(st->q, "%s: reading %s: %s", st->who, t->name, st->dev->err);
    return NAN;
  }
  return t->dtype == DUET_F64 ? d : (double)f;
}

static void write_elem(const DuetTensor *t, void *mem, int k, double x) {
  if (t->dtype == DUET_F64) ((double *)mem)[k] = x;
  else ((float *)mem)[k] = (float)x;
}

/* Dropout masks differ per micro-batch: the step's seed mixed with gm (the
 * micro-batch's place in the global batch: the same masks on any number of
 * replicas). */
static void micro_scalars(const DuetPipe *q, int gm, double *s) {
  memcpy(s, q->s, sizeof q->s);
  uint64_t base = (uint64_t)q->s[DUET_S_DROP_SEED];
  s[DUET_S_DROP_SEED] = (double)((base ^ (((uint64_t)gm * 0x9E3779B97F4A7C15ull) >> 12)) & ((1ull << 52) - 1));
}

static int forward(Stage *st, int m) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  const DuetStage *ps = &p->stages[st->id];
  int slot = m % st->n_slots, gm = st->rep * q->M + m;
  double s[DUET_S_COUNT];
  micro_scalars(q, gm, s);
  if (copy_inputs(st, gm, slot) || run_steps(st, ps->fwd, ps->n_fwd, m, slot, s, true)) return -1;
  if (p->loss >= 0 && p->tensors[p->loss].stage == st->id)
    q->losses[(size_t)st->rep * (size_t)q->Mt + (size_t)gm] = fetch_elem(st, &p->tensors[p->loss], st->tab[slot][p->loss], 0);
  return 0;
}

/* Gradient tensor i of (local) micro-batch m, in slot `slot`, added to its
 * accumulator (m = 0 copies): the same order on every stage, device and
 * replica count.  0, or -1 after pipe_fail. */
static int sum_grad(Stage *st, int i, int m, int slot) {
  DuetPipe *q = st->q;
  const DuetTensor *t = &q->p->tensors[i];
  void *acc = (char *)st->acc + st->acc_off[i];
  const void *g = st->tab[slot][i];
  int64_t n = numel(t);
  int gm = st->rep * q->M + m;
  if (st->dev_acc) {
    if (st->dev->ops->accumulate(st->dev, acc, g, n, t->dtype, m == 0)) {
      pipe_fail(q, "%s, micro-batch %d: summing gradient %s: %s", st->who, gm, t->name, st->dev->err);
      return -1;
    }
    return 0;
  }
  if (!st->host_mem) { /* a device of its own memory: sum on the host */
    if (st->dev->ops->copy_to_host(st->dev, m == 0 ? acc : st->tmp, g, (size_t)t->nbytes)) {
      pipe_fail(q, "%s, micro-batch %d: reading gradient %s: %s", st->who, gm, t->name, st->dev->err);
      return -1;
    }
    g = st->tmp;
    if (m == 0) return 0;
  }
  duet_host_accumulate(acc, g, n, t->dtype == DUET_F64 ? DUET_F64 : DUET_F32, m == 0);
  return 0;
}

/* The summed gradient i written to the stage's gradient tensor (in slot 0,
 * where the optimizer reads it).  0, or -1 after pipe_fail. */
static int final_grad(Stage *st, int i) {
  const DuetTensor *t = &st->q->p->tensors[i];
  const void *acc = (char *)st->acc + st->acc_off[i];
  if (st->dev_acc ? st->dev->ops->accumulate(st->dev, st->tab[0][i], acc, numel(t), t->dtype, 1)
                  : st->dev->ops->copy_to_device(st->dev, st->tab[0][i], acc, (size_t)t->nbytes)) {
    pipe_fail(st->q, "%s: writing gradient %s: %s", st->who, t->name, st->dev->err);
    return -1;
  }
  return 0;
}

/* Data parallelism, at bucket b's step in the backward pass of the last
 * local micro-batch m: the bucket's gradients summed over the replica's
 * micro-batches (with one micro-batch per replica they are final where
 * they are: slot 0), then the bucket posted to the collective.  0, or -1
 * after pipe_fail. */
static int bucket_post(Stage *st, int b, int m, int slot) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  int n = 0;
  for (int j = p->bucket_off[b]; j < p->bucket_off[b + 1]; j++) {
    int i = p->bucket_tensors[j];
    if (st->acc_off[i] >= 0 && (sum_grad(st, i, m, slot) || final_grad(st, i))) return -1;
    st->cbuf[n++] = (DuetCollBuf){.ptr = st->tab[0][i], .n = numel(&p->tensors[i]), .dtype = p->tensors[i].dtype};
  }
  if (b == q->drop_bucket) return 0;
  char err[600];
  DuetDevice *dev = st->host_mem ? NULL : st->dev;
  if (p->zero ? q->coll->ops->reduce_scatter_start(q->coll, st->rep, b, dev, st->cbuf, n,
                                                   q->split + (size_t)b * (size_t)(q->R + 1), err, sizeof err)
              : q->coll->ops->allreduce_start(q->coll, st->rep, b, dev, st->cbuf, n, err, sizeof err)) {
    pipe_fail(q, "%s: %s of bucket %d: %s", st->who, p->zero ? "reduce-scatter" : "all-reduce", b, err);
    return -1;
  }
  st->in_flight++;
  return 0;
}

/* ZeRO, at bucket b's DUET_STEP_ALLGATHER in the optimizer schedule: the
 * bucket's params (this replica's shard updated) posted to the all-gather.
 * 0, or -1 after pipe_fail. */
static int gather_post(Stage *st, int b) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  int n = 0;
  for (int j = p->bucket_off[b]; j < p->bucket_off[b + 1]; j++) {
    int i = p->bucket_params[j];
    st->cbuf[n++] = (DuetCollBuf){.ptr = st->tab[0][i], .n = numel(&p->tensors[i]), .dtype = p->tensors[i].dtype};
  }
  if (b == q->drop_bucket) return 0;
  char err[600];
  if (q->coll->ops->all_gather_start(q->coll, st->rep, b, st->host_mem ? NULL : st->dev, st->cbuf, n,
                                     q->split + (size_t)b * (size_t)(q->R + 1), err, sizeof err)) {
    pipe_fail(q, "%s: all-gather of bucket %d: %s", st->who, b, err);
    return -1;
  }
  st->gathers[st->n_gathers++] = b;
  return 0;
}

/* ZeRO, after the optimizer schedule: waits for its all-gathers.  0, or -1
 * after pipe_fail. */
static int gathers_wait(Stage *st) {
  DuetPipe *q = st->q;
  char err[600];
  for (int k = 0; k < st->n_gathers; k++) {
    int b = st->gathers[k];
    double t0 = q->profile ? now_s() : 0;
    int rc = q->coll->ops->allreduce_wait(q->coll, st->rep, b, err, sizeof err);
    if (q->profile) st->wait += now_s() - t0;
    if (rc) {
      st->n_gathers = 0;
      pipe_fail(q, "%s: all-gather of bucket %d: %s", st->who, b, err);
      return -1;
    }
  }
  st->n_gathers = 0;
  return 0;
}

/* Backward of micro-batch m, then its gradients added to the accumulators
 * (m = 0 copies): the same order on every stage and device count.  With
 * replicas, the last micro-batch's gradients were summed by their buckets. */
static int backward(Stage *st, int m) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  const DuetStage *ps = &p->stages[st->id];
  int slot = m % st->n_slots, gm = st->rep * q->M + m;
  double s[DUET_S_COUNT];
  micro_scalars(q, gm, s);
  if (run_steps(st, ps->bwd, ps->n_bwd, m, slot, s, true)) return -1;
  if (p->n_unscale > 0) { /* a micro-batch's overflow spoils the whole step */
    if (st->dev->ops->copy_to_host(st->dev, st->flags_mb, st->overflow, (size_t)p->n_unscale * sizeof *st->flags_mb)) {
      pipe_fail(q, "%s, micro-batch %d: reading the overflow flags: %s", st->who, gm, st->dev->err);
      return -1;
    }
    for (int j = 0; j < p->n_unscale; j++) st->flags[j] |= st->flags_mb[j];
  }
  if (q->R > 1 && m == q->M - 1) return 0;
  for (int i = 0; i < p->n_tensors; i++)
    if (st->acc_off[i] >= 0 && sum_grad(st, i, m, slot)) return -1;
  return 0;
}

/* Data parallelism, after the stage's backward passes: waits for its
 * buckets, ORs its overflow flags over the replicas (a sum of 0/1 flags)
 * and, on the loss's stage, gathers every replica's losses (a sum of rows
 * that are zero but for each replica's own micro-batches: exact).  0, or -1
 * after pipe_fail. */
static int replicas_meet(Stage *st) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  char err[600];
  for (int k = 0; k < st->n_buckets; k++) {
    int b = st->buckets[k];
    if (b == q->drop_bucket) continue;
    double t0 = q->profile ? now_s() : 0;
    int rc = q->coll->ops->allreduce_wait(q->coll, st->rep, b, err, sizeof err);
    if (q->profile) st->wait += now_s() - t0;
    st->in_flight = 0;
    if (rc) {
      pipe_fail(q, "%s: %s of bucket %d: %s", st->who, p->zero ? "reduce-scatter" : "all-reduce", b, err);
      return -1;
    }
  }
  int B = p->n_buckets;
  if (p->n_unscale > 0) {
    int local = 0, global = 0;
    for (int j = 0; j < p->n_unscale; j++) local |= st->flags[j] != 0;
    DuetCollBuf f = {.ptr = st->flags, .n = p->n_unscale, .dtype = DUET_I32};
    if (q->coll->ops->allreduce_start(q->coll, st->rep, B + st->id, NULL, &f, 1, err, sizeof err) ||
        q->coll->ops->allreduce_wait(q->coll, st->rep, B + st->id, err, sizeof err)) {
      pipe_fail(q, "%s: the overflow flags over the replicas: %s", st->who, err);
      return -1;
    }
    for (int j = 0; j < p->n_unscale; j++) global |= st->flags[j] != 0;
    if (local != global) {
      pthread_mutex_lock(&q->mu);
      q->asym_steps++; /* counted by each replica and stage that saw none of it */
      pthread_mutex_unlock(&q->mu);
    }
  }
  if (p->loss >= 0 && p->tensors[p->loss].stage == st->id) {
    DuetCollBuf l = {.ptr = q->losses + (size_t)st->rep * (size_t)q->Mt, .n = q->Mt, .dtype = DUET_F64};
    if (q->coll->ops->allreduce_start(q->coll, st->rep, B + q->S, NULL, &l, 1, err, sizeof err) ||
        q->coll->ops->allreduce_wait(q->coll, st->rep, B + q->S, err, sizeof err)) {
      pipe_fail(q, "%s: the losses over the replicas: %s", st->who, err);
      return -1;
    }
  }
  return 0;
}

/* Forward and backward of every micro-batch in the schedule, then the
 * summed gradients written to the stage's gradient tensors (with replicas:
 * summed over the replicas).  0, or -1 after pipe_fail. */
static int stage_grads(Stage *st) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  int M = q->M, S = q->S, s = st->id;
  if (p->n_unscale > 0) memset(st->flags, 0, (size_t)p->n_unscale * sizeof *st->flags);
  if (p->loss >= 0 && p->tensors[p->loss].stage == s)
    memset(q->losses + (size_t)st->rep * (size_t)q->Mt, 0, (size_t)q->Mt * sizeof *q->losses);
  if (q->schedule == DUET_SCHEDULE_1F1B) {
    int w = S - s - 1 < M ? S - s - 1 : M; /* warm-up forwards */
    for (int m = 0; m < w; m++)
      if (forward(st, m)) return -1;
    for (int i = 0; i < M; i++) {
      if (w + i < M && forward(st, w + i)) return -1;
      if (backward(st, i)) return -1;
    }
  } else {
    for (int m = 0; m < M; m++)
      if (forward(st, m)) return -1;
    for (int m = 0; m < M; m++)
      if (backward(st, m)) return -1;
  }
  if (q->R > 1) {
    if (replicas_meet(st)) return -1;
  } else {
    for (int i = 0; i < p->n_tensors; i++)
      if (st->acc_off[i] >= 0 && final_grad(st, i)) return -1;
  }
  /* tied weights: the parts of their gradients summed, the sums crossing
   * stages and added (the optimizer schedule's steps with b = 2) */
  const DuetStage *ps = &p->stages[s];
  st->tied_pass = true;
  int rc = run_steps(st, st->opt ? st->opt : ps->opt, st->opt ? st->n_opt : ps->n_opt, 0, 0, q->s, true);
  st->tied_pass = false;
  return rc;
}

/* Gradient clipping, after the stage's gradients are final (summed over
 * the micro-batches and the replicas): the sum of squares of each of its
 * gradients (clip_sumsq kernels) into q->clip_part, row st->lr (its local
 * replica: an MPI rank holds one, and measures its own copy).  0, or -1
 * after pipe_fail. */
static int stage_sumsq(Stage *st) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  for (int j = 0; j < p->n_clip; j++) {
    if (p->tensors[p->clip_grad[j]].stage != st->id) continue;
    if (st->dev->ops->launch(st->dev, p->clip_sumsq[j], st->tab[0], q->s) ||
        st->dev->ops->copy_to_host(st->dev, &q->clip_part[(size_t)st->lr * (size_t)p->n_clip + (size_t)j],
                                   st->overflow + duet_clip_word(p, j), sizeof(double))) {
      pipe_fail(q, "%s: gradient clipping, the norm of %s: %s", st->who, p->tensors[p->clip_grad[j]].name,
                st->dev->err);
      return -1;
    }
  }
  return 0;
}

/* Gradient clipping, before the stage's update: its gradients scaled by
 * q->clip_coef (clip_scale kernels, the coefficient written to the
 * device first).  0, or -1 after pipe_fail. */
static int stage_clip(Stage *st) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  if (st->dev->ops->copy_to_device(st->dev, st->overflow + duet_clip_word(p, p->n_clip), &q->clip_coef,
                                   sizeof q->clip_coef)) {
    pipe_fail(q, "%s: gradient clipping: %s", st->who, st->dev->err);
    return -1;
  }
  for (int j = 0; j < p->n_clip; j++)
    if (p->tensors[p->clip_grad[j]].stage == st->id &&
        st->dev->ops->launch(st->dev, p->clip_scale[j], st->tab[0], q->s)) {
      pipe_fail(q, "%s: gradient clipping, scaling %s: %s", st->who, p->tensors[p->clip_grad[j]].name, st->dev->err);
      return -1;
    }
  return 0;
}

/* The job's part of a training step on stage st (q->phase). */
static int train_stage(Stage *st) {
  DuetPipe *q = st->q;
  const DuetProgram *p = q->p;
  int s = st->id;
  if (q->phase != DUET_PIPE_STEP && stage_grads(st)) return -1;
  if (q->phase == DUET_PIPE_GRADS && q->clip_on && stage_sumsq(st)) return -1;
  if (q->phase == DUET_PIPE_GRADS && st->off) { /* --offload: the gradients to the host before the verdict */
    char e[600];
    if (q->clip_on) duet_offload_forget(st->off); /* clipping may scale them first */
    else if (duet_offload_fetch(st->off, st->tab[0], e, sizeof e)) {
      pipe_fail(q, "%s", e);
      return -1;
    }
  }
  if (q->phase == DUET_PIPE_STEP && q->clip_coef < 1.0 && stage_clip(st)) return -1;
  const DuetStage *ps = &p->stages[s];
  if (q->phase != DUET_PIPE_GRADS && st->off) {
    char e[600];
    if (q->phase == DUET_RUN_TRAIN) duet_offload_forget(st->off); /* nothing fetched early in a one-job step */
    if (duet_offload_step(st->off, st->tab[0], q->s, e, sizeof e)) {
      pipe_fail(q, "%s", e);
      return -1;
    }
  } else if (q->phase != DUET_PIPE_GRADS) {
    if (run_steps(st, st->opt ? st->opt : ps->opt, st->opt ? st->n_opt : ps->n_opt, 0, 0, q->s, true)) {
      st->n_gathers = 0;
      return -1;
    }
    if (st->n_gathers && gathers_wait(st)) return -1;
  }
  if (st->dev->ops->sync(st->dev)) {
    pipe_fail(q, "%s: %s", st->who, st->dev->err);
    return -1;
  }
  return 0;
}

static void *worker(void *arg) {
  Stage *st = arg;
  DuetPipe *q = st->q;
#ifdef _OPENMP
  omp_set_num_threads(st->threads);
#endif
  for (;;) {
    pthread_mutex_lock(&q->mu);
    while (!q->quit && q->job == st->seen) pthread_cond_wait(&q->job_cv, &q->mu);
    if (q->quit) {
      pthread_mutex_unlock(&q->mu);
      break;
    }
    st->seen = q->job;
    pthread_mutex_unlock(&q->mu);
    double t0 = q->profile ? now_s() : 0;
    if (!aborted(q)) train_stage(st);
    if (q->profile) st->busy += now_s() - t0; /* waits included; subtracted when printed */
    pthread_mutex_lock(&q->mu);
    q->n_done++;
    pthread_cond_signal(&q->done_cv);
    pthread_mutex_unlock(&q->mu);
  }
  return NULL;
}

/* Evaluation: replica 0 alone, over every micro-batch of the global batch
 * (the replicas hold the same params). */
static int eval_run(DuetPipe *q, int64_t n_valid) {
  const DuetProgram *p = q->p;
  const DuetTensor *mt = p->metrics >= 0 ? &p->tensors[p->metrics] : NULL;
  double sum[2] = {0, 0};
  /* rows of the logits per micro-batch: n_valid counts those rows */
  int64_t rows = 0;
  if (p->logits >= 0 && p->n_classes > 0) rows = numel(&p->tensors[p->logits]) / p->n_classes;
  for (int m = 0; m < q->Mt; m++) {
    int64_t v = rows ? n_valid - (int64_t)m * rows : 1;
    if (rows && v <= 0) break;
    double s[DUET_S_COUNT];
    micro_scalars(q, m, s);
    s[DUET_S_N_VALID] = (double)(rows && v > rows ? rows : v);
    if (!rows) s[DUET_S_N_VALID] = q->s[DUET_S_N_VALID];
    for (int k = 0; k < q->S; k++) {
      Stage *st = &q->st[k];
      if (copy_inputs(st, m, 0) || run_steps(st, p->stages[k].eval, p->stages[k].n_eval, m, 0, s, false)) return -1;
    }
    if (mt)
      for (int k = 0; k < 2 && k < numel(mt); k++)
        sum[k] += fetch_elem(&q->st[mt->stage], mt, q->st[mt->stage].tab[0][p->metrics], k);
    if (q->abort) return -1;
  }
  if (mt)
    for (int k = 0; k < 2 && k < numel(mt); k++) write_elem(mt, q->host_metrics, k, sum[k]);
  return 0;
}

int duet_pipe_run(DuetPipe *q, int which, const double *s, int64_t n_valid, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  memcpy(q->s, s, sizeof q->s);
  q->abort = false;
  q->err[0] = 0;
  if (which == DUET_RUN_EVAL) {
    if (eval_run(q, n_valid)) {
      snprintf(err, errlen, "%s", q->err);
      return -1;
    }
    return 0;
  }
  if (which != DUET_RUN_TRAIN && which != DUET_PIPE_GRADS && which != DUET_PIPE_STEP) {
    snprintf(err, errlen, "a pipelined program runs training and evaluation only");
    return -1;
  }
  pthread_mutex_lock(&q->mu);
  q->phase = which;
  q->job++;
  if (which != DUET_PIPE_STEP) q->runs++;
  q->n_done = 0;
  pthread_cond_broadcast(&q->job_cv);
  while (q->n_done < q->L * q->S) pthread_cond_wait(&q->done_cv, &q->mu);
  bool bad = q->abort;
  pthread_mutex_unlock(&q->mu);
  if (bad) {
    snprintf(err, errlen, "%s", q->err);
    return -1;
  }
  if (p->loss >= 0 && which != DUET_PIPE_STEP) { /* the mean over the global batch's micro-batches, in order */
    double l = 0;
    for (int m = 0; m < q->Mt; m++) l += q->losses[(size_t)q->r0 * (size_t)q->Mt + (size_t)m];
    write_elem(&p->tensors[p->loss], q->host_loss, 0, l / (double)q->Mt);
  }
  return 0;
}

int duet_pipe_first_overflow(const DuetPipe *q) {
  int first = -1; /* replica 0's flags: OR-ed over the replicas */
  for (int k = 0; k < q->S; k++)
    for (int j = 0; j < q->p->n_unscale && (first < 0 || j < first); j++)
      if (q->st[k].flags[j]) first = j;
  return first;
}

int duet_pipe_replicas(const DuetPipe *q) { return q->L; }

void duet_pipe_set_clip(DuetPipe *q, int measure, double coef) {
  q->clip_on = measure && q->p->n_clip > 0;
  q->clip_coef = coef;
}

int duet_pipe_grad_sumsq(const DuetPipe *q, double *sum, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  double s0 = 0;
  for (int j = 0; j < p->n_clip; j++) s0 += q->clip_part[j];
  for (int r = 1; r < q->L; r++) /* the replicas' summed gradients are the same bytes: so are their sums */
    for (int j = 0; j < p->n_clip; j++)
      if (memcmp(&q->clip_part[(size_t)r * (size_t)p->n_clip + (size_t)j], &q->clip_part[j], sizeof(double))) {
        snprintf(err, errlen, "gradient clipping: the sum of squares of %s is %.17g on replica %d, %.17g on replica "
                 "0: the replicas' gradients differ after the all-reduce", p->tensors[p->clip_grad[j]].name,
                 q->clip_part[(size_t)r * (size_t)p->n_clip + (size_t)j], r, q->clip_part[j]);
        return -1;
      }
  *sum = s0;
  return 0;
}

int64_t duet_pipe_asym_overflows(const DuetPipe *q) { return q->asym_steps; }

static bool host_buffer(const DuetProgram *p, int id) {
  return id == p->input_x || id == p->input_y || id == p->loss || id == p->metrics;
}

void *duet_pipe_tensor_at(DuetPipe *q, int replica, int id) {
  const DuetProgram *p = q->p;
  if (id < 0 || id >= p->n_tensors || replica < 0 || replica >= q->L) return NULL;
  if (id == p->input_x) return q->host_x;
  if (id == p->input_y) return q->host_y;
  if (id == p->loss) return q->host_loss;
  if (id == p->metrics) return q->host_metrics;
  return q->st[replica * q->S + p->tensors[id].stage].tab[0][id];
}

DuetDevice *duet_pipe_tensor_device_at(DuetPipe *q, int replica, int id) {
  const DuetProgram *p = q->p;
  if (id < 0 || id >= p->n_tensors || replica < 0 || replica >= q->L || host_buffer(p, id)) return NULL;
  if (q->offload && p->tensors[id].region == DUET_MEM_STATE) return NULL; /* in host memory */
  return q->st[replica * q->S + p->tensors[id].stage].dev;
}

bool duet_pipe_offload_pinned(const DuetPipe *q) {
  bool all = q->offload && q->L * q->S > 0;
  for (int k = 0; all && k < q->L * q->S; k++) all = q->st[k].off && duet_offload_pinned(q->st[k].off);
  return all;
}

void duet_pipe_param_written(DuetPipe *q, int id) {
  const DuetProgram *p = q->p;
  if (!q->offload || id < 0 || id >= p->n_tensors || p->tensors[id].region != DUET_MEM_PARAM) return;
  for (int r = 0; r < q->L; r++) duet_offload_invalidate(q->st[r * q->S + p->tensors[id].stage].off);
}

void *duet_pipe_tensor(DuetPipe *q, int id) { return duet_pipe_tensor_at(q, 0, id); }

DuetDevice *duet_pipe_tensor_device(DuetPipe *q, int id) { return duet_pipe_tensor_device_at(q, 0, id); }

/* duet_pipe_compare_replicas across the ranks of an MPI run: each param
 * and optimizer-state tensor hashed (FNV-1a, 64 bits), the hashes gathered
 * through the collective (a sum of vectors that are zero but for each
 * rank's own: exact) and compared with rank 0's. */
static int compare_ranks(DuetPipe *q, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  int n = 0, rc = -1;
  int64_t most = 0;
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].region == DUET_MEM_PARAM || (p->tensors[i].region == DUET_MEM_STATE && !p->zero)) {
      n++;
      if (p->tensors[i].nbytes > most) most = p->tensors[i].nbytes;
    }
  uint32_t *v = calloc((size_t)q->R * (size_t)n * 2 + 1, sizeof *v);
  char *buf = calloc((size_t)most + 1, 1);
  if (!v || !buf) {
    snprintf(err, errlen, "out of host memory");
    goto out;
  }
  int j = 0;
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *t = &p->tensors[i];
    if (t->region != DUET_MEM_PARAM && (t->region != DUET_MEM_STATE || p->zero)) continue;
    Stage *st = &q->st[t->stage];
    if (st->dev->ops->copy_to_host(st->dev, buf, st->tab[0][i], (size_t)t->nbytes)) {
      snprintf(err, errlen, "%s: reading %s: %s", st->who, t->name, st->dev->err);
      goto out;
    }
    uint64_t h = duet_fnv1a(buf, (size_t)t->nbytes, DUET_FNV_OFFSET);
    size_t at = ((size_t)q->r0 * (size_t)n + (size_t)j++) * 2;
    v[at] = (uint32_t)h;
    v[at + 1] = (uint32_t)(h >> 32);
  }
  int tag = p->n_buckets + q->S + 1;
  DuetCollBuf b = {.ptr = v, .n = (int64_t)q->R * n * 2, .dtype = DUET_I32};
  char e[600];
  if (q->coll->ops->allreduce_start(q->coll, q->r0, tag, NULL, &b, 1, e, sizeof e) ||
      q->coll->ops->allreduce_wait(q->coll, q->r0, tag, e, sizeof e)) {
    snprintf(err, errlen, "gathering the ranks' hashes: %s", e);
    goto out;
  }
  rc = 0;
  for (int r = 1; r < q->R && !rc; r++) {
    j = 0;
    for (int i = 0; i < p->n_tensors && !rc; i++) {
      const DuetTensor *t = &p->tensors[i];
      if (t->region != DUET_MEM_PARAM && (t->region != DUET_MEM_STATE || p->zero)) continue;
      if (memcmp(&v[((size_t)r * (size_t)n + (size_t)j) * 2], &v[(size_t)j * 2], 2 * sizeof *v)) {
        snprintf(err, errlen, "rank %d's %s differ from rank 0's: tensor %s (their FNV-1a hashes differ)", r,
                 t->region == DUET_MEM_PARAM ? "params" : "optimizer state", t->name);
        rc = -1;
      }
      j++;
    }
  }
out:
  free(v);
  free(buf);
  return rc;
}

int duet_pipe_compare_replicas(DuetPipe *q, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  if (q->L < q->R) return compare_ranks(q, err, errlen);
  int rc = 0;
  void *a = NULL, *b = NULL;
  for (int s = 0; s < q->S && !rc; s++)
    for (int reg = DUET_MEM_PARAM; reg <= (p->zero ? DUET_MEM_PARAM : DUET_MEM_STATE) && !rc; reg++) {
      /* ZeRO: each replica holds its own shard of the state */
      size_t bytes = (size_t)p->stages[s].region_bytes[reg];
      if (!bytes) continue;
      free(a), free(b);
      if (!(a = malloc(bytes)) || !(b = malloc(bytes))) {
        snprintf(err, errlen, "out of host memory");
        rc = -1;
        break;
      }
      Stage *s0 = &q->st[s];
      if (s0->dev->ops->copy_to_host(s0->dev, a, s0->region[reg], bytes)) {
        snprintf(err, errlen, "%s: reading its %s: %s", s0->who, reg == DUET_MEM_PARAM ? "params" : "optimizer state",
                 s0->dev->err);
        rc = -1;
        break;
      }
      for (int r = 1; r < q->L && !rc; r++) {
        Stage *sr = &q->st[r * q->S + s];
        if (sr->dev->ops->copy_to_host(sr->dev, b, sr->region[reg], bytes)) {
          snprintf(err, errlen, "%s: reading its %s: %s", sr->who, reg == DUET_MEM_PARAM ? "params" : "optimizer state",
                   sr->dev->err);
          rc = -1;
          break;
        }
        if (!memcmp(a, b, bytes)) continue;
        size_t at = 0;
        while (((const char *)a)[at] == ((const char *)b)[at]) at++;
        const char *name = "padding";
        for (int i = 0; i < p->n_tensors; i++) {
          const DuetTensor *t = &p->tensors[i];
          if (t->stage == s && t->region == reg && (int64_t)at >= t->offset && (int64_t)at < t->offset + t->nbytes)
            name = t->name;
        }
        snprintf(err, errlen, "replica %d's %s differ from replica 0's: tensor %s, byte %zu of the stage %d region", r,
                 reg == DUET_MEM_PARAM ? "params" : "optimizer state", name, at, s);
        rc = -1;
      }
    }
  free(a);
  free(b);
  return rc;
}

void duet_pipe_free(DuetPipe *q) {
  if (!q) return;
  if (q->profile && q->runs > 0 && q->coll && q->coll->ops->stats) {
    int64_t calls = 0, bytes = 0;
    double busy = 0, waited = 0;
    for (int b = 0; b < q->p->n_buckets; b++) {
      int64_t c, n;
      double bs, ws;
      q->coll->ops->stats(q->coll, b, &c, &n, &bs, &ws);
      calls += c, bytes += n, busy += bs, waited += ws;
    }
    int64_t c_all, n_all;
    double w_all;
    q->coll->ops->stats(q->coll, -1, &c_all, &n_all, &busy, &w_all); /* in flight: overlapping buckets once */
    double hidden = busy > 0 ? 1.0 - waited / busy : 0;
    fprintf(stderr, "duet: all-reduce profile (%s) of %lld training steps: %.1f buckets and %.2f MiB sent per step; "
            "%.2f ms per step with a bucket in flight (from its start to its completion), %.2f ms of it waited for "
            "before the optimizer: %.0f%% hidden behind the backward pass\n", q->coll->ops->name, (long long)q->runs,
            (double)calls / (double)q->runs, (double)bytes / 1048576.0 / (double)q->runs,
            1e3 * busy / (double)q->runs, 1e3 * waited / (double)q->runs, 100 * (hidden > 0 ? hidden : 0));
  }
  if (q->profile && q->runs > 0) {
    fprintf(stderr, "duet: pipeline profile of %lld training steps (ms per step):\n", (long long)q->runs);
    for (int k = 0; q->st && k < q->L * q->S; k++)
      fprintf(stderr, "  %s: computing %.2f, waiting for transfers%s %.2f\n", q->st[k].who,
              1e3 * (q->st[k].busy - q->st[k].wait) / (double)q->runs, q->R > 1 ? " and all-reduces" : "",
              1e3 * q->st[k].wait / (double)q->runs);
  }
  pthread_mutex_lock(&q->mu);
  q->quit = true;
  pthread_cond_broadcast(&q->job_cv);
  pthread_mutex_unlock(&q->mu);
  for (int k = 0; q->st && k < q->L * q->S; k++)
    if (q->st[k].started) pthread_join(q->st[k].thread, NULL);
  if (q->coll) q->coll->ops->destroy(q->coll);
  if (q->coll_host) q->coll_host->ops->destroy(q->coll_host);
  /* staging blocks before the devices that allocated them */
  for (int i = 0; q->xfer && i < q->L * q->p->n_transfers; i++) {
    Xfer *x = &q->xfer[i];
    if (!x->owner) free(x->block);
    else if (x->path != DUET_PEER_NONE) x->owner->ops->free(x->owner, x->block);
    else x->owner->ops->host_free(x->owner, x->block);
  }
  free(q->xfer);
  for (int k = 0; q->st && k < q->L * q->S; k++) {
    Stage *st = &q->st[k];
    for (int r = 1; r < DUET_MEM_COUNT; r++)
      if (st->region[r] && st->dev) st->dev->ops->free(st->dev, st->region[r]);
    for (int i = 0; st->tab && i < st->n_slots; i++) free(st->tab[i]);
    free(st->tab);
    if (st->dev_acc) {
      if (st->acc) st->dev->ops->free(st->dev, st->acc);
    } else {
      free(st->acc);
    }
    free(st->tmp);
    free(st->acc_off);
    free(st->flags);
    free(st->flags_mb);
    free(st->buckets);
    free(st->cbuf);
    free(st->opt);
    free(st->gathers);
    duet_offload_free(st->off);
    if (st->overflow && st->dev) st->dev->ops->free(st->dev, st->overflow);
    if (st->dev) st->dev->ops->destroy(st->dev);
  }
  free(q->st);
  free(q->posted);
  free(q->host_x);
  free(q->host_y);
  free(q->host_loss);
  free(q->host_metrics);
  free(q->losses);
  free(q->clip_part);
  free(q->bucket_of);
  free(q->split);
  if (q->sync_ok) {
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    pthread_cond_destroy(&q->job_cv);
    pthread_cond_destroy(&q->done_cv);
  }
  free(q);
}

static void *zalloc(size_t n) { return calloc(1, n ? n : 1); }

static const char *path_name(int path, bool pinned) {
  switch (path) {
  case DUET_PEER_HOST_MEMORY: return "copied between arenas (CPU)";
  case DUET_PEER_SAME_GPU: return "device-to-device (same GPU)";
  case DUET_PEER_P2P: return "peer-to-peer";
  default: return pinned ? "staged through pinned host memory" : "staged through host memory";
  }
}

/* The device whose host_alloc stages transfers from a to b through host
 * memory: the sender's, else the receiver's; NULL: neither has one. */
static DuetDevice *staging_owner(DuetDevice *a, DuetDevice *b) {
  return a->ops->host_alloc ? a : b->ops->host_alloc ? b : NULL;
}

/* How replica r's transfers go from stage `from` to stage `to` (a
 * DUET_PEER_* kind; DUET_PEER_NONE: through host memory): direct when both
 * devices share an ops table whose peer_path allows it between them and
 * within the receiver (its staging -> arena copy).  -1 with a message in
 * err. */
static int pair_path(DuetPipe *q, int r, int from, int to, char *err, size_t errlen) {
  DuetDevice *a = q->st[r * q->S + from].dev, *b = q->st[r * q->S + to].dev;
  if (q->force_host || a->ops != b->ops || !a->ops->peer_path || !a->ops->copy_peer) return DUET_PEER_NONE;
  int path = a->ops->peer_path(a, b);
  int local = path > DUET_PEER_NONE ? b->ops->peer_path(b, b) : DUET_PEER_NONE;
  if (path < 0 || local < 0) {
    if (q->R > 1)
      snprintf(err, errlen, "replica %d, transfers from stage %d to stage %d: %s", q->r0 + r, from, to,
               path < 0 ? a->err : b->err);
    else
      snprintf(err, errlen, "transfers from stage %d to stage %d: %s", from, to, path < 0 ? a->err : b->err);
    return -1;
  }
  return local == DUET_PEER_NONE ? DUET_PEER_NONE : path;
}

/* Chooses each transfer's path (one per ordered pair of stages; replica
 * 0's are listed in q->paths) and allocates its staging block, for every
 * replica: on the receiving device (ops->alloc) for a direct path, else
 * host memory from the sender's or the receiver's host_alloc (page-locked),
 * else calloc.  0, or -1 with a message in err (the blocks made so far are
 * freed by duet_pipe_free). */
static int setup_transfers(DuetPipe *q, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  int S = q->S;
  int *pair = malloc((size_t)S * (size_t)S * sizeof *pair);
  if (!pair) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  for (int r = q->L - 1; r >= 0; r--) { /* local replica 0 last: its paths are listed */
    for (int i = 0; i < S * S; i++) pair[i] = -1;
    for (int i = 0; i < p->n_transfers; i++) {
      const DuetTransfer *tr = &p->transfers[i];
      Xfer *x = xf(q, r, i);
      if (tr->from < 0 || tr->from >= S || tr->to < 0 || tr->to >= S || tr->from == tr->to || tr->nbytes < 0) {
        snprintf(err, errlen, "transfer %d goes from stage %d to stage %d of %d", i, tr->from, tr->to, S);
        free(pair);
        return -1;
      }
      DuetDevice *a = q->st[r * S + tr->from].dev, *b = q->st[r * S + tr->to].dev;
      int *pp = &pair[tr->from * S + tr->to];
      if (*pp < 0 && (*pp = pair_path(q, r, tr->from, tr->to, err, errlen)) < 0) {
        free(pair);
        return -1;
      }
      x->path = *pp;
      /* buffers 256 bytes apart: as aligned as the block (device memory: 64 or 256 bytes) */
      x->stride = ((size_t)tr->nbytes + 255) & ~(size_t)255;
      size_t bytes = x->stride * (size_t)q->M;
      DuetDevice *owner = x->path != DUET_PEER_NONE ? b : staging_owner(a, b);
      if (!owner) x->block = zalloc(bytes);
      else if (x->path != DUET_PEER_NONE) x->block = owner->ops->alloc(owner, bytes);
      else x->block = owner->ops->host_alloc(owner, bytes);
      if (!x->block) {
        snprintf(err, errlen, "staging transfer %d (stage %d -> %d, %zu bytes): %s", i, tr->from, tr->to, bytes,
                 owner ? owner->err : "out of host memory");
        free(pair);
        return -1;
      }
      x->owner = owner;
    }
  }
  size_t len = 0;
  q->paths[0] = 0;
  for (int i = 0; i < S * S; i++)
    if (pair[i] >= 0 && len < sizeof q->paths) {
      bool pinned = pair[i] == DUET_PEER_NONE && staging_owner(q->st[i / S].dev, q->st[i % S].dev);
      len += (size_t)snprintf(q->paths + len, sizeof q->paths - len, "%sstage %d -> %d %s", len ? ", " : "", i / S,
                              i % S, path_name(pair[i], pinned));
    }
  if (q->force_host && len > 0 && len < sizeof q->paths)
    snprintf(q->paths + len, sizeof q->paths - len, " (forced by DUET_PIPE_STAGING=host)");
  free(pair);
  return 0;
}

const char *duet_pipe_transfers(const DuetPipe *q) { return q->paths; }

int duet_pipe_allocated(const DuetPipe *q, int64_t *bytes, int max) {
  int n = q->L * q->S < max ? q->L * q->S : max;
  for (int i = 0; i < n; i++) bytes[i] = q->st[i].allocated;
  return n;
}

int duet_pipe_env(DuetPipeEnv *e, double timeout, char *err, size_t errlen) {
  *e = (DuetPipeEnv){.timeout = timeout > 0 ? timeout : 120.0, .drop_t = -1, .drop_m = -1, .drop_bucket = -1};
  const char *v = getenv("DUET_PIPE_TIMEOUT");
  if (v) { /* set but empty is an error, as DUET_CPU_GFLOPS; bounded so the deadline is a valid timespec */
    char *end;
    errno = 0;
    double t = strtod(v, &end);
    if (end == v || *end || errno || !(t > 0) || !(t <= DUET_PIPE_TIMEOUT_MAX)) {
      snprintf(err, errlen, "DUET_PIPE_TIMEOUT must be a number of seconds > 0 and at most %.0f (%.1f days), got '%s'",
               DUET_PIPE_TIMEOUT_MAX, DUET_PIPE_TIMEOUT_MAX / 86400, v);
      return -1;
    }
    e->timeout = t;
  }
  v = getenv("DUET_PIPE_STAGING");
  if (v && *v && strcmp(v, "auto") && strcmp(v, "host")) {
    snprintf(err, errlen, "DUET_PIPE_STAGING must be auto or host, got '%s'", v);
    return -1;
  }
  e->force_host = v && !strcmp(v, "host");
  v = getenv("DUET_PIPE_SUMS");
  if (v && *v && strcmp(v, "auto") && strcmp(v, "host")) {
    snprintf(err, errlen, "DUET_PIPE_SUMS must be auto or host, got '%s'", v);
    return -1;
  }
  e->host_sums = v && !strcmp(v, "host");
  v = getenv("DUET_PROFILE");
  e->profile = v && *v && strcmp(v, "0");
  v = getenv("DUET_PIPE_DROP_SEND");
  if (v && *v && sscanf(v, "%d:%d", &e->drop_t, &e->drop_m) != 2) {
    snprintf(err, errlen, "DUET_PIPE_DROP_SEND must be TRANSFER:MICROBATCH, got '%s'", v);
    return -1;
  }
  v = getenv("DUET_DP_CHECK");
  if (v && *v && strcmp(v, "0") && strcmp(v, "1")) {
    snprintf(err, errlen, "DUET_DP_CHECK must be 0 or 1, got '%s'", v);
    return -1;
  }
  e->dp_check = v && !strcmp(v, "1");
  v = getenv("DUET_DP_COLLECTIVE");
  if (v && *v && strcmp(v, "auto") && strcmp(v, "shm") && strcmp(v, "nccl")) {
    snprintf(err, errlen, "DUET_DP_COLLECTIVE must be auto, shm or nccl, got '%s'", v);
    return -1;
  }
  e->collective = !v || !*v || !strcmp(v, "auto") ? DUET_COLL_AUTO : !strcmp(v, "shm") ? DUET_COLL_SHM : DUET_COLL_NCCL;
  v = getenv("DUET_DP_DROP");
  if (v && *v) {
    char *end;
    long b = strtol(v, &end, 10);
    if (*end || b < 0 || b > INT32_MAX) {
      snprintf(err, errlen, "DUET_DP_DROP must be a bucket number, got '%s'", v);
      return -1;
    }
    e->drop_bucket = (int)b;
  }
  return 0;
}

/* NCCL for R replicas of S stages on the devices specs[r * S + s]: every
 * stage's replicas on distinct GPUs.  0, or -1 with the reason, to follow
 * "DUET_DP_COLLECTIVE=nccl: " or "NCCL not used: ". */
static int nccl_devices(const DuetDeviceSpec *specs, int R, int S, char *why, size_t whylen) {
  for (int s = 0; s < S; s++)
    for (int r = 0; r < R; r++) {
      const DuetDeviceSpec *d = &specs[r * S + s];
      if (d->kind != DUET_DEV_CUDA) {
        snprintf(why, whylen, "replica %d's stage %d is on %s, and NCCL connects GPUs", r, s, d->name);
        return -1;
      }
      for (int o = 0; o < r; o++)
        if (specs[o * S + s].index == d->index) {
          snprintf(why, whylen, "replicas %d and %d of stage %d are both on cuda:%d, and NCCL allows one rank per GPU "
                   "(DUET_DP_COLLECTIVE=auto or shm sums one GPU's replicas device-to-device)", o, r, s, d->index);
          return -1;
        }
    }
  return 0;
}

int duet_pipe_nccl_check(const DuetProgram *p, const char *devices, char *err, size_t errlen) {
  int R = p->replicas > 1 ? p->replicas : 1, S = p->n_stages > 0 ? p->n_stages : 1, n = 0;
  DuetDeviceSpec specs[DUET_MAX_DEVICES];
  char why[400];
  if (R < 2) return 0;
  if (!devices) { /* virtual CPU devices, as worker_devices makes them */
    n = R * S < DUET_MAX_DEVICES ? R * S : DUET_MAX_DEVICES;
    for (int k = 0; k < n; k++) {
      specs[k] = (DuetDeviceSpec){.kind = DUET_DEV_CPU, .index = k};
      snprintf(specs[k].name, sizeof specs[k].name, "cpu:%d", k);
    }
  } else if (duet_devices_parse(devices, specs, DUET_MAX_DEVICES, &n, err, errlen)) {
    return -1;
  }
  if (n != R * S) return 0; /* the device count's own error comes later */
  if (nccl_devices(specs, R, S, why, sizeof why)) {
    snprintf(err, errlen, "DUET_DP_COLLECTIVE=nccl: %s", why);
    return -1;
  }
  return 0;
}

/* The collective between the replicas (q->coll), and its description
 * (q->coll_desc).  NCCL (DUET_DP_COLLECTIVE=nccl, or auto when every
 * stage's replicas are distinct GPUs and NCCL loads) reduces the buckets
 * on the GPUs; otherwise the shared-memory collective sums in replica
 * order, on the devices (duet_coll_shm_direct) for each stage whose
 * replicas' devices copy directly between every pair and sum in their
 * memory (one GPU's replicas; GPUs with peer access), else through host
 * staging.  Host buffers (losses, overflow flags) always go through
 * shared memory.  DUET_PIPE_STAGING=host forces host staging here too.
 * 0, or -1 with a message. */
static int make_collective(DuetPipe *q, const DuetDeviceSpec *specs, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  int R = q->R, S = q->S, B = p->n_buckets, n_tags = B + S + 1; /* buckets, each stage's flags, the losses */
  DuetColl *host = duet_coll_shm_new(R, n_tags, q->timeout, err, errlen);
  if (!host) return -1;
  char why[800] = "";
  bool tried = false;
  if (q->collective != DUET_COLL_SHM && !nccl_devices(specs, R, S, why, sizeof why)) {
    int *tag_stage = malloc((size_t)n_tags * sizeof *tag_stage);
    DuetDevice **devs = malloc((size_t)(R * S) * sizeof *devs);
    char desc[600];
    DuetColl *c = NULL;
    if (tag_stage && devs) {
      for (int t = 0; t < n_tags; t++) tag_stage[t] = t < B ? p->tensors[p->bucket_tensors[p->bucket_off[t]]].stage : -1;
      for (int s = 0; s < S; s++)
        for (int r = 0; r < R; r++) devs[s * R + r] = q->st[r * S + s].dev;
      c = duet_coll_nccl_new(devs, R, S, tag_stage, n_tags, q->timeout, q->profile, host, desc, sizeof desc, why,
                             sizeof why);
    } else {
      snprintf(why, sizeof why, "out of host memory");
    }
    free(tag_stage);
    free(devs);
    if (c && p->zero && (!c->ops->reduce_scatter_start || !c->ops->all_gather_start)) {
      snprintf(why, sizeof why, "this NCCL plugin has no reduce-scatter and all-gather for --zero 1 (a plugin of an "
               "older duet?)");
      c->ops->destroy(c); /* it owns host: made anew below */
      c = NULL;
      if (!(host = duet_coll_shm_new(R, n_tags, q->timeout, err, errlen))) return -1;
    }
    if (c) {
      q->coll = c;
      snprintf(q->coll_desc, sizeof q->coll_desc, "by %s%s", desc,
               p->zero ? "; --zero 1: the reduce-scatter as NCCL's all-reduce, the all-gather as an ncclBroadcast "
                         "per tensor from its replica" : "");
      return 0;
    }
    tried = true;
  }
  if (q->collective == DUET_COLL_NCCL) {
    snprintf(err, errlen, "DUET_DP_COLLECTIVE=nccl: %s", why);
    host->ops->destroy(host);
    return -1;
  }
  /* shared memory; which stages sum on their devices */
  int n_direct = 0, n_gpu = 0, kinds = 0; /* kinds: bit DUET_PEER_* seen between replicas */
  for (int s = 0; s < S; s++) {
    Stage *s0 = &q->st[s];
    bool direct = !s0->host_mem && !q->force_host && !p->zero; /* ZeRO: host staging (no device path yet) */
    for (int a = 0; a < R && direct; a++)
      for (int b = 0; b < R && direct; b++) {
        DuetDevice *x = q->st[a * S + s].dev, *y = q->st[b * S + s].dev;
        int path = x->ops == y->ops && x->ops->peer_path && x->ops->copy_peer && x->ops->accumulate
                       ? x->ops->peer_path(x, y)
                       : DUET_PEER_NONE;
        if (path < 0) {
          snprintf(err, errlen, "replicas %d and %d of stage %d: %s", a, b, s, x->err);
          host->ops->destroy(host);
          return -1;
        }
        direct = path != DUET_PEER_NONE;
        if (a != b) kinds |= 1 << path;
      }
    n_gpu += !s0->host_mem;
    if (!direct) continue;
    n_direct++;
    for (int t = 0; t < B; t++)
      if (p->tensors[p->bucket_tensors[p->bucket_off[t]]].stage == s && duet_coll_shm_direct(host, t, err, errlen)) {
        host->ops->destroy(host);
        return -1;
      }
  }
  q->coll = host;
  const char *how = ""; /* virtual CPU devices: in place in host memory */
  if (n_gpu > 0 && n_direct == S)
    how = kinds & (1 << DUET_PEER_P2P) ? ", device to device (peer-to-peer between the GPUs)"
          : S == 1                     ? ", device-to-device on the GPU"
                                       : ", device-to-device on each stage's GPU";
  else if (n_gpu > 0 && n_direct == 0)
    how = q->force_host ? " (GPU buffers staged through host memory, forced by DUET_PIPE_STAGING=host)"
                        : " (GPU buffers staged through host memory)";
  else if (n_gpu > 0)
    how = " (device-to-device where the replicas' GPUs copy directly, else staged through host memory)";
  size_t len = (size_t)snprintf(q->coll_desc, sizeof q->coll_desc, "in replica order over shared memory%s", how);
  if (tried && len < sizeof q->coll_desc) snprintf(q->coll_desc + len, sizeof q->coll_desc - len, "; NCCL not used: %s", why);
  return 0;
}

/* The ranks' agreement, over the MPI collective mpi, on whether each of
 * them could take a step towards NCCL (`failed`: this rank could not,
 * `mine` saying why).  -1 when every rank could; else the first rank K
 * that could not, its reason broadcast from it to all (every rank says the
 * same: "rank K: WHY" in why); -2 with the error in why when MPI failed. */
static int agree_ranks(DuetPipe *q, DuetColl *mpi, bool failed, const char *mine, char *why, size_t whylen) {
  int R = q->R, me = q->r0, tag = q->p->n_buckets + q->S; /* the losses' tag: host buffers */
  int32_t flags[64] = {0}, msg[200] = {0}; /* a reason as whole int32s for the broadcast */
  char e[800];
  if (R > 64) {
    snprintf(why, whylen, "%d ranks: at most 64", R);
    return -2;
  }
  flags[me] = failed;
  DuetCollBuf b = {flags, R, DUET_I32};
  if (mpi->ops->allreduce_start(mpi, me, tag, NULL, &b, 1, e, sizeof e) ||
      mpi->ops->allreduce_wait(mpi, me, tag, e, sizeof e)) {
    snprintf(why, whylen, "the ranks' agreement on NCCL, over MPI: %s", e);
    return -2;
  }
  int first = -1;
  for (int k = R - 1; k >= 0; k--)
    if (flags[k]) first = k;
  if (first < 0) return -1;
  if (first == me) snprintf((char *)msg, sizeof msg, "%s", mine);
  DuetCollBuf m = {msg, (int64_t)(sizeof msg / sizeof *msg), DUET_I32};
  if (mpi->ops->broadcast(mpi, me, first, NULL, &m, 1, e, sizeof e)) {
    snprintf(why, whylen, "why rank %d cannot use NCCL, over MPI: %s", first, e);
    return -2;
  }
  ((char *)msg)[sizeof msg - 1] = 0;
  snprintf(why, whylen, "rank %d: %s", first, (const char *)msg);
  return first;
}

/* NCCL across the ranks of an MPI run (rank_collective): every rank
 * prepares its part (NCCL loaded, its GPUs usable; rank 0 makes a unique
 * id per stage), the ranks agree over `mpi` that every one of them could
 * (none may block in ncclCommInitRank while another has given up), rank
 * 0's ids are broadcast over MPI, each rank joins the stages'
 * communicators, and the ranks agree again (NCCL refuses two ranks on one
 * GPU there, on every rank).  The connected collective (using mpi, which
 * stays the caller's), or NULL: *fatal false with the reason in why
 * ("rank K: WHY", the first rank that could not, the same on every rank),
 * every rank then without NCCL; *fatal true with the error in why (MPI
 * failed). */
static DuetColl *nccl_ranks(DuetPipe *q, DuetColl *mpi, char *desc, size_t desclen, bool *fatal, char *why,
                            size_t whylen) {
  const DuetProgram *p = q->p;
  int S = q->S, B = p->n_buckets, n_tags = B + S + 2, me = q->r0;
  int *tag_stage = malloc((size_t)n_tags * sizeof *tag_stage);
  DuetDevice **devs = malloc((size_t)S * sizeof *devs);
  int32_t *ids = calloc((size_t)S * DUET_COLL_NCCL_ID_BYTES / 4, sizeof *ids);
  char mine[800] = "", e[800];
  DuetColl *c = NULL;
  int k;
  *fatal = false;
  if (!tag_stage || !devs || !ids) {
    snprintf(mine, sizeof mine, "out of host memory");
  } else {
    for (int t = 0; t < n_tags; t++) tag_stage[t] = t < B ? p->tensors[p->bucket_tensors[p->bucket_off[t]]].stage : -1;
    for (int s = 0; s < S; s++) devs[s] = q->st[s].dev;
    c = duet_coll_nccl_rank_new(devs, q->R, me, S, tag_stage, n_tags, q->timeout, q->profile, ids, desc, desclen,
                                mine, sizeof mine);
  }
  if ((k = agree_ranks(q, mpi, !c, mine, why, whylen)) != -1) goto out;
  DuetCollBuf b = {ids, (int64_t)S * DUET_COLL_NCCL_ID_BYTES / 4, DUET_I32};
  if (mpi->ops->broadcast(mpi, me, 0, NULL, &b, 1, e, sizeof e)) {
    snprintf(why, whylen, "the NCCL unique ids of rank 0, over MPI: %s", e);
    k = -2;
    goto out;
  }
  bool joined = !duet_coll_nccl_connect(c, ids, mpi, mine, sizeof mine);
  if ((k = agree_ranks(q, mpi, !joined, mine, why, whylen)) != -1) goto out;
  free(tag_stage);
  free(devs);
  free(ids);
  return c;
out:
  *fatal = k == -2;
  if (c) c->ops->destroy(c);
  free(tag_stage);
  free(devs);
  free(ids);
  return NULL;
}

/* The collective of rank q->r0 of an MPI run (q->dist, one replica per
 * rank) and its description: NCCL between the ranks' GPUs when every
 * stage of the rank is on a GPU, DUET_DP_COLLECTIVE is auto or nccl and
 * every rank can use NCCL (nccl_ranks; auto falls back saying why, nccl
 * fails with it); else the MPI collective, GPU buffers staged through
 * host memory.  The device kinds of every rank are the same (compared at
 * start), so every rank makes the same choice.  0, or -1 with a message. */
static int rank_collective(DuetPipe *q, const DuetDeviceSpec *specs, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  int S = q->S;
  /* tags: the buckets, each stage's overflow flags, the losses, the ranks'
   * check (DUET_DP_CHECK under MPI) */
  DuetColl *mpi = duet_dist_coll(q->dist, p->n_buckets + S + 2, err, errlen);
  if (!mpi) return -1;
  bool gpu = false, tried = false;
  for (int k = 0; k < S; k++) gpu |= !q->st[k].host_mem;
  char why[1000] = "", desc[600];
  if (q->collective != DUET_COLL_SHM) {
    int cpu = -1;
    for (int s = S - 1; s >= 0; s--)
      if (specs[s].kind != DUET_DEV_CUDA) cpu = s;
    if (cpu >= 0) {
      snprintf(why, sizeof why, "rank %d's stage %d is on %s, and NCCL connects GPUs", q->r0, cpu, specs[cpu].name);
    } else {
      bool fatal;
      DuetColl *c = nccl_ranks(q, mpi, desc, sizeof desc, &fatal, why, sizeof why);
      if (c) {
        q->coll = c;
        q->coll_host = mpi;
        snprintf(q->coll_desc, sizeof q->coll_desc, "by %s, across the ranks (ncclCommInitRank, the unique ids "
                 "broadcast over %s)%s", desc, duet_dist_name(q->dist),
                 p->zero ? "; --zero 1: the reduce-scatter as NCCL's all-reduce, the all-gather as an ncclBroadcast "
                           "per tensor from its replica" : "");
        return 0;
      }
      if (fatal) {
        snprintf(err, errlen, "NCCL across the ranks: %s", why);
        mpi->ops->destroy(mpi);
        return -1;
      }
      tried = true;
    }
  }
  if (q->collective == DUET_COLL_NCCL) {
    snprintf(err, errlen, "DUET_DP_COLLECTIVE=nccl: %s", why);
    mpi->ops->destroy(mpi);
    return -1;
  }
  q->coll = mpi;
  size_t len = (size_t)snprintf(q->coll_desc, sizeof q->coll_desc, "in replica order over %s%s", duet_dist_name(q->dist),
                                gpu ? " (GPU buffers staged through host memory)" : "");
  if (tried && len < sizeof q->coll_desc) snprintf(q->coll_desc + len, sizeof q->coll_desc - len, "; NCCL not used: %s", why);
  return 0;
}

const char *duet_pipe_collective(const DuetPipe *q) { return q->coll_desc; }

bool duet_pipe_sharded(const DuetPipe *q, int id) {
  const DuetProgram *p = q->p;
  return p->zero && id >= 0 && id < p->n_tensors && p->tensors[id].region == DUET_MEM_STATE && p->tensor_shard[id] >= 0;
}

/* Sharded state tensor id into host memory dst (nbytes): in this process
 * from the replica that holds it; across MPI ranks a broadcast from its
 * rank, which every rank joins (`want` false: this rank only takes part).
 * 0, or -1 with a message. */
static int state_fetch(DuetPipe *q, int id, void *dst, bool want, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  const DuetTensor *t = &p->tensors[id];
  int sh = p->tensor_shard[id];
  if (q->L == q->R) {
    Stage *st = &q->st[sh * q->S + t->stage];
    if (want && st->dev->ops->copy_to_host(st->dev, dst, st->tab[0][id], (size_t)t->nbytes)) {
      snprintf(err, errlen, "reading %s of replica %d: %s", t->name, sh, st->dev->err);
      return -1;
    }
    return 0;
  }
  Stage *st = &q->st[t->stage];
  if (st->rep == sh && st->dev->ops->copy_to_host(st->dev, dst, st->tab[0][id], (size_t)t->nbytes)) {
    snprintf(err, errlen, "reading %s: %s", t->name, st->dev->err);
    return -1;
  }
  DuetCollBuf b = {.ptr = dst, .n = numel(t), .dtype = t->dtype == DUET_F64 ? DUET_F64 : DUET_F32};
  char e[600];
  if (q->coll->ops->broadcast(q->coll, q->r0, sh, NULL, &b, 1, e, sizeof e)) {
    snprintf(err, errlen, "gathering %s from rank %d: %s", t->name, sh, e);
    return -1;
  }
  return 0;
}

int duet_pipe_read_state(DuetPipe *q, int id, size_t off, void *dst, size_t n, char *err, size_t errlen) {
  const DuetTensor *t = &q->p->tensors[id];
  if (off == 0 && n == (size_t)t->nbytes) return state_fetch(q, id, dst, true, err, errlen);
  char *tmp = malloc((size_t)t->nbytes + 1);
  if (!tmp) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  int rc = state_fetch(q, id, tmp, true, err, errlen);
  if (!rc) memcpy(dst, tmp + off, n);
  free(tmp);
  return rc;
}

int duet_pipe_serve_states(DuetPipe *q, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  int64_t most = 0;
  for (int i = 0; i < p->n_tensors; i++)
    if (duet_pipe_sharded(q, i) && p->tensors[i].nbytes > most) most = p->tensors[i].nbytes;
  char *tmp = malloc((size_t)most + 1);
  if (!tmp) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < p->n_tensors && !rc; i++)
    if (duet_pipe_sharded(q, i)) rc = state_fetch(q, i, tmp, false, err, errlen);
  free(tmp);
  return rc;
}

int duet_pipe_rank_devices(const DuetProgram *p, const char *devices, int rank, DuetDeviceSpec *specs, char *err,
                           size_t errlen) {
  int S = p->n_stages > 1 ? p->n_stages : 1, R = p->replicas > 1 ? p->replicas : 1, n = 0;
  memset(specs, 0, DUET_MAX_DEVICES * sizeof *specs);
  if (!devices) { /* one CPU device per stage */
    for (int k = 0; k < S; k++) {
      specs[k].index = k;
      snprintf(specs[k].name, sizeof specs[k].name, "cpu:%d", k);
    }
    return 0;
  }
  if (duet_devices_parse(devices, specs, DUET_MAX_DEVICES, &n, err, errlen)) return -1;
  if (n == S) return 0;
  int G;
  if (n == R * S) { /* the list of every replica (a compiled executable's): this rank's group */
    if (duet_devices_groups(devices, R, &G, err, errlen)) return -1;
    memmove(specs, specs + (size_t)rank * (size_t)S, (size_t)S * sizeof *specs);
    return 0;
  }
  snprintf(err, errlen, "each MPI rank is one replica of %d pipeline stage%s: --devices %s names %d device%s; give the "
           "%d device%s of one rank (or %d: one group of %d per rank)", S, S == 1 ? "" : "s", devices, n,
           n == 1 ? "" : "s", S, S == 1 ? "" : "s", R * S, S);
  return -1;
}

/* The devices of this process's L x S workers: under MPI (L < R) the
 * rank's (duet_pipe_rank_devices); else cfg->devices (replica r's stages
 * are items r*S .. r*S+S-1), else virtual CPU devices cpu:0 .. cpu:R*S-1.
 * 0, or -1 with a message. */
static int worker_devices(const DuetProgram *p, const DuetConfig *cfg, int R, int L, int r0, DuetDeviceSpec *specs,
                          char *err, size_t errlen) {
  if (L < R) return duet_pipe_rank_devices(p, cfg->devices, r0, specs, err, errlen);
  int want = p->n_stages * R, n_specs = want < DUET_MAX_DEVICES ? want : DUET_MAX_DEVICES;
  memset(specs, 0, DUET_MAX_DEVICES * sizeof *specs);
  for (int k = 0; k < n_specs; k++) { /* default: virtual CPU devices */
    specs[k].index = k;
    snprintf(specs[k].name, sizeof specs[k].name, "cpu:%d", k);
  }
  if (cfg->devices && duet_devices_parse(cfg->devices, specs, DUET_MAX_DEVICES, &n_specs, err, errlen)) return -1;
  int G;
  if (R > 1 && cfg->devices && n_specs == want && duet_devices_groups(cfg->devices, R, &G, err, errlen)) return -1;
  if (n_specs != want && R > 1) {
    snprintf(err, errlen, "the program has %d replica%s of %d pipeline stage%s (%d devices), --devices names %d "
             "device%s", R, R == 1 ? "" : "s", p->n_stages, p->n_stages == 1 ? "" : "s", want, n_specs,
             n_specs == 1 ? "" : "s");
    return -1;
  }
  if (n_specs != want) {
    snprintf(err, errlen, "the program has %d pipeline stage%s, --devices names %d device%s", p->n_stages,
             p->n_stages == 1 ? "" : "s", n_specs, n_specs == 1 ? "" : "s");
    return -1;
  }
  return 0;
}

/* Loads stage `s` of local replica `r` into q->st[r * S + s]: its device,
 * regions, tensor tables, accumulators and flags.  0, or -1 with a
 * message. */
/* ZeRO: whether replica `rep` holds tensor i's values as its own (a
 * tensor of its shard, or of none). */
static bool zero_holds(const DuetPipe *q, int rep, int i) {
  const DuetProgram *p = q->p;
  return !p->zero || i < 0 || i >= p->n_tensors || p->tensor_shard[i] < 0 || p->tensor_shard[i] == rep;
}

static int stage_new(DuetPipe *q, int r, int k, const DuetDeviceSpec *spec, const DuetKernelFn *kernels,
                     const DuetConfig *cfg, int share, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  Stage *st = &q->st[r * q->S + k];
  const DuetStage *ps = &p->stages[k];
  st->q = q;
  st->id = k;
  st->lr = r;
  st->rep = q->r0 + r;
  if (q->R > 1) snprintf(st->who, sizeof st->who, "replica %d, stage %d", st->rep, k);
  else snprintf(st->who, sizeof st->who, "stage %d", k);
  st->threads = share;
  st->n_slots = q->schedule == DUET_SCHEDULE_1F1B ? (q->M < q->S - k ? q->M : q->S - k) : q->M;
  if (!(st->dev = duet_device_open(spec, p, kernels, 0, !cfg->quiet, err, errlen))) return -1;
  int64_t state_hi = ps->region_bytes[DUET_MEM_STATE];
  if (p->zero) { /* ZeRO: the span of the state tensors this replica holds */
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < p->n_tensors; i++) {
      const DuetTensor *t = &p->tensors[i];
      if (t->stage != k || t->region != DUET_MEM_STATE || !zero_holds(q, st->rep, i)) continue;
      if (t->offset < lo) lo = t->offset;
      if (t->offset + t->nbytes > hi) hi = t->offset + t->nbytes;
    }
    st->state_lo = lo < hi ? lo : 0;
    state_hi = lo < hi ? hi : 0;
  }
  for (int g = 1; g < DUET_MEM_COUNT; g++) {
    size_t b = (size_t)ps->region_bytes[g] * (g == DUET_MEM_ARENA ? (size_t)st->n_slots : 1);
    if (g == DUET_MEM_STATE && p->zero) b = (size_t)(state_hi - st->state_lo);
    if (g == DUET_MEM_STATE && q->offload) continue; /* in host memory (runtime/offload.c) */
    if (!(st->region[g] = st->dev->ops->alloc(st->dev, b))) {
      snprintf(err, errlen, "%s: %s", st->who, st->dev->err);
      return -1;
    }
    st->allocated += (int64_t)b;
  }
  if (!(st->tab = zalloc((size_t)st->n_slots * sizeof *st->tab)) ||
      !(st->acc_off = zalloc((size_t)(p->n_tensors + 1) * sizeof *st->acc_off)))
    goto oom;
  int64_t acc_bytes = 0;
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *t = &p->tensors[i];
    st->acc_off[i] = -1;
    if (t->stage != k) continue;
    if (t->region <= 0 || t->region >= DUET_MEM_COUNT || t->offset < 0 ||
        t->offset + t->nbytes > ps->region_bytes[t->region]) {
      snprintf(err, errlen, "tensor %s lies outside its planned region on stage %d", t->name, k);
      return -1;
    }
    /* one micro-batch per replica: its gradients are final where they are
     * (data parallelism; --offload optimizer, which copies them from there) */
    if (t->is_grad && !(q->M == 1 && (q->R > 1 || q->offload))) {
      st->acc_off[i] = acc_bytes;
      acc_bytes += (t->nbytes + 63) & ~(int64_t)63;
    }
  }
  st->host_mem = !strcmp(st->dev->ops->name, "cpu");
  st->dev_acc = st->dev->ops->accumulate != NULL && !q->host_sums;
  if (st->dev_acc) {
    if (!(st->acc = st->dev->ops->alloc(st->dev, (size_t)acc_bytes))) {
      snprintf(err, errlen, "%s: gradient accumulators: %s", st->who, st->dev->err);
      return -1;
    }
    st->allocated += acc_bytes;
  } else if (!(st->acc = zalloc((size_t)acc_bytes))) {
    goto oom;
  }
  int64_t max_grad = 0;
  for (int i = 0; i < p->n_tensors; i++)
    if (st->acc_off[i] >= 0 && p->tensors[i].nbytes > max_grad) max_grad = p->tensors[i].nbytes;
  if (!st->dev_acc && !st->host_mem && !(st->tmp = zalloc((size_t)max_grad))) goto oom;
  if (p->n_unscale > 0) { /* zeroed: flags of another stage's params stay 0 */
    size_t fb = (size_t)p->n_unscale * sizeof(int32_t);
    if (!(st->flags = zalloc(fb)) || !(st->flags_mb = zalloc(fb))) goto oom;
  }
  if (duet_flag_words(p) > 0) { /* the device's overflow flags and clipping doubles */
    if (!(st->overflow = st->dev->ops->alloc(st->dev, (size_t)duet_flag_words(p) * sizeof(int32_t)))) {
      snprintf(err, errlen, "%s: %s", st->who, st->dev->err);
      return -1;
    }
  }
  for (int sl = 0; sl < st->n_slots; sl++) {
    if (!(st->tab[sl] = zalloc((size_t)(p->n_tensors + 1) * sizeof **st->tab))) goto oom;
    st->tab[sl][p->n_tensors] = st->overflow;
    for (int i = 0; i < p->n_tensors; i++) {
      const DuetTensor *t = &p->tensors[i];
      if (t->stage != k) continue;
      size_t base = t->region == DUET_MEM_ARENA ? (size_t)sl * (size_t)ps->region_bytes[DUET_MEM_ARENA] : 0;
      if (t->region == DUET_MEM_STATE && q->offload) /* in host memory: set below */
        st->tab[sl][i] = NULL;
      else if (t->region == DUET_MEM_STATE && p->zero) /* ZeRO: another replica's state is not here */
        st->tab[sl][i] = zero_holds(q, st->rep, i) ? (char *)st->region[t->region] + (t->offset - st->state_lo) : NULL;
      else
        st->tab[sl][i] = (char *)st->region[t->region] + base + t->offset;
    }
  }
  if (q->offload) { /* the state and the master params in host memory, the update on the host */
    if (!(st->off = duet_offload_new(p, k, st->dev, st->region[DUET_MEM_PARAM], kernels, err, errlen))) return -1;
    for (int sl = 0; sl < st->n_slots; sl++)
      for (int i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].stage == k && p->tensors[i].region == DUET_MEM_STATE)
          st->tab[sl][i] = duet_offload_state(st->off, p->tensors[i].offset);
  }
  if (q->R > 1) { /* the stage's buckets, in order */
    if (!(st->buckets = zalloc((size_t)p->n_buckets * sizeof *st->buckets))) goto oom;
    int most = 0;
    for (int b = 0; b < p->n_buckets; b++) {
      int n = p->bucket_off[b + 1] - p->bucket_off[b];
      if (n > 0 && p->tensors[p->bucket_tensors[p->bucket_off[b]]].stage == k) st->buckets[st->n_buckets++] = b;
      if (n > most) most = n;
    }
    if (!(st->cbuf = zalloc((size_t)most * sizeof *st->cbuf))) goto oom;
  }
  if (p->zero) { /* the optimizer steps of this replica's shard, and the all-gathers */
    if (!(st->opt = zalloc((size_t)ps->n_opt * sizeof *st->opt)) ||
        !(st->gathers = zalloc((size_t)p->n_buckets * sizeof *st->gathers)))
      goto oom;
    for (int j = 0; j < ps->n_opt; j++) {
      const DuetStep *x = &ps->opt[j];
      bool mine = true;
      if (x->kind == DUET_STEP_KERNEL)
        for (int a = p->kernel_arg_off[x->kernel]; a < p->kernel_arg_off[x->kernel + 1]; a++)
          mine &= p->kernel_args[a] >= p->n_tensors || zero_holds(q, st->rep, p->kernel_args[a]);
      else if (x->kind == DUET_STEP_GEMM)
        mine = zero_holds(q, st->rep, x->a) && zero_holds(q, st->rep, x->b) && zero_holds(q, st->rep, x->c);
      if (mine) st->opt[st->n_opt++] = *x;
    }
  }
  return 0;
oom:
  snprintf(err, errlen, "out of host memory");
  return -1;
}

/* A data-parallel program's bucket table: each bucket non-empty, of
 * gradient tensors of one stage, every gradient in exactly one.  0, or -1
 * with a message (a program made by another duet). */
static int check_buckets(DuetPipe *q, char *err, size_t errlen) {
  const DuetProgram *p = q->p;
  if (!(q->bucket_of = zalloc((size_t)(p->n_tensors + 1) * sizeof *q->bucket_of))) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  for (int i = 0; i < p->n_tensors; i++) q->bucket_of[i] = -1;
  for (int b = 0; b < p->n_buckets; b++) {
    if (p->bucket_off[b + 1] <= p->bucket_off[b]) {
      snprintf(err, errlen, "all-reduce bucket %d is empty", b);
      return -1;
    }
    for (int j = p->bucket_off[b]; j < p->bucket_off[b + 1]; j++) {
      int i = p->bucket_tensors[j];
      if (i < 0 || i >= p->n_tensors || !p->tensors[i].is_grad || q->bucket_of[i] >= 0 ||
          p->tensors[i].stage != p->tensors[p->bucket_tensors[p->bucket_off[b]]].stage) {
        snprintf(err, errlen, "all-reduce bucket %d holds tensor %d, which is no gradient of its stage or is in bucket %d "
                 "too", b, i, i >= 0 && i < p->n_tensors ? q->bucket_of[i] : -1);
        return -1;
      }
      q->bucket_of[i] = b;
    }
  }
  if (p->zero) { /* ZeRO: each bucket's gradients grouped by shard, and their params */
    int R = q->R;
    if (!p->tensor_shard || !p->bucket_params || !(q->split = zalloc((size_t)p->n_buckets * (size_t)(R + 1) *
                                                                      sizeof *q->split))) {
      snprintf(err, errlen, p->tensor_shard && p->bucket_params ? "out of host memory"
                                                                : "a ZeRO program without its shard tables");
      return -1;
    }
    for (int b = 0; b < p->n_buckets; b++) {
      int *sp = q->split + (size_t)b * (size_t)(R + 1), k = 0, at = 0, prev = 0;
      for (int j = p->bucket_off[b]; j < p->bucket_off[b + 1]; j++, at++) {
        int g = p->bucket_tensors[j], pr = p->bucket_params[j], sh = p->tensor_shard[g];
        if (sh < prev || sh >= R || pr < 0 || pr >= p->n_tensors || p->tensor_shard[pr] != sh ||
            p->tensors[pr].nbytes != p->tensors[g].nbytes || p->tensors[pr].dtype != p->tensors[g].dtype) {
          snprintf(err, errlen, "bucket %d: gradient %s is not grouped by shard (%d of %d replicas) with a param of "
                   "its own", b, p->tensors[g].name, sh, R);
          return -1;
        }
        while (k <= sh) sp[k++] = at;
        prev = sh;
      }
      while (k <= R) sp[k++] = at;
    }
  }
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].is_grad && q->bucket_of[i] < 0) {
      snprintf(err, errlen, "gradient %s is in no all-reduce bucket of this %d-replica program", p->tensors[i].name,
               q->R);
      return -1;
    }
  return 0;
}

DuetPipe *duet_pipe_new(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg, char *err,
                        size_t errlen) {
  return duet_pipe_new_ranks(p, kernels, cfg, NULL, err, errlen);
}

DuetPipe *duet_pipe_new_ranks(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg,
                              DuetDist *dist, char *err, size_t errlen) {
  DuetDeviceSpec specs[DUET_MAX_DEVICES];
  int R = p->replicas > 1 ? p->replicas : 1;
  int L = dist ? 1 : R, r0 = dist ? duet_dist_rank(dist) : 0;
  if (dist && duet_dist_size(dist) != R) {
    snprintf(err, errlen, "this program was compiled for %d data-parallel replica%s and MPI started %d ranks (each "
             "rank is one replica: duet compile M.model --data-parallel %d, or mpirun -np %d)", R, R == 1 ? "" : "s",
             duet_dist_size(dist), duet_dist_size(dist), R);
    return NULL;
  }
  if (worker_devices(p, cfg, R, L, r0, specs, err, errlen)) return NULL;
  DuetPipe *q = zalloc(sizeof *q);
  if (!q) {
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  q->p = p;
  q->S = p->n_stages;
  q->R = R;
  q->L = L;
  q->r0 = r0;
  q->dist = dist;
  q->Mt = p->micro_batches > 0 ? p->micro_batches : 1;
  q->M = q->Mt / R;
  q->schedule = cfg->schedule;
  q->drop_t = q->drop_m = -1;
  q->offload = duet_offload_on(cfg);
  if (duet_offload_check(p, cfg, err, errlen)) {
    free(q);
    return NULL;
  }
  if (q->M < 1 || q->M * R != q->Mt) {
    snprintf(err, errlen, "%d micro-batches do not split among %d replicas", q->Mt, R);
    free(q);
    return NULL;
  }
  DuetPipeEnv env;
  if (duet_pipe_env(&env, cfg->timeout, err, errlen)) {
    free(q);
    return NULL;
  }
  q->timeout = env.timeout;
  q->force_host = env.force_host;
  q->host_sums = env.host_sums;
  q->profile = env.profile;
  q->drop_t = env.drop_t;
  q->drop_m = env.drop_m;
  q->drop_bucket = env.drop_bucket;
  q->collective = env.collective;
  if (pthread_mutex_init(&q->mu, NULL) || pthread_cond_init(&q->cv, NULL) || pthread_cond_init(&q->job_cv, NULL) ||
      pthread_cond_init(&q->done_cv, NULL)) {
    snprintf(err, errlen, "cannot create the pipeline's locks");
    free(q);
    return NULL;
  }
  q->sync_ok = true;
  int W = L * q->S;
  int share = duet_threads_per_device(cfg, W); /* recorded in checkpoints */
  const char *oom = "out of host memory";
  if (!(q->st = zalloc((size_t)W * sizeof *q->st))) goto fail_oom;
  if (!(q->losses = zalloc((size_t)R * (size_t)q->Mt * sizeof *q->losses))) goto fail_oom;
  q->clip_coef = 1.0;
  if (p->n_clip > 0 && !(q->clip_part = zalloc((size_t)R * (size_t)p->n_clip * sizeof *q->clip_part))) goto fail_oom;
  if (p->n_transfers > 0) {
    size_t nb = (size_t)L * (size_t)p->n_transfers * (size_t)q->M;
    if (!(q->xfer = zalloc((size_t)L * (size_t)p->n_transfers * sizeof *q->xfer)) ||
        !(q->posted = zalloc(nb * sizeof *q->posted)))
      goto fail_oom;
  }
  /* the global batch: Mt micro-batches */
  if (p->input_x >= 0 && !(q->host_x = zalloc((size_t)p->tensors[p->input_x].nbytes * (size_t)q->Mt))) goto fail_oom;
  if (p->input_y >= 0 && !(q->host_y = zalloc((size_t)p->tensors[p->input_y].nbytes * (size_t)q->Mt))) goto fail_oom;
  if (p->loss >= 0 && !(q->host_loss = zalloc((size_t)p->tensors[p->loss].nbytes))) goto fail_oom;
  if (p->metrics >= 0 && !(q->host_metrics = zalloc((size_t)p->tensors[p->metrics].nbytes))) goto fail_oom;
  if (R > 1 && check_buckets(q, err, errlen)) {
    duet_pipe_free(q);
    return NULL;
  }
  for (int r = 0; r < L; r++)
    for (int k = 0; k < q->S; k++)
      if (stage_new(q, r, k, &specs[r * q->S + k], kernels, cfg, share, err, errlen)) {
        duet_pipe_free(q);
        return NULL;
      }
  if (setup_transfers(q, err, errlen)) {
    duet_pipe_free(q);
    return NULL;
  }
  if (R > 1 && (dist ? rank_collective(q, specs, err, errlen) : make_collective(q, specs, err, errlen))) {
    duet_pipe_free(q);
    return NULL;
  }
  if (R > 1 && p->zero && (!q->coll->ops->reduce_scatter_start || !q->coll->ops->all_gather_start)) {
    snprintf(err, errlen, "--zero 1: the collective %s has no reduce-scatter and all-gather (a plugin of an older "
             "duet? DUET_MPI_PLUGIN)", q->coll->ops->name);
    duet_pipe_free(q);
    return NULL;
  }
  openblas_set_num_threads(share);
  for (int k = 0; k < W; k++) {
    if (pthread_create(&q->st[k].thread, NULL, worker, &q->st[k])) {
      snprintf(err, errlen, "cannot start the worker thread of %s", q->st[k].who);
      duet_pipe_free(q);
      return NULL;
    }
    q->st[k].started = true;
  }
  return q;
fail_oom:
  snprintf(err, errlen, "%s", oom);
  duet_pipe_free(q);
  return NULL;
}
