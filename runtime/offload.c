#define _POSIX_C_SOURCE 200809L /* posix_memalign */
/* runtime/offload.c: optimizer offload to the host (--offload optimizer;
 * ZeRO-Offload: Ren et al., "ZeRO-Offload: Democratizing Billion-Scale
 * Model Training", USENIX ATC 2021).
 *
 * A pipeline stage (runtime/pipeline.c) with offload keeps its optimizer
 * state (AdamW's moments, 8-bit AdamW's codes and scales, SGD's momentum)
 * and an f32 master copy of its params in host memory (page-locked where
 * the device offers host_alloc: cuMemHostAlloc on CUDA), and runs its
 * optimizer schedule there with the C kernels of the program, on a CPU
 * device of its own.  Each training step, after the stage's gradients are
 * final (summed over the micro-batches, unscaled, clipped), the update:
 *   1. the master copy is refreshed from the device's params when they
 *      were written since the last update (initialisation, a checkpoint
 *      loaded): duet's params are f32 on every device in every precision
 *      (the forward pass casts them where it reads them), so the device's
 *      params and the master copy are the same bytes between updates;
 *   2. every gradient the schedule reads is copied device -> host;
 *   3. the optimizer kernels run on the host, on the master params, the
 *      host state and the host gradients;
 *   4. the stage's param region is copied host -> device.
 * The kernels are the same C functions the CPU device runs, on the same
 * bytes, so on CPU devices a run with offload computes exactly the bits of
 * the run without it.  Each stage does this in its own worker thread as
 * soon as its backward pass is done (a later stage's update overlaps an
 * earlier stage's backward pass) unless fp16 loss scaling or clipping
 * makes the update wait for every stage's verdict. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"

int duet_parse_offload(const char *val, int *out) {
  if (!strcmp(val, "none")) *out = 1 + DUET_OFFLOAD_NONE;
  else if (!strcmp(val, "optimizer")) *out = 1 + DUET_OFFLOAD_OPTIMIZER;
  else {
    fprintf(stderr, "duet: error: --offload expects none or optimizer (the optimizer state and f32 master weights "
                    "in host memory, updated by the CPU), got '%s'\n", val);
    return 1;
  }
  return 0;
}

bool duet_offload_on(const DuetConfig *cfg) { return cfg->offload == 1 + DUET_OFFLOAD_OPTIMIZER; }

const char *duet_offload_refusal(int replicas, int pruned, int decode) {
  if (replicas > 1)
    return "--offload optimizer does not combine with --data-parallel (nor --zero) yet: each replica would keep and "
           "update its own host copy of the whole optimizer state; drop one of them";
  if (pruned)
    return "--offload optimizer does not combine with pruning yet: the masks are applied to the params and the "
           "optimizer state after each update, on the device; drop one of them";
  if (decode) return "--offload optimizer: a decoding program has no optimizer";
  return NULL;
}

int duet_offload_check(const DuetProgram *p, const DuetConfig *cfg, char *err, size_t errlen) {
  if (!duet_offload_on(cfg)) return 0;
  if (p->n_stages < 1) {
    snprintf(err, errlen, "--offload optimizer: this program was compiled without it (compile it with `duet compile "
                          "M.model --offload optimizer`; duet run takes it directly)");
    return -1;
  }
  const char *why = duet_offload_refusal(p->replicas, p->prune != NULL, p->decode);
  if (why) {
    snprintf(err, errlen, "%s", why);
    return -1;
  }
  return 0;
}

struct DuetOffload {
  const DuetProgram *p;
  int stage;
  DuetDevice *dev;        /* the stage's device */
  DuetDevice *host;       /* a CPU device running the C kernels */
  void *dev_params;       /* the stage's param region on its device */
  int64_t param_bytes, state_bytes, grad_bytes;
  char *master, *state, *grads; /* host memory */
  bool pinned;            /* made by dev->ops->host_alloc */
  void **tab;             /* [n_tensors + 1]: host addresses of the schedule's tensors */
  int *grad_ids, n_grads; /* the gradients to copy, in schedule order */
  int64_t *grad_off;      /* [n_grads]: offsets in `grads` */
  int32_t *flags;         /* host copy of the flags words (the kernels' t[n_tensors]; zero) */
  bool stale;             /* the device's params were written since the master copy was made */
  bool fetched;           /* the gradients of this step are on the host (duet_offload_fetch) */
};

static void *host_mem(DuetOffload *o, int64_t bytes) {
  size_t n = bytes > 0 ? (size_t)bytes : 1;
  if (o->pinned) return o->dev->ops->host_alloc(o->dev, n);
  void *m = NULL;
  if (posix_memalign(&m, 64, n)) return NULL;
  memset(m, 0, n);
  return m;
}

static void host_free(DuetOffload *o, void *m) {
  if (!m) return;
  if (o->pinned) o->dev->ops->host_free(o->dev, m);
  else free(m);
}

DuetOffload *duet_offload_new(const DuetProgram *p, int stage, DuetDevice *dev, void *dev_params,
                              const DuetKernelFn *kernels, char *err, size_t errlen) {
  const DuetStage *ps = &p->stages[stage];
  if (!kernels) {
    snprintf(err, errlen, "stage %d: --offload optimizer needs the C kernels (the host runs the update)", stage);
    return NULL;
  }
  DuetOffload *o = calloc(1, sizeof *o);
  if (!o) goto oom;
  o->p = p;
  o->stage = stage;
  o->dev = dev;
  o->dev_params = dev_params;
  o->stale = true;
  o->pinned = dev->ops->host_alloc != NULL && dev->ops->host_free != NULL;
  o->param_bytes = ps->region_bytes[DUET_MEM_PARAM];
  o->state_bytes = ps->region_bytes[DUET_MEM_STATE];
  if (!(o->host = duet_cpu_device(kernels, p->n_kernels, 0)) ||
      !(o->tab = calloc((size_t)p->n_tensors + 1, sizeof *o->tab)) ||
      !(o->grad_ids = calloc((size_t)p->n_tensors + 1, sizeof *o->grad_ids)) ||
      !(o->grad_off = calloc((size_t)p->n_tensors + 1, sizeof *o->grad_off)) ||
      !(o->flags = calloc((size_t)duet_flag_words(p) + 2, sizeof *o->flags)))
    goto oom;
  /* the gradients: every operand of the schedule's kernels that is neither
   * a param nor state (the summed gradient in the stage's arena) */
  for (int j = 0; j < ps->n_opt; j++) {
    const DuetStep *x = &ps->opt[j];
    if ((x->kind == DUET_STEP_KERNEL || x->kind == DUET_STEP_SEND || x->kind == DUET_STEP_RECV) && x->b == 2)
      continue; /* a tied weight's gradient: made on the device before the fetch (pipeline.c, stage_grads) */
    if (x->kind != DUET_STEP_KERNEL) {
      snprintf(err, errlen, "stage %d: --offload optimizer: the optimizer schedule has a step of kind %d, which the "
                            "host does not run", stage, x->kind);
      duet_offload_free(o);
      return NULL;
    }
    for (int a = p->kernel_arg_off[x->kernel]; a < p->kernel_arg_off[x->kernel + 1]; a++) {
      int id = p->kernel_args[a];
      if (id >= p->n_tensors) continue;
      int reg = p->tensors[id].region;
      if (reg == DUET_MEM_PARAM || reg == DUET_MEM_STATE || o->tab[id]) continue;
      o->tab[id] = o; /* marked; the address comes below */
      o->grad_off[o->n_grads] = o->grad_bytes;
      o->grad_ids[o->n_grads++] = id;
      o->grad_bytes += (p->tensors[id].nbytes + 63) & ~(int64_t)63;
    }
  }
  if (!(o->master = host_mem(o, o->param_bytes)) || !(o->state = host_mem(o, o->state_bytes)) ||
      !(o->grads = host_mem(o, o->grad_bytes))) {
    snprintf(err, errlen, "stage %d: --offload optimizer: %" PRId64 " bytes of %shost memory: %s", stage,
             o->param_bytes + o->state_bytes + o->grad_bytes, o->pinned ? "page-locked " : "",
             o->pinned ? dev->err : "out of memory");
    duet_offload_free(o);
    return NULL;
  }
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *t = &p->tensors[i];
    if (t->stage != stage) continue;
    if (t->region == DUET_MEM_PARAM) o->tab[i] = o->master + t->offset;
    else if (t->region == DUET_MEM_STATE) o->tab[i] = o->state + t->offset;
  }
  for (int k = 0; k < o->n_grads; k++) o->tab[o->grad_ids[k]] = o->grads + o->grad_off[k];
  o->tab[p->n_tensors] = o->flags;
  return o;
oom:
  snprintf(err, errlen, "out of host memory");
  duet_offload_free(o);
  return NULL;
}

void duet_offload_print(const DuetProgram *p, const DuetSession *s) {
  int64_t params = 0, state = 0, grads = 0;
  for (int k = 0; k < p->n_stages; k++) {
    params += p->stages[k].region_bytes[DUET_MEM_PARAM];
    state += p->stages[k].region_bytes[DUET_MEM_STATE];
  }
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].is_grad) grads += p->tensors[i].nbytes;
  printf("duet: optimizer offload: optimizer state %.2f MiB and f32 master params %.2f MiB in %shost memory, the "
         "update on the CPU; per step %.2f MiB of gradients to the host and %.2f MiB of params back\n",
         (double)state / 1048576.0, (double)params / 1048576.0, duet_session_offload_pinned(s) ? "page-locked " : "",
         (double)grads / 1048576.0, (double)params / 1048576.0);
}

void *duet_offload_state(DuetOffload *o, int64_t offset) { return o->state + offset; }

void duet_offload_invalidate(DuetOffload *o) {
  if (o) o->stale = true;
}

int64_t duet_offload_host_bytes(const DuetOffload *o) { return o->param_bytes + o->state_bytes + o->grad_bytes; }

bool duet_offload_pinned(const DuetOffload *o) { return o->pinned; }

void duet_offload_forget(DuetOffload *o) { o->fetched = false; }

int duet_offload_fetch(DuetOffload *o, void *const *dtab, char *err, size_t errlen) {
  const DuetProgram *p = o->p;
  DuetDevice *d = o->dev;
  for (int k = 0; k < o->n_grads; k++) {
    int id = o->grad_ids[k];
    if (d->ops->copy_to_host(d, o->grads + o->grad_off[k], dtab[id], (size_t)p->tensors[id].nbytes)) {
      snprintf(err, errlen, "stage %d: --offload optimizer: copying the gradient %s to the host: %s", o->stage,
               p->tensors[id].name, d->err);
      return -1;
    }
  }
  o->fetched = true;
  return 0;
}

int duet_offload_step(DuetOffload *o, void *const *dtab, const double *s, char *err, size_t errlen) {
  const DuetProgram *p = o->p;
  const DuetStage *ps = &p->stages[o->stage];
  DuetDevice *d = o->dev;
  if (o->stale) {
    if (d->ops->copy_to_host(d, o->master, o->dev_params, (size_t)o->param_bytes)) {
      snprintf(err, errlen, "stage %d: --offload optimizer: reading the params: %s", o->stage, d->err);
      return -1;
    }
    o->stale = false;
  }
  if (!o->fetched && duet_offload_fetch(o, dtab, err, errlen)) return -1;
  o->fetched = false;
  for (int j = 0; j < ps->n_opt; j++)
    if (ps->opt[j].b != 2 && o->host->ops->launch(o->host, ps->opt[j].kernel, o->tab, s)) {
      snprintf(err, errlen, "stage %d: --offload optimizer: %s", o->stage, o->host->err);
      return -1;
    }
  if (o->param_bytes > 0 && d->ops->copy_to_device(d, o->dev_params, o->master, (size_t)o->param_bytes)) {
    snprintf(err, errlen, "stage %d: --offload optimizer: copying the params to the device: %s", o->stage, d->err);
    return -1;
  }
  return 0;
}

void duet_offload_free(DuetOffload *o) {
  if (!o) return;
  host_free(o, o->master);
  host_free(o, o->state);
  host_free(o, o->grads);
  if (o->host) o->host->ops->destroy(o->host);
  free(o->tab);
  free(o->grad_ids);
  free(o->grad_off);
  free(o->flags);
  free(o);
}
