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

static void real(FILE *out, const char *name, double v) {
    if (v != 0) fprintf(out, " %s=%g", name, v);
}

static void sgd(FILE *out, const ts_sgd_attrs *a) {
    field(out, "has_buf", a->has_buf);
    field(out, "has_coef", a->has_coef);
    field(out, "nesterov", a->nesterov);
    real(out, "momentum", a->momentum);
    real(out, "dampening", a->dampening);
    real(out, "weight_decay", a->weight_decay);
}

static void adam(FILE *out, const ts_adam_attrs *a) {
    field(out, "decoupled", a->decoupled);
    field(out, "has_coef", a->has_coef);
    real(out, "beta1", a->beta1);
    real(out, "beta2", a->beta2);
    real(out, "eps", a->eps);
    real(out, "weight_decay", a->weight_decay);
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
    case TS_OP_SGD_UPDATE: sgd(out, &a->sgd); break;
    case TS_OP_ADAM_UPDATE: adam(out, &a->adam); break;
    case TS_OP_CLIP_COEF: real(out, "max_norm", a->clip.max_norm); break;
    case TS_OP_SHARD_UPDATE:
        if (a->shard.opt_op == TS_OP_ADAM_UPDATE)
            adam(out, &a->shard.opt.adam);
        else
            sgd(out, &a->shard.opt.sgd);
        field(out, "offset", a->shard.offset);
        field(out, "n_params", a->shard.n_params);
        field(out, "opt_op", a->shard.opt_op);
        field(out, "fused_ranks", a->shard.fused_ranks);
        field(out, "fused_elems", a->shard.fused_elems);
        field(out, "divisor", a->shard.divisor);
        break;
    case TS_OP_ALLREDUCE_START:
    case TS_OP_ALLREDUCE_WAIT:
    case TS_OP_REDUCE_SCATTER_START:
    case TS_OP_REDUCE_SCATTER_WAIT:
    case TS_OP_ALL_GATHER_START:
    case TS_OP_ALL_GATHER_WAIT:
    case TS_OP_ZERO_CLIP_COEF:
    case TS_OP_ZERO_FOUND_INF:
        field(out, "ticket", a->bucket.ticket);
        field(out, "algo", a->bucket.algo);
        field(out, "shard_elems", a->bucket.shard_elems);
        field(out, "elems", a->bucket.elems);
        field(out, "zero", a->bucket.zero);
        field(out, "keep_sum", a->bucket.keep_sum);
        field(out, "ranks", a->bucket.ranks);
        real(out, "max_norm", a->bucket.max_norm);
        break;
    case TS_OP_REDUCE_SUM:
    case TS_OP_REDUCE_MAX:
    case TS_OP_REDUCE_MAX_BWD:
        field(out, "axes", a->reduce.axes);
        field(out, "keepdim", a->reduce.keepdim);
        real(out, "scale", a->reduce.scale);
        break;
    case TS_OP_GATHER:
    case TS_OP_SCATTER_ADD:
        field(out, "axis", a->index.axis);
        field(out, "extent", a->index.extent);
        break;
    default: slots(a, out);
    }
}
