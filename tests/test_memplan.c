/* tests/test_memplan.c: invariants of the memory planner, checked
 * independently of it on real models: (1) every tensor lies inside its
 * region; (2) two arena values whose live ranges overlap (definition to last
 * use in graph order; inputs, loss and metrics live throughout) never share
 * bytes; (3) reuse happens: the arena is smaller than the sum of its values. */
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
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed != 0;
}
