/* tests/test_npy.c: the .npy header parser (runtime/npy.c) on well-formed
 * headers of each version and dtype, as numpy.save writes them, and on
 * malformed ones, each with its exact message; then files: the data-length
 * check, the per-sample shape and dtype match with an input tensor, and
 * loading with conversion (u8 -> f32 values, i64 -> i32 with a range
 * check).  Files go to a fresh directory under $TMPDIR (default /tmp). */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/duet_rt.h"

static int n_pass, n_fail;

static void check(int ok, const char *what) {
  if (ok) {
    n_pass++;
  } else {
    n_fail++;
    printf("FAIL: %s\n", what);
  }
}

/* A .npy preamble + header of version major.0 around dict (padded with
 * spaces and '\n' to a multiple of 64 bytes, as numpy does) into buf;
 * returns its length.  hlen_override >= 0 replaces the declared length. */
static size_t make(unsigned char *buf, int major, const char *dict, long hlen_override) {
  size_t pre = major == 1 ? 10 : 12, d = strlen(dict);
  size_t total = (pre + d + 1 + 63) / 64 * 64, hlen = total - pre;
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)major;
  buf[7] = 0;
  size_t h = hlen_override >= 0 ? (size_t)hlen_override : hlen;
  buf[8] = (unsigned char)h;
  buf[9] = (unsigned char)(h >> 8);
  if (major != 1) {
    buf[10] = (unsigned char)(h >> 16);
    buf[11] = (unsigned char)(h >> 24);
  }
  memcpy(buf + pre, dict, d);
  memset(buf + pre + d, ' ', hlen - d - 1);
  buf[total - 1] = '\n';
  return total;
}

/* Parses buf[0..len) and compares the message (NULL: expect success). */
static void expect(const unsigned char *buf, size_t len, const char *want, const char *what) {
  DuetNpyInfo info;
  char err[512] = "";
  int rc = duet_npy_parse_header(buf, len, &info, err, sizeof err);
  char msg[1024];
  if (!want) {
    snprintf(msg, sizeof msg, "%s: parses (got: %s)", what, err);
    check(rc == 0, msg);
  } else {
    snprintf(msg, sizeof msg, "%s: want \"%s\", got rc %d \"%s\"", what, want, rc, err);
    check(rc == -1 && !strcmp(err, want), msg);
  }
}

static void bad(const char *dict, const char *want) {
  unsigned char buf[4096];
  size_t n = make(buf, 1, dict, -1);
  expect(buf, n, want, dict);
}

static char dir[512];

static void write_file(const char *name, const unsigned char *b, size_t n, char *path) {
  snprintf(path, 600, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(b, 1, n, f) != n || fclose(f)) {
    printf("FAIL: cannot write %s\n", path);
    exit(1);
  }
}

int main(void) {
  unsigned char buf[4096];
  DuetNpyInfo info;
  char err[512];

  /* well-formed: numpy 1.24's exact dict text, each version and dtype */
  size_t n = make(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (60000, 28, 28), }", -1);
  check(duet_npy_parse_header(buf, n, &info, err, sizeof err) == 0 && info.dtype == DUET_NPY_F4 && info.rank == 3 &&
            info.shape[0] == 60000 && info.shape[2] == 28 && info.data_offset == 128 &&
            info.data_bytes == 60000LL * 784 * 4,
        "v1 f4 (60000, 28, 28)");
  n = make(buf, 2, "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }", -1);
  check(duet_npy_parse_header(buf, n, &info, err, sizeof err) == 0 && info.dtype == DUET_NPY_I8 && info.rank == 1 &&
            info.shape[0] == 5 && info.data_offset == 128 && info.data_bytes == 40,
        "v2 i8 (5,)");
  n = make(buf, 3, "{\"descr\": \"|u1\", \"shape\": (3,4), \"fortran_order\": False}", -1);
  check(duet_npy_parse_header(buf, n, &info, err, sizeof err) == 0 && info.dtype == DUET_NPY_U1 && info.rank == 2 &&
            info.data_bytes == 12,
        "v3 u1, double quotes, other key order, no trailing comma");
  n = make(buf, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (0, 7), }", -1);
  check(duet_npy_parse_header(buf, n, &info, err, sizeof err) == 0 && info.data_bytes == 0 && info.shape[0] == 0,
        "empty array (0, 7)");
  char sh[64];
  info.rank = 2, info.shape[0] = 9, info.shape[1] = 784;
  check(!strcmp(duet_npy_shape_str(&info, 0, sh, sizeof sh), "(9, 784)") &&
            !strcmp(duet_npy_shape_str(&info, 1, sh, sizeof sh), "(784,)") &&
            !strcmp(duet_npy_shape_str(&info, 2, sh, sizeof sh), "()"),
        "shape strings");

  /* malformed preambles */
  n = make(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", -1);
  buf[0] = 'x';
  expect(buf, n, "not a NumPy .npy file (it does not start with \\x93NUMPY)", "bad magic");
  expect((const unsigned char *)"\x93NUM", 4, "not a NumPy .npy file (it does not start with \\x93NUMPY)",
         "4 bytes");
  expect((const unsigned char *)"\x93NUMPY\x01", 7, "truncated .npy header: the file ends after 7 bytes",
         "no minor version");
  n = make(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", -1);
  expect(buf, 9, "truncated .npy header: the file ends after 9 bytes", "no header length");
  buf[6] = 4;
  expect(buf, n, "unsupported .npy format version 4.0 (duet reads 1.0, 2.0 and 3.0)", "version 4.0");
  buf[6] = 1, buf[7] = 1;
  expect(buf, n, "unsupported .npy format version 1.1 (duet reads 1.0, 2.0 and 3.0)", "version 1.1");
  n = make(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", -1);
  expect(buf, n - 10, "truncated .npy header: 118 bytes declared, the file ends after 108", "header cut short");
  n = make(buf, 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 0x7fffffff);
  expect(buf, n, "implausible .npy header length 2147483647 bytes (the limit is 1048576)", "huge header length");

  /* malformed dicts */
  bad("'descr': '<f4'", "the .npy header is not a dict literal (no '{')");
  bad("{descr: '<f4'}", "the .npy header is not a dict literal (expected a quoted key)");
  bad("{'descr' '<f4'}", "the .npy header is not a dict literal (expected ':' after 'descr')");
  bad("{'descr': '<f4' 'shape': (2,)}", "the .npy header is not a dict literal (expected ',' or '}')");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "the .npy header is not a dict literal (expected ',' or '}')");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", "the .npy header has text after its dict");
  bad("{'descr': '<f4', 'fortran_order': False}", "the .npy header has no 'shape'");
  bad("{'fortran_order': False, 'shape': (2,)}", "the .npy header has no 'descr'");
  bad("{'descr': '<f4', 'shape': (2,)}", "the .npy header has no 'fortran_order'");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}",
      "the .npy header has an unknown key 'extra'");
  bad("{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}",
      "unsupported .npy dtype '>f4' (duet reads '<f4', '<i4', '<i8' and '|u1')");
  bad("{'descr': '<f8', 'fortran_order': False, 'shape': (2,)}",
      "unsupported .npy dtype '<f8' (duet reads '<f4', '<i4', '<i8' and '|u1')");
  bad("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}",
      "the .npy header's 'descr' is not a string (structured dtypes are not supported)");
  bad("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}",
      "the array is in Fortran order; duet reads C order only (save np.ascontiguousarray(a))");
  bad("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "the .npy header's 'fortran_order' is not True or False");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "the .npy header's 'shape' is not a tuple");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1)}",
      "the .npy header's 'shape' is not a tuple of integers");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", "the .npy header's 'shape' is not a tuple of integers");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': ()}",
      "the .npy array is a scalar (0 axes); the first axis must count the samples");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1)}", "the .npy array has more than 8 axes");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
      "the .npy header's 'shape' has a dimension out of range");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}",
      "the .npy header's shape is too large");

  /* files */
  snprintf(dir, sizeof dir, "%s/duet_npy_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) {
    printf("FAIL: mkdtemp\n");
    return 1;
  }
  char p1[600], p2[600], p3[600], p4[600];
  n = make(buf, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 2), }", -1);
  const unsigned char u8[6] = {0, 1, 2, 128, 254, 255};
  memcpy(buf + n, u8, 6);
  write_file("u8.npy", buf, n + 6, p1);
  write_file("u8_short.npy", buf, n + 5, p2);
  buf[n + 6] = 7;
  write_file("u8_long.npy", buf, n + 7, p3);
  check(duet_npy_check(p1, &info, err, sizeof err) == 0 && info.shape[0] == 3, "u8.npy checks");
  char want[1200];
  snprintf(want, sizeof want, "%s: shape (3, 2) of '|u1' needs 6 bytes of data, the file has 5 (truncated)", p2);
  check(duet_npy_check(p2, &info, err, sizeof err) == -1 && !strcmp(err, want), "truncated data");
  snprintf(want, sizeof want, "%s: shape (3, 2) of '|u1' needs 6 bytes of data, the file has 7 (extra bytes after the array)", p3);
  check(duet_npy_check(p3, &info, err, sizeof err) == -1 && !strcmp(err, want), "extra data");
  snprintf(want, sizeof want, "%s/missing.npy", dir);
  check(duet_npy_check(want, &info, err, sizeof err) == -1 && strstr(err, "cannot open ") && strstr(err, "No such file"),
        "missing file");
  write_file("empty.npy", buf, 0, p4);
  snprintf(want, sizeof want, "%s: not a NumPy .npy file (it does not start with \\x93NUMPY)", p4);
  check(duet_npy_check(p4, &info, err, sizeof err) == -1 && !strcmp(err, want), "empty file");

  DuetTensor tf = {.name = "x", .dtype = DUET_F32, .rank = 2, .shape = {4, 2}};
  DuetTensor tf3 = {.name = "x", .dtype = DUET_F32, .rank = 3, .shape = {4, 1, 2}};
  DuetTensor ti = {.name = "y", .dtype = DUET_I32, .rank = 1, .shape = {4}};
  DuetTensor td = {.name = "x", .dtype = DUET_F64, .rank = 2, .shape = {4, 2}};
  int64_t ns;
  void *data;
  check(duet_npy_load(p1, &tf, "x", &ns, &data, err, sizeof err) == 0 && ns == 3 && ((float *)data)[3] == 128.0f &&
            ((float *)data)[5] == 255.0f,
        "u8 -> f32 keeps the values");
  free(data);
  snprintf(want, sizeof want, "%s holds samples of shape (2,); input `x` takes samples of shape (1, 2)", p1);
  check(duet_npy_load(p1, &tf3, "x", &ns, &data, err, sizeof err) == -1 && !strcmp(err, want) && !data,
        "per-sample shape mismatch");
  snprintf(want, sizeof want, "%s holds samples of shape (2,); input `y` takes samples of shape ()", p1);
  check(duet_npy_load(p1, &ti, "y", &ns, &data, err, sizeof err) == -1 && !strcmp(err, want), "labels of rank 2");
  snprintf(want, sizeof want, "%s holds '|u1'; input `x` is f64 (it takes no .npy dtype: npy data feeds f32 and i32 inputs)", p1);
  check(duet_npy_load(p1, &td, "x", &ns, &data, err, sizeof err) == -1 && !strcmp(err, want), "f64 input");

  n = make(buf, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", -1);
  int64_t i8[3] = {7, -3, 9};
  memcpy(buf + n, i8, sizeof i8); /* this machine is little-endian (x86-64, arm64) */
  write_file("i8.npy", buf, n + sizeof i8, p1);
  check(duet_npy_load(p1, &ti, "y", &ns, &data, err, sizeof err) == 0 && ns == 3 && ((int32_t *)data)[1] == -3 &&
            ((int32_t *)data)[2] == 9,
        "i64 -> i32");
  free(data);
  snprintf(want, sizeof want, "%s holds '<i8'; input `x` is f32 (it takes '<f4' or '|u1')", p1);
  DuetTensor tf1 = {.name = "x", .dtype = DUET_F32, .rank = 1, .shape = {4}};
  check(duet_npy_load(p1, &tf1, "x", &ns, &data, err, sizeof err) == -1 && !strcmp(err, want), "i64 into f32");
  i8[2] = (int64_t)1 << 40;
  memcpy(buf + n, i8, sizeof i8);
  write_file("i8_big.npy", buf, n + sizeof i8, p2);
  snprintf(want, sizeof want, "%s: value 1099511627776 at element 2 does not fit in i32", p2);
  check(duet_npy_load(p2, &ti, "y", &ns, &data, err, sizeof err) == -1 && !strcmp(err, want) && !data,
        "i64 out of i32 range");

  const char *names[] = {"u8.npy", "u8_short.npy", "u8_long.npy", "empty.npy", "i8.npy", "i8_big.npy"};
  for (int i = 0; i < 6; i++) {
    snprintf(want, sizeof want, "%s/%s", dir, names[i]);
    unlink(want);
  }
  rmdir(dir);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
