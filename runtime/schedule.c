/* runtime/schedule.c: learning-rate schedules (warm-up, cosine and linear
 * decay).  Formulas and sources: duet_lr_at in duet_rt.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "duet_rt.h"

static const char *const lr_names[] = {"constant", "cosine", "linear"};
static const double pi = 3.14159265358979323846; /* M_PI is not C11 */

const char *duet_lr_schedule_name(int kind) {
  return kind >= 0 && kind < (int)(sizeof lr_names / sizeof *lr_names) ? lr_names[kind] : NULL;
}

int duet_parse_lr_schedule(const char *val, int *out) {
  for (int k = 0; k < (int)(sizeof lr_names / sizeof *lr_names); k++)
    if (!strcmp(val, lr_names[k])) {
      *out = k;
      return 0;
    }
  fprintf(stderr, "duet: error: --lr-schedule expects constant, cosine or linear, got '%s'\n", val);
  return 1;
}

double duet_lr_at(const DuetConfig *c, int64_t step, int64_t total) {
  int64_t k = step - 1, W = c->warmup > 0 ? c->warmup : 0, T = total;
  if (k < W) return c->lr * (double)(k + 1) / (double)W;
  if (T <= 0 || c->lr_schedule == DUET_LR_CONSTANT) return c->lr;
  if (k >= T) k = T - 1; /* past the run (not reached in training): its last rate */
  if (c->lr_schedule == DUET_LR_COSINE)
    return c->min_lr + (c->lr - c->min_lr) * (1.0 + cos(pi * (double)(k - W) / (double)(T - W))) / 2.0;
  /* the remaining fraction: exactly 0 at the last step, which then runs at min_lr */
  double rest = T - 1 > W ? (double)(T - 1 - k) / (double)(T - 1 - W) : 0.0;
  return c->min_lr + (c->lr - c->min_lr) * rest;
}

int duet_lr_schedule_check(const DuetConfig *cfg, int64_t total, char *err, size_t errlen) {
  if (cfg->warmup > total) {
    snprintf(err, errlen, "the warm-up (--warmup %lld) is longer than the run (%lld step%s)", (long long)cfg->warmup,
             (long long)total, total == 1 ? "" : "s");
    return -1;
  }
  if (cfg->lr_schedule != DUET_LR_CONSTANT && cfg->min_lr > cfg->lr) {
    snprintf(err, errlen, "--min-lr %g is above the learning rate %g (--lr): the %s schedule decays from --lr down "
             "to --min-lr", cfg->min_lr, cfg->lr, duet_lr_schedule_name(cfg->lr_schedule));
    return -1;
  }
  return 0;
}

void duet_lr_schedule_str(const DuetConfig *cfg, int64_t total, char *buf, size_t n) {
  const char *name = duet_lr_schedule_name(cfg->lr_schedule);
  int len = snprintf(buf, n, "%s", name ? name : "?");
  if (cfg->lr_schedule != DUET_LR_CONSTANT && len >= 0 && (size_t)len < n)
    len += snprintf(buf + len, n - (size_t)len, " to %g", cfg->min_lr);
  if (cfg->warmup > 0 && len >= 0 && (size_t)len < n)
    len += snprintf(buf + len, n - (size_t)len, "%s warmup %lld", cfg->lr_schedule == DUET_LR_CONSTANT ? "," : " after",
                    (long long)cfg->warmup);
  if (cfg->lr_schedule != DUET_LR_CONSTANT && len >= 0 && (size_t)len < n)
    snprintf(buf + len, n - (size_t)len, " over %lld steps", (long long)total);
}
