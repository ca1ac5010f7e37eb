/* tessel/status.h — status codes and error messages.
 *
 * Every library function that can fail returns a ts_status. On failure it
 * also leaves a message in a thread-local buffer that names what went wrong
 * and where (op, value, shape, file, ...):
 *
 *     if (ts_compile(g, &spec, NULL, &plan) != TS_OK)
 *         fprintf(stderr, "compile failed: %s\n", ts_last_error());
 *
 * The message stays until the next failure on the same thread. Code built
 * on the library (the tools, a program's own helpers) reports its failures
 * the same way:
 *
 *     if (n < 1) return ts_fail(TS_ERR_INVALID, "bench: steps must be >= 1");
 *     if ((s = ts_compile(g, &spec, &opt, &p)) != TS_OK) {
 *         ts_error_prefix("workload %s", name);   // "workload W1: matmul: ..."
 *         return s;
 *     }
 */
#ifndef TESSEL_STATUS_H
#define TESSEL_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ts_status {
    TS_OK = 0,
    TS_ERR_INVALID,     /* bad argument or attribute */
    TS_ERR_SHAPE,       /* shapes or dtypes do not fit the op */
    TS_ERR_NOMEM,       /* an allocation failed */
    TS_ERR_IO,          /* a file could not be read or written */
    TS_ERR_FORMAT,      /* a file or text is malformed */
    TS_ERR_NUMERIC,     /* a NaN/Inf was produced where checking was asked for */
    TS_ERR_UNSUPPORTED, /* valid, but this build or backend cannot do it */
    TS_ERR_NOT_FOUND,   /* a named value, parameter or file does not exist */
    TS_ERR_INTERNAL     /* a bug in tessel: please report it */
} ts_status;

/* The message of the last failure on this thread ("" if none). */
const char *ts_last_error(void);

/* A short name of a status code, e.g. "shape error". */
const char *ts_status_name(ts_status s);

#ifndef TS_PRINTF
#if defined(__GNUC__)
#define TS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TS_PRINTF(a, b)
#endif
#endif

/* Record a failure message for this thread and return `s`, so callers write
 * `return ts_fail(TS_ERR_SHAPE, "matmul: ...")`. */
ts_status ts_fail(ts_status s, const char *fmt, ...) TS_PRINTF(2, 3);
/* Prefix the current message with "prefix: " (adds context on the way up). */
void ts_error_prefix(const char *fmt, ...) TS_PRINTF(1, 2);

#ifdef __cplusplus
}
#endif
#endif
