/* tests/test_gpt_parity.c: the tiny GPT of tests/models/gpt_tiny.model
 * against PyTorch.  tests/ref/gpt_ref.py (offline, Debian's python3-torch)
 * built the same network, and tests/ref/gpt_tiny.safetensors holds its
 * initial weights, one batch, the logits, the loss, every parameter's
 * gradient and the losses of 10 AdamW steps.  This test loads the weights
 * into duet's float32 program and compares.
 *
 * Tolerances, from float32's unit roundoff u = 2^-24: a float32 sum of n
 * terms errs by about sqrt(n) u relative to the magnitude of its terms
 * (rounding errors of independent operations add like a random walk;
 * Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019); duet and PyTorch are
 * two independent evaluations, whose errors add in quadrature (sqrt 2); 4
 * such standard deviations are allowed:  tau = 4 sqrt(2 n) u, with n the
 * longest sum that feeds the result:
 *   - every gradient: n = 256 (the vocabulary sum d logits @ wte that
 *     starts the backward pass), tau = 90.5 u = 5.4e-6;
 *   - the logits: n = 128 (the MLP's 4C sum, the forward's longest),
 *     tau = 64 u = 3.8e-6;
 *   - the loss and the losses of 10 AdamW steps: n = 64 (the mean over the
 *     batch's 64 positions; the log-sum-exp over 256 bytes errs by about
 *     16 u absolute, under 3 u of a loss of 5.5), tau = 45 u = 2.7e-6.
 * Each tensor is compared normwise: max_i |duet_i - torch_i| <= tau x the
 * scale of the tensor, its largest |torch_i| (an error relative to each
 * entry would be meaningless where sums cancel: half the query and key
 * weights' gradients are under 1e-5 of a largest 1e-4).  The key biases'
 * gradients are zero in exact arithmetic (softmax ignores a constant added
 * to every key), so theirs are rounding noise of 1e-11: their scale is that
 * of the key weight's gradient in the same layer, whose sums (h^T dk,
 * against 1^T dk for the bias) have terms of the same size.  Measured
 * (x86-64, and the AVX2 build of COMMON.md): gradients at most 13 u, the
 * logits 3 u, the losses 3 u: 0.14 of tau or less.  The previous absolute
 * 1e-5 left the query and key gradients unchecked below 1e-5: a relative
 * error of 1e-3 in one of them passed; ctest gpt_parity_catches_* run this
 * test with one gradient perturbed (--perturb NAME REL, REL a number or
 * nan) and expect it to fail.
 *
 * `test_gpt_parity llama` checks tests/models/llama_tiny.model (RMSNorm,
 * rotary embeddings, grouped-query attention, SwiGLU, an untied head)
 * against tests/ref/llama_tiny.safetensors (tests/ref/llama_ref.py) the
 * same way: gradients n = 256 (the head's vocabulary sum d logits @ W^T),
 * the logits n = 64 (the SwiGLU down projection's hidden sum, the
 * forward's longest), the losses n = 64 (the batch's positions). */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define U32 0x1p-24

/* The largest fraction of its tolerance a tensor used, and which. */
static double worst_used;
static char worst_what[160];

static int compare(const char *what, const float *got, const DuetStTensor *want, int64_t n, double tau, double scale) {
  if (!want || want->dtype != DUET_F32 || want->nbytes != n * 4) {
    fprintf(stderr, "FAIL %s: missing or mis-shaped in the fixture\n", what);
    return 1;
  }
  double used;
  int bad = check_normwise(what, got, want->data, n, tau, scale, &used); /* a NaN or an infinity fails */
  if (!bad && used > 0.5) printf("note %s: error %.2f of its tolerance\n", what, used);
  if (!bad && used > worst_used) worst_used = used, snprintf(worst_what, sizeof worst_what, "%s", what);
  return bad;
}

/* --perturb NAME REL: multiplies duet's tensor NAME (logits, loss or
 * grad.PARAM) by 1 + REL before the comparison, or with REL nan sets its
 * first entry to NaN: the tolerances must catch it. */
static void perturb(TModel *t, const char *name, const char *rel) {
  Value *v = !strcmp(name, "logits") ? t->g->logits : !strcmp(name, "loss") ? t->g->loss : NULL;
  if (!v && !strncmp(name, "grad.", 5) && tmodel_param(t, name + 5)) v = tmodel_param(t, name + 5)->grad;
  if (!v) {
    fprintf(stderr, "test_gpt_parity: --perturb: no tensor %s\n", name);
    exit(2);
  }
  float *x = duet_session_tensor(t->s, tmodel_tensor(t, v));
  int64_t n = shape_numel(&v->shape);
  if (!strcmp(rel, "nan")) x[0] = NAN;
  else
    for (int64_t i = 0; i < n; i++) x[i] *= (float)(1 + atof(rel));
  printf("perturbed %s (%lld values) by %s\n", name, (long long)n, rel);
}

int main(int argc, char **argv) {
  bool llama = argc > 1 && !strcmp(argv[1], "llama");
  if (llama) argc--, argv++;
  const char *pert_name = argc == 4 && !strcmp(argv[1], "--perturb") ? argv[2] : NULL;
  if (argc != 1 && !pert_name) {
    fprintf(stderr, "usage: %s [llama] [--perturb NAME REL]\n", argv[0]);
    return 2;
  }
  char err[512];
  DuetStFile *ref = duet_st_open(llama ? DUET_SOURCE_DIR "/tests/ref/llama_tiny.safetensors"
                                       : DUET_SOURCE_DIR "/tests/ref/gpt_tiny.safetensors", err, sizeof err);
  if (!ref) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  char *src = slurp(llama ? DUET_SOURCE_DIR "/tests/models/llama_tiny.model" : DUET_SOURCE_DIR "/tests/models/gpt_tiny.model");
  TModel t;
  if (!src || tmodel_open(&t, llama ? "llama_tiny.model" : "gpt_tiny.model", src, DT_F32)) return 1;
  int fails = 0, checks = 0;
  /* weights and batch */
  for (int i = 0; i < t.g->n_values; i++) {
    Value *v = t.g->values[i];
    if (v->op != OP_PARAM && v->op != OP_INPUT) continue;
    const DuetStTensor *w = duet_st_find(ref, v->attr.name);
    int64_t bytes = (int64_t)dtype_size(v->dtype) * shape_numel(&v->shape);
    if (!w || w->nbytes != bytes) {
      fprintf(stderr, "FAIL: fixture lacks %s of %lld bytes\n", v->attr.name, (long long)bytes);
      return 1;
    }
    memcpy(duet_session_tensor(t.s, tmodel_tensor(&t, v)), w->data, (size_t)bytes);
  }
  if (duet_session_run(t.s, DUET_RUN_GRAD)) return 1;
  if (pert_name) perturb(&t, pert_name, argv[3]);
  const double tau_grad = 4 * sqrt(2 * 256.0) * U32, tau_logits = 4 * sqrt(2 * (llama ? 64.0 : 128.0)) * U32,
               tau_loss = 4 * sqrt(2 * 64.0) * U32;
  fails += compare("logits", duet_session_tensor(t.s, tmodel_tensor(&t, t.g->logits)), duet_st_find(ref, "logits"),
                   shape_numel(&t.g->logits->shape), tau_logits, 0), checks++;
  fails += compare("loss", duet_session_tensor(t.s, tmodel_tensor(&t, t.g->loss)), duet_st_find(ref, "loss"), 1,
                   tau_loss, 0), checks++;
  for (int i = 0; i < t.g->n_values; i++) {
    Value *v = t.g->values[i];
    if (v->op != OP_PARAM) continue;
    char name[160];
    snprintf(name, sizeof name, "grad.%s", v->attr.name);
    double scale = 0; /* the tensor's own largest entry */
    const char *dot = strrchr(v->attr.name, '.');
    if (dot && !strcmp(dot, ".b") && dot - v->attr.name >= 8 && !strncmp(dot - 8, ".linear2", 8)) {
      /* a key bias: the scale of the key weight's gradient */
      char wname[160];
      snprintf(wname, sizeof wname, "grad.%.*s.w", (int)(dot - v->attr.name), v->attr.name);
      const DuetStTensor *kw = duet_st_find(ref, wname);
      for (int64_t j = 0; kw && j < kw->nbytes / 4; j++) scale = fmax(scale, fabs(((const float *)kw->data)[j]));
      if (!(scale > 0)) {
        fprintf(stderr, "FAIL %s: no scale from %s\n", name, wname);
        fails++;
        continue;
      }
    }
    fails += compare(name, duet_session_tensor(t.s, tmodel_tensor(&t, v->grad)), duet_st_find(ref, name),
                     shape_numel(&v->shape), tau_grad, scale);
    checks++;
  }
  /* 10 AdamW steps on the same batch: the loss before each step */
  float losses[10];
  for (int s = 0; s < 10; s++) {
    if (duet_session_run(t.s, DUET_RUN_TRAIN)) return 1;
    losses[s] = *(float *)duet_session_tensor(t.s, tmodel_tensor(&t, t.g->loss));
  }
  /* the 10-step loss curve: each loss against its own magnitude */
  const DuetStTensor *ls = duet_st_find(ref, "losses");
  int curve_bad = 0;
  if (!ls || ls->dtype != DUET_F32 || ls->nbytes != 40) {
    fprintf(stderr, "FAIL losses: missing or mis-shaped in the fixture\n");
    curve_bad = 1;
  }
  for (int s = 0; s < 10 && !curve_bad; s++) {
    char what[64];
    snprintf(what, sizeof what, "loss before AdamW step %d", s + 1);
    curve_bad |= check_normwise(what, &losses[s], (const float *)ls->data + s, 1, tau_loss, 0, NULL);
  }
  fails += curve_bad, checks++;
  printf("losses: ");
  for (int s = 0; s < 10; s++) printf("%.6f ", losses[s]);
  printf("\nworst: %.3f of the tolerance (%s)\n%d passed, %d failed\n", worst_used, worst_what, checks - fails, fails);
  tmodel_close(&t);
  duet_st_close(ref);
  free(src);
  return fails != 0;
}
