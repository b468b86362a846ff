/*
 * libyaml event stream -> jansson tree. Depth and size are bounded so a
 * hostile file cannot exhaust the stack or memory.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "fileio.h"
#include "yamljson.h"

#define YJ_MAX_DEPTH 64
#define YJ_MAX_FILE  (64 << 20)

static json_t *plain_scalar(const char *v, size_t len)
{
    if (len == 0 || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 || strcmp(v, "Null") == 0 ||
        strcmp(v, "NULL") == 0)
        return json_null();
    if (strcmp(v, "true") == 0 || strcmp(v, "True") == 0 || strcmp(v, "TRUE") == 0)
        return json_true();
    if (strcmp(v, "false") == 0 || strcmp(v, "False") == 0 || strcmp(v, "FALSE") == 0)
        return json_false();
    char *end;
    errno = 0;
    long long i = strtoll(v, &end, 10);
    if (*end == '\0' && errno == 0 && (v[0] == '-' || v[0] == '+' || (v[0] >= '0' && v[0] <= '9')))
        return json_integer(i);
    errno = 0;
    double d = strtod(v, &end);
    if (*end == '\0' && errno == 0 &&
        (v[0] == '-' || v[0] == '+' || v[0] == '.' || (v[0] >= '0' && v[0] <= '9')))
        return json_real(d);
    return json_stringn(v, len);
}

typedef struct yj {
    yaml_parser_t parser;
    const char *file;
    kgpu_error *err;
} yj;

static json_t *fail(yj *y, const char *what, size_t line)
{
    kgpu_error_set(y->err, KGPU_EPARSE, "%s:%zu: %s", y->file, line + 1, what);
    return NULL;
}

static json_t *parse_node(yj *y, yaml_event_t *ev, int depth);

/* Reads events until the closing event of the current mapping/sequence. */
static json_t *parse_collection(yj *y, bool mapping, int depth)
{
    json_t *out = mapping ? json_object() : json_array();
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&y->parser, &ev)) {
            json_decref(out);
            return fail(y, y->parser.problem ? y->parser.problem : "YAML syntax error",
                        y->parser.problem_mark.line);
        }
        if (ev.type == (mapping ? YAML_MAPPING_END_EVENT : YAML_SEQUENCE_END_EVENT)) {
            yaml_event_delete(&ev);
            return out;
        }
        if (mapping) {
            if (ev.type != YAML_SCALAR_EVENT) {
                size_t line = ev.start_mark.line;
                yaml_event_delete(&ev);
                json_decref(out);
                return fail(y, "mapping keys must be plain strings", line);
            }
            char *key = strndup((const char *)ev.data.scalar.value, ev.data.scalar.length);
            size_t line = ev.start_mark.line;
            yaml_event_delete(&ev);
            yaml_event_t vev;
            if (key == NULL || !yaml_parser_parse(&y->parser, &vev)) {
                free(key);
                json_decref(out);
                return fail(y, y->parser.problem ? y->parser.problem : "YAML syntax error",
                            y->parser.problem_mark.line);
            }
            json_t *v = parse_node(y, &vev, depth + 1);
            if (v == NULL) {
                free(key);
                json_decref(out);
                return NULL;
            }
            if (json_object_get(out, key) != NULL) {
                char msg[300];
                snprintf(msg, sizeof(msg), "duplicate key '%.200s'", key);
                free(key);
                json_decref(v);
                json_decref(out);
                return fail(y, msg, line);
            }
            json_object_set_new(out, key, v);
            free(key);
        } else {
            json_t *v = parse_node(y, &ev, depth + 1);
            if (v == NULL) {
                json_decref(out);
                return NULL;
            }
            json_array_append_new(out, v);
        }
    }
}

/* Consumes ev (and, for collections, the events up to their end). */
static json_t *parse_node(yj *y, yaml_event_t *ev, int depth)
{
    size_t line = ev->start_mark.line;
    if (depth > YJ_MAX_DEPTH) {
        yaml_event_delete(ev);
        return fail(y, "nested too deeply", line);
    }
    switch (ev->type) {
    case YAML_SCALAR_EVENT: {
        json_t *v = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE
                        ? plain_scalar((const char *)ev->data.scalar.value, ev->data.scalar.length)
                        : json_stringn((const char *)ev->data.scalar.value, ev->data.scalar.length);
        yaml_event_delete(ev);
        return v != NULL ? v : fail(y, "scalar is not valid UTF-8", line);
    }
    case YAML_MAPPING_START_EVENT:
    case YAML_SEQUENCE_START_EVENT: {
        bool mapping = ev->type == YAML_MAPPING_START_EVENT;
        bool anchored = mapping ? ev->data.mapping_start.anchor != NULL
                                : ev->data.sequence_start.anchor != NULL;
        yaml_event_delete(ev);
        if (anchored)
            return fail(y, "anchors and aliases are not supported", line);
        return parse_collection(y, mapping, depth);
    }
    case YAML_ALIAS_EVENT:
        yaml_event_delete(ev);
        return fail(y, "anchors and aliases are not supported", line);
    default:
        yaml_event_delete(ev);
        return fail(y, "unexpected YAML event", line);
    }
}

json_t *kgpu_yaml_load(const char *buf, size_t len, const char *file, kgpu_error *err)
{
    yj y = {.file = file, .err = err};
    if (!yaml_parser_initialize(&y.parser)) {
        kgpu_error_set(err, KGPU_ENOMEM, "%s: out of memory", file);
        return NULL;
    }
    yaml_parser_set_input_string(&y.parser, (const unsigned char *)buf, len);
    json_t *root = NULL;
    bool in_doc = false;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&y.parser, &ev)) {
            fail(&y, y.parser.problem ? y.parser.problem : "YAML syntax error",
                 y.parser.problem_mark.line);
            break;
        }
        yaml_event_type_t t = ev.type;
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            if (root == NULL)
                root = json_null(); /* an empty file */
            break;
        }
        if (t == YAML_STREAM_START_EVENT || t == YAML_DOCUMENT_END_EVENT) {
            yaml_event_delete(&ev);
            continue;
        }
        if (t == YAML_DOCUMENT_START_EVENT) {
            yaml_event_delete(&ev);
            if (in_doc)
                break; /* only the first document */
            in_doc = true;
            continue;
        }
        root = parse_node(&y, &ev, 0);
        if (root == NULL)
            break;
    }
    yaml_parser_delete(&y.parser);
    return root;
}

json_t *kgpu_yaml_load_file(const char *path, kgpu_error *err)
{
    char *buf;
    size_t n;
    if (kgpu_read_file_max(path, YJ_MAX_FILE, &buf, &n, err) != 0)
        return NULL;
    json_t *v = kgpu_yaml_load(buf, n, path, err);
    free(buf);
    return v;
}
