#define _POSIX_C_SOURCE 200809L /* setenv, fileno, nanosleep */
/* tests/test_progress.c: the exact formats of runtime/progress.c: durations,
 * the ETA, the bar text and its cut to the terminal's width, a plain
 * progress line and a drawn bar (into a temporary file standing for the
 * pipe or the terminal), the interval between lines, quiet, and the
 * DUET_PROGRESS_SECONDS override, and the heartbeat thread (NVRTC
 * compiles).  The pipe and terminal forms of a real
 * run: tests/run_progress.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/progress.h"

static int fails;

static void expect_str(const char *what, const char *got, const char *want) {
  if (strcmp(got, want)) {
    fprintf(stderr, "FAIL %s: got '%s', want '%s'\n", what, got, want);
    fails++;
  }
}

/* The bytes written to f since it was opened (f rewound and emptied). */
static void take(FILE *f, char *buf, size_t n) {
  fflush(f);
  long len = ftell(f);
  rewind(f);
  size_t got = fread(buf, 1, n - 1, f);
  buf[got < (size_t)len ? got : (size_t)len] = 0;
  rewind(f);
  if (ftruncate(fileno(f), 0)) fails++;
}

int main(void) {
  char b[256];
  /* durations */
  struct { double s; const char *want; } d[] = {
      {0, "0s"}, {0.99, "0s"}, {59.9, "59s"}, {60, "1m00s"}, {65, "1m05s"}, {3599, "59m59s"}, {3600, "1h00m"},
      {3661, "1h01m"}, {363599, "100h59m"}, {-1, "?"}, {NAN, "?"}, {INFINITY, "?"}};
  for (size_t i = 0; i < sizeof d / sizeof *d; i++) expect_str("duration", duet_format_duration(d[i].s, b, sizeof b),
                                                               d[i].want);
  /* ETA: 10 s for steps 3..7 of 10 after resuming at 2 -> 2 s a step, 3 left */
  double e = duet_progress_eta(10, 2, 7, 10);
  if (fabs(e - 6) > 1e-12) { fprintf(stderr, "FAIL eta: %g, want 6\n", e); fails++; }
  if (!isnan(duet_progress_eta(10, 2, 2, 10))) { fprintf(stderr, "FAIL eta of nothing done\n"); fails++; }
  if (duet_progress_eta(10, 0, 10, 10) != 0) { fprintf(stderr, "FAIL eta at the end\n"); fails++; }
  /* bar text */
  expect_str("bar 45%", duet_progress_bar_text(b, sizeof b, "train", 45, 100, "| x", 10, 0),
             "train [####......]  45% | x");
  expect_str("bar 0%", duet_progress_bar_text(b, sizeof b, "eval", 0, 7, NULL, 4, 0), "eval [....]   0%");
  expect_str("bar 100%", duet_progress_bar_text(b, sizeof b, "t", 9, 9, "", 4, 0), "t [####] 100%");
  expect_str("bar over", duet_progress_bar_text(b, sizeof b, "t", 12, 9, "", 4, 0), "t [####] 100%");
  expect_str("bar cut to width-1", duet_progress_bar_text(b, sizeof b, "train", 1, 2, "| abcdefgh", 4, 20),
             "train [##..]  50% |");
  /* a plain line (a pipe or a file): at the interval, with elapsed and ETA */
  FILE *f = tmpfile();
  if (!f) { perror("tmpfile"); return 1; }
  DuetProgress pg;
  unsetenv("DUET_PROGRESS_SECONDS");
  duet_progress_start(&pg, f, false, 0, 10);
  if (pg.mode != DUET_PROGRESS_LINES || pg.interval != 5.0) { fprintf(stderr, "FAIL mode %d interval %g on a file\n",
                                                                      pg.mode, pg.interval); fails++; }
  duet_progress_update(&pg, 1, "train", "step 1/10", false); /* before the interval: nothing */
  take(f, b, sizeof b);
  expect_str("nothing before the interval", b, "");
  pg.t_start -= 10.2;
  pg.t_shown -= 10.2;
  duet_progress_update(&pg, 5, "train", "step 5/10 | loss 1.0000", false);
  take(f, b, sizeof b);
  expect_str("line", b, "duet: progress: step 5/10 | loss 1.0000 | 10s elapsed, ETA 10s\n");
  duet_progress_update(&pg, 6, "train", "step 6/10", false); /* just shown: nothing */
  take(f, b, sizeof b);
  expect_str("nothing right after a line", b, "");
  duet_progress_clear(&pg); /* no bar: nothing */
  take(f, b, sizeof b);
  expect_str("clear in lines mode", b, "");
  /* the bar (a terminal): erase, draw, cursor back to column 0; clear erases */
  pg.mode = DUET_PROGRESS_BAR;
  pg.width = 64;
  duet_progress_update(&pg, 5, "train", "step 5/10 | loss 1.0000", true);
  take(f, b, sizeof b);
  expect_str("bar", b, "\r\033[Ktrain [##########..........]  50% | 10s elapsed, ETA 10s | step\r");
  duet_progress_clear(&pg);
  take(f, b, sizeof b);
  expect_str("bar cleared", b, "\r\033[K");
  /* quiet: nothing ever */
  duet_progress_start(&pg, f, true, 0, 10);
  pg.t_start -= 100;
  pg.t_shown -= 100;
  duet_progress_update(&pg, 5, "train", "step 5/10", true);
  take(f, b, sizeof b);
  expect_str("quiet", b, "");
  /* DUET_PROGRESS_SECONDS: taken when valid */
  setenv("DUET_PROGRESS_SECONDS", "0.5", 1);
  duet_progress_start(&pg, f, false, 0, 10);
  if (pg.interval != 0.5) { fprintf(stderr, "FAIL DUET_PROGRESS_SECONDS=0.5: %g\n", pg.interval); fails++; }
  setenv("DUET_PROGRESS_SECONDS", "-1", 1);
  duet_progress_start(&pg, f, false, 0, 10); /* a warning on stderr (tests/run_progress.sh checks its text) */
  if (pg.interval != 5.0) { fprintf(stderr, "FAIL DUET_PROGRESS_SECONDS=-1: %g\n", pg.interval); fails++; }
  /* the heartbeat thread: lines while it runs (interval 0.01 s, it wakes up
   * every 0.1 s), nothing after it stopped; quiet: none */
  setenv("DUET_PROGRESS_SECONDS", "0.01", 1);
  DuetBeat *beat = duet_beat_start(f, false, "compiling 3 kernels with X");
  if (!beat) { fprintf(stderr, "FAIL beat did not start\n"); fails++; }
  struct timespec nap = {0, 350 * 1000000L};
  nanosleep(&nap, NULL);
  duet_beat_stop(beat);
  take(f, b, sizeof b);
  int lines = 0;
  for (char *l = b; *l; l = strchr(l, '\n') + 1) {
    lines++;
    const char *want = "duet: progress: compiling 3 kernels with X | 0s elapsed\n";
    if (strncmp(l, want, strlen(want))) {
      fprintf(stderr, "FAIL beat line: '%.60s'\n", l);
      fails++;
      break;
    }
  }
  if (lines < 1 || lines > 4) { fprintf(stderr, "FAIL beat: %d lines in 0.35 s (want 1 to 4)\n", lines); fails++; }
  nanosleep(&nap, NULL);
  take(f, b, sizeof b);
  expect_str("nothing after the beat stopped", b, "");
  if (duet_beat_start(f, true, "x")) { fprintf(stderr, "FAIL quiet beat started\n"); fails++; }
  duet_beat_stop(NULL);
  fclose(f);
  if (fails) return 1;
  printf("ok progress formats\n");
  return 0;
}
