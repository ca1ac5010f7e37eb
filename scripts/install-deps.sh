#!/bin/sh
# Installs every Debian 12 package tessel's build and tests need.
# Idempotent; run as root. `--check` only reports whether anything is missing.
# `--fuzz` adds what `make fuzz` needs: clang, its libFuzzer runtime
# (libclang_rt.fuzzer-x86_64.a, in libclang-rt-14-dev, which libclang-rt-dev
# pulls in for Debian's default clang) and clang's OpenMP runtime (libomp-dev).
# `--fixtures` adds what regenerating the PyTorch/ONNX test fixtures needs
# (python3-torch, python3-onnx; tests/parity/README.md); the tests themselves
# read the committed fixtures and need neither.
set -e
PKGS="build-essential cmake pkg-config libdnnl-dev libyaml-dev libjansson-dev libgomp1 zlib1g-dev libssl-dev dataset-fashion-mnist libmicrohttpd-dev prometheus gnuplot-nox libsodium-dev libopenmpi-dev openmpi-bin libcurl4-openssl-dev python3-sklearn protobuf-c-compiler libprotobuf-c-dev libonnx-dev"
FUZZ_PKGS="clang libclang-rt-dev libomp-dev"
FIXTURE_PKGS="python3-torch python3-onnx"
# Federated training (src/fed, docs/federated.md): Paillier on GMP; openssl makes the test CA.
PKGS="$PKGS libgmp-dev openssl"
# Cluster schedulers (issue 24, docs/cluster.md): Slurm's controller and node
# daemons with munge, for tests/e2e/slurm.c (scripts/slurm-cluster.sh), and
# iproute2 for its two network-namespace hosts.
PKGS="$PKGS slurm-wlm munge iproute2"
# tessel compile --emit-c (docs/aot.md): the e2e tests build six emitted
# programs whose kernels/ are the same library sources; with ccache only the
# first build of each flavour compiles them (tests/support/emit_c.c).
PKGS="$PKGS ccache"

check=0
for a in "$@"; do
    case "$a" in
    --check) check=1 ;;
    --fuzz) PKGS="$PKGS $FUZZ_PKGS" ;;
    --fixtures) PKGS="$PKGS $FIXTURE_PKGS" ;;
    *) echo "usage: $0 [--fuzz] [--fixtures] [--check]" >&2; exit 2 ;;
    esac
done

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done

if [ "$check" = 1 ]; then
    [ -z "$missing" ] && exit 0
    echo "missing:$missing"
    exit 1
fi

if [ -z "$missing" ]; then
    echo "install-deps: all packages present"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing packages:$missing; run as root: sudo $0 $*" >&2
    exit 1
fi
echo "install-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing
