/* bench/compile_scaling.c: how compile time grows with the size of a model
 * (a benchmark, not a test: it prints times and fails on nothing but a
 * compile error).
 *
 *   usage: compile_scaling [MAX_N] [SHAPE...]     (make bench-compile)
 *
 * For each shape and N = 1250, 2500, ... up to the shape's largest size
 * (below; MAX_N caps them all), it
 * writes a .model text in memory, compiles it as `duet check` does
 * (elaboration, then every pass with the IR verifier after each one) and
 * prints the seconds each phase took, then prints the planned graph and
 * parses it back (`duet run g.ir`'s reading).  Near-linear phases take about
 * twice as long for twice the N; a quadratic one four times.  A shape stops
 * growing once one N took over 60 s.  The shapes:
 *   defs    N block definitions, one of them called (the frontend's block table)
 *   calls   N block definitions, each called once in a chain (block lookup by name)
 *   names   N distinct top-level names, h0 = x, h1 = relu(h0), ... (scope lookup)
 *   repeat  repeat(N, layer, x) of a 16-wide linear layer with a ReLU: about
 *           14 values per layer, forward and backward all live at once
 *           (memplan; the verifier's overlap check)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frontend/frontend.h"
#include "passes/passes.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The model text of one shape and size, malloc'ed; NULL for an unknown shape. */
static char *model_text(const char *shape, int n) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  fprintf(f, "model scale_%s\ninput x: f32[batch, 16]\ninput y: i32[batch]\n", shape);
  if (!strcmp(shape, "defs") || !strcmp(shape, "calls")) {
    for (int i = 0; i < n; i++) fprintf(f, "block b%d(h) {\n  param w: [16] = ones\n  return h * w\n}\n", i);
    fputs("h = x\n", f);
    for (int i = 0; i < (!strcmp(shape, "defs") ? 1 : n); i++) fprintf(f, "h = b%d(h)\n", i);
    fputs("loss = cross_entropy(h, y)\n", f);
  } else if (!strcmp(shape, "names")) {
    fputs("param w: [16] = ones\nh0 = x * w\n", f);
    for (int i = 1; i < n; i++) fprintf(f, "h%d = relu(h%d)\n", i, i - 1);
    fprintf(f, "loss = cross_entropy(h%d, y)\n", n - 1);
  } else if (!strcmp(shape, "repeat")) {
    fputs("block layer(h) {\n  param w: [16, 16] = kaiming_uniform\n  param b: [16] = zeros\n"
          "  return relu(h @ w + b)\n}\n", f);
    fprintf(f, "loss = cross_entropy(repeat(%d, layer, x), y)\n", n);
  } else {
    fclose(f);
    free(buf);
    return NULL;
  }
  fputs("train {\n  batch = 4\n  steps = 1\n}\n", f);
  if (fclose(f)) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* Compiles one model and prints a row of phase times; returns the total
 * seconds, or -1 after a compile error. */
static double run_one(const char *shape, int n) {
  char *text = model_text(shape, n);
  if (!text) {
    fprintf(stderr, "compile_scaling: unknown shape `%s` (defs, calls, names, repeat)\n", shape);
    return -1;
  }
  Arena *a = arena_new(1 << 20);
  Diag d = {.out = stderr};
  Source src = {.name = "scale.model", .text = text, .len = strlen(text)};
  double t0 = now(), total = 0;
  Graph *g = frontend_compile(a, &d, &src, NULL);
  double t_front = now() - t0;
  total += t_front;
  printf("%-7s %7d  frontend %7.3f", shape, n, t_front);
  if (!g) {
    printf("\n");
    free(text);
    arena_free(a);
    return -1;
  }
  PassCtx cx = {.diag = &d, .verify = true};
  double slowest = 0;
  const char *slowest_name = "";
  for (int i = 0; i < duet_n_passes; i++) {
    cx.start_after = i ? duet_passes[i - 1].name : NULL;
    cx.stop_after = duet_passes[i].name;
    double t = now();
    if (passes_run(g, &cx)) {
      printf("\n");
      free(text);
      arena_free(a);
      return -1;
    }
    t = now() - t;
    total += t;
    if (!strcmp(duet_passes[i].name, "memplan")) printf("  memplan %7.3f", t);
    else if (t > slowest) slowest = t, slowest_name = duet_passes[i].name;
  }
  printf("  slowest other pass %7.3f (%s)", slowest, slowest_name);
  /* the planned dump, read back as `duet run g.ir` does */
  char *dump = NULL;
  size_t dump_len = 0;
  FILE *f = open_memstream(&dump, &dump_len);
  if (f) {
    ir_print(g, f);
    if (!fclose(f)) {
      Source ds = {.name = "scale.ir", .text = dump, .len = dump_len};
      double t = now();
      Graph *h = ir_parse(a, &d, &ds);
      t = now() - t;
      total += t;
      printf("  ir_parse %7.3f%s", t, h ? "" : " (failed)");
    }
    free(dump);
  }
  printf("  values %7d  total %7.3f s\n", g->n_values, total);
  fflush(stdout);
  free(text);
  arena_free(a);
  return total;
}

int main(int argc, char **argv) {
  int max_n = argc > 1 ? atoi(argv[1]) : 1 << 30;
  if (max_n < 1) {
    fprintf(stderr, "usage: %s [MAX_N] [defs|calls|names|repeat ...]\n", argv[0]);
    return 2;
  }
  static const char *const all[] = {"defs", "calls", "names", "repeat"};
  /* the largest N of each shape: the graph holds at most 2^18 values */
  static const int largest[] = {160000, 20000, 80000, 10000};
  const char *const *shapes = argc > 2 ? (const char *const *)argv + 2 : all;
  int n_shapes = argc > 2 ? argc - 2 : 4;
  printf("compile time by model size (seconds; frontend = parse + elaborate; every pass verified)\n");
  int rc = 0;
  for (int s = 0; s < n_shapes; s++)
    for (int n = 1250; n <= max_n; n *= 2) {
      int k = 0;
      while (k < 4 && strcmp(all[k], shapes[s])) k++;
      if (k < 4 && n > largest[k]) break;
      double t = run_one(shapes[s], n);
      if (t < 0) {
        rc = 1;
        break;
      }
      if (t > 60) {
        printf("%-7s stopped: over 60 s at N = %d\n", shapes[s], n);
        break;
      }
    }
  return rc;
}
