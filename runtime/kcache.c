/* runtime/kcache.c: the per-user kernel cache shared by the C JIT
 * (cli/jit.c) and the CUDA backend: directory, hashing, atomic writes and
 * verified reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "duet_rt.h"

/* duet_read_file (duet_rt.h) lives here rather than in data.c: the CUDA
 * plugin links this file without data.c (and zlib). */
void *duet_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0, got;
  char *b = malloc(cap + 1);
  while (b && (got = fread(b + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      char *nb = cap > SIZE_MAX / 4 ? NULL : realloc(b, cap * 2 + 1);
      if (!nb) {
        free(b);
        b = NULL;
        break;
      }
      b = nb;
      cap *= 2;
    }
  }
  int bad = ferror(f);
  fclose(f);
  if (!b || bad) {
    free(b);
    errno = b ? EIO : ENOMEM;
    return NULL;
  }
  b[n] = 0;
  *len = n;
  return b;
}

uint64_t duet_fnv1a(const void *p, size_t n, uint64_t h) {
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++) {
    h ^= s[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* mkdir -p with mode 0700 for every directory it creates. */
static int mkdir_private(const char *path) {
  char tmp[1024];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s", path) >= sizeof tmp) {
    errno = ENAMETOOLONG;
    return -1;
  }
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0700) && errno != EEXIST) return -1;
      *p = '/';
    }
  if (mkdir(tmp, 0700) && errno != EEXIST) return -1;
  return 0;
}

int duet_cache_dir(char *out, size_t n, char *err, size_t errlen) {
  const char *d = getenv("DUET_CACHE_DIR");
  if (d && *d) {
    if ((size_t)snprintf(out, n, "%s", d) >= n) {
      snprintf(err, errlen, "DUET_CACHE_DIR is longer than %zu bytes", n - 1);
      return -1;
    }
  } else {
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char parent[900];
    if (x && *x) snprintf(parent, sizeof parent, "%s", x);
    else if (home && *home) snprintf(parent, sizeof parent, "%s/.cache", home);
    else snprintf(parent, sizeof parent, "/tmp/duet-cache-%ld", (long)getuid());
    mkdir_private(parent);
    if ((size_t)snprintf(out, n, "%s/duet", parent) >= n) {
      snprintf(err, errlen, "kernel cache path %s/duet is too long", parent);
      return -1;
    }
  }
  if (mkdir_private(out)) {
    snprintf(err, errlen, "cannot create kernel cache directory %s: %s", out, strerror(errno));
    return -1;
  }
  struct stat st;
  if (stat(out, &st) || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077)) {
    snprintf(err, errlen, "kernel cache directory %s must be a directory owned by you with mode 0700", out);
    return -1;
  }
  return 0;
}

int duet_write_file_sync(const char *path, const void *data, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return -1;
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, (const char *)data + off, n - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      close(fd);
      return -1;
    }
    off += (size_t)w;
  }
  if (fsync(fd)) {
    close(fd);
    return -1;
  }
  return close(fd);
}

int duet_fsync_path(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

/* <dir>/<hash of key>.<ext> and .key */
static int entry_paths(const char *key, size_t keylen, const char *ext, char *obj, char *keyf, size_t n, char *err,
                       size_t errlen) {
  char dir[1024];
  if (duet_cache_dir(dir, sizeof dir, err, errlen)) return -1;
  unsigned long long h = (unsigned long long)duet_fnv1a(key, keylen, DUET_FNV_OFFSET);
  if ((size_t)snprintf(obj, n, "%s/%016llx.%s", dir, h, ext) >= n ||
      (size_t)snprintf(keyf, n, "%s/%016llx.%s.key", dir, h, ext) >= n) {
    snprintf(err, errlen, "kernel cache path too long (set DUET_CACHE_DIR to a shorter directory)");
    return -1;
  }
  return 0;
}

void *duet_cache_get(const char *key, size_t keylen, const char *ext, size_t *len, char *err, size_t errlen) {
  char obj[1200], keyf[1200];
  *len = 0;
  if (entry_paths(key, keylen, ext, obj, keyf, sizeof obj, err, errlen)) return NULL;
  size_t klen = 0, blen = 0;
  char *old = duet_read_file(keyf, &klen);
  if (!old) return NULL;
  char *blob = NULL;
  struct stat st;
  if (klen > keylen && !memcmp(old, key, keylen) && !stat(obj, &st) && st.st_uid == getuid() &&
      (blob = duet_read_file(obj, &blen))) {
    char want[96];
    snprintf(want, sizeof want, "\nobject: %zu %016llx\n", blen,
             (unsigned long long)duet_fnv1a(blob, blen, DUET_FNV_OFFSET));
    if (klen - keylen != strlen(want) || memcmp(old + keylen, want, klen - keylen)) {
      free(blob); /* damaged or replaced: a miss, rebuilt by the caller */
      blob = NULL;
    }
  }
  free(old);
  if (blob) *len = blen;
  return blob;
}

int duet_cache_put(const char *key, size_t keylen, const char *ext, const void *blob, size_t len, char *err,
                   size_t errlen) {
  char obj[1200], keyf[1200], obj_tmp[1300], key_tmp[1300];
  if (entry_paths(key, keylen, ext, obj, keyf, sizeof obj, err, errlen)) return -1;
  snprintf(obj_tmp, sizeof obj_tmp, "%s.%ld.tmp", obj, (long)getpid());
  snprintf(key_tmp, sizeof key_tmp, "%s.%ld.tmp", keyf, (long)getpid());
  char tail[96];
  int tn = snprintf(tail, sizeof tail, "\nobject: %zu %016llx\n", len,
                    (unsigned long long)duet_fnv1a(blob, len, DUET_FNV_OFFSET));
  char *full = malloc(keylen + (size_t)tn);
  if (!full) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  memcpy(full, key, keylen);
  memcpy(full + keylen, tail, (size_t)tn);
  /* object first, key last: a reader never sees a key without its object */
  int rc = 0;
  if (duet_write_file_sync(obj_tmp, blob, len) || rename(obj_tmp, obj) ||
      duet_write_file_sync(key_tmp, full, keylen + (size_t)tn) || rename(key_tmp, keyf)) {
    snprintf(err, errlen, "cannot write the kernel cache entry %s: %s", obj, strerror(errno));
    unlink(obj_tmp);
    unlink(key_tmp);
    rc = -1;
  }
  free(full);
  return rc;
}
