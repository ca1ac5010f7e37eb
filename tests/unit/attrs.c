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
    return check_summary("attrs");
}
