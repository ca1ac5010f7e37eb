/* onnx_export.c — `tessel export CKPT --onnx FILE`: rebuilds the model of
 * the checkpoint's run from its config.yaml (the forward graph of its model
 * descriptor, no loss or backward), reads the trained weights from the
 * verified checkpoint and writes them as an ONNX model (docs/onnx.md,
 * "Exporting"). The ONNX file records the checkpoint it came from. With
 * --triton DIR it also lays out a Triton model repository (onnx_triton.c):
 * DIR/NAME/1/model.onnx and DIR/NAME/config.pbtxt. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "onnx_cli.h"
#include "onnx_triton.h"
#include "tessel/onnx.h"
#include "tessel/tessel.h"

typedef struct weights {
    ts_ckpt *c;
    char *used; /* per checkpoint tensor: read by the export */
} weights;

static ts_status read_weight(void *ctx, const char *name, void *dst, size_t bytes) {
    weights *w = ctx;
    for (int i = 0; i < ts_ckpt_tensor_count(w->c); i++) {
        ts_ckpt_tensor t;
        if (ts_ckpt_tensor_info(w->c, i, &t) == TS_OK && !strcmp(t.name, name)) w->used[i] = 1;
    }
    return ts_ckpt_read(w->c, name, dst, bytes);
}

typedef struct triton_opts {
    const char *dir, *name;
    int64_t max_batch; /* 0: the trained batch */
} triton_opts;

/* The run directory's last component, as a Triton model name. */
static void default_name(const char *run, char *name, size_t n) {
    const char *base = strrchr(run, '/');
    base = base && base[1] ? base + 1 : run;
    const size_t len = strlen(strcmp(base, ".") ? base : "model");
    memcpy(name, strcmp(base, ".") ? base : "model", len < n ? len + 1 : n);
    name[n - 1] = 0;
    for (char *p = name; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-", *p))
            *p = '_';
}

static int export_onnx(const char *ckpt, const char *pubkey, const char *out, int64_t opset,
                       ts_dtype wtype, const triton_opts *tr) {
    ts_ckpt *c = NULL;
    ts_status s = ts_ckpt_open(ckpt, pubkey, NULL, &c);
    if (s != TS_OK) return cli_error(cli_status_code(s), "%s", ts_last_error());
    ts_ckpt_info in;
    ts_ckpt_get_info(c, &in);
    /* The run directory holds the checkpoint and the config that built it. */
    char run[PATH_MAX], cfg_path[PATH_MAX + 16], man[PATH_MAX + 16];
    snprintf(run, sizeof run, "%s", in.dir);
    char *slash = strrchr(run, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(run, sizeof run, ".");
    snprintf(cfg_path, sizeof cfg_path, "%s/config.yaml", run);
    snprintf(man, sizeof man, "%s/manifest.json", in.dir);
    ts_config cfg;
    ts_config_init(&cfg);
    char manifest_sha[65] = "", step[32];
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    weights w = {c, calloc((size_t)ts_ckpt_tensor_count(c) + 1, 1)};
    if (!w.used) s = ts_fail(TS_ERR_NOMEM, "export: out of memory");
    if (s == TS_OK && (s = ts_config_load_file(&cfg, cfg_path)) != TS_OK)
        ts_error_prefix("export --onnx: the run's config beside checkpoint %s", in.dir);
    if (s == TS_OK) s = ts_config_finish(&cfg);
    if (s == TS_OK) s = ts_session_build_model(&cfg, &g, &m, &spec, &opt);
    if (s == TS_OK) s = ts_sha256_file(man, manifest_sha);
    /* Every trained parameter must be in the file: one the model descriptor
     * does not build (a LoRA adapter, added by the compiler's peft pass)
     * would be silently dropped. Checked before anything is written. */
    for (int i = 0; s == TS_OK && i < ts_ckpt_tensor_count(c); i++) {
        ts_ckpt_tensor t;
        if (ts_ckpt_tensor_info(c, i, &t) == TS_OK && !t.is_state && !ts_val_ok(ts_find(g, t.name)))
            s = ts_fail(TS_ERR_UNSUPPORTED,
                        "export --onnx: parameter '%s' of %s is not part of the model's forward "
                        "graph (a PEFT adapter?); nothing written",
                        t.name, in.dir);
    }
    ts_onnx_export_info info;
    char tname[256] = "", tmodel[4400] = "", tconfig[4400] = "";
    if (s == TS_OK && tr->dir) {
        if (tr->name)
            snprintf(tname, sizeof tname, "%s", tr->name);
        else
            default_name(run, tname, sizeof tname);
        s = triton_dirs(tr->dir, tname, tmodel, sizeof tmodel - 16);
        snprintf(tconfig, sizeof tconfig, "%s/%s/config.pbtxt", tr->dir, tname);
        strcat(tmodel, "/model.onnx");
        if (!out) out = tmodel;
    }
    if (s == TS_OK) {
        ts_onnx_export_options o = ts_onnx_export_defaults();
        o.opset = opset;
        o.weights = wtype;
        o.weight = read_weight;
        o.weight_ctx = &w;
        snprintf(step, sizeof step, "%lld", (long long)in.step);
        const char *keys[] = {"tessel.checkpoint", "tessel.checkpoint_id", "tessel.step",
                              "tessel.manifest_sha256", "tessel.config_sha256"};
        const char *vals[] = {in.dir, in.id, step, manifest_sha, in.config_sha256};
        for (int i = 0; i < 5; i++) {
            o.meta_key[i] = keys[i];
            o.meta_value[i] = vals[i];
        }
        o.n_meta = 5;
        s = ts_onnx_export(g, m.output, out, &o, &info);
        /* Checked first so a refused model leaves nothing behind. */
        if (s == TS_OK && tr->dir && (s = triton_config_check(&info)) != TS_OK) remove(out);
        if (s == TS_OK && tr->dir && out != tmodel)
            s = ts_onnx_export(g, m.output, tmodel, &o, &info);
        if (s == TS_OK && tr->dir)
            s = triton_config_write(tconfig, tname, &info,
                                    tr->max_batch > 0 ? tr->max_batch : cfg.model.batch);
    }
    /* ... and read by the export: one the output does not depend on. */
    for (int i = 0; s == TS_OK && i < ts_ckpt_tensor_count(c); i++) {
        ts_ckpt_tensor t;
        if (ts_ckpt_tensor_info(c, i, &t) == TS_OK && !t.is_state && !w.used[i]) {
            remove(out);
            s = ts_fail(TS_ERR_UNSUPPORTED,
                        "export --onnx: parameter '%s' of %s does not reach the model's output; "
                        "%s removed",
                        t.name, in.dir, out);
        }
    }
    if (s == TS_OK)
        printf("wrote %s: ONNX opset %lld, %d nodes (%s), %d initialisers (%lld elements) from %s "
               "(step %lld, manifest sha256 %.16s...)\n",
               out, (long long)opset, info.n_nodes, info.ops, info.n_initializers,
               (long long)info.param_elems, in.dir, (long long)in.step, manifest_sha);
    if (s == TS_OK && tr->dir)
        printf("wrote the Triton model repository %s: %s/config.pbtxt (max_batch_size %lld, "
               "dynamic batching) and %s/1/model.onnx\n",
               tr->dir, tname, (long long)(tr->max_batch > 0 ? tr->max_batch : cfg.model.batch),
               tname);
    ts_graph_free(g);
    free(w.used);
    ts_ckpt_close(c);
    return s == TS_OK ? CLI_OK : cli_error(cli_status_code(s), "%s", ts_last_error());
}

int tessel_cmd_export_onnx(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL, *pubkey = NULL;
    int64_t opset = 18;
    triton_opts tr = {NULL, NULL, 0};
    ts_dtype weights = TS_F32;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (a[0] != '-') {
            if (ckpt) return cli_error(CLI_USAGE, "export: unexpected argument '%s'", a);
            ckpt = a;
            continue;
        }
        const size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return cli_error(CLI_USAGE, "export: %.*s needs a value", (int)nl, a);
        if (nl == 6 && !strncmp(a, "--onnx", nl))
            out = v;
        else if (nl == 8 && !strncmp(a, "--pubkey", nl))
            pubkey = v;
        else if (nl == 7 && !strncmp(a, "--opset", nl) && (!strcmp(v, "17") || !strcmp(v, "18")))
            opset = atoi(v);
        else if (nl == 9 && !strncmp(a, "--weights", nl) &&
                 (!strcmp(v, "f32") || !strcmp(v, "fp16") || !strcmp(v, "bf16")))
            weights = v[0] == 'f' && v[1] == '3' ? TS_F32 : v[0] == 'f' ? TS_F16 : TS_BF16;
        else if (nl == 8 && !strncmp(a, "--triton", nl))
            tr.dir = v;
        else if (nl == 6 && !strncmp(a, "--name", nl) && v[0] && !strchr(v, '/'))
            tr.name = v;
        else if (nl == 11 && !strncmp(a, "--max-batch", nl) && (tr.max_batch = atoll(v)) > 0)
            continue;
        else
            return cli_error(CLI_USAGE,
                             "export: '%s' (with --onnx / --triton: --pubkey FILE, --opset 17|18, "
                             "--weights f32|fp16|bf16, --triton DIR, --name NAME, --max-batch N)",
                             a);
    }
    if (!ckpt || (!out && !tr.dir))
        return cli_error(CLI_USAGE, "export: usage: tessel export CKPT --onnx FILE [--pubkey "
                                    "FILE] [--opset 17|18] [--weights f32|fp16|bf16] [--triton "
                                    "DIR [--name NAME] [--max-batch N]]");
    if ((tr.name || tr.max_batch) && !tr.dir)
        return cli_error(CLI_USAGE, "export: --name and --max-batch go with --triton DIR");
    return export_onnx(ckpt, pubkey, out, opset, weights, &tr);
}
