/*
 * Fuzz target for the pod-routing webhook (src/extender/mutate.c): any body
 * POSTed to /mutate/pods, which needs no client certificate. Whatever comes
 * in, the answer is 200 with an AdmissionReview that allows the pod and
 * patches nothing but spec.schedulerName, or 400 with a reason; never both.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/extender/mutate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *answer = NULL;
    bool routed = false;
    char why[200];
    int status = ext_mutate_review("kgpu-scheduler", 64, (const char *)data, size, &answer,
                                   &routed, why, sizeof(why));
    if (status == 200) {
        const json_t *resp = json_object_get(answer, "response");
        if (answer == NULL || !json_is_true(json_object_get(resp, "allowed")) ||
            routed != (json_object_get(resp, "patch") != NULL) ||
            json_string_length(json_object_get(resp, "patch")) > 200)
            abort();
    } else if (answer != NULL || routed || why[0] == '\0' || (status != 400 && status != 500)) {
        abort();
    }
    json_decref(answer);
    return 0;
}
