/* `tessel train` on mapped .npy and IDX inputs: the same images written as
 * a plain IDX file (mapped), a gzip IDX file (inflated as bytes) and a
 * .npy file of the f32 values byte / 255 (mapped) train to identical
 * checkpoints, with the same split and shuffled order; the run of a mapped
 * 12 MB IDX file stays below the peak resident memory that reading it
 * whole gives (the file and its 47 MB f32 copy on top); a NaN in a mapped .npy file is refused with
 * exit 2, naming the file and the element. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <zlib.h>
#include "check.h"
#include "e2e.h"

enum { N = 15000, P = 784 };

static void be32(uint8_t *p, uint32_t v) {
    for (int b = 0; b < 4; b++) p[b] = (uint8_t)(v >> (24 - 8 * b));
}

static uint8_t pixel(size_t i) {
    return (uint8_t)((i * 2654435761u) >> 24);
}

static void write_files(void) {
    uint8_t h[16] = {0, 0, 8, 3};
    be32(h + 4, N), be32(h + 8, 28), be32(h + 12, 28);
    FILE *f = fopen(e2e_path("im.idx"), "wb");
    gzFile g = gzopen(e2e_path("im.idx.gz"), "wb");
    FILE *x = fopen(e2e_path("x.npy"), "wb");
    int ok = f && g && x && fwrite(h, 1, 16, f) == 16 && gzwrite(g, h, 16) == 16;
    char dict[128];
    const int dl = snprintf(dict, sizeof dict,
                            "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", N, P);
    uint8_t nh[128] = "\x93NUMPY\x01\x00";
    nh[8] = 118;
    memset(nh + 10, ' ', 117);
    memcpy(nh + 10, dict, (size_t)dl);
    nh[127] = '\n';
    ok = ok && fwrite(nh, 1, 128, x) == 128;
    uint8_t row[P];
    float fr[P];
    for (int i = 0; ok && i < N; i++) {
        for (int j = 0; j < P; j++) row[j] = pixel((size_t)i * P + j), fr[j] = row[j] / 255.0f;
        ok = fwrite(row, 1, P, f) == P && gzwrite(g, row, P) == P && fwrite(fr, 4, P, x) == P;
    }
    if (f) ok &= fclose(f) == 0;
    if (g) ok &= gzclose(g) == Z_OK;
    if (x) ok &= fclose(x) == 0;
    /* Labels: IDX bytes and the same as .npy i8 integers. */
    uint8_t lh[8] = {0, 0, 8, 1}, lb[N];
    int64_t y[N];
    be32(lh + 4, N);
    for (int i = 0; i < N; i++) lb[i] = (uint8_t)(pixel((size_t)i * P + 400) % 10), y[i] = lb[i];
    f = fopen(e2e_path("lb.idx"), "wb");
    ok &= f && fwrite(lh, 1, 8, f) == 8 && fwrite(lb, 1, N, f) == N;
    if (f) ok &= fclose(f) == 0;
    snprintf(dict, sizeof dict, "{'descr': '<i8', 'fortran_order': False, 'shape': (%d,), }", N);
    memset(nh + 10, ' ', 117);
    memcpy(nh + 10, dict, strlen(dict));
    f = fopen(e2e_path("y.npy"), "wb");
    ok &= f && fwrite(nh, 1, 128, f) == 128 && fwrite(y, 8, N, f) == N;
    if (f) ok &= fclose(f) == 0;
    CHECK(ok, "writing the data files");
}

static int train(const char *tag, const char *data, long *maxrss_kb) {
    char cfg[64];
    snprintf(cfg, sizeof cfg, "%s.yaml", tag);
    FILE *f = fopen(e2e_path(cfg), "w");
    if (f) {
        fprintf(f,
                "model: {name: mlp, window: 0, in_dim: 784, hidden: 32, n_hidden: 1, classes: 10, "
                "batch: 50}\n"
                "train: {steps: 40, lr: 0.002, threads: 1, seed: 4, eval_every: 0}\n"
                "ckpt: {every: 40}\n"
                "data: {%s, val_fraction: 0.1}\n",
                data);
        fclose(f);
    }
    e2e_result r = e2e_runf("train %s --out %s", e2e_path(cfg), e2e_path(tag));
    CHECK(r.rc == 0, "%s: exit %d: %s", tag, r.rc, r.err);
    const int rc = r.rc;
    e2e_done(&r);
    struct rusage ru;
    if (maxrss_kb && getrusage(RUSAGE_CHILDREN, &ru) == 0) *maxrss_kb = ru.ru_maxrss;
    return rc;
}

static void same(const char *a, const char *b) {
    e2e_result r =
        e2e_runf("ckpt diff %s/step-00000040 %s/step-00000040", e2e_path(a), e2e_path(b));
    CHECK(r.rc == 0 && strstr(r.out, " identical, 0 different"), "%s and %s train alike:\n%s%s", a,
          b, r.out, r.err);
    e2e_done(&r);
}

int main(void) {
    char dir[64];
    if (!e2e_setup("data-map", dir, sizeof dir)) return check_summary("e2e/data_map");
    write_files();
    char data[600];
    long rss = 0;
    snprintf(data, sizeof data, "source: idx, train_images: %s, train_labels: %s",
             e2e_path("im.idx"), e2e_path("lb.idx"));
    /* First, while the children's peak is only this run's. */
    const int plain = train("plain", data, &rss);
    printf("peak resident memory of the run on a mapped %.1f MB IDX file: %ld MB\n",
           N * (double)P / 1e6, rss >> 10);
    /* The runtime and a model this small take about 45 MB; reading the
     * images whole added the file and its f32 copy (59 MB: 136 MB in all). */
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer's shadow memory and quarantine add tens of MB (99 MB
     * seen with the mapping): the bound holds only for an ordinary build */
    printf("peak RSS bound not checked under AddressSanitizer\n");
#else
    CHECK(plain || rss < 90 * 1024, "peak RSS %ld MB: the images were copied", rss >> 10);
#endif
    snprintf(data, sizeof data, "source: idx, train_images: %s, train_labels: %s",
             e2e_path("im.idx.gz"), e2e_path("lb.idx"));
    const int gz = train("gzip", data, NULL);
    snprintf(data, sizeof data, "source: npy, x: %s, y: %s", e2e_path("x.npy"), e2e_path("y.npy"));
    const int npy = train("npy", data, NULL);
    if (!plain && !gz) same("plain", "gzip");
    if (!plain && !npy) same("plain", "npy");

    /* A NaN in the mapped x: the file and the element are named. */
    FILE *f = fopen(e2e_path("x.npy"), "r+b");
    const float nan = NAN;
    int ok = f && fseek(f, 128 + 4 * (7L * P + 3), SEEK_SET) == 0 && fwrite(&nan, 4, 1, f) == 1;
    if (f) ok &= fclose(f) == 0;
    CHECK(ok, "writing a NaN");
    e2e_result r = e2e_runf("train %s/npy.yaml --out %s", dir, e2e_path("nan"));
    CHECK(r.rc == 2 && strstr(r.err, "x.npy: element 5491 (index [7, 3]) is nan"),
          "a NaN is refused: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    e2e_cleanup(dir);
    return check_summary("e2e/data_map");
}
