/* runtime/sample.c: text generation from a trained byte-level model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "duet_rt.h"

int duet_sample(DuetSession *s, const char *prompt, int64_t n_tokens, double temperature, int64_t top_k,
                uint64_t seed, FILE *out, char *err, size_t errlen) {
  const DuetProgram *p = duet_session_program(s);
  DuetDevice *d = duet_session_device(s);
  if (p->input_x < 0 || p->logits < 0 || p->n_classes < 256 || p->tensors[p->input_x].rank != 2 ||
      p->tensors[p->input_x].dtype != DUET_I32 || p->tensors[p->input_x].shape[0] != 1) {
    snprintf(err, errlen, "model `%s` is not a byte-level language model over i32[1, T] windows", p->model_name);
    return -1;
  }
  int64_t T = p->tensors[p->input_x].shape[1], V = p->n_classes;
  size_t plen = strlen(prompt);
  unsigned char *ctx = malloc(plen + (size_t)n_tokens + 2);
  int32_t *x = malloc((size_t)T * sizeof *x);
  float *logits = malloc((size_t)(T * V) * sizeof *logits);
  double *prob = malloc((size_t)V * sizeof *prob);
  int rc = -1;
  if (!ctx || !x || !logits || !prob) {
    snprintf(err, errlen, "out of host memory");
    goto out;
  }
  size_t n = plen;
  memcpy(ctx, prompt, plen);
  if (n == 0) ctx[n++] = '\n'; /* an empty prompt starts a new line */
  fputs(prompt, out);
  DuetRng r;
  duet_rng_seed(&r, seed, 0x73616d706c65ull); /* "sample" */
  int32_t *dev_x = duet_session_tensor(s, p->input_x);
  int32_t *dev_y = p->input_y >= 0 ? duet_session_tensor(s, p->input_y) : NULL;
  for (int64_t k = 0; k < n_tokens; k++) {
    int64_t w = (int64_t)n < T ? (int64_t)n : T; /* the last T bytes */
    for (int64_t t = 0; t < T; t++) x[t] = t < w ? ctx[n - (size_t)w + (size_t)t] : 0;
    if (d->ops->copy_to_device(d, dev_x, x, (size_t)T * sizeof *x)) goto dev_fail;
    if (dev_y) {
      memset(x, 0, (size_t)T * sizeof *x);
      if (d->ops->copy_to_device(d, dev_y, x, (size_t)T * sizeof *x)) goto dev_fail;
    }
    duet_session_set_valid(s, 1);
    if (duet_session_run(s, DUET_RUN_EVAL)) {
      snprintf(err, errlen, "%s", duet_session_error(s));
      goto out;
    }
    if (d->ops->copy_to_host(d, logits, duet_session_tensor(s, p->logits), (size_t)(T * V) * sizeof *logits))
      goto dev_fail;
    const float *row = logits + (w - 1) * V; /* the prediction after the last byte */
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
      if (row[v] > row[best]) best = v;
    int64_t pick = best;
    if (temperature > 0) {
      /* keep the top_k largest logits: the k-th largest is the threshold */
      double thr = -INFINITY;
      if (top_k > 0 && top_k < V) {
        for (int64_t v = 0; v < V; v++) prob[v] = row[v];
        for (int64_t i = 0; i < top_k; i++) { /* partial selection, V is small */
          int64_t m = i;
          for (int64_t j = i + 1; j < V; j++)
            if (prob[j] > prob[m]) m = j;
          double t = prob[i];
          prob[i] = prob[m];
          prob[m] = t;
        }
        thr = prob[top_k - 1];
      }
      double sum = 0;
      for (int64_t v = 0; v < V; v++) {
        prob[v] = row[v] >= thr ? exp(((double)row[v] - row[best]) / temperature) : 0;
        sum += prob[v];
      }
      double u = duet_rng_uniform(&r) * sum, acc = 0;
      for (int64_t v = 0; v < V; v++) {
        acc += prob[v];
        if (prob[v] > 0 && u < acc) {
          pick = v;
          break;
        }
      }
    }
    if (pick > 255) pick = '?';
    ctx[n++] = (unsigned char)pick;
    fputc((int)pick, out);
    fflush(out);
  }
  fputc('\n', out);
  rc = 0;
  goto out;
dev_fail:
  snprintf(err, errlen, "device copy failed: %s", d->err);
out:
  free(ctx);
  free(x);
  free(logits);
  free(prob);
  return rc;
}
