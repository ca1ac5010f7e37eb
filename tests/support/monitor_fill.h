/* monitor_fill.h — a gradient monitor filled by hand, for alert tests that
 * evaluate rules without a plan. */
#ifndef TS_TEST_MONITOR_FILL_H
#define TS_TEST_MONITOR_FILL_H

#include "obs/monitor.h"

/* Every monitored value NaN except loss, gradient norm and variance (as
 * given) and the non-finite count (0). */
void tm_set_values(ts_monitor *m, double loss, double norm, double var);

#endif
