/* The federated transport (src/fed/net.c) on loopback: TLS 1.3 with mutual
 * certificates from a test CA (scripts/fed-test-ca.sh), hashed frames both
 * ways, a tampered frame and an oversized one refused, a client whose
 * certificate another CA signed refused, a server with the wrong name
 * refused, timeouts, and a client that starts before its server. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "fed/net.h"

enum { ECHO, TAMPER, OVERSIZE, REFUSE, SILENT };

typedef struct server_job {
    ts_fed_listener *l;
    int mode;
    ts_status accept_s, recv_s;
    char peer[256], err[1024];
} server_job;

static void *server_main(void *arg) {
    server_job *j = arg;
    ts_fed_conn *c = NULL;
    j->accept_s = ts_fed_accept(j->l, &c);
    if (j->accept_s != TS_OK) {
        snprintf(j->err, sizeof j->err, "%s", ts_last_error());
        return NULL;
    }
    snprintf(j->peer, sizeof j->peer, "%s", ts_fed_peer(c));
    ts_fed_msg m;
    j->recv_s = ts_fed_recv(c, j->mode == OVERSIZE ? 100 : 1 << 24, &m);
    if (j->recv_s != TS_OK) snprintf(j->err, sizeof j->err, "%s", ts_last_error());
    if (j->recv_s == TS_OK && j->mode == ECHO) {
        for (uint64_t i = 0; i < m.len; i++) m.data[i] ^= 0x5a;
        ts_fed_send(c, m.type + 1, m.round, m.data, m.len);
    }
    ts_fed_msg_free(&m);
    ts_fed_close(c);
    return NULL;
}

static void start(server_job *j, pthread_t *t, ts_fed_listener *l, int mode) {
    memset(j, 0, sizeof *j);
    j->l = l;
    j->mode = mode;
    pthread_create(t, NULL, server_main, j);
}

/* A server that starts listening on a known port 0.5 s late and echoes one
 * frame. */
typedef struct late_job {
    const ts_fed_tls *tls;
    int port;
    server_job s;
} late_job;

static void *late_server(void *arg) {
    late_job *lj = arg;
    struct timespec half = {0, 500 * 1000 * 1000};
    nanosleep(&half, NULL);
    ts_fed_listener *l = NULL;
    if (ts_fed_listen(lj->tls, "127.0.0.1", lj->port, &l) != TS_OK) {
        lj->s.accept_s = TS_ERR_IO;
        snprintf(lj->s.err, sizeof lj->s.err, "listen: %s", ts_last_error());
        return NULL;
    }
    lj->s.l = l;
    lj->s.mode = ECHO;
    server_main(&lj->s);
    ts_fed_listener_free(l);
    return NULL;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/tessel_fed_net_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "scripts/fed-test-ca.sh %s/a agg client1 && scripts/fed-test-ca.sh %s/b client1", dir,
             dir);
    CHECK(system(cmd) == 0, "%s failed", cmd);
    char ca[512], cert[512], key[512], other_cert[512], other_key[512], scert[512], skey[512];
    snprintf(ca, sizeof ca, "%s/a/ca.pem", dir);
    snprintf(scert, sizeof scert, "%s/a/agg.pem", dir);
    snprintf(skey, sizeof skey, "%s/a/agg.key", dir);
    snprintf(cert, sizeof cert, "%s/a/client1.pem", dir);
    snprintf(key, sizeof key, "%s/a/client1.key", dir);
    snprintf(other_cert, sizeof other_cert, "%s/b/client1.pem", dir);
    snprintf(other_key, sizeof other_key, "%s/b/client1.key", dir);
    ts_fed_tls stls = {ca, scert, skey, 3.0}, ctls = {ca, cert, key, 3.0},
               otls = {ca, other_cert, other_key, 3.0};

    ts_fed_listener *l = NULL;
    CHECK_OK(ts_fed_listen(&stls, "127.0.0.1", 0, &l));
    if (!l) return check_summary("unit/fed_net");
    int port = ts_fed_listener_port(l);
    CHECK(port > 0, "port %d", port);
    server_job j;
    pthread_t t;
    ts_fed_conn *c = NULL;

    /* a round trip of 1 MiB, both peers named by their certificates */
    start(&j, &t, l, ECHO);
    CHECK_OK(ts_fed_connect(&ctls, "127.0.0.1", port, "agg", &c));
    if (c) {
        CHECK(strcmp(ts_fed_peer(c), "agg") == 0, "server CN %s", ts_fed_peer(c));
        size_t n = 1 << 20;
        uint8_t *buf = malloc(n);
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i * 31);
        CHECK_OK(ts_fed_send(c, 7, 42, buf, n));
        ts_fed_msg m;
        CHECK_OK(ts_fed_recv(c, 1 << 24, &m));
        int same = m.type == 8 && m.round == 42 && m.len == n;
        for (size_t i = 0; same && i < n; i++) same = m.data[i] == (uint8_t)(buf[i] ^ 0x5a);
        CHECK(same, "echo differs (type %u round %llu len %llu)", m.type,
              (unsigned long long)m.round, (unsigned long long)m.len);
        uint64_t sent, recvd;
        ts_fed_conn_bytes(c, &sent, &recvd);
        CHECK(sent == n + 56 && recvd == n + 56, "bytes sent %llu received %llu",
              (unsigned long long)sent, (unsigned long long)recvd);
        ts_fed_msg_free(&m);
        free(buf);
        ts_fed_close(c);
    }
    pthread_join(t, NULL);
    CHECK(j.accept_s == TS_OK && j.recv_s == TS_OK && strcmp(j.peer, "client1") == 0,
          "server: %s peer %s", j.err, j.peer);

    /* a frame whose payload changed after its hash was made */
    start(&j, &t, l, TAMPER);
    CHECK_OK(ts_fed_connect(&ctls, "127.0.0.1", port, "agg", &c));
    if (c) {
        uint8_t payload[64] = {1, 2, 3}, header[TS_FED_FRAME_HEADER], hash[TS_FED_FRAME_HASH];
        ts_fed_frame_seal(3, 9, payload, sizeof payload, header, hash);
        payload[10] ^= 1;
        CHECK_OK(ts_fed_send_raw(c, header, sizeof header));
        CHECK_OK(ts_fed_send_raw(c, payload, sizeof payload));
        CHECK_OK(ts_fed_send_raw(c, hash, sizeof hash));
        pthread_join(t, NULL);
        ts_fed_close(c);
    } else {
        pthread_join(t, NULL);
    }
    CHECK(j.recv_s == TS_ERR_FORMAT && strstr(j.err, "SHA-256") && strstr(j.err, "client1"),
          "tampered: %s", j.err);

    /* a frame longer than the receiver expects is refused before it is read */
    start(&j, &t, l, OVERSIZE);
    CHECK_OK(ts_fed_connect(&ctls, "127.0.0.1", port, "agg", &c));
    if (c) {
        uint8_t payload[200] = {0};
        ts_fed_send(c, 1, 1, payload, sizeof payload);
    }
    pthread_join(t, NULL);
    ts_fed_close(c);
    CHECK(j.recv_s == TS_ERR_FORMAT && strstr(j.err, "200 bytes"), "oversized: %s", j.err);

    /* a client certificate from another CA: the server refuses the handshake */
    start(&j, &t, l, REFUSE);
    ts_status s = ts_fed_connect(&otls, "127.0.0.1", port, "agg", &c);
    if (s == TS_OK) { /* the refusal may reach the client only at its first read */
        ts_fed_msg m;
        ts_fed_send(c, 1, 1, "x", 1);
        s = ts_fed_recv(c, 100, &m);
        ts_fed_close(c);
    }
    pthread_join(t, NULL);
    CHECK(s != TS_OK, "the client of another CA was served");
    CHECK(j.accept_s == TS_ERR_INVALID && strstr(j.err, "certificate"), "other CA: %s", j.err);

    /* a server whose certificate names someone else */
    start(&j, &t, l, REFUSE);
    s = ts_fed_connect(&ctls, "127.0.0.1", port, "keyholder", &c);
    CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "certificate"), "wrong server name: %s",
          ts_last_error());
    pthread_join(t, NULL);

    /* timeouts: no client; a client that says nothing */
    stls.timeout_s = 1.5;
    ts_fed_listener *l2 = NULL;
    CHECK_OK(ts_fed_listen(&stls, "127.0.0.1", 0, &l2));
    if (l2) {
        ts_fed_conn *none = NULL;
        CHECK(ts_fed_accept(l2, &none) == TS_ERR_IO && strstr(ts_last_error(), "no connection"),
              "accept: %s", ts_last_error());
        start(&j, &t, l2, SILENT);
        CHECK_OK(ts_fed_connect(&ctls, "127.0.0.1", ts_fed_listener_port(l2), "agg", &c));
        pthread_join(t, NULL);
        CHECK(j.recv_s == TS_ERR_IO && strstr(j.err, "timed out"), "silent client: %s", j.err);
        ts_fed_close(c);
        ts_fed_listener_free(l2);
    }
    /* roles start in any order: a client started before its server retries
     * a refused connection until the server listens, within timeout_s */
    stls.timeout_s = 3.0;
    ts_fed_listener *l3 = NULL;
    CHECK_OK(ts_fed_listen(&stls, "127.0.0.1", 0, &l3));
    int late_port = l3 ? ts_fed_listener_port(l3) : 0;
    ts_fed_listener_free(l3); /* nobody listens on late_port now */
    late_job lj = {&stls, late_port, {0}};
    pthread_t lt;
    pthread_create(&lt, NULL, late_server, &lj);
    c = NULL;
    CHECK_OK(ts_fed_connect(&ctls, "127.0.0.1", late_port, "agg", &c));
    if (c) {
        CHECK_OK(ts_fed_send(c, 1, 1, "late", 4));
        ts_fed_msg m;
        CHECK_OK(ts_fed_recv(c, 100, &m));
        CHECK(m.len == 4 && m.type == 2, "late server's echo: type %u len %llu", m.type,
              (unsigned long long)m.len);
        ts_fed_msg_free(&m);
        ts_fed_close(c);
    }
    pthread_join(lt, NULL);
    CHECK(lj.s.accept_s == TS_OK && lj.s.recv_s == TS_OK, "late server: %s", lj.s.err);
    /* and gives up after timeout_s, saying for how long it tried */
    ctls.timeout_s = 1.0;
    c = NULL;
    s = ts_fed_connect(&ctls, "127.0.0.1", late_port, "agg", &c);
    CHECK(s == TS_ERR_IO && c == NULL && strstr(ts_last_error(), "refused") &&
              strstr(ts_last_error(), "tried for"),
          "nobody listening: %s", ts_last_error());

    ts_fed_listener_free(l);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
    return check_summary("unit/fed_net");
}
