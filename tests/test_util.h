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
/* Same, with --precision (NULL: auto). */
int tmodel_open_prec(TModel *t, const char *name, const char *text, const FrontendOptions *fo, const char *precision);
void tmodel_close(TModel *t);
/* Tensor id of a value (-1 when it has no storage). */
int tmodel_tensor(const TModel *t, const Value *v);
/* The PARAM value called `name`, or NULL. */
Value *tmodel_param(const TModel *t, const char *name);

/* A whole file as a NUL-terminated string (malloc'ed), or NULL. */
char *slurp(const char *path);

/* |got - want| <= atol + rtol * |want|, else prints and counts a failure. */
int check_close(const char *what, double got, double want, double atol, double rtol);

#endif
