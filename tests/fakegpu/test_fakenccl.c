/* tests/fakegpu/test_fakenccl.c: the fake GPU's NCCL (tests/fakegpu/
 * fakegpu.c, "NCCL"), linked against libduet_fakegpu.so as a program is
 * linked against libcuda and libnccl, on 3 fake GPUs (ctest fakegpu_nccl):
 *  1. ncclGetVersion (2.26.5, or 2.28.9 with DUET_FAKE_NCCL); the argument
 *     checks of ncclCommInitAll (two ranks on one GPU: ncclInvalidUsage,
 *     "Duplicate GPU detected"; a device out of range, no devices:
 *     ncclInvalidArgument);
 *  2. an all-reduce (f32, 100,003 elements, in place) over 3 GPUs, each
 *     rank from its own stream: every rank gets the ring's sum bit for bit
 *     (chunk c of 3 added from rank c + 1 round to rank c), which differs
 *     from the rank-order sum in most elements (the test can tell them
 *     apart); before the stream runs, another stream of the same GPU reads
 *     the old values (a missing wait reads stale memory), and after waiting
 *     for an event recorded behind the all-reduce, the sum;
 *  3. one thread driving the 3 GPUs in ncclGroupStart/End: broadcast from
 *     rank 1, reduce-scatter (ring order per block), all-gather, an i32
 *     sum; ncclGroupEnd without ncclGroupStart: ncclInvalidUsage;
 *  4. argument checks of a collective: NULL communicator, data type and
 *     reduction out of range, root out of range, a buffer of another GPU or
 *     of the host, a stream of another GPU: ncclInvalidArgument;
 *  5. ncclCommInitRank with an id from ncclGetUniqueId, one thread per
 *     rank (an all-reduce from the threads); two ranks on one GPU: both
 *     ncclInvalidUsage; an id not from ncclGetUniqueId: ncclInvalidArgument;
 *  6. DUET_FAKE_NCCL_HANG=2:1: rank 2's first collective never starts; the
 *     others' stay pending (cuEventQuery: not ready, for 0.2 s), and
 *     ncclCommDestroy refuses a rank with it in flight, until ncclCommAbort
 *     ends them; the aborted communicator is then invalid;
 *  7. ranks that disagree (another count on one rank): an asynchronous
 *     ncclInvalidUsage from ncclCommGetAsyncError.
 * Exits 1 on any failure. */
#define _GNU_SOURCE
#include <cuda.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { R = 3, N = 100003 };

static int fails;

static void check(int ok, const char *what) {
  printf("%s %s\n", ok ? "ok" : "FAIL", what);
  fails += !ok;
}

static void cu(CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) return;
  const char *s = NULL;
  cuGetErrorString(r, &s);
  fprintf(stderr, "FAIL %s: %s (CUresult %d)\n", call, s ? s : "?", (int)r);
  exit(1);
}

static void nc(ncclResult_t r, const char *call) {
  if (r == ncclSuccess) return;
  fprintf(stderr, "FAIL %s: %s: %s\n", call, ncclGetErrorString(r), ncclGetLastError(NULL));
  exit(1);
}

static CUcontext ctx[R];
static CUstream st[R];

/* rank 0 and 1 nearly cancel and rank 2 is small, so the order shows */
static float value(int rank, int64_t e) {
  uint64_t x = ((uint64_t)e + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(rank * 131);
  x ^= x >> 29;
  float u = (float)(x % 1000003) / 1000003.0f;
  return rank == 0 ? 1.0f + u : rank == 1 ? -1.0f - u * 0.999f : 1e-6f * (u - 0.5f);
}

/* chunk c of n elements over R ranks (the first n % R one longer) */
static int64_t chunk_lo(int64_t n, int c) { return n / R * c + (c < n % R ? c : n % R); }

static CUdeviceptr upload(int gpu, const void *h, size_t bytes) {
  CUdeviceptr d;
  cu(cuCtxSetCurrent(ctx[gpu]), "cuCtxSetCurrent");
  cu(cuMemAlloc(&d, bytes), "cuMemAlloc");
  cu(cuMemcpyHtoDAsync(d, h, bytes, st[gpu]), "cuMemcpyHtoDAsync");
  cu(cuStreamSynchronize(st[gpu]), "cuStreamSynchronize");
  return d;
}

static void download(int gpu, void *h, CUdeviceptr d, size_t bytes) {
  cu(cuCtxSetCurrent(ctx[gpu]), "cuCtxSetCurrent");
  cu(cuMemcpyDtoHAsync(h, d, bytes, st[gpu]), "cuMemcpyDtoHAsync");
  cu(cuStreamSynchronize(st[gpu]), "cuStreamSynchronize");
}

typedef struct Joiner {
  ncclUniqueId id;
  int rank, gpu;
  ncclComm_t comm;
  ncclResult_t r, ar;
  float got;
} Joiner;

static void *join(void *arg) {
  Joiner *j = arg;
  cuCtxSetCurrent(ctx[j->gpu]);
  j->r = ncclCommInitRank(&j->comm, R, j->id, j->rank);
  if (j->r != ncclSuccess) return NULL;
  float x = (float)(j->rank + 1);
  CUdeviceptr d = upload(j->gpu, &x, sizeof x);
  j->ar = ncclAllReduce((void *)d, (void *)d, 1, ncclFloat32, ncclSum, j->comm, st[j->gpu]);
  download(j->gpu, &j->got, d, sizeof j->got);
  cuMemFree(d);
  return NULL;
}

int main(void) {
  setenv("DUET_FAKE_GPUS", "3", 1);
  cu(cuInit(0), "cuInit");
  for (int g = 0; g < R; g++) {
    CUdevice dev;
    cu(cuDeviceGet(&dev, g), "cuDeviceGet");
    cu(cuDevicePrimaryCtxRetain(&ctx[g], dev), "cuDevicePrimaryCtxRetain");
    cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
    cu(cuStreamCreate(&st[g], CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }
  char what[400];
  /* 1. version, ncclCommInitAll's checks */
  int v = 0, v13 = 0;
  nc(ncclGetVersion(&v), "ncclGetVersion");
  setenv("DUET_FAKE_NCCL", "2.28.9", 1);
  nc(ncclGetVersion(&v13), "ncclGetVersion");
  unsetenv("DUET_FAKE_NCCL");
  snprintf(what, sizeof what, "ncclGetVersion: %d, and %d with DUET_FAKE_NCCL=2.28.9", v, v13);
  check(v == 22605 && v13 == 22809, what);
  ncclComm_t comm[R];
  int dup[2] = {0, 0}, far[2] = {0, 7}, all[R] = {0, 1, 2};
  ncclResult_t r = ncclCommInitAll(comm, 2, dup);
  snprintf(what, sizeof what, "ncclCommInitAll on cuda:0 twice: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
  check(r == ncclInvalidUsage && strstr(ncclGetLastError(NULL), "Duplicate GPU detected"), what);
  r = ncclCommInitAll(comm, 2, far);
  ncclResult_t r0 = ncclCommInitAll(comm, 0, all);
  check(r == ncclInvalidArgument && r0 == ncclInvalidArgument,
        "ncclCommInitAll with device 7 of 3, and with no device: ncclInvalidArgument");
  nc(ncclCommInitAll(comm, R, all), "ncclCommInitAll");

  /* 2. the ring order; stale memory without a wait */
  float *h = malloc(N * sizeof *h), *ring = malloc(N * sizeof *ring), *got = malloc(N * sizeof *got);
  if (!h || !ring || !got) return 1;
  CUdeviceptr buf[R];
  for (int g = 0; g < R; g++) {
    for (int64_t e = 0; e < N; e++) h[e] = value(g, e);
    buf[g] = upload(g, h, N * sizeof *h);
  }
  int64_t differ = 0;
  for (int c = 0; c < R; c++)
    for (int64_t e = chunk_lo(N, c); e < chunk_lo(N, c + 1); e++) {
      float s = value((c + 1) % R, e);
      s += value((c + 2) % R, e);
      s += value(c, e);
      ring[e] = s;
      float o = value(0, e);
      o += value(1, e);
      o += value(2, e);
      differ += memcmp(&o, &s, sizeof s) != 0;
    }
  CUstream other;
  CUevent ev;
  cu(cuCtxSetCurrent(ctx[0]), "cuCtxSetCurrent");
  cu(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  cu(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  for (int g = 0; g < R; g++)
    nc(ncclAllReduce((void *)buf[g], (void *)buf[g], N, ncclFloat32, ncclSum, comm[g], st[g]), "ncclAllReduce");
  cu(cuCtxSetCurrent(ctx[0]), "cuCtxSetCurrent");
  cu(cuEventRecord(ev, st[0]), "cuEventRecord");
  float first;
  cu(cuMemcpyDtoHAsync(&first, buf[0], sizeof first, other), "cuMemcpyDtoHAsync"); /* no wait: the old value */
  cu(cuStreamWaitEvent(other, ev, 0), "cuStreamWaitEvent");
  cu(cuMemcpyDtoHAsync(got, buf[0], N * sizeof *got, other), "cuMemcpyDtoHAsync");
  cu(cuStreamSynchronize(other), "cuStreamSynchronize");
  snprintf(what, sizeof what, "before the stream runs, another stream reads the old value (%.9g, rank 0's %.9g)", first,
           value(0, 0));
  check(first == value(0, 0), what);
  int same = !memcmp(got, ring, N * sizeof *got);
  for (int g = 1; g < R; g++) {
    float *o = malloc(N * sizeof *o);
    if (!o) return 1;
    download(g, o, buf[g], N * sizeof *o);
    same &= !memcmp(o, ring, N * sizeof *o);
    free(o);
  }
  snprintf(what, sizeof what, "all-reduce of %d f32 over 3 GPUs: every rank holds the ring's sum bit for bit (the "
           "rank-order sum differs in %lld elements)", N, (long long)differ);
  check(same && differ > N / 2, what);

  /* 3. one thread, three GPUs, groups */
  {
    float b[4], rs[3 * 2], agin[2], ag[3 * 2];
    int32_t k[2];
    CUdeviceptr db[R], drs[R], drsout[R], dag[R], dagout[R], dk[R];
    for (int g = 0; g < R; g++) {
      for (int i = 0; i < 4; i++) b[i] = (float)(10 * g + i);
      for (int i = 0; i < 6; i++) rs[i] = value(g, i);
      agin[0] = (float)g, agin[1] = (float)(g + 100);
      k[0] = g + 1, k[1] = 2147483647;
      db[g] = upload(g, b, sizeof b);
      drs[g] = upload(g, rs, sizeof rs);
      drsout[g] = upload(g, rs, 2 * sizeof *rs);
      dag[g] = upload(g, agin, sizeof agin);
      dagout[g] = upload(g, ag, sizeof ag);
      dk[g] = upload(g, k, sizeof k);
    }
    nc(ncclGroupStart(), "ncclGroupStart");
    for (int g = 0; g < R; g++) {
      nc(ncclBroadcast((void *)db[g], (void *)db[g], 4, ncclFloat32, 1, comm[g], st[g]), "ncclBroadcast");
      nc(ncclReduceScatter((void *)drs[g], (void *)drsout[g], 2, ncclFloat32, ncclSum, comm[g], st[g]), "ncclReduceScatter");
      nc(ncclAllGather((void *)dag[g], (void *)dagout[g], 2, ncclFloat32, comm[g], st[g]), "ncclAllGather");
      nc(ncclAllReduce((void *)dk[g], (void *)dk[g], 2, ncclInt32, ncclSum, comm[g], st[g]), "ncclAllReduce i32");
    }
    nc(ncclGroupEnd(), "ncclGroupEnd");
    int okb = 1, okrs = 1, okag = 1, okk = 1;
    for (int g = 0; g < R; g++) {
      download(g, b, db[g], sizeof b);
      download(g, rs, drsout[g], 2 * sizeof *rs);
      download(g, ag, dagout[g], sizeof ag);
      download(g, k, dk[g], sizeof k);
      for (int i = 0; i < 4; i++) okb &= b[i] == (float)(10 + i);
      for (int i = 0; i < 2; i++) { /* block g from rank g + 1 round to rank g */
        float s = value((g + 1) % R, 2 * g + i);
        s += value((g + 2) % R, 2 * g + i);
        s += value(g, 2 * g + i);
        okrs &= !memcmp(&s, &rs[i], sizeof s);
      }
      for (int j = 0; j < R; j++) okag &= ag[2 * j] == (float)j && ag[2 * j + 1] == (float)(j + 100);
      okk &= k[0] == 6 && k[1] == (int32_t)(uint32_t)(3u * 2147483647u);
      cuMemFree(db[g]), cuMemFree(drs[g]), cuMemFree(drsout[g]), cuMemFree(dag[g]), cuMemFree(dagout[g]), cuMemFree(dk[g]);
    }
    check(okb, "ncclBroadcast from rank 1, in place, in a group driving 3 GPUs from one thread");
    check(okrs, "ncclReduceScatter: rank i's block summed from rank i + 1 round to rank i, bit for bit");
    check(okag, "ncclAllGather: rank i's values at offset 2i on every rank");
    check(okk, "ncclAllReduce of i32: 1 + 2 + 3, and a sum that wraps as the GPU's");
    r = ncclGroupEnd();
    check(r == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart: ncclInvalidUsage");
  }

  /* 4. argument checks */
  {
    CUdeviceptr d1 = buf[1];
    float hostbuf[4];
    ncclResult_t rn = ncclAllReduce((void *)buf[0], (void *)buf[0], 4, ncclFloat32, ncclSum, NULL, st[0]);
    ncclResult_t rt = ncclAllReduce((void *)buf[0], (void *)buf[0], 4, (ncclDataType_t)99, ncclSum, comm[0], st[0]);
    ncclResult_t ro = ncclAllReduce((void *)buf[0], (void *)buf[0], 4, ncclFloat32, (ncclRedOp_t)99, comm[0], st[0]);
    ncclResult_t rr = ncclBroadcast((void *)buf[0], (void *)buf[0], 4, ncclFloat32, 3, comm[0], st[0]);
    ncclResult_t rp = ncclAllReduce((void *)d1, (void *)d1, 4, ncclFloat32, ncclSum, comm[0], st[0]);
    ncclResult_t rh = ncclAllReduce(hostbuf, hostbuf, 4, ncclFloat32, ncclSum, comm[0], st[0]);
    ncclResult_t rs = ncclAllReduce((void *)buf[0], (void *)buf[0], 4, ncclFloat32, ncclSum, comm[0], st[1]);
    ncclResult_t rl = ncclAllReduce((void *)buf[0], (void *)buf[0], N + 1, ncclFloat32, ncclSum, comm[0], st[0]);
    snprintf(what, sizeof what, "ncclInvalidArgument for a NULL communicator (%d), data type 99 (%d), reduction 99 (%d), "
             "root 3 of 3 (%d), GPU 1's buffer on GPU 0's communicator (%d), a host buffer (%d), GPU 1's stream (%d), "
             "a count past the buffer (%d)", rn, rt, ro, rr, rp, rh, rs, rl);
    check(rn == ncclInvalidArgument && rt == ncclInvalidArgument && ro == ncclInvalidArgument &&
              rr == ncclInvalidArgument && rp == ncclInvalidArgument && rh == ncclInvalidArgument &&
              rs == ncclInvalidArgument && rl == ncclInvalidArgument,
          what);
  }
  for (int g = 0; g < R; g++) nc(ncclCommDestroy(comm[g]), "ncclCommDestroy");

  /* 5. ncclCommInitRank from threads */
  {
    Joiner j[R];
    pthread_t th[R];
    ncclUniqueId id;
    nc(ncclGetUniqueId(&id), "ncclGetUniqueId");
    for (int g = 0; g < R; g++) {
      j[g] = (Joiner){.id = id, .rank = g, .gpu = g};
      pthread_create(&th[g], NULL, join, &j[g]);
    }
    int ok = 1;
    for (int g = 0; g < R; g++) {
      pthread_join(th[g], NULL);
      ok &= j[g].r == ncclSuccess && j[g].ar == ncclSuccess && j[g].got == 6.0f;
    }
    check(ok, "ncclCommInitRank from 3 threads with an id from ncclGetUniqueId; an all-reduce from the threads: 6");
    for (int g = 0; g < R; g++)
      if (j[g].comm) nc(ncclCommDestroy(j[g].comm), "ncclCommDestroy");
  }
  {
    /* two of three ranks on GPU 1: every rank fails with ncclInvalidUsage */
    Joiner j[R];
    pthread_t th[R];
    ncclUniqueId id;
    nc(ncclGetUniqueId(&id), "ncclGetUniqueId");
    int gpus[R] = {1, 1, 2};
    for (int g = 0; g < R; g++) {
      j[g] = (Joiner){.id = id, .rank = g, .gpu = gpus[g]};
      pthread_create(&th[g], NULL, join, &j[g]);
    }
    int ok = 1;
    for (int g = 0; g < R; g++) {
      pthread_join(th[g], NULL);
      ok &= j[g].r == ncclInvalidUsage && !j[g].comm;
    }
    check(ok, "ncclCommInitRank with two ranks on cuda:1: every rank gets ncclInvalidUsage (Duplicate GPU detected)");
    ncclUniqueId bad;
    memset(&bad, 0, sizeof bad);
    ncclComm_t c1;
    cu(cuCtxSetCurrent(ctx[0]), "cuCtxSetCurrent");
    r = ncclCommInitRank(&c1, 1, bad, 0);
    check(r == ncclInvalidArgument, "ncclCommInitRank with an id not from ncclGetUniqueId: ncclInvalidArgument");
  }

  /* 6. a hung collective, ended by ncclCommAbort */
  {
    setenv("DUET_FAKE_NCCL_HANG", "2:1", 1);
    nc(ncclCommInitAll(comm, R, all), "ncclCommInitAll");
    unsetenv("DUET_FAKE_NCCL_HANG");
    CUevent done[R];
    for (int g = 0; g < R; g++) {
      for (int64_t e = 0; e < 4; e++) h[4 * g + e] = value(g, e); /* read when the copy runs: one block per rank */
      cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
      cu(cuMemcpyHtoDAsync(buf[g], h + 4 * g, 4 * sizeof *h, st[g]), "cuMemcpyHtoDAsync");
      nc(ncclAllReduce((void *)buf[g], (void *)buf[g], 4, ncclFloat32, ncclSum, comm[g], st[g]), "ncclAllReduce");
      cu(cuEventCreate(&done[g], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
      cu(cuEventRecord(done[g], st[g]), "cuEventRecord");
    }
    struct timespec t0, t1, nap = {0, 10 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int pending = 1;
    do {
      for (int g = 0; g < R; g++) pending &= cuEventQuery(done[g]) == CUDA_ERROR_NOT_READY;
      nanosleep(&nap, NULL);
      clock_gettime(CLOCK_MONOTONIC, &t1);
    } while (pending && (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) < 0.2);
    check(pending, "DUET_FAKE_NCCL_HANG=2:1: every rank's all-reduce is still pending after 0.2 s");
    r = ncclCommDestroy(comm[0]);
    snprintf(what, sizeof what, "ncclCommDestroy with the collective in flight: %s (%s)", ncclGetErrorString(r),
             ncclGetLastError(NULL));
    check(r == ncclInvalidUsage && strstr(ncclGetLastError(NULL), "still in flight"), what);
    for (int g = 0; g < R; g++) nc(ncclCommAbort(comm[g]), "ncclCommAbort");
    int ended = 1;
    for (int g = 0; g < R; g++) {
      cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
      ended &= cuEventSynchronize(done[g]) == CUDA_SUCCESS;
      cu(cuEventDestroy(done[g]), "cuEventDestroy");
    }
    float after;
    download(0, &after, buf[0], sizeof after);
    ncclResult_t ae;
    r = ncclCommGetAsyncError(comm[0], &ae);
    check(ended && after == value(0, 0) && r == ncclInvalidArgument,
          "ncclCommAbort ends the pending collectives (not summed), and the communicator is invalid afterwards");
  }

  /* 7. ranks that disagree */
  {
    nc(ncclCommInitAll(comm, R, all), "ncclCommInitAll");
    for (int g = 0; g < R; g++)
      nc(ncclAllReduce((void *)buf[g], (void *)buf[g], g == 1 ? 5 : 4, ncclFloat32, ncclSum, comm[g], st[g]),
         "ncclAllReduce");
    for (int g = 0; g < R; g++) {
      cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
      cu(cuStreamSynchronize(st[g]), "cuStreamSynchronize");
    }
    ncclResult_t ae = ncclSuccess;
    nc(ncclCommGetAsyncError(comm[0], &ae), "ncclCommGetAsyncError");
    check(ae == ncclInvalidUsage, "ranks whose calls disagree (5 elements on rank 1, 4 elsewhere): an asynchronous "
          "ncclInvalidUsage");
    for (int g = 0; g < R; g++) nc(ncclCommDestroy(comm[g]), "ncclCommDestroy");
  }
  for (int g = 0; g < R; g++) {
    cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
    cu(cuMemFree(buf[g]), "cuMemFree");
  }
  cu(cuCtxSetCurrent(ctx[0]), "cuCtxSetCurrent");
  cu(cuEventDestroy(ev), "cuEventDestroy");
  cu(cuStreamDestroy(other), "cuStreamDestroy");
  for (int g = 0; g < R; g++) {
    cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
    cu(cuStreamDestroy(st[g]), "cuStreamDestroy");
    cu(cuDevicePrimaryCtxRelease(g), "cuDevicePrimaryCtxRelease");
  }
  free(h), free(ring), free(got);
  if (fails) fprintf(stderr, "%d checks failed\n", fails);
  else printf("ok: the fake NCCL's checks bite\n");
  return fails ? 1 : 0;
}
