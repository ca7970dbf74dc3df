/* cli/plot.h: `duet plot` (cli/plot.c). */
#ifndef DUET_CLI_PLOT_H
#define DUET_CLI_PLOT_H

/* duet plot METRICS.jsonl [MORE ...] -o OUT.png|OUT.svg [--label NAME ...]
 * [--size WxH] [--script FILE]: training curves from `duet run --metrics`
 * files, drawn by gnuplot (found on PATH) through a pipe.  argv holds the
 * arguments after "plot".  Returns the exit status: 0 after writing OUT,
 * 1 after a one-line "duet: error: ..." (a malformed line as FILE:LINE;
 * no gnuplot: "duet plot needs gnuplot: apt-get install gnuplot-nox"). */
int cmd_plot(int argc, char **argv);

#endif
