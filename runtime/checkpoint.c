#define _POSIX_C_SOURCE 200809L /* clock_gettime, fsync, fdopen */
/* runtime/checkpoint.c: training checkpoints as safetensors files. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "duet_rt.h"

#define CKPT_FORMAT "duet-checkpoint-1"

static int is_saved(const DuetTensor *t) { return t->region == DUET_MEM_PARAM || t->region == DUET_MEM_STATE; }

/* The precision p was compiled for, as --precision names it: the 16-bit
 * storage dtype of its activations when it has one (fp16, bf16), else the
 * dtype of its floats (fp32, or f64 for an f64 model). */
static const char *program_precision(const DuetProgram *p) {
  const char *name = "fp32";
  for (int i = 0; i < p->n_tensors; i++) {
    int dt = p->tensors[i].dtype;
    if (dt == DUET_F16 || dt == DUET_BF16) return dt == DUET_F16 ? "fp16" : "bf16";
    if (dt == DUET_F64) name = "f64";
  }
  return name;
}

int duet_checkpoint_save(DuetSession *s, const char *path, const DuetTrainState *st, char *err, size_t errlen) {
  const DuetProgram *p = duet_session_program(s);
  DuetStTensor *t = calloc((size_t)p->n_tensors + 1, sizeof *t);
  void **host = calloc((size_t)p->n_tensors + 1, sizeof *host);
  int n = 0, rc = -1;
  if (!t || !host) {
    snprintf(err, errlen, "cannot save %s: out of host memory", path);
    goto out;
  }
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *x = &p->tensors[i];
    if (!is_saved(x)) continue;
    if (!(host[n] = malloc((size_t)x->nbytes + 1)) || duet_session_read(s, i, 0, host[n], (size_t)x->nbytes)) {
      snprintf(err, errlen, "cannot save %s: copying %s from the device failed%s%s", path, x->name,
               host[n] ? ": " : "", host[n] ? duet_session_error(s) : " (out of host memory)");
      n++;
      goto out;
    }
    t[n] = (DuetStTensor){.name = x->name, .dtype = x->dtype, .rank = x->rank, .data = host[n], .nbytes = x->nbytes};
    memcpy(t[n].shape, x->shape, sizeof x->shape);
    n++;
  }
  char step[32], epoch[32], batch[32], rng[80];
  snprintf(step, sizeof step, "%" PRId64, st->step);
  snprintf(epoch, sizeof epoch, "%" PRId64, st->epoch);
  snprintf(batch, sizeof batch, "%" PRId64, st->batch);
  snprintf(rng, sizeof rng, "%016" PRIx64 " %016" PRIx64 " %016" PRIx64 " %016" PRIx64, st->rng.s[0], st->rng.s[1],
           st->rng.s[2], st->rng.s[3]);
  /* fp16: the loss scaler (scale exact as %a hex, growth tracker, skipped steps) */
  DuetScaler sc = duet_session_scaler(s);
  char scale[40], growth[32], skipped[32];
  snprintf(scale, sizeof scale, "%a", sc.scale);
  snprintf(growth, sizeof growth, "%" PRId64, sc.growth);
  snprintf(skipped, sizeof skipped, "%" PRId64, sc.skipped);
  /* what decides the data order: checked (a warning) on resume */
  const DuetConfig *cfg = duet_session_config(s);
  char seed[32], bsz[32], subset[32];
  snprintf(seed, sizeof seed, "%" PRIu64, cfg->seed);
  snprintf(bsz, sizeof bsz, "%" PRId64, cfg->batch);
  snprintf(subset, sizeof subset, "%" PRId64, cfg->train_subset);
  const char *meta[] = {"format", CKPT_FORMAT, "model",      p->model_name, "step",          step,
                        "epoch",  epoch,       "batch",      batch,         "rng",           rng,
                        "seed",   seed,        "batch_size", bsz,           "train_subset",  subset,
                        "precision", program_precision(p),
                        "loss_scale", scale, "loss_scale_growth", growth, "skipped_steps", skipped};
  rc = duet_st_save(path, t, n, meta, p->n_unscale ? 13 : 10, err, errlen);
out:
  for (int i = 0; i < n; i++) free(host[i]);
  free(host);
  free(t);
  return rc;
}

static int meta_i64(const DuetStFile *f, const char *key, int64_t *out) {
  const char *v = duet_st_meta(f, key);
  char *end;
  if (!v) return -1;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || x < 0) return -1;
  *out = x;
  return 0;
}

static int load(DuetSession *s, const char *path, DuetTrainState *st, int weights_only, char *err, size_t errlen);

int duet_checkpoint_load(DuetSession *s, const char *path, DuetTrainState *st, char *err, size_t errlen) {
  return load(s, path, st, 0, err, errlen);
}

int duet_checkpoint_load_weights(DuetSession *s, const char *path, char *err, size_t errlen) {
  DuetTrainState st;
  return load(s, path, &st, 1, err, errlen);
}

static int load(DuetSession *s, const char *path, DuetTrainState *st, int weights_only, char *err, size_t errlen) {
  const DuetProgram *p = duet_session_program(s);
  char e2[512];
  DuetStFile *f = duet_st_open(path, e2, sizeof e2);
  if (!f) {
    snprintf(err, errlen, "cannot %s: %s", weights_only ? "load the checkpoint" : "resume", e2);
    return -1;
  }
  int rc = -1, n_saved = 0;
  const char *fmt = duet_st_meta(f, "format"), *model = duet_st_meta(f, "model"), *rng = duet_st_meta(f, "rng");
  DuetTrainState ns = {0};
  if (!fmt || strcmp(fmt, CKPT_FORMAT)) {
    snprintf(err, errlen, "cannot %s %s: not a duet checkpoint (metadata format is %s%s%s, expected %s)", weights_only ? "load" : "resume from", path,
             fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "", CKPT_FORMAT);
    goto out;
  }
  if (!model || strcmp(model, p->model_name)) {
    snprintf(err, errlen, "cannot %s %s: it is a checkpoint of model `%s`, not `%s`", weights_only ? "load" : "resume from", path,
             model ? model : "?", p->model_name);
    goto out;
  }
  if (meta_i64(f, "step", &ns.step) || meta_i64(f, "epoch", &ns.epoch) || meta_i64(f, "batch", &ns.batch) || !rng ||
      sscanf(rng, "%" SCNx64 " %" SCNx64 " %" SCNx64 " %" SCNx64, &ns.rng.s[0], &ns.rng.s[1], &ns.rng.s[2],
             &ns.rng.s[3]) != 4) {
    snprintf(err, errlen, "cannot %s %s: corrupt training state in its metadata", weights_only ? "load" : "resume from", path);
    goto out;
  }
  /* fp16 programs: the loss scaler; a checkpoint of an fp32 run starts it afresh */
  DuetScaler sc = duet_session_scaler(s);
  const char *scale = duet_st_meta(f, "loss_scale");
  if (!weights_only && p->n_unscale && scale) {
    char *end;
    sc.scale = strtod(scale, &end);
    if (end == scale || *end || !(sc.scale > 0) || meta_i64(f, "loss_scale_growth", &sc.growth) ||
        meta_i64(f, "skipped_steps", &sc.skipped) || sc.skipped > ns.step) {
      snprintf(err, errlen, "cannot %s %s: corrupt loss scaler state in its metadata", weights_only ? "load" : "resume from", path);
      goto out;
    }
  }
  /* check everything before changing anything */
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *x = &p->tensors[i];
    if (!is_saved(x) || (weights_only && x->region != DUET_MEM_PARAM)) continue;
    n_saved++;
    const DuetStTensor *y = duet_st_find(f, x->name);
    if (!y) {
      snprintf(err, errlen, "cannot %s %s: it has no tensor `%s`", weights_only ? "load" : "resume from", path, x->name);
      goto out;
    }
    int same = y->dtype == x->dtype && y->rank == x->rank && y->nbytes == x->nbytes;
    for (int k = 0; same && k < x->rank; k++) same = y->shape[k] == x->shape[k];
    if (!same) {
      snprintf(err, errlen, "cannot %s %s: tensor `%s` has another dtype or shape than the model's", weights_only ? "load" : "resume from", path,
               x->name);
      goto out;
    }
  }
  if (!weights_only && duet_st_count(f) != n_saved) {
    snprintf(err, errlen, "cannot %s %s: it holds %d tensors, the model has %d params and state tensors", weights_only ? "load" : "resume from", path,
             duet_st_count(f), n_saved);
    goto out;
  }
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *x = &p->tensors[i];
    if (!is_saved(x) || (weights_only && x->region != DUET_MEM_PARAM)) continue;
    const DuetStTensor *y = duet_st_find(f, x->name);
    if (duet_session_write(s, i, 0, y->data, (size_t)y->nbytes)) {
      snprintf(err, errlen, "cannot %s %s: copying %s to the device failed: %s", weights_only ? "load" : "resume from", path, x->name, duet_session_error(s));
      goto out;
    }
  }
  if (!weights_only) duet_session_set_step(s, ns.step);
  if (!weights_only) duet_session_set_scaler(s, &sc);
  /* settings that change the data order or the arithmetic: the run goes on
   * (the params are f32 master weights, with their optimizer state, in every
   * precision; an fp16 run without the checkpoint's loss scaler starts it
   * afresh), but not as the uninterrupted one would have (checkpoints of
   * older duet lack them) */
  const DuetConfig *cfg = duet_session_config(s);
  struct {
    const char *key, *flag;
    int64_t now;
  } same[] = {{"seed", "--seed", (int64_t)cfg->seed}, {"batch_size", "--batch", cfg->batch},
              {"train_subset", "--train-subset", cfg->train_subset}};
  for (size_t k = 0; k < sizeof same / sizeof *same && !weights_only && !cfg->quiet; k++) {
    int64_t was;
    if (!meta_i64(f, same[k].key, &was) && was != same[k].now)
      fprintf(stderr, "duet: warning: %s %" PRId64 " differs from the checkpoint's %" PRId64 " (%s): the resumed run "
                      "does not continue the original one exactly%s\n",
              same[k].flag, same[k].now, was, path,
              k == 0 ? " where the seed still matters (the shuffle of later epochs, dropout masks; a text model's "
                       "window stream is restored from the checkpoint)"
                     : "");
  }
  const char *prec = duet_st_meta(f, "precision");
  if (!weights_only && !cfg->quiet && prec && strcmp(prec, program_precision(p)))
    fprintf(stderr, "duet: warning: --precision %s differs from the checkpoint's %s (%s): the resumed run does not "
                    "continue the original one exactly\n", program_precision(p), prec, path);
  *st = ns;
  rc = 0;
out:
  duet_st_close(f);
  return rc;
}
