/* run_checks.h — checks shared by ts_config_finish and ts_config_check_run
 * (internal to src/frontend).
 *
 *     ts_status s = cfg_check_ports(c, 0, c->dist.procs);   // every rank's port <= 65535
 */
#ifndef TS_FRONTEND_RUN_CHECKS_H
#define TS_FRONTEND_RUN_CHECKS_H

#include "frontend/config.h"

/* observe.metrics_port: each rank serves base + rank; c holds rank `rank`'s
 * port (base + rank), so the last of nranks serves
 * metrics_port + nranks - 1 - rank, which must be a port (<= 65535). */
ts_status cfg_check_ports(const ts_config *c, int rank, int nranks);

#endif
