/* tessel ctl: resume a run paused by an alert (docs/observability.md).
 * A paused run waits with RUN_DIR/PAUSED ({"pid", "step", "rule"}) and
 * polls for RUN_DIR/RESUME; `resume` creates RESUME and waits (up to
 * 30 s) for the run to remove PAUSED, so success means the run goes on. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cli.h"
#include "ctl_cli.h"

static int read_small(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t k = fread(buf, 1, n - 1, f);
    buf[k] = 0;
    fclose(f);
    while (k && (buf[k - 1] == '\n' || buf[k - 1] == '\r')) buf[--k] = 0;
    return 0;
}

static int ctl_resume(const char *dir) {
    char paused[1024], resume[1024], info[512];
    snprintf(paused, sizeof paused, "%s/PAUSED", dir);
    snprintf(resume, sizeof resume, "%s/RESUME", dir);
    if (read_small(paused, info, sizeof info) != 0)
        return cli_error(CLI_USAGE, "ctl resume: %s is not paused (no %s: %s)", dir, paused,
                         strerror(errno));
    /* Not through a link planted as RESUME (no O_TRUNC either: an empty
     * file is all the run looks for). */
    int fd = open(resume, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return cli_error(CLI_FAIL, "ctl resume: cannot create %s: %s", resume, strerror(errno));
    close(fd);
    const struct timespec tick = {0, 50 * 1000 * 1000};
    for (int i = 0; i < 600; i++) {
        if (access(paused, F_OK) != 0) {
            printf("resumed %s (was paused: %s)\n", dir, info);
            return CLI_OK;
        }
        nanosleep(&tick, NULL);
    }
    return cli_error(CLI_FAIL, "ctl resume: %s still paused after 30 s (is the run alive? %s)", dir,
                     info);
}

static int ctl_status(const char *dir) {
    char paused[1024], info[512];
    snprintf(paused, sizeof paused, "%s/PAUSED", dir);
    if (read_small(paused, info, sizeof info) == 0)
        printf("paused: %s\n", info);
    else
        printf("not paused\n");
    return CLI_OK;
}

int tessel_cmd_ctl(int argc, char **argv) {
    if (argc != 2) return cli_error(CLI_USAGE, "usage: tessel ctl resume|status RUN_DIR");
    if (!strcmp(argv[0], "resume")) return ctl_resume(argv[1]);
    if (!strcmp(argv[0], "status")) return ctl_status(argv[1]);
    return cli_error(CLI_USAGE, "ctl: unknown action '%s' (resume, status)", argv[0]);
}
