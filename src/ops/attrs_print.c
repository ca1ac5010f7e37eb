/* attrs_print.c — node attributes as text, for ts_graph_print (--dump ir).
 *
 * Each op prints its family's fields (core/attrs.h) as " name=value", each
 * one only when non-zero (a per-dim array: " name=[a,b]" over its rank
 * when any entry is non-zero). An op whose family has no case here prints
 * nothing: a new family adds its case. */
#include "op.h"

static void field(FILE *out, const char *name, int64_t v) {
    if (v) fprintf(out, " %s=%lld", name, (long long)v);
}

/* v[0..n) (n: the rank the array covers, at most max), when any of them
 * is non-zero. */
static void fieldn(FILE *out, const char *name, const int64_t *v, int64_t n, int64_t max) {
    int any = 0;
    if (n > max) n = max;
    for (int j = 0; j < n; j++) any |= v[j] != 0;
    if (!any) return;
    fprintf(out, " %s=[", name);
    for (int j = 0; j < n; j++) fprintf(out, j ? ",%lld" : "%lld", (long long)v[j]);
    fprintf(out, "]");
}

/* An op id or a dtype by its name (its number when it is none). */
static void op_field(FILE *out, const char *name, int64_t op) {
    const ts_op_def *d = ts_op_get((int)op);
    if (d && op == (int)op)
        fprintf(out, " %s=%s", name, d->name);
    else
        fprintf(out, " %s=%lld", name, (long long)op);
}

static void dtype_field(FILE *out, const char *name, int64_t dt) {
    if (dt >= 0 && dt < TS_DTYPE_COUNT)
        fprintf(out, " %s=%s", name, ts_dtype_name((ts_dtype)dt));
    else
        fprintf(out, " %s=%lld", name, (long long)dt);
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
    field(out, "n_low", a->n_low);
}

static void adam(FILE *out, const ts_adam_attrs *a) {
    field(out, "decoupled", a->decoupled);
    field(out, "has_coef", a->has_coef);
    real(out, "beta1", a->beta1);
    real(out, "beta2", a->beta2);
    real(out, "eps", a->eps);
    real(out, "weight_decay", a->weight_decay);
    field(out, "n_low", a->n_low);
}

/* permute's perm. Its length, the input's rank, is not in the node: a
 * valid perm of rank r is the longest prefix that is a permutation of
 * 0..r-1 (the entries after it are 0, which repeats the 0 already in it). */
static void perm(FILE *out, const int64_t *p) {
    int r = 0;
    unsigned seen = 0;
    for (int j = 0; j < TS_ATTR_RANK && p[j] >= 0 && p[j] < TS_ATTR_RANK; j++) {
        seen |= 1u << p[j];
        if (seen == (1u << (j + 1)) - 1) r = j + 1;
    }
    if (!r) /* not a permutation (inference reports it): up to its last non-zero */
        for (int j = 0; j < TS_ATTR_RANK; j++) r = p[j] ? j + 1 : r;
    fieldn(out, "perm", p, r, TS_ATTR_RANK);
}

static void unary(FILE *out, const ts_unary_attrs *a) {
    field(out, "approx", a->approx);
    real(out, "exponent", a->exponent);
    real(out, "slope", a->slope);
    real(out, "scale", a->scale);
    real(out, "shift", a->shift);
    if (a->out_low) field(out, "out_low", a->out_low);
    if (a->out_grad) field(out, "out_grad", a->out_grad);
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
        if (a->matmul_epi.low) field(out, "low", a->matmul_epi.low);
        if (a->matmul_epi.out_low) field(out, "out_low", a->matmul_epi.out_low);
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
        fieldn(out, "stride", a->conv.stride, a->conv.nd, 3);
        fieldn(out, "padding", a->conv.padding, a->conv.nd, 3);
        fieldn(out, "dilation", a->conv.dilation, a->conv.nd, 3);
        fieldn(out, "extra", a->conv.extra, a->conv.nd, 3);
        field(out, "channels_last", a->conv.channels_last);
        field(out, "low", a->conv.low);
        break;
    case TS_OP_POOL:
    case TS_OP_POOL_BWD:
        field(out, "nd", a->pool.nd);
        field(out, "mode", a->pool.mode);
        fieldn(out, "kernel", a->pool.kernel, a->pool.nd, 3);
        fieldn(out, "stride", a->pool.stride, a->pool.nd, 3);
        fieldn(out, "padding", a->pool.padding, a->pool.nd, 3);
        fieldn(out, "in_size", a->pool.in_size, a->pool.nd, 3);
        field(out, "channels_last", a->pool.channels_last);
        break;
    case TS_OP_LAYER_NORM:
    case TS_OP_LAYER_NORM_BWD:
    case TS_OP_LAYER_NORM_BWD_ACC:
        field(out, "has_w", a->norm.has_w);
        field(out, "has_b", a->norm.has_b);
        if (a->norm.eps != 0) fprintf(out, " eps=%g", a->norm.eps);
        if (a->norm.out_low) field(out, "out_low", a->norm.out_low);
        break;
    case TS_OP_ACT_LAYER_NORM:
    case TS_OP_LAYER_NORM_ACT_BWD:
        fprintf(out, " act=%s",
                ts_op_get((int)a->norm_act.act) ? ts_op_get((int)a->norm_act.act)->name : "?");
        if (n->op == TS_OP_LAYER_NORM_ACT_BWD) field(out, "side", a->norm_act.side);
        field(out, "has_w", a->norm_act.norm.has_w);
        field(out, "has_b", a->norm_act.norm.has_b);
        if (a->norm_act.norm.eps != 0) fprintf(out, " eps=%g", a->norm_act.norm.eps);
        if (a->norm_act.fwd.approx) field(out, "approx", a->norm_act.fwd.approx);
        break;
    case TS_OP_ATTENTION:
    case TS_OP_ATTENTION_BWD:
        field(out, "causal", a->attention.causal);
        if (a->attention.scale != 0) fprintf(out, " scale=%g", a->attention.scale);
        if (a->attention.low) field(out, "low", a->attention.low);
        if (a->attention.out_low) field(out, "out_low", a->attention.out_low);
        if (a->attention.sums_rank) field(out, "sums_rank", a->attention.sums_rank);
        break;
    case TS_OP_SOFTMAX:
    case TS_OP_LOG_SOFTMAX:
    case TS_OP_SOFTMAX_BWD:
    case TS_OP_LOG_SOFTMAX_BWD: field(out, "axis", a->softmax.axis); break;
    case TS_OP_SGD_UPDATE: sgd(out, &a->sgd); break;
    case TS_OP_ADAM_UPDATE: adam(out, &a->adam); break;
    case TS_OP_CLIP_COEF:
        real(out, "max_norm", a->clip.max_norm);
        if (a->clip.until_step > 0) field(out, "until_step", a->clip.until_step);
        break;
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
    case TS_OP_COMPRESS_START:
    case TS_OP_COMPRESS_WAIT:
    case TS_OP_PSGD_START:
    case TS_OP_PSGD_WAIT:
        field(out, "ticket", a->compress.ticket);
        field(out, "algo", a->compress.algo);
        field(out, "method", a->compress.method);
        field(out, "values", a->compress.values);
        field(out, "elems", a->compress.elems);
        field(out, "kmax", a->compress.kmax);
        field(out, "warmup", a->compress.warmup);
        field(out, "ranks", a->compress.ranks);
        field(out, "rank", a->compress.rank);
        field(out, "min_elems", a->compress.min_elems);
        if (a->compress.max_elems) field(out, "max_elems", a->compress.max_elems);
        if (a->compress.iters > 1) field(out, "iters", a->compress.iters);
        if (a->compress.scaled) field(out, "scaled", a->compress.scaled);
        if (a->compress.dense) field(out, "dense", a->compress.dense);
        real(out, "ratio", a->compress.ratio);
        real(out, "momentum", a->compress.momentum);
        real(out, "clip", a->compress.clip);
        break;
    case TS_OP_REDUCE_SUM:
    case TS_OP_REDUCE_MAX:
    case TS_OP_REDUCE_MAX_BWD:
        field(out, "axes", a->reduce.axes);
        field(out, "keepdim", a->reduce.keepdim);
        real(out, "scale", a->reduce.scale);
        if (a->reduce.out_low) field(out, "out_low", a->reduce.out_low);
        if (a->reduce.bwd.fwd_op) {
            op_field(out, "bwd_fwd_op", a->reduce.bwd.fwd_op);
            field(out, "bwd_side", a->reduce.bwd.side);
            unary(out, &a->reduce.bwd.fwd);
        }
        break;
    case TS_OP_GATHER:
    case TS_OP_SCATTER_ADD:
    case TS_OP_SCATTER_ADD_TO:
        field(out, "axis", a->index.axis);
        field(out, "extent", a->index.extent);
        break;
    case TS_OP_MAXMIN_BWD:
        field(out, "min", a->maxmin.min);
        field(out, "side", a->maxmin.side);
        break;
    case TS_OP_GELU:
    case TS_OP_POW_SCALAR:
    case TS_OP_LEAKY_RELU:
    case TS_OP_AFFINE_SCALAR: unary(out, &a->unary); break;
    case TS_OP_UNARY_BWD:
        op_field(out, "fwd_op", a->unary_bwd.fwd_op);
        field(out, "side", a->unary_bwd.side);
        unary(out, &a->unary_bwd.fwd);
        break;
    case TS_OP_CAST: dtype_field(out, "dtype", a->cast.dtype); break;
    case TS_OP_RESHAPE:
    case TS_OP_EXPAND:
        field(out, "rank", a->shape.rank);
        fieldn(out, "dims", a->shape.dims, a->shape.rank, TS_ATTR_RANK);
        break;
    case TS_OP_PERMUTE:
        perm(out, a->permute.perm);
        if (a->permute.out_low) field(out, "out_low", a->permute.out_low);
        break;
    case TS_OP_CONCAT: field(out, "axis", a->concat.axis); break;
    case TS_OP_SLICE:
    case TS_OP_SLICE_BWD:
        field(out, "axis", a->slice.axis);
        field(out, "start", a->slice.start);
        field(out, "end", a->slice.end);
        field(out, "extent", a->slice.extent);
        break;
    case TS_OP_DROPOUT:
        field(out, "stream", a->dropout.stream);
        field(out, "training", a->dropout.training);
        real(out, "p", a->dropout.p);
        break;
    case TS_OP_CROSS_ENTROPY:
    case TS_OP_CROSS_ENTROPY_BWD:
    case TS_OP_CROSS_ENTROPY_FUSED:
        field(out, "ignore_index", a->cross_entropy.ignore_index);
        if (a->cross_entropy.row_count > 0) { /* a chunk (chunk_ce.c) */
            field(out, "row_start", a->cross_entropy.row_start);
            field(out, "row_count", a->cross_entropy.row_count);
        }
        if (a->cross_entropy.out_low) field(out, "out_low", a->cross_entropy.out_low);
        break;
    case TS_OP_BATCH_NORM:
    case TS_OP_BATCH_NORM_BWD:
        field(out, "affine", a->batch_norm.affine);
        field(out, "training", a->batch_norm.training);
        field(out, "relu", a->batch_norm.relu);
        field(out, "channels_last", a->batch_norm.channels_last);
        real(out, "momentum", a->batch_norm.momentum);
        real(out, "eps", a->batch_norm.eps);
        if (a->batch_norm.masked) field(out, "masked", a->batch_norm.masked);
        break;
    case TS_OP_GRU_CELL:
    case TS_OP_GRU_CELL_BWD:
    case TS_OP_LSTM_CELL:
    case TS_OP_LSTM_CELL_BWD:
        field(out, "t", a->rnn.t);
        field(out, "steps", a->rnn.steps);
        field(out, "has_acc", a->rnn.has_acc);
        field(out, "has_dh", a->rnn.has_dh);
        field(out, "has_dc", a->rnn.has_dc);
        break;
    case TS_OP_SPMM:
        field(out, "rows", a->spmm.rows);
        field(out, "cols", a->spmm.cols);
        break;
    case TS_OP_QUANTIZE:
    case TS_OP_DEQUANTIZE:
    case TS_OP_FAKE_QUANT:
    case TS_OP_FAKE_QUANT_BWD:
        dtype_field(out, "format", a->quant.format);
        field(out, "axis", a->quant.axis);
        break;
    case TS_OP_FUSED_ELTWISE:
        field(out, "n_instr", a->fused.n_instr);
        field(out, "n_ext", a->fused.n_ext);
        break;
    default: break; /* no attributes */
    }
}
