/*
 * The prioritize verbs: 0-10 scores of the nodes filter passed, by the pod's
 * policy (prioritize), and for pods asking no GPU or asking through DRA
 * claims (prioritize-gpuless). The answer lists the nodes scoring above 0.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "request.h"

/*
 * prioritize scores the pods that ask for a GPU (the extender entry with
 * managedResources) and gives the others 0 everywhere. prioritize-gpuless
 * (gpuless true; an entry without managedResources, which kube-scheduler
 * calls for every pod) does the reverse: it scores the pods that ask for no
 * GPU with the same policy, as a request of their CPU and memory alone, so
 * that their CPU goes where it strands the fewest GPUs instead of where
 * LeastAllocated spreads it (docs/simulate.md), and learns them as arrivals.
 * A pod with resourceClaims asks for GPUs through DRA, no extended
 * resource, so it comes here too: it is scored by all the requests of
 * class gpu.kgpu.io of its claims together (dra_score.c) on the DRA nodes,
 * 0 elsewhere, and 0 everywhere when its claims give none (logged).
 * Each pod is scored by exactly one of the two verbs.
 *
 * kube-scheduler waits for prioritize-gpuless for every pod, one pod at a
 * time, so a pod without a GPU does not wait for the state lock: when
 * another thread holds it, the pod is scored from the per-node snapshot
 * the last holder published (snapshot.c: nodes where its CPU leaves the
 * least GPU compute short of CPU score highest), and is not learned.
 */
void ext_verb_prioritize(ext_ctx *d, json_t *args, fast_names *fast, ext_response *r,
                              bool gpuless)
{
    enum ext_verb verb = gpuless ? VERB_PRIORITIZE_GPULESS : VERB_PRIORITIZE;
    kgpu_pod *pod = malloc(sizeof(*pod));
    const char **names = NULL;
    json_t **objects = NULL;
    int *idx = NULL, *scores = NULL;
    char invalid[INVALID_MAX]; /* a pod kgpu cannot honour scores 0 everywhere */
    if (pod == NULL) {
        ext_reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        goto out;
    }
    if (!ext_read_pod(d, r, verb, args, pod, invalid, sizeof(invalid)))
        goto out;
    /* An unreadable pod is reported by the verbs of the entry that manages it. */
    bool report = !gpuless || invalid[0] == '\0';
    int n = ext_read_nodes(d, r, verb, args, fast, &names, &objects);
    if (n < 0)
        goto out;
    idx = calloc((size_t)n + 1, sizeof(*idx));
    scores = calloc((size_t)n + 1, sizeof(*scores));
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = idx == NULL || scores == NULL ? KGPU_ENOMEM : 0;
    kgpu_policy *p = NULL;
    kgpu_request alone; /* prioritize-gpuless: the pod's CPU and memory */
    const kgpu_request *req = NULL;
    const json_t *pj = json_object_get(args, "Pod");
    /* A pod with resourceClaims asks through DRA (dra_claims.c): scored on DRA nodes alone. */
    bool dra = gpuless && pod->nparts == 0 && invalid[0] == '\0' &&
               json_array_size(json_object_get(json_object_get(pj, "spec"), "resourceClaims")) > 0;
    char dra_why[2 * REASON_MAX] = ""; /* why a DRA pod scores 0 everywhere */
    char dra_note[2 * REASON_MAX] = ""; /* what its scores did not trust, where it does not fit */
    bool plain = gpuless && !dra && pod->nparts == 0 && invalid[0] == '\0' &&
                 (pod->cpu_milli > 0 || pod->memory_mib > 0);
    /*
     * A pod without a GPU never waits for the state lock: held (a sweep
     * slice, a relist, a bind), the pod is scored from the snapshot the
     * last holder published (snapshot.c) and is not learned as an arrival.
     */
    if (rc != 0 || !plain || d->state->gpuless.always_lock) {
        pthread_mutex_lock(&d->state->mu);
    } else if (pthread_mutex_trylock(&d->state->mu) != 0) {
        if (ext_gpuless_scores(d->state, pod->cpu_milli, pod->memory_mib, names, n, scores))
            goto reply;
        pthread_mutex_lock(&d->state->mu); /* nothing published yet */
    }
    if (rc == 0 && !gpuless) {
        rc = ext_check_pod(d, pod, &p, invalid, sizeof(invalid));
        req = pod->nparts > 0 && invalid[0] == '\0' ? &pod->parts[0].req : NULL;
    } else if (rc == 0 && dra) {
        /* Every request of its claims together, on the DRA nodes alone (dra_score.c). */
        for (int i = 0; i < n; i++) {
            idx[i] = kgpu_cluster_find_node(d->state->cluster, names[i]);
            if (idx[i] >= 0 && !ext_dra_is_node(d->state, names[i]))
                idx[i] = -1;
        }
        rc = ext_dra_score(d->state, pod, pj, idx, n, scores, dra_why, sizeof(dra_why), dra_note,
                           sizeof(dra_note), &err);
    } else if (rc == 0 && pod->nparts == 0 && invalid[0] == '\0' &&
               (pod->cpu_milli > 0 || pod->memory_mib > 0)) {
        /* A pod asking for nothing takes nothing: every node is the same to it. */
        int crc = ext_state_compile_gpuless(d->state, pod, &alone, &err);
        p = crc == 0 ? ext_state_policy(d->state, pod, &err) : NULL;
        req = p != NULL ? &alone : NULL;
        if (req == NULL && err.code == KGPU_ENOMEM)
            rc = KGPU_ENOMEM;
        else if (req == NULL)
            snprintf(invalid, sizeof(invalid), "kgpu: %s", err.msg);
    }
    if (rc == 0 && req != NULL) {
        int m = 0;
        for (int i = 0; i < n; i++) {
            idx[i] = kgpu_cluster_find_node(d->state->cluster, names[i]);
            /*
             * A DRA pod's claim is allocated on DRA nodes only; a device-plugin
             * pod's resources are served on the others only (one owner per node).
             */
            if (idx[i] >= 0 && (dra || !gpuless) && dra != ext_dra_is_node(d->state, names[i]))
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
            rc = kgpu_policy_node_scores(p, d->state->cluster, req, known, m, ks, &err);
            for (int i = 0, j = 0; i < n && rc == 0; i++)
                scores[i] = idx[i] >= 0 ? ks[j++] : 0;
        }
        free(known);
        free(ks);
    }
    if (plain)
        ext_gpuless_publish(d->state); /* for the next one, should the lock be busy then */
    pthread_mutex_unlock(&d->state->mu);
reply:
    if (rc != 0) { /* out of memory; the node indices are the state's own */
        ext_reply_json(r, 500, json_pack("{s:s}", "Error", err.msg[0] ? err.msg : "out of memory"));
        goto out;
    }
    if (invalid[0] != '\0' && report)
        ext_invalid_pod(d, verb, pod, invalid);
    if (dra_why[0] != '\0')
        ext_log(EXT_INFO, "%s; scored 0 on every node", dra_why);
    if (dra_note[0] != '\0')
        ext_log(EXT_INFO, "%s", dra_note);
    /*
     * Only the nodes that score above 0: kube-scheduler adds an extender's
     * score to the nodes its answer names and nothing to the others, so 0
     * need not be said. Decoding the answers was most of kube-scheduler's
     * cost of an extender call, and a GPU pod's prioritize-gpuless (or a pod
     * kgpu cannot honour) scores 0 everywhere: its answer is [].
     */
    kgpu_jsonw w;
    kgpu_jsonw_init(&w, (size_t)n * 40 + 16);
    kgpu_jsonw_lit(&w, "[");
    for (int i = 0, listed = 0; i < n; i++) {
        if (scores[i] == 0)
            continue;
        kgpu_jsonw_lit(&w, listed++ ? ",{\"Host\":" : "{\"Host\":");
        kgpu_jsonw_str(&w, names[i]);
        kgpu_jsonw_lit(&w, ",\"Score\":");
        kgpu_jsonw_int(&w, scores[i]);
        kgpu_jsonw_lit(&w, "}");
    }
    kgpu_jsonw_lit(&w, "]");
    ext_reply_written(r, &w);
out:
    free(names);
    free(objects);
    free(idx);
    free(scores);
    free(pod);
}
