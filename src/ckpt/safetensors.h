/* ckpt/safetensors.h — reading and writing the safetensors checkpoint format.
 *
 * Reading: open a file, look tensors up by name, close it. The whole file
 * is mapped read-only and validated once in ts_st_open(); afterwards every
 * lookup is cheap and every returned pointer stays valid until ts_st_close():
 *
 *     ts_st_file *f;
 *     if (ts_st_open("model.safetensors", &f) != TS_OK) {
 *         fprintf(stderr, "%s\n", ts_last_error());
 *         return 1;
 *     }
 *     for (int i = 0; i < ts_st_count(f); i++) puts(ts_st_name(f, i));
 *     ts_st_tensor t;
 *     if (ts_st_find(f, "fc.weight", &t) == TS_OK && t.dtype == TS_F32)
 *         memcpy(my_weights, t.data, t.bytes);
 *     const char *step = ts_st_metadata(f, "step"); // NULL if absent
 *     ts_st_close(f);
 *
 * Writing: collect tensors and metadata, then save atomically (the file is
 * written to "<path>.tmp", fsync'ed and renamed over <path>):
 *
 *     ts_st_writer *w;
 *     if (ts_st_writer_new(&w) != TS_OK) return 1;
 *     int64_t dims[] = {10, 784};
 *     ts_status s = ts_st_writer_add(w, "fc.weight", TS_F32, 2, dims, weights);
 *     if (s == TS_OK) s = ts_st_writer_meta(w, "step", "1200");
 *     if (s == TS_OK) s = ts_st_writer_save(w, "model.safetensors");
 *     ts_st_writer_free(w);
 *
 * The writer REFERENCES tensor data: `data` passed to ts_st_writer_add()
 * must stay valid and unchanged until ts_st_writer_save() returns (checkpoints
 * are large; copying them would double peak memory). Names, shapes and
 * metadata strings are copied.
 *
 * Format (https://github.com/huggingface/safetensors): an 8-byte little-
 * endian u64 N, N bytes of UTF-8 JSON, then the data buffer. The JSON maps
 * each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
 * (offsets relative to the start of the data buffer) and may carry a
 * "__metadata__" object of string -> string. Tensor data is row-major and
 * little-endian. Supported dtypes: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32
 * U8; any other dtype gives TS_ERR_UNSUPPORTED.
 *
 * ts_st_open() checks the header length against the file size, the JSON
 * syntax, duplicate names, every tensor's dtype, rank (<= TS_MAX_RANK) and
 * shape, that its offsets lie inside the data buffer and span exactly
 * numel * dtype size bytes, and that the tensors tile the data buffer with
 * no overlap, gap or trailing bytes (as the specification requires). Any
 * violation returns TS_ERR_FORMAT with a message naming the file and the
 * tensor or field at fault.
 *
 * Alignment: ts_st_tensor.data is aligned for its dtype when the tensor's
 * begin offset is a multiple of the dtype size. Files written by
 * ts_st_writer_save() pad the header so the data buffer starts 8-aligned,
 * and lay tensors out in insertion order with no padding between them (the
 * format forbids gaps), so add tensors with larger elements first, or copy
 * with memcpy, when mixing dtypes (the Python safetensors library sorts
 * tensors by dtype, largest first, for the same reason).
 */
#ifndef TS_CKPT_SAFETENSORS_H
#define TS_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/dtype.h"
#include "tessel/status.h"

#include "tessel/graph.h"

/* ---- reading ----------------------------------------------------------- */

typedef struct ts_st_file ts_st_file;

/* One tensor of an open file. All pointers are owned by the file. */
typedef struct ts_st_tensor {
    const char *name;
    ts_dtype dtype;
    int rank;                  /* 0 for a scalar */
    int64_t dims[TS_MAX_RANK]; /* dims[rank..] are 0 */
    const void *data;          /* `bytes` bytes, read-only; see "Alignment" */
    size_t bytes;              /* numel * ts_dtype_size(dtype) */
} ts_st_tensor;

/* Map and validate `path`. On failure *out is NULL and the message names
 * the file (TS_ERR_IO: cannot read; TS_ERR_FORMAT: malformed;
 * TS_ERR_UNSUPPORTED: a dtype tessel does not have). */
ts_status ts_st_open(const char *path, ts_st_file **out);

/* Number of tensors, and the name of tensor i (0 <= i < count), in the
 * order of their data in the file. NULL if i is out of range. */
int ts_st_count(const ts_st_file *f);
const char *ts_st_name(const ts_st_file *f, int i);

/* Look a tensor up by name (TS_ERR_NOT_FOUND if absent) or by index
 * (TS_ERR_INVALID if out of range). */
ts_status ts_st_find(const ts_st_file *f, const char *name, ts_st_tensor *out);
ts_status ts_st_get(const ts_st_file *f, int i, ts_st_tensor *out);

/* The "__metadata__" value of `key`, or NULL if absent. */
const char *ts_st_metadata(const ts_st_file *f, const char *key);

/* Release the file; NULL is allowed. Invalidates every pointer it handed out. */
/* The whole file as read (mapped) by ts_st_open: for hashing it without
 * reading it a second time. Valid until ts_st_close(). */
const void *ts_st_raw(const ts_st_file *f, size_t *bytes);

void ts_st_close(ts_st_file *f);

/* ---- writing ----------------------------------------------------------- */

typedef struct ts_st_writer ts_st_writer;

ts_status ts_st_writer_new(ts_st_writer **out);

/* Append a tensor (laid out in insertion order). `name` must be non-empty,
 * valid UTF-8, unique and not "__metadata__"; 0 <= rank <= TS_MAX_RANK;
 * dims >= 0. `data` holds numel * ts_dtype_size(dtype) bytes and is
 * referenced, not copied (may be NULL only when numel is 0). */
ts_status ts_st_writer_add(ts_st_writer *w, const char *name, ts_dtype dtype, int rank,
                           const int64_t *dims, const void *data);

/* Set a "__metadata__" entry (copied; a repeated key replaces the value). */
ts_status ts_st_writer_meta(ts_st_writer *w, const char *key, const char *value);

/* Write everything to `path` atomically: "<path>.tmp", fsync, rename, fsync
 * of the directory. On failure the temporary file is removed and `path` is
 * left as it was. The writer stays usable (save again, or free it). */
ts_status ts_st_writer_save(const ts_st_writer *w, const char *path);

/* Called with every byte of the file, in file order, just before it is
 * written: `tensor` is the tensor's index in ts_st_writer_add order, -1
 * for the header (length, JSON and padding). */
typedef void (*ts_st_chunk_fn)(void *user, int tensor, const void *data, size_t n);

/* ts_st_writer_save that writes in pieces of at most `chunk` bytes (0: 1
 * MiB) and hands each to fn first, so a caller hashes exactly the bytes
 * written while they are still in cache, with no second pass over memory.
 * Writeback of what was written is started every few pieces
 * (sync_file_range), so the final fsync waits for the tail only. */
ts_status ts_st_writer_save_with(const ts_st_writer *w, const char *path, size_t chunk,
                                 ts_st_chunk_fn fn, void *user);

/* ts_st_writer_save_with into `name` of the directory open as `dirfd`
 * ("NAME.tmp", renamed over NAME there, the directory fsync'ed), opened
 * with O_NOFOLLOW: a link planted as either name is an error, never
 * followed. `shown` is the path used in messages (e.g. "RUN/step-N.tmp/F"). */
ts_status ts_st_writer_save_at(const ts_st_writer *w, int dirfd, const char *name,
                               const char *shown, size_t chunk, ts_st_chunk_fn fn, void *user);

/* The bytes before the tensor data, as ts_st_writer_save writes them: the
 * 8-byte header length, the header and its padding, in one malloc'ed
 * buffer (*len bytes). The tensors' bytes follow in ts_st_writer_add
 * order, back to back: a caller that writes the file itself (the
 * checkpoint pipeline, ckpt/pipe.h) writes exactly these bytes then. */
ts_status ts_st_writer_prefix(const ts_st_writer *w, const char *path, unsigned char **out,
                              size_t *len);

/* Release the writer; NULL is allowed. */
void ts_st_writer_free(ts_st_writer *w);

#endif
