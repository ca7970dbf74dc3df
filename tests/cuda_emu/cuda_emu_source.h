/* tests/cuda_emu/cuda_emu_source.h: a program's generated CUDA C as a host
 * C++ translation unit behind cuda_emu.h, written for tests/test_cuda_emu.c
 * and for the fake GPU's NVRTC (tests/fakegpu/fakegpu.c), which append
 * their own entry points.  Plain C, header-only. */
#ifndef CUDA_EMU_SOURCE_H
#define CUDA_EMU_SOURCE_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Emulated threads per launch up to which a grid-stride kernel runs with
 * the grid the emitter planned (see cuda_emu_grid). */
#define CUDA_EMU_FULL_THREADS 65536u

/* The number of blocks the emulator runs for a launch of `grid` blocks of
 * `block` threads.  A kernel whose indexing depends on its grid
 * (grid_stride 0: a block per tile or per row) always gets its whole grid;
 * a grid-stride kernel gets its whole grid up to CUDA_EMU_FULL_THREADS
 * threads, and beyond that CUDA_EMU_FULL_THREADS / block blocks (at least
 * one), which keeps big shapes affordable and checks that the loops cover
 * the work with a grid smaller than planned. */
static inline unsigned cuda_emu_grid(unsigned grid, unsigned block, int grid_stride) {
  if (!grid_stride || block == 0 || (unsigned long long)grid * block <= CUDA_EMU_FULL_THREADS) return grid;
  unsigned g = CUDA_EMU_FULL_THREADS / block;
  return g < 1 ? 1 : g;
}

/* The seed of the emulator's schedule (the order of blocks and of the
 * threads a barrier releases): $DUET_EMU_SEED when set (a failure is
 * replayed by setting it to the seed the failing run printed), else one
 * from the clock and the process id, so that runs explore different
 * orders.  0 and the seed in *seed, or -1 when $DUET_EMU_SEED is not a
 * decimal integer below 2^64. */
static inline int cuda_emu_seed(unsigned long long *seed) {
  const char *e = getenv("DUET_EMU_SEED");
  if (e && *e) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(e, &end, 10);
    if (*end || *e < '0' || *e > '9' || errno) return -1;
    *seed = v;
    return 0;
  }
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  unsigned long long z = (unsigned long long)ts.tv_sec * 1000000007ull ^ (unsigned long long)ts.tv_nsec ^
                         (unsigned long long)getpid() << 40;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull; /* splitmix64's finaliser */
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  *seed = (z ^ (z >> 31)) % 1000000000000ull; /* 12 digits: easy to copy */
  return 0;
}

/* Writes to f: the emulation header and launcher, then `cuda` with its
 * dynamic shared memory (`extern __shared__ double duet_smem[];`, which
 * cuda_emu.h's `__shared__` = `static` cannot express) mapped to the
 * emulator's buffer emu_smem.  0, or -1 when writing failed. */
static inline int cuda_emu_write_source(FILE *f, const char *cuda) {
  fputs("#include \"cuda_emu.h\"\n#include \"cuda_emu_rt.cpp\"\n", f);
  const char *dyn = "extern __shared__ double duet_smem[];";
  for (const char *p = cuda; *p;) {
    const char *q = strstr(p, dyn);
    if (!q) {
      fputs(p, f);
      break;
    }
    fwrite(p, 1, (size_t)(q - p), f);
    fputs("double *duet_smem = emu_smem;", f);
    p = q + strlen(dyn);
  }
  fputs("\n", f);
  return ferror(f) ? -1 : 0;
}

#endif
