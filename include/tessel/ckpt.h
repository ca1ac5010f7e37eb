/* tessel/ckpt.h — checkpoints an auditor can trust, and the audit log.
 *
 * A run directory holds checkpoints `step-00001000/` (safetensors shards of
 * every parameter and optimizer state value, and a signed manifest.json
 * with per-file SHA-256 and per-tensor CRC-32C), a `LATEST` file naming the
 * newest committed one, and `audit.log`. docs/checkpoints.md describes the
 * format. Saving in the background while training goes on:
 *
 *     ts_ckpt_options o = ts_ckpt_options_default();
 *     o.sign_key = "tessel.key";            // from `tessel keygen`
 *     o.keep_last = 3;
 *     ts_ckpt_saver *sv;
 *     if (ts_ckpt_saver_new("runs/a", plan, &o, &sv) != TS_OK) ...
 *     for (...) {
 *         ts_plan_step(plan);
 *         if (step % 100 == 0) ts_ckpt_saver_begin(sv, plan, &meta); // copies, returns
 *     }
 *     ts_ckpt_saver_wait(sv);               // status of the last save
 *     ts_ckpt_saver_free(sv);
 *
 * With ZeRO (the plan shards its optimizer state over the ranks of a
 * comm), every rank has a saver and begins each save at the same step;
 * rank 0 (which creates run_dir before training) writes the manifest once
 * every rank's shards are on disk:
 *
 *     o.rank = ts_comm_rank(comm);
 *     o.world = ts_comm_size(comm);
 *     o.group = g;                          // the same on every rank: drawn by rank 0, broadcast
 *
 * Resuming into a freshly compiled plan (nothing is written into the plan
 * unless the signature, every file hash and every tensor CRC check out and
 * every tensor fits the plan):
 *
 *     ts_ckpt *c;
 *     if (ts_ckpt_open("runs/a", "tessel.pub", NULL, &c) != TS_OK) puts(ts_last_error());
 *     ts_ckpt_restore(c, plan, NULL);       // values and step count
 *     ts_ckpt_info info;
 *     ts_ckpt_get_info(c, &info);           // data position, epoch, ...
 *     ts_ckpt_close(c);
 */
#ifndef TESSEL_CKPT_H
#define TESSEL_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_audit ts_audit;

/* ---- keys ---------------------------------------------------------------- */

/* Write a new Ed25519 key pair: the private key with mode 0600, the public
 * key 0644. Neither file may exist yet. */
ts_status ts_ckpt_keygen(const char *private_key_path, const char *public_key_path);

/* The public half of a private key file, as "ed25519:<64 hex digits>":
 * accepted wherever a public key file is (ts_ckpt_open, ts_ckpt_load,
 * ts_audit_verify). With ckpt.sign_key set and ckpt.verify_key unset, a
 * resume verifies against the run's own key this way. */
ts_status ts_ckpt_public_key_of(const char *private_key_path, char out[73]);

/* An Ed25519 signature (128 hex digits) of msg with a private key file,
 * and that key's public half as "ed25519:<hex>" (`tessel audit replay`
 * signs its report with it). */
ts_status ts_ckpt_sign_text(const char *private_key_path, const void *msg, size_t n, char sig[129],
                            char public_key[73]);

/* SHA-256 of a file as 64 hex digits (for data lineage). */
ts_status ts_sha256_file(const char *path, char hex[65]);
/* SHA-256 of n bytes in memory as 64 hex digits. */
ts_status ts_sha256_bytes(const void *data, size_t n, char hex[65]);

/* ---- saving -------------------------------------------------------------- */

typedef struct ts_ckpt_data_file {
    const char *path;
    const char *sha256; /* 64 hex digits */
} ts_ckpt_data_file;

/* What the caller knows about the run; copied when a save begins. */
typedef struct ts_ckpt_meta {
    const void *config; /* the resolved config text; its SHA-256 goes into the manifest */
    size_t config_bytes;
    const ts_ckpt_data_file *data_files; /* data lineage */
    int n_data_files;
    int64_t data_position; /* samples (or batches) the loader has handed out */
    int64_t epoch;
} ts_ckpt_meta;

typedef struct ts_ckpt_options {
    const char *sign_key; /* private key file; NULL: the manifest is not signed */
    int keep_last;        /* retention: keep the newest K checkpoints (0: keep all) */
    int keep_every;       /* and those whose step is a multiple of M (0: none) */
    int threads;          /* writing/hashing threads (0: two per core, at most 8) */
    ts_audit *audit;      /* record every save here (NULL: no log) */
    /* Sharded optimizer state (dist.zero, docs/checkpoints.md "Sharded
     * optimizer state"): with world > 1 and a plan with ZeRO, every rank
     * has a saver and begins each save at the same step; rank 0 writes
     * the parameters, replicated state and manifest, the others only
     * their blocks of the optimizer state. `group` must be the same on
     * every rank of one launch and differ between launches (rank 0 draws
     * it and broadcasts it), so rank 0 never takes another attempt's
     * leftovers for this save's. Rank 0 waits at most rank_timeout_s
     * (0: 600) for the other ranks' shards. Without ZeRO only rank 0 saves.
     * Only rank 0 signs, logs to `audit` and applies retention. */
    int rank, world;
    uint64_t group;
    double rank_timeout_s;
    /* Parameter-efficient fine-tuning (docs/peft.md): the base weights the
     * frozen parameters came from, and their SHA-256 (64 hex digits).
     * With base_path set, a save leaves out every parameter that has no
     * gradient in the plan (frozen) and records the base as the manifest's
     * "base" (path, sha256, the count left out) and in its data lineage;
     * ts_ckpt_restore then leaves those parameters as they are in the plan.
     * NULL: every parameter is saved. */
    const char *base_path, *base_sha256;
} ts_ckpt_options;

ts_ckpt_options ts_ckpt_options_default(void);

typedef struct ts_ckpt_saver ts_ckpt_saver;

/* A saver for checkpoints of run_dir (created if missing). Loads the
 * signing key now, so a bad key fails before training starts. With a plan
 * (may be NULL) the snapshot buffer is allocated and faulted in now, not
 * during the first save's stall. */
ts_status ts_ckpt_saver_new(const char *run_dir, const ts_plan *p, const ts_ckpt_options *opt,
                            ts_ckpt_saver **out);
/* Snapshot every persistent value of the plan and its step count into the
 * saver's host buffer, then write the checkpoint in a background thread.
 * Its hashing runs only on CPU time no thread of normal priority wants
 * (SCHED_IDLE), so it may wait for the step beside it to end; a call of
 * wait() (or free(), or the next begin()) makes the saver's thread and the
 * caller take the rest over at full speed. Waits first for the previous
 * save; returns its failure, if any, instead of starting a new one. */
ts_status ts_ckpt_saver_begin(ts_ckpt_saver *s, const ts_plan *p, const ts_ckpt_meta *meta);
/* Tag the next save (a-z, 0-9, _): it is written as step-N-TAG/ with
 * "tag" in its manifest, does not move LATEST and is never removed by
 * retention (e.g. "anomaly" for an alert's snapshot). Open it by its path. */
ts_status ts_ckpt_saver_set_tag(ts_ckpt_saver *s, const char *tag);
/* A JSON object every later manifest records as "replay" (NULL: none):
 * what `tessel audit replay` needs besides the manifest's other fields
 * (docs/reproducibility.md). Call before the first save; copied. */
ts_status ts_ckpt_saver_set_replay(ts_ckpt_saver *s, const char *json_object);
/* A ZeRO save's rank 0 stops waiting for the other ranks' shards (its
 * save then fails and commits nothing): for a run that failed, whose other
 * ranks may be gone. Then call wait as usual. */
void ts_ckpt_saver_cancel(ts_ckpt_saver *s);
/* Wait for the running save, hashing its remaining pieces on this thread
 * too; its status (TS_OK when none ran). */
ts_status ts_ckpt_saver_wait(ts_ckpt_saver *s);
/* Waits for a running save (its status is lost: call wait first). */
void ts_ckpt_saver_free(ts_ckpt_saver *s);

/* Timings of the last begin() and of the last save that wait() saw
 * complete (a save still running is not reported yet). */
typedef struct ts_ckpt_save_stats {
    int64_t step;      /* of the last completed save */
    uint64_t bytes;    /* tensor bytes written (rank 0 of a ZeRO save: by every rank) */
    double stall_s;    /* time begin() held the caller (wait + snapshot) */
    double snapshot_s; /* the copy into the host buffer */
    double write_s;    /* background: shards + hashes + manifest + commit */
    double throughput; /* bytes / write_s */
    char dir[256];     /* the committed directory name, e.g. "step-00001000" */
    /* The shard writer threads of that save, summed over threads: time on
     * a CPU, and time runnable but waiting for one (from
     * /proc/thread-self/schedstat; 0 where the kernel does not say). A
     * large wait means the cores were busy elsewhere, not a slow writer. */
    double cpu_s, cpu_wait_s;
} ts_ckpt_save_stats;

ts_status ts_ckpt_saver_stats(const ts_ckpt_saver *s, ts_ckpt_save_stats *st);

/* Save synchronously (a saver begun and waited for). */
ts_status ts_ckpt_save(const ts_plan *p, const char *run_dir, const ts_ckpt_meta *meta,
                       const ts_ckpt_options *opt);

/* Remove unfinished "*.tmp" directories and, when keep_last > 0, every
 * checkpoint that is neither among the newest keep_last, a multiple of
 * keep_every, nor the one LATEST names. *removed (may be NULL) counts
 * removed directories. Run it only while no save is running. */
ts_status ts_ckpt_gc(const char *run_dir, int keep_last, int keep_every, int *removed);

/* How checkpoint files are written on run_dir's file system: *mode
 * "direct" (O_DIRECT) or "buffered" (page cache), whichever wrote faster
 * when measured (once per file system, then cached: docs/checkpoints.md);
 * *source says where the answer came from: "env" (TESSEL_CKPT_IO),
 * "process", "cache" or "probe" (measured now). The bytes are the same
 * either way. */
ts_status ts_ckpt_io_mode(const char *run_dir, const char **mode, const char **source);

/* ---- loading ------------------------------------------------------------- */

typedef struct ts_ckpt ts_ckpt;

/* A checkpoint directory for `path`: path itself if it holds manifest.json,
 * else the directory its LATEST file names. */
ts_status ts_ckpt_resolve(const char *path, char *out, size_t n);

/* Open and verify a checkpoint (a run directory means its LATEST): the
 * manifest's signature (when public_key is not NULL; an unsigned manifest
 * is then refused), every file's size and SHA-256, every tensor's layout
 * and CRC-32C. A failure names the file and tensor at fault. With `audit`
 * the outcome is logged as a "verify" entry. */
ts_status ts_ckpt_open(const char *path, const char *public_key, ts_audit *audit, ts_ckpt **out);
void ts_ckpt_close(ts_ckpt *c);

typedef struct ts_ckpt_info {
    const char *dir; /* strings are owned by the checkpoint */
    const char *id;
    const char *time;
    const char *tessel_version;
    const char *config_sha256; /* "" when the saver had no config */
    int64_t step;
    int64_t updates_applied; /* optimizer updates applied (step minus skipped steps) */
    uint64_t seed;           /* RNG state: Philox streams are keyed by (seed, step) */
    int64_t data_position, epoch;
    int n_data_files;
    const ts_ckpt_data_file *data_files;
    int world_size;
    int n_tensors, n_files;
    uint64_t bytes;     /* tensor bytes */
    int is_signed;      /* the manifest carries a signature */
    int signature_ok;   /* ... and it was verified with the given public key */
    const char *signer; /* public key (hex) named in the signature, "" if unsigned */
    const char *layout; /* "replicated", or "zero": optimizer state saved by every rank */
    /* A PEFT checkpoint (ts_ckpt_options.base_path): the base weights its
     * frozen parameters are left to, their SHA-256 and how many were left
     * out; "", "" and 0 for a checkpoint of every parameter. */
    const char *base_path, *base_sha256;
    int n_frozen;
} ts_ckpt_info;

ts_status ts_ckpt_get_info(const ts_ckpt *c, ts_ckpt_info *info);
/* The manifest as stored. */
const char *ts_ckpt_manifest(const ts_ckpt *c);

typedef struct ts_ckpt_tensor {
    const char *name;
    int is_state;
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK]; /* global shape */
    size_t bytes;
    int n_chunks;
} ts_ckpt_tensor;

int ts_ckpt_tensor_count(const ts_ckpt *c);
ts_status ts_ckpt_tensor_info(const ts_ckpt *c, int i, ts_ckpt_tensor *out);
/* Assemble a whole tensor from its chunks; bytes must equal its size. */
ts_status ts_ckpt_read(const ts_ckpt *c, const char *name, void *dst, size_t bytes);
/* Elements [start, start + count) of a tensor's row-major data. */
ts_status ts_ckpt_read_range(const ts_ckpt *c, const char *name, int64_t start, int64_t count,
                             void *dst);

/* Where chunk k of tensor i lies: in tensor `tensor` of `file`, elements
 * [start, start + count) of the tensor stored from element file_start of
 * the file's tensor; start is -1 for a block that is part of the tensor
 * in more than one dimension (count is then its element count). */
typedef struct ts_ckpt_chunk {
    const char *file, *tensor;
    int64_t start, count, file_start;
} ts_ckpt_chunk;

ts_status ts_ckpt_chunk_info(const ts_ckpt *c, int i, int k, ts_ckpt_chunk *out);

/* Write every value into the plan and restore its step count. The plan
 * must have exactly the checkpoint's persistent values (names, dtypes,
 * shapes) and seed; this is checked for all of them before the first byte
 * is written. A PEFT checkpoint (info.base_path set) may lack parameters
 * of the plan: those keep the plan's values, which the caller loaded from
 * that base (after checking its SHA-256 against info.base_sha256). With
 * `audit` a "load" entry is logged. */
ts_status ts_ckpt_restore(const ts_ckpt *c, ts_plan *p, ts_audit *audit);
/* ts_ckpt_open + ts_ckpt_restore + ts_ckpt_close. */
ts_status ts_ckpt_load(ts_plan *p, const char *path, const char *public_key, ts_audit *audit);

/* Write the parameters (no optimizer state) as one standard safetensors
 * file with the step and id in its metadata. */
ts_status ts_ckpt_export_safetensors(const ts_ckpt *c, const char *path);

/* ---- audit log ----------------------------------------------------------- */

/* Open (or create) RUN_DIR/audit.log for appending; its chain is checked
 * first, so a damaged log is reported instead of extended. With a private
 * key, every save and every 16th entry are followed by a signed head. */
ts_status ts_audit_open(const char *run_dir, const char *private_key, ts_audit **out);
/* Append {"event": event, fields...}; fields_json is a JSON object text
 * or NULL. Events used by tessel: save, load, verify, resume, alert,
 * config, restart. Thread-safe. */
ts_status ts_audit_append(ts_audit *a, const char *event, const char *fields_json);
/* Append a signed head now (needs a private key). */
ts_status ts_audit_sign_head(ts_audit *a);
/* Signs a head when entries were added since the last one. */
ts_status ts_audit_close(ts_audit *a);
/* How many entries come after the last signed head (all of them in a log
 * never signed; 0 in a new one). A run that signs records this in its
 * "config" entry ("unsigned_before") when it opens a log with such a tail:
 * its heads will cover entries nobody signed (a run killed before signing,
 * or entries appended by hand), and the log says so (ts_audit_verify); so
 * does the --procs launcher's "restart" entry. */
int64_t ts_audit_unsigned(ts_audit *a);

typedef struct ts_audit_report {
    int64_t entries;
    int64_t signed_heads;
    int64_t last_signed_seq;  /* -1: none */
    int checkpoints_anchored; /* checkpoints whose manifest's audit head matched */
    /* The newest committed checkpoint present ("" if none) and the entry of
     * its last commit or save (-1 if none): after last_signed_seq, no
     * signed head covers it (a run killed before it signed, or entries
     * appended by hand; see docs/checkpoints.md). */
    char newest_checkpoint[64];
    int64_t newest_logged_seq;
    /* The events of the entries after the last signed head, in order,
     * comma-separated (cut with "..." when long): the unsigned tail. */
    char unsigned_events[256];
    /* "config" (and "restart") entries of runs that opened the log over an
     * unsigned tail and signed over it: "line L (N entries)", comma-separated
     * ("" if none). */
    char signed_over[192];
} ts_audit_report;

/* Check RUN_DIR/audit.log: every entry's hash chain and sequence number,
 * every signed head (with public_key; NULL skips signatures), the log
 * head recorded in each checkpoint's manifest, and that every committed
 * checkpoint present is in the log (its "commit" entry is logged before
 * it is committed), which together catch lines cut off the end. The first
 * break is reported by line number. Takes the run directory's lock
 * (core/dirlock.h): fails naming the PID while a run holds it. */
ts_status ts_audit_verify(const char *run_dir, const char *public_key, ts_audit_report *r);

#ifdef __cplusplus
}
#endif
#endif
