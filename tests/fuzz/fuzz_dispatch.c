/*
 * Fuzz target for the many-cluster readers of outside input
 * (src/dispatcher/pick.c, src/common/clusterfile.c, src/common/nodegroups.c):
 * the first byte chooses a Workload (a tenant's), an estimate's answer
 * (another cluster's), benchmark figures, the static table, the clusters
 * file or the extender's node groups file.
 * Whatever comes in: an answer or an error, bounded fields, nothing read
 * past its end.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "clusterfile.h"
#include "nodegroups.h"
#include "pick.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    kgpu_error err;
    switch (data[0] % 6) {
    case 0: {
        json_t *wl = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
        json_t *checks = json_pack("{s:b}", "mk", 1);
        dsp_workload w;
        if (wl != NULL && dsp_workload_read(wl, checks, &w, &err) == 0) {
            if (w.count < 1 || w.count > 1024 || w.nprefs > DSP_PREFS_MAX || w.pod == NULL ||
                w.nnominated > DSP_NOMINATED_MAX)
                abort();
            (void)dsp_pref_rank(&w, "NVIDIA A100-SXM4-80GB");
            char *body = dsp_estimate_body(&w, NULL);
            free(body);
            json_t *apply = dsp_nomination_apply(wl, DSP_KUEUE_MANAGER, "worker-a", &err);
            if (apply != NULL &&
                !json_is_array(json_object_get(json_object_get(apply, "status"),
                                               "nominatedClusterNames")))
                abort();
            json_decref(apply);
        }
        json_decref(checks);
        json_decref(wl);
        break;
    }
    case 1: {
        dsp_answer a;
        if (dsp_answer_read(text, len, &a, &err) == 0 && (a.fit < 0 || a.nmodels > 16))
            abort();
        break;
    }
    case 2: {
        dsp_bench *b = dsp_bench_parse(text, len, "fuzz", &err);
        if (b != NULL && dsp_bench_get(b, "w", "T4", "c") < 0)
            abort();
        dsp_bench_free(b);
        break;
    }
    case 3: {
        dsp_table *t = dsp_table_parse(text, len, "fuzz", &err);
        dsp_workload w;
        memset(&w, 0, sizeof(w));
        strcpy(w.key, "gan");
        dsp_table_apply(t, &w);
        if (w.nprefs > DSP_PREFS_MAX)
            abort();
        dsp_table_free(t);
        break;
    }
    case 5: {
        kgpu_node_groups *g = malloc(sizeof(*g));
        if (g != NULL && kgpu_node_groups_load(text, len, "fuzz", g, &err) == 0)
            for (int i = 0; i < g->n; i++)
                if (g->v[i].gpu_count < 1 || g->v[i].gpu_count > KGPU_MAX_GPUS_PER_NODE ||
                    g->v[i].nlabels < 1 || g->v[i].max_nodes < 0)
                    abort();
        free(g);
        break;
    }
    default: {
        kgpu_clusters *c = malloc(sizeof(*c));
        if (c != NULL && kgpu_clusters_load(text, len, "fuzz", c, &err) == 0 &&
            (c->n < 1 || c->n > KGPU_CLUSTERS_MAX))
            abort();
        free(c);
        break;
    }
    }
    return 0;
}
