/* examples/w4_bf16.yaml (the 3D U-Net in bf16) through the CLI: compiled,
 * every convolution of the training graph (forward, backward data,
 * backward weights, transposed) carries the mixed-precision flag (conv.low = 1)
 * and an f32 output, the casts go to bf16; with precision.default=fp32 the
 * same config has neither; and a small version trains two steps. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static const char *const conv_ops[] = {"= conv(", "= conv_bwd_data(", "= conv_bwd_weight(",
                                       "= conv_transpose("};

/* Counts over the lines of an IR dump: conv-family nodes, those flagged
 * with an f32 output, and casts to bf16. */
static void scan(const char *ir, int *convs, int *low, int *casts) {
    *convs = *low = *casts = 0;
    for (const char *l = ir; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line - 1 ? n : sizeof line - 1), l);
        for (int k = 0; k < 4; k++) {
            const char *op = strstr(line, conv_ops[k]);
            if (!op) continue;
            (*convs)++;
            /* "%5: f32[...] = conv(...) nd=3 ... low=1": the attribute conv.low */
            const char *lf = strstr(op, " low=1");
            *low += lf && (lf[6] == 0 || lf[6] == ' ') && strstr(line, ": f32[") &&
                    strstr(line, ": f32[") < op;
        }
        if (strstr(line, "= cast(") && strstr(line, ": bf16[")) (*casts)++;
        l = e ? e + 1 : NULL;
    }
}

int main(void) {
    char dir[64];
    if (!e2e_setup("pconv", dir, sizeof dir)) return check_summary("e2e/precision_conv");

    int convs, low, casts;
    e2e_result r = e2e_run("compile examples/w4_bf16.yaml --dump ir");
    CHECK(r.rc == 0, "compile w4_bf16: %d %s", r.rc, r.err);
    scan(r.out, &convs, &low, &casts);
    /* 13 convs, 10 data gradients (not of the input), 13 weight gradients,
     * 2 transposed convs */
    CHECK(convs == 38 && low == 38, "w4_bf16: %d of %d conv nodes in bf16 (want 38 of 38)", low,
          convs);
    CHECK(casts > 0 && casts < 2 * convs, "w4_bf16: %d casts to bf16 (shared: fewer than 2 per op)",
          casts);
    e2e_done(&r);

    r = e2e_run("compile examples/w4_bf16.yaml --set precision.default=fp32 --dump ir");
    CHECK(r.rc == 0, "compile w4_bf16 in fp32: %d %s", r.rc, r.err);
    scan(r.out, &convs, &low, &casts);
    CHECK(convs == 38 && low == 0 && casts == 0, "w4 fp32: %d convs, %d low, %d casts", convs, low,
          casts);
    e2e_done(&r);

    r = e2e_runf("train examples/w4_bf16.yaml --steps 2 --set model.size=8 --set "
                 "train.eval_every=0 --out %s",
                 e2e_path("run"));
    CHECK(r.rc == 0 && strstr(r.out, "done: 2 steps"), "train w4_bf16 (8^3): %d %s %s", r.rc, r.out,
          r.err);
    e2e_done(&r);
    e2e_cleanup(dir);
    return check_summary("e2e/precision_conv");
}
