/* onnx.c — `tessel onnx check FILE`: imports the model into a throwaway
 * graph (src/frontend/onnx) and reports what training would refuse, or a
 * summary of what it would train (docs/onnx.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "onnx_cli.h"
#include "tessel/onnx.h"

static void print_vals(const char *what, const ts_graph *g, int n, const ts_val *v,
                       char names[][128]) {
    printf("%s:", what);
    for (int i = 0; i < n; i++) {
        printf("%s %s [", i ? "," : "", names[i]);
        for (int k = 0; ts_val_ok(v[i]) && k < ts_rank(g, v[i]); k++)
            printf("%s%lld", k ? ", " : "", (long long)ts_dim(g, v[i], k));
        printf("] %s", ts_val_ok(v[i]) ? ts_dtype_name(ts_dtype_of(g, v[i])) : "?");
    }
    printf("\n");
}

static int check(const char *path, int64_t batch, int64_t seq) {
    ts_graph *g = ts_graph_new();
    if (!g) return cli_error(CLI_FAIL, "onnx check: out of memory");
    ts_onnx_info *info = malloc(sizeof *info);
    if (!info) {
        ts_graph_free(g);
        return cli_error(CLI_FAIL, "onnx check: out of memory");
    }
    ts_onnx_options o = {.batch = batch};
    o.dims[1] = seq;
    ts_status s = ts_onnx_import(g, path, &o, info);
    int rc = CLI_OK;
    if (info->n_refused) {
        printf("%s: %d node%s of %d would be refused:\n", path, info->n_refused,
               info->n_refused == 1 ? "" : "s", info->n_nodes);
        for (int i = 0; i < info->n_refused && i < TS_ONNX_MAX_REFUSED; i++)
            printf("  %s\n", info->refused[i]);
        if (info->n_refused > TS_ONNX_MAX_REFUSED)
            printf("  ... and %d more\n", info->n_refused - TS_ONNX_MAX_REFUSED);
        rc = CLI_USAGE;
    } else if (s != TS_OK) {
        rc = cli_error(cli_status_code(s), "%s", ts_last_error());
    } else {
        printf("%s: opset %lld, IR version %lld, %d nodes\n", path, (long long)info->opset,
               (long long)info->ir_version, info->n_nodes);
        print_vals("inputs", g, info->n_inputs, info->inputs, info->input_names);
        print_vals("outputs", g, info->n_outputs, info->outputs, info->output_names);
        printf("parameters: %d (%lld elements)\n", info->n_params, (long long)info->param_elems);
        printf("ops: %s\n", info->ops);
        if (info->n_fused)
            printf("fused: %d pattern%s (attention, GELU) imported as one op each\n", info->n_fused,
                   info->n_fused == 1 ? "" : "s");
        printf("sha256: %s\n", info->sha256);
    }
    free(info);
    ts_graph_free(g);
    return rc;
}

int tessel_cmd_onnx(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "check"))
        return cli_error(CLI_USAGE,
                         "onnx: usage: tessel onnx check FILE.onnx [--batch N] [--seq N]");
    const char *path = NULL;
    int64_t batch = 1, seq = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") || !strcmp(argv[i], "--seq")) {
            char *end;
            const char *opt = argv[i], *v = i + 1 < argc ? argv[++i] : "";
            const long long n = strtoll(v, &end, 10);
            if (!*v || *end || n < 1)
                return cli_error(CLI_USAGE, "onnx check: %s needs a positive integer, got '%s'",
                                 opt, v);
            *(opt[2] == 'b' ? &batch : &seq) = n;
        } else if (argv[i][0] == '-' || path) {
            return cli_error(CLI_USAGE, "onnx check: unexpected argument '%s'", argv[i]);
        } else {
            path = argv[i];
        }
    }
    if (!path) return cli_error(CLI_USAGE, "onnx check: which file? (tessel onnx check FILE.onnx)");
    return check(path, batch, seq);
}
