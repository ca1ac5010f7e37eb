/* Saving checkpoints: snapshot, shards, manifest, signature and the commit
 * protocol (docs/checkpoints.md).
 *
 * ts_ckpt_saver_begin() copies the plan's persistent regions into a host
 * buffer (that copy is the whole stall the training loop sees) and hands
 * the buffer to a background thread, which
 *   1. writes the shards into RUN/step-N.tmp/ (save_shards.c) — several
 *      files written and hashed by parallel threads, each fsync'ed,
 *   2. writes and fsyncs manifest.json (signed), fsyncs the directory,
 *   3. renames step-N.tmp to step-N and fsyncs RUN,
 *   4. writes LATEST.tmp, fsyncs it, renames it over LATEST, fsyncs RUN,
 *   5. logs the save to the audit log and applies retention.
 * A crash at any moment leaves LATEST naming the previous checkpoint or
 * the new one, and both complete; leftovers are "*.tmp" names that resume
 * ignores and ts_ckpt_gc() removes.
 *
 * With ZeRO every rank runs step 1 for its blocks of the optimizer state
 * and publishes rank-K.json; rank 0 waits for them, then goes on with 2.
 * The manifest lists logical per-parameter tensors (zero.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt/pipe.h"
#include "ckpt/safetensors.h"
#include "ckpt_internal.h"
#include "core/dirlock.h"
#include "core/fsat.h"
#include "core/crc32c.h"
#include "ckpt/save_internal.h"
#include "tessel/tessel.h"

ts_status ts_ckpt_saver_set_replay(ts_ckpt_saver *s, const char *json_object) {
    if (!s) return ts_fail(TS_ERR_INVALID, "set_replay: saver is NULL");
    if (s->running)
        return ts_fail(TS_ERR_INVALID, "set_replay: a save is running; call it before the first");
    char *copy = json_object ? ts_strdup(json_object) : NULL;
    if (json_object && !copy) return ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
    free(s->replay);
    s->replay = copy;
    return TS_OK;
}

ts_status ts_ckpt_saver_set_tag(ts_ckpt_saver *s, const char *tag) {
    if (!s || !tag) return ts_fail(TS_ERR_INVALID, "ckpt tag: NULL argument");
    size_t n = strlen(tag);
    if (n >= sizeof s->tag_next || strspn(tag, "abcdefghijklmnopqrstuvwxyz0123456789_") != n)
        return ts_fail(TS_ERR_INVALID, "ckpt tag '%.60s': use 1-47 of a-z, 0-9 and _", tag);
    memcpy(s->tag_next, tag, n + 1);
    return TS_OK;
}

ts_ckpt_options ts_ckpt_options_default(void) {
    ts_ckpt_options o;
    memset(&o, 0, sizeof o);
    return o;
}

static void job_clear(ts_ckpt_saver *s) {
    for (int i = 0; i < s->nt; i++) free(s->t[i].name);
    free(s->t);
    s->t = NULL;
    s->nt = 0;
    for (int i = 0; i < s->ns; i++) free(s->shards[i].members);
    free(s->shards);
    s->shards = NULL;
    s->ns = 0;
    for (int i = 0; i < s->npc; i++) free(s->pc[i].name);
    free(s->pc);
    s->pc = NULL;
    s->npc = 0;
    for (int i = 0; i < s->nzp; i++) free(s->zparams[i]);
    free(s->zparams);
    s->zparams = NULL;
    s->nzp = 0;
    s->zero = s->others_save = 0;
    s->other_bytes = 0;
    for (int i = 0; i < s->n_data; i++) {
        free(s->data_paths[i]);
        free(s->data_shas[i]);
    }
    free(s->data_paths);
    free(s->data_shas);
    s->data_paths = s->data_shas = NULL;
    s->n_data = 0;
}

/* (Re)allocate the snapshot buffer. With `prefault`, touch every page now:
 * first-touch page faults on ~300 MB cost about as much as the copy, and
 * belong at start-up rather than in a step's stall. */
static ts_status ensure_buffer(ts_ckpt_saver *s, size_t need, int prefault) {
    if (s->buf && need == s->buf_bytes) return TS_OK;
    ts_aligned_free(s->buf);
    s->buf_bytes = 0;
    if (!(s->buf = ts_aligned_alloc(need ? need : TS_ALIGN, "checkpoint snapshot buffer")))
        return TS_ERR_NOMEM;
    if (prefault) memset(s->buf, 0, need);
    s->buf_bytes = need;
    return TS_OK;
}

ts_status ts_ckpt_saver_new(const char *run_dir, const ts_plan *p, const ts_ckpt_options *opt,
                            ts_ckpt_saver **out) {
    if (!run_dir || !*run_dir || !out) return ts_fail(TS_ERR_INVALID, "ckpt saver: NULL argument");
    *out = NULL;
    ts_ckpt_options o = opt ? *opt : ts_ckpt_options_default();
    if (o.keep_last < 0 || o.keep_every < 0 || o.threads < 0)
        return ts_fail(TS_ERR_INVALID,
                       "ckpt saver: keep_last, keep_every and threads must be >= 0");
    if (o.world < 0 || o.rank < 0 || (o.world > 1 && o.rank >= o.world) ||
        (o.world <= 1 && o.rank > 0))
        return ts_fail(TS_ERR_INVALID, "ckpt saver: rank %d of world %d", o.rank, o.world);
    ts_ckpt_saver *s = ts_zalloc(sizeof *s, "ckpt saver");
    if (!s) return TS_ERR_NOMEM;
    pthread_mutex_init(&s->wmu, NULL);
    pthread_cond_init(&s->wcv, NULL);
    pthread_cond_init(&s->bcv, NULL);
    /* Ranks > 0 write into rank 0's run directory and must not create it:
     * they open it at their first save (rank 0 may not have made it yet). */
    s->run.fd = -1;
    ts_status ds = o.rank == 0 ? ts_dir_open(&s->run, run_dir, TS_DIR_CREATE) : TS_OK;
    if (ds != TS_OK) {
        free(s);
        return ds;
    }
    if (!(s->run_dir = ts_strdup(run_dir))) {
        ts_dir_close(&s->run);
        free(s);
        return ts_fail(TS_ERR_NOMEM, "ckpt saver: out of memory");
    }
    if (o.sign_key) {
        ts_status st = ck_key_load_secret(o.sign_key, &s->key);
        if (st != TS_OK) {
            ts_dir_close(&s->run);
            free(s->run_dir);
            free(s);
            return st;
        }
    }
    /* Twice the cores: a thread blocked in fsync leaves its core to
     * another thread's hashing. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s->threads = o.threads > 0 ? o.threads : (int)(ncpu < 1 ? 2 : ncpu > 4 ? 8 : 2 * ncpu);
    s->keep_last = o.keep_last;
    s->keep_every = o.keep_every;
    s->audit = o.rank == 0 ? o.audit : NULL;
    s->background = 1;
    s->rank = o.rank;
    s->world = o.world > 1 ? o.world : 1;
    s->group = o.group;
    s->rank_timeout_s = o.rank_timeout_s > 0 ? o.rank_timeout_s : 600;
    if (o.base_path && o.base_path[0]) {
        if (strlen(o.base_path) >= sizeof s->base_path || !o.base_sha256 ||
            strlen(o.base_sha256) != CK_SHA_HEX - 1) {
            ts_ckpt_saver_free(s);
            return ts_fail(TS_ERR_INVALID,
                           "ckpt saver: base '%.200s' needs a path under %zu bytes and a "
                           "64-digit sha256",
                           o.base_path, sizeof s->base_path);
        }
        snprintf(s->base_path, sizeof s->base_path, "%s", o.base_path);
        snprintf(s->base_sha, sizeof s->base_sha, "%s", o.base_sha256);
    }
    if (o.rank > 0) s->keep_last = s->keep_every = 0;
    if (p && ensure_buffer(s, ts_plan_snapshot_bytes(p), 1) != TS_OK) {
        ts_ckpt_saver_free(s);
        return TS_ERR_NOMEM;
    }
    *out = s;
    return TS_OK;
}

/* ---- manifest ------------------------------------------------------------ */

/* Build the manifest and return its on-disk text (sorted keys, indented;
 * the signature covers the compact sorted form without "signature"). */
/* The logical tensors of sharded state: one entry per name of the sorted
 * chunk set, with every rank's chunks. */
static int add_logical(json_t *tensors, const ck_zset *z, const ts_ckpt_saver *s) {
    int bad = 0;
    for (int i = 0; i < z->nc && !bad;) {
        const ck_zchunk *c0 = &z->c[i];
        int param = 0; /* ZeRO-3's parameters */
        for (int k = 0; k < s->nzp && !param; k++) param = !strcmp(s->zparams[k], c0->name);
        json_t *chunks = json_array();
        int j = i;
        for (; j < z->nc && !strcmp(z->c[j].name, c0->name) && chunks; j++)
            bad |= json_array_append_new(chunks, ck_zchunk_json(&z->c[j]));
        bad |= !chunks ||
               json_array_append_new(
                   tensors, json_pack("{s:s, s:s, s:s, s:o, s:o}", "name", c0->name, "kind",
                                      param ? "param" : "state", "dtype", ts_dtype_name(c0->dtype),
                                      "shape", ck_int_array(c0->dims, c0->ndim), "chunks", chunks));
        i = j;
    }
    return bad;
}

/* z: with ZeRO, the files and chunks of sharded state of every rank. */
static ts_status build_manifest(ts_ckpt_saver *s, const ck_zset *z, const char *dir_name,
                                char **out, char id[33]) {
    *out = NULL;
    unsigned char rnd[16];
    randombytes_buf(rnd, sizeof rnd);
    ts_hex(rnd, sizeof rnd, id);
    char now[32], seed[24];
    ck_utc_now(now);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)s->seed);
    json_t *m = json_object(), *files = json_array(), *tensors = json_array(),
           *dfiles = json_array();
    int bad = !m || !files || !tensors || !dfiles;
    if (!bad) {
        bad |= json_object_set_new(m, "format", json_string("tessel-checkpoint"));
        bad |= json_object_set_new(m, "format_version", json_integer(z ? 2 : 1));
        bad |= json_object_set_new(m, "id", json_string(id));
        bad |= json_object_set_new(m, "step", json_integer(s->step));
        /* Bound by the signature: a checkpoint renamed or copied in under
         * another name is told apart on load (docs/checkpoints.md). */
        bad |= json_object_set_new(m, "dir", json_string(dir_name));
        bad |= json_object_set_new(m, "updates_applied", json_integer(s->updates_applied));
        if (s->tag[0]) bad |= json_object_set_new(m, "tag", json_string(s->tag));
        bad |= json_object_set_new(m, "time", json_string(now));
        bad |= json_object_set_new(m, "tessel_version", json_string(TESSEL_VERSION));
        bad |= json_object_set_new(m, "config_sha256", json_string(s->config_sha));
        if (s->replay) { /* what `tessel audit replay` needs (ts_ckpt_meta) */
            json_t *r = json_loads(s->replay, 0, NULL);
            bad |= !r || json_object_set_new(m, "replay", r);
        }
        bad |= json_object_set_new(m, "rng",
                                   json_pack("{s:s, s:s, s:I}", "algorithm", "philox4x32-10",
                                             "seed", seed, "step", (json_int_t)s->step));
        for (int i = 0; i < s->n_data && !bad; i++)
            bad |= json_array_append_new(dfiles, json_pack("{s:s, s:s}", "path", s->data_paths[i],
                                                           "sha256", s->data_shas[i]));
        if (s->base_path[0] && !bad) {
            /* the base is lineage too: the model was trained on its weights */
            bad |= json_array_append_new(dfiles,
                                         json_pack("{s:s, s:s, s:s}", "path", s->base_path,
                                                   "sha256", s->base_sha, "role", "peft.base"));
            bad |= json_object_set_new(m, "base",
                                       json_pack("{s:s, s:s, s:i}", "path", s->base_path, "sha256",
                                                 s->base_sha, "frozen", s->n_frozen));
        }
        bad |= json_object_set_new(m, "data",
                                   json_pack("{s:O, s:I, s:I}", "files", dfiles, "position",
                                             (json_int_t)s->data_position, "epoch",
                                             (json_int_t)s->epoch));
        bad |= json_object_set_new(
            m, "world",
            json_pack("{s:i, s:s}", "size", z ? s->world : 1, "layout", z ? "zero" : "replicated"));
        for (int k = 0; k < s->ns && !bad; k++)
            if (!z || !s->shards[k].sharded)
                bad |= json_array_append_new(files, json_pack("{s:s, s:i, s:I, s:s}", "name",
                                                              s->shards[k].file, "rank", 0, "bytes",
                                                              (json_int_t)s->shards[k].file_bytes,
                                                              "sha256", s->shards[k].sha));
        for (int k = 0; z && k < z->nf && !bad; k++)
            bad |= json_array_append_new(
                files, json_pack("{s:s, s:i, s:I, s:s}", "name", z->f[k].name, "rank", z->f[k].rank,
                                 "bytes", (json_int_t)z->f[k].bytes, "sha256", z->f[k].sha));
        bad |= json_object_set(m, "files", files);
        for (int i = 0; i < s->nt && !bad; i++) {
            const sv_tensor *t = &s->t[i];
            if (t->skip || (z && t->sharded)) continue;
            char crc[9];
            snprintf(crc, sizeof crc, "%08x", t->crc);
            int64_t zero[TS_MAX_RANK] = {0};
            json_t *chunk = json_pack("{s:s, s:i, s:o, s:o, s:s}", "file", s->shards[t->shard].file,
                                      "rank", 0, "offset", ck_int_array(zero, t->rank), "shape",
                                      ck_int_array(t->dims, t->rank), "crc32c", crc);
            bad |= json_array_append_new(
                tensors,
                json_pack("{s:s, s:s, s:s, s:o, s:[o]}", "name", t->name, "kind",
                          t->is_state ? "state" : "param", "dtype", ts_dtype_name(t->dtype),
                          "shape", ck_int_array(t->dims, t->rank), "chunks", chunk));
        }
        if (z && !bad) bad |= add_logical(tensors, z, s);
        bad |= json_object_set(m, "tensors", tensors);
        if (s->audit && !bad) {
            int64_t aseq;
            char ahash[CK_SHA_HEX];
            ck_audit_head(s->audit, &aseq, ahash);
            bad |= json_object_set_new(
                m, "audit_head", json_pack("{s:I, s:s}", "seq", (json_int_t)aseq, "sha256", ahash));
            /* The run's identity: its audit log's first line. */
            char gen[CK_SHA_HEX];
            ck_audit_genesis(s->audit, gen);
            if (gen[0]) bad |= json_object_set_new(m, "run", json_string(gen));
            /* Its "commit" entry precedes the rename (run_job): the log then
             * holds every committed checkpoint (rollback.c). */
            bad |= json_object_set_new(m, "audit_commit", json_true());
        }
    }
    if (!bad && s->key.has_secret) {
        char *canon = ck_canonical(m, NULL);
        char pk[2 * CK_PK_BYTES + 1], sig[2 * CK_SIG_BYTES + 1];
        bad |= !canon;
        if (canon) {
            ck_sign(&s->key, canon, strlen(canon), sig);
            ts_hex(s->key.pk, CK_PK_BYTES, pk);
            bad |= json_object_set_new(m, "signature",
                                       json_pack("{s:s, s:s, s:s}", "algorithm", "ed25519",
                                                 "public_key", pk, "value", sig));
        }
        free(canon);
    }
    char *text = bad ? NULL : json_dumps(m, JSON_SORT_KEYS | JSON_INDENT(1));
    json_decref(m);
    json_decref(files);
    json_decref(tensors);
    json_decref(dfiles);
    if (!text) return ts_fail(TS_ERR_NOMEM, "%s: cannot build the manifest", s->run_dir);
    *out = text;
    return TS_OK;
}

/* ---- commit ---------------------------------------------------------------- */

/* Move the finished directory to its final name. A directory already there
 * (the same step saved again after a resume) is swapped out atomically, so
 * LATEST never names a missing directory, and then removed. */
static ts_status move_into_place(const ts_dir *run, const char *tmp, const char *final) {
    int kind;
    ts_status s = ts_dir_kind(run, final, &kind);
    if (s != TS_OK) return s;
    if (kind == 0) return ts_dir_rename(run, tmp, final);
    if ((s = ts_dir_exchange(run, tmp, final)) != TS_OK) {
        ts_error_prefix("%s/%s exists and cannot be replaced", run->path, final);
        return s;
    }
    return ts_dir_remove_flat(run, tmp); /* now the old one */
}

static ts_status write_latest(const ts_dir *run, const char *step_name) {
    char line[64];
    snprintf(line, sizeof line, "%s\n", step_name);
    ts_status s = ts_dir_replace(run, "LATEST", line, strlen(line), 0644, 1);
    if (s == TS_OK) s = ts_dir_sync(run);
    return s;
}

static ts_status gc_upto(const ts_dir *run, int keep_last, int keep_every, int64_t tmp_upto,
                         int *removed);

/* This rank's files of sharded state and the chunks of logical tensors
 * they hold, with each chunk's CRC-32C (from the snapshot, the bytes
 * written). */
static ts_status own_chunks(ts_ckpt_saver *s, ck_zset *z) {
    ts_status st = TS_OK;
    for (int k = 0; k < s->ns && st == TS_OK; k++)
        if (s->shards[k].sharded)
            st = ck_zset_add_file(z, s->shards[k].file, s->shards[k].file_bytes, s->shards[k].sha,
                                  s->rank);
    for (int i = 0; i < s->npc && st == TS_OK; i++) {
        const sv_piece *pc = &s->pc[i];
        const sv_tensor *t = &s->t[pc->tensor];
        const size_t es = ts_dtype_size(t->dtype);
        ck_zchunk c;
        memset(&c, 0, sizeof c);
        c.name = pc->name;
        c.dtype = t->dtype;
        c.ndim = pc->ndim;
        memcpy(c.dims, pc->dims, sizeof c.dims);
        c.file = s->shards[t->shard].file;
        c.tensor = t->name;
        c.start = pc->param_off;
        c.count = pc->count;
        c.file_start = pc->state_off;
        c.crc =
            ts_crc32c(0, src_at(s, t->off) + (size_t)pc->state_off * es, (size_t)pc->count * es);
        c.rank = s->rank;
        st = ck_zset_add_chunk(z, &c);
    }
    return st;
}

static ts_status run_job(ts_ckpt_saver *s) {
    char step_name[96], tmp_name[104];
    ck_step_name(step_name, s->step);
    /* A tagged checkpoint is step-N-TAG: not a step-N name, so retention
     * and LATEST leave it alone. */
    if (s->tag[0]) snprintf(step_name + strlen(step_name), 56, "-%s", s->tag);
    snprintf(tmp_name, sizeof tmp_name, "%s.tmp", step_name);
    /* Every name is reached relative to the run directory's descriptor
     * without following links (core/fsat.h): a link planted as step-N.tmp,
     * step-N, LATEST or LATEST.tmp is an error naming it. */
    char *final = ck_join(s->run_dir, step_name);
    char *manifest = NULL, id[33] = "";
    ts_status st = final ? TS_OK : TS_ERR_NOMEM;
    ts_dir tmp = {-1, NULL};
    ck_zset z = {0};
    if (st == TS_OK && s->run.fd < 0) st = ts_dir_open(&s->run, s->run_dir, 0);
    if (s->zero) {
        /* Every rank writes into the same directory, in any order: it is
         * never removed here (rank 0 removes what is not this save's just
         * before the manifest; see zero.c). */
        if (st == TS_OK) st = ts_dir_mkdir(&s->run, tmp_name, 1);
        if (st == TS_OK) st = ts_dir_sub(&tmp, &s->run, tmp_name, 0);
        if (st == TS_OK) st = ck_plan_shards(s);
        if (st == TS_OK) st = ck_write_shards(s, &tmp);
        if (st == TS_OK) st = own_chunks(s, &z);
        if (st == TS_OK && s->rank > 0) {
            st = ck_rank_publish(tmp.path, s->rank, s->world, s->group, s->step, &z);
            if (st == TS_OK)
                snprintf(s->done.dir, sizeof s->done.dir, "%s", step_name);
            else
                ts_error_prefix("checkpoint %s/%s, rank %d", s->run_dir, tmp_name, s->rank);
            ck_zset_free(&z);
            ts_dir_close(&tmp);
            free(final);
            return st;
        }
        if (st == TS_OK)
            st = ck_rank_collect(tmp.path, s->world, s->group, s->step, s->rank_timeout_s,
                                 &s->cancel, &z);
        if (st == TS_OK) st = ck_zset_check(&z, tmp.path);
        s->other_bytes = 0; /* the save's size counts every rank's state */
        for (int i = 0; st == TS_OK && i < z.nc; i++)
            if (z.c[i].rank != s->rank)
                s->other_bytes += (uint64_t)z.c[i].count * ts_dtype_size(z.c[i].dtype);
        if (st == TS_OK) {
            const char **own = ts_alloc(sizeof(char *) * (size_t)(s->ns + 1), "ckpt");
            if (!own) st = TS_ERR_NOMEM;
            for (int k = 0; own && k < s->ns; k++) own[k] = s->shards[k].file;
            if (own) st = ck_tmp_cleanup(tmp.path, &z, own, s->ns);
            free(own);
        }
    } else {
        /* A leftover from a crash at this step: nothing in it is trusted. */
        if (st == TS_OK) st = ts_dir_remove_flat(&s->run, tmp_name);
        if (st == TS_OK) st = ts_dir_mkdir(&s->run, tmp_name, 0);
        if (st == TS_OK) st = ts_dir_sub(&tmp, &s->run, tmp_name, 0);
        if (st == TS_OK) st = ck_plan_shards(s);
        if (st == TS_OK) st = ck_write_shards(s, &tmp);
    }
    if (st == TS_OK) st = build_manifest(s, s->zero ? &z : NULL, step_name, &manifest, id);
    ck_zset_free(&z);
    if (st == TS_OK)
        st = ts_dir_write(&tmp, "manifest.json", TS_AT_EXCL, manifest, strlen(manifest), 0644, 1);
    if (st == TS_OK) st = ts_dir_sync(&tmp);
    ts_dir_close(&tmp);
    /* Logged before the commit: a checkpoint is never committed without
     * its entry, so one missing from the log was cut from it (a kill
     * between this entry and the rename leaves an entry and no checkpoint). */
    char msha[CK_SHA_HEX] = "";
    if (st == TS_OK && s->audit && (st = ts_sha256_mem(manifest, strlen(manifest), msha)) == TS_OK)
        st = ck_audit_event(s->audit, "commit",
                            json_pack("{s:I, s:s, s:s, s:s}", "step", (json_int_t)s->step, "dir",
                                      step_name, "id", id, "manifest_sha256", msha));
    if (st == TS_OK) st = move_into_place(&s->run, tmp_name, step_name);
    if (st == TS_OK) st = ts_dir_sync(&s->run);
    if (st == TS_OK && !s->tag[0]) st = write_latest(&s->run, step_name);
    if (st == TS_OK && s->audit) {
        uint64_t bytes = 0;
        for (int k = 0; k < s->ns; k++) bytes += s->shards[k].file_bytes;
        if (st == TS_OK)
            st = ck_audit_event(s->audit, "save",
                                json_pack("{s:I, s:s, s:s, s:s, s:I, s:b}", "step",
                                          (json_int_t)s->step, "dir", step_name, "id", id,
                                          "manifest_sha256", msha, "bytes", (json_int_t)bytes,
                                          "signed", s->key.has_secret));
    }
    if (st == TS_OK && s->keep_last > 0) {
        /* With other ranks, a later save may already be under way in its
         * step-M.tmp: only leftovers up to this step are removed (none by
         * a tagged save, which runs beside the others' regular saves). */
        st = gc_upto(&s->run, s->keep_last, s->keep_every,
                     s->zero          ? s->step
                     : s->others_save ? -1
                                      : INT64_MAX,
                     NULL);
        if (st != TS_OK) ts_error_prefix("%s committed, but retention failed", step_name);
    }
    if (st == TS_OK)
        snprintf(s->done.dir, sizeof s->done.dir, "%s", step_name);
    else
        ts_error_prefix("checkpoint %s", final ? final : step_name);
    free(manifest);
    free(final);
    return st;
}

static void *job_thread(void *arg) {
    ts_ckpt_saver *s = arg;
    /* This thread keeps its priority: it hashes nothing until someone
     * waits (write_shards), and the pipe's I/O threads it starts must not
     * wait for a CPU between writes. */
    double t0 = ts_now();
    s->last = run_job(s);
    if (s->last != TS_OK) snprintf(s->last_err, sizeof s->last_err, "%s", ts_last_error());
    double dt = ts_now() - t0;
    uint64_t bytes = 0;
    for (int i = 0; i < s->nt; i++) bytes += s->t[i].skip ? 0 : s->t[i].bytes;
    bytes += s->other_bytes;
    if (s->last == TS_OK) {
        s->done.step = s->step;
        s->done.bytes = bytes;
        s->done.write_s = dt;
        s->done.throughput = dt > 0 ? (double)bytes / dt : 0;
        s->done.cpu_s = 1e-9 * (double)atomic_load(&s->run_ns);
        s->done.cpu_wait_s = 1e-9 * (double)atomic_load(&s->wait_ns);
    }
    return NULL;
}

ts_status ts_ckpt_saver_wait(ts_ckpt_saver *s) {
    if (!s) return ts_fail(TS_ERR_INVALID, "ckpt saver: NULL");
    if (s->running) {
        ck_save_boost(s);
        pthread_join(s->thread, NULL);
        s->running = 0;
        job_clear(s);
        if (s->last == TS_OK) {
            s->stats.step = s->done.step;
            s->stats.bytes = s->done.bytes;
            s->stats.write_s = s->done.write_s;
            s->stats.throughput = s->done.throughput;
            s->stats.cpu_s = s->done.cpu_s;
            s->stats.cpu_wait_s = s->done.cpu_wait_s;
            memcpy(s->stats.dir, s->done.dir, sizeof s->stats.dir);
        }
    }
    ts_status st = s->last;
    s->last = TS_OK;
    if (st != TS_OK) return ts_fail(st, "%s", s->last_err);
    return TS_OK;
}

/* Gradient compression's per-rank rows (ts_plan_compress_row): this
 * rank's [n] value is row `rank` of the logical [world, n] tensor of the
 * same name, written by this rank like a ZeRO block. */
static ts_status take_rows(ts_ckpt_saver *s, const ts_plan *p) {
    for (int j = 0; j < s->nt; j++) {
        int rank, world;
        if (!s->t[j].is_state || !ts_plan_compress_row(p, s->t[j].name, &rank, &world)) continue;
        if (rank != s->rank || world != s->world || s->t[j].rank != 1)
            return ts_fail(TS_ERR_INTERNAL,
                           "ckpt saver: compression state '%s' is rank %d of %d, the saver's %d "
                           "of %d",
                           s->t[j].name, rank, world, s->rank, s->world);
        sv_piece *q = &s->pc[s->npc];
        const int64_t n = s->t[j].dims[0];
        if (!(q->name = ts_strdup(s->t[j].name)))
            return ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
        q->tensor = j;
        q->state_off = 0;
        q->param_off = (int64_t)rank * n;
        q->count = n;
        q->ndim = 2;
        q->dims[0] = world;
        q->dims[1] = n;
        s->t[j].sharded = 1;
        s->npc++;
    }
    return TS_OK;
}

/* With ZeRO: which values are this rank's blocks of sharded state, and
 * the pieces of logical tensors they hold; ranks > 0 write nothing else.
 * Gradient compression's per-rank rows are saved the same way. */
static ts_status take_layout(ts_ckpt_saver *s, const ts_plan *p) {
    ts_shard_piece *pc = NULL;
    int n = 0, rows = 0;
    ts_status st = ts_plan_shard_layout(p, &pc, &n);
    if (st != TS_OK) return st;
    for (int j = 0; j < s->nt; j++)
        rows += s->t[j].is_state && ts_plan_compress_row(p, s->t[j].name, NULL, NULL);
    if (n == 0 && rows == 0) {
        if (s->rank > 0)
            return ts_fail(TS_ERR_INVALID,
                           "ckpt saver: rank %d: without sharded state (dist.zero) or "
                           "gradient compression only rank 0 saves",
                           s->rank);
        return TS_OK;
    }
    s->zero = 1;
    if (!(s->pc = ts_zalloc(sizeof *s->pc * (size_t)(n + rows), "ckpt pieces"))) st = TS_ERR_NOMEM;
    for (int i = 0; i < n && st == TS_OK; i++) {
        sv_piece *q = &s->pc[s->npc];
        q->tensor = -1;
        for (int j = 0; j < s->nt && q->tensor < 0; j++)
            if (!strcmp(s->t[j].name, pc[i].state)) q->tensor = j;
        ts_dtype dt;
        char name[600];
        if (pc[i].what[0])
            snprintf(name, sizeof name, "%s.%s", pc[i].param, pc[i].what);
        else /* ZeRO-3: a block of the parameters, pieces of the parameter itself */
            snprintf(name, sizeof name, "%s", pc[i].param);
        if (q->tensor < 0)
            st =
                ts_fail(TS_ERR_INTERNAL, "ckpt: sharded value '%s' is not persistent", pc[i].state);
        else if ((st = ts_plan_value_info(p, pc[i].param, &dt, &q->ndim, q->dims)) != TS_OK)
            break;
        else if (!(q->name = ts_strdup(name)))
            st = ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
        if (st != TS_OK) break;
        q->state_off = pc[i].state_off;
        q->param_off = pc[i].param_off;
        q->count = pc[i].count;
        s->t[q->tensor].sharded = 1;
        s->npc++;
    }
    free(pc);
    if (st == TS_OK) st = take_rows(s, p);
    for (int j = 0; j < s->nt && st == TS_OK; j++) s->t[j].skip = s->rank > 0 && !s->t[j].sharded;
    /* ZeRO-3: the parameters that are not persistent (every rank's blocks
     * hold them) are logical tensors of kind param in the manifest. */
    const int np = ts_plan_param_count(p);
    if (st == TS_OK && !(s->zparams = ts_zalloc(sizeof(char *) * (size_t)(np + 1), "ckpt")))
        st = TS_ERR_NOMEM;
    for (int i = 0; i < np && st == TS_OK; i++) {
        const char *name = ts_plan_param_name(p, i);
        int persistent = 0;
        for (int j = 0; j < s->nt && !persistent; j++) persistent = !strcmp(s->t[j].name, name);
        if (persistent) continue;
        if (!(s->zparams[s->nzp] = ts_strdup(name)))
            st = ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
        else
            s->nzp++;
    }
    return st;
}

/* Copy the job's description; the plan and meta may change or go away
 * once begin() returns. */
static ts_status take_job(ts_ckpt_saver *s, const ts_plan *p, const ts_ckpt_meta *meta) {
    int n = ts_plan_persistent_count(p);
    s->t = ts_zalloc(sizeof *s->t * (size_t)(n + 1), "ckpt tensors");
    if (!s->t) return TS_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        ts_persistent pv;
        ts_status st = ts_plan_persistent(p, i, &pv);
        if (st != TS_OK) return st;
        sv_tensor *t = &s->t[s->nt++];
        if (!(t->name = ts_strdup(pv.name))) return ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
        t->is_state = pv.is_state;
        t->dtype = pv.dtype;
        t->rank = pv.rank;
        memcpy(t->dims, pv.dims, sizeof t->dims);
        t->bytes = pv.bytes;
        t->off = pv.snapshot_off;
    }
    s->step = ts_plan_step_count(p);
    s->updates_applied = ts_plan_updates_applied(p);
    memcpy(s->tag, s->tag_next, sizeof s->tag);
    s->tag_next[0] = 0;
    /* A tagged snapshot (rank 0 alone) keeps the raw blocks of rank 0. */
    if (s->world > 1 && !s->tag[0]) {
        ts_status st = take_layout(s, p);
        if (st != TS_OK) return st;
    } else if (s->world > 1) {
        ts_shard_piece *pc = NULL;
        int n = 0;
        ts_status st = ts_plan_shard_layout(p, &pc, &n);
        free(pc);
        if (st != TS_OK) return st;
        s->others_save = n > 0;
    }
    /* PEFT: the frozen parameters (no gradient) are the base's, not saved */
    s->n_frozen = 0;
    for (int j = 0; j < s->nt && s->base_path[0]; j++) {
        char g[600];
        snprintf(g, sizeof g, "grad:%s", s->t[j].name);
        if (s->t[j].is_state || ts_plan_value_info(p, g, NULL, NULL, NULL) == TS_OK) continue;
        s->t[j].skip = 1;
        s->n_frozen++;
    }
    s->seed = ts_plan_seed(p);
    s->config_sha[0] = '\0';
    s->data_position = meta ? meta->data_position : 0;
    s->epoch = meta ? meta->epoch : 0;
    if (meta && meta->config) {
        ts_status st = ts_sha256_mem(meta->config, meta->config_bytes, s->config_sha);
        if (st != TS_OK) return st;
    }
    int nd = meta ? meta->n_data_files : 0;
    if (nd < 0 || (nd > 0 && !meta->data_files))
        return ts_fail(TS_ERR_INVALID, "ckpt: n_data_files %d without data_files", nd);
    if (nd > 0) {
        s->data_paths = ts_zalloc(sizeof(char *) * (size_t)nd, "ckpt lineage");
        s->data_shas = ts_zalloc(sizeof(char *) * (size_t)nd, "ckpt lineage");
        if (!s->data_paths || !s->data_shas) return TS_ERR_NOMEM;
        for (int i = 0; i < nd; i++) {
            const ts_ckpt_data_file *f = &meta->data_files[i];
            if (!f->path || !f->sha256)
                return ts_fail(TS_ERR_INVALID, "ckpt: data file %d has no path or sha256", i);
            s->n_data++;
            s->data_paths[i] = ts_strdup(f->path);
            s->data_shas[i] = ts_strdup(f->sha256);
            if (!s->data_paths[i] || !s->data_shas[i])
                return ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
        }
    }
    return TS_OK;
}

ts_status ts_ckpt_saver_begin(ts_ckpt_saver *s, const ts_plan *p, const ts_ckpt_meta *meta) {
    if (!s || !p) return ts_fail(TS_ERR_INVALID, "ckpt saver begin: NULL argument");
    double t0 = ts_now();
    ts_status st = ts_ckpt_saver_wait(s);
    if (st != TS_OK) {
        ts_error_prefix("previous checkpoint failed");
        return st;
    }
    size_t need = ts_plan_snapshot_bytes(p);
    if ((st = ensure_buffer(s, need, 0)) != TS_OK) return st;
    double t1 = ts_now();
    st = ts_plan_snapshot(p, s->buf, need);
    double t2 = ts_now();
    if (st == TS_OK) st = take_job(s, p, meta);
    s->boost = 0; /* no thread of the saver runs now */
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s->free_cores = ncpu > omp_get_max_threads() ? (int)ncpu - omp_get_max_threads() : 0;
    if (st == TS_OK && pthread_create(&s->thread, NULL, job_thread, s) != 0)
        st = ts_fail(TS_ERR_INTERNAL, "ckpt saver: cannot start the writer thread");
    if (st != TS_OK) {
        job_clear(s);
        return st;
    }
    s->running = 1;
    atomic_store(&s->cancel, 0);
    s->stats.snapshot_s = t2 - t1;
    s->stats.stall_s = ts_now() - t0;
    return TS_OK;
}

void ts_ckpt_saver_cancel(ts_ckpt_saver *s) {
    if (s) atomic_store(&s->cancel, 1);
}

ts_status ts_ckpt_saver_stats(const ts_ckpt_saver *s, ts_ckpt_save_stats *st) {
    if (!s || !st) return ts_fail(TS_ERR_INVALID, "ckpt saver stats: NULL argument");
    *st = s->stats;
    return TS_OK;
}

void ts_ckpt_saver_free(ts_ckpt_saver *s) {
    if (!s) return;
    if (s->running) {
        ck_save_boost(s);
        pthread_join(s->thread, NULL);
        s->running = 0;
    }
    job_clear(s);
    pthread_mutex_destroy(&s->wmu);
    pthread_cond_destroy(&s->wcv);
    pthread_cond_destroy(&s->bcv);
    free(s->replay);
    ts_aligned_free(s->buf);
    ck_pipe_free(s->pipe);
    ck_key_wipe(&s->key);
    ts_dir_close(&s->run);
    free(s->run_dir);
    free(s);
}

ts_status ts_ckpt_save(const ts_plan *p, const char *run_dir, const ts_ckpt_meta *meta,
                       const ts_ckpt_options *opt) {
    ts_ckpt_saver *s;
    ts_status st = ts_ckpt_saver_new(run_dir, NULL, opt, &s);
    if (st != TS_OK) return st;
    s->background = 0; /* the caller waits: full speed */
    s->boost = 1;
    /* No step runs until this returns: the shards are written from the
     * plan's own memory, without the snapshot's copy (and its page faults). */
    const void *pp, *ps;
    st = ts_plan_snapshot_regions(p, &pp, &ps, &s->view_split);
    s->view_params = pp;
    s->view_state = ps;
    if (st == TS_OK) st = take_job(s, p, meta);
    if (st == TS_OK) {
        job_thread(s);
        st = s->last;
        if (st != TS_OK) ts_fail(st, "%s", s->last_err);
    }
    ts_ckpt_saver_free(s);
    return st;
}

/* ---- garbage collection and retention -------------------------------------- */

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x > y ? -1 : x < y;
}

ts_status ts_ckpt_gc(const char *run_dir, int keep_last, int keep_every, int *removed) {
    if (removed) *removed = 0;
    if (!run_dir) return ts_fail(TS_ERR_INVALID, "ckpt gc: NULL run directory");
    ts_dir run;
    ts_dir_lock lock = {-1};
    ts_status st = ts_dir_open(&run, run_dir, 0);
    /* Not while a run saves there (core/dirlock.h): it applies its own
     * retention, and a save under way would race the removals. */
    if (st == TS_OK) st = ts_dir_lock_take(&run, "ckpt gc", TS_LOCK_CREATE, &lock);
    if (st == TS_OK) st = gc_upto(&run, keep_last, keep_every, INT64_MAX, removed);
    ts_dir_lock_release(&lock);
    ts_dir_close(&run);
    return st;
}

/* Leftover "step-N*.tmp" directories are removed for N <= tmp_upto. */
static ts_status gc_upto(const ts_dir *run, int keep_last, int keep_every, int64_t tmp_upto,
                         int *removed) {
    if (removed) *removed = 0;
    char latest_dir[256] = "";
    char *ltext = NULL;
    ts_status st = ts_dir_read(run, "LATEST", 4096, &ltext, NULL);
    if (st == TS_OK) {
        ltext[strcspn(ltext, "\r\n")] = '\0';
        snprintf(latest_dir, sizeof latest_dir, "%s", ltext);
    }
    free(ltext);
    if (st != TS_OK && st != TS_ERR_NOT_FOUND) return st; /* e.g. LATEST is a link */
    st = TS_OK;
    int64_t latest_step = ck_parse_step_name(latest_dir);

    /* From the first entry: the saver lists its kept-open run directory
     * after every save. */
    DIR *d;
    if ((st = ts_dir_list(run, &d)) != TS_OK) return st;
    int64_t *steps = NULL;
    char **tmps = NULL;
    int n = 0, cap = 0, nt = 0, capt = 0;
    struct dirent *e;
    while (st == TS_OK && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".tmp") && !strncmp(e->d_name, "step-", 5) &&
            strtoll(e->d_name + 5, NULL, 10) <= tmp_upto) {
            st = ts_grow((void **)&tmps, &capt, nt + 1, sizeof *tmps, "ckpt gc");
            if (st == TS_OK && !(tmps[nt++] = ts_strdup(e->d_name)))
                st = ts_fail(TS_ERR_NOMEM, "ckpt gc: out of memory");
        } else if (ck_parse_step_name(e->d_name) >= 0) {
            st = ts_grow((void **)&steps, &cap, n + 1, sizeof *steps, "ckpt gc");
            if (st == TS_OK) steps[n++] = ck_parse_step_name(e->d_name);
        }
    }
    closedir(d);
    /* What goes: leftovers, and the checkpoints retention drops (their
     * steps are moved to the front of doomed[]). */
    int ndoomed = 0;
    if (st == TS_OK && keep_last > 0) {
        if (n > 1) qsort(steps, (size_t)n, sizeof *steps, cmp_desc);
        for (int i = keep_last; i < n; i++)
            if (steps[i] != latest_step && !(keep_every > 0 && steps[i] % keep_every == 0))
                steps[ndoomed++] = steps[i];
    }
    /* Everything is looked at before anything goes: a link planted as any
     * of these names is an error naming it, and nothing is removed. */
    for (int i = 0; i < nt + ndoomed && st == TS_OK; i++) {
        char name[40];
        if (i >= nt) ck_step_name(name, steps[i - nt]);
        const char *nm = i < nt ? tmps[i] : name;
        int kind;
        st = ts_dir_kind(run, nm, &kind);
        if (st == TS_OK && kind != 2)
            st = ts_fail(TS_ERR_IO, "%s/%s is not a directory; not removing it", run->path, nm);
    }
    for (int i = 0; i < nt && st == TS_OK; i++) {
        st = ts_dir_remove_flat(run, tmps[i]);
        if (st == TS_OK && removed) (*removed)++;
    }
    for (int i = 0; i < ndoomed && st == TS_OK; i++) {
        /* Renamed to a ".tmp" name first: a crash halfway through the
         * removal then leaves a leftover for the next gc, never a
         * checkpoint with files missing. */
        char name[40], doomed[56];
        ck_step_name(name, steps[i]);
        snprintf(doomed, sizeof doomed, "%s.old.tmp", name);
        st = ts_dir_rename(run, name, doomed);
        if (st == TS_OK) st = ts_dir_remove_flat(run, doomed);
        if (st == TS_OK && removed) (*removed)++;
    }
    for (int i = 0; i < nt; i++) free(tmps[i]);
    free(tmps);
    if (st == TS_OK) st = ts_dir_unlink(run, "LATEST.tmp");
    if (st == TS_OK) st = ts_dir_sync(run);
    free(steps);
    return st;
}
