/* tessel export CKPT --peft DIR | --merge --safetensors FILE: thin, calls
 * tessel/peft.h. */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "peft_cli.h"
#include "tessel/peft.h"
#include "tessel/tessel.h"

/* The option's name without "=value". */
static int is_opt(const char *a, const char *name) {
    size_t n = strlen(name);
    return !strncmp(a, name, n) && (a[n] == 0 || a[n] == '=');
}

int tessel_export_is_peft(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (is_opt(argv[i], "--peft") || is_opt(argv[i], "--merge")) return 1;
    return 0;
}

int tessel_cmd_export_peft(int argc, char **argv) {
    const char *ckpt = NULL, *peft = NULL, *st = NULL;
    int merge = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (!strcmp(a, "--merge")) {
            merge = 1;
            continue;
        }
        if (is_opt(a, "--peft") || is_opt(a, "--safetensors")) {
            const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
            if (!v || !*v) return cli_error(CLI_USAGE, "export: %.13s needs a value", a);
            *(is_opt(a, "--peft") ? &peft : &st) = v;
            continue;
        }
        if (a[0] == '-')
            return cli_error(CLI_USAGE,
                             "export: '%s' does not go with --peft or --merge (usage: tessel "
                             "export CKPT --peft DIR, or CKPT --merge --safetensors FILE)",
                             a);
        if (ckpt) return cli_error(CLI_USAGE, "export: unexpected argument '%s'", a);
        ckpt = a;
    }
    if (!ckpt || (merge ? !st || peft : !peft || st))
        return cli_error(CLI_USAGE, "export: usage: tessel export CKPT --peft DIR, or tessel "
                                    "export CKPT --merge --safetensors FILE");
    ts_status s = merge ? ts_peft_export_merged(ckpt, st) : ts_peft_export_adapter(ckpt, peft);
    if (s != TS_OK) return cli_error(cli_status_code(s), "export: %s", ts_last_error());
    if (merge)
        printf("wrote %s: the parameters of %s with the LoRA update merged into the weights\n", st,
               ckpt);
    else
        printf("wrote %s/adapter_model.safetensors and %s/adapter_config.json (Hugging Face "
               "peft LoRA adapter) from %s\n",
               peft, peft, ckpt);
    return CLI_OK;
}
