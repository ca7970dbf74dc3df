/* tests/cuda_emu/cuda_emu.h: just enough of CUDA to run duet's generated
 * CUDA C on the host, for tests/test_cuda_emu.c.  Compiled as C++ in front
 * of the generated source.  Blocks run one after another; the threads of a
 * block are POSIX threads, so __syncthreads is a barrier over the block and
 * __shfl_xor_sync a two-phase exchange over the warp's 32 threads.
 * __shared__ variables become function-level statics: one copy, which is
 * what a block shares, as only one block runs at a time.  Dynamic shared
 * memory is the buffer emu_smem. */
#include <math.h>
#include <pthread.h>
#include <string.h>

struct EmuDim {
  unsigned x, y, z;
};
extern thread_local EmuDim threadIdx;
extern EmuDim blockIdx, blockDim, gridDim;
extern pthread_barrier_t emu_block_barrier;
extern pthread_barrier_t emu_warp_barrier[32];
extern unsigned char emu_slots[1024][8];
extern double emu_smem[1 << 17];

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __syncthreads() pthread_barrier_wait(&emu_block_barrier)

static inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, sizeof f);
  return f;
}
static inline double __longlong_as_double(long long i) {
  double d;
  memcpy(&d, &i, sizeof d);
  return d;
}
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T> static T __shfl_xor_sync(unsigned mask, T v, int o) {
  (void)mask;
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  unsigned tid = threadIdx.x, w = tid >> 5;
  memcpy(emu_slots[tid], &v, sizeof v);
  pthread_barrier_wait(&emu_warp_barrier[w]);
  T r;
  memcpy(&r, emu_slots[(w << 5) | ((tid & 31) ^ (unsigned)o)], sizeof r);
  pthread_barrier_wait(&emu_warp_barrier[w]);
  return r;
}
