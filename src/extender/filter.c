/*
 * The filter verb: which of the nodes kube-scheduler sent can take the pod,
 * and in words an operator can act on why not for the others. GPU queues'
 * admission and reclaim for a pod within its guarantee start here too, and
 * consolidation (moves.c) for a pod that fits none of the nodes offered.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "request.h"

/* ext_consolidate with the nodes kube-scheduler offered as the hosts; st->mu held. */
static int consolidate(ext_ctx *d, const kgpu_pod *pod, int priority, const char **names, int n,
                       ext_reclaim *rec, char *note, size_t len)
{
    int nn = kgpu_cluster_node_count(d->state->cluster);
    bool *offered = calloc((size_t)nn + 1, sizeof(*offered));
    if (offered == NULL)
        return EXT_RECLAIM_NONE;
    for (int i = 0; i < n; i++) {
        int idx = kgpu_cluster_find_node(d->state->cluster, names[i]);
        if (idx >= 0)
            offered[idx] = true;
    }
    int how = ext_consolidate(d->state, pod, priority, offered, d->k8s == NULL, rec, note, len);
    free(offered);
    return how;
}

void ext_verb_filter(ext_ctx *d, json_t *args, fast_names *fast, ext_response *r)
{
    kgpu_pod *pod = malloc(sizeof(*pod));
    const char **names = NULL;
    json_t **objects = NULL;
    char invalid[INVALID_MAX]; /* "kgpu: <reason>" when kgpu cannot honour the pod's request */
    if (pod == NULL) {
        ext_reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        goto out;
    }
    if (!ext_read_pod(d, r, VERB_FILTER, args, pod, invalid, sizeof(invalid)))
        goto out;
    /*
     * Nodes.items (nodeCacheCapable: false) name the candidates and nothing
     * more: inventory comes only from the API server's node watch or the
     * cluster file, never from a request body that any client can send.
     */
    int n = ext_read_nodes(d, r, VERB_FILTER, args, fast, &names, &objects);
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
    char doubt_node[KGPU_NAME_MAX + 1] = "", doubt_why[REASON_MAX];
    bool holds = false;        /* some reclaim holds room for its pod (reclaim_state.c) */
    pthread_mutex_lock(&d->state->mu);
    rc = ext_check_pod(d, pod, NULL, invalid, sizeof(invalid));
    ext_filtered *remembered = NULL;
    if (rc == 0 && pod->nparts > 0 && invalid[0] == '\0') {
        remembered = ext_state_remember(d->state, pod, &asks);
        if (d->state->awaiting.len > 0) {
            ext_await_expire(d->state);
            ext_await_clashing_nodes(d->state, pod->uid, &asks, &awaiting);
        }
        qid = ext_queues_resolve(d->state, pod->ns, qlabel, qname, sizeof(qname), qwhy,
                                 sizeof(qwhy));
        ext_reclaims_refresh(d->state);
        holds = d->state->reclaims.len > 0;
        ext_doubts_expire(d->state);
        const ext_pod *doubt = ext_state_doubt_of(d->state, pod->uid);
        if (doubt != NULL) { /* its GPUs are held on one node: only that one will do */
            snprintf(doubt_node, sizeof(doubt_node), "%s", doubt->node);
            ext_doubt_reason(d->state, doubt, doubt_why, sizeof(doubt_why));
        }
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
            if (invalid[0] != '\0') { /* no node will do: see the comment at ext_bad_request */
                ext_add_reason(&unresolvable, names[i], invalid);
                continue;
            }
            if (pod->nparts == 0) {
                pass[i] = any = true; /* no GPU asked: not kgpu's business */
                continue;
            }
            if (doubt_node[0] != '\0') {
                if (strcmp(names[i], doubt_node) == 0)
                    pass[i] = any = true;
                else
                    ext_add_reason(&failed, names[i], doubt_why);
                continue;
            }
            if (qid == -2) { /* a queue may be made: not unresolvable */
                ext_add_reason(&failed, names[i], qwhy);
                continue;
            }
            int idx = kgpu_cluster_find_node(d->state->cluster, names[i]);
            if (idx >= 0 && ext_dra_is_node(d->state, names[i])) {
                ext_add_reason(&unresolvable, names[i], EXT_DRA_NODE_REASON);
                continue;
            }
            const char *leaving = ext_node_closed(d->state, names[i]);
            if (leaving != NULL) {
                snprintf(why, sizeof(why),
                         "node is leaving (%s): kgpu places no new GPU pod there", leaving);
                ext_add_reason(&unresolvable, names[i], why);
                continue;
            }
            if (idx < 0) {
                ext_add_reason(&unresolvable, names[i],
                           "node has no GPU inventory known to kgpu (no kgpu.io/gpus annotation "
                           "and no nvidia.com/gpu)");
                continue;
            }
            if (ext_place_budgeted(d->state->cluster, idx, NULL, 0, reqs, pod->nparts, 0,
                               &search_left, why, sizeof(why)) == KGPU_PLACE_FOUND) {
                const ext_await *w = awaiting.len > 0 ? kgpu_strmap_get(&awaiting, names[i]) : NULL;
                ext_ask same;
                if (w != NULL && ext_asks_clash(&w->asks, &asks, &same)) {
                    /* It fits, but the device plugin could not tell the two pods apart: soon. */
                    ext_await_reason(w, &same, pod->ns, why, sizeof(why));
                    ext_add_reason(&failed, names[i], why);
                    continue;
                }
                const ext_reclaim *h =
                    holds ? ext_reclaim_hold_taken(d->state, idx, pod->uid, reqs, pod->nparts)
                          : NULL;
                if (h != NULL) { /* room a reclaim freed for another pod: that pod's, for now */
                    ext_reclaim_hold_reason(h, pod->ns, why, sizeof(why));
                    ext_add_reason(&failed, names[i], why);
                    continue;
                }
                int qs = qid >= 0 ? ext_queues_check(d->state, qid, pod, idx, why, sizeof(why))
                                  : KGPU_QUEUE_WITHIN;
                if (qs == KGPU_QUEUE_WITHIN || qs == KGPU_QUEUE_BORROWS) {
                    pass[i] = any = true;
                    continue;
                }
                if (qs == KGPU_QUEUE_RECLAIM) {
                    char reason[3 * REASON_MAX];
                    snprintf(reason, sizeof(reason), "%s; within queue %s's guarantee: %s", why,
                             qname, note[0] ? note : "waits for reclaim");
                    ext_cut_reason(why, sizeof(why), reason);
                }
                over = true;
                ext_add_reason(&failed, names[i], why);
                continue;
            }
            if (note[0] != '\0') {
                char reason[3 * REASON_MAX];
                snprintf(reason, sizeof(reason), "%s; %s", why, note);
                ext_cut_reason(why, sizeof(why), reason);
            }
            const kgpu_node *node = kgpu_cluster_node(d->state->cluster, idx);
            bool never = false;
            for (int k = 0; k < pod->nparts && !never; k++)
                never = ext_never_fits(node, reqs[k], why, sizeof(why));
            if (!never &&
                ext_place_budgeted(d->state->cluster, idx, NULL, 0, reqs, pod->nparts,
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
            ext_add_reason(never ? &unresolvable : &failed, names[i], why);
        }
        wait = any                        ? EXT_WAIT_NONE
               : wait == EXT_WAIT_RECLAIM ? EXT_WAIT_RECLAIM
               : over                     ? EXT_WAIT_QUOTA
                                          : EXT_WAIT_NONE;
        if (any || round > 0 || qid == -2 || n == 0 || invalid[0] != '\0' ||
            doubt_node[0] != '\0' || pod->nparts == 0 || !ext_ctx_leads(d))
            break;
        /* Fits no node: within its guarantee, borrowers make room (docs/queues.md "Reclaim"). */
        int qs = qid >= 0 ? ext_queues_check(d->state, qid, pod, -1, NULL, 0) : KGPU_QUEUE_WITHIN;
        ext_reclaim rec;
        int how = EXT_RECLAIM_NONE;
        bool moved = false;
        if (qid >= 0 && (qs == KGPU_QUEUE_WITHIN || qs == KGPU_QUEUE_RECLAIM)) {
            how = ext_queues_reclaim(d->state, pod, qid, d->k8s == NULL, &rec, note, sizeof(note));
            if (how == EXT_RECLAIM_NONE && strstr(note, "PodDisruptionBudget") == NULL)
                note[0] = '\0'; /* nothing borrowed would make room */
        }
        /* Nor anything borrowed: moving restartable pods may (docs/autoscaling.md). */
        if (how == EXT_RECLAIM_NONE && note[0] == '\0' && !over &&
            (qs == KGPU_QUEUE_WITHIN || qs == KGPU_QUEUE_BORROWS || qs == KGPU_QUEUE_RECLAIM) &&
            d->state->cfg->consolidate_moves > 0) {
            how = consolidate(d, pod, priority, names, n, &rec, note, sizeof(note));
            moved = true;
        }
        if (how == EXT_RECLAIM_NONE && note[0] == '\0')
            break; /* the capacity reasons say it all */
        if (how == EXT_RECLAIM_APPLIED)
            note[0] = '\0';
        if (how == EXT_RECLAIM_STARTED && (evict = malloc(sizeof(*evict))) != NULL)
            *evict = rec;
        if (!moved)
            wait = EXT_WAIT_RECLAIM;
        /* Again, from a clean answer. */
        free(kgpu_jsonw_finish(&failed));
        free(kgpu_jsonw_finish(&unresolvable));
        kgpu_jsonw_init(&failed, 256);
        kgpu_jsonw_init(&unresolvable, 256);
        memset(pass, 0, (size_t)n * sizeof(*pass));
    }
    remembered = rc == 0 && pod->nparts > 0 ? kgpu_strmap_get(&d->state->pending, pod->uid) : NULL;
    if (remembered != NULL)
        remembered->waiting = wait;
    pthread_mutex_unlock(&d->state->mu);
    if (evict != NULL) {
        ext_evict_victims(d, evict);
        free(evict);
    }
    kgpu_strmap_clear(&awaiting);
    if (rc != 0 || pass == NULL) { /* out of memory */
        free(kgpu_jsonw_finish(&failed));
        free(kgpu_jsonw_finish(&unresolvable));
        free(pass);
        ext_reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        goto out;
    }
    if (invalid[0] != '\0')
        ext_invalid_pod(d, VERB_FILTER, pod, invalid);
    ext_reply_filter(r, n, names, objects, pass, &failed, &unresolvable);
    free(pass);
out:
    free(names);
    free(objects);
    free(pod);
}
