/* tests/test_scale.c: the C backend's kernels on the cases of
 * tests/scale_cases.h, results that go wrong only at scale (issue 17):
 *  1. the embedding forward and backward kernels of a table of 2^32 + 320
 *     elements, run alone on their real addresses (scale_sink_map): every
 *     looked-up row, and every gradient row a sum of its tokens;
 *  2. the full-tensor mean (three data sets) and sum of 2^24 elements
 *     within the summation bound against the exact sum;
 *  3. the loss and the evaluation NLL of huge logits in f32, f64, fp16 and
 *     bf16 programs, against a long double log-sum-exp.
 * tests/test_cuda_emu.c runs the same cases on the emulated CUDA kernels.
 * `test_scale embedding|sum|xent` runs one part. */
#define _GNU_SOURCE
#include "scale_cases.h"

#include "../runtime/duet_half.h"
#include "test_util.h"

static int fails;

/* Loads the C kernels of a lowered program; NULL after printing why. */
static JitModule *load_c(const CgProgram *cp, Arena *a, JitModule *jit, const char *what) {
  char err[8192];
  if (!cp || jit_load(codegen_emit_c(cp, a), jit, err, sizeof err)) {
    fprintf(stderr, "FAIL %s: %s\n", what, cp ? err : "does not compile");
    fails++;
    return NULL;
  }
  return jit;
}

static void embedding(void) {
  Arena *a = arena_new(1 << 20);
  JitModule jit;
  CgProgram *cp = lower_model(a, "huge_embedding", emb_src, DT_F32, false, NULL);
  if (!load_c(cp, a, &jit, "embedding past 2^32 elements")) {
    arena_free(a);
    return;
  }
  int kf = scale_find_kernel(cp, KK_EMBED_FWD, 0, 0), kb = scale_find_kernel(cp, KK_EMBED_BWD, 0, 0);
  const DuetProgram *p = &cp->prog;
  void **t = calloc((size_t)p->n_tensors + 1, sizeof *t);
  float *dy = calloc(EMB_R * EMB_C, sizeof *dy), *out = calloc(EMB_R * EMB_C, sizeof *out);
  int32_t ids[EMB_R];
  memcpy(ids, emb_ids, sizeof ids);
  double s[DUET_S_COUNT] = {0};
  ScaleMap m = {0};
  int before = fails;
  if (kf < 0 || kb < 0 || !t || !dy || !out) {
    fprintf(stderr, "FAIL embedding past 2^32 elements: no embedding kernels or no memory\n");
    fails++;
    goto out;
  }
  /* forward: table, ids -> rows */
  if (emb_map(&m)) {
    perror("FAIL embedding past 2^32 elements: mapping 16 GiB");
    fails++;
    goto out;
  }
  const Kernel *k = &cp->kernels[kf];
  emb_fill((float *)m.base, dy);
  t[k->bufs[0].tensor] = m.base, t[k->bufs[1].tensor] = ids, t[k->bufs[2].tensor] = out;
  jit.fns[kf](t, s);
  fails += emb_check_fwd("C embedding forward, table of 2^32 + 320 elements", out);
  scale_unmap(&m);
  /* backward: dy, ids -> the table's gradient (zeroed by the kernel) */
  if (emb_map(&m)) {
    perror("FAIL embedding past 2^32 elements: mapping 16 GiB");
    fails++;
    goto out;
  }
  k = &cp->kernels[kb];
  memset(t, 0, ((size_t)p->n_tensors + 1) * sizeof *t);
  t[k->bufs[0].tensor] = dy, t[k->bufs[1].tensor] = ids, t[k->bufs[2].tensor] = m.base;
  jit.fns[kb](t, s);
  fails += emb_check_bwd("C embedding backward, table of 2^32 + 320 elements", (const float *)m.base);
  scale_unmap(&m);
  printf("%s C embedding forward and backward over a table of %lld elements (rows 2^26.. wrap at 32 bits)\n",
         fails > before ? "FAIL" : "ok", (long long)(EMB_V * EMB_C));
out:
  scale_unmap(&m);
  free(t), free(dy), free(out);
  jit_unload(&jit);
  arena_free(a);
}

static void sums(void) {
  Arena *a = arena_new(1 << 20);
  JitModule jit;
  CgProgram *cp = lower_model(a, "sum24", sum_src, DT_F32, false, NULL);
  if (!load_c(cp, a, &jit, "sum of 2^24 elements")) {
    arena_free(a);
    return;
  }
  const DuetProgram *p = &cp->prog;
  int km = scale_find_kernel(cp, KK_REDUCE, SUM_N, 0), ks = scale_find_kernel(cp, KK_REDUCE, SUM_N, 1);
  float *x = malloc(SUM_N * sizeof *x), y[16];
  void **t = calloc((size_t)p->n_tensors + 1, sizeof *t);
  double s[DUET_S_COUNT] = {0};
  if (km < 0 || ks < 0 || !x || !t) {
    fprintf(stderr, "FAIL sum of 2^24 elements: no whole-tensor reductions or no memory\n");
    fails++;
    goto out;
  }
  if (cp->kernels[km].scale == 1) { /* the mean is the one scaled by 2^-24 */
    int tmp = km;
    km = ks, ks = tmp;
  }
  static const char *const sets[] = {"uniform [0, 1)", "mixed signs and magnitudes", "0.1f everywhere"};
  for (int run = 0; run < 4; run++) {
    int set = run < 3 ? run : 0, ki = run < 3 ? km : ks;
    const Kernel *k = &cp->kernels[ki];
    __int128 exact;
    double abs_sum, rel;
    sum_fill(x, set, &exact, &abs_sum);
    t[k->bufs[0].tensor] = x, t[k->bufs[1].tensor] = y;
    jit.fns[ki](t, s);
    char what[160];
    snprintf(what, sizeof what, "C %s of 2^24 elements, %s", run < 3 ? "mean" : "sum", sets[set]);
    int bad = sum_check(what, y[0], exact, abs_sum, k->scale, &rel);
    fails += bad;
    printf("%s %s: relative error %.2g\n", bad ? "FAIL" : "ok", what, rel);
  }
out:
  free(x), free(t);
  jit_unload(&jit);
  arena_free(a);
}

/* The logits a program of `prec` stores for z (its 16-bit GEMM output, or z). */
static double stored(double z, const char *prec, bool f64) {
  if (f64) return z;
  if (!strcmp(prec, "fp16")) return duet_f32_from_f16(duet_f16_from_f32((float)z));
  if (!strcmp(prec, "bf16")) return duet_f32_from_bf16(duet_bf16_from_f32((float)z));
  return (float)z;
}

static void xent(void) {
  static const char *const precs[] = {"fp32", "fp32", "fp16", "bf16"};
  for (int pi = 0; pi < 4; pi++) {
    bool f64 = pi == 1;
    const char *prec = precs[pi], *name = f64 ? "f64" : prec;
    TModel t;
    FrontendOptions fo = {.float_dtype = f64 ? DT_F64 : DT_F32};
    if (tmodel_open_prec(&t, "xent_huge", xent_src, &fo, prec)) {
      fprintf(stderr, "FAIL huge logits (%s): does not compile\n", name);
      fails++;
      continue;
    }
    const DuetProgram *p = &t.cp->prog;
    size_t es = f64 ? 8 : 4;
    double w[XENT_C * XENT_C];
    float wf[XENT_C * XENT_C];
    for (int i = 0; i < XENT_C * XENT_C; i++) w[i] = wf[i] = i / XENT_C == i % XENT_C;
    Value *wv = tmodel_param(&t, "w");
    int n_run = 0, before = fails;
    bool broken = !wv || duet_session_write(t.s, tmodel_tensor(&t, wv), 0, f64 ? (void *)w : (void *)wf,
                                            XENT_C * XENT_C * es);
    if (broken) {
      fprintf(stderr, "FAIL huge logits (%s): cannot set w\n", name);
      fails++;
    }
    for (int c = 0; c < N_XENT_CASES && !broken; c++) {
      const XentCase *xc = &xent_cases[c];
      if (!xent_case_runs(xc, prec, f64)) continue;
      double z[XENT_C], zs[XENT_C];
      float zf[XENT_C];
      for (int j = 0; j < XENT_C; j++) z[j] = xc->z[j], zf[j] = (float)xc->z[j], zs[j] = stored(xc->z[j], prec, f64);
      int32_t y = xc->y;
      double loss = NAN, met[2] = {NAN, NAN};
      float lf = NAN, mf[2] = {NAN, NAN};
      duet_session_set_valid(t.s, 1);
      if (duet_session_write(t.s, p->input_x, 0, f64 ? (void *)z : (void *)zf, XENT_C * es) ||
          duet_session_write(t.s, p->input_y, 0, &y, sizeof y) || duet_session_run(t.s, DUET_RUN_GRAD) ||
          duet_session_read(t.s, p->loss, 0, f64 ? (void *)&loss : (void *)&lf, es) ||
          duet_session_run(t.s, DUET_RUN_EVAL) ||
          duet_session_read(t.s, p->metrics, 0, f64 ? (void *)met : (void *)mf, 2 * es)) {
        fprintf(stderr, "FAIL huge logits (%s), %s: %s\n", name, xc->name, duet_session_error(t.s));
        fails++;
        broken = true;
        break;
      }
      if (!f64) loss = lf, met[0] = mf[0], met[1] = mf[1];
      long double ref = xent_ref(zs, y);
      char what[200];
      snprintf(what, sizeof what, "C cross-entropy (%s), %s: loss", name, xc->name);
      fails += xent_check(what, loss, ref, f64);
      snprintf(what, sizeof what, "C cross-entropy (%s), %s: evaluation NLL", name, xc->name);
      fails += xent_check(what, met[1], ref, f64);
      n_run++;
    }
    printf("%s C cross-entropy of huge logits (%s): %d cases, loss and evaluation NLL\n",
           fails > before ? "FAIL" : "ok", name, n_run);
    tmodel_close(&t);
  }
}

int main(int argc, char **argv) {
  const char *part = argc > 1 ? argv[1] : NULL;
  if (!part || !strcmp(part, "embedding")) embedding();
  if (!part || !strcmp(part, "sum")) sums();
  if (!part || !strcmp(part, "xent")) xent();
  if (fails) fprintf(stderr, "%d checks failed\n", fails);
  else printf("ok: all checks passed\n");
  return fails != 0;
}
