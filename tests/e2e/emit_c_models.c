/* `tessel compile --emit-c` beyond the MLP (docs/aot.md): a small W3 (GPT:
 * attention, embeddings, cross-entropy, AdamW with weight decay), the CNN
 * of examples/fashion_cnn.yaml (oneDNN convolutions, pooling, batch norm;
 * skipped without the Fashion-MNIST files) with its cosine schedule and
 * warm-up, a W2 GRU (recurrence, Adam, fused chains as generated loops)
 * and a tiny W3 in bf16 (casts, bf16 GEMMs; 5 steps): each program emitted, built
 * with cc, run 20 steps (bf16: 5), and its weights equal to `tessel train`'s byte
 * for byte (tests/support/emit_c.c). */
#include <unistd.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "e2e.h"
#include "emit_c.h"

int main(void) {
    char dir[64];
    if (!e2e_setup("emit_c_models", dir, sizeof dir)) return check_summary("e2e/emit_c_models");
    emit_c_check("w3", "examples/w3.yaml",
                 "--set model.n_layers=2 --set model.ctx=64 --set model.d_model=128 "
                 "--set model.n_heads=4 --set model.vocab=512 --set model.batch=4",
                 20);
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) == 0)
        emit_c_check("cnn", "examples/fashion_cnn.yaml",
                     "--set train.epochs=0 --set data.val_fraction=0", 20);
    else
        printf("cnn skipped: the Fashion-MNIST files are not installed (dataset-fashion-mnist)\n");
    emit_c_check("gru", "examples/w2.yaml",
                 "--set model.batch=32 --set model.window=16 --set model.features=4 "
                 "--set model.hidden=16 --set model.n_layers=1 --set train.lr=0.01",
                 20);
    /* mixed precision: bf16 casts and oneDNN bf16 GEMMs with f32 accumulation */
    if (ts_cpu_supports_dtype_gemm(TS_BF16))
        emit_c_check("w3bf16", "examples/w3_bf16.yaml",
                     "--set model.n_layers=1 --set model.ctx=32 --set model.d_model=64 "
                     "--set model.n_heads=2 --set model.vocab=128 --set model.batch=2",
                     5);
    else
        printf("w3bf16 skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
    e2e_cleanup(dir);
    return check_summary("e2e/emit_c_models");
}
