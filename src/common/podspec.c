/*
 * Reads what a v1 Pod asks of kgpu: per container GPU demand (whole GPUs or
 * a share by memory and compute), the pod's effective CPU and memory as
 * Kubernetes computes them, and the user's annotations. The JSON comes from
 * outside (kube-scheduler), so every member is type-checked and every error
 * names the field it is about.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "podspec.h"

#define MIB        (1024 * 1024)
#define WHO_MAX    (2 * KGPU_NAME_MAX + 32) /* "pod <ns>/<name>", "init container <name>" */
#define SHOWN_MAX  40                       /* characters of a bad value quoted in a message */
#define NUMBER_MAX 24                       /* an int64 in decimal, sign and NUL included */

/* What one container asks for, before it becomes a part. */
typedef struct demand {
    const char *name;  /* borrowed from the JSON */
    int64_t cpu_milli; /* requests, falling back to limits */
    int64_t memory;    /* bytes, likewise */
    bool gpu;          /* has GPU demand: req below is set */
    kgpu_request req;
} demand;

/* Member `key` of object o when present and not null, else NULL. */
static const json_t *member(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int shown(const char *s)
{
    size_t n = strlen(s);
    return n > SHOWN_MAX ? SHOWN_MAX : (int)n;
}

static const char *ellipsis(const char *s)
{
    return strlen(s) > SHOWN_MAX ? "..." : "";
}

/* An optional object member: *out is NULL when absent or null. */
static int opt_object(const json_t *o, const char *key, const char *who, const char *path,
                      const json_t **out, kgpu_error *err)
{
    *out = member(o, key);
    if (*out != NULL && !json_is_object(*out))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s is not an object", who, path);
    return 0;
}

/* An optional string member copied into buf (size cap, so at most cap-1 characters). */
static int opt_string(const json_t *o, const char *key, const char *who, const char *path,
                      char *buf, size_t cap, kgpu_error *err)
{
    const json_t *v = member(o, key);
    buf[0] = '\0';
    if (v == NULL)
        return 0;
    if (!json_is_string(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s is not a string", who, path);
    const char *s = json_string_value(v);
    if (strlen(s) >= cap || strlen(s) != json_string_length(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s '%.*s%s' is longer than %zu characters",
                              who, path, shown(s), s, ellipsis(s), cap - 1);
    memcpy(buf, s, strlen(s) + 1);
    return 0;
}

/*
 * The text of a quantity member: a string, or an integer as Kubernetes also
 * accepts. *text is NULL when the member is absent; `num` holds integers.
 */
static int quantity_text(const json_t *v, const char *who, const char *path, char num[NUMBER_MAX],
                         const char **text, kgpu_error *err)
{
    *text = NULL;
    if (v == NULL)
        return 0;
    if (json_is_integer(v)) {
        snprintf(num, NUMBER_MAX, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        *text = num;
        return 0;
    }
    if (!json_is_string(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s is not a string", who, path);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s contains a NUL byte", who, path);
    *text = json_string_value(v);
    return 0;
}

/*
 * Reads resource `key`: from object `first` (at path `first_path`), else from
 * `second`. *text is the quantity as written (NULL when neither has it; it
 * may point into `num`); milli and whole units go to *milli / *value (either
 * may be NULL), 0 when absent.
 */
static int read_resource(const json_t *first, const char *first_path, const json_t *second,
                         const char *second_path, const char *key, const char *who,
                         char num[NUMBER_MAX], const char **text, int64_t *milli, int64_t *value,
                         kgpu_error *err)
{
    const json_t *v = member(first, key);
    const char *from = first_path;
    if (v == NULL) {
        v = member(second, key);
        from = second_path;
    }
    char path[160];
    snprintf(path, sizeof(path), "%s.%s", from, key);
    if (milli != NULL)
        *milli = 0;
    if (value != NULL)
        *value = 0;
    int rc = quantity_text(v, who, path, num, text, err);
    if (rc != 0 || *text == NULL)
        return rc;
    kgpu_error qe;
    kgpu_error_clear(&qe);
    if (milli != NULL && (rc = kgpu_quantity_milli(*text, milli, &qe)) != 0)
        return kgpu_error_set(err, rc, "%s: %s: %s", who, path, qe.msg);
    if (value != NULL && (rc = kgpu_quantity_value(*text, value, &qe)) != 0)
        return kgpu_error_set(err, rc, "%s: %s: %s", who, path, qe.msg);
    return 0;
}

/* A countable extended resource (GPUs, units, percent): limits first, then requests. */
static int read_count(const json_t *limits, const json_t *requests, const char *key,
                      const char *who, int64_t *out, kgpu_error *err)
{
    char num[NUMBER_MAX];
    const char *text;
    int64_t milli;
    int rc = read_resource(limits, "resources.limits", requests, "resources.requests", key, who,
                           num, &text, &milli, NULL, err);
    *out = 0;
    if (rc != 0 || text == NULL)
        return rc;
    if (milli % KGPU_MILLI != 0)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: %s '%.*s%s' is not a whole number", who, key,
                              shown(text), text, ellipsis(text));
    *out = milli / KGPU_MILLI;
    return 0;
}

/* Turns a container's extended resources into GPU demand (d->gpu, d->req). */
/* Any kgpu.io/ resource kgpu does not know: a typo must not schedule the pod without its GPU. */
static int unknown_resources(const json_t *list, const char *where, const char *who,
                             kgpu_error *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)list, key, v)
    {
        if (strncmp(key, "kgpu.io/", 8) == 0 && strcmp(key, KGPU_RES_MEM) != 0 &&
            strcmp(key, KGPU_RES_CORE) != 0 && strcmp(key, KGPU_RES_COUNT) != 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "%s: unknown resource %.100s in %s (kgpu knows %s, %s, %s)", who,
                                  key, where, KGPU_RES_MEM, KGPU_RES_CORE, KGPU_RES_COUNT);
    }
    return 0;
}

static int gpu_demand(const json_t *limits, const json_t *requests, const char *who,
                      int64_t unit_mib, demand *d, kgpu_error *err)
{
    int64_t whole, mem, alias, core, count;
    int rc;
    if ((rc = unknown_resources(limits, "resources.limits", who, err)) != 0 ||
        (rc = unknown_resources(requests, "resources.requests", who, err)) != 0)
        return rc;
    if ((rc = read_count(limits, requests, KGPU_RES_WHOLE, who, &whole, err)) != 0 ||
        (rc = read_count(limits, requests, KGPU_RES_MEM, who, &mem, err)) != 0 ||
        (rc = read_count(limits, requests, KGPU_RES_MEM_ALIAS, who, &alias, err)) != 0 ||
        (rc = read_count(limits, requests, KGPU_RES_CORE, who, &core, err)) != 0 ||
        (rc = read_count(limits, requests, KGPU_RES_COUNT, who, &count, err)) != 0)
        return rc;
    /* A zero quantity is the same as leaving the resource out, as for any Kubernetes resource. */
    const char *mem_name = mem > 0 ? KGPU_RES_MEM : KGPU_RES_MEM_ALIAS;
    if (mem > 0 && alias > 0 && mem != alias)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: %s %" PRId64 " and %s %" PRId64 " differ", who,
                              KGPU_RES_MEM, mem, KGPU_RES_MEM_ALIAS, alias);
    if (mem == 0)
        mem = alias;
    d->gpu = false;
    memset(&d->req, 0, sizeof(d->req));
    d->req.shape = -1;
    if (whole > 0) {
        if (mem > 0 || core > 0 || count > 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "%s: %s cannot be combined with %s, %s or %s in one container",
                                  who, KGPU_RES_WHOLE, KGPU_RES_MEM, KGPU_RES_CORE, KGPU_RES_COUNT);
        if (whole > KGPU_MAX_GPUS_PER_NODE)
            return kgpu_error_set(err, KGPU_ERANGE, "%s: %s %" PRId64 " outside 1..%d", who,
                                  KGPU_RES_WHOLE, whole, KGPU_MAX_GPUS_PER_NODE);
        d->gpu = true;
        d->req.gpu_count = (int)whole;
        d->req.gpu_milli = KGPU_MILLI;
        d->req.exclusive = true;
        return 0;
    }
    if (mem == 0 && core == 0) {
        if (count > 0)
            return kgpu_error_set(err, KGPU_EINVAL, "%s: %s without %s or %s", who, KGPU_RES_COUNT,
                                  KGPU_RES_MEM, KGPU_RES_CORE);
        return 0;
    }
    if (core > 100)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: %s %" PRId64 " outside 1..100", who,
                              KGPU_RES_CORE, core);
    if (count > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: %s %" PRId64 " outside 1..%d", who,
                              KGPU_RES_COUNT, count, KGPU_MAX_GPUS_PER_NODE);
    int k = count > 0 ? (int)count : 1;
    int64_t total;
    if (__builtin_mul_overflow(mem, unit_mib, &total))
        return kgpu_error_set(err, KGPU_ERANGE,
                              "%s: %s %" PRId64 " units of %" PRId64 " MiB overflows", who,
                              mem_name, mem, unit_mib);
    if (total % k != 0)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "%s: %s %" PRId64 " (%" PRId64 " MiB) does not divide evenly over %s"
                              " %d",
                              who, mem_name, mem, total, KGPU_RES_COUNT, k);
    d->gpu = true;
    d->req.gpu_count = k;
    d->req.gpu_memory_mib = total / k;
    d->req.gpu_milli = (int)core * (KGPU_MILLI / 100);
    return 0;
}

/* Reads one container (element i of spec.containers or spec.initContainers). */
static int read_container(const json_t *c, const char *pod_who, const char *list, size_t i,
                          bool init, int64_t unit_mib, demand *d, kgpu_error *err)
{
    memset(d, 0, sizeof(*d));
    if (!json_is_object(c))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: spec.%s[%zu] is not an object", pod_who, list,
                              i);
    const json_t *name = member(c, "name");
    if (!json_is_string(name) || json_string_length(name) == 0)
        return kgpu_error_set(err, KGPU_EPARSE, "%s: spec.%s[%zu].name missing or not a string",
                              pod_who, list, i);
    d->name = json_string_value(name);
    /* Container names are DNS labels: 63 characters at most. */
    if (strlen(d->name) > 63 || strlen(d->name) != json_string_length(name))
        return kgpu_error_set(err, KGPU_EPARSE,
                              "%s: spec.%s[%zu].name '%.*s%s' is not a valid name", pod_who, list,
                              i, shown(d->name), d->name, ellipsis(d->name));
    char who[WHO_MAX];
    snprintf(who, sizeof(who), "%scontainer %s", init ? "init " : "", d->name);

    const json_t *res, *limits = NULL, *requests = NULL;
    int rc;
    if ((rc = opt_object(c, "resources", who, "resources", &res, err)) != 0)
        return rc;
    if (res != NULL &&
        ((rc = opt_object(res, "limits", who, "resources.limits", &limits, err)) != 0 ||
         (rc = opt_object(res, "requests", who, "resources.requests", &requests, err)) != 0))
        return rc;
    /* The API server defaults a missing request to the limit. */
    char num[NUMBER_MAX];
    const char *text;
    if ((rc = read_resource(requests, "resources.requests", limits, "resources.limits", "cpu", who,
                            num, &text, &d->cpu_milli, NULL, err)) != 0 ||
        (rc = read_resource(requests, "resources.requests", limits, "resources.limits", "memory",
                            who, num, &text, NULL, &d->memory, err)) != 0)
        return rc;
    return gpu_demand(limits, requests, who, unit_mib, d, err);
}

/* Splits a comma-separated glob list into buf/ptrs; empty items are skipped. */
static int parse_globs(const char *text, const char *key, const char *who,
                       char (*buf)[KGPU_GLOB_MAX], const char **ptrs, int *n, kgpu_error *err)
{
    *n = 0;
    const char *p = text;
    for (;;) {
        const char *end = strchr(p, ',');
        if (end == NULL)
            end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t' || *a == '\n' || *a == '\r'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t' || b[-1] == '\n' || b[-1] == '\r'))
            b--;
        size_t len = (size_t)(b - a);
        if (len > 0) {
            if (len >= KGPU_GLOB_MAX)
                return kgpu_error_set(err, KGPU_EINVAL,
                                      "%s: %s pattern '%.*s...' is longer than %d characters", who,
                                      key, SHOWN_MAX, a, KGPU_GLOB_MAX - 1);
            if (*n >= KGPU_MAX_GLOBS)
                return kgpu_error_set(err, KGPU_EINVAL, "%s: %s has more than %d patterns", who,
                                      key, KGPU_MAX_GLOBS);
            memcpy(buf[*n], a, len);
            buf[*n][len] = '\0';
            ptrs[*n] = buf[*n];
            (*n)++;
        }
        if (*end == '\0')
            return 0;
        p = end + 1;
    }
}

/* The user's annotations: policy, model globs, whether an assignment is already there. */
static int read_annotations(const json_t *metadata, const char *who, kgpu_pod *out, kgpu_error *err)
{
    const json_t *ann;
    int rc = opt_object(metadata, "annotations", who, "metadata.annotations", &ann, err);
    if (rc != 0 || ann == NULL)
        return rc;
    const char *keys[] = {KGPU_ANN_TYPE, KGPU_ANN_TYPE_EXCL, KGPU_ANN_ASSIGNMENT};
    const char *text[3];
    for (int i = 0; i < 3; i++) {
        const json_t *v = member(ann, keys[i]);
        text[i] = NULL;
        if (v == NULL)
            continue;
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
            return kgpu_error_set(err, KGPU_EPARSE, "%s: annotation %s is not a string", who,
                                  keys[i]);
        text[i] = json_string_value(v);
    }
    char path[64];
    snprintf(path, sizeof(path), "annotation %s", KGPU_ANN_POLICY);
    if ((rc = opt_string(ann, KGPU_ANN_POLICY, who, path, out->policy, sizeof(out->policy), err)) !=
        0)
        return rc;
    if (text[0] != NULL && (rc = parse_globs(text[0], KGPU_ANN_TYPE, who, out->allow_buf,
                                             out->allow, &out->nallow, err)) != 0)
        return rc;
    if (text[1] != NULL && (rc = parse_globs(text[1], KGPU_ANN_TYPE_EXCL, who, out->exclude_buf,
                                             out->exclude, &out->nexclude, err)) != 0)
        return rc;
    out->has_assignment = text[2] != NULL;
    /* Only the exact "true" opts in: a pod is never moved on a typo. */
    const json_t *r = member(ann, KGPU_ANN_RESTARTABLE);
    out->restartable = json_is_string(r) && strcmp(json_string_value(r), "true") == 0 &&
                       json_string_length(r) == 4;
    return 0;
}

/* Adds a part for a container with GPU demand. */
static int add_part(kgpu_pod *out, const char *who, const demand *d, bool init, kgpu_error *err)
{
    if (out->nparts >= KGPU_MAX_PARTS)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: more than %d containers use GPUs", who,
                              KGPU_MAX_PARTS);
    kgpu_part *p = &out->parts[out->nparts++];
    snprintf(p->container, sizeof(p->container), "%.63s", d->name);
    p->init = init;
    p->req = d->req;
    p->req.cpu_milli = 0;
    p->req.memory_mib = 0;
    p->req.allow = out->allow;
    p->req.nallow = out->nallow;
    p->req.exclude = out->exclude;
    p->req.nexclude = out->nexclude;
    p->req.shape = -1;
    p->req.models = 0;
    return 0;
}

/*
 * An init container runs alone before the app containers and Kubernetes
 * counts max(its demand, the app containers'), so an app part at least as
 * large (same kind, as many GPUs, as much per GPU) will hold it.
 */
static bool covered(const kgpu_pod *out, int napp, const kgpu_request *r)
{
    for (int i = 0; i < napp; i++) {
        const kgpu_request *a = &out->parts[i].req;
        if (a->exclusive == r->exclusive && a->gpu_count >= r->gpu_count &&
            a->gpu_milli >= r->gpu_milli && a->gpu_memory_mib >= r->gpu_memory_mib)
            return true;
    }
    return false;
}

static int add_checked(int64_t *sum, int64_t v, const char *who, const char *what, kgpu_error *err)
{
    if (__builtin_add_overflow(*sum, v, sum))
        return kgpu_error_set(err, KGPU_ERANGE, "%s: %s requests overflow", who, what);
    return 0;
}

/* Reads the containers of one list; app containers' sums or init containers' maxima. */
static int read_list(const json_t *spec, const char *list, bool init, const char *who,
                     int64_t unit_mib, kgpu_pod *out, int napp, int64_t *cpu, int64_t *mem,
                     kgpu_error *err)
{
    const json_t *arr = member(spec, list);
    if (arr == NULL && init)
        return 0;
    if (!json_is_array(arr))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: spec.%s is not an array", who, list);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        demand d;
        int rc = read_container(json_array_get(arr, i), who, list, i, init, unit_mib, &d, err);
        if (rc != 0)
            return rc;
        if (init) {
            *cpu = d.cpu_milli > *cpu ? d.cpu_milli : *cpu;
            *mem = d.memory > *mem ? d.memory : *mem;
        } else if ((rc = add_checked(cpu, d.cpu_milli, who, "CPU", err)) != 0 ||
                   (rc = add_checked(mem, d.memory, who, "memory", err)) != 0) {
            return rc;
        }
        if (d.gpu && !(init && covered(out, napp, &d.req)) &&
            (rc = add_part(out, who, &d, init, err)) != 0)
            return rc;
    }
    return 0;
}

int kgpu_pod_from_json(const json_t *pod, int64_t memory_unit_mib, kgpu_pod *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    for (int i = 0; i < KGPU_MAX_GLOBS; i++) {
        out->allow[i] = out->allow_buf[i];
        out->exclude[i] = out->exclude_buf[i];
    }
    if (memory_unit_mib <= 0)
        return kgpu_error_set(err, KGPU_EINVAL, "GPU memory unit %" PRId64 " MiB is not positive",
                              memory_unit_mib);
    if (!json_is_object(pod))
        return kgpu_error_set(err, KGPU_EPARSE, "pod: not a JSON object");
    const json_t *metadata = member(pod, "metadata");
    if (!json_is_object(metadata))
        return kgpu_error_set(err, KGPU_EPARSE, "pod: metadata missing or not an object");
    int rc;
    if ((rc = opt_string(metadata, "name", "pod", "metadata.name", out->name, sizeof(out->name),
                         err)) != 0 ||
        (rc = opt_string(metadata, "namespace", "pod", "metadata.namespace", out->ns,
                         sizeof(out->ns), err)) != 0)
        return rc;
    if (out->name[0] == '\0')
        return kgpu_error_set(err, KGPU_EPARSE, "pod: metadata.name missing or empty");
    if (out->ns[0] == '\0')
        strcpy(out->ns, "default");
    char who[WHO_MAX];
    snprintf(who, sizeof(who), "pod %s/%s", out->ns, out->name);
    if ((rc = opt_string(metadata, "uid", who, "metadata.uid", out->uid, sizeof(out->uid), err)) !=
            0 ||
        (rc = read_annotations(metadata, who, out, err)) != 0)
        return rc;
    out->terminal = member(metadata, "deletionTimestamp") != NULL;

    const json_t *status, *spec = member(pod, "spec");
    if (!json_is_object(spec))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: spec missing or not an object", who);
    if ((rc = opt_string(spec, "nodeName", who, "spec.nodeName", out->node, sizeof(out->node),
                         err)) != 0 ||
        (rc = opt_object(pod, "status", who, "status", &status, err)) != 0)
        return rc;
    if (status != NULL && (rc = opt_string(status, "phase", who, "status.phase", out->phase,
                                           sizeof(out->phase), err)) != 0)
        return rc;
    if (strcmp(out->phase, "Succeeded") == 0 || strcmp(out->phase, "Failed") == 0)
        out->terminal = true;

    int64_t app_cpu = 0, app_mem = 0, init_cpu = 0, init_mem = 0;
    if ((rc = read_list(spec, "containers", false, who, memory_unit_mib, out, 0, &app_cpu, &app_mem,
                        err)) != 0)
        return rc;
    int napp = out->nparts;
    if ((rc = read_list(spec, "initContainers", true, who, memory_unit_mib, out, napp, &init_cpu,
                        &init_mem, err)) != 0)
        return rc;

    int64_t cpu = app_cpu > init_cpu ? app_cpu : init_cpu;
    int64_t mem = app_mem > init_mem ? app_mem : init_mem;
    const json_t *overhead;
    if ((rc = opt_object(spec, "overhead", who, "spec.overhead", &overhead, err)) != 0)
        return rc;
    if (overhead != NULL) {
        char num[NUMBER_MAX];
        const char *text;
        int64_t ocpu, omem;
        if ((rc = read_resource(overhead, "spec.overhead", NULL, "spec.overhead", "cpu", who, num,
                                &text, &ocpu, NULL, err)) != 0 ||
            (rc = read_resource(overhead, "spec.overhead", NULL, "spec.overhead", "memory", who,
                                num, &text, NULL, &omem, err)) != 0 ||
            (rc = add_checked(&cpu, ocpu, who, "CPU", err)) != 0 ||
            (rc = add_checked(&mem, omem, who, "memory", err)) != 0)
            return rc;
    }
    out->cpu_milli = cpu;
    out->memory_mib = mem / MIB + (mem % MIB != 0);
    if (out->nparts > 0) {
        out->parts[0].req.cpu_milli = out->cpu_milli;
        out->parts[0].req.memory_mib = out->memory_mib;
    }
    return 0;
}

/* Deletes every member of object o whose key is not in the NULL-ended `keep`. */
static void keep_only(json_t *o, const char *const *keep)
{
    const char *key;
    void *tmp;
    json_t *v;
    json_object_foreach_safe(o, tmp, key, v)
    {
        bool kept = false;
        for (const char *const *k = keep; *k != NULL && !kept; k++)
            kept = strcmp(key, *k) == 0;
        if (!kept)
            json_object_del(o, key);
    }
}

static void trim_containers(json_t *list)
{
    static const char *const keep[] = {"name", "resources", "restartPolicy", NULL};
    size_t i;
    json_t *c;
    json_array_foreach(list, i, c) keep_only(c, keep);
}

void kgpu_pod_json_trim(json_t *pod)
{
    static const char *const pod_keep[] = {"metadata", "spec", "status", NULL};
    static const char *const meta_keep[] = {"name",        "namespace", "uid", "deletionTimestamp",
                                            "annotations", NULL};
    static const char *const spec_keep[] = {"nodeName", "overhead", "containers", "initContainers",
                                            NULL};
    static const char *const status_keep[] = {"phase", NULL};
    if (!json_is_object(pod))
        return;
    keep_only(pod, pod_keep);
    json_t *meta = json_object_get(pod, "metadata");
    keep_only(meta, meta_keep);
    /* The annotations kgpu reads, not every kgpu.io/ one: a tenant may add any
     * number of its own, of any size, which would otherwise be kept. */
    static const char *const ann_keep[] = {
        KGPU_ANN_TYPE,      KGPU_ANN_TYPE_EXCL, KGPU_ANN_POLICY,    KGPU_ANN_ASSIGNMENT,
        KGPU_ANN_NODE,      KGPU_ANN_BIND_TIME, KGPU_ANN_ALLOCATED, KGPU_ANN_RESTARTABLE,
        NULL};
    keep_only(json_object_get(meta, "annotations"), ann_keep);
    json_t *spec = json_object_get(pod, "spec");
    keep_only(spec, spec_keep);
    trim_containers(json_object_get(spec, "containers"));
    trim_containers(json_object_get(spec, "initContainers"));
    keep_only(json_object_get(pod, "status"), status_keep);
}

int kgpu_pod_from_template(const json_t *tmpl, int64_t memory_unit_mib, kgpu_pod *out,
                           kgpu_error *err)
{
    const json_t *meta = json_object_get(tmpl, "metadata");
    if (!json_is_object(tmpl) || json_is_string(json_object_get(meta, "name")))
        return kgpu_pod_from_json(tmpl, memory_unit_mib, out, err);
    /* Shallow copies: only the name is added, at the top of metadata. */
    json_t *pod = json_copy((json_t *)tmpl);
    json_t *named = json_is_object(meta) ? json_copy((json_t *)meta) : json_object();
    int rc;
    if (pod == NULL || named == NULL ||
        json_object_set_new(named, "name", json_string("template")) != 0 ||
        json_object_set(pod, "metadata", named) != 0) {
        memset(out, 0, sizeof(*out));
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    } else {
        rc = kgpu_pod_from_json(pod, memory_unit_mib, out, err);
    }
    json_decref(named);
    json_decref(pod);
    return rc;
}
