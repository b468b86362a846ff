/*
 * The departure heap of the simulators with time (core.h, "depheap.c"):
 * the running pods' ends, earliest first, ties by pod index so that the
 * order never depends on the heap's layout.
 */
#include <stdlib.h>

#include "core.h"

static bool dep_before(const kgpu__departure *a, const kgpu__departure *b)
{
    return a->t < b->t || (a->t == b->t && a->pod < b->pod);
}

bool kgpu__dep_push(kgpu__dep_heap *h, kgpu__departure d)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        kgpu__departure *v = realloc(h->v, cap * sizeof(*v));
        if (v == NULL)
            return false;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!dep_before(&d, &h->v[up]))
            break;
        h->v[i] = h->v[up];
        i = up;
    }
    h->v[i] = d;
    return true;
}

kgpu__departure kgpu__dep_pop(kgpu__dep_heap *h)
{
    kgpu__departure top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t m = 2 * i + 1;
        if (m >= h->n)
            break;
        if (m + 1 < h->n && dep_before(&h->v[m + 1], &h->v[m]))
            m++;
        if (!dep_before(&h->v[m], &last))
            break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n > 0)
        h->v[i] = last;
    return top;
}
