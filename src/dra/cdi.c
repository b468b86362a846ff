/*
 * A prepared claim as the container runtime sees it: a CDI spec file
 * (Container Device Interface; containerd 1.7+ and CRI-O inject what it
 * names) with one device per request of the claim. The device's container
 * edits are the device plugin's Allocate answer, built by the same code
 * (src/contract, contract_response_build): NVIDIA_VISIBLE_DEVICES and kgpu's env,
 * the limits file, the accounting folder, libkgpu-limit.so and the
 * ld.so.preload that loads it, the GPUs' schedules. So a container is
 * isolated the same whichever path gave it its GPU.
 *
 * Host layout under the DRA state folder (the contract's, with the claim in
 * the pod's place): pods/<claim uid>/<request>.limits, pods/<claim uid>/shared,
 * ld.so.preload, sched/<uuid>.sched. Every container of every pod that shares
 * a claim shares its limits and its accounting: a claim is one share.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dra.h"
#include "fileio.h"

void dra_cdi_name(const dra_claim *c, int r, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s-%s", c->uid, c->reqs[r]);
}

void dra_cdi_id(const dra_claim *c, int r, char *buf, size_t cap)
{
    char name[DRA_UID_MAX + DRA_REQ_MAX + 2];
    dra_cdi_name(c, r, name, sizeof(name));
    snprintf(buf, cap, "%s=%s", DRA_CDI_KIND, name);
}

void dra_cdi_path(const char *cdi_dir, const char *uid, char *buf, size_t cap)
{
    /* <vendor>-<class>_<id>.json, the CDI library's own naming of transient specs. */
    snprintf(buf, cap, "%s/kgpu.io-gpu_%s.json", cdi_dir, uid);
}

const char *dra_alloc_visible_uuid(const dra_alloc *a)
{
    return a->profile[0] != '\0' && a->mig_uuid[0] != '\0' ? a->mig_uuid : a->uuid;
}

void dra_claim_target(const dra_claim *c, int r, int64_t unit_mib, contract_target *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->ns, sizeof(out->ns), "%s", c->ns);
    snprintf(out->name, sizeof(out->name), "%s", c->name);
    snprintf(out->uid, sizeof(out->uid), "%s", c->uid);
    snprintf(out->container, sizeof(out->container), "%s", c->reqs[r]);
    int64_t mem = 0;
    for (int i = 0; i < c->nallocs; i++) {
        const dra_alloc *a = &c->allocs[i];
        if (a->req != r)
            continue;
        /*
         * Two shares of one GPU (two shareIDs) are one GPU with both shares.
         * A MIG instance is what the container sees: its UUID stands for the
         * GPU (NVIDIA_VISIBLE_DEVICES=MIG-..., its schedule, its limits).
         */
        const char *uuid = dra_alloc_visible_uuid(a);
        contract_share *g = NULL;
        for (int k = 0; k < out->ngpus && g == NULL; k++)
            if (strcmp(out->gpus[k].uuid, uuid) == 0)
                g = &out->gpus[k];
        if (g == NULL) {
            if (out->ngpus >= KGPU_MAX_GPUS_PER_NODE)
                continue;
            g = &out->gpus[out->ngpus++];
            g->index = a->index;
            snprintf(g->uuid, sizeof(g->uuid), "%s", uuid);
        }
        g->milli = g->milli + a->milli > 1000 ? 1000 : g->milli + a->milli;
        g->limit_pct = a->limit_pct > g->limit_pct ? a->limit_pct : g->limit_pct;
        g->memory_mib += a->memory_mib;
        mem += a->memory_mib;
    }
    out->pod_units = unit_mib > 0 ? mem / unit_mib : 0;
}

static json_t *edits(const contract_response *resp)
{
    json_t *env = json_array(), *mounts = json_array();
    for (int i = 0; i < resp->nenv; i++) {
        char kv[sizeof(resp->env[i].key) + sizeof(resp->env[i].value) + 2];
        snprintf(kv, sizeof(kv), "%s=%s", resp->env[i].key, resp->env[i].value);
        json_array_append_new(env, json_string(kv));
    }
    for (int i = 0; i < resp->nmounts; i++) {
        const contract_mount *m = &resp->mounts[i];
        /* What containerd makes of a device plugin's Mount: a bind mount, ro or rw. */
        json_array_append_new(
            mounts, json_pack("{s:s, s:s, s:s, s:[s, s, s, s]}", "hostPath", m->host_path,
                              "containerPath", m->container_path, "type", "bind", "options",
                              m->read_only ? "ro" : "rw", "nosuid", "nodev", "rbind"));
    }
    return json_pack("{s:o, s:o}", "env", env, "mounts", mounts);
}

json_t *dra_cdi_spec(const dra_claim *c, const contract_inventory *inv,
                     const contract_paths *paths)
{
    json_t *devices = json_array();
    for (int r = 0; r < c->nreqs; r++) {
        contract_target m;
        dra_claim_target(c, r, inv->unit_mib, &m);
        contract_response resp;
        contract_response_build(&m, inv, paths, &resp);
        char name[DRA_UID_MAX + DRA_REQ_MAX + 2];
        dra_cdi_name(c, r, name, sizeof(name));
        json_array_append_new(devices, json_pack("{s:s, s:o}", "name", name, "containerEdits",
                                                 edits(&resp)));
    }
    /* 0.5.0: env and mounts need nothing newer, and containerd 1.7.0's CDI reads it. */
    return json_pack("{s:s, s:s, s:o}", "cdiVersion", "0.5.0", "kind", DRA_CDI_KIND, "devices",
                     devices);
}

static int write_atomic(const char *path, const char *text, mode_t mode, kgpu_error *err)
{
    char tmp[1200];
    /* ".tmp" after ".json": the runtime's CDI cache reads only *.json and *.yaml. */
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    size_t len = strlen(text);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        return kgpu_error_set(err, KGPU_EIO, "writing %s: %s", tmp, strerror(e));
    }
    if (close(fd) != 0 || fchmodat(AT_FDCWD, tmp, mode, 0) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return kgpu_error_set(err, KGPU_EIO, "writing %s: %s", path, strerror(e));
    }
    return 0;
}

int dra_claim_files_write(const dra_claim *c, const contract_inventory *inv,
                          const contract_paths *paths, const char *cdi_dir, kgpu_error *err)
{
    if (!dra_safe_name(c->uid))
        return kgpu_error_set(err, KGPU_EINVAL, "claim UID '%.64s' cannot name a file", c->uid);
    for (int r = 0; r < c->nreqs; r++) {
        contract_target m;
        dra_claim_target(c, r, inv->unit_mib, &m);
        int rc = contract_write_files(&m, paths, err);
        if (rc != 0)
            return rc;
    }
    if (mkdir(cdi_dir, 0755) != 0 && errno != EEXIST)
        return kgpu_error_set(err, KGPU_EIO, "CDI folder %s: %s", cdi_dir, strerror(errno));
    json_t *spec = dra_cdi_spec(c, inv, paths);
    char *text = spec != NULL ? json_dumps(spec, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(spec);
    if (text == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory writing a CDI spec");
    char path[1100];
    dra_cdi_path(cdi_dir, c->uid, path, sizeof(path));
    int rc = write_atomic(path, text, 0644, err);
    free(text);
    return rc;
}

int dra_claim_files_remove(const char *uid, const contract_paths *paths, const char *cdi_dir,
                           kgpu_error *err)
{
    if (!dra_safe_name(uid))
        return kgpu_error_set(err, KGPU_EINVAL, "claim UID '%.64s' cannot name a file", uid);
    char path[1200];
    dra_cdi_path(cdi_dir, uid, path, sizeof(path));
    /* The spec first: once it is gone no new container can be given the claim. */
    if (unlink(path) != 0 && errno != ENOENT)
        return kgpu_error_set(err, KGPU_EIO, "removing %s: %s", path, strerror(errno));
    snprintf(path, sizeof(path), "%s/pods/%s", paths->state_dir, uid);
    /* Root removing what a container may still write: never through its symlinks. */
    return kgpu_remove_tree(path, err);
}
