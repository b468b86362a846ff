/*
 * The study's small mixed cluster and pod list, prepared once per test
 * program (test_sim.c, test_sim_dra.c): cmocka group setup and teardown.
 * Header-only; include it once per test program, after cmocka.h.
 */
#ifndef KGPU_TEST_SIM_FIXTURE_H
#define KGPU_TEST_SIM_FIXTURE_H

#include <string.h>

#include "kgpu/sim.h"
#include "kgpu/trace.h"

static const char nodes_csv[] = "sn,cpu_milli,memory_mib,gpu,model\n"
                                "n0,64000,262144,2,T4\n"
                                "n1,64000,262144,2,T4\n"
                                "n2,96000,786432,8,V100M32\n"
                                "n3,96000,786432,8,V100M32\n"
                                "n4,32000,131072,4,P100\n";

static const char pods_csv[] =
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_"
    "time,scheduled_time\n"
    "p0,4000,8192,1,500,,LS,Running,0,10,0\n"
    "p1,8000,16384,1,1000,,LS,Running,1,10,1\n"
    "p2,2000,4096,1,250,,BE,Running,2,10,2\n"
    "p3,16000,32768,2,1000,,LS,Running,3,10,3\n"
    "p4,12000,16384,0,0,,BE,Running,4,10,4\n"
    "p5,6000,8192,1,700,V100M32,LS,Running,5,10,5\n"
    "p6,24000,65536,4,1000,,LS,Running,6,10,6\n"
    "p7,3000,8192,1,300,T4|P100,BE,Running,7,10,7\n";

typedef struct fixture {
    kgpu_trace nodes, pods;
    kgpu_sim_input in;
} fixture;

static int setup(void **state)
{
    static fixture f;
    memset(&f, 0, sizeof(f));
    kgpu_error err;
    assert_int_equal(kgpu_trace_parse_nodes(nodes_csv, strlen(nodes_csv), "n.csv", &f.nodes, &err),
                     0);
    assert_int_equal(kgpu_trace_parse_pods(pods_csv, strlen(pods_csv), "p.csv", &f.pods, &err), 0);
    assert_int_equal(kgpu_sim_prepare(&f.nodes, &f.pods, &f.in, &err), 0);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    kgpu_sim_input_free(&f->in);
    kgpu_trace_free(&f->nodes);
    kgpu_trace_free(&f->pods);
    return 0;
}

#endif
