/* dnnl_matmul_pack.c — tessel's packer of a transposed bf16 B (dnnl_matmul_pack.h) writes the
 * bytes of oneDNN's reorder into the layout its bf16 brgemm matmul chooses.
 *
 * For B stored [N, K], on W3's weight shapes and on shapes with a K or N that is not a multiple of
 * the block (odd K too): a bf16 matmul primitive is created with B "any"; where it chose the
 * packer's layout (brgemm on AVX512-BF16: ts_mm_pack_layout_ok), the packed bytes (padding
 * included) must equal a oneDNN reorder's, and the generic element loop's too. The layout check
 * must refuse a plain layout. Skips (77) where oneDNN picks another layout for every shape (no
 * AVX512-BF16). */
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_matmul_pack.h"
#include "core/core.h"
#include "check.h"

static int g_checked;

#define DNNL_OK(call)                                                                              \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            CHECK(0, "%s = %d", #call, (int)st_);                                                  \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* Pack a K x N bf16 B stored [N, K] both ways and compare; M rows of A for the primitive that
 * chooses the layout. */
static void check_shape(dnnl_engine_t eng, dnnl_stream_t stream, int64_t M, int64_t K, int64_t N) {
    dnnl_memory_desc_t md_a, md_b, md_any, md_c;
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N};
    DNNL_OK(dnnl_memory_desc_init_by_tag(&md_a, 2, da, dnnl_bf16, dnnl_ab));
    DNNL_OK(dnnl_memory_desc_init_by_tag(&md_b, 2, db, dnnl_bf16, dnnl_ba));
    DNNL_OK(dnnl_memory_desc_init_by_tag(&md_any, 2, db, dnnl_bf16, dnnl_format_tag_any));
    DNNL_OK(dnnl_memory_desc_init_by_tag(&md_c, 2, dc, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t op;
    DNNL_OK(dnnl_matmul_desc_init(&op, &md_a, &md_any, NULL, &md_c));
    dnnl_primitive_desc_t pd;
    DNNL_OK(dnnl_primitive_desc_create(&pd, &op, NULL, eng, NULL));
    const dnnl_memory_desc_t md_w = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_primitive_desc_destroy(pd);
    int64_t Kp = 0, Np = 0;
    if (!ts_mm_pack_layout_ok(&md_w, K, N, &Kp, &Np)) {
        printf("  B %lld x %lld: oneDNN chose another layout, not checked\n", (long long)K,
               (long long)N);
        return;
    }
    const size_t bytes = dnnl_memory_desc_get_size(&md_w);
    CHECK(bytes == (size_t)(Kp * Np) * 2, "packed size %zu, expected %lld", bytes,
          (long long)(Kp * Np * 2));
    uint16_t *b = malloc((size_t)(K * N) * 2);
    uint16_t *want = ts_aligned_alloc(bytes, "reorder output");
    uint16_t *got = ts_aligned_alloc(bytes, "packer output");
    uint16_t *slow = ts_aligned_alloc(bytes + 64, "generic output");
    if (!b || !want || !got || !slow) {
        CHECK(0, "out of memory");
        return;
    }
    for (int64_t i = 0; i < K * N; i++) { /* distinct, non-zero values: every move shows */
        uint32_t w[4];
        ts_philox(0x9ac4, (uint64_t)(K * 131 + N), (uint64_t)i, w);
        b[i] = (uint16_t)(0x3c00 + (w[0] & 0x3ff) + (w[1] & 1) * 0x8000);
    }
    memset(want, 0xa5, bytes);
    memset(got, 0x5a, bytes);
    memset(slow, 0x33, bytes + 64);
    dnnl_memory_t mem_b, mem_w;
    dnnl_primitive_desc_t rpd;
    dnnl_primitive_t reorder;
    DNNL_OK(dnnl_memory_create(&mem_b, &md_b, eng, b));
    DNNL_OK(dnnl_memory_create(&mem_w, &md_w, eng, want));
    DNNL_OK(dnnl_reorder_primitive_desc_create(&rpd, &md_b, eng, &md_w, eng, NULL));
    DNNL_OK(dnnl_primitive_create(&reorder, rpd));
    dnnl_primitive_desc_destroy(rpd);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mem_b}, {DNNL_ARG_TO, mem_w}};
    DNNL_OK(dnnl_primitive_execute(reorder, stream, 2, args));
    DNNL_OK(dnnl_stream_wait(stream));
    ts_mm_pack_bt(got, b, K, N, Kp, Np);
    ts_mm_pack_bt(slow + 1, b, K, N, Kp, Np); /* misaligned: the element loop */
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < bytes / 2; i++)
        if (got[i] != want[i] && bad++ == 0) first = (int64_t)i;
    CHECK(bad == 0,
          "B %lld x %lld: %lld of %zu packed values differ from the reorder's (first "
          "at %lld: %04x, reorder %04x)",
          (long long)K, (long long)N, (long long)bad, bytes / 2, (long long)first,
          first >= 0 ? got[first] : 0, first >= 0 ? want[first] : 0);
    CHECK(memcmp(slow + 1, want, bytes) == 0, "B %lld x %lld: the element loop differs",
          (long long)K, (long long)N);
    g_checked++;
    printf("  B %lld x %lld (padded %lld x %lld): %s\n", (long long)K, (long long)N, (long long)Kp,
           (long long)Np, bad ? "DIFFERS" : "same bytes");
    dnnl_primitive_destroy(reorder);
    dnnl_memory_destroy(mem_b);
    dnnl_memory_destroy(mem_w);
    free(b);
    ts_aligned_free(want);
    ts_aligned_free(got);
    ts_aligned_free(slow);
}

int main(void) {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&stream, eng, dnnl_stream_default_flags) != dnnl_success) {
        CHECK(0, "no oneDNN CPU engine");
        return check_summary("dnnl_matmul_pack");
    }
    /* a plain layout is not the packed one */
    dnnl_memory_desc_t plain;
    dnnl_dims_t d = {64, 64};
    int64_t kp, np;
    dnnl_memory_desc_init_by_tag(&plain, 2, d, dnnl_bf16, dnnl_ab);
    CHECK(!ts_mm_pack_layout_ok(&plain, 64, 64, &kp, &np), "a plain [K, N] layout was accepted");
    /* K x N: W3's weights (qkv, projection, fc, fc2, the tied head) and ragged shapes */
    static const int64_t shapes[][2] = {{512, 1536}, {512, 512},  {512, 2048}, {2048, 512},
                                        {512, 8192}, {8192, 512}, {1536, 512}, {100, 70},
                                        {33, 130},   {64, 64},    {7, 200},    {250, 17}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(eng, stream, 256, shapes[i][0], shapes[i][1]);
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    if (!check_failed && !g_checked) {
        printf("SKIP: oneDNN chose another layout for every shape (no AVX512-BF16?)\n");
        return 77;
    }
    printf("%d shapes compared\n", g_checked);
    return check_summary("dnnl_matmul_pack");
}
