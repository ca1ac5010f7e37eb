/* Parameter-efficient fine-tuning in a run (docs/peft.md): the base
 * weights of peft.base written into the training plan before the first
 * step, and the trainable share of the parameters. The LoRA rewrite
 * itself is a compiler pass (src/passes/peft.c). See session_internal.h. */
#include <stdlib.h>
#include <string.h>
#include "ckpt/safetensors.h"
#include "core/core.h"
#include "session/session_internal.h"
#include "tessel/peft.h"

/* A LoRA or adapter parameter of the peft pass: not in the base. */
static int is_lora(const char *name) {
    return ts_peft_param_kind(name) != 0;
}

void ts_sess_peft_counts(const ts_plan *p, double *trainable, double *total) {
    *trainable = *total = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[TS_MAX_RANK];
        if (ts_plan_value_info(p, name, NULL, &rank, dims) != TS_OK) continue;
        double n = 1;
        for (int k = 0; k < rank; k++) n *= (double)dims[k];
        *total += n;
        char g[600];
        snprintf(g, sizeof g, "grad:%s", name);
        if (ts_plan_value_info(p, g, NULL, NULL, NULL) == TS_OK) *trainable += n;
    }
}

static void shape_str(char *buf, size_t n, ts_dtype dt, int rank, const int64_t *dims) {
    size_t k = (size_t)snprintf(buf, n, "%s[", ts_dtype_name(dt));
    for (int i = 0; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Every parameter of the model but the LoRA ones must be in the base with
 * its dtype and shape; the first few that are not are listed. */
static ts_status check_names(const ts_plan *p, const ts_peft_base *b, const char *path) {
    char msg[1024] = "";
    size_t k = 0;
    int bad = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        const char *name = ts_plan_param_name(p, i);
        if (is_lora(name)) continue;
        ts_dtype dt, bdt;
        int rank, brank;
        int64_t dims[TS_MAX_RANK] = {0}, bdims[TS_MAX_RANK] = {0};
        ts_status st = ts_plan_value_info(p, name, &dt, &rank, dims);
        if (st != TS_OK) return st;
        char want[128], got[128], line[400];
        shape_str(want, sizeof want, dt, rank, dims);
        if (!ts_peft_base_find(b, name, &bdt, &brank, bdims)) {
            snprintf(line, sizeof line, "'%s' %s missing", name, want);
        } else if (bdt != dt || brank != rank ||
                   memcmp(dims, bdims, sizeof(int64_t) * (size_t)rank)) {
            shape_str(got, sizeof got, bdt, brank, bdims);
            snprintf(line, sizeof line, "'%s' is %s in the base, %s in the model", name, got, want);
        } else {
            continue;
        }
        if (bad++ < 5 && k < sizeof msg)
            k += (size_t)snprintf(msg + k, sizeof msg - k, "%s%s", bad > 1 ? "; " : "", line);
    }
    if (!bad) return TS_OK;
    return ts_fail(TS_ERR_INVALID, "peft.base: %s does not fit the model: %d parameter%s (%s%s)",
                   path, bad, bad > 1 ? "s" : "", msg, bad > 5 ? "; ..." : "");
}

static ts_status copy_in(ts_plan *p, const ts_peft_base *b) {
    ts_status s = TS_OK;
    void *buf = NULL;
    size_t cap = 0;
    for (int i = 0; i < ts_plan_param_count(p) && s == TS_OK; i++) {
        const char *name = ts_plan_param_name(p, i);
        if (is_lora(name)) continue;
        ts_dtype dt;
        int rank;
        int64_t dims[TS_MAX_RANK];
        if ((s = ts_plan_value_info(p, name, &dt, &rank, dims)) != TS_OK) break;
        size_t bytes = ts_dtype_size(dt);
        for (int k = 0; k < rank; k++) bytes *= (size_t)dims[k];
        if (bytes > cap) {
            free(buf);
            if (!(buf = ts_alloc(bytes, "peft.base tensor"))) return TS_ERR_NOMEM;
            cap = bytes;
        }
        if ((s = ts_peft_base_read(b, name, buf, bytes)) == TS_OK)
            s = ts_plan_write_param(p, name, buf, bytes);
    }
    free(buf);
    return s;
}

ts_status ts_sess_peft_load_base(session *s) {
    const char *path = s->c.peft.base;
    s->peft_base_path[0] = s->peft_base_sha[0] = 0;
    if (!path[0]) return ts_sess_peft_load_adapter(s);
    ts_peft_base b;
    ts_status st = ts_peft_base_open(path, "peft.base", NULL, &b);
    if (st != TS_OK) return st;
    st = check_names(s->plan, &b, path);
    if (st == TS_OK && (st = copy_in(s->plan, &b)) != TS_OK) ts_error_prefix("peft.base %s", path);
    /* what this run's checkpoints refer to instead of saving the frozen weights */
    snprintf(s->peft_base_path, sizeof s->peft_base_path, "%s", b.path);
    snprintf(s->peft_base_sha, sizeof s->peft_base_sha, "%s", b.sha256);
    ts_peft_base_close(&b);
    return st == TS_OK ? ts_sess_peft_load_adapter(s) : st;
}
