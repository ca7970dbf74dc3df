/* runtime/devices.c: device specs (`--devices cpu:0,cpu:1`, `cuda:0`,
 * `2x16GiB:sm_60`) and opening a device of one. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "duet_rt.h"

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
               {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (size_t i = 0; i < sizeof units / sizeof *units; i++)
    if (!strcmp(end, units[i].unit)) {
      double b = x * units[i].mul;
      return b >= 9.0e18 ? -1 : (int64_t)b;
    }
  return -1;
}

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

int duet_devices_all_cuda(const char *spec) {
  DuetDeviceSpec d[DUET_MAX_DEVICES];
  int n = 0;
  char err[256];
  if (!spec || duet_devices_parse(spec, d, DUET_MAX_DEVICES, &n, err, sizeof err)) return 0;
  for (int k = 0; k < n; k++)
    if (d[k].kind != DUET_DEV_CUDA) return 0;
  return n > 0;
}
