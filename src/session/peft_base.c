/* The base weights of parameter-efficient fine-tuning (peft.base), read by
 * name from a checkpoint or a safetensors file, with the SHA-256 a PEFT
 * checkpoint records to refer to them (docs/peft.md). See
 * session_internal.h. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "ckpt/safetensors.h"
#include "core/core.h"
#include "session/session_internal.h"

void ts_peft_base_close(ts_peft_base *b) {
    ts_ckpt_close(b->ck);
    ts_st_close(b->st);
    b->ck = NULL;
    b->st = NULL;
}

ts_status ts_peft_base_open(const char *path, const char *what, const char *expect_sha,
                            ts_peft_base *b) {
    memset(b, 0, sizeof *b);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ts_fail(TS_ERR_IO,
                       "%s: cannot read '%s' (a checkpoint directory or a .safetensors file)", what,
                       path);
    ts_status st;
    char hashed[700];
    if (S_ISDIR(sb.st_mode)) {
        st = ts_ckpt_resolve(path, b->path, sizeof b->path);
        if (st == TS_OK) st = ts_ckpt_open(b->path, NULL, NULL, &b->ck);
        snprintf(hashed, sizeof hashed, "%s/manifest.json", b->path);
    } else {
        snprintf(b->path, sizeof b->path, "%s", path);
        st = ts_st_open(path, &b->st);
        snprintf(hashed, sizeof hashed, "%s", path);
    }
    if (st == TS_OK) st = ts_sha256_file(hashed, b->sha256);
    if (st != TS_OK) {
        ts_error_prefix("%s", what);
        ts_peft_base_close(b);
        return st;
    }
    if (expect_sha && strcmp(expect_sha, b->sha256)) {
        st = ts_fail(TS_ERR_INVALID,
                     "%s: %s has sha256 %s, but the checkpoint was trained on a base with sha256 "
                     "%s: its frozen weights are not the ones the checkpoint's LoRA/adapter "
                     "tensors were trained with",
                     what, hashed, b->sha256, expect_sha);
        ts_peft_base_close(b);
    }
    return st;
}

int ts_peft_base_find(const ts_peft_base *b, const char *name, ts_dtype *dt, int *rank,
                      int64_t *dims) {
    if (b->st) {
        ts_st_tensor t;
        if (ts_st_find(b->st, name, &t) != TS_OK) return 0;
        *dt = t.dtype, *rank = t.rank;
        memcpy(dims, t.dims, sizeof t.dims);
        return 1;
    }
    for (int i = 0; b->ck && i < ts_ckpt_tensor_count(b->ck); i++) {
        ts_ckpt_tensor t;
        if (ts_ckpt_tensor_info(b->ck, i, &t) != TS_OK || t.is_state || strcmp(t.name, name))
            continue;
        *dt = t.dtype, *rank = t.rank;
        memcpy(dims, t.dims, sizeof t.dims);
        return 1;
    }
    return 0;
}

ts_status ts_peft_base_read(const ts_peft_base *b, const char *name, void *dst, size_t bytes) {
    if (b->ck) return ts_ckpt_read(b->ck, name, dst, bytes);
    ts_st_tensor t;
    ts_status s = b->st ? ts_st_find(b->st, name, &t) : TS_ERR_INVALID;
    if (s != TS_OK) return ts_fail(s, "%s: no tensor '%s'", b->path, name);
    if (t.bytes != bytes)
        return ts_fail(TS_ERR_SHAPE, "%s: tensor '%s' has %zu bytes, %zu expected", b->path, name,
                       t.bytes, bytes);
    memcpy(dst, t.data, bytes);
    return TS_OK;
}

const char *ts_peft_base_name(const ts_peft_base *b, int i) {
    if (b->st) return i < ts_st_count(b->st) ? ts_st_name(b->st, i) : NULL;
    for (int k = 0, seen = 0; b->ck && k < ts_ckpt_tensor_count(b->ck); k++) {
        ts_ckpt_tensor t;
        if (ts_ckpt_tensor_info(b->ck, k, &t) != TS_OK || t.is_state) continue;
        if (seen++ == i) return t.name;
    }
    return NULL;
}
