/* LoRA against Hugging Face peft itself (fixtures made by
 * tests/parity/gen_peft_fixtures.py with peft 0.21.2 and torch 2.15; see
 * tests/parity/README.md), for a small MLP and a small GPT (LoRA r=4,
 * alpha 8 on attention and MLP):
 *
 * - given peft's A and B=0, tessel's loss is the base model's bit for bit
 *   and peft's within fp32 rounding; given peft's A and a non-zero B, the
 *   loss (1e-5 relative) and the gradients of every A and B (1e-4 of the
 *   largest) after one forward/backward agree with peft's;
 * - peft's own adapter_model.safetensors holds exactly tessel's LoRA
 *   tensors under the keys ts_peft_hf_key names;
 * - through the CLI: a run with peft.base (the fixture's base) and
 *   peft.load (peft's own adapter directory, its adapter_config.json
 *   accepted) and lr 0, exported with --merge, equals merge_and_unload()
 *   (1e-6 of max(1, |w|)); exported with --peft, its tensors equal peft's
 *   file bit for bit and its adapter_config.json has every key peft wrote. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ckpt/safetensors.h"
#include "e2e.h"
#include "plan/plan.h"
#include "tessel/peft.h"

static char dir[64];

typedef struct fixture {
    const char *name, *targets, *in, *target, *cli;
} fixture;

static const fixture FIX[2] = {
    {"mlp", "net\\.[036]\\.weight", "x", "y",
     "examples/w1.yaml --set model.window=8 --set model.features=8 --set model.hidden=16 "
     "--set model.batch=8 --set 'peft.lora.targets=net\\.[036]\\.weight'"},
    {"gpt", "c_attn|c_proj|fc", "tokens", "targets",
     "examples/tiny_gpt.yaml --set model.batch=2 --set model.ctx=8 --set model.vocab=32 --set "
     "model.d_model=16 --set model.n_layers=1 --set model.n_heads=2 --set train.clip_grad_norm=0 "
     "--set 'peft.lora.targets=c_attn|c_proj|fc'"},
};

static ts_status build(int k, ts_graph *g, ts_model *m) {
    if (k == 0) {
        ts_mlp_config c = {8, 8, 8, 0, 16, 2, 1, 1, 0};
        return ts_build_mlp(g, &c, m);
    }
    ts_gpt_config c = {2, 8, 32, 16, 1, 2, 0.0};
    return ts_build_gpt(g, &c, m);
}

static double max_abs(const float *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* Every "param.*" of the fixture into the plan; with zero_b the LoRA B
 * tensors are written as zeros. */
static void load_params(ts_plan *p, ts_st_file *f, int zero_b, int lora) {
    for (int i = 0; i < ts_st_count(f); i++) {
        const char *key = ts_st_name(f, i);
        if (strncmp(key, "param.", 6)) continue;
        const int kind = ts_peft_param_kind(key + 6);
        if (kind && !lora) continue;
        ts_st_tensor t;
        CHECK_OK(ts_st_find(f, key, &t));
        void *buf = calloc(1, t.bytes);
        if (!buf) continue;
        size_t n = strlen(key);
        if (!(zero_b && !strcmp(key + n - 7, ".lora_B"))) memcpy(buf, t.data, t.bytes);
        CHECK(ts_plan_write_param(p, key + 6, buf, t.bytes) == TS_OK, "write %s: %s", key + 6,
              ts_last_error());
        free(buf);
    }
}

static void feed(ts_plan *p, ts_st_file *f, const fixture *fx) {
    ts_st_tensor x, y;
    CHECK_OK(ts_st_find(f, "input.x", &x));
    CHECK_OK(ts_st_find(f, "target.y", &y));
    CHECK_OK(ts_plan_set_input(p, fx->in, x.data, x.bytes));
    CHECK_OK(ts_plan_set_input(p, fx->target, y.data, y.bytes));
}

static float scalar(ts_st_file *f, const char *key) {
    ts_st_tensor t;
    float v = NAN;
    if (ts_st_find(f, key, &t) == TS_OK && t.bytes == 4) memcpy(&v, t.data, 4);
    return v;
}

/* Loss and gradients of the plan against the fixture; peft's own tensors. */
static void check_model(int k) {
    const fixture *fx = &FIX[k];
    char path[256];
    snprintf(path, sizeof path, "tests/parity/fixtures/peft/%s.safetensors", fx->name);
    ts_st_file *f = NULL;
    CHECK_OK(ts_st_open(path, &f));
    if (!f) return;
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(build(k, g, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options o = ts_compile_options_default();
    ts_plan *base = NULL, *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &o, &base));
    o.peft = (ts_peft_options){.targets = fx->targets, .r = 4, .alpha = 8};
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    if (!base || !p) goto out;
    /* B = 0: the base model, and peft's loss at its init */
    load_params(base, f, 0, 0), feed(base, f, fx);
    load_params(p, f, 1, 1), feed(p, f, fx);
    CHECK_OK(ts_plan_step(base));
    CHECK_OK(ts_plan_step(p));
    const double lb = ts_plan_loss(base), l0 = ts_plan_loss(p), ref0 = scalar(f, "loss_init");
    CHECK(lb == l0, "%s: LoRA with B = 0 computes the base loss bit for bit (%.9g vs %.9g)",
          fx->name, l0, lb);
    CHECK(fabs(l0 - ref0) <= 1e-5 * fabs(ref0), "%s: loss at peft's init %.9g vs peft %.9g",
          fx->name, l0, ref0);
    /* peft's non-zero B: loss and every LoRA gradient */
    load_params(p, f, 0, 1);
    CHECK_OK(ts_plan_step(p));
    const double l1 = ts_plan_loss(p), ref1 = scalar(f, "loss");
    CHECK(fabs(l1 - ref1) <= 1e-5 * fabs(ref1), "%s: loss %.9g vs peft %.9g", fx->name, l1, ref1);
    CHECK(fabs(l1 - l0) > 1e-4 * fabs(l0), "%s: B moves the loss (%g -> %g)", fx->name, l0, l1);
    printf("%s: loss %.9g (peft %.9g), at init %.9g (peft %.9g)\n", fx->name, l1, ref1, l0, ref0);
    snprintf(path, sizeof path, "tests/parity/fixtures/peft/%s/adapter_model.safetensors",
             fx->name);
    ts_st_file *hf = NULL;
    CHECK_OK(ts_st_open(path, &hf));
    int n_lora = 0;
    double worst = 0;
    for (int i = 0; i < ts_st_count(f) && hf; i++) {
        const char *key = ts_st_name(f, i);
        if (strncmp(key, "grad.", 5)) continue;
        const char *name = key + 5;
        n_lora++;
        ts_st_tensor ref, mine;
        CHECK_OK(ts_st_find(f, key, &ref));
        float *got = malloc(ref.bytes);
        if (!got) continue;
        char gk[600];
        snprintf(gk, sizeof gk, "grad:%s", name);
        CHECK_OK(ts_plan_read(p, gk, got, ref.bytes));
        const int64_t n = (int64_t)(ref.bytes / 4);
        const double d = max_diff(got, ref.data, n), tol = 1e-4 * max_abs(ref.data, n);
        CHECK(d <= tol && max_abs(ref.data, n) > 0, "%s: %s max |diff| %.3g, tolerance %.3g",
              fx->name, key, d, tol);
        worst = fmax(worst, tol > 0 ? d / tol : 0);
        free(got);
        /* peft's file holds this tensor under ts_peft_hf_key's name */
        char hk[600], pk[600];
        snprintf(pk, sizeof pk, "param.%s", name);
        CHECK(ts_peft_hf_key(name, hk, sizeof hk), "%s has a peft key", name);
        CHECK_OK(ts_st_find(f, pk, &ref));
        CHECK(ts_st_find(hf, hk, &mine) == TS_OK && mine.bytes == ref.bytes && mine.rank == 2 &&
                  mine.dims[0] == ref.dims[0] && mine.dims[1] == ref.dims[1] &&
                  !memcmp(mine.data, ref.data, ref.bytes),
              "%s: peft's file holds %s as '%s' with its shape and bits", fx->name, name, hk);
    }
    CHECK(hf && n_lora > 0 && ts_st_count(hf) == n_lora,
          "%s: peft's file holds exactly the %d LoRA tensors (%d)", fx->name, n_lora,
          hf ? ts_st_count(hf) : -1);
    printf("%s: %d LoRA gradients within tolerance (worst %.3g of it)\n", fx->name, n_lora, worst);
    ts_st_close(hf);
out:
    ts_plan_free(base), ts_plan_free(p);
    ts_graph_free(g);
    ts_st_close(f);
}

/* The fixture's base parameters as a plain safetensors file (peft.base). */
static void write_base(ts_st_file *f, const char *path) {
    ts_st_writer *w = NULL;
    CHECK_OK(ts_st_writer_new(&w));
    for (int i = 0; i < ts_st_count(f) && w; i++) {
        const char *key = ts_st_name(f, i);
        if (strncmp(key, "param.", 6) || ts_peft_param_kind(key + 6)) continue;
        ts_st_tensor t;
        CHECK_OK(ts_st_find(f, key, &t));
        CHECK_OK(ts_st_writer_add(w, key + 6, t.dtype, t.rank, t.dims, t.data));
    }
    CHECK_OK(ts_st_writer_save(w, path));
    ts_st_writer_free(w);
}

static void check_files(int k) {
    const fixture *fx = &FIX[k];
    char path[400], hfdir[256], base[256], run[256], merged[256], exp[256];
    snprintf(path, sizeof path, "tests/parity/fixtures/peft/%s.safetensors", fx->name);
    snprintf(hfdir, sizeof hfdir, "tests/parity/fixtures/peft/%s", fx->name);
    ts_st_file *f = NULL;
    CHECK_OK(ts_st_open(path, &f));
    if (!f) return;
    snprintf(base, sizeof base, "%s/%s-base.safetensors", dir, fx->name);
    snprintf(run, sizeof run, "%s/%s-run", dir, fx->name);
    snprintf(merged, sizeof merged, "%s/%s-merged.safetensors", dir, fx->name);
    snprintf(exp, sizeof exp, "%s/%s-exported", dir, fx->name);
    write_base(f, base);
    e2e_result r = e2e_runf("train %s --set peft.lora.r=4 --set peft.lora.alpha=8 --set "
                            "peft.base=%s --set peft.load=%s --set train.lr=0 --steps 1 --set "
                            "ckpt.every=1 --out %s",
                            fx->cli, base, hfdir, run);
    CHECK(r.rc == 0, "%s: train with peft's adapter: exit %d\n%s", fx->name, r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("export %s --merge --safetensors %s", run, merged);
    CHECK(r.rc == 0, "%s: --merge: exit %d\n%s", fx->name, r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("export %s --peft %s", run, exp);
    CHECK(r.rc == 0, "%s: --peft: exit %d\n%s", fx->name, r.rc, r.err);
    e2e_done(&r);
    /* --merge against merge_and_unload() */
    ts_st_file *mf = NULL;
    CHECK_OK(ts_st_open(merged, &mf));
    int n = 0;
    double worst = 0;
    for (int i = 0; i < ts_st_count(f) && mf; i++) {
        const char *key = ts_st_name(f, i);
        if (strncmp(key, "merged.", 7)) continue;
        ts_st_tensor ref, got;
        CHECK_OK(ts_st_find(f, key, &ref));
        if (ts_st_find(mf, key + 7, &got) != TS_OK || got.bytes != ref.bytes) {
            CHECK(0, "%s: merged file lacks %s", fx->name, key + 7);
            continue;
        }
        const int64_t cnt = (int64_t)(ref.bytes / 4);
        const double d = max_diff(got.data, ref.data, cnt),
                     tol = 1e-6 * fmax(1.0, max_abs(ref.data, cnt));
        CHECK(d <= tol, "%s: merged %s max |diff| %.3g vs merge_and_unload, tolerance %.3g",
              fx->name, key + 7, d, tol);
        worst = fmax(worst, d);
        n++;
    }
    CHECK(mf && n > 0 && n == ts_st_count(mf), "%s: %d merged tensors, file has %d", fx->name, n,
          mf ? ts_st_count(mf) : -1);
    printf("%s: --merge equals merge_and_unload() on %d tensors (max |diff| %.3g)\n", fx->name, n,
           worst);
    ts_st_close(mf);
    /* --peft: peft's tensors bit for bit; every key of peft's config */
    ts_st_file *hf = NULL, *tf = NULL;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", hfdir);
    CHECK_OK(ts_st_open(path, &hf));
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", exp);
    CHECK_OK(ts_st_open(path, &tf));
    for (int i = 0; hf && tf && i < ts_st_count(hf); i++) {
        ts_st_tensor a, b;
        CHECK_OK(ts_st_find(hf, ts_st_name(hf, i), &a));
        CHECK(ts_st_find(tf, ts_st_name(hf, i), &b) == TS_OK && a.bytes == b.bytes &&
                  !memcmp(a.data, b.data, a.bytes),
              "%s: exported '%s' equals peft's bit for bit", fx->name, ts_st_name(hf, i));
    }
    CHECK(hf && tf && ts_st_count(hf) == ts_st_count(tf), "%s: same tensor count", fx->name);
    ts_st_close(hf), ts_st_close(tf);
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", hfdir);
    json_t *real = json_load_file(cfg, 0, NULL);
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", exp);
    json_t *ours = json_load_file(cfg, 0, NULL);
    CHECK(real && ours, "%s: both adapter_config.json parse", fx->name);
    const char *key;
    json_t *val;
    int keys = 0;
    if (real && ours) json_object_foreach(real, key, val) {
            keys++;
            CHECK(json_object_get(ours, key) != NULL, "%s: tessel's adapter_config.json lacks '%s'",
                  fx->name, key);
        }
    CHECK(keys >= 40, "%s: peft wrote %d keys", fx->name, keys);
    if (real && ours) {
        const char *same[] = {"peft_type",      "r",          "lora_alpha",  "bias",
                              "fan_in_fan_out", "use_rslora", "peft_version"};
        for (int i = 0; i < 7; i++)
            CHECK(json_equal(json_object_get(real, same[i]), json_object_get(ours, same[i])),
                  "%s: '%s' as peft writes it", fx->name, same[i]);
    }
    json_decref(real), json_decref(ours);
    ts_st_close(f);
}

int main(void) {
    check_model(0);
    check_model(1);
    if (!e2e_setup("parity_peft", dir, sizeof dir)) return check_summary("parity peft");
    check_files(0);
    check_files(1);
    e2e_cleanup(dir);
    return check_summary("parity peft");
}
