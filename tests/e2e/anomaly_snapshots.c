/* Anomaly snapshots over a long noisy run (issue 16: a variance rule fired
 * 2 313 times in ~7 300 steps and wrote 5 354 snapshots, 157 MB, never
 * removed). A rule that fires on most steps of a batch-1 run of 3 000 steps,
 * with the defaults alerts.cooldown 100, alerts.snapshot_max 20 and
 * alerts.snapshot_keep 5:
 *
 * - the rule fires hundreds of times, but its snapshot is taken at most
 *   once per 100 steps (the firings between are logged as held);
 * - exactly 20 snapshots are written, then the cap is reported;
 * - the run directory keeps the newest 5 of them, each a checkpoint that
 *   verifies, and nothing else of that name. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"
#include "tessel/ckpt.h"

static char dir[64];

static int count(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

int main(void) {
    if (!e2e_setup("anomaly", dir, sizeof dir)) return check_summary("e2e/anomaly_snapshots");
    FILE *f = fopen(e2e_path("noisy.yaml"), "w");
    if (f) {
        fputs("model:\n  name: mlp\n  batch: 1\n  window: 0\n  in_dim: 8\n  hidden: 16\n"
              "  n_hidden: 2\n  out_dim: 1\n  layer_norm: false\n"
              "train:\n  steps: 3000\n  lr: 0.001\n  threads: 1\n"
              "observe:\n  histogram_every: 0\n"
              "alerts:\n  rules:\n"
              "    - name=noisy metric=grad_variance ratio_to_baseline=1.5 action=snapshot\n",
              f);
        fclose(f);
    }
    e2e_result r = e2e_runf("train %s --out %s", e2e_path("noisy.yaml"), e2e_path("run"));
    CHECK(r.rc == 0 && strstr(r.out, "done: 3000 steps"), "noisy run: exit %d\n%s", r.rc, r.err);

    const int fired = count(r.out, "rule 'noisy' (grad_variance");
    const int held = count(r.out, "(held: cooldown until step");
    const int written = count(r.out, "alert: snapshot ");
    printf("3000 steps: the rule fired %d times (%d held by the cooldown), %d snapshots written\n",
           fired, held, written);
    CHECK(fired >= 300, "the rule fired only %d times: the run is not noisy enough to test", fired);
    CHECK(written == 20, "%d snapshots written, wanted alerts.snapshot_max = 20", written);
    CHECK(strstr(r.out, "alerts.snapshot_max = 20 already") != NULL, "the cap is not reported");
    CHECK(strstr(r.out, "alert: removed 1 older anomaly snapshot (alerts.snapshot_keep = 5)") !=
              NULL,
          "retention is not reported");

    /* The steps of the snapshots, in order: at least 100 apart. */
    long steps[64];
    int n = 0;
    for (const char *p = r.out; n < 64 && (p = strstr(p, "alert: snapshot ")); p++) {
        const char *s = strstr(p, "/step-");
        if (s) steps[n++] = strtol(s + 6, NULL, 10);
    }
    for (int i = 1; i < n; i++)
        CHECK(steps[i] - steps[i - 1] >= 100, "snapshots at steps %ld and %ld: within the cooldown",
              steps[i - 1], steps[i]);

    /* On disk: the newest 5, each one verifying. */
    DIR *d = opendir(e2e_path("run"));
    int on_disk = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        if (len < 8 || strcmp(e->d_name + len - 8, "-anomaly")) continue;
        on_disk++;
        const long step = strtol(e->d_name + 5, NULL, 10);
        int newest = 0;
        for (int i = n - 5; i < n; i++) newest |= i >= 0 && steps[i] == step;
        CHECK(newest, "%s is not one of the newest 5 snapshots", e->d_name);
        char path[600];
        snprintf(path, sizeof path, "%s/%s", e2e_path("run"), e->d_name);
        ts_ckpt *c = NULL;
        CHECK_OK(ts_ckpt_open(path, NULL, NULL, &c));
        ts_ckpt_close(c);
    }
    if (d) closedir(d);
    CHECK(on_disk == 5, "%d anomaly snapshots on disk, wanted alerts.snapshot_keep = 5", on_disk);
    e2e_done(&r);
    e2e_cleanup(dir);
    return check_summary("e2e/anomaly_snapshots");
}
