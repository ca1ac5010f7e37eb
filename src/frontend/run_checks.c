/* Checks of a finished config that need the world outside it: the ranks a
 * run has (metrics ports), the key files it names (ckpt.sign_key,
 * ckpt.verify_key), and whether a single-process tool can honour it
 * (dist.*). A session calls ts_config_check_run before it creates anything,
 * so a refused config leaves no run directory behind. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/core.h"
#include "tessel/compile.h"
#include "frontend/check.h"
#include "frontend/keys.h"
#include "frontend/run_checks.h"

ts_status cfg_check_ports(const ts_config *c, int rank, int nranks) {
    const int port = c->observe.metrics_port;
    if (port <= 0 || nranks <= 1) return TS_OK;
    const long last = (long)port + (nranks - 1 - rank);
    if (last <= 65535) return TS_OK;
    char where[600];
    const int i = ts_config_key_find("observe.metrics_port");
    return ts_fail(TS_ERR_INVALID,
                   "%s: observe.metrics_port %d: with %d processes rank %d would serve on port "
                   "%ld (each rank uses metrics_port + rank, at most 65535); use a port <= %d",
                   cfg_origin(c, i, where, sizeof where), port - rank, nranks, nranks - 1, last,
                   65535 - (nranks - 1));
}

const char *ts_config_sign_key(const ts_config *c) {
    const char *k = c->ckpt.sign_key;
    return k[0] && strcmp(k, "none") ? k : NULL;
}

ts_cfg_verify ts_config_verify_key(const ts_config *c, const char **path) {
    const char *v = c->ckpt.verify_key, *sign = ts_config_sign_key(c);
    *path = NULL;
    if (!strcmp(v, "none")) return TS_CFG_VERIFY_NONE;
    if (v[0]) {
        *path = v;
        return TS_CFG_VERIFY_FILE;
    }
    if (!sign) return TS_CFG_VERIFY_NONE;
    *path = sign;
    return TS_CFG_VERIFY_OWN;
}

/* The private key: a regular file (not reached through a link) of this
 * user that nobody else may read, checked on the open file itself. */
static ts_status check_private_key(const ts_config *c, const char *path) {
    char where[600];
    cfg_origin(c, ts_config_key_find("ckpt.sign_key"), where, sizeof where);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP)
            return ts_fail(TS_ERR_INVALID,
                           "%s: ckpt.sign_key '%s' is a symbolic link; name the private key "
                           "file itself",
                           where, path);
        return ts_fail(TS_ERR_INVALID, "%s: ckpt.sign_key: cannot read '%s': %s", where, path,
                       strerror(errno));
    }
    struct stat st;
    ts_status s = TS_OK;
    if (fstat(fd, &st) != 0)
        s = ts_fail(TS_ERR_INVALID, "%s: ckpt.sign_key: cannot stat '%s': %s", where, path,
                    strerror(errno));
    else if (!S_ISREG(st.st_mode))
        s = ts_fail(TS_ERR_INVALID, "%s: ckpt.sign_key '%s' is not a regular file", where, path);
    else if (st.st_uid != geteuid())
        s = ts_fail(TS_ERR_INVALID,
                    "%s: ckpt.sign_key '%s' belongs to uid %u, not to this user (uid %u); a "
                    "private key must be its user's own",
                    where, path, (unsigned)st.st_uid, (unsigned)geteuid());
    else if (st.st_mode & 077)
        s = ts_fail(TS_ERR_INVALID,
                    "%s: ckpt.sign_key '%s' is readable by others (mode %03o); run chmod 600 on "
                    "it",
                    where, path, (unsigned)(st.st_mode & 0777));
    close(fd);
    return s;
}

static ts_status check_public_key(const ts_config *c, const char *path) {
    char where[600];
    cfg_origin(c, ts_config_key_find("ckpt.verify_key"), where, sizeof where);
    int fd = open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return ts_fail(TS_ERR_INVALID,
                       "%s: ckpt.verify_key: cannot read '%s': %s (none: no "
                       "signature check)",
                       where, path, strerror(errno));
    struct stat st;
    const int regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    close(fd);
    return regular ? TS_OK
                   : ts_fail(TS_ERR_INVALID, "%s: ckpt.verify_key '%s' is not a regular file",
                             where, path);
}

/* dist.compress*: settings that need the number of ranks or other keys
 * (the ranges of ratio and rank are the key table's). */
static ts_status check_compress(const ts_config *c, int nranks) {
    const int m = c->dist.compress;
    char where[600];
    if (c->dist.compress_dense_steps && !m)
        return ts_fail(
            TS_ERR_INVALID,
            "%s: dist.compress_dense_steps is the dense start of dist.compress topk or powersgd; "
            "dist.compress is none",
            cfg_origin(c, ts_config_key_find("dist.compress_dense_steps"), where, sizeof where));
    if (c->dist.compress_power_iters != 1 && m != 2)
        return ts_fail(
            TS_ERR_INVALID,
            "%s: dist.compress_power_iters %d is the power iterations of dist.compress powersgd; "
            "dist.compress is %s",
            cfg_origin(c, ts_config_key_find("dist.compress_power_iters"), where, sizeof where),
            c->dist.compress_power_iters, m ? "topk" : "none");
    if (!m) {
        if (!c->dist.compress_momentum) return TS_OK;
        return ts_fail(
            TS_ERR_INVALID,
            "%s: dist.compress_momentum is the momentum correction of dist.compress "
            "topk or powersgd; dist.compress is none",
            cfg_origin(c, ts_config_key_find("dist.compress_momentum"), where, sizeof where));
    }
    const char *name = m == 1 ? "topk" : "powersgd";
    const int ki = ts_config_key_find("dist.compress");
    const int64_t lo = c->dist.compress_min_elems, hi = c->dist.compress_max_elems;
    if (hi && (m != 2 || hi < lo))
        return ts_fail(
            TS_ERR_INVALID,
            m != 2 ? "%s: dist.compress_max_elems %lld bounds the gradients powersgd compresses; "
                     "dist.compress is topk"
                   : "%s: dist.compress_max_elems %lld is below dist.compress_min_elems %lld: "
                     "powersgd would compress nothing",
            cfg_origin(c, ts_config_key_find("dist.compress_max_elems"), where, sizeof where),
            (long long)hi, (long long)lo);
    if (nranks < 2)
        return ts_fail(TS_ERR_INVALID,
                       "%s: dist.compress %s compresses the gradients exchanged between "
                       "processes; this run has one (use --procs N, N >= 2, or dist.compress "
                       "none)",
                       cfg_origin(c, ki, where, sizeof where), name);
    if (c->dist.zero)
        return ts_fail(TS_ERR_INVALID,
                       "%s: dist.compress %s with dist.zero %d is not supported: ZeRO "
                       "reduce-scatters dense buckets (use dist.zero 0 or dist.compress none)",
                       cfg_origin(c, ki, where, sizeof where), name, c->dist.zero);
    if (c->dist.compress_momentum) {
        const int ki2 = ts_config_key_find("dist.compress_momentum");
        if (c->train.optimizer != 0 || c->train.momentum <= 0)
            return ts_fail(
                TS_ERR_INVALID,
                "%s: dist.compress_momentum moves SGD's momentum before the compression; "
                "it needs train.optimizer sgd with train.momentum > 0",
                cfg_origin(c, ki2, where, sizeof where));
    }
    return TS_OK;
}

/* dist.zero 3: what reads the parameters whole between steps, where
 * every rank holds only its blocks of them, is refused naming its key. */
static ts_status check_zero3(const ts_config *c, int nranks) {
    if (c->dist.zero != 3 || nranks < 2) return TS_OK;
    static const struct {
        const char *key, *why;
    } no[] = {
        {"shape.policy", "shape buckets (bucket) compile a plan per shape on one copy of the "
                         "parameters"},
        {"peft.lora.targets", "PEFT trains a few parameters of a frozen base (use dist.zero 2)"},
        {"peft.adapter.after", "PEFT trains a few parameters of a frozen base (use dist.zero 2)"},
    };
    const int set[] = {c->shape.policy != 0, c->peft.targets[0] != 0,
                       c->peft.adapter_after[0] != 0};
    char where[600];
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (set[i])
            return ts_fail(TS_ERR_INVALID,
                           "%s: %s is not supported with dist.zero 3, which shards the "
                           "parameters over the processes: %s",
                           cfg_origin(c, ts_config_key_find(no[i].key), where, sizeof where),
                           no[i].key, no[i].why);
    return TS_OK;
}

/* dist.microbatches cuts the batch for pipeline stages only: in one
 * process it would change nothing, so it is refused rather than ignored
 * (the session checks the combinations stages support, pipe_train.c). */
static ts_status check_pipeline(const ts_config *c) {
    if (c->pipe.stages > 1 || c->pipe.microbatches <= 1) return TS_OK;
    char where[600];
    return ts_fail(TS_ERR_INVALID,
                   "%s: dist.microbatches %d without dist.pipeline_stages > 1 has no effect (for "
                   "micro-batches in one process use dist.reproducible with dist.microbatch)",
                   cfg_origin(c, ts_config_key_find("dist.microbatches"), where, sizeof where),
                   c->pipe.microbatches);
}

ts_status ts_config_check_run(const ts_config *c, int rank, int nranks) {
    if (!c) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (!c->finished) return ts_fail(TS_ERR_INVALID, "config: call ts_config_finish first");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return ts_fail(TS_ERR_INVALID, "config: rank %d of %d processes", rank, nranks);
    ts_status s = cfg_check_ports(c, rank, nranks);
    if (s == TS_OK) s = check_compress(c, nranks);
    if (s == TS_OK) s = check_zero3(c, nranks);
    if (s == TS_OK) s = check_pipeline(c);
    const char *sign = ts_config_sign_key(c), *verify;
    if (s == TS_OK && sign) s = check_private_key(c, sign);
    if (s == TS_OK && ts_config_verify_key(c, &verify) == TS_CFG_VERIFY_FILE)
        s = check_public_key(c, verify);
    return s;
}

int ts_config_dist_key(const ts_config *c) {
    ts_config d;
    ts_config_init(&d);
    for (int i = 0; i < CFG_N_KEYS; i++) {
        const ts_config_key *k = &cfg_keys[i];
        /* the memory limit applies to one process too */
        if (strncmp(k->path, "dist.", 5) || !strcmp(k->path, "dist.max_mem_mb")) continue;
        if (memcmp((const char *)c + k->offset, (const char *)&d + k->offset, k->size)) return i;
    }
    return -1;
}

ts_status ts_config_check_single_process(const ts_config *c, const char *tool) {
    if (!c) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    const int i = ts_config_dist_key(c);
    if (i < 0) return TS_OK;
    char where[600];
    return ts_fail(TS_ERR_INVALID,
                   "%s: %s is set, but %s builds the step of one process, without collectives, "
                   "and would ignore it; leave dist.* at its defaults here (--dump config alone "
                   "shows them)",
                   cfg_origin(c, i, where, sizeof where), cfg_keys[i].path,
                   tool ? tool : "this tool");
}

void ts_config_compress_options(const ts_config *c, ts_compress_options *out) {
    memset(out, 0, sizeof *out);
    out->method = c->dist.compress;
    out->ratio = c->dist.compress_ratio;
    out->values = c->dist.compress_values;
    out->warmup_steps = c->dist.compress_warmup_steps;
    out->momentum = c->dist.compress_momentum;
    out->clip = c->dist.compress_clip;
    out->rank = c->dist.compress_rank;
    out->min_elems = c->dist.compress_min_elems;
    out->max_elems = c->dist.compress_max_elems;
    out->power_iters = c->dist.compress_power_iters;
    out->dense_steps = c->dist.compress_dense_steps;
}
