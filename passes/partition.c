/* passes/partition.c: the partition pass (model parallelism).
 *
 * Cuts the graph into S stages, one per device, in topological order of the
 * forward ops, minimising the slowest stage's estimated time (a dynamic
 * programme over cut positions, as PipeDream's planner, Narayanan et al.
 * 2019, restricted to contiguous stages) under each device's memory.  Every
 * other value follows the forward op it belongs to (see assign_rest), and a
 * `transfer` op is inserted for every value used on another device: forward
 * activations, their gradients, skip connections over several stages, tied
 * params.  With one device the pass only checks the @device hints and
 * changes nothing. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* ------------------------------------------------------------ cost model */

/* Peak fp32 rates per compute capability.  Sources: sm_60 P100 PCIe card
 * 9.3 TFLOP/s, 16 GB HBM2 at ~720 GB/s, PCIe 3.0 x16 between cards at ~14
 * GB/s achieved (shared/FACTS.md: tech4gamers.com, hothardware.com,
 * pjreddie/darknet #754); sm_61 P40 11.8 TFLOP/s, 346 GB/s; sm_70 V100 PCIe
 * 14 TFLOP/s, 900 GB/s; sm_75 T4 8.1 TFLOP/s, 320 GB/s; sm_80 A100 40GB
 * 19.5 TFLOP/s, 1555 GB/s; sm_86 A10 31.2 TFLOP/s, 600 GB/s; sm_89 L4 30.3
 * TFLOP/s, 300 GB/s; sm_90 H100 SXM 67 TFLOP/s, 3350 GB/s (NVIDIA product
 * datasheets).  The link is PCIe 3.0/4.0 x16 as achieved, not NVLink. */
static const struct {
  int sm;
  double flops, bw, link;
} cc_rates[] = {
    {60, 9.3e12, 720e9, 14e9},   {61, 11.8e12, 346e9, 14e9},  {70, 14.0e12, 900e9, 14e9},
    {75, 8.1e12, 320e9, 14e9},   {80, 19.5e12, 1555e9, 25e9}, {86, 31.2e12, 600e9, 25e9},
    {89, 30.3e12, 300e9, 25e9},  {90, 67.0e12, 3350e9, 50e9},
};

int part_device_rates(const PartDevice *d, PartRates *r) {
  if (d->cpu) {
    int cores = d->cores > 0 ? d->cores : 1;
    double gf = d->cpu_gflops > 0 ? d->cpu_gflops : PART_CPU_GFLOPS_PER_CORE;
    r->flops = gf * 1e9 * cores;
    r->bytes_per_s = PART_CPU_GBS_PER_CORE * 1e9 * cores;
    r->link_bytes_per_s = PART_CPU_COPY_GBS * 1e9;
    return 0;
  }
  for (size_t i = 0; i < sizeof cc_rates / sizeof *cc_rates; i++)
    if (cc_rates[i].sm == d->sm) {
      r->flops = cc_rates[i].flops;
      r->bytes_per_s = cc_rates[i].bw;
      r->link_bytes_per_s = cc_rates[i].link;
      return 0;
    }
  return -1;
}

static int64_t value_bytes(const Value *v) {
  return v->dtype == DT_VOID ? 0 : (int64_t)dtype_size(v->dtype) * shape_numel(&v->shape);
}

void part_op_cost(const Value *v, double *flops, double *bytes) {
  double f = 0, b = (double)value_bytes(v);
  for (int j = 0; j < v->n_in; j++) b += (double)value_bytes(v->in[j]);
  double n = v->dtype == DT_VOID && v->n_in ? (double)shape_numel(&v->in[0]->shape) : (double)shape_numel(&v->shape);
  switch (v->op) {
  case OP_INPUT: case OP_PARAM: case OP_STATE: case OP_CONST:
    b = 0;
    break;
  case OP_MATMUL: {
    const Value *A = v->in[0];
    int64_t a_cols = A->shape.dim[A->shape.rank - 1];
    double k = v->attr.trans_a ? (double)shape_numel(&A->shape) / (double)a_cols : (double)a_cols;
    f = 2.0 * n * k;
    break;
  }
  case OP_ATTENTION: case OP_ATTENTION_GRAD: { /* q k^T and p v: 4 B T^2 C (x2.5 backward) */
    const Shape *q = &v->in[v->op == OP_ATTENTION ? 0 : 1]->shape;
    f = 4.0 * (double)q->dim[0] * (double)q->dim[1] * (double)q->dim[1] * (double)q->dim[2];
    if (v->op == OP_ATTENTION_GRAD) f *= 2.5;
    break;
  }
  case OP_FUSED: f = n * (v->attr.prog ? v->attr.prog->n : 1); break;
  case OP_ADAMW: f = 12 * n; break;
  case OP_SGD: f = 6 * n; break;
  case OP_TRANSFER: f = 0, b = 0; break;
  default: f = 2 * n; break;
  }
  *flops = f;
  *bytes = b;
}

double part_op_seconds(const Value *v, const PartRates *r) {
  double f, b;
  part_op_cost(v, &f, &b);
  double tf = f / r->flops, tb = b / r->bytes_per_s;
  return tf > tb ? tf : tb;
}

/* ------------------------------------------------------------ the pass */

/* The block a pinned value belongs to: the prefix ("layer2" of
 * "layer2.linear1.w") of the nearest param before it pinned to the same
 * device (a block's params are made right before its ops), else NULL. */
static const char *pinned_block(Graph *g, const Value *v) {
  for (int i = v->id; i >= 0; i--) {
    const Value *p = g->values[i];
    if (p->op != OP_PARAM || p->device != v->device || !p->attr.name) continue;
    const char *dot = strrchr(p->attr.name, '.');
    return dot ? arena_printf(g->arena, "%.*s", (int)(dot - p->attr.name), p->attr.name) : p->attr.name;
  }
  return NULL;
}

static const char *block_text(Graph *g, const Value *v) {
  const char *b = pinned_block(g, v);
  return b ? arena_printf(g->arena, "block `%s`", b) : "the expression";
}

/* Where a pinned value's @device(N) hint is written (else the value's own
 * location): pin errors point at the hint. */
static Loc pin_loc(const Value *v) { return v->device_loc.line > 0 ? v->device_loc : v->loc; }

/* Forward compute ops: what the dynamic programme places. */
static bool is_forward_op(const Value *v) {
  return v->role == ROLE_FORWARD && v->op != OP_INPUT && v->op != OP_PARAM && v->op != OP_STATE &&
         v->op != OP_CONST;
}

typedef struct Part {
  Graph *g;
  PassCtx *cx;
  int S, N;
  Value **F;      /* forward ops in order */
  int *fidx;      /* value id -> index in F, -1 */
  PartRates *rates;
} Part;

/* Stages of the forward ops by dynamic programming: best[s][b] is the
 * smallest possible slowest-stage time when stages 0..s hold F[0..b). */
/* Micro-batches per replica: those a stage's activations are kept for
 * (data parallelism splits train.micro_batches among the replicas). */
static int64_t local_micro_batches(const Graph *g) {
  int64_t M = g->train.micro_batches > 1 ? g->train.micro_batches : 1;
  return g->replicas > 1 && M % g->replicas == 0 ? M / g->replicas : M;
}

static void place_forward(Part *P, int *stage_of_f) {
  Graph *g = P->g;
  int S = P->S, N = P->N;
  int64_t M = local_micro_batches(g);
  Arena *a = g->arena;
  /* per-device prefix sums of op time (forward + backward ~ 3x forward,
   * Narayanan et al. 2021), of activation and of param bytes */
  double **pre = arena_alloc(a, (size_t)S * sizeof *pre);
  for (int s = 0; s < S; s++) {
    pre[s] = arena_alloc(a, ((size_t)N + 1) * sizeof **pre);
    for (int i = 0; i < N; i++) pre[s][i + 1] = pre[s][i] + 3.0 * part_op_seconds(P->F[i], &P->rates[s]);
  }
  double *act = arena_alloc(a, ((size_t)N + 1) * sizeof *act), *par = arena_alloc(a, ((size_t)N + 1) * sizeof *par);
  double *cross = arena_alloc(a, ((size_t)N + 2) * sizeof *cross);
  /* param + grad + state, in param sizes: AdamW 2 moments (8-bit: 2 bytes
   * of codes and 8 bytes of scales per 2048 values, for 4-byte params) */
  double optf = g->train.optimizer != OPTIM_ADAMW ? 3.0 : g->train.state_int8 ? 2.0 + (2.0 + 8.0 / IR_Q8_BLOCK) / 4 : 4.0;
  for (int i = 0; i < N; i++) {
    Value *v = P->F[i];
    act[i + 1] = act[i] + (double)value_bytes(v);
    par[i + 1] = par[i];
  }
  /* params: counted at their first forward consumer; crossing bytes: a value
   * made before cut b and used at or after it */
  int *first_use = arena_alloc(a, (size_t)g->n_values * sizeof *first_use);
  int *last_use = arena_alloc(a, (size_t)g->n_values * sizeof *last_use);
  for (int i = 0; i < g->n_values; i++) first_use[i] = -1, last_use[i] = -1;
  for (int i = 0; i < N; i++)
    for (int j = 0; j < P->F[i]->n_in; j++) {
      int x = P->F[i]->in[j]->id;
      if (first_use[x] < 0) first_use[x] = i;
      last_use[x] = i;
    }
  for (int x = 0; x < g->n_values; x++) {
    Value *v = g->values[x];
    if (v->op == OP_PARAM && first_use[x] >= 0)
      for (int i = first_use[x] + 1; i <= N; i++) par[i] += optf * (double)value_bytes(v);
    int from = P->fidx[x] >= 0 ? P->fidx[x] + 1 : (v->op == OP_PARAM || v->op == OP_INPUT) ? first_use[x] + 1 : -1;
    if (from < 0 || last_use[x] < from) continue;
    for (int b = from; b <= last_use[x]; b++) cross[b] += (double)value_bytes(v);
  }
  double *best = arena_alloc(a, (size_t)S * ((size_t)N + 1) * sizeof *best);
  int *arg = arena_alloc(a, (size_t)S * ((size_t)N + 1) * sizeof *arg);
  /* pins: bad[s][i] = pinned ops in F[0..i) on a device other than s */
  int **bad = arena_alloc(a, (size_t)S * sizeof *bad);
  for (int s = 0; s < S; s++) {
    bad[s] = arena_alloc(a, ((size_t)N + 1) * sizeof **bad);
    for (int i = 0; i < N; i++) bad[s][i + 1] = bad[s][i] + (P->F[i]->device >= 0 && P->F[i]->device != s);
  }
  const double INF = HUGE_VAL;
  for (int s = 0; s < S; s++)
    for (int b = 0; b <= N; b++) {
      double bs = INF;
      int ba = -1;
      for (int aa = s == 0 ? 0 : s; aa < b; aa++) {
        if (s == 0 && aa != 0) break;
        double prev = s == 0 ? 0 : best[(s - 1) * (N + 1) + aa];
        if (prev == INF || bad[s][b] - bad[s][aa]) continue;
        const PartDevice *d = &P->cx->devices[s];
        double inflight = P->cx->one_f_one_b ? (double)(M < S - s ? M : S - s) : (double)M;
        double mem = (par[b] - par[aa]) + (act[b] - act[aa]) * inflight;
        if (d->capacity > 0 && mem > (double)d->capacity) continue;
        double t = pre[s][b] - pre[s][aa];
        if (b < N) t += 2.0 * cross[b] / P->rates[s].link_bytes_per_s; /* activations out, gradients in */
        double m = prev > t ? prev : t;
        if (m < bs) bs = m, ba = aa;
      }
      best[s * (N + 1) + b] = bs;
      arg[s * (N + 1) + b] = ba;
    }
  if (best[(S - 1) * (N + 1) + N] == INF) {
    /* why: a pin that empties a device, else memory */
    for (int s = 0; s < S; s++) {
      bool any = false;
      for (int i = 0; i < N && !any; i++) any = P->F[i]->device < 0 || P->F[i]->device == s;
      if (!any)
        diag_error_noloc(g->diag, "the @device hints leave device %d (%s) without ops: every stage needs at least one", s,
                         P->cx->devices[s].name);
    }
    for (int i = 0; i < N; i++) {
      int dv = P->F[i]->device;
      if (dv < 0) continue;
      if (dv > i)
        diag_error(g->diag, pin_loc(P->F[i]), "%s is pinned to device %d, but the %d ops before it cannot fill devices "
                   "0..%d (every stage needs at least one op)", block_text(g, P->F[i]), dv, i, dv - 1);
      if (N - 1 - i < S - 1 - dv)
        diag_error(g->diag, pin_loc(P->F[i]), "%s is pinned to device %d, but the %d ops after it cannot fill devices "
                   "%d..%d (every stage needs at least one op)", block_text(g, P->F[i]), dv, N - 1 - i, dv + 1, S - 1);
    }
    bool pins = false;
    for (int i = 0; i < N; i++) pins |= P->F[i]->device >= 0;
    if (pins)
      diag_error_noloc(g->diag, "no split into %d stages puts every pinned op on its @device, leaves no stage empty "
                       "and keeps every stage within its memory", S);
    double cap = 0;
    const char *from = NULL; /* where a CPU device's figure came from */
    for (int k = 0; k < S; k++) {
      cap += (double)P->cx->devices[k].capacity;
      if (!from) from = P->cx->devices[k].capacity_from;
    }
    diag_error_noloc(g->diag, "the model does not fit the devices: its params with gradients and optimizer state take "
                     "%.2f MiB and its activations %.2f MiB per micro-batch in flight (%s), against %.2f MiB on %d "
                     "device%s%s%s%s; no split into %d stage%s keeps every stage within its memory", par[N] / 1048576.0,
                     act[N] / 1048576.0, P->cx->one_f_one_b ? "1f1b: up to S - s" : "gpipe: M", cap / 1048576.0, S,
                     S == 1 ? "" : "s", from ? " (" : "", from ? from : "", from ? ")" : "", S, S == 1 ? "" : "s");
  }
  for (int s = S - 1, b = N; s >= 0; s--) {
    int aa = arg[s * (N + 1) + b];
    for (int i = aa; i < b; i++) stage_of_f[i] = s;
    b = aa;
  }
}

/* Every value besides the forward ops.  Params and inputs go with their
 * first forward consumer.  A backward or eval op b goes where the forward
 * op it differentiates is: the latest stage of the forward values it reads
 * (activations, params), F(b), raised to the stage its gradient consumers
 * want, L(b) (a param's gradient to the param's stage), and lowered to the
 * earliest stage of the gradients it reads, U(b), so that gradients only
 * flow to earlier stages (a part of a gradient that tie_grads sums once
 * per step wants the stage of the param's update).  Constants and optimizer state go to their
 * earliest consumer; an optimizer update to its param. */
static void assign_rest(Part *P) {
  Graph *g = P->g;
  int n = g->n_values;
  Arena *a = g->arena;
  for (int i = 0; i < n; i++)
    if (P->fidx[i] < 0) g->values[i]->device = -1;
  /* consumers, CSR */
  int *cnt = arena_alloc(a, ((size_t)n + 1) * sizeof *cnt), *fill = arena_alloc(a, ((size_t)n + 1) * sizeof *fill);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->values[i]->n_in; j++) cnt[g->values[i]->in[j]->id + 1]++;
  for (int i = 0; i < n; i++) cnt[i + 1] += cnt[i];
  Value **use = arena_alloc(a, ((size_t)cnt[n] + 1) * sizeof *use);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->values[i]->n_in; j++) {
      int x = g->values[i]->in[j]->id;
      use[cnt[x] + fill[x]++] = g->values[i];
    }
  for (int i = 0; i < n; i++) {
    Value *c = g->values[i];
    for (int j = 0; j < c->n_in; j++) {
      Value *x = c->in[j];
      if ((x->op == OP_PARAM || x->op == OP_INPUT) && x->device < 0 && P->fidx[c->id] >= 0) x->device = c->device;
    }
  }
  for (int i = 0; i < n; i++) { /* params and inputs used only outside the forward pass */
    Value *v = g->values[i];
    if ((v->op == OP_PARAM || v->op == OP_INPUT) && v->device < 0) v->device = 0;
  }
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    if (v->op == OP_ADAMW || v->op == OP_SGD || v->op == OP_PRUNE_MASK) v->device = v->in[0]->device;
  }
  int *F = arena_alloc(a, (size_t)n * sizeof *F), *L = arena_alloc(a, (size_t)n * sizeof *L);
#define GRADLIKE(v) (((v)->role == ROLE_BACKWARD || (v)->role == ROLE_EVAL) && (v)->op != OP_CONST)
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    F[i] = -1;
    if (!GRADLIKE(v)) continue;
    for (int j = 0; j < v->n_in; j++) {
      Value *x = v->in[j];
      if (x->role == ROLE_BACKWARD || x->op == OP_CONST || x->op == OP_STATE) continue;
      if (x->device > F[i]) F[i] = x->device;
    }
  }
  for (int i = n - 1; i >= 0; i--) {
    Value *v = g->values[i];
    L[i] = -1;
    if (!GRADLIKE(v)) continue;
    for (int k = cnt[i]; k < cnt[i + 1]; k++) {
      Value *c = use[k];
      /* tie_grads' add (an optimizer-role add of two gradient parts) has one
       * use, the update: its parts want the update's stage too, or a part
       * that reads only an earlier stage's forward values would stay there
       * and send its gradient up to the param's stage */
      bool tied_add = c->op == OP_ADD && c->role == ROLE_OPTIMIZER && cnt[c->id + 1] > cnt[c->id];
      int want = c->op == OP_ADAMW || c->op == OP_SGD ? c->device
                 : tied_add                           ? use[cnt[c->id]]->device
                 : GRADLIKE(c)                        ? (F[c->id] > L[c->id] ? F[c->id] : L[c->id])
                                                      : -1;
      if (want > L[i]) L[i] = want;
    }
  }
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    if (!GRADLIKE(v)) continue;
    int st = F[i] > L[i] ? F[i] : L[i], U = -1;
    for (int j = 0; j < v->n_in; j++) {
      Value *x = v->in[j];
      if (GRADLIKE(x) && x->role == ROLE_BACKWARD && (U < 0 || x->device < U)) U = x->device;
    }
    if (U >= 0 && (st < 0 || st > U)) st = U;
    v->device = st >= 0 ? st : 0;
  }
#undef GRADLIKE
  /* constants and optimizer state, in reverse: the earliest consumer */
  for (int i = n - 1; i >= 0; i--) {
    Value *v = g->values[i];
    if (v->device >= 0) continue;
    int st = -1;
    for (int k = cnt[i]; k < cnt[i + 1]; k++)
      if (use[k]->device >= 0 && (st < 0 || use[k]->device < st)) st = use[k]->device;
    v->device = st >= 0 ? st : 0;
  }
}

/* One transfer per (value, other device that uses it), operands rewired.
 * A transfer goes right after its value (the sender copies it out as soon
 * as it exists), with the value's role: forward activations to later
 * stages, gradients to earlier ones.  A forward value that a backward op of
 * an earlier stage reads is sent during the backward pass, right before its
 * first consumer (the value stays live on its stage until then). */
static void insert_transfers(Part *P) {
  Graph *g = P->g;
  int n = g->n_values, S = P->S;
  Value **xfer = arena_alloc(g->arena, (size_t)n * (size_t)S * sizeof *xfer);
  int *before = arena_alloc(g->arena, ((size_t)n * (size_t)S + 1) * sizeof *before); /* late: consumer position + 1 */
  int n_new = 0;
  for (int i = 0; i < n; i++) {
    Value *c = g->values[i];
    for (int j = 0; j < c->n_in; j++) {
      Value *x = c->in[j];
      if (x->device == c->device) continue;
      size_t k = (size_t)x->id * (size_t)S + (size_t)c->device;
      if (!xfer[k]) {
        Value *in = x;
        xfer[k] = graph_add(g, OP_TRANSFER, &in, 1, NULL, x->loc);
        xfer[k]->device = c->device;
        xfer[k]->role = x->role == ROLE_BACKWARD ? ROLE_BACKWARD : x->role == ROLE_EVAL ? ROLE_EVAL : ROLE_FORWARD;
        if (x->role == ROLE_BACKWARD && c->role == ROLE_OPTIMIZER) { /* a tied weight's gradient part (tie_grads) */
          xfer[k]->role = ROLE_OPTIMIZER;
          before[k] = i + 1;
        }
        if (x->role != ROLE_BACKWARD && x->device > c->device) {
          if (c->role != ROLE_BACKWARD)
            duet_fatal(__FILE__, __LINE__, "partition: %%%d flows from stage %d back to %d", x->id, x->device,
                       c->device);
          xfer[k]->role = ROLE_BACKWARD;
          before[k] = i + 1;
        }
        if (x->role == ROLE_BACKWARD && x->device < c->device)
          duet_fatal(__FILE__, __LINE__, "partition: gradient %%%d flows from stage %d up to %d", x->id, x->device,
                     c->device);
        n_new++;
      }
      c->in[j] = xfer[k];
    }
  }
  Value **order = arena_alloc(g->arena, ((size_t)n + (size_t)n_new) * sizeof *order);
  int k = 0;
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    int first = k;
    for (int x = 0; x < i; x++) /* late transfers of earlier values, right before value i */
      for (int s = 0; s < S; s++)
        if (before[(size_t)x * (size_t)S + (size_t)s] == i + 1) order[k++] = xfer[(size_t)x * (size_t)S + (size_t)s];
    (void)first;
    order[k++] = v;
    for (int s = 0; s < S; s++) {
      size_t q = (size_t)i * (size_t)S + (size_t)s;
      if (xfer[q] && !before[q]) order[k++] = xfer[q];
    }
  }
  DUET_ASSERT(k == n + n_new && g->n_values == n + n_new);
  memcpy(g->values, order, (size_t)k * sizeof *order);
  graph_renumber(g);
  /* a param's gradient is the optimizer's (local) operand */
  for (int i = 0; i < g->n_values; i++) {
    Value *u = g->values[i];
    if (u->op == OP_ADAMW || u->op == OP_SGD) u->in[0]->grad = u->in[1];
  }
  graph_count_uses(g);
}

/* Tied weights (a param used on two stages: the tied embedding of a GPT,
 * token lookup on the first stage, output head on the last), as
 * Megatron-LM's embedding group (Shoeybi et al. 2019; Narayanan et al.
 * 2021, section 2.2): with M > 1 micro-batches, a param whose gradient is
 * the sum of two parts (autodiff's add of the gradients of its two uses)
 * gets each part summed over the micro-batches where it is computed, and
 * the two sums added once per step, right before the update: the add
 * becomes an optimizer op, moved before its update; on several stages the
 * part of another stage then crosses once per step (insert_transfers gives
 * its transfer the optimizer role), not once per micro-batch, and the
 * param's forward copy is sent once per step too (ir_param_transfer).  The
 * same on one device with micro-batches, so that S stages do the
 * arithmetic of one device bit for bit; with data parallelism (M counts
 * the micro-batches of all replicas) each part is summed over the replicas
 * before the add (data_parallel.c buckets the parts), as Megatron-LM
 * all-reduces the embedding's gradient over its data-parallel group before
 * the embedding group, so R replicas do the arithmetic of one device too.
 * Not with gradient clipping, whose norms read whole gradients before the
 * update (a --clip-grad-norm given to the command: cx->clip), nor with
 * 16-bit training (its gradients are unscaled before the update, not a
 * plain add): those keep the per-micro-batch sum and transfer. */
static void tie_grads(Graph *g, const PassCtx *cx) {
  if (g->train.micro_batches <= 1 || g->train.clip_grad_norm > 0 || cx->clip) return;
  graph_count_uses(g);
  int n = g->n_values, moved = 0;
  Value **later = arena_alloc(g->arena, ((size_t)n + 1) * sizeof *later); /* update id -> its tied add */
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i], *a = u->n_in > 1 ? u->in[1] : NULL;
    later[i] = NULL;
    if (!(u->op == OP_ADAMW || u->op == OP_SGD) || !a || a->op != OP_ADD || a->role != ROLE_BACKWARD ||
        a->n_uses != 1 || a->dtype != DT_F32)
      continue;
    bool parts = true;
    for (int j = 0; j < 2; j++)
      parts &= a->in[j]->role == ROLE_BACKWARD && a->in[j]->n_uses == 1 && a->in[j]->dtype == DT_F32 &&
               shape_eq(&a->in[j]->shape, &a->shape);
    if (!parts) continue;
    a->role = ROLE_OPTIMIZER;
    later[i] = a;
    moved++;
  }
  if (!moved) return;
  Value **order = arena_alloc(g->arena, (size_t)n * sizeof *order);
  int k = 0;
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    if (v->op == OP_ADD && v->role == ROLE_OPTIMIZER) continue; /* placed before its update */
    if (later[i]) order[k++] = later[i];
    order[k++] = v;
  }
  DUET_ASSERT(k == n);
  memcpy(g->values, order, (size_t)n * sizeof *order);
  graph_renumber(g);
  graph_count_uses(g);
}

void pass_partition(Graph *g, PassCtx *cx) {
  int S = cx->n_devices > 0 ? cx->n_devices : 1;
  if (S > IR_MAX_STAGES) diag_error_noloc(g->diag, "%d devices: at most %d are supported", S, IR_MAX_STAGES);
  /* hints: a device that does not exist, pins against the stage order.
   * Without --devices the model runs on the one CPU and hints are kept as
   * annotations only (a model written for two GPUs still runs anywhere). */
  const Value *prev = NULL;
  for (int i = 0; i < g->n_values && cx->n_devices > 0; i++) {
    Value *v = g->values[i];
    if (v->device < 0) continue;
    if (v->device >= S) {
      const char *what = block_text(g, v);
      diag_error(g->diag, pin_loc(v), "%s is pinned to device %d (@device(%d)), but --devices gives only %d device%s", what,
                 v->device, v->device, S, S == 1 ? "" : "s");
    }
    if (is_forward_op(v)) {
      if (prev && v->device < prev->device) {
        const char *a = block_text(g, prev), *b = block_text(g, v);
        diag_error(g->diag, pin_loc(v), "%s is pinned to device %d but comes after %s on device %d: stages run in "
                   "order, so pinned blocks must follow the device order", b, v->device, a, prev->device);
      }
      prev = v;
    }
  }
  tie_grads(g, cx);
  if (S == 1) return;
  Part P = {.g = g, .cx = cx, .S = S};
  P.rates = arena_alloc(g->arena, (size_t)S * sizeof *P.rates);
  for (int s = 0; s < S; s++)
    if (part_device_rates(&cx->devices[s], &P.rates[s]))
      diag_error_noloc(g->diag, "device %s: no rates known for sm_%d (known: sm_60, 61, 70, 75, 80, 86, 89, 90)",
                       cx->devices[s].name, cx->devices[s].sm);
  P.F = arena_alloc(g->arena, (size_t)g->n_values * sizeof *P.F);
  P.fidx = arena_alloc(g->arena, (size_t)g->n_values * sizeof *P.fidx);
  for (int i = 0; i < g->n_values; i++) {
    P.fidx[i] = -1;
    if (is_forward_op(g->values[i])) {
      P.fidx[i] = P.N;
      P.F[P.N++] = g->values[i];
    }
  }
  if (P.N < S)
    diag_error_noloc(g->diag, "the model has %d forward ops, fewer than the %d devices: no stage may be empty", P.N, S);
  int *st = arena_alloc(g->arena, (size_t)P.N * sizeof *st);
  place_forward(&P, st);
  for (int i = 0; i < P.N; i++) P.F[i]->device = st[i];
  assign_rest(&P);
  insert_transfers(&P);
  g->n_stages = S;
}

/* ------------------------------------------------------------ the report */

static int64_t align64_bytes(int64_t b) { return (b + 63) & ~(int64_t)63; }

/* Whether the graph will run as a pipeline (codegen/lower.c: several
 * stages or micro-batches), whose stages sum each micro-batch's gradients
 * into accumulators of their own (runtime/pipeline.c stage_new: every
 * gradient an update reads, 64-byte aligned, unless each replica takes one
 * micro-batch); a program of one device and one micro-batch has none. */
static bool has_accumulators(const Graph *g) {
  bool off = train_offload(&g->train); /* runtime/offload.c: a pipeline, even of one stage */
  bool piped = g->n_stages > 1 || g->train.micro_batches > 1 || off;
  return piped && !((g->replicas > 1 || off) && local_micro_batches(g) == 1);
}

/* The memory stage s needs, as `duet plan` counts it (PlanStage's memory
 * fields): what the runtime allocates on its device. */
static void stage_memory(const Graph *g, const PassCtx *cx, int s, PlanStage *m) {
  int S = g->n_stages > 1 ? g->n_stages : 1;
  int64_t M = local_micro_batches(g);
  bool acc = has_accumulators(g);
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    if (!acc || (v->op != OP_ADAMW && v->op != OP_SGD)) continue;
    const Value *gr = v->in[1];
    if (ir_tied_add(gr)) { /* a tied weight: an accumulator per part, on the part's stage */
      for (int j = 0; j < gr->n_in; j++) {
        const Value *x = ir_tied_part(gr->in[j]);
        if ((x->device < 0 ? 0 : x->device) == s) m->grads += align64_bytes(value_bytes(x));
      }
      continue;
    }
    if ((gr->device < 0 ? 0 : gr->device) != s) continue;
    bool seen = false; /* the runtime keeps one accumulator per gradient tensor */
    for (int j = 0; j < i && !seen; j++) {
      const Value *u = g->values[j];
      seen = (u->op == OP_ADAMW || u->op == OP_SGD) && u->in[1] == gr;
    }
    if (!seen) m->grads += align64_bytes(value_bytes(gr));
  }
  /* f32 master weights: params that the precision pass casts to 16 bits */
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    if (v->op != OP_CAST || v->in[0]->op != OP_PARAM || (v->dtype != DT_F16 && v->dtype != DT_BF16)) continue;
    const Value *p = v->in[0];
    if ((p->device < 0 ? 0 : p->device) != s) continue;
    bool seen = false;
    for (int j = 0; j < i && !seen; j++) {
      const Value *u = g->values[j];
      seen = u->op == OP_CAST && u->in[0] == p && (u->dtype == DT_F16 || u->dtype == DT_BF16);
    }
    if (!seen) m->master += align64_bytes(value_bytes(p));
  }
  const int64_t *rb = g->n_stages > 1 ? g->stage_bytes[s] : g->region_bytes;
  m->slots = cx->one_f_one_b ? (M < S - s ? M : S - s) : M;
  m->weights = rb[MEM_PARAM];
  if (m->master > m->weights) m->master = m->weights;
  m->state = m->state_all = rb[MEM_STATE];
  if (g->replicas > 1) { /* ZeRO stage 1: each replica's shard (on, or what --zero 1 would make) */
    int64_t all;
    m->state_zero = data_parallel_zero_state(g, s, &all, m->shard);
    if (g->zero) m->state = m->state_zero;
  }
  m->act = rb[MEM_ARENA];
  m->cache = rb[MEM_CACHE];
  if (train_offload(&g->train)) { /* runtime/offload.c: state and an f32 master copy on the host */
    m->host_state = m->state;
    m->host_master = rb[MEM_PARAM];
    m->state = 0; /* (and with one micro-batch no accumulators: has_accumulators) */
    for (int i = 0; i < g->n_values; i++) { /* the host's copy of each gradient an update reads */
      const Value *v = g->values[i];
      if (v->op != OP_ADAMW && v->op != OP_SGD) continue;
      const Value *gr = v->in[1];
      if ((gr->device < 0 ? 0 : gr->device) != s) continue;
      bool seen = false;
      for (int j = 0; j < i && !seen; j++) {
        const Value *u = g->values[j];
        seen = (u->op == OP_ADAMW || u->op == OP_SGD) && u->in[1] == gr;
      }
      if (!seen) m->host_grads += align64_bytes(value_bytes(gr));
    }
  }
  m->need = rb[MEM_PARAM] + m->state + rb[MEM_CACHE] + rb[MEM_ARENA] * m->slots + m->grads;
}

int64_t partition_micro_batches(const Graph *g) { return local_micro_batches(g); }

void partition_plan_stage(const Graph *g, const PassCtx *cx, int s, PlanStage *ps) {
  memset(ps, 0, sizeof *ps);
  const PartDevice *d = cx->n_devices > s ? &cx->devices[s] : NULL;
  int64_t M = local_micro_batches(g);
  PartRates r = {PART_CPU_GFLOPS_PER_CORE * 1e9, PART_CPU_GBS_PER_CORE * 1e9, PART_CPU_COPY_GBS * 1e9};
  if (d) part_device_rates(d, &r);
  ps->device = d;
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    if ((v->device < 0 ? 0 : v->device) != s) continue;
    double t = part_op_seconds(v, &r);
    bool once = false; /* a tied weight: its value and its gradient part cross once per step */
    if (v->op == OP_TRANSFER) {
      int64_t b = value_bytes(v);
      once = ir_param_transfer(v) || v->role == ROLE_OPTIMIZER;
      if (v->role != ROLE_EVAL) ps->xfer += once ? b : b * M;
      t = (double)b / r.link_bytes_per_s;
    }
    if (once) ps->t_o += t;
    else if (v->role == ROLE_FORWARD) ps->t_f += t;
    else if (v->role == ROLE_BACKWARD) ps->t_b += t;
    else if (v->role == ROLE_OPTIMIZER) ps->t_o += t;
    if (v->op == OP_PARAM && v->attr.name) {
      if (!ps->first) ps->first = v->attr.name;
      ps->last = v->attr.name;
    }
    ps->n_ops += is_forward_op(v);
  }
  stage_memory(g, cx, s, ps);
  if (train_offload(&g->train)) { /* the update on the host: one core's rates, and the copies over the link */
    PartDevice h = {.name = "host", .cpu = true, .cores = 1};
    PartRates hr;
    part_device_rates(&h, &hr);
    ps->t_o = 0;
    for (int i = 0; i < g->n_values; i++) {
      const Value *v = g->values[i];
      if ((v->device < 0 ? 0 : v->device) == s && v->role == ROLE_OPTIMIZER) ps->t_o += part_op_seconds(v, &hr);
    }
    ps->t_o += (double)(ps->host_grads + ps->host_master) / r.link_bytes_per_s;
  }
  ps->step_s = (double)M * (ps->t_f + ps->t_b) + ps->t_o;
  int64_t host = d && d->cpu ? ps->host_master + ps->host_state + ps->host_grads : 0; /* --offload on a CPU */
  ps->fits = !(d && d->capacity > 0 && ps->need + host > d->capacity);
}

int64_t partition_stage_need(const Graph *g, const PassCtx *cx, int s) {
  PlanStage m = {0};
  stage_memory(g, cx, s, &m);
  return m.need;
}

int64_t partition_offload_host_bytes(const Graph *g, const PassCtx *cx) {
  int64_t h = 0;
  for (int s = 0; s < (g->n_stages > 1 ? g->n_stages : 1); s++) {
    PlanStage m = {0};
    stage_memory(g, cx, s, &m);
    h += m.host_master + m.host_state + m.host_grads;
  }
  return h;
}

/* The settings that lower a stage's memory, for the message of a
 * configuration that does not fit (those not in use already). */
static void help_settings(const Graph *g, const PassCtx *cx, int S, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
#define ADD(...) (len += (size_t)snprintf(buf + len, len < n ? n - len : 0, __VA_ARGS__))
  bool master = false, int8 = false, recompute = false, blocks = false, adamw = false;
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    blocks |= v->block > 0;
    adamw |= v->op == OP_ADAMW;
    master |= v->op == OP_CAST && v->in[0]->op == OP_PARAM && (v->dtype == DT_F16 || v->dtype == DT_BF16);
    int8 |= v->op == OP_STATE && v->dtype == DT_U8;
    recompute |= v->block > 0 && v->role == ROLE_BACKWARD;
  }
  if (!recompute && blocks) ADD("--recompute blocks or auto");
  if (!master) ADD("%s--precision fp16 (or bf16)", len ? ", " : "");
  if (!int8 && adamw) ADD("%s--optimizer-state int8", len ? ", " : "");
  if (S < IR_MAX_STAGES) ADD("%smore --devices (stages)", len ? ", " : "");
  if (!cx->one_f_one_b) ADD("%s--micro-batches N with --schedule 1f1b", len ? ", " : "");
  ADD("%sa smaller --batch", len ? ", " : "");
  if (g->replicas > 1 && !g->zero) ADD(", --zero 1");
  ADD("; duet plan --fit searches them");
#undef ADD
}

int partition_check_memory(const Graph *g, const PassCtx *cx) {
  int S = g->n_stages > 1 ? g->n_stages : 1, rc = 0;
  for (int s = 0; s < S && s < cx->n_devices; s++) {
    const PartDevice *d = &cx->devices[s];
    PlanStage m = {0};
    stage_memory(g, cx, s, &m);
    if (d->cpu) m.need += m.host_master + m.host_state + m.host_grads; /* --offload: the host is this memory */
    if (d->capacity <= 0 || m.need <= d->capacity) continue;
    if (m.weights > d->capacity) { /* nothing but more devices helps (16-bit copies keep f32 masters) */
      diag_error_noloc(cx->diag, "the model does not fit the memory of %s: its weights alone take %.2f MiB (%" PRId64
                       " bytes), more than the %.2f MiB available (%s); only more --devices (stages) or more memory "
                       "help", d->name, m.weights / 1048576.0, m.weights, d->capacity / 1048576.0,
                       d->capacity_from ? d->capacity_from : "its capacity");
      rc = 1;
      continue;
    }
    char help[400];
    help_settings(g, cx, S, help, sizeof help);
    diag_error_noloc(cx->diag, "the model does not fit the memory of %s: it needs %.2f MiB (weights %.2f, grads %.2f, "
                     "optimizer state %.2f, activations %.2f MiB), and %.2f MiB are available (%s): %" PRId64
                     " bytes too many; what would help: %s",
                     d->name, m.need / 1048576.0, m.weights / 1048576.0, m.grads / 1048576.0, m.state / 1048576.0,
                     (double)(m.act * m.slots) / 1048576.0, d->capacity / 1048576.0,
                     d->capacity_from ? d->capacity_from : "its capacity", m.need - d->capacity, help);
    rc = 1;
  }
  return rc;
}

void partition_plan(const Graph *g, const PassCtx *cx, PlanTable *t) {
  memset(t, 0, sizeof *t);
  int S = g->n_stages > 1 ? g->n_stages : 1, R = g->replicas > 1 ? g->replicas : 1;
  int64_t M = local_micro_batches(g);
  t->model = g->model_name ? g->model_name : "?";
  t->S = S;
  t->R = R;
  t->M = M;
  t->batch = g->train.batch;
  t->one_f_one_b = cx->one_f_one_b;
  t->zero = g->zero;
  t->fits = true;
  double slowest = 0, total = 0;
  for (int s = 0; s < S; s++) {
    PlanStage *ps = &t->stage[s];
    partition_plan_stage(g, cx, s, ps);
    if (!ps->fits) t->fits = false;
    if (ps->need > t->need_most) t->need_most = ps->need;
    if (ps->step_s > slowest) slowest = ps->step_s;
    total += ps->step_s;
    t->xfer_total += ps->xfer;
  }
  t->bubble = (double)(S - 1) / (double)(M + S - 1);
  t->slowest_s = slowest;
  t->step_s = slowest * (double)(M + S - 1) / (double)M;
  t->balance = S > 1 && slowest > 0 ? total / ((double)S * slowest) : 1.0;
  if (!t->fits) help_settings(g, cx, S, t->help, sizeof t->help);
}

int partition_report(const Graph *g, const PassCtx *cx, FILE *out) {
  bool one_f_one_b = cx->one_f_one_b;
  int S = g->n_stages > 1 ? g->n_stages : 1, R = g->replicas > 1 ? g->replicas : 1;
  int64_t M = local_micro_batches(g);
  int rc = 0;
  if (R > 1)
    fprintf(out, "plan: %s, %d replicas on %d device%s each, %" PRId64 " micro-batch%s of %" PRId64 " per replica "
            "(global batch %" PRId64 "), schedule %s; the stages below are every replica's\n",
            g->model_name ? g->model_name : "?", R, S, S > 1 ? "s" : "", M, M > 1 ? "es" : "", g->train.batch,
            g->train.batch * M * R, one_f_one_b ? "1f1b" : "gpipe");
  else
    fprintf(out, "plan: %s on %d device%s, %" PRId64 " micro-batch%s of %" PRId64 " (batch %" PRId64 "), schedule %s\n",
            g->model_name ? g->model_name : "?", S, S > 1 ? "s" : "", M, M > 1 ? "es" : "", g->train.batch,
            g->train.batch * M, one_f_one_b ? "1f1b" : "gpipe");
  double slowest = 0, total = 0;
  int64_t xfer_total = 0, need_most = 0, host_master = 0, host_state = 0, host_grads = 0;
  bool eval_program = graph_is_eval_program(g); /* duet plan --eval-only */
  for (int s = 0; s < S; s++) {
    const PartDevice *d = cx->n_devices > s ? &cx->devices[s] : NULL;
    PlanStage mem;
    partition_plan_stage(g, cx, s, &mem);
    double t_f = mem.t_f, t_b = mem.t_b, t_o = mem.t_o, step = mem.step_s;
    int64_t slots = mem.slots, need = mem.need, grads = mem.grads, xfer = mem.xfer, n_ops = mem.n_ops;
    const char *first = mem.first, *last = mem.last;
    host_master += mem.host_master, host_state += mem.host_state, host_grads += mem.host_grads;
    if (need > need_most) need_most = need;
    if (step > slowest) slowest = step;
    total += step;
    xfer_total += xfer;
    fprintf(out, "stage %d on %s: %" PRId64 " forward ops, params %s .. %s\n", s, d ? d->name : "cpu", n_ops,
            first ? first : "-", last ? last : "-");
    if (eval_program) { /* passes/evalonly.c: no backward pass, gradients or optimizer to report */
      fprintf(out, "  estimated time: forward %.3f ms per micro-batch (an evaluation program: no backward pass or "
              "optimizer); %.3f ms per step\n", 1e3 * t_f, 1e3 * step);
      fprintf(out, "  memory: weights %.2f MiB, activations %.2f MiB (%" PRId64 " micro-batch%s in flight x %.2f MiB): "
              "%.2f MiB", mem.weights / 1048576.0, (double)(mem.act * slots) / 1048576.0, slots,
              slots == 1 ? "" : "es", mem.act / 1048576.0, need / 1048576.0);
    } else {
      fprintf(out, "  estimated time: forward %.3f ms + backward %.3f ms per micro-batch, optimizer %.3f ms; %.3f ms per "
              "step\n", 1e3 * t_f, 1e3 * t_b, 1e3 * t_o, 1e3 * step);
      fprintf(out, "  memory: weights %.2f MiB, grads %.2f MiB (summed over the micro-batches), optimizer state %.2f "
              "MiB%s, activations %.2f MiB (%" PRId64 " micro-batch%s in flight x %.2f MiB, with their gradients): %.2f MiB",
              mem.weights / 1048576.0, grads / 1048576.0, mem.state / 1048576.0,
              train_offload(&g->train) ? " (offloaded to the host)" : "", (double)(mem.act * slots) / 1048576.0, slots, slots == 1 ? "" : "es", mem.act / 1048576.0,
              need / 1048576.0);
    }
    if (d && d->capacity > 0) {
      if (d->capacity >= (int64_t)1 << 30) fprintf(out, " of %.2f GiB", (double)d->capacity / 1073741824.0);
      else fprintf(out, " of %.2f MiB", (double)d->capacity / 1048576.0);
      if (d->capacity_from) fprintf(out, " (%s)", d->capacity_from);
      int64_t host = d->cpu ? mem.host_master + mem.host_state + mem.host_grads : 0; /* --offload on a CPU */
      if (host > 0) fprintf(out, " (with the host's %.2f MiB: %.2f MiB)", host / 1048576.0, (need + host) / 1048576.0);
      if (need + host > d->capacity) {
        fprintf(out, "  DOES NOT FIT");
        rc = 1;
      }
    }
    if (R > 1) { /* ZeRO stage 1: the optimizer state per device with and without --zero 1 */
      char shards[400];
      size_t len = 0;
      shards[0] = 0;
      for (int r = 0; r < R && len < sizeof shards; r++)
        len += (size_t)snprintf(shards + len, sizeof shards - len, "%s%.2f", r ? ", " : "", mem.shard[r] / 1048576.0);
      if (g->zero)
        fprintf(out, "\n  optimizer state per device: %.2f MiB with --zero 1 (ZeRO stage 1: the fullest of the %d "
                "replicas' shards, %s MiB; whole tensors), %.2f MiB without", mem.state_zero / 1048576.0, R, shards,
                mem.state_all / 1048576.0);
      else
        fprintf(out, "\n  optimizer state per device: %.2f MiB without --zero 1, %.2f MiB with it (ZeRO stage 1: "
                "the fullest of the %d replicas' shards, %s MiB; whole tensors)", mem.state_all / 1048576.0,
                mem.state_zero / 1048576.0, R, shards);
    }
    fprintf(out, "\n  transfers sent: %.3f MiB per step\n", (double)xfer / 1048576.0);
  }
  if (train_offload(&g->train)) {
    int64_t h = host_master + host_state + host_grads;
    fprintf(out, "host (--offload optimizer): master weights %.2f MiB (f32), optimizer state %.2f MiB, gradient copies "
            "%.2f MiB: %.2f MiB (%" PRId64 " bytes: master %" PRId64 ", state %" PRId64 ", grads %" PRId64 "); "
            "the update on the CPU, per step %.3f MiB of gradients to the host and %.3f MiB of params back\n",
            host_master / 1048576.0, host_state / 1048576.0, host_grads / 1048576.0, h / 1048576.0, h, host_master,
            host_state, host_grads, host_grads / 1048576.0, host_master / 1048576.0);
  }
  double bubble = (double)(S - 1) / (double)(M + S - 1);
  fprintf(out, "transfer bytes per step: %" PRId64 " (%.3f MiB)\n", xfer_total, (double)xfer_total / 1048576.0);
  fprintf(out, "bubble fraction (S-1)/(M+S-1) = %d/%" PRId64 " = %.3f%s\n", S - 1, M + S - 1, bubble,
          M < S ? " (fewer micro-batches than stages: a large bubble)" : "");
  double est = slowest * (double)(M + S - 1) / (double)M;
  fprintf(out, "estimated step time: %.3f ms (slowest stage %.3f ms, with the bubble); balance %.2f%s\n", 1e3 * est,
          1e3 * slowest, S > 1 && slowest > 0 ? total / ((double)S * slowest) : 1.0,
          R > 1 ? ", before the all-reduce" : "");
  if (cx->summary) *cx->summary = (PlanSummary){.step_s = est, .need = need_most, .fits = !rc};
  if (R > 1) data_parallel_report(g, cx, est, out);
  if (rc) {
    char help[400];
    help_settings(g, cx, S, help, sizeof help);
    for (int s = 0; s < S && s < cx->n_devices; s++) { /* weights alone too big: no setting but stages helps */
      PlanStage m = {0};
      stage_memory(g, cx, s, &m);
      if (cx->devices[s].capacity > 0 && m.weights > cx->devices[s].capacity)
        snprintf(help, sizeof help, "the weights alone exceed %s: only more --devices (stages) or more memory",
                 cx->devices[s].name);
    }
    for (int s = 0; s < S && s < cx->n_devices; s++) {
      const PartDevice *d = &cx->devices[s];
      int64_t need = partition_stage_need(g, cx, s);
      if (d->capacity > 0 && need > d->capacity)
        fprintf(out, "%s needs %" PRId64 " bytes, %" PRId64 " more than its %" PRId64 "\n", d->name, need,
                need - d->capacity, d->capacity);
    }
    fprintf(out, "what would help: %s\n", help);
    fflush(out);
    diag_error_noloc(cx->diag, "the model does not fit: a device needs more memory than it has (DOES NOT FIT above)");
  }
  return rc;
}
