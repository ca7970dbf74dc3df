/* codegen/emit_c.c: kernel IR -> C11 with OpenMP, and the C source of a
 * standalone training executable. */
#include <float.h>
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "../runtime/duet_q8.h"

void bprintf(Buf *b, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  DUET_ASSERT(n >= 0);
  if (b->n + (size_t)n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (b->n + (size_t)n + 1 > cap) cap *= 2;
    char *ns = arena_alloc(b->a, cap);
    if (b->n) memcpy(ns, b->s, b->n);
    b->s = ns;
    b->cap = cap;
  }
  vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  b->n += (size_t)n;
}

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a, 64-bit (Fowler, Noll, Vo) */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

int kfuncs_add(KernelFuncs *f, const char *unit) {
  if (2 * (f->n + 1) > f->n_slot) { /* grow: at most half full */
    int ns = f->n_slot ? 2 * f->n_slot : 64;
    int *slot = arena_alloc(f->a, (size_t)ns * sizeof *slot);
    for (int i = 0; i < ns; i++) slot[i] = -1;
    for (int i = 0; i < f->n; i++) {
      size_t j = (size_t)(f->hash[i] & (uint64_t)(ns - 1));
      while (slot[j] >= 0) j = (j + 1) & (size_t)(ns - 1);
      slot[j] = i;
    }
    f->slot = slot;
    f->n_slot = ns;
  }
  uint64_t h = fnv1a(unit);
  size_t j = (size_t)(h & (uint64_t)(f->n_slot - 1));
  for (; f->slot[j] >= 0; j = (j + 1) & (size_t)(f->n_slot - 1))
    if (f->hash[f->slot[j]] == h && !strcmp(f->text[f->slot[j]], unit)) return f->slot[j];
  if (f->n == f->cap) {
    int nc = f->cap ? 2 * f->cap : 64;
    const char **t = arena_alloc(f->a, (size_t)nc * sizeof *t);
    uint64_t *hs = arena_alloc(f->a, (size_t)nc * sizeof *hs);
    if (f->n) memcpy(t, f->text, (size_t)f->n * sizeof *t), memcpy(hs, f->hash, (size_t)f->n * sizeof *hs);
    f->text = t, f->hash = hs, f->cap = nc;
  }
  f->text[f->n] = unit;
  f->hash[f->n] = h;
  f->slot[j] = f->n;
  return f->n++;
}

void kfuncs_write(const KernelFuncs *f, Buf *b) {
  size_t lp = strlen(FN);
  for (int i = 0; i < f->n; i++)
    for (const char *p = f->text[i]; *p;) {
      const char *q = strstr(p, FN);
      size_t len = q ? (size_t)(q - p) : strlen(p);
      bprintf(b, "%.*s", (int)len, p);
      if (!q) break;
      bprintf(b, "%d", i);
      p = q + lp;
    }
}

static const char *ctype(DType t) {
  switch (t) {
  case DT_F32: return "float";
  case DT_F64: return "double";
  case DT_I32: return "int32_t";
  case DT_F16: case DT_BF16: return "uint16_t";
  case DT_U8: return "uint8_t";
  case DT_I8: return "int8_t"; /* quantized weights (passes/quantize.c) */
  default: unreachable();
  }
}

/* The text of runtime/duet_half.h (generated from it by CMake). */
extern const char duet_half_src[];

static bool is16(DType t) { return t == DT_F16 || t == DT_BF16; }

/* Arithmetic type of a kernel of (storage) dtype t: 16-bit values widen to f32. */
static DType compute_dtype(DType t) { return is16(t) ? DT_F32 : t; }

/* Widening of a loaded element and narrowing of a stored one. */
static const char *load_fn(DType t) { return t == DT_F16 ? "duet_f32_from_f16" : t == DT_BF16 ? "duet_f32_from_bf16" : ""; }
static const char *store_fn(DType t) { return t == DT_F16 ? "duet_f16_from_f32" : t == DT_BF16 ? "duet_bf16_from_f32" : ""; }

/* Elementwise loops below this many elements run on one thread. */
#define PAR_MIN 32768

static void index_expr(Buf *b, const KBuf *kb) {
  if (kb->base) bprintf(b, "%" PRId64 " + ", kb->base);
  if (kb->n_terms == 0) {
    bprintf(b, "0");
    return;
  }
  for (int t = 0; t < kb->n_terms; t++) {
    const KIndexTerm *x = &kb->terms[t];
    bprintf(b, "%s", t ? " + " : "");
    bool paren = x->mul != 1 && (x->div != 1 || x->mod);
    bprintf(b, "%s", paren ? "(" : "");
    if (x->div != 1) bprintf(b, "i / %" PRId64, x->div);
    else bprintf(b, "i");
    if (x->mod) bprintf(b, " %% %" PRId64, x->mod);
    bprintf(b, "%s", paren ? ")" : "");
    if (x->mul != 1) bprintf(b, " * %" PRId64, x->mul);
  }
}

static void emit_const(Buf *b, DType t, double v) {
  /* hexadecimal: exact, whatever the locale */
  bprintf(b, "(%s)%a", ctype(t), v);
}

/* Row split of an elementwise loop: i = o * R + j with j innermost over a
 * row of R elements in which every buffer is either contiguous (index
 * base_o + j) or constant (index base_o), so the inner loop vectorises with
 * no division or modulo.  *contig tells which of the two a buffer is. */
static bool buf_row_ok(const KBuf *kb, int64_t R, bool *contig) {
  *contig = false;
  for (int t = 0; t < kb->n_terms; t++) {
    const KIndexTerm *x = &kb->terms[t];
    if (x->div == 1 && x->mul == 1 && (x->mod == 0 || x->mod % R == 0)) {
      if (*contig) return false;
      *contig = true;
    } else if (x->div % R != 0) {
      return false;
    }
  }
  return true;
}

static int64_t row_split(const Kernel *k) {
  int64_t cand[4 * KMAX_BUFS * IR_MAX_RANK + 1], best = 0;
  int nc = 0;
  cand[nc++] = k->n;
  for (int i = 0; i < k->n_bufs; i++)
    for (int t = 0; t < k->bufs[i].n_terms; t++) {
      const KIndexTerm *x = &k->bufs[i].terms[t];
      cand[nc++] = x->div;
      if (x->mod) cand[nc++] = x->mod, cand[nc++] = x->div * x->mod;
    }
  for (int c = 0; c < nc; c++) {
    int64_t R = cand[c];
    if (R <= best || R < 1 || k->n % R) continue;
    bool ok = true, contig;
    for (int i = 0; i < k->n_bufs && ok; i++) ok = buf_row_ok(&k->bufs[i], R, &contig);
    if (ok) best = R;
  }
  return best;
}

/* Index of buffer kb for row o (the part that does not depend on j). */
static void row_base_expr(Buf *b, const KBuf *kb, int64_t R) {
  bprintf(b, "%" PRId64, kb->base); /* then "+ term" for each term */
  for (int t = 0; t < kb->n_terms; t++) {
    const KIndexTerm *x = &kb->terms[t];
    if (x->div == 1 && x->mul == 1 && (x->mod == 0 || x->mod % R == 0)) {
      if (x->mod && x->mod / R > 1) bprintf(b, " + o %% %" PRId64 " * %" PRId64, x->mod / R, R);
      else if (!x->mod) bprintf(b, " + o * %" PRId64, R);
      continue;
    }
    bprintf(b, " + (o");
    if (x->div / R != 1) bprintf(b, " / %" PRId64, x->div / R);
    if (x->mod) bprintf(b, " %% %" PRId64, x->mod);
    bprintf(b, ")");
    if (x->mul != 1) bprintf(b, " * %" PRId64, x->mul);
  }
}

static void emit_elementwise(Buf *b, const Kernel *k) {
  const DType KD = compute_dtype(k->dtype);
  const char *T = ctype(KD);
  bool *stored = calloc(KMAX_BUFS, 1);
  if (!stored) duet_fatal(__FILE__, __LINE__, "out of host memory");
  for (int i = 0; i < k->n_ins; i++)
    if (k->ins[i].op == KI_STORE) stored[k->ins[i].a] = true;
  for (int i = 0; i < k->n_bufs; i++)
    bprintf(b, "  %s%s *b%d = (%s%s *)t[%d];\n", stored[i] ? "" : "const ", ctype(k->bufs[i].dtype), i,
            stored[i] ? "" : "const ", ctype(k->bufs[i].dtype), i);
  for (int i = 0; i < k->n_ins; i++)
    if (k->ins[i].op == KI_SCALAR) bprintf(b, "  const %s s%d = (%s)s[%d];\n", T, i, T, k->ins[i].a);
  for (int i = 0; i < k->n_ins; i++)
    if (k->ins[i].op == KI_DROPOUT) {
      bprintf(b, "  const int training = s[%d] != 0;\n  const uint64_t drop_seed = (uint64_t)s[%d];\n",
              DUET_S_TRAINING, DUET_S_DROP_SEED);
      break;
    }
  int64_t R = row_split(k);
  bool flat = R == 0 || R == k->n; /* one loop over i */
  const char *ind = flat ? "    " : "      ";
  if (R > 0 && !flat) {
    if (k->n >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
    bprintf(b, "  for (int64_t o = 0; o < %" PRId64 "; o++) {\n", k->n / R);
    for (int i = 0; i < k->n_bufs; i++) {
      bprintf(b, "    const int64_t o%d = ", i);
      row_base_expr(b, &k->bufs[i], R);
      bprintf(b, ";\n");
    }
    bprintf(b, "    #pragma omp simd\n    for (int64_t j = 0; j < %" PRId64 "; j++) {\n", R);
  } else {
    if (k->n >= PAR_MIN) bprintf(b, "  #pragma omp parallel for simd schedule(static)\n");
    else bprintf(b, "  #pragma omp simd\n");
    bprintf(b, "  for (int64_t i = 0; i < %" PRId64 "; i++) {\n", k->n);
  }
  const char *sq = KD == DT_F32 ? "sqrtf" : "sqrt";
  const char *th = KD == DT_F32 ? "tanhf" : "tanh";
  for (int i = 0; i < k->n_ins; i++) {
    const KInstr *x = &k->ins[i];
    if (x->op == KI_STORE || x->op == KI_LOAD) {
      const KBuf *kb = &k->bufs[x->a];
      if (x->op == KI_STORE) bprintf(b, "%sb%d[", ind, x->a);
      else bprintf(b, "%sconst %s r%d = %s%sb%d[", ind, T, i, load_fn(kb->dtype), is16(kb->dtype) ? "(" : "", x->a);
      bool contig;
      if (R == 0) {
        index_expr(b, kb);
      } else if (flat) {
        buf_row_ok(kb, R, &contig);
        if (kb->base) bprintf(b, "%" PRId64 "%s", kb->base, contig ? " + " : "");
        if (contig) bprintf(b, "i");
        else if (!kb->base) bprintf(b, "0");
      } else {
        buf_row_ok(kb, R, &contig);
        bprintf(b, "o%d%s", x->a, contig ? " + j" : "");
      }
      if (x->op == KI_STORE && is16(kb->dtype)) bprintf(b, "] = %s(r%d);\n", store_fn(kb->dtype), x->b);
      else if (x->op == KI_STORE) bprintf(b, "] = r%d;\n", x->b);
      else bprintf(b, "]%s;\n", is16(kb->dtype) ? ")" : "");
      continue;
    }
    bprintf(b, "%sconst %s r%d = ", ind, T, i);
    switch (x->op) {
    case KI_CONST: emit_const(b, KD, x->value); break;
    case KI_CAST: { /* round to the 16-bit dtype, keep computing in f32 */
      DType to = (DType)(int)x->value;
      if (is16(to)) bprintf(b, "%s(%s(r%d))", load_fn(to), store_fn(to), x->a);
      else bprintf(b, "(%s)r%d", T, x->a);
      break;
    }
    case KI_SCALAR: bprintf(b, "s%d", i); break;
    case KI_ADD: bprintf(b, "r%d + r%d", x->a, x->b); break;
    case KI_SUB: bprintf(b, "r%d - r%d", x->a, x->b); break;
    case KI_MUL: bprintf(b, "r%d * r%d", x->a, x->b); break;
    case KI_DEQUANTIZE: bprintf(b, "r%d * r%d", x->a, x->b); break; /* int8 (loaded exactly as f32) x scale */
    case KI_FAKE_QUANT: bprintf(b, "fake_quant_%s(r%d, r%d)", T, x->a, x->b); break; /* w, its channel's max|w| */
    case KI_DIV: bprintf(b, "r%d / r%d", x->a, x->b); break;
    case KI_NEG: bprintf(b, "-r%d", x->a); break;
    case KI_RELU: bprintf(b, "r%d < 0 ? 0 : r%d", x->a, x->a); break; /* NaN passes through */
    case KI_RELU_GRAD: bprintf(b, "r%d > 0 ? r%d : 0", x->b, x->a); break;
    case KI_SQRT: bprintf(b, "%s(r%d)", sq, x->a); break;
    /* GELU, tanh approximation (Hendrycks & Gimpel 2016, as GPT-2):
     *   0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
     * d/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2) */
    case KI_GELU:
      bprintf(b, "(%s)0.5 * r%d * (1 + %s((%s)0.7978845608028654 * (r%d + (%s)0.044715 * r%d * r%d * r%d)))", T,
              x->a, th, T, x->a, T, x->a, x->a, x->a);
      break;
    case KI_GELU_GRAD:
      bprintf(b, "gelu_grad_%s(r%d, r%d)", T, x->a, x->b);
      break;
    /* exp, and log as C's (log 0 = -inf, log of a negative or NaN = NaN),
     * and tanh from libm (no overflow for large |x|) */
    case KI_EXP: bprintf(b, "%s(r%d)", KD == DT_F32 ? "expf" : "exp", x->a); break;
    case KI_LOG: bprintf(b, "%s(r%d)", KD == DT_F32 ? "logf" : "log", x->a); break;
    case KI_TANH: bprintf(b, "%s(r%d)", th, x->a); break;
    case KI_TANH_GRAD: bprintf(b, "r%d * (1 - r%d * r%d)", x->a, x->b, x->b); break; /* dy, y */
    /* sigmoid and silu through sigmoid_T (the prelude: exp of -|x| only,
     * so no overflow for large |x|) */
    case KI_SIGMOID: bprintf(b, "sigmoid_%s(r%d)", T, x->a); break;
    case KI_SIGMOID_GRAD: bprintf(b, "r%d * (r%d * (1 - r%d))", x->a, x->b, x->b); break; /* dy, y */
    case KI_SILU: bprintf(b, "r%d * sigmoid_%s(r%d)", x->a, T, x->a); break;
    case KI_SILU_GRAD: bprintf(b, "silu_grad_%s(r%d, r%d)", T, x->a, x->b); break; /* dy, x */
    /* dropout: element `flat` of site b is kept when a hash of (step seed,
     * site, flat) clears p, and scaled by 1/(1-p); the backward pass
     * recomputes the same mask, so nothing is stored */
    case KI_DROPOUT: {
      double scaled = x->value * 18446744073709551616.0; /* p * 2^64 */
      uint64_t thr = scaled >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)scaled;
      char flat_ix[64];
      if (R && !flat) snprintf(flat_ix, sizeof flat_ix, "o * %" PRId64 " + j", R);
      else snprintf(flat_ix, sizeof flat_ix, "i");
      bprintf(b, "!training ? r%d : dropout_keep(drop_seed, %" PRId64 "u, (uint64_t)(%s), %" PRIu64 "u) ? r%d * (%s)%a : 0",
              x->a, (int64_t)x->b, flat_ix, thr, x->a, T, 1.0 / (1.0 - x->value));
      break;
    }
    default: unreachable();
    }
    bprintf(b, ";\n");
  }
  bprintf(b, flat ? "  }\n" : "    }\n  }\n");
  free(stored);
}

/* Reductions accumulate in double, in a fixed order (no OpenMP reduction
 * clause, whose combining order varies between runs). */
#define BUF(i, cst) cst, T, cst, T, (i) /* the kernel's argument i */

/* max over the reduced axis (NaN propagates: a comparison with NaN keeps
 * the NaN), and its gradient to the first maximum */
static void emit_reduce_max(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  int64_t O = k->outer, R = k->red, I = k->inner;
  bool grad = k->kind == KK_MAX_GRAD;
  if (grad) bprintf(b, "  %s%s *dy = (%s%s *)t[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *x = (%s%s *)t[%d];\n", BUF(grad ? 1 : 0, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t[%d];\n", BUF(grad ? 2 : 1, ""));
  if (O * R * I >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t oj = 0; oj < %" PRId64 "; oj++) {\n", O * I);
  bprintf(b, "    const int64_t o = oj / %" PRId64 ", j = oj %% %" PRId64 ";\n", I, I);
  bprintf(b, "    const %s *xr = x + o * %" PRId64 " + j;\n", T, R * I);
  bprintf(b, "    %s m = xr[0];\n    int64_t am = 0;\n", T);
  bprintf(b, "    for (int64_t r = 1; r < %" PRId64 "; r++) if (xr[r * %" PRId64 "] > m || m != m) { m = xr[r * %" PRId64
             "]; am = r; }\n", R, I, I);
  if (!grad) {
    bprintf(b, "    y[oj] = m;\n  }\n");
    return;
  }
  bprintf(b, "    for (int64_t r = 0; r < %" PRId64 "; r++) y[o * %" PRId64 " + r * %" PRId64 " + j] = r == am ? dy[oj] : 0;\n  }\n",
          R, R * I, I);
}

static void emit_reduce(Buf *b, const Kernel *k) {
  if (k->reduce_max || k->kind == KK_MAX_GRAD) {
    emit_reduce_max(b, k);
    return;
  }
  const char *T = ctype(k->dtype);
  bprintf(b, "  const %s *x = (const %s *)t[%d];\n  %s *y = (%s *)t[%d];\n", T, T, 0, T, T,
          1);
  int64_t O = k->outer, R = k->red, I = k->inner;
  if (I == 1 && O == 1) {
    int64_t nch = R / 16384 + 1;
    if (nch > 64) nch = 64;
    bprintf(b, "  double part[%" PRId64 "];\n", nch);
    if (nch > 1) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
    bprintf(b, "  for (int64_t c = 0; c < %" PRId64 "; c++) {\n", nch);
    bprintf(b, "    double acc = 0;\n");
    bprintf(b, "    for (int64_t r = %" PRId64 " * c / %" PRId64 "; r < %" PRId64 " * (c + 1) / %" PRId64 "; r++) acc += x[r];\n",
            R, nch, R, nch);
    bprintf(b, "    part[c] = acc;\n  }\n");
    bprintf(b, "  double tot = 0;\n  for (int64_t c = 0; c < %" PRId64 "; c++) tot += part[c];\n", nch);
    bprintf(b, "  y[0] = (%s)(tot * %.17g);\n", T, k->scale);
    return;
  }
  /* blocks of up to 256 outputs along the inner axis, rows streamed; when
   * there are few blocks (a bias gradient: one block of 256 columns over
   * 2048 rows), the rows are also split into RC chunks whose partial sums
   * are added in a fixed order afterwards, so every thread has work and the
   * result does not depend on the thread count */
  int64_t JB = I < 256 ? I : 256;
  int64_t nb = (I + JB - 1) / JB, nblk = O * nb;
  int64_t RC = nblk >= 8 || R < 256 ? 1 : (R / 128 < 16 ? R / 128 : 16);
  if (RC > 1) bprintf(b, "  double part[%" PRId64 "][%" PRId64 "]; /* at most 16 x 2048 */\n", RC, O * I);
  if (O * R * I >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t w = 0; w < %" PRId64 "; w++) {\n", nblk * RC);
  bprintf(b, "    const int64_t blk = w %% %" PRId64 ", rc = w / %" PRId64 ";\n", nblk, nblk);
  bprintf(b, "    const int64_t o = blk / %" PRId64 ", j0 = blk %% %" PRId64 " * %" PRId64 ";\n", nb, nb, JB);
  bprintf(b, "    const int64_t jn = %" PRId64 " - j0 < %" PRId64 " ? %" PRId64 " - j0 : %" PRId64 ";\n", I, JB, I, JB);
  bprintf(b, "    double acc[%" PRId64 "] = {0};\n", JB);
  bprintf(b, "    for (int64_t r = %" PRId64 " * rc / %" PRId64 "; r < %" PRId64 " * (rc + 1) / %" PRId64 "; r++) {\n", R,
          RC, R, RC);
  bprintf(b, "      const %s *row = x + (o * %" PRId64 " + r) * %" PRId64 " + j0;\n", T, R, I);
  bprintf(b, "      #pragma omp simd\n      for (int64_t j = 0; j < jn; j++) acc[j] += row[j];\n    }\n");
  if (RC == 1) {
    bprintf(b, "    (void)rc;\n");
    bprintf(b, "    for (int64_t j = 0; j < jn; j++) y[o * %" PRId64 " + j0 + j] = (%s)(acc[j] * %.17g);\n  }\n", I, T,
            k->scale);
    return;
  }
  bprintf(b, "    for (int64_t j = 0; j < jn; j++) part[rc][o * %" PRId64 " + j0 + j] = acc[j];\n  }\n", I);
  bprintf(b, "  for (int64_t i = 0; i < %" PRId64 "; i++) {\n    double t = 0;\n", O * I);
  bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) t += part[c][i];\n", RC);
  bprintf(b, "    y[i] = (%s)(t * %.17g);\n  }\n", T, k->scale);
}

/* Softmax cross-entropy with integer labels, stabilised by subtracting the
 * row maximum (log-sum-exp):
 *   loss = mean_r (log sum_c exp(x_rc - m_r) - (x_r,y_r - m_r)).
 * The shifted label logit x_r,y_r - m_r is formed first: log(se) + m_r -
 * x_r,y_r would lose log(se) (at most log C) in m_r's rounding once |m_r|
 * is large (10 equal logits of 1e15 gave 2.25 instead of ln 10, of 1e17
 * gave 0).  x_r,y_r - m_r is exact in double for f32 logits within 2^29
 * of each other, and is 0 for the label at the maximum. */
static void emit_rows(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  const char *ex = k->dtype == DT_F32 ? "expf" : "exp";
  int64_t R = k->rows, C = k->cols;
  bprintf(b, "  const %s *x = (const %s *)t[%d];\n  const int32_t *y = (const int32_t *)t[%d];\n", T, T,
          0, 1);
  if (k->kind == KK_XENT_FWD) {
    int64_t nch = R < 16 ? R : 16;
    bprintf(b, "  %s *out = (%s *)t[%d];\n  double part[%" PRId64 "];\n", T, T, 2, nch);
    if (R * C >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
    bprintf(b, "  for (int64_t c = 0; c < %" PRId64 "; c++) {\n    double acc = 0;\n", nch);
    bprintf(b, "    for (int64_t r = %" PRId64 " * c / %" PRId64 "; r < %" PRId64 " * (c + 1) / %" PRId64 "; r++) {\n",
            R, nch, R, nch);
    bprintf(b, "      const %s *row = x + r * %" PRId64 ";\n      double m = row[0], se = 0;\n", T, C);
    bprintf(b, "      for (int64_t j = 1; j < %" PRId64 "; j++) m = row[j] > m ? row[j] : m;\n", C);
    bprintf(b, "      for (int64_t j = 0; j < %" PRId64 "; j++) se += exp((double)row[j] - m);\n", C);
    bprintf(b, "      acc += log(se) - (row[y[r]] - m);\n    }\n    part[c] = acc;\n  }\n");
    bprintf(b, "  double tot = 0;\n  for (int64_t c = 0; c < %" PRId64 "; c++) tot += part[c];\n", nch);
    bprintf(b, "  out[0] = (%s)(tot / %" PRId64 ");\n", T, R);
  } else if (k->kind == KK_XENT_BWD) {
    /* d/dx_rc = (softmax_rc - [c == y_r]) * dloss / R */
    bprintf(b, "  const %s *dl = (const %s *)t[%d];\n  %s *dx = (%s *)t[%d];\n", T, T, 2, T, T,
            3);
    bprintf(b, "  const %s g = dl[0] / (%s)%" PRId64 ";\n", T, T, R);
    if (R * C >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
    bprintf(b, "  for (int64_t r = 0; r < %" PRId64 "; r++) {\n", R);
    bprintf(b, "    const %s *row = x + r * %" PRId64 ";\n    %s *drow = dx + r * %" PRId64 ";\n", T, C, T, C);
    bprintf(b, "    %s m = row[0];\n    double se = 0;\n", T);
    bprintf(b, "    for (int64_t j = 1; j < %" PRId64 "; j++) m = row[j] > m ? row[j] : m;\n", C);
    bprintf(b, "    for (int64_t j = 0; j < %" PRId64 "; j++) { drow[j] = %s(row[j] - m); se += drow[j]; }\n", C, ex);
    bprintf(b, "    const %s inv = (%s)(1 / se);\n", T, T);
    bprintf(b, "    for (int64_t j = 0; j < %" PRId64 "; j++) drow[j] = (drow[j] * inv - (j == y[r])) * g;\n  }\n", C);
  } else {
    /* correct predictions (first maximum wins) and summed NLL over the
     * first s[N_VALID] rows */
    bprintf(b, "  %s *out = (%s *)t[%d];\n", T, T, 2);
    bprintf(b, "  int64_t nv = (int64_t)s[%d];\n  if (nv > %" PRId64 ") nv = %" PRId64 ";\n", DUET_S_N_VALID, R, R);
    bprintf(b, "  double correct = 0, nll = 0;\n  for (int64_t r = 0; r < nv; r++) {\n");
    bprintf(b, "    const %s *row = x + r * %" PRId64 ";\n    int64_t am = 0;\n    double m = row[0], se = 0;\n", T, C);
    bprintf(b, "    for (int64_t j = 1; j < %" PRId64 "; j++) if (row[j] > m) { m = row[j]; am = j; }\n", C);
    bprintf(b, "    for (int64_t j = 0; j < %" PRId64 "; j++) se += exp((double)row[j] - m);\n", C);
    bprintf(b, "    nll += log(se) - (row[y[r]] - m);\n    correct += am == y[r];\n  }\n");
    bprintf(b, "  out[0] = (%s)correct;\n  out[1] = (%s)nll;\n", T, T);
  }
}

/* Embedding lookup (ids outside the table read zeros) and its gradient, a
 * deterministic scatter-add.  Every index is 64-bit: the row offset id * C
 * is formed as int64_t, as a table may hold 2^32 or more elements (16 GiB
 * of f32) while ids are 32-bit. */
static void emit_embed(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  int64_t R = k->rows, C = k->cols, V = k->outer;
  if (k->kind == KK_EMBED_FWD) {
    bprintf(b, "  %s%s *tab = (%s%s *)t[%d];\n", BUF(0, "const "));
    bprintf(b, "  const int32_t *ix = (const int32_t *)t[%d];\n  %s *out = (%s *)t[%d];\n", 1, T, T,
            2);
    if (R * C >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
    bprintf(b, "  for (int64_t r = 0; r < %" PRId64 "; r++) {\n", R);
    bprintf(b, "    const uint32_t id = (uint32_t)ix[r];\n");
    bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) out[r * %" PRId64 " + c] = id < %" PRId64
               "u ? tab[(int64_t)id * %" PRId64 " + c] : 0;\n  }\n", C, C, V, C);
    return;
  }
  /* scatter-add, deterministic: each thread owns a block of columns and
   * visits the rows in order */
  int64_t CB = C < 64 ? C : 64, nb = (C + CB - 1) / CB;
  bprintf(b, "  %s%s *dy = (%s%s *)t[%d];\n", BUF(0, "const "));
  bprintf(b, "  const int32_t *ix = (const int32_t *)t[%d];\n  %s *out = (%s *)t[%d];\n", 1, T, T,
          2);
  if (R * C >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t cb = 0; cb < %" PRId64 "; cb++) {\n", nb);
  bprintf(b, "    const int64_t c0 = cb * %" PRId64 ", c1 = c0 + %" PRId64 " < %" PRId64 " ? c0 + %" PRId64 " : %" PRId64 ";\n",
          CB, CB, C, CB, C);
  bprintf(b, "    for (int64_t v = 0; v < %" PRId64 "; v++) for (int64_t c = c0; c < c1; c++) out[v * %" PRId64 " + c] = 0;\n",
          V, C);
  bprintf(b, "    for (int64_t r = 0; r < %" PRId64 "; r++) {\n      const uint32_t id = (uint32_t)ix[r];\n", R);
  bprintf(b, "      if (id >= %" PRId64 "u) continue;\n", V);
  bprintf(b, "      for (int64_t c = c0; c < c1; c++) out[(int64_t)id * %" PRId64 " + c] += dy[r * %" PRId64 " + c];\n    }\n  }\n",
          C, C);
}

/* Normalisation over the last axis with two-pass statistics (mean, then
 * the mean of squared deviations; never E[x^2] - E[x]^2), as torch's
 * layer_norm without the affine part.  Backward, with xh = (x - mean) * rstd:
 *   dx = rstd * (dy - mean(dy) - xh * mean(dy * xh)). */
static void emit_norm(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  const char *sq = k->dtype == DT_F32 ? "sqrtf" : "sqrt";
  int64_t R = k->rows, C = k->cols;
  bool fwd = k->kind == KK_NORM_FWD;
  bprintf(b, "  %s%s *x = (%s%s *)t[%d];\n", BUF(fwd ? 0 : 1, "const "));
  if (!fwd) bprintf(b, "  %s%s *dy = (%s%s *)t[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t[%d];\n", BUF(fwd ? 1 : 2, ""));
  if (R * C >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t r = 0; r < %" PRId64 "; r++) {\n", R);
  bprintf(b, "    const %s *xr = x + r * %" PRId64 ";\n    %s *yr = y + r * %" PRId64 ";\n", T, C, T, C);
  bprintf(b, "    double mean = 0, var = 0;\n");
  bprintf(b, "    #pragma omp simd reduction(+:mean)\n");
  bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) mean += xr[c];\n    mean /= %" PRId64 ";\n", C, C);
  bprintf(b, "    #pragma omp simd reduction(+:var)\n");
  bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) var += (xr[c] - mean) * (xr[c] - mean);\n", C);
  bprintf(b, "    const %s m = (%s)mean, rstd = (%s)(1 / %s((%s)(var / %" PRId64 ") + (%s)%a));\n", T, T, T, sq, T, C, T,
          k->eps);
  if (fwd) {
    bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) yr[c] = (xr[c] - m) * rstd;\n  }\n", C);
    return;
  }
  bprintf(b, "    const %s *dr = dy + r * %" PRId64 ";\n    double mdy = 0, mdyx = 0;\n", T, C);
  bprintf(b, "    #pragma omp simd reduction(+:mdy, mdyx)\n");
  bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) { mdy += dr[c]; mdyx += dr[c] * (xr[c] - m) * rstd; }\n", C);
  bprintf(b, "    const %s a = (%s)(mdy / %" PRId64 "), bb = (%s)(mdyx / %" PRId64 ");\n", T, T, C, T, C);
  bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) yr[c] = rstd * (dr[c] - a - (xr[c] - m) * rstd * bb);\n  }\n", C);
}

/* Softmax over the middle axis of [outer, red, inner], one (o, j) column
 * per iteration: the column's maximum subtracted before exp, the sum in
 * double; its gradient dx = y (dy - sum_r dy y) from the output. */
static void emit_softmax(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  const char *ex = k->dtype == DT_F32 ? "expf" : "exp";
  int64_t O = k->outer, R = k->red, I = k->inner;
  bool fwd = k->kind == KK_SOFTMAX;
  char st[40] = ""; /* the stride of the reduced axis */
  if (I != 1) snprintf(st, sizeof st, " * %" PRId64, I);
  if (fwd) {
    bprintf(b, "  %s%s *x = (%s%s *)t[%d];\n", BUF(0, "const "));
    bprintf(b, "  %s%s *y = (%s%s *)t[%d];\n", BUF(1, ""));
  } else {
    bprintf(b, "  %s%s *dy = (%s%s *)t[%d];\n", BUF(0, "const "));
    bprintf(b, "  %s%s *y = (%s%s *)t[%d];\n", BUF(1, "const "));
    bprintf(b, "  %s%s *dx = (%s%s *)t[%d];\n", BUF(2, ""));
  }
  if (O * R * I >= PAR_MIN && O * I > 1) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t oj = 0; oj < %" PRId64 "; oj++) {\n", O * I);
  if (I == 1) bprintf(b, "    const int64_t base = oj * %" PRId64 ";\n", R);
  else bprintf(b, "    const int64_t base = oj / %" PRId64 " * %" PRId64 " + oj %% %" PRId64 ";\n", I, R * I, I);
  if (fwd) {
    bprintf(b, "    const %s *xr = x + base;\n    %s *yr = y + base;\n    %s m = xr[0];\n    double sum = 0;\n", T, T, T);
    bprintf(b, "    for (int64_t r = 1; r < %" PRId64 "; r++) m = xr[r%s] > m ? xr[r%s] : m;\n", R, st, st);
    bprintf(b, "    for (int64_t r = 0; r < %" PRId64 "; r++) { const %s e = %s(xr[r%s] - m); yr[r%s] = e; sum += e; }\n", R, T,
            ex, st, st);
    bprintf(b, "    const %s inv = (%s)(1 / sum);\n", T, T);
    bprintf(b, "    for (int64_t r = 0; r < %" PRId64 "; r++) yr[r%s] *= inv;\n  }\n", R, st);
    return;
  }
  bprintf(b, "    const %s *dr = dy + base, *yr = y + base;\n    %s *xr = dx + base;\n    double dot = 0;\n", T, T);
  bprintf(b, "    for (int64_t r = 0; r < %" PRId64 "; r++) dot += (double)dr[r%s] * yr[r%s];\n", R, st, st);
  bprintf(b, "    const %s d = (%s)dot;\n", T, T);
  bprintf(b, "    for (int64_t r = 0; r < %" PRId64 "; r++) xr[r%s] = yr[r%s] * (dr[r%s] - d);\n  }\n", R, st, st, st);
}

/* RMS normalisation over the last axis (Zhang & Sennrich 2019, without
 * the gain):  y = x rs,  rs = 1 / sqrt(mean(x^2) + eps), the sum of squares
 * in double.  Backward:  dx = rs (dy - x rs^2 mean(dy x)). */
static void emit_rmsnorm(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  int64_t R = k->rows, C = k->cols;
  bool fwd = k->kind == KK_RMSNORM_FWD;
  bprintf(b, "  %s%s *x = (%s%s *)t[%d];\n", BUF(fwd ? 0 : 1, "const "));
  if (!fwd) bprintf(b, "  %s%s *dy = (%s%s *)t[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t[%d];\n", BUF(fwd ? 1 : 2, ""));
  if (R * C >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t r = 0; r < %" PRId64 "; r++) {\n", R);
  bprintf(b, "    const %s *xr = x + r * %" PRId64 ";\n    %s *yr = y + r * %" PRId64 ";\n", T, C, T, C);
  bprintf(b, "    double ss = 0;\n    #pragma omp simd reduction(+:ss)\n");
  bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) ss += (double)xr[c] * xr[c];\n", C);
  bprintf(b, "    const %s rs = (%s)(1 / sqrt(ss / %" PRId64 " + %a));\n", T, T, C, k->eps);
  if (fwd) {
    bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) yr[c] = xr[c] * rs;\n  }\n", C);
    return;
  }
  bprintf(b, "    const %s *dr = dy + r * %" PRId64 ";\n    double sdx = 0;\n    #pragma omp simd reduction(+:sdx)\n", T, C);
  bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) sdx += (double)dr[c] * xr[c];\n", C);
  bprintf(b, "    const %s bb = (%s)(sdx / %" PRId64 " * rs * rs);\n", T, T, C);
  bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) yr[c] = rs * (dr[c] - xr[c] * bb);\n  }\n", C);
}

/* Rotary position embedding (Su et al. 2021, RoFormer) of x [B, N, C] in
 * heads of D = C / H channels: the pairs (2i, 2i+1) of each head (the
 * paper's and Meta's LLaMA reference's pairing) turn by the angle p f_i,
 * f_i = base^(-2i/D), p = s[POS] + the time index (the decoding position
 * when generating, 0 when training):
 *   y_2i = x_2i cos - x_2i+1 sin,  y_2i+1 = x_2i sin + x_2i+1 cos.
 * The angle and its cosine and sine are computed in double and rounded
 * once; the gradient (`inverse`) turns by -p f_i.  One time step per
 * iteration: its D/2 angles, then every (batch, head). */
static void emit_rope(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  int64_t B = k->batch, N = k->time, C = k->cols, H = k->heads, D = C / H, P = D / 2;
  bprintf(b, "  %s%s *x = (%s%s *)t[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t[%d];\n", BUF(1, ""));
  bprintf(b, "  const int64_t pos = (int64_t)s[%d];\n", DUET_S_POS);
  if (B * N * C >= PAR_MIN && N > 1) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t tt = 0; tt < %" PRId64 "; tt++) {\n", N);
  bprintf(b, "    %s cs[%" PRId64 "], sn[%" PRId64 "];\n", T, P, P);
  bprintf(b, "    for (int64_t i = 0; i < %" PRId64 "; i++) {\n", P);
  bprintf(b, "      const double a = (double)(pos + tt) * pow(%a, -(double)(2 * i) / %" PRId64 ");\n", k->base, D);
  bprintf(b, "      cs[i] = (%s)cos(a);\n      sn[i] = (%s)%ssin(a);\n    }\n", T, T, k->inverse ? "-" : "");
  bprintf(b, "    for (int64_t bh = 0; bh < %" PRId64 "; bh++) {\n", B * H);
  bprintf(b, "      const int64_t o = (bh / %" PRId64 " * %" PRId64 " + tt) * %" PRId64 " + bh %% %" PRId64 " * %" PRId64 ";\n",
          H, N, C, H, D);
  bprintf(b, "      const %s *xr = x + o;\n      %s *yr = y + o;\n", T, T);
  bprintf(b, "      #pragma omp simd\n      for (int64_t i = 0; i < %" PRId64 "; i++) {\n", P);
  bprintf(b, "        const %s x0 = xr[2 * i], x1 = xr[2 * i + 1];\n", T);
  bprintf(b, "        yr[2 * i] = x0 * cs[i] - x1 * sn[i];\n        yr[2 * i + 1] = x0 * sn[i] + x1 * cs[i];\n");
  bprintf(b, "      }\n    }\n  }\n");
}

/* mean((pred - target)^2): each difference and its square in double, in
 * up to 64 chunks summed in a fixed order (as the whole-tensor sum). */
static void emit_mse(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  int64_t n = k->n, nch = n / 16384 + 1;
  if (nch > 64) nch = 64;
  bprintf(b, "  %s%s *p = (%s%s *)t[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *q = (%s%s *)t[%d];\n", BUF(1, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t[%d];\n", BUF(2, ""));
  bprintf(b, "  double part[%" PRId64 "];\n", nch);
  if (nch > 1) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t c = 0; c < %" PRId64 "; c++) {\n    double acc = 0;\n", nch);
  bprintf(b, "    for (int64_t r = %" PRId64 " * c / %" PRId64 "; r < %" PRId64 " * (c + 1) / %" PRId64 "; r++) {\n", n, nch,
          n, nch);
  bprintf(b, "      const double d = (double)p[r] - (double)q[r];\n      acc += d * d;\n    }\n    part[c] = acc;\n  }\n");
  bprintf(b, "  double tot = 0;\n  for (int64_t c = 0; c < %" PRId64 "; c++) tot += part[c];\n", nch);
  bprintf(b, "  y[0] = (%s)(tot * %.17g);\n", T, k->scale);
}

/* Causal multi-head attention, one (batch, head) pair per iteration:
 *   out_i = sum_j softmax_j(q_i . k_j / sqrt(D)) v_j,  j <= i when causal,
 * with the row maximum subtracted before exp.  The backward pass recomputes
 * the probabilities P (nothing of size T x T is stored):
 *   dv_j += P_ij dy_i;  dP_ij = dy_i . v_j;  dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij)
 *   dq_i = sum_j dS_ij k_j / sqrt(D);  dk_j += dS_ij q_i / sqrt(D)
 * Grouped-query attention (kv_heads KV < heads H, Ainslie et al. 2023):
 * query head h reads key/value head hk = h / (H / KV) of k and v [B, N,
 * KV D]; the backward then runs one (batch, key/value head) pair per
 * iteration and its query heads in order inside it, so that each dk, dv
 * row has one writer, and packs dq, dk, dv along the channels of rows of
 * C + 2 KV D ([3, B, N, C] without groups). */
static void emit_attention(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  const char *ex = k->dtype == DT_F32 ? "expf" : "exp";
  int64_t B = k->batch, N = k->time, C = k->cols, H = k->heads, D = C / H;
  int64_t KV = k->kv_heads > 0 ? k->kv_heads : H, R = H / KV, Ckv = KV * D;
  bool gqa = R > 1;
  /* the gradient's layout: row stride W of dq, dk, dv; dk's and dv's
   * offsets; the statistics after it */
  int64_t W = gqa ? C + 2 * Ckv : C, DK = gqa ? C : B * N * C, DV = gqa ? C + Ckv : 2 * B * N * C;
  int64_t ST = gqa ? B * N * W : 3 * B * N * C;
  const char *kh = gqa ? "hk" : "h"; /* the key/value head */
  bool fwd = k->kind == KK_ATTN_FWD;
  int o = fwd ? 0 : 1;
  if (!fwd) bprintf(b, "  %s%s *dy = (%s%s *)t[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *q = (%s%s *)t[%d];\n", BUF(o, "const "));
  bprintf(b, "  %s%s *k = (%s%s *)t[%d];\n", BUF(o + 1, "const "));
  bprintf(b, "  %s%s *v = (%s%s *)t[%d];\n", BUF(o + 2, "const "));
  bprintf(b, "  %s%s *out = (%s%s *)t[%d];\n", BUF(o + 3, ""));
  bprintf(b, "  const %s scale = (%s)%a;\n", T, T, 1.0 / sqrt((double)D));
  bool per_kv = gqa && !fwd; /* an iteration per (batch, key/value head) */
  if ((per_kv ? B * KV : B * H) > 1) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  if (per_kv) {
    bprintf(b, "  for (int64_t bg = 0; bg < %" PRId64 "; bg++) {\n", B * KV);
    bprintf(b, "    const int64_t b = bg / %" PRId64 ", hk = bg %% %" PRId64 ";\n", KV, KV);
  } else {
    bprintf(b, "  for (int64_t bh = 0; bh < %" PRId64 "; bh++) {\n", B * H);
    bprintf(b, "    const int64_t b = bh / %" PRId64 ", h = bh %% %" PRId64 ";\n", H, H);
    if (gqa) bprintf(b, "    const int64_t hk = h / %" PRId64 ";\n", R);
  }
  /* K (and V for the backward) of this head, transposed to [D][N], so the
   * scores of row i are axpys over j that vectorise without reductions */
  bprintf(b, "    %s p[%" PRId64 "], kt[%" PRId64 "];\n", T, N, D * N);
  if (!fwd) bprintf(b, "    %s vt[%" PRId64 "], dp[%" PRId64 "];\n", T, D * N, N);
  bprintf(b, "    for (int64_t j = 0; j < %" PRId64 "; j++) for (int64_t d = 0; d < %" PRId64 "; d++) {\n", N, D);
  bprintf(b, "      kt[d * %" PRId64 " + j] = k[(b * %" PRId64 " + j) * %" PRId64 " + %s * %" PRId64 " + d];\n", N, N, Ckv, kh, D);
  if (!fwd) bprintf(b, "      vt[d * %" PRId64 " + j] = v[(b * %" PRId64 " + j) * %" PRId64 " + %s * %" PRId64 " + d];\n", N, N, Ckv, kh, D);
  bprintf(b, "    }\n");
  if (!fwd) {
    bprintf(b, "    %s *dq = out, *dk = out + %" PRId64 ", *dv = out + %" PRId64 ";\n", T, DK, DV);
    bprintf(b, "    for (int64_t j = 0; j < %" PRId64 "; j++) for (int64_t d = 0; d < %" PRId64 "; d++) {\n", N, D);
    bprintf(b, "      dk[(b * %" PRId64 " + j) * %" PRId64 " + %s * %" PRId64 " + d] = 0;\n", N, W, kh, D);
    bprintf(b, "      dv[(b * %" PRId64 " + j) * %" PRId64 " + %s * %" PRId64 " + d] = 0;\n    }\n", N, W, kh, D);
    if (per_kv) /* the group's query heads in order: dk, dv summed over them */
      bprintf(b, "    for (int64_t h = hk * %" PRId64 "; h < (hk + 1) * %" PRId64 "; h++) {\n    const int64_t bh = b * %" PRId64
                 " + h;\n", R, R, H);
  }
  bprintf(b, "    for (int64_t i = 0; i < %" PRId64 "; i++) {\n", N);
  bprintf(b, "      const %s *qi = q + (b * %" PRId64 " + i) * %" PRId64 " + h * %" PRId64 ";\n", T, N, C, D);
  if (k->causal) bprintf(b, "      const int64_t n = i + 1;\n");
  else bprintf(b, "      const int64_t n = %" PRId64 ";\n", N);
  /* scores: p_j = scale * sum_d q_d k_jd, summed over d in order */
  bprintf(b, "      for (int64_t j = 0; j < n; j++) p[j] = 0;\n");
  bprintf(b, "      for (int64_t d = 0; d < %" PRId64 "; d++) {\n        const %s qd = qi[d];\n", D, T);
  bprintf(b, "        #pragma omp simd\n        for (int64_t j = 0; j < n; j++) p[j] += qd * kt[d * %" PRId64 " + j];\n      }\n", N);
  bprintf(b, "      %s m = -INFINITY, sum = 0;\n", T);
  bprintf(b, "      for (int64_t j = 0; j < n; j++) { p[j] *= scale; m = p[j] > m ? p[j] : m; }\n");
  bprintf(b, "      #pragma omp simd reduction(+:sum)\n");
  bprintf(b, "      for (int64_t j = 0; j < n; j++) { p[j] = %s(p[j] - m); sum += p[j]; }\n", ex);
  bprintf(b, "      const %s inv = 1 / sum;\n", T);
  bprintf(b, "      for (int64_t j = 0; j < n; j++) p[j] *= inv;\n");
  if (fwd) {
    bprintf(b, "      %s *oi = out + (b * %" PRId64 " + i) * %" PRId64 " + h * %" PRId64 ";\n", T, N, C, D);
    bprintf(b, "      for (int64_t d = 0; d < %" PRId64 "; d++) oi[d] = 0;\n", D);
    bprintf(b, "      for (int64_t j = 0; j < n; j++) {\n");
    bprintf(b, "        const %s pj = p[j], *vj = v + (b * %" PRId64 " + j) * %" PRId64 " + %s * %" PRId64 ";\n", T, N, Ckv,
            kh, D);
    bprintf(b, "        #pragma omp simd\n");
    bprintf(b, "        for (int64_t d = 0; d < %" PRId64 "; d++) oi[d] += pj * vj[d];\n      }\n    }\n  }\n", D);
    return;
  }
  bprintf(b, "      const %s *dyi = dy + (b * %" PRId64 " + i) * %" PRId64 " + h * %" PRId64 ";\n", T, N, C, D);
  /* dv_j += p_j dy_i;  dp_j = dy_i . v_j */
  bprintf(b, "      for (int64_t j = 0; j < n; j++) {\n");
  bprintf(b, "        const %s pj = p[j];\n        %s *dvj = dv + (b * %" PRId64 " + j) * %" PRId64 " + %s * %" PRId64 ";\n",
          T, T, N, W, kh, D);
  bprintf(b, "        #pragma omp simd\n        for (int64_t d = 0; d < %" PRId64 "; d++) dvj[d] += pj * dyi[d];\n", D);
  bprintf(b, "        dp[j] = 0;\n      }\n");
  bprintf(b, "      for (int64_t d = 0; d < %" PRId64 "; d++) {\n        const %s g = dyi[d];\n", D, T);
  bprintf(b, "        #pragma omp simd\n        for (int64_t j = 0; j < n; j++) dp[j] += g * vt[d * %" PRId64 " + j];\n      }\n", N);
  bprintf(b, "      %s dot = 0;\n      for (int64_t j = 0; j < n; j++) dot += p[j] * dp[j];\n", T);
  /* the row's statistics into the workspace after out (ir_workspace_elems),
   * as the CUDA backward keeps them for its key-row kernel */
  bprintf(b, "      %s *st = out + %" PRId64 " + (bh * %" PRId64 " + i) * 3;\n      st[0] = m;\n      st[1] = inv;\n      st[2] = dot;\n",
          T, ST, N);
  /* ds_j = p_j (dp_j - dot) / sqrt(D);  dq_i = sum_j ds_j k_j;  dk_j += ds_j q_i */
  bprintf(b, "      %s *dqi = dq + (b * %" PRId64 " + i) * %" PRId64 " + h * %" PRId64 ";\n", T, N, W, D);
  bprintf(b, "      for (int64_t d = 0; d < %" PRId64 "; d++) dqi[d] = 0;\n", D);
  bprintf(b, "      for (int64_t j = 0; j < n; j++) {\n");
  bprintf(b, "        const %s ds = p[j] * (dp[j] - dot) * scale;\n", T);
  if (!gqa) {
    bprintf(b, "        const int64_t o = (b * %" PRId64 " + j) * %" PRId64 " + h * %" PRId64 ";\n", N, C, D);
    bprintf(b, "        #pragma omp simd\n");
    bprintf(b, "        for (int64_t d = 0; d < %" PRId64 "; d++) { dqi[d] += ds * k[o + d]; dk[o + d] += ds * qi[d]; }\n", D);
    bprintf(b, "      }\n    }\n  }\n");
    return;
  }
  bprintf(b, "        const int64_t o = (b * %" PRId64 " + j) * %" PRId64 " + hk * %" PRId64 ", od = (b * %" PRId64 " + j) * %" PRId64
             " + hk * %" PRId64 ";\n", N, Ckv, D, N, W, D);
  bprintf(b, "        #pragma omp simd\n");
  bprintf(b, "        for (int64_t d = 0; d < %" PRId64 "; d++) { dqi[d] += ds * k[o + d]; dk[od + d] += ds * qi[d]; }\n", D);
  bprintf(b, "      }\n    }\n    }\n  }\n");
}

/* Generation: the new token's key and value go into row s[POS] of the
 * caches, then its query attends to rows 0..s[POS] (causal by
 * construction), with the same numerics as the training kernel; query
 * head h reads key/value head h / (H / KV) of caches of KV heads. */
static void emit_attn_decode(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  const char *ex = k->dtype == DT_F32 ? "expf" : "exp";
  int64_t B = k->batch, N = k->time, C = k->cols, H = k->heads, D = C / H;
  int64_t KV = k->kv_heads > 0 ? k->kv_heads : H, R = H / KV, Ckv = KV * D;
  const char *kh = R > 1 ? "h / " : "h";
  char rs[32] = "";
  if (R > 1) snprintf(rs, sizeof rs, "%" PRId64, R);
  bprintf(b, "  %s%s *q = (%s%s *)t[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *k = (%s%s *)t[%d];\n", BUF(1, "const "));
  bprintf(b, "  %s%s *v = (%s%s *)t[%d];\n", BUF(2, "const "));
  bprintf(b, "  %s%s *kc = (%s%s *)t[%d];\n", BUF(3, ""));
  bprintf(b, "  %s%s *vc = (%s%s *)t[%d];\n", BUF(4, ""));
  bprintf(b, "  %s%s *out = (%s%s *)t[%d];\n", BUF(5, ""));
  bprintf(b, "  const int64_t pos = (int64_t)s[%d];\n  if (pos < 0 || pos >= %" PRId64 ") return;\n", DUET_S_POS, N);
  bprintf(b, "  const %s scale = (%s)%a;\n", T, T, 1.0 / sqrt((double)D));
  bprintf(b, "  for (int64_t bb = 0; bb < %" PRId64 "; bb++) {\n", B);
  bprintf(b, "    for (int64_t c = 0; c < %" PRId64 "; c++) {\n", Ckv);
  bprintf(b, "      kc[(bb * %" PRId64 " + pos) * %" PRId64 " + c] = k[bb * %" PRId64 " + c];\n", N, Ckv, Ckv);
  bprintf(b, "      vc[(bb * %" PRId64 " + pos) * %" PRId64 " + c] = v[bb * %" PRId64 " + c];\n    }\n", N, Ckv, Ckv);
  bprintf(b, "    for (int64_t h = 0; h < %" PRId64 "; h++) {\n", H);
  bprintf(b, "      %s p[%" PRId64 "], m = -INFINITY, sum = 0;\n", T, N);
  bprintf(b, "      const %s *qi = q + bb * %" PRId64 " + h * %" PRId64 ";\n", T, C, D);
  bprintf(b, "      for (int64_t j = 0; j <= pos; j++) {\n");
  bprintf(b, "        const %s *kj = kc + (bb * %" PRId64 " + j) * %" PRId64 " + %s%s * %" PRId64 ";\n", T, N, Ckv, kh, rs, D);
  bprintf(b, "        %s acc = 0;\n        for (int64_t d = 0; d < %" PRId64 "; d++) acc += qi[d] * kj[d];\n", T, D);
  bprintf(b, "        p[j] = acc * scale;\n        m = p[j] > m ? p[j] : m;\n      }\n");
  bprintf(b, "      for (int64_t j = 0; j <= pos; j++) { p[j] = %s(p[j] - m); sum += p[j]; }\n", ex);
  bprintf(b, "      %s *oi = out + bb * %" PRId64 " + h * %" PRId64 ";\n", T, C, D);
  bprintf(b, "      for (int64_t d = 0; d < %" PRId64 "; d++) oi[d] = 0;\n", D);
  bprintf(b, "      for (int64_t j = 0; j <= pos; j++) {\n");
  bprintf(b, "        const %s pj = p[j] / sum, *vj = vc + (bb * %" PRId64 " + j) * %" PRId64 " + %s%s * %" PRId64 ";\n", T,
          N, Ckv, kh, rs, D);
  bprintf(b, "        for (int64_t d = 0; d < %" PRId64 "; d++) oi[d] += pj * vj[d];\n      }\n    }\n  }\n", D);
}

/* Sliding-window kernels over [N,C,H,W] (convolution as im2col + GEMM,
 * pooling).  Output position (oh, ow), window tap (ki, kj) reads input
 * (oh*sh - ph + ki*dh, ow*sw - pw + kj*dw); taps outside the input read
 * zeros (im2col, avg) or are skipped (max).  The backward kernels own one
 * (n, c) plane per iteration, so their scatter-adds are race-free and
 * deterministic. */
static void emit_window(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  int64_t N = k->xs.dim[0], C = k->xs.dim[1], H = k->xs.dim[2], W = k->xs.dim[3];
  int64_t OH = k->ys.dim[2], OW = k->ys.dim[3];
  int64_t KH = k->win[0], KW = k->win[1], SH = k->win[2], SW = k->win[3], PH = k->win[4], PW = k->win[5];
  int64_t DH = k->win[6], DW = k->win[7];
  /* the sizes as int64_t, not enum constants (int): every product of
   * them (a plane H_ * W_, an im2col row C_ * KH * KW) is 64-bit */
  bprintf(b, "  const int64_t N_ = %" PRId64 ", C_ = %" PRId64 ", H_ = %" PRId64 ", W_ = %" PRId64 ", OH = %" PRId64
             ", OW = %" PRId64 ";\n", N, C, H, W, OH, OW);
  bprintf(b, "  const int64_t KH = %" PRId64 ", KW = %" PRId64 ", SH = %" PRId64 ", SW = %" PRId64 ", PH = %" PRId64
             ", PW = %" PRId64 ", DH = %" PRId64 ", DW = %" PRId64 ";\n", KH, KW, SH, SW, PH, PW, DH, DW);
  bprintf(b, "  (void)N_; (void)C_; (void)H_; (void)W_; (void)OH; (void)OW; (void)KH; (void)KW;\n");
  bprintf(b, "  (void)SH; (void)SW; (void)PH; (void)PW; (void)DH; (void)DW;\n");
  switch (k->kind) {
  case KK_IM2COL:
    bprintf(b, "  %s%s *x = (%s%s *)t[%d];\n", BUF(0, "const "));
    bprintf(b, "  %s%s *cols = (%s%s *)t[%d];\n", BUF(1, ""));
    bprintf(b, "  #pragma omp parallel for schedule(static)\n");
    bprintf(b, "  for (int64_t r = 0; r < N_ * OH * OW; r++) {\n");
    bprintf(b, "    const int64_t n = r / (OH * OW), oh = r / OW %% OH, ow = r %% OW;\n");
    bprintf(b, "    %s *row = cols + r * (C_ * KH * KW);\n", T);
    bprintf(b, "    for (int64_t c = 0; c < C_; c++)\n      for (int64_t ki = 0; ki < KH; ki++) {\n");
    bprintf(b, "        const int64_t ih = oh * SH - PH + ki * DH;\n");
    bprintf(b, "        for (int64_t kj = 0; kj < KW; kj++) {\n");
    bprintf(b, "          const int64_t iw = ow * SW - PW + kj * DW;\n");
    bprintf(b, "          row[(c * KH + ki) * KW + kj] = ih >= 0 && ih < H_ && iw >= 0 && iw < W_ ? "
               "x[((n * C_ + c) * H_ + ih) * W_ + iw] : 0;\n        }\n      }\n  }\n");
    return;
  case KK_COL2IM:
    bprintf(b, "  %s%s *cols = (%s%s *)t[%d];\n", BUF(0, "const "));
    bprintf(b, "  %s%s *dx = (%s%s *)t[%d];\n", BUF(1, ""));
    bprintf(b, "  #pragma omp parallel for schedule(static)\n");
    bprintf(b, "  for (int64_t nc = 0; nc < N_ * C_; nc++) {\n");
    bprintf(b, "    const int64_t n = nc / C_, c = nc %% C_;\n    %s *plane = dx + nc * (H_ * W_);\n", T);
    bprintf(b, "    for (int64_t i = 0; i < H_ * W_; i++) plane[i] = 0;\n");
    bprintf(b, "    for (int64_t oh = 0; oh < OH; oh++)\n      for (int64_t ow = 0; ow < OW; ow++) {\n");
    bprintf(b, "        const %s *row = cols + ((n * OH + oh) * OW + ow) * (C_ * KH * KW) + c * KH * KW;\n", T);
    bprintf(b, "        for (int64_t ki = 0; ki < KH; ki++) {\n          const int64_t ih = oh * SH - PH + ki * DH;\n");
    bprintf(b, "          if (ih < 0 || ih >= H_) continue;\n");
    bprintf(b, "          for (int64_t kj = 0; kj < KW; kj++) {\n            const int64_t iw = ow * SW - PW + kj * DW;\n");
    bprintf(b, "            if (iw >= 0 && iw < W_) plane[ih * W_ + iw] += row[ki * KW + kj];\n          }\n        }\n      }\n  }\n");
    return;
  default:
    break;
  }
  /* pooling: one (n, c) plane per iteration */
  bool fwd = k->kind == KK_MAXPOOL || k->kind == KK_AVGPOOL, mx = k->kind == KK_MAXPOOL || k->kind == KK_MAXPOOL_GRAD;
  if (fwd) {
    bprintf(b, "  %s%s *x = (%s%s *)t[%d];\n", BUF(0, "const "));
    bprintf(b, "  %s%s *y = (%s%s *)t[%d];\n", BUF(1, ""));
  } else {
    bprintf(b, "  %s%s *dy = (%s%s *)t[%d];\n", BUF(0, "const "));
    if (mx) bprintf(b, "  %s%s *x = (%s%s *)t[%d];\n", BUF(1, "const "));
    bprintf(b, "  %s%s *dx = (%s%s *)t[%d];\n", BUF(mx ? 2 : 1, ""));
  }
  bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t nc = 0; nc < N_ * C_; nc++) {\n");
  if (!fwd) bprintf(b, "    %s *dp = dx + nc * (H_ * W_);\n    for (int64_t i = 0; i < H_ * W_; i++) dp[i] = 0;\n", T);
  if (fwd || mx) bprintf(b, "    const %s *xp = x + nc * (H_ * W_);\n", T);
  bprintf(b, "    for (int64_t oh = 0; oh < OH; oh++)\n      for (int64_t ow = 0; ow < OW; ow++) {\n");
  bprintf(b, "        const int64_t o = (nc * OH + oh) * OW + ow;\n");
  if (mx) bprintf(b, "        %s m = -INFINITY;\n        int64_t am = -1;\n", T);
  else bprintf(b, "        %s acc = 0;\n", T);
  bprintf(b, "        for (int64_t ki = 0; ki < KH; ki++) {\n          const int64_t ih = oh * SH - PH + ki * DH;\n");
  bprintf(b, "          if (ih < 0 || ih >= H_) continue;\n");
  bprintf(b, "          for (int64_t kj = 0; kj < KW; kj++) {\n            const int64_t iw = ow * SW - PW + kj * DW;\n");
  bprintf(b, "            if (iw < 0 || iw >= W_) continue;\n");
  if (mx) bprintf(b, "            if (xp[ih * W_ + iw] > m || am < 0) { m = xp[ih * W_ + iw]; am = ih * W_ + iw; }\n");
  else if (fwd) bprintf(b, "            acc += xp[ih * W_ + iw];\n");
  else bprintf(b, "            dp[ih * W_ + iw] += dy[o] / (%s)(KH * KW);\n", T);
  bprintf(b, "          }\n        }\n");
  if (k->kind == KK_MAXPOOL) bprintf(b, "        y[o] = m;\n");
  else if (k->kind == KK_MAXPOOL_GRAD) bprintf(b, "        if (am >= 0) dp[am] += dy[o];\n");
  else if (k->kind == KK_AVGPOOL) bprintf(b, "        y[o] = acc / (%s)(KH * KW);\n", T);
  bprintf(b, "      }\n  }\n");
}

/* Unscale and overflow check in one pass (torch's
 * _amp_foreach_non_finite_check_and_unscale_): y = g * (1/S) in f32; the
 * flag is an OR over the elements (order-free, so deterministic), written
 * once.  |y| <= FLT_MAX is false for inf and NaN. */
static void emit_unscale(Buf *b, const Kernel *k) {
  const KBuf *g = &k->bufs[0];
  bprintf(b, "  const %s *x = (const %s *)t[0];\n  float *y = (float *)t[1];\n", ctype(g->dtype), ctype(g->dtype));
  bprintf(b, "  int32_t *overflow = (int32_t *)t[2]; /* this param's flag */\n");
  bprintf(b, "  const float inv = (float)s[%d];\n  int bad = 0;\n", DUET_S_INV_LOSS_SCALE);
  if (k->n >= PAR_MIN) bprintf(b, "  #pragma omp parallel for simd schedule(static) reduction(|:bad)\n");
  else bprintf(b, "  #pragma omp simd reduction(|:bad)\n");
  bprintf(b, "  for (int64_t i = 0; i < %" PRId64 "; i++) {\n", k->n);
  bprintf(b, "    const float v = %s%sx[i]%s * inv;\n", load_fn(g->dtype), is16(g->dtype) ? "(" : "",
          is16(g->dtype) ? ")" : "");
  bprintf(b, "    bad |= !(v <= 3.40282347e+38f && v >= -3.40282347e+38f);\n    y[i] = v;\n  }\n");
  bprintf(b, "  *overflow = bad;\n");
}

/* Gradient clipping: the sum of squares of g in double, over at most 64
 * chunks of consecutive elements (each summed in order, in parallel), the
 * chunks' sums then added in order: the same bits whatever the thread
 * count.  Squares of f32 values are exact in double; the sum of n terms
 * errs by at most gamma_{n-1} sum g^2, gamma_k = k 2^-53 / (1 - k 2^-53)
 * (Higham, "Accuracy and Stability of Numerical Algorithms", sec. 4.2). */
static void emit_sumsq(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  int64_t n = k->n, nch = n / 16384 + 1;
  if (nch > 64) nch = 64;
  bprintf(b, "  const %s *x = (const %s *)t[0];\n  double *out = (double *)t[1]; /* in the flags buffer */\n", T, T);
  bprintf(b, "  double part[%" PRId64 "];\n", nch);
  if (nch > 1) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t c = 0; c < %" PRId64 "; c++) {\n    double acc = 0;\n", nch);
  bprintf(b, "    for (int64_t r = %" PRId64 " * c / %" PRId64 "; r < %" PRId64 " * (c + 1) / %" PRId64 "; r++) {\n", n,
          nch, n, nch);
  bprintf(b, "      const double v = (double)x[r];\n      acc += v * v;\n    }\n    part[c] = acc;\n  }\n");
  bprintf(b, "  double tot = 0;\n  for (int64_t c = 0; c < %" PRId64 "; c++) tot += part[c];\n  *out = tot;\n", nch);
}

/* Gradient clipping: g *= the coefficient (a double in the flags buffer),
 * rounded to g's dtype first, as torch multiplies an f32 gradient by an f32
 * clip_coef. */
static void emit_clip_scale(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  bprintf(b, "  %s *x = (%s *)t[0];\n  const %s c = (%s)*(const double *)t[1]; /* in the flags buffer */\n", T, T, T,
          T);
  if (k->n >= PAR_MIN) bprintf(b, "  #pragma omp parallel for simd schedule(static)\n");
  else bprintf(b, "  #pragma omp simd\n");
  bprintf(b, "  for (int64_t i = 0; i < %" PRId64 "; i++) x[i] = x[i] * c;\n", k->n);
}

static void emit_positions(Buf *b, const Kernel *k) {
  bprintf(b, "  int32_t *out = (int32_t *)t[%d];\n", 1);
  bprintf(b, "  const int32_t base = (int32_t)s[%d];\n", DUET_S_POS);
  bprintf(b, "  for (int64_t i = 0; i < %" PRId64 "; i++) out[i] = base + (int32_t)i;\n", k->rows);
}

static void emit_transpose(Buf *b, const Kernel *k) {
  const char *T = ctype(k->dtype);
  int64_t R = k->rows, C = k->cols;
  bprintf(b, "  %s%s *x = (%s%s *)t[%d];\n", BUF(0, "const "));
  bprintf(b, "  %s%s *y = (%s%s *)t[%d];\n", BUF(1, ""));
  if (R * C >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t r0 = 0; r0 < %" PRId64 "; r0 += 32)\n", R);
  bprintf(b, "    for (int64_t c0 = 0; c0 < %" PRId64 "; c0 += 32)\n", C);
  bprintf(b, "      for (int64_t r = r0; r < r0 + 32 && r < %" PRId64 "; r++)\n", R);
  bprintf(b, "        for (int64_t c = c0; c < c0 + 32 && c < %" PRId64 "; c++) y[c * %" PRId64 " + r] = x[r * %" PRId64 " + c];\n",
          C, R, C);
}

/* The tables of the 8-bit state maps (runtime/duet_q8.h), each entry
 * exact (hexadecimal), `qual` before every declaration ("static const",
 * CUDA's "__device__ const"): duet_q8_dec_s/_u[code] the value of a code
 * in the signed (exp_avg) and unsigned (exp_avg_sq) maps; duet_q8_thr_s/_u
 * the thresholds between neighbouring sorted values and duet_q8_code_s/_u
 * the sorted values' codes; and the encoder duet_q8_enc (`fqual` before
 * it), duet_q8_encode's binary search, and duet_q8_amax, the
 * NaN-propagating |x| fold of a block's scale. */
void codegen_q8_tables(Buf *b, const char *qual, const char *fqual) {
  bool cuda = fqual[0] == '_'; /* CUDA: __float_as_uint */
  for (int sg = 1; sg >= 0; sg--) {
    DuetQ8Map m;
    if (duet_q8_map(&m, sg)) duet_fatal(__FILE__, __LINE__, "codegen: an 8-bit map's table cell holds two thresholds");
    const char *sx = sg ? "s" : "u";
    bprintf(b, "%s float duet_q8_dec_%s[256] = {", qual, sx);
    for (int c = 0; c < 256; c++) bprintf(b, "%s%a", c % 8 ? ", " : c ? ",\n  " : "\n  ", m.dec[c]);
    bprintf(b, "};\n%s float duet_q8_thr_%s[%d] = {", qual, sx, m.n);
    /* the last threshold (the header's +inf, which CUDA cannot write in a
     * constant initializer) is FLT_MAX, and the code after the last is the
     * last again: the same code for every x, +inf included */
    for (int k = 0; k < m.n; k++)
      bprintf(b, "%s%a", k % 8 ? ", " : k ? ",\n  " : "\n  ", isinf(m.thr[k]) ? (double)FLT_MAX : (double)m.thr[k]);
    bprintf(b, "};\n%s unsigned char duet_q8_code_%s[%d] = {", qual, sx, m.n + 1);
    for (int k = 0; k <= m.n; k++)
      bprintf(b, "%s%d", k % 16 ? ", " : k ? ",\n  " : "\n  ", m.code[k < m.n ? k : m.n - 1]);
    bprintf(b, "};\n%s unsigned char duet_q8_lut_%s[%d] = {", qual, sx, DUET_Q8_LUT);
    for (int k = 0; k < DUET_Q8_LUT; k++) bprintf(b, "%s%d", k % 32 ? "," : k ? ",\n  " : "\n  ", m.lut[k]);
    bprintf(b, "};\n");
  }
  bprintf(b, "/* the code of the map value nearest x in magnitude (ties to the smaller), x's sign in a\n"
             " * signed map: the thresholds below |x|, from the table cell of |x|'s top bits */\n"
             "%s unsigned char duet_q8_enc(const unsigned char *lut, const float *thr, const unsigned char *code,\n"
             "                                 int is_signed, float x) {\n"
             "  const float y = fabsf(x); /* +0 for -0 */\n", fqual);
  if (cuda) bprintf(b, "  const duet_u32 u = __float_as_uint(y);\n");
  else bprintf(b, "  const union { float f; uint32_t u; } bits = {y};\n  const uint32_t u = bits.u;\n");
  bprintf(b, "  int c = (int)(u >> %d) - %d;\n  c = c < 0 ? 0 : c > %d ? %d : c;\n", 23 - DUET_Q8_LUT_BITS,
          (127 + DUET_Q8_LUT_EMIN) << DUET_Q8_LUT_BITS, DUET_Q8_LUT - 1, DUET_Q8_LUT - 1);
  bprintf(b, "  int k = lut[c];\n  k += y > thr[k];\n"
             "  k += !is_signed && k == 0 && y > 0; /* a positive second moment never becomes 0 */\n"
             "  return (unsigned char)(code[k] | (is_signed && x < 0 && k > 0 ? 0x80 : 0));\n}\n"
             "/* a block's scale: the largest |x|, NaN propagating */\n"
             "%s float duet_q8_amax(float a, float x) {\n"
             "  const float ax = x < 0 ? -x : x;\n"
             "  return ax > a || ax != ax ? ax : a;\n}\n\n",
          fqual);
}

/* AdamW with 8-bit block-wise state (runtime/duet_q8.h): per block of
 * DUET_Q8_BLOCK values, decode both moments (map value * the block's
 * scale, in f32), the f32 AdamW step of lower_optimizer's elementwise
 * kernel with the same operations in the same order, then the new scales
 * (largest |moment|) and codes.  Blocks are independent: the threads split
 * them without changing a bit. */
static void emit_adamw8(Buf *b, const Kernel *k) {
  int64_t N = k->n, NB = duet_q8_blocks(N);
  bprintf(b, "  float *p = (float *)t[0];\n  const float *g = (const float *)t[1];\n");
  bprintf(b, "  uint8_t *mq = (uint8_t *)t[2], *vq = (uint8_t *)t[3];\n  float *ma = (float *)t[4], *va = (float *)t[5];\n");
  bprintf(b, "  const float decay = (float)s[%d], b2 = (float)s[%d], eps = (float)s[%d];\n", DUET_S_DECAY, DUET_S_BETA2,
          DUET_S_EPS);
  bprintf(b, "  const float omb1 = (float)s[%d], omb2 = (float)s[%d], ss = (float)s[%d], bc2 = (float)s[%d];\n",
          DUET_S_ONE_MINUS_BETA1, DUET_S_ONE_MINUS_BETA2, DUET_S_STEP_SIZE, DUET_S_BC2_SQRT);
  if (k->no_decay) bprintf(b, "  (void)decay;\n");
  if (N >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t blk = 0; blk < %" PRId64 "; blk++) {\n", NB);
  bprintf(b, "    float m1[%d], v1[%d];\n", DUET_Q8_BLOCK, DUET_Q8_BLOCK);
  bprintf(b, "    const int64_t lo = blk * %d, len = lo + %d <= %" PRId64 " ? %d : %" PRId64 " - lo;\n", DUET_Q8_BLOCK,
          DUET_Q8_BLOCK, N, DUET_Q8_BLOCK, N);
  bprintf(b, "    const float am = ma[blk], av = va[blk];\n    float nm = 0, nv = 0;\n");
  bprintf(b, "    for (int64_t j = 0; j < len; j++) {\n      const int64_t i = lo + j;\n");
  bprintf(b, "      const float m = duet_q8_dec_s[mq[i]] * am, v = duet_q8_dec_u[vq[i]] * av, gi = g[i];\n");
  bprintf(b, "      const float p1 = %s;\n", k->no_decay ? "p[i]" : "p[i] * decay");
  bprintf(b, "      const float mn = m + (gi - m) * omb1;\n");
  bprintf(b, "      const float vn = b2 * v + omb2 * (gi * gi);\n");
  bprintf(b, "      const float den = sqrtf(vn) / bc2 + eps;\n");
  bprintf(b, "      p[i] = p1 - ss * (mn / den);\n");
  bprintf(b, "      m1[j] = mn;\n      v1[j] = vn;\n");
  bprintf(b, "      nm = duet_q8_amax(nm, mn);\n      nv = duet_q8_amax(nv, vn);\n    }\n");
  bprintf(b, "    ma[blk] = nm;\n    va[blk] = nv;\n");
  bprintf(b, "    for (int64_t j = 0; j < len; j++) {\n");
  bprintf(b, "      mq[lo + j] = duet_q8_enc(duet_q8_lut_s, duet_q8_thr_s, duet_q8_code_s, 1, nm == 0 ? 0.0f : m1[j] / nm);\n");
  bprintf(b, "      vq[lo + j] = duet_q8_enc(duet_q8_lut_u, duet_q8_thr_u, duet_q8_code_u, 0, nv == 0 ? 0.0f : v1[j] / nv);\n");
  bprintf(b, "    }\n  }\n");
}

/* The int8 GEMM (KK_GEMM_I8; passes/quantize.c, --calibrate), written
 * here rather than through BLAS (OpenBLAS has no int8 GEMM).  Tiles of
 * 4 rows x 256 output channels, each with int32 accumulators on the
 * stack, over blocks of 256 inputs: a block of x is quantized into bytes
 * (xq = x / sa rounded half to even, clamped to +-127, NaN to 0, as
 * duet_quantize_i8 does for weights), then summed as int8 x int8 -> int32
 * (x @ q: a row of q times a byte of x into each accumulator row;
 * x @ transpose(q): dot products over the block).  The sums are exact (the
 * pass caps K * 127 * 127 below 2^31), so any order and any vector width
 * give the same bits; the output is (float)acc * sa * sw[n].  The tiles are
 * independent (one thread each).  While sa <= 0 the kernel calibrates: it
 * keeps -max|x| (over x and -sa) in sa and computes y = sum_k x (q sw) in
 * f32, k ascending, one rounding per operation (the CUDA kernel's order). */
static void emit_gemm_i8(Buf *b, const Kernel *k) {
  int64_t M = k->rows, N = k->cols, K = k->red;
  enum { RB = 4, NB = 256, KB = 256 };
  bool tb = k->trans_b;
  const char *sw = k->n == 1 ? "sw[0]" : "sw[n]";
  char qi[96];
  snprintf(qi, sizeof qi, tb ? "n * %" PRId64 " + kk" : "kk * %" PRId64 " + n", tb ? K : N);
  bprintf(b, "  const float *x = (const float *)t[0];\n  const int8_t *q = (const int8_t *)t[1];\n");
  bprintf(b, "  const float *sw = (const float *)t[2];\n  float *sa = (float *)t[3];\n  float *y = (float *)t[4];\n");
  bprintf(b, "  const float a = sa[0];\n");
  bprintf(b, "  if (!(a > 0)) { /* calibration: -max|x| into sa, y in f32 */\n    float m = -a;\n");
  bprintf(b, "    for (int64_t i = 0; i < %" PRId64 "; i++) {\n      const float v = fabsf(x[i]);\n"
             "      if (v > m) m = v;\n    }\n    sa[0] = -fabsf(m);\n", M * K);
  if (M * N * K >= PAR_MIN) bprintf(b, "    #pragma omp parallel for schedule(static)\n");
  bprintf(b, "    for (int64_t r = 0; r < %" PRId64 "; r++)\n      for (int64_t n = 0; n < %" PRId64 "; n++) {\n",
          M, N);
  bprintf(b, "        float acc = 0;\n        for (int64_t kk = 0; kk < %" PRId64 "; kk++)\n", K);
  bprintf(b, "          acc += x[r * %" PRId64 " + kk] * ((float)q[%s] * %s);\n", K, qi, sw);
  bprintf(b, "        y[r * %" PRId64 " + n] = acc;\n      }\n    return;\n  }\n", N);
  int64_t nrb = (M + RB - 1) / RB, nnb = (N + NB - 1) / NB;
  if (M * N * K >= PAR_MIN) bprintf(b, "  #pragma omp parallel for schedule(static)\n");
  bprintf(b, "  for (int64_t tile = 0; tile < %" PRId64 "; tile++) {\n", nrb * nnb);
  bprintf(b, "    const int64_t r0 = tile / %" PRId64 " * %d, n0 = tile %% %" PRId64 " * %d;\n", nnb, RB, nnb, NB);
  bprintf(b, "    const int64_t rl = %" PRId64 " - r0 < %d ? %" PRId64 " - r0 : %d;\n", M, RB, M, RB);
  bprintf(b, "    const int64_t nl = %" PRId64 " - n0 < %d ? %" PRId64 " - n0 : %d;\n", N, NB, N, NB);
  bprintf(b, "    int32_t acc[%d][%d];\n    int8_t xq[%d][%d];\n", RB, NB, RB, KB);
  bprintf(b, "    for (int r = 0; r < %d; r++)\n      for (int n = 0; n < %d; n++) acc[r][n] = 0;\n", RB, NB);
  bprintf(b, "    for (int64_t k0 = 0; k0 < %" PRId64 "; k0 += %d) {\n", K, KB);
  bprintf(b, "      const int64_t kl = %" PRId64 " - k0 < %d ? %" PRId64 " - k0 : %d;\n", K, KB, K, KB);
  bprintf(b, "      for (int64_t r = 0; r < %d; r++)\n        for (int64_t j = 0; j < kl; j++) {\n", RB);
  bprintf(b, "          const float v = r < rl ? nearbyintf(x[(r0 + r) * %" PRId64 " + k0 + j] / a) : 0;\n", K);
  bprintf(b, "          xq[r][j] = v != v ? 0 : v > 127 ? 127 : v < -127 ? -127 : (int8_t)v;\n        }\n");
  if (!tb) {
    /* two inputs at a time: x0 q0 + x1 q1 is at most 2 x 127^2 = 32258 in
     * magnitude, exact in 16 bits (16-bit vector multiplies), then added
     * to the int32 sums; an odd last input alone */
    bprintf(b, "      int64_t j = 0;\n      for (; j + 1 < kl; j += 2) {\n");
    bprintf(b, "        const int8_t *q0 = q + (k0 + j) * %" PRId64 " + n0, *q1 = q0 + %" PRId64 ";\n", N, N);
    bprintf(b, "        for (int r = 0; r < %d; r++) {\n", RB);
    bprintf(b, "          const int16_t x0 = xq[r][j], x1 = xq[r][j + 1];\n");
    bprintf(b, "          for (int64_t n = 0; n < nl; n++) acc[r][n] += (int16_t)(x0 * q0[n] + x1 * q1[n]);\n        }\n      }\n");
    bprintf(b, "      if (j < kl) {\n        const int8_t *q0 = q + (k0 + j) * %" PRId64 " + n0;\n", N);
    bprintf(b, "        for (int r = 0; r < %d; r++) {\n          const int16_t x0 = xq[r][j];\n", RB);
    bprintf(b, "          for (int64_t n = 0; n < nl; n++) acc[r][n] += (int16_t)(x0 * q0[n]);\n        }\n      }\n");
  } else {
    bprintf(b, "      for (int64_t n = 0; n < nl; n++) {\n");
    bprintf(b, "        const int8_t *qr = q + (n0 + n) * %" PRId64 " + k0;\n", K);
    bprintf(b, "        for (int r = 0; r < %d; r++) {\n          int32_t d = 0;\n", RB);
    bprintf(b, "          for (int64_t j = 0; j < kl; j++) d += (int32_t)xq[r][j] * (int32_t)qr[j];\n");
    bprintf(b, "          acc[r][n] += d;\n        }\n      }\n");
  }
  bprintf(b, "    }\n");
  bprintf(b, "    for (int64_t r = 0; r < rl; r++)\n      for (int64_t c = 0; c < nl; c++) {\n");
  bprintf(b, "        const int64_t n = n0 + c;\n");
  bprintf(b, "        y[(r0 + r) * %" PRId64 " + n] = (float)acc[r][c] * a * %s;\n      }\n  }\n", N, sw);
}

/* The body of kernel k (its arguments t[0..], the scalars s). */
static void emit_kernel_body(Buf *b, const Kernel *k) {
  switch (k->kind) {
  case KK_ELEMENTWISE: emit_elementwise(b, k); break;
  case KK_REDUCE: case KK_MAX_GRAD: emit_reduce(b, k); break;
  case KK_EMBED_FWD: case KK_EMBED_BWD: emit_embed(b, k); break;
  case KK_NORM_FWD: case KK_NORM_BWD: emit_norm(b, k); break;
  case KK_ATTN_FWD: case KK_ATTN_BWD: emit_attention(b, k); break;
  case KK_TRANSPOSE: emit_transpose(b, k); break;
  case KK_POSITIONS: emit_positions(b, k); break;
  case KK_IM2COL: case KK_COL2IM: case KK_MAXPOOL: case KK_MAXPOOL_GRAD: case KK_AVGPOOL: case KK_AVGPOOL_GRAD:
    emit_window(b, k);
    break;
  case KK_ATTN_DECODE: emit_attn_decode(b, k); break;
  case KK_UNSCALE: emit_unscale(b, k); break;
  case KK_SOFTMAX: case KK_SOFTMAX_BWD: emit_softmax(b, k); break;
  case KK_RMSNORM_FWD: case KK_RMSNORM_BWD: emit_rmsnorm(b, k); break;
  case KK_ROPE: emit_rope(b, k); break;
  case KK_MSE: emit_mse(b, k); break;
  case KK_SUMSQ: emit_sumsq(b, k); break;
  case KK_CLIP_SCALE: emit_clip_scale(b, k); break;
  case KK_ADAMW8: emit_adamw8(b, k); break;
  case KK_GEMM_I8: emit_gemm_i8(b, k); break;
  case KK_ATTN_BWD_KV: /* the C attention backward computes dq, dk and dv in one kernel */
    bprintf(b, "  (void)t; /* dk, dv: written by the attention backward kernel before this one */\n");
    break;
  default: emit_rows(b, k); break;
  }
}

char *codegen_emit_c(const CgProgram *cp, Arena *a) {
  Buf b = {.a = a};
  bprintf(&b, "/* generated by duet (codegen/emit_c.c): %d kernels */\n", cp->n_kernels); /* functions: see the end */
  bprintf(&b, "#include <math.h>\n#include <stdint.h>\n\n");
  /* glibc's vector math library (libmvec) has SIMD variants of these;
   * math.h declares them only under -ffast-math, which duet does not use */
  bprintf(&b, "#if defined(__x86_64__) && defined(__GLIBC__)\n"
              "float expf(float) __attribute__((__simd__(\"notinbranch\")));\n"
              "float tanhf(float) __attribute__((__simd__(\"notinbranch\")));\n"
              "#endif\n");
  bprintf(&b, "#pragma omp declare simd notinbranch\n"
              "static inline float gelu_grad_float(float dy, float x) {\n"
              "  const float c = 0.7978845608028654f, a = 0.044715f, th = tanhf(c * (x + a * x * x * x));\n"
              "  return dy * (0.5f * (1 + th) + 0.5f * x * (1 - th * th) * c * (1 + 3 * a * x * x));\n}\n");
  bprintf(&b, "/* dropout masks: a splitmix64-style hash of (step seed, site, element) (Steele et al. 2014) */\n"
              "#pragma omp declare simd notinbranch\n"
              "static inline int dropout_keep(uint64_t seed, uint64_t site, uint64_t i, uint64_t thr) {\n"
              "  uint64_t z = seed ^ (site * 0xD1B54A32D192ED03ull) ^ (i * 0x9E3779B97F4A7C15ull);\n"
              "  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;\n  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;\n"
              "  return (z ^ (z >> 31)) >= thr;\n}\n");
  bprintf(&b, "#pragma omp declare simd notinbranch\n"
              "static inline double gelu_grad_double(double dy, double x) {\n"
              "  const double c = 0.7978845608028654, a = 0.044715, th = tanh(c * (x + a * x * x * x));\n"
              "  return dy * (0.5 * (1 + th) + 0.5 * x * (1 - th * th) * c * (1 + 3 * a * x * x));\n}\n\n");
  bool used[KI_COUNT] = {false}; /* the opcodes some kernel uses: their helpers */
  for (int i = 0; i < cp->n_kernels; i++)
    for (int j = 0; j < cp->kernels[i].n_ins; j++) used[cp->kernels[i].ins[j].op] = true;
  if (used[KI_LOG])
    bprintf(&b, "#if defined(__x86_64__) && defined(__GLIBC__)\n"
                "float logf(float) __attribute__((__simd__(\"notinbranch\")));\n#endif\n");
  for (int w = 0; w < 2 && (used[KI_SIGMOID] || used[KI_SILU] || used[KI_SILU_GRAD]); w++) {
    const char *T = w ? "double" : "float", *f = w ? "" : "f";
    /* the logistic function from exp(-|x|) (at most 1: no overflow for
     * any x; the quotient keeps its relative accuracy for large |x| of
     * either sign); NaN stays NaN */
    bprintf(&b, "#pragma omp declare simd notinbranch\n"
                "static inline %s sigmoid_%s(%s x) {\n  const %s e = exp%s(-fabs%s(x));\n"
                "  return (x >= 0 ? 1 : e) / (1 + e);\n}\n", T, T, T, T, f, f);
    /* silu'(x) = s (1 + x (1 - s)), s = sigmoid(x) */
    if (used[KI_SILU_GRAD])
      bprintf(&b, "#pragma omp declare simd notinbranch\n"
                  "static inline %s silu_grad_%s(%s dy, %s x) {\n  const %s s = sigmoid_%s(x);\n"
                  "  return dy * (s * (1 + x * (1 - s)));\n}\n", T, T, T, T, T, T);
  }
  /* quantization-aware training: w quantized to int8 and back with scale
   * m / 127 (m: its channel's max |w|), rounded half to even, clamped to
   * [-127, 127]; scale 1 for m = 0 (or not finite), FLT_MIN below it:
   * duet_quantize_i8's numbers (runtime/quant.c), bit for bit in f32 */
  for (int w = 0; w < 2 && used[KI_FAKE_QUANT]; w++) {
    const char *T = w ? "double" : "float", *f = w ? "" : "f";
    bprintf(&b, "#pragma omp declare simd notinbranch\n"
                "static inline %s fake_quant_%s(%s x, %s m) {\n"
                "  %s s = m / (%s)127;\n"
                "  if (!(m > 0 && m <= (%s)%a)) s = 1;\n"
                "  else if (s < (%s)0x1p-126) s = (%s)0x1p-126;\n"
                "  %s q = nearbyint%s(x / s);\n"
                "  q = q > 127 ? 127 : q < -127 ? -127 : q;\n"
                "  return q * s;\n}\n", T, T, T, T, T, T, T, w ? 1.7976931348623157e308 : (double)3.40282346638528859812e+38F,
            T, T, T, f);
  }
  bool half = false; /* 16-bit tensors: the conversions of runtime/duet_half.h */
  for (int i = 0; i < cp->n_kernels && !half; i++) {
    const Kernel *k = &cp->kernels[i];
    half = is16(k->dtype);
    for (int j = 0; j < k->n_bufs; j++) half |= is16(k->bufs[j].dtype);
    for (int j = 0; j < k->n_ins; j++) half |= k->ins[j].op == KI_CAST;
  }
  if (half) bprintf(&b, "%s\n", duet_half_src);
  bool q8 = false; /* 8-bit AdamW state: the maps' tables */
  for (int i = 0; i < cp->n_kernels; i++) q8 |= cp->kernels[i].kind == KK_ADAMW8;
  if (q8) codegen_q8_tables(&b, "static const", "static inline");
  bprintf(&b, "typedef void (*duet_kernel_fn)(void *const *t, const double *s);\n\n");
  KernelFuncs funcs = {.a = a};
  int *fn_of = arena_alloc(a, (size_t)(cp->n_kernels + 1) * sizeof *fn_of);
  for (int i = 0; i < cp->n_kernels; i++) {
    const Kernel *k = &cp->kernels[i];
    Buf u = {.a = a};
    Buf *bb = &u;
    bprintf(bb, "static void duet_k" FN "(void *const *t, const double *s) {\n");
    if (k->kind != KK_EVAL_METRICS && k->kind != KK_POSITIONS && k->kind != KK_ATTN_DECODE && k->kind != KK_UNSCALE &&
        k->kind != KK_ROPE && k->kind != KK_ADAMW8)
      bprintf(bb, "  (void)s;\n");
    emit_kernel_body(bb, k);
    bprintf(bb, "}\n\n");
    fn_of[i] = kfuncs_add(&funcs, u.s);
  }
  kfuncs_write(&funcs, &b);
  /* the kernels: each picks its arguments from the tensor table (the
   * overflow flags of fp16 loss scaling follow the tensors: t[n_tensors]) */
  const DuetProgram *p = &cp->prog;
  for (int i = 0; i < cp->n_kernels; i++) {
    bprintf(&b, "static void duet_i%d(void *const *t, const double *s) {\n  void *const a[] = {", i);
    for (int j = p->kernel_arg_off[i]; j < p->kernel_arg_off[i + 1]; j++) {
      int id = p->kernel_args[j];
      if (id < p->n_tensors) bprintf(&b, "t[%d], ", id);
      else bprintf(&b, "(int32_t *)t[%d] + %d, ", p->n_tensors, id - p->n_tensors);
    }
    bprintf(&b, "};\n  duet_k%d(a, s);\n}\n", fn_of[i]);
  }
  bprintf(&b, "\nconst int duet_function_count = %d;\n", funcs.n);
  bprintf(&b, "const int duet_kernel_count = %d;\n", cp->n_kernels);
  bprintf(&b, "const duet_kernel_fn duet_kernel_table[] = {\n");
  for (int i = 0; i < cp->n_kernels; i++) bprintf(&b, "  duet_i%d,\n", i);
  if (!cp->n_kernels) bprintf(&b, "  0,\n");
  bprintf(&b, "};\n");
  return b.s;
}

/* ------------------------------------------------------ the executable */

/* Strings are written as byte arrays, never as C literals of user text. */
static void write_bytes(FILE *out, const char *name, const char *s) {
  fprintf(out, "static const char %s[] = {", name);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) fprintf(out, "%u,", *p);
  fprintf(out, "0};\n");
}

static void write_ints(FILE *out, const char *name, const int32_t *v, int n) {
  fprintf(out, "static const int32_t %s[] = {", name);
  for (int i = 0; i < n; i++) fprintf(out, "%s%d,", i % 16 ? "" : "\n  ", v[i]);
  fprintf(out, "%s};\n", n ? "\n" : "0");
}

static void write_steps(FILE *out, const char *name, const DuetStep *s, int n) {
  fprintf(out, "static const DuetStep %s[] = {\n", name);
  for (int i = 0; i < n; i++)
    fprintf(out, "  {%d, %d, %d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", %d, %d, %d, %d},\n", s[i].kind,
            s[i].kernel, s[i].ta, s[i].tb, s[i].m, s[i].n, s[i].k, s[i].a, s[i].b, s[i].c, s[i].dtype);
  if (!n) fprintf(out, "  {0},\n");
  fprintf(out, "};\n");
}

/* The embedded weights: the file `path` in .rodata as the bytes of symbol
 * duet_embedded_weights (GNU as and LLVM's integrated assembler take
 * .incbin; ELF sections).  The path is written octal-escaped for the
 * assembler's string inside octal-escaped C, so no character of it can
 * end either string. */
static void write_incbin(FILE *out, const char *path) {
  fprintf(out, "/* the weights (duet compile --checkpoint): a safetensors file, read-only data */\n");
  fprintf(out, "__asm__(\".pushsection .rodata\\n.balign 64\\n.globl duet_embedded_weights\\n"
               ".hidden duet_embedded_weights\\nduet_embedded_weights:\\n.incbin \\\"");
  for (const unsigned char *c = (const unsigned char *)path; *c; c++) {
    char as[8]; /* the assembler's text of this byte */
    if (isalnum(*c) || *c == '/' || *c == '.' || *c == '_' || *c == '-') snprintf(as, sizeof as, "%c", *c);
    else snprintf(as, sizeof as, "\\%03o", *c);
    for (const char *a = as; *a; a++) /* as C text */
      if (isalnum((unsigned char)*a) || *a == '/' || *a == '.' || *a == '_' || *a == '-') fputc(*a, out);
      else fprintf(out, "\\%03o", (unsigned char)*a);
  }
  fprintf(out, "\\\"\\n.popsection\\n\");\nextern const unsigned char duet_embedded_weights[];\n\n");
}

void codegen_write_executable_c(const CgProgram *cp, const char *kernel_src, FILE *out) {
  const DuetProgram *p = &cp->prog;
  fprintf(out, "/* generated by duet compile: a standalone training executable */\n");
  fprintf(out, "#include \"duet_rt.h\"\n\n");
  fputs(kernel_src, out);
  fprintf(out, "\n");
  if (cp->weights_file) write_incbin(out, cp->weights_file);
  for (int i = 0; i < p->n_tensors; i++) {
    char nm[32];
    snprintf(nm, sizeof nm, "tname%d", i);
    write_bytes(out, nm, p->tensors[i].name);
  }
  write_bytes(out, "model_name", p->model_name);
  write_bytes(out, "data_path", p->defaults.data_path);
  if (p->defaults.data_y) write_bytes(out, "data_y", p->defaults.data_y);
  if (p->defaults.val_x) write_bytes(out, "val_x", p->defaults.val_x);
  if (p->defaults.val_y) write_bytes(out, "val_y", p->defaults.val_y);
  if (p->defaults.devices) write_bytes(out, "devices", p->defaults.devices);
  fprintf(out, "static const DuetTensor tensors[] = {\n");
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *t = &p->tensors[i];
    fprintf(out, "  {tname%d, %d, %d, %d, {", i, t->region, t->dtype, t->rank);
    for (int d = 0; d < DUET_MAX_RANK; d++) fprintf(out, "%" PRId64 ",", d < t->rank ? t->shape[d] : 0);
    fprintf(out, "}, %" PRId64 ", %" PRId64 ", %d, %.17g, %.17g, %d, %d},\n", t->offset, t->nbytes, t->init,
            t->init_a, t->init_b, t->stage, t->is_grad);
  }
  fprintf(out, "};\n");
  write_ints(out, "kernel_arg_off", p->kernel_arg_off, p->n_kernels + 1);
  write_ints(out, "kernel_args", p->kernel_args, p->kernel_arg_off[p->n_kernels]);
  if (p->cuda_source) { /* CUDA C (no user text) and launch table, for --devices cuda */
    write_bytes(out, "cuda_source", p->cuda_source);
    fprintf(out, "static const DuetLaunch cuda_launch[] = {\n");
    for (int i = 0; i < p->n_kernels; i++)
      fprintf(out, "  {%u, %u, %u},\n", p->cuda_launch[i].grid, p->cuda_launch[i].block, p->cuda_launch[i].shared);
    if (!p->n_kernels) fprintf(out, "  {0, 0, 0},\n");
    fprintf(out, "};\n");
    write_ints(out, "cuda_fn", p->cuda_fn, p->n_kernels);
  }
  write_steps(out, "train_steps", p->train, p->n_train);
  write_steps(out, "eval_steps", p->eval, p->n_eval);
  write_steps(out, "grad_steps", p->grad, p->n_grad);
  for (int i = 0; i < p->n_unscale; i++) {
    char nm[32];
    snprintf(nm, sizeof nm, "uname%d", i);
    write_bytes(out, nm, p->unscale_names[i]);
  }
  fprintf(out, "static const char *const unscale_names[] = {");
  for (int i = 0; i < p->n_unscale; i++) fprintf(out, "uname%d, ", i);
  fprintf(out, "0};\n");
  /* pipelines: each stage's schedules, the transfers */
  for (int k = 0; k < p->n_stages; k++) {
    const DuetStage *st = &p->stages[k];
    char nm[48];
    snprintf(nm, sizeof nm, "stage%d_fwd", k);
    write_steps(out, nm, st->fwd, st->n_fwd);
    snprintf(nm, sizeof nm, "stage%d_bwd", k);
    write_steps(out, nm, st->bwd, st->n_bwd);
    snprintf(nm, sizeof nm, "stage%d_opt", k);
    write_steps(out, nm, st->opt, st->n_opt);
    snprintf(nm, sizeof nm, "stage%d_eval", k);
    write_steps(out, nm, st->eval, st->n_eval);
  }
  if (p->n_stages > 0) {
    fprintf(out, "static const DuetStage stages[] = {\n");
    for (int k = 0; k < p->n_stages; k++) {
      const DuetStage *st = &p->stages[k];
      fprintf(out, "  {%d, %d, %d, %d, stage%d_fwd, stage%d_bwd, stage%d_opt, stage%d_eval, {", st->n_fwd, st->n_bwd,
              st->n_opt, st->n_eval, k, k, k, k);
      for (int r = 0; r < DUET_MEM_COUNT; r++) fprintf(out, "%" PRId64 ", ", st->region_bytes[r]);
      fprintf(out, "}},\n");
    }
    fprintf(out, "};\nstatic const DuetTransfer transfers[] = {\n");
    for (int t = 0; t < p->n_transfers; t++) {
      const DuetTransfer *x = &p->transfers[t];
      fprintf(out, "  {%d, %d, %d, %d, %" PRId64 "},\n", x->src, x->dst, x->from, x->to, x->nbytes);
    }
    if (!p->n_transfers) fprintf(out, "  {0},\n");
    fprintf(out, "};\n");
    if (p->n_buckets > 0) { /* data parallelism: the all-reduce buckets */
      write_ints(out, "bucket_off", p->bucket_off, p->n_buckets + 1);
      write_ints(out, "bucket_tensors", p->bucket_tensors, p->bucket_off[p->n_buckets]);
    }
    if (p->zero) { /* ZeRO stage 1: each tensor's shard, each bucket gradient's param */
      write_ints(out, "tensor_shard", p->tensor_shard, p->n_tensors);
      write_ints(out, "bucket_params", p->bucket_params, p->bucket_off[p->n_buckets]);
    }
  }
  if (p->prune) { /* pruning: the pruned params, their masks and the schedule */
    const DuetPrune *pr = p->prune;
    fprintf(out, "static const DuetPruneParam prune_params[] = {\n");
    for (int i = 0; i < pr->n_params; i++) {
      const DuetPruneParam *q = &pr->params[i];
      fprintf(out, "  {%d, %d, {%d, %d}, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "},\n", q->param, q->mask,
              q->state[0], q->state[1], q->out_n, q->out_stride, q->in_n, q->in_stride);
    }
    fprintf(out, "};\nstatic const DuetPrune prune = {%d, %d, %d, %.17g, %.17g, %" PRId64 ", %" PRId64 ", %" PRId64
                 ", %d, prune_params};\n", pr->mode, pr->nm_n, pr->nm_m, pr->initial, pr->final, pr->start, pr->end,
            pr->every, pr->n_params);
  }
  if (p->shrink) { /* --shrink: the shortened axes of params */
    fprintf(out, "static const DuetShrinkAxis shrink_axes[] = {\n");
    for (int i = 0; i < p->shrink->n; i++) {
      const DuetShrinkAxis *x = &p->shrink->axes[i];
      fprintf(out, "  {%d, %d, %" PRId64 ", %" PRId64 ", %d, %d, %d, %d, \"%s\", %d},\n", x->param, x->axis, x->full,
              x->group, x->source, x->kind, x->next_out, x->next_bias, x->acts ? x->acts : "", x->fold);
    }
    fprintf(out, "};\nstatic const DuetShrink shrink = {%.17g, %d, shrink_axes};\n", p->shrink->sparsity,
            p->shrink->n);
  }
  if (p->n_clip > 0) { /* gradient clipping: the gradients and their kernels */
    write_ints(out, "clip_grad", p->clip_grad, p->n_clip);
    write_ints(out, "clip_sumsq", p->clip_sumsq, p->n_clip);
    write_ints(out, "clip_scale", p->clip_scale, p->n_clip);
  }
  const DuetConfig *c = &p->defaults;
  fprintf(out, "static const DuetProgram program = {\n");
  fprintf(out, "  .api_version = %d, .model_name = model_name, .n_tensors = %d, .tensors = tensors,\n",
          DUET_RT_API_VERSION, p->n_tensors);
  fprintf(out, "  .n_kernels = %d, .n_train = %d, .n_eval = %d, .n_grad = %d,\n", p->n_kernels, p->n_train,
          p->n_eval, p->n_grad);
  fprintf(out, "  .train = train_steps, .eval = eval_steps, .grad = grad_steps,\n");
  fprintf(out, "  .input_x = %d, .input_y = %d, .loss = %d, .metrics = %d, .logits = %d, .n_classes = %d,\n",
          p->input_x, p->input_y, p->loss, p->metrics, p->logits, p->n_classes);
  if (p->vocab) fprintf(out, "  .vocab = %d,\n", p->vocab);
  fprintf(out, "  .region_bytes = {");
  for (int r = 0; r < DUET_MEM_COUNT; r++) fprintf(out, "%" PRId64 ", ", p->region_bytes[r]);
  fprintf(out, "}, .gemm_flops = %" PRId64 ", .decode = %d, .context = %" PRId64 ",\n", p->gemm_flops, p->decode,
          p->context);
  fprintf(out, "  .n_unscale = %d, .unscale_names = unscale_names, .update_from = %d,\n", p->n_unscale,
          p->update_from);
  if (p->gemm_accumulate_f16) fprintf(out, "  .gemm_accumulate_f16 = 1,\n");
  if (p->n_stages > 0)
    fprintf(out, "  .n_stages = %d, .stages = stages, .n_transfers = %d, .transfers = transfers, .micro_batches = %d,\n",
            p->n_stages, p->n_transfers, p->micro_batches);
  if (p->n_stages > 0 && p->replicas > 1)
    fprintf(out, "  .replicas = %d, .n_buckets = %d, .bucket_off = %s, .bucket_tensors = %s, .bucket_mb = %.17g,\n",
            p->replicas, p->n_buckets, p->n_buckets ? "bucket_off" : "0", p->n_buckets ? "bucket_tensors" : "0",
            p->bucket_mb);
  if (p->zero)
    fprintf(out, "  .zero = %d, .tensor_shard = tensor_shard, .bucket_params = bucket_params,\n", p->zero);
  fprintf(out, "  .kernel_arg_off = kernel_arg_off, .kernel_args = kernel_args,\n");
  if (p->prune) fprintf(out, "  .prune = &prune,\n");
  if (p->shrink) fprintf(out, "  .shrink = &shrink,\n");
  if (p->eval_program) fprintf(out, "  .eval_program = 1,\n");
  if (p->n_clip > 0)
    fprintf(out, "  .n_clip = %d, .clip_grad = clip_grad, .clip_sumsq = clip_sumsq, .clip_scale = clip_scale, "
                 ".clip_from = %d,\n", p->n_clip, p->clip_from);
  if (p->source_hash) fprintf(out, "  .source_hash = 0x%016" PRIx64 "ull,\n", p->source_hash);
  if (cp->weights_file)
    fprintf(out, "  .weights = duet_embedded_weights, .weights_nbytes = %" PRId64 ",\n", p->weights_nbytes);
  if (p->cuda_source)
    fprintf(out, "  .cuda_source = cuda_source, .cuda_launch = cuda_launch, .cuda_fn = cuda_fn, .cuda_n_fns = %d,\n",
            p->cuda_n_fns);
  fprintf(out, "  .defaults = {.data = %d, .data_path = data_path, .optimizer = %d,%s%s\n", c->data, c->optimizer,
          c->devices ? " .devices = devices," : "", cp->weights_file ? " .eval_only = 1," : "");
  if (c->data_y || c->val_x || c->val_y || c->val_fraction)
    fprintf(out, "    .data_y = %s, .val_x = %s, .val_y = %s, .val_fraction = %.17g,\n", c->data_y ? "data_y" : "NULL",
            c->val_x ? "val_x" : "NULL", c->val_y ? "val_y" : "NULL", c->val_fraction);
  fprintf(out, "    .lr = %.17g, .weight_decay = %.17g, .beta1 = %.17g, .beta2 = %.17g, .eps = %.17g,\n", c->lr,
          c->weight_decay, c->beta1, c->beta2, c->eps);
  fprintf(out, "    .momentum = %.17g, .batch = %" PRId64 ", .epochs = %" PRId64 ", .steps = %" PRId64
               ", .log_every = %" PRId64 ",\n",
          c->momentum, c->batch, c->epochs, c->steps, c->log_every);
  fprintf(out, "    .seed = %" PRIu64 "u, .eval = %d, .block = %" PRId64 ", .eval_every = %" PRId64
               ", .eval_batches = %" PRId64 ",\n",
          c->seed, c->eval, c->block, c->eval_every, c->eval_batches);
  fprintf(out, "    .lr_schedule = %d, .warmup = %" PRId64 ", .min_lr = %.17g, .clip_grad_norm = %.17g, .offload = %d,\n",
          c->lr_schedule, c->warmup, c->min_lr, c->clip_grad_norm, c->offload);
  fprintf(out, "    .calibrate = %" PRId64 "},\n};\n\n", c->calibrate);
  /* the checks duet run makes before compiling, before loading data or
   * opening a device (a CUDA device compiles its kernels when opened) */
  fprintf(out, "int main(int argc, char **argv) {\n");
  fprintf(out, "  if (duet_preflight(&program, NULL, argc - 1, argv + 1)) return 1;\n");
  fprintf(out, "  return duet_main(&program, (const DuetKernelFn *)duet_kernel_table, argv[0], argc - 1, argv + 1);\n}\n");
}
