/* Checkpoints: CRC-32C and SHA-256 against published vectors, keys,
 * save/open/verify, bit-exact resume into a fresh plan (GPT with dropout,
 * AdamW, warm-up + cosine schedule), refusal of tampered or mismatched
 * checkpoints without touching the plan, retention and gc, export. */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "ckpt/safetensors.h"
#include "core/crc32c.h"
#include "tessel/ckpt.h"

static char run_root[256];

static void path_of(char *out, size_t n, const char *rel) {
    snprintf(out, n, "%s/%s", run_root, rel);
}

static void rm_rf(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

/* ---- CRC-32C and SHA-256 ---------------------------------------------------- */

static void test_crc32c(void) {
    CHECK(ts_crc32c(0, "123456789", 9) == 0xE3069283u, "crc32c check value");
    CHECK(ts_crc32c_table(0, "123456789", 9) == 0xE3069283u, "table crc32c check value");
    unsigned char buf[32];
    memset(buf, 0, 32);
    CHECK(ts_crc32c(0, buf, 32) == 0x8A9136AAu, "RFC 3720: 32 zero bytes");
    memset(buf, 0xFF, 32);
    CHECK(ts_crc32c(0, buf, 32) == 0x62A8AB43u, "RFC 3720: 32 0xFF bytes");
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
    CHECK(ts_crc32c(0, buf, 32) == 0x46DD794Eu, "RFC 3720: ascending bytes");
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
    CHECK(ts_crc32c(0, buf, 32) == 0x113FDB5Cu, "RFC 3720: descending bytes");

    /* Hardware and table agree on every alignment and split, below and
     * above the length the three-stream loop takes (3 x 4096 bytes). */
    enum { MAXN = 40007 };
    unsigned char *data = malloc(MAXN + 8);
    unsigned seed = 7;
    for (int i = 0; i < MAXN + 8; i++) data[i] = (unsigned char)rand_r(&seed);
    int bad = 0;
    const size_t lens[] = {4099, 3 * 4096, 3 * 4096 + 7, MAXN};
    for (int l = 0; l < 4; l++)
        for (int off = 0; off < 8; off++) {
            const size_t N = lens[l];
            uint32_t whole = ts_crc32c_table(0, data + off, N);
            bad += ts_crc32c(0, data + off, N) != whole;
            for (int trial = 0; trial < 20; trial++) {
                size_t cut = (size_t)rand_r(&seed) % N;
                uint32_t c = ts_crc32c(0, data + off, cut);
                c = ts_crc32c(c, data + off + cut, N - cut);
                bad += c != whole;
            }
        }
    CHECK(bad == 0, "crc32c: %d lengths or splits differ from the table version", bad);
    free(data);
}

static void test_sha256(void) {
    char p[300], hex[65];
    path_of(p, sizeof p, "abc.txt");
    FILE *f = fopen(p, "wb");
    fputs("abc", f);
    fclose(f);
    CHECK_OK(ts_sha256_file(p, hex));
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
          "sha256(abc) = %s", hex);
}

static void test_keys(const char *sk, const char *pk) {
    CHECK_OK(ts_ckpt_keygen(sk, pk));
    struct stat st;
    CHECK(stat(sk, &st) == 0 && (st.st_mode & 0777) == 0600, "private key mode %o",
          (unsigned)(st.st_mode & 0777));
    CHECK(ts_ckpt_keygen(sk, pk) == TS_ERR_IO, "keygen must not overwrite a key");
    CHECK(strstr(ts_last_error(), pk) != NULL, "keygen error names the file: %s", ts_last_error());
    /* The public half derived from the private key file is the .pub's key. */
    char derived[73], text[200] = "";
    CHECK_OK(ts_ckpt_public_key_of(sk, derived));
    FILE *f = fopen(pk, "r");
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        fclose(f);
    }
    const char *nl = strchr(text, '\n');
    CHECK(!strncmp(derived, "ed25519:", 8) && nl && !strncmp(nl + 1, derived + 8, 64),
          "derived %s, file %s", derived, text);
    CHECK(ts_ckpt_public_key_of(pk, derived) != TS_OK, "a public key file is not a private key");
}

/* ---- training helpers ----------------------------------------------------------- */

static ts_graph *gpt_graph(ts_val *loss) {
    ts_gpt_config gc = {2, 16, 64, 32, 2, 2, 0.1};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_gpt(g, &gc, &m));
    *loss = m.loss;
    return g;
}

static ts_plan *compile(ts_graph *g, ts_val loss, uint64_t seed) {
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01);
    spec.clip_grad_norm = 1.0;
    spec.schedule.kind = TS_LR_COSINE;
    spec.schedule.warmup_steps = 5;
    spec.schedule.total_steps = 20;
    spec.schedule.min_lr = 1e-4;
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = seed;
    opt.threads = 1; /* tests/unit/determinism.c covers thread counts */
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &opt, &p));
    return p;
}

/* The batch of step s (1-based) depends on s only, as a resumable loader's. */
static void run_to(ts_plan *p, int64_t last_step) {
    int64_t tok[32], tgt[32];
    while (ts_plan_step_count(p) < last_step) {
        uint64_t s = (uint64_t)ts_plan_step_count(p) + 1;
        for (int i = 0; i < 32; i++) {
            tok[i] = (int64_t)((s * 2654435761u + (uint64_t)i * 40503u) >> 7) % 64;
            tgt[i] = (int64_t)((s * 97u + (uint64_t)i * 31u) % 64);
        }
        ts_plan_set_input(p, "tokens", tok, sizeof tok);
        ts_plan_set_input(p, "targets", tgt, sizeof tgt);
        if (ts_plan_step(p) != TS_OK) {
            CHECK(0, "step: %s", ts_last_error());
            return;
        }
    }
}

static unsigned char *snapshot(const ts_plan *p, size_t *n) {
    *n = ts_plan_snapshot_bytes(p);
    unsigned char *b = malloc(*n);
    CHECK_OK(ts_plan_snapshot(p, b, *n));
    return b;
}

static int file_count(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

/* ---- tests -------------------------------------------------------------------------- */

static void test_persistent(ts_plan *p) {
    int n = ts_plan_persistent_count(p), np = ts_plan_param_count(p), ns = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        ts_persistent pv;
        CHECK_OK(ts_plan_persistent(p, i, &pv));
        ns += pv.is_state;
        CHECK(pv.is_state == (i >= np), "params come first (%s)", pv.name);
        total += pv.bytes;
        /* The snapshot holds each value where snapshot_off says. */
        if (i == n - 1) {
            size_t sb;
            unsigned char *snap = snapshot(p, &sb), *v = malloc(pv.bytes);
            CHECK_OK(ts_plan_read(p, pv.name, v, pv.bytes));
            CHECK(pv.snapshot_off + pv.bytes <= sb && !memcmp(snap + pv.snapshot_off, v, pv.bytes),
                  "snapshot_off of %s", pv.name);
            free(v);
            free(snap);
        }
    }
    CHECK(ns == 2 * np, "AdamW: two state values per parameter (%d state, %d params)", ns, np);
    CHECK(total <= ts_plan_snapshot_bytes(p), "snapshot holds every value");
}

/* 20 steps straight vs 10 + save + load into a fresh plan + 10: byte-identical
 * parameters and optimizer state. */
static void test_resume(ts_graph *g, ts_val loss, const char *sk, const char *pk) {
    ts_plan *a = compile(g, loss, 42);
    run_to(a, 20);
    size_t na;
    unsigned char *ref = snapshot(a, &na);

    char run[300];
    path_of(run, sizeof run, "resume");
    ts_plan *b = compile(g, loss, 42);
    run_to(b, 10);
    ts_ckpt_options o = ts_ckpt_options_default();
    o.sign_key = sk;
    ts_ckpt_saver *sv;
    CHECK_OK(ts_ckpt_saver_new(run, b, &o, &sv));
    const char cfg[] = "model: gpt\n";
    ts_ckpt_data_file df = {"data/train.bin", "00ff"};
    ts_ckpt_meta meta = {cfg, sizeof cfg - 1, &df, 1, 320, 1};
    CHECK_OK(ts_ckpt_saver_begin(sv, b, &meta));
    run_to(b, 12); /* training goes on while the save runs: the snapshot is unaffected */
    CHECK_OK(ts_ckpt_saver_wait(sv));
    ts_ckpt_save_stats st;
    CHECK_OK(ts_ckpt_saver_stats(sv, &st));
    CHECK(st.step == 10 && !strcmp(st.dir, "step-00000010"), "stats: step %lld dir %s",
          (long long)st.step, st.dir);
    /* Linux reports the writers' CPU time (schedstat); waiting may be 0. */
    CHECK((st.cpu_s > 0 || access("/proc/thread-self/schedstat", R_OK) != 0) && st.cpu_s < 60 &&
              st.cpu_wait_s >= 0,
          "writer CPU %g s, waited %g s", st.cpu_s, st.cpu_wait_s);
    ts_ckpt_saver_free(sv);
    ts_plan_free(b);

    ts_plan *c = compile(g, loss, 42);
    ts_ckpt *ck;
    /* Verified against the public half of the signing key itself. */
    char own[73];
    CHECK_OK(ts_ckpt_public_key_of(sk, own));
    CHECK_OK(ts_ckpt_open(run, own, NULL, &ck));
    ts_ckpt_close(ck);
    CHECK_OK(ts_ckpt_open(run, pk, NULL, &ck));
    if (ck) {
        ts_ckpt_info in;
        CHECK_OK(ts_ckpt_get_info(ck, &in));
        CHECK(in.step == 10 && in.seed == 42 && in.data_position == 320 && in.epoch == 1 &&
                  in.n_data_files == 1 && !strcmp(in.data_files[0].path, "data/train.bin") &&
                  in.is_signed && in.signature_ok && in.world_size == 1 &&
                  strlen(in.config_sha256) == 64,
              "info fields");
        CHECK(in.n_tensors == ts_plan_persistent_count(c), "every persistent value saved");
        CHECK_OK(ts_ckpt_restore(ck, c, NULL));
        ts_ckpt_close(ck);
    }
    CHECK(ts_plan_step_count(c) == 10, "step count restored: %lld",
          (long long)ts_plan_step_count(c));
    run_to(c, 20);
    size_t nc;
    unsigned char *got = snapshot(c, &nc);
    CHECK(na == nc && !memcmp(ref, got, na), "resumed run is byte-identical to the straight run");
    free(got);

    /* A run whose LR schedule or seed differ is not resumed silently. */
    ts_plan *d = compile(g, loss, 43);
    size_t nd;
    unsigned char *before = snapshot(d, &nd);
    CHECK(ts_ckpt_load(d, run, pk, NULL) == TS_ERR_INVALID, "seed mismatch refused");
    CHECK(strstr(ts_last_error(), "seed") != NULL, "message: %s", ts_last_error());
    unsigned char *after = snapshot(d, &nd);
    CHECK(!memcmp(before, after, nd) && ts_plan_step_count(d) == 0, "refused load wrote nothing");
    free(before);
    free(after);
    ts_plan_free(d);

    free(ref);
    ts_plan_free(a);
    ts_plan_free(c);
}

/* Copy a checkpoint directory so each tampering starts from a good one. */
static void copy_dir(const char *from, const char *to) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    CHECK(system(cmd) == 0, "%s", cmd);
}

static void flip_byte(const char *path, long off) {
    int fd = open(path, O_RDWR);
    unsigned char b = 0;
    if (off < 0) off += lseek(fd, 0, SEEK_END);
    CHECK(pread(fd, &b, 1, off) == 1, "read %s", path);
    b ^= 0x01;
    CHECK(pwrite(fd, &b, 1, off) == 1, "write %s", path);
    close(fd);
}

static void test_tamper(ts_graph *g, ts_val loss, const char *pk, const char *other_pk) {
    char run[300], good[400], bad[400], f[500];
    path_of(run, sizeof run, "resume");
    snprintf(good, sizeof good, "%s/step-00000010", run);
    snprintf(bad, sizeof bad, "%s/tampered", run_root);
    ts_plan *p = compile(g, loss, 42);
    size_t n;
    unsigned char *before = snapshot(p, &n);

    /* one flipped bit in the last tensor of a state shard */
    copy_dir(good, bad);
    snprintf(f, sizeof f, "%s/state-r0-000.safetensors", bad);
    flip_byte(f, -3);
    CHECK(ts_ckpt_load(p, bad, pk, NULL) == TS_ERR_FORMAT, "flipped byte detected");
    CHECK(strstr(ts_last_error(), "state-r0-000.safetensors") &&
              strstr(ts_last_error(), "tensor '"),
          "names file and tensor: %s", ts_last_error());

    /* a truncated manifest */
    copy_dir(good, bad);
    snprintf(f, sizeof f, "%s/manifest.json", bad);
    CHECK(truncate(f, 200) == 0, "truncate");
    CHECK(ts_ckpt_load(p, bad, pk, NULL) == TS_ERR_FORMAT, "truncated manifest detected");
    CHECK(strstr(ts_last_error(), "manifest.json") != NULL, "names manifest: %s", ts_last_error());

    /* an edited manifest (the step): the signature catches it */
    copy_dir(good, bad);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "sed -i 's/\"step\": 10,/\"step\": 11,/' '%s'", f);
    CHECK(system(cmd) == 0, "sed");
    CHECK(ts_ckpt_load(p, bad, pk, NULL) == TS_ERR_FORMAT, "edited manifest refused");
    CHECK(strstr(ts_last_error(), "signature") != NULL, "message: %s", ts_last_error());
    /* Without a key only hashes are checked, and the step edit passes them:
     * that is why resume takes a public key. */
    ts_ckpt *ck = NULL;
    CHECK_OK(ts_ckpt_open(bad, NULL, NULL, &ck));
    ts_ckpt_close(ck);

    /* a file that lost its tail */
    copy_dir(good, bad);
    snprintf(f, sizeof f, "%s/params-r0-000.safetensors", bad);
    struct stat st;
    stat(f, &st);
    CHECK(truncate(f, st.st_size - 100) == 0, "truncate shard");
    CHECK(ts_ckpt_load(p, bad, pk, NULL) == TS_ERR_FORMAT, "truncated shard detected");
    CHECK(strstr(ts_last_error(), "params-r0-000.safetensors") != NULL, "%s", ts_last_error());

    /* the wrong public key */
    CHECK(ts_ckpt_load(p, good, other_pk, NULL) == TS_ERR_FORMAT, "other key refused");
    CHECK(strstr(ts_last_error(), "signed by key") != NULL, "%s", ts_last_error());

    /* a different model: nothing is written, the first missing tensor is named */
    ts_mlp_config mc = {4, 0, 0, 8, 16, 1, 1, 1, 0};
    ts_graph *g2 = ts_graph_new();
    ts_model m2;
    CHECK_OK(ts_build_mlp(g2, &mc, &m2));
    ts_plan *q = compile(g2, m2.loss, 42);
    CHECK(ts_ckpt_load(q, good, pk, NULL) == TS_ERR_NOT_FOUND, "other model refused");
    CHECK(strstr(ts_last_error(), "net.0.weight") != NULL, "%s", ts_last_error());
    ts_plan_free(q);
    ts_graph_free(g2);

    unsigned char *after = snapshot(p, &n);
    CHECK(!memcmp(before, after, n) && ts_plan_step_count(p) == 0,
          "refused loads left the plan untouched");
    free(before);
    free(after);
    ts_plan_free(p);
    rm_rf(bad);
}

static void test_retention_and_export(ts_graph *g, ts_val loss) {
    char run[300], tmpdir[400];
    path_of(run, sizeof run, "retain");
    ts_plan *p = compile(g, loss, 5);
    ts_ckpt_options o = ts_ckpt_options_default();
    o.keep_last = 2;
    o.keep_every = 4;
    for (int s = 1; s <= 9; s++) {
        run_to(p, s);
        CHECK_OK(ts_ckpt_save(p, run, NULL, &o));
    }
    /* the newest 2 (9, 8) and the multiples of 4 (4, 8) */
    CHECK(file_count(run, "step-") == 3, "retention kept %d", file_count(run, "step-"));
    char name[500];
    snprintf(name, sizeof name, "%s/step-00000004", run);
    struct stat st;
    CHECK(stat(name, &st) == 0, "step 4 kept");

    /* saving a step that exists replaces it (resume from an older LATEST) */
    ts_plan_set_step(p, 8);
    CHECK_OK(ts_ckpt_save(p, run, NULL, &o));
    char latest[500];
    CHECK_OK(ts_ckpt_resolve(run, latest, sizeof latest));
    CHECK(strstr(latest, "step-00000008") != NULL, "LATEST -> %s", latest);

    /* leftovers of a crash are removed by gc and ignored by resolve */
    snprintf(tmpdir, sizeof tmpdir, "%s/step-00000012.tmp", run);
    mkdir(tmpdir, 0755);
    snprintf(name, sizeof name, "%s/params-r0-000.safetensors", tmpdir);
    FILE *f = fopen(name, "wb");
    fputs("partial", f);
    fclose(f);
    CHECK_OK(ts_ckpt_resolve(run, latest, sizeof latest));
    CHECK(strstr(latest, "step-00000008") != NULL, "temp dir ignored");
    int removed = 0;
    CHECK_OK(ts_ckpt_gc(run, 0, 0, &removed));
    CHECK(removed == 1 && stat(tmpdir, &st) != 0, "gc removed the temp dir (%d)", removed);

    /* export: parameters only, readable by the safetensors reader */
    ts_ckpt *ck;
    CHECK_OK(ts_ckpt_open(run, NULL, NULL, &ck));
    snprintf(name, sizeof name, "%s/weights.safetensors", run_root);
    CHECK_OK(ts_ckpt_export_safetensors(ck, name));
    ts_st_file *sf;
    CHECK_OK(ts_st_open(name, &sf));
    if (sf) {
        CHECK(ts_st_count(sf) == ts_plan_param_count(p), "export has %d tensors", ts_st_count(sf));
        ts_st_tensor t;
        const char *pname = ts_plan_param_name(p, 0);
        CHECK_OK(ts_st_find(sf, pname, &t));
        float *v = malloc(t.bytes);
        CHECK_OK(ts_ckpt_read(ck, pname, v, t.bytes));
        CHECK(!memcmp(v, t.data, t.bytes), "exported %s matches", pname);
        free(v);
        CHECK(ts_st_metadata(sf, "tessel_step") && !strcmp(ts_st_metadata(sf, "tessel_step"), "8"),
              "export metadata");
        ts_st_close(sf);
    }
    ts_ckpt_close(ck);
    ts_plan_free(p);
}

/* A tensor saved as chunks by several ranks (as a sharded run writes it):
 * w f32[4,6] as blocks {row, col, rows, cols}, each in its own file
 * "state-r<k>-000.safetensors" under the tensor's name. */
typedef struct block {
    int r0, c0, rows, cols;
} block;

static void write_chunked(const char *dir, const block *bl, int n, const float w[4][6]) {
    char path[500], *manifest = malloc(16384), files[4096] = "", chunks[4096] = "";
    mkdir(dir, 0755);
    for (int k = 0; k < n; k++) {
        float data[24];
        for (int i = 0; i < bl[k].rows; i++)
            for (int j = 0; j < bl[k].cols; j++)
                data[i * bl[k].cols + j] = w[bl[k].r0 + i][bl[k].c0 + j];
        int64_t dims[2] = {bl[k].rows, bl[k].cols};
        size_t bytes = sizeof(float) * (size_t)(bl[k].rows * bl[k].cols);
        ts_st_writer *wr;
        CHECK_OK(ts_st_writer_new(&wr));
        CHECK_OK(ts_st_writer_add(wr, "w", TS_F32, 2, dims, data));
        snprintf(path, sizeof path, "%s/state-r%d-000.safetensors", dir, k);
        CHECK_OK(ts_st_writer_save(wr, path));
        ts_st_writer_free(wr);
        char sha[65];
        CHECK_OK(ts_sha256_file(path, sha));
        struct stat st;
        stat(path, &st);
        size_t fl = strlen(files), cl = strlen(chunks);
        snprintf(files + fl, sizeof files - fl,
                 "%s{\"name\":\"state-r%d-000.safetensors\",\"rank\":%d,\"bytes\":%lld,"
                 "\"sha256\":\"%s\"}",
                 k ? "," : "", k, k, (long long)st.st_size, sha);
        snprintf(chunks + cl, sizeof chunks - cl,
                 "%s{\"file\":\"state-r%d-000.safetensors\",\"rank\":%d,\"offset\":[%d,%d],"
                 "\"shape\":[%d,%d],\"crc32c\":\"%08x\"}",
                 k ? "," : "", k, k, bl[k].r0, bl[k].c0, bl[k].rows, bl[k].cols,
                 ts_crc32c(0, data, bytes));
    }
    snprintf(manifest, 16384,
             "{\"format\":\"tessel-checkpoint\",\"format_version\":1,\"id\":\"x\",\"step\":3,"
             "\"time\":\"t\",\"tessel_version\":\"0\",\"config_sha256\":\"\",\"rng\":{\"seed\":"
             "\"0\"},\"data\":{\"files\":[],\"position\":0,\"epoch\":0},\"world\":{\"size\":%d},"
             "\"files\":[%s],\"tensors\":[{\"name\":\"w\",\"kind\":\"state\",\"dtype\":\"f32\","
             "\"shape\":[4,6],\"chunks\":[%s]}]}",
             n, files, chunks);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "wb");
    fputs(manifest, f);
    fclose(f);
    free(manifest);
}

static void test_chunks(void) {
    float w[4][6], got[4][6];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) w[i][j] = (float)(10 * i + j);
    char dir[300];
    path_of(dir, sizeof dir, "chunked");
    const block good[3] = {{0, 0, 2, 3}, {0, 3, 2, 3}, {2, 0, 2, 6}};
    write_chunked(dir, good, 3, w);
    ts_ckpt *c = NULL;
    CHECK_OK(ts_ckpt_open(dir, NULL, NULL, &c));
    if (c) {
        memset(got, 0, sizeof got);
        CHECK_OK(ts_ckpt_read(c, "w", got, sizeof got));
        CHECK(!memcmp(got, w, sizeof w), "three blocks assemble into the tensor");
        ts_ckpt_close(c);
    }
    rm_rf(dir);
    const block gap[2] = {{0, 0, 2, 3}, {2, 0, 2, 6}};
    write_chunked(dir, gap, 2, w);
    CHECK(ts_ckpt_open(dir, NULL, NULL, &c) == TS_ERR_FORMAT, "gap refused");
    CHECK(strstr(ts_last_error(), "'w'") && strstr(ts_last_error(), "chunks hold"), "%s",
          ts_last_error());
    rm_rf(dir);
    /* as many elements as the tensor, but rows 1 and 2 twice and 3 never */
    const block overlap[3] = {{0, 0, 2, 3}, {0, 3, 2, 3}, {1, 0, 2, 6}};
    write_chunked(dir, overlap, 3, w);
    CHECK(ts_ckpt_open(dir, NULL, NULL, &c) == TS_ERR_FORMAT, "overlap refused");
    CHECK(strstr(ts_last_error(), "overlap") != NULL, "%s", ts_last_error());
    rm_rf(dir);
}

int main(void) {
    snprintf(run_root, sizeof run_root, "/tmp/tessel-ckpt-test-%d", (int)getpid());
    rm_rf(run_root);
    mkdir(run_root, 0755);
    char sk[300], pk[300], sk2[300], pk2[300];
    path_of(sk, sizeof sk, "run.key");
    path_of(pk, sizeof pk, "run.pub");
    path_of(sk2, sizeof sk2, "other.key");
    path_of(pk2, sizeof pk2, "other.pub");

    test_crc32c();
    test_sha256();
    test_keys(sk, pk);
    CHECK_OK(ts_ckpt_keygen(sk2, pk2));

    ts_val loss;
    ts_graph *g = gpt_graph(&loss);
    ts_plan *p = compile(g, loss, 42);
    if (p) test_persistent(p);
    ts_plan_free(p);
    test_resume(g, loss, sk, pk);
    test_tamper(g, loss, pk, pk2);
    test_retention_and_export(g, loss);
    test_chunks();
    ts_graph_free(g);

    if (check_failed == 0) rm_rf(run_root);
    return check_summary("ckpt");
}
