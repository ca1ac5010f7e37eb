/* data_internal.h — helpers shared by the readers in src/data (internal).
 *
 * The in-memory readers load their file whole through ts_data_slurp, which
 * hashes the bytes as they stream in: the SHA-256 in the lineage is
 * therefore the hash of exactly the bytes that were parsed, even if the
 * file changes on disk while (or after) it is read. The mapped readers
 * (tokmap.c, xmap.c) hash the mapping in one pass and need the file left
 * alone while a run uses it.
 */
#ifndef TS_DATA_INTERNAL_H
#define TS_DATA_INTERNAL_H

#include <stdint.h>
#include "core/core.h"
#include "data/data.h"

/* Read all of `path` into *buf (malloc'd, *len bytes) and fill *lin (path
 * as given, SHA-256, size). On failure nothing is left allocated. */
ts_status ts_data_slurp(const char *path, uint8_t **buf, size_t *len, ts_lineage *lin);

/* Free the strings a lineage entry owns and clear it. */
void ts_lineage_clear(ts_lineage *l);

/* Append *l to d's lineage list, taking over its path (l is cleared). */
ts_status ts_dataset_add_lineage(ts_dataset *d, ts_lineage *l);

/* Mapped token files (src/data/tokmap.c). ref/unref count the datasets
 * sharing a mapping (the last unref unmaps it); window writes window w's
 * ctx inputs and ctx targets as i64, an error naming the file and byte
 * offset when a token is not below the vocabulary; drop hands the pages mapped so far
 * back to the page cache (called every 16 windows read, bounding VmRSS). */
void ts_token_map_drop(ts_token_map *m);
void ts_token_map_ref(ts_token_map *m);
void ts_token_map_unref(ts_token_map *m);
ts_status ts_token_map_window(ts_token_map *m, int64_t w, int64_t *x, int64_t *y);

/* .npy pieces shared by the in-memory reader (npy.c) and the mapped one
 * (xmap.c), so both accept and refuse exactly the same files with the same
 * messages. parse_header reads the magic, version and header dict of the
 * file's first len bytes; check_size checks the shape and that the data
 * fills the rest of the file exactly (*numel: elements); check_finite
 * checks elements [first, first + count), src pointing at element first;
 * convert widens or narrows numel elements, naming a bad one as element
 * first + i; read loads a whole file (floats to want_float, integers to
 * want_int). */
typedef struct npy_header {
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    size_t data_offset;
} npy_header;
ts_status ts_npy_parse_header(const char *path, const uint8_t *buf, size_t len, npy_header *h);
ts_status ts_npy_check_size(const char *path, const npy_header *h, size_t len, size_t *numel);
ts_status ts_npy_check_finite(const char *path, const npy_header *h, const uint8_t *src,
                              size_t first, size_t count);
ts_status ts_npy_convert(const char *path, ts_dtype from, const uint8_t *src, int64_t numel,
                         ts_dtype to, void *dst, int64_t first);
ts_status ts_npy_read(const char *path, ts_dtype want_float, ts_dtype want_int, ts_array *out);

/* A plain (not gzip) IDX file's header in its first len bytes: rank,
 * dimensions and where the data starts, with the checks and messages of
 * ts_data_read_idx (the data must fill the rest of the file exactly). */
ts_status ts_idx_plain_header(const char *path, const uint8_t *buf, size_t len, int *rank,
                              int64_t *dims, size_t *data_offset);

/* Mapped example arrays (src/data/xmap.c): x of a .npy or IDX data set
 * read from the file's mapping and widened to f32 one example at a time
 * (ts_data_map_npy_pair, ts_data_map_idx_pair). ref/unref count the data
 * sets sharing it; example writes example e's f32 values; drop hands the
 * pages mapped so far back to the page cache, as for token files. */
typedef struct ts_xmap ts_xmap;
void ts_xmap_ref(ts_xmap *m);
void ts_xmap_unref(ts_xmap *m);
void ts_xmap_example(const ts_xmap *m, int64_t e, float *x);
void ts_xmap_drop(ts_xmap *m);

/* Loader prefetch (src/data/prefetch.c). start runs a thread that fills
 * batches pos, pos + 1, ... through ts_loader_fill into a ring of depth
 * slots of xb + yb bytes; take copies batch pos (the next in order) out,
 * adding the time it waited to *waited, and passes on a fill's error;
 * stop ends the thread and frees everything (NULL is fine). */
typedef struct ts_prefetch ts_prefetch;
ts_status ts_loader_fill(ts_loader *l, int64_t pos, void *x, void *y);
ts_status ts_prefetch_start(ts_loader *l, int depth, size_t xb, size_t yb, int64_t pos,
                            ts_prefetch **out);
ts_status ts_prefetch_take(ts_prefetch *p, int64_t pos, void *x, void *y, double *waited);
void ts_prefetch_stop(ts_prefetch *p);

/* Example orders (src/data/order.c). key: the stream key of (seed,
 * purpose); permute: Fisher-Yates of [0, n) from the top, drawing from
 * the Philox stream (key, hi); permutation_tail: its last `count` entries
 * (p[n - count .. n)) in O(count) time and memory, the same values;
 * bijection: a keyed permutation of [0, n) for one epoch, evaluated per
 * position (O(1), no table). */
#define TS_ORDER_ROUNDS 6
typedef struct ts_order_bijection {
    int64_t n;
    int half; /* bits of each Feistel half */
    uint64_t round_key[TS_ORDER_ROUNDS];
} ts_order_bijection;
uint64_t ts_order_key(uint64_t seed, uint64_t purpose);
void ts_order_permute(int64_t *p, int64_t n, uint64_t key, uint64_t hi);
ts_status ts_order_permutation_tail(int64_t n, int64_t count, uint64_t key, uint64_t hi,
                                    int64_t *tail);
void ts_order_bijection_init(ts_order_bijection *b, int64_t n, uint64_t key, uint64_t epoch);
int64_t ts_order_bijection_at(const ts_order_bijection *b, int64_t i);

/* Sizes a file states about itself (src/data/limits.c). */

/* A shape read from `path`: no negative dimension, and the product of its
 * dimensions (a 0 counted as 1) times `elem` bytes fits int64 and size_t,
 * so any partial product (an example's size, a row stride) is safe to
 * compute. *numel gets the element count. TS_ERR_FORMAT naming the shape. */
ts_status ts_data_check_shape(const char *path, int rank, const int64_t *dims, size_t elem,
                              int64_t *numel);
/* A dataset array [n, ...]: every dimension after the example axis is at
 * least 1, so an example holds values and n is bounded by the file's size
 * (a file of shape (2^62, 0) holds no bytes). TS_ERR_SHAPE otherwise. */
ts_status ts_data_check_examples(const char *path, int rank, const int64_t *dims);
/* A class id when the class count is taken from the data (the largest label
 * plus one): it must stay within model.classes's documented range [0, 1e9],
 * so label + 1 cannot overflow and no model asks for absurd memory.
 * `where` names the place ("example 3", "node 17"). TS_ERR_INVALID naming
 * the file, the place, the value and the key. */
/* Token files (tokens.c): the number of `bits`-bit tokens in `len` bytes,
 * an error naming the file when the bytes are not a whole number of them;
 * and an error when ntok tokens hold no example of ctx + 1 tokens. */
ts_status ts_tokens_count(const char *path, size_t len, int bits, size_t *ntok);
ts_status ts_tokens_check_window(const char *path, size_t ntok, int64_t ctx);

ts_status ts_data_check_class_count(const char *path, const char *where, int64_t label);

/* Little-endian loads, independent of the host's byte order. */
static inline uint16_t ts_le16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t ts_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ts_le64(const uint8_t *p) {
    return (uint64_t)ts_le32(p) | ((uint64_t)ts_le32(p + 4) << 32);
}
static inline uint32_t ts_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

#endif
