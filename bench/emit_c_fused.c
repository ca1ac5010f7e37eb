/* bench/emit_c_fused.c — the measurement behind generated fused loops in
 * `tessel compile --emit-c` (docs/aot.md, docs/design-decisions.md): for
 * typical elementwise groups on W3's MLP activation shape [2048, 2048] f32,
 * time
 *   interpreter  the library's fused_eltwise tile interpreter (what tessel
 *                train runs),
 *   generated    the loop src/codegen/fused.c emits for the same program,
 *                compiled by cc with the emitted Makefile's flags and timed
 *                in its own process,
 * and check that both write the same bits.
 *
 *   build/bench_emit_c_fused [--reps N] [--threads T]   (from the repository root)
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "codegen/codegen.h"
#include "ops/fused.h"
#include "ops/op.h"

enum { ROWS = 2048, COLS = 2048, NE = 4, NG = 3 };
#define N ((int64_t)ROWS * COLS)

typedef struct group {
    const char *what;
    int n;
    int64_t rec[4 * TS_FUSE_REC];
} group;

static void put(group *g, int op, int s0, int s1, ts_attrs a) {
    int src[2] = {s0, s1};
    ts_fuse_encode(g->rec + (size_t)g->n * TS_FUSE_REC, op, src, op <= TS_OP_MINIMUM ? 2 : 1, &a);
    g->n++;
}

int main(int argc, char **argv) {
    int reps = 20, threads = 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[++i]);
    }
    if (reps < 1 || reps > 1000) reps = 20;
    omp_set_num_threads(threads);
    /* inputs x0 [R,C], x1 [C] (a row), x2 [R,C], x3 [R,C]; one output per group */
    const size_t full = (size_t)N * 4, row = COLS * 4;
    const size_t off[NE] = {0, full, full + row, 2 * full + row};
    const size_t out0 = 3 * full + row, bytes = out0 + NG * full;
    unsigned char *A = ts_aligned_alloc(bytes, "bench arena");
    if (!A) return 1;
    for (int64_t i = 0; i < N; i++) {
        float *x0 = (float *)A, *x2 = (float *)(A + off[2]), *x3 = (float *)(A + off[3]);
        x0[i] = (float)((i * 7919) % 2001) / 500.0f - 2.0f;
        x2[i] = (float)((i * 104729) % 1999) / 700.0f - 1.4f;
        x3[i] = (float)((i * 31337) % 997) / 300.0f - 1.6f;
    }
    for (int64_t j = 0; j < COLS; j++) ((float *)(A + off[1]))[j] = (float)(j % 13) / 6.0f - 1.0f;

    const ts_attrs z = ts_attrs_zero();
    group gs[NG];
    memset(gs, 0, sizeof gs);
    gs[0].what = "relu(a * s + b)";
    put(&gs[0], TS_OP_MUL, 0, 1, z), put(&gs[0], TS_OP_ADD, NE, 2, z);
    put(&gs[0], TS_OP_RELU, NE + 1, -1, z);
    gs[1].what = "tanh(a + bias) * sigmoid(b)";
    put(&gs[1], TS_OP_ADD, 0, 1, z), put(&gs[1], TS_OP_TANH, NE, -1, z);
    put(&gs[1], TS_OP_SIGMOID, 2, -1, z), put(&gs[1], TS_OP_MUL, NE + 1, NE + 2, z);
    gs[2].what = "a + b + c (flat)";
    put(&gs[2], TS_OP_ADD, 0, 2, z), put(&gs[2], TS_OP_ADD, NE, 3, z);

    const char *dir = "/tmp/tessel-bench-emit_c_fused";
    char cmd[1024], path[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    if (system(cmd) != 0) return 1;
    snprintf(path, sizeof path, "%s/h.c", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f,
            "#include <omp.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include \"ops/kern.h\"\n"
            "#include \"ops/vmath.h\"\nstatic unsigned char *A;\n");
    const ts_operand ops[NE + 1] = {{TS_F32, 2, {ROWS, COLS}, off[0]},
                                    {TS_F32, 1, {COLS}, off[1]},
                                    {TS_F32, 2, {ROWS, COLS}, off[2]},
                                    {TS_F32, 2, {ROWS, COLS}, off[3]},
                                    {TS_I64, 1, {1}, 0}};
    for (int k = 0; k < NG; k++) {
        ts_instr in;
        memset(&in, 0, sizeof in);
        in.op = TS_OP_FUSED_ELTWISE;
        in.a = ts_attrs_zero();
        in.a.fused.n_instr = gs[k].n, in.a.fused.n_ext = NE;
        in.n_in = NE + 1, in.n_out = 1, in.in = (ts_operand *)ops;
        in.out[0] = (ts_operand){TS_F32, 2, {ROWS, COLS}, out0 + (size_t)k * full};
        char fn[16];
        snprintf(fn, sizeof fn, "g%d", k);
        if (!cg_fused_emit(f, &in, gs[k].rec, fn)) {
            fprintf(stderr, "no loop for group %d\n", k);
            return 1;
        }
    }
    fprintf(f,
            "static int cmp(const void *a, const void *b) {\n"
            "    double x = *(const double *)a, y = *(const double *)b;\n"
            "    return (x > y) - (x < y);\n}\n"
            "int main(int argc, char **argv) {\n    (void)argc;\n    int reps = atoi(argv[3]);\n"
            "    omp_set_num_threads(atoi(argv[4]));\n"
            "    A = aligned_alloc(64, %zu);\n    FILE *f = fopen(argv[1], \"rb\");\n"
            "    if (!A || !f || fread(A, 1, %zu, f) != %zu) return 1;\n    fclose(f);\n"
            "    ts_status (*g[%d])(void) = {",
            bytes, bytes, bytes, NG);
    for (int k = 0; k < NG; k++) fprintf(f, "%sg%d", k ? ", " : "", k);
    fprintf(f,
            "};\n    double t[1000];\n    for (int k = 0; k < %d; k++) {\n"
            "        g[k]();\n        for (int r = 0; r < reps; r++) {\n"
            "            double t0 = omp_get_wtime();\n            g[k]();\n"
            "            t[r] = omp_get_wtime() - t0;\n        }\n"
            "        qsort(t, (size_t)reps, sizeof *t, cmp);\n"
            "        printf(\"%%.3f\\n\", t[reps / 2] * 1e3);\n    }\n"
            "    f = fopen(argv[2], \"wb\");\n"
            "    return !f || fwrite(A, 1, %zu, f) != %zu || fclose(f) != 0;\n}\n",
            NG, bytes, bytes);
    fclose(f);
    snprintf(path, sizeof path, "%s/in.bin", dir);
    f = fopen(path, "wb");
    if (!f || fwrite(A, 1, bytes, f) != bytes || fclose(f) != 0) return 1;
    snprintf(cmd, sizeof cmd,
             "cc -std=c17 -O3 -DNDEBUG -Wall -Wextra -Werror -D_GNU_SOURCE -fno-math-errno "
             "-fno-trapping-math -fopenmp -Isrc -Iinclude -o %s/h %s/h.c -lm && "
             "%s/h %s/in.bin %s/out.bin %d %d > %s/times",
             dir, dir, dir, dir, dir, reps, threads, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "the generated harness failed: %s\n", cmd);
        return 1;
    }
    double gen[NG];
    snprintf(path, sizeof path, "%s/times", dir);
    f = fopen(path, "r");
    for (int k = 0; k < NG; k++)
        if (!f || fscanf(f, "%lf", &gen[k]) != 1) return 1;
    fclose(f);
    unsigned char *G = ts_aligned_alloc(bytes, "bench arena");
    snprintf(path, sizeof path, "%s/out.bin", dir);
    f = fopen(path, "rb");
    if (!G || !f || fread(G, 1, bytes, f) != bytes) return 1;
    fclose(f);

    printf("%d thread(s), [%d, %d] f32, medians of %d runs\n", threads, ROWS, COLS, reps);
    printf("%-30s %14s %14s %12s  %s\n", "group", "interpreter", "generated", "interp/gen",
           "same bits");
    const ts_op_def *d = ts_op_get(TS_OP_FUSED_ELTWISE);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!t) return 1;
    for (int k = 0; k < NG; k++) {
        ts_tensor tin[NE + 1], o;
        for (int j = 0; j < NE; j++) {
            tin[j] = (ts_tensor){ops[j].dtype, ops[j].rank, {0}, A + off[j]};
            memcpy(tin[j].dims, ops[j].dims, sizeof tin[j].dims);
        }
        tin[NE] = (ts_tensor){TS_I64, 1, {gs[k].n * TS_FUSE_REC}, gs[k].rec};
        o = (ts_tensor){TS_F32, 2, {ROWS, COLS}, A + out0 + (size_t)k * full};
        ts_attrs a = ts_attrs_zero();
        a.fused.n_instr = gs[k].n, a.fused.n_ext = NE;
        ts_step_ctx ctx = {1, 0, 0.0, 1};
        ts_kargs ka = {&a, NE + 1, 1, tin, &o, NULL, 0, &ctx, gs[k].what, NULL};
        if (d->kernel(&ka) != TS_OK) return 1;
        for (int r = 0; r < reps; r++) {
            double t0 = omp_get_wtime();
            d->kernel(&ka);
            t[r] = omp_get_wtime() - t0;
        }
        const double interp = ts_median(t, reps) * 1e3;
        const int same = !memcmp(A + out0 + (size_t)k * full, G + out0 + (size_t)k * full, full);
        printf("%-30s %11.3f ms %11.3f ms %11.2fx  %s\n", gs[k].what, interp, gen[k],
               interp / gen[k], same ? "yes" : "NO");
    }
    free(t);
    ts_aligned_free(A);
    ts_aligned_free(G);
    return 0;
}
