/* tests/gpu/test_gpu_ops.c (ctest label gpu): every op's forward and
 * backward, and one optimizer step, on the GPU against the CPU backend.
 *
 * Each case of tests/op_cases.h, plus larger shapes that exercise the
 * multi-block paths of the CUDA kernels (block reductions, grid-stride
 * loops, attention over 200 positions), is compiled once; the same program
 * runs on a CPU session and a CUDA session (cuda:0) whose params and inputs
 * are filled with the same random values.  Every kernel and GEMM is
 * checked alone (lockstep_device, tests/test_util.h: the CPU's kernel from
 * a copy of the memory the GPU's kernel started from, within what the two
 * evaluations' f32 order and one 16-bit flip allow; GEMMs against the
 * exact product).  After a gradient run (forward + backward), after
 * evaluation and after one training step (AdamW, with eps = lr on both:
 * see run_case), every tensor of the program must agree:
 *   f32: |gpu - cpu| <= 1e-4 + 2e-3 |cpu|  (float32 rounding of sums in a
 *        different order: a few ulp per term over at most a few thousand terms)
 *   f64: |gpu - cpu| <= 1e-11 + 1e-9 |cpu|
 * The same cases also run with 16-bit storage (--precision fp16 with loss
 * scaling, bf16; cuBLAS GemmEx against the exact product), every tensor
 * normwise within 2 (D u16 + 2^-17) of its largest magnitude (D its
 * roundings to 16 bits: tmodel_session_tol16), with equal loss scales and
 * skipped steps; bf16 on a card below sm_80 must be refused with the error
 * naming the card.  Each case prints the largest fraction of its bounds
 * used.
 * Exits 77 (ctest SKIP) with the reason when there is no GPU or no driver. */
#include <stdlib.h>
#include <string.h>

#include "../test_util.h"
#include "../op_cases.h"


/* precision: NULL (f32 or f64 as dt), "fp16" or "bf16".  With
 * $GPU_OPS_ONLY set (f32, f64, fp16 or bf16), only cases of that one run
 * (tests/run_fakegpu.sh: bf16 again on a fake sm_80). */
static int run_case(const Case *c, DType dt, const char *precision) {
  TModel t;
  char what[128], err[4096];
  const char *kind = precision ? precision : dt == DT_F64 ? "f64" : "f32", *only = getenv("GPU_OPS_ONLY");
  if (only && *only && strcmp(only, kind)) return 0;
  snprintf(what, sizeof what, "%s (%s)", c->name, kind);
  FrontendOptions fo = {.float_dtype = dt};
  if (tmodel_open_prec(&t, c->name, c->src, &fo, precision ? precision : "fp32")) {
    fprintf(stderr, "FAIL %s: does not compile\n", what);
    return 1;
  }
  DuetProgram *p = &t.cp->prog;
  codegen_attach_cuda(t.cp, t.arena);
  DuetDevice *gd = duet_cuda_device(p, 0, 0, err, sizeof err);
  if (gd) { /* every kernel and GEMM also checked alone, from the same inputs */
    DuetDevice *ld = lockstep_device(gd, &t, what);
    if (!ld) {
      gd->ops->destroy(gd);
      snprintf(err, sizeof err, "out of memory");
    }
    gd = ld;
  }
  /* AdamW with eps = lr on both sides (test_cuda_emu.c's run_case says
   * why): its first update, lr g / (|g| + eps), then moves a param by at
   * most what its gradient differs by, where eps = 1e-8 turns a gradient
   * that is rounding noise into a step of +-lr of the noise's sign */
  DuetConfig cfg = p->defaults;
  DuetSession *gs = NULL;
  int fails = 0;
  if (cfg.optimizer == DUET_OPTIM_ADAMW && cfg.eps < cfg.lr) {
    cfg.eps = cfg.lr;
    duet_session_free(t.s);
    if (!(t.s = duet_session_new(p, t.dev, &cfg, err, sizeof err))) {
      fprintf(stderr, "FAIL %s: the CPU session: %s\n", what, err);
      fails = 1;
      goto out;
    }
  }
  gs = gd ? duet_session_new(p, gd, &cfg, err, sizeof err) : NULL;
  if (!gs && precision && !strcmp(precision, "bf16") && strstr(err, "need compute capability 8.0")) {
    printf("ok %s: refused on this card as expected (%s)\n", what, err);
    goto out;
  }
  if (!gs) {
    fprintf(stderr, "FAIL %s: %s\n", what, err);
    fails = 1;
    goto out;
  }
  DuetRng r1, r2;
  duet_rng_seed(&r1, 7, 0);
  duet_rng_seed(&r2, 7, 0);
  tmodel_fill(&t, t.s, &r1, c->classes);
  tmodel_fill(&t, gs, &r2, c->classes);
  /* eval (metrics: correct predictions, summed NLL) over every row */
  duet_session_set_valid(t.s, INT32_MAX);
  duet_session_set_valid(gs, INT32_MAX);
  /* evaluation before the step: AdamW's first update is +-lr whatever the
   * gradient's size, so a near-zero gradient of the other sign moves a
   * param by 2 lr, which a later forward pass amplifies */
  static const int runs[] = {DUET_RUN_GRAD, DUET_RUN_EVAL, DUET_RUN_TRAIN};
  const SessionTol tol16 = tmodel_session_tol16(&t); /* 16-bit programs: per tensor */
  CompareStats cs = {0};
  for (int k = 0; k < 3 && !fails; k++) {
    if (runs[k] == DUET_RUN_EVAL && p->n_eval == 0) continue;
    if (duet_session_run(t.s, runs[k]) || duet_session_run(gs, runs[k])) {
      fprintf(stderr, "FAIL %s: run failed: cpu '%s' gpu '%s'\n", what, duet_session_error(t.s),
              duet_session_error(gs));
      fails = 1;
      break;
    }
    char w2[160];
    snprintf(w2, sizeof w2, "%s after %s", what, k == 1 ? "evaluation" : k ? "a training step" : "forward + backward");
    fails += compare_sessions_stats(w2, p, t.s, gs, &tol16, &cs);
    DuetScaler a = duet_session_scaler(t.s), b = duet_session_scaler(gs);
    if (a.scale != b.scale || a.skipped != b.skipped) {
      fprintf(stderr, "FAIL %s: loss scale %g, %lld skipped steps; cpu %g, %lld\n", w2, b.scale,
              (long long)b.skipped, a.scale, (long long)a.skipped);
      fails++;
    }
  }
  fails += lockstep_stats(gd)->fails;
  printf("%s %s\n", fails ? "FAIL" : "ok", what);
  lockstep_print(what, lockstep_stats(gd), &cs);
out:
  duet_session_free(gs);
  if (gd) gd->ops->destroy(gd);
  tmodel_close(&t);
  return fails != 0;
}

int main(void) {
  char why[1024];
  int n = duet_cuda_gpu_count(why, sizeof why);
  if (n <= 0) {
    if (n == 0 || !strncmp(why, "no CUDA driver", 14) || strstr(why, "CUresult 34") || strstr(why, "CUresult 100")) {
      printf("SKIP: no GPU to test on: %s\n", why);
      return 77;
    }
    fprintf(stderr, "FAIL: a CUDA driver is present but the GPU backend is unusable: %s\n", why);
    return 1;
  }
  int failed = 0;
  for (int i = 0; i < N_OP_CASES; i++)
    for (int f = 0; f < 4; f++)
      failed += run_case(&cases[i], f == 1 ? DT_F64 : DT_F32, f == 2 ? "fp16" : f == 3 ? "bf16" : NULL);
  for (int i = 0; i < N_BIG_CASES; i++)
    for (int f = 0; f < 3; f++) failed += run_case(&big_cases[i], DT_F32, f == 1 ? "fp16" : f == 2 ? "bf16" : NULL);
  /* a forced fp16 gradient overflow: the unscale kernels' flags on the GPU
   * skip the step and halve the loss scale as on the CPU */
  Case ovf = {"overflow", "model t\nparam a: [64,300]\nparam b: [300,80]\ninput r: f32[64,80]\n"
                          "loss = mean((a @ b) * r) * 1000000\n", 0};
  failed += run_case(&ovf, DT_F32, "fp16");
  if (failed) fprintf(stderr, "%d cases failed\n", failed);
  else printf("ok: all cases agree with the CPU\n");
  return failed ? 1 : 0;
}
