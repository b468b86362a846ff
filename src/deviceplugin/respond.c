/*
 * What a matched container gets: its limits file, environment and mounts,
 * and the AllocateResponse that carries them to kubelet.
 *
 * Host layout under the state directory:
 *   ld.so.preload                 one line: the shim's path in the container
 *   pods/<uid>/<container>.limits the container's limits (mode 0444)
 *   pods/<uid>/shared/            the pod's accounting directory (mode 1777:
 *                                 the containers' processes may run as any user)
 *   sched/                        mode 0700: no host user but root reaches it
 *   sched/<uuid>.sched            the GPU's schedule (mode 0666: containers of any
 *                                 user share it), node-wide, kept for the node's life
 *
 * A container with a compute share gets its GPUs' schedule files, one file
 * bind mount each, never the directory: it cannot reach another GPU's
 * schedule, nor replace or remove its own (a mount point cannot be unlinked).
 *
 * In MPS mode (--sharing mps) it gets no schedule: the MPS control
 * daemon's pipe directory instead, and the MPS client variables that hold
 * each of its processes to its core share (active-thread percentage) and
 * memory share (pinned device memory per visible device). The library
 * stays preloaded: MPS's limits are per process, the container's share is
 * for all its processes together (docs/install-device-plugin.md, "MPS mode").
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deviceplugin.pb-c.h"
#include "dp.h"
#include "gpusched.h"

static int core_pct(const dp_gpu_share *g)
{
    /* A memory-only share is not limited in compute. */
    return g->milli > 0 ? (g->milli + 9) / 10 : 100;
}

bool dp_sched_shared(const dp_match *m, int i)
{
    /* As the library decides (hooks_launch.c): only a core_pct below 100 takes turns. */
    return core_pct(&m->gpus[i]) < 100;
}

/* Whether the container takes turns on GPU i through its schedule (never in MPS mode). */
static bool takes_turns(const dp_match *m, const dp_paths *paths, int i)
{
    return paths->mps_pipe_dir == NULL && dp_sched_shared(m, i);
}

int dp_sharing_parse(const char *s, dp_sharing *out)
{
    if (strcmp(s, "sched") == 0)
        *out = DP_SHARING_SCHED;
    else if (strcmp(s, "mps") == 0)
        *out = DP_SHARING_MPS;
    else
        return -1;
    return 0;
}

int dp_mps_check(const char *dir, kgpu_error *err)
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

char *dp_limits_text(const dp_match *m)
{
    size_t cap = 64 + (size_t)m->ngpus * (KGPU_UUID_MAX + 80);
    char *buf = malloc(cap);
    if (buf == NULL)
        return NULL;
    size_t len = (size_t)snprintf(buf, cap, "# kgpu limits v1\n");
    for (int i = 0; i < m->ngpus && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len,
                                "device %d uuid=%s memory_mib=%" PRId64 " core_pct=%d\n", i,
                                m->gpus[i].uuid, m->gpus[i].memory_mib, core_pct(&m->gpus[i]));
    return buf;
}

static void env(dp_response *out, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void env(dp_response *out, const char *key, const char *fmt, ...)
{
    if (out->nenv >= (int)(sizeof(out->env) / sizeof(out->env[0])))
        return;
    dp_kv *kv = &out->env[out->nenv++];
    snprintf(kv->key, sizeof(kv->key), "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kv->value, sizeof(kv->value), fmt, ap);
    va_end(ap);
}

static void mount(dp_response *out, const char *container_path, bool ro, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void mount(dp_response *out, const char *container_path, bool ro, const char *fmt, ...)
{
    if (out->nmounts >= DP_MAX_MOUNTS)
        return;
    dp_mount *m = &out->mounts[out->nmounts++];
    snprintf(m->container_path, sizeof(m->container_path), "%s", container_path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->host_path, sizeof(m->host_path), fmt, ap);
    va_end(ap);
    m->read_only = ro;
}

void dp_response_build(const dp_match *m, const dp_inventory *inv, const dp_paths *paths,
                       dp_response *out)
{
    memset(out, 0, sizeof(*out));
    if (!m->primary || m->ngpus == 0)
        return;
    char uuids[KGPU_MAX_GPUS_PER_NODE * (KGPU_UUID_MAX + 1)] = "";
    int64_t mem = 0;
    for (int i = 0; i < m->ngpus; i++) {
        if (i > 0)
            strcat(uuids, ",");
        strcat(uuids, m->gpus[i].uuid);
        mem += m->gpus[i].memory_mib;
    }
    env(out, "NVIDIA_VISIBLE_DEVICES", "%s", uuids);
    /* Shares are split evenly, so every GPU of the container has the same limits. */
    env(out, "KGPU_MEMORY_LIMIT_MIB", "%" PRId64, m->gpus[0].memory_mib);
    env(out, "KGPU_CORE_LIMIT_PCT", "%d", core_pct(&m->gpus[0]));
    env(out, "KGPU_SHARED_DIR", "%s", DP_SHARED_PATH);
    env(out, "KGPU_CONTAINER", "%s", m->container);
    /* gpushare's variables, in its units (the memory unit). */
    int64_t unit = inv->unit_mib > 0 ? inv->unit_mib : 1;
    int64_t dev_mib = 0;
    for (int g = 0; g < inv->ngpus; g++)
        if (strcmp(inv->gpus[g].uuid, m->gpus[0].uuid) == 0)
            dev_mib = inv->gpus[g].memory_mib;
    env(out, "ALIYUN_COM_GPU_MEM_CONTAINER", "%" PRId64, mem / unit);
    env(out, "ALIYUN_COM_GPU_MEM_DEV", "%" PRId64, dev_mib / unit);
    env(out, "ALIYUN_COM_GPU_MEM_IDX", "%d", m->gpus[0].index);
    env(out, "ALIYUN_COM_GPU_MEM_POD", "%" PRId64, m->pod_units);

    mount(out, DP_LIMITS_PATH, true, "%s/pods/%s/%s.limits", paths->state_dir, m->uid,
          m->container);
    mount(out, DP_SHARED_PATH, false, "%s/pods/%s/shared", paths->state_dir, m->uid);
    if (paths->shim_lib != NULL) {
        mount(out, DP_SHIM_PATH, true, "%s", paths->shim_lib);
        mount(out, DP_PRELOAD_PATH, true, "%s/ld.so.preload", paths->state_dir);
    }
    if (paths->mps_pipe_dir != NULL) {
        /*
         * The MPS client's limits, per process: its share of the SMs, and
         * its memory share on each device it sees (numbered as
         * NVIDIA_VISIBLE_DEVICES lists them; the shares are the same on all).
         */
        char lim[sizeof(out->env[0].value)] = "";
        size_t len = 0;
        for (int i = 0; i < m->ngpus && len < sizeof(lim); i++)
            len += (size_t)snprintf(lim + len, sizeof(lim) - len, "%s%d=%" PRId64 "M",
                                    i ? "," : "", i, m->gpus[i].memory_mib);
        env(out, "CUDA_MPS_PIPE_DIRECTORY", "%s", DP_MPS_PIPE_PATH);
        env(out, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "%d", core_pct(&m->gpus[0]));
        env(out, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "%s", lim);
        mount(out, DP_MPS_PIPE_PATH, false, "%s", paths->mps_pipe_dir);
    }
    /* Each GPU's schedule, shared with the other containers taking turns on it. */
    for (int i = 0; i < m->ngpus; i++) {
        if (!takes_turns(m, paths, i))
            continue;
        char in_container[256];
        snprintf(in_container, sizeof(in_container), "%s/%s.sched", DP_SCHED_PATH,
                 m->gpus[i].uuid);
        mount(out, in_container, false, "%s/sched/%s.sched", paths->state_dir, m->gpus[i].uuid);
    }
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

int dp_write_pod_files(const dp_match *m, const dp_paths *paths, kgpu_error *err)
{
    if (!safe_name(m->uid) || !safe_name(m->container))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "pod %s/%s: uid '%.64s' or container '%.64s' "
                              "cannot name a directory",
                              m->ns, m->name, m->uid, m->container);
    char dir[1200], path[1300], tmp[1310];
    int rc;
    snprintf(dir, sizeof(dir), "%s/pods", paths->state_dir);
    if ((rc = make_dir(dir, 0755, err)) != 0)
        return rc;
    snprintf(dir, sizeof(dir), "%s/pods/%s", paths->state_dir, m->uid);
    if ((rc = make_dir(dir, 0755, err)) != 0)
        return rc;
    snprintf(path, sizeof(path), "%s/shared", dir);
    if ((rc = make_dir(path, 01777, err)) != 0)
        return rc;
    char *text = dp_limits_text(m);
    if (text == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory writing limits");
    snprintf(path, sizeof(path), "%s/%s.limits", dir, m->container);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    /* Written beside and renamed: a container never sees half a file. */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
    size_t len = strlen(text);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len || fsync(fd) != 0 || close(fd) != 0 ||
        rename(tmp, path) != 0) {
        rc = kgpu_error_set(err, KGPU_EIO, "writing %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
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
    for (int i = 0; i < m->ngpus && rc == 0; i++) {
        if (!takes_turns(m, paths, i))
            continue;
        if (!safe_name(m->gpus[i].uuid))
            return kgpu_error_set(err, KGPU_EINVAL, "GPU '%.64s' cannot name a schedule file",
                                  m->gpus[i].uuid);
        if ((rc = make_dir(dir, 0700, err)) == 0)
            rc = kgpu_sched_prepare(dir, m->gpus[i].uuid, 0666, err);
    }
    return rc;
}

int dp_allocate_encode(const dp_response *resp, int n, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    V1beta1__ContainerAllocateResponse *cr = calloc((size_t)n + 1, sizeof(*cr));
    V1beta1__ContainerAllocateResponse **crp = calloc((size_t)n + 1, sizeof(*crp));
    V1beta1__ContainerAllocateResponse__EnvsEntry *ev =
        calloc((size_t)n * DP_MAX_ENV + 1, sizeof(*ev));
    V1beta1__ContainerAllocateResponse__EnvsEntry **evp =
        calloc((size_t)n * DP_MAX_ENV + 1, sizeof(*evp));
    V1beta1__Mount *mt = calloc((size_t)n * DP_MAX_MOUNTS + 1, sizeof(*mt));
    V1beta1__Mount **mtp = calloc((size_t)n * DP_MAX_MOUNTS + 1, sizeof(*mtp));
    int rc = -1;
    if (cr == NULL || crp == NULL || ev == NULL || evp == NULL || mt == NULL || mtp == NULL)
        goto out;
    for (int i = 0; i < n; i++) {
        const dp_response *r = &resp[i];
        v1beta1__container_allocate_response__init(&cr[i]);
        crp[i] = &cr[i];
        cr[i].envs = &evp[i * DP_MAX_ENV];
        cr[i].n_envs = (size_t)r->nenv;
        for (int e = 0; e < r->nenv; e++) {
            V1beta1__ContainerAllocateResponse__EnvsEntry *x = &ev[i * DP_MAX_ENV + e];
            v1beta1__container_allocate_response__envs_entry__init(x);
            x->key = (char *)r->env[e].key;
            x->value = (char *)r->env[e].value;
            evp[i * DP_MAX_ENV + e] = x;
        }
        cr[i].mounts = &mtp[i * DP_MAX_MOUNTS];
        cr[i].n_mounts = (size_t)r->nmounts;
        for (int k = 0; k < r->nmounts; k++) {
            V1beta1__Mount *x = &mt[i * DP_MAX_MOUNTS + k];
            v1beta1__mount__init(x);
            x->container_path = (char *)r->mounts[k].container_path;
            x->host_path = (char *)r->mounts[k].host_path;
            x->read_only = r->mounts[k].read_only;
            mtp[i * DP_MAX_MOUNTS + k] = x;
        }
    }
    V1beta1__AllocateResponse msg = V1BETA1__ALLOCATE_RESPONSE__INIT;
    msg.n_container_responses = (size_t)n;
    msg.container_responses = crp;
    size_t size = v1beta1__allocate_response__get_packed_size(&msg);
    *out = malloc(size ? size : 1);
    if (*out != NULL) {
        *len = v1beta1__allocate_response__pack(&msg, *out);
        rc = 0;
    }
out:
    free(cr);
    free(crp);
    free(ev);
    free(evp);
    free(mt);
    free(mtp);
    return rc;
}
