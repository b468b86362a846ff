/*
 * Fuzz target for the queue configuration reader (src/common/queuefile.c):
 * an operator's file, YAML or JSON. Whatever parses must be a tree the core
 * accepts, whose guarantees sit within their limits, and on which a charge
 * admission lets in is taken and undone exactly; choosing a pod's queue
 * by namespace and label gives the labelled queue or a refusal, never
 * another queue.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kgpu/queue.h"
#include "queuefile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kgpu_queues *qs = NULL;
    kgpu_error err;
    if (kgpu_queues_load((const char *)data, size, "fuzz.yaml", &qs, &err) != 0) {
        if (qs != NULL)
            abort(); /* a failed load hands nothing back */
        return 0;
    }
    if (qs == NULL)
        return 0; /* no queues section */
    if (kgpu_queues_find(qs, KGPU_QUEUE_DEFAULT) < 0)
        abort();
    int n = kgpu_queues_count(qs);
    for (int q = 0; q < n; q++) {
        kgpu_queue_info qi;
        if (kgpu_queues_info(qs, q, &qi) != 0)
            abort();
        if (qi.guarantee.milli != KGPU_QUEUE_UNSET && qi.limit.milli != KGPU_QUEUE_UNSET &&
            qi.guarantee.milli > qi.limit.milli)
            abort();
        if (qi.parent >= n || qi.depth > KGPU_QUEUE_MAX_DEPTH)
            abort();
        kgpu_qdemand d = {.milli = size % 4096, .mem_mib = (int64_t)size * 7};
        int st = kgpu_queues_check(qs, q, &d, NULL, 0);
        int rc = kgpu_queues_charge(qs, q, &d, NULL);
        if ((rc == 0) != (st == KGPU_QUEUE_WITHIN || st == KGPU_QUEUE_BORROWS))
            abort();
        if (rc == 0 && kgpu_queues_uncharge(qs, q, &d, NULL) != 0)
            abort();
        kgpu_label labels[] = {{"tier", "gold"}, {"team", (char *)qi.name}};
        kgpu_queue_ns ns = {.name = "team-a", .queue = qi.name, .labels = labels, .nlabels = 2};
        char why[512];
        if (kgpu_queues_pick(qs, &ns, NULL, why, sizeof(why)) != q)
            abort(); /* its namespace's queue */
        for (int l = 0; l < n; l++) {
            kgpu_queue_info li;
            kgpu_queues_info(qs, l, &li);
            int got = kgpu_queues_pick(qs, &ns, li.name, why, sizeof(why));
            if (got != l && (got != -1 || strstr(why, "not open to namespace team-a") == NULL))
                abort();
        }
    }
    kgpu_queues_free(qs);
    return 0;
}
