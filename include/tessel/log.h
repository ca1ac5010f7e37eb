/* tessel/log.h — where tessel's warnings and notes go.
 *
 * By default warnings go to stderr as "tessel: warning: ...". Install a
 * callback to route them elsewhere (a test can capture them):
 *
 *     static void on_log(ts_log_level lv, const char *msg, void *user) { ... }
 *     ts_set_log_callback(on_log, NULL);
 */
#ifndef TESSEL_LOG_H
#define TESSEL_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ts_log_level { TS_LOG_DEBUG, TS_LOG_INFO, TS_LOG_WARN, TS_LOG_ERROR } ts_log_level;
typedef void (*ts_log_fn)(ts_log_level level, const char *msg, void *user);

/* fn == NULL restores the default (stderr, warnings and errors only). */
void ts_set_log_callback(ts_log_fn fn, void *user);
void ts_set_log_level(ts_log_level min_level);

#ifdef __cplusplus
}
#endif
#endif
