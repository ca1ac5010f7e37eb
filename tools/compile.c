/* tessel compile: compile the configured training step and print dumps. */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "tessel/codegen.h"
#include "tessel/pipeline.h"

static const char *const kinds[] = {"ir", "plan", "memory", "stats", "config", "partition"};
enum { N_KINDS = sizeof kinds / sizeof kinds[0] };

static void print_stats(const ts_plan_stats *st) {
    const double mib = 1024.0 * 1024.0;
    struct {
        const char *name;
        size_t bytes;
    } rows[] = {
        {"arena", st->arena_bytes},
        {"  params", st->param_bytes},
        {"  grads", st->grad_bytes},
        {"  optimizer state", st->state_bytes},
        {"  io/consts", st->io_bytes},
        {"  temporaries", st->temp_bytes},
        {"naive sum", st->naive_bytes},
        {"peak live (schedule)", st->peak_live_bytes},
        {"peak live (build order)", st->naive_peak_bytes},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        printf("%-24s %14zu bytes %10.2f MiB\n", rows[i].name, rows[i].bytes,
               (double)rows[i].bytes / mib);
    printf("%-24s %14s\n", "schedule", st->schedule ? st->schedule : "build order");
    printf("%-24s %14.3f\n", "arena / naive",
           st->naive_bytes ? (double)st->arena_bytes / (double)st->naive_bytes : 0.0);
    printf("%-24s %14d\n", "instructions", st->n_instructions);
    printf("%-24s %14d\n", "in-place outputs", st->n_inplace);
    printf("%-24s %14.3f GFLOP\n", "flops per step", st->flops_per_step * 1e-9);
    printf("%-24s %14zu bytes %10.2f MiB\n", "operand bytes per step", st->operand_bytes_per_step,
           (double)st->operand_bytes_per_step / mib);
    if (st->arena_no_recompute_bytes) /* compile.max_memory_mb (docs/scheduling.md) */
        printf("%-24s %14d values, %.3f GFLOP (%.1f %% of the step), arena %.2f MiB without\n",
               "recomputed", st->n_recomputed, st->recompute_flops * 1e-9,
               st->flops_per_step > 0 ? 100.0 * st->recompute_flops / st->flops_per_step : 0.0,
               (double)st->arena_no_recompute_bytes / mib);
}

/* --emit-c DIR: the step as a standalone C program (docs/aot.md). */
static int emit_c(const cli_args *a) {
    if (a->n_dumps || a->dump_after)
        return cli_error(CLI_USAGE, "--emit-c takes no --dump or --dump-after");
    ts_config c;
    int rc = cli_load_config(a, &c);
    if (rc != CLI_OK) return rc;
    if (ts_config_check_single_process(&c, "tessel compile --emit-c") != TS_OK)
        return cli_error(CLI_USAGE, "%s", ts_last_error());
    ts_status s = ts_emit_c(&c, a->config, a->emit_c);
    if (s != TS_OK) return cli_error(cli_status_code(s), "%s", ts_last_error());
    printf("wrote %s: build with `make -C %s`, run `./train` there\n", a->emit_c, a->emit_c);
    return CLI_OK;
}

int cli_compile(const cli_args *a) {
    if (a->emit_c) return emit_c(a);
    /* --dump-after alone prints only that graph (no default stats) */
    int which[CLI_MAX_ARGS], n = a->n_dumps ? a->n_dumps : !a->dump_after, need_plan = 0;
    for (int i = 0; i < n; i++) {
        const char *k = a->n_dumps ? a->dumps[i] : "stats";
        which[i] = -1;
        for (int j = 0; j < N_KINDS; j++)
            if (!strcmp(k, kinds[j])) which[i] = j;
        if (which[i] < 0)
            return cli_error(CLI_USAGE,
                             "--dump: unknown kind '%s' (ir, plan, memory, stats, "
                             "config, partition)",
                             k);
        need_plan |= which[i] < 4;
    }
    need_plan |= a->dump_after != NULL;
    ts_config c;
    int rc = cli_load_config(a, &c);
    if (rc != CLI_OK) return rc;
    /* The plan compiled here is one process's: refuse dist.* rather than ignore it. */
    if (need_plan && ts_config_check_single_process(&c, "tessel compile") != TS_OK)
        return cli_error(CLI_USAGE, "%s", ts_last_error());

    ts_graph *g = NULL;
    ts_plan *plan = NULL;
    if (need_plan) {
        ts_model m;
        ts_train_spec spec;
        ts_compile_options opt;
        ts_status s = ts_session_build_model(&c, &g, &m, &spec, &opt);
        /* the plan keeps no graph: the IR and memory dumps are rendered
         * while compiling */
        for (int i = 0; i < n; i++) opt.keep_dumps |= which[i] == 0 || which[i] == 2;
        if (a->dump_after) { /* printed by the pipeline, during the compile */
            opt.dump_after = a->dump_after;
            opt.dump_to = stdout;
            if (n > 0) printf("== after %s ==\n", a->dump_after);
        }
        if (s == TS_OK) s = ts_compile(g, &spec, &opt, &plan);
        if (s != TS_OK) {
            ts_graph_free(g);
            return cli_error(cli_status_code(s), "%s", ts_last_error());
        }
    }
    ts_status s = TS_OK;
    for (int i = 0; i < n && s == TS_OK; i++) {
        if (n > 1 || a->dump_after)
            printf("%s== %s ==\n", i || a->dump_after ? "\n" : "", kinds[which[i]]);
        switch (which[i]) {
        case 0: s = ts_plan_dump(plan, TS_DUMP_IR, stdout); break;
        case 1: s = ts_plan_dump(plan, TS_DUMP_PLAN, stdout); break;
        case 2: s = ts_plan_dump(plan, TS_DUMP_MEMORY, stdout); break;
        case 3: {
            ts_plan_stats st;
            if ((s = ts_plan_get_stats(plan, &st)) == TS_OK) print_stats(&st);
            break;
        }
        case 4: s = ts_config_write(&c, stdout); break;
        default: { /* the pipeline stages dist.pipeline_stages asks for */
            ts_partition *part = NULL;
            if ((s = ts_config_partition(&c, &part)) == TS_OK) s = ts_partition_print(part, stdout);
            ts_partition_free(part);
            break;
        }
        }
    }
    ts_plan_free(plan);
    ts_graph_free(g);
    if (fflush(stdout) != 0 && s == TS_OK) return cli_error(CLI_FAIL, "writing the dump failed");
    return s == TS_OK ? CLI_OK : cli_error(CLI_FAIL, "%s", ts_last_error());
}
