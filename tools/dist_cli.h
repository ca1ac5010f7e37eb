/* dist_cli.h — the distributed subcommands of the `tessel` command line. */
#ifndef TESSEL_DIST_CLI_H
#define TESSEL_DIST_CLI_H

/* `tessel bench collectives [options]`: all-reduce, reduce-scatter and
 * all-gather from 4 B to 256 MiB over the shm transport, the mpi transport
 * and Open MPI's own MPI_Allreduce, in one run (the mpi part re-runs this
 * binary under mpirun). argv[0] may be "collectives" (skipped) or the first
 * option. Returns the process exit status: 0, 1 on failure, 2 on bad
 * usage. */
int tessel_cmd_bench_collectives(int argc, char **argv);

#endif
