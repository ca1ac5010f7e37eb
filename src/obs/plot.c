/* plot.c — `tessel plot`: metrics.jsonl to PNG through gnuplot. The data
 * goes into the script as inline datablocks, so gnuplot reads one file and
 * the user keeps a script that redraws the plots on its own. */
#include "obs/plot.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "core/core.h"
#include "core/fsat.h"

extern char **environ;

#define MAX_SPLITS 8

typedef struct train_pt {
    double step, loss, sps, tps, gn;
} train_pt;

typedef struct eval_pt {
    int split;
    double step, loss;
} eval_pt;

typedef struct run_data {
    train_pt *train;
    int n_train, cap_train;
    eval_pt *eval;
    int n_eval, cap_eval;
    char splits[MAX_SPLITS][32];
    int n_splits;
    int64_t skipped;
} run_data;

/* A growable text buffer for the script. */
typedef struct tbuf {
    char *p;
    size_t n, cap;
    int oom;
} tbuf;

static void tb_printf(tbuf *b, const char *fmt, ...) TS_PRINTF(2, 3);

static void tb_printf(tbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap : 8192;
        while (b->n + (size_t)k + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* A gnuplot single-quoted string: no escapes inside, a quote is doubled. */
static void tb_quoted(tbuf *b, const char *s) {
    tb_printf(b, "'");
    for (; *s; s++) {
        if (*s == '\'')
            tb_printf(b, "''");
        else
            tb_printf(b, "%c", *s);
    }
    tb_printf(b, "'");
}

static void tb_num(tbuf *b, double v) {
    if (isfinite(v))
        tb_printf(b, " %.9g", v);
    else
        tb_printf(b, " NaN"); /* gnuplot leaves a gap at NaN */
}

static double num_field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static ts_status read_file(const char *path, char **text, size_t *len) {
    *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return ts_fail(TS_ERR_NOT_FOUND,
                           "plot: %s does not exist (is this a run directory written with "
                           "output.dir set?)",
                           path);
        return ts_fail(TS_ERR_IO, "plot: cannot open %s: %s", path, strerror(errno));
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return ts_fail(TS_ERR_NOMEM, "plot: out of memory reading %s", path);
        }
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) free(buf);
        buf = nb;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return ts_fail(TS_ERR_IO, "plot: cannot read %s", path);
    }
    buf[n] = 0;
    *text = buf;
    *len = n;
    return TS_OK;
}

static int split_index(run_data *d, const char *name) {
    for (int i = 0; i < d->n_splits; i++)
        if (!strcmp(d->splits[i], name)) return i;
    if (d->n_splits == MAX_SPLITS) return -1;
    snprintf(d->splits[d->n_splits], sizeof d->splits[0], "%s", name);
    return d->n_splits++;
}

static ts_status parse_line(run_data *d, const char *path, int line_no, const char *line,
                            int is_unterminated_last) {
    json_error_t jerr;
    json_t *o = json_loads(line, JSON_DECODE_ANY, &jerr);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        /* a run still writing its last line */
        if (is_unterminated_last) {
            d->skipped++;
            return TS_OK;
        }
        return ts_fail(TS_ERR_FORMAT, "plot: %s line %d: %s", path, line_no,
                       o ? "not a JSON object" : jerr.text);
    }
    ts_status st = TS_OK;
    const char *type = json_string_value(json_object_get(o, "type"));
    double step = num_field(o, "step");
    if (!isfinite(step)) {
        d->skipped++;
    } else if (!type || !strcmp(type, "train")) {
        if (ts_grow((void **)&d->train, &d->cap_train, d->n_train + 1, sizeof(train_pt),
                    "plot points") != TS_OK) {
            st = TS_ERR_NOMEM;
        } else {
            d->train[d->n_train++] =
                (train_pt){step, num_field(o, "loss"), num_field(o, "samples_per_s"),
                           num_field(o, "tokens_per_s"), num_field(o, "grad_norm")};
        }
    } else if (!strcmp(type, "eval")) {
        const char *split = json_string_value(json_object_get(o, "split"));
        int k = split_index(d, split ? split : "eval");
        if (k < 0) {
            d->skipped++;
        } else if (ts_grow((void **)&d->eval, &d->cap_eval, d->n_eval + 1, sizeof(eval_pt),
                           "plot points") != TS_OK) {
            st = TS_ERR_NOMEM;
        } else {
            d->eval[d->n_eval++] = (eval_pt){k, step, num_field(o, "loss")};
        }
    }
    /* other types (alerts, checkpoints, ...) are not curves: ignored */
    json_decref(o);
    return st;
}

static ts_status parse_file(run_data *d, const char *path) {
    char *text;
    size_t len;
    ts_status st = read_file(path, &text, &len);
    if (st != TS_OK) return st;
    int line_no = 0;
    for (char *p = text; st == TS_OK && *p;) {
        char *nl = strchr(p, '\n');
        line_no++;
        if (nl) *nl = 0;
        char *s = p;
        while (*s == ' ' || *s == '\t' || *s == '\r') s++;
        if (*s) st = parse_line(d, path, line_no, s, !nl);
        p = nl ? nl + 1 : p + strlen(p);
    }
    free(text);
    return st;
}

/* The script: terminal, datablocks, then one plot per PNG. */
static void build_script(tbuf *b, const run_data *d, int want[3]) {
    tb_printf(b, "# written by `tessel plot`; redraw with: gnuplot plot.gp\n"
                 "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
                 "    set terminal pngcairo size 1000,560 noenhanced\n"
                 "} else {\n"
                 "    set terminal png size 1000,560 noenhanced\n"
                 "}\n"
                 "set grid\nset key top right\nset xlabel 'step'\n");
    tb_printf(b, "$train << EOD\n# step loss samples_per_s tokens_per_s grad_norm\n");
    for (int i = 0; i < d->n_train; i++) {
        const train_pt *t = &d->train[i];
        tb_printf(b, "%.17g", t->step);
        tb_num(b, t->loss);
        tb_num(b, t->sps);
        tb_num(b, t->tps);
        tb_num(b, t->gn);
        tb_printf(b, "\n");
    }
    tb_printf(b, "EOD\n");
    int has_eval[MAX_SPLITS] = {0};
    for (int i = 0; i < d->n_eval; i++)
        if (isfinite(d->eval[i].loss)) has_eval[d->eval[i].split] = 1;
    for (int k = 0; k < d->n_splits; k++) {
        if (!has_eval[k]) continue;
        tb_printf(b, "$eval%d << EOD\n", k);
        for (int i = 0; i < d->n_eval; i++)
            if (d->eval[i].split == k) {
                tb_printf(b, "%.17g", d->eval[i].step);
                tb_num(b, d->eval[i].loss);
                tb_printf(b, "\n");
            }
        tb_printf(b, "EOD\n");
    }

    int n_loss = 0, n_sps = 0, n_tps = 0, n_gn = 0;
    for (int i = 0; i < d->n_train; i++) {
        n_loss += isfinite(d->train[i].loss);
        n_sps += isfinite(d->train[i].sps);
        n_tps += isfinite(d->train[i].tps);
        n_gn += isfinite(d->train[i].gn);
    }
    int any_eval = 0;
    for (int k = 0; k < d->n_splits; k++) any_eval |= has_eval[k];

    want[0] = n_loss > 0 || any_eval;
    if (want[0]) {
        tb_printf(b, "set output ");
        const char *path = "loss.png";
        tb_quoted(b, path);
        tb_printf(b, "\nset title 'loss'\nset ylabel 'loss'\nplot ");
        const char *sep = "";
        if (n_loss) {
            tb_printf(b, "$train using 1:2 with lines lw 2 title 'train'");
            sep = ", ";
        }
        for (int k = 0; k < d->n_splits; k++)
            if (has_eval[k]) {
                tb_printf(b, "%s$eval%d using 1:2 with linespoints pt 7 title ", sep, k);
                tb_quoted(b, d->splits[k]);
                sep = ", ";
            }
        tb_printf(b, "\n");
    }
    want[1] = n_sps > 0 || n_tps > 0;
    if (want[1]) {
        const char *path = "throughput.png";
        tb_printf(b, "set output ");
        tb_quoted(b, path);
        tb_printf(b, "\nset title 'throughput'\n");
        if (n_sps && n_tps)
            tb_printf(b, "set ylabel 'samples/s'\nset y2label 'tokens/s'\nset ytics nomirror\n"
                         "set y2tics\nplot $train using 1:3 with lines lw 2 title 'samples/s', "
                         "$train using 1:4 axes x1y2 with lines lw 2 title 'tokens/s'\n"
                         "unset y2tics\nunset y2label\nset ytics mirror\n");
        else if (n_tps)
            tb_printf(b, "set ylabel 'tokens/s'\n"
                         "plot $train using 1:4 with lines lw 2 title 'tokens/s'\n");
        else
            tb_printf(b, "set ylabel 'samples/s'\n"
                         "plot $train using 1:3 with lines lw 2 title 'samples/s'\n");
    }
    want[2] = n_gn > 0;
    if (want[2]) {
        const char *path = "grad_norm.png";
        tb_printf(b, "set output ");
        tb_quoted(b, path);
        tb_printf(b, "\nset title 'gradient norm'\nset ylabel 'global L2 norm'\n"
                     "plot $train using 1:5 with lines lw 2 title 'grad norm'\n");
    }
    tb_printf(b, "unset output\n");
}

/* The last non-empty line of gnuplot's log: where it stopped and why. */
static void last_log_line(const char *log, char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen(log, "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        size_t k = strlen(line);
        while (k && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' '))
            line[--k] = 0;
        if (k) snprintf(out, n, "%s", line);
    }
    fclose(f);
}

/* gnuplot runs inside plots/ so the script names its outputs relative to
 * itself and can be rerun there by hand. plots/ and its log are reached
 * without following links (core/fsat.h). */
static ts_status run_gnuplot(const char *prog, const ts_dir *plots, const char *script,
                             const char *log) {
    /* a relative program path must not be resolved inside plots/ */
    char abs_prog[PATH_MAX];
    if (strchr(prog, '/') && prog[0] != '/' && realpath(prog, abs_prog)) prog = abs_prog;
    int log_fd;
    ts_status ls = ts_dir_openf(plots, "gnuplot.log", TS_AT_REPLACE, 0644, &log_fd);
    if (ls != TS_OK) return ls;
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa)) {
        close(log_fd);
        return ts_fail(TS_ERR_NOMEM, "plot: cannot prepare to start gnuplot");
    }
    int rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!rc) rc = posix_spawn_file_actions_adddup2(&fa, log_fd, 1);
    if (!rc) rc = posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (!rc) rc = posix_spawn_file_actions_addfchdir_np(&fa, plots->fd);
    pid_t pid;
    char *argv[] = {(char *)prog, "plot.gp", NULL};
    if (!rc) rc = posix_spawnp(&pid, prog, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(log_fd);
    if (rc == ENOENT)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "plot: '%s' not found; install gnuplot (Debian: apt-get install "
                       "gnuplot-nox) or put it on PATH",
                       prog);
    if (rc) return ts_fail(TS_ERR_IO, "plot: cannot start '%s': %s", prog, strerror(rc));
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            return ts_fail(TS_ERR_IO, "plot: lost track of gnuplot: %s", strerror(errno));
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return TS_OK;
    char why[512];
    last_log_line(log, why, sizeof why);
    if (WIFSIGNALED(status))
        return ts_fail(TS_ERR_IO, "plot: gnuplot was killed by signal %d (log: %s)",
                       WTERMSIG(status), log);
    return ts_fail(TS_ERR_IO, "plot: gnuplot failed (exit %d): %s (script %s, log %s)",
                   WEXITSTATUS(status), why[0] ? why : "no message", script, log);
}

ts_status ts_plot_run(const char *run_dir, const ts_plot_options *o, ts_plot_result *r) {
    if (!run_dir || !r) return ts_fail(TS_ERR_INVALID, "plot: NULL run directory or result");
    memset(r, 0, sizeof *r);
    const char *prog = o && o->gnuplot ? o->gnuplot : "gnuplot";
    char jsonl[1024], plots[1024], script[1100], log[1100];
    if ((size_t)snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", run_dir) >= sizeof jsonl ||
        (size_t)snprintf(plots, sizeof plots, "%s/plots", run_dir) >= sizeof plots)
        return ts_fail(TS_ERR_INVALID, "plot: run directory name too long");
    snprintf(script, sizeof script, "%s/plot.gp", plots);
    snprintf(log, sizeof log, "%s/gnuplot.log", plots);

    run_data d;
    memset(&d, 0, sizeof d);
    tbuf b = {0};
    ts_status st = parse_file(&d, jsonl);
    if (st == TS_OK && d.n_train == 0 && d.n_eval == 0)
        st = ts_fail(TS_ERR_FORMAT, "plot: %s has no training or evaluation lines with a step",
                     jsonl);
    int want[3] = {0, 0, 0};
    if (st == TS_OK) {
        build_script(&b, &d, want);
        if (b.oom) st = ts_fail(TS_ERR_NOMEM, "plot: out of memory building the gnuplot script");
    }
    ts_dir run = {-1, NULL}, pd = {-1, NULL};
    if (st == TS_OK) st = ts_dir_open(&run, run_dir, TS_DIR_FOLLOW);
    if (st == TS_OK) st = ts_dir_sub(&pd, &run, "plots", TS_DIR_CREATE);
    if (st == TS_OK) st = ts_dir_write(&pd, "plot.gp", TS_AT_REPLACE, b.p, b.n, 0644, 0);
    if (st == TS_OK) st = run_gnuplot(prog, &pd, script, log);
    static const char *names[3] = {"loss.png", "throughput.png", "grad_norm.png"};
    for (int i = 0; i < 3 && st == TS_OK; i++) {
        if (!want[i]) continue;
        char *path = r->files[r->n_files];
        struct stat sb;
        if ((size_t)snprintf(path, sizeof r->files[0], "%s/%s", plots, names[i]) >=
            sizeof r->files[0])
            st = ts_fail(TS_ERR_INVALID, "plot: path of %s too long", names[i]);
        else if (fstatat(pd.fd, names[i], &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
                 sb.st_size == 0)
            st = ts_fail(TS_ERR_IO, "plot: gnuplot ran but did not write %s (log: %s)", path, log);
        else
            r->n_files++;
    }
    if (st == TS_OK) st = ts_dir_unlink(&pd, "gnuplot.log");
    ts_dir_close(&pd);
    ts_dir_close(&run);
    r->train_points = d.n_train;
    r->eval_points = d.n_eval;
    r->skipped_lines = d.skipped;
    free(d.train);
    free(d.eval);
    free(b.p);
    return st;
}
