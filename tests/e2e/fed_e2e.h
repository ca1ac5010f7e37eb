/* fed_e2e.h — what the federated e2e tests share (tests/e2e/fed_*.c): the
 * five processes of a run (aggregator, key holder, three sites), each
 * optionally run under a prefix (`ip netns exec NS` puts it on another
 * "host"), and the check that each round's global model is a plaintext
 * FedAvg of the sites' local models. Static inline functions: a test
 * includes it once and uses what it needs. */
#ifndef TS_TEST_FED_E2E_H
#define TS_TEST_FED_E2E_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"
#include "tessel/tessel.h"

/* The five roles, their certificate names, in launch order. */
static const char *const fed_roles[5] = {"aggregator", "keyholder", "site1", "site2", "site3"};

/* Runs `text` as a shell script from DIR/run.sh (e2e_sh takes 1 KiB). */
static inline void fed_sh_script(const char *dir, const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/run.sh", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
    e2e_sh("sh %s", path);
}

/* Launches the five roles on DIR/fed.yaml and waits for all of them. Role i
 * runs under prefix[i] ("" for none) with `--set` arguments site_sets[i]
 * (a client's data, say), in DIR/<role> (the key holder in DIR/kh) with its
 * log in DIR/<role>.log and exit status in DIR/<role>.rc; every process is
 * bounded by `timeout -s KILL limit_s`. Checks that every one exited 0. */
static inline void fed_launch(const char *bin, const char *dir, const char *const prefix[5],
                              const char *const sets[5], int limit_s) {
    static char cmd[16384];
    int k = snprintf(cmd, sizeof cmd, "cd %s\n", dir);
    for (int i = 0; i < 5; i++) {
        const char *out = i == 1 ? "kh" : fed_roles[i], *verb = i == 0   ? "serve"
                                                                : i == 1 ? "keyholder"
                                                                         : "join";
        k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                      "{ %s timeout -s KILL %d %s fed %s fed.yaml --set fed.tls.cert=ca/%s.pem "
                      "--set fed.tls.key=ca/%s.key %s --out %s >%s.log 2>&1; echo $? >%s.rc; } &\n",
                      prefix[i], limit_s, bin, verb, fed_roles[i], fed_roles[i], sets[i], out,
                      fed_roles[i], fed_roles[i]);
        if (i == 0) /* the others start once the aggregator listens (at most 120 s) */
            k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                          "i=0; until grep -qs 'listening on' aggregator.log || [ $i -ge 1200 ]; "
                          "do sleep 0.1; i=$((i+1)); done\n");
    }
    snprintf(cmd + k, sizeof cmd - (size_t)k, "wait\n");
    fed_sh_script(dir, cmd);
    for (int i = 0; i < 5; i++) {
        char rc[600], log[600];
        snprintf(rc, sizeof rc, "%s/%s.rc", dir, fed_roles[i]);
        snprintf(log, sizeof log, "%s/%s.log", dir, fed_roles[i]);
        char *r = e2e_slurp(rc, NULL), *l = e2e_slurp(log, NULL);
        CHECK(r[0] && atoi(r) == 0, "%s exited %s: %s", fed_roles[i], r, l);
        free(r);
        free(l);
    }
}

/* Each round's global model (DIR/kh/step-R) against a plaintext FedAvg of
 * the sites' local models of that round (DIR/siteN/round-R), weighted by
 * their training examples rows[]: equal within the fixed-point bound
 * (3 updates · 0.5 / scale) plus float rounding. Returns the largest
 * difference. */
static inline double fed_check_fedavg(const char *dir, int rounds, const double rows[3],
                                      double scale) {
    double total = rows[0] + rows[1] + rows[2], worst = 0;
    int64_t compared = 0;
    for (int r = 1; r <= rounds; r++) {
        char path[600];
        ts_ckpt *prev = NULL, *glob = NULL, *loc[3] = {NULL, NULL, NULL};
        snprintf(path, sizeof path, "%s/kh/step-%08d", dir, r - 1);
        CHECK_OK(ts_ckpt_open(path, NULL, NULL, &prev));
        snprintf(path, sizeof path, "%s/kh/step-%08d", dir, r);
        CHECK_OK(ts_ckpt_open(path, NULL, NULL, &glob));
        for (int i = 0; i < 3; i++) {
            snprintf(path, sizeof path, "%s/site%d/round-%03d", dir, i + 1, r);
            CHECK_OK(ts_ckpt_open(path, NULL, NULL, &loc[i]));
        }
        for (int t = 0;
             glob && prev && loc[0] && loc[1] && loc[2] && t < ts_ckpt_tensor_count(glob); t++) {
            ts_ckpt_tensor ti;
            if (ts_ckpt_tensor_info(glob, t, &ti) != TS_OK || ti.is_state) continue;
            size_t n = ti.bytes / 4;
            float *g0 = malloc(ti.bytes), *g1 = malloc(ti.bytes), *l[3];
            for (int i = 0; i < 3; i++) l[i] = malloc(ti.bytes);
            CHECK_OK(ts_ckpt_read(prev, ti.name, g0, ti.bytes));
            CHECK_OK(ts_ckpt_read(glob, ti.name, g1, ti.bytes));
            for (int i = 0; i < 3; i++) CHECK_OK(ts_ckpt_read(loc[i], ti.name, l[i], ti.bytes));
            for (size_t j = 0; j < n; j++) {
                double want = g0[j];
                for (int i = 0; i < 3; i++) want += rows[i] / total * (double)(l[i][j] - g0[j]);
                double err = fabs((double)g1[j] - want),
                       tol = 1.5 / scale + 0x1p-23 * (fabs(want) + 1);
                if (err > worst) worst = err;
                if (err > tol) {
                    CHECK(0, "round %d %s[%zu]: global %.9g, plaintext FedAvg %.9g", r, ti.name, j,
                          g1[j], want);
                    break;
                }
                compared++;
            }
            free(g0);
            free(g1);
            for (int i = 0; i < 3; i++) free(l[i]);
        }
        ts_ckpt_close(prev);
        ts_ckpt_close(glob);
        for (int i = 0; i < 3; i++) ts_ckpt_close(loc[i]);
    }
    CHECK(compared > 3 * 1000, "compared only %lld values", (long long)compared);
    printf("%lld parameter values over %d rounds equal plaintext FedAvg, largest difference "
           "%.3g (bound %.3g)\n",
           (long long)compared, rounds, worst, 1.5 / scale);
    return worst;
}

#endif
