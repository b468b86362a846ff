/*
 * Unit tests of the simulator with time (src/core/churn.c) on hand-made
 * traces small enough to work out by hand: exact waiting times, the queue
 * without head-of-line blocking, pods never placed, bad times, determinism,
 * and that learning policies see pods only once they have arrived.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kgpu/churn.h"

#define POD_HEADER                                                                                 \
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_"   \
    "time,scheduled_time\n"

/* One node with one T4: small enough that every placement is forced. */
static const char one_gpu_csv[] = "sn,cpu_milli,memory_mib,gpu,model\n"
                                  "n0,32000,131072,1,T4\n";

static const char five_nodes_csv[] = "sn,cpu_milli,memory_mib,gpu,model\n"
                                     "n0,64000,262144,2,T4\n"
                                     "n1,64000,262144,2,T4\n"
                                     "n2,96000,786432,8,V100M32\n"
                                     "n3,96000,786432,8,V100M32\n"
                                     "n4,32000,131072,4,P100\n";

typedef struct fixture {
    kgpu_trace nodes, pods;
    kgpu_sim_input sim;
    kgpu_churn_input in;
} fixture;

/* Parses and prepares; returns kgpu_churn_prepare's code (the others must succeed). */
static int load(fixture *f, const char *nodes, const char *pods, kgpu_error *err)
{
    memset(f, 0, sizeof(*f));
    assert_int_equal(kgpu_trace_parse_nodes(nodes, strlen(nodes), "n.csv", &f->nodes, err), 0);
    assert_int_equal(kgpu_trace_parse_pods(pods, strlen(pods), "p.csv", &f->pods, err), 0);
    assert_int_equal(kgpu_sim_prepare(&f->nodes, &f->pods, &f->sim, err), 0);
    return kgpu_churn_prepare(&f->sim, &f->pods, "p.csv", &f->in, err);
}

static void unload(fixture *f)
{
    kgpu_churn_input_free(&f->in);
    kgpu_sim_input_free(&f->sim);
    kgpu_trace_free(&f->nodes);
    kgpu_trace_free(&f->pods);
}

static void run_ok(fixture *f, const char *policy, uint64_t seed, kgpu_churn_result *out)
{
    kgpu_churn_config cfg = {.policy = policy, .seed = seed, .speedup = 1};
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = kgpu_churn_run(&f->in, &cfg, out, &err);
    if (rc != 0)
        fail_msg("kgpu_churn_run: %s", err.msg);
}

/* p1 wants the whole GPU p0 holds; it waits from 10 until p0 leaves at 100, then runs 40 s. */
static void test_wait_until_departure(void **state)
{
    static const char pods[] = POD_HEADER "p0,4000,8192,1,1000,,LS,Running,0,100,0\n"
                                          "p1,4000,8192,1,1000,,LS,Running,10,50,10\n"
                                          "p2,2000,4096,0,0,,BE,Running,20,30,20\n";
    fixture f;
    kgpu_error err;
    assert_int_equal(load(&f, one_gpu_csv, pods, &err), 0);
    const char *policies[] = {"fgd", "bestfit", "random", "kgpu"};
    for (size_t i = 0; i < sizeof(policies) / sizeof(*policies); i++) {
        kgpu_churn_result r;
        run_ok(&f, policies[i], 42, &r);
        assert_int_equal(r.pods, 3);
        assert_int_equal(r.placed_at_once, 2);
        assert_int_equal(r.waited, 1);
        assert_int_equal(r.never_placed, 0);
        assert_int_equal(r.max_queue, 1);
        /* Waits 0, 0, 90: nearest-rank median 0, p99 the largest. */
        assert_true(r.wait_median_s == 0);
        assert_true(r.wait_p99_s == 90);
        assert_true(r.wait_mean_s == 30);
        assert_true(r.t_end == 140); /* p1 placed at 100, leaves 40 s later */
        assert_true(r.alloc_peak_pct == 100);
    }
    unload(&f);
}

/*
 * p1 at the head of the queue can never fit (2 GPUs on a 1-GPU node); p2
 * behind it must not be held up: it is placed when p0 leaves at 100.
 */
static void test_never_placed_and_no_head_of_line_blocking(void **state)
{
    static const char pods[] = POD_HEADER "p0,4000,8192,1,600,,LS,Running,0,100,0\n"
                                          "p1,4000,8192,2,1000,,LS,Running,10,50,10\n"
                                          "p2,2000,4096,1,500,,BE,Running,20,30,20\n"
                                          "p3,64000,4096,0,0,,BE,Running,30,40,30\n";
    fixture f;
    kgpu_error err;
    assert_int_equal(load(&f, one_gpu_csv, pods, &err), 0);
    kgpu_churn_result r;
    run_ok(&f, "fgd", 1, &r);
    assert_int_equal(r.placed_at_once, 1);
    assert_int_equal(r.waited, 1);
    assert_int_equal(r.never_placed, 2); /* p1 (GPUs) and p3 (CPU) fit no node, ever */
    assert_int_equal(r.max_queue, 3);
    assert_true(r.wait_p99_s == 80); /* p2: arrived 20, placed 100 */
    /* The bound: queued pods are tried only on freed nodes that fit them, so p1 and p3 cost none.
     */
    assert_int_equal(r.retries, 1);
    assert_true(r.t_end == 110);
    unload(&f);
}

static void test_deletion_before_creation(void **state)
{
    static const char pods[] = POD_HEADER "p0,4000,8192,1,600,,LS,Running,0,100,0\n"
                                          "p1,4000,8192,1,500,,LS,Running,90,50,90\n";
    fixture f;
    kgpu_error err;
    kgpu_error_clear(&err);
    assert_int_equal(load(&f, one_gpu_csv, pods, &err), KGPU_EPARSE);
    assert_string_equal(err.msg, "p.csv:3: deletion_time 50 before creation_time 90");
    unload(&f);

    static const char no_time[] = POD_HEADER "p0,4000,8192,1,600,,LS,Running,,100,0\n";
    assert_int_equal(load(&f, one_gpu_csv, no_time, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "p.csv:2: creation_time is empty"));
    unload(&f);

    static const char five_col[] = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,"
                                   "500\n";
    assert_int_equal(load(&f, one_gpu_csv, five_col, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "11-column"));
    unload(&f);
}

/* Enough pods on five nodes that the queue, ties and the random policy all come into play. */
static char *busy_trace(void)
{
    static char buf[16384];
    size_t n = 0;
    n += (size_t)snprintf(buf + n, sizeof(buf) - n, POD_HEADER);
    for (int i = 0; i < 120; i++) {
        int gpus = i % 7 == 0 ? 2 : 1, milli = i % 3 == 0 ? 1000 : 250 + (i * 37) % 600;
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "q%d,%d,%d,%d,%d,,LS,Running,%d,%d,%d\n", i,
                              2000 + (i % 5) * 1000, 4096, gpus, gpus > 1 ? 1000 : milli, i * 3,
                              i * 3 + 40 + (i * 53) % 200, i * 3);
    }
    return buf;
}

static void test_deterministic_per_seed(void **state)
{
    fixture f;
    kgpu_error err;
    assert_int_equal(load(&f, five_nodes_csv, busy_trace(), &err), 0);
    const char *policies[] = {"random", "fgd", "kgpu"};
    for (size_t i = 0; i < sizeof(policies) / sizeof(*policies); i++) {
        kgpu_churn_result a, b;
        run_ok(&f, policies[i], 7, &a);
        run_ok(&f, policies[i], 7, &b);
        assert_true(a.waited > 0); /* the trace does load the cluster */
        assert_int_equal(a.waited, b.waited);
        assert_int_equal(a.never_placed, b.never_placed);
        assert_int_equal(a.max_queue, b.max_queue);
        assert_true(a.wait_p99_s == b.wait_p99_s && a.wait_mean_s == b.wait_mean_s);
        assert_true(a.alloc_mean_pct == b.alloc_mean_pct && a.t_end == b.t_end);
        assert_memory_equal(a.alloc_pct, b.alloc_pct, sizeof(a.alloc_pct));
    }
    unload(&f);
}

typedef struct seen {
    const kgpu_churn_input *in;
    double speedup;
    int count[200];
    long total;
    double last_now;
    bool ok;
} seen;

static void on_observe(void *ctx, size_t request, double now)
{
    seen *s = ctx;
    if (request >= 200 || s->in->creation[request] / s->speedup > now || now < s->last_now)
        s->ok = false; /* shown before it arrived, or time ran backwards */
    else
        s->count[request]++;
    s->last_now = now;
    s->total++;
}

/* Learning policies are shown each pod once, at its arrival, never a pod still to come. */
static void test_online_sees_only_arrived_pods(void **state)
{
    fixture f;
    kgpu_error err;
    assert_int_equal(load(&f, five_nodes_csv, busy_trace(), &err), 0);
    const char *policies[] = {"kgpu", "fgd"};
    for (size_t i = 0; i < sizeof(policies) / sizeof(*policies); i++) {
        seen s = {.in = &f.in, .speedup = 2, .ok = true};
        kgpu_churn_config cfg = {.policy = policies[i],
                                 .seed = 3,
                                 .online = true,
                                 .speedup = 2,
                                 .on_observe = on_observe,
                                 .ctx = &s};
        kgpu_churn_result r;
        assert_int_equal(kgpu_churn_run(&f.in, &cfg, &r, &err), 0);
        assert_true(r.online);
        assert_true(r.waited > 0); /* queued pods were retried without being shown again */
        assert_true(s.ok);
        assert_int_equal(s.total, (long)f.sim.nrequests);
        for (size_t k = 0; k < f.sim.nrequests; k++)
            assert_int_equal(s.count[k], 1);
    }
    unload(&f);
}

static void test_speedup_and_bad_config(void **state)
{
    static const char pods[] = POD_HEADER "p0,4000,8192,1,1000,,LS,Running,0,100,0\n"
                                          "p1,4000,8192,1,1000,,LS,Running,10,50,10\n";
    fixture f;
    kgpu_error err;
    assert_int_equal(load(&f, one_gpu_csv, pods, &err), 0);
    kgpu_churn_config cfg = {.policy = "fgd", .seed = 1, .speedup = 10};
    kgpu_churn_result r;
    assert_int_equal(kgpu_churn_run(&f.in, &cfg, &r, &err), 0);
    assert_true(r.wait_p99_s == 99); /* p1 now arrives at 1; p0 still runs 100 s */
    cfg.speedup = 0;
    assert_int_equal(kgpu_churn_run(&f.in, &cfg, &r, &err), KGPU_EINVAL);
    cfg.speedup = 1;
    cfg.policy = "nope";
    assert_int_not_equal(kgpu_churn_run(&f.in, &cfg, &r, &err), 0);
    unload(&f);
}

/* --inflate under churn: the study's volume, drawn pods arriving with their originals. */
static void test_inflate(void **state)
{
    fixture f;
    kgpu_error err;
    assert_int_equal(load(&f, five_nodes_csv, busy_trace(), &err), 0);
    kgpu_churn_config cfg = {.policy = "fgd", .seed = 5, .speedup = 1, .inflate = 0};
    kgpu_churn_result base, more, again;
    assert_int_equal(kgpu_churn_run(&f.in, &cfg, &base, &err), 0);
    assert_int_equal(base.pods, 120);
    cfg.inflate = 10; /* the trace asks about 4.5x the 24 GPUs' capacity */
    assert_int_equal(kgpu_churn_run(&f.in, &cfg, &more, &err), 0);
    assert_int_equal(kgpu_churn_run(&f.in, &cfg, &again, &err), 0);
    assert_true(more.pods > 2 * base.pods);
    assert_int_equal(more.pods, again.pods);
    assert_true(more.waited > base.waited);
    assert_true(more.wait_p99_s == again.wait_p99_s);
    cfg.inflate = 2; /* under it: random pods dropped */
    assert_int_equal(kgpu_churn_run(&f.in, &cfg, &more, &err), 0);
    assert_true(more.pods < base.pods);
    cfg.inflate = -1;
    assert_int_equal(kgpu_churn_run(&f.in, &cfg, &more, &err), KGPU_EINVAL);
    unload(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_until_departure),
        cmocka_unit_test(test_never_placed_and_no_head_of_line_blocking),
        cmocka_unit_test(test_deletion_before_creation),
        cmocka_unit_test(test_deterministic_per_seed),
        cmocka_unit_test(test_online_sees_only_arrived_pods),
        cmocka_unit_test(test_speedup_and_bad_config),
        cmocka_unit_test(test_inflate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
