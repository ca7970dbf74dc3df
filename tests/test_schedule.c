#define _POSIX_C_SOURCE 200809L /* mkstemp */
/* tests/test_schedule.c: learning-rate schedules and gradient clipping
 * against PyTorch values produced offline by committed scripts:
 *   1. duet_lr_at for every case of tests/ref/lr_ref.h (tools/gen_lr_ref.py:
 *      torch.optim.lr_scheduler's own LinearLR / CosineAnnealingLR /
 *      ConstantLR chained by SequentialLR), within 1e-14 of the base rate
 *      (torch computes the chains recursively, duet in closed form: they
 *      differ by a few ulps);
 *   2. six AdamW steps of a tiny MLP with cosine(warmup = 2, min_lr =
 *      0.005) and clip_grad_norm = 1.5 (tests/ref/clip_ref.h,
 *      tools/gen_clip_ref.py: torch.nn.utils.clip_grad_norm_; steps 1-3
 *      clip, 4-6 do not): the rate, the norm, the loss and the weights of
 *      every step, within float32 noise (the fixture's f32 - f64 noise is
 *      2.7e-7; the bound is 1e-5 of a tensor's largest weight, 2e-6
 *      relative for the norm and the loss, the rate within 1e-14);
 *   3. resume: 3 steps, a checkpoint, a new session loading it and 3 more
 *      steps end with the bytes of 6 uninterrupted steps (the rate is a
 *      function of the step; the norm too is measured again).
 * Pipelines and data parallelism: tests/run_pipeline.sh and
 * tests/run_data_parallel.sh. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ref/clip_ref.h"
#include "ref/lr_ref.h"
#include "test_util.h"

static const char *const names[4] = {"w1", "b1", "w2", "b2"};
static const int sizes[4] = {30, 5, 15, 3};

static const char *model_src =
    "model clipref\n"
    "input x: f32[8, 6]\n"
    "input y: i32[8]\n"
    "param w1: [6, 5] = zeros\n"
    "param b1: [5] = zeros\n"
    "param w2: [5, 3] = zeros\n"
    "param b2: [3] = zeros\n"
    "loss = cross_entropy(relu(x @ w1 + b1) @ w2 + b2, y)\n"
    "train {\n"
    "  optimizer = adamw(lr = 0.05, weight_decay = 0.01)\n"
    "  lr_schedule = cosine(warmup = 2, min_lr = 0.005)\n"
    "  clip_grad_norm = 1.5\n"
    "  steps = 6\n"
    "}\n";

static int test_lr_refs(void) {
  int fails = 0;
  for (size_t c = 0; c < sizeof lr_refs / sizeof *lr_refs; c++) {
    const LrRef *r = &lr_refs[c];
    DuetConfig cfg = {.lr = r->lr, .min_lr = r->min_lr, .warmup = r->warmup, .lr_schedule = r->schedule};
    char err[256];
    if (duet_lr_schedule_check(&cfg, r->total, err, sizeof err)) {
      fprintf(stderr, "FAIL %s: %s\n", r->name, err);
      fails++;
    }
    for (long long k = 0; k < r->total; k++) {
      char what[96];
      snprintf(what, sizeof what, "lr %s step %lld", r->name, k + 1);
      fails += check_close(what, duet_lr_at(&cfg, k + 1, r->total), r->rate[k], 1e-14 * r->lr, 0);
    }
  }
  /* the errors: warm-up longer than the run, min_lr above lr */
  char err[256];
  DuetConfig bad = {.lr = 1e-3, .warmup = 11, .lr_schedule = DUET_LR_COSINE};
  if (!duet_lr_schedule_check(&bad, 10, err, sizeof err) ||
      strcmp(err, "the warm-up (--warmup 11) is longer than the run (10 steps)")) {
    fprintf(stderr, "FAIL warm-up longer than the run: '%s'\n", err);
    fails++;
  }
  bad = (DuetConfig){.lr = 1e-3, .min_lr = 0.01, .lr_schedule = DUET_LR_LINEAR};
  if (!duet_lr_schedule_check(&bad, 10, err, sizeof err) ||
      strcmp(err, "--min-lr 0.01 is above the learning rate 0.001 (--lr): the linear schedule decays from --lr down "
                  "to --min-lr")) {
    fprintf(stderr, "FAIL min_lr above lr: '%s'\n", err);
    fails++;
  }
  printf("%s lr schedules: %zu torch cases\n", fails ? "FAIL" : "ok", sizeof lr_refs / sizeof *lr_refs);
  return fails;
}

/* The fixture's initial weights and batch into session s of t's program. */
static int load_ref(TModel *t, DuetSession *s) {
  const DuetProgram *p = &t->cp->prog;
  const double *init[4] = {clip_ref_init_w1, clip_ref_init_b1, clip_ref_init_w2, clip_ref_init_b2};
  for (int k = 0; k < 4; k++) {
    float w[30];
    for (int i = 0; i < sizes[k]; i++) w[i] = (float)init[k][i];
    if (duet_session_write(s, tmodel_tensor(t, tmodel_param(t, names[k])), 0, w, (size_t)sizes[k] * sizeof *w))
      return 1;
  }
  float x[48];
  int32_t y[8];
  for (int i = 0; i < 48; i++) x[i] = (float)clip_ref_x[i];
  for (int i = 0; i < 8; i++) y[i] = clip_ref_y[i];
  return duet_session_write(s, p->input_x, 0, x, sizeof x) || duet_session_write(s, p->input_y, 0, y, sizeof y);
}

/* Reads the four params of session s into w (w1, b1, w2, b2 back to back). */
static int read_params(TModel *t, DuetSession *s, float *w) {
  for (int k = 0, off = 0; k < 4; off += sizes[k], k++)
    if (duet_session_read(s, tmodel_tensor(t, tmodel_param(t, names[k])), 0, w + off, (size_t)sizes[k] * sizeof *w))
      return 1;
  return 0;
}

static int test_clip_ref(void) {
  TModel t;
  int fails = 0;
  if (tmodel_open(&t, "clipref.model", model_src, DT_F32)) return 1;
  const DuetProgram *p = &t.cp->prog;
  if (p->n_clip != 4 || p->defaults.clip_grad_norm != CLIP_REF_MAX_NORM || p->defaults.lr_schedule != DUET_LR_COSINE) {
    fprintf(stderr, "FAIL clipref: %d clipped gradients, limit %g, schedule %d\n", p->n_clip,
            p->defaults.clip_grad_norm, p->defaults.lr_schedule);
    tmodel_close(&t);
    return 1;
  }
  duet_session_set_total(t.s, CLIP_REF_STEPS);
  if (load_ref(&t, t.s)) {
    fprintf(stderr, "FAIL clipref: %s\n", duet_session_error(t.s));
    tmodel_close(&t);
    return 1;
  }
  const double *after[4] = {clip_ref_after_w1, clip_ref_after_b1, clip_ref_after_w2, clip_ref_after_b2};
  double worst = 0;
  for (int step = 1; step <= CLIP_REF_STEPS && !fails; step++) {
    if (duet_session_run(t.s, DUET_RUN_TRAIN)) {
      fprintf(stderr, "FAIL clipref step %d: %s\n", step, duet_session_error(t.s));
      fails++;
      break;
    }
    char what[96];
    float loss;
    duet_session_read(t.s, p->loss, 0, &loss, sizeof loss);
    snprintf(what, sizeof what, "clipref step %d: loss", step);
    fails += check_close(what, loss, clip_ref_loss[step - 1], 0, 2e-6);
    snprintf(what, sizeof what, "clipref step %d: lr", step);
    fails += check_close(what, duet_session_lr(t.s), clip_ref_lr[step - 1], 1e-14, 0);
    snprintf(what, sizeof what, "clipref step %d: grad norm", step);
    fails += check_close(what, duet_session_grad_norm(t.s), clip_ref_norm[step - 1], 0, 2e-6);
    float w[53];
    read_params(&t, t.s, w);
    for (int k = 0, off = 0; k < 4; off += sizes[k], k++) {
      float want[30];
      for (int i = 0; i < sizes[k]; i++) want[i] = (float)after[k][(step - 1) * sizes[k] + i];
      snprintf(what, sizeof what, "clipref step %d: %s", step, names[k]);
      double r;
      fails += check_normwise(what, w + off, want, sizes[k], 1e-5, 0, &r);
      if (r > worst) worst = r;
    }
  }
  printf("%s clip_grad_norm + cosine schedule against torch: %d AdamW steps, weights within %.2g of the bound\n",
         fails ? "FAIL" : "ok", CLIP_REF_STEPS, worst);
  tmodel_close(&t);
  return fails;
}

/* 3 steps, checkpoint, 3 more in a new session: the bytes of 6 straight. */
static int test_resume(void) {
  TModel t;
  int fails = 0;
  char err[512], path[] = "/tmp/duet-sched-XXXXXX";
  if (tmodel_open(&t, "clipref.model", model_src, DT_F32)) return 1;
  const DuetProgram *p = &t.cp->prog;
  DuetConfig cfg = p->defaults;
  cfg.quiet = 1;
  float straight[53], resumed[53];
  DuetSession *a = duet_session_new(p, t.dev, &cfg, err, sizeof err);
  DuetSession *b = duet_session_new(p, t.dev, &cfg, err, sizeof err);
  DuetSession *c = duet_session_new(p, t.dev, &cfg, err, sizeof err);
  int fd = mkstemp(path);
  if (!a || !b || !c || fd < 0 || load_ref(&t, a) || load_ref(&t, b) || load_ref(&t, c)) {
    fprintf(stderr, "FAIL resume: set-up: %s\n", err);
    fails = 1;
    goto out;
  }
  close(fd);
  duet_session_set_total(a, 6);
  duet_session_set_total(b, 6);
  duet_session_set_total(c, 6);
  for (int k = 0; k < 6 && !fails; k++) fails += duet_session_run(a, DUET_RUN_TRAIN) != 0;
  for (int k = 0; k < 3 && !fails; k++) fails += duet_session_run(b, DUET_RUN_TRAIN) != 0;
  DuetTrainState st = {.step = 3, .epoch = 1, .batch = 3}, got;
  if (fails || duet_checkpoint_save(b, path, &st, err, sizeof err) || duet_checkpoint_load(c, path, &got, err,
                                                                                            sizeof err)) {
    fprintf(stderr, "FAIL resume: %s\n", fails ? "a run failed" : err);
    fails = 1;
    goto out;
  }
  for (int k = 0; k < 3 && !fails; k++) fails += duet_session_run(c, DUET_RUN_TRAIN) != 0;
  read_params(&t, a, straight);
  read_params(&t, c, resumed);
  if (fails || memcmp(straight, resumed, sizeof straight) || duet_session_lr(a) != duet_session_lr(c) ||
      duet_session_step(c) != 6) {
    fprintf(stderr, "FAIL resume: 3 + 3 steps differ from 6 (lr %.17g vs %.17g, step %lld)\n", duet_session_lr(c),
            duet_session_lr(a), (long long)duet_session_step(c));
    fails = 1;
  }
  printf("%s resume: 3 steps + checkpoint + 3 steps == 6 steps, bit for bit (schedule and clipping)\n",
         fails ? "FAIL" : "ok");
out:
  unlink(path);
  duet_session_free(a);
  duet_session_free(b);
  duet_session_free(c);
  tmodel_close(&t);
  return fails;
}

int main(void) {
  int fails = test_lr_refs();
  fails += test_clip_ref();
  fails += test_resume();
  return fails != 0;
}
