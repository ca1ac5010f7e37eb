/* attrs_print.c — node attributes as text, for ts_graph_print (--dump ir).
 *
 * Ops with named attributes (core/attrs.h) print " name=value" for each
 * non-zero field (a per-spatial-dim array: " name=[a,b]" over the nd dims
 * when any entry is non-zero);
 * the others print their positional slots as " i=[..] f=[..]" up to the
 * last non-zero one. A family given named fields adds a case here. */
#include "op.h"

static void field(FILE *out, const char *name, int64_t v) {
    if (v) fprintf(out, " %s=%lld", name, (long long)v);
}

/* v[0..n) (n: the spatial rank, at most 3), when any of them is non-zero. */
static void fieldn(FILE *out, const char *name, const int64_t *v, int64_t n) {
    int any = 0;
    if (n > 3) n = 3;
    for (int j = 0; j < n; j++) any |= v[j] != 0;
    if (!any) return;
    fprintf(out, " %s=[", name);
    for (int j = 0; j < n; j++) fprintf(out, j ? ",%lld" : "%lld", (long long)v[j]);
    fprintf(out, "]");
}

static void slots(const ts_attrs *a, FILE *out) {
    int last_i = TS_NI - 1, last_f = TS_NF - 1;
    while (last_i >= 0 && a->i[last_i] == 0) last_i--;
    while (last_f >= 0 && a->f[last_f] == 0) last_f--;
    if (last_i >= 0) {
        fprintf(out, " i=[");
        for (int j = 0; j <= last_i; j++) fprintf(out, j ? ",%lld" : "%lld", (long long)a->i[j]);
        fprintf(out, "]");
    }
    if (last_f >= 0) {
        fprintf(out, " f=[");
        for (int j = 0; j <= last_f; j++) fprintf(out, j ? ",%g" : "%g", a->f[j]);
        fprintf(out, "]");
    }
}

void ts_attrs_print(const ts_node *n, FILE *out) {
    const ts_attrs *a = &n->a;
    switch (n->op) {
    case TS_OP_MATMUL:
        field(out, "trans_a", a->matmul.trans_a);
        field(out, "trans_b", a->matmul.trans_b);
        field(out, "low", a->matmul.low);
        break;
    case TS_OP_MATMUL_EPI:
        field(out, "trans_a", a->matmul_epi.trans_a);
        field(out, "trans_b", a->matmul_epi.trans_b);
        field(out, "n_post", a->matmul_epi.n_post);
        for (int p = 0; p < a->matmul_epi.n_post && p < TS_ATTR_EPI_MAX; p++)
            fprintf(out, p ? ",%lld" : " post=[%lld", (long long)a->matmul_epi.post[p]);
        if (a->matmul_epi.n_post > 0) fprintf(out, "]");
        break;
    case TS_OP_CONV:
    case TS_OP_CONV_BWD_DATA:
    case TS_OP_CONV_BWD_WEIGHT:
    case TS_OP_CONV_TRANSPOSE:
        field(out, "nd", a->conv.nd);
        field(out, "groups", a->conv.groups);
        fieldn(out, "stride", a->conv.stride, a->conv.nd);
        fieldn(out, "padding", a->conv.padding, a->conv.nd);
        fieldn(out, "dilation", a->conv.dilation, a->conv.nd);
        fieldn(out, "extra", a->conv.extra, a->conv.nd);
        field(out, "channels_last", a->conv.channels_last);
        field(out, "low", a->conv.low);
        break;
    case TS_OP_POOL:
    case TS_OP_POOL_BWD:
        field(out, "nd", a->pool.nd);
        field(out, "mode", a->pool.mode);
        fieldn(out, "kernel", a->pool.kernel, a->pool.nd);
        fieldn(out, "stride", a->pool.stride, a->pool.nd);
        fieldn(out, "padding", a->pool.padding, a->pool.nd);
        fieldn(out, "in_size", a->pool.in_size, a->pool.nd);
        field(out, "channels_last", a->pool.channels_last);
        break;
    case TS_OP_LAYER_NORM:
    case TS_OP_LAYER_NORM_BWD:
        field(out, "has_w", a->norm.has_w);
        field(out, "has_b", a->norm.has_b);
        if (a->norm.eps != 0) fprintf(out, " eps=%g", a->norm.eps);
        break;
    case TS_OP_ATTENTION:
    case TS_OP_ATTENTION_BWD:
        field(out, "causal", a->attention.causal);
        if (a->attention.scale != 0) fprintf(out, " scale=%g", a->attention.scale);
        break;
    case TS_OP_SOFTMAX:
    case TS_OP_LOG_SOFTMAX:
    case TS_OP_SOFTMAX_BWD:
    case TS_OP_LOG_SOFTMAX_BWD: field(out, "axis", a->softmax.axis); break;
    default: slots(a, out);
    }
}
