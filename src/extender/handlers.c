/*
 * The kube-scheduler extender verbs (filter, prioritize, bind, preempt) and
 * the operator endpoints (inspect, metrics, health, version). JSON is parsed
 * and written outside the state lock; the lock covers only in-memory work.
 * Wire format: kube-scheduler's ExtenderArgs & co. with Go field names.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "ext.h"
#include "jsonw.h"

#define REASON_MAX  300
#define INVALID_MAX (KGPU_ERROR_MSG_MAX + 8) /* "kgpu: " and the pod's error */

static char *dump(json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(v);
    return s;
}

static void reply_json(ext_response *r, int status, json_t *v)
{
    r->status = status;
    r->content_type = "application/json";
    r->body = dump(v);
    if (r->body == NULL) {
        r->status = 500;
        r->body = strdup("{\"Error\":\"out of memory\"}");
    }
}

static void reply_text(ext_response *r, int status, const char *text)
{
    r->status = status;
    r->content_type = "text/plain; charset=utf-8";
    r->body = strdup(text);
}

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
static void bad_request(ext_daemon *d, ext_response *r, enum ext_verb v, const char *msg)
{
    atomic_fetch_add(&d->metrics.bad_requests[v], 1);
    ext_log(EXT_WARN, "%s: bad request: %s", ext_verb_name(v), msg);
    reply_json(r, 400, json_pack("{s:s}", "Error", msg));
}

/* Counts and logs a pod whose GPU request kgpu cannot honour; the verb answers 200 for it. */
static void invalid_pod(ext_daemon *d, enum ext_verb v, const kgpu_pod *pod, const char *why)
{
    atomic_fetch_add(&d->metrics.invalid_pods[v], 1);
    ext_log(EXT_WARN, "%s: pod %s/%s: %s", ext_verb_name(v), pod->ns[0] ? pod->ns : "?",
            pod->name[0] ? pod->name : "?", why);
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
static int fast_node_names(char *body, size_t len, char *store, const char ***names)
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
static json_t *parse_body(ext_daemon *d, ext_response *r, enum ext_verb v, const char *body,
                          size_t len)
{
    char msg[REASON_MAX];
    if (ext_json_depth(body, len, d->cfg.max_json_depth) > d->cfg.max_json_depth) {
        snprintf(msg, sizeof(msg), "request JSON nested deeper than %d levels",
                 d->cfg.max_json_depth);
        bad_request(d, r, v, msg);
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        snprintf(msg, sizeof(msg), "malformed JSON at line %d column %d: %s", jerr.line,
                 jerr.column, jerr.text);
        bad_request(d, r, v, msg);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        bad_request(d, r, v, "request body is not a JSON object");
        return NULL;
    }
    return root;
}

/*
 * The pod of ExtenderArgs / ExtenderPreemptionArgs, read; false after
 * replying 400 (no Pod object). A pod kgpu cannot honour is read as far as
 * it goes and its reason, "kgpu: ...", put in `invalid` (else "").
 */
static bool read_pod(ext_daemon *d, ext_response *r, enum ext_verb v, json_t *args, kgpu_pod *pod,
                     char *invalid, size_t len)
{
    invalid[0] = '\0';
    json_t *j = json_object_get(args, "Pod");
    if (!json_is_object(j)) {
        bad_request(d, r, v, "field Pod is missing or not an object");
        return false;
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    if (kgpu_pod_from_json(j, d->cfg.memory_unit_mib, pod, &err) != 0) {
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
static int check_pod(ext_daemon *d, kgpu_pod *pod, kgpu_policy **policy, char *invalid, size_t len)
{
    kgpu_error err;
    kgpu_error_clear(&err);
    if (invalid[0] != '\0' || pod->nparts == 0)
        return 0;
    int rc = ext_state_compile(&d->state, pod, &err);
    kgpu_policy *p = rc == 0 ? ext_state_policy(&d->state, pod, &err) : NULL;
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
/* NodeNames already read by fast_node_names (owned list), or none: count -1. */
typedef struct fast_names {
    const char **names;
    int n;
} fast_names;

static int read_nodes(ext_daemon *d, ext_response *r, enum ext_verb v, json_t *args,
                      fast_names *fast, const char ***names, json_t ***objects)
{
    /* kube-scheduler sends at most the cluster's nodes; a million names is an attack. */
    size_t count = fast->n >= 0 ? (size_t)fast->n
                                : json_array_size(json_object_get(args, "NodeNames")) +
                                      json_array_size(json_object_get(
                                          json_object_get(args, "Nodes"), "items"));
    if (count > (size_t)d->cfg.max_node_names) {
        char msg[REASON_MAX];
        snprintf(msg, sizeof(msg), "%zu nodes in one call; at most %d (maxNodeNames)", count,
                 d->cfg.max_node_names);
        bad_request(d, r, v, msg);
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
                bad_request(d, r, v, msg);
                return -1;
            }
        }
        return (int)n;
    }
    if (!json_is_null(nn) && nn != NULL) {
        bad_request(d, r, v, "NodeNames is neither null nor an array");
        return -1;
    }
    json_t *items = json_object_get(nodes, "items");
    if (nodes == NULL || json_is_null(nodes) || (json_is_object(nodes) && items == NULL))
        return 0; /* no candidates */
    if (!json_is_array(items)) {
        bad_request(d, r, v, "Nodes.items is not an array");
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
            bad_request(d, r, v, msg);
            return -1;
        }
    }
    return (int)n;
}

/* Could the pod ever run on this node, even empty? If not, preemption cannot help. */
static bool never_fits(const kgpu_node *n, const kgpu_request *req, char *why, size_t len)
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
 * Steps of the placement search (kgpu_place_all) that one filter or preempt
 * call may spend over all the nodes it was sent, under the state lock: ten
 * nodes' worth of a full search (4-10 ms each measured on 8 to 32 GPUs,
 * sixteen containers, optimised build), so under 100 ms. A pod that defeats
 * greedy placement on many nodes (only pods of many containers can) gets
 * the full search on the first nodes and greedy's answer on the rest, each
 * refusal saying the search was cut; a cut search never makes a node
 * unresolvable. Bind searches one node, with the full budget, so whatever
 * filter passed, bind still places.
 */
#define CALL_SEARCH_STEPS (10L * KGPU_PLACE_BUDGET)

/*
 * Whether reqs fit node idx (kgpu_place_all's answer), from what is left of
 * the call's search budget (*left, decreased by what this one spent). One
 * request with nothing to undo takes kgpu_fit, the single-container fast path.
 */
static int place_budgeted(const kgpu_cluster *c, int idx, const kgpu_assignment *release,
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
static void add_reason(kgpu_jsonw *w, const char *node, const char *why)
{
    if (w->len > 0)
        kgpu_jsonw_lit(w, ",");
    kgpu_jsonw_str(w, node);
    kgpu_jsonw_lit(w, ":");
    kgpu_jsonw_str(w, why);
}

static void reply_written(ext_response *r, kgpu_jsonw *w)
{
    r->status = 200;
    r->content_type = "application/json";
    r->body = kgpu_jsonw_finish(w);
    if (r->body == NULL) {
        r->status = 500;
        r->body = strdup("{\"Error\":\"out of memory\"}");
    }
}

/* text into why, cut to fit. */
static void cut_reason(char *why, size_t len, const char *text)
{
    size_t n = strlen(text);
    if (n >= len)
        n = len - 1;
    memcpy(why, text, n);
    why[n] = '\0';
}

/*
 * Evicts reclaim's victims through the Eviction API (policy/v1), so that
 * PodDisruptionBudgets hold; the state learns each outcome. No lock held.
 */
void ext_evict_victims(ext_daemon *d, const ext_reclaim *r)
{
    for (int i = 0; i < r->nvictims; i++) {
        const ext_victim *v = &r->v[i];
        char path[KGPU_K8S_PATH_MAX];
        snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s/eviction", v->ns, v->name);
        json_t *body = json_pack("{s:s,s:s,s:{s:s,s:s}}", "apiVersion", "policy/v1", "kind",
                                 "Eviction", "metadata", "name", v->name, "namespace", v->ns);
        char *text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
        json_decref(body);
        kgpu_http_resp resp = {0};
        kgpu_error err;
        kgpu_error_clear(&err);
        int outcome = EXT_EVICT_FAILED;
        if (text != NULL &&
            kgpu_k8s_request(d->k8s, "POST", path, "application/json", text, &resp, &err) == 0) {
            outcome = resp.status == 200 || resp.status == 201 ? EXT_EVICT_EVICTED
                      : resp.status == 429                     ? EXT_EVICT_BLOCKED
                      : resp.status == 404                     ? EXT_EVICT_GONE
                                                               : EXT_EVICT_FAILED;
            if (outcome == EXT_EVICT_FAILED)
                ext_log(EXT_WARN, "eviction of %s/%s: API server answered %ld: %.300s", v->ns,
                        v->name, resp.status, resp.body ? resp.body : "");
        } else {
            ext_log(EXT_WARN, "eviction of %s/%s: %s", v->ns, v->name,
                    text ? err.msg : "out of memory");
        }
        free(text);
        free(resp.body);
        pthread_mutex_lock(&d->state.mu);
        ext_queues_evicted(&d->state, r, v, outcome);
        pthread_mutex_unlock(&d->state.mu);
    }
}

static void handle_filter(ext_daemon *d, json_t *args, fast_names *fast, ext_response *r)
{
    kgpu_pod *pod = malloc(sizeof(*pod));
    const char **names = NULL;
    json_t **objects = NULL;
    char invalid[INVALID_MAX]; /* "kgpu: <reason>" when kgpu cannot honour the pod's request */
    if (pod == NULL) {
        reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        goto out;
    }
    if (!read_pod(d, r, VERB_FILTER, args, pod, invalid, sizeof(invalid)))
        goto out;
    /*
     * Nodes.items (nodeCacheCapable: false) name the candidates and nothing
     * more: inventory comes only from the API server's node watch or the
     * cluster file, never from a request body that any client can send.
     */
    int n = read_nodes(d, r, VERB_FILTER, args, fast, &names, &objects);
    if (n < 0)
        goto out;
    bool *pass = calloc((size_t)n + 1, sizeof(*pass));
    /* The reply is written directly (see jsonw.h): FailedNodes and FailedAndUnresolvableNodes. */
    kgpu_jsonw failed, unresolvable;
    kgpu_jsonw_init(&failed, 256);
    kgpu_jsonw_init(&unresolvable, 256);
    kgpu_error err;
    kgpu_error_clear(&err);
    const kgpu_request *reqs[KGPU_MAX_PARTS];
    char why[REASON_MAX];
    int rc = 0;
    ext_asks asks;
    ext_asks_from_json(json_object_get(args, "Pod"), &asks);
    kgpu_strmap awaiting; /* node -> a pod there that kubelet must allocate before this one */
    kgpu_strmap_init(&awaiting);
    /* Its GPU queue (queues.c): -1 queues off, -2 no such queue (qwhy says so). */
    char qlabel[KGPU_QUEUE_NAME_MAX + 1], qname[KGPU_QUEUE_NAME_MAX + 1], qwhy[REASON_MAX] = "";
    char note[REASON_MAX] = ""; /* reclaim under way: said after every capacity reason */
    int priority, qid = -1;
    ext_pod_queue_fields(json_object_get(args, "Pod"), qlabel, sizeof(qlabel), &priority);
    ext_reclaim *evict = NULL; /* victims to evict through the API once the lock is released */
    pthread_mutex_lock(&d->state.mu);
    rc = check_pod(d, pod, NULL, invalid, sizeof(invalid));
    ext_filtered *remembered = NULL;
    if (rc == 0 && pod->nparts > 0 && invalid[0] == '\0') {
        remembered = ext_state_remember(&d->state, pod, &asks);
        if (d->state.awaiting.len > 0) {
            ext_await_expire(&d->state);
            ext_await_clashing_nodes(&d->state, pod->uid, &asks, &awaiting);
        }
        qid = ext_queues_resolve(&d->state, pod->ns, qlabel, qname, sizeof(qname), qwhy,
                                 sizeof(qwhy));
        if (remembered != NULL) {
            snprintf(remembered->queue_label, sizeof(remembered->queue_label), "%s", qlabel);
            snprintf(remembered->queue, sizeof(remembered->queue), "%s", qname);
            remembered->priority = priority;
        }
    }
    kgpu_request fitreq[KGPU_MAX_PARTS]; /* GPUs only: CPU and memory are kube-scheduler's */
    ext_fit_requests(pod, fitreq, reqs);
    int wait = EXT_WAIT_NONE;
    /*
     * A second round only after reclaim: with --cluster-file its evictions
     * are applied and the pod is placed again; otherwise every capacity
     * reason says the pod waits for the reclaim under way.
     */
    for (int round = 0; round < 2 && rc == 0 && pass != NULL; round++) {
        bool any = false, over = false;
        long search_left = CALL_SEARCH_STEPS;
        for (int i = 0; i < n; i++) {
            if (invalid[0] != '\0') { /* no node will do: see the comment at bad_request */
                add_reason(&unresolvable, names[i], invalid);
                continue;
            }
            if (pod->nparts == 0) {
                pass[i] = any = true; /* no GPU asked: not kgpu's business */
                continue;
            }
            if (qid == -2) { /* a queue may be made: not unresolvable */
                add_reason(&failed, names[i], qwhy);
                continue;
            }
            int idx = kgpu_cluster_find_node(d->state.cluster, names[i]);
            if (idx >= 0 && ext_dra_is_node(&d->state, names[i])) {
                add_reason(&unresolvable, names[i], EXT_DRA_NODE_REASON);
                continue;
            }
            if (idx < 0) {
                add_reason(&unresolvable, names[i],
                           "node has no GPU inventory known to kgpu (no kgpu.io/gpus annotation "
                           "and no nvidia.com/gpu)");
                continue;
            }
            if (place_budgeted(d->state.cluster, idx, NULL, 0, reqs, pod->nparts, 0,
                               &search_left, why, sizeof(why)) == KGPU_PLACE_FOUND) {
                const ext_await *w = awaiting.len > 0 ? kgpu_strmap_get(&awaiting, names[i]) : NULL;
                ext_ask same;
                if (w != NULL && ext_asks_clash(&w->asks, &asks, &same)) {
                    /* It fits, but the device plugin could not tell the two pods apart: soon. */
                    ext_await_reason(w, &same, why, sizeof(why));
                    add_reason(&failed, names[i], why);
                    continue;
                }
                int qs = qid >= 0 ? ext_queues_check(&d->state, qid, pod, idx, why, sizeof(why))
                                  : KGPU_QUEUE_WITHIN;
                if (qs == KGPU_QUEUE_WITHIN || qs == KGPU_QUEUE_BORROWS) {
                    pass[i] = any = true;
                    continue;
                }
                if (qs == KGPU_QUEUE_RECLAIM) {
                    char reason[3 * REASON_MAX];
                    snprintf(reason, sizeof(reason), "%s; within queue %s's guarantee: %s", why,
                             qname, note[0] ? note : "waits for reclaim");
                    cut_reason(why, sizeof(why), reason);
                }
                over = true;
                add_reason(&failed, names[i], why);
                continue;
            }
            if (note[0] != '\0') {
                char reason[3 * REASON_MAX];
                snprintf(reason, sizeof(reason), "%s; %s", why, note);
                cut_reason(why, sizeof(why), reason);
            }
            const kgpu_node *node = kgpu_cluster_node(d->state.cluster, idx);
            bool never = false;
            for (int k = 0; k < pod->nparts && !never; k++)
                never = never_fits(node, reqs[k], why, sizeof(why));
            if (!never &&
                place_budgeted(d->state.cluster, idx, NULL, 0, reqs, pod->nparts,
                               KGPU_PLACE_EMPTY, &search_left, NULL, 0) == KGPU_PLACE_NONE) {
                /* Each container alone could fit, but never all of them together. */
                char reason[REASON_MAX];
                snprintf(reason, sizeof(reason),
                         "%.200s (the containers together exceed the node "
                         "even with every GPU free)",
                         why);
                snprintf(why, sizeof(why), "%s", reason);
                never = true;
            }
            add_reason(never ? &unresolvable : &failed, names[i], why);
        }
        wait = any                        ? EXT_WAIT_NONE
               : wait == EXT_WAIT_RECLAIM ? EXT_WAIT_RECLAIM
               : over                     ? EXT_WAIT_QUOTA
                                          : EXT_WAIT_NONE;
        if (any || round > 0 || qid < 0 || n == 0 || invalid[0] != '\0')
            break;
        /* Fits no node: within its guarantee, borrowers make room (docs/queues.md "Reclaim"). */
        int qs = ext_queues_check(&d->state, qid, pod, -1, NULL, 0);
        if ((qs != KGPU_QUEUE_WITHIN && qs != KGPU_QUEUE_RECLAIM) || !ext_is_leader(d))
            break;
        ext_reclaim rec;
        int how = ext_queues_reclaim(&d->state, pod, qid, d->k8s == NULL, &rec, note, sizeof(note));
        if (how == EXT_RECLAIM_NONE && strstr(note, "PodDisruptionBudget") == NULL) {
            note[0] = '\0'; /* nothing borrowed would make room: the capacity reasons say it all */
            break;
        }
        if (how == EXT_RECLAIM_APPLIED)
            note[0] = '\0';
        if (how == EXT_RECLAIM_STARTED && (evict = malloc(sizeof(*evict))) != NULL)
            *evict = rec;
        wait = EXT_WAIT_RECLAIM;
        /* Again, from a clean answer. */
        free(kgpu_jsonw_finish(&failed));
        free(kgpu_jsonw_finish(&unresolvable));
        kgpu_jsonw_init(&failed, 256);
        kgpu_jsonw_init(&unresolvable, 256);
        memset(pass, 0, (size_t)n * sizeof(*pass));
    }
    remembered = rc == 0 && pod->nparts > 0 ? kgpu_strmap_get(&d->state.pending, pod->uid) : NULL;
    if (remembered != NULL)
        remembered->waiting = wait;
    pthread_mutex_unlock(&d->state.mu);
    if (evict != NULL) {
        ext_evict_victims(d, evict);
        free(evict);
    }
    kgpu_strmap_clear(&awaiting);
    if (rc != 0 || pass == NULL) { /* out of memory */
        free(kgpu_jsonw_finish(&failed));
        free(kgpu_jsonw_finish(&unresolvable));
        free(pass);
        reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        goto out;
    }
    if (invalid[0] != '\0')
        invalid_pod(d, VERB_FILTER, pod, invalid);
    kgpu_jsonw w;
    kgpu_jsonw_init(&w, (size_t)n * 24 + failed.len + unresolvable.len + 128);
    if (objects != NULL) {
        kgpu_jsonw_lit(&w, "{\"Nodes\":{\"apiVersion\":\"v1\",\"kind\":\"NodeList\",\"items\":[");
        bool first = true;
        for (int i = 0; i < n; i++) {
            if (!pass[i])
                continue;
            char *node = json_dumps(objects[i], JSON_COMPACT);
            if (node == NULL) {
                w.oom = true;
                break;
            }
            if (!first)
                kgpu_jsonw_lit(&w, ",");
            kgpu_jsonw_lit(&w, node);
            free(node);
            first = false;
        }
        kgpu_jsonw_lit(&w, "]},\"NodeNames\":null");
    } else {
        kgpu_jsonw_lit(&w, "{\"Nodes\":null,\"NodeNames\":[");
        bool first = true;
        for (int i = 0; i < n; i++) {
            if (!pass[i])
                continue;
            if (!first)
                kgpu_jsonw_lit(&w, ",");
            kgpu_jsonw_str(&w, names[i]);
            first = false;
        }
        kgpu_jsonw_lit(&w, "]");
    }
    kgpu_jsonw_lit(&w, ",\"FailedNodes\":{");
    kgpu_jsonw_raw(&w, failed.s ? failed.s : "", failed.oom ? 0 : failed.len);
    kgpu_jsonw_lit(&w, "},\"FailedAndUnresolvableNodes\":{");
    kgpu_jsonw_raw(&w, unresolvable.s ? unresolvable.s : "",
                   unresolvable.oom ? 0 : unresolvable.len);
    kgpu_jsonw_lit(&w, "},\"Error\":\"\"}");
    if (failed.oom || unresolvable.oom)
        w.oom = true;
    free(kgpu_jsonw_finish(&failed));
    free(kgpu_jsonw_finish(&unresolvable));
    free(pass);
    reply_written(r, &w);
out:
    free(names);
    free(objects);
    free(pod);
}

/*
 * prioritize scores the pods that ask for a GPU (the extender entry with
 * managedResources) and gives the others 0 everywhere. prioritize-gpuless
 * (gpuless true; an entry without managedResources, which kube-scheduler
 * calls for every pod) does the reverse: it scores the pods that ask for no
 * GPU with the same policy, as a request of their CPU and memory alone, so
 * that their CPU goes where it strands the fewest GPUs instead of where
 * LeastAllocated spreads it (docs/simulate.md), and learns them as arrivals.
 * A pod with resourceClaims asks for GPUs through DRA, no extended
 * resource, so it comes here too: it is scored by its first request of
 * class gpu.kgpu.io (dra.c) on the DRA nodes, 0 elsewhere, and 0
 * everywhere when its claims give none (logged).
 * Each pod is scored by exactly one of the two verbs.
 */
static void handle_prioritize(ext_daemon *d, json_t *args, fast_names *fast, ext_response *r,
                              bool gpuless)
{
    enum ext_verb verb = gpuless ? VERB_PRIORITIZE_GPULESS : VERB_PRIORITIZE;
    kgpu_pod *pod = malloc(sizeof(*pod));
    const char **names = NULL;
    json_t **objects = NULL;
    int *idx = NULL, *scores = NULL;
    char invalid[INVALID_MAX]; /* a pod kgpu cannot honour scores 0 everywhere */
    if (pod == NULL) {
        reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        goto out;
    }
    if (!read_pod(d, r, verb, args, pod, invalid, sizeof(invalid)))
        goto out;
    /* An unreadable pod is reported by the verbs of the entry that manages it. */
    bool report = !gpuless || invalid[0] == '\0';
    int n = read_nodes(d, r, verb, args, fast, &names, &objects);
    if (n < 0)
        goto out;
    idx = calloc((size_t)n + 1, sizeof(*idx));
    scores = calloc((size_t)n + 1, sizeof(*scores));
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = idx == NULL || scores == NULL ? KGPU_ENOMEM : 0;
    kgpu_policy *p = NULL;
    kgpu_request alone; /* prioritize-gpuless: the pod's CPU and memory, or its DRA claim's GPU */
    const kgpu_request *req = NULL;
    const json_t *pj = json_object_get(args, "Pod");
    /* A pod with resourceClaims asks through DRA (dra.c): scored on DRA nodes alone. */
    bool dra = gpuless && pod->nparts == 0 && invalid[0] == '\0' &&
               json_array_size(json_object_get(json_object_get(pj, "spec"), "resourceClaims")) > 0;
    char dra_why[2 * REASON_MAX] = ""; /* why a DRA pod scores 0 everywhere */
    pthread_mutex_lock(&d->state.mu);
    if (rc == 0 && !gpuless) {
        rc = check_pod(d, pod, &p, invalid, sizeof(invalid));
        req = pod->nparts > 0 && invalid[0] == '\0' ? &pod->parts[0].req : NULL;
    } else if (rc == 0 && dra) {
        if (ext_dra_pod_request(&d->state, pj, &alone, dra_why, sizeof(dra_why)) == 1) {
            alone.cpu_milli = pod->cpu_milli; /* for the scores, as a GPU pod's first part */
            alone.memory_mib = pod->memory_mib;
            int crc = ext_state_compile_request(&d->state, pod->uid, &alone, &err);
            p = crc == 0 ? ext_state_policy(&d->state, pod, &err) : NULL;
            req = p != NULL ? &alone : NULL;
            if (req == NULL && err.code == KGPU_ENOMEM)
                rc = KGPU_ENOMEM;
            else if (req == NULL)
                snprintf(dra_why, sizeof(dra_why), "pod %.63s/%.100s: %.120s", pod->ns, pod->name,
                         err.msg);
        }
    } else if (rc == 0 && pod->nparts == 0 && invalid[0] == '\0' &&
               (pod->cpu_milli > 0 || pod->memory_mib > 0)) {
        /* A pod asking for nothing takes nothing: every node is the same to it. */
        int crc = ext_state_compile_gpuless(&d->state, pod, &alone, &err);
        p = crc == 0 ? ext_state_policy(&d->state, pod, &err) : NULL;
        req = p != NULL ? &alone : NULL;
        if (req == NULL && err.code == KGPU_ENOMEM)
            rc = KGPU_ENOMEM;
        else if (req == NULL)
            snprintf(invalid, sizeof(invalid), "kgpu: %s", err.msg);
    }
    if (rc == 0 && req != NULL) {
        int m = 0;
        for (int i = 0; i < n; i++) {
            idx[i] = kgpu_cluster_find_node(d->state.cluster, names[i]);
            /*
             * A DRA pod's claim is allocated on DRA nodes only; a device-plugin
             * pod's resources are served on the others only (one owner per node).
             */
            if (idx[i] >= 0 && (dra || !gpuless) && dra != ext_dra_is_node(&d->state, names[i]))
                idx[i] = -1;
            m += idx[i] >= 0;
        }
        /* Score the known nodes in one call, then spread the scores back. */
        int *known = calloc((size_t)m + 1, sizeof(*known)),
            *ks = calloc((size_t)m + 1, sizeof(*ks));
        if (known == NULL || ks == NULL) {
            rc = KGPU_ENOMEM;
        } else {
            for (int i = 0, j = 0; i < n; i++)
                if (idx[i] >= 0)
                    known[j++] = idx[i];
            rc = kgpu_policy_node_scores(p, d->state.cluster, req, known, m, ks, &err);
            for (int i = 0, j = 0; i < n && rc == 0; i++)
                scores[i] = idx[i] >= 0 ? ks[j++] : 0;
        }
        free(known);
        free(ks);
    }
    pthread_mutex_unlock(&d->state.mu);
    if (rc != 0) { /* out of memory; the node indices are the state's own */
        reply_json(r, 500, json_pack("{s:s}", "Error", err.msg[0] ? err.msg : "out of memory"));
        goto out;
    }
    if (invalid[0] != '\0' && report)
        invalid_pod(d, verb, pod, invalid);
    if (dra_why[0] != '\0')
        ext_log(EXT_INFO, "%s; scored 0 on every node", dra_why);
    kgpu_jsonw w;
    kgpu_jsonw_init(&w, (size_t)n * 40 + 16);
    kgpu_jsonw_lit(&w, "[");
    for (int i = 0; i < n; i++) {
        kgpu_jsonw_lit(&w, i ? ",{\"Host\":" : "{\"Host\":");
        kgpu_jsonw_str(&w, names[i]);
        kgpu_jsonw_lit(&w, ",\"Score\":");
        kgpu_jsonw_int(&w, scores[i]);
        kgpu_jsonw_lit(&w, "}");
    }
    kgpu_jsonw_lit(&w, "]");
    reply_written(r, &w);
out:
    free(names);
    free(objects);
    free(idx);
    free(scores);
    free(pod);
}

static void bind_result(ext_response *r, const char *error)
{
    reply_json(r, 200, json_pack("{s:s}", "Error", error));
}

static void bind_failed(ext_daemon *d, ext_response *r, enum ext_bind_fail why, const char *msg)
{
    atomic_fetch_add(&d->metrics.bind_failures[why], 1);
    ext_log(EXT_WARN, "bind failed (%s): %s", ext_bind_fail_name(why), msg);
    bind_result(r, msg);
}

/*
 * The pod for a bind, and its asks: remembered from filter, else asked of the
 * API server. NULL with msg and *fail saying why.
 */
static kgpu_pod *bind_pod(ext_daemon *d, const char *ns, const char *name, const char *uid,
                          ext_asks *asks, char *qlabel, size_t qlen, int *priority, char *msg,
                          size_t len, enum ext_bind_fail *fail)
{
    qlabel[0] = '\0';
    *priority = 0;
    *fail = BIND_FAIL_UNKNOWN_POD;
    kgpu_pod *pod = malloc(sizeof(*pod));
    if (pod == NULL)
        return NULL;
    pthread_mutex_lock(&d->state.mu);
    const ext_filtered *known = ext_state_recall(&d->state, uid);
    if (known != NULL) {
        ext_pod_copy(pod, &known->pod);
        *asks = known->asks;
        snprintf(qlabel, qlen, "%s", known->queue_label);
        *priority = known->priority;
    }
    pthread_mutex_unlock(&d->state.mu);
    if (known != NULL && (strcmp(pod->ns, ns) != 0 || strcmp(pod->name, name) != 0)) {
        /* A uid names one pod for its life: kube-scheduler binds the pod it filtered. */
        *fail = BIND_FAIL_BAD_REQUEST;
        snprintf(msg, len,
                 "pod %s/%s (uid %s): that uid was filtered as pod %s/%s; refused to bind it "
                 "under another name",
                 ns, name, uid, pod->ns, pod->name);
        free(pod);
        return NULL;
    }
    if (known != NULL)
        return pod;
    if (d->k8s != NULL) {
        char path[KGPU_K8S_PATH_MAX];
        snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", ns, name);
        kgpu_error err;
        kgpu_error_clear(&err);
        long status = 0;
        json_t *j = kgpu_k8s_get_json(d->k8s, path, &status, &err);
        if (status == 200) {
            int rc = j ? kgpu_pod_from_json(j, d->cfg.memory_unit_mib, pod, &err) : -1;
            const char *juid =
                json_string_value(json_object_get(json_object_get(j, "metadata"), "uid"));
            bool same = juid != NULL && strcmp(juid, uid) == 0;
            ext_asks_from_json(j, asks);
            ext_pod_queue_fields(j, qlabel, qlen, priority);
            json_decref(j);
            if (rc == 0 && strcmp(pod->uid, uid) == 0)
                return pod;
            if (rc != 0 && same) { /* the pod, but a request kgpu cannot honour */
                *fail = BIND_FAIL_BAD_REQUEST;
                snprintf(msg, len, "pod %s/%s: kgpu: %s", ns, name, err.msg);
            } else {
                snprintf(msg, len,
                         "pod %s/%s: the API server has another pod of that name (uid %s)", ns,
                         name, rc == 0 ? pod->uid : "unreadable");
            }
            free(pod);
            return NULL;
        }
        json_decref(j);
        if (status == 404)
            snprintf(msg, len,
                     "pod %s/%s (uid %s) is unknown to kgpu: the API server has no such pod", ns,
                     name, uid);
        else if (status > 0)
            snprintf(msg, len,
                     "pod %s/%s (uid %s) is unknown to kgpu, and the API server answered "
                     "%ld when asked for it",
                     ns, name, uid, status);
        else
            snprintf(msg, len,
                     "pod %s/%s (uid %s) is unknown to kgpu, and the API server could "
                     "not be asked for it: %s",
                     ns, name, uid, err.msg);
        free(pod);
        return NULL;
    }
    snprintf(msg, len,
             "pod %s/%s (uid %s) is unknown to kgpu: kube-scheduler calls filter before bind, "
             "and without an API server to ask kgpu knows only the last %d pods filtered; was "
             "the extender restarted, or were more pods filtered, in between?",
             ns, name, uid, d->cfg.pending_pods_max);
    free(pod);
    return NULL;
}

/*
 * POSTs the Binding (with `ann`, or none for a pod without GPUs). Returns
 * BIND_FAIL_COUNT when the API server accepted it, else the reason, with
 * msg saying what the API server answered.
 */
static enum ext_bind_fail post_binding(ext_daemon *d, const char *ns, const char *name,
                                       const char *uid, const char *node, json_t *ann, char *msg,
                                       size_t len)
{
    kgpu_error err;
    kgpu_http_resp resp = {0};
    enum ext_bind_fail why = BIND_FAIL_COUNT;
    if (kgpu_k8s_bind(d->k8s, ns, name, uid, node, ann, &resp, &err) != 0) {
        why = BIND_FAIL_API_UNREACHABLE;
        snprintf(msg, len, "binding %s/%s to %s: %s", ns, name, node, err.msg);
    } else if (resp.status != 200 && resp.status != 201) {
        why = resp.status == 409 ? BIND_FAIL_API_CONFLICT : BIND_FAIL_API_ERROR;
        json_t *st = resp.body ? json_loads(resp.body, 0, NULL) : NULL;
        const char *m = json_string_value(json_object_get(st, "message"));
        snprintf(msg, len, "binding %s/%s to %s: API server answered %ld: %.600s", ns, name, node,
                 resp.status, m ? m : (resp.body ? resp.body : ""));
        json_decref(st);
    }
    free(resp.body);
    return why;
}

/*
 * Whether s is a DNS subdomain (RFC 1123: lowercase letters, digits, '-'
 * and '.', alphanumeric at both ends), as every pod name and namespace is.
 * Bind puts them in API paths: nothing else may get there.
 */
static bool dns_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > KGPU_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && ((c != '-' && c != '.') || i == 0 || i == n - 1))
            return false;
    }
    return true;
}

static void handle_bind(ext_daemon *d, json_t *args, ext_response *r)
{
    const char *name = json_string_value(json_object_get(args, "PodName"));
    const char *ns = json_string_value(json_object_get(args, "PodNamespace"));
    const char *uid = json_string_value(json_object_get(args, "PodUID"));
    const char *node = json_string_value(json_object_get(args, "Node"));
    char msg[1024];
    if (name == NULL || ns == NULL || uid == NULL || node == NULL || !name[0] || !uid[0] ||
        !node[0] || strlen(name) > KGPU_NAME_MAX || strlen(ns) > KGPU_NAME_MAX ||
        strlen(node) > KGPU_NAME_MAX || strlen(uid) >= 64) {
        atomic_fetch_add(&d->metrics.bind_failures[BIND_FAIL_BAD_REQUEST], 1);
        bad_request(d, r, VERB_BIND,
                    "ExtenderBindingArgs needs string fields PodName, PodNamespace, PodUID and "
                    "Node");
        return;
    }
    if (!dns_name(name) || !dns_name(ns)) {
        atomic_fetch_add(&d->metrics.bind_failures[BIND_FAIL_BAD_REQUEST], 1);
        bad_request(d, r, VERB_BIND,
                    "PodName and PodNamespace must be DNS names (lowercase letters, digits, "
                    "'-' and '.'), as every pod's are");
        return;
    }
    if (!ext_is_leader(d)) {
        atomic_fetch_add(&d->metrics.bind_failures[BIND_FAIL_STANDBY], 1);
        snprintf(msg, sizeof(msg),
                 "this kgpu-extender replica (%s) is a standby: only the holder of lease %s/%s "
                 "binds; kube-scheduler should reach it through the Service",
                 d->identity, d->cfg.lease_ns, d->cfg.lease_name);
        bind_result(r, msg);
        return;
    }
    ext_asks asks;
    enum ext_bind_fail fail;
    char qlabel[KGPU_QUEUE_NAME_MAX + 1], qname[KGPU_QUEUE_NAME_MAX + 1], qwhy[REASON_MAX];
    int priority;
    kgpu_pod *pod = bind_pod(d, ns, name, uid, &asks, qlabel, sizeof(qlabel), &priority, msg,
                             sizeof(msg), &fail);
    if (pod == NULL) {
        if (fail == BIND_FAIL_BAD_REQUEST)
            atomic_fetch_add(&d->metrics.invalid_pods[VERB_BIND], 1);
        bind_failed(d, r, fail, msg);
        return;
    }
    if (pod->nparts == 0) { /* asks for no GPU (e.g. kgpu.io/gpu-mem: 0): bind, hold nothing */
        free(pod);
        enum ext_bind_fail why =
            d->k8s ? post_binding(d, ns, name, uid, node, NULL, msg, sizeof(msg)) : BIND_FAIL_COUNT;
        if (why != BIND_FAIL_COUNT)
            bind_failed(d, r, why, msg);
        else
            bind_result(r, "");
        return;
    }
    const ext_pod *held = NULL;
    char held_node[KGPU_NAME_MAX + 1] = "", held_ns[64] = "", held_name[KGPU_NAME_MAX + 1] = "";
    bool held_bound = false;
    kgpu_error err;
    kgpu_error_clear(&err);
    char *assignment = NULL;
    char waiting[REASON_MAX] = "";
    pthread_mutex_lock(&d->state.mu);
    int rc = ext_state_compile(&d->state, pod, &err);
    if (rc == 0 && kgpu_strmap_get(&d->state.pods, uid) == NULL && d->state.awaiting.len > 0) {
        /* Filter let it through, but another bind of the same size may have come first. */
        ext_await_expire(&d->state);
        ext_ask same;
        const ext_await *w = ext_await_clash(&d->state, node, uid, &asks, &same);
        if (w != NULL) {
            ext_await_reason(w, &same, waiting, sizeof(waiting));
            rc = kgpu_error_set(&err, KGPU_ESTATE, "%s", waiting);
        }
    }
    if (rc == 0 && ext_queues_resolve(&d->state, ns, qlabel, qname, sizeof(qname), qwhy,
                                      sizeof(qwhy)) == -2)
        rc = kgpu_error_set(&err, KGPU_ENOFIT, "%s", qwhy);
    if (rc == 0)
        rc = ext_state_reserve(&d->state, pod, node, qlabel, priority, &held, &err);
    if (rc == 0) {
        ext_filtered *f = kgpu_strmap_get(&d->state.pending, uid);
        if (f != NULL)
            f->waiting = EXT_WAIT_NONE;
    }
    if (held != NULL) { /* copied while the lock makes it safe to read */
        snprintf(held_node, sizeof(held_node), "%s", held->node);
        snprintf(held_ns, sizeof(held_ns), "%s", held->ns);
        snprintf(held_name, sizeof(held_name), "%s", held->name);
        held_bound = held->status == POD_BOUND;
    }
    if (rc == 0) {
        const kgpu_node *n =
            kgpu_cluster_node(d->state.cluster, kgpu_cluster_find_node(d->state.cluster, node));
        kgpu_assignment a[KGPU_MAX_PARTS];
        for (int i = 0; i < held->nparts && i < KGPU_MAX_PARTS; i++)
            a[i] = held->part[i].a;
        assignment = kgpu_assignment_format(n, pod->parts, a, held->nparts);
        if (assignment == NULL) {
            ext_state_release(&d->state, uid);
            rc = kgpu_error_set(&err, KGPU_ENOMEM, "out of memory");
        } else {
            /* From now on, same-size pods stay off this node until kubelet allocates this one. */
            ext_await_record(&d->state, uid, ns, name, node, &asks, 0);
        }
    }
    pthread_mutex_unlock(&d->state.mu);
    if (waiting[0] != '\0') {
        free(pod);
        snprintf(msg, sizeof(msg), "binding %s/%s to %s: %s", ns, name, node, waiting);
        bind_failed(d, r, BIND_FAIL_AWAITING, msg);
        return;
    }
    if (rc == KGPU_EEXIST) {
        free(pod);
        if (strcmp(held_ns, ns) != 0 || strcmp(held_name, name) != 0) {
            snprintf(msg, sizeof(msg),
                     "pod %s/%s (uid %s): that uid holds GPUs as pod %s/%s; refused to bind it "
                     "under another name",
                     ns, name, uid, held_ns, held_name);
            bind_failed(d, r, BIND_FAIL_BAD_REQUEST, msg);
            return;
        }
        if (strcmp(held_node, node) == 0 && held_bound) {
            bind_result(r, ""); /* a retry of a bind that went through */
            return;
        }
        snprintf(msg, sizeof(msg), "pod %s/%s: %s%s", ns, name, err.msg,
                 held_bound ? "" : " (a bind is in flight)");
        bind_failed(d, r, BIND_FAIL_API_CONFLICT, msg);
        return;
    }
    if (rc != 0) {
        free(pod);
        snprintf(msg, sizeof(msg), "binding %s/%s to %s: %s", ns, name, node, err.msg);
        bind_failed(d, r,
                    rc == KGPU_ENOENT   ? BIND_FAIL_UNKNOWN_NODE
                    : rc == KGPU_EINVAL ? BIND_FAIL_BAD_REQUEST
                                        : BIND_FAIL_NO_FIT,
                    msg);
        return;
    }
    if (d->k8s == NULL) { /* cluster-file mode: the binding lives in memory */
        pthread_mutex_lock(&d->state.mu);
        ext_state_confirm(&d->state, uid);
        pthread_mutex_unlock(&d->state.mu);
        ext_log(EXT_INFO, "bound %s/%s to %s: %s", ns, name, node, assignment);
        free(assignment);
        free(pod);
        bind_result(r, "");
        return;
    }
    char when[64];
    kgpu_rfc3339_now(when, sizeof(when));
    json_t *ann = json_pack("{s:s,s:s,s:s}", KGPU_ANN_ASSIGNMENT, assignment, KGPU_ANN_NODE, node,
                            KGPU_ANN_BIND_TIME, when);
    enum ext_bind_fail why = post_binding(d, ns, name, uid, node, ann, msg, sizeof(msg));
    json_decref(ann);
    pthread_mutex_lock(&d->state.mu);
    if (why == BIND_FAIL_COUNT)
        ext_state_confirm(&d->state, uid);
    else
        ext_state_release(&d->state, uid); /* nothing leaks when the API server says no */
    pthread_mutex_unlock(&d->state.mu);
    free(pod);
    if (why != BIND_FAIL_COUNT) {
        free(assignment);
        bind_failed(d, r, why, msg);
        return;
    }
    ext_log(EXT_INFO, "bound %s/%s to %s: %s", ns, name, node, assignment);
    free(assignment);
    bind_result(r, "");
}

/*
 * Victim UIDs of one node from NodeNameToVictims (full pods) or
 * NodeNameToMetaVictims, as many as were sent (borrowed from entry; *uids is
 * malloc'd, caller frees). -1 when a victim has no UID (kube-scheduler
 * always sends one), or out of memory (*uids NULL).
 */
static int victim_uids(json_t *entry, bool meta, const char ***uids)
{
    json_t *pods = json_object_get(entry, "Pods");
    size_t n = json_array_size(pods), i;
    json_t *p;
    *uids = calloc(n + 1, sizeof(**uids));
    if (*uids == NULL)
        return -1;
    json_array_foreach(pods, i, p)
    {
        const char *uid =
            meta ? json_string_value(json_object_get(p, "UID"))
                 : json_string_value(json_object_get(json_object_get(p, "metadata"), "uid"));
        if (uid == NULL)
            return -1;
        (*uids)[i] = uid;
    }
    return (int)n;
}

static void handle_preempt(ext_daemon *d, json_t *args, ext_response *r)
{
    kgpu_pod *pod = malloc(sizeof(*pod));
    char invalid[INVALID_MAX]; /* preemption cannot help a pod kgpu cannot honour: no node kept */
    if (pod == NULL) {
        reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        return;
    }
    if (!read_pod(d, r, VERB_PREEMPT, args, pod, invalid, sizeof(invalid))) {
        free(pod);
        return;
    }
    json_t *victims = json_object_get(args, "NodeNameToMetaVictims");
    bool meta = json_is_object(victims);
    if (!meta)
        victims = json_object_get(args, "NodeNameToVictims");
    if (victims != NULL && !json_is_null(victims) && !json_is_object(victims)) {
        free(pod);
        bad_request(d, r, VERB_PREEMPT, "NodeNameToVictims is not an object");
        return;
    }
    json_t *out = json_object();
    kgpu_error err;
    kgpu_error_clear(&err);
    const char *node;
    json_t *entry;
    long search_left = CALL_SEARCH_STEPS;
    pthread_mutex_lock(&d->state.mu);
    int rc = check_pod(d, pod, NULL, invalid, sizeof(invalid));
    const char *no_uid = NULL; /* a node with a victim without a UID */
    json_object_foreach(victims, node, entry)
    {
        if (rc != 0 || invalid[0] != '\0')
            break;
        const char **uids;
        int nv = victim_uids(entry, meta, &uids);
        if (nv < 0) {
            if (uids == NULL) {
                rc = KGPU_ENOMEM;
            } else {
                free(uids);
                no_uid = node;
            }
            break;
        }
        bool keep = pod->nparts == 0;
        int idx = kgpu_cluster_find_node(d->state.cluster, node);
        if (idx >= 0 && ext_dra_is_node(&d->state, node))
            idx = -1; /* no device-plugin GPU there: preemption cannot make room */
        if (!keep && idx >= 0) {
            /* Would the pod fit once the victims that hold GPUs here are gone? */
            kgpu_assignment *release = calloc((size_t)nv * KGPU_MAX_PARTS + 1, sizeof(*release));
            int nr = 0;
            for (int v = 0; v < nv && release != NULL; v++) {
                const ext_pod *p = kgpu_strmap_get(&d->state.pods, uids[v]);
                if (p != NULL && strcmp(p->node, node) == 0)
                    for (int k = 0; k < p->nparts; k++)
                        release[nr++] = p->part[k].a;
            }
            const kgpu_request *reqs[KGPU_MAX_PARTS];
            kgpu_request fitreq[KGPU_MAX_PARTS];
            ext_fit_requests(pod, fitreq, reqs);
            keep = release != NULL &&
                   place_budgeted(d->state.cluster, idx, release, nr, reqs, pod->nparts, 0,
                                  &search_left, NULL, 0) == KGPU_PLACE_FOUND;
            free(release);
        }
        if (!keep) {
            free(uids);
            continue;
        }
        json_t *pods = json_array();
        for (int v = 0; v < nv; v++)
            json_array_append_new(pods, json_pack("{s:s}", "UID", uids[v]));
        free(uids);
        json_t *pdb = json_object_get(entry, "NumPDBViolations");
        json_object_set_new(
            out, node,
            json_pack("{s:o,s:I}", "Pods", pods, "NumPDBViolations",
                      (json_int_t)(json_is_integer(pdb) ? json_integer_value(pdb) : 0)));
    }
    pthread_mutex_unlock(&d->state.mu);
    if (no_uid != NULL) {
        char msg[REASON_MAX];
        snprintf(msg, sizeof(msg), "a victim on node %.200s has no UID", no_uid);
        free(pod);
        json_decref(out);
        bad_request(d, r, VERB_PREEMPT, msg);
        return;
    }
    if (invalid[0] != '\0')
        invalid_pod(d, VERB_PREEMPT, pod, invalid);
    free(pod);
    if (rc != 0) { /* out of memory */
        json_decref(out);
        reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        return;
    }
    reply_json(r, 200, json_pack("{s:o}", "NodeNameToMetaVictims", out));
}

void ext_response_discard(ext_response *r)
{
    free(r->body);
    r->body = NULL;
    if (r->stream.read != NULL)
        r->stream.free(r->stream.ctx);
    r->stream = (ext_stream){0};
}

/*
 * DELETE /pods/NAMESPACE/NAME: in --cluster-file mode, where no watch says
 * that a pod ended, whoever drives the extender says so; its GPUs and its
 * queue's charge are released. With an API server pods leave by its watch.
 */
static void handle_pod_delete(ext_daemon *d, const char *path, ext_response *r)
{
    if (d->k8s != NULL) {
        reply_json(r, 405,
                   json_pack("{s:s}", "Error",
                             "pods leave through the API server's watch; DELETE /pods/NS/NAME "
                             "is for --cluster-file mode"));
        return;
    }
    char ns[64], name[KGPU_NAME_MAX + 1];
    const char *slash = strchr(path, '/');
    if (slash == NULL || slash == path || (size_t)(slash - path) >= sizeof(ns) ||
        strlen(slash + 1) >= sizeof(name) || slash[1] == '\0') {
        reply_text(r, 400, "DELETE /pods/NAMESPACE/NAME\n");
        return;
    }
    snprintf(ns, sizeof(ns), "%.*s", (int)(slash - path), path);
    snprintf(name, sizeof(name), "%s", slash + 1);
    char uid[64] = "";
    pthread_mutex_lock(&d->state.mu);
    const char *k;
    void *v;
    size_t it = 0;
    while (uid[0] == '\0' && kgpu_strmap_next(&d->state.pods, &it, &k, &v)) {
        const ext_pod *p = v;
        if (strcmp(p->ns, ns) == 0 && strcmp(p->name, name) == 0)
            snprintf(uid, sizeof(uid), "%s", p->uid);
    }
    if (uid[0] != '\0')
        ext_state_pod_gone(&d->state, uid);
    pthread_mutex_unlock(&d->state.mu);
    if (uid[0] == '\0') {
        reply_json(r, 404, json_pack("{s:s}", "Error", "no pod of that name holds GPUs"));
        return;
    }
    ext_log(EXT_INFO, "pod %s/%s (uid %s) left: its GPUs are released", ns, name, uid);
    reply_json(r, 200, json_pack("{s:s,s:s,s:s}", "namespace", ns, "name", name, "uid", uid));
}

/* The last path segment for POST verbs, so any urlPrefix kube-scheduler uses works. */
static const char *last_segment(const char *url)
{
    const char *s = strrchr(url, '/');
    return s ? s + 1 : url;
}

void ext_handle(ext_daemon *d, const char *method, const char *url, const char *body, size_t len,
                ext_response *r)
{
    memset(r, 0, sizeof(*r));
    if (strcmp(method, "POST") == 0) {
        const char *verb = last_segment(url);
        enum ext_verb v = VERB_OTHER;
        for (int i = 0; i < VERB_OTHER; i++)
            if (strcmp(verb, ext_verb_name((enum ext_verb)i)) == 0)
                v = (enum ext_verb)i;
        if (v == VERB_OTHER) {
            reply_json(r, 404,
                       json_pack("{s:s}", "Error",
                                 "unknown verb; POST filter, "
                                 "prioritize, prioritize-gpuless, bind or preempt"));
            return;
        }
        double t0 = ext_now();
        atomic_fetch_add(&d->metrics.requests[v], 1);
        fast_names fast = {NULL, -1};
        char *copy = NULL, *store = NULL;
        if (v == VERB_FILTER || v == VERB_PRIORITIZE || v == VERB_PRIORITIZE_GPULESS) {
            copy = malloc(len + 1);
            store = malloc(len + 1);
            if (copy != NULL && store != NULL) {
                memcpy(copy, body, len);
                copy[len] = '\0';
                fast.n = fast_node_names(copy, len, store, &fast.names);
            }
        }
        json_t *args = parse_body(d, r, v, fast.n >= 0 ? copy : body, len);
        if (args != NULL) {
            switch (v) {
            case VERB_FILTER:
                handle_filter(d, args, &fast, r);
                break;
            case VERB_PRIORITIZE:
            case VERB_PRIORITIZE_GPULESS:
                handle_prioritize(d, args, &fast, r, v == VERB_PRIORITIZE_GPULESS);
                break;
            case VERB_BIND:
                handle_bind(d, args, r);
                break;
            default:
                handle_preempt(d, args, r);
                break;
            }
            json_decref(args);
        }
        free(fast.names);
        free(copy);
        free(store);
        if (r->body == NULL && r->status == 0)
            reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        ext_metrics_observe(&d->metrics, v, ext_now() - t0);
        return;
    }
    if (strcmp(method, "DELETE") == 0 && strncmp(url, "/pods/", 6) == 0) {
        handle_pod_delete(d, url + 6, r);
        return;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        reply_text(r, 405, "method not allowed\n");
        return;
    }
    if (strcmp(url, "/healthz") == 0) {
        reply_text(r, 200, "ok\n");
    } else if (strcmp(url, "/readyz") == 0) {
        bool ready = ext_daemon_ready(d);
        reply_text(r, ready ? 200 : 503,
                   ready              ? "ok\n"
                   : ext_is_leader(d) ? "not ready: nodes or pods not listed from the API server "
                                        "yet\n"
                                      : "standby: another replica holds the lease\n");
    } else if (strcmp(url, "/version") == 0) {
        reply_json(r, 200,
                   json_pack("{s:s,s:s}", "version", KGPU_VERSION, "component", "kgpu-extender"));
    } else if (strcmp(url, "/metrics") == 0) {
        bool busy;
        if (ext_metrics_stream(d, &r->stream, &busy)) {
            r->status = 200;
            r->content_type = "text/plain; version=0.0.4; charset=utf-8";
        } else if (busy) {
            reply_text(r, 503,
                       "too many /metrics answers being sent at once; retry when one is done\n");
        } /* else out of memory: no body, the serving layer answers 500 */
    } else if (strcmp(url, "/inspect") == 0) {
        reply_json(r, 200, ext_inspect_json(d, NULL));
    } else if (strncmp(url, "/inspect/", 9) == 0 && url[9] != '\0') {
        /* The path arrives percent-decoded: %ff is a byte no node name has (nor JSON takes). */
        bool name_ok = strlen(url + 9) <= KGPU_NAME_MAX;
        for (const char *c = url + 9; name_ok && *c; c++)
            name_ok = *c > ' ' && *c < 0x7f;
        json_t *one = name_ok ? ext_inspect_json(d, url + 9) : NULL;
        if (!name_ok)
            reply_text(r, 400, "not a node name: /inspect/NODE takes a node name\n");
        else if (one == NULL)
            reply_json(r, 404,
                       json_pack("{s:s,s:s}", "Error", "no such GPU node", "node", url + 9));
        else
            reply_json(r, 200, one);
    } else {
        reply_text(r, 404, "not found\n");
    }
}
