/*
 * Black-box tests of `kgpu simulate --clusters` (src/cli/simclusters.c,
 * src/core/multisim.c) on small node, pod and clusters files made so that
 * the outcome is forced:
 *
 * - a split where each cluster can serve any pod: kgpu's dispatcher
 *   allocates what one big cluster does; the static table, pinning the one
 *   workload class to one GPU pool, half of it;
 * - pods whose CPU only the big cluster's node has: MultiKueue's
 *   all-at-once dispatcher admits some by GPU quota to the small cluster,
 *   where they wait for good (stuck); kgpu's never does;
 * - the clusters file read as outside input: file:line errors;
 * - flags that do not go together, and the JSON fields.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>

#include "cli_run.h"

static void write_file(const char *name, const char *text, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", tmp, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The results of a --json run, by dispatcher name; the caller decrefs root. */
static json_t *result_of(json_t *root, const char *name)
{
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(root, "results"), i, r) {
        if (strcmp(json_string_value(json_object_get(r, "dispatcher")), name) == 0)
            return r;
    }
    fail_msg("no result for %s", name);
    return NULL;
}

static double num(json_t *r, const char *key)
{
    json_t *v = json_object_get(r, key);
    assert_true(json_is_number(v));
    return json_number_value(v);
}

static json_t *run_json(const char *args)
{
    run_result r = run(args);
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    json_error_t jerr;
    json_t *root = json_loads(r.out, 0, &jerr);
    assert_non_null(root);
    run_free(&r);
    return root;
}

static void test_any_cluster_serves_any_pod(void **state)
{
    (void)state;
    char nodes[300], pods[300], split[300], args[1200];
    write_file("n1.csv",
               "sn,cpu_milli,memory_mib,gpu,model\n"
               "a0,64000,262144,1,T4\na1,64000,262144,1,T4\n"
               "b0,64000,262144,1,P100\nb1,64000,262144,1,P100\n",
               nodes, sizeof(nodes));
    write_file("p1.csv",
               "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
               "deletion_time,scheduled_time\n"
               "p0,1000,1024,1,1000,,LS,Running,1,2,1\np1,1000,1024,1,1000,,LS,Running,1,2,1\n"
               "p2,1000,1024,1,1000,,LS,Running,1,2,1\np3,1000,1024,1,1000,,LS,Running,1,2,1\n",
               pods, sizeof(pods));
    write_file("c1.csv", "# two clusters\nb-site,P100\na-site,T4 # the T4s\n", split,
               sizeof(split));
    snprintf(args, sizeof(args),
             "simulate --nodes '%s' --pods '%s' --clusters '%s' --inflate 1 --seeds 1-3 --json "
             "--no-timing",
             nodes, pods, split);
    json_t *root = run_json(args);
    /* Names sorted: MultiKueue's incremental order. */
    json_t *cl = json_object_get(root, "clusters");
    assert_int_equal(json_array_size(cl), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(cl, 0), "name")),
                        "a-site");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(cl, 1), "gpus")), 2);
    assert_float_equal(num(result_of(root, "one"), "alloc_pct_final"), 100.0, 1e-9);
    assert_float_equal(num(result_of(root, "kgpu"), "alloc_pct_final"), 100.0, 1e-9);
    /* Not a default row: the five dispatchers the study compares. */
    assert_int_equal(json_array_size(json_object_get(root, "results")), 5);
    assert_float_equal(num(result_of(root, "all-at-once"), "alloc_pct_final"), 100.0, 1e-9);
    /* One class, one pool of two GPUs: half. */
    assert_float_equal(num(result_of(root, "static"), "alloc_pct_final"), 50.0, 1e-9);
    assert_float_equal(num(result_of(root, "static"), "gpu_pods_failed"), 2.0, 1e-9);
    json_decref(root);
    /* The same inputs, the same bytes. */
    run_result x = run(args), y = run(args);
    assert_string_equal(x.out, y.out);
    run_free(&x);
    run_free(&y);
}

static void test_quota_admits_where_it_does_not_fit(void **state)
{
    (void)state;
    char nodes[300], pods[300], split[300], args[1200];
    /* small: one GPU but 4 cores; big: four GPUs and 64 cores. Every pod asks 8 cores. */
    write_file("n2.csv",
               "sn,cpu_milli,memory_mib,gpu,model\n"
               "small0,4000,262144,1,T4\nbig0,64000,262144,4,T4\n",
               nodes, sizeof(nodes));
    write_file("p2.csv",
               "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
               "deletion_time,scheduled_time\n"
               "p0,8000,1024,1,1000,,LS,Running,1,2,1\np1,8000,1024,1,1000,,LS,Running,1,2,1\n"
               "p2,8000,1024,1,1000,,LS,Running,1,2,1\np3,8000,1024,1,1000,,LS,Running,1,2,1\n"
               "p4,8000,1024,1,1000,,LS,Running,1,2,1\n",
               pods, sizeof(pods));
    write_file("c2.csv", "small,T4,1/2\nbig,T4,2/2\n", split, sizeof(split));
    snprintf(args, sizeof(args),
             "simulate --nodes '%s' --pods '%s' --clusters '%s' --inflate 1 --seeds 1-9 --json "
             "--no-timing --dispatch kgpu,all-at-once,incremental,kgpu-separate",
             nodes, pods, split);
    json_t *root = run_json(args);
    json_t *k = result_of(root, "kgpu"), *a = result_of(root, "all-at-once");
    /* Each cluster its own kgpu, asked through kgpu_estimate_shape: the same four. */
    json_t *sep = result_of(root, "kgpu-separate");
    assert_float_equal(num(sep, "stuck"), 0, 1e-9);
    assert_float_equal(num(sep, "alloc_pct_final"), 80.0, 1e-9);
    assert_float_equal(num(sep, "gpu_pods_failed"), 1, 1e-9);
    /* kgpu never sends a pod where it cannot run: the four that fit run. */
    assert_float_equal(num(k, "stuck"), 0, 1e-9);
    assert_float_equal(num(k, "alloc_pct_final"), 80.0, 1e-9);
    /* Quota alone: the small cluster's one GPU of quota takes a pod that waits there. */
    assert_true(num(a, "stuck") >= 1);
    assert_true(num(a, "alloc_pct_final") <= num(k, "alloc_pct_final"));
    assert_true(num(result_of(root, "incremental"), "stuck") >= 1);
    assert_int_equal(json_array_size(json_object_get(root, "results")), 4);
    json_decref(root);
}

/* Pods pinned to P100s: with one Kueue flavor per cluster they are admitted by the T4 cluster's
 * quota too and wait there; with a flavor per model, only where P100s are. */
static void test_kueue_flavors(void **state)
{
    (void)state;
    char nodes[300], pods[300], split[300], args[1200];
    write_file("n3.csv",
               "sn,cpu_milli,memory_mib,gpu,model\nt0,64000,262144,2,T4\np0,64000,262144,2,P100\n",
               nodes, sizeof(nodes));
    write_file("p3.csv",
               "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
               "deletion_time,scheduled_time\n"
               "p0,1000,1024,1,1000,P100,LS,Running,1,2,1\np1,1000,1024,1,1000,P100,LS,Running,1,2,1\n",
               pods, sizeof(pods));
    write_file("c3.csv", "t4s,T4\np100s,P100\n", split, sizeof(split));
    const char *modes[] = {"one", "per-model"};
    double stuck[2], alloc[2];
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof(args),
                 "simulate --nodes '%s' --pods '%s' --clusters '%s' --inflate 0.5 --seeds 1-9 "
                 "--json --no-timing --dispatch kgpu,all-at-once --kueue-flavors %s",
                 nodes, pods, split, modes[i]);
        json_t *root = run_json(args);
        assert_string_equal(json_string_value(json_object_get(root, "kueue_flavors")), modes[i]);
        json_t *a = result_of(root, "all-at-once");
        stuck[i] = num(a, "stuck");
        alloc[i] = num(a, "alloc_pct_final");
        /* kgpu's dispatcher reads the pods' models whatever Kueue's flavors. */
        assert_float_equal(num(result_of(root, "kgpu"), "alloc_pct_final"), 50.0, 1e-9);
        json_decref(root);
    }
    assert_true(stuck[0] >= 1);
    assert_float_equal(stuck[1], 0, 1e-9);
    assert_float_equal(alloc[1], 50.0, 1e-9);
    assert_true(alloc[0] < alloc[1]);
    run_result r = run("simulate " EXAMPLE " --kueue-flavors per-model");
    assert_int_equal(r.status, 2);
    run_free(&r);
    r = run("simulate " EXAMPLE " --clusters examples/clusters-alibaba.csv --kueue-flavors x");
    assert_int_equal(r.status, 2);
    run_free(&r);
}

static void test_bad_clusters_files(void **state)
{
    (void)state;
    char split[300], args[1200];
    static const struct {
        const char *text, *words;
    } cases[] = {
        {"a,NOPE\n", "c.csv:1: no node of GPU model 'NOPE'"},
        {"# x\n\nA,P100\n", "c.csv:3: cluster 'A' is not a DNS label"},
        {"a,P100,3/2\n", "c.csv:1: part '3/2'"},
        {"a,P100,0/2\n", "c.csv:1: part '0/2'"},
        {"a,P100\nb,P100,1/2\n", "c.csv:2: node example-node-0001 is already in cluster a (line 1)"},
        {"a\n", "c.csv:1: expected CLUSTER,MODEL[,K/N]"},
        {"a,P100,1/2,x\n", "c.csv:1: expected CLUSTER,MODEL[,K/N]"},
        {"# nothing\n", "c.csv: no cluster"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_file("c.csv", cases[i].text, split, sizeof(split));
        snprintf(args, sizeof(args), "simulate " EXAMPLE " --clusters '%s' --seeds 1", split);
        run_result r = run(args);
        assert_int_equal(r.status, 1);
        if (strstr(r.err, cases[i].words) == NULL)
            fail_msg("case %zu: '%s' not in: %s", i, cases[i].words, r.err);
        run_free(&r);
    }
    /* A prices file without one of the trace's models. */
    write_file("c.csv", "a,P100\nb,V100M32\n", split, sizeof(split));
    char prices[300];
    write_file("p.yaml", "prices:\n  currency: EUR\n  gpu:\n    P100: {onDemand: 1, spot: 0.5}\n",
               prices, sizeof(prices));
    snprintf(args, sizeof(args), "simulate " EXAMPLE " --clusters '%s' --prices '%s' --seeds 1",
             split, prices);
    run_result r = run(args);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "no price for GPU model V100M32"));
    run_free(&r);
    /* Flags that do not go together. */
    static const char *const bad[] = {
        "simulate " EXAMPLE " --dispatch kgpu",
        "simulate " EXAMPLE " --clusters examples/clusters-alibaba.csv --churn",
        "simulate " EXAMPLE " --clusters examples/clusters-alibaba.csv --dispatch kgpu,nope",
        "simulate " EXAMPLE " --clusters examples/clusters-alibaba.csv --dispatch kgpu,kgpu",
        "simulate " EXAMPLE " --prices examples/prices.yaml",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = run(bad[i]);
        if (r.status != 2)
            fail_msg("'%s' exited %d: %s", bad[i], r.status, r.err);
        run_free(&r);
    }
    snprintf(args, sizeof(args), "simulate " EXAMPLE " --clusters '%s' --policy fgd,bestfit",
             split);
    r = run(args);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "one --policy"));
    run_free(&r);
}

static void test_table_with_prices(void **state)
{
    (void)state;
    char split[300], args[1200];
    write_file("c.csv", "old,P100\nnew,V100M32\n", split, sizeof(split));
    snprintf(args, sizeof(args),
             "simulate " EXAMPLE " --clusters '%s' --prices examples/prices.yaml --seeds 1-3",
             split);
    run_result r = run(args);
    assert_int_equal(r.status, 0);
    static const char *const words[] = {"dispatcher", "alloc% final", "vs one", "stuck",
                                        "per GPU-hour", "all-at-once", "incremental", "static",
                                        "new", "old", "V100M32"};
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (strstr(r.out, words[i]) == NULL)
            fail_msg("'%s' not in:\n%s", words[i], r.out);
    run_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_any_cluster_serves_any_pod),
        cmocka_unit_test(test_quota_admits_where_it_does_not_fit),
        cmocka_unit_test(test_kueue_flavors),
        cmocka_unit_test(test_bad_clusters_files),
        cmocka_unit_test(test_table_with_prices),
    };
    if (cli_tmp_make("kgpu-clusters") != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, cli_tmp_remove);
}
