/* buckets.h — shape buckets (shape.batch_buckets, shape.seq_buckets):
 * parsing the key's text and picking the bucket a batch runs on.
 *
 *     ts_buckets b;
 *     s = ts_buckets_parse("multiple:8", "shape.batch_buckets", "t.yaml:3:5", &b);
 *     int64_t B = ts_buckets_pick(&b, 13, 64);   // 16: the smallest bucket >= 13
 *     int64_t none = ts_buckets_pick(&b, 65, 64); // 0: no bucket holds 65 rows
 *
 * A rule (multiple:N, pow2) yields its sizes up to `full` (model.batch or
 * model.ctx), and `full` itself is always a bucket of a rule, so a full
 * batch never pads. An explicit list is taken as written: strictly
 * increasing positive sizes, its last entry the largest bucket. */
#ifndef TS_FRONTEND_BUCKETS_H
#define TS_FRONTEND_BUCKETS_H

#include <stdint.h>
#include "tessel/config.h"
#include "tessel/tessel.h"

enum { TS_MAX_BUCKETS = 64 };

typedef enum ts_bucket_kind {
    TS_BUCKETS_LIST = 0,
    TS_BUCKETS_MULTIPLE,
    TS_BUCKETS_POW2
} ts_bucket_kind;

typedef struct ts_buckets {
    ts_bucket_kind kind;
    int64_t step;              /* multiple:N: N */
    int n;                     /* list: entries */
    int64_t v[TS_MAX_BUCKETS]; /* list: increasing */
} ts_buckets;

/* Parses `text`; errors name `key`, `where` (its origin) and the value. */
ts_status ts_buckets_parse(const char *text, const char *key, const char *where, ts_buckets *out);
/* The smallest bucket >= need (need >= 1); 0 when none holds it. */
int64_t ts_buckets_pick(const ts_buckets *b, int64_t need, int64_t full);
/* The largest bucket. */
int64_t ts_buckets_largest(const ts_buckets *b, int64_t full);
/* Every bucket in increasing order into out (at most cap); returns how many. */
int ts_buckets_all(const ts_buckets *b, int64_t full, int64_t *out, int cap);

/* ts_config_finish: both bucket keys parse, and data.drop_last's default
 * (false: every policy trains an epoch's short last batch). */
ts_status cfg_check_shape(ts_config *c);

#endif
