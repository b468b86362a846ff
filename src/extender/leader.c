/*
 * Leader election with a coordination.k8s.io/v1 Lease, so that several
 * kgpu-extender replicas can run and only one of them reserves GPUs: two
 * active replicas could both hand out a GPU between watch updates. Standbys
 * keep their state current (they watch too) but report not ready and refuse
 * binds; when the leader stops renewing, one of them takes the lease.
 *
 * Threads: one election thread owns the lease exchange; d->leads is an
 * atomic read by the HTTP threads. A leader that cannot renew within the
 * lease duration steps down by itself, before anyone else may take over.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "sources.h"

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *lease_path(const ext_leader *d, bool with_name)
{
    char *p = NULL;
    if (asprintf(&p, "/apis/coordination.k8s.io/v1/namespaces/%s/leases%s%s", d->cfg->lease_ns,
                 with_name ? "/" : "", with_name ? d->cfg->lease_name : "") < 0)
        return NULL;
    return p;
}

/* The Lease object we write: holder `holder`, renewed now. */
static char *lease_body(const ext_leader *d, const char *rv, const char *holder, double acquired,
                        long transitions)
{
    char now[64], acq[64];
    kgpu_rfc3339(wall_now(), 6, now, sizeof(now)); /* a MicroTime */
    kgpu_rfc3339(acquired, 6, acq, sizeof(acq));
    json_t *meta = json_pack("{s:s,s:s}", "name", d->cfg->lease_name, "namespace", d->cfg->lease_ns);
    if (rv != NULL)
        json_object_set_new(meta, "resourceVersion", json_string(rv));
    json_t *lease =
        json_pack("{s:s,s:s,s:o,s:{s:s,s:i,s:s,s:s,s:I}}", "apiVersion", "coordination.k8s.io/v1",
                  "kind", "Lease", "metadata", meta, "spec", "holderIdentity", holder,
                  "leaseDurationSeconds", d->cfg->lease_duration_s, "acquireTime", acq, "renewTime",
                  now, "leaseTransitions", (json_int_t)transitions);
    char *s = json_dumps(lease, JSON_COMPACT);
    json_decref(lease);
    return s;
}

/* Sends a Lease body (taken over and freed); true when the answer is `want`. */
static bool write_lease(ext_leader *d, const char *method, const char *path, char *body, long want)
{
    kgpu_http_resp resp = {0};
    kgpu_error err;
    bool ok = body != NULL && path != NULL &&
              kgpu_k8s_request(d->k8s, method, path, "application/json", body, &resp, &err) == 0 &&
              resp.status == want;
    free(body);
    free(resp.body);
    return ok;
}

/* One round of the election. Returns true when we hold the lease after it. */
static bool elect_once(ext_leader *d, double *acquired)
{
    char *path = lease_path(d, true);
    kgpu_error err;
    bool leader = false;
    long status = 0;
    json_t *lease = path != NULL ? kgpu_k8s_get_json(d->k8s, path, &status, &err) : NULL;
    if (status == 404) {
        /* Nobody holds it yet: create it, and the create decides between racing replicas. */
        *acquired = wall_now();
        char *collection = lease_path(d, false);
        leader =
            write_lease(d, "POST", collection, lease_body(d, NULL, d->identity, *acquired, 0), 201);
        free(collection);
        free(path);
        return leader;
    }
    json_t *spec = json_object_get(lease, "spec");
    const char *holder = json_string_value(json_object_get(spec, "holderIdentity"));
    const char *rv =
        json_string_value(json_object_get(json_object_get(lease, "metadata"), "resourceVersion"));
    double renewed = -1;
    kgpu_rfc3339_parse(json_string_value(json_object_get(spec, "renewTime")), &renewed);
    json_int_t duration = json_integer_value(json_object_get(spec, "leaseDurationSeconds"));
    json_int_t transitions = json_integer_value(json_object_get(spec, "leaseTransitions"));
    bool mine = holder != NULL && strcmp(holder, d->identity) == 0;
    bool free_now = holder == NULL || holder[0] == '\0' || renewed < 0 ||
                    wall_now() > renewed + (double)(duration > 0 ? duration : 1);
    if (lease != NULL && rv != NULL && (mine || free_now)) {
        /* Renew ours, or take an expired or released one; a stale resourceVersion loses (409). */
        if (!mine)
            *acquired = wall_now();
        leader = write_lease(
            d, "PUT", path,
            lease_body(d, rv, d->identity, *acquired, mine ? transitions : transitions + 1), 200);
    }
    json_decref(lease);
    free(path);
    return leader;
}

/* On a clean stop the leader releases the lease, so a standby need not wait it out. */
static void release_lease(ext_leader *d, double acquired)
{
    char *path = lease_path(d, true);
    kgpu_error err;
    long status;
    json_t *lease = path != NULL ? kgpu_k8s_get_json(d->k8s, path, &status, &err) : NULL;
    if (lease != NULL) {
        const char *holder =
            json_string_value(json_object_get(json_object_get(lease, "spec"), "holderIdentity"));
        const char *rv = json_string_value(
            json_object_get(json_object_get(lease, "metadata"), "resourceVersion"));
        if (holder != NULL && rv != NULL && strcmp(holder, d->identity) == 0)
            write_lease(d, "PUT", path, lease_body(d, rv, "", acquired, 0), 200);
        json_decref(lease);
    }
    free(path);
}

static void *elect(void *arg)
{
    ext_leader *d = arg;
    double acquired = 0, renewed_at = 0; /* monotonic time of the last successful renewal */
    double period = d->cfg->lease_duration_s / 5.0;
    if (period < 0.5)
        period = 0.5;
    while (!atomic_load(d->stop)) {
        bool was = atomic_load(&d->leads);
        bool now_leader = elect_once(d, &acquired);
        double mono = ext_now();
        if (now_leader)
            renewed_at = mono;
        /* Not renewed within the lease: someone else may take it now, so stop acting first. */
        bool leader = now_leader || (was && mono - renewed_at < d->cfg->lease_duration_s * 0.8);
        atomic_store(&d->leads, leader);
        if (leader != was)
            ext_log(EXT_INFO, "leader election: %s (lease %s/%s, identity %s)",
                    leader ? "this replica leads" : "this replica stands by", d->cfg->lease_ns,
                    d->cfg->lease_name, d->identity);
        for (double slept = 0; slept < period && !atomic_load(d->stop); slept += 0.1)
            usleep(100 * 1000);
    }
    if (atomic_load(&d->leads))
        release_lease(d, acquired);
    atomic_store(&d->leads, false);
    return NULL;
}

int ext_leader_start(ext_leader *d, kgpu_error *err)
{
    char host[128] = "kgpu-extender";
    const char *pod = getenv("POD_NAME");
    if (pod == NULL || pod[0] == '\0')
        gethostname(host, sizeof(host) - 1);
    snprintf(d->identity, sizeof(d->identity), "%s_%d", pod && pod[0] ? pod : host, (int)getpid());
    atomic_store(&d->leads, false);
    if (pthread_create(&d->thread, NULL, elect, d) != 0)
        return kgpu_error_set(err, KGPU_ENOMEM, "cannot start the leader election thread");
    d->running = true;
    return 0;
}

void ext_leader_stop(ext_leader *d)
{
    if (d->running)
        pthread_join(d->thread, NULL);
    d->running = false;
}
