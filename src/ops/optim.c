/* Training-step ops: the SGD / Adam / AdamW parameter updates (the clip
 * coefficient they read: clip.c).
 *
 * The updates are side-effect nodes without outputs: they overwrite their
 * parameter and state inputs in place. One node may update many parameters
 * (the train pass emits one node for all of them): its inputs are groups of
 * (p, g[, state...]), one per parameter, then the optional clip coefficient,
 * and the kernel walks every (parameter, chunk) pair in one parallel loop. Each follows
 * torch.optim 1.13's single-tensor path operation by operation, in the parameter's dtype, so an f32
 * plan gives torch's f32 results bit for bit (given the same gradients and clip coefficient). They
 * are elementwise, so splitting them across threads in chunks gives the same bits for any thread
 * count. */
#include <float.h>
#include <math.h>
#include <string.h>
#include "collective.h"
#include "core/half.h"
#include "kern.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* torch's CPU kernels for add(x, alpha=a) and addcmul are built with FMA
 * (an explicit vec::fmadd, or a contracted a * b + c), so the updates use
 * fma() at exactly those places to reproduce torch's f32 results bit for
 * bit. fma is correctly rounded everywhere, so this costs no determinism.
 * The clones differ from TS_CLONES: an "avx2" clone has no FMA unit
 * enabled and would call fmaf() per element; the "fma" clone (AVX + FMA)
 * vectorises on every x86 CPU that has it. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define OPT_CLONES __attribute__((target_clones("avx512f", "fma", "default")))
#else
#define OPT_CLONES
#endif

/* Elements per parallel chunk of the elementwise updates. */
#define OPT_CHUNK 4096

static const char *lbl(const ts_kargs *k) {
    return k->label ? k->label : "?";
}

/* ---- inference --------------------------------------------------------- */

static ts_status check_same(const ts_graph *g, const ts_node *n, int base, int i,
                            const char *what) {
    const ts_type *p = ts_in_type(g, n, base), *t = ts_in_type(g, n, base + i);
    if (!ts_type_equal(p, t)) {
        char a[128], b[128];
        return ts_fail(TS_ERR_SHAPE, "%s %s does not match the parameter %s", what,
                       ts_type_str(a, sizeof a, t), ts_type_str(b, sizeof b, p));
    }
    return TS_OK;
}

static ts_status check_coef(const ts_graph *g, const ts_node *n, int i) {
    const ts_type *p = ts_in_type(g, n, 0), *c = ts_in_type(g, n, i);
    if (c->dtype != p->dtype || ts_type_numel(c) != 1)
        return ts_fail(TS_ERR_SHAPE, "the clip coefficient must be one %s element",
                       ts_dtype_name(p->dtype));
    return TS_OK;
}

static ts_status check_param(const ts_graph *g, const ts_node *n, int base) {
    const ts_type *p = ts_in_type(g, n, base);
    if (!ts_dtype_is_float(p->dtype))
        return ts_fail(TS_ERR_SHAPE, "the parameter must be a float tensor, got %s",
                       ts_dtype_name(p->dtype));
    if (p->dtype != ts_in_type(g, n, 0)->dtype)
        return ts_fail(TS_ERR_SHAPE, "parameter input %d is %s, the first is %s", base,
                       ts_dtype_name(p->dtype), ts_dtype_name(ts_in_type(g, n, 0)->dtype));
    return check_same(g, n, base, 1, "gradient");
}

/* Inputs per parameter group. */
static int sgd_group(const ts_attrs *a) {
    return 2 + (a->sgd.has_buf != 0);
}
enum { ADAM_GROUP = 4 };

/* Number of parameter groups of a node with n_in inputs, 0 if n_in does
 * not fit whole groups plus the coefficient and n_low copies. */
static int n_groups(int n_in, int gs, int has_coef, int64_t n_low) {
    int64_t m = n_in - has_coef - n_low;
    return n_low >= 0 && m >= gs && m % gs == 0 && n_low <= m / gs ? (int)(m / gs) : 0;
}

int ts_update_layout_of(int op, const ts_attrs *a, int n_in, ts_update_layout *out) {
    if (op != TS_OP_SGD_UPDATE && op != TS_OP_ADAM_UPDATE) return 0;
    const int sgd = op == TS_OP_SGD_UPDATE;
    const int64_t n_low = sgd ? a->sgd.n_low : a->adam.n_low;
    out->gs = sgd ? sgd_group(a) : ADAM_GROUP;
    out->has_coef = (sgd ? a->sgd.has_coef : a->adam.has_coef) != 0;
    out->ng = n_groups(n_in, out->gs, out->has_coef, n_low);
    out->n_low = (int)n_low;
    out->first_copy = out->ng * out->gs + out->has_coef;
    return out->ng > 0;
}

/* The low-precision copies (attribute n_low, passes/weight_copies.c): copy j, input
 * ng * gs + has_coef + j, is the bf16 or f16 image of the f32 parameter of group j. */
static ts_status check_copies(const ts_graph *g, const ts_node *n, int gs, int ng, int has_coef,
                              int64_t n_low) {
    for (int j = 0; j < n_low; j++) {
        const ts_type *p = ts_in_type(g, n, j * gs), *c = ts_in_type(g, n, ng * gs + has_coef + j);
        if (p->dtype != TS_F32 || (c->dtype != TS_BF16 && c->dtype != TS_F16) ||
            c->rank != p->rank || memcmp(c->dims, p->dims, sizeof(int64_t) * (size_t)p->rank)) {
            char a[128], b[128];
            return ts_fail(TS_ERR_SHAPE,
                           "low-precision copy %d is %s; parameter %d is %s (an f32 parameter's "
                           "copy is bf16 or f16 of its shape)",
                           j, ts_type_str(a, sizeof a, c), j, ts_type_str(b, sizeof b, p));
        }
    }
    return TS_OK;
}

static ts_status infer_sgd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    (void)out;
    int has_buf = n->a.sgd.has_buf != 0, has_coef = n->a.sgd.has_coef != 0, gs = sgd_group(&n->a);
    const int64_t n_low = n->a.sgd.n_low;
    int ng = n_groups(n->n_in, gs, has_coef, n_low);
    if (ng == 0)
        return ts_fail(TS_ERR_INVALID,
                       "expects %d inputs (p, g%s) per parameter%s and %lld copies, got %d",
                       2 + has_buf, has_buf ? ", buf" : "", has_coef ? ", the coefficient" : "",
                       (long long)n_low, n->n_in);
    if (n->a.sgd.nesterov && !has_buf)
        return ts_fail(TS_ERR_INVALID, "nesterov momentum needs a momentum buffer");
    ts_status s = TS_OK;
    for (int j = 0; j < ng && s == TS_OK; j++) {
        s = check_param(g, n, j * gs);
        if (s == TS_OK && has_buf) s = check_same(g, n, j * gs, 2, "momentum buffer");
    }
    if (s == TS_OK && has_coef) s = check_coef(g, n, ng * gs);
    if (s == TS_OK) s = check_copies(g, n, gs, ng, has_coef, n_low);
    *n_out = 0;
    return s;
}

static ts_status infer_adam(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    (void)out;
    int has_coef = n->a.adam.has_coef != 0;
    const int64_t n_low = n->a.adam.n_low;
    int ng = n_groups(n->n_in, ADAM_GROUP, has_coef, n_low);
    if (ng == 0)
        return ts_fail(TS_ERR_INVALID,
                       "expects 4 inputs (p, g, m, v) per parameter%s and %lld copies, got %d",
                       has_coef ? ", the coefficient" : "", (long long)n_low, n->n_in);
    ts_status s = TS_OK;
    for (int j = 0; j < ng && s == TS_OK; j++) {
        int b = j * ADAM_GROUP;
        s = check_param(g, n, b);
        if (s == TS_OK) s = check_same(g, n, b, 2, "first moment");
        if (s == TS_OK) s = check_same(g, n, b, 3, "second moment");
    }
    if (s == TS_OK && has_coef) s = check_coef(g, n, ng * ADAM_GROUP);
    if (s == TS_OK) s = check_copies(g, n, ADAM_GROUP, ng, has_coef, n_low);
    *n_out = 0;
    return s;
}

/* ---- SGD --------------------------------------------------------------- */

/* Constants of one update, computed in double as Python computes them; the
 * chunk functions round them to the parameter dtype where torch hands a
 * Python float to a kernel. */
typedef struct upd_args {
    /* ZeRO: the gradient is a sum over ranks, divided here (gdiv: g / gd,
     * else g * gm; gm = 1 / ranks is exact for a power of two, 1 without
     * ZeRO), so no pass of its own divides it */
    double gm, gd;
    int gdiv;
    double coef, wd, mom, damp1, neg_lr;                    /* SGD; damp1 = 1 - dampening */
    double pscale, b1, omb1, b2, omb2, bc2s, eps, neg_step; /* Adam */
    int use_wd, first, nesterov;
} upd_args;

/* One chunk of an update: t[0] = p, t[1] = g, t[2..3] = state (or NULL). */
typedef void (*upd_fn)(void *const *t, const upd_args *c, int64_t s, int64_t n);

/* torch.optim.SGD, _single_tensor_sgd (fma(a, b, c) = a * b + c rounded once):
 *   d_p = g (* clip coef);  if wd: d_p = fma(wd, p, d_p)
 *   if momentum: buf = first step ? d_p : fma(1 - dampening, d_p, buf * momentum)
 *                d_p = nesterov ? fma(momentum, buf, d_p) : buf
 *   p = fma(-lr, d_p, p)
 * Without a buffer t[2] is NULL. The flags are loop-invariant, so the
 * compiler unswitches them out of the vectorised loops. */
#define DEF_SGD(name, T, FMA)                                                                      \
    OPT_CLONES static void name(void *const *t, const upd_args *c, int64_t s, int64_t n) {         \
        T *restrict p = (T *)t[0] + s, *restrict buf = t[2] ? (T *)t[2] + s : NULL;                \
        const T *restrict g = (const T *)t[1] + s;                                                 \
        const T coef = (T)c->coef, wd = (T)c->wd, mom = (T)c->mom, damp1 = (T)c->damp1;            \
        const T neg_lr = (T)c->neg_lr, gm = (T)c->gm, gd = (T)c->gd;                               \
        const int use_wd = c->use_wd, first = c->first, nesterov = c->nesterov, gdiv = c->gdiv;    \
        if (!buf) {                                                                                \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T d = (gdiv ? g[i] / gd : g[i] * gm) * coef;                                       \
                if (use_wd) d = FMA(wd, p[i], d);                                                  \
                p[i] = FMA(neg_lr, d, p[i]);                                                       \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T d = (gdiv ? g[i] / gd : g[i] * gm) * coef;                                           \
            if (use_wd) d = FMA(wd, p[i], d);                                                      \
            T b = first ? d : FMA(damp1, d, buf[i] * mom);                                         \
            buf[i] = b;                                                                            \
            d = nesterov ? FMA(mom, b, d) : b;                                                     \
            p[i] = FMA(neg_lr, d, p[i]);                                                           \
        }                                                                                          \
    }

DEF_SGD(sgd_f32, float, fmaf)
DEF_SGD(sgd_f64, double, fma)

/* torch.optim.Adam / AdamW, _single_tensor_adam(w) (amsgrad off):
 *   g = g (* clip coef)
 *   Adam with wd:  g = fma(wd, p, g)       AdamW:  p = p * (1 - lr * wd)
 *   m = fma(1 - beta1, g, m * beta1)
 *   v = fma((1 - beta2) * g, g, v * beta2)        (addcmul: (value * g) * g + v)
 *   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
 *   p = p + (-lr / (1 - beta1^t)) * m / denom     (addcdiv: (value * m) / denom)
 * For Adam pscale is 1 (exact); for AdamW use_wd is 0. */
#define DEF_ADAM(name, T, SQRT, FMA)                                                               \
    OPT_CLONES static void name(void *const *t, const upd_args *c, int64_t s, int64_t n) {         \
        T *restrict p = (T *)t[0] + s, *restrict m = (T *)t[2] + s, *restrict v = (T *)t[3] + s;   \
        const T *restrict g = (const T *)t[1] + s;                                                 \
        const T coef = (T)c->coef, wd = (T)c->wd, pscale = (T)c->pscale, b1 = (T)c->b1;            \
        const T omb1 = (T)c->omb1, b2 = (T)c->b2, omb2 = (T)c->omb2, bc2s = (T)c->bc2s;            \
        const T eps = (T)c->eps, neg_step = (T)c->neg_step, gm = (T)c->gm, gd = (T)c->gd;          \
        const int use_wd = c->use_wd, gdiv = c->gdiv;                                              \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T gr = (gdiv ? g[i] / gd : g[i] * gm) * coef, pi = p[i];                               \
            if (use_wd) gr = FMA(wd, pi, gr);                                                      \
            pi = pi * pscale;                                                                      \
            T mi = FMA(omb1, gr, m[i] * b1);                                                       \
            T vi = FMA(omb2 * gr, gr, v[i] * b2);                                                  \
            m[i] = mi;                                                                             \
            v[i] = vi;                                                                             \
            T denom = SQRT(vi) / bc2s + eps;                                                       \
            p[i] = pi + neg_step * mi / denom;                                                     \
        }                                                                                          \
    }

DEF_ADAM(adam_f32, float, sqrtf, fmaf)
DEF_ADAM(adam_f64, double, sqrt, fma)

/* Scratch of a fused update: the first chunk index of each parameter
 * group (groups + 1 int64). */
static size_t upd_scratch_bytes(int ng) {
    if (ng + 1 <= 9) return 0; /* run_update keeps up to 9 on the stack */
    return TS_ALIGN_UP(sizeof(int64_t) * (size_t)(ng + 1), TS_ALIGN);
}

/* Rounds the chunk of new f32 parameters the update just wrote (still in L1) into their
 * bf16 / f16 copy: the bits the cast op gives (core/half.h), so a GEMM reading the copy
 * reads what it read from the cast of the weights the copy replaces. */

static void write_copy(const ts_tensor *copy, const float *p, int64_t s, int64_t n) {
    uint16_t *d = (uint16_t *)copy->data + s;
    if (copy->dtype != TS_BF16) {
        ts_f32_to_f16_n(d, p + s, n);
        return;
    }
    /* nothing reads the copy before the next step's GEMMs, long after it left the caches */
    ts_f32_to_bf16_stream_n(d, p + s, n);
}

/* Run an update over every parameter group in fixed chunks of each
 * tensor, all (group, chunk) pairs in one parallel loop. Elementwise, and
 * each tensor is chunked as it would be alone, so the result does not
 * depend on the grouping or on how chunks are spread over threads. The
 * first n_low groups' copies (from input ng * gs + has_coef on) are
 * rewritten chunk by chunk right after their parameter. */
static ts_status run_update(const ts_kargs *k, const char *op, upd_fn f, int gs, int ng,
                            int has_state2, int has_coef, int64_t n_low, const upd_args *c) {
    int64_t local[9], *first = local;
    if (ng + 1 > (int)(sizeof local / sizeof local[0])) {
        if (!k->scratch || k->scratch_bytes < sizeof(int64_t) * (size_t)(ng + 1))
            return ts_fail(TS_ERR_INTERNAL, "%s '%s': scratch too small (%zu bytes)", op, lbl(k),
                           k->scratch_bytes);
        first = k->scratch;
    }
    int64_t total = 0;
    first[0] = 0;
    for (int j = 0; j < ng; j++) {
        int64_t n = ts_tensor_numel(&k->in[j * gs]);
        total += n;
        first[j + 1] = first[j] + (n + OPT_CHUNK - 1) / OPT_CHUNK;
    }
    const int64_t nch = first[ng];
    const ts_tensor *in = k->in, *copies = k->in + ng * gs + has_coef;
    if (n_low > 0 && k->in[0].dtype != TS_F32)
        return ts_fail(TS_ERR_INTERNAL, "%s '%s': low-precision copies of %s parameters", op,
                       lbl(k), ts_dtype_name(k->in[0].dtype));
#pragma omp parallel for schedule(static) if (total >= TS_PAR_MIN)
    for (int64_t ch = 0; ch < nch; ch++) {
        int lo = 0, hi = ng; /* the last group whose first chunk is <= ch */
        while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            if (first[mid] <= ch)
                lo = mid;
            else
                hi = mid;
        }
        const ts_tensor *t0 = &in[lo * gs];
        void *t[4] = {t0[0].data, t0[1].data, gs > 2 ? t0[2].data : NULL,
                      has_state2 ? t0[3].data : NULL};
        int64_t n = ts_tensor_numel(t0), s = (ch - first[lo]) * OPT_CHUNK;
        f(t, c, s, n - s < OPT_CHUNK ? n - s : OPT_CHUNK);
        if (lo < n_low)
            write_copy(&copies[lo], t0[0].data, s, n - s < OPT_CHUNK ? n - s : OPT_CHUNK);
    }
    return TS_OK;
}

/* The clip coefficient as a double (exact for f32 and f64), 1 without one. */
static double coef_of(const ts_tensor *c) {
    return c->dtype == TS_F32 ? (double)*(const float *)c->data : *(const double *)c->data;
}

/* The optimizer's update count: opt_step, or step where the caller does
 * not count updates separately (opt_step 0, e.g. a kernel run alone). */
static int64_t opt_step_of(const ts_step_ctx *c) {
    return c->opt_step > 0 ? c->opt_step : c->step;
}

/* The per-step constants of SGD (a: sgd_update's attributes) and of Adam
 * (a: adam_update's), shared by the full update and ZeRO's shard update so
 * both take the same step. */
/* The gradient divisor of a sum over `ranks` (1: none; see upd_args). */
static void grad_divisor(upd_args *c, int64_t ranks) {
    if (ranks < 1) ranks = 1;
    c->gdiv = (ranks & (ranks - 1)) != 0;
    c->gd = (double)ranks;
    c->gm = 1.0 / (double)ranks;
}

static void sgd_consts(upd_args *c, const ts_sgd_attrs *a, const ts_step_ctx *ctx, double coef) {
    grad_divisor(c, 1);
    c->coef = coef; /* g * 1 is exact */
    c->mom = a->momentum;
    c->damp1 = 1.0 - a->dampening;
    c->wd = a->weight_decay;
    c->use_wd = a->weight_decay != 0;
    c->neg_lr = -ctx->lr;
    c->first = opt_step_of(ctx) == 1;
    c->nesterov = a->nesterov != 0;
}

static void adam_consts(upd_args *c, const ts_adam_attrs *a, const ts_step_ctx *ctx, double coef) {
    const int decoupled = a->decoupled != 0;
    const double b1 = a->beta1, b2 = a->beta2, wd = a->weight_decay, lr = ctx->lr;
    const double t = (double)opt_step_of(ctx);
    grad_divisor(c, 1);
    c->coef = coef;
    c->wd = wd;
    c->use_wd = !decoupled && wd != 0;
    c->pscale = decoupled ? 1.0 - lr * wd : 1.0;
    c->b1 = b1;
    c->omb1 = 1.0 - b1;
    c->b2 = b2;
    c->omb2 = 1.0 - b2;
    c->bc2s = sqrt(1.0 - pow(b2, t));
    c->eps = a->eps;
    c->neg_step = -(lr / (1.0 - pow(b1, t)));
}

/* The momentum buffer is created on the first step as a copy of d_p (no
 * dampening), as torch does when the buffer is None. The plan has no
 * "None" state, so "first" means the first applied update (opt_step 1): a
 * run resumed with ts_plan_set_step() continues with the restored buffer,
 * and a fresh plan starts at update 1 whatever the buffer holds. */
static ts_status k_sgd(const ts_kargs *k) {
    const ts_attrs *a = k->a;
    int has_buf = a->sgd.has_buf != 0, has_coef = a->sgd.has_coef != 0;
    ts_dtype dt = k->in[0].dtype;
    if (dt != TS_F32 && dt != TS_F64) return ts_kernel_bad_dtype(k, "sgd_update", dt);
    if (!k->ctx) return ts_fail(TS_ERR_INTERNAL, "sgd_update '%s': no step context", lbl(k));
    upd_args c = {0};
    int gs = sgd_group(a), ng = n_groups(k->n_in, gs, has_coef, a->sgd.n_low);
    if (ng == 0) return ts_fail(TS_ERR_INTERNAL, "sgd_update '%s': bad input count", lbl(k));
    sgd_consts(&c, &a->sgd, k->ctx, has_coef ? coef_of(&k->in[ng * gs]) : 1.0);
    (void)has_buf;
    return run_update(k, "sgd_update", dt == TS_F32 ? sgd_f32 : sgd_f64, gs, ng, 0, has_coef,
                      a->sgd.n_low, &c);
}

/* The step t of the bias corrections is the applied-update count
 * ctx->opt_step (1-based; torch increments it only when optimizer.step()
 * runs, so a skipped step does not advance it), and a resumed run continues
 * the corrections where it stopped. */
static ts_status k_adam(const ts_kargs *k) {
    const ts_attrs *a = k->a;
    int has_coef = a->adam.has_coef != 0;
    ts_dtype dt = k->in[0].dtype;
    if (dt != TS_F32 && dt != TS_F64) return ts_kernel_bad_dtype(k, "adam_update", dt);
    if (!k->ctx) return ts_fail(TS_ERR_INTERNAL, "adam_update '%s': no step context", lbl(k));
    const int64_t opt_step = opt_step_of(k->ctx);
    if (opt_step < 1)
        return ts_fail(TS_ERR_INVALID, "adam_update '%s': step %lld (steps count from 1)", lbl(k),
                       (long long)opt_step);
    upd_args c = {0};
    int ng = n_groups(k->n_in, ADAM_GROUP, has_coef, a->adam.n_low);
    if (ng == 0) return ts_fail(TS_ERR_INTERNAL, "adam_update '%s': bad input count", lbl(k));
    adam_consts(&c, &a->adam, k->ctx, has_coef ? coef_of(&k->in[ng * ADAM_GROUP]) : 1.0);
    return run_update(k, "adam_update", dt == TS_F32 ? adam_f32 : adam_f64, ADAM_GROUP, ng, 1,
                      has_coef, a->adam.n_low, &c);
}

/* ---- ZeRO: the update of one rank's shard ------------------------------ */

/* shard_update (p1..pk, g_shard, s1[, s2][, coef]): the optimizer update of
 * elements [offset, offset + numel(g_shard)) of the flat range the parameters
 * p1..pk span in the arena (they are laid out one after the other, with
 * zero padding between them, by memplan for a ZeRO bucket; the distribute
 * pass makes these nodes). g_shard is the rank's reduced gradient shard and
 * s1, s2 its optimizer state (the momentum buffer, or Adam's moments), as
 * long as the shard. Attributes a.shard (core/attrs.h): opt_op is the
 * update op it replaces (sgd_update or adam_update) and opt that op's
 * attributes, so every element gets exactly the arithmetic of the
 * unsharded update; zero padding stays zero (zero gradient, zero state).
 * n_params is k. */
static int shard_has_coef(const ts_shard_attrs *a) {
    return (a->opt_op == TS_OP_ADAM_UPDATE ? a->opt.adam.has_coef : a->opt.sgd.has_coef) != 0;
}

static ts_status infer_shard(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    (void)out;
    const ts_shard_attrs *a = &n->a.shard;
    const int k = (int)a->n_params,
              ns = a->opt_op == TS_OP_ADAM_UPDATE ? 2 : (int)a->opt.sgd.has_buf;
    const int has_coef = shard_has_coef(a), fused = a->fused_ranks > 0, ng = fused ? k : 1;
    if (a->opt_op != TS_OP_ADAM_UPDATE && a->opt_op != TS_OP_SGD_UPDATE)
        return ts_fail(TS_ERR_INVALID, "opt_op must be sgd_update or adam_update");
    if ((a->opt_op == TS_OP_ADAM_UPDATE ? a->opt.adam.n_low : a->opt.sgd.n_low) != 0)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "a shard update writes no low-precision weight copies (n_low): ZeRO "
                       "plans keep the weights' casts");
    if (k < 1 || n->n_in != k + ng + ns + has_coef)
        return ts_fail(TS_ERR_INVALID, "expects %d parameters, %s, %d states%s", k,
                       fused ? "their gradients" : "the gradient shard", ns,
                       has_coef ? " and the clip coefficient" : "");
    /* across ranks the fold has no norm to clip with; on one copy (dist.reproducible) the
     * coefficient comes from the whole gradients */
    if (fused && has_coef && a->fused_ranks > 1)
        return ts_fail(TS_ERR_INVALID, "a fused shard update takes no clip coefficient");
    const ts_dtype dt = ts_in_type(g, n, k)->dtype;
    for (int j = 0; j < k + ng; j++)
        if (ts_in_type(g, n, j)->dtype != dt)
            return ts_fail(TS_ERR_SHAPE, "%s %d is %s, the gradient %s",
                           j < k ? "parameter" : "gradient", j < k ? j : j - k,
                           ts_dtype_name(ts_in_type(g, n, j)->dtype), ts_dtype_name(dt));
    if (dt != TS_F32 && dt != TS_F64)
        return ts_fail(TS_ERR_SHAPE, "the gradient shard must be f32 or f64");
    for (int j = 0; j < ns; j++) {
        const ts_type *t = ts_in_type(g, n, k + ng + j);
        if (t->dtype != dt || t->rank != 1 ||
            t->dims[0] != (fused ? a->fused_elems : ts_type_numel(ts_in_type(g, n, k))))
            return ts_fail(TS_ERR_SHAPE, "state %d does not match the gradient shard", j);
    }
    *n_out = 0;
    return TS_OK;
}

/* Fused shard update: the sum over `nr` ranks of elements [e, e + n) of
 * the bucket's flat gradient range starting at g, rank q's copy at g +
 * delta[q]: ((g_0 + g_1) + g_2 ...), the reduce-scatter's fold; the update
 * divides it by nr as it does a reduce-scatter shard (grad_divisor). */
#define DEF_SUM(name, T)                                                                           \
    static void name(T *restrict out, const char *g, const ptrdiff_t *delta, int nr, int64_t e,    \
                     int64_t n) {                                                                  \
        const T *s0 = (const T *)(g + delta[0]) + e, *s1 = (const T *)(g + delta[1]) + e;          \
        for (int64_t i = 0; i < n; i++) out[i] = s0[i] + s1[i];                                    \
        for (int q = 2; q < nr; q++) {                                                             \
            const T *sq = (const T *)(g + delta[q]) + e;                                           \
            for (int64_t i = 0; i < n; i++) out[i] = out[i] + sq[i];                               \
        }                                                                                          \
    }
DEF_SUM(ranks_sum_f32, float)
DEF_SUM(ranks_sum_f64, double)

static ts_status k_shard(const ts_kargs *k) {
    const ts_shard_attrs *a = &k->a->shard;
    const int np = (int)a->n_params, adam = a->opt_op == TS_OP_ADAM_UPDATE;
    const int ns = adam ? 2 : (int)a->opt.sgd.has_buf, has_coef = shard_has_coef(a);
    const int nr = (int)a->fused_ranks, ng = nr > 0 ? np : 1; /* nr > 0: fused */
    const ts_tensor *gs = &k->in[np];
    const ts_dtype dt = gs->dtype;
    const size_t es = ts_dtype_size(dt);
    if (!k->ctx) return ts_fail(TS_ERR_INTERNAL, "shard_update '%s': no step context", lbl(k));
    const int64_t n = nr > 0 ? a->fused_elems : ts_tensor_numel(gs), off = a->offset;
    const ts_dist_rt *rt = k->backend;
    if (nr > 1 && (!rt || !rt->peer_delta || nr != ts_comm_size(rt->comm)))
        return ts_fail(TS_ERR_INTERNAL, "shard_update '%s': no peers' gradients in this plan",
                       lbl(k));
    const char *lo = k->in[0].data;
    const ts_tensor *last = &k->in[np - 1];
    const char *hi = (const char *)last->data + (size_t)ts_tensor_numel(last) * es;
    if (off < 0 || lo + (size_t)(off + n) * es > hi)
        return ts_fail(
            TS_ERR_INTERNAL,
            "shard_update '%s': shard [%lld, %lld) outside the parameters' %lld elements", lbl(k),
            (long long)off, (long long)(off + n), (long long)((hi - lo) / es));
    upd_args c = {0};
    const double coef = has_coef ? coef_of(&k->in[k->n_in - 1]) : 1.0;
    upd_fn f;
    if (adam) {
        if (opt_step_of(k->ctx) < 1)
            return ts_fail(TS_ERR_INVALID, "shard_update '%s': step %lld (steps count from 1)",
                           lbl(k), (long long)opt_step_of(k->ctx));
        adam_consts(&c, &a->opt.adam, k->ctx, coef);
        f = dt == TS_F32 ? adam_f32 : adam_f64;
    } else {
        sgd_consts(&c, &a->opt.sgd, k->ctx, coef);
        f = dt == TS_F32 ? sgd_f32 : sgd_f64;
    }
    grad_divisor(&c, a->divisor); /* the reduce-scatter, or the fused fold, leaves the sum */
    void *t[4] = {(char *)lo + (size_t)off * es, gs->data, ns > 0 ? k->in[np + ng].data : NULL,
                  ns > 1 ? k->in[np + ng + 1].data : NULL};
    const int64_t nch = (n + OPT_CHUNK - 1) / OPT_CHUNK;
    if (nr > 0) { /* the bucket's gradients are one range (memplan), as its parameters are */
        const char *glo = gs->data;
        const ts_tensor *gl = &k->in[2 * np - 1];
        if ((const char *)gl->data + (size_t)ts_tensor_numel(gl) * es - glo <
            (off + n) * (ptrdiff_t)es)
            return ts_fail(TS_ERR_INTERNAL, "shard_update '%s': gradients not one range", lbl(k));
        t[1] = (char *)glo + (size_t)off * es; /* nr 1: this rank's block, read in place */
    }
    if (nr > 1) {
        /* This rank's block of the range, summed over the ranks chunk by
         * chunk into a buffer the update then reads. */
        const char *glo = gs->data;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
        for (int64_t ch = 0; ch < nch; ch++) {
            _Alignas(64) double buf[OPT_CHUNK]; /* OPT_CHUNK elements of f32 or f64 */
            const int64_t s = ch * OPT_CHUNK, len = n - s < OPT_CHUNK ? n - s : OPT_CHUNK;
            if (dt == TS_F32)
                ranks_sum_f32((float *)buf, glo, rt->peer_delta, nr, off + s, len);
            else
                ranks_sum_f64(buf, glo, rt->peer_delta, nr, off + s, len);
            void *tc[4] = {(char *)t[0] + (size_t)s * es, buf,
                           t[2] ? (char *)t[2] + (size_t)s * es : NULL,
                           t[3] ? (char *)t[3] + (size_t)s * es : NULL};
            f(tc, &c, 0, len);
        }
        return TS_OK;
    }
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t ch = 0; ch < nch; ch++) {
        int64_t s = ch * OPT_CHUNK;
        f(t, &c, s, n - s < OPT_CHUNK ? n - s : OPT_CHUNK);
    }
    return TS_OK;
}

static double cost_shard(const ts_graph *g, const ts_node *n) {
    const ts_shard_attrs *a = &n->a.shard;
    if (a->fused_ranks > 0) return (14.0 + (double)a->fused_ranks) * (double)a->fused_elems;
    return 14.0 * (double)ts_type_numel(ts_in_type(g, n, (int)a->n_params));
}

const ts_op_def ts_def_shard_update = {.name = "shard_update",
                                       .min_in = 2,
                                       .max_in = -1,
                                       .flags = TS_OPF_SIDE_EFFECT | TS_OPF_UPDATE,
                                       .infer = infer_shard,
                                       .kernel = k_shard,
                                       .cost = cost_shard};

/* ---- costs and definitions --------------------------------------------- */

static double group_numel(const ts_graph *g, const ts_node *n, int gs, int has_coef,
                          int64_t n_low) {
    double e = 0;
    for (int j = 0, ng = n_groups(n->n_in, gs, has_coef, n_low); j < ng; j++)
        e += (double)ts_type_numel(ts_in_type(g, n, j * gs));
    return e;
}
static double cost_sgd(const ts_graph *g, const ts_node *n) {
    return 6.0 * group_numel(g, n, sgd_group(&n->a), n->a.sgd.has_coef != 0, n->a.sgd.n_low);
}
static double cost_adam(const ts_graph *g, const ts_node *n) {
    return 14.0 * group_numel(g, n, ADAM_GROUP, n->a.adam.has_coef != 0, n->a.adam.n_low);
}
static size_t scratch_sgd(const ts_graph *g, const ts_node *n) {
    (void)g;
    return upd_scratch_bytes(
        n_groups(n->n_in, sgd_group(&n->a), n->a.sgd.has_coef != 0, n->a.sgd.n_low));
}
static size_t scratch_adam(const ts_graph *g, const ts_node *n) {
    (void)g;
    return upd_scratch_bytes(
        n_groups(n->n_in, ADAM_GROUP, n->a.adam.has_coef != 0, n->a.adam.n_low));
}
const ts_op_def ts_def_sgd_update = {.name = "sgd_update",
                                     .min_in = 2,
                                     .max_in = -1,
                                     .flags = TS_OPF_SIDE_EFFECT | TS_OPF_UPDATE,
                                     .infer = infer_sgd,
                                     .kernel = k_sgd,
                                     .scratch = scratch_sgd,
                                     .cost = cost_sgd};

const ts_op_def ts_def_adam_update = {.name = "adam_update",
                                      .min_in = 4,
                                      .max_in = -1,
                                      .flags = TS_OPF_SIDE_EFFECT | TS_OPF_UPDATE,
                                      .infer = infer_adam,
                                      .kernel = k_adam,
                                      .scratch = scratch_adam,
                                      .cost = cost_adam};
