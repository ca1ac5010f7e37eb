/* The CUDA backend's entry in the registry and its plugin (docs/cuda.md),
 * on any machine: the "cuda" backend is registered as a device backend;
 * with TESSEL_CUDA_BUILT=1 (CMake built libtessel_cuda.so) the plugin loads
 * beside this binary and answers for its ops (the compile-only check that
 * the CUDA sources built, linked with nothing left unresolved, and speak the
 * library's plugin ABI); with 0 the compile fails saying the plugin is not
 * there. Compiling a plan for it then either runs (a GPU: the loss matches
 * the CPU's) or fails cleanly with "backend cuda: no GPU/driver" and no plan. */
#include <stdlib.h>
#include <string.h>
#include "backends/backend.h"
#include "check.h"

static ts_graph *mlp(ts_train_spec *spec) {
    ts_mlp_config mc = {16, 8, 8, 0, 64, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    *spec = ts_train_spec_default(m.loss);
    return g;
}

static void fill(ts_plan *p, const char *name, float scale) {
    ts_dtype dt;
    int rank;
    int64_t dims[8];
    CHECK_OK(ts_plan_value_info(p, name, &dt, &rank, dims));
    int64_t n = 1;
    for (int d = 0; d < rank; d++) n *= dims[d];
    float *x = malloc(sizeof(float) * (size_t)n);
    CHECK(x != NULL, "malloc");
    if (!x) return;
    for (int64_t i = 0; i < n; i++) x[i] = scale * (float)((i * 37 % 19) - 9) / 9.0f;
    CHECK_OK(ts_plan_set_input(p, name, x, sizeof(float) * (size_t)n));
    free(x);
}

static double one_step(ts_plan *p) {
    fill(p, "x", 1.0f);
    fill(p, "y", 0.5f);
    CHECK_OK(ts_plan_step(p));
    return ts_plan_loss(p);
}

int main(void) {
    const char *built = getenv("TESSEL_CUDA_BUILT");
    const ts_backend *cu = ts_backend_find("cuda");
    CHECK(cu && strcmp(cu->name, "cuda") == 0, "no backend named cuda");
    if (!cu) return check_summary("cuda backend");
    CHECK(cu->memory == TS_MEM_DEVICE && cu->to_host && cu->to_device,
          "cuda is not a device backend with host/device hooks");
    CHECK(ts_backend_find("cpu")->to_host == NULL, "the CPU backend has a to_host hook");

    if (built && !strcmp(built, "1")) {
        /* the plugin: loaded here, without any GPU or driver */
        CHECK(cu->supports_op(TS_OP_MATMUL) && cu->supports_op(TS_OP_ATTENTION_BWD) &&
                  cu->supports_op(TS_OP_ADAM_UPDATE),
              "the plugin did not load or lacks its core ops: %s", ts_last_error());
        CHECK(!cu->supports_op(TS_OP_CONV_TRANSPOSE) && !cu->supports_op(-1),
              "the plugin claims an op it has no kernel for");
    }

    ts_train_spec spec;
    ts_graph *g = mlp(&spec);
    ts_compile_options o = ts_compile_options_default();
    o.backend = "cuda";
    ts_plan *p = NULL;
    ts_status s = ts_compile(g, &spec, &o, &p);
    if (s == TS_OK) {
        /* a GPU: one step agrees with the CPU's */
        ts_plan *c = NULL;
        CHECK_OK(ts_compile(g, &spec, NULL, &c));
        double lg = one_step(p), lc = c ? one_step(c) : 0;
        CHECK(fabs(lg - lc) <= 1e-4 * fabs(lc) + 1e-6, "loss on the GPU %.9g, CPU %.9g", lg, lc);
        printf("a GPU is here: loss %.9g (CPU %.9g)\n", lg, lc);
        ts_plan_free(c);
        ts_plan_free(p);
    } else {
        CHECK(s == TS_ERR_UNSUPPORTED && p == NULL, "status %s, plan %p", ts_status_name(s),
              (void *)p);
        const char *e = ts_last_error();
        if (built && !strcmp(built, "1"))
            CHECK(strstr(e, "backend cuda: no GPU/driver") != NULL, "message: %s", e);
        else
            CHECK(strstr(e, "backend cuda: the plugin libtessel_cuda.so is not there") != NULL,
                  "message: %s", e);
        printf("as expected here: %s\n", e);
    }
    ts_graph_free(g);
    return check_summary("cuda backend");
}
