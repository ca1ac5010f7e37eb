/* Secure aggregation by masking (src/fed/mask.c, shamir.c): 5 clients,
 * threshold 3; sums exact with 0, 1 and t - 1 = 2 dropouts (clients that
 * drop after sharing their keys and ones that drop after sending their
 * masked update), fewer than t -> a clear error; tampered, misrouted and
 * forged messages refused; Shamir alone; floats through pack.c. */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "fed/mask.h"
#include "fed/pack.h"

enum { N = 5, T = 3, LEN = 5000 }; /* LEN spans two PRG chunks of 4096 lanes */

/* Drop kinds per client: 0 stays, 1 drops after step 1 (no masked update),
 * 2 drops after step 2 (no unmasking answer). corrupt: a client whose
 * answer is altered. Returns finish's status; *sum and *count on success. */
static ts_status run_round(const uint32_t (*x)[LEN], const int *drop, int corrupt, uint64_t round,
                           uint32_t *sum, int *count) {
    ts_mask_client *c[N + 1] = {0};
    ts_mask_server *sv = NULL;
    ts_mask_keys keys[N + 1];
    uint8_t u1[N + 1] = {0}, u2[N + 1] = {0}, u3[N + 1] = {0};
    uint8_t *boxes = malloc((size_t)(N + 1) * N * TS_MASK_BOX);
    uint32_t *y = malloc(LEN * sizeof *y);
    ts_mask_share sh[N + 1];
    ts_status s = TS_OK;
    CHECK_OK(ts_mask_server_new(N, T, round, LEN, &sv));
    for (int i = 1; i <= N; i++) { /* step 0 */
        CHECK_OK(ts_mask_client_new(i, N, T, round, &c[i]));
        ts_mask_client_keys(c[i], &keys[i]);
        CHECK_OK(ts_mask_server_keys(sv, i, &keys[i]));
        u1[i] = 1;
    }
    for (int i = 1; i <= N; i++) { /* step 1 */
        CHECK_OK(ts_mask_client_share(c[i], keys, u1, boxes + (size_t)i * N * TS_MASK_BOX));
        u2[i] = 1;
    }
    for (int i = 1; i <= N; i++)
        for (int v = 1; v <= N; v++)
            if (v != i)
                CHECK_OK(ts_mask_client_accept(
                    c[v], i, boxes + ((size_t)i * N + (size_t)(v - 1)) * TS_MASK_BOX));
    for (int i = 1; i <= N; i++) { /* step 2 */
        if (drop[i] == 1) continue;
        CHECK_OK(ts_mask_client_mask(c[i], u2, x[i], LEN, y));
        int same = 0;
        for (int j = 0; j < LEN; j++) same += y[j] == x[i][j];
        CHECK(same < 10, "client %d: %d of %d lanes unmasked", i, same, LEN);
        CHECK_OK(ts_mask_server_add(sv, i, y));
        u3[i] = 1;
    }
    for (int i = 1; i <= N; i++) { /* step 3 */
        if (drop[i]) continue;
        s = ts_mask_client_unmask(c[i], u2, u3, sh);
        if (s != TS_OK) break;
        if (i == corrupt)
            for (int u = 1; u <= N; u++) sh[u].y[0] ^= 1;
        CHECK_OK(ts_mask_server_shares(sv, i, sh));
    }
    if (s == TS_OK) s = ts_mask_server_finish(sv, u2, sum, count);
    for (int i = 1; i <= N; i++) ts_mask_client_free(c[i]);
    ts_mask_server_free(sv);
    free(boxes);
    free(y);
    return s;
}

static void test_dropouts(void) {
    static uint32_t x[N + 1][LEN];
    for (int i = 1; i <= N; i++) randombytes_buf(x[i], sizeof x[i]);
    static uint32_t sum[LEN];
    const struct {
        const char *label;
        int drop[N + 1];
        int ok;
    } cases[] = {
        {"no dropout", {0, 0, 0, 0, 0, 0}, 1},
        {"1 dropout after sending", {0, 0, 0, 2, 0, 0}, 1},
        {"1 dropout before sending", {0, 0, 1, 0, 0, 0}, 1},
        {"t-1 dropouts, both kinds", {0, 1, 0, 0, 0, 2}, 1},
        {"t-1 dropouts before sending", {0, 0, 0, 1, 1, 0}, 1},
        {"t dropouts", {0, 1, 0, 2, 0, 2}, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int count = -1;
        ts_status s = run_round((const uint32_t(*)[LEN])x, cases[k].drop, 0, 7 + k, sum, &count);
        if (!cases[k].ok) {
            CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "needed") &&
                      strstr(ts_last_error(), "fails"),
                  "%s: %s (%s)", cases[k].label, ts_status_name(s), ts_last_error());
            continue;
        }
        CHECK(s == TS_OK, "%s: %s", cases[k].label, ts_last_error());
        int want_count = 0, exact = 1;
        for (int i = 1; i <= N; i++) want_count += cases[k].drop[i] != 1;
        for (int j = 0; j < LEN; j++) {
            uint32_t w = 0;
            for (int i = 1; i <= N; i++)
                if (cases[k].drop[i] != 1) w += x[i][j];
            exact &= sum[j] == w;
        }
        CHECK(s != TS_OK || (exact && count == want_count),
              "%s: sum exact %d, %d clients summed (want %d)", cases[k].label, exact, count,
              want_count);
    }
    /* an altered unmasking answer beyond the threshold is caught */
    int none[N + 1] = {0};
    int count;
    ts_status s = run_round((const uint32_t(*)[LEN])x, none, 4, 99, sum, &count);
    CHECK(s == TS_ERR_FORMAT && strstr(ts_last_error(), "does not match"), "corrupted share: %s",
          ts_last_error());
}

static void test_boxes(void) {
    ts_mask_client *a, *b, *c;
    CHECK_OK(ts_mask_client_new(1, 3, 2, 5, &a));
    CHECK_OK(ts_mask_client_new(2, 3, 2, 5, &b));
    CHECK_OK(ts_mask_client_new(3, 3, 2, 5, &c));
    ts_mask_keys keys[4];
    ts_mask_client_keys(a, &keys[1]);
    ts_mask_client_keys(b, &keys[2]);
    ts_mask_client_keys(c, &keys[3]);
    uint8_t u1[4] = {0, 1, 1, 1}, boxes[3 * 3 * TS_MASK_BOX];
    CHECK_OK(ts_mask_client_share(a, keys, u1, boxes));
    CHECK_OK(ts_mask_client_share(b, keys, u1, boxes + 3 * TS_MASK_BOX));
    CHECK_OK(ts_mask_client_share(c, keys, u1, boxes + 6 * TS_MASK_BOX));
    uint8_t *a_to_b = boxes + 1 * TS_MASK_BOX, *a_to_c = boxes + 2 * TS_MASK_BOX;
    CHECK(ts_mask_client_accept(c, 1, a_to_b) == TS_ERR_FORMAT,
          "box for client 2 opened by client 3");
    CHECK(ts_mask_client_accept(b, 3, a_to_b) == TS_ERR_FORMAT, "box from 1 accepted as from 3");
    a_to_c[60] ^= 0x40;
    CHECK(ts_mask_client_accept(c, 1, a_to_c) == TS_ERR_FORMAT &&
              strstr(ts_last_error(), "tampered"),
          "tampered box accepted: %s", ts_last_error());
    CHECK_OK(ts_mask_client_accept(b, 1, a_to_b));
    /* fewer announced clients than the threshold: no shares are made */
    uint8_t u1b[4] = {0, 1, 0, 0};
    CHECK(ts_mask_client_share(a, keys, u1b, boxes) == TS_ERR_INVALID,
          "shares with 1 of threshold 2");
    ts_mask_client_free(a);
    ts_mask_client_free(b);
    ts_mask_client_free(c);
    CHECK(ts_mask_client_new(4, 3, 2, 0, &a) == TS_ERR_INVALID, "id 4 of 3 accepted");
    CHECK(ts_mask_client_new(1, 3, 4, 0, &a) == TS_ERR_INVALID, "threshold 4 of 3 accepted");
}

static void test_shamir(void) {
    uint8_t secret[32], back[32];
    randombytes_buf(secret, sizeof secret);
    memset(secret, 0xff, 8); /* the largest bytes encode too */
    uint64_t sh[7][TS_SHAMIR_K];
    CHECK_OK(ts_shamir_split(secret, 7, 4, sh));
    int xs[7] = {2, 7, 4, 1, 3, 5, 6};
    const uint64_t *ys[7];
    for (int i = 0; i < 7; i++) ys[i] = sh[xs[i] - 1];
    CHECK_OK(ts_shamir_combine(xs, ys, 4, 4, back));
    CHECK(memcmp(secret, back, 32) == 0, "4 of 7 shares do not give the secret");
    CHECK_OK(ts_shamir_combine(xs, ys, 7, 4, back));
    CHECK(memcmp(secret, back, 32) == 0, "7 of 7 shares do not give the secret");
    CHECK(ts_shamir_combine(xs, ys, 3, 4, back) == TS_ERR_INVALID, "3 of 4 shares accepted");
    /* 3 shares reveal nothing: combining them as if t were 3 gives another secret */
    ts_status s3 = ts_shamir_combine(xs, ys, 3, 3, back);
    CHECK(s3 != TS_OK || memcmp(secret, back, 32) != 0,
          "3 shares of a 4-threshold secret gave it away");
    uint64_t bad[TS_SHAMIR_K];
    memcpy(bad, sh[5], sizeof bad);
    bad[2] += 1;
    ys[5] = bad;
    CHECK(ts_shamir_combine(xs, ys, 7, 4, back) == TS_ERR_FORMAT &&
              strstr(ts_last_error(), "party 5"),
          "forged share of party 5: %s", ts_last_error());
    xs[1] = 2;
    CHECK(ts_shamir_combine(xs, ys, 4, 4, back) == TS_ERR_FORMAT, "duplicate party accepted");
    CHECK(ts_shamir_split(secret, 3, 1, sh) == TS_ERR_INVALID, "threshold 1 accepted");
}

static void test_floats(void) {
    /* float updates through the fixed-point encoding: masked sums decode
     * like plain integer sums, bit for bit */
    ts_fed_pack p;
    CHECK_OK(ts_fed_pack_init(&p, 1 << 20, 2.0, N, 0));
    CHECK(p.slot_bits <= 32, "slot of %d bits for uint32 lanes", p.slot_bits);
    static uint32_t x[N + 1][LEN];
    static uint64_t plain[LEN], u[LEN];
    static float f[LEN];
    for (int i = 1; i <= N; i++) {
        for (int j = 0; j < LEN; j++) f[j] = (float)((j * 37 + i * 11) % 1000) / 250.0f - 2.0f;
        CHECK_OK(ts_fed_quantize(&p, f, LEN, 1.0, u, NULL));
        for (int j = 0; j < LEN; j++) {
            x[i][j] = (uint32_t)u[j];
            plain[j] += u[j];
        }
    }
    static uint32_t sum[LEN];
    static uint64_t sum64[LEN];
    static double a[LEN], b[LEN];
    int none[N + 1] = {0}, count = 0;
    CHECK_OK(run_round((const uint32_t(*)[LEN])x, none, 0, 1000, sum, &count));
    for (int j = 0; j < LEN; j++) sum64[j] = sum[j];
    CHECK_OK(ts_fed_decode_sums(&p, sum64, LEN, count, a));
    CHECK_OK(ts_fed_decode_sums(&p, plain, LEN, N, b));
    CHECK(memcmp(a, b, sizeof a) == 0, "masked float sums differ from plain ones");
}

int main(void) {
    test_shamir();
    test_boxes();
    test_dropouts();
    test_floats();
    return check_summary("unit/fed_mask");
}
