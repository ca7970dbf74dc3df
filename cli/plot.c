/* cli/plot.c: `duet plot`, training curves from metrics files.
 *
 * Reads the JSON lines `duet run --metrics` writes (runtime/train.c:
 * {"step","loss","lr"} per logged step, with --metrics-timing also
 * "samples_per_s" or "tokens_per_s"; {"step","epoch","test_accuracy",
 * "test_loss"} or {"step","val_loss"} per evaluation; other lines, such as
 * pruning's, are read and skipped) and draws one panel per quantity that
 * any of the files carries (training loss, validation loss, test accuracy,
 * learning rate, throughput) against the step, one line per file.  The
 * drawing is gnuplot's (Debian's gnuplot-nox; terminals pngcairo and svg),
 * driven through a pipe: duet writes one gnuplot script with the data
 * inline (datablocks, every value printed with 17 significant digits, so
 * the script holds exactly the metrics' doubles) and, with --script, also
 * to a file. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "plot.h"

/* The panels, in drawing order: the metrics keys each plots. */
enum { P_LOSS, P_VAL, P_VACC, P_ACC, P_LR, P_RATE, N_PANELS };
static const char *const panel_title[N_PANELS] = {"training loss", "validation loss", "validation accuracy",
                                                   "test accuracy",
                                                   "learning rate", "throughput"};
static const char *const panel_key[N_PANELS] = {"loss", "val_loss", "val_accuracy", "test_accuracy", "lr",
                                                 "samples_per_s"};
static const char *const panel_name[N_PANELS] = {"loss", "val_loss", "val_accuracy", "test_accuracy", "lr",
                                                  "throughput"};

typedef struct Series {
  int64_t *step;
  double *val;
  size_t n, cap;
} Series;

typedef struct Run {
  const char *path, *label;
  Series s[N_PANELS];
  bool tokens; /* the throughput is tokens_per_s (else samples_per_s) */
} Run;

/* A growable text buffer; `bad` after an allocation failure. */
typedef struct Buf {
  char *p;
  size_t n, cap;
  bool bad;
} Buf;

static void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(Buf *b, const char *fmt, ...) {
  if (b->bad) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (len < 0) {
      b->bad = true;
      return;
    }
    if (b->p && b->n + (size_t)len < b->cap) {
      b->n += (size_t)len;
      return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap <= b->n + (size_t)len) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->bad = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
}

/* s as a gnuplot single-quoted string ('' for a quote; control characters,
 * which would end the line, as '?'). */
static void buf_quoted(Buf *b, const char *s) {
  buf_printf(b, "'");
  for (; *s; s++) {
    if (*s == '\'') buf_printf(b, "''");
    else buf_printf(b, "%c", (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s);
  }
  buf_printf(b, "'");
}

static int series_add(Series *s, int64_t step, double v) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    int64_t *st = realloc(s->step, cap * sizeof *st);
    if (!st) return -1;
    s->step = st;
    double *vv = realloc(s->val, cap * sizeof *vv);
    if (!vv) return -1;
    s->val = vv;
    s->cap = cap;
  }
  s->step[s->n] = step;
  s->val[s->n++] = v;
  return 0;
}

static void run_free(Run *r) {
  for (int k = 0; k < N_PANELS; k++) {
    free(r->s[k].step);
    free(r->s[k].val);
  }
}

/* One metrics line (line number ln of r->path) into r.  0, or 1 after the
 * message "duet: error: FILE:LINE: ...". */
static int read_line(Run *r, size_t ln, const char *text) {
  cJSON *o = cJSON_Parse(text);
  int rc = 1;
  if (!o || !cJSON_IsObject(o)) {
    fprintf(stderr, "duet: error: %s:%zu: not a JSON object (a metrics file of duet run --metrics has one per line)\n",
            r->path, ln);
    goto out;
  }
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "step");
  double sv = cJSON_IsNumber(st) ? st->valuedouble : NAN;
  if (!(sv >= 0 && sv <= 9e15 && sv == floor(sv))) {
    fprintf(stderr, "duet: error: %s:%zu: no \"step\" (a whole number >= 0) on this line\n", r->path, ln);
    goto out;
  }
  static const char *const keys[] = {"loss",         "val_loss",      "val_accuracy", "test_accuracy",
                                     "lr",           "samples_per_s", "tokens_per_s"};
  for (int k = 0; k < (int)(sizeof keys / sizeof *keys); k++) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, keys[k]);
    if (!it || cJSON_IsNull(it)) continue; /* null: a non-finite value, not drawn */
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) {
      fprintf(stderr, "duet: error: %s:%zu: \"%s\" is not a finite number\n", r->path, ln, keys[k]);
      goto out;
    }
    int panel = k < P_RATE ? k : P_RATE;
    if (k == P_RATE + 1) r->tokens = true;
    if (series_add(&r->s[panel], (int64_t)sv, it->valuedouble)) {
      fprintf(stderr, "duet: error: out of host memory reading %s\n", r->path);
      goto out;
    }
  }
  rc = 0;
out:
  cJSON_Delete(o);
  return rc;
}

/* Every line of r->path into r.  0, or 1 after the message. */
static int read_metrics(Run *r) {
  FILE *f = fopen(r->path, "r");
  if (!f) {
    fprintf(stderr, "duet: error: cannot read metrics file %s: %s\n", r->path, strerror(errno));
    return 1;
  }
  char *line = NULL;
  size_t cap = 0, ln = 0;
  ssize_t len;
  int rc = 0;
  errno = 0;
  while (!rc && (len = getline(&line, &cap, f)) >= 0) {
    ln++;
    if ((size_t)len != strlen(line)) {
      fprintf(stderr, "duet: error: %s:%zu: a NUL byte (not a metrics file of duet run --metrics)\n", r->path, ln);
      rc = 1;
      break;
    }
    if (strspn(line, " \t\r\n") == (size_t)len) continue; /* blank */
    rc = read_line(r, ln, line);
  }
  if (!rc && ferror(f)) {
    fprintf(stderr, "duet: error: reading metrics file %s failed: %s\n", r->path, strerror(errno));
    rc = 1;
  }
  free(line);
  fclose(f);
  if (rc) return 1;
  bool any = false;
  for (int k = 0; k < N_PANELS; k++) any |= r->s[k].n > 0;
  if (!any) {
    fprintf(stderr, "duet: error: %s has nothing to plot: no line carries \"loss\", \"val_loss\", \"val_accuracy\", "
                    "\"test_accuracy\", \"lr\", \"samples_per_s\" or \"tokens_per_s\"\n", r->path);
    return 1;
  }
  return 0;
}

/* The gnuplot executable on PATH into buf (0), or 1. */
static int find_gnuplot(char *buf, size_t n) {
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/bin:/bin";
  while (*path) {
    size_t len = strcspn(path, ":");
    int w = snprintf(buf, n, "%.*s/gnuplot", (int)len, len ? path : ".");
    struct stat st;
    if (w > 0 && (size_t)w < n && !stat(buf, &st) && S_ISREG(st.st_mode) && !access(buf, X_OK)) return 0;
    path += len + (path[len] == ':');
  }
  return 1;
}

/* The gnuplot script: terminal, output, the data, one panel per quantity. */
static void write_script(Buf *b, const Run *runs, int n, const char *out, bool svg, int w, int h) {
  buf_printf(b, "# duet plot: %d metrics file%s\n", n, n == 1 ? "" : "s");
  if (svg) buf_printf(b, "set terminal svg size %d,%d noenhanced font 'sans,12' background rgb 'white'\n", w, h);
  else buf_printf(b, "set terminal pngcairo size %d,%d noenhanced font 'sans,10' background rgb 'white'\n", w, h);
  buf_printf(b, "set output ");
  buf_quoted(b, out);
  buf_printf(b, "\n");
  bool has[N_PANELS] = {0}, tokens = false, samples = false;
  int panels = 0;
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < N_PANELS; k++) {
      const Series *s = &runs[i].s[k];
      has[k] |= s->n > 0;
      if (!s->n) continue;
      if (k == P_RATE && runs[i].tokens) tokens = true;
      else if (k == P_RATE) samples = true;
      buf_printf(b, "# %s: %s (%zu points)\n$d%d_%s << EOD\n", runs[i].label,
                 k == P_RATE ? (runs[i].tokens ? "tokens_per_s" : "samples_per_s") : panel_key[k], s->n, i,
                 panel_name[k]);
      for (size_t j = 0; j < s->n; j++) buf_printf(b, "%" PRId64 " %.17g\n", s->step[j], s->val[j]);
      buf_printf(b, "EOD\n");
    }
  }
  for (int k = 0; k < N_PANELS; k++) panels += has[k];
  int cols = panels <= 2 ? panels : panels <= 4 ? 2 : 3, rows = (panels + cols - 1) / cols;
  buf_printf(b, "set multiplot layout %d,%d\nset grid\nset key below\nset xlabel 'step'\n", rows, cols);
  for (int k = 0; k < N_PANELS; k++) {
    if (!has[k]) continue;
    const char *ylabel = k == P_RATE ? (tokens && samples ? "samples/s, tokens/s" : tokens ? "tokens/s" : "samples/s")
                         : k == P_LR ? "learning rate" : k == P_ACC || k == P_VACC ? "accuracy (fraction)" : "loss";
    buf_printf(b, "set title '%s'\nset ylabel '%s'\n", panel_title[k], ylabel);
    buf_printf(b, "set format y %s\n", k == P_LR ? "'%.1e'" : "'%g'");
    buf_printf(b, "plot ");
    bool first = true;
    for (int i = 0; i < n; i++) {
      const Series *s = &runs[i].s[k];
      if (!s->n) continue;
      /* evaluations are few: points on the line */
      buf_printf(b, "%s$d%d_%s using 1:2 with %s lw 2 lc %d title ", first ? "" : ", ", i, panel_name[k],
                 k == P_VAL || k == P_VACC || k == P_ACC || s->n == 1 ? "linespoints pt 7 ps 0.6" : "lines", i + 1);
      buf_quoted(b, runs[i].label);
      first = false;
    }
    buf_printf(b, "\n");
  }
  buf_printf(b, "unset multiplot\nunset output\n");
}

/* path and other name the same existing file. */
static bool same_file(const char *path, const char *other) {
  struct stat a, b;
  return !stat(path, &a) && !stat(other, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static void plot_help(FILE *f) {
  fprintf(f,
          "usage: duet plot METRICS.jsonl [MORE.jsonl ...] -o OUT.png|OUT.svg [--label NAME ...]\n"
          "                 [--size WxH] [--script FILE]\n"
          "Draws training curves from metrics files of `duet run --metrics` (JSON lines), one panel per\n"
          "quantity any file carries, against the step: training loss, validation loss (text models),\n"
          "test accuracy (image models), learning rate, throughput (samples/s or tokens/s: the runs\n"
          "need --metrics-timing); one line per file, for comparing runs.  Needs gnuplot (Debian:\n"
          "apt-get install gnuplot-nox); duet writes the script, gnuplot draws.\n"
          "  -o OUT             the picture: PNG (.png, gnuplot's pngcairo) or SVG (.svg)\n"
          "  --label NAME       the legend's name of the next file without one, in order (default:\n"
          "                     the file's name)\n"
          "  --size WxH         pixels (default 1200x800; each from 200 to 8000)\n"
          "  --script FILE      also write the gnuplot script, the data inline, to FILE\n"
          "A line that is not a JSON object with a whole \"step\", or a known field that is not a number\n"
          "(null is a gap), is an error naming FILE:LINE.\n");
}

int cmd_plot(int argc, char **argv) {
  const char *out = NULL, *script = NULL;
  int n = 0, n_labels = 0, w = 1200, h = 800;
  Run *runs = calloc((size_t)argc + 1, sizeof *runs);
  const char **labels = calloc((size_t)argc + 1, sizeof *labels);
  int rc = 1;
  Buf b = {0};
  if (!runs || !labels) {
    fprintf(stderr, "duet: error: out of host memory\n");
    goto done;
  }
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      plot_help(stdout);
      rc = 0;
      goto done;
    }
    bool takes = !strcmp(a, "-o") || !strcmp(a, "--label") || !strcmp(a, "--script") || !strcmp(a, "--size");
    if (takes && i + 1 >= argc) {
      fprintf(stderr, "duet: error: %s needs a value (see duet plot --help)\n", a);
      goto done;
    }
    if (!strcmp(a, "-o")) out = argv[++i];
    else if (!strcmp(a, "--script")) script = argv[++i];
    else if (!strcmp(a, "--label")) labels[n_labels++] = argv[++i];
    else if (!strcmp(a, "--size")) {
      const char *v = argv[++i];
      char *e1, *e2;
      errno = 0;
      long ww = strtol(v, &e1, 10), hh = *e1 == 'x' ? strtol(e1 + 1, &e2, 10) : 0;
      if (errno || e1 == v || *e1 != 'x' || e2 == e1 + 1 || *e2 || ww < 200 || ww > 8000 || hh < 200 || hh > 8000) {
        fprintf(stderr, "duet: error: --size expects WxH in pixels, each from 200 to 8000 (such as 1200x800), got "
                        "'%s'\n", v);
        goto done;
      }
      w = (int)ww;
      h = (int)hh;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "duet: error: unknown flag '%s' (see duet plot --help)\n", a);
      goto done;
    } else runs[n++].path = a;
  }
  if (!n) {
    fprintf(stderr, "duet: error: usage: duet plot METRICS.jsonl [MORE.jsonl ...] -o OUT.png|OUT.svg\n");
    goto done;
  }
  if (!out) {
    fprintf(stderr, "duet: error: duet plot needs -o OUT.png or -o OUT.svg (the picture to write)\n");
    goto done;
  }
  size_t ol = strlen(out);
  bool svg = ol > 4 && !strcmp(out + ol - 4, ".svg"), png = ol > 4 && !strcmp(out + ol - 4, ".png");
  if (!svg && !png) {
    fprintf(stderr, "duet: error: -o %s: the picture's name must end in .png or .svg\n", out);
    goto done;
  }
  if (n_labels > n) {
    fprintf(stderr, "duet: error: %d --label for %d metrics file%s: at most one per file\n", n_labels, n,
            n == 1 ? "" : "s");
    goto done;
  }
  for (int i = 0; i < n; i++) {
    if (script && same_file(script, runs[i].path)) {
      fprintf(stderr, "duet: error: --script %s is the metrics file %s: give another file\n", script, runs[i].path);
      goto done;
    }
    if (same_file(out, runs[i].path)) {
      fprintf(stderr, "duet: error: -o %s is the metrics file %s: give another file\n", out, runs[i].path);
      goto done;
    }
  }
  for (int i = 0; i < n; i++) {
    if (i < n_labels) runs[i].label = labels[i];
    else {
      const char *slash = strrchr(runs[i].path, '/');
      runs[i].label = slash && slash[1] ? slash + 1 : runs[i].path;
    }
    if (read_metrics(&runs[i])) goto done;
  }
  char gp[4096];
  if (find_gnuplot(gp, sizeof gp)) {
    fprintf(stderr, "duet: error: duet plot needs gnuplot: apt-get install gnuplot-nox\n");
    goto done;
  }
  write_script(&b, runs, n, out, svg, w, h);
  if (b.bad) {
    fprintf(stderr, "duet: error: out of host memory writing the gnuplot script\n");
    goto done;
  }
  if (script) {
    FILE *f = fopen(script, "w");
    if (!f) {
      fprintf(stderr, "duet: error: cannot write --script %s: %s\n", script, strerror(errno));
      goto done;
    }
    bool ok = fwrite(b.p, 1, b.n, f) == b.n;
    if (fclose(f) || !ok) {
      fprintf(stderr, "duet: error: writing --script %s failed: %s\n", script, strerror(errno));
      goto done;
    }
  }
  /* the output is writable (gnuplot's own message for a bad path is two
   * lines, and its picture then goes to its stdout) */
  FILE *o = fopen(out, "w");
  if (!o) {
    fprintf(stderr, "duet: error: cannot write %s: %s\n", out, strerror(errno));
    goto done;
  }
  if (fclose(o)) {
    fprintf(stderr, "duet: error: cannot write %s: %s\n", out, strerror(errno));
    goto done;
  }
  /* the command: 'PATH' >/dev/null, the path quoted for sh */
  Buf cmd = {0};
  buf_printf(&cmd, "exec '");
  for (const char *p = gp; *p; p++) buf_printf(&cmd, *p == '\'' ? "'\\''" : "%c", *p);
  buf_printf(&cmd, "' > /dev/null");
  if (cmd.bad) {
    free(cmd.p);
    fprintf(stderr, "duet: error: out of host memory\n");
    goto done;
  }
  fflush(stdout);
  fflush(stderr);
  struct sigaction ign = {.sa_handler = SIG_IGN}, old;
  sigemptyset(&ign.sa_mask);
  if (sigaction(SIGPIPE, &ign, &old)) { /* a gnuplot that exits early: EPIPE, not a killed duet */
    fprintf(stderr, "duet: error: sigaction(SIGPIPE): %s\n", strerror(errno));
    free(cmd.p);
    goto done;
  }
  FILE *pipe = popen(cmd.p, "w");
  free(cmd.p);
  if (!pipe) {
    fprintf(stderr, "duet: error: cannot start gnuplot (%s): %s\n", gp, strerror(errno));
    sigaction(SIGPIPE, &old, NULL);
    goto done;
  }
  bool wrote = fwrite(b.p, 1, b.n, pipe) == b.n && !fflush(pipe);
  int werr = errno;
  int st = pclose(pipe);
  int cerr = errno;
  sigaction(SIGPIPE, &old, NULL);
  if (st == -1) {
    fprintf(stderr, "duet: error: waiting for gnuplot (%s) failed: %s\n", gp, strerror(cerr));
    goto done;
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st)) {
    if (WIFEXITED(st))
      fprintf(stderr, "duet: error: gnuplot (%s) exited with status %d drawing %s (its message is above)\n", gp,
              WEXITSTATUS(st), out);
    else fprintf(stderr, "duet: error: gnuplot (%s) was killed by signal %d drawing %s\n", gp, WTERMSIG(st), out);
    goto done;
  }
  if (!wrote) {
    fprintf(stderr, "duet: error: writing the script to gnuplot failed: %s\n", strerror(werr));
    goto done;
  }
  struct stat sb;
  if (stat(out, &sb) || sb.st_size == 0) {
    fprintf(stderr, "duet: error: gnuplot exited without writing %s\n", out);
    goto done;
  }
  rc = 0;
done:
  if (runs)
    for (int i = 0; i < n; i++) run_free(&runs[i]);
  free(runs);
  free(labels);
  free(b.p);
  return rc;
}
