/* A training run observed from outside: `tessel train` of a tiny GPT with
 * observe.metrics_port on a free loopback port; while it trains, a raw
 * socket client scrapes http://127.0.0.1:PORT/metrics until tessel_loss
 * and tessel_step appear. After the run: RUN_DIR/tb/ holds an event file
 * whose TFRecords all have valid framing and CRCs, the first being the
 * file_version record, with the loss scalar and gradient histograms in
 * it; every train line of metrics.jsonl carries grad_norm; and
 * `tessel plot RUN_DIR` draws plots/grad_norm.png (skipped without
 * gnuplot); a run killed with SIGKILL keeps every logged step's line. Runs
 * $TESSEL_BIN from the repository root. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "obs/tfevents.h"

static const char *bin;
static char dir[64], run[128];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A port nobody listens on right now: bind port 0 and ask which. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &n) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* GET /metrics; the whole response (headers and body), or NULL when the
 * server is not (yet) there. */
static char *scrape(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return NULL;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return NULL;
    }
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (ssize_t k; buf && (k = read(fd, buf + len, cap - 1 - len)) > 0;) {
        len += (size_t)k;
        if (len + 1 >= cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    close(fd);
    if (buf) buf[len] = 0;
    return buf;
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)(size > 0 ? size : 0) + 1);
    *n = b ? fread(b, 1, (size_t)(size > 0 ? size : 0), f) : 0;
    fclose(f);
    if (b) b[*n] = 0;
    return b;
}

static const char *find_mem(const char *h, size_t hn, const char *needle) {
    size_t nn = strlen(needle);
    for (size_t i = 0; i + nn <= hn; i++)
        if (!memcmp(h + i, needle, nn)) return h + i;
    return NULL;
}

static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Every TFRecord of the event file: framing and both CRCs. */
static void check_events(void) {
    char tb[192], path[512] = "";
    snprintf(tb, sizeof tb, "%s/tb", run);
    DIR *d = opendir(tb);
    CHECK(d != NULL, "%s exists", tb);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, "events.out.tfevents.", 20))
            snprintf(path, sizeof path, "%s/%s", tb, e->d_name);
    closedir(d);
    CHECK(path[0], "an events.out.tfevents.* file in %s", tb);
    if (!path[0]) return;
    size_t n = 0;
    unsigned char *b = (unsigned char *)read_all(path, &n);
    CHECK(b && n > 16, "%s is not empty", path);
    if (!b) return;
    size_t off = 0;
    int records = 0, bad = 0, first_ok = 0, loss = 0, grad_hist = 0, weight_hist = 0;
    while (off + 12 <= n && !bad) {
        uint64_t len = le64(b + off);
        if (le32(b + off + 8) != ts_tfrecord_masked_crc(b + off, 8) || len > n - off - 16) {
            bad = 1;
            break;
        }
        const unsigned char *data = b + off + 12;
        if (le32(data + len) != ts_tfrecord_masked_crc(data, (size_t)len)) {
            bad = 1;
            break;
        }
        if (records == 0)
            first_ok = find_mem((const char *)data, (size_t)len, "brain.Event:2") != NULL;
        loss += find_mem((const char *)data, (size_t)len, "train/loss") != NULL;
        grad_hist += find_mem((const char *)data, (size_t)len, "grads/") != NULL;
        weight_hist += find_mem((const char *)data, (size_t)len, "weights/") != NULL;
        records++;
        off += 12 + (size_t)len + 4;
    }
    CHECK(!bad && off == n, "TFRecord framing and CRCs valid up to byte %zu of %zu", off, n);
    CHECK(first_ok, "the first record is the file_version event");
    CHECK(loss >= 3, "train/loss scalars in %d records", loss);
    CHECK(grad_hist > 0 && weight_hist > 0, "gradient (%d) and weight (%d) histograms", grad_hist,
          weight_hist);
    free(b);
}

static void check_jsonl(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    size_t n;
    char *t = read_all(path, &n);
    CHECK(t != NULL, "%s exists", path);
    if (!t) return;
    int train = 0, with_norm = 0;
    char *save = NULL;
    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strstr(line, "\"type\":\"train\"")) continue;
        train++;
        const char *g = strstr(line, "\"grad_norm\":");
        if (g && strtod(g + 12, NULL) > 0) with_norm++;
    }
    CHECK(train > 0 && with_norm == train, "%d of %d train lines carry a positive grad_norm",
          with_norm, train);
    free(t);
}

static void check_plot(void) {
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("observe: gnuplot not installed; skipping the plot\n");
        return;
    }
    char cmd[512], png[256];
    snprintf(cmd, sizeof cmd, "'%s' plot '%s' >%s/plot.log 2>&1", bin, run, dir);
    CHECK(system(cmd) == 0, "tessel plot %s (see %s/plot.log)", run, dir);
    snprintf(png, sizeof png, "%s/plots/grad_norm.png", run);
    struct stat st;
    CHECK(stat(png, &st) == 0 && st.st_size > 1000, "%s written", png);
}

/* Data parallel: every rank serves its own endpoint on base port + rank,
 * labelled with its rank, and publishes its collectives' bytes and time;
 * run under shape.policy bucket, the plan cache's gauges too. */
static void check_dist_metrics(void) {
    int port = -1;
    for (int tries = 0; tries < 20 && port < 0; tries++) {
        int p = free_port();
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)(p + 1));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (p > 0 && p < 65535 && fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0)
            port = p;
        if (fd >= 0) close(fd);
    }
    if (port <= 0) {
        CHECK(0, "two free ports in a row");
        return;
    }
    char port_set[64], out[600];
    snprintf(port_set, sizeof port_set, "observe.metrics_port=%d", port);
    snprintf(out, sizeof out, "%s/dist", dir);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setpgid(0, 0); /* its own group: the SIGINT below is a terminal's Ctrl-C */
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execl(bin, bin, "train", "examples/w1.yaml", "--steps", "1000000", "--procs", "2", "--out",
              out, "--set", port_set, "--set", "model.batch=16", "--set", "model.hidden=32",
              "--set", "model.window=4", "--set", "model.features=4", "--set", "train.threads=1",
              "--set", "dist.algo=native", "--set", "shape.policy=bucket", (char *)NULL);
        _exit(127);
    }
    const double t0 = now();
    int got[2] = {0, 0};
    while (now() - t0 < 20 && !(got[0] && got[1])) {
        for (int r = 0; r < 2; r++) {
            if (got[r]) continue;
            char *b = scrape(port + r), want[64];
            snprintf(want, sizeof want, "tessel_collective_bytes_total{rank=\"%d\",op=", r);
            /* shape.policy bucket: the plan cache's gauges too (docs/shapes.md) */
            if (b && strstr(b, want) && strstr(b, "tessel_collectives_total{") &&
                strstr(b, "\ntessel_plan_cache_hits") && strstr(b, "\ntessel_plan_cache_plans") &&
                strstr(b, "\ntessel_plan_cache_padding_ratio"))
                got[r] = 1;
            free(b);
        }
        if (!(got[0] && got[1])) usleep(20000);
    }
    CHECK(got[0] && got[1],
          "rank 0 on port %d and rank 1 on port %d publish their collectives and plan cache "
          "(rank 0: %d, rank 1: %d)",
          port, port + 1, got[0], got[1]);
    kill(-pid, SIGINT);
    int status = 0;
    while (now() - t0 < 40 && waitpid(pid, &status, WNOHANG) == 0) usleep(20000);
    if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        CHECK(0, "the data-parallel run did not stop on SIGINT");
    } else {
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 130, "Ctrl-C exit status 130, got %d",
              status);
    }
}

/* A run killed with SIGKILL keeps the metrics.jsonl line of every step it logged as done:
 * each line is written out with its step (not held in stdio's buffer, which kept up to 4 KiB
 * and cut the last line). The progress line of step k comes just before its metrics line. */
static void check_killed_jsonl(void) {
    char out[160], log[160], path[200];
    snprintf(out, sizeof out, "%s/killed", dir);
    snprintf(log, sizeof log, "%s/killed.log", dir);
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execl(bin, bin, "train", "examples/w1.yaml", "--steps", "100000000", "--set",
              "model.batch=8", "--set", "model.hidden=8", "--set", "model.window=2", "--set",
              "model.features=2", "--set", "train.threads=1", "--set", "train.log_every=1", "--out",
              out, (char *)NULL);
        _exit(127);
    }
    CHECK(pid > 0, "fork");
    if (pid <= 0) return;
    /* past step 60: more lines than stdio's buffer held */
    const double t0 = now();
    char *text = NULL;
    size_t tn;
    while (now() - t0 < 30 && !(text && strstr(text, "step 60/"))) {
        free(text);
        text = read_all(log, &tn);
        if (!(text && strstr(text, "step 60/"))) usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    free(text);
    text = read_all(log, &tn);
    long logged = 0; /* the last step the progress log shows */
    for (const char *p = text ? strstr(text, "step ") : NULL; p; p = strstr(p + 1, "step "))
        if (p[5] >= '0' && p[5] <= '9') logged = strtol(p + 5, NULL, 10);
    size_t n = 0;
    char *m = read_all(path, &n);
    long lines = 0, last = 0, consecutive = 1;
    for (const char *p = m ? strstr(m, "\"step\":") : NULL; p; p = strstr(p + 1, "\"step\":")) {
        const long k = strtol(p + 7, NULL, 10);
        consecutive &= k == last + 1;
        last = k, lines++;
    }
    CHECK(logged >= 60, "the killed run logged step %ld", logged);
    CHECK(m && n > 0 && m[n - 1] == '\n', "metrics.jsonl ends with a whole line (%zu bytes)", n);
    CHECK(consecutive && last >= logged - 1,
          "metrics.jsonl has steps 1..%ld (%ld lines) of the %ld the log showed done", last, lines,
          logged);
    free(m);
    free(text);
}

int main(void) {
    bin = e2e_setup("observe", dir, sizeof dir);
    if (!bin) return check_summary("observe");
    snprintf(run, sizeof run, "%s/run", dir);
    const int port = free_port();
    CHECK(port > 0, "a free port");
    char port_set[64], log[128];
    snprintf(port_set, sizeof port_set, "observe.metrics_port=%d", port);
    snprintf(log, sizeof log, "%s/train.log", dir);

    const double t0 = now();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execl(bin, bin, "train", "examples/tiny_gpt.yaml", "--steps", "100", "--out", run, "--set",
              port_set, "--set", "observe.histogram_every=50", (char *)NULL);
        _exit(127);
    }
    CHECK(pid > 0, "fork");
    /* Scrape while it trains: retry until the loss is published (the
     * endpoint starts before the first step; tessel_loss after it). */
    int scraped = 0, status = -1, exited = 0;
    char *body = NULL;
    while (pid > 0 && now() - t0 < 15 && !scraped) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            exited = 1;
            break;
        }
        free(body);
        body = scrape(port);
        if (body && strstr(body, "\ntessel_loss{") && strstr(body, "\ntessel_step{")) scraped = 1;
        if (!scraped) usleep(20000);
    }
    CHECK(scraped, "scraped tessel_loss and tessel_step during training (last response: %.300s)",
          body ? body : "(none)");
    if (scraped) {
        CHECK(strstr(body, "200 OK") != NULL, "HTTP 200");
        CHECK(strstr(body, "\ntessel_grad_norm{") != NULL, "tessel_grad_norm is published");
    }
    free(body);
    if (pid > 0 && !exited) {
        /* Bounded wait for the end of the run. */
        while (now() - t0 < 30 && waitpid(pid, &status, WNOHANG) == 0) usleep(20000);
        if (now() - t0 >= 30 && waitpid(pid, &status, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            CHECK(0, "tessel train took over 30 s");
        }
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "tessel train succeeded (see %s)", log);
    /* The endpoint is gone with the run. */
    char *after = scrape(port);
    CHECK(after == NULL, "the endpoint stopped at the end of the run");
    free(after);

    check_events();
    check_jsonl();
    check_plot();
    check_dist_metrics();
    check_killed_jsonl();

    e2e_cleanup(dir);
    printf("observe: %.1f s\n", now() - t0);
    return check_summary("observe");
}
