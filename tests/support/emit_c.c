#include "emit_c.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ckpt/safetensors.h"
#include "e2e.h"

const char *emit_c_cc(void) {
    static const char *cc;
    if (!cc) cc = system("command -v ccache >/dev/null 2>&1") == 0 ? "ccache cc" : "cc";
    return cc;
}

int emit_c_same_weights(const char *a, const char *b) {
    ts_st_file *fa = NULL, *fb = NULL;
    int same = ts_st_open(a, &fa) == TS_OK && ts_st_open(b, &fb) == TS_OK;
    if (!same) fprintf(stderr, "emit_c: cannot open %s or %s: %s\n", a, b, ts_last_error());
    if (same && ts_st_count(fa) != ts_st_count(fb)) {
        fprintf(stderr, "emit_c: %d tensors in %s, %d in %s\n", ts_st_count(fa), a, ts_st_count(fb),
                b);
        same = 0;
    }
    for (int i = 0; same && i < ts_st_count(fa); i++) {
        ts_st_tensor x, y;
        if (ts_st_get(fa, i, &x) != TS_OK || ts_st_find(fb, x.name, &y) != TS_OK) {
            fprintf(stderr, "emit_c: tensor %d of %s is not in %s\n", i, a, b);
            same = 0;
        } else if (x.dtype != y.dtype || x.rank != y.rank ||
                   memcmp(x.dims, y.dims, sizeof x.dims) || x.bytes != y.bytes ||
                   memcmp(x.data, y.data, x.bytes)) {
            fprintf(stderr, "emit_c: tensor '%s' differs between %s and %s\n", x.name, a, b);
            same = 0;
        }
    }
    ts_st_close(fa);
    ts_st_close(fb);
    return same;
}

int emit_c_check(const char *tag, const char *config, const char *sets, int steps) {
    const int failed_before = check_failed;
    const char *d = e2e_path(tag);
    e2e_result r =
        e2e_runf("compile %s %s --set train.steps=%d --emit-c %s", config, sets, steps, d);
    CHECK(r.rc == 0, "%s: emit: exit %d\n%s", tag, r.rc, r.err);
    e2e_done(&r);
    if (check_failed > failed_before) return 0;
        /* the emitted sources, -Wall -Wextra -Werror -std=c17 (the Makefile's
         * flags), at the optimisation level of the tessel under test: its
         * kernels are the same sources, and the same bits need the same level
         * (a Debug or sanitizer build runs at -O0, where no multiply-add is
         * contracted into an FMA; measured: W3 differs against -O3) */
#ifdef __OPTIMIZE__
    const char *opt = "";
#else
    const char *opt = " CFLAGS='-O0 -g'";
#endif
    e2e_sh("make -s -C %s -j2 CC='%s'%s >%s.make 2>&1 || { cat %s.make; exit 1; }", d, emit_c_cc(),
           opt, d, d);
    e2e_sh("cd %s && ./train >%s.train 2>&1 || { cat %s.train; exit 1; }", d, d, d);
    char path[600];
    snprintf(path, sizeof path, "%s.train", d);
    char *log = e2e_slurp(path, NULL);
    char want[64];
    snprintf(want, sizeof want, "step %d loss ", steps);
    CHECK(strstr(log, want) != NULL, "%s: ./train ran %d steps:\n%s", tag, steps, log);
    free(log);
    /* the same config through tessel train, its checkpoint exported */
    r = e2e_runf("train %s %s --steps %d --set ckpt.every=%d --out %s.run", config, sets, steps,
                 steps, d);
    CHECK(r.rc == 0, "%s: tessel train: exit %d\n%s", tag, r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("export %s.run --safetensors %s.ref.safetensors", d, d);
    CHECK(r.rc == 0, "%s: tessel export: exit %d\n%s", tag, r.rc, r.err);
    e2e_done(&r);
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/weights.safetensors", d);
    snprintf(b, sizeof b, "%s.ref.safetensors", d);
    CHECK(emit_c_same_weights(a, b),
          "%s: the emitted program's weights after %d steps equal "
          "tessel train's byte for byte",
          tag, steps);
    return check_failed == failed_before;
}
