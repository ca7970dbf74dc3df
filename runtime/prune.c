/* runtime/prune.c: choosing pruning masks on the host (magnitude ranking)
 * and the schedule (Zhu & Gupta 2017).  The program's DuetPrune table
 * (written by passes/prune.c through codegen) names each pruned param, its
 * mask and its optimizer state; the generated prune_mask kernels apply the
 * masks after every optimizer step, so here the masks are only chosen, at
 * the schedule's steps, and the newly pruned entries zeroed once. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "duet_rt.h"

double duet_prune_target(const DuetPrune *pr, int64_t t) {
  if (pr->mode == DUET_PRUNE_NM) return (double)(pr->nm_m - pr->nm_n) / (double)pr->nm_m;
  if (t < pr->start) return pr->initial;
  if (t >= pr->end) return pr->final;
  double r = 1.0 - (double)(t - pr->start) / (double)(pr->end - pr->start);
  return pr->final + (pr->initial - pr->final) * r * r * r;
}

int duet_prune_due(const DuetPrune *pr, int64_t t) {
  if (t < pr->start || t > pr->end) return 0;
  return t == pr->end || (t - pr->start) % pr->every == 0;
}

/* ------------------------------------------------------------ selection */

/* A ranking key: 0 for a weight (or channel) pruned already, else 1 + the
 * bits of its magnitude as a double (for non-negative doubles the bit
 * patterns order as the values do). */
static uint64_t mag_key(double x, int pruned) {
  if (pruned) return 0;
  x = fabs(x);
  uint64_t b;
  memcpy(&b, &x, sizeof b);
  return b + 1;
}

/* The elements ranked: n_seg segments, each either a weight tensor (w,
 * mask, its dtype) or an array of precomputed keys. */
typedef struct Seg {
  const void *w, *mask;
  int f64;
  const uint64_t *keys; /* instead of w and mask */
  int64_t n;
} Seg;

static double get(const void *p, int f64, int64_t i) { return f64 ? ((const double *)p)[i] : ((const float *)p)[i]; }
static void put(void *p, int f64, int64_t i, double x) {
  if (f64) ((double *)p)[i] = x;
  else ((float *)p)[i] = (float)x;
}

static uint64_t seg_key(const Seg *s, int64_t i) {
  return s->keys ? s->keys[i] : mag_key(get(s->w, s->f64, i), get(s->mask, s->f64, i) == 0);
}

/* Radix selection of the k-th smallest key (1 <= k <= elements) over the
 * segments: four passes, each counting the next 16 bits of the keys that
 * share the bits chosen so far.  *tau receives that key and *n_equal how
 * many keys equal to it are among the k smallest (the others, k - n_equal,
 * are below it).  hist: 65,536 counters. */
static void radix_select(const Seg *seg, int n_seg, uint64_t k, uint64_t *hist, uint64_t *tau, uint64_t *n_equal) {
  uint64_t prefix = 0, rank = k;
  for (int pass = 0; pass < 4; pass++) {
    int shift = 48 - 16 * pass;
    memset(hist, 0, 65536 * sizeof *hist);
    for (int s = 0; s < n_seg; s++)
      for (int64_t i = 0; i < seg[s].n; i++) {
        uint64_t key = seg_key(&seg[s], i);
        if (pass == 0 || key >> (shift + 16) == prefix) hist[(key >> shift) & 0xffff]++;
      }
    uint64_t below = 0;
    int b = 0;
    while (b < 65535 && below + hist[b] < rank) below += hist[b++];
    rank -= below;
    prefix = prefix << 16 | (uint64_t)b;
  }
  *tau = prefix;
  *n_equal = rank;
}

/* out[s][i] = 0 for the k smallest keys of the segments (ties by segment,
 * then index: the first ones go), 1 for the rest.  out[s] has seg[s].n
 * elements (doubles). */
static void select_smallest(const Seg *seg, int n_seg, uint64_t k, uint64_t *hist, double *const *out) {
  uint64_t tau = 0, n_eq = 0;
  if (k > 0) radix_select(seg, n_seg, k, hist, &tau, &n_eq);
  for (int s = 0; s < n_seg; s++)
    for (int64_t i = 0; i < seg[s].n; i++) {
      uint64_t key = seg_key(&seg[s], i);
      bool prune = k > 0 && (key < tau || (key == tau && n_eq > 0 && (n_eq--, true)));
      out[s][i] = prune ? 0.0 : 1.0;
    }
}

/* round(x), halves to even (Python's round, used by torch.nn.utils.prune
 * for a fractional amount). */
static uint64_t round_even(double x) { return (uint64_t)nearbyint(x); }

int duet_prune_masks(const DuetPrune *pr, double target, const int *dtype, const void *const *w, void *const *mask,
                     char *err, size_t errlen) {
  int np = pr->n_params, rc = -1;
  for (int i = 0; i < np; i++)
    if (dtype[i] != DUET_F32 && dtype[i] != DUET_F64) {
      snprintf(err, errlen, "pruning: the param of mask %d is neither f32 nor f64", i);
      return -1;
    }
  uint64_t *hist = malloc(65536 * sizeof *hist);
  Seg *seg = calloc((size_t)np + 1, sizeof *seg);
  double **out = calloc((size_t)np + 1, sizeof *out);
  uint64_t *keys = NULL;
  if (!hist || !seg || !out) goto oom;
  for (int i = 0; i < np; i++) {
    const DuetPruneParam *q = &pr->params[i];
    seg[i] = (Seg){.w = w[i], .mask = mask[i], .f64 = dtype[i] == DUET_F64, .n = q->out_n * q->in_n};
    if (!(out[i] = malloc((size_t)seg[i].n * sizeof **out + 8))) goto oom;
  }
  if (pr->mode == DUET_PRUNE_GLOBAL) {
    uint64_t total = 0;
    for (int i = 0; i < np; i++) total += (uint64_t)seg[i].n;
    select_smallest(seg, np, round_even(target * (double)total), hist, out);
  } else if (pr->mode == DUET_PRUNE_UNSTRUCTURED) {
    for (int i = 0; i < np; i++) select_smallest(&seg[i], 1, round_even(target * (double)seg[i].n), hist, &out[i]);
  } else if (pr->mode == DUET_PRUNE_NM) {
    int M = pr->nm_m, drop = pr->nm_m - pr->nm_n;
    for (int i = 0; i < np; i++) {
      const DuetPruneParam *q = &pr->params[i];
      for (int64_t o = 0; o < q->out_n; o++)
        for (int64_t g = 0; g + M <= q->in_n; g += M) {
          uint64_t key[64];
          int64_t at[64];
          for (int r = 0; r < M; r++) {
            at[r] = o * q->out_stride + (g + r) * q->in_stride;
            key[r] = seg_key(&seg[i], at[r]);
            out[i][at[r]] = 1.0;
          }
          /* the `drop` smallest of the group, the earlier first among equals */
          for (int d = 0; d < drop; d++) {
            int best = -1;
            for (int r = 0; r < M; r++)
              if (out[i][at[r]] != 0 && (best < 0 || key[r] < key[best])) best = r;
            out[i][at[best]] = 0.0;
          }
        }
    }
  } else if (pr->mode == DUET_PRUNE_CHANNELS) {
    for (int i = 0; i < np; i++) {
      const DuetPruneParam *q = &pr->params[i];
      free(keys);
      if (!(keys = malloc((size_t)q->out_n * sizeof *keys + 8))) goto oom;
      double *chan = malloc((size_t)q->out_n * sizeof *chan + 8);
      if (!chan) goto oom;
      for (int64_t o = 0; o < q->out_n; o++) {
        double ss = 0;
        int pruned = 1;
        for (int64_t k = 0; k < q->in_n; k++) {
          int64_t e = o * q->out_stride + k * q->in_stride;
          double x = get(seg[i].w, seg[i].f64, e);
          ss += x * x;
          pruned &= get(seg[i].mask, seg[i].f64, e) == 0;
        }
        keys[o] = mag_key(sqrt(ss), pruned);
      }
      Seg cs = {.keys = keys, .n = q->out_n};
      select_smallest(&cs, 1, round_even(target * (double)q->out_n), hist, &chan);
      for (int64_t o = 0; o < q->out_n; o++)
        for (int64_t k = 0; k < q->in_n; k++) out[i][o * q->out_stride + k * q->in_stride] = chan[o];
      free(chan);
    }
  } else {
    snprintf(err, errlen, "pruning: unknown mode %d", pr->mode);
    goto done;
  }
  for (int i = 0; i < np; i++)
    for (int64_t e = 0; e < seg[i].n; e++) put(mask[i], seg[i].f64, e, out[i][e]);
  rc = 0;
  goto done;
oom:
  snprintf(err, errlen, "pruning: out of host memory");
done:
  for (int i = 0; out && i < np; i++) free(out[i]);
  free(out);
  free(seg);
  free(hist);
  free(keys);
  return rc;
}

/* ------------------------------------------------------------- sessions */

/* Host copies of the pruned params (w) and masks, read from the session;
 * bytes of tensor id. */
static int64_t tensor_bytes(const DuetProgram *p, int id) { return p->tensors[id].nbytes; }

static int read_all(DuetSession *s, const DuetPrune *pr, void **w, void **m, int *dt, char *err, size_t errlen) {
  const DuetProgram *p = duet_session_program(s);
  for (int i = 0; i < pr->n_params; i++) {
    const DuetPruneParam *q = &pr->params[i];
    size_t nb = (size_t)tensor_bytes(p, q->param);
    dt[i] = p->tensors[q->param].dtype;
    if (dt[i] != p->tensors[q->mask].dtype || tensor_bytes(p, q->mask) != (int64_t)nb ||
        (int64_t)nb != q->out_n * q->in_n * (dt[i] == DUET_F64 ? 8 : 4)) {
      snprintf(err, errlen, "pruning: mask `%s` does not fit param `%s`", p->tensors[q->mask].name,
               p->tensors[q->param].name);
      return -1;
    }
    if (!(w[i] = malloc(nb + 8)) || !(m[i] = malloc(nb + 8))) {
      snprintf(err, errlen, "pruning: out of host memory");
      return -1;
    }
    if (duet_session_read(s, q->param, 0, w[i], nb) || duet_session_read(s, q->mask, 0, m[i], nb)) {
      snprintf(err, errlen, "pruning: %s", duet_session_error(s));
      return -1;
    }
  }
  return 0;
}

static void free_all(int n, void **w, void **m) {
  for (int i = 0; i < n; i++) {
    if (w) free(w[i]);
    if (m) free(m[i]);
  }
  free(w);
  free(m);
}

int duet_prune_update(DuetSession *s, double target, char *err, size_t errlen) {
  const DuetProgram *p = duet_session_program(s);
  const DuetPrune *pr = p->prune;
  if (!pr) return 0;
  int np = pr->n_params, rc = -1;
  void **w = calloc((size_t)np + 1, sizeof *w), **m = calloc((size_t)np + 1, sizeof *m), *st = NULL;
  int *dt = calloc((size_t)np + 1, sizeof *dt);
  if (!w || !m || !dt) {
    snprintf(err, errlen, "pruning: out of host memory");
    goto out;
  }
  if (read_all(s, pr, w, m, dt, err, errlen) ||
      duet_prune_masks(pr, target, dt, (const void *const *)w, (void *const *)m, err, errlen))
    goto out;
  for (int i = 0; i < np; i++) {
    const DuetPruneParam *q = &pr->params[i];
    int f64 = dt[i] == DUET_F64;
    size_t nb = (size_t)tensor_bytes(p, q->param);
    int64_t n = q->out_n * q->in_n;
    for (int64_t e = 0; e < n; e++)
      if (get(m[i], f64, e) == 0) put(w[i], f64, e, 0.0);
    if (duet_session_write(s, q->mask, 0, m[i], nb) || duet_session_write(s, q->param, 0, w[i], nb)) {
      snprintf(err, errlen, "pruning: %s", duet_session_error(s));
      goto out;
    }
    for (int k = 0; k < 2; k++) { /* the optimizer state of the pruned weights */
      if (q->state[k] < 0) continue;
      if (!st && !(st = malloc(nb + 8))) {
        snprintf(err, errlen, "pruning: out of host memory");
        goto out;
      }
      /* 8-bit AdamW state: the codes (u8; code 0 decodes to exactly 0) */
      int u8 = p->tensors[q->state[k]].dtype == DUET_U8;
      size_t sb = u8 ? (size_t)n : nb;
      if (duet_session_read(s, q->state[k], 0, st, sb)) {
        snprintf(err, errlen, "pruning: %s", duet_session_error(s));
        goto out;
      }
      for (int64_t e = 0; e < n; e++)
        if (get(m[i], f64, e) == 0) {
          if (u8) ((unsigned char *)st)[e] = 0;
          else put(st, f64, e, 0.0);
        }
      if (duet_session_write(s, q->state[k], 0, st, sb)) {
        snprintf(err, errlen, "pruning: %s", duet_session_error(s));
        goto out;
      }
    }
    free(st);
    st = NULL;
  }
  rc = 0;
out:
  free(st);
  free(dt);
  free_all(np, w, m);
  return rc;
}

int duet_prune_sparsity(DuetSession *s, double *per_param, double *overall, int64_t *n_weights, char *err,
                        size_t errlen) {
  const DuetProgram *p = duet_session_program(s);
  const DuetPrune *pr = p->prune;
  int64_t zeros = 0, total = 0;
  for (int i = 0; pr && i < pr->n_params; i++) {
    const DuetPruneParam *q = &pr->params[i];
    int f64 = p->tensors[q->mask].dtype == DUET_F64;
    size_t nb = (size_t)tensor_bytes(p, q->mask);
    int64_t n = q->out_n * q->in_n, z = 0;
    void *m = malloc(nb + 8);
    if (!m) {
      snprintf(err, errlen, "pruning: out of host memory");
      return -1;
    }
    if (duet_session_read(s, q->mask, 0, m, nb)) {
      snprintf(err, errlen, "pruning: %s", duet_session_error(s));
      free(m);
      return -1;
    }
    for (int64_t e = 0; e < n; e++) z += get(m, f64, e) == 0;
    free(m);
    if (per_param) per_param[i] = n ? (double)z / (double)n : 0;
    zeros += z;
    total += n;
  }
  *overall = total ? (double)zeros / (double)total : 0;
  if (n_weights) *n_weights = total;
  return 0;
}
