/* restore.c — an opened checkpoint into a plan (ts_ckpt_restore, ts_ckpt_load, fitting ZeRO
 * shards) and out to a standard safetensors file (ts_ckpt_export_safetensors). */
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
#include "load_internal.h"

/* ---- restoring ------------------------------------------------------------------- */

/* The plan's sharded optimizer state (ZeRO; none otherwise): which
 * elements of which logical tensors each "zero.bucket*" value holds. */
typedef struct fit_layout {
    ts_shard_piece *pc;
    int n;
} fit_layout;

static int is_sharded(const fit_layout *L, const char *name) {
    for (int i = 0; i < L->n; i++)
        if (!strcmp(L->pc[i].state, name)) return 1;
    return 0;
}

/* "<param>.<what>", or the parameter itself for ZeRO-3's blocks of the
 * parameters (what ""). */
static void logical_name(char *buf, size_t n, const ts_shard_piece *pc) {
    if (pc->what[0])
        snprintf(buf, n, "%s.%s", pc->param, pc->what);
    else
        snprintf(buf, n, "%s", pc->param);
}

static int plan_param(const ts_plan *p, const char *name, size_t len) {
    for (int j = 0; j < ts_plan_param_count(p); j++) {
        const char *q = ts_plan_param_name(p, j);
        if (strlen(q) == len && !strncmp(q, name, len)) return 1;
    }
    return 0;
}

/* ZeRO-3: a parameter of the plan that is not persistent (every rank's
 * blocks hold it). */
static int sharded_param(const ts_plan *p, const char *name) {
    if (!plan_param(p, name, strlen(name))) return 0;
    for (int j = 0; j < ts_plan_persistent_count(p); j++) {
        ts_persistent pv;
        if (ts_plan_persistent(p, j, &pv) == TS_OK && !strcmp(pv.name, name)) return 0;
    }
    return 1;
}

/* A checkpoint tensor "<param>.<what>" of a parameter of the plan, where
 * the plan shards <what>, or (ZeRO-3) a parameter the plan shards: it has
 * a place even if this rank's block holds none of it. */
static int sharded_logical(const ts_plan *p, const fit_layout *L, const char *tname) {
    if (L->n > 0 && sharded_param(p, tname)) return 1;
    const char *dot = strrchr(tname, '.');
    if (!dot) return 0;
    int what = 0;
    for (int i = 0; i < L->n && !what; i++) what = !strcmp(L->pc[i].what, dot + 1);
    return what && plan_param(p, tname, (size_t)(dot - tname));
}

/* Every piece of a sharded value needs its logical tensor: state, the
 * value's dtype, as many elements as the parameter. */
static ts_status check_pieces(const ts_ckpt *c, const ts_plan *p, const fit_layout *L,
                              const ts_persistent *pv) {
    for (int i = 0; i < L->n; i++) {
        const ts_shard_piece *pc = &L->pc[i];
        if (strcmp(pc->state, pv->name)) continue;
        char name[600];
        logical_name(name, sizeof name, pc);
        const ld_tensor *t = ck_find_tensor(c, name);
        if (!t)
            return ts_fail(TS_ERR_NOT_FOUND,
                           "%s: has no tensor '%s', which the plan's sharded optimizer state '%s' "
                           "needs",
                           c->dir, name, pv->name);
        ts_dtype pdt;
        int prank;
        int64_t pdims[TS_MAX_RANK];
        ts_status s = ts_plan_value_info(p, pc->param, &pdt, &prank, pdims);
        if (s != TS_OK) return s;
        const int64_t numel = ts_shape_numel(t->rank, t->dims);
        const int want_state = pc->what[0] != 0; /* ZeRO-3's blocks: the parameter itself */
        if (t->is_state != want_state || t->dtype != pv->dtype ||
            numel != ts_shape_numel(prank, pdims) || pc->param_off + pc->count > numel) {
            char a[128];
            ts_shape_str(a, sizeof a, t->dtype, t->rank, t->dims);
            return ts_fail(TS_ERR_SHAPE,
                           "%s: tensor '%s' is %s %s; the plan's '%s' needs %s of dtype %s "
                           "with the %lld elements of parameter '%s'",
                           c->dir, name, t->is_state ? "state" : "param", a, pv->name,
                           want_state ? "state" : "a parameter", ts_dtype_name(pv->dtype),
                           (long long)ts_shape_numel(prank, pdims), pc->param);
        }
    }
    return TS_OK;
}

/* Gradient compression's per-rank rows (ts_plan_compress_row: this
 * rank's [n] f32 value, saved as row r of the [ranks, n] tensor of the
 * same name; docs/distributed.md "Gradient compression"). */
static int rank_row(const ts_plan *p, const ts_persistent *pv, const ld_tensor *t) {
    return t && pv->is_state && t->is_state && t->dtype == TS_F32 && t->rank == 2 &&
           pv->rank == 1 && t->dims[1] == pv->dims[0] && t->dims[0] > 0 &&
           ts_plan_compress_row(p, pv->name, NULL, NULL);
}

/* Saved by as many ranks: this rank's row, bit for bit. By another number:
 * the mean over the saved rows, which keeps the mean residual (what the
 * averaged update has not received yet) and the mean momentum. */
static ts_status read_row(const ts_plan *p, const ld_tensor *t, const ts_persistent *pv,
                          float *dst) {
    int rank = 0, world = 0;
    ts_plan_compress_row(p, pv->name, &rank, &world);
    const int64_t n = pv->dims[0], saved = t->dims[0];
    if (saved == world) return ck_read_range(t, (int64_t)rank * n, n, (unsigned char *)dst);
    float *row = ts_alloc(sizeof(float) * (size_t)(n > 0 ? n : 1), "ckpt restore row");
    if (!row) return TS_ERR_NOMEM;
    memset(dst, 0, sizeof(float) * (size_t)n);
    ts_status s = TS_OK;
    for (int64_t r = 0; r < saved && s == TS_OK; r++) {
        s = ck_read_range(t, r * n, n, (unsigned char *)row);
        for (int64_t i = 0; i < n && s == TS_OK; i++) dst[i] += row[i];
    }
    for (int64_t i = 0; i < n; i++) dst[i] = dst[i] / (float)saved;
    free(row);
    return s;
}

static ts_status check_fits(const ts_ckpt *c, const ts_plan *p, const fit_layout *L) {
    int n = ts_plan_persistent_count(p);
    if (ts_plan_seed(p) != c->info.seed)
        return ts_fail(TS_ERR_INVALID,
                       "%s: saved by a run with seed %llu, the plan has seed %llu: dropout masks "
                       "would differ from the original run",
                       c->dir, (unsigned long long)c->info.seed,
                       (unsigned long long)ts_plan_seed(p));
    for (int i = 0; i < n; i++) {
        ts_persistent pv;
        ts_status s = ts_plan_persistent(p, i, &pv);
        if (s != TS_OK) return s;
        if (is_sharded(L, pv.name)) {
            if ((s = check_pieces(c, p, L, &pv)) != TS_OK) return s;
            continue;
        }
        const ld_tensor *t = ck_find_tensor(c, pv.name);
        if (!t && !pv.is_state && c->info.base_path[0]) continue; /* frozen: the base's */
        if (!t)
            return ts_fail(TS_ERR_NOT_FOUND, "%s: has no tensor '%s', which the plan needs (%s)",
                           c->dir, pv.name, pv.is_state ? "optimizer state" : "parameter");
        if (rank_row(p, &pv, t)) continue; /* gradient compression: this rank's row */
        int same = t->dtype == pv.dtype && t->rank == pv.rank && t->is_state == pv.is_state;
        for (int d = 0; same && d < t->rank; d++) same = t->dims[d] == pv.dims[d];
        if (!same) {
            char a[128], b[128];
            ts_shape_str(a, sizeof a, t->dtype, t->rank, t->dims);
            ts_shape_str(b, sizeof b, pv.dtype, pv.rank, pv.dims);
            return ts_fail(TS_ERR_SHAPE, "%s: tensor '%s' is %s %s, the plan's is %s %s", c->dir,
                           pv.name, t->is_state ? "state" : "param", a,
                           pv.is_state ? "state" : "param", b);
        }
    }
    for (int i = 0; i < c->nt; i++) {
        int found = sharded_logical(p, L, c->t[i].name);
        for (int j = 0; j < n && !found; j++) {
            ts_persistent pv;
            found = ts_plan_persistent(p, j, &pv) == TS_OK && !strcmp(pv.name, c->t[i].name);
        }
        if (!found)
            return ts_fail(TS_ERR_INVALID,
                           "%s: tensor '%s' has no place in the plan (a different model or "
                           "optimizer?)",
                           c->dir, c->t[i].name);
    }
    return TS_OK;
}

/* One persistent value's bytes: a whole tensor, or a sharded value
 * assembled from the pieces of its logical tensors (padding zero). */
static ts_status gather_value(const ts_ckpt *c, const ts_plan *p, const fit_layout *L,
                              const ts_persistent *pv, unsigned char *tmp, const void **src) {
    if (is_sharded(L, pv->name)) {
        const size_t es = ts_dtype_size(pv->dtype);
        memset(tmp, 0, pv->bytes);
        for (int i = 0; i < L->n; i++) {
            const ts_shard_piece *pc = &L->pc[i];
            if (strcmp(pc->state, pv->name)) continue;
            char name[600];
            logical_name(name, sizeof name, pc);
            ts_status s = ck_read_range(ck_find_tensor(c, name), pc->param_off, pc->count,
                                        tmp + (size_t)pc->state_off * es);
            if (s != TS_OK) return s;
        }
        *src = tmp;
        return TS_OK;
    }
    const ld_tensor *t = ck_find_tensor(c, pv->name);
    if (rank_row(p, pv, t)) {
        *src = tmp;
        return read_row(p, t, pv, (float *)tmp);
    }
    if (t->n_chunks == 1 && t->chunks[0].flat) {
        *src = t->chunks[0].data;
        return TS_OK;
    }
    ck_assemble(t, tmp);
    *src = tmp;
    return TS_OK;
}

ts_status ts_ckpt_restore(const ts_ckpt *c, ts_plan *p, ts_audit *audit) {
    if (!c || !p) return ts_fail(TS_ERR_INVALID, "ckpt restore: NULL argument");
    fit_layout L = {NULL, 0};
    ts_status s = ts_plan_shard_layout(p, &L.pc, &L.n);
    if (s == TS_OK) s = check_fits(c, p, &L);
    const int n = ts_plan_persistent_count(p);
    size_t tmp_bytes = 0;
    for (int i = 0; i < n && s == TS_OK; i++) {
        ts_persistent pv;
        if ((s = ts_plan_persistent(p, i, &pv)) == TS_OK && pv.bytes > tmp_bytes)
            tmp_bytes = pv.bytes;
    }
    unsigned char *tmp = NULL;
    if (s == TS_OK && !(tmp = ts_alloc(tmp_bytes ? tmp_bytes : 1, "ckpt restore")))
        s = TS_ERR_NOMEM;
    /* Everything is checked; from here on only copies into the plan. */
    for (int i = 0; i < n && s == TS_OK; i++) {
        ts_persistent pv;
        const void *src = NULL;
        if ((s = ts_plan_persistent(p, i, &pv)) != TS_OK) break;
        if (!is_sharded(&L, pv.name) && !ck_find_tensor(c, pv.name)) continue; /* the base's */
        s = gather_value(c, p, &L, &pv, tmp, &src);
        if (s == TS_OK) s = ts_plan_write_param(p, pv.name, src, pv.bytes);
    }
    free(tmp);
    free(L.pc);
    if (s == TS_OK) {
        ts_plan_set_step(p, c->info.step);
        ts_plan_set_updates_applied(p, c->info.updates_applied);
    }
    if (s == TS_OK && audit)
        s = ck_audit_event(audit, "load",
                           json_pack("{s:s, s:s, s:I, s:b}", "dir", c->dir, "id", c->info.id,
                                     "step", (json_int_t)c->info.step, "signature_verified",
                                     c->info.signature_ok));
    return s;
}

ts_status ts_ckpt_load(ts_plan *p, const char *path, const char *public_key, ts_audit *audit) {
    ts_ckpt *c;
    ts_status s = ts_ckpt_open(path, public_key, audit, &c);
    if (s != TS_OK) return s;
    s = ts_ckpt_restore(c, p, audit);
    ts_ckpt_close(c);
    return s;
}

/* ---- export ------------------------------------------------------------------------ */

ts_status ts_ckpt_export_safetensors(const ts_ckpt *c, const char *path) {
    if (!c || !path) return ts_fail(TS_ERR_INVALID, "ckpt export: NULL argument");
    ts_st_writer *w;
    ts_status s = ts_st_writer_new(&w);
    if (s != TS_OK) return s;
    void **owned = ts_zalloc(sizeof(void *) * (size_t)(c->nt + 1), "ckpt export");
    if (!owned) s = TS_ERR_NOMEM;
    /* Larger elements first keeps every tensor aligned (see safetensors.h). */
    for (size_t esz = 8; esz >= 1 && s == TS_OK; esz /= 2)
        for (int i = 0; i < c->nt && s == TS_OK; i++) {
            const ld_tensor *t = &c->t[i];
            if (t->is_state || ts_dtype_size(t->dtype) != esz) continue;
            const void *src = t->chunks[0].data;
            if (t->n_chunks > 1 || !t->chunks[0].flat) {
                if (!(owned[i] = ts_alloc(t->bytes ? t->bytes : 1, "ckpt export"))) {
                    s = TS_ERR_NOMEM;
                    break;
                }
                ck_assemble(t, owned[i]);
                src = owned[i];
            }
            s = ts_st_writer_add(w, t->name, t->dtype, t->rank, t->dims, src);
        }
    char step[24];
    snprintf(step, sizeof step, "%lld", (long long)c->info.step);
    if (s == TS_OK) s = ts_st_writer_meta(w, "format", "pt");
    if (s == TS_OK) s = ts_st_writer_meta(w, "tessel_step", step);
    if (s == TS_OK) s = ts_st_writer_meta(w, "tessel_checkpoint_id", c->info.id);
    if (s == TS_OK) s = ts_st_writer_save(w, path);
    ts_st_writer_free(w);
    for (int i = 0; owned && i < c->nt; i++) free(owned[i]);
    free(owned);
    return s;
}
