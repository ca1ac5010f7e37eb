/* dnnl_matmul.c — oneDNN matmul wrapper: create once, run many times. */
#include "backends/cpu/dnnl_matmul.h"
#include "backends/cpu/dnnl_matmul_head.h"
#include "backends/cpu/dnnl_matmul_ksplit.h"
#include "backends/cpu/dnnl_matmul_rows.h"
#include "backends/cpu/dnnl_matmul_threads.h"

#include <dnnl.h>
#include <dnnl_debug.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "core/half.h"

struct ts_mm {
    ts_mm_desc d;
    char label[64];
    char what[400]; /* "matmul 'label' f32[2,3,5] x f32[5,7]^T -> f32[2,3,7]" */
    dnnl_primitive_t prim;
    dnnl_memory_t mem_a, mem_b, mem_c, mem_s; /* mem_s is NULL without scratchpad */
    dnnl_memory_t mem_post[4]; /* operands of d.post, in order: a leading bias as DNNL_ARG_BIAS */
    int n_post_src;
    dnnl_exec_arg_t args[8];
    int nargs;
    size_t scratch_bytes;
    int nthr;
    char impl[64];
    /* Widened: A and B are bf16/f16 but the primitive is f32 x f32 (see ts_mm_create); a run
     * first converts them into the caller's scratch, after oneDNN's own scratchpad. */
    int widen;
    size_t dnnl_scratch_bytes; /* oneDNN's part of scratch_bytes; f32 A, B (and C) follow */
    int64_t a_elems, b_elems, c_elems;
    ts_mm_ksplit *ks;     /* set: the product runs in K blocks in a fixed order, without prim */
    int one_thread;       /* thread-sensitive (dnnl_matmul_threads.h): every run uses one thread */
    ts_mm_rows *rows;     /* set: one-thread products over row blocks in parallel, without prim */
    dnnl_stream_t stream; /* its own stream (ts_mm_own_stream), or NULL: the global one */
    /* An LM head's GEMMs (dnnl_matmul_head.h): */
    ts_mm *bare;        /* set: the product without its add post-ops, added after */
    int64_t row_blocks; /* the primitive computes M / row_blocks rows; a run loops */
    ts_mm_packed_b pb;  /* pb.own or pb.reorder set: a run first packs B into its scratch (mem_b) */
};

/* ---- global engine and stream ------------------------------------------ */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static dnnl_status_t g_init_status = dnnl_success;
static const char *g_init_call = "";

static void init_engine(void) {
    dnnl_status_t st = dnnl_engine_create(&g_engine, dnnl_cpu, 0);
    if (st != dnnl_success) {
        g_init_status = st;
        g_init_call = "dnnl_engine_create";
        g_engine = NULL;
        return;
    }
    st = dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        g_init_status = st;
        g_init_call = "dnnl_stream_create";
        g_stream = NULL;
        dnnl_engine_destroy(g_engine);
        g_engine = NULL;
    }
}

static ts_status dnnl_to_ts(dnnl_status_t st) {
    switch (st) {
    case dnnl_success: return TS_OK;
    case dnnl_out_of_memory: return TS_ERR_NOMEM;
    case dnnl_invalid_arguments: return TS_ERR_INVALID;
    case dnnl_unimplemented: return TS_ERR_UNSUPPORTED;
    default: return TS_ERR_INTERNAL;
    }
}

/* Convert a failed oneDNN call into a ts_status naming the op and the call. */
static ts_status dnnl_fail(dnnl_status_t st, const char *what, const char *call) {
    return ts_fail(dnnl_to_ts(st), "%s: %s failed: %s", what, call, dnnl_status2str(st));
}

#define TS_DNNL_TRY(m, call)                                                                       \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            ts_status ts_ = dnnl_fail(st_, (m)->what, #call);                                      \
            ts_mm_free(m);                                                                         \
            return ts_;                                                                            \
        }                                                                                          \
    } while (0)

/* ---- descriptors --------------------------------------------------------- */

static const char *op_label(const ts_mm_desc *d) {
    return d->label ? d->label : "?";
}

/* "f32[2,3,5]" or "f32[3,5]^T" for an operand stored as `rows x cols`. */
static void operand_str(char *buf, size_t n, ts_dtype dt, int64_t batch, int64_t rows, int64_t cols,
                        int trans) {
    const char *tn = (unsigned)dt < TS_DTYPE_COUNT ? ts_dtype_name(dt) : "?";
    if (batch > 0)
        snprintf(buf, n, "%s[%lld,%lld,%lld]%s", tn, (long long)batch, (long long)rows,
                 (long long)cols, trans ? "^T" : "");
    else
        snprintf(buf, n, "%s[%lld,%lld]%s", tn, (long long)rows, (long long)cols,
                 trans ? "^T" : "");
}

/* Describe the op for messages; batch dims are shown only when batch > 1. */
static void describe(char *buf, size_t n, const ts_mm_desc *d) {
    char sa[80], sb[80], sc[80];
    int batched = d->batch != 1;
    int64_t ba = batched && !d->a_broadcast ? d->batch : 0;
    int64_t bb = batched && !d->b_broadcast ? d->batch : 0;
    /* shapes as stored in memory */
    operand_str(sa, sizeof sa, d->a_dt, ba, d->trans_a ? d->K : d->M, d->trans_a ? d->M : d->K,
                d->trans_a);
    operand_str(sb, sizeof sb, d->b_dt, bb, d->trans_b ? d->N : d->K, d->trans_b ? d->K : d->N,
                d->trans_b);
    operand_str(sc, sizeof sc, d->c_dt, batched ? d->batch : 0, d->M, d->N, 0);
    snprintf(buf, n, "matmul '%.63s' %s x %s %s %s", op_label(d), sa, sb,
             d->accumulate ? "+->" : "->", sc);
}

static ts_status check_desc(const ts_mm_desc *d, const char *what) {
    if (d->batch < 1 || d->M < 1 || d->N < 1 || d->K < 1)
        return ts_fail(TS_ERR_SHAPE, "%s: batch, M, N and K must be >= 1", what);
    /* Every element count, with its byte size, must fit comfortably in int64. */
    const int64_t lim = INT64_C(1) << 40;
    if (d->M > lim / d->K || d->K > lim / d->N || d->M > lim / d->N ||
        d->batch > lim / (d->M * d->K) || d->batch > lim / (d->K * d->N) ||
        d->batch > lim / (d->M * d->N))
        return ts_fail(TS_ERR_SHAPE, "%s: operands too large", what);
    return TS_OK;
}

static ts_status check_types(const ts_mm_desc *d, const char *what) {
    int ok =
        (d->a_dt == TS_F32 && d->b_dt == TS_F32 && d->c_dt == TS_F32) ||
        (d->a_dt == TS_BF16 && d->b_dt == TS_BF16 && (d->c_dt == TS_F32 || d->c_dt == TS_BF16)) ||
        (d->a_dt == TS_F16 && d->b_dt == TS_F16 && (d->c_dt == TS_F32 || d->c_dt == TS_F16));
    if (!ok)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "%s: dtype combination not supported (want f32 x f32 -> f32 or "
                       "bf16 x bf16 -> f32/bf16 or f16 x f16 -> f32/f16)",
                       what);
    return TS_OK;
}

static dnnl_data_type_t to_dnnl_dt(ts_dtype t) {
    return t == TS_BF16 ? dnnl_bf16 : t == TS_F16 ? dnnl_f16 : dnnl_f32;
}

/* Memory descriptor of a [batch?, rows, cols] logical matrix stored either
 * row-major as [rows, cols] or (trans) as [cols, rows]. Uses 2D when the
 * whole matmul has batch 1. */
static dnnl_status_t init_md(dnnl_memory_desc_t *md, int batched, int64_t batch, int64_t rows,
                             int64_t cols, int trans, ts_dtype dt) {
    dnnl_dims_t dims, strides;
    int nd = 0;
    if (batched) {
        dims[nd] = batch;
        strides[nd] = rows * cols;
        nd++;
    }
    dims[nd] = rows;
    strides[nd] = trans ? 1 : cols;
    dims[nd + 1] = cols;
    strides[nd + 1] = trans ? rows : 1;
    return dnnl_memory_desc_init_by_strides(md, nd + 2, dims, to_dnnl_dt(dt), strides);
}

/* ---- create / run / free ------------------------------------------------ */

/* The first 64-byte boundary at or after p (the caller's scratch need not be aligned). */
static float *align_ptr(void *p) {
    return (float *)TS_ALIGN_UP((uintptr_t)p, TS_ALIGN);
}

/* dst[i] = src[i] rounded to nearest even, into a bf16 or f16 result
 * (core's array conversions: vectorised, threaded from 64 Ki elements). */
static void narrow_from_f32(void *dst, const float *src, ts_dtype dt, int64_t n) {
    (dt == TS_BF16 ? ts_f32_to_bf16_n : ts_f32_to_f16_n)(dst, src, n);
}

/* dst[i] = (float)src[i] for a bf16 or f16 operand. */
static void widen_to_f32(float *dst, const void *src, ts_dtype dt, int64_t n) {
    (dt == TS_BF16 ? ts_bf16_to_f32_n : ts_f16_to_f32_n)(dst, src, n);
}

/* Whether oneDNN 2.6 serves f32 matmul with its brgemm kernels (AVX-512 and up), whose
 * one-thread K order dnnl_matmul_ksplit.h reproduces. Below that (AVX2: gemm:jit) the one-thread
 * order is another, and the thread probe (dnnl_matmul_threads.h) keeps the bits instead. */
static int brgemm_isa(void) {
    return (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
}

/* Whether `d` runs on oneDNN 2.6's AMX kernels (bf16 on a CPU with AMX), whose one-thread K
 * order follows the shape and which dnnl_matmul_ksplit.h does not reproduce. */
static int amx_bf16(const ts_mm_desc *d) {
    const unsigned amx = (unsigned)dnnl_cpu_isa_avx512_core_amx;
    return d->a_dt == TS_BF16 && ((unsigned)dnnl_get_effective_cpu_isa() & amx) == amx;
}

static ts_status new_mm(const ts_mm_desc *d, ts_mm **out);

/* A ts_mm computing `d` as `nthr` one-thread products over row blocks (dnnl_matmul_rows.h). */
static ts_status create_rows(const ts_mm_desc *d, int nthr, ts_mm **out) {
    ts_mm *m = NULL;
    ts_status s = new_mm(d, &m);
    if (s == TS_OK) s = ts_mm_rows_create(&m->d, nthr, m->what, &m->rows);
    if (s != TS_OK) {
        ts_mm_free(m);
        return s;
    }
    m->nthr = nthr;
    m->n_post_src = d->n_post;
    m->scratch_bytes = ts_mm_rows_scratch_bytes(m->rows);
    snprintf(m->impl, sizeof m->impl, "%s", ts_mm_rows_impl(m->rows));
    *out = m;
    return TS_OK;
}

/* A thread-sensitive `m`'s replacement: its row split when that gives `m1`'s bits (the same
 * product created for one thread), else NULL. Fails only when creation or a probe run fails. */
static ts_status try_rows(ts_mm *m, ts_mm *m1, ts_mm **out) {
    *out = NULL;
    /* AMX only: elsewhere (gemm:jit on AVX2) the one-thread primitive stays, as before */
    if (!strstr(m->impl, "amx") || !ts_mm_rows_wanted(&m->d, m->nthr)) return TS_OK;
    ts_mm *mr = NULL;
    ts_status s = create_rows(&m->d, m->nthr, &mr);
    int sensitive = s == TS_OK ? ts_mm_probe_cached(mr, m->nthr) : 1;
    if (s == TS_OK && sensitive < 0) s = ts_mm_probe_threads(mr, m1, m->nthr, &sensitive);
    if (s == TS_OK && !sensitive)
        *out = mr;
    else
        ts_mm_free(mr);
    return s;
}

/* Hand out a created matmul, or, when its bits depend on the thread count (dnnl_matmul_threads.h),
 * its row split if that gives the one-thread bits (dnnl_matmul_rows.h), else the same product
 * created for one thread, marked to run on one thread. */
static ts_status finish_create(ts_mm *m, ts_mm **out) {
    const int nthr = m->nthr;
    int sensitive = 0;
    if (ts_mm_probe_wanted(m, nthr)) sensitive = ts_mm_probe_cached(m, nthr);
    if (sensitive == 0) {
        *out = m;
        return TS_OK;
    }
    ts_mm *m1 = NULL;
    omp_set_num_threads(1);
    ts_status s = ts_mm_create(&m->d, &m1);
    omp_set_num_threads(nthr);
    if (s == TS_OK && sensitive < 0) s = ts_mm_probe_threads(m, m1, nthr, &sensitive);
    if (s != TS_OK || !sensitive) {
        ts_mm_free(m1);
        if (s != TS_OK) {
            ts_mm_free(m);
            return s;
        }
        *out = m;
        return TS_OK;
    }
    ts_mm *mr = NULL;
    s = try_rows(m, m1, &mr);
    if (s != TS_OK || mr) {
        ts_mm_free(m1);
        ts_mm_free(m);
        *out = mr;
        return s;
    }
    ts_mm_free(m);
    m1->one_thread = 1;
    m1->nthr = nthr; /* the plan's thread count, as for any other matmul of the plan */
    size_t len = strlen(m1->impl);
    snprintf(m1->impl + len, sizeof m1->impl - len, "+1thr");
    *out = m1;
    return TS_OK;
}

/* A zeroed ts_mm holding a checked copy of `d` (label and description set), or an error. */
static ts_status new_mm(const ts_mm_desc *d, ts_mm **out) {
    *out = NULL;
    ts_mm *m = ts_zalloc(sizeof *m, "matmul primitive");
    if (!m) {
        ts_error_prefix("matmul '%s'", op_label(d));
        return TS_ERR_NOMEM;
    }
    m->d = *d;
    snprintf(m->label, sizeof m->label, "%s", op_label(d));
    m->d.label = m->label;
    describe(m->what, sizeof m->what, &m->d);

    ts_status s = check_desc(d, m->what);
    if (s == TS_OK) s = check_types(d, m->what);
    /* A bf16 / f16 C takes one bias, oneDNN's own (below): it rounds accumulator + bias once */
    const int one_bias = d->n_post == 1 && d->post[0] == TS_MM_POST_BIAS && !d->accumulate;
    if (s == TS_OK &&
        (d->n_post < 0 || d->n_post > 4 || (d->n_post && d->c_dt != TS_F32 && !one_bias)))
        s = ts_fail(TS_ERR_UNSUPPORTED,
                    "%s: %d post-ops (at most 4, f32 output only, or one bias for a %s output)",
                    m->what, d->n_post, ts_dtype_name(d->c_dt));
    if (s == TS_OK && d->batch > 1 && d->a_broadcast && d->b_broadcast)
        s = ts_fail(TS_ERR_UNSUPPORTED,
                    "%s: A and B both broadcast over the batch (oneDNN needs one of them "
                    "batched); compute one batch-1 product instead",
                    m->what);
    if (s != TS_OK) {
        ts_mm_free(m);
        return s;
    }
    *out = m;
    return TS_OK;
}

ts_status ts_mm_create(const ts_mm_desc *d, ts_mm **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "ts_mm_create: out is NULL");
    *out = NULL;
    if (!d) return ts_fail(TS_ERR_INVALID, "ts_mm_create: descriptor is NULL");
    ts_mm *m = NULL;
    ts_status s = new_mm(d, &m);
    if (s != TS_OK) return s;

    /* Full-size adds (a residual, an LM head's embedding gradient): the product with its bias,
     * then one pass of adds (dnnl_matmul_head.h). */
    const int head_isa = brgemm_isa() && !amx_bf16(d);
    ts_mm_head_plan hp = {.pack_b = 0, .row_blocks = 1, .post_after = 0};
    if (head_isa) hp = ts_mm_head_plan_for(d, omp_get_max_threads());
    if (hp.post_after) {
        ts_mm_desc bare = m->d;
        bare.n_post = d->n_post > 0 && d->post[0] == TS_MM_POST_BIAS; /* the bias, if any */
        s = ts_mm_create(&bare, &m->bare);
        if (s != TS_OK) {
            ts_error_prefix("%s (without its post-ops)", m->what);
            ts_mm_free(m);
            return s;
        }
        m->nthr = ts_mm_threads(m->bare);
        m->n_post_src = d->n_post;
        m->scratch_bytes = ts_mm_scratch_bytes(m->bare);
        snprintf(m->impl, sizeof m->impl, "%.50s+postadd", ts_mm_impl(m->bare));
        *out = m;
        return TS_OK;
    }

    /* A K that oneDNN might split between threads: blocks of K in one-thread order (not on AMX,
     * whose one-thread order is another: the thread probe in finish_create keeps those bits). */
    if (ts_mm_ksplit_wanted(d, omp_get_max_threads()) && brgemm_isa() && !amx_bf16(d)) {
        m->nthr = omp_get_max_threads();
        s = ts_mm_ksplit_create(&m->d, m->what, &m->ks);
        if (s != TS_OK) {
            ts_mm_free(m);
            return s;
        }
        m->n_post_src = d->n_post;
        m->scratch_bytes = ts_mm_ksplit_scratch_bytes(m->ks);
        snprintf(m->impl, sizeof m->impl, "%s", ts_mm_ksplit_impl(m->ks));
        return finish_create(m, out);
    }

    pthread_once(&g_once, init_engine);
    if (!g_engine) {
        s = dnnl_fail(g_init_status, m->what, g_init_call);
        ts_mm_free(m);
        return s;
    }

    int batched = d->batch != 1;
    m->row_blocks = 1;
    m->a_elems = (d->a_broadcast ? 1 : d->batch) * d->M * d->K;
    m->b_elems = (d->b_broadcast ? 1 : d->batch) * d->K * d->N;
    m->c_elems = d->batch * d->M * d->N;
    dnnl_memory_desc_t md_a, md_b, md_c;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_success;
    const char *call = "";
    for (;;) { /* at most twice: native operand types, then widened (m->widen) */
        ts_dtype a_dt = m->widen ? TS_F32 : d->a_dt, b_dt = m->widen ? TS_F32 : d->b_dt;
        if (m->widen) hp.pack_b = 0, hp.row_blocks = 1; /* bf16 brgemm only */
        m->row_blocks = hp.row_blocks;
        const int64_t rows = d->M / m->row_blocks; /* of A and C per run of the primitive */
        TS_DNNL_TRY(m, init_md(&md_a, batched, d->a_broadcast ? 1 : d->batch, rows, d->K,
                               d->trans_a, a_dt));
        TS_DNNL_TRY(m, init_md(&md_b, batched, d->b_broadcast ? 1 : d->batch, d->K, d->N,
                               d->trans_b, b_dt));
        ts_dtype c_dt = m->widen ? TS_F32 : d->c_dt;
        TS_DNNL_TRY(m, init_md(&md_c, batched, d->batch, rows, d->N, 0, c_dt));
        /* a packed B: the primitive chooses its layout ("any"), a run reorders B into it */
        dnnl_memory_desc_t md_b_any;
        if (hp.pack_b)
            TS_DNNL_TRY(m, dnnl_memory_desc_init_by_tag(&md_b_any, 2, md_b.dims, to_dnnl_dt(b_dt),
                                                        dnnl_format_tag_any));

        /* A leading bias goes to oneDNN as the matmul's own bias: its kernels add it to the
         * accumulators before they store C, where a binary post-op is a pass of its own over C
         * (W3's GEMMs with a bias: 3-8 % faster, docs/benchmarks.md). oneDNN adds the bias
         * before any post-op, so C = (AB + bias) + adds as before, bit for bit. Not with
         * accumulate, whose old C oneDNN's sum post-op would add after the bias. */
        const int arg_bias = !d->accumulate && d->n_post > 0 && d->post[0] == TS_MM_POST_BIAS;
        dnnl_memory_desc_t md_bias;
        if (arg_bias) TS_DNNL_TRY(m, init_md(&md_bias, batched, 1, 1, d->N, 0, TS_F32));
        dnnl_matmul_desc_t op;
        TS_DNNL_TRY(m, dnnl_matmul_desc_init(&op, &md_a, hp.pack_b ? &md_b_any : &md_b,
                                             arg_bias ? &md_bias : NULL, &md_c));

        /* The attribute and post-ops objects live only during creation. */
        dnnl_primitive_attr_t attr = NULL;
        dnnl_post_ops_t po = NULL;
        m->n_post_src = 0;
        st = dnnl_primitive_attr_create(&attr);
        call = "dnnl_primitive_attr_create";
        if (st == dnnl_success) {
            call = "dnnl_primitive_attr_set_scratchpad_mode";
            st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
        }
        if (st == dnnl_success) {
            call = "dnnl_primitive_attr_set_fpmath_mode";
            st = dnnl_primitive_attr_set_fpmath_mode(attr, dnnl_fpmath_mode_strict);
        }
        if (st == dnnl_success && arg_bias) {
            call = "dnnl_memory_create(bias)";
            st = dnnl_memory_create(&m->mem_post[0], &md_bias, g_engine, DNNL_MEMORY_NONE);
            if (st == dnnl_success) {
                m->args[4] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, m->mem_post[0]};
                m->n_post_src = 1;
            }
        }
        if (st == dnnl_success && (d->accumulate || d->n_post > arg_bias)) {
            call = "dnnl_post_ops_create";
            st = dnnl_post_ops_create(&po);
            if (st == dnnl_success && d->accumulate) {
                call = "dnnl_post_ops_append_sum";
                st = dnnl_post_ops_append_sum(po, 1.0f);
            }
            for (int p = arg_bias; st == dnnl_success && p < d->n_post; p++) {
                dnnl_memory_desc_t md1;
                call = "dnnl_memory_desc_init_by_strides(post-op)";
                if (d->post[p] == TS_MM_POST_BIAS)
                    st = init_md(&md1, batched, 1, 1, d->N, 0, TS_F32);
                else
                    st = init_md(&md1, batched, d->batch, d->M, d->N, 0, TS_F32);
                if (st == dnnl_success) {
                    call = "dnnl_post_ops_append_binary";
                    st = dnnl_post_ops_append_binary(po, dnnl_binary_add, &md1);
                }
                if (st == dnnl_success) {
                    call = "dnnl_memory_create(post-op)";
                    st = dnnl_memory_create(&m->mem_post[m->n_post_src], &md1, g_engine,
                                            DNNL_MEMORY_NONE);
                    if (st == dnnl_success) {
                        /* oneDNN numbers the post-ops: the sum, then the binary adds */
                        int idx = p - arg_bias + (d->accumulate ? 1 : 0);
                        m->args[4 + m->n_post_src] =
                            (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) | DNNL_ARG_SRC_1,
                                              m->mem_post[m->n_post_src]};
                        m->n_post_src++;
                    }
                }
            }
            if (st == dnnl_success) {
                call = "dnnl_primitive_attr_set_post_ops";
                st = dnnl_primitive_attr_set_post_ops(attr, po);
            }
        }
        if (st == dnnl_success) {
            /* oneDNN fixes its thread count (and blocking) here. */
            m->nthr = omp_get_max_threads();
            call = "dnnl_primitive_desc_create";
            st = dnnl_primitive_desc_create(&pd, &op, attr, g_engine, NULL);
        }
        if (po) dnnl_post_ops_destroy(po);
        if (attr) dnnl_primitive_attr_destroy(attr);
        /* Without AVX-512, oneDNN 2.6 has no bf16 x bf16 -> f32 matmul at all: widen (below). */
        if (st == dnnl_unimplemented && !m->widen && d->a_dt != TS_F32) {
            for (int p = 0; p < m->n_post_src; p++) {
                dnnl_memory_destroy(m->mem_post[p]);
                m->mem_post[p] = NULL;
            }
            m->widen = 1;
            continue;
        }
        if (st != dnnl_success) {
            s = dnnl_fail(st, m->what, call);
            ts_mm_free(m);
            return s;
        }

        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl)
            snprintf(m->impl, sizeof m->impl, "%s", impl);
        /* Without AVX512-BF16, oneDNN 2.6 serves bf16 x bf16 with its generic gemm:jit driver,
         * which splits K by the thread count it finds at creation and at run time (1 and 2 threads,
         * or a run inside a parallel region, give different sums). Widening the operands to f32 is
         * exact (every bf16/f16 product is exact in f32, and the sums are f32 either way) and the
         * f32 kernels never split K, so the bits stop depending on threads. */
        if (m->widen || strncmp(m->impl, "gemm:jit", 8) != 0 ||
            (d->a_dt == TS_F32 && d->b_dt == TS_F32))
            break;
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
        for (int p = 0; p < m->n_post_src; p++) {
            dnnl_memory_destroy(m->mem_post[p]);
            m->mem_post[p] = NULL;
        }
        m->widen = 1;
    }
    if (m->widen) snprintf(m->impl + strlen(m->impl), sizeof m->impl - strlen(m->impl), "+f32");
    const dnnl_memory_desc_t *md_s = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    m->dnnl_scratch_bytes = md_s ? dnnl_memory_desc_get_size(md_s) : 0;
    m->scratch_bytes = m->dnnl_scratch_bytes;
    if (m->widen)
        m->scratch_bytes = 64 + TS_ALIGN_UP(m->scratch_bytes, TS_ALIGN) +
                           TS_ALIGN_UP((size_t)m->a_elems * 4, TS_ALIGN) +
                           TS_ALIGN_UP((size_t)m->b_elems * 4, TS_ALIGN) +
                           (d->c_dt != TS_F32 ? (size_t)m->c_elems * 4 : 0);

    if (hp.pack_b) {
        st = ts_mm_packed_b_create(&m->pb, pd, &md_b, d->trans_b, g_engine, &m->mem_b, &call);
        if (st != dnnl_success) {
            s = dnnl_fail(st, m->what, call);
            dnnl_primitive_desc_destroy(pd);
            ts_mm_free(m);
            return s;
        }
        /* the packed B (and the reorder's scratchpad) follow oneDNN's scratchpad */
        m->scratch_bytes =
            64 + TS_ALIGN_UP(m->scratch_bytes, TS_ALIGN) + m->pb.packed_bytes + m->pb.rs_bytes;
        snprintf(m->impl + strlen(m->impl), sizeof m->impl - strlen(m->impl), "+packb");
    }
    if (m->row_blocks > 1)
        snprintf(m->impl + strlen(m->impl), sizeof m->impl - strlen(m->impl), "+rows%lld",
                 (long long)(d->M / m->row_blocks));

    st = dnnl_primitive_create(&m->prim, pd);
    call = "dnnl_primitive_create";
    if (st == dnnl_success && m->dnnl_scratch_bytes > 0) {
        st = dnnl_memory_create(&m->mem_s, md_s, g_engine, DNNL_MEMORY_NONE);
        call = "dnnl_memory_create(scratchpad)";
    }
    dnnl_primitive_desc_destroy(pd); /* md_s is not used past this point */
    if (st != dnnl_success) {
        s = dnnl_fail(st, m->what, call);
        ts_mm_free(m);
        return s;
    }

    TS_DNNL_TRY(m, dnnl_memory_create(&m->mem_a, &md_a, g_engine, DNNL_MEMORY_NONE));
    if (!m->mem_b) TS_DNNL_TRY(m, dnnl_memory_create(&m->mem_b, &md_b, g_engine, DNNL_MEMORY_NONE));
    TS_DNNL_TRY(m, dnnl_memory_create(&m->mem_c, &md_c, g_engine, DNNL_MEMORY_NONE));

    /* args[4..] already hold the bias and post-op operands; pack them after the others */
    dnnl_exec_arg_t post_args[4];
    memcpy(post_args, m->args + 4, sizeof post_args);
    m->args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, m->mem_a};
    m->args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, m->mem_b};
    m->args[2] = (dnnl_exec_arg_t){DNNL_ARG_DST, m->mem_c};
    m->nargs = 3;
    if (m->mem_s) m->args[m->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m->mem_s};
    for (int p = 0; p < m->n_post_src; p++) m->args[m->nargs++] = post_args[p];

    return finish_create(m, out);
}

ts_status ts_mm_own_stream(ts_mm *m) {
    if (m->bare) return ts_mm_own_stream(m->bare);
    if (m->ks || m->rows || m->stream) return TS_OK; /* no primitive of its own, or done */
    dnnl_status_t st = dnnl_stream_create(&m->stream, g_engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        m->stream = NULL;
        return dnnl_fail(st, m->what, "dnnl_stream_create");
    }
    return TS_OK;
}

int ts_mm_row_chunks_exact(void) {
    return brgemm_isa();
}

size_t ts_mm_scratch_bytes(const ts_mm *m) {
    return m ? m->scratch_bytes : 0;
}
const char *ts_mm_impl(const ts_mm *m) {
    return m ? m->impl : "";
}
int ts_mm_threads(const ts_mm *m) {
    return m ? m->nthr : 0;
}
const ts_mm_desc *ts_mm_get_desc(const ts_mm *m) {
    return m ? &m->d : NULL;
}

#define TS_DNNL_RUN(m, call)                                                                       \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) return dnnl_fail(st_, (m)->what, #call);                          \
    } while (0)

ts_status ts_mm_run(ts_mm *m, const void *a, const void *b, void *c, void *scratch) {
    if (m && m->n_post_src)
        return ts_fail(TS_ERR_INVALID, "%s: has post-op operands: use ts_mm_run_post", m->what);
    return ts_mm_run_post(m, a, b, c, NULL, scratch);
}

static ts_status run_post(ts_mm *m, const void *a, const void *b, void *c, const void *const *post,
                          void *scratch);

ts_status ts_mm_run_post(ts_mm *m, const void *a, const void *b, void *c, const void *const *post,
                         void *scratch) {
    if (!m) return ts_fail(TS_ERR_INVALID, "ts_mm_run: matmul is NULL");
    if (!m->one_thread) return run_post(m, a, b, c, post, scratch);
    /* oneDNN's gemm:jit reads the thread count at each run: one thread gives one-thread bits. */
    int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    ts_status s = run_post(m, a, b, c, post, scratch);
    omp_set_num_threads(prev);
    return s;
}

static ts_status run_post(ts_mm *m, const void *a, const void *b, void *c, const void *const *post,
                          void *scratch) {
    for (int p = 0; p < m->n_post_src; p++) {
        if (!post || !post[p])
            return ts_fail(TS_ERR_INVALID, "%s: post-op operand %d is NULL", m->what, p);
        if (!m->ks && !m->rows && !m->bare)
            TS_DNNL_RUN(m, dnnl_memory_set_data_handle(m->mem_post[p], (void *)(uintptr_t)post[p]));
    }
    if (!a || !b || !c)
        return ts_fail(TS_ERR_INVALID, "%s: NULL operand (a=%p b=%p c=%p)", m->what, a, b, c);
    if (m->scratch_bytes > 0 && !scratch)
        return ts_fail(TS_ERR_INVALID, "%s: needs %zu bytes of scratch, got NULL", m->what,
                       m->scratch_bytes);
    if (m->ks) return ts_mm_ksplit_run(m->ks, a, b, c, post, scratch);
    if (m->rows) return ts_mm_rows_run(m->rows, a, b, c, post, scratch);
    if (m->bare) {
        ts_status s = ts_mm_run_post(m->bare, a, b, c, post, scratch);
        if (s == TS_OK) ts_mm_head_add_posts(&m->d, c, post);
        return s;
    }
    void *narrow_c = NULL; /* the caller's bf16/f16 C when a widened run computes in f32 */
    if (m->widen) {
        float *wa = align_ptr((char *)scratch + m->dnnl_scratch_bytes);
        float *wb = (float *)((char *)wa + TS_ALIGN_UP((size_t)m->a_elems * 4, TS_ALIGN));
        widen_to_f32(wa, a, m->d.a_dt, m->a_elems);
        widen_to_f32(wb, b, m->d.b_dt, m->b_elems);
        a = wa;
        b = wb;
        if (m->d.c_dt != TS_F32) { /* f32 C, rounded once at the end, as the native kernel does */
            float *wc = (float *)((char *)wb + TS_ALIGN_UP((size_t)m->b_elems * 4, TS_ALIGN));
            if (m->d.accumulate) widen_to_f32(wc, c, m->d.c_dt, m->c_elems);
            narrow_c = c;
            c = wc;
        }
    }
    dnnl_stream_t stream = m->stream ? m->stream : g_stream;
    /* oneDNN only reads A and B; its C API has no const handle setter. */
    if (m->pb.reorder || m->pb.own) {
        char *packed = (char *)align_ptr((char *)scratch + m->dnnl_scratch_bytes);
        TS_DNNL_RUN(m, ts_mm_packed_b_run(&m->pb, m->mem_b, b, packed, stream));
    } else {
        TS_DNNL_RUN(m, dnnl_memory_set_data_handle(m->mem_b, (void *)(uintptr_t)b));
    }
    if (m->mem_s) TS_DNNL_RUN(m, dnnl_memory_set_data_handle(m->mem_s, scratch));
    /* row blocks (not with widen, a transposed A, or post-ops: dnnl_matmul_head.c) */
    const int64_t rows = m->d.M / m->row_blocks;
    const size_t a_step = (size_t)(rows * m->d.K) * ts_dtype_size(m->d.a_dt);
    const size_t c_step = (size_t)(rows * m->d.N) * ts_dtype_size(m->d.c_dt);
    for (int64_t blk = 0; blk < m->row_blocks; blk++) {
        TS_DNNL_RUN(m, dnnl_memory_set_data_handle(m->mem_a, (char *)(uintptr_t)a + blk * a_step));
        TS_DNNL_RUN(m, dnnl_memory_set_data_handle(m->mem_c, (char *)c + blk * c_step));
        TS_DNNL_RUN(m, dnnl_primitive_execute(m->prim, stream, m->nargs, m->args));
    }
    TS_DNNL_RUN(m, dnnl_stream_wait(stream));
    if (narrow_c) narrow_from_f32(narrow_c, c, m->d.c_dt, m->c_elems);
    return TS_OK;
}

void ts_mm_free(ts_mm *m) {
    if (!m) return;
    ts_mm_free(m->bare);
    ts_mm_packed_b_free(&m->pb);
    ts_mm_ksplit_free(m->ks);
    ts_mm_rows_free(m->rows);
    if (m->stream) dnnl_stream_destroy(m->stream);
    if (m->mem_a) dnnl_memory_destroy(m->mem_a);
    if (m->mem_b) dnnl_memory_destroy(m->mem_b);
    if (m->mem_c) dnnl_memory_destroy(m->mem_c);
    if (m->mem_s) dnnl_memory_destroy(m->mem_s);
    for (int p = 0; p < 4; p++)
        if (m->mem_post[p]) dnnl_memory_destroy(m->mem_post[p]);
    if (m->prim) dnnl_primitive_destroy(m->prim);
    free(m);
}

/* ---- reference kernels --------------------------------------------------- */

/* Element offsets of A[b, i, k], B[b, k, j] for the layouts in the header. */
#define REF_IDX_A(d, bi, i, k)                                                                     \
    ((d)->a_broadcast ? 0 : (bi) * (d)->M * (d)->K) +                                              \
        ((d)->trans_a ? (k) * (d)->M + (i) : (i) * (d)->K + (k))
#define REF_IDX_B(d, bi, k, j)                                                                     \
    ((d)->b_broadcast ? 0 : (bi) * (d)->K * (d)->N) +                                              \
        ((d)->trans_b ? (j) * (d)->K + (k) : (k) * (d)->N + (j))

static ts_status ref_check(const ts_mm_desc *d, const void *a, const void *b, const void *c,
                           const char *fn) {
    if (!d) return ts_fail(TS_ERR_INVALID, "%s: descriptor is NULL", fn);
    char what[400];
    describe(what, sizeof what, d);
    ts_status s = check_desc(d, what);
    if (s != TS_OK) return s;
    if (!a || !b || !c) return ts_fail(TS_ERR_INVALID, "%s: %s: NULL operand", fn, what);
    return TS_OK;
}

ts_status ts_mm_ref_f32(const ts_mm_desc *d, const float *a, const float *b, float *c) {
    ts_status s = ref_check(d, a, b, c, "ts_mm_ref_f32");
    if (s != TS_OK) return s;
    const int64_t rows = d->batch * d->M;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t bi = r / d->M, i = r % d->M;
        for (int64_t j = 0; j < d->N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < d->K; k++)
                acc += (double)a[REF_IDX_A(d, bi, i, k)] * (double)b[REF_IDX_B(d, bi, k, j)];
            float *dst = &c[r * d->N + j];
            *dst = d->accumulate ? (float)((double)*dst + acc) : (float)acc;
        }
    }
    return TS_OK;
}

ts_status ts_mm_ref_f64(const ts_mm_desc *d, const double *a, const double *b, double *c) {
    ts_status s = ref_check(d, a, b, c, "ts_mm_ref_f64");
    if (s != TS_OK) return s;
    const int64_t rows = d->batch * d->M;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t bi = r / d->M, i = r % d->M;
        for (int64_t j = 0; j < d->N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < d->K; k++)
                acc += a[REF_IDX_A(d, bi, i, k)] * b[REF_IDX_B(d, bi, k, j)];
            double *dst = &c[r * d->N + j];
            *dst = d->accumulate ? *dst + acc : acc;
        }
    }
    return TS_OK;
}
