/* tests/test_optimizer.c: AdamW and SGD updates of the generated kernels
 * against (a) values computed by hand for the first steps and (b) a float64
 * reference loop written from the algorithms in PyTorch's documentation
 * (torch.optim.AdamW, torch.optim.SGD).  The model is loss = mean(w * x), so
 * d loss / d w_j = x_j / n exactly. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define N 4
static const double w0[N] = {0.5, -0.25, 1.5, 0.0};
static const double xv[N] = {2.0, 1.0, -0.5, 3.0};
static const double lr = 0.1, wd = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, mom = 0.9;

static int setup(TModel *t, const char *opt, DType dt) {
  char src[512];
  snprintf(src, sizeof src,
           "model opt\ninput x: f32[%d]\nparam w: [%d] = uniform(-1, 1)\nloss = mean(w * x)\n"
           "train {\n  optimizer = %s\n}\n",
           N, N, opt);
  if (tmodel_open(t, "opt.model", src, dt)) return 1;
  Value *w = tmodel_param(t, "w");
  void *pw = duet_session_tensor(t->s, tmodel_tensor(t, w));
  void *px = duet_session_tensor(t->s, t->cp->prog.input_x);
  for (int j = 0; j < N; j++) {
    if (dt == DT_F64) ((double *)pw)[j] = w0[j], ((double *)px)[j] = xv[j];
    else ((float *)pw)[j] = (float)w0[j], ((float *)px)[j] = (float)xv[j];
  }
  return 0;
}

static double wget(TModel *t, int j, DType dt) {
  void *pw = duet_session_tensor(t->s, tmodel_tensor(t, tmodel_param(t, "w")));
  return dt == DT_F64 ? ((double *)pw)[j] : ((float *)pw)[j];
}

static int test_adamw(DType dt, double rtol) {
  TModel t;
  int fails = 0;
  if (setup(&t, "adamw(lr = 0.1, weight_decay = 0.01)", dt)) return 1;
  double w[N], m[N] = {0}, v[N] = {0};
  memcpy(w, w0, sizeof w);
  for (int step = 1; step <= 5; step++) {
    if (duet_session_run(t.s, DUET_RUN_TRAIN)) return 1;
    for (int j = 0; j < N; j++) { /* reference, torch.optim.AdamW docs */
      double g = xv[j] / N;
      w[j] -= lr * wd * w[j];
      m[j] = b1 * m[j] + (1 - b1) * g;
      v[j] = b2 * v[j] + (1 - b2) * g * g;
      double mh = m[j] / (1 - pow(b1, step)), vh = v[j] / (1 - pow(b2, step));
      w[j] -= lr * mh / (sqrt(vh) + eps);
      char what[96];
      snprintf(what, sizeof what, "adamw %s step %d w[%d]", dtype_name(dt), step, j);
      fails += check_close(what, wget(&t, j, dt), w[j], 1e-7, rtol);
    }
    if (step == 1) {
      /* by hand: m^ = g, v^ = g^2, so w1 = w0 (1 - lr wd) - lr g / (|g| + eps);
       * w0 = 0.5, g = 0.5: 0.4995 - 0.1 * 0.5 / 0.50000001 = 0.39950000199999996 */
      fails += check_close("adamw step 1 by hand", wget(&t, 0, dt), 0.39950000199999996, 1e-7, rtol);
      /* w0 = 0, g = 0.75: 0 - 0.1 * 0.75 / 0.75000001 = -0.099999998666666685 */
      fails += check_close("adamw step 1 by hand (w0 = 0)", wget(&t, 3, dt), -0.099999998666666685, 1e-7, rtol);
    }
  }
  tmodel_close(&t);
  return fails;
}

static int test_sgd(DType dt, double rtol) {
  TModel t;
  int fails = 0;
  if (setup(&t, "sgd(lr = 0.1, momentum = 0.9, weight_decay = 0.01)", dt)) return 1;
  double w[N], buf[N] = {0};
  memcpy(w, w0, sizeof w);
  for (int step = 1; step <= 5; step++) {
    if (duet_session_run(t.s, DUET_RUN_TRAIN)) return 1;
    for (int j = 0; j < N; j++) { /* reference, torch.optim.SGD docs */
      double d = xv[j] / N + wd * w[j];
      buf[j] = step == 1 ? d : mom * buf[j] + d;
      w[j] -= lr * buf[j];
      char what[96];
      snprintf(what, sizeof what, "sgd %s step %d w[%d]", dtype_name(dt), step, j);
      fails += check_close(what, wget(&t, j, dt), w[j], 1e-7, rtol);
    }
    /* by hand, w0 = 0.5, g = 0.5: d1 = 0.505, w1 = 0.4495;
     * d2 = 0.5 + 0.004495 = 0.504495, buf2 = 0.4545 + 0.504495 = 0.958995, w2 = 0.3536005 */
    if (step == 1) fails += check_close("sgd step 1 by hand", wget(&t, 0, dt), 0.4495, 1e-7, rtol);
    if (step == 2) fails += check_close("sgd step 2 by hand", wget(&t, 0, dt), 0.3536005, 1e-7, rtol);
  }
  tmodel_close(&t);
  return fails;
}

int main(void) {
  int failed = 0, n = 0;
  int (*tests[])(DType, double) = {test_adamw, test_sgd};
  const char *names[] = {"adamw", "sgd"};
  for (int i = 0; i < 2; i++) {
    int f64 = tests[i](DT_F64, 1e-12), f32 = tests[i](DT_F32, 1e-6);
    printf("%s %s (f64, f32)\n", f64 + f32 ? "FAIL" : "ok", names[i]);
    failed += (f64 + f32) != 0;
    n++;
  }
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed != 0;
}
