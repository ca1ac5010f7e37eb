/* onnx_triton.c — the config.pbtxt of a Triton model repository for an
 * exported ONNX model (`tessel export CKPT --triton DIR`, docs/onnx.md):
 *
 *     DIR/NAME/config.pbtxt
 *     DIR/NAME/1/model.onnx
 *
 * platform onnxruntime_onnx, max_batch_size and dynamic_batching: Triton
 * then batches requests along the first axis, so every input and the output
 * must carry the dynamic batch there, and their dims are listed without it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "onnx_triton.h"

static const char *triton_type(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return "TYPE_FP32";
    case TS_F64: return "TYPE_FP64";
    case TS_F16: return "TYPE_FP16";
    case TS_BF16: return "TYPE_BF16";
    case TS_I64: return "TYPE_INT64";
    case TS_I32: return "TYPE_INT32";
    case TS_U8: return "TYPE_UINT8";
    default: return NULL;
    }
}

static ts_status check_io(const ts_onnx_io *io, const char *what) {
    if (io->batch_axis != 0)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "export --triton: %s '%s' does not carry the batch on its first axis "
                       "(Triton's dynamic batching needs it there)",
                       what, io->name);
    if (!triton_type(io->dtype))
        return ts_fail(TS_ERR_UNSUPPORTED, "export --triton: %s '%s' is %s (no Triton type)", what,
                       io->name, ts_dtype_name(io->dtype));
    return TS_OK;
}

static void write_io(FILE *f, const ts_onnx_io *io, int last) {
    fprintf(f, "  {\n    name: \"%s\"\n    data_type: %s\n    dims: [ ", io->name,
            triton_type(io->dtype));
    for (int k = 1; k < io->rank; k++)
        fprintf(f, "%s%lld", k > 1 ? ", " : "", (long long)io->dims[k]);
    if (io->rank == 1) fprintf(f, "1"); /* [batch] alone: one value per row, reshaped */
    fprintf(f, " ]\n");
    if (io->rank == 1) fprintf(f, "    reshape: { shape: [ ] }\n");
    fprintf(f, "  }%s\n", last ? "" : ",");
}

ts_status triton_config_check(const ts_onnx_export_info *info) {
    ts_status s = TS_OK;
    for (int i = 0; s == TS_OK && i < info->n_inputs; i++) s = check_io(&info->inputs[i], "input");
    return s == TS_OK ? check_io(&info->output, "output") : s;
}

ts_status triton_config_write(const char *path, const char *name, const ts_onnx_export_info *info,
                              int64_t max_batch) {
    ts_status s = triton_config_check(info);
    if (s != TS_OK) return s;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return ts_fail(TS_ERR_IO, "export --triton: cannot create %s: %s", tmp, strerror(errno));
    fprintf(f,
            "# Written by tessel export --triton: the ONNX model beside it (1/model.onnx)\n"
            "# served by Triton's ONNX Runtime backend, batched dynamically.\n"
            "name: \"%s\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: %lld\ninput [\n",
            name, (long long)max_batch);
    for (int i = 0; i < info->n_inputs; i++) write_io(f, &info->inputs[i], i == info->n_inputs - 1);
    fprintf(f, "]\noutput [\n");
    write_io(f, &info->output, 1);
    fprintf(f, "]\ndynamic_batching { }\n");
    const int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        const int err = errno;
        remove(tmp);
        return ts_fail(TS_ERR_IO, "export --triton: cannot write %s: %s", path, strerror(err));
    }
    return TS_OK;
}

ts_status triton_dirs(const char *dir, const char *name, char *model_dir, size_t n) {
    char sub[4200];
    const char *parts[3] = {dir, name, "1"};
    sub[0] = 0;
    for (int k = 0; k < 3; k++) {
        const size_t len = strlen(sub);
        snprintf(sub + len, sizeof sub - len, "%s%s", k ? "/" : "", parts[k]);
        if (mkdir(sub, 0777) != 0 && errno != EEXIST)
            return ts_fail(TS_ERR_IO, "export --triton: cannot create %s: %s", sub,
                           strerror(errno));
    }
    snprintf(model_dir, n, "%s", sub);
    return TS_OK;
}
