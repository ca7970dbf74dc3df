/* runtime/quant.c: int8 weights of a quantized program (passes/quantize.c
 * makes the program; here the f32 weights of a checkpoint become its int8
 * weights and scales).  Formulas at duet_quantize_i8 in duet_rt.h. */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "duet_rt.h"

int duet_quantize_i8(const float *w, int rank, const int64_t *shape, const int64_t *sshape, signed char *q,
                     float *scale) {
  if (rank < 1 || rank > DUET_MAX_RANK) return -1;
  int64_t n = 1, ns = 1, sstride[DUET_MAX_RANK];
  for (int d = 0; d < rank; d++) {
    if (shape[d] < 1 || (sshape[d] != 1 && sshape[d] != shape[d])) return -1;
    n *= shape[d];
    ns *= sshape[d];
  }
  int64_t st = 1;
  for (int d = rank - 1; d >= 0; d--) { /* row-major strides of the scale tensor; 0 on broadcast axes */
    sstride[d] = sshape[d] == 1 ? 0 : st;
    st *= sshape[d];
  }
  for (int64_t j = 0; j < ns; j++) scale[j] = 0; /* the groups' max |w| first */
  int64_t idx[DUET_MAX_RANK] = {0};
  for (int pass = 0; pass < 2; pass++) {
    memset(idx, 0, sizeof idx);
    int64_t s = 0; /* scale index of element e */
    for (int64_t e = 0; e < n; e++) {
      float a = fabsf(w[e]);
      if (pass == 0) {
        if (!(a <= FLT_MAX)) scale[s] = NAN; /* a non-finite weight: marked, scale 1 below */
        else if (!isnan(scale[s]) && a > scale[s]) scale[s] = a;
      } else {
        float r = nearbyintf(w[e] / scale[s]);
        q[e] = isnan(r) ? 0 : r > 127 ? 127 : r < -127 ? -127 : (signed char)r;
        if (!(fabsf(w[e]) <= FLT_MAX)) q[e] = 0;
      }
      for (int d = rank - 1; d >= 0; d--) { /* next multi-index, and its scale index */
        s += sstride[d];
        if (++idx[d] < shape[d]) break;
        s -= sstride[d] * shape[d];
        idx[d] = 0;
      }
    }
    if (pass == 0)
      for (int64_t j = 0; j < ns; j++) {
        float m = scale[j];
        if (isnan(m) || m == 0) scale[j] = 1;
        else scale[j] = m / 127.0f < FLT_MIN ? FLT_MIN : m / 127.0f;
      }
  }
  return 0;
}

int duet_quant_scale_of(const DuetProgram *p, int i) {
  const DuetTensor *t = &p->tensors[i];
  if (t->dtype != DUET_I8 || t->region != DUET_MEM_PARAM || !t->name) return -1;
  size_t len = strlen(t->name);
  for (int j = 0; j < p->n_tensors; j++) {
    const DuetTensor *x = &p->tensors[j];
    if (x->region == DUET_MEM_PARAM && x->dtype == DUET_F32 && x->rank == t->rank && x->name &&
        strlen(x->name) == len + 6 && !strncmp(x->name, t->name, len) && !strcmp(x->name + len, ".scale"))
      return j;
  }
  return -1;
}

int duet_is_act_scale(const DuetProgram *p, int i) {
  const DuetTensor *t = &p->tensors[i];
  if (t->region != DUET_MEM_PARAM || t->dtype != DUET_F32 || t->nbytes != 4 || !t->name) return 0;
  const char *d = strrchr(t->name, '.');
  if (!d || strncmp(d, ".act_scale", 10)) return 0;
  for (const char *c = d + 10; *c; c++)
    if (*c < '0' || *c > '9') return 0;
  return 1;
}

int duet_program_quantized(const DuetProgram *p) {
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].dtype == DUET_I8 && p->tensors[i].region == DUET_MEM_PARAM) return 1;
  return 0;
}

void duet_quant_summary(const DuetProgram *p, FILE *out) {
  int64_t n = 0, q = 0, sc = 0;
  for (int i = 0; i < p->n_tensors; i++) {
    int s = duet_quant_scale_of(p, i);
    if (s < 0) continue;
    n++;
    q += p->tensors[i].nbytes;
    sc += p->tensors[s].nbytes;
  }
  if (n)
    fprintf(out, "duet: int8 weights: %" PRId64 " tensors, %" PRId64 " bytes and %" PRId64 " bytes of f32 scales (%"
            PRId64 " bytes in f32)\n", n, q, sc, 4 * q);
}
