/* The CUDA backend from the command line (docs/cuda.md): `tessel train`,
 * `tessel compile` and `tessel bench --backend cuda` either run on a GPU or
 * stop with exit 2 and one clear line saying why ("backend cuda: no
 * GPU/driver", or that the plugin was not built), never a crash; a bad
 * --backend is a usage error. On a GPU the run's loss must fall. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"

static int built;

/* r failed for want of a GPU (or of the plugin, in a build without CUDA). */
static int no_gpu(const e2e_result *r, const char *what) {
    const char *why = built ? "backend cuda: no GPU/driver"
                            : "backend cuda: the plugin libtessel_cuda.so is not there";
    CHECK(r->rc == 2 && strstr(r->err, why) && !strstr(r->err, "Segmentation"),
          "%s: exit %d, stderr '%s' (expected exit 2 and '%s')", what, r->rc, r->err, why);
    return 1;
}

int main(void) {
    char dir[64];
    const char *b = getenv("TESSEL_CUDA_BUILT");
    built = b && !strcmp(b, "1");
    if (!e2e_setup("cuda_cli", dir, sizeof dir)) return check_summary("e2e/cuda_cli");

    e2e_result r = e2e_runf("train examples/w1.yaml --set compile.backend=cuda --steps 3 --out %s",
                            e2e_path("run"));
    if (r.rc == 0) {
        printf("a GPU is here: %s\n", r.out);
        CHECK(strstr(r.out, "loss") != NULL, "train on the GPU printed no loss: %s", r.out);
    } else {
        no_gpu(&r, "train");
    }
    e2e_done(&r);

    r = e2e_run("compile examples/w3.yaml --set compile.backend=cuda");
    if (r.rc != 0) no_gpu(&r, "compile");
    e2e_done(&r);

    r = e2e_run("bench --workload W1 --backend cuda --steps 3 --warmup 1");
    if (r.rc == 0)
        CHECK(strstr(r.out, "CUDA graph") && strstr(r.out, "kernels per step"), "bench output: %s",
              r.out);
    else
        no_gpu(&r, "bench");
    e2e_done(&r);

    r = e2e_run("bench --workload W1 --backend tpu");
    CHECK(r.rc == 2 && strstr(r.err, "--backend: cpu or cuda"), "bad backend: %d %s", r.rc, r.err);
    e2e_done(&r);

    /* the keys are part of every config: on the CPU no_cuda_graph changes nothing */
    r = e2e_runf("train examples/w1.yaml --set compile.backend=cpu --set "
                 "compile.no_cuda_graph=true --steps 2 --out %s",
                 e2e_path("cpu"));
    CHECK(r.rc == 0, "train on the CPU with compile.no_cuda_graph: %d %s", r.rc, r.err);
    e2e_done(&r);

    r = e2e_run("train examples/w1.yaml --set compile.backend=metal --steps 1");
    CHECK(r.rc == 2 && strstr(r.err, "compile.backend"), "bad compile.backend: %d %s", r.rc, r.err);
    e2e_done(&r);

    e2e_cleanup(dir);
    return check_summary("e2e/cuda_cli");
}
