#!/bin/bash
# doc_commands.sh REPO BUILD — runs every `tessel ...` command shown in a shell code block of
# README.md and docs/*.md that can run here quickly, and fails if one of them fails.
#
# A command is taken from a ```sh, ```bash or plain ``` block when its line starts with
# `tessel ` or `build/tessel ` (after an optional `$ `). Skipped, and listed as skipped:
# placeholders in capitals (CONFIG, RUN, FILE ...), [optional] or a|b syntax, `...`, and
# commands that need what a test machine may lack (PyTorch: --compare-torch; many processes:
# --procs above 2; the long benchmarks and trainings). Each command runs in a scratch directory holding a
# link to the repository's examples/, so `--out runs/x` lands there; the output of a failed
# command is printed. `DOC_COMMANDS_LIST=1` only lists what would run.
set -u
REPO=$1
BUILD=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
ln -s "$REPO/examples" "$scratch/examples"
mkdir -p "$scratch/build"
ln -s "$BUILD/tessel" "$scratch/build/tessel"
export PATH="$scratch/build:$PATH"

commands() { # file: one command per line, comments cut
    awk '
        /^```/ {
            if (open) { open = 0; shell = 0 } else { open = 1; shell = ($0 ~ /^```(sh|bash|console)?[ \t]*$/) }
            next
        }
        shell && cont != "" { cont = cont " " $0; if (cont ~ /\\$/) { sub(/\\$/, "", cont); next } line = cont; cont = ""; emit(line); next }
        shell {
            line = $0
            if (line ~ /\\$/) { sub(/\\$/, "", line); cont = line; next }
            emit(line)
        }
        function emit(line) {
            sub(/^\$ /, "", line)
            if (line !~ /^(build\/)?tessel /) return
            sub(/[ \t]+#.*$/, "", line)
            gsub(/[ \t]+/, " ", line)
            print line
        }' "$1"
}

skip_reason() {
    case "$1" in
    *--compare-torch*) echo "needs PyTorch" ;;
    *"tessel bench"*) echo "a benchmark (minutes)" ;;
    *"--procs "[3-9]*) echo "more than 2 processes" ;;
    *...*) echo "elided" ;;
    *"["*|*"|"*) echo "syntax, not a command" ;;
    *"train examples/fashion_cnn.yaml"*) echo "3 epochs of the CNN (make demo trains it)" ;;
    *onnx*) if [ "$NO_ONNX" = 1 ]; then echo "tessel built without ONNX support"; fi ;;
    *"examples/w3"*"--steps "[0-9][0-9][0-9]*|*"examples/w4"*"--steps "[0-9][0-9][0-9]*)
        echo "minutes of training" ;;
    *)
        for word in $1; do # an input the docs made elsewhere (a run directory, a data file)
            case "$word" in
            runs/* | *.npy | *.tok | *.safetensors | /tmp/*)
                # ... unless this command writes it (--out, export's --peft and --safetensors)
                f=${word#*=} # a key=PATH setting names PATH
                if [ ! -e "${f%%/step-*}" ] &&
                    ! echo "$1" | grep -qF -e "--out $word" -e "--peft $word" -e "--safetensors $word"; then
                    echo "needs $word"
                    return
                fi ;;
            esac
        done
        if echo "$1" | grep -qE '(^| )[A-Z][A-Z_]{2,}([ .=/]|$)'; then echo "placeholder"; fi ;;
    esac
}

# A build without protobuf-c / libonnx-dev says so on any ONNX file.
NO_ONNX=0
"$BUILD/tessel" onnx check "$REPO/examples/onnx/mlp.onnx" 2>&1 | grep -q "built without ONNX" && NO_ONNX=1
ran=0 failed=0 skipped=0
cd "$scratch" || exit 1
for f in "$REPO/README.md" "$REPO"/docs/*.md; do
    while IFS= read -r cmd; do
        why=$(skip_reason "$cmd")
        name="${f#$REPO/}: $cmd"
        if [ -n "$why" ]; then
            skipped=$((skipped + 1))
            echo "skip ($why): $name"
            continue
        fi
        if [ "${DOC_COMMANDS_LIST:-0}" = 1 ]; then
            echo "would run: $name"
            continue
        fi
        cmd=${cmd#build/}
        if out=$(timeout 300 bash -c "$cmd" </dev/null 2>&1); then
            ran=$((ran + 1))
            echo "ok: $name"
        else
            failed=$((failed + 1))
            echo "FAIL: $name"
            echo "$out" | tail -n 20 | sed 's/^/    /'
        fi
    done < <(commands "$f")
done
echo "doc commands: $ran passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
