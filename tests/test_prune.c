/* tests/test_prune.c: magnitude pruning.
 *
 *   1. the schedule: duet_prune_target against a table derived by hand from
 *      Zhu & Gupta's formula (fractions below), and the update steps;
 *   2. duet_prune_masks against an independent reference that sorts: the
 *      exact count per layer (round half to even) and globally, ties
 *      broken by position, weights pruned already kept pruned, f32 and
 *      f64; N:M (2:4 and 1:4) on every group of both layouts; channels;
 *   3. the pass and the program: which params get masks (matmul and
 *      convolution weights; not biases, norms, embeddings; patterns), the
 *      output axis of each layout, the program's table, and that a 16-bit
 *      program keeps no 16-bit weight across steps (its copy is cast from
 *      the masked f32 master weight every step);
 *   4. a session: after pruning and 20 more steps of AdamW with weight
 *      decay, SGD with momentum and weight decay, AdamW in fp16 and AdamW
 *      with 8-bit state (fp32, fp16: the state's codes are 0), every
 *      pruned weight and its optimizer state is +0.0 (no "regrowth") and
 *      the rest trained. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static int fails;

#define CHECK(c, ...)                 \
  do {                                \
    if (!(c)) {                       \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);            \
      printf("\n");                   \
      fails++;                        \
    }                                 \
  } while (0)

/* ------------------------------------------------------------ schedule */

static void test_schedule(void) {
  /* s_t = s_f + (s_i - s_f) (1 - (t - t0) / (n dt))^3, by hand:
   * s_f = 0.9, s_i = 0, t0 = 100, n dt = 400:
   *   t = 200: 0.9 (1 - (3/4)^3) = 0.9 x 37/64 = 0.5203125
   *   t = 300: 0.9 (1 - (1/2)^3) = 0.9 x 7/8   = 0.7875
   *   t = 400: 0.9 (1 - (1/4)^3) = 0.9 x 63/64 = 0.8859375
   * s_f = 0.8, s_i = 0.2, t0 = 0, n dt = 300:
   *   t = 100: 0.8 - 0.6 (2/3)^3 = 0.8 - 0.6 x 8/27 = 28/45
   *   t = 200: 0.8 - 0.6 (1/3)^3 = 0.8 - 0.6 / 27  = 7/9 */
  DuetPrune a = {.mode = DUET_PRUNE_UNSTRUCTURED, .initial = 0, .final = 0.9, .start = 100, .end = 500, .every = 100};
  const struct { int64_t t; double s; } ta[] = {{0, 0}, {99, 0}, {100, 0}, {200, 0.5203125}, {300, 0.7875},
                                               {400, 0.8859375}, {500, 0.9}, {10000, 0.9}};
  for (size_t i = 0; i < sizeof ta / sizeof *ta; i++)
    CHECK(close_enough(duet_prune_target(&a, ta[i].t), ta[i].s, 1e-15, 0), "target(%lld) = %.17g, want %.17g",
          (long long)ta[i].t, duet_prune_target(&a, ta[i].t), ta[i].s);
  DuetPrune b = {.mode = DUET_PRUNE_GLOBAL, .initial = 0.2, .final = 0.8, .start = 0, .end = 300, .every = 100};
  const struct { int64_t t; double s; } tb[] = {{0, 0.2}, {100, 28.0 / 45}, {200, 7.0 / 9}, {300, 0.8}};
  for (size_t i = 0; i < sizeof tb / sizeof *tb; i++)
    CHECK(close_enough(duet_prune_target(&b, tb[i].t), tb[i].s, 1e-15, 0), "target(%lld) = %.17g, want %.17g",
          (long long)tb[i].t, duet_prune_target(&b, tb[i].t), tb[i].s);
  /* updates: start + k every below end, and end */
  DuetPrune c = {.mode = DUET_PRUNE_UNSTRUCTURED, .final = 0.5, .start = 100, .end = 450, .every = 100};
  for (int64_t t = 0; t <= 600; t++) {
    bool want = t == 100 || t == 200 || t == 300 || t == 400 || t == 450;
    CHECK(duet_prune_due(&c, t) == want, "due(%lld) = %d", (long long)t, duet_prune_due(&c, t));
  }
  DuetPrune one = {.mode = DUET_PRUNE_UNSTRUCTURED, .final = 0.5, .start = 7, .end = 7, .every = 100};
  for (int64_t t = 0; t <= 300; t++) CHECK(duet_prune_due(&one, t) == (t == 7), "one-shot due(%lld)", (long long)t);
  CHECK(duet_prune_target(&one, 7) == 0.5, "one-shot target");
  DuetPrune nm = {.mode = DUET_PRUNE_NM, .nm_n = 2, .nm_m = 4};
  CHECK(duet_prune_target(&nm, 0) == 0.5, "2:4 target");
}

/* ------------------------------------------------------------ the masks */

typedef struct Ref {
  double mag;
  int pruned;
  int64_t idx;
} Ref;

/* previously pruned first, then by magnitude, then by position */
static int ref_cmp(const void *pa, const void *pb) {
  const Ref *a = pa, *b = pb;
  if (a->pruned != b->pruned) return a->pruned ? -1 : 1;
  if (a->mag != b->mag) return a->mag < b->mag ? -1 : 1;
  return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* Values with many ties: multiples of 1/8 in [-1, 1], both signs. */
static double tie_value(DuetRng *r) { return (double)((int)(duet_rng_next(r) % 17) - 8) / 8.0; }

/* The reference masks of k smallest (sorted) over the concatenation of the
 * layers: out[layer][i]. */
static void ref_masks(int nl, const int64_t *n, double *const *w, double *const *m0, int64_t k, double **out) {
  int64_t tot = 0;
  for (int l = 0; l < nl; l++) tot += n[l];
  Ref *r = malloc((size_t)tot * sizeof *r);
  int64_t j = 0;
  for (int l = 0; l < nl; l++)
    for (int64_t i = 0; i < n[l]; i++, j++) r[j] = (Ref){fabs(w[l][i]), m0[l][i] == 0, j};
  qsort(r, (size_t)tot, sizeof *r, ref_cmp);
  int64_t *off = calloc((size_t)nl + 1, sizeof *off);
  for (int l = 0; l < nl; l++) off[l + 1] = off[l] + n[l];
  for (int l = 0; l < nl; l++)
    for (int64_t i = 0; i < n[l]; i++) out[l][i] = 1;
  for (int64_t q = 0; q < k; q++) {
    int l = 0;
    while (r[q].idx >= off[l + 1]) l++;
    out[l][r[q].idx - off[l]] = 0;
  }
  free(off);
  free(r);
}

/* Runs duet_prune_masks on layers of doubles (f64) or their floats (f32). */
static int run_masks(const DuetPrune *pr, double target, bool f64, double *const *w, double *const *m) {
  int np = pr->n_params;
  int dt[8] = {0};
  void *wv[8] = {0}, *mv[8] = {0};
  for (int i = 0; i < np; i++) {
    int64_t n = pr->params[i].out_n * pr->params[i].in_n;
    dt[i] = f64 ? DUET_F64 : DUET_F32;
    wv[i] = malloc((size_t)n * 8);
    mv[i] = malloc((size_t)n * 8);
    for (int64_t e = 0; e < n; e++) {
      if (f64) ((double *)wv[i])[e] = w[i][e], ((double *)mv[i])[e] = m[i][e];
      else ((float *)wv[i])[e] = (float)w[i][e], ((float *)mv[i])[e] = (float)m[i][e];
    }
  }
  char err[256];
  int rc = duet_prune_masks(pr, target, dt, (const void *const *)wv, (void *const *)mv, err, sizeof err);
  if (rc) printf("duet_prune_masks: %s\n", err);
  for (int i = 0; i < np; i++) {
    int64_t n = pr->params[i].out_n * pr->params[i].in_n;
    for (int64_t e = 0; e < n; e++) m[i][e] = f64 ? ((double *)mv[i])[e] : ((float *)mv[i])[e];
    free(wv[i]);
    free(mv[i]);
  }
  return rc;
}

static DuetPruneParam flat(int64_t n) { return (DuetPruneParam){0, 0, {-1, -1}, 1, n, n, 1}; }

static void test_unstructured_and_global(void) {
  DuetRng r;
  duet_rng_seed(&r, 7, 1);
  enum { NL = 3 };
  const int64_t n[NL] = {1000, 14, 333};
  double *w[NL], *m[NL], *want[NL];
  DuetPruneParam pp[NL];
  for (int l = 0; l < NL; l++) {
    w[l] = malloc((size_t)n[l] * sizeof **w);
    m[l] = malloc((size_t)n[l] * sizeof **m);
    want[l] = malloc((size_t)n[l] * sizeof **want);
    pp[l] = flat(n[l]);
  }
  for (int f64 = 0; f64 < 2; f64++)
    for (int mode = DUET_PRUNE_UNSTRUCTURED; mode <= DUET_PRUNE_GLOBAL; mode++) {
      const double targets[] = {0, 0.25, 0.37, 0.5, 0.9, 0.999};
      DuetPrune pr = {.mode = mode, .n_params = NL, .params = pp};
      for (int l = 0; l < NL; l++)
        for (int64_t i = 0; i < n[l]; i++) w[l][i] = tie_value(&r), m[l][i] = 1;
      /* a growing schedule: each step prunes more, and what is pruned stays */
      for (size_t ti = 0; ti < sizeof targets / sizeof *targets; ti++) {
        double t = targets[ti];
        if (mode == DUET_PRUNE_GLOBAL) {
          int64_t tot = n[0] + n[1] + n[2];
          ref_masks(NL, n, w, m, (int64_t)nearbyint(t * (double)tot), want);
        } else {
          for (int l = 0; l < NL; l++) ref_masks(1, &n[l], &w[l], &m[l], (int64_t)nearbyint(t * (double)n[l]), &want[l]);
        }
        double *before[NL];
        for (int l = 0; l < NL; l++) {
          before[l] = malloc((size_t)n[l] * sizeof **before);
          memcpy(before[l], m[l], (size_t)n[l] * sizeof **before);
        }
        if (run_masks(&pr, t, f64, w, m)) fails++;
        int64_t zeros = 0, tot = 0;
        for (int l = 0; l < NL; l++) {
          int64_t z = 0, diff = -1, regrown = 0;
          for (int64_t i = 0; i < n[l]; i++) {
            z += m[l][i] == 0;
            if (m[l][i] != want[l][i] && diff < 0) diff = i;
            regrown += before[l][i] == 0 && m[l][i] != 0;
          }
          CHECK(diff < 0, "%s %s s=%g layer %d: mask differs from the sorted reference at %lld", f64 ? "f64" : "f32",
                mode == DUET_PRUNE_GLOBAL ? "global" : "unstructured", t, l, (long long)diff);
          CHECK(!regrown, "layer %d: %lld weights pruned before are kept now", l, (long long)regrown);
          if (mode == DUET_PRUNE_UNSTRUCTURED)
            CHECK(z == (int64_t)nearbyint(t * (double)n[l]), "layer %d s=%g: %lld pruned", l, t, (long long)z);
          zeros += z;
          tot += n[l];
          free(before[l]);
        }
        if (mode == DUET_PRUNE_GLOBAL)
          CHECK(zeros == (int64_t)nearbyint(t * (double)tot), "global s=%g: %lld of %lld pruned", t, (long long)zeros,
                (long long)tot);
        /* pruned weights become 0 (as duet_prune_update does), so later
         * updates see them as the training kernels leave them */
        for (int l = 0; l < NL; l++)
          for (int64_t i = 0; i < n[l]; i++)
            if (m[l][i] == 0) w[l][i] = 0;
      }
    }
  /* round half to even: 0.25 x 14 = 3.5 -> 4, 0.25 x 10 = 2.5 -> 2 */
  DuetPruneParam p14 = flat(14), p10 = flat(10);
  DuetPrune pr14 = {.mode = DUET_PRUNE_UNSTRUCTURED, .n_params = 1, .params = &p14};
  DuetPrune pr10 = {.mode = DUET_PRUNE_UNSTRUCTURED, .n_params = 1, .params = &p10};
  for (int64_t i = 0; i < 14; i++) w[0][i] = (double)(i + 1), m[0][i] = 1;
  run_masks(&pr14, 0.25, false, w, m);
  int z = 0;
  for (int i = 0; i < 14; i++) z += m[0][i] == 0;
  CHECK(z == 4 && m[0][0] == 0 && m[0][3] == 0 && m[0][4] == 1, "0.25 of 14: %d pruned", z);
  for (int64_t i = 0; i < 10; i++) w[0][i] = -(double)(10 - i), m[0][i] = 1; /* magnitudes 10..1 */
  run_masks(&pr10, 0.25, false, w, m);
  CHECK(m[0][9] == 0 && m[0][8] == 0 && m[0][7] == 1, "0.25 of 10: the two smallest magnitudes");
  /* all equal: the lowest indices go first */
  for (int64_t i = 0; i < 10; i++) w[0][i] = 0.5, m[0][i] = 1;
  run_masks(&pr10, 0.5, false, w, m);
  for (int i = 0; i < 10; i++) CHECK(m[0][i] == (i < 5 ? 0 : 1), "ties: entry %d", i);
  for (int l = 0; l < NL; l++) free(w[l]), free(m[l]), free(want[l]);
}

/* N:M on a [K, N] weight (x @ w: inputs along axis 0, stride N) and on an
 * [O, C, kh, kw] one (inputs contiguous). */
static void test_nm(void) {
  DuetRng r;
  duet_rng_seed(&r, 3, 2);
  const int shapes[2][2] = {{16, 6}, {5, 24}}; /* [K,N] (axis-last), and [O, C*kh*kw] (axis-first) */
  for (int lay = 0; lay < 2; lay++)
    for (int nn = 1; nn <= 2; nn++) {
      int64_t R = shapes[lay][0], C = shapes[lay][1], n = R * C;
      DuetPruneParam q = lay == 0 ? (DuetPruneParam){0, 0, {-1, -1}, C, 1, R, C}
                                  : (DuetPruneParam){0, 0, {-1, -1}, R, C, C, 1};
      DuetPrune pr = {.mode = DUET_PRUNE_NM, .nm_n = nn, .nm_m = 4, .n_params = 1, .params = &q};
      double *w = malloc((size_t)n * sizeof *w), *m = malloc((size_t)n * sizeof *m);
      for (int64_t i = 0; i < n; i++) w[i] = tie_value(&r), m[i] = 1;
      if (run_masks(&pr, 0.5, false, &w, &m)) fails++;
      int bad = 0;
      for (int64_t o = 0; o < q.out_n; o++)
        for (int64_t g = 0; g < q.in_n; g += 4) {
          Ref ref[4];
          int kept = 0;
          for (int k = 0; k < 4; k++) {
            int64_t e = o * q.out_stride + (g + k) * q.in_stride;
            ref[k] = (Ref){fabs(w[e]), 0, k};
            kept += m[e] != 0;
          }
          qsort(ref, 4, sizeof *ref, ref_cmp);
          bool ok = kept == nn;
          for (int k = 0; k < 4; k++) {
            int64_t e = o * q.out_stride + (g + ref[k].idx) * q.in_stride;
            ok = ok && (m[e] == 0) == (k < 4 - nn);
          }
          if (!ok && !bad++)
            printf("FAIL %d:4 layout %d: channel %lld, inputs %lld..%lld keep %d\n", nn, lay, (long long)o, (long long)g,
                   (long long)g + 3, kept);
        }
      fails += bad > 0;
      free(w);
      free(m);
    }
}

static void test_channels(void) {
  /* [in = 20, out = 12] (axis last): columns 2k and 2k+1 are equal (ties
   * between channels: the lower index goes) */
  int64_t K = 20, N = 12, n = K * N;
  DuetRng r;
  duet_rng_seed(&r, 5, 3);
  double *w = malloc((size_t)n * sizeof *w), *m = malloc((size_t)n * sizeof *m);
  for (int64_t k = 0; k < K; k++)
    for (int64_t c = 0; c < N; c += 2) w[k * N + c] = w[k * N + c + 1] = tie_value(&r);
  for (int64_t i = 0; i < n; i++) m[i] = 1;
  DuetPruneParam q = {0, 0, {-1, -1}, N, 1, K, N};
  DuetPrune pr = {.mode = DUET_PRUNE_CHANNELS, .n_params = 1, .params = &q};
  if (run_masks(&pr, 0.5, false, &w, &m)) fails++;
  Ref ref[12];
  for (int64_t c = 0; c < N; c++) {
    double ss = 0;
    for (int64_t k = 0; k < K; k++) ss += w[k * N + c] * w[k * N + c];
    ref[c] = (Ref){sqrt(ss), 0, c};
  }
  qsort(ref, 12, sizeof *ref, ref_cmp);
  for (int j = 0; j < 12; j++) {
    int64_t c = ref[j].idx;
    int zeros = 0;
    for (int64_t k = 0; k < K; k++) zeros += m[k * N + c] == 0;
    CHECK(zeros == (j < 6 ? K : 0), "channel %lld (rank %d by norm): %d of %lld pruned", (long long)c, j, zeros,
          (long long)K);
  }
  free(w);
  free(m);
}

/* ------------------------------------------------------ pass and session */

static const char *mlp_text(const char *prune, const char *opt, char *buf, size_t n) {
  snprintf(buf, n,
           "model p\n"
           "input x: f32[16, 12]\n"
           "input y: i32[16]\n"
           "block linear(h, out) {\n"
           "  param w: [dim(h, -1), out] = kaiming_uniform\n"
           "  param b: [out] = zeros\n"
           "  return h @ w + b\n"
           "}\n"
           "param g: [8] = ones\n"
           "param emb: [10, 8] = normal(1)\n"
           "param cw: [4, 2, 2, 2] = kaiming_uniform\n"
           "c = conv2d(reshape(x, 16, 2, 2, 3), cw, padding = 0)\n"
           "h = relu(linear(flatten(c), 8)) * g\n"
           "h = h + mean(embedding(emb, y))\n"
           "loss = cross_entropy(h @ transpose(emb), y)\n"
           "train {\n  optimizer = %s\n  batch = 16\n}\n"
           "prune {\n%s}\n",
           opt, prune);
  return buf;
}

static int test_pass(void) {
  char text[2048];
  TModel t;
  if (tmodel_open(&t, "p.model", mlp_text("  sparsity = 0.5\n", "adamw(lr = 1e-2)", text, sizeof text), DT_F32))
    return 1;
  const DuetPrune *pr = t.cp->prog.prune;
  CHECK(pr && pr->n_params == 2, "default selection: %d masks, want 2 (cw, linear1.w)", pr ? pr->n_params : -1);
  for (int i = 0; pr && i < pr->n_params; i++) {
    const DuetPruneParam *q = &pr->params[i];
    const DuetTensor *pt = &t.cp->prog.tensors[q->param], *mt = &t.cp->prog.tensors[q->mask];
    char want[128];
    snprintf(want, sizeof want, "%s.mask", pt->name);
    CHECK(!strcmp(mt->name, want) && mt->init == DUET_INIT_ONES && mt->region == DUET_MEM_STATE, "mask of %s: %s",
          pt->name, mt->name);
    CHECK(q->state[0] >= 0 && q->state[1] >= 0, "%s: AdamW state", pt->name);
    if (!strcmp(pt->name, "cw")) /* [4, 2, 2, 2]: 4 filters of 8 inputs */
      CHECK(q->out_n == 4 && q->out_stride == 8 && q->in_n == 8 && q->in_stride == 1, "cw layout %lld %lld %lld %lld",
            (long long)q->out_n, (long long)q->out_stride, (long long)q->in_n, (long long)q->in_stride);
    else if (!strcmp(pt->name, "linear1.w")) /* [8, 8]: x @ w, the columns are the channels */
      CHECK(q->out_n == 8 && q->out_stride == 1 && q->in_n == 8 && q->in_stride == 8, "linear1.w layout");
    else
      CHECK(0, "unexpected pruned param %s", pt->name);
  }
  CHECK(pr && pr->mode == DUET_PRUNE_UNSTRUCTURED && pr->final == 0.5 && pr->start == 0 && pr->end == 0 &&
            pr->every == 100, "the schedule's defaults");
  tmodel_close(&t);
  /* patterns: emb (an embedding tied to the output: the first axis), g, and not cw */
  if (tmodel_open(&t, "p.model",
                  mlp_text("  sparsity = 0.5\n  params = \"emb, g, *.w, !linear*\"\n  mode = \"global\"\n",
                           "sgd(lr = 0.1, momentum = 0.9)", text, sizeof text), DT_F32))
    return 1;
  pr = t.cp->prog.prune;
  CHECK(pr && pr->n_params == 2 && pr->mode == DUET_PRUNE_GLOBAL, "patterns: %d masks", pr ? pr->n_params : -1);
  for (int i = 0; pr && i < pr->n_params; i++) {
    const DuetPruneParam *q = &pr->params[i];
    const char *name = t.cp->prog.tensors[q->param].name;
    CHECK(q->state[0] >= 0 && q->state[1] < 0, "%s: SGD's momentum buffer", name);
    if (!strcmp(name, "emb"))
      CHECK(q->out_n == 10 && q->out_stride == 8 && q->in_n == 8 && q->in_stride == 1, "emb: [V, C] tied output");
    else if (!strcmp(name, "g"))
      CHECK(q->out_n == 1 && q->in_n == 8, "g: no channels");
    else
      CHECK(0, "unexpected pruned param %s", name);
  }
  tmodel_close(&t);
  return 0;
}

/* Trains `steps` steps on fixed random data. */
static int train(TModel *t, DuetRng *r, int steps) {
  for (int s = 0; s < steps; s++) {
    for (int i = 0; i < t->cp->prog.n_tensors; i++) {
      const DuetTensor *x = &t->cp->prog.tensors[i];
      if (i != t->cp->prog.input_x && i != t->cp->prog.input_y) continue;
      int64_t n = x->nbytes / 4;
      void *h = malloc((size_t)x->nbytes);
      for (int64_t e = 0; e < n; e++) {
        if (x->dtype == DUET_I32) ((int32_t *)h)[e] = (int32_t)(duet_rng_next(r) % 8);
        else ((float *)h)[e] = (float)duet_rng_normal(r);
      }
      duet_session_write(t->s, i, 0, h, (size_t)x->nbytes);
      free(h);
    }
    if (duet_session_run(t->s, DUET_RUN_TRAIN)) {
      printf("FAIL train: %s\n", duet_session_error(t->s));
      return 1;
    }
  }
  return 0;
}

static float *read_f32(DuetSession *s, const DuetProgram *p, int id) {
  float *h = malloc((size_t)p->tensors[id].nbytes);
  duet_session_read(s, id, 0, h, (size_t)p->tensors[id].nbytes);
  return h;
}

/* Prune after 5 steps, train 20 more: pruned weights and their state
 * stay +0.0, the others move. */
static int test_regrowth(const char *opt, const char *precision) {
  char text[2048];
  TModel t;
  FrontendOptions fo = {0};
  if (tmodel_open_prec(&t, "p.model", mlp_text("  sparsity = 0.6\n  start = 5\n  params = \"*w, emb, g\"\n", opt,
                                               text, sizeof text), &fo, precision))
    return 1;
  const DuetProgram *p = &t.cp->prog;
  DuetRng r;
  duet_rng_seed(&r, 11, 0);
  char err[256];
  int rc = train(&t, &r, 5);
  if (!rc && duet_prune_update(t.s, 0.6, err, sizeof err)) printf("FAIL duet_prune_update: %s\n", err), rc = 1;
  float **before = calloc((size_t)p->prune->n_params, sizeof *before);
  for (int i = 0; !rc && i < p->prune->n_params; i++) before[i] = read_f32(t.s, p, p->prune->params[i].param);
  if (!rc) rc = train(&t, &r, 20);
  for (int i = 0; !rc && i < p->prune->n_params; i++) {
    const DuetPruneParam *q = &p->prune->params[i];
    float *w = read_f32(t.s, p, q->param), *m = read_f32(t.s, p, q->mask);
    /* 8-bit AdamW state: its codes (u8, found by name), 0 where pruned (code
     * 0 decodes to exactly 0 in any block: test_adamw8) */
    int codes[2] = {-1, -1};
    for (int k = 0; k < 2; k++) {
      char want[300];
      snprintf(want, sizeof want, "%s.%s.codes", p->tensors[q->param].name, k ? "exp_avg_sq" : "exp_avg");
      for (int j = 0; j < p->n_tensors; j++)
        if (!strcmp(p->tensors[j].name, want)) codes[k] = j;
    }
    bool u8 = codes[0] >= 0;
    if (u8) CHECK(q->state[0] == codes[0] && q->state[1] == codes[1], "%s: the pruning table's state is not the codes",
                  p->tensors[q->param].name);
    float *st[2] = {q->state[0] >= 0 || u8 ? read_f32(t.s, p, u8 ? codes[0] : q->state[0]) : NULL,
                    q->state[1] >= 0 || u8 ? read_f32(t.s, p, u8 ? codes[1] : q->state[1]) : NULL};
    int64_t n = q->out_n * q->in_n, zeros = 0, regrown = 0, stale = 0, moved = 0;
    for (int64_t e = 0; e < n; e++) {
      uint32_t b;
      if (m[e] != 0) {
        moved += w[e] != before[i][e];
        continue;
      }
      zeros++;
      memcpy(&b, &w[e], 4);
      regrown += b != 0;
      for (int k = 0; k < 2; k++)
        if (st[k] && u8) stale += ((const unsigned char *)st[k])[e] != 0;
        else if (st[k]) memcpy(&b, &st[k][e], 4), stale += b != 0;
    }
    const char *name = p->tensors[q->param].name;
    CHECK(zeros == (int64_t)nearbyint(0.6 * (double)n), "%s %s %s: %lld of %lld pruned", opt, precision, name,
          (long long)zeros, (long long)n);
    CHECK(!regrown && !stale, "%s %s %s: %lld pruned weights regrew, %lld state entries are not +0.0", opt, precision,
          name, (long long)regrown, (long long)stale);
    CHECK(moved > 0, "%s %s %s: the kept weights did not train", opt, precision, name);
    free(w), free(m), free(st[0]), free(st[1]);
  }
  for (int i = 0; i < p->prune->n_params; i++) free(before[i]);
  free(before);
  /* 16-bit programs: no 16-bit tensor persists across steps (a param or
   * state): the copy each matmul reads is cast from the masked master
   * weight in every step's forward pass */
  for (int i = 0; i < p->n_tensors; i++)
    CHECK(!(p->tensors[i].region == DUET_MEM_PARAM || p->tensors[i].region == DUET_MEM_STATE) ||
              p->tensors[i].dtype == DUET_F32 || p->tensors[i].dtype == DUET_U8, "%s: a persistent %d-dtype tensor", p->tensors[i].name,
          p->tensors[i].dtype);
  tmodel_close(&t);
  return rc;
}

int main(void) {
  test_schedule();
  test_unstructured_and_global();
  test_nm();
  test_channels();
  if (test_pass()) fails++;
  if (test_regrowth("adamw(lr = 1e-2, weight_decay = 0.1)", "fp32")) fails++;
  if (test_regrowth("sgd(lr = 0.05, momentum = 0.9, weight_decay = 0.01)", "fp32")) fails++;
  if (test_regrowth("adamw(lr = 1e-2, weight_decay = 0.1)", "fp16")) fails++;
  if (test_regrowth("sgd(lr = 0.05, momentum = 0.9, weight_decay = 0.01)", "bf16")) fails++;
  /* 8-bit AdamW state: the masks zero the codes */
  if (test_regrowth("adamw(lr = 1e-2, weight_decay = 0.1, state = int8)", "fp32")) fails++;
  if (test_regrowth("adamw(lr = 1e-2, weight_decay = 0.1, state = int8)", "fp16")) fails++;
  printf(fails ? "test_prune: %d failures\n" : "test_prune: ok\n", fails);
  return fails != 0;
}
