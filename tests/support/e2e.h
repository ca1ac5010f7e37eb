/* e2e.h — running the tessel command line from end-to-end tests.
 *
 *     e2e_init(getenv("TESSEL_BIN"), tmpdir);      // binary and scratch dir
 *     e2e_result r = e2e_run("compile examples/w1.yaml --dump memory");
 *     CHECK(r.rc == 0, "%s", r.err);
 *     e2e_done(&r);
 */
#ifndef TS_TEST_E2E_H
#define TS_TEST_E2E_H

typedef struct e2e_result {
    int rc;          /* exit status, -1 if killed by a signal */
    char *out, *err; /* captured stdout and stderr (never NULL) */
} e2e_result;

/* The tessel binary and a directory for the captured output files. */
void e2e_init(const char *bin, const char *dir);
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

#endif
