#!/bin/bash
# fed-test-ca.sh DIR NAME... — a throwaway certificate authority for federated
# runs on one machine (tests, trials; docs/federated.md). Writes DIR/ca.pem
# and, per NAME, DIR/NAME.pem (certificate, CN and DNS name NAME, also valid
# for localhost and 127.0.0.1) and DIR/NAME.key (its private key, mode 0600).
# EC P-256 keys, 30 days. Not for production: the CA's key lies beside the
# certificates (DIR/ca.key) so more names can be added by running it again.
#
#     scripts/fed-test-ca.sh /tmp/fedca aggregator keyholder client1 client2 client3
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 DIR NAME..." >&2
    exit 2
fi
dir=$1
shift
mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.key" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
        -subj "/CN=tessel fed test CA $(date +%s%N)" -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
fi
for name in "$@"; do
    case "$name" in
    *[!A-Za-z0-9._-]*) echo "fed-test-ca: bad name '$name'" >&2; exit 2 ;;
    esac
    ext=$(mktemp)
    printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' \
        "$name" >"$ext"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
        -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 30 -extfile "$ext" -out "$dir/$name.pem" 2>/dev/null
    rm -f "$ext" "$dir/$name.csr"
    chmod 600 "$dir/$name.key"
    chmod 644 "$dir/$name.pem"
done
chmod 644 "$dir/ca.pem"
