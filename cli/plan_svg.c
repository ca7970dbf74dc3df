/* cli/plan_svg.c: `duet plan --format svg`, the plan as a picture.
 *
 * Left, the pipeline schedule: one lane per stage, each forward and
 * backward of each micro-batch a box placed in time, in the order the
 * runtime runs them (runtime/pipeline.c, stage_grads: GPipe all forwards
 * then all backwards; 1F1B min(S - s - 1, M) warm-up forwards, then one
 * forward and one backward), then the stage's optimizer.  A box starts when
 * its stage is free and its input is there: F(s, m) after F(s - 1, m),
 * B(s, m) after B(s + 1, m).  The durations are the plan's per-stage
 * estimates (PlanStage t_f, t_b, t_o: the table's figures, transfers
 * included), so the empty space in the lanes is the bubble.  Right, the
 * memory of each stage's device as a stacked bar of the bytes the table
 * counts (weights, grads, optimizer state, KV caches, activations x
 * micro-batches in flight), heights proportional to bytes, with the
 * device's capacity when it is known and near.  Every box and bar segment
 * carries its numbers as data-* attributes (stage, micro-batch, start and
 * duration in ms; kind and bytes), so a test can check the drawing against
 * the table.  Plain SVG 1.1 text, no library. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_svg.h"

/* One box of the schedule: kind 0 forward, 1 backward, 2 optimizer. */
typedef struct Box {
  int stage, mb, kind;
  double start, dur; /* seconds */
} Box;

/* The forward and backward boxes of stage s in the runtime's order: op k
 * is (kind, micro-batch) = (ord[2k], ord[2k + 1]). */
static void stage_order(int S, int64_t M, int s, bool one_f_one_b, int *ord) {
  int n = 0;
  if (one_f_one_b) {
    int64_t w = S - s - 1 < M ? S - s - 1 : M; /* warm-up forwards */
    for (int64_t m = 0; m < w; m++) ord[n++] = 0, ord[n++] = (int)m;
    for (int64_t i = 0; i < M; i++) {
      if (w + i < M) ord[n++] = 0, ord[n++] = (int)(w + i);
      ord[n++] = 1, ord[n++] = (int)i;
    }
  } else {
    for (int64_t m = 0; m < M; m++) ord[n++] = 0, ord[n++] = (int)m;
    for (int64_t m = 0; m < M; m++) ord[n++] = 1, ord[n++] = (int)m;
  }
}

/* The schedule's boxes (S * (2M + 1), optimizer last per stage) into box.
 * 0, or -1 when the orders deadlock (not for GPipe or 1F1B). */
static int simulate(int S, int64_t M, bool one_f_one_b, const PlanStage *ps, Box *box) {
  size_t per = (size_t)(2 * M + 1);
  int *ord = malloc((size_t)S * (size_t)(4 * M) * sizeof *ord);
  double *end_f = malloc((size_t)S * (size_t)M * sizeof *end_f), *end_b = malloc((size_t)S * (size_t)M * sizeof *end_b);
  double *free_at = calloc((size_t)S, sizeof *free_at);
  int64_t *next = calloc((size_t)S, sizeof *next);
  int rc = -1;
  if (!ord || !end_f || !end_b || !free_at || !next) goto out;
  for (int s = 0; s < S; s++) stage_order(S, M, s, one_f_one_b, ord + (size_t)s * (size_t)(4 * M));
  for (size_t i = 0; i < (size_t)S * (size_t)M; i++) end_f[i] = end_b[i] = -1;
  int64_t left = (int64_t)S * 2 * M;
  while (left > 0) {
    int64_t progress = 0;
    for (int s = 0; s < S; s++) {
      while (next[s] < 2 * M) {
        const int *op = ord + (size_t)s * (size_t)(4 * M) + 2 * next[s];
        int kind = op[0], m = op[1];
        double ready = free_at[s];
        if (kind == 0 && s > 0) {
          double e = end_f[(size_t)(s - 1) * (size_t)M + (size_t)m];
          if (e < 0) break;
          ready = fmax(ready, e);
        } else if (kind == 1 && s < S - 1) {
          double e = end_b[(size_t)(s + 1) * (size_t)M + (size_t)m];
          if (e < 0) break;
          ready = fmax(ready, e);
        }
        double dur = kind ? ps[s].t_b : ps[s].t_f;
        (kind ? end_b : end_f)[(size_t)s * (size_t)M + (size_t)m] = free_at[s] = ready + dur;
        box[(size_t)s * per + (size_t)next[s]] = (Box){s, m, kind, ready, dur};
        next[s]++;
        progress++;
        left--;
      }
    }
    if (!progress) goto out;
  }
  for (int s = 0; s < S; s++) box[(size_t)s * per + per - 1] = (Box){s, -1, 2, free_at[s], ps[s].t_o};
  rc = 0;
out:
  free(ord);
  free(end_f);
  free(end_b);
  free(free_at);
  free(next);
  return rc;
}

/* s with the XML special characters escaped. */
static void xml_text(FILE *out, const char *s) {
  for (; s && *s; s++) {
    if (*s == '<') fputs("&lt;", out);
    else if (*s == '>') fputs("&gt;", out);
    else if (*s == '&') fputs("&amp;", out);
    else if (*s == '"') fputs("&quot;", out);
    else if ((unsigned char)*s >= 0x20) fputc(*s, out);
  }
}

static double mib(int64_t b) { return (double)b / 1048576.0; }

/* A "nice" tick step near span / 6 (1, 2 or 5 x 10^k). */
static double tick_step(double span) {
  double raw = span / 6, p = pow(10, floor(log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

int plan_svg(const Graph *g, const PassCtx *cx, FILE *out) {
  int S = g->n_stages > 1 ? g->n_stages : 1, R = g->replicas > 1 ? g->replicas : 1;
  int64_t M = partition_micro_batches(g);
  bool one_f_one_b = cx->one_f_one_b;
  size_t per = (size_t)(2 * M + 1);
  PlanStage *ps = calloc((size_t)S, sizeof *ps);
  Box *box = malloc((size_t)S * per * sizeof *box);
  if (!ps || !box) {
    free(ps);
    free(box);
    fprintf(stderr, "duet: error: out of host memory drawing the plan\n");
    return 1;
  }
  for (int s = 0; s < S; s++) partition_plan_stage(g, cx, s, &ps[s]);
  if (simulate(S, M, one_f_one_b, ps, box)) {
    free(ps);
    free(box);
    fprintf(stderr, "duet: error: internal: the pipeline schedule deadlocks\n");
    return 1;
  }
  double end = 0, busy = 0, busy_fb = 0, end_fb = 0;
  int64_t most = 0;
  for (size_t i = 0; i < (size_t)S * per; i++) {
    end = fmax(end, box[i].start + box[i].dur);
    busy += box[i].dur;
    if (box[i].kind != 2) {
      busy_fb += box[i].dur;
      end_fb = fmax(end_fb, box[i].start + box[i].dur);
    }
  }
  for (int s = 0; s < S; s++)
    if (ps[s].need > most) most = ps[s].need;
  if (!(end > 0)) end = 1e-3;
  double idle = end_fb > 0 ? 1 - busy_fb / ((double)S * end_fb) : 0;

  /* layout (px): the schedule at left, the bars at right */
  const double lane_h = 34, lane_gap = 10, sx0 = 110, sw = 640, top = 80;
  const double bx0 = sx0 + sw + 70, bar_w = 44, bar_gap = 26, bar_h = 260;
  double lanes_h = S * (lane_h + lane_gap) - lane_gap;
  double width = bx0 + S * (bar_w + bar_gap) + 150, height = top + fmax(lanes_h + 90, bar_h + 45);
  double ts = sw / end; /* px per second */
  /* the bars' scale: the fullest device, or a known capacity when it is near */
  int64_t scale_to = most > 0 ? most : 1;
  for (int s = 0; s < S; s++) {
    int64_t cap = ps[s].device ? ps[s].device->capacity : 0;
    if (cap > scale_to && cap <= 2 * most) scale_to = cap;
  }
  double bs = bar_h / (double)scale_to; /* px per byte */

  fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\" data-stages=\"%d\" "
               "data-micro-batches=\"%" PRId64 "\" data-schedule=\"%s\" data-replicas=\"%d\">\n",
          width, height, width, height, S, M, one_f_one_b ? "1f1b" : "gpipe", R);
  fprintf(out, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", width, height);
  fprintf(out, "<text x=\"20\" y=\"26\" font-size=\"16\" font-weight=\"bold\">");
  xml_text(out, g->model_name ? g->model_name : "?");
  fprintf(out, ": %d stage%s, %" PRId64 " micro-batch%s of %" PRId64 ", schedule %s", S, S == 1 ? "" : "s", M,
          M == 1 ? "" : "es", g->train.batch, one_f_one_b ? "1F1B" : "GPipe");
  if (R > 1) fprintf(out, "; each of the %d data-parallel replicas (all-reduce not drawn)", R);
  fprintf(out, "</text>\n");
  fprintf(out, "<text x=\"20\" y=\"46\" fill=\"#444\">a step of %.3f ms as simulated from the stages' estimated times: "
               "forward and backward busy %.0f%%, idle (the bubble) %.0f%%; (S-1)/(M+S-1) = %.3f</text>\n",
          1e3 * end, 100 * (1 - idle), 100 * idle, (double)(S - 1) / (double)(M + S - 1));

  /* the schedule */
  fprintf(out, "<g id=\"schedule\">\n");
  for (int s = 0; s < S; s++) {
    double y = top + s * (lane_h + lane_gap);
    const char *dn = ps[s].device ? ps[s].device->name : "cpu";
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">stage %d</text>\n", sx0 - 8, y + lane_h / 2 - 2, s);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"10\" fill=\"#666\">", sx0 - 8,
            y + lane_h / 2 + 11);
    xml_text(out, dn);
    fprintf(out, "</text>\n<rect class=\"lane\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f2f2f2\"/>\n",
            sx0, y, sw, lane_h);
  }
  static const char *const cls[] = {"fwd", "bwd", "opt"}, *const fill[] = {"#4e79a7", "#f28e2b", "#9c9c9c"};
  for (size_t i = 0; i < (size_t)S * per; i++) {
    const Box *b = &box[i];
    double x = sx0 + b->start * ts, w = b->dur * ts, y = top + b->stage * (lane_h + lane_gap);
    char what[64];
    if (b->kind == 2) snprintf(what, sizeof what, "optimizer");
    else snprintf(what, sizeof what, "%s of micro-batch %d", b->kind ? "backward" : "forward", b->mb);
    fprintf(out, "<rect class=\"%s\" data-stage=\"%d\" data-mb=\"%d\" data-start-ms=\"%.6f\" data-ms=\"%.6f\" "
                 "x=\"%.3f\" y=\"%.1f\" width=\"%.3f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                 "stroke-width=\"0.5\"><title>stage %d, %s: %.3f ms at %.3f ms</title></rect>\n",
            cls[b->kind], b->stage, b->mb, 1e3 * b->start, 1e3 * b->dur, x, y, w, lane_h, fill[b->kind], b->stage,
            what, 1e3 * b->dur, 1e3 * b->start);
    if (b->kind != 2 && w >= 16)
      fprintf(out, "<text x=\"%.3f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"white\" font-size=\"10\">%c%d</text>\n",
              x + w / 2, y + lane_h / 2 + 4, b->kind ? 'B' : 'F', b->mb);
  }
  double ay = top + lanes_h + 8, step = tick_step(1e3 * end);
  fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", sx0, ay, sx0 + sw, ay);
  for (double t = 0; t <= 1e3 * end * (1 + 1e-9); t += step) {
    double x = sx0 + t / 1e3 * ts;
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>"
                 "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\">%g</text>\n",
            x, ay, x, ay + 4, x, ay + 16, t);
  }
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time in one training step (ms, estimated)</text>\n",
          sx0 + sw / 2, ay + 34);
  double ly = ay + 56;
  static const char *const what[] = {"forward of micro-batch m (Fm)", "backward (Bm)", "optimizer", "idle (bubble)"};
  static const char *const key_fill[] = {"#4e79a7", "#f28e2b", "#9c9c9c", "#f2f2f2"};
  static const double key_x[] = {0, 215, 340, 450};
  for (int k = 0; k < 4; k++)
    fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\" stroke=\"#ccc\"/>"
                 "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", sx0 + key_x[k], ly, key_fill[k],
            sx0 + key_x[k] + 17, ly + 10, what[k]);
  fprintf(out, "</g>\n");

  /* the memory bars */
  static const char *const kinds[] = {"weights", "grads", "optimizer state", "KV caches", "activations"};
  static const char *const kind_id[] = {"weights", "grads", "state", "cache", "activations"};
  static const char *const kind_fill[] = {"#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#e15759"};
  double base = top + bar_h;
  fprintf(out, "<g id=\"memory\">\n<text x=\"%.1f\" y=\"%.1f\">memory per device (MiB)</text>\n", bx0, top - 22);
  for (int s = 0; s < S; s++) {
    double x = bx0 + s * (bar_w + bar_gap), y = base;
    int64_t bytes[5] = {ps[s].weights, ps[s].grads, ps[s].state, ps[s].cache, ps[s].act * ps[s].slots};
    for (int k = 0; k < 5; k++) {
      if (bytes[k] <= 0) continue;
      double h = (double)bytes[k] * bs;
      y -= h;
      fprintf(out, "<rect class=\"mem\" data-stage=\"%d\" data-kind=\"%s\" data-bytes=\"%" PRId64 "\" x=\"%.1f\" "
                   "y=\"%.4f\" width=\"%.1f\" height=\"%.4f\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\">"
                   "<title>stage %d: %s %.2f MiB%s</title></rect>\n",
              s, kind_id[k], bytes[k], x, y, bar_w, h, kind_fill[k], s, kinds[k], mib(bytes[k]),
              k == 4 ? " (micro-batches in flight x one's activations)" : "");
    }
    fprintf(out, "<text class=\"need\" data-stage=\"%d\" data-bytes=\"%" PRId64 "\" x=\"%.1f\" y=\"%.1f\" "
                 "text-anchor=\"middle\" font-size=\"10\">%.2f</text>\n",
            s, ps[s].need, x + bar_w / 2, y - 4, mib(ps[s].need));
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">stage %d</text>\n", x + bar_w / 2, base + 16, s);
    int64_t cap = ps[s].device ? ps[s].device->capacity : 0;
    if (cap > 0 && cap <= scale_to) {
      double cy = base - (double)cap * bs;
      fprintf(out, "<line class=\"capacity\" data-stage=\"%d\" data-bytes=\"%" PRId64 "\" x1=\"%.1f\" y1=\"%.4f\" "
                   "x2=\"%.1f\" y2=\"%.4f\" stroke=\"#c00\" stroke-dasharray=\"4 2\"/>\n",
              s, cap, x - 4, cy, x + bar_w + 4, cy);
    } else if (cap > 0) {
      fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"9\" fill=\"#666\">of %.1f %s</text>\n",
              x + bar_w / 2, base + 29, cap >= ((int64_t)1 << 30) ? (double)cap / 1073741824.0 : mib(cap),
              cap >= ((int64_t)1 << 30) ? "GiB" : "MiB");
    }
  }
  for (int k = 0; k < 5; k++) {
    double y = top + 12 + k * 20, x = bx0 + S * (bar_w + bar_gap);
    fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">%s"
                 "</text>\n", x, y, kind_fill[k], x + 17, y + 10, kinds[k]);
  }
  fprintf(out, "</g>\n</svg>\n");
  free(ps);
  free(box);
  if (fflush(out) || ferror(out)) {
    fprintf(stderr, "duet: error: writing the SVG failed\n");
    return 1;
  }
  return partition_check_memory(g, cx);
}

int plan_format_check(const char *format, int argc, char **argv) {
  if (strcmp(format, "text") && strcmp(format, "svg") && strcmp(format, "json")) {
    fprintf(stderr, "duet: error: --format expects text, json or svg, got '%s'\n", format);
    return 1;
  }
  for (int i = 0; !strcmp(format, "svg") && i < argc; i++)
    if (!strcmp(argv[i], "--nodes")) {
      fprintf(stderr, "duet: error: --format svg draws one layout; --nodes compares several (use --format text)\n");
      return 1;
    }
  return 0;
}
