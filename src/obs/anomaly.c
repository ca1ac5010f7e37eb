/* The budget of anomaly snapshots (anomaly.h): a cap on writes and the
 * retention of the newest on disk. */
#include "obs/anomaly.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/fsat.h"

int ts_anomaly_admit(ts_anomaly_budget *b) {
    if (b->max > 0 && b->written >= b->max) {
        b->refused++;
        return 0;
    }
    b->written++;
    return 1;
}

/* The step of "step-N-anomaly" (N decimal digits, as the checkpoint saver
 * names it), else -1. */
static int64_t anomaly_step(const char *name) {
    static const char pre[] = "step-", post[] = "-anomaly";
    if (strncmp(name, pre, sizeof pre - 1)) return -1;
    const char *p = name + sizeof pre - 1;
    int64_t step = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (digits >= 18) return -1; /* beyond any step a run reaches */
        step = step * 10 + (*p - '0');
    }
    return digits && !strcmp(p, post) ? step : -1;
}

typedef struct snap {
    int64_t step;
    char *name;
} snap;

static int newest_first(const void *a, const void *b) {
    const int64_t x = ((const snap *)a)->step, y = ((const snap *)b)->step;
    return (x < y) - (x > y);
}

ts_status ts_anomaly_retain(const char *run_dir, int keep, int *removed) {
    if (removed) *removed = 0;
    if (keep <= 0) return TS_OK;
    ts_dir run;
    ts_status st = ts_dir_open(&run, run_dir, 0);
    if (st != TS_OK) return st;
    int fd2 = dup(run.fd);
    DIR *d = fd2 >= 0 ? fdopendir(fd2) : NULL;
    if (!d) {
        if (fd2 >= 0) close(fd2);
        st = ts_fail(TS_ERR_IO, "%s: cannot list the anomaly snapshots: %s", run_dir,
                     strerror(errno));
        ts_dir_close(&run);
        return st;
    }
    snap *s = NULL;
    int n = 0, cap = 0;
    for (struct dirent *e; st == TS_OK && (e = readdir(d));) {
        const int64_t step = anomaly_step(e->d_name);
        if (step < 0) continue;
        st = ts_grow((void **)&s, &cap, n + 1, sizeof *s, "anomaly snapshots");
        if (st == TS_OK && !(s[n].name = ts_strdup(e->d_name)))
            st = ts_fail(TS_ERR_NOMEM, "anomaly snapshots: out of memory");
        if (st == TS_OK) s[n++].step = step;
    }
    closedir(d);
    if (st == TS_OK && n > keep) {
        qsort(s, (size_t)n, sizeof *s, newest_first);
        /* Everything is looked at before anything goes. */
        for (int i = keep; i < n && st == TS_OK; i++) {
            int kind;
            st = ts_dir_kind(&run, s[i].name, &kind);
            if (st == TS_OK && kind != 2)
                st = ts_fail(TS_ERR_IO, "%s/%s is not a directory; not removing it", run_dir,
                             s[i].name);
        }
        for (int i = keep; i < n && st == TS_OK; i++) {
            st = ts_dir_remove_flat(&run, s[i].name);
            if (st == TS_OK && removed) (*removed)++;
        }
        if (st == TS_OK) st = ts_dir_sync(&run);
    }
    for (int i = 0; i < n; i++) free(s[i].name);
    free(s);
    ts_dir_close(&run);
    if (st != TS_OK) ts_error_prefix("anomaly snapshot retention (alerts.snapshot_keep %d)", keep);
    return st;
}
