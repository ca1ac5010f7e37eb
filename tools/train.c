/* tessel train: run the configured training session (tessel/session.h) with
 * progress on the terminal; Ctrl-C stops it cleanly after the current step. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"

/* Exit status of a run stopped by Ctrl-C: the shell's 128 + SIGINT. */
enum { CLI_INTERRUPTED = 130 };
/* Exit status of a run an alert rule with action stop ended. */
enum { CLI_ALERT_STOP = 3 };

static volatile sig_atomic_t stop_flag;

/* SIGINT (Ctrl-C) and SIGTERM (a scheduler, kill): stop after the current
 * step; with --procs the launcher passes the request on to the workers. */
static void on_sigint(int sig) {
    stop_flag = 1;
    /* A second one ends the process at once, as without a handler. */
    signal(sig, SIG_DFL);
}

int cli_train(const cli_args *a) {
    ts_config c;
    int rc = cli_load_config(a, &c);
    if (rc != CLI_OK) return rc;

    ts_session_options o = ts_session_options_default();
    o.out_dir = a->out;
    o.resume = a->resume;
    o.trace = a->trace;
    o.stop = &stop_flag;
    o.log = stdout;
    o.progress = isatty(fileno(stdout)) ? TS_PROGRESS_TTY : TS_PROGRESS_LINES;
    struct sigaction sa, old, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    sigaction(SIGTERM, &sa, &old_term);

    ts_session_result r;
    ts_status s = ts_session_run_dist(&c, &o, &r);
    sigaction(SIGINT, &old, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    fflush(stdout);
    if (s != TS_OK) {
        /* Before the first step anything wrong is the config's or the
         * data's; a step that fails is tessel's (or a diverging model's). */
        rc = cli_error(r.failed_in_step ? CLI_FAIL : cli_status_code(s), "%s", ts_last_error());
        if (r.run_dir[0]) fprintf(stderr, "tessel: the run directory is %s\n", r.run_dir);
        return rc;
    }
    if (r.run_dir[0]) printf("run directory: %s\n", r.run_dir);
    if (r.stopped_by_alert) {
        fprintf(stderr, "tessel: stopped by alert rule '%s' after step %lld (exit status %d)\n",
                r.alert_rule, (long long)r.steps, CLI_ALERT_STOP);
        return CLI_ALERT_STOP;
    }
    return r.interrupted ? CLI_INTERRUPTED : CLI_OK;
}
