/* onnx_cli.h — the `tessel onnx` subcommand (tools/onnx.c). */
#ifndef TESSEL_ONNX_CLI_H
#define TESSEL_ONNX_CLI_H

/* Lines for `tessel help`. */
#define TESSEL_ONNX_USAGE                                                                          \
    "  onnx check FILE.onnx [--batch N] [--seq N]\n"                                               \
    "      import an ONNX model as training would (the dynamic batch takes N, default 1; a\n"      \
    "      dynamic second axis --seq); list every node that would be refused (exit 2), or its\n"   \
    "      inputs, outputs, parameters, ops\n"                                                     \
    "  export CKPT --onnx FILE [--pubkey FILE] [--opset 17|18] [--weights f32|fp16|bf16]\n"        \
    "      write the checkpoint's trained model (forward graph, dynamic batch) as ONNX\n"          \
    "  export CKPT --triton DIR [--name NAME] [--max-batch N] [--onnx FILE] ...\n"                 \
    "      the same as a Triton model repository: DIR/NAME/1/model.onnx, DIR/NAME/config.pbtxt\n"

/* argv holds the arguments after "onnx"; returns the exit status (0
 * success, 1 internal failure, 2 bad usage, an unreadable or refused model). */
int tessel_cmd_onnx(int argc, char **argv);
/* `tessel export ... --onnx FILE` (tools/onnx_export.c): argv holds the
 * arguments after "export". */
int tessel_cmd_export_onnx(int argc, char **argv);

#endif
