/* Source flags from the data (data.valid, docs/shapes.md "Sensor masks"):
 * a fusion model on .npy data whose file valid [n, 3] says which sources
 * each example has. All ones trains bit for bit as without the file; a
 * camera the file marks missing in every example is never read, in
 * training or evaluation (other camera values: the same weights and
 * validation loss to the bit), and changes what is learnt; shape buckets
 * and two processes feed the flags too; a missing file, another shape and
 * a value other than 0 or 1 exit 2 naming the file; examples/fusion_valid.yaml
 * trains. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"
#include "testfiles.h"

enum { N = 100, IN = 112, CAM = 64 }; /* examples/fusion_dropout.yaml: a 1 x 8 x 8 camera first */

static const char *ex = "train examples/fusion_dropout.yaml --set data.source=npy "
                        "--set train.source_dropout=0 --set train.steps=30 --set ckpt.every=30";

static char *params(const char *dir, long *len) {
    char p[512];
    snprintf(p, sizeof p, "%s/step-00000030/params-r0-000.safetensors", e2e_path(dir));
    return e2e_slurp(p, len);
}

/* The validation loss of the run's summary.json, as written (-1 if absent). */
static double val_loss(const char *dir) {
    char p[512];
    snprintf(p, sizeof p, "%s/summary.json", e2e_path(dir));
    char *s = e2e_slurp(p, NULL), *v = strstr(s, "\"val\":");
    v = v ? strstr(v, "\"loss\":") : NULL;
    double l = v ? atof(v + strlen("\"loss\":")) : -1;
    free(s);
    return l;
}

static e2e_result train(const char *x, const char *valid, const char *more, const char *out) {
    return e2e_runf("%s --set data.x=%s --set data.y=%s %s%s %s --out %s", ex, e2e_path(x),
                    e2e_path("y.npy"), valid ? "--set data.valid=" : "",
                    valid ? e2e_path(valid) : "", more, e2e_path(out));
}

static int same_params(const char *a, const char *b) {
    long la = 0, lb = 0;
    char *pa = params(a, &la), *pb = params(b, &lb);
    const int same = la > 1000 && la == lb && !memcmp(pa, pb, (size_t)la);
    free(pa), free(pb);
    return same;
}

static void test_flags(void) {
    e2e_result a = train("x.npy", NULL, "", "a");
    e2e_result b = train("x.npy", "ones.npy", "", "b");
    e2e_result c = train("x.npy", "nocam.npy", "", "c");
    e2e_result d = train("x2.npy", "nocam.npy", "", "d");
    CHECK(a.rc == 0 && b.rc == 0 && c.rc == 0 && d.rc == 0, "exit %d %d %d %d\n%s%s%s%s", a.rc,
          b.rc, c.rc, d.rc, a.err, b.err, c.err, d.err);
    CHECK(same_params("a", "b"), "every source present in data.valid changed the weights");
    CHECK(!same_params("a", "c"), "a camera missing in every example trained the same weights");
    CHECK(same_params("c", "d"), "the values of a camera marked missing changed the weights");
    const double vc = val_loss("c"), vd = val_loss("d"), va = val_loss("a");
    CHECK(vc > 0 && vc == vd, "missing camera, other values: validation loss %.9g vs %.9g", vc, vd);
    CHECK(va > 0 && va != vc, "validation loss %.9g with the camera, %.9g without", va, vc);
    e2e_done(&a), e2e_done(&b), e2e_done(&c), e2e_done(&d);
    /* with source dropout on top, all ones again changes nothing */
    e2e_result e = train("x.npy", NULL, "--set train.source_dropout=0.3", "e");
    e2e_result f = train("x.npy", "ones.npy", "--set train.source_dropout=0.3", "f");
    CHECK(e.rc == 0 && f.rc == 0 && same_params("e", "f"),
          "dropout 0.3: all-ones data.valid changed the weights (exit %d, %d)\n%s", e.rc, f.rc,
          f.err);
    e2e_done(&e), e2e_done(&f);
    /* shape buckets (the short batch's padding rows) and two processes
     * (each rank feeds its rows' flags): still blind to the camera */
    e2e_result g = train("x.npy", "nocam.npy", "--set shape.policy=bucket", "g");
    e2e_result h = train("x2.npy", "nocam.npy", "--set shape.policy=bucket", "h");
    CHECK(g.rc == 0 && h.rc == 0 && strstr(g.out, "plan cache:") && same_params("g", "h"),
          "buckets: exit %d, %d, or the missing camera's values changed the weights\n%s%s", g.rc,
          h.rc, g.err, h.err);
    /* (2 processes under exact shapes train no short batch) */
    e2e_result i = train("x.npy", "nocam.npy", "--procs 2 --set data.drop_last=true", "i");
    e2e_result j = train("x2.npy", "nocam.npy", "--procs 2 --set data.drop_last=true", "j");
    CHECK(i.rc == 0 && j.rc == 0 && same_params("i", "j"),
          "2 processes: exit %d, %d, or the missing camera's values changed the weights\n%s%s",
          i.rc, j.rc, i.err, j.err);
    e2e_done(&g), e2e_done(&h), e2e_done(&i), e2e_done(&j);
}

static void bad(const char *valid, const char *more, const char *want) {
    e2e_result r =
        e2e_runf("%s --set data.x=%s --set data.y=%s --set data.valid=%s %s --out %s", ex,
                 e2e_path("x.npy"), e2e_path("y.npy"), e2e_path(valid), more, e2e_path("bad"));
    CHECK(r.rc == 2 && strstr(r.err, want), "data.valid %s %s: exit %d, '%s' should contain '%s'",
          valid, more, r.rc, r.err, want);
    e2e_done(&r);
}

static void test_bad(void) {
    char want[600];
    snprintf(want, sizeof want, "%s: cannot open", e2e_path("none.npy"));
    bad("none.npy", "", want);
    snprintf(want, sizeof want, "%s: data.valid has shape [100, 2], but the data needs [100, 3]",
             e2e_path("two.npy"));
    bad("two.npy", "", want);
    snprintf(want, sizeof want, "%s: data.valid has shape [99, 3], but the data needs [100, 3]",
             e2e_path("short.npy"));
    bad("short.npy", "", want);
    snprintf(want, sizeof want, "%s: data.valid of example 7, source 1 is 2: flags are 0",
             e2e_path("two_value.npy"));
    bad("two_value.npy", "", want);
    snprintf(want, sizeof want, "%s: data.valid of example 3, source 2 is 0.5",
             e2e_path("half.npy"));
    bad("half.npy", "", want);
    bad("ones.npy", "--set model.source_mask=false --set train.source_dropout=0", "data.valid '");
    e2e_result r = e2e_runf("train examples/fusion_dropout.yaml --set data.valid=%s --out %s",
                            e2e_path("ones.npy"), e2e_path("bad"));
    CHECK(r.rc == 2 && strstr(r.err, "data.valid is not used by data.source synthetic"),
          "data.valid on synthetic data: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
}

int main(void) {
    char dir[64];
    if (!e2e_setup("fusion_valid", dir, sizeof dir)) return check_summary("e2e/fusion_valid");
    /* 100 examples of 112 values and one target; x2 holds other camera values */
    float *x = malloc(sizeof(float) * N * IN), y[N];
    unsigned seed = 1;
    for (int i = 0; i < N; i++) {
        y[i] = 0;
        for (int k = 0; k < IN; k++) {
            x[i * IN + k] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
            if (k % 9 == 0) y[i] += x[i * IN + k];
        }
    }
    tf_write_npy(e2e_path("x.npy"), "<f4", N, IN, x, sizeof(float), 0);
    tf_write_npy(e2e_path("y.npy"), "<f4", N, 1, y, sizeof(float), 0);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < CAM; k++) x[i * IN + k] = 100.0f * (float)(k - i);
    tf_write_npy(e2e_path("x2.npy"), "<f4", N, IN, x, sizeof(float), 0);
    free(x);
    uint8_t v[N * 3];
    memset(v, 1, sizeof v);
    tf_write_npy(e2e_path("ones.npy"), "|u1", N, 3, v, 1, 0);
    tf_write_npy(e2e_path("short.npy"), "|u1", N - 1, 3, v, 1, 0);
    tf_write_npy(e2e_path("two.npy"), "|u1", N, 2, v, 1, 0);
    v[7 * 3 + 1] = 2;
    tf_write_npy(e2e_path("two_value.npy"), "|u1", N, 3, v, 1, 0);
    v[7 * 3 + 1] = 1;
    for (int i = 0; i < N; i++) v[i * 3] = 0;
    tf_write_npy(e2e_path("nocam.npy"), "|u1", N, 3, v, 1, 0);
    float h[N * 3];
    for (int i = 0; i < N * 3; i++) h[i] = 1.0f;
    h[3 * 3 + 2] = 0.5f;
    tf_write_npy(e2e_path("half.npy"), "<f4", N, 3, h, sizeof(float), 0);
    test_flags();
    test_bad();
    /* the example trains, its flags' file in the run's lineage */
    e2e_result r = e2e_runf("train examples/fusion_valid.yaml --set train.steps=20 --out %s",
                            e2e_path("example"));
    char *lin = e2e_slurp(e2e_path("example/lineage.json"), NULL);
    CHECK(r.rc == 0 && strstr(lin, "examples/data/fusion_sensors/valid.npy"),
          "examples/fusion_valid.yaml: exit %d, or valid.npy not in lineage.json\n%s", r.rc, r.err);
    free(lin);
    e2e_done(&r);
    e2e_cleanup(dir);
    return check_summary("e2e/fusion_valid");
}
