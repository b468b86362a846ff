/*
 * The host side of the container contract (contract.h): the files a target's
 * mounts point at, written so that a container never sees half a file, the
 * node's preload file, and the MPS control daemon's check.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "contract.h"
#include "gpusched.h"

int contract_mps_check(const char *dir, kgpu_error *err)
{
    char path[1100];
    struct stat st;
    snprintf(path, sizeof(path), "%s/control", dir);
    int found = stat(path, &st) == 0;
    if (found && S_ISFIFO(st.st_mode))
        return 0;
    return kgpu_error_set(err, KGPU_ENOENT,
                          "MPS mode: %s is %s, so no MPS control daemon serves this node; start "
                          "'nvidia-cuda-mps-control -d' with CUDA_MPS_PIPE_DIRECTORY=%s first, or "
                          "use --sharing sched",
                          path, found ? "not the daemon's control pipe" : "missing", dir);
}

/* mkdir that accepts an existing directory. */
static int make_dir(const char *path, mode_t mode, kgpu_error *err)
{
    if (mkdir(path, mode) != 0 && errno != EEXIST)
        return kgpu_error_set(err, KGPU_EIO, "mkdir %s: %s", path, strerror(errno));
    if (chmod(path, mode) != 0)
        return kgpu_error_set(err, KGPU_EIO, "chmod %s: %s", path, strerror(errno));
    return 0;
}

/* The pod UID becomes a directory name: only what UIDs are made of. */
static bool safe_name(const char *s)
{
    if (*s == '\0' || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '.' || *s == '_'))
            return false;
    return true;
}

int contract_write_files(const contract_target *t, const contract_paths *paths, kgpu_error *err)
{
    if (!safe_name(t->uid) || !safe_name(t->container))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s: uid '%.64s' or container '%.64s' "
                              "cannot name a directory",
                              t->ns, t->name, t->uid, t->container);
    char dir[1200], path[1300], tmp[1310];
    int rc;
    snprintf(dir, sizeof(dir), "%s/pods", paths->state_dir);
    if ((rc = make_dir(dir, 0755, err)) != 0)
        return rc;
    snprintf(dir, sizeof(dir), "%s/pods/%s", paths->state_dir, t->uid);
    if ((rc = make_dir(dir, 0755, err)) != 0)
        return rc;
    snprintf(path, sizeof(path), "%s/shared", dir);
    if ((rc = make_dir(path, 01777, err)) != 0)
        return rc;
    char *text = contract_limits_text(t);
    if (text == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory writing limits");
    snprintf(path, sizeof(path), "%s/%s.limits", dir, t->container);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    /* Written beside and renamed: a container never sees half a file. */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
    size_t len = strlen(text);
    /* 0444 whatever the umask: a container running as another user must read it, or has no GPU. */
    bool ok = fd >= 0 && fchmod(fd, 0444) == 0 && write(fd, text, len) == (ssize_t)len &&
              fsync(fd) == 0;
    int why = errno;
    /* Closed once, whatever failed: a second close could take another thread's new descriptor. */
    if (fd >= 0 && close(fd) != 0 && ok)
        ok = false, why = errno;
    if (ok && rename(tmp, path) != 0)
        ok = false, why = errno;
    if (!ok) {
        rc = kgpu_error_set(err, KGPU_EIO, "writing %s: %s", path, strerror(why));
        unlink(tmp);
    }
    free(text);
    if (rc != 0)
        return rc;
    /*
     * The GPUs' schedules, made here rather than by the library in the
     * container: a file the first container's process created would be
     * that user's, mode 0600, and a container running as another user
     * could not join it, silently unscheduled.
     */
    snprintf(dir, sizeof(dir), "%s/sched", paths->state_dir);
    for (int i = 0; i < t->ngpus && rc == 0; i++) {
        if (!contract_takes_turns(t, paths, i))
            continue;
        if (!safe_name(t->gpus[i].uuid))
            return kgpu_error_set(err, KGPU_EINVAL, "GPU '%.64s' cannot name a schedule file",
                                  t->gpus[i].uuid);
        if ((rc = make_dir(dir, 0700, err)) == 0)
            rc = kgpu_sched_prepare(dir, t->gpus[i].uuid, 0666, err);
    }
    return rc;
}

int contract_write_preload(const contract_paths *paths, kgpu_error *err)
{
    if (paths->shim_lib == NULL)
        return 0;
    char path[1100], tmp[1110];
    snprintf(path, sizeof(path), "%s/ld.so.preload", paths->state_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    bool ok = f != NULL && fprintf(f, "%s\n", CONTRACT_SHIM_PATH) >= 0;
    if (f != NULL && fclose(f) != 0)
        ok = false;
    if (!ok || chmod(tmp, 0644) != 0 || rename(tmp, path) != 0)
        return kgpu_error_set(err, KGPU_EIO, "writing %s: %s", path, strerror(errno));
    return 0;
}
