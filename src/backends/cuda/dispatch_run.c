/* How each CUDA instruction is enqueued every step (planned once by dispatch.c's cu_plan_ins,
 * which made every check that can fail: a step only launches kernels). */
#include "backends/cuda/cuda.h"
#include "backends/cuda/operands.h"

static void *dptr(const cu_state *st, const ts_operand *o) {
    return cu_at(st, o->off);
}

/* The tensor-core attention's q, k and v (or their gradients) from three operands in a row:
 * split, ops[0], ops[1] and ops[2]; packed [B, T, 3, H, hd] (q's rank 5), all three in ops[0],
 * k and v H * hd after q in each row (ops[1] and ops[2] are not read then). */
static void qkv_ptrs(const cu_state *st, const ts_operand *ops, const ts_operand *q, float *p[3]) {
    p[0] = dptr(st, &ops[0]);
    const int packed = q->rank == 5;
    const int64_t kv = q->dims[3] * q->dims[4]; /* packed only: H * hd */
    for (int j = 1; j < 3; j++) p[j] = packed ? p[0] + j * kv : dptr(st, &ops[j]);
}

ts_status cu_run_ins(cu_state *st, const ts_program *prog, int i) {
    const ts_instr *in = &prog->ins[i];
    const cu_op *o = &st->ops[i];
    cu_stream s = (cu_stream)st->stream;
    void *scratch = st->dev + st->scratch_off;
    int rc = 0;
    switch (in->op) {
    case TS_OP_CAST:
        rc = cu_cast(dptr(st, &in->out[0]), cu_cast_kind(in->out[0].dtype), dptr(st, &in->in[0]),
                     cu_cast_kind(in->in[0].dtype), cu_numel(&in->out[0]), s);
        break;
    case TS_OP_MATMUL:
    case TS_OP_MATMUL_EPI: return cu_gemm_run(st, prog, i, o->gemm);
    case TS_OP_RESHAPE:
        if (in->out[0].off != in->in[0].off)
            rc = (int)cudaMemcpyAsync(dptr(st, &in->out[0]), dptr(st, &in->in[0]),
                                      cu_bytes(&in->in[0]), cudaMemcpyDeviceToDevice, st->stream);
        break;
    case TS_OP_PERMUTE:
        rc = cu_permute(dptr(st, &in->out[0]), dptr(st, &in->in[0]),
                        (int)cu_host->dtype_size(in->in[0].dtype), in->in[0].rank, in->in[0].dims,
                        in->a.permute.perm, s);
        break;
    case TS_OP_CONCAT: {
        const ts_operand *y = &in->out[0];
        int ax = (int)in->a.concat.axis, es = (int)cu_host->dtype_size(y->dtype);
        int64_t outer = cu_prod(y->dims, 0, ax), inner = cu_prod(y->dims, ax + 1, y->rank), at = 0;
        for (int j = 0; j < in->n_in && !rc; j++) {
            int64_t len = in->in[j].dims[ax];
            rc = cu_copy_axis(dptr(st, y), y->dims[ax], at, dptr(st, &in->in[j]), len, 0, len,
                              outer, inner, es, s);
            at += len;
        }
        break;
    }
    case TS_OP_SLICE: {
        const ts_operand *x = &in->in[0];
        int ax = (int)in->a.slice.axis, es = (int)cu_host->dtype_size(x->dtype);
        int64_t len = in->a.slice.end - in->a.slice.start;
        rc =
            cu_copy_axis(dptr(st, &in->out[0]), len, 0, dptr(st, x), x->dims[ax], in->a.slice.start,
                         len, cu_prod(x->dims, 0, ax), cu_prod(x->dims, ax + 1, x->rank), es, s);
        break;
    }
    case TS_OP_SLICE_BWD: {
        const ts_operand *y = &in->out[0];
        int ax = (int)in->a.slice.axis, es = (int)cu_host->dtype_size(y->dtype);
        int64_t len = in->a.slice.end - in->a.slice.start;
        rc = cu_zero(dptr(st, y), cu_bytes(y), s);
        if (!rc)
            rc = cu_copy_axis(dptr(st, y), y->dims[ax], in->a.slice.start, dptr(st, &in->in[0]),
                              len, 0, len, cu_prod(y->dims, 0, ax),
                              cu_prod(y->dims, ax + 1, y->rank), es, s);
        break;
    }
    case TS_OP_GATHER: {
        const ts_operand *x = &in->in[0], *ix = &in->in[1];
        int ax = (int)in->a.index.axis;
        rc = cu_gather(dptr(st, &in->out[0]), dptr(st, x), dptr(st, ix), ix->dtype == TS_I64,
                       cu_numel(ix), cu_prod(x->dims, 0, ax), x->dims[ax],
                       cu_prod(x->dims, ax + 1, x->rank), (int)cu_host->dtype_size(x->dtype),
                       st->d_err, s);
        break;
    }
    case TS_OP_SCATTER_ADD: {
        const ts_operand *y = &in->out[0], *ix = &in->in[1];
        int ax = (int)in->a.index.axis;
        rc = cu_scatter_add(dptr(st, y), dptr(st, &in->in[0]), dptr(st, ix), ix->dtype == TS_I64,
                            cu_numel(ix), cu_prod(y->dims, 0, ax), y->dims[ax],
                            cu_prod(y->dims, ax + 1, y->rank), scratch, o->scratch, st->d_err, s);
        break;
    }
    case TS_OP_REDUCE_SUM:
        if (o->scratch) { /* leading axes (planned): coalesced column sums */
            const ts_operand *x = &in->in[0];
            int lead = 0;
            while (in->a.reduce.axes >> lead & 1) lead++;
            rc = cu_col_sum(dptr(st, &in->out[0]), dptr(st, x), cu_prod(x->dims, 0, lead),
                            cu_prod(x->dims, lead, x->rank), in->a.reduce.scale, scratch, s);
            break;
        }
        rc = cu_reduce_sum(dptr(st, &in->out[0]), dptr(st, &in->in[0]), in->in[0].rank,
                           in->in[0].dims, in->a.reduce.axes, in->a.reduce.scale, s);
        break;
    case TS_OP_LAYER_NORM: {
        const ts_operand *x = &in->in[0];
        int hw = in->a.norm.has_w != 0, hb = in->a.norm.has_b != 0;
        rc = cu_layer_norm(dptr(st, &in->out[0]), dptr(st, &in->out[1]), dptr(st, &in->out[2]),
                           dptr(st, x), hw ? dptr(st, &in->in[1]) : NULL,
                           hb ? dptr(st, &in->in[1 + hw]) : NULL, cu_prod(x->dims, 0, x->rank - 1),
                           x->dims[x->rank - 1], in->a.norm.eps, s);
        break;
    }
    case TS_OP_LAYER_NORM_BWD: {
        const ts_operand *x = &in->in[1];
        int hw = in->a.norm.has_w != 0, hb = in->a.norm.has_b != 0;
        rc = cu_layer_norm_bwd(dptr(st, &in->out[0]), hw ? dptr(st, &in->out[1]) : NULL,
                               hb ? dptr(st, &in->out[1 + hw]) : NULL, dptr(st, &in->in[0]),
                               dptr(st, x), dptr(st, &in->in[2]), dptr(st, &in->in[3]),
                               hw ? dptr(st, &in->in[4]) : NULL, cu_prod(x->dims, 0, x->rank - 1),
                               x->dims[x->rank - 1], scratch, s);
        break;
    }
    case TS_OP_CROSS_ENTROPY: {
        const ts_operand *x = &in->in[0], *t = &in->in[1];
        rc = cu_cross_entropy(dptr(st, &in->out[0]), dptr(st, &in->out[1]), dptr(st, x),
                              dptr(st, t), t->dtype == TS_I64,
                              in->n_in == 3 ? dptr(st, &in->in[2]) : NULL, x->dims[0], x->dims[1],
                              in->a.cross_entropy.ignore_index, scratch, st->d_err, s);
        break;
    }
    case TS_OP_CROSS_ENTROPY_BWD: {
        const ts_operand *x = &in->in[1], *t = &in->in[2];
        rc = cu_cross_entropy_bwd(
            dptr(st, &in->out[0]), dptr(st, &in->in[0]), dptr(st, x), dptr(st, &in->in[3]),
            dptr(st, t), t->dtype == TS_I64, in->n_in == 5 ? dptr(st, &in->in[4]) : NULL,
            x->dims[0], x->dims[1], in->a.cross_entropy.ignore_index, scratch, st->d_err, s);
        break;
    }
    case TS_OP_ATTENTION: {
        const ts_operand *q = &in->in[0];
        if (o->attn_tc) {
            cu_attn_geom ge;
            cu_attn_geom_of(q, &ge);
            float *qkv[3];
            qkv_ptrs(st, &in->in[0], q, qkv);
            rc = cu_attention_tc(dptr(st, &in->out[0]), dptr(st, &in->out[1]), qkv[0], qkv[1],
                                 qkv[2], &ge, (int)in->a.attention.causal,
                                 (float)in->a.attention.scale, s);
            break;
        }
        rc = cu_attention(dptr(st, &in->out[0]), dptr(st, &in->out[1]), dptr(st, q),
                          dptr(st, &in->in[1]), dptr(st, &in->in[2]), q->dims[0] * q->dims[1],
                          q->dims[2], q->dims[3], (int)in->a.attention.causal,
                          (float)in->a.attention.scale, s);
        break;
    }
    case TS_OP_ATTENTION_BWD: {
        const ts_operand *q = &in->in[1];
        if (o->attn_tc) {
            /* (do, q, k, v, o, lse) -> (dq, dk, dv), or packed (do, qkv, o, lse) -> (dqkv) */
            cu_attn_geom ge;
            cu_attn_geom_of(q, &ge);
            const int packed = q->rank == 5;
            float *qkv[3], *dqkv[3];
            qkv_ptrs(st, &in->in[1], q, qkv);
            qkv_ptrs(st, &in->out[0], q, dqkv);
            rc = cu_attention_bwd_tc(dqkv[0], dqkv[1], dqkv[2], dptr(st, &in->in[0]), qkv[0],
                                     qkv[1], qkv[2], dptr(st, &in->in[packed ? 2 : 4]),
                                     dptr(st, &in->in[packed ? 3 : 5]), scratch, &ge,
                                     (int)in->a.attention.causal, (float)in->a.attention.scale, s);
            break;
        }
        rc = cu_attention_bwd(dptr(st, &in->out[0]), dptr(st, &in->out[1]), dptr(st, &in->out[2]),
                              dptr(st, &in->in[0]), dptr(st, q), dptr(st, &in->in[2]),
                              dptr(st, &in->in[3]), dptr(st, &in->in[4]), dptr(st, &in->in[5]),
                              scratch, q->dims[0] * q->dims[1], q->dims[2], q->dims[3],
                              (int)in->a.attention.causal, (float)in->a.attention.scale, s);
        break;
    }
    case TS_OP_CONV:
    case TS_OP_CONV_BWD_DATA:
    case TS_OP_CONV_BWD_WEIGHT: return cu_conv_run(st, prog, i, o->conv);
    case TS_OP_BATCH_NORM: {
        const ts_batch_norm_attrs *a = &in->a.batch_norm;
        const int aff = a->affine != 0, cl = a->channels_last != 0;
        int64_t n, c, sp;
        cu_bn_shape(&in->in[0], cl, &n, &c, &sp);
        rc = cu_batch_norm(dptr(st, &in->out[0]), dptr(st, &in->out[1]), dptr(st, &in->out[2]),
                           dptr(st, &in->in[1 + 2 * aff]), dptr(st, &in->in[2 + 2 * aff]),
                           dptr(st, &in->in[0]), aff ? dptr(st, &in->in[1]) : NULL,
                           aff ? dptr(st, &in->in[2]) : NULL, n, c, sp, cl, a->training != 0,
                           a->relu != 0, a->momentum, a->eps, scratch, s);
        break;
    }
    case TS_OP_BATCH_NORM_BWD: {
        const ts_batch_norm_attrs *a = &in->a.batch_norm;
        const int aff = a->affine != 0, relu = a->relu != 0, cl = a->channels_last != 0;
        int64_t n, c, sp;
        cu_bn_shape(&in->in[1], cl, &n, &c, &sp);
        rc = cu_batch_norm_bwd(
            dptr(st, &in->out[0]), aff ? dptr(st, &in->out[1]) : NULL,
            aff ? dptr(st, &in->out[2]) : NULL, dptr(st, &in->in[0]), dptr(st, &in->in[1]),
            dptr(st, &in->in[2]), dptr(st, &in->in[3]), aff ? dptr(st, &in->in[4]) : NULL,
            aff && relu ? dptr(st, &in->in[5]) : NULL, n, c, sp, cl, relu, scratch, s);
        break;
    }
    case TS_OP_POOL: {
        cu_pool_geo q;
        cu_pool_geo_of(&q, &in->a.pool, &in->in[0], &in->out[0]);
        rc = cu_pool(dptr(st, &in->out[0]), dptr(st, &in->in[0]), &q, s);
        break;
    }
    case TS_OP_POOL_BWD: {
        cu_pool_geo q;
        cu_pool_geo_of(&q, &in->a.pool, &in->out[0], &in->in[0]);
        rc = cu_pool_bwd(dptr(st, &in->out[0]), dptr(st, &in->in[0]),
                         in->n_in > 1 ? dptr(st, &in->in[1]) : NULL, &q, s);
        break;
    }
    case TS_OP_ADAM_UPDATE: {
        const unsigned char *t = st->dev + st->tables_off + o->table_off;
        int has_coef = in->a.adam.has_coef != 0;
        rc = cu_adam((float *const *)t,
                     (const int64_t *)(t + (size_t)o->n_groups * 4 * sizeof(void *)), o->n_groups,
                     o->max_size, st->d_step, has_coef ? dptr(st, &in->in[in->n_in - 1]) : NULL,
                     (int)in->a.adam.decoupled, in->a.adam.beta1, in->a.adam.beta2, in->a.adam.eps,
                     in->a.adam.weight_decay, s);
        break;
    }
    case TS_OP_SGD_UPDATE: {
        const unsigned char *t = st->dev + st->tables_off + o->table_off;
        const ts_sgd_attrs *a = &in->a.sgd;
        int per = 2 + (a->has_buf != 0);
        rc = cu_sgd((float *const *)t,
                    (const int64_t *)(t + (size_t)o->n_groups * per * sizeof(void *)), o->n_groups,
                    per, o->max_size, st->d_step,
                    a->has_coef ? dptr(st, &in->in[in->n_in - 1]) : NULL, a->momentum, a->dampening,
                    a->weight_decay, a->nesterov != 0, s);
        break;
    }
    case TS_OP_CLIP_COEF: {
        const unsigned char *t = st->dev + st->tables_off + o->table_off;
        rc = cu_clip_coef(dptr(st, &in->out[0]), (const float *const *)t,
                          (const int64_t *)(t + (size_t)o->n_groups * sizeof(void *)), o->n_groups,
                          in->a.clip.max_norm, scratch, s);
        break;
    }
    case TS_OP_UNSCALE_GRADS: {
        const unsigned char *t = st->dev + st->tables_off + o->table_off;
        rc = cu_unscale(dptr(st, &in->out[0]), (float *const *)t,
                        (const int64_t *)(t + (size_t)o->n_groups * sizeof(void *)), o->n_groups,
                        o->max_size, dptr(st, &in->in[0]), scratch, s);
        break;
    }
    case TS_OP_GRAD_STATS:
        rc = cu_grad_stats(dptr(st, &in->out[0]), dptr(st, &in->in[0]), cu_numel(&in->in[0]),
                           scratch, s);
        break;
    default: rc = cu_eltwise(&o->ew, s); /* elementwise ops, fused_eltwise, expand */
    }
    return rc ? cu_err((cudaError_t)rc, in->name, in->label) : TS_OK;
}
