/* peft_cli.h — `tessel export CKPT --peft DIR | --merge --safetensors FILE`
 * (tools/peft_export.c; docs/peft.md). tessel_cmd_export hands its
 * arguments here when they name --peft or --merge. */
#ifndef TESSEL_PEFT_CLI_H
#define TESSEL_PEFT_CLI_H

#define TESSEL_PEFT_USAGE                                                                          \
    "  export CKPT --peft DIR | --merge --safetensors FILE\n"                                      \
    "      a LoRA run's checkpoint as Hugging Face peft adapter files, or the model with the\n"    \
    "      LoRA update folded into its weights (docs/peft.md)\n"

/* 1 if the export arguments ask for --peft or --merge. */
int tessel_export_is_peft(int argc, char **argv);
int tessel_cmd_export_peft(int argc, char **argv);

#endif
