/* Metrics registry: exact text format 0.0.4 rendering, escaping, histogram
 * buckets (+Inf included), contiguous families, refused names, updates from
 * two threads racing a scrape, the standard training metrics, and the
 * /metrics HTTP endpoint (content, 404, port already in use). */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "check.h"
#include "obs/http.h"
#include "obs/metrics.h"

/* ---- the project's own format checks (what promtool does not check) ---- */

/* The family a sample line belongs to: its name, minus a histogram suffix
 * when a histogram of that base name was declared. */
static void family_of(const char *line, char hist[][128], int n_hist, char *out, size_t n) {
    size_t k = strcspn(line, "{ ");
    snprintf(out, n, "%.*s", (int)k, line);
    static const char *suffixes[] = {"_bucket", "_sum", "_count"};
    for (int s = 0; s < 3; s++) {
        size_t sl = strlen(suffixes[s]);
        if (k > sl && !strncmp(out + k - sl, suffixes[s], sl)) {
            for (int h = 0; h < n_hist; h++)
                if (strlen(hist[h]) == k - sl && !strncmp(hist[h], out, k - sl)) out[k - sl] = 0;
        }
    }
}

/* Checks every family is one block (HELP, TYPE, then only its samples);
 * that each histogram series has cumulative buckets ending in le="+Inf"
 * and a _count equal to that bucket. Returns the number of problems. */
static int check_exposition(const char *text) {
    char *copy = strdup(text), *save = NULL;
    char seen[64][128], hist[64][128], cur[128] = "";
    int n_seen = 0, n_hist = 0, problems = 0;
    double last_bucket = -1, inf_bucket = -1;
    int in_buckets = 0;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char fam[128];
        if (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7)) {
            size_t k = strcspn(line + 7, " ");
            snprintf(fam, sizeof fam, "%.*s", (int)k, line + 7);
            if (!strncmp(line, "# TYPE ", 7) && strstr(line + 7 + k, "histogram"))
                snprintf(hist[n_hist++], 128, "%s", fam);
        } else {
            family_of(line, hist, n_hist, fam, sizeof fam);
        }
        if (strcmp(fam, cur)) {
            for (int i = 0; i < n_seen; i++)
                if (!strcmp(seen[i], fam)) {
                    fprintf(stderr, "family %s is split: '%s'\n", fam, line);
                    problems++;
                }
            snprintf(seen[n_seen++], 128, "%s", fam);
            snprintf(cur, sizeof cur, "%s", fam);
        }
        if (line[0] == '#') continue;
        const char *name_end = line + strcspn(line, "{ ");
        double v = strtod(strrchr(line, ' ') + 1, NULL);
        if (name_end - line > 7 && !strncmp(name_end - 7, "_bucket", 7)) {
            if (!in_buckets) last_bucket = -1;
            in_buckets = 1;
            if (v < last_bucket) {
                fprintf(stderr, "bucket not cumulative: '%s'\n", line);
                problems++;
            }
            last_bucket = v;
            if (strstr(line, "le=\"+Inf\"")) inf_bucket = v;
        } else if (name_end - line > 6 && !strncmp(name_end - 6, "_count", 6) && in_buckets) {
            if (inf_bucket < 0 || v != inf_bucket) {
                fprintf(stderr, "_count %g does not match the +Inf bucket %g: '%s'\n", v,
                        inf_bucket, line);
                problems++;
            }
            in_buckets = 0;
            inf_bucket = -1;
        } else if (in_buckets && !(name_end - line > 4 && !strncmp(name_end - 4, "_sum", 4))) {
            fprintf(stderr, "histogram series without _count: '%s'\n", line);
            problems++;
            in_buckets = 0;
        }
    }
    free(copy);
    return problems;
}

/* ---- exact rendering ---------------------------------------------------- */

static void test_render_exact(void) {
    ts_metrics *m;
    CHECK_OK(ts_metrics_create(&m));
    CHECK_OK(ts_metrics_const_label(m, "rank", "0"));
    ts_metric *steps, *loss, *bytes, *hist, *unused;
    ts_series *ar, *ag;
    CHECK_OK(ts_metrics_counter(m, "tessel_steps_total", "Steps run.", 0, NULL, &steps));
    CHECK_OK(ts_metrics_gauge(m, "tessel_loss", "Loss \\ with \"quotes\"\nand a newline", 0, NULL,
                              &loss));
    CHECK_OK(ts_metrics_counter(m, "tessel_collective_bytes_total", "Bytes.", 1,
                                (const char *[]){"op"}, &bytes));
    CHECK_OK(ts_metrics_histogram(m, "tessel_step_duration_seconds", "Step time.", 0, NULL, 4,
                                  (const double[]){0.5, 1, 2, INFINITY}, &hist));
    CHECK_OK(ts_metrics_gauge(m, "tessel_group_grad_norm", "No series yet.", 1,
                              (const char *[]){"group"}, &unused));
    /* series created after later families were registered still render
     * inside their own family's block */
    CHECK_OK(ts_metric_series(bytes, (const char *[]){"allreduce"}, &ar));
    CHECK_OK(ts_metric_series(bytes, (const char *[]){"all\"gather\\\n"}, &ag));
    ts_series *again;
    CHECK_OK(ts_metric_series(bytes, (const char *[]){"allreduce"}, &again));
    CHECK(again == ar, "the same label values give the same series");
    CHECK_OK(ts_metric_inc(steps, 1));
    CHECK_OK(ts_metric_inc(steps, 2));
    CHECK_OK(ts_metric_set(loss, 0.1));
    CHECK_OK(ts_series_inc(ar, 1024));
    CHECK_OK(ts_series_inc(ag, 1.5));
    const double obs[] = {0.25, 0.5, 0.75, 4};
    for (int i = 0; i < 4; i++) CHECK_OK(ts_metric_observe(hist, obs[i]));

    static const char expected[] =
        "# HELP tessel_steps_total Steps run.\n"
        "# TYPE tessel_steps_total counter\n"
        "tessel_steps_total{rank=\"0\"} 3\n"
        "# HELP tessel_loss Loss \\\\ with \"quotes\"\\nand a newline\n"
        "# TYPE tessel_loss gauge\n"
        "tessel_loss{rank=\"0\"} 0.1\n"
        "# HELP tessel_collective_bytes_total Bytes.\n"
        "# TYPE tessel_collective_bytes_total counter\n"
        "tessel_collective_bytes_total{rank=\"0\",op=\"allreduce\"} 1024\n"
        "tessel_collective_bytes_total{rank=\"0\",op=\"all\\\"gather\\\\\\n\"} 1.5\n"
        "# HELP tessel_step_duration_seconds Step time.\n"
        "# TYPE tessel_step_duration_seconds histogram\n"
        "tessel_step_duration_seconds_bucket{rank=\"0\",le=\"0.5\"} 2\n"
        "tessel_step_duration_seconds_bucket{rank=\"0\",le=\"1\"} 3\n"
        "tessel_step_duration_seconds_bucket{rank=\"0\",le=\"2\"} 3\n"
        "tessel_step_duration_seconds_bucket{rank=\"0\",le=\"+Inf\"} 4\n"
        "tessel_step_duration_seconds_sum{rank=\"0\"} 5.5\n"
        "tessel_step_duration_seconds_count{rank=\"0\"} 4\n";
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(ts_metrics_render(m, &text, &len));
    CHECK(text && !strcmp(text, expected), "rendering:\n%s\nexpected:\n%s", text, expected);
    CHECK(text && len == strlen(text), "length %zu", len);
    CHECK(text && check_exposition(text) == 0, "format checks");
    free(text);

    /* A registry without constant labels: bare names, and le alone. */
    ts_metrics *b;
    ts_metric *g, *h;
    CHECK_OK(ts_metrics_create(&b));
    CHECK_OK(ts_metrics_gauge(b, "x", NULL, 0, NULL, &g));
    CHECK_OK(ts_metrics_histogram(b, "h", "h.", 0, NULL, 1, (const double[]){1}, &h));
    CHECK_OK(ts_metric_observe(h, NAN)); /* NaN lands in +Inf only */
    CHECK_OK(ts_metric_set(g, 1e21));
    CHECK_OK(ts_metrics_render(b, &text, NULL));
    static const char expected_b[] = "# HELP x \n# TYPE x gauge\nx 1e+21\n"
                                     "# HELP h h.\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\n"
                                     "h_bucket{le=\"+Inf\"} 1\nh_sum NaN\nh_count 1\n";
    CHECK(text && !strcmp(text, expected_b), "bare rendering:\n%s", text);
    free(text);
    const double specials[] = {INFINITY, -INFINITY, NAN, -2.5, 1.0 / 3, 123456789012};
    const char *want[] = {
        "x +Inf\n",        "x -Inf\n", "x NaN\n", "x -2.5\n", "x 0.3333333333333333\n",
        "x 123456789012\n"};
    for (int i = 0; i < 6; i++) {
        CHECK_OK(ts_metric_set(g, specials[i]));
        CHECK_OK(ts_metrics_render(b, &text, NULL));
        CHECK(text && strstr(text, want[i]), "value %d: %s", i, text);
        free(text);
    }
    ts_metrics_free(b);
    ts_metrics_free(m);
}

/* ---- refused input ---------------------------------------------------------- */

static void test_errors(void) {
    ts_metrics *m;
    ts_metric *f = NULL, *c, *h;
    CHECK_OK(ts_metrics_create(&m));
    CHECK(ts_metrics_gauge(m, "tessel loss", NULL, 0, NULL, &f) == TS_ERR_INVALID, "space");
    CHECK(strstr(ts_last_error(), "'tessel loss'"), "message names it: %s", ts_last_error());
    CHECK(ts_metrics_gauge(m, "1x", NULL, 0, NULL, &f) == TS_ERR_INVALID, "leading digit");
    CHECK(ts_metrics_gauge(m, "x", NULL, 1, (const char *[]){"__x"}, &f) == TS_ERR_INVALID,
          "reserved label");
    CHECK(ts_metrics_gauge(m, "x", NULL, 2, (const char *[]){"a", "a"}, &f) == TS_ERR_INVALID,
          "duplicate label");
    CHECK(ts_metrics_histogram(m, "h", NULL, 1, (const char *[]){"le"}, 1, (const double[]){1},
                               &f) == TS_ERR_INVALID,
          "le on a histogram");
    CHECK(ts_metrics_histogram(m, "h", NULL, 0, NULL, 2, (const double[]){1, 1}, &f) ==
              TS_ERR_INVALID,
          "bounds not increasing");
    CHECK(ts_metrics_histogram(m, "h", NULL, 0, NULL, 2, (const double[]){NAN, 1}, &f) ==
              TS_ERR_INVALID,
          "NaN bound");
    CHECK(ts_metrics_gauge(m, "x", "\xff", 0, NULL, &f) == TS_ERR_INVALID, "bad UTF-8 help");
    CHECK(f == NULL, "no family on failure");
    CHECK_OK(ts_metrics_histogram(m, "h", NULL, 0, NULL, 1, (const double[]){1}, &h));
    CHECK(ts_metrics_gauge(m, "h_count", NULL, 0, NULL, &f) == TS_ERR_INVALID,
          "clash with a histogram sample");
    CHECK(ts_metrics_gauge(m, "h", NULL, 0, NULL, &f) == TS_ERR_INVALID, "duplicate");
    CHECK_OK(ts_metrics_counter(m, "c_total", NULL, 1, (const char *[]){"kind"}, &c));
    CHECK(ts_metric_inc(c, 1) == TS_ERR_INVALID, "labelled family needs a series");
    ts_series *s;
    CHECK(ts_metric_series(c, (const char *[]){"\xc3\x28"}, &s) == TS_ERR_INVALID,
          "bad UTF-8 value");
    CHECK(ts_metric_series(c, (const char *[]){NULL}, &s) == TS_ERR_INVALID, "NULL value");
    CHECK_OK(ts_metric_series(c, (const char *[]){"nan"}, &s));
    CHECK(ts_series_inc(s, -1) == TS_ERR_INVALID, "counter going down");
    CHECK(ts_series_inc(s, NAN) == TS_ERR_INVALID, "counter NaN");
    CHECK(ts_series_set(s, 1) == TS_ERR_INVALID, "set on a counter");
    CHECK(ts_series_observe(s, 1) == TS_ERR_INVALID, "observe on a counter");
    CHECK(ts_metric_set(h, 1) == TS_ERR_INVALID, "set on a histogram");
    CHECK(ts_metrics_const_label(m, "kind", "x") == TS_ERR_INVALID, "const label clash");
    CHECK(ts_metrics_const_label(m, "le", "x") == TS_ERR_INVALID, "const le");
    CHECK_OK(ts_metrics_const_label(m, "rank", "1"));
    CHECK_OK(ts_metrics_const_label(m, "rank", "2")); /* replaced */
    CHECK(ts_metrics_gauge(m, "g", NULL, 1, (const char *[]){"rank"}, &f) == TS_ERR_INVALID,
          "family label clashes with const label");
    double b[4];
    CHECK(ts_metrics_exp_buckets(0, 2, 4, b) == TS_ERR_INVALID, "exp start 0");
    CHECK_OK(ts_metrics_exp_buckets(0.5, 2, 4, b));
    CHECK(b[0] == 0.5 && b[3] == 4, "exp buckets %g..%g", b[0], b[3]);
    char *text;
    CHECK_OK(ts_metrics_render(m, &text, NULL));
    CHECK(text && strstr(text, "c_total{rank=\"2\",kind=\"nan\"} 0\n"), "%s", text);
    free(text);
    ts_metrics_free(m);
}

/* ---- two threads updating while a third renders ------------------------------ */

#define N_UPDATES 200000

typedef struct racer {
    ts_metric *counter, *gauge, *hist, *labelled;
    int id;
} racer;

static void *race(void *arg) {
    racer *r = arg;
    ts_series *mine = NULL;
    char name[16];
    snprintf(name, sizeof name, "t%d", r->id);
    ts_metric_series(r->labelled, (const char *[]){name}, &mine);
    for (int i = 0; i < N_UPDATES; i++) {
        ts_metric_inc(r->counter, 1);
        ts_metric_inc(r->gauge, r->id ? 1 : -1);
        ts_metric_observe(r->hist, (double)(i % 4));
        ts_series_inc(mine, 0.5);
    }
    return NULL;
}

static atomic_int racing;

static void *scrape(void *arg) {
    ts_metrics *m = arg;
    int problems = 0, n = 0;
    while (racing) {
        char *text;
        if (ts_metrics_render(m, &text, NULL) != TS_OK) {
            problems++;
            break;
        }
        problems += check_exposition(text);
        free(text);
        n++;
    }
    return (void *)(intptr_t)(problems ? -problems : n);
}

static void test_concurrent(void) {
    ts_metrics *m;
    CHECK_OK(ts_metrics_create(&m));
    racer r[2];
    CHECK_OK(ts_metrics_counter(m, "c_total", "c", 0, NULL, &r[0].counter));
    CHECK_OK(ts_metrics_gauge(m, "g", "g", 0, NULL, &r[0].gauge));
    CHECK_OK(ts_metrics_histogram(m, "h", "h", 0, NULL, 3, (const double[]){0, 1, 2}, &r[0].hist));
    CHECK_OK(ts_metrics_counter(m, "l_total", "l", 1, (const char *[]){"thread"}, &r[0].labelled));
    r[1] = r[0];
    r[0].id = 0;
    r[1].id = 1;
    pthread_t t[2], s;
    racing = 1;
    pthread_create(&s, NULL, scrape, m);
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, race, &r[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    racing = 0;
    void *scrapes;
    pthread_join(s, &scrapes);
    CHECK((intptr_t)scrapes >= 0, "renders during updates broke the format (%d problems)",
          (int)-(intptr_t)scrapes);
    char *text;
    CHECK_OK(ts_metrics_render(m, &text, NULL));
    CHECK(text && strstr(text, "c_total 400000\n"), "no lost counter update:\n%s", text);
    CHECK(text && strstr(text, "g 0\n"), "gauge +1 and -1 cancel:\n%s", text);
    CHECK(text && strstr(text, "h_bucket{le=\"0\"} 100000\n"), "bucket 0:\n%s", text);
    CHECK(text && strstr(text, "h_bucket{le=\"+Inf\"} 400000\n"), "+Inf:\n%s", text);
    CHECK(text && strstr(text, "h_sum 600000\n"), "sum:\n%s", text);
    CHECK(text && strstr(text, "h_count 400000\n"), "count:\n%s", text);
    CHECK(text && strstr(text, "l_total{thread=\"t0\"} 100000\n") &&
              strstr(text, "l_total{thread=\"t1\"} 100000\n"),
          "labelled:\n%s", text);
    free(text);
    ts_metrics_free(m);
}

/* ---- standard training metrics ------------------------------------------------ */

/* tessel_data_wait_seconds_total follows the loader's running total
 * (data_wait_total_s) and stays out of the scrape without a loader. */
static void test_data_wait(void) {
    ts_train_metrics tm;
    CHECK_OK(ts_train_metrics_create(-1, &tm));
    ts_step_metrics s = ts_step_metrics_empty();
    s.step = 1, s.loss = 1;
    CHECK_OK(ts_train_metrics_step(&tm, &s));
    char *text = NULL;
    CHECK_OK(ts_metrics_render(tm.reg, &text, NULL));
    CHECK(text && !strstr(text, "tessel_data_wait_seconds_total"), "no loader: no data wait");
    free(text);
    s.step = 2, s.data_wait_total_s = 0.25;
    CHECK_OK(ts_train_metrics_step(&tm, &s));
    s.step = 3, s.data_wait_total_s = 0.75;
    CHECK_OK(ts_train_metrics_step(&tm, &s));
    text = NULL;
    CHECK_OK(ts_metrics_render(tm.reg, &text, NULL));
    CHECK(text && strstr(text, "# TYPE tessel_data_wait_seconds_total counter\n") &&
              strstr(text, "tessel_data_wait_seconds_total 0.75\n"),
          "data wait counter:\n%s", text ? text : "");
    free(text);
    ts_train_metrics_free(&tm);
}

static void test_train_metrics(void) {
    ts_train_metrics tm;
    CHECK_OK(ts_train_metrics_create(3, &tm));
    ts_step_metrics s = ts_step_metrics_empty();
    s.step = 7;
    s.loss = 2.5;
    s.seconds = 0.003;
    s.samples_per_s = 1000;
    s.grad_norm = 1.25;
    CHECK_OK(ts_train_metrics_step(&tm, &s));
    CHECK_OK(ts_train_metrics_collective(&tm, "allreduce", 4096, 0.002));
    CHECK_OK(ts_train_metrics_anomaly(&tm, "grad_norm_spike"));
    CHECK_OK(ts_train_metrics_alert(&tm, "grad_norm > 150", "pause"));
    CHECK_OK(ts_train_metrics_skipped(&tm, "non_finite_loss"));
    CHECK_OK(ts_train_metrics_group(&tm, "layer0", 0.5, NAN));
    CHECK_OK(ts_metric_set(tm.arena_bytes, 1 << 20));
    CHECK_OK(ts_metric_observe(tm.checkpoint_seconds, 1.5));
    char *text;
    CHECK_OK(ts_metrics_render(tm.reg, &text, NULL));
    const char *want[] = {
        "tessel_build_info{rank=\"3\",version=\"" TESSEL_VERSION "\"} 1\n",
        "tessel_step{rank=\"3\"} 7\n",
        "tessel_steps_total{rank=\"3\"} 1\n",
        "tessel_loss{rank=\"3\"} 2.5\n",
        "tessel_samples_per_second{rank=\"3\"} 1000\n",
        "tessel_step_duration_seconds_bucket{rank=\"3\",le=\"0.004\"} 1\n",
        "tessel_step_duration_seconds_bucket{rank=\"3\",le=\"0.002\"} 0\n",
        "tessel_grad_norm{rank=\"3\"} 1.25\n",
        "tessel_group_grad_norm{rank=\"3\",group=\"layer0\"} 0.5\n",
        "tessel_collective_bytes_total{rank=\"3\",op=\"allreduce\"} 4096\n",
        "tessel_collectives_total{rank=\"3\",op=\"allreduce\"} 1\n",
        "tessel_anomalies_total{rank=\"3\",kind=\"grad_norm_spike\"} 1\n",
        "tessel_alerts_total{rank=\"3\",rule=\"grad_norm > 150\",action=\"pause\"} 1\n",
        "tessel_skipped_steps_total{rank=\"3\",reason=\"non_finite_loss\"} 1\n",
        "tessel_arena_bytes{rank=\"3\"} 1048576\n",
        "tessel_checkpoint_duration_seconds_count{rank=\"3\"} 1\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK(text && strstr(text, want[i]), "missing %s", want[i]);
    CHECK(text && !strstr(text, "tessel_update_ratio"), "update ratio NaN: no series yet");
    /* lazy families: never set in this run, so not scraped as a false 0 */
    CHECK(text && !strstr(text, "tessel_tokens_per_second") && !strstr(text, "tessel_loss_scale") &&
              !strstr(text, "tessel_learning_rate"),
          "unset optional gauges are left out:\n%s", text);
    CHECK(text && check_exposition(text) == 0, "format checks");
    uint64_t rss = 0;
    CHECK_OK(ts_metrics_resident_bytes(&rss));
    CHECK(rss > 1 << 20, "resident memory %llu", (unsigned long long)rss);
    CHECK(text && !strstr(text, "tessel_resident_memory_bytes{rank=\"3\"} 0\n"), "rss published");
    /* a NaN loss is published, so a diverging run shows on the dashboard */
    s.loss = NAN;
    CHECK_OK(ts_train_metrics_step(&tm, &s));
    free(text);
    CHECK_OK(ts_metrics_render(tm.reg, &text, NULL));
    CHECK(text && strstr(text, "tessel_loss{rank=\"3\"} NaN\n"), "NaN loss");
    free(text);
    ts_train_metrics_free(&tm);
    ts_train_metrics_free(&tm); /* idempotent */
}

/* ---- the HTTP endpoint ---------------------------------------------------------- */

/* GET path from 127.0.0.1:port; the whole response (headers and body). */
static char *http_get(int port, const char *path) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    char req[256];
    int k = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, req, (size_t)k) != k) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while (buf && (got = read(fd, buf + n, cap - n - 1)) > 0) {
        n += (size_t)got;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    close(fd);
    if (buf) buf[n] = 0;
    return buf;
}

static void test_http(void) {
    ts_train_metrics tm;
    CHECK_OK(ts_train_metrics_create(0, &tm));
    ts_step_metrics s = ts_step_metrics_empty();
    s.step = 1;
    s.loss = 0.75;
    CHECK_OK(ts_train_metrics_step(&tm, &s));
    ts_http_server *srv = NULL;
    CHECK_OK(ts_http_serve_metrics(tm.reg, "127.0.0.1", 0, &srv));
    int port = ts_http_port(srv);
    CHECK(port > 0, "port %d", port);

    char *resp = http_get(port, "/metrics");
    CHECK(resp && !strncmp(resp, "HTTP/1.", 7) && !strncmp(resp + 8, " 200 ", 5), "status: %.40s",
          resp ? resp : "(none)");
    CHECK(resp && strstr(resp, "text/plain; version=0.0.4; charset=utf-8"), "content type");
    CHECK(resp && strstr(resp, "\r\n\r\n# HELP tessel_build_info"), "body starts with HELP");
    CHECK(resp && strstr(resp, "tessel_loss{rank=\"0\"} 0.75\n"), "loss in the scrape");
    free(resp);
    CHECK(ts_http_scrapes(srv) == 1, "one scrape counted: %lu", ts_http_scrapes(srv));
    resp = http_get(port, "/nope");
    CHECK(resp && !strncmp(resp, "HTTP/1.", 7) && !strncmp(resp + 8, " 404 ", 5), "404: %.40s",
          resp ? resp : "(none)");
    free(resp);
    resp = http_get(port, "/");
    CHECK(resp && strstr(resp, "/metrics"), "index points to /metrics");
    free(resp);

    /* A second server (another rank with the same port) on the taken port. */
    ts_http_server *dup = NULL;
    CHECK(ts_http_serve_metrics(tm.reg, "127.0.0.1", port, &dup) == TS_ERR_IO, "port taken");
    CHECK(strstr(ts_last_error(), "already in use") && strstr(ts_last_error(), "127.0.0.1"),
          "message: %s", ts_last_error());
    CHECK(dup == NULL, "no server on failure");
    CHECK(ts_http_serve_metrics(tm.reg, "localhost", 0, &dup) == TS_ERR_INVALID,
          "names are refused (numeric addresses only)");
    CHECK(ts_http_serve_metrics(tm.reg, NULL, 70000, &dup) == TS_ERR_INVALID, "port range");

    ts_http_stop(srv);
    resp = http_get(port, "/metrics");
    CHECK(resp == NULL, "nothing listens after stop");
    free(resp);
    /* the port is free again: a restart on it works */
    CHECK_OK(ts_http_serve_metrics(tm.reg, "127.0.0.1", port, &srv));
    ts_http_stop(srv);
    ts_http_stop(NULL);
    ts_train_metrics_free(&tm);
}

int main(void) {
    test_render_exact();
    test_errors();
    test_concurrent();
    test_train_metrics();
    test_data_wait();
    test_http();
    return check_summary("metrics");
}
