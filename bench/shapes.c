/* Shape buckets on a W3-shaped GPT (docs/shapes.md): token documents of 16
 * to 256 tokens, trained on sequence buckets (shape.policy bucket,
 * seq_buckets multiple:32, length-sorted windows) against every batch
 * padded to ctx 256 (one plan), with the same batches in the same order.
 * The corpus is STEPS batches of documents, trained once: with STEPS a
 * multiple of WINDOW every sort window is whole, so the bucketed run's
 * padding is what the sort window gives a corpus of that size, not that
 * of a few hand-picked documents.
 *
 *     bench_shapes corpus FILE [DOCS] [SEED]   writes the corpus: DOCS (default 4096)
 *                                             documents of 16..256 uniform tokens, each
 *                                             ending with the end-of-text id 8191, uint16
 *     bench_shapes [STEPS] [REPS] [RULE] [WINDOW]
 *         default 16 steps, 3 runs of each, alternating; the bucketed runs'
 *         shape.seq_buckets RULE (default multiple:32) and shape.sort_window
 *         WINDOW (default 16; both runs take it, so they see the same batches)
 *
 * Prints per run the real tokens per second (targets that are not
 * padding, over the step loop's wall time), the first and final loss,
 * and for the bucketed runs the plan cache: compiles, seconds per compile,
 * the memory of the bucket plans beside the shared state; then the
 * medians, their ratio and its ceiling: the positions the padded run
 * computes over those the buckets compute. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tessel/tessel.h"

enum { EOT = 8191, BATCH = 8, CTX = 256 };

/* Documents of 16..256 tokens (the end-of-text id included); the real
 * targets (tokens - 1 per document) of the first n_docs into *targets. */
static int write_corpus(const char *path, int docs, unsigned seed, int n_docs, double *targets) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    *targets = 0;
    for (int d = 0; d < docs; d++) {
        const int len = 16 + (int)(rand_r(&seed) % 241);
        if (d < n_docs) *targets += len - 1;
        for (int t = 0; t < len; t++) {
            uint16_t tok = (uint16_t)(t + 1 == len ? EOT : rand_r(&seed) % EOT);
            if (fwrite(&tok, 2, 1, f) != 1) {
                fclose(f);
                return 1;
            }
        }
    }
    return fclose(f) != 0;
}

typedef struct run {
    double rate, first, last, compiles, compile_s, plans, full, largest, state, padding;
} run;

static const char *rule = "multiple:32";
static int window = 16;

static int train(const char *corpus, int steps, int bucket, const char *out, run *r) {
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model: {preset: w3}\n"
             "data: {source: tokens, path: %s, eot_id: %d, val_fraction: 0, shuffle: false}\n"
             "train: {steps: %d, seed: 1, threads: 2, log_every: 0}\n"
             "shape: {policy: %s, seq_buckets: '%s', batch_buckets: [8], sort_window: %d, "
             "precompile: %s}\n"
             "output: {dir: %s}\n",
             corpus, EOT, steps, bucket ? "bucket" : "exact", rule, window,
             bucket ? "true" : "false", out);
    ts_config c;
    ts_config_init(&c);
    ts_status s = ts_config_load_string(&c, yaml, strlen(yaml), "bench.yaml");
    if (s == TS_OK) s = ts_config_finish(&c);
    ts_session_options o = ts_session_options_default();
    o.progress = TS_PROGRESS_NONE;
    ts_session_result res;
    if (s == TS_OK) s = ts_session_run(&c, &o, &res);
    if (s != TS_OK) {
        fprintf(stderr, "bench_shapes: %s\n", ts_last_error());
        return 1;
    }
    memset(r, 0, sizeof *r);
    r->first = res.first_loss, r->last = res.final_loss;
    r->rate = res.seconds;
    char path[600];
    snprintf(path, sizeof path, "%s/summary.json", out);
    json_t *j = json_load_file(path, 0, NULL), *pc = j ? json_object_get(j, "plan_cache") : NULL;
    if (pc) {
        r->compiles = json_number_value(json_object_get(pc, "compiles"));
        r->compile_s = json_number_value(json_object_get(pc, "compile_seconds"));
        r->plans = json_number_value(json_object_get(pc, "plans_bytes"));
        r->full = json_number_value(json_object_get(pc, "full_plan_bytes"));
        r->largest = json_number_value(json_object_get(pc, "largest_plan_bytes"));
        r->state = json_number_value(json_object_get(pc, "state_bytes"));
        r->padding = json_number_value(json_object_get(pc, "padding"));
    }
    json_decref(j);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    return system(cmd) != 0;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "corpus")) {
        double t;
        return write_corpus(argv[2], argc > 3 ? atoi(argv[3]) : 4096,
                            argc > 4 ? (unsigned)atoi(argv[4]) : 1, 0, &t);
    }
    const int steps = argc > 1 ? atoi(argv[1]) : 16, reps = argc > 2 ? atoi(argv[2]) : 3;
    if (argc > 3) rule = argv[3];
    if (argc > 4) window = atoi(argv[4]);
    if (steps < 1 || reps < 1 || reps > 16 || window < 0 || strlen(rule) > 200) {
        fprintf(stderr,
                "usage: bench_shapes [STEPS] [REPS] [RULE] [WINDOW] | corpus FILE [DOCS] [SEED]\n");
        return 2;
    }
    const char *corpus = "/tmp/tessel-bench-shapes.bin";
    double targets;
    /* exactly steps batches: no short last batch in either run */
    if (write_corpus(corpus, steps * BATCH, 1, steps * BATCH, &targets)) return 1;
    printf("W3 GPT, %d steps of %d documents (16..256 tokens, %.0f real targets); buckets %s, "
           "sort_window %d%s\n",
           steps, BATCH, targets, rule, window,
           window && steps % window ? " (the last window is partial)" : "");
    double rate[2][16];
    run r[2];
    for (int k = 0; k < reps; k++)
        for (int b = 1; b >= 0; b--) {
            if (train(corpus, steps, b, "/tmp/tessel-bench-shapes-run", &r[b])) return 1;
            rate[b][k] = targets / r[b].rate;
            printf("%-9s tokens/s %8.0f  loss %.6f -> %.6f", b ? "bucketed" : "pad-256", rate[b][k],
                   r[b].first, r[b].last);
            if (b)
                printf("  compiles %.0f (%.2f s each), padding %.1f %%", r[b].compiles,
                       r[b].compiles ? r[b].compile_s / r[b].compiles : 0, 100 * r[b].padding);
            printf("\n");
        }
    qsort(rate[0], (size_t)reps, sizeof(double), cmp);
    qsort(rate[1], (size_t)reps, sizeof(double), cmp);
    const double m0 = rate[0][reps / 2], m1 = rate[1][reps / 2], mib = 1024.0 * 1024.0;
    /* positions computed: every row padded to ctx, or the real targets
     * over the bucketed run's real share of what it computed */
    const double padded = (double)steps * BATCH * CTX, bucketed = targets / (1 - r[1].padding);
    printf("median tokens/s: bucketed %.0f, pad-256 %.0f: %.2fx (positions computed %.0f vs "
           "%.0f: ceiling %.2fx)\n",
           m1, m0, m1 / m0, bucketed, padded, padded / bucketed);
    printf("memory: shared state %.1f MiB once; the 256 plan's own %.1f MiB; all %d bucket "
           "plans' own %.1f MiB (largest %.1f)\n",
           r[1].state / mib, r[1].full / mib, (int)r[1].compiles + 1, r[1].plans / mib,
           r[1].largest / mib);
    remove(corpus);
    return 0;
}
