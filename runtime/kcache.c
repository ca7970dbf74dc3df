/* runtime/kcache.c: the per-user kernel cache shared by the C JIT
 * (cli/jit.c) and the CUDA backend: directory, hashing, atomic writes and
 * verified reads. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "duet_rt.h"

/* duet_read_file (duet_rt.h) lives here rather than in data.c: the CUDA
 * plugin links this file without data.c (and zlib). */
void *duet_read_file(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  void *b = duet_read_fd(fd, len);
  int e = errno;
  close(fd);
  errno = e;
  return b;
}

FILE *duet_fopen_regular(const char *path, int *not_regular) {
  *not_regular = 0;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  int flags = fcntl(fd, F_GETFL);
  if (fstat(fd, &st) || !S_ISREG(st.st_mode) || flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK)) {
    int e = errno;
    *not_regular = !fstat(fd, &st) && !S_ISREG(st.st_mode);
    close(fd);
    errno = e;
    return NULL;
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    int e = errno;
    close(fd);
    errno = e;
  }
  return f;
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

/* The cache directory's own check: a directory owned by the user with no
 * group or other permissions.  0, or -1 with the message in err. */
static int dir_owned_0700(const char *dir, char *err, size_t errlen) {
  struct stat st;
  if (stat(dir, &st) || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077)) {
    snprintf(err, errlen, "kernel cache directory %s must be a directory owned by you with mode 0700", dir);
    return -1;
  }
  return 0;
}

int duet_dir_private(const char *dir, char *err, size_t errlen) {
  if (dir_owned_0700(dir, err, errlen)) return -1;
  char real[PATH_MAX];
  if (!realpath(dir, real)) {
    snprintf(err, errlen, "cannot resolve the kernel cache directory %s: %s", dir, strerror(errno));
    return -1;
  }
  /* every ancestor: owned by root or the user, and writable by no one else
   * unless sticky (others may add entries to /tmp but not move ours) */
  for (char *slash = strrchr(real, '/'); slash; slash = strrchr(real, '/')) {
    if (slash == real) slash[1] = 0;
    else *slash = 0;
    struct stat st;
    if (stat(real, &st)) {
      snprintf(err, errlen, "cannot check %s above the kernel cache directory %s: %s", real, dir, strerror(errno));
      return -1;
    }
    if (st.st_uid != 0 && st.st_uid != getuid()) {
      snprintf(err, errlen, "kernel cache directory %s is not private: %s above it is owned by uid %ld", dir, real,
               (long)st.st_uid);
      return -1;
    }
    if ((st.st_mode & 022) && !(st.st_mode & S_ISVTX)) {
      snprintf(err, errlen, "kernel cache directory %s is not private: %s above it is writable by others (mode %04o, "
               "not sticky)", dir, real, (unsigned)(st.st_mode & 07777));
      return -1;
    }
    if (slash == real) break;
  }
  return 0;
}

/* $TMPDIR, else /tmp. */
static const char *tmp_base(void) {
  const char *td = getenv("TMPDIR");
  return td && *td ? td : "/tmp";
}

int duet_cache_dir(char *out, size_t n, char *err, size_t errlen) {
  const char *d = getenv("DUET_CACHE_DIR");
  if (d && *d) { /* the user's explicit choice: created as given */
    if ((size_t)snprintf(out, n, "%s", d) >= n) {
      snprintf(err, errlen, "DUET_CACHE_DIR is longer than %zu bytes", n - 1);
      return -1;
    }
    if (mkdir_private(out)) {
      snprintf(err, errlen, "cannot create kernel cache directory %s: %s", out, strerror(errno));
      return -1;
    }
    return dir_owned_0700(out, err, errlen);
  }
  const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char parent[900];
  bool shared_tmp = false;
  struct stat st;
  if (x && *x) {
    snprintf(parent, sizeof parent, "%s", x);
  } else if (home && *home) {
    /* a HOME that points nowhere is not created (it is how a missing home
     * appears out of thin air): no cache, the caller compiles in a
     * temporary directory */
    if (stat(home, &st) || !S_ISDIR(st.st_mode)) {
      snprintf(err, errlen, "HOME %s is not a directory (duet does not create it; set DUET_CACHE_DIR for a kernel "
               "cache)", home);
      return -1;
    }
    snprintf(parent, sizeof parent, "%s/.cache", home);
  } else {
    snprintf(parent, sizeof parent, "%s/duet-cache-%ld", tmp_base(), (long)getuid());
    shared_tmp = true;
  }
  if ((size_t)snprintf(out, n, "%s/duet", parent) >= n) {
    snprintf(err, errlen, "kernel cache path %s/duet is too long", parent);
    return -1;
  }
  if ((mkdir(parent, 0700) && errno != EEXIST) || (mkdir(out, 0700) && errno != EEXIST)) {
    snprintf(err, errlen, "cannot create kernel cache directory %s: %s", out, strerror(errno));
    return -1;
  }
  /* in a directory others write to, the whole path must be private */
  return shared_tmp ? duet_dir_private(out, err, errlen) : dir_owned_0700(out, err, errlen);
}

int duet_private_tmpdir(char *out, size_t n, const char *prefix, char *err, size_t errlen) {
  /* $TMPDIR, then /tmp when $TMPDIR is not private */
  const char *bases[2] = {tmp_base(), "/tmp"};
  for (int i = 0; i < 2; i++) {
    if (i == 1 && !strcmp(bases[0], bases[1])) break;
    char e2[1024];
    if ((size_t)snprintf(out, n, "%s/%s-XXXXXX", bases[i], prefix) >= n) {
      snprintf(e2, sizeof e2, "the temporary directory %s is too long a path", bases[i]);
    } else if (!mkdtemp(out)) {
      snprintf(e2, sizeof e2, "cannot create a temporary directory in %s: %s", bases[i], strerror(errno));
    } else if (duet_dir_private(out, e2, sizeof e2)) {
      rmdir(out);
    } else {
      return 0;
    }
    if (i == 0) snprintf(err, errlen, "%s", e2);
    else snprintf(err + strlen(err), errlen - strlen(err), "; %s", e2);
  }
  return -1;
}

void *duet_read_fd(int fd, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap + 1);
  while (b) {
    ssize_t got = read(fd, b + n, cap - n);
    if (got < 0) {
      if (errno == EINTR) continue;
      free(b);
      errno = EIO;
      return NULL;
    }
    if (got == 0) break;
    n += (size_t)got;
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
  if (!b) {
    errno = ENOMEM;
    return NULL;
  }
  b[n] = 0;
  *len = n;
  return b;
}

int duet_cache_tmp(char *path, size_t n, const char *base, const char *suffix) {
  if ((size_t)snprintf(path, n, "%s.%ld.XXXXXX%s", base, (long)getpid(), suffix) >= n) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = mkostemps(path, (int)strlen(suffix), O_CLOEXEC);
  if (fd < 0) return -1;
  if (flock(fd, LOCK_EX)) { /* held until the owner closes it (or dies) */
    int e = errno;
    close(fd);
    unlink(path);
    errno = e;
    return -1;
  }
  return fd;
}

/* `name` ends with `suffix`. */
static bool ends_with(const char *name, const char *suffix) {
  size_t a = strlen(name), b = strlen(suffix);
  return a >= b && !strcmp(name + a - b, suffix);
}

void duet_cache_clean(const char *dir) {
  DIR *dd = opendir(dir);
  if (!dd) return;
  int dfd = dirfd(dd);
  time_t now = time(NULL);
  struct dirent *e;
  while ((e = readdir(dd))) {
    const char *nm = e->d_name;
    size_t len = strlen(nm), h = strspn(nm, "0123456789abcdef");
    if (h != 16 || nm[16] != '.' || len >= 512 || !(ends_with(nm, ".tmp") || ends_with(nm, ".c"))) continue;
    struct stat st;
    if (fstatat(dfd, nm, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode) || st.st_uid != getuid() ||
        now - st.st_mtime < DUET_CACHE_STALE_SECONDS)
      continue;
    char base[512];
    bool sibling = ends_with(nm, ".so.tmp") || ends_with(nm, ".key.tmp");
    if (sibling) { /* the compiler's output and the JIT's key: they go with their .c, while it is there */
      snprintf(base, sizeof base, "%.*s.c", (int)(len - (ends_with(nm, ".so.tmp") ? 7 : 8)), nm);
      if (!faccessat(dfd, base, F_OK, AT_SYMLINK_NOFOLLOW)) continue;
    }
    int fd = openat(dfd, nm, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    if (!flock(fd, LOCK_EX | LOCK_NB)) { /* no live owner holds it */
      unlinkat(dfd, nm, 0);
      if (ends_with(nm, ".c")) {
        snprintf(base, sizeof base, "%.*s.so.tmp", (int)(len - 2), nm);
        unlinkat(dfd, base, 0);
        snprintf(base, sizeof base, "%.*s.key.tmp", (int)(len - 2), nm);
        unlinkat(dfd, base, 0);
      }
    }
    close(fd);
  }
  closedir(dd);
}

int duet_write_fd_sync(int fd, const void *data, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, (const char *)data + off, n - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    off += (size_t)w;
  }
  return fsync(fd);
}

int duet_write_file_sync(const char *path, const void *data, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  if (duet_write_fd_sync(fd, data, n)) {
    int e = errno;
    close(fd);
    errno = e;
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

/* <dir>/<hash of key>.<ext> and .key; the directory in dir (may be NULL). */
static int entry_paths(const char *key, size_t keylen, const char *ext, char *obj, char *keyf, size_t n, char *dir_out,
                       char *err, size_t errlen) {
  char dir[1024];
  if (duet_cache_dir(dir, sizeof dir, err, errlen)) return -1;
  unsigned long long h = (unsigned long long)duet_fnv1a(key, keylen, DUET_FNV_OFFSET);
  if ((size_t)snprintf(obj, n, "%s/%016llx.%s", dir, h, ext) >= n ||
      (size_t)snprintf(keyf, n, "%s/%016llx.%s.key", dir, h, ext) >= n) {
    snprintf(err, errlen, "kernel cache path too long (set DUET_CACHE_DIR to a shorter directory)");
    return -1;
  }
  if (dir_out) snprintf(dir_out, n, "%s", dir);
  return 0;
}

int duet_cache_open_verified(const char *obj, const char *key, size_t keylen, const char *keytext, size_t keytext_len,
                             void **bytes, size_t *len) {
  *bytes = NULL;
  *len = 0;
  if (keytext_len <= keylen || memcmp(keytext, key, keylen)) return -1;
  int fd = open(obj, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  size_t blen = 0;
  char *blob = NULL;
  if (!fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_uid == getuid() && (blob = duet_read_fd(fd, &blen))) {
    char want[96];
    snprintf(want, sizeof want, "\nobject: %zu %016llx\n", blen,
             (unsigned long long)duet_fnv1a(blob, blen, DUET_FNV_OFFSET));
    if (keytext_len - keylen == strlen(want) && !memcmp(keytext + keylen, want, keytext_len - keylen)) {
      *bytes = blob;
      *len = blen;
      return fd; /* the file whose bytes were checked, still open */
    }
  }
  free(blob); /* damaged or replaced: a miss, rebuilt by the caller */
  close(fd);
  return -1;
}

void *duet_cache_get(const char *key, size_t keylen, const char *ext, size_t *len, char *err, size_t errlen) {
  char obj[1200], keyf[1200];
  *len = 0;
  if (entry_paths(key, keylen, ext, obj, keyf, sizeof obj, NULL, err, errlen)) return NULL;
  size_t klen = 0;
  char *old = duet_read_file(keyf, &klen);
  if (!old) return NULL;
  void *blob = NULL;
  int fd = duet_cache_open_verified(obj, key, keylen, old, klen, &blob, len);
  if (fd >= 0) close(fd);
  free(old);
  return blob;
}

int duet_cache_put(const char *key, size_t keylen, const char *ext, const void *blob, size_t len, char *err,
                   size_t errlen) {
  char dir[1200], obj[1200], keyf[1200], obj_tmp[1300] = "", key_tmp[1300] = "";
  if (entry_paths(key, keylen, ext, obj, keyf, sizeof obj, dir, err, errlen)) return -1;
  duet_cache_clean(dir);
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
  /* object first, key last: a reader never sees a key without its object;
   * each temporary is locked while written (duet_cache_tmp), so a run that
   * dies leaves it to duet_cache_clean */
  int rc = 0, fo = -1, fk = -1;
  if ((fo = duet_cache_tmp(obj_tmp, sizeof obj_tmp, obj, ".tmp")) < 0 || duet_write_fd_sync(fo, blob, len) ||
      rename(obj_tmp, obj) || (obj_tmp[0] = 0, (fk = duet_cache_tmp(key_tmp, sizeof key_tmp, keyf, ".tmp")) < 0) ||
      duet_write_fd_sync(fk, full, keylen + (size_t)tn) || rename(key_tmp, keyf)) {
    snprintf(err, errlen, "cannot write the kernel cache entry %s: %s", obj, strerror(errno));
    if (obj_tmp[0] && fo >= 0) unlink(obj_tmp);
    if (fk >= 0) unlink(key_tmp);
    rc = -1;
  }
  if (fo >= 0) close(fo);
  if (fk >= 0) close(fk);
  free(full);
  return rc;
}
