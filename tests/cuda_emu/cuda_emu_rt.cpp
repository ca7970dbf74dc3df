/* tests/cuda_emu/cuda_emu_rt.cpp: the launcher of cuda_emu.h, compiled into
 * every emulated module.  emu_launch(fn, grid, block, t, s) runs the grid's
 * blocks in order on a pool of 64 POSIX threads (thread i is threadIdx.x
 * i; threads at or above `block` sit the block out); emu_shutdown() stops
 * the pool before the module is unloaded. */
#include <pthread.h>
#include <stdio.h>

#define EMU_POOL 64

thread_local EmuDim threadIdx;
EmuDim blockIdx, blockDim, gridDim;
pthread_barrier_t emu_block_barrier;
pthread_barrier_t emu_warp_barrier[32];
unsigned char emu_slots[1024][8];
double emu_smem[1 << 17];
int emu_sync_or_word;

typedef void (*EmuKernel)(void *const *t, const double *s);
static pthread_t emu_pool[EMU_POOL];
static pthread_barrier_t emu_start, emu_end; /* the pool and the launcher */
static int emu_started, emu_stop;
static EmuKernel emu_fn;
static void *const *emu_t;
static const double *emu_s;

static void *emu_worker(void *p) {
  threadIdx.x = (unsigned)(size_t)p;
  threadIdx.y = threadIdx.z = 0;
  for (;;) {
    pthread_barrier_wait(&emu_start);
    if (emu_stop) return NULL;
    if (threadIdx.x < blockDim.x) emu_fn(emu_t, emu_s);
    pthread_barrier_wait(&emu_end);
  }
}

extern "C" int emu_launch(EmuKernel fn, unsigned grid, unsigned block, void *const *t, const double *s) {
  if (block == 0 || block > EMU_POOL || block % 32) return -1;
  if (!emu_started) {
    if (pthread_barrier_init(&emu_start, NULL, EMU_POOL + 1) || pthread_barrier_init(&emu_end, NULL, EMU_POOL + 1))
      return -1;
    for (size_t i = 0; i < EMU_POOL; i++)
      if (pthread_create(&emu_pool[i], NULL, emu_worker, (void *)i)) {
        fprintf(stderr, "cuda_emu: pthread_create failed\n");
        return -1; /* the pool is incomplete: the test fails rather than hangs later */
      }
    emu_started = 1;
  }
  emu_fn = fn;
  emu_t = t;
  emu_s = s;
  gridDim.x = grid;
  blockDim.x = block;
  gridDim.y = gridDim.z = blockDim.y = blockDim.z = blockIdx.y = blockIdx.z = 1;
  for (unsigned b = 0; b < grid; b++) {
    blockIdx.x = b;
    if (pthread_barrier_init(&emu_block_barrier, NULL, block)) return -1;
    for (unsigned w = 0; w < block / 32; w++)
      if (pthread_barrier_init(&emu_warp_barrier[w], NULL, 32)) return -1;
    pthread_barrier_wait(&emu_start);
    pthread_barrier_wait(&emu_end);
    pthread_barrier_destroy(&emu_block_barrier);
    for (unsigned w = 0; w < block / 32; w++) pthread_barrier_destroy(&emu_warp_barrier[w]);
  }
  return 0;
}

extern "C" void emu_shutdown(void) {
  if (!emu_started) return;
  emu_stop = 1;
  pthread_barrier_wait(&emu_start);
  for (int i = 0; i < EMU_POOL; i++) pthread_join(emu_pool[i], NULL);
  pthread_barrier_destroy(&emu_start);
  pthread_barrier_destroy(&emu_end);
  emu_started = 0;
}
