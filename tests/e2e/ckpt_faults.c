/* Checkpoint fault tests against real processes.
 *
 * Kill -9: a child process (this program run with --child) trains a small
 * GPT with dropout, resuming from LATEST when there is one, and saves a
 * signed checkpoint every 2 steps in the background. The parent SIGKILLs
 * it at a random moment, then checks that LATEST verifies, that the audit
 * log's chain holds, and that resuming from LATEST in a fresh plan and
 * training to the end reproduces the uninterrupted run's parameters and
 * optimizer state byte for byte; then it starts the next child, which
 * resumes from there. When a child reaches the last step, its final
 * checkpoint must equal the uninterrupted run too, and a new run begins.
 *
 * Damage: one flipped byte in a shard, a truncated manifest, and an
 * edited, a deleted and a reordered audit line are each detected and
 * named. */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "tessel/ckpt.h"

#define LAST_STEP     40
#define SAVE_EVERY    2
#define KILLS         30
#define TIME_BUDGET_S 40.0

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static ts_plan *compile_gpt(void) {
    ts_gpt_config gc = {2, 16, 64, 32, 2, 2, 0.1};
    ts_graph *g = ts_graph_new();
    ts_model m;
    ts_plan *p = NULL;
    if (ts_build_gpt(g, &gc, &m) == TS_OK) {
        ts_train_spec spec = ts_train_spec_default(m.loss);
        spec.opt = ts_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01);
        spec.clip_grad_norm = 1.0;
        spec.schedule.kind = TS_LR_COSINE;
        spec.schedule.warmup_steps = 5;
        spec.schedule.total_steps = LAST_STEP;
        ts_compile_options opt = ts_compile_options_default();
        opt.seed = 7;
        /* One thread: the test's cost is process start, fsync and tiny
         * kernels, and a busy machine makes OpenMP threads wait on each
         * other (results are the same for any thread count). */
        opt.threads = 1;
        if (ts_compile(g, &spec, &opt, &p) != TS_OK) p = NULL;
    }
    ts_graph_free(g);
    return p;
}

/* The batch of step s depends on s only. */
static ts_status run_to(ts_plan *p, int64_t last) {
    int64_t tok[32], tgt[32];
    while (ts_plan_step_count(p) < last) {
        uint64_t s = (uint64_t)ts_plan_step_count(p) + 1;
        for (int i = 0; i < 32; i++) {
            tok[i] = (int64_t)((s * 2654435761u + (uint64_t)i * 40503u) >> 7) % 64;
            tgt[i] = (int64_t)((s * 97u + (uint64_t)i * 31u) % 64);
        }
        ts_plan_set_input(p, "tokens", tok, sizeof tok);
        ts_plan_set_input(p, "targets", tgt, sizeof tgt);
        ts_status st = ts_plan_step(p);
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

/* ---- the child ------------------------------------------------------------------ */

static int child(const char *run, const char *sk, const char *pk) {
    ts_plan *p = compile_gpt();
    if (!p) return 10;
    ts_audit *a = NULL;
    ts_status s = ts_audit_open(run, sk, &a);
    char latest[512];
    if (s == TS_OK && ts_ckpt_resolve(run, latest, sizeof latest) == TS_OK) {
        s = ts_ckpt_load(p, run, pk, a);
        if (s == TS_OK) s = ts_audit_append(a, "resume", NULL);
    }
    ts_ckpt_options o = ts_ckpt_options_default();
    o.sign_key = sk;
    o.keep_last = 3;
    o.audit = a;
    ts_ckpt_saver *sv = NULL;
    if (s == TS_OK) s = ts_ckpt_saver_new(run, p, &o, &sv);
    while (s == TS_OK && ts_plan_step_count(p) < LAST_STEP) {
        s = run_to(p, ts_plan_step_count(p) + 1);
        int64_t step = ts_plan_step_count(p);
        ts_ckpt_meta meta = {"cfg", 3, NULL, 0, step * 2, 0};
        if (s == TS_OK && step % SAVE_EVERY == 0) s = ts_ckpt_saver_begin(sv, p, &meta);
    }
    if (s == TS_OK) s = ts_ckpt_saver_wait(sv);
    ts_ckpt_saver_free(sv);
    if (s == TS_OK)
        s = ts_audit_close(a);
    else
        ts_audit_close(a);
    ts_plan_free(p);
    if (s != TS_OK) fprintf(stderr, "child: %s\n", ts_last_error());
    return s == TS_OK ? 0 : 11;
}

/* ---- the parent ------------------------------------------------------------------ */

static char root[256], run[300], sk[300], pk[300];
static unsigned char *ref;
static size_t ref_bytes;

static void rm_rf(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

static pid_t spawn(char *self) {
    char *args[] = {self, "--child", run, sk, pk, NULL};
    pid_t pid = fork();
    if (pid == 0) {
        execv("/proc/self/exe", args);
        _exit(127);
    }
    return pid;
}

/* Resume from `path` in a fresh plan, train to the end, compare. */
static int resume_matches(const char *path) {
    ts_plan *p = compile_gpt();
    int ok = p && ts_ckpt_load(p, path, pk, NULL) == TS_OK && run_to(p, LAST_STEP) == TS_OK;
    if (!ok) fprintf(stderr, "resume from %s: %s\n", path, ts_last_error());
    if (ok) {
        unsigned char *got = malloc(ref_bytes);
        ok = ts_plan_snapshot(p, got, ref_bytes) == TS_OK && !memcmp(got, ref, ref_bytes);
        free(got);
    }
    ts_plan_free(p);
    return ok;
}

static int has_tmp(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "ls -d '%s'/*.tmp >/dev/null 2>&1", run);
    return system(cmd) == 0;
}

static void kill_test(char *self) {
    /* One uninterrupted child measures how long a run takes. */
    double t0 = now();
    pid_t pid = spawn(self);
    int status = 0;
    waitpid(pid, &status, 0);
    double full = now() - t0;
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "uninterrupted child failed (%d)", status);
    CHECK(resume_matches(run), "uninterrupted child's final checkpoint differs from in-process");
    rm_rf(run);

    unsigned seed = (unsigned)time(NULL);
    fprintf(stderr, "ckpt_faults: random seed %u, one run %.2f s\n", seed, full);
    int kills = 0, verified = 0, resumed = 0, mid_save = 0, no_ckpt = 0, completed = 0;
    double start = now();
    while (kills < KILLS && now() - start < TIME_BUDGET_S) {
        double t_spawn = now();
        pid = spawn(self);
        useconds_t delay = (useconds_t)((double)rand_r(&seed) / RAND_MAX * full * 1e6);
        usleep(delay);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
            kills++;
        } else {
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed: status %d", status);
            /* It finished first: aim earlier, as the machine's load changes. */
            full = 0.7 * full + 0.3 * (now() - t_spawn) * 0.8;
        }
        mid_save += has_tmp();
        char latest[512];
        if (ts_ckpt_resolve(run, latest, sizeof latest) != TS_OK) {
            no_ckpt++; /* killed before the first commit */
            continue;
        }
        ts_ckpt *c = NULL;
        ts_status s = ts_ckpt_open(run, pk, NULL, &c);
        CHECK(s == TS_OK, "LATEST does not verify after a kill: %s", ts_last_error());
        int64_t step = -1;
        if (c) {
            ts_ckpt_info in;
            ts_ckpt_get_info(c, &in);
            step = in.step;
            ts_ckpt_close(c);
            verified++;
        }
        ts_audit_report r;
        CHECK_OK(ts_audit_verify(run, pk, &r));
        if (step >= 0) {
            CHECK(resume_matches(run), "resume from step %lld differs", (long long)step);
            resumed++;
        }
        if (step == LAST_STEP) {
            completed++;
            rm_rf(run);
        }
    }
    fprintf(stderr,
            "ckpt_faults: %d SIGKILLs (%d during a save, %d before any commit), LATEST verified "
            "%d times, %d resumes byte-identical, %d runs completed, %.1f s\n",
            kills, mid_save, no_ckpt, verified, resumed, completed, now() - start);
    /* 30 kills on an idle machine; a heavily loaded one (parallel builds)
     * runs out of time budget earlier, and then fewer must do. Each kill that
     * landed was fully checked above either way. */
    const int budget_out = now() - start >= TIME_BUDGET_S;
    CHECK(kills >= 10 || (budget_out && kills >= 3), "only %d kills landed in the time budget",
          kills);
    if (budget_out && kills < 10)
        fprintf(stderr, "ckpt_faults: the machine is loaded: %d kills in %.0f s\n", kills,
                TIME_BUDGET_S);
}

/* ---- damage ------------------------------------------------------------------------ */

static void flip_byte(const char *path, long from_end) {
    int fd = open(path, O_RDWR);
    off_t off = lseek(fd, 0, SEEK_END) - from_end;
    unsigned char b = 0;
    CHECK(pread(fd, &b, 1, off) == 1, "read %s", path);
    b ^= 0x80;
    CHECK(pwrite(fd, &b, 1, off) == 1, "write %s", path);
    close(fd);
}

static void shell(const char *fmt, const char *a) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, fmt, a);
    CHECK(system(cmd) == 0, "%s", cmd);
}

static void copy_tree(const char *from, const char *to) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    CHECK(system(cmd) == 0, "%s", cmd);
}

static void damage_test(char *self) {
    rm_rf(run);
    pid_t pid = spawn(self);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child run failed");
    char latest[512], f[700], copy[400];
    CHECK_OK(ts_ckpt_resolve(run, latest, sizeof latest));
    snprintf(copy, sizeof copy, "%s/copy", root);

    copy_tree(latest, copy);
    snprintf(f, sizeof f, "%s/params-r0-000.safetensors", copy);
    flip_byte(f, 1);
    ts_ckpt *c = NULL;
    CHECK(ts_ckpt_open(copy, pk, NULL, &c) == TS_ERR_FORMAT, "flipped byte detected");
    CHECK(strstr(ts_last_error(), "params-r0-000.safetensors") &&
              strstr(ts_last_error(), "tensor '"),
          "flip named: %s", ts_last_error());

    copy_tree(latest, copy);
    snprintf(f, sizeof f, "%s/manifest.json", copy);
    CHECK(truncate(f, 100) == 0, "truncate");
    CHECK(ts_ckpt_open(copy, pk, NULL, &c) == TS_ERR_FORMAT, "truncated manifest detected");
    CHECK(strstr(ts_last_error(), "manifest.json"), "truncation named: %s", ts_last_error());

    /* audit log: edit line 3, delete line 2, swap lines 2 and 3 */
    const char *edits[3] = {"sed -i '3s/\"time\":\"2/\"time\":\"1/' '%s/audit.log'",
                            "sed -i '2d' '%s/audit.log'", "sed -i '2{h;d};3G' '%s/audit.log'"};
    /* line 3 is the signed head after the first save (line 1 its commit
     * entry, line 2 its save entry): its signature fails */
    const char *names[3] = {"line 3: the head signature", "deleted", "reordered"};
    for (int i = 0; i < 3; i++) {
        copy_tree(run, copy);
        shell(edits[i], copy);
        CHECK(ts_audit_verify(copy, pk, NULL) == TS_ERR_FORMAT, "audit %s detected", names[i]);
        CHECK(strstr(ts_last_error(), names[i]) != NULL, "audit: %s", ts_last_error());
    }
    CHECK_OK(ts_audit_verify(run, pk, NULL));
    rm_rf(copy);
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--child")) return child(argv[2], argv[3], argv[4]);
    snprintf(root, sizeof root, "/tmp/tessel-ckpt-faults-%d", (int)getpid());
    snprintf(run, sizeof run, "%s/run", root);
    snprintf(sk, sizeof sk, "%s/k.key", root);
    snprintf(pk, sizeof pk, "%s/k.pub", root);
    rm_rf(root);
    mkdir(root, 0755);
    CHECK_OK(ts_ckpt_keygen(sk, pk));

    ts_plan *p = compile_gpt();
    CHECK(p != NULL, "compile: %s", ts_last_error());
    if (!p) return check_summary("ckpt_faults");
    CHECK_OK(run_to(p, LAST_STEP));
    ref_bytes = ts_plan_snapshot_bytes(p);
    ref = malloc(ref_bytes);
    CHECK_OK(ts_plan_snapshot(p, ref, ref_bytes));
    ts_plan_free(p);

    kill_test(argv[0]);
    damage_test(argv[0]);
    free(ref);
    if (check_failed == 0) rm_rf(root);
    return check_summary("ckpt_faults");
}
