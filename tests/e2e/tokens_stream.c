/* `tessel train` on a 320 MB token file (written here, removed after):
 * the file is memory-mapped, not read whole, so the run's peak resident
 * memory (the child's ru_maxrss) stays far below the file's size; every
 * train record of metrics.jsonl and summary.json carry data_wait_ms.
 * Then a sharded corpus: data.path a directory of three shards and a glob
 * of two of them train, lineage.json lists each shard with its SHA-256 in
 * name order, and a bad shard is named in the error. */
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

int main(void) {
    char dir[64];
    if (!e2e_setup("tokens-stream", dir, sizeof dir)) return check_summary("e2e/tokens_stream");
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
        int train = 0, wait = 0;
        for (char *line = strtok(m, "\n"); line; line = strtok(NULL, "\n")) {
            if (!strstr(line, "\"type\":\"train\"")) continue;
            train++;
            wait += strstr(line, ",\"data_wait_ms\":") != NULL;
        }
        CHECK(train == 30 && wait == 30, "%d train records, %d with data_wait_ms", train, wait);
        free(m);
        char *s = e2e_slurp(e2e_path("run/summary.json"), NULL);
        CHECK(strstr(s, "\"data_wait_ms\":"), "summary.json has data_wait_ms:\n%s", s);
        free(s);
    }
    remove(tok);
    test_shards();
    e2e_cleanup(dir);
    return check_summary("e2e/tokens_stream");
}
