/*
 * MIG instances through NVML: listing, creating and destroying GPU
 * instances, each with one compute instance of its full size, and reading
 * the GI profiles a GPU offers. The MIG functions are resolved at the first
 * MIG call, so a driver without them still runs everything else; the MIG
 * mode itself is only read (kgpu never changes it).
 *
 * NVML's two kinds of profile numbers: a call that takes a "profile" wants
 * NVML_GPU_INSTANCE_PROFILE_* (0 = one slice), one that takes a "profileId"
 * wants the ID that profile's info reports (19 for one slice on an A100).
 */
#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "nvml_priv.h"

typedef struct nvml_gi_st *nvml_gi;
typedef struct nvml_ci_st *nvml_ci;

/* nvmlGpuInstanceProfileInfo_t */
typedef struct {
    unsigned int id, is_p2p_supported, slice_count, instance_count, multiprocessor_count;
    unsigned int copy_engine_count, decoder_count, encoder_count, jpeg_count, ofa_count;
    unsigned long long memory_size_mb;
} nvml_gi_profile_info;

/* nvmlGpuInstanceProfileInfo_v2_t: a version word first, the profile's name last. */
typedef struct {
    unsigned int version;
    unsigned int id, is_p2p_supported, slice_count, instance_count, multiprocessor_count;
    unsigned int copy_engine_count, decoder_count, encoder_count, jpeg_count, ofa_count;
    unsigned long long memory_size_mb;
    char name[96];
} nvml_gi_profile_info_v2;

/* NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2) */
#define NVML_GI_PROFILE_INFO_V2 ((unsigned int)(sizeof(nvml_gi_profile_info_v2) | 2u << 24))

/* nvmlGpuInstancePlacement_t, nvmlComputeInstancePlacement_t */
typedef struct {
    unsigned int start, size;
} nvml_placement;

/* nvmlGpuInstanceInfo_t */
typedef struct {
    nvml_device device;
    unsigned int id, profile_id;
    nvml_placement placement;
} nvml_gi_info;

/* nvmlComputeInstanceProfileInfo_t */
typedef struct {
    unsigned int id, slice_count, instance_count, multiprocessor_count;
    unsigned int shared_copy_engine_count, shared_decoder_count, shared_encoder_count;
    unsigned int shared_jpeg_count, shared_ofa_count;
} nvml_ci_profile_info;

/* nvmlComputeInstanceInfo_t (the unversioned call fills it without the placement) */
typedef struct {
    nvml_device device;
    nvml_gi gpu_instance;
    unsigned int id, profile_id;
    nvml_placement placement;
} nvml_ci_info;

_Static_assert(sizeof(nvml_gi_profile_info) == 48, "nvmlGpuInstanceProfileInfo_t");
_Static_assert(sizeof(nvml_gi_profile_info_v2) == 152, "nvmlGpuInstanceProfileInfo_v2_t");
_Static_assert(sizeof(nvml_ci_profile_info) == 36, "nvmlComputeInstanceProfileInfo_t");
_Static_assert(offsetof(nvml_gi_info, placement) == sizeof(void *) + 8, "nvmlGpuInstanceInfo_t");
_Static_assert(offsetof(nvml_ci_info, placement) == 2 * sizeof(void *) + 8,
               "nvmlComputeInstanceInfo_t");

enum {
    NVML_MIG_ENABLED = 1,
    /* NVML_GPU_INSTANCE_PROFILE_COUNT in recent drivers: 0..9 plus the GFX/ME variants */
    GI_PROFILES = 17,
    /* NVML_COMPUTE_INSTANCE_PROFILE_* 0..8 (1, 2, 3, 4, 7, 8, 6 slices, 1 rev1, 7 NVL) */
    CI_PROFILES = 9,
    CI_ENGINE_SHARED = 0,
    GI_HANDLES = 32, /* GPU instances of one profile at most (7 fit a GPU) */
    CI_HANDLES = 8,  /* compute instances of one profile in a GI at most */
};

typedef struct {
    nvml_ret (*gi_profile)(nvml_device, unsigned int, nvml_gi_profile_info *);
    nvml_ret (*placements)(nvml_device, unsigned int, nvml_placement *, unsigned int *);
    nvml_ret (*create_gi)(nvml_device, unsigned int, const nvml_placement *, nvml_gi *);
    nvml_ret (*gis)(nvml_device, unsigned int, nvml_gi *, unsigned int *);
    nvml_ret (*gi_info)(nvml_gi, nvml_gi_info *);
    nvml_ret (*ci_profile)(nvml_gi, unsigned int, unsigned int, nvml_ci_profile_info *);
    nvml_ret (*create_ci)(nvml_gi, unsigned int, nvml_ci *);
    nvml_ret (*cis)(nvml_gi, unsigned int, nvml_ci *, unsigned int *);
    nvml_ret (*ci_info)(nvml_ci, nvml_ci_info *);
    nvml_ret (*destroy_ci)(nvml_ci);
    nvml_ret (*destroy_gi)(nvml_gi);
    nvml_ret (*max_mig)(nvml_device, unsigned int *);
    nvml_ret (*mig_by_index)(nvml_device, unsigned int, nvml_device *);
    nvml_ret (*gi_id)(nvml_device, unsigned int *);
    nvml_ret (*ci_id)(nvml_device, unsigned int *);
    /* optional: the profile's name ("MIG 1g.5gb") */
    nvml_ret (*gi_profile_v)(nvml_device, unsigned int, nvml_gi_profile_info_v2 *);
} mig_fns;

/* The MIG functions, resolved once per handle; KGPU_ENOENT naming the first one missing. */
static int fns(kgpu_nvml *nv, const mig_fns **out, kgpu_error *err)
{
    static const struct {
        size_t offset;
        const char *names[3];
    } table[] = {
        {offsetof(mig_fns, gi_profile), {"nvmlDeviceGetGpuInstanceProfileInfo", NULL}},
        {offsetof(mig_fns, placements), {"nvmlDeviceGetGpuInstancePossiblePlacements_v2", NULL}},
        {offsetof(mig_fns, create_gi), {"nvmlDeviceCreateGpuInstanceWithPlacement", NULL}},
        {offsetof(mig_fns, gis), {"nvmlDeviceGetGpuInstances", NULL}},
        {offsetof(mig_fns, gi_info), {"nvmlGpuInstanceGetInfo", NULL}},
        {offsetof(mig_fns, ci_profile), {"nvmlGpuInstanceGetComputeInstanceProfileInfo", NULL}},
        {offsetof(mig_fns, create_ci), {"nvmlGpuInstanceCreateComputeInstance", NULL}},
        {offsetof(mig_fns, cis), {"nvmlGpuInstanceGetComputeInstances", NULL}},
        {offsetof(mig_fns, ci_info),
         {"nvmlComputeInstanceGetInfo_v2", "nvmlComputeInstanceGetInfo", NULL}},
        {offsetof(mig_fns, destroy_ci), {"nvmlComputeInstanceDestroy", NULL}},
        {offsetof(mig_fns, destroy_gi), {"nvmlGpuInstanceDestroy", NULL}},
        {offsetof(mig_fns, max_mig), {"nvmlDeviceGetMaxMigDeviceCount", NULL}},
        {offsetof(mig_fns, mig_by_index), {"nvmlDeviceGetMigDeviceHandleByIndex", NULL}},
        {offsetof(mig_fns, gi_id), {"nvmlDeviceGetGpuInstanceId", NULL}},
        {offsetof(mig_fns, ci_id), {"nvmlDeviceGetComputeInstanceId", NULL}},
    };
    if (nv->mig != NULL) {
        *out = nv->mig;
        return KGPU_OK;
    }
    if (nv->mig_mode == NULL)
        return kgpu_error_set(err, KGPU_ENOENT,
                              "this NVML lacks nvmlDeviceGetMigMode: the driver cannot do MIG");
    mig_fns *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        void *sym = NULL;
        for (const char *const *name = table[i].names; *name != NULL && sym == NULL; name++)
            sym = dlsym(nv->lib, *name);
        if (sym == NULL) {
            free(f);
            return kgpu_error_set(err, KGPU_ENOENT,
                                  "this NVML lacks %s: the driver cannot manage MIG instances",
                                  table[i].names[0]);
        }
        memcpy((char *)f + table[i].offset, &sym, sizeof(sym));
    }
    void *v = dlsym(nv->lib, "nvmlDeviceGetGpuInstanceProfileInfoV");
    if (v != NULL)
        memcpy(&f->gi_profile_v, &v, sizeof(v));
    nv->mig = f;
    *out = f;
    return KGPU_OK;
}

/*
 * A GPU by NVML index, with the MIG functions; with need_on, KGPU_ESTATE
 * when MIG is off there, unless `off` (may be NULL) is given to learn it.
 */
static int mig_gpu(kgpu_nvml *nv, int index, bool need_on, bool *off, const mig_fns **f,
                   nvml_device *dev, kgpu_error *err)
{
    if (index < 0 || index >= nv->ndevices)
        return kgpu_error_set(err, KGPU_EINVAL, "GPU %d: no such NVML index", index);
    int rc = fns(nv, f, err);
    if (rc != KGPU_OK)
        return rc;
    *dev = nv->devices[index];
    if (!need_on)
        return KGPU_OK;
    unsigned int now = 0, pending = 0;
    nvml_ret r = nv->mig_mode(*dev, &now, &pending);
    if (r == NVML_ERR_NOT_SUPPORTED)
        return kgpu_error_set(err, KGPU_ESTATE, "GPU %d does not support MIG", index);
    if (r != NVML_OK)
        return kgpu_error_set(err, KGPU_EIO, "GPU %d: nvmlDeviceGetMigMode: %s", index,
                              nvml_strerror(nv, r));
    if (off != NULL)
        *off = now != NVML_MIG_ENABLED;
    if (now != NVML_MIG_ENABLED && off == NULL)
        return kgpu_error_set(err, KGPU_ESTATE,
                              "GPU %d: MIG mode is off (kgpu does not change it; an "
                              "administrator enables it with nvidia-smi -mig 1)",
                              index);
    return KGPU_OK;
}

/* The UUID of the MIG device of (gi, ci) on dev; "" when NVML lists none. */
static void mig_uuid(kgpu_nvml *nv, const mig_fns *f, nvml_device dev, unsigned gi, unsigned ci,
                     char *uuid, size_t len)
{
    uuid[0] = '\0';
    unsigned int max = 0;
    if (f->max_mig(dev, &max) != NVML_OK)
        return;
    for (unsigned int i = 0; i < max && i < 64; i++) {
        nvml_device m;
        unsigned int g = 0, c = 0;
        if (f->mig_by_index(dev, i, &m) != NVML_OK || f->gi_id(m, &g) != NVML_OK ||
            f->ci_id(m, &c) != NVML_OK || g != gi || c != ci)
            continue;
        char buf[KGPU_GPU_UUID_MAX];
        if (nv->uuid(m, buf, sizeof(buf)) == NVML_OK) {
            buf[sizeof(buf) - 1] = '\0';
            snprintf(uuid, len, "%s", buf);
        }
        return;
    }
}

/* The compute instances of a GI, every profile; *n <= cap. */
static int gi_cis(const mig_fns *f, nvml_gi gi, nvml_ci *out, unsigned cap, unsigned *n)
{
    *n = 0;
    for (unsigned int p = 0; p < CI_PROFILES; p++) {
        nvml_ci_profile_info info;
        memset(&info, 0, sizeof(info));
        if (f->ci_profile(gi, p, CI_ENGINE_SHARED, &info) != NVML_OK)
            continue;
        nvml_ci found[CI_HANDLES];
        unsigned int k = 0;
        if (info.instance_count > CI_HANDLES || f->cis(gi, info.id, found, &k) != NVML_OK)
            continue;
        for (unsigned int i = 0; i < k && i < CI_HANDLES && *n < cap; i++)
            out[(*n)++] = found[i];
    }
    return KGPU_OK;
}

/* Calls fn(gi handle, gi info, profile enum, profile info) for every GI on dev. */
typedef int (*gi_visit)(void *ctx, nvml_gi gi, const nvml_gi_info *info, unsigned int profile,
                        const nvml_gi_profile_info *pinfo);

static int each_gi(kgpu_nvml *nv, const mig_fns *f, nvml_device dev, int index, gi_visit fn,
                   void *ctx, kgpu_error *err)
{
    for (unsigned int p = 0; p < GI_PROFILES; p++) {
        nvml_gi_profile_info pinfo;
        memset(&pinfo, 0, sizeof(pinfo));
        if (f->gi_profile(dev, p, &pinfo) != NVML_OK)
            continue; /* a profile this GPU does not have */
        if (pinfo.instance_count > GI_HANDLES)
            return kgpu_error_set(err, KGPU_ERANGE, "GPU %d: profile %u allows %u instances",
                                  index, p, pinfo.instance_count);
        nvml_gi found[GI_HANDLES];
        unsigned int k = 0;
        nvml_ret r = f->gis(dev, pinfo.id, found, &k);
        if (r != NVML_OK)
            return kgpu_error_set(err, KGPU_EIO, "GPU %d: nvmlDeviceGetGpuInstances(%u): %s",
                                  index, pinfo.id, nvml_strerror(nv, r));
        for (unsigned int i = 0; i < k && i < GI_HANDLES; i++) {
            nvml_gi_info info;
            memset(&info, 0, sizeof(info));
            if ((r = f->gi_info(found[i], &info)) != NVML_OK)
                continue; /* destroyed meanwhile */
            int rc = fn(ctx, found[i], &info, p, &pinfo);
            if (rc != KGPU_OK)
                return rc;
        }
    }
    return KGPU_OK;
}

typedef struct {
    kgpu_nvml *nv;
    const mig_fns *f;
    nvml_device dev;
    int index;
    kgpu_nvml_mig *out;
    int cap, *n;
    kgpu_error *err;
} list_ctx;

static int list_one(void *ctx, nvml_gi gi, const nvml_gi_info *info, unsigned int profile,
                    const nvml_gi_profile_info *pinfo)
{
    list_ctx *c = ctx;
    if (*c->n >= c->cap)
        return kgpu_error_set(c->err, KGPU_ERANGE, "GPU %d: more than %d GPU instances",
                              c->index, c->cap);
    kgpu_nvml_mig *m = &c->out[(*c->n)++];
    memset(m, 0, sizeof(*m));
    m->gpu = c->index;
    m->gi_id = info->id;
    m->ci_id = UINT_MAX;
    m->nvml_profile = (int)profile;
    m->start = (int)info->placement.start;
    m->size = (int)info->placement.size;
    m->memory_mib = (int64_t)pinfo->memory_size_mb;
    nvml_ci cis[CI_HANDLES];
    unsigned int k = 0;
    gi_cis(c->f, gi, cis, CI_HANDLES, &k);
    for (unsigned int i = 0; i < k; i++) {
        nvml_ci_info ci;
        memset(&ci, 0, sizeof(ci));
        if (c->f->ci_info(cis[i], &ci) == NVML_OK && (m->ci_id == UINT_MAX || ci.id < m->ci_id))
            m->ci_id = ci.id;
    }
    if (m->ci_id != UINT_MAX)
        mig_uuid(c->nv, c->f, c->dev, m->gi_id, m->ci_id, m->uuid, sizeof(m->uuid));
    return KGPU_OK;
}

static int by_start(const void *a, const void *b)
{
    const kgpu_nvml_mig *x = a, *y = b;
    return x->start != y->start ? (x->start < y->start ? -1 : 1)
                                : (x->gi_id < y->gi_id ? -1 : x->gi_id > y->gi_id);
}

int kgpu_nvml_mig_list(kgpu_nvml *nv, int index, kgpu_nvml_mig *out, int cap, int *n,
                       kgpu_error *err)
{
    *n = 0;
    const mig_fns *f;
    nvml_device dev;
    int rc = mig_gpu(nv, index, true, NULL, &f, &dev, err);
    if (rc != KGPU_OK)
        return rc;
    list_ctx c = {nv, f, dev, index, out, cap, n, err};
    rc = each_gi(nv, f, dev, index, list_one, &c, err);
    if (rc == KGPU_OK)
        qsort(out, (size_t)*n, sizeof(*out), by_start);
    return rc;
}

/* NVML's answer to creating an instance as a kgpu code: taken slices are KGPU_ENOFIT. */
static int create_code(nvml_ret r)
{
    switch (r) {
    case NVML_ERR_INSUFFICIENT_RESOURCES:
    case NVML_ERR_IN_USE:
        return KGPU_ENOFIT;
    case NVML_ERR_NOT_SUPPORTED:
        return KGPU_ESTATE;
    case NVML_ERR_INVALID_ARGUMENT:
        return KGPU_EINVAL;
    default:
        return KGPU_EIO;
    }
}

/* Destroys a GI's compute instances, then the GI; a GI already gone is success. */
static nvml_ret destroy_gi(const mig_fns *f, nvml_gi gi)
{
    nvml_ci cis[CI_HANDLES];
    unsigned int k = 0;
    gi_cis(f, gi, cis, CI_HANDLES, &k);
    for (unsigned int i = 0; i < k; i++) {
        nvml_ret r = f->destroy_ci(cis[i]);
        if (r != NVML_OK && r != NVML_ERR_INVALID_ARGUMENT && r != NVML_ERR_NOT_FOUND)
            return r;
    }
    nvml_ret r = f->destroy_gi(gi);
    return r == NVML_ERR_INVALID_ARGUMENT || r == NVML_ERR_NOT_FOUND ? NVML_OK : r;
}

int kgpu_nvml_mig_create(kgpu_nvml *nv, int index, int nvml_profile, int start,
                         kgpu_nvml_mig *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    const mig_fns *f;
    nvml_device dev;
    int rc = mig_gpu(nv, index, true, NULL, &f, &dev, err);
    if (rc != KGPU_OK)
        return rc;
    if (nvml_profile < 0 || nvml_profile >= GI_PROFILES)
        return kgpu_error_set(err, KGPU_EINVAL, "GPU %d: no GPU instance profile %d", index,
                              nvml_profile);
    nvml_gi_profile_info pinfo;
    memset(&pinfo, 0, sizeof(pinfo));
    nvml_ret r = f->gi_profile(dev, (unsigned int)nvml_profile, &pinfo);
    if (r != NVML_OK)
        return kgpu_error_set(err, r == NVML_ERR_NOT_SUPPORTED ? KGPU_EINVAL : create_code(r),
                              "GPU %d: GPU instance profile %d: %s", index, nvml_profile,
                              nvml_strerror(nv, r));
    /* The placement's size is NVML's: the possible placement that starts there. */
    nvml_placement pl[KGPU_MIG_STARTS_MAX];
    unsigned int np = KGPU_MIG_STARTS_MAX;
    if ((r = f->placements(dev, pinfo.id, pl, &np)) != NVML_OK)
        return kgpu_error_set(err, KGPU_EIO,
                              "GPU %d: nvmlDeviceGetGpuInstancePossiblePlacements_v2(%u): %s",
                              index, pinfo.id, nvml_strerror(nv, r));
    nvml_placement want = {0, 0};
    for (unsigned int i = 0; i < np && i < KGPU_MIG_STARTS_MAX; i++)
        if (start >= 0 && pl[i].start == (unsigned int)start)
            want = pl[i];
    if (want.size == 0)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "GPU %d: GPU instance profile %d (ID %u) cannot start at memory "
                              "slice %d",
                              index, nvml_profile, pinfo.id, start);
    nvml_gi gi;
    if ((r = f->create_gi(dev, pinfo.id, &want, &gi)) != NVML_OK)
        return kgpu_error_set(err, create_code(r),
                              "GPU %d: cannot create a GPU instance of profile %d (ID %u) at "
                              "memory slices %u-%u: %s",
                              index, nvml_profile, pinfo.id, want.start,
                              want.start + want.size - 1, nvml_strerror(nv, r));
    nvml_gi_info info;
    nvml_ci_profile_info cp;
    nvml_ci_info ciinfo;
    memset(&info, 0, sizeof(info));
    memset(&cp, 0, sizeof(cp));
    memset(&ciinfo, 0, sizeof(ciinfo));
    const char *what = "nvmlGpuInstanceGetInfo";
    r = f->gi_info(gi, &info);
    if (r == NVML_OK) {
        /* The CI that spans the GI: the compute profile with the GI's slice count. */
        what = "no compute instance profile spans the GPU instance";
        r = NVML_ERR_NOT_SUPPORTED;
        for (unsigned int p = 0; p < CI_PROFILES && r != NVML_OK; p++)
            if (f->ci_profile(gi, p, CI_ENGINE_SHARED, &cp) == NVML_OK &&
                cp.slice_count == pinfo.slice_count)
                r = NVML_OK;
    }
    nvml_ci ci = NULL;
    if (r == NVML_OK) {
        what = "nvmlGpuInstanceCreateComputeInstance";
        r = f->create_ci(gi, cp.id, &ci);
    }
    if (r == NVML_OK) {
        what = "nvmlComputeInstanceGetInfo";
        r = f->ci_info(ci, &ciinfo);
    }
    if (r == NVML_OK) {
        mig_uuid(nv, f, dev, info.id, ciinfo.id, out->uuid, sizeof(out->uuid));
        if (out->uuid[0] == '\0') {
            what = "no MIG device lists the new instance";
            r = NVML_ERR_NOT_FOUND;
        }
    }
    if (r != NVML_OK) {
        /* All or nothing: a GPU instance without its compute instance serves no one. */
        nvml_ret d = destroy_gi(f, gi);
        return kgpu_error_set(err, create_code(r),
                              "GPU %d: GPU instance of profile %d (ID %u) at memory slices "
                              "%u-%u: %s: %s; %s",
                              index, nvml_profile, pinfo.id, want.start,
                              want.start + want.size - 1, what, nvml_strerror(nv, r),
                              d == NVML_OK ? "the GPU instance was destroyed again"
                                           : "destroying the GPU instance again failed too");
    }
    out->gpu = index;
    out->gi_id = info.id;
    out->ci_id = ciinfo.id;
    out->nvml_profile = nvml_profile;
    out->start = (int)info.placement.start;
    out->size = (int)info.placement.size;
    out->memory_mib = (int64_t)pinfo.memory_size_mb;
    return KGPU_OK;
}

typedef struct {
    unsigned int id;
    nvml_gi gi;
    bool found;
} find_ctx;

static int find_one(void *ctx, nvml_gi gi, const nvml_gi_info *info, unsigned int profile,
                    const nvml_gi_profile_info *pinfo)
{
    (void)profile;
    (void)pinfo;
    find_ctx *c = ctx;
    if (!c->found && info->id == c->id) {
        c->gi = gi;
        c->found = true;
    }
    return KGPU_OK;
}

int kgpu_nvml_mig_destroy(kgpu_nvml *nv, int index, unsigned gi_id, kgpu_error *err)
{
    const mig_fns *f;
    nvml_device dev;
    bool off = false;
    int rc = mig_gpu(nv, index, true, &off, &f, &dev, err);
    if (rc != KGPU_OK)
        return rc;
    if (off)
        return KGPU_OK; /* MIG off: no instance can exist, so this one is gone */
    find_ctx c = {gi_id, NULL, false};
    if ((rc = each_gi(nv, f, dev, index, find_one, &c, err)) != KGPU_OK)
        return rc;
    if (!c.found)
        return KGPU_OK; /* gone already: destroying is idempotent */
    nvml_ret r = destroy_gi(f, c.gi);
    if (r == NVML_ERR_IN_USE)
        return kgpu_error_set(err, KGPU_ESTATE,
                              "GPU %d: GPU instance %u is in use (processes still run in it)",
                              index, gi_id);
    if (r != NVML_OK)
        return kgpu_error_set(err, KGPU_EIO, "GPU %d: destroying GPU instance %u: %s", index,
                              gi_id, nvml_strerror(nv, r));
    return KGPU_OK;
}

int kgpu_nvml_mig_profiles(kgpu_nvml *nv, int index, kgpu_nvml_mig_profile *out, int cap, int *n,
                           kgpu_error *err)
{
    *n = 0;
    const mig_fns *f;
    nvml_device dev;
    int rc = mig_gpu(nv, index, false, NULL, &f, &dev, err);
    if (rc != KGPU_OK)
        return rc;
    nvml_ret refused = NVML_OK;
    for (unsigned int p = 0; p < GI_PROFILES; p++) {
        nvml_gi_profile_info pinfo;
        memset(&pinfo, 0, sizeof(pinfo));
        nvml_ret r = f->gi_profile(dev, p, &pinfo);
        if (r == NVML_ERR_NOT_SUPPORTED || r == NVML_ERR_INVALID_ARGUMENT) {
            refused = r;
            continue; /* not this GPU's (or readable only in MIG mode) */
        }
        if (r != NVML_OK)
            return kgpu_error_set(err, KGPU_EIO,
                                  "GPU %d: nvmlDeviceGetGpuInstanceProfileInfo(%u): %s", index, p,
                                  nvml_strerror(nv, r));
        if (*n >= cap)
            return kgpu_error_set(err, KGPU_ERANGE, "GPU %d: more than %d GI profiles", index,
                                  cap);
        kgpu_nvml_mig_profile *o = &out[(*n)++];
        memset(o, 0, sizeof(*o));
        o->nvml_profile = (int)p;
        o->id = (int)pinfo.id;
        o->slices = (int)pinfo.slice_count;
        o->instances = (int)pinfo.instance_count;
        o->multiprocessors = (int)pinfo.multiprocessor_count;
        o->memory_mib = (int64_t)pinfo.memory_size_mb;
        nvml_gi_profile_info_v2 v2;
        memset(&v2, 0, sizeof(v2));
        v2.version = NVML_GI_PROFILE_INFO_V2;
        if (f->gi_profile_v != NULL && f->gi_profile_v(dev, p, &v2) == NVML_OK) {
            v2.name[sizeof(v2.name) - 1] = '\0';
            const char *name = strncmp(v2.name, "MIG ", 4) == 0 ? v2.name + 4 : v2.name;
            snprintf(o->name, sizeof(o->name), "%.*s", (int)sizeof(o->name) - 1, name);
        }
        nvml_placement pl[KGPU_MIG_STARTS_MAX];
        unsigned int np = KGPU_MIG_STARTS_MAX;
        if ((r = f->placements(dev, pinfo.id, pl, &np)) != NVML_OK)
            return kgpu_error_set(err, KGPU_EIO,
                                  "GPU %d: nvmlDeviceGetGpuInstancePossiblePlacements_v2(%u): %s",
                                  index, pinfo.id, nvml_strerror(nv, r));
        for (unsigned int i = 0; i < np && i < KGPU_MIG_STARTS_MAX; i++) {
            o->starts[o->nplacements] = (int)pl[i].start;
            o->sizes[o->nplacements++] = (int)pl[i].size;
        }
    }
    if (*n == 0 && refused != NVML_OK)
        return kgpu_error_set(err, KGPU_ESTATE,
                              "GPU %d: nvmlDeviceGetGpuInstanceProfileInfo: %s: profiles "
                              "readable only in MIG mode",
                              index, nvml_strerror(nv, refused));
    return KGPU_OK;
}
