/*
 * NVIDIA MIG (Multi-Instance GPU) geometry: the profile tables of the
 * MIG-capable GPUs kgpu knows, which placements of a profile are free on a
 * GPU, and where to put a new instance so that the profiles asked for later
 * keep fitting. Pure computation: no I/O, no globals but constant tables.
 *
 * The model, as NVML documents it: a GPU has 8 memory slices and 7 compute
 * slices. A GPU instance profile ("3g.20gb") takes `compute` compute slices
 * and a run of `size` memory slices starting at one of its allowed start
 * slots (nvmlDeviceGetGpuInstancePossiblePlacements_v2: {start, size}). Two
 * instances may not share a memory slice, and the compute slices in use may
 * not exceed 7. The whole GPU (7g) takes all 8 memory slices.
 *
 * Thread safety: the tables are constant; a kgpu_mig_gpu is owned by its caller.
 */
#ifndef KGPU_MIG_H
#define KGPU_MIG_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KGPU_MIG_MEM_SLICES     8
#define KGPU_MIG_COMPUTE_SLICES 7
#define KGPU_MIG_MAX_PROFILES   8
#define KGPU_MIG_MAX_STARTS     8
#define KGPU_MIG_NAME_MAX       24 /* "7g.141gb+me" and room */

typedef struct kgpu_mig_profile {
    char name[KGPU_MIG_NAME_MAX]; /* "1g.5gb": what nvidia-smi and the NVIDIA plugins call it */
    int nvml_profile;             /* NVML_GPU_INSTANCE_PROFILE_* (0 = 1 slice, 9 = 1 slice rev2) */
    int id;                       /* the profile ID nvidia-smi prints (19, 15, 14, 9, 5, 0, 20) */
    int compute;                  /* compute slices: the "Ng" */
    int size;                     /* memory slices: the placement's size */
    int64_t memory_mib;           /* memorySizeMB as NVML reports it */
    int multiprocessors;
    int instances;                /* at most this many on one GPU */
    bool media;                   /* a "+me" profile (media extensions) */
    int nstarts;
    int starts[KGPU_MIG_MAX_STARTS]; /* allowed start slots, ascending (NVML's order) */
} kgpu_mig_profile;

typedef struct kgpu_mig_model {
    const char *name;            /* "A100-40GB" */
    const char *family;          /* a word NVML's device name holds: "A100", "H100", "H200" */
    int64_t min_mib, max_mib;    /* the total memory NVML reports lies in [min, max] */
    int nprofiles;
    kgpu_mig_profile profiles[KGPU_MIG_MAX_PROFILES]; /* smallest first */
} kgpu_mig_model;

/* The known models: A100-40GB, A100-80GB, H100-80GB, H200-141GB. */
int kgpu_mig_model_count(void);
const kgpu_mig_model *kgpu_mig_model_at(int i);
/* The model of a GPU by NVML's name ("NVIDIA A100-SXM4-40GB") and total memory; NULL if none. */
const kgpu_mig_model *kgpu_mig_model_find(const char *gpu_name, int64_t memory_mib);
/* A model by its kgpu name ("H100-80GB"); NULL if none. */
const kgpu_mig_model *kgpu_mig_model_named(const char *name);
/* The profile called `name` ("3g.20gb"), or NULL. */
const kgpu_mig_profile *kgpu_mig_profile_find(const kgpu_mig_model *m, const char *name);
/* The smallest profile (no "+me") with at least `compute` compute slices and `memory_mib`; NULL if none. */
const kgpu_mig_profile *kgpu_mig_profile_fit(const kgpu_mig_model *m, int compute,
                                             int64_t memory_mib);
/* The largest profile: the whole GPU as one instance (7g). */
const kgpu_mig_profile *kgpu_mig_profile_whole(const kgpu_mig_model *m);

/* What is taken on one GPU. Zero-initialised = empty. */
typedef struct kgpu_mig_gpu {
    uint8_t mem;      /* bit s: memory slice s is taken */
    int compute;      /* compute slices taken */
    int media;        /* "+me" instances */
    int count[KGPU_MIG_MAX_PROFILES]; /* instances per profile index of the model */
} kgpu_mig_gpu;

/* The memory slices a placement covers, as a bit mask. */
uint8_t kgpu_mig_mask(int start, int size);
/* Whether profile p (index pi of model m) may be placed at `start` on g now. */
bool kgpu_mig_fits(const kgpu_mig_model *m, const kgpu_mig_gpu *g, int pi, int start);
/* Takes / gives back a placement (the caller checked it fits / holds it). */
void kgpu_mig_take(const kgpu_mig_model *m, kgpu_mig_gpu *g, int pi, int start);
void kgpu_mig_give(const kgpu_mig_model *m, kgpu_mig_gpu *g, int pi, int start);

/*
 * What is still possible on g: the sum over every (profile, start) that fits,
 * of the profile's compute slices, "+me" profiles left out. An empty A100 is
 * worth the most; a placement that costs the big profiles their only start
 * lowers it most.
 */
int kgpu_mig_room(const kgpu_mig_model *m, const kgpu_mig_gpu *g);

/*
 * Where kgpu puts profile pi on g: of the starts that fit, the one leaving
 * the most room (kgpu_mig_room), ties to the higher start (the low slots are
 * what 4g and 7g need). -1 when none fits. *room_after (may be NULL) gets
 * the room left.
 */
int kgpu_mig_choose(const kgpu_mig_model *m, const kgpu_mig_gpu *g, int pi, int *room_after);

/* Free compute slices on g that no profile can use any more (0 while one still fits). */
int kgpu_mig_stranded(const kgpu_mig_model *m, const kgpu_mig_gpu *g);

/*
 * kgpu's cost of placing profile pi at `start` on g, lower is better: the
 * room it takes away (kgpu_mig_room before less after) times 8, plus the
 * compute slices it leaves stranded. Room alone ties a 3g beside a 4g (the
 * GPU full) with a 3g beside a 3g (one slice nothing can use); the second
 * term tells them apart, and an instance strands at most 7 slices, so the
 * terms never mix. -1 when it does not fit. The extender scores nodes by
 * it and `kgpu simulate --mig` measures it (docs/policy.md, MIG).
 */
#define KGPU_MIG_STRANDED_SCALE 8
int64_t kgpu_mig_cost(const kgpu_mig_model *m, const kgpu_mig_gpu *g, int pi, int start);

/*
 * The start kube-scheduler's allocator takes for profile pi on g when the
 * slice lists its starts as `order` (n of them, kgpu_mig_slice_order's:
 * callers compute it once, it costs a kgpu_mig_choose per start): the
 * first of them that fits, or -1.
 */
int kgpu_mig_slice_first(const kgpu_mig_model *m, const kgpu_mig_gpu *g, int pi, const int *order,
                         int n);

/* Where first-fit in NVML's order puts it: the lowest start that fits, or -1. */
int kgpu_mig_first_fit(const kgpu_mig_model *m, const kgpu_mig_gpu *g, int pi);

/*
 * The order in which the starts of profile pi are listed in kgpu's
 * ResourceSlice: kube-scheduler takes the first free device in slice order,
 * so the list is what kgpu_mig_choose would pick placing the profile again
 * and again on an empty GPU (for 1g: 6, 5, 4, 3, 2, 1, 0). Writes the
 * model's nstarts starts into out and returns how many.
 */
int kgpu_mig_slice_order(const kgpu_mig_model *m, int pi, int out[KGPU_MIG_MAX_STARTS]);

#ifdef __cplusplus
}
#endif

#endif
