/* tests/test_gpt_parity.c: the tiny GPT of tests/models/gpt_tiny.model
 * against PyTorch.  tests/ref/gpt_ref.py (offline, Debian's python3-torch)
 * built the same network, and tests/ref/gpt_tiny.safetensors holds its
 * initial weights, one batch, the logits, the loss, every parameter's
 * gradient and the losses of 10 AdamW steps.  This test loads the weights
 * into duet's float32 program and compares.  Tolerances: PyTorch's own
 * float32-vs-float64 noise on this fixture is at most 1.4e-7 (logits),
 * 7.9e-7 (loss) and 9.1e-8 (gradients) (tests/ref/README.md); summation
 * orders differ between the two, so we allow about 100x that:
 *   logits, gradients: atol 1e-5, rtol 1e-4;  loss and the 10-step curve:
 *   atol 2e-5.  Key-bias gradients are exactly zero in exact arithmetic
 *   (noise of 1e-11), which the absolute tolerance covers. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static int compare(const char *what, const float *got, const DuetStTensor *want, int64_t n, double atol, double rtol) {
  if (!want || want->dtype != DUET_F32 || want->nbytes != n * 4) {
    fprintf(stderr, "FAIL %s: missing or mis-shaped in the fixture\n", what);
    return 1;
  }
  const float *w = want->data;
  int64_t at = -1, bad = 0;
  for (int64_t i = 0; i < n; i++)
    if (!close_enough(got[i], w[i], atol, rtol)) { /* a NaN or an infinity fails */
      if (at < 0) at = i;
      bad++;
    }
  if (bad) {
    fprintf(stderr, "FAIL %s: %lld of %lld values off; e.g. [%lld] got %.9g want %.9g\n", what, (long long)bad,
            (long long)n, (long long)at, got[at], w[at]);
    return 1;
  }
  return 0;
}

int main(void) {
  char err[512];
  DuetStFile *ref = duet_st_open(DUET_SOURCE_DIR "/tests/ref/gpt_tiny.safetensors", err, sizeof err);
  if (!ref) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  char *src = slurp(DUET_SOURCE_DIR "/tests/models/gpt_tiny.model");
  TModel t;
  if (!src || tmodel_open(&t, "gpt_tiny.model", src, DT_F32)) return 1;
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
  fails += compare("logits", duet_session_tensor(t.s, tmodel_tensor(&t, t.g->logits)), duet_st_find(ref, "logits"),
                   shape_numel(&t.g->logits->shape), 1e-5, 1e-4), checks++;
  fails += compare("loss", duet_session_tensor(t.s, tmodel_tensor(&t, t.g->loss)), duet_st_find(ref, "loss"), 1, 2e-5, 0),
      checks++;
  for (int i = 0; i < t.g->n_values; i++) {
    Value *v = t.g->values[i];
    if (v->op != OP_PARAM) continue;
    char name[160];
    snprintf(name, sizeof name, "grad.%s", v->attr.name);
    fails += compare(name, duet_session_tensor(t.s, tmodel_tensor(&t, v->grad)), duet_st_find(ref, name),
                     shape_numel(&v->shape), 1e-5, 1e-4);
    checks++;
  }
  /* 10 AdamW steps on the same batch: the loss before each step */
  float losses[10];
  for (int s = 0; s < 10; s++) {
    if (duet_session_run(t.s, DUET_RUN_TRAIN)) return 1;
    losses[s] = *(float *)duet_session_tensor(t.s, tmodel_tensor(&t, t.g->loss));
  }
  fails += compare("10-step loss curve", losses, duet_st_find(ref, "losses"), 10, 2e-5, 0), checks++;
  printf("losses: ");
  for (int s = 0; s < 10; s++) printf("%.6f ", losses[s]);
  printf("\n%d passed, %d failed\n", checks - fails, fails);
  tmodel_close(&t);
  duet_st_close(ref);
  free(src);
  return fails != 0;
}
