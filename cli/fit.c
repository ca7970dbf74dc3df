/* cli/fit.c: `duet plan --fit` and `duet plan --format json`.
 *
 * The search plans every combination of: stages (1 to the devices of a
 * replica; the partition pass chooses the cut), micro-batches per replica
 * (the divisors of the batch up to 64), schedule (gpipe, 1f1b), activation
 * recomputation (none, blocks, auto), precision (fp32, fp16, bf16 where
 * the target has it: precision_resolve), AdamW state (f32, int8), optimizer
 * offload to the host (none, optimizer: one replica only, as duet run
 * refuses it with --data-parallel) and, with --data-parallel, ZeRO stage 1.  Each plan is the one `duet plan` prints
 * for those flags (cli/main.c compiles it), so its memory is the memory
 * `duet run` allocates and checks.
 *
 * Cost model (passes/partition.c, passes/data_parallel.c): each op costs
 * max(FLOPs / peak, bytes / bandwidth) on its device (peak fp32 rates per
 * compute capability from shared/FACTS.md and the vendors' datasheets; the
 * CPU's DUET_CPU_GFLOPS per core); recomputed ops are ops of the backward
 * pass, so their FLOPs count; transfers cost bytes / link bandwidth; a
 * stage's step is M x (forward + backward) + optimizer; the pipeline's is
 * the slowest stage's x (M + S - 1) / M (GPipe's bubble, Huang et al.
 * 2019); with replicas, the part of the ring all-reduce the backward pass
 * does not hide is added.  On CPU devices 16-bit storage is given the time
 * of its fp32 twin: the C kernels widen 16-bit values to f32, so the bytes
 * saved buy no time there.
 *
 * Ranking: the estimated time, in buckets of 1% (estimates closer than
 * that are a tie), then the fewest changes from the defaults (recompute
 * none, fp32, f32 state, no ZeRO, no offload), then the least memory.  An
 * offloaded candidate's time includes its host update and the copies over
 * the link (passes/partition.c); on CPU devices its host row counts against
 * the same memory, so there it never fits where its twin does not. */
#include "fit.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* How far k is from the defaults: each setting that changes the numbers or
 * costs time in practice (recomputation, 16 bits, 8-bit state, ZeRO's
 * all-gather) counts one (blocks two: it recomputes more than auto). */
static int changes(const FitCand *k) {
  int c = 0;
  c += !strcmp(k->recompute, "auto") ? 1 : !strcmp(k->recompute, "blocks") ? 2 : 0;
  c += strcmp(k->precision, "fp32") != 0;
  c += k->optim_state && !strcmp(k->optim_state, "int8");
  c += k->zero;
  c += k->offload != NULL;
  return c;
}

static int64_t bucket(double s) { return s > 0 ? (int64_t)floor(log(s) / log(1.01)) : INT64_MIN; }

static int cmp_fit(const void *pa, const void *pb) {
  const FitCand *a = pa, *b = pb;
  if (a->fits != b->fits) return a->fits ? -1 : 1;
  if (!a->fits) { /* the closest first */
    if (a->over != b->over) return a->over < b->over ? -1 : 1;
  }
  int64_t qa = bucket(a->rank_s), qb = bucket(b->rank_s);
  if (qa != qb) return qa < qb ? -1 : 1;
  int ca = changes(a), cb = changes(b);
  if (ca != cb) return ca < cb ? -1 : 1;
  if (a->need_most != b->need_most) return a->need_most < b->need_most ? -1 : 1;
  if (a->rank_s != b->rank_s) return a->rank_s < b->rank_s ? -1 : 1;
  return 0;
}

void fit_command(const FitSpace *sp, const FitCand *k, char *buf, size_t n) {
  size_t len = 0;
#define ADD(...) (len += (size_t)snprintf(buf + len, len < n ? n - len : 0, __VA_ARGS__))
  ADD("duet run %s --devices ", sp->model);
  for (int r = 0, first = 1; r < sp->replicas; r++)
    for (int s = 0; s < k->stages; s++, first = 0) ADD("%s%s", first ? "" : ",", sp->run_devices[r * sp->group + s]);
  ADD(" --micro-batches %" PRId64 " --schedule %s --recompute %s --precision %s", k->micro_batches,
      k->one_f_one_b ? "1f1b" : "gpipe", k->recompute, k->precision);
  if (k->optim_state) ADD(" --optimizer-state %s", k->optim_state);
  if (sp->replicas > 1) ADD(" --data-parallel %d --zero %d", sp->replicas, k->zero);
  if (k->offload) ADD(" --offload %s", k->offload);
  if (sp->batch_given) ADD(" --batch %" PRId64, sp->batch);
  if (sp->threads) ADD(" --threads %s", sp->threads);
  if (sp->device_memory) ADD(" --device-memory %s", sp->device_memory);
#undef ADD
}

static void settings(const FitCand *k, char *buf, size_t n) {
  snprintf(buf, n, "%d stage%s, %" PRId64 " micro-batch%s, %s, recompute %s, %s%s%s%s%s", k->stages,
           k->stages == 1 ? "" : "s", k->micro_batches, k->micro_batches == 1 ? "" : "es",
           k->one_f_one_b ? "1f1b" : "gpipe", k->recompute, k->precision, k->optim_state ? ", state " : "",
           k->optim_state ? k->optim_state : "", k->zero ? ", zero 1" : "", k->offload ? ", offload optimizer" : "");
}

static void print_row(FILE *out, int rank, const FitCand *k) {
  char st[200];
  settings(k, st, sizeof st);
  if (k->fits)
    fprintf(out, "%4d  %10.3f ms  %10.2f MiB  %s\n", rank, 1e3 * k->rank_s, k->need_most / 1048576.0, st);
  else
    fprintf(out, "%4d  %10.3f ms  %10.2f MiB  %s  (%" PRId64 " bytes over on %s%s)\n", rank, 1e3 * k->rank_s,
            k->need_most / 1048576.0, st, k->over, k->over_device, k->compiled ? "" : "; no split fits");
}

/* The column header of the ranked list: on CPU devices a 16-bit row shows
 * its fp32 twin's time (the time ranked). */
static void print_header(FILE *out, bool cpu) {
  fprintf(out, "rank  estimated step  fullest device  settings%s\n",
          cpu ? " (16-bit rows: the fp32 time, as the CPU's kernels compute in f32)" : "");
}

/* The setting whose change alone, from the default configuration (every
 * device of a replica as a stage, the fewest micro-batches, gpipe, no
 * recomputation, fp32, f32 state, no ZeRO), lowers the excess the most. */
static void most_help(const FitSpace *sp, const FitCand *c, int n, FILE *out) {
  const FitCand *base = NULL;
  for (int i = 0; i < n; i++) {
    const FitCand *k = &c[i];
    if (k->stages == sp->group && k->micro_batches == 1 && !k->one_f_one_b && !strcmp(k->recompute, "none") &&
        !strcmp(k->precision, "fp32") && (!k->optim_state || !strcmp(k->optim_state, "f32")) && !k->zero &&
        !k->offload)
      base = k;
  }
  if (!base) return;
  const FitCand *best = NULL;
  for (int i = 0; i < n; i++) {
    const FitCand *k = &c[i];
    int diff = (k->stages != base->stages) + (k->micro_batches != base->micro_batches) +
               (k->one_f_one_b != base->one_f_one_b) + !!strcmp(k->recompute, base->recompute) +
               !!strcmp(k->precision, base->precision) + (k->zero != base->zero) +
               (k->optim_state && strcmp(k->optim_state, base->optim_state)) + (k->offload != NULL);
    if (k->micro_batches != base->micro_batches && k->one_f_one_b != base->one_f_one_b) diff--; /* 1f1b needs M > 1 */
    if (diff != 1 || k->over >= base->over) continue;
    if (!best || k->over < best->over) best = k;
  }
  fprintf(out, "the default configuration (%d stage%s, fp32, no recomputation) needs %" PRId64 " bytes more than %s has\n",
          base->stages, base->stages == 1 ? "" : "s", base->over, base->over_device);
  if (!best) {
    fprintf(out, "no single setting lowers it; more devices, or a smaller --batch\n");
    return;
  }
  char what[120];
  if (best->stages != base->stages) snprintf(what, sizeof what, "%d stages", best->stages);
  else if (best->one_f_one_b != base->one_f_one_b)
    snprintf(what, sizeof what, "--micro-batches %" PRId64 " --schedule 1f1b", best->micro_batches);
  else if (best->micro_batches != base->micro_batches)
    snprintf(what, sizeof what, "--micro-batches %" PRId64, best->micro_batches);
  else if (strcmp(best->recompute, base->recompute)) snprintf(what, sizeof what, "--recompute %s", best->recompute);
  else if (strcmp(best->precision, base->precision)) snprintf(what, sizeof what, "--precision %s", best->precision);
  else if (best->zero) snprintf(what, sizeof what, "--zero 1");
  else if (best->offload) snprintf(what, sizeof what, "--offload optimizer");
  else snprintf(what, sizeof what, "--optimizer-state %s", best->optim_state);
  fprintf(out, "the setting that helps most alone: %s (%" PRId64 " bytes less over: %" PRId64 " bytes%s%s)\n", what,
          base->over - best->over, best->over, best->over ? " over on " : ", fits", best->over ? best->over_device : "");
}

int fit_search(const FitSpace *sp, FitPlanFn plan, void *ctx, FILE *out, bool quiet, FitCand *chosen) {
  static const char *const recs[] = {"none", "blocks", "auto"};
  static const char *const precs[] = {"fp32", "fp16", "bf16"};
  static const char *const states[] = {"f32", "int8"};
  int64_t per = sp->batch / (sp->replicas > 0 ? sp->replicas : 1);
  int64_t ms[16];
  int n_m = 0;
  for (int64_t m = 1; m <= per && m <= 64 && n_m < 16; m++)
    if (sp->batch % ((int64_t)sp->replicas * m) == 0) ms[n_m++] = m;
  size_t cap = (size_t)sp->group * (size_t)n_m * 2 * 3 * 3 * 2 * 2 * 2 + 1, n = 0;
  FitCand *c = calloc(cap, sizeof *c);
  PlanTable *t = malloc(sizeof *t);
  if (!c || !t) {
    free(c);
    free(t);
    return -1;
  }
  for (int S = 1; S <= sp->group; S++)
    for (int mi = 0; mi < n_m; mi++)
      for (int sch = 0; sch < (ms[mi] > 1 ? 2 : 1); sch++)
        for (int ri = 0; ri < 3; ri++)
          for (int pi = 0; pi < 3; pi++) {
            PrecisionChoice pcx;
            char err[256];
            if (precision_resolve(sp->arch, precs[pi], &pcx, err, sizeof err)) continue; /* bf16 below sm_80 */
            for (int si = 0; si < (sp->adamw ? 2 : 1); si++)
              for (int z = 0; z < (sp->replicas > 1 ? 2 : 1); z++)
                for (int o = 0; o < (sp->replicas > 1 ? 1 : 2); o++) { /* offload: one replica only */
                  FitCand *k = &c[n];
                  *k = (FitCand){.stages = S, .micro_batches = ms[mi], .one_f_one_b = sch == 1, .recompute = recs[ri],
                                 .precision = precs[pi], .optim_state = sp->adamw ? states[si] : NULL, .zero = z,
                                 .offload = o ? "optimizer" : NULL};
                  if (plan(ctx, k, t) == 0) n++; /* -1: a combination the compiler refuses (offload with pruning) */
                }
          }
  /* CPU devices: a 16-bit candidate takes its fp32 twin's time */
  for (size_t i = 0; i < n; i++) {
    c[i].rank_s = c[i].step_s;
    if (!sp->cpu || !strcmp(c[i].precision, "fp32")) continue;
    for (size_t j = 0; j < n; j++) {
      const FitCand *a = &c[i], *b = &c[j];
      if (!strcmp(b->precision, "fp32") && b->compiled && a->stages == b->stages &&
          a->micro_batches == b->micro_batches && a->one_f_one_b == b->one_f_one_b &&
          !strcmp(a->recompute, b->recompute) && a->zero == b->zero && !a->offload == !b->offload &&
          (!a->optim_state || !strcmp(a->optim_state, b->optim_state)))
        c[i].rank_s = b->step_s;
    }
  }
  FitCand *unsorted = malloc((n ? n : 1) * sizeof *unsorted);
  if (!unsorted) {
    free(c);
    free(t);
    return -1;
  }
  memcpy(unsorted, c, n * sizeof *c);
  qsort(c, n, sizeof *c, cmp_fit);
  size_t n_fit = 0;
  for (size_t i = 0; i < n; i++) n_fit += c[i].fits;
  int rc = n_fit ? 0 : 1;
  if (n) *chosen = c[0];
  if (!quiet) {
    fprintf(out, "fit: %s, %d device%s per replica%s, global batch %" PRId64 ": %zu configurations planned, %zu fit\n",
            sp->model, sp->group, sp->group == 1 ? "" : "s", sp->replicas > 1 ? " x --data-parallel" : "", sp->batch,
            n, n_fit);
    print_header(out, sp->cpu);
    size_t show = n_fit ? (n_fit < 10 ? n_fit : 10) : (n < 5 ? n : 5);
    for (size_t i = 0; i < show; i++) print_row(out, (int)i + 1, &c[i]);
    char cmd[2048];
    if (n_fit) {
      fit_command(sp, &c[0], cmd, sizeof cmd);
      fprintf(out, "best: %s\n", cmd);
    } else if (n) {
      char st[200];
      settings(&c[0], st, sizeof st);
      fprintf(out, "nothing fits: the closest (%s) needs %" PRId64 " bytes more than %s has\n", st, c[0].over,
              c[0].over_device);
      most_help(sp, unsorted, (int)n, out);
    }
  }
  free(unsorted);
  free(c);
  free(t);
  return rc;
}

/* ------------------------------------------------------------ json */

static void add_bytes(cJSON *o, const char *name, int64_t v) { cJSON_AddNumberToObject(o, name, (double)v); }

int plan_print_json(const PlanTable *t, const FitSpace *sp, const FitCand *chosen, FILE *out) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return -1;
  cJSON_AddStringToObject(root, "model", t->model);
  cJSON_AddNumberToObject(root, "stages", t->S);
  cJSON_AddNumberToObject(root, "replicas", t->R);
  cJSON_AddNumberToObject(root, "micro_batches", (double)t->M);
  cJSON_AddNumberToObject(root, "batch", (double)(t->batch * t->M * t->R));
  cJSON_AddStringToObject(root, "schedule", t->one_f_one_b ? "1f1b" : "gpipe");
  add_bytes(root, "transfer_bytes", t->xfer_total);
  cJSON_AddNumberToObject(root, "bubble", t->bubble);
  cJSON_AddNumberToObject(root, "step_ms", 1e3 * t->step_s);
  cJSON_AddBoolToObject(root, "fits", t->fits);
  cJSON *devs = cJSON_AddArrayToObject(root, "devices");
  if (!devs) {
    cJSON_Delete(root);
    return -1;
  }
  for (int s = 0; s < t->S; s++) {
    const PlanStage *p = &t->stage[s];
    cJSON *d = cJSON_CreateObject();
    if (!d) {
      cJSON_Delete(root);
      return -1;
    }
    cJSON_AddItemToArray(devs, d);
    cJSON_AddStringToObject(d, "device", p->device ? p->device->name : "cpu");
    add_bytes(d, "capacity", p->device ? p->device->capacity : 0); /* 0: unlimited */
    add_bytes(d, "weights", p->weights - p->master);
    add_bytes(d, "master_weights", p->master);
    add_bytes(d, "grads", p->grads);
    add_bytes(d, "optimizer_state", p->state);
    add_bytes(d, "activations", p->act * p->slots);
    add_bytes(d, "activations_per_micro_batch", p->act);
    cJSON_AddNumberToObject(d, "micro_batches_in_flight", (double)p->slots);
    add_bytes(d, "cache", p->cache);
    add_bytes(d, "workspace", 0); /* op workspaces are planned inside the activation region */
    add_bytes(d, "total", p->need);
    cJSON_AddBoolToObject(d, "fits", p->fits);
  }
  int64_t hm = 0, hs = 0, hg = 0; /* --offload optimizer: the host's row */
  for (int s = 0; s < t->S; s++) hm += t->stage[s].host_master, hs += t->stage[s].host_state, hg += t->stage[s].host_grads;
  if (hm + hs + hg > 0) {
    cJSON *h = cJSON_AddObjectToObject(root, "host");
    if (h) {
      add_bytes(h, "master_weights", hm);
      add_bytes(h, "optimizer_state", hs);
      add_bytes(h, "grads", hg);
      add_bytes(h, "total", hm + hs + hg);
    }
  }
  if (chosen && sp) {
    cJSON *ch = cJSON_AddObjectToObject(root, "chosen");
    char cmd[2048];
    fit_command(sp, chosen, cmd, sizeof cmd);
    if (ch) {
      cJSON_AddNumberToObject(ch, "stages", chosen->stages);
      cJSON_AddNumberToObject(ch, "micro_batches", (double)chosen->micro_batches);
      cJSON_AddStringToObject(ch, "schedule", chosen->one_f_one_b ? "1f1b" : "gpipe");
      cJSON_AddStringToObject(ch, "recompute", chosen->recompute);
      cJSON_AddStringToObject(ch, "precision", chosen->precision);
      if (chosen->optim_state) cJSON_AddStringToObject(ch, "optimizer_state", chosen->optim_state);
      if (sp->replicas > 1) cJSON_AddNumberToObject(ch, "zero", chosen->zero);
      cJSON_AddStringToObject(ch, "offload", chosen->offload ? chosen->offload : "none");
      cJSON_AddBoolToObject(ch, "fits", chosen->fits);
      cJSON_AddNumberToObject(ch, "step_ms", 1e3 * chosen->step_s);
      cJSON_AddStringToObject(ch, "command", cmd);
    }
  }
  char *txt = cJSON_Print(root);
  cJSON_Delete(root);
  if (!txt) return -1;
  fprintf(out, "%s\n", txt);
  free(txt);
  return 0;
}
