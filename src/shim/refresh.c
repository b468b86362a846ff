/*
 * What the driver reports, brought back into the charges: stream-ordered
 * pools and each device's graph memory are charged what the driver says
 * they reserve, and closed exports free what they kept alive. These only
 * give back (growth is charged where it happens), which is why they sit
 * below kgpu__charge: it calls kgpu__mem_refresh when a reservation would
 * fail, before it refuses.
 */
#include "compat.h"
#include "account.h"

int kgpu__pool_attr(CUmemoryPool pool, int attr, uint64_t *v)
{
    kgpu__pfn_cuMemPoolGetAttribute get = KGPU_REAL(cuMemPoolGetAttribute);
    cuuint64_t x = 0;
    if (get == NULL || pool == NULL || get(pool, attr, &x) != CUDA_SUCCESS)
        return -1;
    *v = x;
    return 0;
}

int kgpu__graph_attr(CUdevice dev, int attr, uint64_t *v)
{
    kgpu__pfn_cuDeviceGetGraphMemAttribute get = KGPU_REAL(cuDeviceGetGraphMemAttribute);
    cuuint64_t x = 0;
    if (get == NULL || get(dev, attr, &x) != CUDA_SUCCESS)
        return -1;
    *v = x;
    return 0;
}

void kgpu__pools_refresh(void)
{
    for (size_t i = 0;; i++) {
        pthread_mutex_lock(&kgpu__shim.pool_mu);
        if (i >= kgpu__shim.npools) {
            pthread_mutex_unlock(&kgpu__shim.pool_mu);
            break;
        }
        struct kgpu_shim_pool e = kgpu__shim.pools[i];
        pthread_mutex_unlock(&kgpu__shim.pool_mu);
        uint64_t reserved;
        if (kgpu__pool_attr(e.pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0 ||
            reserved >= e.charged)
            continue;
        pthread_mutex_lock(&kgpu__shim.pool_mu);
        uint64_t back = 0;
        if (i < kgpu__shim.npools && kgpu__shim.pools[i].pool == e.pool &&
            kgpu__shim.pools[i].charged > reserved) {
            back = kgpu__shim.pools[i].charged - reserved;
            kgpu__shim.pools[i].charged = reserved;
        }
        pthread_mutex_unlock(&kgpu__shim.pool_mu);
        kgpu__uncharge(e.li, back);
    }
}

void kgpu__mem_refresh(void)
{
    kgpu_vmm_freed f = {0};
    if (kgpu_vmm_sweep(&kgpu__shim.vmm, &f) > 0)
        kgpu__uncharge_freed(&f);
    kgpu__pools_refresh();
    for (int li = 0; li < kgpu__shim.limits.ndevices; li++) {
        CUdevice dev = kgpu__cuda_dev(li);
        uint64_t reserved;
        if (dev < 0 ||
            kgpu__graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0)
            continue;
        pthread_mutex_lock(&kgpu__shim.pool_mu);
        uint64_t back = 0;
        if (kgpu__shim.graph_charged[dev] > reserved) {
            back = kgpu__shim.graph_charged[dev] - reserved;
            kgpu__shim.graph_charged[dev] = reserved;
        }
        pthread_mutex_unlock(&kgpu__shim.pool_mu);
        kgpu__uncharge(li, back);
    }
}
