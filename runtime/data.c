#define _POSIX_C_SOURCE 200809L /* clock_gettime, fsync, fdopen */
/* runtime/data.c: IDX files (gzip) as shipped by Debian's dataset-fashion-mnist.
 * Format (LeCun et al., "THE MNIST DATABASE", "FILE FORMATS"): big-endian
 * magic 0x00000803 (images: u8, 3 dims) or 0x00000801 (labels: u8, 1 dim),
 * then one u32 per dimension, then the bytes. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "duet_rt.h"

/* Where Debian's dataset-fashion-mnist puts the files, and what to say when
 * they are missing or damaged there (and only there: a user's own IDX
 * files have nothing to do with the package). */
#define PKG_DIR "/usr/share/datasets/fashion-mnist"
#define PKG_HINT " (Debian package dataset-fashion-mnist: apt-get install dataset-fashion-mnist)"

/* PKG_HINT when path is a file directly in PKG_DIR, else "". */
static const char *pkg_hint(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return "";
  size_t n = (size_t)(slash - path);
  while (n > 1 && path[n - 1] == '/') n--;
  return n == strlen(PKG_DIR) && !strncmp(path, PKG_DIR, n) ? PKG_HINT : "";
}

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
      snprintf(err, errlen, "corrupt IDX file %s: %s%s", path,
               got == 0 ? "file ends early (truncated)" : (msg ? msg : "read error"), pkg_hint(path));
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
  snprintf(err, errlen, "corrupt IDX file %s: %s%s", path,
           got > 0 ? "data continues after the declared size" : (msg ? msg : "read error"), pkg_hint(path));
  return -1;
}

static uint32_t be32(const unsigned char *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Opens an IDX file and reads its header; dims[] receives ndim sizes. */
static gzFile open_idx(const char *path, uint32_t magic, int ndim, uint32_t *dims, char *err, size_t errlen) {
  gzFile f = gzopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %s%s", path, errno ? strerror(errno) : "gzopen failed", pkg_hint(path));
    return NULL;
  }
  unsigned char h[16];
  if (read_exact(f, h, 4 + 4 * (size_t)ndim, path, err, errlen)) {
    gzclose(f);
    return NULL;
  }
  if (be32(h) != magic) {
    snprintf(err, errlen, "corrupt IDX file %s: magic 0x%08x, expected 0x%08x%s", path, be32(h), magic,
             pkg_hint(path));
    gzclose(f);
    return NULL;
  }
  for (int i = 0; i < ndim; i++) dims[i] = be32(h + 4 + 4 * i);
  return f;
}

/* The checks on the two headers: as many labels as images, plausible image
 * sizes.  0, or -1 with the message in err. */
static int check_dims(const char *images_path, const uint32_t *di, const char *labels_path, const uint32_t *dl,
                      char *err, size_t errlen) {
  if (di[0] != dl[0]) {
    snprintf(err, errlen, "%s has %u images but %s has %u labels", images_path, di[0], labels_path, dl[0]);
    return -1;
  }
  if (di[0] == 0 || di[1] == 0 || di[2] == 0 || di[1] > 4096 || di[2] > 4096 || di[0] > 100000000u) {
    snprintf(err, errlen, "corrupt IDX file %s: implausible sizes %ux%ux%u%s", images_path, di[0], di[1], di[2],
             pkg_hint(images_path));
    return -1;
  }
  return 0;
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
  if (check_dims(images_path, di, labels_path, dl, err, errlen)) goto done;
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

/* The data of the IDX file at path (opened: f, its header read) is exactly
 * `data` bytes long: cheaply where the file says its length — a gzip
 * member's ISIZE trailer (RFC 1952: the uncompressed length mod 2^32), or
 * the size of an uncompressed file — and otherwise (or when that differs:
 * a truncated file, several gzip members) by reading it through, as
 * duet_load_idx does, for its exact message.  0, or -1 with the message. */
static int check_length(gzFile f, const char *path, int ndim, uint64_t data, char *err, size_t errlen) {
  uint64_t whole = 4 + 4 * (uint64_t)ndim + data;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  unsigned char m[4];
  bool known = false;
  if (fd >= 0 && !fstat(fd, &st) && S_ISREG(st.st_mode) && pread(fd, m, 2, 0) == 2) {
    if (m[0] == 0x1f && m[1] == 0x8b)
      known = st.st_size >= 18 && pread(fd, m, 4, st.st_size - 4) == 4 &&
              ((uint32_t)m[0] | (uint32_t)m[1] << 8 | (uint32_t)m[2] << 16 | (uint32_t)m[3] << 24) ==
                  (uint32_t)whole;
    else
      known = (uint64_t)st.st_size == whole;
  }
  if (fd >= 0) close(fd);
  if (known) return 0;
  unsigned char buf[1 << 16];
  for (uint64_t left = data; left > 0;) {
    size_t chunk = left > sizeof buf ? sizeof buf : (size_t)left;
    if (read_exact(f, buf, chunk, path, err, errlen)) return -1;
    left -= chunk;
  }
  return read_end(f, path, err, errlen);
}

int duet_check_idx(const char *images_path, const char *labels_path, DuetIdxInfo *info, char *err, size_t errlen) {
  uint32_t di[3], dl[1];
  gzFile fi = open_idx(images_path, 0x00000803, 3, di, err, errlen);
  if (!fi) return -1;
  gzFile fl = open_idx(labels_path, 0x00000801, 1, dl, err, errlen);
  if (!fl) {
    gzclose(fi);
    return -1;
  }
  int rc = check_dims(images_path, di, labels_path, dl, err, errlen) ||
                   check_length(fi, images_path, 3, (uint64_t)di[0] * di[1] * di[2], err, errlen) ||
                   check_length(fl, labels_path, 1, dl[0], err, errlen)
               ? -1
               : 0;
  gzclose(fi);
  gzclose(fl);
  if (!rc && info) *info = (DuetIdxInfo){.n = di[0], .rows = (int)di[1], .cols = (int)di[2]};
  return rc;
}

void duet_dataset_free(DuetDataset *ds) {
  free(ds->images);
  free(ds->labels);
  free(ds->x);
  free(ds->y);
  memset(ds, 0, sizeof *ds);
}

/* ------------------------------------------------------------ tokens */

/* llm.c's token files (karpathy/llm.c, dev/data/data_common.py,
 * write_datafile): a header of 256 little-endian int32 -- [0] the magic
 * 20240520, [1] the version (1: uint16 tokens, GPT-2's vocabulary), [2] the
 * number of tokens, the rest 0 -- then the tokens as little-endian uint16.
 * nanoGPT's train.bin (a bare uint16 array) has no header and is not this
 * format. */
#define TOKENS_MAGIC 20240520
#define TOKENS_HEADER 1024

static int32_t le32s(const unsigned char *b) {
  return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
}

int duet_load_tokens(const char *path, int vocab, uint16_t **tokens, int64_t *n, char *err, size_t errlen) {
  *n = 0;
  if (tokens) *tokens = NULL;
  size_t len;
  unsigned char *b = duet_read_file(path, &len);
  if (!b) {
    int e = errno;
    if (e == EIO || e == ENOMEM) snprintf(err, errlen, "cannot read %s", path);
    else snprintf(err, errlen, "cannot open %s: %s", path, strerror(e));
    return -1;
  }
  int rc = -1;
  if (len < TOKENS_HEADER) {
    snprintf(err, errlen, "%s: not an llm.c token file: %zu bytes, shorter than its 1024-byte header", path, len);
    goto done;
  }
  int32_t magic = le32s(b), version = le32s(b + 4), count = le32s(b + 8);
  if (magic != TOKENS_MAGIC) {
    snprintf(err, errlen, "%s: not an llm.c token file: magic %d, expected 20240520", path, magic);
    goto done;
  }
  if (version != 1) {
    snprintf(err, errlen, "%s: unsupported llm.c token file version %d (duet reads version 1: uint16 tokens)", path,
             version);
    goto done;
  }
  uint64_t have = (uint64_t)(len - TOKENS_HEADER);
  if (count < 0 || have != 2 * (uint64_t)count) {
    snprintf(err, errlen, "%s: the header says %d tokens (%" PRIu64 " bytes), the file has %" PRIu64 " bytes after it (%s)",
             path, count, 2 * (uint64_t)(count < 0 ? 0 : count), have,
             count >= 0 && have < 2 * (uint64_t)count ? "truncated" : "extra or odd bytes");
    goto done;
  }
  for (int64_t i = 0; i < count; i++) {
    const unsigned char *t = b + TOKENS_HEADER + 2 * i;
    int id = t[0] | t[1] << 8;
    if (id >= vocab) {
      snprintf(err, errlen, "%s: token %" PRId64 " (byte offset %" PRId64 ") is %d, beyond the model's vocabulary of %d",
               path, i, (int64_t)TOKENS_HEADER + 2 * i, id, vocab);
      goto done;
    }
  }
  *n = count;
  if (tokens) {
    /* in place: the ids, aligned at the start of the buffer */
    memmove(b, b + TOKENS_HEADER, (size_t)count * 2);
    uint16_t *out = (uint16_t *)b;
    for (int64_t i = 0; i < count; i++) {
      const unsigned char *t = b + 2 * i;
      out[i] = (uint16_t)(t[0] | t[1] << 8);
    }
    *tokens = out;
    b = NULL;
  }
  rc = 0;
done:
  free(b);
  return rc;
}
