/*
 * What Allocate answers for each container: the container contract's CDI
 * devices, env and mounts (src/contract) on the resource that carries them, and the
 * AllocateResponse that takes them to kubelet.
 */
#include <stdlib.h>
#include <string.h>

#include "deviceplugin.pb-c.h"
#include "dp.h"

void dp_response_of(const dp_match *m, const contract_inventory *inv, const contract_paths *paths,
                    const dp_cdi *cdi, contract_response *out)
{
    if (!m->primary) {
        memset(out, 0, sizeof(*out));
        return;
    }
    contract_response_build(&m->t, inv, paths, out);
    if (cdi != NULL && cdi->kind != NULL)
        contract_cdi_devices(&m->t, cdi->kind, cdi->by_index, out);
}

int dp_allocate_encode(const contract_response *resp, int n, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    V1beta1__ContainerAllocateResponse *cr = calloc((size_t)n + 1, sizeof(*cr));
    V1beta1__ContainerAllocateResponse **crp = calloc((size_t)n + 1, sizeof(*crp));
    V1beta1__ContainerAllocateResponse__EnvsEntry *ev =
        calloc((size_t)n * CONTRACT_MAX_ENV + 1, sizeof(*ev));
    V1beta1__ContainerAllocateResponse__EnvsEntry **evp =
        calloc((size_t)n * CONTRACT_MAX_ENV + 1, sizeof(*evp));
    V1beta1__Mount *mt = calloc((size_t)n * CONTRACT_MAX_MOUNTS + 1, sizeof(*mt));
    V1beta1__Mount **mtp = calloc((size_t)n * CONTRACT_MAX_MOUNTS + 1, sizeof(*mtp));
    V1beta1__CDIDevice *cd = calloc((size_t)n * KGPU_MAX_GPUS_PER_NODE + 1, sizeof(*cd));
    V1beta1__CDIDevice **cdp = calloc((size_t)n * KGPU_MAX_GPUS_PER_NODE + 1, sizeof(*cdp));
    int rc = -1;
    if (cr == NULL || crp == NULL || ev == NULL || evp == NULL || mt == NULL || mtp == NULL ||
        cd == NULL || cdp == NULL)
        goto out;
    for (int i = 0; i < n; i++) {
        const contract_response *r = &resp[i];
        v1beta1__container_allocate_response__init(&cr[i]);
        crp[i] = &cr[i];
        cr[i].envs = &evp[i * CONTRACT_MAX_ENV];
        cr[i].n_envs = (size_t)r->nenv;
        for (int e = 0; e < r->nenv; e++) {
            V1beta1__ContainerAllocateResponse__EnvsEntry *x = &ev[i * CONTRACT_MAX_ENV + e];
            v1beta1__container_allocate_response__envs_entry__init(x);
            x->key = (char *)r->env[e].key;
            x->value = (char *)r->env[e].value;
            evp[i * CONTRACT_MAX_ENV + e] = x;
        }
        cr[i].mounts = &mtp[i * CONTRACT_MAX_MOUNTS];
        cr[i].n_mounts = (size_t)r->nmounts;
        for (int k = 0; k < r->nmounts; k++) {
            V1beta1__Mount *x = &mt[i * CONTRACT_MAX_MOUNTS + k];
            v1beta1__mount__init(x);
            x->container_path = (char *)r->mounts[k].container_path;
            x->host_path = (char *)r->mounts[k].host_path;
            x->read_only = r->mounts[k].read_only;
            mtp[i * CONTRACT_MAX_MOUNTS + k] = x;
        }
        /* ContainerAllocateResponse.cdi_devices (field 5): kubelet passes them to the runtime. */
        cr[i].cdi_devices = &cdp[i * KGPU_MAX_GPUS_PER_NODE];
        cr[i].n_cdi_devices = (size_t)r->ncdi;
        for (int k = 0; k < r->ncdi; k++) {
            V1beta1__CDIDevice *x = &cd[i * KGPU_MAX_GPUS_PER_NODE + k];
            v1beta1__cdidevice__init(x);
            x->name = (char *)r->cdi[k];
            cdp[i * KGPU_MAX_GPUS_PER_NODE + k] = x;
        }
    }
    V1beta1__AllocateResponse msg = V1BETA1__ALLOCATE_RESPONSE__INIT;
    msg.n_container_responses = (size_t)n;
    msg.container_responses = crp;
    size_t size = v1beta1__allocate_response__get_packed_size(&msg);
    *out = malloc(size ? size : 1);
    if (*out != NULL) {
        *len = v1beta1__allocate_response__pack(&msg, *out);
        rc = 0;
    }
out:
    free(cr);
    free(crp);
    free(ev);
    free(evp);
    free(mt);
    free(mtp);
    free(cd);
    free(cdp);
    return rc;
}
