#define _POSIX_C_SOURCE 200809L /* clock_gettime, pthread_cond_timedwait */
/* runtime/collective.c: the shared-memory collective between the replicas
 * of one process (runtime/collective.h).
 *
 * Each tag has a slot per rank holding the rank's buffers and a host view
 * of each (the buffer itself in host memory, else a staging copy), and two
 * counters that only grow: posts and finished chunks.  A rank's k-th call
 * on a tag posts its buffers (after copying device memory to its staging),
 * then, in the wait, once all R ranks have posted their k-th call (posts
 * >= k R), sums chunk `rank` of the elements over every rank's view, in
 * rank order, writes the sum into every rank's view, counts its chunk done,
 * and waits until all R chunks are (done >= k R); then it copies its
 * staging back to its device.  A rank cannot post its (k+1)-th call before
 * the k-th is complete everywhere, so the views of one call are never
 * overwritten while another rank still reads them.
 *
 * A direct tag (duet_coll_shm_direct) keeps the buffers on their devices:
 * after all ranks have posted, each rank copies chunk k of its buffers
 * into slot `rank` of rank k's device staging (copy_peer) and counts
 * itself pushed; once all have pushed (pushed >= k R), rank k sums its R
 * slots in rank order into its own buffers (accumulate), copies the sum
 * into every other rank's buffers (copy_peer), counts its chunk done and
 * waits for all R chunks, as above.
 *
 * ZeRO stage 1's reduce-scatter and all-gather go the host way (no direct
 * tags): a reduce-scatter's rank k sums its own part (buffers split[k] ..
 * split[k+1]-1) over every rank's view in rank order into its own view
 * (the all-reduce's additions for those elements: the same bits); an
 * all-gather's rank k copies every other rank's part from that rank's
 * view into its own.  Then, as above, each counts itself done, waits for
 * all R and copies its staging back. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collective.h"

typedef struct ShmRank {
  DuetDevice *dev;   /* NULL: host memory */
  DuetCollBuf *b;    /* this call's buffers (a copy) */
  void **view;       /* host view of each */
  int n, cap;
  char *stage;       /* staging of device buffers */
  size_t stage_bytes;
  int64_t calls;     /* calls on this tag so far (this rank's generation) */
  char *dstage;      /* direct tags: R slots of this rank's chunk, on dstage_dev */
  size_t dstage_bytes;
  DuetDevice *dstage_dev;
  int kind;          /* this call: SHM_ALLREDUCE, SHM_REDUCE_SCATTER, SHM_ALL_GATHER */
  int *split;        /* ZeRO calls: R + 1 buffer indices (runtime/collective.h) */
} ShmRank;

enum { SHM_ALLREDUCE, SHM_REDUCE_SCATTER, SHM_ALL_GATHER };

typedef struct ShmTag {
  ShmRank *r;        /* [R] */
  int64_t posted, pushed, done;
  bool direct;       /* duet_coll_shm_direct: summed on the devices */
} ShmTag;

typedef struct Shm {
  int R, n_tags;
  ShmTag *tags;      /* n_tags, then the barrier's and the broadcast's */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  double timeout;
  bool aborted, locks;
  char why[400];
} Shm;

static size_t elem_size(int dtype) { return dtype == DUET_F64 ? 8 : 4; }

/* The deadline `timeout` seconds from now (CLOCK_REALTIME, for
 * pthread_cond_timedwait). */
static struct timespec deadline(double timeout) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  double secs = floor(timeout), frac = timeout - secs;
  dl.tv_sec += (time_t)secs;
  dl.tv_nsec += (long)(frac * 1e9);
  if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
  return dl;
}

/* Under the lock: waits until *counter >= want.  0, or -1 with a message
 * (aborted; timed out: naming the first rank whose calls on the tag are
 * behind `call`, or whose chunk is missing). */
static int wait_count(Shm *s, ShmTag *t, const int64_t *counter, int64_t want, int64_t call, char *err,
                      size_t errlen) {
  struct timespec dl = deadline(s->timeout);
  int w = 0;
  while (*counter < want && !s->aborted && w != ETIMEDOUT) w = pthread_cond_timedwait(&s->cv, &s->mu, &dl);
  if (*counter >= want) return 0;
  if (s->aborted) {
    snprintf(err, errlen, "aborted: %s", s->why);
    return -1;
  }
  int late = 0;
  while (late < s->R - 1 && t->r[late].calls >= call) late++;
  snprintf(err, errlen, "timed out after %.3g s waiting for replica %d (raise DUET_PIPE_TIMEOUT if a replica is "
           "legitimately this slow)", s->timeout, late);
  return -1;
}

static void fail_all(Shm *s, const char *why) {
  pthread_mutex_lock(&s->mu);
  if (!s->aborted) {
    s->aborted = true;
    snprintf(s->why, sizeof s->why, "%s", why);
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void shm_abort(DuetColl *c, const char *why) { fail_all(c->ctx, why); }

/* Records the rank's buffers for its next call on tag t and makes their
 * host views (copying device memory into staging).  0, or -1 with a
 * message. */
static int take_buffers(Shm *s, ShmRank *me, DuetDevice *dev, const DuetCollBuf *b, int n, bool copy_in, char *err,
                        size_t errlen) {
  if (n < 0) {
    snprintf(err, errlen, "%d buffers", n);
    return -1;
  }
  if (n > me->cap) {
    int cap = n > 2 * me->cap ? n : 2 * me->cap;
    DuetCollBuf *nb = realloc(me->b, (size_t)cap * sizeof *nb);
    if (nb) me->b = nb;
    void **nv = nb ? realloc(me->view, (size_t)cap * sizeof *nv) : NULL;
    if (nv) me->view = nv;
    if (!nb || !nv) {
      snprintf(err, errlen, "out of host memory");
      return -1;
    }
    me->cap = cap;
  }
  size_t bytes = 0;
  for (int i = 0; i < n; i++) {
    if ((b[i].dtype != DUET_F32 && b[i].dtype != DUET_F64 && b[i].dtype != DUET_I32) || b[i].n < 0) {
      snprintf(err, errlen, "buffer %d: %" PRId64 " elements of dtype %d (f32, f64 and i32 are summed)", i, b[i].n,
               b[i].dtype);
      return -1;
    }
    bytes += ((size_t)b[i].n * elem_size(b[i].dtype) + 63) & ~(size_t)63;
  }
  if (dev && bytes > me->stage_bytes) {
    char *st = realloc(me->stage, bytes);
    if (!st) {
      snprintf(err, errlen, "out of host memory (%zu bytes of staging)", bytes);
      return -1;
    }
    me->stage = st;
    me->stage_bytes = bytes;
  }
  if (n) memcpy(me->b, b, (size_t)n * sizeof *b);
  me->n = n;
  me->dev = dev;
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    size_t nb = (size_t)b[i].n * elem_size(b[i].dtype);
    me->view[i] = dev ? me->stage + off : b[i].ptr;
    if (dev && copy_in && nb && dev->ops->copy_to_host(dev, me->view[i], b[i].ptr, nb)) {
      snprintf(err, errlen, "copying buffer %d to the host: %s", i, dev->err);
      return -1;
    }
    off += (nb + 63) & ~(size_t)63;
  }
  (void)s;
  return 0;
}

/* Writes the host views back to the rank's device (no-op in host memory). */
static int give_back(ShmRank *me, char *err, size_t errlen) {
  if (!me->dev) return 0;
  for (int i = 0; i < me->n; i++) {
    size_t nb = (size_t)me->b[i].n * elem_size(me->b[i].dtype);
    if (nb && me->dev->ops->copy_to_device(me->dev, me->b[i].ptr, me->view[i], nb)) {
      snprintf(err, errlen, "copying buffer %d back to the device: %s", i, me->dev->err);
      return -1;
    }
  }
  return 0;
}

/* Rank k's chunk [*lo, *hi) of `total` elements split among R ranks
 * (the first total % R chunks one element longer). */
static void chunk_range(int64_t total, int R, int k, int64_t *lo, int64_t *hi) {
  *lo = total / R * k + (k < total % R ? k : total % R);
  *hi = *lo + total / R + (k < total % R ? 1 : 0);
}

static int64_t total_elems(const DuetCollBuf *b, int n) {
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += b[i].n;
  return total;
}

/* Direct tags: the bytes of one slot of rank k's staging, which holds rank
 * k's chunk of the buffers b piece by piece (a piece: the part of one
 * buffer inside the chunk), each piece at a multiple of 256 bytes. */
static size_t slot_bytes(const DuetCollBuf *b, int n, int R, int k) {
  int64_t lo, hi, at = 0;
  chunk_range(total_elems(b, n), R, k, &lo, &hi);
  size_t bytes = 0;
  for (int i = 0; i < n && at < hi; at += b[i].n, i++) {
    int64_t a = lo > at ? lo - at : 0, z = hi - at < b[i].n ? hi - at : b[i].n;
    if (a < z) bytes += ((size_t)(z - a) * elem_size(b[i].dtype) + 255) & ~(size_t)255;
  }
  return bytes;
}

/* Direct tags: records the rank's device buffers (no host view) and makes
 * its staging hold R slots of its chunk (on its device).  0, or -1 with a
 * message. */
static int take_direct(Shm *s, ShmRank *me, int rank, DuetDevice *dev, const DuetCollBuf *b, int n, char *err,
                       size_t errlen) {
  if (!dev || !dev->ops->copy_peer || !dev->ops->accumulate) {
    snprintf(err, errlen, "a device-to-device all-reduce needs buffers on a device with copy_peer and accumulate");
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (b[i].dtype != DUET_F32 && b[i].dtype != DUET_F64) {
      snprintf(err, errlen, "buffer %d: dtype %d (a device-to-device all-reduce sums f32 and f64)", i, b[i].dtype);
      return -1;
    }
  if (take_buffers(s, me, NULL, b, n, false, err, errlen)) return -1; /* the list; views unused */
  me->dev = dev;
  size_t need = (size_t)s->R * slot_bytes(b, n, s->R, rank);
  if (need > me->dstage_bytes || (me->dstage && me->dstage_dev != dev)) {
    if (me->dstage) me->dstage_dev->ops->free(me->dstage_dev, me->dstage);
    me->dstage = NULL;
    me->dstage_bytes = 0;
    if (!(me->dstage = dev->ops->alloc(dev, need))) {
      snprintf(err, errlen, "%zu bytes of device staging: %s", need, dev->err);
      return -1;
    }
    me->dstage_bytes = need;
    me->dstage_dev = dev;
  }
  return 0;
}

/* Posts the rank's call on tag t (under no lock); 0, or -1 with a message
 * (the run is then aborted for everyone). */
static int post(Shm *s, ShmTag *t, int rank, DuetDevice *dev, const DuetCollBuf *b, int n, bool copy_in, char *err,
                size_t errlen) {
  ShmRank *me = &t->r[rank];
  pthread_mutex_lock(&s->mu);
  bool ab = s->aborted;
  if (ab) snprintf(err, errlen, "aborted: %s", s->why);
  pthread_mutex_unlock(&s->mu);
  if (ab) return -1;
  if (t->direct ? take_direct(s, me, rank, dev, b, n, err, errlen)
                : take_buffers(s, me, dev, b, n, copy_in, err, errlen)) {
    fail_all(s, err);
    return -1;
  }
  pthread_mutex_lock(&s->mu);
  me->calls++;
  t->posted++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

/* Every rank's buffers of this call have the layout of rank 0's. */
static int same_layout(const Shm *s, const ShmTag *t, char *err, size_t errlen) {
  const ShmRank *r0 = &t->r[0];
  for (int k = 1; k < s->R; k++) {
    const ShmRank *rk = &t->r[k];
    if (rk->n != r0->n) {
      snprintf(err, errlen, "replica %d passes %d buffers, replica 0 %d", k, rk->n, r0->n);
      return -1;
    }
    for (int i = 0; i < r0->n; i++)
      if (rk->b[i].n != r0->b[i].n || rk->b[i].dtype != r0->b[i].dtype) {
        snprintf(err, errlen, "buffer %d: replica %d has %" PRId64 " elements of dtype %d, replica 0 %" PRId64
                 " of dtype %d", i, k, rk->b[i].n, rk->b[i].dtype, r0->b[i].n, r0->b[i].dtype);
        return -1;
      }
  }
  return 0;
}

/* Elements [lo, hi) of buffer i, summed over the ranks in rank order and
 * written to every rank's view. */
static void sum_range(const Shm *s, const ShmTag *t, int i, int64_t lo, int64_t hi) {
  int R = s->R, dt = t->r[0].b[i].dtype;
  if (dt == DUET_F32) {
#pragma omp parallel for schedule(static) if (hi - lo >= 65536)
    for (int64_t e = lo; e < hi; e++) {
      float x = ((const float *)t->r[0].view[i])[e];
      for (int k = 1; k < R; k++) x += ((const float *)t->r[k].view[i])[e];
      for (int k = 0; k < R; k++) ((float *)t->r[k].view[i])[e] = x;
    }
  } else if (dt == DUET_F64) {
#pragma omp parallel for schedule(static) if (hi - lo >= 65536)
    for (int64_t e = lo; e < hi; e++) {
      double x = ((const double *)t->r[0].view[i])[e];
      for (int k = 1; k < R; k++) x += ((const double *)t->r[k].view[i])[e];
      for (int k = 0; k < R; k++) ((double *)t->r[k].view[i])[e] = x;
    }
  } else {
    for (int64_t e = lo; e < hi; e++) { /* flags and counts: wrapping like the unsigned sum */
      uint32_t x = (uint32_t)((const int32_t *)t->r[0].view[i])[e];
      for (int k = 1; k < R; k++) x += (uint32_t)((const int32_t *)t->r[k].view[i])[e];
      for (int k = 0; k < R; k++) ((int32_t *)t->r[k].view[i])[e] = (int32_t)x;
    }
  }
}

static int shm_allreduce_start(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                               char *err, size_t errlen) {
  Shm *s = c->ctx;
  if (rank < 0 || rank >= s->R || tag < 0 || tag >= s->n_tags) {
    snprintf(err, errlen, "rank %d or tag %d out of range", rank, tag);
    return -1;
  }
  s->tags[tag].r[rank].kind = SHM_ALLREDUCE;
  return post(s, &s->tags[tag], rank, dev, b, n, true, err, errlen);
}

/* The start of a reduce-scatter or an all-gather (kind) over the parts
 * split (runtime/collective.h). */
static int zero_start(DuetColl *c, int kind, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                      const int *split, char *err, size_t errlen) {
  Shm *s = c->ctx;
  if (rank < 0 || rank >= s->R || tag < 0 || tag >= s->n_tags) {
    snprintf(err, errlen, "rank %d or tag %d out of range", rank, tag);
    return -1;
  }
  ShmTag *t = &s->tags[tag];
  ShmRank *me = &t->r[rank];
  bool ok = split && split[0] == 0 && split[s->R] == n && !t->direct;
  for (int k = 0; ok && k < s->R; k++) ok = split[k] <= split[k + 1];
  if (!ok) {
    snprintf(err, errlen, t->direct ? "a device-to-device tag has no reduce-scatter or all-gather"
                                    : "the parts of %d buffers among %d ranks are not in order", n, s->R);
    fail_all(s, err);
    return -1;
  }
  if (!me->split && !(me->split = malloc((size_t)(s->R + 1) * sizeof *me->split))) {
    snprintf(err, errlen, "out of host memory");
    fail_all(s, err);
    return -1;
  }
  memcpy(me->split, split, (size_t)(s->R + 1) * sizeof *split);
  me->kind = kind;
  return post(s, t, rank, dev, b, n, true, err, errlen);
}

static int shm_reduce_scatter_start(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                                    const int *split, char *err, size_t errlen) {
  return zero_start(c, SHM_REDUCE_SCATTER, rank, tag, dev, b, n, split, err, errlen);
}

static int shm_all_gather_start(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                                const int *split, char *err, size_t errlen) {
  return zero_start(c, SHM_ALL_GATHER, rank, tag, dev, b, n, split, err, errlen);
}

/* Every rank's call is of rank 0's kind and parts. */
static int same_kind(const Shm *s, const ShmTag *t, char *err, size_t errlen) {
  const ShmRank *r0 = &t->r[0];
  for (int k = 1; k < s->R; k++) {
    const ShmRank *rk = &t->r[k];
    bool same = rk->kind == r0->kind;
    for (int j = 0; same && r0->kind != SHM_ALLREDUCE && j <= s->R; j++) same = rk->split[j] == r0->split[j];
    if (!same) {
      snprintf(err, errlen, "replica %d's call differs from replica 0's (another operation, or other parts)", k);
      return -1;
    }
  }
  return 0;
}

/* Reduce-scatter: buffer i's elements summed over the ranks in rank order
 * into rank `rank`'s view only (sum_range's additions). */
static void sum_own(const Shm *s, const ShmTag *t, int i, int rank) {
  int R = s->R, dt = t->r[0].b[i].dtype;
  int64_t n = t->r[0].b[i].n;
  if (dt == DUET_F32) {
    float *d = t->r[rank].view[i];
    for (int64_t e = 0; e < n; e++) {
      float x = ((const float *)t->r[0].view[i])[e];
      for (int k = 1; k < R; k++) x += ((const float *)t->r[k].view[i])[e];
      d[e] = x;
    }
  } else if (dt == DUET_F64) {
    double *d = t->r[rank].view[i];
    for (int64_t e = 0; e < n; e++) {
      double x = ((const double *)t->r[0].view[i])[e];
      for (int k = 1; k < R; k++) x += ((const double *)t->r[k].view[i])[e];
      d[e] = x;
    }
  } else {
    int32_t *d = t->r[rank].view[i];
    for (int64_t e = 0; e < n; e++) {
      uint32_t x = (uint32_t)((const int32_t *)t->r[0].view[i])[e];
      for (int k = 1; k < R; k++) x += (uint32_t)((const int32_t *)t->r[k].view[i])[e];
      d[e] = (int32_t)x;
    }
  }
}

/* Direct tags, after every rank has posted call `call`: this rank's pushes
 * of its chunks into their owners' staging, then its own chunk summed and
 * copied to every rank (see the file's comment).  0, or -1 with a message
 * (the run aborted for everyone on a device's failure). */
static int direct_sum(Shm *s, ShmTag *t, int rank, int64_t call, char *err, size_t errlen) {
  ShmRank *me = &t->r[rank];
  DuetDevice *d = me->dev;
  int R = s->R;
  int64_t total = total_elems(me->b, me->n);
  for (int k = 0; k < R; k++) { /* chunk k of my buffers into slot `rank` of rank k's staging */
    ShmRank *own = &t->r[k];
    int64_t lo, hi, at = 0;
    chunk_range(total, R, k, &lo, &hi);
    char *slot = own->dstage + (size_t)rank * slot_bytes(me->b, me->n, R, k);
    for (int i = 0; i < me->n && at < hi; at += me->b[i].n, i++) {
      int64_t a = lo > at ? lo - at : 0, z = hi - at < me->b[i].n ? hi - at : me->b[i].n;
      if (a >= z) continue;
      size_t es = elem_size(me->b[i].dtype), nb = (size_t)(z - a) * es;
      if (d->ops->copy_peer(d, slot, own->dev, (const char *)me->b[i].ptr + (size_t)a * es, nb)) {
        snprintf(err, errlen, "copying buffer %d to replica %d: %s", i, k, d->err);
        fail_all(s, err);
        return -1;
      }
      slot += (nb + 255) & ~(size_t)255;
    }
  }
  pthread_mutex_lock(&s->mu);
  t->pushed++;
  pthread_cond_broadcast(&s->cv);
  int rc = wait_count(s, t, &t->pushed, call * R, call, err, errlen);
  pthread_mutex_unlock(&s->mu);
  if (rc) return -1;
  /* my chunk: the R slots summed in rank order into my buffers, then
   * copied to every other rank's */
  size_t sb = slot_bytes(me->b, me->n, R, rank), off = 0;
  int64_t lo, hi, at = 0;
  chunk_range(total, R, rank, &lo, &hi);
  for (int i = 0; i < me->n && at < hi; at += me->b[i].n, i++) {
    int64_t a = lo > at ? lo - at : 0, z = hi - at < me->b[i].n ? hi - at : me->b[i].n;
    if (a >= z) continue;
    size_t es = elem_size(me->b[i].dtype), nb = (size_t)(z - a) * es;
    char *mine = (char *)me->b[i].ptr + (size_t)a * es;
    for (int j = 0; j < R; j++)
      if (d->ops->accumulate(d, mine, me->dstage + (size_t)j * sb + off, z - a, me->b[i].dtype, j == 0)) {
        snprintf(err, errlen, "summing buffer %d: %s", i, d->err);
        fail_all(s, err);
        return -1;
      }
    for (int j = 0; j < R; j++)
      if (j != rank && d->ops->copy_peer(d, (char *)t->r[j].b[i].ptr + (size_t)a * es, t->r[j].dev, mine, nb)) {
        snprintf(err, errlen, "copying the sum of buffer %d to replica %d: %s", i, j, d->err);
        fail_all(s, err);
        return -1;
      }
    off += (nb + 255) & ~(size_t)255;
  }
  if (d->ops->sync(d)) { /* the sums in my own buffers are complete */
    snprintf(err, errlen, "%s", d->err);
    fail_all(s, err);
    return -1;
  }
  pthread_mutex_lock(&s->mu);
  t->done++;
  pthread_cond_broadcast(&s->cv);
  rc = wait_count(s, t, &t->done, call * R, call, err, errlen);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static int shm_allreduce_wait(DuetColl *c, int rank, int tag, char *err, size_t errlen) {
  Shm *s = c->ctx;
  if (rank < 0 || rank >= s->R || tag < 0 || tag >= s->n_tags) {
    snprintf(err, errlen, "rank %d or tag %d out of range", rank, tag);
    return -1;
  }
  ShmTag *t = &s->tags[tag];
  ShmRank *me = &t->r[rank];
  int64_t call = me->calls, R = s->R;
  pthread_mutex_lock(&s->mu);
  int rc = wait_count(s, t, &t->posted, call * R, call, err, errlen);
  pthread_mutex_unlock(&s->mu);
  if (rc) return -1;
  if (same_layout(s, t, err, errlen)) {
    fail_all(s, err);
    return -1;
  }
  if (same_kind(s, t, err, errlen)) {
    fail_all(s, err);
    return -1;
  }
  if (t->direct) return direct_sum(s, t, rank, call, err, errlen);
  if (me->kind == SHM_REDUCE_SCATTER) { /* my part, summed into my view */
    for (int i = me->split[rank]; i < me->split[rank + 1]; i++) sum_own(s, t, i, rank);
  } else if (me->kind == SHM_ALL_GATHER) { /* every other rank's part, from its view */
    for (int k = 0; k < s->R; k++)
      for (int i = me->split[k]; k != rank && i < me->split[k + 1]; i++)
        memcpy(me->view[i], t->r[k].view[i], (size_t)me->b[i].n * elem_size(me->b[i].dtype));
  } else { /* this rank's chunk of the elements of all buffers, in order */
    int64_t lo, hi, at = 0;
    chunk_range(total_elems(me->b, me->n), s->R, rank, &lo, &hi);
    for (int i = 0; i < me->n && at < hi; i++) {
      int64_t a = lo > at ? lo - at : 0, z = hi - at < me->b[i].n ? hi - at : me->b[i].n;
      if (a < z) sum_range(s, t, i, a, z);
      at += me->b[i].n;
    }
  }
  pthread_mutex_lock(&s->mu);
  t->done++;
  pthread_cond_broadcast(&s->cv);
  rc = wait_count(s, t, &t->done, call * R, call, err, errlen);
  pthread_mutex_unlock(&s->mu);
  if (rc) return -1;
  if (give_back(me, err, errlen)) {
    fail_all(s, err);
    return -1;
  }
  return 0;
}

static int shm_barrier(DuetColl *c, int rank, char *err, size_t errlen) {
  Shm *s = c->ctx;
  if (rank < 0 || rank >= s->R) {
    snprintf(err, errlen, "rank %d out of range", rank);
    return -1;
  }
  ShmTag *t = &s->tags[s->n_tags];
  if (post(s, t, rank, NULL, NULL, 0, false, err, errlen)) return -1;
  pthread_mutex_lock(&s->mu);
  int rc = wait_count(s, t, &t->posted, t->r[rank].calls * s->R, t->r[rank].calls, err, errlen);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static int shm_broadcast(DuetColl *c, int rank, int root, DuetDevice *dev, const DuetCollBuf *b, int n, char *err,
                         size_t errlen) {
  Shm *s = c->ctx;
  if (rank < 0 || rank >= s->R || root < 0 || root >= s->R) {
    snprintf(err, errlen, "rank %d or root %d out of range", rank, root);
    return -1;
  }
  ShmTag *t = &s->tags[s->n_tags + 1];
  ShmRank *me = &t->r[rank];
  if (post(s, t, rank, dev, b, n, rank == root, err, errlen)) return -1;
  int64_t call = me->calls, R = s->R;
  pthread_mutex_lock(&s->mu);
  int rc = wait_count(s, t, &t->posted, call * R, call, err, errlen);
  pthread_mutex_unlock(&s->mu);
  if (rc) return -1;
  if (same_layout(s, t, err, errlen)) {
    fail_all(s, err);
    return -1;
  }
  if (rank != root) {
    const ShmRank *src = &t->r[root];
    for (int i = 0; i < me->n; i++) memcpy(me->view[i], src->view[i], (size_t)me->b[i].n * elem_size(me->b[i].dtype));
  }
  pthread_mutex_lock(&s->mu);
  t->done++;
  pthread_cond_broadcast(&s->cv);
  rc = wait_count(s, t, &t->done, call * R, call, err, errlen);
  pthread_mutex_unlock(&s->mu);
  if (rc) return -1;
  if (rank != root && give_back(me, err, errlen)) {
    fail_all(s, err);
    return -1;
  }
  return 0;
}

static void shm_destroy(DuetColl *c) {
  if (!c) return;
  Shm *s = c->ctx;
  if (s) {
    for (int k = 0; s->tags && k < s->n_tags + 2; k++) {
      for (int r = 0; s->tags[k].r && r < s->R; r++) {
        if (s->tags[k].r[r].dstage) s->tags[k].r[r].dstage_dev->ops->free(s->tags[k].r[r].dstage_dev, s->tags[k].r[r].dstage);
        free(s->tags[k].r[r].b);
        free(s->tags[k].r[r].view);
        free(s->tags[k].r[r].stage);
        free(s->tags[k].r[r].split);
      }
      free(s->tags[k].r);
    }
    free(s->tags);
    if (s->locks) {
      pthread_mutex_destroy(&s->mu);
      pthread_cond_destroy(&s->cv);
    }
    free(s);
  }
  free(c);
}

static const DuetCollOps shm_ops = {
    .name = "shared memory",
    .allreduce_start = shm_allreduce_start,
    .allreduce_wait = shm_allreduce_wait,
    .broadcast = shm_broadcast,
    .barrier = shm_barrier,
    .abort = shm_abort,
    .reduce_scatter_start = shm_reduce_scatter_start,
    .all_gather_start = shm_all_gather_start,
    .destroy = shm_destroy,
};

DuetColl *duet_coll_shm_new(int n_ranks, int n_tags, double timeout, char *err, size_t errlen) {
  if (n_ranks < 1 || n_tags < 0 || !(timeout > 0)) {
    snprintf(err, errlen, "a collective of %d ranks and %d tags, timeout %g s", n_ranks, n_tags, timeout);
    return NULL;
  }
  DuetColl *c = calloc(1, sizeof *c);
  Shm *s = calloc(1, sizeof *s);
  if (!c || !s) {
    free(c);
    free(s);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  if (pthread_mutex_init(&s->mu, NULL)) {
    free(c);
    free(s);
    snprintf(err, errlen, "cannot create the collective's lock");
    return NULL;
  }
  if (pthread_cond_init(&s->cv, NULL)) {
    pthread_mutex_destroy(&s->mu);
    free(c);
    free(s);
    snprintf(err, errlen, "cannot create the collective's lock");
    return NULL;
  }
  s->locks = true;
  c->ops = &shm_ops;
  c->n_ranks = n_ranks;
  c->ctx = s;
  s->R = n_ranks;
  s->n_tags = n_tags;
  s->timeout = timeout;
  if (!(s->tags = calloc((size_t)n_tags + 2, sizeof *s->tags))) goto oom;
  for (int k = 0; k < n_tags + 2; k++)
    if (!(s->tags[k].r = calloc((size_t)n_ranks, sizeof *s->tags[k].r))) goto oom;
  return c;
oom:
  shm_destroy(c);
  snprintf(err, errlen, "out of host memory");
  return NULL;
}

int duet_coll_shm_direct(DuetColl *c, int tag, char *err, size_t errlen) {
  if (!c || c->ops != &shm_ops) {
    snprintf(err, errlen, "not a shared-memory collective");
    return -1;
  }
  Shm *s = c->ctx;
  if (tag < 0 || tag >= s->n_tags) {
    snprintf(err, errlen, "tag %d out of range (0..%d)", tag, s->n_tags - 1);
    return -1;
  }
  s->tags[tag].direct = true;
  return 0;
}
