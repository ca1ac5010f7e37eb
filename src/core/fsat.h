/* core/fsat.h — the files of a directory, reached without following links.
 *
 * A run directory (and a checkpoint or tb/ folder inside it) is opened
 * once; every file or folder in it is then created, written, renamed or
 * removed relative to that descriptor with O_NOFOLLOW, so a symbolic link
 * planted in the directory can never make tessel delete, truncate,
 * overwrite or append to something outside it. A link where tessel
 * expects its own file or folder is an error naming it, and nothing is
 * removed.
 *
 *     ts_dir run;
 *     if (ts_dir_open(&run, "runs/a", 1) != TS_OK) return ...;   // mkdir, then open
 *     ts_status s = ts_dir_replace(&run, "summary.json", text, n, 0644, 0);
 *     FILE *m = ts_dir_fopen(&run, "metrics.jsonl", "a");           // NULL + message
 *     ts_dir_close(&run);
 *
 * Only the last component of the path given to ts_dir_open() is checked
 * (the user chose the path above it). Every function reports "DIR/NAME"
 * in its message. */
#ifndef TS_CORE_FSAT_H
#define TS_CORE_FSAT_H

#include <dirent.h>
#include <stdio.h>
#include <sys/types.h>
#include "core/core.h"

typedef struct ts_dir {
    int fd;     /* -1 when closed */
    char *path; /* for messages */
} ts_dir;

/* How to open: TS_DIR_CREATE makes it first (mode 0755, missing parents
 * are not made); TS_DIR_FOLLOW lets the path given to ts_dir_open end in
 * a link (for reading a directory the user named, e.g. `ckpt verify`). */
enum { TS_DIR_CREATE = 1, TS_DIR_FOLLOW = 2 };
/* Open `path` as a directory (O_DIRECTORY | O_NOFOLLOW unless FOLLOW). A
 * path that is missing or not a directory is TS_ERR_NOT_FOUND. */
ts_status ts_dir_open(ts_dir *d, const char *path, int how);
/* Open the folder `name` of `parent` (never following a link). */
ts_status ts_dir_sub(ts_dir *d, const ts_dir *parent, const char *name, int how);
void ts_dir_close(ts_dir *d);

/* What `name` is: 0 absent, 1 regular file, 2 directory; a link or
 * anything else is an error naming it. */
ts_status ts_dir_kind(const ts_dir *d, const char *name, int *kind);

/* Open modes of ts_dir_openf. Writes refuse a file with more than one
 * hard link (it could be someone else's file linked in). */
enum {
    TS_AT_READ = 0,    /* an existing regular file */
    TS_AT_APPEND = 1,  /* append, created if missing */
    TS_AT_EXCL = 2,    /* a new file; fails if the name exists */
    TS_AT_REPLACE = 3, /* a new, empty file: an old regular file of that name is unlinked first */
};
ts_status ts_dir_openf(const ts_dir *d, const char *name, int how, mode_t mode, int *fd);
/* ts_dir_openf as a stdio stream: "r" (READ), "a" (APPEND), "w"
 * (REPLACE), "x" (EXCL). NULL with the message recorded on failure. */
FILE *ts_dir_fopen(const ts_dir *d, const char *name, const char *mode);

/* Write all of data into `name` (TS_AT_EXCL or TS_AT_REPLACE), fsync it
 * when `sync`. */
ts_status ts_dir_write(const ts_dir *d, const char *name, int how, const void *data, size_t n,
                       mode_t mode, int sync);
/* Replace `name` atomically: written as "NAME.tmp", then renamed over it
 * (fsync'ed first when `sync`). */
ts_status ts_dir_replace(const ts_dir *d, const char *name, const void *data, size_t n, mode_t mode,
                         int sync);
/* Read a whole regular file of at most `max` bytes, NUL-terminated
 * (TS_ERR_NOT_FOUND when absent). */
/* The whole regular file open at fd (closed here, whatever happens) into a NUL-terminated
 * buffer of at most max bytes (free()), *n its length; `what` names it in errors. */
ts_status ts_fd_read_all(int fd, const char *what, size_t max, char **out, size_t *n);
ts_status ts_dir_read(const ts_dir *d, const char *name, size_t max, char **out, size_t *n);

/* Make the folder `name` (0755); an existing folder is fine when
 * `exist_ok`, a link never is. */
ts_status ts_dir_mkdir(const ts_dir *d, const char *name, int exist_ok);
/* Rename within d. Neither name may be a link. */
ts_status ts_dir_rename(const ts_dir *d, const char *from, const char *to);
/* Swap two folders atomically (renameat2 RENAME_EXCHANGE). */
ts_status ts_dir_exchange(const ts_dir *d, const char *a, const char *b);
/* Remove a regular file (absent is fine; a link or folder is an error). */
ts_status ts_dir_unlink(const ts_dir *d, const char *name);
/* Remove a folder holding only regular files (absent is fine). Everything
 * is checked before the first file goes: a link or a subfolder in it, or
 * the folder itself being a link, is an error and nothing is removed. */
ts_status ts_dir_remove_flat(const ts_dir *d, const char *name);
/* A listing of d from its first entry (readdir; closedir() it): through a
 * copy of d's descriptor, rewound, since the copy shares the offset an
 * earlier listing left at the end. */
ts_status ts_dir_list(const ts_dir *d, DIR **out);
/* fsync the directory so names created or renamed in it are durable. */
ts_status ts_dir_sync(const ts_dir *d);

#endif
