/* obs.h — Prometheus metrics of a federated role (docs/federated.md,
 * "Metrics"): each role counts what it measures itself (the aggregator the
 * bytes per client, the clients that finished and dropped and the
 * aggregation time; the key holder the decryption time; a client its
 * training and encryption time and its own bytes), renders them in the
 * text format 0.0.4 to DIR/metrics.prom after every round (replaced
 * atomically, for a node exporter's textfile collector), appends the
 * round's phases as one JSON line to DIR/rounds.jsonl (metrics.prom holds
 * the last round only) and, when a port is given, serves them on
 * /metrics.
 *
 *     ts_fed_obs *o;
 *     ts_fed_obs_create("aggregator", dir, "127.0.0.1", 9400, &o);  // port 0: no endpoint
 *     ts_fed_obs_bytes(o, "site1", up, down);                      // any time
 *     ts_fed_obs_round(o, &(ts_fed_obs_round_info){.round = 1, ...});  // writes metrics.prom
 *     ts_fed_obs_free(o);
 *
 * Every function accepts a NULL observer and then does nothing, so the
 * role loops call them unconditionally. */
#ifndef TS_FED_OBS_H
#define TS_FED_OBS_H

#include <stdint.h>
#include "tessel/tessel.h"

typedef struct ts_fed_obs ts_fed_obs;

/* What one role measured in one round; a time below 0 is not this role's
 * to measure and is left out. */
typedef struct ts_fed_obs_round_info {
    int round, clients, dropped;
    double train_s, encrypt_s, aggregate_s, decrypt_s, round_s;
    /* the rest of a round: a client's sending of its update (upload); the
     * aggregator's sending of the round's global model to the clients
     * (broadcast), its wait for their updates (updates: their training,
     * encryption and upload, less its own aggregating meanwhile) and the
     * key holder's turn (keyholder: the aggregate sent, decrypted, the new
     * global model committed and received back) */
    double upload_s, broadcast_s, updates_s, keyholder_s;
    /* a Paillier client with an r^n pool (fed.pool > 0): has_pool set, and
     * this round's encryptions that took a precomputed r^n (hits) and that
     * computed their own (misses) */
    int has_pool;
    int64_t pool_hits, pool_misses;
} ts_fed_obs_round_info;

/* role: "aggregator", "keyholder" or "client" (the `role` label of every
 * series); dir: where metrics.prom goes (NULL: no file); port > 0: serve
 * /metrics on addr:port. */
ts_status ts_fed_obs_create(const char *role, const char *dir, const char *addr, int port,
                            ts_fed_obs **out);
void ts_fed_obs_free(ts_fed_obs *o);
/* Bytes sent to (down) and received from (up) the client `client`
 * (the aggregator), or a client's own (up: sent, down: received). */
void ts_fed_obs_bytes(ts_fed_obs *o, const char *client, uint64_t up, uint64_t down);
/* Records a finished round, rewrites DIR/metrics.prom and appends to
 * DIR/rounds.jsonl. */
ts_status ts_fed_obs_round(ts_fed_obs *o, const ts_fed_obs_round_info *r);

#endif
