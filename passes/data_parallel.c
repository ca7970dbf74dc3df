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
 * is a bucket of its own.  With R = 1 the pass changes nothing. */
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

static int64_t grad_bytes(const Value *v) { return (int64_t)dtype_size(v->dtype) * shape_numel(&v->shape); }

static int by_position(const void *a, const void *b) {
  const Value *x = *(Value *const *)a, *y = *(Value *const *)b;
  return (x->id > y->id) - (x->id < y->id);
}

static int by_last(const void *a, const void *b) {
  const Bucket *x = a, *y = b;
  return (x->last > y->last) - (x->last < y->last);
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
    if (g->values[i]->op == OP_ALLREDUCE) return; /* bucketed already (a dump given back) */
  int64_t cap = data_parallel_bucket_cap(cx);
  Arena *a = g->arena;
  Value **grads = arena_alloc(a, ((size_t)n + 1) * sizeof *grads);
  int ng = 0;
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    if (u->op == OP_ADAMW || u->op == OP_SGD) grads[ng++] = u->in[1];
  }
  if (ng == 0) return;
  qsort(grads, (size_t)ng, sizeof *grads, by_position);
  /* a gradient is ready when it is made and read by all but the updates
   * (the sum overwrites it in place) */
  int *ready = arena_alloc(a, ((size_t)n + 1) * sizeof *ready);
  for (int i = 0; i < n; i++) ready[i] = i;
  for (int i = 0; i < n; i++) {
    Value *u = g->values[i];
    if (u->op == OP_ADAMW || u->op == OP_SGD) continue;
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
  /* the buckets, each placed right after its last gradient */
  Value **ops = arena_alloc(a, (size_t)nb * sizeof *ops);
  for (int k = 0; k < nb; k++) {
    Attr at = {.bucket = k, .bytes = b[k].bytes};
    const Value *last = g->values[b[k].last];
    ops[k] = graph_add(g, OP_ALLREDUCE, b[k].grads, b[k].n, &at, last->loc);
    ops[k]->role = ROLE_BACKWARD;
    ops[k]->device = b[k].device;
  }
  Value **order = arena_alloc(a, ((size_t)n + (size_t)nb) * sizeof *order);
  int m = 0;
  for (int i = 0, k = 0; i < n; i++) {
    order[m++] = g->values[i];
    for (; k < nb && b[k].last == i; k++) order[m++] = ops[k];
  }
  DUET_ASSERT(m == n + nb && g->n_values == n + nb);
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
    fprintf(out, "  over %d machines of %d replica%s each, linked at %.4g Gb/s per machine (%s); each stage's ring "
            "crosses that link, shared by the %d stage%s' all-reduces\n", K, R / K, R / K == 1 ? "" : "s", gbps,
            cx->link_gbps > 0 ? "--link-gbps" : "default: 10 Gigabit Ethernet, IEEE 802.3an 10GBASE-T", S,
            S == 1 ? "" : "s");
  for (int s = 0; s < S; s++) {
    const PartDevice *d = cx->n_devices > s ? &cx->devices[s] : NULL;
    PartRates r = {PART_CPU_GFLOPS_PER_CORE * 1e9, PART_CPU_GBS_PER_CORE * 1e9, PART_CPU_COPY_GBS * 1e9};
    if (d) part_device_rates(d, &r);
    const char *why;
    double link = link_rate(d, &why), factor = 2.0 * (R - 1) / R;
    if (K > 1 && gbps * 1e9 / 8 / S < link) { /* the machines' network is the ring's slowest link */
      link = gbps * 1e9 / 8 / S;
      why = S > 1 ? "the machines' network link, shared by the stages" : "the machines' network link";
    }
    /* the stage's backward pass of one micro-batch (its last one: the buckets
     * start there), and when each bucket is ready in it */
    double t = 0, link_free = 0, comm = 0, first = -1;
    int64_t bytes = 0;
    int nb = 0;
    for (int i = 0; i < g->n_values; i++) {
      const Value *v = g->values[i];
      if ((v->device < 0 ? 0 : v->device) != s || v->role != ROLE_BACKWARD) continue;
      if (v->op == OP_ALLREDUCE) {
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
    if (exposed > worst) worst = exposed;
    if (comm > slowest) slowest = comm;
    all += bytes;
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
