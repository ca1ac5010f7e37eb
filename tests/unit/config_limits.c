/* The config's limits and run-time checks (issue 16): YAML files capped in
 * size and nesting (a 100 000-deep flow sequence fails fast), metrics ports
 * for every rank, ckpt.verify_key none and its default, the private key
 * checked before a run creates anything, and dist.* keys a single-process
 * tool must refuse. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "frontend/config.h"

static char dir[64];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *path_of(const char *name) {
    static char buf[4][160];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 160, "%s/%s", dir, name);
    return p;
}

static void write_file(const char *path, const char *text, size_t n, mode_t mode) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "create %s", path);
    if (!f) return;
    CHECK(fwrite(text, 1, n, f) == n, "write %s", path);
    fclose(f);
    CHECK(chmod(path, mode) == 0, "chmod %s", path);
}

static void expect(const char *what, ts_status got, ts_status want, const char *frag1,
                   const char *frag2) {
    CHECK(got == want, "%s: status %s, expected %s (%s)", what, ts_status_name(got),
          ts_status_name(want), ts_last_error());
    if (got == TS_OK) return;
    CHECK(!frag1 || strstr(ts_last_error(), frag1), "%s: '%s' lacks '%s'", what, ts_last_error(),
          frag1);
    CHECK(!frag2 || strstr(ts_last_error(), frag2), "%s: '%s' lacks '%s'", what, ts_last_error(),
          frag2);
}

/* Load text as "t.yaml", apply the overrides (NULL-terminated), finish. */
static ts_status load(ts_config *c, const char *text, ...) {
    ts_config_init(c);
    ts_status s = ts_config_load_string(c, text, strlen(text), "t.yaml");
    va_list ap;
    va_start(ap, text);
    for (const char *set; s == TS_OK && (set = va_arg(ap, const char *));)
        s = ts_config_set(c, set);
    va_end(ap);
    if (s == TS_OK) s = ts_config_finish(c);
    return s;
}

static void test_nesting(void) {
    /* "a: [[[[...]]]]" 100 000 deep: libyaml alone takes minutes on it. */
    enum { DEPTH = 100000 };
    char *text = malloc(2 * DEPTH + 8);
    memcpy(text, "a: ", 3);
    memset(text + 3, '[', DEPTH);
    memset(text + 3 + DEPTH, ']', DEPTH);
    text[3 + 2 * DEPTH] = '\n';
    text[4 + 2 * DEPTH] = 0;
    ts_config c;
    ts_config_init(&c);
    double t0 = now();
    ts_status s = ts_config_load_string(&c, text, strlen(text), "deep.yaml");
    double dt = now() - t0;
    expect("100000-deep string", s, TS_ERR_INVALID, "deep.yaml:1:", "deeper than 32 levels");
    CHECK(dt < 1.0, "100000-deep string took %.2f s", dt);
    /* The same from a file: the message names the file and line. */
    const char *deep = path_of("deep.yaml");
    write_file(deep, text, strlen(text), 0644);
    ts_config_init(&c);
    t0 = now();
    s = ts_config_load_file(&c, deep);
    dt = now() - t0;
    expect("100000-deep file", s, TS_ERR_INVALID, deep, "deeper than 32 levels");
    CHECK(strstr(ts_last_error(), ":1:") != NULL, "line in '%s'", ts_last_error());
    CHECK(dt < 1.0, "100000-deep file took %.2f s", dt);
    free(text);

    /* Block mappings count too; the line is the one past the cap. */
    char block[8192];
    size_t k = 0;
    for (int i = 0; i < 40; i++)
        k += (size_t)snprintf(block + k, sizeof block - k, "%*sk%d:\n", 2 * i, "", i);
    k += (size_t)snprintf(block + k, sizeof block - k, "%*sv: 1\n", 80, "");
    ts_config_init(&c);
    expect("40 nested mappings", ts_config_load_string(&c, block, k, "t.yaml"), TS_ERR_INVALID,
           "t.yaml:33:", "deeper than 32 levels");

    /* 32 levels are within the cap: the error is the usual one. */
    char ok[256];
    snprintf(ok, sizeof ok, "model: {preset: w1}\ntrain: {lr: %.*s1%.*s}\n", 30,
             "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", 30, "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]");
    ts_config_init(&c);
    s = ts_config_load_string(&c, ok, strlen(ok), "t.yaml");
    expect("32 levels", s, TS_ERR_INVALID, "train.lr: expected a number, got a list", NULL);
    CHECK(!strstr(ts_last_error(), "deeper"), "32 levels: '%s'", ts_last_error());
    /* A syntax error before the cap keeps its message. */
    ts_config_init(&c);
    s = ts_config_load_string(&c, "model: [1\n", 10, "t.yaml");
    expect("unclosed", s, TS_ERR_FORMAT, "t.yaml:", "malformed YAML");
}

static void test_size(void) {
    const size_t mib = (size_t)1 << 20;
    char *text = malloc(mib + 64);
    const char *head = "model: {preset: w1}\n#";
    memcpy(text, head, strlen(head));
    memset(text + strlen(head), 'x', mib + 64 - strlen(head));
    text[mib - 1] = '\n';
    ts_config c;
    /* exactly 1 MiB loads */
    ts_config_init(&c);
    CHECK_OK(ts_config_load_string(&c, text, mib, "t.yaml"));
    const char *big = path_of("big.yaml");
    write_file(big, text, mib, 0644);
    ts_config_init(&c);
    CHECK_OK(ts_config_load_file(&c, big));
    /* one byte more does not */
    text[mib] = '\n';
    ts_config_init(&c);
    expect("1 MiB + 1 string", ts_config_load_string(&c, text, mib + 1, "t.yaml"), TS_ERR_INVALID,
           "t.yaml: larger than 1 MiB", NULL);
    write_file(big, text, mib + 1, 0644);
    ts_config_init(&c);
    expect("1 MiB + 1 file", ts_config_load_file(&c, big), TS_ERR_INVALID, big,
           "larger than 1 MiB");
    free(text);
}

static void test_ports(void) {
    ts_config c;
    const char *w1 = "model: {preset: w1}\nobserve: {metrics_port: 65535}\n";
    CHECK_OK(load(&c, w1, NULL));
    CHECK_OK(ts_config_check_run(&c, 0, 1));
    expect("65535 x 2 ranks", ts_config_check_run(&c, 0, 2), TS_ERR_INVALID,
           "t.yaml:2:11: observe.metrics_port 65535", "port 65536");
    /* --procs (dist.procs) is known when the config is finished */
    expect("65535 --procs 2", load(&c, w1, "dist.procs=2", NULL), TS_ERR_INVALID,
           "t.yaml:2:11: observe.metrics_port 65535", "use a port <= 65534");
    CHECK_OK(load(&c, w1, "observe.metrics_port=65534", "dist.procs=2", NULL));
    CHECK_OK(load(&c, w1, "observe.metrics_port=65532", NULL));
    CHECK_OK(ts_config_check_run(&c, 0, 4));
    expect("65533 x 4 ranks", load(&c, w1, "observe.metrics_port=65533", "dist.procs=4", NULL),
           TS_ERR_INVALID, "--set: observe.metrics_port 65533", "rank 3");
    /* a rank's config holds base + rank (the launcher adds it) */
    CHECK_OK(load(&c, w1, "observe.metrics_port=65534", NULL));
    CHECK_OK(ts_config_check_run(&c, 2, 4)); /* base 65532 */
    expect("rank 1 of 4 at 65534", ts_config_check_run(&c, 1, 4), TS_ERR_INVALID, "65536", NULL);
    CHECK(ts_config_check_run(&c, 4, 4) == TS_ERR_INVALID, "rank 4 of 4");
    CHECK_OK(load(&c, "model: {preset: w1}\n", "dist.procs=1024", NULL)); /* no endpoint */
}

static void test_verify_key(void) {
    ts_config c;
    const char *path = NULL;
    CHECK_OK(load(&c, "model: {preset: w1}\n", NULL));
    CHECK(ts_config_verify_key(&c, &path) == TS_CFG_VERIFY_NONE && !path, "nothing set");
    CHECK(ts_config_sign_key(&c) == NULL, "unsigned");
    CHECK_OK(load(&c, "model: {preset: w1}\nckpt: {sign_key: run.key}\n", NULL));
    CHECK(ts_config_verify_key(&c, &path) == TS_CFG_VERIFY_OWN && path && !strcmp(path, "run.key"),
          "sign_key alone: the run's own key");
    CHECK(ts_config_sign_key(&c) && !strcmp(ts_config_sign_key(&c), "run.key"), "sign_key");
    CHECK_OK(
        load(&c, "model: {preset: w1}\nckpt: {sign_key: run.key}\n", "ckpt.verify_key=none", NULL));
    CHECK(ts_config_verify_key(&c, &path) == TS_CFG_VERIFY_NONE && !path, "verify_key=none");
    CHECK_OK(load(&c, "model: {preset: w1}\nckpt: {verify_key: run.pub}\n", NULL));
    CHECK(ts_config_verify_key(&c, &path) == TS_CFG_VERIFY_FILE && path && !strcmp(path, "run.pub"),
          "verify_key file");
    /* none round-trips through the resolved config */
    CHECK_OK(load(&c, "model: {preset: w1}\nckpt: {sign_key: run.key, verify_key: none}\n", NULL));
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    CHECK_OK(ts_config_write(&c, f));
    fclose(f);
    CHECK(strstr(text, "verify_key: \"none\""), "written: %s", text);
    ts_config c2;
    CHECK_OK(load(&c2, text, NULL));
    CHECK(ts_config_verify_key(&c2, &path) == TS_CFG_VERIFY_NONE, "reloaded none");
    free(text);
    /* sign_key none: unsigned, and not written */
    CHECK_OK(load(&c, "model: {preset: w1}\n", "ckpt.sign_key=none", NULL));
    CHECK(ts_config_sign_key(&c) == NULL && c.ckpt.sign_key[0] == 0, "sign_key none");
    CHECK(ts_config_verify_key(&c, &path) == TS_CFG_VERIFY_NONE, "sign_key none: no verify");
    CHECK_OK(ts_config_check_run(&c, 0, 1));
}

static void test_key_files(void) {
    ts_config c;
    char set[256];
    const char *key = path_of("run.key"), *pub = path_of("run.pub");
    write_file(key, "tessel private key\n00\n", 22, 0600);
    write_file(pub, "tessel public key\n00\n", 21, 0644);
    snprintf(set, sizeof set, "ckpt.sign_key=%s", key);
    CHECK_OK(load(&c, "model: {preset: w1}\n", set, NULL));
    CHECK_OK(ts_config_check_run(&c, 0, 1));
    CHECK(chmod(key, 0400) == 0, "chmod");
    CHECK_OK(ts_config_check_run(&c, 0, 1));
    CHECK(chmod(key, 0640) == 0, "chmod");
    expect("mode 0640", ts_config_check_run(&c, 0, 1), TS_ERR_INVALID, "readable by others",
           "mode 640");
    CHECK(strstr(ts_last_error(), "--set: ckpt.sign_key"), "origin: %s", ts_last_error());
    CHECK(chmod(key, 0604) == 0, "chmod");
    expect("mode 0604", ts_config_check_run(&c, 0, 1), TS_ERR_INVALID, "readable by others", NULL);
    CHECK(chmod(key, 0600) == 0, "chmod");
    /* a link to a good key is refused: the key file itself must be named */
    const char *link = path_of("link.key");
    CHECK(symlink(key, link) == 0, "symlink");
    snprintf(set, sizeof set, "ckpt.sign_key=%s", link);
    CHECK_OK(load(&c, "model: {preset: w1}\n", set, NULL));
    expect("symlink", ts_config_check_run(&c, 0, 1), TS_ERR_INVALID, "is a symbolic link", link);
    snprintf(set, sizeof set, "ckpt.sign_key=%s", path_of("missing.key"));
    CHECK_OK(load(&c, "model: {preset: w1}\n", set, NULL));
    expect("missing", ts_config_check_run(&c, 0, 1), TS_ERR_INVALID, "cannot read", "missing.key");
    snprintf(set, sizeof set, "ckpt.sign_key=%s", dir);
    CHECK_OK(load(&c, "model: {preset: w1}\n", set, NULL));
    expect("directory", ts_config_check_run(&c, 0, 1), TS_ERR_INVALID, "not a regular file", NULL);
    /* another user's key (needs root to make one) */
    if (geteuid() == 0) {
        CHECK(chown(key, 12345, 12345) == 0, "chown");
        snprintf(set, sizeof set, "ckpt.sign_key=%s", key);
        CHECK_OK(load(&c, "model: {preset: w1}\n", set, NULL));
        expect("owner", ts_config_check_run(&c, 0, 1), TS_ERR_INVALID, "belongs to uid 12345",
               NULL);
        CHECK(chown(key, 0, 0) == 0, "chown back");
    }
    /* verify_key: a readable file, unless none */
    char set2[256];
    snprintf(set, sizeof set, "ckpt.sign_key=%s", key);
    snprintf(set2, sizeof set2, "ckpt.verify_key=%s", pub);
    CHECK_OK(load(&c, "model: {preset: w1}\n", set, set2, NULL));
    CHECK_OK(ts_config_check_run(&c, 0, 1));
    snprintf(set2, sizeof set2, "ckpt.verify_key=%s", path_of("missing.pub"));
    CHECK_OK(load(&c, "model: {preset: w1}\n", set, set2, NULL));
    expect("missing pub", ts_config_check_run(&c, 0, 1), TS_ERR_INVALID, "ckpt.verify_key",
           "missing.pub");
    CHECK_OK(load(&c, "model: {preset: w1}\n", set, "ckpt.verify_key=none", NULL));
    CHECK_OK(ts_config_check_run(&c, 0, 1));
    unlink(link);
    unlink(key);
    unlink(pub);
}

static void test_dist_keys(void) {
    ts_config c;
    CHECK_OK(load(&c, "model: {preset: w1}\n", NULL));
    CHECK(ts_config_dist_key(&c) == -1, "no dist keys");
    CHECK_OK(ts_config_check_single_process(&c, "tessel compile"));
    /* set to its default: nothing to ignore */
    CHECK_OK(load(&c, "model: {preset: w1}\ndist: {procs: 1, algo: auto}\n", NULL));
    CHECK(ts_config_dist_key(&c) == -1, "dist keys at their defaults");
    const char *keys[] = {"dist.procs=2",       "dist.bucket_mb=4",    "dist.algo=ring",
                          "dist.zero=1",        "dist.share_params=0", "dist.timeout_s=5",
                          "dist.max_restarts=1"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        CHECK_OK(load(&c, "model: {preset: w1}\n", keys[i], NULL));
        const int k = ts_config_dist_key(&c);
        const ts_config_key *key = ts_config_key_at(k);
        CHECK(key && !strncmp(key->path, keys[i], strlen(key->path)), "%s: key %d", keys[i], k);
        expect(keys[i], ts_config_check_single_process(&c, "tessel compile"), TS_ERR_INVALID,
               "tessel compile builds the step of one process", key ? key->path : "?");
    }
    CHECK_OK(load(&c, "model: {preset: w1}\ndist:\n  zero: 2\n", NULL));
    expect("file origin", ts_config_check_single_process(&c, "tessel compile"), TS_ERR_INVALID,
           "t.yaml:3:3: dist.zero is set", NULL);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tessel-config-limits-XXXXXX");
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return check_summary("unit/config_limits");
    }
    test_nesting();
    test_size();
    test_ports();
    test_verify_key();
    test_key_files();
    test_dist_keys();
    unlink(path_of("deep.yaml"));
    unlink(path_of("big.yaml"));
    rmdir(dir);
    return check_summary("unit/config_limits");
}
