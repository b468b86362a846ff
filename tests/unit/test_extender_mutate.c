/*
 * The pod-routing webhook (src/extender/mutate.c): which pods are routed to
 * kgpu's scheduler, the AdmissionReview answered, and what bad input gets.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <gnutls/gnutls.h>
#include <jansson.h>

#include "../../src/extender/mutate.h"

#define TO "kgpu-scheduler"

/* An AdmissionReview of creating a pod with `spec` (JSON text). */
static char *review(const char *spec)
{
    char *out = NULL;
    if (asprintf(&out,
                 "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\","
                 "\"request\":{\"uid\":\"705ab4f5-6393-11e8-b7cc-42010a800002\","
                 "\"operation\":\"CREATE\",\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Pod\","
                 "\"metadata\":{\"name\":\"p\",\"namespace\":\"t\"},\"spec\":%s}}}",
                 spec) < 0)
        fail_msg("asprintf");
    return out;
}

/* Answers spec's review; returns the decoded patch ("" when none), after checking the envelope. */
static char *answer_for(const char *spec, int *status)
{
    char *body = review(spec), why[200];
    json_t *answer = NULL;
    bool routed = false;
    *status = ext_mutate_review(TO, 64, body, strlen(body), &answer, &routed, why, sizeof(why));
    free(body);
    if (*status != 200) {
        assert_null(answer);
        return strdup(why);
    }
    assert_string_equal(json_string_value(json_object_get(answer, "apiVersion")),
                        "admission.k8s.io/v1");
    assert_string_equal(json_string_value(json_object_get(answer, "kind")), "AdmissionReview");
    json_t *resp = json_object_get(answer, "response");
    assert_string_equal(json_string_value(json_object_get(resp, "uid")),
                        "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_true(json_is_true(json_object_get(resp, "allowed")));
    const char *b64 = json_string_value(json_object_get(resp, "patch"));
    char *patch = strdup("");
    if (b64 != NULL) {
        assert_string_equal(json_string_value(json_object_get(resp, "patchType")), "JSONPatch");
        gnutls_datum_t in = {(unsigned char *)b64, (unsigned)strlen(b64)}, out = {NULL, 0};
        assert_int_equal(gnutls_base64_decode2(&in, &out), 0);
        free(patch);
        patch = strndup((const char *)out.data, out.size);
        gnutls_free(out.data);
    }
    assert_true(routed == (b64 != NULL));
    json_decref(answer);
    return patch;
}

static void expect_patch(const char *spec, bool routed)
{
    int status;
    char *patch = answer_for(spec, &status);
    assert_int_equal(status, 200);
    if (routed)
        assert_string_equal(patch,
                            "[{\"op\":\"add\",\"path\":\"/spec/schedulerName\",\"value\":\"" TO
                            "\"}]");
    else
        assert_string_equal(patch, "");
    free(patch);
}

static void gpu_pods_are_routed(void **state)
{
    (void)state;
    expect_patch("{\"containers\":[{\"name\":\"c\",\"resources\":{\"limits\":"
                 "{\"kgpu.io/gpu-mem\":\"4\"}}}]}",
                 true);
    expect_patch("{\"containers\":[{\"name\":\"c\",\"resources\":{\"requests\":"
                 "{\"nvidia.com/gpu\":\"1\"}}}],\"schedulerName\":\"default-scheduler\"}",
                 true);
    /* In an init container only, and with the field empty. */
    expect_patch("{\"containers\":[{\"name\":\"c\"}],\"schedulerName\":\"\",\"initContainers\":"
                 "[{\"name\":\"i\",\"resources\":{\"limits\":{\"aliyun.com/gpu-mem\":\"2\"}}}]}",
                 true);
}

static void other_pods_are_left_alone(void **state)
{
    (void)state;
    expect_patch("{\"containers\":[{\"name\":\"c\",\"resources\":{\"limits\":{\"cpu\":\"1\"}}}]}",
                 false);
    expect_patch("{\"containers\":[{\"name\":\"c\"}]}", false);
    /* A scheduler of its own: the team's choice stands. */
    expect_patch("{\"schedulerName\":\"team-sched\",\"containers\":[{\"name\":\"c\","
                 "\"resources\":{\"limits\":{\"kgpu.io/gpu-mem\":\"4\"}}}]}",
                 false);
    /* Not a resource kgpu places. */
    expect_patch("{\"containers\":[{\"name\":\"c\",\"resources\":{\"limits\":"
                 "{\"example.com/fpga\":\"1\"}}}]}",
                 false);
}

static void refuse(const char *body, const char *route_to, const char *want)
{
    json_t *answer = (json_t *)1;
    bool routed = true;
    char why[200];
    int status = ext_mutate_review(route_to, 8, body, strlen(body), &answer, &routed, why,
                                   sizeof(why));
    assert_int_equal(status, 400);
    assert_null(answer);
    assert_false(routed);
    if (strstr(why, want) == NULL)
        fail_msg("'%s' does not say '%s'", why, want);
}

static void bad_input_is_named(void **state)
{
    (void)state;
    char *ok = review("{\"containers\":[]}");
    refuse(ok, "", "routePodsTo");
    free(ok);
    refuse("{\"apiVersion\":", TO, "malformed JSON");
    refuse("[[[[[[[[[[[[]]]]]]]]]]]]", TO, "nested too deep");
    refuse("{\"apiVersion\":\"admission.k8s.io/v1beta1\",\"kind\":\"AdmissionReview\"}", TO,
           "admission.k8s.io/v1 AdmissionReview");
    refuse("{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}", TO,
           "without a request");
    refuse("{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\","
           "\"request\":{\"uid\":5,\"object\":{}}}",
           TO, "request.uid");
    refuse("{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\","
           "\"request\":{\"uid\":\"u\",\"object\":[]}}",
           TO, "request.object");
    refuse("{\"apiVersion\":\"admission.k8s.io/v1\",\"apiVersion\":\"admission.k8s.io/v1\"}", TO,
           "malformed JSON");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gpu_pods_are_routed),
        cmocka_unit_test(other_pods_are_left_alone),
        cmocka_unit_test(bad_input_is_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
