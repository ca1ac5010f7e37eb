/* export.c — a checkpoint's weights as FP8 codes plus per-tensor scales in
 * one safetensors file (see export.h for the layout). */
#include "quant/export.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/safetensors.h"
#include "core/core.h"
#include "core/fp8.h"

typedef struct ex_tensor {
    ts_ckpt_tensor info;
    int quantise;
    void *data; /* the tensor as stored (owned) */
    uint8_t *q; /* codes (owned) when quantised */
    float scale;
    char *scale_name;
} ex_tensor;

static void free_all(ex_tensor *t, int n) {
    for (int i = 0; t && i < n; i++) {
        free(t[i].data);
        free(t[i].q);
        free(t[i].scale_name);
    }
    free(t);
}

/* Read parameter i, and quantise it when it is a float tensor. */
static ts_status prepare(const ts_ckpt *c, ex_tensor *t, ts_dtype fmt) {
    size_t bytes = t->info.bytes;
    if (!(t->data = ts_alloc(bytes ? bytes : 1, "fp8 export"))) return TS_ERR_NOMEM;
    ts_status s = ts_ckpt_read(c, t->info.name, t->data, bytes);
    if (s != TS_OK) return s;
    t->quantise = t->info.dtype == TS_F32 || t->info.dtype == TS_F64;
    if (!t->quantise) return TS_OK;
    int64_t n = ts_shape_numel(t->info.rank, t->info.dims);
    float *x = t->data;
    if (t->info.dtype == TS_F64) {
        /* narrow to f32 in place (the first half of the buffer) */
        const double *d = t->data;
        for (int64_t i = 0; i < n; i++) x[i] = (float)d[i];
    }
    double amax;
    if ((s = ts_amax_max(x, n, &amax)) != TS_OK) return s;
    t->scale = (float)ts_fp8_scale_for(amax, fmt, 0);
    if (!(t->q = ts_alloc((size_t)(n ? n : 1), "fp8 export"))) return TS_ERR_NOMEM;
    /* as the f32 quantize kernel: x / s in f32, then the encoder */
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / t->scale;
    ts_fp8_encode_f32(t->q, x, n, fmt, 1);
    size_t ln = strlen(t->info.name) + 7;
    if (!(t->scale_name = ts_alloc(ln, "fp8 export"))) return TS_ERR_NOMEM;
    snprintf(t->scale_name, ln, "%s.scale", t->info.name);
    return TS_OK;
}

ts_status ts_quant_export_safetensors(const ts_ckpt *c, const char *path, ts_dtype fmt) {
    if (!c || !path) return ts_fail(TS_ERR_INVALID, "fp8 export: NULL argument");
    if (!ts_fp8_is_format(fmt))
        return ts_fail(TS_ERR_INVALID, "fp8 export: %s is not an FP8 format", ts_dtype_name(fmt));
    int nt = ts_ckpt_tensor_count(c), n = 0;
    ex_tensor *t = ts_zalloc(sizeof(ex_tensor) * (size_t)(nt + 1), "fp8 export");
    if (!t) return TS_ERR_NOMEM;
    ts_status s = TS_OK;
    for (int i = 0; i < nt && s == TS_OK; i++) {
        ts_ckpt_tensor info;
        if ((s = ts_ckpt_tensor_info(c, i, &info)) != TS_OK || info.is_state) continue;
        t[n].info = info;
        s = prepare(c, &t[n++], fmt);
    }
    /* "W.scale" must not be the name of another parameter */
    for (int i = 0; i < n && s == TS_OK; i++)
        for (int j = 0; j < n && t[i].quantise && s == TS_OK; j++)
            if (!strcmp(t[i].scale_name, t[j].info.name))
                s = ts_fail(TS_ERR_INVALID,
                            "fp8 export: parameter '%s' clashes with the scale of '%s'",
                            t[j].info.name, t[i].info.name);
    ts_st_writer *w = NULL;
    if (s == TS_OK) s = ts_st_writer_new(&w);
    /* larger elements first keeps every tensor aligned: scales (4 bytes)
     * with the unquantised tensors by size, then the codes */
    for (size_t esz = 8; esz >= 1 && s == TS_OK; esz /= 2)
        for (int i = 0; i < n && s == TS_OK; i++) {
            ex_tensor *e = &t[i];
            if (esz == 4 && e->quantise)
                s = ts_st_writer_add(w, e->scale_name, TS_F32, 0, NULL, &e->scale);
            if (s == TS_OK && !e->quantise && ts_dtype_size(e->info.dtype) == esz)
                s = ts_st_writer_add(w, e->info.name, e->info.dtype, e->info.rank, e->info.dims,
                                     e->data);
            if (s == TS_OK && esz == 1 && e->quantise)
                s = ts_st_writer_add(w, e->info.name, fmt, e->info.rank, e->info.dims, e->q);
        }
    ts_ckpt_info in;
    char step[24];
    if (s == TS_OK) s = ts_ckpt_get_info(c, &in);
    if (s == TS_OK) {
        snprintf(step, sizeof step, "%lld", (long long)in.step);
        s = ts_st_writer_meta(w, "format", "pt");
    }
    if (s == TS_OK) s = ts_st_writer_meta(w, "tessel_step", step);
    if (s == TS_OK) s = ts_st_writer_meta(w, "tessel_checkpoint_id", in.id);
    if (s == TS_OK) s = ts_st_writer_meta(w, "tessel_fp8", fmt == TS_F8E4M3 ? "e4m3" : "e5m2");
    if (s == TS_OK) s = ts_st_writer_meta(w, "tessel_fp8_scale", "dequant: w = f8 * scale");
    if (s == TS_OK) s = ts_st_writer_save(w, path);
    ts_st_writer_free(w);
    free_all(t, n);
    return s;
}
