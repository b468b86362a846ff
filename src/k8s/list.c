/*
 * Paged lists, as the API server serves them: `limit=N`, then `continue=TOKEN`
 * until a page has none, every page from one snapshot (one etcd revision).
 * Why pages: 20,000 pods are 50-200 MB of JSON, past the 64 MiB response cap
 * and several times that once parsed; a page of 500 is a few MB, and each is
 * parsed, trimmed by the caller and dropped before the next is asked for, so
 * the peak is what the caller keeps plus one page. A token outlives its
 * snapshot only until etcd compacts (every 5 minutes by default); the server
 * then answers 410 Expired and the list starts again from the first page,
 * never stitching two snapshots together (the watch that follows resumes
 * from the list's one resourceVersion).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s_internal.h"

int kgpu__k8s_page_parse(const char *body, size_t len, kgpu__k8s_page *out, kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    out->remaining = -1;
    json_error_t jerr;
    json_t *doc = body != NULL ? json_loadb(body, len, 0, &jerr) : NULL;
    if (doc == NULL)
        return kgpu_error_set(err, KGPU_EPARSE, "not JSON: %s (line %d)",
                              body != NULL ? jerr.text : "no body", body != NULL ? jerr.line : 0);
    const char *why = NULL;
    json_t *meta = json_object_get(doc, "metadata");
    json_t *rv = json_object_get(meta, "resourceVersion");
    json_t *items = json_object_get(doc, "items");
    json_t *cont = json_object_get(meta, "continue");
    json_t *remaining = json_object_get(meta, "remainingItemCount");
    if (!json_is_object(doc))
        why = "not a JSON object";
    else if (!json_is_string(rv) || json_string_length(rv) == 0)
        why = "no metadata.resourceVersion";
    else if (json_string_length(rv) >= KGPU_K8S_RV_MAX ||
             strlen(json_string_value(rv)) != json_string_length(rv))
        why = "metadata.resourceVersion is longer than 127 bytes or holds a NUL byte";
    else if (items != NULL && !json_is_null(items) && !json_is_array(items))
        why = "items is not an array";
    else if (cont != NULL && !json_is_null(cont) && !json_is_string(cont))
        why = "metadata.continue is not a string";
    else if (json_is_string(cont) && (json_string_length(cont) > KGPU__K8S_CONTINUE_MAX ||
                                      strlen(json_string_value(cont)) != json_string_length(cont)))
        why = "metadata.continue is longer than 8192 bytes or holds a NUL byte";
    else if (remaining != NULL && !json_is_null(remaining) &&
             (!json_is_integer(remaining) || json_integer_value(remaining) < 0))
        why = "metadata.remainingItemCount is not a whole number >= 0";
    if (why != NULL) {
        json_decref(doc);
        return kgpu_error_set(err, KGPU_EPARSE, "%s", why);
    }
    out->doc = doc;
    out->items = json_is_array(items) ? items : NULL;
    out->rv = json_string_value(rv);
    out->cont =
        json_is_string(cont) && json_string_length(cont) > 0 ? json_string_value(cont) : NULL;
    out->remaining = json_is_integer(remaining) ? (long long)json_integer_value(remaining) : -1;
    return 0;
}

/* Does the caller's query set a parameter that paging owns? */
static bool query_sets(const char *query, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = query; p != NULL && *p != '\0';) {
        if (strncmp(p, name, n) == 0 && (p[n] == '=' || p[n] == '&' || p[n] == '\0'))
            return true;
        p = strchr(p, '&');
        p = p != NULL ? p + 1 : NULL;
    }
    return false;
}

/* collection?query&limit=N[&continue=TOKEN], the token escaped; malloc'd, NULL when out of memory.
 */
static char *page_path(const char *collection, const char *query, long limit, const char *cont)
{
    char *econt = NULL;
    if (cont != NULL) {
        size_t sz = 3 * strlen(cont) + 1;
        if ((econt = malloc(sz)) == NULL || kgpu__k8s_escape(cont, econt, sz) != 0) {
            free(econt);
            return NULL;
        }
    }
    bool q = query != NULL && query[0] != '\0';
    char *path;
    if (asprintf(&path, "%s?%s%slimit=%ld%s%s", collection, q ? query : "", q ? "&" : "", limit,
                 econt != NULL ? "&continue=" : "", econt != NULL ? econt : "") < 0)
        path = NULL;
    free(econt);
    return path;
}

int kgpu_k8s_list(kgpu_k8s *k, const char *collection, const char *query,
                  const kgpu_k8s_list_opts *opts, json_t **items, char *rv, size_t rvsz,
                  kgpu_k8s_list_stats *stats, kgpu_error *err)
{
    kgpu_k8s_list_stats local;
    if (stats == NULL)
        stats = &local;
    memset(stats, 0, sizeof(*stats));
    if (items != NULL)
        *items = NULL;
    if (k == NULL || items == NULL || rv == NULL || rvsz == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "list: no client or nowhere to put the result");
    if (collection == NULL || collection[0] != '/' || strpbrk(collection, "?# \r\n") != NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "list '%.200s': not an API path",
                              collection ? collection : "");
    bool q = query != NULL && query[0] != '\0';
    /* What every message about this list starts with. */
    char what[320];
    snprintf(what, sizeof(what), "list %.200s%s%.100s", collection, q ? "?" : "", q ? query : "");
    if (q && (query[0] == '?' || strpbrk(query, "# \r\n") != NULL || query_sets(query, "limit") ||
              query_sets(query, "continue") || query_sets(query, "resourceVersion")))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "%s: the query must be escaped and leave limit, continue and "
                              "resourceVersion to the list",
                              what);
    long limit = opts != NULL && opts->limit > 0 ? opts->limit : KGPU_K8S_LIST_PAGE;
    int restarts = opts == NULL || opts->restarts == 0 ? KGPU_K8S_LIST_RESTARTS
                   : opts->restarts < 0                ? 0
                                                       : opts->restarts;
    atomic_bool *stop = opts != NULL ? opts->stop : NULL;

    json_t *all = NULL; /* this start's items */
    char *cont = NULL;  /* the token of the next page; NULL for the first */
    char first_rv[KGPU_K8S_RV_MAX] = "";
    unsigned page = 0;        /* pages of this start */
    long long announced = -1; /* remainingItemCount of the last page, when the server sent it */
    int rc = 0;
    for (;;) {
        if (all == NULL && (all = json_array()) == NULL) {
            rc = kgpu_error_set(err, KGPU_ENOMEM, "%s: out of memory", what);
            break;
        }
        if (stop != NULL && atomic_load(stop)) {
            rc = kgpu_error_set(err, KGPU_EIO, "%s: stopped", what);
            break;
        }
        char *path = page_path(collection, query, limit, cont);
        if (path == NULL) {
            rc = kgpu_error_set(err, KGPU_ENOMEM, "%s: out of memory", what);
            break;
        }
        kgpu_http_resp resp;
        kgpu_error e;
        rc = kgpu__k8s_request_ex(k, "GET", path, NULL, NULL, stop, &resp, &e);
        free(path);
        if (rc != 0) {
            kgpu_error_set(err, rc, "%s: %s", what, e.msg);
            break;
        }
        if (resp.status == 410 && cont != NULL) {
            /* The snapshot is gone: its items cannot be finished, only listed again. */
            char reason[64], msg[256];
            kgpu__k8s_status_reason(resp.body, resp.len, reason, sizeof(reason));
            kgpu__k8s_status_message(resp.body, resp.len, msg, sizeof(msg));
            free(resp.body);
            if ((int)stats->restarts >= restarts) {
                char more[48] = "";
                if (announced >= 0)
                    snprintf(more, sizeof(more), " (%lld more to come)", announced);
                rc = kgpu_error_set(
                    err, KGPU_EIO,
                    "%s: the list's snapshot expired (HTTP 410 %s) %u times before its last "
                    "page, this time after %u pages and %zu items%s; the API server keeps it "
                    "only until etcd compacts (every 5 minutes by default): %s",
                    what, reason[0] ? reason : "Gone", stats->restarts + 1, page,
                    json_array_size(all), more, msg);
                break;
            }
            stats->restarts++;
            json_decref(all);
            all = NULL;
            free(cont);
            cont = NULL;
            page = 0;
            announced = -1;
            continue;
        }
        if (resp.status != 200) {
            char msg[256];
            kgpu__k8s_status_message(resp.body, resp.len, msg, sizeof(msg));
            free(resp.body);
            rc = kgpu_error_set(err, KGPU_EIO, "%s: page %u: HTTP %ld: %s", what, page + 1,
                                resp.status, msg);
            break;
        }
        kgpu__k8s_page pg;
        rc = kgpu__k8s_page_parse(resp.body, resp.len, &pg, &e);
        free(resp.body); /* the parsed page is all that is needed from here */
        if (rc != 0) {
            kgpu_error_set(err, rc, "%s: page %u: %s", what, page + 1, e.msg);
            break;
        }
        page++;
        stats->pages++;
        if (page == 1) {
            snprintf(first_rv, sizeof(first_rv), "%s", pg.rv);
        } else if (strcmp(pg.rv, first_rv) != 0) {
            rc = kgpu_error_set(err, KGPU_ESTATE,
                                "%s: page %u has resourceVersion %s but the first had %s: the "
                                "pages are not one snapshot",
                                what, page, pg.rv, first_rv);
            json_decref(pg.doc);
            break;
        }
        size_t i;
        json_t *it;
        json_array_foreach(pg.items, i, it)
        {
            if (opts != NULL && opts->trim != NULL && json_is_object(it))
                opts->trim(opts->trim_ctx, it);
            if (json_array_append(all, it) != 0) {
                rc = kgpu_error_set(err, KGPU_ENOMEM, "%s: out of memory after %zu items", what,
                                    json_array_size(all));
                break;
            }
        }
        announced = pg.remaining;
        if (rc != 0 || pg.cont == NULL) {
            json_decref(pg.doc);
            break;
        }
        if (cont != NULL && strcmp(cont, pg.cont) == 0) {
            rc = kgpu_error_set(err, KGPU_ESTATE,
                                "%s: page %u gave the same continue token as the page before", what,
                                page);
            json_decref(pg.doc);
            break;
        }
        free(cont);
        cont = strdup(pg.cont);
        json_decref(pg.doc);
        if (cont == NULL) {
            rc = kgpu_error_set(err, KGPU_ENOMEM, "%s: out of memory", what);
            break;
        }
    }
    free(cont);
    if (rc == 0 && strlen(first_rv) >= rvsz)
        rc = kgpu_error_set(err, KGPU_ERANGE, "%s: resourceVersion %s is longer than %zu bytes",
                            what, first_rv, rvsz - 1);
    if (rc != 0) {
        json_decref(all);
        return rc;
    }
    snprintf(rv, rvsz, "%s", first_rv);
    *items = all;
    return 0;
}
