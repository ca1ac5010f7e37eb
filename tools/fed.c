/* tools/fed.c — `tessel fed serve|keyholder|join CONFIG [--set k=v ...] --out DIR`:
 * loads the config and runs one role of tessel/fed.h. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "fed_cli.h"
#include "tessel/fed.h"

int tessel_cmd_fed(int argc, char **argv) {
    if (argc < 1 ||
        (strcmp(argv[0], "serve") && strcmp(argv[0], "keyholder") && strcmp(argv[0], "join")))
        return cli_error(CLI_USAGE, "fed: give a role: serve, keyholder or join (see tessel help)");
    const char *role = argv[0];
    cli_args a;
    memset(&a, 0, sizeof a);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            if (a.n_sets == CLI_MAX_ARGS) return cli_error(CLI_USAGE, "too many --set options");
            a.sets[a.n_sets++] = argv[++i];
        } else if (!strncmp(argv[i], "--set=", 6)) {
            if (a.n_sets == CLI_MAX_ARGS) return cli_error(CLI_USAGE, "too many --set options");
            a.sets[a.n_sets++] = argv[i] + 6;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            a.out = argv[++i];
        } else if (argv[i][0] == '-') {
            return cli_error(CLI_USAGE, "fed %s: unknown option '%s' (options: --set, --out)", role,
                             argv[i]);
        } else if (a.config) {
            return cli_error(CLI_USAGE, "fed %s takes one config file, got '%s' and '%s'", role,
                             a.config, argv[i]);
        } else {
            a.config = argv[i];
        }
    }
    if (!a.config) return cli_error(CLI_USAGE, "fed %s: missing CONFIG.yaml", role);
    if (!a.out) return cli_error(CLI_USAGE, "fed %s: missing --out DIR", role);
    static ts_config c;
    int rc = cli_load_config(&a, &c);
    if (rc != CLI_OK) return rc;
    signal(SIGPIPE, SIG_IGN); /* a peer that vanishes is an error, not a signal */
    ts_status s = !strcmp(role, "serve")       ? ts_fed_serve(&c, a.out)
                  : !strcmp(role, "keyholder") ? ts_fed_keyholder(&c, a.out)
                                               : ts_fed_join(&c, a.out);
    if (s != TS_OK)
        return cli_error(s == TS_ERR_INVALID || s == TS_ERR_FORMAT ? CLI_USAGE : CLI_FAIL,
                         "fed %s: %s", role, ts_last_error());
    printf("fed %s: done\n", role);
    return CLI_OK;
}
