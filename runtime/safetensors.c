#define _POSIX_C_SOURCE 200809L /* clock_gettime, fsync, fdopen */
/* runtime/safetensors.c: reading and writing safetensors files.
 *
 * Format (huggingface/safetensors, "Format" in its README): an 8-byte
 * little-endian u64 N, then N bytes of UTF-8 JSON, then the data section.
 * The JSON maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end]} with byte offsets relative to the start of the data section;
 * the optional key "__metadata__" maps to a string-to-string object.  The
 * header may be padded with trailing spaces; writers pad it so that the data
 * section starts at a multiple of 8 bytes, as the reference writer does.
 *
 * Saving is atomic (write a temporary file next to the target, fsync it,
 * rename it over the target, fsync the directory).  Loading reads the whole
 * file, validates every header entry, and copies each tensor's bytes to an
 * 8-byte aligned place in one block. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "duet_rt.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format's data are little-endian)"
#endif

/* Header size limit of the reference implementation (MAX_HEADER_SIZE). */
#define ST_MAX_HEADER 100000000ull
/* Largest integer a JSON number (a double in cJSON) holds exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0

/* ------------------------------------------------------------- dtypes */

/* Every dtype of the format, with its size in bytes; duet reads seven. */
static const struct {
  const char *name;
  int size;
  int duet; /* DUET_* or DUET_VOID when duet has no such element type */
} st_dtypes[] = {
    {"F32", 4, DUET_F32}, {"F64", 8, DUET_F64},     {"I32", 4, DUET_I32},     {"BOOL", 1, DUET_VOID},
    {"U8", 1, DUET_U8},   {"I8", 1, DUET_I8},     {"F8_E5M2", 1, DUET_VOID}, {"F8_E4M3", 1, DUET_VOID},
    {"I16", 2, DUET_VOID}, {"U16", 2, DUET_VOID},   {"F16", 2, DUET_F16},     {"BF16", 2, DUET_BF16},
    {"U32", 4, DUET_VOID}, {"I64", 8, DUET_VOID},   {"U64", 8, DUET_VOID},
};
#define ST_N_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

/* The format's name of a duet dtype, or NULL. */
static const char *st_dtype_name(int dtype) {
  for (int i = 0; i < ST_N_DTYPES; i++)
    if (st_dtypes[i].duet == dtype && dtype != DUET_VOID) return st_dtypes[i].name;
  return NULL;
}

static int st_dtype_size(int dtype) {
  for (int i = 0; i < ST_N_DTYPES; i++)
    if (st_dtypes[i].duet == dtype && dtype != DUET_VOID) return st_dtypes[i].size;
  return 0;
}

/* Bytes of a tensor of `rank` dims `shape` and element size `size`, or -1
 * when a dim is negative or the product overflows int64. */
static int64_t st_tensor_bytes(int rank, const int64_t *shape, int size) {
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] == 0) return 0;
  }
  int64_t n = size;
  for (int i = 0; i < rank; i++) {
    if (n > INT64_MAX / shape[i]) return -1;
    n *= shape[i];
  }
  return n;
}

static char *st_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* --------------------------------------------------------------- saving */

/* Builds the header JSON (compact, keys in the given order, __metadata__
 * first).  Returns the malloc'd text, or NULL with a message. */
static char *st_header_build(const char *path, const DuetStTensor *t, int n, const char *const *meta_kv,
                             int n_meta, char *err, size_t errlen) {
  cJSON *root = cJSON_CreateObject();
  char *text = NULL;
  if (!root) goto oom;
  if (n_meta > 0) {
    cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
    if (!m) goto oom;
    for (int i = 0; i < n_meta; i++)
      if (!cJSON_AddStringToObject(m, meta_kv[2 * i], meta_kv[2 * i + 1])) goto oom;
  }
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
    if (!e || !cJSON_AddStringToObject(e, "dtype", st_dtype_name(t[i].dtype))) goto oom;
    cJSON *shape = cJSON_AddArrayToObject(e, "shape");
    if (!shape) goto oom;
    for (int d = 0; d < t[i].rank; d++) {
      cJSON *v = cJSON_CreateNumber((double)t[i].shape[d]);
      if (!v || !cJSON_AddItemToArray(shape, v)) {
        cJSON_Delete(v);
        goto oom;
      }
    }
    double offs[2] = {(double)off, (double)(off + t[i].nbytes)};
    if (offs[1] > ST_MAX_JSON_INT) {
      snprintf(err, errlen, "cannot save %s: data section exceeds 2^53 bytes at tensor \"%s\"", path, t[i].name);
      cJSON_Delete(root);
      return NULL;
    }
    cJSON *o = cJSON_CreateDoubleArray(offs, 2);
    if (!o || !cJSON_AddItemToObject(e, "data_offsets", o)) {
      cJSON_Delete(o);
      goto oom;
    }
    off += t[i].nbytes;
  }
  text = cJSON_PrintUnformatted(root);
  if (!text) goto oom;
  cJSON_Delete(root);
  return text;
oom:
  snprintf(err, errlen, "cannot save %s: out of memory building the header", path);
  cJSON_Delete(root);
  return NULL;
}

/* Checks the arguments of duet_st_save; 0, or -1 with a message. */
static int st_save_check(const char *path, const DuetStTensor *t, int n, const char *const *meta_kv, int n_meta,
                         char *err, size_t errlen) {
  if (n < 0 || n_meta < 0 || (n > 0 && !t) || (n_meta > 0 && !meta_kv)) {
    snprintf(err, errlen, "cannot save %s: bad arguments (n %d, n_meta %d)", path, n, n_meta);
    return -1;
  }
  for (int i = 0; i < n_meta; i++) {
    if (!meta_kv[2 * i] || !meta_kv[2 * i + 1]) {
      snprintf(err, errlen, "cannot save %s: metadata entry %d has a NULL key or value", path, i);
      return -1;
    }
    for (int j = 0; j < i; j++)
      if (!strcmp(meta_kv[2 * i], meta_kv[2 * j])) {
        snprintf(err, errlen, "cannot save %s: duplicate metadata key \"%s\"", path, meta_kv[2 * i]);
        return -1;
      }
  }
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    const DuetStTensor *x = &t[i];
    if (!x->name || !strcmp(x->name, "__metadata__")) {
      snprintf(err, errlen, "cannot save %s: tensor %d has %s name", path, i, x->name ? "the reserved" : "a NULL");
      return -1;
    }
    for (int j = 0; j < i; j++)
      if (!strcmp(x->name, t[j].name)) {
        snprintf(err, errlen, "cannot save %s: duplicate tensor name \"%s\"", path, x->name);
        return -1;
      }
    int size = st_dtype_size(x->dtype);
    if (!size) {
      snprintf(err, errlen, "cannot save %s: tensor \"%s\": unsupported dtype %d", path, x->name, x->dtype);
      return -1;
    }
    if (x->rank < 0 || x->rank > DUET_MAX_RANK) {
      snprintf(err, errlen, "cannot save %s: tensor \"%s\": rank %d outside [0, %d]", path, x->name, x->rank,
               DUET_MAX_RANK);
      return -1;
    }
    int64_t want = st_tensor_bytes(x->rank, x->shape, size);
    if (want < 0 || want != x->nbytes) {
      snprintf(err, errlen, "cannot save %s: tensor \"%s\": nbytes %" PRId64 " does not match its shape (%" PRId64
               " bytes)", path, x->name, x->nbytes, want);
      return -1;
    }
    if (x->nbytes > 0 && !x->data) {
      snprintf(err, errlen, "cannot save %s: tensor \"%s\" has NULL data", path, x->name);
      return -1;
    }
    if (total > INT64_MAX - x->nbytes) {
      snprintf(err, errlen, "cannot save %s: total size overflows", path);
      return -1;
    }
    total += x->nbytes;
  }
  return 0;
}

/* fsyncs the directory holding `path`.  0, or -1 with errno set.  File
 * systems that cannot sync directories (EINVAL) count as success. */
static int st_fsync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? malloc((size_t)(slash - path) + 2) : st_strdup(".");
  if (!dir) return -1;
  if (slash) {
    size_t len = slash == path ? 1 : (size_t)(slash - path); /* "/x" -> "/" */
    memcpy(dir, path, len);
    dir[len] = 0;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(dir);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  int e = errno;
  if (close(fd) != 0 && rc == 0) return -1;
  if (rc != 0 && e == EINVAL) return 0;
  errno = e;
  return rc;
}

/* What lstat says `path` is, for messages: "a directory", "a FIFO", ...;
 * NULL for a regular file. */
static const char *st_file_kind(mode_t m) {
  if (S_ISREG(m)) return NULL;
  if (S_ISDIR(m)) return "a directory";
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

const char *duet_st_target_kind(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0) return NULL; /* absent (or unreachable: the save reports why) */
  return st_file_kind(sb.st_mode);
}

/* The temporary name of one save attempt: PATH.tmp.<pid>.<16 hex digits>,
 * the digits mixed from the clock, the attempt and an address (the name is
 * unique per attempt; O_EXCL settles any collision).  Written into tmp. */
static void st_temp_name(char *tmp, size_t tlen, const char *path, unsigned attempt) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  x ^= (uint64_t)attempt * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)&ts;
  x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull, x ^= x >> 27, x *= 0x94d049bb133111ebull, x ^= x >> 31; /* splitmix64 */
  snprintf(tmp, tlen, "%s.tmp.%ld.%016" PRIx64, path, (long)getpid(), x);
}

int duet_st_save(const char *path, const DuetStTensor *t, int n, const char *const *meta_kv, int n_meta, char *err,
                 size_t errlen) {
  if (!path || !*path) {
    snprintf(err, errlen, "cannot save: empty path");
    return -1;
  }
  if (st_save_check(path, t, n, meta_kv, n_meta, err, errlen)) return -1;
  const char *kind = duet_st_target_kind(path);
  if (kind) {
    snprintf(err, errlen, "cannot save %s: it exists and is %s, not a regular file; not replacing it", path, kind);
    return -1;
  }
  char *header = st_header_build(path, t, n, meta_kv, n_meta, err, errlen);
  if (!header) return -1;
  size_t hlen = strlen(header), pad = (8 - (8 + hlen) % 8) % 8;
  uint64_t total_h = hlen + pad;
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(total_h >> (8 * i));
  static const char spaces[] = "        ";

  size_t tlen = strlen(path) + 48;
  char *tmp = malloc(tlen);
  if (!tmp) {
    snprintf(err, errlen, "cannot save %s: out of memory", path);
    free(header);
    return -1;
  }

  const char *call = NULL;
  int e = 0;
  bool created = false;
  FILE *f = NULL;
  int fd = -1;
  /* a fresh name per attempt, created exclusively (never clobbers a file);
   * another name when one exists already */
  for (unsigned attempt = 0; fd < 0 && attempt < 16; attempt++) {
    st_temp_name(tmp, tlen, path, attempt);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    call = "open";
    e = errno;
    goto fail;
  }
  created = true;
  if (!(f = fdopen(fd, "wb"))) {
    call = "fdopen";
    e = errno;
    close(fd);
    goto fail;
  }
  if (fwrite(len8, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen || fwrite(spaces, 1, pad, f) != pad) {
    call = "fwrite";
    e = errno;
    goto fail;
  }
  for (int i = 0; i < n; i++)
    if (t[i].nbytes > 0 && fwrite(t[i].data, 1, (size_t)t[i].nbytes, f) != (size_t)t[i].nbytes) {
      call = "fwrite";
      e = errno;
      goto fail;
    }
  if (fflush(f) != 0) {
    call = "fflush";
    e = errno;
    goto fail;
  }
  if (fsync(fileno(f)) != 0) {
    call = "fsync";
    e = errno;
    goto fail;
  }
  int rc_close = fclose(f);
  f = NULL;
  if (rc_close != 0) {
    call = "fclose";
    e = errno;
    goto fail;
  }
  /* again just before the rename: the target may have changed meanwhile */
  if ((kind = duet_st_target_kind(path))) {
    snprintf(err, errlen, "cannot save %s: it exists and is %s, not a regular file; not replacing it", path, kind);
    call = "";
    goto fail;
  }
  if (rename(tmp, path) != 0) {
    call = "rename";
    e = errno;
    goto fail;
  }
  created = false;
  if (st_fsync_dir(path) != 0) {
    snprintf(err, errlen, "saved %s but fsync of its directory failed: %s (the new file may not survive a crash)",
             path, strerror(errno));
    free(tmp);
    free(header);
    return -1;
  }
  free(tmp);
  free(header);
  return 0;

fail:
  if (f) fclose(f); /* already failing: its result adds nothing */
  if (!strcmp(call, "rename"))
    snprintf(err, errlen, "cannot save %s: rename(%s, %s): %s", path, tmp, path, e ? strerror(e) : "failed");
  else if (*call)
    snprintf(err, errlen, "cannot save %s: %s(%s): %s", path, call, tmp, e ? strerror(e) : "failed");
  if (created && remove(tmp) != 0) {
    size_t used = strlen(err);
    if (used < errlen)
      snprintf(err + used, errlen - used, "; could not remove %s: %s", tmp, strerror(errno));
  }
  free(tmp);
  free(header);
  return -1;
}

/* ------------------------------------------------------- stale temporaries */

/* The pid of a temporary name of `base` (the target's last path
 * component): "<base>.tmp.<pid>" (duet before unique names) or
 * "<base>.tmp.<pid>.<16 lowercase hex digits>"; 0 when `name` is neither. */
static long st_temp_pid(const char *name, const char *base) {
  size_t bn = strlen(base);
  if (strncmp(name, base, bn) || strncmp(name + bn, ".tmp.", 5)) return 0;
  const char *s = name + bn + 5, *q = s;
  long pid = 0;
  while (*q >= '0' && *q <= '9' && q - s < 10) pid = pid * 10 + (*q++ - '0');
  if (q == s || *s == '0' || pid <= 0) return 0;
  if (!*q) return pid;
  if (*q++ != '.') return 0;
  for (int i = 0; i < 16; i++, q++)
    if (!((*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f'))) return 0;
  return *q ? 0 : pid;
}

int duet_st_remove_stale_temps(const char *path, int64_t min_age_s, char *first, size_t firstlen) {
  if (firstlen) first[0] = 0;
  if (!path || !*path) return 0;
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t dn = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
  char *dir = malloc(dn + 1);
  if (!*base || !dir) {
    free(dir);
    return 0;
  }
  memcpy(dir, slash ? path : ".", dn);
  dir[dn] = 0;
  DIR *d = opendir(dir);
  if (!d) {
    free(dir);
    return 0;
  }
  int fd = dirfd(d), removed = 0;
  time_t now = time(NULL);
  long self = (long)getpid();
  struct dirent *ent;
  while ((ent = readdir(d))) {
    long pid = st_temp_pid(ent->d_name, base);
    struct stat sb;
    if (!pid || fstatat(fd, ent->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(sb.st_mode) || sb.st_uid != geteuid()) continue;     /* a regular file of ours */
    if (now < sb.st_mtime || (int64_t)(now - sb.st_mtime) < min_age_s) continue; /* untouched for long */
    if (pid != self && (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) continue; /* its writer is gone */
    if (unlinkat(fd, ent->d_name, 0) == 0) {
      if (!removed && firstlen) snprintf(first, firstlen, "%s/%s", dir, ent->d_name);
      removed++;
    }
  }
  closedir(d);
  free(dir);
  return removed;
}

/* -------------------------------------------------------------- loading */

struct DuetStFile {
  int n;
  DuetStTensor *t;   /* names owned; data points into `data` */
  int n_meta;
  char **meta;       /* 2 * n_meta strings: key, value, ... */
  unsigned char *data;
};

void duet_st_close(DuetStFile *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) free((char *)f->t[i].name);
  for (int i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
  free(f->t);
  free(f->meta);
  free(f->data);
  free(f);
}

int duet_st_count(const DuetStFile *f) { return f->n; }

const DuetStTensor *duet_st_get(const DuetStFile *f, int i) {
  return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const DuetStTensor *duet_st_find(const DuetStFile *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->t[i].name, name)) return &f->t[i];
  return NULL;
}

const char *duet_st_meta(const DuetStFile *f, const char *key) {
  for (int i = 0; i < f->n_meta; i++)
    if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
  return NULL;
}

/* Reads the regular file `path` into a malloc'd buffer: all of it, or
 * (header_only) its first 8 + N bytes when its first 8 hold a header length
 * N that fits the file and the limit (else its first min(size, 8) bytes,
 * for duet_st_open's messages).  *fsize: the file's size. */
static unsigned char *st_read_file(const char *path, bool header_only, size_t *size, size_t *fsize, char *err,
                                   size_t errlen) {
  int not_regular;
  FILE *f = duet_fopen_regular(path, &not_regular);
  if (!f) {
    if (not_regular) snprintf(err, errlen, "cannot read %s: not a regular file", path);
    else snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
    fclose(f);
    return NULL;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "cannot read %s: not a regular file", path);
    fclose(f);
    return NULL;
  }
  size_t n = (size_t)st.st_size;
  unsigned char len8[8];
  if (header_only && n >= 8) {
    if (fread(len8, 1, 8, f) != 8) {
      snprintf(err, errlen, "cannot read %s: %s", path, ferror(f) ? strerror(errno) : "file shrank while reading");
      fclose(f);
      return NULL;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    n = hlen <= n - 8 && hlen <= ST_MAX_HEADER ? (size_t)(8 + hlen) : 8;
  }
  unsigned char *buf = malloc(n ? n : 1);
  if (!buf) {
    snprintf(err, errlen, "cannot read %s: out of memory for %zu bytes", path, n);
    fclose(f);
    return NULL;
  }
  size_t at = header_only && n >= 8 ? 8 : 0;
  if (at) memcpy(buf, len8, 8);
  if (fread(buf + at, 1, n - at, f) != n - at) {
    snprintf(err, errlen, "cannot read %s: %s", path, ferror(f) ? strerror(errno) : "file shrank while reading");
    free(buf);
    fclose(f);
    return NULL;
  }
  if (fclose(f) != 0) {
    snprintf(err, errlen, "cannot read %s: fclose: %s", path, strerror(errno));
    free(buf);
    return NULL;
  }
  *size = n;
  *fsize = (size_t)st.st_size;
  return buf;
}

/* A JSON number that is an integer in [0, 2^53]; -1 otherwise. */
static int64_t st_json_size(const cJSON *v) {
  if (!cJSON_IsNumber(v)) return -1;
  double d = v->valuedouble;
  if (!(d >= 0 && d <= ST_MAX_JSON_INT) || d != (double)(int64_t)d) return -1;
  return (int64_t)d;
}

typedef struct StRange {
  int64_t begin, end;
  int idx;
} StRange;

static int st_range_cmp(const void *a, const void *b) {
  const StRange *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* Writes "corrupt safetensors file PATH: " and the message into err, then
 * jumps to the function's `fail` label. */
#define BAD(...)                                                                                    \
  do {                                                                                              \
    int used_ = snprintf(err, errlen, "corrupt safetensors file %s: ", path);                       \
    if (used_ >= 0 && (size_t)used_ < errlen) snprintf(err + used_, errlen - (size_t)used_, __VA_ARGS__); \
    goto fail;                                                                                      \
  } while (0)

/* Reads one tensor entry `e` called `name` into `x` (name not set); checks
 * dtype, shape and offsets against `data_size`. */
static int st_parse_entry(const char *path, const char *name, const cJSON *e, int64_t data_size, DuetStTensor *x,
                          int64_t *begin, char *err, size_t errlen) {
  if (!cJSON_IsObject(e)) BAD("tensor \"%s\": entry is not a JSON object", name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!cJSON_IsString(dt)) BAD("tensor \"%s\": missing \"dtype\" string", name);
  if (!cJSON_IsArray(shape)) BAD("tensor \"%s\": missing \"shape\" array", name);
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    BAD("tensor \"%s\": \"data_offsets\" is not an array [begin, end]", name);
  int size = 0;
  x->dtype = DUET_VOID;
  for (int i = 0; i < ST_N_DTYPES; i++)
    if (!strcmp(dt->valuestring, st_dtypes[i].name)) {
      size = st_dtypes[i].size;
      x->dtype = st_dtypes[i].duet;
    }
  if (!size) BAD("tensor \"%s\": unknown dtype \"%s\"", name, dt->valuestring);
  if (x->dtype == DUET_VOID)
    BAD("tensor \"%s\": dtype %s is not supported (duet reads F32, F64, I32, F16, BF16, U8)", name, dt->valuestring);
  int rank = cJSON_GetArraySize(shape);
  if (rank > DUET_MAX_RANK) BAD("tensor \"%s\": rank %d exceeds %d", name, rank, DUET_MAX_RANK);
  x->rank = rank;
  for (int d = 0; d < rank; d++) {
    int64_t v = st_json_size(cJSON_GetArrayItem(shape, d));
    if (v < 0) BAD("tensor \"%s\": shape[%d] is not an integer >= 0", name, d);
    x->shape[d] = v;
  }
  int64_t b = st_json_size(cJSON_GetArrayItem(offs, 0)), en = st_json_size(cJSON_GetArrayItem(offs, 1));
  if (b < 0 || en < 0) BAD("tensor \"%s\": data_offsets are not integers >= 0", name);
  if (b > en || en > data_size)
    BAD("tensor \"%s\": data_offsets [%" PRId64 ", %" PRId64 "] out of range (data section is %" PRId64 " bytes)",
        name, b, en, data_size);
  int64_t want = st_tensor_bytes(rank, x->shape, size);
  if (want < 0) BAD("tensor \"%s\": shape's byte size overflows", name);
  if (want != en - b)
    BAD("tensor \"%s\": shape needs %" PRId64 " bytes of %s but data_offsets [%" PRId64 ", %" PRId64 "] hold %" PRId64,
        name, want, dt->valuestring, b, en, en - b);
  x->nbytes = want;
  *begin = b;
  return 0;
fail:
  return -1;
}

/* duet_st_open, or (header_only) duet_st_open_header. */
static DuetStFile *st_parse(const char *path, const unsigned char *buf, size_t fsize, bool header_only, char *err,
                            size_t errlen);

static DuetStFile *st_open(const char *path, bool header_only, char *err, size_t errlen) {
  size_t fsize = 0, got = 0;
  unsigned char *buf = st_read_file(path, header_only, &got, &fsize, err, errlen);
  if (!buf) return NULL;
  DuetStFile *f = st_parse(path, buf, fsize, header_only, err, errlen);
  free(buf);
  return f;
}

/* The file's contents parsed and validated: buf holds its first 8 + N
 * bytes (header_only) or all fsize of them; messages name `path`.  buf is
 * the caller's (the tensors' data are copied out of it). */
static DuetStFile *st_parse(const char *path, const unsigned char *buf, size_t fsize, bool header_only, char *err,
                            size_t errlen) {
  cJSON *root = NULL;
  StRange *ranges = NULL;
  DuetStFile *f = calloc(1, sizeof *f);
  if (!f) {
    snprintf(err, errlen, "cannot read %s: out of memory", path);
    return NULL;
  }
  if (fsize < 8) BAD("%zu bytes, shorter than the 8-byte header length", fsize);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
  if (hlen > fsize - 8)
    BAD("header length %" PRIu64 " exceeds the %zu bytes after the length field", hlen, fsize - 8);
  if (hlen > ST_MAX_HEADER) BAD("header length %" PRIu64 " exceeds the limit of %llu", hlen, ST_MAX_HEADER);
  const char *htext = (const char *)buf + 8, *end = NULL;
  root = cJSON_ParseWithLengthOpts(htext, (size_t)hlen, &end, 0);
  if (!root) {
    size_t at = end && end >= htext ? (size_t)(end - htext) : 0;
    BAD("header is not valid JSON (error at header byte %zu)", at);
  }
  for (const char *p = end; p < htext + hlen; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
      BAD("header has bytes after its JSON (at header byte %zu)", (size_t)(p - htext));
  if (!cJSON_IsObject(root)) BAD("header is not a JSON object");
  int64_t data_size = (int64_t)(fsize - 8 - hlen);

  int n_entries = cJSON_GetArraySize(root);
  f->t = calloc((size_t)n_entries + 1, sizeof *f->t);
  ranges = calloc((size_t)n_entries + 1, sizeof *ranges);
  if (!f->t || !ranges) BAD("out of memory for %d entries", n_entries);
  int64_t begin = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, root) {
    if (!e->string) BAD("header entry without a name");
    if (!strcmp(e->string, "__metadata__")) {
      if (f->meta) BAD("duplicate \"__metadata__\"");
      if (!cJSON_IsObject(e)) BAD("\"__metadata__\" is not a JSON object");
      int nm = cJSON_GetArraySize(e);
      f->meta = calloc(2 * (size_t)nm + 1, sizeof *f->meta);
      if (!f->meta) BAD("out of memory for metadata");
      const cJSON *m;
      cJSON_ArrayForEach(m, e) {
        if (!cJSON_IsString(m)) BAD("metadata \"%s\" is not a string", m->string);
        char *k = st_strdup(m->string), *v = st_strdup(m->valuestring);
        f->meta[2 * f->n_meta] = k;
        f->meta[2 * f->n_meta + 1] = v;
        f->n_meta++;
        if (!k || !v) BAD("out of memory for metadata");
      }
      continue;
    }
    for (int j = 0; j < f->n; j++)
      if (!strcmp(f->t[j].name, e->string)) BAD("tensor \"%s\" appears twice", e->string);
    DuetStTensor *x = &f->t[f->n];
    if (st_parse_entry(path, e->string, e, data_size, x, &begin, err, errlen)) goto fail; /* err is set */
    x->name = st_strdup(e->string);
    if (!x->name) BAD("out of memory");
    ranges[f->n] = (StRange){begin, begin + x->nbytes, f->n};
    f->n++;
  }

  /* non-overlapping: sorted by begin, each range starts at or after the end
   * of the previous non-empty one */
  qsort(ranges, (size_t)f->n, sizeof *ranges, st_range_cmp);
  int prev = -1;
  for (int i = 0; i < f->n; i++) {
    if (ranges[i].begin == ranges[i].end) continue;
    if (prev >= 0 && ranges[i].begin < ranges[prev].end)
      BAD("tensors \"%s\" [%" PRId64 ", %" PRId64 "] and \"%s\" [%" PRId64 ", %" PRId64 "] overlap",
          f->t[ranges[prev].idx].name, ranges[prev].begin, ranges[prev].end, f->t[ranges[i].idx].name,
          ranges[i].begin, ranges[i].end);
    prev = i;
  }

  if (header_only) goto done;
  /* copy each tensor to an 8-byte aligned place in one block */
  int64_t total = 0;
  for (int i = 0; i < f->n; i++) total += (f->t[i].nbytes + 7) / 8 * 8;
  f->data = malloc(total ? (size_t)total : 1);
  if (!f->data) BAD("out of memory for %" PRId64 " bytes of data", total);
  const unsigned char *dsec = buf + 8 + hlen;
  int64_t at = 0;
  for (int i = 0; i < f->n; i++) {
    const StRange *r = &ranges[i];
    DuetStTensor *x = &f->t[r->idx];
    if (x->nbytes) memcpy(f->data + at, dsec + r->begin, (size_t)x->nbytes);
    x->data = f->data + at;
    at += (x->nbytes + 7) / 8 * 8;
  }
done:
  cJSON_Delete(root);
  free(ranges);
  return f;

fail:
  cJSON_Delete(root);
  free(ranges);
  duet_st_close(f);
  return NULL;
}

DuetStFile *duet_st_open(const char *path, char *err, size_t errlen) { return st_open(path, false, err, errlen); }

DuetStFile *duet_st_open_header(const char *path, char *err, size_t errlen) {
  return st_open(path, true, err, errlen);
}

DuetStFile *duet_st_open_mem(const void *data, size_t n, const char *name, int header_only, char *err,
                             size_t errlen) {
  return st_parse(name, data, n, header_only != 0, err, errlen);
}
