/* runtime/progress.c: progress lines and the live bar (progress.h). */
#define _POSIX_C_SOURCE 200809L
#include "progress.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

double duet_progress_now(void) {
  struct timespec t;
  if (clock_gettime(CLOCK_MONOTONIC, &t)) return 0; /* cannot fail for CLOCK_MONOTONIC on Linux */
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Whether an MPI or Slurm launcher started this process (the variables of
 * duet_launch_ranks, runtime/dist.c): its stdout may be a pseudo-terminal
 * of the launcher's, which merges the ranks' output into a pipe or a file,
 * so progress there is plain lines, never the bar. */
static bool under_launcher(void) {
  const char *v;
  if (((v = getenv("OMPI_COMM_WORLD_SIZE")) && *v) || ((v = getenv("PMI_SIZE")) && *v)) return true;
  return (v = getenv("SLURM_STEP_NUM_TASKS")) && *v && strcmp(v, "1");
}

void duet_progress_start(DuetProgress *pg, FILE *out, bool quiet, int64_t first, int64_t total) {
  memset(pg, 0, sizeof *pg);
  pg->out = out;
  pg->first = first;
  pg->total = total;
  pg->interval = DUET_PROGRESS_INTERVAL;
  pg->t_start = pg->t_shown = duet_progress_now();
  pg->width = 80;
  if (quiet || !out) return;
  const char *env = getenv("DUET_PROGRESS_SECONDS");
  if (env && *env) {
    char *end;
    double v = strtod(env, &end);
    if (*end || !(v > 0 && v <= 86400))
      fprintf(stderr, "duet: warning: DUET_PROGRESS_SECONDS expects a number of seconds > 0 (at most 86400), got "
                      "'%s'; using %g\n", env, DUET_PROGRESS_INTERVAL);
    else pg->interval = v;
  }
  int fd = fileno(out);
  if (fd >= 0 && isatty(fd) && !under_launcher()) {
    pg->mode = DUET_PROGRESS_BAR;
    struct winsize ws;
    if (!ioctl(fd, TIOCGWINSZ, &ws) && ws.ws_col >= 20) pg->width = ws.ws_col;
  } else {
    pg->mode = DUET_PROGRESS_LINES;
  }
}

char *duet_format_duration(double seconds, char *buf, size_t n) {
  if (!isfinite(seconds) || seconds < 0 || seconds > 1e12) {
    snprintf(buf, n, "?");
    return buf;
  }
  long long s = (long long)floor(seconds);
  if (s < 60) snprintf(buf, n, "%llds", s);
  else if (s < 3600) snprintf(buf, n, "%lldm%02llds", s / 60, s % 60);
  else snprintf(buf, n, "%lldh%02lldm", s / 3600, s % 3600 / 60);
  return buf;
}

double duet_progress_eta(double elapsed, int64_t first, int64_t done, int64_t total) {
  if (done <= first || elapsed < 0) return NAN;
  if (done >= total) return 0;
  return elapsed / (double)(done - first) * (double)(total - done);
}

char *duet_progress_bar_text(char *buf, size_t n, const char *head, int64_t done, int64_t total, const char *tail,
                             int cells, int width) {
  if (!n) return buf;
  if (cells < 1) cells = 1;
  if (cells > 100) cells = 100;
  double f = total > 0 ? (double)done / (double)total : 0;
  if (f < 0) f = 0;
  if (f > 1) f = 1;
  int full = (int)(f * cells), pct = (int)(f * 100);
  char bar[101];
  for (int i = 0; i < cells; i++) bar[i] = i < full ? '#' : '.';
  bar[cells] = 0;
  snprintf(buf, n, "%s [%s] %3d%%%s%s", head, bar, pct, tail && *tail ? " " : "", tail ? tail : "");
  if (width > 1 && strlen(buf) > (size_t)(width - 1)) buf[width - 1] = 0;
  return buf;
}

void duet_progress_update(DuetProgress *pg, int64_t done, const char *head, const char *what, bool force) {
  if (pg->mode == DUET_PROGRESS_OFF) return;
  double t = duet_progress_now();
  double gap = pg->mode == DUET_PROGRESS_BAR && pg->interval > DUET_PROGRESS_REDRAW ? DUET_PROGRESS_REDRAW : pg->interval;
  if (!force && t - pg->t_shown < gap) return;
  pg->t_shown = t;
  char el[32], eta[32], tail[512], line[1024];
  duet_format_duration(t - pg->t_start, el, sizeof el);
  duet_format_duration(duet_progress_eta(t - pg->t_start, pg->first, done, pg->total), eta, sizeof eta);
  if (pg->mode == DUET_PROGRESS_LINES) {
    fprintf(pg->out, "duet: progress: %s | %s elapsed, ETA %s\n", what, el, eta);
  } else { /* erase the line, draw, and leave the cursor at column 0: what is printed next overwrites the bar */
    snprintf(tail, sizeof tail, "| %s elapsed, ETA %s | %s", el, eta, what);
    fprintf(pg->out, "\r\033[K%s\r", duet_progress_bar_text(line, sizeof line, head, done, pg->total, tail, 20,
                                                            pg->width));
    pg->drawn = true;
  }
  fflush(pg->out);
}

void duet_progress_alive(DuetProgress *pg, const char *what) {
  if (pg->mode == DUET_PROGRESS_OFF) return;
  double t = duet_progress_now();
  double gap = pg->mode == DUET_PROGRESS_BAR && pg->interval > DUET_PROGRESS_REDRAW ? DUET_PROGRESS_REDRAW : pg->interval;
  if (t - pg->t_shown < gap) return;
  pg->t_shown = t;
  char el[32], line[1024];
  duet_format_duration(t - pg->t_start, el, sizeof el);
  if (pg->mode == DUET_PROGRESS_LINES) {
    fprintf(pg->out, "duet: progress: %s | %s elapsed\n", what, el);
  } else {
    snprintf(line, sizeof line, "%s | %s elapsed", what, el);
    if (pg->width > 1 && strlen(line) > (size_t)(pg->width - 1)) line[pg->width - 1] = 0;
    fprintf(pg->out, "\r\033[K%s\r", line);
    pg->drawn = true;
  }
  fflush(pg->out);
}

void duet_progress_clear(DuetProgress *pg) {
  if (!pg->drawn) return;
  fputs("\r\033[K", pg->out);
  fflush(pg->out);
  pg->drawn = false;
}

/* ------------------------------------------------------------ heartbeat */

struct DuetBeat {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  DuetProgress pg;
  char what[256];
};

static void *beat_main(void *arg) {
  DuetBeat *b = arg;
  pthread_mutex_lock(&b->mu);
  while (!b->done) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_nsec += 100 * 1000000L; /* wake up every 0.1 s */
    if (t.tv_nsec >= 1000000000L) {
      t.tv_sec++;
      t.tv_nsec -= 1000000000L;
    }
    int rc = pthread_cond_timedwait(&b->cv, &b->mu, &t);
    if (rc && rc != ETIMEDOUT) break;
    if (!b->done) duet_progress_alive(&b->pg, b->what);
  }
  duet_progress_clear(&b->pg);
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

DuetBeat *duet_beat_start(FILE *out, bool quiet, const char *what) {
  if (quiet || !out) return NULL;
  DuetBeat *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  snprintf(b->what, sizeof b->what, "%s", what);
  duet_progress_start(&b->pg, out, false, 0, 0);
  pthread_condattr_t ca;
  bool attr = !pthread_condattr_init(&ca);
  if (!attr || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) || pthread_mutex_init(&b->mu, NULL)) {
    if (attr) pthread_condattr_destroy(&ca);
    free(b);
    return NULL;
  }
  if (pthread_cond_init(&b->cv, &ca)) {
    pthread_condattr_destroy(&ca);
    pthread_mutex_destroy(&b->mu);
    free(b);
    return NULL;
  }
  pthread_condattr_destroy(&ca);
  if (pthread_create(&b->thread, NULL, beat_main, b)) {
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
    return NULL;
  }
  return b;
}

void duet_beat_stop(DuetBeat *b) {
  if (!b) return;
  pthread_mutex_lock(&b->mu);
  b->done = true;
  pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->mu);
  pthread_join(b->thread, NULL);
  pthread_cond_destroy(&b->cv);
  pthread_mutex_destroy(&b->mu);
  free(b);
}
