/*
 * Unit tests of the Alibaba trace reader (src/core/trace.c): both file kinds and
 * both pod layouts field by field, every rejection with its exact "file:line:" and
 * the field it names, and the real trace files when KGPU_TRACE_DIR holds them.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "kgpu/model.h"
#include "kgpu/trace.h"

#define NODE_HEADER "sn,cpu_milli,memory_mib,gpu,model\n"
#define POD5_HEADER "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
#define POD11_HEADER                                                                               \
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"            \
    "deletion_time,scheduled_time\n"

static int parse_nodes(const char *s, kgpu_trace *t, kgpu_error *e)
{
    return kgpu_trace_parse_nodes(s, strlen(s), "nodes.csv", t, e);
}

static int parse_pods(const char *s, kgpu_trace *t, kgpu_error *e)
{
    return kgpu_trace_parse_pods(s, strlen(s), "pods.csv", t, e);
}

static void assert_zeroed(const kgpu_trace *t)
{
    kgpu_trace zero;
    memset(&zero, 0, sizeof(zero));
    assert_memory_equal(t, &zero, sizeof(zero));
}

/*
 * Asserts a rejected parse: KGPU_EPARSE, a message starting with `where` (the exact
 * "file:line: ") and containing `what`, and the output left zeroed.
 */
static void check_error(int rc, const kgpu_trace *t, const kgpu_error *e, const char *where,
                        const char *what)
{
    if (rc != KGPU_EPARSE || strncmp(e->msg, where, strlen(where)) != 0 ||
        strstr(e->msg, what) == NULL)
        print_error("got rc %d \"%s\", want \"%s...%s...\"\n", rc, e->msg, where, what);
    assert_int_equal(rc, KGPU_EPARSE);
    assert_int_equal(e->code, KGPU_EPARSE);
    assert_true(strncmp(e->msg, where, strlen(where)) == 0);
    assert_non_null(strstr(e->msg, what));
    assert_zeroed(t);
}

static void node_error(const char *input, const char *where, const char *what)
{
    kgpu_trace t;
    kgpu_error e;
    memset(&t, 0x5a, sizeof(t)); /* garbage in *out must not matter */
    kgpu_error_clear(&e);
    check_error(parse_nodes(input, &t, &e), &t, &e, where, what);
}

static void pod_error(const char *input, const char *where, const char *what)
{
    kgpu_trace t;
    kgpu_error e;
    memset(&t, 0x5a, sizeof(t));
    kgpu_error_clear(&e);
    check_error(parse_pods(input, &t, &e), &t, &e, where, what);
}

/* pod_error on an 11-column file whose line 2 is `row`. */
static void pod_row_error(const char *row, const char *what)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), POD11_HEADER "ok-0,1000,1024,0,0,,LS,Running,1,2,1\n%s\n", row);
    pod_error(buf, "pods.csv:3: ", what);
}

static void test_nodes_valid(void **state)
{
    (void)state;
    const char *in = NODE_HEADER "openb-node-0000,64000,262144,2,P100\n"
                                 "openb-node-0001,32000,131072,0,\n"
                                 "cpu-1,96000,786432,0,nan\n"
                                 "big,128000,1048576,8,V100M32\n";
    kgpu_trace t;
    kgpu_error e;
    assert_int_equal(parse_nodes(in, &t, &e), KGPU_OK);
    assert_int_equal(t.columns, 5);
    assert_int_equal(t.nnodes, 4);
    assert_int_equal(t.npods, 0);
    assert_null(t.pods);
    assert_non_null(t.arena);

    assert_string_equal(t.nodes[0].name, "openb-node-0000");
    assert_int_equal(t.nodes[0].cpu_milli, 64000);
    assert_int_equal(t.nodes[0].memory_mib, 262144);
    assert_int_equal(t.nodes[0].gpus, 2);
    assert_string_equal(t.nodes[0].model, "P100");
    assert_int_equal(t.nodes[0].line, 2);

    assert_string_equal(t.nodes[1].name, "openb-node-0001");
    assert_int_equal(t.nodes[1].cpu_milli, 32000);
    assert_int_equal(t.nodes[1].memory_mib, 131072);
    assert_int_equal(t.nodes[1].gpus, 0);
    assert_string_equal(t.nodes[1].model, "");
    assert_int_equal(t.nodes[1].line, 3);

    assert_string_equal(t.nodes[2].name, "cpu-1");
    assert_int_equal(t.nodes[2].gpus, 0);
    assert_string_equal(t.nodes[2].model, ""); /* "nan" means none */
    assert_int_equal(t.nodes[2].line, 4);

    assert_string_equal(t.nodes[3].name, "big");
    assert_int_equal(t.nodes[3].cpu_milli, 128000);
    assert_int_equal(t.nodes[3].memory_mib, 1048576);
    assert_int_equal(t.nodes[3].gpus, 8);
    assert_string_equal(t.nodes[3].model, "V100M32");
    assert_int_equal(t.nodes[3].line, 5);

    kgpu_trace_free(&t);
    assert_zeroed(&t);
}

static void test_pods_valid_11(void **state)
{
    (void)state;
    const char *in =
        POD11_HEADER "openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
                     "openb-pod-0001,6000,12288,1,460,V100M16|V100M32,BE,Pending,427061,12902960,\n"
                     "cpu-pod,88000,327680,0,0,nan,Burstable,Succeeded,5,6,7\n"
                     "multi,32000,65536,8,1000,T4||A10|,Weird,Unknown,,,\n";
    kgpu_trace t;
    kgpu_error e;
    assert_int_equal(parse_pods(in, &t, &e), KGPU_OK);
    assert_int_equal(t.columns, 11);
    assert_int_equal(t.npods, 4);
    assert_int_equal(t.nnodes, 0);
    assert_null(t.nodes);

    const kgpu_trace_pod *p = &t.pods[0];
    assert_string_equal(p->name, "openb-pod-0000");
    assert_int_equal(p->cpu_milli, 12000);
    assert_int_equal(p->memory_mib, 16384);
    assert_int_equal(p->num_gpu, 1);
    assert_int_equal(p->gpu_milli, 1000);
    assert_int_equal(p->nspec, 0);
    assert_string_equal(p->spec_text, "");
    assert_string_equal(p->qos, "LS");
    assert_string_equal(p->phase, "Running");
    assert_int_equal(p->creation, 0);
    assert_int_equal(p->deletion, 12537496);
    assert_int_equal(p->scheduled, 0);
    assert_int_equal(p->line, 2);

    p = &t.pods[1];
    assert_string_equal(p->name, "openb-pod-0001");
    assert_int_equal(p->cpu_milli, 6000);
    assert_int_equal(p->memory_mib, 12288);
    assert_int_equal(p->num_gpu, 1);
    assert_int_equal(p->gpu_milli, 460);
    assert_int_equal(p->nspec, 2);
    assert_string_equal(p->spec[0], "V100M16");
    assert_string_equal(p->spec[1], "V100M32");
    assert_string_equal(p->spec_text, "V100M16|V100M32");
    assert_string_equal(p->qos, "BE");
    assert_string_equal(p->phase, "Pending");
    assert_int_equal(p->creation, 427061);
    assert_int_equal(p->deletion, 12902960);
    assert_int_equal(p->scheduled, -1);
    assert_int_equal(p->line, 3);

    p = &t.pods[2];
    assert_string_equal(p->name, "cpu-pod");
    assert_int_equal(p->cpu_milli, 88000);
    assert_int_equal(p->memory_mib, 327680);
    assert_int_equal(p->num_gpu, 0);
    assert_int_equal(p->gpu_milli, 0);
    assert_int_equal(p->nspec, 0);
    assert_string_equal(p->spec_text, ""); /* "nan" means any model */
    assert_string_equal(p->qos, "Burstable");
    assert_string_equal(p->phase, "Succeeded");
    assert_int_equal(p->creation, 5);
    assert_int_equal(p->deletion, 6);
    assert_int_equal(p->scheduled, 7);
    assert_int_equal(p->line, 4);

    p = &t.pods[3];
    assert_string_equal(p->name, "multi");
    assert_int_equal(p->num_gpu, 8);
    assert_int_equal(p->gpu_milli, 1000);
    assert_int_equal(p->nspec, 2); /* empty elements skipped */
    assert_string_equal(p->spec[0], "T4");
    assert_string_equal(p->spec[1], "A10");
    assert_string_equal(p->spec_text, "T4||A10|");
    assert_string_equal(p->qos, "Weird");
    assert_string_equal(p->phase, "Unknown");
    assert_int_equal(p->creation, -1);
    assert_int_equal(p->deletion, -1);
    assert_int_equal(p->scheduled, -1);
    assert_int_equal(p->line, 5);

    /* Strings live in the arena, so they outlive the input buffer's contents. */
    char *copy = strdup(in);
    assert_non_null(copy);
    kgpu_trace t2;
    assert_int_equal(kgpu_trace_parse_pods(copy, strlen(copy), "x", &t2, &e), KGPU_OK);
    memset(copy, 'X', strlen(copy));
    free(copy);
    assert_string_equal(t2.pods[1].spec[1], "V100M32");
    assert_string_equal(t2.pods[3].name, "multi");
    kgpu_trace_free(&t2);

    kgpu_trace_free(&t);
    assert_zeroed(&t);
}

static void test_pods_valid_5(void **state)
{
    (void)state;
    const char *in = POD5_HEADER "openb-pod-0000,12000,16384,1,1000\n"
                                 "openb-pod-0001,6000,12288,1,460\n"
                                 "p2,0,0,0,0\n"
                                 "p3,64000,262144,8,1000\n";
    kgpu_trace t;
    kgpu_error e;
    assert_int_equal(parse_pods(in, &t, &e), KGPU_OK);
    assert_int_equal(t.columns, 5);
    assert_int_equal(t.npods, 4);
    static const struct {
        const char *name;
        int64_t cpu, mem;
        int num_gpu, milli;
    } want[] = {{"openb-pod-0000", 12000, 16384, 1, 1000},
                {"openb-pod-0001", 6000, 12288, 1, 460},
                {"p2", 0, 0, 0, 0},
                {"p3", 64000, 262144, 8, 1000}};
    for (int i = 0; i < 4; i++) {
        const kgpu_trace_pod *p = &t.pods[i];
        assert_string_equal(p->name, want[i].name);
        assert_int_equal(p->cpu_milli, want[i].cpu);
        assert_int_equal(p->memory_mib, want[i].mem);
        assert_int_equal(p->num_gpu, want[i].num_gpu);
        assert_int_equal(p->gpu_milli, want[i].milli);
        assert_int_equal(p->nspec, 0);
        assert_string_equal(p->spec_text, "");
        assert_string_equal(p->qos, "");
        assert_string_equal(p->phase, "");
        assert_int_equal(p->creation, -1);
        assert_int_equal(p->deletion, -1);
        assert_int_equal(p->scheduled, -1);
        assert_int_equal(p->line, i + 2);
    }
    kgpu_trace_free(&t);
}

static void test_line_ends(void **state)
{
    (void)state;
    kgpu_trace t;
    kgpu_error e;

    /* CRLF throughout, and the CR is not part of the last field. */
    assert_int_equal(parse_nodes("sn,cpu_milli,memory_mib,gpu,model\r\n"
                                 "n0,1000,2048,1,T4\r\n"
                                 "n1,1000,2048,0,\r\n",
                                 &t, &e),
                     KGPU_OK);
    assert_int_equal(t.nnodes, 2);
    assert_string_equal(t.nodes[0].model, "T4");
    assert_string_equal(t.nodes[1].model, "");
    kgpu_trace_free(&t);

    assert_int_equal(parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,"
                                "pod_phase,creation_time,deletion_time,scheduled_time\r\n"
                                "p0,1,2,1,500,T4,LS,Running,1,2,3\r\n"
                                "p1,1,2,0,0,,BE,Failed,1,2,\r\n",
                                &t, &e),
                     KGPU_OK);
    assert_int_equal(t.columns, 11);
    assert_int_equal(t.npods, 2);
    assert_int_equal(t.pods[0].scheduled, 3);
    assert_string_equal(t.pods[1].phase, "Failed");
    assert_int_equal(t.pods[1].scheduled, -1);
    kgpu_trace_free(&t);

    assert_int_equal(
        parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\r\np,1,2,1,300\r\n", &t, &e),
        KGPU_OK);
    assert_int_equal(t.columns, 5);
    assert_int_equal(t.pods[0].gpu_milli, 300);
    kgpu_trace_free(&t);

    /* No final newline. */
    assert_int_equal(parse_nodes(NODE_HEADER "n0,1,2,1,G2", &t, &e), KGPU_OK);
    assert_int_equal(t.nnodes, 1);
    assert_string_equal(t.nodes[0].model, "G2");
    kgpu_trace_free(&t);
    assert_int_equal(parse_pods(POD11_HEADER "p,1,2,1,1000,A10|T4,LS,Running,1,2,3", &t, &e),
                     KGPU_OK);
    assert_int_equal(t.pods[0].scheduled, 3);
    assert_int_equal(t.pods[0].nspec, 2);
    kgpu_trace_free(&t);

    /* One trailing empty line (LF or CRLF). */
    assert_int_equal(parse_nodes(NODE_HEADER "n0,1,2,1,G2\n\n", &t, &e), KGPU_OK);
    assert_int_equal(t.nnodes, 1);
    kgpu_trace_free(&t);
    assert_int_equal(parse_pods(POD5_HEADER "p,1,2,0,0\r\n\r\n", &t, &e), KGPU_OK);
    assert_int_equal(t.npods, 1);
    kgpu_trace_free(&t);

    /* A header alone is an empty list, with or without its newline. */
    assert_int_equal(parse_nodes("sn,cpu_milli,memory_mib,gpu,model", &t, &e), KGPU_OK);
    assert_int_equal(t.nnodes, 0);
    assert_int_equal(t.columns, 5);
    kgpu_trace_free(&t);
    assert_int_equal(parse_pods(POD11_HEADER, &t, &e), KGPU_OK);
    assert_int_equal(t.npods, 0);
    assert_int_equal(t.columns, 11);
    kgpu_trace_free(&t);
}

static void test_header_errors(void **state)
{
    (void)state;
    node_error("", "nodes.csv:1: ", "empty file");
    pod_error("", "pods.csv:1: ", "empty file");
    node_error("sn,cpu,memory_mib,gpu,model\nn,1,2,0,\n",
               "nodes.csv:1: ", "unknown header \"sn,cpu,memory_mib,gpu,model\"");
    node_error(POD5_HEADER "p,1,2,0,0\n", "nodes.csv:1: ", "expected the node list header");
    pod_error(NODE_HEADER "n,1,2,0,\n", "pods.csv:1: ", "unknown header \"sn,cpu_milli");
    pod_error("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n",
              "pods.csv:1: ", "expected the pod list header");
    pod_error("\n" POD5_HEADER, "pods.csv:1: ", "unknown header \"\"");
    /* A NULL file name still gives a usable prefix. */
    kgpu_trace t;
    kgpu_error e;
    assert_int_equal(kgpu_trace_parse_pods("x\n", 2, NULL, &t, &e), KGPU_EPARSE);
    assert_true(strncmp(e.msg, "<buffer>:1: ", 12) == 0);
    assert_int_equal(kgpu_trace_parse_pods(NULL, 0, "p.csv", &t, &e), KGPU_EPARSE);
    assert_string_equal(e.msg, "p.csv:1: empty file, expected the header \"name,cpu_milli,"
                               "memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                               "creation_time,deletion_time,scheduled_time\"");
    /* NULL err is allowed everywhere. */
    assert_int_equal(kgpu_trace_parse_nodes("bad", 3, "n", &t, NULL), KGPU_EPARSE);
    assert_zeroed(&t);
}

static void test_column_count(void **state)
{
    (void)state;
    kgpu_trace t;
    kgpu_error e;
    assert_int_equal(parse_nodes(NODE_HEADER "n0,1,2,0,\nn1,1,2,0\n", &t, &e), KGPU_EPARSE);
    assert_string_equal(e.msg, "nodes.csv:3: expected 5 columns, found 4");
    assert_zeroed(&t);
    node_error(NODE_HEADER "n0,1,2,0,,\n", "nodes.csv:2: ", "expected 5 columns, found 6");
    node_error(NODE_HEADER "n0\n", "nodes.csv:2: ", "expected 5 columns, found 1");
    pod_row_error("p,1,2,1,1000,,LS,Running,1,2", "expected 11 columns, found 10");
    pod_row_error("p,1,2,1,1000,,LS,Running,1,2,3,4", "expected 11 columns, found 12");
    pod_error(POD5_HEADER "p,1,2,0,0\np,1,2,0,0,\n", "pods.csv:3: ", "expected 5 columns, found 6");
    /* The layout is fixed by the header: 11-column rows in a 5-column file are wrong. */
    pod_error(POD5_HEADER "p,1,2,1,1000,,LS,Running,1,2,3\n",
              "pods.csv:2: ", "expected 5 columns, found 11");
}

static void test_number_errors(void **state)
{
    (void)state;
    node_error(NODE_HEADER "n0,abc,2,0,\n", "nodes.csv:2: ", "cpu_milli \"abc\" is not an integer");
    node_error(NODE_HEADER "n0,1,2.5,0,\n",
               "nodes.csv:2: ", "memory_mib \"2.5\" is not an integer");
    node_error(NODE_HEADER "n0,1, 2,0,\n", "nodes.csv:2: ", "memory_mib \" 2\" is not an integer");
    node_error(NODE_HEADER "n0,+1,2,0,\n", "nodes.csv:2: ", "cpu_milli \"+1\" is not an integer");
    node_error(NODE_HEADER "n0,-,2,0,\n", "nodes.csv:2: ", "cpu_milli \"-\" is not an integer");
    node_error(NODE_HEADER "n0,,2,0,\n", "nodes.csv:2: ", "cpu_milli is empty");
    node_error(NODE_HEADER "n0,1,2,,\n", "nodes.csv:2: ", "gpu is empty");
    node_error(NODE_HEADER "n0,-5,2,0,\n", "nodes.csv:2: ", "cpu_milli -5 < 0");
    node_error(NODE_HEADER "n0,1000000001,2,0,\n",
               "nodes.csv:2: ", "cpu_milli 1000000001 > 1000000000");
    node_error(NODE_HEADER "n0,1,10000000001,0,\n",
               "nodes.csv:2: ", "memory_mib 10000000001 > 10000000000");
    /* Values beyond int64 are reported, not wrapped. */
    node_error(NODE_HEADER "n0,99999999999999999999999,2,0,\n",
               "nodes.csv:2: ", "cpu_milli 99999999999999999999999 > 1000000000");
    node_error(NODE_HEADER "n0,-99999999999999999999999,2,0,\n",
               "nodes.csv:2: ", "cpu_milli -99999999999999999999999 < 0");
    node_error(NODE_HEADER "n0,1,2,33,X\n", "nodes.csv:2: ", "gpu 33 > 32");
    node_error(NODE_HEADER "n0,1,2,-1,X\n", "nodes.csv:2: ", "gpu -1 < 0");
    pod_row_error("p,x1,2,0,0,,LS,Running,1,2,3", "cpu_milli \"x1\" is not an integer");
    pod_row_error("p,1,-2,0,0,,LS,Running,1,2,3", "memory_mib -2 < 0");
    pod_row_error("p,1,2,one,0,,LS,Running,1,2,3", "num_gpu \"one\" is not an integer");
    pod_row_error("p,1,2,1,1e3,,LS,Running,1,2,3", "gpu_milli \"1e3\" is not an integer");
    pod_row_error("p,1,2,1,,,LS,Running,1,2,3", "gpu_milli is empty");
    pod_row_error("p,1,2,1,1000,,LS,Running,x,2,3", "creation_time \"x\" is not an integer");
    pod_row_error("p,1,2,1,1000,,LS,Running,1,-2,3", "deletion_time -2 < 0");
    pod_row_error("p,1,2,1,1000,,LS,Running,1,2,99999999999999999999",
                  "scheduled_time 99999999999999999999 > ");
    pod_row_error("p,1,2,1,1000,,LS,Running,1,2,nan", "scheduled_time \"nan\" is not an integer");
    /* Leading zeros are fine, and do not count as overflow. */
    kgpu_trace t;
    kgpu_error e;
    assert_int_equal(parse_nodes(NODE_HEADER "n0,0000000000000000000000001000,-0,02,T4\n", &t, &e),
                     KGPU_OK);
    assert_int_equal(t.nodes[0].cpu_milli, 1000);
    assert_int_equal(t.nodes[0].memory_mib, 0);
    assert_int_equal(t.nodes[0].gpus, 2);
    kgpu_trace_free(&t);
    /* Upper limits are inclusive. */
    assert_int_equal(parse_pods(POD11_HEADER "p,1000000000,10000000000,32,1000,,,,,,\n", &t, &e),
                     KGPU_OK);
    assert_int_equal(t.pods[0].cpu_milli, 1000000000LL);
    assert_int_equal(t.pods[0].memory_mib, 10000000000LL);
    assert_int_equal(t.pods[0].num_gpu, 32);
    assert_string_equal(t.pods[0].qos, "");
    kgpu_trace_free(&t);
}

static void test_gpu_rules(void **state)
{
    (void)state;
    kgpu_trace t;
    kgpu_error e;
    assert_int_equal(parse_pods(POD11_HEADER "a,1,1,1,1000,,LS,Running,1,2,3\n"
                                             "b,1,1,1,1400,,LS,Running,1,2,3\n",
                                &t, &e),
                     KGPU_EPARSE);
    assert_string_equal(e.msg, "pods.csv:3: gpu_milli 1400 > 1000");
    assert_zeroed(&t);
    assert_int_equal(parse_pods(POD5_HEADER "a,1,1,2,500\n", &t, &e), KGPU_EPARSE);
    assert_string_equal(e.msg, "pods.csv:2: gpu_milli 500 < 1000 with num_gpu 2");
    pod_row_error("p,1,2,33,1000,,LS,Running,1,2,3", "num_gpu 33 > 32");
    pod_row_error("p,1,2,-1,1000,,LS,Running,1,2,3", "num_gpu -1 < 0");
    pod_row_error("p,1,2,1,-5,,LS,Running,1,2,3", "gpu_milli -5 < 0");
    pod_row_error("p,1,2,0,300,,LS,Running,1,2,3", "gpu_milli 300 with num_gpu 0");
    pod_row_error("p,1,2,1,0,,LS,Running,1,2,3", "gpu_milli 0 with num_gpu 1");
    pod_row_error("p,1,2,8,999,,LS,Running,1,2,3", "gpu_milli 999 < 1000 with num_gpu 8");
    node_error(NODE_HEADER "n0,1,2,2,\n", "nodes.csv:2: ", "model is empty with gpu 2");
    node_error(NODE_HEADER "n0,1,2,1,nan\n", "nodes.csv:2: ", "model is empty with gpu 1");
    node_error(NODE_HEADER "n0,1,2,0,T4\n", "nodes.csv:2: ", "model \"T4\" with gpu 0");
    node_error(NODE_HEADER "n0,1,2,1,"
                           "M1234567890123456789012345678901234567890123456789012345678901234\n",
               "nodes.csv:2: ", "model \"M123");
}

static void test_text_errors(void **state)
{
    (void)state;
    node_error(NODE_HEADER "n0,1,2,0,\n,1,2,0,\n", "nodes.csv:3: ", "sn is empty");
    pod_row_error(",1,2,0,0,,LS,Running,1,2,3", "name is empty");
    pod_row_error("\"p\",1,2,0,0,,LS,Running,1,2,3", "name contains a quote character");
    pod_row_error("p,1,2,1,1000,\"T4\",LS,Running,1,2,3", "gpu_spec contains a quote");
    pod_row_error("p,1,2,1,1000,,LS,Running,1,2,3,\"", "column 12 contains a quote");
    node_error(NODE_HEADER "n0,1,2,1,T4\r\r\n",
               "nodes.csv:2: ", "model contains a carriage return");
    node_error(NODE_HEADER "n0,1,2,1,T4\nn1,1,2,1,T4\n\nn2,1,2,1,T4\n",
               "nodes.csv:4: ", "empty line");
    node_error(NODE_HEADER "n0,1,2,1,T4\n\n\n", "nodes.csv:3: ", "empty line");
    node_error(NODE_HEADER "\n\n", "nodes.csv:2: ", "empty line");
    /* NUL bytes, which strlen-based helpers would hide. */
    static const char nul_node[] = NODE_HEADER "n0,1,2,1,T4\nn\0001,1,2,1,T4\n";
    kgpu_trace t;
    kgpu_error e;
    check_error(kgpu_trace_parse_nodes(nul_node, sizeof(nul_node) - 1, "nodes.csv", &t, &e), &t, &e,
                "nodes.csv:3: ", "sn contains a NUL byte");
    static const char nul_pod[] = POD5_HEADER "p,1,2,1,10\0000\n";
    check_error(kgpu_trace_parse_pods(nul_pod, sizeof(nul_pod) - 1, "pods.csv", &t, &e), &t, &e,
                "pods.csv:2: ", "gpu_milli contains a NUL byte");
    /* Names: at most KGPU_NAME_MAX bytes. */
    char buf[1024], name[KGPU_NAME_MAX + 2];
    memset(name, 'a', sizeof(name));
    name[KGPU_NAME_MAX] = '\0';
    snprintf(buf, sizeof(buf), POD5_HEADER "%s,1,2,0,0\n", name);
    assert_int_equal(parse_pods(buf, &t, &e), KGPU_OK);
    assert_int_equal(strlen(t.pods[0].name), KGPU_NAME_MAX);
    kgpu_trace_free(&t);
    name[KGPU_NAME_MAX] = 'a';
    name[KGPU_NAME_MAX + 1] = '\0';
    snprintf(buf, sizeof(buf), POD5_HEADER "%s,1,2,0,0\n", name);
    pod_error(buf, "pods.csv:2: ", "longer than 254 bytes");
}

static void test_spec_limit(void **state)
{
    (void)state;
    char buf[2048], spec[512] = "";
    for (int i = 0; i < KGPU_TRACE_MAX_SPEC; i++)
        snprintf(spec + strlen(spec), sizeof(spec) - strlen(spec), "%sM%d", i ? "|" : "", i);
    snprintf(buf, sizeof(buf), POD11_HEADER "p,1,2,1,500,%s||,LS,Running,1,2,3\n", spec);
    kgpu_trace t;
    kgpu_error e;
    assert_int_equal(parse_pods(buf, &t, &e), KGPU_OK);
    assert_int_equal(t.pods[0].nspec, KGPU_TRACE_MAX_SPEC);
    assert_string_equal(t.pods[0].spec[0], "M0");
    assert_string_equal(t.pods[0].spec[15], "M15");
    kgpu_trace_free(&t);

    snprintf(buf, sizeof(buf), POD11_HEADER "p,1,2,1,500,%s|M16,LS,Running,1,2,3\n", spec);
    pod_error(buf, "pods.csv:2: ", "gpu_spec \"M0|M1|");
    pod_error(buf, "pods.csv:2: ", "names more than 16 models");

    /* Only bars: no model named, so any model. */
    assert_int_equal(parse_pods(POD11_HEADER "p,1,2,1,500,|,LS,Running,1,2,3\n", &t, &e), KGPU_OK);
    assert_int_equal(t.pods[0].nspec, 0);
    assert_string_equal(t.pods[0].spec_text, "|");
    kgpu_trace_free(&t);
}

static void test_free_zeroed(void **state)
{
    (void)state;
    kgpu_trace t;
    memset(&t, 0, sizeof(t));
    kgpu_trace_free(&t);
    kgpu_trace_free(&t);
    kgpu_trace_free(NULL);
    assert_zeroed(&t);
}

static void test_pod_request(void **state)
{
    (void)state;
    kgpu_trace t;
    kgpu_error e;
    assert_int_equal(parse_pods(POD11_HEADER "share,6000,12288,1,460,T4|P100,LS,Running,1,2,3\n"
                                             "whole,32000,65536,4,1000,,LS,Running,1,2,3\n"
                                             "cpu,8000,30517,0,0,,BE,Running,1,2,3\n",
                                &t, &e),
                     KGPU_OK);
    kgpu_request r;
    memset(&r, 0x77, sizeof(r)); /* stale contents must be cleared */
    kgpu_trace_pod_request(&t.pods[0], &r);
    assert_int_equal(r.cpu_milli, 6000);
    assert_int_equal(r.memory_mib, 12288);
    assert_int_equal(r.gpu_count, 1);
    assert_int_equal(r.gpu_milli, 460);
    assert_false(r.exclusive);
    assert_int_equal(r.gpu_memory_mib, 0);
    assert_ptr_equal(r.allow, t.pods[0].spec);
    assert_int_equal(r.nallow, 2);
    assert_string_equal(r.allow[0], "T4");
    assert_string_equal(r.allow[1], "P100");
    assert_null(r.exclude);
    assert_int_equal(r.nexclude, 0);
    assert_int_equal(r.shape, -1);
    assert_int_equal(r.models, 0);
    assert_int_equal(kgpu_request_validate(&r, &e), KGPU_OK);

    memset(&r, 0x77, sizeof(r));
    kgpu_trace_pod_request(&t.pods[1], &r);
    assert_int_equal(r.cpu_milli, 32000);
    assert_int_equal(r.memory_mib, 65536);
    assert_int_equal(r.gpu_count, 4);
    assert_int_equal(r.gpu_milli, 1000);
    assert_true(r.exclusive);
    assert_int_equal(r.gpu_memory_mib, 0);
    assert_int_equal(r.nallow, 0);
    assert_null(r.exclude);
    assert_int_equal(r.shape, -1);
    assert_int_equal(r.models, 0);
    assert_int_equal(kgpu_request_validate(&r, &e), KGPU_OK);

    memset(&r, 0x77, sizeof(r));
    kgpu_trace_pod_request(&t.pods[2], &r);
    assert_int_equal(r.cpu_milli, 8000);
    assert_int_equal(r.memory_mib, 30517);
    assert_int_equal(r.gpu_count, 0);
    assert_int_equal(r.gpu_milli, 0);
    assert_false(r.exclusive);
    assert_int_equal(r.gpu_memory_mib, 0);
    assert_int_equal(r.nallow, 0);
    assert_int_equal(r.shape, -1);
    assert_int_equal(r.models, 0);
    assert_int_equal(kgpu_request_validate(&r, &e), KGPU_OK);
    kgpu_trace_free(&t);
}

static void test_build_cluster(void **state)
{
    (void)state;
    kgpu_trace t;
    kgpu_error e;
    assert_int_equal(parse_nodes(NODE_HEADER "n0,64000,262144,2,P100\n"
                                             "n1,32000,131072,0,\n"
                                             "n2,96000,393216,8,V100M32\n"
                                             "n3,96000,393216,1,G2\n"
                                             "n4,96000,393216,4,P100\n",
                                 &t, &e),
                     KGPU_OK);
    kgpu_cluster *c = kgpu_cluster_new();
    assert_non_null(c);
    assert_int_equal(kgpu_trace_build_cluster(&t, c, &e), KGPU_OK);
    assert_int_equal(kgpu_cluster_node_count(c), 5);
    assert_int_equal(kgpu_cluster_gpu_count(c), 15);
    assert_int_equal(kgpu_cluster_model_count(c), 3);
    int p100 = kgpu_cluster_model_id(c, "P100", false);
    int v100 = kgpu_cluster_model_id(c, "V100M32", false);
    int g2 = kgpu_cluster_model_id(c, "G2", false);
    assert_true(p100 >= 0 && v100 >= 0 && g2 >= 0);
    assert_true(p100 != v100 && v100 != g2 && p100 != g2);
    assert_string_equal(kgpu_cluster_model_name(c, g2), "G2");

    const kgpu_node *n = kgpu_cluster_node(c, 0);
    assert_string_equal(n->name, "n0");
    assert_int_equal(n->cpu_milli, 64000);
    assert_int_equal(n->memory_mib, 262144);
    assert_int_equal(n->ngpus, 2);
    for (int i = 0; i < 2; i++) {
        char uuid[32];
        snprintf(uuid, sizeof(uuid), "n0-gpu%d", i);
        assert_int_equal(n->gpus[i].index, i);
        assert_string_equal(n->gpus[i].uuid, uuid);
        assert_int_equal(n->gpus[i].model, p100);
        assert_int_equal(n->gpus[i].memory_mib, 16384);
        assert_int_equal(n->gpus[i].numa, -1);
        assert_true(n->gpus[i].healthy);
        assert_int_equal(n->gpus[i].free_milli, KGPU_MILLI);
    }
    n = kgpu_cluster_node(c, 1);
    assert_string_equal(n->name, "n1");
    assert_int_equal(n->ngpus, 0);
    n = kgpu_cluster_node(c, 2);
    assert_int_equal(n->ngpus, 8);
    assert_string_equal(n->gpus[7].uuid, "n2-gpu7");
    assert_int_equal(n->gpus[7].model, v100);
    assert_int_equal(n->gpus[7].memory_mib, 32768);
    n = kgpu_cluster_node(c, 3);
    assert_int_equal(n->gpus[0].model, g2);
    assert_int_equal(n->gpus[0].memory_mib, 16384); /* anonymized: nominal */
    assert_string_equal(n->gpus[0].uuid, "n3-gpu0");
    assert_int_equal(kgpu_cluster_node(c, 4)->gpus[3].model, p100);
    assert_int_equal(kgpu_cluster_find_node(c, "n4"), 4);
    kgpu_cluster_free(c);
    kgpu_trace_free(&t);

    /* Duplicate names pass the parse but not the cluster; the error says where. */
    assert_int_equal(parse_nodes(NODE_HEADER "n0,1,2,1,T4\nn0,1,2,1,T4\n", &t, &e), KGPU_OK);
    c = kgpu_cluster_new();
    assert_non_null(c);
    int rc = kgpu_trace_build_cluster(&t, c, &e);
    assert_true(rc < 0);
    assert_int_equal(e.code, rc);
    assert_true(strncmp(e.msg, "line 3: ", 8) == 0);
    assert_non_null(strstr(e.msg, "n0"));
    kgpu_cluster_free(c);
    kgpu_trace_free(&t);

    /* A name too long for a GPU uuid fails cleanly instead of truncating. */
    char buf[512], name[101];
    memset(name, 'x', 100);
    name[100] = '\0';
    snprintf(buf, sizeof(buf), NODE_HEADER "%s,1,2,1,T4\n", name);
    assert_int_equal(parse_nodes(buf, &t, &e), KGPU_OK);
    c = kgpu_cluster_new();
    assert_non_null(c);
    assert_int_equal(kgpu_trace_build_cluster(&t, c, &e), KGPU_ERANGE);
    assert_non_null(strstr(e.msg, "uuid"));
    kgpu_cluster_free(c);
    kgpu_trace_free(&t);

    /* A pod trace has no nodes: nothing to add. */
    assert_int_equal(parse_pods(POD5_HEADER "p,1,2,0,0\n", &t, &e), KGPU_OK);
    c = kgpu_cluster_new();
    assert_non_null(c);
    assert_int_equal(kgpu_trace_build_cluster(&t, c, &e), KGPU_OK);
    assert_int_equal(kgpu_cluster_node_count(c), 0);
    assert_int_equal(kgpu_trace_build_cluster(NULL, c, &e), KGPU_EINVAL);
    kgpu_cluster_free(c);
    kgpu_trace_free(&t);
}

/* Reads a whole file; NULL if it cannot. Caller frees. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0) {
            buf = malloc((size_t)n + 1);
            if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else if (buf != NULL) {
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

static bool trace_dir_present(void)
{
    struct stat st;
    return stat(KGPU_TRACE_DIR, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Parses one trace file (nodes or pods by its name); fails the test on any error. */
static void parse_trace_file(const char *name, kgpu_trace *t)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", KGPU_TRACE_DIR, name);
    size_t len = 0;
    char *buf = read_file(path, &len);
    if (buf == NULL)
        fail_msg("cannot read %s", path);
    kgpu_error e;
    kgpu_error_clear(&e);
    bool nodes = strstr(name, "node_list") != NULL;
    int rc = nodes ? kgpu_trace_parse_nodes(buf, len, name, t, &e)
                   : kgpu_trace_parse_pods(buf, len, name, t, &e);
    if (rc != KGPU_OK)
        fail_msg("%s: %s", name, e.msg);
    /* Every line but the header is a record. */
    size_t lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += buf[i] == '\n';
    assert_int_equal(nodes ? t->nnodes : t->npods, lines - 1);
    free(buf);
}

static void test_trace_all_files(void **state)
{
    (void)state;
    if (!trace_dir_present())
        skip();
    DIR *d = opendir(KGPU_TRACE_DIR);
    assert_non_null(d);
    int files = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (strncmp(de->d_name, "openb_", 6) != 0 || n < 4 || strcmp(de->d_name + n - 4, ".csv"))
            continue;
        kgpu_trace t;
        parse_trace_file(de->d_name, &t);
        files++;
        kgpu_trace_free(&t);
    }
    closedir(d);
    assert_true(files > 0);
}

static void test_trace_counts(void **state)
{
    (void)state;
    if (!trace_dir_present())
        skip();
    kgpu_trace t;
    kgpu_error e;
    parse_trace_file("openb_node_list_gpu_node.csv", &t);
    assert_int_equal(t.nnodes, 1213);
    assert_int_equal(t.columns, 5);
    int gpus = 0;
    for (size_t i = 0; i < t.nnodes; i++)
        gpus += t.nodes[i].gpus;
    assert_int_equal(gpus, 6212);
    kgpu_cluster *c = kgpu_cluster_new();
    assert_non_null(c);
    if (kgpu_trace_build_cluster(&t, c, &e) != KGPU_OK)
        fail_msg("build_cluster: %s", e.msg);
    assert_int_equal(kgpu_cluster_node_count(c), 1213);
    assert_int_equal(kgpu_cluster_gpu_count(c), 6212);
    kgpu_trace_free(&t);

    parse_trace_file("openb_pod_list_default.csv", &t);
    assert_int_equal(t.npods, 8152);
    assert_int_equal(t.columns, 11);
    /* Every accepted pod is a request the core accepts too. */
    for (size_t i = 0; i < t.npods; i++) {
        kgpu_request r;
        kgpu_trace_pod_request(&t.pods[i], &r);
        if (kgpu_request_compile(c, &r, &e) != KGPU_OK)
            fail_msg("pod %s (line %d): %s", t.pods[i].name, t.pods[i].line, e.msg);
    }
    kgpu_trace_free(&t);
    kgpu_cluster_free(c);

    parse_trace_file("openb_pod_list_multigpu20.csv", &t);
    assert_int_equal(t.npods, 8324);
    assert_int_equal(t.columns, 5);
    kgpu_trace_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nodes_valid),   cmocka_unit_test(test_pods_valid_11),
        cmocka_unit_test(test_pods_valid_5),  cmocka_unit_test(test_line_ends),
        cmocka_unit_test(test_header_errors), cmocka_unit_test(test_column_count),
        cmocka_unit_test(test_number_errors), cmocka_unit_test(test_gpu_rules),
        cmocka_unit_test(test_text_errors),   cmocka_unit_test(test_spec_limit),
        cmocka_unit_test(test_free_zeroed),   cmocka_unit_test(test_pod_request),
        cmocka_unit_test(test_build_cluster), cmocka_unit_test(test_trace_all_files),
        cmocka_unit_test(test_trace_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
