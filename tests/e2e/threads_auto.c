/* Threads per process (docs/config.md, "Derived defaults"): with train.threads 0, `tessel train
 * --procs 2` runs each process on the CPUs it may use divided by the 2 processes (at least 1),
 * logs the choice once and records it in summary.json; OMP_NUM_THREADS and an explicit
 * train.threads decide instead; one process keeps all its CPUs and logs nothing. Whatever the
 * count, the final checkpoint is the same bytes (`tessel ckpt diff`): the thread count never
 * changes the bits. The expected counts come from this process's own affinity mask, which the
 * runs inherit; one run is made with the mask cut to one CPU (the floor of 1 thread). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

static const char *small = "examples/w1.yaml --set model.batch=16 --set model.hidden=32 --set "
                           "model.window=4 --set model.features=4 --steps 4 --set "
                           "train.eval_every=0 --set alerts.defaults=false --set ckpt.every=4";

/* Trains run RUN with `extra` and returns its stdout (free it), NULL on failure. */
static char *train(const char *run, const char *extra) {
    e2e_result r = e2e_runf("train %s %s --out %s/%s", small, extra, dir, run);
    CHECK(r.rc == 0, "%s: exit %d: %s", run, r.rc, r.err);
    char *out = r.rc == 0 ? strdup(r.out) : NULL;
    e2e_done(&r);
    return out;
}

/* summary.json's threads_per_process of RUN; -1 when absent. */
static int summary_threads(const char *run) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s/summary.json", dir, run);
    char *s = e2e_slurp(path, NULL);
    const char *p = strstr(s, "\"threads_per_process\":");
    int v = -1;
    if (p) sscanf(p + strlen("\"threads_per_process\":"), " %d", &v);
    free(s);
    return v;
}

/* RUN's final checkpoint holds the bytes of REF's. */
static void same_bits(const char *ref, const char *run) {
    e2e_result r =
        e2e_runf("ckpt diff %s/%s/step-00000004 %s/%s/step-00000004", dir, ref, dir, run);
    CHECK(r.rc == 0 && strstr(r.out, " identical, 0 different"), "%s = %s bit for bit:\n%s%s", run,
          ref, r.out, r.err);
    e2e_done(&r);
}

/* RUN logged `line` once and recorded `want` threads in its summary. */
static void check_run(const char *run, const char *log, const char *line, int want) {
    const char *p = log ? strstr(log, line) : NULL;
    CHECK(p != NULL, "%s logs '%s':\n%s", run, line, log ? log : "");
    CHECK(!p || !strstr(p + 1, "threads per process:"), "%s logs the choice once", run);
    CHECK(summary_threads(run) == want, "%s: summary.json threads_per_process %d, want %d", run,
          summary_threads(run), want);
}

/* OMP_NUM_THREADS set on one rank only (mpirun's MPMD form gives each rank its own
 * environment): both ranks still meet in the affinity exchange, so the run finishes (a rank
 * leaving that collective early would leave the other waiting until the comm timeout) with
 * the same bits. Skipped without mpirun. Open MPI's components leak at MPI_Finalize (see
 * e2e/dist_mpi), so under ASan the ranks run without leak checking. */
static void mixed_env(const char *bin) {
    char mpirun[600], cmd[4096];
    if (!e2e_find_mpirun(mpirun, sizeof mpirun)) {
        printf("threads_auto: mixed OMP_NUM_THREADS case skipped: no mpirun on PATH\n");
        return;
    }
    const char *root = geteuid() == 0 ? "--allow-run-as-root " : "";
    snprintf(cmd, sizeof cmd,
             "ASAN_OPTIONS=detect_leaks=0 timeout 120 '%s' %s--oversubscribe -x OMP_NUM_THREADS=2 "
             "-np 1 '%s' train %s "
             "--set dist.algo=native --out %s/mixed : -np 1 '%s' train %s --set dist.algo=native "
             "--out %s/mixed >%s/mixed.log 2>&1",
             mpirun, root, bin, small, dir, bin, small, dir, dir);
    int rc = system(cmd);
    char path[128];
    snprintf(path, sizeof path, "%s/mixed.log", dir);
    char *log = e2e_slurp(path, NULL);
    CHECK(rc == 0, "mixed OMP_NUM_THREADS under mpirun: status %d\n%s", rc, log);
    free(log);
    if (rc == 0) same_bits("auto", "mixed");
}

int main(void) {
    const char *bin = e2e_setup("threads_auto", dir, sizeof dir);
    if (!bin) return check_summary("e2e/threads_auto");
    unsetenv("OMP_NUM_THREADS"); /* the runs inherit this environment */
    cpu_set_t all;
    CPU_ZERO(&all);
    CHECK(sched_getaffinity(0, sizeof all, &all) == 0, "this process's CPU affinity");
    const int cpus = CPU_COUNT(&all) > 0 ? CPU_COUNT(&all) : 1;
    const int half = cpus / 2 > 0 ? cpus / 2 : 1;
    char line[128];

    /* auto on 2 processes: the CPUs shared by both */
    char *log = train("auto", "--procs 2");
    snprintf(line, sizeof line, "threads per process: %d (%d core%s, 2 processes on this host)\n",
             half, cpus, cpus == 1 ? "" : "s");
    if (log) check_run("auto", log, line, half);
    free(log);

    /* explicit counts, one of them more than the CPUs: as given, the same bits */
    static const int counts[] = {1, 3};
    for (int i = 0; i < 2; i++) {
        char run[32], extra[64];
        snprintf(run, sizeof run, "t%d", counts[i]);
        snprintf(extra, sizeof extra, "--procs 2 --set train.threads=%d", counts[i]);
        if (!(log = train(run, extra))) continue;
        snprintf(line, sizeof line, "threads per process: %d (train.threads)\n", counts[i]);
        check_run(run, log, line, counts[i]);
        free(log);
        same_bits("auto", run);
    }

    /* OMP_NUM_THREADS set: OpenMP follows it */
    setenv("OMP_NUM_THREADS", "3", 1);
    if ((log = train("omp", "--procs 2"))) {
        check_run("omp", log, "threads per process: 3 (OMP_NUM_THREADS=3)\n", 3);
        free(log);
        same_bits("auto", "omp");
    }
    unsetenv("OMP_NUM_THREADS");

    mixed_env(bin);

    /* one CPU for both processes: at least one thread each */
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &one);
            break;
        }
    CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "cut this process to one CPU");
    log = train("onecpu", "--procs 2");
    CHECK(sched_setaffinity(0, sizeof all, &all) == 0, "restore this process's CPUs");
    if (log) {
        check_run("onecpu", log, "threads per process: 1 (1 core, 2 processes on this host)\n", 1);
        free(log);
        same_bits("auto", "onecpu");
    }

    /* one process: all of its CPUs, nothing logged */
    if ((log = train("p1", ""))) {
        CHECK(!strstr(log, "threads per process:"), "one process logs no choice:\n%s", log);
        CHECK(summary_threads("p1") == cpus, "p1: summary.json threads_per_process %d, want %d",
              summary_threads("p1"), cpus);
        free(log);
    }
    e2e_cleanup(dir);
    return check_summary("e2e/threads_auto");
}
