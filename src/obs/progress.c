/* Progress display: a refreshing terminal line or plain log lines. */
#include "obs/progress.h"

#include <stdarg.h>
#include <string.h>

void ts_progress_start(ts_progress *p, FILE *out, ts_progress_mode mode, int64_t total,
                       int64_t log_every, const char *unit, double per_step) {
    memset(p, 0, sizeof *p);
    p->out = out ? out : stdout;
    p->mode = mode;
    p->total = total > 0 ? total : 1;
    p->log_every = log_every > 0 ? log_every : (p->total + 99) / 100;
    p->unit = unit ? unit : "samples/s";
    p->width = snprintf(NULL, 0, "%lld", (long long)p->total);
    p->per_step = per_step;
    p->t_start = ts_now();
}

/* "1:05", "12:00:07" */
static void fmt_duration(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 360000.0) {
        snprintf(buf, n, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static void format_line(ts_progress *p, const ts_progress_info *in, double now, char *buf,
                        size_t n) {
    double rate = in->rate;
    if (p->step_shown > 0 && in->step > p->step_shown && now > p->t_shown)
        rate = p->per_step * (double)(in->step - p->step_shown) / (now - p->t_shown);
    p->step_shown = in->step;
    p->t_shown = now;
    size_t k = (size_t)snprintf(buf, n, "step %*lld/%lld  loss %.6f  lr %.3e", p->width,
                                (long long)in->step, (long long)p->total, in->loss, in->lr);
    if (in->epoch > 0 && k < n) {
        if (in->epochs > 0)
            k += (size_t)snprintf(buf + k, n - k, "  epoch %lld/%lld", (long long)in->epoch,
                                  (long long)in->epochs);
        else
            k += (size_t)snprintf(buf + k, n - k, "  epoch %lld", (long long)in->epoch);
    }
    if (k < n) k += (size_t)snprintf(buf + k, n - k, "  %.0f %s", rate, p->unit);
    /* The average pace so far: steady after the first few steps, and it
     * counts evaluation time too, which the run will spend again. */
    if (in->step < p->total && k < n) {
        char eta[32];
        fmt_duration((now - p->t_start) / (double)in->step * (double)(p->total - in->step), eta,
                     sizeof eta);
        snprintf(buf + k, n - k, "  ETA %s", eta);
    }
}

void ts_progress_step(ts_progress *p, const ts_progress_info *in) {
    if (!p || p->mode == TS_PROGRESS_NONE) return;
    const double now = ts_now();
    char line[256];
    if (p->mode == TS_PROGRESS_LINES) {
        if (in->step != 1 && in->step % p->log_every && in->step != p->total) return;
        format_line(p, in, now, line, sizeof line);
        fprintf(p->out, "%s\n", line);
        fflush(p->out);
        return;
    }
    /* A terminal cannot show more than a few redraws a second anyway. */
    if (in->step != 1 && in->step != p->total && now - p->t_drawn < 0.1) return;
    format_line(p, in, now, line, sizeof line);
    fprintf(p->out, "\r%s\033[K", line);
    fflush(p->out);
    p->t_drawn = now;
    p->line_open = 1;
}

void ts_progress_log(ts_progress *p, const char *fmt, ...) {
    if (!p || p->mode == TS_PROGRESS_NONE) return;
    if (p->line_open) {
        fputs("\r\033[K", p->out); /* the next step redraws the progress line */
        p->line_open = 0;
        p->t_drawn = 0;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->out, fmt, ap);
    va_end(ap);
    fputc('\n', p->out);
    fflush(p->out);
}

void ts_progress_end(ts_progress *p) {
    if (!p || !p->line_open) return;
    fputc('\n', p->out);
    fflush(p->out);
    p->line_open = 0;
}
