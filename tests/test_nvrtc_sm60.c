/* tests/test_nvrtc_sm60.c: every generated CUDA kernel compiles for the
 * P100 (sm_60) with the NVRTC its user runs: CUDA 12.x or 11.8 (CUDA 13's
 * NVRTC no longer targets sm_60).  No GPU needed.
 *
 * usage: test_nvrtc_sm60 DIR [--large] [MODEL...]
 * DIR is one NVRTC unpacked by tools/fetch-nvrtc.sh (.nvrtc/12.9.86,
 * .nvrtc/11.8.89): its lib/libnvrtc.so.* is loaded with dlopen by path
 * (duet_nvrtc_open; the build links no NVRTC for this test) and driven by
 * duet's own compile routine (duet_nvrtc_lib_compile: the plugin's options).
 *
 * Checks, in order:
 *  - the library's nvrtcVersion matches DIR's name (12.9.86 -> 12.9);
 *  - duet_cuda_pick_target, fed the library's nvrtcGetSupportedArchs, picks
 *    SASS (-arch=sm_60, a CUBIN) for a Tesla P100 and sm_61 for a P40;
 *  - every model of models/ and tests/models/ in f32 and fp16 (bf16 needs
 *    sm_80): a CUBIN for sm_60 (ELF for EM_CUDA, ptxas's register and
 *    shared-memory limits) and PTX for compute_60 (.target sm_60 and an
 *    entry point per kernel); with attention, the f32 decoding program
 *    (duet sample) as a CUBIN; every op case of tests/op_cases.h (every
 *    kernel kind, forward and backward) in f32, f64 and fp16 as a CUBIN;
 *    fmnist_mlp with int8 weights (--quantize int8) and fmnist_cnn shrunk
 *    (--prune-mode channels --prune 0.5 --shrink) in f32 and fp16, a CUBIN
 *    and PTX.
 *    Models of more than 400 kernels in f32 (GPT-2 small) are left to
 *    `--large`, which compiles only them, the same four ways.  Sanitizer
 *    builds compile fmnist_mlp only (and skip --large).
 * Prints each compile's size, kernel count and seconds.  Exits 77 (ctest
 * SKIP) with the command to fetch the library when DIR holds none; 1 when a
 * check fails (a library that is present but does not load fails). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../runtime/cuda/duet_nvrtc.h"
#include "../runtime/duet_rt.h"
#include "op_cases.h"
#include "test_util.h"

#define LARGE_KERNELS 400 /* as tests/test_nvrtc.c: GPT-2 small (647) is large */
/* Under AddressSanitizer (make test-asan) NVRTC runs about 4x slower and
 * the release suite already compiles everything: there only fmnist_mlp is
 * compiled (the dlopen path and the target check still run). */
#if defined(__SANITIZE_ADDRESS__)
static const bool quick = true;
#else
static const bool quick = false;
#endif
#define EM_CUDA 190

typedef struct Run {
  const DuetNvrtc *nv;
  bool large;
  int failures;
  double seconds, cpu; /* of all compiles: wall clock, CPU time of this process */
  int compiles;
} Run;

static double clock_s(clockid_t id) {
  struct timespec t;
  clock_gettime(id, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }

/* A CUBIN is a 64-bit ELF for EM_CUDA whose flags name the SM: the low
 * byte (CUDA 11.x, 12.x) or the second byte (newer layouts) is 60. */
static int check_cubin(const char *what, const unsigned char *img, size_t len) {
  if (len < 64 || memcmp(img, "\177ELF", 4) || img[4] != 2) {
    fprintf(stderr, "FAIL %s: the CUBIN is not a 64-bit ELF file\n", what);
    return 1;
  }
  uint16_t machine;
  uint32_t flags;
  memcpy(&machine, img + 18, sizeof machine);
  memcpy(&flags, img + 48, sizeof flags);
  if (machine != EM_CUDA || ((flags & 0xff) != 60 && ((flags >> 8) & 0xff) != 60)) {
    fprintf(stderr, "FAIL %s: the CUBIN is for machine %u, flags 0x%x, not EM_CUDA (190) sm_60\n", what, machine,
            flags);
    return 1;
  }
  return 0;
}

static void compile_one(Run *r, const char *what, const char *src, int cubin, int n_fns) {
  const char *arch = cubin ? "-arch=sm_60" : "-arch=compute_60";
  void *img;
  size_t len;
  char err[65536];
  double t0 = now(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
  if (duet_nvrtc_lib_compile(r->nv, src, arch, cubin, &img, &len, err, sizeof err)) {
    fprintf(stderr, "FAIL %s %s: %s\n", what, arch, err);
    r->failures++;
    return;
  }
  double dt = now() - t0, dc = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
  r->seconds += dt;
  r->cpu += dc;
  r->compiles++;
  int bad;
  if (cubin) {
    bad = check_cubin(what, img, len);
  } else {
    bad = check_ptx_entries(what, img, n_fns);
    if (!bad && !strstr(img, "\n.target sm_60")) {
      fprintf(stderr, "FAIL %s: the PTX has no `.target sm_60`\n", what);
      bad = 1;
    }
  }
  r->failures += bad;
  printf("%s %s: %zu bytes of %s, %d functions, %.2f s (%.2f s CPU)%s\n", what, arch, len, cubin ? "CUBIN" : "PTX",
         n_fns, dt, dc, bad ? " FAILED" : "");
  free(img);
}

static void test_model(Run *r, const char *path) {
  Arena *a = arena_new(1 << 20);
  size_t tlen = 0;
  char *text = duet_read_file(path, &tlen);
  bool attention = text && strstr(text, "attention(");
  free(text);
  struct {
    const char *tag, *precision;
    bool decode;
  } variants[] = {{"f32", "fp32", false}, {"fp16", "fp16", false}, {"f32 decode", "fp32", true}};
  for (int v = 0; v < 3; v++) {
    if (variants[v].decode && (!attention || r->large)) continue;
    char what[1200];
    snprintf(what, sizeof what, "%s (%s)", path, variants[v].tag);
    CgProgram *cp = lower_model(a, path, NULL, DT_F32, variants[v].decode, variants[v].precision);
    if (!cp) {
      fprintf(stderr, "FAIL %s: does not compile\n", what);
      r->failures++;
      if (v == 0) break; /* large or not is decided on the f32 program */
      continue;
    }
    if (v == 0 && (cp->n_kernels > LARGE_KERNELS) != r->large) {
      printf("%s: %d kernels, %s\n", path, cp->n_kernels,
             r->large ? "not large: compiled without --large" : "large: compiled by --large");
      break;
    }
    int n_fns = 0;
    char *src = codegen_emit_cuda(cp, a, NULL, &n_fns);
    if (v == 1 && !strstr(src, "duet_u16")) {
      fprintf(stderr, "FAIL %s: no 16-bit tensors in the CUDA source\n", what);
      r->failures++;
    }
    compile_one(r, what, src, 1, n_fns);
    if (!variants[v].decode) compile_one(r, what, src, 0, n_fns);
  }
  arena_free(a);
}

/* int8 weights (--quantize int8): fmnist_mlp in f32 and fp16, and with
 * int8 activations (--calibrate: the int8 GEMM's plain int loop, as sm_60
 * has no DP4A), a CUBIN for
 * sm_60 and PTX (the P100 has no DP4A: the dequantize kernels widen the
 * int8 weights to f32 for the f32 or fp16 GEMM; fmnist_cnn's are the same
 * kernels, compiled for compute_60 by test_nvrtc). */
static void test_quantized(Run *r) {
  static const char *const models[1] = {DUET_SOURCE_DIR "/models/fmnist_mlp.model"};
  for (int m = 0; m < 1; m++)
    for (int h = 0; h < 3; h++) { /* h 2: int8 activations too (--calibrate: the int8 GEMM without DP4A) */
      Arena *a = arena_new(1 << 20);
      tmodel_calibrate = h == 2;
      CgProgram *cp = lower_model_quant(a, models[m], NULL, DT_F32, false, h == 1 ? "fp16" : "fp32", "int8");
      tmodel_calibrate = 0;
      char what[1200];
      snprintf(what, sizeof what, "%s (%s, --quantize int8%s)", models[m], h == 1 ? "fp16" : "f32",
               h == 2 ? " --calibrate 1" : "");
      if (!cp) {
        fprintf(stderr, "FAIL %s: does not compile\n", what);
        r->failures++;
      } else {
        int n_fns = 0;
        char *src = codegen_emit_cuda(cp, a, NULL, &n_fns);
        compile_one(r, what, src, 1, n_fns);
        compile_one(r, what, src, 0, n_fns);
      }
      arena_free(a);
    }
}

/* --shrink (channels pruning to 0.5, the pruned channels removed):
 * fmnist_cnn in f32 and fp16, a CUBIN for sm_60 and PTX (only shapes
 * change; its shrunk conv2 and linear layers, fmnist_mlp's are compiled
 * for compute_60 by test_nvrtc). */
static void test_shrunk(Run *r) {
  for (int h = 0; h < 2; h++) {
    Arena *a = arena_new(1 << 20);
    const char *model = DUET_SOURCE_DIR "/models/fmnist_cnn.model";
    CgProgram *cp = lower_model_opts(a, model, NULL, DT_F32, false, h ? "fp16" : "fp32", NULL, 0.5);
    char what[1200];
    snprintf(what, sizeof what, "%s (%s, --prune-mode channels --prune 0.5 --shrink)", model, h ? "fp16" : "f32");
    if (!cp || !cp->prog.shrink) {
      fprintf(stderr, "FAIL %s: %s\n", what, cp ? "nothing shrunk" : "does not compile");
      r->failures++;
    } else {
      int n_fns = 0;
      char *src = codegen_emit_cuda(cp, a, NULL, &n_fns);
      compile_one(r, what, src, 1, n_fns);
      compile_one(r, what, src, 0, n_fns);
    }
    arena_free(a);
  }
}

static void test_dir(Run *r, const char *dir) {
  char **names;
  int n = list_models(dir, &names);
  if (n <= 0) {
    fprintf(stderr, "FAIL no models in %s\n", dir);
    r->failures++;
    return;
  }
  for (int i = 0; i < n; i++) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    test_model(r, path);
    free(names[i]);
  }
  free(names);
}

static void test_op_cases(Run *r) {
  static const char *const tags[] = {"f32", "f64", "fp16"};
  for (int c = 0; c < N_OP_CASES + N_BIG_CASES; c++)
    for (int f = 0; f < 3; f++) {
      const Case *oc = c < N_OP_CASES ? &cases[c] : &big_cases[c - N_OP_CASES];
      if (c >= N_OP_CASES && f) continue; /* big cases: f32 only */
      Arena *a = arena_new(1 << 18);
      CgProgram *cp = lower_model(a, oc->name, oc->src, f == 1 ? DT_F64 : DT_F32, false, f == 2 ? "fp16" : "fp32");
      char what[256];
      snprintf(what, sizeof what, "op %s (%s)", oc->name, tags[f]);
      if (!cp) {
        fprintf(stderr, "FAIL %s: does not compile\n", what);
        r->failures++;
      } else {
        int n_fns = 0;
        char *src = codegen_emit_cuda(cp, a, NULL, &n_fns);
        compile_one(r, what, src, 1, n_fns);
      }
      arena_free(a);
    }
}

/* The target duet picks for a card, given this NVRTC's architectures. */
static void expect_target(Run *r, const char *card, int ma, int mi, const int *archs, int n, int vma, int vmi,
                          const char *want) {
  DuetCudaTarget t;
  char err[1024] = "";
  if (duet_cuda_pick_target(card, ma, mi, archs, n, vma, vmi, &t, err, sizeof err)) {
    fprintf(stderr, "FAIL target for %s with NVRTC %d.%d: %s\n", card, vma, vmi, err);
    r->failures++;
  } else if (strcmp(t.arch_opt, want) || !t.cubin) {
    fprintf(stderr, "FAIL target for %s with NVRTC %d.%d: %s (%s), want %s (SASS)\n", card, vma, vmi, t.arch_opt,
            t.cubin ? "SASS" : "PTX", want);
    r->failures++;
  } else {
    printf("target for %s with NVRTC %d.%d: %s (SASS, a CUBIN)\n", card, vma, vmi, t.arch_opt);
  }
}

/* DIR/lib/libnvrtc.so.* (not the builtins) into path; 0, or -1 when none */
static int find_lib(const char *dir, char *path, size_t len) {
  char lib[1536];
  snprintf(lib, sizeof lib, "%s/lib", dir);
  DIR *d = opendir(lib);
  if (!d) return -1;
  int found = -1;
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, "libnvrtc.so.", 12)) {
      snprintf(path, len, "%s/%s", lib, e->d_name);
      found = 0;
      break;
    }
  closedir(d);
  return found;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_nvrtc_sm60 DIR [--large] [MODEL...]  (DIR: from tools/fetch-nvrtc.sh)\n");
    return 2;
  }
  const char *dir = argv[1];
  char path[2048];
  if (find_lib(dir, path, sizeof path)) {
    printf("SKIP: no NVRTC in %s (no lib/libnvrtc.so.*): run `sh tools/fetch-nvrtc.sh .nvrtc` in the source tree "
           "(or `make nvrtc`; about 113 MB from PyPI) to compile every kernel for sm_60 with NVRTC 12.9 and 11.8\n",
           dir);
    return 77;
  }
  char err[4096];
  DuetNvrtc *nv = duet_nvrtc_open(path, err, sizeof err);
  if (!nv) {
    fprintf(stderr, "FAIL %s\n", err);
    return 1;
  }
  Run r = {.nv = nv};
  int vma, vmi, archs[64];
  if (duet_nvrtc_lib_version(nv, &vma, &vmi)) {
    fprintf(stderr, "FAIL nvrtcVersion of %s failed\n", path);
    duet_nvrtc_close(nv);
    return 1;
  }
  int n = duet_nvrtc_lib_archs(nv, archs, 64);
  if (n <= 0) {
    fprintf(stderr, "FAIL nvrtcGetSupportedArchs of %s failed\n", path);
    duet_nvrtc_close(nv);
    return 1;
  }
  printf("%s: NVRTC %d.%d, targets:", path, vma, vmi);
  for (int i = 0; i < n; i++) printf(" sm_%d", archs[i]);
  printf("\n");
  /* DIR named after the wheel's version: the library must be that one */
  const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
  int dma, dmi;
  if (sscanf(base, "%d.%d", &dma, &dmi) == 2 && (dma != vma || dmi != vmi)) {
    fprintf(stderr, "FAIL %s is NVRTC %d.%d, but its directory says %d.%d\n", path, vma, vmi, dma, dmi);
    r.failures++;
  }
  expect_target(&r, "Tesla P100-PCIE-16GB", 6, 0, archs, n, vma, vmi, "-arch=sm_60");
  expect_target(&r, "Tesla P40", 6, 1, archs, n, vma, vmi, "-arch=sm_61");
  int first = 2;
  if (argc > 2 && !strcmp(argv[2], "--large")) r.large = true, first = 3;
  if (r.large && quick) {
    printf("SKIP: sanitizer build: GPT-2 small is compiled for sm_60 by the release suite (make test)\n");
    duet_nvrtc_close(nv);
    return r.failures ? 1 : 77;
  }
  double t0 = now();
  if (argc > first) { /* given models (for debugging and timing) */
    for (int i = first; i < argc; i++) test_model(&r, argv[i]);
  } else if (quick) {
    test_model(&r, DUET_SOURCE_DIR "/models/fmnist_mlp.model");
  } else {
    test_dir(&r, DUET_SOURCE_DIR "/models");
    test_dir(&r, DUET_SOURCE_DIR "/tests/models");
    if (!r.large) test_op_cases(&r);
    if (!r.large) test_quantized(&r);
    if (!r.large) test_shrunk(&r);
  }
  printf("NVRTC %d.%d: %d compiles for sm_60 in %.1f s (%.1f s CPU; %.1f s in all)\n", vma, vmi, r.compiles,
         r.seconds, r.cpu, now() - t0);
  duet_nvrtc_close(nv);
  if (r.failures) fprintf(stderr, "%d failures\n", r.failures);
  else printf("ok\n");
  return r.failures ? 1 : 0;
}
