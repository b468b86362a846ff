/*
 * MIG geometry (include/kgpu/mig.h): the profile tables and where to place.
 *
 * The tables are facts from NVIDIA's MIG user guide ("Supported MIG
 * Profiles") and NVML's documented enums: each profile's compute and memory
 * slices and allowed start slots, and memorySizeMB and multiprocessor
 * counts as nvidia-smi -lgip prints them. A100-40GB is the guide's worked
 * table; A100-80GB, H100-80GB and H200-141GB have the same placements with
 * their own sizes. scripts/mig-check.sh compares them with a real GPU's NVML.
 */
#include <string.h>

#include "kgpu/mig.h"

/* NVML_GPU_INSTANCE_PROFILE_* */
enum { P1 = 0, P2 = 1, P3 = 2, P4 = 3, P7 = 4, P1ME = 7, P1X2 = 9 };

#define ALL7 7, {0, 1, 2, 3, 4, 5, 6}
#define EVEN4 4, {0, 2, 4, 6}
#define EVEN3 3, {0, 2, 4}
#define HALF 2, {0, 4}
#define ZERO 1, {0}

/* name, nvml, id, compute, size, MiB, SMs, instances, media, starts */
#define TABLE(n1, n1x2, n2, n3, n4, n7, m1, m1x2, m3, m7, s1, s1x2, s2, s3, s4, s7)               \
    7, {                                                                                        \
        {n1, P1, 19, 1, 1, m1, s1, 7, false, ALL7},                                             \
        {n1 "+me", P1ME, 20, 1, 1, m1, s1, 1, true, ALL7},                                      \
        {n1x2, P1X2, 15, 1, 2, m1x2, s1x2, 4, false, EVEN4},                                    \
        {n2, P2, 14, 2, 2, m1x2, s2, 3, false, EVEN3},                                          \
        {n3, P3, 9, 3, 4, m3, s3, 2, false, HALF},                                              \
        {n4, P4, 5, 4, 4, m3, s4, 1, false, ZERO},                                              \
        {n7, P7, 0, 7, 8, m7, s7, 1, false, ZERO},                                              \
    }

static const kgpu_mig_model MODELS[] = {
    {"A100-40GB", "A100", 38000, 42000,
     TABLE("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", 4864, 9856, 19968,
           40192, 14, 14, 28, 42, 56, 98)},
    {"A100-80GB", "A100", 78000, 82500,
     TABLE("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", 9728, 19968, 40192,
           80896, 14, 14, 28, 42, 56, 98)},
    {"H100-80GB", "H100", 78000, 82500,
     TABLE("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", 9984, 20096, 40448,
           81152, 16, 26, 32, 60, 64, 132)},
    {"H200-141GB", "H200", 138000, 146000,
     TABLE("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", 18432, 35840,
           72704, 144384, 16, 26, 32, 60, 64, 132)},
};

#define NMODELS ((int)(sizeof(MODELS) / sizeof(MODELS[0])))

int kgpu_mig_model_count(void)
{
    return NMODELS;
}

const kgpu_mig_model *kgpu_mig_model_at(int i)
{
    return i >= 0 && i < NMODELS ? &MODELS[i] : NULL;
}

const kgpu_mig_model *kgpu_mig_model_find(const char *gpu_name, int64_t memory_mib)
{
    if (gpu_name == NULL)
        return NULL;
    for (int i = 0; i < NMODELS; i++)
        if (strstr(gpu_name, MODELS[i].family) != NULL && memory_mib >= MODELS[i].min_mib &&
            memory_mib <= MODELS[i].max_mib)
            return &MODELS[i];
    return NULL;
}

const kgpu_mig_model *kgpu_mig_model_named(const char *name)
{
    for (int i = 0; name != NULL && i < NMODELS; i++)
        if (strcmp(MODELS[i].name, name) == 0)
            return &MODELS[i];
    return NULL;
}

const kgpu_mig_profile *kgpu_mig_profile_find(const kgpu_mig_model *m, const char *name)
{
    for (int i = 0; m != NULL && name != NULL && i < m->nprofiles; i++)
        if (strcmp(m->profiles[i].name, name) == 0)
            return &m->profiles[i];
    return NULL;
}

const kgpu_mig_profile *kgpu_mig_profile_fit(const kgpu_mig_model *m, int compute,
                                             int64_t memory_mib)
{
    /* Smallest first in the table, so the first that fits is the smallest. */
    for (int i = 0; m != NULL && i < m->nprofiles; i++) {
        const kgpu_mig_profile *p = &m->profiles[i];
        if (!p->media && p->compute >= compute && p->memory_mib >= memory_mib)
            return p;
    }
    return NULL;
}

const kgpu_mig_profile *kgpu_mig_profile_whole(const kgpu_mig_model *m)
{
    return m != NULL && m->nprofiles > 0 ? &m->profiles[m->nprofiles - 1] : NULL;
}

uint8_t kgpu_mig_mask(int start, int size)
{
    if (start < 0 || size <= 0 || start + size > KGPU_MIG_MEM_SLICES)
        return 0;
    return (uint8_t)(((1u << size) - 1u) << start);
}

static bool allowed(const kgpu_mig_profile *p, int start)
{
    for (int i = 0; i < p->nstarts; i++)
        if (p->starts[i] == start)
            return true;
    return false;
}

bool kgpu_mig_fits(const kgpu_mig_model *m, const kgpu_mig_gpu *g, int pi, int start)
{
    if (m == NULL || pi < 0 || pi >= m->nprofiles)
        return false;
    const kgpu_mig_profile *p = &m->profiles[pi];
    if (!allowed(p, start))
        return false;
    uint8_t mask = kgpu_mig_mask(start, p->size);
    return mask != 0 && (g->mem & mask) == 0 &&
           g->compute + p->compute <= KGPU_MIG_COMPUTE_SLICES && g->count[pi] < p->instances &&
           !(p->media && g->media > 0);
}

void kgpu_mig_take(const kgpu_mig_model *m, kgpu_mig_gpu *g, int pi, int start)
{
    const kgpu_mig_profile *p = &m->profiles[pi];
    g->mem |= kgpu_mig_mask(start, p->size);
    g->compute += p->compute;
    g->count[pi]++;
    g->media += p->media ? 1 : 0;
}

void kgpu_mig_give(const kgpu_mig_model *m, kgpu_mig_gpu *g, int pi, int start)
{
    const kgpu_mig_profile *p = &m->profiles[pi];
    g->mem &= (uint8_t)~kgpu_mig_mask(start, p->size);
    g->compute -= p->compute;
    g->count[pi]--;
    g->media -= p->media ? 1 : 0;
}

int kgpu_mig_room(const kgpu_mig_model *m, const kgpu_mig_gpu *g)
{
    int room = 0;
    for (int pi = 0; pi < m->nprofiles; pi++) {
        const kgpu_mig_profile *p = &m->profiles[pi];
        if (p->media)
            continue;
        for (int s = 0; s < p->nstarts; s++)
            if (kgpu_mig_fits(m, g, pi, p->starts[s]))
                room += p->compute;
    }
    return room;
}

int kgpu_mig_choose(const kgpu_mig_model *m, const kgpu_mig_gpu *g, int pi, int *room_after)
{
    if (m == NULL || pi < 0 || pi >= m->nprofiles)
        return -1;
    const kgpu_mig_profile *p = &m->profiles[pi];
    int best = -1, best_room = -1;
    for (int s = p->nstarts - 1; s >= 0; s--) {
        int start = p->starts[s];
        if (!kgpu_mig_fits(m, g, pi, start))
            continue;
        kgpu_mig_gpu t = *g;
        kgpu_mig_take(m, &t, pi, start);
        int room = kgpu_mig_room(m, &t);
        if (room > best_room) { /* starts go downwards: ties keep the higher */
            best = start;
            best_room = room;
        }
    }
    if (room_after != NULL)
        *room_after = best_room;
    return best;
}

int kgpu_mig_first_fit(const kgpu_mig_model *m, const kgpu_mig_gpu *g, int pi)
{
    if (m == NULL || pi < 0 || pi >= m->nprofiles)
        return -1;
    const kgpu_mig_profile *p = &m->profiles[pi];
    for (int s = 0; s < p->nstarts; s++)
        if (kgpu_mig_fits(m, g, pi, p->starts[s]))
            return p->starts[s];
    return -1;
}

int kgpu_mig_slice_order(const kgpu_mig_model *m, int pi, int out[KGPU_MIG_MAX_STARTS])
{
    if (m == NULL || pi < 0 || pi >= m->nprofiles)
        return 0;
    const kgpu_mig_profile *p = &m->profiles[pi];
    kgpu_mig_gpu g;
    memset(&g, 0, sizeof(g));
    int n = 0;
    bool listed[KGPU_MIG_MEM_SLICES] = {false};
    for (int start; n < p->nstarts && (start = kgpu_mig_choose(m, &g, pi, NULL)) >= 0;) {
        out[n++] = start;
        listed[start] = true;
        kgpu_mig_take(m, &g, pi, start);
    }
    /* Starts the profile cannot fill at once (instance limits): highest first. */
    for (int s = p->nstarts - 1; s >= 0; s--)
        if (!listed[p->starts[s]])
            out[n++] = p->starts[s];
    return n;
}

int kgpu_mig_stranded(const kgpu_mig_model *m, const kgpu_mig_gpu *g)
{
    for (int pi = 0; pi < m->nprofiles; pi++)
        if (!m->profiles[pi].media && kgpu_mig_first_fit(m, g, pi) >= 0)
            return 0;
    return KGPU_MIG_COMPUTE_SLICES - g->compute;
}

int64_t kgpu_mig_cost(const kgpu_mig_model *m, const kgpu_mig_gpu *g, int pi, int start)
{
    if (!kgpu_mig_fits(m, g, pi, start))
        return -1;
    kgpu_mig_gpu after = *g;
    kgpu_mig_take(m, &after, pi, start);
    int64_t lost = kgpu_mig_room(m, g) - kgpu_mig_room(m, &after);
    return lost * KGPU_MIG_STRANDED_SCALE + kgpu_mig_stranded(m, &after);
}

int kgpu_mig_slice_first(const kgpu_mig_model *m, const kgpu_mig_gpu *g, int pi, const int *order,
                         int n)
{
    for (int i = 0; i < n; i++)
        if (kgpu_mig_fits(m, g, pi, order[i]))
            return order[i];
    return -1;
}
