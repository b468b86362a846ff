/*
 * The shape of a reply, for every layer that answers a request: JSON or
 * text bodies, dropping an unsent one, and how deep a body nests (checked
 * before jansson parses it, whose recursion depth a client would set).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

static char *dump(json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(v);
    return s;
}

void ext_reply_json_text(ext_response *r, int status, char *body)
{
    r->status = status;
    r->content_type = "application/json";
    r->body = body;
    if (r->body == NULL) {
        r->status = 500;
        r->body = strdup("{\"Error\":\"out of memory\"}");
    }
}

void ext_reply_json(ext_response *r, int status, json_t *v)
{
    ext_reply_json_text(r, status, dump(v));
}

void ext_reply_text(ext_response *r, int status, const char *text)
{
    r->status = status;
    r->content_type = "text/plain; charset=utf-8";
    r->body = strdup(text);
}

int ext_json_depth(const char *text, size_t len, int limit)
{
    int depth = 0, max = 0;
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            if (++depth > max && (max = depth) > limit)
                return max;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return max;
}

void ext_response_discard(ext_response *r)
{
    free(r->body);
    r->body = NULL;
    if (r->stream.read != NULL)
        r->stream.free(r->stream.ctx);
    r->stream = (ext_stream){0};
}

const char *ext_pod_for_viewer(const char *ns, const char *name, const char *viewer,
                               const char *same_prefix, char *buf, size_t len)
{
    if (viewer != NULL && strcmp(ns, viewer) == 0)
        snprintf(buf, len, "%s%.63s/%.253s", same_prefix, ns, name);
    else
        snprintf(buf, len, "a pod of another namespace");
    return buf;
}
