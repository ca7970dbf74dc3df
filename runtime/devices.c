/* runtime/devices.c: device specs (`--devices cpu:0,cpu:1`, `cuda:0`,
 * `2x16GiB:sm_60`) and opening a device of one. */
#define _GNU_SOURCE /* getline */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "duet_rt.h"
#include "pipeline.h"

/* "16GiB", "1.5GB", "512MiB", "1024" (bytes) -> bytes; -1 when malformed. */
static int64_t parse_size(const char *s, size_t len) {
  char buf[64];
  if (len == 0 || len >= sizeof buf) return -1;
  memcpy(buf, s, len);
  buf[len] = 0;
  char *end;
  errno = 0;
  double x = strtod(buf, &end);
  if (errno || end == buf || !(x > 0)) return -1;
  static const struct {
    const char *unit;
    double mul;
  } units[] = {{"", 1},          {"B", 1},          {"KB", 1e3},          {"MB", 1e6},
               {"GB", 1e9},      {"TB", 1e12},      {"KiB", 1024.0},      {"MiB", 1048576.0},
               {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"K", 1024.0},
               {"M", 1048576.0},  {"G", 1073741824.0},  {"T", 1099511627776.0}};
  for (size_t i = 0; i < sizeof units / sizeof *units; i++)
    if (!strcmp(end, units[i].unit)) {
      double b = x * units[i].mul;
      return b >= 9.0e18 ? -1 : (int64_t)b;
    }
  return -1;
}

int64_t duet_parse_size(const char *s) { return s ? parse_size(s, strlen(s)) : -1; }

static int parse_index(const char *s, size_t len, int *out) {
  if (len == 0 || len > 4) return -1;
  int v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  *out = v;
  return 0;
}

int duet_devices_parse(const char *spec, DuetDeviceSpec *out, int max, int *n, char *err, size_t errlen) {
  *n = 0;
  if (!spec || !*spec) {
    snprintf(err, errlen, "--devices needs a list such as cpu:0,cpu:1");
    return -1;
  }
  for (const char *p = spec;;) {
    size_t len = strcspn(p, ",");
    char item[64];
    snprintf(item, sizeof item, "%.*s", (int)(len < 63 ? len : 63), p);
    DuetDeviceSpec d = {0};
    int count = 1;
    const char *colon = memchr(p, ':', len);
    if (len == 3 && !strncmp(p, "cpu", 3)) {
      d.kind = DUET_DEV_CPU;
    } else if (len > 4 && !strncmp(p, "cpu:", 4) && !parse_index(p + 4, len - 4, &d.index)) {
      d.kind = DUET_DEV_CPU;
    } else if ((len == 4 && !strncmp(p, "cuda", 4)) ||
               (len > 5 && !strncmp(p, "cuda:", 5) && !parse_index(p + 5, len - 5, &d.index))) {
      d.kind = DUET_DEV_CUDA;
    } else if (colon && colon + 4 <= p + len && !strncmp(colon + 1, "sm_", 3) &&
               !parse_index(colon + 4, (size_t)(p + len - colon - 4), &d.sm) && d.sm >= 10) {
      const char *size = p, *x = memchr(p, 'x', (size_t)(colon - p));
      if (x) {
        if (parse_index(p, (size_t)(x - p), &count) || count < 1) goto bad;
        size = x + 1;
      }
      d.kind = DUET_DEV_PLANNED;
      d.capacity = parse_size(size, (size_t)(colon - size));
      if (d.capacity < 0) goto bad;
    } else {
      goto bad;
    }
    for (int k = 0; k < count; k++) {
      if (*n >= max) {
        snprintf(err, errlen, "--devices: more than %d devices", max);
        return -1;
      }
      d.index = d.kind == DUET_DEV_PLANNED ? *n : d.index;
      out[(*n)++] = d;
      if (d.kind == DUET_DEV_PLANNED) {
        const char *sz = memchr(p, 'x', (size_t)(colon - p));
        snprintf(out[*n - 1].name, sizeof out[*n - 1].name, "%.*s", (int)(p + len - (sz ? sz + 1 : p)),
                 sz ? sz + 1 : p);
      } else {
        snprintf(out[*n - 1].name, sizeof out[*n - 1].name, "%s", item);
      }
    }
    if (!p[len]) break;
    p += len + 1;
    continue;
  bad:
    snprintf(err, errlen, "--devices: bad item '%s' (expected cpu, cpu:N, cuda, cuda:N, or a capacity such as 16GiB:sm_60 "
             "or 2x16GiB:sm_60)", item);
    return -1;
  }
  return 0;
}

/* The error for a planned capacity named where a device to run on is due. */
static void planned_error(const DuetDeviceSpec *d, char *err, size_t errlen) {
  snprintf(err, errlen, "device %s is a capacity for `duet plan`, not a device to run on (use cpu:N or cuda:N)",
           d->name);
}

DuetDevice *duet_device_open(const DuetDeviceSpec *d, const DuetProgram *p, const DuetKernelFn *kernels, int threads,
                             int verbose, char *err, size_t errlen) {
  switch (d->kind) {
  case DUET_DEV_CPU: {
    if (!kernels) {
      snprintf(err, errlen, "device %s: this program was built without CPU kernels", d->name);
      return NULL;
    }
    DuetDevice *dev = duet_cpu_device(kernels, p->n_kernels, threads);
    if (!dev) snprintf(err, errlen, "out of host memory");
    return dev;
  }
  case DUET_DEV_CUDA:
    return duet_cuda_device(p, d->index, verbose, err, errlen);
  default:
    planned_error(d, err, errlen);
    return NULL;
  }
}

int duet_devices_check(const char *spec, char *err, size_t errlen) {
  DuetDeviceSpec d[DUET_MAX_DEVICES];
  int n = 0, n_gpu = -1;
  if (!spec) return 0;
  if (duet_devices_parse(spec, d, DUET_MAX_DEVICES, &n, err, errlen)) return -1;
  for (int k = 0; k < n; k++) {
    if (d[k].kind == DUET_DEV_PLANNED) {
      planned_error(&d[k], err, errlen);
      return -1;
    }
    if (d[k].kind != DUET_DEV_CUDA) continue;
    if (n_gpu < 0 && (n_gpu = duet_cuda_gpu_count(err, errlen)) < 0) return -1;
    if (d[k].index >= n_gpu) {
      snprintf(err, errlen, "no GPU cuda:%d (this machine has %d)", d[k].index, n_gpu);
      return -1;
    }
  }
  return 0;
}

int duet_devices_groups(const char *spec, int replicas, int *per_group, char *err, size_t errlen) {
  DuetDeviceSpec d[DUET_MAX_DEVICES];
  int n = 0, R = replicas > 1 ? replicas : 1;
  *per_group = 1;
  if (!spec) return 0; /* R virtual CPU devices */
  if (duet_devices_parse(spec, d, DUET_MAX_DEVICES, &n, err, errlen)) return -1;
  if (n % R) {
    snprintf(err, errlen, "--data-parallel %d does not divide the %d device%s of --devices %s into equal groups (one "
             "group of devices per replica)", R, n, n == 1 ? "" : "s", spec);
    return -1;
  }
  int G = n / R;
  for (int r = 1; r < R; r++)
    for (int k = 0; k < G; k++) {
      const DuetDeviceSpec *a = &d[k], *b = &d[r * G + k];
      if (a->kind != b->kind || (a->kind == DUET_DEV_PLANNED && (a->sm != b->sm || a->capacity != b->capacity))) {
        snprintf(err, errlen, "--data-parallel %d: replica %d's stage %d is on %s, replica 0's on %s; every replica "
                 "needs devices of the same kinds, stage by stage", R, r, k, b->name, a->name);
        return -1;
      }
    }
  *per_group = G;
  return 0;
}

int duet_devices_all_cuda(const char *spec) {
  DuetDeviceSpec d[DUET_MAX_DEVICES];
  int n = 0;
  char err[256];
  if (!spec || duet_devices_parse(spec, d, DUET_MAX_DEVICES, &n, err, sizeof err)) return 0;
  for (int k = 0; k < n; k++)
    if (d[k].kind != DUET_DEV_CUDA) return 0;
  return n > 0;
}

int duet_gemm_acc_check(const DuetProgram *p, const char *backend, char *err, size_t errlen) {
  if (!p->gemm_accumulate_f16 || !strcmp(backend, "cuda")) return 0;
  snprintf(err, errlen,
           "--gemm-accumulate fp16 runs on CUDA devices only (cuBLAS CUBLAS_COMPUTE_16F); the %s backend accumulates "
           "fp16 GEMMs in fp32",
           backend);
  return -1;
}

int duet_devices_preflight(const DuetProgram *p, const DuetConfig *cfg, char *err, size_t errlen) {
  if (duet_devices_check(cfg->devices, err, errlen)) return -1;
  DuetDeviceSpec d[DUET_MAX_DEVICES];
  int n = 1;
  d[0] = (DuetDeviceSpec){.kind = DUET_DEV_CPU};
  if (cfg->devices && duet_devices_parse(cfg->devices, d, DUET_MAX_DEVICES, &n, err, errlen)) return -1;
  for (int k = 0; k < n; k++)
    if (duet_gemm_acc_check(p, d[k].kind == DUET_DEV_CUDA ? "cuda" : "cpu", err, errlen)) return -1;
  if (p->n_stages >= 1) {
    DuetPipeEnv e;
    int G;
    if (duet_pipe_env(&e, cfg->timeout, err, errlen)) return -1;
    int rank, ranks = duet_launch_ranks(&rank, err, errlen);
    if (ranks > 1 && p->replicas > 1) { /* an MPI run: the rank's devices */
      DuetDeviceSpec mine[DUET_MAX_DEVICES];
      if (duet_pipe_rank_devices(p, cfg->devices, rank, mine, err, errlen)) return -1;
      for (int k = 0; k < p->n_stages && e.collective == DUET_COLL_NCCL; k++)
        if (mine[k].kind != DUET_DEV_CUDA) {
          snprintf(err, errlen, "DUET_DP_COLLECTIVE=nccl: rank %d's stage %d is on %s, and NCCL connects GPUs", rank, k,
                   mine[k].name);
          return -1;
        }
    } else if (p->replicas > 1 && duet_devices_groups(cfg->devices, p->replicas, &G, err, errlen)) {
      return -1;
    } else if (e.collective == DUET_COLL_NCCL && duet_pipe_nccl_check(p, cfg->devices, err, errlen)) {
      return -1;
    }
  } else if (n == 1 && d[0].kind == DUET_DEV_CPU) {
    /* one CPU device: its regions must fit the memory available (duet run
     * has checked duet plan's larger count already; this is for compiled
     * executables, which the kernel would otherwise kill mid-way) */
    int64_t need = 0, avail;
    for (int r = 1; r < DUET_MEM_COUNT; r++) need += p->region_bytes[r];
    char from[1600];
    if (duet_host_memory(&avail, from, sizeof from, err, errlen)) return -1;
    if (need > avail) {
      snprintf(err, errlen, "the program does not fit the memory of %s: its memory takes %.2f MiB (params %.2f, "
               "optimizer state %.2f, activations %.2f MiB), and %.2f MiB are available (%s)", d[0].name[0] ? d[0].name : "cpu",
               need / 1048576.0, p->region_bytes[DUET_MEM_PARAM] / 1048576.0, p->region_bytes[DUET_MEM_STATE] / 1048576.0,
               p->region_bytes[DUET_MEM_ARENA] / 1048576.0, avail / 1048576.0, from);
      return -1;
    }
  }
  return 0;
}

/* The first number in the file at path (a cgroup limit: bytes, or "max"),
 * or -1 when unreadable or unlimited. */
static int64_t read_limit(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char buf[64];
  int64_t v = -1;
  if (fgets(buf, sizeof buf, f)) {
    char *end;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    /* cgroup v1 says "no limit" with about 2^63 rounded to a page */
    if (!errno && end != buf && x > 0 && x < ((long long)1 << 62)) v = x;
  }
  fclose(f);
  return v;
}

/* The lowest cgroup memory limit that applies to this process: cgroup v2
 * memory.max, v1 memory/memory.limit_in_bytes, at the root of the mounted
 * hierarchy (a container's own cgroup) and at each level of the process's
 * path from /proc/self/cgroup.  -1 when there is none; the file in from. */
static int64_t cgroup_limit(char *from, size_t fromlen) {
  int64_t best = -1;
  char path[1400];
  struct {
    const char *root, *file;
  } const tree[2] = {{"/sys/fs/cgroup", "memory.max"}, {"/sys/fs/cgroup/memory", "memory.limit_in_bytes"}};
  char rel[2][1024] = {"", ""};
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (f) { /* "0::/path" (v2), "N:memory:/path" or "N:cpu,memory:/path" (v1) */
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
      line[strcspn(line, "\n")] = 0;
      char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
      if (!c2) continue;
      *c2 = 0;
      const char *ctl = c1 + 1;
      int which = !*ctl ? 0 : (!strcmp(ctl, "memory") || strstr(ctl, ",memory") || !strncmp(ctl, "memory,", 7)) ? 1 : -1;
      if (which >= 0 && strlen(c2 + 1) < sizeof rel[0]) snprintf(rel[which], sizeof rel[which], "%s", c2 + 1);
    }
    free(line);
    fclose(f);
  }
  for (int t = 0; t < 2; t++) {
    /* the process's own cgroup and each one above it, up to the root */
    char r[1024];
    snprintf(r, sizeof r, "%s", rel[t]);
    for (;;) {
      size_t len = strlen(r);
      while (len > 0 && r[len - 1] == '/') r[--len] = 0;
      snprintf(path, sizeof path, "%s%s/%s", tree[t].root, r, tree[t].file);
      int64_t v = read_limit(path);
      if (v > 0 && (best < 0 || v < best)) {
        best = v;
        snprintf(from, fromlen, "the cgroup limit in %s", path);
      }
      char *slash = strrchr(r, '/');
      if (!len || !slash) break;
      *slash = 0;
    }
  }
  return best;
}

int duet_host_memory(int64_t *bytes, char *from, size_t fromlen, char *err, size_t errlen) {
  const char *o = getenv("DUET_HOST_MEMORY");
  if (o) {
    int64_t v = parse_size(o, strlen(o));
    if (v <= 0) {
      snprintf(err, errlen, "DUET_HOST_MEMORY must be a size such as 8GiB, 512MiB or 1000000 (bytes), got '%s'", o);
      return -1;
    }
    *bytes = v;
    snprintf(from, fromlen, "DUET_HOST_MEMORY");
    return 0;
  }
  int64_t avail = -1;
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    long long kb;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1 && kb > 0) avail = (int64_t)kb * 1024;
    fclose(f);
  }
  if (avail > 0) {
    snprintf(from, fromlen, "MemAvailable in /proc/meminfo");
  } else { /* kernels before 3.14 have no MemAvailable */
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0) {
      snprintf(err, errlen, "cannot tell how much memory is available (no MemAvailable in /proc/meminfo)");
      return -1;
    }
    avail = (int64_t)pages * psz;
    snprintf(from, fromlen, "free memory (sysconf _SC_AVPHYS_PAGES)");
  }
  char cg[1500];
  int64_t lim = cgroup_limit(cg, sizeof cg);
  if (lim > 0 && lim < avail) {
    avail = lim;
    snprintf(from, fromlen, "%s", cg);
  }
  *bytes = avail;
  return 0;
}
