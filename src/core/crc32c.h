/* crc32c.h — CRC-32C (Castagnoli, the iSCSI/RFC 3720 polynomial 0x1EDC6F41,
 * reflected), used for per-tensor checksums in checkpoint manifests. The
 * SSE4.2 crc32 instruction computes exactly this polynomial; other CPUs use
 * a slicing-by-8 table. crc32c("123456789") = 0xE3069283. */
#ifndef TS_CRC32C_H
#define TS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continue a CRC: start with crc = 0 and feed the data in any split; the
 * result equals one call over the concatenation. */
uint32_t ts_crc32c(uint32_t crc, const void *data, size_t n);
/* The portable table version (for testing the hardware path against it). */
uint32_t ts_crc32c_table(uint32_t crc, const void *data, size_t n);

#endif
