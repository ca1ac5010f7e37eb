/* What the ranks of a data-parallel run agree on: the loss and stop flag
 * after each step, the checkpoint group, and the test knob that kills a
 * rank. See ranks.h. */
#include "session/ranks.h"
#include <signal.h>
#include <sodium.h>
#include <stdlib.h>
#include "core/core.h"

/* The test knob (ranks.h): the step of this process's agreements at which
 * it kills itself; 0: never. */
static int64_t kill_at_step, steps_agreed;

void ts_session_arm_test_kill(int rank, int attempt) {
    const char *kr = getenv("TESSEL_TEST_KILL_RANK"), *ks = getenv("TESSEL_TEST_KILL_STEP");
    const char *ka = getenv("TESSEL_TEST_KILL_ATTEMPTS");
    if (attempt >= (ka ? atoi(ka) : 1) || !kr || !ks || atoi(kr) != rank) return;
    kill_at_step = atoll(ks);
}

void ts_session_kill_point(void) {
    if (kill_at_step > 0 && ++steps_agreed == kill_at_step) raise(SIGKILL);
}

ts_status ts_session_agree(ts_comm *comm, double *loss, int *stop) {
    ts_session_kill_point();
    double v[2] = {*loss, *stop ? 1.0 : 0.0};
    ts_status s = ts_allreduce(comm, v, 2, TS_F64, TS_RED_SUM, TS_ALGO_AUTO);
    if (s != TS_OK) return s;
    *loss = v[0] / (double)ts_comm_size(comm);
    *stop = v[1] > 0;
    return TS_OK;
}

ts_status ts_session_ckpt_group(ts_comm *comm, uint64_t *group) {
    /* 52 random bits: exact in the f64 sum that broadcasts them. */
    double v = 0;
    if (ts_comm_rank(comm) == 0) {
        uint64_t r;
        randombytes_buf(&r, sizeof r);
        v = (double)(r & (((uint64_t)1 << 52) - 1));
    }
    ts_status s = ts_allreduce(comm, &v, 1, TS_F64, TS_RED_SUM, TS_ALGO_AUTO);
    if (s == TS_OK) *group = (uint64_t)v;
    return s;
}
