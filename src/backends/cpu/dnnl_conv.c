/* dnnl_conv.c — conv instructions on oneDNN primitives (see dnnl_conv.h). */
#include "backends/cpu/dnnl_conv.h"
#include "backends/cpu/dnnl_conv_wgrad.h"
#include "backends/cpu/dnnl_conv_winograd.h"

#include <dnnl.h>
#include <dnnl_debug.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

enum { DC_FWD, DC_BWD_DATA, DC_BWD_WEIGHT };
/* Operand slots, whatever the direction: src is the conv's input space,
 * dst its output space. */
enum { S_SRC, S_WEI, S_DST, S_BIAS, S_COUNT };

typedef struct dc_arg {
    int used, out;                /* out: the primitive writes it */
    int dnnl_arg;                 /* DNNL_ARG_* */
    dnnl_memory_desc_t plain, md; /* the arena's layout; the primitive's */
    dnnl_primitive_t reorder;     /* plain -> md (inputs) or md -> plain (output); NULL if equal */
    size_t off;                   /* the reordered copy, within a lane's scratch */
} dc_arg;

/* What one thread needs to run the primitive: its own memory objects (their
 * data handles change per run) and stream. */
typedef struct dc_lane {
    dnnl_stream_t stream;
    dnnl_memory_t mem[S_COUNT], plain[S_COUNT], pad;
} dc_lane;

typedef struct dconv {
    int op, kind;
    char what[240];
    dnnl_primitive_t prim;
    dc_arg a[S_COUNT];
    size_t pad_bytes;  /* the primitive's own scratchpad, at offset 0 of a lane */
    size_t lane_bytes; /* scratchpad + reordered copies */
    int nlanes;
    dc_lane *lanes;
    /* backward weights per image: batch, bytes per image of src and dst,
     * weight elements, where the per-image weight gradients start */
    int per_image;
    int64_t N, wnumel;
    size_t src_img, dst_img, partial_off;
    /* conv_transpose's bias: added after the primitive, per (n, channel) plane
     * (channels last: to every row of bias_C channels) */
    int64_t bias_C, bias_inner;
    int channels_last;
    size_t scratch_bytes;
    /* backward weights on tessel's per-tap kernel instead of the primitive */
    int wgrad;
    ts_wgrad_shape ws;
    /* forward or backward data on tessel's Winograd kernel instead */
    int wino;
    ts_wino wn;
} dconv;

/* ---- engine ------------------------------------------------------------- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t g_engine;
static dnnl_status_t g_engine_status = dnnl_success;

static void init_engine(void) {
    g_engine_status = dnnl_engine_create(&g_engine, dnnl_cpu, 0);
}

static ts_status dnnl_fail(dnnl_status_t st, const dconv *c, const char *call) {
    ts_status s = st == dnnl_out_of_memory       ? TS_ERR_NOMEM
                  : st == dnnl_unimplemented     ? TS_ERR_UNSUPPORTED
                  : st == dnnl_invalid_arguments ? TS_ERR_INVALID
                                                 : TS_ERR_INTERNAL;
    return ts_fail(s, "%s: %s failed: %s", c->what, call, dnnl_status2str(st));
}

#define TRY(c, call)                                                                               \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) return dnnl_fail(st_, (c), #call);                                \
    } while (0)

static void dconv_free(void *v) {
    dconv *c = v;
    if (!c) return;
    for (int l = 0; c->lanes && l < c->nlanes; l++) {
        dc_lane *L = &c->lanes[l];
        for (int i = 0; i < S_COUNT; i++) {
            if (L->mem[i]) dnnl_memory_destroy(L->mem[i]);
            if (L->plain[i]) dnnl_memory_destroy(L->plain[i]);
        }
        if (L->pad) dnnl_memory_destroy(L->pad);
        if (L->stream) dnnl_stream_destroy(L->stream);
    }
    free(c->lanes);
    for (int i = 0; i < S_COUNT; i++)
        if (c->a[i].reorder) dnnl_primitive_destroy(c->a[i].reorder);
    if (c->prim) dnnl_primitive_destroy(c->prim);
    free(c);
}

/* ---- creation ----------------------------------------------------------- */

static dnnl_format_tag_t plain_tag(int rank) {
    switch (rank) {
    case 1: return dnnl_a;
    case 3: return dnnl_abc;
    case 4: return dnnl_abcd;
    case 5: return dnnl_abcde;
    default: return dnnl_abcdef;
    }
}

static dnnl_format_tag_t channels_last_tag(int rank) {
    return rank == 3 ? dnnl_acb : rank == 4 ? dnnl_acdb : dnnl_acdeb;
}

/* Plain and "any" descriptors of one operand. dims[0] is replaced by
 * `batch` when batch > 0 (per-image primitives). */
static dnnl_status_t init_mds(dc_arg *a, int rank, const int64_t *dims, int64_t batch,
                              dnnl_data_type_t dt) {
    dnnl_dims_t d;
    for (int i = 0; i < rank; i++) d[i] = dims[i];
    if (batch > 0) d[0] = batch;
    dnnl_status_t st = dnnl_memory_desc_init_by_tag(&a->plain, rank, d, dt, plain_tag(rank));
    if (st == dnnl_success)
        st = dnnl_memory_desc_init_by_tag(&a->md, rank, d, dt, dnnl_format_tag_any);
    return st;
}

/* An activation stored channels last ([N, spatial..., C]): oneDNN's dims
 * are still [N, C, spatial...], its memory tag says where C lives, and the
 * primitive is asked for that same layout, so nothing is reordered. */
static dnnl_status_t init_mds_cl(dc_arg *a, int rank, const int64_t *dims, int64_t batch,
                                 dnnl_data_type_t dt) {
    dnnl_dims_t d;
    d[0] = batch > 0 ? batch : dims[0];
    d[1] = dims[rank - 1];
    for (int i = 2; i < rank; i++) d[i] = dims[i - 1];
    dnnl_status_t st =
        dnnl_memory_desc_init_by_tag(&a->plain, rank, d, dt, channels_last_tag(rank));
    a->md = a->plain;
    return st;
}

static dnnl_status_t make_attr(dnnl_primitive_attr_t *attr) {
    dnnl_status_t st = dnnl_primitive_attr_create(attr);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_set_fpmath_mode(*attr, dnnl_fpmath_mode_strict);
    return st;
}

/* The tensors of an instruction in slot order (src, weights, dst, bias). */
static void slot_tensors(int op, const ts_tensor *in, int n_in, const ts_tensor *out,
                         const ts_tensor **t) {
    t[S_BIAS] = NULL;
    switch (op) {
    case TS_OP_CONV:
        t[S_SRC] = &in[0], t[S_WEI] = &in[1], t[S_DST] = out;
        if (n_in > 2) t[S_BIAS] = &in[2];
        break;
    case TS_OP_CONV_BWD_WEIGHT: t[S_SRC] = &in[1], t[S_WEI] = out, t[S_DST] = &in[0]; break;
    default: /* conv_bwd_data (dy, w) and conv_transpose (x, w[, b]) */
        t[S_SRC] = out, t[S_WEI] = &in[1], t[S_DST] = &in[0];
        if (n_in > 2) t[S_BIAS] = &in[2];
        break;
    }
}

/* oneDNN's im2col + GEMM convolution ("gemm:jit", "x64:gemm:jit"), not its
 * brgemm-based kernels ("brgconv...", "brgemm..."): a "gemm:" that starts the
 * name or follows a ':'. */
static int is_im2col_gemm(const char *impl) {
    for (const char *p = strstr(impl, "gemm:"); p; p = strstr(p + 1, "gemm:"))
        if (p == impl || p[-1] == ':') return 1;
    return 0;
}

/* The shape of a backward-weights instruction for dnnl_conv_wgrad.h; 0 if
 * the kernel does not apply (f32 channels-last, one group, stride 1, no
 * dilation, 2D or 3D, C a multiple of 8, an AVX2 + FMA CPU). */
static int wgrad_shape(const ts_instr *in, const ts_tensor *const *t, ts_wgrad_shape *ws) {
    const int nd = (int)in->a.conv.nd;
    if (in->a.conv.low || !in->a.conv.channels_last || in->a.conv.groups != 1 || nd < 2 || nd > 3)
        return 0;
    for (int j = 0; j < nd; j++)
        if (in->a.conv.stride[j] != 1 || in->a.conv.dilation[j] != 1) return 0;
    const int off = 3 - nd; /* a 2D conv is 3D with D = 1 */
    memset(ws, 0, sizeof *ws);
    ws->N = t[S_SRC]->dims[0];
    ws->C = t[S_SRC]->dims[nd + 1];
    ws->O = t[S_DST]->dims[nd + 1];
    for (int j = 0; j < 3; j++) ws->in[j] = ws->out[j] = ws->k[j] = 1;
    for (int j = 0; j < nd; j++) {
        ws->in[off + j] = t[S_SRC]->dims[1 + j];
        ws->out[off + j] = t[S_DST]->dims[1 + j];
        ws->k[off + j] = t[S_WEI]->dims[2 + j];
        ws->pad[off + j] = in->a.conv.padding[j];
    }
    return t[S_WEI]->dims[0] == ws->O && t[S_WEI]->dims[1] == ws->C && ts_conv_wgrad_usable(ws);
}

/* The Winograd kernel's shape for a conv or conv_bwd_data instruction; 0
 * if it does not apply: f32 channels-last 3-D, one group, 3^3 kernel,
 * stride 1, padding 1, no dilation, no bias, at least 16 input and output
 * channels (the shapes measured faster than oneDNN's direct kernels in
 * bench/conv_winograd.c), on a CPU that runs it (ts_wino_enabled). */
static int wino_shape(const ts_instr *in, const ts_tensor *const *t, int kind, ts_wino *wn) {
    if ((in->op != TS_OP_CONV && in->op != TS_OP_CONV_BWD_DATA) || in->a.conv.low ||
        !in->a.conv.channels_last || in->a.conv.groups != 1 || in->a.conv.nd != 3 || t[S_BIAS])
        return 0;
    for (int j = 0; j < 3; j++)
        if (in->a.conv.stride[j] != 1 || in->a.conv.dilation[j] != 1 ||
            in->a.conv.padding[j] != 1 || t[S_WEI]->dims[2 + j] != 3 ||
            t[S_SRC]->dims[1 + j] != t[S_DST]->dims[1 + j])
            return 0;
    const int64_t cin = t[S_SRC]->dims[4], cout = t[S_DST]->dims[4];
    if (cin < 16 || cout < 16 || t[S_WEI]->dims[0] != cout || t[S_WEI]->dims[1] != cin) return 0;
    memset(wn, 0, sizeof *wn);
    wn->N = t[S_SRC]->dims[0];
    wn->D = t[S_SRC]->dims[1], wn->H = t[S_SRC]->dims[2], wn->W = t[S_SRC]->dims[3];
    /* backward data: the conv of dy (cout channels) with the transposed,
     * flipped weights, giving dx (cin channels) */
    wn->flip = kind == DC_BWD_DATA;
    wn->C = wn->flip ? cout : cin;
    wn->O = wn->flip ? cin : cout;
    return ts_wino_init(wn) && ts_wino_enabled();
}

/* Create the primitive, its reorders and lanes. Returns TS_ERR_UNSUPPORTED
 * (quietly, for the caller to keep the reference kernel) when oneDNN has no
 * implementation or only its reference one. */
static ts_status dconv_build(dconv *c, const ts_instr *in, const ts_rt_instr *r) {
    const ts_tensor *t[S_COUNT];
    slot_tensors(in->op, r->in, in->n_in, &r->out[0], t);
    int nd = (int)in->a.conv.nd;
    int64_t G = in->a.conv.groups;
    c->op = in->op;
    c->kind = in->op == TS_OP_CONV              ? DC_FWD
              : in->op == TS_OP_CONV_BWD_WEIGHT ? DC_BWD_WEIGHT
                                                : DC_BWD_DATA;
    int64_t batch = 0;
    int nthr = omp_get_max_threads();
    c->N = t[S_SRC]->dims[0];
    if (c->kind != DC_BWD_WEIGHT && wino_shape(in, t, c->kind, &c->wn)) {
        c->wino = 1;
        c->scratch_bytes = ts_wino_scratch(&c->wn, nthr);
        return TS_OK;
    }
    if (c->kind == DC_BWD_WEIGHT) {
        /* Per image, each primitive on one thread: see the header. */
        c->per_image = 1;
        batch = 1;
        c->nlanes = nthr < c->N ? nthr : (int)c->N;
    } else {
        c->nlanes = 1;
    }

    const int cl = in->a.conv.channels_last != 0;
    c->channels_last = cl;
    /* Mixed precision (conv.low): the two tensor operands are bf16
     * (or f16), the written one f32, accumulation f32. */
    dnnl_data_type_t dt[S_COUNT] = {dnnl_f32, dnnl_f32, dnnl_f32, dnnl_f32};
    dnnl_data_type_t lo = dnnl_f32;
    if (in->a.conv.low) {
        const ts_dtype odt = in->in[0].dtype;
        lo = odt == TS_BF16 ? dnnl_bf16 : odt == TS_F16 ? dnnl_f16 : dnnl_data_type_undef;
        if (lo == dnnl_data_type_undef) return TS_ERR_UNSUPPORTED;
        dt[S_SRC] = c->kind == DC_BWD_DATA ? dnnl_f32 : lo;
        dt[S_WEI] = c->kind == DC_BWD_WEIGHT ? dnnl_f32 : lo;
        dt[S_DST] = c->kind == DC_FWD ? dnnl_f32 : lo;
    }
    dnnl_status_t st =
        (cl ? init_mds_cl : init_mds)(&c->a[S_SRC], nd + 2, t[S_SRC]->dims, batch, dt[S_SRC]);
    if (st == dnnl_success)
        st = (cl ? init_mds_cl : init_mds)(&c->a[S_DST], nd + 2, t[S_DST]->dims, batch, dt[S_DST]);
    int64_t wd[TS_MAX_RANK];
    int wr = nd + 2;
    if (G > 1) { /* grouped weights [G, O/G, C/G, k...]: the same memory */
        wd[0] = G;
        wd[1] = t[S_WEI]->dims[0] / G;
        for (int i = 1; i < nd + 2; i++) wd[i + 1] = t[S_WEI]->dims[i];
        wr++;
    } else {
        memcpy(wd, t[S_WEI]->dims, sizeof(int64_t) * (size_t)wr);
    }
    if (st == dnnl_success) st = init_mds(&c->a[S_WEI], wr, wd, 0, dt[S_WEI]);
    /* The forward hint of a backward primitive: the forward conv these
     * operands come from (low src and weights, f32 dst when mixed). */
    dc_arg hint[S_COUNT];
    if (st == dnnl_success)
        st = (cl ? init_mds_cl : init_mds)(&hint[S_SRC], nd + 2, t[S_SRC]->dims, batch, lo);
    if (st == dnnl_success)
        st = (cl ? init_mds_cl : init_mds)(&hint[S_DST], nd + 2, t[S_DST]->dims, batch, dnnl_f32);
    if (st == dnnl_success) st = init_mds(&hint[S_WEI], wr, wd, 0, lo);
    int has_bias = t[S_BIAS] != NULL;
    if (st == dnnl_success && has_bias && c->kind == DC_FWD) {
        st = init_mds(&c->a[S_BIAS], 1, t[S_BIAS]->dims, 0, dnnl_f32);
        c->a[S_BIAS].md = c->a[S_BIAS].plain;
    }
    if (st != dnnl_success) return dnnl_fail(st, c, "dnnl_memory_desc_init_by_tag");
    const dnnl_memory_desc_t *bmd = has_bias && c->kind == DC_FWD ? &c->a[S_BIAS].md : NULL;

    dnnl_dims_t strides, dil, pad;
    for (int j = 0; j < nd; j++) {
        strides[j] = in->a.conv.stride[j];
        pad[j] = in->a.conv.padding[j];
        dil[j] = in->a.conv.dilation[j] - 1; /* oneDNN counts the gaps */
    }
    /* Padding on the right equals the left: oneDNN's output size formula
     * floors like torch's, and the extra rows of conv_bwd_data (< stride)
     * fall in the floor. */
    dnnl_convolution_desc_t fd, bd;
    const dc_arg *fa = c->kind == DC_FWD ? c->a : hint;
    const char *call = "dnnl_dilated_convolution_forward_desc_init";
    st = dnnl_dilated_convolution_forward_desc_init(
        &fd, dnnl_forward_training, dnnl_convolution_direct, &fa[S_SRC].md, &fa[S_WEI].md, bmd,
        &fa[S_DST].md, strides, dil, pad, pad);
    if (st == dnnl_success && c->kind == DC_BWD_DATA)
        call = "dnnl_dilated_convolution_backward_data_desc_init",
        st = dnnl_dilated_convolution_backward_data_desc_init(
            &bd, dnnl_convolution_direct, &c->a[S_SRC].md, &c->a[S_WEI].md, &c->a[S_DST].md,
            strides, dil, pad, pad);
    if (st == dnnl_success && c->kind == DC_BWD_WEIGHT)
        call = "dnnl_dilated_convolution_backward_weights_desc_init",
        st = dnnl_dilated_convolution_backward_weights_desc_init(
            &bd, dnnl_convolution_direct, &c->a[S_SRC].md, &c->a[S_WEI].md, NULL, &c->a[S_DST].md,
            strides, dil, pad, pad);
    /* oneDNN 2.6 refuses some mixed data-type combinations already here
     * (f16 backward data: invalid_arguments): the reference kernel runs. */
    if (st != dnnl_success && lo != dnnl_f32) return TS_ERR_UNSUPPORTED;
    if (st != dnnl_success) return dnnl_fail(st, c, call);

    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    /* A per-image primitive is created for one thread: oneDNN fixes its
     * thread count (and with it the reduction order) here. */
    if (c->per_image) omp_set_num_threads(1);
    st = make_attr(&attr);
    call = "dnnl_primitive_desc_create";
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&fpd, &fd, attr, g_engine, NULL);
    if (st == dnnl_success && c->kind != DC_FWD)
        st = dnnl_primitive_desc_create(&pd, &bd, attr, g_engine, fpd);
    if (c->kind == DC_FWD) pd = fpd, fpd = NULL;
    const char *impl = NULL;
    if (st == dnnl_success &&
        (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
         !impl || !strncmp(impl, "ref", 3)))
        st = dnnl_unimplemented;
    /* oneDNN's im2col + SGEMM backward weights (no JIT kernel for the shape
     * on this CPU): tessel's per-tap kernel is faster where it applies. */
    if (st == dnnl_success && c->kind == DC_BWD_WEIGHT && is_im2col_gemm(impl))
        c->wgrad = wgrad_shape(in, t, &c->ws);
    if (st == dnnl_success) {
        dnnl_query_t qs = c->kind == DC_BWD_DATA ? dnnl_query_diff_src_md : dnnl_query_src_md;
        dnnl_query_t qw =
            c->kind == DC_BWD_WEIGHT ? dnnl_query_diff_weights_md : dnnl_query_weights_md;
        dnnl_query_t qd = c->kind == DC_FWD ? dnnl_query_dst_md : dnnl_query_diff_dst_md;
        c->a[S_SRC].md = *dnnl_primitive_desc_query_md(pd, qs, 0);
        c->a[S_WEI].md = *dnnl_primitive_desc_query_md(pd, qw, 0);
        c->a[S_DST].md = *dnnl_primitive_desc_query_md(pd, qd, 0);
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        c->pad_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
        call = "dnnl_primitive_create";
        st = dnnl_primitive_create(&c->prim, pd);
    }
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    if (pd) dnnl_primitive_desc_destroy(pd);

    c->a[S_SRC].used = c->a[S_WEI].used = c->a[S_DST].used = 1;
    c->a[S_BIAS].used = bmd != NULL;
    c->a[S_SRC].out = c->kind == DC_BWD_DATA;
    c->a[S_WEI].out = c->kind == DC_BWD_WEIGHT;
    c->a[S_DST].out = c->kind == DC_FWD;
    c->a[S_SRC].dnnl_arg = c->kind == DC_BWD_DATA ? DNNL_ARG_DIFF_SRC : DNNL_ARG_SRC;
    c->a[S_WEI].dnnl_arg = c->kind == DC_BWD_WEIGHT ? DNNL_ARG_DIFF_WEIGHTS : DNNL_ARG_WEIGHTS;
    c->a[S_DST].dnnl_arg = c->kind == DC_FWD ? DNNL_ARG_DST : DNNL_ARG_DIFF_DST;
    c->a[S_BIAS].dnnl_arg = DNNL_ARG_BIAS;

    /* Reorders between the arena's plain layout and the primitive's. */
    size_t off = TS_ALIGN_UP(c->pad_bytes, TS_ALIGN);
    for (int i = 0; i < S_COUNT && st == dnnl_success; i++) {
        dc_arg *a = &c->a[i];
        if (!a->used || dnnl_memory_desc_equal(&a->plain, &a->md)) continue;
        const dnnl_memory_desc_t *from = a->out ? &a->md : &a->plain,
                                 *to = a->out ? &a->plain : &a->md;
        dnnl_primitive_desc_t rpd = NULL;
        call = "dnnl_reorder_primitive_desc_create";
        st = dnnl_reorder_primitive_desc_create(&rpd, from, g_engine, to, g_engine, attr);
        if (st == dnnl_success) {
            const dnnl_memory_desc_t *sp =
                dnnl_primitive_desc_query_md(rpd, dnnl_query_scratchpad_md, 0);
            if (sp && dnnl_memory_desc_get_size(sp) > 0)
                st = dnnl_unimplemented;
            else
                call = "dnnl_primitive_create(reorder)",
                st = dnnl_primitive_create(&a->reorder, rpd);
            dnnl_primitive_desc_destroy(rpd);
        }
        a->off = off;
        off += TS_ALIGN_UP(dnnl_memory_desc_get_size(&a->md), TS_ALIGN);
    }
    if (c->per_image) omp_set_num_threads(nthr);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st == dnnl_unimplemented) return TS_ERR_UNSUPPORTED;
    if (st != dnnl_success) return dnnl_fail(st, c, call);
    c->lane_bytes = off;
    c->scratch_bytes = off * (size_t)c->nlanes;
    if (c->wgrad) {
        c->scratch_bytes = TS_ALIGN_UP(ts_conv_wgrad_scratch(&c->ws), TS_ALIGN);
    } else if (c->per_image) {
        c->src_img = dnnl_memory_desc_get_size(&c->a[S_SRC].plain);
        c->dst_img = dnnl_memory_desc_get_size(&c->a[S_DST].plain);
        c->wnumel = ts_tensor_numel(t[S_WEI]);
        c->partial_off = c->scratch_bytes;
        /* f32 partials: the weight gradient is f32 in both precisions */
        c->scratch_bytes += TS_ALIGN_UP((size_t)(c->wnumel * c->N) * sizeof(float), TS_ALIGN);
    }
    if (in->op == TS_OP_CONV_TRANSPOSE && has_bias) {
        c->bias_C = t[S_SRC]->dims[cl ? nd + 1 : 1];
        c->bias_inner = ts_tensor_numel(t[S_SRC]) / (c->N * c->bias_C);
    }

    c->lanes = ts_zalloc(sizeof(dc_lane) * (size_t)c->nlanes, "oneDNN conv lanes");
    if (!c->lanes) return TS_ERR_NOMEM;
    for (int l = 0; l < c->nlanes; l++) {
        dc_lane *L = &c->lanes[l];
        TRY(c, dnnl_stream_create(&L->stream, g_engine, dnnl_stream_default_flags));
        for (int i = 0; i < S_COUNT; i++) {
            if (!c->a[i].used) continue;
            TRY(c, dnnl_memory_create(&L->mem[i], &c->a[i].md, g_engine, DNNL_MEMORY_NONE));
            if (c->a[i].reorder)
                TRY(c,
                    dnnl_memory_create(&L->plain[i], &c->a[i].plain, g_engine, DNNL_MEMORY_NONE));
        }
        if (c->pad_bytes) {
            dnnl_memory_desc_t md;
            dnnl_dims_t d = {(dnnl_dim_t)c->pad_bytes};
            TRY(c, dnnl_memory_desc_init_by_tag(&md, 1, d, dnnl_u8, dnnl_a));
            TRY(c, dnnl_memory_create(&L->pad, &md, g_engine, DNNL_MEMORY_NONE));
        }
    }
    return TS_OK;
}

/* ---- running ------------------------------------------------------------- */

static dnnl_status_t reorder(dnnl_primitive_t r, dnnl_stream_t s, dnnl_memory_t from,
                             dnnl_memory_t to) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    return dnnl_primitive_execute(r, s, 2, args);
}

/* One run of the primitive on plain operands ptr[slot], using `scratch`
 * (lane_bytes) for its scratchpad and the reordered copies. */
static dnnl_status_t run_lane(const dconv *c, const dc_lane *L, char *scratch, void *const *ptr) {
    dnnl_exec_arg_t args[S_COUNT + 1];
    int na = 0;
    dnnl_status_t st = dnnl_success;
    for (int i = 0; i < S_COUNT && st == dnnl_success; i++) {
        const dc_arg *a = &c->a[i];
        if (!a->used) continue;
        if (a->reorder) {
            st = dnnl_memory_set_data_handle(L->mem[i], scratch + a->off);
            if (st == dnnl_success) st = dnnl_memory_set_data_handle(L->plain[i], ptr[i]);
            if (st == dnnl_success && !a->out)
                st = reorder(a->reorder, L->stream, L->plain[i], L->mem[i]);
        } else {
            st = dnnl_memory_set_data_handle(L->mem[i], ptr[i]);
        }
        args[na++] = (dnnl_exec_arg_t){a->dnnl_arg, L->mem[i]};
    }
    if (st == dnnl_success && L->pad) {
        st = dnnl_memory_set_data_handle(L->pad, scratch);
        args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, L->pad};
    }
    if (st == dnnl_success) st = dnnl_primitive_execute(c->prim, L->stream, na, args);
    for (int i = 0; i < S_COUNT && st == dnnl_success; i++)
        if (c->a[i].used && c->a[i].out && c->a[i].reorder)
            st = reorder(c->a[i].reorder, L->stream, L->mem[i], L->plain[i]);
    if (st == dnnl_success) st = dnnl_stream_wait(L->stream);
    return st;
}

static ts_status k_dnnl_conv(const ts_kargs *k) {
    const dconv *c = k->backend;
    const ts_tensor *t[S_COUNT];
    slot_tensors(c->op, k->in, k->n_in, &k->out[0], t);
    if (k->scratch_bytes < c->scratch_bytes)
        return ts_fail(TS_ERR_INTERNAL, "%s: scratch of %zu bytes, needs %zu", c->what,
                       k->scratch_bytes, c->scratch_bytes);
    void *ptr[S_COUNT];
    for (int i = 0; i < S_COUNT; i++) ptr[i] = t[i] ? t[i]->data : NULL;
    char *scratch = k->scratch;
    if (c->wgrad) {
        ts_conv_wgrad(&c->ws, ptr[S_SRC], ptr[S_DST], ptr[S_WEI], (float *)scratch);
        return TS_OK;
    }
    if (c->wino) {
        if (c->kind == DC_FWD)
            ts_wino_conv(&c->wn, ptr[S_SRC], ptr[S_WEI], ptr[S_DST], scratch);
        else
            ts_wino_conv(&c->wn, ptr[S_DST], ptr[S_WEI], ptr[S_SRC], scratch);
        return TS_OK;
    }
    if (!c->per_image) {
        dnnl_status_t st = run_lane(c, &c->lanes[0], scratch, ptr);
        if (st != dnnl_success) return dnnl_fail(st, c, "dnnl_primitive_execute");
        if (c->bias_C && c->channels_last) {
            float *y = t[S_SRC]->data;
            const float *b = t[S_BIAS]->data;
            int64_t C = c->bias_C, rows = c->N * c->bias_inner;
#pragma omp parallel for schedule(static) if (rows * C >= 65536)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t e = 0; e < C; e++) y[r * C + e] += b[e];
        } else if (c->bias_C) {
            float *y = t[S_SRC]->data;
            const float *b = t[S_BIAS]->data;
            int64_t planes = c->N * c->bias_C, inner = c->bias_inner;
#pragma omp parallel for schedule(static) if (planes * inner >= 65536)
            for (int64_t pl = 0; pl < planes; pl++) {
                float bv = b[pl % c->bias_C], *yp = y + pl * inner;
                for (int64_t e = 0; e < inner; e++) yp[e] += bv;
            }
        }
        return TS_OK;
    }
    /* Backward weights: image n's gradient into partial n, then the
     * partials added in image order. */
    float *partial = (float *)(scratch + c->partial_off);
    dnnl_status_t err = dnnl_success;
#pragma omp parallel for num_threads(c->nlanes) schedule(static)
    for (int64_t n = 0; n < c->N; n++) {
        int lane = omp_get_thread_num();
        void *p[S_COUNT] = {(char *)ptr[S_SRC] + n * c->src_img, partial + n * c->wnumel,
                            (char *)ptr[S_DST] + n * c->dst_img, NULL};
        dnnl_status_t st = run_lane(c, &c->lanes[lane], scratch + (size_t)lane * c->lane_bytes, p);
        if (st != dnnl_success) {
#pragma omp critical(ts_dnnl_conv_err)
            if (err == dnnl_success) err = st;
        }
    }
    if (err != dnnl_success) return dnnl_fail(err, c, "dnnl_primitive_execute");
    float *dw = ptr[S_WEI];
    int64_t nw = c->wnumel, N = c->N;
#pragma omp parallel for schedule(static) if (nw * N >= 65536)
    for (int64_t e = 0; e < nw; e++) {
        float s = partial[e];
        for (int64_t n = 1; n < N; n++) s += partial[n * nw + e];
        dw[e] = s;
    }
    return TS_OK;
}

/* ---- plan preparation ----------------------------------------------------- */

static int is_conv_op(int op) {
    return op == TS_OP_CONV || op == TS_OP_CONV_BWD_DATA || op == TS_OP_CONV_BWD_WEIGHT ||
           op == TS_OP_CONV_TRANSPOSE;
}

static ts_status dconv_create(const ts_instr *in, const ts_rt_instr *r, dconv **out) {
    *out = NULL;
    dconv *c = ts_zalloc(sizeof *c, "oneDNN conv");
    if (!c) return TS_ERR_NOMEM;
    char xs[96], ws[96], ys[96];
    const ts_operand *o = &in->out[0];
    snprintf(c->what, sizeof c->what, "%s '%.60s' %s, %s -> %s", in->name,
             in->label ? in->label : "?",
             ts_shape_str(xs, sizeof xs, in->in[0].dtype, in->in[0].rank, in->in[0].dims),
             ts_shape_str(ws, sizeof ws, in->in[1].dtype, in->in[1].rank, in->in[1].dims),
             ts_shape_str(ys, sizeof ys, o->dtype, o->rank, o->dims));
    ts_status s = dconv_build(c, in, r);
    if (s != TS_OK) {
        dconv_free(c);
        return s;
    }
    *out = c;
    return TS_OK;
}

ts_status ts_cpu_prepare_conv(const ts_program *prog, ts_runtime *rt) {
    if (prog->opt.reference_kernels) return TS_OK;
    size_t need = 0;
    int any = 0;
    for (int i = 0; i < prog->n_ins; i++) {
        const ts_instr *in = &prog->ins[i];
        ts_rt_instr *r = &rt->ins[i];
        if (!is_conv_op(in->op) || in->out[0].dtype != TS_F32) continue;
        if (!any) {
            pthread_once(&g_once, init_engine);
            if (g_engine_status != dnnl_success)
                return ts_fail(TS_ERR_INTERNAL, "oneDNN: dnnl_engine_create failed: %s",
                               dnnl_status2str(g_engine_status));
            any = 1;
        }
        dconv *c;
        ts_status s = dconv_create(in, r, &c);
        if (s == TS_ERR_UNSUPPORTED) continue; /* the reference kernel stays */
        if (s != TS_OK) return s;
        r->k.backend = c;
        r->backend_free = dconv_free;
        r->fn = k_dnnl_conv;
        if (c->scratch_bytes > need) need = c->scratch_bytes;
    }
    if (need > rt->backend_scratch_bytes) {
        /* Grow the shared buffer; instructions already pointing at the old
         * one (other backend kernels) move with it. */
        void *old = rt->backend_scratch, *nb = ts_aligned_alloc(need, "oneDNN scratchpad");
        if (!nb) return TS_ERR_NOMEM;
        for (int i = 0; i < prog->n_ins; i++)
            if (old && rt->ins[i].k.scratch == old) {
                rt->ins[i].k.scratch = nb;
                rt->ins[i].k.scratch_bytes = need;
            }
        ts_aligned_free(old);
        rt->backend_scratch = nb;
        rt->backend_scratch_bytes = need;
    }
    for (int i = 0; i < prog->n_ins; i++)
        if (rt->ins[i].fn == k_dnnl_conv) {
            rt->ins[i].k.scratch = rt->backend_scratch;
            rt->ins[i].k.scratch_bytes = rt->backend_scratch_bytes;
        }
    return TS_OK;
}
