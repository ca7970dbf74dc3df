/* passes/fuse.c: elementwise fusion and memory planning.
 *
 * fuse: every elementwise value whose single user is an elementwise value of
 * the same shape and role is folded into that user; scalar constants are
 * inlined.  The result is one OP_FUSED value per chain, holding a small
 * program, which codegen lowers to a single loop (no intermediate tensors).
 *
 * memplan: params and optimizer state get consecutive offsets in their own
 * regions; every other value with a result gets an offset in the activation
 * arena, reused between values whose live ranges (definition to last use, in
 * graph order) do not overlap (greedy first-fit, as in ggml's graph
 * allocator).  Inputs, the loss and the eval metrics are never reused, since
 * the host writes or reads them around a step. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct FuseBuild {
  Graph *g;
  Value *root;
  bool *dead;
  FusedInstr *ins;
  int n, cap;
  Value **loads;
  int n_loads, cap_loads;
  int absorbed;
} FuseBuild;

static int emit(FuseBuild *b, FusedInstr fi) {
  if (b->n == b->cap) {
    int cap = b->cap ? 2 * b->cap : 16;
    FusedInstr *ni = arena_alloc(b->g->arena, (size_t)cap * sizeof *ni);
    if (b->n) memcpy(ni, b->ins, (size_t)b->n * sizeof *ni);
    b->ins = ni;
    b->cap = cap;
  }
  b->ins[b->n] = fi;
  return b->n++;
}

static int load(FuseBuild *b, Value *x) {
  int k = 0;
  while (k < b->n_loads && b->loads[k] != x) k++;
  if (k == b->n_loads) {
    if (b->n_loads == b->cap_loads) {
      int cap = b->cap_loads ? 2 * b->cap_loads : 8;
      Value **nl = arena_alloc(b->g->arena, (size_t)cap * sizeof *nl);
      if (b->n_loads) memcpy(nl, b->loads, (size_t)b->n_loads * sizeof *nl);
      b->loads = nl;
      b->cap_loads = cap;
    }
    b->loads[b->n_loads++] = x;
  }
  FusedInstr fi = {.op = OP_COUNT, .a = k};
  return emit(b, fi);
}

static bool absorbable(const FuseBuild *b, const Value *x) {
  /* In a tree of ops of arity <= 2, loads <= ops + 1 = absorbed + 2, so
   * capping the absorbed values bounds the loads (counted only on the way
   * back up the recursion) as well as the instructions. */
  if (b->absorbed + 1 > FUSE_MAX_INPUTS - 2 || b->n + 4 > FUSE_MAX_INSTRS) return false;
  return (op_info[x->op].flags & OPF_EW) && x->op != OP_FUSED && x->op != OP_CONST &&
         x->n_uses == 1 && x->role == b->root->role && shape_eq(&x->shape, &b->root->shape);
}

/* Emits the program computing v (the root or an absorbed value). */
static int build(FuseBuild *b, Value *v) {
  int opnd[2] = {0, 0};
  for (int j = 0; j < v->n_in; j++) {
    Value *x = v->in[j];
    if (x->op == OP_CONST) {
      FusedInstr fi = {.op = OP_CONST, .value = x->attr.value};
      opnd[j] = emit(b, fi);
      x->n_uses--;
      if (x->n_uses == 0) b->dead[x->id] = true;
      b->absorbed++;
    } else if (absorbable(b, x)) {
      b->absorbed++; /* before descending: the bound in absorbable() counts it */
      b->dead[x->id] = true;
      opnd[j] = build(b, x);
      if (x->dtype == DT_F16 || x->dtype == DT_BF16) { /* the value's own rounding, as unfused */
        FusedInstr r = {.op = OP_CAST, .a = opnd[j], .site = (int64_t)x->dtype};
        opnd[j] = emit(b, r);
      }
    } else {
      opnd[j] = load(b, x);
    }
  }
  FusedInstr fi = {.op = v->op, .a = opnd[0], .b = opnd[1], .value = v->attr.p,
                   .site = v->op == OP_CAST ? (int64_t)v->attr.dtype : v->attr.site};
  return emit(b, fi);
}

static void compact(Graph *g, const bool *dead) {
  int k = 0;
  for (int i = 0; i < g->n_values; i++)
    if (!dead[i]) g->values[k++] = g->values[i];
  g->n_values = k;
  graph_renumber(g);
  graph_count_uses(g);
}

void pass_fuse(Graph *g, PassCtx *cx) {
  (void)cx;
  graph_count_uses(g);
  bool *dead = arena_alloc(g->arena, (size_t)g->n_values + 1);
  for (int i = g->n_values - 1; i >= 0; i--) {
    Value *v = g->values[i];
    if (dead[i] || !(op_info[v->op].flags & OPF_EW) || v->op == OP_CONST || v->op == OP_FUSED) continue;
    FuseBuild b = {.g = g, .root = v, .dead = dead};
    build(&b, v);
    if (!b.absorbed) continue;
    FusedProg *p = arena_alloc(g->arena, sizeof *p);
    p->n = b.n;
    p->ins = b.ins;
    Shape shape = v->shape;
    DType dt = v->dtype;
    v->op = OP_FUSED;
    v->n_in = b.n_loads;
    v->in = b.loads ? b.loads : arena_alloc(g->arena, sizeof *v->in);
    memset(&v->attr, 0, sizeof v->attr);
    v->attr.prog = p;
    v->attr.shape = shape;
    v->attr.dtype = dt;
  }
  compact(g, dead);
}

/* ------------------------------------------------------------- memplan */

static int64_t align64(int64_t x) { return (x + 63) & ~(int64_t)63; }

/* Every offset and region size stays below 2^62 bytes (no overflow). */
#define MEMPLAN_MAX_BYTES ((int64_t)1 << 62)
static void too_big(Graph *g, const Value *v, MemRegion r) {
  static const char *const names[MEM_COUNT] = {"", "parameter", "optimizer state", "activation", "key/value cache"};
  diag_error(g->diag, v->loc, "the %s memory of the model would exceed 2^62 bytes", names[r]);
}

/* Plans the values of one device (dev < 0: all) into bytes_of[].  The
 * activation blocks live at a value's position are a RangeSet (first fit in
 * O(log n)); a block leaves it at the first allocation after its last use
 * (free_head[t] lists the blocks whose last use is t, through free_next).
 * n values take O(n log n). */
/* --zero 1: the state tensors of replica r's updates come together, shard
 * 0's first (each replica allocates only its own span of the state
 * region).  shard[id]: the shard of a state value, -1 for the rest. */
static void plan_device(Graph *g, int dev, const int *last, int *free_head, int *free_next, const int *shard,
                        int64_t *bytes_of) {
  int n = g->n_values;
  for (int r = 0; r < MEM_COUNT; r++) bytes_of[r] = 0;
  for (int t = 0; t < n; t++) free_head[t] = -1;
  RangeSet live = {.arena = g->arena};
  /* inputs first: the host writes them before the step's first kernel */
  for (int pass = 0; pass < 2; pass++) {
    int freed = 0; /* the blocks whose last use is before this are out of `live` */
    for (int i = 0; i < n; i++) {
      Value *v = g->values[i];
      if ((v->op == OP_INPUT) != (pass == 0)) continue;
      if (dev >= 0 && v->device != dev) continue;
      int64_t bytes = (int64_t)dtype_size(v->dtype) * (shape_numel(&v->shape) + ir_workspace_elems(v)); /* checked by ir_infer_shape */
      v->offset = -1;
      v->region = MEM_NONE;
      if (v->dtype == DT_VOID) continue;
      MemRegion r = v->op == OP_PARAM            ? MEM_PARAM
                    : ir_param_transfer(v) && g->train.micro_batches > 1 ? MEM_CACHE /* sent once, read by every micro-batch */
                    : v->op != OP_STATE            ? MEM_ARENA
                    : v->attr.kv_cache             ? MEM_CACHE
                                                   : MEM_STATE;
      if (bytes > MEMPLAN_MAX_BYTES - 64) too_big(g, v, r);
      bytes = align64(bytes);
      if (v->op == OP_STATE && shard[v->id] >= 0) { /* placed below, by shard */
        v->region = r;
        continue;
      }
      if (r != MEM_ARENA) {
        v->region = r;
        if (bytes > MEMPLAN_MAX_BYTES - bytes_of[r]) too_big(g, v, r);
        v->offset = bytes_of[v->region];
        bytes_of[v->region] += bytes;
        continue;
      }
      /* free blocks whose last use came strictly before this value */
      for (; freed < i; freed++)
        for (int j = free_head[freed]; j >= 0; j = free_next[j]) rangeset_remove(&live, g->values[j]->offset);
      int64_t off = rangeset_first_fit(&live, bytes);
      if (off > MEMPLAN_MAX_BYTES - bytes) too_big(g, v, MEM_ARENA);
      rangeset_insert(&live, off, bytes, i);
      bool pinned = v->op == OP_INPUT || v == g->loss || v->op == OP_EVAL_METRICS;
      if (!pinned) {
        free_next[i] = free_head[last[i]];
        free_head[last[i]] = i;
      }
      v->region = MEM_ARENA;
      v->offset = off;
      if (off + bytes > bytes_of[MEM_ARENA]) bytes_of[MEM_ARENA] = off + bytes;
    }
  }
  for (int sh = 0; sh < IR_MAX_REPLICAS; sh++)
    for (int i = 0; i < n; i++) {
      Value *v = g->values[i];
      if (v->op != OP_STATE || shard[i] != sh || (dev >= 0 && v->device != dev)) continue;
      int64_t bytes = align64((int64_t)dtype_size(v->dtype) * shape_numel(&v->shape));
      if (bytes > MEMPLAN_MAX_BYTES - bytes_of[MEM_STATE]) too_big(g, v, MEM_STATE);
      v->offset = bytes_of[MEM_STATE];
      bytes_of[MEM_STATE] += bytes;
    }
}

/* One plan per device of a partitioned graph: each device has its own
 * param, state and activation regions (a value sent to another device lives
 * on its own device until the transfer that reads it). */
void pass_memplan(Graph *g, PassCtx *cx) {
  (void)cx;
  int n = g->n_values;
  /* in the arena: too_big() unwinds */
  int *last = arena_alloc(g->arena, ((size_t)n + 1) * sizeof *last);
  int *free_head = arena_alloc(g->arena, ((size_t)n + 1) * sizeof *free_head);
  int *free_next = arena_alloc(g->arena, ((size_t)n + 1) * sizeof *free_next);
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    last[i] = i;
    for (int j = 0; j < v->n_in; j++)
      if (last[v->in[j]->id] < i) last[v->in[j]->id] = i;
  }
  int *shard = arena_alloc(g->arena, ((size_t)n + 1) * sizeof *shard);
  for (int i = 0; i < n; i++) shard[i] = -1;
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    if ((v->op == OP_ADAMW || v->op == OP_SGD) && v->attr.sharded)
      for (int j = 2; j < v->n_in; j++)
        if (v->in[j]->op == OP_STATE) shard[v->in[j]->id] = v->attr.shard;
  }
  if (g->n_stages <= 1) {
    plan_device(g, -1, last, free_head, free_next, shard, g->region_bytes);
    return;
  }
  for (int d = 0; d < g->n_stages; d++) plan_device(g, d, last, free_head, free_next, shard, g->stage_bytes[d]);
  memcpy(g->region_bytes, g->stage_bytes[0], sizeof g->region_bytes);
}
