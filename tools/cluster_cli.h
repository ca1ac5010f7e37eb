/* cluster_cli.h — the cluster commands: `tessel launch` (restarts under
 * mpirun or srun, tools/launch.c) and `tessel deploy k8s` (a Kubernetes
 * MPIJob, tools/deploy.c). docs/cluster.md. */
#ifndef TESSEL_CLUSTER_CLI_H
#define TESSEL_CLUSTER_CLI_H

#define TESSEL_CLUSTER_USAGE                                                                       \
    "  launch [--max-restarts K] -- COMMAND ...\n"                                                 \
    "      run a job launcher's command (mpirun/srun ... tessel train ... --out RUN_DIR) and\n"    \
    "      run it again with --resume latest when it fails, up to K times; names the rank\n"       \
    "      and host that died\n"                                                                   \
    "  deploy k8s CONFIG.yaml --image IMAGE --workers N --out DIR [--slots N] [--cpu C]\n"         \
    "        [--memory M] [--storage S] [--name NAME]\n"                                           \
    "      write a Kubeflow MPIJob (v2beta1), a ConfigMap with the config and a volume claim\n"    \
    "      for the run directory into DIR (grace period from ckpt.signal_grace_s)\n"

/* argv holds the arguments after "launch" / "deploy". Exit status: that
 * of tessel train (0, 1, 2, 130). */
int tessel_cmd_launch(int argc, char **argv);
int tessel_cmd_deploy(int argc, char **argv);

#endif
