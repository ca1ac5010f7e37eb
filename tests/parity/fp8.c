/* FP8 conversions against an independent implementation: the table in
 * fixtures/fp8_ml_dtypes.txt (tests/parity/gen_fp8_table.py, ml_dtypes'
 * float8_e4m3fn / float8_e5m2, the formats of torch.float8_*). The reference
 * does not saturate, so its codes are compared with tessel's
 * non-saturating mode everywhere and with the saturating mode where the
 * result is finite; a NaN result must be NaN in both (tessel always writes
 * 0x7F, the reference keeps the sign). */
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "core/fp8.h"

static int is_nan_code(uint8_t c, ts_dtype f) {
    return isnan(ts_fp8_to_f32(c, f));
}

int main(void) {
    const char *path = "tests/parity/fixtures/fp8_ml_dtypes.txt";
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s (run from the repository root)", path);
    if (!f) return check_summary("parity fp8");
    char line[128], kind[8], fmt[8];
    unsigned a, b;
    int n_dec = 0, n_enc = 0, n_sat = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        if (sscanf(line, "%7s %7s %x %x", kind, fmt, &a, &b) != 4) {
            CHECK(0, "malformed line: %s", line);
            continue;
        }
        ts_dtype dt = !strcmp(fmt, "e4m3") ? TS_F8E4M3 : TS_F8E5M2;
        if (!strcmp(kind, "dec")) {
            float v = ts_fp8_to_f32((uint8_t)a, dt), want = fp8_float(b);
            int ok = isnan(want) ? isnan(v) : fp8_bits(v) == b;
            if (!ok && bad++ < 5)
                CHECK(0, "%s decode 0x%02X = 0x%08X, reference 0x%08X", fmt, a, fp8_bits(v), b);
            n_dec++;
            continue;
        }
        float x = fp8_float(a);
        uint8_t want = (uint8_t)b, got = ts_fp8_from_f32(x, dt, 0);
        int nan = is_nan_code(want, dt);
        int ok = nan ? got == 0x7F : got == want;
        if (!ok && bad++ < 5)
            CHECK(0, "%s encode %.9g (0x%08X) = 0x%02X, reference 0x%02X", fmt, x, a, got, want);
        if (!nan && !isinf(ts_fp8_to_f32(want, dt))) {
            uint8_t sat = ts_fp8_from_f32(x, dt, 1);
            if (sat != want && bad++ < 5)
                CHECK(0, "%s saturating encode %.9g = 0x%02X, reference 0x%02X", fmt, x, sat, want);
            n_sat++;
        }
        n_enc++;
    }
    fclose(f);
    CHECK(bad == 0, "%d conversions differ from the reference", bad);
    CHECK(n_dec == 512 && n_enc > 5000 && n_sat > 4000,
          "table: %d decodes, %d encodes (%d in range)", n_dec, n_enc, n_sat);
    return check_summary("parity fp8");
}
