/* tests/test_memplan.c: invariants of the memory planner, checked
 * independently of it on real models: (1) every tensor lies inside its
 * region; (2) two arena values whose live ranges overlap (definition to last
 * use in graph order; inputs, loss and metrics live throughout) never share
 * bytes; (3) reuse happens: the arena is smaller than the sum of its values.
 * Then the verifier's overlap check (ir_check_memory) against the pair-by-
 * pair definition on randomly moved plans, and its RangeSet against a
 * plain sorted array. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static int check_model(const char *name, const char *text) {
  TModel t;
  if (tmodel_open(&t, name, text, DT_F32)) return 1;
  Graph *g = t.g;
  int n = g->n_values, fails = 0;
  int *first = calloc((size_t)n, sizeof *first), *last = calloc((size_t)n, sizeof *last);
  int64_t sum = 0;
  for (int i = 0; i < n; i++) {
    Value *v = g->values[i];
    /* inputs are written by the host before the step; the loss and the
     * metrics are read by it after the step */
    first[i] = v->op == OP_INPUT ? 0 : i;
    last[i] = v->op == OP_INPUT || v == g->loss || v->op == OP_EVAL_METRICS ? n : i;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->values[i]->n_in; j++) {
      int d = g->values[i]->in[j]->id;
      if (last[d] < i) last[d] = i;
    }
  for (int i = 0; i < n; i++) {
    Value *a = g->values[i];
    if (a->region == MEM_NONE) continue;
    int64_t sa = (int64_t)dtype_size(a->dtype) * shape_numel(&a->shape);
    if (a->offset < 0 || a->offset + sa > g->region_bytes[a->region]) {
      fprintf(stderr, "FAIL %s: %%%d lies outside its region\n", name, a->id);
      fails++;
    }
    if (a->region != MEM_ARENA) continue;
    sum += sa;
    for (int j = i + 1; j < n; j++) {
      Value *b = g->values[j];
      if (b->region != MEM_ARENA) continue;
      int64_t sb = (int64_t)dtype_size(b->dtype) * shape_numel(&b->shape);
      bool live_overlap = first[i] <= last[j] && first[j] <= last[i];
      bool mem_overlap = a->offset < b->offset + sb && b->offset < a->offset + sa;
      if (live_overlap && mem_overlap) {
        fprintf(stderr, "FAIL %s: %%%d and %%%d are live together and share memory\n", name, a->id, b->id);
        fails++;
      }
    }
  }
  if (g->region_bytes[MEM_ARENA] >= sum) {
    fprintf(stderr, "FAIL %s: no reuse (arena %lld bytes, values %lld bytes)\n", name,
            (long long)g->region_bytes[MEM_ARENA], (long long)sum);
    fails++;
  }
  printf("%s %s: arena %lld bytes for %lld bytes of values\n", fails ? "FAIL" : "ok", name,
         (long long)g->region_bytes[MEM_ARENA], (long long)sum);
  free(first);
  free(last);
  tmodel_close(&t);
  return fails != 0;
}

/* Memory that does not fit 64-bit offsets is a user error of the planner
 * (it was a signed overflow; found by tests/fuzz). */
static int check_too_big(void) {
  const char *text = "model big\nparam a: [1152921504606846976] = zeros\n"
                     "param b: [1152921504606846976] = zeros\nloss = mean(a) + mean(b)\n";
  Arena *a = arena_new(1 << 16);
  FILE *out = tmpfile();
  Diag d = {.out = out};
  Source src = {"big.model", text, strlen(text)};
  Graph *g = frontend_compile(a, &d, &src, NULL);
  PassCtx pc = {.diag = &d, .verify = true};
  int rc = g ? passes_run(g, &pc) : -1;
  char msg[512] = "";
  if (out) {
    rewind(out);
    size_t k = fread(msg, 1, sizeof msg - 1, out);
    msg[k] = 0;
    fclose(out);
  }
  arena_free(a);
  if (rc != 1 || d.n_errors != 1 || !strstr(msg, "big.model:2:7: error: the parameter memory of the model would exceed 2^62 bytes")) {
    fprintf(stderr, "FAIL big.model: passes_run %d, %d errors:\n%s", rc, d.n_errors, msg);
    return 1;
  }
  return 0;
}

/* ------------------------------------------------ the verifier's check */

/* Bytes a planned value occupies (its workspace included). */
static int64_t planned_bytes(const Value *v) {
  return (int64_t)dtype_size(v->dtype) * (shape_numel(&v->shape) + ir_workspace_elems(v));
}

/* Whether a and b are live at the same time and share a byte of one region
 * of one device: the definition of a conflict, written out pair by pair,
 * independently of ir_check_memory's sweep.  first/last: live positions
 * (inclusive), from ref_liveness. */
static bool pair_conflicts(const Graph *g, const int *first, const int *last, const Value *a, const Value *b) {
  if (a == b || a->region == MEM_NONE || a->region != b->region || a->dtype == DT_VOID || b->dtype == DT_VOID) return false;
  if (g->n_stages > 1 && a->device != b->device) return false;
  if (first[a->id] > last[b->id] || first[b->id] > last[a->id]) return false;
  return a->offset < b->offset + planned_bytes(b) && b->offset < a->offset + planned_bytes(a);
}

/* Live ranges as memplan defines them: from the definition to the last use
 * in graph order; inputs, params, state and caches from before the first
 * value (-1); inputs, the loss, eval metrics, params, state and caches to
 * the end (n). */
static void ref_liveness(const Graph *g, int *first, int *last) {
  int n = g->n_values;
  for (int i = 0; i < n; i++) {
    const Value *v = g->values[i];
    bool persistent = v->region == MEM_PARAM || v->region == MEM_STATE || v->region == MEM_CACHE;
    first[i] = v->op == OP_INPUT || persistent ? -1 : i;
    last[i] = v->op == OP_INPUT || persistent || v == g->loss || v->op == OP_EVAL_METRICS ? n : i;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->values[i]->n_in; j++) {
      int d = g->values[i]->in[j]->id;
      if (last[d] < i) last[d] = i;
    }
}

static bool any_conflict(const Graph *g, const int *first, const int *last) {
  for (int i = 0; i < g->n_values; i++)
    for (int j = i + 1; j < g->n_values; j++)
      if (pair_conflicts(g, first, last, g->values[i], g->values[j])) return true;
  return false;
}

static Graph *planned_graph(Arena *a, Diag *d, const char *name, const char *text, int n_devices) {
  Source src = {name, text, strlen(text)};
  Graph *g = frontend_compile(a, d, &src, NULL);
  PartDevice dev[2] = {{.name = "cpu:0", .cpu = true, .cores = 1}, {.name = "cpu:1", .cpu = true, .cores = 1}};
  PassCtx pc = {.diag = d, .verify = true, .devices = n_devices > 1 ? dev : NULL, .n_devices = n_devices};
  if (!g || passes_run(g, &pc)) {
    fprintf(stderr, "FAIL %s: does not compile\n", name);
    return NULL;
  }
  return g;
}

/* ir_check_memory (the verifier's and the IR reader's overlap check, an
 * O(n log n) sweep) against the pair-by-pair definition: on memplan's own
 * plans (no conflict), then on plans with one or two values moved to random
 * offsets of their region (aligned to the element size) or onto another
 * value of the region: the same verdict, and a reported pair that really
 * conflicts.  ir_verify must report such a plan. */
static int check_overlap_checker(const char *name, const char *text, int n_devices, int trials) {
  Arena *a = arena_new(1 << 20);
  Diag d = {.out = stderr};
  Graph *g = planned_graph(a, &d, name, text, n_devices);
  if (!g) {
    arena_free(a);
    return 1;
  }
  int n = g->n_values, fails = 0, conflicts = 0, ws = 0;
  int *first = calloc((size_t)n, sizeof *first), *last = calloc((size_t)n, sizeof *last);
  int64_t *orig = calloc((size_t)n, sizeof *orig);
  int *placed = calloc((size_t)n, sizeof *placed), n_placed = 0;
  int *ws_vals = calloc((size_t)n, sizeof *ws_vals), n_ws = 0;
  for (int i = 0; i < n; i++) {
    orig[i] = g->values[i]->offset;
    if (g->values[i]->region != MEM_NONE) placed[n_placed++] = i;
    if (ir_workspace_elems(g->values[i]) > 0 && g->values[i]->region == MEM_ARENA) ws_vals[n_ws++] = i;
  }
  ws = n_ws;
  ref_liveness(g, first, last);
  MemConflict mc;
  if (any_conflict(g, first, last) || ir_check_memory(g, &mc)) {
    fprintf(stderr, "FAIL %s: memplan's own plan has a conflict\n", name);
    fails++;
  }
  uint64_t r = 0x853c49e6748fea9bu;
  for (int t = 0; t < trials && fails < 5; t++) {
    for (int k = 0; k < 1 + t % 2; k++) {
      r = r * 6364136223846793005u + 1442695040888963407u;
      Value *v = g->values[placed[(r >> 33) % (uint64_t)n_placed]];
      r = r * 6364136223846793005u + 1442695040888963407u;
      const int64_t *rb = g->n_stages > 1 ? g->stage_bytes[v->device] : g->region_bytes;
      int64_t el = (int64_t)dtype_size(v->dtype), room = rb[v->region] - planned_bytes(v);
      if (n_ws && ((r >> 41) & 3) == 0) { /* into the workspace after an attention gradient's elements */
        const Value *u = g->values[ws_vals[(r >> 3) % (uint64_t)n_ws]];
        int64_t into = u->offset + (int64_t)dtype_size(u->dtype) * shape_numel(&u->shape);
        for (int j = (int)((r >> 20) % (uint64_t)n_placed), tries = 0; tries < n_placed; tries++, j = (j + 1) % n_placed) {
          Value *w = g->values[placed[j]];
          if (w != u && w->region == u->region && w->device == u->device && first[w->id] <= last[u->id] &&
              first[u->id] <= last[w->id] && into % (int64_t)dtype_size(w->dtype) == 0) {
            w->offset = into;
            break;
          }
        }
      } else if ((r >> 40) & 1) { /* onto another value of its region and device */
        const Value *u = g->values[placed[(r >> 2) % (uint64_t)n_placed]];
        if (u->region == v->region && u->device == v->device && u->offset <= room && u->offset % el == 0) v->offset = u->offset;
      } else if (room >= 0) {
        v->offset = (int64_t)((r >> 8) % (uint64_t)(room / el + 1)) * el;
      }
    }
    bool want = any_conflict(g, first, last);
    int got = ir_check_memory(g, &mc);
    conflicts += want;
    if (got != want) {
      fprintf(stderr, "FAIL %s trial %d: ir_check_memory says %d, the pairs say %d\n", name, t, got, want);
      fails++;
    } else if (got && !pair_conflicts(g, first, last, mc.a, mc.b)) {
      fprintf(stderr, "FAIL %s trial %d: reported %%%d and %%%d, which do not conflict\n", name, t, mc.a->id, mc.b->id);
      fails++;
    } else if (got && mc.a_last != (last[mc.a->id] == n ? -1 : last[mc.a->id])) {
      fprintf(stderr, "FAIL %s trial %d: %%%d's last use given as %d, not %d\n", name, t, mc.a->id, mc.a_last,
              last[mc.a->id]);
      fails++;
    }
    if (got && t < 20) { /* the verifier after memplan reports it */
      FILE *err = tmpfile();
      char msg[600] = "";
      int bad = err ? ir_verify(g, "memplan", err) : 0;
      if (err) {
        rewind(err);
        msg[fread(msg, 1, sizeof msg - 1, err)] = 0;
        fclose(err);
      }
      if (bad != 1 || !strstr(msg, "duet: IR verifier (after memplan): %") || !strstr(msg, " overlap %")) {
        fprintf(stderr, "FAIL %s trial %d: ir_verify returned %d: %s\n", name, t, bad, msg);
        fails++;
      }
    }
    for (int i = 0; i < n; i++) g->values[i]->offset = orig[i];
  }
  /* the random moves must have produced both verdicts */
  if (!fails && (conflicts == 0 || conflicts == trials)) {
    fprintf(stderr, "FAIL %s: %d of %d trials conflict: the test does not test\n", name, conflicts, trials);
    fails++;
  }
  printf("%s %s (%d device%s, %d values, %d with workspace): %d moved plans, %d with a conflict\n", fails ? "FAIL" : "ok",
         name, n_devices, n_devices > 1 ? "s" : "", n, ws, trials, conflicts);
  free(first);
  free(last);
  free(orig);
  free(placed);
  free(ws_vals);
  arena_free(a);
  return fails != 0;
}

/* RangeSet (memplan's first fit, the verifier's overlap query) against a
 * plain sorted array under random inserts and removals: first fit as the
 * greedy scan memplan used before (lowest gap from 0 between the ranges in
 * offset order, else after the last), overlap by comparing every range. */
static int check_rangeset(void) {
  enum { CAP = 400 };
  int64_t off[CAP], size[CAP];
  int n = 0, fails = 0;
  Arena *a = arena_new(1 << 16);
  RangeSet s = {.arena = a};
  uint64_t r = 42;
  for (int step = 0; step < 20000 && fails < 5; step++) {
    r = r * 6364136223846793005u + 1442695040888963407u;
    int64_t want_size = 1 + (int64_t)((r >> 33) % 300);
    /* reference first fit: off[] is kept sorted */
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
      if (off[i] - at >= want_size) break;
      at = off[i] + size[i];
    }
    int64_t got = rangeset_first_fit(&s, want_size);
    if (got != at) {
      fprintf(stderr, "FAIL rangeset step %d: first fit of %lld at %lld, expected %lld\n", step, (long long)want_size,
              (long long)got, (long long)at);
      fails++;
    }
    /* an overlap query at a random place */
    int64_t qo = (int64_t)((r >> 12) % 60000), qs = 1 + (int64_t)((r >> 5) % 500), oo = -1, os = -1;
    int tag = rangeset_overlap(&s, qo, qs, &oo, &os);
    bool any = false;
    for (int i = 0; i < n; i++) any |= off[i] < qo + qs && qo < off[i] + size[i];
    if ((tag >= 0) != any || (tag >= 0 && !(oo < qo + qs && qo < oo + os && tag == (int)(oo % 100000)))) {
      fprintf(stderr, "FAIL rangeset step %d: overlap of [%lld, +%lld) gave %d\n", step, (long long)qo, (long long)qs, tag);
      fails++;
    }
    bool grow = n == 0 || (n < CAP && ((r >> 50) % 8) < (step % 4000 < 2000 ? 5 : 3));
    if (grow) {
      rangeset_insert(&s, got, want_size, (int)(got % 100000));
      int i = n++;
      while (i > 0 && off[i - 1] > got) off[i] = off[i - 1], size[i] = size[i - 1], i--;
      off[i] = got, size[i] = want_size;
    } else {
      int i = (int)((r >> 20) % (uint64_t)n);
      rangeset_remove(&s, off[i]);
      for (n--; i < n; i++) off[i] = off[i + 1], size[i] = size[i + 1];
    }
  }
  arena_free(a);
  printf("%s rangeset: 20000 random inserts/removals, first fit and overlap as a plain scan\n", fails ? "FAIL" : "ok");
  return fails != 0;
}

int main(void) {
  int failed = 0, n = 0;
  char *mlp = slurp(DUET_SOURCE_DIR "/models/fmnist_mlp.model");
  if (!mlp) {
    fprintf(stderr, "FAIL: cannot read models/fmnist_mlp.model\n");
    return 1;
  }
  failed += check_model("fmnist_mlp.model", mlp), n++;
  failed += check_model("deep.model",
                        "model deep\ninput x: f32[8,16]\ninput y: i32[8]\n"
                        "block layer(h) {\n  param w: [dim(h, -1), 16]\n  param b: [16] = zeros\n"
                        "  return relu(h @ w + b) + h\n}\n"
                        "h = layer(layer(layer(layer(x))))\nloss = cross_entropy(h, y)\n"),
      n++;
  free(mlp);
  failed += check_too_big(), n++;
  failed += check_rangeset(), n++;
  char *tiny = slurp(DUET_SOURCE_DIR "/tests/models/gpt_tiny.model");
  char *mlp2 = slurp(DUET_SOURCE_DIR "/models/fmnist_mlp.model");
  if (!tiny || !mlp2) {
    fprintf(stderr, "FAIL: cannot read tests/models/gpt_tiny.model or models/fmnist_mlp.model\n");
    return 1;
  }
  failed += check_overlap_checker("fmnist_mlp.model", mlp2, 1, 400), n++;
  failed += check_overlap_checker("gpt_tiny.model", tiny, 1, 300), n++;
  failed += check_overlap_checker("gpt_tiny.model", tiny, 2, 300), n++;
  free(tiny);
  free(mlp2);
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed != 0;
}
