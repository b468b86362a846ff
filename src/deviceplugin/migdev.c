/*
 * Static MIG on the device-plugin path (dp.h, "migdev.c"): which of the
 * instances an operator made are advertised under which resource, and the
 * contract's target for a container given some. Pure: the plugin lists the
 * instances through NVML and hands them here.
 *
 * The names follow NVIDIA's device plugin, so manifests move over unchanged:
 * the single strategy calls every MIG device nvidia.com/gpu, which only
 * means something when all units are alike (the same profile, and no whole
 * GPU beside them); the mixed strategy names each profile's resource
 * nvidia.com/mig-<profile>. Device IDs are the MIG devices' UUIDs, which
 * kubelet keeps in its checkpoint and the runtime takes in
 * NVIDIA_VISIBLE_DEVICES.
 */
#include <stdio.h>
#include <string.h>

#include "dp.h"

int dp_mig_strategy_parse(const char *s, dp_mig_strategy *out)
{
    if (strcmp(s, "none") == 0)
        *out = DP_MIG_NONE;
    else if (strcmp(s, "single") == 0)
        *out = DP_MIG_SINGLE;
    else if (strcmp(s, "mixed") == 0)
        *out = DP_MIG_MIXED;
    else
        return -1;
    return 0;
}

bool dp_mig_profile_name(const kgpu_gpu_info *g, int nvml_profile, char *out, size_t cap)
{
    if (cap > 0)
        out[0] = '\0';
    const kgpu_mig_model *m = kgpu_mig_model_find(g->model, g->memory_mib);
    for (int i = 0; m != NULL && i < m->nprofiles; i++)
        if (m->profiles[i].nvml_profile == nvml_profile) {
            snprintf(out, cap, "%s", m->profiles[i].name);
            return true;
        }
    return false;
}

void dp_mig_dev_of(const kgpu_gpu_info *g, const kgpu_nvml_mig *m, dp_mig_dev *out)
{
    memset(out, 0, sizeof(*out));
    out->gpu_index = g->index;
    snprintf(out->gpu_uuid, sizeof(out->gpu_uuid), "%s", g->uuid);
    snprintf(out->uuid, sizeof(out->uuid), "%s", m->uuid);
    (void)dp_mig_profile_name(g, m->nvml_profile, out->profile, sizeof(out->profile));
    out->memory_mib = m->memory_mib;
    out->gi_id = m->gi_id;
    out->ci_id = m->ci_id;
    out->numa = g->numa;
    out->healthy = g->healthy;
}

/* Appends to why (a sentence per reason), keeping it terminated. */
static void say(char *why, size_t cap, const char *text)
{
    size_t len = strlen(why);
    if (len + 1 < cap)
        snprintf(why + len, cap - len, "%s%s", len > 0 ? "; " : "", text);
}

/*
 * A device ID kubelet and the runtime both take, and a folder name: "MIG-"
 * and none of the separators kgpu or the runtime use (drivers before R470
 * named MIG devices "MIG-GPU-<uuid>/<gi>/<ci>", which is neither).
 */
static bool usable_uuid(const char *u)
{
    return strncmp(u, "MIG-", 4) == 0 && u[4] != '\0' && strpbrk(u, ",:=/ ") == NULL &&
           strlen(u) < sizeof(((contract_target *)0)->uid); /* whole as a folder name */
}

int dp_mig_plan(dp_mig_strategy s, const dp_mig_dev *found, int n, int nwhole, dp_mig_set *out,
                char *why, size_t cap)
{
    out->n = 0;
    if (cap > 0)
        why[0] = '\0';
    if (s == DP_MIG_NONE || n <= 0)
        return 0;
    int unknown = 0, no_ci = 0;
    const char *first = NULL, *other = NULL;
    for (int i = 0; i < n; i++) {
        const dp_mig_dev *d = &found[i];
        if (!usable_uuid(d->uuid)) {
            no_ci++;
            continue;
        }
        if (d->profile[0] == '\0') {
            unknown++;
            continue;
        }
        if (first == NULL)
            first = d->profile;
        else if (other == NULL && strcmp(first, d->profile) != 0)
            other = d->profile;
        if (out->n < DP_MIG_DEVS_MAX)
            out->dev[out->n++] = *d;
    }
    char line[DP_MIG_WHY_MAX];
    if (no_ci > 0) {
        snprintf(line, sizeof(line),
                 "%d GPU instance(s) without a compute instance (no MIG device UUID) left out",
                 no_ci);
        say(why, cap, line);
    }
    if (unknown > 0) {
        snprintf(line, sizeof(line),
                 "%d MIG device(s) on GPUs whose MIG profiles kgpu does not know left out",
                 unknown);
        say(why, cap, line);
    }
    if (s == DP_MIG_SINGLE && other != NULL) {
        snprintf(line, sizeof(line),
                 "mig-strategy single needs every MIG device of the node to have one profile, "
                 "but it has %s and %s: advertising no MIG device (repartition alike, or use "
                 "--mig-strategy mixed)",
                 first, other);
        say(why, cap, line);
        out->n = 0;
    } else if (s == DP_MIG_SINGLE && nwhole > 0 && out->n > 0) {
        snprintf(line, sizeof(line),
                 "mig-strategy single needs every GPU of the node in MIG mode, but %d GPU(s) "
                 "without MIG are listed whole on nvidia.com/gpu: advertising no MIG device "
                 "(units of one resource must be alike; use --mig-strategy mixed)",
                 nwhole);
        say(why, cap, line);
        out->n = 0;
    } else if (s == DP_MIG_SINGLE && (unknown > 0 || no_ci > 0) && out->n > 0) {
        say(why, cap, "mig-strategy single advertises all of the node's MIG devices or none: "
                      "advertising none");
        out->n = 0;
    }
    return why[0] != '\0' ? -1 : 0;
}

int dp_mig_find(const dp_mig_set *s, const char *uuid)
{
    for (int i = 0; s != NULL && i < s->n; i++)
        if (strcmp(s->dev[i].uuid, uuid) == 0)
            return i;
    return -1;
}

bool dp_mig_resource(const char *profile, char *buf, size_t cap)
{
    /* A resource name's part after the slash is at most 63 characters. */
    if (profile[0] == '\0' || strlen(profile) + strlen("mig-") > 63)
        return false;
    return (size_t)snprintf(buf, cap, "%s%s", DP_MIG_RES_PREFIX, profile) < cap;
}

const char *dp_slot_resource(int slot, const char *profile, char *buf, size_t cap)
{
    if (slot < DP_NRES)
        snprintf(buf, cap, "%s", dp_res_name((dp_res)slot));
    else if (profile == NULL || !dp_mig_resource(profile, buf, cap))
        snprintf(buf, cap, "?");
    return buf;
}

void dp_mig_target(const dp_mig_set *s, const int *ids, int n, contract_target *t)
{
    memset(t, 0, sizeof(*t));
    for (int i = 0; i < n && t->ngpus < KGPU_MAX_GPUS_PER_NODE; i++) {
        const dp_mig_dev *d = &s->dev[ids[i]];
        contract_share *g = &t->gpus[t->ngpus++];
        g->index = d->gpu_index;
        snprintf(g->uuid, sizeof(g->uuid), "%s", d->uuid);
        g->memory_mib = d->memory_mib;
        g->milli = 0; /* the whole instance: no compute share to hold it to */
    }
    /* dp_mig_plan advertises no UUID longer than uid holds. */
    if (t->ngpus > 0)
        snprintf(t->uid, sizeof(t->uid), "%.63s", t->gpus[0].uuid);
    snprintf(t->container, sizeof(t->container), "mig");
    snprintf(t->name, sizeof(t->name), "%.63s", t->uid);
}
