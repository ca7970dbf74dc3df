/* runtime/cuda/nvrtc.c: the NVRTC the build links (the toolkit's libnvrtc),
 * as a DuetNvrtc table for nvrtc_lib.c's compile routine.  Each entry is a
 * wrapper with NVRTC's own types, so the linked path calls nothing through
 * a converted function pointer. */
#include <cuda.h> /* CUDA_VERSION */
#include <nvrtc.h>

#include "duet_nvrtc.h"

/* nvrtcGetSupportedArchs (11.2) and nvrtcGetCUBIN (11.1): CMake requires
 * CUDA 11.2 or later */
#if CUDA_VERSION < 11020
#error "duet's CUDA backend needs CUDA 11.2 or later (nvrtcGetSupportedArchs)"
#endif

static int l_version(int *major, int *minor) { return (int)nvrtcVersion(major, minor); }
static int l_num_archs(int *n) { return (int)nvrtcGetNumSupportedArchs(n); }
static int l_archs(int *archs) { return (int)nvrtcGetSupportedArchs(archs); }
static const char *l_error_string(int r) { return nvrtcGetErrorString((nvrtcResult)r); }
static int l_create(void **prog, const char *src, const char *name, int n_headers, const char *const *headers,
                    const char *const *include_names) {
  nvrtcProgram p = NULL;
  nvrtcResult r = nvrtcCreateProgram(&p, src, name, n_headers, headers, include_names);
  *prog = p;
  return (int)r;
}
static int l_compile(void *prog, int n, const char *const *opts) {
  return (int)nvrtcCompileProgram((nvrtcProgram)prog, n, opts);
}
static int l_log_size(void *prog, size_t *n) { return (int)nvrtcGetProgramLogSize((nvrtcProgram)prog, n); }
static int l_log(void *prog, char *log) { return (int)nvrtcGetProgramLog((nvrtcProgram)prog, log); }
static int l_ptx_size(void *prog, size_t *n) { return (int)nvrtcGetPTXSize((nvrtcProgram)prog, n); }
static int l_ptx(void *prog, char *ptx) { return (int)nvrtcGetPTX((nvrtcProgram)prog, ptx); }
static int l_cubin_size(void *prog, size_t *n) { return (int)nvrtcGetCUBINSize((nvrtcProgram)prog, n); }
static int l_cubin(void *prog, char *cubin) { return (int)nvrtcGetCUBIN((nvrtcProgram)prog, cubin); }
static int l_destroy(void **prog) {
  nvrtcProgram p = *prog;
  nvrtcResult r = nvrtcDestroyProgram(&p);
  *prog = p;
  return (int)r;
}

static const DuetNvrtc linked = {
    .dl = NULL,
    .path = "(linked libnvrtc)",
    .version = l_version,
    .num_archs = l_num_archs,
    .archs = l_archs,
    .error_string = l_error_string,
    .create = l_create,
    .compile = l_compile,
    .log_size = l_log_size,
    .log = l_log,
    .ptx_size = l_ptx_size,
    .ptx = l_ptx,
    .cubin_size = l_cubin_size,
    .cubin = l_cubin,
    .destroy = l_destroy,
};

int duet_nvrtc_version(int *major, int *minor) { return duet_nvrtc_lib_version(&linked, major, minor); }

int duet_nvrtc_archs(int *archs, int max) { return duet_nvrtc_lib_archs(&linked, archs, max); }

int duet_nvrtc_compile(const char *src, const char *arch_opt, int cubin, void **image, size_t *len, char *err,
                       size_t errlen) {
  return duet_nvrtc_lib_compile(&linked, src, arch_opt, cubin, image, len, err, errlen);
}
