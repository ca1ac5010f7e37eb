/* `tessel train examples/breast_cancer.yaml` end to end: the CSV that
 * python3-sklearn ships (a line of counts, no header, label column 30), a
 * tabular MLP standardised with training-split statistics, and AUC >= 0.98
 * on the held-out split. Then bad CSV input: a label outside the class
 * count and a skip_rows past the end, each an error naming file and line.
 * Skipped (with a message) when the file is absent. Runs $TESSEL_BIN from
 * the repository root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

#define BC_CSV "/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv"

static double field(const char *json, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    double v = -1;
    if (!p || sscanf(p + strlen(pat), " %lf", &v) != 1) return -1;
    return v;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void bad_input(const char *dir) {
    char csv[256];
    snprintf(csv, sizeof csv, "%s/bad.csv", dir);
    /* Line 1: counts (skipped); line 4 has label 2 with 2 classes. */
    write_file(csv, "4,2,a,b\n1.0,2.0,0\n1.5,2.5,1\n0.5,0.1,2\n2.0,1.0,1\n");
    char common[300];
    snprintf(common, sizeof common, "%s/bad.yaml", dir);
    write_file(common, "model: {name: mlp, window: 0, in_dim: 2, classes: 2, batch: 2}\n"
                       "data: {source: csv, header: false, label: \"2\", window: 1, horizon: 0}\n");
    e2e_result r = e2e_runf("train %s --set data.path=%s --set data.skip_rows=1 --out %s/r1",
                            common, csv, dir);
    char want[300];
    snprintf(want, sizeof want, "%s:4: label column '2' holds 2", csv);
    CHECK(r.rc == 2 && strstr(r.err, want), "label outside the classes: rc %d, %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("train %s --set data.path=%s --set data.skip_rows=9 --out %s/r2", common, csv,
                 dir);
    snprintf(want, sizeof want, "%s: skip_rows is 9 but the file has", csv);
    CHECK(r.rc == 2 && strstr(r.err, want), "skip_rows past the end: rc %d, %s", r.rc, r.err);
    e2e_done(&r);
    /* Without skip_rows the line of counts is read as the first data row. */
    r = e2e_runf("train %s --set data.path=%s --out %s/r3", common, csv, dir);
    snprintf(want, sizeof want, "%s:1: column '3' holds 'b', not a number", csv);
    CHECK(r.rc == 2 && strstr(r.err, want), "counts line read as data: rc %d, %s", r.rc, r.err);
    e2e_done(&r);
}

int main(void) {
    char dir[64];
    if (!e2e_setup("bc", dir, sizeof dir)) return check_summary("e2e/breast_cancer");
    bad_input(dir);
    if (access(BC_CSV, R_OK) != 0) {
        printf("skipped the training run: %s is not installed (python3-sklearn)\n", BC_CSV);
    } else {
        e2e_result r = e2e_runf("train examples/breast_cancer.yaml --out %s/run", dir);
        CHECK(r.rc == 0, "breast cancer run: exit %d: %s", r.rc, r.err);
        e2e_done(&r);
        char path[128];
        snprintf(path, sizeof path, "%s/run/summary.json", dir);
        char *sum = e2e_slurp(path, NULL);
        const char *val = strstr(sum, "\"val\"");
        double auc = val ? field(val, "auc") : -1, acc = val ? field(val, "accuracy") : -1;
        CHECK(auc >= 0.98 && auc <= 1, "held-out AUC %.4f (>= 0.98 wanted): %s", auc, sum);
        CHECK(field(val ? val : sum, "examples") == 114, "114 held-out rows (20 %% of 569)");
        printf("breast cancer: held-out AUC %.4f, accuracy %.2f %%\n", auc, 100 * acc);
        free(sum);
        snprintf(path, sizeof path, "%s/run/normalisation.json", dir);
        char *norm = e2e_slurp(path, NULL);
        int means = 0;
        const char *m = strstr(norm, "\"mean\"");
        for (const char *p = m; p && *p && *p != ']'; p++) means += *p == ',';
        CHECK(m && means == 29, "normalisation.json holds 30 means (%d commas)", means);
        free(norm);
        snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
        char *log = e2e_slurp(path, NULL);
        CHECK(strstr(log, "\"auc\":") != NULL, "metrics.jsonl has the auc");
        free(log);
        /* Dice and mIoU of the predicted classes, in the log line and the summary. */
        r = e2e_runf("train examples/breast_cancer.yaml --set train.epochs=3 --set "
                     "'train.metrics=accuracy, dice, miou' --out %s/run2",
                     dir);
        CHECK(r.rc == 0 && strstr(r.out, " dice 0.") && strstr(r.out, " miou 0."),
              "dice and miou reported: %s%s", r.out, r.err);
        e2e_done(&r);
        snprintf(path, sizeof path, "%s/run2/summary.json", dir);
        sum = e2e_slurp(path, NULL);
        val = strstr(sum, "\"val\"");
        double dice = val ? field(val, "dice") : -1, miou = val ? field(val, "miou") : -1;
        CHECK(dice > 0.8 && dice <= 1 && miou > 0.6 && miou <= dice && !strstr(sum, "\"auc\""),
              "summary: dice %.4f, miou %.4f, no auc: %s", dice, miou, sum);
        free(sum);
        /* auc needs two classes: refused before the run directory exists. */
        r = e2e_runf("train examples/breast_cancer.yaml --set train.metrics=auc --set "
                     "model.classes=3 --out %s/run3",
                     dir);
        CHECK(r.rc == 2 &&
                  strstr(r.err, "auc needs a binary classifier (2 classes), this one has 3"),
              "auc with 3 classes: rc %d, %s", r.rc, r.err);
        e2e_done(&r);
        snprintf(path, sizeof path, "%s/run3", dir);
        CHECK(access(path, F_OK) != 0, "no run directory after the refusal");
    }
    e2e_cleanup(dir);
    return check_summary("e2e/breast_cancer");
}
