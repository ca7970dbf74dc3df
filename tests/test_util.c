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
  return tmodel_open_quant(t, name, text, fo_in, precision, NULL);
}

int64_t tmodel_calibrate;

int tmodel_open_quant(TModel *t, const char *name, const char *text, const FrontendOptions *fo_in,
                      const char *precision, const char *quantize) {
  return tmodel_open_opts(t, name, text, fo_in, precision, quantize, 0);
}

/* --prune-mode channels --prune S --shrink as PassCtx fields (S > 0), into *ps */
static void shrink_ctx(PassCtx *pc, PruneSpec *ps, double shrink) {
  if (!(shrink > 0)) return;
  *ps = (PruneSpec){.mode = PRUNE_CHANNELS, .sparsity = shrink, .set = PRUNE_SET_MODE | PRUNE_SET_SPARSITY};
  pc->prune = ps;
  pc->shrink = true;
}

int tmodel_open_opts(TModel *t, const char *name, const char *text, const FrontendOptions *fo_in,
                     const char *precision, const char *quantize, double shrink) {
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
  PassCtx pc = {.diag = &t->diag, .verify = true, .precision = precision, .quantize = quantize,
                .calibrate = quantize ? tmodel_calibrate : 0};
  PruneSpec ps;
  shrink_ctx(&pc, &ps, shrink);
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

double round16_tol(const char *prec, int depth) {
  double u16 = prec && !strcmp(prec, "fp16") ? 0x1p-11 : prec && !strcmp(prec, "bf16") ? 0x1p-8 : 0;
  return depth * u16 + 0x1p-17;
}

int *tmodel_tensor_depth16(const TModel *t) {
  const Graph *g = t->g;
  const DuetProgram *p = &t->cp->prog;
  const int *depth = tmodel_round16_depth(t);
  int *d = arena_alloc(t->arena, ((size_t)p->n_tensors + 1) * sizeof *d);
  for (int i = 0; i < p->n_tensors; i++) d[i] = 0;
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    int id = t->cp->tensor_of[i];
    if (id >= 0 && depth[i] > d[id]) d[id] = depth[i];
    /* an update writes its param and state tensors in place */
    for (int j = 0; (v->op == OP_ADAMW || v->op == OP_SGD) && j < v->n_in; j++) {
      int u = t->cp->tensor_of[v->in[j]->id];
      if (u >= 0 && depth[i] > d[u]) d[u] = depth[i];
    }
  }
  /* tensors sharing bytes (views, reused arena memory) may end a run
   * holding each other's values */
  int *out = arena_alloc(t->arena, ((size_t)p->n_tensors + 1) * sizeof *out);
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *a = &p->tensors[i];
    out[i] = d[i];
    for (int j = 0; j < p->n_tensors; j++) {
      const DuetTensor *b = &p->tensors[j];
      if (b->region == a->region && b->stage == a->stage && b->dtype == a->dtype && b->offset < a->offset + a->nbytes &&
          a->offset < b->offset + b->nbytes && d[j] > out[i])
        out[i] = d[j];
    }
  }
  return out;
}

SessionTol tmodel_session_tol16(const TModel *t) {
  const Graph *g = t->g;
  const DuetProgram *p = &t->cp->prog;
  const int *d = tmodel_tensor_depth16(t);
  const char *prec = NULL;
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].dtype == DUET_F16) prec = "fp16";
    else if (p->tensors[i].dtype == DUET_BF16) prec = "bf16";
  SessionTol st = {arena_alloc(t->arena, ((size_t)p->n_tensors + 1) * sizeof *st.rel),
                   arena_alloc(t->arena, ((size_t)p->n_tensors + 1) * sizeof *st.group)};
  for (int i = 0; i < p->n_tensors; i++) st.rel[i] = 2 * round16_tol(prec, d[i]), st.group[i] = -1;
  /* optimizer states: one scale per block instance (the param's name up
   * to its last '.') and state */
  const Value **first = arena_alloc(t->arena, ((size_t)g->n_values + 1) * sizeof *first);
  int n_first = 0;
  for (int i = 0; i < g->n_values; i++) {
    const Value *u = g->values[i];
    if (u->op != OP_ADAMW && u->op != OP_SGD) continue;
    const char *name = u->in[0]->attr.name, *dot = strrchr(name, '.');
    size_t plen = dot ? (size_t)(dot - name) : 0;
    int grp = -1; /* the first update of the same block instance */
    for (int j = 0; j < n_first && grp < 0; j++) {
      const char *o = first[j]->in[0]->attr.name, *od = strrchr(o, '.');
      if ((od ? (size_t)(od - o) : 0) == plen && !strncmp(o, name, plen)) grp = j;
    }
    if (grp < 0) first[grp = n_first++] = u;
    for (int j = 2; j < u->n_in; j++) {
      int id = t->cp->tensor_of[u->in[j]->id];
      if (id >= 0) st.group[id] = grp * 4 + j;
    }
  }
  return st;
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
    size_t bytes = (size_t)n * (v->dtype == DT_F64 ? 8 : v->dtype == DT_I8 ? 1 : 4);
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
      if (v->dtype == DT_I8) { /* int8 weights of a quantized program: -127..127 */
        ((signed char *)p)[j] = (signed char)((int)(duet_rng_next(r) % 255u) - 127);
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
  return compare_sessions_stats(what, p, cpu, gpu, NULL, NULL);
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

static double load_elem(const void *base, int64_t j, int dtype) {
  switch (dtype) {
  case DUET_F64: return ((const double *)base)[j];
  case DUET_F16: case DUET_BF16: return widen16(base, j, dtype);
  case DUET_U8: return ((const unsigned char *)base)[j]; /* 8-bit AdamW state codes */
  case DUET_I8: return ((const signed char *)base)[j];   /* quantized weights */
  default: return ((const float *)base)[j];
  }
}

static int ls_size(int dt);

/* The largest finite |x| of tensor i in session s (0 when unreadable). */
static double session_maxabs(const DuetProgram *p, DuetSession *s, int i) {
  const DuetTensor *t = &p->tensors[i];
  int dt = t->dtype;
  if (dt != DUET_F32 && dt != DUET_F64 && dt != DUET_F16 && dt != DUET_BF16) return 0;
  void *a = malloc((size_t)t->nbytes + 1);
  double m = 0;
  if (a && !duet_session_read(s, i, 0, a, (size_t)t->nbytes))
    for (int64_t j = 0; j < t->nbytes / ls_size(dt); j++) {
      double x = fabs(load_elem(a, j, dt));
      if (x > m && isfinite(x)) m = x;
    }
  free(a);
  return m;
}

int compare_sessions_stats(const char *what, const DuetProgram *p, DuetSession *cpu, DuetSession *gpu,
                           const SessionTol *tol16, CompareStats *st) {
  int bad = 0, half16 = 0; /* the program's 16-bit dtype, if any */
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].dtype == DUET_F16 || p->tensors[i].dtype == DUET_BF16) half16 = p->tensors[i].dtype;
  if (half16 && !tol16) {
    fprintf(stderr, "FAIL %s: a program with 16-bit tensors compared without per-tensor tolerances\n", what);
    return 1;
  }
  double *gscale = NULL; /* per scale group: the largest |cpu| of its tensors */
  if (half16) {
    int ng = 0;
    for (int i = 0; i < p->n_tensors; i++) ng = tol16->group[i] + 1 > ng ? tol16->group[i] + 1 : ng;
    gscale = calloc((size_t)ng + 1, sizeof *gscale);
    for (int i = 0; gscale && i < p->n_tensors; i++)
      if (tol16->group[i] >= 0) gscale[tol16->group[i]] = fmax(gscale[tol16->group[i]], session_maxabs(p, cpu, i));
  }
  for (int i = 0; i < p->n_tensors && bad < 5; i++) {
    const DuetTensor *t = &p->tensors[i];
    bool h16 = t->dtype == DUET_F16 || t->dtype == DUET_BF16;
    if (t->dtype != DUET_F32 && t->dtype != DUET_F64 && !h16) continue;
    if (t->region == DUET_MEM_ARENA && aliased_other_dtype(p, i)) continue;
    bool f64 = t->dtype == DUET_F64;
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
    if (st && h16)
      for (int64_t j = 0; j < n; j++) {
        st->n16++;
        st->same16 += ((const uint16_t *)a)[j] == ((const uint16_t *)b)[j];
      }
    if (half16) {
      /* normwise: max |b - a| <= tol16->rel[i] x the scale */
      double scale = 0, worst = 0;
      int64_t at = -1, bad_at = -1;
      for (int64_t j = 0; j < n; j++) {
        double x = load_elem(a, j, t->dtype), y = load_elem(b, j, t->dtype);
        if (x == y || (x != x && y != y && p->n_unscale > 0)) continue;
        if (!isfinite(x) || !isfinite(y)) {
          if (bad_at < 0) bad_at = j;
          continue;
        }
        if (fabs(y - x) > worst) worst = fabs(y - x), at = j;
      }
      for (int64_t j = 0; j < n; j++) {
        double x = fabs(load_elem(a, j, t->dtype));
        if (x > scale && isfinite(x)) scale = x;
      }
      if (gscale && tol16->group[i] >= 0) scale = fmax(scale, gscale[tol16->group[i]]);
      if (st && (st->tol_min == 0 || tol16->rel[i] < st->tol_min)) st->tol_min = tol16->rel[i];
      if (st && tol16->rel[i] > st->tol_max) st->tol_max = tol16->rel[i];
      double bound = tol16->rel[i] * scale, used = bad_at >= 0 ? INFINITY : worst == 0 ? 0 : worst / bound;
      if (st && used > st->worst) {
        st->worst = used;
        snprintf(st->worst_tensor, sizeof st->worst_tensor, "%s", t->name);
      }
      if (bad_at >= 0) {
        fprintf(stderr, "FAIL %s: tensor %s[%lld]: gpu %.9g, cpu %.9g: not a finite number\n", what, t->name,
                (long long)bad_at, load_elem(b, bad_at, t->dtype), load_elem(a, bad_at, t->dtype));
        bad++;
      } else if (!(worst <= bound)) {
        fprintf(stderr,
                "FAIL %s: tensor %s[%lld]: gpu %.9g, cpu %.9g: error %.3g > %.3g (%.3g x the largest |cpu| %.3g)\n",
                what, t->name, (long long)at, load_elem(b, at, t->dtype), load_elem(a, at, t->dtype), worst, bound,
                tol16->rel[i], scale);
        bad++;
      }
      free(a), free(b);
      continue;
    }
    double atol = f64 ? 1e-11 : 1e-4, rtol = f64 ? 1e-9 : 2e-3;
    for (int64_t j = 0; j < n; j++) {
      double x = load_elem(a, j, t->dtype), y = load_elem(b, j, t->dtype);
      if (x == y) continue;
      double used = isfinite(x) && isfinite(y) ? fabs(y - x) / (atol + rtol * fabs(x)) : INFINITY;
      if (st && used > st->worst) {
        st->worst = used;
        snprintf(st->worst_tensor, sizeof st->worst_tensor, "%s", t->name);
      }
      if (!close_enough(y, x, atol, rtol)) {
        fprintf(stderr, "FAIL %s: tensor %s[%lld]: gpu %.9g, cpu %.9g\n", what, t->name, (long long)j, y, x);
        bad++;
        break;
      }
    }
    free(a), free(b);
  }
  free(gscale);
  return bad;
}

CgProgram *lower_model(Arena *a, const char *path, const char *text, DType dt, bool decode, const char *precision) {
  return lower_model_quant(a, path, text, dt, decode, precision, NULL);
}

CgProgram *lower_model_quant(Arena *a, const char *path, const char *text, DType dt, bool decode,
                             const char *precision, const char *quantize) {
  return lower_model_opts(a, path, text, dt, decode, precision, quantize, 0);
}

CgProgram *lower_model_opts(Arena *a, const char *path, const char *text, DType dt, bool decode,
                            const char *precision, const char *quantize, double shrink) {
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
  PassCtx pc = {.diag = &d, .verify = true, .precision = precision, .quantize = quantize,
                .calibrate = quantize ? tmodel_calibrate : 0};
  PruneSpec ps;
  shrink_ctx(&pc, &ps, shrink);
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

/* ------------------------------------------------------------ lockstep */

typedef struct LsAlloc {
  char *dev;    /* the inner device's memory */
  size_t bytes;
  char *host;   /* its copy, taken before each launch */
} LsAlloc;

typedef struct Lockstep {
  DuetDevice self; /* first: the device the session uses */
  DuetDeviceOps ops;
  DuetDevice *inner;
  const TModel *t;
  const char *what;
  LsAlloc *al;
  int n_al, cap_al;
  void **th;      /* the tensor table over the host copies */
  char *attn_ref; /* KK_ATTN_BWD: the C kernel's dk, dv, for the KK_ATTN_BWD_KV after it */
  int attn_ref_tensor;
  void *const *dt; /* the device's tensor table of the launch being checked */
  LockstepStats st;
} Lockstep;

static Lockstep *ls_of(DuetDevice *d) { return (Lockstep *)d; }

static int ls_fail_inner(Lockstep *L) {
  snprintf(L->self.err, sizeof L->self.err, "%s", L->inner->err);
  return -1;
}

static void *ls_alloc(DuetDevice *d, size_t bytes) {
  Lockstep *L = ls_of(d);
  if (L->n_al == L->cap_al) {
    int cap = L->cap_al ? 2 * L->cap_al : 8;
    LsAlloc *grown = realloc(L->al, (size_t)cap * sizeof *grown);
    if (!grown) {
      snprintf(d->err, sizeof d->err, "lockstep: out of host memory");
      return NULL;
    }
    L->al = grown, L->cap_al = cap;
  }
  char *p = L->inner->ops->alloc(L->inner, bytes);
  char *h = p ? malloc(bytes ? bytes : 1) : NULL;
  if (!p || !h) {
    if (p) L->inner->ops->free(L->inner, p);
    if (!p) ls_fail_inner(L);
    else snprintf(d->err, sizeof d->err, "lockstep: out of host memory for a %zu-byte copy", bytes);
    return NULL;
  }
  L->al[L->n_al++] = (LsAlloc){p, bytes, h};
  return p;
}

static void ls_free(DuetDevice *d, void *p) {
  Lockstep *L = ls_of(d);
  for (int i = 0; i < L->n_al; i++)
    if (L->al[i].dev == p) {
      free(L->al[i].host);
      L->al[i] = L->al[--L->n_al];
      break;
    }
  L->inner->ops->free(L->inner, p);
}

static int ls_to_device(DuetDevice *d, void *dst, const void *src, size_t n) {
  Lockstep *L = ls_of(d);
  return L->inner->ops->copy_to_device(L->inner, dst, src, n) ? ls_fail_inner(L) : 0;
}

static int ls_to_host(DuetDevice *d, void *dst, const void *src, size_t n) {
  Lockstep *L = ls_of(d);
  return L->inner->ops->copy_to_host(L->inner, dst, src, n) ? ls_fail_inner(L) : 0;
}

static int ls_sync(DuetDevice *d) {
  Lockstep *L = ls_of(d);
  return L->inner->ops->sync(L->inner) ? ls_fail_inner(L) : 0;
}

static void ls_destroy(DuetDevice *d) {
  Lockstep *L = ls_of(d);
  for (int i = 0; i < L->n_al; i++) free(L->al[i].host);
  free(L->al);
  free(L->th);
  free(L->attn_ref);
  L->inner->ops->destroy(L->inner);
  free(L);
}

static void *ls_host_alloc(DuetDevice *d, size_t bytes) {
  Lockstep *L = ls_of(d);
  void *p = L->inner->ops->host_alloc(L->inner, bytes);
  if (!p) ls_fail_inner(L);
  return p;
}

static void ls_host_free(DuetDevice *d, void *p) {
  Lockstep *L = ls_of(d);
  L->inner->ops->host_free(L->inner, p);
}

/* Every allocation copied to the host, and the tensor table over the
 * copies: the memory a launch starts from. */
static int ls_snapshot(Lockstep *L, void *const *t) {
  const DuetProgram *p = &L->t->cp->prog;
  if (L->inner->ops->sync(L->inner)) return ls_fail_inner(L);
  for (int i = 0; i < L->n_al; i++)
    if (L->al[i].bytes && L->inner->ops->copy_to_host(L->inner, L->al[i].host, L->al[i].dev, L->al[i].bytes))
      return ls_fail_inner(L);
  for (int j = 0; j <= p->n_tensors; j++) {
    L->th[j] = NULL;
    uintptr_t x = (uintptr_t)t[j]; /* device addresses, compared as numbers */
    for (int i = 0; x && i < L->n_al; i++) {
      uintptr_t base = (uintptr_t)L->al[i].dev;
      if (x >= base && x - base < L->al[i].bytes + (L->al[i].bytes == 0)) {
        L->th[j] = L->al[i].host + (x - base);
        break;
      }
    }
    if (x && !L->th[j] && (j < p->n_tensors ? p->tensors[j].nbytes > 0 : duet_flag_words(p) > 0)) {
      snprintf(L->self.err, sizeof L->self.err, "lockstep: tensor %d lies in no allocation of the device", j);
      return -1;
    }
  }
  return 0;
}

static bool ls_is16(int dt) { return dt == DUET_F16 || dt == DUET_BF16; }
static int ls_size(int dt) { return dt == DUET_F64 ? 8 : ls_is16(dt) ? 2 : dt == DUET_U8 || dt == DUET_I8 ? 1 : 4; }

/* One unit in the last place of the 16-bit format at magnitude x: the
 * spacing of its numbers in x's binade (subnormals: the smallest). */
static double ulp16(double x, int dt) {
  int p = dt == DUET_F16 ? 11 : 8, emin = dt == DUET_F16 ? -14 : -126, e;
  frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
  if (e - 1 < emin) e = emin + 1;
  return ldexp(1, e - 1 - (p - 1));
}

/* The bound of one output: |dev - ref| <= flips x ulp16(max of the two)
 * + noise x (mag ? mag[i] : scale). */
typedef struct LsBound {
  double flips, noise, scale;
  const double *mag; /* per element, or NULL */
} LsBound;

/* Compares n elements of dtype dt at element `lo` of tensor id: the
 * device's (read back) against ref (its element lo first; dtype dt, or
 * f64 when ref64: the exact GEMM). */
static int ls_compare(Lockstep *L, const char *what, int id, int64_t lo, int64_t n, int dt, const void *ref, bool ref64,
                      const LsBound *b) {
  const DuetProgram *p = &L->t->cp->prog;
  size_t es = (size_t)ls_size(dt), bytes = (size_t)n * es;
  const char *name = id < p->n_tensors ? p->tensors[id].name : "overflow flag";
  char *dev = malloc(bytes ? bytes : 1);
  const char *src = (const char *)L->dt[id] + (size_t)lo * es;
  if (!dev || L->inner->ops->copy_to_host(L->inner, dev, src, bytes)) {
    snprintf(L->self.err, sizeof L->self.err, "lockstep: reading %s back: %.400s", name,
             dev ? L->inner->err : "out of memory");
    free(dev);
    return -1;
  }
  const char *r = ref;
  int bad = 0;
  for (int64_t i = 0; i < n && !bad; i++) {
    double e, c;
    if (dt == DUET_I32) e = ((const int32_t *)dev)[i], c = ((const int32_t *)r)[i];
    else e = load_elem(dev, i, dt), c = load_elem(r, i, ref64 ? DUET_F64 : dt);
    double bound = 0, diff = fabs(e - c);
    if (e == c || (e != e && c != c)) continue;
    /* a flip at the top of a 16-bit format: its largest finite value and inf */
    double top = dt == DUET_F16 ? 65504 : 0x1.fep127;
    if (ls_is16(dt) && b->flips > 0 && isinf(e) != isinf(c) && (isinf(e) ? fabs(c) : fabs(e)) == top &&
        (e > 0) == (c > 0))
      continue;
    /* an exact product (ref64) beyond a 16-bit format's range, or within
     * the bound of it: rounding overflows to the infinity of its sign */
    if (ref64 && ls_is16(dt) && isinf(e) && isfinite(c) && (e > 0) == (c > 0) &&
        fabs(c) + b->noise * (b->mag ? b->mag[lo + i] : b->scale) >= (dt == DUET_F16 ? 65520 : 0x1.ffp127))
      continue;
    if (dt != DUET_I32 && isfinite(e) && isfinite(c) && (!b->mag || b->mag[lo + i] > 0)) {
      bound = (ls_is16(dt) ? b->flips * ulp16(fmax(fabs(e), fabs(c)), dt) : 0) +
              b->noise * (b->mag ? b->mag[lo + i] : b->scale);
      double used = bound > 0 ? diff / bound : INFINITY;
      bool gemm = !strncmp(what, "GEMM", 4);
      if (used > (gemm ? L->st.worst_gemm : L->st.worst)) {
        *(gemm ? &L->st.worst_gemm : &L->st.worst) = used;
        snprintf(gemm ? L->st.worst_gemm_what : L->st.worst_what, sizeof L->st.worst_what, "%s, %s", what, name);
      }
      if (diff <= bound) continue;
    }
    if (L->st.fails < 8)
      fprintf(stderr, "FAIL %s: %s from the same inputs: %s[%lld]: device %.9g, CPU %.9g (bound %.3g)\n", L->what,
              what, name, (long long)(lo + i), e, c, bound);
    bad = 1;
  }
  free(dev);
  L->st.fails += bad;
  return 0;
}

const char *kernel_kind_name(KernelKind k) {
  static const char *const names[] = {
      [KK_ELEMENTWISE] = "elementwise", [KK_REDUCE] = "reduce", [KK_MAX_GRAD] = "max_grad",
      [KK_XENT_FWD] = "xent_fwd", [KK_XENT_BWD] = "xent_bwd", [KK_EVAL_METRICS] = "eval_metrics",
      [KK_EMBED_FWD] = "embed_fwd", [KK_EMBED_BWD] = "embed_bwd", [KK_NORM_FWD] = "norm_fwd",
      [KK_NORM_BWD] = "norm_bwd", [KK_ATTN_FWD] = "attn_fwd", [KK_ATTN_BWD] = "attn_bwd",
      [KK_TRANSPOSE] = "transpose", [KK_POSITIONS] = "positions", [KK_IM2COL] = "im2col", [KK_COL2IM] = "col2im",
      [KK_MAXPOOL] = "maxpool", [KK_MAXPOOL_GRAD] = "maxpool_grad", [KK_AVGPOOL] = "avgpool",
      [KK_AVGPOOL_GRAD] = "avgpool_grad", [KK_ATTN_DECODE] = "attn_decode", [KK_UNSCALE] = "unscale",
      [KK_ATTN_BWD_KV] = "attn_bwd_kv", [KK_SOFTMAX] = "softmax", [KK_SOFTMAX_BWD] = "softmax_bwd",
      [KK_RMSNORM_FWD] = "rmsnorm_fwd", [KK_RMSNORM_BWD] = "rmsnorm_bwd", [KK_ROPE] = "rope", [KK_MSE] = "mse", [KK_GEMM_I8] = "gemm_i8",
      [KK_SUMSQ] = "sumsq", [KK_CLIP_SCALE] = "clip_scale",
      [KK_ADAMW8] = "adamw8"};
  return k >= 0 && k < (int)(sizeof names / sizeof *names) && names[k] ? names[k] : "?";
}

/* The largest finite magnitude of a tensor's n elements of dtype dt. */
static double ls_maxabs(const void *x, int64_t n, int dt) {
  double m = 0;
  for (int64_t i = 0; x && dt != DUET_I32 && i < n; i++) {
    double v = fabs(load_elem(x, i, dt));
    if (v > m && isfinite(v)) m = v;
  }
  return m;
}

static int64_t ls_numel(const DuetProgram *p, int id) { return p->tensors[id].nbytes / ls_size(p->tensors[id].dtype); }

/* Element e's index in buffer kb (codegen.h's KIndexTerm). */
static int64_t ls_index(const KBuf *kb, int64_t e) {
  int64_t ix = kb->base;
  for (int t = 0; t < kb->n_terms; t++) {
    const KIndexTerm *x = &kb->terms[t];
    int64_t v = e / x->div;
    ix += (x->mod ? v % x->mod : v) * x->mul;
  }
  return ix;
}

/* An elementwise kernel's running error bound, element by element: its
 * instructions evaluated in double on the inputs, each with E such that
 * one evaluation in the kernel's arithmetic (unit roundoff u) is within
 * u E of the exact value, to first order: E = 0 for loads, constants and
 * scalars (both backends read the same), + |result| for each rounding,
 * E_a + E_b for a sum, |b| E_a + |a| E_b for a product, E_a / |b| +
 * |a| E_b / b^2 for a quotient, E_a / (2 sqrt a) for a square root; tanh
 * (gelu) within 8 ulps of its result plus its argument's rounding; a cast
 * to 16 bits, once E > 0, may land one ulp away (E + ulp16 / u).  Two
 * evaluations then differ by at most 2 u E, and a 16-bit store by one ulp
 * more when E > 0; E = 0 means the same operations on the same values:
 * the same bits.  mag[t][e] receives 2 E of element e of output tensor
 * outs[t] (0 elsewhere).  Returns 0, or -1 when out of memory. */
static int ls_elementwise(const Lockstep *L, const Kernel *K, const int *outs, int n_out, const double *s, double u,
                          double **mag) {
  const DuetProgram *p = &L->t->cp->prog;
  double *y = malloc((size_t)K->n_ins * 2 * sizeof *y + 1), *E = y + K->n_ins;
  for (int o = 0; o < n_out; o++) mag[o] = calloc((size_t)ls_numel(p, outs[o]) + 1, sizeof **mag);
  for (int o = 0; o < n_out; o++)
    if (!mag[o]) y = (free(y), NULL);
  if (!y) return -1;
  const double c = 0.7978845608028654, a3 = 0.044715;
  for (int64_t e = 0; e < K->n; e++)
    for (int i = 0; i < K->n_ins; i++) {
      const KInstr *x = &K->ins[i];
      int nop = kop_operands(x->op); /* instruction operands (a dropout's b is its site) */
      double A = nop >= 1 ? y[x->a] : 0, EA = nop >= 1 ? E[x->a] : 0, B = 0, EB = 0;
      if (nop >= 2) B = y[x->b], EB = E[x->b];
      double v = 0, ev = 0;
      switch (x->op) {
      case KI_LOAD: {
        const KBuf *kb = &K->bufs[x->a];
        v = load_elem(L->th[kb->tensor], ls_index(kb, e), p->tensors[kb->tensor].dtype);
        break;
      }
      case KI_CONST: v = K->dtype == DT_F64 ? x->value : (float)x->value; break;
      case KI_SCALAR: v = K->dtype == DT_F64 ? s[x->a] : (float)s[x->a]; break;
      case KI_ADD: v = A + B, ev = EA + EB + fabs(v); break;
      case KI_SUB: v = A - B, ev = EA + EB + fabs(v); break;
      case KI_MUL: v = A * B, ev = fabs(B) * EA + fabs(A) * EB + fabs(v); break;
      case KI_DEQUANTIZE: v = A * B, ev = fabs(B) * EA + fabs(A) * EB + fabs(v); break; /* int8 x scale */
      case KI_DIV:
        v = A / B;
        ev = B != 0 ? EA / fabs(B) + fabs(A) * EB / (B * B) + fabs(v) : EA + EB > 0 ? INFINITY : 0;
        break;
      case KI_NEG: v = -A, ev = EA; break;
      case KI_RELU: v = A < 0 ? 0 : A, ev = EA; break;
      case KI_RELU_GRAD: /* x > 0 ? dy : 0: x within its error of 0 may take either branch */
        v = B > 0 ? A : 0, ev = EA + (EB > 0 && fabs(B) <= u * EB ? fabs(A) / u : 0);
        break;
      case KI_SQRT:
        v = sqrt(A);
        ev = (A > 0 ? EA / (2 * v) : sqrt(EA / u)) + fabs(v);
        break;
      case KI_GELU: {
        double t = c * (A + a3 * A * A * A), th = tanh(t);
        v = 0.5 * A * (1 + th);
        ev = 1.2 * EA + 0.5 * fabs(A) * (8 + 5 * c * (fabs(A) + a3 * fabs(A * A * A))) + 3 * fabs(v);
        break;
      }
      case KI_GELU_GRAD: { /* dy (A) times phi(x (B)) */
        double t = c * (B + a3 * B * B * B), th = tanh(t), q = c * (1 + 3 * a3 * B * B);
        double phi = 0.5 * (1 + th) + 0.5 * B * (1 - th * th) * q;
        double dth = 8 + 5 * c * (fabs(B) + a3 * fabs(B * B * B)); /* tanh's error, in units of u */
        v = A * phi;
        ev = fabs(phi) * EA + 0.8 * fabs(A) * EB +
             fabs(A) * (dth * (0.5 + fabs(B) * fabs(th) * q) + 10 * (0.5 * (1 + fabs(th)) + 0.5 * fabs(B) * q)) +
             fabs(v);
        break;
      }
      /* exp, log, tanh: each library within 4 ulps (8 |v| in units of u),
       * plus the argument's error through the derivative */
      case KI_EXP: v = exp(A), ev = fabs(v) * (EA + 8); break;
      case KI_LOG: v = log(A), ev = (A != 0 ? EA / fabs(A) : EA > 0 ? INFINITY : 0) + 8 * fabs(v); break;
      case KI_TANH: v = tanh(A), ev = (1 - v * v) * EA + 8 * fabs(v); break;
      case KI_TANH_GRAD: /* dy (A) (1 - y^2), y (B): three roundings */
        v = A * (1 - B * B);
        ev = fabs(1 - B * B) * EA + 2 * fabs(A * B) * EB + fabs(A) * (B * B + fabs(1 - B * B)) + fabs(v);
        break;
      case KI_SIGMOID: { /* e = exp(-|x|) (8), 1 + e, the quotient: 10 relative */
        double e = exp(-fabs(A));
        v = (A >= 0 ? 1 : e) / (1 + e), ev = v * (1 - v) * EA + 10 * v;
        break;
      }
      case KI_SIGMOID_GRAD: { /* dy (A) y (1 - y), y (B) */
        double q = B * (1 - B);
        v = A * q, ev = fabs(q) * EA + fabs(A) * fabs(1 - 2 * B) * EB + fabs(A) * (fabs(B * (1 - B)) + fabs(q)) + fabs(v);
        break;
      }
      case KI_SILU: { /* x s(x): s's 10 relative, the product */
        double e = exp(-fabs(A)), sg = (A >= 0 ? 1 : e) / (1 + e);
        v = A * sg, ev = fabs(sg + A * sg * (1 - sg)) * EA + 11 * fabs(v);
        break;
      }
      case KI_SILU_GRAD: { /* dy (A) s (1 + x (1 - s)), x (B): s's 10 relative, five roundings of at most |s| (1 + |x|) */
        double e = exp(-fabs(B)), sg = (B >= 0 ? 1 : e) / (1 + e), phi = sg * (1 + B * (1 - sg));
        double dphi = sg * (1 - sg) * (2 + B * (1 - 2 * sg));
        v = A * phi, ev = fabs(phi) * EA + fabs(A * dphi) * EB + 30 * fabs(A) * sg * (1 + fabs(B)) + fabs(v);
        break;
      }
      case KI_DROPOUT: /* at most x / (1 - p), or 0, or x (evaluation) */
        v = A / (1 - x->value), ev = EA / (1 - x->value) + fabs(v);
        break;
      case KI_FAKE_QUANT: { /* w (A) to int8 and back, B its channel's max |w|: exact from the same inputs; an
                             * error in them may move w by a quantization step s = B / 127 */
        double s = B / 127 > 0x1p-126 ? B / 127 : 0x1p-126, q = nearbyint(A / s);
        v = (q > 127 ? 127 : q < -127 ? -127 : q) * s;
        ev = fabs(v) + (EA + EB > 0 ? EA + 127 * EB + s / u : 0);
        break;
      }
      case KI_CAST:
        v = A, ev = EA;
        if (ls_is16((int)x->value) && EA > 0) ev += ulp16(A, (int)x->value) / u;
        break;
      case KI_STORE: {
        const KBuf *kb = &K->bufs[x->a];
        for (int o = 0; o < n_out; o++)
          if (outs[o] == kb->tensor) mag[o][ls_index(kb, e)] = 2 * E[x->b];
        break;
      }
      default: break;
      }
      y[i] = v, E[i] = ev;
    }
  free(y);
  return 0;
}

static int ls_launch(DuetDevice *d, int k, void *const *t, const double *s) {
  Lockstep *L = ls_of(d);
  const DuetProgram *p = &L->t->cp->prog;
  const Kernel *K = &L->t->cp->kernels[k];
  if (ls_snapshot(L, t)) return -1;
  L->dt = t;
  L->st.kernels++;
  char what[96];
  snprintf(what, sizeof what, "kernel %d (%s)", k, kernel_kind_name(K->kind));
  /* what it writes: the stored buffers (elementwise), else the last one */
  int outs[KMAX_BUFS], n_out = 0;
  if (K->kind == KK_ELEMENTWISE) {
    for (int i = 0; i < K->n_ins; i++) {
      if (K->ins[i].op != KI_STORE) continue;
      int id = K->bufs[K->ins[i].a].tensor, seen = 0;
      for (int j = 0; j < n_out; j++) seen |= outs[j] == id;
      if (!seen) outs[n_out++] = id;
    }
  } else if (K->kind == KK_ADAMW8) { /* p, both moments' codes and scales: bit for bit (exact, below) */
    static const int w[5] = {0, 2, 3, 4, 5};
    for (int i = 0; i < 5; i++) outs[n_out++] = K->bufs[w[i]].tensor;
  } else {
    outs[n_out++] = K->bufs[K->n_bufs - 1].tensor;
  }
  /* Bounds, from the inputs before anything writes the copy: per output,
   * |dev - cpu| <= flips ulp16 + noise x max(mo x rel, abs) or
   * noise x mag[e], mo its largest |cpu| */
  double u = K->dtype == DT_F64 ? 0x1p-53 : 0x1p-24;
  double mx[KMAX_BUFS] = {0}; /* each buffer's largest |x| */
  double m_in = 0;
  for (int i = 0; i < K->n_bufs; i++) {
    int id = K->bufs[i].tensor;
    mx[i] = ls_maxabs(L->th[id], ls_numel(p, id), p->tensors[id].dtype);
    if (i < K->n_bufs - 1 || K->kind == KK_ELEMENTWISE) m_in = fmax(m_in, mx[i]);
  }
  double *mag[KMAX_BUFS] = {0};
  int64_t n_sum = 0; /* the longest sum of one element */
  double rel = 1, abs_s = m_in, attn_s[3] = {0}; /* attention's backward: dq, dk, dv */
  bool exact = false;
  int rc = 0;
  switch (K->kind) {
  case KK_ELEMENTWISE: rc = ls_elementwise(L, K, outs, n_out, s, u, mag); break;
  case KK_REDUCE:
    if (K->reduce_max) {
      exact = true;
      break;
    }
    n_sum = K->red;
    if ((mag[0] = calloc((size_t)(K->outer * K->inner) + 1, sizeof **mag))) {
      const void *x = L->th[K->bufs[0].tensor];
      int xdt = p->tensors[K->bufs[0].tensor].dtype;
      for (int64_t a = 0; a < K->outer; a++) /* |scale| sum_r |x[a, r, j]| */
        for (int64_t r = 0; r < K->red; r++)
          for (int64_t j = 0; j < K->inner; j++)
            mag[0][a * K->inner + j] += fabs(K->scale) * fabs(load_elem(x, (a * K->red + r) * K->inner + j, xdt));
    }
    break;
  case KK_EMBED_BWD: /* out[v, c] = sum of dy[r, c] over the rows r whose id is v */
    n_sum = K->rows;
    if ((mag[0] = calloc((size_t)ls_numel(p, outs[0]) + 1, sizeof **mag))) {
      const void *dy = L->th[K->bufs[0].tensor];
      const int32_t *ix = L->th[K->bufs[1].tensor];
      int64_t V = ls_numel(p, outs[0]) / K->cols;
      for (int64_t r = 0; r < K->rows; r++)
        for (int64_t c = 0; ix[r] >= 0 && ix[r] < V && c < K->cols; c++)
          mag[0][ix[r] * K->cols + c] += fabs(load_elem(dy, r * K->cols + c, p->tensors[K->bufs[0].tensor].dtype));
    }
    break;
  case KK_NORM_FWD: case KK_NORM_BWD: { /* per row: rstd (|x| + |mean|), times the row's spread */
    bool fwd = K->kind == KK_NORM_FWD;
    int xb = fwd ? 0 : 1, xdt = p->tensors[K->bufs[xb].tensor].dtype;
    const void *x = L->th[K->bufs[xb].tensor], *dy = fwd ? NULL : L->th[K->bufs[0].tensor];
    n_sum = K->cols;
    if (!(mag[0] = calloc((size_t)ls_numel(p, outs[0]) + 1, sizeof **mag))) break;
    for (int64_t r = 0; r < K->rows; r++) {
      double mean = 0, var = 0, mxr = 0, mdy = 0;
      for (int64_t c = 0; c < K->cols; c++) mean += load_elem(x, r * K->cols + c, xdt);
      mean /= (double)K->cols;
      for (int64_t c = 0; c < K->cols; c++) {
        double v = load_elem(x, r * K->cols + c, xdt);
        var += (v - mean) * (v - mean), mxr = fmax(mxr, fabs(v));
        if (dy) mdy = fmax(mdy, fabs(load_elem(dy, r * K->cols + c, p->tensors[K->bufs[0].tensor].dtype)));
      }
      double rstd = 1 / sqrt(var / (double)K->cols + K->eps), xh = rstd * (mxr + fabs(mean));
      double S = fwd ? xh * (1 + xh) : rstd * mdy * (1 + xh) * (1 + xh) * (1 + xh);
      for (int64_t c = 0; c < K->cols; c++) mag[0][r * K->cols + c] = S;
    }
    break;
  }
  case KK_SOFTMAX: /* exp(x - max) carries the rounding of x - max as a relative error (as xent) */
    n_sum = K->red, rel = 1 + 2 * mx[0], abs_s = 0;
    break;
  case KK_SOFTMAX_BWD: /* y (dy - sum dy y): terms up to max |y| max |dy| */
    n_sum = K->red, abs_s = 2 * mx[0] * mx[1];
    break;
  case KK_RMSNORM_FWD: case KK_RMSNORM_BWD: { /* per row: y = x rs; dx = rs (dy - x rs^2 mean(dy x)) */
    bool fwd = K->kind == KK_RMSNORM_FWD;
    int xb = fwd ? 0 : 1, xdt = p->tensors[K->bufs[xb].tensor].dtype;
    const void *x = L->th[K->bufs[xb].tensor], *dy = fwd ? NULL : L->th[K->bufs[0].tensor];
    n_sum = K->cols;
    if (!(mag[0] = calloc((size_t)ls_numel(p, outs[0]) + 1, sizeof **mag))) break;
    for (int64_t r = 0; r < K->rows; r++) {
      double ss = 0, mxr = 0, mdy = 0;
      for (int64_t c = 0; c < K->cols; c++) {
        double v = load_elem(x, r * K->cols + c, xdt);
        ss += v * v, mxr = fmax(mxr, fabs(v));
        if (dy) mdy = fmax(mdy, fabs(load_elem(dy, r * K->cols + c, p->tensors[K->bufs[0].tensor].dtype)));
      }
      double rs = 1 / sqrt(ss / (double)K->cols + K->eps), xh = rs * mxr;
      double S = fwd ? xh * 2 : rs * mdy * (1 + xh) * (1 + xh) * 2;
      for (int64_t c = 0; c < K->cols; c++) mag[0][r * K->cols + c] = S;
    }
    break;
  }
  case KK_ROPE: /* x0 cos - x1 sin: cos and sin rounded once, two products and a sum */
    n_sum = 4, abs_s = mx[0];
    break;
  case KK_MSE: /* scale sum (p - t)^2: terms of one sign */
    n_sum = K->n;
    if ((mag[0] = calloc(2, sizeof **mag))) {
      const void *a = L->th[K->bufs[0].tensor], *c = L->th[K->bufs[1].tensor];
      int adt = p->tensors[K->bufs[0].tensor].dtype, cdt = p->tensors[K->bufs[1].tensor].dtype;
      for (int64_t i = 0; i < K->n; i++) {
        double d = load_elem(a, i, adt) - load_elem(c, i, cdt);
        mag[0][0] += K->scale * d * d;
      }
    }
    break;
  case KK_XENT_FWD: case KK_EVAL_METRICS: n_sum = K->rows + K->cols; break;
  case KK_XENT_BWD: /* exp(z - max) carries the rounding of z - max as a relative error */
    n_sum = K->cols, rel = 1 + 2 * mx[0], abs_s = 0;
    break;
  case KK_ATTN_FWD: case KK_ATTN_BWD: case KK_ATTN_BWD_KV: case KK_ATTN_DECODE: {
    /* out_i = sum_j p_ij v_j with sum_j p_ij = 1: terms up to max |v|;
     * the backward's dq_i = scale sum_j p_ij (dp_ij - D_i) k_j, dp_ij =
     * dy_i . v_j: up to 2 P max |k| scale (P = max |dp|), dk_j (the same
     * with q, over at most `time` queries), dv_j = sum_i p_ij dy_i; the
     * scores' rounding, about D u |s| (sigma = max |s| over the pairs the
     * mask keeps), reaches the weights p as a relative error through exp:
     * S = terms x (1 + sigma) */
    bool fwd = K->kind == KK_ATTN_FWD || K->kind == KK_ATTN_DECODE;
    int64_t D = K->heads > 0 ? K->cols / K->heads : K->cols, T = K->time, C = K->cols;
    int64_t KV = K->kv_heads > 0 ? K->kv_heads : K->heads, RP = K->heads / KV, Ckv = KV * D; /* grouped-query */
    const int qb = fwd ? 0 : 1;
    double mq = mx[qb], mk = mx[qb + 1], mv = mx[qb + 2], sc = 1 / sqrt((double)D), sigma = 0, P = 0;
    if (K->kind == KK_ATTN_DECODE) {
      sigma = mq * fmax(mk, mx[3]) * sqrt((double)D), mv = fmax(mv, mx[4]);
    } else {
      const void *q = L->th[K->bufs[qb].tensor], *kk = L->th[K->bufs[qb + 1].tensor];
      const void *v = L->th[K->bufs[qb + 2].tensor];
      const void *dy = fwd ? NULL : L->th[K->bufs[0].tensor];
      int qt = p->tensors[K->bufs[qb].tensor].dtype, kt = p->tensors[K->bufs[qb + 1].tensor].dtype;
      int vt = p->tensors[K->bufs[qb + 2].tensor].dtype, dt = fwd ? 0 : p->tensors[K->bufs[0].tensor].dtype;
      for (int64_t bh = 0; bh < K->batch * K->heads; bh++) {
        int64_t b = bh / K->heads, h = bh % K->heads;
        for (int64_t i = 0; i < T; i++)
          for (int64_t j = 0; j < (K->causal ? i + 1 : T); j++) {
            double sij = 0, dp = 0;
            for (int64_t e = 0; e < D; e++) {
              int64_t qi = (b * T + i) * C + h * D + e, kj = (b * T + j) * Ckv + h / RP * D + e;
              sij += load_elem(q, qi, qt) * load_elem(kk, kj, kt);
              if (dy) dp += load_elem(dy, qi, dt) * load_elem(v, kj, vt);
            }
            sigma = fmax(sigma, fabs(sij) * sc), P = fmax(P, fabs(dp));
          }
      }
    }
    n_sum = T + D, rel = 1;
    if (fwd) abs_s = mv * (1 + sigma);
    else {
      attn_s[0] = 2 * P * mk * sc * (1 + sigma);
      attn_s[1] = 2 * P * mq * sc * (double)(T * RP) * (1 + sigma); /* dk, dv: over a group's query heads too */
      attn_s[2] = mx[0] * (double)(T * RP) * (1 + sigma);
      abs_s = attn_s[0];
    }
    break;
  }
  case KK_COL2IM: case KK_AVGPOOL: case KK_AVGPOOL_GRAD: case KK_MAXPOOL_GRAD: /* windows that overlap add up */
    n_sum = K->win[0] * K->win[1];
    break;
  default: exact = true; break; /* data movement: gather, transpose, im2col, max, positions, unscale; and
                                 * adamw8, whose CUDA arithmetic is the C kernel's operation by operation */
  }
  if (rc) {
    snprintf(d->err, sizeof d->err, "lockstep: out of host memory");
    return -1;
  }
  if (L->inner->ops->launch(L->inner, k, t, s) || L->inner->ops->sync(L->inner)) {
    for (int o = 0; o < n_out; o++) free(mag[o]);
    return ls_fail_inner(L);
  }
  L->t->jit.fns[k](L->th, s); /* the C kernel, on the copy of the same memory */
  for (int o = 0; o < n_out && !rc; o++) {
    int id = outs[o], dt = p->tensors[id].dtype;
    int64_t n = ls_numel(p, id), lo = 0;
    double mo = ls_maxabs(L->th[id], n, dt);
    LsBound b = {.flips = exact ? 0 : 1, .noise = exact ? 0 : 2 * (double)(n_sum + 4) * u,
                 .scale = fmax(mo * rel, abs_s), .mag = mag[o]};
    if (K->kind == KK_ELEMENTWISE) b.noise = u; /* mag: 2 E, and 0: bit for bit */
    int64_t KV = K->kv_heads > 0 ? K->kv_heads : K->heads;
    if ((K->kind == KK_ATTN_BWD || K->kind == KK_ATTN_BWD_KV) && KV < K->heads) {
      /* grouped-query: out [B, T, W] packs dq [0, C), dk [C, C + Ckv), dv
       * [C + Ckv, W) along each row: the backward writes dq (on a GPU),
       * the key-row kernel after it dk and dv */
      int64_t C = K->cols, Ckv = C / K->heads * KV, W = C + 2 * Ckv, rows = K->batch * K->time, es = ls_size(dt);
      if (K->kind == KK_ATTN_BWD) {
        free(L->attn_ref);
        L->attn_ref = malloc((size_t)(n * es) + 1);
        L->attn_ref_tensor = L->attn_ref ? id : -1;
        if (L->attn_ref) memcpy(L->attn_ref, L->th[id], (size_t)(n * es));
      } else if (L->attn_ref_tensor != id) {
        snprintf(d->err, sizeof d->err, "lockstep: %s without the attention backward before it", what);
        rc = -1;
        break;
      }
      const char *ref = K->kind == KK_ATTN_BWD ? L->th[id] : L->attn_ref;
      int64_t c0[3] = {0, C, C + Ckv}, c1[3] = {C, C + Ckv, W};
      for (int part = K->kind == KK_ATTN_BWD ? 0 : 1; part < (K->kind == KK_ATTN_BWD ? 1 : 3) && !rc; part++) {
        double m = 0; /* the part's largest |ref| */
        for (int64_t r = 0; r < rows; r++) m = fmax(m, ls_maxabs(ref + (r * W + c0[part]) * es, c1[part] - c0[part], dt));
        b.scale = fmax(m, part == 0 ? abs_s : attn_s[part]);
        for (int64_t r = 0; r < rows && !rc; r++)
          rc = ls_compare(L, what, id, r * W + c0[part], c1[part] - c0[part], dt, ref + (r * W + c0[part]) * es, false, &b);
      }
      continue;
    }
    if (K->kind == KK_ATTN_BWD || K->kind == KK_ATTN_BWD_KV) { /* out [3, ...]: dq, then dk and dv */
      int64_t third = n / 3, es = ls_size(dt);
      if (K->kind == KK_ATTN_BWD) {
        free(L->attn_ref);
        L->attn_ref = malloc((size_t)((n - third) * es) + 1);
        L->attn_ref_tensor = L->attn_ref ? id : -1;
        if (L->attn_ref) memcpy(L->attn_ref, (char *)L->th[id] + third * es, (size_t)((n - third) * es));
        n = third;
        b.scale = fmax(ls_maxabs(L->th[id], n, dt), abs_s);
      } else if (L->attn_ref_tensor != id) {
        snprintf(d->err, sizeof d->err, "lockstep: %s without the attention backward before it", what);
        rc = -1;
        break;
      } else {
        lo = third, n -= third;
      }
    }
    if (K->kind == KK_ATTN_BWD_KV) { /* dk, then dv */
      int64_t third = n / 2, es = ls_size(dt);
      b.scale = fmax(ls_maxabs(L->attn_ref, third, dt), attn_s[1]);
      rc = ls_compare(L, what, id, lo, third, dt, L->attn_ref, false, &b);
      b.scale = fmax(ls_maxabs(L->attn_ref + third * es, third, dt), attn_s[2]);
      if (!rc) rc = ls_compare(L, what, id, lo + third, third, dt, L->attn_ref + third * es, false, &b);
      continue;
    }
    rc = ls_compare(L, what, id, lo, n, dt, (const char *)L->th[id] + lo * ls_size(dt), false, &b);
  }
  for (int o = 0; o < n_out; o++) free(mag[o]);
  if (!rc && K->kind == KK_SUMSQ) {
    /* the sum of squares (a double in the flags buffer): both sum the same
     * exact squares in double in different orders, each within
     * gamma_{n-1} of the exact sum of these positive terms (Higham 4.2) */
    const double *ref = (const double *)((const int32_t *)L->th[p->n_tensors] + K->slot);
    LsBound b = {.noise = 2 * (double)(K->n + 1) * 0x1p-53, .scale = fabs(*ref)};
    rc = ls_compare(L, what, p->n_tensors, K->slot / 2, 1, DUET_F64, ref, false, &b);
  }
  if (!rc && K->kind == KK_UNSCALE) { /* the overflow flag */
    LsBound b = {0};
    rc = ls_compare(L, what, p->n_tensors, K->slot, 1, DUET_I32, (int32_t *)L->th[p->n_tensors] + K->slot, false, &b);
  }
  return rc;
}

/* A GEMM against the exact product (in f64, with the magnitudes
 * sum_k |a||b| of every element's terms): one evaluation with f32 (or the
 * 16-bit format's, --gemm-accumulate fp16) accumulation errs by at most
 * gamma_k of them, plus the rounding of the result (half an ulp of a
 * 16-bit result). */
static int ls_gemm(DuetDevice *d, const DuetStep *st, void *const *t) {
  Lockstep *L = ls_of(d);
  const DuetProgram *p = &L->t->cp->prog;
  if (ls_snapshot(L, t)) return -1;
  if (L->inner->ops->gemm(L->inner, st, t) || L->inner->ops->sync(L->inner)) return ls_fail_inner(L);
  L->dt = t;
  L->st.gemms++;
  int64_t m = st->m, n = st->n, kk = st->k;
  double *ref = malloc((size_t)(m * n) * 2 * sizeof *ref + 1);
  if (!ref) {
    snprintf(d->err, sizeof d->err, "lockstep: out of host memory");
    return -1;
  }
  double *mag = ref + m * n;
  const void *A = L->th[st->a], *B = L->th[st->b];
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double acc = 0, am = 0;
      for (int64_t q = 0; q < kk; q++) {
        double a = load_elem(A, st->ta ? q * m + i : i * kk + q, st->dtype);
        double b = load_elem(B, st->tb ? j * kk + q : q * n + j, st->dtype);
        acc += a * b, am += fabs(a * b);
      }
      ref[i * n + j] = acc, mag[i * n + j] = am;
    }
  double u = st->dtype == DUET_F64 ? 0x1p-53 : p->gemm_accumulate_f16 && ls_is16(st->dtype) ? 0x1p-11 : 0x1p-24;
  /* 2 (k + 2) u: a GPU's tensor cores may accumulate by truncation, up
   * to 2 u per addition */
  LsBound b = {.flips = 0.5, .noise = 2 * (double)(kk + 2) * u, .mag = mag};
  char what[96];
  snprintf(what, sizeof what, "GEMM %lldx%lldx%lld", (long long)m, (long long)n, (long long)kk);
  int rc = ls_compare(L, what, st->c, 0, m * n, st->dtype, ref, true, &b);
  free(ref);
  return rc;
}

DuetDevice *lockstep_device(DuetDevice *inner, const TModel *t, const char *what) {
  Lockstep *L = calloc(1, sizeof *L);
  if (!L || !(L->th = calloc((size_t)t->cp->prog.n_tensors + 1, sizeof *L->th))) {
    free(L);
    return NULL;
  }
  L->inner = inner;
  L->t = t;
  L->what = what;
  L->attn_ref_tensor = -1;
  const DuetDeviceOps *io = inner->ops;
  L->ops = (DuetDeviceOps){.api_version = io->api_version, .name = io->name, .alloc = ls_alloc, .free = ls_free,
                           .copy_to_device = ls_to_device, .copy_to_host = ls_to_host, .launch = ls_launch,
                           .gemm = ls_gemm, .sync = ls_sync, .destroy = ls_destroy,
                           .host_alloc = io->host_alloc ? ls_host_alloc : NULL,
                           .host_free = io->host_alloc ? ls_host_free : NULL};
  L->self.ops = &L->ops;
  L->self.ctx = L;
  return &L->self;
}

const LockstepStats *lockstep_stats(const DuetDevice *d) { return &((const Lockstep *)d)->st; }

void lockstep_print(const char *what, const LockstepStats *ls, const CompareStats *cs) {
  printf("  %s: every tensor at the end of each run", what);
  if (cs->tol_max > 0) printf(" (tolerances %.3g to %.3g of its largest |cpu|)", cs->tol_min, cs->tol_max);
  if (cs->worst > 0) printf(": worst %.3g of its tolerance (%s)\n", cs->worst, cs->worst_tensor);
  else printf(": bit-identical\n");
  printf("  %s: %lld kernel launches alone: ", what, ls->kernels);
  if (ls->worst > 0) printf("worst %.3g of the bound (%s)", ls->worst, ls->worst_what);
  else printf("bit-identical");
  printf("; %lld GEMMs: ", ls->gemms);
  if (ls->worst_gemm > 0) printf("worst %.3g of the bound (%s)\n", ls->worst_gemm, ls->worst_gemm_what);
  else printf("exact\n");
}
