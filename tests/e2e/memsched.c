/* Memory-aware scheduling from the command line (docs/scheduling.md):
 * `tessel compile` reports the schedule's temporaries equal to the arena's
 * region and no more than build order's; under compile.max_memory_mb it
 * recomputes, fits and says what it costs, and W4's temporaries drop at
 * least 25 % below build order; an impossible limit is refused with what
 * the step needs; `tessel train` of the fusion model writes bit-identical
 * parameters and optimizer state with and without the limit, and with
 * build order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"

/* The byte count of the stats row `name` in out, 0 if missing (names are
 * padded: two spaces tell "arena" from "arena / naive"). */
static size_t row(const char *out, const char *name) {
    char key[64];
    snprintf(key, sizeof key, "\n%s  ", name);
    const char *p = strstr(out, key);
    if (p)
        p += strlen(key);
    else if (!strncmp(out, key + 1, strlen(key + 1))) /* the first line */
        p = out + strlen(key + 1);
    return p ? (size_t)strtoull(p, NULL, 10) : 0;
}

static void test_compile(void) {
    e2e_result r = e2e_run("compile examples/fusion.yaml");
    CHECK(r.rc == 0, "compile fusion: %s", r.err);
    size_t temp = row(r.out, "  temporaries"), live = row(r.out, "peak live (schedule)"),
           naive = row(r.out, "peak live (build order)");
    CHECK(temp > 0 && live == temp, "schedule's peak %zu vs temporaries %zu:\n%s", live, temp,
          r.out);
    CHECK(naive >= temp, "build order %zu below the schedule's %zu", naive, temp);
    CHECK(!strstr(r.out, "recomputed"), "recompute without a limit:\n%s", r.out);
    e2e_done(&r);

    /* W4: a limit 25 % below build order's temporaries, as bench/memsched */
    r = e2e_run("compile examples/w4.yaml");
    size_t arena = row(r.out, "arena"), t4 = row(r.out, "  temporaries"),
           n4 = row(r.out, "peak live (build order)");
    e2e_done(&r);
    CHECK(arena > 0 && n4 > 0, "W4 stats");
    const double limit = ((double)(arena - t4) + 0.75 * (double)n4) / 1048576.0;
    r = e2e_runf("compile examples/w4.yaml --set compile.max_memory_mb=%.3f", limit);
    CHECK(r.rc == 0, "W4 under %.3f MiB: %s", limit, r.err);
    size_t a2 = row(r.out, "arena"), t2 = row(r.out, "  temporaries");
    CHECK(a2 > 0 && (double)a2 <= limit * 1048576.0 && (double)t2 <= 0.75 * (double)n4,
          "W4 under %.3f MiB: arena %zu, temporaries %zu vs build order %zu", limit, a2, t2, n4);
    CHECK(strstr(r.out, "recomputed") && strstr(r.out, "% of the step") &&
              strstr(r.out, "MiB without"),
          "W4: no recompute report:\n%s", r.out);
    e2e_done(&r);

    r = e2e_run("compile examples/fusion.yaml --set compile.max_memory_mb=2");
    CHECK(r.rc != 0 && strstr(r.err, "needs at least") &&
              strstr(r.err, "above compile.max_memory_mb 2.00"),
          "limit 2 MiB: rc %d, %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_run("compile examples/fusion.yaml --set compile.max_memory_mb=-1");
    CHECK(r.rc != 0 && strstr(r.err, "compile.max_memory_mb"), "limit -1: rc %d, %s", r.rc, r.err);
    e2e_done(&r);
}

/* The losses and gradient norms of metrics.jsonl (printed with 9 digits:
 * every float's exact value), without the timings. */
static char *losses(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    char *text = e2e_slurp(path, NULL), *out = calloc(strlen(text) + 1, 1);
    size_t k = 0;
    for (const char *p = text; (p = strstr(p, "\"loss\":")); p++) {
        const char *e = strstr(p, ",\"samples_per_s\"");
        const char *n = strstr(p, "\"grad_norm\":");
        if (!e) break;
        memcpy(out + k, p, (size_t)(e - p)), k += (size_t)(e - p);
        if (n) {
            /* the value alone: the first record has a timing after it */
            size_t len = strcspn(n + 12, ",}") + 12;
            memcpy(out + k, n, len), k += len;
        }
        out[k++] = '\n';
    }
    free(text);
    return out;
}

static void test_train(void) {
    const char *sets[3] = {"", "--set compile.max_memory_mb=15.5",
                           "--set compile.naive_schedule=true"};
    char *ref_loss = NULL, *ref_params = NULL, *ref_state = NULL;
    long ref_pl = 0, ref_sl = 0;
    for (int i = 0; i < 3; i++) {
        char dir[32];
        snprintf(dir, sizeof dir, "run%d", i);
        e2e_result r = e2e_runf("train examples/fusion.yaml --set train.steps=3 --set "
                                "ckpt.every=3 %s --out %s",
                                sets[i], e2e_path(dir));
        CHECK(r.rc == 0, "train %s: %s", sets[i], r.err);
        e2e_done(&r);
        char p[512], s[512];
        snprintf(p, sizeof p, "%s/step-00000003/params-r0-000.safetensors", e2e_path(dir));
        snprintf(s, sizeof s, "%s/step-00000003/state-r0-000.safetensors", e2e_path(dir));
        long pl = 0, sl = 0;
        char *params = e2e_slurp(p, &pl), *state = e2e_slurp(s, &sl), *loss = losses(e2e_path(dir));
        CHECK(pl > 1000 && sl > 1000 && strlen(loss) > 20, "%s: no checkpoint or metrics", dir);
        if (i == 0) {
            ref_loss = loss, ref_params = params, ref_state = state, ref_pl = pl, ref_sl = sl;
            continue;
        }
        CHECK(!strcmp(loss, ref_loss), "%s: losses differ:\n%s\nvs\n%s", sets[i], loss, ref_loss);
        CHECK(pl == ref_pl && !memcmp(params, ref_params, (size_t)pl),
              "%s: the parameters differ from the run without it", sets[i]);
        CHECK(sl == ref_sl && !memcmp(state, ref_state, (size_t)sl),
              "%s: the optimizer state differs from the run without it", sets[i]);
        free(loss), free(params), free(state);
    }
    free(ref_loss), free(ref_params), free(ref_state);
}

int main(void) {
    char dir[64];
    if (!e2e_setup("memsched", dir, sizeof dir)) return check_summary("e2e/memsched");
    test_compile();
    test_train();
    e2e_cleanup(dir);
    return check_summary("e2e/memsched");
}
