/*
 * Unit tests of the extender's decisions layer on its own (decide.h): a
 * verb is a function of an ext_ctx and its JSON body, so it runs here with
 * a state, a configuration and counters and nothing above them: no daemon,
 * no HTTP server, no API client. And of the state's sink (sources.h): what
 * a source hands it is what the verbs then see.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "decide.h"

typedef struct world {
    ext_config cfg;
    ext_metrics metrics;
    ext_state state;
    ext_ctx ctx;
} world;

/* One node "n1" with one 16 GiB GPU, handed to the state as a cluster file would. */
static world *world_new(void)
{
    world *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    ext_config_defaults(&w->cfg);
    w->cfg.log_level = -1;
    ext_log_set_level(-1);
    kgpu_error err;
    if (ext_state_init(&w->state, &w->cfg, &w->metrics, &err) != 0)
        fail_msg("state: %s", err.msg);
    kgpu_gpu_spec g = {
        .index = 0, .uuid = "GPU-1", .model = "T4", .memory_mib = 16384, .numa = 0, .healthy = true};
    kgpu_node_spec n = {
        .name = "n1", .cpu_milli = 64000, .memory_mib = 1 << 18, .gpus = &g, .ngpus = 1};
    ext_sink sink;
    ext_state_sink(&w->state, &sink);
    assert_ptr_equal(sink.ctx, &w->state);
    assert_false(sink.nodes_known(sink.ctx));
    if (sink.file_nodes(sink.ctx, &n, 1, &err) != 0)
        fail_msg("file_nodes: %s", err.msg);
    assert_true(sink.nodes_known(sink.ctx));
    assert_true(ext_state_synced(&w->state));
    w->ctx = (ext_ctx){.cfg = &w->cfg, .metrics = &w->metrics, .state = &w->state};
    return w;
}

static void world_free(world *w)
{
    ext_state_destroy(&w->state);
    ext_config_free(&w->cfg);
    free(w);
}

/* A verb's answer to body (stolen): status into *status, the reply parsed (caller decrefs). */
static json_t *decide(world *w, enum ext_verb v, json_t *body, int *status)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    assert_non_null(text);
    ext_response r;
    ext_decide(&w->ctx, v, text, strlen(text), &r);
    free(text);
    *status = r.status;
    assert_null(r.stream.read);
    json_t *reply = json_loads(r.body, 0, NULL);
    ext_response_discard(&r);
    assert_non_null(reply);
    return reply;
}

static json_t *pod(const char *uid, const char *mem_units)
{
    return json_pack("{s:{s:s,s:s,s:s},s:{s:[{s:s,s:{s:{s:s}}}]}}", "metadata", "name", uid,
                     "namespace", "default", "uid", uid, "spec", "containers", "name", "main",
                     "resources", "limits", "kgpu.io/gpu-mem", mem_units);
}

/* filter passes the node that fits, names why the others do not, and counts the call. */
static void filter_needs_no_daemon(void **unused)
{
    world *w = world_new();
    int status;
    json_t *reply = decide(w, VERB_FILTER,
                           json_pack("{s:o,s:n,s:[s,s]}", "Pod", pod("p1", "8"), "Nodes",
                                     "NodeNames", "n1", "gone"),
                           &status);
    assert_int_equal(status, 200);
    json_t *names = json_object_get(reply, "NodeNames");
    assert_int_equal(json_array_size(names), 1);
    assert_string_equal(json_string_value(json_array_get(names, 0)), "n1");
    /* A node kgpu has no inventory for is refused for good, with the reason. */
    const char *gone = json_string_value(
        json_object_get(json_object_get(reply, "FailedAndUnresolvableNodes"), "gone"));
    if (gone == NULL)
        gone = json_string_value(json_object_get(json_object_get(reply, "FailedNodes"), "gone"));
    assert_non_null(gone);
    assert_true(gone[0] != '\0');
    json_decref(reply);
    assert_int_equal(atomic_load(&w->metrics.requests[VERB_FILTER]), 1);
    assert_int_equal(atomic_load(&w->metrics.latency[VERB_FILTER].count), 1);

    /* A 20 GiB share fits no 16 GiB GPU: refused, with the core's reason. */
    reply = decide(w, VERB_FILTER,
                   json_pack("{s:o,s:n,s:[s]}", "Pod", pod("p2", "20"), "Nodes", "NodeNames",
                             "n1"),
                   &status);
    assert_int_equal(status, 200);
    assert_int_equal(json_array_size(json_object_get(reply, "NodeNames")), 0);
    json_t *why = json_object_get(json_object_get(reply, "FailedAndUnresolvableNodes"), "n1");
    if (why == NULL)
        why = json_object_get(json_object_get(reply, "FailedNodes"), "n1");
    assert_non_null(why);
    json_decref(reply);
    world_free(w);
}

/* bind without an API client holds the GPUs in the state; a second bind of the uid is refused. */
static void bind_holds_in_the_state(void **unused)
{
    world *w = world_new();
    int status;
    json_t *reply = decide(w, VERB_FILTER,
                           json_pack("{s:o,s:n,s:[s]}", "Pod", pod("p1", "8"), "Nodes",
                                     "NodeNames", "n1"),
                           &status);
    json_decref(reply);
    reply = decide(w, VERB_BIND,
                   json_pack("{s:s,s:s,s:s,s:s}", "PodName", "p1", "PodNamespace", "default",
                             "PodUID", "p1", "Node", "n1"),
                   &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(reply, "Error")), "");
    json_decref(reply);
    pthread_mutex_lock(&w->state.mu);
    assert_int_equal(w->state.pods.len, 1);
    const ext_pod *p = kgpu_strmap_get(&w->state.pods, "p1");
    assert_non_null(p);
    assert_string_equal(p->node, "n1");
    pthread_mutex_unlock(&w->state.mu);

    /* The node has 8 GiB left: a second 12 GiB pod no longer fits there. */
    reply = decide(w, VERB_FILTER,
                   json_pack("{s:o,s:n,s:[s]}", "Pod", pod("p2", "12"), "Nodes", "NodeNames",
                             "n1"),
                   &status);
    assert_int_equal(json_array_size(json_object_get(reply, "NodeNames")), 0);
    json_decref(reply);
    world_free(w);
}

/* A body kube-scheduler would not send is a 400 with the verb's own shape, counted as such. */
static void bad_bodies_are_400(void **unused)
{
    world *w = world_new();
    ext_response r;
    ext_decide(&w->ctx, VERB_PRIORITIZE, "{\"Pod\":", 7, &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "malformed JSON"));
    ext_response_discard(&r);
    assert_null(r.body);
    ext_decide(&w->ctx, VERB_FILTER, "[1]", 3, &r);
    assert_int_equal(r.status, 400);
    ext_response_discard(&r);
    assert_int_equal(atomic_load(&w->metrics.bad_requests[VERB_PRIORITIZE]), 1);
    assert_int_equal(atomic_load(&w->metrics.bad_requests[VERB_FILTER]), 1);
    world_free(w);
}

/* What the sink is handed is what the verbs see: a pod bound elsewhere takes its GPU. */
static void the_sink_feeds_the_verbs(void **unused)
{
    world *w = world_new();
    ext_sink sink;
    ext_state_sink(&w->state, &sink);
    json_t *bound = pod("other", "16");
    json_object_set_new(json_object_get(bound, "spec"), "nodeName", json_string("n1"));
    json_object_set_new(json_object_get(bound, "metadata"), "annotations",
                        json_pack("{s:s}", "kgpu.io/assignment",
                                  "[{\"container\":\"main\",\"exclusive\":false,\"gpus\":"
                                  "[{\"index\":0,\"uuid\":\"GPU-1\",\"milli\":0,"
                                  "\"memory_mib\":16384}]}]"));
    json_object_set_new(bound, "status", json_pack("{s:s}", "phase", "Running"));
    sink.pod_seen(sink.ctx, bound);
    json_decref(bound);
    assert_int_equal(sink.pods_held(sink.ctx), 1);
    int status;
    json_t *reply = decide(w, VERB_FILTER,
                           json_pack("{s:o,s:n,s:[s]}", "Pod", pod("p1", "8"), "Nodes",
                                     "NodeNames", "n1"),
                           &status);
    assert_int_equal(json_array_size(json_object_get(reply, "NodeNames")), 0); /* the GPU is full */
    json_decref(reply);
    sink.pod_gone(sink.ctx, "other");
    assert_int_equal(sink.pods_held(sink.ctx), 0);
    reply = decide(w, VERB_FILTER,
                   json_pack("{s:o,s:n,s:[s]}", "Pod", pod("p3", "8"), "Nodes", "NodeNames",
                             "n1"),
                   &status);
    assert_int_equal(json_array_size(json_object_get(reply, "NodeNames")), 1);
    json_decref(reply);
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(filter_needs_no_daemon),
        cmocka_unit_test(bind_holds_in_the_state),
        cmocka_unit_test(bad_bodies_are_400),
        cmocka_unit_test(the_sink_feeds_the_verbs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
