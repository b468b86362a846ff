/*
 * The preempt verb: of the victims kube-scheduler chose per node, the nodes
 * where evicting them would let the pod's GPUs fit.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "request.h"

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

void ext_verb_preempt(ext_ctx *d, json_t *args, ext_response *r)
{
    kgpu_pod *pod = malloc(sizeof(*pod));
    char invalid[INVALID_MAX]; /* preemption cannot help a pod kgpu cannot honour: no node kept */
    if (pod == NULL) {
        ext_reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        return;
    }
    if (!ext_read_pod(d, r, VERB_PREEMPT, args, pod, invalid, sizeof(invalid))) {
        free(pod);
        return;
    }
    json_t *victims = json_object_get(args, "NodeNameToMetaVictims");
    bool meta = json_is_object(victims);
    if (!meta)
        victims = json_object_get(args, "NodeNameToVictims");
    if (victims != NULL && !json_is_null(victims) && !json_is_object(victims)) {
        free(pod);
        ext_bad_request(d, r, VERB_PREEMPT, "NodeNameToVictims is not an object");
        return;
    }
    json_t *out = json_object();
    kgpu_error err;
    kgpu_error_clear(&err);
    const char *node;
    json_t *entry;
    long search_left = CALL_SEARCH_STEPS;
    pthread_mutex_lock(&d->state->mu);
    int rc = ext_check_pod(d, pod, NULL, invalid, sizeof(invalid));
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
        int idx = kgpu_cluster_find_node(d->state->cluster, node);
        if (idx >= 0 && ext_dra_is_node(d->state, node))
            idx = -1; /* no device-plugin GPU there: preemption cannot make room */
        if (!keep && idx >= 0) {
            /* Would the pod fit once the victims that hold GPUs here are gone? */
            kgpu_assignment *release = calloc((size_t)nv * KGPU_MAX_PARTS + 1, sizeof(*release));
            int nr = 0;
            for (int v = 0; v < nv && release != NULL; v++) {
                const ext_pod *p = kgpu_strmap_get(&d->state->pods, uids[v]);
                if (p != NULL && strcmp(p->node, node) == 0)
                    for (int k = 0; k < p->nparts; k++)
                        release[nr++] = p->part[k].a;
            }
            const kgpu_request *reqs[KGPU_MAX_PARTS];
            kgpu_request fitreq[KGPU_MAX_PARTS];
            ext_fit_requests(pod, fitreq, reqs);
            keep = release != NULL &&
                   ext_place_budgeted(d->state->cluster, idx, release, nr, reqs, pod->nparts, 0,
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
    pthread_mutex_unlock(&d->state->mu);
    if (no_uid != NULL) {
        char msg[REASON_MAX];
        snprintf(msg, sizeof(msg), "a victim on node %.200s has no UID", no_uid);
        free(pod);
        json_decref(out);
        ext_bad_request(d, r, VERB_PREEMPT, msg);
        return;
    }
    if (invalid[0] != '\0')
        ext_invalid_pod(d, VERB_PREEMPT, pod, invalid);
    free(pod);
    if (rc != 0) { /* out of memory */
        json_decref(out);
        ext_reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
        return;
    }
    ext_reply_json(r, 200, json_pack("{s:o}", "NodeNameToMetaVictims", out));
}
