#define _GNU_SOURCE /* fopencookie, dlopen */
/* runtime/dist.c: runs of several processes (runtime/dist.h): the
 * launcher's environment, the dlopen of the MPI plugin libduet_mpi.so
 * (found as the CUDA plugin is: runtime/cuda_loader.c), stderr lines
 * prefixed with the rank, and the training driver's checks across ranks.
 * The runtime itself never links MPI. */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "dist.h"
#include "progress.h"
#include "dlplugin.h"
#include "pipeline.h"

#ifndef DUET_MPI_PLUGIN_DEFAULT
#define DUET_MPI_PLUGIN_DEFAULT "libduet_mpi.so"
#endif

/* The launchers' variables: the number of ranks and this process's rank. */
static const struct {
  const char *size, *rank, *who;
} launchers[] = {
    {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "Open MPI's mpirun"},
    {"PMI_SIZE", "PMI_RANK", "a PMI launcher (MPICH's mpiexec, srun --mpi=pmi2)"},
    /* a job step's tasks (not SLURM_NTASKS: a batch script has it too, and
     * a plain run there is no rank of anything) */
    {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "Slurm's srun"},
};

/* A decimal integer 0 .. 1e6, else -1. */
static long env_num(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) return -1;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  return errno || *end || x < 0 || x > 1000000 ? -2 : x;
}

int duet_launch_ranks(int *rank, char *var, size_t varlen) {
  *rank = 0;
  if (varlen) var[0] = 0;
  for (size_t k = 0; k < sizeof launchers / sizeof *launchers; k++) {
    long size = env_num(launchers[k].size);
    if (size == -1) continue;
    long r = env_num(launchers[k].rank);
    if (size == -2 || size == 0 || r < 0 || r >= size) {
      snprintf(var, varlen, "%s='%s' and %s='%s' do not name a rank of a run (set by %s)", launchers[k].size,
               getenv(launchers[k].size), launchers[k].rank, getenv(launchers[k].rank) ? getenv(launchers[k].rank) : "",
               launchers[k].who);
      return -1;
    }
    if (size == 1 && k >= 2) continue; /* one Slurm task: not an MPI run */
    *rank = (int)r;
    snprintf(var, varlen, "%s=%ld", launchers[k].size, size);
    return (int)size;
  }
  return 1;
}

/* ---------------------------------------------------------- rank stderr */

typedef struct RankOut {
  bool bol; /* at the beginning of a line */
  char prefix[40];
} RankOut;

static int write_all(const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(2, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w, n -= (size_t)w;
  }
  return 0;
}

/* Lines that start "duet: " (and not "duet: rank ") get "duet: rank R: ".
 * One write(2) per call (a launcher that merges the ranks' output then
 * keeps each line whole). */
static ssize_t rank_write(void *cookie, const char *buf, size_t n) {
  RankOut *o = cookie;
  size_t lines = 1, plen = strlen(o->prefix);
  for (size_t i = 0; i < n; i++) lines += buf[i] == '\n';
  char *out = malloc(n + lines * plen);
  if (!out) return write_all(buf, n) ? -1 : (ssize_t)n;
  size_t at = 0, len = 0;
  while (at < n) {
    if (o->bol && n - at >= 6 && !memcmp(buf + at, "duet: ", 6) && (n - at < 11 || memcmp(buf + at, "duet: rank ", 11))) {
      memcpy(out + len, o->prefix, plen);
      len += plen;
      at += 6;
    }
    const char *nl = memchr(buf + at, '\n', n - at);
    size_t k = nl ? (size_t)(nl - (buf + at)) + 1 : n - at;
    memcpy(out + len, buf + at, k);
    len += k;
    at += k;
    o->bol = nl != NULL;
  }
  int rc = write_all(out, len);
  free(out);
  return rc ? -1 : (ssize_t)n;
}

void duet_rank_stderr(void) {
  int rank;
  char var[300];
  if (duet_launch_ranks(&rank, var, sizeof var) <= 1) return;
  if (fileno(stderr) != 2) return; /* replaced already (a cookie stream has no descriptor) */
  /* The stream's buffer and its state in one block that lives as long as
   * the process: the stream holds it as its buffer (glibc keeps the cookie
   * where LeakSanitizer does not see it, the buffer where it does). */
  enum { BUF = 4096 };
  char *block = malloc(BUF + sizeof(RankOut));
  if (!block) return;
  RankOut *o = (RankOut *)(block + BUF);
  o->bol = true;
  snprintf(o->prefix, sizeof o->prefix, "duet: rank %d: ", rank);
  cookie_io_functions_t io = {.read = NULL, .write = rank_write, .seek = NULL, .close = NULL};
  FILE *f = fopencookie(o, "w", io);
  if (!f || setvbuf(f, block, _IOLBF, BUF)) {
    if (f) fclose(f);
    free(block);
    return;
  }
  fflush(stderr);
  stderr = f;
}

/* ---------------------------------------------------------- the plugin */

struct DuetDist {
  const DuetMpiPlugin *mpi;
  int rank, size;
  DuetColl *coll; /* the driver's: tag 0 compare, 1 agree, 2 gather */
  double timeout;
  const volatile sig_atomic_t *stop;
  char name[200];
};

typedef const DuetMpiPlugin *(*PluginFn)(void);

/* The plugin in handle h, when it is one of this API. */
static const DuetMpiPlugin *plugin_of(void *h) {
  PluginFn fn = (PluginFn)dlsym(h, "duet_mpi_plugin");
  const DuetMpiPlugin *pl = fn ? fn() : NULL;
  return pl && pl->api == DUET_MPI_PLUGIN_API ? pl : NULL;
}

/* Loads libduet_mpi.so: $DUET_MPI_PLUGIN (only it, when set), else next to
 * the executable, else the build tree's copy, else the dynamic loader's
 * search path.  The handle stays open for the life of the process.  NULL
 * with the reason in err. */
static bool mpi_compatible(void *h) { return plugin_of(h) != NULL; }

static const DuetMpiPlugin *load_plugin(char *err, size_t errlen) {
  bool named;
  char last[600];
  /* RTLD_GLOBAL: Open MPI loads its components with dlopen and they need
   * libmpi's symbols */
  void *h = duet_dlplugin_open("DUET_MPI_PLUGIN", "libduet_mpi.so", DUET_MPI_PLUGIN_DEFAULT, RTLD_NOW | RTLD_GLOBAL,
                               mpi_compatible, "MPI", &named, last, sizeof last);
  if (h) return plugin_of(h);
  if (named) snprintf(err, errlen, "%s", last);
  else if (last[0]) snprintf(err, errlen, "duet's MPI plugin libduet_mpi.so cannot be loaded (%s)", last);
  else snprintf(err, errlen, "duet's MPI plugin libduet_mpi.so was not found (next to the program, in %s, or on the "
                "loader's path)", DUET_MPI_PLUGIN_DEFAULT);
  return NULL;
}

DuetDist *duet_dist_open(double timeout, const volatile sig_atomic_t *stop, char *err, size_t errlen) {
  int rank;
  char var[300], why[800];
  int size = duet_launch_ranks(&rank, var, sizeof var);
  if (size < 0) {
    snprintf(err, errlen, "%s", var);
    return NULL;
  }
  DuetPipeEnv env; /* DUET_PIPE_TIMEOUT: how long a collective wait goes on */
  if (duet_pipe_env(&env, timeout, err, errlen)) return NULL;
  timeout = env.timeout;
  const DuetMpiPlugin *mpi = load_plugin(why, sizeof why);
  if (!mpi) {
    snprintf(err, errlen, "started as rank %d of %d by an MPI launcher (%s), but MPI cannot be used: %s; install Open "
             "MPI (Debian packages openmpi-bin and libopenmpi-dev: apt-get install openmpi-bin libopenmpi-dev) and "
             "build duet with it (CMake then builds libduet_mpi.so beside the duet binary)", rank, size, var, why);
    return NULL;
  }
  DuetDist *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  d->mpi = mpi;
  d->timeout = timeout;
  d->stop = stop;
  char version[160];
  if (mpi->init(&d->rank, &d->size, version, sizeof version, why, sizeof why)) {
    snprintf(err, errlen, "MPI did not start (%s): %s", var, why);
    free(d);
    return NULL;
  }
  if (d->size != size || d->rank != rank) {
    snprintf(err, errlen, "the launcher started %d ranks (%s; this one rank %d) but MPI sees %d (this one rank %d): "
             "the processes are not connected; under Slurm start them with srun --mpi=pmix (or pmi2), else with "
             "mpirun", size, var, rank, d->size, d->rank);
    mpi->finalize();
    free(d);
    return NULL;
  }
  snprintf(d->name, sizeof d->name, "MPI (%d ranks, %s)", d->size, version);
  if (!(d->coll = mpi->coll_new(3, timeout, stop, why, sizeof why))) {
    snprintf(err, errlen, "MPI: %s", why);
    mpi->finalize();
    free(d);
    return NULL;
  }
  return d;
}

int duet_dist_rank(const DuetDist *d) { return d->rank; }
int duet_dist_size(const DuetDist *d) { return d->size; }
const char *duet_dist_name(const DuetDist *d) { return d->name; }

DuetColl *duet_dist_coll(DuetDist *d, int n_tags, char *err, size_t errlen) {
  return d->mpi->coll_new(n_tags, d->timeout, d->stop, err, errlen);
}

/* The sum over the ranks of an i32 vector of n x size entries in which
 * each rank fills its own n: a gather (exact: the others' entries are
 * zero).  0, or -1 with a message. */
static int gather_i32(DuetDist *d, int tag, uint32_t *v, int64_t n, char *err, size_t errlen) {
  DuetCollBuf b = {.ptr = v, .n = n * d->size, .dtype = DUET_I32};
  if (d->coll->ops->allreduce_start(d->coll, d->rank, tag, NULL, &b, 1, err, errlen) ||
      d->coll->ops->allreduce_wait(d->coll, d->rank, tag, err, errlen))
    return -1;
  return 0;
}

int duet_dist_compare(DuetDist *d, const char *const *names, const uint64_t *vals, int n, int *bad_rank, char *err,
                      size_t errlen) {
  *bad_rank = -1;
  uint32_t *v = calloc((size_t)d->size * (size_t)n * 2 + 1, sizeof *v);
  if (!v) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  for (int f = 0; f < n; f++) {
    v[((size_t)d->rank * (size_t)n + (size_t)f) * 2] = (uint32_t)vals[f];
    v[((size_t)d->rank * (size_t)n + (size_t)f) * 2 + 1] = (uint32_t)(vals[f] >> 32);
  }
  if (gather_i32(d, 0, v, (int64_t)n * 2, err, errlen)) {
    free(v);
    return -1;
  }
  int rc = 0;
  for (int k = 1; k < d->size && !rc; k++)
    for (int f = 0; f < n && !rc; f++)
      if (memcmp(&v[((size_t)k * (size_t)n + (size_t)f) * 2], &v[(size_t)f * 2], 2 * sizeof *v)) {
        *bad_rank = k;
        snprintf(err, errlen, "rank %d was started with another %s than rank 0 (every rank must run the same model "
                 "and duet with the same flags and data: mpirun -np N duet run M.model FLAGS)", k, names[f]);
        rc = -1;
      }
  free(v);
  return rc;
}

int duet_dist_agree(DuetDist *d, int local, int *out, char *err, size_t errlen) {
  uint32_t *v = calloc((size_t)d->size, sizeof *v);
  if (!v) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  v[d->rank] = (uint32_t)local;
  int rc = gather_i32(d, 1, v, 1, err, errlen);
  int most = 0;
  for (int k = 0; !rc && k < d->size; k++)
    if ((int)v[k] > most) most = (int)v[k];
  free(v);
  *out = most;
  return rc;
}

int duet_dist_gather(DuetDist *d, uint64_t mine, uint64_t *all, char *err, size_t errlen) {
  uint32_t *v = calloc((size_t)d->size * 2, sizeof *v);
  if (!v) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  v[2 * d->rank] = (uint32_t)mine;
  v[2 * d->rank + 1] = (uint32_t)(mine >> 32);
  int rc = gather_i32(d, 2, v, 2, err, errlen);
  for (int k = 0; !rc && k < d->size; k++) all[k] = (uint64_t)v[2 * k] | (uint64_t)v[2 * k + 1] << 32;
  free(v);
  return rc;
}

void duet_dist_abort(DuetDist *d, int code) {
  fflush(stdout);
  fflush(stderr);
  d->mpi->abort(code ? code : 1);
  _Exit(code ? code : 1);
}

void duet_dist_close(DuetDist *d) {
  if (!d) return;
  if (d->coll) d->coll->ops->destroy(d->coll);
  d->mpi->finalize();
  free(d);
}

/* ------------------------------------------------------ the settings */

static uint64_t h_bytes(uint64_t h, const void *p, size_t n);
static uint64_t h_i64(uint64_t h, int64_t x);
static uint64_t h_str(uint64_t h, const char *s);
static uint64_t h_f64(uint64_t h, double x) { return h_bytes(h, &x, sizeof x); }

int duet_dist_check_ranks(DuetDist *d, const DuetProgram *p, const DuetConfig *c, uint64_t data_bytes,
                          int *bad_rank, char *err, size_t errlen) {
  const char *names[24];
  uint64_t vals[24];
  int n = 0;
  const uint64_t O = DUET_FNV_OFFSET;
  names[n] = "program (model, kernels, tensors and steps: another model or duet, or a flag that changes the "
             "compiled program: --batch, --micro-batches, --bucket-mb, --zero, --precision, --prune, --prune-mode, "
             "--prune-start, --prune-end, --prune-every, --prune-initial)";
  vals[n++] = duet_program_hash(p);
  names[n] = "duet runtime (interface versions)";
  vals[n++] = h_i64(h_i64(h_i64(O, DUET_RT_API_VERSION), DUET_CUDA_PLUGIN_API), DUET_MPI_PLUGIN_API);
  names[n] = "--seed";
  vals[n++] = h_i64(O, (int64_t)c->seed);
  names[n] = "training length (--steps, --epochs)";
  vals[n++] = h_i64(h_i64(O, c->steps), c->epochs);
  names[n] = "--lr";
  vals[n++] = h_f64(O, c->lr);
  names[n] = "--weight-decay";
  vals[n++] = h_f64(O, c->weight_decay);
  names[n] = "optimizer (the train section's optimizer, betas, eps, momentum)";
  vals[n++] = h_f64(h_f64(h_f64(h_f64(h_i64(O, c->optimizer), c->beta1), c->beta2), c->eps), c->momentum);
  names[n] = "--data";
  vals[n++] = h_f64(h_str(h_str(h_str(h_str(h_i64(O, c->data), c->data_path), c->data_y), c->val_x), c->val_y),
                    c->val_fraction);
  names[n] = "data (the size of its files)";
  vals[n++] = h_i64(O, (int64_t)data_bytes);
  names[n] = "--train-subset";
  vals[n++] = h_i64(O, c->train_subset);
  names[n] = "--test-subset";
  vals[n++] = h_i64(O, c->test_subset);
  names[n] = "evaluation (--no-eval, --eval-every, --eval-batches)";
  vals[n++] = h_i64(h_i64(h_i64(h_i64(O, c->eval), c->eval_every), c->eval_batches), c->block);
  names[n] = "loss scale (--loss-scale, --min-loss-scale)";
  vals[n++] = h_f64(h_f64(O, c->loss_scale), c->min_loss_scale);
  names[n] = "--schedule";
  vals[n++] = h_i64(O, c->schedule);
  names[n] = "learning-rate schedule or clipping (--lr-schedule, --warmup, --min-lr, --clip-grad-norm)";
  vals[n++] = h_f64(h_f64(h_i64(h_i64(O, c->lr_schedule), c->warmup), c->min_lr), c->clip_grad_norm);
  names[n] = "--resume (the checkpoint's bytes)";
  uint64_t ck = h_i64(O, 0);
  if (c->resume_path) {
    size_t len;
    void *b = duet_read_file(c->resume_path, &len);
    ck = b ? duet_fnv1a(b, len, O) : h_str(O, c->resume_path); /* unreadable: its resume reports it */
    free(b);
  }
  vals[n++] = ck;
  names[n] = "devices per rank (--devices: their number and kinds)";
  DuetDeviceSpec spec[DUET_MAX_DEVICES];
  char e[400];
  uint64_t dv = h_i64(O, -1);
  if (!duet_pipe_rank_devices(p, c->devices, d->rank, spec, e, sizeof e)) {
    int S = p->n_stages > 1 ? p->n_stages : 1;
    dv = h_i64(O, S);
    for (int k = 0; k < S; k++) dv = h_i64(dv, spec[k].kind);
  }
  vals[n++] = dv;
  names[n] = "DUET_DP_CHECK or DUET_DP_DROP";
  vals[n++] = h_str(h_str(O, getenv("DUET_DP_CHECK")), getenv("DUET_DP_DROP"));
  return duet_dist_compare(d, names, vals, n, bad_rank, err, errlen);
}

/* ------------------------------------------------------ the program hash */

static uint64_t h_bytes(uint64_t h, const void *p, size_t n) { return duet_fnv1a(p, n, h); }
static uint64_t h_i64(uint64_t h, int64_t x) { return h_bytes(h, &x, sizeof x); }
static uint64_t h_str(uint64_t h, const char *s) { return s ? h_bytes(h, s, strlen(s) + 1) : h_i64(h, -1); }

static uint64_t h_steps(uint64_t h, const DuetStep *s, int n) {
  h = h_i64(h, n);
  for (int i = 0; s && i < n; i++) {
    const DuetStep *x = &s[i];
    int64_t f[] = {x->kind, x->kernel, x->ta, x->tb, x->m, x->n, x->k, x->a, x->b, x->c, x->dtype};
    h = h_bytes(h, f, sizeof f);
  }
  return h;
}

uint64_t duet_program_hash(const DuetProgram *p) {
  uint64_t h = DUET_FNV_OFFSET;
  h = h_i64(h, p->api_version);
  h = h_str(h, p->model_name);
  h = h_i64(h, p->n_tensors);
  for (int i = 0; i < p->n_tensors; i++) {
    const DuetTensor *t = &p->tensors[i];
    h = h_str(h, t->name);
    int64_t f[] = {t->region, t->dtype, t->rank, t->offset, t->nbytes, t->init, t->stage, t->is_grad};
    h = h_bytes(h, f, sizeof f);
    h = h_bytes(h, t->shape, sizeof t->shape);
    h = h_bytes(h, &t->init_a, sizeof t->init_a);
    h = h_bytes(h, &t->init_b, sizeof t->init_b);
  }
  h = h_i64(h, p->n_kernels);
  h = h_steps(h, p->train, p->n_train);
  h = h_steps(h, p->eval, p->n_eval);
  h = h_steps(h, p->grad, p->n_grad);
  int64_t f[] = {p->input_x, p->input_y, p->loss, p->metrics, p->logits, p->decode, p->n_classes, p->gemm_flops,
                 p->gemm_accumulate_f16, p->n_unscale, p->update_from, p->n_stages, p->n_transfers,
                 p->micro_batches, p->replicas, p->n_buckets, p->cuda_n_fns};
  h = h_bytes(h, f, sizeof f);
  h = h_bytes(h, p->region_bytes, sizeof p->region_bytes);
  for (int s = 0; p->stages && s < p->n_stages; s++) {
    const DuetStage *st = &p->stages[s];
    h = h_steps(h, st->fwd, st->n_fwd);
    h = h_steps(h, st->bwd, st->n_bwd);
    h = h_steps(h, st->opt, st->n_opt);
    h = h_steps(h, st->eval, st->n_eval);
    h = h_bytes(h, st->region_bytes, sizeof st->region_bytes);
  }
  for (int i = 0; p->transfers && i < p->n_transfers; i++) {
    const DuetTransfer *t = &p->transfers[i];
    int64_t g[] = {t->src, t->dst, t->from, t->to, t->nbytes};
    h = h_bytes(h, g, sizeof g);
  }
  if (p->kernel_arg_off && p->n_kernels > 0) {
    h = h_bytes(h, p->kernel_arg_off, (size_t)(p->n_kernels + 1) * sizeof *p->kernel_arg_off);
    h = h_bytes(h, p->kernel_args, (size_t)p->kernel_arg_off[p->n_kernels] * sizeof *p->kernel_args);
  }
  if (p->bucket_off && p->n_buckets > 0) {
    h = h_bytes(h, p->bucket_off, (size_t)(p->n_buckets + 1) * sizeof *p->bucket_off);
    h = h_bytes(h, p->bucket_tensors, (size_t)p->bucket_off[p->n_buckets] * sizeof *p->bucket_tensors);
    h = h_bytes(h, &p->zero, sizeof p->zero);
    if (p->zero && p->tensor_shard) h = h_bytes(h, p->tensor_shard, (size_t)p->n_tensors * sizeof *p->tensor_shard);
  }
  h = h_bytes(h, &p->bucket_mb, sizeof p->bucket_mb);
  h = h_i64(h, p->zero);
  h = h_i64(h, p->prune != NULL);
  if (p->prune) {
    const DuetPrune *pr = p->prune;
    int64_t g[] = {pr->mode, pr->nm_n, pr->nm_m, pr->start, pr->end, pr->every, pr->n_params};
    h = h_bytes(h, g, sizeof g);
    h = h_f64(h, pr->initial);
    h = h_f64(h, pr->final);
    for (int i = 0; pr->params && i < pr->n_params; i++) {
      const DuetPruneParam *q = &pr->params[i];
      int64_t v[] = {q->param, q->mask, q->state[0], q->state[1], q->out_n, q->out_stride, q->in_n, q->in_stride};
      h = h_bytes(h, v, sizeof v);
    }
  }
  h = h_str(h, p->cuda_source);
  h = h_i64(h, (int64_t)p->source_hash);
  return h;
}

bool duet_warns(void) {
  int rank = 0;
  char var[400];
  return duet_launch_ranks(&rank, var, sizeof var) <= 1 || rank == 0;
}
