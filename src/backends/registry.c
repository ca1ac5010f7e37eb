/* The backend registry: one line per backend (see backend.h). */
#include <stdio.h>
#include <string.h>
#include "backends/backend.h"

extern const ts_backend ts_backend_cpu;  /* src/backends/cpu/backend.c */
extern const ts_backend ts_backend_cuda; /* src/backends/cuda_loader.c (plugin) */

static const ts_backend *const REGISTRY[] = {
    &ts_backend_cpu,
    &ts_backend_cuda,
};

enum { N_BACKENDS = (int)(sizeof REGISTRY / sizeof REGISTRY[0]) };

int ts_backend_count(void) {
    return N_BACKENDS;
}

const ts_backend *ts_backend_at(int i) {
    return i >= 0 && i < N_BACKENDS ? REGISTRY[i] : NULL;
}

const ts_backend *ts_backend_find(const char *name) {
    if (!name) name = "cpu";
    for (int i = 0; i < N_BACKENDS; i++)
        if (strcmp(REGISTRY[i]->name, name) == 0) return REGISTRY[i];
    return NULL;
}

ts_status ts_backend_lookup(const char *name, const ts_backend **out) {
    *out = ts_backend_find(name);
    if (*out) return TS_OK;
    char known[256];
    size_t k = 0;
    known[0] = 0;
    for (int i = 0; i < N_BACKENDS && k < sizeof known; i++)
        k +=
            (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "", REGISTRY[i]->name);
    return ts_fail(TS_ERR_INVALID, "compile: unknown backend '%s' (known: %s)", name, known);
}
