/* Audit log: the input is RUN/audit.log (ts_audit_verify without a key:
 * the hash chain, entries, signed heads, and the anchors against the run
 * directory, which holds no checkpoint). */
#include "fuzz.h"
#include "tessel/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fuzz_file("audit.log", data, size)) return 0;
    ts_audit_report r;
    ts_audit_verify(fuzz_dir(), NULL, &r);
    return 0;
}
