/* tests/cuda_emu/cuda_emu_source.h: a program's generated CUDA C as a host
 * C++ translation unit behind cuda_emu.h, written for tests/test_cuda_emu.c
 * and for the fake GPU's NVRTC (tests/fakegpu/fakegpu.c), which append
 * their own entry points.  Plain C, header-only. */
#ifndef CUDA_EMU_SOURCE_H
#define CUDA_EMU_SOURCE_H

#include <stdio.h>
#include <string.h>

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
