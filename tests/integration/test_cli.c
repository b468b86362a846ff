/*
 * Black-box tests of the kgpu binary: what an operator types and sees.
 * JSON shape and determinism, the table, the plot, errors and exit codes,
 * and that the bundled example is exactly what `kgpu example` writes.
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

static void test_json_shape(void **state)
{
    run_result r = run("simulate " EXAMPLE " --seeds 1-3 --policy fgd,bestfit --json");
    assert_int_equal(r.status, 0);
    json_error_t jerr;
    json_t *root = json_loads(r.out, 0, &jerr);
    if (root == NULL)
        fail_msg("stdout is not JSON: %s", jerr.text);
    assert_int_equal(json_integer_value(json_object_get(root, "nodes")), 64);
    assert_true(json_integer_value(json_object_get(root, "gpus")) > 0);
    assert_float_equal(json_real_value(json_object_get(root, "inflate")), 1.3, 1e-12);
    json_t *results = json_object_get(root, "results");
    assert_int_equal(json_array_size(results), 2);
    const char *names[] = {"fgd", "bestfit"};
    for (size_t i = 0; i < 2; i++) {
        json_t *o = json_array_get(results, i);
        assert_string_equal(json_string_value(json_object_get(o, "policy")), names[i]);
        json_t *seeds = json_object_get(o, "seeds");
        assert_int_equal(json_array_size(seeds), 3);
        assert_int_equal(json_integer_value(json_array_get(seeds, 0)), 1);
        assert_int_equal(json_integer_value(json_array_get(seeds, 2)), 3);
        json_t *by_seed = json_object_get(o, "alloc_pct_130_by_seed");
        assert_int_equal(json_array_size(by_seed), 3);
        double mean = 0;
        for (size_t k = 0; k < 3; k++)
            mean += json_real_value(json_array_get(by_seed, k)) / 3;
        assert_float_equal(json_real_value(json_object_get(o, "alloc_pct_130")), mean, 1e-6);
        json_t *curve = json_object_get(o, "alloc_curve");
        assert_int_equal(json_array_size(curve), 131);
        assert_float_equal(json_real_value(json_array_get(curve, 130)), mean, 1e-6);
        const char *keys[] = {"unallocated_gpus", "frag_ratio_pct_90", "pods_failed", "wall_s"};
        for (size_t k = 0; k < 4; k++)
            assert_true(json_is_number(json_object_get(o, keys[k])));
    }
    json_decref(root);
    run_free(&r);
}

static void test_json_deterministic(void **state)
{
    const char *args = "simulate " EXAMPLE " --seeds 5,9 --json --no-timing";
    run_result a = run(args), b = run(args);
    assert_int_equal(a.status, 0);
    assert_int_equal(b.status, 0);
    assert_string_equal(a.out, b.out);
    /* One thread or many: the same bytes. */
    run_result c = run("simulate " EXAMPLE " --seeds 5,9 --json --no-timing --threads 1");
    assert_string_equal(a.out, c.out);
    run_free(&a);
    run_free(&b);
    run_free(&c);
}

static void test_table_and_plot(void **state)
{
    check_table_and_plot("", "p.svg", "alloc@130%", "fgd");
}

/* The table's second column is named for when the last pod arrived, whatever --inflate says. */
static void test_table_names_the_inflation(void **state)
{
    run_result r = run("simulate " EXAMPLE " --seeds 1 --policy fgd --inflate 1.5 --no-timing");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "alloc@150%"));
    assert_null(strstr(r.out, "alloc@130%"));
    run_free(&r);
}

/*
 * The Quick start's chart (scripts/demo.sh's command): the legend ranks the
 * policies by allocation at 130 % arrived, each with the table's alloc@130%,
 * and a detail panel enlarges the end, where the leading policies differ by
 * tenths of a point.
 */
static void test_demo_plot_ranked_and_zoomed(void **state)
{
    char args[600], path[300];
    snprintf(path, sizeof(path), "%s/example.svg", tmp);
    snprintf(args, sizeof(args), "simulate " EXAMPLE " --plot '%s'", path);
    run_result r = run(args);
    assert_int_equal(r.status, 0);
    char *svg = slurp(path);
    const char *prev_at = svg;
    double prev = 101.0;
    int rows = 0;
    for (const char *p = strstr(svg, "<text x=\"648.00\""); p != NULL;
         p = strstr(p + 1, "<text x=\"648.00\"")) {
        /* Each legend row is "<policy> <value> %": a policy name, intact, then a value. */
        const char *text = strchr(p, '>') + 1;
        char name[32], expect[64];
        double v;
        assert_int_equal(sscanf(text, "%31s %lf %%</text>", name, &v), 2);
        assert_non_null(kgpu_policy_find(name));
        assert_true(v <= prev); /* ranked, highest first */
        /* The table's alloc@130% for that policy, to the printed digit. */
        char row[64];
        snprintf(row, sizeof(row), "\n%s ", name);
        const char *line = strstr(r.out, row);
        assert_non_null(line);
        line += strlen(row);
        if (strncmp(line, "(online)", 8) == 0)
            line += 8;
        double at100, at130;
        assert_int_equal(sscanf(line, "%lf%% %lf%%", &at100, &at130), 2);
        snprintf(expect, sizeof(expect), "%s %.2f %%</text>", name, at130);
        assert_true(strncmp(text, expect, strlen(expect)) == 0);
        assert_true(p > prev_at);
        prev_at = p, prev = v, rows++;
    }
    int policies = 0;
    for (const kgpu_policy_ops *const *p = kgpu_policy_list(); *p; p++)
        policies++;
    assert_int_equal(rows, policies);
    assert_non_null(strstr(svg, ">at 130 % arrived</text>"));
    /* The detail panel: its own clip path, the window marked on the main panel. */
    assert_non_null(strstr(svg, "viewBox=\"0 0 800 860\""));
    assert_non_null(strstr(svg, "<clipPath id=\"kgpu-plot-zoom\">"));
    assert_non_null(strstr(svg, "class=\"kgpu-zoom-window\""));
    assert_non_null(strstr(svg, ">Detail of the shaded box: "));
    free(svg);
    run_free(&r);
}

static void test_bad_input(void **state)
{
    char path[300], args[800];
    snprintf(path, sizeof(path), "%s/bad.csv", tmp);
    FILE *f = fopen(path, "w");
    fputs("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\np1,1000,1024,1,1400\n",
          f);
    fclose(f);
    snprintf(args, sizeof(args), "simulate --nodes examples/nodes.csv --pods '%s'", path);
    run_result r = run(args);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "bad.csv:3:"));
    assert_non_null(strstr(r.err, "1400"));
    assert_string_equal(r.out, "");
    run_free(&r);

    r = run("simulate " EXAMPLE " --policy fgd,nosuch");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "unknown policy 'nosuch'"));
    run_free(&r);

    r = run("simulate --nodes /nonexistent/nodes.csv --pods examples/pods.csv");
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "/nonexistent/nodes.csv"));
    run_free(&r);

    r = run("simulate " EXAMPLE " --seeds 9-3");
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "--seeds"));
    run_free(&r);

    r = run("simulate " EXAMPLE " --inflate -1");
    assert_int_equal(r.status, 2);
    run_free(&r);

    r = run("simulate --pods examples/pods.csv");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--nodes and --pods are required"));
    run_free(&r);

    /* Each autoscaler number names its own flag and range. */
    r = run("simulate " EXAMPLE " --autoscale --scale-down-utilization-threshold 2");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--scale-down-utilization-threshold '2': expected a number "
                                  "in [0, 1]"));
    run_free(&r);
    r = run("simulate " EXAMPLE " --autoscale --scan-interval 0");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--scan-interval '0': expected a number in (0, 86400]"));
    run_free(&r);
    r = run("simulate " EXAMPLE " --autoscale --spot-interruptions x");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--spot-interruptions 'x': expected a number >= 0"));
    run_free(&r);

    r = run("frobnicate");
    assert_int_equal(r.status, 2);
    run_free(&r);
}

static void test_example_reproduces(void **state)
{
    char args[400];
    snprintf(args, sizeof(args), "example --out '%s/ex'", tmp);
    run_result r = run(args);
    assert_int_equal(r.status, 0);
    const char *files[] = {"nodes.csv", "pods.csv"};
    for (int i = 0; i < 2; i++) {
        char a[600], b[600];
        snprintf(a, sizeof(a), "%s/ex/%s", tmp, files[i]);
        snprintf(b, sizeof(b), "%s/examples/%s", KGPU_SOURCE_DIR, files[i]);
        char *x = slurp(a), *y = slurp(b);
        assert_true(strlen(x) > 100);
        assert_string_equal(x, y);
        free(x);
        free(y);
    }
    run_free(&r);
}

static void test_version_help(void **state)
{
    run_result r = run("version");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "kgpu " KGPU_VERSION));
    run_free(&r);
    r = run("simulate --help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "--random-ties"));
    assert_non_null(strstr(r.out, "fgd"));
    run_free(&r);
}

static void test_parse_seeds(void **state)
{
    uint64_t s[16];
    int n;
    kgpu_error err;
    assert_int_equal(kgpu_parse_seeds("42-51", s, 16, &n, &err), 0);
    assert_int_equal(n, 10);
    assert_true(s[0] == 42 && s[9] == 51);
    assert_int_equal(kgpu_parse_seeds("1,5,9-11", s, 16, &n, &err), 0);
    assert_int_equal(n, 5);
    assert_true(s[0] == 1 && s[1] == 5 && s[2] == 9 && s[4] == 11);
    assert_int_equal(kgpu_parse_seeds("18446744073709551615", s, 16, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_true(s[0] == UINT64_MAX);
    const char *bad[] = {"", "x", "5-", "-5", "9-3", "1,,2", "1;2", "0-16"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_true(kgpu_parse_seeds(bad[i], s, 16, &n, &err) < 0);
        assert_non_null(strstr(err.msg, "--seeds"));
    }
}

static int setup(void **state)
{
    return cli_tmp_make("kgpu-cli");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_shape),     cmocka_unit_test(test_json_deterministic),
        cmocka_unit_test(test_table_and_plot), cmocka_unit_test(test_table_names_the_inflation),
        cmocka_unit_test(test_demo_plot_ranked_and_zoomed),
        cmocka_unit_test(test_bad_input),      cmocka_unit_test(test_example_reproduces),
        cmocka_unit_test(test_version_help),   cmocka_unit_test(test_parse_seeds),
    };
    return cmocka_run_group_tests(tests, setup, cli_tmp_remove);
}
