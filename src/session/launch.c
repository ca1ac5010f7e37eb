/* Training on several processes: the shm launcher (fork N workers) and the
 * MPI path, each running ts_session_run on every rank. See launch.h. */
#include "session/launch.h"
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/core.h"
#include "core/dirlock.h"
#include "obs/progress.h"
#include "session/ranks.h"
#include "session/restart.h"
#include "session/zoo_data.h"
#include "tessel/ckpt.h"

/* What rank 0 leaves for the launcher: its result and, on failure, its
 * error (workers end with _exit; this lives in a MAP_SHARED mapping). */
typedef struct shared_out {
    ts_session_result r;
    ts_status st;
    char error[2048];
} shared_out;

typedef struct launch_ctx {
    const ts_config *c;
    const ts_session_options *o;
    shared_out *out;
    int attempt; /* 0: the first; k: the k-th restart */
} launch_ctx;

/* Runs this rank's session. Ranks other than 0 write nothing: no run
 * directory, checkpoints, TensorBoard files or progress — except, with
 * ZeRO, their blocks of the optimizer state into rank 0's checkpoints;
 * each serves its own metrics endpoint (base port + rank) when metrics are
 * on; a resume reads the same checkpoint as rank 0. */
static ts_status run_rank(const ts_config *c0, const ts_session_options *o0, ts_comm *comm,
                          ts_session_result *r) {
    ts_config c = *c0;
    ts_session_options o = *o0;
    o.comm = comm;
    if (ts_comm_rank(comm) == 0) return ts_session_run(&c, &o, r);
    const char *dir = o0->out_dir && *o0->out_dir ? o0->out_dir : c0->output.dir;
    char from[512];
    if (o0->resume && !strcmp(o0->resume, "latest")) {
        /* rank 0 continues in dir; the others only read its newest
         * checkpoint, or start from step 0 as rank 0 does when the run was
         * stopped before its first (ts_sess_open_run_dir) */
        snprintf(from, sizeof from, "%s", dir);
        char ck[1024];
        o.resume = ts_ckpt_resolve(dir, ck, sizeof ck) == TS_ERR_NOT_FOUND ? NULL : from;
    }
    o.out_dir = NULL;
    c.output.dir[0] = 0;
    /* ZeRO: every rank saves its blocks; compression: every rank takes part
     * in gathering the residuals before rank 0's saves, so it keeps the
     * cadence (ts_sess_shard_saver makes no saver without ZeRO) */
    if ((c.dist.zero || c.dist.compress || c.pipe.stages > 1) && c.ckpt.every > 0 && dir && *dir)
        o.shard_dir = dir;
    else
        c.ckpt.every = 0;
    /* each rank serves its own /metrics on base port + rank */
    if (c.observe.metrics_port > 0) c.observe.metrics_port += ts_comm_rank(comm);
    c.observe.tensorboard = 0;
    c.observe.histogram_every = 0;
    o.progress = TS_PROGRESS_NONE;
    FILE *devnull = fopen("/dev/null", "w");
    if (!devnull) return ts_fail(TS_ERR_IO, "rank %d: cannot open /dev/null", ts_comm_rank(comm));
    o.log = devnull;
    ts_status s = ts_session_run(&c, &o, r);
    fclose(devnull);
    return s;
}

/* A worker's stop flag, for SIGUSR2: the launcher forwards a stop request
 * that reached it alone (a terminal's Ctrl-C reaches the workers anyway). */
static volatile sig_atomic_t *worker_stop;
static void on_forwarded_stop(int sig) {
    (void)sig;
    if (worker_stop) *worker_stop = 1;
}

static int worker(ts_comm *comm, void *user) {
    const launch_ctx *lc = user;
    const int rank = ts_comm_rank(comm);
    if (lc->o->stop) {
        worker_stop = lc->o->stop;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_forwarded_stop;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR2, &sa, NULL);
    }
    ts_session_arm_test_kill(rank, lc->attempt);
    ts_session_result r;
    ts_status s = run_rank(lc->c, lc->o, comm, &r);
    if (rank == 0) {
        lc->out->r = r;
        lc->out->st = s;
        if (s != TS_OK) snprintf(lc->out->error, sizeof lc->out->error, "%s", ts_last_error());
    }
    if (s != TS_OK) {
        fprintf(stderr, "tessel: rank %d: %s\n", rank, ts_last_error());
        fflush(stderr);
        return 1;
    }
    return 0;
}

/* One attempt: n workers from scratch or from o->resume. codes[] gets
 * their exit statuses (128 + signal). */
static ts_status launch_once(const ts_config *c, const ts_session_options *o, shared_out *out,
                             int attempt, int *codes, ts_session_result *r) {
    const int n = c->dist.procs;
    memset(out, 0, sizeof *out);
    out->st = TS_ERR_INTERNAL;
    snprintf(out->error, sizeof out->error, "rank 0 ended before it reported");
    out->r.first_loss = out->r.final_loss = out->r.median_rate = NAN;
    launch_ctx lc = {c, o, out, attempt};
    ts_shm_options so;
    memset(&so, 0, sizeof so);
    so.timeout_s = c->dist.timeout_s;
    so.grace_s = 5;
    so.forward_stop = o->stop;
    for (int i = 0; i < n; i++) codes[i] = 0;
    fflush(NULL);
    ts_status s = ts_shm_launch(n, &so, worker, &lc, codes);
    *r = out->r;
    /* A worker that died by a signal (killed, crashed) failed the run,
     * whichever rank it was: one exit status (1) for the command line, and
     * the launcher's message names the rank and the signal. */
    for (int i = 0; i < n; i++)
        if (codes[i] >= 128) r->failed_in_step = 1;
    if (s == TS_OK && out->st != TS_OK)
        s = ts_fail(out->st, "%s", out->error);
    else if (s != TS_OK)
        ts_error_prefix("tessel train --procs %d", n);
    return s;
}

/* The launcher holds the run directory's lock for the whole run, every
 * attempt included, so no other run can slip in between two attempts; the
 * workers it forks share it (core/dirlock.h), rank 0's session included.
 * A directory that does not exist yet is made and locked by rank 0's
 * session; the launcher takes that lock over after the attempt. */
static ts_status hold_run_dir(const char *dir, ts_dir_lock *l) {
    struct stat st;
    if (l->slot >= 0 || !dir || !*dir || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return TS_OK; /* held, no run directory, or a missing one (or a link: rank 0 names it) */
    ts_dir d;
    ts_status s = ts_dir_open(&d, dir, 0);
    if (s == TS_OK) s = ts_dir_lock_take(&d, "tessel train", 0, l);
    ts_dir_close(&d);
    return s;
}

/* A failed attempt that is not worth repeating: every failed worker exited
 * by itself (no crash) and rank 0 failed before its first step, i.e. in
 * setup (the config, the data, the checkpoint): the same again. */
static int deterministic(const shared_out *out, const int *codes, int n) {
    for (int i = 0; i < n; i++)
        if (codes[i] >= 128 || codes[i] < 0) return 0;
    return out->st != TS_OK && out->st != TS_ERR_INTERNAL && !out->r.failed_in_step;
}

static ts_status run_shm(const ts_config *c, const ts_session_options *o, ts_session_result *r) {
    const int n = c->dist.procs;
    memset(r, 0, sizeof *r);
    r->first_loss = r->final_loss = r->median_rate = NAN;
    if (ts_zoo_check_procs(c, n) != TS_OK) return TS_ERR_UNSUPPORTED;
    if (c->pipe.stages <= 1 && c->model.batch % n) /* stages: checked by pipe_train.c */
        return ts_fail(TS_ERR_INVALID,
                       "model.batch %lld does not divide by %d processes: every rank trains on "
                       "model.batch / processes rows of each batch",
                       (long long)c->model.batch, n);
    ts_status s = ts_restart_check(c, n);
    if (s != TS_OK) return s;
    shared_out *out =
        mmap(NULL, sizeof *out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (out == MAP_FAILED) return ts_fail(TS_ERR_NOMEM, "--procs: cannot map shared memory");
    int *codes = ts_zalloc(sizeof *codes * (size_t)n, "--procs exit statuses");
    if (!codes) {
        munmap(out, sizeof *out);
        return TS_ERR_NOMEM;
    }
    const int max = c->dist.max_restarts;
    const char *dir = o->out_dir && *o->out_dir ? o->out_dir : c->output.dir;
    FILE *log = o->log ? o->log : stdout;
    ts_session_options oa = *o;
    ts_dir_lock lock = {-1};
    s = hold_run_dir(dir, &lock);
    for (int attempt = 0; s == TS_OK; attempt++) {
        s = launch_once(c, &oa, out, attempt, codes, r);
        const int rank = ts_restart_failed_rank(codes, n);
        if (s == TS_OK || max == 0 || rank < 0 || (o->stop && *o->stop)) break;
        char err0[2048];
        snprintf(err0, sizeof err0, "%s", ts_last_error());
        if (hold_run_dir(dir, &lock) != TS_OK) {
            char busy[1024];
            snprintf(busy, sizeof busy, "%s", ts_last_error());
            s = ts_fail(s, "not restarted: %s (the attempt that failed: %s)", busy, err0);
            break;
        }
        ts_fail(s, "%s", err0);
        char how[64], err[2048];
        ts_restart_describe(codes[rank], how, sizeof how);
        snprintf(err, sizeof err, "%s", ts_last_error());
        const int fixed = deterministic(out, codes, n);
        if (attempt == max || fixed) {
            if (attempt < max)
                s = ts_fail(s,
                            "not restarted (%d of --max-restarts %d used): attempt %d failed in "
                            "setup, which would fail again: %s",
                            attempt, max, attempt + 1, err);
            else
                s = ts_fail(s,
                            "gave up after %d restart%s (--max-restarts %d); the last attempt: %s",
                            attempt, attempt == 1 ? "" : "s", max, err);
            break;
        }
        fprintf(log, "tessel: attempt %d of %d failed: %s\n", attempt + 1, max + 1, err);
        const char *resume = NULL;
        if ((s = ts_restart_prepare(c, dir, o->resume, attempt + 1, max, rank, how, log,
                                    &resume)) != TS_OK)
            break;
        struct stat moved;
        if (lstat(dir, &moved) != 0) ts_dir_lock_release(&lock); /* renamed away: not RUN's */
        oa.resume = resume;
    }
    ts_dir_lock_release(&lock);
    free(codes);
    munmap(out, sizeof *out);
    return s;
}

static ts_status run_mpi(const ts_config *c, const ts_session_options *o, ts_session_result *r) {
    ts_comm *comm = NULL;
    ts_status s = ts_comm_from_env(&comm);
    if (s != TS_OK) return s;
    if (c->dist.timeout_s > 0) ts_comm_set_timeout(comm, c->dist.timeout_s);
    /* The test knob also works under mpirun; `tessel launch` numbers its
     * attempts (tessel/launch.h). */
    const char *attempt = getenv("TESSEL_LAUNCH_ATTEMPT");
    ts_session_arm_test_kill(ts_comm_rank(comm), attempt ? atoi(attempt) : 0);
    s = run_rank(c, o, comm, r);
    if (s != TS_OK)
        ts_error_prefix("rank %d of %d (%s)", ts_comm_rank(comm), ts_comm_size(comm),
                        ts_comm_transport(comm));
    ts_comm_close(comm);
    return s;
}

ts_status ts_session_run_dist(const ts_config *c, const ts_session_options *o,
                              ts_session_result *r) {
    if (!c || !r) return ts_fail(TS_ERR_INVALID, "session: NULL argument");
    ts_session_options dflt = ts_session_options_default();
    if (!o) o = &dflt;
    if (o->comm) return ts_session_run(c, o, r);
    if (ts_dist_started_by_mpi()) {
        if (c->dist.max_restarts > 0)
            return ts_fail(TS_ERR_INVALID,
                           "--max-restarts %d (dist.max_restarts) restarts the workers of "
                           "--procs N; under mpirun or srun, wrap the launcher instead: tessel "
                           "launch --max-restarts %d -- mpirun ... tessel train ... --out RUN_DIR",
                           c->dist.max_restarts, c->dist.max_restarts);
        return run_mpi(c, o, r);
    }
    if (c->dist.procs > 1) return run_shm(c, o, r);
    ts_status s = ts_restart_check(c, c->dist.procs);
    return s != TS_OK ? s : ts_session_run(c, o, r);
}
