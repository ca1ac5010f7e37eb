/* ctl_cli.h — `tessel ctl resume|status RUN_DIR`: control a running
 * training run through its run directory (an alert's pause). */
#ifndef TESSEL_CTL_CLI_H
#define TESSEL_CTL_CLI_H

/* argv holds the arguments after "ctl". Exit status: 0 done, 1 the run did
 * not acknowledge, 2 bad usage or a run that is not paused. */
int tessel_cmd_ctl(int argc, char **argv);

#endif
