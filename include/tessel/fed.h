/* tessel/fed.h — federated training across institutions (docs/federated.md):
 * the three roles of `tessel fed serve|keyholder|join CONFIG`, each a
 * process reading the same config (its fed.* keys, docs/config.md; and
 * for a client the model, data and train keys of its own data shard).
 *
 *     ts_config c;                                   // loaded and finished
 *     ts_fed_serve(&c, "runs/agg");                  // the aggregator: metrics.jsonl
 *     ts_fed_keyholder(&c, "runs/kh");               // the key holder: checkpoints, audit.log
 *     ts_fed_join(&c, "runs/site1");                 // a client: one run directory per round
 *
 * Each returns when the configured rounds are done or a round failed. */
#ifndef TESSEL_FED_H
#define TESSEL_FED_H

#include "tessel/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The aggregator: listens on fed.addr:fed.port, adds encrypted updates,
 * never holds a secret key. Writes DIR/metrics.jsonl (a line per round). */
ts_status ts_fed_serve(const ts_config *c, const char *dir);
/* The key holder: loads (or makes, 0600) fed.key, starts from the model's
 * initialisation (train.seed), decrypts only each round's sum, and saves
 * every global model as a checkpoint in DIR (signed with ckpt.sign_key when
 * set), logging each round (participants, bytes, hashes) to DIR/audit.log and
 * DIR/metrics.jsonl. */
ts_status ts_fed_keyholder(const ts_config *c, const char *dir);
/* A client: per round trains fed.local_steps steps from the global model on
 * its own data (a run directory DIR/round-N each) and sends its encrypted,
 * sample-weighted update. Its weight is ts_fed_samples. */
ts_status ts_fed_join(const ts_config *c, const char *dir);
/* A client's FedAvg weight: the examples of its training split (all of its
 * data less data.val_fraction, as its local runs split it), for data.source
 * csv (rows), idx and npy (examples of the pair); other sources are refused
 * naming the source. */
ts_status ts_fed_samples(const ts_config *c, int64_t *out);

#ifdef __cplusplus
}
#endif
#endif
