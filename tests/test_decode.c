/* tests/test_decode.c: generation with key/value caches computes the same
 * logits as the full forward pass.  Each model (the tiny GPT, and the tiny
 * LLaMA of rotary embeddings, whose angles follow the decoding position,
 * and grouped-query attention, whose caches hold 2 key/value heads for 4
 * query heads) is compiled twice with the same weights: once normally with
 * batch 1 (one forward over a whole window) and once for decoding (one
 * token per run, attention over cached keys and values).  After feeding
 * tokens 0..i one at a time, the decoder's logits must equal row i of the
 * full pass (atol 1e-5, rtol 1e-4: the same arithmetic in a different
 * order), for every i, including a second pass over the same positions
 * (caches overwritten in place).  With arguments, a trained checkpoint's
 * greedy generation with and without the caches (greedy_model). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static int decode_model(const char *path) {
  char *src = slurp(path);
  TModel full, dec;
  FrontendOptions f1 = {.batch = 1}, f2 = {.batch = 1, .decode = true};
  if (!src || tmodel_open_opt(&full, path, src, &f1) || tmodel_open_opt(&dec, path, src, &f2)) {
    fprintf(stderr, "FAIL %s: does not compile\n", path);
    return 1;
  }
  /* the decoder's params := the full model's (random init, seed 1) */
  for (int i = 0; i < full.g->n_values; i++) {
    Value *v = full.g->values[i];
    if (v->op != OP_PARAM) continue;
    Value *w = tmodel_param(&dec, v->attr.name);
    if (!w) {
      fprintf(stderr, "FAIL %s: decoder lacks %s\n", path, v->attr.name);
      return 1;
    }
    memcpy(duet_session_tensor(dec.s, tmodel_tensor(&dec, w)), duet_session_tensor(full.s, tmodel_tensor(&full, v)),
           dtype_size(v->dtype) * (size_t)shape_numel(&v->shape));
  }
  const DuetProgram *pf = &full.cp->prog, *pd = &dec.cp->prog;
  int64_t T = pf->tensors[pf->input_x].shape[1], V = pf->n_classes;
  if (!pd->decode || pd->context != T) {
    fprintf(stderr, "FAIL %s: decode program has context %lld, want %lld\n", path, (long long)pd->context, (long long)T);
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
        char what[1200];
        snprintf(what, sizeof what, "%s: pass %d position %lld logit %lld", path, pass, (long long)i, (long long)v);
        fails += check_close(what, got[v], ref[i * V + v], 1e-5, 1e-4);
        checks++;
      }
    }
  printf("%s %s: %d logits compared\n", fails ? "FAIL" : "ok", path, checks);
  tmodel_close(&full);
  tmodel_close(&dec);
  free(src);
  return fails != 0;
}

/* test_decode MODEL CHECKPOINT PROMPT N: greedy generation of N bytes
 * after PROMPT (prompt + N <= the model's block) from a trained checkpoint,
 * twice: with the key/value caches (one decoding run per byte, as duet
 * sample does) and without them (the full forward pass over the whole
 * prefix, padded with zeros -- causal attention keeps the padding out of
 * the rows read -- for each byte: its logits at the prefix's last row).
 * The two must pick the same bytes, and at every generated position the
 * cached logits must equal the recomputed ones (atol 1e-5, rtol 1e-4).
 * Prints the recomputed text (prompt and bytes, a newline: duet sample
 * --temperature 0's output, which run_sample.sh compares), then a status
 * line on stderr with the smallest gap between the two largest logits. */
static int greedy_model(const char *path, const char *ck, const char *prompt, int64_t N) {
  char *src = slurp(path);
  TModel full, dec;
  FrontendOptions f1 = {.batch = 1}, f2 = {.batch = 1, .decode = true};
  char err[1200];
  if (!src || tmodel_open_opt(&full, path, src, &f1) || tmodel_open_opt(&dec, path, src, &f2)) {
    fprintf(stderr, "FAIL %s: does not compile\n", path);
    return 1;
  }
  if (duet_checkpoint_load_weights(full.s, ck, err, sizeof err) ||
      duet_checkpoint_load_weights(dec.s, ck, err, sizeof err)) {
    fprintf(stderr, "FAIL %s: %s\n", ck, err);
    return 1;
  }
  const DuetProgram *pf = &full.cp->prog, *pd = &dec.cp->prog;
  int64_t T = pf->tensors[pf->input_x].shape[1], V = pf->n_classes, P = (int64_t)strlen(prompt);
  if (P < 1 || P + N > T || V < 256) {
    fprintf(stderr, "FAIL: prompt of %lld bytes + %lld must fit the block of %lld\n", (long long)P, (long long)N,
            (long long)T);
    return 1;
  }
  int32_t *ctx = calloc((size_t)T, sizeof *ctx), *x = duet_session_tensor(full.s, pf->input_x);
  int fails = 0, checks = 0;
  double gap = INFINITY;
  for (int64_t i = 0; i < P; i++) ctx[i] = (unsigned char)prompt[i];
  int64_t n = P;
  for (int64_t i = 0; i < P - 1; i++) { /* prefill the caches */
    *(int32_t *)duet_session_tensor(dec.s, pd->input_x) = ctx[i];
    duet_session_set_pos(dec.s, i);
    duet_session_set_valid(dec.s, 1);
    if (duet_session_run(dec.s, DUET_RUN_EVAL)) return 1;
  }
  for (int64_t k = 0; k < N; k++, n++) {
    *(int32_t *)duet_session_tensor(dec.s, pd->input_x) = ctx[n - 1];
    duet_session_set_pos(dec.s, n - 1);
    duet_session_set_valid(dec.s, 1);
    for (int64_t t = 0; t < T; t++) x[t] = t < n ? ctx[t] : 0;
    duet_session_set_valid(full.s, 1);
    if (duet_session_run(dec.s, DUET_RUN_EVAL) || duet_session_run(full.s, DUET_RUN_EVAL)) return 1;
    const float *got = duet_session_tensor(dec.s, pd->logits);
    const float *ref = (const float *)duet_session_tensor(full.s, pf->logits) + (n - 1) * V;
    int64_t bg = 0, br = 0;
    for (int64_t v = 0; v < V; v++) {
      char what[1300];
      snprintf(what, sizeof what, "%s: generated byte %lld, logit %lld", path, (long long)k, (long long)v);
      fails += check_close(what, got[v], ref[v], 1e-5, 1e-4);
      checks++;
      if (got[v] > got[bg]) bg = v;
      if (ref[v] > ref[br]) br = v;
    }
    for (int64_t v = 0; v < V; v++)
      if (v != br && ref[br] - ref[v] < gap) gap = ref[br] - ref[v];
    if (bg != br) {
      fprintf(stderr, "FAIL %s: byte %lld: the cached run picks %lld, the recomputed one %lld\n", path, (long long)k,
              (long long)bg, (long long)br);
      fails++;
    }
    ctx[n] = (int32_t)(br > 255 ? '?' : br);
  }
  for (int64_t i = 0; i < n; i++) putchar(ctx[i]);
  putchar('\n');
  fprintf(stderr, "%s %s: %lld greedy bytes alike with and without the caches, %d logits compared; smallest gap "
          "between the two largest logits %.3g\n", fails ? "FAIL" : "ok", path, (long long)N, checks, gap);
  free(ctx);
  tmodel_close(&full);
  tmodel_close(&dec);
  free(src);
  return fails != 0;
}

int main(int argc, char **argv) {
  static const char *const models[] = {DUET_SOURCE_DIR "/tests/models/gpt_tiny.model",
                                       DUET_SOURCE_DIR "/tests/models/llama_tiny.model"};
  if (argc == 5) return greedy_model(argv[1], argv[2], argv[3], strtoll(argv[4], NULL, 10));
  int failed = 0;
  for (int i = 0; i < 2; i++) failed += decode_model(models[i]);
  printf("%d passed, %d failed\n", 2 - failed, failed);
  return failed != 0;
}
