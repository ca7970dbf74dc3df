/* tests/test_data_parallel.c: data parallelism through the session API
 * (duet_session_replicas, duet_session_write, duet_session_read_replica):
 *  1. a tiny MLP compiled for 2 replicas (one micro-batch each) and for one
 *     device with 2 micro-batches: params and inputs written through the
 *     session reach both replicas (read back from each);
 *  2. after 3 AdamW steps on the same data, both replicas hold the same
 *     params and optimizer state, byte for byte, and they match the
 *     one-device run within 1e-6 of each tensor's largest entry (the same
 *     arithmetic: each gradient is g0 + g1 either way; measured: equal);
 *  3. with DUET_DP_DROP=0 (bucket 0 never all-reduced) replica 1's params
 *     differ from replica 0's after a step: duet_session_read_replica reads
 *     replica 1's own memory, so the equality of 2 is a real check;
 *  4. a replica out of range is an error.
 * Exits 1 on a failure. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static const char *model =
    "model dp_tiny\n"
    "input x: f32[batch, 6]\n"
    "input y: i32[batch]\n"
    "block linear(h, out) {\n"
    "  param w: [dim(h, -1), out] = kaiming_uniform\n"
    "  param b: [out] = zeros\n"
    "  return h @ w + b\n"
    "}\n"
    "h = relu(linear(x, 8))\n"
    "loss = cross_entropy(linear(h, 3), y)\n"
    "train {\n"
    "  batch = 8\n"
    "  optimizer = adamw(lr = 0.01)\n"
    "}\n";

static int fails;

/* Tensor id's bytes of replica r of s (malloc'ed). */
static void *bytes_of(DuetSession *s, int r, int id, size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p || duet_session_read_replica(s, r, id, 0, p, n)) {
    printf("FAIL reading tensor %d of replica %d: %s\n", id, r, p ? duet_session_error(s) : "out of memory");
    exit(1);
  }
  return p;
}

static void train(TModel *t, int steps) {
  for (int k = 0; k < steps; k++)
    if (duet_session_run(t->s, DUET_RUN_TRAIN)) {
      printf("FAIL step %d: %s\n", k + 1, duet_session_error(t->s));
      exit(1);
    }
}

/* Replicas 0 and 1 of d against each other (want_same) and, when ref is
 * given, replica 0 against ref's tensor of the same name. */
static int compare(TModel *d, TModel *ref, bool want_same, const char *what) {
  const DuetProgram *p = &d->cp->prog;
  int differ = 0;
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *t = &p->tensors[i];
    if (t->region != DUET_MEM_PARAM && t->region != DUET_MEM_STATE) continue;
    size_t n = (size_t)t->nbytes;
    float *a = bytes_of(d->s, 0, i, n), *b = bytes_of(d->s, 1, i, n);
    bool same = !memcmp(a, b, n);
    differ += !same;
    if (want_same && !same) {
      printf("FAIL %s: tensor %s differs between the replicas\n", what, t->name);
      fails++;
    }
    for (int j = 0; ref && j < ref->cp->prog.n_tensors; j++) {
      if (strcmp(ref->cp->prog.tensors[j].name, t->name)) continue;
      float *r = bytes_of(ref->s, 0, j, n);
      char nm[200];
      snprintf(nm, sizeof nm, "%s: %s against one device", what, t->name);
      fails += check_normwise(nm, a, r, (int64_t)(n / sizeof(float)), 1e-6, 0, NULL);
      free(r);
    }
    free(a);
    free(b);
  }
  return differ;
}

int main(void) {
  TModel one, dp, drop;
  FrontendOptions mb = {.micro_batches = 2}, rep = {.replicas = 2};
  if (tmodel_open_prec(&one, "dp_tiny.model", model, &mb, NULL) || tmodel_open_prec(&dp, "dp_tiny.model", model, &rep, NULL))
    return 1;
  if (duet_session_replicas(dp.s) != 2 || duet_session_replicas(one.s) != 1) {
    printf("FAIL replicas: %d and %d, expected 2 and 1\n", duet_session_replicas(dp.s), duet_session_replicas(one.s));
    return 1;
  }
  DuetRng r1, r2;
  duet_rng_seed(&r1, 7, 0);
  duet_rng_seed(&r2, 7, 0);
  tmodel_fill(&one, one.s, &r1, 3);
  tmodel_fill(&dp, dp.s, &r2, 3);
  /* 1. writes reach both replicas */
  if (compare(&dp, NULL, true, "after the writes") == 0) printf("ok writes reach both replicas\n");
  /* 2. three steps */
  train(&one, 3);
  train(&dp, 3);
  if (compare(&dp, &one, true, "after 3 steps") == 0 && !fails)
    printf("ok after 3 steps the replicas are bit-identical and match one device with 2 micro-batches\n");
  /* 3. a dropped bucket: the replicas drift, and the reads see it */
  setenv("DUET_DP_DROP", "0", 1);
  if (tmodel_open_prec(&drop, "dp_tiny.model", model, &rep, NULL)) return 1;
  unsetenv("DUET_DP_DROP");
  duet_rng_seed(&r2, 7, 0);
  tmodel_fill(&drop, drop.s, &r2, 3);
  train(&drop, 1);
  int d = compare(&drop, NULL, false, "DUET_DP_DROP=0");
  if (d > 0) printf("ok with bucket 0 dropped, %d tensors differ between the replicas\n", d);
  else {
    printf("FAIL with bucket 0 dropped, the replicas read the same: duet_session_read_replica cannot tell them apart\n");
    fails++;
  }
  /* 4. out of range */
  float x;
  if (!duet_session_read_replica(dp.s, 2, 0, 0, &x, sizeof x) || !strstr(duet_session_error(dp.s), "replica 2 of a program of 2")) {
    printf("FAIL replica 2: %s\n", duet_session_error(dp.s));
    fails++;
  } else {
    printf("ok replica 2: %s\n", duet_session_error(dp.s));
  }
  tmodel_close(&drop);
  tmodel_close(&dp);
  tmodel_close(&one);
  printf("%s\n", fails ? "FAILED" : "all passed");
  return fails != 0;
}
