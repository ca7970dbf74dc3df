/* tests/fuzz/fuzz_frontend.c: libFuzzer target over the frontend (lexer,
 * parser, elaboration), the IR verifier, shape inference and the passes up
 * to memplan.  Never codegen, never the system C compiler.
 *
 * The input bytes are one .model source, treated like frontend_read_file
 * treats a file: a UTF-8 byte-order mark is stripped, inputs with NUL bytes
 * or only blanks are rejected (those are user errors of the file reader, and
 * the lexer's buffer must be NUL-terminated).  Inputs containing `import`
 * are skipped: an import reads a file named by the input (/dev/stdin,
 * /dev/zero, ...), and the file system is not what is fuzzed here.  Each
 * accepted input is
 *   1. elaborated with default options, then run through every pass with
 *      ir_verify after each one (as `duet check` / `duet ir` do), then printed
 *      with ir_print; then, if step 1 succeeded,
 *   2. elaborated again with --batch 3 in float64 (as the tests do), and
 *   3. elaborated for generation (decode = true), as `duet sample` does,
 *   4. with 2 micro-batches on 3 devices (the partition pass), and
 *   5. as 2 data-parallel replicas of a 2-stage pipeline with 2
 *      micro-batches each and buckets of about 1 KiB (the data_parallel
 *      pass and its checks in the verifier),
 *      each run through the passes again.
 * User errors (diagnostics) are expected and go to /dev/null.  Findings are:
 * a sanitizer report, duet_fatal (an internal assertion -> abort), an
 * ir_verify failure after a pass (we abort), a leak, a timeout, running out
 * of memory.
 *
 * Guard (speed only): passes stop once the graph has more than
 * FUZZ_MAX_VALUES values (memplan is quadratic in the number of live values).
 *
 * Build: CC=clang cmake -S . -B build-fuzz -DDUET_FUZZ=ON && cmake --build
 * build-fuzz --target fuzz_frontend; run: make fuzz (tests/fuzz/run.sh). */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "passes/passes.h"

#define FUZZ_MAX_VALUES 5000
#define FUZZ_MAX_LEN (1 << 20)

static FILE *sink; /* diagnostics and printed IR go nowhere */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  sink = fopen("/dev/null", "w");
  if (!sink) {
    perror("fuzz_frontend: /dev/null");
    abort();
  }
  return 0;
}

/* Runs the pipeline like passes_run (verify = true), but aborts on a verifier
 * failure (an internal error, not a user error) and stops early on big
 * graphs. Returns 0 when every pass ran, 1 after a user error or the guard. */
static int run_passes(Graph *g, Diag *d, int n_devices) {
  jmp_buf jb, *saved = d->jmp;
  static const PartDevice cpus[3] = {{.name = "cpu:0", .cpu = true, .cores = 1},
                                     {.name = "cpu:1", .cpu = true, .cores = 1},
                                     {.name = "cpu:2", .cpu = true, .cores = 1}};
  /* small all-reduce buckets (about 1 KiB) when there are replicas: many of them */
  PassCtx pc = {.diag = d, .verify = true, .devices = n_devices ? cpus : NULL, .n_devices = n_devices,
                .bucket_mb = 0.001};
  d->jmp = &jb;
  if (setjmp(jb)) {
    d->jmp = saved;
    return 1;
  }
  for (int i = 0; i < duet_n_passes; i++) {
    if (g->n_values > FUZZ_MAX_VALUES) {
      d->jmp = saved;
      return 1;
    }
    int errors = d->n_errors;
    duet_passes[i].run(g, &pc);
    if (d->n_errors != errors) { /* a pass reported without unwinding */
      d->jmp = saved;
      return 1;
    }
    if (ir_verify(g, duet_passes[i].name, stderr)) {
      fprintf(stderr, "fuzz_frontend: the IR verifier failed after pass %s\n", duet_passes[i].name);
      abort();
    }
  }
  d->jmp = saved;
  return 0;
}

/* One compilation: frontend, passes, printer.  Returns 0 when it all went
 * through without a user error. */
static int compile_once(const Source *src, const FrontendOptions *fo, int n_devices) {
  Arena *a = arena_new(1 << 16);
  Diag d = {.out = sink};
  int rc = 1;
  Graph *g = frontend_compile(a, &d, src, fo);
  if (g && g->n_values <= FUZZ_MAX_VALUES && !run_passes(g, &d, n_devices)) {
    ir_print(g, sink);
    rc = 0;
  }
  arena_free(a);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > FUZZ_MAX_LEN || memchr(data, 0, size) || memmem(data, size, "import", 6)) return 0;
  size_t off = size >= 3 && data[0] == 0xEF && data[1] == 0xBB && data[2] == 0xBF ? 3 : 0;
  size_t len = size - off;
  size_t blank = 0;
  while (blank < len && strchr(" \t\r\n", data[off + blank])) blank++;
  if (blank == len) return 0;
  char *text = malloc(len + 1);
  if (!text) return 0;
  memcpy(text, data + off, len);
  text[len] = 0;
  Source src = {.name = "fuzz.model", .text = text, .len = len};
  FrontendOptions plain = {0}, f64 = {.batch = 3, .float_dtype = DT_F64}, decode = {.decode = true};
  if (!compile_once(&src, &plain, 0)) {
    compile_once(&src, &f64, 0);
    compile_once(&src, &decode, 0);
    /* the partition pass on three devices, micro-batches where they divide */
    FrontendOptions mb = {.micro_batches = 2};
    if (compile_once(&src, &mb, 3)) compile_once(&src, &plain, 3);
    /* data parallelism: 2 replicas of a 2-stage pipeline, 2 micro-batches each */
    FrontendOptions dp = {.micro_batches = 2, .replicas = 2};
    compile_once(&src, &dp, 2);
  }
  free(text);
  return 0;
}
