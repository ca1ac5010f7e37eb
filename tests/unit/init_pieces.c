/* Parameter initialisation drawn in pieces on every thread (src/plan/arena.c)
 * gives the bits of drawing each value whole on one thread, as tessel did
 * before: ts_rand_*_f64_at pieces equal the whole stream, and a plan's
 * parameters of every init kind, compiled with 1 and with 2 threads, equal
 * a reference computed here the old way (the whole stream in doubles, then
 * cast). Also ts_process_age, which summary.json's start_to_first_step_ms
 * is measured with. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/core.h"
#include "tessel/tessel.h"

enum { ROWS = 300, COLS = 70, N = ROWS * COLS }; /* 21000: several pieces of 1024 */

static void test_stream_pieces(void) {
    static double whole[N], piece[N];
    for (int normal = 0; normal < 2; normal++) {
        const uint64_t key = 0x1234567u + (uint64_t)normal;
        if (normal)
            ts_rand_normal_f64(whole, N, key, 0.5, 2.0);
        else
            ts_rand_uniform_f64(whole, N, key, -1.0, 3.0);
        /* pieces starting at multiples of 4, of lengths 1 to 4 * 97: a piece
         * whose length is not a multiple of 4 is cut short, and the next
         * starts at the next multiple of 4, re-drawing what it left out */
        for (int64_t first = 0; first < N;) {
            int64_t m = first % 5 ? 4 * (first % 97) + first % 4 + 1 : 4 * (1 + first % 97);
            if (first + m > N) m = N - first;
            if (normal)
                ts_rand_normal_f64_at(piece + first, first, m, key, 0.5, 2.0);
            else
                ts_rand_uniform_f64_at(piece + first, first, m, key, -1.0, 3.0);
            CHECK(!memcmp(piece + first, whole + first, sizeof(double) * (size_t)m),
                  "%s: the %lld values from %lld differ from the whole stream",
                  normal ? "normal" : "uniform", (long long)m, (long long)first);
            first += m >= 4 ? m - m % 4 : 4;
        }
        int64_t bad = -1;
        for (int64_t i = 0; i < N && bad < 0; i++)
            if (memcmp(&piece[i], &whole[i], sizeof(double))) bad = i;
        CHECK(bad < 0, "%s: piece value %lld differs from the whole stream",
              normal ? "normal" : "uniform", (long long)bad);
    }
}

typedef struct kind {
    const char *name;
    ts_init init;
    int normal; /* -1: constant `value` */
    double lo, hi, value;
} kind;

/* The old init_value: the whole stream in doubles, then cast to float. */
static void reference(const kind *k, uint64_t seed, float *out) {
    double *tmp = malloc(sizeof(double) * N);
    const uint64_t key = ts_hash_str(k->name) ^ (seed * 0x9E3779B97F4A7C15ull);
    if (k->normal == 1) ts_rand_normal_f64(tmp, N, key, k->lo, k->hi);
    if (k->normal == 0) ts_rand_uniform_f64(tmp, N, key, k->lo, k->hi);
    for (int i = 0; i < N; i++) out[i] = (float)(k->normal < 0 ? k->value : tmp[i]);
    free(tmp);
}

static void test_plan_init(void) {
    const double fi = COLS, fo = ROWS;                                /* dims [out, in] */
    const double ku = sqrt(3.0) * sqrt(2.0 / (1.0 + 5.0)) / sqrt(fi); /* kaiming_uniform(sqrt 5) */
    const double kn = sqrt(2.0 / (1.0 + 0.01 * 0.01)) / sqrt(fi);
    const double xu = 1.5 * sqrt(6.0 / (fi + fo)), xn = 0.7 * sqrt(2.0 / (fi + fo));
    const kind kinds[] = {
        {"p.normal", ts_init_normal(0.25, 0.02), 1, 0.25, 0.02, 0},
        {"p.uniform", ts_init_uniform(-0.1, 0.3), 0, -0.1, 0.3, 0},
        {"p.kaiming_u", ts_init_kaiming_uniform(sqrt(5.0)), 0, -ku, ku, 0},
        {"p.kaiming_n", ts_init_kaiming_normal(0.01), 1, 0, kn, 0},
        {"p.xavier_u", ts_init_xavier_uniform(1.5), 0, -xu, xu, 0},
        {"p.xavier_n", ts_init_xavier_normal(0.7), 1, 0, xn, 0},
        {"p.ones", ts_init_ones(), -1, 0, 0, 1},
        {"p.constant", ts_init_constant(-0.0), -1, 0, 0, -0.0},
        {"p.zeros", ts_init_zeros(), -1, 0, 0, 0},
    };
    enum { K = sizeof kinds / sizeof kinds[0] };
    const uint64_t seed = 26;
    float *want = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    for (int threads = 1; threads <= 2; threads++) {
        ts_graph *g = ts_graph_new();
        int64_t d[2] = {ROWS, COLS};
        ts_val sum = TS_NONE;
        for (int i = 0; i < K; i++) {
            ts_val p = ts_param(g, kinds[i].name, TS_F32, 2, d, kinds[i].init);
            ts_val s = ts_sum(g, p, 0, NULL, 0);
            sum = i ? ts_add(g, sum, s) : s;
        }
        ts_compile_options o = ts_compile_options_default();
        o.seed = seed;
        o.threads = threads;
        ts_plan *plan = NULL;
        ts_train_spec spec = ts_train_spec_default(sum);
        CHECK_OK(ts_compile(g, &spec, &o, &plan));
        for (int i = 0; plan && i < K; i++) {
            reference(&kinds[i], seed, want);
            CHECK_OK(ts_plan_read(plan, kinds[i].name, got, sizeof(float) * N));
            CHECK(!memcmp(got, want, sizeof(float) * N),
                  "%s with %d threads: the values differ from the whole stream drawn at once",
                  kinds[i].name, threads);
        }
        ts_plan_free(plan);
        ts_graph_free(g);
    }
    free(want);
    free(got);
}

static void test_process_age(void) {
    const double a = ts_process_age();
    CHECK(a >= 0 && a < 3600, "ts_process_age %g s: not the age of a test just started", a);
}

int main(void) {
    test_stream_pieces();
    test_plan_init();
    test_process_age();
    return check_summary("unit/init_pieces");
}
