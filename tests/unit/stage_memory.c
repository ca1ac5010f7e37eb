/* stage_memory.c — the partition's memory estimate of each pipeline stage
 * (passes/partition_search.c: parameters with gradients and optimizer
 * state, activations of the micro-batches in flight and the running one,
 * send buffers, the micro-batch tree's partial sums, a shared parameter's
 * gradient shares) against what the stage really holds: its plan's arena
 * plus the buffers beside it (ts_stage_buffer_bytes). A GPT with a tied LM
 * head on 2 and 4 stages, 1F1B and GPipe, 1 to 8 micro-batches; stage
 * processes on shm, no step run (the memory is all allocated by then). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "session/stages.h"

enum { MAXS = 4 };

static const char *const GPT = "model:\n  name: gpt\n  batch: 8\n  ctx: 32\n  vocab: 512\n"
                               "  d_model: 64\n  n_layers: 4\n  n_heads: 4\n"
                               "train:\n  optimizer: adamw\n  lr: 0.01\n  seed: 3\n"
                               "  threads: 1\n";

typedef struct job {
    int S, M, gpipe;
} job;

/* what each stage process reports */
typedef struct report {
    double estimate, arena, buffers;
    int ok;
} report;

static report *R;
static char devfile[96]; /* the same cuts on every run: speeds from a file */

static int worker(ts_comm *comm, void *user) {
    const job *j = user;
    const int rank = ts_comm_rank(comm);
    ts_config c;
    ts_config_init(&c);
    char set[4][160];
    snprintf(set[0], sizeof set[0], "dist.pipeline_stages=%d", j->S);
    snprintf(set[1], sizeof set[1], "dist.microbatches=%d", j->M);
    snprintf(set[2], sizeof set[2], "dist.pipeline_schedule=%s", j->gpipe ? "gpipe" : "1f1b");
    snprintf(set[3], sizeof set[3], "dist.devices=%s", devfile);
    ts_status s = ts_config_load_string(&c, GPT, strlen(GPT), "t.yaml");
    for (int i = 0; i < 4 && s == TS_OK; i++) s = ts_config_set(&c, set[i]);
    if (s == TS_OK) s = ts_config_finish(&c);
    ts_stage *st = NULL;
    if (s == TS_OK) s = ts_stage_new(&c, comm, &st);
    ts_plan_stats ps;
    if (s == TS_OK) s = ts_plan_get_stats(ts_stage_plan(st), &ps);
    if (s != TS_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, ts_last_error());
        ts_stage_free(st);
        return 2;
    }
    R[rank].estimate = ts_partition_stage_at(ts_stage_partition_of(st), rank)->mem_bytes;
    R[rank].arena = (double)ps.arena_bytes;
    R[rank].buffers = (double)ts_stage_buffer_bytes(st);
    R[rank].ok = 1;
    ts_stage_free(st);
    return 0;
}

int main(void) {
    R = mmap(NULL, sizeof *R * MAXS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (R == MAP_FAILED) return 1;
    snprintf(devfile, sizeof devfile, "/tmp/tessel_stage_memory_%d.txt", (int)getpid());
    FILE *f = fopen(devfile, "w");
    if (!f) return 1;
    fprintf(f, "core 60 8 2\n");
    fclose(f);
    static const job jobs[] = {{2, 1, 0}, {2, 4, 0}, {2, 8, 0}, {2, 8, 1}, {4, 8, 0}, {4, 4, 1}};
    double worst = 0;
    for (size_t k = 0; k < sizeof jobs / sizeof *jobs; k++) {
        job j = jobs[k];
        memset(R, 0, sizeof *R * MAXS);
        CHECK(ts_shm_launch(j.S, NULL, worker, &j, NULL) == TS_OK, "%d stages: %s", j.S,
              ts_last_error());
        for (int s = 0; s < j.S; s++) {
            const double real = R[s].arena + R[s].buffers, ratio = R[s].estimate / real;
            printf("%d stages, %d micro-batches, %s, stage %d: estimate %.3f MiB, arena %.3f + "
                   "buffers %.3f = %.3f MiB (%.3f)\n",
                   j.S, j.M, j.gpipe ? "gpipe" : "1f1b", s, R[s].estimate / 1048576.0,
                   R[s].arena / 1048576.0, R[s].buffers / 1048576.0, real / 1048576.0, ratio);
            CHECK(R[s].ok, "%d stages, %d micro-batches: stage %d reported nothing", j.S, j.M, s);
            if (fabs(ratio - 1) > worst) worst = fabs(ratio - 1);
            /* the estimate counts every activation the stage's forward
             * makes, where the plan's memory planner reuses some and the
             * saved ones are only those the backward reads: over by up to
             * a third where activations dominate (one micro-batch) */
            CHECK(fabs(ratio - 1) <= 0.4,
                  "%d stages, %d micro-batches, %s: stage %d's estimate %.3f MiB is %.3f of "
                  "the %.3f MiB it holds",
                  j.S, j.M, j.gpipe ? "gpipe" : "1f1b", s, R[s].estimate / 1048576.0, ratio,
                  real / 1048576.0);
        }
    }
    printf("largest deviation of the estimate: %.1f %%\n", 100 * worst);
    remove(devfile);
    munmap(R, sizeof *R * MAXS);
    return check_summary("stage_memory");
}
