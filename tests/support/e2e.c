#include "e2e.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static const char *e2e_bin_path = "build/tessel";
static const char *e2e_tmp = "/tmp";

void e2e_init(const char *bin, const char *dir) {
    if (bin) e2e_bin_path = bin;
    if (dir) e2e_tmp = dir;
}

const char *e2e_setup(const char *tag, char *dir, size_t n) {
    const char *bin = getenv("TESSEL_BIN");
    if (!bin || !*bin) bin = "build/tessel"; /* run by hand from the repository root */
    const int ok = access(bin, X_OK) == 0;
    CHECK(ok, "tessel binary '%s' not found or not executable (set TESSEL_BIN)", bin);
    snprintf(dir, n, "/tmp/tessel-%s-XXXXXX", tag);
    const int made = ok && mkdtemp(dir) != NULL;
    CHECK(!ok || made, "temporary directory %s", dir);
    if (!made) return NULL;
    e2e_init(bin, dir);
    return bin;
}

void e2e_cleanup(const char *dir) {
    if (check_failed) { /* kept for a look at what the failing runs left */
        fprintf(stderr, "kept %s\n", dir);
        return;
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

const char *e2e_path(const char *name) {
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", e2e_tmp, name);
    return buf[k];
}

char *e2e_slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    long n = 0;
    char *s = NULL;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        s = calloc(1, (size_t)n + 1);
        if (s && n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0, n = 0;
    }
    if (f) fclose(f);
    if (!s) s = calloc(1, 1), n = 0;
    if (len) *len = n;
    return s;
}

e2e_result e2e_run(const char *args) {
    char cmd[8192], path[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s/out' 2>'%s/err'", e2e_bin_path, args, e2e_tmp, e2e_tmp);
    int st = system(cmd);
    e2e_result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, NULL, NULL};
    snprintf(path, sizeof path, "%s/out", e2e_tmp);
    r.out = e2e_slurp(path, NULL);
    snprintf(path, sizeof path, "%s/err", e2e_tmp);
    r.err = e2e_slurp(path, NULL);
    return r;
}

e2e_result e2e_runf(const char *fmt, ...) {
    char args[6144];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return e2e_run(args);
}

void e2e_done(e2e_result *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

void e2e_sh(const char *fmt, ...) {
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0) CHECK(0, "shell: %s", cmd);
}

int e2e_find_mpirun(char *out, size_t n) {
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path ? path : "/usr/bin:/bin");
    char *save = NULL;
    for (char *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, n, "%s/mpirun", d);
        if (access(out, X_OK) == 0) return 1;
    }
    out[0] = 0;
    return 0;
}
