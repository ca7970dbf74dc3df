/* tests/cuda_emu/cuda_emu_rt.cpp: the launcher of cuda_emu.h, compiled into
 * every emulated module: emu_launch(fn, grid, block, t, s) runs the grid's
 * blocks in order, each as `block` POSIX threads. */
#include <pthread.h>
#include <stdio.h>

thread_local EmuDim threadIdx;
EmuDim blockIdx, blockDim, gridDim;
pthread_barrier_t emu_block_barrier;
pthread_barrier_t emu_warp_barrier[32];
unsigned char emu_slots[1024][8];
double emu_smem[1 << 17];

typedef void (*EmuKernel)(void *const *t, const double *s);
struct EmuArg {
  EmuKernel fn;
  unsigned tid;
  void *const *t;
  const double *s;
};

static void *emu_thread(void *p) {
  EmuArg *a = (EmuArg *)p;
  threadIdx.x = a->tid;
  threadIdx.y = threadIdx.z = 0;
  a->fn(a->t, a->s);
  return NULL;
}

extern "C" int emu_launch(EmuKernel fn, unsigned grid, unsigned block, void *const *t, const double *s) {
  if (block == 0 || block > 1024 || block % 32) return -1;
  static pthread_t th[1024];
  static EmuArg args[1024];
  gridDim.x = grid;
  blockDim.x = block;
  gridDim.y = gridDim.z = blockDim.y = blockDim.z = blockIdx.y = blockIdx.z = 1;
  for (unsigned b = 0; b < grid; b++) {
    blockIdx.x = b;
    if (pthread_barrier_init(&emu_block_barrier, NULL, block)) return -1;
    for (unsigned w = 0; w < block / 32; w++)
      if (pthread_barrier_init(&emu_warp_barrier[w], NULL, 32)) return -1;
    unsigned made = 0;
    for (; made < block; made++) {
      args[made] = EmuArg{fn, made, t, s};
      if (pthread_create(&th[made], NULL, emu_thread, &args[made])) break;
    }
    for (unsigned i = 0; i < made; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&emu_block_barrier);
    for (unsigned w = 0; w < block / 32; w++) pthread_barrier_destroy(&emu_warp_barrier[w]);
    if (made < block) return -1; /* cannot happen silently: the barrier would have hung */
  }
  return 0;
}
