/* anomaly.h — the budget of anomaly snapshots: the checkpoints
 * RUN_DIR/step-N-anomaly/ that the alert actions snapshot and pause write
 * (docs/observability.md). A noisy metric must not fill the disk, so a
 * run writes at most `max` of them (per tessel train process; 0: no
 * limit) and keeps the newest `keep` on disk (0: all). How often one rule
 * may ask for one is its cooldown (alert.h).
 *
 *     ts_anomaly_budget b = {cfg.snapshot_max, cfg.snapshot_keep};
 *     if (ts_anomaly_admit(&b)) {
 *         ... write step-N-anomaly/ ...
 *         int removed;
 *         ts_anomaly_retain(run_dir, b.keep, &removed);   // older ones beyond keep
 *     }
 */
#ifndef TS_OBS_ANOMALY_H
#define TS_OBS_ANOMALY_H

#include <stdint.h>
#include "core/core.h"

typedef struct ts_anomaly_budget {
    int max;         /* snapshots this process may write (0: no limit) */
    int keep;        /* newest snapshots kept in the run directory (0: all) */
    int written;     /* admitted so far */
    int64_t refused; /* asked for past max */
} ts_anomaly_budget;

/* 1 (and counted as written) when another snapshot may be written; 0 past
 * the cap. */
int ts_anomaly_admit(ts_anomaly_budget *b);

/* Remove all but the newest `keep` step-N-anomaly/ folders of run_dir
 * (keep 0: none removed); *removed (may be NULL) counts them. Reached
 * through the run directory's descriptor without following links
 * (core/fsat.h): a link or a file under such a name is an error naming
 * it, and then nothing is removed. */
ts_status ts_anomaly_retain(const char *run_dir, int keep, int *removed);

#endif
