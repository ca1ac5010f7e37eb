/* The key holder's signature on its Paillier public key (src/fed/keysig.c)
 * and the client's check of it (src/fed/roles.c): a key signed by the key
 * holder's certificate is accepted; an altered text, a key signed by another
 * role's certificate (the aggregator's), one whose certificate another CA
 * issued or does not allow signatures, an unsigned key text and a cut-off
 * message are refused with a
 * message naming what failed. Then on loopback a real key holder and client
 * with a rogue aggregator between them that relays the key holder's key
 * unchanged (accepted) or substitutes its own: unsigned as the key holder
 * used to send it, inside the key holder's signed message, or signed with
 * its own certificate (each refused by the client before it encrypts). */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "fed/keysig.h"
#include "fed/paillier.h"
#include "fed/roles.h"

static char dir[] = "/tmp/tessel_fed_keysig_XXXXXX";
static char ca[600], other_ca[600];

typedef struct tls_paths {
    char cert[600], key[600];
    ts_fed_tls t;
} tls_paths;

/* The TLS files of `name` from the test CA (other: from the second CA). */
static void tls_of(const char *name, int other, tls_paths *p) {
    snprintf(p->cert, sizeof p->cert, "%s/%s%s.pem", dir, other ? "other/" : "", name);
    snprintf(p->key, sizeof p->key, "%s/%s%s.key", dir, other ? "other/" : "", name);
    p->t = (ts_fed_tls){other ? other_ca : ca, p->cert, p->key, 20.0};
}

/* The payload of `text` signed by `name`; NULL on failure (counted). */
static uint8_t *signed_by(const char *name, int other, const char *text, size_t *len) {
    tls_paths p;
    tls_of(name, other, &p);
    uint8_t *msg = NULL;
    CHECK_OK(ts_fed_pubkey_sign(&p.t, text, strlen(text), &msg, len));
    return msg;
}

/* Verifies msg as a client of the test CA would; returns the status and
 * checks that a refusal's message holds `want`. */
static void expect_refused(const char *label, const uint8_t *msg, size_t len, const char *want) {
    const char *t = NULL;
    size_t tl = 0;
    ts_status s = ts_fed_pubkey_verify(ca, "keyholder", msg, len, &t, &tl);
    CHECK(s != TS_OK && strstr(ts_last_error(), want), "%s: %s (wanted \"%s\")", label,
          s == TS_OK ? "accepted" : ts_last_error(), want);
}

static void functions(const char *kh_text, const char *agg_text) {
    size_t len = 0;
    uint8_t *good = signed_by("keyholder", 0, kh_text, &len);
    if (!good) return;
    const char *t = NULL;
    size_t tl = 0;
    CHECK_OK(ts_fed_pubkey_verify(ca, "keyholder", good, len, &t, &tl));
    CHECK(t && tl == strlen(kh_text) && !memcmp(t, kh_text, tl), "verified text differs");
    t = NULL;
    CHECK_OK(ts_fed_pubkey_text(good, len, &t, &tl));
    CHECK(t && tl == strlen(kh_text) && !memcmp(t, kh_text, tl), "relayed text differs");

    /* one hex digit of n changed */
    uint8_t *bad = malloc(len);
    memcpy(bad, good, len);
    char *nline = strstr((char *)bad + 4, "\nn ");
    CHECK(nline != NULL, "no n line in the key text");
    if (nline) nline[10] = nline[10] == 'a' ? 'b' : 'a';
    expect_refused("altered n", bad, len, "does not match the key");
    free(bad);

    /* the aggregator's key in the key holder's envelope (text replaced,
     * certificate and signature kept) */
    size_t al = strlen(agg_text), kl = strlen(kh_text), rl = len - kl + al;
    uint8_t *swap = malloc(rl);
    uint8_t l4[4] = {(uint8_t)al, (uint8_t)(al >> 8), (uint8_t)(al >> 16), (uint8_t)(al >> 24)};
    memcpy(swap, l4, 4);
    memcpy(swap + 4, agg_text, al);
    memcpy(swap + 4 + al, good + 4 + kl, len - 4 - kl);
    expect_refused("replaced key, key holder's signature", swap, rl, "does not match the key");
    free(swap);

    size_t ol = 0;
    uint8_t *own = signed_by("aggregator", 0, agg_text, &ol);
    if (own) expect_refused("signed by the aggregator", own, ol, "signed by 'aggregator'");
    free(own);
    uint8_t *foreign = signed_by("keyholder", 1, agg_text, &ol);
    if (foreign)
        expect_refused("a key holder of another CA", foreign, ol,
                       "not accepted by the CA " /* ... unable to get local issuer */);
    free(foreign);
    expect_refused("unsigned key text", (const uint8_t *)agg_text, al,
                   "is not a signed public key");
    expect_refused("cut off", good, len - 1, "field 3 is cut off");
    /* a key holder certificate of the right CA whose key usage leaves out
     * signatures (keyAgreement only) */
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && printf 'keyUsage=keyAgreement\\n' > ku.ext && "
             "openssl req -new -key keyholder.key -subj /CN=keyholder -out ku.csr 2>/dev/null && "
             "openssl x509 -req -in ku.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
             "-extfile ku.ext -out nosig.pem 2>/dev/null && cp keyholder.key nosig.key",
             dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    uint8_t *nosig = signed_by("nosig", 0, kh_text, &ol);
    if (nosig)
        expect_refused("a certificate without digitalSignature", nosig, ol,
                       "does not allow digital signatures");
    free(nosig);

    /* a key that does not belong to the certificate cannot sign */
    tls_paths p;
    tls_of("keyholder", 0, &p);
    snprintf(p.key, sizeof p.key, "%s/aggregator.key", dir);
    uint8_t *m = NULL;
    size_t ml = 0;
    ts_status s = ts_fed_pubkey_sign(&p.t, kh_text, kl, &m, &ml);
    CHECK(s != TS_OK && strstr(ts_last_error(), "does not belong"), "mismatched key: %s",
          ts_last_error());
    free(m);
    free(good);
}

/* ---- a rogue aggregator between a real key holder and a real client ---- */

static ts_fed_params fp;
static int port;

typedef struct role_job {
    ts_status s;
    char err[1024];
} role_job;

static ts_status train(void *user, int round, const float *global, float *local, int64_t n) {
    (void)user, (void)round;
    memcpy(local, global, (size_t)n * sizeof *local);
    return TS_OK;
}

static void *client_main(void *arg) {
    role_job *j = arg;
    tls_paths p;
    tls_of("client1", 0, &p);
    j->s = ts_fed_client_run(&fp, &p.t, "127.0.0.1", port, "aggregator", 10, 8, train, NULL);
    snprintf(j->err, sizeof j->err, "%s", ts_last_error());
    return NULL;
}

static void *kh_main(void *arg) {
    role_job *j = arg;
    tls_paths p;
    tls_of("keyholder", 0, &p);
    char key[700];
    snprintf(key, sizeof key, "%s/fed.priv", dir);
    float init[8] = {0};
    j->s =
        ts_fed_keyholder_run(&fp, &p.t, "127.0.0.1", port, "aggregator", key, init, 8, NULL, NULL);
    return NULL;
}

/* One client joins; the rogue sends it `key` as the PUBKEY message and, if
 * the client takes it, ends the run. Checks the client's error holds want. */
static void relay(ts_fed_listener *l, const char *label, const void *key, size_t len,
                  const char *want) {
    role_job cj = {0};
    pthread_t tc;
    pthread_create(&tc, NULL, client_main, &cj);
    ts_fed_conn *c = NULL;
    ts_fed_msg m = {0};
    CHECK_OK(ts_fed_accept(l, &c));
    if (c && ts_fed_recv(c, 8, &m) == TS_OK) { /* HELLO */
        ts_fed_msg_free(&m);
        ts_fed_send(c, TS_FED_MSG_PUBKEY, 0, key, len);
        ts_fed_send(c, TS_FED_MSG_DONE, 0, "rogue: the end", 14);
    }
    pthread_join(tc, NULL);
    ts_fed_close(c);
    CHECK(cj.s != TS_OK && strstr(cj.err, want), "%s: client said \"%s\" (wanted \"%s\")", label,
          cj.s == TS_OK ? "ok" : cj.err, want);
}

static void rogue(const char *agg_text) {
    tls_paths p;
    tls_of("aggregator", 0, &p);
    ts_fed_listener *l = NULL;
    CHECK_OK(ts_fed_listen(&p.t, "127.0.0.1", 0, &l));
    if (!l) return;
    port = ts_fed_listener_port(l);
    role_job kj = {0};
    pthread_t tk;
    pthread_create(&tk, NULL, kh_main, &kj);
    ts_fed_conn *kh = NULL;
    ts_fed_msg key = {0};
    CHECK_OK(ts_fed_accept(l, &kh));
    CHECK_OK(kh ? ts_fed_recv(kh, 1 << 16, &key) : TS_ERR_IO);
    if (key.data) {
        /* relayed unchanged: the client takes it and goes on to the rounds */
        relay(l, "relayed unchanged", key.data, key.len, "rogue: the end");
        /* what the old key holder sent, with the aggregator's own n and hs */
        relay(l, "unsigned substitute", agg_text, strlen(agg_text), "is not a signed public key");
        /* the aggregator's key in the key holder's signed message */
        const char *kt;
        size_t kl;
        if (ts_fed_pubkey_text(key.data, key.len, &kt, &kl) == TS_OK) {
            size_t al = strlen(agg_text), rl = key.len - kl + al;
            uint8_t *swap = malloc(rl);
            uint8_t l4[4] = {(uint8_t)al, (uint8_t)(al >> 8), (uint8_t)(al >> 16),
                             (uint8_t)(al >> 24)};
            memcpy(swap, l4, 4);
            memcpy(swap + 4, agg_text, al);
            memcpy(swap + 4 + al, key.data + 4 + kl, key.len - 4 - kl);
            relay(l, "substitute in the key holder's envelope", swap, rl, "does not match the key");
            free(swap);
        }
        size_t ol = 0;
        uint8_t *own = signed_by("aggregator", 0, agg_text, &ol);
        if (own) relay(l, "substitute signed by the aggregator", own, ol, "signed by 'aggregator'");
        free(own);
    }
    ts_fed_msg_free(&key);
    ts_fed_close(kh); /* the key holder then fails: the aggregator went away */
    pthread_join(tk, NULL);
    CHECK(kj.s != TS_OK, "the key holder should notice the rogue aggregator leaving");
    ts_fed_listener_free(l);
}

static char *key_text(void) {
    ts_paillier_priv *sk = NULL;
    ts_paillier_pub *pk = NULL;
    char *text = NULL;
    CHECK_OK(ts_paillier_keygen(1024, &sk));
    if (sk) CHECK_OK(ts_paillier_pub_of(sk, &pk));
    if (pk) CHECK_OK(ts_paillier_pub_to_text(pk, &text));
    ts_paillier_pub_free(pk);
    ts_paillier_priv_free(sk);
    return text;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    if (!mkdtemp(dir)) return 1;
    snprintf(ca, sizeof ca, "%s/ca.pem", dir);
    snprintf(other_ca, sizeof other_ca, "%s/other/ca.pem", dir);
    char cmd[1400];
    snprintf(cmd, sizeof cmd,
             "scripts/fed-test-ca.sh %s aggregator keyholder client1 && "
             "scripts/fed-test-ca.sh %s/other keyholder",
             dir, dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    char *kh_text = key_text(), *agg_text = key_text();
    if (kh_text && agg_text) functions(kh_text, agg_text);
    fp = ts_fed_params_default();
    fp.rounds = 1;
    fp.min_clients = 1;
    fp.max_clients = 2;
    fp.key_bits = 1024;
    fp.join_s = 20;
    if (agg_text) rogue(agg_text);
    free(kh_text);
    free(agg_text);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
    return check_summary("unit/fed_keysig");
}
