/* tests/test_nvrtc.c: every generated CUDA kernel of every model in models/
 * and tests/models/ compiles with NVRTC (no GPU needed).
 *
 * For each model: the f32, fp16 and bf16 (--precision, 16-bit storage)
 * training programs for compute_60 (when the installed NVRTC still
 * supports it; not bf16), compute_75 (not bf16, which needs sm_80),
 * compute_80 and compute_90 (PTX), plus a CUBIN of f32 for sm_80 (which
 * runs ptxas: register and shared-memory limits) and, for models of at
 * most 100 kernels, of fp16 for the oldest architecture the NVRTC has
 * (sm_75 for NVRTC 13: ptxas assembles the half2 helpers' inline f16x2
 * PTX); the PTX of an fp16 program with half2 arithmetic must hold an
 * f16x2 instruction (the __CUDA_ARCH__ >= 530 branch); the f64 training
 * program (not for models with 8-bit AdamW state, which needs f32
 * params: tests/models/adamw8_tiny.model) and, for models with attention,
 * the decoding program (f32, and
 * with --precision fp16, which leaves decoding in f32) for compute_75.  The
 * PTX must hold an entry point duet_k<f> for every function f (kernels
 * that differ only in their tensors share one), and NVRTC's log must be
 * empty: a warning (an unused variable, ...) fails the compile.  The 16-bit
 * programs are compiled by `test_nvrtc --half` (ctest nvrtc_compile_half),
 * the others by the default run.  Models of more than 400 kernels in f32
 * (GPT-2 small) are compiled by `test_nvrtc --large`: PTX of f32 for the
 * architectures, of fp16 for compute_75 and of bf16 for compute_80 only
 * (about 1 s each since kernels share functions; 10 s before).  Exits 77 (ctest SKIP) with a
 * message only when duet was built without NVRTC.  For sm_60, which CUDA
 * 13's NVRTC no longer targets, see tests/test_nvrtc_sm60.c (CUDA 12.9 and
 * 11.8 NVRTC, loaded by path).  The one-op models of
 * tests/op_cases.h (every kernel kind, forward and backward) compile in f32,
 * f64, fp16 and bf16 for compute_75, and the recomputed graph of
 * tests/recompute/gpt_tiny_dropout.model in f32 for compute_75; fmnist_mlp
 * and fmnist_cnn with int8 weights (--quantize int8) and shrunk by --shrink in f32 (default run),
 * fmnist_mlp with int8 activations too (--calibrate: the int8 GEMM, its
 * DP4A path from compute_61 on, the plain int loop for compute_60)
 * and fp16 (--half) for every architecture. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "op_cases.h"
#include "test_util.h"

#ifdef DUET_HAVE_NVRTC
#include "../runtime/cuda/duet_nvrtc.h"

static int failures;
/* Models with more kernels than this are "large" (GPT-2 small: 647): the
 * default run leaves them to `test_nvrtc --large`, which compiles them as
 * PTX for the architectures only, so each ctest test stays under a minute. */
#define LARGE_KERNELS 400
static bool large_mode;
/* `test_nvrtc --half` (ctest nvrtc_compile_half) compiles the fp16 and bf16
 * programs of the non-large models and op cases, the default run the f32,
 * f64 and decoding ones: two tests of under a minute each. */
static bool half_mode;
/* fp16 programs of at most this many kernels are also compiled to a CUBIN
 * (fmnist_mlp, fmnist_cnn); half2_cubins counts them */
#define HALF2_CUBIN_KERNELS 100
static int half2_cubins;
/* Under AddressSanitizer (make test-asan) NVRTC's many allocations run
 * about 4x slower, and the release suite already covers every
 * architecture: there only f32 for compute_75 is compiled. */
#if defined(__SANITIZE_ADDRESS__)
static const bool quick = true;
#else
static const bool quick = false;
#endif

/* `need` (may be NULL): text the PTX must contain */
static int compile_one(const char *what, const char *src, const char *arch, int cubin, int n_fns, const char *need) {
  void *img;
  size_t len;
  char err[65536];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (duet_nvrtc_compile(src, arch, cubin, &img, &len, err, sizeof err)) {
    fprintf(stderr, "FAIL %s %s: %s\n", what, arch, err);
    return 1;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  int rc = cubin ? 0 : check_ptx_entries(what, img, n_fns);
  if (err[0]) {
    fprintf(stderr, "FAIL %s %s: NVRTC's log is not empty:\n%s\n", what, arch, err);
    rc = 1;
  }
  if (!cubin && need && !strstr(img, need)) {
    fprintf(stderr, "FAIL %s %s: the PTX has no %s\n", what, arch, need);
    rc = 1;
  }
  printf("%s %s: %zu bytes of %s, %d functions, %.2f s%s\n", what, arch, len, cubin ? "CUBIN" : "PTX", n_fns,
         (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), rc ? " FAILED" : "");
  free(img);
  return rc;
}

/* What the PTX of a program must contain: the f16x2 arithmetic of the
 * prelude's __CUDA_ARCH__ >= 530 branch ("add.rn.f16x2", "sub.rn.f16x2",
 * "mul.rn.f16x2") when a kernel takes the half2 path with arithmetic;
 * NULL otherwise. */
static const char *half2_need(const CgProgram *cp) {
  for (int i = 0; i < cp->n_kernels; i++)
    if (codegen_cuda_half2(&cp->kernels[i]) == CG_HALF2_ARITH) return ".rn.f16x2 ";
  return NULL;
}

static void test_model(const char *path, const int *archs, int n_archs) {
  Arena *a = arena_new(1 << 20);
  struct {
    DType dt;
    bool decode;
    const char *tag, *precision;
  } variants[] = {{DT_F32, false, "f32", "fp32"},       {DT_F32, false, "fp16", "fp16"},
                  {DT_F32, false, "bf16", "bf16"},      {DT_F64, false, "f64", "fp32"},
                  {DT_F32, true, "f32 decode", "fp32"}, {DT_F32, true, "fp16 decode", "fp16"}};
  enum { N_VARIANTS = sizeof variants / sizeof variants[0] };
  size_t tlen = 0;
  char *text = duet_read_file(path, &tlen);
  bool attention = text && strstr(text, "attention(");
  bool q8 = text && strstr(text, "state = int8"); /* 8-bit AdamW state needs f32 params: no f64 program */
  free(text);
  /* large or not: decided on the f32 training program, for every variant */
  CgProgram *cp0 = lower_model(a, path, NULL, DT_F32, false, "fp32");
  if (cp0 && (cp0->n_kernels > LARGE_KERNELS) != large_mode) {
    printf("%s: %d kernels, %s\n", path, cp0->n_kernels,
           large_mode ? "not large: compiled by test_nvrtc without --large" : "large: compiled by test_nvrtc --large");
    arena_free(a);
    return;
  }
  for (int v = 0; v < N_VARIANTS; v++) {
    if (variants[v].decode && !attention) continue;
    if (q8 && variants[v].dt == DT_F64) continue;
    if ((quick && v > 0) || (large_mode && v > 2)) break;
    if (!large_mode && half_mode != (v == 1 || v == 2 || v == 5)) continue;
    CgProgram *cp = lower_model(a, path, NULL, variants[v].dt, variants[v].decode, variants[v].precision);
    char what[1200];
    snprintf(what, sizeof what, "%s (%s)", path, variants[v].tag);
    if (!cp) {
      fprintf(stderr, "FAIL %s: does not compile\n", what);
      failures++;
      continue;
    }
    int n_fns = 0;
    char *src = codegen_emit_cuda(cp, a, NULL, &n_fns);
    const char *h2need = half2_need(cp);
    bool half = v == 1 || v == 2;
    if (half && !strstr(src, "duet_u16")) {
      fprintf(stderr, "FAIL %s: no 16-bit tensors in the CUDA source\n", what);
      failures++;
    }
    if (v <= 2) { /* f32, fp16, bf16: every architecture */
      const char *want[] = {"-arch=compute_60", "-arch=compute_75", "-arch=compute_80", "-arch=compute_90"};
      int cc[] = {60, 75, 80, 90};
      for (int i = 0; i < 4; i++) {
        if (quick && cc[i] != 75) continue;
        /* large models in 16 bits: fp16 for compute_75, bf16 for compute_80 (10 s each) */
        if (large_mode && v == 1 && cc[i] != 75) continue;
        if (large_mode && v == 2 && cc[i] != 80) continue;
        if (v == 2 && cc[i] < 80) continue; /* bf16 runs on sm_80 and later only */
        bool ok = false;
        for (int j = 0; j < n_archs; j++) ok |= archs[j] == cc[i];
        if (!ok) {
          printf("%s %s: not supported by this NVRTC, skipped\n", what, want[i]);
          continue;
        }
        failures += compile_one(what, src, want[i], 0, n_fns, h2need);
      }
      if (large_mode || quick) continue; /* PTX for the architectures only */
      /* CUBIN (ptxas: registers, shared memory): f32 on sm_80 (16 bits adds no shared memory) */
      if (v == 0) failures += compile_one(what, src, "-arch=sm_80", 1, n_fns, NULL);
      /* fp16: a CUBIN for the oldest architecture this NVRTC has (sm_75
       * for NVRTC 13) assembles the half2 helpers' inline PTX (f16x2
       * arithmetic), which PTX output only copies; the small models only
       * (the GPTs' take 10-20 s) */
      if (v == 1 && h2need && cp->n_kernels <= HALF2_CUBIN_KERNELS) {
        char arch[32];
        snprintf(arch, sizeof arch, "-arch=sm_%d", archs[0]);
        failures += compile_one(what, src, arch, 1, n_fns, NULL);
        half2_cubins++;
      }
    } else if (!large_mode) {
      failures += compile_one(what, src, "-arch=compute_75", 0, n_fns, h2need);
    }
  }
  arena_free(a);
}

static void test_op_cases(void) {
  static const char *const tags[] = {"f32", "f64", "fp16", "bf16"};
  for (int c = 0; c < N_OP_CASES + N_BIG_CASES; c++)
    for (int f = 0; f < 4; f++) {
      const Case *oc = c < N_OP_CASES ? &cases[c] : &big_cases[c - N_OP_CASES];
      if ((c >= N_OP_CASES || quick) && f) continue; /* big cases (and sanitizer builds): f32 only */
      if (half_mode != (f >= 2)) continue;
      Arena *a = arena_new(1 << 18);
      CgProgram *cp = lower_model(a, oc->name, oc->src, f == 1 ? DT_F64 : DT_F32, false,
                                  f == 2 ? "fp16" : f == 3 ? "bf16" : "fp32");
      char what[256];
      snprintf(what, sizeof what, "op %s (%s)", oc->name, tags[f]);
      if (!cp) {
        fprintf(stderr, "FAIL %s: does not compile\n", what);
        failures++;
      } else {
        int n_fns = 0;
        char *src = codegen_emit_cuda(cp, a, NULL, &n_fns);
        failures += compile_one(what, src, "-arch=compute_75", 0, n_fns, half2_need(cp));
      }
      arena_free(a);
    }
}

/* Activation recomputation (`recompute = "blocks"` in the model's train
 * section): the copies of the blocks' forward ops are ordinary kernels; the
 * f32 program for compute_75 (one compile: the other variants add nothing
 * the models above do not cover). */
static void test_recompute(void) {
  const char *path = DUET_SOURCE_DIR "/tests/recompute/gpt_tiny_dropout.model";
  Arena *a = arena_new(1 << 20);
  CgProgram *cp = lower_model(a, path, NULL, DT_F32, false, "fp32");
  if (!cp) {
    fprintf(stderr, "FAIL %s: does not compile\n", path);
    failures++;
  } else {
    int n_fns = 0;
    char *src = codegen_emit_cuda(cp, a, NULL, &n_fns);
    char what[1200];
    snprintf(what, sizeof what, "%s (f32, recomputed blocks)", path);
    failures += compile_one(what, src, "-arch=compute_75", 0, n_fns, half2_need(cp));
  }
  arena_free(a);
}

/* PTX of `src` for each of compute_60, 75, 80, 90 that this NVRTC has
 * (archs[n_archs]); --quick: compute_75 only.  The failures are counted. */
static void compile_archs(const char *what, const char *src, int n_fns, const char *h2need, const int *archs,
                          int n_archs) {
  static const char *const want[] = {"-arch=compute_60", "-arch=compute_75", "-arch=compute_80", "-arch=compute_90"};
  static const int cc[] = {60, 75, 80, 90};
  for (int i = 0; i < 4; i++) {
    bool ok = false;
    for (int j = 0; j < n_archs; j++) ok |= archs[j] == cc[i];
    if (ok && (!quick || cc[i] == 75)) failures += compile_one(what, src, want[i], 0, n_fns, h2need);
  }
}

/* int8 weights (--quantize int8, passes/quantize.c): the dequantize
 * kernels reading i8 tensors, in fmnist_mlp and fmnist_cnn, f32 and fp16
 * (where dequantize feeds a cast), PTX for every architecture this NVRTC
 * has of compute_60, 75, 80, 90. */
static void test_quantized(const int *archs, int n_archs) {
  static const char *const models[2] = {DUET_SOURCE_DIR "/models/fmnist_mlp.model",
                                        DUET_SOURCE_DIR "/models/fmnist_cnn.model"};
  for (int m = 0; m < 2; m++)
    for (int h = 0; h < 3; h++) { /* h 2: int8 activations too (--calibrate: the int8 GEMM, DP4A) */
      if (half_mode != (h == 1) || (quick && (h || m)) || (h == 2 && m)) continue;
      Arena *a = arena_new(1 << 20);
      tmodel_calibrate = h == 2;
      CgProgram *cp = lower_model_quant(a, models[m], NULL, DT_F32, false, h == 1 ? "fp16" : "fp32", "int8");
      tmodel_calibrate = 0;
      char what[1200];
      snprintf(what, sizeof what, "%s (%s, --quantize int8%s)", models[m], h == 1 ? "fp16" : "f32",
               h == 2 ? " --calibrate 1" : "");
      if (!cp) {
        fprintf(stderr, "FAIL %s: does not compile\n", what);
        failures++;
        arena_free(a);
        continue;
      }
      int n_fns = 0;
      char *src = codegen_emit_cuda(cp, a, NULL, &n_fns);
      if (!strstr(src, "signed char")) {
        fprintf(stderr, "FAIL %s: no int8 tensor in the CUDA source\n", what);
        failures++;
      }
      if (h == 2 && !strstr(src, "__dp4a(")) {
        fprintf(stderr, "FAIL %s: no int8 GEMM (__dp4a) in the CUDA source\n", what);
        failures++;
      }
      compile_archs(what, src, n_fns, half2_need(cp), archs, n_archs);
      arena_free(a);
    }
}

/* --shrink (passes/shrink.c): fmnist_mlp and fmnist_cnn with channels
 * pruning to 0.5 and the pruned channels removed (linear1.w [784, 512],
 * conv2.w [32, 32, 3, 3], ...), f32 and fp16, PTX for every architecture
 * this NVRTC has of compute_60, 75, 80, 90. */
static void test_shrunk(const int *archs, int n_archs) {
  static const char *const models[2] = {DUET_SOURCE_DIR "/models/fmnist_mlp.model",
                                        DUET_SOURCE_DIR "/models/fmnist_cnn.model"};
  for (int m = 0; m < 2; m++)
    for (int h = 0; h < 2; h++) {
      if (half_mode != (h == 1) || (quick && (h || m))) continue;
      Arena *a = arena_new(1 << 20);
      CgProgram *cp = lower_model_opts(a, models[m], NULL, DT_F32, false, h ? "fp16" : "fp32", NULL, 0.5);
      char what[1200];
      snprintf(what, sizeof what, "%s (%s, --prune-mode channels --prune 0.5 --shrink)", models[m], h ? "fp16" : "f32");
      if (!cp) {
        fprintf(stderr, "FAIL %s: does not compile\n", what);
        failures++;
        arena_free(a);
        continue;
      }
      if (!cp->prog.shrink) {
        fprintf(stderr, "FAIL %s: nothing shrunk\n", what);
        failures++;
      }
      int n_fns = 0;
      char *src = codegen_emit_cuda(cp, a, NULL, &n_fns);
      compile_archs(what, src, n_fns, half2_need(cp), archs, n_archs);
      arena_free(a);
    }
}

static void test_dir(const char *dir, const int *archs, int n_archs) {
  char **names;
  int n = list_models(dir, &names);
  if (n < 0) {
    fprintf(stderr, "FAIL cannot open %s\n", dir);
    failures++;
    return;
  }
  for (int i = 0; i < n; i++) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    test_model(path, archs, n_archs);
    free(names[i]);
  }
  free(names);
  if (n == 0) {
    fprintf(stderr, "FAIL no models in %s\n", dir);
    failures++;
  }
}

int main(int argc, char **argv) {
  int major, minor, archs[64];
  if (duet_nvrtc_version(&major, &minor)) {
    fprintf(stderr, "FAIL nvrtcVersion failed\n");
    return 1;
  }
  int n = duet_nvrtc_archs(archs, 64);
  if (n <= 0) {
    fprintf(stderr, "FAIL nvrtcGetSupportedArchs failed\n");
    return 1;
  }
  printf("NVRTC %d.%d, targets:", major, minor);
  for (int i = 0; i < n; i++) printf(" sm_%d", archs[i]);
  printf("\n");
  int first = 1;
  if (argc > 1 && !strcmp(argv[1], "--large")) large_mode = true, first = 2;
  if (argc > 1 && !strcmp(argv[1], "--half")) half_mode = true, first = 2;
  if (half_mode && quick) {
    printf("SKIP: sanitizer build: the fp16/bf16 programs are NVRTC-compiled by the release suite (make test)\n");
    return 77;
  }
  if (large_mode && quick) {
    printf("SKIP: sanitizer build: GPT-2 small is NVRTC-compiled by the release suite (make test)\n");
    return 77;
  }
  if (argc > first) { /* given models (for debugging) */
    for (int i = first; i < argc; i++) test_model(argv[i], archs, n);
  } else {
    test_dir(DUET_SOURCE_DIR "/models", archs, n);
    test_dir(DUET_SOURCE_DIR "/tests/models", archs, n);
    if (!large_mode && !half_mode) test_recompute();
    if (!large_mode) test_quantized(archs, n);
    if (!large_mode) test_shrunk(archs, n);
    if (!large_mode) test_op_cases();
    if (half_mode && half2_cubins == 0) {
      fprintf(stderr, "FAIL no fp16 program with half2 arithmetic was compiled to a CUBIN\n");
      failures++;
    }
  }
  if (failures) fprintf(stderr, "%d failures\n", failures);
  else printf("ok\n");
  return failures ? 1 : 0;
}
#else
int main(void) {
  printf("SKIP: duet was built without NVRTC (no CUDA toolkit found; -DDUET_CUDA=ON to require one)\n");
  return 77;
}
#endif
