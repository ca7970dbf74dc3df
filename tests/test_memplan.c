/* tests/test_memplan.c: invariants of the memory planner, checked
 * independently of it on real models: (1) every tensor lies inside its
 * region; (2) two arena values whose live ranges overlap (definition to last
 * use in graph order; inputs, loss and metrics live throughout) never share
 * bytes; (3) reuse happens: the arena is smaller than the sum of its values.
 * Then memplan's RangeSet against a plain sorted array. */
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
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed != 0;
}
