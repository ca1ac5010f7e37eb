/* optim.fused_update from the command line (docs/config.md, "optim"):
 * `tessel train` with and without it writes the same checkpoint and the
 * same gradient norms; a run resumed from a fused checkpoint continues bit
 * for bit; `tessel compile` shows no gradient region; the step emitted by
 * --emit-c (one update per parameter, scatter_add_to) trains the same
 * weights; clipping is refused naming both keys, before any run directory
 * is made. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"
#include "emit_c.h"

static char dir[64];

static const char *tiny = "examples/tiny_gpt.yaml --set alerts.defaults=false "
                          "--set train.clip_grad_norm=0 --set observe.tensorboard=false "
                          "--set train.total_steps=6";

static void train(const char *name, const char *extra) {
    e2e_result r = e2e_runf("train %s %s --out %s/%s", tiny, extra, dir, name);
    CHECK(r.rc == 0, "train %s: exit %d\n%s", name, r.rc, r.err);
    e2e_done(&r);
}

static void same_ckpt(const char *a, const char *b) {
    e2e_result r = e2e_runf("ckpt diff %s/%s %s/%s", dir, a, dir, b);
    CHECK(r.rc == 0 && strstr(r.out, " 0 different"), "ckpt diff %s %s: exit %d\n%s%s", a, b, r.rc,
          r.out, r.err);
    e2e_done(&r);
}

/* The "grad_norm" fields of a run's metrics.jsonl, in order. */
static char *grad_norms(const char *run) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, run);
    char *text = e2e_slurp(path, NULL), *out = calloc(strlen(text) + 1, 1);
    for (const char *p = text; (p = strstr(p, "\"grad_norm\":")) != NULL; p++) {
        size_t n = strcspn(p, ",}");
        strncat(out, p, n);
        strcat(out, ";");
    }
    free(text);
    return out;
}

int main(void) {
    if (!e2e_setup("fused_update", dir, sizeof dir)) return check_summary("e2e/fused_update");
    train("plain", "--steps 6 --set ckpt.every=6");
    train("fused", "--steps 6 --set ckpt.every=6 --set optim.fused_update=true");
    same_ckpt("plain/step-00000006", "fused/step-00000006");
    char *ga = grad_norms("plain"), *gb = grad_norms("fused");
    CHECK(ga[0] && !strcmp(ga, gb), "gradient norms differ:\n%s\n%s", ga, gb);
    free(ga), free(gb);

    /* resume a fused run from its step-3 checkpoint */
    train("half", "--steps 3 --set ckpt.every=3 --set optim.fused_update=true");
    e2e_result r = e2e_runf("train %s --steps 6 --set ckpt.every=6 --set optim.fused_update=true "
                            "--resume %s/half/step-00000003 --out %s/resumed",
                            tiny, dir, dir);
    CHECK(r.rc == 0, "resume: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    same_ckpt("plain/step-00000006", "resumed/step-00000006");

    r = e2e_runf("compile %s --set optim.fused_update=true --dump stats", tiny);
    CHECK(r.rc == 0 && strstr(r.out, "grads                               0 bytes"),
          "compile: exit %d, no empty gradient region\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);

    r = e2e_runf(
        "train examples/tiny_gpt.yaml --set optim.fused_update=true --steps 2 --out %s/clip", dir);
    CHECK(r.rc != 0 && strstr(r.err, "optim.fused_update") && strstr(r.err, "train.clip_grad_norm"),
          "clip: exit %d, expected both keys named\n%s", r.rc, r.err);
    char path[128];
    snprintf(path, sizeof path, "%s/clip", dir);
    FILE *f = fopen(path, "r");
    CHECK(f == NULL, "clip: the refused run made %s", path);
    if (f) fclose(f);
    e2e_done(&r);

    emit_c_check("emit", "examples/tiny_gpt.yaml",
                 "--set optim.fused_update=true --set train.clip_grad_norm=0", 4);
    e2e_cleanup(dir);
    return check_summary("e2e/fused_update");
}
