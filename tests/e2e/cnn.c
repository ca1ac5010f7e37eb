/* `tessel train examples/fashion_cnn.yaml` end to end: the CNN config loads,
 * builds (x [batch, 784] reshaped to images inside the model) and its loss
 * falls over 20 steps. Skipped when the Fashion-MNIST dataset is not
 * installed. Runs $TESSEL_BIN from the repository root. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static double field(const char *json, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    double v = -1;
    if (!p || sscanf(p + strlen(pat), " %lf", &v) != 1) return -1;
    return v;
}

int main(void) {
    const char *images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
    if (access(images, R_OK) != 0) {
        printf("skipped: %s is not installed (dataset-fashion-mnist)\n", images);
        return check_summary("e2e/cnn");
    }
    char dir[64];
    const char *bin = e2e_setup("cnn", dir, sizeof dir);
    if (!bin) return check_summary("e2e/cnn");
    char cmd[1024];
    /* No validation split and a 20-step run: the test split is the only
     * evaluation. */
    snprintf(cmd, sizeof cmd,
             "'%s' train examples/fashion_cnn.yaml --set train.epochs=0 --set train.steps=20 "
             "--set train.warmup_steps=5 --set data.val_fraction=0 --out %s/run >%s/out 2>%s/err",
             bin, dir, dir, dir);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s/err", dir);
    char *err = e2e_slurp(cmd, NULL);
    CHECK(rc == 0, "cnn config: exit %d: %s", rc, err);
    snprintf(cmd, sizeof cmd, "%s/run/summary.json", dir);
    char *sum = e2e_slurp(cmd, NULL);
    CHECK(strstr(sum, "\"model\": \"cnn\"") != NULL, "summary names the cnn: %s", sum);
    double first = field(sum, "first_loss"), last = field(sum, "final_loss");
    CHECK(first > 1.5 && last > 0 && last < 0.8 * first, "loss falls over 20 steps: %.3f -> %.3f",
          first, last);
    printf("cnn config, 20 steps: loss %.3f -> %.3f\n", first, last);
    free(sum);
    free(err);
    e2e_cleanup(dir);
    return check_summary("e2e/cnn");
}
