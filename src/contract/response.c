/*
 * The container contract's text (contract.h): a target's limits file,
 * environment and mounts. Pure: the host files are files.c's.
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
 * The GPUs themselves: where the caller asks (contract_cdi_devices), one
 * CDI device per GPU ("nvidia.com/gpu=<uuid>", or "=<index>"), which the container runtime
 * resolves from the CDI spec nvidia-ctk generates, so the GPUs a container
 * gets come from kubelet's CRI call and never from anything the container
 * itself sets. NVIDIA_VISIBLE_DEVICES names the same GPUs either way: with
 * the toolkit told to ignore the variable in unprivileged containers (the
 * setting docs/install-device-plugin.md requires) it is inert, and where it
 * is still accepted it overrides an image's NVIDIA_VISIBLE_DEVICES=all.
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
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"

static int core_pct(const contract_share *g)
{
    /* A memory-only share is not limited in compute. */
    return g->milli > 0 ? (g->milli + 9) / 10 : 100;
}

bool contract_sched_shared(const contract_target *t, int i)
{
    /* As the library decides (hooks_launch.c): only a core_pct below 100 takes turns. */
    return core_pct(&t->gpus[i]) < 100;
}

bool contract_takes_turns(const contract_target *t, const contract_paths *paths, int i)
{
    return paths->mps_pipe_dir == NULL && contract_sched_shared(t, i);
}

int contract_sharing_parse(const char *s, contract_sharing *out)
{
    if (strcmp(s, "sched") == 0)
        *out = CONTRACT_SHARING_SCHED;
    else if (strcmp(s, "mps") == 0)
        *out = CONTRACT_SHARING_MPS;
    else
        return -1;
    return 0;
}

/*
 * The burst ceiling of a compute share (docs/shim.md, "Request and
 * limit"): 100 (none) unless asked lower; never below the share itself.
 */
static int core_limit_pct(const contract_share *g)
{
    int pct = core_pct(g), lim = g->limit_pct;
    return lim <= 0 || lim >= 100 ? 100 : lim < pct ? pct : lim;
}

char *contract_limits_text(const contract_target *t)
{
    size_t cap = 64 + (size_t)t->ngpus * (KGPU_GPU_UUID_MAX + 100);
    char *buf = malloc(cap);
    if (buf == NULL)
        return NULL;
    size_t len = (size_t)snprintf(buf, cap, "# kgpu limits v1\n");
    for (int i = 0; i < t->ngpus && len < cap; i++) {
        const contract_share *g = &t->gpus[i];
        len += (size_t)snprintf(buf + len, cap - len,
                                "device %d uuid=%s memory_mib=%" PRId64 " core_pct=%d", i, g->uuid,
                                g->memory_mib, core_pct(g));
        if (len < cap && core_pct(g) < 100 && core_limit_pct(g) < 100)
            len += (size_t)snprintf(buf + len, cap - len, " core_limit_pct=%d", core_limit_pct(g));
        if (len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "\n");
    }
    return buf;
}

int contract_inventory_find(const contract_inventory *inv, const char *uuid)
{
    for (int g = 0; g < inv->ngpus; g++)
        if (strcmp(inv->gpus[g].uuid, uuid) == 0)
            return g;
    return -1;
}

static bool alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

int contract_cdi_kind_check(const char *kind, kgpu_error *err)
{
    const char *slash = strchr(kind, '/');
    bool ok = slash != NULL && slash > kind && slash[1] != '\0' && strchr(slash + 1, '/') == NULL &&
              alnum(kind[0]) && alnum(slash[-1]) && strlen(kind) < 128;
    for (const char *c = kind; ok && c < slash; c++)
        ok = alnum(*c) || *c == '.' || *c == '-' || *c == '_';
    for (const char *c = slash ? slash + 1 : kind; ok && *c; c++)
        ok = alnum(*c) || *c == '-' || *c == '_';
    if (!ok)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "CDI kind '%.128s' is not <vendor>/<class> (for NVIDIA's GPUs as "
                              "nvidia-ctk names them: %s)",
                              kind, CONTRACT_CDI_KIND_NVIDIA);
    return 0;
}

void contract_cdi_devices(const contract_target *t, const char *kind, bool by_index,
                          contract_response *out)
{
    out->ncdi = 0;
    for (int i = 0; i < t->ngpus && i < KGPU_MAX_GPUS_PER_NODE; i++) {
        if (by_index)
            snprintf(out->cdi[i], sizeof(out->cdi[i]), "%s=%d", kind, t->gpus[i].index);
        else
            snprintf(out->cdi[i], sizeof(out->cdi[i]), "%s=%s", kind, t->gpus[i].uuid);
        out->ncdi = i + 1;
    }
}

static void env(contract_response *out, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void env(contract_response *out, const char *key, const char *fmt, ...)
{
    if (out->nenv >= (int)(sizeof(out->env) / sizeof(out->env[0])))
        return;
    contract_kv *kv = &out->env[out->nenv++];
    snprintf(kv->key, sizeof(kv->key), "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kv->value, sizeof(kv->value), fmt, ap);
    va_end(ap);
}

static void mount(contract_response *out, const char *container_path, bool ro, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void mount(contract_response *out, const char *container_path, bool ro, const char *fmt, ...)
{
    if (out->nmounts >= CONTRACT_MAX_MOUNTS)
        return;
    contract_mount *m = &out->mounts[out->nmounts++];
    snprintf(m->container_path, sizeof(m->container_path), "%s", container_path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->host_path, sizeof(m->host_path), fmt, ap);
    va_end(ap);
    m->read_only = ro;
}

void contract_response_build(const contract_target *t, const contract_inventory *inv,
                             const contract_paths *paths, contract_response *out)
{
    memset(out, 0, sizeof(*out));
    if (t->ngpus == 0)
        return;
    char uuids[CONTRACT_ENV_VALUE_MAX] = ""; /* each UUID and its comma or NUL */
    int64_t mem = 0;
    for (int i = 0; i < t->ngpus; i++) {
        if (i > 0)
            strcat(uuids, ",");
        strcat(uuids, t->gpus[i].uuid);
        mem += t->gpus[i].memory_mib;
    }
    env(out, "NVIDIA_VISIBLE_DEVICES", "%s", uuids);
    /* Shares are split evenly, so every GPU of the container has the same limits. */
    env(out, "KGPU_MEMORY_LIMIT_MIB", "%" PRId64, t->gpus[0].memory_mib);
    env(out, "KGPU_CORE_LIMIT_PCT", "%d", core_pct(&t->gpus[0]));
    env(out, "KGPU_SHARED_DIR", "%s", CONTRACT_SHARED_PATH);
    env(out, "KGPU_CONTAINER", "%s", t->container);
    /* gpushare's variables, in its units (the memory unit). */
    int64_t unit = inv->unit_mib > 0 ? inv->unit_mib : 1;
    int at = contract_inventory_find(inv, t->gpus[0].uuid);
    int64_t dev_mib = at >= 0 ? inv->gpus[at].memory_mib : 0;
    env(out, "ALIYUN_COM_GPU_MEM_CONTAINER", "%" PRId64, mem / unit);
    env(out, "ALIYUN_COM_GPU_MEM_DEV", "%" PRId64, dev_mib / unit);
    env(out, "ALIYUN_COM_GPU_MEM_IDX", "%d", t->gpus[0].index);
    env(out, "ALIYUN_COM_GPU_MEM_POD", "%" PRId64, t->pod_units);

    mount(out, CONTRACT_LIMITS_PATH, true, "%s/pods/%s/%s.limits", paths->state_dir, t->uid,
          t->container);
    mount(out, CONTRACT_SHARED_PATH, false, "%s/pods/%s/shared", paths->state_dir, t->uid);
    if (paths->shim_lib != NULL) {
        mount(out, CONTRACT_SHIM_PATH, true, "%s", paths->shim_lib);
        mount(out, CONTRACT_PRELOAD_PATH, true, "%s/ld.so.preload", paths->state_dir);
    }
    if (paths->mps_pipe_dir != NULL) {
        /*
         * The MPS client's limits, per process: its share of the SMs, and
         * its memory share on each device it sees (numbered as
         * NVIDIA_VISIBLE_DEVICES lists them; the shares are the same on all).
         */
        char lim[sizeof(out->env[0].value)] = "";
        size_t len = 0;
        for (int i = 0; i < t->ngpus && len < sizeof(lim); i++)
            len += (size_t)snprintf(lim + len, sizeof(lim) - len, "%s%d=%" PRId64 "M",
                                    i ? "," : "", i, t->gpus[i].memory_mib);
        env(out, "CUDA_MPS_PIPE_DIRECTORY", "%s", CONTRACT_MPS_PIPE_PATH);
        env(out, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "%d", core_pct(&t->gpus[0]));
        env(out, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "%s", lim);
        mount(out, CONTRACT_MPS_PIPE_PATH, false, "%s", paths->mps_pipe_dir);
    }
    /* Each GPU's schedule, shared with the other containers taking turns on it. */
    for (int i = 0; i < t->ngpus; i++) {
        if (!contract_takes_turns(t, paths, i))
            continue;
        char in_container[256];
        snprintf(in_container, sizeof(in_container), "%s/%s.sched", CONTRACT_SCHED_PATH,
                 t->gpus[i].uuid);
        mount(out, in_container, false, "%s/sched/%s.sched", paths->state_dir, t->gpus[i].uuid);
    }
}

