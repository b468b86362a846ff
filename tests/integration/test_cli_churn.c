/*
 * Black-box tests of `kgpu simulate --churn` on the bundled example: the
 * JSON fields, determinism, the table and the plot, and the errors an
 * operator can make (options that do not mix, times that make no sense).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "cli.h"
#include "cli_run.h"
#include "kgpu/churn.h"

static void test_json_fields_and_determinism(void **state)
{
    run_result a = run("simulate --churn --speedup 1000 " EXAMPLE
                       " --policy fgd,kgpu --seeds 1-2 --json --no-timing");
    run_result b = run("simulate --churn --speedup 1000 " EXAMPLE
                       " --policy fgd,kgpu --seeds 1-2 --json --no-timing --threads 1");
    assert_int_equal(a.status, 0);
    assert_string_equal(a.out, b.out); /* same seeds, any thread count: same bytes */
    json_error_t jerr;
    json_t *root = json_loads(a.out, 0, &jerr);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(root, "mode")), "churn");
    assert_true(json_real_value(json_object_get(root, "speedup")) == 1000);
    assert_int_equal(json_array_size(json_object_get(root, "sample_t_s")), KGPU_CHURN_SAMPLES);
    json_t *results = json_object_get(root, "results");
    assert_int_equal(json_array_size(results), 2);
    const char *fields[] = {"alloc_mean_pct", "alloc_peak_pct", "wait_median_s", "wait_p99_s",
                            "wait_mean_s",    "waited",         "never_placed",  "max_queue"};
    for (size_t i = 0; i < 2; i++) {
        json_t *o = json_array_get(results, i);
        for (size_t f = 0; f < sizeof(fields) / sizeof(*fields); f++)
            assert_true(json_is_real(json_object_get(o, fields[f])));
        assert_int_equal(json_array_size(json_object_get(o, "alloc_over_time")),
                         KGPU_CHURN_SAMPLES);
        assert_true(json_real_value(json_object_get(o, "pods")) == 257);
    }
    assert_true(json_is_true(json_object_get(json_array_get(results, 1), "online")));
    json_decref(root);
    run_free(&a);
    run_free(&b);
}

static void test_table_and_plot(void **state)
{
    check_table_and_plot("--churn", "c.svg", "wait p99 s", "over time");
}

static void test_errors(void **state)
{
    run_result r = run("simulate --speedup 10 " EXAMPLE);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--speedup needs --churn"));
    run_free(&r);
    r = run("simulate --churn --inflate 0 " EXAMPLE);
    assert_int_equal(r.status, 2);
    run_free(&r);
    r = run("simulate --churn --speedup 0 " EXAMPLE);
    assert_int_equal(r.status, 2);
    run_free(&r);

    char path[300], args[700];
    snprintf(path, sizeof(path), "%s/bad.csv", tmp);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
          "deletion_time,scheduled_time\n"
          "a,1000,1024,1,500,,LS,Running,5,10,5\n"
          "b,1000,1024,1,500,,LS,Running,20,10,20\n",
          f);
    fclose(f);
    snprintf(args, sizeof(args), "simulate --churn --nodes examples/nodes.csv --pods '%s'", path);
    r = run(args);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "bad.csv:3: deletion_time 10 before creation_time 20"));
    run_free(&r);
}

static int setup(void **state)
{
    return cli_tmp_make("kgpu-churn");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_fields_and_determinism),
        cmocka_unit_test(test_table_and_plot),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, cli_tmp_remove);
}
