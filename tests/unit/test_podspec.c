/*
 * Unit tests for the pod and annotation contract (src/common/podspec.h):
 * quantities, every resource combination a container can ask for, the
 * pod's effective CPU and memory, the annotations, and the annotation
 * formats kgpu writes, round-tripped through the core's apply.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kgpu/model.h"
#include "podspec.h"

#define GIB_MIB 1024

/* ---- helpers ---- */

/* JSON written with single quotes (readable in C) turned into real JSON. */
static json_t *json_q(const char *text)
{
    char *s = strdup(text);
    assert_non_null(s);
    for (char *p = s; *p; p++)
        if (*p == '\'')
            *p = '"';
    json_error_t jerr;
    json_t *v = json_loads(s, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (v == NULL)
        fail_msg("bad test JSON: %s: %s", jerr.text, s);
    free(s);
    return v;
}

/* Reads a pod given as single-quoted JSON with GPU memory unit `unit`. */
static int pod_q(const char *text, int64_t unit, kgpu_pod *pod, kgpu_error *err)
{
    json_t *v = json_q(text);
    kgpu_error_clear(err);
    int rc = kgpu_pod_from_json(v, unit, pod, err);
    json_decref(v);
    return rc;
}

/* A pod named default/x whose spec.containers is `containers` (single-quoted JSON). */
static int containers_q(const char *containers, kgpu_pod *pod, kgpu_error *err)
{
    char buf[8192];
    snprintf(buf, sizeof(buf), "{'metadata':{'name':'x'},'spec':{'containers':[%s]}}", containers);
    return pod_q(buf, GIB_MIB, pod, err);
}

static void assert_contains(const char *haystack, const char *needle)
{
    if (strstr(haystack, needle) == NULL)
        fail_msg("'%s' does not contain '%s'", haystack, needle);
}

static kgpu_pod *new_pod(void)
{
    kgpu_pod *p = calloc(1, sizeof(*p));
    assert_non_null(p);
    return p;
}

/* ---- quantities ---- */

typedef struct qcase {
    const char *text;
    int milli_rc;
    int64_t milli;
    int value_rc;
    int64_t value;
} qcase;

static void test_quantity_table(void **state)
{
    static const qcase cases[] = {
        {"500m", 0, 500, 0, 1},
        {"2", 0, 2000, 0, 2},
        {"1.5", 0, 1500, 0, 2},
        {"0.5", 0, 500, 0, 1},
        {".5", 0, 500, 0, 1},
        {"5.", 0, 5000, 0, 5},
        {"+1", 0, 1000, 0, 1},
        {"0", 0, 0, 0, 0},
        {"-0", 0, 0, 0, 0},
        {"0.000", 0, 0, 0, 0},
        {"1m", 0, 1, 0, 1},
        {"1.5m", 0, 2, 0, 1},
        {"0.0001", 0, 1, 0, 1},
        {"4Gi", 0, 4294967296000LL, 0, 4294967296LL},
        {"1.5Gi", 0, 1610612736000LL, 0, 1610612736LL},
        {"0.1Ki", 0, 102400, 0, 103},
        {"100Mi", 0, 104857600000LL, 0, 104857600},
        {"128974848", 0, 128974848000LL, 0, 128974848},
        {"1e3", 0, 1000000, 0, 1000},
        {"1E3", 0, 1000000, 0, 1000},
        {"1e+3", 0, 1000000, 0, 1000},
        {"1e-3", 0, 1, 0, 1},
        {"25e-1", 0, 2500, 0, 3},
        {"1k", 0, 1000000, 0, 1000},
        {"1M", 0, 1000000000LL, 0, 1000000},
        {"2G", 0, 2000000000000LL, 0, 2000000000LL},
        {"1T", 0, 1000000000000000LL, 0, 1000000000000LL},
        {"1P", 0, 1000000000000000000LL, 0, 1000000000000000LL},
        {"1E", KGPU_ERANGE, 0, 0, 1000000000000000000LL},
        {"7Ei", KGPU_ERANGE, 0, 0, 8070450532247928832LL},
        {"8Ei", KGPU_ERANGE, 0, KGPU_ERANGE, 0},
        {"9223372036854775807", KGPU_ERANGE, 0, 0, INT64_MAX},
        {"9223372036854775808", KGPU_ERANGE, 0, KGPU_ERANGE, 0},
        {"9223372036854775807m", 0, INT64_MAX, 0, 9223372036854776LL},
        {"99999999999999999999", KGPU_ERANGE, 0, KGPU_ERANGE, 0},
        {"1e19", KGPU_ERANGE, 0, KGPU_ERANGE, 0},
        {"1e99999999999999999999", KGPU_ERANGE, 0, KGPU_ERANGE, 0},
        {"1e-99999999999999999999", 0, 1, 0, 1},
        {"12345678901234567890e-10", 0, 1234567890124LL, 0, 1234567891},
        {"0.000000000000000000000000000000000000000001", 0, 1, 0, 1},
        {"1000000000000000000000000000000000000000000e-42", 0, 1000, 0, 1},
        {"00000000000000000000000000000000000000000007", 0, 7000, 0, 7},
        {"-1", KGPU_ERANGE, 0, KGPU_ERANGE, 0},
        {"-1.5Gi", KGPU_ERANGE, 0, KGPU_ERANGE, 0},
        {"", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"abc", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1x", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {" 1", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1 ", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1Ki ", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1.2.3", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {".", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"+", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"--1", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"e3", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1e", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1e3.5", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1mi", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1ki", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1Ki2", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1KiB", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1Gi1", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"0x10", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
        {"1e3k", KGPU_EPARSE, 0, KGPU_EPARSE, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const qcase *c = &cases[i];
        int64_t v = -42;
        kgpu_error err;
        kgpu_error_clear(&err);
        int rc = kgpu_quantity_milli(c->text, &v, &err);
        if (rc != c->milli_rc || (rc == 0 && v != c->milli))
            fail_msg("milli '%s': rc %d value %" PRId64 " (%s), want rc %d value %" PRId64, c->text,
                     rc, v, err.msg, c->milli_rc, c->milli);
        if (rc != 0)
            assert_non_null(strstr(err.msg, "quantity '"));
        kgpu_error_clear(&err);
        rc = kgpu_quantity_value(c->text, &v, &err);
        if (rc != c->value_rc || (rc == 0 && v != c->value))
            fail_msg("value '%s': rc %d value %" PRId64 " (%s), want rc %d value %" PRId64, c->text,
                     rc, v, err.msg, c->value_rc, c->value);
    }
}

static void test_quantity_long_inputs(void **state)
{
    /* Many significant fraction digits: kept exactly, so rounding up stays exact. */
    char buf[400];
    int64_t v;
    kgpu_error err;
    memset(buf, 0, sizeof(buf));
    strcpy(buf, "2.");
    memset(buf + 2, '0', 90);
    strcat(buf, "1");
    assert_int_equal(kgpu_quantity_value(buf, &v, &err), 0);
    assert_int_equal(v, 3);
    /* More significant digits than kept is refused rather than silently rounded. */
    memset(buf, '1', 200);
    buf[200] = '\0';
    strcat(buf, "e-199");
    assert_int_equal(kgpu_quantity_value(buf, &v, &err), KGPU_ERANGE);
    /* Long runs of zeros are not significant. */
    memset(buf, 0, sizeof(buf));
    buf[0] = '5';
    memset(buf + 1, '0', 300);
    strcat(buf, "e-300");
    assert_int_equal(kgpu_quantity_value(buf, &v, &err), 0);
    assert_int_equal(v, 5);
    /* The message quotes a bounded prefix of a long bad value. */
    memset(buf, 'x', 300);
    buf[300] = '\0';
    assert_int_equal(kgpu_quantity_milli(buf, &v, &err), KGPU_EPARSE);
    assert_true(strlen(err.msg) < 120);
    assert_int_equal(kgpu_quantity_milli(NULL, &v, &err), KGPU_EINVAL);
}

/* ---- containers and resources ---- */

/* A pod template (a Job's, a Workload's pod set's) has no name: read as "template", unchanged. */
static void test_pod_from_template(void **state)
{
    (void)state;
    kgpu_pod pod;
    kgpu_error err;
    json_t *t = json_loads(
        "{\"metadata\":{\"annotations\":{\"kgpu.io/gpu-type\":\"*A100*\"}},"
        "\"spec\":{\"containers\":[{\"name\":\"m\",\"resources\":{\"limits\":"
        "{\"nvidia.com/gpu\":\"2\"}}}]}}",
        0, NULL);
    assert_non_null(t);
    char *before = json_dumps(t, JSON_SORT_KEYS);
    assert_int_equal(kgpu_pod_from_json(t, 1024, &pod, &err), KGPU_EPARSE); /* needs a name */
    assert_int_equal(kgpu_pod_from_template(t, 1024, &pod, &err), 0);
    assert_string_equal(pod.name, "template");
    assert_int_equal(pod.nparts, 1);
    assert_int_equal(pod.parts[0].req.gpu_count, 2);
    assert_int_equal(pod.nallow, 1);
    assert_string_equal(pod.allow[0], "*A100*");
    char *after = json_dumps(t, JSON_SORT_KEYS);
    assert_string_equal(before, after); /* the caller's object is not changed */
    free(before);
    free(after);
    /* No metadata at all; and a named Pod keeps its name. */
    json_object_del(t, "metadata");
    assert_int_equal(kgpu_pod_from_template(t, 1024, &pod, &err), 0);
    assert_string_equal(pod.name, "template");
    json_object_set_new(t, "metadata", json_pack("{s:s}", "name", "p1"));
    assert_int_equal(kgpu_pod_from_template(t, 1024, &pod, &err), 0);
    assert_string_equal(pod.name, "p1");
    json_t *not_obj = json_integer(3);
    assert_int_equal(kgpu_pod_from_template(not_obj, 1024, &pod, &err), KGPU_EPARSE);
    json_decref(not_obj);
    json_decref(t);
}

static void test_pod_without_gpus(void **state)
{
    kgpu_pod *pod = new_pod();
    kgpu_error err;
    assert_int_equal(
        pod_q("{'metadata':{'name':'web','namespace':'team','uid':'u-1'},"
              "'spec':{'nodeName':'n3','containers':[{'name':'c','resources':{'requests':"
              "{'cpu':'250m','memory':'64Mi'}}}]},'status':{'phase':'Running'}}",
              GIB_MIB, pod, &err),
        0);
    assert_string_equal(pod->ns, "team");
    assert_string_equal(pod->name, "web");
    assert_string_equal(pod->uid, "u-1");
    assert_string_equal(pod->node, "n3");
    assert_string_equal(pod->phase, "Running");
    assert_false(pod->terminal);
    assert_false(pod->has_assignment);
    assert_int_equal(pod->nparts, 0);
    assert_int_equal(pod->cpu_milli, 250);
    assert_int_equal(pod->memory_mib, 64);
    assert_string_equal(pod->policy, "");
    assert_int_equal(pod->nallow, 0);
    assert_int_equal(pod->nexclude, 0);
    /* No namespace means the default one; no containers with resources is fine. */
    assert_int_equal(
        pod_q("{'metadata':{'name':'y'},'spec':{'containers':[{'name':'c'}]}}", GIB_MIB, pod, &err),
        0);
    assert_string_equal(pod->ns, "default");
    assert_string_equal(pod->node, "");
    assert_string_equal(pod->phase, "");
    assert_int_equal(pod->cpu_milli, 0);
    assert_int_equal(pod->memory_mib, 0);
    free(pod);
}

static void test_whole_gpus(void **state)
{
    kgpu_pod *pod = new_pod();
    kgpu_error err;
    assert_int_equal(containers_q("{'name':'main','resources':{'limits':{'nvidia.com/gpu':'2',"
                                  "'cpu':'4','memory':'8Gi'}}}",
                                  pod, &err),
                     0);
    assert_int_equal(pod->nparts, 1);
    const kgpu_part *p = &pod->parts[0];
    assert_string_equal(p->container, "main");
    assert_false(p->init);
    assert_int_equal(p->req.gpu_count, 2);
    assert_int_equal(p->req.gpu_milli, 1000);
    assert_int_equal(p->req.gpu_memory_mib, 0);
    assert_true(p->req.exclusive);
    assert_int_equal(p->req.shape, -1);
    assert_int_equal(p->req.models, 0);
    /* Requests default to limits. */
    assert_int_equal(p->req.cpu_milli, 4000);
    assert_int_equal(p->req.memory_mib, 8192);
    assert_int_equal(kgpu_request_validate(&p->req, &err), 0);
    /* An integer JSON value is accepted like Kubernetes does; requests count when no limit. */
    assert_int_equal(
        containers_q("{'name':'main','resources':{'requests':{'nvidia.com/gpu':1}}}", pod, &err),
        0);
    assert_int_equal(pod->parts[0].req.gpu_count, 1);
    /* A limit wins over a request. */
    assert_int_equal(containers_q("{'name':'main','resources':{'limits':{'nvidia.com/gpu':'3'},"
                                  "'requests':{'nvidia.com/gpu':'1'}}}",
                                  pod, &err),
                     0);
    assert_int_equal(pod->parts[0].req.gpu_count, 3);
    /* Zero is the same as absent. */
    assert_int_equal(
        containers_q("{'name':'main','resources':{'limits':{'nvidia.com/gpu':'0'}}}", pod, &err),
        0);
    assert_int_equal(pod->nparts, 0);
    free(pod);
}

static void test_shares(void **state)
{
    kgpu_pod *pod = new_pod();
    kgpu_error err;
    /* Memory only. */
    assert_int_equal(
        containers_q("{'name':'a','resources':{'limits':{'kgpu.io/gpu-mem':'4'}}}", pod, &err), 0);
    assert_int_equal(pod->nparts, 1);
    kgpu_request *r = &pod->parts[0].req;
    assert_int_equal(r->gpu_count, 1);
    assert_int_equal(r->gpu_memory_mib, 4096);
    assert_int_equal(r->gpu_milli, 0);
    assert_false(r->exclusive);
    assert_int_equal(kgpu_request_validate(r, &err), 0);
    /* Memory, compute and a spread over two GPUs. */
    assert_int_equal(containers_q("{'name':'a','resources':{'limits':{'kgpu.io/gpu-mem':'8',"
                                  "'kgpu.io/gpu-core':'50','kgpu.io/gpu-count':'2'}}}",
                                  pod, &err),
                     0);
    r = &pod->parts[0].req;
    assert_int_equal(r->gpu_count, 2);
    assert_int_equal(r->gpu_memory_mib, 4096);
    assert_int_equal(r->gpu_milli, 500);
    assert_false(r->exclusive);
    assert_int_equal(kgpu_request_validate(r, &err), 0);
    /* Compute only: no memory share. */
    assert_int_equal(
        containers_q("{'name':'a','resources':{'limits':{'kgpu.io/gpu-core':'30'}}}", pod, &err),
        0);
    r = &pod->parts[0].req;
    assert_int_equal(r->gpu_count, 1);
    assert_int_equal(r->gpu_memory_mib, 0);
    assert_int_equal(r->gpu_milli, 300);
    assert_int_equal(kgpu_request_validate(r, &err), 0);
    /* 100 percent is still a share, not a whole GPU. */
    assert_int_equal(
        containers_q("{'name':'a','resources':{'limits':{'kgpu.io/gpu-core':'100'}}}", pod, &err),
        0);
    assert_int_equal(pod->parts[0].req.gpu_milli, 1000);
    assert_false(pod->parts[0].req.exclusive);
    /* Compute spread over 32 GPUs is the most. */
    assert_int_equal(containers_q("{'name':'a','resources':{'limits':{'kgpu.io/gpu-core':'10',"
                                  "'kgpu.io/gpu-count':'32'}}}",
                                  pod, &err),
                     0);
    assert_int_equal(pod->parts[0].req.gpu_count, 32);
    free(pod);
}

static void test_mem_alias(void **state)
{
    kgpu_pod *pod = new_pod();
    kgpu_error err;
    assert_int_equal(
        containers_q("{'name':'a','resources':{'limits':{'aliyun.com/gpu-mem':'3'}}}", pod, &err),
        0);
    assert_int_equal(pod->parts[0].req.gpu_memory_mib, 3072);
    assert_int_equal(containers_q("{'name':'a','resources':{'limits':{'aliyun.com/gpu-mem':'3',"
                                  "'kgpu.io/gpu-mem':'3'}}}",
                                  pod, &err),
                     0);
    assert_int_equal(pod->parts[0].req.gpu_memory_mib, 3072);
    assert_int_equal(containers_q("{'name':'a','resources':{'limits':{'aliyun.com/gpu-mem':'3',"
                                  "'kgpu.io/gpu-mem':'4'}}}",
                                  pod, &err),
                     KGPU_EINVAL);
    assert_contains(err.msg, "container a:");
    assert_contains(err.msg, "differ");
    free(pod);
}

static void test_divisibility(void **state)
{
    kgpu_pod *pod = new_pod();
    kgpu_error err;
    /* 3 units of 1 MiB cannot be split over 2 GPUs... */
    assert_int_equal(pod_q("{'metadata':{'name':'x'},'spec':{'containers':[{'name':'a',"
                           "'resources':{'limits':{'kgpu.io/gpu-mem':'3','kgpu.io/gpu-count':'2'"
                           "}}}]}}",
                           1, pod, &err),
                     KGPU_EINVAL);
    assert_contains(err.msg, "container a:");
    assert_contains(err.msg, "kgpu.io/gpu-count 2");
    /* ...but 3 units of 1 GiB can. */
    assert_int_equal(pod_q("{'metadata':{'name':'x'},'spec':{'containers':[{'name':'a',"
                           "'resources':{'limits':{'kgpu.io/gpu-mem':'3','kgpu.io/gpu-count':'2'"
                           "}}}]}}",
                           GIB_MIB, pod, &err),
                     0);
    assert_int_equal(pod->parts[0].req.gpu_memory_mib, 1536);
    assert_int_equal(pod->parts[0].req.gpu_count, 2);
    /* The unit must be positive. */
    assert_int_equal(pod_q("{'metadata':{'name':'x'},'spec':{'containers':[]}}", 0, pod, &err),
                     KGPU_EINVAL);
    free(pod);
}

typedef struct bad_container {
    const char *container;
    int rc;
    const char *msg;
} bad_container;

static void test_container_rules(void **state)
{
    static const bad_container cases[] = {
        {"{'name':'main','resources':{'limits':{'nvidia.com/gpu':'1','kgpu.io/gpu-mem':'2'}}}",
         KGPU_EINVAL, "container main: nvidia.com/gpu cannot be combined"},
        {"{'name':'main','resources':{'limits':{'nvidia.com/gpu':'1','kgpu.io/gpu-core':'2'}}}",
         KGPU_EINVAL, "container main: nvidia.com/gpu cannot be combined"},
        {"{'name':'main','resources':{'limits':{'nvidia.com/gpu':'1','kgpu.io/gpu-count':'2'}}}",
         KGPU_EINVAL, "container main: nvidia.com/gpu cannot be combined"},
        {"{'name':'main','resources':{'limits':{'kgpu.io/gpu-core':'150'}}}", KGPU_ERANGE,
         "container main: kgpu.io/gpu-core 150 outside 1..100"},
        {"{'name':'main','resources':{'limits':{'kgpu.io/gpu-count':'2'}}}", KGPU_EINVAL,
         "container main: kgpu.io/gpu-count without"},
        {"{'name':'main','resources':{'limits':{'nvidia.com/gpu':'33'}}}", KGPU_ERANGE,
         "container main: nvidia.com/gpu 33"},
        {"{'name':'main','resources':{'limits':{'kgpu.io/gpu-mem':'1','kgpu.io/gpu-count':'33'}}}",
         KGPU_ERANGE, "container main: kgpu.io/gpu-count 33"},
        {"{'name':'a','resources':{'limits':{'nvidia.com/gpu':'1.5'}}}", KGPU_EINVAL,
         "container a: nvidia.com/gpu '1.5' is not a whole number"},
        {"{'name':'a','resources':{'limits':{'kgpu.io/gpu-mem':'500m'}}}", KGPU_EINVAL,
         "container a: kgpu.io/gpu-mem '500m' is not a whole number"},
        {"{'name':'a','resources':{'limits':{'kgpu.io/gpu-mem':'-1'}}}", KGPU_ERANGE,
         "container a: resources.limits.kgpu.io/gpu-mem: quantity '-1' is negative"},
        {"{'name':'a','resources':{'limits':{'nvidia.com/gpu':'1e30'}}}", KGPU_ERANGE,
         "container a: resources.limits.nvidia.com/gpu"},
        {"{'name':'a','resources':{'limits':{'kgpu.io/gpu-mem':'9223372036854775'}}}", KGPU_ERANGE,
         "overflows"},
        {"{'name':'a','resources':{'requests':{'cpu':'lots'}}}", KGPU_EPARSE,
         "container a: resources.requests.cpu: quantity 'lots' is not a number"},
        {"{'name':'a','resources':{'limits':{'memory':'1Gb'}}}", KGPU_EPARSE,
         "container a: resources.limits.memory"},
        {"{'name':'a','resources':{'limits':{'memory':'7Ei'}}},"
         "{'name':'b','resources':{'limits':{'memory':'7Ei'}}}",
         KGPU_ERANGE, "pod default/x: memory requests overflow"},
    };
    kgpu_pod *pod = new_pod();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kgpu_error err;
        int rc = containers_q(cases[i].container, pod, &err);
        if (rc != cases[i].rc || strstr(err.msg, cases[i].msg) == NULL)
            fail_msg("case %zu: rc %d '%s', want rc %d '%s'", i, rc, err.msg, cases[i].rc,
                     cases[i].msg);
    }
    free(pod);
}

static void test_multi_container(void **state)
{
    kgpu_pod *pod = new_pod();
    kgpu_error err;
    assert_int_equal(
        containers_q("{'name':'train','resources':{'limits':{'nvidia.com/gpu':'2','cpu':'2'}}},"
                     "{'name':'sidecar','resources':{'requests':{'cpu':'100m','memory':'10Mi'}}},"
                     "{'name':'infer','resources':{'limits':{'kgpu.io/gpu-mem':'2',"
                     "'kgpu.io/gpu-core':'20'},'requests':{'cpu':'500m','memory':'1Gi'}}}",
                     pod, &err),
        0);
    assert_int_equal(pod->nparts, 2);
    assert_string_equal(pod->parts[0].container, "train");
    assert_true(pod->parts[0].req.exclusive);
    assert_int_equal(pod->parts[0].req.gpu_count, 2);
    assert_string_equal(pod->parts[1].container, "infer");
    assert_false(pod->parts[1].req.exclusive);
    assert_int_equal(pod->parts[1].req.gpu_memory_mib, 2048);
    assert_int_equal(pod->parts[1].req.gpu_milli, 200);
    /* CPU and memory of the whole pod ride on the first part only. */
    assert_int_equal(pod->cpu_milli, 2600);
    assert_int_equal(pod->memory_mib, 1034);
    assert_int_equal(pod->parts[0].req.cpu_milli, 2600);
    assert_int_equal(pod->parts[0].req.memory_mib, 1034);
    assert_int_equal(pod->parts[1].req.cpu_milli, 0);
    assert_int_equal(pod->parts[1].req.memory_mib, 0);
    for (int i = 0; i < pod->nparts; i++)
        assert_int_equal(kgpu_request_validate(&pod->parts[i].req, &err), 0);

    /* At most KGPU_MAX_PARTS GPU containers. */
    char buf[4096] = "";
    for (int i = 0; i <= KGPU_MAX_PARTS; i++) {
        char one[128];
        snprintf(one, sizeof(one), "%s{'name':'c%d','resources':{'limits':{'nvidia.com/gpu':'1'}}}",
                 i ? "," : "", i);
        strcat(buf, one);
    }
    assert_int_equal(containers_q(buf, pod, &err), KGPU_ERANGE);
    assert_contains(err.msg, "more than 16");
    free(pod);
}

/* A pod with one app container `app` and one init container `init` (resources objects). */
static int init_pod(const char *app, const char *init, kgpu_pod *pod, kgpu_error *err)
{
    char buf[4096];
    snprintf(buf, sizeof(buf),
             "{'metadata':{'name':'x'},'spec':{'containers':[{'name':'app','resources':%s}],"
             "'initContainers':[{'name':'setup','resources':%s}]}}",
             app, init);
    return pod_q(buf, GIB_MIB, pod, err);
}

static void test_init_containers(void **state)
{
    kgpu_pod *pod = new_pod();
    kgpu_error err;
    /* Covered: the app container's GPUs are at least as large. */
    assert_int_equal(init_pod("{'limits':{'nvidia.com/gpu':'2'}}",
                              "{'limits':{'nvidia.com/gpu':'1'}}", pod, &err),
                     0);
    assert_int_equal(pod->nparts, 1);
    assert_false(pod->parts[0].init);
    assert_int_equal(init_pod("{'limits':{'kgpu.io/gpu-mem':'8','kgpu.io/gpu-core':'50'}}",
                              "{'limits':{'kgpu.io/gpu-mem':'4','kgpu.io/gpu-core':'50'}}", pod,
                              &err),
                     0);
    assert_int_equal(pod->nparts, 1);
    /* Not covered: other kind, more GPUs, more memory or more compute per GPU. */
    static const char *const uncovered[][2] = {
        {"{'limits':{'kgpu.io/gpu-mem':'8'}}", "{'limits':{'nvidia.com/gpu':'1'}}"},
        {"{'limits':{'nvidia.com/gpu':'1'}}", "{'limits':{'kgpu.io/gpu-mem':'1'}}"},
        {"{'limits':{'nvidia.com/gpu':'1'}}", "{'limits':{'nvidia.com/gpu':'2'}}"},
        {"{'limits':{'kgpu.io/gpu-mem':'8'}}", "{'limits':{'kgpu.io/gpu-mem':'16'}}"},
        {"{'limits':{'kgpu.io/gpu-mem':'8'}}",
         "{'limits':{'kgpu.io/gpu-mem':'2','kgpu.io/gpu-count':'2'}}"},
        {"{'limits':{'kgpu.io/gpu-mem':'8','kgpu.io/gpu-core':'10'}}",
         "{'limits':{'kgpu.io/gpu-core':'20'}}"},
        {"{}", "{'limits':{'kgpu.io/gpu-core':'20'}}"},
    };
    for (size_t i = 0; i < sizeof(uncovered) / sizeof(uncovered[0]); i++) {
        assert_int_equal(init_pod(uncovered[i][0], uncovered[i][1], pod, &err), 0);
        int want = strcmp(uncovered[i][0], "{}") == 0 ? 1 : 2;
        if (pod->nparts != want)
            fail_msg("case %zu: %d parts, want %d", i, pod->nparts, want);
        const kgpu_part *p = &pod->parts[want - 1];
        assert_string_equal(p->container, "setup");
        assert_true(p->init);
        assert_int_equal(kgpu_request_validate(&p->req, &err), 0);
    }
    /* The init part alone gets the pod's CPU and memory. */
    assert_int_equal(init_pod("{'requests':{'cpu':'1'}}",
                              "{'limits':{'nvidia.com/gpu':'1','cpu':'2','memory':'1Gi'}}", pod,
                              &err),
                     0);
    assert_int_equal(pod->nparts, 1);
    assert_true(pod->parts[0].init);
    assert_int_equal(pod->parts[0].req.cpu_milli, 2000);
    assert_int_equal(pod->parts[0].req.memory_mib, 1024);
    /* Errors in init containers say so. */
    assert_int_equal(init_pod("{}", "{'limits':{'kgpu.io/gpu-core':'101'}}", pod, &err),
                     KGPU_ERANGE);
    assert_contains(err.msg, "init container setup: kgpu.io/gpu-core 101");
    free(pod);
}

static void test_effective_cpu_memory(void **state)
{
    kgpu_pod *pod = new_pod();
    kgpu_error err;
    /* Sum of app containers wins over the largest init container. */
    assert_int_equal(pod_q("{'metadata':{'name':'x'},'spec':{'containers':["
                           "{'name':'a','resources':{'requests':{'cpu':'500m','memory':'1Gi'}}},"
                           "{'name':'b','resources':{'requests':{'cpu':'250m','memory':'512Mi'}}}],"
                           "'initContainers':[{'name':'i','resources':{'requests':{'cpu':'600m',"
                           "'memory':'1Gi'}}}]}}",
                           GIB_MIB, pod, &err),
                     0);
    assert_int_equal(pod->cpu_milli, 750);
    assert_int_equal(pod->memory_mib, 1536);
    /* The largest init container wins, plus overhead; limits stand in for requests. */
    assert_int_equal(
        pod_q("{'metadata':{'name':'x'},'spec':{'containers':["
              "{'name':'a','resources':{'requests':{'cpu':'500m','memory':'1Gi'}}},"
              "{'name':'b','resources':{'limits':{'cpu':'250m','memory':'512Mi'}}}],"
              "'initContainers':[{'name':'i1','resources':{'limits':{'cpu':'1'}}},"
              "{'name':'i2','resources':{'requests':{'memory':'2Gi'},'limits':{'memory':'3Gi'}}}],"
              "'overhead':{'cpu':'100m','memory':'10Mi'}}}",
              GIB_MIB, pod, &err),
        0);
    assert_int_equal(pod->cpu_milli, 1100);
    assert_int_equal(pod->memory_mib, 2058);
    /* Memory in bytes is rounded up to MiB once, after summing. */
    assert_int_equal(pod_q("{'metadata':{'name':'x'},'spec':{'containers':["
                           "{'name':'a','resources':{'requests':{'memory':'524288'}}},"
                           "{'name':'b','resources':{'requests':{'memory':'524289'}}},"
                           "{'name':'g','resources':{'limits':{'nvidia.com/gpu':'1'}}}]}}",
                           GIB_MIB, pod, &err),
                     0);
    assert_int_equal(pod->memory_mib, 2);
    assert_int_equal(pod->parts[0].req.memory_mib, 2);
    free(pod);
}

/* kgpu.io/restartable opts a pod in to being moved: exactly "true", nothing else. */
static void test_restartable_only_exact_true(void **state)
{
    (void)state;
    static const struct {
        const char *value;
        bool restartable;
    } cases[] = {{"'true'", true}, {"'True'", false}, {"'yes'", false}, {"'1'", false},
                 {"'true '", false}, {"true", false}, {"'tru'", false}};
    kgpu_pod *pod = new_pod();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text),
                 "{'metadata':{'name':'x','annotations':{'kgpu.io/restartable':%s}},"
                 "'spec':{'containers':[]}}",
                 cases[i].value);
        kgpu_error err;
        int rc = pod_q(text, GIB_MIB, pod, &err);
        if (rc != 0) /* a non-string is no error: the pod simply did not opt in */
            fail_msg("case %zu (%s): %s", i, cases[i].value, err.msg);
        assert_int_equal(pod->restartable, cases[i].restartable);
    }
    free(pod);
}

static void test_annotations(void **state)
{
    kgpu_pod *pod = new_pod();
    kgpu_error err;
    assert_int_equal(
        pod_q("{'metadata':{'name':'x','annotations':{'kgpu.io/gpu-type':' A100*, ,V100* ,',"
              "'kgpu.io/gpu-type-exclude':'T4','kgpu.io/policy':'fgd','other':'1'}},"
              "'spec':{'containers':[{'name':'a','resources':{'limits':{'kgpu.io/gpu-mem':'1'}}},"
              "{'name':'b','resources':{'limits':{'nvidia.com/gpu':'1'}}}]}}",
              GIB_MIB, pod, &err),
        0);
    assert_int_equal(pod->nallow, 2);
    assert_string_equal(pod->allow[0], "A100*");
    assert_string_equal(pod->allow[1], "V100*");
    assert_ptr_equal(pod->allow[0], pod->allow_buf[0]);
    assert_int_equal(pod->nexclude, 1);
    assert_string_equal(pod->exclude[0], "T4");
    assert_string_equal(pod->policy, "fgd");
    assert_false(pod->has_assignment);
    assert_false(pod->restartable);
    for (int i = 0; i < pod->nparts; i++) {
        assert_ptr_equal(pod->parts[i].req.allow, pod->allow);
        assert_int_equal(pod->parts[i].req.nallow, 2);
        assert_ptr_equal(pod->parts[i].req.exclude, pod->exclude);
        assert_int_equal(pod->parts[i].req.nexclude, 1);
    }
    /* The globs compile against a cluster's models. */
    kgpu_cluster *c = kgpu_cluster_new();
    assert_non_null(c);
    kgpu_gpu_spec g[3] = {{0, "u0", "A100-SXM4", 40960, -1, true},
                          {1, "u1", "T4", 15360, -1, true},
                          {2, "u2", "V100", 16384, -1, true}};
    kgpu_node_spec ns = {.name = "n", .cpu_milli = 1000, .memory_mib = 1000, .gpus = g, .ngpus = 3};
    assert_true(kgpu_cluster_add_node(c, &ns, &err) >= 0);
    assert_int_equal(kgpu_request_compile(c, &pod->parts[0].req, &err), 0);
    assert_int_equal(pod->parts[0].req.models, (1ULL << 0) | (1ULL << 2));
    kgpu_cluster_free(c);

    /* Empty lists, and an assignment already there. */
    assert_int_equal(pod_q("{'metadata':{'name':'x','annotations':{'kgpu.io/gpu-type':' , ',"
                           "'kgpu.io/assignment':'[]'}},'spec':{'containers':[]}}",
                           GIB_MIB, pod, &err),
                     0);
    assert_int_equal(pod->nallow, 0);
    assert_true(pod->has_assignment);

    /* Sixteen patterns fit, seventeen do not; a pattern must be shorter than 128. */
    char many[256] = "";
    for (int i = 0; i < KGPU_MAX_GLOBS + 1; i++)
        strcat(many, i ? ",g" : "g");
    char buf[1024];
    snprintf(buf, sizeof(buf),
             "{'metadata':{'name':'x','annotations':{'kgpu.io/gpu-type-exclude':'%s'}},"
             "'spec':{'containers':[]}}",
             many);
    assert_int_equal(pod_q(buf, GIB_MIB, pod, &err), KGPU_EINVAL);
    assert_contains(err.msg, "pod default/x: kgpu.io/gpu-type-exclude has more than 8");
    many[strlen(many) - 2] = '\0';
    snprintf(buf, sizeof(buf),
             "{'metadata':{'name':'x','annotations':{'kgpu.io/gpu-type-exclude':'%s'}},"
             "'spec':{'containers':[]}}",
             many);
    assert_int_equal(pod_q(buf, GIB_MIB, pod, &err), 0);
    assert_int_equal(pod->nexclude, KGPU_MAX_GLOBS);
    char longglob[KGPU_GLOB_MAX + 1];
    memset(longglob, 'a', KGPU_GLOB_MAX);
    longglob[KGPU_GLOB_MAX] = '\0';
    snprintf(buf, sizeof(buf),
             "{'metadata':{'name':'x','annotations':{'kgpu.io/gpu-type':'%s'}},"
             "'spec':{'containers':[]}}",
             longglob);
    assert_int_equal(pod_q(buf, GIB_MIB, pod, &err), KGPU_EINVAL);
    assert_contains(err.msg, "longer than 127");
    longglob[KGPU_GLOB_MAX - 1] = '\0';
    snprintf(buf, sizeof(buf),
             "{'metadata':{'name':'x','annotations':{'kgpu.io/gpu-type':'%s'}},"
             "'spec':{'containers':[]}}",
             longglob);
    assert_int_equal(pod_q(buf, GIB_MIB, pod, &err), 0);
    assert_int_equal(strlen(pod->allow[0]), KGPU_GLOB_MAX - 1);
    free(pod);
}

static void test_terminal(void **state)
{
    static const struct {
        const char *pod;
        bool terminal;
    } cases[] = {
        {"{'metadata':{'name':'x'},'spec':{'containers':[]},'status':{'phase':'Succeeded'}}", true},
        {"{'metadata':{'name':'x'},'spec':{'containers':[]},'status':{'phase':'Failed'}}", true},
        {"{'metadata':{'name':'x'},'spec':{'containers':[]},'status':{'phase':'Running'}}", false},
        {"{'metadata':{'name':'x'},'spec':{'containers':[]},'status':{'phase':'Pending'}}", false},
        {"{'metadata':{'name':'x'},'spec':{'containers':[]},'status':{}}", false},
        {"{'metadata':{'name':'x','deletionTimestamp':'2024-01-01T00:00:00Z'},"
         "'spec':{'containers':[]},'status':{'phase':'Running'}}",
         true},
        {"{'metadata':{'name':'x','deletionTimestamp':null},'spec':{'containers':[]}}", false},
    };
    kgpu_pod *pod = new_pod();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kgpu_error err;
        assert_int_equal(pod_q(cases[i].pod, GIB_MIB, pod, &err), 0);
        if (pod->terminal != cases[i].terminal)
            fail_msg("case %zu: terminal %d", i, pod->terminal);
    }
    free(pod);
}

static void test_malformed_pods(void **state)
{
    static const struct {
        const char *pod;
        const char *msg;
    } cases[] = {
        {"[]", "pod: not a JSON object"},
        {"'pod'", "pod: not a JSON object"},
        {"{}", "pod: metadata"},
        {"{'metadata':5}", "pod: metadata"},
        {"{'metadata':{}}", "pod: metadata.name"},
        {"{'metadata':{'name':5}}", "pod: metadata.name is not a string"},
        {"{'metadata':{'name':''},'spec':{'containers':[]}}", "pod: metadata.name"},
        {"{'metadata':{'name':'x','namespace':[]}}", "pod: metadata.namespace"},
        {"{'metadata':{'name':'x','uid':7},'spec':{'containers':[]}}",
         "pod default/x: metadata.uid is not a string"},
        {"{'metadata':{'name':'x'}}", "pod default/x: spec"},
        {"{'metadata':{'name':'x'},'spec':[]}", "pod default/x: spec"},
        {"{'metadata':{'name':'x'},'spec':{}}", "pod default/x: spec.containers is not an array"},
        {"{'metadata':{'name':'x'},'spec':{'containers':{}}}",
         "pod default/x: spec.containers is not an array"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[5]}}", "spec.containers[0]"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[{}]}}", "spec.containers[0].name"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[{'name':1}]}}", "spec.containers[0].name"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[{'name':'a','resources':5}]}}",
         "container a: resources is not an object"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[{'name':'a','resources':{'limits':[]}}]}}",
         "container a: resources.limits is not an object"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[{'name':'a','resources':{'requests':'"
         "x'}}]}}",
         "container a: resources.requests is not an object"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[{'name':'a','resources':{'limits':{"
         "'nvidia.com/gpu':true}}}]}}",
         "container a: resources.limits.nvidia.com/gpu is not a string"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[{'name':'a','resources':{'limits':{"
         "'kgpu.io/gpu-mem':1.5}}}]}}",
         "container a: resources.limits.kgpu.io/gpu-mem is not a string"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[{'name':'a','resources':{'requests':{"
         "'cpu':{}}}}]}}",
         "container a: resources.requests.cpu is not a string"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[],'initContainers':{}}}",
         "pod default/x: spec.initContainers is not an array"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[],'initContainers':[[]]}}",
         "spec.initContainers[0] is not an object"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[],'initContainers':[{'name':'i',"
         "'resources':{'limits':{'memory':[]}}}]}}",
         "init container i: resources.limits.memory is not a string"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[],'overhead':5}}",
         "pod default/x: spec.overhead is not an object"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[],'overhead':{'cpu':[]}}}",
         "pod default/x: spec.overhead.cpu is not a string"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[],'overhead':{'memory':'x'}}}",
         "pod default/x: spec.overhead.memory: quantity 'x'"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[],'nodeName':3}}",
         "pod default/x: spec.nodeName is not a string"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[]},'status':3}",
         "pod default/x: status is not an object"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[]},'status':{'phase':3}}",
         "pod default/x: status.phase is not a string"},
        {"{'metadata':{'name':'x'},'spec':{'containers':[]},'status':{'phase':'"
         "ReallyQuiteALongPhase'}}",
         "pod default/x: status.phase 'ReallyQuiteALongPhase' is longer than 15"},
        {"{'metadata':{'name':'x','annotations':[]},'spec':{'containers':[]}}",
         "pod default/x: metadata.annotations is not an object"},
        {"{'metadata':{'name':'x','annotations':{'kgpu.io/gpu-type':5}},'spec':{'containers':[]}}",
         "pod default/x: annotation kgpu.io/gpu-type is not a string"},
        {"{'metadata':{'name':'x','annotations':{'kgpu.io/gpu-type-exclude':[]}},"
         "'spec':{'containers':[]}}",
         "pod default/x: annotation kgpu.io/gpu-type-exclude is not a string"},
        {"{'metadata':{'name':'x','annotations':{'kgpu.io/policy':{}}},'spec':{'containers':[]}}",
         "pod default/x: annotation kgpu.io/policy is not a string"},
        {"{'metadata':{'name':'x','annotations':{'kgpu.io/policy':"
         "'a-policy-name-that-is-far-too-long'}},'spec':{'containers':[]}}",
         "pod default/x: annotation kgpu.io/policy"},
        {"{'metadata':{'name':'x','annotations':{'kgpu.io/assignment':false}},"
         "'spec':{'containers':[]}}",
         "pod default/x: annotation kgpu.io/assignment is not a string"},
    };
    kgpu_pod *pod = new_pod();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kgpu_error err;
        int rc = pod_q(cases[i].pod, GIB_MIB, pod, &err);
        if (rc == 0 || strstr(err.msg, cases[i].msg) == NULL)
            fail_msg("case %zu: rc %d '%s', want an error with '%s'", i, rc, err.msg, cases[i].msg);
    }
    /* Too long a name or uid. */
    char name[KGPU_NAME_MAX + 2];
    memset(name, 'n', sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    char buf[1024];
    snprintf(buf, sizeof(buf), "{'metadata':{'name':'%s'},'spec':{'containers':[]}}", name);
    kgpu_error err;
    assert_int_not_equal(pod_q(buf, GIB_MIB, pod, &err), 0);
    snprintf(buf, sizeof(buf), "{'metadata':{'name':'x'},'spec':{'containers':[{'name':'%s'}]}}",
             name);
    assert_int_not_equal(pod_q(buf, GIB_MIB, pod, &err), 0);
    name[KGPU_NAME_MAX] = '\0';
    char label[64];
    snprintf(label, sizeof(label), "%.63s", name); /* container names are DNS labels */
    snprintf(buf, sizeof(buf),
             "{'metadata':{'name':'%s'},'spec':{'containers':[{'name':'%s','resources':{'limits'"
             ":{'nvidia.com/gpu':'1'}}}]}}",
             name, label);
    assert_int_equal(pod_q(buf, GIB_MIB, pod, &err), 0);
    assert_string_equal(pod->parts[0].container, label);
    snprintf(buf, sizeof(buf),
             "{'metadata':{'name':'x'},'spec':{'containers':[{'name':'%.64s','resources':{'limits'"
             ":{'nvidia.com/gpu':'1'}}}]}}",
             name);
    assert_int_not_equal(pod_q(buf, GIB_MIB, pod, &err), 0); /* 64 characters: too long */
    snprintf(buf, sizeof(buf), "{'metadata':{'name':'x','uid':'%.64s'},'spec':{'containers':[]}}",
             name);
    assert_int_not_equal(pod_q(buf, GIB_MIB, pod, &err), 0);
    free(pod);
}

/* The trim keeps the annotations kgpu reads and nothing a tenant adds, whatever its prefix. */
static void test_trim_keeps_only_what_kgpu_reads(void **state)
{
    (void)state;
    char *big = malloc(1 << 20);
    assert_non_null(big);
    memset(big, 'x', (1 << 20) - 1);
    big[(1 << 20) - 1] = '\0';
    json_t *pod = json_q("{'metadata':{'name':'x','namespace':'t','uid':'u',"
                         "'labels':{'a':'b'},'annotations':{'kgpu.io/gpu-type':'A100*',"
                         "'kgpu.io/policy':'kgpu','other.io/x':'y'}},"
                         "'spec':{'nodeName':'n','containers':[{'name':'main','image':'i',"
                         "'resources':{'limits':{'kgpu.io/gpu-mem':'2'}}}]},"
                         "'status':{'phase':'Running','conditions':[]}}");
    json_t *ann = json_object_get(json_object_get(pod, "metadata"), "annotations");
    json_object_set_new(ann, "kgpu.io/junk", json_string(big));
    json_object_set_new(ann, "kgpu.io/assignment-copy", json_string(big));
    free(big);
    kgpu_pod before, after;
    kgpu_error err;
    assert_int_equal(kgpu_pod_from_json(pod, GIB_MIB, &before, &err), 0);
    kgpu_pod_json_trim(pod);
    ann = json_object_get(json_object_get(pod, "metadata"), "annotations");
    assert_int_equal(json_object_size(ann), 2);
    assert_non_null(json_object_get(ann, "kgpu.io/gpu-type"));
    assert_non_null(json_object_get(ann, "kgpu.io/policy"));
    assert_null(json_object_get(ann, "kgpu.io/restartable")); /* not set here */
    char *text = json_dumps(pod, JSON_COMPACT);
    assert_non_null(text);
    assert_true(strlen(text) < 1024); /* 2 MiB of a tenant's annotations gone */
    free(text);
    assert_int_equal(kgpu_pod_from_json(pod, GIB_MIB, &after, &err), 0);
    assert_int_equal(after.nallow, before.nallow);
    assert_string_equal(after.policy, before.policy);
    assert_int_equal(after.parts[0].req.gpu_memory_mib, before.parts[0].req.gpu_memory_mib);
    json_decref(pod);
}

/* ---- kgpu.io/assignment ---- */

static void test_assignment_round_trip(void **state)
{
    kgpu_error err;
    kgpu_cluster *c = kgpu_cluster_new();
    assert_non_null(c);
    /* Device indexes differ from positions, so the format must map one to the other. */
    kgpu_gpu_spec g[4] = {{4, "GPU-aaaa", "A100", 40960, 0, true},
                          {5, "GPU-bbbb", "A100", 40960, 0, true},
                          {6, "GPU-cccc", "A100", 40960, 1, true},
                          {7, "GPU-dddd", "A100", 40960, 1, true}};
    kgpu_node_spec ns = {
        .name = "n1", .cpu_milli = 32000, .memory_mib = 65536, .gpus = g, .ngpus = 4};
    int node = kgpu_cluster_add_node(c, &ns, &err);
    assert_true(node >= 0);

    kgpu_pod *pod = new_pod();
    assert_int_equal(
        containers_q("{'name':'train','resources':{'limits':{'nvidia.com/gpu':'1','cpu':'2'}}},"
                     "{'name':'infer','resources':{'limits':{'kgpu.io/gpu-mem':'8',"
                     "'kgpu.io/gpu-core':'25','kgpu.io/gpu-count':'2'}}}",
                     pod, &err),
        0);
    assert_int_equal(pod->nparts, 2);
    kgpu_assignment a[2];
    const int pos0[] = {2}, pos1[] = {0, 3};
    for (int i = 0; i < 2; i++)
        assert_int_equal(kgpu_request_compile(c, &pod->parts[i].req, &err), 0);
    assert_int_equal(kgpu_cluster_apply(c, &pod->parts[0].req, node, pos0, &a[0], &err), 0);
    assert_int_equal(kgpu_cluster_apply(c, &pod->parts[1].req, node, pos1, &a[1], &err), 0);

    const kgpu_node *n = kgpu_cluster_node(c, node);
    char *text = kgpu_assignment_format(n, pod->parts, a, 2);
    assert_non_null(text);
    assert_string_equal(
        text,
        "[{\"container\":\"train\",\"gpus\":[{\"index\":6,\"uuid\":\"GPU-cccc\",\"milli\":1000,"
        "\"memory_mib\":40960}],\"exclusive\":true},"
        "{\"container\":\"infer\",\"gpus\":[{\"index\":4,\"uuid\":\"GPU-aaaa\",\"milli\":250,"
        "\"memory_mib\":4096},{\"index\":7,\"uuid\":\"GPU-dddd\",\"milli\":250,"
        "\"memory_mib\":4096}],\"exclusive\":false}]");

    kgpu_assigned_part parsed[4];
    int np = -1;
    assert_int_equal(kgpu_assignment_parse(text, parsed, 4, &np, &err), 0);
    assert_int_equal(np, 2);
    for (int i = 0; i < 2; i++) {
        assert_string_equal(parsed[i].container, pod->parts[i].container);
        assert_int_equal(parsed[i].exclusive, a[i].exclusive);
        assert_int_equal(parsed[i].ngpus, a[i].ngpus);
        for (int j = 0; j < a[i].ngpus; j++) {
            const kgpu_gpu *gpu = &n->gpus[a[i].gpus[j]];
            assert_int_equal(parsed[i].gpus[j].index, gpu->index);
            assert_string_equal(parsed[i].gpus[j].uuid, gpu->uuid);
            assert_int_equal(parsed[i].gpus[j].milli, a[i].gpu_milli);
            assert_int_equal(parsed[i].gpus[j].memory_mib,
                             a[i].exclusive ? gpu->memory_mib : a[i].gpu_memory_mib);
        }
    }
    /* Fewer slots than parts is an error, not an overflow. */
    assert_int_equal(kgpu_assignment_parse(text, parsed, 1, &np, &err), KGPU_ERANGE);
    assert_int_equal(np, 0);
    free(text);

    /* A position the node does not have cannot be formatted. */
    kgpu_assignment bad = a[0];
    bad.gpus[0] = 9;
    assert_null(kgpu_assignment_format(n, pod->parts, &bad, 1));
    /* What kgpu wrote is within the pod's requests; a forged one is not (issue 24). */
    assert_int_equal(kgpu_assignment_within(pod, parsed, 2, &err), 0);
    assert_int_equal(kgpu_assignment_within(pod, parsed, 0, &err), 0);
    kgpu_assigned_part forged[2];
    memcpy(forged, parsed, sizeof(forged));
    forged[1].gpus[0].memory_mib = 40960; /* all of the GPU's memory for 8 units */
    assert_int_equal(kgpu_assignment_within(pod, forged, 2, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "container infer): GPU 4 gets 40960 MiB, the pod asks for 4096"));
    memcpy(forged, parsed, sizeof(forged));
    forged[1].gpus[1].milli = 1000; /* all of its compute */
    assert_int_equal(kgpu_assignment_within(pod, forged, 2, &err), KGPU_EINVAL);
    memcpy(forged, parsed, sizeof(forged));
    forged[1].exclusive = true; /* whole GPUs for a share */
    assert_int_equal(kgpu_assignment_within(pod, forged, 2, &err), KGPU_EINVAL);
    memcpy(forged, parsed, sizeof(forged));
    forged[0].ngpus = 2; /* two whole GPUs for one */
    forged[0].gpus[1] = forged[0].gpus[0];
    forged[0].gpus[1].index = 7;
    assert_int_equal(kgpu_assignment_within(pod, forged, 2, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "2 GPUs, the pod asks for 1"));
    memcpy(forged, parsed, sizeof(forged));
    snprintf(forged[1].container, sizeof(forged[1].container), "sidecar"); /* asks for none */
    assert_int_equal(kgpu_assignment_within(pod, forged, 2, &err), KGPU_EINVAL);
    memcpy(forged, parsed, sizeof(forged));
    forged[1] = forged[0]; /* one container's GPUs twice */
    assert_int_equal(kgpu_assignment_within(pod, forged, 2, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "listed twice"));
    /* Fewer GPUs than asked, or a share of a whole GPU, is not more than asked. */
    memcpy(forged, parsed, sizeof(forged));
    forged[1].ngpus = 1;
    forged[0].exclusive = false;
    forged[0].gpus[0].milli = 500;
    assert_int_equal(kgpu_assignment_within(pod, forged, 2, &err), 0);
    /* No parts: an empty array. */
    text = kgpu_assignment_format(n, pod->parts, a, 0);
    assert_non_null(text);
    assert_string_equal(text, "[]");
    assert_int_equal(kgpu_assignment_parse(text, parsed, 4, &np, &err), 0);
    assert_int_equal(np, 0);
    free(text);
    free(pod);
    kgpu_cluster_free(c);
}

static void test_assignment_parse_errors(void **state)
{
    static const struct {
        const char *text;
        int rc;
        const char *msg;
    } cases[] = {
        {"", KGPU_EPARSE, "assignment: invalid JSON"},
        {"[", KGPU_EPARSE, "assignment: invalid JSON"},
        {"{}", KGPU_EPARSE, "assignment: not a JSON array"},
        {"[5]", KGPU_EPARSE, "assignment[0]: not an object"},
        {"[{'gpus':[],'exclusive':false}]", KGPU_EPARSE, "assignment[0]: container missing"},
        {"[{'container':5,'gpus':[],'exclusive':false}]", KGPU_EPARSE,
         "assignment[0]: container missing or not a string"},
        {"[{'container':'','gpus':[],'exclusive':false}]", KGPU_EINVAL,
         "assignment[0]: container is empty"},
        {"[{'container':'a','gpus':[]}]", KGPU_EPARSE, "assignment[0]: exclusive missing"},
        {"[{'container':'a','gpus':[],'exclusive':'true'}]", KGPU_EPARSE,
         "assignment[0]: exclusive missing or not a boolean"},
        {"[{'container':'a','exclusive':true}]", KGPU_EPARSE, "assignment[0]: gpus missing"},
        {"[{'container':'a','gpus':{},'exclusive':true}]", KGPU_EPARSE,
         "assignment[0]: gpus missing or not an array"},
        {"[{'container':'a','gpus':[1],'exclusive':true}]", KGPU_EPARSE,
         "assignment[0].gpus[0]: not an object"},
        {"[{'container':'a','gpus':[{'uuid':'u','milli':1,'memory_mib':1}],'exclusive':true}]",
         KGPU_EPARSE, "assignment[0].gpus[0]: index missing or not an integer"},
        {"[{'container':'a','gpus':[{'index':'0','uuid':'u','milli':1,'memory_mib':1}],"
         "'exclusive':true}]",
         KGPU_EPARSE, "assignment[0].gpus[0]: index missing or not an integer"},
        {"[{'container':'a','gpus':[{'index':-1,'uuid':'u','milli':1,'memory_mib':1}],"
         "'exclusive':true}]",
         KGPU_ERANGE, "assignment[0].gpus[0]: index -1 outside 0..1023"},
        {"[{'container':'a','gpus':[{'index':1024,'uuid':'u','milli':1,'memory_mib':1}],"
         "'exclusive':true}]",
         KGPU_ERANGE, "index 1024 outside 0..1023"},
        {"[{'container':'a','gpus':[],'exclusive':true},{'container':'b','gpus':[{'index':0,"
         "'uuid':'u','milli':1200,'memory_mib':1}],'exclusive':false}]",
         KGPU_ERANGE, "assignment[1].gpus[0]: milli 1200 outside 0..1000"},
        {"[{'container':'a','gpus':[{'index':0,'uuid':'u','milli':1.5,'memory_mib':1}],"
         "'exclusive':true}]",
         KGPU_EPARSE, "milli missing or not an integer"},
        {"[{'container':'a','gpus':[{'index':0,'uuid':'u','milli':1,'memory_mib':-1}],"
         "'exclusive':true}]",
         KGPU_ERANGE, "assignment[0].gpus[0]: memory_mib -1 outside"},
        {"[{'container':'a','gpus':[{'index':0,'milli':1,'memory_mib':1}],'exclusive':true}]",
         KGPU_EPARSE, "assignment[0].gpus[0]: uuid missing"},
        {"[{'container':'a','gpus':[{'index':0,'uuid':'u','milli':1,'memory_mib':1},{'index':0,"
         "'uuid':'v','milli':1,'memory_mib':1}],'exclusive':true}]",
         KGPU_EINVAL, "assignment[0].gpus[1]: index 0 listed twice"},
        {"[{'container':'a','container':'b','gpus':[],'exclusive':true}]", KGPU_EPARSE,
         "assignment: invalid JSON"},
        {"[{'container':'a','gpus':[],'exclusive':true},{'container':'a','gpus':[],'exclusive':"
         "true},{'container':'a','gpus':[],'exclusive':true}]",
         KGPU_ERANGE, "assignment: 3 parts, at most 2"},
    };
    kgpu_assigned_part parts[2];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *text = strdup(cases[i].text);
        for (char *p = text; *p; p++)
            if (*p == '\'')
                *p = '"';
        kgpu_error err;
        kgpu_error_clear(&err);
        int n = -1;
        int rc = kgpu_assignment_parse(text, parts, 2, &n, &err);
        if (rc != cases[i].rc || strstr(err.msg, cases[i].msg) == NULL || n != 0)
            fail_msg("case %zu: rc %d n %d '%s', want rc %d '%s'", i, rc, n, err.msg, cases[i].rc,
                     cases[i].msg);
        free(text);
    }
    /* Too many GPUs, too long a uuid or container name. */
    char buf[8192] = "[{\"container\":\"a\",\"exclusive\":true,\"gpus\":[";
    for (int i = 0; i <= KGPU_MAX_GPUS_PER_NODE; i++) {
        char one[96];
        snprintf(one, sizeof(one), "%s{\"index\":%d,\"uuid\":\"\",\"milli\":0,\"memory_mib\":0}",
                 i ? "," : "", i);
        strcat(buf, one);
    }
    strcat(buf, "]}]");
    kgpu_error err;
    int n;
    assert_int_equal(kgpu_assignment_parse(buf, parts, 2, &n, &err), KGPU_ERANGE);
    assert_contains(err.msg, "assignment[0]: 33 GPUs, at most 32");
    char longs[300];
    memset(longs, 'u', KGPU_UUID_MAX);
    longs[KGPU_UUID_MAX] = '\0';
    snprintf(buf, sizeof(buf),
             "[{\"container\":\"a\",\"exclusive\":true,\"gpus\":[{\"index\":0,\"uuid\":\"%s\","
             "\"milli\":0,\"memory_mib\":0}]}]",
             longs);
    assert_int_equal(kgpu_assignment_parse(buf, parts, 2, &n, &err), KGPU_EINVAL);
    assert_contains(err.msg, "assignment[0].gpus[0]: uuid");
    memset(longs, 'c', KGPU_NAME_MAX + 1);
    longs[KGPU_NAME_MAX + 1] = '\0';
    snprintf(buf, sizeof(buf), "[{\"container\":\"%s\",\"exclusive\":true,\"gpus\":[]}]", longs);
    assert_int_equal(kgpu_assignment_parse(buf, parts, 2, &n, &err), KGPU_EINVAL);
    assert_contains(err.msg, "assignment[0]: container");
    assert_int_equal(kgpu_assignment_parse(NULL, parts, 2, &n, &err), KGPU_EINVAL);
    /* Unknown members are ignored, so a newer writer does not break an older reader. */
    assert_int_equal(kgpu_assignment_parse("[{\"container\":\"a\",\"exclusive\":false,\"gpus\":[],"
                                           "\"future\":1}]",
                                           parts, 2, &n, &err),
                     0);
    assert_int_equal(n, 1);
}

/* ---- kgpu.io/gpus ---- */

static void test_gpus_annotation_round_trip(void **state)
{
    kgpu_gpu_spec g[3] = {{0, "GPU-1", "NVIDIA A100-SXM4-40GB", 40960, 0, true},
                          {3, NULL, "T4", 15360, -1, false},
                          {1, "GPU-3", "V100", 0, 1, true}};
    char *text = kgpu_gpus_annotation_format(g, 3);
    assert_non_null(text);
    assert_string_equal(text,
                        "[{\"index\":0,\"uuid\":\"GPU-1\",\"model\":\"NVIDIA A100-SXM4-40GB\","
                        "\"memory_mib\":40960,\"numa\":0,\"healthy\":true},"
                        "{\"index\":3,\"uuid\":\"\",\"model\":\"T4\",\"memory_mib\":15360,"
                        "\"numa\":-1,\"healthy\":false},"
                        "{\"index\":1,\"uuid\":\"GPU-3\",\"model\":\"V100\",\"memory_mib\":0,"
                        "\"numa\":1,\"healthy\":true}]");
    kgpu_node_store *store = calloc(1, sizeof(*store));
    assert_non_null(store);
    int n = 0;
    kgpu_error err;
    assert_int_equal(kgpu_gpus_annotation_parse(text, store, &n, &err), 0);
    assert_int_equal(n, 3);
    for (int i = 0; i < 3; i++) {
        const kgpu_gpu_spec *p = &store->gpus[i];
        assert_int_equal(p->index, g[i].index);
        assert_string_equal(p->uuid, g[i].uuid ? g[i].uuid : "");
        assert_ptr_equal(p->uuid, store->uuid[i]);
        assert_string_equal(p->model, g[i].model);
        assert_ptr_equal(p->model, store->model[i]);
        assert_int_equal(p->memory_mib, g[i].memory_mib);
        assert_int_equal(p->numa, g[i].numa);
        assert_int_equal(p->healthy, g[i].healthy);
    }
    free(text);
    free(store);
}

static void test_gpus_annotation_errors(void **state)
{
    static const struct {
        const char *text;
        const char *msg;
    } cases[] = {
        {"nope", "kgpu.io/gpus: invalid JSON"},
        {"{}", "kgpu.io/gpus: not a JSON array"},
        {"[]", "kgpu.io/gpus: 0 GPUs, expected 1..32"},
        {"[3]", "kgpu.io/gpus[0]: not an object"},
        {"[{'uuid':'u','model':'m','memory_mib':1,'numa':0,'healthy':true}]",
         "kgpu.io/gpus[0]: index missing"},
        {"[{'index':0,'uuid':'u','model':'m','memory_mib':1,'numa':0,'healthy':true},"
         "{'index':0,'uuid':'v','model':'m','memory_mib':1,'numa':0,'healthy':true}]",
         "kgpu.io/gpus[1]: index 0 listed twice"},
        {"[{'index':0,'uuid':'u','model':'','memory_mib':1,'numa':0,'healthy':true}]",
         "kgpu.io/gpus[0]: model is empty"},
        {"[{'index':0,'uuid':'u','memory_mib':1,'numa':0,'healthy':true}]",
         "kgpu.io/gpus[0]: model missing"},
        {"[{'index':0,'uuid':7,'model':'m','memory_mib':1,'numa':0,'healthy':true}]",
         "kgpu.io/gpus[0]: uuid missing or not a string"},
        {"[{'index':0,'uuid':'u','model':'m','memory_mib':-1,'numa':0,'healthy':true}]",
         "kgpu.io/gpus[0]: memory_mib -1 outside"},
        {"[{'index':0,'uuid':'u','model':'m','memory_mib':1,'numa':-2,'healthy':true}]",
         "kgpu.io/gpus[0]: numa -2 outside -1..1023"},
        {"[{'index':0,'uuid':'u','model':'m','memory_mib':1,'numa':0}]",
         "kgpu.io/gpus[0]: healthy missing"},
        {"[{'index':0,'uuid':'u','model':'m','memory_mib':1,'numa':0,'healthy':1}]",
         "kgpu.io/gpus[0]: healthy missing or not a boolean"},
        {"[{'index':2000,'uuid':'u','model':'m','memory_mib':1,'numa':0,'healthy':true}]",
         "kgpu.io/gpus[0]: index 2000 outside 0..1023"},
        {"[{'index':0,'index':1,'uuid':'u','model':'m','memory_mib':1,'numa':0,'healthy':true}]",
         "kgpu.io/gpus: invalid JSON"},
    };
    kgpu_node_store *store = calloc(1, sizeof(*store));
    assert_non_null(store);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *text = strdup(cases[i].text);
        for (char *p = text; *p; p++)
            if (*p == '\'')
                *p = '"';
        kgpu_error err;
        kgpu_error_clear(&err);
        int n = -1;
        int rc = kgpu_gpus_annotation_parse(text, store, &n, &err);
        if (rc == 0 || strstr(err.msg, cases[i].msg) == NULL || n != 0)
            fail_msg("case %zu: rc %d n %d '%s', want '%s'", i, rc, n, err.msg, cases[i].msg);
        free(text);
    }
    /* 33 GPUs; a model name too long; a uuid too long. */
    kgpu_gpu_spec g[KGPU_MAX_GPUS_PER_NODE + 1];
    for (int i = 0; i <= KGPU_MAX_GPUS_PER_NODE; i++)
        g[i] = (kgpu_gpu_spec){i, "u", "m", 1, -1, true};
    char *text = kgpu_gpus_annotation_format(g, KGPU_MAX_GPUS_PER_NODE + 1);
    int n;
    kgpu_error err;
    assert_int_equal(kgpu_gpus_annotation_parse(text, store, &n, &err), KGPU_ERANGE);
    free(text);
    text = kgpu_gpus_annotation_format(g, KGPU_MAX_GPUS_PER_NODE);
    assert_int_equal(kgpu_gpus_annotation_parse(text, store, &n, &err), 0);
    assert_int_equal(n, KGPU_MAX_GPUS_PER_NODE);
    free(text);
    char longs[KGPU_UUID_MAX + 1];
    memset(longs, 'x', sizeof(longs) - 1);
    longs[sizeof(longs) - 1] = '\0';
    g[0].uuid = longs;
    text = kgpu_gpus_annotation_format(g, 1);
    assert_int_equal(kgpu_gpus_annotation_parse(text, store, &n, &err), KGPU_EINVAL);
    assert_contains(err.msg, "kgpu.io/gpus[0]: uuid");
    free(text);
    g[0].uuid = "u";
    longs[KGPU_MODEL_NAME_MAX] = '\0';
    g[0].model = longs;
    text = kgpu_gpus_annotation_format(g, 1);
    assert_int_equal(kgpu_gpus_annotation_parse(text, store, &n, &err), KGPU_EINVAL);
    assert_contains(err.msg, "kgpu.io/gpus[0]: model");
    free(text);
    free(store);
}

/* ---- v1 Node ---- */

static void test_node_annotation_mode(void **state)
{
    kgpu_node_store *store = calloc(1, sizeof(*store));
    assert_non_null(store);
    kgpu_gpu_spec g[2] = {{0, "GPU-a", "A100", 40960, 0, true},
                          {1, "GPU-b", "A100", 40960, 1, false}};
    char *ann = kgpu_gpus_annotation_format(g, 2);
    assert_non_null(ann);
    json_t *node = json_q("{'metadata':{'name':'gpu-1','labels':{'nvidia.com/gpu.product':'T4'}},"
                          "'status':{'allocatable':{'cpu':'15900m','memory':'65536Ki',"
                          "'nvidia.com/gpu':'8'}}}");
    json_t *annotations = json_object();
    json_object_set_new(annotations, KGPU_ANN_GPUS, json_string(ann));
    json_object_set_new(json_object_get(node, "metadata"), "annotations", annotations);
    free(ann);

    kgpu_node_spec spec;
    kgpu_error err;
    assert_int_equal(kgpu_node_from_json(node, &spec, store, &err), 0);
    assert_string_equal(spec.name, "gpu-1");
    assert_ptr_equal(spec.name, store->name);
    assert_int_equal(spec.cpu_milli, 15900);
    assert_int_equal(spec.memory_mib, 64);
    assert_null(spec.labels);
    assert_int_equal(spec.nlabels, 0);
    /* The annotation wins over allocatable and labels. */
    assert_int_equal(spec.ngpus, 2);
    assert_ptr_equal(spec.gpus, store->gpus);
    assert_string_equal(spec.gpus[1].uuid, "GPU-b");
    assert_string_equal(spec.gpus[1].model, "A100");
    assert_int_equal(spec.gpus[1].numa, 1);
    assert_false(spec.gpus[1].healthy);
    kgpu_cluster *c = kgpu_cluster_new();
    assert_non_null(c);
    assert_true(kgpu_cluster_add_node(c, &spec, &err) >= 0);
    kgpu_cluster_free(c);

    /* Packed, the spec owns its strings: the store can go (here: be overwritten). */
    kgpu_node_spec packed;
    void *block = kgpu_node_spec_pack(&spec, &packed);
    assert_non_null(block);
    memset(store, 'x', sizeof(*store));
    assert_ptr_equal(packed.gpus, block);
    assert_string_equal(packed.name, "gpu-1");
    assert_int_equal(packed.cpu_milli, 15900);
    assert_int_equal(packed.memory_mib, 64);
    assert_int_equal(packed.ngpus, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(packed.gpus[i].index, g[i].index);
        assert_string_equal(packed.gpus[i].uuid, g[i].uuid);
        assert_string_equal(packed.gpus[i].model, g[i].model);
        assert_int_equal(packed.gpus[i].memory_mib, g[i].memory_mib);
        assert_int_equal(packed.gpus[i].numa, g[i].numa);
        assert_int_equal(packed.gpus[i].healthy, g[i].healthy);
    }
    c = kgpu_cluster_new();
    assert_non_null(c);
    assert_true(kgpu_cluster_add_node(c, &packed, &err) >= 0);
    kgpu_cluster_free(c);
    free(block);
    /* A GPU without a UUID stays without one. */
    kgpu_gpu_spec nouuid = {0, NULL, "T4", 15360, -1, true};
    kgpu_node_spec bare = {.name = "n", .gpus = &nouuid, .ngpus = 1};
    block = kgpu_node_spec_pack(&bare, &packed);
    assert_non_null(block);
    assert_null(packed.gpus[0].uuid);
    assert_string_equal(packed.gpus[0].model, "T4");
    free(block);
    assert_int_equal(kgpu_node_from_json(node, &spec, store, &err), 0); /* the store again */

    /* A malformed annotation is an error that names the node. */
    json_object_set_new(annotations, KGPU_ANN_GPUS, json_string("[{\"index\":0}]"));
    assert_int_equal(kgpu_node_from_json(node, &spec, store, &err), KGPU_EPARSE);
    assert_contains(err.msg, "node gpu-1: kgpu.io/gpus[0]: uuid missing");
    json_object_set_new(annotations, KGPU_ANN_GPUS, json_integer(1));
    assert_int_equal(kgpu_node_from_json(node, &spec, store, &err), KGPU_EPARSE);
    assert_contains(err.msg, "node gpu-1: annotation kgpu.io/gpus is not a string");
    json_decref(node);
    free(store);
}

static void test_node_label_mode(void **state)
{
    kgpu_node_store *store = calloc(1, sizeof(*store));
    assert_non_null(store);
    kgpu_node_spec spec;
    kgpu_error err;
    json_t *node = json_q(
        "{'metadata':{'name':'n7','labels':{'nvidia.com/gpu.product':'NVIDIA-A100-SXM4-40GB',"
        "'nvidia.com/gpu.memory':'40960'}},'status':{'allocatable':{'cpu':'64','memory':"
        "'1048575','nvidia.com/gpu':'4'}}}");
    assert_int_equal(kgpu_node_from_json(node, &spec, store, &err), 0);
    json_decref(node);
    assert_string_equal(spec.name, "n7");
    assert_int_equal(spec.cpu_milli, 64000);
    assert_int_equal(spec.memory_mib, 0); /* rounded down */
    assert_int_equal(spec.ngpus, 4);
    for (int i = 0; i < 4; i++) {
        char uuid[32];
        snprintf(uuid, sizeof(uuid), "n7-gpu%d", i);
        assert_int_equal(spec.gpus[i].index, i);
        assert_string_equal(spec.gpus[i].uuid, uuid);
        assert_string_equal(spec.gpus[i].model, "NVIDIA-A100-SXM4-40GB");
        assert_int_equal(spec.gpus[i].memory_mib, 40960);
        assert_int_equal(spec.gpus[i].numa, -1);
        assert_true(spec.gpus[i].healthy);
    }
    /* No labels: unknown model, no memory. */
    node = json_q("{'metadata':{'name':'n8'},'status':{'allocatable':{'nvidia.com/gpu':'2'}}}");
    assert_int_equal(kgpu_node_from_json(node, &spec, store, &err), 0);
    json_decref(node);
    assert_int_equal(spec.ngpus, 2);
    assert_string_equal(spec.gpus[1].model, "unknown");
    assert_int_equal(spec.gpus[1].memory_mib, 0);
    assert_int_equal(spec.cpu_milli, 0);
    kgpu_cluster *c = kgpu_cluster_new();
    assert_non_null(c);
    assert_true(kgpu_cluster_add_node(c, &spec, &err) >= 0);
    kgpu_cluster_free(c);
    /* No GPUs at all. */
    node = json_q("{'metadata':{'name':'cpu-only'},'status':{'allocatable':{'cpu':'8',"
                  "'memory':'32Gi'}}}");
    assert_int_equal(kgpu_node_from_json(node, &spec, store, &err), 0);
    json_decref(node);
    assert_int_equal(spec.ngpus, 0);
    assert_int_equal(spec.memory_mib, 32768);
    /* A long node name is cut in the uuid, never the GPU suffix. */
    char name[KGPU_NAME_MAX + 1];
    memset(name, 'h', KGPU_NAME_MAX);
    name[KGPU_NAME_MAX] = '\0';
    char buf[1024];
    snprintf(buf, sizeof(buf),
             "{'metadata':{'name':'%s'},'status':{'allocatable':{'nvidia.com/gpu':'12'}}}", name);
    node = json_q(buf);
    assert_int_equal(kgpu_node_from_json(node, &spec, store, &err), 0);
    json_decref(node);
    assert_string_equal(spec.name, name);
    assert_int_equal(strlen(spec.gpus[11].uuid), KGPU_UUID_MAX - 1);
    assert_string_equal(spec.gpus[11].uuid + KGPU_UUID_MAX - 1 - 6, "-gpu11");
    free(store);
}

static void test_node_errors(void **state)
{
    static const struct {
        const char *node;
        int rc;
        const char *msg;
    } cases[] = {
        {"[]", KGPU_EPARSE, "node: not a JSON object"},
        {"{}", KGPU_EPARSE, "node: metadata"},
        {"{'metadata':{'name':3}}", KGPU_EPARSE, "node: name missing or not a string"},
        {"{'metadata':{'name':''}}", KGPU_EINVAL, "node: name is empty"},
        {"{'metadata':{'name':'n'},'status':[]}", KGPU_EPARSE, "node n: status is not an object"},
        {"{'metadata':{'name':'n'},'status':{'allocatable':5}}", KGPU_EPARSE,
         "node n: status.allocatable is not an object"},
        {"{'metadata':{'name':'n'},'status':{'allocatable':{'cpu':'many'}}}", KGPU_EPARSE,
         "node n: status.allocatable.cpu: quantity 'many'"},
        {"{'metadata':{'name':'n'},'status':{'allocatable':{'memory':[]}}}", KGPU_EPARSE,
         "node n: status.allocatable.memory is not a string"},
        {"{'metadata':{'name':'n'},'status':{'allocatable':{'nvidia.com/gpu':'33'}}}", KGPU_ERANGE,
         "node n: 33 GPUs"},
        {"{'metadata':{'name':'n'},'status':{'allocatable':{'nvidia.com/gpu':'1.5'}}}", KGPU_EINVAL,
         "node n: allocatable nvidia.com/gpu is not a whole number"},
        {"{'metadata':{'name':'n','labels':[]},'status':{'allocatable':{'nvidia.com/gpu':'1'}}}",
         KGPU_EPARSE, "node n: metadata.labels is not an object"},
        {"{'metadata':{'name':'n','labels':{'nvidia.com/gpu.product':1}},"
         "'status':{'allocatable':{'nvidia.com/gpu':'1'}}}",
         KGPU_EPARSE, "node n: label nvidia.com/gpu.product is not a string"},
        {"{'metadata':{'name':'n','labels':{'nvidia.com/gpu.memory':'lots'}},"
         "'status':{'allocatable':{'nvidia.com/gpu':'1'}}}",
         KGPU_EPARSE, "node n: label nvidia.com/gpu.memory"},
        {"{'metadata':{'name':'n','annotations':'x'}}", KGPU_EPARSE,
         "node n: metadata.annotations is not an object"},
        {"{'metadata':{'name':'n','annotations':{'kgpu.io/gpus':'[]'}}}", KGPU_ERANGE,
         "node n: kgpu.io/gpus: 0 GPUs"},
    };
    kgpu_node_store *store = calloc(1, sizeof(*store));
    assert_non_null(store);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *node = json_q(cases[i].node);
        kgpu_node_spec spec;
        kgpu_error err;
        kgpu_error_clear(&err);
        int rc = kgpu_node_from_json(node, &spec, store, &err);
        json_decref(node);
        if (rc != cases[i].rc || strstr(err.msg, cases[i].msg) == NULL)
            fail_msg("case %zu: rc %d '%s', want rc %d '%s'", i, rc, err.msg, cases[i].rc,
                     cases[i].msg);
    }
    free(store);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantity_table),
        cmocka_unit_test(test_quantity_long_inputs),
        cmocka_unit_test(test_pod_without_gpus),
        cmocka_unit_test(test_whole_gpus),
        cmocka_unit_test(test_shares),
        cmocka_unit_test(test_mem_alias),
        cmocka_unit_test(test_divisibility),
        cmocka_unit_test(test_container_rules),
        cmocka_unit_test(test_multi_container),
        cmocka_unit_test(test_init_containers),
        cmocka_unit_test(test_effective_cpu_memory),
        cmocka_unit_test(test_annotations),
        cmocka_unit_test(test_restartable_only_exact_true),
        cmocka_unit_test(test_terminal),
        cmocka_unit_test(test_malformed_pods),
        cmocka_unit_test(test_trim_keeps_only_what_kgpu_reads),
        cmocka_unit_test(test_assignment_round_trip),
        cmocka_unit_test(test_assignment_parse_errors),
        cmocka_unit_test(test_gpus_annotation_round_trip),
        cmocka_unit_test(test_gpus_annotation_errors),
        cmocka_unit_test(test_node_annotation_mode),
        cmocka_unit_test(test_node_label_mode),
        cmocka_unit_test(test_node_errors),
        cmocka_unit_test(test_pod_from_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
