/* Reading a YAML config file (or text) into the config: libyaml builds the
 * document tree, walk() maps its keys onto the key table (cfg_store).
 * Files over 1 MiB and nesting deeper than 32 levels are refused before
 * the tree is built (libyaml takes minutes on deep nesting). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>
#include "core/core.h"
#include "frontend/check.h"
#include "frontend/keys.h"

typedef struct walk_ctx {
    ts_config *c;
    yaml_document_t *doc;
    const char *name;
    unsigned char seen[TS_CFG_MAX_KEYS];
} walk_ctx;

static ts_status at(const walk_ctx *w, const yaml_node_t *node, ts_status s) {
    ts_error_prefix("%s:%zu:%zu", w->name, node->start_mark.line + 1, node->start_mark.column + 1);
    return s;
}

static const char *node_kind(const yaml_node_t *n) {
    return n->type == YAML_MAPPING_NODE ? "a mapping" : "a list";
}

/* A YAML null: an empty plain scalar, "~" or "null". */
static int is_null(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

/* A mapping of scalars as "key=value key=value". */
static ts_status flatten_map(const walk_ctx *w, const yaml_node_t *map, const ts_config_key *k,
                             char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(w->doc, p->value);
        if (!kn || !vn) return ts_fail(TS_ERR_INTERNAL, "%s: YAML node missing", w->name);
        if (kn->type != YAML_SCALAR_NODE || vn->type != YAML_SCALAR_NODE || !vn->data.scalar.length)
            return at(
                w, vn,
                ts_fail(TS_ERR_INVALID, "%s: a mapping in the list needs plain values", k->path));
        const char *kv = (const char *)kn->data.scalar.value,
                   *vv = (const char *)vn->data.scalar.value;
        if (strpbrk(vv, ", \t") || strpbrk(kv, ", \t="))
            return at(w, vn,
                      ts_fail(TS_ERR_INVALID, "%s: '%s: %s': no ',' or spaces in these values",
                              k->path, kv, vv));
        int m = snprintf(buf + len, n - len, "%s%s=%s", len ? " " : "", kv, vv);
        if (m < 0 || (size_t)m >= n - len)
            return at(w, map, ts_fail(TS_ERR_INVALID, "%s: item too long", k->path));
        len += (size_t)m;
    }
    return TS_OK;
}

/* A YAML list of names as the comma-separated text the key stores. */
static ts_status join_list(const walk_ctx *w, const yaml_node_t *seq, const ts_config_key *k,
                           char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(w->doc, *it);
        if (!item) return ts_fail(TS_ERR_INTERNAL, "%s: YAML node missing", w->name);
        char flat[1024];
        if (item->type == YAML_MAPPING_NODE) {
            /* A mapping item ({metric: loss, non_finite: true}) becomes the
             * text "metric=loss non_finite=true" (alerts.rules). */
            ts_status s = flatten_map(w, item, k, flat, sizeof flat);
            if (s != TS_OK) return s;
            int m = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", flat);
            if (m < 0 || (size_t)m >= n - len)
                return at(w, seq, ts_fail(TS_ERR_INVALID, "%s: list too long", k->path));
            len += (size_t)m;
            continue;
        }
        if (item->type != YAML_SCALAR_NODE || !item->data.scalar.length)
            return at(w, item,
                      ts_fail(TS_ERR_INVALID, "%s: expected a list of names, got %s in it", k->path,
                              item->type == YAML_SCALAR_NODE ? "an empty one" : node_kind(item)));
        const char *v = (const char *)item->data.scalar.value;
        if (strchr(v, ','))
            return at(
                w, item,
                ts_fail(TS_ERR_INVALID, "%s: a name may not contain ',', got '%s'", k->path, v));
        int m = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", v);
        if (m < 0 || (size_t)m >= n - len)
            return at(w, seq, ts_fail(TS_ERR_INVALID, "%s: list too long", k->path));
        len += (size_t)m;
    }
    return TS_OK;
}

static ts_status walk(walk_ctx *w, const yaml_node_t *map, const char *prefix) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(w->doc, p->value);
        if (!kn || !vn) return ts_fail(TS_ERR_INTERNAL, "%s: YAML node missing", w->name);
        if (kn->type != YAML_SCALAR_NODE)
            return at(w, kn,
                      ts_fail(TS_ERR_FORMAT, "a key must be a plain name, got %s", node_kind(kn)));
        char path[256];
        int n = snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "",
                         (const char *)kn->data.scalar.value);
        if (n < 0 || (size_t)n >= sizeof path)
            return at(w, kn, ts_fail(TS_ERR_FORMAT, "key name too long"));
        int idx = ts_config_key_find(path);
        if (vn->type == YAML_MAPPING_NODE && idx < 0 && cfg_is_section(path)) {
            ts_status s = walk(w, vn, path);
            if (s != TS_OK) return s;
            continue;
        }
        if (idx < 0 && cfg_is_section(path) && is_null(vn)) continue; /* "compile:" alone */
        if (idx < 0) {
            char hint[512];
            if (cfg_is_section(path))
                return at(w, vn,
                          ts_fail(TS_ERR_FORMAT,
                                  "%s: expected a mapping of keys, got "
                                  "a value",
                                  path));
            cfg_suggestion(path, hint, sizeof hint);
            return at(w, kn, ts_fail(TS_ERR_INVALID, "unknown key '%s'%s", path, hint));
        }
        char joined[2048];
        const char *text = NULL;
        if (vn->type == YAML_SEQUENCE_NODE && (cfg_keys[idx].flags & TS_CFG_LIST)) {
            ts_status s = join_list(w, vn, &cfg_keys[idx], joined, sizeof joined);
            if (s != TS_OK) return s;
            text = joined;
        } else if (vn->type != YAML_SCALAR_NODE) {
            char eb[128];
            return at(w, vn,
                      ts_fail(TS_ERR_INVALID, "%s: expected %s, got %s", path,
                              cfg_expected(&cfg_keys[idx], eb, sizeof eb), node_kind(vn)));
        }
        if (w->seen[idx])
            return at(w, kn,
                      ts_fail(TS_ERR_INVALID, "duplicate key '%s' (first set on line %d)", path,
                              w->c->line[idx]));
        if (!text) text = (const char *)vn->data.scalar.value;
        ts_status s = cfg_store(w->c, &cfg_keys[idx], text);
        if (s != TS_OK) return at(w, vn, s);
        w->seen[idx] = 1;
        w->c->set[idx] = ORIGIN_FILE;
        w->c->line[idx] = (int)kn->start_mark.line + 1;
        w->c->col[idx] = (int)kn->start_mark.column + 1;
    }
    return TS_OK;
}

static ts_status parse_error(const yaml_parser_t *ps, const char *name) {
    const char *problem = ps->problem ? ps->problem : "cannot parse";
    if (ps->error == YAML_READER_ERROR)
        return ts_fail(TS_ERR_FORMAT, "%s: malformed YAML at byte %zu: %s", name,
                       ps->problem_offset, problem);
    if (ps->error == YAML_MEMORY_ERROR)
        return ts_fail(TS_ERR_NOMEM, "%s: out of memory while parsing YAML", name);
    char ctx[160] = "";
    if (ps->context)
        snprintf(ctx, sizeof ctx, " (%s at line %zu)", ps->context, ps->context_mark.line + 1);
    return ts_fail(TS_ERR_FORMAT, "%s:%zu:%zu: malformed YAML: %s%s", name,
                   ps->problem_mark.line + 1, ps->problem_mark.column + 1, problem, ctx);
}

static ts_status load(ts_config *c, yaml_parser_t *ps, const char *name) {
    if (c->finished)
        return ts_fail(TS_ERR_INVALID,
                       "%s: config already finished; load files before "
                       "ts_config_finish",
                       name);
    snprintf(c->file, sizeof c->file, "%s", name);
    yaml_document_t doc;
    if (!yaml_parser_load(ps, &doc)) return parse_error(ps, name);
    ts_status s = TS_OK;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    walk_ctx w;
    memset(&w, 0, sizeof w);
    w.c = c, w.doc = &doc, w.name = name;
    if (root && root->type == YAML_MAPPING_NODE) {
        s = walk(&w, root, "");
    } else if (root && !(root->type == YAML_SCALAR_NODE && !root->data.scalar.length)) {
        s = at(&w, root,
               ts_fail(TS_ERR_FORMAT,
                       "expected a mapping of sections (model, train, compile, data, output, ckpt, "
                       "observe), "
                       "got %s",
                       root->type == YAML_SCALAR_NODE ? "a value" : "a list"));
    }
    yaml_document_delete(&doc);
    if (s != TS_OK) return s;
    /* A second document would be silently ignored; say so instead. */
    if (!yaml_parser_load(ps, &doc)) return parse_error(ps, name);
    if (yaml_document_get_root_node(&doc))
        s = ts_fail(TS_ERR_FORMAT, "%s:%zu: only one YAML document is allowed", name,
                    doc.start_mark.line + 1);
    yaml_document_delete(&doc);
    return s;
}

/* A config is a few kilobytes two or three levels deep; these caps keep a
 * hostile or broken file from costing minutes (libyaml's scanner slows
 * down with the nesting depth) or memory. */
enum { CFG_MAX_BYTES = 1 << 20, CFG_MAX_DEPTH = 32 };

/* Refuses nesting deeper than CFG_MAX_DEPTH, stopping at the first level
 * too many, so the cost is that of the first CFG_MAX_DEPTH levels. Events
 * the parser cannot read are left to load(), which reports them as before. */
static ts_status check_depth(const char *text, size_t len, const char *name) {
    yaml_parser_t ps;
    if (!yaml_parser_initialize(&ps)) return ts_fail(TS_ERR_NOMEM, "config: YAML parser");
    yaml_parser_set_input_string(&ps, (const unsigned char *)text, len);
    ts_status s = TS_OK;
    int depth = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&ps, &ev)) break;
        const yaml_event_type_t type = ev.type;
        if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) {
            if (++depth > CFG_MAX_DEPTH)
                s = ts_fail(TS_ERR_INVALID,
                            "%s:%zu:%zu: YAML nested deeper than %d levels (a config has 2 or "
                            "3)",
                            name, ev.start_mark.line + 1, ev.start_mark.column + 1, CFG_MAX_DEPTH);
        } else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        yaml_event_delete(&ev);
        if (s != TS_OK || type == YAML_STREAM_END_EVENT) break;
    }
    yaml_parser_delete(&ps);
    return s;
}

static ts_status too_large(const char *name) {
    return ts_fail(TS_ERR_INVALID, "%s: larger than %d MiB, the most a config file may hold", name,
                   CFG_MAX_BYTES >> 20);
}

ts_status ts_config_load_string(ts_config *c, const char *text, size_t len, const char *name) {
    if (!c || !text) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (!name) name = "config";
    if (len > CFG_MAX_BYTES) return too_large(name);
    ts_status s = check_depth(text, len, name);
    if (s != TS_OK) return s;
    yaml_parser_t ps;
    if (!yaml_parser_initialize(&ps)) return ts_fail(TS_ERR_NOMEM, "config: YAML parser");
    yaml_parser_set_input_string(&ps, (const unsigned char *)text, len);
    s = load(c, &ps, name);
    yaml_parser_delete(&ps);
    return s;
}

ts_status ts_config_load_file(ts_config *c, const char *path) {
    if (!c || !path) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    struct stat st;
    if (stat(path, &st) != 0)
        return ts_fail(errno == ENOENT ? TS_ERR_NOT_FOUND : TS_ERR_IO,
                       "cannot open config '%s': %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return ts_fail(TS_ERR_IO, "cannot read config '%s': it is a directory", path);
    if (S_ISREG(st.st_mode) && st.st_size > CFG_MAX_BYTES) return too_large(path);
    FILE *f = fopen(path, "rb");
    if (!f) return ts_fail(TS_ERR_IO, "cannot open config '%s': %s", path, strerror(errno));
    /* Read whole (a pipe too), one byte past the cap to see it exceeded. */
    char *text = malloc(CFG_MAX_BYTES + 1);
    if (!text) {
        fclose(f);
        return ts_fail(TS_ERR_NOMEM, "config: out of memory for '%s'", path);
    }
    const size_t n = fread(text, 1, CFG_MAX_BYTES + 1, f);
    const int bad = ferror(f);
    fclose(f);
    ts_status s = bad                 ? ts_fail(TS_ERR_IO, "cannot read config '%s'", path)
                  : n > CFG_MAX_BYTES ? too_large(path)
                                      : ts_config_load_string(c, text, n, path);
    free(text);
    return s;
}
