/*
 * Unit tests of the extender's GPU queues (src/extender/queues.c,
 * reclaim_state.c, sink.c) below the HTTP layer: a bind is charged on the GPUs chosen
 * and refused past a limit (per model too); the charges survive inventory
 * rebuilds, a pod whose GPUs leave and come back, and a new tree, where
 * running pods are never refused; and the GPUQueue status the leader
 * writes, its quantities and its Valid condition's transition time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ext.h"
#include "queuefile.h"

#include "extender_fixture.h"

typedef struct fixture {
    ext_config cfg;
    ext_metrics m;
    ext_state st;
    kgpu_gpu_spec g[2][4];
    kgpu_node_spec nodes[2];
} fixture;

/* n0: 4 A100 of 40 GiB; n1: 4 T4 of 16 GiB. */
static void set_nodes(fixture *f, int n)
{
    static const char *const models[2] = {"A100", "T4"};
    static const int64_t mib[2] = {40960, 16384};
    ext_fixture_nodes(&f->st, f->g, f->nodes, models, mib, n);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    ext_fixture_state(&f->cfg, &f->st, &f->m);
    set_nodes(f, 2);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    ext_state_destroy(&f->st);
    free(f);
    return 0;
}

static void set_queues(fixture *f, const char *text)
{
    ext_fixture_queues(&f->st, text);
}

/* Binds pod `name` (whole GPUs, or a share of `milli` with `mem_gib`) to node: 0 or the code. */
static int bind(fixture *f, const char *name, const char *label, const char *node, int whole,
                int core, int mem_gib, kgpu_error *err)
{
    char text[512];
    if (whole > 0)
        snprintf(text, sizeof(text), "{\"nvidia.com/gpu\": \"%d\"}", whole);
    else
        snprintf(text, sizeof(text), "{\"kgpu.io/gpu-core\": \"%d\", \"kgpu.io/gpu-mem\": \"%d\"}",
                 core, mem_gib);
    json_t *limits = json_loads(text, 0, NULL);
    json_t *pod = json_pack("{s:{s:s,s:s,s:s},s:{s:[{s:s,s:{s:o}}]}}", "metadata", "name", name,
                            "namespace", "ns", "uid", name, "spec", "containers", "name", "main",
                            "resources", "limits", limits);
    kgpu_pod p;
    int rc = kgpu_pod_from_json(pod, 1024, &p, err);
    json_decref(pod);
    if (rc == 0)
        rc = ext_state_compile(&f->st, &p, err);
    const ext_pod *held;
    if (rc == 0)
        rc = ext_state_reserve(&f->st, &p, node, label, 0, &held, err);
    if (rc == 0)
        ext_state_confirm(&f->st, name);
    return rc;
}

static kgpu_queue_info info(fixture *f, const char *q)
{
    kgpu_queue_info qi;
    memset(&qi, 0, sizeof(qi));
    assert_int_equal(kgpu_queues_info(f->st.queues, kgpu_queues_find(f->st.queues, q), &qi), 0);
    return qi;
}

static void test_bind_charges_and_limits(void **state)
{
    fixture *f = *state;
    set_queues(f, "queues:\n"
                  "  - name: a\n"
                  "    namespaces: [ns]\n"
                  "    limit: {gpu: 4}\n"
                  "    models: [{model: T4, limit: {gpu: 1.5}}]\n");
    kgpu_error err;
    assert_int_equal(bind(f, "w0", "a", "n0", 2, 0, 0, &err), 0);
    kgpu_queue_info qi = info(f, "a");
    assert_int_equal(qi.used.milli, 2000);
    assert_int_equal(qi.used.mem_mib, 2 * 40960); /* a whole GPU is all its memory */
    assert_int_equal(bind(f, "s0", "a", "n1", 0, 50, 4, &err), 0);
    assert_int_equal(bind(f, "s1", "a", "n1", 0, 50, 4, &err), 0);
    /* T4s: 1 of 1.5 used; another whole T4 passes the per-model limit, on n1 only. */
    assert_int_equal(bind(f, "w1", "a", "n1", 1, 0, 0, &err), KGPU_ENOFIT);
    assert_string_equal(err.msg, "queue a would use 2 T4 GPUs of its limit 1.5");
    assert_int_equal(bind(f, "w2", "a", "n0", 2, 0, 0, &err), KGPU_ENOFIT);
    assert_string_equal(err.msg, "queue a would use 5 GPUs of its limit 4");
    /* Refused binds hold nothing. */
    assert_null(kgpu_strmap_get(&f->st.pods, "w1"));
    assert_int_equal(info(f, "a").used.milli, 3000);
    assert_int_equal(info(f, "a").pods, 3);
    /* Without a label the pod is in default, which has no limit. */
    assert_int_equal(bind(f, "d0", NULL, "n0", 2, 0, 0, &err), 0);
    assert_int_equal(info(f, "default").used.milli, 2000);
    ext_state_release(&f->st, "s0");
    assert_int_equal(info(f, "a").used.milli, 2500);
    assert_int_equal(info(f, "a").pods, 2);
}

static void test_charges_survive_rebuilds(void **state)
{
    fixture *f = *state;
    set_queues(f, "queues:\n  - {name: a, namespaces: [ns], limit: {gpu: 4}}\n");
    kgpu_error err;
    assert_int_equal(bind(f, "w0", "a", "n0", 2, 0, 0, &err), 0);
    assert_int_equal(bind(f, "s0", "a", "n1", 0, 25, 2, &err), 0);
    set_nodes(f, 2); /* a relist: the same inventory rebuilt */
    assert_int_equal(info(f, "a").used.milli, 2250);
    /* n1 leaves: its pod is kept as an orphan, uncharged; it comes back, charged again. */
    set_nodes(f, 1);
    assert_int_equal(info(f, "a").used.milli, 2000);
    assert_int_equal(info(f, "a").pods, 1);
    set_nodes(f, 2);
    assert_int_equal(info(f, "a").used.milli, 2250);
    assert_int_equal(info(f, "a").pods, 2);
    /* A new tree with a lower limit: the running pods stay charged, above it; new ones wait. */
    set_queues(f, "queues:\n  - {name: a, namespaces: [ns], limit: {gpu: 1}}\n");
    assert_int_equal(info(f, "a").used.milli, 2250);
    assert_int_equal(bind(f, "s1", "a", "n1", 0, 10, 1, &err), KGPU_ENOFIT);
    assert_string_equal(err.msg, "queue a would use 2.35 GPUs of its limit 1");
    ext_state_pod_gone(&f->st, "w0");
    assert_int_equal(bind(f, "s1", "a", "n1", 0, 10, 1, &err), 0);
    /* Queues off: nothing charged, nothing refused. */
    ext_queues_set(&f->st, NULL);
    assert_null(f->st.queues);
    assert_int_equal(bind(f, "w3", "a", "n0", 4, 0, 0, &err), 0);
}

static void test_namespace_moves_charges(void **state)
{
    fixture *f = *state;
    set_queues(f, "queues:\n  - {name: a, namespaces: [ns]}\n  - {name: b}\n");
    kgpu_error err;
    assert_int_equal(bind(f, "w0", NULL, "n0", 1, 0, 0, &err), 0);
    assert_int_equal(bind(f, "w1", "a", "n0", 1, 0, 0, &err), 0);
    assert_int_equal(info(f, "default").pods, 1);
    assert_true(ext_queues_set_namespace(&f->st, "ns", "b", NULL));
    assert_false(ext_queues_set_namespace(&f->st, "ns", "b", NULL));
    ext_queues_recharge(&f->st);
    /* A label the namespace may use wins over the namespace's queue. */
    assert_int_equal(info(f, "default").pods, 0);
    assert_int_equal(info(f, "b").pods, 1);
    assert_int_equal(info(f, "a").pods, 1);
    char name[64], why[512];
    assert_int_equal(ext_queues_resolve(&f->st, "ns", "", name, sizeof(name), why, sizeof(why)),
                     kgpu_queues_find(f->st.queues, "b"));
    assert_int_equal(ext_queues_resolve(&f->st, "ns", "zz", name, sizeof(name), why, sizeof(why)),
                     -2);
    assert_non_null(strstr(why, "kgpu: queue zz (the pod's kgpu.io/queue label) does not exist "
                                "or is not open to namespace ns"));
}

static void test_status(void **state)
{
    (void)state;
    ext_queue_row row;
    memset(&row, 0, sizeof(row));
    row.used = (kgpu_qamount){4500, 40960};
    row.borrowed_milli = 500;
    row.pods = 3;
    row.pending = 1;
    json_t *st = ext_gpuqueue_status(&row, 7, "", NULL, "2026-01-01T00:00:00Z");
    char *text = json_dumps(st, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(text,
                        "{\"borrowed\":{\"gpu\":\"0.5\"},\"conditions\":[{\"lastTransitionTime\":"
                        "\"2026-01-01T00:00:00Z\",\"message\":\"enforced by kgpu-extender\","
                        "\"reason\":\"Valid\",\"status\":\"True\",\"type\":\"Valid\"}],"
                        "\"observedGeneration\":7,\"pending\":1,\"pods\":3,\"used\":{\"gpu\":"
                        "\"4.5\",\"memory\":\"40Gi\"}}");
    free(text);
    /* Same condition later: its transition time stays; an error flips it, now. */
    json_t *same = ext_gpuqueue_status(&row, 7, NULL, st, "2026-01-02T00:00:00Z");
    assert_true(json_equal(same, st));
    json_t *bad = ext_gpuqueue_status(NULL, 8, "queue x: parent y is not defined", st,
                                      "2026-01-03T00:00:00Z");
    json_t *c = json_array_get(json_object_get(bad, "conditions"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "status")), "False");
    assert_string_equal(json_string_value(json_object_get(c, "reason")), "InvalidQueues");
    assert_string_equal(json_string_value(json_object_get(c, "lastTransitionTime")),
                        "2026-01-03T00:00:00Z");
    assert_string_equal(json_string_value(json_object_get(c, "message")),
                        "queue x: parent y is not defined; kgpu-extender keeps enforcing the "
                        "last valid set of queues");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(bad, "used"), "memory")), "0");
    row.used.mem_mib = 1536;
    json_t *mi = ext_gpuqueue_status(&row, 1, NULL, NULL, "t");
    assert_string_equal(json_string_value(json_object_get(json_object_get(mi, "used"), "memory")),
                        "1536Mi");
    json_decref(mi);
    json_decref(bad);
    json_decref(same);
    json_decref(st);
}

/* A pod kube-scheduler has not placed: `unsched` gives it PodScheduled False, Unschedulable. */
static json_t *waiting_pod(const char *name, const char *queue, int whole, bool unsched,
                           const char *node)
{
    char n[16];
    snprintf(n, sizeof(n), "%d", whole);
    json_t *pod = json_pack("{s:{s:s,s:s,s:s,s:{s:s}},s:{s:[{s:s,s:{s:{s:s}}}]},s:{s:s}}",
                            "metadata", "name", name, "namespace", "ns", "uid", name, "labels",
                            "kgpu.io/queue", queue, "spec", "containers", "name", "main",
                            "resources", "limits", "nvidia.com/gpu", n, "status", "phase",
                            "Pending");
    if (unsched)
        json_object_set_new(json_object_get(pod, "status"), "conditions",
                            json_pack("[{s:s,s:s,s:s}]", "type", "PodScheduled", "status",
                                      "False", "reason", "Unschedulable"));
    if (node != NULL)
        json_object_set_new(json_object_get(pod, "spec"), "nodeName", json_string(node));
    return pod;
}

static void seen(fixture *f, json_t *pod)
{
    kgpu_pod p;
    kgpu_error err;
    if (kgpu_pod_from_json(pod, 1024, &p, &err) != 0)
        fail_msg("pod: %s", err.msg);
    ext_unsched_seen(&f->st, pod, &p);
    json_decref(pod);
}

static int pending_of(fixture *f, const char *q)
{
    ext_queue_row *rows;
    ext_eviction ev[EXT_EVICTIONS_KEPT];
    int n, nev, out = -1;
    assert_true(ext_queues_rows(&f->st, &rows, &n, ev, &nev));
    for (int i = 0; i < n; i++)
        if (strcmp(rows[i].name, q) == 0)
            out = rows[i].pending;
    free(rows);
    return out;
}

/* ext_queues_set_namespace with labels {k: v} as the API server gives them. */
static bool set_ns(fixture *f, const char *queue, const char *k, const char *v)
{
    json_t *l = json_pack("{s:s,s:s}", k, v, "kubernetes.io/metadata.name", "ns");
    bool changed = ext_queues_set_namespace(&f->st, "ns", queue, l);
    json_decref(l);
    return changed;
}

/*
 * Issue 24, item 1: a tenant whose namespace's queue is `t` (limit 1)
 * labels its pods with team-a's queue. Refused where a new pod is decided
 * (ext_queues_resolve: filter and bind); a pod that runs already with such
 * a label (adopted after a restart) is charged to `t`, never to team-a;
 * and the reclaim sweep never evicts anything for it.
 */
static void test_label_of_another_teams_queue(void **state)
{
    fixture *f = *state;
    kgpu_error err;
    const char *tree = "queues:\n"
                       " - {name: team-a, guarantee: {gpu: 4}, namespaces: [ns-a]}\n"
                       " - {name: team-b, namespaces: [ns]}\n"
                       " - {name: t, limit: {gpu: 1}}\n"
                       " - {name: picked, namespaceSelector: {matchLabels: {tier: gold}}}\n";
    set_queues(f, tree);
    set_ns(f, "t", "tier", "silver");
    char name[64], why[512];
    assert_int_equal(
        ext_queues_resolve(&f->st, "ns", "team-a", name, sizeof(name), why, sizeof(why)), -2);
    assert_non_null(strstr(why, "queue team-a (the pod's kgpu.io/queue label) does not exist or "
                                "is not open to namespace ns"));
    assert_int_equal(ext_queues_resolve(&f->st, "ns", "picked", name, sizeof(name), why,
                                        sizeof(why)),
                     -2);
    /* An administrator labels the namespace: the selector admits it, after a recharge. */
    assert_true(set_ns(f, "t", "tier", "gold"));
    assert_false(set_ns(f, "t", "tier", "gold"));
    assert_int_equal(ext_queues_resolve(&f->st, "ns", "picked", name, sizeof(name), why,
                                        sizeof(why)),
                     kgpu_queues_find(f->st.queues, "picked"));
    /* Running with the forbidden label: charged to the namespace's queue. */
    assert_int_equal(bind(f, "x", "team-a", "n0", 1, 0, 0, &err), 0);
    assert_int_equal(info(f, "team-a").pods, 0);
    assert_int_equal(info(f, "t").pods, 1);
    const ext_pod *x = kgpu_strmap_get(&f->st.pods, "x");
    assert_string_equal(x->queue, "t");
    assert_true(x->queue_refused);
    set_queues(f, tree); /* a rebuild charges it the same way */
    assert_int_equal(info(f, "team-a").pods, 0);
    assert_int_equal(info(f, "t").used.milli, 1000);
    /* The team-a label takes no second GPU past t's limit either. */
    assert_int_equal(bind(f, "x2", "team-a", "n0", 1, 0, 0, &err), KGPU_ENOFIT);
    assert_string_equal(err.msg, "queue t would use 2 GPUs of its limit 1");
    ext_state_release(&f->st, "x");
    /* Borrowers fill every GPU; team-a is below its guarantee. */
    assert_int_equal(bind(f, "b-0", "team-b", "n0", 4, 0, 0, &err), 0);
    assert_int_equal(bind(f, "b-1", "team-b", "n1", 4, 0, 0, &err), 0);
    seen(f, waiting_pod("w", "team-a", 1, true, NULL));
    ext_sweep_act acts[4];
    assert_int_equal(ext_unsched_sweep(&f->st, acts, 4), 0); /* nothing evicted for it */
    assert_int_equal(pending_of(f, "team-a"), 0);
    /* The same pod in a namespace team-a admits would reclaim: what the refusal stops. */
    set_queues(f, "queues:\n"
                  " - {name: team-a, guarantee: {gpu: 4}, namespaces: [ns-a, ns]}\n"
                  " - {name: team-b, namespaces: [ns]}\n"
                  " - {name: t, limit: {gpu: 1}}\n");
    assert_int_equal(ext_unsched_sweep(&f->st, acts, 4), 1);
    assert_true(acts[0].evict);
    assert_string_equal(acts[0].name, "w");
}

/*
 * kube-scheduler's own filters can refuse every node (Insufficient
 * nvidia.com/gpu) before kgpu's filter is called: the sweep then starts
 * the reclaim filter would have, for pods within their guarantee only; a
 * PodDisruptionBudget's refusal moves it to the next victim, then says so
 * once; a pod bound or no longer unschedulable is forgotten.
 */
static void test_sweep_reclaims_for_unschedulable_pods(void **state)
{
    fixture *f = *state;
    kgpu_error err;
    set_queues(f, "queues:\n - {name: team-a, guarantee: {gpu: 4}, namespaces: [ns]}\n"
                  " - {name: team-b, guarantee: {gpu: 1}, namespaces: [ns]}\n");
    assert_int_equal(bind(f, "b-0", "team-b", "n0", 4, 0, 0, &err), 0);
    assert_int_equal(bind(f, "b-1", "team-b", "n1", 4, 0, 0, &err), 0);
    ext_sweep_act acts[4];
    assert_int_equal(ext_unsched_sweep(&f->st, acts, 4), 0); /* nobody waits */

    seen(f, waiting_pod("quiet", "team-a", 4, false, NULL)); /* not refused (yet): not followed */
    assert_int_equal(f->st.unsched.len, 0);
    seen(f, waiting_pod("more-b", "team-b", 4, true, NULL)); /* above its guarantee: no reclaim */
    seen(f, waiting_pod("owner", "team-a", 4, true, NULL));
    assert_int_equal(f->st.unsched.len, 2);
    assert_int_equal(pending_of(f, "team-a"), 1);
    assert_int_equal(pending_of(f, "team-b"), 1);

    assert_int_equal(ext_unsched_sweep(&f->st, acts, 4), 1);
    assert_true(acts[0].evict);
    assert_string_equal(acts[0].name, "owner");
    assert_string_equal(acts[0].reason, "GPUQueueReclaim");
    assert_int_equal(acts[0].rec.nvictims, 1);
    char first[KGPU_NAME_MAX + 1];
    snprintf(first, sizeof(first), "%s", acts[0].rec.v[0].name);
    assert_true(strcmp(first, "b-0") == 0 || strcmp(first, "b-1") == 0);
    assert_non_null(strstr(acts[0].message, "queue team-a is within its guarantee"));
    assert_non_null(strstr(acts[0].message, first));
    ext_reclaim r = acts[0].rec;
    /* Under way: neither a second eviction nor a second Event. */
    assert_int_equal(ext_unsched_sweep(&f->st, acts, 4), 0);

    /* A budget refuses: the other 4-GPU pod is chosen; refused too: said once. */
    ext_queues_evicted(&f->st, &r, &r.v[0], EXT_EVICT_BLOCKED);
    assert_int_equal(ext_unsched_sweep(&f->st, acts, 4), 1);
    assert_true(acts[0].evict);
    assert_int_equal(acts[0].rec.nvictims, 1);
    assert_string_not_equal(acts[0].rec.v[0].name, first);
    r = acts[0].rec;
    ext_queues_evicted(&f->st, &r, &r.v[0], EXT_EVICT_BLOCKED);
    assert_int_equal(ext_unsched_sweep(&f->st, acts, 4), 1);
    assert_false(acts[0].evict);
    assert_string_equal(acts[0].type, "Warning");
    assert_string_equal(acts[0].reason, "GPUQueueReclaimBlocked");
    assert_non_null(strstr(acts[0].message, "PodDisruptionBudget"));
    assert_int_equal(ext_unsched_sweep(&f->st, acts, 4), 0); /* the same words, not again */

    /* Bound, or placed by kube-scheduler: forgotten. */
    seen(f, waiting_pod("owner", "team-a", 4, true, "n0"));
    seen(f, waiting_pod("more-b", "team-b", 4, false, NULL));
    assert_int_equal(f->st.unsched.len, 0);
    assert_int_equal(pending_of(f, "team-a"), 0);
}

/* A reclaim for `uid` (team-a, 4 GPUs, into p): its one victim's uid and node. */
static void start_reclaim(fixture *f, const char *uid, kgpu_pod *p, char *victim, char *node)
{
    json_t *j = waiting_pod(uid, "team-a", 4, true, NULL);
    kgpu_error err;
    if (kgpu_pod_from_json(j, 1024, p, &err) != 0 || ext_state_compile(&f->st, p, &err) != 0)
        fail_msg("pod: %s", err.msg);
    json_decref(j);
    ext_reclaim rec;
    char msg[256];
    int q = kgpu_queues_find(f->st.queues, "team-a");
    assert_int_equal(ext_queues_reclaim(&f->st, p, q, false, &rec, msg, sizeof(msg)),
                     EXT_RECLAIM_STARTED);
    assert_int_equal(rec.nvictims, 1);
    snprintf(victim, 64, "%s", rec.v[0].uid);
    snprintf(node, 64, "%.63s", rec.v[0].node);
    assert_string_equal(rec.node, node);
}

/*
 * The room reclaim frees is held for its pod, and only for a while: from
 * when its victims are gone, EXT_RECLAIM_HOLD_S at most; it ends sooner
 * when the pod is deleted or holds GPUs (bound).
 */
static void test_hold_is_bounded(void **state)
{
    fixture *f = *state;
    kgpu_error err;
    set_queues(f, "queues:\n - {name: team-a, guarantee: {gpu: 4}}\n - {name: team-b}\n");
    assert_int_equal(bind(f, "b-0", "team-b", "n0", 4, 0, 0, &err), 0);
    assert_int_equal(bind(f, "b-1", "team-b", "n1", 4, 0, 0, &err), 0);
    kgpu_pod owner, other;
    char victim[64], node[64];
    start_reclaim(f, "owner", &owner, victim, node);
    int idx = kgpu_cluster_find_node(f->st.cluster, node);
    json_t *j = waiting_pod("other", "team-b", 1, true, NULL);
    assert_int_equal(kgpu_pod_from_json(j, 1024, &other, &err), 0);
    json_decref(j);
    assert_int_equal(ext_state_compile(&f->st, &other, &err), 0);
    kgpu_request fit[KGPU_MAX_PARTS];
    const kgpu_request *reqs[KGPU_MAX_PARTS];
    ext_fit_requests(&other, fit, reqs);
    /* Its victim still there: the room it will free is held already. */
    assert_non_null(ext_reclaim_hold_taken(&f->st, idx, "other", reqs, 1));

    ext_state_pod_gone(&f->st, victim);
    ext_reclaims_refresh(&f->st);
    assert_true(kgpu_fit(f->st.cluster, idx, reqs[0], NULL, 0)); /* free, but held */
    const ext_reclaim *h = ext_reclaim_hold_taken(&f->st, idx, "other", reqs, 1);
    assert_non_null(h);
    assert_true(h->freed);
    assert_true(h->until <= ext_now() + EXT_RECLAIM_HOLD_S);
    assert_null(ext_reclaim_hold_taken(&f->st, idx, "owner", reqs, 1)); /* its own */
    /* Its time is up: the room is anyone's. */
    ((ext_reclaim *)h)->until = ext_now() - 1;
    ext_reclaims_refresh(&f->st);
    assert_int_equal(f->st.reclaims.len, 0);
    assert_null(ext_reclaim_hold_taken(&f->st, idx, "other", reqs, 1));

    /* The pod deleted: ended at once. */
    assert_int_equal(bind(f, "b-2", "team-b", node, 4, 0, 0, &err), 0);
    start_reclaim(f, "owner2", &owner, victim, node);
    assert_int_equal(f->st.reclaims.len, 1);
    ext_state_pod_gone(&f->st, "owner2");
    assert_int_equal(f->st.reclaims.len, 0);
    /* Bound: ended too (its victim is still leaving: the next reclaim takes the other). */
    start_reclaim(f, "owner3", &owner, victim, node);
    ext_state_pod_gone(&f->st, victim);
    ext_reclaims_refresh(&f->st);
    assert_int_equal(f->st.reclaims.len, 1);
    assert_int_equal(bind(f, "owner3", "team-a", node, 4, 0, 0, &err), 0);
    ext_reclaims_refresh(&f->st);
    assert_int_equal(f->st.reclaims.len, 0);
}

/*
 * A reason kube-scheduler posts on a tenant's pod names a pod of its own
 * namespace, never one of another (docs/security.md).
 */
static void test_await_reason_names_own_namespace_only(void **state)
{
    (void)state;
    ext_await w;
    memset(&w, 0, sizeof(w));
    snprintf(w.ns, sizeof(w.ns), "team-a");
    snprintf(w.name, sizeof(w.name), "secret-job");
    ext_ask same = {.res = EXT_RES_MEM, .amount = 4};
    char buf[256];
    ext_await_reason(&w, &same, "team-a", buf, sizeof(buf));
    assert_string_equal(buf, "waiting for kubelet to allocate team-a/secret-job (same "
                             "kgpu.io/gpu-mem: 4); retry shortly");
    ext_await_reason(&w, &same, "team-b", buf, sizeof(buf));
    assert_string_equal(buf, "waiting for kubelet to allocate a pod of another namespace (same "
                             "kgpu.io/gpu-mem: 4); retry shortly");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bind_charges_and_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_charges_survive_rebuilds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_namespace_moves_charges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_label_of_another_teams_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sweep_reclaims_for_unschedulable_pods, setup,
                                        teardown),
        cmocka_unit_test(test_status),
        cmocka_unit_test(test_await_reason_names_own_namespace_only),
        cmocka_unit_test_setup_teardown(test_hold_is_bounded, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
