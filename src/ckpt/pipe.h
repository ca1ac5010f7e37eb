/* pipe.h — checkpoint files written as a pipeline (internal).
 *
 * The shard writers ("hashers") stream each file's bytes into large aligned
 * buffers, hashing every piece while it is in cache; a full buffer goes to
 * the pipe's I/O threads, which write it at its offset while the hasher
 * fills the next. So hashing and writing overlap within a file and across
 * files, and a hasher waits for the disk only when every buffer is in
 * flight. The I/O thread that writes a file's last buffer also ends the
 * file (length, fsync, close, rename), so a hasher goes straight on to its
 * next file.
 *
 *     ck_pipe *p;
 *     ck_pipe_new(CK_IO_DIRECT, 2, 8, &p);
 *     // in each hasher thread, for each of its files:
 *     ck_pipe_file(p, dirfd, "a.safetensors", "RUN/step-1.tmp/a.safetensors",
 *                  parts, nparts, on_piece, user, &bytes);
 *     // or piece by piece, from whichever thread holds the file's cursor:
 *     ck_pfile *c; ck_pipe_open(p, dirfd, name, shown, parts, nparts, fn, user, &c);
 *     for (int done = 0; !done;) ck_pipe_advance(p, c, CK_PIECE, &done, &bytes);
 *     // once every hasher is done:
 *     ts_status st = ck_pipe_finish(p);   // every file ended and renamed, or the first error
 *     ...                                 // more files, finish again (a saver keeps its pipe)
 *     ck_pipe_free(p);
 *
 * Whether files go through O_DIRECT or the page cache is measured once per
 * file system (ck_io_choose) and cached; the bytes are the same either way.
 */
#ifndef TS_CKPT_PIPE_H
#define TS_CKPT_PIPE_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"

typedef enum ck_io_mode { CK_IO_DIRECT = 1, CK_IO_BUFFERED = 2 } ck_io_mode;

/* One run of bytes of a file, in file order. `tensor` is passed to the
 * piece callback (-1 for the header). */
typedef struct ck_part {
    const void *data;
    size_t bytes;
    int tensor;
} ck_part;

/* Called with each piece (at most CK_PIECE bytes) just before it is
 * written, from the hasher's thread, in file order. */
typedef void (*ck_piece_fn)(void *user, int tensor, const void *data, size_t n);

#define CK_PIECE ((size_t)256 << 10) /* hashed while in L2 */
#define CK_CHUNK ((size_t)8 << 20)   /* one write */
#define CK_ALIGN ((size_t)4096)      /* O_DIRECT's alignment */

typedef struct ck_pipe ck_pipe;

/* A pipe with `io_threads` writer threads and `nbufs` buffers of CK_CHUNK. */
ts_status ck_pipe_new(ck_io_mode mode, int io_threads, int nbufs, ck_pipe **out);

/* Streams the parts into `name` + ".tmp" in `dirfd` (never through a
 * link), calling fn on each piece; the file is renamed to `name` once its
 * last byte is durable (ck_pipe_finish reports how that went). `shown` names
 * the file in messages. *bytes: the file's length. Thread-safe. */
ts_status ck_pipe_file(ck_pipe *p, int dirfd, const char *name, const char *shown,
                       const ck_part *parts, int nparts, ck_piece_fn fn, void *user,
                       uint64_t *bytes);

/* The same as a cursor that any thread may advance (one thread at a time,
 * the handover ordered by the caller's lock): hashing a file can then
 * move between threads between pieces. `parts` must stay valid until
 * *done. A file opened is advanced to its end (its last buffer, and a
 * failure, are reported through ck_pipe_finish). */
typedef struct ck_pfile ck_pfile;
ts_status ck_pipe_open(ck_pipe *p, int dirfd, const char *name, const char *shown,
                       const ck_part *parts, int nparts, ck_piece_fn fn, void *user,
                       ck_pfile **out);
/* Streams about `budget` more bytes (whole pieces, at least one). *done:
 * the last byte is handed to the I/O threads and the cursor is freed;
 * *bytes (may be NULL) is then the file's length. */
ts_status ck_pipe_advance(ck_pipe *p, ck_pfile *c, size_t budget, int *done, uint64_t *bytes);

/* Waits for every file; the first error by file name (shards sort in shard
 * order). The pipe can then take the files of another save. */
ts_status ck_pipe_finish(ck_pipe *p);
void ck_pipe_free(ck_pipe *p);

/* How checkpoint files are written on the file system of `dirfd`:
 * TESSEL_CKPT_IO=direct|buffered forces it; otherwise a choice remembered
 * in this process or in $XDG_CACHE_HOME/tessel/ckpt-io.txt (or
 * ~/.cache/tessel; TESSEL_CKPT_IO_CACHE=0: neither read nor written), and
 * otherwise a measurement: 64 MiB written both ways through a pipe into a
 * temporary file of `dirfd`, twice each; the page cache is kept only if it
 * wrote over 1.25x faster (it also costs a copy per byte). *source (may be NULL):
 * "env", "process", "cache" or "probe". */
ts_status ck_io_choose(int dirfd, const char *dir_path, ck_io_mode *mode, const char **source);
/* The same without measuring: for saves too small to be worth 256 MiB of
 * probe writes. Env, process or disk cache as above, else O_DIRECT where
 * the file system takes it ("default"). */
ts_status ck_io_peek(int dirfd, const char *dir_path, ck_io_mode *mode, const char **source);

/* "direct" or "buffered". */
const char *ck_io_mode_name(ck_io_mode m);

#endif
