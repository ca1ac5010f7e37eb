/* Fused elementwise chains (fused_eltwise) as generated loops: one loop
 * over the output, specialised for its static shape and its inputs'
 * broadcasts, computing the whole chain per element in registers, instead
 * of the library's tile interpreter (src/ops/fused.c).
 *
 * The per-element expression of every op is read, at emit time, from the
 * library's own definitions: the DEF_FWD2 / DEF_BWD2 / DEF_BIN / DEF_ROW3
 * lines of src/ops/unary.c and binary.c (the embedded copy, sources.h),
 * chosen by the same switches (ts_unary_chunk_f32, pick_bwd,
 * ts_binary_row_f32, ts_ternary_row_f32) the interpreter calls. Each op's
 * result is rounded to f32 as the interpreter's tile buffers round it (C17,
 * no contraction), so the loop computes the same bits. A chain with an op
 * whose expression cannot be read this way (pow_scalar, gelu: their chunk
 * functions are not one DEF line) keeps the interpreter. */
#include <stdlib.h>
#include <string.h>
#include "codegen/codegen.h"
#include "codegen/sources.h"
#include "ops/eltwise.h"
#include "ops/fused.h"

static const char *const op_enum[] = {
#define X(NAME, name) [TS_OP_##NAME] = "TS_OP_" #NAME,
#include "ops/ops.def"
#undef X
};

static const char *file_text(const char *path) {
    const ts_embedded_file *f = ts_embedded_find(path);
    return f ? (const char *)f->data : NULL;
}

/* The body (from its '{' to the matching '}') of the function whose
 * definition starts with `head`, as [*b, *e). */
static int body_of(const char *text, const char *head, const char **b, const char **e) {
    const char *p = text ? strstr(text, head) : NULL;
    if (!p || !(p = strchr(p, '{'))) return 0;
    int depth = 0;
    for (const char *q = p; *q; q++) {
        if (*q == '{') depth++;
        if (*q == '}' && --depth == 0) {
            *b = p, *e = q;
            return 1;
        }
    }
    return 0;
}

static const char *find_in(const char *b, const char *e, const char *needle) {
    size_t n = strlen(needle);
    for (const char *p = b; p + n <= e; p++)
        if (!memcmp(p, needle, n)) return p;
    return NULL;
}

static int is_id(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* The identifier at p into out. */
static int ident_at(const char *p, char *out, size_t n) {
    while (*p == ' ' || *p == '\n') p++;
    size_t k = 0;
    while (is_id(p[k]) && k + 1 < n) out[k] = p[k], k++;
    out[k] = 0;
    return k > 0 && !is_id(p[k]);
}

/* In a switch body [b, e): the function name `return NAME;` right after
 * `case OP:` (NULL when that case does something else). */
static int case_return(const char *b, const char *e, int op, char *name, size_t n) {
    char c[96];
    snprintf(c, sizeof c, "case %s:", op_enum[op]);
    const char *p = find_in(b, e, c);
    if (!p) return 0;
    p += strlen(c);
    while (*p == ' ' || *p == '\n') p++;
    if (strncmp(p, "return ", 7)) return 0;
    if (!ident_at(p + 7, name, n)) return 0;
    const char *q = p + 7;
    while (*q == ' ') q++;
    q += strlen(name);
    return *q == ';';
}

/* The arguments of the macro call `MACRO(NAME,` in text, split at top-level
 * commas into args (at most max, each malloc'ed); returns their count. */
static int macro_args(const char *text, const char *macro, const char *name, char **args, int max) {
    char head[128];
    snprintf(head, sizeof head, "\n%s(%s,", macro, name);
    const char *p = text ? strstr(text, head) : NULL;
    if (!p) return 0;
    p += strlen(macro) + 2;
    int n = 0, depth = 0;
    const char *start = p;
    for (; *p && n < max; p++) {
        if (*p == '(') depth++;
        if ((*p == ',' && depth == 0) || (*p == ')' && depth == 0)) {
            const char *a = start, *z = p;
            while (a < z && (*a == ' ' || *a == '\n')) a++;
            while (z > a && (z[-1] == ' ' || z[-1] == '\n')) z--;
            if (!(args[n] = malloc((size_t)(z - a) + 1))) break;
            memcpy(args[n], a, (size_t)(z - a));
            args[n][z - a] = 0;
            n++;
            start = p + 1;
            if (*p == ')') break;
        }
        if (*p == ')') depth--;
    }
    return n;
}

static void free_args(char **args, int n) {
    for (int i = 0; i < n; i++) free(args[i]);
}

/* One op of a chain as an expression over named operands. */
typedef struct cg_eop {
    char *expr;      /* the f32 expression (owned) */
    char vars[3][2]; /* its operand names in source order: "x", "d", ... */
    int n_vars;
    const char *cond_type; /* ROW3: the type of z */
} cg_eop;

/* 1 if every function the expression calls is libm's or one of vmath.h's
 * (which the generated file includes); the others are file-local helpers
 * of src/ops the generated file cannot see. */
static int calls_ok(const char *expr) {
    static const char *const libm[] = {"sqrtf", "fabsf", "expf", "logf", "tanhf", "erfcf"};
    const char *vm = file_text("src/ops/vmath.h");
    for (const char *p = expr; *p; p++) {
        if (!is_id(*p) || (p > expr && is_id(p[-1]))) continue;
        char id[64];
        ident_at(p, id, sizeof id);
        const char *q = p + strlen(id);
        while (*q == ' ') q++;
        if (*q != '(') continue;
        int ok = 0;
        for (size_t i = 0; i < sizeof libm / sizeof libm[0]; i++) ok |= !strcmp(id, libm[i]);
        char def[96];
        snprintf(def, sizeof def, "float %s(", id);
        if (!ok && (!vm || !strstr(vm, def))) return 0;
    }
    return 1;
}

/* The expression of fused instruction record `rec`, or 0 (keep the
 * interpreter). */
static int op_expr(const int64_t *rec, cg_eop *out) {
    memset(out, 0, sizeof *out);
    const int op = (int)rec[0];
    const char *un = file_text("src/ops/unary.c"), *bin = file_text("src/ops/binary.c");
    ts_attrs a = ts_attrs_zero();
    memcpy(&a, &rec[4], TS_FUSE_ATTR_WORDS * sizeof(int64_t));
    const char *b, *e, *macro = NULL, *vars = NULL;
    char name[64] = "", *args[4] = {0};
    int want = 0, ei = 1;
    if (op == TS_OP_UNARY_BWD) {
        if (!body_of(un, "static int pick_bwd(", &b, &e)) return 0;
        char c[96];
        snprintf(c, sizeof c, "case %s:", op_enum[a.unary_bwd.fwd_op]);
        const char *p = find_in(b, e, c), *end;
        if (!p) return 0;
        p += strlen(c);
        end = find_in(p, e, "case ");
        if (!end) end = e;
        const char *pk1 = find_in(p, end, "PICK("),
                   *pk2 = pk1 ? find_in(pk1 + 5, end, "PICK(") : NULL;
        if (!pk1 || find_in(p, end, "approx")) return 0;
        const char *pick = pk1;
        if (pk2) { /* if (side) PICK(y); else PICK(x); */
            if (!find_in(p, pk1, "if (side)")) return 0;
            pick = a.unary_bwd.side ? pk1 : pk2;
        }
        if (!ident_at(pick + 5, name, sizeof name)) return 0;
        macro = "DEF_BWD2", vars = "ds", want = 3;
    } else if (op == TS_OP_WHERE || op == TS_OP_MAXMIN_BWD) {
        if (!body_of(bin, "ts_ternary_row_fn ts_ternary_row_f32(", &b, &e)) return 0;
        if (op == TS_OP_WHERE) {
            const char *p = find_in(b, e, "op == TS_OP_WHERE) return ");
            if (!p || !ident_at(p + 26, name, sizeof name)) return 0;
        } else { /* mm[2][2] = {{max_a, max_b}, {min_a, min_b}}, by [min][side] */
            const char *p = find_in(b, e, "mm[2][2] = {{");
            if (!p) return 0;
            p += 13;
            int want_k = (a.maxmin.min != 0) * 2 + (a.maxmin.side != 0);
            for (int k = 0; k <= want_k; k++) {
                while (*p == ' ' || *p == ',' || *p == '{' || *p == '}') p++;
                if (!ident_at(p, name, sizeof name)) return 0;
                p += strlen(name);
            }
        }
        macro = "DEF_ROW3", vars = "zxy", want = 4, ei = 3;
    } else if (ts_binary_row_f32(op)) {
        if (!body_of(bin, "ts_binary_row_fn ts_binary_row_f32(", &b, &e) ||
            !case_return(b, e, op, name, sizeof name))
            return 0;
        macro = "DEF_BIN", vars = "xy", want = 2;
    } else {
        if (!body_of(un, "ts_unary_chunk_fn ts_unary_chunk_f32(", &b, &e) ||
            !case_return(b, e, op, name, sizeof name))
            return 0;
        macro = "DEF_FWD2", vars = "x", want = 3;
    }
    /* NAME_f32 -> the DEF line of NAME (PICK and DEF_ROW3 name it without/with the suffix) */
    size_t nl = strlen(name);
    if (!strcmp(macro, "DEF_FWD2") || !strcmp(macro, "DEF_BIN")) {
        if (nl < 5 || strcmp(name + nl - 4, "_f32")) return 0;
        name[nl - 4] = 0;
    }
    int n = macro_args(!strcmp(macro, "DEF_BWD2") || !strcmp(macro, "DEF_FWD2") ? un : bin, macro,
                       name, args, 4);
    int ok = n == want && calls_ok(args[ei]);
    if (ok && !strcmp(macro, "DEF_ROW3")) {
        out->cond_type = !strcmp(args[2], "unsigned char") ? "unsigned char" : "float";
        ok = !strcmp(args[1], "float") &&
             (!strcmp(args[2], "unsigned char") || !strcmp(args[2], "float"));
    }
    if (ok) {
        out->expr = args[ei];
        args[ei] = NULL;
        out->n_vars = (int)strlen(vars);
        for (int j = 0; j < out->n_vars; j++) out->vars[j][0] = vars[j];
    }
    free_args(args, n);
    return ok;
}

/* Word `w` occurs in expr (not inside a longer identifier). */
static int uses(const char *expr, const char *w) {
    size_t n = strlen(w);
    for (const char *p = expr; (p = strstr(p, w)); p += n)
        if ((p == expr || !is_id(p[-1])) && !is_id(p[n])) return 1;
    return 0;
}

int cg_fused_loop(FILE *f, const cg_ctx *g, int i, const char *fname) {
    const ts_instr *in = &g->prog->ins[i];
    const int n_ext = (int)in->a.fused.n_ext;
    if (n_ext < 1 || n_ext > TS_FUSE_MAX_EXT || in->n_in != n_ext + 1) return 0;
    return cg_fused_emit(f, in, (const int64_t *)ts_plan_at(g->plan, in->in[n_ext].off), fname);
}

int cg_fused_emit(FILE *f, const ts_instr *in, const int64_t *prog, const char *fname) {
    const int n_instr = (int)in->a.fused.n_instr, n_ext = (int)in->a.fused.n_ext;
    if (n_instr < 1 || n_instr > TS_FUSE_MAX_INSTR || n_ext < 1 || n_ext > TS_FUSE_MAX_EXT ||
        in->n_in != n_ext + 1 || in->out[0].dtype != TS_F32)
        return 0;
    cg_eop ops[TS_FUSE_MAX_INSTR];
    int n_ok = 0;
    for (; n_ok < n_instr; n_ok++)
        if (!op_expr(prog + (size_t)n_ok * TS_FUSE_REC, &ops[n_ok])) break;
    if (n_ok < n_instr) {
        for (int t = 0; t < n_ok; t++) free(ops[t].expr);
        return 0;
    }
    const ts_operand *o = &in->out[0];
    const int rank = o->rank;
    int64_t cols = rank ? o->dims[rank - 1] : 1, n = 1;
    for (int d = 0; d < rank; d++) n *= o->dims[d];
    /* every input whole or one element: one flat loop, split among threads */
    int flat = 1;
    for (int j = 0; j < n_ext; j++) {
        int64_t xn = 1;
        for (int d = 0; d < in->in[j].rank; d++) xn *= in->in[j].dims[d];
        flat &= xn == n || xn == 1;
    }
    if (flat) cols = n;
    const int64_t rows = flat ? 1 : cols ? n / cols : 0;
    /* compiled like the library's chunk functions: for AVX-512, AVX2 and
     * generic x86-64, picked at load time (kern.h), and vectorised (omp simd;
     * elementwise, so no result changes) */
    fprintf(f, "TS_CLONES static ts_status %s(void) {\n", fname);
    fprintf(f, "    float *o = (float *)(A + %zu);\n", o->off);
    int64_t colstr[TS_FUSE_MAX_EXT];
    for (int j = 0; j < n_ext; j++) {
        const ts_operand *x = &in->in[j];
        const char *ty = x->dtype == TS_U8 ? "unsigned char" : "float";
        fprintf(f, "    const %s *x%d = (const %s *)(A + %zu);\n", ty, j, ty, x->off);
    }
    if (!flat)
        fprintf(f, "#pragma omp parallel for schedule(static) if (%lld >= TS_PAR_MIN)\n",
                (long long)n);
    fprintf(f, "    for (int64_t r = 0; r < %lld; r++) {\n", (long long)rows);
    for (int j = 0; j < n_ext; j++) {
        /* x_j broadcast to the output: its element stride per output axis */
        const ts_operand *x = &in->in[j];
        int64_t str[TS_MAX_RANK] = {0}, s = 1;
        const int lead = rank - x->rank;
        for (int d = rank - 1; d >= 0; d--) {
            int xd = d - lead;
            str[d] = xd < 0 || x->dims[xd] == 1 ? 0 : s;
            if (xd >= 0) s *= x->dims[xd];
        }
        colstr[j] = rank ? str[rank - 1] : 0;
        if (flat) {
            int64_t xn = 1;
            for (int d = 0; d < x->rank; d++) xn *= x->dims[d];
            colstr[j] = xn == n && n > 1;
            for (int d = 0; d < rank; d++) str[d] = 0;
        }
        const char *ty = x->dtype == TS_U8 ? "unsigned char" : "float";
        fprintf(f, "        const %s *p%d = x%d", ty, j, j);
        /* row r's offset: sum over the leading axes of (index along it) * stride */
        int64_t inner = 1;
        for (int d = rank - 2; d >= 0; d--) {
            if (str[d]) {
                if (inner == 1)
                    fprintf(f, " + (r %% %lld) * %lld", (long long)o->dims[d], (long long)str[d]);
                else
                    fprintf(f, " + (r / %lld %% %lld) * %lld", (long long)inner,
                            (long long)o->dims[d], (long long)str[d]);
            }
            inner *= o->dims[d];
        }
        fprintf(f, ";\n        (void)p%d;\n", j);
    }
    fprintf(f, "        float *po = o + r * %lld;\n", (long long)cols);
    if (flat)
        fprintf(f, "#pragma omp parallel for simd schedule(static) if (%lld >= TS_PAR_MIN)\n",
                (long long)n);
    else
        fprintf(f, "#pragma omp simd\n");
    fprintf(f, "        for (int64_t c = 0; c < %lld; c++) {\n", (long long)cols);
    for (int t = 0; t < n_instr; t++) {
        const int64_t *rec = prog + (size_t)t * TS_FUSE_REC;
        const cg_eop *e = &ops[t];
        ts_attrs a = ts_attrs_zero(), fa;
        memcpy(&a, &rec[4], TS_FUSE_ATTR_WORDS * sizeof(int64_t));
        const ts_unary_attrs *ua = &a.unary;
        if ((int)rec[0] == TS_OP_UNARY_BWD) {
            ts_unary_bwd_chunk_f32(&a, &fa); /* the attributes the chunk function sees */
            ua = &fa.unary;
        }
        fprintf(f, "            float v%d;\n            { /* %s */\n", n_ext + t,
                op_enum[rec[0]] + 6);
        for (int q = 0; q < e->n_vars; q++) {
            if (!uses(e->expr, e->vars[q])) continue;
            int src = (int)rec[1 + q];
            const char *ty = q == 0 && e->cond_type ? e->cond_type : "float";
            if (src < n_ext)
                fprintf(f, "                const %s %s = p%d[%s];\n", ty, e->vars[q], src,
                        colstr[src] ? "c" : "0");
            else
                fprintf(f, "                const %s %s = v%d;\n", ty, e->vars[q], src);
        }
        static const char *const pn[] = {"slope", "scale", "shift"};
        const double pv[] = {ua->slope, ua->scale, ua->shift};
        for (int q = 0; q < 3; q++)
            if (uses(e->expr, pn[q]) && strcmp(e->vars[0], "z"))
                fprintf(f, "                const float %s = (float)%a;\n", pn[q], pv[q]);
        fprintf(f, "                v%d = (%s);\n            }\n", n_ext + t, e->expr);
    }
    fprintf(f, "            po[c] = v%d;\n        }\n    }\n    return TS_OK;\n}\n",
            n_ext + n_instr - 1);
    for (int t = 0; t < n_instr; t++) free(ops[t].expr);
    return 1;
}
