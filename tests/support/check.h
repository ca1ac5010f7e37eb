/* check.h — the minimal test framework every test program uses.
 *
 *     int main(void) {
 *         CHECK(1 + 1 == 2, "arithmetic");
 *         CHECK_OK(ts_compile(g, &spec, NULL, &plan));
 *         CHECK_NEAR(x, 1.0, 1e-6);
 *         return check_summary("mytest");   // prints "mytest: N passed, M failed"
 *     }
 */
#ifndef TS_TEST_CHECK_H
#define TS_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include "tessel/tessel.h"

extern int check_passed, check_failed;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (cond) {                                                                               \
            check_passed++;                                                                       \
        } else {                                                                                  \
            check_failed++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                  \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
        }                                                                                         \
    } while (0)

#define CHECK_OK(expr)                                                                            \
    do {                                                                                          \
        ts_status check_s_ = (expr);                                                              \
        CHECK(check_s_ == TS_OK, "%s -> %s: %s", #expr, ts_status_name(check_s_),                 \
              ts_last_error());                                                                   \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                     \
    do {                                                                                          \
        double check_a_ = (a), check_b_ = (b);                                                    \
        CHECK(fabs(check_a_ - check_b_) <= (tol), "%s = %.9g, expected %.9g (tol %g)", #a,        \
              check_a_, check_b_, (double)(tol));                                                 \
    } while (0)

/* Prints "<name>: N passed, M failed"; returns the process exit code. */
int check_summary(const char *name);

#endif
