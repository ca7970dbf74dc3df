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
/* tmodel_open_prec with --quantize `quantize` (passes/quantize.c; NULL: none). */
int tmodel_open_quant(TModel *t, const char *name, const char *text, const FrontendOptions *fo, const char *precision,
                      const char *quantize);
/* tmodel_open_quant, and with shrink > 0 also --prune-mode channels --prune
 * shrink --shrink (passes/shrink.c: an evaluation program). */
int tmodel_open_opts(TModel *t, const char *name, const char *text, const FrontendOptions *fo, const char *precision,
                     const char *quantize, double shrink);
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
/* lower_model with --quantize `quantize` (NULL: none). */
/* --calibrate N for lower_model_quant and tmodel_open_quant (int8
 * activations with --quantize; 0, the default: none).  Set by a test
 * before it compiles. */
extern int64_t tmodel_calibrate;
CgProgram *lower_model_quant(Arena *a, const char *path, const char *text, DType dt, bool decode,
                             const char *precision, const char *quantize);
/* lower_model_quant, and with shrink > 0 --prune-mode channels --prune
 * shrink --shrink. */
CgProgram *lower_model_opts(Arena *a, const char *path, const char *text, DType dt, bool decode,
                            const char *precision, const char *quantize, double shrink);
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

/* The tolerance of a value of a 16-bit program against the same value
 * computed in fp32, relative to its tensor's largest fp32 magnitude, for a
 * value at depth D (tmodel_round16_depth) of a program of precision `prec`
 * ("fp16", "bf16"; any other: no 16-bit rounding): each of the D roundings
 * to 16 bits on the longest chain that computes it errs by at most the
 * format's unit roundoff u16 (2^-11 for fp16, 2^-8 for bf16; round to
 * nearest), and, to first order through operations that do not amplify
 * errors, these add up: D x u16.  Added: the f32 arithmetic, 2 x 64 x 2^-24
 * = 2^-17 (two evaluations of sums of at most 64 terms, the first-order
 * bound n u of a sum; the whole tolerance of a value computed without
 * 16-bit roundings, D = 0). */
double round16_tol(const char *prec, int depth);
/* Per tensor of t's program (by tensor id; arena memory of t): the largest
 * tmodel_round16_depth among the values it holds at some time: its own
 * value, the param and state tensors an optimizer update writes in place
 * (the update's depth), and the tensors sharing its bytes (views, reused
 * arena memory), whose values it may hold at the end of a run. */
int *tmodel_tensor_depth16(const TModel *t);

/* The tolerances of compare_sessions_stats for two runs of one 16-bit
 * program on two backends (the CUDA kernels and the C kernels), per tensor
 * of t's program (arena memory of t): rel[i] = 2 round16_tol(D_i) =
 * 2 (D_i u16 + 2^-17) of the tensor's largest |a|, D_i its
 * tmodel_tensor_depth16.  Each run is within round16_tol of the exact
 * value (the rule `precision` checks against fp32), so the two within
 * twice that.  Equivalently, since both round to 16 bits at the same
 * points and differ only in the order of f32 sums: a rounding lands on the
 * same value or, where the f32 values before it straddle a rounding
 * boundary, on its neighbour (a flip: one ulp, at most 2 u16 of the
 * value), which travels on; at most D flips on the longest chain.  This is
 * the worst case, and for deep tensors looser than the 1% (fp16) / 2%
 * (bf16) of a tensor's largest magnitude it replaces (2 D u16 exceeds
 * them from D = 11 in fp16 and D = 3 in bf16); flips are rare in practice
 * and the tight check is that of each kernel alone (lockstep_device).
 * group[i] >= 0: optimizer states share one scale per block instance (the
 * param's name up to its last '.') and state.  A state whose gradient is
 * zero in exact arithmetic (a key projection's bias: softmax ignores a
 * constant added to every key) holds rounding noise, judged against the
 * block's largest state of its kind (the key weight's), whose sums have
 * terms of the same size (as gpt_parity judges the key biases). */
typedef struct SessionTol {
  double *rel; /* per tensor: its tolerance relative to its scale */
  int *group;  /* per tensor: -1 (its scale is its own largest |a|), or a scale group */
} SessionTol;
SessionTol tmodel_session_tol16(const TModel *t);

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
 * (f64).  A NaN fails; an infinity matches only the same infinity.  Prints
 * the first mismatch of up to 5 tensors; returns the number of tensors
 * that differ.  A program with 16-bit tensors fails here: it needs
 * compare_sessions_stats with per-tensor tolerances. */
int compare_sessions(const char *what, const DuetProgram *p, DuetSession *a, DuetSession *b);
/* st: the 16-bit elements compared and those bit-identical, and the
 * largest fraction of its bound a tensor used (worst) and that tensor. */
typedef struct CompareStats {
  long long n16, same16;
  double worst;
  char worst_tensor[64];
  double tol_min, tol_max; /* 16-bit programs: the range of the tolerances applied (0: none yet) */
} CompareStats;
/* Same, and programs with 16-bit tensors: there every float tensor i is
 * compared normwise, max_j |b_j - a_j| <= tol16->rel[i] x its scale (its
 * largest |a_j|, or its scale group's: tmodel_session_tol16), a NaN
 * matching a NaN only in programs with dynamic loss scaling (fp16), whose
 * overflowing steps make non-finite gradients by design.  Arena tensors
 * sharing bytes with a tensor of another dtype are skipped (their final
 * bits may be the other's).  st (may be NULL) accumulates over calls. */
int compare_sessions_stats(const char *what, const DuetProgram *p, DuetSession *a, DuetSession *b,
                           const SessionTol *tol16, CompareStats *st);

/* Lockstep: every kernel and GEMM of a program checked on its own, from
 * the same inputs.  lockstep_device(inner, t, what) is a device that
 * forwards everything to `inner` (a device for t's program: the CUDA
 * emulator, a GPU) and, around each launch, copies all of inner's memory
 * to the host first; after the launch it runs t's C kernel of the same
 * index on that copy (the CPU backend's kernel, from exactly the inputs
 * the device's kernel had) and compares every tensor the kernel writes.
 * Both compute the same roundings to 16 bits, so from the same inputs they
 * differ only by the order of f32 operations (and libm's tanhf, expf), and
 * a 16-bit result by at most one flip (one ulp) more:
 *   |dev - cpu| <= F ulp16(max(|dev|, |cpu|)) + 2 (n + 4) u S
 * per element, u = 2^-24 (f64 kernels 2^-53), F = 1 for 16-bit outputs, n
 * the longest sum of one element (two evaluations, each within the
 * first-order n u of its terms; + 4 for the few other roundings), S the
 * magnitude of those terms: |scale| sum |x| per element for a sum over an
 * axis (a bias gradient can cancel to rounding noise) and for the
 * embedding's scatter-add; per row, rstd (|x| + |mean|) (1 + that) for
 * layernorm (with max |dy| (1 + that)^3 for its backward: rows that are
 * nearly constant lose digits); max(|out|, |in|) for the loss, the
 * metrics and pooling; |out| (1 + 2 max |logit|) for the loss's gradient
 * (exp turns the rounding of z - max into a relative error); for
 * attention, the terms' largest (|v|; 2 P |k| / sqrt(D) for dq, P the
 * largest |dy . v|) times 1 + sigma, sigma the largest |score| (its
 * rounding reaches the weights through exp), dk and dv over T x (query
 * heads per key/value head) terms with grouped-query attention; softmax as
 * the loss's gradient (|out| (1 + 2 max |x|)), its gradient 2 max |dy|
 * max |y|; rmsnorm per row 2 rs max |x| (its backward rs max |dy| 2 (1 +
 * rs max |x|)^2); rope max |x| over 4 roundings; mse_loss scale sum (p -
 * t)^2.  An elementwise kernel gets
 * a running error bound per element instead: its instructions evaluated
 * in double with E (one evaluation within u E of the exact value, first
 * order: + |result| per rounding, E_a + E_b for a sum, |b| E_a + |a| E_b
 * for a product, ... tanh within 8 ulps (exp, log, tanh: 4 ulps each,
 * sigmoid and silu 10 and 11 relative, through exp(-|x|)); a cast to 16 bits adds a flip
 * once E > 0), bound 2 u E plus a flip at a 16-bit store, and E = 0 (the
 * same operations on the same values: copies, relu, negation) the same
 * bits.  Data movement (gather, transpose, im2col, pooling's max, max
 * gradients, unscale and its overflow flag, positions) must match bit for
 * bit.  GEMMs against the exact product (f64): |dev - exact| <= ulp16 / 2
 * (a 16-bit result's rounding) + 2 (k + 2) u sum_k |a||b| per element, u
 * the accumulation's (f32; fp16's 2^-11 with --gemm-accumulate fp16),
 * doubled for tensor cores that may accumulate by truncation.  The
 * attention backward pair (CUDA: dq, then dk and dv in a second kernel; C:
 * all three in the first) is compared as dq after the first and dk, dv
 * after the second (with grouped-query attention, the column ranges of
 * each row of the packed gradient).  A mismatch is printed (the first 8) and counted, and
 * the run goes on from the device's result.  NULL when out of memory.  The
 * device owns inner (its destroy destroys both). */
typedef struct LockstepStats {
  long long kernels, gemms; /* checked */
  int fails;
  double worst, worst_gemm; /* the largest fraction of its bound an element used: kernels, GEMMs */
  char worst_what[160], worst_gemm_what[160];
} LockstepStats;
DuetDevice *lockstep_device(DuetDevice *inner, const TModel *t, const char *what);
const LockstepStats *lockstep_stats(const DuetDevice *d);
/* The name of a kernel kind (codegen.h's KK_*, lower case without KK_:
 * "elementwise", "norm_fwd", "attn_bwd_kv", ...). */
const char *kernel_kind_name(KernelKind k);
/* Prints (stdout) what a case's lockstep and whole-program comparisons
 * used of their bounds. */
void lockstep_print(const char *what, const LockstepStats *ls, const CompareStats *cs);

#endif
