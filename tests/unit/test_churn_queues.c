/*
 * Unit tests of GPU queues in the simulator with time (src/core/churn.c with
 * kgpu/queue.h, src/cli/simqueues.c): a trace small enough to work out by
 * hand under each way of dividing the cluster, the pod to queue rule of the
 * simulator, and on the bursty example: static caps never borrow, no mode
 * but reclaim evicts, kgpu's reclaim never frees a GPU the waiting pod does
 * not take there, and runs are deterministic.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "example_queues.h"
#include "fileio.h"
#include "kgpu/churn.h"
#include "queuefile.h"
#include "simqueues.h"

#define POD_HEADER                                                                                 \
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_"   \
    "time,scheduled_time\n"

typedef struct fixture {
    kgpu_trace nodes, pods;
    kgpu_sim_input sim;
    kgpu_churn_input in;
    kgpu_queues *qs;
    int *queue_of, *prio_of;
    kgpu_churn_queues cq;
} fixture;

static void load(fixture *f, const char *nodes, size_t nl, const char *pods, size_t pl,
                 const char *queues, size_t ql)
{
    kgpu_error err;
    kgpu_error_clear(&err);
    memset(f, 0, sizeof(*f));
    assert_int_equal(kgpu_trace_parse_nodes(nodes, nl, "n.csv", &f->nodes, &err), 0);
    assert_int_equal(kgpu_trace_parse_pods(pods, pl, "p.csv", &f->pods, &err), 0);
    assert_int_equal(kgpu_sim_prepare(&f->nodes, &f->pods, &f->sim, &err), 0);
    assert_int_equal(kgpu_churn_prepare(&f->sim, &f->pods, "p.csv", &f->in, &err), 0);
    if (kgpu_queues_load(queues, ql, "q.yaml", &f->qs, &err) != 0)
        fail_msg("%s", err.msg);
    assert_non_null(f->qs);
    assert_int_equal(kgpu_simq_assign(f->qs, &f->pods, "p.csv", &f->queue_of, &f->prio_of, &err),
                     0);
    f->cq = (kgpu_churn_queues){.tree = f->qs, .queue = f->queue_of, .priority = f->prio_of};
}

static void unload(fixture *f)
{
    free(f->queue_of);
    free(f->prio_of);
    kgpu_queues_free(f->qs);
    kgpu_churn_input_free(&f->in);
    kgpu_sim_input_free(&f->sim);
    kgpu_trace_free(&f->nodes);
    kgpu_trace_free(&f->pods);
}

static void run_mode(fixture *f, kgpu_churn_queue_mode mode, kgpu_churn_result *out)
{
    kgpu_churn_config cfg = {.policy = "kgpu", .seed = 42, .speedup = 1, .queues = &f->cq,
                             .queue_mode = mode};
    kgpu_error err;
    kgpu_error_clear(&err);
    if (kgpu_churn_run(&f->in, &cfg, out, &err) != 0)
        fail_msg("kgpu_churn_run: %s", err.msg);
}

/*
 * Two GPUs, a and b guaranteed one each. b takes both (b1 borrows a's);
 * a0 arrives at 10 for one GPU and lives 100 s.
 */
static const char two_gpu_nodes[] = "sn,cpu_milli,memory_mib,gpu,model\n"
                                    "n0,32000,131072,2,T4\n";
static const char two_gpu_pods[] = POD_HEADER "b-0,4000,8192,1,1000,,BE,Running,0,1000,0\n"
                                              "b-1,4000,8192,1,1000,,BE,Running,1,1001,1\n"
                                              "a-0,4000,8192,1,1000,,LS,Running,10,110,10\n";
static const char two_queues[] = "queues:\n"
                                 "  - {name: a, guarantee: {gpu: 1}}\n"
                                 "  - {name: b, guarantee: {gpu: 1}}\n";

static void test_by_hand(void **state)
{
    (void)state;
    fixture f;
    load(&f, two_gpu_nodes, strlen(two_gpu_nodes), two_gpu_pods, strlen(two_gpu_pods),
         two_queues, strlen(two_queues));
    assert_int_equal(f.queue_of[0], kgpu_queues_find(f.qs, "b"));
    assert_int_equal(f.queue_of[2], kgpu_queues_find(f.qs, "a"));
    assert_int_equal(f.prio_of[2], 2); /* LS */
    assert_int_equal(f.prio_of[0], 0); /* BE */
    kgpu_churn_result r;

    /* No queues: a0 waits for b0 to leave at 1000. */
    run_mode(&f, KGPU_CHURN_QUEUES_OFF, &r);
    assert_int_equal(r.nqueues, 0);
    assert_int_equal(r.evictions, 0);
    assert_int_equal(r.waited, 1);
    assert_true(r.wait_p99_s == 990);

    /* Static caps: b1 may not borrow; it waits until b0 leaves, a0 runs at once. */
    run_mode(&f, KGPU_CHURN_QUEUES_STATIC, &r);
    assert_int_equal(r.evictions, 0);
    assert_int_equal(r.quota_refused, 1);
    assert_int_equal(r.waited, 1);
    assert_true(r.wait_p99_s == 999);

    /* Borrowing with either reclaim: b1 is evicted at 10, a0 runs, b1 comes back at 110. */
    for (int m = KGPU_CHURN_QUEUES_PRIORITY_AGE; m <= KGPU_CHURN_QUEUES_FRAG; m++) {
        run_mode(&f, (kgpu_churn_queue_mode)m, &r);
        assert_int_equal(r.evictions, 1);
        assert_int_equal(r.reclaims, 1);
        assert_int_equal(r.queue[kgpu_queues_find(f.qs, "b")].evicted, 1);
        assert_int_equal(r.queue[kgpu_queues_find(f.qs, "a")].evicted, 0);
        assert_true(r.freed_gpus == 1.0);
        assert_true(r.freed_unused_gpus == 0.0);
        assert_true(r.lost_gpu_s == 9.0); /* b1 ran from 1 to 10 on one GPU */
        assert_true(r.wait_p99_s == 0);   /* b1's first placement was at once too */
        assert_int_equal(r.never_placed, 0);
        /* a never waited below its guarantee once a round was over. */
        assert_int_equal(r.queue[kgpu_queues_find(f.qs, "a")].starved_reclaimable_rounds_max, 0);
    }
    unload(&f);
}

static void test_assignment_rule(void **state)
{
    (void)state;
    kgpu_queues *qs;
    kgpu_error err;
    const char *y = "queues:\n"
                    "  - {name: team-a, guarantee: {gpu: 3}}\n"
                    "  - {name: team-ab, guarantee: {gpu: 1}}\n"
                    "  - {name: org}\n"
                    "  - {name: team-c, parent: org, guarantee: {gpu: 0}}\n";
    assert_int_equal(kgpu_queues_load(y, strlen(y), "q.yaml", &qs, &err), 0);
    int a = kgpu_queues_find(qs, "team-a"), ab = kgpu_queues_find(qs, "team-ab");
    assert_int_equal(kgpu_simq_queue_of(qs, "team-a-00001"), a);
    assert_int_equal(kgpu_simq_queue_of(qs, "team-ab-00001"), ab); /* the longest prefix */
    /* Hashed names go to leaves in proportion to their guarantees: 3:1:0. */
    int n[4] = {0};
    for (int i = 0; i < 4000; i++) {
        char name[32];
        snprintf(name, sizeof(name), "openb-pod-%04d", i);
        int q = kgpu_simq_queue_of(qs, name);
        assert_true(q == a || q == ab);
        n[q == a ? 0 : 1]++;
    }
    assert_in_range(n[0], 2800, 3200);
    assert_int_equal(kgpu_simq_priority_of("Guaranteed"), 3);
    assert_int_equal(kgpu_simq_priority_of("Burstable"), 1);
    assert_int_equal(kgpu_simq_priority_of(""), 0);
    kgpu_churn_queue_mode modes[4];
    int nm;
    assert_int_equal(kgpu_simq_parse_modes("static,frag", modes, 4, &nm, &err), 0);
    assert_int_equal(nm, 2);
    assert_int_equal(modes[1], KGPU_CHURN_QUEUES_FRAG);
    assert_int_equal(kgpu_simq_parse_modes("kueue", modes, 4, &nm, &err), KGPU_EINVAL);
    kgpu_queues_free(qs);
}

/* A pod file with a queue column: the column wins over the name, an empty cell does not. */
static void test_queue_column(void **state)
{
    (void)state;
    static const char pods[] =
        POD_HEADER "b-0,4000,8192,1,1000,,BE,Running,0,1000,0,a\n"
                   "b-1,4000,8192,1,1000,,BE,Running,1,1001,1,\n"
                   "x-2,4000,8192,1,1000,,LS,Running,10,110,10,b\n";
    char header12[512];
    snprintf(header12, sizeof(header12), "%.*s,queue\n", (int)strlen(POD_HEADER) - 1, POD_HEADER);
    char text[1024];
    snprintf(text, sizeof(text), "%s%s", header12, pods + strlen(POD_HEADER));
    kgpu_trace t;
    kgpu_error err;
    kgpu_error_clear(&err);
    if (kgpu_trace_parse_pods(text, strlen(text), "p.csv", &t, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(t.columns, 12);
    assert_string_equal(t.pods[0].queue, "a");
    assert_string_equal(t.pods[1].queue, "");
    assert_true(t.pods[2].creation == 10);
    kgpu_queues *qs;
    assert_int_equal(kgpu_queues_load(two_queues, strlen(two_queues), "q.yaml", &qs, &err), 0);
    int *qof, *prio;
    assert_int_equal(kgpu_simq_assign(qs, &t, "p.csv", &qof, &prio, &err), 0);
    assert_int_equal(qof[0], kgpu_queues_find(qs, "a")); /* the column, not the name's "b-" */
    assert_int_equal(qof[1], kgpu_queues_find(qs, "b")); /* empty: the name */
    assert_int_equal(qof[2], kgpu_queues_find(qs, "b"));
    free(qof);
    free(prio);
    kgpu_trace_free(&t);

    /* A queue the file does not have. */
    snprintf(text, sizeof(text), "%s%s", header12,
             "p-0,4000,8192,1,1000,,BE,Running,0,1000,0,a\np-1,4000,8192,1,1000,,BE,Running,0,"
             "1000,0,nope\n");
    assert_int_equal(kgpu_trace_parse_pods(text, strlen(text), "p.csv", &t, &err), 0);
    assert_int_equal(kgpu_simq_assign(qs, &t, "p.csv", &qof, &prio, &err), KGPU_EINVAL);
    assert_string_equal(err.msg, "p.csv:3: queue 'nope' is not in the queue file");
    assert_null(qof);
    kgpu_trace_free(&t);
    kgpu_queues_free(qs);
}

static char *slurp(const char *path, size_t *len)
{
    char *buf;
    kgpu_error err;
    if (kgpu_read_file_max(path, 64 << 20, &buf, len, &err) != 0)
        fail_msg("%s", err.msg);
    return buf;
}

/* The bursty example at 8 nodes: what must hold whatever the figures. */
static void test_bursty_example(void **state)
{
    (void)state;
    char dir[] = "/tmp/kgpu-test-queues-XXXXXX";
    assert_non_null(mkdtemp(dir));
    kgpu_error err;
    kgpu_error_clear(&err);
    assert_int_equal(kgpu_example_queues_write(dir, 3, 8, &err), 0);
    char p[3][300];
    const char *names[] = {"nodes.csv", "pods.csv", "queues.yaml"};
    char *buf[3];
    size_t len[3];
    for (int i = 0; i < 3; i++) {
        snprintf(p[i], sizeof(p[i]), "%s/%s", dir, names[i]);
        buf[i] = slurp(p[i], &len[i]);
    }
    fixture f;
    load(&f, buf[0], len[0], buf[1], len[1], buf[2], len[2]);
    int nq = kgpu_queues_count(f.qs);
    kgpu_churn_result r[4];
    for (int m = 0; m < 4; m++)
        run_mode(&f, (kgpu_churn_queue_mode)m, &r[m]);
    /* Static caps: no queue ever uses more than its guarantee, so neither does its mean. */
    for (int q = 0; q < nq; q++) {
        kgpu_queue_info qi;
        kgpu_queues_info(f.qs, q, &qi);
        assert_true(r[KGPU_CHURN_QUEUES_STATIC].queue[q].borrowed_mean_gpus == 0);
        assert_true(r[KGPU_CHURN_QUEUES_STATIC].queue[q].used_mean_gpus <=
                    (double)qi.guarantee.milli / 1000 + 1e-9);
    }
    assert_true(r[KGPU_CHURN_QUEUES_STATIC].quota_refused > 0);
    assert_int_equal(r[KGPU_CHURN_QUEUES_OFF].evictions + r[KGPU_CHURN_QUEUES_STATIC].evictions, 0);
    /* The bursts overlap: both reclaiming modes evict; kgpu's frees only what the pod takes. */
    assert_true(r[KGPU_CHURN_QUEUES_PRIORITY_AGE].evictions > 0);
    assert_true(r[KGPU_CHURN_QUEUES_FRAG].evictions > 0);
    /*
     * Nearly all that kgpu's reclaim frees, the waiting pod takes (the policy
     * may still choose other GPUs of the node than the search did: 1 GPU of
     * 170 here); reclaim by priority and age frees far more that it does not.
     */
    const kgpu_churn_result *pa = &r[KGPU_CHURN_QUEUES_PRIORITY_AGE];
    const kgpu_churn_result *fr = &r[KGPU_CHURN_QUEUES_FRAG];
    assert_true(fr->freed_unused_gpus <= 0.02 * fr->freed_gpus);
    assert_true(pa->freed_unused_gpus > 10 * fr->freed_unused_gpus);
    assert_true(fr->evictions < pa->evictions);
    /* Static caps alone leave pods out: team-d's 8-GPU pods pass its cap of 6 GPUs. */
    assert_true(r[KGPU_CHURN_QUEUES_STATIC].never_placed > 0);
    for (int m = 0; m < 4; m++) {
        if (m != KGPU_CHURN_QUEUES_STATIC)
            assert_int_equal(r[m].never_placed, 0);
        assert_true(r[m].jain_borrowers > 0 && r[m].jain_borrowers <= 1.0 + 1e-9);
    }
    /* Same inputs, same run. */
    kgpu_churn_result again;
    run_mode(&f, KGPU_CHURN_QUEUES_FRAG, &again);
    assert_memory_equal(&again, &r[KGPU_CHURN_QUEUES_FRAG], sizeof(again));
    unload(&f);
    for (int i = 0; i < 3; i++) {
        free(buf[i]);
        unlink(p[i]);
    }
    rmdir(dir);
}

static void test_bad_queue_config(void **state)
{
    (void)state;
    fixture f;
    load(&f, two_gpu_nodes, strlen(two_gpu_nodes), two_gpu_pods, strlen(two_gpu_pods),
         two_queues, strlen(two_queues));
    f.queue_of[1] = 99;
    kgpu_churn_config cfg = {.policy = "kgpu", .seed = 1, .speedup = 1, .queues = &f.cq,
                             .queue_mode = KGPU_CHURN_QUEUES_FRAG};
    kgpu_churn_result r;
    kgpu_error err;
    assert_int_equal(kgpu_churn_run(&f.in, &cfg, &r, &err), KGPU_EINVAL);
    assert_string_equal(err.msg, "pod 1: queue 99 does not exist");
    unload(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_by_hand),
        cmocka_unit_test(test_assignment_rule),
        cmocka_unit_test(test_queue_column),
        cmocka_unit_test(test_bursty_example),
        cmocka_unit_test(test_bad_queue_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
