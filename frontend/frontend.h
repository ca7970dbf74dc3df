/* frontend/frontend.h: .model text -> Graph. */
#ifndef DUET_FRONTEND_H
#define DUET_FRONTEND_H

#include "../ir/ir.h"

/* Overrides applied while elaborating (command-line flags win over the
 * file's `train` section). Zero fields mean "no override". */
typedef struct FrontendOptions {
  int64_t batch;      /* binds the name `batch` */
  int64_t micro_batches; /* > 1: the batch is split into this many micro-batches;
                          * `batch` then binds batch / micro_batches */
  int64_t replicas;      /* > 1: data parallelism: this many replicas, each with
                          * micro_batches (at least 1) of the global batch;
                          * `batch` binds batch / (replicas x micro_batches) */
  bool mpi_ranks;      /* the replicas are the ranks of an MPI run: a batch they do
                       * not divide is said so, as a line that starts "duet: " */
  DType float_dtype;  /* dtype of params and float inputs; DT_VOID = f32 */
  bool decode;        /* generation: axis 1 of every input (time) becomes 1,
                       * attention keeps key/value caches, no backward */
} FrontendOptions;

/* Reads `path` into a Source allocated in `a`: strips a UTF-8 byte-order
 * mark; rejects empty files and files containing NUL bytes (binary) with one
 * diagnostic.  Returns NULL after reporting through `d`. */
Source *frontend_read_file(Arena *a, Diag *d, const char *path);

/* Parses and elaborates `src` into a forward graph: consts folded, blocks
 * inlined with parameters named `<block><n>.<param>` (n counts calls of that
 * block from 1), the train section read into g->train, g->loss set to the
 * top-level name `loss`.  Returns NULL after reporting errors through `d`
 * (d->jmp is used internally and restored). */
Graph *frontend_compile(Arena *a, Diag *d, const Source *src, const FrontendOptions *opt);

#endif
