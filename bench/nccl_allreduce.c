/* bench/nccl_allreduce.c: the all-reduce bandwidth NCCL reaches between
 * the GPUs of this machine (a benchmark, not a test; tests/gpu/run.sh runs
 * it on machines with two or more GPUs).
 *
 * One process, one thread driving N GPUs (ncclCommInitAll over cuda:0 ..
 * cuda:N-1, each GPU's primary context and a stream of its own), NCCL
 * loaded as duet loads it (libnccl.so.2 or $DUET_NCCL_LIBRARY, through
 * runtime/cuda/nccl_lib.c).  For each size from --min-mb to --max-mb
 * (doubling), float32 sum, in place: --warmup all-reduces, then --iters
 * of them, each a ncclGroupStart/End over the N GPUs, timed on the host
 * from the first launch until every stream has synchronised.  Prints, as
 * nccl-tests does, the time per all-reduce, the algorithm bandwidth
 * (bytes / time) and the bus bandwidth, algbw x 2(N-1)/N: the bytes each
 * GPU's link carries in a ring all-reduce (Patarasuk & Yuan 2009), so a
 * figure comparable with the link's own rate.  The first all-reduce of
 * each size is checked: rank g holds g + 1, every element of the sum must
 * be N(N+1)/2.
 * usage: nccl_allreduce [--gpus N] [--min-mb A] [--max-mb B] [--iters K] [--warmup W]
 * Exits 1 with a message when a CUDA or NCCL call fails or a sum is wrong. */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../runtime/cuda/duet_nccl.h"

#define MAX_GPUS 16

static void cu(CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) return;
  const char *s = NULL;
  if (cuGetErrorString(r, &s) != CUDA_SUCCESS) s = NULL;
  fprintf(stderr, "nccl_allreduce: %s failed: %s (CUresult %d)\n", call, s ? s : "unknown CUDA error", (int)r);
  exit(1);
}

static DuetNccl api;

static void nc(int r, void *comm, const char *call) {
  if (r == DUET_NCCL_SUCCESS) return;
  char m[600];
  duet_nccl_error(&api, comm, r, m, sizeof m);
  fprintf(stderr, "nccl_allreduce: %s failed: %s\n", call, m);
  exit(1);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double arg_num(int argc, char **argv, const char *flag, double dflt) {
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], flag)) return atof(argv[i + 1]);
  return dflt;
}

int main(int argc, char **argv) {
  int count = 0;
  cu(cuInit(0), "cuInit");
  cu(cuDeviceGetCount(&count), "cuDeviceGetCount");
  int n = (int)arg_num(argc, argv, "--gpus", count), iters = (int)arg_num(argc, argv, "--iters", 20);
  int warmup = (int)arg_num(argc, argv, "--warmup", 5);
  double min_mb = arg_num(argc, argv, "--min-mb", 1), max_mb = arg_num(argc, argv, "--max-mb", 256);
  if (n < 1 || n > count || n > MAX_GPUS || iters < 1 || warmup < 0 || !(min_mb > 0) || max_mb < min_mb) {
    fprintf(stderr, "usage: nccl_allreduce [--gpus N (1..%d)] [--min-mb A] [--max-mb B] [--iters K] [--warmup W]\n",
            count < MAX_GPUS ? count : MAX_GPUS);
    return 2;
  }
  char err[1200];
  if (duet_nccl_open(&api, err, sizeof err)) {
    fprintf(stderr, "nccl_allreduce: %s\n", err);
    return 1;
  }
  CUcontext ctx[MAX_GPUS];
  CUstream st[MAX_GPUS];
  int devs[MAX_GPUS];
  void *comm[MAX_GPUS];
  char name[256] = "";
  for (int g = 0; g < n; g++) {
    CUdevice d;
    cu(cuDeviceGet(&d, g), "cuDeviceGet");
    if (g == 0) cu(cuDeviceGetName(name, sizeof name, d), "cuDeviceGetName");
    cu(cuDevicePrimaryCtxRetain(&ctx[g], d), "cuDevicePrimaryCtxRetain");
    cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
    cu(cuStreamCreate(&st[g], CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    devs[g] = g;
  }
  nc(api.comm_init_all(comm, n, devs), NULL, "ncclCommInitAll");
  printf("nccl_allreduce: NCCL %d.%d.%d (%s", api.major, api.minor, api.patch, api.path);
  if (api.cuda_major) printf(", built with CUDA %d.%d", api.cuda_major, api.cuda_minor);
  printf("), %d GPU%s (cuda:0: %s), float32 sum in place, %d iterations after %d warm-up\n", n, n == 1 ? "" : "s", name,
         iters, warmup);
  printf("%12s %12s %12s %12s %12s\n", "bytes", "elements", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
  size_t max_bytes = (size_t)(max_mb * 1048576.0);
  float *host = malloc(max_bytes);
  if (!host) return 1;
  CUdeviceptr buf[MAX_GPUS];
  for (int g = 0; g < n; g++) {
    cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
    cu(cuMemAlloc(&buf[g], max_bytes), "cuMemAlloc");
  }
  for (size_t bytes = (size_t)(min_mb * 1048576.0) & ~(size_t)3; bytes <= max_bytes && bytes > 0; bytes *= 2) {
    size_t elems = bytes / 4;
    for (int g = 0; g < n; g++) { /* rank g holds g + 1 */
      for (size_t i = 0; i < elems; i++) host[i] = (float)(g + 1);
      cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
      cu(cuMemcpyHtoDAsync(buf[g], host, bytes, st[g]), "cuMemcpyHtoDAsync");
      cu(cuStreamSynchronize(st[g]), "cuStreamSynchronize");
    }
    double t0 = 0;
    for (int it = 0; it < 1 + warmup + iters; it++) {
      if (it == 1 + warmup) t0 = now_s(); /* the streams are idle here: see below */
      nc(api.group_start(), NULL, "ncclGroupStart");
      for (int g = 0; g < n; g++)
        nc(api.all_reduce((void *)buf[g], (void *)buf[g], elems, DUET_NCCL_FLOAT32, DUET_NCCL_SUM, comm[g], st[g]),
           comm[g], "ncclAllReduce");
      nc(api.group_end(), NULL, "ncclGroupEnd");
      if (it == 0 || it == warmup || it == warmup + iters) /* the check; the end of the warm-up; of the timed ones */
        for (int g = 0; g < n; g++) {
          cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
          cu(cuStreamSynchronize(st[g]), "cuStreamSynchronize");
        }
      if (it == 0) {
        float want = (float)n * (float)(n + 1) / 2;
        for (int g = 0; g < n; g++) {
          cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
          cu(cuMemcpyDtoHAsync(host, buf[g], bytes, st[g]), "cuMemcpyDtoHAsync");
          cu(cuStreamSynchronize(st[g]), "cuStreamSynchronize");
          for (size_t i = 0; i < elems; i++)
            if (host[i] != want) {
              fprintf(stderr, "nccl_allreduce: %zu bytes: cuda:%d element %zu is %g, want %g\n", bytes, g, i,
                      (double)host[i], (double)want);
              return 1;
            }
        }
      }
    }
    double t = (now_s() - t0) / iters, algbw = (double)bytes / t / 1e9;
    printf("%12zu %12zu %12.1f %12.2f %12.2f\n", bytes, elems, 1e6 * t, algbw, algbw * 2.0 * (n - 1) / n);
    fflush(stdout);
  }
  for (int g = 0; g < n; g++) {
    cu(cuCtxSetCurrent(ctx[g]), "cuCtxSetCurrent");
    nc(api.comm_destroy(comm[g]), NULL, "ncclCommDestroy");
    cu(cuMemFree(buf[g]), "cuMemFree");
    cu(cuStreamDestroy(st[g]), "cuStreamDestroy");
    cu(cuDevicePrimaryCtxRelease((CUdevice)g), "cuDevicePrimaryCtxRelease");
  }
  free(host);
  duet_nccl_close(&api);
  return 0;
}
