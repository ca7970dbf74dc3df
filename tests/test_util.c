/* tests/test_util.c */
#define _POSIX_C_SOURCE 200809L
#include "test_util.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/duet_half.h"

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
  DuetConfig cfg = t->cp->prog.defaults;
  if (t->cp->prog.n_stages >= 1) { /* micro-batches: the pipeline, on cpu:0 */
    cfg.quiet = 1;
    t->s = duet_session_new_pipeline(&t->cp->prog, t->jit.fns, &cfg, err, sizeof err);
  } else {
    t->dev = duet_cpu_device(t->jit.fns, t->jit.n, 0);
    t->s = duet_session_new(&t->cp->prog, t->dev, &cfg, err, sizeof err);
  }
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

bool close_enough(double got, double want, double atol, double rtol) {
  if (isinf(got) || isinf(want)) return got == want;
  return fabs(got - want) <= atol + rtol * fabs(want); /* false on a NaN */
}

int check_close(const char *what, double got, double want, double atol, double rtol) {
  if (close_enough(got, want, atol, rtol)) return 0;
  fprintf(stderr, "FAIL %s: got %.17g, want %.17g (atol %g, rtol %g)\n", what, got, want, atol, rtol);
  return 1;
}

/* check_normwise over values read by get(base, i). */
static int normwise(const char *what, const void *got, const void *want, int64_t n, double tol, double scale,
                    double *ratio, double (*get)(const void *, int64_t)) {
  int64_t at = -1, bad_at = -1;
  double s = 0, worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double w = get(want, i), g = get(got, i);
    if (!isfinite(w) || !isfinite(g)) {
      if (bad_at < 0) bad_at = i;
      continue;
    }
    if (fabs(w) > s) s = fabs(w);
    if (at < 0 || fabs(g - w) > worst) worst = fabs(g - w), at = i;
  }
  if (scale <= 0) scale = s;
  double bound = tol * scale;
  if (ratio) *ratio = bad_at >= 0 ? INFINITY : worst == 0 ? 0 : worst / bound;
  if (bad_at >= 0) {
    fprintf(stderr, "FAIL %s: [%lld] got %.9g, want %.9g: not a finite number\n", what, (long long)bad_at,
            get(got, bad_at), get(want, bad_at));
    return 1;
  }
  if (n > 0 && !(worst <= bound)) {
    fprintf(stderr, "FAIL %s: [%lld] got %.9g, want %.9g: error %.3g > %.3g (tol %.3g x scale %.3g)\n", what,
            (long long)at, get(got, at), get(want, at), worst, bound, tol, scale);
    return 1;
  }
  return 0;
}

static double get_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }
static double get_f64(const void *p, int64_t i) { return ((const double *)p)[i]; }

int check_normwise(const char *what, const float *got, const float *want, int64_t n, double tol, double scale,
                   double *ratio) {
  return normwise(what, got, want, n, tol, scale, ratio, get_f32);
}

int check_normwise_f64(const char *what, const double *got, const double *want, int64_t n, double tol, double scale,
                       double *ratio) {
  return normwise(what, got, want, n, tol, scale, ratio, get_f64);
}

static bool is16(int dt) { return dt == DT_F16 || dt == DT_BF16; }

int *tmodel_round16_depth(const TModel *t) {
  const Graph *g = t->g;
  int *depth = arena_alloc(t->arena, ((size_t)g->n_values + 1) * sizeof *depth);
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    int d = 0;
    if (v->op == OP_FUSED) {
      const FusedProg *fp = v->attr.prog;
      int *k = arena_alloc(t->arena, (size_t)fp->n * sizeof *k);
      for (int j = 0; j < fp->n; j++) {
        const FusedInstr *fi = &fp->ins[j];
        int ar = fi->op == OP_COUNT ? 0 : op_info[fi->op].arity;
        if (fi->op == OP_COUNT) k[j] = depth[v->in[fi->a]->id];
        else k[j] = (ar >= 1 ? k[fi->a] : 0) > (ar >= 2 ? k[fi->b] : 0) ? k[fi->a] : ar >= 2 ? k[fi->b] : 0;
        if (fi->op == OP_CAST && is16((int)fi->site)) k[j]++;
      }
      const FusedInstr *last = &fp->ins[fp->n - 1];
      d = k[fp->n - 1] + (is16(v->dtype) && !(last->op == OP_CAST && (int)last->site == (int)v->dtype));
    } else {
      for (int j = 0; j < v->n_in; j++)
        if (depth[v->in[j]->id] > d) d = depth[v->in[j]->id];
      d += is16(v->dtype);
    }
    depth[i] = d;
  }
  return depth;
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
    size_t bytes = (size_t)n * (v->dtype == DT_F64 ? 8 : 4);
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
      fprintf(stderr, "tmodel_fill: out of memory\n");
      exit(1);
    }
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
    /* through the device's copy: a GPU session's memory is not the host's */
    if (duet_session_write(s, id, 0, p, bytes)) {
      fprintf(stderr, "tmodel_fill: %s\n", duet_session_error(s));
      exit(1);
    }
    free(p);
  }
}

int compare_sessions(const char *what, const DuetProgram *p, DuetSession *cpu, DuetSession *gpu) {
  return compare_sessions_stats(what, p, cpu, gpu, NULL);
}

static double widen16(const void *base, int64_t j, int dtype) {
  uint16_t h = ((const uint16_t *)base)[j];
  return dtype == DUET_F16 ? duet_f32_from_f16(h) : duet_f32_from_bf16(h);
}

/* The memory planner reuses activation memory: an arena tensor whose
 * bytes a tensor of another dtype shares may end the run holding that
 * tensor's bits (16-bit pairs read as an f32 say nothing), so it is not
 * compared. */
static bool aliased_other_dtype(const DuetProgram *p, int i) {
  const DuetTensor *t = &p->tensors[i];
  for (int j = 0; j < p->n_tensors; j++) {
    const DuetTensor *u = &p->tensors[j];
    if (u->region == t->region && u->dtype != t->dtype && u->offset < t->offset + t->nbytes &&
        t->offset < u->offset + u->nbytes)
      return true;
  }
  return false;
}

int compare_sessions_stats(const char *what, const DuetProgram *p, DuetSession *cpu, DuetSession *gpu,
                           CompareStats *st) {
  int bad = 0, half16 = 0; /* the program's 16-bit dtype, if any */
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].dtype == DUET_F16 || p->tensors[i].dtype == DUET_BF16) half16 = p->tensors[i].dtype;
  for (int i = 0; i < p->n_tensors && bad < 5; i++) {
    const DuetTensor *t = &p->tensors[i];
    bool h16 = t->dtype == DUET_F16 || t->dtype == DUET_BF16;
    if (t->dtype != DUET_F32 && t->dtype != DUET_F64 && !h16) continue;
    if (t->region == DUET_MEM_ARENA && aliased_other_dtype(p, i)) continue;
    bool f64 = t->dtype == DUET_F64;
    double atol = f64 ? 1e-11 : 1e-4, rtol = f64 ? 1e-9 : 2e-3;
    if (t->dtype == DUET_F16) atol = 1e-3, rtol = 4e-3;  /* 2^-10 ulp at 1: about 4 ulps */
    if (t->dtype == DUET_BF16) atol = 1e-3, rtol = 3e-2; /* 2^-7 ulp at 1: about 4 ulps */
    int64_t n = t->nbytes / (f64 ? 8 : h16 ? 2 : 4);
    void *a = malloc((size_t)t->nbytes + 1), *b = malloc((size_t)t->nbytes + 1);
    if (!a || !b || duet_session_read(cpu, i, 0, a, (size_t)t->nbytes) ||
        duet_session_read(gpu, i, 0, b, (size_t)t->nbytes)) {
      fprintf(stderr, "FAIL %s: reading tensor %s: %s%s\n", what, t->name, duet_session_error(cpu),
              duet_session_error(gpu));
      free(a), free(b);
      bad++;
      break;
    }
    /* programs with 16-bit tensors: an element may also differ by a
     * fraction of the tensor's largest magnitude (one-ulp flips of 16-bit
     * intermediates, from f32 sums in another order, travel through the
     * backward pass; measured on gpt_tiny: at most 0.14% (fp16) and 0.32%
     * (bf16) of the largest magnitude) */
    double scale_tol = 0;
    if (half16) {
      for (int64_t j = 0; j < n; j++) {
        double x = fabs(f64 ? ((const double *)a)[j] : h16 ? widen16(a, j, t->dtype) : ((const float *)a)[j]);
        if (x > scale_tol && x <= 1e300) scale_tol = x;
      }
      scale_tol *= half16 == DUET_F16 ? 1e-2 : 2e-2;
    }
    for (int64_t j = 0; j < n; j++) {
      double x = f64 ? ((const double *)a)[j] : h16 ? widen16(a, j, t->dtype) : ((const float *)a)[j];
      double y = f64 ? ((const double *)b)[j] : h16 ? widen16(b, j, t->dtype) : ((const float *)b)[j];
      if (st && h16) {
        st->n16++;
        st->same16 += ((const uint16_t *)a)[j] == ((const uint16_t *)b)[j];
      }
      if (x == y || (x != x && y != y && p->n_unscale > 0)) continue;
      if (!close_enough(y, x, atol, rtol) && !(isfinite(x) && isfinite(y) && fabs(x - y) <= scale_tol)) {
        fprintf(stderr, "FAIL %s: tensor %s[%lld]: gpu %.9g, cpu %.9g\n", what, t->name, (long long)j, y, x);
        bad++;
        break;
      }
    }
    free(a), free(b);
  }
  return bad;
}


CgProgram *lower_model(Arena *a, const char *path, const char *text, DType dt, bool decode, const char *precision) {
  Diag d = {.out = stderr};
  Source *src;
  if (text) {
    src = arena_alloc(a, sizeof *src);
    memset(src, 0, sizeof *src);
    src->name = path;
    src->text = text;
    src->len = strlen(text);
  } else {
    src = frontend_read_file(a, &d, path);
  }
  if (!src) return NULL;
  FrontendOptions fo = {.float_dtype = dt, .decode = decode, .batch = decode ? 1 : 0};
  Graph *g = frontend_compile(a, &d, src, &fo);
  if (!g) return NULL;
  PassCtx pc = {.diag = &d, .verify = true, .precision = precision};
  if (passes_run(g, &pc)) return NULL;
  return codegen_lower(g, a);
}

static int cmp_str(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

int list_models(const char *dir, char ***names) {
  *names = NULL;
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l <= 6 || strcmp(e->d_name + l - 6, ".model")) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      char **grown = realloc(*names, sizeof *grown * (size_t)cap);
      if (!grown) break;
      *names = grown;
    }
    if (!((*names)[n] = strdup(e->d_name))) break;
    n++;
  }
  closedir(d);
  if (n) qsort(*names, (size_t)n, sizeof **names, cmp_str);
  return n;
}

int check_ptx_entries(const char *what, const char *ptx, int n) {
  for (int i = 0; i < n; i++) {
    char want[48];
    snprintf(want, sizeof want, ".entry duet_k%d(", i);
    if (!strstr(ptx, want)) {
      fprintf(stderr, "FAIL %s: PTX has no entry point duet_k%d\n", what, i);
      return 1;
    }
  }
  return 0;
}
