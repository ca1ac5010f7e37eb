/* data_internal.h — helpers shared by the readers in src/data (internal).
 *
 * Every reader loads its file whole through ts_data_slurp, which hashes the
 * bytes as they stream in: the SHA-256 in the lineage is therefore the hash
 * of exactly the bytes that were parsed, even if the file changes on disk
 * while (or after) it is read.
 */
#ifndef TS_DATA_INTERNAL_H
#define TS_DATA_INTERNAL_H

#include <stdint.h>
#include "core/core.h"
#include "data/data.h"

/* Read all of `path` into *buf (malloc'd, *len bytes) and fill *lin (path
 * as given, SHA-256, size). On failure nothing is left allocated. */
ts_status ts_data_slurp(const char *path, uint8_t **buf, size_t *len, ts_lineage *lin);

/* Free the strings a lineage entry owns and clear it. */
void ts_lineage_clear(ts_lineage *l);

/* Append *l to d's lineage list, taking over its path (l is cleared). */
ts_status ts_dataset_add_lineage(ts_dataset *d, ts_lineage *l);

/* Little-endian loads, independent of the host's byte order. */
static inline uint16_t ts_le16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t ts_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ts_le64(const uint8_t *p) {
    return (uint64_t)ts_le32(p) | ((uint64_t)ts_le32(p + 4) << 32);
}
static inline uint32_t ts_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

#endif
