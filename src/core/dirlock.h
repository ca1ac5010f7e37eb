/* core/dirlock.h — one process at a time in a run directory.
 *
 * A run (and `ckpt gc`, `audit verify`) takes an exclusive flock(2) on
 * RUN/tessel.lock, reached without following links (core/fsat.h), and
 * writes its PID there; a second taker fails at once with a message naming
 * that PID. The lock lives as long as any descriptor of it, so the workers
 * a launcher forks share the launcher's lock: a taker that already holds
 * the lock on the same file in this process (taken here, or inherited
 * through fork) shares it instead of failing.
 *
 *     ts_dir_lock l;
 *     if (ts_dir_lock_take(&run, "tessel train", &l) != TS_OK) return ...;  // message names the
 * PID
 *     ...
 *     ts_dir_lock_release(&l);
 *
 * The lock file is never removed (removing it would let two takers lock
 * two different files); a directory holding only it counts as empty. */
#ifndef TS_CORE_DIRLOCK_H
#define TS_CORE_DIRLOCK_H

#include "core/fsat.h"

#define TS_DIR_LOCK_NAME "tessel.lock"

typedef struct ts_dir_lock {
    int slot; /* into this process's table of held locks; -1 when not held */
} ts_dir_lock;

/* How to take it. Without TS_LOCK_CREATE the lock file is only opened
 * when it exists and nothing is written (the checks before a run writes
 * anything: a refused run leaves the directory as it was); a directory
 * without one is then not locked (l->slot stays -1). TS_LOCK_CREATE makes
 * the file and records the holder's PID in it (a process about to write;
 * a share taken this way records the PID of the process that took the
 * lock first). A directory this user may not write into is locked without
 * a PID when it has a lock file, else not at all. */
enum { TS_LOCK_CREATE = 1 };
/* Take (or share) the lock of `d`. `who` names the taker in the message of
 * a conflict ("tessel train", "ckpt gc"). */
ts_status ts_dir_lock_take(const ts_dir *d, const char *who, int how, ts_dir_lock *l);
/* Release this taker's share (the lock itself goes with the last share in
 * the last process holding it). Idempotent. */
void ts_dir_lock_release(ts_dir_lock *l);
#endif
