/* Gradient checks for binary elementwise ops, matmul and reductions. */
#include <string.h>
#include "gradcheck.h"

static ts_val b_add(ts_graph *g, const ts_val *v, void *u) {
    (void)u;
    return ts_add(g, v[0], v[1]);
}
static ts_val b_sub(ts_graph *g, const ts_val *v, void *u) {
    (void)u;
    return ts_sub(g, v[0], v[1]);
}
static ts_val b_mul(ts_graph *g, const ts_val *v, void *u) {
    (void)u;
    return ts_mul(g, v[0], v[1]);
}
static ts_val b_div(ts_graph *g, const ts_val *v, void *u) {
    (void)u;
    return ts_div(g, v[0], v[1]);
}
static ts_val b_max(ts_graph *g, const ts_val *v, void *u) {
    (void)u;
    return ts_maximum(g, v[0], v[1]);
}
static ts_val b_min(ts_graph *g, const ts_val *v, void *u) {
    (void)u;
    return ts_minimum(g, v[0], v[1]);
}

typedef struct {
    int ta, tb;
} mm_flags;
static ts_val b_mm(ts_graph *g, const ts_val *v, void *u) {
    mm_flags *f = u;
    return ts_matmul(g, v[0], v[1], f->ta, f->tb);
}
static ts_val b_linear(ts_graph *g, const ts_val *v, void *u) {
    (void)u;
    return ts_linear(g, v[0], v[1], v[2]);
}
typedef struct {
    int n;
    int axes[4];
    int keep;
    int mean;
} red_args;
static ts_val b_sum(ts_graph *g, const ts_val *v, void *u) {
    red_args *r = u;
    return r->mean ? ts_mean(g, v[0], r->n, r->axes, r->keep)
                   : ts_sum(g, v[0], r->n, r->axes, r->keep);
}
static ts_val b_maxr(ts_graph *g, const ts_val *v, void *u) {
    red_args *r = u;
    return ts_max(g, v[0], r->n, r->axes, r->keep);
}
static ts_val b_where(ts_graph *g, const ts_val *v, void *u) {
    (void)u;
    return ts_where(g, v[0], v[1], v[2]);
}

int main(void) {
    gc_build_fn bins[] = {b_add, b_sub, b_mul, b_max, b_min};
    const char *names[] = {"add", "sub", "mul", "maximum", "minimum"};
    for (int i = 0; i < 5; i++) {
        char lb[64];
        gc_input same[2] = {GC_F(3, 4), GC_F(3, 4)};
        snprintf(lb, sizeof lb, "%s same shape", names[i]);
        gc_check(lb, 2, same, bins[i], NULL);
        gc_input bc[2] = {GC_F(2, 3, 4), GC_F(4)};
        snprintf(lb, sizeof lb, "%s broadcast trailing", names[i]);
        gc_check(lb, 2, bc, bins[i], NULL);
        gc_input bc2[2] = {GC_F(2, 1, 4), GC_F(3, 1)};
        snprintf(lb, sizeof lb, "%s broadcast both", names[i]);
        gc_check(lb, 2, bc2, bins[i], NULL);
        gc_input sc[2] = {GC_SCALAR, GC_F(5)};
        snprintf(lb, sizeof lb, "%s scalar", names[i]);
        gc_check(lb, 2, sc, bins[i], NULL);
    }
    gc_input dv[2] = {GC_F(2, 3), GC_F(3)};
    dv[1].lo = 0.5, dv[1].hi = 2;
    gc_check("div broadcast", 2, dv, b_div, NULL);
    gc_input dv2[2] = {GC_F(1, 3), GC_F(4, 1)};
    dv2[1].lo = 0.5, dv2[1].hi = 2;
    gc_check("div broadcast both", 2, dv2, b_div, NULL);

    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            mm_flags f = {ta, tb};
            char lb[64];
            gc_input in[2] = {ta ? GC_F(4, 3) : GC_F(3, 4), tb ? GC_F(5, 4) : GC_F(4, 5)};
            snprintf(lb, sizeof lb, "matmul ta=%d tb=%d", ta, tb);
            gc_check(lb, 2, in, b_mm, &f);
            gc_input bi[2] = {ta ? GC_F(2, 4, 3) : GC_F(2, 3, 4),
                              tb ? GC_F(2, 5, 4) : GC_F(2, 4, 5)};
            snprintf(lb, sizeof lb, "batched matmul ta=%d tb=%d", ta, tb);
            gc_check(lb, 2, bi, b_mm, &f);
            gc_input bb[2] = {ta ? GC_F(2, 1, 4, 3) : GC_F(2, 1, 3, 4),
                              tb ? GC_F(3, 5, 4) : GC_F(3, 4, 5)};
            snprintf(lb, sizeof lb, "broadcast batch matmul ta=%d tb=%d", ta, tb);
            gc_check(lb, 2, bb, b_mm, &f);
            gc_input sh[2] = {ta ? GC_F(2, 4, 3) : GC_F(2, 3, 4), tb ? GC_F(5, 4) : GC_F(4, 5)};
            snprintf(lb, sizeof lb, "shared rhs matmul ta=%d tb=%d", ta, tb);
            gc_check(lb, 2, sh, b_mm, &f);
        }
    gc_input lin[3] = {GC_F(2, 3, 4), GC_F(5, 4), GC_F(5)};
    gc_check("linear 3d", 3, lin, b_linear, NULL);
    gc_input lin1[3] = {GC_F(4), GC_F(1, 4), GC_F(1)};
    gc_check("linear rank-1 input", 3, lin1, b_linear, NULL);

    red_args all = {0, {0}, 0, 0}, last = {1, {-1}, 0, 0}, first = {1, {0}, 1, 0},
             mid = {1, {1}, 0, 1}, two = {2, {0, 2}, 1, 1};
    gc_input r3[1] = {GC_F(3, 4, 5)};
    gc_check("sum all", 1, r3, b_sum, &all);
    gc_check("sum last", 1, r3, b_sum, &last);
    gc_check("sum first keepdim", 1, r3, b_sum, &first);
    gc_check("mean middle", 1, r3, b_sum, &mid);
    gc_check("mean axes 0,2 keepdim", 1, r3, b_sum, &two);
    gc_input r1[1] = {GC_F(1, 4, 1)};
    gc_check("sum size-1 dims", 1, r1, b_sum, &two);
    gc_check("max last", 1, r3, b_maxr, &last);
    gc_check("max axes 0,2", 1, r3, b_maxr, &two);

    unsigned char mask[12] = {1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0};
    gc_input wi[3] = {{TS_U8, 2, {3, 4}, 0, 0, 0, mask}, GC_F(3, 4), GC_F(4)};
    gc_check("where broadcast", 3, wi, b_where, NULL);

    /* Shape errors name the op and the operands. */
    ts_graph *g = ts_graph_new();
    int64_t d1[2] = {2, 3}, d2[2] = {4, 5};
    ts_val a = ts_input(g, "a", TS_F32, 2, d1), b = ts_input(g, "b", TS_F32, 2, d2);
    ts_val c = ts_matmul(g, a, b, 0, 0);
    CHECK(!ts_val_ok(c), "matmul of mismatched shapes must fail");
    CHECK(strstr(ts_graph_error(g), "matmul") && strstr(ts_graph_error(g), "f32[2,3]") &&
              strstr(ts_graph_error(g), "f32[4,5]"),
          "message names op and shapes: %s", ts_graph_error(g));
    ts_graph_free(g);
    g = ts_graph_new();
    a = ts_input(g, "a", TS_F32, 2, d1);
    b = ts_input(g, "b", TS_F32, 2, d2);
    CHECK(!ts_val_ok(ts_add(g, a, b)), "add of non-broadcastable shapes must fail");
    CHECK(strstr(ts_graph_error(g), "add(a=f32[2,3], b=f32[4,5])") != NULL, "message: %s",
          ts_graph_error(g));
    ts_graph_free(g);
    return check_summary("gradcheck binary");
}
