/* The checkpoint path of the safetensors writer (ts_st_writer_save_with):
 * every byte of the file reaches the callback, in file order, in pieces of
 * at most the chunk size, tagged with its tensor; the SHA-256 of those
 * pieces is the SHA-256 of the file; the file reads back bit for bit.
 * Both ways of writing are covered: direct I/O (files of 4 MiB and more,
 * where the file system allows it) with a tail that is not a whole block,
 * and the page cache (small files, and tmpfs, which refuses O_DIRECT). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include "check.h"
#include "ckpt/safetensors.h"
#include "core/crc32c.h"
#include "core/sha256.h"

#define NT 3

typedef struct seen {
    ts_sha256 sha;
    uint32_t crc[NT];
    uint64_t bytes, header_bytes, tensor_bytes[NT];
    size_t max_piece;
    int last_tensor, out_of_order;
} seen;

static void piece(void *user, int tensor, const void *data, size_t n) {
    seen *s = user;
    ts_sha256_update(&s->sha, data, n);
    if (n > s->max_piece) s->max_piece = n;
    if (tensor < s->last_tensor || tensor >= NT) s->out_of_order++;
    s->last_tensor = tensor;
    if (tensor < 0) {
        s->header_bytes += n;
    } else {
        s->crc[tensor] = ts_crc32c(s->crc[tensor], data, n);
        s->tensor_bytes[tensor] += n;
    }
    s->bytes += n;
}

/* Fraction of the file's pages in the page cache (-1 if unknown). */
static double resident(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    void *m = n > 0 ? mmap(NULL, (size_t)n, PROT_READ, MAP_SHARED, fileno(f), 0) : MAP_FAILED;
    fclose(f);
    if (m == MAP_FAILED) return -1;
    size_t pages = ((size_t)n + 4095) / 4096, in = 0;
    unsigned char *v = malloc(pages);
    double r = -1;
    if (v && mincore(m, (size_t)n, v) == 0) {
        for (size_t i = 0; i < pages; i++) in += v[i] & 1;
        r = (double)in / (double)pages;
    }
    free(v);
    munmap(m, (size_t)n);
    return r;
}

/* ext4, xfs, btrfs: file systems where O_DIRECT works. */
static int direct_fs(const char *dir) {
    struct statfs sf;
    if (statfs(dir, &sf) != 0) return 0;
    return sf.f_type == 0xEF53 || sf.f_type == 0x58465342 || sf.f_type == 0x9123683E;
}

/* Tensors of `scale` * (1 MiB + odd) floats, written to dir/name. */
static void round_trip(const char *dir, const char *name, size_t scale) {
    int64_t dims[NT][2] = {
        {(int64_t)(scale * 262144 + 3), 1}, {7, 5}, {(int64_t)(scale * 70001), 2}};
    float *data[NT];
    uint32_t want_crc[NT];
    ts_st_writer *w;
    CHECK_OK(ts_st_writer_new(&w));
    for (int i = 0; i < NT; i++) {
        size_t n = (size_t)(dims[i][0] * dims[i][1]);
        data[i] = malloc(n * sizeof(float));
        for (size_t k = 0; k < n; k++) data[i][k] = (float)(k * 7 + (size_t)i) * 0.25f;
        want_crc[i] = ts_crc32c(0, data[i], n * sizeof(float));
        char tn[16];
        snprintf(tn, sizeof tn, "t%d", i);
        CHECK_OK(ts_st_writer_add(w, tn, TS_F32, 2, dims[i], data[i]));
    }
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    seen s = {.last_tensor = -1};
    CHECK_OK(ts_sha256_begin(&s.sha, path));
    size_t chunk = 100000; /* not a divisor of anything */
    CHECK_OK(ts_st_writer_save_with(w, path, chunk, piece, &s));
    /* Written around the page cache: hardly any of it is cached. */
    double res = resident(path);
    if (scale > 0 && direct_fs(dir))
        CHECK(res >= 0 && res < 0.1,
              "%s: %.0f %% of the file in the page cache after a direct write", path, 100 * res);
    char got[65], file_sha[65];
    ts_sha256_end(&s.sha, got);
    int64_t size = -1;
    CHECK_OK(ts_sha256_path(path, file_sha, &size));
    CHECK(!strcmp(got, file_sha), "%s: SHA-256 of the pieces %s = of the file %s", path, got,
          file_sha);
    CHECK(size == (int64_t)s.bytes, "%s: file of %lld bytes, pieces %llu", path, (long long)size,
          (unsigned long long)s.bytes);
    CHECK(size % 4096 != 0, "%s: the length is not a whole number of blocks (%lld)", path,
          (long long)size);
    CHECK(s.max_piece <= chunk && !s.out_of_order, "pieces <= chunk (%zu), in file order",
          s.max_piece);
    CHECK(s.header_bytes >= 8 && s.header_bytes % 8 == 0, "header %llu bytes",
          (unsigned long long)s.header_bytes);
    ts_st_file *f;
    CHECK_OK(ts_st_open(path, &f));
    for (int i = 0; i < NT && f; i++) {
        ts_st_tensor t;
        size_t bytes = (size_t)(dims[i][0] * dims[i][1]) * sizeof(float);
        CHECK_OK(ts_st_get(f, i, &t));
        CHECK(s.crc[i] == want_crc[i] && s.tensor_bytes[i] == bytes, "tensor %d: CRC of its pieces",
              i);
        CHECK(t.bytes == bytes && !memcmp(t.data, data[i], bytes), "tensor %d reads back", i);
    }
    ts_st_close(f);
    CHECK(access(path, F_OK) == 0 && unlink(path) == 0, "cleanup");
    for (int i = 0; i < NT; i++) free(data[i]);
    ts_st_writer_free(w);
}

int main(void) {
    char dir[] = "/tmp/tessel-st-stream-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    round_trip(dir, "big.safetensors", 3);   /* ~5 MiB: direct I/O where allowed */
    round_trip(dir, "small.safetensors", 0); /* < 4 MiB: the page cache */
    rmdir(dir);
    char shm[] = "/dev/shm/tessel-st-stream-XXXXXX";
    if (mkdtemp(shm)) { /* tmpfs: O_DIRECT refused, page cache */
        round_trip(shm, "big.safetensors", 3);
        rmdir(shm);
    }
    return check_summary("st_stream");
}
