/*
 * One verb call from its body to its answer: NodeNames read on the fast
 * path where the verb takes candidates, the body parsed, the verb's
 * function called, the call counted with its latency. filter-gpuless is
 * here too: the filter of the entry without managedResources.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"

/*
 * Whether a pod with ResourceClaims may be placed as far as its GPU queue
 * goes: what its claims of gpu.kgpu.io not allocated yet will take must
 * keep every queue on its path within its limit (kgpu_queues_check, as
 * filter's check for a GPU pod's request). false with the reason, and
 * *final when no node will do until the queues change (a limit passed).
 */
static bool dra_queue_admits(ext_ctx *d, const json_t *pj, char *why, size_t len, bool *final)
{
    char label[KGPU_QUEUE_NAME_MAX + 1], qname[KGPU_QUEUE_NAME_MAX + 1], unresolved[REASON_MAX];
    int priority;
    ext_pod_queue_fields(pj, label, sizeof(label), &priority);
    const char *ns = json_string_value(json_object_get(json_object_get(pj, "metadata"), "namespace"));
    kgpu_qdemand dem;
    bool ok = true;
    *final = false;
    pthread_mutex_lock(&d->state->mu);
    if (d->state->queues != NULL &&
        ext_dra_pod_demand(d->state, pj, &dem, unresolved, sizeof(unresolved)) > 0) {
        int q = ext_queues_resolve(d->state, ns != NULL ? ns : "default", label, qname,
                                   sizeof(qname), why, len);
        int qs = q >= 0 ? kgpu_queues_check(d->state->queues, q, &dem, why, len)
                        : q == -2 ? KGPU_QUEUE_OVER /* no such queue: may be made, not final */
                                  : KGPU_QUEUE_WITHIN;
        ok = qs == KGPU_QUEUE_WITHIN || qs == KGPU_QUEUE_BORROWS;
        *final = q >= 0 && qs == KGPU_QUEUE_OVER;
        if (q >= 0 && !ok) {
            char reason[2 * REASON_MAX];
            snprintf(reason, sizeof(reason), "kgpu: %s (its ResourceClaims of class %s)", why,
                     EXT_DRA_CLASS);
            ext_cut_reason(why, len, reason);
        }
    }
    pthread_mutex_unlock(&d->state->mu);
    return ok;
}

/*
 * filter-gpuless: every node passes for a pod without ResourceClaims,
 * decided from the pod alone without the state lock; a pod with claims of
 * gpu.kgpu.io passes every node, or none, by its queue (dra_queue_admits).
 */
static void verb_filter_gpuless(ext_ctx *d, json_t *args, fast_names *fast, ext_response *r)
{
    const json_t *pj = json_object_get(args, "Pod");
    if (!json_is_object(pj)) {
        ext_bad_request(d, r, VERB_FILTER_GPULESS, "no Pod object");
        return;
    }
    const char **names = NULL;
    json_t **objects = NULL;
    int n = ext_read_nodes(d, r, VERB_FILTER_GPULESS, args, fast, &names, &objects);
    if (n < 0)
        return;
    char why[REASON_MAX] = "";
    bool pass = true, final = false;
    if (json_array_size(json_object_get(json_object_get(pj, "spec"), "resourceClaims")) > 0)
        pass = dra_queue_admits(d, pj, why, sizeof(why), &final);
    bool *passes = malloc((size_t)(n > 0 ? n : 1) * sizeof(*passes));
    if (passes == NULL) {
        ext_reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        free(names);
        free(objects);
        return;
    }
    kgpu_jsonw failed, unresolvable;
    kgpu_jsonw_init(&failed, pass ? 16 : (size_t)n * (strlen(why) + 24) + 16);
    kgpu_jsonw_init(&unresolvable, 16);
    for (int i = 0; i < n; i++) {
        passes[i] = pass;
        if (!pass)
            ext_add_reason(final ? &unresolvable : &failed, names[i], why);
    }
    ext_reply_filter(r, n, names, objects, passes, &failed, &unresolvable);
    free(passes);
    free(names);
    free(objects);
}

void ext_decide(ext_ctx *d, enum ext_verb v, const char *body, size_t len, ext_response *r)
{
    memset(r, 0, sizeof(*r));
    double t0 = ext_now();
    atomic_fetch_add(&d->metrics->requests[v], 1);
    fast_names fast = {NULL, -1};
    char *copy = NULL, *store = NULL;
    if (v == VERB_FILTER || v == VERB_PRIORITIZE || v == VERB_PRIORITIZE_GPULESS ||
        v == VERB_FILTER_GPULESS) {
        copy = malloc(len + 1);
        store = malloc(len + 1);
        if (copy != NULL && store != NULL) {
            memcpy(copy, body, len);
            copy[len] = '\0';
            fast.n = ext_fast_node_names(copy, len, store, &fast.names);
        }
    }
    json_t *args = ext_parse_body(d, r, v, fast.n >= 0 ? copy : body, len);
    if (args != NULL) {
        switch (v) {
        case VERB_FILTER:
            ext_verb_filter(d, args, &fast, r);
            break;
        case VERB_PRIORITIZE:
        case VERB_PRIORITIZE_GPULESS:
            ext_verb_prioritize(d, args, &fast, r, v == VERB_PRIORITIZE_GPULESS);
            break;
        case VERB_FILTER_GPULESS:
            verb_filter_gpuless(d, args, &fast, r);
            break;
        case VERB_BIND:
            ext_verb_bind(d, args, r);
            break;
        default:
            ext_verb_preempt(d, args, r);
            break;
        }
        json_decref(args);
    }
    free(fast.names);
    free(copy);
    free(store);
    if (r->body == NULL && r->status == 0)
        ext_reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
    ext_metrics_observe(d->metrics, v, ext_now() - t0);
}
