/* Golden tests of the pass pipeline: a small graph built with the C API,
 * compiled with ts_compile_options.dump_after set to a few passes, printed
 * in the IR's text form (ts_graph_print) and compared with the committed
 * tests/golden/ir_after_PASS.txt. After an intended change of a pass or of
 * the text form, regenerate them (from the source root) with
 *
 *     TESSEL_UPDATE_GOLDEN=1 build/test_unit_golden_ir
 *
 * and review the diff. An unknown pass name fails the compile naming the
 * passes. */
#include <stdlib.h>
#include <string.h>
#include "check.h"

static const char *const PASSES[] = {"autodiff", "train", "train_mode",
                                     "simplify", "fuse",  "memplan"};

static ts_graph *small_graph(ts_val *loss) {
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 2, (int64_t[]){4, 3});
    ts_val y = ts_input(g, "y", TS_F32, 2, (int64_t[]){4, 2});
    ts_val w = ts_param(g, "fc.weight", TS_F32, 2, (int64_t[]){3, 2}, ts_init_uniform(-1, 1));
    ts_val b = ts_param(g, "fc.bias", TS_F32, 1, (int64_t[]){2}, ts_init_zeros());
    ts_val h = ts_relu(g, ts_add(g, ts_matmul(g, x, w, 0, 0), b));
    *loss = ts_mse_loss(g, ts_dropout(g, h, 0.25), y);
    return g;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

int main(void) {
    const int update =
        getenv("TESSEL_UPDATE_GOLDEN") && !strcmp(getenv("TESSEL_UPDATE_GOLDEN"), "1");
    ts_val loss;
    ts_graph *g = small_graph(&loss);
    CHECK_OK(ts_graph_status(g));
    for (size_t k = 0; k < sizeof PASSES / sizeof PASSES[0]; k++) {
        char *text = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&text, &len);
        ts_train_spec spec = ts_train_spec_default(loss);
        spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
        spec.clip_grad_norm = 1.0;
        ts_compile_options o = ts_compile_options_default();
        o.dump_after = PASSES[k];
        o.dump_to = mem;
        ts_plan *p = NULL;
        CHECK_OK(ts_compile(g, &spec, &o, &p));
        fclose(mem);
        ts_plan_free(p);
        char path[256];
        snprintf(path, sizeof path, "tests/golden/ir_after_%s.txt", PASSES[k]);
        if (update) {
            FILE *f = fopen(path, "wb");
            CHECK(f && fwrite(text, 1, len, f) == len && fclose(f) == 0, "writing %s", path);
            printf("wrote %s\n", path);
        } else {
            char *want = read_all(path);
            CHECK(want != NULL, "%s is missing (TESSEL_UPDATE_GOLDEN=1 writes it)", path);
            CHECK(want && strcmp(want, text) == 0,
                  "the graph after '%s' differs from %s:\n--- got\n%s--- want\n%s", PASSES[k], path,
                  text, want ? want : "");
            free(want);
        }
        CHECK(len > 0 && strstr(text, "\"fc.weight\""), "after %s: no graph printed", PASSES[k]);
        free(text);
    }
    /* The passes change the graph: autodiff adds gradients, fuse removes nodes. */
    char *ad = read_all("tests/golden/ir_after_autodiff.txt"),
         *tr = read_all("tests/golden/ir_after_train.txt");
    CHECK(ad && tr && strcmp(ad, tr) != 0, "train left the graph of autodiff unchanged");
    free(ad), free(tr);

    ts_compile_options o = ts_compile_options_default();
    o.dump_after = "no_such_pass";
    o.dump_to = stdout;
    ts_train_spec spec = ts_train_spec_default(loss);
    ts_plan *p = NULL;
    ts_status s = ts_compile(g, &spec, &o, &p);
    CHECK(s == TS_ERR_INVALID && !p, "unknown pass: status %d", (int)s);
    CHECK(strstr(ts_last_error(), "'no_such_pass'") && strstr(ts_last_error(), "train_mode") &&
              strstr(ts_last_error(), "memplan"),
          "the message names neither the pass nor the known ones: %s", ts_last_error());
    ts_graph_free(g);
    return check_summary("golden ir");
}
