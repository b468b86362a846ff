/*
 * Unit tests of what tenants can do to the extender through unschedulable
 * pods and pods without a GPU (issue 24, items 8 and 9): the unschedulable
 * table keeps a small record per pod, a bounded number per namespace, and
 * a namespace's flood cannot keep another namespace's pod out of the
 * sweep; the sweep lets go of the state lock between slices; and
 * prioritize-gpuless answers while the state lock is held, from a
 * snapshot that concurrent writers and readers share safely (run under ASan).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "decide.h"
#include "queuefile.h"

#include "extender_fixture.h"

typedef struct fixture {
    ext_config cfg;
    ext_metrics m;
    ext_state st;
    ext_ctx ctx;
    kgpu_gpu_spec g[2][4];
    kgpu_node_spec nodes[2];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    ext_fixture_state(&f->cfg, &f->st, &f->m);
    static const char *const models[2] = {"A100", "A100"};
    static const int64_t mib[2] = {40960, 40960};
    ext_fixture_nodes(&f->st, f->g, f->nodes, models, mib, 2);
    f->ctx = (ext_ctx){.cfg = &f->cfg, .metrics = &f->m, .state = &f->st};
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    ext_state_destroy(&f->st);
    ext_config_free(&f->cfg);
    free(f);
    return 0;
}

static void set_queues(fixture *f, const char *text)
{
    ext_fixture_queues(&f->st, text);
}

/* Binds a pod of `whole` GPUs in queue `label` to node. */
static void bind(fixture *f, const char *name, const char *label, const char *node, int whole)
{
    char n[16];
    snprintf(n, sizeof(n), "%d", whole);
    json_t *pod = json_pack("{s:{s:s,s:s,s:s},s:{s:[{s:s,s:{s:{s:s}}}]}}", "metadata", "name",
                            name, "namespace", "ns", "uid", name, "spec", "containers", "name",
                            "main", "resources", "limits", "nvidia.com/gpu", n);
    kgpu_pod p;
    kgpu_error err;
    const ext_pod *held;
    if (kgpu_pod_from_json(pod, 1024, &p, &err) != 0 || ext_state_compile(&f->st, &p, &err) != 0 ||
        ext_state_reserve(&f->st, &p, node, label, 0, &held, &err) != 0)
        fail_msg("bind %s: %s", name, err.msg);
    ext_state_confirm(&f->st, name);
    json_decref(pod);
}

/*
 * An unschedulable pod of namespace ns in queue `queue`, asking `whole`
 * GPUs, with a `pad`-byte kgpu.io/ annotation (the trim keeps those): what
 * a tenant sends to make each copy large.
 */
static void unschedulable(fixture *f, const char *ns, const char *name, const char *queue,
                          int whole, size_t pad)
{
    char n[16], uid[128];
    snprintf(n, sizeof(n), "%d", whole);
    snprintf(uid, sizeof(uid), "%s-%s", ns, name);
    char *big = calloc(1, pad + 1);
    memset(big, 'x', pad);
    json_t *pod = json_pack(
        "{s:{s:s,s:s,s:s,s:{s:s},s:{s:s}},s:{s:[{s:s,s:{s:{s:s}}}]},s:{s:s,s:[{s:s,s:s,s:s}]}}",
        "metadata", "name", name, "namespace", ns, "uid", uid, "labels", "kgpu.io/queue", queue,
        "annotations", "kgpu.io/padding", big, "spec", "containers", "name", "main", "resources",
        "limits", "nvidia.com/gpu", n, "status", "phase", "Pending", "conditions", "type",
        "PodScheduled", "status", "False", "reason", "Unschedulable");
    free(big);
    kgpu_pod p;
    kgpu_error err;
    if (kgpu_pod_from_json(pod, 1024, &p, &err) != 0)
        fail_msg("pod: %s", err.msg);
    ext_unsched_seen(&f->st, pod, &p);
    json_decref(pod);
}

static int entries_of(fixture *f, const char *ns)
{
    const char *k;
    void *v;
    size_t it = 0;
    int n = 0;
    while (kgpu_strmap_next(&f->st.unsched, &it, &k, &v))
        n += strcmp(((const ext_unsched *)v)->ns, ns) == 0;
    return n;
}

/*
 * Tenants flood the table from many namespaces with large pods: each
 * namespace keeps at most EXT_UNSCHED_NS_MAX entries, the table at most
 * EXT_UNSCHED_MAX, an entry keeps the fields the sweep reads (not the pod:
 * its size does not depend on the pod's), and another namespace's pod,
 * seen last, is still followed and still gets its reclaim.
 */
static void test_flood_cannot_keep_others_out(void **state)
{
    fixture *f = *state;
    set_queues(f, "queues:\n - {name: team-a, guarantee: {gpu: 4}, namespaceSelector: {}}\n"
                  " - {name: team-b, guarantee: {gpu: 1}, namespaceSelector: {}}\n");
    bind(f, "b-0", "team-b", "n0", 4);
    bind(f, "b-1", "team-b", "n1", 4);
    int flooders = EXT_UNSCHED_MAX / EXT_UNSCHED_NS_MAX + 4;
    for (int t = 0; t < flooders; t++) {
        char ns[32];
        snprintf(ns, sizeof(ns), "flood-%d", t);
        for (int i = 0; i < EXT_UNSCHED_NS_MAX + 20; i++) {
            char name[32];
            snprintf(name, sizeof(name), "p-%d", i);
            unschedulable(f, ns, name, "team-b", 4, 4096);
        }
        assert_true(entries_of(f, ns) <= EXT_UNSCHED_NS_MAX);
    }
    assert_true(f->st.unsched.len <= EXT_UNSCHED_MAX);
    assert_int_equal(f->st.unsched.len, EXT_UNSCHED_MAX); /* full: the newest made room */
    unschedulable(f, "team", "owner", "team-a", 4, 0);
    const ext_unsched *u = kgpu_strmap_get(&f->st.unsched, "team-owner");
    assert_non_null(u);
    assert_string_equal(u->label, "team-a");
    assert_int_equal(u->req.gpu_count, 4);
    assert_null(u->globs);
    assert_true(f->st.unsched.len <= EXT_UNSCHED_MAX);
    /* The sweep passes over the flood (above team-b's guarantee) and reclaims for owner. */
    ext_sweep_act acts[4];
    pthread_mutex_lock(&f->st.mu); /* the sweep lets go of it between slices */
    int n = ext_unsched_sweep(&f->st, acts, 4);
    pthread_mutex_unlock(&f->st.mu);
    assert_int_equal(n, 1);
    assert_string_equal(acts[0].name, "owner");
    assert_true(acts[0].evict);
}

/* The same pod seen again is updated in place: no second entry, the namespace counted once. */
static void test_seen_again_counts_once(void **state)
{
    fixture *f = *state;
    set_queues(f, "queues:\n - {name: team-a, guarantee: {gpu: 4}, namespaceSelector: {}}\n");
    for (int i = 0; i < EXT_UNSCHED_NS_MAX + 10; i++)
        unschedulable(f, "team", "same", "team-a", 1 + i % 2, 64);
    assert_int_equal(f->st.unsched.len, 1);
    assert_int_equal((int)(intptr_t)kgpu_strmap_get(&f->st.unsched_ns, "team"), 1);
    unschedulable(f, "team", "other", "team-a", 1, 0);
    assert_int_equal(entries_of(f, "team"), 2);
    ext_unsched_drop(&f->st, "team-same");
    ext_unsched_drop(&f->st, "team-other");
    assert_null(kgpu_strmap_get(&f->st.unsched_ns, "team"));
}

/*
 * The sweep takes the lock in slices: with a slice of no time at all,
 * each pod is looked at in a hold of its own, and it decides the same.
 */
static void test_sweep_lets_go_between_pods(void **state)
{
    fixture *f = *state;
    set_queues(f, "queues:\n - {name: team-a, guarantee: {gpu: 4}, namespaceSelector: {}}\n"
                  " - {name: team-b, guarantee: {gpu: 1}, namespaceSelector: {}}\n");
    bind(f, "b-0", "team-b", "n0", 4);
    bind(f, "b-1", "team-b", "n1", 4);
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof(name), "b-%d", i + 2);
        unschedulable(f, "tenant", name, "team-b", 4, 0);
    }
    unschedulable(f, "team", "owner", "team-a", 4, 0);
    f->st.sweep_slice_s = 0;
    unsigned long before = f->st.sweep_slices;
    ext_sweep_act acts[4];
    pthread_mutex_lock(&f->st.mu);
    int n = ext_unsched_sweep(&f->st, acts, 4);
    pthread_mutex_unlock(&f->st.mu);
    assert_int_equal(n, 1);
    assert_string_equal(acts[0].name, "owner");
    assert_int_equal(f->st.sweep_slices - before, 6); /* one hold per pod */
}

typedef struct call {
    fixture *f;
    int status;
    json_t *reply;
    bool done;
} call;

/* A node's score in a prioritize answer; -1 when the answer leaves it out (0 to kube-scheduler). */
static json_int_t score_of(const json_t *reply, const char *node)
{
    size_t i;
    const json_t *r;
    json_array_foreach(reply, i, r)
    {
        const char *host = json_string_value(json_object_get(r, "Host"));
        if (host != NULL && strcmp(host, node) == 0) {
            json_int_t v = json_integer_value(json_object_get(r, "Score"));
            assert_true(v > 0);
            return v;
        }
    }
    return -1;
}

static void *gpuless_call(void *arg)
{
    call *c = arg;
    const char *body = "{\"Pod\":{\"metadata\":{\"name\":\"cpu\",\"namespace\":\"ns\",\"uid\":"
                       "\"cpu-1\"},\"spec\":{\"containers\":[{\"name\":\"main\",\"resources\":"
                       "{\"requests\":{\"cpu\":\"48\"}}}]}},\"NodeNames\":[\"n0\",\"n1\","
                       "\"nowhere\"]}";
    ext_response r;
    ext_decide(&c->f->ctx, VERB_PRIORITIZE_GPULESS, body, strlen(body), &r);
    c->status = r.status;
    c->reply = json_loads(r.body, 0, NULL);
    ext_response_discard(&r);
    __atomic_store_n(&c->done, true, __ATOMIC_SEQ_CST);
    return NULL;
}

/*
 * prioritize-gpuless answers while another thread holds the state lock
 * (a sweep slice, a relist), from the snapshot: the node whose GPUs are all
 * taken (its CPU strands nothing) first, a node the state does not know 0.
 */
static void test_gpuless_answers_while_the_lock_is_held(void **state)
{
    fixture *f = *state;
    bind(f, "whole-0", "", "n1", 4);
    call first = {.f = f};
    gpuless_call(&first); /* lock free: scored by the policy, and a snapshot published */
    assert_int_equal(first.status, 200);
    json_decref(first.reply);
    assert_true(atomic_load(&f->st.gpuless.published) >= 1);

    call c = {.f = f};
    pthread_t t;
    pthread_mutex_lock(&f->st.mu);
    assert_int_equal(pthread_create(&t, NULL, gpuless_call, &c), 0);
    /* Liveness, not speed: a call that waits for the lock never ends while it is held. */
    for (int i = 0; i < 60000 && !__atomic_load_n(&c.done, __ATOMIC_SEQ_CST); i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    bool done = __atomic_load_n(&c.done, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&f->st.mu);
    pthread_join(t, NULL);
    assert_true(done);
    assert_int_equal(c.status, 200);
    /* The answer names only the nodes scoring above 0: not the unknown one. */
    assert_int_equal(score_of(c.reply, "n1"), 10);
    assert_true(score_of(c.reply, "n0") < 10);
    assert_int_equal(score_of(c.reply, "nowhere"), -1);
    assert_true(json_array_size(c.reply) <= 2);
    assert_true(atomic_load(&f->st.gpuless.stale_answers) >= 1);
    json_decref(c.reply);
}

typedef struct stress {
    fixture *f;
    int id;
    atomic_bool *stop;
    long reads;
} stress;

/* Writers: bind and release under the lock, publishing each change. */
static void *writer(void *arg)
{
    stress *s = arg;
    for (int i = 0; i < 400; i++) {
        char name[32];
        snprintf(name, sizeof(name), "w%d-%d", s->id, i);
        pthread_mutex_lock(&s->f->st.mu);
        bind(s->f, name, "", s->id ? "n1" : "n0", 1);
        ext_gpuless_publish(&s->f->st);
        ext_state_release(&s->f->st, name);
        ext_gpuless_publish(&s->f->st);
        pthread_mutex_unlock(&s->f->st.mu);
    }
    return NULL;
}

static void *reader(void *arg)
{
    stress *s = arg;
    const char *names[] = {"n0", "n1", "n2"};
    while (!atomic_load(s->stop)) {
        int scores[3] = {-1, -1, -1};
        if (!ext_gpuless_scores(&s->f->st, 1000, 1024, names, 3, scores))
            continue;
        for (int i = 0; i < 3; i++)
            if (scores[i] < 0 || scores[i] > 10)
                fail_msg("score %d", scores[i]);
        if (scores[2] != 0)
            fail_msg("unknown node scored %d", scores[2]);
        s->reads++;
    }
    return NULL;
}

/* Snapshots replaced under concurrent readers are freed only once no reader holds them (ASan). */
static void test_snapshot_concurrent_writers_and_readers(void **state)
{
    fixture *f = *state;
    pthread_mutex_lock(&f->st.mu);
    ext_gpuless_publish(&f->st);
    pthread_mutex_unlock(&f->st.mu);
    atomic_bool stop;
    atomic_init(&stop, false);
    stress w[2], r[4];
    pthread_t tw[2], tr[4];
    for (int i = 0; i < 4; i++) {
        r[i] = (stress){.f = f, .id = i, .stop = &stop};
        assert_int_equal(pthread_create(&tr[i], NULL, reader, &r[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        w[i] = (stress){.f = f, .id = i, .stop = &stop};
        assert_int_equal(pthread_create(&tw[i], NULL, writer, &w[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(tw[i], NULL);
    atomic_store(&stop, true);
    long reads = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(tr[i], NULL);
        reads += r[i].reads;
    }
    assert_true(reads > 0);
    assert_true(atomic_load(&f->st.gpuless.published) >= 2);
    assert_true(f->st.gpuless.nretired <= EXT_GPULESS_RETIRED_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_flood_cannot_keep_others_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seen_again_counts_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sweep_lets_go_between_pods, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gpuless_answers_while_the_lock_is_held, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_snapshot_concurrent_writers_and_readers, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
