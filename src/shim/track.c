/*
 * The allocation table (track.h): linear probing on a power-of-two table
 * kept at most half full, with backward-shift deletion, so there are no
 * tombstones and no periodic rebuilds whatever the pattern of allocations
 * and frees. A pair of hooked calls (allocate, free) costs one put and one
 * take, each a lock, a hash and usually a probe or two.
 */
#include <stdlib.h>
#include <string.h>

#include "compat.h"
#include "track.h"

#define MIN_CAP 1024

#define ARRAY3D_LAYERED 0x01 /* CUDA_ARRAY3D_LAYERED: depth counts layers */
#define ARRAY3D_CUBEMAP 0x04 /* CUDA_ARRAY3D_CUBEMAP: depth counts faces */

static size_t hash(int kind, uint64_t key)
{
    uint64_t z = key ^ ((uint64_t)kind << 56);
    z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdULL;
    z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ULL;
    return (size_t)(z ^ (z >> 33));
}

/* Lock held, table allocated. Index of (kind, key), or of the empty cell where it would go. */
static size_t probe(const kgpu_track *t, int kind, uint64_t key, int *found)
{
    size_t mask = t->cap - 1, i = hash(kind, key) & mask;
    for (;; i = (i + 1) & mask) {
        const kgpu_track_rec *c = &t->cells[i];
        if (c->kind == 0 || (c->kind == kind && c->key == key)) {
            *found = c->kind != 0;
            return i;
        }
    }
}

/* Lock held. Moves everything into `cap` cells; -1 when out of memory. */
static int resize(kgpu_track *t, size_t cap)
{
    kgpu_track_rec *old = t->cells;
    size_t old_cap = t->cap;
    kgpu_track_rec *cells = calloc(cap, sizeof(*cells));
    if (cells == NULL)
        return -1;
    t->cells = cells;
    t->cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].kind == 0)
            continue;
        int found;
        cells[probe(t, old[i].kind, old[i].key, &found)] = old[i];
    }
    free(old);
    return 0;
}

/*
 * Lock held. Empties cell i and pulls back the cells after it that would
 * otherwise no longer be found (those whose home is not between the hole
 * and themselves).
 */
static void remove_at(kgpu_track *t, size_t i)
{
    size_t mask = t->cap - 1, hole = i;
    for (size_t j = (i + 1) & mask; t->cells[j].kind != 0; j = (j + 1) & mask) {
        size_t home = hash(t->cells[j].kind, t->cells[j].key) & mask;
        /* j may move to the hole unless its home lies cyclically in (hole, j]. */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t->cells[hole] = t->cells[j];
            hole = j;
        }
    }
    t->cells[hole].kind = 0;
    t->filled--;
}

int kgpu_track_put(kgpu_track *t, const kgpu_track_rec *rec)
{
    int rc = 0, found;
    pthread_mutex_lock(&t->mu);
    if ((t->cells == NULL || (t->filled + 1) * 2 > t->cap) &&
        resize(t, t->cells == NULL ? MIN_CAP : t->cap * 2) != 0) {
        rc = -1;
        goto out;
    }
    size_t i = probe(t, rec->kind, rec->key, &found);
    t->filled += !found;
    t->cells[i] = *rec;
out:
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int kgpu_track_get(kgpu_track *t, int kind, uint64_t key, kgpu_track_rec *out)
{
    int found = 0;
    pthread_mutex_lock(&t->mu);
    if (t->cells != NULL) {
        size_t i = probe(t, kind, key, &found);
        if (found)
            *out = t->cells[i];
    }
    pthread_mutex_unlock(&t->mu);
    return found;
}

int kgpu_track_take(kgpu_track *t, int kind, uint64_t key, kgpu_track_rec *out)
{
    int found = 0;
    pthread_mutex_lock(&t->mu);
    if (t->cells != NULL) {
        size_t i = probe(t, kind, key, &found);
        if (found) {
            *out = t->cells[i];
            remove_at(t, i);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return found;
}

size_t kgpu_track_take_ctx(kgpu_track *t, uintptr_t ctx, uint64_t bytes[KGPU_SHIM_MAX_DEVICES])
{
    size_t n = 0;
    if (ctx == 0)
        return 0;
    pthread_mutex_lock(&t->mu);
    /* Removing shifts cells back, possibly into ones already passed: sweep until none is left. */
    for (int again = 1; again && t->cells != NULL;) {
        again = 0;
        for (size_t i = 0; i < t->cap; i++) {
            kgpu_track_rec *c = &t->cells[i];
            if (c->kind == 0 || c->ctx != ctx)
                continue;
            if (c->dev >= 0 && c->dev < KGPU_SHIM_MAX_DEVICES)
                bytes[c->dev] += c->bytes;
            remove_at(t, i);
            n++;
            again = 1;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

size_t kgpu_track_count(kgpu_track *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->filled;
    pthread_mutex_unlock(&t->mu);
    return n;
}

void kgpu_track_clear(kgpu_track *t)
{
    pthread_mutex_lock(&t->mu);
    free(t->cells);
    t->cells = NULL;
    t->cap = t->filled = 0;
    pthread_mutex_unlock(&t->mu);
}

void kgpu_track_forked(kgpu_track *t)
{
    pthread_mutex_init(&t->mu, NULL);
    free(t->cells);
    t->cells = NULL;
    t->cap = t->filled = 0;
}

/* Bytes per channel of a CUarray_format; 0 for formats this table does not know. */
static unsigned format_bytes(int format)
{
    switch (format) {
    case 0x01: /* UNSIGNED_INT8 */
    case 0x08: /* SIGNED_INT8 */
    case 0xb0: /* NV12 (8-bit luma; chroma planes are smaller) */
    case 0xc0: /* UNORM_INT8X1 */
    case 0xc6: /* SNORM_INT8X1 */
        return 1;
    case 0x02: /* UNSIGNED_INT16 */
    case 0x09: /* SIGNED_INT16 */
    case 0x10: /* HALF */
    case 0xc1: /* UNORM_INT8X2 */
    case 0xc3: /* UNORM_INT16X1 */
    case 0xc7: /* SNORM_INT8X2 */
    case 0xc9: /* SNORM_INT16X1 */
        return 2;
    case 0x03: /* UNSIGNED_INT32 */
    case 0x0a: /* SIGNED_INT32 */
    case 0x20: /* FLOAT */
    case 0xc2: /* UNORM_INT8X4 */
    case 0xc4: /* UNORM_INT16X2 */
    case 0xc8: /* SNORM_INT8X4 */
    case 0xca: /* SNORM_INT16X2 */
        return 4;
    case 0xc5: /* UNORM_INT16X4 */
    case 0xcb: /* SNORM_INT16X4 */
        return 8;
    default:
        return 0;
    }
}

static int mul(uint64_t *acc, uint64_t v)
{
    if (v != 0 && *acc > UINT64_MAX / v)
        return -1;
    *acc *= v;
    return 0;
}

uint64_t kgpu_track_array_bytes(size_t width, size_t height, size_t depth, int format,
                                unsigned channels, unsigned flags, unsigned levels)
{
    unsigned per = format_bytes(format);
    if (per == 0)
        per = 16; /* block-compressed and newer formats: never less than they take */
    uint64_t total = 0;
    uint64_t w = width ? width : 1, h = height ? height : 1, d = depth ? depth : 1;
    if (levels == 0)
        levels = 1;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        uint64_t b = per;
        if (mul(&b, channels ? channels : 1) || mul(&b, w) || mul(&b, h) || mul(&b, d) ||
            total > UINT64_MAX - b)
            return UINT64_MAX;
        total += b;
        if (w == 1 && h == 1 && d == 1)
            break;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        if (!(flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP)))
            d = d > 1 ? d / 2 : 1; /* layers and cube faces stay */
    }
    return total;
}

/* ---- listing (the compute gate's drain: every context made on a device) ---- */

size_t kgpu_track_keys(kgpu_track *t, int kind, int dev, uint64_t *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; t->cells != NULL && i < t->cap; i++) {
        const kgpu_track_rec *c = &t->cells[i];
        if (c->kind != kind || c->dev != dev)
            continue;
        if (n < max)
            out[n] = c->key;
        n++;
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}
