/* roles.h — the three roles of a federated run with Paillier aggregation
 * (docs/federated.md, "Roles"), each a blocking loop over the transport of
 * net.h:
 *
 *   aggregator  listens; the key holder and the clients connect to it. Per
 *               round it sends each client the global model and its FedAvg
 *               weight, adds the encrypted updates that arrive in time and
 *               passes the sum to the key holder. It never holds a secret
 *               key or a plaintext update.
 *   key holder  owns the Paillier key pair; sends the public key and the
 *               first global model, then per round decrypts only the sum,
 *               turns it into the new global model and hands it back.
 *   client      per round trains from the global model (a callback), and
 *               sends its weighted update Δ = local − global, packed and
 *               encrypted.
 *
 * With fed.secure: none (fp->secure = 2) the clients send their updates in
 * the clear and the aggregator sums them (the baseline of the protected
 * modes; no privacy from the aggregator).
 *
 * With fed.secure: masking (fp->secure = 1) there is no key: the clients mask
 * their updates (mask.h) and the aggregator, relaying their keys and shares,
 * learns only the sum, which it passes to the key holder (then only the
 * keeper of the model and its checkpoints).
 *
 * Every frame carries its round; one from another round is dropped as
 * replayed or stale, as is one whose hash does not match. A client that
 * fails, disconnects or times out is dropped from the round; the round
 * completes with at least min_clients updates (weights renormalised over
 * those who finished) and fails otherwise.
 *
 *     ts_fed_params fp = ts_fed_params_default();
 *     ts_fed_aggregator_run(&fp, listener, "keyholder", metrics_file);   // tessel fed serve
 *     ts_fed_keyholder_run(&fp, &tls, "127.0.0.1", port, "aggregator", "fed.priv",
 *                          init, n, on_global, user);                     // tessel fed keyholder
 *     ts_fed_client_run(&fp, &tls, "127.0.0.1", port, "aggregator", samples,
 *                       n, train, user);                                  // tessel fed join
 */
#ifndef TS_FED_ROLES_H
#define TS_FED_ROLES_H

#include <stdio.h>
#include "fed/net.h"

typedef struct ts_fed_params {
    int rounds;             /* rounds to run */
    int min_clients;        /* a round needs at least this many updates */
    int max_clients;        /* clients admitted at most; the packing's headroom is the
                               number admitted (SETUP) */
    int key_bits;           /* Paillier modulus size */
    double scale, clip;     /* fixed point of the updates (pack.h) */
    double join_s;          /* how long the aggregator admits clients before round 1 */
    int pool;               /* r^n precomputed per client (0: none) */
    int pool_threads;       /* threads filling that pool (>= 1) */
    int secure;             /* 0: Paillier; 1: masking (roles_mask.c; no key at all);
                               2: none, plain FedAvg (roles_plain.c; no protection) */
    int threshold;          /* masking: shares needed to unmask (0: a majority of the round) */
    struct ts_fed_obs *obs; /* Prometheus metrics of this role (obs.h); NULL: none */
    /* The key holder's certificate CN: a client takes only a Paillier public
     * key signed with that certificate's key (keysig.h). */
    const char *keyholder_name;
} ts_fed_params;

ts_fed_params ts_fed_params_default(void);

/* What the key holder learns about a round (for its audit log and metrics). */
typedef struct ts_fed_round_info {
    int round, clients, dropped;
    double weight_sum;        /* FedAvg weights of the clients summed */
    const char *participants; /* "name bytes sha256" per client, ';'-separated */
    uint64_t bytes_up;        /* encrypted update bytes the aggregator received */
    double aggregate_s, decrypt_s;
} ts_fed_round_info;

/* The key holder's new global model after each round (round 0: the start). */
typedef ts_status (*ts_fed_global_fn)(void *user, const float *params, int64_t n,
                                      const ts_fed_round_info *info);
/* A client's local training: local = the model after training from global. */
typedef ts_status (*ts_fed_train_fn)(void *user, int round, const float *global, float *local,
                                     int64_t n);

/* Runs the aggregator on an open listener until every round is done or a
 * round fails; one JSON line per round goes to metrics (may be NULL). */
ts_status ts_fed_aggregator_run(const ts_fed_params *fp, ts_fed_listener *l,
                                const char *keyholder_name, FILE *metrics);
/* The key holder: loads the private key file (generating it, mode 0600, when
 * it does not exist), starts from init[n] and calls on_global per round. */
ts_status ts_fed_keyholder_run(const ts_fed_params *fp, const ts_fed_tls *tls, const char *host,
                               int port, const char *server_name, const char *key_path,
                               const float *init, int64_t n, ts_fed_global_fn on_global,
                               void *user);
/* A client with `samples` training examples and a model of n parameters. */
ts_status ts_fed_client_run(const ts_fed_params *fp, const ts_fed_tls *tls, const char *host,
                            int port, const char *server_name, int64_t samples, int64_t n,
                            ts_fed_train_fn train, void *user);

/* Message types (the payloads are described in roles.c). */
enum {
    TS_FED_MSG_PUBKEY = 1, /* key holder -> aggregator -> clients: the public key file
                              text, signed by the key holder (keysig.h) */
    TS_FED_MSG_HELLO,      /* client -> aggregator: u64 samples */
    TS_FED_MSG_GLOBAL,     /* key holder -> aggregator: f32 params */
    TS_FED_MSG_ROUND,      /* aggregator -> client: f64 weight, f32 params */
    TS_FED_MSG_UPDATE,     /* client -> aggregator: ciphertexts */
    TS_FED_MSG_AGGREGATE,  /* aggregator -> key holder: u32 k, f64 weights, u32 text, text,
                              ciphertexts */
    TS_FED_MSG_DONE,       /* the run is over */
    /* masking mode (roles_mask.c) */
    TS_FED_MSG_MKEYS,
    TS_FED_MSG_KEYSET,
    TS_FED_MSG_SHARES,
    TS_FED_MSG_BOXES,
    TS_FED_MSG_MASKED,
    TS_FED_MSG_UNMASK,
    TS_FED_MSG_ANSWERS,
    /* Paillier: aggregator -> key holder, clients once admission is over:
       u32 clients admitted, the packing's headroom */
    TS_FED_MSG_SETUP
};

#endif
