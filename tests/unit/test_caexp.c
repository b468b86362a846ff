/*
 * Unit tests of kgpu-expander's service (src/expander): Cluster Autoscaler's
 * Node and Pod protobuf bytes read as kgpu reads the JSON objects, the
 * option that really places the pending pods chosen, no option at all when
 * none does (no useless scale-up), spot templates recognised, and bad bytes
 * refused with where they were.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "caexp.h"
#include "unit/caexp_fixture.h"
#include "podspec.h"
#include "pricefile.h"

/* ---- building CA's messages ---- */

typedef struct kv {
    const char *k, *v;
} kv;

/* A template of 16 cores and 64 GiB; extra labels as {key, value} pairs ending in {NULL}. */
static uint8_t *node_bytes(const char *product, int gpus, int mib, const kv *extra, size_t *len)
{
    const char *flat[2 * CAEXP_FX_LABELS + 1] = {NULL};
    size_t n = 0;
    for (; extra != NULL && extra->k != NULL && n + 2 < 2 * CAEXP_FX_LABELS; extra++) {
        flat[n++] = extra->k;
        flat[n++] = extra->v;
    }
    uint8_t *b = caexp_fx_node(product, gpus, mib, "16", "64Gi", flat, len);
    assert_non_null(b);
    return b;
}

/* A pod with one CPU and, given, `resource: amount`. */
static uint8_t *pod_bytes(const char *name, const char *resource, const char *amount, size_t *len)
{
    uint8_t *b = caexp_fx_pod(name, "1", resource, amount, len);
    assert_non_null(b);
    return b;
}

/* A request: groups[i] with its template bytes, options over them with the same pods each. */
typedef struct req_builder {
    Kgpu__Caexp__BestOptionsRequest__NodeBytesMapEntry e[4];
    Kgpu__Caexp__BestOptionsRequest__NodeBytesMapEntry *ep[4];
    Kgpu__Caexp__Option o[4];
    Kgpu__Caexp__Option *op[4];
    ProtobufCBinaryData pods[8];
    uint8_t *owned[16];
    int nowned;
} req_builder;

static uint8_t *pack_request(req_builder *rb, const char *const *groups,
                             uint8_t *const *templates, const size_t *tlens, int ng,
                             const char *const *option_groups, int no, int npods, size_t *len)
{
    for (int i = 0; i < ng; i++) {
        Kgpu__Caexp__BestOptionsRequest__NodeBytesMapEntry e =
            KGPU__CAEXP__BEST_OPTIONS_REQUEST__NODE_BYTES_MAP_ENTRY__INIT;
        e.key = (char *)groups[i];
        e.has_value = true;
        e.value.data = templates[i];
        e.value.len = tlens[i];
        rb->e[i] = e;
        rb->ep[i] = &rb->e[i];
    }
    for (int i = 0; i < no; i++) {
        Kgpu__Caexp__Option o = KGPU__CAEXP__OPTION__INIT;
        o.nodegroupid = (char *)option_groups[i];
        o.has_nodecount = true;
        o.nodecount = 1;
        o.n_podbytes = (size_t)npods;
        o.podbytes = rb->pods;
        rb->o[i] = o;
        rb->op[i] = &rb->o[i];
    }
    Kgpu__Caexp__BestOptionsRequest req = KGPU__CAEXP__BEST_OPTIONS_REQUEST__INIT;
    req.n_nodebytesmap = (size_t)ng;
    req.nodebytesmap = rb->ep;
    req.n_options = (size_t)no;
    req.options = rb->op;
    *len = kgpu__caexp__best_options_request__get_packed_size(&req);
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    kgpu__caexp__best_options_request__pack(&req, b);
    return b;
}

#define CALL_OK(expr)                                                                              \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != 0)                                                                              \
            fail_msg("%s: %d %s", #expr, rc_, err.msg);                                            \
    } while (0)

static const caexp_config cfg = {.memory_unit_mib = 1024, .pod_gpu_price = 1};

/* The answer's option group ids, comma-separated ("" for none). */
static void answer(const uint8_t *out, size_t len, char *ids, size_t n)
{
    Kgpu__Caexp__BestOptionsResponse *r =
        kgpu__caexp__best_options_response__unpack(NULL, len, out);
    assert_non_null(r);
    ids[0] = '\0';
    for (size_t i = 0; i < r->n_options; i++)
        snprintf(ids + strlen(ids), n - strlen(ids), "%s%s", i ? "," : "",
                 r->options[i]->nodegroupid);
    kgpu__caexp__best_options_response__free_unpacked(r, NULL);
}

/* ---- tests ---- */

static void test_node_and_pod_bytes_read_as_json(void **state)
{
    (void)state;
    kv spot[] = {{"karpenter.sh/capacity-type", "spot"}, {NULL, NULL}};
    size_t nl, pl;
    uint8_t *nb = node_bytes("Tesla T4", 2, 15360, spot, &nl);
    uint8_t *pb = pod_bytes("p", "kgpu.io/gpu-mem", "12", &pl);
    kgpu_error err;
    json_t *node = caexp_node_json(nb, nl, &err);
    assert_non_null(node);
    const json_t *labels = json_object_get(json_object_get(node, "metadata"), "labels");
    assert_string_equal(json_string_value(json_object_get(labels, "nvidia.com/gpu.product")),
                        "Tesla T4");
    const json_t *alloc = json_object_get(json_object_get(node, "status"), "allocatable");
    assert_string_equal(json_string_value(json_object_get(alloc, "nvidia.com/gpu")), "2");
    assert_true(caexp_template_spot(node));
    json_t *pod = caexp_pod_json(pb, pl, &err);
    assert_non_null(pod);
    const json_t *c0 = json_array_get(json_object_get(json_object_get(pod, "spec"), "containers"),
                                      0);
    assert_string_equal(json_string_value(json_object_get(c0, "name")), "main");
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_object_get(c0, "resources"), "limits"), "kgpu.io/gpu-mem")),
        "12");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(pod, "metadata"), "namespace")), "ci");
    json_decref(node);
    json_decref(pod);
    /* Not spot without such a label. */
    free(nb);
    nb = node_bytes("Tesla T4", 2, 15360, NULL, &nl);
    node = caexp_node_json(nb, nl, &err);
    assert_false(caexp_template_spot(node));
    json_decref(node);
    free(nb);
    free(pb);
}

/*
 * A 12 GiB share: two 8 GiB GPUs hold 16 GiB by node sums, which is how
 * Cluster Autoscaler's simulation sees it, but no one GPU holds 12. kgpu
 * chooses the group of 15 GiB GPUs, and offers nothing when only the small
 * one is offered.
 */
static void test_share_too_big_for_any_gpu_is_no_scale_up(void **state)
{
    (void)state;
    size_t tl[2], pl, rl, outlen;
    uint8_t *tpl[2] = {node_bytes("Tesla P4", 2, 8192, NULL, &tl[0]),
                       node_bytes("Tesla T4", 2, 15360, NULL, &tl[1])};
    const char *groups[2] = {"p4-pool", "t4-pool"};
    req_builder rb = {0};
    uint8_t *p0 = pod_bytes("ci-0", "kgpu.io/gpu-mem", "12", &pl);
    rb.pods[0] = (ProtobufCBinaryData){.len = pl, .data = p0};
    uint8_t *in = pack_request(&rb, groups, tpl, tl, 2, groups, 2, 1, &rl);
    uint8_t *out;
    caexp_decision d;
    kgpu_error err;
    char ids[256];
    CALL_OK(caexp_best_options(&cfg, in, rl, &out, &outlen, &d, &err));
    answer(out, outlen, ids, sizeof(ids));
    assert_string_equal(ids, "t4-pool");
    assert_int_equal(d.chosen, 1);
    assert_int_equal(d.placed, 1);
    free(out);
    free(in);
    /* Only the P4 group offered: no option, so Cluster Autoscaler adds nothing. */
    const char *p4only[1] = {"p4-pool"};
    in = pack_request(&rb, groups, tpl, tl, 2, p4only, 1, 1, &rl);
    CALL_OK(caexp_best_options(&cfg, in, rl, &out, &outlen, &d, &err));
    answer(out, outlen, ids, sizeof(ids));
    assert_string_equal(ids, "");
    assert_int_equal(d.chosen, -1);
    free(out);
    free(in);
    free(p0);
    free(tpl[0]);
    free(tpl[1]);
}

/* A whole-GPU pod and a CPU-only pod fit either group: the answer is one of them. */
static void test_pods_that_fit_either_group(void **state)
{
    (void)state;
    size_t tl[2], pl0, pl1, rl, outlen;
    uint8_t *tpl[2] = {node_bytes("Tesla P4", 2, 8192, NULL, &tl[0]),
                       node_bytes("Tesla T4", 2, 15360, NULL, &tl[1])};
    const char *groups[2] = {"p4-pool", "t4-pool"};
    req_builder rb = {0};
    uint8_t *p0 = pod_bytes("w", "nvidia.com/gpu", "1", &pl0);
    uint8_t *p1 = pod_bytes("c", NULL, NULL, &pl1);
    rb.pods[0] = (ProtobufCBinaryData){.len = pl0, .data = p0};
    rb.pods[1] = (ProtobufCBinaryData){.len = pl1, .data = p1};
    uint8_t *in = pack_request(&rb, groups, tpl, tl, 2, groups, 2, 2, &rl);
    uint8_t *out;
    caexp_decision d;
    kgpu_error err;
    char ids[256];
    CALL_OK(caexp_best_options(&cfg, in, rl, &out, &outlen, &d, &err));
    answer(out, outlen, ids, sizeof(ids));
    assert_true(strcmp(ids, "p4-pool") == 0 || strcmp(ids, "t4-pool") == 0);
    assert_int_equal(d.placed, 2);
    assert_int_equal(d.offered, 2);
    free(out);
    free(in);
    free(p0);
    free(p1);
    free(tpl[0]);
    free(tpl[1]);
}

static void test_bad_bytes_name_where(void **state)
{
    (void)state;
    uint8_t *out;
    size_t outlen, tl, rl;
    caexp_decision d;
    kgpu_error err;
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    assert_int_equal(caexp_best_options(&cfg, junk, sizeof(junk), &out, &outlen, &d, &err),
                     KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "BestOptionsRequest"));
    /* A pod's bytes that are not a Pod: the option and pod are named. */
    uint8_t *tpl[1] = {node_bytes("Tesla T4", 2, 15360, NULL, &tl)};
    const char *groups[1] = {"t4-pool"};
    req_builder rb = {0};
    rb.pods[0] = (ProtobufCBinaryData){.len = sizeof(junk), .data = (uint8_t *)junk};
    uint8_t *in = pack_request(&rb, groups, tpl, &tl, 1, groups, 1, 1, &rl);
    assert_int_equal(caexp_best_options(&cfg, in, rl, &out, &outlen, &d, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "option 0 (group t4-pool): pod 0: not a v1.Pod"));
    free(in);
    /* A pod asking for a kgpu resource kgpu does not know: refused, as the extender does. */
    size_t pl;
    uint8_t *p0 = pod_bytes("typo", "kgpu.io/gpu-memory", "4", &pl);
    rb.pods[0] = (ProtobufCBinaryData){.len = pl, .data = p0};
    in = pack_request(&rb, groups, tpl, &tl, 1, groups, 1, 1, &rl);
    assert_int_not_equal(caexp_best_options(&cfg, in, rl, &out, &outlen, &d, &err), 0);
    assert_non_null(strstr(err.msg, "kgpu.io/gpu-memory"));
    free(in);
    free(p0);
    free(tpl[0]);
}

/* nodeCount is bounded: a request cannot make kgpu build a million template nodes. */
static void test_node_count_bounded(void **state)
{
    (void)state;
    size_t tl, pl, rl, outlen;
    uint8_t *tpl[1] = {node_bytes("Tesla T4", 2, 15360, NULL, &tl)};
    const char *groups[1] = {"t4-pool"};
    req_builder rb = {0};
    uint8_t *p0 = pod_bytes("w", "nvidia.com/gpu", "1", &pl);
    rb.pods[0] = (ProtobufCBinaryData){.len = pl, .data = p0};
    uint8_t *in = pack_request(&rb, groups, tpl, &tl, 1, groups, 1, 1, &rl);
    /* pack_request asks for one node; ask for too many instead. */
    Kgpu__Caexp__BestOptionsRequest *q = kgpu__caexp__best_options_request__unpack(NULL, rl, in);
    assert_non_null(q);
    q->options[0]->nodecount = CAEXP_MAX_NEW_NODES + 1;
    size_t ql = kgpu__caexp__best_options_request__get_packed_size(q);
    uint8_t *qb = malloc(ql);
    kgpu__caexp__best_options_request__pack(q, qb);
    uint8_t *out = NULL;
    caexp_decision d;
    kgpu_error err;
    assert_int_equal(caexp_best_options(&cfg, qb, ql, &out, &outlen, &d, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "nodeCount 5001 outside 1..5000"));
    assert_null(out);
    kgpu__caexp__best_options_request__free_unpacked(q, NULL);
    free(qb);
    free(in);
    free(p0);
    free(tpl[0]);
}

/* An option for a group with no template is not kgpu's to judge: never chosen. */
static void test_option_without_template(void **state)
{
    (void)state;
    size_t tl, pl, rl, outlen;
    uint8_t *tpl[1] = {node_bytes("Tesla T4", 2, 15360, NULL, &tl)};
    const char *groups[1] = {"t4-pool"};
    const char *unknown[1] = {"mystery-pool"};
    req_builder rb = {0};
    uint8_t *p0 = pod_bytes("w", "nvidia.com/gpu", "1", &pl);
    rb.pods[0] = (ProtobufCBinaryData){.len = pl, .data = p0};
    uint8_t *in = pack_request(&rb, groups, tpl, &tl, 1, unknown, 1, 1, &rl);
    uint8_t *out;
    caexp_decision d;
    kgpu_error err;
    char ids[64];
    CALL_OK(caexp_best_options(&cfg, in, rl, &out, &outlen, &d, &err));
    answer(out, outlen, ids, sizeof(ids));
    assert_string_equal(ids, "");
    free(out);
    free(in);
    free(p0);
    free(tpl[0]);
}


/* ---- prices ---- */

static int prices_of(const char *yaml, kgpu_prices *p, kgpu_error *err)
{
    return kgpu_prices_load(yaml, strlen(yaml), "prices.yaml", p, err);
}

static const char prices_yaml[] = "prices:\n"
                                   "  currency: EUR\n"
                                   "  gpu:\n"
                                   "    Tesla T4: {onDemand: 0.5, spot: 0.2}\n"
                                   "    Tesla P4: {onDemand: 0.4, spot: 0.15}\n"
                                   "  cpuCore: {onDemand: 0.01, spot: 0.005}\n";

/* A node's price (kgpu_prices_node), the template read as the service reads it. */
static double template_price(const kgpu_prices *p, const char *product, int gpus, int mib,
                             bool spot)
{
    size_t nl;
    kgpu_error err;
    uint8_t *nb = node_bytes(product, gpus, mib, NULL, &nl);
    json_t *node = caexp_node_json(nb, nl, &err);
    kgpu_node_spec spec;
    kgpu_node_store store;
    assert_int_equal(kgpu_node_from_json(node, &spec, &store, &err), 0);
    kgpu_cluster *c = kgpu_cluster_new();
    assert_int_equal(kgpu_cluster_add_node(c, &spec, &err), 0);
    double price = kgpu_prices_node(p, c, kgpu_cluster_node(c, 0), spot);
    kgpu_cluster_free(c);
    json_decref(node);
    free(nb);
    return price;
}

/* A template's price: its GPUs at their model's price and its cores at cpuCore's. */
static void test_node_price(void **state)
{
    (void)state;
    kgpu_prices p;
    kgpu_error err;
    assert_int_equal(prices_of(prices_yaml, &p, &err), 0);
    /* 2 x 0.5 + 16 cores x 0.01; spot: 2 x 0.2 + 16 x 0.005. */
    assert_float_equal(template_price(&p, "Tesla T4", 2, 15360, false), 1.16, 1e-9);
    assert_float_equal(template_price(&p, "Tesla T4", 2, 15360, true), 0.48, 1e-9);
    /* A model with no price: -1, for the caller to decide. */
    assert_true(template_price(&p, "NVIDIA L4", 1, 24576, false) < 0);
}

/*
 * Both groups place the pod: the cheaper per worth wins, spot when its
 * template says spot (the pods in the option tolerate it: CA put them
 * there by the group's taints), and a group without a price comes after
 * every priced one.
 */
static void test_price_decides_among_groups_that_fit(void **state)
{
    (void)state;
    kgpu_prices p;
    kgpu_error err;
    assert_int_equal(prices_of(prices_yaml, &p, &err), 0);
    caexp_config pc = cfg;
    pc.prices = &p;
    kv spot[] = {{"cloud.google.com/gke-spot", "true"}, {NULL, NULL}};
    size_t tl[3], pl, rl, outlen;
    uint8_t *tpl[3] = {node_bytes("Tesla T4", 2, 15360, NULL, &tl[0]),
                       node_bytes("Tesla T4", 2, 15360, spot, &tl[1]),
                       node_bytes("NVIDIA L4", 2, 24576, NULL, &tl[2])};
    const char *groups[3] = {"t4", "t4-spot", "l4"};
    req_builder rb = {0};
    uint8_t *p0 = pod_bytes("w", "nvidia.com/gpu", "1", &pl);
    rb.pods[0] = (ProtobufCBinaryData){.len = pl, .data = p0};
    uint8_t *out;
    caexp_decision d;
    char ids[256];
    uint8_t *in = pack_request(&rb, groups, tpl, tl, 3, groups, 3, 1, &rl);
    CALL_OK(caexp_best_options(&pc, in, rl, &out, &outlen, &d, &err));
    answer(out, outlen, ids, sizeof(ids));
    assert_string_equal(ids, "t4-spot");
    free(out);
    free(in);
    /* Without spot: on-demand T4 (1.16/h) before the unpriced L4 (priced as the dearest). */
    const char *no_spot[2] = {"l4", "t4"};
    in = pack_request(&rb, groups, tpl, tl, 3, no_spot, 2, 1, &rl);
    CALL_OK(caexp_best_options(&pc, in, rl, &out, &outlen, &d, &err));
    answer(out, outlen, ids, sizeof(ids));
    assert_string_equal(ids, "t4");
    free(out);
    free(in);
    free(p0);
    for (int i = 0; i < 3; i++)
        free(tpl[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_and_pod_bytes_read_as_json),
        cmocka_unit_test(test_share_too_big_for_any_gpu_is_no_scale_up),
        cmocka_unit_test(test_pods_that_fit_either_group),
        cmocka_unit_test(test_bad_bytes_name_where),
        cmocka_unit_test(test_option_without_template),
        cmocka_unit_test(test_node_count_bounded),
        cmocka_unit_test(test_node_price),
        cmocka_unit_test(test_price_decides_among_groups_that_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
