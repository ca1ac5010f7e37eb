/* load_internal.h — the opened checkpoint as load.c parses it, shared with restore.c
 * (restoring into a plan, export) (internal to src/ckpt). */
#ifndef TS_CKPT_LOAD_INTERNAL_H
#define TS_CKPT_LOAD_INTERNAL_H

#include <stdatomic.h>
#include "ckpt_internal.h"

/* A chunk of a logical tensor. Two forms (docs/checkpoints.md): a block
 * (offset and shape per dimension) that is a whole tensor of its file, or
 * a flat range — elements [start, start + count) of the flattened tensor,
 * stored from element file_start of the file's tensor `tensor` (a sharded
 * optimizer state value cut across parameters). A block covering the whole
 * tensor is also a flat range (start 0). */
typedef struct ld_chunk {
    int file;
    const char *tensor; /* the file's tensor (borrowed from the manifest JSON) */
    int block;          /* the block form */
    int64_t off[TS_MAX_RANK], shape[TS_MAX_RANK];
    int flat; /* start, count and file_start hold (flat form, or a whole-tensor block) */
    int64_t start, count, file_start;
    uint32_t crc;
    const unsigned char *data; /* the chunk's first byte in the mapped shard, once verified */
    size_t bytes;
} ld_chunk;

typedef struct ld_tensor {
    const char *name; /* borrowed from the manifest JSON */
    int is_state;
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    size_t bytes;
    ld_chunk *chunks;
    int n_chunks;
} ld_tensor;

typedef struct ld_file {
    const char *name; /* borrowed from the manifest JSON */
    char *path;
    uint64_t bytes;
    const char *sha;
    ts_st_file *st;
    ts_status status;
    char err[1024];
} ld_file;

struct ts_ckpt {
    char *dir;
    char *text;
    json_t *m;
    ld_file *f;
    int nf;
    ld_tensor *t;
    int nt;
    ts_ckpt_data_file *data;
    int nd;
    ts_ckpt_info info;
    atomic_int next_file;
};

/* The logical tensor `name`, or NULL. */
const ld_tensor *ck_find_tensor(const ts_ckpt *c, const char *name);
/* The whole tensor t into dst (t->bytes), from its chunks. */
void ck_assemble(const ld_tensor *t, unsigned char *dst);
/* Elements [start, start + count) of t into dst. */
ts_status ck_read_range(const ld_tensor *t, int64_t start, int64_t count, unsigned char *dst);

#endif
