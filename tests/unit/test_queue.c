/*
 * Unit tests of GPU queues (src/core/queue.c, src/common/queuefile.c): the
 * tree and its checks, the quota arithmetic and its reasons, the pod to
 * queue rule, a seeded property test that no sequence of charges and
 * releases leaves a queue over its limit, reclaim (which pods, never one
 * within its queue's guarantee, fragmentation-aware against priority/age)
 * and the file reader's errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kgpu/model.h"
#include "kgpu/queue.h"
#include "kgpu/rng.h"
#include "queuefile.h"

#define UNSET ((kgpu_qamount){KGPU_QUEUE_UNSET, KGPU_QUEUE_UNSET})
#define GPUS(x) ((kgpu_qamount){(int64_t)((x) * 1000), KGPU_QUEUE_UNSET})

static kgpu_queues *build(const kgpu_queue_spec *s, int n)
{
    kgpu_queues *qs = NULL;
    kgpu_error e;
    kgpu_error_clear(&e);
    if (kgpu_queues_new(s, n, &qs, &e) != 0)
        fail_msg("kgpu_queues_new: %s", e.msg);
    return qs;
}

static int build_err(const kgpu_queue_spec *s, int n, kgpu_error *e)
{
    kgpu_queues *qs = NULL;
    kgpu_error_clear(e);
    int rc = kgpu_queues_new(s, n, &qs, e);
    assert_null(qs);
    return rc;
}

static kgpu_qdemand milli(int64_t m)
{
    kgpu_qdemand d;
    memset(&d, 0, sizeof(d));
    d.milli = m;
    return d;
}

static void test_gpus_str(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(kgpu_queue_gpus_str(4000, b, sizeof(b)), "4");
    assert_string_equal(kgpu_queue_gpus_str(4500, b, sizeof(b)), "4.5");
    assert_string_equal(kgpu_queue_gpus_str(250, b, sizeof(b)), "0.25");
    assert_string_equal(kgpu_queue_gpus_str(1001, b, sizeof(b)), "1.001");
    assert_string_equal(kgpu_queue_gpus_str(0, b, sizeof(b)), "0");
}

static void test_name_rule(void **state)
{
    (void)state;
    assert_string_equal(kgpu_queue_name_for("team-a", "team-b"), "team-a");
    assert_string_equal(kgpu_queue_name_for("", "team-b"), "team-b");
    assert_string_equal(kgpu_queue_name_for(NULL, "team-b"), "team-b");
    assert_string_equal(kgpu_queue_name_for(NULL, ""), "default");
    assert_string_equal(kgpu_queue_name_for(NULL, NULL), "default");
}

static kgpu_queues *loadq(const char *text)
{
    kgpu_queues *qs = NULL;
    kgpu_error e;
    if (kgpu_queues_load(text, strlen(text), "q.yaml", &qs, &e) != 0)
        fail_msg("load: %s", e.msg);
    return qs;
}

static int load_err(const char *text, kgpu_error *e)
{
    kgpu_queues *qs = NULL;
    kgpu_error_clear(e);
    int rc = kgpu_queues_load(text, strlen(text), "q.yaml", &qs, e);
    assert_null(qs);
    return rc;
}

/*
 * Issue 24, item 1: a pod's label chooses only among the queues its
 * namespace may use: its own queue (the namespace's annotation, written by
 * an administrator) and those below it, and queues whose namespaces or
 * namespaceSelector admit the namespace, and those below them. Any other
 * queue, and one that does not exist, is refused in the same words,
 * naming only the namespace, the queue the pod gave and its own.
 */
static void test_pick_by_namespace(void **state)
{
    (void)state;
    kgpu_queues *qs = loadq("queues:\n"
                           "  - {name: org, namespaces: [ml-a]}\n"
                           "  - {name: team-a, parent: org, limit: {gpu: 2}}\n"
                           "  - {name: team-b, namespaceSelector: {matchLabels: {team: b}}}\n"
                           "  - name: team-c\n"
                           "    namespaceSelector:\n"
                           "      matchExpressions:\n"
                           "        - {key: tier, operator: In, values: [gold, silver]}\n"
                           "        - {key: env, operator: NotIn, values: [dev]}\n"
                           "        - {key: frozen, operator: DoesNotExist}\n"
                           "  - {name: by-name, namespaceSelector: {matchExpressions: "
                           "[{key: kubernetes.io/metadata.name, operator: In, values: [n9]}]}}\n"
                           "  - {name: tenant, limit: {gpu: 1}}\n"
                           "  - {name: tenant-x, parent: tenant}\n"
                           "  - {name: open, namespaceSelector: {}}\n");
    char why[512];
    kgpu_label lb[] = {{"team", "b"}}, lc[] = {{"env", "prod"}, {"tier", "gold"}},
               ld[] = {{"env", "dev"}, {"tier", "gold"}}, lf[] = {{"frozen", ""}, {"tier", "gold"}};
    kgpu_queue_ns tenant = {.name = "tenant", .queue = "tenant"}, mla = {.name = "ml-a"},
                  nb = {.name = "nb", .labels = lb, .nlabels = 1},
                  nc = {.name = "nc", .labels = lc, .nlabels = 2},
                  nd = {.name = "nd", .labels = ld, .nlabels = 2},
                  nf = {.name = "nf", .labels = lf, .nlabels = 2}, n9 = {.name = "n9"};
#define PICK(ns, label) kgpu_queues_pick(qs, &(ns), (label), why, sizeof(why))
#define ID(name)        kgpu_queues_find(qs, name)
    /* No label: the namespace's queue, else default. */
    assert_int_equal(PICK(tenant, NULL), ID("tenant"));
    assert_int_equal(PICK(tenant, ""), ID("tenant"));
    assert_int_equal(PICK(mla, NULL), ID("default"));
    /* Its own queue and those below it. */
    assert_int_equal(PICK(tenant, "tenant"), ID("tenant"));
    assert_int_equal(PICK(tenant, "tenant-x"), ID("tenant-x"));
    /* The attack: another team's queue, or default (no limit), by label. */
    assert_int_equal(PICK(tenant, "team-a"), -1);
    assert_string_equal(why, "queue team-a (the pod's kgpu.io/queue label) does not exist or is "
                             "not open to namespace tenant: a namespace uses its own queue "
                             "(tenant), the queues below it, and the queues whose GPUQueue "
                             "admits it (docs/queues.md)");
    assert_null(strstr(why, "org"));
    assert_int_equal(PICK(tenant, "default"), -1);
    assert_int_equal(PICK(tenant, "org"), -1);
    char other[512];
    assert_int_equal(kgpu_queues_pick(qs, &tenant, "no-such", other, sizeof(other)), -1);
    assert_non_null(strstr(other, "queue no-such (the pod's kgpu.io/queue label) does not "
                                  "exist or is not open to namespace tenant"));
    /* Listed: the queue and those below it. */
    assert_int_equal(PICK(mla, "org"), ID("org"));
    assert_int_equal(PICK(mla, "team-a"), ID("team-a"));
    assert_int_equal(PICK(mla, "team-b"), -1);
    /* Selected by labels; every requirement must hold. */
    assert_int_equal(PICK(nb, "team-b"), ID("team-b"));
    assert_int_equal(PICK(nb, "team-c"), -1);
    assert_int_equal(PICK(nc, "team-c"), ID("team-c"));
    assert_int_equal(PICK(nd, "team-c"), -1);
    assert_int_equal(PICK(nf, "team-c"), -1);
    /* The API server's own name label reads as the name when not passed. */
    assert_int_equal(PICK(n9, "by-name"), ID("by-name"));
    assert_int_equal(PICK(nb, "by-name"), -1);
    /* An empty selector selects every namespace. */
    assert_int_equal(PICK(tenant, "open"), ID("open"));
    /* A namespace whose annotation names no queue. */
    kgpu_queue_ns lost = {.name = "lost", .queue = "gone"};
    assert_int_equal(PICK(lost, NULL), -1);
    assert_string_equal(why, "queue gone does not exist (named by namespace lost's "
                             "kgpu.io/queue annotation)");
    /* Clones share the rules. */
    kgpu_queues *c = kgpu_queues_clone(qs);
    kgpu_queues_free(qs);
    qs = c;
    assert_int_equal(PICK(mla, "team-a"), ID("team-a"));
    assert_int_equal(PICK(tenant, "team-a"), -1);
#undef PICK
#undef ID
    kgpu_queues_free(qs);

    kgpu_error e;
    assert_int_equal(load_err("queues: [{name: a, namespaces: [Bad_Name]}]\n", &e), KGPU_EINVAL);
    assert_non_null(strstr(e.msg, "queue a: namespaces[0] 'Bad_Name'"));
    assert_int_equal(load_err("queues: [{name: a, namespaces: ns}]\n", &e), KGPU_EPARSE);
    assert_non_null(strstr(e.msg, "queues[0] (a).namespaces: expected a list"));
    assert_int_equal(load_err("queues: [{name: a, namespaceSelector: {matchExpressions: "
                              "[{key: k, operator: Near, values: [x]}]}}]\n", &e),
                     KGPU_EPARSE);
    assert_non_null(strstr(e.msg, "operator: In, NotIn, Exists or DoesNotExist"));
    assert_int_equal(load_err("queues: [{name: a, namespaceSelector: {matchExpressions: "
                              "[{key: k, operator: Exists, values: [x]}]}}]\n", &e),
                     KGPU_EINVAL);
    assert_non_null(strstr(e.msg, "Exists and DoesNotExist take no values"));
    assert_int_equal(load_err("queues: [{name: a, namespaceSelector: {matchLabels: {k: [1]}}}]\n",
                              &e),
                     KGPU_EPARSE);
    assert_int_equal(load_err("queues: [{name: a, namespaceSelector: {matchFields: {}}}]\n", &e),
                     KGPU_EPARSE);
    assert_non_null(strstr(e.msg, "namespaceSelector.matchFields: unknown key"));
}

/*
 * Issue 24, item 7: a guarantee some limit above it can never let the
 * queue reach is refused at load, naming the queue and the limit: alone
 * (a child guaranteed 4 GPUs under a parent limited to 2, or further up),
 * together (siblings whose guarantees add up past their parent's limit),
 * in memory, and per model.
 */
static void test_guarantees_honoured(void **state)
{
    (void)state;
    kgpu_error e;
    assert_int_equal(load_err("queues:\n"
                              "  - {name: team-a, limit: {gpu: 2}}\n"
                              "  - {name: ml, parent: team-a, guarantee: {gpu: 4}}\n",
                              &e),
                     KGPU_EINVAL);
    assert_string_equal(e.msg, "q.yaml: queue ml: guarantee.gpu 4 cannot be honoured: queue "
                               "team-a above it has limit.gpu 2");
    /* Two levels up, through a queue that guarantees nothing itself. */
    assert_int_equal(load_err("queues:\n"
                              "  - {name: org, limit: {gpu: 3}}\n"
                              "  - {name: team-a, parent: org}\n"
                              "  - {name: ml, parent: team-a, guarantee: {gpu: 3.5}}\n",
                              &e),
                     KGPU_EINVAL);
    assert_string_equal(e.msg, "q.yaml: queue ml: guarantee.gpu 3.5 cannot be honoured: queue "
                               "org above it has limit.gpu 3");
    /* Siblings together. */
    assert_int_equal(load_err("queues:\n"
                              "  - {name: org, limit: {gpu: 4}}\n"
                              "  - {name: x, parent: org, guarantee: {gpu: 3}}\n"
                              "  - {name: y, parent: org, guarantee: {gpu: 3}}\n",
                              &e),
                     KGPU_EINVAL);
    assert_string_equal(e.msg, "q.yaml: queue org: the queues below it are guaranteed 6 GPUs "
                               "together, more than its limit.gpu 4: they cannot all have their "
                               "guarantee at once");
    /* Memory. */
    assert_int_equal(load_err("queues:\n"
                              "  - {name: org, limit: {memory: 40Gi}}\n"
                              "  - {name: x, parent: org, guarantee: {memory: 80Gi}}\n",
                              &e),
                     KGPU_EINVAL);
    assert_string_equal(e.msg, "q.yaml: queue x: guarantee.memory 81920 MiB cannot be honoured: "
                               "queue org above it has limit.memory 40960 MiB");
    /* Per model: against a model limit above, and against the queue's own total limit. */
    assert_int_equal(load_err("queues:\n"
                              "  - {name: org, models: [{model: A100, limit: {gpu: 2}}]}\n"
                              "  - {name: x, parent: org, models: [{model: A100, guarantee: "
                              "{gpu: 4}}]}\n",
                              &e),
                     KGPU_EINVAL);
    assert_string_equal(e.msg, "q.yaml: queue x: models.A100.guarantee.gpu 4 cannot be honoured: "
                               "queue org above it has models.A100.limit.gpu 2");
    assert_int_equal(load_err("queues:\n"
                              "  - {name: x, limit: {gpu: 1}, models: [{model: A100, guarantee: "
                              "{gpu: 2}}]}\n",
                              &e),
                     KGPU_EINVAL);
    assert_string_equal(e.msg, "q.yaml: queue x: models.A100.guarantee.gpu 2 above limit.gpu 1");
    /* A parent's own guarantee answers for its children; exactly at the limit is fine. */
    kgpu_queues *qs = loadq("queues:\n"
                           "  - {name: org, limit: {gpu: 4}}\n"
                           "  - {name: team-a, parent: org, guarantee: {gpu: 4}}\n"
                           "  - {name: x, parent: team-a, guarantee: {gpu: 2}}\n"
                           "  - {name: y, parent: team-a, guarantee: {gpu: 2}}\n"
                           "  - {name: borrow, parent: org, limit: {gpu: 4}}\n");
    kgpu_queues_free(qs);
}

static void test_tree(void **state)
{
    (void)state;
    /* The child before its parent: parents are resolved after every name is known. */
    kgpu_queue_spec s[] = {
        {.name = "team-a", .parent = "org", .guarantee = GPUS(2), .limit = GPUS(6), .weight = 2},
        {.name = "org", .guarantee = GPUS(4), .limit = GPUS(8)},
        {.name = "team-b", .parent = "org", .guarantee = GPUS(2), .limit = UNSET},
    };
    kgpu_queues *qs = build(s, 3);
    assert_int_equal(kgpu_queues_count(qs), 4); /* + default */
    int d = kgpu_queues_find(qs, "default");
    assert_int_equal(d, 3);
    kgpu_queue_info qi;
    assert_int_equal(kgpu_queues_info(qs, 0, &qi), 0);
    assert_int_equal(qi.parent, 1);
    assert_int_equal(qi.depth, 1);
    assert_int_equal(qi.weight, 2);
    assert_true(qi.leaf);
    assert_int_equal(kgpu_queues_info(qs, 1, &qi), 0);
    assert_false(qi.leaf);
    assert_int_equal(qi.weight, 1); /* 0 means 1 */
    assert_int_equal(kgpu_queues_info(qs, d, &qi), 0);
    assert_int_equal(qi.guarantee.milli, 0);
    assert_int_equal(qi.limit.milli, KGPU_QUEUE_UNSET);
    assert_int_equal(kgpu_queues_info(qs, 9, &qi), KGPU_ENOENT);
    kgpu_queues_free(qs);
}

static void test_tree_errors(void **state)
{
    (void)state;
    kgpu_error e;
    kgpu_queue_spec dup[] = {{.name = "a"}, {.name = "a"}};
    assert_int_equal(build_err(dup, 2, &e), KGPU_EEXIST);
    assert_string_equal(e.msg, "queue a: defined twice");

    kgpu_queue_spec orphan[] = {{.name = "a", .parent = "nope"}};
    assert_int_equal(build_err(orphan, 1, &e), KGPU_ENOENT);
    assert_string_equal(e.msg, "queue a: parent nope is not defined");

    kgpu_queue_spec cycle[] = {{.name = "a", .parent = "b"}, {.name = "b", .parent = "a"}};
    assert_int_equal(build_err(cycle, 2, &e), KGPU_EINVAL);
    assert_non_null(strstr(e.msg, "cycle"));

    kgpu_queue_spec gl[] = {{.name = "team-a", .guarantee = GPUS(5), .limit = GPUS(4)}};
    assert_int_equal(build_err(gl, 1, &e), KGPU_EINVAL);
    assert_string_equal(e.msg, "queue team-a: guarantee.gpu 5 above limit.gpu 4");

    kgpu_queue_spec sum[] = {
        {.name = "org", .guarantee = GPUS(3), .limit = UNSET},
        {.name = "x", .parent = "org", .guarantee = GPUS(2), .limit = UNSET},
        {.name = "y", .parent = "org", .guarantee = GPUS(1.5), .limit = UNSET},
    };
    assert_int_equal(build_err(sum, 3, &e), KGPU_EINVAL);
    assert_string_equal(e.msg, "queue org: its children are guaranteed 3.5 GPUs, more than its "
                               "own guarantee.gpu 3");

    /* KGPU_QUEUE_MAX_DEPTH levels from a root to a leaf, and not one more (issue 24, item 7). */
    char names[KGPU_QUEUE_MAX_DEPTH + 1][8];
    kgpu_queue_spec chain[KGPU_QUEUE_MAX_DEPTH + 1];
    for (int i = 0; i <= KGPU_QUEUE_MAX_DEPTH; i++) {
        snprintf(names[i], sizeof(names[i]), "q%d", i);
        chain[i] = (kgpu_queue_spec){.name = names[i],
                                     .parent = i > 0 ? names[i - 1] : NULL,
                                     .guarantee = GPUS(0),
                                     .limit = UNSET};
    }
    kgpu_queues *deep = build(chain, KGPU_QUEUE_MAX_DEPTH);
    kgpu_queues_free(deep);
    assert_int_equal(build_err(chain, KGPU_QUEUE_MAX_DEPTH + 1, &e), KGPU_EINVAL);
    assert_non_null(strstr(e.msg, "queue q16: "));
    assert_non_null(strstr(e.msg, "more than 16 levels"));

    kgpu_queue_spec bad[] = {{.name = "Team_A"}};
    assert_int_equal(build_err(bad, 1, &e), KGPU_EINVAL);
    kgpu_queue_spec w[] = {{.name = "a", .weight = 1001}};
    assert_int_equal(build_err(w, 1, &e), KGPU_EINVAL);
}

static void test_check_and_reasons(void **state)
{
    (void)state;
    kgpu_queue_spec s[] = {
        {.name = "org", .guarantee = GPUS(4), .limit = GPUS(6)},
        {.name = "team-a", .parent = "org", .guarantee = GPUS(2), .limit = GPUS(4)},
        {.name = "team-b", .parent = "org", .guarantee = GPUS(2), .limit = UNSET},
    };
    kgpu_queues *qs = build(s, 3);
    int a = kgpu_queues_find(qs, "team-a"), b = kgpu_queues_find(qs, "team-b");
    char why[256];
    kgpu_qdemand d = milli(1500);
    assert_int_equal(kgpu_queues_check(qs, a, &d, why, sizeof(why)), KGPU_QUEUE_WITHIN);
    assert_int_equal(kgpu_queues_charge(qs, a, &d, NULL), 0);
    d = milli(1000);
    assert_int_equal(kgpu_queues_check(qs, a, &d, why, sizeof(why)), KGPU_QUEUE_BORROWS);
    assert_int_equal(kgpu_queues_charge(qs, a, &d, NULL), 0);
    assert_int_equal(kgpu_queues_borrowed_milli(qs, a), 500);
    /* 2.5 used: 2 more would pass team-a's own limit. */
    d = milli(2000);
    assert_int_equal(kgpu_queues_check(qs, a, &d, why, sizeof(why)), KGPU_QUEUE_OVER);
    assert_string_equal(why, "queue team-a would use 4.5 GPUs of its limit 4");
    kgpu_error e;
    assert_int_equal(kgpu_queues_charge(qs, a, &d, &e), KGPU_ENOFIT);
    assert_string_equal(e.msg, "queue team-a would use 4.5 GPUs of its limit 4");
    /* team-b borrows the rest of org's limit (6). */
    d = milli(3500);
    assert_int_equal(kgpu_queues_check(qs, b, &d, why, sizeof(why)), KGPU_QUEUE_BORROWS);
    assert_int_equal(kgpu_queues_charge(qs, b, &d, NULL), 0);
    kgpu_queue_info qi;
    kgpu_queues_info(qs, 0, &qi);
    assert_int_equal(qi.used.milli, 6000);
    assert_int_equal(qi.pods, 3);
    /* team-a within its guarantee? No (2.5 used). A 0.5 pod of a new queue... team-b is over. */
    d = milli(500);
    assert_int_equal(kgpu_queues_check(qs, a, &d, why, sizeof(why)), KGPU_QUEUE_OVER);
    assert_string_equal(why, "queue org would use 6.5 GPUs of its limit 6");
    /*
     * team-a down to 1 GPU, team-b borrowing all that frees: a 1-GPU pod of
     * team-a is within its guarantee, only org's limit blocks it: reclaim.
     */
    kgpu_qdemand r = milli(1500);
    assert_int_equal(kgpu_queues_uncharge(qs, a, &r, NULL), 0);
    assert_int_equal(kgpu_queues_charge(qs, b, &r, NULL), 0);
    d = milli(1000);
    assert_int_equal(kgpu_queues_check(qs, a, &d, why, sizeof(why)), KGPU_QUEUE_RECLAIM);
    assert_string_equal(why, "queue org would use 7 GPUs of its limit 6");
    /* Uncharging what was never charged changes nothing. */
    r = milli(5000);
    assert_int_equal(kgpu_queues_uncharge(qs, a, &r, &e), KGPU_ESTATE);
    kgpu_queues_info(qs, 1, &qi);
    assert_int_equal(qi.used.milli, 1000);
    kgpu_queues_free(qs);
}

static void test_memory_and_models(void **state)
{
    (void)state;
    kgpu_cluster *c = kgpu_cluster_new();
    kgpu_gpu_spec g[2] = {
        {.index = 0, .model = "A100", .memory_mib = 81920, .numa = -1, .healthy = true},
        {.index = 1, .model = "T4", .memory_mib = 15360, .numa = -1, .healthy = true},
    };
    kgpu_node_spec ns = {
        .name = "n0", .cpu_milli = 64000, .memory_mib = 256000, .gpus = g, .ngpus = 2};
    assert_true(kgpu_cluster_add_node(c, &ns, NULL) >= 0);
    kgpu_queue_model_spec m[] = {{.model = "A100", .guarantee = GPUS(0.5), .limit = GPUS(1)}};
    kgpu_queue_spec s[] = {{.name = "a",
                            .guarantee = {2000, 40960},
                            .limit = {4000, 61440},
                            .models = m,
                            .nmodels = 1}};
    kgpu_queues *qs = build(s, 1);
    assert_int_equal(kgpu_queues_bind_models(qs, c, NULL), 0);
    kgpu_request req = {
        .cpu_milli = 1000, .gpu_count = 1, .gpu_milli = 700, .gpu_memory_mib = 30720, .shape = -1};
    assert_int_equal(kgpu_request_compile(c, &req, NULL), 0);
    int gpus[1] = {0};
    kgpu_qdemand d;
    kgpu_qdemand_of_placement(c, &req, 0, gpus, &d);
    assert_int_equal(d.nparts, 1);
    assert_int_equal(d.milli, 700);
    char why[256];
    /* 0.7 on A100: within the total guarantee, above the A100 guarantee of 0.5: borrows. */
    assert_int_equal(kgpu_queues_check(qs, 0, &d, why, sizeof(why)), KGPU_QUEUE_BORROWS);
    assert_int_equal(kgpu_queues_charge(qs, 0, &d, NULL), 0);
    /* A second A100 share passes the A100 limit of 1. */
    assert_int_equal(kgpu_queues_check(qs, 0, &d, why, sizeof(why)), KGPU_QUEUE_OVER);
    assert_string_equal(why, "queue a would use 1.4 A100 GPUs of its limit 1");
    /* The same share on the T4: memory 61440 of 61440 is at the limit, not over. */
    gpus[0] = 1;
    req.gpu_memory_mib = 30720;
    kgpu_qdemand_of_placement(c, &req, 0, gpus, &d);
    assert_int_equal(kgpu_queues_check(qs, 0, &d, why, sizeof(why)), KGPU_QUEUE_BORROWS);
    d.mem_mib += 1;
    assert_int_equal(kgpu_queues_check(qs, 0, &d, why, sizeof(why)), KGPU_QUEUE_OVER);
    assert_string_equal(why, "queue a would use 61441 MiB of GPU memory of its limit 61440 MiB");
    /* Without parts (GPUs not chosen yet) the A100 entry does not apply. */
    kgpu_qdemand_of_request(&req, &d);
    assert_int_equal(d.nparts, 0);
    assert_int_equal(kgpu_queues_check(qs, 0, &d, why, sizeof(why)), KGPU_QUEUE_BORROWS);
    kgpu_queues_free(qs);
    kgpu_cluster_free(c);
}

/*
 * Property: whatever sequence of charges and releases is attempted, every
 * queue's usage equals the sum of the live charges in its subtree, and no
 * queue is over its limit. Admission decides through kgpu_queues_check;
 * charge must agree with it.
 */
static void test_property_never_over_limit(void **state)
{
    (void)state;
    kgpu_queue_spec s[] = {
        {.name = "org", .guarantee = GPUS(6), .limit = GPUS(10)},
        {.name = "a", .parent = "org", .guarantee = GPUS(2), .limit = GPUS(5)},
        {.name = "b", .parent = "org", .guarantee = GPUS(3), .limit = UNSET},
        {.name = "b1", .parent = "b", .guarantee = GPUS(1), .limit = GPUS(4)},
        {.name = "b2", .parent = "b", .guarantee = GPUS(2), .limit = GPUS(3.5)},
        {.name = "c", .guarantee = {1000, 20480}, .limit = {3000, 40960}},
    };
    for (uint64_t seed = 1; seed <= 20; seed++) {
        kgpu_queues *qs = build(s, 6);
        int nq = kgpu_queues_count(qs);
        enum { MAXLIVE = 256 };
        struct {
            int q;
            kgpu_qdemand d;
        } live[MAXLIVE];
        int nlive = 0;
        kgpu_rng rng;
        kgpu_rng_seed(&rng, seed, 7);
        for (int step = 0; step < 4000; step++) {
            if (nlive > 0 && (nlive == MAXLIVE || kgpu_rng_below(&rng, 100) < 45)) {
                int i = (int)kgpu_rng_below(&rng, (uint64_t)nlive);
                assert_int_equal(kgpu_queues_uncharge(qs, live[i].q, &live[i].d, NULL), 0);
                live[i] = live[--nlive];
            } else {
                int q = (int)kgpu_rng_below(&rng, (uint64_t)nq);
                kgpu_qdemand d = milli((int64_t)kgpu_rng_below(&rng, 2500) + 1);
                d.mem_mib = (int64_t)kgpu_rng_below(&rng, 16384);
                int st = kgpu_queues_check(qs, q, &d, NULL, 0);
                int rc = kgpu_queues_charge(qs, q, &d, NULL);
                /* Charge takes exactly what admission lets in. */
                assert_int_equal(rc == 0, st == KGPU_QUEUE_WITHIN || st == KGPU_QUEUE_BORROWS);
                if (rc == 0) {
                    live[nlive].q = q;
                    live[nlive].d = d;
                    nlive++;
                }
            }
            for (int q = 0; q < nq; q++) {
                kgpu_queue_info qi;
                kgpu_queues_info(qs, q, &qi);
                int64_t m = 0, mem = 0;
                int pods = 0;
                for (int i = 0; i < nlive; i++) {
                    kgpu_queue_info x;
                    int a = live[i].q;
                    bool under = false;
                    while (a >= 0 && !under) {
                        under = a == q;
                        kgpu_queues_info(qs, a, &x);
                        a = x.parent;
                    }
                    if (under) {
                        m += live[i].d.milli;
                        mem += live[i].d.mem_mib;
                        pods++;
                    }
                }
                assert_int_equal(qi.used.milli, m);
                assert_int_equal(qi.used.mem_mib, mem);
                assert_int_equal(qi.pods, pods);
                if (qi.limit.milli != KGPU_QUEUE_UNSET)
                    assert_true(qi.used.milli <= qi.limit.milli);
                if (qi.limit.mem_mib != KGPU_QUEUE_UNSET)
                    assert_true(qi.used.mem_mib <= qi.limit.mem_mib);
            }
        }
        kgpu_queues_free(qs);
    }
}

/* ---- reclaim ------------------------------------------------------------------------------ */

typedef struct fixture {
    kgpu_cluster *c;
    kgpu_queues *qs;
    kgpu_qpod pods[16];
    size_t npods;
} fixture;

static void place(fixture *f, const char *queue, int prio, int64_t admitted, int node, int gpu,
                  int m)
{
    kgpu_request req = {.cpu_milli = 1000, .memory_mib = 1024, .gpu_count = 1, .gpu_milli = m,
                        .exclusive = m == 1000, .shape = -1};
    assert_int_equal(kgpu_request_compile(f->c, &req, NULL), 0);
    kgpu_qpod *p = &f->pods[f->npods++];
    p->queue = kgpu_queues_find(f->qs, queue);
    p->priority = prio;
    p->admitted = admitted;
    kgpu_error e;
    kgpu_error_clear(&e);
    if (kgpu_cluster_apply(f->c, &req, node, &gpu, &p->a, &e) != 0)
        fail_msg("apply: %s", e.msg);
    kgpu_qdemand_of_assignment(f->c, &p->a, &p->d);
    if (kgpu_queues_charge(f->qs, p->queue, &p->d, &e) != 0)
        fail_msg("charge: %s", e.msg);
}

/*
 * Two nodes of two GPUs; queue a guaranteed 2 GPUs, b 2 GPUs (or 3).
 * node0: gpu0 b 0.5 (started at 30) + b 0.5 (40); gpu1 a 0.5 + b 0.5 (50, the newest).
 * node1: b whole GPU (started at p4_started) on gpu0, an important b pod on gpu1.
 * b uses 3.5 GPUs: 1.5 borrowed. a (0.5 used) waits for a whole GPU.
 */
static void setup(fixture *f, double b_guarantee, int64_t p4_started)
{
    memset(f, 0, sizeof(*f));
    f->c = kgpu_cluster_new();
    for (int n = 0; n < 2; n++) {
        kgpu_gpu_spec g[2];
        for (int i = 0; i < 2; i++)
            g[i] = (kgpu_gpu_spec){.index = i, .model = "V100", .memory_mib = 32768, .numa = -1,
                                   .healthy = true};
        char name[8];
        snprintf(name, sizeof(name), "n%d", n);
        kgpu_node_spec ns = {.name = name, .cpu_milli = 32000, .memory_mib = 131072, .gpus = g,
                             .ngpus = 2};
        assert_true(kgpu_cluster_add_node(f->c, &ns, NULL) >= 0);
    }
    kgpu_queue_spec s[] = {{.name = "a", .guarantee = GPUS(2), .limit = UNSET},
                           {.name = "b", .guarantee = GPUS(b_guarantee), .limit = UNSET}};
    f->qs = build(s, 2);
    place(f, "b", 0, 30, 0, 0, 500);          /* 0 */
    place(f, "b", 0, 40, 0, 0, 500);          /* 1 */
    place(f, "a", 0, 10, 0, 1, 500);          /* 2 */
    place(f, "b", 0, 50, 0, 1, 500);          /* 3: newest */
    place(f, "b", 0, p4_started, 1, 0, 1000); /* 4 */
    place(f, "b", 5, 10, 1, 1, 1000);         /* 5: important */
}

static void teardown(fixture *f)
{
    kgpu_queues_free(f->qs);
    kgpu_cluster_free(f->c);
}

static kgpu_request whole(const kgpu_cluster *c)
{
    kgpu_request r = {.cpu_milli = 1000, .memory_mib = 1024, .gpu_count = 1, .gpu_milli = 1000,
                      .exclusive = true, .shape = -1};
    assert_int_equal(kgpu_request_compile(c, &r, NULL), 0);
    return r;
}

static bool has(const kgpu_reclaim *r, size_t i)
{
    for (size_t k = 0; k < r->nvictims; k++)
        if (r->victims[k] == i)
            return true;
    return false;
}

static void test_reclaim_frag_frees_usable_gpus(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 2, 45);
    kgpu_request req = whole(f.c);
    size_t v[16];
    kgpu_reclaim r = {.victims = v};
    kgpu_error e;
    kgpu_error_clear(&e);
    int a = kgpu_queues_find(f.qs, "a");
    /* Nothing fits now. */
    for (int n = 0; n < 2; n++)
        assert_false(kgpu_fit(f.c, n, &req, NULL, 0));
    assert_int_equal(kgpu_queues_reclaim(f.c, f.qs, f.pods, f.npods, a, &req, KGPU_RECLAIM_FRAG,
                                         NULL, &r, &e),
                     0);
    /*
     * One eviction, of the low-priority whole GPU that started at 45 (less
     * work lost than the two halves on node0's gpu0, started at 30 and 40):
     * nothing freed the pod cannot use, and the pod goes on that GPU.
     */
    assert_int_equal(r.nvictims, 1);
    assert_true(has(&r, 4));
    assert_int_equal(r.node, 1);
    assert_int_equal(r.ngpus, 1);
    assert_int_equal(r.gpus[0], 0);
    assert_int_equal(r.freed_milli, 1000);

    /* Priority and age alone: the newest first, whose half GPU the pod cannot use. */
    assert_int_equal(kgpu_queues_reclaim(f.c, f.qs, f.pods, f.npods, a, &req,
                                         KGPU_RECLAIM_PRIORITY_AGE, NULL, &r, &e),
                     0);
    assert_int_equal(r.nvictims, 2);
    assert_true(has(&r, 3) && has(&r, 4));
    assert_int_equal(r.freed_milli, 1500);
    assert_int_equal(r.ngpus, 0); /* where the pod goes is the scheduler's choice */
    /* Neither ever takes a pod of the waiting queue, nor the important one while others do. */
    assert_false(has(&r, 2));
    assert_false(has(&r, 5));
    teardown(&f);

    /*
     * The whole GPU started long before the halves (at 20): evicting the two
     * halves on node0's gpu0 loses less work (500 x 20 + 500 x 10 against
     * 1000 x 30), and frees nothing the pod does not take either.
     */
    setup(&f, 2, 20);
    assert_int_equal(kgpu_queues_reclaim(f.c, f.qs, f.pods, f.npods, a, &req, KGPU_RECLAIM_FRAG,
                                         NULL, &r, &e),
                     0);
    assert_int_equal(r.nvictims, 2);
    assert_true(has(&r, 0) && has(&r, 1));
    assert_int_equal(r.node, 0);
    assert_int_equal(r.gpus[0], 0);
    teardown(&f);
}

static void test_reclaim_keeps_guarantees(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 3, 45); /* b may lose only 0.5 GPU: no whole GPU can be freed for a */
    kgpu_request req = whole(f.c);
    size_t v[16];
    kgpu_reclaim r = {.victims = v};
    kgpu_error e;
    int a = kgpu_queues_find(f.qs, "a");
    for (int mode = KGPU_RECLAIM_PRIORITY_AGE; mode <= KGPU_RECLAIM_FRAG; mode++) {
        kgpu_error_clear(&e);
        assert_int_equal(kgpu_queues_reclaim(f.c, f.qs, f.pods, f.npods, a, &req,
                                             (kgpu_reclaim_mode)mode, NULL, &r, &e),
                         KGPU_ENOFIT);
        assert_int_equal(r.nvictims, 0);
        assert_string_equal(e.msg, "queue a: evicting the pods that borrow would not make room");
    }
    /* A pod of b (above its guarantee) reclaims nothing from a. */
    int b = kgpu_queues_find(f.qs, "b");
    assert_int_equal(kgpu_queues_reclaim(f.c, f.qs, f.pods, f.npods, b, &req, KGPU_RECLAIM_FRAG,
                                         NULL, &r, &e),
                     KGPU_ENOFIT);
    assert_non_null(strstr(e.msg, "not within its guarantee"));
    teardown(&f);
}

/*
 * The quota path: room on the nodes, but org's limit of 4 GPUs is full
 * because b borrows under it. a's 1-GPU pod is within a's guarantee, so
 * reclaim frees quota: the lowest-priority, newest pod of b that makes room.
 */
static void test_reclaim_frees_an_ancestors_limit(void **state)
{
    (void)state;
    fixture f;
    memset(&f, 0, sizeof(f));
    f.c = kgpu_cluster_new();
    for (int n = 0; n < 2; n++) {
        kgpu_gpu_spec g[4];
        for (int i = 0; i < 4; i++)
            g[i] = (kgpu_gpu_spec){
                .index = i, .model = "V100", .memory_mib = 32768, .numa = -1, .healthy = true};
        char name[8];
        snprintf(name, sizeof(name), "n%d", n);
        kgpu_node_spec ns = {
            .name = name, .cpu_milli = 64000, .memory_mib = 262144, .gpus = g, .ngpus = 4};
        assert_true(kgpu_cluster_add_node(f.c, &ns, NULL) >= 0);
    }
    kgpu_queue_spec s[] = {
        {.name = "org", .guarantee = GPUS(3), .limit = GPUS(4)},
        {.name = "a", .parent = "org", .guarantee = GPUS(2), .limit = UNSET},
        {.name = "b", .parent = "org", .guarantee = GPUS(1), .limit = UNSET},
    };
    f.qs = build(s, 3);
    place(&f, "a", 0, 10, 0, 0, 500);  /* 0 */
    place(&f, "b", 0, 10, 0, 1, 500);  /* 1 */
    place(&f, "b", 0, 20, 0, 2, 1000); /* 2 */
    place(&f, "b", 1, 30, 0, 3, 1000); /* 3: more important */
    place(&f, "b", 0, 40, 1, 0, 1000); /* 4: the newest of the least important */
    int a = kgpu_queues_find(f.qs, "a");
    kgpu_request req = whole(f.c);
    kgpu_qdemand d;
    kgpu_qdemand_of_request(&req, &d);
    char why[256];
    assert_int_equal(kgpu_queues_check(f.qs, a, &d, why, sizeof(why)), KGPU_QUEUE_RECLAIM);
    assert_string_equal(why, "queue org would use 5 GPUs of its limit 4");
    assert_true(kgpu_fit(f.c, 1, &req, NULL, 0)); /* the nodes have room */
    size_t v[16];
    kgpu_reclaim r = {.victims = v};
    kgpu_error e;
    for (int mode = KGPU_RECLAIM_PRIORITY_AGE; mode <= KGPU_RECLAIM_FRAG; mode++) {
        kgpu_error_clear(&e);
        assert_int_equal(kgpu_queues_reclaim(f.c, f.qs, f.pods, f.npods, a, &req,
                                             (kgpu_reclaim_mode)mode, NULL, &r, &e),
                         0);
        assert_int_equal(r.nvictims, 1);
        assert_true(has(&r, 4));
        assert_true(r.node >= 0);
    }
    /* a at its guarantee of 0.5: one more half GPU would borrow under a full org. */
    kgpu_queues_free(f.qs);
    kgpu_queue_spec s2[] = {
        {.name = "org", .guarantee = GPUS(4), .limit = GPUS(4)},
        {.name = "a", .parent = "org", .guarantee = GPUS(0.5), .limit = UNSET},
        {.name = "b", .parent = "org", .guarantee = GPUS(3.5), .limit = UNSET},
    };
    f.qs = build(s2, 3);
    for (size_t i = 0; i < f.npods; i++) {
        f.pods[i].queue = kgpu_queues_find(f.qs, i == 0 ? "a" : "b");
        assert_int_equal(kgpu_queues_charge(f.qs, f.pods[i].queue, &f.pods[i].d, NULL), 0);
    }
    kgpu_request half = {.cpu_milli = 1000, .memory_mib = 1024, .gpu_count = 1, .gpu_milli = 500,
                         .shape = -1};
    assert_int_equal(kgpu_request_compile(f.c, &half, NULL), 0);
    kgpu_qdemand_of_request(&half, &d);
    assert_int_equal(kgpu_queues_check(f.qs, a, &d, why, sizeof(why)), KGPU_QUEUE_OVER);
    assert_string_equal(why, "queue org would use 4.5 GPUs of its limit 4");
    /* Refused, not reclaimed for: a pod above its guarantee takes nothing back. */
    assert_int_equal(kgpu_queues_reclaim(f.c, f.qs, f.pods, f.npods, a, &half, KGPU_RECLAIM_FRAG,
                                         NULL, &r, &e),
                     KGPU_ENOFIT);
    teardown(&f);
}

/* ---- the file ----------------------------------------------------------------------------- */

static int load(const char *text, kgpu_queues **qs, kgpu_error *e)
{
    kgpu_error_clear(e);
    return kgpu_queues_load(text, strlen(text), "q.yaml", qs, e);
}

static void test_file(void **state)
{
    (void)state;
    kgpu_queues *qs;
    kgpu_error e;
    const char *ok = "listen: 0.0.0.0:1\n"
                     "queues:\n"
                     "  - name: org\n"
                     "    guarantee: {gpu: 8, memory: 320Gi}\n"
                     "    limit: {gpu: 12}\n"
                     "  - name: team-a\n"
                     "    parent: org\n"
                     "    weight: 3\n"
                     "    guarantee: {gpu: 4.5}\n"
                     "    models:\n"
                     "      - {model: A100, limit: {gpu: \"1500m\"}}\n";
    assert_int_equal(load(ok, &qs, &e), 0);
    assert_non_null(qs);
    kgpu_queue_info qi;
    int a = kgpu_queues_find(qs, "team-a");
    assert_int_equal(kgpu_queues_info(qs, a, &qi), 0);
    assert_int_equal(qi.guarantee.milli, 4500);
    assert_int_equal(qi.guarantee.mem_mib, KGPU_QUEUE_UNSET);
    assert_int_equal(qi.weight, 3);
    assert_int_equal(kgpu_queues_info(qs, kgpu_queues_find(qs, "org"), &qi), 0);
    assert_int_equal(qi.guarantee.mem_mib, 320 * 1024);
    assert_int_equal(qi.limit.milli, 12000);
    kgpu_queues_free(qs);

    assert_int_equal(load("listen: x\n", &qs, &e), 0);
    assert_null(qs);

    assert_int_equal(load("queues:\n  - name: a\n    gaurantee: {gpu: 1}\n", &qs, &e), KGPU_EPARSE);
    assert_string_equal(e.msg, "q.yaml: queues[0] (a).gaurantee: unknown key (name, parent, "
                               "guarantee, limit, weight, models, namespaces, "
                               "namespaceSelector)");
    assert_int_equal(load("queues:\n  - name: a\n  - name: b\n    limit: {gpu: -1}\n", &qs, &e),
                     KGPU_EPARSE);
    assert_non_null(strstr(e.msg, "q.yaml: queues[1] (b).limit.gpu: expected GPUs"));
    assert_int_equal(load("queues:\n  - name: a\n    limit: {gpu: 0.0005}\n", &qs, &e),
                     KGPU_EPARSE);
    assert_int_equal(load("queues:\n  - parent: a\n", &qs, &e), KGPU_EPARSE);
    assert_string_equal(e.msg, "q.yaml: queues[0] (no name).name: missing, or not a string");
    assert_int_equal(load("queues:\n  - name: a\n    parent: b\n", &qs, &e), KGPU_ENOENT);
    assert_string_equal(e.msg, "q.yaml: queue a: parent b is not defined");
    assert_int_equal(load("queues:\n  - name: a\n    weight: 0\n", &qs, &e), KGPU_EPARSE);
    assert_string_equal(e.msg, "q.yaml: queues[0] (a).weight: expected an integer 1..1000");
    assert_int_equal(load("queues: 3\n", &qs, &e), KGPU_EPARSE);
    assert_int_equal(load("queues:\n  - name: a\n    models: [{limit: {gpu: 1}}]\n", &qs, &e),
                     KGPU_EPARSE);
    assert_string_equal(e.msg, "q.yaml: queues[0] (a).models[0].model: missing");
    /* The GPUQueue form: gpu and memory int-or-string, as Kubernetes quantities. */
    assert_int_equal(load("queues:\n  - name: a\n"
                          "    guarantee: {gpu: \"0.5\", memory: 1073741824}\n"
                          "    limit: {gpu: \"4\", memory: \"40Gi\"}\n"
                          "  - name: b\n    limit: {gpu: \"500m\", memory: \"1.5Gi\"}\n",
                          &qs, &e),
                     0);
    assert_int_equal(kgpu_queues_info(qs, kgpu_queues_find(qs, "a"), &qi), 0);
    assert_int_equal(qi.guarantee.milli, 500);
    assert_int_equal(qi.guarantee.mem_mib, 1024);
    assert_int_equal(qi.limit.milli, 4000);
    assert_int_equal(qi.limit.mem_mib, 40 * 1024);
    assert_int_equal(kgpu_queues_info(qs, kgpu_queues_find(qs, "b"), &qi), 0);
    assert_int_equal(qi.limit.milli, 500);
    assert_int_equal(qi.limit.mem_mib, 1536);
    kgpu_queues_free(qs);
    assert_int_equal(load("queues:\n  - name: a\n    limit: {memory: \"lots\"}\n", &qs, &e),
                     KGPU_EPARSE);
    assert_non_null(strstr(e.msg, "q.yaml: queues[0] (a).limit.memory: expected GPU memory"));
    /* YAML syntax errors carry the line. */
    assert_int_equal(load("queues:\n  - name: a\n   bad: [\n", &qs, &e), KGPU_EPARSE);
    assert_non_null(strstr(e.msg, "q.yaml:"));
}

/* A pod that runs already is charged even past a limit; then only new pods are refused. */
static void test_charge_running(void **state)
{
    (void)state;
    kgpu_queue_spec s[] = {{.name = "a", .limit = GPUS(2)}};
    kgpu_queues *qs = build(s, 1);
    int a = kgpu_queues_find(qs, "a");
    kgpu_qdemand d = milli(1500);
    assert_int_equal(kgpu_queues_charge_running(qs, a, &d, NULL), 0);
    assert_int_equal(kgpu_queues_charge_running(qs, a, &d, NULL), 0);
    kgpu_queue_info qi;
    kgpu_queues_info(qs, a, &qi);
    assert_int_equal(qi.used.milli, 3000);
    assert_int_equal(qi.pods, 2);
    char why[128];
    kgpu_qdemand one = milli(100);
    assert_int_equal(kgpu_queues_check(qs, a, &one, why, sizeof(why)), KGPU_QUEUE_OVER);
    assert_string_equal(why, "queue a would use 3.1 GPUs of its limit 2");
    assert_int_equal(kgpu_queues_charge(qs, a, &one, NULL), KGPU_ENOFIT);
    assert_int_equal(kgpu_queues_uncharge(qs, a, &d, NULL), 0);
    assert_int_equal(kgpu_queues_uncharge(qs, a, &d, NULL), 0);
    assert_int_equal(kgpu_queues_charge(qs, a, &one, NULL), 0);
    assert_int_equal(kgpu_queues_charge_running(qs, 7, &one, NULL), KGPU_ENOENT);
    kgpu_queues_free(qs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpus_str),
        cmocka_unit_test(test_name_rule),
        cmocka_unit_test(test_tree),
        cmocka_unit_test(test_pick_by_namespace),
        cmocka_unit_test(test_guarantees_honoured),
        cmocka_unit_test(test_tree_errors),
        cmocka_unit_test(test_check_and_reasons),
        cmocka_unit_test(test_memory_and_models),
        cmocka_unit_test(test_property_never_over_limit),
        cmocka_unit_test(test_reclaim_frag_frees_usable_gpus),
        cmocka_unit_test(test_reclaim_keeps_guarantees),
        cmocka_unit_test(test_reclaim_frees_an_ancestors_limit),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_charge_running),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
