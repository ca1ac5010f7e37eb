/* The generated loops of fused elementwise chains (src/codegen/fused.c,
 * `tessel compile --emit-c`) against the library's tile interpreter
 * (src/ops/fused.c): for every fusable op (and every unary_bwd rule), with
 * inputs whole, broadcast as a row, a column and a scalar, and values that
 * include NaN, infinities, signed zeros, subnormals and ties, the loop
 * compiled by cc (the emitted Makefile's flags) writes the same bits as
 * the interpreter (a NaN equals any NaN: which operand's NaN an x86 add
 * returns depends on the order the compiler picks, as between the
 * library's own target_clones). Chains with pow_scalar or gelu, whose chunk functions
 * are not one DEF line, are left to the interpreter (no loop emitted). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "codegen/codegen.h"
#include "ops/fused.h"
#include "ops/op.h"

enum { NE = 6, MAXC = 64 };
/* odd sizes (tiles of 512 end mid-row), above TS_PAR_MIN elements: the loops run in parallel */
static int64_t R = 151, C = 129;

typedef struct fcase {
    char what[64];
    int n;                        /* instructions */
    int64_t rec[4 * TS_FUSE_REC]; /* program */
    int gen;                      /* a loop was emitted */
    size_t out_off;
    int64_t r, c;
} fcase;

static fcase cases[MAXC];
static int n_cases;

static int n_src(int op) {
    if (op == TS_OP_WHERE || op == TS_OP_MAXMIN_BWD) return 3;
    if (op == TS_OP_UNARY_BWD || op <= TS_OP_MINIMUM) return 2;
    return 1;
}

static void add_instr(fcase *c, int op, int s0, int s1, int s2, ts_attrs a) {
    int src[3] = {s0, s1, s2};
    ts_fuse_encode(c->rec + (size_t)c->n * TS_FUSE_REC, op, src, n_src(op), &a);
    c->n++;
}

static fcase *new_case(const char *what) {
    fcase *c = &cases[n_cases++];
    memset(c, 0, sizeof *c);
    snprintf(c->what, sizeof c->what, "%s", what);
    c->r = R, c->c = C;
    return c;
}

/* Inputs: x0 f32 [R,C] signed with specials, x1 f32 [R,C] positive,
 * x2 f32 [C] (ties with x0), x3 f32 [R,1], x4 f32 [1], x5 u8 [R,C]. */
static void fill(unsigned char *A, const size_t *off, int64_t r, int64_t c) {
    float *x0 = (float *)(A + off[0]), *x1 = (float *)(A + off[1]), *x2 = (float *)(A + off[2]);
    float *x3 = (float *)(A + off[3]), *x4 = (float *)(A + off[4]);
    unsigned char *x5 = A + off[5];
    const float specials[] = {NAN,   INFINITY, -INFINITY, -0.0f,  0.0f, 1e-40f, -1e-40f,
                              88.8f, -104.0f,  1e30f,     -1e30f, 1.0f, -1.0f,  0.5f};
    uint64_t s = 12345;
    for (int64_t i = 0; i < r * c; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)((s >> 40) & 0xffffff) / 16777216.0f;
        x0[i] = (u - 0.5f) * 12.0f;
        if (i % 5 == 0) x0[i] = (float)((i % c) % 7) - 3.0f; /* ties with x2 */
        if (i % 97 == 3) x0[i] = specials[(i / 97) % (sizeof specials / sizeof specials[0])];
        x1[i] = 0.01f + u * 9.0f;
        x5[i] = (unsigned char)(s >> 62 & 1);
    }
    for (int64_t j = 0; j < c; j++) x2[j] = (float)(j % 7) - 3.0f;
    for (int64_t j = 0; j < r; j++) x3[j] = 0.25f * (float)(j % 9) - 1.0f;
    x4[0] = 0.7f;
}

static ts_attrs unary(double slope, double scale, double shift, double exponent) {
    ts_attrs a = ts_attrs_zero();
    a.unary.slope = slope, a.unary.scale = scale, a.unary.shift = shift;
    a.unary.exponent = exponent;
    return a;
}

static void make_cases(void) {
    const ts_attrs z = ts_attrs_zero();
    static const int un[] = {TS_OP_NEG,   TS_OP_EXP,        TS_OP_LOG,          TS_OP_SQRT,
                             TS_OP_RSQRT, TS_OP_ABS,        TS_OP_RELU,         TS_OP_SIGMOID,
                             TS_OP_TANH,  TS_OP_LEAKY_RELU, TS_OP_AFFINE_SCALAR};
    for (size_t k = 0; k < sizeof un / sizeof un[0]; k++) {
        fcase *c = new_case(ts_op_get(un[k])->name);
        int pos = un[k] == TS_OP_LOG || un[k] == TS_OP_SQRT || un[k] == TS_OP_RSQRT;
        add_instr(c, un[k], pos ? 1 : 0, -1, -1, unary(0.01, 0.3, -1.7, 0));
        add_instr(c, TS_OP_ADD, NE, 2, -1, z);     /* + row */
        add_instr(c, TS_OP_MUL, NE + 1, 3, -1, z); /* * column */
        add_instr(c, un[k], NE + 2, -1, -1, unary(0.2, -1.1, 0.1, 0));
    }
    static const int bin[] = {TS_OP_ADD, TS_OP_SUB,     TS_OP_MUL,
                              TS_OP_DIV, TS_OP_MAXIMUM, TS_OP_MINIMUM};
    for (size_t k = 0; k < sizeof bin / sizeof bin[0]; k++) {
        fcase *c = new_case(ts_op_get(bin[k])->name);
        add_instr(c, bin[k], 0, 2, -1, z);
        add_instr(c, bin[k], 3, NE, -1, z);
        add_instr(c, bin[k], NE + 1, 4, -1, z);
    }
    fcase *c = new_case("where");
    add_instr(c, TS_OP_WHERE, 5, 0, 2, z);
    add_instr(c, TS_OP_WHERE, 5, 3, NE, z);
    for (int m = 0; m < 2; m++)
        for (int side = 0; side < 2; side++) {
            char w[64];
            snprintf(w, sizeof w, "maxmin_bwd min=%d side=%d", m, side);
            c = new_case(w);
            ts_attrs a = z;
            a.maxmin.min = m, a.maxmin.side = side;
            add_instr(c, TS_OP_MAXMIN_BWD, 1, 0, 2, a);
            add_instr(c, TS_OP_MAXMIN_BWD, NE, 3, 0, a);
        }
    static const struct {
        int op, side, signed_s;
    } bw[] = {{TS_OP_EXP, 0, 1},     {TS_OP_EXP, 1, 0},       {TS_OP_LOG, 0, 0},
              {TS_OP_SQRT, 0, 0},    {TS_OP_SQRT, 1, 0},      {TS_OP_RSQRT, 0, 0},
              {TS_OP_RSQRT, 1, 0},   {TS_OP_ABS, 0, 1},       {TS_OP_RELU, 1, 1},
              {TS_OP_SIGMOID, 0, 1}, {TS_OP_SIGMOID, 1, 0},   {TS_OP_TANH, 0, 1},
              {TS_OP_TANH, 1, 1},    {TS_OP_LEAKY_RELU, 0, 1}};
    for (size_t k = 0; k < sizeof bw / sizeof bw[0]; k++) {
        char w[64];
        snprintf(w, sizeof w, "unary_bwd of %s side %d", ts_op_get(bw[k].op)->name, bw[k].side);
        c = new_case(w);
        ts_attrs a = z;
        a.unary_bwd.fwd_op = bw[k].op, a.unary_bwd.side = bw[k].side;
        a.unary_bwd.fwd = unary(0.03, 0, 0, 0).unary;
        add_instr(c, TS_OP_UNARY_BWD, 3, bw[k].signed_s ? 0 : 1, -1, a); /* dy a column */
        add_instr(c, TS_OP_UNARY_BWD, NE, bw[k].signed_s ? 0 : 1, -1, a);
    }
    /* left to the interpreter */
    c = new_case("pow_scalar (interpreter)");
    add_instr(c, TS_OP_POW_SCALAR, 1, -1, -1, unary(0, 0, 0, 2.5));
    c = new_case("gelu (interpreter)");
    add_instr(c, TS_OP_GELU, 0, -1, -1, z);
}

int main(void) {
    make_cases();
    /* the arena: inputs, then one output per case, then the large cases */
    const int64_t n = R * C;
    size_t off[NE], at = 0;
    const size_t sizes[NE] = {(size_t)n * 4, (size_t)n * 4, (size_t)C * 4, (size_t)R * 4, 4,
                              (size_t)n};
    for (int j = 0; j < NE; j++) off[j] = at, at += (sizes[j] + 63) / 64 * 64;
    for (int k = 0; k < n_cases; k++) cases[k].out_off = at, at += (size_t)n * 4;
    const size_t bytes = at;
    unsigned char *A = calloc(1, bytes), *B = calloc(1, bytes);
    CHECK(A && B, "arena");
    if (!A || !B) return check_summary("unit/emit_c_fused");
    fill(A, off, R, C);
    memcpy(B, A, bytes);

    /* the generated functions into a harness */
    /* a directory of its own: two builds' suites may run this test at the same time */
    char dir[] = "/tmp/tessel-emit_c_fused-XXXXXX";
    char cmd[1024], path[256];
    CHECK(mkdtemp(dir) != NULL, "scratch %s", dir);
    snprintf(path, sizeof path, "%s/harness.c", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "open %s", path);
    if (!f) return check_summary("unit/emit_c_fused");
    fprintf(f, "#include <stdio.h>\n#include <stdlib.h>\n#include \"ops/kern.h\"\n"
               "#include \"ops/vmath.h\"\n\nstatic unsigned char *A;\n\n");
    const ts_operand shapes[NE] = {{TS_F32, 2, {R, C}, off[0]}, {TS_F32, 2, {R, C}, off[1]},
                                   {TS_F32, 1, {C}, off[2]},    {TS_F32, 2, {R, 1}, off[3]},
                                   {TS_F32, 1, {1}, off[4]},    {TS_U8, 2, {R, C}, off[5]}};
    ts_operand ops[NE + 1];
    memcpy(ops, shapes, sizeof shapes);
    ops[NE] = (ts_operand){TS_I64, 1, {1}, 0};
    for (int k = 0; k < n_cases; k++) {
        ts_instr in;
        memset(&in, 0, sizeof in);
        in.op = TS_OP_FUSED_ELTWISE;
        in.a = ts_attrs_zero();
        in.a.fused.n_instr = cases[k].n, in.a.fused.n_ext = NE;
        in.n_in = NE + 1, in.n_out = 1, in.in = ops;
        in.out[0] = (ts_operand){TS_F32, 2, {R, C}, cases[k].out_off};
        char fn[32];
        snprintf(fn, sizeof fn, "f%d", k);
        cases[k].gen = cg_fused_emit(f, &in, cases[k].rec, fn);
        const int want = strstr(cases[k].what, "(interpreter)") == NULL;
        CHECK(cases[k].gen == want, "%s: a loop %s", cases[k].what,
              want ? "is generated" : "is not generated (the interpreter stays)");
    }
    fprintf(f,
            "\nint main(int argc, char **argv) {\n    (void)argc;\n"
            "    A = malloc(%zu);\n    FILE *f = fopen(argv[1], \"rb\");\n"
            "    if (!A || !f || fread(A, 1, %zu, f) != %zu) return 1;\n    fclose(f);\n",
            bytes, bytes, bytes);
    for (int k = 0; k < n_cases; k++)
        if (cases[k].gen) fprintf(f, "    if (f%d() != TS_OK) return 1;\n", k);
    fprintf(
        f,
        "    f = fopen(argv[2], \"wb\");\n    if (!f || fwrite(A, 1, %zu, f) != %zu) return 1;\n"
        "    return fclose(f) != 0;\n}\n",
        bytes, bytes);
    fclose(f);
    snprintf(path, sizeof path, "%s/in.bin", dir);
    f = fopen(path, "wb");
    CHECK(f && fwrite(A, 1, bytes, f) == bytes, "write %s", path);
    if (f) fclose(f);
    snprintf(cmd, sizeof cmd,
             "cc -std=c17 -O3 -Wall -Wextra -Werror -D_GNU_SOURCE -fno-math-errno "
             "-fno-trapping-math -fopenmp -Isrc -Iinclude -o %s/harness %s/harness.c -lm && "
             "%s/harness %s/in.bin %s/out.bin",
             dir, dir, dir, dir, dir);
    int rc = system(cmd);
    CHECK(rc == 0, "the generated loops compile and run: %s", cmd);
    snprintf(path, sizeof path, "%s/out.bin", dir);
    f = fopen(path, "rb");
    CHECK(rc == 0 && f && fread(A, 1, bytes, f) == bytes, "read %s", path);
    if (f) fclose(f);

    /* the interpreter on B, case by case */
    const ts_op_def *d = ts_op_get(TS_OP_FUSED_ELTWISE);
    for (int k = 0; k < n_cases && rc == 0; k++) {
        ts_tensor t[NE + 1], o;
        for (int j = 0; j < NE; j++) {
            t[j] = (ts_tensor){shapes[j].dtype, shapes[j].rank, {0}, B + off[j]};
            memcpy(t[j].dims, shapes[j].dims, sizeof t[j].dims);
        }
        t[NE] = (ts_tensor){TS_I64, 1, {cases[k].n * TS_FUSE_REC}, cases[k].rec};
        o = (ts_tensor){TS_F32, 2, {R, C}, B + cases[k].out_off};
        ts_attrs a = ts_attrs_zero();
        a.fused.n_instr = cases[k].n, a.fused.n_ext = NE;
        ts_step_ctx ctx = {1, 0, 0.0, 1};
        ts_kargs ka = {&a, NE + 1, 1, t, &o, NULL, 0, &ctx, cases[k].what, NULL};
        CHECK_OK(d->kernel(&ka));
        if (!cases[k].gen) continue;
        const uint32_t *x = (const uint32_t *)(A + cases[k].out_off),
                       *y = (const uint32_t *)(B + cases[k].out_off);
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++) {
            float u, v;
            memcpy(&u, &x[i], 4), memcpy(&v, &y[i], 4);
            if (x[i] != y[i] && !(isnan(u) && isnan(v))) bad = i;
        }
        float fx = 0, fy = 0;
        if (bad >= 0) memcpy(&fx, &x[bad], 4), memcpy(&fy, &y[bad], 4);
        CHECK(bad < 0, "%s: element %lld: loop %a, interpreter %a", cases[k].what, (long long)bad,
              (double)fx, (double)fy);
    }
    free(A);
    free(B);
    if (!check_failed) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    return check_summary("unit/emit_c_fused");
}
