/* ckpt_internal.h — helpers shared by the checkpoint files (internal):
 * SHA-256, hex, durable file-system operations, Ed25519 keys, canonical
 * JSON and the audit log's hooks for the savers and loaders. */
#ifndef TS_CKPT_INTERNAL_H
#define TS_CKPT_INTERNAL_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "core/core.h"
#include "core/sha256.h"
#include "tessel/ckpt.h"

#define CK_SHA_HEX 65 /* 64 hex digits and the NUL */

/* ---- small helpers ----------------------------------------------------- */

/* Parse exactly 2n hex digits; 0 on any other input. */
int ck_unhex(const char *s, unsigned char *out, size_t n);
/* "dir/name", malloc'ed (NULL and TS_ERR_NOMEM recorded on failure). */
char *ck_join(const char *dir, const char *name);
/* Current UTC time as "2024-05-01T12:00:00Z". */
void ck_utc_now(char buf[32]);
/* Compact JSON with sorted keys, leaving out `skip` at the top level (NULL:
 * nothing): the bytes a signature covers. malloc'ed; NULL on failure. */
char *ck_canonical(json_t *obj, const char *skip);
/* A JSON array of n integers (NULL when out of memory). */
json_t *ck_int_array(const int64_t *v, int n);

/* ---- durable files ----------------------------------------------------- */

/* Create `path` (O_EXCL when `excl`), write all of `data`, fsync, close.
 * Never through a link (O_NOFOLLOW). Files of a run directory go through
 * core/fsat.h instead. */
ts_status ck_write_sync(const char *path, const void *data, size_t n, mode_t mode, int excl);
/* fsync a directory so the names created or renamed in it are durable. */
ts_status ck_fsync_dir(const char *dir);
/* Read a whole file of at most `max` bytes, NUL-terminated. */
ts_status ck_read_file(const char *path, size_t max, char **out, size_t *n);

/* ---- Ed25519 (libsodium) ----------------------------------------------- */

#define CK_PK_BYTES  32
#define CK_SK_BYTES  64
#define CK_SIG_BYTES 64

typedef struct ck_key {
    unsigned char pk[CK_PK_BYTES];
    unsigned char sk[CK_SK_BYTES];
    int has_secret;
} ck_key;

ts_status ck_key_load_secret(const char *path, ck_key *k);
ts_status ck_key_load_public(const char *path, ck_key *k);
/* Signature of msg as 128 hex digits. */
void ck_sign(const ck_key *k, const void *msg, size_t n, char out[2 * CK_SIG_BYTES + 1]);
/* 1 if sig_hex is a valid signature of msg by pk. */
int ck_verify(const unsigned char pk[CK_PK_BYTES], const void *msg, size_t n, const char *sig_hex);
/* Wipe key material before it is freed or goes out of scope. */
void ck_key_wipe(ck_key *k);

/* ---- audit hooks ------------------------------------------------------- */

/* Append an entry (fields: an object or NULL, stolen). Thread-safe. */
ts_status ck_audit_event(ts_audit *a, const char *event, json_t *fields);
/* Sequence number and hash of the last entry (seq -1 for an empty log). */
void ck_audit_head(ts_audit *a, int64_t *seq, char hex[CK_SHA_HEX]);

/* Hash of the log's first line: the run's identity, recorded in each
 * manifest as "run" ("" while the log is empty). */
void ck_audit_genesis(ts_audit *a, char hex[CK_SHA_HEX]);

/* ---- rollback checks (rollback.c) --------------------------------------- */

/* What a run directory's audit.log says about its saves. */
typedef struct ck_save_rec {
    char dir[64];
    char sha[CK_SHA_HEX]; /* manifest_sha256 */
    int64_t line;         /* 0-based */
} ck_save_rec;

typedef struct ck_log_view {
    int64_t n;                                  /* lines */
    char genesis[CK_SHA_HEX], last[CK_SHA_HEX]; /* hashes of line 0 and the last line */
    int64_t last_head;                          /* line of the last signed head; -1: none */
    ck_save_rec *saves;                         /* in log order */
    int nsaves;
    ck_save_rec *commits; /* "commit" entries (logged before the rename), in log order */
    int ncommits;
    char (*ids)[33]; /* checkpoint ids named by load, verify and resume entries */
    int nids;
} ck_log_view;

struct ts_dir;
/* Read RUN/audit.log (TS_ERR_NOT_FOUND when there is none). Only what
 * the checks below need is parsed; the chain is ts_audit_verify's. */
ts_status ck_log_view_read(const struct ts_dir *run, ck_log_view *v);
void ck_log_view_free(ck_log_view *v);
/* The checkpoint `name` of the run directory (manifest `m`, its bytes
 * `text`) sits where it was saved: its manifest names this directory and
 * step, this run (v's first line), and the log's last save into `name`
 * recorded this very manifest. With `latest`, name is what LATEST names
 * and must be the log's newest untagged save. A save whose "save" entry is
 * missing because the process died between the commit and the entry
 * passes when the log holds its "commit" entry (a manifest with
 * "audit_commit"), or, for a manifest from before commit entries, when no
 * later save was logged after the log head it records. v may be NULL (no
 * log): only the names are checked. */
ts_status ck_check_placement(const ck_log_view *v, const char *run_path, const char *name,
                             const char *text, json_t *m, int latest);

/* ---- checkpoint names -------------------------------------------------- */

/* "step-%08lld": the directory name of a checkpoint. */
void ck_step_name(char buf[40], int64_t step);
/* step of a name "step-NNNNNNNN" (exactly, no suffix); -1 otherwise. */
int64_t ck_parse_step_name(const char *name);

/* ---- sharded optimizer state across ranks (zero.c) --------------------- */

/* A chunk of a logical tensor in the flat form: elements [start, start +
 * count) of `name` (dtype, dims: the logical tensor) stored from element
 * file_start of tensor `tensor` in `file`, written by `rank`. */
typedef struct ck_zchunk {
    char *name;
    ts_dtype dtype;
    int ndim;
    int64_t dims[TS_MAX_RANK];
    char *file, *tensor;
    int64_t start, count, file_start;
    uint32_t crc;
    int rank;
} ck_zchunk;

typedef struct ck_zfile {
    char *name;
    uint64_t bytes;
    char sha[CK_SHA_HEX];
    int rank;
} ck_zfile;

/* Files and chunks of one or several ranks. */
typedef struct ck_zset {
    ck_zfile *f;
    int nf, capf;
    ck_zchunk *c;
    int nc, capc;
} ck_zset;

void ck_zset_free(ck_zset *z);
ts_status ck_zset_add_file(ck_zset *z, const char *name, uint64_t bytes, const char *sha, int rank);
/* Copies the strings. */
ts_status ck_zset_add_chunk(ck_zset *z, const ck_zchunk *c);
/* The manifest's entry of a chunk (without the logical tensor's fields). */
json_t *ck_zchunk_json(const ck_zchunk *c);
/* Sort the chunks by tensor and start, and check that they tile each
 * tensor exactly (a failure is a bug: the ranks' layouts disagree). */
ts_status ck_zset_check(ck_zset *z, const char *dir);
/* Publish DIR/rank-RANK.json (written, fsync'ed, renamed into place). */
ts_status ck_rank_publish(const char *dir, int rank, int world, uint64_t group, int64_t step,
                          const ck_zset *own);
/* Wait until ranks 1..world-1 have published this save's (group, step)
 * rank-K.json, polling, and add their files and chunks to z. Fails after
 * timeout_s naming the ranks missing, or as soon as *cancel (may be NULL)
 * is set. */
ts_status ck_rank_collect(const char *dir, int world, uint64_t group, int64_t step,
                          double timeout_s, const atomic_int *cancel, ck_zset *z);
/* Remove every file of DIR that is neither in keep nor named in own[]. */
ts_status ck_tmp_cleanup(const char *dir, const ck_zset *keep, const char *const *own, int n_own);

#endif
