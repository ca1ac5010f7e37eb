/* The backend registry (src/backends/backend.h): ts_compile_options.backend
 * picks a backend by name, "cpu" and NULL being the default, and an unknown
 * name fails the compile with a message naming it and the known ones. */
#include <string.h>
#include "backends/backend.h"
#include "check.h"

int main(void) {
    CHECK(ts_backend_count() >= 1, "no backend registered");
    const ts_backend *cpu = ts_backend_find(NULL);
    CHECK(cpu && strcmp(cpu->name, "cpu") == 0, "NULL does not name the CPU backend");
    CHECK(ts_backend_find("cpu") == cpu, "'cpu' is not found");
    CHECK(ts_backend_at(0) != NULL && ts_backend_at(ts_backend_count()) == NULL, "registry bounds");
    CHECK(cpu->prepare && cpu->execute && cpu->profile && cpu->profile_reset && cpu->instr_info &&
              cpu->release && cpu->supports_op,
          "the CPU backend leaves an entry empty");
    CHECK(cpu->supports_op(0) && !cpu->supports_op(-1), "supports_op");
    CHECK(cpu->dtypes & (1u << TS_F32), "the CPU backend does not run f32");

    ts_mlp_config mc = {16, 8, 8, 0, 64, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    ts_compile_options o = ts_compile_options_default();
    ts_plan *p = NULL;
    o.backend = "cpu";
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    CHECK(p != NULL, "no plan with backend 'cpu'");
    ts_plan_free(p);
    p = NULL;
    o.backend = "warp-drive";
    ts_status s = ts_compile(g, &spec, &o, &p);
    CHECK(s == TS_ERR_INVALID && p == NULL, "unknown backend: status %d", (int)s);
    CHECK(strstr(ts_last_error(), "'warp-drive'") && strstr(ts_last_error(), "cpu"),
          "the message names neither the backend nor the known ones: %s", ts_last_error());
    ts_graph_free(g);
    return check_summary("backend registry");
}
