#!/bin/sh
# Run tessel on the hosts of examples/cluster/hostfile with Open MPI.
# tessel must be installed at the same path on every host (or on a shared
# file system), and `ssh nodeN` must work without a password.
#
#   sh examples/cluster/mpirun.sh [tessel arguments]   (default: the collectives benchmark)
set -e
HOSTFILE=${HOSTFILE:-$(dirname "$0")/hostfile}
NP=${NP:-4}
[ $# -gt 0 ] || set -- bench collectives --transport mpi --max 64M
# --bind-to core: one core per rank; -x: variables every rank needs.
# As root, mpirun also needs --allow-run-as-root.
exec mpirun --hostfile "$HOSTFILE" -np "$NP" --map-by slot --bind-to core \
    -x OMP_NUM_THREADS=1 -x TESSEL_DIST_TIMEOUT=${TESSEL_DIST_TIMEOUT:-600} \
    tessel "$@"
