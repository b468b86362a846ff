/*
 * The pod-routing admission webhook (mutate.c): GPU pods that name no
 * scheduler of their own are given kgpu's.
 */
#ifndef KGPU_EXT_MUTATE_H
#define KGPU_EXT_MUTATE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "base.h"

/* Whether the Pod object is routed: no scheduler of its own, and a GPU resource asked. */
bool ext_mutate_routes(const json_t *pod);

/*
 * Answers an AdmissionReview (body, len) for a pod being created. Returns
 * the HTTP status: 200 with *answer the AdmissionReview to send (owned by
 * the caller; a JSON patch setting spec.schedulerName to route_to when
 * *routed), or 400/500 with `why` naming what is wrong (*answer NULL).
 * Nesting past max_depth is refused before parsing.
 */
int ext_mutate_review(const char *route_to, int max_depth, const char *body, size_t len,
                      json_t **answer, bool *routed, char *why, size_t why_len);

#endif
