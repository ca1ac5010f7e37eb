/* replay_cli.h — `tessel audit replay` (tools/audit_replay.c). */
#ifndef TESSEL_REPLAY_CLI_H
#define TESSEL_REPLAY_CLI_H

#define TESSEL_REPLAY_USAGE                                                                        \
    "  audit replay RUN_DIR [--from STEP] [--to STEP] [--procs N] [--pubkey FILE] [--key FILE]\n"  \
    "      re-run steps FROM..TO of a run from its checkpoint with the recorded config and data\n" \
    "      (SHA-256 checked), compare with its checkpoint of step TO bit for bit, print a "        \
    "signed\n"                                                                                     \
    "      report and append it to the audit log (exit 0 identical, 3 different)\n"

/* argv: the arguments after "replay". */
int tessel_cmd_audit_replay(int argc, char **argv);

#endif
