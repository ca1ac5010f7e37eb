#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "core.h"

static _Thread_local char err_msg[1024];

ts_status ts_fail(ts_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    return s;
}

void ts_error_prefix(const char *fmt, ...) {
    char prefix[512], old[sizeof err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_msg, sizeof old);
    size_t k = strlen(prefix);
    if (k > sizeof err_msg - 3) k = sizeof err_msg - 3;
    memcpy(err_msg, prefix, k);
    memcpy(err_msg + k, ": ", 2);
    size_t rest = sizeof err_msg - k - 3, n = strlen(old);
    if (n > rest) n = rest;
    memcpy(err_msg + k + 2, old, n);
    err_msg[k + 2 + n] = 0;
}

const char *ts_last_error(void) { return err_msg; }

const char *ts_status_name(ts_status s) {
    switch (s) {
    case TS_OK: return "ok";
    case TS_ERR_INVALID: return "invalid argument";
    case TS_ERR_SHAPE: return "shape error";
    case TS_ERR_NOMEM: return "out of memory";
    case TS_ERR_IO: return "i/o error";
    case TS_ERR_FORMAT: return "format error";
    case TS_ERR_NUMERIC: return "numeric error";
    case TS_ERR_UNSUPPORTED: return "unsupported";
    case TS_ERR_NOT_FOUND: return "not found";
    case TS_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}
