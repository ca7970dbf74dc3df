/* tests/test_collective.c: the shared-memory collective of data
 * parallelism (runtime/collective.c), with one thread per rank:
 *  1. all-reduce of f32 buffers (three of them, 100,003 elements in all, so
 *     the ranks' chunks straddle buffers) over 3 ranks: every rank receives
 *     x0 + x1 + x2 added in rank order, bit for bit (the reference is that
 *     sum in plain C, and the reversed order x2 + x1 + x0 must differ
 *     somewhere: the test can tell the orders apart); f64 and i32 buffers;
 *     ten calls in a row on one tag (generations), two tags interleaved;
 *  2. broadcast from rank 1; a barrier;
 *  3. errors: buffers of another length on one rank; a rank that never
 *     comes (the others time out naming it, within the timeout); abort
 *     (a waiting rank returns at once with the reason);
 *  4. a direct tag (duet_coll_shm_direct) over 3 virtual CPU devices whose
 *     copies to and from the host fail: the same f32 sums bit for bit in
 *     rank order, reached through copy_peer and accumulate only (counted);
 *     host buffers and i32 on a direct tag are refused;
 *  5. ZeRO stage 1: reduce-scatter of the three f32 buffers in parts of
 *     whole buffers (rank 0: buffer 0, rank 1: none, rank 2: buffers 1 and
 *     2): each rank's part holds x0 + x1 + x2 in rank order, bit for bit
 *     (the reference of 1.), five calls; then an all-gather: every rank
 *     receives each part from the rank that owns it (byte copies, NaNs
 *     elsewhere overwritten), and an all-reduce on the same tag after it;
 *     a rank that passes other parts is refused.
 * Exits 1 on any failure. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../runtime/collective.h"

enum { R = 3, N0 = 40000, N1 = 7, N2 = 59996, NT = N0 + N1 + N2 };

static int fails;
#define CHECK(c, ...)                      \
  do {                                     \
    if (!(c)) {                            \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                 \
      printf("\n");                        \
      fails++;                             \
    }                                      \
  } while (0)

typedef struct Rank {
  DuetColl *c;
  DuetDevice *dev; /* mode 4: the rank's device (direct tag 0) */
  int rank, mode;
  float *f;          /* NT values */
  double d[5];
  int32_t k[4];
  float bc[3];
  int rc;
  char err[600];
} Rank;

/* Rank 0 and 1 nearly cancel and rank 2 is small: (x0 + x1) + x2 keeps
 * bits of x2 that (x2 + x1) + x0 rounds away, so the order shows. */
static float value(int rank, int64_t e, int call) {
  uint64_t x = ((uint64_t)e + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(rank * 131 + call * 7919);
  x ^= x >> 29;
  float u = (float)(x % 1000003) / 1000003.0f;
  return rank == 0 ? 1.0f + u : rank == 1 ? -1.0f - u * 0.999f : 1e-6f * (u - 0.5f);
}

static void *job(void *arg) {
  Rank *r = arg;
  DuetColl *c = r->c;
  char *e = r->err;
  size_t el = sizeof r->err;
  r->rc = 0;
  if (r->mode == 0 || r->mode == 4) { /* 10 generations on tag 0, interleaved with tag 1 */
    for (int call = 0; call < 10 && !r->rc; call++) {
      for (int64_t i = 0; i < NT; i++) r->f[i] = value(r->rank, i, call);
      for (int i = 0; i < 5; i++) r->d[i] = (double)(r->rank + 1) * (i + 0.1);
      for (int i = 0; i < 4; i++) r->k[i] = r->rank == 1 && i == 2;
      DuetCollBuf b[3] = {{r->f, N0, DUET_F32}, {r->f + N0, N1, DUET_F32}, {r->f + N0 + N1, N2, DUET_F32}};
      DuetCollBuf o[2] = {{r->d, 5, DUET_F64}, {r->k, 4, DUET_I32}};
      if (c->ops->allreduce_start(c, r->rank, 0, r->mode == 4 ? r->dev : NULL, b, 3, e, el) ||
          c->ops->allreduce_start(c, r->rank, 1, NULL, o, 2, e, el) ||
          c->ops->allreduce_wait(c, r->rank, 1, e, el) || c->ops->allreduce_wait(c, r->rank, 0, e, el)) {
        r->rc = -1;
        break;
      }
      for (int64_t i = 0; i < NT; i++) {
        float want = value(0, i, call);
        want += value(1, i, call);
        want += value(2, i, call);
        if (memcmp(&want, &r->f[i], sizeof want)) {
          snprintf(e, el, "call %d, element %lld: %.9g, want %.9g", call, (long long)i, r->f[i], want);
          r->rc = -2;
          break;
        }
      }
      for (int i = 0; i < 5 && !r->rc; i++)
        if (r->d[i] != ((1 * (i + 0.1)) + 2 * (i + 0.1)) + 3 * (i + 0.1)) r->rc = -3;
      for (int i = 0; i < 4 && !r->rc; i++)
        if (r->k[i] != (i == 2)) r->rc = -4;
    }
    if (!r->rc) { /* broadcast of rank 1's three values, then a barrier */
      for (int i = 0; i < 3; i++) r->bc[i] = (float)(10 * r->rank + i);
      DuetCollBuf b = {r->bc, 3, DUET_F32};
      if (c->ops->broadcast(c, r->rank, 1, NULL, &b, 1, e, el) || c->ops->barrier(c, r->rank, e, el)) r->rc = -1;
      for (int i = 0; i < 3 && !r->rc; i++)
        if (r->bc[i] != (float)(10 + i)) r->rc = -5;
    }
  } else if (r->mode == 7) { /* ZeRO: reduce-scatter, all-gather, then an all-reduce, on tag 0 */
    static const int split[R + 1] = {0, 1, 1, 3};
    DuetCollBuf b[3] = {{r->f, N0, DUET_F32}, {r->f + N0, N1, DUET_F32}, {r->f + N0 + N1, N2, DUET_F32}};
    int64_t lo = split[r->rank] ? N0 : 0, hi = split[r->rank + 1] == 1 ? N0 : split[r->rank + 1] == 3 ? NT : lo;
    for (int call = 0; call < 5 && !r->rc; call++) {
      for (int64_t i = 0; i < NT; i++) r->f[i] = value(r->rank, i, call);
      if (c->ops->reduce_scatter_start(c, r->rank, 0, NULL, b, 3, split, e, el) ||
          c->ops->allreduce_wait(c, r->rank, 0, e, el)) {
        r->rc = -1;
        break;
      }
      for (int64_t i = lo; i < hi; i++) {
        float want = value(0, i, call);
        want += value(1, i, call);
        want += value(2, i, call);
        if (memcmp(&want, &r->f[i], sizeof want)) {
          snprintf(e, el, "reduce-scatter call %d, element %lld: %.9g, want %.9g", call, (long long)i, r->f[i], want);
          r->rc = -2;
          break;
        }
      }
    }
    if (!r->rc) { /* all-gather: my part is value(rank), the rest NaN until received */
      for (int64_t i = 0; i < NT; i++) r->f[i] = i >= lo && i < hi ? value(r->rank, i, 99) : 0.0f / 0.0f;
      if (c->ops->all_gather_start(c, r->rank, 0, NULL, b, 3, split, e, el) ||
          c->ops->allreduce_wait(c, r->rank, 0, e, el))
        r->rc = -1;
      for (int64_t i = 0; i < NT && !r->rc; i++) {
        float want = value(i < N0 ? 0 : 2, i, 99);
        if (memcmp(&want, &r->f[i], sizeof want)) {
          snprintf(e, el, "all-gather, element %lld: %.9g, want %.9g", (long long)i, r->f[i], want);
          r->rc = -3;
        }
      }
    }
    if (!r->rc) { /* an all-reduce after them on the same tag */
      for (int64_t i = 0; i < NT; i++) r->f[i] = value(r->rank, i, 7);
      if (c->ops->allreduce_start(c, r->rank, 0, NULL, b, 3, e, el) || c->ops->allreduce_wait(c, r->rank, 0, e, el))
        r->rc = -1;
      for (int64_t i = 0; i < NT && !r->rc; i++) {
        float want = value(0, i, 7);
        want += value(1, i, 7);
        want += value(2, i, 7);
        if (memcmp(&want, &r->f[i], sizeof want)) r->rc = -4;
      }
    }
  } else if (r->mode == 8) { /* rank 2 passes other parts */
    static const int split[R + 1] = {0, 1, 1, 3}, other[R + 1] = {0, 1, 2, 3};
    DuetCollBuf b[3] = {{r->f, N0, DUET_F32}, {r->f + N0, N1, DUET_F32}, {r->f + N0 + N1, N2, DUET_F32}};
    if (c->ops->reduce_scatter_start(c, r->rank, 0, NULL, b, 3, r->rank == 2 ? other : split, e, el) ||
        c->ops->allreduce_wait(c, r->rank, 0, e, el))
      r->rc = -1;
  } else if (r->mode == 5 || r->mode == 6) { /* rank 0 gives a direct tag host memory (5), i32 (6) */
    DuetCollBuf b = {r->f, 4, DUET_F32}, k = {r->k, 4, DUET_I32};
    if (r->rank == 0 && c->ops->allreduce_start(c, 0, 0, r->mode == 5 ? NULL : r->dev, r->mode == 5 ? &b : &k, 1, e,
                                                el) == 0)
      r->rc = -6;
  } else if (r->mode == 1) { /* rank 2 passes another length */
    DuetCollBuf b = {r->f, r->rank == 2 ? 5 : 4, DUET_F32};
    if (c->ops->allreduce_start(c, r->rank, 0, NULL, &b, 1, e, el) || c->ops->allreduce_wait(c, r->rank, 0, e, el)) r->rc = -1;
  } else if (r->mode == 2) { /* rank 2 never comes */
    DuetCollBuf b = {r->f, 4, DUET_F32};
    if (r->rank != 2 &&
        (c->ops->allreduce_start(c, r->rank, 0, NULL, &b, 1, e, el) || c->ops->allreduce_wait(c, r->rank, 0, e, el)))
      r->rc = -1;
  } else { /* rank 2 aborts; the others wait */
    DuetCollBuf b = {r->f, 4, DUET_F32};
    if (r->rank == 2) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
      c->ops->abort(c, "rank 2 failed");
    } else if (c->ops->allreduce_start(c, r->rank, 0, NULL, &b, 1, e, el) ||
               c->ops->allreduce_wait(c, r->rank, 0, e, el)) {
      r->rc = -1;
    }
  }
  return NULL;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Mode 4's devices: virtual CPU devices whose copies through the host
 * fail, and whose direct copies and sums are counted. */
static DuetDeviceOps counting_ops;
static const DuetDeviceOps *cpu_ops;
static int n_peer_copies, n_sums;
static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER;
static int no_host_copy(DuetDevice *d, void *dst, const void *src, size_t bytes) {
  (void)dst, (void)src;
  snprintf(d->err, sizeof d->err, "a copy of %zu bytes through the host", bytes);
  return -1;
}
static int counted_copy_peer(DuetDevice *s, void *dst, DuetDevice *t, const void *src, size_t bytes) {
  pthread_mutex_lock(&count_mu);
  n_peer_copies++;
  pthread_mutex_unlock(&count_mu);
  return cpu_ops->copy_peer(s, dst, t, src, bytes);
}
static int counted_accumulate(DuetDevice *d, void *dst, const void *src, int64_t n, int dtype, int first) {
  pthread_mutex_lock(&count_mu);
  n_sums++;
  pthread_mutex_unlock(&count_mu);
  return cpu_ops->accumulate(d, dst, src, n, dtype, first);
}

/* Runs mode on R threads over a fresh collective (timeout seconds). */
static void run(int mode, double timeout, Rank *rk, double *secs) {
  char err[300];
  DuetColl *c = duet_coll_shm_new(R, 2, timeout, err, sizeof err);
  if (!c) {
    printf("FAIL duet_coll_shm_new: %s\n", err);
    exit(1);
  }
  DuetDevice *dev[R] = {0};
  if (mode >= 4 && mode <= 6) { /* tag 0 summed on the devices */
    for (int i = 0; i < R; i++) {
      if (!(dev[i] = duet_cpu_device(NULL, 0, 1))) {
        printf("FAIL duet_cpu_device\n");
        exit(1);
      }
      cpu_ops = dev[i]->ops;
      counting_ops = *cpu_ops;
      counting_ops.copy_to_host = no_host_copy;
      counting_ops.copy_to_device = no_host_copy;
      counting_ops.copy_peer = counted_copy_peer;
      counting_ops.accumulate = counted_accumulate;
      rk[i].dev = dev[i];
    }
    for (int i = 0; i < R; i++) dev[i]->ops = &counting_ops;
    for (int i = 0; i < R; i++)
      for (int j = 0; j < R; j++)
        if (dev[i]->ops->peer_path(dev[i], dev[j]) != DUET_PEER_HOST_MEMORY) {
          printf("FAIL peer_path: %s\n", dev[i]->err);
          exit(1);
        }
    if (duet_coll_shm_direct(c, 0, err, sizeof err)) {
      printf("FAIL duet_coll_shm_direct: %s\n", err);
      exit(1);
    }
  }
  pthread_t th[R];
  double t0 = now();
  for (int i = 0; i < R; i++) {
    rk[i].c = c;
    rk[i].rank = i;
    rk[i].mode = mode;
    rk[i].err[0] = 0;
    if (pthread_create(&th[i], NULL, job, &rk[i])) {
      printf("FAIL pthread_create\n");
      exit(1);
    }
  }
  for (int i = 0; i < R; i++) pthread_join(th[i], NULL);
  *secs = now() - t0;
  c->ops->destroy(c);
  for (int i = 0; i < R; i++)
    if (dev[i]) {
      dev[i]->ops = cpu_ops;
      dev[i]->ops->destroy(dev[i]);
      rk[i].dev = NULL;
    }
}

int main(void) {
  Rank rk[R];
  memset(rk, 0, sizeof rk);
  for (int i = 0; i < R; i++)
    if (!(rk[i].f = malloc(NT * sizeof(float)))) return 1;
  /* the orders can be told apart: x0 + x1 + x2 differs from x2 + x1 + x0 */
  int differ = 0;
  for (int64_t i = 0; i < NT; i++) {
    float a = value(0, i, 0), b = value(2, i, 0);
    a += value(1, i, 0), a += value(2, i, 0);
    b += value(1, i, 0), b += value(0, i, 0);
    differ += memcmp(&a, &b, sizeof a) != 0;
  }
  CHECK(differ > 1000, "rank order and reversed order agree on all but %d elements: the test cannot see the order",
        differ);
  double secs;
  run(0, 30, rk, &secs);
  for (int i = 0; i < R; i++) CHECK(rk[i].rc == 0, "rank %d: all-reduce, broadcast, barrier: rc %d: %s", i, rk[i].rc, rk[i].err);
  printf("ok all-reduce of f32 (%d elements in 3 buffers, 10 calls), f64 and i32 over %d ranks in rank order, bit for "
         "bit; broadcast; barrier (%d elements of the %d checked summed differently in reversed order)\n", NT, R, differ,
         NT);
  run(1, 30, rk, &secs);
  CHECK(rk[0].rc && strstr(rk[0].err, "buffer 0: replica 2 has 5 elements of dtype 1, replica 0 4 of dtype 1"),
        "mismatch: rank 0: %s", rk[0].err);
  printf("ok mismatched buffers: %s\n", rk[0].err);
  run(2, 0.3, rk, &secs);
  for (int i = 0; i < 2; i++)
    CHECK(rk[i].rc && strstr(rk[i].err, "timed out after 0.3 s waiting for replica 2"), "timeout: rank %d: %s", i,
          rk[i].err);
  CHECK(secs < 5, "the timeout took %.1f s", secs);
  printf("ok a missing rank: %s (%.2f s)\n", rk[0].err, secs);
  run(3, 30, rk, &secs);
  for (int i = 0; i < 2; i++)
    CHECK(rk[i].rc && !strcmp(rk[i].err, "aborted: rank 2 failed"), "abort: rank %d: %s", i, rk[i].err);
  CHECK(secs < 5, "the abort took %.1f s", secs);
  printf("ok abort: %s (%.2f s)\n", rk[0].err, secs);
  run(4, 30, rk, &secs);
  for (int i = 0; i < R; i++) CHECK(rk[i].rc == 0, "rank %d: direct all-reduce: rc %d: %s", i, rk[i].rc, rk[i].err);
  /* per call: each rank copies 3 chunks into staging and its sum to 2 ranks; sums R slots per piece */
  CHECK(n_peer_copies >= 10 * R * (R + R - 1) && n_sums >= 10 * R * R, "direct: %d copies, %d sums", n_peer_copies,
        n_sums);
  printf("ok a direct tag on 3 devices without host copies: the same sums in rank order, bit for bit (%d device "
         "copies, %d device sums in 10 calls)\n", n_peer_copies, n_sums);
  char host_msg[600];
  run(5, 30, rk, &secs);
  CHECK(rk[0].rc == 0 && !strcmp(rk[0].err, "a device-to-device all-reduce needs buffers on a device with copy_peer "
                                              "and accumulate"), "direct, host memory: rc %d: %s", rk[0].rc, rk[0].err);
  snprintf(host_msg, sizeof host_msg, "%s", rk[0].err);
  run(6, 30, rk, &secs);
  CHECK(rk[0].rc == 0 && !strcmp(rk[0].err, "buffer 0: dtype 3 (a device-to-device all-reduce sums f32 and f64)"),
        "direct, i32: rc %d: %s", rk[0].rc, rk[0].err);
  printf("ok a direct tag refuses host memory (%s) and i32 (%s)\n", host_msg, rk[0].err);
  run(7, 30, rk, &secs);
  for (int i = 0; i < R; i++) CHECK(rk[i].rc == 0, "rank %d: reduce-scatter, all-gather: rc %d: %s", i, rk[i].rc, rk[i].err);
  printf("ok reduce-scatter of f32 in parts of whole buffers (%d, 0 and %d elements) over %d ranks: each part the "
         "rank-order sum, bit for bit (5 calls); all-gather from each part's rank; an all-reduce after them\n", N0,
         N1 + N2, R);
  run(8, 30, rk, &secs);
  CHECK(rk[0].rc && !strcmp(rk[0].err, "replica 2's call differs from replica 0's (another operation, or other parts)"),
        "other parts: rank 0: %s", rk[0].err);
  printf("ok other parts on one rank: %s\n", rk[0].err);
  for (int i = 0; i < R; i++) free(rk[i].f);
  printf("%s\n", fails ? "FAILED" : "all passed");
  return fails != 0;
}
