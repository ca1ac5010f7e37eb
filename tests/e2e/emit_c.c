/* `tessel compile CONFIG --emit-c DIR` on W1 (the MLP benchmark), end to end
 * ($TESSEL_BIN, run from the repository root; docs/aot.md):
 *
 * - the emitted program builds with cc (-std=c17 -Wall -Wextra -Werror, the
 *   Makefile's flags), runs 20 steps and writes the very weights `tessel
 *   train` writes for the same config, byte for byte;
 * - its kernels/ are the library's source files byte for byte (every file of
 *   src/ops among them), and MANIFEST.sha256 checks with sha256sum -c, the
 *   config's hash in manifest.json;
 * - built under AddressSanitizer and UndefinedBehaviorSanitizer it runs
 *   clean, and its weights after 3 steps equal the optimised build's, as do
 *   those of a build running fused chains on the library's interpreter;
 * - usage errors: --emit-c with --dump, a DIR that is a file, a config with
 *   loss scaling (whose skipped updates the program would not reproduce),
 *   and the emitted ./train given a data file that is not one. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"
#include "emit_c.h"

int main(void) {
    char dir[64];
    if (!e2e_setup("emit_c", dir, sizeof dir)) return check_summary("e2e/emit_c");
    const int ok = emit_c_check("w1", "examples/w1.yaml", "", 20);
    const char *d = e2e_path("w1");
    if (ok) {
        /* kernels/ is the library's source: every file equal to the repository's */
        e2e_sh("cd %s/kernels && n=0 && for f in $(find . -name '*.[ch]' -o -name '*.def'); do "
               "cmp -s \"$f\" \"$OLDPWD/$f\" || { echo \"differs: $f\"; exit 1; }; n=$((n+1)); "
               "done && test $n -gt 80",
               d);
        e2e_sh("for f in src/ops/*.c src/ops/*.h src/core/kernel.h; do test -f %s/kernels/$f || "
               "{ echo \"missing: $f\"; exit 1; }; done",
               d);
        e2e_sh("cd %s && sha256sum --quiet --strict -c MANIFEST.sha256", d);
        e2e_sh("grep -q '^  steps: 20$' %s/config.yaml && grep -q 'config.yaml' %s/MANIFEST.sha256",
               d, d);
        e2e_sh("c=$(sha256sum examples/w1.yaml | cut -d' ' -f1) && grep -q \"$c\" %s/manifest.json",
               d);
        e2e_sh("grep -q 'step.c' %s/MANIFEST.sha256 && grep -q 'kernels/src/ops/unary.c' "
               "%s/MANIFEST.sha256 && grep -q 'data.bin' %s/MANIFEST.sha256",
               d, d, d);
        /* step.c names every tensor with its shape and calls one function per instruction */
        char path[600];
        snprintf(path, sizeof path, "%s/step.c", d);
        char *step = e2e_slurp(path, NULL);
        const char *w = strstr(step, "in1   net.0.weight "), *nl = w ? strchr(w, '\n') : NULL;
        const char *sh = w ? strstr(w, "f32[1024,2048]") : NULL;
        CHECK(w && nl && sh && sh < nl, "step.c names the weights with their shapes");
        CHECK(strstr(step, "static ts_status i22_adam_update(void)") != NULL,
              "one function per instruction, the optimizer's last");
        CHECK(strstr(step, "ts_status train_step(int64_t step, double lr)") != NULL, "train_step");
        free(step);

        /* ASan + UBSan: a copy of the program built with the sanitizers */
        const char *a = e2e_path("w1asan");
        e2e_sh("cp -r %s %s && make -s -C %s clean && make -s -C %s -j2 CC='%s' CFLAGS='-O1 -g "
               "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all' "
               "LDFLAGS='-fsanitize=address,undefined' >%s.make 2>&1 || { cat %s.make; exit 1; }",
               d, a, a, a, emit_c_cc(), a, a);
        e2e_sh("cd %s && ASAN_OPTIONS=detect_leaks=1 ./train --steps 3 --out w3.safetensors "
               ">%s.log 2>&1 || { cat %s.log; exit 1; }",
               a, a, a);
        e2e_sh("cd %s && ./train --steps 3 --out w3.safetensors >/dev/null", d);
        char x[600], y[600];
        snprintf(x, sizeof x, "%s/w3.safetensors", a);
        snprintf(y, sizeof y, "%s/w3.safetensors", d);
        CHECK(emit_c_same_weights(x, y), "the sanitized build computes the same weights");

        /* the same program on the library's tile interpreter for fused chains */
        const char *it = e2e_path("w1interp");
        e2e_sh("cp -r %s %s && rm -f %s/step.o %s/train && make -s -C %s CC='%s' "
               "STEP_CFLAGS=-DSTEP_FUSED_INTERPRETER >%s.make 2>&1 && cd %s && "
               "./train --steps 3 --out w3.safetensors >/dev/null",
               d, it, it, it, it, emit_c_cc(), it, it);
        snprintf(x, sizeof x, "%s/w3.safetensors", it);
        CHECK(emit_c_same_weights(x, y), "generated fused loops and the interpreter agree");

        /* the emitted program refuses a data file that is not one */
        e2e_sh("cd %s && ./train --data main.c >%s.bad 2>&1; test $? -eq 2 && grep -q 'not a data "
               "file' %s.bad",
               d, d, d);
    }
    e2e_result r = e2e_runf("compile examples/w1.yaml --emit-c %s --dump plan", e2e_path("x"));
    CHECK(r.rc == 2 && strstr(r.err, "--emit-c takes no --dump"), "--emit-c with --dump: %d %s",
          r.rc, r.err);
    e2e_done(&r);
    e2e_sh("touch %s", e2e_path("file"));
    r = e2e_runf("compile examples/w1.yaml --emit-c %s/sub", e2e_path("file"));
    CHECK(r.rc != 0 && strstr(r.err, "emit-c"), "--emit-c into a file: %d %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("compile examples/w1.yaml --set precision.default=fp16 --set "
                 "precision.loss_scale=auto --emit-c %s",
                 e2e_path("fp16"));
    CHECK(r.rc == 2 && strstr(r.err, "loss scaling"), "--emit-c refuses loss scaling: %d %s", r.rc,
          r.err);
    e2e_done(&r);
    e2e_cleanup(dir);
    return check_summary("e2e/emit_c");
}
