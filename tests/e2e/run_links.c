/* Symbolic links planted in a run directory are never followed (end to
 * end through `tessel`, $TESSEL_BIN): a link as step-N.tmp (the save of a
 * resumed run), inside a leftover step-N.tmp, as LATEST.tmp, LATEST, the
 * directory LATEST names, an old step-N that `ckpt gc` removes, audit.log,
 * tb/ and plots/, and each file a training session writes (session_files)
 * makes the command fail with a message naming the link, and the link's
 * target outside the run directory is left as it was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set ckpt.every=2 --set ckpt.keep_last=0 --set train.total_steps=12 "
    "--set observe.tensorboard=false";

/* A fresh run of 4 steps (step-2 and step-4 committed) and an outside
 * directory holding one file. */
static void fresh(const char *run) {
    char out[128];
    snprintf(out, sizeof out, "%s/%s", dir, run);
    e2e_sh("rm -rf '%s' '%s.outside' && mkdir -p '%s.outside'", out, out, out);
    e2e_sh("echo precious >'%s.outside/keep'", out);
    e2e_result r = e2e_runf("train examples/w1.yaml %s --steps 4 --out %s", small, out);
    CHECK(r.rc == 0, "%s: exit %d\n%s", run, r.rc, r.err);
    e2e_done(&r);
}

static int outside_intact(const char *run) {
    char p[160];
    snprintf(p, sizeof p, "%s/%s.outside/keep", dir, run);
    char *t = e2e_slurp(p, NULL);
    int ok = !strcmp(t, "precious\n");
    free(t);
    return ok;
}

/* `what` failed, its message names `link`, and the outside is intact. */
static void expect_refused(const char *what, e2e_result r, const char *run, const char *link) {
    CHECK(r.rc != 0, "%s: exit 0, expected a failure\n%s", what, r.out);
    CHECK(strstr(r.err, link) && strstr(r.err, "symbolic link"), "%s: '%s' not named as a link: %s",
          what, link, r.err);
    CHECK(outside_intact(run), "%s: the target outside the run directory was changed", what);
    e2e_done(&r);
}

static e2e_result resume(const char *run) {
    return e2e_runf("train examples/w1.yaml %s --steps 6 --resume latest --out %s/%s", small, dir,
                    run);
}

/* The files a training session writes: a link planted as config.yaml,
 * lineage.json, normalisation.json, metrics.jsonl, summary.json (or the
 * NAME.tmp it is replaced through), tessel.lock, or as the run directory
 * itself, makes the run fail naming it, and the target is left as it was. */
static void session_files(void) {
    static const char *const names[] = {"config.yaml",     "lineage.json",      "metrics.jsonl",
                                        "summary.json",    "summary.json.tmp",  "tessel.lock",
                                        "config.yaml.tmp", "normalisation.json"};
    /* A CSV run, standardised (normalisation.json). */
    char csv[160], cfg[160];
    snprintf(csv, sizeof csv, "%s/t.csv", dir);
    snprintf(cfg, sizeof cfg, "%s/csv.yaml", dir);
    FILE *f = fopen(csv, "w");
    CHECK(f != NULL, "write %s", csv);
    if (!f) return;
    fprintf(f, "a,b,c,y\n");
    for (int i = 0; i < 64; i++)
        fprintf(f, "%d,%d.5,%d,%d\n", i % 7, i % 5, (i * 3) % 11, (i % 7) > 3);
    fclose(f);
    if (!(f = fopen(cfg, "w"))) return;
    fprintf(f,
            "model: {name: mlp, window: 0, in_dim: 3, hidden: 8, n_hidden: 1, layer_norm: false, "
            "classes: 2, batch: 8}\n"
            "data: {source: csv, path: %s, header: true, label: y, window: 1, horizon: 0, "
            "normalise: true, val_fraction: 0.25}\n"
            "train: {steps: 4, total_steps: 12, threads: 1}\n"
            "ckpt: {every: 2}\nobserve: {tensorboard: false}\n",
            csv);
    fclose(f);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char run[160], tag[16];
        snprintf(tag, sizeof tag, "s%zu", i);
        snprintf(run, sizeof run, "%s/%s", dir, tag);
        e2e_sh("rm -rf '%s' '%s.outside' && mkdir -p '%s.outside'", run, run, run);
        e2e_sh("echo precious >'%s.outside/keep'", run);
        e2e_result r = e2e_runf("train %s --out %s", cfg, run);
        CHECK(r.rc == 0, "%s: first run: exit %d\n%s", names[i], r.rc, r.err);
        e2e_done(&r);
        e2e_sh("rm -f '%s/%s' && ln -s '%s.outside/keep' '%s/%s'", run, names[i], run, run,
               names[i]);
        r = e2e_runf("train %s --steps 6 --resume latest --out %s", cfg, run);
        expect_refused(names[i], r, tag, names[i]);
    }
    /* The run directory itself a link, for a new run and for a resume. */
    char run[160];
    snprintf(run, sizeof run, "%s/sd", dir);
    e2e_sh("rm -rf '%s' '%s.outside' && mkdir -p '%s.outside' && ln -s '%s.outside' '%s'", run, run,
           run, run, run);
    e2e_sh("echo precious >'%s.outside/keep'", run);
    expect_refused("run directory link", e2e_runf("train %s --out %s", cfg, run), "sd", "sd");
    e2e_sh("rm -f '%s.outside/keep' && echo precious >'%s.outside/keep'", run, run);
    e2e_sh("'%s' train %s --out '%s.outside/inner' >/dev/null && mv '%s.outside/inner'/* "
           "'%s.outside/' && rmdir '%s.outside/inner'",
           getenv("TESSEL_BIN") ? getenv("TESSEL_BIN") : "build/tessel", cfg, run, run, run, run);
    expect_refused("resume through a run directory link",
                   e2e_runf("train %s --steps 6 --resume latest --out %s", cfg, run), "sd", "sd");
}

int main(void) {
    if (!e2e_setup("run-links", dir, sizeof dir)) return check_summary("e2e/run_links");
    char run[160];

    /* The example: step-N.tmp -> a directory outside. */
    fresh("a");
    snprintf(run, sizeof run, "%s/a", dir);
    e2e_sh("ln -s '%s.outside' '%s/step-00000006.tmp'", run, run);
    expect_refused("step-N.tmp link", resume("a"), "a", "step-00000006.tmp");

    /* A leftover step-N.tmp holding a link: nothing in it is removed. */
    fresh("b");
    snprintf(run, sizeof run, "%s/b", dir);
    e2e_sh("mkdir '%s/step-00000006.tmp' && ln -s '%s.outside/keep' "
           "'%s/step-00000006.tmp/manifest.json'",
           run, run, run);
    expect_refused("link inside step-N.tmp", resume("b"), "b", "manifest.json");
    struct stat st;
    char p[256];
    snprintf(p, sizeof p, "%s/step-00000006.tmp/manifest.json", run);
    CHECK(lstat(p, &st) == 0, "the link inside step-N.tmp is still there");

    /* LATEST.tmp -> a file outside (would be truncated by the save). */
    fresh("c");
    snprintf(run, sizeof run, "%s/c", dir);
    e2e_sh("ln -s '%s.outside/keep' '%s/LATEST.tmp'", run, run);
    expect_refused("LATEST.tmp link", resume("c"), "c", "LATEST.tmp");

    /* LATEST itself a link: resume and verify refuse it. */
    fresh("d");
    snprintf(run, sizeof run, "%s/d", dir);
    e2e_sh("cp '%s/LATEST' '%s.outside/LATEST' && rm '%s/LATEST' && ln -s '%s.outside/LATEST' "
           "'%s/LATEST'",
           run, run, run, run, run);
    expect_refused("LATEST link", resume("d"), "d", "LATEST");
    expect_refused("ckpt verify, LATEST link", e2e_runf("ckpt verify %s", run), "d", "LATEST");

    /* The directory LATEST names is a link to a checkpoint outside. */
    fresh("e");
    snprintf(run, sizeof run, "%s/e", dir);
    e2e_sh("mv '%s/step-00000004' '%s.outside/'", run, run);
    e2e_sh("ln -s '%s.outside/step-00000004' '%s/step-00000004'", run, run);
    expect_refused("LATEST names a link", resume("e"), "e", "step-00000004");
    expect_refused("export, LATEST names a link",
                   e2e_runf("export %s --safetensors %s/e.st", run, dir), "e", "step-00000004");

    /* An old step-N that gc removes is a link to a directory outside. */
    fresh("f");
    snprintf(run, sizeof run, "%s/f", dir);
    e2e_sh("ln -s '%s.outside' '%s/step-00000001'", run, run);
    expect_refused("ckpt gc", e2e_runf("ckpt gc %s --keep-last 1", run), "f", "step-00000001");
    snprintf(p, sizeof p, "%s/step-00000002/manifest.json", run);
    CHECK(access(p, F_OK) == 0, "ckpt gc removed nothing once it met the link");

    /* Retention during a run meets the same link. */
    fresh("g");
    snprintf(run, sizeof run, "%s/g", dir);
    e2e_sh("ln -s '%s.outside' '%s/step-00000000'", run, run);
    expect_refused("retention",
                   e2e_runf("train examples/w1.yaml %s --steps 6 --set ckpt.keep_last=1 "
                            "--resume latest --out %s",
                            small, run),
                   "g", "step-00000000");

    /* audit.log -> a file outside (would be appended to). */
    fresh("h");
    snprintf(run, sizeof run, "%s/h", dir);
    e2e_sh("rm '%s/audit.log' && ln -s '%s.outside/keep' '%s/audit.log'", run, run, run);
    expect_refused("audit.log link", resume("h"), "h", "audit.log");
    expect_refused("audit verify, audit.log link", e2e_runf("audit verify %s", run), "h",
                   "audit.log");

    /* tb/ -> a directory outside. */
    fresh("i");
    snprintf(run, sizeof run, "%s/i", dir);
    e2e_sh("ln -s '%s.outside' '%s/tb'", run, run);
    e2e_result r = e2e_runf("train examples/w1.yaml %s --steps 6 --resume latest "
                            "--set observe.tensorboard=true --out %s",
                            small, run);
    expect_refused("tb link", r, "i", "tb");
    e2e_sh("! ls '%s.outside' | grep -q tfevents", run);

    /* plots/ -> a directory outside (needs gnuplot only if it got that far). */
    fresh("j");
    snprintf(run, sizeof run, "%s/j", dir);
    e2e_sh("ln -s '%s.outside' '%s/plots'", run, run);
    expect_refused("plots link", e2e_runf("plot %s", run), "j", "plots");
    e2e_sh("test ! -e '%s.outside/plot.gp'", run);

    session_files();
    e2e_cleanup(dir);
    return check_summary("e2e/run_links");
}
