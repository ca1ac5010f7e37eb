/* `tessel train` on a 320 MB token file (written here, removed after):
 * the file is memory-mapped, not read whole, so the run's peak resident
 * memory (the child's ru_maxrss) stays far below the file's size; every
 * train record of metrics.jsonl and summary.json carry data_wait_ms.
 * Then a sharded corpus: data.path a directory of three shards and a glob
 * of two of them train, lineage.json lists each shard with its SHA-256 in
 * name order, and a bad shard is named in the error. First, the
 * validation split of a mapped file is evaluated from the mapping: a
 * tenth of a 48 MB file held out adds nothing like its 38 MB copy. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "check.h"
#include "e2e.h"

static void shard(const char *name, int n, int bad_at) {
    FILE *f = fopen(e2e_path(name), "wb");
    for (int i = 0; f && i < n; i++) {
        uint16_t t = (uint16_t)(i == bad_at ? 64 : (i * 5 + n) % 64);
        fwrite(&t, 2, 1, f);
    }
    if (f) fclose(f);
}

static void train_on(const char *path, const char *tag, int want_rc, const char *want) {
    char cfg[64];
    snprintf(cfg, sizeof cfg, "%s.yaml", tag);
    FILE *f = fopen(e2e_path(cfg), "w");
    if (f) {
        fprintf(f,
                "model: {name: gpt, batch: 4, ctx: 16, vocab: 64, d_model: 16, n_layers: 1, "
                "n_heads: 2}\n"
                "train: {steps: 4, lr: 0.01, threads: 1, seed: 2}\n"
                "data: {source: tokens, path: '%s', bits: 16, val_fraction: 0.1}\n",
                path);
        fclose(f);
    }
    char run[64];
    snprintf(run, sizeof run, "run-%s", tag);
    e2e_result r = e2e_runf("train %s --out %s", e2e_path(cfg), e2e_path(run));
    CHECK(r.rc == want_rc, "%s: exit %d: %s", tag, r.rc, r.err);
    if (want_rc == 0) {
        char lin[96];
        snprintf(lin, sizeof lin, "%s/lineage.json", run);
        char *text = e2e_slurp(e2e_path(lin), NULL);
        const char *at = text;
        for (const char *w = want; *w; w += strlen(w) + 1) {
            const char *hit = strstr(at, w);
            CHECK(hit && strstr(hit, "\"sha256\""), "%s: lineage lists %s in order:\n%s", tag, w,
                  text);
            if (hit) at = hit;
        }
        free(text);
    } else {
        CHECK(strstr(r.err, want) != NULL, "%s: the error names %s: %s", tag, want, r.err);
    }
    e2e_done(&r);
}

static void test_shards(void) {
    e2e_sh("mkdir -p %s", e2e_path("shards"));
    shard("shards/b.u16", 3000, -1);
    shard("shards/a.u16", 2000, -1);
    shard("shards/c.u16", 1000, -1);
    train_on(e2e_path("shards"), "dir", 0, "shards/a.u16\0shards/b.u16\0shards/c.u16\0");
    char pat[200];
    snprintf(pat, sizeof pat, "%s/[bc].u16", e2e_path("shards"));
    train_on(pat, "glob", 0, "shards/b.u16\0shards/c.u16\0");
    shard("shards/b.u16", 3000, 77);
    train_on(e2e_path("shards"), "bad", 2, "shards/b.u16: token at byte offset 154 is 64");
}

/* Peak resident memory of the children so far (kB): the largest of any
 * child waited for, so a run that peaks lower than an earlier one leaves
 * it unchanged. */
static long children_peak_kb(void) {
    struct rusage ru;
    return getrusage(RUSAGE_CHILDREN, &ru) == 0 ? ru.ru_maxrss : -1;
}

/* The validation split of a mapped token file is read from the mapping,
 * not copied (16 bytes a token): the same 48 MB file trained with
 * val_fraction 0.001 and then 0.1 (2.4 M tokens, which a copy would hold
 * in 38 MB) peaks no higher by more than a third of that copy. Both runs
 * evaluate the whole split at their last step. First in main, while no
 * larger run has set the children's peak. */
static void test_val_mapped(void) {
    const char *tok = e2e_path("val.u16");
    enum { NTOK = 24 << 20, CTX = 32 };
    uint16_t *buf = malloc((size_t)NTOK * sizeof *buf);
    FILE *f = fopen(tok, "wb");
    int ok = f && buf;
    for (size_t i = 0; ok && i < NTOK; i++) buf[i] = (uint16_t)((i * 2654435761u >> 7) % 64u);
    ok = ok && fwrite(buf, sizeof *buf, NTOK, f) == NTOK;
    free(buf);
    if (f) ok &= fclose(f) == 0;
    CHECK(ok, "writing %s", tok);
    long peak[2] = {0, 0};
    const double fraction[2] = {0.001, 0.1};
    for (int k = 0; ok && k < 2; k++) {
        char cfg[32], run[32];
        snprintf(cfg, sizeof cfg, "val%d.yaml", k);
        snprintf(run, sizeof run, "run-val%d", k);
        f = fopen(e2e_path(cfg), "w");
        if (f) {
            fprintf(f,
                    "model: {name: gpt, batch: 256, ctx: %d, vocab: 64, d_model: 8, n_layers: 1, "
                    "n_heads: 1}\n"
                    "train: {steps: 2, lr: 0.01, threads: 1, seed: 2}\n"
                    "data: {source: tokens, path: %s, bits: 16, val_fraction: %g}\n",
                    CTX, tok, fraction[k]);
            fclose(f);
        }
        e2e_result r = e2e_runf("train %s --out %s", e2e_path(cfg), e2e_path(run));
        CHECK(r.rc == 0, "val_fraction %g: %s", fraction[k], r.err);
        e2e_done(&r);
        peak[k] = children_peak_kb();
        char mj[64];
        snprintf(mj, sizeof mj, "%s/metrics.jsonl", run);
        char *m = e2e_slurp(e2e_path(mj), NULL);
        CHECK(m && strstr(m, "\"type\":\"eval\",\"split\":\"val\""),
              "val_fraction %g: the split was evaluated", fraction[k]);
        free(m);
    }
    const long copy_kb = (long)(0.1 * NTOK) * 16 / 1024;
    printf("peak resident memory: %ld MB with val_fraction 0.001, %ld MB with 0.1 (a copy of "
           "that split: %ld MB)\n",
           peak[0] >> 10, peak[1] >> 10, copy_kb >> 10);
#if defined(__SANITIZE_ADDRESS__)
    printf("peak RSS bound not checked under AddressSanitizer\n");
#else
    CHECK(peak[1] - peak[0] < copy_kb / 3,
          "val_fraction 0.1 peaks %ld MB above 0.001: the validation windows were copied",
          (peak[1] - peak[0]) >> 10);
#endif
    remove(tok);
}

int main(void) {
    char dir[64];
    if (!e2e_setup("tokens-stream", dir, sizeof dir)) return check_summary("e2e/tokens_stream");
    test_val_mapped();
    const char *tok = e2e_path("big.u16");
    FILE *f = fopen(tok, "wb");
    enum { CH = 1 << 20, CHUNKS = 160 }; /* 160 M tokens, 320 MB */
    uint16_t *buf = malloc(CH * sizeof *buf);
    int ok = f && buf;
    for (int c = 0; ok && c < CHUNKS; c++) {
        for (int i = 0; i < CH; i++) buf[i] = (uint16_t)((c * CH + i) * 7u % 64u);
        ok = fwrite(buf, sizeof *buf, CH, f) == CH;
    }
    free(buf);
    if (f) ok &= fclose(f) == 0;
    CHECK(ok, "writing %s", tok);
    const char *cfg = e2e_path("gpt.yaml");
    f = fopen(cfg, "w");
    if (f) {
        fprintf(f,
                "model: {name: gpt, batch: 8, ctx: 256, vocab: 64, d_model: 32, n_layers: 1, "
                "n_heads: 2}\n"
                "train: {steps: 30, lr: 0.01, threads: 1, seed: 2}\n"
                "data: {source: tokens, path: %s, bits: 16, val_fraction: 0.002}\n",
                tok);
        fclose(f);
    }
    if (ok && f) {
        e2e_result r = e2e_runf("train %s --out %s", cfg, e2e_path("run"));
        CHECK(r.rc == 0, "train: %s", r.err);
        e2e_done(&r);
        struct rusage ru;
        CHECK(getrusage(RUSAGE_CHILDREN, &ru) == 0, "getrusage");
        printf("peak resident memory of the run: %ld MB for a 320 MB token file\n",
               ru.ru_maxrss >> 10);
        CHECK(ru.ru_maxrss > 0 && ru.ru_maxrss < 160 * 1024,
              "peak resident memory %ld MB, not far below the 320 MB file", ru.ru_maxrss >> 10);
        char *m = e2e_slurp(e2e_path("run/metrics.jsonl"), NULL);
        int train = 0, wait = 0, first = 0;
        double first_ms = -1;
        for (char *line = strtok(m, "\n"); line; line = strtok(NULL, "\n")) {
            if (!strstr(line, "\"type\":\"train\"")) continue;
            train++;
            wait += strstr(line, ",\"data_wait_ms\":") != NULL;
            const char *f = strstr(line, ",\"start_to_first_step_ms\":");
            if (f) first++, first_ms = atof(f + strlen(",\"start_to_first_step_ms\":"));
        }
        CHECK(train == 30 && wait == 30, "%d train records, %d with data_wait_ms", train, wait);
        CHECK(first == 1, "%d train records with start_to_first_step_ms, not the first alone",
              first);
        free(m);
        char *s = e2e_slurp(e2e_path("run/summary.json"), NULL);
        CHECK(strstr(s, "\"data_wait_ms\":"), "summary.json has data_wait_ms:\n%s", s);
        /* the time from the process start to the first step, as the first record has it */
        const char *f = strstr(s, "\"start_to_first_step_ms\": ");
        const double sum_ms = f ? atof(f + strlen("\"start_to_first_step_ms\": ")) : -1;
        CHECK(sum_ms > 0 && sum_ms < 600e3 && fabs(sum_ms - first_ms) < 0.1,
              "summary.json's start_to_first_step_ms %g, the first record's %g", sum_ms, first_ms);
        CHECK(strstr(s, "\"first_step_ms\": "), "summary.json has first_step_ms:\n%s", s);
        printf("start to first step: %.1f ms\n", sum_ms);
        free(s);
    }
    remove(tok);
    test_shards();
    e2e_cleanup(dir);
    return check_summary("e2e/tokens_stream");
}
