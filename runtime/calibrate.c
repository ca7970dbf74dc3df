/* runtime/calibrate.c: activation scales of the int8 GEMMs (--quantize
 * int8 --calibrate N; passes/quantize.c makes the program), calibrated on
 * the first N batches of the training split before the evaluation.  The
 * method (symmetric per-tensor int8 activations, scale max|x| / 127 from a
 * calibration set, values beyond the range clamped) is the min-max
 * calibration of post-training static quantization (Jacob et al. 2018;
 * PyTorch's MinMaxObserver with a symmetric qscheme, here with [-127, 127]
 * as duet's weights).  Formulas at duet_calibrate in duet_rt.h. */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "duet_rt.h"

/* max|x| / 127 as duet_quantize_i8 makes a weight scale: 1 for 0 (and
 * NaN), FLT_MIN below it. */
static float act_scale_of(float m) {
  if (isnan(m) || m == 0) return 1;
  float s = m / 127.0f;
  return s < FLT_MIN ? FLT_MIN : s;
}

int duet_calibrate(DuetSession *s, const DuetProgram *p, const DuetConfig *cfg, FILE *out, char *err, size_t errlen) {
  int n = 0, unset = 0, rc = -1;
  for (int i = 0; i < p->n_tensors; i++) {
    if (!duet_is_act_scale(p, i)) continue;
    float v = 0;
    if (duet_session_read(s, i, 0, &v, sizeof v)) {
      snprintf(err, errlen, "calibration: cannot read %s: %s", p->tensors[i].name, duet_session_error(s));
      return -1;
    }
    n++;
    unset += !(v > 0);
  }
  if (!n || !unset) return 0; /* no int8 activations, or scales the checkpoint holds */
  int64_t N = cfg->calibrate;
  if (N <= 0) {
    snprintf(err, errlen, "this program quantizes activations (compiled with --calibrate) but has no calibration "
                          "batches: give --calibrate N");
    return -1;
  }
  if (cfg->data != DUET_DATA_FASHION_MNIST || p->input_x < 0 || p->input_y < 0 ||
      p->tensors[p->input_x].dtype != DUET_F32 || p->tensors[p->input_y].dtype != DUET_I32) {
    snprintf(err, errlen, "--calibrate reads Fashion-MNIST image data (f32 images, i32 labels); this model's data "
                          "or inputs are of another kind");
    return -1;
  }
  /* N batches of the model's batch (defaults.batch) whatever the layout:
   * a pipelined or data-parallel program's input tensors hold one
   * micro-batch, and the session takes the whole batch (as duet_evaluate) */
  const DuetTensor *xt = &p->tensors[p->input_x];
  int64_t B = p->defaults.batch > 0 ? p->defaults.batch : xt->shape[0],
          px = xt->nbytes / 4 / (xt->shape[0] > 0 ? xt->shape[0] : 1);
  DuetDataset ds = {0};
  char ip[4096], lp[4096];
  snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte.gz", cfg->data_path);
  snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte.gz", cfg->data_path);
  if (duet_load_idx(&ds, ip, lp, err, errlen)) return -1;
  float zero = 0;
  if ((int64_t)ds.rows * ds.cols != px) {
    snprintf(err, errlen, "calibration: the data has %d pixels per image, the model's input takes %" PRId64,
             ds.rows * ds.cols, px);
    goto out;
  }
  if (cfg->train_subset > 0 && cfg->train_subset < ds.n) { /* --train-subset K: the first K images only */
    if (N > cfg->train_subset / B) {
      snprintf(err, errlen, "--calibrate %" PRId64 ": the training subset (--train-subset %" PRId64 ") holds %"
               PRId64 " whole batches of %" PRId64 " images", N, cfg->train_subset, cfg->train_subset / B, B);
      goto out;
    }
  } else if (N > ds.n / B) {
    snprintf(err, errlen, "--calibrate %" PRId64 ": the training split holds %" PRId64 " whole batches of %" PRId64
             " images", N, ds.n / B, B);
    goto out;
  }
  for (int i = 0; i < p->n_tensors; i++) /* from 0: the GEMMs record -max|x| while their scale is <= 0 */
    if (duet_is_act_scale(p, i) && duet_session_write(s, i, 0, &zero, sizeof zero)) goto dev;
  duet_session_set_valid(s, B);
  for (int64_t b = 0; b < N; b++) {
    int32_t *lab = malloc((size_t)B * sizeof *lab);
    if (!lab) {
      snprintf(err, errlen, "calibration: out of host memory");
      goto out;
    }
    for (int64_t j = 0; j < B; j++) lab[j] = ds.labels[b * B + j] >= 0 ? ds.labels[b * B + j] : 0;
    int bad = duet_session_write(s, p->input_x, 0, ds.images + b * B * px, (size_t)(B * px) * sizeof(float)) ||
              duet_session_write(s, p->input_y, 0, lab, (size_t)B * sizeof *lab) || duet_session_run(s, DUET_RUN_EVAL);
    free(lab);
    if (bad) goto dev;
  }
  if (out)
    fprintf(out, "duet: activation scales (max|x| / 127 over the first %" PRId64 " training batches of %" PRId64
            "):", N, B);
  for (int i = 0; i < p->n_tensors; i++) {
    if (!duet_is_act_scale(p, i)) continue;
    float v;
    if (duet_session_read(s, i, 0, &v, sizeof v)) goto dev;
    float m = -v, sc = act_scale_of(m);
    if (duet_session_write(s, i, 0, &sc, sizeof sc)) goto dev;
    if (out) fprintf(out, " %s %.9g (max|x| %.9g)", p->tensors[i].name, sc, m);
  }
  if (out) fprintf(out, "\n");
  rc = 0;
  goto out;
dev:
  snprintf(err, errlen, "calibration failed: %s", duet_session_error(s));
out:
  duet_dataset_free(&ds);
  return rc;
}
