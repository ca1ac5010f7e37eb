/* The checkpoint format does not move: tests/golden/ckpt-v1/ holds a
 * checkpoint of a small MLP with AdamW whose every persistent value is a
 * known pattern, written by the writer of 2026-12-02 (the O_DIRECT
 * pipeline of issue #26). This test
 *   - opens it with today's reader (manifest, sizes, SHA-256 of every file,
 *     CRC-32C of every tensor) and restores it into a fresh plan: every
 *     value and the step count come back;
 *   - saves the same values again, synchronously and in the background,
 *     through O_DIRECT and the page cache, in the background beside a
 *     caller on every core and on one: every shard file is byte for byte
 *     the golden one (the manifest differs only in its id and time).
 * The values are written, not computed, so the bytes do not depend on the
 * CPU. After an intended change of the format (and a bump of
 * format_version), rewrite the fixture from the repository root:
 *
 *     TESSEL_UPDATE_GOLDEN=1 build/test_unit_ckpt_golden
 */
#include <dirent.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "tessel/ckpt.h"

#define GOLDEN "tests/golden/ckpt-v1"
#define STEP   7

static char root[256];

static void rm_rf(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

static unsigned char *read_all(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (b && fread(b, 1, (size_t)len, f) == (size_t)len) *n = (size_t)len;
    fclose(f);
    return b;
}

/* Value k of persistent value i: a float with few mantissa bits (exact in
 * any arithmetic) or, for another dtype, a byte pattern. */
static void pattern(int i, const ts_persistent *pv, unsigned char *out) {
    if (pv->dtype == TS_F32) {
        float *f = (float *)out;
        for (size_t k = 0; k < pv->bytes / 4; k++)
            f[k] = (float)((int)((k * 2654435761u + (size_t)i * 40503u) >> 20 & 4095) - 2048) /
                   1024.0f;
    } else {
        for (size_t k = 0; k < pv->bytes; k++) out[k] = (unsigned char)(k * 131u + (size_t)i * 17u);
    }
}

static ts_plan *plan_new(ts_graph **g) {
    ts_mlp_config mc = {8, 0, 0, 12, 16, 1, 3, 0, 0};
    *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(*g, &mc, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.95, 1e-8, 0.1);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(*g, &spec, NULL, &p));
    return p;
}

/* Every persistent value set to its pattern (check 0) or compared with it
 * (check 1: returns how many differ). */
static int patterns(ts_plan *p, int check) {
    int bad = 0;
    for (int i = 0; i < ts_plan_persistent_count(p); i++) {
        ts_persistent pv;
        CHECK_OK(ts_plan_persistent(p, i, &pv));
        unsigned char *want = malloc(pv.bytes), *got = malloc(pv.bytes);
        pattern(i, &pv, want);
        if (!check) {
            CHECK_OK(ts_plan_write_param(p, pv.name, want, pv.bytes));
        } else {
            CHECK_OK(ts_plan_read(p, pv.name, got, pv.bytes));
            if (memcmp(want, got, pv.bytes)) bad++, fprintf(stderr, "'%s' differs\n", pv.name);
        }
        free(want);
        free(got);
    }
    return bad;
}

/* The step directory a save into `run` made. */
static void step_dir(char *out, size_t n, const char *run) {
    snprintf(out, n, "%.200s/step-%08d", run, STEP);
}

/* Every .safetensors file of the golden step is in `dir` with the same
 * bytes; returns how many were compared. */
static int same_shards(const char *dir) {
    DIR *d = opendir(GOLDEN);
    int files = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strstr(e->d_name, ".safetensors")) continue;
        char fa[600], fb[600];
        snprintf(fa, sizeof fa, "%s/%s", GOLDEN, e->d_name);
        snprintf(fb, sizeof fb, "%s/%s", dir, e->d_name);
        size_t na, nb;
        unsigned char *x = read_all(fa, &na), *y = read_all(fb, &nb);
        CHECK(x && y && na == nb && na > 0 && !memcmp(x, y, na),
              "%s (%zu bytes) is not byte for byte %s (%zu bytes)", fb, nb, fa, na);
        files++;
        free(x);
        free(y);
    }
    if (d) closedir(d);
    return files;
}

static void update(void) {
    ts_graph *g;
    ts_plan *p = plan_new(&g);
    if (!p) return;
    patterns(p, 0);
    ts_plan_set_step(p, STEP);
    char run[300], step[300], cmd[900];
    snprintf(run, sizeof run, "%s/golden", root);
    ts_ckpt_options o = ts_ckpt_options_default();
    o.threads = 2;
    CHECK_OK(ts_ckpt_save(p, run, NULL, &o));
    step_dir(step, sizeof step, run);
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp %s/* %s/", GOLDEN, GOLDEN, step,
             GOLDEN);
    CHECK(system(cmd) == 0, "%s", cmd);
    printf("wrote %s\n", GOLDEN);
    ts_plan_free(p);
    ts_graph_free(g);
}

static void test_old_loads(void) {
    ts_graph *g;
    ts_plan *p = plan_new(&g);
    if (!p) return;
    ts_ckpt *ck = NULL;
    CHECK_OK(ts_ckpt_open(GOLDEN, NULL, NULL, &ck));
    if (ck) {
        CHECK_OK(ts_ckpt_restore(ck, p, NULL));
        ts_ckpt_close(ck);
        CHECK(patterns(p, 1) == 0, "the golden checkpoint restores every value");
        CHECK(ts_plan_step_count(p) == STEP, "step %lld restored, not %d",
              (long long)ts_plan_step_count(p), STEP);
    }
    ts_plan_free(p);
    ts_graph_free(g);
}

static void test_same_bytes(void) {
    ts_graph *g;
    ts_plan *p = plan_new(&g);
    if (!p) return;
    patterns(p, 0);
    ts_plan_set_step(p, STEP);
    ts_ckpt_options o = ts_ckpt_options_default();
    o.threads = 2;
    const char *modes[2] = {"direct", "buffered"};
    for (int m = 0; m < 2; m++) {
        setenv("TESSEL_CKPT_IO", modes[m], 1);
        char run[300], step[300];
        snprintf(run, sizeof run, "%s/sync-%s", root, modes[m]);
        CHECK_OK(ts_ckpt_save(p, run, NULL, &o));
        step_dir(step, sizeof step, run);
        CHECK(same_shards(step) >= 2, "%s, synchronous: compared the shard files", modes[m]);
        /* a step on every core (hashing on idle time) and on one (the
         * other cores hash at normal priority: save.c's free_cores) */
        const int all = omp_get_max_threads();
        for (int one = 0; one < 2; one++) {
            omp_set_num_threads(one ? 1 : all);
            snprintf(run, sizeof run, "%s/bg-%s-%d", root, modes[m], one);
            ts_ckpt_saver *sv = NULL;
            CHECK_OK(ts_ckpt_saver_new(run, p, &o, &sv));
            if (sv) {
                CHECK_OK(ts_ckpt_saver_begin(sv, p, NULL));
                CHECK_OK(ts_ckpt_saver_wait(sv));
                ts_ckpt_saver_free(sv);
            }
            step_dir(step, sizeof step, run);
            CHECK(same_shards(step) >= 2, "%s, background, step on %s: compared the shard files",
                  modes[m], one ? "one thread" : "every core");
        }
        omp_set_num_threads(all);
    }
    unsetenv("TESSEL_CKPT_IO");
    ts_plan_free(p);
    ts_graph_free(g);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/tessel-ckpt-golden-%d", (int)getpid());
    rm_rf(root);
    CHECK(mkdir(root, 0755) == 0, "mkdir %s", root);
    setenv("TESSEL_CKPT_IO_CACHE", "0", 1);
    const char *up = getenv("TESSEL_UPDATE_GOLDEN");
    if (up && !strcmp(up, "1")) {
        update();
    } else {
        test_old_loads();
        test_same_bytes();
    }
    rm_rf(root);
    return check_summary("ckpt_golden");
}
