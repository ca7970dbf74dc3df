#define _POSIX_C_SOURCE 200809L
/* runtime/npy.c: NumPy .npy files, the format as documented in numpy's
 * numpy.lib.format module (NEP 1): the magic string "\x93NUMPY", a major
 * and a minor version byte, the header length (version 1.0: u16
 * little-endian; 2.0 and 3.0: u32), the header (an ASCII -- 3.0: UTF-8 --
 * Python dict literal with the keys 'descr', 'fortran_order' and 'shape',
 * padded with spaces and ended by '\n'), then the array's bytes.  duet reads
 * four dtypes ('<f4', '<i4', '<i8', '|u1'), C order only. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "duet_rt.h"

static const struct {
  const char *descr;
  int dtype, itemsize;
} npy_dtypes[] = {{"<f4", DUET_NPY_F4, 4}, {"<i4", DUET_NPY_I4, 4}, {"<i8", DUET_NPY_I8, 8}, {"|u1", DUET_NPY_U1, 1}};

const char *duet_npy_descr(int dtype) {
  for (size_t i = 0; i < sizeof npy_dtypes / sizeof *npy_dtypes; i++)
    if (npy_dtypes[i].dtype == dtype) return npy_dtypes[i].descr;
  return "?";
}

/* A cursor over the dict literal. */
typedef struct Lit {
  const char *p, *end;
} Lit;

static void lit_ws(Lit *l) {
  while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r')) l->p++;
}

static bool lit_eat(Lit *l, char c) {
  lit_ws(l);
  if (l->p < l->end && *l->p == c) {
    l->p++;
    return true;
  }
  return false;
}

/* A quoted string ('...' or "...", no escapes) into buf. */
static bool lit_string(Lit *l, char *buf, size_t n) {
  lit_ws(l);
  if (l->p >= l->end || (*l->p != '\'' && *l->p != '"')) return false;
  char q = *l->p++;
  const char *s = l->p;
  while (l->p < l->end && *l->p != q && *l->p != '\\') l->p++;
  if (l->p >= l->end || *l->p != q) return false;
  snprintf(buf, n, "%.*s", (int)(l->p - s), s);
  l->p++;
  return true;
}

static bool lit_word(Lit *l, const char *w) {
  lit_ws(l);
  size_t n = strlen(w);
  if ((size_t)(l->end - l->p) < n || strncmp(l->p, w, n)) return false;
  l->p += n;
  return true;
}

#define FAIL(...) (snprintf(err, errlen, __VA_ARGS__), -1)

int duet_npy_parse_header(const unsigned char *buf, size_t len, DuetNpyInfo *info, char *err, size_t errlen) {
  memset(info, 0, sizeof *info);
  if (len < 6 || memcmp(buf, "\x93NUMPY", 6))
    return FAIL("not a NumPy .npy file (it does not start with \\x93NUMPY)");
  if (len < 8) return FAIL("truncated .npy header: the file ends after %zu bytes", len);
  int major = buf[6], minor = buf[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    return FAIL("unsupported .npy format version %d.%d (duet reads 1.0, 2.0 and 3.0)", major, minor);
  size_t pre = major == 1 ? 10 : 12;
  if (len < pre) return FAIL("truncated .npy header: the file ends after %zu bytes", len);
  uint64_t hlen = major == 1 ? (uint64_t)buf[8] | (uint64_t)buf[9] << 8
                             : (uint64_t)buf[8] | (uint64_t)buf[9] << 8 | (uint64_t)buf[10] << 16 |
                                   (uint64_t)buf[11] << 24;
  if (hlen > DUET_NPY_MAX_HEADER)
    return FAIL("implausible .npy header length %" PRIu64 " bytes (the limit is %d)", hlen, DUET_NPY_MAX_HEADER);
  if (len < pre + hlen)
    return FAIL("truncated .npy header: %" PRIu64 " bytes declared, the file ends after %zu", hlen, len - pre);
  Lit l = {(const char *)buf + pre, (const char *)buf + pre + hlen};
  bool has_descr = false, has_order = false, has_shape = false;
  if (!lit_eat(&l, '{')) return FAIL("the .npy header is not a dict literal (no '{')");
  for (;;) {
    if (lit_eat(&l, '}')) break;
    char key[64];
    if (!lit_string(&l, key, sizeof key)) return FAIL("the .npy header is not a dict literal (expected a quoted key)");
    if (!lit_eat(&l, ':')) return FAIL("the .npy header is not a dict literal (expected ':' after '%s')", key);
    if (!strcmp(key, "descr")) {
      char d[64];
      if (!lit_string(&l, d, sizeof d))
        return FAIL("the .npy header's 'descr' is not a string (structured dtypes are not supported)");
      size_t i = 0;
      while (i < sizeof npy_dtypes / sizeof *npy_dtypes && strcmp(npy_dtypes[i].descr, d)) i++;
      if (i == sizeof npy_dtypes / sizeof *npy_dtypes)
        return FAIL("unsupported .npy dtype '%s' (duet reads '<f4', '<i4', '<i8' and '|u1')", d);
      info->dtype = npy_dtypes[i].dtype;
      info->itemsize = npy_dtypes[i].itemsize;
      has_descr = true;
    } else if (!strcmp(key, "fortran_order")) {
      if (lit_word(&l, "True"))
        return FAIL("the array is in Fortran order; duet reads C order only (save np.ascontiguousarray(a))");
      if (!lit_word(&l, "False")) return FAIL("the .npy header's 'fortran_order' is not True or False");
      has_order = true;
    } else if (!strcmp(key, "shape")) {
      if (!lit_eat(&l, '(')) return FAIL("the .npy header's 'shape' is not a tuple");
      info->rank = 0;
      while (!lit_eat(&l, ')')) {
        lit_ws(&l);
        if (l.p >= l.end || *l.p < '0' || *l.p > '9')
          return FAIL("the .npy header's 'shape' is not a tuple of integers");
        int64_t v = 0;
        while (l.p < l.end && *l.p >= '0' && *l.p <= '9') {
          if (v > (INT64_MAX - 9) / 10) return FAIL("the .npy header's 'shape' has a dimension out of range");
          v = v * 10 + (*l.p++ - '0');
        }
        if (l.p < l.end && *l.p == 'L') l.p++; /* Python 2's long suffix, as old numpy wrote it */
        if (info->rank == DUET_MAX_RANK) return FAIL("the .npy array has more than %d axes", DUET_MAX_RANK);
        info->shape[info->rank++] = v;
        if (!lit_eat(&l, ',')) {
          if (!lit_eat(&l, ')')) return FAIL("the .npy header's 'shape' is not a tuple of integers");
          break;
        }
      }
      has_shape = true;
    } else {
      return FAIL("the .npy header has an unknown key '%s'", key);
    }
    if (!lit_eat(&l, ',')) {
      if (!lit_eat(&l, '}')) return FAIL("the .npy header is not a dict literal (expected ',' or '}')");
      break;
    }
  }
  lit_ws(&l);
  if (l.p != l.end) return FAIL("the .npy header has text after its dict");
  if (!has_descr || !has_order || !has_shape)
    return FAIL("the .npy header has no '%s'", !has_descr ? "descr" : !has_order ? "fortran_order" : "shape");
  if (info->rank == 0) return FAIL("the .npy array is a scalar (0 axes); the first axis must count the samples");
  uint64_t bytes = (uint64_t)info->itemsize;
  for (int d = 0; d < info->rank; d++) {
    if (info->shape[d] && bytes > (UINT64_MAX >> 1) / (uint64_t)info->shape[d])
      return FAIL("the .npy header's shape is too large");
    bytes *= (uint64_t)info->shape[d];
  }
  info->data_offset = (int64_t)(pre + hlen);
  info->data_bytes = (int64_t)bytes;
  return 0;
}

char *duet_npy_shape_str(const DuetNpyInfo *info, int from, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "(");
  for (int d = from; d < info->rank && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d > from ? ", " : "", info->shape[d]);
  if (k < n) snprintf(buf + k, n - k, info->rank - from == 1 ? ",)" : ")");
  return buf;
}

int duet_npy_check(const char *path, DuetNpyInfo *info, char *err, size_t errlen) {
  int not_regular;
  FILE *f = duet_fopen_regular(path, &not_regular);
  if (!f) return not_regular ? FAIL("cannot read %s: not a regular file", path)
                             : FAIL("cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
    fclose(f);
    return FAIL("cannot read %s: not a regular file", path);
  }
  size_t want = 12 + DUET_NPY_MAX_HEADER, cap = (uint64_t)st.st_size < want ? (size_t)st.st_size : want;
  unsigned char *buf = malloc(cap ? cap : 1);
  if (!buf) {
    fclose(f);
    return FAIL("out of host memory reading %s", path);
  }
  size_t got = fread(buf, 1, cap, f);
  bool rerr = ferror(f);
  fclose(f);
  char msg[512];
  int rc = rerr ? -1 : duet_npy_parse_header(buf, got, info, msg, sizeof msg);
  free(buf);
  if (rerr) return FAIL("cannot read %s", path);
  if (rc) return FAIL("%s: %s", path, msg);
  uint64_t have = (uint64_t)st.st_size - (uint64_t)info->data_offset;
  if (have != (uint64_t)info->data_bytes) {
    char sh[200];
    return FAIL("%s: shape %s of '%s' needs %" PRId64 " bytes of data, the file has %" PRIu64 " (%s)", path,
                duet_npy_shape_str(info, 0, sh, sizeof sh), duet_npy_descr(info->dtype), info->data_bytes, have,
                have < (uint64_t)info->data_bytes ? "truncated" : "extra bytes after the array");
  }
  return 0;
}

static const char *rt_dtype_name(int dtype) {
  return dtype == DUET_F32 ? "f32" : dtype == DUET_I32 ? "i32" : dtype == DUET_F64 ? "f64" : "f16/bf16";
}

int duet_npy_match(const DuetNpyInfo *info, const char *path, const DuetTensor *t, const char *input, char *err,
                   size_t errlen) {
  char sh[200], want[200];
  size_t k = (size_t)snprintf(want, sizeof want, "(");
  for (int d = 1; d < t->rank && k < sizeof want; d++)
    k += (size_t)snprintf(want + k, sizeof want - k, "%s%" PRId64, d > 1 ? ", " : "", t->shape[d]);
  if (k < sizeof want) snprintf(want + k, sizeof want - k, t->rank == 2 ? ",)" : ")");
  bool same = info->rank == t->rank;
  for (int d = 1; same && d < t->rank; d++) same = info->shape[d] == t->shape[d];
  if (!same)
    return FAIL("%s holds samples of shape %s; input `%s` takes samples of shape %s", path,
                duet_npy_shape_str(info, 1, sh, sizeof sh), input, want);
  bool ok = t->dtype == DUET_F32 ? info->dtype == DUET_NPY_F4 || info->dtype == DUET_NPY_U1
          : t->dtype == DUET_I32 ? info->dtype != DUET_NPY_F4
                                 : false;
  if (!ok)
    return FAIL("%s holds '%s'; input `%s` is %s (it takes %s)", path, duet_npy_descr(info->dtype), input,
                rt_dtype_name(t->dtype),
                t->dtype == DUET_F32   ? "'<f4' or '|u1'"
                : t->dtype == DUET_I32 ? "'<i4', '<i8' or '|u1'"
                                       : "no .npy dtype: npy data feeds f32 and i32 inputs");
  return 0;
}

int duet_npy_load(const char *path, const DuetTensor *t, const char *input, int64_t *n, void **out, char *err,
                  size_t errlen) {
  *out = NULL;
  *n = 0;
  DuetNpyInfo info;
  if (duet_npy_check(path, &info, err, errlen) || duet_npy_match(&info, path, t, input, err, errlen)) return -1;
  size_t count = (size_t)(info.data_bytes / info.itemsize);
  FILE *f = fopen(path, "rb");
  if (!f) return FAIL("cannot open %s: %s", path, strerror(errno));
  unsigned char *raw = malloc(info.data_bytes ? (size_t)info.data_bytes : 1);
  void *dst = malloc(count ? count * 4 : 1); /* f32 or i32 */
  int rc = -1;
  if (!raw || !dst) {
    (void)FAIL("out of host memory loading %s", path);
    goto done;
  }
  if (fseek(f, (long)info.data_offset, SEEK_SET) ||
      fread(raw, 1, (size_t)info.data_bytes, f) != (size_t)info.data_bytes) {
    (void)FAIL("cannot read %s", path);
    goto done;
  }
  for (size_t i = 0; i < count; i++) {
    const unsigned char *b = raw + i * (size_t)info.itemsize;
    if (info.dtype == DUET_NPY_U1) {
      if (t->dtype == DUET_F32) ((float *)dst)[i] = (float)b[0];
      else ((int32_t *)dst)[i] = b[0];
    } else if (info.dtype == DUET_NPY_I8) {
      uint64_t u = 0;
      for (int j = 7; j >= 0; j--) u = u << 8 | b[j];
      int64_t v = (int64_t)u;
      if (v < INT32_MIN || v > INT32_MAX) {
        (void)FAIL("%s: value %" PRId64 " at element %zu does not fit in i32", path, v, i);
        goto done;
      }
      ((int32_t *)dst)[i] = (int32_t)v;
    } else { /* '<f4', '<i4': little-endian 4 bytes, copied as they are */
      uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
      memcpy((char *)dst + i * 4, &u, 4);
    }
  }
  *n = info.shape[0];
  *out = dst;
  dst = NULL;
  rc = 0;
done:
  fclose(f);
  free(raw);
  free(dst);
  return rc;
}
