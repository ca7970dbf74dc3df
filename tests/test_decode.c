/* tests/test_decode.c: generation with key/value caches computes the same
 * logits as the full forward pass.  The tiny GPT is compiled twice with the
 * same weights: once normally with batch 1 (one forward over a whole window)
 * and once for decoding (one token per run, attention over cached keys and
 * values).  After feeding tokens 0..i one at a time, the decoder's logits
 * must equal row i of the full pass (atol 1e-5, rtol 1e-4: the same
 * arithmetic in a different order), for every i, including a second pass
 * over the same positions (caches overwritten in place). */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

int main(void) {
  char *src = slurp(DUET_SOURCE_DIR "/tests/models/gpt_tiny.model");
  TModel full, dec;
  FrontendOptions f1 = {.batch = 1}, f2 = {.batch = 1, .decode = true};
  if (!src || tmodel_open_opt(&full, "gpt_tiny.model", src, &f1) || tmodel_open_opt(&dec, "gpt_tiny.model", src, &f2))
    return 1;
  /* the decoder's params := the full model's (random init, seed 1) */
  for (int i = 0; i < full.g->n_values; i++) {
    Value *v = full.g->values[i];
    if (v->op != OP_PARAM) continue;
    Value *w = tmodel_param(&dec, v->attr.name);
    if (!w) {
      fprintf(stderr, "FAIL: decoder lacks %s\n", v->attr.name);
      return 1;
    }
    memcpy(duet_session_tensor(dec.s, tmodel_tensor(&dec, w)), duet_session_tensor(full.s, tmodel_tensor(&full, v)),
           dtype_size(v->dtype) * (size_t)shape_numel(&v->shape));
  }
  const DuetProgram *pf = &full.cp->prog, *pd = &dec.cp->prog;
  int64_t T = pf->tensors[pf->input_x].shape[1], V = pf->n_classes;
  if (!pd->decode || pd->context != T) {
    fprintf(stderr, "FAIL: decode program has context %lld, want %lld\n", (long long)pd->context, (long long)T);
    return 1;
  }
  const char *text = "In the beginning";
  int32_t *x = duet_session_tensor(full.s, pf->input_x);
  for (int64_t t = 0; t < T; t++) x[t] = (unsigned char)text[t % 16];
  duet_session_set_valid(full.s, 1);
  if (duet_session_run(full.s, DUET_RUN_EVAL)) return 1;
  const float *ref = duet_session_tensor(full.s, pf->logits);
  int fails = 0, checks = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int64_t i = 0; i < T; i++) {
      *(int32_t *)duet_session_tensor(dec.s, pd->input_x) = x[i];
      duet_session_set_pos(dec.s, i);
      duet_session_set_valid(dec.s, 1);
      if (duet_session_run(dec.s, DUET_RUN_EVAL)) return 1;
      const float *got = duet_session_tensor(dec.s, pd->logits);
      for (int64_t v = 0; v < V; v++) {
        char what[96];
        snprintf(what, sizeof what, "pass %d position %lld logit %lld", pass, (long long)i, (long long)v);
        fails += check_close(what, got[v], ref[i * V + v], 1e-5, 1e-4);
        checks++;
      }
    }
  printf("%d logits compared\n%d passed, %d failed\n", checks, fails ? 0 : 1, fails ? 1 : 0);
  tmodel_close(&full);
  tmodel_close(&dec);
  free(src);
  return fails != 0;
}
