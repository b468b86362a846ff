/*
 * The allocation table (track.h): linear probing on a power-of-two table,
 * tombstones for removals, rebuilt when live plus dead cells pass half. A
 * pair of hooked calls (allocate, free) costs one put and one take, each a
 * lock, a hash and usually one or two probes.
 */
#include <stdlib.h>
#include <string.h>

#include "track.h"

#define TOMBSTONE 0xff
#define MIN_CAP   1024

#define ARRAY3D_LAYERED 0x01 /* CUDA_ARRAY3D_LAYERED: depth counts layers */
#define ARRAY3D_CUBEMAP 0x04 /* CUDA_ARRAY3D_CUBEMAP: depth counts faces */

static size_t hash(int kind, uint64_t key)
{
    uint64_t z = key ^ ((uint64_t)kind << 56);
    z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdULL;
    z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ULL;
    return (size_t)(z ^ (z >> 33));
}

/* Lock held. Index of (kind, key), or of the cell to put it in when absent (`found` 0). */
static size_t probe(const kgpu_track *t, int kind, uint64_t key, int *found)
{
    size_t mask = t->cap - 1, i = hash(kind, key) & mask, free_cell = SIZE_MAX;
    for (;;) {
        const kgpu_track_rec *c = &t->cells[i];
        if (c->kind == 0) {
            *found = 0;
            return free_cell != SIZE_MAX ? free_cell : i;
        }
        if (c->kind == TOMBSTONE) {
            if (free_cell == SIZE_MAX)
                free_cell = i;
        } else if (c->kind == kind && c->key == key) {
            *found = 1;
            return i;
        }
        i = (i + 1) & mask;
    }
}

/* Lock held. Rebuilds into `cap` cells (dropping tombstones); -1 when out of memory. */
static int rebuild(kgpu_track *t, size_t cap)
{
    kgpu_track_rec *old = t->cells;
    size_t old_cap = t->cap;
    kgpu_track_rec *cells = calloc(cap, sizeof(*cells));
    if (cells == NULL)
        return -1;
    t->cells = cells;
    t->cap = cap;
    t->filled = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].kind == 0 || old[i].kind == TOMBSTONE)
            continue;
        int found;
        size_t j = probe(t, old[i].kind, old[i].key, &found);
        cells[j] = old[i];
        t->filled++;
    }
    free(old);
    return 0;
}

static size_t live(const kgpu_track *t)
{
    size_t n = 0;
    for (size_t i = 0; i < t->cap; i++)
        n += t->cells[i].kind != 0 && t->cells[i].kind != TOMBSTONE;
    return n;
}

int kgpu_track_put(kgpu_track *t, const kgpu_track_rec *rec)
{
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    if (t->cells == NULL && rebuild(t, MIN_CAP) != 0) {
        rc = -1;
        goto out;
    }
    if ((t->filled + 1) * 2 > t->cap) {
        size_t n = live(t);
        if (rebuild(t, (n + 1) * 4 > t->cap ? t->cap * 2 : t->cap) != 0) {
            rc = -1;
            goto out;
        }
    }
    int found;
    size_t i = probe(t, rec->kind, rec->key, &found);
    if (!found && t->cells[i].kind == 0)
        t->filled++;
    t->cells[i] = *rec;
out:
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int kgpu_track_take(kgpu_track *t, int kind, uint64_t key, kgpu_track_rec *out)
{
    int found = 0;
    pthread_mutex_lock(&t->mu);
    if (t->cells != NULL) {
        size_t i = probe(t, kind, key, &found);
        if (found) {
            *out = t->cells[i];
            t->cells[i].kind = TOMBSTONE;
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
    for (size_t i = 0; i < t->cap; i++) {
        kgpu_track_rec *c = &t->cells[i];
        if (c->kind == 0 || c->kind == TOMBSTONE || c->ctx != ctx)
            continue;
        if (c->dev >= 0 && c->dev < KGPU_SHIM_MAX_DEVICES)
            bytes[c->dev] += c->bytes;
        c->kind = TOMBSTONE;
        n++;
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

size_t kgpu_track_count(kgpu_track *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->cells != NULL ? live(t) : 0;
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
