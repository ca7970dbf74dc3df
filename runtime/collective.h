/* runtime/collective.h: collectives between the replicas of a data-parallel
 * run (private to runtime/).
 *
 * A collective is a table of function pointers over the R ranks (replicas)
 * of a run, as a device is (ggml's backend interface).  Each rank calls
 * every operation once, with the same tag, buffer count, element counts
 * and dtypes as the other ranks, in the same order per tag; operations on
 * different tags may interleave (each stage of a pipelined replica reduces
 * its own buckets).  Implementations: shared memory between the replicas
 * of one process (duet_coll_shm_new; with duet_coll_shm_direct, device
 * buffers are summed on the devices); NCCL between the replicas' GPUs
 * (duet_coll_nccl_new: runtime/cuda/nccl.c in the CUDA plugin); MPI
 * between processes and machines, one replica per rank
 * (runtime/collective_mpi.c, in the plugin libduet_mpi.so that
 * runtime/dist.c loads under an MPI launcher).  reduce_scatter_start and
 * all_gather_start serve ZeRO stage 1 (optimizer-state sharding): shared
 * memory and MPI as such, NCCL as an all-reduce and per-buffer broadcasts
 * (runtime/cuda/nccl.c).
 *
 * Every function returns 0, or -1 with a message in err (a timeout naming
 * the rank waited for, an abort, mismatched buffers, a device's copy
 * failure). */
#ifndef DUET_COLLECTIVE_H
#define DUET_COLLECTIVE_H

#include <stdbool.h>

#include "duet_rt.h"

/* One buffer of an operation: n elements of dtype (DUET_F32, DUET_F64 or
 * DUET_I32) at ptr, in the memory of the device passed with the list (NULL:
 * host memory, which the collective reads and writes directly). */
typedef struct DuetCollBuf {
  void *ptr;
  int64_t n;
  int dtype;
} DuetCollBuf;

typedef struct DuetColl DuetColl;
typedef struct DuetCollOps {
  const char *name; /* "shared memory", "NCCL" */
  /* Starts the sum over the ranks of the n buffers b (on dev) under tag:
   * when it completes, every rank's buffers hold, element by element, the
   * same sum of the ranks' values (one rounding per add, so the result
   * does not depend on timing): shared memory adds in rank order 0, 1,
   * ..., R-1; NCCL in its ring's order (a rotation of the ring for each
   * chunk of the elements; with R = 2 the same bits, as a + b = b + a).
   * The buffers must not be written until allreduce_wait returns. */
  int (*allreduce_start)(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n, char *err,
                         size_t errlen);
  /* Waits for the sum started under tag by this rank (the buffers hold it
   * on return); also for a reduce-scatter or an all-gather. */
  int (*allreduce_wait)(DuetColl *c, int rank, int tag, char *err, size_t errlen);
  /* Every rank's buffers receive rank root's (blocking). */
  int (*broadcast)(DuetColl *c, int rank, int root, DuetDevice *dev, const DuetCollBuf *b, int n, char *err,
                   size_t errlen);
  /* Returns once every rank has called it. */
  int (*barrier)(DuetColl *c, int rank, char *err, size_t errlen);
  /* Makes every waiting and later call fail (a rank's failure must not
   * leave the others waiting); `why` is told to them.  Any thread. */
  void (*abort)(DuetColl *c, const char *why);
  /* ZeRO stage 1 (NULL: not provided).  The n buffers are split into R
   * parts of whole buffers: part k, rank k's, is buffers split[k] ..
   * split[k + 1] - 1 (split: R + 1 indices, split[0] = 0, split[R] = n,
   * non-decreasing; a part may be empty), the same on every rank
   * (MPI_Reduce_scatter's uneven counts, cut at buffer boundaries).
   * reduce_scatter_start: when it completes, rank k's buffers of part k
   * hold the sum over the ranks, element by element, added in rank order
   * 0, 1, ..., R-1 (allreduce_start's sum, bit for bit); its other buffers
   * are unspecified.  all_gather_start: when it completes, every rank's
   * buffers of part k hold rank k's values of them (byte copies).  Both
   * complete through allreduce_wait on the same tag; the buffers must not
   * be written until it returns. */
  int (*reduce_scatter_start)(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                              const int *split, char *err, size_t errlen);
  int (*all_gather_start)(DuetColl *c, int rank, int tag, DuetDevice *dev, const DuetCollBuf *b, int n,
                          const int *split, char *err, size_t errlen);
  void (*destroy)(DuetColl *c);
  /* Optional (NULL: nothing to do).  Lets the operations this rank has
   * started under the tags it owns move on without waiting (MPI's
   * non-blocking collectives advance only inside MPI calls): the pipeline
   * calls it between the steps of a backward pass while buckets are in
   * flight.  0, or -1 with a message (the failure is reported again by the
   * wait). */
  int (*progress)(DuetColl *c, int rank, char *err, size_t errlen);
  /* Optional (NULL: no figures).  For tag: the calls completed so far,
   * the bytes this rank sent for them, the seconds from each start to its
   * completion as seen by this rank, and the seconds its waits blocked
   * (the part not hidden behind other work).  tag -1: the sums over every
   * tag, except busy_s: the seconds during which at least one operation
   * was in flight (overlapping operations counted once). */
  void (*stats)(DuetColl *c, int tag, int64_t *calls, int64_t *bytes, double *busy_s, double *wait_s);
} DuetCollOps;

struct DuetColl {
  const DuetCollOps *ops;
  int n_ranks;
  void *ctx;
};

/* The shared-memory collective of n_ranks replicas in this process (each
 * rank a thread, or several: one per tag), for tags 0 .. n_tags-1.
 * Deterministic: each element of a sum is added in rank order 0..R-1,
 * the work split among the ranks' threads by contiguous chunks of the
 * elements (rank k sums chunk k for everyone), the result written to every
 * rank.  Buffers on a device whose memory is not host memory (a GPU) go
 * through host staging: copy_to_host when the rank starts, copy_to_device
 * when it has waited.  A wait gives up after `timeout` seconds naming a
 * rank that has not arrived.  NULL with a message in err. */
DuetColl *duet_coll_shm_new(int n_ranks, int n_tags, double timeout, char *err, size_t errlen);

/* Makes tag `tag` of the shared-memory collective c sum on the devices:
 * every call on it passes device buffers (dev not NULL) of f32 or f64 on
 * devices that copy directly between every pair (peer_path not
 * DUET_PEER_NONE, the caller has asked it once for each ordered pair, a
 * device with itself included) and sum in their memory (accumulate).  A
 * call then never touches host memory: each rank copies chunk k of its
 * buffers into rank k's staging (copy_peer, on its own device, a block of
 * R slots that rank k allocates on its device), rank k sums the R slots
 * in rank order with accumulate into its own buffers and copies the sum
 * to every other rank's (copy_peer).  The arithmetic is the host path's
 * (one rounding per add, ranks in order): the same bits.  Call before the
 * tag's first use.  0, or -1 with a message (not a shared-memory
 * collective, tag out of range). */
int duet_coll_shm_direct(DuetColl *c, int tag, char *err, size_t errlen);

/* NCCL between the GPUs of the replicas (runtime/cuda/nccl.c, in the CUDA
 * plugin; reached through runtime/cuda_loader.c), for R replicas of S
 * stages: devs[s * R + r] is replica r's device of stage s, a CUDA device
 * of the plugin, the R devices of a stage distinct GPUs (one communicator
 * per stage, ncclCommInitAll over them, in replica order).  tag_stage[t]
 * (n_tags entries): the stage whose devices tag t's device buffers live
 * on, -1 for tags that only pass host memory.  Calls with host buffers
 * (dev NULL), barriers and host broadcasts go to `host` (a shared-memory
 * collective over the same ranks and tags), which the NCCL collective
 * owns once it is returned (and destroys with itself).  A wait polls the
 * bucket's completion for at most `timeout` seconds, then calls
 * ncclCommAbort on every communicator and fails; abort does the same.
 * profile: time each bucket on the GPU (CUDA events) and print, when
 * destroyed, the communication time per stage.  NCCL is libnccl.so.2, or
 * $DUET_NCCL_LIBRARY, loaded with dlopen.  *desc receives a description
 * for the start-up line ("NCCL 2.26.5 (libnccl.so.2, built with CUDA
 * 12.9) in its ring order, ..."); NULL with the reason in err (no plugin,
 * NCCL missing: naming the library and the package; an NCCL whose build
 * cannot drive a card, naming both; NCCL's own errors), `host` then still
 * the caller's. */
DuetColl *duet_coll_nccl_new(DuetDevice *const *devs, int R, int S, const int *tag_stage, int n_tags, double timeout,
                             bool profile, DuetColl *host, char *desc, size_t desclen, char *err, size_t errlen);

/* NCCL between the GPUs of the ranks of an MPI run, this process being
 * rank `rank` of R (one replica of S stages on devs[0 .. S-1], CUDA
 * devices of the plugin), in two steps around the MPI exchange the caller
 * makes.  First duet_coll_nccl_rank_new: loads NCCL, checks it can drive
 * the local GPUs, makes the streams and events (no peer is involved, so a
 * failure here can be agreed on by the ranks before anyone blocks); rank 0
 * also fills ids (S x DUET_COLL_NCCL_ID_BYTES bytes) with a
 * ncclGetUniqueId per stage, which the caller broadcasts to every rank.
 * Then duet_coll_nccl_connect: ncclCommInitRank(R, ids[s], rank) on each
 * stage's GPU, in stage order (it blocks until every rank has joined), and
 * `host` (the MPI collective over the same ranks and tags: host buffers,
 * barriers, host broadcasts, aborts) used by c from then on but still the
 * caller's, to destroy after c.  The collective is otherwise
 * duet_coll_nccl_new's, with this one local rank: the buckets' device
 * buffers all-reduced by NCCL on a communication stream, a wait that
 * gives up after `timeout` seconds with ncclCommAbort.  NULL / -1 with
 * the reason in err (no plugin, NCCL missing naming the package, a card
 * NCCL's build cannot drive, NCCL's own errors such as two ranks on one
 * GPU); c is the caller's to destroy either way. */
#define DUET_COLL_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */
DuetColl *duet_coll_nccl_rank_new(DuetDevice *const *devs, int R, int rank, int S, const int *tag_stage, int n_tags,
                                  double timeout, bool profile, void *ids, char *desc, size_t desclen, char *err,
                                  size_t errlen);
int duet_coll_nccl_connect(DuetColl *c, const void *ids, DuetColl *host, char *err, size_t errlen);

#endif
