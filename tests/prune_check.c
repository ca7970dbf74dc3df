/* tests/prune_check.c: checks the pruning of a checkpoint (a duet_run
 * --save file), for tests/run_prune.sh.
 *
 *   prune_check CK [--sparsity S] [--nm N:M] [--channels] [--global S] [--masks K] [--weight-zeros]
 *
 * For every mask `P.mask` of CK (f32): each entry is 0 or 1; where it is 0
 * the param P and each of its optimizer states present (P.exp_avg,
 * P.exp_avg_sq, P.momentum_buffer) are +0.0, bit for bit (the "regrowth"
 * check: momentum and weight decay must not have moved a pruned weight or
 * left state behind).  Options add:
 *   --sparsity S  each mask prunes exactly round(S x n) entries (round half
 *                 to even, as runtime/prune.c documents); with --channels,
 *                 round(S x channels) whole channels
 *   --global S    all masks together prune exactly round(S x total)
 *   --nm N:M      every group of M consecutive inputs keeps exactly N:
 *                 a rank-2 weight [in, out] (x @ w) along axis 0, a rank-4
 *                 convolution weight [out, in, kh, kw] along its
 *                 flattened in x kh x kw
 *   --channels    every output channel (a column of [in, out], a filter of
 *                 [out, ...]) is all 0 or all 1
 *   --masks K     there are exactly K masks
 *   --weight-zeros  each pruned param holds exactly as many zeros (+0.0 or
 *                 -0.0) as its mask prunes: no weight the mask keeps is 0
 *                 (a trained f32 weight is 0 by chance with negligible
 *                 probability), so the saved weights' own count of zeros
 *                 is the sparsity
 * Prints one line per mask (name, zeros, entries) and "ok"; exits 1 with
 * the first violation of each kind. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/duet_rt.h"

static int64_t numel(const DuetStTensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->rank; d++) n *= t->shape[d];
  return n;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: prune_check CK [--sparsity S] [--global S] [--nm N:M] [--channels] [--masks K] "
                    "[--weight-zeros]\n");
    return 2;
  }
  double sparsity = -1, global = -1;
  int nm_n = 0, nm_m = 0, channels = 0, want_masks = -1, weight_zeros = 0;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--sparsity") && i + 1 < argc) sparsity = atof(argv[++i]);
    else if (!strcmp(argv[i], "--global") && i + 1 < argc) global = atof(argv[++i]);
    else if (!strcmp(argv[i], "--nm") && i + 1 < argc && sscanf(argv[++i], "%d:%d", &nm_n, &nm_m) == 2) continue;
    else if (!strcmp(argv[i], "--channels")) channels = 1;
    else if (!strcmp(argv[i], "--weight-zeros")) weight_zeros = 1;
    else if (!strcmp(argv[i], "--masks") && i + 1 < argc) want_masks = atoi(argv[++i]);
    else {
      fprintf(stderr, "prune_check: bad argument '%s'\n", argv[i]);
      return 2;
    }
  }
  char err[1024];
  DuetStFile *f = duet_st_open(argv[1], err, sizeof err);
  if (!f) {
    fprintf(stderr, "prune_check: %s\n", err);
    return 1;
  }
  int fails = 0, masks = 0;
  int64_t all_zero = 0, all_n = 0;
  for (int i = 0; i < duet_st_count(f); i++) {
    const DuetStTensor *m = duet_st_get(f, i);
    size_t len = strlen(m->name);
    if (len < 6 || strcmp(m->name + len - 5, ".mask")) continue;
    masks++;
    char pname[512];
    snprintf(pname, sizeof pname, "%.*s", (int)(len - 5), m->name);
    const DuetStTensor *p = duet_st_find(f, pname);
    if (!p || p->dtype != DUET_F32 || m->dtype != DUET_F32 || p->nbytes != m->nbytes) {
      printf("FAIL %s: no f32 param `%s` of its size\n", m->name, pname);
      fails++;
      continue;
    }
    const float *mv = m->data, *pv = p->data;
    int64_t n = numel(m), zeros = 0;
    const float *st[3] = {NULL, NULL, NULL};
    const char *sn[3] = {"exp_avg", "exp_avg_sq", "momentum_buffer"};
    for (int k = 0; k < 3; k++) {
      char nm[600];
      snprintf(nm, sizeof nm, "%s.%s", pname, sn[k]);
      const DuetStTensor *t = duet_st_find(f, nm);
      if (t && t->dtype == DUET_F32 && t->nbytes == m->nbytes) st[k] = t->data;
    }
    int bad_mask = 0, regrown = 0;
    for (int64_t e = 0; e < n; e++) {
      if (mv[e] != 0 && mv[e] != 1) {
        if (!bad_mask++) printf("FAIL %s: entry %lld is %g, not 0 or 1\n", m->name, (long long)e, mv[e]);
        continue;
      }
      if (mv[e] != 0) continue;
      zeros++;
      uint32_t b;
      memcpy(&b, &pv[e], 4);
      if (b && !regrown++) printf("FAIL %s: pruned weight %lld is %a, not +0.0\n", pname, (long long)e, pv[e]);
      for (int k = 0; k < 3; k++) {
        if (!st[k]) continue;
        memcpy(&b, &st[k][e], 4);
        if (b && !regrown++) printf("FAIL %s.%s: entry %lld of a pruned weight is %a, not +0.0\n", pname, sn[k],
                                    (long long)e, st[k][e]);
      }
    }
    fails += bad_mask > 0;
    fails += regrown > 0;
    if (weight_zeros) {
      int64_t wz = 0;
      for (int64_t e = 0; e < n; e++) wz += pv[e] == 0;
      printf("%s %lld of %lld weights are 0\n", pname, (long long)wz, (long long)n);
      if (wz != zeros) {
        printf("FAIL %s: %lld weights are 0, its mask prunes %lld\n", pname, (long long)wz, (long long)zeros);
        fails++;
      }
    }
    all_zero += zeros;
    all_n += n;
    printf("%s %lld of %lld pruned (%.4f)\n", m->name, (long long)zeros, (long long)n, (double)zeros / (double)n);
    /* the matrix view: out_n channels of in_n inputs, element o * os + i * is */
    int64_t out_n, os, in_n, is;
    if (m->rank == 4) out_n = m->shape[0], in_n = n / out_n, os = in_n, is = 1;
    else out_n = m->shape[m->rank - 1], in_n = n / out_n, os = 1, is = out_n;
    /* exact counts: round(S x n) weights, or round(S x out_n) whole channels */
    int64_t want = channels ? (int64_t)nearbyint(sparsity * (double)out_n) * in_n : (int64_t)nearbyint(sparsity * (double)n);
    if (sparsity >= 0 && zeros != want) {
      printf("FAIL %s: %lld pruned, want %lld (sparsity %g of %lld %s)\n", m->name, (long long)zeros, (long long)want,
             sparsity, (long long)(channels ? out_n : n), channels ? "channels" : "weights");
      fails++;
    }
    if (nm_m > 0) {
      int64_t bad = 0;
      if (in_n % nm_m) bad = 1;
      for (int64_t o = 0; o < out_n && !bad; o++)
        for (int64_t g = 0; g + nm_m <= in_n; g += nm_m) {
          int kept = 0;
          for (int r = 0; r < nm_m; r++) kept += mv[o * os + (g + r) * is] != 0;
          if (kept != nm_n && !bad++)
            printf("FAIL %s: channel %lld, inputs %lld..%lld keep %d, not %d\n", m->name, (long long)o, (long long)g,
                   (long long)(g + nm_m - 1), kept, nm_n);
        }
      fails += bad > 0;
    }
    if (channels) {
      int64_t bad = 0;
      for (int64_t o = 0; o < out_n && !bad; o++)
        for (int64_t k = 1; k < in_n; k++)
          if (mv[o * os + k * is] != mv[o * os]) {
            printf("FAIL %s: channel %lld is partly pruned (input %lld)\n", m->name, (long long)o, (long long)k);
            bad = 1;
            break;
          }
      fails += bad > 0;
    }
  }
  if (global >= 0 && all_zero != (int64_t)nearbyint(global * (double)all_n)) {
    printf("FAIL global: %lld of %lld pruned, want round(%g x %lld)\n", (long long)all_zero, (long long)all_n, global,
           (long long)all_n);
    fails++;
  }
  if (want_masks >= 0 && masks != want_masks) {
    printf("FAIL %d masks, want %d\n", masks, want_masks);
    fails++;
  }
  if (!masks) {
    printf("FAIL no masks in %s\n", argv[1]);
    fails++;
  }
  duet_st_close(f);
  if (!fails) printf("ok\n");
  return fails ? 1 : 0;
}
