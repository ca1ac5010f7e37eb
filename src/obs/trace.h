/* trace.h — Chrome trace files of compute and communication spans.
 *
 * A ts_trace records spans (a name, a category such as "compute" or
 * "comm", optional bytes / sequence number / label) of one process into
 * memory preallocated at creation: recording a span takes an atomic
 * increment and two clock reads, never a lock or an allocation, so it may
 * run inside the training step and on the communication thread at once.
 * At the end ts_trace_write turns them into Chrome trace JSON (open in
 * chrome://tracing or https://ui.perfetto.dev): one complete event
 * (ph "X") per span, pid = rank, tid = the recording thread.
 *
 *     ts_trace *tr;
 *     ts_trace_create(rank, 1 << 16, &tr);             // room for 65536 spans
 *     ts_trace_name_thread(tr, "step");                 // optional, any time
 *     ts_comm_set_trace(comm, ts_trace_comm_span, tr);  // every collective
 *     ...
 *     int s = ts_trace_begin(tr, "backward", TS_TRACE_COMPUTE);
 *     ...                                               // spans nest
 *     ts_trace_end(tr, s);
 *     ts_trace_add(tr, "bucket 3", TS_TRACE_COMM, t0, t1,
 *                  (ts_trace_args){.bytes = 4 << 20, .seq = 17, .label = "ring"});
 *     ...
 *     ts_trace_write(tr, "trace.rank0.json");           // after every thread stopped
 *     ts_trace_free(tr);
 *
 *     // rank 0, after a barrier: one file with every rank as its own process
 *     ts_trace_merge((const char *[]){"trace.rank0.json", "trace.rank1.json"}, 2,
 *                    "trace.json");
 *
 * Names, categories and labels are stored as pointers, not copied: pass
 * string literals or strings that outlive the trace. Times are
 * CLOCK_MONOTONIC seconds (ts_now(), the clock of ts_comm_span), written as
 * microseconds, so files of ranks on one host line up when merged; hosts'
 * monotonic clocks are unrelated, so across hosts only the durations and
 * the order within a rank mean anything.
 *
 * When the preallocated spans run out, later spans are not recorded and are
 * counted in ts_trace_dropped (and in the file's "otherData"); a span still
 * open at ts_trace_write is left out and counted as open. */
#ifndef TS_OBS_TRACE_H
#define TS_OBS_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/dist.h"
#include "tessel/status.h"

#define TS_TRACE_COMPUTE "compute"
#define TS_TRACE_COMM    "comm"

/* Optional arguments of a span; a negative number or NULL label is left out
 * of the event's "args". */
typedef struct ts_trace_args {
    int64_t bytes;
    int64_t seq;
    const char *label;
} ts_trace_args;

/* No arguments: {-1, -1, NULL}. */
#define TS_TRACE_NO_ARGS ((ts_trace_args){-1, -1, NULL})

typedef struct ts_trace ts_trace;

/* A trace for process `rank` (its Chrome "pid") with room for `capacity`
 * spans (> 0), allocated and touched now. */
ts_status ts_trace_create(int rank, size_t capacity, ts_trace **out);
void ts_trace_free(ts_trace *t);

/* Starts a span on the calling thread; returns its handle for ts_trace_end
 * (-1 when the trace is full or NULL: ts_trace_end ignores it). */
int ts_trace_begin(ts_trace *t, const char *name, const char *cat);
/* The same with arguments. */
int ts_trace_begin_args(ts_trace *t, const char *name, const char *cat, ts_trace_args args);
/* Ends span `h` (from the same thread that began it). */
void ts_trace_end(ts_trace *t, int h);
/* Records a finished span [start, end] (ts_now() seconds) on the calling
 * thread; returns 0, or -1 when it was dropped. */
int ts_trace_add(ts_trace *t, const char *name, const char *cat, double start, double end,
                 ts_trace_args args);
/* A ts_comm_trace_fn: pass the trace as `user` to ts_comm_set_trace to
 * record every collective as a "comm" span named after its kind (e.g.
 * "all_reduce") with bytes, seq and the algorithm as label. */
void ts_trace_comm_span(const ts_comm_span *span, void *user);
/* Names the calling thread in the file (Chrome "thread_name"); the name is
 * copied. Up to 32 threads per trace; more are left unnamed. */
void ts_trace_name_thread(ts_trace *t, const char *name);

/* Spans recorded, and spans dropped because the trace was full. */
size_t ts_trace_count(const ts_trace *t);
size_t ts_trace_dropped(const ts_trace *t);

/* Writes the finished spans as Chrome trace JSON {"traceEvents": [...]}:
 * "process_name" ("rank N") and "thread_name" metadata, then the spans
 * ordered by start time (an enclosing span before the spans inside it).
 * Call when no thread records any more; the trace can keep recording
 * after it. The file is written to PATH.tmp and renamed. */
ts_status ts_trace_write(ts_trace *t, const char *path);

/* Reads n Chrome trace files and writes one holding all their events (in
 * the order of the inputs), e.g. the per-rank files of one run. */
ts_status ts_trace_merge(const char *const *paths, int n, const char *out);

/* "BASE.rankR.json" for BASE "x.json" or "x"; the per-rank file of a
 * --trace FILE run. Returns 0, or -1 when it does not fit in n bytes. */
int ts_trace_rank_path(const char *base, int rank, char *buf, size_t n);

#endif
