/* run.c — the roles of tessel/fed.h on a config: the model's parameters as
 * one flat vector (in the plan's parameter order), the key holder's
 * checkpoints and audit log, and a client's local training through the
 * session API (each round a run of fed.local_steps steps whose base weights
 * are the global model, saved as a checkpoint the run loads with peft.base). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fed/obs.h"
#include "fed/roles.h"
#include "tessel/fed.h"
#include "tessel/tessel.h"

/* A compiled plan of the config's model, for its parameters. */
typedef struct model {
    ts_plan *plan;
    int64_t n; /* parameters in all */
} model;

static ts_status model_build(const ts_config *c, model *m) {
    memset(m, 0, sizeof *m);
    ts_config cc = *c;
    ts_graph *g = NULL;
    ts_model md;
    ts_train_spec spec;
    ts_compile_options opt;
    ts_status s = ts_session_build_model(&cc, &g, &md, &spec, &opt);
    if (s == TS_OK) s = ts_compile(g, &spec, &opt, &m->plan);
    ts_graph_free(g);
    for (int i = 0; s == TS_OK && i < ts_plan_param_count(m->plan); i++) {
        int rank;
        int64_t dims[TS_MAX_RANK], k = 1;
        ts_dtype dt;
        if ((s = ts_plan_value_info(m->plan, ts_plan_param_name(m->plan, i), &dt, &rank, dims)) !=
            TS_OK)
            break;
        if (dt != TS_F32)
            s = ts_fail(TS_ERR_UNSUPPORTED, "fed: parameter %s is not f32",
                        ts_plan_param_name(m->plan, i));
        for (int d = 0; d < rank; d++) k *= dims[d];
        m->n += k;
    }
    if (s != TS_OK) {
        ts_plan_free(m->plan);
        m->plan = NULL;
    }
    return s;
}

static int64_t param_numel(const ts_plan *p, int i) {
    int rank;
    int64_t dims[TS_MAX_RANK], k = 1;
    ts_plan_value_info(p, ts_plan_param_name(p, i), NULL, &rank, dims);
    for (int d = 0; d < rank; d++) k *= dims[d];
    return k;
}

/* The plan's parameters into flat[m->n] (read) or from it (write). */
static ts_status model_io(model *m, float *flat, int write) {
    int64_t off = 0;
    for (int i = 0; i < ts_plan_param_count(m->plan); i++) {
        const char *name = ts_plan_param_name(m->plan, i);
        size_t bytes = (size_t)param_numel(m->plan, i) * 4;
        ts_status s = write ? ts_plan_write_param(m->plan, name, flat + off, bytes)
                            : ts_plan_read(m->plan, name, flat + off, bytes);
        if (s != TS_OK) return s;
        off += (int64_t)(bytes / 4);
    }
    return TS_OK;
}

static ts_status tls_of(const ts_config *c, ts_fed_tls *t) {
    if (!c->fed.ca[0] || !c->fed.cert[0] || !c->fed.tls_key[0] || !strcmp(c->fed.ca, "none"))
        return ts_fail(TS_ERR_INVALID,
                       "fed: set fed.tls.ca, fed.tls.cert and fed.tls.key (scripts/fed-test-ca.sh "
                       "makes a test CA)");
    *t = (ts_fed_tls){c->fed.ca, c->fed.cert, c->fed.tls_key, c->fed.timeout_s};
    return TS_OK;
}

static ts_fed_params params_of(const ts_config *c) {
    ts_fed_params fp = ts_fed_params_default();
    fp.rounds = c->fed.rounds;
    fp.min_clients = c->fed.min_clients;
    fp.max_clients = c->fed.max_clients;
    fp.key_bits = c->fed.key_bits;
    fp.scale = c->fed.scale;
    fp.clip = c->fed.clip;
    fp.join_s = c->fed.join_s;
    fp.pool = c->fed.pool;
    fp.pool_threads = c->fed.pool_threads;
    fp.secure = c->fed.secure;
    fp.threshold = c->fed.threshold;
    fp.keyholder_name = c->fed.keyholder_name;
    return fp;
}

static ts_status make_dir(const char *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return ts_fail(TS_ERR_IO, "fed: cannot create %s: %s", dir, strerror(errno));
    return TS_OK;
}

/* The role's Prometheus metrics: DIR/metrics.prom, and /metrics on
 * observe.metrics_port when it is set. */
static ts_status obs_of(const ts_config *c, const char *role, const char *dir, ts_fed_obs **o) {
    ts_status s = ts_fed_obs_create(role, dir, c->observe.metrics_addr, c->observe.metrics_port, o);
    if (s == TS_OK && c->observe.metrics_port > 0) {
        printf("fed: %s metrics on http://%s:%d/metrics\n", role, c->observe.metrics_addr,
               c->observe.metrics_port);
        fflush(stdout);
    }
    return s;
}

static FILE *open_metrics(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "a");
    if (!f) ts_fail(TS_ERR_IO, "fed: cannot write %s: %s", path, strerror(errno));
    return f;
}

/* ---- serve ---- */

ts_status ts_fed_serve(const ts_config *c, const char *dir) {
    ts_fed_tls tls;
    ts_status s = tls_of(c, &tls);
    if (s == TS_OK) s = make_dir(dir);
    FILE *metrics = s == TS_OK ? open_metrics(dir) : NULL;
    if (s == TS_OK && !metrics) s = TS_ERR_IO;
    ts_fed_listener *l = NULL;
    if (s == TS_OK) s = ts_fed_listen(&tls, c->fed.addr, c->fed.port, &l);
    ts_fed_obs *obs = NULL;
    if (s == TS_OK) s = obs_of(c, "aggregator", dir, &obs);
    if (s == TS_OK) {
        printf("fed: aggregator listening on %s:%d, %d rounds, %d to %d clients\n", c->fed.addr,
               ts_fed_listener_port(l), c->fed.rounds, c->fed.min_clients, c->fed.max_clients);
        fflush(stdout);
        ts_fed_params fp = params_of(c);
        fp.obs = obs;
        s = ts_fed_aggregator_run(&fp, l, c->fed.keyholder_name, metrics);
    }
    ts_fed_obs_free(obs);
    ts_fed_listener_free(l);
    if (metrics) fclose(metrics);
    return s;
}

/* ---- keyholder ---- */

typedef struct kh_state {
    const ts_config *c;
    const char *dir;
    model m;
    ts_audit *audit;
    FILE *metrics;
    int64_t first; /* rounds done before this run (resumed from step-FIRST) */
} kh_state;

static ts_status audit_round(kh_state *k, int64_t round, const ts_fed_round_info *info);

static ts_status kh_on_global(void *user, const float *params, int64_t n,
                              const ts_fed_round_info *info) {
    kh_state *k = user;
    ts_status s = model_io(&k->m, (float *)params, 1);
    (void)n;
    if (s != TS_OK) return s;
    if (info->round == 0 && k->first > 0) return TS_OK; /* the resumed checkpoint is that model */
    int64_t round = k->first + info->round;             /* rounds count on across resumes */
    /* The round's audit entry goes first, its checkpoint (the commit) after:
     * a key holder killed between the two redoes the round when resumed, so
     * every committed round has its entry (an uncommitted one may have two). */
    if (info->round > 0 && (s = audit_round(k, round, info)) != TS_OK) return s;
    ts_plan_set_step(k->m.plan, round);
    ts_ckpt_options o = ts_ckpt_options_default();
    o.sign_key = k->c->ckpt.sign_key[0] ? k->c->ckpt.sign_key : NULL;
    o.audit = k->audit;
    o.keep_last = 0;
    ts_ckpt_meta meta = {0};
    return ts_ckpt_save(k->m.plan, k->dir, &meta, &o);
}

/* The fed_round entry of the audit log and the metrics line of a round. */
static ts_status audit_round(kh_state *k, int64_t round, const ts_fed_round_info *info) {
    ts_status s;
    /* participants: "name bytes sha256;..." as a JSON list of objects */
    size_t cap = strlen(info->participants) * 2 + 512;
    char *json = malloc(cap);
    if (!json) return ts_fail(TS_ERR_NOMEM, "fed: audit entry");
    size_t len = (size_t)snprintf(
        json, cap,
        "{\"round\": %lld, \"clients\": %d, \"weight_sum\": %.17g, \"bytes_up\": %llu, "
        "\"decrypt_s\": %.6f, \"participants\": [",
        (long long)round, info->clients, info->weight_sum, (unsigned long long)info->bytes_up,
        info->decrypt_s);
    const char *p = info->participants;
    for (int first = 1; *p; first = 0) {
        char name[256] = "", hash[65] = "";
        unsigned long long bytes = 0;
        int used = 0;
        if (sscanf(p, "%255s %llu %64s%n", name, &bytes, hash, &used) != 3) break;
        len += (size_t)snprintf(json + len, cap - len,
                                "%s{\"client\": \"%s\", \"bytes\": %llu, \"sha256\": \"%s\"}",
                                first ? "" : ", ", name, bytes, hash);
        p += used;
        if (*p == ';') p++;
    }
    snprintf(json + len, cap - len, "]}");
    s = ts_audit_append(k->audit, "fed_round", json);
    if (s == TS_OK && k->metrics) {
        fprintf(k->metrics, "%s\n", json);
        fflush(k->metrics);
    }
    free(json);
    return s;
}

/* A key holder restarted on its directory continues from the last global
 * model it committed (verified; against the signing key's public half when
 * ckpt.sign_key is set). */
static ts_status keyholder_resume(const ts_config *c, const char *dir, kh_state *k) {
    char latest[1024], pub[80];
    snprintf(latest, sizeof latest, "%s/LATEST", dir);
    FILE *f = fopen(latest, "r");
    if (!f) return TS_OK; /* a new run */
    fclose(f);
    const char *key = NULL;
    if (c->ckpt.verify_key[0] && strcmp(c->ckpt.verify_key, "none")) {
        key = c->ckpt.verify_key;
    } else if (c->ckpt.sign_key[0]) {
        ts_status s = ts_ckpt_public_key_of(c->ckpt.sign_key, pub);
        if (s != TS_OK) return s;
        key = pub;
    }
    ts_ckpt *ck = NULL;
    ts_status s = ts_ckpt_open(dir, key, k->audit, &ck);
    ts_ckpt_info info;
    if (s == TS_OK) s = ts_ckpt_get_info(ck, &info);
    if (s == TS_OK) s = ts_ckpt_restore(ck, k->m.plan, k->audit);
    if (s == TS_OK) {
        k->first = info.step;
        printf("fed: key holder resumes from %s (round %lld)\n", info.dir, (long long)info.step);
        fflush(stdout);
    } else {
        ts_error_prefix("fed: resuming the key holder from %s", dir);
    }
    ts_ckpt_close(ck);
    return s;
}

ts_status ts_fed_keyholder(const ts_config *c, const char *dir) {
    kh_state k = {.c = c, .dir = dir};
    ts_fed_tls tls;
    float *init = NULL;
    ts_status s = tls_of(c, &tls);
    if (s == TS_OK) s = make_dir(dir);
    if (s == TS_OK) s = model_build(c, &k.m);
    if (s == TS_OK && !(init = malloc((size_t)k.m.n * sizeof *init)))
        s = ts_fail(TS_ERR_NOMEM, "fed: model");
    if (s == TS_OK) s = ts_audit_open(dir, c->ckpt.sign_key[0] ? c->ckpt.sign_key : NULL, &k.audit);
    if (s == TS_OK) s = keyholder_resume(c, dir, &k);
    if (s == TS_OK) s = model_io(&k.m, init, 0);
    if (s == TS_OK && !(k.metrics = open_metrics(dir))) s = TS_ERR_IO;
    ts_fed_obs *obs = NULL;
    if (s == TS_OK) s = obs_of(c, "keyholder", dir, &obs);
    if (s == TS_OK) {
        ts_fed_params fp = params_of(c);
        fp.obs = obs;
        s = ts_fed_keyholder_run(&fp, &tls, c->fed.addr, c->fed.port, c->fed.server_name,
                                 c->fed.key, init, k.m.n, kh_on_global, &k);
    }
    if (k.audit) {
        ts_status s2 = ts_audit_close(k.audit);
        if (s == TS_OK) s = s2;
    }
    if (k.metrics) fclose(k.metrics);
    ts_fed_obs_free(obs);
    ts_plan_free(k.m.plan);
    free(init);
    return s;
}

/* ---- join ---- */

typedef struct client_state {
    const ts_config *c;
    const char *dir;
    model m;
} client_state;

/* FedProx (Li et al., MLSys 2020): the local objective is the client's loss
 * plus mu/2 ||w - global||^2. Its gradient part goes through the optimizer
 * as usual; the proximal part is applied after each step as its exact
 * proximal operator with the step's learning rate,
 *     w <- (w + lr·mu·global) / (1 + lr·mu),
 * a proximal-gradient step on the same objective (for plain SGD this is
 * proximal gradient descent; with Adam the term is decoupled from the
 * moment estimates, as AdamW decouples weight decay). Stable for any mu. */
typedef struct prox {
    const model *m; /* the parameter names, in the order of global */
    const float *global;
    double mu;
    float *buf;
} prox;

static ts_status prox_step(void *user, ts_plan *plan, int64_t step, double lr) {
    prox *p = user;
    (void)step;
    const double a = lr * p->mu, inv = 1.0 / (1.0 + a);
    int64_t off = 0;
    for (int i = 0; i < ts_plan_param_count(p->m->plan); i++) {
        const char *name = ts_plan_param_name(p->m->plan, i);
        int64_t k = param_numel(p->m->plan, i);
        ts_status s = ts_plan_read(plan, name, p->buf, (size_t)k * 4);
        if (s != TS_OK) return s;
        for (int64_t j = 0; j < k; j++)
            p->buf[j] = (float)(((double)p->buf[j] + a * (double)p->global[off + j]) * inv);
        if ((s = ts_plan_write_param(plan, name, p->buf, (size_t)k * 4)) != TS_OK) return s;
        off += k;
    }
    return TS_OK;
}

static ts_status client_train(void *user, int round, const float *global, float *local, int64_t n) {
    client_state *cs = user;
    (void)n;
    /* the global model as a checkpoint in DIR/global, the base of this round's run */
    char gdir[400], rdir[1024];
    if (strlen(cs->dir) > sizeof gdir - 16)
        return ts_fail(TS_ERR_INVALID, "fed join: directory name too long");
    snprintf(gdir, sizeof gdir, "%s/global", cs->dir);
    snprintf(rdir, sizeof rdir, "%s/round-%03d", cs->dir, round);
    ts_status s = model_io(&cs->m, (float *)global, 1);
    ts_plan_set_step(cs->m.plan, round);
    ts_ckpt_meta meta = {0};
    if (s == TS_OK) s = ts_ckpt_save(cs->m.plan, gdir, &meta, NULL);
    if (s != TS_OK) return s;
    static ts_config cc; /* large: not on the stack */
    cc = *cs->c;
    cc.train.epochs = 0;
    cc.train.steps = cs->c->fed.local_steps;
    cc.ckpt.every = cs->c->fed.local_steps;
    cc.ckpt.async = 0;
    cc.observe.tensorboard = 0;
    snprintf(cc.peft.base, sizeof cc.peft.base, "%s", gdir);
    ts_session_options o = ts_session_options_default();
    o.out_dir = rdir;
    prox px = {&cs->m, global, cs->c->fed.prox_mu, NULL};
    if (px.mu > 0) { /* mu = 0 is FedAvg: no hook at all, so bit for bit the same run */
        if (!(px.buf = malloc((size_t)n * sizeof *px.buf)))
            return ts_fail(TS_ERR_NOMEM, "fed: FedProx buffer");
        o.after_step = prox_step;
        o.after_step_user = &px;
    }
    ts_session_result r;
    s = ts_session_run(&cc, &o, &r);
    free(px.buf);
    if (s != TS_OK) {
        ts_error_prefix("fed: round %d: local training", round);
        return s;
    }
    ts_ckpt *ck = NULL;
    if ((s = ts_ckpt_open(rdir, NULL, NULL, &ck)) != TS_OK) return s;
    int64_t off = 0;
    for (int i = 0; s == TS_OK && i < ts_plan_param_count(cs->m.plan); i++) {
        int64_t k = param_numel(cs->m.plan, i);
        s = ts_ckpt_read(ck, ts_plan_param_name(cs->m.plan, i), local + off, (size_t)k * 4);
        off += k;
    }
    ts_ckpt_close(ck);
    return s;
}

ts_status ts_fed_join(const ts_config *c, const char *dir) {
    client_state cs = {.c = c, .dir = dir};
    ts_fed_tls tls;
    int64_t samples = 0;
    ts_status s = tls_of(c, &tls);
    if (s == TS_OK) s = ts_fed_samples(c, &samples);
    if (s == TS_OK) s = make_dir(dir);
    if (s == TS_OK) s = model_build(c, &cs.m);
    ts_fed_obs *obs = NULL;
    if (s == TS_OK) s = obs_of(c, "client", dir, &obs);
    if (s == TS_OK) {
        ts_fed_params fp = params_of(c);
        fp.obs = obs;
        s = ts_fed_client_run(&fp, &tls, c->fed.addr, c->fed.port, c->fed.server_name, samples,
                              cs.m.n, client_train, &cs);
    }
    ts_fed_obs_free(obs);
    ts_plan_free(cs.m.plan);
    return s;
}
