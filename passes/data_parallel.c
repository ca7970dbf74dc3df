/* passes/data_parallel.c: the data_parallel pass (data parallelism).
 *
 * With R > 1 replicas (g->replicas, from --data-parallel R) every replica
 * runs the whole program on its own slice of each global batch: R x M
 * micro-batches in all (g->train.micro_batches), replica r computing
 * r*M .. r*M+M-1.  Each replica sums its M micro-batches' gradients, and
 * then the replicas' sums are summed once more across the replicas, in
 * replica order (every term already carries 1/(R*M) from autodiff, so the
 * result is the global batch's gradient).  This pass makes that last sum
 * visible: it groups the final param gradients (the operand every
 * optimizer update reads) into buckets of at most --bucket-mb MiB (25 by
 * default, as PyTorch DDP's bucket_cap_mb; Li et al., "PyTorch
 * Distributed", VLDB 2020), filled in the order the backward pass
 * produces the gradients, one bucket per device (pipeline stage) at a
 * time, and inserts for each an `allreduce` op right after the op that
 * produces its last gradient (or reads one, but for the updates: the sum
 * replaces the gradients in place), so that the bucket's communication can start
 * while the rest of the backward pass runs.  A gradient larger than the cap
 * is a bucket of its own.  With R = 1 the pass changes nothing.
 *
 * ZeRO stage 1 (--zero 1, g->zero; Rajbhandari et al., "ZeRO: Memory
 * Optimizations Toward Training Trillion Parameter Models", SC 2020): the
 * optimizer state is sharded over the replicas by whole tensors.  Each
 * update (adamw_update, sgd_update) gets a shard, the replica that alone
 * runs it and keeps its state (`[shard=r]`): per device, the updates in
 * decreasing order of their param's size, each to the replica with the
 * fewest state bytes so far (the lowest-numbered on a tie; Graham's
 * longest-processing-time rule: no replica holds more than 1/R of the
 * state plus the largest tensor's).  Whole tensors, not slices of a
 * flattened bucket, so that every update stays the one compiled kernel
 * over its whole tensor and checkpoints keep their tensors.  Each bucket
 * then becomes a `reduce_scatter` (its gradients grouped by shard, shard 0
 * first: replica r receives the sums of its group, added in replica order
 * as the all-reduce's), and after the last update of its params an
 * `all_gather` of those params (same order) copies each from the replica
 * that updated it to every other. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct Bucket {
  Value **grads;
  int n, cap;
  int64_t bytes;
  int device;  /* the grads' device (-1: an unpartitioned graph) */
  int last;    /* the position after which all its gradients are final (made, and read but by the updates) */
} Bucket;

/* A tied weight's gradient (partition.c, tie_grads): an optimizer-role add
 * of two parts, each summed over the micro-batches (and here over the
 * replicas) before the add; a part of another stage crosses in an
 * optimizer-role transfer. */
static bool tied_add(const Value *v) { return v->op == OP_ADD && v->role == ROLE_OPTIMIZER; }
static bool tied_transfer(const Value *v) { return v->op == OP_TRANSFER && v->role == ROLE_OPTIMIZER; }
static Value *tied_part(Value *x) { return tied_transfer(x) ? x->in[0] : x; }

static int64_t grad_bytes(const Value *v) { return (int64_t)dtype_size(v->dtype) * shape_numel(&v->shape); }

static int by_position(const void *a, const void *b) {
  const Value *x = *(Value *const *)a, *y = *(Value *const *)b;
  return (x->id > y->id) - (x->id < y->id);
}

static int by_last(const void *a, const void *b) {
  const Bucket *x = a, *y = b;
  return (x->last > y->last) - (x->last < y->last);
}

/* The shards of the nu updates us[] (of one device) over R replicas into
 * shard[]: in decreasing order of their param's bytes (the earliest on a
 * tie), each to the replica with the fewest bytes so far (the lowest on a
 * tie). */
static void lpt_shards(const Value *const *us, int nu, int R, int *shard) {
  int64_t load[IR_MAX_REPLICAS] = {0};
  for (int k = 0; k < nu; k++) shard[k] = -1;
  for (int done = 0; done < nu; done++) {
    int best = -1;
    for (int k = 0; k < nu; k++)
      if (shard[k] < 0 && (best < 0 || grad_bytes(us[k]->in[0]) > grad_bytes(us[best]->in[0]))) best = k;
    int r = 0;
    for (int j = 1; j < R; j++)
      if (load[j] < load[r]) r = j;
    shard[best] = r;
    load[r] += grad_bytes(us[best]->in[0]);
  }
}

/* The updates of device d (-1: an unpartitioned graph's) into us[]; their
 * number. */
static int device_updates(const Graph *g, int d, const Value **us) {
  int nu = 0;
  for (int i = 0; i < g->n_values; i++) {
    const Value *u = g->values[i];
    int dev = u->device >= 0 && u->device < IR_MAX_STAGES ? u->device : -1;
    if ((u->op == OP_ADAMW || u->op == OP_SGD) && dev == d) us[nu++] = u;
  }
  return nu;
}

/* --zero 1: each update's shard (see the file's comment), per device;
 * upd[gradient id] receives the gradient's update. */
static void assign_shards(Graph *g, Value **upd) {
  int n = g->n_values;
  const Value **us = arena_alloc(g->arena, ((size_t)n + 1) * sizeof *us);
  int *shard = arena_alloc(g->arena, ((size_t)n + 1) * sizeof *shard);
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    if (!(u->op == OP_ADAMW || u->op == OP_SGD)) continue;
    if (tied_add(u->in[1]))
      for (int j = 0; j < u->in[1]->n_in; j++) upd[tied_part(u->in[1]->in[j])->id] = u;
    else
      upd[u->in[1]->id] = u;
  }
  for (int d = -1; d < IR_MAX_STAGES; d++) {
    int nu = device_updates(g, d, us);
    lpt_shards(us, nu, g->replicas, shard);
    for (int k = 0; k < nu; k++) {
      Value *u = (Value *)us[k]; /* the graph's own value */
      u->attr.sharded = true;
      u->attr.shard = shard[k];
    }
  }
}

int64_t data_parallel_zero_state(const Graph *g, int s, int64_t *all, int64_t *per_replica) {
  int R = g->replicas > 1 ? g->replicas : 1, n = g->n_values;
  int d = g->n_stages > 1 ? s : -1;
  const Value **us = malloc(((size_t)n + 1) * sizeof *us);
  int *shard = malloc(((size_t)n + 1) * sizeof *shard);
  if (!us || !shard) duet_fatal(__FILE__, __LINE__, "out of memory");
  int nu = device_updates(g, d, us);
  if (!g->zero) lpt_shards(us, nu, R, shard);
  int64_t most = 0;
  *all = 0;
  for (int r = 0; r < R; r++) per_replica[r] = 0;
  for (int k = 0; k < nu; k++) {
    int r = g->zero ? us[k]->attr.shard : shard[k];
    for (int j = 2; j < us[k]->n_in; j++) { /* the state, as memplan places it (64-byte aligned) */
      int64_t b = (grad_bytes(us[k]->in[j]) + 63) & ~(int64_t)63;
      if (r >= 0 && r < R) per_replica[r] += b;
      *all += b;
    }
  }
  for (int r = 0; r < R; r++)
    if (per_replica[r] > most) most = per_replica[r];
  free(us);
  free(shard);
  return most;
}

/* --zero 1: bucket c's gradients grouped by the shard of their update,
 * shard 0 first, in their order within a shard. */
static void group_by_shard(Bucket *c, Value *const *upd, Arena *a) {
  Value **out = arena_alloc(a, (size_t)c->n * sizeof *out);
  int m = 0;
  for (int r = 0; r < IR_MAX_REPLICAS && m < c->n; r++)
    for (int j = 0; j < c->n; j++)
      if (upd[c->grads[j]->id]->attr.shard == r) out[m++] = c->grads[j];
  DUET_ASSERT(m == c->n);
  c->grads = out;
  c->cap = c->n;
}

int64_t data_parallel_bucket_cap(const PassCtx *cx) {
  double mb = cx->bucket_mb > 0 ? cx->bucket_mb : DP_BUCKET_MB_DEFAULT;
  double b = mb * 1048576.0;
  return b >= 9.0e18 ? INT64_MAX / 2 : b < 1 ? 1 : (int64_t)b;
}

void pass_data_parallel(Graph *g, PassCtx *cx) {
  if (g->replicas <= 1) return;
  int n = g->n_values;
  for (int i = 0; i < n; i++)
    if (g->values[i]->op == OP_ALLREDUCE || g->values[i]->op == OP_REDUCE_SCATTER)
      return; /* bucketed already (a dump given back) */
  int64_t cap = data_parallel_bucket_cap(cx);
  g->bucket_mb = cx->bucket_mb > 0 ? cx->bucket_mb : 0;
  Arena *a = g->arena;
  for (int i = 0; i < n && g->zero; i++)
    if (g->values[i]->op == OP_PRUNE_MASK)
      diag_error_noloc(cx->diag, "--zero 1 does not combine with pruning yet (the masks zero optimizer state that "
                       "only one replica holds): drop --zero 1 or the pruning");
  Value **grads = arena_alloc(a, ((size_t)n + 1) * sizeof *grads);
  int ng = 0;
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    if (!(u->op == OP_ADAMW || u->op == OP_SGD)) continue;
    if (tied_add(u->in[1])) /* its parts are summed over the replicas, then added */
      for (int j = 0; j < u->in[1]->n_in; j++) grads[ng++] = tied_part(u->in[1]->in[j]);
    else
      grads[ng++] = u->in[1];
  }
  if (ng == 0) return;
  qsort(grads, (size_t)ng, sizeof *grads, by_position);
  /* a gradient is ready when it is made and read by all but the updates
   * (the sum overwrites it in place) */
  int *ready = arena_alloc(a, ((size_t)n + 1) * sizeof *ready);
  for (int i = 0; i < n; i++) ready[i] = i;
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    if (u->op == OP_ADAMW || u->op == OP_SGD || tied_add(u) || tied_transfer(u)) continue; /* read after the sums */
    for (int j = 0; j < u->n_in; j++)
      if (ready[u->in[j]->id] < i) ready[u->in[j]->id] = i;
  }
  Bucket *b = arena_alloc(a, (size_t)ng * sizeof *b);
  int nb = 0;
  int open[IR_MAX_STAGES + 1]; /* the open bucket of each device (index 0: device -1) */
  for (int d = 0; d <= IR_MAX_STAGES; d++) open[d] = -1;
  for (int k = 0; k < ng; k++) {
    Value *x = grads[k];
    int dev = x->device >= 0 && x->device < IR_MAX_STAGES ? x->device : -1;
    int *o = &open[dev + 1];
    int64_t xb = grad_bytes(x);
    if (*o >= 0 && b[*o].bytes + xb > cap) *o = -1; /* full: the next gradient starts another */
    if (*o < 0) {
      *o = nb++;
      b[*o] = (Bucket){.grads = arena_alloc(a, 4 * sizeof(Value *)), .cap = 4, .device = dev};
    }
    Bucket *c = &b[*o];
    if (c->n == c->cap) {
      Value **ngr = arena_alloc(a, 2 * (size_t)c->cap * sizeof *ngr);
      memcpy(ngr, c->grads, (size_t)c->n * sizeof *ngr);
      c->grads = ngr, c->cap *= 2;
    }
    c->grads[c->n++] = x;
    c->bytes += xb;
    if (ready[x->id] > c->last) c->last = ready[x->id];
  }
  qsort(b, (size_t)nb, sizeof *b, by_last);
  Value **upd = NULL; /* --zero 1: gradient id -> its update */
  if (g->zero) {
    upd = arena_alloc(a, ((size_t)n + 1) * sizeof *upd);
    memset(upd, 0, ((size_t)n + 1) * sizeof *upd);
    assign_shards(g, upd);
    for (int k = 0; k < nb; k++) group_by_shard(&b[k], upd, a);
  }
  /* the buckets, each placed right after its last gradient */
  Value **ops = arena_alloc(a, (size_t)nb * sizeof *ops);
  Value **gathers = arena_alloc(a, (size_t)nb * sizeof *gathers);
  int *gather_after = arena_alloc(a, (size_t)nb * sizeof *gather_after);
  for (int k = 0; k < nb; k++) {
    Attr at = {.bucket = k, .bytes = b[k].bytes};
    const Value *last = g->values[b[k].last];
    ops[k] = graph_add(g, g->zero ? OP_REDUCE_SCATTER : OP_ALLREDUCE, b[k].grads, b[k].n, &at, last->loc);
    ops[k]->role = ROLE_BACKWARD;
    ops[k]->device = b[k].device;
  }
  int ng_ops = 0;
  for (int k = 0; g->zero && k < nb; k++) { /* the params, after the last of their updates */
    Value **ps = arena_alloc(a, (size_t)b[k].n * sizeof *ps);
    int np = 0;
    gather_after[k] = -1;
    for (int j = 0; j < b[k].n; j++) {
      Value *u = upd[b[k].grads[j]->id];
      bool seen = false; /* a tied weight: its param once, on its own stage */
      for (int i = 0; i < np; i++) seen |= ps[i] == u->in[0];
      if (seen || (g->n_stages > 1 && u->device != b[k].device)) continue;
      ps[np++] = u->in[0];
      if (u->id > gather_after[k]) gather_after[k] = u->id;
    }
    if (!np) { /* only parts of tied weights whose params live on another stage */
      gathers[ng_ops++] = NULL;
      continue;
    }
    Attr at = {.bucket = k};
    gathers[k] = graph_add(g, OP_ALL_GATHER, ps, np, &at, g->values[gather_after[k]]->loc);
    gathers[k]->role = ROLE_OPTIMIZER;
    gathers[k]->device = b[k].device;
    ng_ops++;
  }
  Value **order = arena_alloc(a, ((size_t)n + 2 * (size_t)nb) * sizeof *order);
  int m = 0;
  for (int i = 0, k = 0; i < n; i++) {
    order[m++] = g->values[i];
    for (; k < nb && b[k].last == i; k++) order[m++] = ops[k];
    for (int j = 0; j < ng_ops; j++) /* in bucket order among those after the same update */
      if (gathers[j] && gather_after[j] == i) order[m++] = gathers[j];
  }
  int n_gathers = 0;
  for (int j = 0; j < ng_ops; j++) n_gathers += gathers[j] != NULL;
  DUET_ASSERT(m == n + nb + n_gathers && g->n_values == n + nb + n_gathers);
  memcpy(g->values, order, (size_t)m * sizeof *order);
  graph_renumber(g);
  graph_count_uses(g);
}

/* ------------------------------------------------------------ the report */

/* The link an all-reduce between replicas of device d crosses, bytes/s, and
 * where the figure comes from. */
static double link_rate(const PartDevice *d, const char **why) {
  PartRates r = {PART_CPU_GFLOPS_PER_CORE * 1e9, PART_CPU_GBS_PER_CORE * 1e9, PART_CPU_COPY_GBS * 1e9};
  if (d) part_device_rates(d, &r);
  if (!d || d->cpu)
    *why = "virtual CPU devices: the copy rate assumed between arenas, PART_CPU_COPY_GBS";
  else if (d->sm == 60 || d->sm == 61 || d->sm == 70 || d->sm == 75)
    *why = "PCIe 3.0 x16 between cards as achieved, ~14 GB/s (pjreddie/darknet #754, shared/FACTS.md)";
  else
    *why = "PCIe 4.0/5.0 x16 between cards, the partition's table (passes/partition.c)";
  return r.link_bytes_per_s;
}

void data_parallel_report(const Graph *g, const PassCtx *cx, double step_s, FILE *out) {
  int R = g->replicas > 1 ? g->replicas : 1, S = g->n_stages > 1 ? g->n_stages : 1;
  double worst = 0, slowest = 0;
  int64_t all = 0;
  int K = cx->nodes > 1 ? cx->nodes : 1;
  double gbps = cx->link_gbps > 0 ? cx->link_gbps : DP_LINK_GBPS_DEFAULT;
  fprintf(out, "data parallel: %d replicas, each with its own devices holding the whole of its stages (the memory "
          "above is per device); gradients summed over the replicas in buckets of at most %.4g MiB\n", R,
          (double)data_parallel_bucket_cap(cx) / 1048576.0);
  if (K > 1)
    fprintf(out, "  over %d machines of %d replica%s each, linked at %.4g Gb/s per machine (%s); %s%.0d%s\n", K, R / K,
            R / K == 1 ? "" : "s", gbps, cx->link_gbps > 0 ? "--link-gbps" : "default: 10 Gigabit Ethernet, IEEE 802.3an "
            "10GBASE-T", S == 1 ? "the ring crosses that link" : "each stage's ring crosses that link, shared by the ",
            S == 1 ? 0 : S, S == 1 ? "" : " stages' all-reduces");
  for (int s = 0; s < S; s++) {
    const PartDevice *d = cx->n_devices > s ? &cx->devices[s] : NULL;
    PartRates r = {PART_CPU_GFLOPS_PER_CORE * 1e9, PART_CPU_GBS_PER_CORE * 1e9, PART_CPU_COPY_GBS * 1e9};
    if (d) part_device_rates(d, &r);
    const char *why;
    /* ZeRO stage 1: a reduce-scatter moves half a ring all-reduce's bytes,
     * (N-1)/N x bytes; the all-gather of the params, the other half, runs
     * after the optimizer (not hidden) */
    double link = link_rate(d, &why), factor = (g->zero ? 1.0 : 2.0) * (R - 1) / R;
    if (K > 1 && gbps * 1e9 / 8 / S < link) { /* the machines' network is the ring's slowest link */
      link = gbps * 1e9 / 8 / S;
      why = S > 1 ? "the machines' network link, shared by the stages" : "the machines' network link";
    }
    /* the stage's backward pass of one micro-batch (its last one: the buckets
     * start there), and when each bucket is ready in it */
    double t = 0, link_free = 0, comm = 0, first = -1;
    int64_t bytes = 0, gathered = 0;
    int nb = 0;
    for (int i = 0; i < g->n_values; i++) {
      const Value *v = g->values[i];
      if ((v->device < 0 ? 0 : v->device) == s && v->op == OP_ALL_GATHER)
        for (int j = 0; j < v->n_in; j++) gathered += grad_bytes(v->in[j]);
      if ((v->device < 0 ? 0 : v->device) != s || v->role != ROLE_BACKWARD) continue;
      if (v->op == OP_ALLREDUCE || v->op == OP_REDUCE_SCATTER) {
        double c = factor * (double)v->attr.bytes / link, start = t > link_free ? t : link_free;
        link_free = start + c;
        comm += c;
        if (first < 0) first = t;
        bytes += v->attr.bytes;
        nb++;
        continue;
      }
      t += v->op == OP_TRANSFER ? (double)dtype_size(v->dtype) * (double)shape_numel(&v->shape) / r.link_bytes_per_s
                                : part_op_seconds(v, &r);
    }
    double exposed = link_free > t ? link_free - t : 0, hidden = comm - exposed > 0 ? comm - exposed : 0;
    double gather = (double)(R - 1) / R * (double)gathered / link;
    exposed += gather;
    comm += gather;
    if (exposed > worst) worst = exposed;
    if (comm > slowest) slowest = comm;
    all += bytes;
    if (g->zero)
      fprintf(out, "  stage %d on %s: %d bucket%s, %.2f MiB of gradients; ZeRO stage 1: ring reduce-scatter (N-1)/N x "
              "%.2f MiB = %.2f MiB and all-gather of the params (N-1)/N x %.2f MiB = %.2f MiB per replica at %.1f GB/s "
              "(%s): %.3f ms per step, %.3f ms of it hidden behind the backward pass (which runs on for %.3f ms after "
              "the first bucket is ready), %.3f ms exposed (the all-gather's %.3f ms, after the optimizer, included)\n",
              s, d ? d->name : "cpu", nb, nb == 1 ? "" : "s", (double)bytes / 1048576.0, (double)bytes / 1048576.0,
              factor * (double)bytes / 1048576.0, (double)gathered / 1048576.0,
              (double)(R - 1) / R * (double)gathered / 1048576.0, link / 1e9, why, 1e3 * comm, 1e3 * hidden,
              1e3 * (first >= 0 ? t - first : 0), 1e3 * exposed, 1e3 * gather);
    else
      fprintf(out, "  stage %d on %s: %d bucket%s, %.2f MiB of gradients; ring all-reduce 2(N-1)/N x %.2f MiB = %.2f "
              "MiB per replica at %.1f GB/s (%s): %.3f ms per step, %.3f ms of it hidden behind the backward pass "
              "(which runs on for %.3f ms after the first bucket is ready), %.3f ms exposed\n", s, d ? d->name : "cpu",
              nb, nb == 1 ? "" : "s", (double)bytes / 1048576.0, (double)bytes / 1048576.0,
              factor * (double)bytes / 1048576.0, link / 1e9, why, 1e3 * comm, 1e3 * hidden,
              1e3 * (first >= 0 ? t - first : 0), 1e3 * exposed);
  }
  double est = step_s + worst;
  if (cx->summary) {
    cx->summary->step_s = est;
    cx->summary->allreduce_s = slowest;
    cx->summary->exposed_s = worst;
  }
  int64_t batch = g->train.batch * (g->train.micro_batches > 1 ? g->train.micro_batches : 1);
  fprintf(out, "estimated step time with data parallelism: %.3f ms (%.3f ms of compute and transfers + %.3f ms of "
          "all-reduce not hidden), %.0f samples/s on %d replicas (global batch %" PRId64 "; %.2f MiB of gradients "
          "per replica)\n", 1e3 * est, 1e3 * step_s, 1e3 * worst, est > 0 ? (double)batch / est : 0.0, R, batch,
          (double)all / 1048576.0);
}
