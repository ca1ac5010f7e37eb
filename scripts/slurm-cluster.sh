#!/bin/bash
# A throwaway Slurm cluster of two "hosts" on this machine, for tests and
# docs/cluster.md: two network namespaces joined by a veth pair (10.78.0.1
# and 10.78.0.2, as tests/e2e/dist_netns.c does with 10.77.0.x), one
# slurmd in each (`slurmd -N n1`, `-N n2`), slurmctld in the first, and one
# munged with a fresh key. Everything lives in DIR: the key, slurm.conf,
# state, spool, logs, pid files. No cgroups (proctrack/linuxproc,
# task/none), SlurmUser root; needs root, iproute2, slurm-wlm and munge
# (scripts/install-deps.sh).
#
#   scripts/slurm-cluster.sh start DIR       # exit 0 once both nodes are idle; 77: cannot run here
#   scripts/slurm-cluster.sh exec DIR CMD... # CMD in host n1's namespace, SLURM_CONF set
#   scripts/slurm-cluster.sh stop DIR        # kills every daemon and job, removes the namespaces
#   scripts/slurm-cluster.sh kill-node DIR n2   # node n2 is lost: its slurmd and every process on it die
#   scripts/slurm-cluster.sh start-node DIR n2  # ... and comes back (a new slurmd)
#
# `exec` is how srun, sbatch, squeue and scancel reach the cluster: the
# controller listens on 10.78.0.1, inside the namespaces. `stop` is safe to
# run twice and after a failed `start`; a test calls it from a trap.
set -euo pipefail

die() {
    echo "slurm-cluster: $*" >&2
    exit 1
}
[ $# -ge 2 ] || die "usage: $0 start|exec|stop|kill-node|start-node DIR [CMD...|NODE]"
cmd=$1
dir=$2
shift 2
[ "$cmd" = start ] && mkdir -p "$dir"
[ -d "$dir" ] || die "$dir: no such directory"
dir=$(realpath "$dir")
# The namespaces' names come from DIR, so two clusters in two directories
# do not clash; `stop` finds them again.
tag=$(printf '%s' "$dir" | cksum | cut -d' ' -f1)
nsa=tslurm-$tag-a
nsb=tslurm-$tag-b

stop() {
    # Daemons first (by the pid files they wrote), then anything else left
    # in the namespaces (slurmstepd and its tasks), then the namespaces.
    for f in "$dir"/slurmd-n1.pid "$dir"/slurmd-n2.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
        [ -s "$f" ] || continue
        pid=$(cat "$f")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$f"
    done
    for ns in $nsa $nsb; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
}

# slurmd -N NODE in NODE's namespace, in a mount namespace of its own that
# shows it its own DIR/nodetmp (TmpFS: PMIx's directories, named by job and
# step, would clash between two slurmd on one file system); everything
# else, /tmp included, is shared. nsenter, not `ip netns exec`: that one
# also mounts a fresh /sys, which hides /sys/fs/cgroup, and slurmd 22.05
# will not start without a cgroup mount even with the cgroup-free plugins.
start_slurmd() {
    local n=$1 ns=$nsa
    [ "$n" = n2 ] && ns=$nsb
    mkdir -p "$dir/tmp-$n"
    nsenter --net=/run/netns/"$ns" unshare --mount --propagation slave sh -c \
        'mount --bind "$1/tmp-$2" "$1/nodetmp" && exec slurmd -f "$1/slurm.conf" -N "$2"' sh "$dir" "$n"
}

case "$cmd" in
kill-node | start-node)
    [ "${1:-}" = n1 ] || [ "${1:-}" = n2 ] || die "$cmd: which node, n1 or n2?"
    ns=$nsa
    [ "$1" = n2 ] && ns=$nsb
    export SLURM_CONF=$dir/slurm.conf
    if [ "$cmd" = start-node ]; then
        start_slurmd "$1"
        exit 0
    fi
    [ -s "$dir/slurmd-$1.pid" ] && kill -9 "$(cat "$dir/slurmd-$1.pid")" 2>/dev/null || true
    rm -f "$dir/slurmd-$1.pid"
    # Everything on the node: slurmstepd and the job's tasks (on n1, not
    # the controller, which is not part of a node).
    ctl=$(cat "$dir/slurmctld.pid" 2>/dev/null || true)
    for p in $(ip netns pids "$ns"); do
        [ "$p" = "$ctl" ] && continue
        [ "$(awk '{print $4}' /proc/"$p"/stat 2>/dev/null)" = "$ctl" ] && continue # slurmscriptd
        kill -9 "$p" 2>/dev/null || true
    done
    exit 0
    ;;
stop)
    stop
    exit 0
    ;;
exec)
    [ $# -gt 0 ] || die "exec: no command"
    export SLURM_CONF=$dir/slurm.conf
    exec nsenter --net=/run/netns/"$nsa" "$@"
    ;;
start) ;;
*) die "unknown command '$cmd' (start, exec, stop, kill-node or start-node)" ;;
esac

# Exit 77: this machine cannot run the cluster (the tests skip).
cannot() {
    echo "slurm-cluster: cannot run here: $*" >&2
    exit 77
}
[ "$(id -u)" = 0 ] || cannot "needs root (network namespaces, slurmd as SlurmUser root)"
for t in ip nsenter unshare munged mungekey slurmctld slurmd sinfo srun sbatch scontrol; do
    command -v $t >/dev/null ||
        cannot "$t not found (scripts/install-deps.sh installs slurm-wlm, munge and iproute2)"
done
[ -n "$(ls /usr/lib/*/slurm-wlm/mpi_pmix*.so /usr/lib*/slurm/mpi_pmix*.so 2>/dev/null)" ] ||
    cannot "Slurm's PMIx plugin (mpi_pmix.so) is missing"
stop
ip netns add "$nsa" 2>/dev/null || cannot "cannot create a network namespace (ip netns add)"
trap 'stop' ERR
ip netns add "$nsb"
ip link add veth0 netns "$nsa" type veth peer name veth0 netns "$nsb"
ip -n "$nsa" addr add 10.78.0.1/24 dev veth0
ip -n "$nsb" addr add 10.78.0.2/24 dev veth0
for ns in $nsa $nsb; do
    ip -n "$ns" link set veth0 up
    ip -n "$ns" link set lo up
done

mkdir -p "$dir/state" "$dir/spool/n1" "$dir/spool/n2" "$dir/nodetmp"
rm -f "$dir/munge.key"
mungekey --create --keyfile="$dir/munge.key" --bits=1024
chmod 0400 "$dir/munge.key"
# munged refuses a socket directory others can write to.
chmod 0755 "$dir"
munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"

cpus=$(nproc)
cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-cluster.sh: two nodes in two network namespaces.
ClusterName=tessel
SlurmctldHost=$(hostname -s)(10.78.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: a requeued job may start this many seconds later (default 120).
AuthInfo=socket=$dir/munge.sock,cred_expire=5
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
TmpFS=$dir/nodetmp
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
# Preemption: SIGTERM, then KillWait seconds, then SIGKILL (ckpt.signal_grace_s).
KillWait=30
# Finished jobs stay visible to scontrol for 5 minutes.
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
NodeName=n1 NodeAddr=10.78.0.1 NodeHostname=n1 CPUs=$cpus State=UNKNOWN
NodeName=n2 NodeAddr=10.78.0.2 NodeHostname=n2 CPUs=$cpus State=UNKNOWN
PartitionName=main Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
export SLURM_CONF=$dir/slurm.conf
innet() {
    local ns=$1
    shift
    nsenter --net=/run/netns/"$ns" "$@"
}
innet "$nsa" slurmctld -f "$dir/slurm.conf" -i
start_slurmd n1
start_slurmd n2
for _ in $(seq 150); do
    if [ "$(innet "$nsa" sinfo -h -o '%T' -N 2>/dev/null | sort -u)" = idle ] &&
        [ "$(innet "$nsa" sinfo -h -N -o '%N' | wc -l)" = 2 ]; then
        exit 0
    fi
    sleep 0.2
done
echo "slurm-cluster: the nodes did not become idle within 30 s:" >&2
innet "$nsa" sinfo -N -l >&2 || true
for f in "$dir"/slurmctld.log "$dir"/slurmd-*.log; do tail -n 5 "$f" >&2 || true; done
stop
exit 1
