/* Sensor dropout through the command line (examples/fusion_dropout.yaml,
 * docs/shapes.md "Sensor masks"): the example trains and its loss drops;
 * the same seed gives bit-identical weights; dropout 0 gives other weights
 * (the flags reach the model); shape buckets and two processes feed the
 * flags too; the default fusion model is the same with model.source_mask
 * false as without the key; bad values exit 2 naming the key. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"
#include "testfiles.h"

/* "loss A -> B" of the run's last line. */
static int loss_of(const char *out, double *first, double *last) {
    const char *p = strstr(out, "done: ");
    p = p ? strstr(p, "loss ") : NULL;
    return p && sscanf(p, "loss %lf -> %lf", first, last) == 2;
}

static char *params(const char *dir, int step, long *len) {
    char p[512];
    snprintf(p, sizeof p, "%s/step-%08d/params-r0-000.safetensors", e2e_path(dir), step);
    return e2e_slurp(p, len);
}

static void test_train(void) {
    const char *ex = "train examples/fusion_dropout.yaml --set ckpt.every=100";
    double f0, l0, f1, l1;
    e2e_result a = e2e_runf("%s --out %s", ex, e2e_path("a"));
    CHECK(a.rc == 0 && loss_of(a.out, &f0, &l0), "train: exit %d\n%s%s", a.rc, a.out, a.err);
    CHECK(a.rc != 0 || l0 < 0.5 * f0, "loss %g -> %g: did not halve", f0, l0);
    e2e_result b = e2e_runf("%s --out %s", ex, e2e_path("b"));
    CHECK(b.rc == 0 && loss_of(b.out, &f1, &l1), "second run: exit %d\n%s", b.rc, b.err);
    e2e_result c = e2e_runf("%s --set train.source_dropout=0 --out %s", ex, e2e_path("c"));
    CHECK(c.rc == 0, "dropout 0: exit %d\n%s", c.rc, c.err);
    long la = 0, lb = 0, lc = 0;
    char *pa = params("a", 100, &la), *pb = params("b", 100, &lb), *pc = params("c", 100, &lc);
    CHECK(la > 1000 && la == lb && !memcmp(pa, pb, (size_t)la),
          "the same seed trained to other weights (%ld, %ld bytes)", la, lb);
    CHECK(la == lc && memcmp(pa, pc, (size_t)la), "dropout 0.3 and 0 trained the same weights");
    free(pa), free(pb), free(pc);
    e2e_done(&a), e2e_done(&b), e2e_done(&c);
    /* shape buckets: 100 examples in batches of 16 end in a short batch of
     * 4 (padded to a bucket), whose flags are fed with padding rows */
    e2e_result d = e2e_runf("%s --set data.x=%s --set data.y=%s --set data.source=npy "
                            "--set shape.policy=bucket --set train.steps=20 --out %s",
                            ex, e2e_path("x.npy"), e2e_path("y.npy"), e2e_path("d"));
    CHECK(d.rc == 0 && strstr(d.out, "plan cache:"), "bucketed: exit %d\n%s%s", d.rc, d.out, d.err);
    e2e_done(&d);
    /* two processes: each rank feeds its rows' flags, on one plan and on
     * buckets (the same batches: the same losses, up to the order the
     * bucket plans reduce gradients in) */
    double f2, l2, f3, l3;
    e2e_result e = e2e_runf("%s --procs 2 --out %s", ex, e2e_path("e"));
    e2e_result h = e2e_runf("%s --procs 2 --set shape.policy=bucket --out %s", ex, e2e_path("h"));
    CHECK(e.rc == 0 && loss_of(e.out, &f2, &l2) && l2 < 0.5 * f2, "2 processes: exit %d\n%s%s",
          e.rc, e.out, e.err);
    CHECK(h.rc == 0 && loss_of(h.out, &f3, &l3) && fabs(f3 - f2) <= 1e-5 * f2 &&
              fabs(l3 - l2) <= 1e-4 * l2,
          "2 processes on buckets: exit %d, loss %g -> %g vs %g -> %g\n%s", h.rc, f3, l3, f2, l2,
          h.err);
    e2e_done(&e), e2e_done(&h);
}

static void test_default_unchanged(void) {
    const char *ex = "train examples/fusion.yaml --set train.steps=3 --set ckpt.every=3";
    e2e_result a = e2e_runf("%s --out %s", ex, e2e_path("fa"));
    e2e_result b = e2e_runf("%s --set model.source_mask=false --out %s", ex, e2e_path("fb"));
    CHECK(a.rc == 0 && b.rc == 0, "fusion: exit %d, %d\n%s%s", a.rc, b.rc, a.err, b.err);
    long la = 0, lb = 0;
    char *pa = params("fa", 3, &la), *pb = params("fb", 3, &lb);
    CHECK(la > 1000 && la == lb && !memcmp(pa, pb, (size_t)la),
          "model.source_mask false changed the default fusion model's weights");
    free(pa), free(pb);
    e2e_done(&a), e2e_done(&b);
}

static void bad(const char *args, const char *want) {
    e2e_result r = e2e_runf("train %s --out %s", args, e2e_path("bad"));
    CHECK(r.rc == 2 && strstr(r.err, want), "%s: exit %d, '%s' should contain '%s'", args, r.rc,
          r.err, want);
    e2e_done(&r);
}

static void test_bad(void) {
    const char *ex = "examples/fusion_dropout.yaml";
    char args[600];
    snprintf(args, sizeof args, "%s --set train.source_dropout=1", ex);
    bad(args, "train.source_dropout: must be in [0, 1), got '1'");
    snprintf(args, sizeof args, "%s --set train.source_dropout=-0.2", ex);
    bad(args, "train.source_dropout: must be in [0, 1), got '-0.2'");
    snprintf(args, sizeof args, "%s --set model.source_mask=false", ex);
    bad(args, "fusion_dropout.yaml:27:3: train.source_dropout 0.3 needs model.source_mask: true");
    snprintf(args, sizeof args, "%s --set dist.reproducible=true", ex);
    bad(args, "model.source_mask: not with dist.reproducible yet");
    FILE *f = fopen(e2e_path("mlp.yaml"), "w");
    CHECK(f != NULL, "cannot write %s", e2e_path("mlp.yaml"));
    if (!f) return;
    fputs("model: {name: mlp, source_mask: true}\n", f);
    fclose(f);
    bad(e2e_path("mlp.yaml"), "mlp.yaml:1:20: model.source_mask is not a key of mlp models");
}

int main(void) {
    char dir[64];
    if (!e2e_setup("fusion_dropout", dir, sizeof dir)) return check_summary("e2e/fusion_dropout");
    /* npy data for the bucketed run: 100 examples of 112 values, one target */
    float *x = malloc(sizeof(float) * 100 * 112), y[100];
    unsigned seed = 1;
    for (int i = 0; i < 100; i++) {
        y[i] = 0;
        for (int k = 0; k < 112; k++) {
            x[i * 112 + k] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
            if (k % 9 == 0) y[i] += x[i * 112 + k];
        }
    }
    tf_write_npy(e2e_path("x.npy"), "<f4", 100, 112, x, sizeof(float), 0);
    tf_write_npy(e2e_path("y.npy"), "<f4", 100, 1, y, sizeof(float), 0);
    free(x);
    test_train();
    test_default_unchanged();
    test_bad();
    e2e_cleanup(dir);
    return check_summary("e2e/fusion_dropout");
}
