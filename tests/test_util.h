/* tests/test_util.h: compile a model from text and load it on the CPU. */
#ifndef DUET_TEST_UTIL_H
#define DUET_TEST_UTIL_H

#include <math.h>
#include <stdio.h>

#include "../cli/jit.h"
#include "../codegen/codegen.h"
#include "../frontend/frontend.h"
#include "../passes/passes.h"

typedef struct TModel {
  Arena *arena;
  Diag diag;
  Graph *g;
  CgProgram *cp;
  JitModule jit;
  DuetDevice *dev;
  DuetSession *s;
} TModel;

/* Compiles `text` (a whole .model source) with float tensors of
 * `float_dtype`, runs every pass with the verifier on, generates and loads
 * the kernels, and opens a session (params initialised with seed 1).
 * Returns 0, or 1 after printing why. */
int tmodel_open(TModel *t, const char *name, const char *text, DType float_dtype);
/* Same, with frontend options (batch, decode). */
int tmodel_open_opt(TModel *t, const char *name, const char *text, const FrontendOptions *fo);
/* Same, with --precision (NULL: auto).  fo->micro_batches > 1 opens a
 * pipelined session (one stage on the CPU): its data inputs are then
 * host buffers of the whole batch (micro_batches x the input's shape). */
int tmodel_open_prec(TModel *t, const char *name, const char *text, const FrontendOptions *fo, const char *precision);
void tmodel_close(TModel *t);
/* Tensor id of a value (-1 when it has no storage). */
int tmodel_tensor(const TModel *t, const Value *v);
/* The PARAM value called `name`, or NULL. */
Value *tmodel_param(const TModel *t, const char *name);

/* The model at `path` (or the text `text` when not NULL, named `path`)
 * through the frontend (with `dt` floats; `decode`: the batch-1 decoding
 * program) and every pass (verifier on, --precision `precision`), lowered
 * to kernels; NULL after printing why. */
CgProgram *lower_model(Arena *a, const char *path, const char *text, DType dt, bool decode, const char *precision);
/* The names of the *.model files in `dir`, sorted, in a malloc'ed array of
 * malloc'ed strings (free each and the array); the count, or -1 when the
 * directory cannot be read. */
int list_models(const char *dir, char ***names);
/* 0 when the PTX holds an entry point `.entry duet_k<f>(` for every
 * function f < n (kernels share functions), else 1 after printing the
 * first one missing. */
int check_ptx_entries(const char *what, const char *ptx, int n);

/* For every value of t's graph (by id), the number of roundings to a 16-bit
 * format (f16, bf16) on the longest chain of operations that ends at it: a
 * value stored in 16 bits counts one more than the most among its operands;
 * in a fused op, each cast to 16 bits inside its program counts, and the
 * store when it rounds; f32 values (GEMM results with f32 accumulation,
 * gradients for the optimizer, master weights) add none.  To first order,
 * a value of a 16-bit program differs from the same value computed in f32
 * by at most this depth x the format's unit roundoff (2^-11 for f16, 2^-8
 * for bf16) relative to its tensor's scale, when the operations between the
 * roundings do not amplify errors.  Arena memory of t. */
int *tmodel_round16_depth(const TModel *t);

/* A whole file as a NUL-terminated string (malloc'ed), or NULL. */
char *slurp(const char *path);

/* The comparisons every numeric test makes go through these helpers, and
 * none passes on a value that is not a number: a NaN in either operand
 * fails, and an infinity matches only the same infinity (a tolerance
 * relative to an infinite reference would accept anything).  test_compare
 * checks that a NaN, an infinity and a value just beyond the tolerance each
 * fail every helper. */

/* |got - want| <= atol + rtol * |want|, both finite, or got and want the
 * same infinity. */
bool close_enough(double got, double want, double atol, double rtol);
/* close_enough, else prints and counts a failure (returns 1). */
int check_close(const char *what, double got, double want, double atol, double rtol);

/* Normwise comparison of a tensor (n values): max_i |got_i - want_i|
 * against tol * scale, where scale is max_i |want_i| when the scale given
 * is 0 (a gradient is judged against its tensor's largest entry: rounding
 * errors scale with the magnitude of the terms summed, not with each
 * result, which cancellation can make arbitrarily small).  Fails on any
 * NaN or infinity in got or want, and when the error exceeds the bound;
 * prints the worst element then.  Returns 0 or 1; *ratio (may be NULL)
 * receives max error / (tol * scale), the fraction of the bound used
 * (infinite on a non-finite value). */
int check_normwise(const char *what, const float *got, const float *want, int64_t n, double tol, double scale,
                   double *ratio);
/* The same for double arrays. */
int check_normwise_f64(const char *what, const double *got, const double *want, int64_t n, double tol, double scale,
                       double *ratio);

/* Fills every input and param of t's graph in session s (a session of
 * t's program, on any device) from r: params (0.2 + 0.8 U) * (+-1), float
 * inputs N(0, 1), i32 inputs uniform in [0, classes). */
void tmodel_fill(TModel *t, DuetSession *s, DuetRng *r, int classes);
/* Every f32/f64/f16/bf16 tensor of p in sessions a (the reference) and b,
 * element by element: |b - a| <= 1e-4 + 2e-3 |a| (f32), 1e-11 + 1e-9 |a|
 * (f64), 16 bits as compare_sessions_stats.  A NaN fails, except against a
 * NaN in programs with dynamic loss scaling (fp16), whose overflowing
 * steps make non-finite gradients by design; an infinity matches only the
 * same infinity.  Prints the first mismatch of up to 5 tensors; returns the
 * number of tensors that differ. */
int compare_sessions(const char *what, const DuetProgram *p, DuetSession *a, DuetSession *b);
/* Same, and f16/bf16 tensors too: |b - a| <= 1e-3 + 4e-3 |a| (f16),
 * 1e-3 + 3e-2 |a| (bf16), both about 4 ulps of the format.  In a program
 * with 16-bit tensors every tensor's element may instead differ by up to
 * 1% (fp16) or 2% (bf16) of the tensor's largest magnitude.  Arena tensors
 * sharing bytes with a tensor of another dtype are skipped (their final
 * bits may be the other's).  st (may be NULL) counts the 16-bit elements
 * compared and those bit-identical. */
typedef struct CompareStats {
  long long n16, same16;
} CompareStats;
int compare_sessions_stats(const char *what, const DuetProgram *p, DuetSession *a, DuetSession *b, CompareStats *st);

#endif
