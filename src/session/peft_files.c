/* Hugging Face peft files of a LoRA run's checkpoint and the merged model
 * (tessel/peft.h, docs/peft.md). The checkpoint holds the tensors; the
 * hyper-parameters peft's adapter_config.json needs (alpha, use_rslora,
 * dropout) are in the run's config.yaml, the directory above it. A
 * checkpoint of a run on peft.base holds the trainable tensors only: the
 * frozen weights are read from the base it refers to, whose SHA-256 must
 * still be the one recorded. */
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/safetensors.h"
#include "core/core.h"
#include "core/fsat.h"
#include "tessel/ckpt.h"
#include "tessel/config.h"
#include "session/session_internal.h"
#include "tessel/peft.h"

/* The peft release whose adapter_config.json layout is written. */
#define PEFT_FORMAT_VERSION "0.21.2"

int ts_peft_hf_key(const char *name, char *out, size_t n) {
    size_t len = strlen(name);
    if (len <= 7 || (strcmp(name + len - 7, ".lora_A") && strcmp(name + len - 7, ".lora_B")))
        return 0;
    size_t w = len - 7;                                        /* W */
    if (w > 7 && !strncmp(name + w - 7, ".weight", 7)) w -= 7; /* M */
    int k = snprintf(out, n, "base_model.model.%.*s.%s.weight", (int)w, name, name + len - 6);
    return k > 0 && (size_t)k < n;
}

/* One patched weight W of the checkpoint: its A and B tensors. */
typedef struct lora_pair {
    char w[512];
    ts_ckpt_tensor wt, a, b;
    int have_w, have_a, have_b;
    int w_in_base; /* W is the base's (a PEFT checkpoint leaves it out) */
    int in_out;    /* W is stored [in, out] (read as x W, peft's fan_in_fan_out) */
} lora_pair;

typedef struct lora_run {
    ts_ckpt *ck;
    ts_config cfg;
    char path[600]; /* the resolved checkpoint directory */
    lora_pair *p;
    int n;
    double scale;
    ts_peft_base base; /* the base weights a PEFT checkpoint refers to */
    int have_base;
} lora_run;

static void run_close(lora_run *r) {
    ts_ckpt_close(r->ck);
    if (r->have_base) ts_peft_base_close(&r->base);
    free(r->p);
    memset(r, 0, sizeof *r);
}

static lora_pair *pair_of(lora_run *r, const char *w, size_t wlen) {
    for (int i = 0; i < r->n; i++)
        if (strlen(r->p[i].w) == wlen && !strncmp(r->p[i].w, w, wlen)) return &r->p[i];
    lora_pair *q = &r->p[r->n++];
    memset(q, 0, sizeof *q);
    snprintf(q->w, sizeof q->w, "%.*s", (int)wlen, w);
    return q;
}

/* Check one pair against its weight and the run's r; find its orientation. */
static ts_status check_pair(const lora_run *r, lora_pair *q, int onnx) {
    const int r_cfg = r->cfg.peft.r;
    if (!q->have_a || !q->have_b || !q->have_w)
        return ts_fail(TS_ERR_FORMAT, "%s: '%s' lacks its %s", r->path, q->w,
                       !q->have_w   ? "weight"
                       : !q->have_a ? "lora_A"
                                    : "lora_B");
    const int64_t in = q->a.dims[1], out = q->b.dims[0];
    if (q->a.rank != 2 || q->b.rank != 2 || q->wt.rank != 2 || q->a.dims[0] != r_cfg ||
        q->b.dims[1] != r_cfg)
        return ts_fail(TS_ERR_FORMAT,
                       "%s: '%s.lora_A' / '%s.lora_B' are not [r, in] / [out, r] with the "
                       "run's peft.lora.r = %d",
                       r->path, q->w, q->w, r_cfg);
    const int oi = q->wt.dims[0] == out && q->wt.dims[1] == in;
    const int io = q->wt.dims[0] == in && q->wt.dims[1] == out;
    if (!oi && !io)
        return ts_fail(TS_ERR_FORMAT, "%s: '%s' does not fit its LoRA tensors", r->path, q->w);
    /* Built-in models read every weight as nn.Linear's [out, in]; an ONNX
     * model's square weight could be read either way. */
    if (oi && io && onnx)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "%s: '%s' is square in an ONNX model: whether it is read as [out, in] or "
                       "[in, out] is not recorded in the checkpoint",
                       r->path, q->w);
    q->in_out = !oi;
    if (q->wt.dtype != TS_F32 || q->a.dtype != TS_F32 || q->b.dtype != TS_F32)
        return ts_fail(TS_ERR_UNSUPPORTED, "%s: '%s' and its LoRA tensors are not f32", r->path,
                       q->w);
    return TS_OK;
}

/* Open the checkpoint and its run's config; pair every A with its B and W. */
static ts_status run_open(const char *ckpt, lora_run *r) {
    memset(r, 0, sizeof *r);
    ts_status s = ts_ckpt_resolve(ckpt, r->path, sizeof r->path);
    if (s == TS_OK) s = ts_ckpt_open(r->path, NULL, NULL, &r->ck);
    if (s != TS_OK) return s;
    char tmp[600], cfg_path[700];
    snprintf(tmp, sizeof tmp, "%s", r->path);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.yaml", dirname(tmp));
    ts_config_init(&r->cfg);
    if ((s = ts_config_load_file(&r->cfg, cfg_path)) != TS_OK) {
        ts_error_prefix("%s: the LoRA hyper-parameters come from the run's config.yaml", ckpt);
        return s;
    }
    const int nt = ts_ckpt_tensor_count(r->ck);
    if (!(r->p = ts_zalloc(sizeof *r->p * (size_t)(nt + 1), "peft export"))) return TS_ERR_NOMEM;
    for (int i = 0; i < nt; i++) {
        ts_ckpt_tensor t;
        if ((s = ts_ckpt_tensor_info(r->ck, i, &t)) != TS_OK) return s;
        if (t.is_state) continue;
        size_t len = strlen(t.name);
        if (ts_peft_param_kind(t.name) == 2)
            return ts_fail(TS_ERR_UNSUPPORTED,
                           "%s: '%s' is a bottleneck adapter's tensor (peft.adapter.after): "
                           "peft's files have no Houlsby adapter type and an adapter cannot be "
                           "folded into a weight, so the run is not exported (its checkpoint "
                           "holds the adapters)",
                           r->path, t.name);
        int a = len > 7 && !strcmp(t.name + len - 7, ".lora_A");
        int b = len > 7 && !strcmp(t.name + len - 7, ".lora_B");
        if (!a && !b) continue;
        lora_pair *q = pair_of(r, t.name, len - 7);
        if (a) q->a = t, q->have_a = 1;
        if (b) q->b = t, q->have_b = 1;
    }
    if (r->n == 0)
        return ts_fail(TS_ERR_INVALID,
                       "%s: no LoRA tensors (*.lora_A, *.lora_B): not a checkpoint of a run with "
                       "peft.lora.targets",
                       r->path);
    ts_ckpt_info in;
    if ((s = ts_ckpt_get_info(r->ck, &in)) != TS_OK) return s;
    if (in.base_path[0]) {
        char what[700];
        snprintf(what, sizeof what, "%s: its frozen weights' base", r->path);
        if ((s = ts_peft_base_open(in.base_path, what, in.base_sha256, &r->base)) != TS_OK)
            return s;
        r->have_base = 1;
    }
    const int onnx = !strcmp(ts_config_model_word(r->cfg.model.name), "onnx");
    for (int i = 0; i < r->n && s == TS_OK; i++) {
        lora_pair *q = &r->p[i];
        for (int k = 0; k < nt; k++) {
            ts_ckpt_tensor t;
            if (ts_ckpt_tensor_info(r->ck, k, &t) == TS_OK && !t.is_state && !strcmp(t.name, q->w))
                q->wt = t, q->have_w = 1;
        }
        if (!q->have_w && r->have_base &&
            ts_peft_base_find(&r->base, q->w, &q->wt.dtype, &q->wt.rank, q->wt.dims))
            q->wt.name = q->w, q->have_w = q->w_in_base = 1;
        s = check_pair(r, q, onnx);
    }
    const double rr = r->cfg.peft.r;
    r->scale = r->cfg.peft.use_rslora ? r->cfg.peft.alpha / sqrt(rr) : r->cfg.peft.alpha / rr;
    return s;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* An integer where the value is one (peft's lora_alpha is an int). */
static json_t *number(double v) {
    return v == floor(v) && fabs(v) < 1e15 ? json_integer((json_int_t)v) : json_real(v);
}

/* target_modules: the patched modules' names, sorted. */
static json_t *modules(const lora_run *r) {
    json_t *mods = json_array();
    const char **names = ts_alloc(sizeof *names * (size_t)(r->n + 1), "peft export");
    char(*m)[520] = ts_alloc(sizeof *m * (size_t)(r->n + 1), "peft export");
    int bad = !mods || !names || !m;
    for (int i = 0; i < r->n && !bad; i++) {
        size_t w = strlen(r->p[i].w);
        if (w > 7 && !strcmp(r->p[i].w + w - 7, ".weight")) w -= 7;
        snprintf(m[i], sizeof m[i], "%.*s", (int)w, r->p[i].w);
        names[i] = m[i];
    }
    if (!bad) qsort(names, (size_t)r->n, sizeof *names, cmp_str);
    for (int i = 0; i < r->n && !bad; i++)
        bad |= json_array_append_new(mods, json_string(names[i]));
    free(names);
    free(m);
    if (bad) {
        json_decref(mods);
        return NULL;
    }
    return mods;
}

/* adapter_config.json: the keys peft 0.x writes for LoRA. */
static json_t *adapter_config(const lora_run *r, int fan_in_fan_out) {
    json_t *o = json_object(), *mods = modules(r);
    if (!o || !mods) {
        json_decref(o);
        json_decref(mods);
        return NULL;
    }
    const ts_config *c = &r->cfg;
    const char *base = c->peft.base[0] && strcmp(c->peft.base, "none") ? c->peft.base : NULL;
    int bad = 0;
    bad |= json_object_set_new(o, "peft_type", json_string("LORA"));
    bad |= json_object_set_new(o, "task_type", json_null());
    bad |=
        json_object_set_new(o, "base_model_name_or_path", base ? json_string(base) : json_null());
    bad |= json_object_set_new(o, "revision", json_null());
    bad |= json_object_set_new(o, "inference_mode", json_true());
    bad |= json_object_set_new(o, "r", json_integer(c->peft.r));
    bad |= json_object_set_new(o, "lora_alpha", number(c->peft.alpha));
    bad |= json_object_set_new(o, "lora_dropout", number(c->peft.dropout));
    bad |= json_object_set_new(o, "target_modules", mods);
    bad |= json_object_set_new(o, "fan_in_fan_out", json_boolean(fan_in_fan_out));
    bad |= json_object_set_new(o, "bias", json_string("none"));
    bad |= json_object_set_new(o, "use_rslora", json_boolean(c->peft.use_rslora));
    bad |= json_object_set_new(o, "use_dora", json_false());
    bad |= json_object_set_new(o, "init_lora_weights", json_true());
    bad |= json_object_set_new(o, "modules_to_save", json_null());
    bad |= json_object_set_new(o, "layers_to_transform", json_null());
    bad |= json_object_set_new(o, "layers_pattern", json_null());
    bad |= json_object_set_new(o, "layer_replication", json_null());
    bad |= json_object_set_new(o, "rank_pattern", json_object());
    bad |= json_object_set_new(o, "alpha_pattern", json_object());
    bad |= json_object_set_new(o, "loftq_config", json_object());
    bad |= json_object_set_new(o, "megatron_config", json_null());
    bad |= json_object_set_new(o, "megatron_core", json_string("megatron.core"));
    bad |= json_object_set_new(o, "auto_mapping", json_null());
    bad |= json_object_set_new(o, "peft_version", json_string(PEFT_FORMAT_VERSION));
    /* the keys later peft releases added (0.21.2 writes all of these; the
     * parity fixture tests/parity/fixtures/peft/mlp/adapter_config.json is
     * peft's own file): their values for plain LoRA */
    static const char *const NULLS[] = {"exclude_modules",   "eva_config",
                                        "corda_config",      "trainable_token_indices",
                                        "target_parameters", "alora_invocation_tokens",
                                        "arrow_config",      "kasa_config",
                                        "lora_ga_config",    "monteclora_config",
                                        "use_bdlora",        "velora_config"};
    for (size_t i = 0; i < sizeof NULLS / sizeof NULLS[0]; i++)
        bad |= json_object_set_new(o, NULLS[i], json_null());
    bad |= json_object_set_new(o, "lora_bias", json_false());
    bad |= json_object_set_new(o, "use_qalora", json_false());
    bad |= json_object_set_new(o, "qalora_group_size", json_integer(16));
    bad |= json_object_set_new(o, "ensure_weight_tying", json_false());
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Read a tensor of the checkpoint into a new buffer. */
static ts_status read_all(const ts_ckpt *ck, const ts_ckpt_tensor *t, void **out) {
    if (!(*out = ts_alloc(t->bytes ? t->bytes : 1, "peft export"))) return TS_ERR_NOMEM;
    ts_status s = ts_ckpt_read(ck, t->name, *out, t->bytes);
    if (s != TS_OK) {
        free(*out);
        *out = NULL;
    }
    return s;
}

/* The adapter's tensors under peft's names, in the writer (bufs owns the data). */
static ts_status add_adapter(const lora_run *r, ts_st_writer *w, void **bufs) {
    ts_status s = TS_OK;
    for (int i = 0; i < r->n && s == TS_OK; i++)
        for (int k = 0; k < 2 && s == TS_OK; k++) {
            const ts_ckpt_tensor *t = k ? &r->p[i].b : &r->p[i].a;
            char key[700];
            if (!ts_peft_hf_key(t->name, key, sizeof key))
                return ts_fail(TS_ERR_INVALID, "peft export: name '%s' too long", t->name);
            if ((s = read_all(r->ck, t, &bufs[2 * i + k])) == TS_OK)
                s = ts_st_writer_add(w, key, t->dtype, t->rank, t->dims, bufs[2 * i + k]);
        }
    /* what peft's save_pretrained records in the file's metadata */
    if (s == TS_OK) s = ts_st_writer_meta(w, "format", "pt");
    return s;
}

ts_status ts_peft_export_adapter(const char *ckpt, const char *dir) {
    if (!ckpt || !dir) return ts_fail(TS_ERR_INVALID, "peft export: NULL argument");
    lora_run r;
    ts_status s = run_open(ckpt, &r);
    ts_st_writer *w = NULL;
    void **bufs = NULL;
    json_t *cfg = NULL;
    char *text = NULL;
    ts_dir d = {.fd = -1, .path = NULL};
    if (s != TS_OK) goto done;
    const int fifo = r.p[0].in_out;
    for (int i = 1; i < r.n; i++)
        if (r.p[i].in_out != fifo) {
            s = ts_fail(TS_ERR_UNSUPPORTED,
                        "%s: '%s' is stored [%s] and '%s' [%s]: peft's fan_in_fan_out is one "
                        "flag for every module",
                        r.path, r.p[0].w, fifo ? "in, out" : "out, in", r.p[i].w,
                        fifo ? "out, in" : "in, out");
            goto done;
        }
    if ((s = ts_st_writer_new(&w)) != TS_OK) goto done;
    if (!(bufs = ts_zalloc(sizeof *bufs * (size_t)(2 * r.n + 1), "peft export"))) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    if ((s = add_adapter(&r, w, bufs)) != TS_OK) goto done;
    if ((s = ts_dir_open(&d, dir, TS_DIR_CREATE | TS_DIR_FOLLOW)) != TS_OK) goto done;
    char shown[700];
    snprintf(shown, sizeof shown, "%s/adapter_model.safetensors", dir);
    s = ts_st_writer_save_at(w, d.fd, "adapter_model.safetensors", shown, 0, NULL, NULL);
    if (s == TS_OK &&
        (!(cfg = adapter_config(&r, fifo)) ||
         !(text = json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)))))
        s = ts_fail(TS_ERR_NOMEM, "peft export: out of memory for adapter_config.json");
    if (s == TS_OK) {
        size_t n = strlen(text);
        char *t2 = realloc(text, n + 2);
        if (!t2) {
            s = ts_fail(TS_ERR_NOMEM, "peft export: out of memory for adapter_config.json");
        } else {
            text = t2;
            memcpy(text + n, "\n", 2);
            s = ts_dir_replace(&d, "adapter_config.json", text, n + 1, 0644, 1);
        }
    }
done:
    if (bufs)
        for (int i = 0; i < 2 * r.n; i++) free(bufs[i]);
    free(bufs);
    free(text);
    json_decref(cfg);
    ts_st_writer_free(w);
    ts_dir_close(&d);
    run_close(&r);
    return s;
}

/* W += scale * B A, in the orientation W is stored. */
static void merge_into(float *w, const float *a, const float *b, const lora_pair *q, double scale) {
    const int64_t r = q->a.dims[0], in = q->a.dims[1], out = q->b.dims[0];
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            double acc = 0;
            for (int64_t k = 0; k < r; k++) acc += (double)b[o * r + k] * (double)a[k * in + i];
            float *dst = q->in_out ? &w[i * out + o] : &w[o * in + i];
            *dst = (float)((double)*dst + scale * acc);
        }
}

static int is_lora_name(const char *name) {
    size_t len = strlen(name);
    return len > 7 && (!strcmp(name + len - 7, ".lora_A") || !strcmp(name + len - 7, ".lora_B"));
}

/* Tensor t (of the checkpoint, or with from_base of the base it refers
 * to) into *buf, merged with its LoRA pair if it has one. */
static ts_status merged_tensor(const lora_run *r, const ts_ckpt_tensor *t, int from_base,
                               void **buf) {
    ts_status s;
    if (!from_base) {
        s = read_all(r->ck, t, buf);
    } else if (!(*buf = ts_alloc(t->bytes ? t->bytes : 1, "peft merge"))) {
        s = TS_ERR_NOMEM;
    } else {
        s = ts_peft_base_read(&r->base, t->name, *buf, t->bytes);
    }
    for (int k = 0; k < r->n && s == TS_OK; k++) {
        if (strcmp(r->p[k].w, t->name)) continue;
        void *a = NULL, *b = NULL;
        s = read_all(r->ck, &r->p[k].a, &a);
        if (s == TS_OK) s = read_all(r->ck, &r->p[k].b, &b);
        if (s == TS_OK) merge_into(*buf, a, b, &r->p[k], r->scale);
        free(a);
        free(b);
    }
    return s;
}

/* The parameters of the merged model: the checkpoint's (but LoRA's), then
 * the base's that the checkpoint left out (frozen). */
static ts_status merged_list(const lora_run *r, ts_ckpt_tensor **out, char **from_base, int *n) {
    const int nt = ts_ckpt_tensor_count(r->ck);
    int nb = 0;
    while (r->have_base && ts_peft_base_name(&r->base, nb)) nb++;
    *out = ts_zalloc(sizeof **out * (size_t)(nt + nb + 1), "peft merge");
    *from_base = ts_zalloc((size_t)(nt + nb + 1), "peft merge");
    *n = 0;
    if (!*out || !*from_base) return TS_ERR_NOMEM;
    for (int i = 0; i < nt; i++) {
        ts_ckpt_tensor t;
        ts_status s = ts_ckpt_tensor_info(r->ck, i, &t);
        if (s != TS_OK) return s;
        if (!t.is_state && !is_lora_name(t.name)) (*out)[(*n)++] = t;
    }
    const int in_ckpt = *n;
    for (int i = 0; i < nb; i++) {
        ts_ckpt_tensor t = {0};
        t.name = ts_peft_base_name(&r->base, i);
        int dup = 0;
        for (int k = 0; k < in_ckpt && !dup; k++) dup = !strcmp((*out)[k].name, t.name);
        if (dup || !ts_peft_base_find(&r->base, t.name, &t.dtype, &t.rank, t.dims)) continue;
        t.bytes = ts_dtype_size(t.dtype);
        for (int d = 0; d < t.rank; d++) t.bytes *= (size_t)t.dims[d];
        (*from_base)[*n] = 1;
        (*out)[(*n)++] = t;
    }
    return TS_OK;
}

ts_status ts_peft_export_merged(const char *ckpt, const char *path) {
    if (!ckpt || !path) return ts_fail(TS_ERR_INVALID, "peft merge: NULL argument");
    lora_run r;
    ts_status s = run_open(ckpt, &r);
    ts_st_writer *w = NULL;
    void **bufs = NULL;
    ts_ckpt_tensor *list = NULL;
    char *from_base = NULL;
    int nt = 0;
    if (s == TS_OK) s = merged_list(&r, &list, &from_base, &nt);
    if (s == TS_OK) s = ts_st_writer_new(&w);
    if (s == TS_OK && !(bufs = ts_zalloc(sizeof *bufs * (size_t)(nt + 1), "peft merge")))
        s = TS_ERR_NOMEM;
    /* Larger elements first keeps every tensor aligned (see safetensors.h). */
    for (size_t esz = 8; esz >= 1 && s == TS_OK; esz /= 2)
        for (int i = 0; i < nt && s == TS_OK; i++) {
            const ts_ckpt_tensor *t = &list[i];
            if (ts_dtype_size(t->dtype) != esz) continue;
            if ((s = merged_tensor(&r, t, from_base[i], &bufs[i])) == TS_OK)
                s = ts_st_writer_add(w, t->name, t->dtype, t->rank, t->dims, bufs[i]);
        }
    if (s == TS_OK) s = ts_st_writer_save(w, path);
    if (bufs)
        for (int i = 0; i < nt; i++) free(bufs[i]);
    free(bufs);
    free(list);
    free(from_base);
    ts_st_writer_free(w);
    run_close(&r);
    return s;
}
