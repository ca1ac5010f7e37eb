# netns-hosts.sh — two "hosts" on one machine for MPI jobs, sourced by
# examples/cluster/netns.sh and bench/compress_netns.sh (POSIX sh).
#
#   . scripts/netns-hosts.sh
#   netns_hosts_up tessel-ex 10.77.0 2 [RATE]   # prefix, subnet, slots per host, tc limit
#   netns_mpirun -np 4 build/tessel bench collectives   # mpirun in host 1, ranks on both
#   # (on exit, or by netns_hosts_down: kills what runs there, removes everything)
#
# Two network namespaces PREFIX-PID-a / -b joined by a veth pair (SUBNET.1 and
# SUBNET.2 on veth0, loopback up), optionally a token-bucket limit on both ends
# (`tc qdisc add dev veth0 root tbf rate RATE burst 1mbit latency 100ms`), a
# hostfile with SLOTS slots per host, and an rsh agent that enters the host's
# namespace where mpirun would ssh. Sets NETNS_A, NETNS_B, NETNS_DIR (a temporary
# folder removed at the end) and installs EXIT/INT/TERM traps. Needs root and
# iproute2 (and tc for RATE); `set -e` in the caller makes a failed step fatal.

netns_hosts_down() {
    for ns in ${NETNS_A:-} ${NETNS_B:-}; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    [ -z "${NETNS_DIR:-}" ] || rm -rf "$NETNS_DIR"
}

netns_hosts_up() {
    NETNS_A=$1-$$-a
    NETNS_B=$1-$$-b
    NETNS_SUBNET=$2
    NETNS_DIR=$(mktemp -d)
    trap netns_hosts_down EXIT
    trap 'exit 130' INT TERM
    ip netns add "$NETNS_A"
    ip netns add "$NETNS_B"
    ip link add veth0 netns "$NETNS_A" type veth peer name veth0 netns "$NETNS_B"
    ip -n "$NETNS_A" addr add "$2.1/24" dev veth0
    ip -n "$NETNS_B" addr add "$2.2/24" dev veth0
    for ns in "$NETNS_A" "$NETNS_B"; do
        ip -n "$ns" link set veth0 up
        ip -n "$ns" link set lo up
        [ -z "${4:-}" ] || ip netns exec "$ns" tc qdisc add dev veth0 root tbf rate "$4" burst 1mbit latency 100ms
    done
    printf '%s.1 slots=%s\n%s.2 slots=%s\n' "$2" "$3" "$2" "$3" >"$NETNS_DIR/hostfile"
    # mpirun calls `agent HOST COMMAND...` as it would call ssh.
    cat >"$NETNS_DIR/agent.sh" <<AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in
  $2.1) ns=$NETNS_A ;;
  $2.2) ns=$NETNS_B ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
    chmod +x "$NETNS_DIR/agent.sh"
}

# mpirun inside the first host (so that host is local to it), over TCP on the veth pair.
netns_mpirun() {
    ip netns exec "$NETNS_A" mpirun --allow-run-as-root --hostfile "$NETNS_DIR/hostfile" \
        --mca plm_rsh_agent "$NETNS_DIR/agent.sh" --mca btl tcp,self \
        --mca btl_tcp_if_include "$NETNS_SUBNET.0/24" --mca oob_tcp_if_include "$NETNS_SUBNET.0/24" \
        "$@"
}
