/* Hugging Face peft adapter files and --merge, end to end ($TESSEL_BIN,
 * run from the repository root; docs/peft.md):
 *
 * - `tessel export CKPT --peft DIR` of a LoRA run writes
 *   adapter_config.json with peft's LoRA keys and the run's r, alpha and
 *   patched modules, and adapter_model.safetensors whose tensors, under
 *   peft's names, are the checkpoint's bit for bit;
 * - `peft.load: DIR` starts a run with exactly those A and B (its
 *   checkpoint after steps at lr 0 holds them bit for bit), and its step-1
 *   loss differs from the base model's;
 * - `--merge --safetensors FILE` folds the update into the weights: a run
 *   of the plain model on the merged file computes the LoRA run's step-1
 *   loss within fp32 rounding, for alpha / r and rslora's alpha / sqrt(r);
 * - an adapter_config key tessel does not know is a warning naming it; a
 *   config that disagrees with the run (r, lora_alpha, target_modules) or a
 *   checkpoint without LoRA tensors exits 2 naming the file and key. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ckpt/safetensors.h"
#include "e2e.h"
#include "tessel/ckpt.h"

static char dir[64];

#define MODEL                                                                                      \
    "examples/w1.yaml --set model.hidden=32 --set model.window=4 --set model.features=8 --set "    \
    "model.batch=32"
#define LORA " --set 'peft.lora.targets=net\\.[036]\\.weight' --set peft.lora.alpha=16"

static const char *const MODS[] = {"net.0", "net.3", "net.6"};

static void expect_fail(const char *what, e2e_result r, const char *n1, const char *n2) {
    CHECK(r.rc == 2, "%s: exit %d, expected 2\n%s", what, r.rc, r.err);
    CHECK(strstr(r.err, n1) != NULL, "%s: '%s' not in: %s", what, n1, r.err);
    if (n2) CHECK(strstr(r.err, n2) != NULL, "%s: '%s' not in: %s", what, n2, r.err);
    e2e_done(&r);
}

/* The loss of step 1 in RUN/metrics.jsonl (full precision). */
static double step1_loss(const char *run) {
    char path[300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    char *text = e2e_slurp(path, NULL);
    const char *p = strstr(text, "\"step\":1,");
    p = p ? strstr(p, "\"loss\":") : NULL;
    double l = NAN;
    if (p) sscanf(p, "\"loss\":%lf", &l);
    free(text);
    CHECK(isfinite(l), "step-1 loss in %s", path);
    return l;
}

/* Tensor `name` of checkpoint `path` into a new buffer (*bytes its size). */
static void *ckpt_tensor(const char *path, const char *name, size_t *bytes) {
    ts_ckpt *c = NULL;
    void *buf = NULL;
    *bytes = 0;
    CHECK_OK(ts_ckpt_open(path, NULL, NULL, &c));
    for (int k = 0; c && k < ts_ckpt_tensor_count(c); k++) {
        ts_ckpt_tensor t;
        if (ts_ckpt_tensor_info(c, k, &t) == TS_OK && !t.is_state && !strcmp(t.name, name))
            *bytes = t.bytes;
    }
    CHECK(*bytes > 0, "%s holds %s", path, name);
    if (*bytes && (buf = malloc(*bytes))) CHECK_OK(ts_ckpt_read(c, name, buf, *bytes));
    ts_ckpt_close(c);
    return buf;
}

/* Every LoRA tensor of checkpoint b equals a's, bit for bit. */
static void same_lora(const char *a, const char *b) {
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s.weight.lora_%c", MODS[i], k ? 'B' : 'A');
            size_t na, nb;
            void *x = ckpt_tensor(a, name, &na), *y = ckpt_tensor(b, name, &nb);
            CHECK(x && y && na == nb && !memcmp(x, y, na), "%s of %s equals %s's", name, b, a);
            free(x), free(y);
        }
}

static void check_config(const char *path, const char *base) {
    json_error_t err;
    json_t *o = json_load_file(path, 0, &err);
    CHECK(o != NULL, "%s parses: %s", path, err.text);
    if (!o) return;
    CHECK(!strcmp(json_string_value(json_object_get(o, "peft_type")), "LORA"), "peft_type");
    CHECK(json_is_null(json_object_get(o, "task_type")), "task_type null");
    CHECK(json_integer_value(json_object_get(o, "r")) == 8, "r 8");
    CHECK(json_is_integer(json_object_get(o, "lora_alpha")) &&
              json_integer_value(json_object_get(o, "lora_alpha")) == 16,
          "lora_alpha 16");
    CHECK(json_number_value(json_object_get(o, "lora_dropout")) == 0, "lora_dropout 0");
    CHECK(json_is_false(json_object_get(o, "use_rslora")), "use_rslora false");
    CHECK(json_is_false(json_object_get(o, "fan_in_fan_out")), "fan_in_fan_out false");
    CHECK(json_is_true(json_object_get(o, "init_lora_weights")), "init_lora_weights");
    CHECK(json_is_true(json_object_get(o, "inference_mode")), "inference_mode");
    CHECK(!strcmp(json_string_value(json_object_get(o, "bias")), "none"), "bias none");
    CHECK(json_is_null(json_object_get(o, "modules_to_save")), "modules_to_save null");
    CHECK(json_is_null(json_object_get(o, "layers_to_transform")), "layers_to_transform null");
    CHECK(json_is_string(json_object_get(o, "peft_version")), "peft_version");
    const char *b = json_string_value(json_object_get(o, "base_model_name_or_path"));
    CHECK(b && !strcmp(b, base), "base_model_name_or_path %s", b ? b : "(none)");
    json_t *tm = json_object_get(o, "target_modules");
    CHECK(json_array_size(tm) == 3, "3 target_modules");
    for (size_t i = 0; i < 3 && i < json_array_size(tm); i++)
        CHECK(!strcmp(json_string_value(json_array_get(tm, i)), MODS[i]), "target_modules[%zu]", i);
    json_decref(o);
}

/* The adapter's tensors: peft's names, the checkpoint's bytes. */
static void check_tensors(const char *st_path, const char *ckpt) {
    ts_st_file *f = NULL;
    CHECK_OK(ts_st_open(st_path, &f));
    if (!f) return;
    CHECK(ts_st_count(f) == 6, "6 tensors, got %d", ts_st_count(f));
    CHECK(ts_st_metadata(f, "format") && !strcmp(ts_st_metadata(f, "format"), "pt"), "format: pt");
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            char key[96], name[64];
            snprintf(key, sizeof key, "base_model.model.%s.lora_%c.weight", MODS[i], k ? 'B' : 'A');
            snprintf(name, sizeof name, "%s.weight.lora_%c", MODS[i], k ? 'B' : 'A');
            ts_st_tensor t;
            size_t n;
            CHECK_OK(ts_st_find(f, key, &t));
            void *x = ckpt_tensor(ckpt, name, &n);
            CHECK(x && t.bytes == n && !memcmp(t.data, x, n), "%s is %s bit for bit", key, name);
            CHECK(t.rank == 2 && t.dims[k ? 1 : 0] == 8, "%s has r = 8 in its place", key);
            free(x);
        }
    ts_st_close(f);
}

/* Train the base and a LoRA run (extra: more --set); export its adapter. */
static void lora_run(const char *name, const char *extra) {
    e2e_result r = e2e_runf("train " MODEL LORA "%s --steps 30 --set train.lr=1e-2 --set "
                            "ckpt.every=30 --set peft.base=%s --out %s",
                            extra, e2e_path("base"), e2e_path(name));
    CHECK(r.rc == 0, "LoRA run %s: exit %d\n%s", name, r.rc, r.err);
    e2e_done(&r);
}

/* The merged model's step-1 loss is the LoRA model's (fp32 rounding). */
static void check_merge(const char *run, const char *extra, double lora_loss) {
    char st[256], out[256];
    snprintf(st, sizeof st, "%s", e2e_path(run));
    strcat(st, ".safetensors");
    snprintf(out, sizeof out, "%s", e2e_path(run));
    strcat(out, "-merged");
    e2e_result r = e2e_runf("export %s --merge --safetensors %s", e2e_path(run), st);
    CHECK(r.rc == 0, "merge %s: exit %d\n%s", run, r.rc, r.err);
    e2e_done(&r);
    ts_st_file *f = NULL;
    CHECK_OK(ts_st_open(st, &f));
    CHECK(f && ts_st_count(f) == 10, "10 tensors (no LoRA) in %s", st);
    for (int i = 0; f && i < ts_st_count(f); i++)
        CHECK(!strstr(ts_st_name(f, i), "lora"), "no LoRA tensor: %s", ts_st_name(f, i));
    ts_st_close(f);
    r = e2e_runf("train " MODEL " --steps 1 --set train.lr=0 --set peft.base=%s --out %s", st, out);
    CHECK(r.rc == 0, "merged run: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    const double m = step1_loss(out);
    CHECK(fabs(m - lora_loss) <= 1e-5 * fabs(lora_loss), "%s%s: merged %.9g vs LoRA %.9g", run,
          extra, m, lora_loss);
}

static void test_roundtrip(void) {
    e2e_result r =
        e2e_runf("train " MODEL " --steps 20 --set ckpt.every=20 --out %s", e2e_path("base"));
    CHECK(r.rc == 0, "base run: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    lora_run("lora", "");
    char base[256], lora[256], ad[256];
    snprintf(base, sizeof base, "%s", e2e_path("base"));
    snprintf(lora, sizeof lora, "%s", e2e_path("lora"));
    snprintf(ad, sizeof ad, "%s", e2e_path("adapter"));
    r = e2e_runf("export %s --peft %s", lora, ad);
    CHECK(r.rc == 0 && strstr(r.out, "adapter_config.json"), "export --peft: exit %d\n%s%s", r.rc,
          r.out, r.err);
    e2e_done(&r);
    check_config(e2e_path("adapter/adapter_config.json"), base);
    check_tensors(e2e_path("adapter/adapter_model.safetensors"), lora);

    /* read back: A and B from the files, kept by lr 0 */
    r = e2e_runf("train " MODEL LORA " --steps 2 --set train.lr=0 --set ckpt.every=2 --set "
                 "peft.base=%s --set peft.load=%s --out %s",
                 base, ad, e2e_path("load"));
    CHECK(r.rc == 0 && strstr(r.out, "peft: LoRA A and B from"), "load: exit %d\n%s%s", r.rc, r.out,
          r.err);
    e2e_done(&r);
    same_lora(lora, e2e_path("load"));
    const double loaded = step1_loss(e2e_path("load"));
    r = e2e_runf("train " MODEL LORA " --steps 1 --set train.lr=0 --set peft.base=%s --out %s",
                 base, e2e_path("fresh"));
    CHECK(r.rc == 0, "fresh LoRA: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    const double fresh = step1_loss(e2e_path("fresh"));
    CHECK(loaded != fresh, "the adapter changes step 1: %.9g vs %.9g", loaded, fresh);
    check_merge("lora", "", loaded);

    /* rslora: alpha / sqrt(r) */
    lora_run("rs", " --set peft.lora.use_rslora=true");
    r = e2e_runf("export %s --peft %s", e2e_path("rs"), e2e_path("rs-adapter"));
    CHECK(r.rc == 0, "export rslora: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("train " MODEL LORA " --steps 1 --set train.lr=0 --set peft.lora.use_rslora=true "
                 "--set peft.base=%s --set peft.load=%s --out %s",
                 base, e2e_path("rs-adapter"), e2e_path("rs-load"));
    CHECK(r.rc == 0, "rslora load: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    check_merge("rs", " (rslora)", step1_loss(e2e_path("rs-load")));
}

static void test_errors(void) {
    char base[256], ad[256];
    snprintf(base, sizeof base, "%s", e2e_path("base"));
    snprintf(ad, sizeof ad, "%s", e2e_path("adapter"));
    expect_fail(
        "r differs",
        e2e_runf("train " MODEL LORA " --steps 1 --set peft.lora.r=4 --set peft.load=%s", ad),
        "adapter_config.json: r is 8, the run's peft.lora.r is 4", NULL);
    expect_fail("alpha differs",
                e2e_runf("train " MODEL LORA " --steps 1 --set peft.lora.alpha=8 --set "
                         "peft.load=%s",
                         ad),
                "lora_alpha is 16", "peft.lora.alpha is 8");
    expect_fail("fewer targets",
                e2e_runf("train " MODEL " --set 'peft.lora.targets=net\\.[03]\\.weight' --set "
                         "peft.lora.alpha=16 --steps 1 --set peft.load=%s",
                         ad),
                "target_modules names 'net.6'", "adapter_config.json");
    expect_fail("no LoRA", e2e_runf("export %s --peft %s", base, e2e_path("x")), "no LoRA tensors",
                base);
    expect_fail("missing", e2e_runf("export %s --peft %s", e2e_path("nope"), e2e_path("x")), "nope",
                NULL);
    expect_fail("usage", e2e_runf("export %s --merge", base), "--merge --safetensors", NULL);
    expect_fail("peft.load without LoRA",
                e2e_runf("train " MODEL " --steps 1 --set peft.load=%s", ad), "peft.load",
                "needs peft.lora.targets");
    /* a key of a later peft: ignored, named */
    e2e_sh("cp -r %s %s && sed -i 's/\"peft_type\"/\"new_peft_key\": 3, \"peft_type\"/' "
           "%s/adapter_config.json",
           ad, e2e_path("later"), e2e_path("later"));
    e2e_result r = e2e_runf("train " MODEL LORA " --steps 1 --set peft.base=%s --set peft.load=%s",
                            base, e2e_path("later"));
    CHECK(r.rc == 0, "unknown key: exit %d\n%s", r.rc, r.err);
    CHECK((strstr(r.out, "warning") && strstr(r.out, "new_peft_key")) ||
              (strstr(r.err, "warning") && strstr(r.err, "new_peft_key")),
          "the unknown key is named: %s%s", r.out, r.err);
    e2e_done(&r);
}

/* An adapter whose safetensors lacks net.6's B, or has it mis-shaped. */
static void test_bad_tensors(void) {
    char ad[256], cut[256], st[300];
    snprintf(ad, sizeof ad, "%s", e2e_path("adapter"));
    for (int shaped = 0; shaped < 2; shaped++) {
        snprintf(cut, sizeof cut, "%s", e2e_path(shaped ? "misshaped" : "cut"));
        e2e_sh("mkdir -p %s && cp %s/adapter_config.json %s/", cut, ad, cut);
        snprintf(st, sizeof st, "%s/adapter_model.safetensors", ad);
        ts_st_file *f = NULL;
        ts_st_writer *w = NULL;
        CHECK_OK(ts_st_open(st, &f));
        CHECK_OK(ts_st_writer_new(&w));
        for (int i = 0; f && w && i < ts_st_count(f); i++) {
            ts_st_tensor t;
            CHECK_OK(ts_st_get(f, i, &t));
            if (strcmp(t.name, "base_model.model.net.6.lora_B.weight")) {
                CHECK_OK(ts_st_writer_add(w, t.name, t.dtype, t.rank, t.dims, t.data));
            } else if (shaped) {
                int64_t dims[2] = {t.dims[1], t.dims[0]}; /* [r, out] */
                CHECK_OK(ts_st_writer_add(w, t.name, t.dtype, 2, dims, t.data));
            }
        }
        snprintf(st, sizeof st, "%s/adapter_model.safetensors", cut);
        if (w) CHECK_OK(ts_st_writer_save(w, st));
        ts_st_writer_free(w);
        ts_st_close(f);
        expect_fail(shaped ? "mis-shaped tensor" : "missing tensor",
                    e2e_runf("train " MODEL LORA " --steps 1 --set peft.load=%s", cut),
                    "'base_model.model.net.6.lora_B.weight'",
                    shaped ? "is f32 of rank 2 [8, 1]" : "has no");
    }
}

int main(void) {
    if (!e2e_setup("peft_files", dir, sizeof dir)) return check_summary("e2e/peft_files");
    test_roundtrip();
    test_errors();
    test_bad_tensors();
    e2e_cleanup(dir);
    return check_summary("e2e/peft_files");
}
