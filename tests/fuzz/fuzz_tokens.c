/* Token files: the first byte picks the width (16/32 bits), the context
 * length (1-8) and the vocabulary (small or 2^32); the rest is the file,
 * read as fixed windows and as documents ending with the id 0 or 1
 * (data.eot_id, by the context length's parity). */
#include "data/data.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t o = data[0];
    const char *p = fuzz_file("in.bin", data + 1, size - 1);
    if (!p) return 0;
    const int bits = o & 1 ? 32 : 16;
    const int64_t ctx = 1 + ((o >> 1) & 7);
    const int64_t vocab = o & 0x10 ? (int64_t)1 << 32 : 1 + (o >> 5) * 300;
    ts_dataset *d = NULL;
    if (ts_data_load_tokens(p, bits, ctx, vocab, &d) == TS_OK) ts_dataset_free(d);
    d = NULL;
    if (ts_data_load_token_docs(p, bits, ctx, vocab, ctx & 1, &d) == TS_OK) ts_dataset_free(d);
    return 0;
}
