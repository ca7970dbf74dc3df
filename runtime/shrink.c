/* runtime/shrink.c: loading a checkpoint into a shrunk program
 * (passes/shrink.c, --shrink): the checkpoint holds the full-size weights
 * of a channels-pruned run (the pruned channels zero) and their masks;
 * the program's params are shorter along the axes of DuetProgram.shrink,
 * and get the kept channels (or the rows of the inputs they feed). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "duet_rt.h"

struct DuetShrinkKept {
  int n_tensors;
  int64_t **kept; /* per tensor id (a source): its kept output channels, in order; NULL for others */
  double **delta; /* per tensor id (a next layer's bias, rank 1): added to its full values; NULL for others */
};

/* Element e of y (f32 or f64) as a double. */
static double elem(const DuetStTensor *y, int64_t e) {
  if (y->dtype == DUET_F64) {
    double d;
    memcpy(&d, (const unsigned char *)y->data + 8 * e, 8);
    return d;
  }
  float f;
  memcpy(&f, (const unsigned char *)y->data + 4 * e, 4);
  return f;
}

/* acts (ops.def names, in order) applied to x, in the formulas of the
 * generated kernels (codegen/emit_c.c); 0 with *bad set for an unknown one. */
static double apply_acts(const char *acts, double x, int *bad) {
  char name[32];
  for (const char *p = acts; *p;) {
    int n = 0;
    while (*p == ' ') p++;
    while (*p && *p != ' ' && n < 31) name[n++] = *p++;
    name[n] = 0;
    if (!n) break;
    if (!strcmp(name, "relu")) x = x > 0 ? x : 0;
    else if (!strcmp(name, "neg")) x = -x;
    else if (!strcmp(name, "tanh")) x = tanh(x);
    else if (!strcmp(name, "sigmoid")) x = 1 / (1 + exp(-x));
    else if (!strcmp(name, "silu")) x = x / (1 + exp(-x));
    else if (!strcmp(name, "gelu")) x = 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    else *bad = 1;
  }
  return x;
}

int duet_shrink_full_shape(const DuetProgram *p, int i, int64_t *full) {
  int hit = 0;
  for (int r = 0; r < p->tensors[i].rank; r++) full[r] = p->tensors[i].shape[r];
  for (int k = 0; p->shrink && k < p->shrink->n; k++) {
    const DuetShrinkAxis *x = &p->shrink->axes[k];
    if (x->param != i || x->axis >= p->tensors[i].rank) continue;
    full[x->axis] = x->full;
    hit = 1;
  }
  return hit;
}

/* The entry of source s's own output axis. */
static const DuetShrinkAxis *own_axis(const DuetProgram *p, int s) {
  for (int k = 0; k < p->shrink->n; k++)
    if (p->shrink->axes[k].param == s && p->shrink->axes[k].source == s) return &p->shrink->axes[k];
  return NULL;
}

/* Whether element e of tensor y (dtype f32 or f64; others: its bytes) is not 0. */
static int nonzero(const DuetStTensor *y, int64_t e, int64_t size) {
  const unsigned char *b = (const unsigned char *)y->data + e * size;
  if (y->dtype == DUET_F32) {
    float f;
    memcpy(&f, b, 4);
    return f != 0;
  }
  if (y->dtype == DUET_F64) {
    double d;
    memcpy(&d, b, 8);
    return d != 0;
  }
  for (int64_t j = 0; j < size; j++)
    if (b[j] && !(j == size - 1 && b[j] == 0x80)) return 1; /* +-0 of 16-bit floats */
  return 0;
}

void duet_shrink_kept_free(DuetShrinkKept *k) {
  if (!k) return;
  for (int i = 0; k->kept && i < k->n_tensors; i++) free(k->kept[i]);
  for (int i = 0; k->delta && i < k->n_tensors; i++) free(k->delta[i]);
  free(k->kept);
  free(k->delta);
  free(k);
}

int duet_shrink_touches(const DuetProgram *p, const DuetShrinkKept *k, int i) {
  int64_t full[DUET_MAX_RANK];
  return p->shrink && (duet_shrink_full_shape(p, i, full) || (k && k->delta[i]));
}

/* The removed channels of source s (kept[0..K) of C kept) feed the next
 * layer constants: folded into its bias (k->delta), or refused.  0, or -1
 * with the message. */
static int fold_removed(const DuetProgram *p, DuetShrinkKept *k, const DuetStFile *f, const char *path, int s,
                        int64_t C, int64_t K, char *err, size_t errlen) {
  const DuetShrinkAxis *bias = NULL, *next = NULL;
  for (int j = 0; j < p->shrink->n; j++) {
    const DuetShrinkAxis *x = &p->shrink->axes[j];
    if (x->source == s && x->kind == DUET_SHRINK_BIAS) bias = x;
    if (x->source == s && x->kind == DUET_SHRINK_NEXT) next = x;
  }
  if (!next) return 0;
  const char *sname = p->tensors[s].name;
  const DuetStTensor *yb = bias ? duet_st_find(f, p->tensors[bias->param].name) : NULL;
  if (bias && (!yb || yb->rank != 1 || yb->shape[0] != C || (yb->dtype != DUET_F32 && yb->dtype != DUET_F64))) {
    snprintf(err, errlen, "cannot load %s: the bias `%s` of `%s` is not one f32 value per output channel there", path,
             p->tensors[bias->param].name, sname);
    return -1;
  }
  double *a = calloc((size_t)C + 1, sizeof *a);
  char *removed = calloc((size_t)C + 1, 1);
  int rc = -1, any = 0, bad = 0;
  if (!a || !removed) {
    snprintf(err, errlen, "out of host memory");
    goto out;
  }
  for (int64_t c = 0; c < C; c++) removed[c] = 1;
  for (int64_t j = 0; j < K; j++) removed[k->kept[s][j]] = 0;
  int64_t first = -1;
  for (int64_t c = 0; c < C; c++) {
    if (!removed[c]) continue;
    a[c] = apply_acts(next->acts, yb ? elem(yb, c) : 0, &bad);
    if (a[c] != 0 && first < 0) first = c;
    any |= a[c] != 0;
  }
  if (bad) {
    snprintf(err, errlen, "cannot load %s: --shrink: unknown activation in \"%s\"", path, next->acts);
    goto out;
  }
  if (!any) {
    rc = 0;
    goto out;
  }
  const DuetTensor *nw = &p->tensors[next->param];
  if (!next->fold || next->next_bias < 0) {
    snprintf(err, errlen, "cannot load %s: pruned channel %" PRId64 " of `%s` still outputs %s%s%s = %.9g (channels "
             "pruning keeps the biases), and %s, so the channel cannot be removed exactly; evaluate it without --shrink (a "
             "compiled executable: compile again without --shrink)", path, first, sname,
             next->acts[0] ? next->acts : "", next->acts[0] ? "(" : "", yb ? "bias)" : "0)", a[first],
             next->next_bias < 0 ? "the next layer has no bias to fold it into"
                                 : "zero padding makes it depend on the position");
    goto out;
  }
  const DuetStTensor *yw = duet_st_find(f, nw->name), *ynb = duet_st_find(f, p->tensors[next->next_bias].name);
  int64_t full[DUET_MAX_RANK], n = 1;
  duet_shrink_full_shape(p, next->param, full);
  for (int r = 0; r < nw->rank; r++) n *= full[r];
  int64_t O = full[next->next_out];
  if (!yw || !ynb || ynb->rank != 1 || ynb->shape[0] != O || (yw->dtype != DUET_F32 && yw->dtype != DUET_F64) ||
      yw->nbytes != n * (yw->dtype == DUET_F64 ? 8 : 4)) {
    snprintf(err, errlen, "cannot load %s: --shrink: the next layer's weight `%s` or bias `%s` is missing or of "
             "another shape there", path, nw->name, p->tensors[next->next_bias].name);
    goto out;
  }
  double *d = k->delta[next->next_bias];
  if (!d && !(d = k->delta[next->next_bias] = calloc((size_t)O + 1, sizeof *d))) {
    snprintf(err, errlen, "out of host memory");
    goto out;
  }
  /* element e's index along the input and the output axes */
  int64_t in_stride = 1, out_stride = 1;
  for (int r = nw->rank - 1; r > next->axis; r--) in_stride *= full[r];
  for (int r = nw->rank - 1; r > next->next_out; r--) out_stride *= full[r];
  for (int64_t e = 0; e < n; e++) {
    int64_t c = (e / in_stride) % full[next->axis] / next->group;
    if (removed[c] && a[c] != 0) d[(e / out_stride) % O] += a[c] * elem(yw, e);
  }
  rc = 0;
out:
  free(a);
  free(removed);
  return rc;
}

/* Why a checkpoint keeps another number of channels of source `name` than
 * the shrunk program p, from its metadata (prune_mode, prune_sparsity,
 * prune_start, prune_end, step: duet_checkpoint_save) and whether it has
 * the source's mask: 1 with the message (what it was trained with, what was
 * asked, what to do), 0 when the metadata explain nothing (the caller's
 * message: the counts). */
static int mismatch(const DuetProgram *p, const DuetStFile *f, const char *path, const char *name, int has_mask,
                    char *err, size_t errlen) {
  const char *mode = duet_st_meta(f, "prune_mode"), *fin = duet_st_meta(f, "prune_sparsity");
  const char *st = duet_st_meta(f, "step"), *ps = duet_st_meta(f, "prune_start"), *pe = duet_st_meta(f, "prune_end");
  char asked[120], sp[40];
  snprintf(sp, sizeof sp, "%.15g", p->shrink->sparsity);
  snprintf(asked, sizeof asked, "this program was shrunk (--shrink) for --prune-mode channels --prune %s", sp);
  static const char without[] = "evaluate it without --shrink (a compiled executable: compile again without --shrink)";
  if (!mode) {
    if (has_mask) return 0; /* masks without the settings: a checkpoint of older duet */
    snprintf(err, errlen, "cannot load %s: it was trained without pruning (no pruning settings, no mask of `%s`), "
             "and %s; %s", path, name, asked, without);
    return 1;
  }
  if (!fin) return 0;
  if (strcmp(mode, "channels")) {
    snprintf(err, errlen, "cannot load %s: it was trained with --prune-mode %s --prune %s, and %s: --shrink removes "
             "only the channels that channels pruning zeroed; %s", path, mode, fin, asked, without);
    return 1;
  }
  char *end;
  double S = strtod(fin, &end);
  if (end == fin || *end) return 0;
  if (S != p->shrink->sparsity) {
    snprintf(err, errlen, "cannot load %s: it was trained with --prune-mode channels --prune %s, and %s; give "
             "--prune %s (a compiled executable: compile again: duet compile M.model --prune-mode channels --prune %s "
             "--shrink)", path, fin, asked, fin, fin);
    return 1;
  }
  char *e1, *e2, *e3;
  long long step = st ? strtoll(st, &e1, 10) : -1, start = ps ? strtoll(ps, &e2, 10) : -1,
            last = pe ? strtoll(pe, &e3, 10) : -1;
  if (st && ps && pe && !*e1 && !*e2 && !*e3 && step <= last) { /* duet_prune_due: updates after t = start .. end */
    char sched[80];
    snprintf(sched, sizeof sched, "--prune-start %lld", start);
    if (last != start) snprintf(sched + strlen(sched), sizeof sched - strlen(sched), " --prune-end %lld", last);
    snprintf(err, errlen, "cannot load %s: it was saved at step %lld, %s (%s), so fewer channels are pruned than "
             "--prune %s removes; evaluate a checkpoint saved after step %lld, or this one without --shrink (a "
             "compiled executable: compile again without --shrink)", path, step,
             step <= start ? "before its channels pruning began" : "before its last pruning update", sched, sp, last);
    return 1;
  }
  if (!has_mask) {
    snprintf(err, errlen, "cannot load %s: it has no pruning mask of `%s` (it was trained with --prune-params that "
             "leave it out), and %s, which prunes it; give the --prune-params it was trained with (a compiled "
             "executable: compile again with them)", path, name, asked);
    return 1;
  }
  return 0;
}

DuetShrinkKept *duet_shrink_kept(const DuetProgram *p, const DuetStFile *f, const char *path, char *err,
                                 size_t errlen) {
  DuetShrinkKept *k = calloc(1, sizeof *k);
  if (!k || !(k->kept = calloc((size_t)p->n_tensors + 1, sizeof *k->kept)) ||
      !(k->delta = calloc((size_t)p->n_tensors + 1, sizeof *k->delta))) {
    if (k) free(k->kept);
    free(k);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  k->n_tensors = p->n_tensors;
  for (int j = 0; p->shrink && j < p->shrink->n; j++) {
    int s = p->shrink->axes[j].source;
    if (k->kept[s]) continue;
    const DuetTensor *x = &p->tensors[s];
    const DuetShrinkAxis *own = own_axis(p, s);
    char mname[512];
    snprintf(mname, sizeof mname, "%s.mask", x->name);
    const DuetStTensor *y = duet_st_find(f, x->name), *m = duet_st_find(f, mname);
    int64_t full[DUET_MAX_RANK], n = 1;
    duet_shrink_full_shape(p, s, full);
    for (int r = 0; r < x->rank; r++) n *= full[r];
    if (!own || !y || y->rank != x->rank || n < 1) {
      snprintf(err, errlen, "cannot load %s: it has no weight `%s` of the shape the program was shrunk from", path,
               x->name);
      goto fail;
    }
    if (m && (m->rank != y->rank || m->nbytes != y->nbytes)) m = NULL; /* not its mask: the weights decide */
    const DuetStTensor *t = m ? m : y;
    int64_t size = t->nbytes / n, C = own->full, inner = 1;
    for (int r = own->axis + 1; r < x->rank; r++) inner *= full[r];
    int64_t *kept = k->kept[s] = malloc((size_t)C * sizeof *kept + 8), K = 0;
    if (!kept) {
      snprintf(err, errlen, "out of host memory");
      goto fail;
    }
    for (int64_t c = 0; c < C; c++) { /* channel c: the elements (o, c, i) of [n / (C inner), C, inner] */
      int any = 0;
      for (int64_t o = 0; o < n / (C * inner) && !any; o++)
        for (int64_t i = 0; i < inner && !any; i++) any = nonzero(t, (o * C + c) * inner + i, size);
      if (any) kept[K++] = c;
    }
    int64_t want = x->shape[own->axis];
    if (K != want && mismatch(p, f, path, x->name, m != NULL, err, errlen)) goto fail;
    if (K != want) {
      snprintf(err, errlen, "cannot load %s: `%s` keeps %" PRId64 " of its %" PRId64 " output channels there (%s), "
               "and this program was shrunk (--shrink) to %" PRId64 " (channels pruning to sparsity %.6g); give the "
               "--prune S it was trained with", path, x->name, K, C,
               m ? "its mask" : "its nonzero channels: it has no mask",
               want, p->shrink->sparsity);
      goto fail;
    }
    if (fold_removed(p, k, f, path, s, C, K, err, errlen)) goto fail;
  }
  return k;
fail:
  duet_shrink_kept_free(k);
  return NULL;
}

int duet_shrink_gather(const DuetProgram *p, const DuetShrinkKept *k, int i, const DuetStTensor *y, void *out) {
  const DuetTensor *x = &p->tensors[i];
  int64_t full[DUET_MAX_RANK], n = 1, nf = 1;
  duet_shrink_full_shape(p, i, full);
  for (int r = 0; r < x->rank; r++) n *= x->shape[r], nf *= full[r];
  if (y->rank != x->rank || nf < 1 || y->nbytes % nf) return -1;
  for (int r = 0; r < x->rank; r++)
    if (y->shape[r] != full[r]) return -1;
  int64_t size = y->nbytes / nf;
  if (size * n != x->nbytes) return -1;
  /* map[r][j]: the full index of index j along axis r */
  int64_t *map[DUET_MAX_RANK] = {0}, fstride[DUET_MAX_RANK];
  int rc = -1;
  int64_t st = 1;
  for (int r = x->rank - 1; r >= 0; r--) {
    fstride[r] = st;
    st *= full[r];
  }
  for (int r = 0; r < x->rank; r++) {
    if (!(map[r] = malloc((size_t)x->shape[r] * sizeof **map + 8))) goto out;
    for (int64_t j = 0; j < x->shape[r]; j++) map[r][j] = j;
  }
  for (int a = 0; p->shrink && a < p->shrink->n; a++) {
    const DuetShrinkAxis *e = &p->shrink->axes[a];
    if (e->param != i) continue;
    const int64_t *kept = k->kept[e->source];
    if (!kept || e->axis >= x->rank) goto out;
    for (int64_t j = 0; j < x->shape[e->axis]; j++) map[e->axis][j] = kept[j / e->group] * e->group + j % e->group;
  }
  int64_t idx[DUET_MAX_RANK] = {0};
  const double *delta = k ? k->delta[i] : NULL;
  if (delta && (x->rank != 1 || (size != 4 && size != 8))) goto out;
  for (int64_t j = 0; j < n; j++) {
    int64_t src = 0;
    for (int r = 0; r < x->rank; r++) src += map[r][idx[r]] * fstride[r];
    memcpy((unsigned char *)out + j * size, (const unsigned char *)y->data + src * size, (size_t)size);
    if (delta && size == 4) { /* the removed channels' constants, folded into this bias */
      float v;
      memcpy(&v, (unsigned char *)out + 4 * j, 4);
      v = (float)((double)v + delta[src]);
      memcpy((unsigned char *)out + 4 * j, &v, 4);
    } else if (delta) {
      double v;
      memcpy(&v, (unsigned char *)out + 8 * j, 8);
      v += delta[src];
      memcpy((unsigned char *)out + 8 * j, &v, 8);
    }
    for (int r = x->rank - 1; r >= 0; r--) {
      if (++idx[r] < x->shape[r]) break;
      idx[r] = 0;
    }
  }
  rc = 0;
out:
  for (int r = 0; r < x->rank; r++) free(map[r]);
  return rc;
}

void duet_shrink_summary(const DuetProgram *p, FILE *out) {
  if (!p->shrink) return;
  int64_t n = 0, nb = 0, fn = 0, fnb = 0;
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *x = &p->tensors[i];
    if (x->region != DUET_MEM_PARAM) continue;
    int64_t full[DUET_MAX_RANK], e = 1, fe = 1;
    duet_shrink_full_shape(p, i, full);
    for (int r = 0; r < x->rank; r++) e *= x->shape[r], fe *= full[r];
    n += e, nb += x->nbytes, fn += fe;
    fnb += e ? x->nbytes / e * fe : 0;
  }
  fprintf(out, "duet: shrunk (--shrink): %" PRId64 " parameters in %" PRId64 " bytes (%" PRId64 " in %" PRId64
          " before)\n", n, nb, fn, fnb);
}

int duet_shrink_check_fixed(const DuetProgram *p, const char *flag, const char *val) {
  if (!p->shrink || p->prune || strncmp(flag, "--prune", 7)) return -1;
  char sp[40];
  snprintf(sp, sizeof sp, "%.15g", p->shrink->sparsity);
  if (!strcmp(flag, "--prune")) {
    char *end;
    double x = strtod(val, &end);
    if (end != val && !*end && x == p->shrink->sparsity) return 0;
    fprintf(stderr, "duet: error: --prune is fixed at compile time: %s (this program was compiled with --prune-mode "
            "channels --prune %s --shrink: it evaluates checkpoints channels-pruned to sparsity %s; for one trained "
            "with --prune %s, compile again: duet compile M.model --prune-mode channels --prune %s --shrink; duet run "
            "takes them directly)\n", sp, sp, sp, val, val);
    return 1;
  }
  if (!strcmp(flag, "--prune-mode")) {
    if (!strcmp(val, "channels")) return 0;
    fprintf(stderr, "duet: error: --prune-mode is fixed at compile time: channels (this program was compiled with "
            "--prune-mode channels --prune %s --shrink, and --shrink needs channels pruning; for a checkpoint trained "
            "with --prune-mode %s, compile again without --shrink: duet compile M.model --prune-mode %s --prune S; "
            "duet run takes them directly)\n", sp, val, val);
    return 1;
  }
  return 0; /* the schedule, --prune-params: the checkpoint's masks decide what is kept */
}
