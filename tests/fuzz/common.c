/* The scratch directory and files of a fuzz harness (fuzz.h). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "fuzz.h"
#include "tessel/log.h"

static char dir[64];

static void quiet(ts_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static void remove_dir(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[320];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

const char *fuzz_dir(void) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/tessel-fuzz-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("fuzz: mkdtemp");
            abort(); /* a harness without its directory cannot run at all */
        }
        atexit(remove_dir);
        /* Warnings are the expected outcome of many inputs: keep them quiet. */
        ts_set_log_callback(quiet, NULL);
    }
    return dir;
}

const char *fuzz_file(const char *name, const void *data, size_t size) {
    static char paths[8][320];
    static const char *names[8];
    int slot = 0;
    while (slot < 7 && names[slot] && strcmp(names[slot], name)) slot++;
    names[slot] = name;
    char *p = paths[slot];
    snprintf(p, sizeof paths[0], "%s/%s", fuzz_dir(), name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return NULL;
    const char *b = data;
    while (size > 0) {
        ssize_t w = write(fd, b, size);
        if (w <= 0) {
            close(fd);
            return NULL;
        }
        b += w, size -= (size_t)w;
    }
    close(fd);
    return p;
}
