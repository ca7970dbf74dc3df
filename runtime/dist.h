/* runtime/dist.h: runs of several processes (MPI ranks), private to
 * runtime/.
 *
 * Under an MPI launcher (mpirun, srun with MPI) every rank is one replica
 * of a data-parallel program (DuetProgram.replicas = the number of ranks),
 * on its own local devices.  MPI is loaded at run time, as the CUDA backend
 * is: runtime/dist.c dlopens the plugin libduet_mpi.so (linked to libmpi;
 * runtime/collective_mpi.c) only when the environment says a launcher
 * started this process as one of several ranks (duet_launch_ranks), so one
 * duet binary runs where MPI is absent.  A DuetDist is that process group:
 * MPI initialised, this rank and their number, and a collective of its own
 * for the training driver (the start-up comparison of the ranks' settings,
 * the agreement to stop on a signal).  The pipeline of a rank makes a
 * further collective for its buckets (duet_dist_coll). */
#ifndef DUET_DIST_H
#define DUET_DIST_H

#include <signal.h>

#include "collective.h"
#include "duet_rt.h"

/* The interface of libduet_mpi.so, whose duet_mpi_plugin() returns it; the
 * loader accepts only a plugin whose api equals DUET_MPI_PLUGIN_API. */
#define DUET_MPI_PLUGIN_API 1
typedef struct DuetMpiPlugin {
  int api;
  /* MPI_Init_thread asking MPI_THREAD_SERIALIZED (every MPI call of the
   * plugin is made under one lock, from whichever thread); *rank and *size
   * in MPI_COMM_WORLD; `version`: MPI_Get_library_version's first line.
   * 0, or -1 with a message. */
  int (*init)(int *rank, int *size, char *version, size_t vlen, char *err, size_t errlen);
  /* A collective over all the ranks on a communicator of its own
   * (MPI_Comm_dup of MPI_COMM_WORLD with MPI_ERRORS_RETURN: every rank
   * makes its collectives in the same order), for tags 0 .. n_tags-1.  A
   * wait gives up after `timeout` seconds naming the rank it waits for, or
   * DUET_DIST_STOP_GRACE seconds after *stop became non-zero (a SIGINT or
   * SIGTERM of this rank: see runtime/collective_mpi.c).  NULL with a
   * message. */
  DuetColl *(*coll_new)(int n_tags, double timeout, const volatile sig_atomic_t *stop, char *err, size_t errlen);
  /* MPI_Abort(MPI_COMM_WORLD, code): the launcher ends every rank. */
  void (*abort)(int code);
  /* MPI_Finalize.  0, or -1. */
  int (*finalize)(void);
} DuetMpiPlugin;

/* How long a collective wait goes on after this rank was told to stop
 * (SIGINT, SIGTERM) before it gives up naming the rank it waits for:
 * OpenMPI's mpirun, when a rank dies, sends the others SIGTERM and, 1 s
 * later, SIGKILL (its odls_base_sigkill_timeout), so a rank must say who
 * is missing within that second. */
#define DUET_DIST_STOP_GRACE 0.3

typedef struct DuetDist DuetDist;

/* Loads the MPI plugin and initialises MPI, for a process that
 * duet_launch_ranks says is one of several ranks; checks that MPI agrees
 * with the launcher's environment on the rank and the number of ranks.
 * timeout: seconds a collective wait gives up after (DUET_PIPE_TIMEOUT);
 * stop: the training driver's stop flag (a signal's number, 0 = none).
 * NULL with a message naming the package when MPI cannot be loaded. */
DuetDist *duet_dist_open(double timeout, const volatile sig_atomic_t *stop, char *err, size_t errlen);
int duet_dist_rank(const DuetDist *d);
int duet_dist_size(const DuetDist *d);
/* "MPI (2 ranks, Open MPI v4.1.4)": for the run's data-parallel line. */
const char *duet_dist_name(const DuetDist *d);
/* A collective over the ranks for n_tags tags (a pipeline's buckets,
 * flags and losses); the caller destroys it before duet_dist_close.
 * Every rank must make its collectives in the same order.  NULL with a
 * message. */
DuetColl *duet_dist_coll(DuetDist *d, int n_tags, char *err, size_t errlen);
/* The start-up check: every rank passes the same n named 64-bit values (a
 * hash of the program, of each setting that must match); 0 when every
 * rank's equal rank 0's, else -1 with the message naming the first rank
 * and the first name that differ ("rank 1 was started with another --lr
 * than rank 0"; *bad_rank receives it; every rank gets the same answer).
 * -1 with bad_rank -1 on a communication failure. */
int duet_dist_compare(DuetDist *d, const char *const *names, const uint64_t *vals, int n, int *bad_rank, char *err,
                      size_t errlen);
/* The start-up check of an MPI run (duet_dist_compare of): a hash of the
 * program (duet_program_hash), the runtime's version, and each setting
 * that must match: --seed, the training length, --lr, --weight-decay, the
 * optimizer, --data and data_bytes (the caller's figure for the data's
 * size), --train-subset, --test-subset, the evaluation settings, the loss
 * scale, --schedule, --resume (a hash of the checkpoint's bytes), the
 * kinds and number of devices per rank, DUET_DP_CHECK and DUET_DP_DROP.
 * Not compared: --threads (hosts may differ), --log-every, the outputs
 * (rank 0 writes them).  0, or -1 as duet_dist_compare. */
int duet_dist_check_ranks(DuetDist *d, const DuetProgram *p, const DuetConfig *cfg, uint64_t data_bytes,
                          int *bad_rank, char *err, size_t errlen);
/* The agreement to stop: *out receives the largest `local` over the ranks
 * (a signal's number), the same on every rank.  0, or -1 with a message. */
int duet_dist_agree(DuetDist *d, int local, int *out, char *err, size_t errlen);
/* 64-bit values gathered: all[k] receives rank k's `mine` (all: size
 * entries).  0, or -1 with a message. */
int duet_dist_gather(DuetDist *d, uint64_t mine, uint64_t *all, char *err, size_t errlen);
/* After an error this rank has reported: MPI_Abort, so that the launcher
 * ends every rank.  Does not return. */
void duet_dist_abort(DuetDist *d, int code) __attribute__((noreturn));
/* MPI_Finalize and the plugin's resources (NULL is fine). */
void duet_dist_close(DuetDist *d);

/* A data-parallel session of one rank of d (the program's replicas are
 * the ranks; this process holds replica duet_dist_rank(d) on the devices
 * of cfg->devices: its own S devices, or, when the list names replicas x
 * S, its group).  See duet_session_new_pipeline.  NULL with a message. */
DuetSession *duet_session_new_ranks(const DuetProgram *p, const DuetKernelFn *kernels, const DuetConfig *cfg,
                                    DuetDist *d, char *err, size_t errlen);

/* 64-bit FNV-1a of what defines program p's computation: its tensors,
 * schedules, kernel arguments, transfers, buckets, ZeRO stage, pruning
 * table and schedule (mode, sparsities, steps), the kernels' source hash
 * and CUDA C; not the defaults (the flags are compared one by one). */
uint64_t duet_program_hash(const DuetProgram *p);

#endif
