/*
 * Synthetic example cluster and workload in the Alibaba GPU trace formats.
 * The mix of node shapes and pod shapes follows the published trace (mostly
 * 8-GPU and 2-GPU nodes; a third of pods share a GPU, a third take one whole
 * GPU) so policy comparisons on it behave like on the real thing, at a size
 * that runs in seconds. Randomness comes from a private splitmix64 stream and
 * integer arithmetic only, so a seed gives the same files on every machine.
 */
#include "example.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* GPU models in the example cluster, in the alphabetical order gpu_spec lists them. */
static const char *const example_models[] = {"A10", "A100", "P100", "T4", "V100M32"};
#define EXAMPLE_NMODELS ((int)(sizeof(example_models) / sizeof(example_models[0])))

enum { M_A10, M_A100, M_P100, M_T4, M_V100M32 };

/* Node shapes; weights in per mille of the nodes: 45% 8-GPU, 40% 2-GPU, 10% 4-GPU, 5% 1-GPU. */
static const struct example_node_type {
    int model;
    int gpus;
    int64_t cpu_milli, memory_mib;
    int weight;
} example_node_types[] = {
    {M_V100M32, 8, 96000, 786432, 200}, {M_A100, 8, 128000, 786432, 150},
    {M_A10, 8, 128000, 786432, 100},    {M_T4, 4, 64000, 262144, 100},
    {M_P100, 2, 64000, 262144, 150},    {M_T4, 2, 64000, 262144, 250},
    {M_T4, 1, 64000, 131072, 50},
};
#define EXAMPLE_NTYPES ((int)(sizeof(example_node_types) / sizeof(example_node_types[0])))

/* GPU compute shares seen most in the trace, in milli-GPU. */
/* GPU shares in milli, weighted by repetition like the Alibaba trace's mix (810 is the most
 * common). */
static const int example_shares[] = {810, 810, 810, 470, 470, 650, 320,
                                     230, 590, 550, 160, 370, 220, 460};

#define DEMAND_PER_MILLE 950 /* workload GPU demand relative to the cluster's GPUs */
#define MAX_REDRAWS      1000

typedef struct example_rng {
    uint64_t state;
} example_rng;

/* splitmix64 (Steele, Lea, Flood 2014): tiny, and good enough for picking shapes. */
static uint64_t rng_next(example_rng *r)
{
    uint64_t z = (r->state += UINT64_C(0x9E3779B97F4A7C15));

    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in [0, n), n > 0, without modulo bias. */
static uint64_t rng_below(example_rng *r, uint64_t n)
{
    uint64_t threshold = -n % n;

    for (;;) {
        uint64_t v = rng_next(r);

        if (v >= threshold)
            return v % n;
    }
}

/* Writes to one output file, remembering the first failure's errno. */
typedef struct example_out {
    FILE *f;
    const char *path;
    int err_no;
} example_out;

static void emit(example_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void emit(example_out *o, const char *fmt, ...)
{
    va_list ap;

    if (o->err_no)
        return;
    va_start(ap, fmt);
    if (vfprintf(o->f, fmt, ap) < 0)
        o->err_no = errno ? errno : EIO;
    va_end(ap);
}

static int out_open(example_out *o, const char *path, kgpu_error *err)
{
    o->path = path;
    o->err_no = 0;
    o->f = fopen(path, "w");
    if (!o->f)
        return kgpu_error_set(err, KGPU_EIO, "example: %s: %s", path, strerror(errno));
    return 0;
}

/* Closes the file; if anything failed, removes it so no half-written trace is left behind. */
static int out_close(example_out *o, kgpu_error *err)
{
    int e = o->err_no;

    if (fflush(o->f) != 0 && !e)
        e = errno;
    if (ferror(o->f) && !e)
        e = EIO;
    if (fclose(o->f) != 0 && !e)
        e = errno;
    o->f = NULL;
    if (e) {
        unlink(o->path);
        return kgpu_error_set(err, KGPU_EIO, "example: %s: %s", o->path, strerror(e));
    }
    return 0;
}

/* mkdir -p: creates dir and any missing parents. */
static int make_dirs(const char *dir, kgpu_error *err)
{
    char *path = strdup(dir);
    int rc = 0;

    if (!path)
        return kgpu_error_set(err, KGPU_ENOMEM, "example: out of memory");
    for (char *p = path + 1;; p++) {
        char c = *p;

        if (c != '/' && c != '\0')
            continue;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            rc = kgpu_error_set(err, KGPU_EIO, "example: %s: %s", path, strerror(errno));
            break;
        }
        *p = c;
        if (c == '\0')
            break;
    }
    free(path);
    return rc;
}

static char *join_path(const char *dir, const char *file)
{
    size_t n = strlen(dir);
    const char *sep = n > 0 && dir[n - 1] == '/' ? "" : "/";
    char *path = malloc(n + strlen(sep) + strlen(file) + 1);

    if (path)
        sprintf(path, "%s%s%s", dir, sep, file);
    return path;
}

/* The cluster: each node's shape, in a seeded shuffle of the fleet's proportions. */
typedef struct example_cluster {
    int *type; /* per node, an index into example_node_types */
    int nnodes;
    int64_t gpus;                    /* total */
    int max_gpus;                    /* on any one node */
    int model_gpus[EXAMPLE_NMODELS]; /* most GPUs of each model on one node; 0 = absent */
} example_cluster;

static int cluster_make(example_cluster *c, int nodes, example_rng *rng, kgpu_error *err)
{
    int64_t count[EXAMPLE_NTYPES], rem[EXAMPLE_NTYPES], left = nodes;
    int k = 0;

    memset(c, 0, sizeof(*c));
    c->type = malloc((size_t)nodes * sizeof(*c->type));
    if (!c->type)
        return kgpu_error_set(err, KGPU_ENOMEM, "example: out of memory for %d nodes", nodes);
    c->nnodes = nodes;

    /* Largest-remainder apportionment: exact proportions at any size, no rounding drift. */
    for (int t = 0; t < EXAMPLE_NTYPES; t++) {
        count[t] = (int64_t)nodes * example_node_types[t].weight / 1000;
        rem[t] = (int64_t)nodes * example_node_types[t].weight % 1000;
        left -= count[t];
    }
    while (left-- > 0) {
        int best = 0;

        for (int t = 1; t < EXAMPLE_NTYPES; t++)
            if (rem[t] > rem[best])
                best = t;
        count[best]++;
        rem[best] = -1;
    }
    for (int t = 0; t < EXAMPLE_NTYPES; t++) {
        const struct example_node_type *nt = &example_node_types[t];

        for (int64_t i = 0; i < count[t]; i++)
            c->type[k++] = t;
        if (count[t] > 0) {
            c->gpus += count[t] * nt->gpus;
            if (nt->gpus > c->max_gpus)
                c->max_gpus = nt->gpus;
            if (nt->gpus > c->model_gpus[nt->model])
                c->model_gpus[nt->model] = nt->gpus;
        }
    }
    /* Fisher-Yates, so node order (which some policies break ties by) is not sorted by shape. */
    for (int i = nodes - 1; i > 0; i--) {
        int j = (int)rng_below(rng, (uint64_t)i + 1), t = c->type[i];

        c->type[i] = c->type[j];
        c->type[j] = t;
    }
    return 0;
}

static void write_nodes(example_out *o, const example_cluster *c)
{
    emit(o, "sn,cpu_milli,memory_mib,gpu,model\n");
    for (int i = 0; i < c->nnodes; i++) {
        const struct example_node_type *nt = &example_node_types[c->type[i]];

        emit(o, "example-node-%04d,%" PRId64 ",%" PRId64 ",%d,%s\n", i, nt->cpu_milli,
             nt->memory_mib, nt->gpus, example_models[nt->model]);
    }
}

/*
 * A gpu_spec naming 1 to 3 models present in the cluster on nodes with at
 * least `gpus` GPUs (so the pod can run somewhere), '|'-separated.
 */
static void draw_spec(example_rng *rng, const example_cluster *c, int gpus, char *buf, size_t size)
{
    int eligible[EXAMPLE_NMODELS], n = 0, want;
    bool chosen[EXAMPLE_NMODELS] = {false};
    size_t len = 0;

    for (int m = 0; m < EXAMPLE_NMODELS; m++)
        if (c->model_gpus[m] >= gpus)
            eligible[n++] = m;
    buf[0] = '\0';
    if (n == 0)
        return;
    want = rng_below(rng, 10) < 6 ? 1 : 2 + (int)rng_below(rng, 2);
    if (want > n)
        want = n;
    for (int i = 0; i < want; i++) { /* partial shuffle picks `want` distinct models */
        int j = i + (int)rng_below(rng, (uint64_t)(n - i)), m = eligible[j];

        eligible[j] = eligible[i];
        eligible[i] = m;
        chosen[m] = true;
    }
    for (int m = 0; m < EXAMPLE_NMODELS; m++)
        if (chosen[m])
            len +=
                (size_t)snprintf(buf + len, size - len, "%s%s", len ? "|" : "", example_models[m]);
}

/* Duration in seconds: mostly minutes to hours, some running for days. */
static int64_t draw_duration(example_rng *rng)
{
    uint64_t bucket = rng_below(rng, 100);

    if (bucket < 50)
        return 600 + (int64_t)rng_below(rng, 7200 - 600);
    if (bucket < 85)
        return 7200 + (int64_t)rng_below(rng, 86400 - 7200);
    return 86400 + (int64_t)rng_below(rng, 13 * 86400);
}

static void write_pods(example_out *o, const example_cluster *c, example_rng *rng)
{
    static const int whole[] = {1, 2, 4, 8};
    static const char *const qos[] = {"LS", "BE", "Burstable"};
    int64_t capacity = c->gpus * 1000, target = c->gpus * DEMAND_PER_MILLE, demand = 0;
    int64_t created = 0;
    int redraws = 0, index = 0;

    emit(o, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
            "deletion_time,scheduled_time\n");
    while (demand < target && !o->err_no) {
        uint64_t kind = rng_below(rng, 1000), q;
        int num_gpu, gpu_milli;
        int64_t cpu, mem, duration;
        char spec[64] = "";

        if (kind < 130) { /* CPU only */
            num_gpu = 0, gpu_milli = 0;
            /* CPU-only pods are big in production (the trace's average is ~18 cores). */
            cpu = 4000 + 2000 * (int64_t)rng_below(rng, 15);
            mem = cpu / 1000 * (1024 << rng_below(rng, 3));
        } else if (kind < 480) { /* a share of one GPU */
            num_gpu = 1;
            gpu_milli = example_shares[rng_below(rng, sizeof(example_shares) / sizeof(int))];
            cpu = 2000 + 1000 * (int64_t)rng_below(rng, 11);
            mem = cpu / 1000 * (2048 << rng_below(rng, 2));
        } else { /* whole GPUs: 1 (35%), 2 (10%), 4 (5%), 8 (2%) */
            num_gpu = whole[kind < 830 ? 0 : kind < 930 ? 1 : kind < 980 ? 2 : 3];
            while (num_gpu > c->max_gpus)
                num_gpu /= 2;
            gpu_milli = 1000;
            /* 8-12 cores and at most 48 GiB per GPU: fits every node shape that has the GPUs. */
            cpu = num_gpu * (int64_t)(8000 + 2000 * rng_below(rng, 3));
            mem = cpu / 1000 * (2048 << rng_below(rng, 2));
        }
        if (num_gpu > 0 && rng_below(rng, 10) == 0)
            draw_spec(rng, c, num_gpu, spec, sizeof(spec));
        q = rng_below(rng, 100);
        created += 1 + (int64_t)rng_below(rng, 120);
        duration = draw_duration(rng);

        /* Near the end, skip pods that would push demand past the whole cluster. */
        if (demand + (int64_t)num_gpu * gpu_milli > capacity && redraws++ < MAX_REDRAWS)
            continue;
        demand += (int64_t)num_gpu * gpu_milli;
        emit(o,
             "example-pod-%05d,%" PRId64 ",%" PRId64 ",%d,%d,%s,%s,Running,%" PRId64 ",%" PRId64
             ",%" PRId64 "\n",
             index++, cpu, mem, num_gpu, gpu_milli, spec,
             qos[q < 55   ? 0
                 : q < 95 ? 1
                          : 2],
             created, created + duration, created);
    }
}

int kgpu_example_write(const char *dir, uint64_t seed, int nodes, kgpu_error *err)
{
    example_rng rng = {seed};
    example_cluster cluster = {0};
    example_out out = {0};
    char *nodes_path = NULL, *pods_path = NULL;
    int rc;

    if (!dir || !*dir)
        return kgpu_error_set(err, KGPU_EINVAL, "example: no directory given");
    if (nodes < 1 || nodes > KGPU_EXAMPLE_MAX_NODES)
        return kgpu_error_set(err, KGPU_EINVAL, "example: %d nodes; expected 1 to %d", nodes,
                              KGPU_EXAMPLE_MAX_NODES);
    if ((rc = make_dirs(dir, err)) < 0)
        return rc;
    nodes_path = join_path(dir, "nodes.csv");
    pods_path = join_path(dir, "pods.csv");
    if (!nodes_path || !pods_path) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "example: out of memory");
        goto done;
    }
    if ((rc = cluster_make(&cluster, nodes, &rng, err)) < 0)
        goto done;

    if ((rc = out_open(&out, nodes_path, err)) < 0)
        goto done;
    write_nodes(&out, &cluster);
    if ((rc = out_close(&out, err)) < 0)
        goto done;

    if ((rc = out_open(&out, pods_path, err)) < 0)
        goto done;
    write_pods(&out, &cluster, &rng);
    rc = out_close(&out, err);

done:
    free(cluster.type);
    free(nodes_path);
    free(pods_path);
    return rc;
}
