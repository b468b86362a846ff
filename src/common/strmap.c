/*
 * Open addressing with linear probing; grows at 70 % occupancy (tombstones
 * included) so probes stay short under churn.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strmap.h"

static char tombstone;
#define TOMBSTONE (&tombstone)

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

void kgpu_strmap_init(kgpu_strmap *m)
{
    memset(m, 0, sizeof(*m));
}

void kgpu_strmap_clear(kgpu_strmap *m)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key != NULL && m->slots[i].key != TOMBSTONE)
            free(m->slots[i].key);
    free(m->slots);
    memset(m, 0, sizeof(*m));
}

void kgpu_strmap_clear_free(kgpu_strmap *m)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key != NULL && m->slots[i].key != TOMBSTONE)
            free(m->slots[i].value);
    kgpu_strmap_clear(m);
}

static kgpu_strmap_entry *find(const kgpu_strmap *m, const char *key)
{
    if (m->cap == 0)
        return NULL;
    for (size_t i = hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        kgpu_strmap_entry *e = &m->slots[i];
        if (e->key == NULL)
            return NULL;
        if (e->key != TOMBSTONE && strcmp(e->key, key) == 0)
            return e;
    }
}

void *kgpu_strmap_get(const kgpu_strmap *m, const char *key)
{
    kgpu_strmap_entry *e = find(m, key);
    return e ? e->value : NULL;
}

static bool grow(kgpu_strmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 16;
    while (m->len * 10 >= cap * 5) /* after removals a rehash may not need doubling */
        cap *= 2;
    kgpu_strmap_entry *slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return false;
    for (size_t i = 0; i < m->cap; i++) {
        kgpu_strmap_entry *e = &m->slots[i];
        if (e->key == NULL || e->key == TOMBSTONE)
            continue;
        size_t j = hash(e->key) & (cap - 1);
        while (slots[j].key != NULL)
            j = (j + 1) & (cap - 1);
        slots[j] = *e;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    m->used = m->len;
    return true;
}

bool kgpu_strmap_put(kgpu_strmap *m, const char *key, void *value, void **old)
{
    kgpu_strmap_entry *e = find(m, key);
    if (e != NULL) {
        if (old != NULL)
            *old = e->value;
        e->value = value;
        return true;
    }
    if (old != NULL)
        *old = NULL;
    if ((m->used + 1) * 10 > m->cap * 7 && !grow(m))
        return false;
    char *k = strdup(key);
    if (k == NULL)
        return false;
    size_t i = hash(key) & (m->cap - 1);
    while (m->slots[i].key != NULL && m->slots[i].key != TOMBSTONE)
        i = (i + 1) & (m->cap - 1);
    if (m->slots[i].key == NULL)
        m->used++;
    m->slots[i].key = k;
    m->slots[i].value = value;
    m->len++;
    return true;
}

void *kgpu_strmap_del(kgpu_strmap *m, const char *key)
{
    kgpu_strmap_entry *e = find(m, key);
    if (e == NULL)
        return NULL;
    void *v = e->value;
    free(e->key);
    e->key = TOMBSTONE;
    e->value = NULL;
    m->len--;
    return v;
}

bool kgpu_strmap_next(const kgpu_strmap *m, size_t *i, const char **key, void **value)
{
    for (; *i < m->cap; (*i)++) {
        kgpu_strmap_entry *e = &m->slots[*i];
        if (e->key != NULL && e->key != TOMBSTONE) {
            *key = e->key;
            *value = e->value;
            (*i)++;
            return true;
        }
    }
    return false;
}
