/* Opening, verifying and restoring checkpoints. ts_ckpt_open() checks all
 * of a checkpoint before anyone reads a value from it: the manifest's
 * structure and signature, each file's size, safetensors layout and
 * SHA-256, and each tensor's dtype, shape, chunk layout and CRC-32C. Files
 * are checked by parallel threads; the first failure in file order is
 * reported, so the message does not depend on timing. A plan with sharded
 * optimizer state (ZeRO) is filled from ranges of the logical tensors
 * (ts_plan_shard_layout), whatever the world size that saved them. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt/safetensors.h"
#include "ckpt_internal.h"
#include "core/fsat.h"
#include "core/crc32c.h"

#define MANIFEST_MAX ((size_t)256 << 20)

#include "load_internal.h"

/* ---- resolving ------------------------------------------------------------- */

ts_status ts_ckpt_resolve(const char *path, char *out, size_t n) {
    if (!path || !out || n == 0) return ts_fail(TS_ERR_INVALID, "ckpt resolve: NULL argument");
    char *mp = ck_join(path, "manifest.json");
    if (!mp) return TS_ERR_NOMEM;
    struct stat st;
    int is_ckpt = stat(mp, &st) == 0;
    free(mp);
    if (is_ckpt) {
        if ((size_t)snprintf(out, n, "%s", path) >= n)
            return ts_fail(TS_ERR_INVALID, "%s: path too long", path);
        return TS_OK;
    }
    /* A run directory: LATEST and the directory it names are reached
     * without following links (a link there is an error naming it). */
    char *text = NULL;
    ts_dir run;
    ts_status s = ts_dir_open(&run, path, TS_DIR_FOLLOW);
    if (s == TS_OK) s = ts_dir_read(&run, "LATEST", 4096, &text, NULL);
    if (s == TS_ERR_NOT_FOUND)
        s = ts_fail(TS_ERR_NOT_FOUND,
                    "%s: neither a checkpoint (no manifest.json) nor a run directory with a "
                    "LATEST checkpoint",
                    path);
    if (s == TS_OK) {
        text[strcspn(text, "\r\n")] = '\0';
        int kind = 0;
        if (ck_parse_step_name(text) < 0)
            s = ts_fail(TS_ERR_FORMAT, "%s/LATEST: names '%.64s', not a step-N directory", path,
                        text);
        else if ((s = ts_dir_kind(&run, text, &kind)) != TS_OK)
            ts_error_prefix("%s/LATEST names %s", path, text);
        else if (kind != 2)
            s = ts_fail(TS_ERR_NOT_FOUND, "%s/LATEST names %s, which is %s", path, text,
                        kind ? "not a directory" : "missing");
        else if ((size_t)snprintf(out, n, "%s/%s", path, text) >= n)
            s = ts_fail(TS_ERR_INVALID, "%s: path too long", path);
    }
    ts_dir_close(&run);
    free(text);
    return s;
}

/* ---- manifest parsing ------------------------------------------------------- */

static ts_status bad_field(const ts_ckpt *c, const char *what) {
    return ts_fail(TS_ERR_FORMAT, "%s/manifest.json: %s", c->dir, what);
}

static int get_dims(json_t *a, int64_t *dims, int *rank) {
    if (!json_is_array(a) || json_array_size(a) > TS_MAX_RANK) return 0;
    *rank = (int)json_array_size(a);
    for (int i = 0; i < *rank; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
        dims[i] = json_integer_value(v);
    }
    return 1;
}

static int find_file(const ts_ckpt *c, const char *name) {
    for (int i = 0; name && i < c->nf; i++)
        if (!strcmp(c->f[i].name, name)) return i;
    return -1;
}

static int cmp_start(const void *a, const void *b) {
    const ld_chunk *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

/* Flat chunks, sorted by start (the order the manifest lists them in does
 * not matter): no overlap, no gap, nothing outside. */
static ts_status check_flat_tiling(const ts_ckpt *c, ld_tensor *t) {
    qsort(t->chunks, (size_t)t->n_chunks, sizeof *t->chunks, cmp_start);
    const int64_t numel = ts_shape_numel(t->rank, t->dims);
    int64_t at = 0;
    for (int k = 0; k < t->n_chunks; k++) {
        const ld_chunk *ch = &t->chunks[k];
        if (ch->start < at)
            return ts_fail(TS_ERR_FORMAT,
                           "%s/manifest.json: tensor '%s': chunks overlap at element %lld", c->dir,
                           t->name, (long long)ch->start);
        if (ch->start > at)
            return ts_fail(TS_ERR_FORMAT,
                           "%s/manifest.json: tensor '%s': no chunk holds elements [%lld, %lld)",
                           c->dir, t->name, (long long)at, (long long)ch->start);
        if (ch->count > numel - ch->start)
            return ts_fail(TS_ERR_FORMAT,
                           "%s/manifest.json: tensor '%s': chunk [%lld, %lld) lies outside its "
                           "%lld elements",
                           c->dir, t->name, (long long)ch->start,
                           (long long)(ch->start + ch->count), (long long)numel);
        at = ch->start + ch->count;
    }
    if (at != numel)
        return ts_fail(TS_ERR_FORMAT,
                       "%s/manifest.json: tensor '%s': chunks hold %lld elements, the tensor %lld",
                       c->dir, t->name, (long long)at, (long long)numel);
    return TS_OK;
}

/* Chunks must lie inside the tensor and tile it exactly. */
static ts_status check_tiling(const ts_ckpt *c, ld_tensor *t) {
    int all_flat = 1, any_flat_form = 0;
    for (int k = 0; k < t->n_chunks; k++) {
        all_flat &= t->chunks[k].flat;
        any_flat_form |= !t->chunks[k].block;
    }
    if (all_flat) return check_flat_tiling(c, t);
    if (any_flat_form)
        return ts_fail(TS_ERR_FORMAT,
                       "%s/manifest.json: tensor '%s': mixes flat chunks with partial blocks",
                       c->dir, t->name);
    int64_t total = 0;
    for (int k = 0; k < t->n_chunks; k++) {
        const ld_chunk *ch = &t->chunks[k];
        int64_t numel = 1;
        for (int d = 0; d < t->rank; d++) {
            if (ch->off[d] < 0 || ch->shape[d] > t->dims[d] - ch->off[d])
                return ts_fail(TS_ERR_FORMAT,
                               "%s/manifest.json: tensor '%s': chunk %d lies outside the tensor",
                               c->dir, t->name, k);
            numel *= ch->shape[d];
        }
        total += numel;
        for (int j = 0; j < k && numel > 0; j++) {
            int overlap = 1;
            for (int d = 0; d < t->rank && overlap; d++)
                overlap = ch->off[d] < t->chunks[j].off[d] + t->chunks[j].shape[d] &&
                          t->chunks[j].off[d] < ch->off[d] + ch->shape[d];
            if (overlap)
                return ts_fail(TS_ERR_FORMAT,
                               "%s/manifest.json: tensor '%s': chunks %d and %d overlap", c->dir,
                               t->name, j, k);
        }
    }
    if (total != ts_shape_numel(t->rank, t->dims))
        return ts_fail(TS_ERR_FORMAT,
                       "%s/manifest.json: tensor '%s': chunks hold %lld elements, the tensor %lld",
                       c->dir, t->name, (long long)total,
                       (long long)ts_shape_numel(t->rank, t->dims));
    return TS_OK;
}

static ts_status parse_tensors(ts_ckpt *c) {
    json_t *ts = json_object_get(c->m, "tensors");
    if (!json_is_array(ts)) return bad_field(c, "\"tensors\" is missing or not an array");
    c->nt = (int)json_array_size(ts);
    c->t = ts_zalloc(sizeof *c->t * (size_t)(c->nt + 1), "ckpt tensors");
    if (!c->t) return TS_ERR_NOMEM;
    for (int i = 0; i < c->nt; i++) {
        json_t *e = json_array_get(ts, (size_t)i);
        ld_tensor *t = &c->t[i];
        t->name = json_string_value(json_object_get(e, "name"));
        const char *kind = json_string_value(json_object_get(e, "kind"));
        const char *dt = json_string_value(json_object_get(e, "dtype"));
        json_t *chunks = json_object_get(e, "chunks");
        int dtv = dt ? ts_dtype_parse(dt) : -1;
        if (!t->name || !kind || (strcmp(kind, "param") && strcmp(kind, "state")) || dtv < 0 ||
            !get_dims(json_object_get(e, "shape"), t->dims, &t->rank) || !json_is_array(chunks) ||
            json_array_size(chunks) == 0) {
            char msg[512];
            snprintf(msg, sizeof msg,
                     "tensor %d ('%s'): needs name, kind (param|state), dtype, shape and chunks", i,
                     t->name ? t->name : "?");
            return bad_field(c, msg);
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(c->t[j].name, t->name)) {
                char msg[512];
                snprintf(msg, sizeof msg, "tensor '%s' is listed twice", t->name);
                return bad_field(c, msg);
            }
        t->is_state = !strcmp(kind, "state");
        t->dtype = (ts_dtype)dtv;
        t->bytes = (size_t)ts_shape_numel(t->rank, t->dims) * ts_dtype_size(t->dtype);
        t->n_chunks = (int)json_array_size(chunks);
        t->chunks = ts_zalloc(sizeof *t->chunks * (size_t)t->n_chunks, "ckpt chunks");
        if (!t->chunks) return TS_ERR_NOMEM;
        for (int k = 0; k < t->n_chunks; k++) {
            json_t *ce = json_array_get(chunks, (size_t)k);
            ld_chunk *ch = &t->chunks[k];
            const char *crc = json_string_value(json_object_get(ce, "crc32c"));
            unsigned char cb[4];
            int ok;
            ch->file = find_file(c, json_string_value(json_object_get(ce, "file")));
            json_t *cnt = json_object_get(ce, "count");
            if (cnt) { /* flat form */
                json_t *st = json_object_get(ce, "start"), *fs = json_object_get(ce, "file_start");
                ch->tensor = json_string_value(json_object_get(ce, "tensor"));
                ok = ch->file >= 0 && ch->tensor && json_is_integer(cnt) && json_is_integer(st) &&
                     json_is_integer(fs) && json_integer_value(cnt) > 0 &&
                     json_integer_value(st) >= 0 && json_integer_value(fs) >= 0 &&
                     ck_unhex(crc, cb, 4);
                if (ok) {
                    ch->flat = 1;
                    ch->count = json_integer_value(cnt);
                    ch->start = json_integer_value(st);
                    ch->file_start = json_integer_value(fs);
                }
            } else {
                int r1 = 0, r2 = 0;
                ch->tensor = t->name;
                ch->block = 1;
                ok = ch->file >= 0 && get_dims(json_object_get(ce, "offset"), ch->off, &r1) &&
                     get_dims(json_object_get(ce, "shape"), ch->shape, &r2) && r1 == t->rank &&
                     r2 == t->rank && ck_unhex(crc, cb, 4);
                if (ok) {
                    int whole = 1;
                    for (int d = 0; d < t->rank; d++)
                        whole &= ch->off[d] == 0 && ch->shape[d] == t->dims[d];
                    ch->flat = whole;
                    ch->count = ts_shape_numel(t->rank, ch->shape);
                }
            }
            if (!ok) {
                char msg[512];
                snprintf(msg, sizeof msg,
                         "tensor '%s' chunk %d: needs a listed file, an 8-digit crc32c and either "
                         "offset and shape of rank %d or tensor, start, count and file_start",
                         t->name, k, t->rank);
                return bad_field(c, msg);
            }
            ch->crc = (uint32_t)cb[0] << 24 | (uint32_t)cb[1] << 16 | (uint32_t)cb[2] << 8 | cb[3];
            ch->bytes = (size_t)ch->count * ts_dtype_size(t->dtype);
        }
        ts_status s = check_tiling(c, t);
        if (s != TS_OK) return s;
    }
    return TS_OK;
}

static ts_status parse_manifest(ts_ckpt *c) {
    json_t *m = c->m;
    const char *fmt = json_string_value(json_object_get(m, "format"));
    if (!fmt || strcmp(fmt, "tessel-checkpoint"))
        return bad_field(c, "\"format\" is not \"tessel-checkpoint\"");
    /* 2: chunks in the flat form (sharded optimizer state) may occur. */
    json_int_t fv = json_integer_value(json_object_get(m, "format_version"));
    if (fv != 1 && fv != 2)
        return bad_field(c, "\"format_version\" is not 1 or 2 (written by a newer tessel?)");
    json_t *step = json_object_get(m, "step");
    ts_ckpt_info *in = &c->info;
    in->dir = c->dir;
    in->id = json_string_value(json_object_get(m, "id"));
    in->time = json_string_value(json_object_get(m, "time"));
    in->tessel_version = json_string_value(json_object_get(m, "tessel_version"));
    in->config_sha256 = json_string_value(json_object_get(m, "config_sha256"));
    json_t *rng = json_object_get(m, "rng"), *data = json_object_get(m, "data");
    const char *seed = json_string_value(json_object_get(rng, "seed"));
    if (!json_is_integer(step) || json_integer_value(step) < 0 || !in->id || !in->time ||
        !in->tessel_version || !in->config_sha256 || !seed || !json_is_object(data))
        return bad_field(c, "needs step, id, time, tessel_version, config_sha256, rng.seed, data");
    in->step = json_integer_value(step);
    /* Absent in checkpoints written before the update gate: every step
     * was applied then. */
    json_t *upd = json_object_get(m, "updates_applied");
    if (upd && (!json_is_integer(upd) || json_integer_value(upd) < 0 ||
                json_integer_value(upd) > in->step))
        return bad_field(c, "\"updates_applied\" is not an integer in [0, step]");
    in->updates_applied = upd ? json_integer_value(upd) : in->step;
    char *end;
    errno = 0;
    in->seed = strtoull(seed, &end, 10);
    if (errno || *end || !*seed) return bad_field(c, "rng.seed is not a decimal integer");
    in->data_position = json_integer_value(json_object_get(data, "position"));
    in->epoch = json_integer_value(json_object_get(data, "epoch"));
    json_t *dfiles = json_object_get(data, "files");
    c->nd = (int)json_array_size(dfiles);
    c->data = ts_zalloc(sizeof *c->data * (size_t)(c->nd + 1), "ckpt lineage");
    if (!c->data) return TS_ERR_NOMEM;
    for (int i = 0; i < c->nd; i++) {
        json_t *e = json_array_get(dfiles, (size_t)i);
        c->data[i].path = json_string_value(json_object_get(e, "path"));
        c->data[i].sha256 = json_string_value(json_object_get(e, "sha256"));
        if (!c->data[i].path || !c->data[i].sha256)
            return bad_field(c, "data.files[] needs path and sha256");
    }
    in->data_files = c->data;
    in->n_data_files = c->nd;
    /* PEFT: the frozen parameters are the base's (absent before it existed) */
    json_t *base = json_object_get(m, "base");
    in->base_path = json_string_value(json_object_get(base, "path"));
    in->base_sha256 = json_string_value(json_object_get(base, "sha256"));
    in->n_frozen = (int)json_integer_value(json_object_get(base, "frozen"));
    if (base &&
        (!in->base_path || !in->base_sha256 || strlen(in->base_sha256) != 64 || in->n_frozen < 0))
        return bad_field(c, "\"base\" needs path, a 64-digit sha256 and frozen >= 0");
    if (!base) in->base_path = in->base_sha256 = "", in->n_frozen = 0;
    json_t *world = json_object_get(m, "world");
    in->world_size = (int)json_integer_value(json_object_get(world, "size"));
    if (in->world_size < 1) return bad_field(c, "world.size must be >= 1");
    in->layout = json_string_value(json_object_get(world, "layout"));
    if (!in->layout) in->layout = "replicated";

    json_t *files = json_object_get(m, "files");
    if (!json_is_array(files)) return bad_field(c, "\"files\" is missing or not an array");
    c->nf = (int)json_array_size(files);
    c->f = ts_zalloc(sizeof *c->f * (size_t)(c->nf + 1), "ckpt files");
    if (!c->f) return TS_ERR_NOMEM;
    for (int i = 0; i < c->nf; i++) {
        json_t *e = json_array_get(files, (size_t)i);
        ld_file *f = &c->f[i];
        f->name = json_string_value(json_object_get(e, "name"));
        f->sha = json_string_value(json_object_get(e, "sha256"));
        json_t *b = json_object_get(e, "bytes");
        unsigned char tmp[32];
        /* A name is a plain file inside the checkpoint: a manifest must not
         * make us read (or trust) anything outside it. */
        if (!f->name || !*f->name || strchr(f->name, '/') || !strcmp(f->name, "..") ||
            !strcmp(f->name, ".") || !json_is_integer(b) || json_integer_value(b) < 0 ||
            !ck_unhex(f->sha, tmp, 32)) {
            char msg[256];
            snprintf(msg, sizeof msg, "files[%d] needs a plain file name, bytes and a sha256", i);
            return bad_field(c, msg);
        }
        f->bytes = (uint64_t)json_integer_value(b);
        if (!(f->path = ck_join(c->dir, f->name))) return TS_ERR_NOMEM;
    }
    in->n_files = c->nf;
    ts_status s = parse_tensors(c);
    if (s != TS_OK) return s;
    in->n_tensors = c->nt;
    for (int i = 0; i < c->nt; i++) in->bytes += c->t[i].bytes;
    return TS_OK;
}

static ts_status check_signature(ts_ckpt *c, const char *public_key) {
    json_t *sig = json_object_get(c->m, "signature");
    const char *alg = json_string_value(json_object_get(sig, "algorithm"));
    const char *signer = json_string_value(json_object_get(sig, "public_key"));
    const char *value = json_string_value(json_object_get(sig, "value"));
    c->info.is_signed = sig != NULL;
    c->info.signer = signer ? signer : "";
    if (sig && (!alg || strcmp(alg, "ed25519") || !signer || !value))
        return bad_field(c, "\"signature\" needs algorithm \"ed25519\", public_key and value");
    if (!public_key) return TS_OK;
    if (!sig)
        return ts_fail(TS_ERR_FORMAT,
                       "%s/manifest.json: not signed, but a public key was given to verify it",
                       c->dir);
    ck_key k;
    ts_status s = ck_key_load_public(public_key, &k);
    if (s != TS_OK) return s;
    char want[2 * CK_PK_BYTES + 1];
    ts_hex(k.pk, CK_PK_BYTES, want);
    if (strcmp(signer, want) != 0)
        return ts_fail(TS_ERR_FORMAT,
                       "%s/manifest.json: signed by key %.16s..., not by %s (%.16s...)", c->dir,
                       signer, public_key, want);
    char *canon = ck_canonical(c->m, "signature");
    if (!canon) return ts_fail(TS_ERR_NOMEM, "%s/manifest.json: out of memory", c->dir);
    int ok = ck_verify(k.pk, canon, strlen(canon), value);
    free(canon);
    if (!ok)
        return ts_fail(TS_ERR_FORMAT,
                       "%s/manifest.json: the signature does not verify: the manifest was changed "
                       "after it was signed",
                       c->dir);
    c->info.signature_ok = 1;
    return TS_OK;
}

/* ---- per-file verification --------------------------------------------------- */

/* The first tensor of file `fi` whose data fails its CRC (NULL if none). */
static const char *crc_culprit(ts_ckpt *c, int fi, int set_data, ts_status *err) {
    ld_file *f = &c->f[fi];
    for (int i = 0; i < c->nt; i++) {
        ld_tensor *t = &c->t[i];
        for (int k = 0; k < t->n_chunks; k++) {
            ld_chunk *ch = &t->chunks[k];
            if (ch->file != fi) continue;
            ts_st_tensor st;
            if (ts_st_find(f->st, ch->tensor, &st) != TS_OK) {
                *err = ts_fail(TS_ERR_FORMAT,
                               "%s: the manifest lists tensor '%s' in this file, "
                               "which does not hold it",
                               f->path, ch->tensor);
                return t->name;
            }
            int same = st.dtype == t->dtype;
            if (ch->block) {
                same &= st.rank == t->rank && st.bytes == ch->bytes;
                for (int d = 0; same && d < t->rank; d++) same = st.dims[d] == ch->shape[d];
            } else {
                same &= ch->count <= ts_shape_numel(st.rank, st.dims) - ch->file_start;
            }
            if (!same) {
                *err = ts_fail(TS_ERR_FORMAT,
                               "%s: tensor '%s' has a different dtype or shape than the manifest "
                               "lists for '%s'",
                               f->path, ch->tensor, t->name);
                return t->name;
            }
            const unsigned char *data =
                (const unsigned char *)st.data + (size_t)ch->file_start * ts_dtype_size(t->dtype);
            if (ts_crc32c(0, data, ch->bytes) != ch->crc) return t->name;
            if (set_data) ch->data = data;
        }
    }
    return NULL;
}

static ts_status verify_file(ts_ckpt *c, int fi) {
    ld_file *f = &c->f[fi];
    struct stat st;
    if (stat(f->path, &st) != 0)
        return ts_fail(TS_ERR_IO, "%s: listed in the manifest but cannot be read: %s", f->path,
                       strerror(errno));
    if ((uint64_t)st.st_size != f->bytes)
        return ts_fail(TS_ERR_FORMAT,
                       "%s: %lld bytes, the manifest says %llu (truncated or "
                       "replaced)",
                       f->path, (long long)st.st_size, (unsigned long long)f->bytes);
    /* One read of the file: mapped once, hashed from the mapping (while
     * the rest is read ahead), then each tensor's CRC from the same pages. */
    char sha[CK_SHA_HEX];
    ts_status s = ts_st_open(f->path, &f->st);
    if (s != TS_OK) {
        char *why = ts_strdup(ts_last_error());
        ts_status h = ts_sha256_path(f->path, sha, NULL);
        int bad_sha = h == TS_OK && strcmp(sha, f->sha) != 0;
        ts_fail(s, "%s", why ? why : "cannot open");
        free(why);
        if (bad_sha) ts_error_prefix("%s: SHA-256 does not match the manifest", f->path);
        return s;
    }
    size_t raw_n;
    const void *raw = ts_st_raw(f->st, &raw_n);
    if ((s = ts_sha256_mem(raw, raw_n, sha)) != TS_OK) return s;
    int sha_ok = strcmp(sha, f->sha) == 0;
    ts_status err = TS_OK;
    const char *bad = crc_culprit(c, fi, sha_ok, &err);
    if (err != TS_OK) return err;
    if (bad)
        return ts_fail(TS_ERR_FORMAT,
                       "%s: tensor '%s' fails its CRC-32C%s: the data was changed after the "
                       "checkpoint was saved",
                       f->path, bad, sha_ok ? "" : " and the file its SHA-256");
    if (!sha_ok)
        return ts_fail(TS_ERR_FORMAT,
                       "%s: SHA-256 %.16s... does not match the manifest's %.16s... (every "
                       "tensor's CRC matches: the header was changed)",
                       f->path, sha, f->sha);
    return TS_OK;
}

static void *file_worker(void *arg) {
    ts_ckpt *c = arg;
    for (;;) {
        int k = atomic_fetch_add(&c->next_file, 1);
        if (k >= c->nf) break;
        c->f[k].status = verify_file(c, k);
        if (c->f[k].status != TS_OK)
            snprintf(c->f[k].err, sizeof c->f[k].err, "%s", ts_last_error());
    }
    return NULL;
}

static ts_status verify_files(ts_ckpt *c) {
    /* Twice the cores: a thread waiting for its file's pages leaves its
     * core to another's hashing. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = (int)(ncpu < 1 ? 2 : ncpu > 4 ? 8 : 2 * ncpu);
    if (threads > c->nf) threads = c->nf;
    pthread_t th[8];
    int started = 0;
    atomic_store(&c->next_file, 0);
    for (; started < threads - 1; started++)
        if (pthread_create(&th[started], NULL, file_worker, c) != 0) break;
    file_worker(c);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (int k = 0; k < c->nf; k++)
        if (c->f[k].status != TS_OK) return ts_fail(c->f[k].status, "%s", c->f[k].err);
    return TS_OK;
}

/* ---- open / close -------------------------------------------------------------- */

void ts_ckpt_close(ts_ckpt *c) {
    if (!c) return;
    for (int i = 0; i < c->nf; i++) {
        ts_st_close(c->f[i].st);
        free(c->f[i].path);
    }
    free(c->f);
    for (int i = 0; i < c->nt; i++) free(c->t[i].chunks);
    free(c->t);
    free(c->data);
    json_decref(c->m);
    free(c->text);
    free(c->dir);
    free(c);
}

/* A checkpoint inside a run directory must be where it was saved
 * (rollback.c); `latest`: reached through LATEST. */
static ts_status check_placement(ts_ckpt *c, int latest) {
    char *parent = ts_strdup(c->dir);
    if (!parent) return ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/') parent[--n] = '\0';
    char *slash = strrchr(parent, '/');
    const char *name = slash ? slash + 1 : parent;
    const char *run_path = slash ? (slash == parent ? "/" : parent) : ".";
    if (slash && slash != parent) *slash = '\0';
    ts_status s = TS_OK;
    if (strncmp(name, "step-", 5) == 0) {
        char nm[256];
        snprintf(nm, sizeof nm, "%s", name);
        if (slash == parent) run_path = "/";
        ts_dir run;
        ck_log_view v;
        int have = 0;
        s = ts_dir_open(&run, run_path, TS_DIR_FOLLOW);
        if (s == TS_OK) {
            s = ck_log_view_read(&run, &v);
            have = s == TS_OK;
            if (s == TS_ERR_NOT_FOUND) s = TS_OK;
            ts_dir_close(&run);
        } else if (s == TS_ERR_NOT_FOUND) {
            s = TS_OK;
        }
        if (s == TS_OK)
            s = ck_check_placement(have ? &v : NULL, run_path, nm, c->text, c->m, latest);
        if (have) ck_log_view_free(&v);
    }
    free(parent);
    return s;
}

static ts_status open_verified(const char *path, const char *public_key, ts_ckpt **out) {
    char dir[4096];
    ts_status s = ts_ckpt_resolve(path, dir, sizeof dir);
    if (s != TS_OK) return s;
    ts_ckpt *c = ts_zalloc(sizeof *c, "checkpoint");
    if (!c) return TS_ERR_NOMEM;
    *out = c;
    if (!(c->dir = ts_strdup(dir))) return ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
    char *mp = ck_join(dir, "manifest.json");
    if (!mp) return TS_ERR_NOMEM;
    s = ck_read_file(mp, MANIFEST_MAX, &c->text, NULL);
    if (s == TS_OK) {
        json_error_t je;
        c->m = json_loads(c->text, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(c->m))
            s = ts_fail(TS_ERR_FORMAT,
                        "%s: not a valid manifest (line %d, column %d: %s): truncated or edited",
                        mp, je.line, je.column, c->m ? "not an object" : je.text);
    }
    free(mp);
    if (s == TS_OK) s = parse_manifest(c);
    if (s == TS_OK) s = check_signature(c, public_key);
    if (s == TS_OK) s = check_placement(c, strcmp(dir, path) != 0);
    if (s == TS_OK) s = verify_files(c);
    return s;
}

ts_status ts_ckpt_open(const char *path, const char *public_key, ts_audit *audit, ts_ckpt **out) {
    if (!path || !out) return ts_fail(TS_ERR_INVALID, "ckpt open: NULL argument");
    *out = NULL;
    ts_ckpt *c = NULL;
    ts_status s = open_verified(path, public_key, &c);
    if (audit) {
        const char *sig = !c || !c->info.is_signed ? "absent"
                          : c->info.signature_ok   ? "verified"
                                                   : "unchecked";
        json_t *f = json_pack("{s:s, s:b, s:s}", "dir", c && c->dir ? c->dir : path, "ok",
                              s == TS_OK, "signature", sig);
        if (f && c && s == TS_OK) {
            json_object_set_new(f, "step", json_integer(c->info.step));
            json_object_set_new(f, "id", json_string(c->info.id));
        }
        if (f && s != TS_OK) json_object_set_new(f, "error", json_string(ts_last_error()));
        /* Keep the verification's message: it is what the caller reports. */
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", ts_last_error());
        ts_status as = ck_audit_event(audit, "verify", f);
        if (s != TS_OK)
            ts_fail(s, "%s", saved);
        else
            s = as;
    }
    if (s != TS_OK) {
        ts_ckpt_close(c);
        return s;
    }
    *out = c;
    return TS_OK;
}

/* ---- reading --------------------------------------------------------------------- */

ts_status ts_ckpt_get_info(const ts_ckpt *c, ts_ckpt_info *info) {
    if (!c || !info) return ts_fail(TS_ERR_INVALID, "ckpt info: NULL argument");
    *info = c->info;
    return TS_OK;
}

const char *ts_ckpt_manifest(const ts_ckpt *c) {
    return c ? c->text : NULL;
}

int ts_ckpt_tensor_count(const ts_ckpt *c) {
    return c ? c->nt : 0;
}

ts_status ts_ckpt_tensor_info(const ts_ckpt *c, int i, ts_ckpt_tensor *out) {
    if (!c || !out) return ts_fail(TS_ERR_INVALID, "ckpt tensor info: NULL argument");
    if (i < 0 || i >= c->nt)
        return ts_fail(TS_ERR_INVALID, "ckpt tensor info: index %d out of range [0, %d)", i, c->nt);
    const ld_tensor *t = &c->t[i];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->is_state = t->is_state;
    out->dtype = t->dtype;
    out->rank = t->rank;
    memcpy(out->dims, t->dims, sizeof out->dims);
    out->bytes = t->bytes;
    out->n_chunks = t->n_chunks;
    return TS_OK;
}

ts_status ts_ckpt_chunk_info(const ts_ckpt *c, int i, int k, ts_ckpt_chunk *out) {
    if (!c || !out) return ts_fail(TS_ERR_INVALID, "ckpt chunk info: NULL argument");
    if (i < 0 || i >= c->nt || k < 0 || k >= c->t[i].n_chunks)
        return ts_fail(TS_ERR_INVALID, "ckpt chunk info: tensor %d chunk %d out of range", i, k);
    const ld_chunk *ch = &c->t[i].chunks[k];
    out->file = c->f[ch->file].name;
    out->tensor = ch->tensor;
    out->start = ch->flat ? ch->start : -1;
    out->count = ch->count;
    out->file_start = ch->file_start;
    return TS_OK;
}

const ld_tensor *ck_find_tensor(const ts_ckpt *c, const char *name) {
    for (int i = 0; name && i < c->nt; i++)
        if (!strcmp(c->t[i].name, name)) return &c->t[i];
    return NULL;
}

/* Copy each chunk's rows to their place in the row-major whole. */
void ck_assemble(const ld_tensor *t, unsigned char *dst) {
    size_t esz = ts_dtype_size(t->dtype);
    for (int k = 0; k < t->n_chunks; k++) {
        const ld_chunk *ch = &t->chunks[k];
        if (ch->flat) {
            memcpy(dst + (size_t)ch->start * esz, ch->data, ch->bytes);
            continue;
        }
        int last = t->rank - 1;
        size_t row = (size_t)ch->shape[last] * esz;
        int64_t rows = ts_shape_numel(last, ch->shape), idx[TS_MAX_RANK] = {0};
        for (int64_t r = 0; r < rows && row > 0; r++) {
            int64_t lin = 0; /* element index of (off + idx) in the whole tensor */
            for (int d = 0; d < t->rank; d++)
                lin = lin * t->dims[d] + ch->off[d] + (d < last ? idx[d] : 0);
            memcpy(dst + (size_t)lin * esz, ch->data + (size_t)r * row, row);
            for (int d = last - 1; d >= 0; d--) {
                if (++idx[d] < ch->shape[d]) break;
                idx[d] = 0;
            }
        }
    }
}

static int all_flat(const ld_tensor *t) {
    for (int k = 0; k < t->n_chunks; k++)
        if (!t->chunks[k].flat) return 0;
    return 1;
}

/* Elements [start, start + count) of t: the overlapping parts of its flat
 * chunks, or a slice of the whole for partial blocks. */
ts_status ck_read_range(const ld_tensor *t, int64_t start, int64_t count, unsigned char *dst) {
    const size_t esz = ts_dtype_size(t->dtype);
    if (!all_flat(t)) {
        unsigned char *whole = ts_alloc(t->bytes ? t->bytes : 1, "ckpt read range");
        if (!whole) return TS_ERR_NOMEM;
        ck_assemble(t, whole);
        memcpy(dst, whole + (size_t)start * esz, (size_t)count * esz);
        free(whole);
        return TS_OK;
    }
    for (int k = 0; k < t->n_chunks; k++) {
        const ld_chunk *ch = &t->chunks[k];
        int64_t a = ch->start > start ? ch->start : start;
        int64_t b = ch->start + ch->count < start + count ? ch->start + ch->count : start + count;
        if (a < b)
            memcpy(dst + (size_t)(a - start) * esz, ch->data + (size_t)(a - ch->start) * esz,
                   (size_t)(b - a) * esz);
    }
    return TS_OK;
}

ts_status ts_ckpt_read_range(const ts_ckpt *c, const char *name, int64_t start, int64_t count,
                             void *dst) {
    if (!c || !dst) return ts_fail(TS_ERR_INVALID, "ckpt read range: NULL argument");
    const ld_tensor *t = ck_find_tensor(c, name);
    if (!t) return ts_fail(TS_ERR_NOT_FOUND, "%s: no tensor '%s'", c->dir, name ? name : "");
    const int64_t numel = ts_shape_numel(t->rank, t->dims);
    if (start < 0 || count < 0 || count > numel - start)
        return ts_fail(TS_ERR_INVALID,
                       "%s: tensor '%s' has %lld elements; [%lld, %lld) lies outside", c->dir, name,
                       (long long)numel, (long long)start, (long long)(start + count));
    return ck_read_range(t, start, count, dst);
}

ts_status ts_ckpt_read(const ts_ckpt *c, const char *name, void *dst, size_t bytes) {
    if (!c || !dst) return ts_fail(TS_ERR_INVALID, "ckpt read: NULL argument");
    const ld_tensor *t = ck_find_tensor(c, name);
    if (!t) return ts_fail(TS_ERR_NOT_FOUND, "%s: no tensor '%s'", c->dir, name ? name : "");
    if (bytes != t->bytes)
        return ts_fail(TS_ERR_INVALID, "%s: tensor '%s' is %zu bytes, %zu given", c->dir, name,
                       t->bytes, bytes);
    ck_assemble(t, dst);
    return TS_OK;
}
