/* Runs a fuzz harness once over files and directories of inputs, without
 * libFuzzer (the ordinary build's ctest fuzz/<target>): a seed corpus
 * stays a regression test, and a crash found by `make fuzz` and saved to
 * the corpus is replayed by every `make test` and `make test-asan`. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fuzz.h"

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return 1;
    }
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            unsigned char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    int inputs = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "%s: no such file or directory\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad += run_file(argv[i]);
            inputs++;
            continue;
        }
        struct dirent **list;
        int n = scandir(argv[i], &list, NULL, alphasort);
        if (n < 0) {
            fprintf(stderr, "%s: cannot list\n", argv[i]);
            return 1;
        }
        for (int k = 0; k < n; k++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], list[k]->d_name);
            if (list[k]->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
                bad += run_file(p);
                inputs++;
            }
            free(list[k]);
        }
        free(list);
    }
    printf("%d inputs run\n", inputs);
    if (inputs == 0) fprintf(stderr, "no inputs (give the seed corpus directory)\n");
    return bad || inputs == 0;
}
