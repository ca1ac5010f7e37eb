/* Host identity for the hierarchical algorithms (ts_dist_host_id): the
 * machine's name plus its network namespace, or TESSEL_HOST. A process in
 * a new network namespace (when this test may create one) is another
 * host; the same namespace on the same machine is the same host. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "dist/comm.h"

int main(void) {
    char id[384], id2[384], want[512], name[256] = "", ns[64] = "";
    unsetenv("TESSEL_HOST");
    ts_dist_host_id(id, sizeof id);
    gethostname(name, sizeof name - 1);
    ssize_t k = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    ns[k > 0 ? k : 0] = 0;
    snprintf(want, sizeof want, "%s/%s", name, ns);
    CHECK(k > 0 && !strcmp(id, want), "host id '%s', expected '%s'", id, want);
    ts_dist_host_id(id2, sizeof id2);
    CHECK(!strcmp(id, id2) && ts_dist_host_hash() == ts_hash_str(id), "stable, hash of the id");

    setenv("TESSEL_HOST", "node7", 1);
    ts_dist_host_id(id2, sizeof id2);
    CHECK(!strcmp(id2, "node7") && ts_dist_host_hash() == ts_hash_str("node7"),
          "TESSEL_HOST overrides: '%s'", id2);
    setenv("TESSEL_HOST", "", 1);
    ts_dist_host_id(id2, sizeof id2);
    CHECK(!strcmp(id2, id), "empty TESSEL_HOST is ignored: '%s'", id2);
    unsetenv("TESSEL_HOST");

    /* A child in its own network namespace is another host. */
    char *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shared != MAP_FAILED, "mmap");
    if (shared == MAP_FAILED) return check_summary("dist_host");
    memset(shared, 0, 4096);
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        if (unshare(CLONE_NEWNET) != 0) _exit(77);
        ts_dist_host_id(shared, 384);
        uint64_t h = ts_dist_host_hash();
        memcpy(shared + 512, &h, sizeof h);
        _exit(0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        printf("dist_host: new network namespace not permitted here; that part skipped\n");
    } else {
        uint64_t h;
        memcpy(&h, shared + 512, sizeof h);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
        CHECK(strncmp(shared, name, strlen(name)) == 0 && strstr(shared, "/net:[") &&
                  strcmp(shared, id) != 0 && h != ts_dist_host_hash(),
              "new namespace, another host: '%s' vs '%s'", shared, id);
    }
    munmap(shared, 4096);
    return check_summary("dist_host");
}
