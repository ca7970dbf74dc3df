/* runtime/cuda/duet_nvrtc.h: NVRTC compilation of generated CUDA C (used by
 * the CUDA plugin and by the NVRTC compile tests).  Nothing here touches a
 * GPU.
 *
 * Two ways to reach NVRTC, one compile routine:
 *  - the library the build links (nvrtc.c, the toolkit's libnvrtc; needs
 *    nvrtc.h at build time): duet_nvrtc_version/_archs/_compile below,
 *    which the plugin uses;
 *  - a library loaded by path with dlopen (nvrtc_lib.c, no CUDA header or
 *    library needed at build time): duet_nvrtc_open, used by
 *    tests/test_nvrtc_sm60.c to compile for sm_60 with the CUDA 12.x and
 *    11.8 NVRTC that a P100 needs (tools/fetch-nvrtc.sh).
 * Both go through the DuetNvrtc table of entry points and the same
 * duet_nvrtc_lib_* functions (same options, same PTX/CUBIN retrieval). */
#ifndef DUET_NVRTC_H
#define DUET_NVRTC_H

#include <stddef.h>

/* NVRTC's entry points with nvrtcProgram as void * and nvrtcResult as int
 * (NVRTC_SUCCESS = 0), the ABI every NVRTC since 11.2 shares.  Every
 * pointer is set (duet_nvrtc_open fails otherwise). */
typedef struct DuetNvrtc {
  void *dl; /* dlopen handle; NULL for the linked library */
  void *builtins[4]; /* libnvrtc-builtins.so.* loaded from dl's directory */
  int n_builtins;
  char path[1024];
  int (*version)(int *major, int *minor);
  int (*num_archs)(int *n);
  int (*archs)(int *archs);
  const char *(*error_string)(int result);
  int (*create)(void **prog, const char *src, const char *name, int n_headers, const char *const *headers,
                const char *const *include_names);
  int (*compile)(void *prog, int n_options, const char *const *options);
  int (*log_size)(void *prog, size_t *n);
  int (*log)(void *prog, char *log);
  int (*ptx_size)(void *prog, size_t *n);
  int (*ptx)(void *prog, char *ptx);
  int (*cubin_size)(void *prog, size_t *n);
  int (*cubin)(void *prog, char *cubin);
  int (*destroy)(void **prog);
} DuetNvrtc;

/* Loads the NVRTC library at `path` (dlopen, RTLD_LOCAL) and every entry
 * point above (dlsym), after the libnvrtc-builtins.so.* of the same
 * directory, so that NVRTC's own dlopen of its builtins finds them by
 * name wherever its RUNPATH ($ORIGIN) is not honoured (AddressSanitizer's
 * dlopen interceptor).  NULL with a message naming the failed call in err;
 * duet_nvrtc_close releases it (the libraries stay mapped: RTLD_NODELETE). */
DuetNvrtc *duet_nvrtc_open(const char *path, char *err, size_t errlen);
void duet_nvrtc_close(DuetNvrtc *nv);

/* NVRTC's version (nvrtcVersion).  0, or -1 when the call fails. */
int duet_nvrtc_lib_version(const DuetNvrtc *nv, int *major, int *minor);

/* The architectures NVRTC can target, as compute capabilities times ten
 * (75 = sm_75), ascending, at most `max` of them (nvrtcGetSupportedArchs).
 * Returns the count, or -1 when the call fails. */
int duet_nvrtc_lib_archs(const DuetNvrtc *nv, int *archs, int max);

/* Compiles `src` (named "duet.cu" in messages) with the options every duet
 * kernel uses (DUET_NVRTC_OPTIONS) plus `arch_opt` ("-arch=sm_90": SASS,
 * the image is a CUBIN from nvrtcGetCUBIN; "-arch=compute_75": PTX,
 * NUL-terminated).  Returns 0 with a malloc'ed image in *image (*len
 * bytes) and NVRTC's log in err (its warnings; empty when it has none), or
 * -1 with the failed call, NVRTC's message and its log in err. */
int duet_nvrtc_lib_compile(const DuetNvrtc *nv, const char *src, const char *arch_opt, int cubin, void **image,
                           size_t *len, char *err, size_t errlen);

/* The same with the NVRTC the build links (nvrtc.c). */
int duet_nvrtc_version(int *major, int *minor);
int duet_nvrtc_archs(int *archs, int max);
int duet_nvrtc_compile(const char *src, const char *arch_opt, int cubin, void **image, size_t *len, char *err,
                       size_t errlen);

/* The fixed options of duet_nvrtc_compile, space-separated (part of cache
 * keys). */
#define DUET_NVRTC_OPTIONS "-std=c++17"

#endif
