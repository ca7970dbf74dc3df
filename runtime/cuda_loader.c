/* runtime/cuda_loader.c: the dlopen of the CUDA plugin, libduet_cuda.so, only when a CUDA driver
 * (libcuda.so.1) loads; the runtime itself never links CUDA. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collective.h"
#include "dlplugin.h"
#include "duet_rt.h"

#ifndef DUET_CUDA_PLUGIN_DEFAULT
#define DUET_CUDA_PLUGIN_DEFAULT "libduet_cuda.so"
#endif

typedef DuetDevice *(*OpenFn)(const DuetProgram *p, int ordinal, int verbose, char *err, size_t errlen);
typedef int (*ListFn)(FILE *out, char *err, size_t errlen);
typedef int (*ApiFn)(void);

static bool cuda_compatible(void *h) {
  ApiFn api = (ApiFn)dlsym(h, "duet_cuda_plugin_api");
  return api && api() == DUET_CUDA_PLUGIN_API;
}

/* Loads the plugin: $DUET_CUDA_PLUGIN (only it, when set), else next to the executable, else
 * the build tree's copy, else the dynamic loader's search path.  The
 * handle stays open for the life of the process (devices point into it). */
static void *load_plugin(char *err, size_t errlen) {
  void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!drv) {
    snprintf(err, errlen, "no CUDA driver on this machine (%s)", dlerror());
    return NULL;
  }
  /* the plugin links libcuda.so.1 itself; this handle only tested for it */
  dlclose(drv);
  bool named;
  char last[600];
  void *h = duet_dlplugin_open("DUET_CUDA_PLUGIN", "libduet_cuda.so", DUET_CUDA_PLUGIN_DEFAULT, RTLD_NOW | RTLD_LOCAL,
                               cuda_compatible, "CUDA", &named, last, sizeof last);
  if (h) return h;
  if (named) snprintf(err, errlen, "%s", last);
  else snprintf(err, errlen,
                "the CUDA backend libduet_cuda.so could not be loaded (%s); build duet with a CUDA toolkit "
                "(cmake -DDUET_CUDA=ON) or set DUET_CUDA_PLUGIN",
                last[0] ? last : "not found");
  return NULL;
}

DuetDevice *duet_cuda_device(const DuetProgram *p, int ordinal, int verbose, char *err, size_t errlen) {
  void *h = load_plugin(err, errlen);
  if (!h) return NULL;
  OpenFn open = (OpenFn)dlsym(h, "duet_cuda_plugin_open");
  if (!open) {
    snprintf(err, errlen, "libduet_cuda.so lacks duet_cuda_plugin_open");
    return NULL;
  }
  return open(p, ordinal, verbose, err, errlen);
}

int duet_cuda_gpu_count(char *why, size_t whylen) {
  void *h = load_plugin(why, whylen);
  if (!h) return -1;
  typedef int (*CountFn)(char *, size_t);
  CountFn count = (CountFn)dlsym(h, "duet_cuda_plugin_count");
  if (!count) {
    snprintf(why, whylen, "libduet_cuda.so lacks duet_cuda_plugin_count");
    return -1;
  }
  int n = count(why, whylen);
  if (n == 0) snprintf(why, whylen, "the CUDA driver reports no GPU");
  return n;
}

int duet_cuda_meminfo(int index, int64_t *free_b, int64_t *total_b, int *sm, char *err, size_t errlen) {
  void *h = load_plugin(err, errlen);
  if (!h) return -1;
  typedef int (*MemFn)(int, int64_t *, int64_t *, int *, char *, size_t);
  MemFn fn = (MemFn)dlsym(h, "duet_cuda_plugin_meminfo");
  if (!fn) {
    snprintf(err, errlen, "libduet_cuda.so lacks duet_cuda_plugin_meminfo");
    return -1;
  }
  return fn(index, free_b, total_b, sm, err, errlen);
}

int duet_list_devices(FILE *out) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  fprintf(out, "cpu     %ld cores (OpenMP kernels, OpenBLAS GEMMs)\n", ncpu);
  char err[1024];
  void *h = load_plugin(err, sizeof err);
  if (!h) {
    fprintf(out, "cuda    none: %s\n", err);
    return 0;
  }
  ListFn list = (ListFn)dlsym(h, "duet_cuda_plugin_list");
  int n = list ? list(out, err, sizeof err) : -1;
  if (n < 0) fprintf(out, "cuda    none: %s\n", list ? err : "libduet_cuda.so lacks duet_cuda_plugin_list");
  else if (n == 0) fprintf(out, "cuda    none: the driver reports no GPU\n");
  return 0;
}

DuetColl *duet_coll_nccl_new(DuetDevice *const *devs, int R, int S, const int *tag_stage, int n_tags, double timeout,
                             bool profile, DuetColl *host, char *desc, size_t desclen, char *err, size_t errlen) {
  void *h = load_plugin(err, errlen);
  if (!h) return NULL;
  typedef DuetColl *(*NcclFn)(DuetDevice *const *, int, int, const int *, int, double, bool, DuetColl *, char *, size_t,
                              char *, size_t);
  NcclFn make = (NcclFn)dlsym(h, "duet_cuda_plugin_nccl");
  if (!make) {
    snprintf(err, errlen, "libduet_cuda.so lacks duet_cuda_plugin_nccl");
    return NULL;
  }
  return make(devs, R, S, tag_stage, n_tags, timeout, profile, host, desc, desclen, err, errlen);
}

DuetColl *duet_coll_nccl_rank_new(DuetDevice *const *devs, int R, int rank, int S, const int *tag_stage, int n_tags,
                                  double timeout, bool profile, void *ids, char *desc, size_t desclen, char *err,
                                  size_t errlen) {
  void *h = load_plugin(err, errlen);
  if (!h) return NULL;
  typedef DuetColl *(*RankFn)(DuetDevice *const *, int, int, int, const int *, int, double, bool, void *, char *, size_t,
                              char *, size_t);
  RankFn make = (RankFn)dlsym(h, "duet_cuda_plugin_nccl_rank");
  if (!make) {
    snprintf(err, errlen, "libduet_cuda.so lacks duet_cuda_plugin_nccl_rank");
    return NULL;
  }
  return make(devs, R, rank, S, tag_stage, n_tags, timeout, profile, ids, desc, desclen, err, errlen);
}

int duet_coll_nccl_connect(DuetColl *c, const void *ids, DuetColl *host, char *err, size_t errlen) {
  void *h = load_plugin(err, errlen);
  if (!h) return -1;
  typedef int (*ConnectFn)(DuetColl *, const void *, DuetColl *, char *, size_t);
  ConnectFn connect = (ConnectFn)dlsym(h, "duet_cuda_plugin_nccl_connect");
  if (!connect) {
    snprintf(err, errlen, "libduet_cuda.so lacks duet_cuda_plugin_nccl_connect");
    return -1;
  }
  return connect(c, ids, host, err, errlen);
}
