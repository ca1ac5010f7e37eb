/* CRC-32C: the SSE4.2 instruction where the CPU has it (three streams at
 * once), a slicing-by-8 table otherwise. Both give identical results
 * (tests/unit/ckpt.c checks the RFC 3720 vectors and hardware against
 * table on random lengths and splits). */
#include "crc32c.h"
#include <pthread.h>
#include <string.h>

#define POLY 0x82F63B78u /* 0x1EDC6F41 bit-reversed */

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

static uint32_t crc_table(uint32_t crc, const unsigned char *p, size_t n) {
    pthread_once(&table_once, table_init);
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc; /* little-endian: the CRC folds into the first four bytes */
        crc = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
              table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^ table[2][(w >> 40) & 0xFF] ^
              table[1][(w >> 48) & 0xFF] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>

/* The crc32 instruction takes 3 cycles and can start one per cycle, so one
 * stream of them runs at a third of the unit's speed. Three streams of
 * STREAM bytes each run side by side, and are joined by shifting a CRC
 * over STREAM zero bytes: the CRC is linear, so crc(s, A B) =
 * shift(crc(s, A)) ^ crc(0, B), and shift is four table lookups (the
 * shifted CRC of each byte of the state at each of its four places). */
#define STREAM 4096

static uint32_t shift_tab[4][256];
static pthread_once_t shift_once = PTHREAD_ONCE_INIT;

__attribute__((target("sse4.2"))) static void shift_init(void) {
    uint32_t basis[32]; /* each bit of a state, shifted over STREAM zero bytes */
    for (int i = 0; i < 32; i++) {
        uint64_t c = 1u << i;
        for (int k = 0; k < STREAM / 8; k++) c = _mm_crc32_u64(c, 0);
        basis[i] = (uint32_t)c;
    }
    for (int t = 0; t < 4; t++)
        for (int b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int i = 0; i < 8; i++)
                if (b >> i & 1) v ^= basis[8 * t + i];
            shift_tab[t][b] = v;
        }
}

static uint32_t shift(uint32_t c) {
    return shift_tab[0][c & 0xFF] ^ shift_tab[1][(c >> 8) & 0xFF] ^ shift_tab[2][(c >> 16) & 0xFF] ^
           shift_tab[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p,
                                                         size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    if (n >= 3 * STREAM) pthread_once(&shift_once, shift_init);
    while (n >= 3 * STREAM) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < STREAM; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + STREAM + i, 8);
            memcpy(&w2, p + 2 * STREAM + i, 8);
            c = _mm_crc32_u64(c, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        c = shift(shift((uint32_t)c) ^ (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * STREAM;
        n -= 3 * STREAM;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}

static int have_sse42(void) {
    static int cached = -1;
    if (cached < 0) cached = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    return cached;
}
#endif

uint32_t ts_crc32c_table(uint32_t crc, const void *data, size_t n) {
    return ~crc_table(~crc, data, n);
}

uint32_t ts_crc32c(uint32_t crc, const void *data, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_sse42()) return ~crc_hw(~crc, data, n);
#endif
    return ~crc_table(~crc, data, n);
}
