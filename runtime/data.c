#define _POSIX_C_SOURCE 200809L /* clock_gettime, fsync, fdopen */
/* runtime/data.c: IDX files (gzip) as shipped by Debian's dataset-fashion-mnist.
 * Format (LeCun et al., "THE MNIST DATABASE", "FILE FORMATS"): big-endian
 * magic 0x00000803 (images: u8, 3 dims) or 0x00000801 (labels: u8, 1 dim),
 * then one u32 per dimension, then the bytes. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "duet_rt.h"

#define PKG_HINT "(Debian package dataset-fashion-mnist: apt-get install dataset-fashion-mnist)"

/* zlib's message without the "path: " prefix gzerror puts before it. */
static const char *zmsg(gzFile f, const char *path) {
  int zerr = 0;
  const char *m = gzerror(f, &zerr);
  if (!m || !zerr) return NULL;
  size_t n = strlen(path);
  if (!strncmp(m, path, n) && !strncmp(m + n, ": ", 2)) m += n + 2;
  return m;
}

static int read_exact(gzFile f, void *buf, size_t n, const char *path, char *err, size_t errlen) {
  unsigned char *p = buf;
  while (n > 0) {
    unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
    int got = gzread(f, p, chunk);
    if (got <= 0) {
      const char *msg = zmsg(f, path);
      snprintf(err, errlen, "corrupt IDX file %s: %s %s", path,
               got == 0 ? "file ends early (truncated)" : (msg ? msg : "read error"), PKG_HINT);
      return -1;
    }
    p += got;
    n -= (size_t)got;
  }
  return 0;
}

/* After the data: the gzip stream must end here.  Reading on makes zlib
 * check the CRC-32 and length trailer (RFC 1952), so a damaged file is an
 * error, as is anything after the data. */
static int read_end(gzFile f, const char *path, char *err, size_t errlen) {
  unsigned char extra;
  int got = gzread(f, &extra, 1);
  if (got == 0 && gzeof(f)) return 0;
  const char *msg = zmsg(f, path);
  snprintf(err, errlen, "corrupt IDX file %s: %s %s", path,
           got > 0 ? "data continues after the declared size" : (msg ? msg : "read error"), PKG_HINT);
  return -1;
}

static uint32_t be32(const unsigned char *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Opens an IDX file and reads its header; dims[] receives ndim sizes. */
static gzFile open_idx(const char *path, uint32_t magic, int ndim, uint32_t *dims, char *err, size_t errlen) {
  gzFile f = gzopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %s %s", path, errno ? strerror(errno) : "gzopen failed", PKG_HINT);
    return NULL;
  }
  unsigned char h[16];
  if (read_exact(f, h, 4 + 4 * (size_t)ndim, path, err, errlen)) {
    gzclose(f);
    return NULL;
  }
  if (be32(h) != magic) {
    snprintf(err, errlen, "corrupt IDX file %s: magic 0x%08x, expected 0x%08x %s", path, be32(h), magic, PKG_HINT);
    gzclose(f);
    return NULL;
  }
  for (int i = 0; i < ndim; i++) dims[i] = be32(h + 4 + 4 * i);
  return f;
}

int duet_load_idx(DuetDataset *ds, const char *images_path, const char *labels_path, char *err, size_t errlen) {
  memset(ds, 0, sizeof *ds);
  uint32_t di[3], dl[1];
  gzFile fi = open_idx(images_path, 0x00000803, 3, di, err, errlen);
  if (!fi) return -1;
  gzFile fl = open_idx(labels_path, 0x00000801, 1, dl, err, errlen);
  if (!fl) {
    gzclose(fi);
    return -1;
  }
  int rc = -1;
  unsigned char *pix = NULL, *lab = NULL;
  if (di[0] != dl[0]) {
    snprintf(err, errlen, "%s has %u images but %s has %u labels", images_path, di[0], labels_path, dl[0]);
    goto done;
  }
  if (di[0] == 0 || di[1] == 0 || di[2] == 0 || di[1] > 4096 || di[2] > 4096 || di[0] > 100000000u) {
    snprintf(err, errlen, "corrupt IDX file %s: implausible sizes %ux%ux%u %s", images_path, di[0], di[1], di[2],
             PKG_HINT);
    goto done;
  }
  size_t n = di[0], px = (size_t)di[1] * di[2];
  pix = malloc(n * px);
  lab = malloc(n);
  ds->images = malloc(n * px * sizeof(float));
  ds->labels = malloc(n * sizeof(int32_t));
  if (!pix || !lab || !ds->images || !ds->labels) {
    snprintf(err, errlen, "out of host memory loading %s", images_path);
    goto done;
  }
  if (read_exact(fi, pix, n * px, images_path, err, errlen) || read_exact(fl, lab, n, labels_path, err, errlen) ||
      read_end(fi, images_path, err, errlen) || read_end(fl, labels_path, err, errlen))
    goto done;
  for (size_t i = 0; i < n * px; i++) ds->images[i] = (float)pix[i] / 255.0f;
  for (size_t i = 0; i < n; i++) ds->labels[i] = lab[i];
  ds->n = (int64_t)n;
  ds->rows = (int)di[1];
  ds->cols = (int)di[2];
  rc = 0;
done:
  free(pix);
  free(lab);
  gzclose(fi);
  gzclose(fl);
  if (rc) duet_dataset_free(ds);
  return rc;
}

int duet_check_idx(const char *images_path, const char *labels_path, char *err, size_t errlen) {
  uint32_t di[3], dl[1];
  gzFile fi = open_idx(images_path, 0x00000803, 3, di, err, errlen);
  if (!fi) return -1;
  gzclose(fi);
  gzFile fl = open_idx(labels_path, 0x00000801, 1, dl, err, errlen);
  if (!fl) return -1;
  gzclose(fl);
  return 0;
}

void duet_dataset_free(DuetDataset *ds) {
  free(ds->images);
  free(ds->labels);
  memset(ds, 0, sizeof *ds);
}
