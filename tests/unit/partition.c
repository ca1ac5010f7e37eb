/* partition.c — the cut search of pipeline placement against brute force
 * on synthetic cost graphs, hand-made cases with a known optimum, memory
 * limits, and the GPipe / 1F1B schedules against their closed forms. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "dist/repro_sum.h"
#include "passes/partition.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* xorshift, in [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static ts_device_speed dev(const char *name, double gemm, double mem, double link, double mb) {
    ts_device_speed d = {{0}, gemm, mem, link, mb};
    strncpy(d.name, name, sizeof d.name - 1);
    return d;
}

/* Every split of K units into S stages: the best objective among those
 * that fit (INFINITY if none). */
static double brute(const ts_part_problem *p, int *last, int s, int start, double best) {
    const int S = p->stages, K = p->n_units;
    if (s == S - 1) {
        last[s] = K - 1;
        ts_part_result r;
        if (ts_part_eval(p, last, &r) != TS_OK) return best;
        return r.fits && r.objective < best ? r.objective : best;
    }
    for (int k = start; k <= K - S + s; k++) {
        last[s] = k;
        best = brute(p, last, s + 1, k + 1, best);
    }
    return best;
}

static void random_cases(void) {
    int agreed = 0, refused = 0;
    for (int it = 0; it < 400; it++) {
        const int K = 2 + (int)(urand() * 10), S = 1 + (int)(urand() * (K < 5 ? K : 5));
        const int P = 1 + (int)(urand() * 6);
        ts_part_unit u[16];
        int params[16][3];
        double pb[8], gb[8];
        for (int i = 0; i < P; i++) pb[i] = 1e6 * (1 + (int)(urand() * 8)), gb[i] = pb[i] / 4;
        for (int i = 0; i < K; i++) {
            u[i] = (ts_part_unit){0};
            u[i].gemm_flops = urand() < 0.7 ? 1e9 * urand() : 0;
            u[i].mem_traffic = 1e8 * urand();
            u[i].act_bytes = 1e6 * (int)(urand() * 4);
            u[i].out_bytes = i < K - 1 ? 1e5 * (1 + (int)(urand() * 50)) : 0;
            u[i].n_params = (int)(urand() * 3);
            for (int j = 0; j < u[i].n_params; j++) params[i][j] = (int)(urand() * P);
            u[i].params = params[i];
        }
        ts_device_speed d[3];
        const int nd = 1 + (int)(urand() * 3);
        for (int i = 0; i < nd; i++)
            d[i] = dev("d", 10 + 90 * urand(), 5 + 20 * urand(), 1 + 10 * urand(),
                       urand() < 0.3 ? 8 + 40 * urand() : 0);
        ts_part_problem p = {u,
                             K,
                             pb,
                             P,
                             d,
                             nd,
                             S,
                             1 + (int)(urand() * 8),
                             urand() < 0.5 ? TS_PIPE_1F1B : TS_PIPE_GPIPE,
                             urand() < 0.2 ? 30 : 0,
                             urand() < 0.5 ? gb : NULL};
        int last[TS_PIPE_MAX_STAGES];
        const double want = brute(&p, last, 0, 0, INFINITY);
        ts_part_result r;
        const ts_status s = ts_part_search(&p, &r);
        if (!isfinite(want)) {
            CHECK(s != TS_OK, "case %d: nothing fits, but the search found %g", it, r.objective);
            CHECK(strstr(ts_last_error(), "fits the memory limits") != NULL, "message: %s",
                  ts_last_error());
            refused++;
            continue;
        }
        CHECK(s == TS_OK, "case %d: %s", it, ts_last_error());
        if (s != TS_OK) continue;
        CHECK(r.objective == want, "case %d (K %d S %d): search %.17g, brute force %.17g", it, K, S,
              r.objective, want);
        CHECK(r.fits, "case %d: the chosen split must fit", it);
        ts_part_result again;
        CHECK_OK(ts_part_eval(&p, r.last, &again));
        CHECK(again.objective == r.objective, "case %d: its split evaluates to %g", it,
              again.objective);
        agreed++;
    }
    /* both kinds occur, so neither branch is vacuous */
    CHECK(agreed > 200 && refused > 5, "agreed %d, refused %d", agreed, refused);
}

/* Six equal units; device 0 twice as fast: the fast one takes four. */
static void unequal_devices(void) {
    ts_part_unit u[6];
    for (int i = 0; i < 6; i++) u[i] = (ts_part_unit){1e9, 0, 0, i < 5 ? 1 : 0, NULL, 0};
    ts_device_speed d[2] = {dev("fast", 2, 1, 1e9, 0), dev("slow", 1, 1, 1e9, 0)};
    ts_part_problem p = {u, 6, NULL, 0, d, 2, 2, 4, TS_PIPE_1F1B, 0, NULL};
    ts_part_result r, even;
    CHECK_OK(ts_part_search(&p, &r));
    CHECK(r.last[0] == 3 && r.last[1] == 5, "cuts after %d, %d", r.last[0], r.last[1]);
    CHECK_NEAR(r.objective, 2.0, 1e-6);
    int last[2];
    ts_part_even(6, 2, last);
    CHECK(last[0] == 2 && last[1] == 5, "even split %d %d", last[0], last[1]);
    CHECK_OK(ts_part_eval(&p, last, &even));
    CHECK_NEAR(even.objective, 3.0, 1e-6);
    /* the even split of 7 units into 3: 3, 2, 2 */
    int l3[3];
    ts_part_even(7, 3, l3);
    CHECK(l3[0] == 2 && l3[1] == 4 && l3[2] == 6, "even 7/3: %d %d %d", l3[0], l3[1], l3[2]);
}

/* Matrix work goes to the GEMM-fast device, memory-bound work to the other. */
static void affinity(void) {
    ts_part_unit u[2] = {{0, 4e9, 0, 1, NULL, 0}, {4e9, 0, 0, 0, NULL, 0}};
    ts_device_speed a[2] = {dev("bw", 1, 4, 1e9, 0), dev("gemm", 4, 1, 1e9, 0)};
    ts_part_problem p = {u, 2, NULL, 0, a, 2, 2, 1, TS_PIPE_1F1B, 0, NULL};
    ts_part_result r;
    CHECK_OK(ts_part_search(&p, &r));
    CHECK_NEAR(r.objective, 1.0, 1e-6);
    CHECK(r.compute_s[0] < 1.0 + 1e-6 && r.compute_s[1] < 1.0 + 1e-6, "%g %g", r.compute_s[0],
          r.compute_s[1]);
}

/* A memory limit moves the cut; one the parameters cannot meet is refused. */
static void memory_limits(void) {
    int p0[1] = {0}, p1[1] = {1}, p2[1] = {2};
    ts_part_unit u[3] = {{1e9, 0, 0, 1, p0, 1}, {1e9, 0, 0, 1, p1, 1}, {1e9, 0, 0, 0, p2, 1}};
    const double mib = 1024.0 * 1024.0, pb[3] = {10 * mib, 10 * mib, 10 * mib};
    ts_device_speed d[2] = {dev("a", 1, 1, 1e9, 15), dev("b", 1, 1, 1e9, 0)};
    ts_part_problem p = {u, 3, pb, 3, d, 2, 2, 1, TS_PIPE_1F1B, 0, NULL};
    ts_part_result r;
    CHECK_OK(ts_part_search(&p, &r));
    CHECK(r.last[0] == 0, "stage 0 can hold one parameter only: ends at %d", r.last[0]);
    /* its parameter, its output's gradient and the output's send buffer */
    CHECK_NEAR(r.mem_bytes[0], 10 * mib + 2, 1);
    d[0].mem_mb = 5;
    CHECK(ts_part_search(&p, &r) != TS_OK, "a 5 MiB device cannot hold a 10 MiB parameter");
    CHECK(strstr(ts_last_error(), "10.0 MiB on stage 0 (device a, limit 5.0 MiB") != NULL, "%s",
          ts_last_error());
    /* dist.max_mem_mb applies to devices without their own limit */
    d[0].mem_mb = 0;
    p.max_mem_mb = 25;
    CHECK_OK(ts_part_search(&p, &r));
    CHECK(r.last[0] <= 1 && r.mem_bytes[1] <= 25 * mib, "limits %g %g", r.mem_bytes[0],
          r.mem_bytes[1]);
    /* a parameter read by two stages (a tied embedding) is held by both */
    int tied[1] = {0};
    ts_part_unit t[2] = {{1e9, 0, 0, 1, tied, 1}, {1e9, 0, 0, 0, tied, 1}};
    ts_part_problem q = {t, 2, pb, 1, d, 1, 2, 1, TS_PIPE_1F1B, 0, NULL};
    CHECK_OK(ts_part_search(&q, &r));
    CHECK(r.param_bytes[0] == 10 * mib && r.param_bytes[1] == 10 * mib, "tied: %g %g",
          r.param_bytes[0], r.param_bytes[1]);
    /* too few places to cut */
    q.stages = 3;
    CHECK(ts_part_search(&q, &r) != TS_OK && strstr(ts_last_error(), "only 1 place to cut"), "%s",
          ts_last_error());
}

/* A stage's memory counts the buffers beside its plan: activations of the
 * micro-batches in flight plus the running one, a send buffer per
 * micro-batch each way, the micro-batch tree's partial sums of its
 * gradients and a shared parameter's gradient shares (session/stages_run.c
 * allocates these; tests/unit/stage_memory.c checks the estimate against
 * real stages). */
static void stage_buffers(void) {
    int a[1] = {0}, b[2] = {0, 1};
    ts_part_unit u[2] = {{0, 0, 1000, 100, a, 1}, {0, 0, 2000, 0, b, 2}};
    const double pb[2] = {40, 80}, gb[2] = {10, 20};
    ts_device_speed d[1] = {dev("a", 1, 1, 1, 0)};
    ts_part_problem p = {u, 2, pb, 2, d, 1, 2, 4, TS_PIPE_1F1B, 0, gb};
    ts_part_result r;
    CHECK_OK(ts_part_search(&p, &r));
    CHECK(r.last[0] == 0 && r.inflight[0] == 2, "split %d, in flight %d", r.last[0], r.inflight[0]);
    /* parameter 40; activations of 2 in flight + the running one 3000;
     * gradient of its output 100; 4 activations sent 400; tree of 4
     * micro-batches: 2 partial sums of 10; the tied parameter's one
     * receive buffer 10 */
    CHECK_NEAR(r.mem_bytes[0], 40 + 3000 + 100 + 400 + 20 + 10, 1e-9);
    /* parameters 120; one micro-batch (it runs forward and backward at
     * once) with its input 2100; 4 input gradients sent 400; 2 partial
     * sums of 20 (the tied parameter's gradient left out: stage 0 sums
     * it); a share of the tied parameter's gradient per micro-batch 40 */
    CHECK_NEAR(r.mem_bytes[1], 120 + 2100 + 400 + 40 + 40, 1e-9);
    CHECK(ts_tree_sum_buffers(8) == 3 && ts_tree_sum_buffers(6) == 2 &&
              ts_tree_sum_buffers(1) == 1 && ts_tree_sum_buffers(2) == 1,
          "tree buffers %d %d %d %d", ts_tree_sum_buffers(8), ts_tree_sum_buffers(6),
          ts_tree_sum_buffers(1), ts_tree_sum_buffers(2));
}

static void schedules(void) {
    for (int k = 0; k < 2; k++)
        for (int S = 1; S <= 4; S++)
            for (int M = 1; M <= 8; M++) {
                /* every forward and backward once, a backward after its
                 * forward, backwards in micro-batch order, at most
                 * ts_part_inflight activations kept */
                for (int s = 0; s < S; s++) {
                    ts_pipe_op ops[16];
                    ts_pipe_order((ts_pipe_schedule)k, S, M, s, ops);
                    int f = 0, b = 0, live = 0, peak = 0, ok = 1;
                    for (int i = 0; i < 2 * M; i++) {
                        if (!ops[i].bwd)
                            ok &= ops[i].mb == f++, live++;
                        else
                            ok &= ops[i].mb == b++ && ops[i].mb < f, live--;
                        if (live > peak) peak = live;
                    }
                    CHECK(ok && f == M && b == M, "order k%d S%d M%d s%d", k, S, M, s);
                    CHECK(peak == ts_part_inflight((ts_pipe_schedule)k, S, M, s),
                          "k%d S%d M%d s%d: %d in flight, expected %d", k, S, M, s, peak,
                          ts_part_inflight((ts_pipe_schedule)k, S, M, s));
                }
                /* equal stages: step (M + S - 1)(f + b), bubble (S-1)/(M+S-1) */
                double fw[4] = {1, 1, 1, 1}, bw[4] = {2, 2, 2, 2}, link[4] = {0};
                double step, bubble;
                CHECK_OK(ts_pipe_simulate((ts_pipe_schedule)k, S, M, fw, bw, link, &step, &bubble));
                CHECK_NEAR(step, (M + S - 1) * 3.0, 1e-9);
                CHECK_NEAR(bubble, (S - 1.0) / (M + S - 1.0), 1e-12);
            }
    /* one slow stage sets the pace: 1F1B, 2 stages, 8 micro-batches */
    double fw[2] = {1, 2}, bw[2] = {2, 4}, link[2] = {0.5, 0}, step, bubble;
    CHECK_OK(ts_pipe_simulate(TS_PIPE_1F1B, 2, 8, fw, bw, link, &step, &bubble));
    CHECK(step >= 8 * 6 + 1 + 0.5 && step <= 8 * 6 + 3 + 1.0 + 1e-9, "step %g", step);
    CHECK(bubble > 0.25 && bubble < 0.4, "bubble %g", bubble);
}

int main(void) {
    random_cases();
    unequal_devices();
    affinity();
    memory_limits();
    stage_buffers();
    schedules();
    return check_summary("partition");
}
