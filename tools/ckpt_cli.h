/* ckpt_cli.h — the checkpoint commands of the `tessel` command line
 * (tools/ckpt.c). Each takes the arguments after its command name, e.g.
 * `tessel ckpt verify DIR` calls tessel_cmd_ckpt(2, {"verify", "DIR"}), and
 * returns the exit status (0 success, 1 internal failure, 2 bad usage or
 * input — a checkpoint or log that fails verification is bad input). */
#ifndef TESSEL_CKPT_CLI_H
#define TESSEL_CKPT_CLI_H

/* Lines for `tessel help`. */
#define TESSEL_CKPT_USAGE                                                                          \
    "  ckpt verify|inspect PATH [--pubkey FILE] [--json]\n"                                        \
    "      check a checkpoint (PATH: step-N directory or run directory -> LATEST)\n"               \
    "  ckpt diff PATH_A PATH_B [--pubkey FILE]\n"                                                  \
    "      compare two checkpoints tensor by tensor (exit 0 same, 3 different)\n"                  \
    "  ckpt gc RUN_DIR [--keep-last K] [--keep-every M]\n"                                         \
    "      remove unfinished saves and, with --keep-last, old checkpoints\n"                       \
    "  keygen [--out PREFIX]   write an Ed25519 key pair PREFIX.key (0600) and PREFIX.pub\n"       \
    "  audit verify RUN_DIR [--pubkey FILE]\n"                                                     \
    "      check the audit log's hash chain, signed heads and checkpoint anchors\n"                \
    "  export CKPT --safetensors FILE [--pubkey FILE] [--fp8 e4m3|e5m2]\n"                         \
    "      write the weights (no optimizer state) as a standard safetensors file; --fp8 stores\n"  \
    "      float weights as FP8 codes with a per-tensor F32 scale NAME.scale (docs/fp8.md)\n"

int tessel_cmd_ckpt(int argc, char **argv);
int tessel_cmd_keygen(int argc, char **argv);
int tessel_cmd_audit(int argc, char **argv);
int tessel_cmd_export(int argc, char **argv);

#endif
