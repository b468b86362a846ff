/*
 * The scale-down guard (decide.h). Cluster Autoscaler removes a node when
 * its pods fit elsewhere by its own simulation, which sums resources per
 * node; Karpenter's consolidation judges the same way. A node of shares can
 * pass that test while its shares fit no GPU elsewhere. The guard asks
 * kgpu's per-GPU placement (kgpu_can_drain) and annotates the nodes that
 * must stay:
 *   cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"
 *   karpenter.sh/do-not-disrupt: "true"
 *   kgpu.io/scale-down-guard: why (counts only: no pod is named)
 * and removes the three from a node carrying kgpu's mark once it may go. A
 * node whose CA or Karpenter annotation an operator set (no kgpu mark) is
 * never written. Runs on the leader's guard thread (daemon.c), which owns
 * the copy it decides on and `written`.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decide.h"

#define GUARD_REPATCH_S 60 /* a patch the watch has not shown yet is not sent again before */

/* What the thread last patched on a node, and when. */
typedef struct guard_written {
    double at;
    bool guarded;
} guard_written;

/* PATCHes node `name`: the three annotations with `why`, or (why NULL) none of them. */
static bool patch(ext_ctx *d, const char *name, const char *why)
{
    json_t *ann = why != NULL ? json_pack("{s:s,s:s,s:s}", EXT_GUARD_CA, "true",
                                          EXT_GUARD_KARPENTER, "true", EXT_GUARD_MARK, why)
                              : json_pack("{s:n,s:n,s:n}", EXT_GUARD_CA, EXT_GUARD_KARPENTER,
                                          EXT_GUARD_MARK);
    json_t *body = ann != NULL ? json_pack("{s:{s:o}}", "metadata", "annotations", ann) : NULL;
    char *text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    char path[KGPU_K8S_PATH_MAX];
    snprintf(path, sizeof(path), "/api/v1/nodes/%s", name);
    kgpu_http_resp resp = {0};
    kgpu_error err;
    kgpu_error_clear(&err);
    bool ok = false;
    if (text == NULL)
        ext_log(EXT_WARN, "scale-down guard: node %s: out of memory", name);
    else if (kgpu_k8s_request(d->k8s, "PATCH", path, "application/merge-patch+json", text, &resp,
                              &err) != 0)
        ext_log(EXT_WARN, "scale-down guard: node %s: %s", name, err.msg);
    else if (resp.status != 200)
        ext_log(EXT_WARN, "scale-down guard: node %s: API server answered %ld: %.300s", name,
                resp.status, resp.body ? resp.body : "");
    else
        ok = true;
    if (ok)
        ext_log(EXT_INFO, "scale-down guard: node %s %s", name,
                why != NULL ? "kept from scale-down" : "may be scaled down again");
    free(text);
    free(resp.body);
    return ok;
}

/*
 * --consolidate-nodes: evicts every GPU pod of node g (all restartable, all
 * able to run on the other nodes) through the Eviction API, the node
 * closed to new GPU pods meanwhile, so that an autoscaler finds it empty
 * and removes it. One node at a time (ext_emptying_start).
 */
static void empty_node(ext_ctx *d, const ext_guard_snap *snap, const ext_guard_node *g)
{
    ext_reclaim *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return;
    r->move = true;
    snprintf(r->for_ns, sizeof(r->for_ns), "-");
    snprintf(r->for_name, sizeof(r->for_name), "emptying node %.200s", g->name);
    for (size_t k = g->first; k < g->first + g->n; k++)
        r->v[r->nvictims++] = snap->who[k];
    pthread_mutex_lock(&d->state->mu);
    bool go = ext_emptying_start(d->state, g->name, r);
    pthread_mutex_unlock(&d->state->mu);
    if (go) {
        ext_log(EXT_INFO, "consolidation: emptying node %s (%d GPU pod%s, all restartable, all "
                          "able to run elsewhere) so that it can be scaled down",
                g->name, r->nvictims, r->nvictims == 1 ? "" : "s");
        atomic_fetch_add(&d->metrics->nodes_emptied, 1);
        ext_evict_victims(d, r);
    }
    free(r);
}

int ext_guard_once(ext_ctx *d, kgpu_strmap *written, const atomic_bool *stop)
{
    if (written->len > EXT_GUARD_NODES_MAX)
        kgpu_strmap_clear_free(written); /* nodes long gone: what the watch says is enough */
    ext_guard_snap snap;
    pthread_mutex_lock(&d->state->mu);
    bool ok = ext_guard_snapshot(d->state, &snap);
    pthread_mutex_unlock(&d->state->mu);
    if (!ok) {
        ext_log(EXT_WARN, "scale-down guard: out of memory; tried again next round");
        return 0;
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    /* Whether they fit at all, not where kgpu would put them: best fit, which needs no
     * learned workload (the state's, which this thread may not read without the lock). */
    kgpu_policy *p = kgpu_policy_new("bestfit", snap.c, NULL, &err);
    if (p == NULL) {
        ext_log(EXT_WARN, "scale-down guard: %s", err.msg);
        ext_guard_snap_free(&snap);
        return 0;
    }
    kgpu_policy_set_fit_cpu(p, false); /* CPU and memory are kube-scheduler's */
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 28, 1);
    double now = ext_now();
    int need_n = 0, empty = -1;
    int64_t empty_milli = 0;
    for (int i = 0; i < snap.nnodes && (stop == NULL || !atomic_load(stop)); i++) {
        const ext_guard_node *g = &snap.nodes[i];
        if (g->foreign)
            continue; /* the operator's: kgpu neither adds nor removes */
        bool need = false, drains = false;
        char why[200] = "";
        if (g->unsure) {
            need = true;
            snprintf(why, sizeof(why),
                     "a pod of several GPU containers runs here, which kgpu does not place "
                     "again alone");
        } else if (g->n > 0) {
            size_t stuck = 0;
            int rc = kgpu_can_drain(snap.c, p, &snap.pods[g->first], g->n, g->idx, snap.skip,
                                    &rng, &stuck, &err);
            if (rc != 0 && rc != KGPU_ENOFIT) {
                ext_log(EXT_WARN, "scale-down guard: node %s: %s", g->name, err.msg);
                continue; /* left as it is */
            }
            need = rc == KGPU_ENOFIT;
            drains = rc == 0;
            if (need) {
                char freed[32];
                const kgpu_request *r = &snap.pods[g->first + stuck].req;
                snprintf(freed, sizeof(freed), "%d", r->exclusive ? r->gpu_count * 1000
                                                                  : r->gpu_count * r->gpu_milli);
                snprintf(why, sizeof(why),
                         "%zu GPU pod%s here; one of them (%s milli-GPU, %" PRId64
                         " MiB per GPU) fits no GPU of the other nodes",
                         g->n, g->n == 1 ? "" : "s", freed, r->gpu_memory_mib);
            }
        }
        need_n += need;
        if (drains && d->cfg->consolidate_nodes && !g->marked && !snap.skip[g->idx] &&
            g->n <= EXT_RECLAIM_VICTIMS_MAX) {
            /* Every GPU pod here could go, and may be moved: the least GPU to move wins. */
            int64_t milli = 0;
            bool movable = true;
            for (size_t k = g->first; k < g->first + g->n && movable; k++) {
                movable = snap.pods[k].movable;
                milli += snap.who[k].freed_milli;
            }
            if (movable && (empty < 0 || milli < empty_milli)) {
                empty = i;
                empty_milli = milli;
            }
        }
        guard_written *w = kgpu_strmap_get(written, g->name);
        if (need == g->marked) {
            free(kgpu_strmap_del(written, g->name)); /* the API server says it: forget */
            continue;
        }
        if (w != NULL && w->guarded == need && now - w->at < GUARD_REPATCH_S)
            continue; /* sent already; the watch has not shown it yet */
        if (!patch(d, g->name, need ? why : NULL))
            continue;
        if (w == NULL && (w = calloc(1, sizeof(*w))) != NULL &&
            !kgpu_strmap_put(written, g->name, w, NULL)) {
            free(w);
            w = NULL;
        }
        if (w != NULL) {
            w->at = now;
            w->guarded = need;
        }
    }
    if (empty >= 0 && (stop == NULL || !atomic_load(stop)))
        empty_node(d, &snap, &snap.nodes[empty]);
    kgpu_policy_free(p);
    ext_guard_snap_free(&snap);
    return need_n;
}
