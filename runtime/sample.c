#define _POSIX_C_SOURCE 200809L /* clock_gettime, fsync, fdopen */
/* runtime/sample.c: text generation from a trained byte-level model. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "duet_rt.h"

/* Runs the decoding program on byte `tok` at position `pos` (its key and
 * value enter the caches at row pos). */
static int decode_step(DuetSession *s, const DuetProgram *p, int tok, int64_t pos, char *err, size_t errlen) {
  int32_t x = tok, zero = 0;
  if (duet_session_write(s, p->input_x, 0, &x, sizeof x) ||
      (p->input_y >= 0 && duet_session_write(s, p->input_y, 0, &zero, sizeof zero))) {
    snprintf(err, errlen, "device copy failed: %s", duet_session_error(s));
    return -1;
  }
  duet_session_set_pos(s, pos);
  duet_session_set_valid(s, 1);
  if (duet_session_run(s, DUET_RUN_EVAL)) {
    snprintf(err, errlen, "%s", duet_session_error(s));
    return -1;
  }
  return 0;
}

int duet_sample_check(const DuetProgram *p, char *err, size_t errlen) {
  if (!p->decode || p->input_x < 0 || p->logits < 0 || p->n_classes < 256 || p->context < 2 ||
      p->defaults.data != DUET_DATA_TEXT || p->tensors[p->input_x].dtype != DUET_I32 ||
      p->tensors[p->input_x].nbytes != 4) {
    snprintf(err, errlen, "model `%s` is not a byte-level language model compiled for generation", p->model_name);
    return -1;
  }
  int64_t V = p->n_classes;
  if (p->tensors[p->logits].nbytes != V * 4) {
    snprintf(err, errlen, "model `%s` computes %lld logits per generated token, expected %lld: its positional "
             "embedding must follow the token's position, as in embedding(wpe, positions(idx))",
             p->model_name, (long long)(p->tensors[p->logits].nbytes / 4), (long long)V);
    return -1;
  }
  return 0;
}

int duet_sample(DuetSession *s, const char *prompt, int64_t n_tokens, double temperature, int64_t top_k,
                uint64_t seed, FILE *out, char *err, size_t errlen) {
  const DuetProgram *p = duet_session_program(s);
  if (duet_sample_check(p, err, errlen)) return -1;
  int64_t V = p->n_classes, T = p->context;
  size_t plen = strlen(prompt);
  unsigned char *ctx = malloc(plen + (size_t)n_tokens + 2);
  float *logits = malloc((size_t)V * sizeof *logits);
  double *prob = malloc((size_t)V * sizeof *prob);
  int rc = -1;
  if (!ctx || !logits || !prob) { /* the text is kept whole: prompt + tokens bytes */
    snprintf(err, errlen, "out of host memory for %zu bytes of text (%" PRId64 " tokens after a %zu-byte prompt)",
             plen + (size_t)n_tokens + 2, n_tokens, plen);
    goto out;
  }
  size_t n = plen;
  memcpy(ctx, prompt, plen);
  if (n == 0) ctx[n++] = '\n'; /* an empty prompt starts a new line */
  fputs(prompt, out);
  DuetRng r;
  duet_rng_seed(&r, seed, 0x73616d706c65ull); /* "sample" */
  /* prefill: the last T - 1 prompt bytes, one decoding step each */
  size_t first = n > (size_t)T - 1 ? n - ((size_t)T - 1) : 0;
  int64_t pos = 0;
  for (size_t i = first; i < n; i++, pos++)
    if (decode_step(s, p, ctx[i], pos, err, errlen)) goto out;
  for (int64_t k = 0; k < n_tokens; k++) {
    if (duet_session_read(s, p->logits, 0, logits, (size_t)V * sizeof *logits)) {
      snprintf(err, errlen, "device copy failed: %s", duet_session_error(s));
      goto out;
    }
    int64_t best = 0, pick;
    for (int64_t v = 1; v < V; v++)
      if (logits[v] > logits[best]) best = v;
    pick = best;
    if (temperature > 0) {
      /* keep the top_k largest logits: the k-th largest is the threshold */
      double thr = -INFINITY;
      if (top_k > 0 && top_k < V) {
        for (int64_t v = 0; v < V; v++) prob[v] = logits[v];
        for (int64_t i = 0; i < top_k; i++) { /* partial selection sort, V is small */
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
        prob[v] = logits[v] >= thr ? exp(((double)logits[v] - logits[best]) / temperature) : 0;
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
    if (k + 1 == n_tokens) break;
    if (pos == T) { /* the caches are full: restart from the last T/2 bytes */
      pos = 0;
      for (size_t i = n - (size_t)(T / 2); i < n - 1; i++, pos++)
        if (decode_step(s, p, ctx[i], pos, err, errlen)) goto out;
    }
    if (decode_step(s, p, (int)pick, pos++, err, errlen)) goto out;
  }
  fputc('\n', out);
  rc = 0;
out:
  free(ctx);
  free(logits);
  free(prob);
  return rc;
}
