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
A=tessel-ex-$$-a
B=tessel-ex-$$-b
dir=$(mktemp -d)
cleanup() {
    for ns in $A $B; do
        for p in $(ip netns pids $ns 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        ip netns del $ns 2>/dev/null || true
    done
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add $A
ip netns add $B
ip link add veth0 netns $A type veth peer name veth0 netns $B
ip -n $A addr add 10.77.0.1/24 dev veth0
ip -n $B addr add 10.77.0.2/24 dev veth0
for ns in $A $B; do
    ip -n $ns link set veth0 up
    ip -n $ns link set lo up
done
printf '10.77.0.1 slots=2\n10.77.0.2 slots=2\n' >"$dir/hostfile"
# mpirun calls `agent HOST COMMAND...` as it would call ssh.
cat >"$dir/agent.sh" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in
  10.77.0.1) ns=$A ;;
  10.77.0.2) ns=$B ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$dir/agent.sh"

[ $# -gt 0 ] || set -- bench collectives --transport mpi --ops all_reduce --min 64K --max 1M --time 0.02
# mpirun runs in the first namespace, so that host is local to it.
ip netns exec $A mpirun --allow-run-as-root --hostfile "$dir/hostfile" -np 4 \
    --mca plm_rsh_agent "$dir/agent.sh" --mca btl tcp,self \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    "$TESSEL" "$@"
