/*
 * The extender's cluster state, its life cycle and the sink through which
 * sources put what they read into it (sink.c). See state.h for the files
 * that make up the layer; every function but the sink's expects st->mu held.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "state_impl.h"




int ext_state_init(ext_state *st, const ext_config *cfg, ext_metrics *m, kgpu_error *err)
{
    memset(st, 0, sizeof(*st));
    st->cfg = cfg;
    st->metrics = m;
    pthread_mutex_init(&st->mu, NULL);
    kgpu_strmap_init(&st->shapes);
    kgpu_strmap_init(&st->pods);
    kgpu_strmap_init(&st->orphans);
    kgpu_strmap_init(&st->cpu_pods);
    kgpu_strmap_init(&st->pending);
    kgpu_strmap_init(&st->awaiting);
    kgpu_strmap_init(&st->usage);
    kgpu_strmap_init(&st->spot_nodes);
    kgpu_strmap_init(&st->observed);
    kgpu_strmap_init(&st->ns_queue);
    kgpu_strmap_init(&st->reclaims);
    kgpu_strmap_init(&st->refused);
    kgpu_strmap_init(&st->unsched);
    kgpu_strmap_init(&st->unsched_ns);
    st->sweep_slice_s = EXT_SWEEP_SLICE_MS / 1000.0;
    kgpu_strmap_init(&st->dra_nodes);
    kgpu_strmap_init(&st->leaving);
    kgpu_strmap_init(&st->guard_marked);
    kgpu_strmap_init(&st->emptying);
    kgpu_strmap_init(&st->dra_slices);
    kgpu_strmap_init(&st->dra_parts);
    kgpu_strmap_init(&st->dra_claims);
    kgpu_strmap_init(&st->pod_qlabels);
    st->observed_order = calloc(OBSERVED_MAX, sizeof(char *));
    st->cluster = kgpu_cluster_new();
    if (st->cluster == NULL || st->observed_order == NULL || ext__set_prior(st) != 0) {
        ext_state_destroy(st);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    kgpu_rng_seed(&st->rng, (uint64_t)time(NULL), 7);
    st->usage_at = ext_now();
    return 0;
}

void ext_state_destroy(ext_state *st)
{
    ext__free_policies(st);
    kgpu_cluster_free(st->cluster);
    kgpu_workload_free(&st->target);
    const char *k;
    void *v;
    size_t i = 0;
    while (kgpu_strmap_next(&st->pods, &i, &k, &v))
        free(v);
    i = 0;
    while (kgpu_strmap_next(&st->pending, &i, &k, &v))
        free(v);
    i = 0;
    while (kgpu_strmap_next(&st->usage, &i, &k, &v))
        free(v);
    i = 0;
    while (kgpu_strmap_next(&st->orphans, &i, &k, &v))
        free(v);
    i = 0;
    while (kgpu_strmap_next(&st->awaiting, &i, &k, &v))
        free(v);
    i = 0;
    while (kgpu_strmap_next(&st->cpu_pods, &i, &k, &v))
        free(v);
    kgpu_strmap *owning[] = {&st->ns_queue,  &st->reclaims,   &st->refused,
                             &st->dra_nodes, &st->dra_slices, &st->dra_parts, &st->dra_claims,
                             &st->pod_qlabels, &st->leaving, &st->emptying};
    for (size_t m = 0; m < sizeof(owning) / sizeof(owning[0]); m++)
        kgpu_strmap_clear_free(owning[m]);
    ext_unsched_clear(st);
    kgpu_strmap_clear(&st->unsched_ns);
    ext_gpuless_free_all(st);
    kgpu_queues_free(st->queues);
    kgpu_queues_free(st->queues_spec);
    json_decref(st->gpuqueues);
    free(st->queue_evictions);
    kgpu_strmap_clear(&st->guard_marked);
    kgpu_strmap_clear(&st->cpu_pods);
    kgpu_strmap_clear(&st->awaiting);
    kgpu_strmap_clear(&st->orphans);
    kgpu_strmap_clear(&st->pods);
    kgpu_strmap_clear(&st->pending);
    kgpu_strmap_clear(&st->usage);
    kgpu_strmap_clear(&st->spot_nodes);
    kgpu_strmap_clear(&st->shapes);
    kgpu_strmap_clear(&st->observed);
    for (int j = 0; st->observed_order != NULL && j < OBSERVED_MAX; j++)
        free(st->observed_order[j]);
    free(st->observed_order);
    free(st->shape_info);
    pthread_mutex_destroy(&st->mu);
    memset(st, 0, sizeof(*st));
}
