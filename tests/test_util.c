/* tests/test_util.c */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

int tmodel_open(TModel *t, const char *name, const char *text, DType float_dtype) {
  FrontendOptions fo = {.float_dtype = float_dtype};
  return tmodel_open_opt(t, name, text, &fo);
}

int tmodel_open_opt(TModel *t, const char *name, const char *text, const FrontendOptions *fo_in) {
  return tmodel_open_prec(t, name, text, fo_in, NULL);
}

int tmodel_open_prec(TModel *t, const char *name, const char *text, const FrontendOptions *fo_in,
                     const char *precision) {
  FrontendOptions fo = *fo_in;
  memset(t, 0, sizeof *t);
  t->arena = arena_new(1 << 16); /* small chunks: exercises the arena's growth */
  t->diag.out = stderr;
  Source *src = arena_alloc(t->arena, sizeof *src);
  src->name = name;
  src->text = text;
  src->len = strlen(text);
  t->g = frontend_compile(t->arena, &t->diag, src, &fo);
  if (!t->g) return 1;
  PassCtx pc = {.diag = &t->diag, .verify = true, .precision = precision};
  if (passes_run(t->g, &pc)) return 1;
  t->cp = codegen_lower(t->g, t->arena);
  char *csrc = codegen_emit_c(t->cp, t->arena);
  char err[8192];
  if (jit_load(csrc, &t->jit, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", name, err);
    return 1;
  }
  t->dev = duet_cpu_device(t->jit.fns, t->jit.n, 0);
  DuetConfig cfg = t->cp->prog.defaults;
  t->s = duet_session_new(&t->cp->prog, t->dev, &cfg, err, sizeof err);
  if (!t->s) {
    fprintf(stderr, "%s: %s\n", name, err);
    return 1;
  }
  return 0;
}

void tmodel_close(TModel *t) {
  duet_session_free(t->s);
  if (t->dev) t->dev->ops->destroy(t->dev);
  jit_unload(&t->jit);
  arena_free(t->arena);
  memset(t, 0, sizeof *t);
}

int tmodel_tensor(const TModel *t, const Value *v) { return t->cp->tensor_of[v->id]; }

Value *tmodel_param(const TModel *t, const char *name) {
  for (int i = 0; i < t->g->n_values; i++) {
    Value *v = t->g->values[i];
    if (v->op == OP_PARAM && !strcmp(v->attr.name, name)) return v;
  }
  return NULL;
}

int check_close(const char *what, double got, double want, double atol, double rtol) {
  if (fabs(got - want) <= atol + rtol * fabs(want)) return 0;
  fprintf(stderr, "FAIL %s: got %.17g, want %.17g (atol %g, rtol %g)\n", what, got, want, atol, rtol);
  return 1;
}

char *slurp(const char *path) {
  size_t n;
  return duet_read_file(path, &n);
}

void tmodel_fill(TModel *t, DuetSession *s, DuetRng *r, int classes) {
  Graph *g = t->g;
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    int id = tmodel_tensor(t, v);
    if (id < 0 || (v->op != OP_INPUT && v->op != OP_PARAM)) continue;
    int64_t n = shape_numel(&v->shape);
    void *p = duet_session_tensor(s, id);
    for (int64_t j = 0; j < n; j++) {
      if (v->dtype == DT_I32) {
        ((int32_t *)p)[j] = (int32_t)(duet_rng_next(r) % (uint64_t)(classes ? classes : 1));
        continue;
      }
      double x = v->op == OP_PARAM ? (0.2 + 0.8 * duet_rng_uniform(r)) * (duet_rng_next(r) & 1 ? 1 : -1)
                                   : duet_rng_normal(r);
      if (v->dtype == DT_F64) ((double *)p)[j] = x;
      else ((float *)p)[j] = (float)x;
    }
  }
}

int compare_sessions(const char *what, const DuetProgram *p, DuetSession *cpu, DuetSession *gpu) {
  int bad = 0;
  for (int i = 0; i < p->n_tensors && bad < 5; i++) {
    const DuetTensor *t = &p->tensors[i];
    if (t->dtype != DUET_F32 && t->dtype != DUET_F64) continue;
    bool f64 = t->dtype == DUET_F64;
    double atol = f64 ? 1e-11 : 1e-4, rtol = f64 ? 1e-9 : 2e-3;
    int64_t n = t->nbytes / (f64 ? 8 : 4);
    const void *a = duet_session_tensor(cpu, i), *b = duet_session_tensor(gpu, i);
    for (int64_t j = 0; j < n; j++) {
      double x = f64 ? ((const double *)a)[j] : ((const float *)a)[j];
      double y = f64 ? ((const double *)b)[j] : ((const float *)b)[j];
      if (x == y || (x != x && y != y)) continue;
      if (!(fabs(x - y) <= atol + rtol * fabs(x))) {
        fprintf(stderr, "FAIL %s: tensor %s[%lld]: gpu %.9g, cpu %.9g\n", what, t->name, (long long)j, y, x);
        bad++;
        break;
      }
    }
  }
  return bad;
}

