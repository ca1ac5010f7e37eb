#include <stdarg.h>
#include <stdio.h>
#include "core.h"

static ts_log_fn log_fn;
static void *log_user;
static ts_log_level log_min = TS_LOG_WARN;

void ts_set_log_callback(ts_log_fn fn, void *user) {
    log_fn = fn;
    log_user = user;
}

void ts_set_log_level(ts_log_level min_level) { log_min = min_level; }

void ts_logf(ts_log_level lv, const char *fmt, ...) {
    if (lv < log_min) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_fn) {
        log_fn(lv, msg, log_user);
        return;
    }
    static const char *names[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "tessel: %s: %s\n", names[lv], msg);
}
