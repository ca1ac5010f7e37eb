/* fed_cli.h — the `tessel fed serve|keyholder|join CONFIG` subcommands. */
#ifndef TESSEL_FED_CLI_H
#define TESSEL_FED_CLI_H

#define TESSEL_FED_USAGE                                                                           \
    "  fed serve|keyholder|join CONFIG.yaml [--set key=value ...] --out DIR\n"                     \
    "      federated training (docs/federated.md): serve runs the aggregator (adds encrypted\n"    \
    "      updates, holds no secret key), keyholder decrypts only each round's sum and saves\n"    \
    "      the global model as checkpoints in DIR, join trains fed.local_steps per round on\n"     \
    "      this site's data and sends its encrypted update; TLS per fed.tls.*\n"

/* argv: the arguments after "fed". Returns the exit status. */
int tessel_cmd_fed(int argc, char **argv);

#endif
