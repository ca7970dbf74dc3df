/* tests/test_ir_parse.c: the IR printer and parser are inverses for the
 * graphs the CLI cannot dump: a decode graph (key/value cache state,
 * attention_decode, the `decode` header), a graph with f64 floats (the
 * `float_dtype` header), and a model with dropout, whose masks' probability
 * and site must survive inside fused programs.  For each, after every pass:
 * print(parse(print(g))) == print(g), and a graph parsed after pass P, taken
 * through the remaining passes, prints as the original after the last. */
#include <stdlib.h>
#include <string.h>

#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "../runtime/duet_rt.h"

static char *slurp(const char *path) {
  size_t n;
  return duet_read_file(path, &n);
}

/* ir_print into a malloc'd string. */
static char *print(const Graph *g) {
  FILE *f = tmpfile();
  if (!f) return NULL;
  ir_print(g, f);
  long n = ftell(f);
  rewind(f);
  char *s = malloc((size_t)n + 1);
  if (fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
  s[n] = 0;
  fclose(f);
  return s;
}

/* The model compiled through the passes up to `stop` (NULL: all). */
static Graph *compile(Arena *a, Diag *d, const char *name, const char *text, const FrontendOptions *fo,
                      const char *stop) {
  Source *src = arena_alloc(a, sizeof *src);
  src->name = name;
  src->text = text;
  src->len = strlen(text);
  Graph *g = frontend_compile(a, d, src, fo);
  PassCtx pc = {.diag = d, .verify = true, .stop_after = stop};
  return g && !passes_run(g, &pc) ? g : NULL;
}

static int check(const char *name, const char *text, const FrontendOptions *fo) {
  int fails = 0;
  Diag d = {.out = stderr};
  Arena *full_a = arena_new(1 << 16);
  Graph *full = compile(full_a, &d, name, text, fo, NULL);
  char *want_last = full ? print(full) : NULL;
  if (!want_last) {
    fprintf(stderr, "FAIL %s: does not compile\n", name);
    return 1;
  }
  for (int p = 0; p < duet_n_passes; p++) {
    Arena *a = arena_new(1 << 16);
    Graph *g = compile(a, &d, name, text, fo, duet_passes[p].name);
    char *once = g ? print(g) : NULL;
    Source src = {.name = "dump.ir", .text = once, .len = once ? strlen(once) : 0};
    Graph *h = once ? ir_parse(a, &d, &src) : NULL;
    char *twice = h ? print(h) : NULL;
    if (!twice || strcmp(once, twice)) {
      fprintf(stderr, "FAIL %s after %s: print(parse(print(g))) differs\n", name, duet_passes[p].name);
      fails++;
    } else {
      PassCtx pc = {.diag = &d, .verify = true, .start_after = h->after_pass};
      char *last = passes_run(h, &pc) ? NULL : print(h);
      if (!last || strcmp(last, want_last)) {
        fprintf(stderr, "FAIL %s: resumed after %s, the final graph differs\n", name, duet_passes[p].name);
        fails++;
      }
      free(last);
    }
    free(once);
    free(twice);
    arena_free(a);
  }
  free(want_last);
  arena_free(full_a);
  if (!fails) printf("ok %s\n", name);
  return fails;
}

int main(void) {
  char *gpt = slurp(DUET_SOURCE_DIR "/tests/models/gpt_tiny.model");
  char *mlp = slurp(DUET_SOURCE_DIR "/models/fmnist_mlp.model");
  if (!gpt || !mlp) {
    fprintf(stderr, "FAIL: cannot read the models\n");
    return 1;
  }
  int fails = 0;
  FrontendOptions decode = {.batch = 1, .decode = true}, f64 = {.float_dtype = DT_F64};
  fails += check("gpt_tiny (decode)", gpt, &decode);
  fails += check("gpt_tiny (f64)", gpt, &f64);
  /* dropout: p and site inside fused programs and on their own */
  const char *drop = "model drop\n"
                     "input x: f32[batch, 8]\ninput y: i32[batch]\n"
                     "param w: [8, 4] = uniform(-0.5, 0.25)\n"
                     "h = dropout(relu(x @ w), 0.125)\n"
                     "loss = cross_entropy(dropout(h, 0.3) * 2, y)\n"
                     "train {\n  optimizer = sgd(lr = 0.1, momentum = 0.9)\n  batch = 4\n  steps = 3\n}\n";
  FrontendOptions plain = {0};
  fails += check("dropout", drop, &plain);
  /* the same model read back has the same dropout attributes */
  char *text = NULL;
  {
    Diag d = {.out = stderr};
    Arena *a = arena_new(1 << 16);
    Graph *g = compile(a, &d, "drop", drop, &plain, NULL);
    text = g ? print(g) : NULL;
    arena_free(a);
  }
  if (!text || !strstr(text, "dropout[p=0.125,site=") || !strstr(text, "dropout[p=0.3,site=") ||
      !strstr(text, "sgd(lr = 0.1, momentum = 0.9, weight_decay = 0)") || !strstr(text, "uniform(-0.5, 0.25)")) {
    fprintf(stderr, "FAIL: dropout, sgd or uniform attributes missing from the dump:\n%s", text ? text : "");
    fails++;
  }
  free(text);
  free(gpt);
  free(mlp);
  printf("%d failed\n", fails);
  return fails != 0;
}
