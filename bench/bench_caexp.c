/*
 * bench_caexp: how long kgpu-expander takes to answer one BestOptions call,
 * in process (caexp_best_options: decoding, the real fit, the choice), for
 * requests the size Cluster Autoscaler sends. Cluster Autoscaler waits 5 s
 * for an answer and then keeps its own choice, so that is the budget.
 *
 *   bench_caexp [RUNS]     (default 5; prints the median and the spread)
 *
 * Each size: G node groups (templates of 2, 4 or 8 GPUs of five models),
 * one option per group holding the same P pending pods (whole GPUs and
 * shares of 4 to 20 GiB), N new nodes each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "caexp.h"
#include "unit/caexp_fixture.h"

typedef struct sized {
    int groups, pods, nodes;
} sized;

static uint8_t *pack_node(const char *product, int gpus, int mib, size_t *len)
{
    return caexp_fx_node(product, gpus, mib, "96", "768Gi", NULL, len);
}

static uint8_t *pack_pod(int i, size_t *len)
{
    char name[32], amount[16];
    snprintf(name, sizeof(name), "ci-job-%d", i);
    snprintf(amount, sizeof(amount), "%d", i % 3 == 0 ? 1 : 4 + (i * 7) % 17);
    return caexp_fx_pod(name, "2", i % 3 == 0 ? "nvidia.com/gpu" : "kgpu.io/gpu-mem", amount, len);
}

/* The request for one size; *len its bytes. NULL when out of memory. */
static uint8_t *build(const sized *z, size_t *len)
{
    static const struct {
        const char *product;
        int mib;
    } models[5] = {{"Tesla T4", 15360},
                   {"NVIDIA L4", 23034},
                   {"NVIDIA A10G", 23028},
                   {"NVIDIA A100-SXM4-80GB", 81920},
                   {"NVIDIA H100 80GB HBM3", 81559}};
    static const int gpus[3] = {2, 4, 8};
    int ng = z->groups;
    Kgpu__Caexp__BestOptionsRequest__NodeBytesMapEntry *e = calloc((size_t)ng, sizeof(*e));
    Kgpu__Caexp__BestOptionsRequest__NodeBytesMapEntry **ep = calloc((size_t)ng, sizeof(*ep));
    Kgpu__Caexp__Option *o = calloc((size_t)ng, sizeof(*o));
    Kgpu__Caexp__Option **op = calloc((size_t)ng, sizeof(*op));
    ProtobufCBinaryData *pods = calloc((size_t)z->pods, sizeof(*pods));
    char (*ids)[32] = calloc((size_t)ng, sizeof(*ids));
    uint8_t *out = NULL;
    if (e == NULL || ep == NULL || o == NULL || op == NULL || pods == NULL || ids == NULL)
        goto done;
    for (int i = 0; i < z->pods; i++)
        pods[i].data = pack_pod(i, &pods[i].len);
    for (int g = 0; g < ng; g++) {
        Kgpu__Caexp__BestOptionsRequest__NodeBytesMapEntry x =
            KGPU__CAEXP__BEST_OPTIONS_REQUEST__NODE_BYTES_MAP_ENTRY__INIT;
        snprintf(ids[g], sizeof(ids[g]), "group-%d", g);
        x.key = ids[g];
        x.has_value = true;
        x.value.data = pack_node(models[g % 5].product, gpus[g % 3], models[g % 5].mib,
                                 &x.value.len);
        e[g] = x;
        ep[g] = &e[g];
        Kgpu__Caexp__Option y = KGPU__CAEXP__OPTION__INIT;
        y.nodegroupid = ids[g];
        y.has_nodecount = true;
        y.nodecount = z->nodes;
        y.n_podbytes = (size_t)z->pods;
        y.podbytes = pods;
        o[g] = y;
        op[g] = &o[g];
    }
    Kgpu__Caexp__BestOptionsRequest req = KGPU__CAEXP__BEST_OPTIONS_REQUEST__INIT;
    req.n_nodebytesmap = (size_t)ng;
    req.nodebytesmap = ep;
    req.n_options = (size_t)ng;
    req.options = op;
    *len = kgpu__caexp__best_options_request__get_packed_size(&req);
    out = malloc(*len);
    if (out != NULL)
        kgpu__caexp__best_options_request__pack(&req, out);
done:
    for (int g = 0; e != NULL && g < ng; g++)
        free(e[g].value.data);
    for (int i = 0; pods != NULL && i < z->pods; i++)
        free(pods[i].data);
    free(e);
    free(ep);
    free(o);
    free(op);
    free(pods);
    free(ids);
    return out;
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 5;
    if (runs < 1 || runs > 1000) {
        fprintf(stderr, "usage: bench_caexp [RUNS]\n");
        return 2;
    }
    static const sized sizes[] = {{5, 20, 2}, {20, 200, 10}, {50, 1000, 50}, {100, 2000, 100}};
    static const caexp_config cfg = {.memory_unit_mib = 1024, .pod_gpu_price = 1};
    printf("%-28s %10s %12s %12s %12s %8s %8s\n", "groups x pods x nodes each", "request",
           "median ms", "min ms", "max ms", "placed", "chosen");
    double *t = malloc((size_t)runs * sizeof(*t));
    for (size_t s = 0; t != NULL && s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t len;
        uint8_t *in = build(&sizes[s], &len);
        if (in == NULL) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        caexp_decision d = {0};
        for (int r = 0; r < runs; r++) {
            uint8_t *out;
            size_t outlen;
            kgpu_error err;
            double t0 = bench_now_s();
            int rc = caexp_best_options(&cfg, in, len, &out, &outlen, &d, &err);
            t[r] = (bench_now_s() - t0) * 1000;
            if (rc != 0) {
                fprintf(stderr, "bench_caexp: %s\n", err.msg);
                return 1;
            }
            free(out);
        }
        qsort(t, (size_t)runs, sizeof(*t), bench_cmp_double);
        char label[64];
        snprintf(label, sizeof(label), "%d x %d x %d", sizes[s].groups, sizes[s].pods,
                 sizes[s].nodes);
        printf("%-28s %9.1fK %12.2f %12.2f %12.2f %8d %8s\n", label, len / 1024.0,
               t[runs / 2], t[0], t[runs - 1], d.placed, d.group);
        free(in);
    }
    free(t);
    printf("\nCluster Autoscaler's gRPC expander timeout: 5000 ms.\n");
    return 0;
}
