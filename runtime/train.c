#define _POSIX_C_SOURCE 200809L /* clock_gettime, fsync, fdopen */
/* runtime/train.c: the training driver shared by `duet run` and compiled
 * training executables: flags, data, the step loop, logging, evaluation. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "dist.h"
#include "duet_half.h"
#include "duet_rt.h"
#include "pipeline.h"
#include "progress.h"

void duet_usage(const char *argv0, FILE *out) {
  fprintf(out,
          "usage: %s [flags]\n"
          "Trains the model; flags override its train section.\n\n"
          "  --epochs N         passes over the training set\n"
          "  --steps N          optimizer steps (overrides --epochs)\n"
          "  --lr X             learning rate (the peak of a schedule)\n"
          "  --lr-schedule S    constant (default), cosine or linear: the rate of each step (docs/training.md)\n"
          "  --warmup N         linear warm-up over the first N steps: lr * step / N (default 0)\n"
          "  --min-lr X         cosine and linear: the rate the decay ends at (default 0)\n"
          "  --clip-grad-norm X clip the gradients to global L2 norm X (torch clip_grad_norm_; default: off)\n"
          "  --weight-decay X   decoupled (AdamW) or L2 (SGD) weight decay\n"
          "  --batch N          batch size (fixed when the model was compiled)\n"
          "  --seed N           seed of initialisation and shuffling\n"
          "  --threads N        CPU threads for kernels and BLAS, 1 to 1024 (default: all cores), in all:\n"
          "                     split among the replicas and stages, at least one each\n"
          "  --data PATH        data directory or text file, or npy data's x file (default: the\n"
          "                     train section's)\n"
          "  --metrics FILE     write JSON lines: {\"step\",\"loss\",\"lr\"} (and \"grad_norm\" with clipping),\n"
          "                     and {\"step\",\"epoch\",\"test_accuracy\"\n"
          "                     (a fraction),\"test_loss\"} (npy data: val_accuracy, val_loss) or, text\n"
          "                     models, {\"step\",\"val_loss\"} (fashion_mnist with val_fraction:\n"
          "                     \"val_accuracy\",\"val_loss\" per epoch and one final {\"step\",\n"
          "                     \"test_accuracy\",\"test_loss\",\"final\":true}); with\n"
          "                     --resume, the file's lines up to the checkpoint's step are kept and\n"
          "                     the run appends to them\n"
          "  --metrics-timing   step lines also carry the throughput since the previous line:\n"
          "                     \"samples_per_s\" (images) or \"tokens_per_s\" (text); wall-clock, so off\n"
          "                     by default (the metrics of two runs compare byte for byte); with\n"
          "                     --eval-only: eval_seconds, samples_per_s or batches_per_s, allocated_bytes\n"
          "  --log-every N      progress line every N steps\n"
          "  --eval-every N     text: validation loss every N steps\n"
          "  --eval-batches N   text: number of fixed validation batches\n"
          "  --save PATH        write a checkpoint (safetensors: params, optimizer state, step, data\n"
          "                     position, RNG) at the end, every --save-every steps and on SIGINT or\n"
          "                     SIGTERM (after the current step; a second signal aborts); atomic;\n"
          "                     never with non-finite values; replaces only a regular file\n"
          "  --save-every N     checkpoint every N steps (needs --save)\n"
          "  --keep N           keep the last N checkpoints: PATH and the N-1 older ones as PATH.step-S\n"
          "  --keep-best        PATH.best: the checkpoint of the best evaluation (validation accuracy or\n"
          "                     loss; needs --save)\n"
          "  --resume PATH      continue from a checkpoint with the losses of an uninterrupted run\n"
          "  --init-from CK     start from the params of checkpoint CK (of the same model, e.g. its QAT\n"
          "                     or pruned variant): fine-tuning; step 0, fresh optimizer state and data\n"
          "                     order, CK's optimizer state, masks and position ignored\n"
          "  --train-subset N   train on the first N training samples\n"
          "  --test-subset N    evaluate on the first N test samples\n"
          "  --loss-scale X     fp16 programs: initial loss scale (default 65536 = 2^16)\n"
          "  --min-loss-scale X fp16 programs: stop when the scale falls below X (default 1)\n"
          "  --no-eval          skip evaluation on the test split\n"
          "  --eval-only        train nothing: load the params of --checkpoint CK and print the final\n"
          "                     evaluation (test accuracy and loss, or validation loss; --metrics gets\n"
          "                     one line {\"step\" (the checkpoint's),\"test_accuracy\",\"test_loss\"} or\n"
          "                     {\"step\",\"val_loss\"}); no optimizer state needed; --steps, --epochs\n"
          "                     and --offload are errors with it; duet run compiles an evaluation\n"
          "                     program (params and forward activations; no gradients, no optimizer\n"
          "                     state), a compiled executable keeps its training program\n"
          "  --checkpoint CK    the checkpoint (written by --save) that --eval-only evaluates\n"
          "  --quiet            no progress lines or notes (warnings and errors are still printed)\n"
          "  --version          print duet's version and the commit it was built from\n"
          "  --devices SPEC     pipeline over devices: cpu:0,cpu:1 (virtual CPU devices, each a thread\n"
          "                     with its own arena and threads/S cores), cuda:N; one stage each\n"
          "  --micro-batches M  split each batch into M micro-batches, gradients summed (loss / M)\n"
          "  --schedule S       pipeline schedule: gpipe (fill-drain, default) or 1f1b\n"
          "  --data-parallel N  N replicas, each on an equal group of the --devices list (default: N\n"
          "                     virtual CPU devices), each computing 1/N of every batch; gradients\n"
          "                     summed over the replicas (fixed when the model was compiled)\n"
          "  --bucket-mb X      all-reduce buckets of at most X MiB of gradients (default 25)\n"
          "  --zero 1           ZeRO stage 1: each replica keeps and updates only its shard of the\n"
          "                     optimizer state (whole tensors); gradients reduce-scattered, params\n"
          "                     all-gathered (needs --data-parallel N >= 2; fixed at compile time)\n"
          "  --offload O        none (default) or optimizer: the optimizer state and an f32 master copy of\n"
          "                     the params in host memory (pinned on CUDA), the update on the CPU, the\n"
          "                     gradients to the host and the params back each step (ZeRO-Offload)\n"
          "  --help             this text\n"
          "Results depend on --threads (OpenBLAS sums in an order set by its thread count).\n"
          "Under mpirun -np N (or srun --mpi=pmix) each rank is one of N replicas on its own --devices\n"
          "with its own --threads; rank 0 prints, saves and writes the metrics (docs/parallelism.md).\n"
          "Environment (docs/commands.md): DUET_CACHE_DIR (kernel cache), DUET_CC (C compiler),\n"
          "DUET_PROFILE=1 (time per kernel), DUET_PIPE_TIMEOUT, DUET_PIPE_STAGING=host,\n"
          "DUET_CPU_GFLOPS (the partition's CPU rate), DUET_DP_CHECK=1 (replicas compared every step),\n"
          "DUET_DP_COLLECTIVE=auto|shm|nccl (how replicas sum), DUET_NCCL_LIBRARY (NCCL to load),\n"
          "DUET_MPI_PLUGIN (the MPI plugin to load under an MPI launcher).\n",
          argv0);
}

static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo) {
    fprintf(stderr, "duet: error: %s expects an integer >= %lld, got '%s'\n", flag, (long long)lo, s);
    return 1;
  }
  *out = v;
  return 0;
}

int duet_parse_threads(const char *val, int *out) {
  char *end;
  errno = 0;
  long long t = strtoll(val, &end, 10);
  if (errno || end == val || *end || t < 1 || t > DUET_MAX_THREADS) {
    fprintf(stderr, "duet: error: --threads expects an integer from 1 to %d, got '%s'\n", DUET_MAX_THREADS, val);
    return 1;
  }
  *out = (int)t;
  return 0;
}

int duet_parse_data_parallel(const char *val, int64_t *out) {
  char *end;
  errno = 0;
  long long n = strtoll(val, &end, 10);
  if (errno || end == val || *end || n < 1 || n > DUET_MAX_DEVICES) {
    fprintf(stderr, "duet: error: --data-parallel expects an integer from 1 to %d (replicas), got '%s'\n",
            DUET_MAX_DEVICES, val);
    return 1;
  }
  *out = n;
  return 0;
}

int duet_parse_zero(const char *val, int *out) {
  if (strcmp(val, "0") && strcmp(val, "1")) {
    fprintf(stderr, "duet: error: --zero expects 0 or 1 (ZeRO stage 1: optimizer state sharded over the replicas), "
            "got '%s'\n", val);
    return 1;
  }
  *out = val[0] - '0';
  return 0;
}

int duet_parse_bucket_mb(const char *val, double *out) {
  char *end;
  errno = 0;
  double x = strtod(val, &end);
  if (errno || end == val || *end || !(x > 0) || !(x <= 1e9)) {
    fprintf(stderr, "duet: error: --bucket-mb expects a number of MiB > 0 (and at most 1e9), got '%s'\n", val);
    return 1;
  }
  *out = x;
  return 0;
}

static int parse_f64(const char *flag, const char *s, double lo, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < lo) {
    fprintf(stderr, "duet: error: %s expects a number >= %g, got '%s'\n", flag, lo, s);
    return 1;
  }
  *out = v;
  return 0;
}

/* The flags a program fixes when it is compiled (DuetProgram), in the
 * order --help lists them.  --bucket-mb counts only with replicas. */
static const char *const fixed_flags[] = {"--precision", "--gemm-accumulate", "--batch", "--micro-batches",
                                          "--data-parallel", "--bucket-mb", "--prune", "--prune-mode",
                                          "--prune-start", "--prune-end", "--prune-every", "--prune-initial",
                                          "--prune-params", "--zero", "--optimizer-state", "--recompute",
                                          "--calibrate", "--quantize"};
enum { N_FIXED = sizeof fixed_flags / sizeof *fixed_flags };

/* The --quantize p was compiled with: "none", "int8" (a scale per output
 * channel) or "int8-tensor" (every weight's scale one element; a program
 * whose weights all have one output channel reads as int8-tensor, and both
 * modes compute the same there). */
static const char *quantize_mode(const DuetProgram *p) {
  int any = 0;
  for (int i = 0; i < p->n_tensors; i++) {
    int sc = duet_quant_scale_of(p, i);
    if (sc < 0) continue;
    any = 1;
    int64_t e = 1;
    for (int r = 0; r < p->tensors[sc].rank; r++) e *= p->tensors[sc].shape[r];
    if (e > 1) return "int8";
  }
  return any ? "int8-tensor" : "none";
}

/* The compiled value of fixed flag k of p into buf, as the flag is
 * written; *num its number (NAN for words). */
static const char *fixed_value(const DuetProgram *p, int k, char *buf, size_t n, double *num) {
  const DuetPrune *pr = p->prune;
  int R = p->n_stages >= 1 && p->replicas > 1 ? p->replicas : 1;
  int M = p->n_stages >= 1 && p->micro_batches > 0 ? p->micro_batches / R : 1;
  *num = NAN;
  if (p->shrink && !pr && (k == 6 || k == 7)) { /* --shrink: duet_shrink_check_fixed */
    snprintf(buf, n, k == 6 ? "%.15g (channels pruning, shrunk: --shrink)" : "channels (shrunk: --shrink)",
             p->shrink->sparsity);
    return buf;
  }
  switch (k) {
  case 0: snprintf(buf, n, "%s", duet_program_precision(p)); break;
  case 1: snprintf(buf, n, "%s", p->gemm_accumulate_f16 ? "fp16" : "fp32"); break;
  case 2: *num = (double)p->defaults.batch; break;
  case 3: *num = M; break;
  case 4: *num = R; break;
  case 5: *num = p->bucket_mb > 0 ? p->bucket_mb : 25.0; break;
  case 6: *num = pr ? pr->final : 0; break;
  case 7:
    if (!pr) snprintf(buf, n, "none (no pruning)");
    else if (pr->mode == DUET_PRUNE_NM) snprintf(buf, n, "%d:%d", pr->nm_n, pr->nm_m);
    else if (pr->mode == DUET_PRUNE_GLOBAL) snprintf(buf, n, "global");
    else snprintf(buf, n, "%s", pr->mode == DUET_PRUNE_CHANNELS ? "channels" : "unstructured");
    break;
  case 8: case 9: case 10:
    if (pr) *num = (double)(k == 8 ? pr->start : k == 9 ? pr->end : pr->every);
    else snprintf(buf, n, "none (no pruning)");
    break;
  case 11:
    if (pr) *num = pr->initial;
    else snprintf(buf, n, "none (no pruning)");
    break;
  case 13: *num = p->n_stages >= 1 && R > 1 ? p->zero : 0; break;
  case 14: { /* 8-bit AdamW state keeps its codes in u8 tensors */
    bool q8 = false;
    for (int i = 0; i < p->n_tensors && !q8; i++) q8 = p->tensors[i].dtype == DUET_U8;
    snprintf(buf, n, "%s", q8 ? "int8" : "f32");
    break;
  }
  case 16: /* --calibrate N: int8 activations (runtime/calibrate.c) */
    if (p->defaults.calibrate > 0) *num = (double)p->defaults.calibrate;
    else snprintf(buf, n, "none (no int8 activations)");
    break;
  case 17: /* --quantize: int8 weights, one scale per output channel or per tensor (passes/quantize.c) */
    snprintf(buf, n, "%s", quantize_mode(p));
    break;
  case 15: /* the recomputation is in the compiled kernels' schedule; the program does not name it */
    snprintf(buf, n, "as compiled (the program does not record the mode)");
    break;
  default: { /* the pruned params, by name */
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; pr && i < pr->n_params && len + 1 < n; i++)
      len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? "," : "", p->tensors[pr->params[i].param].name);
    if (!pr) snprintf(buf, n, "none (no pruning)");
    break;
  }
  }
  if (!isnan(*num)) snprintf(buf, n, "%.15g%s", *num, k == 6 && !pr ? " (no pruning)" : "");
  return buf;
}

/* A flag fixed when p was compiled (fixed_flags): 0 when val is its
 * compiled value (accepted silently: nothing changes), else 1 after
 * "duet: error: --F is fixed at compile time: VALUE (...)". */
static int check_fixed(const DuetProgram *p, int k, const char *flag, const char *val) {
  char cv[512];
  double num;
  fixed_value(p, k, cv, sizeof cv, &num);
  char *end;
  double x = strtod(val, &end);
  /* what `duet compile` takes for each flag, so that the suggestion below
   * never names a value the compiler refuses: numbers in [lo, hi] (hi
   * excluded where open; whole numbers where whole), or one of the words */
  static const struct {
    char kind; /* 'n' number, 'w' words, 'm' a pruning mode (words or N:M), 0 anything */
    bool whole, open;
    double lo, hi;
    const char *words, *what;
  } ok[N_FIXED] = {
      [0] = {'w', .words = "auto|fp32|fp16|bf16", .what = "auto, fp32, fp16 or bf16"},
      [1] = {'w', .words = "fp32|fp16", .what = "fp32 or fp16"},
      [2] = {'n', true, false, 1, 1e9, NULL, "a whole number >= 1"},
      [3] = {'n', true, false, 1, 1e9, NULL, "a whole number >= 1"},
      [4] = {'n', true, false, 1, 1e9, NULL, "a whole number >= 1"},
      [5] = {'n', false, false, 1e-9, 1e9, NULL, "a number > 0"},
      [6] = {'n', false, true, 0, 1, NULL, "a sparsity in [0, 1)"},
      [7] = {'m', .what = "unstructured, global, channels or N:M (such as 2:4)"},
      [8] = {'n', true, false, 0, 1e18, NULL, "a whole number >= 0"},
      [9] = {'n', true, false, 0, 1e18, NULL, "a whole number >= 0"},
      [10] = {'n', true, false, 1, 1e18, NULL, "a whole number >= 1"},
      [11] = {'n', false, true, 0, 1, NULL, "a sparsity in [0, 1)"},
      [13] = {'n', true, false, 0, 1, NULL, "0 or 1"},
      [14] = {'w', .words = "int8|f32", .what = "int8 or f32"},
      [15] = {'w', .words = "none|blocks|auto", .what = "none, blocks or auto"},
      [16] = {'n', true, false, 1, 1000000, NULL, "a number of batches from 1 to 1000000"},
      [17] = {'w', .words = "int8|int8-tensor|none", .what = "int8, int8-tensor or none"},
  };
  bool valid = true;
  if (ok[k].kind == 'n')
    valid = end != val && !*end && x >= ok[k].lo && (ok[k].open ? x < ok[k].hi : x <= ok[k].hi) &&
            (!ok[k].whole || x == floor(x));
  else if (ok[k].kind == 'w') {
    size_t n = strlen(val);
    const char *w = ok[k].words;
    valid = false;
    for (const char *q = w; *q && !valid; q = strchr(q, '|') ? strchr(q, '|') + 1 : q + strlen(q))
      valid = n && !strncmp(q, val, n) && (q[n] == '|' || !q[n]);
  }
  else if (ok[k].kind == 'm') {
    int a, b, used = 0;
    valid = !strcmp(val, "unstructured") || !strcmp(val, "global") || !strcmp(val, "channels") ||
            (sscanf(val, "%d:%d%n", &a, &b, &used) == 2 && !val[used] && a >= 1 && b > a);
  }
  if (!valid) {
    fprintf(stderr, "duet: error: %s expects %s, got '%s' (fixed at compile time in this program: %s)\n", flag,
            ok[k].what, val, cv);
    return 1;
  }
  int shrunk = duet_shrink_check_fixed(p, flag, val);
  if (shrunk >= 0) return shrunk;
  bool same = isnan(num) ? !strcmp(val, cv) : end != val && !*end && x == num;
  if (same) return 0;
  if (k == 17 && !strcmp(val, "none") && duet_program_quantized(p)) { /* an int8 program evaluates int8 weights only */
    fprintf(stderr, "duet: error: --quantize is fixed at compile time: %s (this program was compiled with it; for f32 "
                    "weights, compile again without --quantize; duet run takes it directly)\n", cv);
    return 1;
  }
  fprintf(stderr, "duet: error: %s is fixed at compile time: %s (this program was compiled with it; to change it, "
                  "compile again: duet compile M.model %s %s; duet run takes it directly)\n", flag, cv, flag, val);
  return 1;
}

void duet_usage_fixed(const DuetProgram *p, FILE *out) {
  fprintf(out, "\nFixed at compile time (given again, a flag must repeat the compiled value; any other value is\n"
               "an error that says the compiled one); this program's:\n");
  for (int k = 0; k < N_FIXED; k++) {
    char cv[512];
    double num;
    if (k == 5 && !(p->n_stages >= 1 && p->replicas > 1)) continue;
    if (k >= 7 && k <= 12 && !p->prune && !(p->shrink && k == 7)) continue;
    if (k == 16 && p->defaults.calibrate <= 0) continue;
    if (k == 17 && !duet_program_quantized(p)) continue;
    fprintf(out, "  %-18s %s\n", fixed_flags[k], fixed_value(p, k, cv, sizeof cv, &num));
  }
  fprintf(out, "--lr-schedule, --warmup and --min-lr are run-time flags; --clip-grad-norm %s.\n",
          p->n_clip > 0 ? "is one too (this program has the clipping kernels)"
                        : "needs the clipping kernels, which this program lacks (duet compile --clip-grad-norm X)");
  if (p->weights) /* duet compile --checkpoint */
    fprintf(out, "This executable holds its weights (%" PRId64 " bytes, compiled with --checkpoint): run without flags,\n"
                 "it evaluates them; --checkpoint CK evaluates CK instead; it trains nothing.\n", p->weights_nbytes);
}

static int parse_flags(DuetConfig *c, const DuetProgram *p, bool fixed, int argc, char **argv);
static int check_eval_flags(const DuetProgram *p, const DuetConfig *c);

int duet_parse_flags(DuetConfig *c, int64_t compiled_batch, int argc, char **argv) {
  DuetProgram p = {.defaults = {.batch = compiled_batch}};
  return parse_flags(c, &p, false, argc, argv);
}

int duet_parse_flags_for(DuetConfig *c, const DuetProgram *p, int argc, char **argv) {
  return parse_flags(c, p, true, argc, argv);
}

/* duet_parse_flags, for program p; `fixed`: the compile-time flags are
 * checked against p (else only --batch, against p->defaults.batch). */
static int parse_flags(DuetConfig *c, const DuetProgram *p, bool fixed, int argc, char **argv) {
  int64_t compiled_batch = p->defaults.batch;
  int steps_given = 0, no_eval = 0;
  const char *train_only = NULL; /* the last of --steps, --epochs, --offload given (--eval-only refuses them) */
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 2;
    if (!strcmp(a, "--no-eval")) {
      c->eval = 0, no_eval = 1;
      continue;
    }
    if (!strcmp(a, "--eval-only") || !strcmp(a, "--keep-best")) {
      *(a[2] == 'e' ? &c->eval_only : &c->keep_best) = 1;
      continue;
    }
    if (!strcmp(a, "--metrics-timing")) {
      c->metrics_timing = 1;
      continue;
    }
    if (fixed && !strcmp(a, "--shrink")) { /* fixed at compile time (passes/shrink.c) */
      if (p->shrink) continue;
      if (duet_program_quantized(p))
        fprintf(stderr, "duet: error: --shrink is fixed at compile time: this program's layers are not shrunk (its "
                        "weights are int8, and --shrink does not go with --quantize yet)\n");
      else
        fprintf(stderr, "duet: error: --shrink is fixed at compile time: this program's layers are not shrunk (to "
                        "evaluate a channels-pruned checkpoint with smaller layers, compile again: duet compile M.model "
                        "--prune-mode channels --prune S --shrink; duet run takes it directly)\n");
      return 1;
    }
    if (!strncmp(a, "--no-eval=", 10) || !strncmp(a, "--quiet=", 8) || !strncmp(a, "--eval-only=", 12) ||
        !strncmp(a, "--keep-best=", 12) || !strncmp(a, "--metrics-timing=", 17) ||
        (fixed && !strncmp(a, "--shrink=", 9))) {
      fprintf(stderr, "duet: error: %.*s takes no value\n", (int)(strchr(a, '=') - a), a);
      return 1;
    }
    if (!strcmp(a, "--quiet")) {
      c->quiet = 1;
      continue;
    }
    if (strncmp(a, "--", 2)) {
      fprintf(stderr, "duet: error: unexpected argument '%s' (see --help)\n", a);
      return 1;
    }
    char flag[64];
    const char *val;
    const char *eq = strchr(a, '=');
    static const char *const known[] = {"--epochs", "--steps", "--lr", "--weight-decay", "--seed", "--threads",
                                        "--log-every", "--eval-every", "--eval-batches", "--train-subset",
                                        "--test-subset", "--data", "--save", "--save-every", "--resume",
                                        "--metrics", "--batch", "--loss-scale", "--min-loss-scale",
                                        "--devices", "--micro-batches", "--schedule", "--data-parallel",
                                        "--bucket-mb", "--zero", "--lr-schedule", "--warmup", "--min-lr",
                                        "--clip-grad-norm", "--checkpoint", "--keep", "--offload",
                                        "--init-from"};
    snprintf(flag, sizeof flag, "%.*s", (int)(eq ? eq - a : (long)strlen(a)), a);
    int is_known = 0, fixed_k = -1;
    for (size_t k = 0; k < sizeof known / sizeof *known; k++) is_known |= !strcmp(known[k], flag);
    for (int k = 0; fixed && k < N_FIXED; k++)
      if (!strcmp(fixed_flags[k], flag) && (k != 5 || (p->n_stages >= 1 && p->replicas > 1))) fixed_k = k;
    is_known |= fixed_k >= 0;
    if (!is_known) {
      fprintf(stderr, "duet: error: unknown flag '%s' (see --help)\n", flag);
      return 1;
    }
    if (eq) {
      val = eq + 1;
    } else {
      snprintf(flag, sizeof flag, "%s", a);
      if (i + 1 >= argc) {
        fprintf(stderr, "duet: error: %s needs a value (see --help)\n", flag);
        return 1;
      }
      val = argv[++i];
    }
    int64_t iv = 0;
    int rc = 0;
    if (!strcmp(flag, "--steps") || !strcmp(flag, "--epochs") || !strcmp(flag, "--offload"))
      train_only = !strcmp(flag, "--steps") ? "--steps" : !strcmp(flag, "--epochs") ? "--epochs" : "--offload";
    static const char *const path_flags[] = {"--resume", "--checkpoint", "--init-from", "--metrics", "--data", "--save"};
    for (size_t k = 0; k < sizeof path_flags / sizeof *path_flags; k++) {
      if (strcmp(flag, path_flags[k])) continue;
      if (!*val && strcmp(flag, "--save")) { /* --save's own check says the same, after the model's is known */
        fprintf(stderr, "duet: error: %s needs a path, got an empty one\n", flag);
        return 1;
      }
      if (!eq && !strncmp(val, "--", 2)) {
        fprintf(stderr, "duet: error: %s needs a path, got the flag '%s' (for a file of that name give ./%s)\n",
                flag, val, val);
        return 1;
      }
    }
    if (fixed_k >= 0) {
      if (check_fixed(p, fixed_k, flag, val)) return 1;
      if (fixed_k < 2 || fixed_k > 5) continue; /* known only to the compiler */
    }
    /* --steps wins over --epochs in either order; --epochs alone replaces
     * the model's `steps` */
    if (!strcmp(flag, "--epochs")) rc = parse_i64(flag, val, 1, &c->epochs), c->steps = rc || steps_given ? c->steps : 0;
    else if (!strcmp(flag, "--steps")) rc = parse_i64(flag, val, 1, &c->steps), steps_given = 1;
    else if (!strcmp(flag, "--lr")) rc = parse_f64(flag, val, 0, &c->lr);
    else if (!strcmp(flag, "--lr-schedule")) rc = duet_parse_lr_schedule(val, &c->lr_schedule);
    else if (!strcmp(flag, "--warmup")) rc = parse_i64(flag, val, 0, &c->warmup);
    else if (!strcmp(flag, "--min-lr")) rc = parse_f64(flag, val, 0, &c->min_lr);
    else if (!strcmp(flag, "--clip-grad-norm")) {
      char *end;
      errno = 0;
      double x = strtod(val, &end);
      if (errno || end == val || *end || !(x > 0) || !isfinite(x)) {
        fprintf(stderr, "duet: error: --clip-grad-norm expects a number > 0 (the largest global L2 norm of the "
                        "gradients), got '%s'\n", val);
        rc = 1;
      }
      if (!rc) c->clip_grad_norm = x;
    }
    else if (!strcmp(flag, "--weight-decay")) rc = parse_f64(flag, val, 0, &c->weight_decay);
    else if (!strcmp(flag, "--seed")) rc = parse_i64(flag, val, 0, &iv), c->seed = (uint64_t)iv;
    else if (!strcmp(flag, "--threads")) rc = duet_parse_threads(val, &c->threads);
    else if (!strcmp(flag, "--log-every")) rc = parse_i64(flag, val, 1, &c->log_every);
    else if (!strcmp(flag, "--eval-every")) rc = parse_i64(flag, val, 1, &c->eval_every);
    else if (!strcmp(flag, "--eval-batches")) rc = parse_i64(flag, val, 1, &c->eval_batches);
    else if (!strcmp(flag, "--train-subset")) rc = parse_i64(flag, val, 1, &c->train_subset);
    else if (!strcmp(flag, "--test-subset")) rc = parse_i64(flag, val, 1, &c->test_subset);
    else if (!strcmp(flag, "--data")) c->data_path = val;
    else if (!strcmp(flag, "--save")) c->save_path = val;
    else if (!strcmp(flag, "--save-every")) rc = parse_i64(flag, val, 1, &c->save_every);
    else if (!strcmp(flag, "--resume")) c->resume_path = val;
    else if (!strcmp(flag, "--checkpoint")) c->checkpoint_path = val;
    else if (!strcmp(flag, "--init-from")) c->init_path = val;
    else if (!strcmp(flag, "--keep")) {
      char *end;
      errno = 0;
      long long k = strtoll(val, &end, 10);
      if (errno || end == val || *end || k < 1) {
        fprintf(stderr, "duet: error: --keep expects a number of checkpoints >= 1 (PATH and the N-1 before it), got "
                        "'%s'\n", val);
        rc = 1;
      }
      c->keep = k;
    }
    else if (!strcmp(flag, "--metrics")) c->metrics_path = val;
    else if (!strcmp(flag, "--loss-scale") || !strcmp(flag, "--min-loss-scale")) {
      /* the kernels multiply by the scale in f32: at most FLT_MAX */
      char *end;
      errno = 0;
      double x = strtod(val, &end);
      if (errno || end == val || *end || !(x > 0) || x > FLT_MAX) {
        fprintf(stderr, "duet: error: %s expects a number > 0 and at most %g (the largest float), got '%s'\n", flag,
                (double)FLT_MAX, val);
        rc = 1;
      }
      if (!rc) *(flag[2] == 'l' ? &c->loss_scale : &c->min_loss_scale) = x;
    } else if (!strcmp(flag, "--devices")) {
      DuetDeviceSpec d[DUET_MAX_DEVICES];
      int n;
      char err[256];
      rc = duet_devices_parse(val, d, DUET_MAX_DEVICES, &n, err, sizeof err) ? 1 : 0;
      if (rc) fprintf(stderr, "duet: error: %s\n", err);
      c->devices = val;
    } else if (!strcmp(flag, "--micro-batches")) rc = parse_i64(flag, val, 1, &c->micro_batches);
    else if (!strcmp(flag, "--data-parallel")) rc = duet_parse_data_parallel(val, &c->data_parallel);
    else if (!strcmp(flag, "--bucket-mb")) rc = duet_parse_bucket_mb(val, &c->bucket_mb);
    else if (!strcmp(flag, "--zero")) {
      int z = 0;
      rc = duet_parse_zero(val, &z);
      c->zero = 1 + z;
    }
    else if (!strcmp(flag, "--offload")) rc = duet_parse_offload(val, &c->offload);
    else if (!strcmp(flag, "--schedule")) {
      if (!strcmp(val, "gpipe")) c->schedule = DUET_SCHEDULE_GPIPE;
      else if (!strcmp(val, "1f1b")) c->schedule = DUET_SCHEDULE_1F1B;
      else {
        fprintf(stderr, "duet: error: --schedule expects gpipe or 1f1b, got '%s'\n", val);
        rc = 1;
      }
    }
    else if (!strcmp(flag, "--batch")) {
      rc = parse_i64(flag, val, 1, &iv);
      if (!rc && iv != compiled_batch) {
        fprintf(stderr,
                "duet: error: this program was compiled for batch %" PRId64 "; recompile with "
                "`duet compile M.model --batch %" PRId64 "` (duet run accepts --batch directly)\n",
                compiled_batch, iv);
        rc = 1;
      }
    } else {
      fprintf(stderr, "duet: error: unknown flag '%s' (see --help)\n", flag);
      rc = 1;
    }
    if (rc) return 1;
  }
  double floor = c->min_loss_scale > 0 ? c->min_loss_scale : 1;
  if (c->loss_scale > 0 && c->loss_scale < floor) {
    fprintf(stderr, "duet: error: --loss-scale %g is below the floor %g (--min-loss-scale) at which training stops\n",
            c->loss_scale, floor);
    return 1;
  }
  if (c->loss_scale <= 0 && floor > 65536) {
    fprintf(stderr, "duet: error: --min-loss-scale %g is above the default initial loss scale 65536; give "
                    "--loss-scale too\n", floor);
    return 1;
  }
  if (c->save_every > 0 && !c->save_path) {
    fprintf(stderr, "duet: error: --save-every needs --save PATH (where to write the checkpoints)\n");
    return 1;
  }
  if (!c->eval_only && duet_program_quantized(p)) { /* int8 weights: passes/quantize.c */
    fprintf(stderr, "duet: error: this program's weights are int8 (compiled with --quantize): it evaluates a "
                    "trained checkpoint and cannot train; give --eval-only --checkpoint CK\n");
    return 1;
  }
  if (!c->eval_only && p->shrink) { /* --shrink: passes/shrink.c */
    fprintf(stderr, "duet: error: this program's layers are shrunk (compiled with --shrink): it evaluates a "
                    "channels-pruned checkpoint and cannot train; give --eval-only --checkpoint CK\n");
    return 1;
  }
  if (!c->eval_only && p->eval_program) { /* passes/evalonly.c */
    fprintf(stderr, "duet: error: this program was compiled for evaluation (duet run --eval-only: no gradients, no "
                    "optimizer state) and cannot train; give --eval-only --checkpoint CK\n");
    return 1;
  }
  if (c->keep_best && no_eval) {
    fprintf(stderr, "duet: error: --keep-best keeps the checkpoint of the best evaluation: it cannot go with "
                    "--no-eval\n");
    return 1;
  }
  if (c->eval_only && train_only && p->weights) { /* eval_only by default: duet compile --checkpoint */
    fprintf(stderr, "duet: error: this executable evaluates its embedded weights (compiled with --checkpoint) and "
                    "trains nothing: it takes no %s; to train, compile without --checkpoint\n", train_only);
    return 1;
  }
  if (c->eval_only && train_only) return duet_eval_only_refuse(train_only);
  return check_eval_flags(p, c);
}

int duet_eval_only_refuse(const char *flag) {
  if (!strcmp(flag, "--offload"))
    fprintf(stderr, "duet: error: --eval-only trains nothing: --offload moves the optimizer state and its update to "
                    "the host, and an evaluation has neither; leave it out\n");
  else
    fprintf(stderr, "duet: error: --eval-only trains nothing: %s sets the length of training (to evaluate fewer "
                    "samples: --test-subset N; a language model: --eval-batches N)\n", flag);
  return 1;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One JSON line; -1 (after a message) when it cannot be written. */
static int metrics_write(FILE *f, cJSON *obj) {
  char *s = cJSON_PrintUnformatted(obj);
  int bad = !s || fprintf(f, "%s\n", s) < 0 || fflush(f) != 0;
  if (s) cJSON_free(s);
  cJSON_Delete(obj);
  if (bad) fprintf(stderr, "duet: error: writing the metrics file failed: %s\n", strerror(errno));
  return bad ? -1 : 0;
}

/* Copies samples idx[0..n) of ds into the x/y input tensors (zero rows and
 * label 0 pad a short final batch), filled on the host and written to the
 * device.  0, or -1 with a message in duet_session_error. */
static int fill_batch(DuetSession *s, const DuetProgram *p, const DuetDataset *ds, const int64_t *idx, int64_t n,
                      int64_t batch) {
  const DuetTensor *tx = &p->tensors[p->input_x];
  if (ds->x) { /* npy: rows copied as they are (4-byte elements), zero rows pad */
    size_t sx = (size_t)ds->x_elems * 4, sy = (size_t)ds->y_elems * 4;
    char *buf = duet_session_staging(s, (size_t)batch * (sx + sy));
    if (!buf) return -1;
    char *y = buf + (size_t)batch * sx;
    for (int64_t r = 0; r < batch; r++) {
      if (r < n) {
        memcpy(buf + (size_t)r * sx, (const char *)ds->x + (size_t)idx[r] * sx, sx);
        memcpy(y + (size_t)r * sy, (const char *)ds->y + (size_t)idx[r] * sy, sy);
      } else {
        memset(buf + (size_t)r * sx, 0, sx);
        memset(y + (size_t)r * sy, 0, sy);
      }
    }
    return duet_session_write(s, p->input_x, 0, buf, (size_t)batch * sx) ||
                   duet_session_write(s, p->input_y, 0, y, (size_t)batch * sy)
               ? -1
               : 0;
  }
  int64_t px = (int64_t)ds->rows * ds->cols;
  size_t bx = (size_t)(batch * px) * (tx->dtype == DUET_F64 ? sizeof(double) : sizeof(float));
  size_t by = (size_t)batch * sizeof(int32_t);
  char *buf = duet_session_staging(s, bx + by);
  if (!buf) return -1;
  void *x = buf;
  int32_t *y = (int32_t *)(buf + bx); /* bx: a multiple of 4 bytes */
  for (int64_t r = 0; r < batch; r++) {
    const float *src = r < n ? ds->images + idx[r] * px : NULL;
    if (tx->dtype == DUET_F64) {
      double *d = (double *)x + r * px;
      for (int64_t j = 0; j < px; j++) d[j] = src ? src[j] : 0.0;
    } else {
      float *d = (float *)x + r * px;
      if (src) memcpy(d, src, (size_t)px * sizeof *d);
      else memset(d, 0, (size_t)px * sizeof *d);
    }
    y[r] = r < n ? ds->labels[idx[r]] : 0;
  }
  return duet_session_write(s, p->input_x, 0, x, bx) || duet_session_write(s, p->input_y, 0, y, by) ? -1 : 0;
}

/* Element k of f32/f64 tensor id, read from the device.  0, or -1 with a
 * message in duet_session_error. */
static int read_scalar(DuetSession *s, const DuetProgram *p, int id, int k, double *out) {
  bool f64 = p->tensors[id].dtype == DUET_F64;
  double d = 0;
  float f = 0;
  size_t sz = f64 ? sizeof d : sizeof f;
  if (duet_session_read(s, id, (size_t)k * sz, f64 ? (void *)&d : (void *)&f, sz)) return -1;
  *out = f64 ? d : f;
  return 0;
}

/* ---------------------------------------------------------- stop signals */

/* SIGINT and SIGTERM during training.  The one piece of mutable process
 * state of the runtime: the number of the first such signal of the running
 * training loop (0: none), written only by on_stop_signal, read by the loop
 * after each step (check_stop), reset when the handlers are installed.  The
 * loop then finishes the step, writes a checkpoint when --save was given,
 * says where, and returns 128 + the signal's number.  A second signal
 * restores the default action and raises itself: the process ends at once.
 * The handler only stores the number (async-signal-safe); any thread may run
 * it (pipeline stages included: they finish the step with the main thread,
 * then stop when the session is freed). */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
  if (stop_signal) {
    signal(sig, SIG_DFL);
    raise(sig); /* pending until the handler returns (the signal is blocked in it) */
    return;
  }
  stop_signal = sig;
}

/* The dispositions the training loop replaced, restored when it ends. */
typedef struct StopHandlers {
  struct sigaction old[2];
  bool set[2];
} StopHandlers;
static const int stop_signals[2] = {SIGINT, SIGTERM};

/* Installs on_stop_signal for SIGINT and SIGTERM, except for a signal that
 * is ignored (a background job's SIGINT, nohup): it stays ignored. */
static void stop_handlers_install(StopHandlers *h) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  memset(h, 0, sizeof *h);
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  stop_signal = 0;
  /* both blocked while the handler runs (they fail only for invalid signals:
   * then the default dispositions stay) */
  if (sigemptyset(&sa.sa_mask) || sigaddset(&sa.sa_mask, SIGINT) || sigaddset(&sa.sa_mask, SIGTERM)) return;
  for (int k = 0; k < 2; k++) {
    if (sigaction(stop_signals[k], NULL, &h->old[k]) != 0) continue; /* cannot fail for these signals */
    if (h->old[k].sa_handler == SIG_IGN) continue;
    h->set[k] = sigaction(stop_signals[k], &sa, NULL) == 0;
  }
}

static void stop_handlers_restore(StopHandlers *h) {
  for (int k = 0; k < 2; k++)
    if (h->set[k] && sigaction(stop_signals[k], &h->old[k], NULL) != 0)
      fprintf(stderr, "duet: warning: cannot restore the handler of signal %d: %s\n", stop_signals[k], strerror(errno));
  memset(h, 0, sizeof *h);
}

/* ------------------------------------------------------------- the run */

/* What a training loop knows besides its config: for checkpoints, the
 * divergence messages and interruptions. */
typedef struct Run {
  const DuetProgram *p;
  const DuetConfig *cfg;
  DuetSession *s;
  int64_t first_step;  /* the step the run started after: the checkpoint's, or 0 */
  int64_t total;       /* the last step */
  int64_t saved_step;  /* the step of the last checkpoint this run wrote; -1: none yet */
  bool save_existed;   /* --save's file existed when the run started */
  DuetDist *dist;      /* an MPI run (this process one rank of it), else NULL */
  bool has_best;       /* --keep-best: PATH.best holds the evaluation best_score (higher is better), */
  double best_score, best_loss; /* ties broken by the lower best_loss */
} Run;

static void keep_before_save(const DuetConfig *cfg);
static void keep_after_save(const DuetConfig *cfg, int64_t step);
static void keep_best_resume(Run *r);
static int keep_best(Run *r, const DuetTrainState *st, double score, double loss);
static int split_validation(DuetDataset *train, double fraction, DuetDataset *val);

static void run_init(Run *r, const DuetProgram *p, const DuetConfig *cfg, DuetSession *s) {
  struct stat sb;
  *r = (Run){.p = p, .cfg = cfg, .s = s, .saved_step = -1};
  r->save_existed = cfg->save_path && !lstat(cfg->save_path, &sb);
}

/* "k.st keeps the checkpoint of step 12" and the like: what --save's file
 * holds after a checkpoint was not written. */
static const char *kept_note(const Run *r, char *buf, size_t n) {
  if (r->saved_step >= 0)
    snprintf(buf, n, "%s keeps the checkpoint of step %" PRId64, r->cfg->save_path, r->saved_step);
  else if (r->save_existed)
    snprintf(buf, n, "%s is left as it was", r->cfg->save_path);
  else
    snprintf(buf, n, "no checkpoint was written");
  return buf;
}

/* Writes a checkpoint of state st when one is due (the last step, every
 * --save-every steps, or `now`) and not written already.  A state with
 * non-finite values is not written: the error says which tensor and what
 * the file keeps.  0, or -1 after the error. */
static int maybe_save(Run *r, const DuetTrainState *st, bool now) {
  const DuetConfig *cfg = r->cfg;
  if (!cfg->save_path || r->saved_step == st->step) return 0;
  if (!now && st->step != r->total && !(cfg->save_every > 0 && st->step % cfg->save_every == 0)) return 0;
  if (r->dist && duet_dist_rank(r->dist) > 0) { /* ZeRO (rank_view): this rank's shard of the state to rank 0 */
    if (duet_session_serve_states(r->s)) {
      fprintf(stderr, "duet: error: sending this rank's optimizer state to rank 0 for the checkpoint of step %" PRId64
              ": %s\n", st->step, duet_session_error(r->s));
      return -1;
    }
    r->saved_step = st->step;
    return 0;
  }
  char err[1024], kept[1200];
  int n_stale = duet_st_remove_stale_temps(cfg->save_path, DUET_ST_STALE_SECONDS, err, sizeof err);
  if (n_stale && !cfg->quiet)
    fprintf(stderr, "duet: removed %d stale temporary file%s of saves to %s that were interrupted (%s%s)\n", n_stale,
            n_stale == 1 ? "" : "s", cfg->save_path, err, n_stale > 1 ? ", ..." : "");
  keep_before_save(cfg);
  int rc = duet_checkpoint_save(r->s, cfg->save_path, st, err, sizeof err);
  if (!rc) keep_after_save(cfg, st->step);
  if (rc == -2) {
    fprintf(stderr, "duet: error: not saving step %" PRId64 " to %s: %s: training diverged (try a lower --lr); %s\n",
            st->step, cfg->save_path, err, kept_note(r, kept, sizeof kept));
    return -1;
  }
  if (rc) {
    fprintf(stderr, "duet: error: %s\n", err);
    return -1;
  }
  r->saved_step = st->step;
  if (!cfg->quiet) printf("duet: saved checkpoint %s at step %" PRId64 "\n", cfg->save_path, st->step);
  return 0;
}

/* After a step (and its evaluation and checkpoint): 0 to go on, or, when
 * SIGINT or SIGTERM arrived, the process's exit code (128 + the signal's
 * number) after writing the checkpoint of st (with --save) and saying
 * what happened. */
static int check_stop(Run *r, const DuetTrainState *st) {
  int sig = stop_signal;
  if (r->dist) { /* an MPI run: every rank stops after the same step, the first any rank was told to */
    char err[800];
    if (duet_dist_agree(r->dist, sig, &sig, err, sizeof err)) {
      fprintf(stderr, "duet: error: after step %" PRId64 ", agreeing with the other ranks whether to stop: %s\n",
              st->step, err);
      return 1;
    }
    if (sig && duet_dist_rank(r->dist) > 0) { /* rank 0 saves and says so (ZeRO: with this rank's state) */
      maybe_save(r, st, true);
      return 128 + sig;
    }
  }
  if (!sig) return 0;
  const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  const char *path = r->cfg->save_path;
  if (!path)
    fprintf(stderr, "duet: interrupted by %s after step %" PRId64 " of %" PRId64 "; no checkpoint written (--save PATH "
                    "writes one when a run is interrupted)\n", name, st->step, r->total);
  else if (!maybe_save(r, st, true))
    fprintf(stderr, "duet: interrupted by %s after step %" PRId64 " of %" PRId64 "; checkpoint of step %" PRId64
                    " saved to %s (continue with --resume %s)\n", name, st->step, r->total, st->step, path, path);
  else
    fprintf(stderr, "duet: interrupted by %s after step %" PRId64 " of %" PRId64 "\n", name, st->step, r->total);
  return 128 + sig;
}

static int maybe_resume(DuetSession *s, const DuetConfig *cfg, DuetTrainState *st) {
  if (!cfg->resume_path) return 0;
  char err[1024];
  if (duet_checkpoint_load(s, cfg->resume_path, st, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return -1;
  }
  /* the checkpoint's loss scaler wins over --loss-scale, as GradScaler's
   * load_state_dict does: resuming stays exact, but say so */
  DuetScaler sc = duet_session_scaler(s);
  if (cfg->loss_scale > 0 && duet_session_program(s)->n_unscale && sc.scale != cfg->loss_scale && duet_warns())
    fprintf(stderr, "duet: warning: --loss-scale %.15g is ignored: resuming from %s restores its loss scale %.15g (and "
            "growth counter) so that the run continues exactly\n", cfg->loss_scale, cfg->resume_path, sc.scale);
  if (!cfg->quiet) printf("duet: resumed from %s at step %" PRId64 "\n", cfg->resume_path, st->step);
  return 0;
}

/* --init-from CK: CK's params into the session (fine-tuning), before the
 * first step; the step, optimizer state, masks and data order stay those of
 * a new run.  0, or -1 after the error. */
static int maybe_init(DuetSession *s, const DuetConfig *cfg) {
  if (!cfg->init_path) return 0;
  char err[1024];
  int64_t step;
  if (duet_checkpoint_check_weights(duet_session_program(s), cfg->init_path, &step, err, sizeof err) ||
      duet_checkpoint_load_weights(s, cfg->init_path, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return -1;
  }
  if (!cfg->quiet)
    printf("duet: params from %s (its step %" PRId64 "); step, optimizer state and data order start afresh\n",
           cfg->init_path, step);
  return 0;
}

/* One optimizer step on the batch already in the inputs; the loss goes to
 * *loss.  -1 (after a message) when the step fails or the loss is not
 * finite.  The loss of step S is that of the weights after step S - 1, so
 * a non-finite loss at the first step of a run is not the learning rate's
 * doing: the message says which case it is. */
static int train_step(Run *r, int64_t step, double *loss) {
  DuetSession *s = r->s;
  if (duet_session_run(s, DUET_RUN_TRAIN)) {
    fprintf(stderr, "duet: error: %s\n", duet_session_error(s));
    return -1;
  }
  if (read_scalar(s, r->p, r->p->loss, 0, loss)) {
    fprintf(stderr, "duet: error: %s\n", duet_session_error(s));
    return -1;
  }
  if (!isfinite(*loss)) {
    const char *what = isnan(*loss) ? "NaN" : "infinite";
    int64_t finite = step - 1 - r->first_step; /* finite steps of this run before it */
    char kept[1200] = "";
    if (r->cfg->save_path && r->saved_step >= 0)
      snprintf(kept, sizeof kept, "; %s keeps the checkpoint of step %" PRId64, r->cfg->save_path, r->saved_step);
    if (finite > 0)
      fprintf(stderr, "duet: error: loss is %s at step %" PRId64 ", after %" PRId64 " finite step%s: training diverged "
                      "(try a lower --lr)%s\n", what, step, finite, finite == 1 ? "" : "s", kept);
    else if (r->cfg->resume_path)
      fprintf(stderr, "duet: error: loss is %s at step %" PRId64 ", the first after resuming from %s (whose values "
                      "are finite), before any update of this run: the model computes it from that state and this "
                      "batch\n", what, step, r->cfg->resume_path);
    else
      fprintf(stderr, "duet: error: loss is %s at step %" PRId64 ", the first step, before any update: the model "
                      "computes it from its initial weights and the first batch (not a learning-rate problem; check "
                      "the initialisation and the data)\n", what, step);
    return -1;
  }
  DuetScaler sc = duet_session_scaler(s);
  if (sc.last_skipped && !duet_session_config_quiet(s))
    printf("step %" PRId64 ": gradient overflow (first: %s); step skipped, loss scale now %g\n", step,
           sc.first_overflow, sc.scale);
  return 0;
}

/* ---------------------------------------------------------------- pruning */

/* The sparsity of every pruned param after new masks (final: at the end of
 * the run): one line, or at the end a table, on stdout unless quiet, and
 * with new masks a metrics line {"step":S,"sparsity":X,"target":T,
 * "layers":{NAME:X,...}}, S the first step trained with them.  0, or -1
 * after the error. */
static int prune_report(const Run *r, int64_t step, double target, FILE *mf, bool final) {
  const DuetProgram *p = r->p;
  const DuetPrune *pr = p->prune;
  char err[1024];
  double all, *per = malloc((size_t)pr->n_params * sizeof *per + 8);
  int64_t n;
  if (!per || duet_prune_sparsity(r->s, per, &all, &n, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", per ? err : "out of host memory");
    free(per);
    return -1;
  }
  static const char *const modes[] = {"", "unstructured", "global", "N:M", "channels"};
  char mode[32];
  if (pr->mode == DUET_PRUNE_NM) snprintf(mode, sizeof mode, "%d:%d", pr->nm_n, pr->nm_m);
  else snprintf(mode, sizeof mode, "%s", pr->mode >= 1 && pr->mode <= 4 ? modes[pr->mode] : "?");
  if (!r->cfg->quiet && !final) {
    printf("prune before step %" PRId64 ": %s, target sparsity %.4f: %.4f of %" PRId64 " weights (", step, mode, target,
           all, n);
    for (int i = 0; i < pr->n_params; i++)
      printf("%s%s %.4f", i ? ", " : "", p->tensors[pr->params[i].param].name, per[i]);
    printf(")\n");
  } else if (!r->cfg->quiet) {
    printf("duet: sparsity at the end (%s): %.4f of %" PRId64 " weights\n", mode, all, n);
    for (int i = 0; i < pr->n_params; i++) {
      const DuetTensor *t = &p->tensors[pr->params[i].param];
      char shape[160] = "[";
      for (int d = 0; d < t->rank; d++)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%" PRId64, d ? "," : "", t->shape[d]);
      snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "]");
      printf("  %-24s %-16s %.4f\n", t->name, shape, per[i]);
    }
  }
  fflush(stdout);
  int rc = 0;
  if (mf && !final) {
    cJSON *o = cJSON_CreateObject(), *layers = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "sparsity", all);
    cJSON_AddNumberToObject(o, "target", target);
    for (int i = 0; i < pr->n_params; i++)
      cJSON_AddNumberToObject(layers, p->tensors[pr->params[i].param].name, per[i]);
    cJSON_AddItemToObject(o, "layers", layers);
    rc = metrics_write(mf, o);
  }
  free(per);
  return rc;
}

/* Before training step t + 1 (after t steps): new masks when the schedule
 * says so (duet_prune_due), chosen from the weights as they are now, the
 * newly pruned weights and their optimizer state zeroed, and reported.
 * A resumed run makes the updates after its checkpoint's step, as the
 * uninterrupted run did.  0, or -1 after the error. */
static int prune_before(const Run *r, int64_t t, FILE *mf) {
  const DuetPrune *pr = r->p->prune;
  if (!pr || !duet_prune_due(pr, t)) return 0;
  char err[1024];
  double target = duet_prune_target(pr, t);
  if (duet_prune_update(r->s, target, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return -1;
  }
  return prune_report(r, t + 1, target, mf, false);
}

/* At the start of a run: a schedule that begins after the run's last step
 * prunes nothing (said, not silently). */
static void prune_check_schedule(const Run *r) {
  const DuetPrune *pr = r->p->prune;
  if (pr && pr->start >= r->total && duet_warns())
    fprintf(stderr, "duet: warning: pruning starts after step %" PRId64 " (--prune-start), but the run ends at step "
                    "%" PRId64 ": nothing is pruned\n", pr->start, r->total);
  else if (pr && pr->end >= r->total && duet_warns())
    fprintf(stderr, "duet: warning: the pruning schedule ends after step %" PRId64 " (--prune-end), but the run ends "
                    "at step %" PRId64 ": the final sparsity is not reached\n", pr->end, r->total);
}

/* " | loss scale S (K skipped)" for loss-scaled programs, else "". */
static const char *scale_note(const DuetSession *s, const DuetProgram *p, char *buf, size_t n) {
  if (!p->n_unscale) return "";
  DuetScaler sc = duet_session_scaler(s);
  snprintf(buf, n, " | loss scale %g (%" PRId64 " skipped)", sc.scale, sc.skipped);
  return buf;
}

/* " | lr X" (the rate of the step just taken, duet_lr_at) and, with
 * --clip-grad-norm, " | grad norm N" (before clipping) for progress lines. */
static const char *rate_note(const DuetSession *s, char *buf, size_t n) {
  int len = snprintf(buf, n, " | lr %.4g", duet_session_lr(s));
  if (duet_session_config(s)->clip_grad_norm > 0 && len >= 0 && (size_t)len < n)
    snprintf(buf + len, n - (size_t)len, " | grad norm %.4g", duet_session_grad_norm(s));
  return buf;
}

/* The metrics line {"step":S,"loss":L,"lr":R} (R exact: cJSON prints the
 * shortest round-trip form) and, with --clip-grad-norm, "grad_norm" (the
 * global norm before clipping; null on a step skipped for overflow), with
 * --metrics-timing `rate_key` ("samples_per_s" or "tokens_per_s"): `rate`,
 * the throughput since the previous line; nothing without a metrics file. */
static int log_loss(FILE *mf, const DuetSession *s, int64_t step, double loss, const char *rate_key, double rate) {
  if (!mf) return 0;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "step", (double)step);
  cJSON_AddNumberToObject(o, "loss", loss);
  cJSON_AddNumberToObject(o, "lr", duet_session_lr(s));
  if (duet_session_config(s)->clip_grad_norm > 0) {
    double g = duet_session_grad_norm(s);
    if (isfinite(g)) cJSON_AddNumberToObject(o, "grad_norm", g);
    else cJSON_AddNullToObject(o, "grad_norm");
  }
  if (duet_session_config(s)->metrics_timing) cJSON_AddNumberToObject(o, rate_key, rate);
  return metrics_write(mf, o);
}

/* The learning-rate schedule of a run of `total` steps: 1 after the error
 * when it cannot run (duet_lr_schedule_check), else 0. */
static int check_schedule(const DuetConfig *cfg, int64_t total) {
  char err[512];
  if (!duet_lr_schedule_check(cfg, total, err, sizeof err)) return 0;
  fprintf(stderr, "duet: error: %s\n", err);
  return 1;
}

/* "duet: schedule: ..." on the start-up lines: the learning-rate schedule
 * and the clipping, unless quiet or both are the defaults. */
static void print_schedule(const DuetConfig *cfg, int64_t total) {
  if (cfg->quiet || (cfg->lr_schedule == DUET_LR_CONSTANT && cfg->warmup <= 0 && cfg->clip_grad_norm <= 0)) return;
  char buf[256];
  duet_lr_schedule_str(cfg, total, buf, sizeof buf);
  printf("duet: lr schedule: %s (peak %g)", buf, cfg->lr);
  if (cfg->clip_grad_norm > 0) printf("; gradients clipped to global norm %g", cfg->clip_grad_norm);
  printf("\n");
}

/* "duet: precision P, devices D (T threads), lr schedule L[, pipeline
 * schedule S]" on the start-up lines, unless quiet: what the run uses.
 * Devices: --devices, else the CPU (one device, or the virtual CPU devices
 * of a pipeline or of replicas); threads: per CPU device (each worker
 * thread's share of --threads, duet_threads_per_device; at least one, and
 * then said when --threads is fewer than the workers); under MPI, each
 * rank's. */
static void print_setup(const DuetProgram *p, const DuetConfig *cfg, int64_t total, const DuetDist *dist) {
  if (cfg->quiet) return;
  int S = p->n_stages >= 1 ? p->n_stages : 1, R = p->n_stages >= 1 && p->replicas > 1 ? p->replicas : 1;
  int W = S * (dist ? 1 : R), per = duet_threads_per_device(cfg, W);
  char devs[400], sched[256];
  int len = dist ? snprintf(devs, sizeof devs, "each of %d MPI ranks: ", R) : 0;
  if (cfg->devices) len += snprintf(devs + len, sizeof devs - (size_t)len, "%s", cfg->devices);
  else if (W == 1) len += snprintf(devs + len, sizeof devs - (size_t)len, "cpu");
  else len += snprintf(devs + len, sizeof devs - (size_t)len, "cpu:0..cpu:%d", W - 1);
  if ((!cfg->devices || !duet_devices_all_cuda(cfg->devices)) && cfg->threads > 0 && cfg->threads < W)
    snprintf(devs + len, sizeof devs - (size_t)len, " (1 thread per CPU device: %d in all, as every worker runs on a "
             "thread of its own; --threads %d is fewer than the %d workers)", W, cfg->threads, W);
  else if (!cfg->devices || !duet_devices_all_cuda(cfg->devices))
    snprintf(devs + len, sizeof devs - (size_t)len, " (%d thread%s%s)", per, per == 1 ? "" : "s",
             W > 1 ? " per CPU device" : "");
  duet_lr_schedule_str(cfg, total, sched, sizeof sched);
  printf("duet: precision %s, devices %s, lr schedule %s", duet_program_precision(p), devs, sched);
  if (p->n_stages >= 1) printf(", pipeline schedule %s", cfg->schedule == DUET_SCHEDULE_1F1B ? "1f1b" : "gpipe");
  printf("\n");
}

typedef struct EvalResult {
  int64_t correct, n;
  double loss;
} EvalResult;

/* Evaluation progress before batch i (0-based) of pg->total. */
static void eval_progress(DuetProgress *pg, int64_t i) {
  char what[64];
  snprintf(what, sizeof what, "evaluating: batch %" PRId64 "/%" PRId64, i, pg->total);
  if (i > 0) duet_progress_update(pg, i, "eval", what, false);
}

/* Training progress after step `step` (progress.h): the step, the loss and
 * the rate in `unit`s per second since the run (or its resumption)
 * started, `per_step` units a step; epoch 0: none shown. */
static void train_progress(DuetProgress *pg, int64_t epoch, int64_t step, double loss, int64_t per_step,
                           const char *unit, bool force) {
  if (pg->mode == DUET_PROGRESS_OFF) return;
  char what[256], ep[32] = "";
  double dt = duet_progress_now() - pg->t_start;
  if (epoch > 0) snprintf(ep, sizeof ep, "epoch %" PRId64 " ", epoch);
  snprintf(what, sizeof what, "%sstep %" PRId64 "/%" PRId64 " | loss %.4f | %.0f %s/s", ep, step, pg->total, loss,
           dt > 0 ? (double)((step - pg->first) * per_step) / dt : 0.0, unit);
  duet_progress_update(pg, step, "train", what, force);
}

static int evaluate_shown(DuetSession *s, const DuetProgram *p, const DuetDataset *ds, int64_t n, int64_t batch,
                          EvalResult *res, bool show) {
  int64_t *idx = malloc((size_t)batch * sizeof *idx);
  if (!idx) return -1;
  double correct = 0, nll = 0;
  DuetProgress pg;
  duet_progress_start(&pg, stdout, !show, 0, (n + batch - 1) / batch);
  for (int64_t start = 0; start < n; start += batch) {
    eval_progress(&pg, start / batch);
    int64_t m = n - start < batch ? n - start : batch;
    for (int64_t r = 0; r < m; r++) idx[r] = start + r;
    duet_session_set_valid(s, m);
    double c, l;
    if (fill_batch(s, p, ds, idx, m, batch) || duet_session_run(s, DUET_RUN_EVAL) ||
        read_scalar(s, p, p->metrics, 0, &c) || read_scalar(s, p, p->metrics, 1, &l)) {
      free(idx);
      return -1;
    }
    correct += c;
    nll += l;
  }
  duet_progress_clear(&pg);
  free(idx);
  res->correct = (int64_t)(correct + 0.5);
  res->n = n;
  res->loss = nll / (double)n;
  return 0;
}

static int check_labels(const DuetDataset *ds, int n_classes, const char *what) {
  for (int64_t i = 0; i < ds->n; i++)
    if (ds->labels[i] < 0 || ds->labels[i] >= n_classes) {
      fprintf(stderr, "duet: error: %s label %d at index %" PRId64 " is outside the model's %d classes\n", what,
              ds->labels[i], i, n_classes);
      return 1;
    }
  return 0;
}

/* --save PATH is checked before training, not after it: not empty, not an
 * existing directory or anything else but a regular file (a checkpoint is
 * renamed over it: as root, --save /dev/null would replace the device), and
 * its directory writable.  0, or 1 after printing the error. */
/* Whether this process writes the checkpoints: alone, or rank 0 of an MPI
 * run (the other ranks of a --zero 1 run keep --save only to take part in
 * rank 0's saves, rank_view; their machine need not have its directory). */
static bool writes_files_here(void) {
  int rank = 0;
  char var[400];
  return duet_launch_ranks(&rank, var, sizeof var) <= 1 || rank == 0;
}

static int check_save_path(const char *path) {
  struct stat st;
  if (!*path) {
    fprintf(stderr, "duet: error: --save needs a file path, got an empty one\n");
    return 1;
  }
  if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
    fprintf(stderr, "duet: error: --save %s is a directory; give a file path\n", path);
    return 1;
  }
  const char *kind = duet_st_target_kind(path);
  if (kind) {
    fprintf(stderr, "duet: error: --save %s exists and is %s, not a regular file: a checkpoint replaces only a "
                    "regular file\n", path, kind);
    return 1;
  }
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  if (!stat(dir, &st) && !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "duet: error: --save %s: %s is not a directory\n", path, dir);
    return 1;
  }
  if (access(dir, W_OK | X_OK)) {
    fprintf(stderr, "duet: error: --save %s: cannot write into %s: %s\n", path, dir, strerror(errno));
    return 1;
  }
  return 0;
}

/* The IDX files of the training (0) and test (1) splits in a data directory:
 * images, then labels. */
static const char *const idx_files[2][2] = {{"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"},
                                            {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}};

/* Which file a path names, for comparing files: its device and inode when
 * it exists, else its directory's and its last component (an output not yet
 * written). */
typedef struct FileKey {
  bool exists, known;
  dev_t dev;
  ino_t ino;
  const char *base;
} FileKey;

static FileKey file_key(const char *path) {
  FileKey k = {0};
  struct stat sb;
  if (!stat(path, &sb)) return (FileKey){.exists = true, .known = true, .dev = sb.st_dev, .ino = sb.st_ino};
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  if (stat(dir, &sb)) return k;
  return (FileKey){.known = true, .dev = sb.st_dev, .ino = sb.st_ino, .base = slash ? slash + 1 : path};
}

static bool same_key(const FileKey *a, const FileKey *b) {
  if (!a->known || !b->known || a->exists != b->exists || a->dev != b->dev || a->ino != b->ino) return false;
  return a->exists || !strcmp(a->base, b->base);
}

/* Outputs that would destroy an input: each output (--save, --metrics, or
 * the extra output of duet predict / duet export) is compared by device
 * and inode with each input that exists (the model source, --resume,
 * --checkpoint, the data files, the running program itself) and with the
 * other output.  --save may be --resume: the checkpoint is read whole
 * before the first save renames a new one over it.  0, or 1 after the
 * error. */
typedef struct RunInput {
  const char *what, *path;
} RunInput;

typedef struct RunInputs {
  RunInput in[10];
  int n;
  char data[4][4096], exe[4096];
} RunInputs;

/* The inputs of a run with cfg (and the model source model_path, or NULL). */
static void run_inputs(const DuetConfig *cfg, const char *model_path, RunInputs *r) {
  r->n = 0;
  if (model_path) r->in[r->n++] = (RunInput){"the model source", model_path};
  if (cfg->resume_path) r->in[r->n++] = (RunInput){"--resume", cfg->resume_path};
  if (cfg->checkpoint_path) r->in[r->n++] = (RunInput){"--checkpoint", cfg->checkpoint_path};
  if (cfg->init_path) r->in[r->n++] = (RunInput){"--init-from", cfg->init_path};
  if ((cfg->data == DUET_DATA_TEXT || cfg->data == DUET_DATA_TOKENS) && cfg->data_path) {
    r->in[r->n++] = (RunInput){cfg->data == DUET_DATA_TEXT ? "the training text" : "the token file", cfg->data_path};
  } else if (cfg->data == DUET_DATA_NPY) {
    const char *np[4] = {cfg->data_path, cfg->data_y, cfg->val_x, cfg->val_y};
    for (int k = 0; k < 4; k++)
      if (np[k]) r->in[r->n++] = (RunInput){"the data file", np[k]};
  } else if (cfg->data_path) {
    for (int k = 0; k < 4; k++) {
      snprintf(r->data[k], sizeof r->data[k], "%s/%s", cfg->data_path, idx_files[k / 2][k % 2]);
      r->in[r->n++] = (RunInput){"the data file", r->data[k]};
    }
  }
  ssize_t n_exe = readlink("/proc/self/exe", r->exe, sizeof r->exe - 1);
  if (n_exe > 0) {
    r->exe[n_exe] = 0;
    r->in[r->n++] = (RunInput){"the running program", r->exe};
  }
}

/* Output `path` (given as `flag`) against the inputs r; `skip`: an input
 * path the output may be (--save over --resume).  0, or 1 after the error. */
static int check_output(const RunInputs *r, const char *flag, const char *path, const char *skip, FileKey *key) {
  *key = file_key(path);
  if (!key->exists) return 0;
  for (int i = 0; i < r->n; i++) {
    if (skip && r->in[i].path == skip) continue;
    FileKey ik = file_key(r->in[i].path);
    if (ik.exists && same_key(key, &ik)) {
      fprintf(stderr, "duet: error: %s %s is the same file as %s %s: writing it would destroy that input\n", flag,
              path, r->in[i].what, r->in[i].path);
      return 1;
    }
  }
  return 0;
}

/* The directory of --save PATH into dir (".", "/" or PATH up to its last
 * slash); returns PATH's base name (the part after that slash), whose
 * PATH.step-S files --keep N looks for there. */
static const char *save_dir(const char *path, char *dir, size_t n) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, n, ".");
  else if (slash == path) snprintf(dir, n, "/");
  else snprintf(dir, n, "%.*s", (int)(slash - path), path);
  return slash ? slash + 1 : path;
}

/* --keep N and --keep-best write and remove files next to --save PATH:
 * PATH.step-S (renamed from PATH, the older ones removed) and PATH.best.
 * The checkpoint of --init-from (of another run) may not be one of them.
 * 0, or 1 after the error. */
static int check_init_keep(const DuetConfig *cfg) {
  if (!cfg->init_path || !cfg->save_path || !(cfg->keep || cfg->keep_best)) return 0;
  FileKey in = file_key(cfg->init_path);
  if (!in.exists) return 0;
  char p[4200];
  snprintf(p, sizeof p, "%s.best", cfg->save_path);
  FileKey k = file_key(p);
  if (cfg->keep_best && same_key(&k, &in)) {
    fprintf(stderr, "duet: error: --init-from %s is %s, which --keep-best replaces with this run's best checkpoint: "
                    "copy it elsewhere first, or --save to another PATH\n", cfg->init_path, p);
    return 1;
  }
  if (!cfg->keep) return 0;
  char dir[4096];
  const char *path = cfg->save_path, *base = save_dir(path, dir, sizeof dir);
  DIR *d = opendir(dir);
  if (!d) return 0;
  size_t nb = strlen(base);
  int bad = 0;
  for (struct dirent *e; !bad && (e = readdir(d));) {
    if (strncmp(e->d_name, base, nb) || strncmp(e->d_name + nb, ".step-", 6)) continue;
    snprintf(p, sizeof p, "%s%s", path, e->d_name + nb);
    k = file_key(p);
    bad = same_key(&k, &in);
  }
  closedir(d);
  if (bad)
    fprintf(stderr, "duet: error: --init-from %s is %s, one of the checkpoints --keep %" PRId64 " renames and removes: "
                    "copy it elsewhere first, or --save to another PATH\n", cfg->init_path, p, cfg->keep);
  return bad;
}

static int check_outputs(const DuetConfig *cfg, const char *model_path) {
  if (check_init_keep(cfg)) return 1;
  RunInputs r;
  DuetConfig c = *cfg;
  if (!c.eval_only) c.checkpoint_path = NULL; /* read only by --eval-only */
  run_inputs(&c, model_path, &r);
  const char *out[2] = {cfg->save_path, cfg->metrics_path}, *out_flag[2] = {"--save", "--metrics"};
  FileKey ok[2] = {{0}};
  for (int o = 0; o < 2; o++)
    if (out[o] && check_output(&r, out_flag[o], out[o], o == 0 ? cfg->resume_path : NULL, &ok[o])) return 1;
  if (out[0] && out[1] && same_key(&ok[0], &ok[1])) {
    fprintf(stderr, "duet: error: --metrics %s is the same file as --save %s: each output needs its own file\n", out[1],
            out[0]);
    return 1;
  }
  return 0;
}

int duet_check_output(const DuetProgram *p, const DuetConfig *cfg, const char *model_path, const char *flag,
                      const char *path) {
  RunInputs r;
  FileKey k;
  DuetConfig c = cfg ? *cfg : p->defaults;
  run_inputs(&c, model_path, &r);
  return check_output(&r, flag, path, NULL, &k);
}

/* The number of samples of an IDX labels file (its header), or -1. */
static int64_t idx_count(const char *path) {
  gzFile f = gzopen(path, "rb");
  if (!f) return -1;
  unsigned char h[8];
  int got = gzread(f, h, sizeof h);
  gzclose(f);
  if (got != (int)sizeof h || h[0] || h[1] || h[2] != 8 || h[3] != 1) return -1; /* magic 0x00000801 */
  return (int64_t)((uint32_t)h[4] << 24 | (uint32_t)h[5] << 16 | (uint32_t)h[6] << 8 | h[7]);
}

static int npy_plan(const DuetProgram *p, const DuetConfig *cfg, int64_t *n_train, int64_t *n_val, char *err,
                    size_t errlen);

/* The last step of a run as train_images and train_text work it out, from
 * the data files' sizes only; -1 when it cannot be told here (those
 * functions then report why). */
static int64_t planned_total(const DuetProgram *p, const DuetConfig *cfg) {
  if (cfg->steps > 0) return cfg->steps;
  int64_t B = p->defaults.batch, per_epoch;
  if (!cfg->data_path || B < 1) return -1;
  if (cfg->data == DUET_DATA_TEXT || cfg->data == DUET_DATA_TOKENS) {
    struct stat sb;
    if (stat(cfg->data_path, &sb) || !S_ISREG(sb.st_mode) || cfg->block < 1) return -1;
    int64_t n = cfg->data == DUET_DATA_TEXT ? (int64_t)sb.st_size : ((int64_t)sb.st_size - 1024) / 2;
    if (n < 0) return -1;
    per_epoch = n * 9 / 10 / (B * cfg->block);
    if (per_epoch < 1) per_epoch = 1;
  } else if (cfg->data == DUET_DATA_NPY) {
    int64_t n, n_val;
    char err[1024];
    if (npy_plan(p, cfg, &n, &n_val, err, sizeof err)) return -1;
    per_epoch = (cfg->train_subset && cfg->train_subset < n ? cfg->train_subset : n) / B;
  } else {
    char lp[4096];
    snprintf(lp, sizeof lp, "%s/%s", cfg->data_path, idx_files[0][1]);
    int64_t n = idx_count(lp);
    if (n < 0) return -1;
    n -= (int64_t)((double)n * cfg->val_fraction); /* fashion_mnist(..., val_fraction = F) */
    int64_t n_train = cfg->train_subset && cfg->train_subset < n ? cfg->train_subset : n;
    per_epoch = n_train / B;
    if (per_epoch < 1) return -1;
  }
  return cfg->epochs > INT64_MAX / per_epoch ? -1 : cfg->epochs * per_epoch;
}

/* The checks of a run's files that duet_main and duet_preflight both make,
 * before data is loaded or kernels compiled: --save (check_save_path), the
 * outputs against the inputs (check_outputs), and --resume: the checkpoint
 * opens, is whole, belongs to this model and is before the run's last
 * step (duet_checkpoint_check reads its header only).  0, or 1 after
 * printing the error. */
static int check_run_files(const DuetProgram *p, const DuetConfig *cfg, const char *model_path) {
  char err[1024];
  if (cfg->save_path && writes_files_here() && check_save_path(cfg->save_path)) return 1;
  if (check_outputs(cfg, model_path)) return 1;
  int64_t ck_step;
  if ((cfg->eval_only || cfg->init_path) &&
      duet_checkpoint_check_weights(p, cfg->eval_only ? cfg->checkpoint_path : cfg->init_path, &ck_step, err,
                                    sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return 1;
  }
  if (cfg->resume_path) {
    int64_t step, total = planned_total(p, cfg);
    if (duet_checkpoint_check(p, cfg->resume_path, &step, err, sizeof err)) {
      fprintf(stderr, "duet: error: %s\n", err);
      return 1;
    }
    if (total >= 0 && step >= total) {
      fprintf(stderr, "duet: error: the checkpoint is at step %" PRId64 ", not before the last step %" PRId64 "\n",
              step, total);
      return 1;
    }
  }
  return 0;
}

/* The metrics file: a new history, or, resuming from a checkpoint of step
 * `from` (-1: not resuming), the history of the run that wrote it: the
 * lines up to that step are kept, later ones (the run had gone further than
 * its last checkpoint) and an incomplete last line dropped, and the new
 * lines appended.  A file that is not regular (a FIFO, /dev/stdout) is
 * appended to.  NULL after the error. */
static FILE *open_metrics(const DuetConfig *cfg, int64_t from) {
  const char *path = cfg->metrics_path;
  struct stat sb;
  FILE *f;
  if (from < 0 || stat(path, &sb) || !S_ISREG(sb.st_mode)) {
    if (!(f = fopen(path, from < 0 ? "w" : "a")))
      fprintf(stderr, "duet: error: cannot write metrics file %s: %s\n", path, strerror(errno));
    return f;
  }
  size_t n;
  char *text = duet_read_file(path, &n);
  if (!text) {
    fprintf(stderr, "duet: error: cannot read metrics file %s: %s\n", path, strerror(errno));
    return NULL;
  }
  size_t keep = 0, kept = 0, dropped = 0, line = 0;
  bool cut = false;
  for (size_t at = 0; at < n; line++) {
    char *nl = memchr(text + at, '\n', n - at);
    if (!nl) { /* a line cut short by a killed run */
      dropped++;
      break;
    }
    cJSON *o = cJSON_ParseWithLength(text + at, (size_t)(nl - (text + at)));
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "step");
    bool is_obj = cJSON_IsObject(o);
    bool later = cJSON_IsNumber(st) && st->valuedouble > (double)from;
    cJSON_Delete(o);
    if (!is_obj) {
      fprintf(stderr, "duet: error: metrics file %s: line %zu is not a JSON object; not appending to a file duet did "
                      "not write (give another --metrics)\n", path, line + 1);
      free(text);
      return NULL;
    }
    if (later) cut = true;
    if (cut) dropped++;
    else kept++, keep = (size_t)(nl - text) + 1;
    at = (size_t)(nl - text) + 1;
  }
  free(text);
  if (keep < n && truncate(path, (off_t)keep)) {
    fprintf(stderr, "duet: error: cannot truncate metrics file %s after step %" PRId64 ": %s\n", path, from,
            strerror(errno));
    return NULL;
  }
  if (dropped && !cfg->quiet)
    fprintf(stderr, "duet: metrics: %s keeps its %zu line%s up to step %" PRId64 " (the checkpoint's); dropped %zu "
                    "after it\n", path, kept, kept == 1 ? "" : "s", from, dropped);
  if (!(f = fopen(path, "a"))) fprintf(stderr, "duet: error: cannot write metrics file %s: %s\n", path, strerror(errno));
  return f;
}

/* The settings fixed when p was compiled against cfg's flags: the
 * micro-batches (per replica), the replicas, the bucket size.  1 after
 * the error, else 0. */
/* The run's environment, for every program (with or without a pipeline or
 * replicas): the pipeline and data-parallel variables parse (duet_pipe_env:
 * an invalid value is an error even where it would not apply).  1 after
 * the error, else 0. */
static int check_env(const DuetConfig *cfg) {
  char err[1024];
  DuetPipeEnv env;
  if (!duet_pipe_env(&env, cfg->timeout, err, sizeof err)) return 0;
  fprintf(stderr, "duet: error: %s\n", err);
  return 1;
}

static int check_compiled(const DuetProgram *p, const DuetConfig *cfg) {
  if (check_env(cfg)) return 1;
  int R = p->n_stages >= 1 && p->replicas > 1 ? p->replicas : 1;
  int M = p->n_stages >= 1 && p->micro_batches > 0 ? p->micro_batches / R : 1;
  if (cfg->data_parallel && cfg->data_parallel != R) {
    fprintf(stderr, "duet: error: this program was compiled for %d data-parallel replica%s, not %" PRId64
            " (--data-parallel is fixed at compile time: duet compile M.model --data-parallel %" PRId64 ")\n", R,
            R == 1 ? "" : "s", cfg->data_parallel, cfg->data_parallel);
    return 1;
  }
  if (p->n_stages >= 1 && cfg->micro_batches && cfg->micro_batches != M) {
    fprintf(stderr, "duet: error: this program was compiled for %d micro-batch%s%s, not %" PRId64 "\n", M,
            M == 1 ? "" : "es", R > 1 ? " per replica" : "", cfg->micro_batches);
    return 1;
  }
  int z = p->n_stages >= 1 && R > 1 ? p->zero : 0;
  if (cfg->zero && cfg->zero - 1 != z) {
    fprintf(stderr, "duet: error: this program was compiled with --zero %d, not %d (fixed at compile time: duet "
            "compile M.model --data-parallel N --zero %d)\n", z, cfg->zero - 1, cfg->zero - 1);
    return 1;
  }
  /* an evaluation clips nothing: an evaluation program (no gradients, no
   * clipping kernels) of a model whose train section clips evaluates */
  if (cfg->clip_grad_norm > 0 && z && !cfg->eval_only && !p->eval_program) {
    fprintf(stderr, "duet: error: --clip-grad-norm with --zero 1 is not supported yet: each replica holds the summed "
                    "gradients of its own shard only (train without --zero, or without clipping)\n");
    return 1;
  }
  if (cfg->clip_grad_norm > 0 && p->n_clip == 0 && !cfg->eval_only && !p->eval_program) {
    fprintf(stderr, "duet: error: --clip-grad-norm is fixed at compile time: off (this program has no gradient "
                    "clipping kernels; compile it with `duet compile M.model --clip-grad-norm X`, or set "
                    "clip_grad_norm in the train section)\n");
    return 1;
  }
  char oe[400];
  if (duet_offload_check(p, cfg, oe, sizeof oe)) {
    fprintf(stderr, "duet: error: %s\n", oe);
    return 1;
  }
  double want = p->bucket_mb > 0 ? p->bucket_mb : 25.0;
  if (R > 1 && cfg->bucket_mb > 0 && cfg->bucket_mb != want) {
    fprintf(stderr, "duet: error: this program's all-reduce buckets were made for --bucket-mb %g, not %g (fixed at "
            "compile time: duet compile M.model --bucket-mb %g)\n", want, cfg->bucket_mb, cfg->bucket_mb);
    return 1;
  }
  return 0;
}

/* The session of a training run (--loss-scale without loss scaling only
 * warns; duet_main has checked --save and the other files); dist: this
 * rank's replica of an MPI run.  NULL after printing the error. */
static DuetSession *open_session(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg,
                                 DuetDevice **dev, DuetDist *dist) {
  char err[1024];
  DuetSession *s;
  *dev = NULL;
  if ((cfg->loss_scale > 0 || cfg->min_loss_scale > 0) && p->n_unscale == 0 && duet_warns())
    fprintf(stderr, "duet: warning: --loss-scale and --min-loss-scale have no effect: this program has no fp16 loss "
                    "scaling\n");
  if (check_compiled(p, cfg)) return NULL;
  if (p->n_stages >= 1) {
    if (!(s = duet_session_new_ranks(p, kernels, cfg, dist, err, sizeof err))) fprintf(stderr, "duet: error: %s\n", err);
    return s;
  }
  DuetDeviceSpec spec[DUET_MAX_DEVICES];
  int n_spec = 1;
  spec[0] = (DuetDeviceSpec){.kind = DUET_DEV_CPU};
  if (cfg->devices && duet_devices_parse(cfg->devices, spec, DUET_MAX_DEVICES, &n_spec, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return NULL;
  }
  if (n_spec > 1 || cfg->micro_batches > 1) {
    fprintf(stderr, "duet: error: this program was compiled for one device without micro-batches; recompile with "
                    "--devices / --micro-batches\n");
    return NULL;
  }
  if (!(*dev = duet_device_open(&spec[0], p, kernels, cfg->threads, !cfg->quiet, err, sizeof err))) {
    fprintf(stderr, "duet: error: %s\n", err);
    return NULL;
  }
  if (!(s = duet_session_new(p, *dev, cfg, err, sizeof err))) fprintf(stderr, "duet: error: %s\n", err);
  return s;
}

/* "duet: pipeline: ..." after the memory line, for pipelined programs,
 * then "duet: pipeline transfers: ..." (the path between each pair of
 * stages) when tensors cross stages, and "duet: data parallel: ..." for
 * data-parallel ones. */
static void print_pipeline(const DuetProgram *p, const DuetConfig *cfg, const DuetSession *s, DuetDist *dist) {
  if (!cfg->quiet) duet_session_print_allocated(s, stdout);
  if (p->n_stages < 1 || cfg->quiet) return;
  int R = p->replicas > 1 ? p->replicas : 1;
  int S = p->n_stages, Mt = p->micro_batches > 0 ? p->micro_batches : 1, M = Mt / R;
  int64_t xfer = 0;
  for (int t = 0; t < p->n_transfers; t++) xfer += p->transfers[t].nbytes;
  char devs[1024];
  if (S * R == 1) snprintf(devs, sizeof devs, "cpu:0");
  else if (R == 1) snprintf(devs, sizeof devs, "cpu:0..cpu:%d", S - 1);
  else if (S == 1) snprintf(devs, sizeof devs, "each of cpu:0 | .. | cpu:%d", R - 1);
  else snprintf(devs, sizeof devs, "each of cpu:0..cpu:%d | .. | cpu:%d..cpu:%d", S - 1, (R - 1) * S, R * S - 1);
  if (dist) { /* every rank: its own devices */
    DuetDeviceSpec d[DUET_MAX_DEVICES];
    char e[300];
    size_t len = (size_t)snprintf(devs, sizeof devs, "each of the %d MPI ranks:", R);
    if (!duet_pipe_rank_devices(p, cfg->devices, duet_dist_rank(dist), d, e, sizeof e))
      for (int k = 0; k < S && len < sizeof devs; k++)
        len += (size_t)snprintf(devs + len, sizeof devs - len, "%s%s", k ? "," : " ", d[k].name);
  } else if (R > 1 && cfg->devices) { /* the groups: "each of cpu:0,cpu:1 | cpu:2,cpu:3" */
    size_t len = (size_t)snprintf(devs, sizeof devs, "each of ");
    int item = 0;
    for (const char *c = cfg->devices; *c && len + 4 < sizeof devs; c++) {
      if (*c == ',' && ++item % S == 0) len += (size_t)snprintf(devs + len, sizeof devs - len, " | ");
      else devs[len++] = *c, devs[len] = 0;
    }
  }
  printf("duet: pipeline: %d stage%s on %s, %d micro-batch%s of %" PRId64 "%s, %s; bubble (S-1)/(M+S-1) = %.3f%s; "
         "transfers %.2f MiB per micro-batch\n", S, S == 1 ? "" : "s", cfg->devices && R == 1 ? cfg->devices : devs, M,
         M == 1 ? "" : "es", p->defaults.batch / Mt, R > 1 ? " per replica" : "",
         cfg->schedule == DUET_SCHEDULE_1F1B ? "1f1b" : "gpipe", (double)(S - 1) / (double)(M + S - 1),
         M < S ? " (fewer micro-batches than stages: a large bubble)" : "", (double)xfer / 1048576.0);
  const char *paths = duet_session_transfers(s);
  if (paths && *paths) printf("duet: pipeline transfers: %s\n", paths);
  if (R > 1) {
    int64_t grads = 0;
    for (int i = 0; i < p->n_tensors; i++)
      if (p->tensors[i].is_grad) grads += p->tensors[i].nbytes;
    printf("duet: data parallel: %d replicas of %d stage%s, each %d micro-batch%s of the global batch of %" PRId64
           "; %d all-reduce bucket%s (%.2f MiB of gradients, --bucket-mb %g) summed %s\n", R, S, S == 1 ? "" : "s",
           M, M == 1 ? "" : "es", p->defaults.batch, p->n_buckets, p->n_buckets == 1 ? "" : "s",
           (double)grads / 1048576.0, p->bucket_mb > 0 ? p->bucket_mb : 25.0, duet_session_collective(s));
    if (p->zero) { /* the state each replica keeps */
      int64_t all = 0, most = 0, own[DUET_MAX_DEVICES] = {0};
      for (int i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].region == DUET_MEM_STATE) {
          all += p->tensors[i].nbytes;
          int sh = p->tensor_shard[i];
          if (sh >= 0 && sh < DUET_MAX_DEVICES) own[sh] += p->tensors[i].nbytes;
        }
      for (int r = 0; r < R && r < DUET_MAX_DEVICES; r++)
        if (own[r] > most) most = own[r];
      printf("duet: ZeRO stage 1: optimizer state sharded over the %d replicas by whole tensors: at most %.2f MiB per "
             "replica of %.2f MiB (%.1f%%); gradients reduce-scattered, params all-gathered after the update\n", R,
             (double)most / 1048576.0, (double)all / 1048576.0, all > 0 ? 100.0 * (double)most / (double)all : 0.0);
    }
  }
  if (duet_offload_on(cfg)) duet_offload_print(p, s);
  fflush(stdout);
}

/* 1 after the error when images of rows x cols pixels do not fit the
 * model's input x, else 0. */
static int check_pixels(const DuetProgram *p, int rows, int cols) {
  int64_t px = (int64_t)rows * cols, want_px = 1;
  for (int d = 1; d < p->tensors[p->input_x].rank; d++) want_px *= p->tensors[p->input_x].shape[d];
  if (px == want_px) return 0;
  fprintf(stderr, "duet: error: data has %" PRId64 " pixels per image, the model's input takes %" PRId64 "\n", px,
          want_px);
  return 1;
}

/* ------------------------------------------------------------------ npy */

/* npy data: x (inputs) and y (targets) files of as many samples (axis 0),
 * each sample shaped as the input's axes 1.. (duet_npy_match).  Validation:
 * separate files val_x/val_y, or the last floor(n * val_fraction) samples
 * of x/y, or none.  The plan from the headers alone: *n_train and *n_val
 * samples (n_val 0: no validation).  0, or -1 with the message in err: a
 * file's own errors (duet_npy_check), a mismatch with the model, x and y
 * of different sample counts, a split that leaves no validation sample,
 * fewer training samples than one batch. */
static int npy_plan(const DuetProgram *p, const DuetConfig *cfg, int64_t *n_train, int64_t *n_val, char *err,
                    size_t errlen) {
  const char *paths[4] = {cfg->data_path, cfg->data_y, cfg->val_x, cfg->val_y};
  int64_t n[4] = {0};
  for (int k = 0; k < 4; k++) {
    if (!paths[k]) continue;
    DuetNpyInfo info;
    int id = k % 2 ? p->input_y : p->input_x;
    if (duet_npy_check(paths[k], &info, err, errlen) ||
        duet_npy_match(&info, paths[k], &p->tensors[id], p->tensors[id].name, err, errlen))
      return -1;
    n[k] = info.shape[0];
  }
  for (int k = 0; k < 4; k += 2)
    if (paths[k] && n[k] != n[k + 1]) {
      snprintf(err, errlen, "%s holds %" PRId64 " samples but %s holds %" PRId64, paths[k], n[k], paths[k + 1],
               n[k + 1]);
      return -1;
    }
  *n_train = n[0];
  *n_val = n[2];
  if (cfg->val_x && n[2] < 1) {
    snprintf(err, errlen, "%s holds no samples", cfg->val_x);
    return -1;
  }
  if (cfg->val_fraction > 0) {
    *n_val = (int64_t)((double)n[0] * cfg->val_fraction);
    if (*n_val < 1) {
      snprintf(err, errlen, "val_fraction %g of the %" PRId64 " samples of %s leaves no validation sample",
               cfg->val_fraction, n[0], cfg->data_path);
      return -1;
    }
    *n_train = n[0] - *n_val;
  }
  int64_t used = cfg->train_subset && cfg->train_subset < *n_train ? cfg->train_subset : *n_train;
  if (used < p->defaults.batch) {
    snprintf(err, errlen, "%s: %" PRId64 " training samples are fewer than one batch of %" PRId64, cfg->data_path,
             used, p->defaults.batch);
    return -1;
  }
  return 0;
}

/* Loads npy data as npy_plan plans it (train: the training samples, val:
 * the validation ones, empty when there are none) and checks the labels of
 * an i32[batch] y against the model's classes.  0, or -1 with the message. */
static int npy_load_sets(const DuetProgram *p, const DuetConfig *cfg, DuetDataset *train, DuetDataset *val, char *err,
                         size_t errlen) {
  int64_t n_train, n_val;
  if (npy_plan(p, cfg, &n_train, &n_val, err, errlen)) return -1;
  const DuetTensor *tx = &p->tensors[p->input_x], *ty = &p->tensors[p->input_y];
  int64_t ex = 1, ey = 1;
  for (int d = 1; d < tx->rank; d++) ex *= tx->shape[d];
  for (int d = 1; d < ty->rank; d++) ey *= ty->shape[d];
  DuetDataset *sets[2] = {train, val};
  const char *px[2] = {cfg->data_path, cfg->val_x}, *py[2] = {cfg->data_y, cfg->val_y};
  for (int k = 0; k < 2; k++) {
    *sets[k] = (DuetDataset){.x_elems = ex, .y_elems = ey};
    if (!px[k]) continue;
    int64_t nx, ny;
    if (duet_npy_load(px[k], tx, tx->name, &nx, &sets[k]->x, err, errlen) ||
        duet_npy_load(py[k], ty, ty->name, &ny, &sets[k]->y, err, errlen))
      return -1;
    sets[k]->n = nx;
  }
  if (cfg->val_fraction > 0) { /* the last n_val samples validate */
    val->n = n_val;
    val->x = malloc((size_t)(n_val * ex) * 4);
    val->y = malloc((size_t)(n_val * ey) * 4);
    if (!val->x || !val->y) {
      snprintf(err, errlen, "out of host memory loading %s", cfg->data_path);
      return -1;
    }
    memcpy(val->x, (char *)train->x + (size_t)(n_train * ex) * 4, (size_t)(n_val * ex) * 4);
    memcpy(val->y, (char *)train->y + (size_t)(n_train * ey) * 4, (size_t)(n_val * ey) * 4);
    train->n = n_train;
  }
  /* i32 labels against the classes, i32 inputs against the embedding rows */
  for (int k = 0; k < 2; k++)
    for (int w = 0; w < 2; w++) {
      const DuetTensor *t = w ? ty : tx;
      int limit = w ? p->n_classes : p->vocab;
      int64_t e = w ? ey : ex;
      if (t->dtype != DUET_I32 || limit <= 0) continue;
      const int32_t *v = w ? sets[k]->y : sets[k]->x;
      for (int64_t i = 0; i < sets[k]->n * e; i++)
        if (v[i] < 0 || v[i] >= limit) {
          const char *file = k == 0 ? (w ? cfg->data_y : cfg->data_path)
                                    : (w ? (cfg->val_y ? cfg->val_y : cfg->data_y)
                                         : (cfg->val_x ? cfg->val_x : cfg->data_path));
          snprintf(err, errlen, "%s: %s %d of sample %" PRId64 " is outside the model's %d %s", file,
                   w ? "label" : "index", v[i], i / e + (k == 1 && cfg->val_fraction > 0 ? n_train : 0), limit,
                   w ? "classes" : "embedding rows");
          return -1;
        }
    }
  return 0;
}

static int train_images(const DuetProgram *p, const DuetKernelFn *kernels, DuetConfig cfg, DuetDist *dist) {
  int rc;
  char err[1024];
  DuetDataset train = {0}, test = {0};
  char ip[1024], lp[1024];
  bool npy = cfg.data == DUET_DATA_NPY;
  const char *split = npy ? "validation" : "test";
  if (npy) {
    if (npy_load_sets(p, &cfg, &train, &test, err, sizeof err)) {
      fprintf(stderr, "duet: error: %s\n", err);
      duet_dataset_free(&train);
      duet_dataset_free(&test);
      return 1;
    }
    if (!test.n) cfg.eval = 0; /* no validation set */
  } else {
  snprintf(ip, sizeof ip, "%s/%s", cfg.data_path, idx_files[0][0]);
  snprintf(lp, sizeof lp, "%s/%s", cfg.data_path, idx_files[0][1]);
  if (duet_load_idx(&train, ip, lp, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return 1;
  }
  }
  if (!npy && cfg.eval) {
    snprintf(ip, sizeof ip, "%s/%s", cfg.data_path, idx_files[1][0]);
    snprintf(lp, sizeof lp, "%s/%s", cfg.data_path, idx_files[1][1]);
    if (duet_load_idx(&test, ip, lp, err, sizeof err)) {
      fprintf(stderr, "duet: error: %s\n", err);
      duet_dataset_free(&train);
      return 1;
    }
  }
  rc = 1;
  DuetDevice *dev = NULL;
  DuetSession *s = NULL;
  FILE *mf = NULL;
  int64_t *perm = NULL;
  StopHandlers stops = {0};
  DuetProgress pg = {0};
  DuetDataset val = {0}; /* fashion_mnist(..., val_fraction = F): the last F of the training set */
  bool fm_val = !npy && cfg.val_fraction > 0;
  if (fm_val && split_validation(&train, cfg.val_fraction, &val)) goto out;
  if (fm_val) split = "validation";
  if (!npy && check_pixels(p, train.rows, train.cols)) goto out;
  if (!npy && p->n_classes &&
      (check_labels(&train, p->n_classes, "training") || check_labels(&test, p->n_classes, "test") ||
       check_labels(&val, p->n_classes, "validation")))
    goto out;
  int64_t n_train = cfg.train_subset && cfg.train_subset < train.n ? cfg.train_subset : train.n;
  int64_t n_test = cfg.test_subset && cfg.test_subset < test.n ? cfg.test_subset : test.n;
  if (cfg.train_subset > train.n && duet_warns())
    fprintf(stderr, "duet: warning: --train-subset %" PRId64 " exceeds the %" PRId64 " training samples; using all\n",
            cfg.train_subset, train.n);
  if (test.n > 0 && cfg.test_subset > test.n && duet_warns()) /* test.n 0: --no-eval loads no test set */
    fprintf(stderr, "duet: warning: --test-subset %" PRId64 " exceeds the %" PRId64 " test samples; using all\n",
            cfg.test_subset, test.n);
  int64_t B = p->defaults.batch;
  int64_t per_epoch = n_train / B;
  if (per_epoch < 1) {
    fprintf(stderr, "duet: error: batch %" PRId64 " is larger than the %" PRId64 " training samples\n", B, n_train);
    goto out;
  }
  if (cfg.steps <= 0 && cfg.epochs > INT64_MAX / per_epoch) {
    fprintf(stderr, "duet: error: %" PRId64 " epochs of %" PRId64 " steps overflow the step counter\n", cfg.epochs,
            per_epoch);
    goto out;
  }
  int64_t total = cfg.steps > 0 ? cfg.steps : cfg.epochs * per_epoch;
  if (check_schedule(&cfg, total) || !(s = open_session(p, kernels, &cfg, &dev, dist))) goto out;
  duet_session_set_total(s, total);
  int64_t n_params = 0;
  for (int i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].region == DUET_MEM_PARAM) {
      int64_t e = 1;
      for (int d = 0; d < p->tensors[i].rank; d++) e *= p->tensors[i].shape[d];
      n_params += e;
    }
  if (!cfg.quiet) {
    printf("duet: %s: %" PRId64 " parameters, %s lr %g, batch %" PRId64 ", %" PRId64 " steps (%" PRId64
           " per epoch), seed %" PRIu64 "\n",
           p->model_name, n_params, cfg.optimizer == DUET_OPTIM_SGD ? "sgd" : "adamw", cfg.lr, B, total, per_epoch,
           cfg.seed);
    printf("duet: memory: params %.1f MiB, optimizer state %.1f MiB%s, activations %.1f MiB (planned)\n",
           (double)p->region_bytes[DUET_MEM_PARAM] / 1048576.0, (double)p->region_bytes[DUET_MEM_STATE] / 1048576.0,
           duet_offload_on(&cfg) ? " (host)" : "", (double)p->region_bytes[DUET_MEM_ARENA] / 1048576.0);
    fflush(stdout);
  }
  print_setup(p, &cfg, total, dist);
  print_pipeline(p, &cfg, s, dist);
  print_schedule(&cfg, total);
  perm = malloc((size_t)n_train * sizeof *perm);
  if (!perm) {
    fprintf(stderr, "duet: error: out of host memory\n");
    goto out;
  }
  DuetTrainState ts = {.step = 0, .epoch = 1, .batch = 0};
  if (maybe_resume(s, &cfg, &ts) || maybe_init(s, &cfg)) goto out;
  if (ts.step >= total) {
    fprintf(stderr, "duet: error: the checkpoint is at step %" PRId64 ", not before the last step %" PRId64 "\n",
            ts.step, total);
    goto out;
  }
  if (cfg.metrics_path && !(mf = open_metrics(&cfg, cfg.resume_path ? ts.step : -1))) goto out;
  Run run;
  run_init(&run, p, &cfg, s);
  run.dist = dist;
  run.first_step = ts.step;
  run.total = total;
  keep_best_resume(&run);
  prune_check_schedule(&run);
  DuetTrainState cur = ts;
  stop_handlers_install(&stops);
  double t_log = now_seconds(), t_start = t_log, t_eval = 0;
  int64_t since_log = 0, first_step = ts.step;
  duet_progress_start(&pg, stdout, cfg.quiet, ts.step, total);
  EvalResult last = {0};
  int evaluated = 0;
  for (int64_t step = ts.step, epoch = ts.epoch; step < total; epoch++) {
    DuetRng r;
    duet_rng_seed(&r, cfg.seed, 0x5348554646ull + (uint64_t)epoch); /* Fisher-Yates shuffle per epoch */
    for (int64_t i = 0; i < n_train; i++) perm[i] = i;
    for (int64_t i = n_train - 1; i > 0; i--) {
      int64_t j = (int64_t)(duet_rng_next(&r) % (uint64_t)(i + 1));
      int64_t t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    for (int64_t b = epoch == ts.epoch ? ts.batch : 0; b < per_epoch && step < total; b++) {
      if (fill_batch(s, p, &train, perm + b * B, B, B)) {
        fprintf(stderr, "duet: error: %s\n", duet_session_error(s));
        goto out;
      }
      double loss;
      if (prune_before(&run, step, mf) || train_step(&run, ++step, &loss)) goto out;
      since_log++;
      bool logged = step % cfg.log_every == 0 || step == total;
      if (logged) {
        double t = now_seconds();
        duet_progress_clear(&pg);
        if (!cfg.quiet)
          printf("epoch %" PRId64 " step %" PRId64 "/%" PRId64 " | loss %.6f%s | %.0f samples/s%s\n", epoch, step,
                 total, loss, rate_note(s, (char[96]){0}, 96), (double)(since_log * B) / (t - t_log),
                 scale_note(s, p, (char[64]){0}, 64));
        fflush(stdout);
        if (log_loss(mf, s, step, loss, "samples_per_s", (double)(since_log * B) / (t - t_log))) goto out;
        t_log = now_seconds();
        since_log = 0;
      }
      train_progress(&pg, epoch, step, loss, B, "samples", logged && pg.mode == DUET_PROGRESS_BAR);
      cur = (DuetTrainState){.step = step, .epoch = b + 1 < per_epoch ? epoch : epoch + 1,
                             .batch = b + 1 < per_epoch ? b + 1 : 0};
      if (maybe_save(&run, &cur, false)) goto out;
      if ((rc = check_stop(&run, &cur))) goto out;
      rc = 1;
    }
    bool epoch_done = step % per_epoch == 0 || step == total;
    if (cfg.eval && epoch_done && p->metrics >= 0) {
      double te = now_seconds();
      duet_progress_clear(&pg);
      if (evaluate_shown(s, p, fm_val ? &val : &test, fm_val ? val.n : n_test, B, &last, !cfg.quiet)) {
        fprintf(stderr, "duet: error: evaluation: %s\n", duet_session_error(s));
        goto out;
      }
      evaluated = 1;
      if (!isfinite(last.loss)) {
        fprintf(stderr, "duet: error: %s loss is %s after epoch %" PRId64 ": training diverged (check --lr and "
                        "--weight-decay)\n", split, isnan(last.loss) ? "NaN" : "infinite", epoch);
        goto out;
      }
      if (!cfg.quiet)
        printf("epoch %" PRId64 " | %s accuracy %.2f%% (%" PRId64 "/%" PRId64 ") | %s loss %.4f\n", epoch, split,
               100.0 * (double)last.correct / (double)last.n, last.correct, last.n, split, last.loss);
      fflush(stdout);
      if (mf) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "step", (double)step);
        cJSON_AddNumberToObject(o, "epoch", (double)epoch);
        cJSON_AddNumberToObject(o, npy || fm_val ? "val_accuracy" : "test_accuracy",
                                (double)last.correct / (double)last.n);
        cJSON_AddNumberToObject(o, npy || fm_val ? "val_loss" : "test_loss", last.loss);
        if (metrics_write(mf, o)) goto out;
      }
      if (keep_best(&run, &cur, (double)last.correct / (double)last.n, last.loss)) goto out;
      double dt = now_seconds() - te;
      t_eval += dt;
      t_log += dt;
      if ((rc = check_stop(&run, &cur))) goto out;
      rc = 1;
    }
  }
  duet_progress_clear(&pg);
  if (p->prune && prune_report(&run, total, 0, NULL, true)) goto out;
  double elapsed = now_seconds() - t_start - t_eval;
  if (fm_val && evaluated) { /* the test split, once, at the end */
    if (evaluate_shown(s, p, &test, n_test, B, &last, !cfg.quiet)) {
      fprintf(stderr, "duet: error: evaluation: %s\n", duet_session_error(s));
      goto out;
    }
    split = "test";
    if (!cfg.quiet)
      printf("final | test accuracy %.2f%% (%" PRId64 "/%" PRId64 ") | test loss %.4f\n",
             100.0 * (double)last.correct / (double)last.n, last.correct, last.n, last.loss);
    if (mf) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddNumberToObject(o, "step", (double)total);
      cJSON_AddNumberToObject(o, "test_accuracy", (double)last.correct / (double)last.n);
      cJSON_AddNumberToObject(o, "test_loss", last.loss);
      cJSON_AddTrueToObject(o, "final");
      if (metrics_write(mf, o)) goto out;
    }
  }
  if (!dist || duet_dist_rank(dist) == 0) { /* rank 0 alone reports */
    printf("duet: trained %" PRId64 " step%s in %.1f s (%.0f samples/s)", total - first_step,
           total - first_step == 1 ? "" : "s", elapsed,
           (double)((total - first_step) * B) / elapsed);
    if (evaluated)
      printf("; %s accuracy %.2f%%", split, 100.0 * (double)last.correct / (double)last.n);
    printf("\n");
  }
  rc = 0;
out:
  if (pg.out) duet_progress_clear(&pg);
  stop_handlers_restore(&stops);
  if (mf && fclose(mf)) {
    fprintf(stderr, "duet: error: writing metrics file %s failed\n", cfg.metrics_path);
    rc = 1;
  }
  free(perm);
  duet_session_free(s);
  if (dev) dev->ops->destroy(dev);
  duet_dataset_free(&train);
  duet_dataset_free(&test);
  duet_dataset_free(&val);
  return rc;
}

/* ----------------------------------------------------------------- text */

/* Byte-level language modelling on one text file: tokens are bytes (vocab
 * 256), the first 90% of the file trains and the last 10% validates.  A
 * training batch is `batch` windows of block+1 bytes at uniformly random
 * offsets (the generator is seeded from --seed, so a run is reproducible);
 * x = window[0:block], y = window[1:block+1].  The validation loss is the
 * mean next-byte NLL (nats per byte) over eval_batches fixed batches whose
 * offsets come from a generator with a constant seed, the same for every
 * run and every --seed. */
typedef struct TextData {
  unsigned char *bytes;
  uint16_t *tokens;   /* tokens(...) data: the ids (bytes NULL) */
  int64_t n, n_train; /* train: [0, n_train), validation: [n_train, n) */
} TextData;

/* The check that a text of n bytes (unit "bytes") or a token file of n
 * tokens has a window of block + 1 in both its 90% and its 10% split. */
static int text_too_short_unit(const char *path, int64_t n, int64_t block, const char *unit, char *err,
                               size_t errlen) {
  int64_t n_train = n * 9 / 10;
  if (n_train >= block + 2 && n - n_train >= block + 2) return 0;
  snprintf(err, errlen, "%s has %" PRId64 " %s: too short for windows of %" PRId64 " %s in both the 90%% "
           "training and the 10%% validation split", path, n, unit, block + 1, unit);
  return -1;
}

/* The message for a text file that did not open (errno: why) or read
 * (EIO, ENOMEM). */
static void text_open_error(const char *path, int e, char *err, size_t errlen) {
  if (e == EIO || e == ENOMEM) snprintf(err, errlen, "cannot read %s", path);
  else snprintf(err, errlen, "cannot open %s: %s (make data builds data/kjv.txt from Debian's bible-kjv)", path,
                strerror(e));
}

/* -1 with the message when a text of n bytes is too short for one window
 * of block+1 bytes in the training (first 90%) or validation split. */
static int text_too_short(const char *path, int64_t n, int64_t block, char *err, size_t errlen) {
  return text_too_short_unit(path, n, block, "bytes", err, errlen);
}

/* The ids a tokens model takes: below its embedding's rows (vocab) and its
 * cross_entropy's classes, whichever are known and smaller (uint16's range
 * when neither is). */
static int token_limit(const DuetProgram *p) {
  int v = 65536;
  if (p->vocab > 0 && p->vocab < v) v = p->vocab;
  if (p->n_classes > 0 && p->n_classes < v) v = p->n_classes;
  return v;
}

/* tokens("FILE", block = T): an llm.c token file (duet_load_tokens), its ids
 * checked against the model's vocabulary (token_limit), then split and
 * windowed as text is. */
static int load_tokens(TextData *td, const char *path, int64_t block, int vocab, char *err, size_t errlen) {
  memset(td, 0, sizeof *td);
  if (duet_load_tokens(path, vocab, &td->tokens, &td->n, err, errlen)) return -1;
  td->n_train = td->n * 9 / 10;
  if (text_too_short_unit(path, td->n, block, "tokens", err, errlen)) {
    free(td->tokens);
    td->tokens = NULL;
    return -1;
  }
  return 0;
}

static int load_text(TextData *td, const char *path, int64_t block, char *err, size_t errlen) {
  memset(td, 0, sizeof *td);
  size_t n;
  unsigned char *b = duet_read_file(path, &n);
  if (!b) {
    text_open_error(path, errno, err, errlen);
    return -1;
  }
  td->bytes = b;
  td->n = (int64_t)n;
  td->n_train = td->n * 9 / 10;
  if (text_too_short(path, td->n, block, err, errlen)) {
    free(b);
    td->bytes = NULL;
    return -1;
  }
  return 0;
}

/* Fills x and y (i32 [batch, block]) with windows at offsets drawn from r
 * in [lo, hi - block - 1], on the host, then writes them to the device.
 * 0, or -1 with a message in duet_session_error. */
static int text_batch(DuetSession *s, const DuetProgram *p, const TextData *td, DuetRng *r, int64_t lo, int64_t hi,
                      int64_t batch, int64_t block) {
  size_t n = (size_t)(batch * block);
  int32_t *x = duet_session_staging(s, 2 * n * sizeof *x), *y = x ? x + n : NULL;
  if (!x) return -1;
  uint64_t span = (uint64_t)(hi - lo - block - 1) + 1;
  for (int64_t b = 0; b < batch; b++) {
    int64_t off = lo + (int64_t)(duet_rng_next(r) % span);
    for (int64_t t = 0; t < block; t++) {
      x[b * block + t] = td->tokens ? td->tokens[off + t] : td->bytes[off + t];
      y[b * block + t] = td->tokens ? td->tokens[off + t + 1] : td->bytes[off + t + 1];
    }
  }
  return duet_session_write(s, p->input_x, 0, x, n * sizeof *x) || duet_session_write(s, p->input_y, 0, y, n * sizeof *y)
             ? -1
             : 0;
}

/* The mean validation loss over eval_batches fixed batches, with progress
 * (progress.h) unless show is false. */
static int text_validate_shown(DuetSession *s, const DuetProgram *p, const TextData *td, const DuetConfig *cfg,
                               double *val, bool show) {
  DuetRng r;
  duet_rng_seed(&r, 0x76616c6964ull, 0); /* fixed validation windows */
  int64_t B = p->defaults.batch, T = cfg->block;
  double nll = 0;
  DuetProgress pg;
  duet_progress_start(&pg, stdout, !show, 0, cfg->eval_batches);
  duet_session_set_valid(s, B * T);
  for (int64_t i = 0; i < cfg->eval_batches; i++) {
    double l;
    eval_progress(&pg, i);
    if (text_batch(s, p, td, &r, td->n_train, td->n, B, T) || duet_session_run(s, DUET_RUN_EVAL) ||
        read_scalar(s, p, p->metrics, 1, &l)) {
      duet_progress_clear(&pg);
      return -1;
    }
    nll += l / (double)(B * T);
  }
  duet_progress_clear(&pg);
  *val = nll / (double)cfg->eval_batches;
  return 0;
}

/* 1 after the error when the embedding that byte-level text indexes has
 * fewer than 256 rows (p->vocab; 0: none known), else 0. */
static int text_vocab_error(const DuetProgram *p) {
  if (p->vocab <= 0 || p->vocab >= 256) return 0;
  fprintf(stderr, "duet: error: byte-level text needs an embedding of 256 rows (one per byte value), the model's has "
          "%d\n", p->vocab);
  return 1;
}

static int train_text(const DuetProgram *p, const DuetKernelFn *kernels, DuetConfig cfg, DuetDist *dist) {
  char err[1024];
  TextData td;
  if (p->input_x < 0 || p->input_y < 0 || p->metrics < 0) {
    fprintf(stderr, "duet: error: text data needs two i32[batch, block] inputs and a cross_entropy loss\n");
    return 1;
  }
  bool toks = cfg.data == DUET_DATA_TOKENS;
  if (toks ? load_tokens(&td, cfg.data_path, cfg.block, token_limit(p), err, sizeof err)
           : load_text(&td, cfg.data_path, cfg.block, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return 1;
  }
  int rc = 1;
  DuetDevice *dev = NULL;
  DuetSession *s = NULL;
  FILE *mf = NULL;
  StopHandlers stops = {0};
  DuetProgress pg = {0};
  int64_t B = p->defaults.batch, T = cfg.block;
  if (!toks && p->n_classes < 256) {
    fprintf(stderr, "duet: error: byte-level text needs 256 classes, the model's logits have %d\n", p->n_classes);
    goto out;
  }
  if (!toks && text_vocab_error(p)) goto out;
  int64_t per_epoch = td.n_train / (B * T);
  if (per_epoch < 1) per_epoch = 1;
  if (cfg.steps <= 0 && cfg.epochs > INT64_MAX / per_epoch) {
    fprintf(stderr, "duet: error: %" PRId64 " epochs of %" PRId64 " steps overflow the step counter\n", cfg.epochs,
            per_epoch);
    goto out;
  }
  int64_t total = cfg.steps > 0 ? cfg.steps : cfg.epochs * per_epoch;
  if (check_schedule(&cfg, total) || !(s = open_session(p, kernels, &cfg, &dev, dist))) goto out;
  duet_session_set_total(s, total);
  if (!cfg.quiet) {
    int64_t n_params = 0;
    for (int i = 0; i < p->n_tensors; i++)
      if (p->tensors[i].region == DUET_MEM_PARAM) n_params += p->tensors[i].nbytes / (p->tensors[i].dtype == DUET_F64 ? 8 : 4);
    printf("duet: %s: %" PRId64 " parameters, %s lr %g, batch %" PRId64 " x %" PRId64 " tokens, %" PRId64
           " steps, %s %s (%" PRId64 " %s: %" PRId64 " train, %" PRId64 " validation)\n",
           p->model_name, n_params, cfg.optimizer == DUET_OPTIM_SGD ? "sgd" : "adamw", cfg.lr, B, T, total,
           toks ? "tokens" : "text", cfg.data_path, td.n, toks ? "tokens" : "bytes", td.n_train, td.n - td.n_train);
    printf("duet: memory: params %.1f MiB, optimizer state %.1f MiB%s, activations %.1f MiB (planned)\n",
           (double)p->region_bytes[DUET_MEM_PARAM] / 1048576.0, (double)p->region_bytes[DUET_MEM_STATE] / 1048576.0,
           duet_offload_on(&cfg) ? " (host)" : "", (double)p->region_bytes[DUET_MEM_ARENA] / 1048576.0);
    fflush(stdout);
  }
  print_setup(p, &cfg, total, dist);
  print_pipeline(p, &cfg, s, dist);
  print_schedule(&cfg, total);
  DuetTrainState ts = {0};
  duet_rng_seed(&ts.rng, cfg.seed, 0x74657874ull); /* "text" */
  if (maybe_resume(s, &cfg, &ts) || maybe_init(s, &cfg)) goto out;
  if (ts.step >= total) {
    fprintf(stderr, "duet: error: the checkpoint is at step %" PRId64 ", not before the last step %" PRId64 "\n",
            ts.step, total);
    goto out;
  }
  if (cfg.metrics_path && !(mf = open_metrics(&cfg, cfg.resume_path ? ts.step : -1))) goto out;
  Run run;
  run_init(&run, p, &cfg, s);
  run.dist = dist;
  run.first_step = ts.step;
  run.total = total;
  keep_best_resume(&run);
  prune_check_schedule(&run);
  stop_handlers_install(&stops);
  double t_log = now_seconds(), t_start = t_log, t_eval = 0, val = NAN;
  int64_t since_log = 0, first_step = ts.step;
  duet_progress_start(&pg, stdout, cfg.quiet, ts.step, total);
  for (int64_t step = ts.step + 1; step <= total; step++) {
    if (text_batch(s, p, &td, &ts.rng, 0, td.n_train, B, T)) {
      fprintf(stderr, "duet: error: %s\n", duet_session_error(s));
      goto out;
    }
    double loss;
    if (prune_before(&run, step - 1, mf) || train_step(&run, step, &loss)) goto out;
    since_log++;
    bool logged = step % cfg.log_every == 0 || step == total;
    if (logged) {
      double t = now_seconds();
      duet_progress_clear(&pg);
      if (!cfg.quiet)
        printf("step %" PRId64 "/%" PRId64 " | loss %.6f%s | %.0f tokens/s%s\n", step, total, loss,
               rate_note(s, (char[96]){0}, 96), (double)(since_log * B * T) / (t - t_log),
               scale_note(s, p, (char[64]){0}, 64));
      fflush(stdout);
      if (log_loss(mf, s, step, loss, "tokens_per_s", (double)(since_log * B * T) / (t - t_log))) goto out;
      t_log = now_seconds();
      since_log = 0;
    }
    train_progress(&pg, 0, step, loss, B * T, "tokens", logged && pg.mode == DUET_PROGRESS_BAR);
    if (cfg.eval && ((cfg.eval_every > 0 && step % cfg.eval_every == 0) || step == total)) {
      double te = now_seconds();
      duet_progress_clear(&pg);
      if (text_validate_shown(s, p, &td, &cfg, &val, !cfg.quiet)) {
        fprintf(stderr, "duet: error: validation: %s\n", duet_session_error(s));
        goto out;
      }
      if (!isfinite(val)) {
        fprintf(stderr, "duet: error: validation loss is %s at step %" PRId64 ": training diverged\n",
                isnan(val) ? "NaN" : "infinite", step);
        goto out;
      }
      if (!cfg.quiet)
        printf("step %" PRId64 " | val loss %.4f nats/%s (%" PRId64 " batches)\n", step, val,
               toks ? "token" : "byte", cfg.eval_batches);
      fflush(stdout);
      if (mf) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "step", (double)step);
        cJSON_AddNumberToObject(o, "val_loss", val);
        if (metrics_write(mf, o)) goto out;
      }
      ts.step = step;
      if (keep_best(&run, &ts, -val, val)) goto out;
      double dt = now_seconds() - te;
      t_eval += dt;
      t_log += dt;
    }
    ts.step = step;
    if (maybe_save(&run, &ts, false)) goto out;
    if ((rc = check_stop(&run, &ts))) goto out;
    rc = 1;
  }
  duet_progress_clear(&pg);
  if (p->prune && prune_report(&run, total, 0, NULL, true)) goto out;
  double elapsed = now_seconds() - t_start - t_eval;
  if (!dist || duet_dist_rank(dist) == 0) { /* rank 0 alone reports */
    printf("duet: trained %" PRId64 " step%s in %.1f s (%.0f tokens/s)", total - first_step,
           total - first_step == 1 ? "" : "s", elapsed,
           (double)((total - first_step) * B * T) / elapsed);
    if (!isnan(val)) printf("; val loss %.4f nats/%s", val, toks ? "token" : "byte");
    printf("\n");
  }
  rc = 0;
out:
  if (pg.out) duet_progress_clear(&pg);
  stop_handlers_restore(&stops);
  if (mf && fclose(mf)) {
    fprintf(stderr, "duet: error: writing metrics file %s failed\n", cfg.metrics_path);
    rc = 1;
  }
  duet_session_free(s);
  if (dev) dev->ops->destroy(dev);
  free(td.bytes);
  free(td.tokens);
  return rc;
}

/* 1 after the error when an image model has no data source (no data =, or
 * no x/y inputs), else 0. */
static int no_data_source(const DuetProgram *p, const DuetConfig *cfg) {
  if ((cfg->data == DUET_DATA_FASHION_MNIST || cfg->data == DUET_DATA_NPY) && p->input_x >= 0 && p->input_y >= 0)
    return 0;
  fprintf(stderr, "duet: error: model `%s` has no data source: add `data = fashion_mnist(\"DIR\")`, "
                  "`data = text(\"FILE\", block = T)` or `data = npy(\"X.npy\", \"Y.npy\")` to its train section\n",
          p->model_name);
  return 1;
}

/* ------------------------------------------------------------ MPI ranks */

/* Under an MPI launcher with several ranks (duet_launch_ranks): the
 * program must have a replica per rank, and the ranks but 0 neither print
 * progress nor write metrics or checkpoints (rank 0 does).  Returns the
 * number of ranks (1: an ordinary run), or -1 after the error. */
static int rank_view(const DuetProgram *p, DuetConfig *cfg) {
  int rank;
  char var[400];
  int ranks = duet_launch_ranks(&rank, var, sizeof var);
  if (ranks < 0) {
    fprintf(stderr, "duet: error: %s\n", var);
    return -1;
  }
  if (ranks == 1) return 1;
  int R = p->n_stages >= 1 && p->replicas > 1 ? p->replicas : 1;
  if (R != ranks) {
    fprintf(stderr, "duet: error: this program was compiled for %d data-parallel replica%s and the MPI launcher "
            "started %d ranks (%s; each rank is one replica: duet compile M.model --data-parallel %d, or mpirun -np "
            "%d)\n", R, R == 1 ? "" : "s", ranks, var, ranks, R);
    return -1;
  }
  if (rank > 0) {
    cfg->quiet = 1;
    cfg->metrics_path = NULL;
    if (!p->zero) { /* ZeRO: it sends its shard of the state to rank 0 when rank 0 saves (maybe_save) */
      cfg->save_path = NULL;
      cfg->save_every = 0;
    }
  }
  return ranks;
}

/* The bytes of the run's data files (the text; the four IDX files), for
 * the ranks' comparison; 0 when none can be read. */
static uint64_t data_bytes(const DuetConfig *cfg) {
  struct stat sb;
  if (!cfg->data_path) return 0;
  if (cfg->data == DUET_DATA_TEXT || cfg->data == DUET_DATA_TOKENS)
    return stat(cfg->data_path, &sb) ? 0 : (uint64_t)sb.st_size;
  uint64_t n = 0;
  if (cfg->data == DUET_DATA_NPY) {
    const char *np[4] = {cfg->data_path, cfg->data_y, cfg->val_x, cfg->val_y};
    for (int k = 0; k < 4; k++) n = n * 1000003u + (np[k] && !stat(np[k], &sb) ? (uint64_t)sb.st_size : 0);
    return n;
  }
  for (int k = 0; k < 4; k++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", cfg->data_path, idx_files[k / 2][k % 2]);
    n = n * 1000003u + (stat(path, &sb) ? 0 : (uint64_t)sb.st_size);
  }
  return n;
}

/* This process as one rank of an MPI run: MPI loaded and started, the
 * ranks' programs and settings compared, then training; an error of this
 * rank (printed) ends every rank through MPI_Abort. */
static int train_rank(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg, bool text) {
  char err[2048];
  DuetDist *d = duet_dist_open(cfg->timeout, &stop_signal, err, sizeof err);
  if (!d) {
    fprintf(stderr, "duet: error: %s\n", err);
    return 1;
  }
  int bad;
  if (duet_dist_check_ranks(d, p, cfg, data_bytes(cfg), &bad, err, sizeof err)) {
    if (bad < 0) {
      fprintf(stderr, "duet: error: comparing the ranks' settings: %s\n", err);
      duet_dist_abort(d, 1);
    }
    /* every rank found it: rank 0 and the rank that differs say so */
    if (duet_dist_rank(d) == 0 || duet_dist_rank(d) == bad) fprintf(stderr, "duet: error: %s\n", err);
    duet_dist_close(d);
    return 1;
  }
  int rc = text ? train_text(p, kernels, *cfg, d) : train_images(p, kernels, *cfg, d);
  if (rc != 0 && rc < 128) duet_dist_abort(d, rc); /* the error is printed: the launcher ends every rank */
  duet_dist_close(d);
  return rc;
}

/* ------------------------------------------------ checkpoints to keep */

/* --keep N (N >= 2), before a save to PATH: PATH, when it is a duet
 * checkpoint, is kept as PATH.step-S (S its step) by a hard link, so that
 * the save's rename over PATH leaves the old file under that name (a
 * file system without hard links: renamed).  Best effort: a warning. */
static void keep_before_save(const DuetConfig *cfg) {
  if (cfg->keep < 2) return;
  char e[512], old[4200];
  DuetStFile *f = duet_st_open_header(cfg->save_path, e, sizeof e);
  if (!f) return; /* nothing (readable) to keep */
  const char *st = duet_st_meta(f, "step"), *fmt = duet_st_meta(f, "format");
  bool ok = st && fmt && !strncmp(fmt, "duet-checkpoint", 15) && strspn(st, "0123456789") == strlen(st) && *st;
  if (ok) snprintf(old, sizeof old, "%s.step-%s", cfg->save_path, st);
  duet_st_close(f);
  if (!ok) return;
  if (link(cfg->save_path, old) && errno != EEXIST && rename(cfg->save_path, old) && !cfg->quiet)
    fprintf(stderr, "duet: warning: --keep: cannot keep %s as %s: %s\n", cfg->save_path, old, strerror(errno));
}

static int cmp_desc_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* --keep N, after a save of step `step` to PATH: of the files PATH.step-S
 * in PATH's directory with S < step, the N - 1 of the largest S are kept,
 * the others removed (later ones, of another run, are left alone). */
static void keep_after_save(const DuetConfig *cfg, int64_t step) {
  if (cfg->keep < 1) return;
  char dir[4096];
  const char *path = cfg->save_path, *base = save_dir(path, dir, sizeof dir);
  DIR *d = opendir(dir);
  if (!d) return;
  size_t nb = strlen(base), n = 0, cap = 0;
  int64_t *steps = NULL;
  for (struct dirent *e; (e = readdir(d));) {
    const char *nm = e->d_name;
    if (strncmp(nm, base, nb) || strncmp(nm + nb, ".step-", 6)) continue;
    const char *num = nm + nb + 6;
    if (!*num || strspn(num, "0123456789") != strlen(num) || strlen(num) > 18) continue;
    int64_t sv = strtoll(num, NULL, 10);
    if (sv >= step) continue;
    if (n == cap) {
      int64_t *t = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *t);
      if (!t) break;
      steps = t;
    }
    steps[n++] = sv;
  }
  closedir(d);
  if (n) qsort(steps, n, sizeof *steps, cmp_desc_i64);
  for (size_t i = (size_t)(cfg->keep - 1); i < n; i++) {
    char old[4200];
    snprintf(old, sizeof old, "%s.step-%" PRId64, path, steps[i]);
    if (unlink(old) && errno != ENOENT && !cfg->quiet)
      fprintf(stderr, "duet: warning: --keep %" PRId64 ": cannot remove %s: %s\n", cfg->keep, old, strerror(errno));
  }
  free(steps);
}

/* --keep-best: the record of PATH.best, PATH.best.json
 * {"step":S,"score":X,"loss":L}, read when a run resumes (its best so far
 * must be beaten), written after each new best. */
static void keep_best_resume(Run *r) {
  const DuetConfig *cfg = r->cfg;
  if (!cfg->keep_best || !cfg->save_path || !cfg->resume_path) return;
  char path[4200];
  snprintf(path, sizeof path, "%s.best.json", cfg->save_path);
  size_t n;
  char *text = duet_read_file(path, &n);
  if (!text) return;
  cJSON *o = cJSON_Parse(text);
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "step"), *sc = cJSON_GetObjectItemCaseSensitive(o, "score"),
              *lo = cJSON_GetObjectItemCaseSensitive(o, "loss");
  if (cJSON_IsNumber(st) && cJSON_IsNumber(sc) && cJSON_IsNumber(lo) && st->valuedouble <= (double)r->first_step) {
    r->has_best = true;
    r->best_score = sc->valuedouble;
    r->best_loss = lo->valuedouble;
  }
  cJSON_Delete(o);
  free(text);
}

/* --keep-best, after an evaluation of the state st: when it is the best so
 * far (score higher, or equal with a lower loss), the checkpoint of st is
 * written to PATH.best (and its record).  0, or -1 after the error. */
static int keep_best(Run *r, const DuetTrainState *st, double score, double loss) {
  const DuetConfig *cfg = r->cfg;
  if (!cfg->keep_best || !cfg->save_path || (r->dist && duet_dist_rank(r->dist) > 0)) return 0;
  if (r->has_best && !(score > r->best_score || (score == r->best_score && loss < r->best_loss))) return 0;
  char path[4200], err[1024];
  snprintf(path, sizeof path, "%s.best", cfg->save_path);
  if (duet_checkpoint_save(r->s, path, st, err, sizeof err)) {
    fprintf(stderr, "duet: error: --keep-best: %s\n", err);
    return -1;
  }
  r->has_best = true;
  r->best_score = score;
  r->best_loss = loss;
  snprintf(path, sizeof path, "%s.best.json", cfg->save_path);
  FILE *f = fopen(path, "w");
  if (!f || fprintf(f, "{\"step\":%" PRId64 ",\"score\":%.17g,\"loss\":%.17g}\n", st->step, score, loss) < 0 ||
      fclose(f)) {
    fprintf(stderr, "duet: error: --keep-best: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  if (!cfg->quiet) printf("duet: best evaluation so far: checkpoint of step %" PRId64 " saved to %s.best\n", st->step,
                          cfg->save_path);
  return 0;
}

/* fashion_mnist(..., val_fraction = F): the last floor(n * F) samples of
 * the training set become the validation split (moved into val; train
 * keeps the first ones).  1 after the error, else 0. */
static int split_validation(DuetDataset *train, double fraction, DuetDataset *val) {
  int64_t n_val = (int64_t)((double)train->n * fraction), px = (int64_t)train->rows * train->cols;
  if (n_val < 1 || n_val >= train->n) {
    fprintf(stderr, "duet: error: val_fraction %g of the %" PRId64 " training samples leaves %s\n", fraction, train->n,
            n_val < 1 ? "no validation sample" : "no training sample");
    return 1;
  }
  *val = (DuetDataset){.n = n_val, .rows = train->rows, .cols = train->cols};
  val->images = malloc((size_t)(n_val * px) * sizeof *val->images);
  val->labels = malloc((size_t)n_val * sizeof *val->labels);
  if (!val->images || !val->labels) {
    fprintf(stderr, "duet: error: out of host memory\n");
    return 1;
  }
  int64_t n_train = train->n - n_val;
  memcpy(val->images, train->images + n_train * px, (size_t)(n_val * px) * sizeof *val->images);
  memcpy(val->labels, train->labels + n_train, (size_t)n_val * sizeof *val->labels);
  train->n = n_train;
  return 0;
}

/* ------------------------------------------------------------ evaluation */

/* --eval-only and --checkpoint: each needs the other (a program with
 * embedded weights evaluates them without --checkpoint), and --eval-only
 * trains nothing (no --save, --resume).  1 after the error, else 0. */
static int check_eval_flags(const DuetProgram *p, const DuetConfig *c) {
  if (p->weights && (c->save_path || c->resume_path || c->keep || c->keep_best || c->init_path)) {
    fprintf(stderr, "duet: error: this executable evaluates its embedded weights (compiled with --checkpoint) and "
                    "trains nothing: it takes no --%s; to train, compile without --checkpoint\n",
            c->save_path ? "save" : c->resume_path ? "resume" : c->keep ? "keep" : c->keep_best ? "keep-best"
                                                                                           : "init-from");
    return 1;
  }
  if (c->init_path && c->eval_only) {
    fprintf(stderr, "duet: error: --init-from CK starts a training run from CK's params; --eval-only trains nothing: "
                    "to evaluate CK give --eval-only --checkpoint CK\n");
    return 1;
  }
  if (c->init_path && c->resume_path) {
    fprintf(stderr, "duet: error: --init-from starts a new run from a checkpoint's params (step 0, fresh optimizer "
                    "state) and --resume continues a run where it stopped: give one of them\n");
    return 1;
  }
  if (c->eval_only && !c->checkpoint_path && !p->weights) {
    fprintf(stderr, "duet: error: --eval-only needs --checkpoint CK (a checkpoint written by --save)\n");
    return 1;
  }
  if (c->checkpoint_path && !c->eval_only) {
    fprintf(stderr, "duet: error: --checkpoint CK is read by --eval-only; to continue training from a checkpoint "
                    "give --resume CK, to start a new run from its params --init-from CK\n");
    return 1;
  }
  if ((c->keep || c->keep_best) && !c->save_path && !c->eval_only) {
    fprintf(stderr, "duet: error: %s needs --save PATH (where to write the checkpoints)\n",
            c->keep ? "--keep" : "--keep-best");
    return 1;
  }
  if (c->eval_only && (c->save_path || c->resume_path || c->keep || c->keep_best)) {
    fprintf(stderr, "duet: error: --eval-only trains nothing: it takes no --%s (the checkpoint to evaluate is "
                    "--checkpoint CK)\n", c->save_path ? "save" : c->resume_path ? "resume" : c->keep ? "keep" : "keep-best");
    return 1;
  }
  return 0;
}

DuetSession *duet_eval_open(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg, DuetDevice **dev) {
  return open_session(p, kernels, cfg, dev, NULL);
}

/* The images or npy samples a classifier is evaluated on (the test split,
 * or npy's validation samples) into *ds; *n: how many of them are used.
 * 0, or -1 with the message in err. */
static int eval_images_load(const DuetProgram *p, const DuetConfig *cfg, DuetDataset *ds, int64_t *n, char *err,
                            size_t errlen) {
  *ds = (DuetDataset){0};
  if (cfg->data == DUET_DATA_NPY) {
    DuetDataset train = {0};
    int rc = npy_load_sets(p, cfg, &train, ds, err, errlen);
    duet_dataset_free(&train);
    if (!rc && !ds->n) {
      snprintf(err, errlen, "npy data without validation samples (val_fraction, or val_x and val_y): nothing to "
                            "evaluate on");
      rc = -1;
    }
    *n = ds->n;
    return rc;
  }
  char ip[4096], lp[4096];
  snprintf(ip, sizeof ip, "%s/%s", cfg->data_path, idx_files[1][0]);
  snprintf(lp, sizeof lp, "%s/%s", cfg->data_path, idx_files[1][1]);
  if (duet_load_idx(ds, ip, lp, err, errlen)) return -1;
  int64_t px = (int64_t)ds->rows * ds->cols, want_px = 1;
  for (int d = 1; d < p->tensors[p->input_x].rank; d++) want_px *= p->tensors[p->input_x].shape[d];
  if (px != want_px) {
    snprintf(err, errlen, "data has %" PRId64 " pixels per image, the model's input takes %" PRId64, px, want_px);
    return -1;
  }
  for (int64_t i = 0; p->n_classes && i < ds->n; i++)
    if (ds->labels[i] < 0 || ds->labels[i] >= p->n_classes) {
      snprintf(err, errlen, "test label %d at index %" PRId64 " is outside the model's %d classes", ds->labels[i], i,
               p->n_classes);
      return -1;
    }
  *n = cfg->test_subset && cfg->test_subset < ds->n ? cfg->test_subset : ds->n;
  return 0;
}

/* Text or token data for evaluation (the validation split is used). */
static int eval_text_load(const DuetProgram *p, const DuetConfig *cfg, TextData *td, char *err, size_t errlen) {
  memset(td, 0, sizeof *td);
  return cfg->data == DUET_DATA_TOKENS ? load_tokens(td, cfg->data_path, cfg->block, token_limit(p), err, errlen)
                                       : load_text(td, cfg->data_path, cfg->block, err, errlen);
}

int duet_evaluate(DuetSession *s, const DuetConfig *cfg, DuetEvalResult *res, char *err, size_t errlen) {
  const DuetProgram *p = duet_session_program(s);
  bool text = cfg->data == DUET_DATA_TEXT || cfg->data == DUET_DATA_TOKENS;
  *res = (DuetEvalResult){.text = text, .split = cfg->data == DUET_DATA_FASHION_MNIST ? "test" : "validation"};
  if (p->metrics < 0 || p->input_x < 0 || p->input_y < 0) {
    snprintf(err, errlen, "model `%s` has no evaluation (it needs x and y inputs and a cross_entropy loss)",
             p->model_name);
    return -1;
  }
  int rc = -1;
  if (text) {
    TextData td;
    if (eval_text_load(p, cfg, &td, err, errlen)) return -1;
    res->batches = cfg->eval_batches;
    if (text_validate_shown(s, p, &td, cfg, &res->loss, !cfg->quiet)) snprintf(err, errlen, "%s", duet_session_error(s));
    else rc = 0;
    free(td.bytes);
    free(td.tokens);
    return rc;
  }
  DuetDataset ds;
  int64_t n;
  if (eval_images_load(p, cfg, &ds, &n, err, errlen)) {
    duet_dataset_free(&ds);
    return -1;
  }
  EvalResult r;
  if (evaluate_shown(s, p, &ds, n, p->defaults.batch, &r, !cfg->quiet)) {
    snprintf(err, errlen, "%s", duet_session_error(s));
  } else {
    res->correct = r.correct;
    res->n = r.n;
    res->loss = r.loss;
    rc = 0;
  }
  duet_dataset_free(&ds);
  return rc;
}

/* --eval-only: the params of cfg->checkpoint_path evaluated as a training
 * run's final evaluation; the result printed (and written to --metrics). */
/* --eval-only --metrics-timing: the evaluation's wall time (seconds, the
 * forward passes and metric reductions of duet_evaluate; loading and
 * calibration excluded), its rate (samples/s for classifiers, r->n samples;
 * batches/s for text, r->batches fixed validation batches) and the bytes
 * the session allocated on its devices (duet plan's totals; duet run
 * --eval-only compiles an evaluation program, passes/evalonly.c: the
 * params and the forward pass's activation arena, no gradients or
 * optimizer state; a compiled training executable's include them),
 * added to the metrics line `o` as eval_seconds, samples_per_s |
 * batches_per_s and allocated_bytes, and printed on `out` (NULL: not
 * printed).  Off by default: wall-clock figures would keep two runs'
 * metrics from comparing byte for byte.  bench/gpu_prune_quant.sh reads
 * them. */
static void eval_timing(const DuetSession *s, const DuetEvalResult *r, double sec, cJSON *o, FILE *out) {
  int64_t b[DUET_MAX_DEVICES], bytes = 0;
  int n = duet_session_allocated(s, b, DUET_MAX_DEVICES);
  for (int i = 0; i < n; i++) bytes += b[i];
  double count = r->text ? (double)r->batches : (double)r->n, rate = sec > 0 ? count / sec : 0;
  const char *unit = r->text ? "batches" : "samples";
  cJSON_AddNumberToObject(o, "eval_seconds", sec);
  cJSON_AddNumberToObject(o, r->text ? "batches_per_s" : "samples_per_s", rate);
  cJSON_AddNumberToObject(o, "allocated_bytes", (double)bytes);
  if (out)
    fprintf(out, "duet: evaluation: %.0f %s in %.4f s (%.1f %s/s); %" PRId64 " bytes allocated on the device%s\n",
            count, unit, sec, rate, unit, bytes, n > 1 ? "s" : "");
}

static int eval_only(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg, int ranks) {
  char err[2048];
  int64_t step;
  if (ranks > 1) {
    fprintf(stderr, "duet: error: --eval-only runs in one process: start it without the MPI launcher\n");
    return 1;
  }
  /* --checkpoint CK, or the program's embedded weights (duet compile --checkpoint) */
  const char *ck = cfg->checkpoint_path ? cfg->checkpoint_path : DUET_EMBEDDED_WEIGHTS;
  if (duet_checkpoint_check_weights(p, cfg->checkpoint_path, &step, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return 1;
  }
  DuetDevice *dev = NULL;
  DuetSession *s = duet_eval_open(p, kernels, cfg, &dev);
  DuetEvalResult r;
  FILE *mf = NULL;
  int rc = 1;
  if (!s) goto out;
  if (duet_checkpoint_load_weights(s, cfg->checkpoint_path, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    goto out;
  }
  if (!cfg->quiet) duet_checkpoint_precision_note(p, cfg->checkpoint_path);
  if (!cfg->quiet) duet_quant_summary(p, stdout); /* int8 weights (--quantize): their bytes */
  if (!cfg->quiet) duet_shrink_summary(p, stdout); /* --shrink: params before and after */
  if (duet_calibrate(s, p, cfg, cfg->quiet ? NULL : stdout, err, sizeof err)) { /* int8 activations (--calibrate) */
    fprintf(stderr, "duet: error: %s\n", err);
    goto out;
  }
  double t0 = now_seconds();
  if (duet_evaluate(s, cfg, &r, err, sizeof err)) {
    fprintf(stderr, "duet: error: evaluation: %s\n", err);
    goto out;
  }
  double eval_s = now_seconds() - t0;
  if (cfg->metrics_path && !(mf = fopen(cfg->metrics_path, "w"))) {
    fprintf(stderr, "duet: error: cannot write metrics file %s: %s\n", cfg->metrics_path, strerror(errno));
    goto out;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "step", (double)step);
  if (r.text) {
    printf("duet: %s (step %" PRId64 "): val loss %.6f nats/%s (%" PRId64 " batches)\n", ck, step,
           r.loss, cfg->data == DUET_DATA_TOKENS ? "token" : "byte", r.batches);
    cJSON_AddNumberToObject(o, "val_loss", r.loss);
  } else {
    printf("duet: %s (step %" PRId64 "): %s accuracy %.2f%% (%" PRId64 "/%" PRId64 ") | %s loss %.6f\n",
           ck, step, r.split, 100.0 * (double)r.correct / (double)r.n, r.correct, r.n, r.split,
           r.loss);
    cJSON_AddNumberToObject(o, "test_accuracy", (double)r.correct / (double)r.n);
    cJSON_AddNumberToObject(o, "test_loss", r.loss);
  }
  cJSON_AddTrueToObject(o, "eval_only");
  if (cfg->metrics_timing) eval_timing(s, &r, eval_s, o, cfg->quiet ? NULL : stdout);
  if (mf ? metrics_write(mf, o) : (cJSON_Delete(o), 0)) goto out;
  rc = 0;
out:
  if (mf && fclose(mf)) {
    fprintf(stderr, "duet: error: writing metrics file %s failed\n", cfg->metrics_path);
    rc = 1;
  }
  duet_session_free(s);
  if (dev) dev->ops->destroy(dev);
  return rc;
}

/* ------------------------------------------------------------- predict */

void duet_predict_usage(FILE *out) {
  fprintf(out,
          "usage: duet predict M.model --checkpoint CK [--data PATH] [-o OUT.jsonl] [flags]\n"
          "Loads the params of CK (written by duet run --save) and writes one JSON line per prediction,\n"
          "on the samples the final evaluation uses (Fashion-MNIST: the test split; npy: the validation\n"
          "samples; text, tokens: the --eval-batches fixed validation batches):\n"
          "  classifiers    {\"index\":I,\"class\":C,\"prob\":P,\"label\":Y} per sample, in order: C the\n"
          "                 predicted class (the largest logit, the first of equal ones), P its softmax\n"
          "                 probability, Y the sample's label (--logits adds \"logits\":[...])\n"
          "  language models {\"window\":W,\"offset\":O,\"loss\":[L0,...]} per validation window: O its first\n"
          "                 token's position in the data, Lt = -log softmax(logits_t)[y_t] (nats) of each\n"
          "                 of its block tokens (their mean over all windows is the validation loss)\n"
          "  --checkpoint CK    the trained params (required)\n"
          "  --data PATH        data directory or file (default: the train section's)\n"
          "  -o FILE            write the lines to FILE (default: standard output)\n"
          "  --test-subset N    classifiers: the first N test samples\n"
          "  --eval-batches N   language models: N fixed validation batches (default: the model's)\n"
          "  --logits           classifiers: each line also holds the logits\n"
          "  --threads N        CPU threads, 1 to 1024 (default: all cores)\n"
          "  --prune-mode channels --prune S --shrink   a channels-pruned CK with its pruned channels\n"
          "                     removed (docs/pruning-quantization.md)\n"
          "The program is compiled in fp32 for the model's batch; numbers are printed with 9 significant\n"
          "digits (a float round-trips).  A summary goes to standard error.\n");
}

/* Element k of a logits buffer of dtype dt, as a double. */
static double logit_at(const void *buf, int dt, int64_t k) {
  switch (dt) {
  case DUET_F64: return ((const double *)buf)[k];
  case DUET_F16: return duet_f32_from_f16(((const uint16_t *)buf)[k]);
  case DUET_BF16: return duet_f32_from_bf16(((const uint16_t *)buf)[k]);
  default: return ((const float *)buf)[k];
  }
}

/* A number with 9 significant digits (a float round-trips). */
static int put_num(FILE *f, double x) {
  return isfinite(x) ? fprintf(f, "%.9g", x) : fprintf(f, "null");
}

/* Reads the logits of the batch just evaluated: rows of V values. */
static void *read_logits(DuetSession *s, const DuetProgram *p, char *err, size_t errlen) {
  const DuetTensor *t = &p->tensors[p->logits];
  void *buf = malloc((size_t)t->nbytes);
  if (!buf) {
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  if (duet_session_read(s, p->logits, 0, buf, (size_t)t->nbytes)) {
    snprintf(err, errlen, "%s", duet_session_error(s));
    free(buf);
    return NULL;
  }
  return buf;
}

/* The predictions of a classifier on ds's first n samples, one line each. */
static int predict_images(DuetSession *s, const DuetProgram *p, const DuetDataset *ds, int64_t n, bool with_logits,
                          FILE *out, int64_t *correct, char *err, size_t errlen) {
  const DuetTensor *t = &p->tensors[p->logits];
  int64_t B = p->defaults.batch, V = p->n_classes;
  int dsz = t->dtype == DUET_F64 ? 8 : t->dtype == DUET_F16 || t->dtype == DUET_BF16 ? 2 : 4;
  if (V < 1 || t->nbytes != B * V * dsz) {
    snprintf(err, errlen, "model `%s`: its logits are not [batch, classes]", p->model_name);
    return -1;
  }
  int64_t *idx = malloc((size_t)B * sizeof *idx);
  if (!idx) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  *correct = 0;
  for (int64_t start = 0; start < n; start += B) {
    int64_t m = n - start < B ? n - start : B;
    for (int64_t r = 0; r < m; r++) idx[r] = start + r;
    duet_session_set_valid(s, m);
    void *lg = NULL;
    if (fill_batch(s, p, ds, idx, m, B) || duet_session_run(s, DUET_RUN_EVAL)) {
      snprintf(err, errlen, "%s", duet_session_error(s));
    } else {
      lg = read_logits(s, p, err, errlen);
    }
    if (!lg) {
      free(idx);
      return -1;
    }
    for (int64_t r = 0; r < m; r++) {
      int64_t best = 0;
      for (int64_t v = 1; v < V; v++)
        if (logit_at(lg, t->dtype, r * V + v) > logit_at(lg, t->dtype, r * V + best)) best = v;
      double mx = logit_at(lg, t->dtype, r * V + best), sum = 0;
      for (int64_t v = 0; v < V; v++) sum += exp(logit_at(lg, t->dtype, r * V + v) - mx);
      /* the label: fashion_mnist's, or npy's i32 class per sample */
      bool labelled = ds->labels || (p->tensors[p->input_y].dtype == DUET_I32 && ds->y_elems == 1);
      int32_t label = ds->labels ? ds->labels[start + r] : labelled ? ((const int32_t *)ds->y)[start + r] : -1;
      *correct += labelled && best == label;
      fprintf(out, "{\"index\":%" PRId64 ",\"class\":%" PRId64 ",\"prob\":", start + r, best);
      put_num(out, 1.0 / sum);
      if (labelled) fprintf(out, ",\"label\":%d", (int)label);
      if (with_logits) {
        fprintf(out, ",\"logits\":[");
        for (int64_t v = 0; v < V; v++) {
          if (v) fputc(',', out);
          put_num(out, logit_at(lg, t->dtype, r * V + v));
        }
        fputc(']', out);
      }
      fprintf(out, "}\n");
    }
    free(lg);
  }
  free(idx);
  return 0;
}

/* The per-token losses of a language model on the fixed validation windows
 * (text_validate's: the same generator, the same draws). */
static int predict_text(DuetSession *s, const DuetProgram *p, const TextData *td, const DuetConfig *cfg, FILE *out,
                        double *mean, char *err, size_t errlen) {
  const DuetTensor *t = &p->tensors[p->logits];
  int64_t B = p->defaults.batch, T = cfg->block, V = p->n_classes;
  int dsz = t->dtype == DUET_F64 ? 8 : t->dtype == DUET_F16 || t->dtype == DUET_BF16 ? 2 : 4;
  if (V < 1 || t->nbytes != B * T * V * dsz) {
    snprintf(err, errlen, "model `%s`: its logits are not [batch, block, vocab]", p->model_name);
    return -1;
  }
  int32_t *y = malloc((size_t)(B * T) * sizeof *y);
  int64_t *off = malloc((size_t)B * sizeof *off);
  if (!y || !off) {
    free(y);
    free(off);
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  DuetRng r;
  duet_rng_seed(&r, 0x76616c6964ull, 0); /* text_validate's windows */
  double total = 0;
  int rc = 0;
  duet_session_set_valid(s, B * T);
  uint64_t span = (uint64_t)(td->n - td->n_train - T - 1) + 1;
  for (int64_t i = 0; i < cfg->eval_batches && !rc; i++) {
    DuetRng peek = r; /* the offsets text_batch draws */
    for (int64_t b = 0; b < B; b++) off[b] = td->n_train + (int64_t)(duet_rng_next(&peek) % span);
    void *lg = NULL;
    if (text_batch(s, p, td, &r, td->n_train, td->n, B, T) || duet_session_run(s, DUET_RUN_EVAL) ||
        duet_session_read(s, p->input_y, 0, y, (size_t)(B * T) * sizeof *y))
      snprintf(err, errlen, "%s", duet_session_error(s));
    else
      lg = read_logits(s, p, err, errlen);
    if (!lg) {
      rc = -1;
      break;
    }
    for (int64_t b = 0; b < B; b++) {
      fprintf(out, "{\"window\":%" PRId64 ",\"offset\":%" PRId64 ",\"loss\":[", i * B + b, off[b]);
      for (int64_t k = 0; k < T; k++) {
        int64_t row = b * T + k;
        double mx = -INFINITY, sum = 0;
        for (int64_t v = 0; v < V; v++) mx = fmax(mx, logit_at(lg, t->dtype, row * V + v));
        for (int64_t v = 0; v < V; v++) sum += exp(logit_at(lg, t->dtype, row * V + v) - mx);
        double l = mx + log(sum) - logit_at(lg, t->dtype, row * V + y[row]);
        total += l;
        if (k) fputc(',', out);
        put_num(out, l);
      }
      fprintf(out, "]}\n");
    }
    free(lg);
  }
  free(y);
  free(off);
  *mean = total / (double)(cfg->eval_batches * B * T);
  return rc;
}

int duet_predict_main(const DuetProgram *p, const DuetKernelFn *kernels, const char *model_path, int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  DuetConfig cfg = p->defaults;
  const char *out_path = NULL;
  bool with_logits = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--logits")) {
      with_logits = true;
      continue;
    }
    bool known = !strcmp(a, "--checkpoint") || !strcmp(a, "--data") || !strcmp(a, "-o") ||
                 !strcmp(a, "--test-subset") || !strcmp(a, "--eval-batches") || !strcmp(a, "--threads");
    if (!known) {
      fprintf(stderr, "duet: error: %s '%s' (see duet predict --help)\n",
              a[0] == '-' ? "unknown flag" : "unexpected argument", a);
      return 1;
    }
    if (!v) {
      fprintf(stderr, "duet: error: %s needs a value (see duet predict --help)\n", a);
      return 1;
    }
    i++;
    int rc = 0;
    if (!strcmp(a, "--checkpoint")) cfg.checkpoint_path = v;
    else if (!strcmp(a, "--data")) cfg.data_path = v;
    else if (!strcmp(a, "-o")) out_path = v;
    else if (!strcmp(a, "--test-subset")) rc = parse_i64(a, v, 1, &cfg.test_subset);
    else if (!strcmp(a, "--eval-batches")) rc = parse_i64(a, v, 1, &cfg.eval_batches);
    else rc = duet_parse_threads(v, &cfg.threads);
    if (rc) return 1;
  }
  if (!cfg.checkpoint_path) {
    fprintf(stderr, "duet: error: duet predict needs --checkpoint CK (a checkpoint written by duet run --save)\n");
    return 1;
  }
  bool text = cfg.data == DUET_DATA_TEXT || cfg.data == DUET_DATA_TOKENS;
  char err[2048];
  int64_t step;
  if (text && with_logits) {
    fprintf(stderr, "duet: error: --logits is for classifiers: a language model's lines carry its per-token losses "
                    "(see duet predict --help)\n");
    return 1;
  }
  if (text && cfg.test_subset && duet_warns())
    fprintf(stderr, "duet: warning: --test-subset applies to image data sets; a language model's predictions cover "
                    "its --eval-batches N fixed validation batches\n");
  if (!text && no_data_source(p, &cfg)) return 1;
  if (p->logits < 0 || p->metrics < 0) {
    fprintf(stderr, "duet: error: model `%s` has no evaluated cross_entropy whose logits to predict from\n",
            p->model_name);
    return 1;
  }
  if (duet_checkpoint_check_weights(p, cfg.checkpoint_path, &step, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return 1;
  }
  cfg.quiet = 1;
  DuetDevice *dev = NULL;
  DuetSession *s = NULL;
  FILE *out = stdout;
  DuetDataset ds = {0};
  TextData td = {0};
  int64_t n = 0, correct = 0;
  double mean = 0;
  int rc = 1;
  if (text ? eval_text_load(p, &cfg, &td, err, sizeof err) : eval_images_load(p, &cfg, &ds, &n, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    goto out;
  }
  if (!(s = duet_eval_open(p, kernels, &cfg, &dev))) goto out;
  if (duet_checkpoint_load_weights(s, cfg.checkpoint_path, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    goto out;
  }
  if (out_path && duet_check_output(p, &cfg, model_path, "-o", out_path)) goto out;
  if (out_path && !(out = fopen(out_path, "w"))) {
    fprintf(stderr, "duet: error: cannot write %s: %s\n", out_path, strerror(errno));
    out = stdout;
    goto out;
  }
  if (text ? predict_text(s, p, &td, &cfg, out, &mean, err, sizeof err)
           : predict_images(s, p, &ds, n, with_logits, out, &correct, err, sizeof err)) {
    fprintf(stderr, "duet: error: predicting: %s\n", err);
    goto out;
  }
  if (fflush(out) || ferror(out)) {
    fprintf(stderr, "duet: error: writing %s failed: %s\n", out_path ? out_path : "standard output", strerror(errno));
    goto out;
  }
  if (text) /* the unit of --eval-only's line: a token of the data, which byte-level text makes a byte */
    fprintf(stderr, "duet: predicted %" PRId64 " windows of %" PRId64 " %ss of %s (step %" PRId64 "); mean loss "
            "%.6f nats/%s\n", cfg.eval_batches * p->defaults.batch, cfg.block,
            cfg.data == DUET_DATA_TOKENS ? "token" : "byte", cfg.checkpoint_path, step, mean,
            cfg.data == DUET_DATA_TOKENS ? "token" : "byte");
  else
    fprintf(stderr, "duet: predicted %" PRId64 " samples with %s (step %" PRId64 "): %" PRId64 " correct (%.2f%%)\n", n,
            cfg.checkpoint_path, step, correct, 100.0 * (double)correct / (double)n);
  rc = 0;
out:
  if (out != stdout && fclose(out)) {
    fprintf(stderr, "duet: error: writing %s failed: %s\n", out_path, strerror(errno));
    rc = 1;
  }
  duet_session_free(s);
  if (dev) dev->ops->destroy(dev);
  duet_dataset_free(&ds);
  free(td.bytes);
  free(td.tokens);
  return rc;
}

int duet_main(const DuetProgram *p, const DuetKernelFn *kernels, const char *argv0, int argc, char **argv) {
  /* progress lines (stdout) and errors (stderr) in the order they happen,
   * also when both go to one pipe or file */
  setvbuf(stdout, NULL, _IOLBF, 0);
  duet_rank_stderr(); /* an MPI run: "duet: rank 1: error: ..." */
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--version")) {
      printf("%s\n", duet_version_line);
      return 0;
    }
  DuetConfig cfg = p->defaults;
  int rc = duet_parse_flags_for(&cfg, p, argc, argv);
  if (rc == 2) { /* an executable's (duet run prints its own) */
    const char *why = p->weights                  ? "compiled with --checkpoint: it holds its weights"
                      : duet_program_quantized(p) ? "compiled with --quantize: its weights are int8"
                      : p->shrink                 ? "compiled with --shrink: its layers are shrunk"
                      : p->eval_program           ? "compiled as an evaluation program"
                                                  : NULL;
    if (why)
      printf("This program evaluates a trained checkpoint and cannot train (%s): %s --eval-only --checkpoint CK%s.\n"
             "The training flags below (--steps, --epochs, --save, --resume, --init-from, --offload, ...) are "
             "refused.\n\n", why, argv0, p->weights ? ", or alone to evaluate its own weights" : "");
    duet_usage(argv0, stdout);
    duet_usage_fixed(p, stdout);
    return 0;
  }
  if (rc) return 1;
  int ranks = rank_view(p, &cfg);
  if (ranks < 0) return 1;
  /* flags that do not apply to this program: said, not silently dropped */
  bool text = cfg.data == DUET_DATA_TEXT || cfg.data == DUET_DATA_TOKENS;
  if (duet_warns()) {
    if (!text && (cfg.eval_every != p->defaults.eval_every || cfg.eval_batches != p->defaults.eval_batches))
      fprintf(stderr, "duet: warning: --eval-every and --eval-batches apply to text models; this one evaluates on "
                      "its test split after every epoch\n");
    if (text && (cfg.train_subset || cfg.test_subset))
      fprintf(stderr, "duet: warning: --train-subset and --test-subset apply to image data sets; a text model "
                      "trains on its whole text\n");
    if (cfg.schedule != p->defaults.schedule && p->n_stages < 1)
      fprintf(stderr, "duet: warning: --schedule has no effect without a pipeline (--devices with several items, "
                      "or --micro-batches)\n");
    if (cfg.bucket_mb > 0 && !(p->n_stages >= 1 && p->replicas > 1))
      fprintf(stderr, "duet: warning: --bucket-mb has no effect without data parallelism (--data-parallel N, N > 1)\n");
  }
  if (!text && no_data_source(p, &cfg)) return 1;
  if (check_run_files(p, &cfg, NULL)) return 1;
  if (cfg.eval_only) return eval_only(p, kernels, &cfg, ranks);
  if (ranks > 1 && cfg.keep_best) {
    fprintf(stderr, "duet: error: --keep-best is not supported under an MPI launcher yet (--keep is)\n");
    return 1;
  }
  if (ranks > 1) return train_rank(p, kernels, &cfg, text);
  return text ? train_text(p, kernels, cfg, NULL) : train_images(p, kernels, cfg, NULL);
}

int duet_preflight(const DuetProgram *p, const char *model_path, int argc, char **argv) {
  duet_rank_stderr(); /* an MPI run: "duet: rank 1: error: ..." */
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--version")) return 0; /* duet_main prints it */
  DuetConfig cfg = p->defaults;
  char err[1024];
  int rc = duet_parse_flags_for(&cfg, p, argc, argv);
  if (rc) return rc == 2 ? 0 : 1; /* --help: duet_main prints it */
  if (rank_view(p, &cfg) < 0) return 1;
  if (cfg.data == DUET_DATA_TOKENS) {
    int64_t n;
    if (duet_load_tokens(cfg.data_path, token_limit(p), NULL, &n, err, sizeof err) ||
        text_too_short_unit(cfg.data_path, n, cfg.block, "tokens", err, sizeof err)) {
      fprintf(stderr, "duet: error: %s\n", err);
      return 1;
    }
  } else if (cfg.data == DUET_DATA_TEXT) {
    if (text_vocab_error(p)) return 1;
    FILE *f = fopen(cfg.data_path, "rb");
    int e = f ? 0 : errno;
    if (f && getc(f) == EOF && ferror(f)) e = EIO; /* a directory opens, then fails to read */
    struct stat st; /* a regular file's size: long enough for a window? */
    int short_text = !e && !fstat(fileno(f), &st) && S_ISREG(st.st_mode) &&
                     text_too_short(cfg.data_path, (int64_t)st.st_size, cfg.block, err, sizeof err);
    if (f) fclose(f);
    if (e) text_open_error(cfg.data_path, e, err, sizeof err);
    if (e || short_text) {
      fprintf(stderr, "duet: error: %s\n", err);
      return 1;
    }
  } else if (cfg.data == DUET_DATA_NPY) {
    int64_t n_train, n_val;
    if (no_data_source(p, &cfg)) return 1;
    if (npy_plan(p, &cfg, &n_train, &n_val, err, sizeof err)) {
      fprintf(stderr, "duet: error: %s\n", err);
      return 1;
    }
  } else {
    if (no_data_source(p, &cfg)) return 1;
    for (int k = 0; k < (cfg.eval ? 2 : 1); k++) {
      char ip[1024], lp[1024];
      snprintf(ip, sizeof ip, "%s/%s", cfg.data_path, idx_files[k][0]);
      snprintf(lp, sizeof lp, "%s/%s", cfg.data_path, idx_files[k][1]);
      DuetIdxInfo info;
      if (duet_check_idx(ip, lp, &info, err, sizeof err)) {
        fprintf(stderr, "duet: error: %s\n", err);
        return 1;
      }
      if (check_pixels(p, info.rows, info.cols)) return 1;
    }
  }
  if (check_run_files(p, &cfg, model_path) || check_compiled(p, &cfg)) return 1;
  if (duet_devices_preflight(p, &cfg, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return 1;
  }
  return 0;
}
