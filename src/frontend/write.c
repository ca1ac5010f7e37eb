/* ts_config_write: the finished config as YAML that loads back to the same
 * values (config.yaml of a run, tessel compile --dump config). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "frontend/config_models.h"
#include "frontend/keys.h"

static void fmt_double(double v, char *buf, size_t n) {
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static int key_applies(const ts_config *c, const ts_config_key *k) {
    if (!strcmp(k->path, "model.preset")) return 0; /* every model key is written out */
    /* Unset strings (no file, no run directory) stay unwritten. */
    if (k->type == TS_CFG_STR && !((const char *)c + k->offset)[0]) return 0;
    /* LoRA's settings only with LoRA, so other configs read as before */
    if (!strncmp(k->path, "peft.lora.", 10) && !c->peft.targets[0]) return 0;
    if (!strncmp(k->path, "peft.adapter.", 13) && !c->peft.adapter_after[0]) return 0;
    if (k->flags & FOR_FILES) return (k->flags & cfg_source_flag(c->data.source)) != 0;
    if (c->train.epochs > 0) {
        /* epochs decide the steps: writing both would not load back */
        if (!strcmp(k->path, "train.steps")) return 0;
        if (!strcmp(k->path, "train.total_steps") && !c->batches_per_epoch &&
            !c->set[ts_config_key_find("train.total_steps")])
            return 0;
    }
    if (k->flags & FOR_MODEL) return cfg_model_uses(c, k);
    if (k->flags & (FOR_SGD | FOR_ADAM))
        return (k->flags & (c->train.optimizer == TS_CFG_SGD ? FOR_SGD : FOR_ADAM)) != 0;
    return 1;
}

ts_status ts_config_write(const ts_config *c, FILE *out) {
    if (!c || !out) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (!c->finished) return ts_fail(TS_ERR_INVALID, "config: write needs a finished config");
    char section[64] = "";
    for (int i = 0; i < CFG_N_KEYS; i++) {
        const ts_config_key *k = &cfg_keys[i];
        if (!key_applies(c, k)) continue;
        size_t sl = strcspn(k->path, ".");
        if (strlen(section) != sl || strncmp(section, k->path, sl)) {
            snprintf(section, sizeof section, "%.*s", (int)sl, k->path);
            fprintf(out, "%s:\n", section);
        }
        const char *src = (const char *)c + k->offset;
        char buf[64];
        fprintf(out, "  %s: ", k->path + sl + 1); /* "lora.r" under peft: loads back */
        switch (k->type) {
        case TS_CFG_INT: {
            int v;
            memcpy(&v, src, sizeof v);
            fprintf(out, "%d\n", v);
            break;
        }
        case TS_CFG_I64: {
            int64_t v;
            memcpy(&v, src, sizeof v);
            fprintf(out, "%lld\n", (long long)v);
            break;
        }
        case TS_CFG_U64: {
            uint64_t v;
            memcpy(&v, src, sizeof v);
            fprintf(out, "%llu\n", (unsigned long long)v);
            break;
        }
        case TS_CFG_F64: {
            double v;
            memcpy(&v, src, sizeof v);
            fmt_double(v, buf, sizeof buf);
            fprintf(out, "%s\n", buf);
            break;
        }
        case TS_CFG_BOOL:
        case TS_CFG_ENUM: {
            int v;
            memcpy(&v, src, sizeof v);
            if (k->type == TS_CFG_BOOL)
                snprintf(buf, sizeof buf, "%s", v ? "true" : "false");
            else if (!cfg_choice_at(k->choices, v, buf, sizeof buf))
                return ts_fail(TS_ERR_INTERNAL, "config: %s holds %d", k->path, v);
            fprintf(out, "%s\n", buf);
            break;
        }
        case TS_CFG_STR:
            /* Double-quoted YAML: escape what would end or bend the string. */
            fputc('"', out);
            for (const char *s = src; *s; s++) {
                if (*s == '"' || *s == '\\') fputc('\\', out);
                fputc(*s, out);
            }
            fputs("\"\n", out);
            break;
        }
    }
    return ferror(out) ? ts_fail(TS_ERR_IO, "config: write failed") : TS_OK;
}
