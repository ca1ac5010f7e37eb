/* tessel deploy k8s CONFIG.yaml --image IMAGE --workers N --out DIR: the
 * manifests of a training job for the Kubeflow MPI Operator (MPIJob
 * kubeflow.org/v2beta1), written into DIR:
 *
 *   configmap.yaml  the resolved config (the --set overrides included)
 *   pvc.yaml        a ReadWriteMany volume claim for the run directory
 *   mpijob.yaml     launcher + N workers: `tessel launch` restarts a failed
 *                   mpirun from the latest checkpoint; a pod termination
 *                   reaches tessel through a preStop hook (SIGTERM, then it
 *                   waits), within a grace period of ckpt.signal_grace_s
 *                   plus a margin (docs/cluster.md, "Kubernetes").
 *
 * No cluster runs them here: tests/e2e/deploy_k8s.c parses them back and
 * checks their structure and values. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "cli.h"
#include "cluster_cli.h"

/* Seconds Kubernetes waits beyond ckpt.signal_grace_s: the preStop hook's
 * own start and the processes' exit after the checkpoint. */
enum { GRACE_MARGIN_S = 15 };

typedef struct deploy_args {
    const char *config, *image, *out, *name, *cpu, *memory, *storage;
    int workers, slots, max_restarts;
    const char *sets[CLI_MAX_ARGS];
    int n_sets;
} deploy_args;

/* A YAML double-quoted scalar. */
static void q(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\x%02x", (unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

/* A Kubernetes name: lower-case letters, digits and '-', starting with a
 * letter, at most 40 characters (room for the operator's suffixes). */
static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 40 || s[0] < 'a' || s[0] > 'z' || s[n - 1] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return 0;
    return 1;
}

static int parse_int(const char *opt, const char *v, int lo, int hi, int *out) {
    char *end;
    long k = strtol(v, &end, 10);
    if (*end || end == v || k < lo || k > hi)
        return cli_error(CLI_USAGE, "deploy k8s: %s takes %d .. %d, got '%s'", opt, lo, hi, v);
    *out = (int)k;
    return CLI_OK;
}

static int parse(int argc, char **argv, deploy_args *a) {
    memset(a, 0, sizeof *a);
    a->name = "tessel";
    a->cpu = "2";
    a->memory = "8Gi";
    a->storage = "20Gi";
    a->slots = 1;
    a->max_restarts = 3;
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = CLI_OK;
        if (o[0] != '-') {
            if (a->config)
                return cli_error(CLI_USAGE, "deploy k8s takes one config, got '%s' and '%s'",
                                 a->config, o);
            a->config = o;
            continue;
        }
        if (!v) return cli_error(CLI_USAGE, "deploy k8s: %s needs a value", o);
        i++;
        if (!strcmp(o, "--image"))
            a->image = v;
        else if (!strcmp(o, "--out"))
            a->out = v;
        else if (!strcmp(o, "--name"))
            a->name = v;
        else if (!strcmp(o, "--cpu"))
            a->cpu = v;
        else if (!strcmp(o, "--memory"))
            a->memory = v;
        else if (!strcmp(o, "--storage"))
            a->storage = v;
        else if (!strcmp(o, "--workers"))
            rc = parse_int(o, v, 1, 100000, &a->workers);
        else if (!strcmp(o, "--slots"))
            rc = parse_int(o, v, 1, 1024, &a->slots);
        else if (!strcmp(o, "--max-restarts"))
            rc = parse_int(o, v, 0, 1000000, &a->max_restarts);
        else if (!strcmp(o, "--set") && a->n_sets < CLI_MAX_ARGS)
            a->sets[a->n_sets++] = v;
        else
            return cli_error(CLI_USAGE, "deploy k8s: unknown option '%s'", o);
        if (rc != CLI_OK) return rc;
    }
    if (!a->config || !a->image || !a->out || !a->workers)
        return cli_error(CLI_USAGE, "deploy k8s needs CONFIG.yaml, --image IMAGE, --workers N "
                                    "and --out DIR");
    if (!valid_name(a->name))
        return cli_error(CLI_USAGE,
                         "deploy k8s: --name '%s' is not a Kubernetes name (a-z, 0-9 and '-', "
                         "starting with a letter, at most 40 characters)",
                         a->name);
    return CLI_OK;
}

static FILE *open_out(const char *dir, const char *file, char *path, size_t n) {
    snprintf(path, n, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (!f) cli_error(CLI_FAIL, "deploy k8s: cannot write %s: %s", path, strerror(errno));
    return f;
}

static int finish(FILE *f, const char *path) {
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return cli_error(CLI_FAIL, "deploy k8s: writing %s failed", path);
    printf("wrote %s\n", path);
    return CLI_OK;
}

static int write_configmap(const deploy_args *a, const ts_config *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) return cli_error(CLI_FAIL, "deploy k8s: out of memory");
    ts_status s = ts_config_write(c, m);
    fclose(m);
    if (s != TS_OK) {
        free(text);
        return cli_error(CLI_FAIL, "deploy k8s: %s", ts_last_error());
    }
    char path[1024];
    FILE *f = open_out(a->out, "configmap.yaml", path, sizeof path);
    if (!f) {
        free(text);
        return CLI_FAIL;
    }
    fprintf(f, "# The training config (resolved by tessel deploy k8s from %s).\n", a->config);
    fprintf(f, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s-config\ndata:\n", a->name);
    fprintf(f, "  config.yaml: |\n");
    for (char *l = text; l && *l;) {
        char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        fprintf(f, "    %.*s\n", (int)n, l);
        l = e ? e + 1 : NULL;
    }
    free(text);
    return finish(f, path);
}

static int write_pvc(const deploy_args *a) {
    char path[1024];
    FILE *f = open_out(a->out, "pvc.yaml", path, sizeof path);
    if (!f) return CLI_FAIL;
    fprintf(f, "# The run directory and its checkpoints, shared by the launcher and the\n"
               "# workers (rank 0 writes it; a restarted job resumes from it).\n");
    fprintf(f, "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: %s-runs\n",
            a->name);
    fprintf(f, "spec:\n  accessModes:\n    - ReadWriteMany\n  resources:\n    requests:\n"
               "      storage: ");
    q(f, a->storage);
    fputc('\n', f);
    return finish(f, path);
}

/* The volumes and mounts every pod gets. */
static void volumes(FILE *f, const deploy_args *a) {
    fprintf(f,
            "          volumes:\n"
            "            - name: config\n"
            "              configMap:\n"
            "                name: %s-config\n"
            "            - name: runs\n"
            "              persistentVolumeClaim:\n"
            "                claimName: %s-runs\n",
            a->name, a->name);
}
static void mounts(FILE *f) {
    fprintf(f, "              volumeMounts:\n"
               "                - name: config\n"
               "                  mountPath: /etc/tessel\n"
               "                  readOnly: true\n"
               "                - name: runs\n"
               "                  mountPath: /runs\n");
}

static int write_mpijob(const deploy_args *a, const ts_config *c) {
    char path[1024];
    FILE *f = open_out(a->out, "mpijob.yaml", path, sizeof path);
    if (!f) return CLI_FAIL;
    const int np = a->workers * a->slots;
    const int grace = (int)ceil(c->ckpt.signal_grace) + GRACE_MARGIN_S;
    char run[600], script[2048];
    snprintf(run, sizeof run, "/runs/%s", a->name);
    /* The launcher: a run directory that exists is continued (a restarted
     * pod, a preempted job), else started; tessel launch restarts mpirun
     * when a rank dies. */
    snprintf(script, sizeof script,
             "if [ -d %s ]; then set -- --resume latest; fi; exec tessel launch --max-restarts %d "
             "-- mpirun --allow-run-as-root -np %d --bind-to none -x OMP_NUM_THREADS "
             "-x TESSEL_DIST_TIMEOUT tessel train /etc/tessel/config.yaml --out %s \"$@\"",
             run, a->max_restarts, np, run);
    fprintf(f,
            "# Training %s on %d workers x %d ranks (tessel deploy k8s). Apply with the\n"
            "# ConfigMap and the volume claim beside it:\n"
            "#   kubectl apply -f configmap.yaml -f pvc.yaml -f mpijob.yaml\n"
            "# On a pod's termination (preemption, a drained node) the preStop hook sends\n"
            "# SIGTERM to tessel, whose ranks end their step and commit a checkpoint\n"
            "# (ckpt.on_signal: %s) within ckpt.signal_grace_s = %g s; the grace period\n"
            "# is that plus %d s. A restarted launcher resumes from the latest checkpoint.\n",
            a->config, a->workers, a->slots,
            c->ckpt.on_signal == TS_ON_SIGNAL_SAVE ? "save" : "none", c->ckpt.signal_grace,
            GRACE_MARGIN_S);
    fprintf(f, "apiVersion: kubeflow.org/v2beta1\nkind: MPIJob\nmetadata:\n  name: %s\n", a->name);
    fprintf(f,
            "spec:\n  slotsPerWorker: %d\n  runPolicy:\n    cleanPodPolicy: Running\n"
            "    backoffLimit: %d\n  mpiImplementation: OpenMPI\n  mpiReplicaSpecs:\n",
            a->slots, a->max_restarts);
    /* Launcher */
    fprintf(f,
            "    Launcher:\n      replicas: 1\n      restartPolicy: OnFailure\n"
            "      template:\n        spec:\n          terminationGracePeriodSeconds: %d\n"
            "          containers:\n            - name: launcher\n              image: ",
            grace);
    q(f, a->image);
    fprintf(f, "\n              command:\n                - sh\n                - -c\n"
               "                - ");
    q(f, script);
    fprintf(f,
            "\n              env:\n"
            "                - name: OMP_NUM_THREADS\n                  value: \"%d\"\n"
            "                - name: TESSEL_DIST_TIMEOUT\n                  value: \"600\"\n",
            1);
    fprintf(f, "              resources:\n                requests:\n"
               "                  cpu: \"1\"\n                  memory: 1Gi\n");
    mounts(f);
    volumes(f, a);
    /* Workers */
    fprintf(f,
            "    Worker:\n      replicas: %d\n      restartPolicy: OnFailure\n"
            "      template:\n        spec:\n          terminationGracePeriodSeconds: %d\n"
            "          containers:\n            - name: worker\n              image: ",
            a->workers, grace);
    q(f, a->image);
    /* The operator's launcher starts the ranks over ssh (deploy/Containerfile). */
    fprintf(f, "\n              command:\n                - /usr/sbin/sshd\n                - -De");
    fprintf(f, "\n              lifecycle:\n                preStop:\n                  exec:\n"
               "                    command:\n                      - sh\n"
               "                      - -c\n                      - ");
    char stop[512];
    snprintf(stop, sizeof stop,
             "for p in $(pidof tessel); do kill -TERM $p; done; i=0; while pidof tessel "
             ">/dev/null && [ $i -lt %d ]; do sleep 1; i=$((i+1)); done",
             (int)ceil(c->ckpt.signal_grace));
    q(f, stop);
    fprintf(f, "\n              resources:\n                requests:\n                  cpu: ");
    q(f, a->cpu);
    fprintf(f, "\n                  memory: ");
    q(f, a->memory);
    fprintf(f, "\n                limits:\n                  cpu: ");
    q(f, a->cpu);
    fprintf(f, "\n                  memory: ");
    q(f, a->memory);
    fputc('\n', f);
    mounts(f);
    volumes(f, a);
    return finish(f, path);
}

int tessel_cmd_deploy(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "k8s"))
        return cli_error(CLI_USAGE, "deploy: the one target is k8s (tessel deploy k8s CONFIG.yaml "
                                    "--image IMAGE --workers N --out DIR)");
    deploy_args a;
    int rc = parse(argc - 1, argv + 1, &a);
    if (rc != CLI_OK) return rc;
    cli_args ca;
    memset(&ca, 0, sizeof ca);
    ca.config = a.config;
    for (int i = 0; i < a.n_sets; i++) ca.sets[ca.n_sets++] = a.sets[i];
    ts_config c;
    if ((rc = cli_load_config(&ca, &c)) != CLI_OK) return rc;
    if (c.ckpt.every <= 0 || c.ckpt.on_signal != TS_ON_SIGNAL_SAVE)
        return cli_error(CLI_USAGE,
                         "deploy k8s: the job resumes from checkpoints after a restart or a "
                         "preemption: set ckpt.every (e.g. --set ckpt.every=100) and keep "
                         "ckpt.on_signal save");
    if (mkdir(a.out, 0755) != 0 && errno != EEXIST)
        return cli_error(CLI_FAIL, "deploy k8s: cannot create %s: %s", a.out, strerror(errno));
    if ((rc = write_configmap(&a, &c)) != CLI_OK) return rc;
    if ((rc = write_pvc(&a)) != CLI_OK) return rc;
    return write_mpijob(&a, &c);
}
