/*
 * The clusters file (clusterfile.h):
 *
 *   clusters:
 *     - name: worker-a
 *       extender: https://10.0.0.5:12346
 *       ca: /etc/kgpu/clusters/worker-a/ca.crt
 *       cert: /etc/kgpu/clusters/worker-a/tls.crt
 *       key: /etc/kgpu/clusters/worker-a/tls.key
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clusterfile.h"
#include "fileio.h"
#include "yamljson.h"

#define CLUSTERS_FILE_MAX (1 << 20)

static bool dns_label(const char *s)
{
    size_t n = strlen(s);
    bool ok = n >= 1 && n <= 63 && isalnum((unsigned char)s[0]) && isalnum((unsigned char)s[n - 1]);
    for (size_t i = 0; ok && i < n; i++)
        ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-';
    return ok;
}

/* A URL of the extender: a scheme we speak, a host, nothing that could smuggle a header. */
static bool url_ok(const char *s)
{
    const char *rest = strncmp(s, "http://", 7) == 0    ? s + 7
                       : strncmp(s, "https://", 8) == 0 ? s + 8
                                                        : NULL;
    if (rest == NULL || *rest == '\0' || *rest == '/')
        return false;
    for (const char *c = s; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f)
            return false;
    return true;
}

static int set_str(char *dst, size_t cap, json_t *v, const char *file, int i, const char *key,
                   kgpu_error *err)
{
    const char *s = json_string_value(v);
    if (s == NULL || *s == '\0' || strlen(s) >= cap)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: clusters[%d].%s: expected a string of 1..%zu "
                              "bytes", file, i, key, cap - 1);
    snprintf(dst, cap, "%s", s);
    return 0;
}

static int read_entry(json_t *e, const char *file, int i, kgpu_cluster_entry *c,
                      kgpu_error *err)
{
    if (!json_is_object(e))
        return kgpu_error_set(err, KGPU_EINVAL, "%s: clusters[%d]: expected a mapping", file, i);
    memset(c, 0, sizeof(*c));
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(e, key, v) {
        if (rc != 0)
            break;
        if (strcmp(key, "name") == 0)
            rc = set_str(c->name, sizeof(c->name), v, file, i, key, err);
        else if (strcmp(key, "extender") == 0)
            rc = set_str(c->extender, sizeof(c->extender), v, file, i, key, err);
        else if (strcmp(key, "ca") == 0)
            rc = set_str(c->ca, sizeof(c->ca), v, file, i, key, err);
        else if (strcmp(key, "cert") == 0)
            rc = set_str(c->cert, sizeof(c->cert), v, file, i, key, err);
        else if (strcmp(key, "key") == 0)
            rc = set_str(c->key, sizeof(c->key), v, file, i, key, err);
        else
            rc = kgpu_error_set(err, KGPU_EINVAL,
                                "%s: clusters[%d]: unknown key %.64s (name, extender, ca, cert, "
                                "key)",
                                file, i, key);
    }
    if (rc != 0)
        return rc;
    if (!dns_label(c->name))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "%s: clusters[%d].name: expected a DNS label (1-63 of a-z, 0-9, "
                              "'-'), the MultiKueueCluster's name",
                              file, i);
    if (!url_ok(c->extender))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "%s: clusters[%d].extender: expected an http:// or https:// URL",
                              file, i);
    if ((c->cert[0] != '\0') != (c->key[0] != '\0'))
        return kgpu_error_set(err, KGPU_EINVAL, "%s: clusters[%d]: cert and key go together",
                              file, i);
    if ((c->ca[0] || c->cert[0]) && strncmp(c->extender, "https://", 8) != 0)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "%s: clusters[%d]: ca, cert and key need an https:// extender",
                              file, i);
    return 0;
}

int kgpu_clusters_load(const char *buf, size_t len, const char *file, kgpu_clusters *out,
                       kgpu_error *err)
{
    memset(out, 0, sizeof(*out));
    json_t *root = kgpu_yaml_load(buf, len, file, err);
    if (root == NULL)
        return err->code != 0 ? err->code : KGPU_EPARSE;
    int rc = 0;
    json_t *list = json_object_get(root, "clusters");
    if (!json_is_object(root) || json_object_size(root) != 1 || !json_is_array(list))
        rc = kgpu_error_set(err, KGPU_EINVAL, "%s: expected a mapping with one key, clusters: "
                            "a list", file);
    else if (json_array_size(list) < 1 || json_array_size(list) > KGPU_CLUSTERS_MAX)
        rc = kgpu_error_set(err, KGPU_EINVAL, "%s: clusters: 1..%d entries, not %zu", file,
                            KGPU_CLUSTERS_MAX, json_array_size(list));
    for (size_t i = 0; rc == 0 && i < json_array_size(list); i++) {
        kgpu_cluster_entry *c = &out->v[i];
        rc = read_entry(json_array_get(list, i), file, (int)i, c, err);
        for (int k = 0; rc == 0 && k < (int)i; k++)
            if (strcmp(out->v[k].name, c->name) == 0)
                rc = kgpu_error_set(err, KGPU_EINVAL, "%s: clusters[%zu].name: %s twice", file,
                                    i, c->name);
        if (rc == 0)
            out->n++;
    }
    json_decref(root);
    if (rc != 0)
        out->n = 0;
    return rc;
}

int kgpu_clusters_load_file(const char *path, kgpu_clusters *out, kgpu_error *err)
{
    char *buf;
    size_t len;
    int rc = kgpu_read_file_max(path, CLUSTERS_FILE_MAX, &buf, &len, err);
    if (rc != 0)
        return rc;
    rc = kgpu_clusters_load(buf, len, path, out, err);
    free(buf);
    return rc;
}
