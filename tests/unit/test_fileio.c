/*
 * Unit tests of kgpu_remove_tree (src/common/fileio.c): the node agents
 * remove, as root, folders that a tenant's container can still write into.
 * Whatever the container puts there or swaps in while the removal runs, no
 * file outside the folder may go (issue 24, item 4: path-based nftw removal
 * followed a swapped-in symlink and removed host files).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "fileio.h"

static char base[256]; /* a fresh folder per test */

static int setup(void **state)
{
    snprintf(base, sizeof(base), "/tmp/kgpu-fileio-XXXXXX");
    return mkdtemp(base) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    kgpu_error err;
    chmod(base, 0755);
    return kgpu_remove_tree(base, &err);
}

static void touch(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "x", 1), 1);
    close(fd);
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* base/outside with n files: what must survive. */
static void make_outside(int n)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/outside", base);
    assert_int_equal(mkdir(p, 0755), 0);
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof(p), "%s/outside/f%d", base, i);
        touch(p);
    }
}

static int outside_left(int n)
{
    int left = 0;
    char p[512];
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof(p), "%s/outside/f%d", base, i);
        left += exists(p);
    }
    return left;
}

/* A tree with files, subfolders and symlinks to outside: the tree goes, outside stays. */
static void removes_the_tree_not_what_links_point_at(void **unused)
{
    make_outside(5);
    char p[512], t[512];
    snprintf(p, sizeof(p), "%s/pod", base);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/pod/a", base);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/pod/a/b", base);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/pod/a/b/limits", base);
    touch(p);
    snprintf(p, sizeof(p), "%s/pod/file", base);
    touch(p);
    snprintf(t, sizeof(t), "%s/outside", base);
    snprintf(p, sizeof(p), "%s/pod/a/dirlink", base);
    assert_int_equal(symlink(t, p), 0);
    snprintf(t, sizeof(t), "%s/outside/f0", base);
    snprintf(p, sizeof(p), "%s/pod/filelink", base);
    assert_int_equal(symlink(t, p), 0);
    snprintf(p, sizeof(p), "%s/pod/dangling", base);
    assert_int_equal(symlink("/nonexistent/kgpu", p), 0);
    kgpu_error err;
    kgpu_error_clear(&err);
    snprintf(p, sizeof(p), "%s/pod", base);
    assert_int_equal(kgpu_remove_tree(p, &err), 0);
    assert_false(exists(p));
    assert_int_equal(outside_left(5), 5);
    /* Gone already: nothing to do, no error. */
    assert_int_equal(kgpu_remove_tree(p, &err), 0);
}

/* The folder itself a symlink: refused, with the path, and the target untouched. */
static void the_folder_itself_a_symlink_is_refused(void **unused)
{
    make_outside(3);
    char p[512], t[512];
    snprintf(t, sizeof(t), "%s/outside", base);
    snprintf(p, sizeof(p), "%s/pod", base);
    assert_int_equal(symlink(t, p), 0);
    kgpu_error err;
    kgpu_error_clear(&err);
    assert_int_equal(kgpu_remove_tree(p, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, p));
    assert_int_equal(outside_left(3), 3);
    assert_true(exists(p));
    snprintf(p, sizeof(p), "%s/outside/f0", base);
    assert_int_equal(kgpu_remove_tree(p, &err), KGPU_EINVAL); /* a file is not a folder */
    assert_true(exists(p));
}

/* Deeper than the bound: what is within it goes, the rest is reported, nothing outside moves. */
static void depth_is_bounded(void **unused)
{
    char p[4096];
    int n = snprintf(p, sizeof(p), "%s/pod", base);
    assert_int_equal(mkdir(p, 0755), 0);
    for (int i = 0; i < KGPU_REMOVE_DEPTH + 4; i++) {
        n += snprintf(p + n, sizeof(p) - (size_t)n, "/d");
        assert_int_equal(mkdir(p, 0755), 0);
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    snprintf(p, sizeof(p), "%s/pod", base);
    assert_int_equal(kgpu_remove_tree(p, &err), KGPU_ERANGE);
    assert_non_null(strstr(err.msg, "deeper than"));
    /* What is left below the bound, by hand, deepest first. */
    n = snprintf(p, sizeof(p), "%s/pod", base);
    for (int i = 0; i < KGPU_REMOVE_DEPTH + 4; i++)
        n += snprintf(p + n, sizeof(p) - (size_t)n, "/d");
    for (char *slash; exists(p) && rmdir(p) == 0 && (slash = strrchr(p, '/')) != NULL;)
        *slash = '\0';
}

/* ---- the race: a container swapping a subfolder for a symlink while root removes ---- */

typedef struct swapper {
    char dir[512], link_target[512], moved[512];
    atomic_bool stop;
} swapper;

static void *swap_loop(void *arg)
{
    swapper *s = arg;
    for (int i = 0; !atomic_load(&s->stop) && i < 2000000; i++) {
        /* The container's move: its subfolder out of the way, a symlink to the host in its place. */
        if (rename(s->dir, s->moved) == 0) {
            if (symlink(s->link_target, s->dir) != 0) {
                (void)rename(s->moved, s->dir);
                continue;
            }
            (void)unlink(s->dir);
            (void)rename(s->moved, s->dir);
        }
    }
    return NULL;
}

static void a_racing_container_cannot_redirect_it(void **unused)
{
    enum { FILES = 40, ROUNDS = 150 };
    make_outside(FILES);
    int removed_outside = 0;
    for (int round = 0; round < ROUNDS; round++) {
        char p[512];
        swapper *s = calloc(1, sizeof(*s));
        assert_non_null(s);
        snprintf(p, sizeof(p), "%s/pod", base);
        assert_int_equal(mkdir(p, 0755), 0);
        snprintf(s->dir, sizeof(s->dir), "%s/pod/sub", base);
        snprintf(s->moved, sizeof(s->moved), "%s/pod/sub.moved", base);
        snprintf(s->link_target, sizeof(s->link_target), "%s/outside", base);
        assert_int_equal(mkdir(s->dir, 0755), 0);
        for (int i = 0; i < FILES; i++) {
            snprintf(p, sizeof(p), "%s/pod/sub/f%d", base, i); /* same names as outside's */
            touch(p);
        }
        pthread_t t;
        atomic_init(&s->stop, false);
        assert_int_equal(pthread_create(&t, NULL, swap_loop, s), 0);
        kgpu_error err;
        snprintf(p, sizeof(p), "%s/pod", base);
        /* The swapper recreates entries: repeat until the folder is gone. */
        for (int tries = 0; tries < 1000 && exists(p); tries++)
            (void)kgpu_remove_tree(p, &err);
        atomic_store(&s->stop, true);
        pthread_join(t, NULL);
        (void)kgpu_remove_tree(p, &err);
        assert_false(exists(p));
        removed_outside += FILES - outside_left(FILES);
        free(s);
        if (removed_outside > 0)
            break;
    }
    assert_int_equal(removed_outside, 0);
    assert_int_equal(outside_left(FILES), FILES);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(removes_the_tree_not_what_links_point_at, setup, teardown),
        cmocka_unit_test_setup_teardown(the_folder_itself_a_symlink_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(depth_is_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(a_racing_container_cannot_redirect_it, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
