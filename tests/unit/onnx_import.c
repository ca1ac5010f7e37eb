/* ts_onnx_import on models it must refuse, and on damaged files: refused
 * Conv attributes (auto_pad, asymmetric pads, an attribute tessel does not
 * know), a bidirectional GRU, a strided Slice and an Erf outside GELU, named
 * with node, op and opset; a dynamic dimension without a value; and every
 * prefix and every single-byte corruption of the exported MLP, CNN and
 * OpsNet, which must import or fail with a message, never crash or leak
 * (the ASan build runs this too). Exits 77 in a build without ONNX support. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "tessel/onnx.h"

#define FIX "tests/parity/fixtures/onnx/"

static ts_onnx_info info;

static void refused(const char *file, const char *want) {
    ts_graph *g = ts_graph_new();
    ts_onnx_options o = {.batch = 1};
    ts_status s = ts_onnx_import(g, file, &o, &info);
    CHECK(s == TS_ERR_UNSUPPORTED && info.n_refused == 1 && strstr(info.refused[0], want) &&
              strstr(ts_last_error(), want),
          "%s: status %d, refused %d '%s', error '%s'; want '%s'", file, s, info.n_refused,
          info.refused[0], ts_last_error(), want);
    ts_graph_free(g);
}

static unsigned char *slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "open %s", path);
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)*len);
    CHECK(b && fread(b, 1, (size_t)*len, f) == (size_t)*len, "read %s", path);
    fclose(f);
    return b;
}

/* Imports `len` bytes of buf from a scratch file; returns the status. */
static ts_status import_bytes(const char *tmp, const unsigned char *buf, long len) {
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(buf, 1, (size_t)len, f) != (size_t)len) {
        if (f) fclose(f);
        CHECK(0, "write %s", tmp);
        return TS_ERR_IO;
    }
    fclose(f);
    ts_graph *g = ts_graph_new();
    ts_onnx_options o = {.batch = 2};
    ts_status s = ts_onnx_import(g, tmp, &o, &info);
    CHECK(s == TS_OK || ts_last_error()[0], "a failure has a message");
    ts_graph_free(g);
    return s;
}

static void damaged(const char *file, const char *tmp) {
    long len = 0;
    unsigned char *b = slurp(file, &len);
    if (!b) return;
    int ok = 0, failed = 0;
    for (long n = 0; n < len; n++) import_bytes(tmp, b, n) == TS_OK ? ok++ : failed++;
    CHECK(failed > len / 2, "%s: most prefixes fail (%d of %ld)", file, failed, len);
    int flips_ok = 0;
    for (long i = 0; i < len; i += 2) { /* every other byte: the suite runs it under ASan */
        b[i] ^= 0xff;
        flips_ok += import_bytes(tmp, b, len) == TS_OK;
        b[i] ^= 0xff;
    }
    CHECK(import_bytes(tmp, b, len) == TS_OK, "%s: the whole file imports", file);
    printf("%s: %ld bytes; prefixes: %d import, %d fail; single-byte flips: %d of %ld import\n",
           file, len, ok, failed, flips_ok, (len + 1) / 2);
    free(b);
}

int main(void) {
#ifndef TESSEL_HAVE_ONNX
    puts("onnx_import: built without ONNX support, skipped");
    return 77;
#endif
    refused(FIX "auto_pad.onnx",
            "node 'conv' (Conv, opset 17): auto_pad 'SAME_UPPER' is not supported");
    refused(FIX "asym_pads.onnx", "node 'conv' (Conv, opset 17): asymmetric pads (0 before, 1 "
                                  "after on spatial axis 0) are not supported");
    refused(FIX "unknown_attr.onnx",
            "node 'conv' (Conv, opset 17): attribute 'sparsity' is not supported");
    refused(FIX "bigru.onnx",
            "node '/gru/GRU' (GRU, opset 17): only direction 'forward' is supported");
    refused(FIX "strided.onnx",
            "node '/Slice' (Slice, opset 17): steps other than 1 are not supported");
    refused(FIX "lone_erf.onnx",
            "node 'act' (Erf, opset 17): Erf is read only inside torch's GELU pattern");
    ts_graph *g = ts_graph_new();
    ts_status s = ts_onnx_import(g, FIX "mlp.onnx", NULL, &info);
    CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "graph input 'x' dimension 0 ('batch') "
                                                         "is dynamic and no value was given"),
          "dynamic batch without a value: %s", ts_last_error());
    ts_graph_free(g);

    char tmp[] = "/tmp/tessel-onnx-import-XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0, "scratch file");
    if (fd >= 0) {
        damaged(FIX "mlp.onnx", tmp);
        damaged(FIX "cnn.onnx", tmp);
        damaged(FIX "ops.onnx", tmp); /* folding, GELU pattern, ConvTranspose, reductions */
        remove(tmp);
    }
    return check_summary("onnx_import");
}
