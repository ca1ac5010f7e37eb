/* `tessel deploy k8s`: the manifests it writes parse back (libyaml) into
 * the structure the Kubeflow MPI Operator (MPIJob kubeflow.org/v2beta1) and
 * Kubernetes expect, with the values asked for: workers, slots, image,
 * resources, restart policies, the grace period from ckpt.signal_grace_s,
 * the preStop hook that sends SIGTERM, the ConfigMap holding the resolved
 * config (which loads as a config again) and the run directory's volume
 * claim. No Kubernetes cluster runs them here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>
#include "check.h"
#include "e2e.h"
#include "tessel/config.h"

static char dir[64];

/* The value of mapping n's key `key`, NULL when absent. */
static yaml_node_t *get(yaml_document_t *d, yaml_node_t *n, const char *key) {
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(d, p->key);
        if (kn && kn->type == YAML_SCALAR_NODE && !strcmp((char *)kn->data.scalar.value, key))
            return yaml_document_get_node(d, p->value);
    }
    return NULL;
}

/* The node at a dotted path ("spec.mpiReplicaSpecs.Worker.replicas",
 * "containers.0.image"; the rest of a path may be one key with dots:
 * "data.config.yaml"), NULL when absent. */
static yaml_node_t *at(yaml_document_t *d, yaml_node_t *n, const char *path) {
    char key[128];
    while (n && *path) {
        if (n->type == YAML_MAPPING_NODE && get(d, n, path)) return get(d, n, path);
        size_t k = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)k, path);
        path += k + (path[k] == '.');
        yaml_node_t *next = NULL;
        if (n->type == YAML_MAPPING_NODE) {
            next = get(d, n, key);
        } else if (n->type == YAML_SEQUENCE_NODE) {
            long i = atol(key);
            if (i >= 0 && i < n->data.sequence.items.top - n->data.sequence.items.start)
                next = yaml_document_get_node(d, n->data.sequence.items.start[i]);
        }
        n = next;
    }
    return n;
}

/* The scalar at path, "" when absent or not a scalar. */
static const char *s(yaml_document_t *d, const char *path) {
    yaml_node_t *n = at(d, yaml_document_get_root_node(d), path);
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : "";
}

static int load(const char *path, yaml_document_t *d) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    int ok = yaml_parser_load(&p, d) && yaml_document_get_root_node(d);
    yaml_parser_delete(&p);
    fclose(f);
    return ok;
}

#define EQ(d, path, want)                                                                          \
    CHECK(!strcmp(s(d, path), want), "%s: '%s', expected '%s'", path, s(d, path), want)

static void check_pod(yaml_document_t *d, const char *role, const char *image) {
    char p[128], b[256];
    snprintf(p, sizeof p, "spec.mpiReplicaSpecs.%s.template.spec", role);
    snprintf(b, sizeof b, "%s.terminationGracePeriodSeconds", p);
    EQ(d, b, "57"); /* ckpt.signal_grace_s 42 + 15 s */
    snprintf(b, sizeof b, "%s.containers.0.image", p);
    EQ(d, b, image);
    snprintf(b, sizeof b, "%s.containers.0.volumeMounts.0.mountPath", p);
    EQ(d, b, "/etc/tessel");
    snprintf(b, sizeof b, "%s.containers.0.volumeMounts.1.mountPath", p);
    EQ(d, b, "/runs");
    snprintf(b, sizeof b, "%s.volumes.0.configMap.name", p);
    EQ(d, b, "mnist-dp-config");
    snprintf(b, sizeof b, "%s.volumes.1.persistentVolumeClaim.claimName", p);
    EQ(d, b, "mnist-dp-runs");
}

static void test_manifests(void) {
    const char *out = e2e_path("k8s");
    e2e_result r = e2e_runf("deploy k8s examples/w1.yaml --image registry.local/tessel:1 "
                            "--workers 3 --slots 2 --cpu 4 --memory 16Gi --storage 50Gi --name "
                            "mnist-dp --max-restarts 5 --set ckpt.every=50 --set "
                            "ckpt.signal_grace_s=42 --out %s",
                            out);
    CHECK(r.rc == 0 && strstr(r.out, "mpijob.yaml"), "deploy k8s: exit %d: %s%s", r.rc, r.out,
          r.err);
    e2e_done(&r);

    yaml_document_t d;
    char path[512];
    snprintf(path, sizeof path, "%s/mpijob.yaml", out);
    CHECK(load(path, &d), "%s parses", path);
    EQ(&d, "apiVersion", "kubeflow.org/v2beta1");
    EQ(&d, "kind", "MPIJob");
    EQ(&d, "metadata.name", "mnist-dp");
    EQ(&d, "spec.slotsPerWorker", "2");
    EQ(&d, "spec.mpiImplementation", "OpenMPI");
    EQ(&d, "spec.runPolicy.backoffLimit", "5");
    EQ(&d, "spec.mpiReplicaSpecs.Launcher.replicas", "1");
    EQ(&d, "spec.mpiReplicaSpecs.Launcher.restartPolicy", "OnFailure");
    EQ(&d, "spec.mpiReplicaSpecs.Worker.replicas", "3");
    EQ(&d, "spec.mpiReplicaSpecs.Worker.restartPolicy", "OnFailure");
    check_pod(&d, "Launcher", "registry.local/tessel:1");
    check_pod(&d, "Worker", "registry.local/tessel:1");
    const char *w = "spec.mpiReplicaSpecs.Worker.template.spec.containers.0.";
    char b[256];
    snprintf(b, sizeof b, "%sresources.requests.cpu", w);
    EQ(&d, b, "4");
    snprintf(b, sizeof b, "%sresources.limits.memory", w);
    EQ(&d, b, "16Gi");
    snprintf(b, sizeof b, "%scommand.0", w);
    EQ(&d, b, "/usr/sbin/sshd");
    snprintf(b, sizeof b, "%slifecycle.preStop.exec.command.2", w);
    CHECK(strstr(s(&d, b), "kill -TERM") && strstr(s(&d, b), "-lt 42 ]"),
          "preStop sends SIGTERM and waits up to the grace: %s", s(&d, b));
    const char *cmd = s(&d, "spec.mpiReplicaSpecs.Launcher.template.spec.containers.0.command.2");
    CHECK(strstr(cmd, "tessel launch --max-restarts 5 -- mpirun") && strstr(cmd, "-np 6 ") &&
              strstr(cmd, "tessel train /etc/tessel/config.yaml --out /runs/mnist-dp") &&
              strstr(cmd, "if [ -d /runs/mnist-dp ]; then set -- --resume latest; fi"),
          "the launcher's command: %s", cmd);
    yaml_document_delete(&d);

    snprintf(path, sizeof path, "%s/pvc.yaml", out);
    CHECK(load(path, &d), "%s parses", path);
    EQ(&d, "kind", "PersistentVolumeClaim");
    EQ(&d, "metadata.name", "mnist-dp-runs");
    EQ(&d, "spec.accessModes.0", "ReadWriteMany");
    EQ(&d, "spec.resources.requests.storage", "50Gi");
    yaml_document_delete(&d);

    snprintf(path, sizeof path, "%s/configmap.yaml", out);
    CHECK(load(path, &d), "%s parses", path);
    EQ(&d, "kind", "ConfigMap");
    EQ(&d, "metadata.name", "mnist-dp-config");
    /* The embedded config loads as a config, with the overrides in it. */
    const char *text = s(&d, "data.config.yaml");
    ts_config c;
    ts_config_init(&c);
    ts_status st = ts_config_load_string(&c, text, strlen(text), "configmap");
    if (st == TS_OK) st = ts_config_finish(&c);
    CHECK(st == TS_OK && c.ckpt.every == 50 && c.ckpt.signal_grace == 42,
          "the ConfigMap's config loads (%s): ckpt.every %lld", ts_last_error(),
          (long long)c.ckpt.every);
    yaml_document_delete(&d);
}

static void test_refusals(void) {
    e2e_result r =
        e2e_runf("deploy k8s examples/w1.yaml --image x --workers 2 --out %s", e2e_path("nockpt"));
    CHECK(r.rc == 2 && strstr(r.err, "set ckpt.every"), "no checkpoints: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("deploy k8s examples/w1.yaml --image x --workers 2 --set ckpt.every=5 --name "
                 "Bad_Name --out %s",
                 e2e_path("badname"));
    CHECK(r.rc == 2 && strstr(r.err, "not a Kubernetes name"), "bad name: exit %d: %s", r.rc,
          r.err);
    e2e_done(&r);
    r = e2e_runf("deploy k8s examples/w1.yaml --workers 2 --out %s", e2e_path("noimage"));
    CHECK(r.rc == 2 && strstr(r.err, "--image IMAGE"), "no image: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("deploy swarm examples/w1.yaml");
    CHECK(r.rc == 2 && strstr(r.err, "the one target is k8s"), "unknown target: %s", r.err);
    e2e_done(&r);
}

int main(void) {
    if (!e2e_setup("deploy-k8s", dir, sizeof dir)) return check_summary("e2e/deploy_k8s");
    test_manifests();
    test_refusals();
    e2e_cleanup(dir);
    return check_summary("e2e/deploy_k8s");
}
