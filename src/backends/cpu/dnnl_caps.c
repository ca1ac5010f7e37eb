/* dnnl_caps.c — probe once whether oneDNN can run bf16 / f16 matmuls here
 * (see dnnl_caps.h). */
#include "backends/cpu/dnnl_caps.h"
#include "backends/cpu/dnnl_conv_winograd.h"
#include "tessel/util.h"

#include <dnnl.h>
#include <pthread.h>
#include <stdio.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_bf16, g_f16;
static char g_why_bf16[200], g_why_f16[200];

/* Create (and drop) a 4x4x4 a_dt x a_dt -> f32 matmul: the same check oneDNN
 * makes for tessel's real ones, without running anything. */
static int probe(dnnl_engine_t eng, dnnl_data_type_t dt) {
    dnnl_dims_t da = {4, 4};
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t op;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_memory_desc_init_by_tag(&a, 2, da, dt, dnnl_ab) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&b, 2, da, dt, dnnl_ab) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c, 2, da, dnnl_f32, dnnl_ab) != dnnl_success ||
        dnnl_matmul_desc_init(&op, &a, &b, NULL, &c) != dnnl_success)
        return 0;
    int ok = dnnl_primitive_desc_create(&pd, &op, NULL, eng, NULL) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    return ok;
}

const char *ts_cpu_isa_name(void) {
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    switch (isa) {
    case dnnl_cpu_isa_avx512_core_amx: return "AVX-512 (avx512_core_amx)";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX-512 (avx512_core_bf16)";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX-512 (avx512_core_vnni)";
    case dnnl_cpu_isa_avx512_core: return "AVX-512 (avx512_core)";
    case dnnl_cpu_isa_avx512_mic:
    case dnnl_cpu_isa_avx512_mic_4ops: return "AVX-512 (avx512_mic)";
    case dnnl_cpu_isa_avx2_vnni: return "AVX2 (avx2_vnni) only";
    case dnnl_cpu_isa_avx2: return "AVX2 only";
    case dnnl_cpu_isa_avx: return "AVX only";
    case dnnl_cpu_isa_sse41: return "SSE4.1 only";
    default: return "no vector extension oneDNN uses";
    }
}

static void probe_all(void) {
    dnnl_engine_t eng = NULL;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) {
        snprintf(g_why_bf16, sizeof g_why_bf16, "oneDNN could not create a CPU engine");
        snprintf(g_why_f16, sizeof g_why_f16, "oneDNN could not create a CPU engine");
        return;
    }
    g_bf16 = probe(eng, dnnl_bf16);
    g_f16 = probe(eng, dnnl_f16);
    dnnl_engine_destroy(eng);
    const char *isa = ts_cpu_isa_name();
    if (!g_bf16)
        snprintf(g_why_bf16, sizeof g_why_bf16,
                 "needs AVX-512 (avx512_core / avx512_bf16) for bf16 matmuls; this CPU has %s",
                 isa);
    if (!g_f16)
        snprintf(g_why_f16, sizeof g_why_f16,
                 "needs AVX-512 (avx512_core_fp16) for f16 matmuls; this CPU has %s", isa);
}

int ts_cpu_supports_dtype_gemm(ts_dtype dt) {
    if (dt == TS_F32) return 1;
    if (dt != TS_BF16 && dt != TS_F16) return 0;
    pthread_once(&g_once, probe_all);
    return dt == TS_BF16 ? g_bf16 : g_f16;
}

const char *ts_cpu_dtype_gemm_why(ts_dtype dt) {
    if (dt == TS_F32) return "";
    if (dt != TS_BF16 && dt != TS_F16) return "only f32, bf16 and f16 GEMMs exist";
    pthread_once(&g_once, probe_all);
    return dt == TS_BF16 ? g_why_bf16 : g_why_f16;
}

void ts_cpu_kernel_path(char *buf, size_t n) {
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, n, "onednn %d.%d.%d (%s), isa 0x%x, conv winograd %s", v->major, v->minor,
             v->patch, v->hash, (unsigned)dnnl_get_effective_cpu_isa(),
             ts_wino_enabled() ? "on" : "off");
}
