/* tests/test_safetensors.c: the runtime's safetensors reader and writer.
 * Round trips, exact bytes, a file laid out as the Python reference writer
 * lays it out, corrupt files (each with its exact message; also read
 * from memory, duet_st_open_mem) and atomic
 * saving (a failed save leaves the old file byte-identical, no temp file;
 * a temp name is new for each attempt, so a stale temp of an earlier
 * process with the same pid does not block a save; only a regular file is
 * replaced), and which stale temps duet_st_remove_stale_temps removes.
 * Files go to a fresh directory under $TMPDIR (default /tmp), removed at the
 * end. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../runtime/duet_rt.h"

static int n_pass, n_fail;
static char dir[512];

static void check(int ok, const char *what) {
  if (ok) {
    n_pass++;
  } else {
    n_fail++;
    printf("FAIL: %s\n", what);
  }
}

/* dir/name, in a static ring of 8 buffers: copy it to keep it longer. */
static const char *in_dir(const char *name) {
  static char buf[8][768];
  static int k;
  char *p = buf[k++ % 8];
  snprintf(p, sizeof buf[0], "%s/%.255s", dir, name);
  return p;
}

static int write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(p, 1, n, f);
  return (fclose(f) != 0 || w != n) ? -1 : 0;
}

/* The whole file in a malloc'd buffer (NULL if unreadable). */
static unsigned char *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  unsigned char *buf = malloc(cap);
  while (buf) {
    len += fread(buf + len, 1, cap - len, f);
    if (len < cap) break;
    unsigned char *nb = realloc(buf, cap *= 2);
    if (!nb) free(buf);
    buf = nb;
  }
  if (ferror(f)) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *n = len;
  return buf;
}

/* Writes a file of 8-byte length + header JSON + data. */
static int write_st(const char *path, const char *json, const void *data, size_t dn) {
  size_t hn = strlen(json), n = 8 + hn + dn;
  unsigned char *b = malloc(n);
  if (!b) return -1;
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hn >> (8 * i));
  memcpy(b + 8, json, hn);
  if (dn) memcpy(b + 8 + hn, data, dn);
  int rc = write_bytes(path, b, n);
  free(b);
  return rc;
}

/* Number of entries of dir whose name contains ".tmp." */
static int count_temps(void) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
  closedir(d);
  return n;
}

static int same_file(const char *path, const unsigned char *want, size_t wn) {
  size_t n;
  unsigned char *got = read_bytes(path, &n);
  int ok = got && n == wn && !memcmp(got, want, n);
  free(got);
  return ok;
}

static DuetStTensor mk(const char *name, int dtype, int rank, const int64_t *shape, const void *data,
                       int64_t nbytes) {
  DuetStTensor t = {name, dtype, rank, {0}, data, nbytes};
  for (int i = 0; i < rank; i++) t.shape[i] = shape[i];
  return t;
}

static int same_tensor(const DuetStTensor *a, const DuetStTensor *b) {
  if (!a || !b || strcmp(a->name, b->name) || a->dtype != b->dtype || a->rank != b->rank || a->nbytes != b->nbytes)
    return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return a->nbytes == 0 || !memcmp(a->data, b->data, (size_t)a->nbytes);
}

/* ----------------------------------------------------------- round trip */

static void test_round_trip(void) {
  float a[6] = {1.5f, -2.25f, 3e-38f, 1e38f, -0.0f, 0.1f};
  double s = 3.141592653589793;
  int32_t iv[4] = {0, -1, INT32_MAX, INT32_MIN};
  float c[6] = {6, 5, 4, 3, 2, 1};
  double big[300];
  for (int i = 0; i < 300; i++) big[i] = i * 0.001 - 0.1;
  DuetStTensor t[6] = {
      mk("layer1.linear1.w", DUET_F32, 2, (int64_t[]){2, 3}, a, sizeof a),
      mk("scalar", DUET_F64, 0, NULL, &s, sizeof s),
      mk("idx", DUET_I32, 1, (int64_t[]){4}, iv, sizeof iv),
      mk("empty", DUET_F32, 2, (int64_t[]){0, 5}, NULL, 0),
      mk("r3", DUET_F32, 3, (int64_t[]){2, 1, 3}, c, sizeof c),
      mk("big", DUET_F64, 2, (int64_t[]){3, 100}, big, sizeof big),
  };
  const char *meta[] = {"torch_version", "1.13.0", "config", "{\"n_layer\": 2}"};
  const char *p = in_dir("rt.safetensors");
  char err[512] = "";
  check(duet_st_save(p, t, 6, meta, 2, err, sizeof err) == 0, "round trip: save");
  if (*err) printf("  %s\n", err);
  DuetStFile *f = duet_st_open(p, err, sizeof err);
  check(f != NULL, "round trip: open");
  if (!f) {
    printf("  %s\n", err);
    return;
  }
  check(duet_st_count(f) == 6, "round trip: count");
  for (int i = 0; i < 6; i++) {
    const DuetStTensor *g = duet_st_get(f, i);
    char what[128];
    snprintf(what, sizeof what, "round trip: tensor %d (%s) in order, same shape and bytes", i, t[i].name);
    check(same_tensor(g, &t[i]), what);
    snprintf(what, sizeof what, "round trip: tensor %s is 8-byte aligned", t[i].name);
    check(g && (uintptr_t)g->data % 8 == 0, what);
    check(duet_st_find(f, t[i].name) == g, "round trip: find returns get's tensor");
  }
  check(duet_st_find(f, "nope") == NULL, "round trip: find of an absent name is NULL");
  check(duet_st_get(f, -1) == NULL && duet_st_get(f, 6) == NULL, "round trip: get out of range is NULL");
  const char *v = duet_st_meta(f, "config");
  check(v && !strcmp(v, "{\"n_layer\": 2}"), "round trip: metadata value with quotes");
  v = duet_st_meta(f, "torch_version");
  check(v && !strcmp(v, "1.13.0"), "round trip: metadata value");
  check(duet_st_meta(f, "absent") == NULL, "round trip: absent metadata key is NULL");
  /* the same file from memory (an executable's embedded weights): the
   * same tensors, in order, 8-byte aligned, and metadata; the buffer may
   * go once opened (the data are copied), and may be misaligned */
  size_t nm;
  unsigned char *mem = read_bytes(p, &nm), *odd = mem ? malloc(nm + 1) : NULL;
  if (odd) memcpy(odd + 1, mem, nm);
  DuetStFile *fm = odd ? duet_st_open_mem(odd + 1, nm, "embedded", 0, err, sizeof err) : NULL;
  free(mem), free(odd);
  check(fm && duet_st_count(fm) == 6, "from memory: open, count");
  for (int i = 0; fm && i < 6; i++) {
    const DuetStTensor *g = duet_st_get(fm, i);
    check(same_tensor(g, &t[i]) && (uintptr_t)g->data % 8 == 0, "from memory: tensor in order, same bytes, aligned");
  }
  v = fm ? duet_st_meta(fm, "config") : NULL;
  check(v && !strcmp(v, "{\"n_layer\": 2}"), "from memory: metadata");
  duet_st_close(fm);

  /* saving what was loaded gives the same bytes */
  DuetStTensor t2[6];
  for (int i = 0; i < 6; i++) t2[i] = *duet_st_get(f, i);
  const char *p2 = in_dir("rt2.safetensors");
  check(duet_st_save(p2, t2, 6, meta, 2, err, sizeof err) == 0, "round trip: save again");
  size_t n1, n2;
  unsigned char *b1 = read_bytes(p, &n1), *b2 = read_bytes(p2, &n2);
  check(b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1), "round trip: re-saved file is byte-identical");
  free(b1);
  free(b2);
  duet_st_close(f);

  /* no tensors, no metadata */
  const char *p3 = in_dir("none.safetensors");
  check(duet_st_save(p3, NULL, 0, NULL, 0, err, sizeof err) == 0, "empty file: save");
  f = duet_st_open(p3, err, sizeof err);
  check(f && duet_st_count(f) == 0 && !duet_st_meta(f, "x"), "empty file: open, 0 tensors");
  duet_st_close(f);
  check(count_temps() == 0, "round trip: no temp files left");
}

/* --------------------------------------------------------- exact bytes */

static void test_exact_bytes(void) {
  float a[2] = {1.0f, -2.0f};
  int32_t b[3] = {7, 8, 9};
  DuetStTensor t[2] = {mk("a", DUET_F32, 1, (int64_t[]){2}, a, sizeof a),
                       mk("b", DUET_I32, 2, (int64_t[]){1, 3}, b, sizeof b)};
  const char *meta[] = {"k", "v"};
  const char *json = "{\"__metadata__\":{\"k\":\"v\"},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"I32\",\"shape\":[1,3],\"data_offsets\":[8,20]}}";
  size_t hn = strlen(json), pad = (8 - (8 + hn) % 8) % 8, n = 8 + hn + pad + 20;
  unsigned char want[512];
  for (int i = 0; i < 8; i++) want[i] = (unsigned char)((hn + pad) >> (8 * i));
  memcpy(want + 8, json, hn);
  memset(want + 8 + hn, ' ', pad);
  memcpy(want + 8 + hn + pad, a, 8);
  memcpy(want + 8 + hn + pad + 8, b, 12);
  const char *p = in_dir("exact.safetensors");
  char err[512] = "";
  check(duet_st_save(p, t, 2, meta, 1, err, sizeof err) == 0, "exact bytes: save");
  check((8 + hn + pad) % 8 == 0 && same_file(p, want, n), "exact bytes: file equals the expected layout");
}

/* ------------------------------------ a file laid out by the Python writer */

static void test_reference_layout(void) {
  /* safetensors' Python writer: __metadata__ first, tensors sorted by dtype
   * alignment then name, compact JSON padded with spaces to 8 bytes */
  const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                     "\"b\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,32]},"
                     "\"i\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[32,44]}}";
  char padded[512];
  size_t hn = strlen(json);
  snprintf(padded, sizeof padded, "%s%.*s", json, (int)((8 - (8 + hn) % 8) % 8), "        ");
  unsigned char data[44];
  double bd[2] = {0.5, -1e300};
  float ad[4] = {1, 2, 3, 4};
  int32_t id[3] = {-5, 0, 5};
  memcpy(data, bd, 16);
  memcpy(data + 16, ad, 16);
  memcpy(data + 32, id, 12);
  const char *p = in_dir("pyref.safetensors");
  char err[512] = "";
  check(write_st(p, padded, data, sizeof data) == 0, "reference layout: write");
  DuetStFile *f = duet_st_open(p, err, sizeof err);
  check(f != NULL, "reference layout: open");
  if (!f) {
    printf("  %s\n", err);
    return;
  }
  check(duet_st_count(f) == 3, "reference layout: 3 tensors");
  const DuetStTensor *b = duet_st_find(f, "b"), *a = duet_st_find(f, "a"), *i = duet_st_find(f, "i");
  check(b && b->dtype == DUET_F64 && b->rank == 1 && b->shape[0] == 2 && !memcmp(b->data, bd, 16),
        "reference layout: F64 tensor");
  check(a && a->dtype == DUET_F32 && a->rank == 2 && a->shape[0] == 2 && a->shape[1] == 2 && !memcmp(a->data, ad, 16),
        "reference layout: F32 tensor");
  check(i && i->dtype == DUET_I32 && i->nbytes == 12 && !memcmp(i->data, id, 12), "reference layout: I32 tensor");
  check(duet_st_get(f, 0) == b && duet_st_get(f, 2) == i, "reference layout: header order kept");
  const char *fmt = duet_st_meta(f, "format");
  check(fmt && !strcmp(fmt, "pt"), "reference layout: metadata");
  duet_st_close(f);

  /* json.dumps with its default ", " and ": " separators, no padding, so
   * the data start at an odd offset; a scalar; a zero-size tensor */
  const char *json2 = "{\"s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}, "
                      "\"z\": {\"dtype\": \"F64\", \"shape\": [3, 0], \"data_offsets\": [4, 4]}, "
                      "\"d\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [4, 12]}}";
  unsigned char d2[12];
  float sv = 42.0f;
  double dv = -7.25;
  memcpy(d2, &sv, 4);
  memcpy(d2 + 4, &dv, 8);
  p = in_dir("pyref2.safetensors");
  check(write_st(p, json2, d2, sizeof d2) == 0 && (8 + strlen(json2)) % 8 != 0, "spaced JSON: write, unaligned");
  f = duet_st_open(p, err, sizeof err);
  check(f != NULL, "spaced JSON: open");
  if (!f) {
    printf("  %s\n", err);
    return;
  }
  const DuetStTensor *s = duet_st_find(f, "s"), *z = duet_st_find(f, "z"), *d = duet_st_find(f, "d");
  check(s && s->rank == 0 && s->nbytes == 4 && *(const float *)s->data == 42.0f, "spaced JSON: scalar");
  check(z && z->rank == 2 && z->shape[1] == 0 && z->nbytes == 0, "spaced JSON: zero-size tensor");
  check(d && (uintptr_t)d->data % 8 == 0 && *(const double *)d->data == -7.25, "spaced JSON: aligned F64 copy");
  duet_st_close(f);
}

/* --------------------------------------------------------- corrupt files */

static void expect_open_error(const char *what, const char *name, const char *want_tail) {
  const char *p = in_dir(name);
  char err[512] = "", want[1024];
  DuetStFile *f = duet_st_open(p, err, sizeof err);
  snprintf(want, sizeof want, "corrupt safetensors file %s: %s", p, want_tail);
  int ok = f == NULL && !strcmp(err, want);
  check(ok, what);
  if (!ok) printf("  got:  %s\n  want: %s\n", f ? "(opened)" : err, want);
  duet_st_close(f);
  /* every check is one of the header's: reading the header only finds it too */
  char err2[512] = "";
  f = duet_st_open_header(p, err2, sizeof err2);
  ok = f == NULL && !strcmp(err2, want);
  check(ok, "header only: same error");
  if (!ok) printf("  %s, header only:\n  got:  %s\n  want: %s\n", what, f ? "(opened)" : err2, want);
  duet_st_close(f);
  /* from memory (duet_st_open_mem, whole or header only): the same
   * parser, the same message naming the name given for the file */
  size_t n;
  unsigned char *mem = read_bytes(p, &n);
  for (int h = 0; h < 2; h++) {
    char err3[512] = "";
    f = mem ? duet_st_open_mem(mem, n, p, h, err3, sizeof err3) : NULL;
    ok = mem && f == NULL && !strcmp(err3, want);
    check(ok, h ? "from memory, header only: same error" : "from memory: same error");
    if (!ok) printf("  %s, from memory:\n  got:  %s\n  want: %s\n", what, f ? "(opened)" : err3, want);
    duet_st_close(f);
  }
  free(mem);
}

static void corrupt(const char *what, const char *json, size_t data_bytes, const char *want_tail) {
  static unsigned char zeros[256];
  char name[64];
  static int k;
  snprintf(name, sizeof name, "bad%d.safetensors", k++);
  if (write_st(in_dir(name), json, zeros, data_bytes)) {
    check(0, "corrupt: write");
    return;
  }
  expect_open_error(what, name, want_tail);
}

static void test_corrupt(void) {
  const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  char want[512];
  size_t hn = strlen(ok);

  /* truncated: fewer than 8 bytes, then a valid file cut inside its data */
  check(write_bytes(in_dir("short.safetensors"), "\x10\0\0\0\0", 5) == 0, "corrupt: write short");
  expect_open_error("truncated: 5 bytes", "short.safetensors", "5 bytes, shorter than the 8-byte header length");
  check(write_bytes(in_dir("zero.safetensors"), "", 0) == 0, "corrupt: write empty");
  expect_open_error("truncated: 0 bytes", "zero.safetensors", "0 bytes, shorter than the 8-byte header length");
  corrupt("truncated: data cut short", ok, 6,
          "tensor \"a\": data_offsets [0, 8] out of range (data section is 6 bytes)");

  /* header length larger than the file */
  unsigned char b[8 + 64] = {0};
  b[0] = 0xe8, b[1] = 0x03; /* 1000 */
  memcpy(b + 8, ok, hn);
  check(write_bytes(in_dir("hlen.safetensors"), b, 8 + hn) == 0, "corrupt: write hlen");
  snprintf(want, sizeof want, "header length 1000 exceeds the %zu bytes after the length field", hn);
  expect_open_error("header length beyond the file", "hlen.safetensors", want);
  memset(b, 0xff, 8); /* 2^64 - 1: no overflow in the check */
  check(write_bytes(in_dir("hlen2.safetensors"), b, 8 + hn) == 0, "corrupt: write hlen2");
  snprintf(want, sizeof want, "header length 18446744073709551615 exceeds the %zu bytes after the length field", hn);
  expect_open_error("header length 2^64-1", "hlen2.safetensors", want);

  /* bad JSON */
  corrupt("bad JSON: missing brace", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8,
          "header is not valid JSON (error at header byte 52)");
  corrupt("bad JSON: not JSON at all", "hello", 0, "header is not valid JSON (error at header byte 0)");
  corrupt("bad JSON: trailing bytes", "{}  x", 0, "header has bytes after its JSON (at header byte 4)");
  corrupt("header not an object", "[1,2]", 0, "header is not a JSON object");

  /* dtypes */
  corrupt("unknown dtype", "{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
          "tensor \"a\": unknown dtype \"Q7\"");
  corrupt("unsupported dtype", "{\"a\":{\"dtype\":\"U16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8,
          "tensor \"a\": dtype U16 is not supported (duet reads F32, F64, I32, F16, BF16, U8)");
  corrupt("dtype not a string", "{\"a\":{\"dtype\":1,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
          "tensor \"a\": missing \"dtype\" string");

  /* offsets */
  corrupt("offsets beyond the data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 12,
          "tensor \"a\": data_offsets [8, 16] out of range (data section is 12 bytes)");
  corrupt("offsets reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 12,
          "tensor \"a\": data_offsets [8, 0] out of range (data section is 12 bytes)");
  corrupt("offsets negative", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 12,
          "tensor \"a\": data_offsets are not integers >= 0");
  corrupt("offsets not a pair", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 12,
          "tensor \"a\": \"data_offsets\" is not an array [begin, end]");

  /* sizes */
  corrupt("size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24,
          "tensor \"a\": shape needs 24 bytes of F32 but data_offsets [0, 20] hold 20");
  corrupt("size overflow", "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
          "tensor \"a\": shape's byte size overflows");
  corrupt("negative shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}}", 8,
          "tensor \"a\": shape[1] is not an integer >= 0");
  corrupt("fractional shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8,
          "tensor \"a\": shape[0] is not an integer >= 0");
  corrupt("rank too high", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
          "tensor \"a\": rank 9 exceeds 8");

  /* overlapping ranges, listed out of order */
  corrupt("overlap",
          "{\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[8,20]},"
          "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}",
          20, "tensors \"a\" [0, 12] and \"b\" [8, 20] overlap");
  corrupt("same range twice",
          "{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
          4, "tensors \"a\" [0, 4] and \"b\" [0, 4] overlap");

  /* names and metadata */
  corrupt("duplicate name",
          "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
          8, "tensor \"a\" appears twice");
  corrupt("entry not an object", "{\"a\":[1]}", 0, "tensor \"a\": entry is not a JSON object");
  corrupt("metadata not a string", "{\"__metadata__\":{\"n\":3}}", 0, "metadata \"n\" is not a string");
  corrupt("metadata not an object", "{\"__metadata__\":\"x\"}", 0, "\"__metadata__\" is not a JSON object");

  /* not a file */
  char err[512], w2[1024];
  const char *p = in_dir("missing.safetensors");
  DuetStFile *f = duet_st_open(p, err, sizeof err);
  snprintf(w2, sizeof w2, "cannot open %s: No such file or directory", p);
  check(!f && !strcmp(err, w2), "missing file: message");
  if (f || strcmp(err, w2)) printf("  got: %s\n", err);
  f = duet_st_open(dir, err, sizeof err);
  snprintf(w2, sizeof w2, "cannot read %s: not a regular file", dir);
  check(!f && !strcmp(err, w2), "directory: message");
  if (f || strcmp(err, w2)) printf("  got: %s\n", err);

  /* a small err buffer is truncated, not overrun */
  char tiny[16];
  f = duet_st_open(in_dir("short.safetensors"), tiny, sizeof tiny);
  check(!f && strlen(tiny) == sizeof tiny - 1, "small err buffer: truncated message");
}

/* ------------------------------------------------------------ atomicity */

/* want: the exact message, where `*` matches the 16 hex digits of a temp
 * name (fnmatch; the paths of these tests hold no other pattern
 * characters). */
static void expect_save_error(const char *what, const char *path, const DuetStTensor *t, int n, const char *want) {
  char err[1024] = "";
  int rc = duet_st_save(path, t, n, NULL, 0, err, sizeof err);
  int ok = rc == -1 && fnmatch(want, err, 0) == 0;
  check(ok, what);
  if (!ok) printf("  got:  %s\n  want: %s\n", rc ? err : "(saved)", want);
}

/* Saves into dir/ro, makes dir/ro read-only, checks that a second save
 * fails naming fopen and leaves the first file byte-identical. */
static void unwritable_case(const DuetStTensor *small, const DuetStTensor *large, int own_dir) {
  const char *ro = in_dir("ro");
  if (own_dir) check(mkdir(ro, 0700) == 0, "atomic: mkdir ro");
  char p[1024], err[1024], want[4096];
  snprintf(p, sizeof p, "%s/model.safetensors", ro);
  check(duet_st_save(p, small, 1, NULL, 0, err, sizeof err) == 0, "atomic: save into ro/ while writable");
  size_t on;
  unsigned char *old = read_bytes(p, &on);
  check(old && chmod(ro, 0555) == 0, "atomic: chmod ro/ 0555");
  snprintf(want, sizeof want, "cannot save %s: open(%s.tmp.%ld.*): Permission denied", p, p, (long)getpid());
  expect_save_error("atomic: unwritable directory", p, large, 1, want);
  check(old && same_file(p, old, on), "atomic: old file intact in unwritable directory");
  check(chmod(ro, 0700) == 0, "atomic: chmod ro/ back");
  free(old);
  if (own_dir) {
    remove(p);
    rmdir(ro);
  }
}

static void test_atomic(void) {
  static float big[16384]; /* 64 KiB */
  for (int i = 0; i < 16384; i++) big[i] = (float)i;
  float one = 1;
  DuetStTensor small = mk("w", DUET_F32, 1, (int64_t[]){1}, &one, 4);
  DuetStTensor large = mk("w", DUET_F32, 1, (int64_t[]){16384}, big, sizeof big);
  char p[768], err[1024] = "", want[4096], tmp[1024];
  snprintf(p, sizeof p, "%s", in_dir("model.safetensors"));
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.*", p, (long)getpid());
  check(duet_st_save(p, &small, 1, NULL, 0, err, sizeof err) == 0, "atomic: first save");
  size_t on;
  unsigned char *old = read_bytes(p, &on);
  check(old != NULL, "atomic: read the old file");
  if (!old) return;

  /* overwrite succeeds and leaves no temp */
  check(duet_st_save(p, &large, 1, NULL, 0, err, sizeof err) == 0, "atomic: overwrite");
  DuetStFile *f = duet_st_open(p, err, sizeof err);
  check(f && duet_st_find(f, "w") && duet_st_find(f, "w")->nbytes == (int64_t)sizeof big, "atomic: overwrite read");
  duet_st_close(f);
  check(duet_st_save(p, &small, 1, NULL, 0, err, sizeof err) == 0 && same_file(p, old, on),
        "atomic: overwrite back");

  /* a stale temp of an earlier process with this pid (a run killed while
   * saving, in a container whose PIDs repeat) does not block the save: the
   * temp name is new for every attempt; the stale file is left alone (it is
   * not older than DUET_ST_STALE_SECONDS) */
  char stale[1024], stale_dir[1024];
  snprintf(stale, sizeof stale, "%s.tmp.%ld", p, (long)getpid());
  snprintf(stale_dir, sizeof stale_dir, "%s.tmp.%ld.0123456789abcdef", p, (long)getpid());
  check(write_bytes(stale, "partial", 7) == 0 && mkdir(stale_dir, 0700) == 0, "atomic: make stale temps");
  check(duet_st_save(p, &large, 1, NULL, 0, err, sizeof err) == 0, "atomic: a stale temp of this pid does not block");
  f = duet_st_open(p, err, sizeof err);
  check(f && duet_st_find(f, "w") && duet_st_find(f, "w")->nbytes == (int64_t)sizeof big, "atomic: saved past the stale temp");
  duet_st_close(f);
  check(same_file(stale, (const unsigned char *)"partial", 7), "atomic: the stale temp was left alone");
  check(remove(stale) == 0 && rmdir(stale_dir) == 0, "atomic: remove the stale temps");
  check(duet_st_save(p, &small, 1, NULL, 0, err, sizeof err) == 0 && same_file(p, old, on), "atomic: back to small");

  /* a directory that becomes unwritable (root writes anyway: as root the
   * case runs in a child process under uid/gid 65534) */
  fflush(stdout);
  if (geteuid() != 0) {
    unwritable_case(&small, &large, 1);
  } else {
    pid_t pid = fork();
    if (pid == 0) {
      int ok = chmod(dir, 0711) == 0 && mkdir(in_dir("ro"), 0700) == 0 && chown(in_dir("ro"), 65534, 65534) == 0 &&
               setgid(65534) == 0 && setuid(65534) == 0;
      if (!ok) {
        printf("FAIL: atomic: cannot become uid 65534: %s\n", strerror(errno));
        _exit(1);
      }
      n_fail = 0;
      unwritable_case(&small, &large, 0);
      fflush(stdout);
      _exit(n_fail ? 1 : 0);
    }
    int st = 0;
    check(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "atomic: unwritable directory (as uid 65534)");
    chmod(in_dir("ro"), 0700);
    remove(in_dir("ro/model.safetensors"));
    rmdir(in_dir("ro"));
    chmod(dir, 0700);
  }

  /* writing fails midway: the file size limit (EFBIG) */
  struct rlimit rl, lim;
  if (getrlimit(RLIMIT_FSIZE, &rl) == 0) {
    lim = rl;
    lim.rlim_cur = 4096;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
      snprintf(want, sizeof want, "cannot save %s: fwrite(%s): File too large", p, tmp);
      expect_save_error("atomic: write fails (EFBIG)", p, &large, 1, want);
      check(setrlimit(RLIMIT_FSIZE, &rl) == 0, "atomic: restore the size limit");
      check(same_file(p, old, on), "atomic: old file intact after failed write");
      check(count_temps() == 0, "atomic: temp removed after failed write");
    } else {
      check(0, "atomic: setrlimit");
    }
    signal(SIGXFSZ, old_handler);
  }

  /* only a regular file is replaced: a directory, a FIFO, a symbolic link
   * (to a regular file) at the path are refused before anything is written
   * and left as they were */
  const char *dp = in_dir("adir");
  check(mkdir(dp, 0700) == 0 && write_bytes(in_dir("adir/keep"), "x", 1) == 0, "atomic: make a directory target");
  snprintf(want, sizeof want, "cannot save %s: it exists and is a directory, not a regular file; not replacing it", dp);
  expect_save_error("atomic: directory target refused", dp, &small, 1, want);
  check(same_file(in_dir("adir/keep"), (const unsigned char *)"x", 1), "atomic: directory target untouched");
  remove(in_dir("adir/keep"));
  rmdir(dp);
  const char *fifo = in_dir("fifo");
  check(mkfifo(fifo, 0600) == 0, "atomic: mkfifo");
  snprintf(want, sizeof want, "cannot save %s: it exists and is a FIFO, not a regular file; not replacing it", fifo);
  expect_save_error("atomic: FIFO target refused", fifo, &small, 1, want);
  struct stat sb;
  check(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode), "atomic: the FIFO is still a FIFO");
  check(!strcmp(duet_st_target_kind(fifo), "a FIFO") && duet_st_target_kind(p) == NULL &&
            duet_st_target_kind(in_dir("absent")) == NULL && !strcmp(duet_st_target_kind("/dev/null"), "a character device"),
        "duet_st_target_kind: FIFO, regular file, absent, /dev/null");
  remove(fifo);
  const char *link = in_dir("link.safetensors");
  check(symlink(p, link) == 0, "atomic: symlink to the old file");
  snprintf(want, sizeof want, "cannot save %s: it exists and is a symbolic link, not a regular file; not replacing it",
           link);
  expect_save_error("atomic: symbolic link target refused", link, &large, 1, want);
  check(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode) && same_file(p, old, on), "atomic: the link and its file untouched");
  remove(link);
  check(count_temps() == 0, "atomic: no temp after refused targets");

  /* the rename fails: in a sticky directory, a file of another user cannot
   * be replaced (root can: as root the case runs as uid 65534) */
  if (geteuid() == 0) {
    const char *sd = in_dir("sticky");
    char sp[1024];
    snprintf(sp, sizeof sp, "%s/theirs.safetensors", sd);
    check(chmod(dir, 0711) == 0 && mkdir(sd, 0700) == 0 && chmod(sd, 01777) == 0 &&
              write_bytes(sp, "x", 1) == 0, "atomic: sticky directory with a file of root");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
      char e2[1024] = "", w2[4096];
      int rc = duet_st_save(sp, &small, 1, NULL, 0, e2, sizeof e2);
      snprintf(w2, sizeof w2, "cannot save %s: rename(%s.tmp.%ld.*, %s): Operation not permitted", sp, sp,
               (long)getpid(), sp);
      if (rc != -1 || fnmatch(w2, e2, 0)) printf("  got:  %s\n  want: %s\n", e2, w2);
      fflush(stdout);
      _exit(rc == -1 && !fnmatch(w2, e2, 0) ? 0 : 1);
    }
    int st = 0;
    check(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "atomic: rename fails (uid 65534, sticky directory)");
    DIR *dd = opendir(sd);
    int n_left = 0;
    struct dirent *e;
    while (dd && (e = readdir(dd))) n_left += e->d_name[0] != '.';
    if (dd) closedir(dd);
    check(n_left == 1 && same_file(sp, (const unsigned char *)"x", 1), "atomic: temp removed after failed rename");
    remove(sp);
    rmdir(sd);
    chmod(dir, 0700);
  } else {
    printf("note: the failed-rename case needs root (a file of another user in a sticky directory); not run\n");
  }

  /* bad arguments write nothing */
  DuetStTensor two[2] = {small, small};
  snprintf(want, sizeof want, "cannot save %s: duplicate tensor name \"w\"", p);
  expect_save_error("save: duplicate name", p, two, 2, want);
  DuetStTensor wrong = small;
  wrong.nbytes = 8;
  snprintf(want, sizeof want, "cannot save %s: tensor \"w\": nbytes 8 does not match its shape (4 bytes)", p);
  expect_save_error("save: nbytes mismatch", p, &wrong, 1, want);
  wrong = small;
  wrong.dtype = DUET_VOID;
  snprintf(want, sizeof want, "cannot save %s: tensor \"w\": unsupported dtype 0", p);
  expect_save_error("save: bad dtype", p, &wrong, 1, want);
  wrong = small;
  wrong.name = "__metadata__";
  snprintf(want, sizeof want, "cannot save %s: tensor 0 has the reserved name", p);
  expect_save_error("save: reserved name", p, &wrong, 1, want);
  const char *missing = in_dir("no/such/dir/x.safetensors");
  snprintf(want, sizeof want, "cannot save %s: open(%s.tmp.%ld.*): No such file or directory", missing, missing,
           (long)getpid());
  expect_save_error("save: missing directory", missing, &small, 1, want);
  check(same_file(p, old, on), "save: old file intact after argument errors");
  check(count_temps() == 0, "save: no temp files after argument errors");
  free(old);
}

/* -------------------------------------------------------- stale temps */

/* Creates dir/name as a regular file (or, kind 'd', a directory; 'l', a
 * symbolic link to dir/target.safetensors) last modified age seconds ago. */
static void make_aged(const char *name, int kind, long age) {
  const char *p = in_dir(name);
  int ok = kind == 'd' ? mkdir(p, 0700) == 0
           : kind == 'l' ? symlink(in_dir("target.safetensors"), p) == 0
                         : write_bytes(p, "partial", 7) == 0;
  struct timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= age;
  t[1] = t[0];
  ok = ok && utimensat(AT_FDCWD, p, t, AT_SYMLINK_NOFOLLOW) == 0;
  if (!ok) printf("FAIL: make %s: %s\n", p, strerror(errno));
  n_fail += !ok;
}

static int exists(const char *name) {
  struct stat sb;
  return lstat(in_dir(name), &sb) == 0;
}

/* duet_st_remove_stale_temps removes exactly the temps of this target that
 * are regular files of this user, old enough, whose process is gone (or is
 * this one), in both name forms; nothing else. */
static void test_stale_temps(void) {
  const long old = DUET_ST_STALE_SECONDS + 60, fresh = 10;
  pid_t dead = fork(); /* a process that has exited: its pid names no process (until reused) */
  if (dead == 0) _exit(0);
  check(dead > 0 && waitpid(dead, NULL, 0) == dead, "stale: a dead pid");
  long me = (long)getpid(), live = (long)getppid();
  char n[40][128];
  int k = 0;
  const char *H = "0123456789abcdef";
  check(write_bytes(in_dir("target.safetensors"), "x", 1) == 0, "stale: target");
  /* removed */
  snprintf(n[k++], 128, "target.safetensors.tmp.%ld.%s", (long)dead, H);
  snprintf(n[k++], 128, "target.safetensors.tmp.%ld", (long)dead); /* the name before unique names */
  snprintf(n[k++], 128, "target.safetensors.tmp.%ld.fedcba9876543210", me);
  int n_removed = k;
  for (int i = 0; i < k; i++) make_aged(n[i], 'f', old);
  /* kept */
  int kept_from = k;
  snprintf(n[k], 128, "target.safetensors.tmp.%ld.%s", (long)dead, "00000000000000aa"), make_aged(n[k++], 'f', fresh);
  snprintf(n[k], 128, "target.safetensors.tmp.%ld.%s", live, H), make_aged(n[k++], 'f', old); /* its writer lives */
  snprintf(n[k], 128, "target.safetensors.tmp.%ld.%s", (long)dead, "0123456789ABCDEF"), make_aged(n[k++], 'f', old);
  snprintf(n[k], 128, "target.safetensors.tmp.%ld.%s0", (long)dead, H), make_aged(n[k++], 'f', old);
  snprintf(n[k], 128, "target.safetensors.tmp.%ld.%.15s", (long)dead, H), make_aged(n[k++], 'f', old);
  snprintf(n[k], 128, "target.safetensors.tmp.0%ld", (long)dead), make_aged(n[k++], 'f', old);
  snprintf(n[k], 128, "target.safetensors.tmp.%ld.x", (long)dead), make_aged(n[k++], 'f', old);
  snprintf(n[k], 128, "other.safetensors.tmp.%ld.%s", (long)dead, H), make_aged(n[k++], 'f', old);
  snprintf(n[k], 128, "xtarget.safetensors.tmp.%ld", (long)dead), make_aged(n[k++], 'f', old);
  snprintf(n[k], 128, "target.safetensors.tmp.%ld.%s", (long)dead, "1111111111111111"), make_aged(n[k++], 'd', old);
  snprintf(n[k], 128, "target.safetensors.tmp.%ld.%s", (long)dead, "2222222222222222"), make_aged(n[k++], 'l', old);
  if (geteuid() == 0) { /* a file of another user */
    snprintf(n[k], 128, "target.safetensors.tmp.%ld.%s", (long)dead, "3333333333333333"), make_aged(n[k], 'f', old);
    check(chown(in_dir(n[k++]), 65534, 65534) == 0, "stale: chown");
  }
  char first[1024];
  int got = duet_st_remove_stale_temps(in_dir("target.safetensors"), DUET_ST_STALE_SECONDS, first, sizeof first);
  check(got == n_removed, "stale: the three stale temps removed");
  if (got != n_removed) printf("  removed %d, want %d\n", got, n_removed);
  int ok = 1;
  for (int i = 0; i < k; i++)
    if (exists(n[i]) != (i >= kept_from)) {
      printf("  %s: %s, want %s\n", n[i], exists(n[i]) ? "kept" : "removed", i >= kept_from ? "kept" : "removed");
      ok = 0;
    }
  check(ok, "stale: exactly the stale temps of this target removed");
  int first_ok = 0;
  for (int i = 0; i < n_removed; i++) first_ok |= !strcmp(first, in_dir(n[i]));
  check(first_ok, "stale: the first removed is named");
  check(exists("target.safetensors") && same_file(in_dir("target.safetensors"), (const unsigned char *)"x", 1),
        "stale: the target and the link's target untouched");
  check(duet_st_remove_stale_temps(in_dir("target.safetensors"), DUET_ST_STALE_SECONDS, first, sizeof first) == 0 &&
            first[0] == 0,
        "stale: a second pass removes nothing");
  /* a younger bound removes the fresh one too */
  check(duet_st_remove_stale_temps(in_dir("target.safetensors"), 0, first, sizeof first) == 1 && !exists(n[kept_from]),
        "stale: min_age 0 removes the fresh temp of a dead pid");
  for (int i = kept_from; i < k; i++) {
    const char *p = in_dir(n[i]);
    if (exists(n[i]) && remove(p) != 0) printf("cleanup: %s: %s\n", p, strerror(errno));
  }
  remove(in_dir("target.safetensors"));
}

/* ------------------------------------------- the committed PyTorch fixture */

/* tests/ref/gpt_tiny.safetensors (written by tests/ref/gpt_ref.py): every
 * tensor the parity test needs is there, with duet's names and shapes. */
static void test_fixture(void) {
  static const struct {
    const char *name;
    int rank;
    int64_t shape[2];
  } params[] = {
      {"wte", 2, {256, 32}}, {"wpe", 2, {16, 32}},
      {"layer1.ln1.w", 1, {32}}, {"layer1.ln1.b", 1, {32}},
      {"layer1.linear1.w", 2, {32, 32}}, {"layer1.linear1.b", 1, {32}},
      {"layer1.linear2.w", 2, {32, 32}}, {"layer1.linear2.b", 1, {32}},
      {"layer1.linear3.w", 2, {32, 32}}, {"layer1.linear3.b", 1, {32}},
      {"layer1.linear4.w", 2, {32, 32}}, {"layer1.linear4.b", 1, {32}},
      {"layer1.ln2.w", 1, {32}}, {"layer1.ln2.b", 1, {32}},
      {"layer1.linear5.w", 2, {32, 128}}, {"layer1.linear5.b", 1, {128}},
      {"layer1.linear6.w", 2, {128, 32}}, {"layer1.linear6.b", 1, {32}},
      {"layer2.ln1.w", 1, {32}}, {"layer2.ln1.b", 1, {32}},
      {"layer2.linear1.w", 2, {32, 32}}, {"layer2.linear1.b", 1, {32}},
      {"layer2.linear2.w", 2, {32, 32}}, {"layer2.linear2.b", 1, {32}},
      {"layer2.linear3.w", 2, {32, 32}}, {"layer2.linear3.b", 1, {32}},
      {"layer2.linear4.w", 2, {32, 32}}, {"layer2.linear4.b", 1, {32}},
      {"layer2.ln2.w", 1, {32}}, {"layer2.ln2.b", 1, {32}},
      {"layer2.linear5.w", 2, {32, 128}}, {"layer2.linear5.b", 1, {128}},
      {"layer2.linear6.w", 2, {128, 32}}, {"layer2.linear6.b", 1, {32}},
      {"ln1.w", 1, {32}}, {"ln1.b", 1, {32}},
  };
  const int np = (int)(sizeof params / sizeof params[0]);
  char path[1024], err[1024];
  snprintf(path, sizeof path, "%s/tests/ref/gpt_tiny.safetensors", DUET_SOURCE_DIR);
  DuetStFile *f = duet_st_open(path, err, sizeof err);
  check(f != NULL, "fixture: open tests/ref/gpt_tiny.safetensors");
  if (!f) {
    printf("  %s\n", err);
    return;
  }
  check(duet_st_count(f) == 2 * np + 5, "fixture: 2 x 36 params + idx, targets, logits, loss, losses");
  int ok = 1;
  for (int i = 0; i < np; i++) {
    char gname[64];
    snprintf(gname, sizeof gname, "grad.%s", params[i].name);
    const DuetStTensor *w = duet_st_find(f, params[i].name), *g = duet_st_find(f, gname);
    for (int k = 0; k < 2; k++) {
      const DuetStTensor *x = k ? g : w;
      int good = x && x->dtype == DUET_F32 && x->rank == params[i].rank && x->shape[0] == params[i].shape[0] &&
                 (x->rank == 1 || x->shape[1] == params[i].shape[1]);
      if (!good) printf("  fixture: %s missing or misshapen\n", k ? gname : params[i].name);
      ok &= good;
    }
  }
  check(ok, "fixture: every param and grad.param, F32, duet's shapes");
  /* layer norm weights start at 1, biases at 0 */
  const DuetStTensor *lw = duet_st_find(f, "layer1.ln2.w"), *lb = duet_st_find(f, "ln1.b");
  check(lw && lb && ((const float *)lw->data)[5] == 1.0f && ((const float *)lb->data)[7] == 0.0f,
        "fixture: layernorm initialised to 1, 0");

  const DuetStTensor *idx = duet_st_find(f, "idx"), *tg = duet_st_find(f, "targets");
  ok = idx && tg && idx->dtype == DUET_I32 && tg->dtype == DUET_I32 && idx->rank == 2 && idx->shape[0] == 4 &&
       idx->shape[1] == 16 && tg->rank == 2 && tg->shape[0] == 4 && tg->shape[1] == 16;
  check(ok, "fixture: idx, targets I32 [4,16]");
  if (ok) {
    const int32_t *a = idx->data, *b = tg->data;
    int shifted = 1, bytes = 1;
    char row0[17];
    for (int i = 0; i < 64; i++) {
      bytes &= a[i] >= 0 && a[i] < 256 && b[i] >= 0 && b[i] < 256;
      if (i % 16 != 15) shifted &= b[i] == a[i + 1];
    }
    for (int i = 0; i < 16; i++) row0[i] = (char)a[i];
    row0[16] = 0;
    check(bytes && shifted, "fixture: targets are idx shifted by one, all bytes");
    check(!strcmp(row0, "In the beginning"), "fixture: the first window is Genesis 1:1");
  }
  const DuetStTensor *lg = duet_st_find(f, "logits"), *loss = duet_st_find(f, "loss"),
                     *losses = duet_st_find(f, "losses");
  check(lg && lg->dtype == DUET_F32 && lg->rank == 3 && lg->shape[0] == 4 && lg->shape[1] == 16 &&
            lg->shape[2] == 256,
        "fixture: logits F32 [4,16,256]");
  check(loss && loss->dtype == DUET_F32 && loss->rank == 0 && losses && losses->dtype == DUET_F32 &&
            losses->rank == 1 && losses->shape[0] == 10 &&
            ((const float *)losses->data)[0] == *(const float *)loss->data,
        "fixture: loss scalar, losses [10] starting at loss");
  if (loss) {
    float l = *(const float *)loss->data; /* about ln(256) = 5.545 at init */
    check(l > 5.4f && l < 5.7f, "fixture: initial loss near ln(256)");
  }
  const char *tv = duet_st_meta(f, "torch_version"), *cfg = duet_st_meta(f, "config");
  check(tv && !strncmp(tv, "1.13", 4), "fixture: torch_version metadata");
  cJSON *c = cfg ? cJSON_Parse(cfg) : NULL;
  const cJSON *nl = cJSON_GetObjectItemCaseSensitive(c, "n_layer"), *ne = cJSON_GetObjectItemCaseSensitive(c, "n_embd");
  check(cJSON_IsNumber(nl) && nl->valueint == 2 && cJSON_IsNumber(ne) && ne->valueint == 32,
        "fixture: config metadata is JSON with n_layer 2, n_embd 32");
  cJSON_Delete(c);
  duet_st_close(f);
}

/* Removes the files of dir (one level of subdirectories) and dir. */
static void cleanup(void) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      const char *p = in_dir(e->d_name);
      if (remove(p) != 0) printf("cleanup: cannot remove %s: %s\n", p, strerror(errno));
    }
  closedir(d);
  if (rmdir(dir) != 0) printf("cleanup: cannot remove %s: %s\n", dir, strerror(errno));
}

int main(void) {
  const char *tmpdir = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/duet_st_XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
  if (!mkdtemp(dir)) {
    printf("cannot create a directory under %s: %s\n0 passed, 1 failed\n", tmpdir ? tmpdir : "/tmp", strerror(errno));
    return 1;
  }
  test_round_trip();
  test_exact_bytes();
  test_reference_layout();
  test_corrupt();
  test_atomic();
  test_stale_temps();
  test_fixture();
  cleanup();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
