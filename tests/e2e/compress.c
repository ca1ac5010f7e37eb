/* `tessel train --procs N --set dist.compress=...` end to end (docs/distributed.md,
 * "Gradient compression"): on 2 and 4 processes a worker killed mid-run and
 * restarted from the latest checkpoint ends with the weights, optimizer
 * state and error-feedback residuals of an uninterrupted run, bit for bit
 * (every rank's residual rows are in rank 0's checkpoint), for topk (with
 * E4M3 and E5M2 values, warm-up, DGC momentum correction and local
 * clipping) and PowerSGD, resumed after and inside a dense start
 * (dist.compress_dense_steps), and with fp16 loss scaling (the scale and the
 * residuals of unscaled gradients restored together); the exchanged bytes are in metrics.jsonl and
 * the TensorBoard events; mpirun (the mpi transport) gives the checkpoint of
 * --procs 2 bit for bit; `tessel bench --compress` reports both runs; and the
 * refusals name their key: compression with one process, with ZeRO,
 * momentum correction without SGD momentum, a ratio of 0, a dense start
 * without compression; a resume on
 * another number of processes starts every rank from the mean residual,
 * with a warning. */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static char dir[64];
static const char *bin; /* the tessel binary (e2e_setup) */

static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set dist.algo=native --set ckpt.every=2 --steps 8";

static void kill_knob(const char *rank, const char *step) {
    if (rank) {
        setenv("TESSEL_TEST_KILL_RANK", rank, 1);
        setenv("TESSEL_TEST_KILL_STEP", step, 1);
    } else {
        unsetenv("TESSEL_TEST_KILL_RANK");
        unsetenv("TESSEL_TEST_KILL_STEP");
    }
}

/* An uninterrupted run and one whose rank `rank` dies in step 5 (restarted
 * from step 4) end with the same checkpoint, residuals included. */
static void kill_resume(const char *what, int procs, const char *rank, const char *extra) {
    const char *state =
        strstr(extra, "powersgd") ? "compress.bucket0.error" : "compress.bucket0.residual";
    char full[64], killed[64];
    snprintf(full, sizeof full, "%s-full", what);
    snprintf(killed, sizeof killed, "%s-killed", what);
    e2e_result r = e2e_runf("train examples/w1.yaml %s --procs %d %s --out %s", small, procs, extra,
                            e2e_path(full));
    CHECK(r.rc == 0, "%s: uninterrupted: exit %d: %s", what, r.rc, r.err);
    e2e_done(&r);
    kill_knob(rank, "5");
    r = e2e_runf("train examples/w1.yaml %s --procs %d %s --max-restarts 1 --out %s", small, procs,
                 extra, e2e_path(killed));
    kill_knob(NULL, NULL);
    CHECK(r.rc == 0 && strstr(r.out, "resuming from") && strstr(r.out, "done: 8 steps"),
          "%s: killed once, restarted: exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
    r = e2e_runf("ckpt diff %s %s", e2e_path(full), e2e_path(killed));
    CHECK(r.rc == 0 && strstr(r.out, " 0 different") && strstr(r.out, "step-00000008 (step 8)"),
          "%s: ckpt diff exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
    /* the residuals are in the checkpoint, every rank's row */
    r = e2e_runf("ckpt inspect %s/step-00000004", e2e_path(full));
    char shape[64];
    snprintf(shape, sizeof shape, "f32[%d,", procs);
    const char *line = strstr(r.out, state);
    CHECK(r.rc == 0 && line && strstr(line, shape) && strstr(line, shape) < strchr(line, '\n'),
          "%s: the checkpoint lists %s [%d, n]: %s%s", what, state, procs, r.out, r.err);
    e2e_done(&r);
}

/* The mpi transport: mpirun -np 2 ends with the checkpoint of --procs 2 (shm),
 * bit for bit (the same payloads, decoded in the same order). Skipped
 * without mpirun on the PATH. */
static void mpi_same(const char *what, const char *extra) {
    const char *path = getenv("PATH");
    char mpirun[512] = "";
    for (const char *p = path ? path : ""; *p && !mpirun[0];) {
        const char *e = strchr(p, ':');
        int n = e ? (int)(e - p) : (int)strlen(p);
        char c[512];
        snprintf(c, sizeof c, "%.*s/mpirun", n, p);
        if (access(c, X_OK) == 0) snprintf(mpirun, sizeof mpirun, "%s", c);
        p += n + (e != NULL);
    }
    if (!mpirun[0]) {
        printf("skipped the mpirun runs: mpirun not found on PATH\n");
        return;
    }
    char shm[64], mpi[64], cmd[2048];
    snprintf(shm, sizeof shm, "%s-shm", what);
    snprintf(mpi, sizeof mpi, "%s-mpi", what);
    e2e_result r =
        e2e_runf("train examples/w1.yaml %s --procs 2 %s --out %s", small, extra, e2e_path(shm));
    CHECK(r.rc == 0, "%s: --procs 2: exit %d: %s", what, r.rc, r.err);
    e2e_done(&r);
    snprintf(cmd, sizeof cmd,
             "TESSEL_COLL_CACHE=0 ASAN_OPTIONS=detect_leaks=0 '%s' %s--oversubscribe -np 2 '%s' "
             "train examples/w1.yaml %s %s --out %s > %s.log 2>&1",
             mpirun, geteuid() == 0 ? "--allow-run-as-root " : "", bin, small, extra, e2e_path(mpi),
             e2e_path(mpi));
    int rc = system(cmd);
    char logp[256];
    snprintf(logp, sizeof logp, "%s.log", e2e_path(mpi));
    char *log = e2e_slurp(logp, NULL);
    CHECK(rc == 0 && log && strstr(log, "2 processes (mpi)"), "%s: mpirun: status %d:\n%s", what,
          rc, log ? log : "");
    free(log);
    r = e2e_runf("ckpt diff %s %s", e2e_path(shm), e2e_path(mpi));
    CHECK(r.rc == 0 && strstr(r.out, " 0 different"), "%s: shm vs mpi: %s%s", what, r.out, r.err);
    e2e_done(&r);
}

/* PowerSGD's products give the same bits on any thread count (their parallel loops split the
 * outputs, each thread with a scratch of its own): 128-wide layers, so that they run threaded. */
static void threads_same(void) {
    const char *extra = "--set dist.compress=powersgd --set dist.compress_rank=4 "
                        "--set dist.compress_min_elems=0 --set model.hidden=128";
    for (int t = 1; t <= 2; t++) {
        char out[32];
        snprintf(out, sizeof out, "psgd-threads%d", t);
        e2e_result r =
            e2e_runf("train examples/w1.yaml %s --procs 2 %s --set train.threads=%d --out %s",
                     small, extra, t, e2e_path(out));
        CHECK(r.rc == 0, "psgd, %d threads a rank: exit %d: %s", t, r.rc, r.err);
        e2e_done(&r);
    }
    e2e_result r =
        e2e_runf("ckpt diff %s %s", e2e_path("psgd-threads1"), e2e_path("psgd-threads2"));
    CHECK(r.rc == 0 && strstr(r.out, " 0 different"), "psgd, 1 vs 2 threads: %s%s", r.out, r.err);
    e2e_done(&r);
}

static void expect_refused(const char *what, const char *args, const char *frag) {
    e2e_result r = e2e_runf("train examples/w1.yaml %s %s --out %s", small, args, e2e_path("bad"));
    CHECK(r.rc == 2 && strstr(r.err, frag), "%s: exit %d, wanted 2 and '%s' in: %s", what, r.rc,
          frag, r.err);
    e2e_done(&r);
}

int main(void) {
    if (!(bin = e2e_setup("compress", dir, sizeof dir))) return check_summary("e2e/compress");
    kill_resume("topk2", 2, "1", "--set dist.compress=topk --set dist.compress_ratio=0.05");
    kill_resume("topk4", 4, "2",
                "--set dist.compress=topk --set dist.compress_ratio=0.02 "
                "--set dist.compress_values=e5m2 --set dist.compress_warmup_steps=4");
    kill_resume("dgc2", 2, "0",
                "--set dist.compress=topk --set train.optimizer=sgd --set train.lr=0.05 "
                "--set train.momentum=0.9 --set dist.compress_momentum=true "
                "--set dist.compress_clip=1");
    kill_resume("psgd2", 2, "1",
                "--set dist.compress=powersgd --set dist.compress_rank=2 "
                "--set dist.compress_min_elems=0");
    kill_resume("psgd4", 4, "3",
                "--set dist.compress=powersgd --set dist.compress_rank=1 "
                "--set dist.compress_min_elems=100 --set dist.compress_power_iters=2");

    /* the dense start: resumed after it (topk, 3 dense steps) and inside it
     * (PowerSGD, 6), each continuing where the uninterrupted run was */
    kill_resume("dgc2dense", 2, "1",
                "--set dist.compress=topk --set train.optimizer=sgd --set train.lr=0.05 "
                "--set train.momentum=0.9 --set dist.compress_momentum=true "
                "--set dist.compress_ratio=0.05 --set dist.compress_dense_steps=3");
    kill_resume("psgd2dense", 2, "0",
                "--set dist.compress=powersgd --set dist.compress_rank=2 "
                "--set dist.compress_min_elems=0 --set dist.compress_dense_steps=6");

    /* PowerSGD with momentum correction: each rank's velocity is state too,
     * restored with the error */
    kill_resume("psgd2mc", 2, "1",
                "--set dist.compress=powersgd --set dist.compress_rank=2 "
                "--set dist.compress_min_elems=0 --set train.optimizer=sgd --set train.lr=0.05 "
                "--set train.momentum=0.9 --set dist.compress_momentum=true "
                "--set dist.compress_dense_steps=3");

    kill_resume("fp16topk2", 2, "1",
                "--set dist.compress=topk --set dist.compress_ratio=0.05 "
                "--set precision.default=fp16");

    mpi_same("topk", "--set dist.compress=topk --set dist.compress_ratio=0.05");
    mpi_same("psgd", "--set dist.compress=powersgd --set dist.compress_min_elems=0");
    mpi_same("psgd3", "--set dist.compress=powersgd --set dist.compress_min_elems=0 "
                      "--set dist.compress_power_iters=3");
    threads_same();

    /* the exchanged bytes per step in metrics.jsonl */
    char *m = e2e_slurp(e2e_path("topk2-full/metrics.jsonl"), NULL);
    CHECK(m && strstr(m, "\"comm_dense_bytes\":") && strstr(m, "\"comm_sent_bytes\":") &&
              strstr(m, "\"comm_recv_bytes\":") && strstr(m, "\"compress_ratio\":") &&
              strstr(m, "\"residual_norm\":"),
          "metrics.jsonl has the compression figures: %s", m ? m : "(none)");
    free(m);
    m = e2e_slurp(e2e_path("psgd2-full/metrics.jsonl"), NULL);
    CHECK(m && strstr(m, "\"comm_sent_bytes\":"), "powersgd's metrics.jsonl: %s", m ? m : "(none)");
    free(m);
    /* every line is JSON: the dense start (whose residual norm once came
     * out as "-nan") and fp16 loss scaling included */
    const char *const runs[] = {"dgc2dense-full", "psgd2dense-full", "fp16topk2-full"};
    for (int r = 0; r < 3; r++) {
        char path[300];
        snprintf(path, sizeof path, "%s/metrics.jsonl", e2e_path(runs[r]));
        m = e2e_slurp(path, NULL);
        int lines = 0, bad = 0;
        for (char *line = m ? strtok(m, "\n") : NULL; line; line = strtok(NULL, "\n")) {
            json_error_t err;
            json_t *j = json_loads(line, 0, &err);
            lines++;
            if (!j && bad++ == 0) printf("not JSON: %s (%s)\n", line, err.text);
            json_decref(j);
        }
        CHECK(lines > 4 && bad == 0, "%s: %d of %d lines not JSON", path, bad, lines);
        free(m);
    }

    /* TensorBoard gets the figures as scalars */
    e2e_result t = e2e_runf("train examples/w1.yaml %s --procs 2 --set dist.compress=topk "
                            "--set observe.tensorboard=true --out %s",
                            small, e2e_path("tb"));
    CHECK(t.rc == 0, "tensorboard run: exit %d: %s", t.rc, t.err);
    e2e_done(&t);
    char tbdir[256], ev[512] = "";
    snprintf(tbdir, sizeof tbdir, "%s", e2e_path("tb/tb"));
    DIR *dd = opendir(tbdir);
    for (struct dirent *e; dd && (e = readdir(dd));)
        if (!strncmp(e->d_name, "events.out.tfevents.", 20))
            snprintf(ev, sizeof ev, "%s/%s", tbdir, e->d_name);
    if (dd) closedir(dd);
    long evn = 0;
    char *evb = ev[0] ? e2e_slurp(ev, &evn) : NULL;
    CHECK(evb && memmem(evb, (size_t)evn, "compress/sent_bytes", 19) &&
              memmem(evb, (size_t)evn, "compress/residual_norm", 22),
          "the TensorBoard events in %s have compress/ scalars", tbdir);
    free(evb);

    /* tessel bench --compress: both runs, step times and bytes side by side */
    t = e2e_run("bench --workload W1 --procs 2 --compress topk --steps 1 --rounds 1 --warmup 0");
    CHECK(t.rc == 0 && strstr(t.out, "none vs topk ratio 0.001") &&
              strstr(t.out, "round 1: none") && strstr(t.out, "sent bytes: 1/"),
          "bench --compress: exit %d\n%s%s", t.rc, t.out, t.err);
    e2e_done(&t);
    t = e2e_run("bench --workload W1 --procs 2 --compress powersgd --power-iters 2 --steps 1 "
                "--rounds 1 --warmup 0");
    CHECK(t.rc == 0 && strstr(t.out, "powersgd rank 4, 2 power iterations a step") &&
              strstr(t.out, "sent bytes: 1/"),
          "bench --compress powersgd --power-iters 2: exit %d\n%s%s", t.rc, t.out, t.err);
    e2e_done(&t);
    t = e2e_run("bench --workload W1 --procs 2 --compress topk --power-iters 2 --steps 1");
    CHECK(t.rc == 2 && strstr(t.err, "--power-iters"), "bench --power-iters with topk: exit %d: %s",
          t.rc, t.err);
    e2e_done(&t);
    expect_refused("power iterations with topk",
                   "--procs 2 --set dist.compress=topk --set dist.compress_power_iters=2",
                   "dist.compress_power_iters");

    expect_refused("one process", "--set dist.compress=topk", "dist.compress");
    expect_refused("ZeRO", "--procs 2 --set dist.compress=topk --set dist.zero=1", "dist.zero");
    expect_refused("momentum with adamw",
                   "--procs 2 --set dist.compress=topk "
                   "--set dist.compress_momentum=true",
                   "dist.compress_momentum");
    expect_refused("ratio 0", "--procs 2 --set dist.compress=topk --set dist.compress_ratio=0",
                   "dist.compress_ratio");
    expect_refused("dense start without compression", "--procs 2 --set dist.compress_dense_steps=5",
                   "dist.compress_dense_steps");
    /* a checkpoint of 2 processes' residuals resumed on 4 (and of 4 on 2):
     * every rank starts from the mean of the saved rows, with a warning */
    e2e_result r = e2e_runf("train examples/w1.yaml %s --procs 4 --set dist.compress=topk "
                            "--set dist.compress_ratio=0.05 --resume %s/step-00000004 --out %s",
                            small, e2e_path("topk2-full"), e2e_path("four"));
    CHECK(r.rc == 0 &&
              strstr(r.out, "gradient-compression residuals of 2 processes; each of the 4") &&
              strstr(r.out, "done: 8 steps"),
          "resume on 4 of a 2-process run: exit %d: %s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    r = e2e_runf("ckpt inspect %s/step-00000008", e2e_path("four"));
    CHECK(r.rc == 0 && strstr(r.out, "f32[4,"), "the resumed run saves 4 rows: %s%s", r.out, r.err);
    e2e_done(&r);
    r = e2e_runf("train examples/w1.yaml %s --procs 2 --set dist.compress=topk "
                 "--set dist.compress_ratio=0.02 --set dist.compress_values=e5m2 "
                 "--set dist.compress_warmup_steps=4 --resume %s/step-00000006 --out %s",
                 small, e2e_path("topk4-full"), e2e_path("two"));
    CHECK(r.rc == 0 && strstr(r.out, "residuals of 4 processes; each of the 2"),
          "resume on 2 of a 4-process run: exit %d: %s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    e2e_cleanup(dir);
    return check_summary("e2e/compress");
}
