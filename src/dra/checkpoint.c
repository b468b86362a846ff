/*
 * The claims this driver has prepared, kept in one JSON file so that a
 * restarted driver answers kubelet's Unprepare for claims prepared before
 * (the ResourceClaim may be gone by then) and a repeated Prepare answers the
 * same devices. Written beside and renamed, so a crash leaves the old file
 * or the new one, never half of either; read back with the same checks as a
 * claim from the API server, since a file on the node is input too.
 *
 *   {"version": 1, "claims": [{"uid", "namespace", "name",
 *     "devices": [{"request", "device", "uuid", "index", "memoryMiB",
 *                  "milli", "shareID", "coreLimit"?}]}]}
 *
 * A device holding a MIG instance adds "mig": {"profile", "nvmlProfile",
 * "start", "size", "shared", "gi", "ci", "uuid"}, and the file is then
 * version 2: an older driver, which would take it for a whole GPU and never
 * destroy the instance, refuses to start on it instead. A file without MIG
 * stays version 1, so downgrading on a node that never used MIG still works;
 * both versions are read.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dra.h"
#include "fileio.h"

void dra_ckpt_free(dra_ckpt *ck)
{
    free(ck->claims);
    ck->claims = NULL;
    ck->n = ck->cap = 0;
}

dra_claim *dra_ckpt_find(dra_ckpt *ck, const char *uid)
{
    for (int i = 0; i < ck->n; i++)
        if (strcmp(ck->claims[i].uid, uid) == 0)
            return &ck->claims[i];
    return NULL;
}

int dra_ckpt_put(dra_ckpt *ck, const dra_claim *c, kgpu_error *err)
{
    dra_claim *have = dra_ckpt_find(ck, c->uid);
    if (have != NULL) {
        *have = *c;
        return 0;
    }
    if (ck->n >= DRA_MAX_CLAIMS)
        return kgpu_error_set(err, KGPU_ERANGE,
                              "the driver already holds %d prepared claims on this node",
                              DRA_MAX_CLAIMS);
    if (ck->n == ck->cap) {
        int cap = ck->cap ? ck->cap * 2 : 16;
        dra_claim *p = realloc(ck->claims, (size_t)cap * sizeof(*p));
        if (p == NULL)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory keeping a claim");
        ck->claims = p;
        ck->cap = cap;
    }
    ck->claims[ck->n++] = *c;
    return 0;
}

bool dra_ckpt_drop(dra_ckpt *ck, const char *uid)
{
    dra_claim *c = dra_ckpt_find(ck, uid);
    if (c == NULL)
        return false;
    *c = ck->claims[--ck->n];
    return true;
}

char *dra_ckpt_encode(const dra_ckpt *ck)
{
    int version = 1;
    json_t *claims = json_array();
    for (int i = 0; i < ck->n; i++) {
        const dra_claim *c = &ck->claims[i];
        json_t *devs = json_array();
        for (int k = 0; k < c->nallocs; k++) {
            const dra_alloc *a = &c->allocs[k];
            json_t *dev =
                json_pack("{s:s, s:s, s:s, s:i, s:I, s:i, s:s}", "request", c->reqs[a->req],
                          "device", a->device, "uuid", a->uuid, "index", a->index, "memoryMiB",
                          (json_int_t)a->memory_mib, "milli", a->milli, "shareID", a->share_id);
            if (a->limit_pct > 0) /* absent in checkpoints written before it existed */
                json_object_set_new(dev, "coreLimit", json_integer(a->limit_pct));
            if (a->profile[0] != '\0') {
                json_object_set_new(
                    dev, "mig",
                    json_pack("{s:s, s:i, s:i, s:i, s:b, s:I, s:I, s:s}", "profile", a->profile,
                              "nvmlProfile", a->nvml_profile, "start", a->mig_start, "size",
                              a->mig_size, "shared", a->mig_shared, "gi", (json_int_t)a->gi_id,
                              "ci", (json_int_t)a->ci_id, "uuid", a->mig_uuid));
                version = 2;
            }
            json_array_append_new(devs, dev);
        }
        json_array_append_new(claims, json_pack("{s:s, s:s, s:s, s:o}", "uid", c->uid,
                                                "namespace", c->ns, "name", c->name, "devices",
                                                devs));
    }
    json_t *doc = json_pack("{s:i, s:o}", "version", version, "claims", claims);
    char *text = doc != NULL ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(doc);
    return text;
}

/* A profile name as kgpu's tables spell them: "3g.20gb", "1g.5gb+me". */
static bool profile_name(const char *s)
{
    if (s == NULL || *s == '\0' || strlen(s) >= KGPU_MIG_NAME_MAX)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '.' || *s == '+'))
            return false;
    return true;
}

static bool int_in(const json_t *v, json_int_t lo, json_int_t hi)
{
    return json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= hi;
}

/* A device's "mig" object into a (0), or -1 when malformed. */
static int read_mig(const json_t *m, dra_alloc *a)
{
    const char *prof = json_string_value(json_object_get(m, "profile"));
    const char *uuid = json_string_value(json_object_get(m, "uuid"));
    const json_t *np = json_object_get(m, "nvmlProfile"), *start = json_object_get(m, "start"),
                 *size = json_object_get(m, "size"), *shared = json_object_get(m, "shared"),
                 *gi = json_object_get(m, "gi"), *ci = json_object_get(m, "ci");
    if (!json_is_object(m) || !profile_name(prof) || uuid == NULL ||
        (uuid[0] != '\0' && (!dra_safe_name(uuid) || strlen(uuid) >= KGPU_GPU_UUID_MAX)) ||
        !int_in(np, 0, 63) || !int_in(start, 0, KGPU_MIG_MEM_SLICES - 1) ||
        !int_in(size, 1, KGPU_MIG_MEM_SLICES) ||
        json_integer_value(start) + json_integer_value(size) > KGPU_MIG_MEM_SLICES ||
        !json_is_boolean(shared) || !int_in(gi, 0, 1000000) || !int_in(ci, 0, 1000000))
        return -1;
    snprintf(a->profile, sizeof(a->profile), "%s", prof);
    snprintf(a->mig_uuid, sizeof(a->mig_uuid), "%s", uuid);
    a->nvml_profile = (int)json_integer_value(np);
    a->mig_start = (int)json_integer_value(start);
    a->mig_size = (int)json_integer_value(size);
    a->mig_shared = json_is_true(shared);
    a->gi_id = (unsigned)json_integer_value(gi);
    a->ci_id = (unsigned)json_integer_value(ci);
    return 0;
}

static int read_claim(const json_t *o, size_t i, const char *file, dra_claim *c, kgpu_error *err)
{
    memset(c, 0, sizeof(*c));
    const char *uid = json_string_value(json_object_get(o, "uid"));
    const char *ns = json_string_value(json_object_get(o, "namespace"));
    const char *name = json_string_value(json_object_get(o, "name"));
    const json_t *devs = json_object_get(o, "devices");
    if (!dra_safe_name(uid) || ns == NULL || name == NULL || strlen(ns) > KGPU_NAME_MAX ||
        strlen(name) > KGPU_NAME_MAX || !json_is_array(devs) || json_array_size(devs) == 0 ||
        json_array_size(devs) > KGPU_MAX_GPUS_PER_NODE)
        return kgpu_error_set(err, KGPU_EPARSE,
                              "%s: claim %zu: uid, namespace, name or devices missing or malformed",
                              file, i);
    snprintf(c->uid, sizeof(c->uid), "%s", uid);
    snprintf(c->ns, sizeof(c->ns), "%s", ns);
    snprintf(c->name, sizeof(c->name), "%s", name);
    size_t k;
    json_t *d;
    json_array_foreach(devs, k, d)
    {
        const char *req = json_string_value(json_object_get(d, "request"));
        const char *dev = json_string_value(json_object_get(d, "device"));
        const char *uuid = json_string_value(json_object_get(d, "uuid"));
        const char *share = json_string_value(json_object_get(d, "shareID"));
        json_t *idx = json_object_get(d, "index"), *mem = json_object_get(d, "memoryMiB"),
               *milli = json_object_get(d, "milli"), *lim = json_object_get(d, "coreLimit");
        if (!dra_safe_name(req) || strlen(req) >= DRA_REQ_MAX || dev == NULL ||
            strlen(dev) >= DRA_DEVICE_MAX || !dra_safe_name(uuid) ||
            strlen(uuid) >= KGPU_GPU_UUID_MAX || share == NULL ||
            (share[0] != '\0' && !dra_safe_name(share)) || !json_is_integer(idx) ||
            !json_is_integer(mem) || !json_is_integer(milli) || json_integer_value(idx) < 0 ||
            json_integer_value(idx) > 1000000 || json_integer_value(mem) < 1 ||
            json_integer_value(mem) > (INT64_C(1) << 40) || json_integer_value(milli) < 0 ||
            json_integer_value(milli) > 1000 ||
            (lim != NULL && (!json_is_integer(lim) || json_integer_value(lim) < 1 ||
                             json_integer_value(lim) > 100)))
            return kgpu_error_set(err, KGPU_EPARSE, "%s: claim %s: device %zu malformed", file,
                                  uid, k);
        int r = -1;
        for (int x = 0; x < c->nreqs; x++)
            if (strcmp(c->reqs[x], req) == 0)
                r = x;
        if (r < 0) {
            if (c->nreqs >= DRA_MAX_REQUESTS)
                return kgpu_error_set(err, KGPU_EPARSE, "%s: claim %s: more than %d requests",
                                      file, uid, DRA_MAX_REQUESTS);
            r = c->nreqs++;
            snprintf(c->reqs[r], DRA_REQ_MAX, "%s", req);
        }
        dra_alloc *a = &c->allocs[c->nallocs++];
        a->req = r;
        snprintf(a->device, sizeof(a->device), "%s", dev);
        snprintf(a->uuid, sizeof(a->uuid), "%s", uuid);
        snprintf(a->share_id, sizeof(a->share_id), "%s", share);
        a->index = (int)json_integer_value(idx);
        a->memory_mib = json_integer_value(mem);
        a->milli = (int)json_integer_value(milli);
        a->limit_pct = lim != NULL ? (int)json_integer_value(lim) : 0;
        const json_t *mig = json_object_get(d, "mig");
        if (mig != NULL && read_mig(mig, a) != 0)
            return kgpu_error_set(err, KGPU_EPARSE, "%s: claim %s: device %zu: mig malformed",
                                  file, uid, k);
    }
    return 0;
}

int dra_ckpt_parse(const char *buf, size_t len, const char *file, dra_ckpt *out, kgpu_error *err)
{
    out->n = 0;
    if (len > DRA_CKPT_MAX_BYTES)
        return kgpu_error_set(err, KGPU_ERANGE, "%s: %zu bytes, more than a checkpoint holds",
                              file, len);
    json_error_t je;
    json_t *doc = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (doc == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "%s:%d:%d: %s", file, je.line, je.column, je.text);
    int rc = 0;
    json_t *ver = json_object_get(doc, "version"), *claims = json_object_get(doc, "claims");
    if (!int_in(ver, 1, 2) || !json_is_array(claims)) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: not a version 1 or 2 checkpoint", file);
    } else if (json_array_size(claims) > DRA_MAX_CLAIMS) {
        rc = kgpu_error_set(err, KGPU_ERANGE, "%s: %zu claims, more than %d", file,
                            json_array_size(claims), DRA_MAX_CLAIMS);
    } else {
        size_t i;
        json_t *o;
        json_array_foreach(claims, i, o)
        {
            dra_claim c;
            if ((rc = read_claim(o, i, file, &c, err)) != 0)
                break;
            if (dra_ckpt_find(out, c.uid) != NULL) {
                rc = kgpu_error_set(err, KGPU_EPARSE, "%s: claim %s twice", file, c.uid);
                break;
            }
            if ((rc = dra_ckpt_put(out, &c, err)) != 0)
                break;
        }
    }
    json_decref(doc);
    if (rc != 0)
        out->n = 0;
    return rc;
}

int dra_ckpt_save(const char *path, const dra_ckpt *ck, kgpu_error *err)
{
    char *text = dra_ckpt_encode(ck);
    if (text == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory writing the checkpoint");
    char tmp[1200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    size_t len = strlen(text);
    bool ok = fd >= 0 && write(fd, text, len) == (ssize_t)len && fsync(fd) == 0;
    int e = errno;
    /* Closed once whatever happened: another thread may reuse the number at once. */
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        rc = kgpu_error_set(err, KGPU_EIO, "writing %s: %s", path, strerror(e));
        unlink(tmp);
    }
    free(text);
    if (rc == 0) {
        /* The rename itself survives a power cut only once the folder is synced. */
        char dir[1200];
        snprintf(dir, sizeof(dir), "%s", path);
        int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    return rc;
}

int dra_ckpt_load(const char *path, dra_ckpt *out, kgpu_error *err)
{
    out->n = 0;
    if (access(path, F_OK) != 0 && errno == ENOENT)
        return 0;
    char *buf = NULL;
    size_t len = 0;
    int rc = kgpu_read_file_max(path, DRA_CKPT_MAX_BYTES, &buf, &len, err);
    if (rc == 0)
        rc = dra_ckpt_parse(buf, len, path, out, err);
    free(buf);
    return rc;
}

/* ---- overlaps on MIG GPUs ---- */

static void describe(const dra_alloc *a, char *buf, size_t cap)
{
    if (a->mig_shared)
        snprintf(buf, cap, "%s (the whole GPU)", a->device);
    else
        snprintf(buf, cap, "%s (%s on memory slices %d-%d)", a->device, a->profile, a->mig_start,
                 a->mig_start + a->mig_size - 1);
}

/* Whether two MIG allocations on one GPU cannot both be prepared. */
static bool clash(const dra_alloc *a, const dra_alloc *b)
{
    if (a->profile[0] == '\0' || b->profile[0] == '\0' || strcmp(a->uuid, b->uuid) != 0)
        return false;
    if (a->mig_shared || b->mig_shared)
        return a->mig_shared != b->mig_shared; /* shares of the whole instance go together */
    return (kgpu_mig_mask(a->mig_start, a->mig_size) & kgpu_mig_mask(b->mig_start, b->mig_size)) !=
           0;
}

int dra_ckpt_conflict(const dra_ckpt *ck, const dra_claim *c, kgpu_error *err)
{
    char da[128], db[128];
    for (int i = 0; i < c->nallocs; i++) {
        const dra_alloc *a = &c->allocs[i];
        for (int j = i + 1; j < c->nallocs; j++)
            if (clash(a, &c->allocs[j])) {
                describe(a, da, sizeof(da));
                describe(&c->allocs[j], db, sizeof(db));
                return kgpu_error_set(err, KGPU_ESTATE,
                                      "ResourceClaim %s/%s: devices %s and %s overlap on GPU %s",
                                      c->ns, c->name, da, db, a->uuid);
            }
        for (int k = 0; k < ck->n; k++) {
            const dra_claim *o = &ck->claims[k];
            if (strcmp(o->uid, c->uid) == 0)
                continue;
            for (int j = 0; j < o->nallocs; j++)
                if (clash(a, &o->allocs[j])) {
                    describe(a, da, sizeof(da));
                    describe(&o->allocs[j], db, sizeof(db));
                    return kgpu_error_set(err, KGPU_ESTATE,
                                          "ResourceClaim %s/%s: device %s overlaps %s of the "
                                          "prepared claim %s/%s (%s) on GPU %s; refused",
                                          c->ns, c->name, da, db, o->ns, o->name, o->uid,
                                          a->uuid);
                }
        }
    }
    return 0;
}
