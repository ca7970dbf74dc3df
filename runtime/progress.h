/* runtime/progress.h: progress that shows long work is alive (training
 * steps, evaluation batches): a live one-line bar, rewritten in place, when
 * the output is a terminal; plain "duet: progress: ..." lines every few
 * seconds when it is a pipe or a file; nothing when quiet.  Times come from
 * the monotonic clock.  Runtime-private (not part of duet_rt.h). */
#ifndef DUET_PROGRESS_H
#define DUET_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* How progress is shown. */
enum { DUET_PROGRESS_OFF = 0, DUET_PROGRESS_LINES = 1, DUET_PROGRESS_BAR = 2 };

/* Seconds between plain progress lines unless DUET_PROGRESS_SECONDS says
 * otherwise, and between redraws of the bar. */
#define DUET_PROGRESS_INTERVAL 5.0
#define DUET_PROGRESS_REDRAW 0.2

typedef struct DuetProgress {
  FILE *out;
  int mode;          /* DUET_PROGRESS_OFF, _LINES or _BAR */
  int width;         /* the terminal's columns (bar mode) */
  double interval;   /* seconds between plain lines */
  double t_start;    /* when the work began (monotonic seconds) */
  double t_shown;    /* when progress was last printed or drawn */
  int64_t first, total; /* units done before t_start, and in all */
  bool drawn;        /* a bar is on the screen (cursor at its column 0) */
} DuetProgress;

/* Monotonic seconds (CLOCK_MONOTONIC) from an arbitrary origin. */
double duet_progress_now(void);

/* Starts progress on out for units first+1 .. total (first: done already,
 * e.g. the step a run resumed from): off when quiet, a bar when out is a
 * terminal (isatty) and no MPI or Slurm launcher started the process (its
 * pseudo-terminal merges the ranks' output), plain lines otherwise.  The line interval is
 * DUET_PROGRESS_SECONDS when that environment variable holds a number > 0
 * (and at most 86400), else DUET_PROGRESS_INTERVAL; an invalid value is
 * reported to stderr once and ignored. */
void duet_progress_start(DuetProgress *pg, FILE *out, bool quiet, int64_t first, int64_t total);

/* A duration for people: "0s", "59s", "1m05s", "59m59s", "1h00m",
 * "100h59m"; "?" for a negative, NaN or infinite one.  Returns buf. */
char *duet_format_duration(double seconds, char *buf, size_t n);

/* The estimated seconds left when done of total units took elapsed seconds
 * since the start, first of them done before it: elapsed / (done - first)
 * x (total - done); NAN when nothing was done yet. */
double duet_progress_eta(double elapsed, int64_t first, int64_t done, int64_t total);

/* The bar line: "HEAD [#####.....]  45% TAIL" (a bar of `cells` cells, the
 * percentage of done/total rounded down), cut to width-1 characters so a
 * terminal never wraps it.  Returns buf. */
char *duet_progress_bar_text(char *buf, size_t n, const char *head, int64_t done, int64_t total, const char *tail,
                             int cells, int width);

/* After unit `done`: in lines mode, when the interval has passed since
 * progress was last shown, prints "duet: progress: WHAT | E elapsed, ETA T"
 * (WHAT: the caller's text, e.g. "step 37/100 | loss 2.31 | 540 samples/s");
 * in bar mode, at most every DUET_PROGRESS_REDRAW seconds (or the interval
 * when shorter; always when
 * force), redraws the bar "HEAD [####....]  37% | E elapsed, ETA T | WHAT"
 * (cut to the terminal's width), leaving the cursor at its column 0.
 * Nothing when off. */
void duet_progress_update(DuetProgress *pg, int64_t done, const char *head, const char *what, bool force);

/* For work whose total is unknown (one compiler run): in lines mode, when
 * the interval has passed since progress was last shown, prints "duet:
 * progress: WHAT | E elapsed"; in bar mode redraws "WHAT | E elapsed" in
 * place (as duet_progress_update).  Nothing when off. */
void duet_progress_alive(DuetProgress *pg, const char *what);

/* Erases a drawn bar (before another line is printed, and at the end). */
void duet_progress_clear(DuetProgress *pg);

/* A heartbeat for a call that blocks (an NVRTC compile): a thread that
 * shows duet_progress_alive(WHAT) on out (a line every interval on a pipe,
 * the bar in place on a terminal) until duet_beat_stop, which erases a bar
 * and frees it.  NULL (nothing shown; duet_beat_stop(NULL) does nothing)
 * when quiet or when the thread cannot be started. */
typedef struct DuetBeat DuetBeat;
DuetBeat *duet_beat_start(FILE *out, bool quiet, const char *what);
void duet_beat_stop(DuetBeat *b);

/* Whether this process prints warnings: true except on the ranks other
 * than 0 of an MPI run (duet_launch_ranks), which rank 0 speaks for.
 * --quiet hides progress and notes, never warnings or errors.  (Defined
 * in runtime/dist.c, beside duet_launch_ranks.) */
bool duet_warns(void);

#endif
