/* Prometheus metrics of a federated role (src/fed/obs.c): the series after
 * two rounds in DIR/metrics.prom (bytes per client summed over rounds, the
 * last round's gauges, dropped clients counted), phases a role does not
 * measure left out, the /metrics endpoint serving the same text, a NULL
 * observer doing nothing, one line per round in DIR/rounds.jsonl with the
 * phases the role measured, and a metrics.prom temporary that is a
 * symbolic link refused rather than followed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "fed/obs.h"

static char dir[] = "/tmp/tessel_fed_obs_XXXXXX";

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return calloc(1, 1);
    char *b = calloc(1, 1 << 16);
    size_t n = fread(b, 1, (1 << 16) - 1, f);
    b[n] = 0;
    fclose(f);
    return b;
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.prom", dir);

    /* NULL: nothing happens, and it is no error */
    ts_fed_obs_bytes(NULL, "x", 1, 1);
    ts_fed_obs_round_info none = {.round = 1};
    CHECK_OK(ts_fed_obs_round(NULL, &none));

    ts_fed_obs *o = NULL;
    CHECK_OK(ts_fed_obs_create("aggregator", dir, NULL, 0, &o));
    ts_fed_obs_bytes(o, "site1", 0, 100);
    ts_fed_obs_bytes(o, "site2", 0, 100);
    ts_fed_obs_bytes(o, "site1", 5000, 0);
    ts_fed_obs_round_info r1 = {.round = 1,
                                .clients = 2,
                                .dropped = 0,
                                .train_s = -1,
                                .encrypt_s = -1,
                                .aggregate_s = 0.25,
                                .decrypt_s = -1,
                                .round_s = 2.5,
                                .upload_s = -1,
                                .broadcast_s = 0.125,
                                .updates_s = 1.5,
                                .keyholder_s = 0.5};
    CHECK_OK(ts_fed_obs_round(o, &r1));
    ts_fed_obs_bytes(o, "site1", 5000, 100);
    ts_fed_obs_round_info r2 = r1;
    r2.round = 2;
    r2.clients = 1;
    r2.dropped = 1;
    r2.aggregate_s = 0.5;
    CHECK_OK(ts_fed_obs_round(o, &r2));
    char *t = slurp(path);
    const char *want[] = {
        "# TYPE tessel_fed_rounds_total counter",
        "tessel_fed_rounds_total{role=\"aggregator\"} 2",
        "tessel_fed_round{role=\"aggregator\"} 2",
        "tessel_fed_clients{role=\"aggregator\"} 1",
        "tessel_fed_dropped{role=\"aggregator\"} 1",
        "tessel_fed_dropped_total{role=\"aggregator\"} 1",
        "tessel_fed_bytes_up_total{role=\"aggregator\",client=\"site1\"} 10000",
        "tessel_fed_bytes_down_total{role=\"aggregator\",client=\"site1\"} 200",
        "tessel_fed_bytes_up_total{role=\"aggregator\",client=\"site2\"} 0",
        "tessel_fed_bytes_down_total{role=\"aggregator\",client=\"site2\"} 100",
        "tessel_fed_seconds{role=\"aggregator\",phase=\"aggregate\"} 0.5",
        "tessel_fed_seconds{role=\"aggregator\",phase=\"round\"} 2.5",
        "tessel_fed_seconds{role=\"aggregator\",phase=\"broadcast\"} 0.125",
        "tessel_fed_seconds{role=\"aggregator\",phase=\"updates\"} 1.5",
        "tessel_fed_seconds{role=\"aggregator\",phase=\"keyholder\"} 0.5",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK(strstr(t, want[i]) != NULL, "metrics.prom lacks '%s':\n%s", want[i], t);
    CHECK(!strstr(t, "phase=\"decrypt\"") && !strstr(t, "phase=\"encrypt\"") &&
              !strstr(t, "phase=\"upload\""),
          "a phase the aggregator does not measure is shown:\n%s", t);
    CHECK(!strstr(t, "tessel_fed_rn_pool_total{") && !strstr(t, "tessel_fed_rn_pool_round{"),
          "the aggregator shows r^n pool series:\n%s", t);
    free(t);
    /* rounds.jsonl: every round, not only the last */
    char jpath[256];
    snprintf(jpath, sizeof jpath, "%s/rounds.jsonl", dir);
    t = slurp(jpath);
    const char *agg_lines =
        "{\"role\": \"aggregator\", \"round\": 1, \"broadcast_s\": 0.125000, \"updates_s\": "
        "1.500000, \"aggregate_s\": 0.250000, \"keyholder_s\": 0.500000, \"round_s\": 2.500000}\n"
        "{\"role\": \"aggregator\", \"round\": 2, \"broadcast_s\": 0.125000, \"updates_s\": "
        "1.500000, \"aggregate_s\": 0.500000, \"keyholder_s\": 0.500000, \"round_s\": 2.500000}\n";
    CHECK(strcmp(t, agg_lines) == 0, "rounds.jsonl:\n%s", t);
    free(t);
    ts_fed_obs_free(o);

    /* a client with an r^n pool: hits and misses per round and summed */
    CHECK_OK(ts_fed_obs_create("client", dir, NULL, 0, &o));
    ts_fed_obs_round_info p1 = {.round = 1,
                                .clients = -1,
                                .dropped = -1,
                                .train_s = 2,
                                .encrypt_s = 0.5,
                                .aggregate_s = -1,
                                .decrypt_s = -1,
                                .round_s = 3,
                                .upload_s = 0.25,
                                .broadcast_s = -1,
                                .updates_s = -1,
                                .keyholder_s = -1,
                                .has_pool = 1,
                                .pool_hits = 40,
                                .pool_misses = 12};
    CHECK_OK(ts_fed_obs_round(o, &p1));
    p1.round = 2;
    p1.pool_hits = 52;
    p1.pool_misses = 0;
    CHECK_OK(ts_fed_obs_round(o, &p1));
    t = slurp(path);
    const char *want_pool[] = {
        "tessel_fed_rn_pool_total{role=\"client\",result=\"hit\"} 92",
        "tessel_fed_rn_pool_total{role=\"client\",result=\"miss\"} 12",
        "tessel_fed_rn_pool_round{role=\"client\",result=\"hit\"} 52",
        "tessel_fed_rn_pool_round{role=\"client\",result=\"miss\"} 0",
    };
    for (size_t i = 0; i < sizeof want_pool / sizeof *want_pool; i++)
        CHECK(strstr(t, want_pool[i]) != NULL, "metrics.prom lacks '%s':\n%s", want_pool[i], t);
    free(t);
    t = slurp(jpath);
    CHECK(strstr(t,
                 "{\"role\": \"client\", \"round\": 2, \"train_s\": 2.000000, \"encrypt_s\": "
                 "0.500000, \"upload_s\": 0.250000, \"round_s\": 3.000000, \"rn_pool_hits\": 52, "
                 "\"rn_pool_misses\": 0}\n") != NULL,
          "rounds.jsonl lacks the client's round 2:\n%s", t);
    free(t);
    ts_fed_obs_free(o);

    /* the endpoint serves the same families (port from the pid: any free one) */
    int port = 30000 + (int)(getpid() % 20000);
    o = NULL;
    ts_status s = ts_fed_obs_create("keyholder", NULL, "127.0.0.1", port, &o);
    if (s == TS_OK) {
        ts_fed_obs_round_info k = {.round = 3, .clients = 3, .dropped = -1, .decrypt_s = 1.5};
        k.train_s = k.encrypt_s = k.aggregate_s = k.round_s = -1;
        CHECK_OK(ts_fed_obs_round(o, &k));
        char cmd[512], out[256];
        snprintf(out, sizeof out, "%s/scrape.txt", dir);
        snprintf(cmd, sizeof cmd, "curl -s http://127.0.0.1:%d/metrics > %s", port, out);
        if (system(cmd) == 0) {
            t = slurp(out);
            CHECK(strstr(t, "tessel_fed_seconds{role=\"keyholder\",phase=\"decrypt\"} 1.5") &&
                      strstr(t, "tessel_fed_round{role=\"keyholder\"} 3"),
                  "scrape:\n%s", t);
            free(t);
        } else {
            printf("unit/fed_obs: no curl, endpoint not scraped\n");
        }
        ts_fed_obs_free(o);
    } else {
        printf("unit/fed_obs: port %d taken (%s), endpoint not tested\n", port, ts_last_error());
    }

    /* a temporary name that is a symbolic link is refused, not followed */
    char tmp[256], target[256];
    snprintf(tmp, sizeof tmp, "%s/.metrics.prom.tmp", dir);
    snprintf(target, sizeof target, "%s/elsewhere", dir);
    CHECK(symlink(target, tmp) == 0, "symlink");
    CHECK_OK(ts_fed_obs_create("client", dir, NULL, 0, &o));
    ts_fed_obs_round_info c = {.round = 1, .clients = -1, .dropped = -1, .train_s = 1};
    c.encrypt_s = c.aggregate_s = c.decrypt_s = c.round_s = -1;
    s = ts_fed_obs_round(o, &c);
    CHECK(s == TS_ERR_IO && strstr(ts_last_error(), ".metrics.prom.tmp"), "a linked temporary: %s",
          ts_last_error());
    CHECK(access(target, F_OK) != 0, "the link was followed");
    ts_fed_obs_free(o);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
    return check_summary("unit/fed_obs");
}
