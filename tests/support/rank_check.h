/* rank_check.h — CHECK for test programs whose ranks run under mpirun:
 * failures name the rank, counted by check.h's counters.
 *
 *     static int wrank;          // one per test program: set after the comm is made
 *     #include "rank_check.h"
 *     wrank = ts_comm_rank(c);
 *     WCHECK(n == 4, "size %d", n);
 *     WOK(ts_barrier(c));
 */
#ifndef TS_TEST_RANK_CHECK_H
#define TS_TEST_RANK_CHECK_H

#include <stdio.h>
#include "check.h"
#include "tessel/status.h"

#define WCHECK(c, ...)                                                                             \
    do {                                                                                           \
        if (c) {                                                                                   \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "FAIL rank %d %s:%d: ", wrank, __FILE__, __LINE__);                    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

#define WOK(expr)                                                                                  \
    do {                                                                                           \
        ts_status w_s_ = (expr);                                                                   \
        WCHECK(w_s_ == TS_OK, "%s -> %s: %s", #expr, ts_status_name(w_s_), ts_last_error());       \
    } while (0)

#endif
