/*
 * Pods awaiting kubelet's Allocate. kubelet's device plugin Allocate call
 * carries device IDs, never the pod: kgpu's device plugin matches it to the
 * one pod on its node that is bound, not yet allocated, and whose next
 * container asks that many devices of that resource. Two such pods asking
 * the same amount would be indistinguishable (earlier systems guessed by
 * amount and time, and gave pods each other's GPUs), so the extender never
 * lets them coexist: while a pod it knows of awaits allocation on a node,
 * filter and bind refuse that node to pods with a clashing ask. Other sizes
 * and other nodes are unaffected; a stuck pod stops counting after
 * allocate_wait. Every function expects st->mu held (see state.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "state.h"

/* ---- the pods awaiting allocation ---- */

bool ext_await_enabled(const ext_state *st)
{
    return st->cfg->allocate_wait_s > 0 && st->cfg->cluster_file[0] == '\0';
}

void ext_await_record(ext_state *st, const char *uid, const char *ns, const char *name,
                      const char *node, const ext_asks *asks, double age)
{
    if (!ext_await_enabled(st))
        return;
    ext_await *w = kgpu_strmap_get(&st->awaiting, uid);
    if (w != NULL) { /* its bind seen again: the deadline stays that of the bind */
        snprintf(w->node, sizeof(w->node), "%s", node);
        return;
    }
    if (asks == NULL || (asks->n == 0 && !asks->overflow))
        return;
    double left = st->cfg->allocate_wait_s - (age > 0 ? age : 0);
    if (left <= 0)
        return;
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return;
    snprintf(w->uid, sizeof(w->uid), "%s", uid);
    snprintf(w->ns, sizeof(w->ns), "%.63s", ns);
    snprintf(w->name, sizeof(w->name), "%s", name);
    snprintf(w->node, sizeof(w->node), "%s", node);
    w->recorded = ext_now();
    w->until = w->recorded + left;
    w->asks = *asks;
    if (!kgpu_strmap_put(&st->awaiting, w->uid, w, NULL))
        free(w);
}

void ext_await_drop(ext_state *st, const char *uid)
{
    free(kgpu_strmap_del(&st->awaiting, uid));
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void ext_await_seen(ext_state *st, const json_t *json, const kgpu_pod *pod)
{
    if (!ext_await_enabled(st))
        return;
    if (pod->terminal) {
        ext_await_drop(st, pod->uid);
        return;
    }
    if (pod->node[0] == '\0')
        return; /* not bound yet, or the watch has not caught up with our bind: keep it */
    const json_t *ann = json_object_get(json_object_get(json, "metadata"), "annotations");
    if (!pod->has_assignment || json_object_get(ann, KGPU_ANN_ALLOCATED) != NULL ||
        (pod->phase[0] != '\0' && strcmp(pod->phase, "Pending") != 0)) {
        ext_await_drop(st, pod->uid); /* allocated, running, or not kgpu's */
        return;
    }
    if (kgpu_strmap_get(&st->awaiting, pod->uid) != NULL) {
        ext_await_record(st, pod->uid, pod->ns, pod->name, pod->node, NULL, 0);
        return;
    }
    /* Bound by an earlier run or another replica: its own bind time says how long it waits. */
    const char *when = json_string_value(json_object_get(ann, KGPU_ANN_BIND_TIME));
    double bound;
    if (when == NULL || !kgpu_rfc3339_parse(when, &bound)) {
        ext_log(EXT_DEBUG, "pod %s/%s: no readable %s; not held as awaiting allocation", pod->ns,
                pod->name, KGPU_ANN_BIND_TIME);
        return;
    }
    ext_asks asks;
    ext_asks_from_json(json, &asks);
    ext_await_record(st, pod->uid, pod->ns, pod->name, pod->node, &asks, wall_now() - bound);
}

void ext_await_expire(ext_state *st)
{
    if (st->awaiting.len == 0)
        return;
    double now = ext_now();
    size_t it = 0, n = 0;
    const char *k;
    void *v;
    ext_await **late = calloc(st->awaiting.len, sizeof(*late));
    while (late != NULL && kgpu_strmap_next(&st->awaiting, &it, &k, &v)) {
        ext_await *w = v;
        if (now >= w->until)
            late[n++] = w;
    }
    for (size_t i = 0; i < n; i++) {
        ext_log(EXT_WARN,
                "pod %s/%s on %s: kubelet has not asked for its devices (no %s) %d s after its "
                "bind; it no longer holds back pods of the same size there. Is kgpu's device "
                "plugin running on the node, and kubelet?",
                late[i]->ns, late[i]->name, late[i]->node, KGPU_ANN_ALLOCATED,
                st->cfg->allocate_wait_s);
        ext_await_drop(st, late[i]->uid); /* frees late[i] */
    }
    free(late);
}

const ext_await *ext_await_clash(ext_state *st, const char *node, const char *uid,
                                 const ext_asks *asks, ext_ask *same)
{
    if (!ext_await_enabled(st))
        return NULL;
    double now = ext_now();
    size_t it = 0;
    const char *k;
    void *v;
    while (kgpu_strmap_next(&st->awaiting, &it, &k, &v)) {
        const ext_await *w = v;
        if (now < w->until && strcmp(w->node, node) == 0 && strcmp(w->uid, uid) != 0 &&
            ext_asks_clash(&w->asks, asks, same))
            return w;
    }
    return NULL;
}

void ext_await_clashing_nodes(ext_state *st, const char *uid, const ext_asks *asks,
                              kgpu_strmap *out)
{
    if (!ext_await_enabled(st))
        return;
    double now = ext_now();
    size_t it = 0;
    const char *k;
    void *v;
    while (kgpu_strmap_next(&st->awaiting, &it, &k, &v)) {
        ext_await *w = v;
        if (now < w->until && strcmp(w->uid, uid) != 0 && ext_asks_clash(&w->asks, asks, NULL) &&
            kgpu_strmap_get(out, w->node) == NULL)
            kgpu_strmap_put(out, w->node, w, NULL);
    }
}

void ext_await_reason(const ext_await *w, const ext_ask *same, const char *viewer, char *buf,
                      size_t len)
{
    char who[KGPU_NAME_MAX * 2 + 40];
    snprintf(buf, len, "waiting for kubelet to allocate %s (same %s: %" PRId64 "); retry shortly",
             ext_pod_for_viewer(w->ns, w->name, viewer, "", who, sizeof(who)),
             ext_res_name(same->res), same->amount);
}

void ext_await_relisted(ext_state *st, const kgpu_strmap *present)
{
    size_t it = 0, n = 0;
    const char *k;
    void *v;
    char(*gone)[64] = calloc(st->awaiting.len + 1, sizeof(*gone));
    while (gone != NULL && kgpu_strmap_next(&st->awaiting, &it, &k, &v)) {
        const ext_await *w = v;
        /* Younger ones may be binds the list's snapshot predates. */
        if (kgpu_strmap_get(present, k) == NULL && w->recorded < st->relist_started)
            snprintf(gone[n++], sizeof(gone[0]), "%s", w->uid);
    }
    for (size_t i = 0; i < n; i++)
        ext_await_drop(st, gone[i]);
    free(gone);
}
