/* runtime/cuda/duet_nccl.h: the part of NCCL that duet calls, loaded at
 * run time with dlopen (runtime/cuda/nccl.c), so that the plugin builds
 * without nccl.h (CUDA toolkits before 13 do not ship it) and one build
 * runs where NCCL is absent, or picks up the CUDA 12 NCCL a P100 needs
 * ($DUET_NCCL_LIBRARY).
 *
 * The values below are NCCL's C ABI, stable since NCCL 2.0: results and
 * enums are ints, a communicator is an opaque pointer, a unique id 128
 * bytes (NVIDIA NCCL documentation, "API: Types").  tests/fakegpu/fakegpu.c
 * compiles against the toolkit's nccl.h and checks every value here
 * against it with _Static_assert. */
#ifndef DUET_NCCL_H
#define DUET_NCCL_H

#include <stddef.h>

/* ncclResult_t */
enum {
  DUET_NCCL_SUCCESS = 0,
  DUET_NCCL_UNHANDLED_CUDA_ERROR = 1,
  DUET_NCCL_SYSTEM_ERROR = 2,
  DUET_NCCL_INTERNAL_ERROR = 3,
  DUET_NCCL_INVALID_ARGUMENT = 4,
  DUET_NCCL_INVALID_USAGE = 5,
  DUET_NCCL_REMOTE_ERROR = 6,
  DUET_NCCL_IN_PROGRESS = 7,
};
/* ncclDataType_t (the ones duet sums) and ncclRedOp_t */
enum { DUET_NCCL_INT32 = 2, DUET_NCCL_FLOAT32 = 7, DUET_NCCL_FLOAT64 = 8 };
enum { DUET_NCCL_SUM = 0 };
#define DUET_NCCL_UNIQUE_ID_BYTES 128
/* ncclUniqueId: passed by value to ncclCommInitRank */
typedef struct DuetNcclUniqueId {
  char internal[DUET_NCCL_UNIQUE_ID_BYTES];
} DuetNcclUniqueId;

/* NCCL's entry points, with ncclComm_t as void *, cudaStream_t as void *
 * (a CUstream), enums as int.  Set by duet_nccl_open; get_last_error may
 * be NULL (NCCL before 2.13). */
typedef struct DuetNccl {
  void *dl;
  char name[256];    /* the library asked for: $DUET_NCCL_LIBRARY or libnccl.so.2 */
  char path[1024];   /* the file loaded (dladdr of ncclGetVersion) */
  int version;       /* ncclGetVersion: 22809 for 2.28.9, 2804 for 2.8.4 */
  int major, minor, patch;
  int cuda_major, cuda_minor; /* the CUDA it was built with, from its version banner; 0 when unknown */
  int (*get_version)(int *version);
  int (*comm_init_all)(void **comms, int ndev, const int *devlist);
  int (*get_unique_id)(DuetNcclUniqueId *id);
  int (*comm_init_rank)(void **comm, int nranks, DuetNcclUniqueId id, int rank);
  int (*comm_destroy)(void *comm);
  int (*comm_abort)(void *comm);
  int (*comm_get_async_error)(void *comm, int *async_error);
  int (*all_reduce)(const void *send, void *recv, size_t count, int datatype, int op, void *comm, void *stream);
  int (*broadcast)(const void *send, void *recv, size_t count, int datatype, int root, void *comm, void *stream);
  int (*group_start)(void);
  int (*group_end)(void);
  const char *(*get_error_string)(int result);
  const char *(*get_last_error)(void *comm);
} DuetNccl;

/* Loads NCCL: $DUET_NCCL_LIBRARY when set (a path or a library name), else
 * libnccl.so.2 through the dynamic loader's search path; fills n (its
 * entry points, version, path, and the CUDA version of its build read from
 * its version banner, "NCCL version 2.28.9+cuda13.0", in the library's
 * read-only data).  0, or -1 with a message naming the library and where
 * NCCL comes from (NVIDIA's libnccl2 package, the nvidia-nccl-cu12 wheel). */
int duet_nccl_open(DuetNccl *n, char *err, size_t errlen);
/* Releases what duet_nccl_open loaded (n may be zeroed). */
void duet_nccl_close(DuetNccl *n);
/* NCCL's message for result r, followed by ": " and the communicator's
 * last error when the library has ncclGetLastError and it says anything:
 * "invalid usage (run with NCCL_DEBUG=WARN for details): Duplicate GPU
 * detected ...". */
void duet_nccl_error(const DuetNccl *n, void *comm, int r, char *out, size_t outlen);
/* The lowest compute capability (x 10) that an NCCL built with CUDA
 * cuda_major supports: 75 from CUDA 13 (shared/FACTS.md: NCCL's makefiles
 * target sm_75 and later with CUDA 13; CUDA 12 builds include sm_60/61);
 * 0 when not known to be limited. */
int duet_nccl_min_cc(int cuda_major);

#endif
