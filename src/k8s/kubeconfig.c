/*
 * Where the API client gets its configuration: a kubeconfig file (loaded by
 * libyaml into its document tree of mappings, sequences and scalars, then
 * walked) or the in-cluster service account. No network I/O happens here.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "k8s_internal.h"

void kgpu_k8s_config_clear(kgpu_k8s_config *cfg)
{
    if (cfg == NULL)
        return;
    if (cfg->key_data != NULL)
        explicit_bzero(cfg->key_data, strlen(cfg->key_data));
    free(cfg->ca_data);
    free(cfg->cert_data);
    free(cfg->key_data);
    cfg->ca_data = cfg->cert_data = cfg->key_data = NULL;
}

static void config_init(kgpu_k8s_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->timeout_ms = KGPU__K8S_TIMEOUT_MS;
}

/*
 * Standard base64 (RFC 4648), whitespace ignored, padding optional. Returns a
 * malloc'd NUL-terminated string, or NULL when the input is malformed or the
 * decoded bytes hold a NUL (the fields it decodes are PEM text).
 */
static char *base64_decode(const char *in, size_t n)
{
    char *out = malloc(n / 4 * 3 + 4);
    if (out == NULL)
        return NULL;
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0, ndata = 0, npad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)in[i];
        int v;
        if (isspace(ch))
            continue;
        if (ch == '=') {
            npad++;
            continue;
        }
        if (npad > 0)
            goto bad; /* data after padding */
        if (ch >= 'A' && ch <= 'Z')
            v = ch - 'A';
        else if (ch >= 'a' && ch <= 'z')
            v = ch - 'a' + 26;
        else if (ch >= '0' && ch <= '9')
            v = ch - '0' + 52;
        else if (ch == '+')
            v = 62;
        else if (ch == '/')
            v = 63;
        else
            goto bad;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        ndata++;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xff);
            if (out[o - 1] == '\0')
                goto bad;
        }
    }
    if (ndata % 4 == 1 || npad > 2 || (npad > 0 && (ndata + npad) % 4 != 0))
        goto bad;
    out[o] = '\0';
    return out;
bad:
    free(out);
    return NULL;
}

/* A kubeconfig being read. */
typedef struct kubeconfig {
    const char *path;
    char dir[KGPU_K8S_PATH_MAX]; /* directory of `path`; "" when it has none */
    yaml_document_t doc;
} kubeconfig;

static int kc_fail(const kubeconfig *kc, kgpu_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int kc_fail(const kubeconfig *kc, kgpu_error *err, int code, const char *fmt, ...)
{
    char what[KGPU_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return kgpu_error_set(err, code, "kubeconfig %s: %s", kc->path, what);
}

/* map[key], or NULL when map is not a mapping or lacks the key. */
static yaml_node_t *ymap_get(kubeconfig *kc, yaml_node_t *map, const char *key)
{
    if (map == NULL || map->type != YAML_MAPPING_NODE)
        return NULL;
    size_t klen = strlen(key);
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(&kc->doc, p->key);
        if (k != NULL && k->type == YAML_SCALAR_NODE && k->data.scalar.length == klen &&
            memcmp(k->data.scalar.value, key, klen) == 0)
            return yaml_document_get_node(&kc->doc, p->value);
    }
    return NULL;
}

/*
 * The text of a scalar (libyaml NUL-terminates scalar values), or NULL when
 * the node is absent, not a scalar, empty, YAML null, or holds a NUL byte.
 */
static const char *yscalar(yaml_node_t *n)
{
    if (n == NULL || n->type != YAML_SCALAR_NODE)
        return NULL;
    const char *s = (const char *)n->data.scalar.value;
    if (n->data.scalar.length == 0 || strlen(s) != n->data.scalar.length)
        return NULL;
    if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
        (strcmp(s, "~") == 0 || strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 ||
         strcmp(s, "NULL") == 0))
        return NULL;
    return s;
}

/*
 * In the list root[list] (contexts, clusters, users), the entry whose name is
 * `name`; *body is its `field` mapping (context, cluster, user) or NULL.
 * Returns false when no entry has that name.
 */
static bool named_entry(kubeconfig *kc, yaml_node_t *root, const char *list, const char *field,
                        const char *name, yaml_node_t **body)
{
    *body = NULL;
    yaml_node_t *seq = ymap_get(kc, root, list);
    if (seq == NULL || seq->type != YAML_SEQUENCE_NODE)
        return false;
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top;
         it++) {
        yaml_node_t *e = yaml_document_get_node(&kc->doc, *it);
        const char *n = yscalar(ymap_get(kc, e, "name"));
        if (n != NULL && strcmp(n, name) == 0) {
            yaml_node_t *b = ymap_get(kc, e, field);
            *body = b != NULL && b->type == YAML_MAPPING_NODE ? b : NULL;
            return true;
        }
    }
    return false;
}

/* Copies `val` into a fixed field, failing rather than truncating. */
static int kc_copy(kubeconfig *kc, const char *what, const char *val, char *out, size_t outsz,
                   kgpu_error *err)
{
    size_t n = strlen(val);
    if (n >= outsz)
        return kc_fail(kc, err, KGPU_ERANGE, "%s is %zu bytes, more than the %zu allowed", what, n,
                       outsz - 1);
    memcpy(out, val, n + 1);
    return 0;
}

/* A file named by the kubeconfig: relative to its directory, and readable now. */
static int kc_file(kubeconfig *kc, const char *what, const char *val, char *out, size_t outsz,
                   kgpu_error *err)
{
    int n;
    if (val[0] == '/' || kc->dir[0] == '\0')
        n = snprintf(out, outsz, "%s", val);
    else
        n = snprintf(out, outsz, "%s%s%s", kc->dir, strcmp(kc->dir, "/") == 0 ? "" : "/", val);
    if (n < 0 || (size_t)n >= outsz)
        return kc_fail(kc, err, KGPU_ERANGE, "%s path '%s' is too long", what, val);
    if (access(out, R_OK) != 0)
        return kc_fail(kc, err, KGPU_ENOENT, "%s %s: %s", what, out, strerror(errno));
    return 0;
}

/* Decodes a base64 *-data field into *out (malloc'd PEM text). */
static int kc_data(kubeconfig *kc, const char *owner, const char *key, const char *val, char **out,
                   kgpu_error *err)
{
    free(*out);
    *out = base64_decode(val, strlen(val));
    if (*out == NULL)
        return kc_fail(kc, err, KGPU_EPARSE, "%s: %s is not valid base64 of PEM text", owner, key);
    return 0;
}

static int kc_bool(kubeconfig *kc, const char *owner, const char *key, yaml_node_t *n, bool *out,
                   kgpu_error *err)
{
    const char *s = yscalar(n);
    *out = false;
    if (s == NULL)
        return 0;
    /* kubeconfig is read by Go's YAML 1.1 parser: these are its booleans. */
    static const char *const yes[] = {"true", "yes", "on", "y"};
    static const char *const no[] = {"false", "no", "off", "n"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0)
            return 0;
    }
    return kc_fail(kc, err, KGPU_EPARSE, "%s: %s: expected true or false, got '%s'", owner, key, s);
}

static int kc_cluster(kubeconfig *kc, yaml_node_t *root, const char *name, kgpu_k8s_config *cfg,
                      kgpu_error *err)
{
    char owner[300];
    yaml_node_t *cl;
    if (!named_entry(kc, root, "clusters", "cluster", name, &cl))
        return kc_fail(kc, err, KGPU_EPARSE, "no cluster '%s'", name);
    snprintf(owner, sizeof(owner), "cluster '%s'", name);
    const char *server = yscalar(ymap_get(kc, cl, "server"));
    if (server == NULL)
        return kc_fail(kc, err, KGPU_EPARSE, "%s has no server", owner);
    if (strncmp(server, "https://", 8) != 0 && strncmp(server, "http://", 7) != 0)
        return kc_fail(kc, err, KGPU_EPARSE, "%s: server '%s' is not an http(s) URL", owner,
                       server);
    int rc = kc_copy(kc, "server", server, cfg->server, sizeof(cfg->server), err);
    if (rc != 0)
        return rc;
    size_t n = strlen(cfg->server);
    while (n > 0 && cfg->server[n - 1] == '/')
        cfg->server[--n] = '\0';

    const char *v;
    if ((v = yscalar(ymap_get(kc, cl, "certificate-authority-data"))) != NULL)
        rc = kc_data(kc, owner, "certificate-authority-data", v, &cfg->ca_data, err);
    else if ((v = yscalar(ymap_get(kc, cl, "certificate-authority"))) != NULL)
        rc = kc_file(kc, "certificate-authority", v, cfg->ca_file, sizeof(cfg->ca_file), err);
    if (rc != 0)
        return rc;
    return kc_bool(kc, owner, "insecure-skip-tls-verify",
                   ymap_get(kc, cl, "insecure-skip-tls-verify"), &cfg->insecure, err);
}

static int kc_user(kubeconfig *kc, yaml_node_t *root, const char *name, kgpu_k8s_config *cfg,
                   kgpu_error *err)
{
    char owner[300];
    yaml_node_t *u;
    if (!named_entry(kc, root, "users", "user", name, &u))
        return kc_fail(kc, err, KGPU_EPARSE, "no user '%s'", name);
    snprintf(owner, sizeof(owner), "user '%s'", name);
    int rc = 0;
    const char *v;
    if ((v = yscalar(ymap_get(kc, u, "token"))) != NULL)
        rc = kc_copy(kc, "token", v, cfg->token, sizeof(cfg->token), err);
    if (rc == 0 && (v = yscalar(ymap_get(kc, u, "tokenFile"))) != NULL)
        rc = kc_file(kc, "tokenFile", v, cfg->token_file, sizeof(cfg->token_file), err);
    if (rc == 0 && (v = yscalar(ymap_get(kc, u, "client-certificate-data"))) != NULL)
        rc = kc_data(kc, owner, "client-certificate-data", v, &cfg->cert_data, err);
    else if (rc == 0 && (v = yscalar(ymap_get(kc, u, "client-certificate"))) != NULL)
        rc = kc_file(kc, "client-certificate", v, cfg->cert_file, sizeof(cfg->cert_file), err);
    if (rc == 0 && (v = yscalar(ymap_get(kc, u, "client-key-data"))) != NULL)
        rc = kc_data(kc, owner, "client-key-data", v, &cfg->key_data, err);
    else if (rc == 0 && (v = yscalar(ymap_get(kc, u, "client-key"))) != NULL)
        rc = kc_file(kc, "client-key", v, cfg->key_file, sizeof(cfg->key_file), err);
    if (rc != 0)
        return rc;

    bool has_cert = cfg->cert_data != NULL || cfg->cert_file[0] != '\0';
    bool has_key = cfg->key_data != NULL || cfg->key_file[0] != '\0';
    if (has_cert != has_key)
        return kc_fail(kc, err, KGPU_EPARSE, "%s has a client %s but no client %s", owner,
                       has_cert ? "certificate" : "key", has_cert ? "key" : "certificate");
    bool has_token = cfg->token[0] != '\0' || cfg->token_file[0] != '\0';
    if (!has_cert && !has_token &&
        (ymap_get(kc, u, "exec") != NULL || ymap_get(kc, u, "auth-provider") != NULL))
        return kc_fail(kc, err, KGPU_EINVAL,
                       "%s gets credentials from an exec or auth-provider plugin, which kgpu "
                       "does not run; use a token, tokenFile or client certificate",
                       owner);
    return 0;
}

int kgpu_k8s_config_kubeconfig(const char *path, kgpu_k8s_config *cfg, kgpu_error *err)
{
    if (path == NULL || cfg == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "kubeconfig: no path");
    config_init(cfg);
    kubeconfig kc = {.path = path};
    const char *slash = strrchr(path, '/');
    if (slash != NULL) {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        if (n >= sizeof(kc.dir))
            return kc_fail(&kc, err, KGPU_ERANGE, "path too long");
        memcpy(kc.dir, path, n);
        kc.dir[n] = '\0';
    }

    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kc_fail(&kc, err, errno == ENOENT ? KGPU_ENOENT : KGPU_EIO, "%s", strerror(errno));
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return kc_fail(&kc, err, KGPU_ENOMEM, "cannot start the YAML parser");
    }
    yaml_parser_set_input_file(&parser, f);
    int rc = 0;
    bool loaded = yaml_parser_load(&parser, &kc.doc) != 0;
    if (!loaded) {
        const yaml_mark_t *m = &parser.problem_mark;
        if (parser.error == YAML_MEMORY_ERROR)
            rc = kc_fail(&kc, err, KGPU_ENOMEM, "out of memory while parsing");
        else if (parser.error == YAML_READER_ERROR)
            rc = kc_fail(&kc, err, KGPU_EPARSE, "byte %zu: %s", parser.problem_offset,
                         parser.problem ? parser.problem : "unreadable");
        else
            rc = kc_fail(&kc, err, KGPU_EPARSE, "line %zu column %zu: %s%s%s", m->line + 1,
                         m->column + 1, parser.problem ? parser.problem : "syntax error",
                         parser.context ? " " : "", parser.context ? parser.context : "");
        goto out;
    }

    yaml_node_t *root = yaml_document_get_root_node(&kc.doc);
    if (root == NULL || root->type != YAML_MAPPING_NODE) {
        rc = kc_fail(&kc, err, KGPU_EPARSE, "%s", root == NULL ? "empty" : "not a YAML mapping");
        goto out;
    }
    const char *ctx_name = yscalar(ymap_get(&kc, root, "current-context"));
    if (ctx_name == NULL) {
        rc = kc_fail(&kc, err, KGPU_EPARSE, "no current-context");
        goto out;
    }
    yaml_node_t *ctx;
    if (!named_entry(&kc, root, "contexts", "context", ctx_name, &ctx)) {
        rc = kc_fail(&kc, err, KGPU_EPARSE, "no context '%s'", ctx_name);
        goto out;
    }
    const char *cluster = yscalar(ymap_get(&kc, ctx, "cluster"));
    if (cluster == NULL) {
        rc = kc_fail(&kc, err, KGPU_EPARSE, "context '%s' names no cluster", ctx_name);
        goto out;
    }
    rc = kc_cluster(&kc, root, cluster, cfg, err);
    const char *user = yscalar(ymap_get(&kc, ctx, "user"));
    if (rc == 0 && user != NULL) /* no user: anonymous requests */
        rc = kc_user(&kc, root, user, cfg, err);

out:
    if (loaded)
        yaml_document_delete(&kc.doc);
    yaml_parser_delete(&parser);
    fclose(f);
    if (rc != 0) {
        kgpu_k8s_config_clear(cfg);
        config_init(cfg);
    }
    return rc;
}

int kgpu_k8s_config_in_cluster(const char *sa_dir, kgpu_k8s_config *cfg, kgpu_error *err)
{
    if (cfg == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "in-cluster config: no config to fill");
    config_init(cfg);
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    if (host == NULL || host[0] == '\0' || port == NULL || port[0] == '\0')
        return kgpu_error_set(err, KGPU_ENOENT,
                              "not running in a Kubernetes pod: KUBERNETES_SERVICE_HOST and "
                              "KUBERNETES_SERVICE_PORT are not set (pass a kubeconfig instead)");
    if (sa_dir == NULL)
        sa_dir = KGPU__K8S_DEFAULT_SADIR;

    /* An IPv6 literal needs brackets in a URL. */
    bool v6 = strchr(host, ':') != NULL;
    int n = snprintf(cfg->server, sizeof(cfg->server), "https://%s%s%s:%s", v6 ? "[" : "", host,
                     v6 ? "]" : "", port);
    if (n < 0 || (size_t)n >= sizeof(cfg->server))
        return kgpu_error_set(err, KGPU_ERANGE, "in-cluster config: server address too long");
    n = snprintf(cfg->token_file, sizeof(cfg->token_file), "%s/token", sa_dir);
    if (n < 0 || (size_t)n >= sizeof(cfg->token_file))
        return kgpu_error_set(err, KGPU_ERANGE, "in-cluster config: %s: path too long", sa_dir);
    if (access(cfg->token_file, R_OK) != 0) {
        int e = errno;
        int rc = kgpu_error_set(err, e == ENOENT ? KGPU_ENOENT : KGPU_EIO,
                                "in-cluster config: service account token %s: %s", cfg->token_file,
                                strerror(e));
        config_init(cfg);
        return rc;
    }
    /* Like client-go: use ca.crt when it is there, else the system's CAs. */
    n = snprintf(cfg->ca_file, sizeof(cfg->ca_file), "%s/ca.crt", sa_dir);
    if (n < 0 || (size_t)n >= sizeof(cfg->ca_file) || access(cfg->ca_file, R_OK) != 0)
        cfg->ca_file[0] = '\0';
    return 0;
}
