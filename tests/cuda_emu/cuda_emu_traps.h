/* tests/cuda_emu/cuda_emu_traps.h: deliberately wrong CUDA kernels that
 * the emulator (cuda_emu.h, cuda_emu_rt.cpp) must catch, each beside its
 * corrected twin that must pass (so that a catch is the bug's, not a
 * broken check): the proof that the emulator's schedule and fills bite,
 * run by tests/test_cuda_emu.c (emulator) through the launcher and by
 * tests/fakegpu/test_fakegpu.c through the fake GPU's driver.  Each kernel
 * takes (float *out, int fixed), fixed = 0 for the bug and 1 for the twin:
 *  - uninit_shared adds into a __shared__ array that nobody zeroed, in
 *    one block, the first launch to use it (right where shared memory
 *    starts as zeros); dyn_shared does the same with dynamic shared
 *    memory: the 0xff fill (NaN) shows in the output;
 *  - shared_carry expects what block 0 left in a __shared__ variable:
 *    every block's shared memory is filled afresh;
 *  - no_barrier reads what thread 0 wrote to shared memory without a
 *    __syncthreads between: the threads resume in a random order;
 *  - chain expects block b - 1 to have finished before block b starts:
 *    the blocks run in a random order;
 *  - two_warps sums the partials of the first two warps only (right for
 *    64-thread blocks): blocks run with the 256 threads the launch asks
 *    for;
 *  - fresh adds into device memory that nobody zeroed: the fake GPU's
 *    fresh allocations hold NaN (a driver-level trap: test_cuda_emu, which
 *    has no driver, skips it).
 * Besides, order(unsigned *out, int) records the order in which the blocks
 * ran (out[0] counts, out[1 + k] is the k-th block) and count(unsigned
 * *out, int) the threads of each block.  Plain C, header-only. */
#ifndef CUDA_EMU_TRAPS_H
#define CUDA_EMU_TRAPS_H

#include <string.h>

static const char *const cuda_emu_trap_src =
    "extern \"C\" __global__ void uninit_shared(float *out, int fixed) {\n"
    "  __shared__ float x[256];\n"
    "  if (fixed) x[threadIdx.x] = 0.0f;\n"
    "  x[threadIdx.x] += 1.0f;\n"
    "  __syncthreads();\n"
    "  out[blockIdx.x * blockDim.x + threadIdx.x] = x[threadIdx.x ^ 1];\n}\n"
    "extern \"C\" __global__ void dyn_shared(float *out, int fixed) {\n"
    "  extern __shared__ double duet_smem[];\n"
    "  float *x = (float *)duet_smem;\n"
    "  if (fixed) x[threadIdx.x] = 0.0f;\n"
    "  x[threadIdx.x] += 1.0f;\n"
    "  __syncthreads();\n"
    "  out[blockIdx.x * blockDim.x + threadIdx.x] = x[threadIdx.x ^ 1];\n}\n"
    "extern \"C\" __global__ void shared_carry(float *out, int fixed) {\n"
    "  __shared__ float base;\n"
    "  if ((fixed || blockIdx.x == 0) && threadIdx.x == 0) base = 1.0f;\n"
    "  __syncthreads();\n"
    "  out[blockIdx.x * blockDim.x + threadIdx.x] = base;\n}\n"
    "extern \"C\" __global__ void no_barrier(float *out, int fixed) {\n"
    "  __shared__ float v;\n"
    "  if (threadIdx.x == 0) v = 1.0f;\n"
    "  if (fixed) __syncthreads();\n"
    "  out[blockIdx.x * blockDim.x + threadIdx.x] = v;\n}\n"
    "extern \"C\" __global__ void chain(float *out, int fixed) {\n"
    "  if (threadIdx.x == 0) out[blockIdx.x] = fixed || blockIdx.x == 0 ? blockIdx.x + 1.0f : out[blockIdx.x - 1] + 1.0f;\n}\n"
    "extern \"C\" __global__ void two_warps(float *out, int fixed) {\n"
    "  __shared__ float red[32];\n"
    "  float v = 1.0f;\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x != 0) return;\n"
    "  float s = 0;\n"
    "  for (unsigned w = 0; w < (fixed ? blockDim.x >> 5 : 2); w++) s += red[w];\n"
    "  out[blockIdx.x] = s;\n}\n"
    "extern \"C\" __global__ void fresh(float *out, int fixed) {\n"
    "  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (fixed) out[i] = 0.0f;\n"
    "  out[i] += 1.0f;\n}\n"
    "extern \"C\" __global__ void order(unsigned *out, int unused) {\n"
    "  if (threadIdx.x == 0) out[1 + atomicAdd(&out[0], 1u)] = blockIdx.x;\n}\n"
    "extern \"C\" __global__ void count(unsigned *out, int unused) {\n"
    "  atomicAdd(&out[blockIdx.x], 1u);\n}\n";

typedef struct CudaEmuTrap {
  const char *name;
  unsigned grid, block, shared; /* the launch: blocks, threads, dynamic shared bytes */
  int n_out;                    /* floats of the output compared */
  float want;                   /* each one's intended value (chain: its index + 1) */
  int driver;                   /* caught by the driver's fresh memory, not the launcher */
} CudaEmuTrap;

static const CudaEmuTrap cuda_emu_traps[] = {
    {"uninit_shared", 1, 256, 0, 256, 1, 0},  {"dyn_shared", 1, 256, 1024, 256, 1, 0},
    {"shared_carry", 8, 64, 0, 8 * 64, 1, 0}, {"no_barrier", 8, 256, 0, 8 * 256, 1, 0},
    {"chain", 64, 32, 0, 64, 0, 0},           {"two_warps", 4, 256, 0, 4, 256, 0},
    {"fresh", 4, 256, 0, 4 * 256, 1, 1},
};
#define CUDA_EMU_N_TRAPS ((int)(sizeof cuda_emu_traps / sizeof *cuda_emu_traps))

/* The elements of trap tr's output that are off their intended value. */
static inline int cuda_emu_trap_off(const CudaEmuTrap *tr, const float *out) {
  int off = 0;
  for (int j = 0; j < tr->n_out; j++) off += !(out[j] == (strcmp(tr->name, "chain") ? tr->want : (float)(j + 1)));
  return off;
}

#endif
