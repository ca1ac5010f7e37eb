/* The data lineage of a run whose token file is hashed while training
 * starts (ts_data_map_tokens_async): the first steps need no hash, so
 * hashing a large corpus no longer delays them, but nothing that names the
 * data may go out without it. lineage.json is written once the hashes are
 * in (checked after every step), and every checkpoint manifest (and the
 * end of the run) waits for them. A pass that fails (a token outside the
 * vocabulary, a file changed while hashed) fails the run with its error.
 * For every other data set the hashes are in at load and lineage.json is
 * written with the other run files, as before. See session_internal.h. */
#include "session/session_internal.h"

ts_status ts_sess_lineage_settle(session *s, int block) {
    if (s->lineage_done) return TS_OK;
    if (!block && ts_dataset_lineage_pending(s->all)) return TS_OK;
    ts_status st = ts_dataset_lineage_wait(s->all);
    if (st != TS_OK) {
        ts_error_prefix("data");
        return st;
    }
    s->lineage_done = 1;
    return s->lineage_deferred ? ts_sess_write_lineage(s) : TS_OK;
}
