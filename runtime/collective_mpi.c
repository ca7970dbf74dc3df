#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
/* runtime/collective_mpi.c: the MPI implementation of the collective
 * interface (runtime/collective.h), built into the plugin libduet_mpi.so
 * (linked to libmpi; runtime/dist.c loads it only under an MPI launcher).
 * One rank is one replica.
 *
 * The sum is deterministic and the same bits on every rank, and equal to
 * the shared-memory collective's (runtime/collective.c): each element is
 * added in rank order 0, 1, ..., R-1, one rounding per add.  MPI_Allreduce
 * promises neither (an implementation may pick its algorithm, and so its
 * order of additions, by message size and may give ranks different bits:
 * MPI-4.0 section 6.9.1 only "advises" the same result on every rank), so
 * it is not used.  Instead, a reduce-scatter by pairwise exchange followed
 * by an all-gather (Rabenseifner's reduce-scatter + gather scheme; the
 * pairwise-exchange reduce-scatter of Thakur, Rabenseifner & Gropp,
 * "Optimization of Collective Communication Operations in MPICH", IJHPCA
 * 2005, section 4.5):
 *   - the call's buffers, packed end to end, are split into R contiguous
 *     chunks of elements (chunk k: the same bounds as the shared-memory
 *     collective's); chunk k belongs to rank k;
 *   - phase 1: every rank sends chunk k of its values to rank k (MPI_Isend)
 *     and receives its own chunk from every rank (MPI_Irecv); rank k then
 *     sums chunk k over the ranks in rank order;
 *   - phase 2: every rank sends its summed chunk to every other rank and
 *     receives theirs (an all-gather by the same pairwise messages).
 * Each rank sends and receives (R-1)/R of the bytes in each phase: 2(R-1)/R
 * x bytes in all, the ring all-reduce's volume (Patarasuk & Yuan 2009),
 * in R-1 messages per phase (latency grows with R, which suits the tens of
 * ranks data parallelism over CPUs and PCIe-linked GPUs means here).  The
 * same two phases are a reduce-scatter and an all-gather, what ZeRO stage
 * 1 needs: reduce_scatter_start runs phase 1 alone and all_gather_start
 * phase 2 alone, with the chunks cut at the caller's part boundaries
 * (chunk k: buffers split[k] .. split[k+1]-1) instead of evenly; the sum
 * of an element is the same rank-order sum.
 *
 * Everything is non-blocking (MPI_Isend/MPI_Irecv): allreduce_start posts
 * phase 1 at the bucket's step in the backward pass; progress (called by
 * the pipeline between backward steps) tests the requests, sums the chunk
 * and posts phase 2 as soon as phase 1 is complete, so both phases move
 * while the backward pass goes on (MPI's transports advance only inside
 * MPI calls); allreduce_wait, before the optimizer, finishes them.  Every
 * message carries the tag 2 x tag + phase on the collective's own
 * communicator (MPI_Comm_dup: operations of different tags, from different
 * pipeline stages, may interleave; messages of one tag from one rank
 * arrive in order, MPI's non-overtaking rule).  A received size other than
 * the one expected is an error naming the rank (mismatched buffers).
 *
 * Faults: the communicator has MPI_ERRORS_RETURN, so an MPI error is a
 * message, not an abort inside MPI.  A wait tests its requests with
 * MPI_Test and gives up after `timeout` seconds (DUET_PIPE_TIMEOUT)
 * naming the lowest rank whose message has not arrived, or, once this
 * rank has been told to stop by SIGINT or SIGTERM (*stop), after
 * DUET_DIST_STOP_GRACE more seconds (Open MPI's mpirun signals every rank
 * when one dies, then kills them 1 s later: see runtime/dist.h).  The
 * training driver then prints the error and calls MPI_Abort.  But MPI
 * itself may not return: with Open MPI 4.1's TCP transport, a rank whose
 * connection to a dead rank broke while data was in flight can stay
 * inside MPI_Test (its help text says the process "may even hang").  So
 * each collective has a watchdog thread that makes no MPI call but
 * MPI_Abort: every 50 ms it looks at the waits in progress and, when one
 * is past the same deadlines (plus WATCH_MARGIN, so that a wait that can
 * still report does so itself, with its context), prints the error naming
 * the rank and aborts.  One report per process (the first to claim it).
 *
 * Threads: MPI is initialised with MPI_THREAD_SERIALIZED and every MPI
 * call of this file is made under one lock (the pipeline's stage threads
 * and the driver's thread all call in); no call blocks inside MPI while
 * holding it (waits are MPI_Test loops). */
#include <inttypes.h>
#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist.h"

#define EXPORT __attribute__((visibility("default")))

/* The one lock around MPI (and the collectives' state). */
static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;

enum { OP_IDLE, OP_EXCHANGE, OP_GATHER, OP_DONE, OP_FAILED };
enum { KIND_ALLREDUCE, KIND_REDUCE_SCATTER, KIND_ALL_GATHER };

/* One tag's operation in flight. */
typedef struct Op {
  int phase;          /* OP_* */
  bool bcast;         /* a broadcast (one phase), else an all-reduce (or kind's) */
  int kind;           /* KIND_*: an all-reduce, or ZeRO's reduce-scatter (phase 1) or all-gather (phase 2) */
  int root;
  DuetDevice *dev;    /* NULL: host memory */
  DuetCollBuf *b;     /* the call's buffers (a copy) */
  int n, cap;
  char *pk;           /* the packed buffers (or the one host buffer itself) */
  bool pk_own;        /* pk is own storage (else: b[0].ptr) */
  char *own;          /* pk's storage */
  size_t own_cap;
  char *rv;           /* phase 1: the R parts of this rank's chunk */
  size_t rv_cap;
  size_t *cb;         /* [R + 1] byte offsets of the chunks in pk */
  int64_t *ce;        /* [R + 1] element offsets of the chunks */
  MPI_Request *rq;    /* [2 R]: receives from rank j at j, sends to j at R + j */
  double t0, t_wait;  /* the start; the waits' blocked time */
  char err[1024];
  /* what the watchdog sees (under Mpi.wmu) */
  bool waiting;       /* a wait is in progress */
  double w_t0;        /* since when */
  int w_late, w_phase; /* the rank waited for and the phase, as of the last test */
} Op;

typedef struct Mpi {
  MPI_Comm comm;
  int R, me, n_tags;
  Op *ops;            /* n_tags + 2: the user's, then the barrier's and the broadcast's */
  double timeout;
  const volatile sig_atomic_t *stop;
  bool aborted;
  char why[400];
  /* stats per tag */
  int64_t *calls, *bytes;
  double *busy, *waited;
  int in_flight;        /* operations of the user's tags in flight */
  double flight_t0, flight_s; /* since when; the seconds with any in flight */
  /* faults: the watchdog (see the header) */
  pthread_mutex_t wmu;
  pthread_cond_t wcv;
  pthread_t wth;
  bool w_sync, w_started, w_quit;
  bool claimed;       /* a fault has been reported (by a wait or the watchdog) */
  double stop_seen;   /* when *stop was first seen non-zero (-1: not yet) */
} Mpi;

/* How much later than a wait's own deadline the watchdog reports it. */
#define WATCH_MARGIN 0.15

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t esz(int dtype) { return dtype == DUET_F64 ? 8 : 4; }

/* MPI's message for error code e. */
static void mpi_msg(int e, char *out, size_t n) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(e, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", e);
  snprintf(out, n, "%s", s);
}

/* Byte offset, in the buffers packed end to end, of element e (0 ..
 * total). */
static size_t byte_at(const DuetCollBuf *b, int n, int64_t e) {
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    if (e <= b[i].n) return off + (size_t)e * esz(b[i].dtype);
    off += (size_t)b[i].n * esz(b[i].dtype);
    e -= b[i].n;
  }
  return off;
}

/* Elements [lo, hi) of the packed buffers, summed over the R parts part[k]
 * (each holding those elements of rank k, packed from byte byte_at(lo)) in
 * rank order, written to dst (laid out the same). */
static void sum_parts(const Op *o, int R, const char *const *part, char *dst, int64_t lo, int64_t hi) {
  int64_t at = 0;
  size_t off = 0; /* bytes into the chunk */
  for (int i = 0; i < o->n && at < hi; i++) {
    int64_t a = lo > at ? lo - at : 0, z = hi - at < o->b[i].n ? hi - at : o->b[i].n;
    at += o->b[i].n;
    if (a >= z) continue;
    int64_t cnt = z - a;
    int dt = o->b[i].dtype;
    if (dt == DUET_F32) {
      float *d = (float *)(dst + off);
      for (int64_t e = 0; e < cnt; e++) {
        float x = ((const float *)(part[0] + off))[e];
        for (int k = 1; k < R; k++) x += ((const float *)(part[k] + off))[e];
        d[e] = x;
      }
    } else if (dt == DUET_F64) { /* packed after f32 values: maybe only 4-byte aligned */
      for (int64_t e = 0; e < cnt; e++) {
        double x, y;
        memcpy(&x, part[0] + off + (size_t)e * 8, 8);
        for (int k = 1; k < R; k++) {
          memcpy(&y, part[k] + off + (size_t)e * 8, 8);
          x += y;
        }
        memcpy(dst + off + (size_t)e * 8, &x, 8);
      }
    } else { /* i32 flags and counts: wrapping, as the shared-memory sum */
      uint32_t *d = (uint32_t *)(dst + off);
      for (int64_t e = 0; e < cnt; e++) {
        uint32_t x = ((const uint32_t *)(part[0] + off))[e];
        for (int k = 1; k < R; k++) x += ((const uint32_t *)(part[k] + off))[e];
        d[e] = x;
      }
    }
    off += (size_t)cnt * esz(dt);
  }
}

/* Posts receives of n4 4-byte words from rank j into buf (phase tag t). */
static int post_recv(Mpi *m, Op *o, int j, void *buf, size_t bytes, int t) {
  int e = MPI_Irecv(buf, (int)(bytes / 4), MPI_UINT32_T, j, t, m->comm, &o->rq[j]);
  if (e != MPI_SUCCESS) {
    char s[MPI_MAX_ERROR_STRING];
    mpi_msg(e, s, sizeof s);
    snprintf(o->err, sizeof o->err, "MPI_Irecv from rank %d: %s", j, s);
    return -1;
  }
  return 0;
}

static int post_send(Mpi *m, Op *o, int j, const void *buf, size_t bytes, int t) {
  int e = MPI_Isend(buf, (int)(bytes / 4), MPI_UINT32_T, j, t, m->comm, &o->rq[m->R + j]);
  if (e != MPI_SUCCESS) {
    char s[MPI_MAX_ERROR_STRING];
    mpi_msg(e, s, sizeof s);
    snprintf(o->err, sizeof o->err, "MPI_Isend to rank %d: %s", j, s);
    return -1;
  }
  return 0;
}

/* Tests the op's requests; *done when all are complete.  Checks each
 * completed receive's size (want[j] bytes from rank j).  -1 with o->err. */
static int test_all(Mpi *m, Op *o, const size_t *want, bool *done) {
  *done = true;
  for (int k = 0; k < 2 * m->R; k++) {
    if (o->rq[k] == MPI_REQUEST_NULL) continue;
    int flag = 0;
    MPI_Status st;
    int e = MPI_Test(&o->rq[k], &flag, &st);
    if (e != MPI_SUCCESS) {
      char s[MPI_MAX_ERROR_STRING];
      mpi_msg(e, s, sizeof s);
      snprintf(o->err, sizeof o->err, "MPI_Test of the %s rank %d: %s", k < m->R ? "message from" : "message to",
               k % m->R, s);
      return -1;
    }
    if (!flag) {
      *done = false;
      continue;
    }
    if (k < m->R && want) {
      int cnt = 0;
      MPI_Get_count(&st, MPI_UINT32_T, &cnt);
      if ((size_t)cnt * 4 != want[k]) {
        snprintf(o->err, sizeof o->err, "rank %d sent %zu bytes where %zu were expected (the ranks' buffers differ: "
                 "different programs?)", k, (size_t)cnt * 4, want[k]);
        return -1;
      }
    }
  }
  return 0;
}

/* The lowest rank whose message to this rank has not arrived (-1: none). */
static int late_rank(const Mpi *m, const Op *o) {
  for (int j = 0; j < m->R; j++)
    if (o->rq[j] != MPI_REQUEST_NULL) return j;
  return -1;
}

/* After phase 1: this rank's chunk summed over the ranks' parts (in rank
 * order) into pk.  -1 with o->err. */
static int sum_mine(Mpi *m, Op *o) {
  int R = m->R, me = m->me;
  size_t mine = o->cb[me + 1] - o->cb[me];
  const char **part = malloc((size_t)R * sizeof *part);
  if (!part) {
    snprintf(o->err, sizeof o->err, "out of host memory");
    return -1;
  }
  for (int k = 0; k < R; k++) part[k] = k == me ? o->pk + o->cb[me] : o->rv + (size_t)k * mine;
  sum_parts(o, R, part, o->pk + o->cb[me], o->ce[me], o->ce[me + 1]);
  free(part);
  return 0;
}

/* Phase 2: this rank's chunk (summed, for an all-reduce) sent to every
 * rank while theirs are received into pk.  -1 with o->err. */
static int start_gather(Mpi *m, Op *o, int t) {
  int R = m->R, me = m->me;
  size_t mine = o->cb[me + 1] - o->cb[me];
  if (o->kind == KIND_ALLREDUCE && sum_mine(m, o)) return -1;
  for (int j = 0; j < R; j++) {
    if (j == me) continue;
    if (post_recv(m, o, j, o->pk + o->cb[j], o->cb[j + 1] - o->cb[j], 2 * t + 1) ||
        post_send(m, o, j, o->pk + o->cb[me], mine, 2 * t + 1))
      return -1;
  }
  o->phase = OP_GATHER;
  return 0;
}

/* The received chunk sizes of the op's current phase, for test_all. */
static void wanted(const Mpi *m, const Op *o, size_t *want) {
  for (int j = 0; j < m->R; j++) {
    if (o->bcast) want[j] = o->cb[m->R];
    else if (o->phase == OP_EXCHANGE) want[j] = o->cb[m->me + 1] - o->cb[m->me];
    else want[j] = o->cb[j + 1] - o->cb[j];
  }
}

/* Writes the result back into the caller's buffers (device memory
 * through copy_to_device).  -1 with o->err. */
static int unpack(Op *o) {
  if (!o->pk_own) return 0;
  size_t off = 0;
  for (int i = 0; i < o->n; i++) {
    size_t nb = (size_t)o->b[i].n * esz(o->b[i].dtype);
    if (o->dev) {
      if (nb && o->dev->ops->copy_to_device(o->dev, o->b[i].ptr, o->pk + off, nb)) {
        snprintf(o->err, sizeof o->err, "copying buffer %d back to the device: %s", i, o->dev->err);
        return -1;
      }
    } else if (nb) {
      memcpy(o->b[i].ptr, o->pk + off, nb);
    }
    off += nb;
  }
  return 0;
}

/* Under mpi_mu: moves op t on as far as its messages allow. -1 with
 * o->err (the op failed). */
static int advance(Mpi *m, int t) {
  Op *o = &m->ops[t];
  if (o->phase != OP_EXCHANGE && o->phase != OP_GATHER) return 0;
  size_t w[DUET_MAX_DEVICES]; /* coll_new checks R <= DUET_MAX_DEVICES */
  int rc = 0;
  for (;;) {
    bool done;
    wanted(m, o, w);
    if (test_all(m, o, w, &done)) {
      rc = -1;
      break;
    }
    if (!done) break;
    if (o->phase == OP_EXCHANGE && !o->bcast && o->kind == KIND_REDUCE_SCATTER) { /* phase 1 only */
      if (sum_mine(m, o)) {
        rc = -1;
        break;
      }
    } else if (o->phase == OP_EXCHANGE && !o->bcast) {
      if (start_gather(m, o, t)) {
        rc = -1;
        break;
      }
      continue; /* the gather may be complete at once (one rank) */
    }
    if (unpack(o)) {
      rc = -1;
      break;
    }
    o->phase = OP_DONE;
    if (t < m->n_tags) {
      double now = now_s();
      m->calls[t]++;
      m->busy[t] += now - o->t0;
      if (m->in_flight > 0 && --m->in_flight == 0) m->flight_s += now - m->flight_t0;
    }
    break;
  }
  if (rc) o->phase = OP_FAILED;
  return rc;
}

/* Copies the call's buffer list and packs the values (device memory
 * through copy_to_host); chunk bounds as the shared-memory collective's.
 * copy_in: the values are needed (not for a broadcast's receivers).  -1
 * with o->err. */
static int take(Mpi *m, Op *o, DuetDevice *dev, const DuetCollBuf *b, int n, const int *split, bool copy_in) {
  if (n < 0) {
    snprintf(o->err, sizeof o->err, "%d buffers", n);
    return -1;
  }
  if (n > o->cap) {
    int cap = n > 2 * o->cap ? n : 2 * o->cap;
    DuetCollBuf *nb = realloc(o->b, (size_t)cap * sizeof *nb);
    if (!nb) {
      snprintf(o->err, sizeof o->err, "out of host memory");
      return -1;
    }
    o->b = nb;
    o->cap = cap;
  }
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    if ((b[i].dtype != DUET_F32 && b[i].dtype != DUET_F64 && b[i].dtype != DUET_I32) || b[i].n < 0) {
      snprintf(o->err, sizeof o->err, "buffer %d: %" PRId64 " elements of dtype %d (f32, f64 and i32 are summed)", i,
               b[i].n, b[i].dtype);
      return -1;
    }
    total += b[i].n;
  }
  if (n) memcpy(o->b, b, (size_t)n * sizeof *b);
  o->n = n;
  o->dev = dev;
  size_t bytes = byte_at(b, n, total);
  if (bytes / 4 > (size_t)INT32_MAX) {
    snprintf(o->err, sizeof o->err, "%zu bytes in one operation: more than MPI's int count of 4-byte words", bytes);
    return -1;
  }
  int R = m->R;
  for (int k = 0; k <= R; k++) {
    o->ce[k] = total / R * k + (k < total % R ? k : total % R);
    if (split) { /* ZeRO: the caller's parts of whole buffers */
      if (split[k] < (k ? split[k - 1] : 0) || split[k] > n || (k == 0 && split[0]) || (k == R && split[R] != n)) {
        snprintf(o->err, sizeof o->err, "the parts of %d buffers among %d ranks are not in order", n, R);
        return -1;
      }
      o->ce[k] = 0;
      for (int i = 0; i < split[k]; i++) o->ce[k] += b[i].n;
    }
    o->cb[k] = byte_at(b, n, o->ce[k]);
  }
  o->pk_own = !(n == 1 && !dev);
  if (!o->pk_own) {
    o->pk = b[0].ptr;
    return 0;
  }
  if (bytes > o->own_cap) {
    char *p = realloc(o->own, bytes);
    if (!p) {
      snprintf(o->err, sizeof o->err, "out of host memory (%zu bytes of staging)", bytes);
      return -1;
    }
    o->own = p;
    o->own_cap = bytes;
  }
  o->pk = o->own;
  size_t off = 0;
  for (int i = 0; copy_in && i < n; i++) {
    size_t nb = (size_t)b[i].n * esz(b[i].dtype);
    if (dev) {
      if (nb && dev->ops->copy_to_host(dev, o->pk + off, b[i].ptr, nb)) {
        snprintf(o->err, sizeof o->err, "copying buffer %d to the host: %s", i, dev->err);
        return -1;
      }
    } else if (nb) {
      memcpy(o->pk + off, b[i].ptr, nb);
    }
    off += nb;
  }
  return 0;
}

static int check_args(Mpi *m, int rank, int t, char *err, size_t errlen) {
  if (rank != m->me || t < 0 || t >= m->n_tags + 2) {
    snprintf(err, errlen, "rank %d (this process is rank %d) or tag %d out of range", rank, m->me, t);
    return -1;
  }
  return 0;
}

/* Under mpi_mu: the start of an all-reduce (bcast false) or a broadcast
 * from root on op t. */
static int start_locked(Mpi *m, int t, bool bcast, int root, DuetDevice *dev, const DuetCollBuf *b, int n,
                        int kind, const int *split, char *err, size_t errlen) {
  Op *o = &m->ops[t];
  if (m->aborted) {
    snprintf(err, errlen, "aborted: %s", m->why);
    return -1;
  }
  if (o->phase != OP_IDLE) {
    snprintf(err, errlen, "tag %d started again before its wait", t);
    return -1;
  }
  o->bcast = bcast;
  o->kind = kind;
  o->root = root;
  o->t0 = now_s();
  o->t_wait = 0;
  o->err[0] = 0;
  int R = m->R, me = m->me;
  for (int k = 0; k < 2 * R; k++) o->rq[k] = MPI_REQUEST_NULL;
  if (take(m, o, dev, b, n, split, !bcast || me == root)) goto fail;
  if (bcast) {
    size_t all = o->cb[R];
    if (me == root) {
      for (int j = 0; j < R; j++)
        if (j != me && post_send(m, o, j, o->pk, all, 2 * t)) goto fail;
    } else if (post_recv(m, o, root, o->pk, all, 2 * t)) {
      goto fail;
    }
    if (t < m->n_tags) m->bytes[t] += me == root ? (int64_t)(all * (size_t)(R - 1)) : 0;
  } else if (kind == KIND_ALL_GATHER) { /* phase 2 alone: this rank's part to every rank */
    size_t mine = o->cb[me + 1] - o->cb[me];
    o->phase = OP_EXCHANGE; /* start_gather moves it to OP_GATHER */
    if (start_gather(m, o, t)) goto fail;
    if (t < m->n_tags) m->bytes[t] += (int64_t)(mine * (size_t)(R - 1));
  } else {
    size_t mine = o->cb[me + 1] - o->cb[me];
    if ((size_t)R * mine > o->rv_cap) {
      char *p = realloc(o->rv, (size_t)R * mine);
      if (!p) {
        snprintf(o->err, sizeof o->err, "out of host memory");
        goto fail;
      }
      o->rv = p;
      o->rv_cap = (size_t)R * mine;
    }
    for (int j = 0; j < R; j++) {
      if (j == me) continue;
      if (post_recv(m, o, j, o->rv + (size_t)j * mine, mine, 2 * t) ||
          post_send(m, o, j, o->pk + o->cb[j], o->cb[j + 1] - o->cb[j], 2 * t))
        goto fail;
    }
    if (t < m->n_tags) m->bytes[t] += (int64_t)((kind == KIND_ALLREDUCE ? 2 : 1) * (o->cb[R] - mine));
  }
  if (kind != KIND_ALL_GATHER) o->phase = OP_EXCHANGE;
  if (t < m->n_tags && m->in_flight++ == 0) m->flight_t0 = o->t0;
  if (advance(m, t)) goto fail; /* one rank: complete at once */
  return 0;
fail:
  o->phase = OP_FAILED;
  snprintf(err, errlen, "%s", o->err);
  return -1;
}

/* Under m->wmu: which deadline op o's wait (since t0) is past at `now`,
 * `margin` seconds late: 0 none, 1 the grace after a stop signal, 2 the
 * timeout.  Notes when the stop signal is first seen. */
static int fault_due(Mpi *m, double t0, double now, double margin) {
  if (m->stop && *m->stop && m->stop_seen < 0) m->stop_seen = now;
  if (m->stop_seen >= 0 && now - m->stop_seen >= DUET_DIST_STOP_GRACE + margin) return 1;
  if (now - t0 >= m->timeout + margin) return 2;
  return 0;
}

/* The message of a fault of kind `due` (fault_due) in a wait for rank
 * `late` in `phase`. */
static void fault_msg(const Mpi *m, int due, bool bcast, int phase, int late, double waited, double now, char *err,
                      size_t errlen) {
  const char *what = bcast ? "the broadcast" : phase == OP_EXCHANGE ? "its part of the sum" : "its share of the sums";
  if (due == 1)
    snprintf(err, errlen, "rank %d stopped answering: %s has not arrived in %.2f s, and this rank was told to stop "
             "(signal %d) %.2f s ago (an MPI launcher signals every rank when one dies; see its message)", late, what,
             waited, m->stop ? (int)*m->stop : 0, now - m->stop_seen);
  else
    snprintf(err, errlen, "timed out after %.3g s waiting for rank %d (%s has not arrived; it may have died or hung: "
             "raise DUET_PIPE_TIMEOUT if a rank is legitimately this slow)", m->timeout, late, what);
}

/* Waits for op t: MPI_Test until it is done, the timeout, an abort, or the
 * grace after a stop signal.  The op is idle again afterwards. */
static int wait_op(Mpi *m, int t, char *err, size_t errlen) {
  Op *o = &m->ops[t];
  double t0 = now_s();
  int spins = 0, rc = 0;
  pthread_mutex_lock(&mpi_mu);
  if (o->phase == OP_IDLE) {
    pthread_mutex_unlock(&mpi_mu);
    snprintf(err, errlen, "tag %d waited for without a start", t);
    return -1;
  }
  pthread_mutex_lock(&m->wmu);
  o->waiting = true;
  o->w_t0 = t0;
  o->w_late = late_rank(m, o);
  o->w_phase = o->phase;
  pthread_mutex_unlock(&m->wmu);
  for (;;) {
    if (o->phase == OP_EXCHANGE || o->phase == OP_GATHER) advance(m, t);
    if (o->phase == OP_DONE) break;
    if (o->phase == OP_FAILED) {
      snprintf(err, errlen, "%s", o->err);
      rc = -1;
      break;
    }
    if (m->aborted) {
      snprintf(err, errlen, "aborted: %s", m->why);
      rc = -1;
      break;
    }
    double now = now_s();
    int late = late_rank(m, o);
    pthread_mutex_lock(&m->wmu);
    o->w_late = late;
    o->w_phase = o->phase;
    int due = fault_due(m, t0, now, 0);
    if (due) {
      m->claimed = true; /* the watchdog stays quiet (it reports only what no wait could) */
      fault_msg(m, due, o->bcast, o->phase, late, now - t0, now, err, errlen);
    }
    pthread_mutex_unlock(&m->wmu);
    if (due) {
      rc = -1;
      break;
    }
    pthread_mutex_unlock(&mpi_mu);
    if (++spins > 200) { /* after ~200 quick tests, let the cores go */
      struct timespec ts = {0, spins > 2000 ? 200000 : 20000};
      nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&mpi_mu);
  }
  pthread_mutex_lock(&m->wmu);
  o->waiting = false;
  pthread_mutex_unlock(&m->wmu);
  double blocked = now_s() - t0;
  if (t < m->n_tags && rc == 0) m->waited[t] += blocked;
  if (rc == 0) o->phase = OP_IDLE;
  else o->phase = OP_FAILED;
  pthread_mutex_unlock(&mpi_mu);
  return rc;
}

static void mpi_abort_all(int code);

/* The watchdog (see the header): every 50 ms, a wait past its deadline by
 * WATCH_MARGIN is one stuck inside MPI; it is reported here and the job
 * aborted. */
static void *watchdog(void *arg) {
  Mpi *m = arg;
  pthread_mutex_lock(&m->wmu);
  while (!m->w_quit) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 50000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&m->wcv, &m->wmu, &dl);
    if (m->w_quit || m->claimed) continue;
    double now = now_s();
    for (int t = 0; t < m->n_tags + 2; t++) {
      Op *o = &m->ops[t];
      int due = o->waiting ? fault_due(m, o->w_t0, now, WATCH_MARGIN) : 0;
      if (!due) continue;
      char msg[1024];
      m->claimed = true;
      fault_msg(m, due, o->bcast, o->w_phase, o->w_late, now - o->w_t0, now, msg, sizeof msg);
      pthread_mutex_unlock(&m->wmu);
      fprintf(stderr, "duet: error: MPI collective (tag %d) of rank %d: %s; MPI did not return from MPI_Test, so this "
              "is reported by the collective's watchdog\n", t, m->me, msg);
      fflush(stderr);
      mpi_abort_all(1);
    }
  }
  pthread_mutex_unlock(&m->wmu);
  return NULL;
}

static int mpi_allreduce_start(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n, char *err,
                               size_t errlen) {
  Mpi *m = c->ctx;
  if (check_args(m, rank, tag, err, errlen)) return -1;
  if (tag >= m->n_tags) {
    snprintf(err, errlen, "tag %d out of range", tag);
    return -1;
  }
  pthread_mutex_lock(&mpi_mu);
  int rc = start_locked(m, tag, false, 0, dev, b, n, KIND_ALLREDUCE, NULL, err, errlen);
  pthread_mutex_unlock(&mpi_mu);
  return rc;
}

/* ZeRO stage 1: phase 1 alone (reduce-scatter) or phase 2 alone
 * (all-gather) over the caller's parts (runtime/collective.h). */
static int zero_start(DuetColl *c, int kind, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                      const int *split, char *err, size_t errlen) {
  Mpi *m = c->ctx;
  if (check_args(m, rank, tag, err, errlen)) return -1;
  if (tag >= m->n_tags || !split) {
    snprintf(err, errlen, "tag %d out of range, or no parts", tag);
    return -1;
  }
  pthread_mutex_lock(&mpi_mu);
  int rc = start_locked(m, tag, false, 0, dev, b, n, kind, split, err, errlen);
  pthread_mutex_unlock(&mpi_mu);
  return rc;
}

static int mpi_reduce_scatter_start(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                                    const int *split, char *err, size_t errlen) {
  return zero_start(c, KIND_REDUCE_SCATTER, rank, tag, dev, b, n, split, err, errlen);
}

static int mpi_all_gather_start(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                                const int *split, char *err, size_t errlen) {
  return zero_start(c, KIND_ALL_GATHER, rank, tag, dev, b, n, split, err, errlen);
}

static int mpi_allreduce_wait(DuetColl *c, int rank, int tag, char *err, size_t errlen) {
  Mpi *m = c->ctx;
  if (check_args(m, rank, tag, err, errlen)) return -1;
  return wait_op(m, tag, err, errlen);
}

static int mpi_broadcast(DuetColl *c, int rank, int root, DuetDevice *dev, const DuetCollBuf *b, int n, char *err,
                         size_t errlen) {
  Mpi *m = c->ctx;
  int t = m->n_tags + 1;
  if (check_args(m, rank, t, err, errlen)) return -1;
  if (root < 0 || root >= m->R) {
    snprintf(err, errlen, "root %d out of range", root);
    return -1;
  }
  pthread_mutex_lock(&mpi_mu);
  int rc = start_locked(m, t, true, root, dev, b, n, KIND_ALLREDUCE, NULL, err, errlen);
  pthread_mutex_unlock(&mpi_mu);
  return rc ? rc : wait_op(m, t, err, errlen);
}

/* A barrier: an all-reduce of nothing (every rank exchanges an empty
 * message with every other). */
static int mpi_barrier(DuetColl *c, int rank, char *err, size_t errlen) {
  Mpi *m = c->ctx;
  int t = m->n_tags;
  if (check_args(m, rank, t, err, errlen)) return -1;
  pthread_mutex_lock(&mpi_mu);
  int rc = start_locked(m, t, false, 0, NULL, NULL, 0, KIND_ALLREDUCE, NULL, err, errlen);
  pthread_mutex_unlock(&mpi_mu);
  return rc ? rc : wait_op(m, t, err, errlen);
}

static void mpi_coll_abort(DuetColl *c, const char *why) {
  Mpi *m = c->ctx;
  pthread_mutex_lock(&mpi_mu);
  if (!m->aborted) {
    m->aborted = true;
    snprintf(m->why, sizeof m->why, "%s", why);
  }
  pthread_mutex_unlock(&mpi_mu);
}

static int mpi_progress(DuetColl *c, int rank, char *err, size_t errlen) {
  Mpi *m = c->ctx;
  (void)rank;
  int rc = 0;
  pthread_mutex_lock(&mpi_mu);
  for (int t = 0; t < m->n_tags; t++)
    if ((m->ops[t].phase == OP_EXCHANGE || m->ops[t].phase == OP_GATHER) && advance(m, t) && !rc) {
      snprintf(err, errlen, "%s", m->ops[t].err);
      rc = -1;
    }
  pthread_mutex_unlock(&mpi_mu);
  return rc;
}

static void mpi_stats(DuetColl *c, int tag, int64_t *calls, int64_t *bytes, double *busy_s, double *wait_s) {
  Mpi *m = c->ctx;
  bool ok = tag >= 0 && tag < m->n_tags;
  pthread_mutex_lock(&mpi_mu);
  *calls = ok ? m->calls[tag] : 0;
  *bytes = ok ? m->bytes[tag] : 0;
  *busy_s = ok ? m->busy[tag] : 0;
  *wait_s = ok ? m->waited[tag] : 0;
  if (tag == -1) {
    for (int t = 0; t < m->n_tags; t++)
      *calls += m->calls[t], *bytes += m->bytes[t], *wait_s += m->waited[t];
    *busy_s = m->flight_s + (m->in_flight > 0 ? now_s() - m->flight_t0 : 0);
  }
  pthread_mutex_unlock(&mpi_mu);
}

static void mpi_destroy(DuetColl *c) {
  if (!c) return;
  Mpi *m = c->ctx;
  if (m) {
    if (m->w_started) {
      pthread_mutex_lock(&m->wmu);
      m->w_quit = true;
      pthread_cond_broadcast(&m->wcv);
      pthread_mutex_unlock(&m->wmu);
      pthread_join(m->wth, NULL);
    }
    if (m->w_sync) {
      pthread_mutex_destroy(&m->wmu);
      pthread_cond_destroy(&m->wcv);
    }
    pthread_mutex_lock(&mpi_mu);
    bool clean = !m->aborted;
    for (int t = 0; m->ops && t < m->n_tags + 2; t++) {
      Op *o = &m->ops[t];
      for (int k = 0; o->rq && k < 2 * m->R; k++)
        if (o->rq[k] != MPI_REQUEST_NULL) { /* a failed run: the requests are dropped */
          if (k < m->R) MPI_Cancel(&o->rq[k]);
          MPI_Request_free(&o->rq[k]);
          clean = false;
        }
      free(o->b);
      free(o->own);
      free(o->rv);
      free(o->cb);
      free(o->ce);
      free(o->rq);
    }
    free(m->ops);
    free(m->calls);
    free(m->bytes);
    free(m->busy);
    free(m->waited);
    /* MPI_Comm_free is collective: only when every rank got here in step */
    if (clean && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    pthread_mutex_unlock(&mpi_mu);
    free(m);
  }
  free(c);
}

static const DuetCollOps mpi_ops = {
    .name = "MPI",
    .allreduce_start = mpi_allreduce_start,
    .allreduce_wait = mpi_allreduce_wait,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .abort = mpi_coll_abort,
    .reduce_scatter_start = mpi_reduce_scatter_start,
    .all_gather_start = mpi_all_gather_start,
    .destroy = mpi_destroy,
    .progress = mpi_progress,
    .stats = mpi_stats,
};

static DuetColl *mpi_coll_new(int n_tags, double timeout, const volatile sig_atomic_t *stop, char *err, size_t errlen) {
  if (n_tags < 0 || !(timeout > 0) || n_tags > 1000000) {
    snprintf(err, errlen, "a collective of %d tags, timeout %g s", n_tags, timeout);
    return NULL;
  }
  DuetColl *c = calloc(1, sizeof *c);
  Mpi *m = calloc(1, sizeof *m);
  if (!c || !m) {
    free(c);
    free(m);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  c->ops = &mpi_ops;
  c->ctx = m;
  m->comm = MPI_COMM_NULL;
  m->n_tags = n_tags;
  m->timeout = timeout;
  m->stop = stop;
  m->stop_seen = -1;
  if (pthread_mutex_init(&m->wmu, NULL)) {
    free(c);
    free(m);
    snprintf(err, errlen, "cannot create the collective's watchdog lock");
    return NULL;
  }
  if (pthread_cond_init(&m->wcv, NULL)) {
    pthread_mutex_destroy(&m->wmu);
    free(c);
    free(m);
    snprintf(err, errlen, "cannot create the collective's watchdog lock");
    return NULL;
  }
  m->w_sync = true;
  pthread_mutex_lock(&mpi_mu);
  int e = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
  if (e == MPI_SUCCESS) e = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  if (e == MPI_SUCCESS) e = MPI_Comm_rank(m->comm, &m->me);
  if (e == MPI_SUCCESS) e = MPI_Comm_size(m->comm, &m->R);
  int ub_ok = 0;
  void *ub = NULL;
  if (e == MPI_SUCCESS) e = MPI_Comm_get_attr(m->comm, MPI_TAG_UB, &ub, &ub_ok);
  pthread_mutex_unlock(&mpi_mu);
  c->n_ranks = m->R;
  if (e == MPI_SUCCESS && m->R > DUET_MAX_DEVICES) {
    snprintf(err, errlen, "%d ranks: at most %d data-parallel replicas", m->R, DUET_MAX_DEVICES);
    mpi_destroy(c);
    return NULL;
  }
  if (e != MPI_SUCCESS) {
    char s[MPI_MAX_ERROR_STRING];
    mpi_msg(e, s, sizeof s);
    snprintf(err, errlen, "making the collective's communicator: %s", s);
    mpi_destroy(c);
    return NULL;
  }
  if (ub_ok && ub && 2 * (int64_t)(n_tags + 2) > *(int *)ub) {
    snprintf(err, errlen, "%d all-reduce tags need MPI tags up to %d; this MPI allows %d (use a larger --bucket-mb)",
             n_tags, 2 * (n_tags + 2), *(int *)ub);
    mpi_destroy(c);
    return NULL;
  }
  size_t T = (size_t)n_tags + 2, R = (size_t)m->R;
  if (!(m->ops = calloc(T, sizeof *m->ops)) || !(m->calls = calloc(T, sizeof *m->calls)) ||
      !(m->bytes = calloc(T, sizeof *m->bytes)) || !(m->busy = calloc(T, sizeof *m->busy)) ||
      !(m->waited = calloc(T, sizeof *m->waited)))
    goto oom;
  for (size_t t = 0; t < T; t++) {
    Op *o = &m->ops[t];
    if (!(o->cb = calloc(R + 1, sizeof *o->cb)) || !(o->ce = calloc(R + 1, sizeof *o->ce)) ||
        !(o->rq = malloc(2 * R * sizeof *o->rq)))
      goto oom;
    for (size_t k = 0; k < 2 * R; k++) o->rq[k] = MPI_REQUEST_NULL;
  }
  if (pthread_create(&m->wth, NULL, watchdog, m)) {
    snprintf(err, errlen, "cannot start the collective's watchdog thread");
    mpi_destroy(c);
    return NULL;
  }
  m->w_started = true;
  return c;
oom:
  snprintf(err, errlen, "out of host memory");
  mpi_destroy(c);
  return NULL;
}

static int mpi_init(int *rank, int *size, char *version, size_t vlen, char *err, size_t errlen) {
  int inited = 0, provided = 0;
  pthread_mutex_lock(&mpi_mu);
  MPI_Initialized(&inited);
  int e = inited ? MPI_SUCCESS : MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
  if (inited) MPI_Query_thread(&provided);
  if (e == MPI_SUCCESS) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (e == MPI_SUCCESS) e = MPI_Comm_rank(MPI_COMM_WORLD, rank);
  if (e == MPI_SUCCESS) e = MPI_Comm_size(MPI_COMM_WORLD, size);
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int vl = 0;
  if (e == MPI_SUCCESS && MPI_Get_library_version(v, &vl) == MPI_SUCCESS) {
    v[strcspn(v, ",\n")] = 0;
    snprintf(version, vlen, "%s", v);
  } else {
    snprintf(version, vlen, "MPI");
  }
  pthread_mutex_unlock(&mpi_mu);
  if (e != MPI_SUCCESS) {
    char s[MPI_MAX_ERROR_STRING];
    mpi_msg(e, s, sizeof s);
    snprintf(err, errlen, "MPI_Init_thread: %s", s);
    return -1;
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    snprintf(err, errlen, "this MPI provides thread level %d, below MPI_THREAD_SERIALIZED (the pipeline's threads "
             "take turns in MPI calls)", provided);
    return -1;
  }
  return 0;
}

static void mpi_abort_all(int code) {
  /* a stage thread may still be in MPI_Test (which can take a while when a
   * peer's connection broke): wait for the lock a little, then abort
   * regardless (MPI_Abort is meant for a process in trouble) */
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_nsec += 200000000L;
  if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
  pthread_mutex_timedlock(&mpi_mu, &dl);
  MPI_Abort(MPI_COMM_WORLD, code);
  _Exit(code); /* MPI_Abort does not return; in case it does */
}

static int mpi_finalize(void) {
  pthread_mutex_lock(&mpi_mu);
  int e = MPI_Finalize();
  pthread_mutex_unlock(&mpi_mu);
  return e == MPI_SUCCESS ? 0 : -1;
}

static const DuetMpiPlugin plugin = {
    .api = DUET_MPI_PLUGIN_API,
    .init = mpi_init,
    .coll_new = mpi_coll_new,
    .abort = mpi_abort_all,
    .finalize = mpi_finalize,
};

EXPORT const DuetMpiPlugin *duet_mpi_plugin(void) { return &plugin; }
