/*
 * The watcher's two parsers of outside input, pure so that they are fuzzed
 * (tests/fuzz/fuzz_watchconfig.c, fuzz_cgroup.c): its config file, written
 * by the operator, and /proc/<pid>/cgroup, written by the kernel from paths
 * that kubelet and the container runtime chose. Neither trusts its input's
 * size or shape.
 */
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kgpu/queue.h"
#include "watcher.h"
#include "yamljson.h"

/* ---- the config file ---- */

void dp_watch_config_defaults(dp_watch_config *c)
{
    memset(c, 0, sizeof(*c));
    c->interval_s = 5;
    c->enforce = DP_ENFORCE_NONE;
    c->memory_slack_mib = 0;
    c->core_slack_pct = 10;
    c->core_grace_scans = 3;
    c->events = true;
    snprintf(c->proc_root, sizeof(c->proc_root), "/proc");
}

/* An integer member in [lo, hi]; absent leaves *out. */
static int get_int(json_t *doc, const char *key, const char *name, long long lo, long long hi,
                   long long *out, kgpu_error *err)
{
    json_t *v = json_object_get(doc, key);
    if (v == NULL)
        return KGPU_OK;
    if (!json_is_integer(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s: expected a whole number", name, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: %s: %lld is outside %lld..%lld", name, key, x,
                              lo, hi);
    *out = x;
    return KGPU_OK;
}

static int get_string(json_t *doc, const char *key, const char *name, char *out, size_t cap,
                      kgpu_error *err)
{
    json_t *v = json_object_get(doc, key);
    if (v == NULL)
        return KGPU_OK;
    if (!json_is_string(v))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: %s: expected a string", name, key);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n >= cap || strlen(s) != n)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: %s: longer than %zu bytes or holds a NUL",
                              name, key, cap - 1);
    memcpy(out, s, n + 1);
    return KGPU_OK;
}

/* exemptNamespaces: a list of namespace names (DNS labels). */
static int get_exempt(json_t *doc, const char *name, dp_watch_config *c, kgpu_error *err)
{
    json_t *v = json_object_get(doc, "exemptNamespaces");
    if (v == NULL || json_is_null(v))
        return KGPU_OK;
    if (!json_is_array(v) || json_array_size(v) > DP_WATCH_EXEMPT_MAX)
        return kgpu_error_set(err, KGPU_EPARSE,
                              "%s: exemptNamespaces: expected a list of at most %d namespaces",
                              name, DP_WATCH_EXEMPT_MAX);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *ns = json_string_value(json_array_get(v, i));
        size_t n = ns != NULL ? strlen(ns) : 0;
        bool ok = kgpu_namespace_name_valid(ns) && n < sizeof(c->exempt[0]) &&
                  n == json_string_length(json_array_get(v, i));
        if (!ok)
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "%s: exemptNamespaces[%zu]: expected a namespace name (a DNS "
                                  "label)",
                                  name, i);
        memcpy(c->exempt[c->nexempt++], ns, n + 1);
    }
    return KGPU_OK;
}

static int from_doc(json_t *doc, const char *name, dp_watch_config *c, kgpu_error *err)
{
    static const char *const keys[] = {"intervalSeconds", "enforce",        "memorySlackMiB",
                                       "coreSlackPercent", "coreGraceScans", "events",
                                       "metricsListen",    "procRoot",       "exemptNamespaces"};
    if (json_is_null(doc))
        return KGPU_OK; /* an empty file: every default */
    if (!json_is_object(doc))
        return kgpu_error_set(err, KGPU_EPARSE, "%s: expected a mapping of settings", name);
    const char *key;
    json_t *v;
    json_object_foreach(doc, key, v)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]) && !known; i++)
            known = strcmp(key, keys[i]) == 0;
        if (!known)
            return kgpu_error_set(err, KGPU_EPARSE, "%s: unknown setting '%.80s'", name, key);
    }
    if ((v = json_object_get(doc, "intervalSeconds")) != NULL) {
        double s = json_number_value(v);
        if (!json_is_number(v) || !isfinite(s) || s < 0.1 || s > 3600)
            return kgpu_error_set(err, KGPU_ERANGE,
                                  "%s: intervalSeconds: expected a number of seconds from 0.1 to "
                                  "3600",
                                  name);
        c->interval_s = s;
    }
    if ((v = json_object_get(doc, "enforce")) != NULL) {
        const char *s = json_string_value(v);
        if (s != NULL && strcmp(s, "none") == 0)
            c->enforce = DP_ENFORCE_NONE;
        else if (s != NULL && strcmp(s, "kill") == 0)
            c->enforce = DP_ENFORCE_KILL;
        else
            return kgpu_error_set(err, KGPU_EPARSE, "%s: enforce: expected none or kill", name);
    }
    if ((v = json_object_get(doc, "events")) != NULL) {
        if (!json_is_boolean(v))
            return kgpu_error_set(err, KGPU_EPARSE, "%s: events: expected true or false", name);
        c->events = json_is_true(v);
    }
    long long x;
    int rc;
    x = c->memory_slack_mib;
    if ((rc = get_int(doc, "memorySlackMiB", name, 0, 1LL << 30, &x, err)) != KGPU_OK)
        return rc;
    c->memory_slack_mib = x;
    x = c->core_slack_pct;
    if ((rc = get_int(doc, "coreSlackPercent", name, 0, 100, &x, err)) != KGPU_OK)
        return rc;
    c->core_slack_pct = (int)x;
    x = c->core_grace_scans;
    if ((rc = get_int(doc, "coreGraceScans", name, 1, 1000, &x, err)) != KGPU_OK)
        return rc;
    c->core_grace_scans = (int)x;
    if ((rc = get_string(doc, "metricsListen", name, c->listen, sizeof(c->listen), err)) !=
        KGPU_OK)
        return rc;
    if ((rc = get_string(doc, "procRoot", name, c->proc_root, sizeof(c->proc_root), err)) !=
        KGPU_OK)
        return rc;
    if (c->proc_root[0] != '/')
        return kgpu_error_set(err, KGPU_EINVAL, "%s: procRoot: expected an absolute path", name);
    return get_exempt(doc, name, c, err);
}

int dp_watch_config_parse(const char *buf, size_t len, const char *name, dp_watch_config *c,
                          kgpu_error *err)
{
    dp_watch_config_defaults(c);
    json_t *doc = kgpu_yaml_load(buf, len, name, err);
    if (doc == NULL) {
        /* An empty document loads as nothing; that is the defaults, not an error. */
        bool blank = true;
        for (size_t i = 0; i < len && blank; i++)
            blank = isspace((unsigned char)buf[i]) != 0;
        if (blank && len < 4096) {
            kgpu_error_clear(err);
            return KGPU_OK;
        }
        return err != NULL && err->code != 0 ? err->code : KGPU_EPARSE;
    }
    int rc = from_doc(doc, name, c, err);
    json_decref(doc);
    if (rc != KGPU_OK)
        dp_watch_config_defaults(c);
    return rc;
}

int dp_watch_config_load(const char *path, dp_watch_config *c, kgpu_error *err)
{
    dp_watch_config_defaults(c);
    json_t *doc = kgpu_yaml_load_file(path, err);
    if (doc == NULL)
        return err != NULL && err->code != 0 ? err->code : KGPU_EPARSE;
    int rc = from_doc(doc, path, c, err);
    json_decref(doc);
    if (rc != KGPU_OK)
        dp_watch_config_defaults(c);
    return rc;
}

/* ---- /proc/<pid>/cgroup ---- */

static bool is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/*
 * A pod UID at s[0..n): 8-4-4-4-12 hex digits separated by '-' (cgroupfs
 * driver) or '_' (systemd driver, which reserves '-'), or the 32 hex digits
 * kubelet gives static pods. Written to out normalised (lower case, '-').
 */
static bool pod_uid_at(const char *s, size_t n, char *out)
{
    if (n == 32) {
        for (size_t i = 0; i < 32; i++)
            if (!is_hex(s[i]))
                return false;
        for (size_t i = 0; i < 32; i++)
            out[i] = (char)tolower((unsigned char)s[i]);
        out[32] = '\0';
        return true;
    }
    if (n != 36)
        return false;
    for (size_t i = 0; i < 36; i++) {
        bool sep = i == 8 || i == 13 || i == 18 || i == 23;
        if (sep ? (s[i] != '-' && s[i] != '_') : !is_hex(s[i]))
            return false;
        out[i] = sep ? '-' : (char)tolower((unsigned char)s[i]);
    }
    out[36] = '\0';
    return true;
}

/*
 * The pod segment of a path: "pod<uid>" (cgroupfs) or
 * "kubepods[-<qos>]-pod<uid>.slice" (systemd).
 */
static bool pod_segment(const char *seg, size_t n, char *uid)
{
    if (n > 6 && memcmp(seg + n - 6, ".slice", 6) == 0)
        n -= 6;
    /* The UID is the segment's tail, right after the last "pod". */
    for (size_t k = n; k-- > 0;) {
        if (k + 3 > n || memcmp(seg + k, "pod", 3) != 0)
            continue;
        bool at_start = k == 0 || seg[k - 1] == '-';
        return at_start && pod_uid_at(seg + k + 3, n - k - 3, uid);
    }
    return false;
}

/*
 * The container segment: 64 hex digits, alone (cgroupfs) or as
 * "<runtime>-<id>.scope" (systemd: cri-containerd-, crio-, docker-). A
 * runtime's helper ("crio-conmon-<id>.scope") is not the container.
 * Returns 1 for a container, 0 for anything else, -1 for conmon.
 */
static int container_segment(const char *seg, size_t n, char *id)
{
    if (n > 6 && memcmp(seg + n - 6, ".scope", 6) == 0)
        n -= 6;
    if (n < 64)
        return 0;
    const char *hex = seg + n - 64;
    for (size_t i = 0; i < 64; i++)
        if (!is_hex(hex[i]))
            return 0;
    size_t prefix = n - 64;
    if (prefix > 0) {
        if (seg[prefix - 1] != '-')
            return 0;
        for (size_t i = 0; i + 1 < prefix; i++)
            if (!((seg[i] >= 'a' && seg[i] <= 'z') || seg[i] == '-'))
                return 0;
        if (prefix >= 7 && memmem(seg, prefix, "conmon", 6) != NULL)
            return -1;
    }
    for (size_t i = 0; i < 64; i++)
        id[i] = (char)tolower((unsigned char)hex[i]);
    id[64] = '\0';
    return 1;
}

/* The pod and container named by one cgroup path; false when it names none. */
static bool from_path(const char *path, size_t n, dp_cgroup_id *id, bool *conmon)
{
    bool have_pod = false;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && path[j] != '/')
            j++;
        const char *seg = path + i;
        size_t len = j - i;
        if (len > 0) {
            char uid[DP_POD_UID_MAX];
            if (pod_segment(seg, len, uid)) {
                /* A pod nested in a pod's path is not how kubelet lays them out. */
                memcpy(id->pod_uid, uid, sizeof(uid));
                have_pod = true;
            } else if (have_pod) {
                int c = container_segment(seg, len, id->container_id);
                if (c < 0)
                    *conmon = true;
                if (c != 0)
                    return c > 0;
            }
        }
        i = j + 1;
    }
    return false;
}

/* dp_cgroup_parse's work; *out may be left half-filled on error. */
static int cgroup_parse(const char *text, size_t len, dp_cgroup_id *out, kgpu_error *err)
{
    bool found = false, any_line = false, conmon = false;
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && text[j] != '\n')
            j++;
        const char *line = text + i;
        size_t n = j - i;
        i = j + 1;
        if (n == 0)
            continue;
        if (memchr(line, '\0', n) != NULL)
            return kgpu_error_set(err, KGPU_EPARSE, "cgroup file holds a NUL byte");
        /* "hierarchy-ID:controller-list:path"; the path may itself hold ':'. */
        const char *c1 = memchr(line, ':', n);
        const char *c2 = c1 != NULL ? memchr(c1 + 1, ':', n - (size_t)(c1 + 1 - line)) : NULL;
        if (c1 == NULL || c2 == NULL || c1 == line)
            return kgpu_error_set(err, KGPU_EPARSE,
                                  "cgroup file line without 'id:controllers:path'");
        for (const char *p = line; p < c1; p++)
            if (*p < '0' || *p > '9')
                return kgpu_error_set(err, KGPU_EPARSE, "cgroup hierarchy ID is not a number");
        const char *path = c2 + 1;
        size_t plen = n - (size_t)(path - line);
        if (plen == 0 || path[0] != '/')
            return kgpu_error_set(err, KGPU_EPARSE, "cgroup path is not absolute");
        any_line = true;
        dp_cgroup_id id;
        memset(&id, 0, sizeof(id));
        if (!from_path(path, plen, &id, &conmon))
            continue;
        /*
         * cgroup v1 lists one path per hierarchy; they agree for a container.
         * Two different containers cannot both be this process's.
         */
        if (found && (strcmp(id.pod_uid, out->pod_uid) != 0 ||
                      strcmp(id.container_id, out->container_id) != 0))
            return kgpu_error_set(err, KGPU_EPARSE, "cgroup file names two different containers");
        *out = id;
        found = true;
    }
    if (!any_line)
        return kgpu_error_set(err, KGPU_EPARSE, "cgroup file is empty");
    if (!found)
        return kgpu_error_set(err, KGPU_ENOENT,
                              conmon ? "a container runtime's monitor, not a container"
                                     : "not in a pod's container");
    return KGPU_OK;
}

int dp_cgroup_parse(const char *text, size_t len, dp_cgroup_id *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    int rc = cgroup_parse(text, len, out, err);
    if (rc != KGPU_OK)
        memset(out, 0, sizeof(*out));
    return rc;
}
