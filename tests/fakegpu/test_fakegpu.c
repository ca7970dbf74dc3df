/* tests/fakegpu/test_fakegpu.c: the fake GPU's emulator checks through the
 * driver API and NVRTC, linked against libduet_fakegpu.so as a program is
 * linked against libcuda and NVRTC (ctest fakegpu_emulator):
 *  1. fresh cuMemAlloc memory reads back as bytes 0xff (a NaN in every
 *     float type);
 *  2. the deliberately wrong kernels of tests/cuda_emu/cuda_emu_traps.h,
 *     compiled by the fake NVRTC and launched with cuLaunchKernel into
 *     fresh allocations, are caught and their corrected twins are right:
 *     the fake hands the launch's block size and dynamic shared bytes to
 *     the emulator, fills shared memory before every block and shuffles
 *     the blocks and threads;
 *  3. a 1024-thread block runs every thread; a grid-stride kernel (one
 *     that reads gridDim) runs its whole grid of 256 blocks of 256 threads
 *     (65,536 threads) and 256 of a grid of 512 blocks, and its loop still
 *     covers every element;
 *  4. the block order is printed and replayed: two processes with
 *     DUET_EMU_SEED=12345 print "seed 12345" and run the 64 blocks of
 *     `order` in the same shuffled order, one with 12346 in another; a seed
 *     that is not a number fails cuInit with a message.
 * Exits 77 when no C++ compiler (the fake NVRTC's) is installed.
 * usage: test_fakegpu            (the checks)
 *        test_fakegpu order      (prints the order of one launch; for 4) */
#define _GNU_SOURCE
#include <cuda.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../cuda_emu/cuda_emu_traps.h"

/* a grid-stride kernel: out[1 + i] = 1 for i < n; out[0] counts the blocks */
static const char *const stride_src =
    "extern \"C\" __global__ void stride(float *out, int n) {\n"
    "  if (threadIdx.x == 0) atomicAdd((unsigned *)out, 1u);\n"
    "  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) out[1 + i] = 1.0f;\n"
    "}\n";

static int fails;

static void check(int ok, const char *what) {
  printf("%s %s\n", ok ? "ok" : "FAIL", what);
  fails += !ok;
}

/* CUDA and NVRTC calls: on failure, a message and exit(1) */
static void cu(CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) return;
  const char *s = NULL;
  cuGetErrorString(r, &s);
  fprintf(stderr, "FAIL %s: %s (CUresult %d)\n", call, s ? s : "?", (int)r);
  exit(1);
}

static CUstream stream;

/* out = a fresh allocation of n bytes; launches f(out, arg) on grid x
 * block threads with `shared` dynamic bytes; copies the result to host */
static void run(CUfunction f, unsigned grid, unsigned block, unsigned shared, int arg, void *host, size_t n) {
  CUdeviceptr out;
  cu(cuMemAlloc(&out, n), "cuMemAlloc");
  void *params[] = {&out, &arg};
  cu(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shared, stream, params, NULL), "cuLaunchKernel");
  cu(cuMemcpyDtoHAsync(host, out, n, stream), "cuMemcpyDtoHAsync");
  cu(cuStreamSynchronize(stream), "cuStreamSynchronize");
  cu(cuMemFree(out), "cuMemFree");
}

static CUmodule load(const char *src) {
  nvrtcProgram p;
  const char *opts[] = {"-std=c++17", "-arch=sm_60"};
  size_t n = 0;
  if (nvrtcCreateProgram(&p, src, "traps.cu", 0, NULL, NULL) != NVRTC_SUCCESS ||
      nvrtcCompileProgram(p, 2, opts) != NVRTC_SUCCESS || nvrtcGetCUBINSize(p, &n) != NVRTC_SUCCESS) {
    size_t ln = 0;
    char log[8192] = "";
    if (nvrtcGetProgramLogSize(p, &ln) == NVRTC_SUCCESS && ln < sizeof log) nvrtcGetProgramLog(p, log);
    fprintf(stderr, "FAIL compiling the kernels:\n%s\n", log);
    exit(1);
  }
  char *img = malloc(n);
  if (!img || nvrtcGetCUBIN(p, img) != NVRTC_SUCCESS) exit(1);
  CUmodule m;
  cu(cuModuleLoadData(&m, img), "cuModuleLoadData");
  free(img);
  nvrtcDestroyProgram(&p);
  return m;
}

int main(int argc, char **argv) {
  const char *cxx = getenv("CXX");
  char probe[300];
  snprintf(probe, sizeof probe, "'%s' --version > /dev/null 2>&1", cxx && *cxx ? cxx : "c++");
  if (system(probe)) {
    printf("SKIP: no C++ compiler (%s) for the fake NVRTC\n", cxx && *cxx ? cxx : "c++");
    return 77;
  }
  CUresult ir = cuInit(0);
  if (argc > 1 && !strcmp(argv[1], "init")) return ir == CUDA_SUCCESS ? 0 : 3;
  cu(ir, "cuInit");
  CUdevice dev;
  CUcontext ctx;
  cu(cuDeviceGet(&dev, 0), "cuDeviceGet");
  cu(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  cu(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  cu(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  size_t len = strlen(cuda_emu_trap_src) + strlen(stride_src) + 1;
  char *src = malloc(len);
  if (!src) return 1;
  snprintf(src, len, "%s%s", cuda_emu_trap_src, stride_src);
  CUmodule m = load(src);
  free(src);
  CUfunction order;
  cu(cuModuleGetFunction(&order, m, "order"), "cuModuleGetFunction order");
  if (argc > 1 && !strcmp(argv[1], "order")) {
    unsigned o[65];
    CUdeviceptr d;
    int unused = 0;
    void *params[] = {&d, &unused};
    cu(cuMemAlloc(&d, sizeof o), "cuMemAlloc");
    cu(cuMemsetD8Async(d, 0, sizeof o, stream), "cuMemsetD8Async");
    cu(cuLaunchKernel(order, 64, 1, 1, 32, 1, 1, 0, stream, params, NULL), "cuLaunchKernel order");
    cu(cuMemcpyDtoHAsync(o, d, sizeof o, stream), "cuMemcpyDtoHAsync");
    for (int b = 0; b < 64; b++) printf("%u ", o[1 + b]);
    printf("count %u\n", o[0]);
    fflush(stdout);
    cu(cuMemFree(d), "cuMemFree");
    cu(cuModuleUnload(m), "cuModuleUnload");
    cu(cuStreamDestroy(stream), "cuStreamDestroy");
    cu(cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease");
    return 0;
  }

  /* 1. fresh memory */
  {
    CUdeviceptr d;
    unsigned char h[4096];
    cu(cuMemAlloc(&d, sizeof h), "cuMemAlloc");
    cu(cuMemcpyDtoHAsync(h, d, sizeof h, stream), "cuMemcpyDtoHAsync");
    int all = 1;
    for (size_t i = 0; i < sizeof h; i++) all &= h[i] == 0xff;
    check(all, "fresh cuMemAlloc memory reads as bytes 0xff (NaN)");
    cu(cuMemFree(d), "cuMemFree");
  }
  /* 2. the traps */
  for (int i = 0; i < CUDA_EMU_N_TRAPS; i++) {
    const CudaEmuTrap *tr = &cuda_emu_traps[i];
    CUfunction f;
    cu(cuModuleGetFunction(&f, m, tr->name), "cuModuleGetFunction");
    size_t n = (size_t)tr->grid * tr->block * sizeof(float);
    float *out = malloc(n);
    if (!out) return 1;
    int off[2];
    for (int fixed = 0; fixed < 2; fixed++) {
      run(f, tr->grid, tr->block, tr->shared, fixed, out, n);
      off[fixed] = cuda_emu_trap_off(tr, out);
    }
    free(out);
    char what[200];
    snprintf(what, sizeof what, "%s caught (%d of %d elements off), its fixed twin right (%d off)", tr->name, off[0],
             tr->n_out, off[1]);
    check(off[0] > 0 && off[1] == 0, what);
  }
  /* 3. block size and grids */
  {
    CUfunction count, stride;
    cu(cuModuleGetFunction(&count, m, "count"), "cuModuleGetFunction count");
    cu(cuModuleGetFunction(&stride, m, "stride"), "cuModuleGetFunction stride");
    CUdeviceptr d;
    unsigned c[2];
    cu(cuMemAlloc(&d, sizeof c), "cuMemAlloc");
    cu(cuMemsetD8Async(d, 0, sizeof c, stream), "cuMemsetD8Async");
    int unused = 0;
    void *params[] = {&d, &unused};
    cu(cuLaunchKernel(count, 2, 1, 1, 1024, 1, 1, 0, stream, params, NULL), "cuLaunchKernel count");
    cu(cuMemcpyDtoHAsync(c, d, sizeof c, stream), "cuMemcpyDtoHAsync");
    cu(cuMemFree(d), "cuMemFree");
    char what[200];
    snprintf(what, sizeof what, "2 blocks of 1024 threads ran %u and %u threads", c[0], c[1]);
    check(c[0] == 1024 && c[1] == 1024, what);
    for (int g = 256; g <= 512; g *= 2) {
      int n = 512 * 256 + 17;
      size_t bytes = (size_t)(n + 1) * sizeof(float);
      float *h = malloc(bytes);
      cu(cuMemAlloc(&d, bytes), "cuMemAlloc");
      cu(cuMemsetD8Async(d, 0, sizeof(float), stream), "cuMemsetD8Async");
      void *ps[] = {&d, &n};
      cu(cuLaunchKernel(stride, (unsigned)g, 1, 1, 256, 1, 1, 0, stream, ps, NULL), "cuLaunchKernel stride");
      if (!h) return 1;
      cu(cuMemcpyDtoHAsync(h, d, bytes, stream), "cuMemcpyDtoHAsync");
      cu(cuMemFree(d), "cuMemFree");
      unsigned blocks;
      memcpy(&blocks, h, sizeof blocks);
      int covered = 1;
      for (int i = 0; i < n; i++) covered &= h[1 + i] == 1.0f;
      snprintf(what, sizeof what, "grid-stride kernel, grid %d x 256: %u blocks ran (want 256), %s every element", g,
               blocks, covered ? "covering" : "NOT covering");
      check(blocks == 256 && covered, what);
      free(h);
    }
  }
  cu(cuModuleUnload(m), "cuModuleUnload");

  /* 4. the seed: printed and replayed */
  char line[3][4096];
  for (int r = 0; r < 3; r++) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "DUET_EMU_SEED=%d '/proc/%d/exe' order 2>&1", r == 2 ? 12346 : 12345, (int)getpid());
    FILE *p = popen(cmd, "r");
    line[r][0] = 0;
    char buf[4096];
    int said = 0;
    while (p && fgets(buf, sizeof buf, p)) {
      if (strstr(buf, "random order: seed 1234")) said = 1;
      else if (strstr(buf, " count ")) snprintf(line[r], sizeof line[r], "%s", buf);
    }
    if (!p || pclose(p) != 0 || !said || !line[r][0]) {
      fprintf(stderr, "FAIL %s: no seed line or no order (said %d)\n", cmd, said);
      fails++;
    }
  }
  check(!strcmp(line[0], line[1]) && strcmp(line[0], line[2]) && strstr(line[0], "count 64\n") &&
            strncmp(line[0], "0 1 2 3 4 5 6 7 ", 16),
        "DUET_EMU_SEED=12345 twice: the same shuffled order of 64 blocks, printed seed; 12346: another");
  char cmd[600];
  snprintf(cmd, sizeof cmd, "DUET_EMU_SEED=12x '/proc/%d/exe' init 2>&1", (int)getpid());
  FILE *p = popen(cmd, "r");
  char buf[512];
  int msg = 0;
  while (p && fgets(buf, sizeof buf, p)) msg |= strstr(buf, "DUET_EMU_SEED='12x' is not a decimal integer") != NULL;
  int rc = p ? pclose(p) : -1;
  check(msg && WIFEXITED(rc) && WEXITSTATUS(rc) == 3, "DUET_EMU_SEED=12x: cuInit fails with a message");
  cu(cuStreamDestroy(stream), "cuStreamDestroy");
  cu(cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease");
  if (fails) fprintf(stderr, "%d checks failed\n", fails);
  else printf("ok: the fake GPU's emulator checks bite\n");
  return fails ? 1 : 0;
}
