/* Reading an ONNX file: the ModelProto (protobuf-c bindings generated at
 * build time from Debian's onnx.proto), its opset, and tensor payloads,
 * inline or in an external data file confined to the model's directory. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "core/half.h"
#include "core/sha256.h"
#include "frontend/onnx/onnx_internal.h"

enum { OPSET_MIN = 13, OPSET_MAX = 18 };
/* A model file over this size is refused before it is read whole. */
#define MAX_MODEL_BYTES ((long)1 << 31)

static ts_status read_all(const char *path, uint8_t **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return ts_fail(TS_ERR_IO, "onnx: cannot open %s: %s", path, strerror(errno));
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || size > MAX_MODEL_BYTES || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return ts_fail(TS_ERR_IO, "onnx: %s: cannot size the file (or it is over 2 GiB)", path);
    }
    uint8_t *buf = malloc(size ? (size_t)size : 1);
    if (!buf) {
        fclose(f);
        return ts_fail(TS_ERR_NOMEM, "onnx: %s: out of memory for %ld bytes", path, size);
    }
    const size_t got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(buf);
        return ts_fail(TS_ERR_IO, "onnx: %s: read %zu of %ld bytes", path, got, size);
    }
    *data = buf, *len = got;
    return TS_OK;
}

ts_status onnx_load(const char *path, Onnx__ModelProto **out, int64_t *opset, char *dir,
                    size_t dir_size, char sha[65], const char *expect) {
    *out = NULL;
    char real[PATH_MAX];
    if (!realpath(path, real))
        return ts_fail(TS_ERR_IO, "onnx: cannot open %s: %s", path, strerror(errno));
    char *slash = strrchr(real, '/');
    snprintf(dir, dir_size, "%.*s", slash && slash != real ? (int)(slash - real) : 1, real);
    uint8_t *data = NULL;
    size_t len = 0;
    ts_status s = read_all(path, &data, &len);
    if (s != TS_OK) return s;
    /* Hashed from the bytes decoded below, so the lineage names exactly
     * the model that was imported. */
    ts_sha256 h;
    if ((s = ts_sha256_begin(&h, "onnx model")) != TS_OK) {
        free(data);
        return s;
    }
    ts_sha256_update(&h, data, len);
    ts_sha256_end(&h, sha);
    if (expect && strcmp(expect, sha)) {
        free(data);
        return ts_fail(TS_ERR_IO,
                       "onnx: %s changed: its SHA-256 is %s, the config was checked against "
                       "%s (model.onnx_sha256)",
                       path, sha, expect);
    }
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, data);
    free(data);
    if (!m || !m->graph)
        return (m ? onnx__model_proto__free_unpacked(m, NULL) : (void)0),
               ts_fail(TS_ERR_FORMAT,
                       "onnx: %s is not an ONNX model (no ModelProto with a graph could be "
                       "decoded: truncated or another format)",
                       path);
    int64_t v = -1;
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = m->opset_import[i];
        if (!o->domain || !o->domain[0] || !strcmp(o->domain, "ai.onnx")) v = o->version;
    }
    if (v < OPSET_MIN || v > OPSET_MAX) {
        onnx__model_proto__free_unpacked(m, NULL);
        if (v < 0)
            return ts_fail(TS_ERR_UNSUPPORTED,
                           "onnx: %s imports no opset of the default domain (tessel reads "
                           "opsets %d to %d)",
                           path, OPSET_MIN, OPSET_MAX);
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "onnx: %s uses opset %lld; tessel reads opsets %d to %d (re-export "
                       "with torch.onnx.export(..., opset_version=17))",
                       path, (long long)v, OPSET_MIN, OPSET_MAX);
    }
    *out = m, *opset = v;
    return TS_OK;
}

void onnx_const_free(onnx_const *c) {
    if (!c) return;
    free(c->f);
    free(c->i);
    free(c);
}

/* The bytes of an external tensor: "location" relative to dir (no absolute
 * path, no "..", and resolved, still inside dir: no symlink out of it),
 * "offset" and "length". */
static ts_status read_external(const Onnx__TensorProto *t, const char *dir, size_t want,
                               uint8_t *dst) {
    const char *loc = NULL;
    long long off = 0, len = -1;
    for (size_t k = 0; k < t->n_external_data; k++) {
        const Onnx__StringStringEntryProto *e = t->external_data[k];
        if (!e->key || !e->value) continue;
        if (!strcmp(e->key, "location"))
            loc = e->value;
        else if (!strcmp(e->key, "offset"))
            off = strtoll(e->value, NULL, 10);
        else if (!strcmp(e->key, "length"))
            len = strtoll(e->value, NULL, 10);
    }
    const char *name = t->name ? t->name : "?";
    if (!loc || !loc[0])
        return ts_fail(TS_ERR_FORMAT, "onnx: initialiser '%s' is external but names no location",
                       name);
    if (loc[0] == '/' || strstr(loc, ".."))
        return ts_fail(TS_ERR_IO,
                       "onnx: initialiser '%s': external data '%s' must be a path inside the "
                       "model's directory %s",
                       name, loc, dir);
    char path[PATH_MAX + 8], real[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, loc);
    if (!realpath(path, real))
        return ts_fail(TS_ERR_IO, "onnx: initialiser '%s': cannot open external data %s: %s", name,
                       path, strerror(errno));
    const size_t dl = strlen(dir);
    if (strncmp(real, dir, dl) != 0 || (real[dl] != '/' && dl > 1))
        return ts_fail(TS_ERR_IO,
                       "onnx: initialiser '%s': external data %s resolves to %s, outside the "
                       "model's directory",
                       name, path, real);
    if (off < 0 || (len >= 0 && (size_t)len != want))
        return ts_fail(TS_ERR_FORMAT,
                       "onnx: initialiser '%s': external data offset %lld / length %lld do not "
                       "fit its %zu bytes",
                       name, off, len, want);
    FILE *f = fopen(real, "rb");
    if (!f)
        return ts_fail(TS_ERR_IO, "onnx: initialiser '%s': cannot open %s: %s", name, real,
                       strerror(errno));
    const int ok = fseek(f, (long)off, SEEK_SET) == 0 && fread(dst, 1, want, f) == want;
    fclose(f);
    if (!ok)
        return ts_fail(TS_ERR_IO,
                       "onnx: initialiser '%s': %s holds fewer than %zu bytes at offset %lld", name,
                       real, want, off);
    return TS_OK;
}

ts_status onnx_tensor_read(const Onnx__TensorProto *t, const char *dir, onnx_const *out) {
    memset(out, 0, sizeof *out);
    const char *name = t->name ? t->name : "?";
    if (t->n_dims > TS_MAX_RANK)
        return ts_fail(TS_ERR_UNSUPPORTED, "onnx: tensor '%s' has rank %zu (at most %d)", name,
                       t->n_dims, TS_MAX_RANK);
    out->rank = (int)t->n_dims;
    out->n = 1;
    for (size_t i = 0; i < t->n_dims; i++) {
        if (t->dims[i] < 0 || (t->dims[i] && out->n > ((int64_t)1 << 40) / t->dims[i]))
            return ts_fail(TS_ERR_FORMAT, "onnx: tensor '%s': bad dimension %lld", name,
                           (long long)t->dims[i]);
        out->dims[i] = t->dims[i], out->n *= t->dims[i];
    }
    const int dt = t->data_type;
    size_t esize;
    if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
        out->dtype = TS_F32, esize = 4;
    else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT64)
        out->dtype = TS_I64, esize = 8;
    else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT32)
        out->dtype = TS_I64, esize = 4;
    else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL)
        out->dtype = TS_U8, esize = 1; /* kept as i64 0 / 1 */
    else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE)
        out->dtype = TS_F32, esize = 8; /* torch's scalar constants; read as float32 */
    else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
             dt == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16)
        out->dtype = TS_F32, esize = 2; /* half weights, read as float32 (exactly) */
    else
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "onnx: tensor '%s' has element type %d (tessel reads float32, float16, "
                       "bfloat16, float64, int64, int32 and bool tensors)",
                       name, dt);
    const size_t n = (size_t)out->n, bytes = n * esize;
    uint8_t *raw = malloc(bytes ? bytes : 1);
    if (!raw) return ts_fail(TS_ERR_NOMEM, "onnx: tensor '%s': out of memory", name);
    ts_status s = TS_OK;
    if (t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        s = read_external(t, dir, bytes, raw);
    } else if (t->has_raw_data) {
        if (t->raw_data.len != bytes)
            s = ts_fail(TS_ERR_FORMAT, "onnx: tensor '%s': %zu raw bytes for %zu elements", name,
                        t->raw_data.len, n);
        else
            memcpy(raw, t->raw_data.data, bytes);
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && t->n_float_data == n) {
        memcpy(raw, t->float_data, bytes);
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 && t->n_int64_data == n) {
        memcpy(raw, t->int64_data, bytes);
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 && t->n_int32_data == n) {
        memcpy(raw, t->int32_data, bytes);
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE && t->n_double_data == n) {
        memcpy(raw, t->double_data, bytes);
    } else if (esize == 2 && t->n_int32_data == n) { /* f16 / bf16 bit patterns, one each */
        for (size_t k = 0; k < n; k++) {
            const uint16_t h = (uint16_t)t->int32_data[k];
            memcpy(raw + 2 * k, &h, 2);
        }
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL && t->n_int32_data == n) {
        for (size_t k = 0; k < n; k++) raw[k] = t->int32_data[k] != 0;
    } else {
        s = ts_fail(TS_ERR_FORMAT, "onnx: tensor '%s' holds no data for its %zu elements", name, n);
    }
    if (s != TS_OK) {
        free(raw);
        return s;
    }
    if (out->dtype == TS_F32 && esize == 4) {
        out->f = (float *)raw;
        return TS_OK;
    }
    if (out->dtype == TS_F32) {
        float *f = malloc((n ? n : 1) * sizeof(float));
        for (size_t k = 0; f && k < n; k++) {
            if (esize == 2) {
                uint16_t h;
                memcpy(&h, raw + 2 * k, 2);
                f[k] = dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ? ts_f16_to_f32(h)
                                                                    : ts_bf16_to_f32(h);
                continue;
            }
            double v;
            memcpy(&v, raw + 8 * k, 8);
            f[k] = (float)v;
        }
        free(raw);
        out->f = f;
        return f ? TS_OK : ts_fail(TS_ERR_NOMEM, "onnx: tensor '%s': out of memory", name);
    }
    if (esize == 8) {
        out->i = (int64_t *)raw;
        return TS_OK;
    }
    out->i = malloc((n ? n : 1) * sizeof(int64_t));
    if (!out->i) {
        free(raw);
        return ts_fail(TS_ERR_NOMEM, "onnx: tensor '%s': out of memory", name);
    }
    for (size_t k = 0; k < n; k++) {
        int32_t v = 0;
        if (esize == 1)
            v = raw[k] != 0;
        else
            memcpy(&v, raw + 4 * k, 4);
        out->i[k] = v;
    }
    free(raw);
    return TS_OK;
}
