/*
 * Corpus replay for any fuzz target, so every build runs its harness without
 * libFuzzer: each file (or every file of each directory) given on the command line
 * is fed as-is and as fixed, seeded mutations; crashes and sanitizer reports fail.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SEED_MAX_BYTES (1 << 20) /* seed files are small; a bigger one is a mistake */
#define MAX_TRUNCATION 256
#define FLIPS          300
#define REPLACEMENTS   8 /* positions per replacement byte */

static const uint8_t replacement_bytes[] = {',', '\n', '"', '\0', '|', '-', '9'};

static size_t inputs;

/* splitmix64: a fixed, portable sequence, so a failure reproduces on every machine. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Runs the target on a fresh heap copy of exactly n bytes, so over-reads hit ASan. */
static void run(const uint8_t *data, size_t n)
{
    uint8_t *copy = malloc(n > 0 ? n : 1);
    if (copy == NULL) {
        fprintf(stderr, "fuzz replay: out of memory\n");
        exit(1);
    }
    if (n > 0)
        memcpy(copy, data, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
    inputs++;
}

/* Feeds one seed and its mutations; `scratch` holds at least n bytes. */
static void replay(const uint8_t *data, size_t n, uint8_t *scratch, uint64_t seed)
{
    run(data, n);
    for (size_t k = 0; k < n && k <= MAX_TRUNCATION; k++)
        run(data, k);
    if (n == 0)
        return;
    uint64_t rng = seed;
    for (int i = 0; i < FLIPS; i++) {
        memcpy(scratch, data, n);
        uint64_t r = next_random(&rng);
        scratch[r % n] ^= (uint8_t)(1u << ((r >> 32) % 8));
        run(scratch, n);
    }
    for (size_t b = 0; b < sizeof(replacement_bytes); b++) {
        for (int i = 0; i < REPLACEMENTS; i++) {
            memcpy(scratch, data, n);
            scratch[next_random(&rng) % n] = replacement_bytes[b];
            run(scratch, n);
        }
    }
}

/* Returns 0, or -1 after saying why on stderr. */
static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return -1;
    }
    uint8_t *data = malloc(SEED_MAX_BYTES + 1);
    uint8_t *scratch = malloc(SEED_MAX_BYTES);
    if (data == NULL || scratch == NULL) {
        fprintf(stderr, "fuzz replay: out of memory\n");
        fclose(f);
        free(data);
        free(scratch);
        return -1;
    }
    size_t n = fread(data, 1, SEED_MAX_BYTES + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > SEED_MAX_BYTES) {
        fprintf(stderr, "%s: %s\n", path, bad ? "read error" : "larger than 1 MiB");
        free(data);
        free(scratch);
        return -1;
    }
    /* Seed from the file name's bytes: stable across runs, different per file. */
    uint64_t seed = 0x6b677075; /* "kgpu" */
    for (const char *p = strrchr(path, '/') ? strrchr(path, '/') + 1 : path; *p; p++)
        seed = seed * 131 + (unsigned char)*p;
    replay(data, n, scratch, seed);
    free(data);
    free(scratch);
    return 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays every regular file of dir in name order; returns the count, or -1. */
static long replay_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        perror(dir);
        return -1;
    }
    char **names = NULL;
    size_t count = 0, cap = 0;
    long rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        if (count == cap) {
            cap = cap ? cap * 2 : 64;
            char **grown = realloc(names, cap * sizeof(*names));
            if (grown == NULL) {
                rc = -1;
                break;
            }
            names = grown;
        }
        if ((names[count] = strdup(de->d_name)) == NULL) {
            rc = -1;
            break;
        }
        count++;
    }
    closedir(d);
    if (rc == 0 && count > 0)
        qsort(names, count, sizeof(*names), compare_names);
    for (size_t i = 0; i < count; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        if (rc >= 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (replay_file(path) != 0)
                rc = -1;
            else
                rc++;
        }
        free(names[i]);
    }
    free(names);
    if (rc < 0)
        fprintf(stderr, "fuzz replay: failed in %s\n", dir);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    long files = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        long n = S_ISDIR(st.st_mode) ? replay_dir(argv[i]) : (replay_file(argv[i]) == 0 ? 1 : -1);
        if (n < 0)
            return 1;
        files += n;
    }
    if (files == 0) {
        /* An empty corpus would pass while testing nothing. */
        fprintf(stderr, "fuzz replay: no seed files found\n");
        return 1;
    }
    printf("fuzz replay: %zu inputs\n", inputs);
    return 0;
}
