/* e2e.h — running the tessel command line from end-to-end tests.
 *
 *     char dir[64];
 *     if (!e2e_setup("mytest", dir, sizeof dir)) return check_summary("e2e/mytest");
 *     e2e_result r = e2e_run("compile examples/w1.yaml --dump memory");
 *     CHECK(r.rc == 0, "%s", r.err);
 *     e2e_done(&r);
 *     e2e_cleanup(dir);
 */
#ifndef TS_TEST_E2E_H
#define TS_TEST_E2E_H

#include <stddef.h>

typedef struct e2e_result {
    int rc;          /* exit status, -1 if killed by a signal */
    char *out, *err; /* captured stdout and stderr (never NULL) */
} e2e_result;

/* The tessel binary and a directory for the captured output files. */
void e2e_init(const char *bin, const char *dir);
/* The usual start of an e2e test: the binary from $TESSEL_BIN (default
 * build/tessel; a failed check if it is not executable), a new scratch directory
 * /tmp/tessel-TAG-XXXXXX written into dir (n bytes), and e2e_init with
 * both. Returns the binary, or NULL when the test cannot run (the failed
 * check is recorded). */
const char *e2e_setup(const char *tag, char *dir, size_t n);
/* Removes a scratch directory and everything in it, unless a check has
 * failed (then it stays, for a look at what the runs left there). */
void e2e_cleanup(const char *dir);
/* DIR/name in the directory given to e2e_init; the result stays valid for
 * the next 7 calls (so several can appear in one call's arguments). */
const char *e2e_path(const char *name);
/* A whole file as a NUL-terminated string ("" if unreadable); *len gets its
 * length (may be NULL). Free with free(). */
char *e2e_slurp(const char *path, long *len);
/* Run `tessel ARGS` through the shell. */
e2e_result e2e_run(const char *args);
/* The same with printf-style arguments. */
e2e_result e2e_runf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void e2e_done(e2e_result *r);
/* Run a shell command (printf-style) that must succeed; a failed check names it otherwise. */
void e2e_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The first executable mpirun on $PATH into out (n bytes): 1, or 0 when there is none. */
int e2e_find_mpirun(char *out, size_t n);

#endif
