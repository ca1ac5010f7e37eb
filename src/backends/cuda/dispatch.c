/* The CUDA backend's instructions: which ops and dtypes it runs and what each
 * instruction needs (planned once at prepare: elementwise programs, GEMM
 * plans, optimizer tables, scratch); dispatch_run.c enqueues them each step.
 * Every check that can fail happens in cu_plan_ins, so a step only
 * enqueues kernels; an op or operand it cannot run is a TS_ERR_UNSUPPORTED
 * naming the instruction, the op and the reason. */
#include <stdlib.h>
#include <string.h>
#include "backends/cuda/cuda.h"
#include "backends/cuda/operands.h"

/* The fused_eltwise program's encoding (src/ops/fused.h, which a backend
 * may not include): per instruction TS_FUSE_REC words: op, three source
 * registers, then the op's attributes (the first 8 words of its ts_attrs). */
_Static_assert(CU_ATTN_TC_HD == TS_CUDA_PACKED_ATTENTION_HD,
               "the packed attention the loader announces is the tensor-core kernels'");

#define FUSE_REC        12
#define FUSE_ATTR_WORDS 8

int cu_supports_op(int op) {
    switch (op) {
    case TS_OP_ADD:
    case TS_OP_SUB:
    case TS_OP_MUL:
    case TS_OP_DIV:
    case TS_OP_MAXIMUM:
    case TS_OP_MINIMUM:
    case TS_OP_MAXMIN_BWD:
    case TS_OP_WHERE:
    case TS_OP_NEG:
    case TS_OP_EXP:
    case TS_OP_LOG:
    case TS_OP_SQRT:
    case TS_OP_RSQRT:
    case TS_OP_ABS:
    case TS_OP_RELU:
    case TS_OP_SIGMOID:
    case TS_OP_TANH:
    case TS_OP_POW_SCALAR:
    case TS_OP_LEAKY_RELU:
    case TS_OP_AFFINE_SCALAR:
    case TS_OP_GELU:
    case TS_OP_UNARY_BWD:
    case TS_OP_FUSED_ELTWISE:
    case TS_OP_EXPAND:
    case TS_OP_CAST:
    case TS_OP_MATMUL:
    case TS_OP_MATMUL_EPI:
    case TS_OP_REDUCE_SUM:
    case TS_OP_RESHAPE:
    case TS_OP_PERMUTE:
    case TS_OP_CONCAT:
    case TS_OP_SLICE:
    case TS_OP_SLICE_BWD:
    case TS_OP_GATHER:
    case TS_OP_SCATTER_ADD:
    case TS_OP_LAYER_NORM:
    case TS_OP_LAYER_NORM_BWD:
    case TS_OP_CROSS_ENTROPY:
    case TS_OP_CROSS_ENTROPY_BWD:
    case TS_OP_ATTENTION:
    case TS_OP_ATTENTION_BWD:
    case TS_OP_ADAM_UPDATE:
    case TS_OP_SGD_UPDATE:
    case TS_OP_CLIP_COEF:
    case TS_OP_UNSCALE_GRADS:
    case TS_OP_GRAD_STATS:
    case TS_OP_CONV: /* conv.c: through cuDNN (refused at prepare when built without it) */
    case TS_OP_CONV_BWD_DATA:
    case TS_OP_CONV_BWD_WEIGHT:
    case TS_OP_BATCH_NORM:
    case TS_OP_BATCH_NORM_BWD:
    case TS_OP_POOL:
    case TS_OP_POOL_BWD: return 1;
    default: return 0;
    }
}

static ts_status unsupported(const ts_program *prog, int i, const char *why) {
    const ts_instr *in = &prog->ins[i];
    return cu_fail(TS_ERR_UNSUPPORTED, "instruction %d (%s, '%s'): %s", i, in->name,
                   in->label ? in->label : "", why);
}

static int all_f32(const ts_instr *in) {
    for (int j = 0; j < in->n_in; j++)
        if (in->in[j].dtype != TS_F32) return 0;
    for (int j = 0; j < in->n_out; j++)
        if (in->out[j].dtype != TS_F32) return 0;
    return 1;
}

/* ---- elementwise programs ---------------------------------------------- */

/* Input j of an elementwise program reading x broadcast to out
 * (right-aligned, numpy rules). */
static void ew_input(cu_ew_input *e, const cu_state *st, const ts_operand *x,
                     const ts_operand *out) {
    memset(e, 0, sizeof *e);
    e->p = cu_at(st, x->off);
    e->u8 = x->dtype == TS_U8;
    e->full = cu_numel(x) == cu_numel(out);
    int lead = out->rank - x->rank;
    int64_t str = 1;
    for (int d = out->rank - 1; d >= 0; d--) {
        int xd = d - lead;
        if (xd < 0) continue;
        e->stride[d] = x->dims[xd] == 1 && out->dims[d] != 1 ? 0 : str;
        str *= x->dims[xd];
    }
}

static void ew_shape(cu_ew_prog *p, const cu_state *st, const ts_operand *out) {
    p->rank = out->rank;
    p->n = cu_numel(out);
    for (int d = 0; d < out->rank; d++) p->dims[d] = out->dims[d];
    p->out = cu_at(st, out->off);
}

/* One instruction from an op and its attributes. */
static void ew_instr(cu_ew_instr *I, int op, const ts_attrs *a, int s0, int s1, int s2) {
    memset(I, 0, sizeof *I);
    I->op = op;
    I->src[0] = s0, I->src[1] = s1, I->src[2] = s2;
    const ts_unary_attrs *u = op == TS_OP_UNARY_BWD ? &a->unary_bwd.fwd : &a->unary;
    if (op == TS_OP_UNARY_BWD)
        I->fwd_op = (int)a->unary_bwd.fwd_op, I->side = (int)a->unary_bwd.side;
    if (op == TS_OP_MAXMIN_BWD) I->min_ = (int)a->maxmin.min, I->side = (int)a->maxmin.side;
    if (op != TS_OP_MAXMIN_BWD) {
        I->approx = (int)u->approx;
        I->exponent = (float)u->exponent, I->slope = (float)u->slope;
        I->scale = (float)u->scale, I->shift = (float)u->shift;
    }
}

static int ew_unary_op(int op) {
    return op >= TS_OP_NEG && op <= TS_OP_GELU && op != TS_OP_CAST;
}

static int ew_bwd_ok(int fwd) {
    switch (fwd) {
    case TS_OP_EXP:
    case TS_OP_LOG:
    case TS_OP_SQRT:
    case TS_OP_RSQRT:
    case TS_OP_ABS:
    case TS_OP_RELU:
    case TS_OP_SIGMOID:
    case TS_OP_TANH:
    case TS_OP_POW_SCALAR:
    case TS_OP_LEAKY_RELU:
    case TS_OP_GELU: return 1;
    default: return 0;
    }
}

static ts_status plan_eltwise(cu_state *st, const ts_program *prog, const ts_runtime *rt, int i) {
    const ts_instr *in = &prog->ins[i];
    cu_ew_prog *p = &st->ops[i].ew;
    memset(p, 0, sizeof *p);
    const ts_operand *out = &in->out[0];
    if (out->dtype != TS_F32 || out->rank > CU_MAX_RANK) return unsupported(prog, i, "needs f32");
    ew_shape(p, st, out);
    int n_ext = in->op == TS_OP_FUSED_ELTWISE ? (int)in->a.fused.n_ext : in->n_in;
    if (n_ext < 1 || n_ext > CU_EW_MAX_EXT) return unsupported(prog, i, "too many inputs");
    for (int j = 0; j < n_ext; j++) {
        const ts_operand *x = &in->in[j];
        if (x->dtype != TS_F32 &&
            !(x->dtype == TS_U8 && (in->op == TS_OP_WHERE || in->op == TS_OP_FUSED_ELTWISE)))
            return unsupported(prog, i, "an input is not f32");
        ew_input(&p->in[j], st, x, out);
    }
    p->n_ext = n_ext;
    if (in->op == TS_OP_FUSED_ELTWISE) {
        int n = (int)in->a.fused.n_instr;
        const ts_operand *po = &in->in[n_ext];
        if (n < 1 || n > CU_EW_MAX_INSTR || po->dtype != TS_I64 ||
            cu_numel(po) != (int64_t)n * FUSE_REC)
            return unsupported(prog, i, "a fused program of an unexpected size");
        /* The program is a constant: its words are in the host arena. */
        const int64_t *rec = (const int64_t *)ts_rt_at(rt, &prog->layout, po->off);
        for (int t = 0; t < n; t++, rec += FUSE_REC) {
            int op = (int)rec[0];
            ts_attrs a = ts_attrs_zero();
            memcpy(&a, &rec[4], FUSE_ATTR_WORDS * sizeof(int64_t));
            int ns = op == TS_OP_WHERE || op == TS_OP_MAXMIN_BWD                         ? 3
                     : op == TS_OP_UNARY_BWD || (op >= TS_OP_ADD && op <= TS_OP_MINIMUM) ? 2
                                                                                         : 1;
            if (!(ns > 1 || ew_unary_op(op)) ||
                (op == TS_OP_UNARY_BWD && !ew_bwd_ok((int)a.unary_bwd.fwd_op)))
                return unsupported(prog, i, "a fused instruction this backend has no rule for");
            for (int j = 0; j < ns; j++)
                if (rec[1 + j] < 0 || rec[1 + j] >= n_ext + t)
                    return unsupported(prog, i, "a fused instruction reads a bad register");
            ew_instr(&p->ins[t], op, &a, (int)rec[1], (int)(ns > 1 ? rec[2] : 0),
                     (int)(ns > 2 ? rec[3] : 0));
        }
        p->n_instr = n;
        return TS_OK;
    }
    if (in->op == TS_OP_EXPAND) {
        ew_instr(&p->ins[0], -1, &in->a, 0, 0, 0);
    } else if (in->op == TS_OP_UNARY_BWD) {
        if (!ew_bwd_ok((int)in->a.unary_bwd.fwd_op))
            return unsupported(prog, i, "no gradient rule for its forward op");
        /* the gelu_grad pass does not run for this backend (passes/pipeline.c) */
        if (in->a.unary_bwd.side == 2)
            return unsupported(prog, i, "a gradient from the saved derivative (side 2)");
        ew_instr(&p->ins[0], in->op, &in->a, 0, 1, 0);
    } else {
        ew_instr(&p->ins[0], in->op, &in->a, 0, in->n_in > 1 ? 1 : 0, in->n_in > 2 ? 2 : 0);
    }
    p->n_instr = 1;
    return TS_OK;
}

/* ---- planning ------------------------------------------------------------ */

size_t cu_table_bytes(const ts_program *prog, int i) {
    const ts_instr *in = &prog->ins[i];
    if (in->op == TS_OP_ADAM_UPDATE) {
        size_t g = (size_t)(in->n_in / 4);
        return g * (4 * sizeof(void *) + sizeof(int64_t)) + 64;
    }
    if (in->op == TS_OP_SGD_UPDATE) {
        size_t per = 2 + (in->a.sgd.has_buf != 0), g = (size_t)in->n_in / per;
        return g * (per * sizeof(void *) + sizeof(int64_t)) + 64;
    }
    if (in->op == TS_OP_CLIP_COEF || in->op == TS_OP_UNSCALE_GRADS)
        return (size_t)in->n_in * (sizeof(void *) + sizeof(int64_t)) + 64;
    return 0;
}

/* ---- batch norm and pooling (bn_pool.cu) ---------------------------------- */

static ts_status plan_bn(const ts_program *prog, int i, cu_op *o) {
    const ts_instr *in = &prog->ins[i];
    const ts_batch_norm_attrs *a = &in->a.batch_norm;
    if (!all_f32(in)) return unsupported(prog, i, "needs f32");
    if (a->masked) return unsupported(prog, i, "no CUDA kernel for the row-masked batch norm yet");
    const ts_operand *x = &in->in[in->op == TS_OP_BATCH_NORM ? 0 : 1];
    int64_t n, c, s;
    cu_bn_shape(x, a->channels_last != 0, &n, &c, &s);
    if (c > 65535) return unsupported(prog, i, "more than 65535 channels");
    if (in->op == TS_OP_BATCH_NORM && a->training && n * s < 2)
        return unsupported(prog, i, "training needs more than one value per channel");
    o->scratch = cu_batch_norm_scratch(n, c, s);
    return TS_OK;
}

static ts_status plan_pool(const ts_program *prog, int i) {
    const ts_instr *in = &prog->ins[i];
    if (!all_f32(in)) return unsupported(prog, i, "needs f32");
    if (in->a.pool.nd < 1 || in->a.pool.nd > 3 || in->a.pool.mode < 0 || in->a.pool.mode > 3)
        return unsupported(prog, i, "unknown pooling geometry");
    return TS_OK;
}

ts_status cu_plan_ins(cu_state *st, const ts_program *prog, const ts_runtime *rt, int i) {
    const ts_instr *in = &prog->ins[i];
    cu_op *o = &st->ops[i];
    if (!cu_supports_op(in->op)) return unsupported(prog, i, "this op has no CUDA kernel yet");
    if (in->op == TS_OP_GELU && in->a.unary.out_grad) /* gelu_grad runs for host backends only */
        return unsupported(prog, i, "a gelu that also writes its derivative (out_grad)");
    for (int j = 0; j < in->n_in; j++)
        if (in->in[j].rank > CU_MAX_RANK) return unsupported(prog, i, "rank above 8");
    switch (in->op) {
    case TS_OP_FUSED_ELTWISE:
    case TS_OP_EXPAND:
    case TS_OP_UNARY_BWD:
    case TS_OP_MAXMIN_BWD:
    case TS_OP_WHERE: return plan_eltwise(st, prog, rt, i);
    case TS_OP_CAST:
        if (cu_cast_kind(in->in[0].dtype) < 0 || cu_cast_kind(in->out[0].dtype) < 0)
            return unsupported(prog, i, "casts only between f32, bf16 and f16");
        return TS_OK;
    case TS_OP_MATMUL:
    case TS_OP_MATMUL_EPI: return cu_gemm_plan(st, prog, i, &o->gemm);
    case TS_OP_RESHAPE:
    case TS_OP_PERMUTE:
    case TS_OP_CONCAT:
    case TS_OP_SLICE:
    case TS_OP_SLICE_BWD:
    case TS_OP_GATHER: return TS_OK; /* any dtype: bytes are moved */
    case TS_OP_SCATTER_ADD: {
        if (in->out[0].dtype != TS_F32 || in->in[0].dtype != TS_F32)
            return unsupported(prog, i, "needs f32");
        if (cu_numel(&in->in[1]) >= INT32_MAX || in->a.index.extent >= INT32_MAX)
            return unsupported(prog, i, "more than 2^31 indices or rows");
        o->scratch =
            cu_scatter_add_scratch(cu_numel(&in->in[1]), in->out[0].dims[in->a.index.axis]);
        if (!o->scratch) return unsupported(prog, i, "CUB could not size its sort");
        return TS_OK;
    }
    case TS_OP_LAYER_NORM_BWD: {
        if (!all_f32(in)) return unsupported(prog, i, "needs f32");
        const ts_operand *x = &in->in[1];
        o->scratch =
            cu_layer_norm_bwd_scratch(cu_prod(x->dims, 0, x->rank - 1), x->dims[x->rank - 1]);
        return TS_OK;
    }
    case TS_OP_CROSS_ENTROPY:
    case TS_OP_CROSS_ENTROPY_BWD: {
        int xi = in->op == TS_OP_CROSS_ENTROPY ? 0 : 1, ti = xi + 1;
        if (in->in[xi].dtype != TS_F32 ||
            (in->in[ti].dtype != TS_I32 && in->in[ti].dtype != TS_I64) ||
            in->out[0].dtype != TS_F32)
            return unsupported(prog, i, "needs f32 logits and i32/i64 targets");
        o->scratch = (size_t)(3 * in->in[xi].dims[0] + 1) * sizeof(double);
        return TS_OK;
    }
    case TS_OP_CONV:
    case TS_OP_CONV_BWD_DATA:
    case TS_OP_CONV_BWD_WEIGHT: return cu_conv_plan(st, prog, i, &o->conv, &o->scratch);
    case TS_OP_BATCH_NORM:
    case TS_OP_BATCH_NORM_BWD: return plan_bn(prog, i, o);
    case TS_OP_POOL:
    case TS_OP_POOL_BWD: return plan_pool(prog, i);
    case TS_OP_ATTENTION:
    case TS_OP_ATTENTION_BWD: {
        if (!all_f32(in) || in->a.attention.low)
            return unsupported(prog, i, "needs f32 operands (a bf16 plan rounds them itself)");
        const ts_operand *q = &in->in[in->op == TS_OP_ATTENTION ? 0 : 1];
        if ((q->rank != 4 && q->rank != 5) || q->dims[q->rank - 1] > 256)
            return unsupported(prog, i, "needs [B, H, T, hd <= 256] or the packed qkv");
        cu_attn_geom ge;
        cu_attn_geom_of(q, &ge);
        if (in->op == TS_OP_ATTENTION_BWD)
            o->scratch = (size_t)(ge.B * ge.H * ge.t) * sizeof(float);
        /* bf16 plans round attention's operands to bf16 anyway (docs/precision.md): there
         * the tensor-core kernels run, where the head size and alignment fit them */
        const void *ptrs[9];
        int n = 0;
        for (int j = 0; j < in->n_in && n < 9; j++) ptrs[n++] = cu_at(st, in->in[j].off);
        for (int j = 0; j < in->n_out && n < 9; j++) ptrs[n++] = cu_at(st, in->out[j].off);
        o->attn_tc = prog->opt.precision.compute == TS_BF16 && ge.B * ge.H <= 65535 &&
                     cu_attention_tc_ok(q->dims[q->rank - 1], ptrs, n);
        if (q->rank == 5 && !o->attn_tc)
            return unsupported(prog, i,
                               "the packed attention (qkv) runs on the tensor-core kernels only: "
                               "bf16 plans, head size 64");
        if (o->attn_tc && cu_attention_tc_setup() != 0)
            return unsupported(prog, i,
                               "the tensor-core attention's shared memory could not be set");
        return TS_OK;
    }
    case TS_OP_ADAM_UPDATE: {
        if (!all_f32(in)) return unsupported(prog, i, "needs f32 parameters and state");
        int has_coef = in->a.adam.has_coef != 0;
        if ((in->n_in - has_coef) % 4 != 0 || in->n_in - has_coef < 4)
            return unsupported(prog, i, "inputs are not (p, g, m, v) groups");
        o->n_groups = (in->n_in - has_coef) / 4;
        o->max_size = 0;
        for (int g = 0; g < o->n_groups; g++)
            if (cu_numel(&in->in[4 * g]) > o->max_size) o->max_size = cu_numel(&in->in[4 * g]);
        return TS_OK;
    }
    case TS_OP_SGD_UPDATE: {
        if (!all_f32(in)) return unsupported(prog, i, "needs f32 parameters and state");
        int has_coef = in->a.sgd.has_coef != 0, per = 2 + (in->a.sgd.has_buf != 0);
        if (in->a.sgd.n_low || (in->n_in - has_coef) % per != 0 || in->n_in - has_coef < per)
            return unsupported(prog, i, "inputs are not (p, g[, buf]) groups");
        o->n_groups = (in->n_in - has_coef) / per;
        o->max_size = 0;
        for (int g = 0; g < o->n_groups; g++)
            if (cu_numel(&in->in[per * g]) > o->max_size) o->max_size = cu_numel(&in->in[per * g]);
        return TS_OK;
    }
    case TS_OP_UNSCALE_GRADS:
        if (!all_f32(in) || cu_numel(&in->in[0]) != 1)
            return unsupported(prog, i, "needs f32 gradients and scale");
        o->n_groups = in->n_in - 1;
        o->max_size = 0;
        for (int g = 1; g < in->n_in; g++)
            if (cu_numel(&in->in[g]) > o->max_size) o->max_size = cu_numel(&in->in[g]);
        o->scratch = (size_t)in->n_in * sizeof(int);
        return TS_OK;
    case TS_OP_GRAD_STATS:
        if (in->in[0].dtype != TS_F32) return unsupported(prog, i, "needs an f32 gradient");
        o->scratch = 3 * CU_STATS_BLOCKS * sizeof(double);
        return TS_OK;
    case TS_OP_CLIP_COEF:
        if (!all_f32(in)) return unsupported(prog, i, "needs f32 gradients");
        o->n_groups = in->n_in;
        o->scratch = (size_t)in->n_in * sizeof(double);
        return TS_OK;
    default:
        if (!all_f32(in)) return unsupported(prog, i, "needs f32");
        if (in->op == TS_OP_REDUCE_SUM) {
            int lead = 0; /* the reduced axes are 0..lead-1: column sums */
            const ts_operand *x = &in->in[0];
            while (lead < x->rank && (in->a.reduce.axes >> lead & 1)) lead++;
            if (lead > 0 && lead < x->rank && in->a.reduce.axes == ((int64_t)1 << lead) - 1)
                o->scratch =
                    cu_col_sum_scratch(cu_prod(x->dims, 0, lead), cu_prod(x->dims, lead, x->rank));
            return TS_OK;
        }
        if (in->op == TS_OP_LAYER_NORM) return TS_OK;
        return plan_eltwise(st, prog, rt, i); /* unary and binary elementwise ops */
    }
}

/* Pointer and size tables of the fused optimizer and clipping, once. */
ts_status cu_write_tables(cu_state *st, const ts_program *prog, int i) {
    const ts_instr *in = &prog->ins[i];
    cu_op *o = &st->ops[i];
    size_t bytes = cu_table_bytes(prog, i);
    if (!bytes) return TS_OK;
    /* adam: (p, g, m, v) per group; clip: one gradient each; unscale: the
     * gradients after the scale */
    int g = o->n_groups, per = in->op == TS_OP_ADAM_UPDATE  ? 4
                               : in->op == TS_OP_SGD_UPDATE ? 2 + (in->a.sgd.has_buf != 0)
                                                            : 1;
    int first = in->op == TS_OP_UNSCALE_GRADS ? 1 : 0;
    unsigned char *host = calloc(1, bytes);
    if (!host) return cu_fail(TS_ERR_NOMEM, "optimizer tables of '%s'", in->label);
    void **ptrs = (void **)host;
    int64_t *sizes = (int64_t *)(host + (size_t)g * per * sizeof(void *));
    for (int k = 0; k < g; k++) {
        for (int j = 0; j < per; j++)
            ptrs[per * k + j] = cu_at(st, in->in[first + per * k + j].off);
        sizes[k] = cu_numel(&in->in[first + per * k]);
    }
    cudaError_t e =
        cudaMemcpy(st->dev + st->tables_off + o->table_off, host, bytes, cudaMemcpyHostToDevice);
    free(host);
    return e == cudaSuccess ? TS_OK : cu_err(e, "writing the optimizer tables", in->label);
}
