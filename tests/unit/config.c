/* The YAML config: defaults, presets, overrides, every kind of bad input
 * (each a clear error, never a crash), the resolved dump, building the
 * model, and docs/config.md against the key table. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "frontend/config.h"

/* Load `text` (as file "t.yaml"), apply the overrides, finish. */
static ts_status load(ts_config *c, const char *text, int n_sets, const char **sets) {
    ts_config_init(c);
    ts_status s = ts_config_load_string(c, text, strlen(text), "t.yaml");
    for (int i = 0; s == TS_OK && i < n_sets; i++) s = ts_config_set(c, sets[i]);
    if (s == TS_OK) s = ts_config_finish(c);
    return s;
}

/* Expect failure with status `want` and a message containing every one of
 * the NULL-terminated fragments. */
static void expect_error(const char *what, ts_status got, ts_status want, ...) {
    CHECK(got == want, "%s: status %s, expected %s (%s)", what, ts_status_name(got),
          ts_status_name(want), ts_last_error());
    va_list ap;
    va_start(ap, want);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        CHECK(strstr(ts_last_error(), frag), "%s: message '%s' lacks '%s'", what, ts_last_error(),
              frag);
    va_end(ap);
}

static void bad(const char *what, const char *text, const char *set, ts_status want,
                const char *frag1, const char *frag2) {
    ts_config c;
    const char *sets[1] = {set};
    expect_error(what, load(&c, text, set ? 1 : 0, sets), want, frag1, frag2, (char *)NULL);
}

static void test_defaults_and_presets(void) {
    ts_config c;
    CHECK_OK(load(&c, "model:\n  name: gpt\n", 0, NULL));
    ts_gpt_config w3 = ts_gpt_w3(), g = ts_config_gpt(&c);
    CHECK(!memcmp(&g, &w3, sizeof g), "gpt without a preset starts from w3");
    CHECK(c.model.preset == TS_CFG_W3, "preset w3 implied");
    CHECK(c.train.optimizer == TS_CFG_ADAMW, "adamw by default");
    CHECK_NEAR(c.train.lr, 1e-3, 0);
    CHECK_NEAR(c.train.beta1, 0.9, 0);
    CHECK_NEAR(c.train.beta2, 0.999, 0);
    CHECK_NEAR(c.train.eps, 1e-8, 0);
    CHECK_NEAR(c.train.weight_decay, 0.01, 0);
    CHECK(c.train.steps == 100 && c.train.total_steps == 100, "total_steps follows steps");
    CHECK(c.train.schedule == TS_CFG_CONSTANT && c.train.seed == 0 && c.train.threads == 0,
          "train defaults");
    CHECK(!c.compile.debug_nan && !c.compile.no_simplify && !c.compile.naive_schedule &&
              !c.compile.no_inplace && c.compile.discard_outputs,
          "compile defaults (the training plan does not keep the logits)");

    /* The preset fills what the file leaves, wherever the preset line is. */
    CHECK_OK(load(&c, "model:\n  batch: 3\n  preset: w1\n  hidden: 16\n", 0, NULL));
    ts_mlp_config m = ts_config_mlp(&c), w1 = ts_mlp_w1();
    CHECK(c.model.name == TS_CFG_MLP, "w1 implies mlp");
    CHECK(m.batch == 3 && m.hidden == 16, "file keys win over the preset");
    CHECK(m.window == w1.window && m.features == w1.features && m.n_hidden == w1.n_hidden &&
              m.out_dim == w1.out_dim && m.layer_norm == w1.layer_norm,
          "other keys from the preset");
    CHECK(m.in_dim == w1.window * w1.features, "in_dim derived: %lld", (long long)m.in_dim);

    CHECK_OK(load(&c, "model: {preset: gpt2-124m}\n", 0, NULL));
    ts_gpt_config g2 = ts_gpt2_124m();
    g = ts_config_gpt(&c);
    CHECK(!memcmp(&g, &g2, sizeof g), "gpt2-124m preset");

    /* Flat MLP input. */
    CHECK_OK(load(&c, "model: {name: mlp, window: 0, in_dim: 10, hidden: 4}\n", 0, NULL));
    CHECK(c.model.in_dim == 10 && c.model.window == 0, "flat mlp");

    /* weight_decay follows the optimizer unless set; sgd keys accepted. */
    CHECK_OK(load(&c,
                  "model: {name: mlp}\ntrain:\n  optimizer: SGD\n  momentum: 0.9\n"
                  "  nesterov: yes\n",
                  0, NULL));
    CHECK(c.train.optimizer == TS_CFG_SGD && c.train.nesterov == 1, "sgd, nesterov (any case)");
    CHECK_NEAR(c.train.weight_decay, 0, 0);
    CHECK_NEAR(c.train.momentum, 0.9, 0);
    CHECK_OK(load(&c, "model: {name: mlp}\ntrain: {optimizer: adam}\n", 0, NULL));
    CHECK_NEAR(c.train.weight_decay, 0, 0);
    CHECK_OK(load(&c, "model: {name: mlp}\ntrain: {steps: 1e3, total_steps: 2000}\n", 0, NULL));
    CHECK(c.train.steps == 1000 && c.train.total_steps == 2000, "1e3 as an integer");

    /* An empty section and comments are fine. */
    CHECK_OK(load(&c, "# comment\nmodel: {name: mlp}\ncompile:\n", 0, NULL));
}

static void test_overrides(void) {
    ts_config c;
    const char *sets[] = {"train.lr=3e-4",          "model.n_layers=2",        " train.seed = 7 ",
                          "compile.debug_nan=true", "train.schedule='cosine'", "train.lr=5e-4"};
    CHECK_OK(load(&c, "model:\n  preset: w3\n  n_layers: 6\ntrain:\n  lr: 1\n", 6, sets));
    CHECK_NEAR(c.train.lr, 5e-4, 0);
    CHECK(c.model.n_layers == 2, "override wins over the file");
    CHECK(c.train.seed == 7 && c.compile.debug_nan == 1, "spaces around = are trimmed");
    CHECK(c.train.schedule == TS_CFG_COSINE, "quotes around the value are removed");
    CHECK(c.set[ts_config_key_find("train.lr")] == 2, "origin recorded as --set");

    /* An override can pick the model too, before finish. */
    const char *name[] = {"model.name=mlp", "model.hidden=8"};
    CHECK_OK(load(&c, "", 2, name));
    CHECK(c.model.name == TS_CFG_MLP && c.model.hidden == 8, "model from overrides only");

    bad("no =", "model: {name: mlp}\n", "train.lr", TS_ERR_INVALID, "expected key=value",
        "train.lr");
    bad("unknown override", "model: {name: mlp}\n", "train.lrr=3", TS_ERR_INVALID,
        "--set: unknown key 'train.lrr'", "did you mean 'train.lr'?");
    bad("override type", "model: {name: mlp}\n", "train.lr=fast", TS_ERR_INVALID,
        "train.lr: expected a number, got 'fast'", "--set");
    bad("override section", "model: {name: mlp}\n", "train=3", TS_ERR_INVALID, "is a section",
        NULL);
    bad("override of the other model", "model: {name: mlp}\n", "model.n_heads=2", TS_ERR_INVALID,
        "--set: model.n_heads is not a key of mlp models", NULL);

    ts_config_init(&c);
    CHECK_OK(ts_config_set(&c, "model.preset=w1"));
    CHECK_OK(ts_config_finish(&c));
    CHECK(ts_config_set(&c, "train.lr=1") == TS_ERR_INVALID, "set after finish is refused");
}

static void test_unknown_keys(void) {
    bad("misspelt key", "model:\n  preset: w1\ntrain:\n  lrr: 3\n", NULL, TS_ERR_INVALID,
        "t.yaml:4:3: unknown key 'train.lrr'", "(did you mean 'train.lr'?)");
    bad("misspelt section", "trian:\n  lr: 3\n", NULL, TS_ERR_INVALID, "t.yaml:1:1",
        "did you mean 'train'?");
    bad("key in the wrong section", "model:\n  name: mlp\n  lr: 3\n", NULL, TS_ERR_INVALID,
        "unknown key 'model.lr'", "did you mean 'train.lr'?");
    bad("long form of a key", "model:\n  name: mlp\n  batch_size: 3\n", NULL, TS_ERR_INVALID,
        "t.yaml:3:3", "did you mean 'model.batch'?");
    bad("no close key", "train:\n  learning_rate_of_everything: 3\n", NULL, TS_ERR_INVALID,
        "unknown key", "valid here: optimizer, lr,");
    bad("unknown section", "dataset:\n  path: x\n", NULL, TS_ERR_INVALID, "unknown key 'dataset'",
        "sections: model, train, compile");
    bad("too deep", "train:\n  lr:\n    value: 3\n", NULL, TS_ERR_INVALID,
        "train.lr: expected a number, got a mapping", "t.yaml:3:5");
    bad("key of the other model", "model:\n  name: gpt\n  window: 3\n", NULL, TS_ERR_INVALID,
        "t.yaml:3:3: model.window is not a key of gpt models", NULL);
    bad("key of another optimizer", "model: {name: mlp}\ntrain:\n  momentum: 0.9\n", NULL,
        TS_ERR_INVALID, "t.yaml:3:3: train.momentum is not used by adamw", "sgd");
    bad("duplicate key", "model:\n  name: mlp\n  batch: 3\n  batch: 4\n", NULL, TS_ERR_INVALID,
        "t.yaml:4:3: duplicate key 'model.batch'", "line 3");
}

static void test_type_errors(void) {
    bad("number", "model: {name: mlp}\ntrain:\n  lr: fast\n", NULL, TS_ERR_INVALID,
        "t.yaml:3:7: train.lr: expected a number, got 'fast'", NULL);
    bad("integer", "model:\n  name: mlp\n  batch: 2.5\n", NULL, TS_ERR_INVALID,
        "model.batch: expected an integer, got '2.5'", "t.yaml:3:10");
    bad("range", "model:\n  name: mlp\n  batch: 0\n", NULL, TS_ERR_INVALID,
        "model.batch: must be in [1, 1e9], got '0'", NULL);
    bad("huge integer", "model:\n  name: mlp\n  hidden: 1e30\n", NULL, TS_ERR_INVALID,
        "must be in [1, 1e9]", NULL);
    bad("open range", "model: {name: mlp}\ntrain: {beta2: 1}\n", NULL, TS_ERR_INVALID,
        "train.beta2: must be in [0, 1), got '1'", NULL);
    bad("bool", "model: {name: mlp}\ncompile: {debug_nan: maybe}\n", NULL, TS_ERR_INVALID,
        "compile.debug_nan: expected true or false, got 'maybe'", NULL);
    bad("enum", "model: {name: mlp}\ntrain: {optimizer: adamx}\n", NULL, TS_ERR_INVALID,
        "expected one of sgd, adam, adamw, got 'adamx'", "did you mean 'adamw'?");
    bad("empty value", "model:\n  name: mlp\n  batch:\n", NULL, TS_ERR_INVALID,
        "model.batch: expected an integer, got nothing", NULL);
    /* model.name's choices are the registry's models, in its order (the
     * built-in ones first), so a model added later joins the list. */
    char list_msg[512];
    size_t lk =
        (size_t)snprintf(list_msg, sizeof list_msg,
                         "model.name: expected one of mlp, gpt, cnn, gru, lstm, unet3d, gcn");
    for (int m = TS_CFG_GCN + 1; m < ts_model_count(); m++)
        lk += (size_t)snprintf(list_msg + lk, sizeof list_msg - lk, ", %s", ts_model_at(m)->name);
    snprintf(list_msg + lk, sizeof list_msg - lk, ", got a list");
    bad("list value", "model:\n  name: [mlp, gpt]\n", NULL, TS_ERR_INVALID, list_msg, NULL);
    bad("seed sign", "model: {name: mlp}\ntrain: {seed: -1}\n", NULL, TS_ERR_INVALID, "train.seed",
        NULL);
    bad("nan", "model: {name: mlp}\ntrain: {lr: nan}\n", NULL, TS_ERR_INVALID,
        "expected a number, got 'nan'", NULL);
    bad("section as value", "model: 3\n", NULL, TS_ERR_FORMAT,
        "model: expected a mapping of keys, got a value", NULL);
    bad("root is a list", "- a\n- b\n", NULL, TS_ERR_FORMAT, "expected a mapping of sections",
        "got a list");
    bad("root is a value", "hello\n", NULL, TS_ERR_FORMAT, "expected a mapping of sections", NULL);
    bad("key is a mapping", "? {a: 1}\n: 3\n", NULL, TS_ERR_FORMAT, "a key must be a plain name",
        NULL);
}

static void test_cross_checks(void) {
    bad("no model", "", NULL, TS_ERR_INVALID, "no model: set model.name", NULL);
    bad("preset of the other family", "model:\n  name: mlp\n  preset: w3\n", NULL, TS_ERR_INVALID,
        "t.yaml:3:3: model.preset w3 is a gpt preset, but model.name is mlp", NULL);
    bad("heads", "model:\n  name: gpt\n  d_model: 100\n  n_heads: 3\n", NULL, TS_ERR_INVALID,
        "t.yaml:4:3: model.d_model 100 is not divisible by model.n_heads 3", NULL);
    bad("in_dim", "model:\n  name: mlp\n  in_dim: 12\n", NULL, TS_ERR_INVALID,
        "model.in_dim 12 does not match window * features = 2048", "window: 0");
    bad("flat without in_dim", "model:\n  name: mlp\n  window: 0\n", NULL, TS_ERR_INVALID,
        "t.yaml:3:3: model.window is 0, so set model.in_dim", NULL);
    bad("nesterov", "model: {name: mlp}\ntrain: {optimizer: sgd, nesterov: true}\n", NULL,
        TS_ERR_INVALID, "train.nesterov needs train.momentum > 0", NULL);
    bad("too large", "model: {name: gpt, batch: 1e9, ctx: 1e9}\n", NULL, TS_ERR_INVALID,
        "model too large", NULL);
}

static void test_files(void) {
    ts_config c;
    ts_config_init(&c);
    expect_error("missing file", ts_config_load_file(&c, "no/such/config.yaml"), TS_ERR_NOT_FOUND,
                 "cannot open config 'no/such/config.yaml'", (char *)NULL);
    expect_error("directory", ts_config_load_file(&c, "docs"), TS_ERR_IO, "is a directory",
                 (char *)NULL);
    bad("malformed YAML", "model:\n  preset: [w1\ntrain: {}\n", NULL, TS_ERR_FORMAT,
        "t.yaml:", "malformed YAML");
    bad("bad indentation", "model:\n  name: mlp\n batch: 3\n", NULL, TS_ERR_FORMAT,
        "t.yaml:3:", "malformed YAML");
    bad("tab", "model:\n\tname: mlp\n", NULL, TS_ERR_FORMAT, "t.yaml:2:", "malformed YAML");
    bad("invalid UTF-8", "model:\n  name: \xc3\x28mlp\n", NULL, TS_ERR_FORMAT, "malformed YAML",
        "UTF-8");
    bad("two documents", "model: {name: mlp}\n---\ntrain: {}\n", NULL, TS_ERR_FORMAT,
        "only one YAML document", NULL);
    bad("undefined alias", "model: *a\n", NULL, TS_ERR_FORMAT, "malformed YAML", NULL);

    /* Anchors and aliases are plain YAML: allowed. */
    CHECK_OK(load(&c, "model: {name: mlp, hidden: &h 12, out_dim: *h}\n", 0, NULL));
    CHECK(c.model.out_dim == 12, "alias value");

    /* The shipped examples load. */
    const char *ex[] = {"examples/w1.yaml", "examples/w3.yaml", "examples/tiny_gpt.yaml"};
    for (int i = 0; i < 3; i++) {
        ts_config_init(&c);
        ts_status s = ts_config_load_file(&c, ex[i]);
        if (s == TS_OK) s = ts_config_finish(&c);
        CHECK(s == TS_OK, "%s: %s", ex[i], ts_last_error());
        if (i == 0) {
            ts_mlp_config m = ts_config_mlp(&c), w1 = ts_mlp_w1();
            w1.in_dim = w1.window * w1.features;
            CHECK(m.batch == w1.batch && m.window == w1.window && m.features == w1.features &&
                      m.in_dim == w1.in_dim && m.hidden == w1.hidden && m.n_hidden == w1.n_hidden &&
                      m.out_dim == w1.out_dim && m.layer_norm == w1.layer_norm &&
                      m.classes == w1.classes,
                  "w1.yaml is the W1 shape"); /* field by field: padding is unspecified */
        } else if (i == 1) {
            ts_gpt_config g = ts_config_gpt(&c), w3 = ts_gpt_w3();
            CHECK(!memcmp(&g, &w3, sizeof g), "w3.yaml is the W3 shape");
            CHECK_NEAR(c.train.lr, 3e-4, 0);
            CHECK_NEAR(c.train.weight_decay, 0.1, 0);
        }
    }
}

/* Truncations and byte flips of a valid file: every one gives TS_OK or a
 * message, none crashes (the sanitizer build checks the memory side). */
static void test_mangled(void) {
    const char *good = "model:\n  preset: w3\n  n_layers: 2  # two\ntrain:\n  lr: 3.0e-4\n"
                       "  optimizer: adamw\ncompile: {debug_nan: true}\n";
    size_t n = strlen(good);
    char buf[256];
    int failures_with_message = 0, failures = 0;
    uint64_t r = 12345;
    for (size_t cut = 0; cut <= n; cut++) {
        for (int flip = 0; flip < 6; flip++) {
            memcpy(buf, good, cut);
            if (flip && cut) {
                r = r * 6364136223846793005ULL + 1442695040888963407ULL;
                buf[(r >> 33) % cut] = (char)(" :-[{}&*#\"'\t\n\x80z9"[(r >> 20) % 16]);
            }
            ts_config c;
            ts_config_init(&c);
            ts_status s = ts_config_load_string(&c, buf, cut, "m.yaml");
            if (s == TS_OK) s = ts_config_finish(&c);
            if (s != TS_OK) {
                failures++;
                failures_with_message += strlen(ts_last_error()) > 8;
            }
        }
    }
    CHECK(failures > 0 && failures == failures_with_message, "%d of %d failures had a message",
          failures_with_message, failures);
}

static void test_write_roundtrip(void) {
    const char *texts[] = {
        "model: {preset: w1, hidden: 17}\ntrain: {lr: 0.1, optimizer: sgd, momentum: 0.5, "
        "seed: 18446744073709551615}\n",
        "model: {name: gpt, dropout: 0.1}\ntrain: {schedule: cosine, warmup_steps: 3, min_lr: "
        "1.1e-7, clip_grad_norm: 0.3}\ncompile: {no_inplace: true}\n",
        "model: {name: mlp, window: 0, in_dim: 5}\ntrain: {optimizer: adam, beta1: 0.1}\n",
    };
    for (int i = 0; i < 3; i++) {
        ts_config a, b;
        CHECK_OK(load(&a, texts[i], 0, NULL));
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        CHECK(f != NULL, "open_memstream");
        if (!f) return;
        CHECK_OK(ts_config_write(&a, f));
        fclose(f);
        CHECK_OK(load(&b, text, 0, NULL));
        CHECK(!memcmp(&a.model, &b.model, sizeof a.model) &&
                  !memcmp(&a.train, &b.train, sizeof a.train) &&
                  !memcmp(&a.compile, &b.compile, sizeof a.compile),
              "config %d reads back the same:\n%s", i, text);
        free(text);
    }
}

static void test_build(void) {
    ts_config c;
    const char *sets[] = {"model.batch=4",         "model.window=3",        "model.features=5",
                          "model.hidden=8",        "train.seed=9",          "train.threads=1",
                          "train.schedule=linear", "train.clip_grad_norm=2"};
    CHECK_OK(load(&c, "model: {preset: w1}\ntrain: {lr: 0.01}\n", 8, sets));
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    CHECK_OK(ts_config_build(&c, &g, &m, &spec, &opt));
    if (!g) return;
    CHECK(ts_dim(g, m.input, 0) == 4 && ts_dim(g, m.input, 1) == 3 && ts_dim(g, m.input, 2) == 5,
          "x [4, 3, 5]");
    CHECK(spec.opt.kind == TS_OPT_ADAMW && spec.opt.lr == 0.01 && spec.opt.weight_decay == 0.01,
          "adamw spec");
    CHECK(spec.schedule.kind == TS_LR_LINEAR && spec.schedule.total_steps == 100, "schedule");
    CHECK(spec.clip_grad_norm == 2 && opt.seed == 9 && opt.threads == 1, "clip, seed, threads");
    ts_plan *plan = NULL;
    CHECK_OK(ts_compile(g, &spec, &opt, &plan));
    float x[4 * 3 * 5] = {0}, y[4] = {1, 2, 3, 4};
    CHECK_OK(ts_plan_set_input(plan, "x", x, sizeof x));
    CHECK_OK(ts_plan_set_input(plan, "y", y, sizeof y));
    CHECK_OK(ts_plan_step(plan));
    CHECK(isfinite(ts_plan_loss(plan)), "one step runs");
    ts_plan_free(plan);
    ts_graph_free(g);

    const char *gs[] = {"model.batch=2",   "model.ctx=4",      "model.vocab=11",
                        "model.d_model=8", "model.n_layers=1", "model.n_heads=2"};
    CHECK_OK(load(&c, "model: {name: gpt}\ntrain: {optimizer: sgd, lr: 0.5}\n", 6, gs));
    CHECK_OK(ts_config_build(&c, &g, &m, &spec, &opt));
    CHECK(g && ts_dtype_of(g, m.input) == TS_I64 && ts_dim(g, m.output, 2) == 11, "gpt logits");
    CHECK(spec.opt.kind == TS_OPT_SGD && spec.opt.lr == 0.5, "sgd spec");
    ts_graph_free(g);

    ts_config_init(&c);
    CHECK(ts_config_build(&c, &g, &m, &spec, &opt) == TS_ERR_INVALID, "build needs finish");
}

/* Every key of the table has a row in docs/config.md with its type, range
 * and default, and the docs list no key the table lacks. */
static void test_docs(void) {
    FILE *f = fopen("docs/config.md", "r");
    CHECK(f != NULL, "docs/config.md (run from the repository root)");
    if (!f) return;
    int seen[TS_CFG_MAX_KEYS] = {0};
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "| `", 3)) continue;
        char *cell[6];
        int n = 0;
        for (char *p = line; n < 6 && (p = strchr(p, '|')); p++) {
            *p = 0;
            cell[n++] = p + 1;
        }
        if (n < 6) continue;
        for (int i = 0; i < 5; i++) { /* trim spaces and backticks */
            while (*cell[i] == ' ' || *cell[i] == '`') cell[i]++;
            char *e = cell[i] + strlen(cell[i]);
            while (e > cell[i] && (e[-1] == ' ' || e[-1] == '`')) *--e = 0;
        }
        if (!strchr(cell[0], '.')) continue; /* another table (presets) */
        int k = ts_config_key_find(cell[0]);
        CHECK(k >= 0, "docs/config.md documents '%s', which is no key", cell[0]);
        if (k < 0) continue;
        const ts_config_key *key = ts_config_key_at(k);
        char tb[128];
        seen[k]++;
        CHECK(!strcmp(cell[1], ts_config_type_name(key, tb, sizeof tb)), "%s: type '%s' vs '%s'",
              key->path, cell[1], tb);
        CHECK(!strcmp(cell[2], key->range ? key->range : ""), "%s: range '%s' vs '%s'", key->path,
              cell[2], key->range ? key->range : "");
        CHECK(!strcmp(cell[3], key->dflt), "%s: default '%s' vs '%s'", key->path, cell[3],
              key->dflt);
    }
    fclose(f);
    for (int i = 0; i < ts_config_key_count(); i++)
        CHECK(seen[i] == 1, "docs/config.md has %d rows for %s", seen[i],
              ts_config_key_at(i)->path);
}

int main(void) {
    test_defaults_and_presets();
    test_overrides();
    test_unknown_keys();
    test_type_errors();
    test_cross_checks();
    test_files();
    test_mangled();
    test_write_roundtrip();
    test_build();
    test_docs();
    return check_summary("unit/config");
}
