/*
 * Unit tests of the extender's GPU-seconds and their cost (src/extender/usage.c,
 * the usage families of metrics.c): the key (namespace, resolved queue, GPU
 * model, capacity type), what a pod adds and takes off, a queue change, the
 * bound on series, and cost = GPU-seconds / 3600 x price on /metrics.
 * Time is moved by setting the last integration back, so the sums are exact
 * up to the microseconds the test itself takes.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ext.h"
#include "pricefile.h"
#include "queuefile.h"

#include "extender_fixture.h"

typedef struct fixture {
    ext_config cfg;
    ext_metrics m;
    ext_state st;
    kgpu_gpu_spec g[2][4];
    kgpu_node_spec nodes[2];
} fixture;

/* n0: 4 A100 of 40 GiB, on-demand; n1: 4 T4 of 16 GiB, spot. */
static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    ext_fixture_state(&f->cfg, &f->st, &f->m);
    static const char *const models[2] = {"A100", "T4"};
    static const int64_t mib[2] = {40960, 16384};
    ext_state_node_spot(&f->st, "n1", true);
    ext_fixture_nodes(&f->st, f->g, f->nodes, models, mib, 2);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    ext_state_destroy(&f->st);
    free(f->cfg.prices);
    free(f);
    return 0;
}

/* Binds pod uid `name` of namespace ns (whole GPUs, or a share of mem_gib) to node. */
static void bind(fixture *f, const char *ns, const char *name, const char *label,
                 const char *node, int whole, int mem_gib)
{
    char text[256];
    if (whole > 0)
        snprintf(text, sizeof(text), "{\"nvidia.com/gpu\": \"%d\"}", whole);
    else
        snprintf(text, sizeof(text), "{\"kgpu.io/gpu-mem\": \"%d\"}", mem_gib);
    json_t *pod = json_pack("{s:{s:s,s:s,s:s},s:{s:[{s:s,s:{s:o}}]}}", "metadata", "name", name,
                            "namespace", ns, "uid", name, "spec", "containers", "name", "main",
                            "resources", "limits", json_loads(text, 0, NULL));
    kgpu_pod p;
    kgpu_error err;
    int rc = kgpu_pod_from_json(pod, 1024, &p, &err);
    json_decref(pod);
    if (rc == 0)
        rc = ext_state_compile(&f->st, &p, &err);
    const ext_pod *held;
    if (rc == 0)
        rc = ext_state_reserve(&f->st, &p, node, label, 0, &held, &err);
    if (rc != 0)
        fail_msg("bind %s/%s: %s", ns, name, err.msg);
    ext_state_confirm(&f->st, name);
}

/* The entry of the key, or a zero one (found false). */
static ext_usage row(fixture *f, const char *ns, const char *queue, const char *model, bool spot,
                     bool *found)
{
    ext_usage *rows, out;
    size_t n;
    assert_true(ext_usage_rows(&f->st, &rows, &n));
    memset(&out, 0, sizeof(out));
    *found = false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].ns, ns) == 0 && strcmp(rows[i].queue, queue) == 0 &&
            strcmp(rows[i].model, model) == 0 && rows[i].spot == spot) {
            out = rows[i];
            *found = true;
        }
    free(rows);
    return out;
}

/* Lets `s` seconds pass for the integration. */
static void advance(fixture *f, double s)
{
    ext_state_integrate_usage(&f->st);
    f->st.usage_at -= s;
}

static void test_key_and_seconds(void **state)
{
    fixture *f = *state;
    bind(f, "team-a", "w", NULL, "n1", 1, 0);      /* a whole T4, spot */
    bind(f, "team-b", "s", NULL, "n0", 0, 20);     /* half an A100 (20 of 40 GiB) */
    advance(f, 100);
    bool found;
    ext_usage a = row(f, "team-a", "", "T4", true, &found);
    assert_true(found);
    assert_true(a.gpus == 1);
    assert_true(fabs(a.gpu_seconds - 100) < 0.5);
    ext_usage b = row(f, "team-b", "", "A100", false, &found);
    assert_true(found);
    assert_true(b.gpus == 0.5);
    assert_true(fabs(b.gpu_seconds - 50) < 0.5);
    row(f, "team-a", "", "T4", false, &found);
    assert_false(found); /* no on-demand series for a spot node's pod */

    /* Released: it holds nothing from then on; what it counted stays. */
    ext_state_release(&f->st, "w");
    advance(f, 100);
    a = row(f, "team-a", "", "T4", true, &found);
    assert_true(found);
    assert_true(a.gpus == 0);
    assert_true(fabs(a.gpu_seconds - 100) < 0.5);
    b = row(f, "team-b", "", "A100", false, &found);
    assert_true(fabs(b.gpu_seconds - 100) < 0.5);
}

/* With queues off the label is not resolved: "" whatever it says. Then queues come on. */
static void test_queue_is_the_resolved_one(void **state)
{
    fixture *f = *state;
    bind(f, "team-a", "w", "anything-at-all", "n1", 1, 0);
    advance(f, 10);
    bool found;
    row(f, "team-a", "anything-at-all", "T4", true, &found);
    assert_false(found);
    assert_true(fabs(row(f, "team-a", "", "T4", true, &found).gpu_seconds - 10) < 0.5);
    /* Queues on: the label names no queue of team-a's, so its namespace's queue counts. */
    ext_fixture_queues(&f->st, "queues:\n"
                               "  - name: research\n"
                               "    namespaces: [team-a]\n"
                               "  - name: default\n");
    advance(f, 20);
    ext_usage before = row(f, "team-a", "", "T4", true, &found);
    assert_true(before.gpus == 0);
    assert_true(fabs(before.gpu_seconds - 10) < 0.5); /* the seconds so far stay */
    ext_usage after = row(f, "team-a", "default", "T4", true, &found);
    assert_true(found);
    assert_true(after.gpus == 1);
    assert_true(fabs(after.gpu_seconds - 20) < 0.5);
    row(f, "team-a", "anything-at-all", "T4", true, &found);
    assert_false(found);
    /* Released from its new queue: nothing is left held anywhere. */
    ext_state_release(&f->st, "w");
    assert_true(row(f, "team-a", "default", "T4", true, &found).gpus == 0);
    assert_true(row(f, "team-a", "", "T4", true, &found).gpus == 0);
}

/* Past EXT_USAGE_MAX series, new namespaces count under _overflow, per model and capacity. */
static void test_series_are_bounded(void **state)
{
    fixture *f = *state;
    char ns[32];
    for (int i = 0; i < EXT_USAGE_MAX; i++) {
        snprintf(ns, sizeof(ns), "ns-%d", i);
        bind(f, ns, "p", NULL, "n0", 1, 0);
        ext_state_release(&f->st, "p");
    }
    assert_int_equal(f->st.usage.len, EXT_USAGE_MAX);
    bind(f, "one-more", "p", NULL, "n1", 1, 0);
    advance(f, 10);
    bool found;
    row(f, "one-more", "", "T4", true, &found);
    assert_false(found);
    ext_usage o = row(f, EXT_USAGE_OVERFLOW_NS, "", "T4", true, &found);
    assert_true(found);
    assert_true(o.gpus == 1);
    assert_true(fabs(o.gpu_seconds - 10) < 0.5);
    assert_int_equal(f->st.usage.len, EXT_USAGE_MAX + 1);
    ext_state_release(&f->st, "p");
    assert_true(row(f, EXT_USAGE_OVERFLOW_NS, "", "T4", true, &found).gpus == 0);
}

/* /metrics as text. */
static char *metrics_text(fixture *f)
{
    ext_stream s;
    bool busy;
    assert_true(ext_metrics_stream(&f->m, &f->st, true, &s, &busy));
    size_t len = 0, cap = 1 << 16;
    char *text = malloc(cap);
    long n;
    while ((n = s.read(s.ctx, text + len, cap - len - 1)) > 0) {
        len += (size_t)n;
        if (cap - len < 4096)
            text = realloc(text, cap *= 2);
    }
    text[len] = '\0';
    s.free(s.ctx);
    return text;
}

/* The value of the line starting with `prefix`, or NAN. */
static double sample(const char *text, const char *prefix)
{
    const char *p = strstr(text, prefix);
    return p ? strtod(p + strlen(prefix), NULL) : NAN;
}

static void test_cost_is_seconds_times_price(void **state)
{
    fixture *f = *state;
    static const char prices[] = "prices:\n  currency: EUR\n  gpu:\n"
                                 "    T4: {onDemand: 7.2, spot: 3.6}\n";
    f->cfg.prices = calloc(1, sizeof(*f->cfg.prices));
    kgpu_error err;
    assert_int_equal(kgpu_prices_load(prices, sizeof(prices) - 1, "p.yaml", f->cfg.prices, &err),
                     0);
    bind(f, "team-a", "w", NULL, "n1", 2, 0); /* two T4s, spot */
    bind(f, "team-b", "s", NULL, "n0", 1, 0); /* an A100: no price */
    advance(f, 1000);
    char *text = metrics_text(f);
    double secs = sample(text, "kgpu_namespace_gpu_seconds_total{namespace=\"team-a\",queue=\"\","
                               "model=\"T4\",capacity_type=\"spot\"} ");
    double cost = sample(text, "kgpu_namespace_gpu_cost_total{namespace=\"team-a\",queue=\"\","
                               "model=\"T4\",capacity_type=\"spot\",currency=\"EUR\"} ");
    assert_true(fabs(secs - 2000) < 1);
    assert_true(fabs(cost - secs / 3600 * 3.6) < 1e-5); /* 2 GPU x 1000 s at 3.6/h: 2.0 */
    assert_null(strstr(text, "kgpu_namespace_gpu_cost_total{namespace=\"team-b\""));
    double gap = sample(text, "kgpu_unpriced_gpu_seconds_total{model=\"A100\","
                              "capacity_type=\"on-demand\"} ");
    assert_true(fabs(gap - 1000) < 1);
    assert_true(sample(text, "kgpu_gpu_price_per_hour{model=\"T4\",capacity_type=\"on-demand\","
                             "currency=\"EUR\"} ") == 7.2);
    assert_true(sample(text, "kgpu_namespace_gpus_allocated{namespace=\"team-a\",queue=\"\","
                             "model=\"T4\",capacity_type=\"spot\"} ") == 2);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_key_and_seconds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_is_the_resolved_one, setup, teardown),
        cmocka_unit_test_setup_teardown(test_series_are_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cost_is_seconds_times_price, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
