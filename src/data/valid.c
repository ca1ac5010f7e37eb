/* Per-example source flags read from a .npy file (data.valid; data.h:
 * ts_dataset_attach_valid), so a data set can say which of a fusion
 * model's sources each example really has. */
#include <stdlib.h>
#include <string.h>
#include "data/data_internal.h"

/* Element i of a converted array as a double (integers are i64, floats
 * f64 after ts_npy_read). */
static double element(const ts_array *a, int64_t i) {
    return a->dtype == TS_I64 ? (double)((const int64_t *)a->data)[i]
                              : ((const double *)a->data)[i];
}

ts_status ts_dataset_attach_valid(ts_dataset *d, const char *path, int64_t cols) {
    if (!d || !path || cols < 1)
        return ts_fail(TS_ERR_INVALID, "data.valid: no data set, file or source count (%lld)",
                       (long long)cols);
    ts_array a;
    ts_status s = ts_npy_read(path, TS_F64, TS_I64, &a);
    if (s != TS_OK) return s;
    if (a.rank != 2 || a.dims[0] != d->n || a.dims[1] != cols) {
        char got[96] = "";
        for (int i = 0, k = 0; i < a.rank && k < (int)sizeof got - 24; i++)
            k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", i ? ", " : "",
                          (long long)a.dims[i]);
        s = ts_fail(TS_ERR_SHAPE,
                    "%s: data.valid has shape [%s], but the data needs [%lld, %lld] (one flag per "
                    "example and source)",
                    path, got, (long long)d->n, (long long)cols);
        goto done;
    }
    uint8_t *v = ts_alloc((size_t)(d->n * cols), "source flags");
    if (!v) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int64_t i = 0; i < d->n * cols; i++) {
        const double f = element(&a, i);
        if (f != 0 && f != 1) {
            s = ts_fail(TS_ERR_INVALID,
                        "%s: data.valid of example %lld, source %lld is %g: flags are 0 "
                        "(missing) or 1 (present)",
                        path, (long long)(i / cols), (long long)(i % cols), f);
            free(v);
            goto done;
        }
        v[i] = f == 1;
    }
    if ((s = ts_dataset_add_lineage(d, &a.lineage)) != TS_OK) {
        free(v);
        goto done;
    }
    free(d->valid);
    d->valid = v;
    d->valid_cols = cols;
done:
    ts_array_free(&a);
    return s;
}
