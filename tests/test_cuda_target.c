/* tests/test_cuda_target.c: CUDA target selection (duet_cuda_pick_target)
 * and the kernel cache's blob entries (duet_cache_get/put).  No GPU and no
 * CUDA library needed. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime/duet_rt.h"

static int failures;

#define EXPECT(c)                                                         \
  do {                                                                    \
    if (!(c)) {                                                           \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);        \
      failures++;                                                         \
    }                                                                     \
  } while (0)

/* nvrtcGetSupportedArchs of NVRTC 13.0 (this machine) and of 12.4 */
static const int cuda13[] = {75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
static const int cuda12[] = {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90};
#define N(a) ((int)(sizeof a / sizeof *a))

static void pick(const char *card, int ma, int mi, const int *archs, int n, int vma, int vmi, int want_rc,
                 const char *want_opt, int want_cubin, const char *want_err) {
  DuetCudaTarget t;
  char err[512] = "";
  int rc = duet_cuda_pick_target(card, ma, mi, archs, n, vma, vmi, &t, err, sizeof err);
  EXPECT(rc == want_rc);
  if (rc == 0 && want_rc == 0) {
    if (strcmp(t.arch_opt, want_opt) || t.cubin != want_cubin) {
      fprintf(stderr, "FAIL %s %d.%d: got %s cubin %d, want %s cubin %d\n", card, ma, mi, t.arch_opt, t.cubin,
              want_opt, want_cubin);
      failures++;
    }
  }
  if (want_err && strcmp(err, want_err)) {
    fprintf(stderr, "FAIL %s %d.%d error:\n got  %s\n want %s\n", card, ma, mi, err, want_err);
    failures++;
  }
}

static void test_targets(void) {
  /* exact SASS */
  pick("NVIDIA H200", 9, 0, cuda13, N(cuda13), 13, 0, 0, "-arch=sm_90", 1, NULL);
  pick("NVIDIA A100", 8, 0, cuda13, N(cuda13), 13, 0, 0, "-arch=sm_80", 1, NULL);
  pick("Tesla T4", 7, 5, cuda13, N(cuda13), 13, 0, 0, "-arch=sm_75", 1, NULL);
  pick("Tesla P100-PCIE-16GB", 6, 0, cuda12, N(cuda12), 12, 4, 0, "-arch=sm_60", 1, NULL);
  /* no exact arch: PTX of the newest one below the card */
  pick("NVIDIA H200", 9, 0, cuda12, N(cuda12) - 1, 12, 4, 0, "-arch=compute_89", 0, NULL);
  pick("Future GPU", 13, 0, cuda13, N(cuda13), 13, 0, 0, "-arch=compute_121", 0, NULL);
  pick("Tesla V100", 7, 0, cuda13 + 0, 0, 13, 0, -1, NULL, 0,
       "Tesla V100 (compute capability 7.0): NVRTC 13.0 reports no supported GPU architecture");
  /* the P100 with CUDA 13's NVRTC: one clear error */
  pick("Tesla P100-PCIE-16GB", 6, 0, cuda13, N(cuda13), 13, 0, -1, NULL, 0,
       "Tesla P100-PCIE-16GB (compute capability 6.0, sm_60) is not supported by NVRTC 13.0, whose oldest target "
       "is sm_75; CUDA 12.x supports it: use duet built against a CUDA 12.x toolkit (NVRTC, cuBLAS) and a driver "
       "that supports the card");
  pick("Tesla K80", 3, 7, cuda12, N(cuda12), 12, 4, -1, NULL, 0,
       "Tesla K80 (compute capability 3.7, sm_37) is not supported by NVRTC 12.4, whose oldest target is sm_50; "
       "CUDA 11.x supports it: use duet built against a CUDA 11.x toolkit (NVRTC, cuBLAS) and a driver that "
       "supports the card");
}

static void test_cache(const char *dir) {
  char err[512], cmd[1200];
  snprintf(cmd, sizeof cmd, "%s/sub/cache", dir);
  setenv("DUET_CACHE_DIR", cmd, 1);
  const char *key = "duet cuda cache test\nsource: x\n";
  size_t len;
  EXPECT(duet_cache_get(key, strlen(key), "cubin", &len, err, sizeof err) == NULL); /* miss */
  struct stat st;
  EXPECT(stat(cmd, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
  const char blob[] = "\x7f" "ELF fake cubin bytes\0with a NUL";
  EXPECT(duet_cache_put(key, strlen(key), "cubin", blob, sizeof blob, err, sizeof err) == 0);
  char *got = duet_cache_get(key, strlen(key), "cubin", &len, err, sizeof err);
  EXPECT(got && len == sizeof blob && !memcmp(got, blob, len));
  free(got);
  /* another key (one byte different), another extension: misses */
  const char *key2 = "duet cuda cache test\nsource: y\n";
  EXPECT(duet_cache_get(key2, strlen(key2), "cubin", &len, err, sizeof err) == NULL);
  EXPECT(duet_cache_get(key, strlen(key), "ptx", &len, err, sizeof err) == NULL);
  /* a damaged object is a miss, and a put repairs it */
  char obj[1400];
  snprintf(obj, sizeof obj, "%s/%016llx.cubin", cmd,
           (unsigned long long)duet_fnv1a(key, strlen(key), DUET_FNV_OFFSET));
  FILE *f = fopen(obj, "r+b");
  EXPECT(f != NULL);
  if (f) {
    fseek(f, 3, SEEK_SET);
    fputc('X', f);
    fclose(f);
  }
  EXPECT(duet_cache_get(key, strlen(key), "cubin", &len, err, sizeof err) == NULL);
  EXPECT(duet_cache_put(key, strlen(key), "cubin", blob, sizeof blob, err, sizeof err) == 0);
  got = duet_cache_get(key, strlen(key), "cubin", &len, err, sizeof err);
  EXPECT(got && len == sizeof blob);
  free(got);
  /* a directory open to others is refused with the exact message */
  EXPECT(chmod(cmd, 0755) == 0);
  char want[1400];
  snprintf(want, sizeof want, "kernel cache directory %s must be a directory owned by you with mode 0700", cmd);
  err[0] = 0;
  EXPECT(duet_cache_put(key, strlen(key), "cubin", blob, sizeof blob, err, sizeof err) == -1);
  if (strcmp(err, want)) {
    fprintf(stderr, "FAIL cache dir mode error:\n got  %s\n want %s\n", err, want);
    failures++;
  }
}

int main(void) {
  test_targets();
  char tmpl[] = "/tmp/duet-cuda-target.XXXXXX";
  if (!mkdtemp(tmpl)) {
    perror("mkdtemp");
    return 1;
  }
  test_cache(tmpl);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
  if (system(cmd)) fprintf(stderr, "warning: could not remove %s\n", tmpl);
  if (failures) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
