/* runtime/cuda/nvrtc_lib.c: generated CUDA C -> PTX or CUBIN through a
 * DuetNvrtc table of NVRTC entry points (the linked library's, nvrtc.c, or
 * one loaded by path here with dlopen).  No CUDA header: builds without a
 * toolkit. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "duet_nvrtc.h"

/* dlsym's object pointer as a function pointer of the table's type (POSIX
 * guarantees the conversion; NVRTC's enum result and opaque program handle
 * are passed as int and void *, as every loader of NVRTC does). */
#define SYM(field, name)                                                                                \
  do {                                                                                                  \
    void *p_ = dlsym(nv->dl, name);                                                                     \
    if (!p_) {                                                                                          \
      const char *e_ = dlerror();                                                                       \
      snprintf(err, errlen, "dlsym(%s) in %s failed: %s", name, path, e_ ? e_ : "symbol not found");    \
      duet_nvrtc_close(nv);                                                                             \
      return NULL;                                                                                      \
    }                                                                                                   \
    memcpy(&nv->field, &p_, sizeof p_);                                                                 \
  } while (0)

/* RTLD_LOCAL: this NVRTC's symbols stay out of the global scope, so another
 * NVRTC in the process is not shadowed.  RTLD_NODELETE: NVRTC is C++ with
 * static state and is never unloaded (nor are the blocks it keeps, which
 * LeakSanitizer would otherwise report once their module is gone). */
#ifdef RTLD_NODELETE
#define NV_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)
#else
#define NV_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL)
#endif

/* dlopen of every libnvrtc-builtins.so.* (not the .alt. variants) in the
 * directory of `path`; 0, or -1 with the failed call in err */
static int open_builtins(DuetNvrtc *nv, const char *path, char *err, size_t errlen) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) return 0; /* a bare name: the dynamic loader's search path */
  *slash = 0;
  DIR *d = opendir(dir[0] ? dir : "/");
  if (!d) return 0; /* dlopen of the library will say what is wrong */
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d)) && nv->n_builtins < (int)(sizeof nv->builtins / sizeof *nv->builtins)) {
    if (strncmp(e->d_name, "libnvrtc-builtins.so.", 21) || strstr(e->d_name, ".alt.")) continue;
    char lib[2048];
    snprintf(lib, sizeof lib, "%s/%s", dir, e->d_name);
    void *h = dlopen(lib, NV_DLOPEN_FLAGS);
    if (!h) {
      const char *m = dlerror();
      snprintf(err, errlen, "dlopen(%s) failed: %s", lib, m ? m : "unknown error");
      rc = -1;
      break;
    }
    nv->builtins[nv->n_builtins++] = h;
  }
  closedir(d);
  return rc;
}

DuetNvrtc *duet_nvrtc_open(const char *path, char *err, size_t errlen) {
  DuetNvrtc *nv = calloc(1, sizeof *nv);
  if (!nv) {
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  snprintf(nv->path, sizeof nv->path, "%s", path);
  if (open_builtins(nv, path, err, errlen)) {
    duet_nvrtc_close(nv);
    return NULL;
  }
  nv->dl = dlopen(path, NV_DLOPEN_FLAGS);
  if (!nv->dl) {
    const char *e = dlerror();
    snprintf(err, errlen, "dlopen(%s) failed: %s", path, e ? e : "unknown error");
    duet_nvrtc_close(nv);
    return NULL;
  }
  SYM(version, "nvrtcVersion");
  SYM(num_archs, "nvrtcGetNumSupportedArchs");
  SYM(archs, "nvrtcGetSupportedArchs");
  SYM(error_string, "nvrtcGetErrorString");
  SYM(create, "nvrtcCreateProgram");
  SYM(compile, "nvrtcCompileProgram");
  SYM(log_size, "nvrtcGetProgramLogSize");
  SYM(log, "nvrtcGetProgramLog");
  SYM(ptx_size, "nvrtcGetPTXSize");
  SYM(ptx, "nvrtcGetPTX");
  SYM(cubin_size, "nvrtcGetCUBINSize");
  SYM(cubin, "nvrtcGetCUBIN");
  SYM(destroy, "nvrtcDestroyProgram");
  return nv;
}

static void close_one(void *h, const char *what) {
  if (h && dlclose(h)) {
    const char *e = dlerror();
    fprintf(stderr, "duet: warning: dlclose(%s) failed: %s\n", what, e ? e : "unknown error");
  }
}

void duet_nvrtc_close(DuetNvrtc *nv) {
  if (!nv) return;
  close_one(nv->dl, nv->path);
  for (int i = 0; i < nv->n_builtins; i++) close_one(nv->builtins[i], "libnvrtc-builtins");
  free(nv);
}

static const char *nv_err(const DuetNvrtc *nv, int r) {
  const char *s = nv->error_string(r);
  return s ? s : "unknown NVRTC error";
}

int duet_nvrtc_lib_version(const DuetNvrtc *nv, int *major, int *minor) {
  return nv->version(major, minor) == 0 ? 0 : -1;
}

int duet_nvrtc_lib_archs(const DuetNvrtc *nv, int *archs, int max) {
  int n = 0;
  if (nv->num_archs(&n) != 0 || n < 0) return -1;
  int *all = malloc(sizeof *all * (size_t)(n ? n : 1));
  if (!all) return -1;
  if (nv->archs(all) != 0) {
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
}

int duet_nvrtc_lib_compile(const DuetNvrtc *nv, const char *src, const char *arch_opt, int cubin, void **image,
                           size_t *len, char *err, size_t errlen) {
  *image = NULL;
  *len = 0;
  void *prog = NULL;
  int r = nv->create(&prog, src, "duet.cu", 0, NULL, NULL);
  if (r != 0) {
    snprintf(err, errlen, "nvrtcCreateProgram failed: %s", nv_err(nv, r));
    return -1;
  }
  const char *opts[] = {DUET_NVRTC_OPTIONS, arch_opt};
  int rc = -1;
  r = nv->compile(prog, 2, opts);
  size_t loglen = 0;
  char *log = NULL;
  if (nv->log_size(prog, &loglen) == 0 && (log = malloc(loglen + 1)) && nv->log(prog, log) == 0)
    log[loglen] = 0;
  else if (log)
    log[0] = 0;
  if (r != 0) {
    snprintf(err, errlen, "nvrtcCompileProgram (%s %s) failed: %s\n%s", DUET_NVRTC_OPTIONS, arch_opt,
             nv_err(nv, r), log ? log : "");
    free(log);
    goto out;
  }
  if (errlen) snprintf(err, errlen, "%s", log ? log : ""); /* warnings, if any */
  free(log);
  size_t n = 0;
  r = cubin ? nv->cubin_size(prog, &n) : nv->ptx_size(prog, &n);
  if (r != 0 || n == 0) {
    snprintf(err, errlen, "%s for %s failed: %s", cubin ? "nvrtcGetCUBINSize" : "nvrtcGetPTXSize", arch_opt,
             r ? nv_err(nv, r) : "empty image");
    goto out;
  }
  char *img = malloc(n + 1);
  if (!img) {
    snprintf(err, errlen, "out of host memory");
    goto out;
  }
  r = cubin ? nv->cubin(prog, img) : nv->ptx(prog, img);
  if (r != 0) {
    snprintf(err, errlen, "%s for %s failed: %s", cubin ? "nvrtcGetCUBIN" : "nvrtcGetPTX", arch_opt, nv_err(nv, r));
    free(img);
    goto out;
  }
  img[n] = 0;
  *image = img;
  *len = n;
  rc = 0;
out:
  r = nv->destroy(&prog);
  if (r != 0 && rc == 0) {
    snprintf(err, errlen, "nvrtcDestroyProgram failed: %s", nv_err(nv, r));
    free(*image);
    *image = NULL;
    *len = 0;
    rc = -1;
  }
  return rc;
}
