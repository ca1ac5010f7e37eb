/* The checkpoint write pipeline (src/ckpt/pipe.c) and its O_DIRECT /
 * page-cache choice (src/ckpt/iomode.c): files hold exactly the parts'
 * bytes in both modes (across buffer boundaries, from several threads at
 * once, and from a file's cursor handed between threads a piece at a
 * time), every byte reaches the piece callback in file order, a link
 * planted as the final name is refused by name, and the choice is
 * measured once, cached on disk and read back by a new process. A whole
 * checkpoint written both ways has the same shard bytes. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "ckpt/pipe.h"
#include "core/crc32c.h"
#include "tessel/ckpt.h"

static char root[256];

static void rm_rf(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = b && fread(b, 1, (size_t)len, f) == (size_t)len ? (size_t)len : 0;
    fclose(f);
    return b;
}

typedef struct seen {
    uint32_t crc; /* over every piece, in the order given */
    uint64_t bytes;
    int bad_order; /* a piece of tensor k after one of tensor k+1 */
    int last_tensor;
} seen;

static void on_piece(void *user, int tensor, const void *data, size_t n) {
    seen *s = user;
    s->crc = ts_crc32c(s->crc, data, n);
    s->bytes += n;
    if (tensor < s->last_tensor) s->bad_order = 1;
    s->last_tensor = tensor;
}

typedef struct job {
    ck_pipe *p;
    int dirfd;
    const char *dir;
    int first; /* files first, first + 2 */
    const unsigned char *data;
    ts_status st;
    seen s[2];
} job;

/* File k: parts of sizes that cross CK_CHUNK and CK_PIECE boundaries and
 * a last partial block (O_DIRECT pads it, then cuts the file). */
static int parts_of(int k, const unsigned char *data, ck_part *pt) {
    size_t a = 13 + (size_t)k * 7, b = CK_CHUNK + 12345 + (size_t)k * 4096, c = 3;
    pt[0] = (ck_part){data, a, -1};
    pt[1] = (ck_part){data + a, b, 0};
    pt[2] = (ck_part){data + a + b, c, 1};
    pt[3] = (ck_part){data + 5, k == 3 ? 0 : CK_PIECE * 3 + 1, 2};
    return 4;
}

static void *writer(void *arg) {
    job *j = arg;
    for (int i = 0; i < 2 && j->st == TS_OK; i++) {
        int k = j->first + 2 * i;
        char name[64], shown[400];
        snprintf(name, sizeof name, "f%d.bin", k);
        snprintf(shown, sizeof shown, "%s/%s", j->dir, name);
        ck_part pt[4];
        int n = parts_of(k, j->data, pt);
        j->s[i] = (seen){0, 0, 0, -1};
        uint64_t bytes = 0;
        j->st = ck_pipe_file(j->p, j->dirfd, name, shown, pt, n, on_piece, &j->s[i], &bytes);
        uint64_t want = 0;
        for (int q = 0; q < n; q++) want += pt[q].bytes;
        CHECK(bytes == want, "file %d: %llu bytes reported, %llu given", k,
              (unsigned long long)bytes, (unsigned long long)want);
    }
    return NULL;
}

static void test_pipe(ck_io_mode mode) {
    char dir[400];
    snprintf(dir, sizeof dir, "%s/pipe-%s", root, ck_io_mode_name(mode));
    CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    size_t total = 3 * CK_CHUNK;
    unsigned char *data = malloc(total);
    unsigned x = 12345;
    for (size_t i = 0; i < total; i++) data[i] = (unsigned char)rand_r(&x);
    ck_pipe *p;
    CHECK_OK(ck_pipe_new(mode, 2, 4, &p));
    job jobs[2] = {{p, dfd, dir, 0, data, TS_OK, {{0}}}, {p, dfd, dir, 1, data, TS_OK, {{0}}}};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, writer, &jobs[1]) == 0, "thread");
    writer(&jobs[0]);
    pthread_join(th, NULL);
    CHECK_OK(jobs[0].st);
    CHECK_OK(jobs[1].st);
    CHECK_OK(ck_pipe_finish(p));
    ck_pipe_free(p);
    for (int k = 0; k < 4; k++) {
        char path[500];
        snprintf(path, sizeof path, "%s/f%d.bin", dir, k);
        ck_part pt[4];
        int n = parts_of(k, data, pt);
        size_t len = 0, want = 0;
        unsigned char *got = read_all(path, &len);
        uint32_t crc = 0;
        int same = got != NULL;
        for (int q = 0; q < n; q++) {
            same =
                same && want + pt[q].bytes <= len && !memcmp(got + want, pt[q].data, pt[q].bytes);
            crc = ts_crc32c(crc, pt[q].data, pt[q].bytes);
            want += pt[q].bytes;
        }
        CHECK(same && len == want, "%s mode, file %d: %zu bytes, want %zu, same bytes %d",
              ck_io_mode_name(mode), k, len, want, same);
        const seen *s = &jobs[k % 2].s[k / 2];
        CHECK(s->crc == crc && s->bytes == want && !s->bad_order,
              "file %d: the callback saw %llu bytes (crc %08x, want %08x), in order %d", k,
              (unsigned long long)s->bytes, s->crc, crc, !s->bad_order);
        free(got);
        snprintf(path, sizeof path, "%s/f%d.bin.tmp", dir, k);
        CHECK(access(path, F_OK) != 0, "no temporary name is left: %s", path);
    }

    /* A link planted as the final name: refused, named, not followed. */
    char target[500], link[500];
    snprintf(target, sizeof target, "%s/target", dir);
    snprintf(link, sizeof link, "%s/linked.bin", dir);
    FILE *f = fopen(target, "w");
    if (f) fclose(f);
    CHECK(symlink(target, link) == 0, "symlink");
    CHECK_OK(ck_pipe_new(mode, 1, 2, &p));
    ck_part one = {data, 100000, 0};
    CHECK_OK(ck_pipe_file(p, dfd, "linked.bin", link, &one, 1, NULL, NULL, NULL));
    CHECK(ck_pipe_finish(p) == TS_ERR_IO, "a link as the final name is refused");
    CHECK(strstr(ts_last_error(), "linked.bin is a symbolic link") != NULL, "%s", ts_last_error());
    ck_pipe_free(p);
    struct stat st;
    CHECK(stat(target, &st) == 0 && st.st_size == 0, "the link's target is untouched");
    close(dfd);
    free(data);
}

/* One file's cursor advanced by two threads in turns, a piece each (the
 * handover a background save makes when the waiting thread takes over):
 * the file and the callback see the same bytes, in order, as from one. */
typedef struct turns {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ck_pipe *p;
    ck_pfile *c;
    int turn, done, moves[2];
    uint64_t bytes;
} turns;

static void take_turns(turns *t, int me) {
    pthread_mutex_lock(&t->mu);
    while (!t->done) {
        if (t->turn != me) {
            pthread_cond_wait(&t->cv, &t->mu);
            continue;
        }
        pthread_mutex_unlock(&t->mu);
        int done = 0;
        CHECK_OK(ck_pipe_advance(t->p, t->c, 1, &done, &t->bytes));
        pthread_mutex_lock(&t->mu);
        t->moves[me]++;
        t->done = done;
        t->turn = !me;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
}

static void *other_turns(void *arg) {
    take_turns(arg, 1);
    return NULL;
}

static void test_handover(ck_io_mode mode) {
    char dir[400], path[500];
    snprintf(dir, sizeof dir, "%s/turns-%s", root, ck_io_mode_name(mode));
    CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    size_t total = 3 * CK_CHUNK;
    unsigned char *data = malloc(total);
    unsigned x = 777;
    for (size_t i = 0; i < total; i++) data[i] = (unsigned char)rand_r(&x);
    ck_part pt[4];
    int n = parts_of(1, data, pt);
    seen s = {0, 0, 0, -1};
    turns t = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0, 0, {0, 0}, 0};
    CHECK_OK(ck_pipe_new(mode, 2, 3, &t.p));
    snprintf(path, sizeof path, "%s/f.bin", dir);
    CHECK_OK(ck_pipe_open(t.p, dfd, "f.bin", path, pt, n, on_piece, &s, &t.c));
    pthread_t th;
    CHECK(pthread_create(&th, NULL, other_turns, &t) == 0, "thread");
    take_turns(&t, 0);
    pthread_join(th, NULL);
    CHECK_OK(ck_pipe_finish(t.p));
    ck_pipe_free(t.p);
    size_t len = 0, want = 0;
    unsigned char *got = read_all(path, &len);
    uint32_t crc = 0;
    int same = got != NULL;
    for (int q = 0; q < n; q++) {
        same = same && want + pt[q].bytes <= len && !memcmp(got + want, pt[q].data, pt[q].bytes);
        crc = ts_crc32c(crc, pt[q].data, pt[q].bytes);
        want += pt[q].bytes;
    }
    CHECK(same && len == want && t.bytes == want,
          "%s mode, handed over: %zu bytes (reported %llu), want %zu, same bytes %d",
          ck_io_mode_name(mode), len, (unsigned long long)t.bytes, want, same);
    CHECK(s.crc == crc && s.bytes == want && !s.bad_order,
          "handed over: the callback saw %llu bytes (crc %08x, want %08x), in order %d",
          (unsigned long long)s.bytes, s.crc, crc, !s.bad_order);
    CHECK(t.moves[0] > 2 && t.moves[1] > 2, "both threads advanced it (%d, %d moves)", t.moves[0],
          t.moves[1]);
    free(got);
    close(dfd);
    free(data);
}

/* A process that asks once it is told to (a byte on `go`), so that it
 * starts with nothing remembered: what it finds is the parent's cache file. */
typedef struct later {
    pid_t pid;
    int go;
} later;

static later ask_later(const char *dir, const char *want) {
    int fds[2];
    later l = {-1, -1};
    if (pipe(fds) != 0) return l;
    l.pid = fork();
    if (l.pid == 0) {
        close(fds[1]);
        char c;
        if (read(fds[0], &c, 1) != 1) _exit(2);
        const char *mode = NULL, *src = NULL;
        int ok = ts_ckpt_io_mode(dir, &mode, &src) == TS_OK && !strcmp(src, want);
        if (!ok) fprintf(stderr, "child: source %s\n", src ? src : ts_last_error());
        _exit(ok ? 0 : 1);
    }
    close(fds[0]);
    l.go = fds[1];
    return l;
}

static int answer(later l) {
    if (l.pid < 0 || write(l.go, "g", 1) != 1) return 0;
    close(l.go);
    int st = 0;
    waitpid(l.pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_choice(void) {
    char cache[400], dir[400], file[500];
    snprintf(cache, sizeof cache, "%s/cache", root);
    snprintf(dir, sizeof dir, "%s/choice", root);
    snprintf(file, sizeof file, "%s/tessel/ckpt-io.txt", cache);
    CHECK(mkdir(dir, 0755) == 0, "mkdir");
    setenv("XDG_CACHE_HOME", cache, 1);
    unsetenv("TESSEL_CKPT_IO");
    unsetenv("TESSEL_CKPT_IO_CACHE");
    later child = ask_later(dir, "cache");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    ck_io_mode m = 0;
    const char *src = NULL;
    CHECK_OK(ck_io_peek(dfd, dir, &m, &src));
    CHECK(src && !strcmp(src, "default") && access(file, F_OK) != 0,
          "a small save neither measures nor caches: %s", src ? src : "(null)");
    const char *mode = NULL;
    CHECK_OK(ts_ckpt_io_mode(dir, &mode, &src));
    CHECK(src && !strcmp(src, "probe"), "first: measured (%s)", src ? src : "(null)");
    CHECK(mode && (!strcmp(mode, "direct") || !strcmp(mode, "buffered")), "mode %s", mode);
    size_t n = 0;
    unsigned char *txt = read_all(file, &n);
    CHECK(txt && n > 0, "the cache file %s is written", file);
    if (txt) {
        txt[n] = 0;
        CHECK(strstr((char *)txt, mode) && strstr((char *)txt, "direct=") &&
                  strstr((char *)txt, "buffered="),
              "the cache names the choice and both speeds: %s", (char *)txt);
    }
    free(txt);
    DIR *d = opendir(dir);
    int left = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        left += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    CHECK(left == 0, "the probe leaves no file behind (%d)", left);
    CHECK_OK(ts_ckpt_io_mode(dir, &mode, &src));
    CHECK(!strcmp(src, "process"), "second: remembered in the process (%s)", src);
    CHECK(answer(child), "a new process reads the cache file");
    setenv("TESSEL_CKPT_IO", "buffered", 1);
    CHECK_OK(ts_ckpt_io_mode(dir, &mode, &src));
    CHECK(!strcmp(mode, "buffered") && !strcmp(src, "env"), "forced: %s from %s", mode, src);
    setenv("TESSEL_CKPT_IO", "fast", 1);
    CHECK(ts_ckpt_io_mode(dir, &mode, &src) == TS_ERR_INVALID, "a bad value is refused");
    CHECK(strstr(ts_last_error(), "TESSEL_CKPT_IO='fast'") != NULL, "%s", ts_last_error());
    unsetenv("TESSEL_CKPT_IO");
    close(dfd);
}

/* RUN + suffix's only step-* directory. */
static void ck_step(char *out, size_t n, const char *run, const char *suffix) {
    char dir[300];
    snprintf(dir, sizeof dir, "%.250s%.8s", run, suffix);
    snprintf(out, n, "%.300s/none", dir);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, "step-", 5) && !strstr(e->d_name, ".tmp"))
            snprintf(out, n, "%.300s/%.100s", dir, e->d_name);
    if (d) closedir(d);
}

/* A checkpoint of a small MLP written both ways: the same shard bytes. */
static void test_same_bytes(void) {
    ts_mlp_config mc = {64, 0, 0, 256, 1024, 2, 1, 0, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.95, 1e-8, 0.1);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    if (!p) return;
    const char *modes[2] = {"direct", "buffered"};
    char run[2][300];
    for (int i = 0; i < 2; i++) {
        snprintf(run[i], sizeof run[i], "%s/same-%s", root, modes[i]);
        setenv("TESSEL_CKPT_IO", modes[i], 1);
        CHECK_OK(ts_ckpt_save(p, run[i], NULL, NULL));
        /* and in the background, from the snapshot */
        ts_ckpt_saver *sv;
        char bg[420];
        snprintf(bg, sizeof bg, "%.400s-bg", run[i]);
        CHECK_OK(ts_ckpt_saver_new(bg, p, NULL, &sv));
        CHECK_OK(ts_ckpt_saver_begin(sv, p, NULL));
        CHECK_OK(ts_ckpt_saver_wait(sv));
        ts_ckpt_saver_free(sv);
    }
    unsetenv("TESSEL_CKPT_IO");
    char step[500];
    ck_step(step, sizeof step, run[0], "");
    const char *other[3] = {"-bg", "", "-bg"};
    int files = 0;
    for (int k = 0; k < 3; k++) {
        char b[600];
        ck_step(b, sizeof b, run[k == 0 ? 0 : 1], other[k]);
        DIR *d = opendir(step);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (!strstr(e->d_name, ".safetensors")) continue;
            char fa[900], fb[900];
            snprintf(fa, sizeof fa, "%s/%s", step, e->d_name);
            snprintf(fb, sizeof fb, "%s/%s", b, e->d_name);
            size_t na = 0, nb = 0;
            unsigned char *x = read_all(fa, &na), *y = read_all(fb, &nb);
            CHECK(x && y && na == nb && na > 0 && !memcmp(x, y, na), "%s and %s differ", fa, fb);
            files++;
            free(x);
            free(y);
        }
        if (d) closedir(d);
    }
    CHECK(files >= 2, "compared %d shard files", files);
    ts_ckpt *ck;
    CHECK_OK(ts_ckpt_open(run[1], NULL, NULL, &ck));
    ts_ckpt_close(ck);
    ts_plan_free(p);
    ts_graph_free(g);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/tessel-ckpt-pipe-%d", (int)getpid());
    rm_rf(root);
    CHECK(mkdir(root, 0755) == 0, "mkdir %s", root);
    test_pipe(CK_IO_DIRECT);
    test_pipe(CK_IO_BUFFERED);
    test_handover(CK_IO_DIRECT);
    test_handover(CK_IO_BUFFERED);
    test_choice();
    test_same_bytes();
    rm_rf(root);
    return check_summary("ckpt_pipe");
}
