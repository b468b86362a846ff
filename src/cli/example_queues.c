/*
 * The bursty multi-team scenario (example_queues.h). Each team's arrivals
 * are a Poisson process whose rate follows its own day: bursts that ask for
 * well above its guarantee, quiet hours that leave its share idle for the
 * others to borrow. The bursts overlap, so queues borrow from each other
 * and then want their share back: what reclaim is for.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "example_queues.h"
#include "kgpu/rng.h"

#define DAY_S       86400.0
#define GPUS_NODE   8
#define MEAN_LIFE_S 5400.0

typedef struct team {
    const char *name;
    double share;      /* of the cluster's GPUs, guaranteed */
    int weight;
    double bursts[3][2]; /* [start, end) in hours; {0, 0} unused */
} team;

static const team teams[] = {
    {"team-a", 0.40, 1, {{0, 8}, {12, 18}, {0, 0}}},
    {"team-b", 0.30, 1, {{4, 10}, {15, 22}, {0, 0}}},
    {"team-c", 0.20, 1, {{2, 6}, {9, 14}, {19, 24}}},
    {"team-d", 0.10, 2, {{6, 9}, {13, 16}, {20, 23}}},
};
#define NTEAMS (int)(sizeof(teams) / sizeof(teams[0]))

static bool in_burst(const team *t, double h)
{
    for (int i = 0; i < 3; i++)
        if (h >= t->bursts[i][0] && h < t->bursts[i][1])
            return true;
    return false;
}

typedef struct pod {
    double created, life;
    int team, gpus, milli, qos;
} pod;

static int pod_cmp(const void *x, const void *y)
{
    const pod *a = x, *b = y;
    if (a->created != b->created)
        return a->created < b->created ? -1 : 1;
    return a->team - b->team;
}

/* One pod's shape: 40 % shares of 1/4, 1/2 or 3/4 GPU, then 1, 2, 4, 8 whole GPUs. */
static void draw_shape(kgpu_rng *rng, pod *p)
{
    double u = kgpu_rng_double(rng);
    static const int shares[] = {250, 500, 750};
    p->gpus = 1;
    p->milli = 1000;
    if (u < 0.40)
        p->milli = shares[kgpu_rng_below(rng, 3)];
    else if (u < 0.75)
        p->gpus = 1;
    else if (u < 0.90)
        p->gpus = 2;
    else if (u < 0.97)
        p->gpus = 4;
    else
        p->gpus = 8;
    double q = kgpu_rng_double(rng);
    p->qos = q < 0.30 ? 0 : q < 0.90 ? 1 : 2;
}

static int write_file(const char *dir, const char *name, char *text, size_t len, kgpu_error *err)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return kgpu_error_set(err, KGPU_EIO, "%s: %s", path, strerror(errno));
    bool ok = fwrite(text, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        remove(path);
        return kgpu_error_set(err, KGPU_EIO, "%s: write failed", path);
    }
    return 0;
}

int kgpu_example_queues_write(const char *dir, uint64_t seed, int nodes, kgpu_error *err)
{
    if (dir == NULL || nodes < 1 || nodes > 10000)
        return kgpu_error_set(err, KGPU_EINVAL, "--queues example: nodes 1..10000");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return kgpu_error_set(err, KGPU_EIO, "%s: %s", dir, strerror(errno));
    kgpu_rng rng;
    kgpu_rng_seed(&rng, seed, 11);
    double gpus = (double)nodes * GPUS_NODE;
    const double mean_gpus = 0.40 * 0.5 + 0.35 + 0.15 * 2 + 0.07 * 4 + 0.03 * 8;
    size_t cap = 1024, n = 0;
    pod *pods = malloc(cap * sizeof(*pods));
    char *buf = NULL;
    size_t blen = 0;
    FILE *m = NULL;
    int rc = 0;
    if (pods == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (int ti = 0; ti < NTEAMS; ti++) {
        const team *t = &teams[ti];
        /* Pods present at once ~ rate x mean life: rate for 1.6 x (burst) or 0.15 x the share. */
        double hi = 1.6 * t->share * gpus / (mean_gpus * MEAN_LIFE_S);
        double lo = 0.15 * t->share * gpus / (mean_gpus * MEAN_LIFE_S);
        double now = 0;
        for (;;) {
            now += -log(1.0 - kgpu_rng_double(&rng)) / hi;
            if (now >= DAY_S)
                break;
            double rate = in_burst(t, now / 3600.0) ? hi : lo;
            if (kgpu_rng_double(&rng) * hi >= rate)
                continue; /* thinning: the rate of the hour */
            if (n == cap) {
                pod *p = realloc(pods, 2 * cap * sizeof(*pods));
                if (p == NULL) {
                    rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
                    goto out;
                }
                pods = p;
                cap *= 2;
            }
            pod *p = &pods[n++];
            p->created = floor(now);
            p->team = ti;
            double life = -log(1.0 - kgpu_rng_double(&rng)) * MEAN_LIFE_S;
            p->life = floor(fmin(fmax(life, 600.0), 6 * 3600.0));
            draw_shape(&rng, p);
        }
    }
    qsort(pods, n, sizeof(*pods), pod_cmp);

    /* nodes.csv */
    if ((m = open_memstream(&buf, &blen)) == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    fprintf(m, "sn,cpu_milli,memory_mib,gpu,model\n");
    for (int i = 0; i < nodes; i++)
        fprintf(m, "queues-node-%04d,96000,786432,%d,V100M32\n", i, GPUS_NODE);
    fclose(m);
    m = NULL;
    if ((rc = write_file(dir, "nodes.csv", buf, blen, err)) != 0)
        goto out;
    free(buf);
    buf = NULL;

    /* pods.csv */
    static const char *const qos[] = {"LS", "BE", "Burstable"};
    int count[NTEAMS] = {0};
    if ((m = open_memstream(&buf, &blen)) == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    fprintf(m, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
               "deletion_time,scheduled_time\n");
    for (size_t i = 0; i < n; i++) {
        const pod *p = &pods[i];
        double g = p->gpus * p->milli / 1000.0;
        long long c = (long long)p->created, d = (long long)(p->created + p->life);
        fprintf(m, "%s-%05d,%lld,%lld,%d,%d,,%s,Running,%lld,%lld,%lld\n", teams[p->team].name,
                count[p->team]++, (long long)(g * 8000), (long long)(g * 32768), p->gpus,
                p->milli, qos[p->qos], c, d, c);
    }
    fclose(m);
    m = NULL;
    if ((rc = write_file(dir, "pods.csv", buf, blen, err)) != 0)
        goto out;
    free(buf);
    buf = NULL;

    /* queues.yaml */
    if ((m = open_memstream(&buf, &blen)) == NULL) {
        rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        goto out;
    }
    fprintf(m, "# kgpu example --queues: %d GPUs; teams guaranteed 40/30/20/10 %%, no limits,\n"
               "# so idle GPUs are borrowed and reclaimed (docs/queues.md).\n"
               "queues:\n",
            (int)gpus);
    for (int ti = 0; ti < NTEAMS; ti++)
        fprintf(m, "  - name: %s\n    guarantee: {gpu: %g}\n    weight: %d\n", teams[ti].name,
                floor(teams[ti].share * gpus), teams[ti].weight);
    fclose(m);
    m = NULL;
    rc = write_file(dir, "queues.yaml", buf, blen, err);
out:
    if (m != NULL)
        fclose(m);
    free(buf);
    free(pods);
    return rc;
}
