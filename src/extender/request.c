/*
 * Reading a verb's request (its body, its pod, its candidate nodes) and
 * answering a wrong one: what filter, prioritize, bind and preempt share.
 * JSON is parsed outside the state lock; see request.h for each contract.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"

/*
 * Two kinds of wrong input, answered differently.
 *
 * A request kube-scheduler could not have sent (a body that is not JSON, an
 * ExtenderArgs without a Pod object, NodeNames that are not strings) is a
 * protocol error: HTTP 400 with the verb's reply shape carrying Error, for
 * whoever sent it by hand. kube-scheduler's extender client drops the body
 * of any answer but 200, so a reason given that way never reaches a user.
 *
 * A pod whose GPU request kgpu cannot honour (kgpu.io/gpu-core 150, an
 * unknown kgpu.io/ quantity, whole GPUs mixed with a share, an unknown
 * kgpu.io/policy) is an answer about that pod, always HTTP 200, so that the
 * reason reaches the pod's FailedScheduling event:
 * - filter lists every node it was sent in FailedAndUnresolvableNodes with
 *   "kgpu: <reason>" and passes none. Not Error in a 200: kube-scheduler's
 *   HTTPExtender.Filter turns a non-empty Error into an error of the whole
 *   scheduling cycle. An ignorable extender's error is skipped, and the pod
 *   would be scheduled as if kgpu had passed it; otherwise the pod goes
 *   back to the backoff queue and is retried every few seconds, forever,
 *   for a spec that cannot change. Unresolvable nodes make a FitError
 *   instead ("0/3 nodes are available: 3 kgpu: container main: ..."): the
 *   pod waits in the unschedulable queue for a cluster change, preemption
 *   evicts nothing for it, and ignorable or not makes no difference.
 * - prioritize scores every node 0 (kube-scheduler ignores prioritize
 *   errors anyway); preempt keeps no node (preemption cannot help the pod);
 *   bind answers ExtenderBindingResult.Error, which kube-scheduler reports.
 * Such pods are counted in kgpu_extender_invalid_pods_total and logged.
 */

/* 400 with the verb's own reply shape carrying Error: a request kube-scheduler would not send. */
void ext_bad_request(ext_ctx *d, ext_response *r, enum ext_verb v, const char *msg)
{
    atomic_fetch_add(&d->metrics->bad_requests[v], 1);
    ext_log(EXT_WARN, "%s: bad request: %s", ext_verb_name(v), msg);
    ext_reply_json(r, 400, json_pack("{s:s}", "Error", msg));
}

/* Counts and logs a pod whose GPU request kgpu cannot honour; the verb answers 200 for it. */
void ext_invalid_pod(ext_ctx *d, enum ext_verb v, const kgpu_pod *pod, const char *why)
{
    atomic_fetch_add(&d->metrics->invalid_pods[v], 1);
    ext_log(EXT_WARN, "%s: pod %s/%s: %s", ext_verb_name(v), pod->ns[0] ? pod->ns : "?",
            pod->name[0] ? pod->name : "?", why);
}

/* Skips one JSON value starting at p (whitespace already skipped); returns just past it, or NULL.
 */
static const char *skip_value(const char *p, const char *end)
{
    int depth = 0;
    bool in_string = false;
    for (; p < end; p++) {
        char c = *p;
        if (in_string) {
            if (c == '\\')
                p++;
            else if (c == '"')
                in_string = false;
            if (!in_string && depth == 0)
                return p + 1;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth < 0)
                return p; /* the end of the enclosing object: a scalar ended here */
            if (depth == 0)
                return p + 1;
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\n' || c == '\r' || c == '\t')) {
            return p;
        }
    }
    return depth == 0 && !in_string ? p : NULL;
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

/*
 * The fast path of filter and prioritize (see jsonw.h for the measurements):
 * the top-level NodeNames array, hundreds of plain strings, is read here
 * into `names` (copied into `store`) and replaced by `null` in `body`, so
 * jansson parses only the pod. Any escape or surprise returns -1 and the
 * caller parses everything with jansson.
 */
int ext_fast_node_names(char *body, size_t len, char *store, const char ***names)
{
    const char *end = body + len, *p = skip_ws(body, end);
    if (p >= end || *p != '{')
        return -1;
    p++;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"')
            return -1;
        const char *key = ++p;
        while (p < end && *p != '"' && *p != '\\')
            p++;
        if (p >= end || *p != '"')
            return -1;
        size_t klen = (size_t)(p - key);
        p = skip_ws(p + 1, end);
        if (p >= end || *p != ':')
            return -1;
        p = skip_ws(p + 1, end);
        if (klen == 9 && memcmp(key, "NodeNames", 9) == 0 && p < end && *p == '[') {
            char *start = (char *)p, *out = store;
            int n = 0, cap = 64;
            const char **list = malloc((size_t)cap * sizeof(*list));
            if (list == NULL)
                return -1;
            p = skip_ws(p + 1, end);
            bool bad = false;
            while (p < end && *p != ']' && !bad) {
                if (*p != '"') {
                    bad = true;
                    break;
                }
                const char *s = ++p;
                bool ascii = true;
                while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) {
                    ascii = ascii && (unsigned char)*p < 0x80;
                    p++;
                }
                /* Node names are ASCII; anything else goes to jansson, which checks UTF-8. */
                if (p >= end || *p != '"' || !ascii) {
                    bad = true;
                    break;
                }
                if (n == cap) {
                    const char **g = realloc(list, (size_t)(cap *= 2) * sizeof(*list));
                    if (g == NULL) {
                        bad = true;
                        break;
                    }
                    list = g;
                }
                memcpy(out, s, (size_t)(p - s));
                list[n++] = out;
                out += p - s;
                *out++ = '\0';
                p = skip_ws(p + 1, end);
                if (p < end && *p == ',') {
                    p = skip_ws(p + 1, end);
                    bad = p >= end || *p != '"'; /* a trailing comma is not JSON */
                } else if (p < end && *p != ']') {
                    bad = true;
                }
            }
            if (bad || p >= end || *p != ']') {
                free(list);
                return -1;
            }
            if (p - start + 1 < 4) { /* "[]" has no room for `null`: let jansson read it */
                free(list);
                return -1;
            }
            /* The array becomes `null` padded with spaces: same length, valid JSON. */
            memset(start, ' ', (size_t)(p - start + 1));
            memcpy(start, "null", 4);
            *names = list;
            return n;
        }
        p = skip_value(p, end);
        if (p == NULL)
            return -1;
        p = skip_ws(p, end);
        if (p >= end || *p != ',')
            return -1; /* the object ended without NodeNames */
        p++;
    }
}

/* Parses a request body into an object; NULL after replying 400. */
json_t *ext_parse_body(ext_ctx *d, ext_response *r, enum ext_verb v, const char *body,
                          size_t len)
{
    char msg[REASON_MAX];
    if (ext_json_depth(body, len, d->cfg->max_json_depth) > d->cfg->max_json_depth) {
        snprintf(msg, sizeof(msg), "request JSON nested deeper than %d levels",
                 d->cfg->max_json_depth);
        ext_bad_request(d, r, v, msg);
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        snprintf(msg, sizeof(msg), "malformed JSON at line %d column %d: %s", jerr.line,
                 jerr.column, jerr.text);
        ext_bad_request(d, r, v, msg);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        ext_bad_request(d, r, v, "request body is not a JSON object");
        return NULL;
    }
    return root;
}

/*
 * The pod of ExtenderArgs / ExtenderPreemptionArgs, read; false after
 * replying 400 (no Pod object). A pod kgpu cannot honour is read as far as
 * it goes and its reason, "kgpu: ...", put in `invalid` (else "").
 */
bool ext_read_pod(ext_ctx *d, ext_response *r, enum ext_verb v, json_t *args, kgpu_pod *pod,
                     char *invalid, size_t len)
{
    invalid[0] = '\0';
    json_t *j = json_object_get(args, "Pod");
    if (!json_is_object(j)) {
        ext_bad_request(d, r, v, "field Pod is missing or not an object");
        return false;
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    if (kgpu_pod_from_json(j, d->cfg->memory_unit_mib, pod, &err) != 0) {
        snprintf(invalid, len, "kgpu: %s", err.msg);
        pod->nparts = 0; /* nothing of it is used but its name */
    }
    return true;
}

/*
 * Compiles a readable pod's requests and resolves its policy (caller holds
 * the state lock). A pod kgpu cannot honour gets its reason in `invalid`;
 * other failures (out of memory) return their code.
 */
int ext_check_pod(ext_ctx *d, kgpu_pod *pod, kgpu_policy **policy, char *invalid, size_t len)
{
    kgpu_error err;
    kgpu_error_clear(&err);
    if (invalid[0] != '\0' || pod->nparts == 0)
        return 0;
    int rc = ext_state_compile(d->state, pod, &err);
    kgpu_policy *p = rc == 0 ? ext_state_policy(d->state, pod, &err) : NULL;
    if (policy != NULL)
        *policy = p;
    if (rc == KGPU_ENOMEM || (p == NULL && err.code == KGPU_ENOMEM))
        return KGPU_ENOMEM;
    if (rc != 0 || p == NULL)
        snprintf(invalid, len, "kgpu: %s", err.msg);
    return 0;
}

/*
 * Candidate nodes: NodeNames (nodeCacheCapable: true) or Nodes.items
 * (nodeCacheCapable: false). *objects gets the Node objects in the second
 * mode (borrowed from args). Returns the count, or -1 after replying 400.
 */
int ext_read_nodes(ext_ctx *d, ext_response *r, enum ext_verb v, json_t *args,
                      fast_names *fast, const char ***names, json_t ***objects)
{
    /* kube-scheduler sends at most the cluster's nodes; a million names is an attack. */
    size_t count = fast->n >= 0 ? (size_t)fast->n
                                : json_array_size(json_object_get(args, "NodeNames")) +
                                      json_array_size(json_object_get(
                                          json_object_get(args, "Nodes"), "items"));
    if (count > (size_t)d->cfg->max_node_names) {
        char msg[REASON_MAX];
        snprintf(msg, sizeof(msg), "%zu nodes in one call; at most %d (maxNodeNames)", count,
                 d->cfg->max_node_names);
        ext_bad_request(d, r, v, msg);
        return -1;
    }
    if (fast->n >= 0) {
        *names = fast->names;
        *objects = NULL;
        fast->names = NULL; /* the caller frees *names */
        return fast->n;
    }
    json_t *nn = json_object_get(args, "NodeNames");
    json_t *nodes = json_object_get(args, "Nodes");
    *names = NULL;
    *objects = NULL;
    if (json_is_array(nn)) {
        size_t n = json_array_size(nn);
        *names = calloc(n + 1, sizeof(**names));
        if (*names == NULL)
            return -1;
        for (size_t i = 0; i < n; i++) {
            (*names)[i] = json_string_value(json_array_get(nn, i));
            if ((*names)[i] == NULL) {
                free(*names);
                *names = NULL;
                char msg[REASON_MAX];
                snprintf(msg, sizeof(msg), "NodeNames[%zu] is not a string", i);
                ext_bad_request(d, r, v, msg);
                return -1;
            }
        }
        return (int)n;
    }
    if (!json_is_null(nn) && nn != NULL) {
        ext_bad_request(d, r, v, "NodeNames is neither null nor an array");
        return -1;
    }
    json_t *items = json_object_get(nodes, "items");
    if (nodes == NULL || json_is_null(nodes) || (json_is_object(nodes) && items == NULL))
        return 0; /* no candidates */
    if (!json_is_array(items)) {
        ext_bad_request(d, r, v, "Nodes.items is not an array");
        return -1;
    }
    size_t n = json_array_size(items);
    *names = calloc(n + 1, sizeof(**names));
    *objects = calloc(n + 1, sizeof(**objects));
    if (*names == NULL || *objects == NULL) {
        free(*names);
        free(*objects);
        *names = NULL;
        *objects = NULL;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *node = json_array_get(items, i);
        (*objects)[i] = node;
        (*names)[i] = json_string_value(json_object_get(json_object_get(node, "metadata"), "name"));
        if ((*names)[i] == NULL) {
            free(*names);
            free(*objects);
            *names = NULL;
            *objects = NULL;
            char msg[REASON_MAX];
            snprintf(msg, sizeof(msg), "Nodes.items[%zu].metadata.name is missing", i);
            ext_bad_request(d, r, v, msg);
            return -1;
        }
    }
    return (int)n;
}

/* Could the pod ever run on this node, even empty? If not, preemption cannot help. */
bool ext_never_fits(const kgpu_node *n, const kgpu_request *req, char *why, size_t len)
{
    int allowed = 0;
    int64_t largest = 0;
    for (int i = 0; i < n->ngpus; i++) {
        if (!((req->models >> n->gpus[i].model) & 1))
            continue;
        allowed++;
        if (n->gpus[i].memory_mib > largest)
            largest = n->gpus[i].memory_mib;
    }
    char reason[REASON_MAX];
    snprintf(reason, sizeof(reason), "%s", why);
    if (allowed < req->gpu_count) {
        snprintf(why, len, "%.200s (even empty, the node has %d GPU%s of an allowed model)", reason,
                 allowed, allowed == 1 ? "" : "s");
        return true;
    }
    if (req->gpu_memory_mib > largest) {
        snprintf(why, len, "%.200s (larger than any GPU here, even empty)", reason);
        return true;
    }
    return false;
}

/*
 * Whether reqs fit node idx (kgpu_place_all's answer), from what is left of
 * the call's search budget (*left, decreased by what this one spent). One
 * request with nothing to undo takes kgpu_fit, the single-container fast path.
 */
int ext_place_budgeted(const kgpu_cluster *c, int idx, const kgpu_assignment *release,
                          int nrelease, const kgpu_request *const *reqs, int nreqs, unsigned flags,
                          long *left, char *why, size_t len)
{
    if (nreqs == 1 && nrelease == 0 && !(flags & KGPU_PLACE_EMPTY))
        return kgpu_fit(c, idx, reqs[0], why, len) ? KGPU_PLACE_FOUND : KGPU_PLACE_NONE;
    kgpu_placement pl;
    long budget = *left < KGPU_PLACE_BUDGET ? *left : KGPU_PLACE_BUDGET;
    int rc = kgpu_place_all(c, idx, release, nrelease, reqs, nreqs, budget > 0 ? budget : 1, flags,
                            &pl, why, len);
    *left -= pl.steps;
    return rc;
}

/* Appends "node":"reason" to a FailedNodes-style map being written. */
void ext_add_reason(kgpu_jsonw *w, const char *node, const char *why)
{
    if (w->len > 0)
        kgpu_jsonw_lit(w, ",");
    kgpu_jsonw_str(w, node);
    kgpu_jsonw_lit(w, ":");
    kgpu_jsonw_str(w, why);
}

void ext_reply_written(ext_response *r, kgpu_jsonw *w)
{
    ext_reply_json_text(r, 200, kgpu_jsonw_finish(w));
}

void ext_reply_filter(ext_response *r, int n, const char *const *names, json_t *const *objects,
                      const bool *pass, kgpu_jsonw *failed, kgpu_jsonw *unresolvable)
{
    kgpu_jsonw w;
    kgpu_jsonw_init(&w, (size_t)n * 24 + failed->len + unresolvable->len + 128);
    bool first = true;
    if (objects != NULL) {
        kgpu_jsonw_lit(&w, "{\"Nodes\":{\"apiVersion\":\"v1\",\"kind\":\"NodeList\",\"items\":[");
        for (int i = 0; i < n; i++) {
            if (!pass[i])
                continue;
            char *node = json_dumps(objects[i], JSON_COMPACT);
            if (node == NULL) {
                w.oom = true;
                break;
            }
            kgpu_jsonw_lit(&w, first ? "" : ",");
            kgpu_jsonw_lit(&w, node);
            free(node);
            first = false;
        }
        kgpu_jsonw_lit(&w, "]},\"NodeNames\":null");
    } else {
        kgpu_jsonw_lit(&w, "{\"Nodes\":null,\"NodeNames\":[");
        for (int i = 0; i < n; i++) {
            if (!pass[i])
                continue;
            kgpu_jsonw_lit(&w, first ? "" : ",");
            kgpu_jsonw_str(&w, names[i]);
            first = false;
        }
        kgpu_jsonw_lit(&w, "]");
    }
    kgpu_jsonw_lit(&w, ",\"FailedNodes\":{");
    kgpu_jsonw_raw(&w, failed->s ? failed->s : "", failed->oom ? 0 : failed->len);
    kgpu_jsonw_lit(&w, "},\"FailedAndUnresolvableNodes\":{");
    kgpu_jsonw_raw(&w, unresolvable->s ? unresolvable->s : "",
                   unresolvable->oom ? 0 : unresolvable->len);
    kgpu_jsonw_lit(&w, "},\"Error\":\"\"}");
    if (failed->oom || unresolvable->oom)
        w.oom = true;
    free(kgpu_jsonw_finish(failed));
    free(kgpu_jsonw_finish(unresolvable));
    ext_reply_written(r, &w);
}

/* text into why, cut to fit. */
void ext_cut_reason(char *why, size_t len, const char *text)
{
    size_t n = strlen(text);
    if (n >= len)
        n = len - 1;
    memcpy(why, text, n);
    why[n] = '\0';
}
