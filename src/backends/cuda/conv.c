/* conv, conv_bwd_data and conv_bwd_weight on the CUDA backend through
 * cuDNN's convolution API (cudnnConvolutionForward / BackwardData /
 * BackwardFilter), for f32 plans and 1-d or 2-d convolutions in either
 * layout (src/ops/conv.c: x [N, C, spatial...] or channels last
 * [N, spatial..., C], weight [O, C/groups, k...] in both).
 *
 * Planned once at prepare: the descriptors (a 1-d problem is a 2-d one of
 * height 1), the algorithm and its workspace, which lives at the start of
 * the instruction's scratch. Numerics: the convolution descriptor's math
 * type is CUDNN_FMA_MATH (plain f32 FMA, never TF32 tensor cores), and the
 * algorithm is one of those that compute the direct sums (implicit GEMM,
 * GEMM, direct; backward data and filter ALGO_1): no FFT or Winograd
 * transforms, and only algorithms cuDNN reports deterministic (backward
 * data ALGO_0 and filter ALGO_0 / ALGO_3 sum with atomics). Results agree
 * with the CPU's within f32 rounding, not bit for bit (other summation
 * order).
 *
 * Channels last: activations are NHWC tensors; cuDNN wants the filter in
 * the same layout (KRSC), so the weight is permuted into the scratch after
 * the workspace before the forward and backward-data calls, and the
 * backward-filter result is written there in KRSC and permuted back into
 * [O, C/groups, kh, kw]. Should cuDNN offer no allowed algorithm for the
 * NHWC problem, it runs in NCHW instead, the activations permuted through
 * the scratch (via_nchw).
 *
 * cuDNN is loaded at run time (dlopen, below). Without it the three ops
 * are refused at prepare: "built without cuDNN" (TS_CUDNN undefined: CMake
 * found no cudnn.h), or the loader's message. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cuda/cuda.h"

static ts_status conv_unsupported(const ts_program *prog, int i, const char *why) {
    const ts_instr *in = &prog->ins[i];
    return cu_fail(TS_ERR_UNSUPPORTED, "instruction %d (%s, '%s'): %s", i, in->name,
                   in->label ? in->label : "", why);
}

#ifndef TS_CUDNN

ts_status cu_conv_plan(cu_state *st, const ts_program *prog, int i, struct cu_conv **out,
                       size_t *scratch) {
    (void)st;
    *out = NULL;
    *scratch = 0;
    return conv_unsupported(prog, i,
                            "this libtessel_cuda.so was built without cuDNN (CMake found no "
                            "cudnn.h / libcudnn next to the CUDA toolkit), which convolutions "
                            "need on this backend");
}

ts_status cu_conv_run(cu_state *st, const ts_program *prog, int i, const struct cu_conv *c) {
    (void)st;
    (void)c;
    return conv_unsupported(prog, i, "built without cuDNN");
}

void cu_conv_free(struct cu_conv *c) {
    (void)c;
}

void cu_conv_release(cu_state *st) {
    (void)st;
}

#else

#include <cudnn.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

/* cuDNN is loaded with dlopen at the first convolution, not linked: a
 * plugin built where cuDNN is and run where it is not (or not on the
 * loader's path) still loads and runs everything else, and a convolution
 * is refused with the loader's message. The calls below go through this
 * table (cudnnX is (dn.cudnnX) from here on). */
#define DNN_FUNCS(X)                                                                               \
    X(cudnnCreate)                                                                                 \
    X(cudnnDestroy)                                                                                \
    X(cudnnSetStream)                                                                              \
    X(cudnnGetErrorString)                                                                         \
    X(cudnnCreateTensorDescriptor)                                                                 \
    X(cudnnDestroyTensorDescriptor)                                                                \
    X(cudnnSetTensor4dDescriptor)                                                                  \
    X(cudnnCreateFilterDescriptor)                                                                 \
    X(cudnnDestroyFilterDescriptor)                                                                \
    X(cudnnSetFilter4dDescriptor)                                                                  \
    X(cudnnCreateConvolutionDescriptor)                                                            \
    X(cudnnDestroyConvolutionDescriptor)                                                           \
    X(cudnnSetConvolution2dDescriptor)                                                             \
    X(cudnnSetConvolutionGroupCount)                                                               \
    X(cudnnSetConvolutionMathType)                                                                 \
    X(cudnnGetConvolution2dForwardOutputDim)                                                       \
    X(cudnnGetConvolutionForwardAlgorithm_v7)                                                      \
    X(cudnnGetConvolutionBackwardDataAlgorithm_v7)                                                 \
    X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)                                               \
    X(cudnnGetConvolutionForwardWorkspaceSize)                                                     \
    X(cudnnGetConvolutionBackwardDataWorkspaceSize)                                                \
    X(cudnnGetConvolutionBackwardFilterWorkspaceSize)                                              \
    X(cudnnConvolutionForward)                                                                     \
    X(cudnnConvolutionBackwardData)                                                                \
    X(cudnnConvolutionBackwardFilter)                                                              \
    X(cudnnAddTensor)

#define DNN_MEMBER(f) __typeof__(&f) f;
static struct {
    int ok;
    char why[300]; /* why not, when !ok */
    DNN_FUNCS(DNN_MEMBER)
} dn;
static pthread_once_t dn_once = PTHREAD_ONCE_INIT;

static void dn_load(void) {
    /* the loader's path first, then where CMake found cuDNN at build time */
    static const char *const names[] = {"libcudnn.so.9", "libcudnn.so",
#ifdef TS_CUDNN_LIBDIR
                                        TS_CUDNN_LIBDIR "/libcudnn.so.9",
#endif
                                        NULL};
    void *h = NULL;
    for (int j = 0; names[j] && !h; j++) h = dlopen(names[j], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(dn.why, sizeof dn.why, "cuDNN (libcudnn.so.9) could not be loaded: %s",
                 e ? e : "not found");
        return;
    }
#define DNN_SYM(f)                                                                                 \
    if (!(*(void **)&dn.f = dlsym(h, #f))) {                                                       \
        snprintf(dn.why, sizeof dn.why, "the loaded cuDNN has no %s", #f);                         \
        return;                                                                                    \
    }
    DNN_FUNCS(DNN_SYM)
#undef DNN_SYM
    dn.ok = 1;
}

#define DNN_REDIRECT(f)                        (dn.f)
#define cudnnCreate                            DNN_REDIRECT(cudnnCreate)
#define cudnnDestroy                           DNN_REDIRECT(cudnnDestroy)
#define cudnnSetStream                         DNN_REDIRECT(cudnnSetStream)
#define cudnnGetErrorString                    DNN_REDIRECT(cudnnGetErrorString)
#define cudnnCreateTensorDescriptor            DNN_REDIRECT(cudnnCreateTensorDescriptor)
#define cudnnDestroyTensorDescriptor           DNN_REDIRECT(cudnnDestroyTensorDescriptor)
#define cudnnSetTensor4dDescriptor             DNN_REDIRECT(cudnnSetTensor4dDescriptor)
#define cudnnCreateFilterDescriptor            DNN_REDIRECT(cudnnCreateFilterDescriptor)
#define cudnnDestroyFilterDescriptor           DNN_REDIRECT(cudnnDestroyFilterDescriptor)
#define cudnnSetFilter4dDescriptor             DNN_REDIRECT(cudnnSetFilter4dDescriptor)
#define cudnnCreateConvolutionDescriptor       DNN_REDIRECT(cudnnCreateConvolutionDescriptor)
#define cudnnDestroyConvolutionDescriptor      DNN_REDIRECT(cudnnDestroyConvolutionDescriptor)
#define cudnnSetConvolution2dDescriptor        DNN_REDIRECT(cudnnSetConvolution2dDescriptor)
#define cudnnSetConvolutionGroupCount          DNN_REDIRECT(cudnnSetConvolutionGroupCount)
#define cudnnSetConvolutionMathType            DNN_REDIRECT(cudnnSetConvolutionMathType)
#define cudnnGetConvolution2dForwardOutputDim  DNN_REDIRECT(cudnnGetConvolution2dForwardOutputDim)
#define cudnnGetConvolutionForwardAlgorithm_v7 DNN_REDIRECT(cudnnGetConvolutionForwardAlgorithm_v7)
#define cudnnGetConvolutionBackwardDataAlgorithm_v7                                                \
    DNN_REDIRECT(cudnnGetConvolutionBackwardDataAlgorithm_v7)
#define cudnnGetConvolutionBackwardFilterAlgorithm_v7                                              \
    DNN_REDIRECT(cudnnGetConvolutionBackwardFilterAlgorithm_v7)
#define cudnnGetConvolutionForwardWorkspaceSize                                                    \
    DNN_REDIRECT(cudnnGetConvolutionForwardWorkspaceSize)
#define cudnnGetConvolutionBackwardDataWorkspaceSize                                               \
    DNN_REDIRECT(cudnnGetConvolutionBackwardDataWorkspaceSize)
#define cudnnGetConvolutionBackwardFilterWorkspaceSize                                             \
    DNN_REDIRECT(cudnnGetConvolutionBackwardFilterWorkspaceSize)
#define cudnnConvolutionForward        DNN_REDIRECT(cudnnConvolutionForward)
#define cudnnConvolutionBackwardData   DNN_REDIRECT(cudnnConvolutionBackwardData)
#define cudnnConvolutionBackwardFilter DNN_REDIRECT(cudnnConvolutionBackwardFilter)
#define cudnnAddTensor                 DNN_REDIRECT(cudnnAddTensor)

#define WS_MAX    ((size_t)256 << 20) /* the largest workspace an algorithm may ask for */
#define ALIGN_256 ((size_t)256)

struct cu_conv {
    cudnnTensorDescriptor_t x, y, b; /* the forward's x and y; b: the bias [1, O, 1, 1] */
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t cd;
    int algo;
    size_t ws;             /* workspace bytes at the start of the scratch */
    size_t wt_off;         /* the KRSC weight's scratch offset (cl) */
    int cl;                /* NHWC descriptors: the weight goes through the scratch in KRSC */
    int via_nchw;          /* channels last run as NCHW: the activations through the scratch */
    size_t xa_off, ya_off; /* their NCHW copies' scratch offsets */
    int64_t wdims[4];      /* [O, C/groups, kh, kw] */
    int64_t wtdims[4];     /* [O, kh, kw, C/groups] */
    int64_t x4[4], y4[4];  /* the forward's x and y as (n, c, h, w) */
};

static ts_status dnn_err(const ts_program *prog, int i, cudnnStatus_t e, const char *call) {
    const ts_instr *in = &prog->ins[i];
    return cu_fail(TS_ERR_INTERNAL, "instruction %d (%s, '%s'): %s failed: %s", i, in->name,
                   in->label ? in->label : "", call, cudnnGetErrorString(e));
}

#define DNN(call)                                                                                  \
    do {                                                                                           \
        cudnnStatus_t e_ = (call);                                                                 \
        if (e_ != CUDNN_STATUS_SUCCESS) {                                                          \
            s = dnn_err(prog, i, e_, #call);                                                       \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

void cu_conv_free(struct cu_conv *c) {
    if (!c) return; /* a plan exists only once cuDNN is loaded */
    if (c->x) cudnnDestroyTensorDescriptor(c->x);
    if (c->y) cudnnDestroyTensorDescriptor(c->y);
    if (c->b) cudnnDestroyTensorDescriptor(c->b);
    if (c->w) cudnnDestroyFilterDescriptor(c->w);
    if (c->cd) cudnnDestroyConvolutionDescriptor(c->cd);
    free(c);
}

void cu_conv_release(cu_state *st) {
    if (st->dnn) cudnnDestroy(st->dnn); /* a handle exists only once cuDNN is loaded */
    st->dnn = NULL;
}

/* An activation as (n, c, h, w): 1-d problems get h = 1. */
static void act4(const ts_operand *t, int nd, int cl, int64_t *d4) {
    const int64_t *d = t->dims;
    if (nd == 1) {
        d4[0] = d[0];
        d4[1] = cl ? d[2] : d[1];
        d4[2] = 1;
        d4[3] = cl ? d[1] : d[2];
        return;
    }
    d4[0] = d[0];
    d4[1] = cl ? d[3] : d[1];
    d4[2] = cl ? d[1] : d[2];
    d4[3] = cl ? d[2] : d[3];
}

/* cuDNN's descriptors take int sizes, and its legacy API tensors fewer
 * than 2^31 elements. */
static int fits_int(const int64_t *d4) {
    int64_t n = 1;
    for (int j = 0; j < 4; j++) {
        if (d4[j] < 1 || d4[j] > INT_MAX) return 0;
        n *= d4[j];
        if (n > INT_MAX) return 0;
    }
    return 1;
}

static size_t align256(size_t b) {
    return (b + ALIGN_256 - 1) / ALIGN_256 * ALIGN_256;
}

static int in_list(int algo, const int *ok, int n) {
    for (int j = 0; j < n; j++)
        if (ok[j] == algo) return 1;
    return 0;
}

/* Forward algorithms that compute the direct sums (no FFT / Winograd). */
static const int FWD_OK[] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                             CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                             CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT};
/* The deterministic direct-sum backward algorithms. */
static const int DATA_OK[] = {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1};
static const int FILTER_OK[] = {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1};

/* The workspace of algorithm a for instruction i's op; a status other than
 * success means cuDNN cannot run it on these descriptors. */
static cudnnStatus_t ws_of(cudnnHandle_t h, const struct cu_conv *c, int op, int a, size_t *ws) {
    if (op == TS_OP_CONV)
        return cudnnGetConvolutionForwardWorkspaceSize(h, c->x, c->w, c->cd, c->y,
                                                       (cudnnConvolutionFwdAlgo_t)a, ws);
    if (op == TS_OP_CONV_BWD_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, c->w, c->y, c->cd, c->x,
                                                            (cudnnConvolutionBwdDataAlgo_t)a, ws);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, c->x, c->y, c->cd, c->w,
                                                          (cudnnConvolutionBwdFilterAlgo_t)a, ws);
}

/* The algorithm: cuDNN's heuristic ranking (cudnnGet*Algorithm_v7, which
 * runs nothing) filtered to the allowed, deterministic, non-tensor-op
 * ones that cuDNN supports here with a workspace of at most WS_MAX; then,
 * if none is left, the allowed list in order. -1: none. */
static int pick_algo(cudnnHandle_t h, const struct cu_conv *c, int op, size_t *ws) {
    const int *ok = op == TS_OP_CONV ? FWD_OK : op == TS_OP_CONV_BWD_DATA ? DATA_OK : FILTER_OK;
    const int n_ok = op == TS_OP_CONV ? (int)(sizeof FWD_OK / sizeof *FWD_OK) : 1;
    int got = 0;
    enum { MAXP = 16 };
    int algo[MAXP], det[MAXP], math[MAXP];
    cudnnStatus_t st[MAXP];
    if (op == TS_OP_CONV) {
        cudnnConvolutionFwdAlgoPerf_t p[MAXP];
        if (cudnnGetConvolutionForwardAlgorithm_v7(h, c->x, c->w, c->cd, c->y, MAXP, &got, p) !=
            CUDNN_STATUS_SUCCESS)
            got = 0;
        for (int j = 0; j < got; j++)
            algo[j] = (int)p[j].algo, det[j] = p[j].determinism == CUDNN_DETERMINISTIC,
            math[j] = (int)p[j].mathType, st[j] = p[j].status;
    } else if (op == TS_OP_CONV_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t p[MAXP];
        if (cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c->w, c->y, c->cd, c->x, MAXP, &got,
                                                        p) != CUDNN_STATUS_SUCCESS)
            got = 0;
        for (int j = 0; j < got; j++)
            algo[j] = (int)p[j].algo, det[j] = p[j].determinism == CUDNN_DETERMINISTIC,
            math[j] = (int)p[j].mathType, st[j] = p[j].status;
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t p[MAXP];
        if (cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c->x, c->y, c->cd, c->w, MAXP, &got,
                                                          p) != CUDNN_STATUS_SUCCESS)
            got = 0;
        for (int j = 0; j < got; j++)
            algo[j] = (int)p[j].algo, det[j] = p[j].determinism == CUDNN_DETERMINISTIC,
            math[j] = (int)p[j].mathType, st[j] = p[j].status;
    }
    for (int j = 0; j < got && j < MAXP; j++) {
        if (st[j] != CUDNN_STATUS_SUCCESS || !det[j] || !in_list(algo[j], ok, n_ok)) continue;
        if (math[j] == CUDNN_TENSOR_OP_MATH || math[j] == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
            continue;
        if (ws_of(h, c, op, algo[j], ws) == CUDNN_STATUS_SUCCESS && *ws <= WS_MAX) return algo[j];
    }
    for (int j = 0; j < n_ok; j++)
        if (ws_of(h, c, op, ok[j], ws) == CUDNN_STATUS_SUCCESS && *ws <= WS_MAX) return ok[j];
    return -1;
}

ts_status cu_conv_plan(cu_state *st, const ts_program *prog, int i, struct cu_conv **out,
                       size_t *scratch) {
    const ts_instr *in = &prog->ins[i];
    const ts_conv_attrs *a = &in->a.conv;
    *out = NULL;
    *scratch = 0;
    for (int j = 0; j < in->n_in; j++)
        if (in->in[j].dtype != TS_F32) return conv_unsupported(prog, i, "needs f32 operands");
    if (in->out[0].dtype != TS_F32 || a->low)
        return conv_unsupported(prog, i, "needs f32 operands (no mixed-precision convolution)");
    if (a->nd != 1 && a->nd != 2)
        return conv_unsupported(prog, i, "only 1-d and 2-d convolutions run here");
    if (in->op == TS_OP_CONV && in->n_in > 2 && (in->in[2].rank != 1))
        return conv_unsupported(prog, i, "the bias must be [O]");
    const int nd = (int)a->nd, cl = a->channels_last != 0;
    /* the forward's x, weight and y */
    const ts_operand *x, *w, *y;
    if (in->op == TS_OP_CONV)
        x = &in->in[0], w = &in->in[1], y = &in->out[0];
    else if (in->op == TS_OP_CONV_BWD_DATA)
        y = &in->in[0], w = &in->in[1], x = &in->out[0];
    else
        y = &in->in[0], x = &in->in[1], w = &in->out[0];
    int64_t x4[4], y4[4], w4[4];
    act4(x, nd, cl, x4);
    act4(y, nd, cl, y4);
    w4[0] = w->dims[0];
    w4[1] = w->dims[1];
    w4[2] = nd == 1 ? 1 : w->dims[2];
    w4[3] = nd == 1 ? w->dims[2] : w->dims[3];
    if (!fits_int(x4) || !fits_int(y4) || !fits_int(w4) || a->groups < 1 || a->groups > INT_MAX)
        return conv_unsupported(prog, i, "a tensor is too large for cuDNN's descriptors");
    int pad[2] = {0, 0}, str[2] = {1, 1}, dil[2] = {1, 1};
    for (int j = 0; j < nd; j++) {
        int t = 2 - nd + j;
        if (a->padding[j] > INT_MAX || a->stride[j] > INT_MAX || a->dilation[j] > INT_MAX)
            return conv_unsupported(prog, i, "stride, padding or dilation too large for cuDNN");
        pad[t] = (int)a->padding[j];
        str[t] = (int)a->stride[j];
        dil[t] = (int)a->dilation[j];
    }
    pthread_once(&dn_once, dn_load);
    if (!dn.ok) return conv_unsupported(prog, i, dn.why);
    ts_status s = TS_OK;
    struct cu_conv *c = calloc(1, sizeof *c);
    if (!c) return cu_fail(TS_ERR_NOMEM, "convolution plan of instruction %d", i);
    if (!st->dnn) {
        cudnnHandle_t h = NULL;
        DNN(cudnnCreate(&h));
        st->dnn = h;
        DNN(cudnnSetStream(st->dnn, st->stream));
    }
    const cudnnTensorFormat_t fmt = cl ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    c->cl = cl;
    for (int j = 0; j < 4; j++) c->wdims[j] = w4[j];
    c->wtdims[0] = w4[0], c->wtdims[1] = w4[2], c->wtdims[2] = w4[3], c->wtdims[3] = w4[1];
    DNN(cudnnCreateTensorDescriptor(&c->x));
    DNN(cudnnCreateTensorDescriptor(&c->y));
    DNN(cudnnCreateFilterDescriptor(&c->w));
    DNN(cudnnCreateConvolutionDescriptor(&c->cd));
    DNN(cudnnSetTensor4dDescriptor(c->x, fmt, CUDNN_DATA_FLOAT, (int)x4[0], (int)x4[1], (int)x4[2],
                                   (int)x4[3]));
    DNN(cudnnSetTensor4dDescriptor(c->y, fmt, CUDNN_DATA_FLOAT, (int)y4[0], (int)y4[1], (int)y4[2],
                                   (int)y4[3]));
    DNN(cudnnSetFilter4dDescriptor(c->w, CUDNN_DATA_FLOAT, fmt, (int)w4[0], (int)w4[1], (int)w4[2],
                                   (int)w4[3]));
    DNN(cudnnSetConvolution2dDescriptor(c->cd, pad[0], pad[1], str[0], str[1], dil[0], dil[1],
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DNN(cudnnSetConvolutionGroupCount(c->cd, (int)a->groups));
    /* plain f32 FMA: no TF32 tensor cores */
    DNN(cudnnSetConvolutionMathType(c->cd, CUDNN_FMA_MATH));
    if (in->op == TS_OP_CONV && in->n_in > 2) {
        DNN(cudnnCreateTensorDescriptor(&c->b));
        DNN(cudnnSetTensor4dDescriptor(c->b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, (int)y4[1], 1,
                                       1));
    }
    /* cuDNN's geometry must be the graph's (a bwd_data dx may be larger
     * than the smallest input of dy's size: conv.c's extra[]). */
    int on, oc, oh, ow;
    DNN(cudnnGetConvolution2dForwardOutputDim(c->cd, c->x, c->w, &on, &oc, &oh, &ow));
    if (on != y4[0] || oc != y4[1] || oh != y4[2] || ow != y4[3]) {
        s = conv_unsupported(prog, i, "cuDNN's output shape differs from the graph's");
        goto fail;
    }
    c->algo = pick_algo(st->dnn, c, in->op, &c->ws);
    if (c->algo < 0 && cl) {
        /* No allowed NHWC algorithm: run it in NCHW, the activations
         * permuted through the scratch (the weight is NCHW as it is). */
        DNN(cudnnSetTensor4dDescriptor(c->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)x4[0],
                                       (int)x4[1], (int)x4[2], (int)x4[3]));
        DNN(cudnnSetTensor4dDescriptor(c->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)y4[0],
                                       (int)y4[1], (int)y4[2], (int)y4[3]));
        DNN(cudnnSetFilter4dDescriptor(c->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, (int)w4[0],
                                       (int)w4[1], (int)w4[2], (int)w4[3]));
        c->cl = 0;
        c->via_nchw = 1;
        c->algo = pick_algo(st->dnn, c, in->op, &c->ws);
    }
    if (c->algo < 0) {
        s = conv_unsupported(prog, i,
                             "cuDNN offers no deterministic f32 (non-TF32) algorithm for this "
                             "convolution");
        goto fail;
    }
    for (int j = 0; j < 4; j++) c->x4[j] = x4[j], c->y4[j] = y4[j];
    /* scratch: [workspace | KRSC weight (cl) | x, y in NCHW (via_nchw)] */
    size_t off = align256(c->ws);
    c->wt_off = off;
    if (c->cl) off += align256(cu_bytes(w));
    c->xa_off = off;
    if (c->via_nchw) off += align256(cu_bytes(x));
    c->ya_off = off;
    if (c->via_nchw) off += cu_bytes(y);
    *scratch = off;
    *out = c;
    return TS_OK;
fail:
    cu_conv_free(c);
    return s;
}

#undef DNN
#define DNN(call)                                                                                  \
    do {                                                                                           \
        cudnnStatus_t e_ = (call);                                                                 \
        if (e_ != CUDNN_STATUS_SUCCESS) return dnn_err(prog, i, e_, #call);                        \
    } while (0)

static ts_status permute4(const ts_program *prog, int i, void *dst, const void *src,
                          const int64_t *dims, const int64_t *perm, cudaStream_t s) {
    int rc = cu_permute(dst, src, (int)sizeof(float), 4, dims, perm, (cu_stream)s);
    return rc ? cu_err((cudaError_t)rc, "permuting a convolution operand", prog->ins[i].label)
              : TS_OK;
}

/* An activation (n, c, h, w) from NHWC (the graph's) to NCHW (the scratch
 * copy of via_nchw) and back. */
static ts_status to_nchw(const ts_program *prog, int i, void *dst, const void *src,
                         const int64_t *d4, cudaStream_t s) {
    static const int64_t perm[4] = {0, 3, 1, 2};
    const int64_t dims[4] = {d4[0], d4[2], d4[3], d4[1]};
    return permute4(prog, i, dst, src, dims, perm, s);
}
static ts_status to_nhwc(const ts_program *prog, int i, void *dst, const void *src,
                         const int64_t *d4, cudaStream_t s) {
    static const int64_t perm[4] = {0, 2, 3, 1};
    return permute4(prog, i, dst, src, d4, perm, s);
}

ts_status cu_conv_run(cu_state *st, const ts_program *prog, int i, const struct cu_conv *c) {
    const ts_instr *in = &prog->ins[i];
    unsigned char *scratch = st->dev + st->scratch_off;
    void *ws = c->ws ? scratch : NULL;
    float *wt = (float *)(scratch + c->wt_off), *xa = (float *)(scratch + c->xa_off);
    float *ya = (float *)(scratch + c->ya_off);
    const float one = 1.0f, zero = 0.0f;
    static const int64_t TO_KRSC[4] = {0, 2, 3, 1}, TO_KCRS[4] = {0, 3, 1, 2};
    ts_status s;
    switch (in->op) {
    case TS_OP_CONV: {
        const void *w = cu_at(st, in->in[1].off), *x = cu_at(st, in->in[0].off);
        void *y = cu_at(st, in->out[0].off);
        if (c->cl) {
            if ((s = permute4(prog, i, wt, w, c->wdims, TO_KRSC, st->stream)) != TS_OK) return s;
            w = wt;
        }
        if (c->via_nchw) {
            if ((s = to_nchw(prog, i, xa, x, c->x4, st->stream)) != TS_OK) return s;
            x = xa;
        }
        void *yc = c->via_nchw ? (void *)ya : y;
        DNN(cudnnConvolutionForward(st->dnn, &one, c->x, x, c->w, w, c->cd,
                                    (cudnnConvolutionFwdAlgo_t)c->algo, ws, c->ws, &zero, c->y,
                                    yc));
        if (c->b)
            DNN(cudnnAddTensor(st->dnn, &one, c->b, cu_at(st, in->in[2].off), &one, c->y, yc));
        return c->via_nchw ? to_nhwc(prog, i, y, ya, c->y4, st->stream) : TS_OK;
    }
    case TS_OP_CONV_BWD_DATA: {
        const void *w = cu_at(st, in->in[1].off), *dy = cu_at(st, in->in[0].off);
        void *dx = cu_at(st, in->out[0].off);
        if (c->cl) {
            if ((s = permute4(prog, i, wt, w, c->wdims, TO_KRSC, st->stream)) != TS_OK) return s;
            w = wt;
        }
        if (c->via_nchw) {
            if ((s = to_nchw(prog, i, ya, dy, c->y4, st->stream)) != TS_OK) return s;
            dy = ya;
        }
        DNN(cudnnConvolutionBackwardData(st->dnn, &one, c->w, w, c->y, dy, c->cd,
                                         (cudnnConvolutionBwdDataAlgo_t)c->algo, ws, c->ws, &zero,
                                         c->x, c->via_nchw ? (void *)xa : dx));
        return c->via_nchw ? to_nhwc(prog, i, dx, xa, c->x4, st->stream) : TS_OK;
    }
    default: { /* TS_OP_CONV_BWD_WEIGHT */
        void *dw = cu_at(st, in->out[0].off);
        const void *dy = cu_at(st, in->in[0].off), *x = cu_at(st, in->in[1].off);
        if (c->via_nchw) {
            if ((s = to_nchw(prog, i, xa, x, c->x4, st->stream)) != TS_OK) return s;
            if ((s = to_nchw(prog, i, ya, dy, c->y4, st->stream)) != TS_OK) return s;
            x = xa, dy = ya;
        }
        DNN(cudnnConvolutionBackwardFilter(st->dnn, &one, c->x, x, c->y, dy, c->cd,
                                           (cudnnConvolutionBwdFilterAlgo_t)c->algo, ws, c->ws,
                                           &zero, c->w, c->cl ? (void *)wt : dw));
        if (c->cl) return permute4(prog, i, dw, wt, c->wtdims, TO_KCRS, st->stream);
        return TS_OK;
    }
    }
}

#endif
