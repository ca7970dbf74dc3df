/* runtime/cuda/duet_nvrtc.h: NVRTC compilation of generated CUDA C (used by
 * the CUDA plugin and by the NVRTC compile test).  Needs the CUDA toolkit's
 * nvrtc.h at build time; nothing here touches a GPU. */
#ifndef DUET_NVRTC_H
#define DUET_NVRTC_H

#include <stddef.h>

/* NVRTC's version (nvrtcVersion).  0, or -1 when the call fails. */
int duet_nvrtc_version(int *major, int *minor);

/* The architectures NVRTC can target, as compute capabilities times ten
 * (75 = sm_75), ascending, at most `max` of them: nvrtcGetSupportedArchs
 * (CUDA >= 11.2).  Returns the count, or -1 when the call fails. */
int duet_nvrtc_archs(int *archs, int max);

/* Compiles `src` (named "duet.cu" in messages) with the options every duet
 * kernel uses (-std=c++17) plus `arch_opt` ("-arch=sm_90": SASS, the image
 * is a CUBIN from nvrtcGetCUBIN; "-arch=compute_75": PTX, NUL-terminated).
 * Returns 0 with a malloc'ed image in *image (*len bytes), or -1 with
 * NVRTC's message and log in err. */
int duet_nvrtc_compile(const char *src, const char *arch_opt, int cubin, void **image, size_t *len, char *err,
                       size_t errlen);

/* The fixed options of duet_nvrtc_compile, space-separated (part of cache
 * keys). */
#define DUET_NVRTC_OPTIONS "-std=c++17"

#endif
