/* runtime/pipeline.h: the micro-batch pipeline inside a session (private
 * to runtime/; sessions in cpu.c use it for programs with n_stages >= 1). */
#ifndef DUET_PIPELINE_H
#define DUET_PIPELINE_H

#include <stdbool.h>

#include "duet_rt.h"

typedef struct DuetPipe DuetPipe;

/* Loads a pipelined program: one device per stage and replica from
 * cfg->devices (replica r's stages are items r*S .. r*S+S-1; virtual CPU
 * devices cpu:0 .. cpu:R*S-1 when NULL), each with its own regions (params, state, and one
 * activation region per micro-batch in flight: M for GPipe, min(M, S - s)
 * for 1F1B), a worker thread with cfg->threads / (R x S) cores (at least 1),
 * staging buffers for every transfer and micro-batch (one block per
 * transfer: on the receiving device when the pair of devices copies
 * directly, else in host memory; see runtime/pipeline.c), and gradient
 * accumulators.  NULL with a message in err (bad spec, device count not
 * the program's stages, DUET_PIPE_TIMEOUT / DUET_PIPE_STAGING /
 * DUET_PIPE_DROP_SEND malformed, a device's failure to set up a peer path
 * or to allocate, out of memory, a CUDA device in a CPU-only build). */
/* The pipeline's environment, read and checked in one place (by
 * duet_pipe_new, and by duet_devices_preflight before any kernel is
 * compiled):
 *   DUET_PIPE_TIMEOUT   seconds, > 0 and at most DUET_PIPE_TIMEOUT_MAX
 *                       (default: `timeout` when > 0, else 120); bounded so
 *                       that a deadline is always a valid timespec
 *   DUET_PIPE_STAGING   auto | host      DUET_PIPE_SUMS   auto | host
 *   DUET_PROFILE        set, not 0: per-stage times
 *   DUET_PIPE_DROP_SEND T:M (tests)
 *   DUET_DP_CHECK       0 | 1: data parallelism: after every training step,
 *                       every replica's params and optimizer state are
 *                       compared with replica 0's (duet_pipe_compare_replicas)
 *   DUET_DP_DROP        B (tests): bucket B is never all-reduced, so the
 *                       replicas drift apart (DUET_DP_CHECK must see it)
 *   DUET_DP_COLLECTIVE  auto | shm | nccl: the collective between the
 *                       replicas (auto: NCCL when every stage's replicas
 *                       are distinct GPUs and NCCL loads, else shared
 *                       memory; see duet_pipe_new)
 * 0, or -1 with the message in err. */
#define DUET_PIPE_TIMEOUT_MAX 1e6
enum { DUET_COLL_AUTO = 0, DUET_COLL_SHM = 1, DUET_COLL_NCCL = 2 };
typedef struct DuetPipeEnv {
  double timeout;
  bool force_host, host_sums, profile, dp_check;
  int drop_t, drop_m; /* -1: none; drop_m counts micro-batches of the global batch */
  int drop_bucket;    /* -1: none */
  int collective;     /* DUET_COLL_* */
} DuetPipeEnv;
int duet_pipe_env(DuetPipeEnv *e, double timeout, char *err, size_t errlen);
/* DUET_DP_COLLECTIVE=nccl for data-parallel program p on cfg->devices:
 * every replica's device of each stage must be a GPU of its own (NCCL
 * allows one rank per GPU).  0, or -1 with the message ("DUET_DP_COLLECTIVE=
 * nccl: replicas 0 and 1 of stage 0 are both on cuda:0, and NCCL allows
 * one rank per GPU ..."); checked before compiling (duet_devices_preflight)
 * and by duet_pipe_new. */
int duet_pipe_nccl_check(const DuetProgram *p, const char *devices, char *err, size_t errlen);

DuetPipe *duet_pipe_new(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg, char *err,
                        size_t errlen);
/* duet_pipe_new for one rank of an MPI run (runtime/dist.h; dist NULL:
 * duet_pipe_new): the program's replicas must be the ranks; this process
 * holds replica duet_dist_rank(dist) on the devices duet_pipe_rank_devices
 * gives, with cfg->threads / S cores per stage, and reduces through
 * duet_dist_coll. */
typedef struct DuetDist DuetDist;
DuetPipe *duet_pipe_new_ranks(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg,
                              DuetDist *dist, char *err, size_t errlen);
/* The devices of rank `rank`'s replica of p (S stages): `devices` names
 * either S items (every rank's own devices) or replicas x S (every
 * replica's, a compiled executable's list: the rank takes its group, which
 * duet_devices_groups checks); NULL: cpu:0 .. cpu:S-1.  Fills specs[0..S).
 * 0, or -1 with a message naming the counts. */
int duet_pipe_rank_devices(const DuetProgram *p, const char *devices, int rank, DuetDeviceSpec *specs, char *err,
                           size_t errlen);
void duet_pipe_free(DuetPipe *q);
/* Host-visible address of tensor id: params and optimizer state: the
 * stage's copy; the data inputs: a staging buffer for the whole batch
 * (micro_batches x the tensor, filled by the host before a run); the loss:
 * the mean of the micro-batches' losses after a training run; the metrics:
 * their sums over the micro-batches after an evaluation; anything else: the
 * first activation region of its stage. */
void *duet_pipe_tensor(DuetPipe *q, int id);
/* The device whose memory holds duet_pipe_tensor(q, id): its stage's
 * device; NULL for the host buffers (data inputs, loss, metrics) and for
 * an id out of range. */
DuetDevice *duet_pipe_tensor_device(DuetPipe *q, int id);
/* Runs DUET_RUN_TRAIN (forward and backward of every micro-batch in the
 * configured schedule, gradients summed in micro-batch order, then each
 * stage's optimizer update) or DUET_RUN_EVAL (the micro-batches one after
 * another, stages in order; rows past n_valid are ignored).  s: the
 * runtime scalars (DUET_S_*).  0, or -1 with a message in err naming the
 * stage, micro-batch and tensor of a failed step or a timed-out wait. */
int duet_pipe_run(DuetPipe *q, int which, const double *s, int64_t n_valid, char *err, size_t errlen);
/* How transfers move between each ordered pair of stages that has any, as
 * one line for people: "stage 0 -> 1 copied between arenas (CPU), stage
 * 1 -> 0 copied between arenas (CPU)"; each pair is one of "copied between
 * arenas (CPU)", "device-to-device (same GPU)", "peer-to-peer", "staged
 * through pinned host memory" or "staged through host memory"; the line
 * ends in " (forced by DUET_PIPE_STAGING=host)" when that variable forced
 * host staging.  Empty when no tensor crosses a stage.  Lives as long as q. */
const char *duet_pipe_transfers(const DuetPipe *q);
/* The bytes each stage allocated on its device for its regions (the
 * activation region once per micro-batch in flight) and, when the device
 * sums them, its gradient accumulators, as `duet plan` counts them (not the
 * overflow flags or transfer staging): bytes[r * S + k] for this process's
 * replica r, stage k; returns how many were written (at most max). */
int duet_pipe_allocated(const DuetPipe *q, int64_t *bytes, int max);

/* A training step in two parts, for fp16 loss scaling (the decision to
 * skip the update needs every stage's overflow flags): `which` =
 * DUET_PIPE_GRADS runs the forwards and backwards and sums the gradients,
 * OR-ing each stage's overflow flags over the micro-batches; then
 * DUET_PIPE_STEP runs every stage's optimizer update (or is not called
 * when the step is skipped).  DUET_RUN_TRAIN is the two in one. */
enum { DUET_PIPE_GRADS = 100, DUET_PIPE_STEP = 101 };
/* After DUET_PIPE_GRADS: the lowest overflow flag set by any stage in any
 * micro-batch (an index into DuetProgram.unscale_names), or -1. */
int duet_pipe_first_overflow(const DuetPipe *q);

/* Gradient clipping (DuetProgram.n_clip > 0): measure != 0 makes the next
 * DUET_PIPE_GRADS jobs write the sum of squares of every gradient (each
 * stage its own, every replica); a coefficient below 1 makes DUET_PIPE_STEP
 * scale every gradient by it before the update (1: no scaling). */
void duet_pipe_set_clip(DuetPipe *q, int measure, double coef);
/* After a measuring DUET_PIPE_GRADS: *sum = the sum of squares of all
 * gradients, the per-gradient sums added in gradient order (stages
 * combined before any update).  With replicas in this process, each one's
 * sums must be bit-identical to the first's (their gradients are the same
 * after the all-reduce; an MPI rank holds one replica and measures its own
 * copy): 0, or -1 with a message naming the gradient and replica. */
int duet_pipe_grad_sumsq(const DuetPipe *q, double *sum, char *err, size_t errlen);

/* Data parallelism: the number of replicas in this process (R, 1
 * without data parallelism; 1 on each rank of an MPI run). */
int duet_pipe_replicas(const DuetPipe *q);
/* Data parallelism: how the replicas' gradients are summed, for the
 * start-up line after "summed ": "in replica order over shared memory",
 * with ", device-to-device on the GPU" (one GPU's replicas: copy_peer and
 * the device's accumulate; "on each stage's GPU" for pipelines), ", device
 * to device (peer-to-peer between the GPUs)", or " (GPU
 * buffers staged through host memory)" where the devices are GPUs; or "by
 * NCCL 2.26.5 (...) in its ring order ..."; with "; NCCL not used: WHY"
 * when NCCL was tried (auto) and failed.  "" without replicas.  Lives as
 * long as q. */
const char *duet_pipe_collective(const DuetPipe *q);
/* duet_pipe_tensor and duet_pipe_tensor_device of this process's replica
 * r (the host buffers are the same for every replica); NULL out of
 * range. */
void *duet_pipe_tensor_at(DuetPipe *q, int replica, int id);
DuetDevice *duet_pipe_tensor_device_at(DuetPipe *q, int replica, int id);
/* Compares every replica's param and optimizer-state regions with replica
 * 0's, byte for byte; on the ranks of an MPI run, a 64-bit FNV-1a of each
 * param and state tensor gathered from every rank and compared with rank
 * 0's (a collective: every rank calls it after the same step).  0 when
 * identical, else -1 with a message naming the replica (rank) and the
 * first tensor that differs (or a device's copy error). */
int duet_pipe_compare_replicas(DuetPipe *q, char *err, size_t errlen);
/* Replica-stage pairs, summed over the training steps so far, that found
 * no overflow in their own gradients when another replica's overflowed
 * (the OR over the replicas made them skip the step too). */
int64_t duet_pipe_asym_overflows(const DuetPipe *q);
/* ZeRO stage 1 (DuetProgram.zero): whether tensor id is sharded optimizer
 * state (held by one replica, duet_pipe_tensor_at NULL for the others). */
bool duet_pipe_sharded(const DuetPipe *q, int id);
/* Bytes [off, off + n) of sharded state tensor id into host memory dst:
 * from the replica that holds it (in this process), or across MPI ranks a
 * broadcast from its rank, which every other rank joins through
 * duet_pipe_serve_states (the checkpoint of rank 0 reads the sharded
 * tensors in id order, as that serves them).  0, or -1 with a message. */
int duet_pipe_read_state(DuetPipe *q, int id, size_t off, void *dst, size_t n, char *err, size_t errlen);
/* An MPI rank's part in rank 0's reading of every sharded state tensor
 * (in id order), for its checkpoint.  0, or -1 with a message. */
int duet_pipe_serve_states(DuetPipe *q, char *err, size_t errlen);

/* In host memory: dst[k] = src[k] (first) or dst[k] += src[k], k < n, for
 * dtype DUET_F32 or DUET_F64 (any other is taken as f32); elementwise, so
 * split over the OpenMP threads without changing a bit.  The CPU device's
 * accumulate op, and the pipeline's host-side gradient sums. */
void duet_host_accumulate(void *dst, const void *src, int64_t n, int dtype, int first);

/* ------------------------------------------- optimizer offload (runtime/offload.c) */

/* cfg asks for --offload optimizer (cfg->offload, the program's default
 * merged in). */
bool duet_offload_on(const DuetConfig *cfg);
/* What offload cannot run with: a program not pipelined (a compiled
 * executable built without --offload), data parallelism, pruning, a
 * decoding program.  0 (also when offload is off), or -1 with the one-line
 * message in err. */
int duet_offload_check(const DuetProgram *p, const DuetConfig *cfg, char *err, size_t errlen);
/* One stage's host side: host memory (page-locked through dev's host_alloc
 * where it has one) for an f32 master copy of the stage's param region,
 * its state region (the device allocates none) and the gradients its
 * optimizer schedule reads; a CPU device running `kernels` (the C
 * kernels; NULL is an error).  dev_params: the param region on dev.  NULL
 * with a message (out of memory, a schedule step that is no kernel). */
typedef struct DuetOffload DuetOffload;
DuetOffload *duet_offload_new(const DuetProgram *p, int stage, DuetDevice *dev, void *dev_params,
                              const DuetKernelFn *kernels, char *err, size_t errlen);
/* "duet: optimizer offload: ..." on stdout: the host's bytes, the copies per step. */
void duet_offload_print(const DuetProgram *p, const DuetSession *s);
/* The host address of byte `offset` of the stage's state region. */
void *duet_offload_state(DuetOffload *o, int64_t offset);
/* The device's params were written (initialisation, a checkpoint): the
 * next update first copies them to the master copy. */
void duet_offload_invalidate(DuetOffload *o);
/* Host bytes held (master copy, state, gradient copies); whether pinned. */
int64_t duet_offload_host_bytes(const DuetOffload *o);
bool duet_offload_pinned(const DuetOffload *o);
/* The stage's gradients (dtab: its device tensor table) copied to the host
 * now, as soon as they are final, for the next duet_offload_step (fp16
 * loss scaling: while the other stages finish theirs and the step's
 * verdict is taken); duet_offload_forget drops them (they are to change:
 * clipping scales them on the device first).  0, or -1 with a message. */
int duet_offload_fetch(DuetOffload *o, void *const *dtab, char *err, size_t errlen);
void duet_offload_forget(DuetOffload *o);
/* The stage's optimizer update on the host: the gradients to the host
 * (unless duet_offload_fetch brought them), the schedule's kernels with
 * the runtime scalars s, the params back to the device.  0, or -1 with a
 * message naming the stage and the tensor. */
int duet_offload_step(DuetOffload *o, void *const *dtab, const double *s, char *err, size_t errlen);
void duet_offload_free(DuetOffload *o);
/* Pipelines: params of tensor id's stage were written on the device (the
 * session's writes; runtime/cpu.c). */
void duet_pipe_param_written(DuetPipe *q, int id);
/* --offload optimizer: every stage's host memory is page-locked (its
 * device has host_alloc: CUDA); duet_session_offload_pinned for a session. */
bool duet_pipe_offload_pinned(const DuetPipe *q);
bool duet_session_offload_pinned(const DuetSession *s);

#endif
