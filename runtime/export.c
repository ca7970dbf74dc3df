/* runtime/export.c: a checkpoint's params as a plain safetensors state dict
 * (duet export). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "duet_half.h"
#include "duet_rt.h"

int duet_export_weights(const DuetProgram *p, const char *ckpt, const char *out, char *err, size_t errlen) {
  int64_t step;
  if (duet_checkpoint_check_weights(p, ckpt, &step, err, errlen)) return -1;
  char e2[1024];
  DuetStFile *f = duet_st_open(ckpt, e2, sizeof e2);
  if (!f) {
    snprintf(err, errlen, "cannot load the checkpoint: %s", e2);
    return -1;
  }
  int n = 0, rc = -1;
  DuetShrinkKept *kept = NULL;
  void *gathered = NULL;
  for (int i = 0; i < p->n_tensors; i++) n += p->tensors[i].region == DUET_MEM_PARAM;
  DuetStTensor *t = calloc((size_t)(n ? n : 1), sizeof *t);
  float **bufs = calloc((size_t)(n ? n : 1), sizeof *bufs);
  if (!t || !bufs) {
    snprintf(err, errlen, "out of host memory");
    goto out;
  }
  if (p->shrink && !(kept = duet_shrink_kept(p, f, ckpt, err, errlen))) goto out;
  int k = 0;
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *x = &p->tensors[i];
    if (x->region != DUET_MEM_PARAM) continue;
    const DuetStTensor *y = duet_st_find(f, x->name); /* present with x's dtype and shape: checked */
    DuetStTensor ys;
    if (duet_shrink_touches(p, kept, i)) { /* --shrink: the kept channels, x's shape; a folded bias */
      free(gathered);
      if (!(gathered = malloc((size_t)x->nbytes + 8)) || duet_shrink_gather(p, kept, i, y, gathered)) {
        snprintf(err, errlen, "cannot export %s: shrinking `%s` failed", ckpt, x->name);
        goto out;
      }
      ys = *y;
      ys.data = gathered;
      ys.nbytes = x->nbytes;
      memcpy(ys.shape, x->shape, sizeof ys.shape);
      y = &ys;
    }
    int sz = y->dtype == DUET_F64 ? 8 : y->dtype == DUET_F32 ? 4 : 2;
    int64_t ne = y->nbytes / sz;
    float *b = bufs[k] = malloc((size_t)(ne ? ne : 1) * sizeof *b);
    if (!b) {
      snprintf(err, errlen, "out of host memory");
      goto out;
    }
    const unsigned char *src = y->data;
    for (int64_t e = 0; e < ne; e++) {
      if (y->dtype == DUET_F32) {
        memcpy(&b[e], src + 4 * e, 4);
      } else if (y->dtype == DUET_F64) {
        double d;
        memcpy(&d, src + 8 * e, 8);
        b[e] = (float)d;
      } else {
        uint16_t h = (uint16_t)(src[2 * e] | src[2 * e + 1] << 8);
        b[e] = y->dtype == DUET_F16 ? duet_f32_from_f16(h) : duet_f32_from_bf16(h);
      }
    }
    int64_t first;
    int nan;
    int64_t bad = duet_count_nonfinite(DUET_F32, b, ne * 4, &first, &nan);
    if (bad) {
      snprintf(err, errlen, "cannot export %s: tensor `%s` holds %" PRId64 " non-finite value%s (element %" PRId64
               " is %s)", ckpt, x->name, bad, bad == 1 ? "" : "s", first, nan ? "NaN" : "infinite");
      goto out;
    }
    t[k] = (DuetStTensor){.name = x->name, .dtype = DUET_F32, .rank = x->rank, .data = b, .nbytes = ne * 4};
    memcpy(t[k].shape, x->shape, sizeof t[k].shape);
    k++;
  }
  char step_s[32];
  snprintf(step_s, sizeof step_s, "%" PRId64, step);
  const char *meta[] = {"format", DUET_WEIGHTS_FORMAT, "model", p->model_name, "step", step_s};
  if (duet_st_save(out, t, k, meta, 3, e2, sizeof e2)) {
    snprintf(err, errlen, "%s", e2);
    goto out;
  }
  rc = 0;
out:
  free(gathered);
  duet_shrink_kept_free(kept);
  for (int i = 0; bufs && i < n; i++) free(bufs[i]);
  free(bufs);
  free(t);
  duet_st_close(f);
  return rc;
}
