/* bench_tfevents_histo — TensorBoard histogram pass: ns per value of
 * ts_tfevents_histogram (floats: the bucket by a table on the top 16 bits
 * and one compare) against ts_tfevents_histogram_f64 on the same values as
 * doubles (a logarithm and a walk over the limits per value: the way floats
 * were bucketed before issue #27). Values like W1's: half weights
 * (normal, sd 0.03), half gradients (normal, sd 1e-4, 2% exact zeros).
 * Prints each round and the medians of the rounds, alternating the two.
 *
 *     build/bench_tfevents_histo [N [ROUNDS]]   (default 6300000 values, 7)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "core/core.h"
#include "obs/tfevents.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A normal deviate from two uniforms (Box-Muller), from a fixed seed. */
static double normal(unsigned *seed) {
    double u = (rand_r(seed) + 1.0) / (RAND_MAX + 2.0), v = rand_r(seed) / (RAND_MAX + 1.0);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? atoll(argv[1]) : 6300000;
    const int rounds = argc > 2 ? atoi(argv[2]) : 7;
    if (n < 1 || rounds < 1 || rounds > 99) {
        fprintf(stderr, "usage: bench_tfevents_histo [N [ROUNDS<100]]\n");
        return 2;
    }
    float *f = malloc(sizeof(float) * (size_t)n);
    double *d = malloc(sizeof(double) * (size_t)n);
    if (!f || !d) return 1;
    unsigned seed = 27;
    for (int64_t i = 0; i < n; i++) {
        const int grad = i >= n / 2;
        f[i] =
            grad && rand_r(&seed) % 50 == 0 ? 0.0f : (float)(normal(&seed) * (grad ? 1e-4 : 0.03));
        d[i] = f[i];
    }
    char dir[] = "/tmp/bench-tfevents-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    ts_tfevents *w = NULL;
    if (ts_tfevents_open(dir, NULL, &w) != TS_OK) {
        fprintf(stderr, "bench_tfevents_histo: %s\n", ts_last_error());
        return 1;
    }
    double t32[99], t64[99];
    for (int r = 0; r < rounds; r++) {
        double t0 = ts_now();
        ts_status s1 = ts_tfevents_histogram(w, r, "f32", f, n, NULL);
        double t1 = ts_now();
        ts_status s2 = ts_tfevents_histogram_f64(w, r, "f64", d, n, NULL);
        double t2 = ts_now();
        if (s1 != TS_OK || s2 != TS_OK) {
            fprintf(stderr, "bench_tfevents_histo: %s\n", ts_last_error());
            return 1;
        }
        t32[r] = (t1 - t0) * 1e9 / (double)n;
        t64[r] = (t2 - t1) * 1e9 / (double)n;
        printf("round %d: f32 table %.2f ns/value, f64 log+walk %.2f ns/value\n", r, t32[r],
               t64[r]);
    }
    qsort(t32, (size_t)rounds, sizeof(double), cmp);
    qsort(t64, (size_t)rounds, sizeof(double), cmp);
    const double m32 = t32[rounds / 2], m64 = t64[rounds / 2];
    printf("median of %d, %lld values: f32 table %.2f ns/value (%.1f ms), f64 log+walk %.2f "
           "ns/value (%.1f ms): %.1fx\n",
           rounds, (long long)n, m32, m32 * (double)n * 1e-6, m64, m64 * (double)n * 1e-6,
           m64 / m32);
    char path[512];
    snprintf(path, sizeof path, "%s", ts_tfevents_path(w));
    ts_tfevents_close(w);
    remove(path);
    remove(dir);
    free(f);
    free(d);
    return 0;
}
