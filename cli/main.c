/* cli/main.c: the `duet` driver.  Commands: run, compile, ir, emit, check. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../codegen/codegen.h"
#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "fit.h"
#include "jit.h"
#include "plan_svg.h"
#include "plot.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: duet <command> [args]\n\n"
          "commands:\n"
          "  run M.model [flags]          compile and train now (JIT); `duet run --help` lists flags\n"
          "  compile M.model -o EXE       write a standalone training executable\n"
          "  ir M.model [--after PASS] [--format text|dot|json]   print the IR after PASS (default: shape)\n"
          "  emit M.model --target c|cuda print the generated kernel source (C, or CUDA C for NVRTC)\n"
          "  plan M.model [--devices SPEC] stages, estimated times, memory per device, bubble (no run)\n"
          "  devices                      list the CPU and the GPUs duet can use (--devices cpu|cuda:N)\n"
          "  check M.model                parse and verify; print a parameter summary\n"
          "  sample M.model --checkpoint CK [--prompt TEXT]   generate text with a trained model\n"
          "  plot METRICS.jsonl ... -o OUT.png|OUT.svg   training curves of --metrics files (gnuplot)\n"
          "  predict M.model --checkpoint CK [--data PATH] [-o OUT.jsonl]   predictions as JSON lines\n"
          "  export M.model --checkpoint CK -o W.safetensors   the params alone, f32 (for PyTorch)\n"
          "  version                      the version and the commit duet was built from (also --version)\n"
          "  help                         this text\n\n"
          "run, compile, ir, emit and check take --precision auto|fp32|fp16|bf16 (default auto: fp32\n"
          "on the CPU) and ir and check --arch cpu|sm_60|sm_61|sm_70|sm_75|sm_80|sm_86|sm_89|sm_90 (the\n"
          "device whose capabilities `auto` follows); run, compile, plan, ir, emit and check take --gemm-accumulate\n"
          "fp32|fp16 (fp16: opt-in fp16 accumulation of fp16 GEMMs on CUDA devices; ir, emit and check\n"
          "refuse fp16 too when the program has no fp16 GEMM).\n\n"
          "run, compile, plan, ir, emit and check take --recompute none|blocks|auto (default none, or\n"
          "the train section's `recompute`): blocks keeps only the inputs of each block instance and\n"
          "recomputes the rest in the backward pass; auto recomputes blocks only until each device fits.\n\n"
          "run, compile, plan, ir, emit and check take --optimizer-state int8|f32 (AdamW's moments in 8-bit\n"
          "block-wise quantized codes, or f32: overrides the model's adamw(state = ...)).\n\n"
          "run, compile, ir and emit take --quantize int8|int8-tensor|none (int8 weights, a scale per output\n"
          "channel or per tensor: an evaluation program; duet run needs --eval-only --checkpoint CK);\n"
          "duet compile --quantize int8 --checkpoint CK puts CK's weights, in int8, inside the executable.\n"
          "With --quantize, --calibrate N quantizes the matmuls' activations too (scales from the first N\n"
          "training batches, printed) and runs them as an int8 x int8 -> int32 GEMM.\n\n"
          "run, compile, plan, ir, emit and check take the pruning flags --prune S, --prune-mode,\n"
          "--prune-start, --prune-end, --prune-every, --prune-initial, --prune-params (`duet run --help`).\n\n"
          "run, compile, ir, emit and check also take an IR dump (G.ir, from `duet ir`) in place of\n"
          "M.model: it resumes after the pass it was printed after.\n\n"
          "Every command takes --help and --version.  Environment: DUET_CC (C compiler, default cc),\n"
          "DUET_CACHE_DIR (kernel cache, default ~/.cache/duet), DUET_HOST_MEMORY (the memory a CPU\n"
          "device may use, default MemAvailable or the cgroup limit).\n");
}

/* The --prune flags (all commands that compile take them). */
static void prune_help(FILE *out) {
  fprintf(out,
          "  --prune S          magnitude pruning to final sparsity S in [0, 1) (overrides the model's\n"
          "                     prune section; masks applied after every optimizer step)\n"
          "  --prune-mode M     unstructured (per layer, default), global (one threshold), channels\n"
          "                     (whole output channels by L2 norm) or N:M such as 2:4 (along the inputs)\n"
          "  --prune-start N    first mask update after N steps (default 0); one-shot unless --prune-end\n"
          "  --prune-end N      gradual: the cubic schedule of Zhu & Gupta 2017 from start to end\n"
          "  --prune-every N    gradual: masks updated every N steps (default 100)\n"
          "  --prune-initial S  gradual: the schedule's initial sparsity (default 0)\n"
          "  --prune-params P   which params: comma-separated globs, !GLOB excludes (default: matmul and\n"
          "                     convolution weights, no biases, norms or embeddings)\n"
          "  --shrink           with --prune-mode channels and the run's --prune S: remove the pruned\n"
          "                     channels (smaller layers and next-layer inputs); only with --eval-only\n"
          "                     --checkpoint CK, duet predict, duet export, duet compile (evaluation)\n");
}

/* --precision and --arch, taken out of argv by main() for run, compile, ir,
 * emit and check (cli/ may hold global state). */
static const char *opt_precision, *opt_arch, *opt_gemm_acc, *opt_recompute, *opt_optim_state, *opt_device_memory,
    *opt_offload, *opt_quantize, *opt_calibrate;
/* --calibrate N: int8 activations calibrated on N training batches (0: not given) */
static int64_t opt_calibrate_n;
/* --device-memory SIZE in bytes (0: not given): every device's capacity */
static int64_t opt_device_bytes;
static char opt_device_from[160]; /* "--device-memory 16GB = 16000000000 bytes" */

/* Removes `--precision X` / `--arch X` / `--gemm-accumulate X` /
 * `--optimizer-state X` (and the `=` forms) from argv;
 * returns the new argc, or -1 after a message when a value is missing. */
static int strip_precision_flags(int argc, char **argv) {
  int k = 0;
  for (int i = 0; i < argc; i++) {
    const char *names[9] = {"--precision", "--arch", "--gemm-accumulate", "--recompute", "--optimizer-state",
                            "--device-memory", "--offload", "--quantize", "--calibrate"};
    const char **dst[9] = {&opt_precision, &opt_arch, &opt_gemm_acc, &opt_recompute, &opt_optim_state,
                           &opt_device_memory, &opt_offload, &opt_quantize, &opt_calibrate};
    static const char *const values[9] = {"auto, fp32, fp16, bf16",
                                          "cpu, sm_60, sm_61, sm_70, sm_75, sm_80, sm_86, sm_89, sm_90", "fp32, fp16",
                                          "none, blocks, auto", "int8, f32", "a size such as 16GiB", "none, optimizer",
                                          "int8, int8-tensor, none", "a number of training batches"};
    int hit = -1;
    for (int j = 0; j < 9 && hit < 0; j++) {
      size_t n = strlen(names[j]);
      if (!strcmp(argv[i], names[j])) {
        if (i + 1 >= argc) {
          fprintf(stderr, "duet: error: %s needs a value (%s)\n", names[j], values[j]);
          return -1;
        }
        *dst[j] = argv[++i];
        hit = j;
      } else if (!strncmp(argv[i], names[j], n) && argv[i][n] == '=') {
        *dst[j] = argv[i] + n + 1;
        hit = j;
      }
    }
    if (hit < 0) argv[k++] = argv[i];
  }
  argv[k] = NULL;
  return k;
}

/* The --prune flags (passes/prune.c: prune_parse_flag), taken out of argv
 * by main() for run, compile, ir, emit, check and plan; they override the
 * model's prune section field by field in the prune pass. */
static PruneSpec opt_prune;
/* --shrink (passes/shrink.c): channels pruning's zero channels removed, an
 * evaluation program; taken out of argv with the --prune flags. */
static bool opt_shrink;
/* duet run --eval-only, duet compile --checkpoint: the passes make an
 * evaluation program (passes/evalonly.c: no backward graph, no optimizer
 * state); set by cmd_run and cmd_compile before compiling. */
static bool opt_eval_only;

/* Removes the --prune flags (`--prune S`, `--prune-mode M`, ... and the
 * `=` forms) from argv into opt_prune; returns the new argc, or -1 after a
 * message for a bad or missing value. */
static int strip_prune_flags(int argc, char **argv) {
  int k = 0;
  for (int i = 0; i < argc; i++) {
    char flag[32], err[300];
    const char *eq = strchr(argv[i], '='), *val;
    if (!strcmp(argv[i], "--shrink")) {
      opt_shrink = true;
      continue;
    }
    if (!strncmp(argv[i], "--shrink=", 9)) {
      fprintf(stderr, "duet: error: --shrink takes no value\n");
      return -1;
    }
    if (strncmp(argv[i], "--prune", 7)) {
      argv[k++] = argv[i];
      continue;
    }
    snprintf(flag, sizeof flag, "%.*s", (int)(eq ? eq - argv[i] : (long)strlen(argv[i])), argv[i]);
    val = eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
    PruneSpec probe = {0};
    int hit = prune_parse_flag(&probe, flag, val ? val : "", err, sizeof err);
    if (hit == 0) { /* not a prune flag after all: the command's own parser reports it */
      argv[k++] = argv[i];
      continue;
    }
    if (!val) {
      fprintf(stderr, "duet: error: %s needs a value (see duet run --help)\n", flag);
      return -1;
    }
    if (hit < 0 || prune_parse_flag(&opt_prune, flag, val, err, sizeof err) < 0) {
      fprintf(stderr, "duet: error: %s\n", err);
      return -1;
    }
    if (!eq) i++;
  }
  argv[k] = NULL;
  return k;
}

/* Checks --precision and --arch against the device table (and the other
 * flags strip_precision_flags took) for command cmd; 1 after a message. */
static int check_precision_flags(const char *cmd) {
  PrecisionChoice pc;
  char err[256];
  if (opt_gemm_acc && strcmp(opt_gemm_acc, "fp32") && strcmp(opt_gemm_acc, "fp16")) {
    fprintf(stderr, "duet: error: unknown --gemm-accumulate `%s` (fp32, fp16)\n", opt_gemm_acc);
    return 1;
  }
  if (opt_recompute && recompute_mode_parse(opt_recompute) < 0) {
    fprintf(stderr, "duet: error: unknown --recompute `%s` (none, blocks, auto)\n", opt_recompute);
    return 1;
  }
  if (opt_optim_state && strcmp(opt_optim_state, "int8") && strcmp(opt_optim_state, "f32")) {
    fprintf(stderr, "duet: error: unknown --optimizer-state `%s` (int8, f32)\n", opt_optim_state);
    return 1;
  }
  if (quantize_mode_parse(opt_quantize) < 0) {
    fprintf(stderr, "duet: error: unknown --quantize `%s` (int8: a scale per output channel, int8-tensor: one per "
                    "tensor, none)\n", opt_quantize);
    return 1;
  }
  if (opt_calibrate) { /* int8 activations (passes/quantize.c, runtime/calibrate.c) */
    char *end;
    long long nb = strtoll(opt_calibrate, &end, 10);
    if (end == opt_calibrate || *end || nb < 1 || nb > 1000000) {
      fprintf(stderr, "duet: error: --calibrate expects a number of training batches from 1 to 1000000, got '%s'\n",
              opt_calibrate);
      return 1;
    }
    if (quantize_mode_parse(opt_quantize) <= 0) { /* what follows --quantize: the command's own words */
      fprintf(stderr, "duet: error: --calibrate %s quantizes the activations of an int8 program: give it with "
                      "--quantize int8 (or int8-tensor)%s\n", opt_calibrate,
              !strcmp(cmd, "run") ? " and --eval-only --checkpoint CK"
              : !strcmp(cmd, "compile") ? "; the executable then evaluates: EXE --eval-only --checkpoint CK" : "");
      return 1;
    }
    opt_calibrate_n = nb;
  }
  int off;
  if (opt_offload && duet_parse_offload(opt_offload, &off)) return 1;
  if (opt_device_memory) {
    opt_device_bytes = duet_parse_size(opt_device_memory);
    if (opt_device_bytes <= 0) {
      fprintf(stderr, "duet: error: --device-memory expects a size such as 16GiB or 16G (2^30 bytes), 16GB (10^9), "
              "500MiB or bytes, got '%s'\n", opt_device_memory);
      return 1;
    }
    snprintf(opt_device_from, sizeof opt_device_from, "--device-memory %s = %" PRId64 " bytes", opt_device_memory,
             opt_device_bytes);
  }
  if (!opt_precision && !opt_arch) return 0;
  if (precision_resolve(opt_arch, opt_precision, &pc, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return 1;
  }
  return 0;
}

/* A compilation: arena, diagnostics, graph after the passes. */
typedef struct Compiled {
  Arena *arena;
  Diag diag;
  Graph *g;
} Compiled;

/* Model- and data-parallel settings of a compilation: --devices,
 * --micro-batches, --data-parallel, --bucket-mb. */
typedef struct ParOpts {
  const char *devices; /* NULL: one CPU device (per replica) */
  int64_t micro_batches;
  int64_t replicas;    /* --data-parallel (0: not given, 1 replica) */
  double bucket_mb;    /* --bucket-mb (0: the default) */
  int zero;            /* --zero 1: ZeRO stage 1 (optimizer state sharded over the replicas) */
  PartDevice dev[DUET_MAX_DEVICES];
  int n_dev;
  char mem_from[1700]; /* where the CPU devices' capacity came from (duet_host_memory) */
  char gpu_from[DUET_MAX_DEVICES][120]; /* a GPU's: "cuMemGetInfo: free memory of cuda:0" */
  bool one_f_one_b; /* --schedule 1f1b: fewer activations in flight */
  bool clip;        /* --clip-grad-norm given (the partition pass then keeps tied gradients per micro-batch) */
  bool per_rank;    /* an MPI run: the replicas are the ranks, --devices names one rank's devices */
  int nodes;        /* duet plan --nodes K: K machines, each with the devices (0: not given) */
  double link_gbps; /* duet plan --link-gbps (0: DP_LINK_GBPS_DEFAULT) */
} ParOpts;

static int compile_model_opt(Compiled *c, const char *path, const FrontendOptions *fo, const ParOpts *po,
                             const char *dump_after, const char *stop_after);

static int compile_model_par(Compiled *c, const char *path, int64_t batch, const ParOpts *po, const char *dump_after,
                             const char *stop_after) {
  FrontendOptions fo = {.batch = batch, .micro_batches = po ? po->micro_batches : 0,
                        .replicas = po ? po->replicas : 0, .mpi_ranks = po && po->per_rank};
  return compile_model_opt(c, path, &fo, po, dump_after, stop_after);
}

/* The value of `--NAME V` or `--NAME=V` in argv (the last one), or NULL. */
static const char *scan_flag(int argc, char **argv, const char *name) {
  const char *v = NULL;
  size_t n = strlen(name);
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], name) && i + 1 < argc) v = argv[i + 1];
    else if (!strncmp(argv[i], name, n) && argv[i][n] == '=') v = argv[i] + n + 1;
  }
  return v;
}

/* A flag of a value that par_opts reads (the commands skip it and its value). */
static bool par_flag(const char *a) {
  return !strcmp(a, "--devices") || !strcmp(a, "--micro-batches") || !strcmp(a, "--schedule") ||
         !strcmp(a, "--threads") || !strcmp(a, "--data-parallel") || !strcmp(a, "--bucket-mb") || !strcmp(a, "--zero");
}

/* Fills po->dev from the device list `devices` (and --threads in argv):
 * the partition pass sees CPU devices with threads/S cores each and an
 * equal share of the host memory available (duet_host_memory:
 * MemAvailable, a cgroup limit, DUET_HOST_MEMORY), CUDA devices as 16 GiB sm_60 (P100, the
 * target; the CUDA plugin reports the real figures) shared equally by the
 * items that name the same GPU (cuda:0,cuda:0), planned capacities as
 * given.  Environment: DUET_CPU_GFLOPS (GFLOP/s per core, a number > 0, else
 * an error; default PART_CPU_GFLOPS_PER_CORE).  1 after a message. */
static int par_devices(ParOpts *po, const char *devices, int argc, char **argv) {
  DuetDeviceSpec spec[DUET_MAX_DEVICES];
  char err[256];
  if (duet_devices_parse(devices, spec, DUET_MAX_DEVICES, &po->n_dev, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return 1;
  }
  const char *th = scan_flag(argc, argv, "--threads");
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  long total = cores > 0 ? cores : 1;
  if (th) {
    int n;
    if (duet_parse_threads(th, &n)) return 1;
    total = n;
  }
  const char *gf = getenv("DUET_CPU_GFLOPS");
  double gflops = 0;
  if (gf) {
    char *end;
    gflops = strtod(gf, &end);
    if (end == gf || *end || !(gflops > 0) || !isfinite(gflops)) {
      fprintf(stderr, "duet: error: DUET_CPU_GFLOPS must be a number of GFLOP/s per core > 0, got '%s'\n", gf);
      return 1;
    }
  }
  int n_cpu = 0;
  for (int i = 0; i < po->n_dev; i++) n_cpu += spec[i].kind == DUET_DEV_CPU;
  int64_t host = 0; /* virtual CPU devices share it */
  if (n_cpu) {
    char from[1600];
    if (duet_host_memory(&host, from, sizeof from, err, sizeof err)) {
      fprintf(stderr, "duet: error: %s\n", err);
      return 1;
    }
    if (n_cpu > 1) snprintf(po->mem_from, sizeof po->mem_from, "%s, shared by %d CPU devices", from, n_cpu);
    else snprintf(po->mem_from, sizeof po->mem_from, "%s", from);
  }
  for (int i = 0; i < po->n_dev; i++) {
    PartDevice *d = &po->dev[i];
    d->name = strdup(spec[i].name);
    if (!d->name) {
      fprintf(stderr, "duet: error: out of memory\n");
      return 1;
    }
    d->cpu = spec[i].kind == DUET_DEV_CPU;
    d->planned = spec[i].kind == DUET_DEV_PLANNED;
    d->cores = (int)(total / po->n_dev > 0 ? total / po->n_dev : 1);
    d->cpu_gflops = gflops;
    d->sm = spec[i].kind == DUET_DEV_PLANNED ? spec[i].sm : 60;
    int same_gpu = 0; /* cuda:0,cuda:0: two stages on one GPU share its memory */
    for (int k = 0; k < po->n_dev; k++) same_gpu += spec[k].kind == DUET_DEV_CUDA && spec[k].index == spec[i].index;
    d->capacity = spec[i].kind == DUET_DEV_PLANNED ? spec[i].capacity
                  : spec[i].kind == DUET_DEV_CUDA  ? ((int64_t)16 << 30) / same_gpu
                                                   : host / n_cpu;
    d->capacity_from = spec[i].kind == DUET_DEV_CPU ? po->mem_from : NULL;
    int64_t gfree, gtotal;
    int gsm; /* not used for the rates or precision (unchanged: sm_60) */
    char gerr[300];
    if (spec[i].kind == DUET_DEV_CUDA && opt_device_bytes <= 0 &&
        !duet_cuda_meminfo(spec[i].index, &gfree, &gtotal, &gsm, gerr, sizeof gerr)) {
      /* the card's own free memory and capability (without a driver: the P100 assumption above) */
      d->capacity = gfree / same_gpu; /* (the rates stay sm_60's: the cost model's assumption, as before) */
      snprintf(po->gpu_from[i], sizeof po->gpu_from[i], "cuMemGetInfo: free memory of cuda:%d%s", spec[i].index,
               same_gpu > 1 ? ", shared by its stages" : "");
      d->capacity_from = po->gpu_from[i];
    }
    if (opt_device_bytes > 0) { /* --device-memory: every device's budget */
      d->capacity = opt_device_bytes;
      d->capacity_from = opt_device_from;
    }
  }
  return 0;
}

/* The devices of one replica: the first of the --data-parallel groups
 * (all of --devices without data parallelism). */
static int par_group(const ParOpts *po) {
  if (po->per_rank) return po->n_dev;
  int64_t per_node = po->replicas / (po->nodes > 1 ? po->nodes : 1); /* replicas on the devices listed */
  return per_node > 1 ? po->n_dev / (int)per_node : po->n_dev;
}

/* "cpu", or "cpu:0,cpu:1,...,cpu:R-1": the default devices of R replicas. */
static const char *default_cpus(int64_t R, char *buf, size_t n) {
  if (R <= 1) return "cpu";
  size_t len = 0;
  buf[0] = 0;
  for (int64_t r = 0; r < R && len < n; r++)
    len += (size_t)snprintf(buf + len, n - len, "%scpu:%" PRId64, r ? "," : "", r);
  return buf;
}

/* Fills po from --devices (see par_devices), --micro-batches, --schedule,
 * --data-parallel (the device list split into equal groups, one per
 * replica: duet_devices_groups), --bucket-mb and --threads in argv.
 * ranks > 1 (duet run under an MPI launcher): the replicas are the ranks
 * (--data-parallel, if given, must say so) and --devices names the devices
 * of each rank.  1 after a message. */
static int par_opts(ParOpts *po, int argc, char **argv, int ranks) {
  memset(po, 0, sizeof *po);
  po->devices = scan_flag(argc, argv, "--devices");
  const char *dp = scan_flag(argc, argv, "--data-parallel"), *bm = scan_flag(argc, argv, "--bucket-mb");
  if (dp && duet_parse_data_parallel(dp, &po->replicas)) return 1;
  if (bm && duet_parse_bucket_mb(bm, &po->bucket_mb)) return 1;
  const char *zr = scan_flag(argc, argv, "--zero");
  if (zr && duet_parse_zero(zr, &po->zero)) return 1;
  if (po->zero && po->replicas == 1 && ranks < 2) { /* not given: the model's (a dump's) replicas decide */
    fprintf(stderr, "duet: error: --zero 1 needs --data-parallel N with N >= 2 (it shards the optimizer state over the "
            "replicas)\n");
    return 1;
  }
  if (ranks > 1) {
    if (dp && po->replicas != ranks) {
      fprintf(stderr, "duet: error: --data-parallel %" PRId64 " under an MPI launcher of %d ranks: each rank is one "
              "replica (replicas inside a rank are not supported; drop --data-parallel, or start %" PRId64
              " ranks)\n", po->replicas, ranks, po->replicas);
      return 1;
    }
    if (ranks > DUET_MAX_DEVICES) {
      fprintf(stderr, "duet: error: %d MPI ranks: at most %d data-parallel replicas\n", ranks, DUET_MAX_DEVICES);
      return 1;
    }
    po->replicas = ranks;
    po->per_rank = true;
  }
  if (po->replicas > 1 && po->devices && !po->per_rank) {
    char err[512];
    int G;
    if (duet_devices_groups(po->devices, (int)po->replicas, &G, err, sizeof err)) {
      fprintf(stderr, "duet: error: %s\n", err);
      return 1;
    }
  }
  const char *sch = scan_flag(argc, argv, "--schedule");
  if (sch && strcmp(sch, "gpipe") && strcmp(sch, "1f1b")) {
    fprintf(stderr, "duet: error: --schedule expects gpipe or 1f1b, got '%s'\n", sch);
    return 1;
  }
  po->one_f_one_b = sch && !strcmp(sch, "1f1b");
  po->clip = scan_flag(argc, argv, "--clip-grad-norm") != NULL;
  const char *mb = scan_flag(argc, argv, "--micro-batches");
  if (mb) {
    char *end;
    long long m = strtoll(mb, &end, 10);
    if (*end || end == mb || m < 1 || m > 65536) {
      fprintf(stderr, "duet: error: --micro-batches expects an integer from 1 to 65536, got '%s'\n", mb);
      return 1;
    }
    po->micro_batches = m;
  }
  return po->devices ? par_devices(po, po->devices, argc, argv) : 0;
}

static void par_free(ParOpts *po) {
  for (int i = 0; i < po->n_dev; i++) free((void *)po->dev[i].name);
}

/* An IR dump rather than a .model: named *.ir, or `model NAME` first and a
 * line that starts with `%` (a value). */
static bool is_ir_source(const char *path, const Source *src) {
  size_t n = strlen(path);
  if (n > 3 && !strcmp(path + n - 3, ".ir")) return true;
  if (strncmp(src->text, "model ", 6)) return false;
  for (const char *p = src->text; *p; p++)
    if ((*p == '\n' || *p == '\r') && p[1] == '%') return true;
  return false;
}

/* The name on the `after NAME` line of an IR dump, for messages. */
static Loc ir_after_loc(const Source *src) {
  int line = 1;
  for (const char *p = src->text; *p; line++) {
    const char *q = p + strspn(p, " \t");
    if (!strncmp(q, "after", 5) && (q[5] == ' ' || q[5] == '\t'))
      return (Loc){src, line, (int)(q + 5 + strspn(q + 5, " \t") - p) + 1};
    p += strcspn(p, "\r\n");
    p += (*p == '\r' && p[1] == '\n') ? 2 : *p ? 1 : 0;
  }
  return (Loc){src, 0, 0};
}

/* Parses an IR dump; the passes then resume after the one it was printed
 * after (its `after` line). */
static Graph *compile_ir(Compiled *c, const Source *src, const FrontendOptions *fo, PassCtx *pc) {
  if (fo->decode) {
    diag_error(&c->diag, (Loc){src, 0, 0}, "an IR dump holds a training graph; generation needs the .model");
    return NULL;
  }
  Graph *g = ir_parse(c->arena, &c->diag, src);
  if (!g) return NULL;
  if (g->after_pass && passes_find(g->after_pass) < 0) {
    char list[256] = "";
    for (int p = 0; p < duet_n_passes; p++)
      snprintf(list + strlen(list), sizeof list - strlen(list), " %s", duet_passes[p].name);
    diag_error(&c->diag, ir_after_loc(src), "unknown pass `%s`; passes:%s", g->after_pass, list);
    return NULL;
  }
  int R = g->replicas > 1 ? g->replicas : 1;
  if (fo->replicas > 0 && fo->replicas != R) {
    diag_error(&c->diag, (Loc){src, 0, 0}, "the dump was built for %d data-parallel replica%s; --data-parallel %" PRId64
               " needs the .model (an IR dump's batch is split among its replicas)", R, R == 1 ? "" : "s", fo->replicas);
    return NULL;
  }
  if (fo->micro_batches > 1 && g->train.micro_batches != fo->micro_batches * R) {
    diag_error(&c->diag, (Loc){src, 0, 0}, "--micro-batches needs the .model (an IR dump's batch is fixed)");
    return NULL;
  }
  if (R > 1 && g->after_pass && passes_find(g->after_pass) >= passes_find("data_parallel")) {
    bool any = false; /* a hand-edited dump that lost its buckets would train replicas apart */
    for (int i = 0; i < g->n_values && !any; i++)
      any = g->values[i]->op == OP_ALLREDUCE || g->values[i]->op == OP_REDUCE_SCATTER;
    bool grads = false;
    for (int i = 0; i < g->n_values && !grads; i++) grads = g->values[i]->op == OP_ADAMW || g->values[i]->op == OP_SGD;
    if (grads && !any) {
      diag_error(&c->diag, ir_after_loc(src), "the dump of %d replicas was printed after `%s` but has no `allreduce` "
                 "buckets: its replicas would train apart", R, g->after_pass);
      return NULL;
    }
  }
  if (R > 1 && pc->bucket_mb > 0 && g->after_pass && passes_find(g->after_pass) >= passes_find("data_parallel")) {
    double have = g->bucket_mb > 0 ? g->bucket_mb : DP_BUCKET_MB_DEFAULT;
    if (pc->bucket_mb != have) {
      diag_error(&c->diag, ir_after_loc(src), "the dump was printed after `%s`, so its all-reduce buckets are fixed "
                 "(made for --bucket-mb %g); --bucket-mb %g needs the .model or a dump from before `data_parallel`",
                 g->after_pass, have, pc->bucket_mb);
      return NULL;
    }
  }
  if (fo->batch && fo->batch != g->train.batch) {
    diag_error(&c->diag, (Loc){src, 0, 0},
               "the graph was built for batch %" PRId64 "; --batch %" PRId64 " needs the .model (an IR dump's batch is fixed)",
               g->train.batch, fo->batch);
    return NULL;
  }
  if ((pc->precision || pc->target) && g->after_pass && passes_find(g->after_pass) >= passes_find("precision")) {
    /* the dump's dtypes are fixed: a request that resolves to them is fine */
    DType have = DT_F32;
    for (int i = 0; i < g->n_values; i++)
      if (g->values[i]->dtype == DT_F16 || g->values[i]->dtype == DT_BF16) have = g->values[i]->dtype;
    PrecisionChoice want;
    char err[256];
    if (precision_resolve(pc->target, pc->precision ? pc->precision : g->train.precision, &want, err, sizeof err) ||
        want.storage != have) {
      diag_error(&c->diag, ir_after_loc(src),
                 "the dump was printed after `%s`, so its dtypes are fixed (%s); --precision and --arch that ask for "
                 "others need the .model or a dump from before `precision`",
                 g->after_pass, have == DT_F16 ? "fp16" : have == DT_BF16 ? "bf16" : "fp32");
      return NULL;
    }
  }
  if (opt_optim_state && g->after_pass && passes_find(g->after_pass) >= passes_find("optimizer") &&
      g->train.optimizer == OPTIM_ADAMW && g->train.state_int8 != !strcmp(opt_optim_state, "int8")) {
    diag_error(&c->diag, ir_after_loc(src), "the dump was printed after `%s`, so its optimizer state is fixed (%s); "
               "--optimizer-state %s needs the .model or a dump from before `optimizer`", g->after_pass,
               g->train.state_int8 ? "int8" : "f32", opt_optim_state);
    return NULL;
  }
  if (opt_prune.set && g->after_pass && passes_find(g->after_pass) >= passes_find("prune")) {
    diag_error(&c->diag, ir_after_loc(src), "the dump was printed after `%s`, so its pruning is fixed; the --prune flags "
               "need the .model or a dump from before `prune`", g->after_pass);
    return NULL;
  }
  if (quantize_mode_parse(opt_quantize) > 0 && g->after_pass && passes_find(g->after_pass) >= passes_find("quantize")) {
    diag_error(&c->diag, ir_after_loc(src), "the dump was printed after `%s`, so its weights' dtypes are fixed; "
               "--quantize needs the .model or a dump from before `quantize`", g->after_pass);
    return NULL;
  }
  if (opt_shrink && g->after_pass && passes_find(g->after_pass) >= passes_find("shrink")) {
    diag_error(&c->diag, ir_after_loc(src), "the dump was printed after `%s`, so its shapes are fixed; --shrink needs "
               "the .model or a dump from before `shrink`", g->after_pass);
    return NULL;
  }
  if (opt_recompute && g->after_pass && passes_find(g->after_pass) >= passes_find("recompute")) {
    /* the dump's recomputation is fixed: a request it already follows is fine
     * (recomputed copies are backward values with a block) */
    bool blocks = false, copies = false;
    for (int i = 0; i < g->n_values; i++) {
      blocks |= g->values[i]->block > 0;
      copies |= g->values[i]->block > 0 && g->values[i]->role == ROLE_BACKWARD;
    }
    int mode = recompute_mode_parse(opt_recompute);
    if ((mode == RECOMPUTE_NONE && copies) || (mode == RECOMPUTE_BLOCKS && blocks && !copies)) {
      diag_error(&c->diag, ir_after_loc(src), "the dump was printed after `%s`, so its recomputation is fixed (%s); "
                 "--recompute %s needs the .model or a dump from before `recompute`", g->after_pass,
                 copies ? "recomputed blocks" : "none", opt_recompute);
      return NULL;
    }
  }
  pc->start_after = g->after_pass;
  return g;
}

/* compile_model_opt with the diagnostics written to diag_out. */
static int compile_model_to(Compiled *c, FILE *diag_out, const char *path, const FrontendOptions *fo,
                            const ParOpts *po, const char *dump_after, const char *stop_after) {
  memset(c, 0, sizeof *c);
  c->arena = arena_new(1 << 20);
  c->diag.out = diag_out;
  Source *src = frontend_read_file(c->arena, &c->diag, path);
  if (!src) return 1;
  PassCtx pc = {.diag = &c->diag, .verify = true, .dump_after = dump_after, .stop_after = stop_after,
                .precision = opt_precision, .target = opt_arch, .prune = &opt_prune, .recompute = opt_recompute,
                .optim_state = opt_optim_state, .quantize = opt_quantize, .calibrate = opt_calibrate_n,
                .shrink = opt_shrink, .eval_only = opt_eval_only,
                .devices = po && po->n_dev ? po->dev : NULL, .n_devices = po ? par_group(po) : 0,
                .one_f_one_b = po && po->one_f_one_b, .bucket_mb = po ? po->bucket_mb : 0,
                .clip = po && po->clip};
  c->g = is_ir_source(path, src) ? compile_ir(c, src, fo, &pc) : frontend_compile(c->arena, &c->diag, src, fo);
  if (!c->g) return 1;
  if (opt_offload) c->g->train.offload = opt_offload; /* --offload wins over the train section's */
  if (train_offload(&c->g->train) && (c->g->replicas > 1 || (po && po->replicas > 1))) {
    diag_error_noloc(&c->diag, "%s", duet_offload_refusal(2, 0, 0));
    return 1;
  }
  if (po && po->zero && !c->g->zero) { /* --zero 1 */
    if (c->g->replicas < 2) { /* a dump of one replica */
      diag_error_noloc(&c->diag, "--zero 1 needs --data-parallel N with N >= 2 (it shards the optimizer state over "
                       "the replicas)");
      return 1;
    }
    if (pc.start_after && passes_find(pc.start_after) >= passes_find("data_parallel")) {
      diag_error_noloc(&c->diag, "the dump was printed after `%s` without --zero 1: its buckets are all-reduces; "
                       "--zero 1 needs the .model or a dump from before `data_parallel`", pc.start_after);
      return 1;
    }
    c->g->zero = 1;
  }
  if (pc.start_after && c->g->replicas > 1 && po && po->n_dev && !po->replicas) {
    /* --devices for a dump of several replicas: split as the dump's --data-parallel */
    char err[512];
    int G;
    if (duet_devices_groups(po->devices, c->g->replicas, &G, err, sizeof err)) {
      diag_error_noloc(&c->diag, "%s", err);
      return 1;
    }
    pc.n_devices = G;
  }
  if (pc.start_after && passes_find(pc.start_after) >= passes_find("partition")) {
    int S = c->g->n_stages > 1 ? c->g->n_stages : 1, want = pc.n_devices > 0 ? pc.n_devices : S; /* no --devices: the dump's own */
    int R = c->g->replicas > 1 ? c->g->replicas : 1;
    int64_t m = c->g->train.micro_batches / R, want_m = fo->micro_batches > 0 ? fo->micro_batches : m;
    if (S != want || m != want_m) {
      diag_error_noloc(&c->diag, "the dump was partitioned for %d device%s and %" PRId64 " micro-batch%s; --devices "
                       "and --micro-batches must match (or use the .model)", S, S == 1 ? "" : "s", m, m == 1 ? "" : "es");
      return 1;
    }
  }
  /* --recompute auto without --devices: the default CPU device's memory
   * (duet run's and duet plan's device) is the budget */
  ParOpts budget = {0};
  const char *rq = opt_recompute ? opt_recompute : c->g->train.recompute;
  if (!pc.devices && rq && recompute_mode_parse(rq) == RECOMPUTE_AUTO) {
    if (par_devices(&budget, "cpu", 0, NULL)) return 1;
    pc.budget_device = &budget.dev[0];
  }
  int rc = passes_run(c->g, &pc);
  par_free(&budget);
  if (!rc && train_offload(&c->g->train) && c->g->prune.mode != PRUNE_NONE) {
    diag_error_noloc(&c->diag, "%s", duet_offload_refusal(1, 1, 0));
    rc = 1;
  }
  return rc;
}

static int compile_model_opt(Compiled *c, const char *path, const FrontendOptions *fo, const ParOpts *po,
                             const char *dump_after, const char *stop_after) {
  return compile_model_to(c, stderr, path, fo, po, dump_after, stop_after);
}

static void compiled_free(Compiled *c) { arena_free(c->arena); }

/* Scans argv for `--batch N` (compile-time) without consuming it. */
static int64_t scan_batch(int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    const char *v = NULL;
    if (!strcmp(argv[i], "--batch") && i + 1 < argc) v = argv[i + 1];
    else if (!strncmp(argv[i], "--batch=", 8)) v = argv[i] + 8;
    if (v) {
      char *end;
      long long b = strtoll(v, &end, 10);
      if (*end || b < 1) {
        fprintf(stderr, "duet: error: --batch expects an integer >= 1, got '%s'\n", v);
        exit(1);
      }
      return b;
    }
  }
  return 0;
}

static bool wants_help(int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
  return false;
}

/* Number of fp16 GEMMs in the training schedule. */
static int gemm_f16_steps(const DuetProgram *p) {
  int n = 0;
  for (int i = 0; i < p->n_train; i++) n += p->train[i].kind == DUET_STEP_GEMM && p->train[i].dtype == DUET_F16;
  return n;
}

/* 1 after the error when --gemm-accumulate fp16 is asked of a program with
 * no fp16 GEMM (n_f16: how many it has), else 0. */
static int check_gemm_acc(int n_f16) {
  if (!opt_gemm_acc || strcmp(opt_gemm_acc, "fp16") || n_f16 > 0) return 0;
  fprintf(stderr, "duet: error: --gemm-accumulate fp16 needs fp16 GEMMs (--precision fp16); this program has none\n");
  return 1;
}

/* Number of fp16 matmuls (GEMMs) in a graph. */
static int graph_f16_gemms(const Graph *g) {
  int n = 0;
  for (int i = 0; i < g->n_values; i++) n += g->values[i]->op == OP_MATMUL && g->values[i]->dtype == DT_F16;
  return n;
}

/* check_gemm_acc for commands that show a graph (duet ir, duet check),
 * which may have stopped before the precision pass gives matmuls their
 * dtype: then `model` is compiled again through that pass, its diagnostics
 * dropped (the caller's compilation showed them), and the check skipped
 * when that compilation fails (duet run would report why).  1 after the
 * error, else 0. */
static int check_gemm_acc_graph(const Compiled *c, const char *model, int64_t batch, const ParOpts *po) {
  if (!opt_gemm_acc || strcmp(opt_gemm_acc, "fp16")) return 0;
  if (c->g->after_pass && passes_find(c->g->after_pass) >= passes_find("precision"))
    return check_gemm_acc(graph_f16_gemms(c->g));
  FILE *null = fopen("/dev/null", "w");
  if (!null) return 0;
  Compiled p;
  FrontendOptions fo = {.batch = batch, .micro_batches = po ? po->micro_batches : 0,
                        .replicas = po ? po->replicas : 0};
  int rc = compile_model_to(&p, null, model, &fo, po, NULL, "precision");
  rc = rc ? 0 : check_gemm_acc(graph_f16_gemms(p.g));
  compiled_free(&p);
  fclose(null);
  return rc;
}

/* Sets --gemm-accumulate on the program and, when `cuda` (a GPU may run it:
 * --devices names one, or a compiled executable), attaches the CUDA C of the
 * kernels and their launch table.  1 after a message when --gemm-accumulate
 * fp16 has no fp16 GEMM to act on. */
static int with_cuda(CgProgram *cp, Arena *a, bool cuda) {
  cp->prog.gemm_accumulate_f16 = opt_gemm_acc && !strcmp(opt_gemm_acc, "fp16");
  if (check_gemm_acc(gemm_f16_steps(&cp->prog))) return 1;
  if (!cuda) return 0;
  codegen_attach_cuda(cp, a);
  return 0;
}

/* Lowers a compiled graph; `cuda`: attach the CUDA kernels too
 * (with_cuda).  NULL after printing the error. */
static CgProgram *lower_program(Compiled *c, bool cuda) {
  CgProgram *cp = codegen_lower(c->g, c->arena);
  return with_cuda(cp, c->arena, cuda) ? NULL : cp;
}

/* Loads the C kernels of cp (compiled now or taken from the cache) into m.
 * 1 after printing the error. */
static int load_kernels(Compiled *c, CgProgram *cp, JitModule *m, bool show) {
  char err[8192], what[128];
  const char *src = codegen_emit_c(cp, c->arena);
  cp->prog.source_hash = duet_fnv1a(src, strlen(src), DUET_FNV_OFFSET); /* the ranks of an MPI run compare it */
  snprintf(what, sizeof what, "compiling %d kernels with %s", cp->n_kernels, jit_cc());
  if (jit_load_shown(src, m, show ? what : NULL, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
    return 1;
  }
  if (m->n != cp->n_kernels) {
    fprintf(stderr, "duet: error: compiled module has %d kernels, expected %d\n", m->n, cp->n_kernels);
    jit_unload(m);
    return 1;
  }
  return 0;
}

/* lower_program, then load_kernels.  NULL after printing the error. */
static CgProgram *jit_program(Compiled *c, JitModule *m, bool cuda) {
  CgProgram *cp = lower_program(c, cuda);
  return cp && !load_kernels(c, cp, m, false) ? cp : NULL;
}

/* After a compilation for po's devices failed: when the same model
 * compiles with their memory unlimited (so the partition pass found no
 * split within the memory), prints that plan's table against the real
 * capacities to out (DOES NOT FIT, by how many bytes, what would help). */
static void explain_no_split(const char *model, int64_t batch, ParOpts *po, FILE *out, bool json) {
  if (!po->n_dev) return;
  FILE *null = fopen("/dev/null", "w");
  if (!null) return;
  int64_t cap[DUET_MAX_DEVICES];
  bool any = false;
  for (int i = 0; i < po->n_dev; i++) any |= (cap[i] = po->dev[i].capacity) > 0, po->dev[i].capacity = 0;
  FrontendOptions fo = {.batch = batch, .micro_batches = po->micro_batches, .replicas = po->replicas,
                        .mpi_ranks = po->per_rank};
  Compiled c;
  int rc = !any || compile_model_to(&c, null, model, &fo, po, NULL, NULL);
  for (int i = 0; i < po->n_dev; i++) po->dev[i].capacity = cap[i];
  if (!rc) {
    Diag quiet = {.out = null};
    PassCtx pc = {.diag = &quiet, .devices = po->dev, .n_devices = par_group(po), .one_f_one_b = po->one_f_one_b,
                  .bucket_mb = po->bucket_mb};
    PlanTable *t = json ? malloc(sizeof *t) : NULL;
    if (t) { /* --format json: that table, "fits": false */
      partition_plan(c.g, &pc, t);
      plan_print_json(t, NULL, NULL, out);
    } else if (!json) {
      fprintf(out, "the plan with the fastest split, memory aside:\n");
      partition_report(c.g, &pc, out);
    }
    free(t);
  }
  if (any) compiled_free(&c);
  fclose(null);
}

/* duet run's memory check before anything runs: each device's plan (duet
 * plan's table: weights, accumulated grads, optimizer state, activations
 * in flight) must fit its capacity (--device-memory, else the CPU's share
 * of the host memory, a GPU's 16 GiB).  When one does not, the table goes
 * to stderr, then an error per device that does not fit (by how many
 * bytes, and the settings that would help).  1 after the messages. */
static int run_memory_check(Compiled *c, const ParOpts *po, int argc, char **argv) {
  ParOpts cpu = {0};
  char cpus[1024];
  if (!po->n_dev && par_devices(&cpu, default_cpus(po->replicas, cpus, sizeof cpus), argc, argv)) {
    par_free(&cpu);
    return 1;
  }
  const ParOpts *rp = po->n_dev ? po : &cpu;
  PassCtx pc = {.diag = &c->diag, .devices = rp->dev, .n_devices = po->n_dev ? par_group(po) : 1,
                .one_f_one_b = po->one_f_one_b, .bucket_mb = po->bucket_mb};
  PlanTable *t = malloc(sizeof *t);
  int rc = 0;
  if (!t) {
    fprintf(stderr, "duet: error: out of memory\n");
    rc = 1;
  } else {
    partition_plan(c->g, &pc, t);
    if (!t->fits) {
      FILE *null = fopen("/dev/null", "w");
      Diag quiet = {.out = null ? null : stderr};
      PassCtx qc = pc;
      qc.diag = &quiet;
      partition_report(c->g, &qc, stderr); /* the table; its summary error is the lines below */
      if (null) fclose(null);
      rc = partition_check_memory(c->g, &pc);
    }
  }
  free(t);
  par_free(&cpu);
  return rc;
}

static int cmd_run(int argc, char **argv) {
  if (argc < 1 || wants_help(argc, argv)) {
    duet_usage("duet run M.model", stdout);
    printf("  --precision P      auto|fp32|fp16|bf16: 16-bit activations and weight copies, f32 master\n"
           "                     weights and optimizer state (fp16 with dynamic loss scaling); auto is\n"
           "                     fp32 on the CPU\n");
    printf("  --gemm-accumulate A fp32|fp16: fp16 GEMMs accumulate in fp32 (default) or, opt-in, in fp16\n"
           "                     (cuBLAS CUBLAS_COMPUTE_16F, about 2x on sm_60; CUDA devices only)\n"
           "  --recompute R      none (default)|blocks|auto: activation recomputation; blocks keeps only\n"
           "                     the inputs of each block call (`repeat` iteration) and recomputes the\n"
           "                     rest in the backward pass (same losses and gradients, bit for bit);\n"
           "                     auto recomputes blocks only until each device fits its memory\n");
    printf("  --device-memory SIZE each device's memory: 16GiB or 16G (2^30 bytes), 16GB (10^9), 500MiB,\n"
           "                     bytes; a configuration whose plan does not fit is refused before\n"
           "                     compiling, with duet plan's table (default: the available memory)\n");
    printf("  --optimizer-state S int8|f32: AdamW's two moments as 8-bit codes with an f32 scale per block\n"
           "                     of 2048 values (Dettmers et al. 2021: 2 bytes per param instead of 8)\n"
           "                     or f32; overrides the model's adamw(state = ...)\n");
    printf("  --quantize Q       int8|int8-tensor|none: evaluate with int8 weights (matmul and convolution\n"
           "                     weights, a scale per output channel, or per tensor, dequantized before\n"
           "                     each GEMM); only with --eval-only --checkpoint CK\n");
    printf("  --calibrate N      with --quantize: int8 activations too (matmuls, not convolutions): each\n"
           "                     matmul input gets a scale max|x| / 127 taken over the first N batches\n"
           "                     of the training split (never the test set), then runs as an int8 x\n"
           "                     int8 -> int32 GEMM (duet's own kernel); the scales are printed\n");
    prune_help(stdout);
    printf("\nCompiles the model's kernels (cached in DUET_CACHE_DIR) and trains it.\n");
    return argc < 1 ? 1 : 0;
  }
  if (argv[0][0] == '-') {
    fprintf(stderr, "duet: error: the model comes first: duet run M.model [flags] (got '%s')\n", argv[0]);
    return 1;
  }
  /* reject bad flags before compiling anything */
  int64_t batch = scan_batch(argc - 1, argv + 1);
  DuetConfig probe = {0};
  if (duet_parse_flags(&probe, batch, argc - 1, argv + 1)) return 1;
  ParOpts po;
  int rank = 0;
  char var[400];
  int ranks = duet_launch_ranks(&rank, var, sizeof var);
  if (ranks < 0) {
    fprintf(stderr, "duet: error: %s\n", var);
    return 1;
  }
  if (rank > 0) probe.quiet = 1; /* rank 0 alone prints progress */
  if (par_opts(&po, argc - 1, argv + 1, ranks)) return 1;
  opt_eval_only = probe.eval_only; /* an evaluation program (passes/evalonly.c) */
  Compiled c;
  int rc = compile_model_par(&c, argv[0], batch, &po, NULL, NULL);
  if (rc) explain_no_split(argv[0], batch, &po, stderr, false);
  /* one CPU device (the default, or --devices cpu; per replica), whose
   * memory the partition pass checks only when it splits the model: the
   * memory duet plan counts must be available, or the kernel kills the run
   * mid-way */
  if (!rc) rc = run_memory_check(&c, &po, argc - 1, argv + 1);
  /* --offload optimizer with a GPU stage: the host row must fit the host's
   * memory (a CPU stage's check above counts it) */
  if (!rc && train_offload(&c.g->train) && probe.devices && strstr(probe.devices, "cuda")) {
    PassCtx pc = {.diag = &c.diag};
    int64_t need = partition_offload_host_bytes(c.g, &pc), avail;
    char from[256], e[512];
    if (duet_host_memory(&avail, from, sizeof from, e, sizeof e)) {
      fprintf(stderr, "duet: error: %s\n", e);
      rc = 1;
    } else if (need > avail) {
      fprintf(stderr, "duet: error: --offload optimizer needs %.2f MiB of host memory (f32 master weights, optimizer "
              "state and gradient copies; duet plan shows the host row) and %.2f MiB are available (%s)\n",
              need / 1048576.0, avail / 1048576.0, from);
      rc = 1;
    }
  }
  double bucket_mb = c.g ? c.g->bucket_mb : po.bucket_mb; /* a dump's own (its buckets are fixed) */
  par_free(&po);
  if (rc) {
    compiled_free(&c);
    return 1;
  }
  /* --clip-grad-norm: the clipping kernels are generated (lower_clip) */
  if (probe.clip_grad_norm > 0) c.g->train.clip_grad_norm = probe.clip_grad_norm;
  /* the GPU runs the CUDA C; the C kernels are needed only for CPU devices */
  bool all_cuda = duet_devices_all_cuda(probe.devices);
  CgProgram *cp = lower_program(&c, all_cuda || (probe.devices && strstr(probe.devices, "cuda")));
  if (cp) cp->prog.bucket_mb = bucket_mb;
  if (train_offload(&c.g->train)) all_cuda = false; /* --offload optimizer: the host runs the C kernels */
  JitModule m;
  memset(&m, 0, sizeof m);
  /* duet_main's checks of data files, devices and --save before seconds of compiling */
  if (!cp || duet_preflight(&cp->prog, argv[0], argc - 1, argv + 1) || (!all_cuda && load_kernels(&c, cp, &m, !probe.quiet))) {
    compiled_free(&c);
    return 1;
  }
  if (!probe.quiet && m.fns) {
    if (m.cache_hit) printf("duet: kernels: %d (%d functions), loaded from cache\n", m.n, m.n_functions);
    else printf("duet: kernels: %d (%d functions), compiled in %.2f s\n", m.n, m.n_functions, m.compile_seconds);
    fflush(stdout);
  }
  rc = duet_main(&cp->prog, m.fns, "duet run M.model", argc - 1, argv + 1);
  jit_unload(&m);
  compiled_free(&c);
  return rc;
}

/* The error for argv[i], which `duet CMD` did not take: a flag of a value
 * given last, without its value, or an argument it does not know. */
static int bad_argument(const char *cmd, int argc, char **argv, int i) {
  static const char *const with_value[] = {"-o", "--target", "--batch", "--devices", "--micro-batches", "--schedule",
                                           "--threads", "--precision", "--arch", "--after", "--format", "--checkpoint",
                                           "--prompt", "--tokens", "--temperature", "--top-k", "--seed",
                                           "--gemm-accumulate", "--start-after", "--data-parallel", "--bucket-mb",
                                           "--zero", "--clip-grad-norm",
                                           "--optimizer-state"};
  for (size_t k = 0; k < sizeof with_value / sizeof *with_value && i + 1 == argc; k++)
    if (!strcmp(argv[i], with_value[k])) {
      fprintf(stderr, "duet: error: %s needs a value (see duet %s --help)\n", argv[i], cmd);
      return 1;
    }
  fprintf(stderr, "duet: error: unexpected argument '%s' (see duet %s --help)\n", argv[i], cmd);
  return 1;
}

/* duet compile --checkpoint CK writes an evaluation executable: the flags
 * that configure only training are refused (the first given, named).  1
 * after the error. */
static int checkpoint_train_flags(int argc, char **argv) {
  if (opt_shrink) { /* the loader gathers from full-size weights; embedded ones would be shrunk already */
    fprintf(stderr, "duet: error: duet compile --checkpoint does not embed shrunk weights yet: compile with --shrink "
                    "alone and run EXE --eval-only --checkpoint CK\n");
    return 1;
  }
  const char *given = opt_prune.set ? "the --prune flags" : opt_offload ? "--offload" : opt_recompute ? "--recompute"
                    : opt_optim_state ? "--optimizer-state" : scan_flag(argc, argv, "--zero") ? "--zero"
                    : scan_flag(argc, argv, "--clip-grad-norm") ? "--clip-grad-norm" : NULL;
  if (!given) return 0;
  fprintf(stderr, "duet: error: %s %s training, and duet compile --checkpoint writes an evaluation executable (it "
                  "evaluates the checkpoint's weights and trains nothing): leave out %s, or --checkpoint to compile "
                  "a training executable\n", given, opt_prune.set ? "configure" : "configures", given);
  return 1;
}

/* The prefix of duet compile's temporary files for the executable `out`:
 * "DIR/.duet-" with DIR out's directory ("." for a bare name), so that the
 * temporaries sit on out's file system (the final rename is atomic), their
 * names stay short whatever out's length (a 250-character name plus a
 * suffix would pass NAME_MAX), and never begin with '-' (the C compiler
 * would read "-o -"'s temporaries as options).  Into buf (n bytes). */
static const char *tmp_prefix(const char *out, char *buf, size_t n) {
  const char *slash = strrchr(out, '/');
  if (!slash) snprintf(buf, n, "./.duet-");
  else snprintf(buf, n, "%.*s/.duet-", (int)(slash - out), out);
  return buf;
}

/* duet compile --checkpoint CK: the params of CK as program cp loads them
 * (int8 weights quantized now for a --quantize program) written next to
 * `out` (OUT.duet-XXXXXX.st) for the executable to embed; the file's path
 * into path (unlink it after linking), cp->weights_file and
 * cp->prog.weights_nbytes set.  1 after the error (no file left). */
static int embed_weights(CgProgram *cp, Arena *a, const char *ck, const char *out, char *path, size_t n) {
  char err[1024], pre[1100];
  snprintf(path, n, "%sXXXXXX.st", tmp_prefix(out, pre, sizeof pre));
  int fd = mkstemps(path, 3);
  if (fd < 0) {
    fprintf(stderr, "duet: error: cannot write %s: %s\n", out, strerror(errno));
    path[0] = 0;
    return 1;
  }
  close(fd);
  struct stat st;
  if (duet_checkpoint_embed(&cp->prog, ck, path, err, sizeof err) || stat(path, &st)) {
    fprintf(stderr, "duet: error: %s\n", err);
    unlink(path);
    path[0] = 0;
    return 1;
  }
  cp->prog.weights_nbytes = (int64_t)st.st_size;
  cp->weights_file = arena_printf(a, "%s", path);
  return 0;
}

static int cmd_compile(int argc, char **argv) {
  const char *model = NULL, *out = NULL, *ck = NULL;
  int64_t batch = 0;
  double clip = 0; /* --clip-grad-norm: 0, the train section's */
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: duet compile M.model -o EXE [--batch N] [--devices SPEC] [--micro-batches M]\n"
             "                    [--data-parallel N] [--bucket-mb X] [--zero 0|1] [--clip-grad-norm X]\n"
             "                    [--quantize int8|int8-tensor] [--calibrate N] [--checkpoint CK]\n"
             "Writes a standalone training executable (generated C compiled and linked\n"
             "against the duet runtime).  EXE takes the run-time flags of `duet run`\n"
             "(--steps, --lr, --lr-schedule, --warmup, --min-lr, --seed, --data, --save, ...);\n"
             "the compile-time ones (--precision, --gemm-accumulate, --batch, --micro-batches,\n"
             "--data-parallel, --bucket-mb, the --prune flags) only with their compiled value,\n"
             "any other is answered \"fixed at compile time: VALUE\" (EXE --help lists them).\n"
             "--clip-grad-norm X compiles the gradient clipping kernels (X: the default limit,\n"
             "EXE --clip-grad-norm changes it).  Also: --schedule gpipe|1f1b, --threads N (for\n"
             "the partition's cost model), --precision auto|fp32|fp16|bf16, the --prune flags,\n"
             "--recompute none|blocks|auto, --offload none|optimizer (the executable's default; its\n"
             "--offload none turns it off), --quantize int8|int8-tensor (an evaluation executable\n"
             "with int8 weights: EXE --eval-only --checkpoint CK), --calibrate N with --quantize (int8\n"
             "activations too, calibrated on N training batches of Fashion-MNIST images when EXE runs).\n"
             "--checkpoint CK embeds CK's weights in EXE (int8 with --quantize, quantized now; f32\n"
             "without): EXE is an evaluation executable that evaluates them when run (`./EXE`;\n"
             "--checkpoint CK2 evaluates CK2 instead), trains nothing, and refuses the flags that\n"
             "configure only training (--clip-grad-norm, --prune..., --zero, --offload, --recompute,\n"
             "--optimizer-state).  Its size shows the weights' bytes; they stay after `strip`.\n"
             "Pruning: --prune S, --prune-mode M, --prune-start N, --prune-end N, --prune-every N,\n"
             "--prune-initial S, --prune-params P, --shrink (as duet run --help describes them).\n");
      return 0;
    } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
      out = argv[++i];
    } else if (!strcmp(argv[i], "--checkpoint") && i + 1 < argc) {
      ck = argv[++i];
    } else if (par_flag(argv[i]) && i + 1 < argc) {
      i++; /* read by par_opts */
    } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
      batch = scan_batch(2, argv + i);
      i++;
    } else if (!strcmp(argv[i], "--clip-grad-norm") && i + 1 < argc) {
      DuetConfig probe = {0}; /* checked as duet run checks it */
      if (duet_parse_flags(&probe, 0, 2, argv + i)) return 1;
      clip = probe.clip_grad_norm;
      i++;
    } else if (argv[i][0] != '-' && !model) {
      model = argv[i];
    } else {
      return bad_argument("compile", argc, argv, i);
    }
  }
  if (!model || !out) {
    fprintf(stderr, "duet: error: %s (usage: duet compile M.model -o EXE)\n",
            !model ? "no model file given" : "no -o EXE given (the executable to write)");
    return 1;
  }
  const char *th = scan_flag(argc, argv, "--threads");
  int th_v;
  if (th && duet_parse_threads(th, &th_v)) return 1; /* checked with or without --devices */
  struct stat out_st;
  if (!stat(out, &out_st) && S_ISDIR(out_st.st_mode)) {
    fprintf(stderr, "duet: error: -o %s is a directory; give the path of the executable to write\n", out);
    return 1;
  }
  const char *out_kind = duet_st_target_kind(out); /* a device, FIFO, link: the rename would replace it */
  if (out_kind) {
    fprintf(stderr, "duet: error: cannot write -o %s: it exists and is %s, not a regular file; not replacing it\n",
            out, out_kind);
    return 1;
  }
  struct stat sm, so;
  if (!stat(out, &so) && ((!stat(model, &sm) && sm.st_dev == so.st_dev && sm.st_ino == so.st_ino) ||
                          (ck && !stat(ck, &sm) && sm.st_dev == so.st_dev && sm.st_ino == so.st_ino))) {
    fprintf(stderr, "duet: error: -o %s names the input file; choose another output path\n", out);
    return 1;
  }
  if (ck && checkpoint_train_flags(argc, argv)) return 1;
  char dir[1024], lib[1200], inc[1200];
  if (jit_self_dir(dir, sizeof dir)) {
    fprintf(stderr, "duet: error: cannot locate the duet executable's directory\n");
    return 1;
  }
  snprintf(lib, sizeof lib, "%s/libduet_runtime.a", dir);
  snprintf(inc, sizeof inc, "%s/include", dir);
  if (access(lib, R_OK)) {
    snprintf(lib, sizeof lib, "%s/../lib/duet/libduet_runtime.a", dir);
    snprintf(inc, sizeof inc, "%s/../include/duet", dir);
  }
  if (access(lib, R_OK)) {
    fprintf(stderr, "duet: error: cannot find libduet_runtime.a next to %s or in ../lib/duet\n", dir);
    return 1;
  }
  ParOpts po;
  if (par_opts(&po, argc, argv, 1)) return 1;
  for (int i = 0; i < po.n_dev; i++)
    if (po.dev[i].planned) {
      fprintf(stderr, "duet: error: device %s is a capacity for `duet plan`, not a device to run on (use cpu:N or "
                      "cuda:N)\n", po.dev[i].name);
      par_free(&po);
      return 1;
    }
  Compiled c;
  opt_eval_only = ck != NULL; /* embedded weights: an evaluation executable, an evaluation program */
  int crc = compile_model_par(&c, model, batch, &po, NULL, NULL);
  if (crc) {
    par_free(&po);
    compiled_free(&c);
    return 1;
  }
  if (clip > 0) c.g->train.clip_grad_norm = clip; /* the clipping kernels, and the default limit */
  CgProgram *cp = codegen_lower(c.g, c.arena);
  /* the executable runs on the devices it was compiled for unless given --devices */
  if (po.devices) cp->prog.defaults.devices = arena_printf(c.arena, "%s", po.devices);
  cp->prog.bucket_mb = c.g->bucket_mb; /* the pass's, or a dump's own (its buckets are fixed) */
  par_free(&po);
  if (with_cuda(cp, c.arena, true)) {
    compiled_free(&c);
    return 1;
  }
  char *src = codegen_emit_c(cp, c.arena);
  cp->prog.source_hash = duet_fnv1a(src, strlen(src), DUET_FNV_OFFSET);
  /* the temporaries next to the executable: the weights (--checkpoint),
   * the C source, the executable itself (renamed to `out` once linked) */
  char wpath[1300] = "", cpath[1300], epath[1300];
  if (ck && embed_weights(cp, c.arena, ck, out, wpath, sizeof wpath)) {
    compiled_free(&c);
    return 1;
  }
  char pre[1100];
  tmp_prefix(out, pre, sizeof pre);
  snprintf(cpath, sizeof cpath, "%sXXXXXX.c", pre);
  int fd = mkstemps(cpath, 2);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) { /* the executable's directory: missing or not writable */
    fprintf(stderr, "duet: error: cannot write %s: %s\n", out, strerror(errno));
    if (fd >= 0) close(fd), unlink(cpath);
    if (wpath[0]) unlink(wpath);
    compiled_free(&c);
    return 1;
  }
  codegen_write_executable_c(cp, src, f);
  snprintf(epath, sizeof epath, "%sXXXXXX", pre);
  int efd = mkstemp(epath); /* a fresh name; the linker creates the file (mode from the umask) */
  if (efd >= 0) close(efd), unlink(epath);
  if (fclose(f) || efd < 0) {
    fprintf(stderr, "duet: error: writing %s failed\n", efd < 0 ? out : cpath);
    unlink(cpath);
    if (wpath[0]) unlink(wpath);
    compiled_free(&c);
    return 1;
  }
  char *av[24];
  int a = 0;
  const char *flags[] = {DUET_KERNEL_CFLAGS};
  av[a++] = (char *)jit_cc();
  for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) av[a++] = (char *)flags[i];
  char incflag[1300];
  snprintf(incflag, sizeof incflag, "-I%s", inc);
  av[a++] = incflag;
  av[a++] = "-o";
  av[a++] = epath;
  av[a++] = cpath;
  av[a++] = lib;
  av[a++] = DUET_OPENBLAS_LIB;
  av[a++] = DUET_CJSON_LIB;
  av[a++] = "-lz";
  av[a++] = "-ldl";
  av[a++] = "-lm";
#ifdef DUET_LINK_SANITIZE
  av[a++] = DUET_LINK_SANITIZE;
#endif
  av[a] = NULL;
  char log[8192], what[160];
  snprintf(what, sizeof what, "compiling %d kernels and the training executable with %s", cp->n_kernels, jit_cc());
  int st = jit_run_shown(av, log, sizeof log, what);
  unlink(cpath);
  if (wpath[0]) unlink(wpath);
  int64_t wbytes = cp->prog.weights_nbytes;
  compiled_free(&c);
  if (st != 0) {
    unlink(epath);
    fprintf(stderr, "duet: error: linking the %s executable failed (%s exited with %d):\n%s",
            ck ? "evaluation" : "training", jit_cc(), st, log);
    return 1;
  }
  if (rename(epath, out)) { /* atomic: `out` is the old file or the whole new one */
    fprintf(stderr, "duet: error: cannot write %s: %s\n", out, strerror(errno));
    unlink(epath);
    return 1;
  }
  if (ck) printf("duet: wrote %s (an evaluation executable with the weights of %s embedded: %" PRId64 " bytes)\n",
                 out, ck, wbytes);
  else printf("duet: wrote %s\n", out);
  return 0;
}

static int cmd_ir(int argc, char **argv) {
  const char *model = NULL, *after = NULL, *format = "text";
  int64_t batch = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: duet ir M.model [--after PASS] [--format text|dot|json] [--devices SPEC] [--micro-batches M] [--batch N]\n"
             "               [--data-parallel N] [--bucket-mb X] [--zero 0|1]\n"
             "Prints the IR after PASS (default: shape; for a G.ir dump, the pass it was printed after).\n"
             "Formats: text (the default; `duet run G.ir` and `duet ir G.ir` read it back), dot (Graphviz:\n"
             "`duet ir M.model --format dot | dot -Tsvg > g.svg`), json.  Also: --schedule gpipe|1f1b,\n"
             "--precision auto|fp32|fp16|bf16, --arch cpu|sm_60|...|sm_90 (the device precision assumes),\n"
             "--recompute none|blocks|auto (activation recomputation: `duet ir M.model --after recompute`),\n"
             "--quantize int8|int8-tensor (int8 weights: `duet ir M.model --after quantize --quantize int8`),\n"
             "--calibrate N with --quantize (int8 activations: matmul_i8 and the NAME.act_scale params).\n"
             "--eval-only: the evaluation program of duet run --eval-only (no backward graph, no optimizer\n"
             "state: `duet ir M.model --after evalonly --eval-only`).\n"
             "Pruning: --prune S, --prune-mode M, --prune-start N, --prune-end N, --prune-every N,\n"
             "--prune-initial S, --prune-params P, --shrink (as duet run --help describes them).\n"
             "Passes, in order:\n");
      for (int p = 0; p < duet_n_passes; p++) printf("  %-13s %s\n", duet_passes[p].name, duet_passes[p].what);
      return 0;
    } else if (!strcmp(argv[i], "--after") && i + 1 < argc) {
      after = argv[++i];
    } else if (!strncmp(argv[i], "--after=", 8)) {
      after = argv[i] + 8;
    } else if (!strcmp(argv[i], "--eval-only")) {
      opt_eval_only = true; /* passes/evalonly.c */
    } else if (par_flag(argv[i]) && i + 1 < argc) {
      i++; /* read by par_opts */
    } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
      batch = scan_batch(2, argv + i);
      i++;
    } else if (!strcmp(argv[i], "--format") && i + 1 < argc) {
      format = argv[++i];
    } else if (!strncmp(argv[i], "--format=", 9)) {
      format = argv[i] + 9;
    } else if (argv[i][0] != '-' && !model) {
      model = argv[i];
    } else {
      return bad_argument("ir", argc, argv, i);
    }
  }
  if (!model) {
    fprintf(stderr, "duet: error: usage: duet ir M.model [--after PASS] [--format text|dot|json]\n");
    return 1;
  }
  if (after && passes_find(after) < 0) {
    fprintf(stderr, "duet: error: unknown pass '%s'; passes:", after);
    for (int p = 0; p < duet_n_passes; p++) fprintf(stderr, " %s", duet_passes[p].name);
    fprintf(stderr, "\n");
    return 1;
  }
  if (strcmp(format, "text") && strcmp(format, "dot") && strcmp(format, "json")) {
    fprintf(stderr, "duet: error: unknown format '%s' (text, dot or json)\n", format);
    return 1;
  }
  /* a dump printed after a later pass than `shape` stays as it is by default */
  ParOpts po;
  if (par_opts(&po, argc, argv, 1)) return 1;
  Compiled c;
  int rc = compile_model_par(&c, model, batch, &po, NULL, after ? after : "shape");
  if (!rc && after && (!c.g->after_pass || strcmp(c.g->after_pass, after))) {
    fprintf(stderr, "duet: error: %s was printed after %s; it cannot be shown after the earlier pass %s\n", model,
            c.g->after_pass ? c.g->after_pass : "no pass", after);
    rc = 1;
  }
  if (!rc && check_gemm_acc_graph(&c, model, batch, &po)) rc = 1;
  if (!rc && opt_shrink && !shrink_check(c.g, &opt_prune)) rc = 1; /* printed before `shrink`: checked all the same */
  par_free(&po);
  if (!rc && !strcmp(format, "text")) ir_print(c.g, stdout);
  if (!rc && !strcmp(format, "dot")) ir_print_dot(c.g, stdout);
  if (!rc && !strcmp(format, "json") && ir_print_json(c.g, stdout)) {
    fprintf(stderr, "duet: error: out of memory while writing JSON\n");
    rc = 1;
  }
  if (!rc && (fflush(stdout) || ferror(stdout))) {
    fprintf(stderr, "duet: error: writing the IR failed: %s\n", strerror(errno));
    rc = 1;
  }
  compiled_free(&c);
  return rc;
}

/* duet plan --nodes K: every layout of the K machines' devices (each a
 * pipeline of D/N stages x N replicas per machine, for each N dividing
 * the D devices of --devices), compiled and estimated without a report,
 * then which is fastest.  0, or 1 after an error. */
static int plan_layouts(const char *model, int64_t batch, const ParOpts *given, int argc, char **argv) {
  /* without --devices, --data-parallel N plans N CPU devices per machine
   * (the default devices of duet run --data-parallel N), as the report
   * above did */
  ParOpts own = {0}, base = *given;
  const ParOpts *po = &base;
  char own_cpus[1024];
  if (!given->n_dev && given->replicas > 1) {
    int64_t per = given->replicas / (given->nodes > 1 ? given->nodes : 1);
    if (per > 1) {
      if (par_devices(&own, default_cpus(per, own_cpus, sizeof own_cpus), argc, argv)) {
        par_free(&own);
        return 1;
      }
      memcpy(base.dev, own.dev, sizeof base.dev); /* the names stay own's (freed with it) */
      base.n_dev = own.n_dev;
      base.devices = own_cpus;
    }
  }
  int D = po->n_dev > 0 ? po->n_dev : 1, K = po->nodes;
  double gbps = po->link_gbps > 0 ? po->link_gbps : DP_LINK_GBPS_DEFAULT;
  FILE *null = fopen("/dev/null", "w");
  if (!null) {
    fprintf(stderr, "duet: error: cannot open /dev/null: %s\n", strerror(errno));
    par_free(&own);
    return 1;
  }
  int compiled = 0;
  if (K > 1)
    printf("layouts of %d machines x %d device%s (%s), linked at %.4g Gb/s per machine, estimated:\n", K, D,
           D == 1 ? "" : "s", po->devices ? po->devices : "cpu", gbps);
  else
    printf("layouts of one machine's %d device%s (%s), estimated:\n", D, D == 1 ? "" : "s",
           po->devices ? po->devices : "cpu");
  double best = 0, pipe = 0, dp = 0;
  int best_n = 0;
  for (int N = 1; N <= D; N++) {
    if (D % N) continue;
    ParOpts lp = *po;
    lp.replicas = (int64_t)K * N;
    Compiled c;
    FrontendOptions fo = {.batch = batch, .micro_batches = lp.micro_batches, .replicas = lp.replicas};
    int S = D / N;
    if (S == 1) printf("  data parallel on every device, %d replica%s per machine", N, N == 1 ? "" : "s");
    else if (N == 1) printf("  a %d-stage pipeline per machine", S);
    else printf("  %d replicas of a %d-stage pipeline per machine", N, S);
    printf(", %" PRId64 " replica%s in all: ", lp.replicas, lp.replicas == 1 ? "" : "s");
    char *why = NULL;
    size_t why_len = 0;
    FILE *diag = open_memstream(&why, &why_len);
    int bad = compile_model_to(&c, diag ? diag : null, model, &fo, &lp, NULL, NULL);
    if (diag) fclose(diag);
    if (bad) { /* the first line of the first diagnostic says why */
      const char *e = why ? strstr(why, "error: ") : NULL;
      printf("not possible: %.*s\n", e ? (int)strcspn(e + 7, "\n") : 14, e ? e + 7 : "does not build");
      free(why);
      compiled_free(&c);
      continue;
    }
    free(why);
    compiled++;
    ParOpts cpu = {0};
    char cpus[1024];
    if (!lp.n_dev && par_devices(&cpu, default_cpus(N, cpus, sizeof cpus), argc, argv)) {
      compiled_free(&c);
      par_free(&cpu);
      par_free(&own);
      fclose(null);
      return 1;
    }
    PlanSummary sum = {0};
    PassCtx pc = {.diag = &c.diag, .devices = lp.n_dev ? lp.dev : cpu.dev, .n_devices = lp.n_dev ? par_group(&lp) : 1,
                  .one_f_one_b = lp.one_f_one_b, .bucket_mb = lp.bucket_mb, .nodes = K, .link_gbps = lp.link_gbps,
                  .summary = &sum};
    Diag quiet = c.diag;
    quiet.out = null;
    pc.diag = &quiet;
    partition_report(c.g, &pc, null);
    printf("%.3f ms per step (all-reduce %.3f ms, %.3f ms of it exposed); the fullest device needs %.2f MiB%s\n",
           1e3 * sum.step_s, 1e3 * sum.allreduce_s, 1e3 * sum.exposed_s, (double)sum.need / 1048576.0,
           sum.fits ? "" : ": DOES NOT FIT");
    if (sum.fits && (!best_n || sum.step_s < best)) best = sum.step_s, best_n = N;
    if (sum.fits && N == 1) pipe = sum.step_s;
    if (sum.fits && N == D) dp = sum.step_s;
    par_free(&cpu);
    compiled_free(&c);
  }
  fclose(null);
  par_free(&own);
  if (!best_n) {
    printf(compiled ? "no layout fits the devices\n" : "no layout is possible (above)\n");
    return 1;
  }
  if (D == 1) printf("fastest: data parallelism (one device per machine: the only layout)\n");
  else if (best_n == 1)
    printf("fastest: a %d-stage pipeline on each machine, data parallel across the machines%s\n", D,
           dp > 0 ? "" : " (data parallelism on every device does not fit)");
  else if (best_n == D)
    printf("fastest: data parallelism on every device%s\n", pipe > 0 ? "" : " (the pipeline does not fit)");
  else printf("fastest: %d replicas of a %d-stage pipeline on each machine\n", best_n, D / best_n);
  if (D > 1 && pipe > 0 && dp > 0)
    printf("pipeline against data parallelism: %.3f ms against %.3f ms per step: %s is %.2fx as fast\n", 1e3 * pipe,
           1e3 * dp, dp < pipe ? "data parallelism" : "the pipeline", dp < pipe ? pipe / dp : dp / pipe);
  return 0;
}

/* --nodes K (1 to 4096) and --link-gbps X (> 0, at most 1e6) of duet
 * plan into po.  1 after a message. */
static int plan_nodes(ParOpts *po, int argc, char **argv) {
  const char *nv = scan_flag(argc, argv, "--nodes"), *lv = scan_flag(argc, argv, "--link-gbps");
  if (nv) {
    char *end;
    errno = 0;
    long long k = strtoll(nv, &end, 10);
    if (errno || end == nv || *end || k < 1 || k > 4096) {
      fprintf(stderr, "duet: error: --nodes expects an integer from 1 to 4096 (machines), got '%s'\n", nv);
      return 1;
    }
    po->nodes = (int)k;
  }
  if (lv) {
    char *end;
    errno = 0;
    double x = strtod(lv, &end);
    if (errno || end == lv || *end || !(x > 0) || !(x <= 1e6)) {
      fprintf(stderr, "duet: error: --link-gbps expects a number of Gb/s > 0 (and at most 1e6), got '%s'\n", lv);
      return 1;
    }
    if (!nv) {
      fprintf(stderr, "duet: error: --link-gbps needs --nodes K (the machines whose network it is)\n");
      return 1;
    }
    po->link_gbps = x;
  }
  return 0;
}

/* duet plan --fit: what fit_plan_one needs besides the candidate. */
typedef struct FitCtx {
  const char *model;
  int64_t batch;      /* --batch as given (0: the model's) */
  int argc;
  char **argv;
  const FitSpace *sp;
  const char *spec[DUET_MAX_DEVICES]; /* the --devices items, as par_devices takes them */
  FILE *null;
} FitCtx;

/* A ParOpts of candidate k's devices (the first k->stages of each replica's
 * group) and settings.  1 after a message. */
static int fit_opts(const FitCtx *fx, const FitCand *k, ParOpts *po) {
  char devs[4096];
  size_t len = 0;
  devs[0] = 0;
  for (int r = 0; r < fx->sp->replicas; r++)
    for (int s = 0; s < k->stages && len < sizeof devs; s++)
      len += (size_t)snprintf(devs + len, sizeof devs - len, "%s%s", len ? "," : "",
                              fx->spec[r * fx->sp->group + s]);
  memset(po, 0, sizeof *po);
  if (par_devices(po, devs, fx->argc, fx->argv)) return 1;
  po->devices = NULL; /* not read after par_devices */
  po->micro_batches = k->micro_batches;
  po->replicas = fx->sp->replicas > 1 ? fx->sp->replicas : 0;
  po->zero = k->zero;
  po->one_f_one_b = k->one_f_one_b;
  return 0;
}

/* FitPlanFn for duet plan --fit: compiles the model with k's settings (the
 * CLI's option globals set for the call, restored after), as `duet plan`
 * would, and reads its table. */
static int fit_plan_one(void *ctx, FitCand *k, PlanTable *t) {
  const FitCtx *fx = ctx;
  ParOpts po;
  if (fit_opts(fx, k, &po)) {
    par_free(&po);
    return -1;
  }
  const char *save[5] = {opt_precision, opt_recompute, opt_optim_state, opt_arch, opt_offload};
  opt_precision = k->precision;
  opt_recompute = k->recompute;
  opt_optim_state = k->optim_state;
  opt_arch = fx->sp->arch;
  opt_offload = k->offload ? k->offload : "none";
  FrontendOptions fo = {.batch = fx->batch, .micro_batches = po.micro_batches, .replicas = po.replicas};
  Compiled c;
  int rc = compile_model_to(&c, fx->null, fx->model, &fo, &po, NULL, NULL);
  k->compiled = !rc;
  if (rc) { /* no split within the memory: the unbounded plan tells by how much */
    compiled_free(&c);
    int64_t capacity[DUET_MAX_DEVICES];
    for (int i = 0; i < po.n_dev; i++) capacity[i] = po.dev[i].capacity, po.dev[i].capacity = 0;
    rc = compile_model_to(&c, fx->null, fx->model, &fo, &po, NULL, NULL);
    for (int i = 0; i < po.n_dev; i++) po.dev[i].capacity = capacity[i];
  }
  opt_precision = save[0], opt_recompute = save[1], opt_optim_state = save[2], opt_arch = save[3];
  opt_offload = save[4];
  if (rc) {
    compiled_free(&c);
    par_free(&po);
    return -1;
  }
  PlanSummary sum = {0};
  c.diag.jmp = NULL;
  PassCtx pc = {.diag = &c.diag, .devices = po.dev, .n_devices = par_group(&po), .one_f_one_b = po.one_f_one_b,
                .bucket_mb = po.bucket_mb, .summary = &sum};
  partition_report(c.g, &pc, fx->null);
  partition_plan(c.g, &pc, t);
  k->step_s = sum.step_s;
  k->need_most = t->need_most;
  k->fits = k->compiled && t->fits;
  k->over = 0;
  for (int s = 0; s < t->S; s++) {
    const PartDevice *d = t->stage[s].device;
    int64_t over = d && d->capacity > 0 ? t->stage[s].need - d->capacity : 0;
    if (over > k->over) {
      k->over = over;
      snprintf(k->over_device, sizeof k->over_device, "%s", d->name);
    }
  }
  if (!k->compiled && k->over <= 0) { /* the partition's estimate found no split, the plan would fit: count it out */
    k->over = 1;
    snprintf(k->over_device, sizeof k->over_device, "%s", t->stage[0].device ? t->stage[0].device->name : "cpu");
  }
  compiled_free(&c);
  par_free(&po);
  return 0;
}

/* duet plan --fit: the search (cli/fit.c) over the devices of po.  json:
 * the chosen plan's table as --format json, else the ranked list and the
 * chosen plan's table.  Exit status: 0 when one fits, 1 when none does. */
static int plan_fit(const char *model, int64_t batch, const ParOpts *po, int argc, char **argv, bool json) {
  ParOpts cpu = {0};
  const ParOpts *rp = po;
  char cpus[1024];
  if (!po->n_dev) { /* the default: one CPU device per replica */
    if (par_devices(&cpu, default_cpus(po->replicas, cpus, sizeof cpus), argc, argv)) {
      par_free(&cpu);
      return 1;
    }
    rp = &cpu;
  }
  Compiled c; /* the model as given: its batch and optimizer */
  FrontendOptions fo = {.batch = batch};
  int rc = compile_model_to(&c, stderr, model, &fo, NULL, NULL, "optimizer");
  if (rc) {
    compiled_free(&c);
    par_free(&cpu);
    return 1;
  }
  FitSpace sp = {.model = model, .batch = c.g->train.batch, .batch_given = batch > 0,
                 .replicas = po->replicas > 1 ? (int)po->replicas : 1, .adamw = c.g->train.optimizer == OPTIM_ADAMW,
                 .cpu = true, .threads = scan_flag(argc, argv, "--threads"), .device_memory = opt_device_memory,
                 .n_devices = rp->n_dev};
  compiled_free(&c);
  sp.group = rp->n_dev / sp.replicas;
  static char sm[16];
  sp.arch = opt_arch;
  FitCtx fx = {.model = model, .batch = batch, .argc = argc, .argv = argv, .sp = &sp};
  int n_gpu = 0;
  for (int i = 0; i < rp->n_dev; i++) {
    fx.spec[i] = rp->dev[i].name;
    sp.cpu &= rp->dev[i].cpu;
    if (!rp->dev[i].cpu && !sp.arch) {
      snprintf(sm, sizeof sm, "sm_%d", rp->dev[i].sm);
      sp.arch = sm;
    }
    /* duet run takes cuda:N for a planned capacity (the N-th GPU) */
    static char names[DUET_MAX_DEVICES][16];
    if (rp->dev[i].planned) {
      snprintf(names[i], sizeof names[i], "cuda:%d", n_gpu++);
      sp.run_devices[i] = names[i];
    } else {
      sp.run_devices[i] = rp->dev[i].name;
    }
  }
  if (!(fx.null = fopen("/dev/null", "w"))) {
    fprintf(stderr, "duet: error: cannot open /dev/null\n");
    par_free(&cpu);
    return 1;
  }
  FitCand best = {0};
  rc = fit_search(&sp, fit_plan_one, &fx, stdout, json, &best);
  if (rc < 0) fprintf(stderr, "duet: error: out of memory\n");
  if (rc >= 0 && best.precision) { /* the chosen plan's table (its strings live in its compilation) */
    ParOpts bp;
    if (!fit_opts(&fx, &best, &bp)) {
      const char *save[5] = {opt_precision, opt_recompute, opt_optim_state, opt_arch, opt_offload};
      opt_precision = best.precision, opt_recompute = best.recompute, opt_optim_state = best.optim_state;
      opt_arch = sp.arch, opt_offload = best.offload ? best.offload : "none";
      FrontendOptions bo = {.batch = batch, .micro_batches = bp.micro_batches, .replicas = bp.replicas};
      Compiled bc;
      int brc = compile_model_to(&bc, fx.null, model, &bo, &bp, NULL, NULL);
      if (brc && !best.compiled) { /* no split within the memory: the unbounded plan, as the search saw it */
        compiled_free(&bc);
        int64_t capacity[DUET_MAX_DEVICES];
        for (int i = 0; i < bp.n_dev; i++) capacity[i] = bp.dev[i].capacity, bp.dev[i].capacity = 0;
        brc = compile_model_to(&bc, fx.null, model, &bo, &bp, NULL, NULL);
        for (int i = 0; i < bp.n_dev; i++) bp.dev[i].capacity = capacity[i];
      }
      opt_precision = save[0], opt_recompute = save[1], opt_optim_state = save[2], opt_arch = save[3];
      opt_offload = save[4];
      if (!brc) {
        bc.diag.out = fx.null;
        PassCtx pc = {.diag = &bc.diag, .devices = bp.dev, .n_devices = par_group(&bp),
                      .one_f_one_b = bp.one_f_one_b, .bucket_mb = bp.bucket_mb};
        PlanTable *t = json ? malloc(sizeof *t) : NULL;
        if (t) {
          partition_plan(bc.g, &pc, t);
          if (plan_print_json(t, &sp, &best, stdout)) rc = -1;
        } else if (json) {
          rc = -1;
        } else {
          fprintf(stdout, "\n");
          partition_report(bc.g, &pc, stdout);
        }
        free(t);
      }
      compiled_free(&bc);
    }
    par_free(&bp);
  }
  fclose(fx.null);
  par_free(&cpu);
  return rc < 0 ? 1 : rc;
}

static int cmd_plan(int argc, char **argv) {
  const char *model = NULL, *format = "text";
  int64_t batch = 0;
  bool fit = false;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: duet plan M.model [--devices SPEC] [--micro-batches M] [--schedule gpipe|1f1b] [--batch N]\n"
             "                [--threads N] [--data-parallel N] [--bucket-mb X] [--zero 0|1] [--nodes K [--link-gbps X]]\n"
             "                [--device-memory SIZE] [--format text|json|svg] [--fit]\n"
             "Partitions the model without running it and prints each stage's ops, estimated time and memory\n"
             "(weights, grads, optimizer state, activations), the transfer bytes per step and the pipeline\n"
             "bubble (S-1)/(M+S-1).  SPEC: cpu:0,cpu:1 | cuda:0,cuda:1 | capacities such as 2x16GiB:sm_60;\n"
             "default cpu (the one CPU device of duet run, with --threads or all cores).  With\n"
             "--data-parallel N (SPEC split into N groups, one per replica), the ring all-reduce of the\n"
             "gradients per step, how much of it the buckets hide behind the backward pass, the step time.\n"
             "--nodes K: K machines, each with the devices of SPEC (and --data-parallel N replicas on them),\n"
             "linked at --link-gbps X Gb/s each (default 10: 10 Gigabit Ethernet); the all-reduce crosses\n"
             "that link; then every layout of each machine's devices (pipeline, data parallel, between)\n"
             "estimated, and the fastest.\n"
             "--format svg: the same plan as a picture on stdout: the schedule of each stage's forward and\n"
             "backward micro-batches over the step (the bubble as empty space) beside each device's memory\n"
             "as stacked bars (not with --nodes).\n"
             "Exits 1 when the model does not fit.  DUET_CPU_GFLOPS sets the CPU rate per core.\n"
             "--recompute blocks|auto: the activations with recomputation (auto: only as much as each\n"
             "device needs to fit; the CPU's budget is MemAvailable or DUET_HOST_MEMORY).\n"
             "--quantize int8|int8-tensor: the evaluation program (int8 weights and their f32 scales);\n"
             "--calibrate N with it: int8 activations too (one f32 scale per int8 GEMM).\n"
             "--eval-only: the evaluation program of duet run --eval-only (params and forward activations;\n"
             "no gradients, no optimizer state).\n"
             "--offload optimizer: the optimizer state and the f32 master weights on a host row instead of\n"
             "the devices' (the update on the CPU; the gradients and params copied each step).\n"
             "Pruning: --prune S, --prune-mode M, --prune-start N, --prune-end N, --prune-every N,\n"
             "--prune-initial S, --prune-params P, --shrink (as duet run --help describes them).\n"
             "--device-memory SIZE: each device's memory (16GiB or 16G = 2^30 bytes, 16GB = 10^9, 500MiB,\n"
             "bytes; default: the CPU's available memory shared by its devices, 16 GiB per GPU, a capacity's own).\n"
             "--format text|json: json prints the same table as one object for tools (per device: weights,\n"
             "master_weights, grads, optimizer_state, activations, cache, workspace, total in bytes; `fits`).\n"
             "--fit: plans every stages/micro-batches/schedule/recompute/precision/optimizer-state (and --zero\n"
             "with --data-parallel) combination for the devices and budget, ranks them by estimated step time\n"
             "(op FLOPs/peak and bytes/bandwidth, recomputed FLOPs, transfers/link, the bubble; --arch or the\n"
             "devices' sm decide whether bf16 exists) and prints the best's `duet run` command line; when none\n"
             "fits, by how much and which setting helps most (exit 1).\n");
      return 0;
    } else if ((par_flag(argv[i]) || !strcmp(argv[i], "--nodes") || !strcmp(argv[i], "--link-gbps")) && i + 1 < argc) {
      i++;
    } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
      batch = scan_batch(2, argv + i);
      i++;
    } else if (!strcmp(argv[i], "--fit")) {
      fit = true;
    } else if (!strcmp(argv[i], "--eval-only")) {
      opt_eval_only = true; /* passes/evalonly.c */
    } else if (!strcmp(argv[i], "--format") && i + 1 < argc) {
      format = argv[++i];
    } else if (argv[i][0] != '-' && !model) {
      model = argv[i];
    } else {
      return bad_argument("plan", argc, argv, i);
    }
  }
  if (!model) {
    fprintf(stderr, "duet: error: usage: duet plan M.model [--devices SPEC]\n");
    return 1;
  }
  if (plan_format_check(format, argc, argv)) return 1;
  bool json = !strcmp(format, "json");
  if (fit && !strcmp(format, "svg")) {
    fprintf(stderr, "duet: error: duet plan --fit prints its ranked list and table as text or json, not svg\n");
    return 1;
  }
  if (opt_eval_only && opt_offload) return duet_eval_only_refuse("--offload"); /* as duet run --eval-only */
  if (fit && opt_eval_only) {
    fprintf(stderr, "duet: error: duet plan --fit ranks training layouts; --eval-only plans the evaluation program "
                    "of one: give one of them\n");
    return 1;
  }
  if (fit) { /* the search sets these itself */
    const char *fixed[] = {"--micro-batches", "--schedule", "--zero", "--nodes"};
    const char *given[] = {NULL, NULL, opt_recompute ? "--recompute" : NULL, opt_precision ? "--precision" : NULL,
                           opt_optim_state ? "--optimizer-state" : NULL};
    for (size_t k = 0; k < sizeof fixed / sizeof *fixed; k++)
      if (scan_flag(argc, argv, fixed[k])) given[0] = fixed[k];
    for (size_t k = 0; k < sizeof given / sizeof *given; k++)
      if (given[k]) {
        fprintf(stderr, "duet: error: duet plan --fit chooses %s itself (give --devices, --device-memory, "
                "--data-parallel, --batch, --arch)\n", given[k]);
        return 1;
      }
  }
  ParOpts po; /* checks --devices, --micro-batches and --schedule */
  if (par_opts(&po, argc, argv, 1) || plan_nodes(&po, argc, argv)) {
    par_free(&po);
    return 1;
  }
  if (fit) {
    int frc = plan_fit(model, batch, &po, argc, argv, json);
    par_free(&po);
    return frc;
  }
  if (json && po.nodes >= 1) {
    fprintf(stderr, "duet: error: duet plan --format json prints one layout's table; --nodes compares layouts (use "
            "text)\n");
    par_free(&po);
    return 1;
  }
  int64_t per_node = po.replicas > 1 ? po.replicas : 1; /* --data-parallel: replicas on one machine's devices */
  if (po.nodes > 1) po.replicas = per_node * po.nodes;
  /* without --devices the program runs on one CPU device, as `duet run`'s
   * default `--devices cpu`: the estimates are that device's (the model is
   * still compiled without --devices, so its hints stay annotations) */
  ParOpts cpu = {0};
  char cpus[1024];
  if (!po.n_dev && par_devices(&cpu, default_cpus(per_node, cpus, sizeof cpus), argc, argv)) {
    par_free(&po);
    par_free(&cpu);
    return 1;
  }
  Compiled c;
  int rc = compile_model_par(&c, model, batch, &po, NULL, NULL);
  if (rc) explain_no_split(model, batch, &po, stdout, json);
  if (!rc) {
    const ParOpts *rp = po.n_dev ? &po : &cpu;
    PassCtx pc = {.diag = &c.diag, .devices = rp->dev, .n_devices = po.n_dev ? par_group(&po) : 1,
                  .one_f_one_b = po.one_f_one_b, .bucket_mb = po.bucket_mb, .nodes = po.nodes,
                  .link_gbps = po.link_gbps};
    if (check_gemm_acc(graph_f16_gemms(c.g))) {
      rc = 1;
    } else if (!strcmp(format, "svg")) {
      rc = plan_svg(c.g, &pc, stdout); /* the picture on stdout; 1 when the model does not fit */
    } else {
      if (json) { /* the same table for tools; 1 when it does not fit */
        PlanTable *t = malloc(sizeof *t);
        if (t) partition_plan(c.g, &pc, t);
        rc = !t || plan_print_json(t, NULL, NULL, stdout) || !t->fits;
        if (!t) fprintf(stderr, "duet: error: out of memory\n");
        else if (!t->fits) fprintf(stderr, "duet: error: the model does not fit: a device needs more memory than it has "
                                   "(\"fits\": false above)\n");
        free(t);
      } else {
        rc = partition_report(c.g, &pc, stdout); /* 1 when the model does not fit: the report is still printed */
      }
      if (json)
        ;
      else if (opt_gemm_acc && !strcmp(opt_gemm_acc, "fp16"))
        printf("gemm accumulate: fp16 (--gemm-accumulate fp16: fp16 GEMMs use cuBLAS CUBLAS_COMPUTE_16F, about 2x the "
               "fp32-accumulate rate on sm_60, partial sums rounded to fp16; CUDA devices only)\n");
      else
        printf("gemm accumulate: fp32 (16-bit GEMMs: 16-bit inputs, fp32 accumulation)\n");
    }
  }
  compiled_free(&c);
  par_free(&cpu);
  if (po.nodes >= 1 && plan_layouts(model, batch, &po, argc, argv)) rc = 1;
  par_free(&po);
  return rc;
}

static int cmd_emit(int argc, char **argv) {
  const char *model = NULL, *target = "c";
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: duet emit M.model [--target c|cuda]\nPrints the generated kernel source: C (the CPU backend) or CUDA C (NVRTC).\n"
             "Also: --precision auto|fp32|fp16|bf16, --data-parallel N, --bucket-mb X and --zero 0|1 (the\n"
             "kernels of one replica), --recompute none|blocks|auto, --quantize int8|int8-tensor,\n"
             "--calibrate N with --quantize (int8 activations: the int8 GEMM kernels).\n"
             "Pruning: --prune S, --prune-mode M, --prune-start N, --prune-end N, --prune-every N,\n"
             "--prune-initial S, --prune-params P, --shrink (as duet run --help describes them).\n");
      return 0;
    } else if (!strcmp(argv[i], "--target") && i + 1 < argc) {
      target = argv[++i];
    } else if ((!strcmp(argv[i], "--data-parallel") || !strcmp(argv[i], "--bucket-mb") || !strcmp(argv[i], "--zero")) &&
               i + 1 < argc) {
      i++; /* read by par_opts */
    } else if (argv[i][0] != '-' && !model) {
      model = argv[i];
    } else {
      return bad_argument("emit", argc, argv, i);
    }
  }
  if (!model) {
    fprintf(stderr, "duet: error: usage: duet emit M.model --target c|cuda\n");
    return 1;
  }
  if (strcmp(target, "c") && strcmp(target, "cuda")) {
    fprintf(stderr, "duet: error: unknown target '%s' (available: c, cuda)\n", target);
    return 1;
  }
  ParOpts po;
  if (par_opts(&po, argc, argv, 1)) return 1;
  Compiled c;
  int rc = compile_model_par(&c, model, 0, &po, NULL, NULL);
  par_free(&po);
  CgProgram *cp = rc ? NULL : codegen_lower(c.g, c.arena);
  if (cp && check_gemm_acc(gemm_f16_steps(&cp->prog))) rc = 1;
  if (!rc) {
    fputs(strcmp(target, "cuda") ? codegen_emit_c(cp, c.arena) : codegen_emit_cuda(cp, c.arena, NULL, NULL), stdout);
  }
  compiled_free(&c);
  return rc;
}

static int cmd_sample(int argc, char **argv) {
  const char *model = NULL, *ckpt = NULL, *prompt = "";
  int64_t tokens = 200, top_k = 40, seed = 1;
  double temperature = 0.8;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf("usage: duet sample M.model --checkpoint CK [--prompt TEXT] [--tokens N] [--temperature X]\n"
             "                  [--top-k K] [--seed N]\n"
             "Generates text with a byte-level model trained by duet run --save CK.  Defaults: 200 tokens,\n"
             "temperature 0.8 (0: always the most likely byte), top-k 40 (0: all 256), seed 1.\n");
      return 0;
    }
    if (a[0] != '-') {
      if (model) {
        fprintf(stderr, "duet: error: unexpected argument '%s' (see duet sample --help)\n", a);
        return 1;
      }
      model = a;
      continue;
    }
    if (!v) {
      fprintf(stderr, "duet: error: %s needs a value (see duet sample --help)\n", a);
      return 1;
    }
    i++;
    if (!strcmp(a, "--checkpoint")) ckpt = v;
    else if (!strcmp(a, "--prompt")) prompt = v;
    else if (!strcmp(a, "--tokens")) tokens = strtoll(v, &end, 10);
    else if (!strcmp(a, "--top-k")) top_k = strtoll(v, &end, 10);
    else if (!strcmp(a, "--seed")) seed = strtoll(v, &end, 10);
    else if (!strcmp(a, "--temperature")) temperature = strtod(v, &end);
    else {
      fprintf(stderr, "duet: error: unknown flag '%s' (see duet sample --help)\n", a);
      return 1;
    }
    if (end && (*end || end == v || tokens < 0 || top_k < 0 || seed < 0 || !(temperature >= 0))) {
      fprintf(stderr, "duet: error: %s expects a non-negative number, got '%s'\n", a, v);
      return 1;
    }
  }
  if (!model || !ckpt) {
    fprintf(stderr, "duet: error: %s (usage: duet sample M.model --checkpoint CK [--prompt TEXT])\n",
            !model ? "no model file given" : "no --checkpoint CK given (the trained weights)");
    return 1;
  }
  Compiled c;
  FrontendOptions fo = {.batch = 1, .decode = true};
  if (compile_model_opt(&c, model, &fo, NULL, NULL, NULL)) {
    compiled_free(&c);
    return 1;
  }
  JitModule m;
  CgProgram *cp = jit_program(&c, &m, false);
  if (!cp) {
    compiled_free(&c);
    return 1;
  }
  char err[8192];
  DuetDevice *dev = NULL;
  DuetSession *s = NULL;
  int rc = 1;
  DuetConfig cfg = cp->prog.defaults;
  if (duet_sample_check(&cp->prog, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
  } else if (!(dev = duet_cpu_device(m.fns, m.n, 0)) || !(s = duet_session_new(&cp->prog, dev, &cfg, err, sizeof err))) {
    fprintf(stderr, "duet: error: %s\n", dev ? err : "out of host memory");
  } else if (duet_checkpoint_load_weights(s, ckpt, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
  } else if (duet_sample(s, prompt, tokens, temperature, top_k, (uint64_t)seed, stdout, err, sizeof err)) {
    fprintf(stderr, "duet: error: %s\n", err);
  } else {
    rc = 0;
  }
  duet_session_free(s);
  if (dev) dev->ops->destroy(dev);
  jit_unload(&m);
  compiled_free(&c);
  return rc;
}

/* The model path of `duet predict` / `duet export` (first argument), or
 * NULL after the error. */
static const char *model_first(const char *cmd, int argc, char **argv) {
  if (argc < 1 || argv[0][0] == '-') {
    fprintf(stderr, "duet: error: the model comes first: duet %s M.model --checkpoint CK ...%s%s%s\n", cmd,
            argc >= 1 ? " (got '" : "", argc >= 1 ? argv[0] : "", argc >= 1 ? "')" : "");
    return NULL;
  }
  return argv[0];
}

static int cmd_predict(int argc, char **argv) {
  if (wants_help(argc, argv)) {
    duet_predict_usage(stdout);
    return 0;
  }
  const char *model = model_first("predict", argc, argv);
  if (!model) return 1;
  opt_eval_only = true; /* an evaluation program (passes/evalonly.c): params and the forward pass */
  Compiled c;
  if (compile_model_par(&c, model, 0, NULL, NULL, NULL)) {
    compiled_free(&c);
    return 1;
  }
  CgProgram *cp = lower_program(&c, false);
  JitModule m;
  memset(&m, 0, sizeof m);
  int rc = 1;
  if (cp && !load_kernels(&c, cp, &m, false)) {
    rc = duet_predict_main(&cp->prog, m.fns, model, argc - 1, argv + 1);
    jit_unload(&m);
  }
  compiled_free(&c);
  return rc;
}

static int cmd_export(int argc, char **argv) {
  if (wants_help(argc, argv)) {
    printf("usage: duet export M.model --checkpoint CK -o W.safetensors [--prune-mode channels --prune S --shrink]\n"
           "Writes the params of CK (a checkpoint written by duet run --save) to a safetensors file, each\n"
           "as f32 under its name and with the model's shape (a linear layer's w is [in, out], as x @ w;\n"
           "torch.nn.Linear's weight is its transpose), metadata {\"format\": \"duet-weights-1\", \"model\",\n"
           "\"step\"}; no optimizer state, no pruning masks (pruned weights are zeros already).  With\n"
           "--prune-mode channels --prune S --shrink (the run's S): the pruned channels removed, smaller tensors.\n"
           "tools/duet_to_torch.py loads it into the equivalent torch.nn model.\n");
    return 0;
  }
  const char *model = model_first("export", argc, argv), *ckpt = NULL, *out = NULL;
  if (!model) return 1;
  for (int i = 1; i < argc; i++) {
    if ((!strcmp(argv[i], "--checkpoint") || !strcmp(argv[i], "-o")) && i + 1 < argc) {
      *(argv[i][1] == 'o' ? &out : &ckpt) = argv[i + 1];
      i++;
    } else {
      return bad_argument("export", argc, argv, i);
    }
  }
  if (!ckpt || !out) {
    fprintf(stderr, "duet: error: duet export needs %s (usage: duet export M.model --checkpoint CK -o "
                    "W.safetensors)\n", !ckpt ? "--checkpoint CK (a checkpoint written by duet run --save)"
                                              : "-o W.safetensors (the file to write)");
    return 1;
  }
  struct stat a, b;
  if (!stat(ckpt, &a) && !stat(out, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
    fprintf(stderr, "duet: error: -o %s is the checkpoint itself; give another file\n", out);
    return 1;
  }
  opt_eval_only = true; /* only the params' names and shapes are read */
  Compiled c;
  if (compile_model_par(&c, model, 0, NULL, NULL, NULL)) {
    compiled_free(&c);
    return 1;
  }
  CgProgram *cp = codegen_lower(c.g, c.arena);
  DuetConfig cfg = cp->prog.defaults;
  cfg.checkpoint_path = ckpt;
  if (duet_check_output(&cp->prog, &cfg, model, "-o", out)) {
    compiled_free(&c);
    return 1;
  }
  char err[2048];
  int rc = duet_export_weights(&cp->prog, ckpt, out, err, sizeof err);
  if (rc) fprintf(stderr, "duet: error: %s\n", err);
  else printf("duet: wrote %s (the params of %s)\n", out, ckpt);
  compiled_free(&c);
  return rc ? 1 : 0;
}

/* The model summary's tree of block calls.  A layer's children are the
 * layers one level deeper whose name extends its name by a dot, in the
 * order the calls started (a call is recorded when it ends, after the calls
 * inside it); its params are those whose name extends its name by a dot.
 * Both are found by looking each dotted prefix of a name up in a map of
 * layer names (-> LayerNode), so the summary takes time linear in the
 * total length of the names (scanning every layer and value for every
 * layer took 8 s for repeat(10000, ...)). */
typedef struct LayerNode {
  int64_t params;
  int *kids, n_kids, cap_kids; /* layer indices, in order */
  struct LayerNode *same;      /* another layer of the same name */
  int index;
} LayerNode;

/* Column widths of duet check's layer table: at least the header's, wide
 * enough for the longest indented name, shape and parameter count. */
typedef struct LayerCols {
  int name, shape, params;
} LayerCols;

/* Prints the rows when `cols` is set, else only measures them into
 * `measure`. */
static void print_layer_tree(const Graph *g, LayerNode *nodes, const int *list, int n, const char *parent, int depth,
                             const LayerCols *cols, LayerCols *measure) {
  size_t pl = parent ? strlen(parent) : 0;
  for (int k = 0; k < n; k++) {
    const LayerInfo *l = &g->layers[list[k]];
    if (l->depth != depth) continue;
    char b[160], n_params[32];
    const char *name = parent ? l->name + pl + 1 : l->name, *shape = shape_str(&l->out, b, sizeof b);
    int nw = 2 * depth + (int)strlen(name), sw = (int)strlen(shape);
    int cw = snprintf(n_params, sizeof n_params, "%" PRId64, nodes[list[k]].params);
    if (cols)
      printf("%*s%-*s %-*s %*s\n", 2 * depth, "", cols->name - 2 * depth, name, cols->shape, shape, cols->params,
             n_params);
    else {
      if (nw > measure->name) measure->name = nw;
      if (sw > measure->shape) measure->shape = sw;
      if (cw > measure->params) measure->params = cw;
    }
    const LayerNode *t = &nodes[list[k]];
    print_layer_tree(g, nodes, t->kids, t->n_kids, l->name, depth + 1, cols, measure);
  }
}

/* What param p is to --quantize (passes/quantize.c): 1 the f32 scales of
 * int8 weights (a dequantize op's second operand, a matmul_i8's third), 2
 * an activation scale (--calibrate: a matmul_i8's fourth), 0 neither.
 * Scales are not among the model's parameters. */
static int quant_scale_role(const Graph *g, const Value *p) {
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    if (v->op == OP_DEQUANTIZE && v->in[1] == p) return 1;
    if (v->op == OP_MATMUL_I8 && v->in[2] == p) return 1;
    if (v->op == OP_MATMUL_I8 && v->in[3] == p) return 2;
  }
  return 0;
}

static bool is_quant_scale(const Graph *g, const Value *p) { return quant_scale_role(g, p) != 0; }

static void print_layers(const Graph *g) {
  int L = g->n_layers;
  Arena *a = arena_new(1 << 16);
  LayerNode *nodes = arena_alloc(a, (size_t)L * sizeof *nodes);
  int *top = arena_alloc(a, (size_t)L * sizeof *top), n_top = 0;
  NameMap by_name = {0};
  for (int i = 0; i < L; i++) {
    nodes[i].index = i;
    void **slot = namemap_slot(a, &by_name, g->layers[i].name);
    nodes[i].same = *slot;
    *slot = &nodes[i];
  }
  /* each dotted prefix p of a name: the layers called p */
  for (int j = 0; j < g->n_values; j++) {
    const Value *v = g->values[j];
    if (v->op != OP_PARAM || is_quant_scale(g, v)) continue;
    char *buf = arena_strdup(a, v->attr.name);
    for (char *dot = strchr(buf, '.'); dot; dot = strchr(dot + 1, '.')) {
      *dot = 0;
      for (LayerNode *t = namemap_get(&by_name, buf); t; t = t->same)
        t->params = shape_numel(&v->shape) > INT64_MAX - t->params ? INT64_MAX : t->params + shape_numel(&v->shape);
      *dot = '.';
    }
  }
  /* children in layer order: each layer under every layer one level up
   * whose name, and a dot, begins its name */
  for (int i = 0; i < L; i++) {
    const LayerInfo *l = &g->layers[i];
    if (l->depth == 0) top[n_top++] = i;
    if (l->depth == 0) continue;
    char *buf = arena_strdup(a, l->name);
    for (char *dot = strchr(buf, '.'); dot; dot = strchr(dot + 1, '.')) {
      *dot = 0;
      for (LayerNode *t = namemap_get(&by_name, buf); t; t = t->same) {
        if (g->layers[t->index].depth != l->depth - 1) continue;
        if (t->n_kids == t->cap_kids) {
          int cap = t->cap_kids ? 2 * t->cap_kids : 4;
          int *nk = arena_alloc(a, (size_t)cap * sizeof *nk);
          if (t->n_kids) memcpy(nk, t->kids, (size_t)t->n_kids * sizeof *nk);
          t->kids = nk;
          t->cap_kids = cap;
        }
        t->kids[t->n_kids++] = i;
      }
      *dot = '.';
    }
  }
  LayerCols lc = {36, 20, 12};
  print_layer_tree(g, nodes, top, n_top, NULL, 0, NULL, &lc);
  printf("%-*s %-*s %*s\n", lc.name, "layer", lc.shape, "output shape", lc.params, "params");
  print_layer_tree(g, nodes, top, n_top, NULL, 0, &lc, NULL);
  arena_free(a);
}

/* n bytes (at least 1024) for people: "7.1 MiB" (binary units up to EiB). */
static const char *bytes_human(int64_t n, char *b, size_t len) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double x = (double)n;
  int u = 0;
  while (x >= 1024 && u < 6) x /= 1024, u++;
  snprintf(b, len, "%.1f %s", x, unit[u]);
  return b;
}

/* duet check's line about pruning: the mode and schedule, the weights
 * pruned and what their masks cost. */
static void print_prune_summary(const Graph *g) {
  const PruneSpec *p = &g->prune;
  int n = 0;
  int64_t elems = 0, bytes = 0;
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    if (v->op != OP_PRUNE_MASK) continue;
    n++;
    elems += shape_numel(&v->in[1]->shape);
    bytes += shape_numel(&v->in[1]->shape) * (int64_t)dtype_size(v->in[1]->dtype);
  }
  if (!n) return;
  char m[32], b[64], sched[160];
  if (p->end == p->start) snprintf(sched, sizeof sched, "one-shot after step %" PRId64, p->start);
  else snprintf(sched, sizeof sched, "gradual from %s after step %" PRId64 " to %s after step %" PRId64 ", every %" PRId64
               " steps", ir_num_str(p->initial, (char[32]){0}, 32), p->start, ir_num_str(p->sparsity, (char[32]){0}, 32),
               p->end, p->every);
  printf("pruning: %s, sparsity %s, %s: %d weight tensor%s of %" PRId64 " elements; masks %" PRId64 " bytes", prune_mode_str(p, m, sizeof m),
         ir_num_str(p->sparsity, (char[32]){0}, 32), sched, n, n == 1 ? "" : "s", elems, bytes);
  if (bytes >= 1024) printf(" (%s)", bytes_human(bytes, b, sizeof b));
  printf(" of optimizer state\n");
}

/* duet check's line about 8-bit AdamW state (only with state = int8): its
 * bytes, codes and scales, beside what f32 moments would take. */
static void print_optim_summary(const Graph *g) {
  int64_t codes = 0, scales = 0, params = 0;
  for (int i = 0; i < g->n_values; i++) {
    const Value *u = g->values[i];
    if (u->op != OP_ADAMW || u->n_in != 6) continue;
    params += shape_numel(&u->in[0]->shape);
    for (int j = 2; j < 6; j++)
      *(j < 4 ? &codes : &scales) += shape_numel(&u->in[j]->shape) * (int64_t)dtype_size(u->in[j]->dtype);
  }
  if (!params) return;
  char b[64], f[64];
  int64_t tot = codes + scales, f32 = 8 * params;
  printf("optimizer state: adamw int8, %" PRId64 " bytes", tot);
  if (tot >= 1024) printf(" (%s)", bytes_human(tot, b, sizeof b));
  printf(": %" PRId64 " bytes of codes (2 per parameter) and %" PRId64 " of scales (8 per block of %d); f32 moments: "
         "%" PRId64 " bytes", codes, scales, IR_Q8_BLOCK, f32);
  if (f32 >= 1024) printf(" (%s)", bytes_human(f32, f, sizeof f));
  printf("\n");
}

/* duet check's line about int8 weights (--quantize int8|int8-tensor: the
 * quantize pass's i8 params, each with its f32 scales through a dequantize
 * op), in the words and numbers of the line an int8 evaluation prints
 * (runtime/quant.c, duet_quant_summary). */
static void print_quant_summary(const Graph *g) {
  int64_t n = 0, q = 0, sc = 0, na = 0, sa = 0;
  for (int i = 0; i < g->n_values; i++) { /* each scale once: its weight's bytes with it */
    const Value *v = g->values[i];
    if (v->op != OP_PARAM) continue;
    int role = quant_scale_role(g, v);
    int64_t nb = shape_numel(&v->shape) * (int64_t)dtype_size(v->dtype);
    if (role == 2) na++, sa += nb;
    if (role != 1) continue;
    for (int j = 0; j < g->n_values; j++) { /* the int8 weights the scale goes with */
      const Value *u = g->values[j];
      if ((u->op == OP_DEQUANTIZE && u->in[1] == v) || (u->op == OP_MATMUL_I8 && u->in[2] == v)) {
        n++;
        q += shape_numel(&u->in[u->op == OP_DEQUANTIZE ? 0 : 1]->shape) *
             (int64_t)dtype_size(u->in[u->op == OP_DEQUANTIZE ? 0 : 1]->dtype);
        break;
      }
    }
    sc += nb;
  }
  if (n)
    printf("int8 weights: %" PRId64 " tensors, %" PRId64 " bytes and %" PRId64 " bytes of f32 scales (%" PRId64
           " bytes in f32)\n", n, q, sc, 4 * q);
  if (na) /* --calibrate: one f32 scale per int8 GEMM, calibrated before the evaluation */
    printf("int8 activations: %" PRId64 " int8 GEMMs, %" PRId64 " bytes of f32 activation scales (calibrated on "
           "%" PRId64 " training batches)\n", na, sa, g->calibrate);
}

static int cmd_check(int argc, char **argv) {
  /* M.model, then only --data-parallel N and --bucket-mb X */
  bool args_ok = argc >= 1 && argv[0][0] != '-';
  for (int i = 1; i < argc && args_ok; i += 2)
    args_ok = (!strcmp(argv[i], "--data-parallel") || !strcmp(argv[i], "--bucket-mb") || !strcmp(argv[i], "--zero")) &&
              i + 1 < argc;
  if (!args_ok || wants_help(argc, argv)) {
    printf("usage: duet check M.model [--data-parallel N] [--bucket-mb X] [--zero 0|1]\nParses and verifies the model; prints its "
           "parameters and the bytes of\n"
           "their weights as trained (f32: in fp16/bf16 these are the master weights, the 16-bit copies come\n"
           "on top; gradients, optimizer state and activations: duet plan).\n"
           "Also: --precision auto|fp32|fp16|bf16, --arch cpu|sm_60|...|sm_90, --recompute none|blocks|auto,\n"
           "--optimizer-state int8|f32 (int8: a line with the bytes of the 8-bit AdamW state),\n"
           "--quantize int8|int8-tensor (the evaluation program's int8 weights and f32 scales, and a line\n"
           "with their bytes), --calibrate N with --quantize (int8 activations: a line with the bytes\n"
           "of their f32 scales, which are not counted as parameters, as the weights' scales).\n"
           "Pruning: --prune S, --prune-mode M, --prune-start N, --prune-end N, --prune-every N,\n"
           "--prune-initial S, --prune-params P, --shrink (as duet run --help describes them).\n");
    return args_ok || (argc == 1 && wants_help(argc, argv)) ? 0 : 1;
  }
  ParOpts po;
  if (par_opts(&po, argc, argv, 1)) return 1;
  Compiled c;
  /* through autodiff (its warnings too), prune and quantize (which --quantize alone turns on) */
  int rc = compile_model_par(&c, argv[0], 0, &po, NULL, "quantize");
  par_free(&po);
  if (!rc && check_gemm_acc_graph(&c, argv[0], 0, NULL)) rc = 1;
  /* parameters and their bytes in all; shape rules keep each one's bytes
   * within 64 bits, their sum is checked here */
  int64_t total = 0, bytes = 0;
  int w_name = 32, w_shape = 16, w_elems = 12; /* at least these: the table's usual look */
  DType dt = DT_F32;
  bool mixed = false, any = false, int8 = false;
  for (int i = 0; !rc && i < c.g->n_values; i++) {
    const Value *v = c.g->values[i];
    if (v->op == OP_DEQUANTIZE || v->op == OP_MATMUL_I8) int8 = true; /* --quantize: int8 weights */
    if (v->op != OP_PARAM) continue;
    if (is_quant_scale(c.g, v)) total -= shape_numel(&v->shape); /* f32 scales (not parameters) */
    int64_t n = shape_numel(&v->shape), nb = n * (int64_t)dtype_size(v->dtype);
    if (nb > INT64_MAX - bytes) {
      diag_error(&c.diag, v->loc, "the parameters up to `%s` are too large: their size in bytes overflows 64 bits",
                 v->attr.name);
      rc = 1;
      break;
    }
    total += n;
    bytes += nb;
    mixed |= any && v->dtype != dt;
    dt = v->dtype;
    any = true;
    char b[160], e[32];
    int nw = (int)strlen(v->attr.name), sw = (int)strlen(shape_str(&v->shape, b, sizeof b)),
        ew = snprintf(e, sizeof e, "%" PRId64, n);
    /* a name or shape that fills its column keeps one space before the next */
    if (nw > w_name) w_name = nw;
    if (sw > w_shape) w_shape = sw;
    if (ew > w_elems) w_elems = ew;
  }
  if (!rc) {
    char b[160];
    /* the model summary: every block call (outermost first, nested ones
     * indented) with its output shape and the parameters under its prefix */
    if (c.g->n_layers) {
      print_layers(c.g);
      printf("\n");
    }
    printf("%-*s %-*s %*s\n", w_name, "parameter", w_shape, "shape", w_elems, "elements");
    for (int i = 0; i < c.g->n_values; i++) {
      Value *v = c.g->values[i];
      if (v->op != OP_PARAM) continue;
      printf("%-*s %-*s %*" PRId64 "\n", w_name, v->attr.name, w_shape, shape_str(&v->shape, b, sizeof b), w_elems,
             shape_numel(&v->shape));
    }
    /* what the bytes are: the weights as the optimizer keeps them (f32),
     * which 16-bit training keeps as master weights beside its copies */
    PrecisionChoice pc;
    char perr[256];
    bool half = !precision_resolve(opt_arch, opt_precision ? opt_precision : c.g->train.precision, &pc, perr,
                                   sizeof perr) && pc.storage != DT_F32 && pc.storage != DT_F64;
    printf("%s: ok, %" PRId64 " parameters, %" PRId64 " bytes", argv[0], total, bytes);
    if (bytes >= 1024) printf(" (%s)", bytes_human(bytes, b, sizeof b));
    if (any && int8) printf(": int8 weights, their f32 scales and the other params in f32");
    else if (any) printf(" of %s %sweights%s", mixed ? "f32/f64" : dtype_name(dt), half ? "master " : "",
                    half ? (pc.storage == DT_F16 ? " (their fp16 copies not counted)" : " (their bf16 copies not counted)")
                         : "");
    printf("\n");
    print_optim_summary(c.g);
    print_prune_summary(c.g);
    print_quant_summary(c.g);
  }
  compiled_free(&c);
  return rc;
}

/* --quantize makes an evaluation program (passes/quantize.c): duet run
 * with it and without --eval-only would train.  1 after the error. */
static int quantize_train_refused(int argc, char **argv) {
  if (quantize_mode_parse(opt_quantize) <= 0) return 0;
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--eval-only")) return 0;
  fprintf(stderr, "duet: error: --quantize %s evaluates a trained checkpoint with int8 weights and cannot train: train "
                  "and save first (duet run M.model --save CK), then evaluate with duet run M.model --eval-only "
                  "--checkpoint CK --quantize %s\n", opt_quantize, opt_quantize);
  return 1;
}

/* --shrink makes an evaluation program (passes/shrink.c): duet run with it
 * and without --eval-only would train; with --quantize it is not made yet.
 * 1 after the error. */
static int shrink_refused(const char *cmd, int argc, char **argv) {
  if (!opt_shrink) return 0;
  if (quantize_mode_parse(opt_quantize) > 0) {
    fprintf(stderr, "duet: error: --shrink and --quantize %s together are not supported yet: evaluate with one of "
                    "them\n", opt_quantize);
    return 1;
  }
  if (strcmp(cmd, "run")) return 0;
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--eval-only")) return 0;
  fprintf(stderr, "duet: error: --shrink removes the channels that channels pruning zeroed from a trained checkpoint "
                  "and cannot train: train and save first (duet run M.model --prune-mode channels --prune S --save "
                  "CK), then evaluate with duet run M.model --eval-only --checkpoint CK --prune-mode channels --prune "
                  "S --shrink\n");
  return 1;
}

int main(int argc, char **argv) {
  duet_rank_stderr(); /* under an MPI launcher: "duet: rank 1: error: ..." */
  if (argc < 2) {
    usage(stderr);
    return 1;
  }
  const char *cmd = argv[1];
  /* `duet version`, and --version given to any command (before anything is
   * compiled, so it answers even where the model or the flags are wrong) */
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--version") || (i == 1 && !strcmp(argv[i], "version"))) {
      printf("%s\n", duet_version_line);
      return 0;
    }
  if (!strcmp(cmd, "run") || !strcmp(cmd, "compile") || !strcmp(cmd, "ir") || !strcmp(cmd, "emit") ||
      !strcmp(cmd, "check") || !strcmp(cmd, "plan")) {
    int n = strip_precision_flags(argc - 2, argv + 2);
    if (n < 0 || check_precision_flags(cmd)) return 1;
    if ((n = strip_prune_flags(n, argv + 2)) < 0) return 1;
    argc = n + 2;
    if (!strcmp(cmd, "run") && quantize_train_refused(argc - 2, argv + 2)) return 1;
    if (shrink_refused(cmd, argc - 2, argv + 2)) return 1;
    for (int i = 2; !strcmp(cmd, "run") && opt_offload && i < argc; i++) /* --offload: a compile-time flag here */
      if (!strcmp(argv[i], "--eval-only")) return duet_eval_only_refuse("--offload");
    if ((!strcmp(cmd, "run") || !strcmp(cmd, "compile")) && opt_arch && strcmp(opt_arch, "cpu")) {
      fprintf(stderr, "duet: error: duet %s builds for the CPU; --arch %s is for duet ir and duet check\n", cmd,
              opt_arch);
      return 1;
    }
  }
  if (!strcmp(cmd, "run")) return cmd_run(argc - 2, argv + 2);
  if (!strcmp(cmd, "compile")) return cmd_compile(argc - 2, argv + 2);
  if (!strcmp(cmd, "ir")) return cmd_ir(argc - 2, argv + 2);
  if (!strcmp(cmd, "emit")) return cmd_emit(argc - 2, argv + 2);
  if (!strcmp(cmd, "plan")) return cmd_plan(argc - 2, argv + 2);
  if (!strcmp(cmd, "devices")) {
    if (argc > 2 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
      printf("usage: duet devices\nLists the CPU and, when a CUDA driver and libduet_cuda.so load, the GPUs\n"
             "(name, compute capability, memory, driver and NVRTC versions).\n");
      return 0;
    }
    if (argc > 2) {
      fprintf(stderr, "duet: error: unexpected argument '%s' (see duet devices --help)\n", argv[2]);
      return 1;
    }
    return duet_list_devices(stdout);
  }
  if (!strcmp(cmd, "check")) return cmd_check(argc - 2, argv + 2);
  if (!strcmp(cmd, "sample")) return cmd_sample(argc - 2, argv + 2);
  if (!strcmp(cmd, "plot")) return cmd_plot(argc - 2, argv + 2);
  if (!strcmp(cmd, "predict") || !strcmp(cmd, "export")) { /* --prune flags and --shrink: a shrunk program */
    int n = strip_prune_flags(argc - 2, argv + 2);
    if (n < 0 || shrink_refused(cmd, n, argv + 2)) return 1;
    argc = n + 2;
  }
  if (!strcmp(cmd, "predict")) return cmd_predict(argc - 2, argv + 2);
  if (!strcmp(cmd, "export")) return cmd_export(argc - 2, argv + 2);
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "duet: error: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 1;
}
