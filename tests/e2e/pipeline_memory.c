/* Pipeline stages hold only their stage (docs/distributed.md, "Memory per
 * process"): W3 (examples/w3.yaml) on 2 stages x 8 micro-batches, one
 * step, no checkpoints.
 *
 * - Each stage's arena is at most one process's arena at the same rows
 *   less the parameters, gradients and optimizer state the stage does not
 *   hold: the ratio stage / one process is checked against
 *   1 - (P - p_s) / A, with P one process's persistent bytes and p_s the
 *   stage's from `tessel compile --dump partition` (the cut the run uses).
 *   No rank holds a whole-model plan.
 * - A model that does not fit: dist.max_mem_mb below one process's need
 *   refuses a single-process run with the need in the message (exit 2);
 *   the same limit trains on 2 stages, every process within it.
 * - tiny_gpt with checkpoints: rank 0 alone keeps the whole-model plan; a
 *   limit below a stage's need is refused naming the stage, the rank and
 *   the need. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"

static const char *w3 = "examples/w3.yaml --set train.threads=1 --set dist.pipeline_stages=2 "
                        "--set dist.microbatches=8 --set dist.devices=examples/devices_equal.txt";

/* MiB of a `--dump memory` row ("  params   92962816 bytes  @0"). */
static double dump_mib(const char *text, const char *row) {
    const size_t n = strlen(row);
    for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        const char *p = l;
        while (*p == ' ') p++;
        if (strncmp(p, row, n) != 0 || p[n] != ' ') continue;
        return strtod(p + n, NULL) / (1024.0 * 1024.0);
    }
    return -1;
}

/* Stage s's "persist MiB" in a partition dump's table. */
static double stage_persist(const char *dump, int s) {
    const char *t = strstr(dump, "in flight\n");
    if (!t) return -1;
    t += strlen("in flight\n");
    for (int i = 0; i < s && t; i++) t = strchr(t, '\n'), t = t ? t + 1 : NULL;
    if (!t) return -1;
    /* stage device ops units persist ... */
    char dev[64], units[64];
    int stage = -1, ops = 0;
    double persist = -1;
    if (sscanf(t, "%d %63s %d %63s %lf", &stage, dev, &ops, units, &persist) != 5 || stage != s)
        return -1;
    return persist;
}

static json_t *pipeline_memory(const char *run) {
    char *text = e2e_slurp(e2e_path(run), NULL);
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    free(text);
    json_t *m = j ? json_object_get(json_object_get(j, "pipeline"), "memory") : NULL;
    json_incref(m);
    json_decref(j);
    CHECK(json_is_array(m), "%s: no pipeline.memory", run);
    return m;
}

static double num(json_t *rank, const char *k) {
    return json_number_value(json_object_get(rank, k));
}

static void test_w3(void) {
    /* one process at full batch: its need, then refused under a limit below it */
    e2e_result r = e2e_run("compile examples/w3.yaml --dump memory");
    const double one_full = dump_mib(r.out, "arena");
    CHECK(r.rc == 0 && one_full > 0, "compile w3: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    /* the limit: between a stage's need (about 3/4 of one process's here)
     * and one process's */
    const double limit = 0.85 * one_full;
    r = e2e_runf("train examples/w3.yaml --steps 1 --set dist.max_mem_mb=%.0f --out %s", limit,
                 e2e_path("w3one"));
    char need[64];
    snprintf(need, sizeof need, "needs %.1f MiB per process", one_full);
    CHECK(r.rc == 2 && strstr(r.err, need) && strstr(r.err, "pipeline stages"),
          "one process under dist.max_mem_mb %.0f: exit %d, wanted 2 and '%s'\n%s", limit, r.rc,
          need, r.err);
    e2e_done(&r);

    /* one process at a micro-batch's rows, and the cut the stages use */
    r = e2e_run("compile examples/w3.yaml --set model.batch=1 --dump memory");
    const double A = dump_mib(r.out, "arena");
    const double P =
        dump_mib(r.out, "params") + dump_mib(r.out, "grads") + dump_mib(r.out, "opt state");
    CHECK(r.rc == 0 && A > 0 && P > 0 && P < A, "compile w3 batch 1: A %g P %g\n%s%s", A, P, r.out,
          r.err);
    e2e_done(&r);
    r = e2e_runf("compile %s --dump partition", w3);
    double p[2] = {stage_persist(r.out, 0), stage_persist(r.out, 1)};
    CHECK(r.rc == 0 && p[0] > 0 && p[1] > 0, "partition dump: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);

    r = e2e_runf("train %s --steps 1 --procs 2 --set dist.max_mem_mb=%.0f --out %s", w3, limit,
                 e2e_path("w3pipe"));
    CHECK(r.rc == 0 && strstr(r.out, "pipeline memory per process: rank 0 "),
          "2 stages under dist.max_mem_mb %.0f: exit %d\n%s%s", limit, r.rc, r.out, r.err);
    e2e_done(&r);
    json_t *m = pipeline_memory("w3pipe/summary.json");
    CHECK(json_array_size(m) == 2, "two ranks in pipeline.memory");
    for (size_t i = 0; i < json_array_size(m) && i < 2; i++) {
        json_t *e = json_array_get(m, i);
        const double arena = num(e, "stage_arena_mib"), total = num(e, "total_mib");
        /* the stage lacks the other stage's parameters, gradients and state */
        const double bound = 1 - (P - p[i]) / A;
        CHECK(arena / A <= bound && arena > 0,
              "rank %zu: stage arena %.1f MiB is %.3f of one process's %.1f at the same rows; "
              "the partition allows %.3f (persistent %.1f of %.1f)",
              i, arena, arena / A, A, bound, p[i], P);
        CHECK(num(e, "whole_plan_mib") == 0 && num(e, "eval_plan_mib") == 0,
              "rank %zu holds a whole-model plan (%.1f MiB) without checkpoints", i,
              num(e, "whole_plan_mib"));
        CHECK(total <= limit && total < one_full,
              "rank %zu holds %.1f MiB, over dist.max_mem_mb %.0f or one process's %.1f", i, total,
              limit, one_full);
        printf("w3 2 stages: rank %zu arena %.1f MiB (%.3f of one process's %.1f at 1 row, "
               "bound %.3f), process %.1f MiB (one process at batch 8: %.1f)\n",
               i, arena, arena / A, A, bound, total, one_full);
    }
    json_decref(m);
}

static void test_tiny_ckpt(void) {
    const char *tiny = "examples/tiny_gpt.yaml --steps 2 --procs 2 --set train.threads=1 --set "
                       "dist.pipeline_stages=2 --set dist.microbatches=2 --set "
                       "dist.devices=examples/devices_equal.txt";
    e2e_result r = e2e_runf("train %s --set ckpt.every=1 --out %s", tiny, e2e_path("tiny"));
    CHECK(r.rc == 0, "tiny_gpt with checkpoints: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    json_t *m = pipeline_memory("tiny/summary.json");
    CHECK(json_array_size(m) == 2 && num(json_array_get(m, 0), "whole_plan_mib") > 0 &&
              num(json_array_get(m, 1), "whole_plan_mib") == 0,
          "with checkpoints rank 0 alone keeps the whole-model plan");
    json_decref(m);
    /* below a stage's need: refused before training, naming it */
    r = e2e_runf("train %s --out %s", tiny, e2e_path("tiny1"));
    CHECK(r.rc == 0, "tiny_gpt: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    m = pipeline_memory("tiny1/summary.json");
    double most = 0;
    for (size_t i = 0; i < json_array_size(m); i++)
        if (num(json_array_get(m, i), "total_mib") > most)
            most = num(json_array_get(m, i), "total_mib");
    json_decref(m);
    /* below the fullest process's need but above its arena (the stage's
     * compile checks that alone): the buffers beside it count, in the
     * partition's estimate (which refuses every split) or else in the
     * stages' measured need (exit 2) */
    const double lim = 0.95 * most;
    r = e2e_runf("train %s --set dist.max_mem_mb=%.4f --out %s", tiny, lim, e2e_path("tiny2"));
    CHECK((r.rc != 0 &&
           strstr(r.err, "no split into 2 stages fits the memory limits: the "
                         "closest needs ") &&
           strstr(r.err, "dist.max_mem_mb")) ||
              (r.rc == 2 && strstr(r.err, "dist.max_mem_mb: pipeline stage ") &&
               strstr(r.err, " needs ") && strstr(r.err, "more than dist.max_mem_mb = ")),
          "tiny limit: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
}

int main(void) {
    char dir[64];
    if (!e2e_setup("pipemem", dir, sizeof dir)) return check_summary("e2e/pipeline_memory");
    test_tiny_ckpt();
    test_w3();
    e2e_cleanup(dir);
    return check_summary("e2e/pipeline_memory");
}
