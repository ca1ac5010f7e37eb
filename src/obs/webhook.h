/* webhook.h — HTTP POST of a JSON body (alert action `webhook`), with
 * libcurl. */
#ifndef TS_OBS_WEBHOOK_H
#define TS_OBS_WEBHOOK_H

#include "tessel/status.h"

/* POST `json` to `url` with Content-Type application/json; fails on a
 * transport error, after timeout_s, or on an HTTP status >= 400. */
ts_status ts_webhook_post(const char *url, const char *json, double timeout_s);

#endif
