/*
 * One whole-file reader with a size bound and errors that name the path,
 * and a tree removal that a container racing it cannot redirect.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"

int kgpu_read_file_max(const char *path, size_t max, char **buf, size_t *len, kgpu_error *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kgpu_error_set(err, KGPU_EIO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    int rc = 0;
    while (b != NULL) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap)
            break;
        if (cap > max) {
            rc = kgpu_error_set(err, KGPU_ERANGE, "%s is larger than %zu bytes", path, max);
            break;
        }
        char *g = realloc(b, cap * 2 + 1);
        if (g == NULL) {
            free(b);
            b = NULL;
            break;
        }
        b = g;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (b == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory reading %s", path);
    if (rc == 0 && n > max)
        rc = kgpu_error_set(err, KGPU_ERANGE, "%s is larger than %zu bytes", path, max);
    if (rc == 0 && bad)
        rc = kgpu_error_set(err, KGPU_EIO, "cannot read %s: %s", path, strerror(errno));
    if (rc != 0) {
        free(b);
        return rc;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

/*
 * Empties the directory open as `dir` (taken over: closed here), which is
 * on device `dev`. `where` names it in errors. The first error is kept in
 * *rc/err; removal goes on with the rest.
 */
static void empty_dir(int dir, dev_t dev, const char *where, int depth, int *rc, kgpu_error *err)
{
    DIR *d = fdopendir(dir);
    if (d == NULL) {
        if (*rc == 0)
            *rc = kgpu_error_set(err, KGPU_EIO, "removing %s: %s", where, strerror(errno));
        close(dir);
        return;
    }
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        const char *name = de->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* gone meanwhile */
        if (st.st_dev != dev) {
            if (*rc == 0)
                *rc = kgpu_error_set(err, KGPU_EINVAL, "removing %s: %s is another filesystem "
                                     "(a mount): left alone", where, name);
            continue;
        }
        int flags = 0;
        if (S_ISDIR(st.st_mode)) {
            /* O_NOFOLLOW: if it became a symlink since fstatat, the open fails and unlinkat
               below removes the link. */
            int sub = depth < KGPU_REMOVE_DEPTH
                          ? openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                          : -1;
            if (sub >= 0) {
                struct stat again;
                if (fstat(sub, &again) == 0 && again.st_dev == dev)
                    empty_dir(sub, dev, where, depth + 1, rc, err);
                else
                    close(sub);
            } else if (depth >= KGPU_REMOVE_DEPTH && *rc == 0) {
                *rc = kgpu_error_set(err, KGPU_ERANGE, "removing %s: deeper than %d levels",
                                     where, KGPU_REMOVE_DEPTH);
            }
            flags = AT_REMOVEDIR;
        }
        if (unlinkat(dirfd(d), name, flags) != 0 && errno != ENOENT) {
            /* A directory that turned into a symlink or a file: remove what it is now. */
            if (!(flags == AT_REMOVEDIR && errno == ENOTDIR && unlinkat(dirfd(d), name, 0) == 0) &&
                *rc == 0)
                *rc = kgpu_error_set(err, KGPU_EIO, "removing %s: %s: %s", where, name,
                                     strerror(errno));
        }
    }
    closedir(d);
}

int kgpu_remove_tree(const char *path, kgpu_error *err)
{
    int dir = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0) {
        if (errno == ENOENT)
            return 0;
        if (errno == ELOOP || errno == ENOTDIR)
            return kgpu_error_set(err, KGPU_EINVAL, "removing %s: not a directory (a symlink or "
                                  "a file): left alone", path);
        return kgpu_error_set(err, KGPU_EIO, "removing %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(dir, &st) != 0) {
        close(dir);
        return kgpu_error_set(err, KGPU_EIO, "removing %s: %s", path, strerror(errno));
    }
    int rc = 0;
    empty_dir(dir, st.st_dev, path, 1, &rc, err);
    if (rmdir(path) != 0 && errno != ENOENT && rc == 0)
        rc = kgpu_error_set(err, KGPU_EIO, "removing %s: %s", path, strerror(errno));
    return rc;
}
