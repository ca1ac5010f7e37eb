/* The checkpoint commands: ckpt verify|inspect|diff|gc, keygen, audit
 * verify, export. Thin: they parse arguments and call tessel/ckpt.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt_cli.h"
#include "peft_cli.h"
#include "cli.h"
#include "onnx_cli.h"
#include "tessel/ckpt.h"
#include "tessel/tessel.h"

enum { CLI_DIFFERENT = 3 };

typedef struct opts {
    const char *pos[2];
    int n_pos;
    const char *pubkey, *out, *safetensors;
    const char *keep_last, *keep_every;
    const char *fp8; /* export: e4m3|e5m2 */
    int json;
} opts;

/* Options shared by the commands; `allowed` lists those this one takes. */
static int parse_opts(const char *cmd, int argc, char **argv, int max_pos, const char *allowed,
                      opts *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        if (a[0] != '-' || !a[1]) {
            if (o->n_pos == max_pos)
                return cli_error(CLI_USAGE, "%s: unexpected argument '%s'", cmd, a);
            o->pos[o->n_pos++] = a;
            continue;
        }
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)(nlen < 31 ? nlen : 31), a);
        char key[40];
        snprintf(key, sizeof key, " %s ", name);
        if (!strstr(allowed, key))
            return cli_error(CLI_USAGE, "%s: unknown option '%s' (options:%s)", cmd, a, allowed);
        if (!strcmp(name, "--json")) {
            o->json = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return cli_error(CLI_USAGE, "%s: %s needs a value", cmd, name);
        if (!strcmp(name, "--pubkey"))
            o->pubkey = v;
        else if (!strcmp(name, "--out"))
            o->out = v;
        else if (!strcmp(name, "--safetensors"))
            o->safetensors = v;
        else if (!strcmp(name, "--keep-last"))
            o->keep_last = v;
        else if (!strcmp(name, "--keep-every"))
            o->keep_every = v;
        else if (!strcmp(name, "--fp8"))
            o->fp8 = v;
    }
    return CLI_OK;
}

static int fail(ts_status s) {
    return cli_error(cli_status_code(s), "%s", ts_last_error());
}

static int to_int(const char *cmd, const char *what, const char *v, int *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (v && (*end || x < 0 || x > 1000000000))
        return cli_error(CLI_USAGE, "%s: %s must be a non-negative integer, got '%s'", cmd, what,
                         v);
    *out = (int)x;
    return CLI_OK;
}

static void shape_text(char *buf, size_t n, const ts_ckpt_tensor *t) {
    size_t k = (size_t)snprintf(buf, n, "%s[", ts_dtype_name(t->dtype));
    for (int d = 0; d < t->rank && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? "," : "", (long long)t->dims[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

static void print_summary(const ts_ckpt *c) {
    ts_ckpt_info in;
    ts_ckpt_get_info(c, &in);
    const char *sig = !in.is_signed     ? "unsigned"
                      : in.signature_ok ? "signature verified"
                                        : "signed (not checked: no --pubkey)";
    printf("%s: OK: step %lld, %d tensors (%.1f MB) in %d files, every SHA-256 and CRC-32C "
           "matches, %s\n",
           in.dir, (long long)in.step, in.n_tensors, (double)in.bytes / 1e6, in.n_files, sig);
}

static int cmd_verify_inspect(int inspect, int argc, char **argv) {
    const char *cmd = inspect ? "ckpt inspect" : "ckpt verify";
    opts o;
    int rc = parse_opts(cmd, argc, argv, 1, inspect ? " --pubkey --json " : " --pubkey ", &o);
    if (rc != CLI_OK) return rc;
    if (o.n_pos != 1) return cli_error(CLI_USAGE, "%s: needs one checkpoint or run directory", cmd);
    ts_ckpt *c;
    ts_status s = ts_ckpt_open(o.pos[0], o.pubkey, NULL, &c);
    if (s != TS_OK) return fail(s);
    if (inspect && o.json) {
        fputs(ts_ckpt_manifest(c), stdout);
        putchar('\n');
        ts_ckpt_close(c);
        return CLI_OK;
    }
    print_summary(c);
    if (inspect) {
        ts_ckpt_info in;
        ts_ckpt_get_info(c, &in);
        printf("id %s, saved %s by tessel %s\n", in.id, in.time, in.tessel_version);
        printf("config sha256 %s\n", *in.config_sha256 ? in.config_sha256 : "(none recorded)");
        printf("rng seed %llu, data position %lld, epoch %lld, world size %d\n",
               (unsigned long long)in.seed, (long long)in.data_position, (long long)in.epoch,
               in.world_size);
        /* zero: the optimizer state came from every rank, in chunks */
        printf("layout: world %d (%s)\n", in.world_size, in.layout);
        for (int i = 0; i < in.n_data_files; i++)
            printf("data %s sha256 %s\n", in.data_files[i].path, in.data_files[i].sha256);
        if (in.base_path[0]) /* PEFT: the frozen weights are the base's (docs/peft.md) */
            printf("peft base %s sha256 %s: %d frozen parameters left to it\n", in.base_path,
                   in.base_sha256, in.n_frozen);
        if (in.is_signed) printf("signer %s\n", in.signer);
        for (int i = 0; i < ts_ckpt_tensor_count(c); i++) {
            ts_ckpt_tensor t;
            ts_ckpt_tensor_info(c, i, &t);
            char sh[160];
            shape_text(sh, sizeof sh, &t);
            printf("  %-5s %-48s %-24s %10.3f MB", t.is_state ? "state" : "param", t.name, sh,
                   (double)t.bytes / 1e6);
            /* several chunks: where each range of the flattened tensor lies */
            for (int k = 0; t.n_chunks > 1 && k < t.n_chunks; k++) {
                ts_ckpt_chunk ch;
                if (ts_ckpt_chunk_info(c, i, k, &ch) != TS_OK) break;
                if (ch.start < 0)
                    printf("%s%s (block of %lld)", k ? ", " : "  chunks: ", ch.file,
                           (long long)ch.count);
                else
                    printf("%s[%lld, %lld) %s:%s@%lld",
                           k ? ", " : "  chunks: ", (long long)ch.start,
                           (long long)(ch.start + ch.count), ch.file, ch.tensor,
                           (long long)ch.file_start);
            }
            putchar('\n');
        }
    }
    ts_ckpt_close(c);
    return CLI_OK;
}

/* Largest absolute difference of two float tensors (NaN if a value is NaN
 * in only one). */
static double max_abs_diff(ts_dtype dt, const void *a, const void *b, size_t bytes) {
    double m = 0;
    size_t n = bytes / ts_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        double x = dt == TS_F64 ? ((const double *)a)[i] : ((const float *)a)[i];
        double y = dt == TS_F64 ? ((const double *)b)[i] : ((const float *)b)[i];
        double d = fabs(x - y);
        if (isnan(d) && !(isnan(x) && isnan(y))) return NAN;
        if (d > m) m = d;
    }
    return m;
}

static int cmd_diff(int argc, char **argv) {
    opts o;
    int rc = parse_opts("ckpt diff", argc, argv, 2, " --pubkey ", &o);
    if (rc != CLI_OK) return rc;
    if (o.n_pos != 2) return cli_error(CLI_USAGE, "ckpt diff: needs two checkpoints");
    ts_ckpt *a = NULL, *b = NULL;
    ts_status s = ts_ckpt_open(o.pos[0], o.pubkey, NULL, &a);
    if (s == TS_OK) s = ts_ckpt_open(o.pos[1], o.pubkey, NULL, &b);
    if (s != TS_OK) {
        ts_ckpt_close(a);
        return fail(s);
    }
    ts_ckpt_info ia, ib;
    ts_ckpt_get_info(a, &ia);
    ts_ckpt_get_info(b, &ib);
    printf("A %s (step %lld)\nB %s (step %lld)\n", ia.dir, (long long)ia.step, ib.dir,
           (long long)ib.step);
    int differ = 0, same = 0;
    for (int i = 0; i < ts_ckpt_tensor_count(a) && s == TS_OK; i++) {
        ts_ckpt_tensor ta, tb;
        ts_ckpt_tensor_info(a, i, &ta);
        int found = 0;
        for (int j = 0; j < ts_ckpt_tensor_count(b) && !found; j++) {
            ts_ckpt_tensor_info(b, j, &tb);
            found = !strcmp(ta.name, tb.name);
        }
        char sa[160], sb[160];
        shape_text(sa, sizeof sa, &ta);
        if (!found) {
            printf("  only in A  %s %s\n", ta.name, sa);
            differ++;
            continue;
        }
        shape_text(sb, sizeof sb, &tb);
        if (strcmp(sa, sb) != 0) {
            printf("  shape      %s: %s vs %s\n", ta.name, sa, sb);
            differ++;
            continue;
        }
        void *da = malloc(ta.bytes ? ta.bytes : 1), *db = malloc(ta.bytes ? ta.bytes : 1);
        if (!da || !db) {
            free(da);
            free(db);
            ts_ckpt_close(a);
            ts_ckpt_close(b);
            return cli_error(CLI_FAIL, "ckpt diff: out of memory for tensor %s", ta.name);
        }
        s = ts_ckpt_read(a, ta.name, da, ta.bytes);
        if (s == TS_OK) s = ts_ckpt_read(b, ta.name, db, ta.bytes);
        if (s == TS_OK && memcmp(da, db, ta.bytes) != 0) {
            differ++;
            if (ta.dtype == TS_F32 || ta.dtype == TS_F64)
                printf("  differs    %s: max |A-B| %.6g\n", ta.name,
                       max_abs_diff(ta.dtype, da, db, ta.bytes));
            else
                printf("  differs    %s\n", ta.name);
        } else {
            same++;
        }
        free(da);
        free(db);
    }
    for (int j = 0; j < ts_ckpt_tensor_count(b) && s == TS_OK; j++) {
        ts_ckpt_tensor tb;
        ts_ckpt_tensor_info(b, j, &tb);
        int found = 0;
        for (int i = 0; i < ts_ckpt_tensor_count(a) && !found; i++) {
            ts_ckpt_tensor ta;
            ts_ckpt_tensor_info(a, i, &ta);
            found = !strcmp(ta.name, tb.name);
        }
        if (!found) {
            char sb[160];
            shape_text(sb, sizeof sb, &tb);
            printf("  only in B  %s %s\n", tb.name, sb);
            differ++;
        }
    }
    ts_ckpt_close(a);
    ts_ckpt_close(b);
    if (s != TS_OK) return fail(s);
    printf("%d identical, %d different\n", same, differ);
    return differ ? CLI_DIFFERENT : CLI_OK;
}

static int cmd_gc(int argc, char **argv) {
    opts o;
    int rc = parse_opts("ckpt gc", argc, argv, 1, " --keep-last --keep-every ", &o);
    if (rc != CLI_OK) return rc;
    if (o.n_pos != 1) return cli_error(CLI_USAGE, "ckpt gc: needs one run directory");
    int keep_last = 0, keep_every = 0, removed = 0;
    if ((rc = to_int("ckpt gc", "--keep-last", o.keep_last, &keep_last)) != CLI_OK) return rc;
    if ((rc = to_int("ckpt gc", "--keep-every", o.keep_every, &keep_every)) != CLI_OK) return rc;
    ts_status s = ts_ckpt_gc(o.pos[0], keep_last, keep_every, &removed);
    if (s != TS_OK) return fail(s);
    printf("%s: removed %d director%s\n", o.pos[0], removed, removed == 1 ? "y" : "ies");
    return CLI_OK;
}

int tessel_cmd_ckpt(int argc, char **argv) {
    if (argc < 1)
        return cli_error(CLI_USAGE, "ckpt: needs a subcommand: verify, inspect, diff or gc");
    const char *sub = argv[0];
    if (!strcmp(sub, "verify")) return cmd_verify_inspect(0, argc - 1, argv + 1);
    if (!strcmp(sub, "inspect")) return cmd_verify_inspect(1, argc - 1, argv + 1);
    if (!strcmp(sub, "diff")) return cmd_diff(argc - 1, argv + 1);
    if (!strcmp(sub, "gc")) return cmd_gc(argc - 1, argv + 1);
    return cli_error(CLI_USAGE, "ckpt: unknown subcommand '%s' (verify, inspect, diff, gc)", sub);
}

int tessel_cmd_keygen(int argc, char **argv) {
    opts o;
    int rc = parse_opts("keygen", argc, argv, 0, " --out ", &o);
    if (rc != CLI_OK) return rc;
    const char *prefix = o.out ? o.out : "tessel";
    size_t n = strlen(prefix) + 5;
    char *sk = malloc(n), *pk = malloc(n);
    if (!sk || !pk) {
        free(sk);
        free(pk);
        return cli_error(CLI_FAIL, "keygen: out of memory");
    }
    snprintf(sk, n, "%s.key", prefix);
    snprintf(pk, n, "%s.pub", prefix);
    ts_status s = ts_ckpt_keygen(sk, pk);
    if (s == TS_OK)
        printf("wrote %s (private, mode 0600: keep it secret) and %s (public: give it to "
               "verifiers)\n",
               sk, pk);
    free(sk);
    free(pk);
    return s == TS_OK ? CLI_OK : fail(s);
}

int tessel_cmd_audit(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "verify") != 0)
        return cli_error(CLI_USAGE, "audit: usage: tessel audit verify RUN_DIR [--pubkey FILE]");
    opts o;
    int rc = parse_opts("audit verify", argc - 1, argv + 1, 1, " --pubkey ", &o);
    if (rc != CLI_OK) return rc;
    if (o.n_pos != 1) return cli_error(CLI_USAGE, "audit verify: needs one run directory");
    ts_audit_report r;
    ts_status s = ts_audit_verify(o.pos[0], o.pubkey, &r);
    if (s != TS_OK) return fail(s);
    printf("%s/audit.log: OK: %lld entries chained, %lld signed heads (%s), last signed at entry "
           "%lld, %d checkpoints anchor it\n",
           o.pos[0], (long long)r.entries, (long long)r.signed_heads,
           o.pubkey ? "signatures verified" : "signatures not checked: no --pubkey",
           (long long)r.last_signed_seq, r.checkpoints_anchored);
    /* The unsigned tail, visible: anyone who can write the log could have
     * appended it with a valid chain (docs/checkpoints.md). */
    if (r.signed_heads == 0)
        printf("unsigned log: no entry is signed (the run had no ckpt.sign_key): the chain alone "
               "protects its %lld entries, and anyone who can write the log could have appended "
               "to it\n",
               (long long)r.entries);
    else if (r.last_signed_seq < r.entries - 1)
        printf("unsigned tail: lines %lld-%lld (%s) come after the last signed head: the chain "
               "alone protects them, and anyone who can write the log could have appended "
               "them\n",
               (long long)r.last_signed_seq + 2, (long long)r.entries, r.unsigned_events);
    if (r.signed_over[0])
        printf("note: runs that signed this log opened it over entries nobody had signed (a run "
               "killed before it signed, or entries appended by hand); their \"config\" or "
               "\"restart\" "
               "entries record it: %s\n",
               r.signed_over);
    if (r.newest_checkpoint[0] && r.signed_heads > 0 && r.newest_logged_seq > r.last_signed_seq)
        printf("warning: the newest checkpoint %s is logged at line %lld, after the last signed "
               "head: no signature covers it (its run was killed before signing, and resuming "
               "it signs; or the entries were forged)\n",
               r.newest_checkpoint, (long long)r.newest_logged_seq + 1);
    return CLI_OK;
}

int tessel_cmd_export(int argc, char **argv) {
    for (int i = 0; i < argc; i++) /* --onnx, --triton: tools/onnx_export.c */
        if (!strncmp(argv[i], "--onnx", 6) || !strncmp(argv[i], "--triton", 8))
            return tessel_cmd_export_onnx(argc, argv);
    if (tessel_export_is_peft(argc, argv)) return tessel_cmd_export_peft(argc, argv);
    opts o;
    int rc = parse_opts("export", argc, argv, 1, " --safetensors --pubkey --fp8 ", &o);
    if (rc != CLI_OK) return rc;
    if (o.n_pos != 1 || !o.safetensors)
        return cli_error(CLI_USAGE, "export: usage: tessel export CKPT --safetensors FILE");
    ts_dtype fp8 = !o.fp8                   ? TS_F32
                   : !strcmp(o.fp8, "e4m3") ? TS_F8E4M3
                   : !strcmp(o.fp8, "e5m2") ? TS_F8E5M2
                                            : TS_DTYPE_COUNT;
    if (fp8 == TS_DTYPE_COUNT)
        return cli_error(CLI_USAGE, "export: --fp8 must be e4m3 or e5m2, got '%s'", o.fp8);
    ts_ckpt *c;
    ts_status s = ts_ckpt_open(o.pos[0], o.pubkey, NULL, &c);
    if (s == TS_OK)
        s = o.fp8 ? ts_quant_export_safetensors(c, o.safetensors, fp8)
                  : ts_ckpt_export_safetensors(c, o.safetensors);
    if (s == TS_OK) {
        ts_ckpt_info in;
        ts_ckpt_get_info(c, &in);
        printf("wrote %s: the parameters of %s (step %lld)%s%s\n", o.safetensors, in.dir,
               (long long)in.step, o.fp8 ? ", float weights as FP8 " : "", o.fp8 ? o.fp8 : "");
    }
    ts_ckpt_close(c);
    return s == TS_OK ? CLI_OK : fail(s);
}
