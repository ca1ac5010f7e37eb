/* save_internal.h — the checkpoint saver's state, shared by save.c (the
 * job: snapshot, manifest, commit) and save_shards.c (the shard files:
 * cut, hashed and written, on idle CPU time for a background save). */
#ifndef TS_CKPT_SAVE_INTERNAL_H
#define TS_CKPT_SAVE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include "ckpt/pipe.h"
#include "ckpt_internal.h"
#include "core/fsat.h"
#include "tessel/tessel.h"

typedef struct sv_tensor {
    char *name;
    int is_state;
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    size_t bytes, off; /* in the snapshot */
    uint32_t crc;
    int shard;
    int sharded; /* a ZeRO block of optimizer state ("zero.bucket*") */
    int skip;    /* not this rank's to write (ranks > 0 write only their blocks) */
} sv_tensor;

/* A piece of a sharded value: elements of a logical tensor (ts_shard_piece). */
typedef struct sv_piece {
    char *name; /* "<param>.<what>" */
    int tensor; /* the sharded value in s->t */
    int64_t state_off, param_off, count;
    int ndim;
    int64_t dims[TS_MAX_RANK]; /* the parameter's */
} sv_piece;

typedef struct sv_shard {
    char file[64];
    int *members; /* tensor indices in file order */
    int n;
    uint64_t bytes, file_bytes;
    char sha[CK_SHA_HEX];
    int sharded; /* holds sharded values (listed through the rank's chunk set) */
    ts_status st;
    char err[1024];
    /* While it is written: its cursor and what it streams (write_shards). */
    int state; /* SH_TODO, SH_OPEN, SH_HELD (a thread advances it), SH_DONE */
    ck_pfile *cur;
    ck_part *parts;
    unsigned char *prefix;
    char *path;
    ts_sha256 sha_ctx;
    uint32_t *crc; /* per member */
} sv_shard;

enum { SH_TODO, SH_OPEN, SH_HELD, SH_DONE };

struct ts_ckpt_saver {
    char *run_dir;
    ts_dir run; /* opened once: every name below it is reached without following links */
    int threads, keep_last, keep_every;
    int background; /* lower the writer threads' priority (not for ts_ckpt_save) */
    /* Cores the training step leaves free (online cores minus the OpenMP
     * threads of the thread that called begin()): a background save hashes
     * on that many at normal priority, on the rest at SCHED_IDLE. */
    int free_cores;
    int rank, world; /* ts_ckpt_options: several ranks save sharded state together */
    uint64_t group;
    double rank_timeout_s;
    ts_audit *audit;
    ck_key key;

    unsigned char *buf; /* the snapshot */
    size_t buf_bytes;
    /* A synchronous save reads the plan's own regions instead (no step runs
     * meanwhile): snapshot offsets below view_split are in view_params,
     * the rest in view_state. NULL: the snapshot. */
    const unsigned char *view_params, *view_state;
    size_t view_split;
    ck_io_mode io_mode; /* 0 until chosen (ck_io_choose) for the run directory */
    ck_pipe *pipe;      /* shards are written through it; made at the first save */

    /* the job being written (owned by the background thread while running) */
    sv_tensor *t;
    int nt;
    sv_shard *shards;
    int ns;
    int zero;             /* this job saves sharded state with the other ranks */
    int others_save;      /* a tagged job of rank 0 while the other ranks save too */
    uint64_t other_bytes; /* rank 0: the other ranks' state bytes in this save */
    sv_piece *pc;
    int npc;
    char **zparams; /* ZeRO-3: the parameters saved as chunks of every rank's blocks */
    int nzp;
    int64_t step;
    int64_t updates_applied;    /* optimizer updates applied (steps minus skipped ones) */
    char tag_next[48], tag[48]; /* ts_ckpt_saver_set_tag: for the next save, for this job */
    uint64_t seed;
    char config_sha[CK_SHA_HEX];
    char **data_paths, **data_shas;
    char *replay; /* ts_ckpt_saver_set_replay (owned), NULL: none */
    int n_data;
    int64_t data_position, epoch;
    char base_path[1024], base_sha[CK_SHA_HEX]; /* ts_ckpt_options: PEFT's base, "" none */
    int n_frozen;                               /* parameters this job leaves to the base */
    /* The shards of the running job: which are open, held or done, and
     * whether someone waits for the save (then it runs at full priority). */
    pthread_mutex_t wmu;
    pthread_cond_t wcv; /* a shard was let go (for hashers waiting for one) */
    pthread_cond_t bcv; /* boost, or every shard done (for the saver's thread) */
    const ts_dir *wdir; /* the step-N.tmp being written; NULL outside write_shards */
    int n_open, n_done, max_open, n_idle, boost;
    atomic_int cancel;            /* ts_ckpt_saver_cancel: stop waiting for the other ranks */
    atomic_llong run_ns, wait_ns; /* writer threads, from schedstat */

    pthread_t thread;
    int running;
    ts_status last;
    char last_err[1024];
    ts_ckpt_save_stats stats; /* owned by the caller's thread */
    ts_ckpt_save_stats done;  /* written by the background thread, merged by wait() */
};

/* Where snapshot offset `off` of the job's values is. */
static inline const unsigned char *src_at(const ts_ckpt_saver *s, size_t off) {
    if (!s->view_params) return s->buf + off;
    return off < s->view_split ? s->view_params + off : s->view_state + (off - s->view_split);
}

/* Cut parameters and state into shard files (s->shards). */
ts_status ck_plan_shards(ts_ckpt_saver *s);
/* Write every shard into `dir` and wait until each is durable and renamed;
 * the hashes and CRCs are then in s->shards and s->t. */
ts_status ck_write_shards(ts_ckpt_saver *s, const ts_dir *dir);
/* Someone waits for the save: the saver's thread and the caller hash the
 * rest at their own priority (returns once every shard is handed over). */
void ck_save_boost(ts_ckpt_saver *s);

#endif
