/*
 * Which pod and container an Allocate belongs to.
 *
 * kubelet's Allocate names only device IDs. kubelet admits one pod at a
 * time and allocates its containers in order (init containers, then app
 * containers), one call per container and resource. So at any Allocate the
 * pod being admitted is bound to this node, carries the extender's
 * kgpu.io/assignment, and is not yet kgpu.io/allocated; the container is
 * its first one that asks for the resource and has not been served it
 * (progress is kept in the pod's kgpu.io/allocating annotation); and that
 * container asks exactly as many devices as kubelet sent. If one pod fits
 * that description, it is the one. If none or several do, the plugin says
 * so instead of guessing: the extender never binds a second pod with a
 * container of the same size to a node while the first awaits kubelet, so
 * "several" means something outside kgpu bound pods here.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "dp.h"
#include "podspec.h"

#define MAX_CONTAINERS 64
#define LIST_MAX       900 /* characters of candidate lists in error messages */

typedef struct container_need {
    const char *name;
    bool init;
    int64_t count[DP_NRES]; /* devices kubelet hands out per resource */
    int64_t gpu_count;      /* kgpu.io/gpu-count, 1 when absent */
    bool served[DP_NRES];   /* listed in the pod's kgpu.io/allocating */
} container_need;

typedef struct pod_view {
    const json_t *pod;
    const char *ns, *name, *uid;
    const char *assignment;
    const char *progress; /* kgpu.io/allocating or "" */
    int ncontainers;
    container_need c[MAX_CONTAINERS];
    int next; /* container next served resource r, -1 = none */
} pod_view;

static const char *str_at(const json_t *o, const char *a, const char *b)
{
    const json_t *v = json_object_get(o, a);
    if (b != NULL)
        v = json_object_get(v, b);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static const char *annotation(const json_t *pod, const char *key)
{
    return str_at(json_object_get(pod, "metadata"), "annotations", key);
}

/* Not awaiting kubelet: finished, being deleted, or running (kubelet admitted it). */
static bool not_awaiting(const json_t *pod)
{
    const char *phase = str_at(pod, "status", "phase");
    if (phase != NULL && *phase != '\0' && strcmp(phase, "Pending") != 0)
        return true;
    return json_object_get(json_object_get(pod, "metadata"), "deletionTimestamp") != NULL;
}

/*
 * Reads the progress annotation, items "<container>:<resource>" of known
 * containers, into each container's `served`.
 */
static int read_progress(pod_view *v, kgpu_error *err)
{
    for (const char *p = v->progress; *p != '\0';) {
        const char *end = strchr(p, ',');
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', n);
        bool ok = false;
        if (colon != NULL) {
            char res[64];
            size_t rl = n - (size_t)(colon - p) - 1;
            int r = -1;
            if (rl < sizeof(res)) {
                memcpy(res, colon + 1, rl);
                res[rl] = '\0';
                r = dp_res_from_name(res);
            }
            for (int i = 0; i < v->ncontainers && r >= 0; i++)
                if (strlen(v->c[i].name) == (size_t)(colon - p) &&
                    memcmp(v->c[i].name, p, (size_t)(colon - p)) == 0) {
                    v->c[i].served[r] = true;
                    ok = true;
                }
        }
        if (!ok)
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "pod %s/%s: annotation %s item '%.*s' is not "
                                  "<container>:<resource> of one of its containers",
                                  v->ns, v->name, DP_ANN_ALLOCATING, (int)(n > 80 ? 80 : n), p);
        p = end != NULL ? end + 1 : p + n;
    }
    return 0;
}

/* A limit as kubelet counts it: the quantity's integer value. */
static int limit_count(const json_t *limits, const char *res, const char *who, int64_t *out,
                       kgpu_error *err)
{
    *out = 0;
    const json_t *v = json_object_get(limits, res);
    if (v == NULL)
        return 0;
    char num[64];
    const char *text = json_string_value(v);
    if (json_is_integer(v)) {
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        text = num;
    }
    kgpu_error qe = {0};
    if (text == NULL || kgpu_quantity_value(text, out, &qe) != 0 || *out < 0)
        return kgpu_error_set(err, KGPU_EPARSE, "%s: limit %s is not a count", who, res);
    return 0;
}

static int read_containers(pod_view *v, const char *list, bool init, kgpu_error *err)
{
    const json_t *arr = json_object_get(json_object_get(v->pod, "spec"), list);
    if (arr == NULL)
        return 0;
    if (!json_is_array(arr))
        return kgpu_error_set(err, KGPU_EPARSE, "pod %s/%s: spec.%s is not an array", v->ns,
                              v->name, list);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *c = json_array_get(arr, i);
        const char *name = str_at(c, "name", NULL);
        if (name == NULL || *name == '\0' || strlen(name) > 63 || strpbrk(name, ":,") != NULL)
            return kgpu_error_set(err, KGPU_EPARSE, "pod %s/%s: spec.%s[%zu].name is not valid",
                                  v->ns, v->name, list, i);
        if (v->ncontainers >= MAX_CONTAINERS)
            return kgpu_error_set(err, KGPU_ERANGE, "pod %s/%s: more than %d containers", v->ns,
                                  v->name, MAX_CONTAINERS);
        container_need *cn = &v->c[v->ncontainers++];
        memset(cn, 0, sizeof(*cn));
        cn->name = name;
        cn->init = init;
        const json_t *limits = json_object_get(json_object_get(c, "resources"), "limits");
        char who[160];
        snprintf(who, sizeof(who), "pod %s/%s %scontainer %s", v->ns, v->name, init ? "init " : "",
                 name);
        int rc;
        for (int r = 0; r < DP_NRES; r++)
            if ((rc = limit_count(limits, dp_res_name((dp_res)r), who, &cn->count[r], err)) != 0)
                return rc;
        if ((rc = limit_count(limits, KGPU_RES_COUNT, who, &cn->gpu_count, err)) != 0)
            return rc;
        if (cn->gpu_count <= 0)
            cn->gpu_count = 1;
    }
    return 0;
}

/* Reads what the matcher needs of an awaiting pod; v->next for resource r. */
static int view_pod(const json_t *pod, dp_res r, unsigned registered, pod_view *v, kgpu_error *err)
{
    memset(v, 0, sizeof(*v));
    v->pod = pod;
    const json_t *md = json_object_get(pod, "metadata");
    v->ns = str_at(md, "namespace", NULL);
    v->name = str_at(md, "name", NULL);
    v->uid = str_at(md, "uid", NULL);
    if (v->ns == NULL)
        v->ns = "default";
    if (v->name == NULL || v->uid == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "a pod without metadata.name or metadata.uid");
    v->assignment = annotation(pod, KGPU_ANN_ASSIGNMENT);
    v->progress = annotation(pod, DP_ANN_ALLOCATING);
    if (v->progress == NULL)
        v->progress = "";
    int rc;
    if ((rc = read_containers(v, "initContainers", true, err)) != 0 ||
        (rc = read_containers(v, "containers", false, err)) != 0 ||
        (rc = read_progress(v, err)) != 0)
        return rc;
    v->next = -1;
    if (!(registered & (1u << r)))
        return 0;
    for (int i = 0; i < v->ncontainers; i++)
        if (v->c[i].count[r] > 0 && !v->c[i].served[r]) {
            v->next = i;
            break;
        }
    return 0;
}

static void append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Appends to a bounded message, ending it with "..." when it is full. */
static void append(char *buf, size_t cap, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 4 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= cap - len)
        snprintf(buf + cap - 4, 4, "...");
}

/* The container's kgpu.io/gpu-mem units (or gpushare's alias: the extender reads one). */
static int64_t units_of(const container_need *cn)
{
    return cn->count[DP_RES_MEM] > 0 ? cn->count[DP_RES_MEM] : cn->count[DP_RES_ALIAS];
}

/*
 * An assignment gives a container what the extender writes for its requests
 * and nothing more: whole GPUs (exclusive) only for nvidia.com/gpu, as many
 * GPUs as it asks, and on each its even split of the memory units and its
 * kgpu.io/gpu-core. The annotation is a pod's, so anyone who can write the
 * pod (a tenant creating it already bound, with spec.nodeName) can write it:
 * without this check a pod asking one memory unit could name every GPU of
 * the node with all their memory and compute.
 */
static int within_request(const pod_view *v, const container_need *cn,
                          const kgpu_assigned_part *p, int64_t unit_mib, kgpu_error *err)
{
    int64_t whole = cn->count[DP_RES_WHOLE], units = units_of(cn), core = cn->count[DP_RES_CORE];
    int64_t k = whole > 0 ? whole : cn->gpu_count;
    const char *ann = KGPU_ANN_ASSIGNMENT;
    if (p->exclusive != (whole > 0))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s: annotation %s gives container %s %s, but it asks %s: "
                              "refusing an assignment that does not match the pod's requests",
                              v->ns, v->name, ann, cn->name,
                              p->exclusive ? "whole GPUs (exclusive)" : "shares of GPUs",
                              whole > 0 ? "whole GPUs (" KGPU_RES_WHOLE ")" : "no whole GPU");
    if (p->ngpus == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "pod %s/%s: annotation %s gives container %s no GPU",
                              v->ns, v->name, ann, cn->name);
    if (p->ngpus != k)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s: annotation %s gives container %s %d GPU(s), but it asks "
                              "%" PRId64 ": refusing an assignment larger than the pod's requests",
                              v->ns, v->name, ann, cn->name, p->ngpus, k);
    for (int i = 0; i < p->ngpus; i++)
        for (int j = i + 1; j < p->ngpus; j++)
            if (strcmp(p->gpus[i].uuid, p->gpus[j].uuid) == 0)
                return kgpu_error_set(err, KGPU_EINVAL,
                                      "pod %s/%s: annotation %s names GPU %s twice for container "
                                      "%s",
                                      v->ns, v->name, ann, p->gpus[i].uuid, cn->name);
    if (p->exclusive)
        return 0; /* whole GPUs: all of each, as asked */
    int64_t mem = 0, want;
    for (int g = 0; g < p->ngpus; g++)
        if (__builtin_add_overflow(mem, p->gpus[g].memory_mib, &mem))
            mem = INT64_MAX;
    if (__builtin_mul_overflow(units, unit_mib, &want) || core > 100)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s container %s: %s %" PRId64 " or %s %" PRId64
                              " is out of range",
                              v->ns, v->name, cn->name, KGPU_RES_MEM, units, KGPU_RES_CORE, core);
    if (mem != want)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s container %s asks %" PRId64 " units of %" PRId64
                              " MiB but its assignment gives %" PRId64
                              " MiB: refusing it (written by hand, or do the extender and the "
                              "device plugin not use the same memory unit?)",
                              v->ns, v->name, cn->name, units, unit_mib, mem);
    for (int g = 0; g < p->ngpus; g++) {
        if (p->gpus[g].memory_mib != mem / k)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "pod %s/%s: annotation %s gives container %s %" PRId64
                                  " MiB on GPU %s, not its even share of %" PRId64 " MiB",
                                  v->ns, v->name, ann, cn->name, p->gpus[g].memory_mib,
                                  p->gpus[g].uuid, mem / k);
        /* milli 0 is no compute limit at all: only for a container that asks no gpu-core. */
        if (p->gpus[g].milli != core * 10)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "pod %s/%s: annotation %s gives container %s %d/1000 of GPU %s's "
                                  "compute (0 = unlimited), but it asks %s %" PRId64
                                  ": refusing an assignment larger than the pod's requests",
                                  v->ns, v->name, ann, cn->name, p->gpus[g].milli,
                                  p->gpus[g].uuid, KGPU_RES_CORE, core);
    }
    return 0;
}

/* The app container named `name`, or NULL. */
static const container_need *app_container(const pod_view *v, const char *name)
{
    for (int c = 0; c < v->ncontainers; c++)
        if (!v->c[c].init && strcmp(v->c[c].name, name) == 0)
            return &v->c[c];
    return NULL;
}

/* The GPUs of the matched container from the assignment. */
static int fill_gpus(const pod_view *v, const container_need *cn, int64_t unit_mib, dp_match *out,
                     kgpu_error *err)
{
    kgpu_assigned_part parts[KGPU_MAX_PARTS];
    int n = 0;
    kgpu_error pe = {0};
    if (kgpu_assignment_parse(v->assignment, parts, KGPU_MAX_PARTS, &n, &pe) != 0)
        return kgpu_error_set(err, KGPU_EPARSE, "pod %s/%s: annotation %s: %s", v->ns, v->name,
                              KGPU_ANN_ASSIGNMENT, pe.msg);
    int64_t whole = cn->count[DP_RES_WHOLE];
    int64_t units = units_of(cn);
    for (int i = 0; i < n; i++) {
        if (strcmp(parts[i].container, cn->name) != 0)
            continue;
        const kgpu_assigned_part *p = &parts[i];
        int rc = within_request(v, cn, p, unit_mib, err);
        if (rc != 0)
            return rc;
        out->exclusive = p->exclusive;
        out->t.ngpus = p->ngpus;
        for (int g = 0; g < p->ngpus; g++) {
            out->t.gpus[g].index = p->gpus[g].index;
            snprintf(out->t.gpus[g].uuid, sizeof(out->t.gpus[g].uuid), "%s", p->gpus[g].uuid);
            out->t.gpus[g].milli = p->gpus[g].milli;
            out->t.gpus[g].memory_mib = p->gpus[g].memory_mib;
        }
        return 0;
    }
    if (!cn->init)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s: annotation %s has no entry for container %s", v->ns,
                              v->name, KGPU_ANN_ASSIGNMENT, cn->name);
    /*
     * An init container the extender folded into an app container (it runs
     * alone, before them): it gets the first GPUs of the first app part
     * large enough to hold it, with its own amounts. That part must be
     * within its own container's requests: the init container is served
     * first, and would otherwise take whole GPUs the pod never asked for.
     */
    int64_t k = whole > 0 ? whole : cn->gpu_count, total;
    if (k > KGPU_MAX_GPUS_PER_NODE || __builtin_mul_overflow(units, unit_mib, &total) ||
        cn->count[DP_RES_CORE] > 100)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s init container %s asks more than a node can have", v->ns,
                              v->name, cn->name);
    int64_t mem_each = total / k;
    int milli_each = (int)(cn->count[DP_RES_CORE] * 10);
    for (int i = 0; i < n; i++) {
        const kgpu_assigned_part *p = &parts[i];
        const container_need *app = app_container(v, p->container);
        if (app == NULL || p->exclusive != (whole > 0) || p->ngpus < k)
            continue;
        bool fits = true;
        for (int g = 0; g < k; g++)
            fits &= p->gpus[g].memory_mib >= mem_each && p->gpus[g].milli >= milli_each;
        if (!fits)
            continue;
        int rc = within_request(v, app, p, unit_mib, err);
        if (rc != 0)
            return rc;
        out->exclusive = p->exclusive;
        out->t.ngpus = (int)k;
        for (int g = 0; g < k; g++) {
            out->t.gpus[g].index = p->gpus[g].index;
            snprintf(out->t.gpus[g].uuid, sizeof(out->t.gpus[g].uuid), "%s", p->gpus[g].uuid);
            out->t.gpus[g].milli = p->exclusive ? p->gpus[g].milli : milli_each;
            out->t.gpus[g].memory_mib = p->exclusive ? p->gpus[g].memory_mib : mem_each;
        }
        return 0;
    }
    return kgpu_error_set(err, KGPU_EINVAL,
                          "pod %s/%s: annotation %s has no entry that holds init container %s",
                          v->ns, v->name, KGPU_ANN_ASSIGNMENT, cn->name);
}

/*
 * The pod's burst ceiling (kgpu.io/gpu-core-limit, a whole percent 1..100)
 * onto every GPU of the container. The pod's own writer sets it, and it
 * can only lower what the container may take of an idle GPU: the library
 * never lets it below the container's share (contract_limits_text).
 */
static int core_limit(const pod_view *v, dp_match *out, kgpu_error *err)
{
    const char *s = annotation(v->pod, KGPU_ANN_CORE_LIMIT);
    if (s == NULL)
        return 0;
    int pct = 0;
    size_t n = strlen(s);
    bool ok = n >= 1 && n <= 3;
    for (size_t i = 0; ok && i < n; i++) {
        ok = s[i] >= '0' && s[i] <= '9';
        pct = pct * 10 + (s[i] - '0');
    }
    if (!ok || pct < 1 || pct > 100)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s: annotation %s: '%.16s' is not a whole percent 1..100",
                              v->ns, v->name, KGPU_ANN_CORE_LIMIT, s);
    for (int g = 0; g < out->t.ngpus; g++)
        out->t.gpus[g].limit_pct = pct;
    return 0;
}

/* The order in which a container's resources carry its env and mounts. */
static const dp_res primary_order[DP_NRES] = {DP_RES_MEM, DP_RES_ALIAS, DP_RES_CORE, DP_RES_WHOLE};

static void finish(const pod_view *v, int ci, dp_res r, unsigned registered, dp_match *out)
{
    const container_need *cn = &v->c[ci];
    for (int i = 0; i < DP_NRES; i++) {
        dp_res p = primary_order[i];
        if ((registered & (1u << p)) && cn->count[p] > 0) {
            out->primary = p == r;
            break;
        }
    }
    snprintf(out->progress, sizeof(out->progress), "%s%s%s:%s", v->progress,
             *v->progress ? "," : "", cn->name, dp_res_name(r));
    out->complete = true;
    for (int i = 0; i < v->ncontainers; i++)
        for (int q = 0; q < DP_NRES; q++)
            if ((registered & (1u << q)) && v->c[i].count[q] > 0 && !(i == ci && q == (int)r) &&
                !v->c[i].served[q])
                out->complete = false;
    for (int i = 0; i < v->ncontainers; i++)
        if (!v->c[i].init)
            out->t.pod_units += v->c[i].count[DP_RES_MEM] + v->c[i].count[DP_RES_ALIAS];
}

int dp_match_find(const json_t *items, const char *node, dp_res r, int64_t count,
                  unsigned registered, int64_t unit_mib, dp_match *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    if (!json_is_array(items))
        return kgpu_error_set(err, KGPU_EPARSE, "pod list has no items array");
    pod_view *v = calloc(1, sizeof(*v)), *best = calloc(1, sizeof(*best));
    if (v == NULL || best == NULL) {
        free(v);
        free(best);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory matching a pod");
    }
    char found[LIST_MAX] = "", others[LIST_MAX] = "", broken[LIST_MAX] = "";
    int nfound = 0, nbroken = 0, nothers = 0;
    kgpu_error first_broken = {0};
    for (size_t i = 0; i < json_array_size(items); i++) {
        const json_t *pod = json_array_get(items, i);
        const char *on = str_at(pod, "spec", "nodeName");
        const char *ann_node = annotation(pod, KGPU_ANN_NODE);
        if (on == NULL || strcmp(on, node) != 0 || not_awaiting(pod) ||
            annotation(pod, KGPU_ANN_ASSIGNMENT) == NULL ||
            annotation(pod, KGPU_ANN_ALLOCATED) != NULL ||
            (ann_node != NULL && strcmp(ann_node, node) != 0))
            continue;
        kgpu_error pe = {0};
        if (view_pod(pod, r, registered, v, &pe) != 0) {
            /* It may be the pod kubelet is admitting: refuse rather than skip it. */
            if (nbroken++ == 0)
                first_broken = pe;
            append(broken, sizeof(broken), "%s%s", nbroken > 1 ? "; " : "", pe.msg);
            continue;
        }
        if (v->next < 0)
            continue;
        const container_need *cn = &v->c[v->next];
        if (cn->count[r] != count) {
            append(others, sizeof(others), "%s%s/%s %scontainer %s asks %" PRId64,
                   nothers++ ? ", " : "", v->ns, v->name, cn->init ? "init " : "", cn->name,
                   cn->count[r]);
            continue;
        }
        append(found, sizeof(found), "%s%s/%s (%scontainer %s)", nfound ? ", " : "", v->ns, v->name,
               cn->init ? "init " : "", cn->name);
        if (nfound++ == 0) {
            pod_view *t = best;
            best = v;
            v = t;
        }
    }
    int rc = 0;
    if (nbroken > 0) {
        rc = kgpu_error_set(err, first_broken.code ? first_broken.code : KGPU_EPARSE,
                            "cannot tell which pod %" PRId64 " %s devices are for: %s", count,
                            dp_res_name(r), broken);
    } else if (nfound > 1) {
        rc = kgpu_error_set(err, KGPU_EAMBIG,
                            "%" PRId64 " %s devices match %d pods awaiting allocation on node %s: "
                            "%s; refusing to guess (were they bound by something other than "
                            "kgpu-extender?)",
                            count, dp_res_name(r), nfound, node, found);
    } else if (nfound == 0) {
        rc = kgpu_error_set(
            err, KGPU_ENOENT, "no pod bound to node %s awaits %" PRId64 " %s devices%s%s%s", node,
            count, dp_res_name(r), nothers ? " (awaiting: " : "", others, nothers ? ")" : "");
    } else {
        const container_need *cn = &best->c[best->next];
        snprintf(out->t.ns, sizeof(out->t.ns), "%s", best->ns);
        snprintf(out->t.name, sizeof(out->t.name), "%s", best->name);
        snprintf(out->t.uid, sizeof(out->t.uid), "%s", best->uid);
        snprintf(out->t.container, sizeof(out->t.container), "%s", cn->name);
        out->init = cn->init;
        out->count = count;
        rc = fill_gpus(best, cn, unit_mib, out, err);
        if (rc == 0)
            rc = core_limit(best, out, err);
        if (rc == 0)
            finish(best, best->next, r, registered, out);
    }
    free(v);
    free(best);
    return rc;
}
