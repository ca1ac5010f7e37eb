#!/bin/sh
# Two "hosts" on one machine: network namespaces joined by a veth pair
# (10.77.0.1 and 10.77.0.2), two ranks each, started by mpirun through an
# rsh agent that enters the namespace instead of ssh. tessel sees two hosts
# (host identity = host name + network namespace, docs/distributed.md), so
# the hierarchical all-reduce and every byte between the hosts go over the
# veth pair. Needs root and iproute2; removes what it created on exit.
#
#   sudo sh examples/cluster/netns.sh [tessel arguments]
#        (default: bench collectives --transport mpi --ops all_reduce
#         --min 64K --max 1M --time 0.02; its cache file name shows "2h")
set -eu
TESSEL=$(realpath "${TESSEL:-build/tessel}")
. "$(dirname "$0")/../../scripts/netns-hosts.sh"
netns_hosts_up tessel-ex 10.77.0 2

[ $# -gt 0 ] || set -- bench collectives --transport mpi --ops all_reduce --min 64K --max 1M --time 0.02
netns_mpirun -np 4 "$TESSEL" "$@"
