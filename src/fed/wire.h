/* wire.h — little-endian integers in federated messages (internal).
 *
 *     uint8_t b[4];
 *     put_u32(b, 7);          // b = 07 00 00 00 on every host
 *     uint32_t v = get_u32(b);
 *
 * Byte by byte, so the wire format does not depend on the host's byte order. */
#ifndef TS_FED_WIRE_H
#define TS_FED_WIRE_H

#include <stdint.h>

static inline void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
