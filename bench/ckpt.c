/* Checkpoint throughput and the stall an asynchronous save adds to a step,
 * for W3-sized state (GPT W3: 23 M parameters, AdamW moments: ~280 MB).
 *
 *     bench_ckpt [--save-only] [--reps N] [--threads N] [RUN_DIR]
 *                               (default /tmp/tessel-bench-ckpt; removed after)
 *
 * Prints: CRC-32C and SHA-256 speed on one core; how checkpoint files are
 * written here (O_DIRECT or page cache, ts_ckpt_io_mode); the disk alone
 * for the same bytes, as `dd` writes them (8 MiB blocks, O_DIRECT and
 * buffered, + fsync); synchronous saves (write + hash + fsync + commit);
 * verify + load, then verify again with the page cache dropped (when this
 * process may); then steps with an asynchronous save begun every other step:
 * the stall begin() adds, the step beside the save against one alone, the
 * background throughput and how much of the save was left when the step
 * ended (the save hashes on idle CPU time until wait() is called). Each
 * is measured N times (--reps, default 5) and a summary line puts the
 * medians side by side with the disk's own median (O_DIRECT or page
 * cache, the better), the load average at the start and the end, and the
 * targets of issue #26.
 *
 * --threads N runs the steps on N OpenMP threads (default: all cores), so
 * a save can be measured beside a step that leaves cores idle.
 *
 * --save-only skips the training steps: the disk alone, then N synchronous
 * saves and N asynchronous saves waited for at once (nothing else running),
 * with medians. Every save fsyncs each file, the directory and LATEST: the
 * figures are durable-write throughput, not page-cache speed. */
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "core/crc32c.h"
#include "tessel/ckpt.h"
#include "tessel/tessel.h"

static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static double now(void) {
    return clock_s(CLOCK_MONOTONIC);
}
/* CPU seconds of the whole process: on a shared machine wall time says
 * more about the neighbours than about the code, CPU time does not. */
static double cpu(void) {
    return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

static int step(ts_plan *p, const ts_gpt_config *c) {
    size_t n = (size_t)(c->batch * c->ctx);
    int64_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
    uint64_t s = (uint64_t)ts_plan_step_count(p) + 1;
    for (size_t i = 0; i < n; i++) {
        tok[i] = (int64_t)((s * 2654435761u + i * 40503u) % (uint64_t)c->vocab);
        tgt[i] = (int64_t)((s * 97u + i * 31u) % (uint64_t)c->vocab);
    }
    int ok = ts_plan_set_input(p, "tokens", tok, n * sizeof *tok) == TS_OK &&
             ts_plan_set_input(p, "targets", tgt, n * sizeof *tgt) == TS_OK &&
             ts_plan_step(p) == TS_OK;
    free(tok);
    free(tgt);
    if (!ok) fprintf(stderr, "step: %s\n", ts_last_error());
    return ok;
}

static void hash_speed(void) {
    size_t n = (size_t)256 << 20;
    unsigned char *b = malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 131);
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    volatile uint32_t crc = ts_crc32c(0, b, n);
    double t1 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    unsigned char md[32];
    unsigned len;
    EVP_Digest(b, n, md, &len, EVP_sha256(), NULL);
    double t2 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    (void)crc;
    printf("one core (per CPU second): CRC-32C %.2f GB/s, SHA-256 %.2f GB/s\n",
           (double)n / (t1 - t0) / 1e9, (double)n / (t2 - t1) / 1e9);
    free(b);
}

/* The disk alone, as `dd` writes it: `bytes` from memory in 8 MiB blocks,
 * with O_DIRECT (dd oflag=direct) and through the page cache, each then
 * fsync'ed, three times each, alternating. Returns the better mode's median
 * durable GB/s: the ceiling a checkpoint writer is held to. */
static double raw_write(const char *run, size_t bytes) {
    char path[600];
    snprintf(path, sizeof path, "%s/raw.bin", run);
    const size_t blk = (size_t)8 << 20;
    size_t n = (bytes + blk - 1) / blk * blk;
    void *mem = NULL;
    if (posix_memalign(&mem, 4096, n) != 0) return 0;
    unsigned char *b = mem;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 2654435761u >> 13);
    double gbs_of[2][3] = {{0}};
    for (int rep = 0; rep < 6; rep++) {
        int direct = rep % 2 == 0;
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
        if (fd < 0) continue;
        double t0 = now();
        size_t done = 0;
        while (done < n) {
            ssize_t w = write(fd, b + done, blk);
            if (w <= 0) break;
            done += (size_t)w;
        }
        int synced = fsync(fd) == 0;
        double t = now() - t0;
        close(fd);
        unlink(path);
        double gbs = (double)done / t / 1e9;
        gbs_of[direct][rep / 2] = synced && done == n ? gbs : 0;
        printf("disk alone (dd-like, %s, 8 MiB blocks, + fsync): %.0f MB in %.3f s = %.2f GB/s\n",
               direct ? "O_DIRECT" : "page cache", (double)done / 1e6, t, gbs);
    }
    free(mem);
    double md = ts_median(gbs_of[1], 3), mb = ts_median(gbs_of[0], 3);
    printf("disk alone, medians of 3: O_DIRECT %.2f GB/s, page cache %.2f GB/s\n", md, mb);
    return md > mb ? md : mb;
}

/* The 1-minute load average, or -1: every figure here is from a machine
 * that may be shared, and this says how busy it was. */
static double load1(void) {
    double l[1];
    return getloadavg(l, 1) == 1 ? l[0] : -1;
}

/* N synchronous saves, then N asynchronous saves each waited for at once. */
static int save_bench(ts_plan *p, const char *run, const char *sk, double bytes, int reps) {
    raw_write(run, (size_t)bytes);
    ts_ckpt_options o = ts_ckpt_options_default();
    o.sign_key = sk;
    o.keep_last = 2;
    const char cfg[] = "model: w3\n";
    ts_ckpt_meta meta = {cfg, sizeof cfg - 1, NULL, 0, 0, 0};
    double wall[100], cpus[100], async[100], stall[100], acpu[100], wcpu[100], wwait[100];
    for (int rep = 0; rep < reps; rep++) {
        double t0 = now(), c0 = cpu();
        if (ts_ckpt_save(p, run, &meta, &o) != TS_OK)
            return fprintf(stderr, "%s\n", ts_last_error()), 1;
        wall[rep] = now() - t0;
        cpus[rep] = cpu() - c0;
        ts_plan_set_step(p, ts_plan_step_count(p) + 1);
    }
    ts_ckpt_saver *sv;
    if (ts_ckpt_saver_new(run, p, &o, &sv) != TS_OK)
        return fprintf(stderr, "%s\n", ts_last_error()), 1;
    for (int rep = 0; rep < reps; rep++) {
        ts_ckpt_save_stats ss;
        double c0 = cpu();
        if (ts_ckpt_saver_begin(sv, p, &meta) != TS_OK || ts_ckpt_saver_wait(sv) != TS_OK)
            return fprintf(stderr, "%s\n", ts_last_error()), 1;
        ts_ckpt_saver_stats(sv, &ss);
        async[rep] = ss.write_s;
        stall[rep] = ss.stall_s;
        acpu[rep] = cpu() - c0;
        wcpu[rep] = ss.cpu_s;
        wwait[rep] = ss.cpu_wait_s;
        ts_plan_set_step(p, ts_plan_step_count(p) + 1);
    }
    ts_ckpt_saver_free(sv);
    double w = ts_median(wall, reps), c = ts_median(cpus, reps), a = ts_median(async, reps);
    printf("sync save, median of %d: %.3f s wall = %.2f GB/s; %.3f CPU s (%.2f core-s per GB)\n",
           reps, w, bytes / w / 1e9, c, c / (bytes / 1e9));
    double ac = ts_median(acpu, reps);
    printf("async save alone, median of %d: stall %.1f ms, background write %.3f s = %.2f GB/s; "
           "%.3f CPU s with the snapshot (%.2f core-s per GB)\n",
           reps, ts_median(stall, reps) * 1e3, a, bytes / a / 1e9, ac, ac / (bytes / 1e9));
    printf("  its shard writers: %.3f s on a CPU, %.3f s waiting for one (summed over threads; "
           "a large wait means other work held the cores)\n",
           ts_median(wcpu, reps), ts_median(wwait, reps));
    return 0;
}

int main(int argc, char **argv) {
    int save_only = 0, reps = 5, threads = 0;
    while (argc > 1 && !strncmp(argv[1], "--", 2)) {
        if (!strcmp(argv[1], "--save-only")) {
            save_only = 1;
        } else if (!strcmp(argv[1], "--reps") && argc > 2) {
            reps = atoi(argv[2]);
            argv++, argc--;
        } else if (!strcmp(argv[1], "--threads") && argc > 2) {
            threads = atoi(argv[2]);
            argv++, argc--;
        } else {
            fprintf(stderr, "usage: bench_ckpt [--save-only] [--reps N] [--threads N] [RUN_DIR]\n");
            return 2;
        }
        argv++, argc--;
    }
    if (reps < 1 || reps > 100) reps = 5;
    const char *run = argc > 1 ? argv[1] : "/tmp/tessel-bench-ckpt";
    char cmd[600], sk[400], pk[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", run, run);
    if (system(cmd) != 0) return 1;
    snprintf(sk, sizeof sk, "%s/bench.key", run);
    snprintf(pk, sizeof pk, "%s/bench.pub", run);
    hash_speed();

    ts_gpt_config c = ts_gpt_w3();
    ts_graph *g = ts_graph_new();
    ts_model m;
    ts_plan *p = NULL;
    if (ts_build_gpt(g, &c, &m) != TS_OK) return fprintf(stderr, "%s\n", ts_last_error()), 1;
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_adamw(3e-4, 0.9, 0.95, 1e-8, 0.1);
    ts_compile_options co = ts_compile_options_default();
    co.threads = threads > 0 ? threads : 0;
    if (ts_compile(g, &spec, &co, &p) != TS_OK) return fprintf(stderr, "%s\n", ts_last_error()), 1;
    ts_plan_stats st;
    ts_plan_get_stats(p, &st);
    printf("W3: params %.1f MB, optimizer state %.1f MB, %d persistent tensors\n",
           (double)st.param_bytes / 1e6, (double)st.state_bytes / 1e6, ts_plan_persistent_count(p));
    if (ts_ckpt_keygen(sk, pk) != TS_OK) return fprintf(stderr, "%s\n", ts_last_error()), 1;
    if (save_only) {
        int rc = save_bench(p, run, sk, (double)(st.param_bytes + st.state_bytes), reps);
        ts_plan_free(p);
        ts_graph_free(g);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", run);
        return rc || system(cmd) != 0;
    }

    const double load_start = load1();
    const char *io = "?", *io_src = "?";
    if (ts_ckpt_io_mode(run, &io, &io_src) != TS_OK) fprintf(stderr, "%s\n", ts_last_error());
    printf("checkpoint files written %s (%s)\n", io, io_src);
    double disk = raw_write(run, (size_t)(st.param_bytes + st.state_bytes));
    double t0 = now();
    int ok = step(p, &c) && step(p, &c);
    double t_step = (now() - t0) / 2;
    if (!ok) return 1;

    ts_ckpt_options o = ts_ckpt_options_default();
    o.sign_key = sk;
    o.keep_last = 2;
    const char cfg[] = "model: w3\n";
    ts_ckpt_meta meta = {cfg, sizeof cfg - 1, NULL, 0, 0, 0};
    double bytes = (double)(st.param_bytes + st.state_bytes), sync_gbs[100];
    for (int rep = 0; rep < reps; rep++) {
        t0 = now();
        double c0 = cpu();
        if (ts_ckpt_save(p, run, &meta, &o) != TS_OK)
            return fprintf(stderr, "%s\n", ts_last_error()), 1;
        double dt = now() - t0, dc = cpu() - c0;
        sync_gbs[rep] = bytes / dt;
        printf("sync save (snapshot + write + hash + fsync + commit): %.3f s wall = %.2f GB/s; "
               "%.3f CPU s = %.2f GB/s per busy core\n",
               dt, bytes / dt / 1e9, dc, bytes / dc / 1e9);
        ts_plan_set_step(p, ts_plan_step_count(p) + 1);
    }
    const double sync_med = ts_median(sync_gbs, reps); /* bytes/s */
    /* Verification of the newest checkpoint, its files in the page cache
     * (or not, with O_DIRECT writes): the median of `reps`. */
    double verify_s[100], verify_c[100];
    ts_ckpt *ck;
    for (int rep = 0; rep < reps; rep++) {
        t0 = now();
        double c0 = cpu();
        if (ts_ckpt_open(run, pk, NULL, &ck) != TS_OK)
            return fprintf(stderr, "%s\n", ts_last_error()), 1;
        verify_s[rep] = now() - t0, verify_c[rep] = cpu() - c0;
        ts_ckpt_close(ck);
    }
    const double t_verify = ts_median(verify_s, reps), c_verify = ts_median(verify_c, reps);
    /* Verification reads the files back: from the device, not from the
     * page cache the buffered mode would leave them in. */
    sync();
    int dc = open("/proc/sys/vm/drop_caches", O_WRONLY);
    int dropped = dc >= 0 && write(dc, "1", 1) == 1;
    if (dc >= 0) close(dc);
    t0 = now();
    if (ts_ckpt_open(run, pk, NULL, &ck) != TS_OK)
        return fprintf(stderr, "%s\n", ts_last_error()), 1;
    double t_cold = now() - t0;
    ts_plan_set_step(p, 0);
    t0 = now();
    ts_status s = ts_ckpt_restore(ck, p, NULL);
    double t_restore = now() - t0;
    ts_ckpt_close(ck);
    if (s != TS_OK) return fprintf(stderr, "%s\n", ts_last_error()), 1;
    printf("verify (signature, SHA-256, CRC-32C), median of %d: %.3f s wall = %.2f GB/s; %.3f CPU "
           "s = %.2f "
           "GB/s per busy core; %s: %.3f s = %.2f GB/s; restore into plan %.3f s\n",
           reps, t_verify, bytes / t_verify / 1e9, c_verify, bytes / c_verify / 1e9,
           dropped ? "from the device (page cache dropped)" : "again (page cache not dropped)",
           t_cold, bytes / t_cold / 1e9, t_restore);

    ts_ckpt_saver *sv;
    if (ts_ckpt_saver_new(run, p, &o, &sv) != TS_OK)
        return fprintf(stderr, "%s\n", ts_last_error()), 1;
    /* Interleaved A/B on the same machine state: even rounds begin a save
     * and run a step while it is written, odd rounds run a step alone. */
    double stall_sum = 0, with_sum = 0, alone_sum = 0, write_sum = 0;
    double with_s[100], alone_s[100], write_s[100], tail_s[100];
    int rounds = 2 * reps;
    for (int i = 0; i < rounds && ok; i++) {
        ts_ckpt_save_stats ss;
        if (i % 2 == 0) {
            if (ts_ckpt_saver_begin(sv, p, &meta) != TS_OK) ok = 0;
            ts_ckpt_saver_stats(sv, &ss);
            stall_sum += ss.stall_s;
        }
        t0 = now();
        ok = ok && step(p, &c);
        double dt = now() - t0;
        if (i % 2 == 0) {
            with_sum += dt;
            with_s[i / 2] = dt;
            /* what was left of the save when the step ended: wait() has
             * the saver finish it at full speed */
            t0 = now();
            if (ts_ckpt_saver_wait(sv) != TS_OK) ok = 0;
            tail_s[i / 2] = now() - t0;
            ts_ckpt_saver_stats(sv, &ss);
            write_sum += ss.write_s;
            write_s[i / 2] = ss.write_s;
            printf("async save at step %lld: stall %.1f ms (snapshot %.1f ms), step beside it "
                   "%.3f s, save took %.3f s, of which %.3f s after the step (wait)\n",
                   (long long)ss.step, ss.stall_s * 1e3, ss.snapshot_s * 1e3, dt, ss.write_s,
                   tail_s[i / 2]);
        } else {
            alone_sum += dt;
            alone_s[i / 2] = dt;
        }
    }
    if (!ok) return fprintf(stderr, "%s\n", ts_last_error()), 1;
    ts_ckpt_saver_free(sv);
    int n = rounds / 2;
    double stall = stall_sum / n, alone = alone_sum / n;
    printf("W3 step (%d threads, 0: all; %ld cores) %.3f s alone, %.3f s beside a background "
           "save (first steps: %.3f s)\n",
           threads, sysconf(_SC_NPROCESSORS_ONLN), alone, with_sum / n, t_step);
    printf("async: stall %.1f ms per save = %.2f %% of a step; background save %.3f s = %.2f "
           "GB/s; median %.3f s of it after the step\n",
           stall * 1e3, 100 * stall / alone, write_sum / n, bytes / (write_sum / n) / 1e9,
           ts_median(tail_s, n));
    /* Medians: of the background saves' times, and of each pair's ratio
     * (a step beside a save against the step after it, alone). */
    double ratio[100];
    for (int i = 0; i < n; i++) ratio[i] = with_s[i] / alone_s[i];
    double bg = bytes / ts_median(write_s, n) / 1e9, slow = 100 * (ts_median(ratio, n) - 1);
    printf("\nsummary, medians (GB/s, %s writes; load average %.1f at the start, %.1f at the "
           "end): disk alone %.2f | sync save %.2f (%.2fx disk) | background %.2f (%.2fx disk; "
           "step %+.1f %%) | verify %.2f (%.2fx disk), from the device %.2f\n",
           io, load_start, load1(), disk, sync_med / 1e9, sync_med / 1e9 / disk, bg, bg / disk,
           slow, bytes / t_verify / 1e9, bytes / t_verify / 1e9 / disk, bytes / t_cold / 1e9);
    printf("targets: sync >= 1 %s; background >= 0.8 where the disk does >= 1.5 %s; "
           "step slowed <= 5 %% %s; verify >= 1.5 %s\n",
           sync_med >= 1e9 ? "met" : "NOT met",
           disk < 1.5  ? "(disk below 1.5)"
           : bg >= 0.8 ? "met"
                       : "NOT met",
           slow <= 5 ? "met" : "NOT met", bytes / t_verify / 1e9 >= 1.5 ? "met" : "NOT met");
    ts_plan_free(p);
    ts_graph_free(g);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", run);
    return system(cmd) == 0 ? 0 : 1;
}
