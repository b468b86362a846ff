/*
 * Device IDs of each resource, the ListAndWatch message, and the choice of
 * preferred devices. Pure functions over a contract_inventory.
 *
 * IDs: kgpu.io/gpu-mem and aliyun.com/gpu-mem "<uuid>::<k>" for memory unit
 * k of the GPU, kgpu.io/gpu-core "<uuid>::<k>" for percent k, nvidia.com/gpu
 * the UUID itself. The UUID, not the index, names the GPU: indices change
 * when a GPU is removed, and kubelet keeps device IDs in its checkpoint.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deviceplugin.pb-c.h"
#include "dp.h"

static const char *const res_names[DP_NRES] = {"kgpu.io/gpu-mem", "kgpu.io/gpu-core",
                                               "nvidia.com/gpu", "aliyun.com/gpu-mem"};
static const char *const res_sockets[DP_NRES] = {
    "kgpu-gpu-mem.sock", "kgpu-gpu-core.sock", "kgpu-nvidia-gpu.sock", "kgpu-aliyun-gpu-mem.sock"};

const char *dp_res_name(dp_res r)
{
    return r < DP_NRES ? res_names[r] : "?";
}

const char *dp_res_socket(dp_res r)
{
    return r < DP_NRES ? res_sockets[r] : "?";
}

int dp_res_from_name(const char *name)
{
    for (int r = 0; r < DP_NRES; r++)
        if (strcmp(name, res_names[r]) == 0)
            return r;
    return -1;
}

int64_t dp_devices_per_gpu(const contract_inventory *inv, int g, dp_res r)
{
    switch (r) {
    case DP_RES_MEM:
    case DP_RES_ALIAS:
        return inv->unit_mib > 0 ? inv->gpus[g].memory_mib / inv->unit_mib : 0;
    case DP_RES_CORE:
        return DP_CORE_DEVICES;
    case DP_RES_WHOLE:
        return 1;
    default:
        return 0;
    }
}

void dp_device_id(const contract_inventory *inv, int g, dp_res r, int64_t k, char *buf, size_t cap)
{
    if (r == DP_RES_WHOLE)
        snprintf(buf, cap, "%s", inv->gpus[g].uuid);
    else
        snprintf(buf, cap, "%s::%" PRId64, inv->gpus[g].uuid, k);
}

int dp_device_gpu(const contract_inventory *inv, dp_res r, const char *id)
{
    size_t ulen = strlen(id);
    int64_t k = 0;
    if (r != DP_RES_WHOLE) {
        const char *sep = strstr(id, "::");
        if (sep == NULL || sep[2] == '\0')
            return -1;
        char *end;
        long long v = strtoll(sep + 2, &end, 10);
        if (*end != '\0' || v < 0 || sep[2] == '-' || sep[2] == '+' || (sep[2] == '0' && sep[3]))
            return -1;
        k = v;
        ulen = (size_t)(sep - id);
    }
    for (int g = 0; g < inv->ngpus; g++) {
        const char *u = inv->gpus[g].uuid;
        if (strlen(u) == ulen && memcmp(u, id, ulen) == 0)
            return k < dp_devices_per_gpu(inv, g, r) ? g : -1;
    }
    return -1;
}

int dp_ids_uncovered(const contract_inventory *inv, dp_res r, const char *const *ids, size_t n,
                     const contract_target *t)
{
    bool held[KGPU_MAX_GPUS_PER_NODE] = {false};
    for (size_t i = 0; i < n; i++) {
        int g = dp_device_gpu(inv, r, ids[i]);
        if (g >= 0 && g < KGPU_MAX_GPUS_PER_NODE)
            held[g] = true;
    }
    int missing = 0, first = -1;
    for (int i = 0; i < t->ngpus; i++) {
        int g = contract_inventory_find(inv, t->gpus[i].uuid);
        if (g < 0 || !held[g]) {
            missing++;
            if (first < 0)
                first = i;
        }
    }
    /* Fewer devices than GPUs (a memory unit spread over gpu-count GPUs): some hold none. */
    int allowed = (size_t)t->ngpus > n ? t->ngpus - (int)n : 0;
    return missing > allowed ? first : -1;
}

int dp_list_encode(const contract_inventory *inv, dp_res r, uint8_t **out, size_t *len,
                   kgpu_error *err)
{
    return dp_list_encode_mig(inv, r, NULL, NULL, out, len, err);
}

/* Whether MIG device d is listed: every one under single's nvidia.com/gpu, else its profile's. */
static bool mig_listed(const dp_mig_dev *d, dp_res r, const char *profile)
{
    return profile != NULL ? strcmp(d->profile, profile) == 0 : r == DP_RES_WHOLE;
}

int dp_list_encode_mig(const contract_inventory *inv, dp_res r, const dp_mig_set *mig,
                       const char *profile, uint8_t **out, size_t *len, kgpu_error *err)
{
    *out = NULL;
    *len = 0;
    size_t total = 0;
    int ngpus = profile != NULL ? 0 : inv->ngpus; /* a profile's resource lists no GPU */
    for (int g = 0; g < ngpus; g++)
        total += (size_t)dp_devices_per_gpu(inv, g, r);
    int nmig = mig != NULL ? mig->n : 0;
    total += (size_t)nmig;
    /* One Device per ID: pointers, messages and ID text in three arrays. */
    V1beta1__Device **ptrs = calloc(total + 1, sizeof(*ptrs));
    V1beta1__Device *devs = calloc(total + 1, sizeof(*devs));
    char(*ids)[KGPU_GPU_UUID_MAX + 24] = calloc(total + 1, sizeof(*ids));
    /* One topology per GPU, then one per MIG device (its parent's NUMA node). */
    V1beta1__TopologyInfo topo[KGPU_MAX_GPUS_PER_NODE + DP_MIG_DEVS_MAX];
    V1beta1__NUMANode numa[KGPU_MAX_GPUS_PER_NODE + DP_MIG_DEVS_MAX];
    V1beta1__NUMANode *numa_ptr[KGPU_MAX_GPUS_PER_NODE + DP_MIG_DEVS_MAX];
    int rc = 0;
    if (ptrs == NULL || devs == NULL || ids == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory listing %zu devices", total);
        goto out;
    }
    size_t n = 0;
    for (int g = 0; g < ngpus; g++) {
        const kgpu_gpu_info *gi = &inv->gpus[g];
        v1beta1__topology_info__init(&topo[g]);
        v1beta1__numanode__init(&numa[g]);
        numa[g].id = gi->numa;
        numa_ptr[g] = &numa[g];
        topo[g].n_nodes = 1;
        topo[g].nodes = &numa_ptr[g];
        for (int64_t k = 0; k < dp_devices_per_gpu(inv, g, r); k++, n++) {
            v1beta1__device__init(&devs[n]);
            dp_device_id(inv, g, r, k, ids[n], sizeof(ids[n]));
            devs[n].id = ids[n];
            devs[n].health = gi->healthy ? "Healthy" : "Unhealthy";
            /* Without a NUMA node, kubelet's topology manager must not be told one. */
            devs[n].topology = gi->numa >= 0 ? &topo[g] : NULL;
            ptrs[n] = &devs[n];
        }
    }
    for (int i = 0; i < nmig; i++) {
        const dp_mig_dev *d = &mig->dev[i];
        int t = KGPU_MAX_GPUS_PER_NODE + i;
        if (!mig_listed(d, r, profile))
            continue;
        v1beta1__topology_info__init(&topo[t]);
        v1beta1__numanode__init(&numa[t]);
        numa[t].id = d->numa;
        numa_ptr[t] = &numa[t];
        topo[t].n_nodes = 1;
        topo[t].nodes = &numa_ptr[t];
        v1beta1__device__init(&devs[n]);
        snprintf(ids[n], sizeof(ids[n]), "%s", d->uuid);
        devs[n].id = ids[n];
        devs[n].health = d->healthy ? "Healthy" : "Unhealthy";
        devs[n].topology = d->numa >= 0 ? &topo[t] : NULL;
        ptrs[n] = &devs[n];
        n++;
    }
    V1beta1__ListAndWatchResponse msg = V1BETA1__LIST_AND_WATCH_RESPONSE__INIT;
    msg.n_devices = n;
    msg.devices = ptrs;
    size_t size = v1beta1__list_and_watch_response__get_packed_size(&msg);
    if (size > DP_MAX_LIST_BYTES) {
        /*
         * The smallest unit whose list fits, at this message's bytes per
         * device (IDs only get shorter with fewer units, so it fits).
         */
        double per = (double)size / (double)(n ? n : 1);
        int64_t need = inv->unit_mib + 1, top = 1;
        for (int g = 0; g < inv->ngpus; g++)
            top = inv->gpus[g].memory_mib > top ? inv->gpus[g].memory_mib : top;
        for (; need < top; need++) {
            int64_t devices = 0;
            for (int g = 0; g < inv->ngpus; g++)
                devices += inv->gpus[g].memory_mib / need;
            if ((double)devices * per <= (double)DP_MAX_LIST_BYTES)
                break;
        }
        rc = kgpu_error_set(err, KGPU_ERANGE,
                            "%s: %zu devices make a ListAndWatch message of %zu bytes, over the "
                            "%u-byte limit kgpu keeps (a quarter of kubelet's 4 MiB); use a "
                            "memory unit of at least %" PRId64 " MiB",
                            dp_res_name(r), n, size, DP_MAX_LIST_BYTES, need);
        goto out;
    }
    *out = malloc(size ? size : 1);
    if (*out == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory encoding %zu devices", n);
        goto out;
    }
    *len = v1beta1__list_and_watch_response__pack(&msg, *out);
out:
    free(ptrs);
    free(devs);
    free(ids);
    return rc;
}

int dp_prefer(const contract_inventory *inv, dp_res r, const char *const *avail, int navail,
              const char *const *must, int nmust, int size, const dp_want *want, int *chosen)
{
    int n = 0;
    if (size <= 0)
        return 0;
    char *taken = calloc((size_t)navail + 1, 1);
    int *gpu_of = calloc((size_t)navail + 1, sizeof(int));
    if (taken == NULL || gpu_of == NULL) {
        free(taken);
        free(gpu_of);
        return 0;
    }
    int free_on[KGPU_MAX_GPUS_PER_NODE] = {0};
    for (int i = 0; i < navail; i++) {
        gpu_of[i] = dp_device_gpu(inv, r, avail[i]);
        if (gpu_of[i] >= 0)
            free_on[gpu_of[i]]++;
    }
    /* kubelet requires the must-include IDs in the answer. */
    for (int m = 0; m < nmust && n < size; m++)
        for (int i = 0; i < navail; i++)
            if (!taken[i] && strcmp(avail[i], must[m]) == 0) {
                taken[i] = 1;
                chosen[n++] = i;
                break;
            }
    /* Then the GPUs the extender chose, as many on each as it assigned. */
    for (int w = 0; want != NULL && w < want->n && n < size; w++) {
        int64_t have = 0;
        for (int j = 0; j < n; j++)
            have += gpu_of[chosen[j]] == want->gpu[w];
        for (int i = 0; i < navail && n < size && have < want->count[w]; i++)
            if (!taken[i] && gpu_of[i] == want->gpu[w]) {
                taken[i] = 1;
                chosen[n++] = i;
                have++;
            }
    }
    /* Then the rest of the must-include IDs' GPUs, so a container's devices stay together. */
    for (int m = 0; m < n && n < size; m++) {
        int g = gpu_of[chosen[m]];
        for (int i = 0; g >= 0 && i < navail && n < size; i++)
            if (!taken[i] && gpu_of[i] == g) {
                taken[i] = 1;
                chosen[n++] = i;
            }
    }
    /* Then pack: GPUs with the fewest available devices first. */
    while (n < size) {
        int best = -1;
        for (int i = 0; i < navail; i++) {
            if (taken[i])
                continue;
            if (best < 0)
                best = i;
            else if (gpu_of[i] >= 0 &&
                     (gpu_of[best] < 0 || free_on[gpu_of[i]] < free_on[gpu_of[best]]))
                best = i;
        }
        if (best < 0)
            break;
        /* Take every available device of that GPU in list order before moving on. */
        int g = gpu_of[best];
        for (int i = 0; i < navail && n < size; i++)
            if (!taken[i] && gpu_of[i] == g) {
                taken[i] = 1;
                chosen[n++] = i;
            }
    }
    free(taken);
    free(gpu_of);
    return n;
}
