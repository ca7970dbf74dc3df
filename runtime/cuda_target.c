/* runtime/cuda_target.c: what NVRTC compiles for a given card (pure; no
 * CUDA headers, unit-tested in tests/test_cuda_target.c). */
#include <stdio.h>
#include <string.h>

#include "duet_rt.h"

int duet_cuda_pick_target(const char *card, int cc_major, int cc_minor, const int *archs, int n_archs,
                          int nvrtc_major, int nvrtc_minor, DuetCudaTarget *t, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  int cc = cc_major * 10 + cc_minor, below = 0, lowest = 0;
  for (int i = 0; i < n_archs; i++) {
    if (archs[i] == cc) {
      t->arch = cc;
      t->cubin = 1;
      snprintf(t->arch_opt, sizeof t->arch_opt, "-arch=sm_%d", cc);
      return 0;
    }
    if (archs[i] < cc && archs[i] > below) below = archs[i];
    if (!lowest || archs[i] < lowest) lowest = archs[i];
  }
  if (below) { /* PTX for the newest virtual architecture the card runs; the driver JIT-compiles it */
    t->arch = below;
    t->cubin = 0;
    snprintf(t->arch_opt, sizeof t->arch_opt, "-arch=compute_%d", below);
    return 0;
  }
  /* Toolkits and the oldest card they target: CUDA 12.x sm_50 (Maxwell),
   * CUDA 11.x sm_35 (NVIDIA's CUDA 12.0 and 11.0 release notes). */
  const char *older = cc >= 50 ? "CUDA 12.x" : cc >= 35 ? "CUDA 11.x" : NULL;
  if (!n_archs)
    snprintf(err, errlen, "%s (compute capability %d.%d): NVRTC %d.%d reports no supported GPU architecture", card,
             cc_major, cc_minor, nvrtc_major, nvrtc_minor);
  else if (older)
    snprintf(err, errlen,
             "%s (compute capability %d.%d, sm_%d) is not supported by NVRTC %d.%d, whose oldest target is sm_%d; "
             "%s supports it: use duet built against a %s toolkit (NVRTC, cuBLAS) and a driver that supports the card",
             card, cc_major, cc_minor, cc, nvrtc_major, nvrtc_minor, lowest, older, older);
  else
    snprintf(err, errlen,
             "%s (compute capability %d.%d, sm_%d) is not supported by NVRTC %d.%d, whose oldest target is sm_%d, "
             "nor by any CUDA toolkit duet builds with (CUDA 11.x starts at sm_35)",
             card, cc_major, cc_minor, cc, nvrtc_major, nvrtc_minor, lowest);
  return -1;
}
