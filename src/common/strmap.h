/*
 * A string-keyed hash map (open addressing, linear probing, tombstones) for
 * the extender's tables: pods by UID, namespaces, shapes. Not thread-safe:
 * the owner's lock covers it. Keys are copied; values are borrowed pointers
 * the caller owns.
 */
#ifndef KGPU_STRMAP_H
#define KGPU_STRMAP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kgpu_strmap_entry {
    char *key; /* NULL empty; TOMBSTONE removed */
    void *value;
} kgpu_strmap_entry;

typedef struct kgpu_strmap {
    kgpu_strmap_entry *slots;
    size_t cap, len, used; /* used counts tombstones too */
} kgpu_strmap;

void kgpu_strmap_init(kgpu_strmap *m);
/* Frees the table and keys (not the values); the map is then empty and usable. */
void kgpu_strmap_clear(kgpu_strmap *m);
/* The same for a map that owns its values: each is free()d first. */
void kgpu_strmap_clear_free(kgpu_strmap *m);
void *kgpu_strmap_get(const kgpu_strmap *m, const char *key);
/* Inserts or replaces; returns the previous value (or NULL) through *old. false when out of memory.
 */
bool kgpu_strmap_put(kgpu_strmap *m, const char *key, void *value, void **old);
/* Removes; returns the value or NULL. */
void *kgpu_strmap_del(kgpu_strmap *m, const char *key);
/* Iteration: i from 0; returns false at the end. */
bool kgpu_strmap_next(const kgpu_strmap *m, size_t *i, const char **key, void **value);

#endif
