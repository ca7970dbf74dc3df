/* cli/plan_svg.h: `duet plan --format svg` (cli/plan_svg.c). */
#ifndef DUET_CLI_PLAN_SVG_H
#define DUET_CLI_PLAN_SVG_H

#include <stdio.h>

#include "../passes/passes.h"

/* Writes the plan of g (through every pass; cx as for partition_report) to
 * out as an SVG document: the pipeline schedule (GPipe or 1F1B as
 * cx->one_f_one_b says, M = partition_micro_batches(g) micro-batches)
 * simulated from the stages' estimated times (partition_plan_stage), each
 * forward, backward and optimizer a <rect class="fwd|bwd|opt"> with
 * data-stage, data-mb, data-start-ms, data-ms; beside it each stage's
 * memory as stacked <rect class="mem"> with data-kind (weights, grads,
 * state, cache, activations) and data-bytes, heights proportional to the
 * bytes.  Returns 0, or 1 when a device's memory is exceeded (after the
 * picture; the error through cx->diag, partition_check_memory) or after a
 * one-line error on stderr (out of memory, a write error). */
int plan_svg(const Graph *g, const PassCtx *cx, FILE *out);

/* duet plan's --format: text, json (cli/fit.c) or svg (svg without
 * --nodes).  0, or 1 after "duet: error: --format expects text, json or
 * svg, got 'X'" or the --nodes one. */
int plan_format_check(const char *format, int argc, char **argv);

#endif
