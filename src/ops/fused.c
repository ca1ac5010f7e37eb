/* Fused ops made by the fusion pass (src/passes/fuse.c); never built by
 * models, never differentiated (they appear after autodiff).
 *
 * fused_eltwise: a tree of f32 elementwise ops run as one kernel, a small
 * program interpreted over tiles of TS_FUSE_TILE output elements. Each
 * instruction is one call of the original op's chunk function (eltwise.h)
 * over the tile, with operands held in per-thread buffers that stay in L1;
 * only the external inputs are read from memory and only the result is
 * written. Because every instruction runs the unfused kernel's own code on
 * the same element values, the result is bit-identical to the unfused ops.
 *
 * matmul_epi: a GEMM followed by post-ops on its output (add a bias row,
 * add a tensor of the output's shape) in one instruction; the CPU
 * backend maps it onto oneDNN post-ops (src/backends/cpu/prepare.c). */
#include "fused.h"

#include <string.h>
#include "core/half.h"
#include "eltwise.h"
#include "kern.h"

/* ---- program --------------------------------------------------------------- */

int ts_fuse_op_ok(int op) {
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
    case TS_OP_UNARY_BWD: return 1;
    default: return 0;
    }
}

void ts_fuse_encode(int64_t *rec, int op, const int *src, int n_src, const ts_attrs *a) {
    memset(rec, 0, sizeof(int64_t) * TS_FUSE_REC);
    rec[0] = op;
    for (int j = 0; j < 3; j++) rec[1 + j] = j < n_src ? src[j] : -1;
    memcpy(&rec[4], a, TS_FUSE_ATTR_WORDS * sizeof(int64_t));
}

static void decode_attrs(const int64_t *rec, ts_attrs *a) {
    *a = ts_attrs_zero();
    memcpy(a, &rec[4], TS_FUSE_ATTR_WORDS * sizeof(int64_t));
}

static int n_srcs(int op) {
    if (op == TS_OP_WHERE || op == TS_OP_MAXMIN_BWD) return 3;
    if (op == TS_OP_UNARY_BWD || ts_binary_row_f32(op)) return 2;
    return 1;
}

/* One decoded instruction. */
typedef struct finstr {
    int kind; /* 1 unary, 2 unary_bwd, 3 binary, 4 ternary */
    int src[3];
    void (*fn)(void);
    ts_attrs a;
} finstr;

/* Decode and check a program; n_ext registers precede the instructions. */
static ts_status decode(const int64_t *prog, int n_instr, int n_ext, finstr *out) {
    for (int t = 0; t < n_instr; t++) {
        const int64_t *r = prog + (size_t)t * TS_FUSE_REC;
        finstr *f = &out[t];
        int op = (int)r[0];
        if (!ts_fuse_op_ok(op))
            return ts_fail(TS_ERR_INVALID, "instruction %d: op %d is not fusable", t, op);
        int ns = n_srcs(op);
        for (int j = 0; j < 3; j++) {
            f->src[j] = (int)r[1 + j];
            if (j < ns && (r[1 + j] < 0 || r[1 + j] >= n_ext + t))
                return ts_fail(TS_ERR_INVALID, "instruction %d: operand %d reads register %lld", t,
                               j, (long long)r[1 + j]);
        }
        ts_attrs a;
        decode_attrs(r, &a);
        f->a = a;
        if (op == TS_OP_UNARY_BWD) {
            f->kind = 2;
            f->fn = (void (*)(void))ts_unary_bwd_chunk_f32(&a, &f->a);
        } else if (ns == 3) {
            f->kind = 4;
            f->fn = (void (*)(void))ts_ternary_row_f32(op, &a);
        } else if (ns == 2) {
            f->kind = 3;
            f->fn = (void (*)(void))ts_binary_row_f32(op);
        } else {
            f->kind = 1;
            f->fn = (void (*)(void))ts_unary_chunk_f32(op, &a);
        }
        if (!f->fn)
            return ts_fail(TS_ERR_INVALID, "instruction %d: op %d has no f32 kernel", t, op);
        /* a where's condition (u8) must come from an external input */
        if (op == TS_OP_WHERE && f->src[0] >= n_ext)
            return ts_fail(TS_ERR_INVALID, "instruction %d: where's condition is computed", t);
    }
    return TS_OK;
}

/* ---- fused_eltwise ------------------------------------------------------- */

static ts_status infer_fused(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    int n_instr = (int)n->a.fused.n_instr, n_ext = (int)n->a.fused.n_ext;
    if (n_instr < 1 || n_instr > TS_FUSE_MAX_INSTR || n_ext < 1 || n_ext > TS_FUSE_MAX_EXT ||
        n->n_in != n_ext + 1)
        return ts_fail(TS_ERR_INVALID, "bad program size (%d instructions, %d inputs)", n_instr,
                       n_ext);
    const ts_value *pv = &g->values[n->in[n_ext]];
    if (pv->kind != TS_VK_CONST || pv->t.dtype != TS_I64 ||
        ts_type_numel(&pv->t) != (int64_t)n_instr * TS_FUSE_REC)
        return ts_fail(TS_ERR_INVALID, "the last input must be the program constant");
    finstr fi[TS_FUSE_MAX_INSTR];
    ts_status s = decode(pv->data, n_instr, n_ext, fi);
    if (s != TS_OK) return s;
    ts_type t = *ts_in_type(g, n, 0);
    for (int j = 0; j < n_ext; j++) {
        const ts_type *x = ts_in_type(g, n, j);
        if (x->dtype != TS_F32 && x->dtype != TS_U8)
            return ts_fail(TS_ERR_SHAPE, "input %d: dtype %s (want f32 or u8)", j,
                           ts_dtype_name(x->dtype));
        ts_type prev = t; /* ts_broadcast_shapes must not write over an operand */
        if (j && (s = ts_broadcast_shapes(&prev, x, &t)) != TS_OK) return s;
    }
    t.dtype = TS_F32;
    *out = t;
    *n_out = 1;
    return TS_OK;
}

/* Copy elements [s, s + len) of x broadcast to o's shape into dst. */
static void gather(char *dst, const ts_tensor *x, const ts_tensor *o, const int64_t *str, int64_t s,
                   int64_t len) {
    size_t es = ts_dtype_size(x->dtype);
    int64_t inner = ts_inner(o), last = o->rank ? str[o->rank - 1] : 0;
    const char *px = x->data;
    for (int64_t i = s, e = s + len; i < e;) {
        int64_t row = i / inner, col = i % inner;
        int64_t seg = inner - col < e - i ? inner - col : e - i;
        int64_t base = ts_row_offset(row, o->rank, o->dims, str) + col * last;
        char *d = dst + (i - s) * (int64_t)es;
        if (last) {
            memcpy(d, px + base * (int64_t)es, (size_t)seg * es);
        } else if (es == 1) {
            memset(d, px[base], (size_t)seg);
        } else {
            float v;
            memcpy(&v, px + base * 4, 4);
            for (int64_t q = 0; q < seg; q++) ((float *)d)[q] = v;
        }
        i += seg;
    }
}

static ts_status k_fused(const ts_kargs *k) {
    int n_instr = (int)k->a->fused.n_instr, n_ext = (int)k->a->fused.n_ext;
    if (k->n_in != n_ext + 1 || n_instr < 1 || n_instr > TS_FUSE_MAX_INSTR || n_ext < 1 ||
        n_ext > TS_FUSE_MAX_EXT)
        return ts_fail(TS_ERR_INVALID, "fused_eltwise '%s': bad program size", k->label);
    const ts_tensor *o = &k->out[0];
    if (o->dtype != TS_F32) return ts_kernel_bad_dtype(k, "fused_eltwise", o->dtype);
    finstr fi[TS_FUSE_MAX_INSTR];
    ts_status st = decode(k->in[n_ext].data, n_instr, n_ext, fi);
    if (st != TS_OK) {
        ts_error_prefix("fused_eltwise '%s'", k->label);
        return st;
    }
    int64_t n = ts_tensor_numel(o), ntile = (n + TS_FUSE_TILE - 1) / TS_FUSE_TILE;
    int64_t str[TS_FUSE_MAX_EXT][TS_MAX_RANK];
    int full[TS_FUSE_MAX_EXT];
    for (int j = 0; j < n_ext; j++) {
        full[j] = ts_tensor_numel(&k->in[j]) == n;
        ts_bcast_strides(&k->in[j], o, str[j]);
    }
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t tile = 0; tile < ntile; tile++) {
        _Alignas(64) float buf[(TS_FUSE_MAX_INSTR + TS_FUSE_MAX_EXT) * TS_FUSE_TILE];
        const void *reg[TS_FUSE_MAX_INSTR + TS_FUSE_MAX_EXT];
        int64_t s = tile * TS_FUSE_TILE, len = n - s < TS_FUSE_TILE ? n - s : TS_FUSE_TILE;
        for (int j = 0; j < n_ext; j++) {
            const ts_tensor *x = &k->in[j];
            if (full[j]) {
                reg[j] = (const char *)x->data + s * (int64_t)ts_dtype_size(x->dtype);
            } else {
                char *d = (char *)(buf + (size_t)(TS_FUSE_MAX_INSTR + j) * TS_FUSE_TILE);
                gather(d, x, o, str[j], s, len);
                reg[j] = d;
            }
        }
        for (int t = 0; t < n_instr; t++) {
            const finstr *f = &fi[t];
            void *dst = t == n_instr - 1 ? (float *)o->data + s : buf + (size_t)t * TS_FUSE_TILE;
            const void *a = reg[f->src[0]];
            switch (f->kind) {
            case 1: ((ts_unary_chunk_fn)f->fn)(dst, a, len, &f->a); break;
            case 2: ((ts_unary_bwd_chunk_fn)f->fn)(dst, a, reg[f->src[1]], len, &f->a); break;
            case 3: ((ts_binary_row_fn)f->fn)(dst, a, reg[f->src[1]], len, 1, 1); break;
            default:
                ((ts_ternary_row_fn)f->fn)(dst, a, reg[f->src[1]], reg[f->src[2]], len, 1, 1, 1);
            }
            reg[n_ext + t] = dst;
        }
    }
    return TS_OK;
}

static double cost_fused(const ts_graph *g, const ts_node *n) {
    return (double)ts_type_numel(&g->values[n->out[0]].t) * (double)n->a.fused.n_instr;
}

/* Input 0 is the first external operand, so memplan may write the result
 * over it when it dies here: each tile of it is read before the last
 * instruction writes that tile. */
const ts_op_def ts_def_fused_eltwise = {.name = "fused_eltwise",
                                        .min_in = 2,
                                        .max_in = TS_FUSE_MAX_EXT + 1,
                                        .flags = TS_OPF_ELEMENTWISE | TS_OPF_INPLACE,
                                        .infer = infer_fused,
                                        .kernel = k_fused,
                                        .cost = cost_fused};

/* ---- matmul_epi ------------------------------------------------------------ */

/* Post-op operand j of node n is a bias row ([N], or [1,..,1,N]) when it
 * is not the output's full shape. */
static int is_bias_shape(const ts_type *x, const ts_type *o) {
    if (x->rank < 1 || x->rank > o->rank || x->dims[x->rank - 1] != o->dims[o->rank - 1]) return 0;
    for (int i = 0; i + 1 < x->rank; i++)
        if (x->dims[i] != 1) return 0;
    return 1;
}

int ts_mm_epi_operand_ok(const ts_type *x, const ts_type *out) {
    return x->dtype == TS_F32 && (ts_type_equal(x, out) || is_bias_shape(x, out));
}

/* The attributes of the matmul a matmul_epi starts with. */
static ts_attrs plain_matmul_attrs(const ts_attrs *epi) {
    ts_attrs a = ts_attrs_zero();
    a.matmul.trans_a = epi->matmul_epi.trans_a;
    a.matmul.trans_b = epi->matmul_epi.trans_b;
    a.matmul.low = epi->matmul_epi.low;
    return a;
}

/* The GEMM of a matmul_epi as the matmul node it was: its two operands
 * and the matmul's attributes. */
static ts_node plain_matmul(const ts_node *n) {
    ts_node mm = *n;
    mm.n_in = 2;
    mm.a = plain_matmul_attrs(&n->a);
    return mm;
}

static ts_status infer_mm_epi(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    int n_post = (int)n->a.matmul_epi.n_post, n_add = 0;
    if (n_post < 1 || n_post > TS_EPI_MAX) return ts_fail(TS_ERR_INVALID, "bad post-op count");
    for (int p = 0; p < n_post; p++) {
        int64_t kind = n->a.matmul_epi.post[p];
        if (kind != TS_EPI_ADD)
            return ts_fail(TS_ERR_INVALID, "post-op %d: unknown kind %lld", p, (long long)kind);
        n_add++;
    }
    if (n->n_in != 2 + n_add)
        return ts_fail(TS_ERR_INVALID, "%d inputs for %d add post-ops", n->n_in, n_add);
    ts_node mm = plain_matmul(n);
    ts_status s = ts_op_get(TS_OP_MATMUL)->infer(g, &mm, out, n_out);
    if (s != TS_OK) return s;
    if (out->dtype != TS_F32) return ts_fail(TS_ERR_SHAPE, "matmul_epi is f32 only");
    for (int j = 2; j < n->n_in; j++)
        if (!ts_mm_epi_operand_ok(ts_in_type(g, n, j), out))
            return ts_fail(TS_ERR_SHAPE,
                           "post-op operand %d is neither the output's shape nor a bias row",
                           j - 2);
    if (n->a.matmul_epi.out_low != 0 && n->a.matmul_epi.out_low != 1)
        return ts_fail(TS_ERR_INVALID, "out_low must be 0 or 1, got %lld",
                       (long long)n->a.matmul_epi.out_low);
    if (n->a.matmul_epi.out_low) { /* the reference kernel's row pieces need these */
        if (ts_in_type(g, n, 0)->dtype != TS_BF16 || n->a.matmul_epi.trans_a ||
            ts_in_type(g, n, 1)->rank != 2)
            return ts_fail(TS_ERR_SHAPE, "out_low (a bf16 output) needs low, bf16 operands, A "
                                         "not transposed and B one matrix");
        out->dtype = TS_BF16;
    }
    return TS_OK;
}

ts_status ts_mm_epi_apply(const ts_kargs *k) {
    const ts_tensor *o = &k->out[0];
    int64_t inner = ts_inner(o), rows = ts_rows(o), n = ts_tensor_numel(o);
    ts_binary_row_fn add = ts_binary_row_f32(TS_OP_ADD);
    float *po = o->data;
    int next = 2;
    for (int p = 0; p < (int)k->a->matmul_epi.n_post; p++) {
        const ts_tensor *x = &k->in[next++];
        const float *px = x->data;
        int full = ts_tensor_numel(x) == n;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
        for (int64_t r = 0; r < rows; r++)
            add(po + r * inner, po + r * inner, full ? px + r * inner : px, inner, 1, 1);
    }
    return TS_OK;
}

/* out_low: EPI_ROWS rows of the f32 result at a time in scratch (before the matmul kernel's
 * own), rounded into the bf16 output (ts_f32_to_bf16, the cast op's rounding). A row of C
 * depends only on its row of A (A not transposed, B one matrix: infer_mm_epi), so each row
 * has the bits of the whole product. */
#define EPI_ROWS 64
static size_t rows_bytes(int64_t N) {
    return ((size_t)(EPI_ROWS * N) * sizeof(float) + 63) / 64 * 64;
}

static ts_status k_mm_epi_out_low(const ts_kargs *k, const ts_attrs *mm) {
    const ts_tensor *A = &k->in[0], *C = &k->out[0];
    const int64_t K = A->dims[A->rank - 1], N = C->dims[C->rank - 1];
    const int64_t rows = ts_tensor_numel(C) / N;
    const size_t fb = rows_bytes(N);
    if (k->n_in > 2 + TS_EPI_MAX || k->scratch_bytes < fb)
        return ts_fail(TS_ERR_INTERNAL, "matmul_epi '%s': scratch too small", k->label);
    ts_tensor in[2 + TS_EPI_MAX], out = *C;
    float *f = k->scratch;
    for (int64_t r0 = 0; r0 < rows; r0 += EPI_ROWS) {
        const int64_t nr = rows - r0 < EPI_ROWS ? rows - r0 : EPI_ROWS;
        for (int j = 0; j < k->n_in; j++) in[j] = k->in[j];
        in[0].rank = 2, in[0].dims[0] = nr, in[0].dims[1] = K;
        in[0].data = (char *)A->data + (size_t)(r0 * K) * ts_dtype_size(A->dtype);
        for (int j = 2; j < k->n_in; j++) /* a full-shape operand: its rows; a bias row stays */
            if (ts_tensor_numel(&k->in[j]) == rows * N) {
                in[j].rank = 2, in[j].dims[0] = nr, in[j].dims[1] = N;
                in[j].data = (float *)k->in[j].data + r0 * N;
            }
        out.dtype = TS_F32, out.rank = 2, out.dims[0] = nr, out.dims[1] = N, out.data = f;
        ts_kargs ck = *k;
        ck.in = in, ck.out = &out, ck.a = mm, ck.n_in = 2;
        ck.scratch = (char *)k->scratch + fb, ck.scratch_bytes = k->scratch_bytes - fb;
        ts_status s = ts_op_get(TS_OP_MATMUL)->kernel(&ck);
        ck.a = k->a, ck.n_in = k->n_in;
        if (s == TS_OK) s = ts_mm_epi_apply(&ck);
        if (s != TS_OK) return s;
        ts_f32_to_bf16_n((uint16_t *)C->data + r0 * N, f, nr * N);
    }
    return TS_OK;
}

static ts_status k_mm_epi(const ts_kargs *k) {
    ts_kargs mk = *k;
    ts_attrs a = plain_matmul_attrs(k->a);
    if (k->a->matmul_epi.out_low) return k_mm_epi_out_low(k, &a);
    mk.a = &a;
    mk.n_in = 2;
    ts_status s = ts_op_get(TS_OP_MATMUL)->kernel(&mk);
    return s != TS_OK ? s : ts_mm_epi_apply(k);
}

/* A low matmul_epi's reference kernel widens A and B into scratch, as matmul's; with out_low
 * the f32 rows go before that. */
static size_t scratch_mm_epi(const ts_graph *g, const ts_node *n) {
    ts_node mm = plain_matmul(n);
    const ts_type *o = &g->values[n->out[0]].t;
    return ts_op_get(TS_OP_MATMUL)->scratch(g, &mm) +
           (n->a.matmul_epi.out_low ? rows_bytes(o->dims[o->rank - 1]) : 0);
}

static double cost_mm_epi(const ts_graph *g, const ts_node *n) {
    ts_node mm = plain_matmul(n);
    return ts_op_get(TS_OP_MATMUL)->cost(g, &mm) +
           (double)ts_type_numel(&g->values[n->out[0]].t) * (double)n->a.matmul_epi.n_post;
}

const ts_op_def ts_def_matmul_epi = {.name = "matmul_epi",
                                     .min_in = 2,
                                     .max_in = 2 + TS_EPI_MAX,
                                     .infer = infer_mm_epi,
                                     .kernel = k_mm_epi,
                                     .scratch = scratch_mm_epi,
                                     .cost = cost_mm_epi};
