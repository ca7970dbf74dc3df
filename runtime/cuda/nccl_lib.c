#define _GNU_SOURCE /* dladdr, dl_iterate_phdr */
/* runtime/cuda/nccl_lib.c: NCCL loaded with dlopen (runtime/cuda/
 * duet_nccl.h): used by the CUDA plugin's NCCL collective (nccl.c) and by
 * bench/nccl_allreduce.c.  Needs no CUDA or NCCL header. */
#include <dlfcn.h>
#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "duet_nccl.h"

/* --------------------------------------------------------------- loading */

/* The object that holds address `at`, and the string to find in its
 * readable segments (dl_iterate_phdr's callback). */
typedef struct Scan {
  const void *at;
  const char *needle;
  const char *found;
} Scan;

/* reads raw mapped segments, redzones of a sanitized library included:
 * not an access to any one object */
__attribute__((no_sanitize_address)) static const char *find_in(const char *p, size_t n, const char *needle) {
  size_t k = strlen(needle), j;
  for (size_t i = 0; i + k <= n; i++) { /* byte by byte: memcmp's interceptor would check the redzones */
    for (j = 0; j < k && p[i + j] == needle[j]; j++) {}
    if (j == k) return p + i;
  }
  return NULL;
}

static int scan_object(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  Scan *sc = arg;
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum && !mine; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    mine = ph->p_type == PT_LOAD && (uintptr_t)sc->at >= lo && (uintptr_t)sc->at < lo + ph->p_memsz;
  }
  if (!mine) return 0;
  /* read-only segments (data and the code's read-only parts), in order */
  for (int i = 0; i < info->dlpi_phnum && !sc->found; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_R) && !(ph->p_flags & PF_W))
      sc->found = find_in((const char *)(info->dlpi_addr + ph->p_vaddr), ph->p_filesz, sc->needle);
  }
  return 1;
}

int duet_nccl_min_cc(int cuda_major) { return cuda_major >= 13 ? 75 : 0; }

void duet_nccl_close(DuetNccl *n) {
  if (n->dl) dlclose(n->dl);
  n->dl = NULL;
}

int duet_nccl_open(DuetNccl *n, char *err, size_t errlen) {
  memset(n, 0, sizeof *n);
  const char *env = getenv("DUET_NCCL_LIBRARY"), *name = env && *env ? env : "libnccl.so.2";
  snprintf(n->name, sizeof n->name, "%s", name);
  if (!(n->dl = dlopen(name, RTLD_NOW | RTLD_LOCAL))) {
    snprintf(err, errlen, "NCCL (%s) could not be loaded: %s; install NCCL (NVIDIA's libnccl2 package, or pip's "
             "nvidia-nccl-cu12 for CUDA 12) or point DUET_NCCL_LIBRARY at libnccl.so.2", name, dlerror());
    return -1;
  }
  struct { void **slot; const char *sym; bool need; } want[] = {
      {(void **)&n->get_version, "ncclGetVersion", true},
      {(void **)&n->comm_init_all, "ncclCommInitAll", true},
      {(void **)&n->get_unique_id, "ncclGetUniqueId", true},
      {(void **)&n->comm_init_rank, "ncclCommInitRank", true},
      {(void **)&n->comm_destroy, "ncclCommDestroy", true},
      {(void **)&n->comm_abort, "ncclCommAbort", true},
      {(void **)&n->comm_get_async_error, "ncclCommGetAsyncError", true},
      {(void **)&n->all_reduce, "ncclAllReduce", true},
      {(void **)&n->broadcast, "ncclBroadcast", true},
      {(void **)&n->group_start, "ncclGroupStart", true},
      {(void **)&n->group_end, "ncclGroupEnd", true},
      {(void **)&n->get_error_string, "ncclGetErrorString", true},
      {(void **)&n->get_last_error, "ncclGetLastError", false},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    *want[i].slot = dlsym(n->dl, want[i].sym);
    if (!*want[i].slot && want[i].need) {
      snprintf(err, errlen, "%s lacks %s: not an NCCL 2 library (point DUET_NCCL_LIBRARY at libnccl.so.2)", name,
               want[i].sym);
      duet_nccl_close(n);
      return -1;
    }
  }
  Dl_info info;
  snprintf(n->path, sizeof n->path, "%s",
           dladdr((void *)n->get_version, &info) && info.dli_fname ? info.dli_fname : name);
  if (n->get_version(&n->version) != DUET_NCCL_SUCCESS) {
    snprintf(err, errlen, "ncclGetVersion of %s failed", n->path);
    duet_nccl_close(n);
    return -1;
  }
  /* NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after */
  int v = n->version;
  if (v >= 10000) n->major = v / 10000, n->minor = v % 10000 / 100, n->patch = v % 100;
  else n->major = v / 1000, n->minor = v % 1000 / 100, n->patch = v % 100;
  /* the banner NCCL_DEBUG=VERSION prints, "NCCL version 2.28.9+cuda13.0" */
  char needle[64];
  snprintf(needle, sizeof needle, "%d.%d.%d+cuda", n->major, n->minor, n->patch);
  Scan sc = {(const void *)n->get_version, needle, NULL};
  dl_iterate_phdr(scan_object, &sc);
  if (sc.found && sscanf(sc.found + strlen(needle), "%d.%d", &n->cuda_major, &n->cuda_minor) != 2)
    n->cuda_major = n->cuda_minor = 0;
  return 0;
}

void duet_nccl_error(const DuetNccl *n, void *comm, int r, char *out, size_t outlen) {
  const char *s = n->get_error_string ? n->get_error_string(r) : NULL;
  const char *last = n->get_last_error ? n->get_last_error(comm) : NULL;
  snprintf(out, outlen, "%s (ncclResult_t %d)%s%s", s ? s : "unknown NCCL error", r, last && *last ? ": " : "",
           last && *last ? last : "");
}

