/* `tessel launch`: runs a job launcher's command (mpirun, srun) and, when
 * it fails, runs it again from the latest checkpoint. See tessel/launch.h. */
#include "tessel/launch.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "core/core.h"
#include "session/restart.h"

ts_launch_options ts_launch_options_default(void) {
    ts_launch_options o = {0, NULL, NULL, 0};
    return o;
}

/* Who died, as the launcher reported it on stderr. */
typedef struct blame {
    /* 0 nothing said, 1 an exit status, 2 a peer that disconnected, 3 a
     * signal, 4 a lost node */
    int sev;
    int rank;       /* -1: not said */
    char host[128]; /* "" : not said */
    char how[128];  /* "killed by signal 9", "(srun: Killed)", "(srun: node failure)" */
    int missing;    /* the one rank tessel's collective waited for in vain, else -1 */
} blame;

/* One line of the launcher's stderr. The launcher also reports the ranks
 * it (or a timeout) ended after the first failure, so the most telling
 * report wins — a lost node, a signal, a peer that vanished, then an exit
 * status — and the first of equals. */
static void scan_line(const char *l, blame *b) {
    const char *p;
    int rank = -1, sig, a, sev = 0, k = 0;
    char host[128] = "", what[96] = "", how[128] = "";
    /* tessel's own report from a surviving rank: "ranks that did not
     * arrive: 1 (rank 1 did not answer)" (one rank only) */
    if ((p = strstr(l, "ranks that did not arrive: ")) && b->missing < 0 &&
        sscanf(p, "ranks that did not arrive: %d (%n", &rank, &k) == 1 && k > 0)
        b->missing = rank;
    rank = -1;
    if ((p = strstr(l, "process rank ")) &&
        sscanf(p, "process rank %d with PID %*d on node %127s exited on signal %d", &rank, host,
               &sig) == 3) {
        /* Open MPI 4: "mpirun noticed that process rank 1 with PID 123 on
         * node vm exited on signal 9 (Killed)." */
        sev = 3;
        snprintf(how, sizeof how, "killed by signal %d", sig);
    } else if ((p = strstr(l, "Peer host:")) && sscanf(p, "Peer host: %127s", host) == 1) {
        /* Open MPI: "An MPI communication peer process has unexpectedly
         * disconnected. ... Peer host: n2" (a crash, or its node gone) */
        sev = 2;
        snprintf(how, sizeof how, "(Open MPI: its process disconnected)");
    } else if ((p = strstr(l, "srun: error: Node failure on ")) &&
               sscanf(p, "srun: error: Node failure on %127s", host) == 1) {
        /* srun: "srun: error: Node failure on n2" */
        sev = 4;
        snprintf(how, sizeof how, "(srun: node failure)");
    } else if ((p = strstr(l, "srun: error: ")) &&
               (sscanf(p, "srun: error: %127[^:]: task %d: %95[^\n]", host, &rank, what) == 3 ||
                sscanf(p, "srun: error: %127[^:]: tasks %d-%d: %95[^\n]", host, &rank, &a, what) ==
                    4)) {
        /* "srun: error: n2: task 3: Killed", "...: tasks 2-3: Exited with
         * exit code 1" */
        sev = strstr(what, "Exited with exit code") ? 1 : 3;
        snprintf(how, sizeof how, "(srun: %s)", what);
    }
    if (sev <= b->sev) return;
    b->sev = sev;
    b->rank = rank;
    snprintf(b->host, sizeof b->host, "%s", host);
    snprintf(b->how, sizeof b->how, "%s", how);
}

/* Runs argv once with stderr through a pipe (passed on, and scanned).
 * Returns the exit status (128 + signal), -1 when it could not start. */
static int run_once(char *const argv[], int attempt, const ts_launch_options *o, blame *b) {
    int fd[2];
    if (pipe(fd) != 0) {
        ts_fail(TS_ERR_IO, "tessel launch: pipe: %s", strerror(errno));
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        ts_fail(TS_ERR_IO, "tessel launch: fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        char a[16];
        snprintf(a, sizeof a, "%d", attempt);
        setenv("TESSEL_LAUNCH_ATTEMPT", a, 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "tessel launch: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd[1]);
    char buf[4096], line[1024];
    size_t n = 0;
    int forwarded = 0;
    for (;;) {
        if (o->stop && *o->stop && !forwarded) {
            kill(pid, o->stop_signal > 0 ? o->stop_signal : SIGTERM);
            forwarded = 1;
        }
        ssize_t k = read(fd[0], buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        fwrite(buf, 1, (size_t)k, stderr);
        for (ssize_t i = 0; i < k; i++) {
            if (buf[i] == '\n' || n == sizeof line - 1) {
                line[n] = 0;
                scan_line(line, b);
                n = 0;
            } else {
                line[n++] = buf[i];
            }
        }
    }
    fflush(stderr);
    close(fd[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) {
            ts_fail(TS_ERR_IO, "tessel launch: waitpid: %s", strerror(errno));
            return -1;
        }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The command's `--out DIR` (or --out=DIR) and `--resume X`, and where the
 * latter's value sits (-1: none). */
static const char *find_opt(char *const argv[], const char *opt, int *at) {
    const size_t n = strlen(opt);
    *at = -1;
    for (int i = 0; argv[i]; i++) {
        if (!strcmp(argv[i], opt) && argv[i + 1]) {
            *at = i + 1;
            return argv[i + 1];
        }
        if (!strncmp(argv[i], opt, n) && argv[i][n] == '=') {
            *at = i;
            return argv[i] + n + 1;
        }
    }
    return NULL;
}

/* The run's config (for the audit log's signing key): the one the run
 * directory holds, else the defaults. */
static ts_status run_config(const char *dir, ts_config *c) {
    char path[1024];
    ts_config_init(c);
    if ((size_t)snprintf(path, sizeof path, "%s/config.yaml", dir) >= sizeof path)
        return ts_fail(TS_ERR_INVALID, "run directory '%.60s...': path too long", dir);
    if (access(path, F_OK) != 0) return TS_OK;
    ts_status s = ts_config_load_file(c, path);
    if (s == TS_OK) s = ts_config_finish(c);
    if (s != TS_OK) ts_error_prefix("tessel launch: the run's config %s", path);
    return s;
}

/* "on host H killed by signal 9", "exit status 137": what follows "rank R
 * "; "host n2 (srun: node failure)" when no rank is named. */
static void describe(const blame *b, int code, char *out, size_t n) {
    char how[160];
    if (b->how[0])
        snprintf(how, sizeof how, "%s", b->how);
    else
        ts_restart_describe(code, how, sizeof how);
    if (b->host[0] && b->rank < 0) /* a node lost: no one rank to name */
        snprintf(out, n, "host %s %s", b->host, how);
    else if (b->host[0])
        snprintf(out, n, "on host %s %s", b->host, how);
    else
        snprintf(out, n, "%s", how);
}

ts_status ts_launch_job(char *const argv[], const ts_launch_options *o, int *exit_code) {
    ts_launch_options dflt = ts_launch_options_default();
    if (!o) o = &dflt;
    FILE *log = o->log ? o->log : stdout;
    *exit_code = 1;
    if (!argv || !argv[0]) return ts_fail(TS_ERR_INVALID, "tessel launch: no command to run");
    int out_at, resume_at;
    const char *dir = find_opt(argv, "--out", &out_at);
    const char *orig_resume = find_opt(argv, "--resume", &resume_at);
    if (o->max_restarts > 0 && !dir)
        return ts_fail(TS_ERR_INVALID,
                       "tessel launch --max-restarts %d: the command names no run directory "
                       "(--out RUN_DIR of tessel train), so a restart could not resume it",
                       o->max_restarts);
    /* The command's arguments, with room for `--resume latest`. */
    int argc = 0;
    while (argv[argc]) argc++;
    char **args = ts_zalloc(sizeof *args * (size_t)(argc + 3), "tessel launch arguments");
    if (!args) return TS_ERR_NOMEM;
    memcpy(args, argv, sizeof *args * (size_t)argc);
    ts_status s = TS_OK;
    for (int attempt = 0;; attempt++) {
        blame b = {0, -1, "", "", -1};
        const int code = run_once(args, attempt, o, &b);
        if (code < 0) {
            s = TS_ERR_IO;
            break;
        }
        *exit_code = code;
        if (code == 0 || code == 130 || (o->stop && *o->stop)) break;
        /* A host without a rank (a node lost, a peer gone): the rank the
         * survivors waited for is the one on it. */
        if (b.rank < 0 && b.host[0] && b.missing >= 0) b.rank = b.missing;
        /* Only exit statuses seen (srun told of no node failure, Open MPI of
         * no peer): a survivor exits 1 because one rank stopped answering,
         * so that rank is the one to name; its host is not in the output. */
        if (b.sev <= 1 && b.missing >= 0 && b.rank != b.missing) {
            b.rank = b.missing;
            b.host[0] = 0;
            snprintf(b.how, sizeof b.how, "(it stopped answering: its process or host is gone)");
        }
        char what[320];
        describe(&b, code, what, sizeof what);
        char rank[32] = "";
        if (b.rank >= 0) snprintf(rank, sizeof rank, "rank %d ", b.rank);
        if (code == 2) {
            s = ts_fail(TS_ERR_INVALID,
                        "the command exited 2 (a config, data or checkpoint it refused): not "
                        "restarted, it would fail again");
            break;
        }
        if (attempt == o->max_restarts) {
            if (attempt)
                s = ts_fail(TS_ERR_IO,
                            "gave up after %d restart%s (--max-restarts %d); the last attempt "
                            "failed: %s%s (exit status %d)",
                            attempt, attempt == 1 ? "" : "s", o->max_restarts, rank, what, code);
            else
                s = ts_fail(TS_ERR_IO, "the command failed: %s%s (exit status %d)", rank, what,
                            code);
            break;
        }
        fprintf(log, "tessel launch: attempt %d of %d failed: %s%s (exit status %d)\n", attempt + 1,
                o->max_restarts + 1, rank, what, code);
        ts_config c;
        if ((s = run_config(dir, &c)) != TS_OK) break;
        const char *resume = NULL;
        s = ts_restart_prepare(&c, dir, orig_resume, attempt + 1, o->max_restarts, b.rank, what,
                               log, &resume);
        if (s != TS_OK) break;
        if (resume && !strcmp(resume, "latest")) {
            if (resume_at >= 0 && !strcmp(args[resume_at], argv[resume_at]) &&
                !strncmp(args[resume_at], "--resume=", 9))
                args[resume_at] = "--resume=latest";
            else if (resume_at >= 0)
                args[resume_at] = "latest";
            else {
                args[argc] = "--resume";
                args[argc + 1] = "latest";
            }
        }
    }
    free(args);
    return s;
}
