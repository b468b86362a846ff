/*
 * POST /mutate/pods: the mutating admission webhook that routes GPU pods to
 * kgpu's own scheduler (the chart's ownScheduler) on clusters that do not
 * serve the v1 MutatingAdmissionPolicy, which does the same inside the API
 * server (deploy/helm/kgpu/templates/own-scheduler-routing.yaml). Same
 * rule: a pod that names no scheduler of its own (default-scheduler, as the
 * API server fills in an empty field) and whose containers or init
 * containers ask for a GPU resource kgpu manages gets
 * spec.schedulerName = routePodsTo, as a JSON patch.
 *
 * The API server calls it without a client certificate (a managed cluster
 * offers no way to give it one), so it is the one POST the client-CA check
 * lets through (http.c): its answer depends on nothing but the request, and
 * it changes nothing in the extender. Anyone who reaches the port learns
 * only what the chart already says. Bad input gets 400 naming what is wrong;
 * docs/install.md, "kgpu's own scheduler".
 */
#include <gnutls/gnutls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mutate.h"

#define UID_MAX 128 /* the API server's request UIDs are UUIDs */

/* A resource kgpu places: what the chart's scheduler.managedResources name. */
static bool gpu_resource(const char *name)
{
    return strcmp(name, "nvidia.com/gpu") == 0 || strcmp(name, "aliyun.com/gpu-mem") == 0 ||
           strncmp(name, "kgpu.io/", 8) == 0;
}

static bool asks_in(const json_t *containers)
{
    size_t i;
    const json_t *c;
    json_array_foreach(containers, i, c)
    {
        const json_t *res = json_object_get(c, "resources");
        const char *lists[] = {"limits", "requests"};
        for (int l = 0; l < 2; l++) {
            const char *k;
            const json_t *v;
            json_object_foreach((json_t *)json_object_get(res, lists[l]), k, v)
            {
                (void)v;
                if (gpu_resource(k))
                    return true;
            }
        }
    }
    return false;
}

bool ext_mutate_routes(const json_t *pod)
{
    const json_t *spec = json_object_get(pod, "spec");
    const json_t *sched = json_object_get(spec, "schedulerName");
    if (sched != NULL && !json_is_null(sched) &&
        (!json_is_string(sched) || (json_string_length(sched) > 0 &&
                                    strcmp(json_string_value(sched), "default-scheduler") != 0)))
        return false; /* it names a scheduler of its own */
    return asks_in(json_object_get(spec, "containers")) ||
           asks_in(json_object_get(spec, "initContainers"));
}

/* The JSON patch that names `to`, base64 as AdmissionResponse.patch carries it; NULL: no memory. */
static char *patch_for(const char *to)
{
    json_t *op = json_pack("[{s:s,s:s,s:s}]", "op", "add", "path", "/spec/schedulerName",
                           "value", to);
    char *text = op ? json_dumps(op, JSON_COMPACT) : NULL;
    json_decref(op);
    if (text == NULL)
        return NULL;
    gnutls_datum_t in = {(unsigned char *)text, (unsigned int)strlen(text)}, out = {NULL, 0};
    char *b64 = NULL;
    if (gnutls_base64_encode2(&in, &out) == 0 && (b64 = malloc(out.size + 1)) != NULL) {
        memcpy(b64, out.data, out.size);
        b64[out.size] = '\0';
    }
    gnutls_free(out.data);
    free(text);
    return b64;
}

static int refuse(char *why, size_t why_len, const char *msg)
{
    snprintf(why, why_len, "%s", msg);
    return 400;
}

int ext_mutate_review(const char *route_to, int max_depth, const char *body, size_t len,
                      json_t **answer, bool *routed, char *why, size_t why_len)
{
    *answer = NULL;
    *routed = false;
    why[0] = '\0';
    if (route_to == NULL || route_to[0] == '\0')
        return refuse(why, why_len, "pod routing is off: the extender has no routePodsTo");
    if (ext_json_depth(body, len, max_depth) > max_depth)
        return refuse(why, why_len, "AdmissionReview nested too deep");
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        snprintf(why, why_len, "malformed JSON at line %d column %d: %.120s", jerr.line,
                 jerr.column, jerr.text);
        return 400;
    }
    int status = 400;
    const json_t *req = json_object_get(root, "request");
    const char *av = json_string_value(json_object_get(root, "apiVersion"));
    const char *kind = json_string_value(json_object_get(root, "kind"));
    const json_t *uid = json_object_get(req, "uid");
    const json_t *pod = json_object_get(req, "object");
    if (av == NULL || strcmp(av, "admission.k8s.io/v1") != 0 || kind == NULL ||
        strcmp(kind, "AdmissionReview") != 0)
        refuse(why, why_len, "expected an admission.k8s.io/v1 AdmissionReview");
    else if (!json_is_object(req))
        refuse(why, why_len, "AdmissionReview without a request");
    else if (!json_is_string(uid) || json_string_length(uid) == 0 ||
             json_string_length(uid) > UID_MAX)
        refuse(why, why_len, "request.uid is not a string of 1-128 characters");
    else if (!json_is_object(pod))
        refuse(why, why_len, "request.object is not an object (a Pod being created)");
    else {
        json_t *resp = json_pack("{s:O,s:b}", "uid", uid, "allowed", 1);
        *routed = ext_mutate_routes(pod);
        char *patch = *routed ? patch_for(route_to) : NULL;
        if (resp != NULL && (!*routed || patch != NULL)) {
            if (patch != NULL) {
                json_object_set_new(resp, "patchType", json_string("JSONPatch"));
                json_object_set_new(resp, "patch", json_string(patch));
            }
            *answer = json_pack("{s:s,s:s,s:o}", "apiVersion", "admission.k8s.io/v1", "kind",
                                "AdmissionReview", "response", resp);
            resp = NULL;
        }
        json_decref(resp);
        free(patch);
        status = *answer != NULL ? 200 : 500;
        if (status == 500)
            snprintf(why, why_len, "out of memory");
    }
    json_decref(root);
    return status;
}
