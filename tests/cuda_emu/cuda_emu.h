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
static inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
/* round-to-nearest f32 add and multiply (the host's default rounding) */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicOr(int *p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
/* __syncthreads_or: a barrier that also ORs a predicate over the block.
 * The word is reset by thread 0 after the third barrier, before any thread
 * can reach the next call's first. */
extern int emu_sync_or_word;
static inline int __syncthreads_or(int pred) {
  pthread_barrier_wait(&emu_block_barrier);
  if (pred) __atomic_store_n(&emu_sync_or_word, 1, __ATOMIC_SEQ_CST);
  pthread_barrier_wait(&emu_block_barrier);
  int r = __atomic_load_n(&emu_sync_or_word, __ATOMIC_SEQ_CST);
  pthread_barrier_wait(&emu_block_barrier);
  if (threadIdx.x == 0) __atomic_store_n(&emu_sync_or_word, 0, __ATOMIC_SEQ_CST);
  return r;
}
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
