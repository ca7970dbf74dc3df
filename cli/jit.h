/* cli/jit.h: compiling generated C with the system compiler, the per-user
 * kernel cache, and loading the result. */
#ifndef DUET_JIT_H
#define DUET_JIT_H

#include <stdbool.h>
#include <stddef.h>

#include "../runtime/duet_rt.h"

typedef struct JitModule {
  void *handle;             /* dlopen handle */
  const DuetKernelFn *fns;  /* duet_kernel_table */
  int n;                    /* duet_kernel_count */
  int n_functions;          /* duet_function_count: distinct kernel functions (kernels share them) */
  bool cache_hit;
  double compile_seconds;   /* 0 on a cache hit */
  int fd;                   /* the loaded file, open while the module is: its /proc/self/fd/N name, which
                             * the dynamic loader matches by string, stays unique among loaded modules
                             * (-1: none) */
} JitModule;

/* Flags every kernel is compiled with, by `duet run` and `duet compile`
 * alike, so both paths run the same machine code. */
#if defined(__x86_64__)
/* GCC 12 keeps 256-bit vectors on AVX-512 machines by default; 512-bit ones
 * measured 7.8% faster on gpt_kjv (bench/run_gpt.sh) */
#define DUET_KERNEL_CFLAGS "-std=c11", "-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fno-math-errno"
#else
#define DUET_KERNEL_CFLAGS "-std=c11", "-O3", "-march=native", "-fopenmp", "-fno-math-errno"
#endif

/* Compiler to use: $DUET_CC, else "cc". */
const char *jit_cc(void);

/* Runs argv (no shell), capturing stdout+stderr into log (NUL-terminated,
 * truncated to loglen).  Returns the exit status, or -1 when it could not
 * run. */
int jit_run(char *const argv[], char *log, size_t loglen);
/* jit_run showing, while the compiler runs, that it is alive: progress
 * (runtime/progress.h) "WHAT | E elapsed" on stdout, a line every few
 * seconds on a pipe or a bar redrawn in place on a terminal, erased at the
 * end; what NULL: nothing (jit_run). */
int jit_run_shown(char *const argv[], char *log, size_t loglen, const char *what);

/* Compiles `src` into a shared object (or takes it from the cache:
 * $DUET_CACHE_DIR, else $XDG_CACHE_HOME/duet, else ~/.cache/duet; mode
 * 0700; entries keyed by an FNV-1a hash of compiler, version, flags and
 * source, and checked against the full key text before loading), then
 * dlopens it.  Returns 0, or -1 with a message in err. */
int jit_load(const char *src, JitModule *m, char *err, size_t errlen);
/* jit_load, with the compiler's progress (jit_run_shown) labelled `what`
 * when it compiles (NULL: none). */
int jit_load_shown(const char *src, JitModule *m, const char *what, char *err, size_t errlen);
void jit_unload(JitModule *m);

/* Directory holding this executable (from /proc/self/exe), for locating the
 * runtime library and header next to it. */
int jit_self_dir(char *out, size_t n);

#endif
