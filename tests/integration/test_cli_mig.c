/*
 * Black-box tests of `kgpu simulate --mig` (src/cli/simmig.c,
 * src/core/migsim.c):
 *
 * - the bundled example trace on two models: a table each, every
 *   strategy's row, the offline rows; in JSON the bound at or above every
 *   strategy and the packing;
 * - a workload whose outcome is forced (whole GPUs, more asked than
 *   there are): every strategy and the bound place as many as there are
 *   GPUs, and the packing reaches the bound ("optimal");
 * - with --churn, pods at their times on one GPU: a 3g, then a 4g while it
 *   runs: NVML-order first fit puts the 3g at start 0 and loses the 4g,
 *   kgpu's slice order places both;
 * - unknown models and flags that do not go together.
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

static json_t *run_json(const char *args)
{
    run_result r = run(args);
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    json_error_t jerr;
    json_t *root = json_loads(r.out, 0, &jerr);
    if (root == NULL)
        fail_msg("not JSON: %s\n%s", jerr.text, r.out);
    run_free(&r);
    return root;
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        fail_msg("no number '%s'", key);
    return json_number_value(v);
}

/* The result of strategy `name` in a model's results. */
static json_t *strategy(json_t *model, const char *name)
{
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(model, "results"), i, r) {
        if (strcmp(json_string_value(json_object_get(r, "strategy")), name) == 0)
            return r;
    }
    fail_msg("no result for %s", name);
    return NULL;
}

static const char *const STRATEGIES[] = {"first-fit", "kgpu-order", "kgpu", "best-fit",
                                         "most-room"};

static void test_example_table_and_json(void **state)
{
    (void)state;
    run_result r = run("simulate --mig A100-40GB,H100-80GB " EXAMPLE " --seeds 1-3");
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    static const char *const words[] = {"MIG A100-40GB:", "MIG H100-80GB:", "as profiles:",
                                        "offline packing", "bound (LP)", "failed@100%",
                                        "slices@100%", "\nfirst-fit ", "\nkgpu-order ",
                                        "\nkgpu ", "\nbest-fit ", "\nmost-room "};
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (strstr(r.out, words[i]) == NULL)
            fail_msg("'%s' not in:\n%s", words[i], r.out);
    run_free(&r);

    json_t *root = run_json("simulate --mig A100-40GB " EXAMPLE " --seeds 1-3 --json --no-timing");
    assert_string_equal(json_string_value(json_object_get(root, "mode")), "mig");
    json_t *models = json_object_get(root, "models");
    assert_int_equal(json_array_size(models), 1);
    json_t *m = json_array_get(models, 0);
    assert_string_equal(json_string_value(json_object_get(m, "model")), "A100-40GB");
    json_t *off = json_object_get(m, "offline");
    json_t *upper = json_object_get(off, "upper_by_seed");
    json_t *packed = json_object_get(off, "packed_by_seed");
    assert_int_equal(json_array_size(upper), 3);
    for (size_t k = 0; k < 3; k++) {
        json_int_t u = json_integer_value(json_array_get(upper, k));
        assert_true(json_integer_value(json_array_get(packed, k)) <= u);
        for (size_t s = 0; s < sizeof(STRATEGIES) / sizeof(STRATEGIES[0]); s++) {
            json_t *by = json_object_get(strategy(m, STRATEGIES[s]), "placed_by_seed");
            if (json_integer_value(json_array_get(by, k)) > u)
                fail_msg("%s places more than the bound in seed %zu", STRATEGIES[s], k);
        }
    }
    assert_true(num(m, "requests") > 0);
    assert_true(num(strategy(m, "kgpu"), "placed_pct") <= 100);
    assert_true(num(m, "wall_s") == 0);
    json_decref(root);
}

static void test_forced_whole_gpus(void **state)
{
    (void)state;
    char nodes[300], pods[300], args[1200];
    write_file("n.csv",
               "sn,cpu_milli,memory_mib,gpu,model\n"
               "a,64000,262144,2,A100\nb,64000,262144,2,A100\n",
               nodes, sizeof(nodes));
    write_file("p.csv",
               "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
               "p0,1000,1024,1,1000\np1,1000,1024,1,1000\np2,1000,1024,1,1000\n"
               "p3,1000,1024,1,1000\np4,1000,1024,1,1000\np5,1000,1024,1,1000\n"
               "p6,1000,1024,1,1000\np7,1000,1024,1,1000\n",
               pods, sizeof(pods));
    snprintf(args, sizeof(args),
             "simulate --mig H200-141GB --nodes '%s' --pods '%s' --seeds 5,9 --inflate 1.5 --json",
             nodes, pods);
    json_t *root = run_json(args);
    json_t *m = json_array_get(json_object_get(root, "models"), 0);
    assert_int_equal((int)num(m, "requests"), 6); /* 1.5 x 4 GPUs of demand */
    for (size_t s = 0; s < sizeof(STRATEGIES) / sizeof(STRATEGIES[0]); s++) {
        json_t *r = strategy(m, STRATEGIES[s]);
        assert_int_equal((int)num(r, "placed"), 4);
        assert_int_equal((int)num(r, "gpus_used"), 4);
        assert_int_equal((int)num(r, "failed_by_full"), 0);
    }
    json_t *off = json_object_get(m, "offline");
    assert_int_equal((int)num(off, "upper"), 4);
    assert_int_equal((int)num(off, "packed"), 4);
    assert_true(json_is_true(json_object_get(off, "optimal")));
    json_t *profiles = json_object_get(m, "profiles_all_seeds");
    assert_int_equal(json_integer_value(json_object_get(profiles, "7g.141gb")), 12);
    json_decref(root);
}

static void test_churn_forced(void **state)
{
    (void)state;
    char nodes[300], pods[400], args[1200];
    write_file("n1.csv", "sn,cpu_milli,memory_mib,gpu,model\na,64000,262144,1,A100\n", nodes,
               sizeof(nodes));
    /* 420 milli: 2.94 of 7 slices, a 3g; 560: 3.92, a 4g. */
    write_file("p1.csv",
               "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
               "creation_time,deletion_time,scheduled_time\n"
               "p0,1000,1024,1,420,,LS,Running,0,100,0\n"
               "p1,1000,1024,1,560,,LS,Running,10,100,10\n"
               "p2,1000,1024,0,0,,LS,Running,20,30,20\n",
               pods, sizeof(pods));
    snprintf(args, sizeof(args),
             "simulate --mig A100-40GB --churn --nodes '%s' --pods '%s' --json", nodes, pods);
    json_t *root = run_json(args);
    assert_string_equal(json_string_value(json_object_get(root, "mode")), "mig-churn");
    json_t *m = json_array_get(json_object_get(root, "models"), 0);
    assert_int_equal((int)num(m, "requests"), 2);
    json_t *ff = strategy(m, "first-fit");
    assert_int_equal((int)num(ff, "placed"), 1);
    assert_true(num(ff, "first_loss_pct") > 42 && num(ff, "first_loss_pct") < 43); /* 3 of 7 */
    json_t *k = strategy(m, "kgpu");
    assert_int_equal((int)num(k, "placed"), 2);
    assert_true(json_is_null(json_object_get(k, "first_loss_pct")));
    assert_true(num(k, "slices_placed_pct") > 99.9);
    assert_int_equal((int)num(strategy(m, "kgpu-order"), "placed"), 2);
    json_decref(root);

    snprintf(args, sizeof(args), "simulate --mig A100-40GB --churn --nodes '%s' --pods '%s'",
             nodes, pods);
    run_result r = run(args);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "MIG A100-40GB with time"));
    assert_non_null(strstr(r.out, "1st loss at"));
    run_free(&r);
}

static void test_bad_flags(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "simulate --mig V100 " EXAMPLE,
        "simulate --mig A100-40GB,A100-40GB " EXAMPLE,
        "simulate --mig , " EXAMPLE,
        "simulate --mig A100-40GB --policy kgpu " EXAMPLE,
        "simulate --mig A100-40GB --clusters examples/clusters-alibaba.csv " EXAMPLE,
        "simulate --mig A100-40GB --churn --inflate 1.3 " EXAMPLE,
        "simulate --mig A100-40GB --online " EXAMPLE,
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        run_result r = run(bad[i]);
        if (r.status != 2)
            fail_msg("'%s' exited %d: %s", bad[i], r.status, r.err);
        run_free(&r);
    }
    run_result r = run("simulate --mig V100 " EXAMPLE);
    assert_non_null(strstr(r.err, "unknown model 'V100'"));
    assert_non_null(strstr(r.err, "H200-141GB"));
    run_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_table_and_json),
        cmocka_unit_test(test_forced_whole_gpus),
        cmocka_unit_test(test_churn_forced),
        cmocka_unit_test(test_bad_flags),
    };
    if (cli_tmp_make("kgpu-mig") != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, cli_tmp_remove);
}
