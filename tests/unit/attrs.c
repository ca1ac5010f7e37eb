/* Named attributes (core/attrs.h): zeroed bytewise, compared bytewise by
 * CSE, printed by name in the IR dump, and the ops reach the IR through
 * its hooks (ts_graph_new installs them). */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "passes/passes.h"

static int live(const ts_graph *g, int op) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++) k += !g->nodes[i].dead && g->nodes[i].op == op;
    return k;
}

/* The text of g's IR dump (to free). */
static char *dump(const ts_graph *g) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    ts_graph_print(g, NULL, f);
    fclose(f);
    return text;
}

/* The families that had positional slots: built, merged by CSE when equal,
 * kept apart when a field differs, and printed by name. */
static void check_families(void) {
    ts_graph *g = ts_graph_new();
    const int64_t xd[3] = {2, 3, 5};
    ts_val x = ts_input(g, "x", TS_F32, 3, xd);
    ts_val s1 = ts_slice(g, x, 2, 1, 4), s2 = ts_slice(g, x, 2, 1, 4), s3 = ts_slice(g, x, 2, 0, 4);
    ts_val p = ts_permute(g, x, (const int[]){0, 2, 1});
    ts_val q = ts_permute(g, x, (const int[]){1, 0, 2});
    ts_val l = ts_leaky_relu(g, x, 0.5), c = ts_cast(g, x, TS_BF16);
    ts_val r = ts_reshape(g, x, 2, (const int64_t[]){6, -1});
    CHECK(ts_val_ok(c), "cast: %s", ts_last_error());
    CHECK_OK(
        ts_mark_output(g, ts_add(g, ts_sum(g, s1, 0, NULL, 0), ts_sum(g, s2, 0, NULL, 0)), "y1"));
    CHECK_OK(ts_mark_output(g, ts_sum(g, s3, 0, NULL, 0), "y2"));
    CHECK_OK(
        ts_mark_output(g, ts_add(g, ts_sum(g, p, 0, NULL, 0), ts_sum(g, q, 0, NULL, 0)), "y3"));
    CHECK_OK(ts_mark_output(g, l, "y4"));
    CHECK_OK(ts_mark_output(g, c, "y5"));
    CHECK_OK(ts_mark_output(g, r, "y6"));
    CHECK_OK(ts_graph_status(g));
    CHECK(g->nodes[g->values[s3.id].node].a.slice.end == 4 &&
              g->nodes[g->values[r.id].node].a.shape.dims[1] == 5,
          "slice end / reshape's inferred dim not by name");
    int32_t *remap = NULL;
    CHECK_OK(ts_pass_simplify(g, &remap));
    free(remap);
    CHECK(live(g, TS_OP_SLICE) == 2, "CSE: %d slices left, want 2", live(g, TS_OP_SLICE));
    CHECK(live(g, TS_OP_PERMUTE) == 2, "CSE: %d permutes left, want 2", live(g, TS_OP_PERMUTE));
    char *text = dump(g);
    static const char *want[] = {"= slice(x) axis=2 start=1 end=4\n", "= slice(x) axis=2 end=4\n",
                                 "= permute(x) perm=[0,2,1]\n",       "= permute(x) perm=[1,0,2]\n",
                                 "= leaky_relu(x) slope=0.5\n",       "= cast(x) dtype=bf16\n",
                                 "= reshape(x) rank=2 dims=[6,5]\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(text && strstr(text, want[i]), "IR dump lacks '%s': %s", want[i], text ? text : "");
    free(text);
    ts_graph_free(g);
}

int main(void) {
    ts_attrs z = ts_attrs_zero();
    const unsigned char *b = (const unsigned char *)&z;
    int nonzero = 0;
    for (size_t i = 0; i < sizeof z; i++) nonzero |= b[i];
    CHECK(!nonzero, "ts_attrs_zero leaves a non-zero byte");

    ts_graph *g = ts_graph_new();
    const int64_t xd[4] = {1, 2, 8, 8}, wd[4] = {3, 2, 3, 3};
    ts_val x = ts_input(g, "x", TS_F32, 4, xd),
           w = ts_param(g, "w", TS_F32, 4, wd, ts_init_zeros());
    const int64_t s1[2] = {1, 1}, s2[2] = {2, 2};
    ts_val a = ts_conv(g, x, w, TS_NONE, 2, s1, NULL, NULL, 1);
    ts_val a2 = ts_conv(g, x, w, TS_NONE, 2, s1, NULL, NULL, 1);
    ts_val c = ts_conv(g, x, w, TS_NONE, 2, s2, NULL, NULL, 1);
    CHECK_OK(
        ts_mark_output(g, ts_add(g, ts_sum(g, a, 0, NULL, 0), ts_sum(g, a2, 0, NULL, 0)), "y1"));
    CHECK_OK(ts_mark_output(g, ts_sum(g, c, 0, NULL, 0), "y2"));
    CHECK_OK(ts_graph_status(g));
    CHECK(g->nodes[g->values[c.id].node].a.conv.stride[1] == 2, "conv stride not by name");
    CHECK(live(g, TS_OP_CONV) == 3, "%d convs built", live(g, TS_OP_CONV));
    int32_t *remap = NULL;
    CHECK_OK(ts_pass_simplify(g, &remap));
    free(remap);
    CHECK(live(g, TS_OP_CONV) == 2,
          "CSE: %d convs left, want 2 (equal attributes merged, a "
          "different stride kept)",
          live(g, TS_OP_CONV));

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ts_graph_print(g, NULL, f);
    fclose(f);
    CHECK(text && strstr(text, "= conv(x, w) nd=2 groups=1 stride=[2,2] dilation=[1,1]\n"),
          "IR dump: %s", text ? text : "(none)");
    CHECK(text && strstr(text, "stride=[1,1] dilation=[1,1]"), "IR dump: %s", text ? text : "");
    free(text);
    ts_graph_free(g);
    check_families();
    return check_summary("attrs");
}
