/* Range checks on sizes read from data files (data_internal.h).
 *
 * A file states its own shape; nothing it says may reach an allocation or
 * a product of sizes unchecked. The rule is on the extent of a shape (the
 * product of its dimensions with each 0 counted as 1), not only its element
 * count: a shape such as (0, 2^62) holds no elements, yet whoever later
 * computes "values per example" or a row stride from it would overflow. */
#include <stdio.h>
#include "data/data_internal.h"

/* "(a, b, c)" into buf. */
static const char *shape_text(int rank, const int64_t *dims, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < rank && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, i ? ", %lld" : "%lld", (long long)dims[i]);
    if (k < cap) snprintf(buf + k, cap - k, rank == 1 ? ",)" : ")");
    return buf;
}

ts_status ts_data_check_shape(const char *path, int rank, const int64_t *dims, size_t elem,
                              int64_t *numel) {
    char text[32 * TS_MAX_RANK];
    *numel = 0;
    int64_t extent = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0)
            return ts_fail(TS_ERR_FORMAT, "%s: shape %s has a negative dimension", path,
                           shape_text(rank, dims, text, sizeof text));
        if (__builtin_mul_overflow(extent, dims[i] ? dims[i] : 1, &extent)) extent = -1;
        if (extent < 0) break;
    }
    int64_t bytes;
    if (extent < 0 || __builtin_mul_overflow(extent, (int64_t)elem, &bytes) ||
        (uint64_t)bytes > SIZE_MAX)
        return ts_fail(TS_ERR_FORMAT,
                       "%s: shape %s is too large: its dimensions multiply past 2^63 bytes", path,
                       shape_text(rank, dims, text, sizeof text));
    return ts_shape_numel_checked(rank, dims, numel);
}

ts_status ts_data_check_examples(const char *path, int rank, const int64_t *dims) {
    char text[32 * TS_MAX_RANK];
    for (int i = 1; i < rank; i++)
        if (dims[i] == 0)
            return ts_fail(TS_ERR_SHAPE,
                           "%s: shape %s: dimension %d is 0, so an example holds no values", path,
                           shape_text(rank, dims, text, sizeof text), i);
    return TS_OK;
}

ts_status ts_data_check_class_count(const char *path, const char *where, int64_t label) {
    if (label < TS_DATA_MAX_CLASSES) return TS_OK;
    return ts_fail(TS_ERR_INVALID,
                   "%s: %s has label %lld: the class count taken from the largest label would "
                   "be %lld + 1, above the range of model.classes [0, 1e9]; set model.classes "
                   "or fix the labels",
                   path, where, (long long)label, (long long)label);
}
