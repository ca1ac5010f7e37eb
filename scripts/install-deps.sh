#!/bin/sh
# Installs every Debian 12 package tessel's build and tests need.
# Idempotent; run as root. `--check` only reports whether anything is missing.
set -e
PKGS="build-essential cmake pkg-config libdnnl-dev libyaml-dev libjansson-dev libgomp1 zlib1g-dev libssl-dev dataset-fashion-mnist libmicrohttpd-dev prometheus gnuplot-nox libsodium-dev libopenmpi-dev openmpi-bin libcurl4-openssl-dev python3-sklearn protobuf-c-compiler libprotobuf-c-dev libonnx-dev python3-onnx python3-torch"

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done

if [ "$1" = "--check" ]; then
    [ -z "$missing" ] && exit 0
    echo "missing:$missing"
    exit 1
fi

if [ -z "$missing" ]; then
    echo "install-deps: all packages present"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing packages:$missing; run as root: sudo $0" >&2
    exit 1
fi
echo "install-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing
