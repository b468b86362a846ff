/*
 * Unit tests of the autoscaled replay (src/core/autoscale.c), the expanders
 * (src/core/expander.c) and the prices file (src/common/pricefile.c), on
 * hand-made clusters small enough to work out by hand: scale-up from zero
 * and the provisioning delay, CA's useless scale-up for a share its sums
 * say fits, model exclusion, spot only for pods that tolerate it,
 * scale-down by sums and by the real fit, interruptions, determinism.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kgpu/autoscale.h"
#include "pricefile.h"

/* A node shape: one node of it in the list (quota 1) unless `count`. */
typedef struct shape {
    const char *model;
    int gpus;
    int64_t gpu_mib, cpu_milli, mem_mib;
    int count;
} shape;

/* A pod: request, arrival, lifetime, spot toleration. */
typedef struct pod {
    kgpu_request req;
    double at, life;
    bool spot_ok;
} pod;

typedef struct hand {
    kgpu_sim_input sim;
    kgpu_churn_input ch;
    kgpu_autoscale_input in;
    bool tol[16];
    kgpu_prices prices;
} hand;

static void build(hand *h, const shape *shapes, int nshapes, const pod *pods, int npods)
{
    memset(h, 0, sizeof(*h));
    kgpu_error err;
    h->sim.cluster = kgpu_cluster_new();
    assert_non_null(h->sim.cluster);
    int idx = 0;
    for (int s = 0; s < nshapes; s++) {
        for (int c = 0; c < (shapes[s].count ? shapes[s].count : 1); c++) {
            kgpu_gpu_spec gs[8];
            for (int g = 0; g < shapes[s].gpus; g++)
                gs[g] = (kgpu_gpu_spec){.index = g, .model = shapes[s].model,
                                        .memory_mib = shapes[s].gpu_mib, .numa = -1,
                                        .healthy = true};
            char name[16];
            snprintf(name, sizeof(name), "n%d", idx++);
            kgpu_node_spec ns = {.name = name, .cpu_milli = shapes[s].cpu_milli,
                                 .memory_mib = shapes[s].mem_mib, .gpus = gs,
                                 .ngpus = shapes[s].gpus};
            assert_true(kgpu_cluster_add_node(h->sim.cluster, &ns, &err) >= 0);
            h->sim.gpus += shapes[s].gpus;
        }
    }
    h->sim.capacity_milli = (int64_t)h->sim.gpus * KGPU_MILLI;
    h->sim.requests = calloc((size_t)npods, sizeof(*h->sim.requests));
    h->sim.nrequests = (size_t)npods;
    h->ch.sim = &h->sim;
    h->ch.creation = calloc((size_t)npods, sizeof(double));
    h->ch.lifetime = calloc((size_t)npods, sizeof(double));
    h->ch.order = calloc((size_t)npods, sizeof(size_t));
    for (int i = 0; i < npods; i++) {
        h->sim.requests[i] = pods[i].req;
        h->sim.requests[i].shape = -1;
        assert_int_equal(kgpu_request_compile(h->sim.cluster, &h->sim.requests[i], &err), 0);
        h->ch.creation[i] = pods[i].at;
        h->ch.lifetime[i] = pods[i].life;
        h->ch.order[i] = (size_t)i;
        h->tol[i] = pods[i].spot_ok;
    }
    assert_int_equal(kgpu_autoscale_prepare(&h->ch, h->tol, &h->in, &err), 0);
    const char *prices = "prices:\n"
                         "  gpu:\n"
                         "    T4: {onDemand: 0.35, spot: 0.12}\n"
                         "    V100: {onDemand: 2.5, spot: 0.8}\n"
                         "    M8: {onDemand: 0.5, spot: 0.2}\n"
                         "    M32: {onDemand: 2.0, spot: 0.7}\n"
                         "  cpuCore: {onDemand: 0.01, spot: 0.005}\n";
    assert_int_equal(kgpu_prices_load(prices, strlen(prices), "p.yaml", &h->prices, &err), 0);
}

static void unbuild(hand *h)
{
    kgpu_autoscale_input_free(&h->in);
    kgpu_churn_input_free(&h->ch);
    kgpu_sim_input_free(&h->sim);
}

static kgpu_autoscale_result run(hand *h, kgpu_expander_kind x, double delay, double spot_rate,
                                 uint64_t seed)
{
    kgpu_autoscale_config cfg = KGPU_AUTOSCALE_DEFAULTS;
    cfg.expander = x;
    cfg.prices = &h->prices;
    cfg.provision_delay_s = delay;
    cfg.spot_rate = spot_rate;
    cfg.seed = seed;
    kgpu_autoscale_result out;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = kgpu_autoscale_run(&h->in, &cfg, &out, &err);
    if (rc != 0)
        fail_msg("run: %s", err.msg);
    return out;
}

static kgpu_request whole(int64_t cpu, int gpus)
{
    return (kgpu_request){.cpu_milli = cpu, .memory_mib = 1024, .gpu_count = gpus,
                          .gpu_milli = KGPU_MILLI, .exclusive = true};
}

static kgpu_request share(int64_t cpu, int milli, int64_t gpu_mib)
{
    return (kgpu_request){.cpu_milli = cpu, .memory_mib = 1024, .gpu_count = 1,
                          .gpu_milli = milli, .gpu_memory_mib = gpu_mib};
}

static const shape t4 = {"T4", 1, 16384, 8000, 32768, 0};

/* From zero: the first scan (10 s) buys a node, usable only after the delay. */
static void test_scale_from_zero_waits_for_the_delay(void **state)
{
    (void)state;
    hand h;
    pod p = {.req = whole(2000, 1), .at = 0, .life = 1000};
    build(&h, &t4, 1, &p, 1);
    for (int i = 0; i < 2; i++) {
        double delay = i ? 300 : 120;
        kgpu_autoscale_result r = run(&h, KGPU_EXPANDER_KGPU, delay, 0, 42);
        assert_int_equal(r.scale_ups, 1);
        assert_int_equal(r.nodes_added, 1);
        assert_int_equal(r.useless_nodes, 0);
        assert_int_equal(r.never_placed, 0);
        assert_true(r.wait_mean_s == 10 + delay); /* scan at 10 s, ready at 10 s + delay */
        assert_true(r.t_end == 10 + delay + 1000);
        /* Bought from the scale-up: 1 GPU x (end - 10 s). */
        assert_true(r.gpu_hours_bought > (r.t_end - 10) / 3600.0 - 1e-9 &&
                    r.gpu_hours_bought < (r.t_end - 10) / 3600.0 + 1e-9);
    }
    unbuild(&h);
}

/*
 * A 12 GiB share. CA's sums see 16 GiB on the 2 x 8 GiB node, whose small
 * CPU and memory least-waste prefers: it buys a node that cannot take the
 * pod, which stays empty. kgpu's expander re-places the pod for real and
 * buys only the 32 GiB node.
 */
static void test_useless_scale_up_by_sums(void **state)
{
    (void)state;
    hand h;
    shape shapes[] = {{"M8", 2, 8192, 4000, 16384, 0}, {"M32", 1, 32768, 16000, 65536, 0}};
    pod p = {.req = share(2000, 500, 12288), .at = 0, .life = 3600};
    p.req.memory_mib = 8192;
    build(&h, shapes, 2, &p, 1);

    kgpu_autoscale_result lw = run(&h, KGPU_EXPANDER_LEAST_WASTE, 120, 0, 42);
    assert_true(lw.useless_nodes >= 1);
    assert_int_equal(lw.peak[0], 1); /* the M8 on-demand group */
    assert_int_equal(lw.never_placed, 0);

    kgpu_autoscale_result kg = run(&h, KGPU_EXPANDER_KGPU, 120, 0, 42);
    assert_int_equal(kg.useless_nodes, 0);
    assert_int_equal(kg.nodes_added, 1);
    assert_int_equal(kg.peak[0], 0);
    assert_int_equal(kg.peak[2], 1); /* M32 on-demand */
    assert_true(kg.wait_mean_s < lw.wait_mean_s);
    assert_true(kg.cost < lw.cost);

    /* The decision itself, as the extender's gRPC service will ask it. */
    const kgpu_cluster *c = h.sim.cluster;
    kgpu_expander_group groups[] = {
        {kgpu_cluster_node(c, 0), 0.5 * 2, false},
        {kgpu_cluster_node(c, 1), 2.0, false},
    };
    const kgpu_request *pods[] = {&h.sim.requests[0]};
    kgpu_expander_option opts[] = {{0, 1, pods, 1}, {1, 1, pods, 1}};
    kgpu_expander_ctx ctx = {.models = c, .groups = groups, .ngroups = 2,
                             .pod_gpu_price = 1, .pod_core_price = 0.01};
    kgpu_expander_eval ev[2];
    kgpu_rng rng;
    kgpu_rng_seed(&rng, 1, 1);
    kgpu_error err;
    int choice;
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_LEAST_WASTE, opts, 2, &rng, ev,
                                          &choice, &err), 0);
    assert_int_equal(choice, 0);
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_KGPU, opts, 2, &rng, ev, &choice,
                                          &err), 0);
    assert_int_equal(choice, 1);
    assert_int_equal(ev[0].placed, 0);
    assert_int_equal(ev[1].placed, 1);
    /* Only the useless option: kgpu buys nothing. */
    assert_int_equal(kgpu_expander_choose(&ctx, KGPU_EXPANDER_KGPU, opts, 1, &rng, NULL, &choice,
                                          &err), 0);
    assert_int_equal(choice, -1);
    unbuild(&h);
}

/* A pod that excludes T4: kgpu never buys the cheap T4 for it; CA's price, model-blind, does. */
static void test_model_exclusion(void **state)
{
    (void)state;
    hand h;
    shape shapes[] = {t4, {"V100", 1, 16384, 8000, 32768, 0}};
    static const char *const ex[] = {"T4"};
    pod p = {.req = whole(2000, 1), .at = 0, .life = 1000};
    p.req.exclude = ex;
    p.req.nexclude = 1;
    build(&h, shapes, 2, &p, 1);
    kgpu_autoscale_result kg = run(&h, KGPU_EXPANDER_KGPU, 120, 0, 42);
    assert_int_equal(kg.peak[0] + kg.peak[1], 0);
    assert_int_equal(kg.peak[2], 1);
    assert_int_equal(kg.useless_nodes, 0);
    kgpu_autoscale_result pr = run(&h, KGPU_EXPANDER_PRICE, 120, 0, 42);
    assert_int_equal(pr.peak[0], 1); /* the T4 bought for nothing */
    assert_true(pr.useless_nodes >= 1);
    assert_int_equal(pr.never_placed, 0);
    unbuild(&h);
}

/* Spot for the pod that tolerates it, on-demand for the one that does not. */
static void test_spot_only_for_tolerant_pods(void **state)
{
    (void)state;
    hand h;
    pod pods[] = {{.req = whole(2000, 1), .at = 0, .life = 1000, .spot_ok = true},
                  {.req = whole(2000, 1), .at = 0, .life = 1000, .spot_ok = false}};
    shape s = t4;
    s.count = 4;
    build(&h, &s, 1, pods, 2);
    for (int x = 0; x < KGPU_EXPANDER_COUNT; x++) {
        kgpu_autoscale_result r = run(&h, (kgpu_expander_kind)x, 120, 0, 42);
        assert_true(r.pods_on_spot <= 1); /* the taint, for every expander */
        assert_int_equal(r.never_placed, 0);
        if (x == KGPU_EXPANDER_KGPU) {
            assert_int_equal(r.pods_on_spot, 1);
            assert_int_equal(r.peak[1], 1);
            assert_int_equal(r.peak[0], 1);
        }
    }
    /* Nobody tolerates: no spot node at all. */
    h.tol[0] = false;
    kgpu_autoscale_result r = run(&h, KGPU_EXPANDER_KGPU, 120, 0, 42);
    assert_int_equal(r.pods_on_spot, 0);
    assert_int_equal(r.peak[1], 0);
    unbuild(&h);
}

/* An idle node goes after the unneeded time; the next pod needs a new one. */
static void test_scale_down_idle_node(void **state)
{
    (void)state;
    hand h;
    pod pods[] = {{.req = whole(2000, 1), .at = 0, .life = 100},
                  {.req = whole(2000, 1), .at = 5000, .life = 100}};
    build(&h, &t4, 1, pods, 2);
    kgpu_autoscale_result r = run(&h, KGPU_EXPANDER_KGPU, 120, 0, 42);
    assert_int_equal(r.nodes_removed, 1);
    assert_int_equal(r.nodes_added, 2);
    /* The first waits for the scan at 10 s and the delay; the second arrives on a scan. */
    assert_true(r.wait_mean_s == (130 + 120) / 2.0);
    unbuild(&h);
}

/*
 * Three 5 GiB shares on 2 x 8 GiB nodes: one per GPU really, so the third
 * gets a node of its own. CA's sums see 6 GiB free on the first node and
 * drain the second (the pod restarts and waits again); kgpu's real fit
 * keeps it.
 */
static void test_scale_down_keeps_unmovable_share(void **state)
{
    (void)state;
    hand h;
    shape s = {"M8", 2, 8192, 16000, 65536, 4};
    pod pods[3];
    for (int i = 0; i < 3; i++)
        pods[i] = (pod){.req = share(1000, 100, 5120), .at = 0, .life = 3000};
    build(&h, &s, 1, pods, 3);
    kgpu_autoscale_result kg = run(&h, KGPU_EXPANDER_KGPU, 120, 0, 42);
    assert_int_equal(kg.restarted, 0);
    assert_int_equal(kg.nodes_removed, 0);
    assert_int_equal(kg.never_placed, 0);
    kgpu_autoscale_result lw = run(&h, KGPU_EXPANDER_LEAST_WASTE, 120, 0, 42);
    assert_true(lw.restarted >= 1);
    assert_true(lw.lost_gpu_hours > 0);
    assert_int_equal(lw.never_placed, 0);
    unbuild(&h);
}

/* Interrupted spot nodes send their pods back to pending; they finish elsewhere. */
static void test_spot_interruption_requeues(void **state)
{
    (void)state;
    hand h;
    shape s = t4;
    s.count = 8;
    pod p = {.req = whole(2000, 1), .at = 0, .life = 20000, .spot_ok = true};
    build(&h, &s, 1, &p, 1);
    kgpu_autoscale_result r = run(&h, KGPU_EXPANDER_KGPU, 120, 2, 42);
    assert_true(r.interruptions >= 1);
    assert_true(r.restarted >= 1);
    assert_true(r.lost_gpu_hours > 0);
    assert_int_equal(r.never_placed, 0);
    assert_true(r.t_end > 20000); /* it started over */
    unbuild(&h);
}

/* Same seed, same result, field for field; the random expander draws from the seed. */
static void test_deterministic(void **state)
{
    (void)state;
    hand h;
    shape shapes[] = {{"T4", 2, 16384, 32000, 131072, 6}, {"V100", 4, 16384, 48000, 262144, 3}};
    pod pods[12];
    for (int i = 0; i < 12; i++)
        pods[i] = (pod){.req = i % 3 ? share(4000, 300 + 50 * i, 0) : whole(8000, 1 + i % 2),
                        .at = 37.0 * i,
                        .life = 400 + 90.0 * i,
                        .spot_ok = i % 2};
    build(&h, shapes, 2, pods, 12);
    for (int x = 0; x < KGPU_EXPANDER_COUNT; x++) {
        kgpu_autoscale_result a = run(&h, (kgpu_expander_kind)x, 120, 1, 7);
        kgpu_autoscale_result b = run(&h, (kgpu_expander_kind)x, 120, 1, 7);
        assert_memory_equal(&a, &b, sizeof(a));
        assert_int_equal(a.pods, 12);
        assert_int_equal(a.never_placed, 0);
    }
    unbuild(&h);
}

/* Refusals name the file and the field. */
static void test_prices_errors_name_the_field(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"prices: {gpu: {T4: {onDemand: 1, spot: x}}}", "p.yaml: prices.gpu.T4.spot:"},
        {"prices: {gpu: {T4: {onDemand: -1, spot: 1}}}", "p.yaml: prices.gpu.T4.onDemand:"},
        {"prices: {gpu: {T4: {ondemand: 1, spot: 1}}}", "p.yaml: prices.gpu.T4.ondemand: unknown"},
        {"prices: {gpu: {T4: {spot: 1}}}", "p.yaml: prices.gpu.T4.onDemand: missing"},
        {"prices: {cpuCore: {onDemand: 1, spot: 1}}", "p.yaml: prices.gpu: missing"},
        {"prices: {gpu: {T4: {onDemand: 1, spot: 1}}, cpucore: 1}", "p.yaml: prices.cpucore:"},
        {"gpu: {}", "p.yaml: prices: missing"},
        {"prices: {currency: 12, gpu: {T4: {onDemand: 1, spot: 1}}}", "p.yaml: prices.currency:"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kgpu_prices p;
        kgpu_error err;
        kgpu_error_clear(&err);
        assert_int_not_equal(kgpu_prices_load(cases[i].text, strlen(cases[i].text), "p.yaml", &p,
                                              &err), 0);
        if (strstr(err.msg, cases[i].want) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", i, err.msg, cases[i].want);
        assert_int_equal(p.nmodels, 0);
    }
    /* The bundled example prices every model of the trace. */
    kgpu_prices p;
    kgpu_error err;
    assert_int_equal(kgpu_prices_load_file(KGPU_SOURCE_DIR "/examples/prices.yaml", &p, &err), 0);
    const char *models[] = {"A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"};
    for (size_t i = 0; i < 7; i++) {
        const kgpu_price *x = kgpu_prices_gpu(&p, models[i]);
        assert_non_null(x);
        assert_true(x->spot > 0 && x->spot < x->on_demand);
    }
}

/* A model of the node list without a price stops the run and names it. */
static void test_unpriced_model(void **state)
{
    (void)state;
    hand h;
    shape s = {"H100", 1, 81920, 8000, 32768, 0};
    pod p = {.req = whole(1000, 1), .at = 0, .life = 10};
    build(&h, &s, 1, &p, 1);
    kgpu_autoscale_config cfg = KGPU_AUTOSCALE_DEFAULTS;
    cfg.prices = &h.prices;
    kgpu_autoscale_result out;
    kgpu_error err;
    assert_int_equal(kgpu_autoscale_run(&h.in, &cfg, &out, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "no price for GPU model H100"));
    unbuild(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale_from_zero_waits_for_the_delay),
        cmocka_unit_test(test_useless_scale_up_by_sums),
        cmocka_unit_test(test_model_exclusion),
        cmocka_unit_test(test_spot_only_for_tolerant_pods),
        cmocka_unit_test(test_scale_down_idle_node),
        cmocka_unit_test(test_scale_down_keeps_unmovable_share),
        cmocka_unit_test(test_spot_interruption_requeues),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_prices_errors_name_the_field),
        cmocka_unit_test(test_unpriced_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
