#define _POSIX_C_SOURCE 200809L /* clock_gettime, fsync, fdopen */
/* runtime/checkpoint.c: training checkpoints as safetensors files. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "duet_rt.h"
#include "progress.h"

#define CKPT_FORMAT "duet-checkpoint-1"

static int is_saved(const DuetTensor *t) { return t->region == DUET_MEM_PARAM || t->region == DUET_MEM_STATE; }

/* A pruning mask (a state tensor initialised to ones). */
static int is_mask(const DuetTensor *t) { return t->region == DUET_MEM_STATE && t->init == DUET_INIT_ONES; }

/* "f32[1024,10]" into buf. */
static const char *shape_str(int dtype, int rank, const int64_t *shape, char *buf, size_t n) {
  static const char *const names[] = {"void", "f32", "f64", "i32", "f16", "bf16", "u8", "i8"};
  size_t len = (size_t)snprintf(buf, n, "%s[", dtype >= 0 && dtype <= DUET_I8 ? names[dtype] : "?");
  for (int k = 0; k < rank && len < n; k++)
    len += (size_t)snprintf(buf + len, n - len, "%s%" PRId64, k ? "," : "", shape[k]);
  if (len < n) snprintf(buf + len, n - len, "]");
  return buf;
}

static const char *prune_mode_name(const DuetPrune *pr, char *buf, size_t n);
static const char *num_str(double x, char *buf, size_t n);

/* Whether the file holds none of p's pruning masks while p has some: a
 * checkpoint of the same model trained without pruning, which a pruned run
 * may continue (its masks start with nothing pruned: the usual train,
 * then prune and fine-tune). */
static int lacks_masks(const DuetProgram *p, const DuetStFile *f) {
  int masks = 0;
  for (int i = 0; i < p->n_tensors; i++)
    if (is_mask(&p->tensors[i])) {
      if (duet_st_find(f, p->tensors[i].name)) return 0;
      masks++;
    }
  return masks > 0;
}

/* The precision p was compiled for, as --precision names it: the 16-bit
 * storage dtype of its activations when it has one (fp16, bf16), else the
 * dtype of its floats (fp32, or f64 for an f64 model). */
const char *duet_program_precision(const DuetProgram *p) {
  const char *name = "fp32";
  for (int i = 0; i < p->n_tensors; i++) {
    int dt = p->tensors[i].dtype;
    if (dt == DUET_F16 || dt == DUET_BF16) return dt == DUET_F16 ? "fp16" : "bf16";
    if (dt == DUET_F64) name = "f64";
  }
  return name;
}

int64_t duet_count_nonfinite(int dtype, const void *data, int64_t nbytes, int64_t *first, int *first_nan) {
  int64_t n = 0, at = -1;
  int nan = 0;
  const unsigned char *b = data;
  if (dtype == DUET_F32) {
    for (int64_t i = 0; i < nbytes / 4; i++) {
      float v;
      memcpy(&v, b + 4 * i, 4);
      if (!isfinite(v) && n++ == 0) at = i, nan = isnan(v);
    }
  } else if (dtype == DUET_F64) {
    for (int64_t i = 0; i < nbytes / 8; i++) {
      double v;
      memcpy(&v, b + 8 * i, 8);
      if (!isfinite(v) && n++ == 0) at = i, nan = isnan(v);
    }
  } else if (dtype == DUET_F16 || dtype == DUET_BF16) {
    /* all exponent bits set: an infinity (fraction 0) or a NaN */
    uint16_t exp = dtype == DUET_F16 ? 0x7c00 : 0x7f80, frac = dtype == DUET_F16 ? 0x03ff : 0x007f;
    for (int64_t i = 0; i < nbytes / 2; i++) {
      uint16_t h = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);
      if ((h & exp) == exp && n++ == 0) at = i, nan = (h & frac) != 0;
    }
  }
  if (first) *first = at;
  if (first_nan) *first_nan = nan;
  return n;
}

/* "tensor `w` holds 3 non-finite values (element 7 is NaN)" into buf. */
static void nonfinite_note(char *buf, size_t n, const char *name, int64_t count, int64_t first, int nan) {
  snprintf(buf, n, "tensor `%s` holds %" PRId64 " non-finite value%s (element %" PRId64 " is %s)", name, count,
           count == 1 ? "" : "s", first, nan ? "NaN" : "infinite");
}

/* The CPU workers of session s: its program's stages times the
 * data-parallel replicas in this process (one per rank of an MPI run). */
static int workers(const DuetSession *s) {
  const DuetProgram *p = duet_session_program(s);
  return (p->n_stages > 1 ? p->n_stages : 1) * duet_session_replicas(s);
}

int duet_threads_per_device(const DuetConfig *cfg, int n_stages) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int total = cfg->threads > 0 ? cfg->threads : cores > 0 ? (int)cores : 1;
  int S = n_stages > 1 ? n_stages : 1;
  return total / S > 0 ? total / S : 1;
}

/* x in the shortest of %.15g, %.16g, %.17g that reads back exactly. */
static const char *exact_num(double x, char *buf, size_t n) {
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
  return buf;
}

/* The schedule as checkpoints record it: "cosine lr=0.001 warmup=100
 * min_lr=1e-05 steps=1000 clip=1" (numbers exact; clip=0: no clipping);
 * a constant rate does not depend on the run's length: "constant lr=0.001
 * warmup=0 clip=0" (a run extended with --steps continues it exactly). */
static void schedule_meta(const DuetConfig *cfg, int64_t total, char *buf, size_t n) {
  const char *name = duet_lr_schedule_name(cfg->lr_schedule);
  char a[32], b[32], c[32], steps[48] = "";
  if (cfg->lr_schedule != DUET_LR_CONSTANT)
    snprintf(steps, sizeof steps, " min_lr=%s steps=%" PRId64, exact_num(cfg->min_lr, b, sizeof b), total);
  snprintf(buf, n, "%s lr=%s warmup=%" PRId64 "%s clip=%s", name ? name : "?", exact_num(cfg->lr, a, sizeof a),
           cfg->warmup, steps, exact_num(cfg->clip_grad_norm, c, sizeof c));
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
    int64_t first;
    int nan;
    int64_t bad = duet_count_nonfinite(x->dtype, host[n - 1], x->nbytes, &first, &nan);
    if (bad) { /* a diverged state: never written over a good checkpoint */
      nonfinite_note(err, errlen, x->name, bad, first, nan);
      rc = -2;
      goto out;
    }
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
  char seed[32], bsz[32], subset[32], threads[32];
  snprintf(threads, sizeof threads, "%d", duet_threads_per_device(cfg, workers(s)));
  snprintf(seed, sizeof seed, "%" PRIu64, cfg->seed);
  snprintf(bsz, sizeof bsz, "%" PRId64, cfg->batch);
  snprintf(subset, sizeof subset, "%" PRId64, cfg->train_subset);
  /* the learning-rate schedule and clipping (a resumed run that changes
   * them is warned: the rate of a step is a function of the step and these) */
  char sched[400];
  schedule_meta(cfg, duet_session_total(s), sched, sizeof sched);
  const char *meta[48] = {"format", CKPT_FORMAT, "model",      p->model_name, "step",          step,
                           "epoch",  epoch,       "batch",      batch,         "rng",           rng,
                           "seed",   seed,        "batch_size", bsz,           "train_subset",  subset,
                           "precision", duet_program_precision(p), "lr_schedule", sched};
  int n_meta = 11;
  /* CPU devices: OpenBLAS's summation order follows the threads per device
   * (a GPU's cuBLAS does not depend on them: not recorded) */
  if (!duet_devices_all_cuda(cfg->devices)) meta[2 * n_meta] = "threads", meta[2 * n_meta + 1] = threads, n_meta++;
  const char *scaler[] = {"loss_scale", scale, "loss_scale_growth", growth, "skipped_steps", skipped};
  for (int k = 0; p->n_unscale && k < 3; k++, n_meta++)
    meta[2 * n_meta] = scaler[2 * k], meta[2 * n_meta + 1] = scaler[2 * k + 1];
  /* pruning: the schedule that chose the masks (checked on resume) */
  char pmode[32], pfinal[40], pinit[40], pstart[32], pend[32], pevery[32];
  if (p->prune) {
    const DuetPrune *pr = p->prune;
    prune_mode_name(pr, pmode, sizeof pmode);
    num_str(pr->final, pfinal, sizeof pfinal);
    num_str(pr->initial, pinit, sizeof pinit);
    snprintf(pstart, sizeof pstart, "%" PRId64, pr->start);
    snprintf(pend, sizeof pend, "%" PRId64, pr->end);
    snprintf(pevery, sizeof pevery, "%" PRId64, pr->every);
    const char *kv[] = {"prune_mode", pmode, "prune_sparsity", pfinal, "prune_initial", pinit,
                        "prune_start", pstart, "prune_end", pend, "prune_every", pevery};
    for (int k = 0; k < 6; k++, n_meta++) meta[2 * n_meta] = kv[2 * k], meta[2 * n_meta + 1] = kv[2 * k + 1];
  }
  rc = duet_st_save(path, t, n, meta, n_meta, err, errlen);
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

/* ------------------------------------------------------ pruning settings */

/* The pruning mode as --prune-mode names it ("unstructured", "2:4") into
 * buf (32 bytes). */
static const char *prune_mode_name(const DuetPrune *pr, char *buf, size_t n) {
  static const char *const modes[] = {"", "unstructured", "global", "N:M", "channels"};
  if (pr->mode == DUET_PRUNE_NM) snprintf(buf, n, "%d:%d", pr->nm_n, pr->nm_m);
  else snprintf(buf, n, "%s", pr->mode >= 1 && pr->mode <= 4 ? modes[pr->mode] : "?");
  return buf;
}

/* x as the shortest of %.15g, %.16g, %.17g that reads back exactly (0.3,
 * not 0.29999999999999999) into buf (40 bytes). */
static const char *num_str(double x, char *buf, size_t n) {
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
  return buf;
}

/* The --prune flags that make schedule pr (those that differ from the
 * defaults: an N:M mode without --prune, a one-shot without --prune-end,
 * --prune-every, --prune-initial) into buf. */
static const char *prune_flags(const DuetPrune *pr, char *buf, size_t n) {
  char m[32];
  prune_mode_name(pr, m, sizeof m);
  if (pr->mode == DUET_PRUNE_NM) snprintf(buf, n, "--prune-mode %s", m);
  else snprintf(buf, n, "--prune %s%s%s", num_str(pr->final, (char[40]){0}, 40), pr->mode == DUET_PRUNE_UNSTRUCTURED ? "" : " --prune-mode ",
                pr->mode == DUET_PRUNE_UNSTRUCTURED ? "" : m);
  size_t k = strlen(buf);
  if (pr->start) snprintf(buf + k, n - k, " --prune-start %" PRId64, pr->start), k = strlen(buf);
  if (pr->mode != DUET_PRUNE_NM && pr->end != pr->start) {
    snprintf(buf + k, n - k, " --prune-end %" PRId64 " --prune-every %" PRId64, pr->end, pr->every);
    k = strlen(buf);
    if (pr->initial) snprintf(buf + k, n - k, " --prune-initial %s", num_str(pr->initial, (char[40]){0}, 40));
  }
  return buf;
}

/* The checkpoint's pruning schedule from its metadata (prune_mode,
 * prune_sparsity, prune_initial, prune_start, prune_end, prune_every: as
 * duet_checkpoint_save writes them) into *pr (params: none).  1 when the
 * file has them, 0 when not (no pruning, or a checkpoint of older duet),
 * -1 when they are malformed. */
static int meta_prune(const DuetStFile *f, DuetPrune *pr) {
  const char *mode = duet_st_meta(f, "prune_mode"), *fin = duet_st_meta(f, "prune_sparsity"),
             *ini = duet_st_meta(f, "prune_initial");
  if (!mode) return 0;
  memset(pr, 0, sizeof *pr);
  static const char *const modes[] = {"", "unstructured", "global", "", "channels"};
  for (int k = 1; k <= 4; k++)
    if (modes[k][0] && !strcmp(mode, modes[k])) pr->mode = k;
  int a, b, used = 0;
  if (!pr->mode && sscanf(mode, "%d:%d%n", &a, &b, &used) == 2 && !mode[used] && a >= 1 && a < b && b <= 64)
    pr->mode = DUET_PRUNE_NM, pr->nm_n = a, pr->nm_m = b;
  char *e1 = NULL, *e2 = NULL;
  if (fin) pr->final = strtod(fin, &e1);
  if (ini) pr->initial = strtod(ini, &e2);
  if (!pr->mode || !fin || !ini || e1 == fin || *e1 || e2 == ini || *e2 || meta_i64(f, "prune_start", &pr->start) ||
      meta_i64(f, "prune_end", &pr->end) || meta_i64(f, "prune_every", &pr->every) || pr->every < 1 ||
      pr->end < pr->start)
    return -1;
  return 1;
}

/* The sparsity the masks of schedule pr were last chosen for before
 * training step `step` + 1 (the updates after t < step steps: see
 * duet_prune_due); -1 when none was made (the masks are all ones). */
static double prune_reached(const DuetPrune *pr, int64_t step) {
  if (step <= pr->start) return -1;
  int64_t t = step > pr->end ? pr->end : pr->start + (step - 1 - pr->start) / pr->every * pr->every;
  return duet_prune_target(pr, t);
}

static int same_schedule(const DuetPrune *a, const DuetPrune *b) {
  if (a->mode != b->mode || a->nm_n != b->nm_n || a->nm_m != b->nm_m || a->start != b->start) return 0;
  return a->mode == DUET_PRUNE_NM ||
         (a->final == b->final && a->initial == b->initial && a->end == b->end && a->every == b->every);
}

/* A resume of a checkpoint whose masks were chosen by schedule `was`
 * (metadata) into program p's pruning, at the checkpoint's step: refused
 * (-1, a message in err) when the masks cannot be what p's schedule
 * claims: once they are chosen (an update lay before the step), another
 * mode (its masks do not have the new mode's pattern: unstructured masks
 * are not 2:4), a next update to a sparsity below the one reached (it
 * would revive pruned weights), or another final sparsity when no update
 * remains.  0 when the
 * masks may go on (*differs: 1 when the schedule is not the checkpoint's:
 * a warning, as for --seed). */
static int check_prune_change(const DuetProgram *p, const DuetPrune *was, int64_t step, const char *path,
                              int *differs, char *err, size_t errlen) {
  const DuetPrune *now = p->prune;
  *differs = !same_schedule(was, now);
  double reached = prune_reached(was, step);
  if (!*differs || reached < 0) return 0; /* masks of ones fit any schedule */
  /* the first update of the new schedule after the checkpoint (-1: none) */
  int64_t next = step <= now->start ? now->start : step > now->end ? -1
               : now->start + (step - now->start + now->every - 1) / now->every * now->every;
  if (next > now->end) next = now->end;
  char wm[32], nm[32], wf[200], nf[200], why[400];
  prune_mode_name(was, wm, sizeof wm);
  prune_mode_name(now, nm, sizeof nm);
  prune_flags(was, wf, sizeof wf);
  prune_flags(now, nf, sizeof nf);
  if (was->mode != now->mode || was->nm_n != now->nm_n || was->nm_m != now->nm_m)
    snprintf(why, sizeof why, "its masks were chosen by %s pruning and are not %s masks; resume with its mode "
             "(--prune-mode %s)", wm, nm, wm);
  else if (next >= 0 && duet_prune_target(now, next) < reached)
    snprintf(why, sizeof why, "its masks reached sparsity %.4g, and this schedule's next update (after step %" PRId64
             ") asks for %.4g, which would bring pruned weights back; ask for %.4g or more from step %" PRId64 " on",
             reached, next, duet_prune_target(now, next), reached, step);
  else if (next < 0 && now->final != reached)
    snprintf(why, sizeof why, "its masks have sparsity %.4g and this schedule makes no update after its step %" PRId64
             " (the last is after step %" PRId64 "), so they would stay at %.4g, not %.4g; resume with its "
             "sparsity, or schedule an update after step %" PRId64 " or later (--prune-start, --prune-end)", reached, step, now->end,
             reached, now->final, step);
  else
    return 0;
  snprintf(err, errlen, "cannot resume from %s: it was pruned with %s, this run asks for %s: %s", path, wf, nf, why);
  return -1;
}

/* The params of p of which file f holds a pruning mask (`NAME.mask`) that
 * p lacks, as a list into buf ("linear1.w.mask, ..."); their number. */
static int foreign_masks(const DuetProgram *p, const DuetStFile *f, char *buf, size_t n) {
  int count = 0;
  buf[0] = 0;
  for (int i = 0; i < duet_st_count(f); i++) {
    const char *name = duet_st_get(f, i)->name;
    size_t len = strlen(name);
    if (len <= 5 || strcmp(name + len - 5, ".mask")) continue;
    int known = 0, param = 0;
    for (int j = 0; j < p->n_tensors && !known; j++) {
      known = !strcmp(p->tensors[j].name, name);
      param |= p->tensors[j].region == DUET_MEM_PARAM && strlen(p->tensors[j].name) == len - 5 &&
               !strncmp(p->tensors[j].name, name, len - 5);
    }
    if (known || !param) continue;
    size_t k = strlen(buf);
    if (k < n - 8) snprintf(buf + k, n - k, "%s%s", count ? ", " : "", name);
    else if (k < n - 4 && !strstr(buf, "...")) snprintf(buf + k, n - k, ", ...");
    count++;
  }
  return count;
}

/* A quantized program (int8 weights, passes/quantize.c) loading a
 * checkpoint of f32 weights: whether tensor i of p is computed from them
 * (an int8 weight the file holds as f32 of its shape, or the scales of one)
 * rather than read as it is. */
static int quant_from_f32(const DuetProgram *p, const DuetStFile *f, int i) {
  int w = i;
  if (p->tensors[i].dtype != DUET_I8) { /* the scales of an int8 weight? */
    w = -1;
    for (int j = 0; j < p->n_tensors && w < 0 && p->tensors[i].dtype == DUET_F32; j++)
      if (p->tensors[j].dtype == DUET_I8 && duet_quant_scale_of(p, j) == i) w = j;
    if (w < 0) return 0;
  } else if (duet_quant_scale_of(p, i) < 0) {
    return 0;
  }
  const DuetTensor *x = &p->tensors[w];
  const DuetStTensor *y = duet_st_find(f, x->name);
  int same = y && y->dtype == DUET_F32 && y->rank == x->rank && y->nbytes == 4 * x->nbytes;
  for (int k = 0; same && k < x->rank; k++) same = y->shape[k] == x->shape[k];
  return same;
}

/* The int8 weights *q and scales *scale (malloc'd) of tensor i of p (an
 * int8 weight) from the f32 weights y (duet_quantize_i8).  0, or -1 with
 * the message in err. */
static int quant_make(const DuetProgram *p, int i, const DuetStTensor *y, signed char **q, float **scale, char *err,
                      size_t errlen) {
  const DuetTensor *x = &p->tensors[i], *sc = &p->tensors[duet_quant_scale_of(p, i)];
  float *w = malloc((size_t)y->nbytes + 1);
  *scale = malloc((size_t)sc->nbytes + 1);
  *q = malloc((size_t)x->nbytes + 1);
  int rc = -1;
  if (!w || !*scale || !*q) {
    snprintf(err, errlen, "cannot quantize %s: out of host memory", x->name);
    goto out;
  }
  memcpy(w, y->data, (size_t)y->nbytes); /* the file's data need not be aligned for floats */
  if (duet_quantize_i8(w, x->rank, x->shape, sc->shape, *q, *scale)) {
    snprintf(err, errlen, "cannot quantize %s: its scales' shape does not broadcast to it", x->name);
    goto out;
  }
  rc = 0;
out:
  free(w);
  if (rc) free(*q), free(*scale), *q = NULL, *scale = NULL;
  return rc;
}

/* The int8 weights and scales of tensor i of p (an int8 weight) from the
 * f32 weights y (quant_make), written to session s.  0, or -1 with the
 * message in err. */
static int quant_write(DuetSession *s, const DuetProgram *p, int i, const DuetStTensor *y, char *err, size_t errlen) {
  const DuetTensor *x = &p->tensors[i], *sc = &p->tensors[duet_quant_scale_of(p, i)];
  signed char *q;
  float *scale;
  if (quant_make(p, i, y, &q, &scale, err, errlen)) return -1;
  int rc = 0;
  if (duet_session_write(s, i, 0, q, (size_t)x->nbytes) ||
      duet_session_write(s, (int)(sc - p->tensors), 0, scale, (size_t)sc->nbytes)) {
    snprintf(err, errlen, "cannot quantize %s: copying it to the device failed: %s", x->name, duet_session_error(s));
    rc = -1;
  }
  free(q), free(scale);
  return rc;
}

/* The checks of a checkpoint that need only its header, against program p:
 * the format, the model, the training state in the metadata (into *ns),
 * every param (and, unless weights_only, state) tensor present with the
 * model's dtype and shape, and (unless weights_only) no other tensor.  The
 * pruning masks may all be missing (a checkpoint of a run without pruning)
 * when its step is at most the schedule's last update.  0, or -1 with a
 * message naming the file and the tensor. */
static int check_header(const DuetProgram *p, const DuetStFile *f, const char *path, int weights_only,
                        DuetTrainState *ns, char *err, size_t errlen) {
  const char *verb = weights_only ? "load" : "resume from";
  const char *fmt = duet_st_meta(f, "format"), *model = duet_st_meta(f, "model"), *rng = duet_st_meta(f, "rng");
  int n_saved = 0;
  memset(ns, 0, sizeof *ns);
  if (fmt && !strcmp(fmt, DUET_WEIGHTS_FORMAT)) { /* duet export's file: params only, f32, for other tools */
    snprintf(err, errlen, "cannot %s %s: it is a weights file written by duet export (format " DUET_WEIGHTS_FORMAT ", for "
             "other tools), not a checkpoint: give the checkpoint duet run --save wrote", verb, path);
    return -1;
  }
  if (!fmt || strcmp(fmt, CKPT_FORMAT)) {
    snprintf(err, errlen, "cannot %s %s: not a duet checkpoint (metadata format is %s%s%s, expected %s)", verb, path,
             fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "", CKPT_FORMAT);
    return -1;
  }
  if (!model || strcmp(model, p->model_name)) {
    snprintf(err, errlen, "cannot %s %s: it is a checkpoint of model `%s`, not `%s`", verb, path, model ? model : "?",
             p->model_name);
    return -1;
  }
  if (meta_i64(f, "step", &ns->step) || meta_i64(f, "epoch", &ns->epoch) || meta_i64(f, "batch", &ns->batch) || !rng ||
      sscanf(rng, "%" SCNx64 " %" SCNx64 " %" SCNx64 " %" SCNx64, &ns->rng.s[0], &ns->rng.s[1], &ns->rng.s[2],
             &ns->rng.s[3]) != 4) {
    snprintf(err, errlen, "cannot %s %s: corrupt training state in its metadata", verb, path);
    return -1;
  }
  int no_masks = lacks_masks(p, f);
  if (no_masks && !weights_only && p->prune && ns->step > p->prune->end) {
    snprintf(err, errlen, "cannot resume from %s: it has no pruning masks (a run without pruning) and its step %" PRId64
             " is after the pruning schedule's last update (after step %" PRId64 "), so nothing would be pruned; "
             "start pruning at its step or later (--prune-start %" PRId64 ")", path, ns->step, p->prune->end, ns->step);
    return -1;
  }
  if (!weights_only) { /* pruning: the checkpoint's masks and the settings that chose them */
    char list[300], flags[240] = "";
    DuetPrune was;
    int has = meta_prune(f, &was), differs;
    if (has < 0) {
      snprintf(err, errlen, "cannot %s %s: corrupt pruning settings in its metadata", verb, path);
      return -1;
    }
    int n_foreign = foreign_masks(p, f, list, sizeof list);
    if (n_foreign && !p->prune) {
      if (has) snprintf(flags, sizeof flags, " (%s)", prune_flags(&was, (char[200]){0}, 200));
      snprintf(err, errlen, "cannot %s %s: it was trained with pruning (it holds the pruning mask%s %s): pass its "
               "pruning flags%s, or the model's prune section, to continue it", verb, path, n_foreign > 1 ? "s" : "",
               list, flags);
      return -1;
    }
    if (n_foreign) {
      snprintf(err, errlen, "cannot %s %s: it holds pruning masks of params this run does not prune (%s): pass its "
               "--prune-params (or the prune section's params)", verb, path, list);
      return -1;
    }
    if (has && p->prune && !no_masks && check_prune_change(p, &was, ns->step, path, &differs, err, errlen)) return -1;
  }
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *x = &p->tensors[i];
    if (!is_saved(x) || (weights_only && x->region != DUET_MEM_PARAM) || (no_masks && is_mask(x))) continue;
    if (quant_from_f32(p, f, i)) continue; /* int8 weights and scales made from its f32 weights */
    if (duet_is_act_scale(p, i) && !duet_st_find(f, x->name)) continue; /* calibrated (duet_calibrate) */
    n_saved++;
    const DuetStTensor *y = duet_st_find(f, x->name);
    if (!y) {
      /* AdamW state of the other kind: f32 moments `w.exp_avg`, 8-bit ones
       * `w.exp_avg.codes` and `w.exp_avg.absmax` */
      char alt[512];
      const char *dot = strrchr(x->name, '.');
      snprintf(alt, sizeof alt, "%s.codes", x->name);
      int has_q8 = duet_st_find(f, alt) != NULL;
      int has_f32 = 0;
      if (dot && (!strcmp(dot, ".codes") || !strcmp(dot, ".absmax"))) {
        snprintf(alt, sizeof alt, "%.*s", (int)(dot - x->name), x->name);
        has_f32 = duet_st_find(f, alt) != NULL;
      }
      snprintf(err, errlen, "cannot %s %s: it has no tensor `%s`%s", verb, path, x->name,
               has_q8    ? " (its AdamW state is 8-bit: resume with --optimizer-state int8)"
               : has_f32 ? " (its AdamW state is f32: resume with --optimizer-state f32)"
                         : "");
      return -1;
    }
    /* a shrunk param (--shrink): the checkpoint holds it at its full shape */
    int64_t full[DUET_MAX_RANK], fn = 1, xn = 1;
    int shrunk = duet_shrink_full_shape(p, i, full);
    for (int k = 0; k < x->rank; k++) fn *= full[k], xn *= x->shape[k];
    int same = y->dtype == x->dtype && y->rank == x->rank && y->nbytes * xn == x->nbytes * fn;
    for (int k = 0; same && k < x->rank; k++) same = y->shape[k] == full[k];
    if (!same) {
      char have[160], want[160];
      snprintf(err, errlen, "cannot %s %s: tensor `%s` is %s in the checkpoint, %s in the model%s", verb, path,
               x->name, shape_str(y->dtype, y->rank, y->shape, have, sizeof have),
               shape_str(x->dtype, x->rank, full, want, sizeof want), shrunk ? " (before --shrink)" : "");
      return -1;
    }
  }
  if (!weights_only && duet_st_count(f) != n_saved) {
    snprintf(err, errlen, "cannot %s %s: it holds %d tensors, the model has %d params and state tensors", verb, path,
             duet_st_count(f), n_saved);
    return -1;
  }
  return 0;
}

int duet_checkpoint_check(const DuetProgram *p, const char *path, int64_t *step, char *err, size_t errlen) {
  char e2[512];
  DuetStFile *f = duet_st_open_header(path, e2, sizeof e2);
  if (!f) {
    snprintf(err, errlen, "cannot resume: %s", e2);
    return -1;
  }
  DuetTrainState ns;
  int rc = check_header(p, f, path, 0, &ns, err, errlen);
  if (!rc) *step = ns.step;
  duet_st_close(f);
  return rc;
}

/* The weights to load into p: the checkpoint `path`, or (path NULL) p's
 * embedded weights (DuetProgram.weights), opened whole or (header_only)
 * their header; *name: how messages call them.  NULL with a message in
 * err. */
static DuetStFile *open_weights(const DuetProgram *p, const char *path, int header_only, const char **name, char *err,
                                size_t errlen) {
  char e2[512];
  *name = path ? path : DUET_EMBEDDED_WEIGHTS;
  DuetStFile *f = NULL;
  if (path) f = header_only ? duet_st_open_header(path, e2, sizeof e2) : duet_st_open(path, e2, sizeof e2);
  else if (p->weights)
    f = duet_st_open_mem(p->weights, (size_t)p->weights_nbytes, DUET_EMBEDDED_WEIGHTS, header_only, e2, sizeof e2);
  else snprintf(e2, sizeof e2, "no checkpoint given, and the program has no embedded weights");
  if (!f) snprintf(err, errlen, "cannot load the %s: %s", path ? "checkpoint" : "embedded weights", e2);
  return f;
}

int duet_checkpoint_check_weights(const DuetProgram *p, const char *path, int64_t *step, char *err, size_t errlen) {
  DuetStFile *f = open_weights(p, path, 1, &path, err, errlen);
  if (!f) return -1;
  DuetTrainState ns;
  int rc = check_header(p, f, path, 1, &ns, err, errlen);
  if (!rc) *step = ns.step;
  duet_st_close(f);
  return rc;
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
  const char *verb = weights_only ? "load" : "resume from";
  char e2[512];
  DuetStFile *f = weights_only ? open_weights(p, path, 0, &path, err, errlen) : duet_st_open(path, e2, sizeof e2);
  if (!f) {
    if (!weights_only) snprintf(err, errlen, "cannot resume: %s", e2);
    return -1;
  }
  int rc = -1;
  DuetTrainState ns;
  DuetShrinkKept *kept = NULL;
  /* check everything before changing anything */
  if (check_header(p, f, path, weights_only, &ns, err, errlen)) goto out;
  /* fp16 programs: the loss scaler; a checkpoint of an fp32 run starts it afresh */
  DuetScaler sc = duet_session_scaler(s);
  const char *scale = duet_st_meta(f, "loss_scale");
  if (!weights_only && p->n_unscale && scale) {
    char *end;
    sc.scale = strtod(scale, &end);
    if (end == scale || *end || !(sc.scale > 0) || meta_i64(f, "loss_scale_growth", &sc.growth) ||
        meta_i64(f, "skipped_steps", &sc.skipped) || sc.skipped > ns.step) {
      snprintf(err, errlen, "cannot %s %s: corrupt loss scaler state in its metadata", verb, path);
      goto out;
    }
  }
  /* a NaN or an infinity in the weights or optimizer state cannot train on
   * (nor sample): refused, naming the tensor */
  int no_masks = lacks_masks(p, f);
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *x = &p->tensors[i];
    if (!is_saved(x) || (weights_only && x->region != DUET_MEM_PARAM) || (no_masks && is_mask(x))) continue;
    const DuetStTensor *y = duet_st_find(f, x->name);
    if (!y) continue; /* the scales of int8 weights made from the f32 ones (quant_from_f32) */
    int64_t first;
    int nan;
    int64_t bad = duet_count_nonfinite(y->dtype, y->data, y->nbytes, &first, &nan);
    if (bad) {
      char note[400];
      nonfinite_note(note, sizeof note, x->name, bad, first, nan);
      snprintf(err, errlen, "cannot %s %s: %s; the state it holds has diverged", verb, path, note);
      goto out;
    }
  }
  /* a shrunk program (--shrink): the channels each pruned weight keeps */
  if (p->shrink && !(kept = duet_shrink_kept(p, f, path, err, errlen))) goto out;
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *x = &p->tensors[i];
    if (!is_saved(x) || (weights_only && x->region != DUET_MEM_PARAM) || (no_masks && is_mask(x))) continue;
    const DuetStTensor *y = duet_st_find(f, x->name);
    if (quant_from_f32(p, f, i)) { /* int8 weights (and their scales) from f32 ones */
      if (x->dtype == DUET_I8 && quant_write(s, p, i, y, err, errlen)) goto out;
      continue;
    }
    if (!y && duet_is_act_scale(p, i)) continue; /* not in the file: calibrated (duet_calibrate) */
    if (duet_shrink_touches(p, kept, i)) { /* the kept channels of a shrunk param, a bias folded into */
      void *buf = malloc((size_t)x->nbytes + 8);
      int bad = !buf                                                    ? 1
              : duet_shrink_gather(p, kept, i, y, buf)                    ? 2
              : duet_session_write(s, i, 0, buf, (size_t)x->nbytes)      ? 3
                                                                          : 0;
      free(buf);
      if (bad) {
        snprintf(err, errlen, "cannot %s %s: %s %s%s%s", verb, path, bad == 3 ? "copying" : "shrinking", x->name,
                 bad == 1 ? " failed: out of host memory" : bad == 2 ? " failed: its shape is not the one shrunk"
                                                                    : " to the device failed: ",
                 bad == 3 ? duet_session_error(s) : "");
        goto out;
      }
      continue;
    }
    if (duet_session_write(s, i, 0, y->data, (size_t)y->nbytes)) {
      snprintf(err, errlen, "cannot %s %s: copying %s to the device failed: %s", verb, path, x->name,
               duet_session_error(s));
      goto out;
    }
  }
  if (!weights_only && no_masks && !duet_session_config(s)->quiet)
    fprintf(stderr, "duet: %s has no pruning masks (a run without pruning): pruning starts from the dense weights, "
                    "at the schedule's steps after its step %" PRId64 "\n", path, ns.step);
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
  for (size_t k = 0; k < sizeof same / sizeof *same && !weights_only && duet_warns(); k++) {
    int64_t was;
    if (!meta_i64(f, same[k].key, &was) && was != same[k].now)
      fprintf(stderr, "duet: warning: %s %" PRId64 " differs from the checkpoint's %" PRId64 " (%s): the resumed run "
                      "does not continue the original one exactly%s\n",
              same[k].flag, same[k].now, was, path,
              k == 0 ? " where the seed still matters (the shuffle of later epochs, dropout masks; a text model's "
                       "window stream is restored from the checkpoint)"
                     : "");
  }
  DuetPrune was;
  int differs = 0;
  if (!weights_only && duet_warns() && p->prune && !no_masks && meta_prune(f, &was) == 1 &&
      !check_prune_change(p, &was, ns.step, path, &differs, err, errlen) && differs) {
    char wf[200], nf[200];
    fprintf(stderr, "duet: warning: the pruning schedule %s differs from the checkpoint's %s (%s): the masks go on "
                    "from its sparsity %.4g, and the resumed run does not continue the original one exactly\n",
            prune_flags(p->prune, nf, sizeof nf), prune_flags(&was, wf, sizeof wf), path,
            prune_reached(&was, ns.step) < 0 ? 0 : prune_reached(&was, ns.step));
  }
  const char *sched = duet_st_meta(f, "lr_schedule");
  char now_sched[400];
  schedule_meta(cfg, duet_session_total(s), now_sched, sizeof now_sched);
  if (!weights_only && duet_warns() && sched && strcmp(sched, now_sched))
    fprintf(stderr, "duet: warning: the learning-rate schedule or clipping (--lr, --lr-schedule, --warmup, --min-lr, "
                    "--steps, --clip-grad-norm) differs from the checkpoint's (%s): the resumed run does not continue "
                    "the original one exactly (now: %s; checkpoint: %s)\n", path, now_sched, sched);
  const char *prec = duet_st_meta(f, "precision");
  if (!weights_only && duet_warns() && prec && strcmp(prec, duet_program_precision(p)))
    fprintf(stderr, "duet: warning: --precision %s differs from the checkpoint's %s (%s): the resumed run does not "
                    "continue the original one exactly\n", duet_program_precision(p), prec, path);
  /* CPU devices: OpenBLAS sums in an order set by its thread count (per
   * device: a pipeline splits --threads among its stages) */
  int64_t was_threads;
  int now_threads = duet_threads_per_device(cfg, workers(s));
  if (!weights_only && duet_warns() && !duet_devices_all_cuda(cfg->devices) &&
      !meta_i64(f, "threads", &was_threads) && was_threads != now_threads) {
    char flag[96];
    int S = workers(s);
    if (cfg->threads > 0 && S == 1) snprintf(flag, sizeof flag, "--threads %d", cfg->threads);
    else if (cfg->threads > 0) snprintf(flag, sizeof flag, "--threads %d (%d per device)", cfg->threads, now_threads);
    else if (S == 1) snprintf(flag, sizeof flag, "--threads (default: all %d cores)", now_threads);
    else snprintf(flag, sizeof flag, "--threads (default: all cores, %d per device)", now_threads);
    fprintf(stderr, "duet: warning: %s differs from the checkpoint's %" PRId64 "%s (%s): the resumed run does not "
                    "continue the original one exactly (OpenBLAS's summation order follows its thread count)\n",
            flag, was_threads, S > 1 ? " per device" : "", path);
  }
  *st = ns;
  rc = 0;
out:
  duet_shrink_kept_free(kept);
  duet_st_close(f);
  return rc;
}

/* ------------------------------------------------- embedded weights */

int duet_checkpoint_embed(const DuetProgram *p, const char *ck, const char *out, char *err, size_t errlen) {
  char e2[512];
  DuetStFile *f = duet_st_open(ck, e2, sizeof e2);
  if (!f) {
    snprintf(err, errlen, "cannot load the checkpoint: %s", e2);
    return -1;
  }
  DuetStTensor *t = calloc(2 * (size_t)p->n_tensors + 1, sizeof *t);
  void **owned = calloc(2 * (size_t)p->n_tensors + 1, sizeof *owned);
  int n = 0, n_owned = 0, rc = -1;
  DuetTrainState ns;
  if (!t || !owned) {
    snprintf(err, errlen, "cannot embed %s: out of host memory", ck);
    goto out;
  }
  if (check_header(p, f, ck, 1, &ns, err, errlen)) goto out;
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *x = &p->tensors[i];
    if (x->region != DUET_MEM_PARAM) continue;
    const DuetStTensor *y = duet_st_find(f, x->name);
    if (!y) continue; /* the scales of int8 weights made from the f32 ones */
    int64_t first;
    int nan;
    int64_t bad = duet_count_nonfinite(y->dtype, y->data, y->nbytes, &first, &nan);
    if (bad) { /* refused as the executable's load would refuse it */
      char note[400];
      nonfinite_note(note, sizeof note, x->name, bad, first, nan);
      snprintf(err, errlen, "cannot load %s: %s; the state it holds has diverged", ck, note);
      goto out;
    }
    if (!quant_from_f32(p, f, i)) { /* as it is */
      t[n] = (DuetStTensor){.name = x->name, .dtype = y->dtype, .rank = y->rank, .data = y->data, .nbytes = y->nbytes};
      memcpy(t[n].shape, y->shape, sizeof y->shape);
      n++;
      continue;
    }
    if (x->dtype != DUET_I8) continue; /* f32 weights of an int8 one: quantized below */
    int si = duet_quant_scale_of(p, i);
    signed char *q;
    float *scale;
    if (quant_make(p, i, y, &q, &scale, err, errlen)) goto out;
    owned[n_owned++] = q;
    owned[n_owned++] = scale;
    for (int k = 0; k < 2; k++) {
      const DuetTensor *z = &p->tensors[k ? si : i];
      t[n] = (DuetStTensor){.name = z->name, .dtype = z->dtype, .rank = z->rank, .data = k ? (void *)scale : (void *)q,
                            .nbytes = z->nbytes};
      memcpy(t[n].shape, z->shape, sizeof z->shape);
      n++;
    }
  }
  /* the metadata a weights-only load checks (check_header), and where they came from */
  static const char *const keys[] = {"format", "model", "step", "epoch", "batch", "rng"};
  const char *meta[2 * 8];
  int n_meta = 0;
  for (int k = 0; k < 6; k++) meta[2 * n_meta] = keys[k], meta[2 * n_meta + 1] = duet_st_meta(f, keys[k]), n_meta++;
  meta[2 * n_meta] = "source", meta[2 * n_meta + 1] = ck, n_meta++;
  rc = duet_st_save(out, t, n, meta, n_meta, err, errlen);
out:
  for (int k = 0; k < n_owned; k++) free(owned[k]);
  free(owned);
  free(t);
  duet_st_close(f);
  return rc;
}

void duet_checkpoint_precision_note(const DuetProgram *p, const char *path) {
  if (!path) return;
  char e[512];
  DuetStFile *f = duet_st_open_header(path, e, sizeof e);
  if (!f) return;
  const char *prec = duet_st_meta(f, "precision"), *now = duet_program_precision(p);
  if (prec && strcmp(prec, now))
    fprintf(stderr, "duet: %s was trained with --precision %s and this evaluation runs %s: its numbers differ from the "
                    "training run's last evaluation (--precision %s repeats them)\n", path, prec, now, prec);
  duet_st_close(f);
}
