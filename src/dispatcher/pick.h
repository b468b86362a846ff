/*
 * kgpu-dispatcher's pure part: what a Kueue Workload asks and whether it
 * waits for a dispatcher; the body of an estimate request and its answer;
 * the benchmark figures and the static workload/GPU-type table. No I/O, no
 * clock: the loop (dispatcher.c) fetches, this reads, kgpu_dispatch_rank
 * (include/kgpu/estimate.h) orders.
 *
 * Everything read here comes from outside: Workloads are written by
 * tenants (their pod templates, labels and annotations), estimates by
 * other clusters, benchmark figures by benchmark jobs. Lengths are bounded
 * and anything malformed is refused with a reason; what a tenant writes can
 * only order the clusters that can place its workload (a preference, a
 * benchmark key), never make one that cannot place it be chosen.
 */
#ifndef KGPU_DISPATCH_PICK_H
#define KGPU_DISPATCH_PICK_H

#include <jansson.h>
#include <stdbool.h>

#include "kgpu/error.h"

#define DSP_PREFS_MAX     8   /* GPU model globs in a preference */
#define DSP_GLOB_MAX      128
#define DSP_NOMINATED_MAX 10  /* Kueue's limit on nominatedClusterNames */
#define DSP_MULTIKUEUE    "kueue.x-k8s.io/multikueue"
#define DSP_KUEUE_MANAGER "kueue-admission" /* the field manager of Kueue's admission status */
#define DSP_LABEL_WORKLOAD "kgpu.io/workload"               /* benchmark key, on the pod template */
#define DSP_ANN_PREFERENCE "kgpu.io/gpu-type-preference"    /* "GLOB,GLOB": best first */

typedef struct dsp_workload {
    const json_t *obj; /* borrowed: the Workload read */
    char ns[64], name[254], uid[64], rv[64];
    const json_t *pod; /* borrowed: the GPU pod set's template */
    int count;         /* its pods */
    char key[64];      /* kgpu.io/workload; "" */
    char prefs[DSP_PREFS_MAX][DSP_GLOB_MAX];
    int nprefs;
    char check[254]; /* the Pending MultiKueue admission check's name */
    char nominated[DSP_NOMINATED_MAX][64];
    int nnominated;
    char cluster[64]; /* status.clusterName; "" */
    long long priority; /* spec.priority; 0 */
    char created[40];   /* metadata.creationTimestamp (RFC 3339, sorts as text); "" */
    bool waits;       /* quota reserved, a MultiKueue check Pending, no cluster, not finished */
} dsp_workload;

/*
 * Reads a kueue.x-k8s.io/v1beta2 Workload. `checks` is a JSON object of
 * the MultiKueue admission checks' names (values ignored). The pod set
 * used is the first whose template asks for a GPU (kgpu's resources), else
 * the first. 0, or KGPU_EINVAL with err saying what is malformed.
 */
int dsp_workload_read(const json_t *wl, const json_t *checks, dsp_workload *out, kgpu_error *err);

/* Dispatch order: higher priority first, then the older, then by namespace and name. */
int dsp_workload_cmp(const dsp_workload *a, const dsp_workload *b);

/* Rank (0 best) of `model` in w's preference list; -1 when it has none or none matches. */
int dsp_pref_rank(const dsp_workload *w, const char *model);

/* What one cluster answered for one pod. */
typedef struct dsp_answer {
    int fit;
    int grow;             /* more copies its node groups could add */
    char first_model[64]; /* "" when none fits */
    char models[16][64];  /* models it would land on (byModel), at most 16 */
    int nmodels;
    bool scored;       /* score is given */
    double score;      /* the placement policy's score of the first copy's place */
    double frag_added; /* fragFirst - fragBefore */
    double price;      /* pricePerHour; 0 unknown */
} dsp_answer;

/* Reads POST /estimate's answer for its first pod. KGPU_EPARSE with a reason. */
int dsp_answer_read(const char *body, size_t len, dsp_answer *out, kgpu_error *err);

/*
 * Benchmark figures: kgpu_workload_throughput{workload,gpu_model,cluster}
 * samples (or the federated rules' kgpu:workload_throughput:max30d) from an
 * exposition text. NULL with err on a malformed text.
 */
typedef struct dsp_bench dsp_bench;
dsp_bench *dsp_bench_parse(const char *text, size_t len, const char *source, kgpu_error *err);
void dsp_bench_free(dsp_bench *b);
/*
 * Throughput of workload `key` on `model` in `cluster`, else on `model` in
 * any cluster (the highest); 0 when none was measured.
 */
double dsp_bench_get(const dsp_bench *b, const char *key, const char *model, const char *cluster);
int dsp_bench_count(const dsp_bench *b);

/*
 * The static table (YAML or JSON): workloads: {KEY: [GLOB, ...]}, the GPU
 * types each workload runs on, best first; the preference of a workload
 * that states none. NULL with err naming the file and the entry.
 */
typedef struct dsp_table dsp_table;
dsp_table *dsp_table_parse(const char *buf, size_t len, const char *file, kgpu_error *err);
void dsp_table_free(dsp_table *t);
/* Gives w the table's preference for its key when it has none of its own. */
void dsp_table_apply(const dsp_table *t, dsp_workload *w);

/*
 * The server-side apply (application/apply-patch+yaml, JSON being YAML)
 * that nominates `cluster` for Workload `wl`, as field manager `manager`
 * (Kueue's "kueue-admission") on the status subresource: exactly the
 * fields that manager's Apply entry of wl's managedFields owns, as they
 * are in wl now, plus status.nominatedClusterNames, with wl's uid and
 * resourceVersion as preconditions. Kueue clears the nomination by
 * omitting it from its own applies, which removes a field only when no
 * other manager owns it: written under any other manager's name it would
 * stay, and Kueue could never set clusterName (the two are mutually
 * exclusive). Projecting the manager's own set keeps every other field it
 * owns as it is. A new object, or NULL with err.
 */
json_t *dsp_nomination_apply(const json_t *wl, const char *manager, const char *cluster,
                             kgpu_error *err);

/*
 * The estimate request for w (its pod, `count` copies) after the pods in
 * flight to that cluster (`reserve`: a JSON array of {pod, count}, borrowed;
 * NULL none). A new string (free) or NULL.
 */
char *dsp_estimate_body(const dsp_workload *w, const json_t *reserve);

#endif
