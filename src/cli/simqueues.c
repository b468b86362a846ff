/*
 * Trace pods to queues for the simulator (simqueues.h). The trace has no
 * teams, so the rule must be deterministic and say nothing about the pod
 * but its name: a generated scenario names pods after their team, and any
 * other trace is spread over the teams in proportion to their guarantees.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simqueues.h"

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

int kgpu_simq_queue_of(const kgpu_queues *qs, const char *pod_name)
{
    int n = kgpu_queues_count(qs), best = -1;
    size_t best_len = 0;
    uint64_t total = 0, total_w = 0;
    for (int q = 0; q < n; q++) {
        kgpu_queue_info qi;
        kgpu_queues_info(qs, q, &qi);
        if (!qi.leaf || strcmp(qi.name, KGPU_QUEUE_DEFAULT) == 0)
            continue;
        size_t len = strlen(qi.name);
        if (strncmp(pod_name, qi.name, len) == 0 && pod_name[len] == '-' && len > best_len) {
            best = q;
            best_len = len;
        }
        total += qi.guarantee.milli > 0 ? (uint64_t)qi.guarantee.milli : 0;
        total_w += (uint64_t)qi.weight;
    }
    if (best >= 0)
        return best;
    bool by_weight = total == 0;
    uint64_t sum = by_weight ? total_w : total;
    if (sum == 0)
        return kgpu_queues_find(qs, KGPU_QUEUE_DEFAULT);
    uint64_t x = fnv1a(pod_name) % sum;
    for (int q = 0; q < n; q++) {
        kgpu_queue_info qi;
        kgpu_queues_info(qs, q, &qi);
        if (!qi.leaf || strcmp(qi.name, KGPU_QUEUE_DEFAULT) == 0)
            continue;
        uint64_t share = by_weight ? (uint64_t)qi.weight
                                   : (qi.guarantee.milli > 0 ? (uint64_t)qi.guarantee.milli : 0);
        if (x < share)
            return q;
        x -= share;
    }
    return kgpu_queues_find(qs, KGPU_QUEUE_DEFAULT); /* not reached */
}

int kgpu_simq_priority_of(const char *qos)
{
    if (qos == NULL)
        return 0;
    if (strcmp(qos, "Guaranteed") == 0)
        return 3;
    if (strcmp(qos, "LS") == 0)
        return 2;
    if (strcmp(qos, "Burstable") == 0)
        return 1;
    return 0;
}

int kgpu_simq_assign(const kgpu_queues *qs, const kgpu_trace *pods, const char *file,
                     int **queue_of, int **priority_of, kgpu_error *err)
{
    size_t n = pods->npods;
    *queue_of = malloc((n ? n : 1) * sizeof(**queue_of));
    *priority_of = malloc((n ? n : 1) * sizeof(**priority_of));
    if (*queue_of == NULL || *priority_of == NULL) {
        free(*queue_of);
        free(*priority_of);
        *queue_of = *priority_of = NULL;
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const kgpu_trace_pod *p = &pods->pods[i];
        bool named = p->queue != NULL && p->queue[0] != '\0';
        (*queue_of)[i] = named ? kgpu_queues_find(qs, p->queue) : kgpu_simq_queue_of(qs, p->name);
        (*priority_of)[i] = kgpu_simq_priority_of(p->qos);
        if ((*queue_of)[i] < 0) {
            kgpu_error_set(err, KGPU_EINVAL, "%s:%d: queue '%.63s' is not in the queue file",
                           file, p->line, p->queue);
            free(*queue_of);
            free(*priority_of);
            *queue_of = *priority_of = NULL;
            return err ? err->code : KGPU_EINVAL;
        }
    }
    return 0;
}

static const char *const mode_names[] = {"none", "static", "priority-age", "frag"};

const char *kgpu_simq_mode_name(kgpu_churn_queue_mode m)
{
    return (int)m >= 0 && (int)m < 4 ? mode_names[m] : "?";
}

int kgpu_simq_parse_modes(const char *text, kgpu_churn_queue_mode *modes, int max, int *n,
                          kgpu_error *err)
{
    *n = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", text);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int m = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(t, mode_names[i]) == 0)
                m = i;
        if (m < 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "--queue-modes: unknown '%s' (none, static, priority-age, frag)",
                                  t);
        if (*n == max)
            return kgpu_error_set(err, KGPU_EINVAL, "--queue-modes: more than %d", max);
        modes[(*n)++] = (kgpu_churn_queue_mode)m;
    }
    if (*n == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "--queue-modes is empty");
    return 0;
}
