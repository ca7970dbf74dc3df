/* runtime/cuda/nvrtc.c: generated CUDA C -> PTX or CUBIN with NVRTC. */
#include "duet_nvrtc.h"

#include <cuda.h> /* CUDA_VERSION */
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int duet_nvrtc_version(int *major, int *minor) {
  return nvrtcVersion(major, minor) == NVRTC_SUCCESS ? 0 : -1;
}

int duet_nvrtc_archs(int *archs, int max) {
#if CUDA_VERSION >= 11020
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n < 0) return -1;
  int *all = malloc(sizeof *all * (size_t)(n ? n : 1));
  if (!all) return -1;
  if (nvrtcGetSupportedArchs(all) != NVRTC_SUCCESS) {
    free(all);
    return -1;
  }
  int k = 0;
  for (int i = 0; i < n && k < max; i++) archs[k++] = all[i];
  free(all);
  /* ascending (the documented order, enforced) */
  for (int i = 1; i < k; i++)
    for (int j = i; j > 0 && archs[j - 1] > archs[j]; j--) {
      int t = archs[j];
      archs[j] = archs[j - 1];
      archs[j - 1] = t;
    }
  return k;
#else
  (void)archs;
  (void)max;
  return -1;
#endif
}

int duet_nvrtc_compile(const char *src, const char *arch_opt, int cubin, void **image, size_t *len, char *err,
                       size_t errlen) {
  *image = NULL;
  *len = 0;
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, src, "duet.cu", 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    snprintf(err, errlen, "nvrtcCreateProgram failed: %s", nvrtcGetErrorString(r));
    return -1;
  }
  const char *opts[] = {DUET_NVRTC_OPTIONS, arch_opt};
  int rc = -1;
  r = nvrtcCompileProgram(prog, 2, opts);
  if (r != NVRTC_SUCCESS) {
    size_t loglen = 0;
    char *log = NULL;
    if (nvrtcGetProgramLogSize(prog, &loglen) == NVRTC_SUCCESS && (log = malloc(loglen + 1)) &&
        nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS)
      log[loglen] = 0;
    else if (log)
      log[0] = 0;
    snprintf(err, errlen, "NVRTC compile (%s %s) failed: %s\n%s", DUET_NVRTC_OPTIONS, arch_opt,
             nvrtcGetErrorString(r), log ? log : "");
    free(log);
    goto out;
  }
  size_t n = 0;
  if (cubin) {
#if CUDA_VERSION >= 11010
    r = nvrtcGetCUBINSize(prog, &n);
#else
    r = NVRTC_ERROR_INVALID_INPUT; /* no CUBIN before CUDA 11.1 */
#endif
  } else {
    r = nvrtcGetPTXSize(prog, &n);
  }
  if (r != NVRTC_SUCCESS || n == 0) {
    snprintf(err, errlen, "NVRTC gave no %s for %s: %s", cubin ? "CUBIN" : "PTX", arch_opt, nvrtcGetErrorString(r));
    goto out;
  }
  char *img = malloc(n + 1);
  if (!img) {
    snprintf(err, errlen, "out of host memory");
    goto out;
  }
#if CUDA_VERSION >= 11010
  r = cubin ? nvrtcGetCUBIN(prog, img) : nvrtcGetPTX(prog, img);
#else
  r = nvrtcGetPTX(prog, img);
#endif
  if (r != NVRTC_SUCCESS) {
    snprintf(err, errlen, "NVRTC: reading the %s failed: %s", cubin ? "CUBIN" : "PTX", nvrtcGetErrorString(r));
    free(img);
    goto out;
  }
  img[n] = 0;
  *image = img;
  *len = n;
  rc = 0;
out:
  nvrtcDestroyProgram(&prog);
  return rc;
}
