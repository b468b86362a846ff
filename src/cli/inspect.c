/*
 * `kgpu inspect` (also `kubectl kgpu inspect`): what the extender knows about
 * GPU sharing, as a table per node and GPU. Talks to the extender's /inspect
 * directly (--server, with a client certificate when the extender requires
 * one, as it does by default), or through the API server's service proxy
 * when a kubeconfig is at hand. The proxy presents no client certificate, so
 * that way works only with an extender that requires none; the refusal is
 * explained rather than shown as a bare 403.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "k8s.h"
#include "kgpu/queue.h"

/* The service proxy's scheme prefix: https first (the shipped extender serves
 * HTTPS), http for an extender installed with TLS off. */
#define PROXY "/api/v1/namespaces/%s/services/%s:%s:%d/proxy"

static void usage(FILE *f)
{
    fprintf(f, "usage: kgpu inspect [NODE] [--detail] [--server URL | --kubeconfig FILE]\n"
               "                    [--cacert FILE] [--cert FILE --key FILE] [--namespace NS]\n"
               "                    [--queues] [--json]\n"
               "       kgpu inspect --clusters FILE [--json]\n"
               "\n"
               "Shows GPU sharing as the extender sees it: memory and compute allocated on each\n"
               "GPU, the pods on it, and cluster totals.\n"
               "  --server URL      the extender itself, e.g. https://127.0.0.1:12346 after\n"
               "                    kubectl -n kgpu-system port-forward service/kgpu-extender 12346\n"
               "  --cacert FILE     CA of the extender's serving certificate (with --server)\n"
               "  --cert, --key FILE  a client certificate the extender accepts (with --server;\n"
               "                    scripts/make-extender-certs.sh --client NAME makes one)\n"
               "  --kubeconfig FILE reach it through the API server's service proxy\n"
               "                    (default: $KUBECONFIG or ~/.kube/config when --server is not\n"
               "                    given)\n"
               "  --namespace NS    where the kgpu-extender Service runs (default kgpu-system)\n"
               "  --detail          list the pods on each GPU\n"
               "  --queues          the GPU queues instead: the tree, each queue's guarantee,\n"
               "                    limit, use and borrowing in GPUs, pods pending, evictions,\n"
               "                    and the recent evictions for reclaim\n"
               "  --json            print the extender's JSON as is\n"
               "  --clusters FILE   every cluster of kgpu-dispatcher's clusters file, per GPU\n"
               "                    model: GPUs, allocated, wholly free, pods (--json: as JSON)\n");
}

static int64_t jint(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

static void pct(char *buf, size_t len, int64_t part, int64_t whole)
{
    snprintf(buf, len, "%3" PRId64 "%%", whole > 0 ? part * 100 / whole : 0);
}

/* Pods bound to the node that kubelet has not yet asked the device plugin for. */
static void print_awaiting(json_t *node)
{
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(node, "awaiting_allocation"), i, w)
    {
        char asks[256] = "";
        size_t k, len = 0;
        json_t *a;
        json_array_foreach(json_object_get(w, "asks"), k, a)
        {
            int n = snprintf(asks + len, sizeof(asks) - len, "%s%s %" PRId64, k ? ", " : "",
                             json_string_value(json_object_get(a, "resource")), jint(a, "amount"));
            if (n < 0 || (size_t)n >= sizeof(asks) - len)
                break;
            len += (size_t)n;
        }
        printf("%-24s      awaiting kubelet: %s/%s (%s), %.0f s before it stops blocking "
               "same-size pods\n",
               "", json_string_value(json_object_get(w, "namespace")),
               json_string_value(json_object_get(w, "pod")), asks,
               json_number_value(json_object_get(w, "seconds_left")));
    }
}

static void print_node(json_t *node, bool detail)
{
    const char *name = json_string_value(json_object_get(node, "name"));
    json_t *gpus = json_object_get(node, "gpus");
    size_t i;
    json_t *g;
    json_array_foreach(gpus, i, g)
    {
        char mem[64], mp[24], cp[24];
        int64_t ma = jint(g, "memory_allocated_mib"), mt = jint(g, "memory_mib");
        int64_t ca = jint(g, "milli_allocated");
        pct(mp, sizeof(mp), ma, mt);
        pct(cp, sizeof(cp), ca, 1000);
        snprintf(mem, sizeof(mem), "%" PRId64 "/%" PRId64, ma, mt);
        printf("%-24s %3" PRId64 "  %-22s %17s %s  %4" PRId64 "/1000 %s  %4zu%s\n",
               i == 0 ? name : "", jint(g, "index"), json_string_value(json_object_get(g, "model")),
               mem, mp, ca, cp, json_array_size(json_object_get(g, "pods")),
               json_is_false(json_object_get(g, "healthy")) ? "  UNHEALTHY" : "");
        if (!detail)
            continue;
        size_t k;
        json_t *p;
        json_array_foreach(json_object_get(g, "pods"), k, p)
        {
            int64_t m = jint(p, "memory_mib");
            char amount[64];
            if (m < 0)
                snprintf(amount, sizeof(amount), "whole GPU");
            else
                snprintf(amount, sizeof(amount), "%" PRId64 " MiB, %" PRId64 " milli", m,
                         jint(p, "milli"));
            const char *status = json_string_value(json_object_get(p, "status")) ?: "";
            printf("%-24s      %s/%s (%s): %s%s\n", "",
                   json_string_value(json_object_get(p, "namespace")),
                   json_string_value(json_object_get(p, "pod")),
                   json_string_value(json_object_get(p, "container")), amount,
                   strcmp(status, "reserved") == 0   ? " [binding]"
                   : strcmp(status, "in-doubt") == 0 ? " [binding in doubt]"
                                                     : "");
        }
    }
    print_awaiting(node);
}

/* GPUs of an amount's gpu_milli, "-" when unset (null). */
static const char *gpus_of(json_t *amount, char *buf, size_t len)
{
    json_t *m = json_object_get(amount, "gpu_milli");
    if (!json_is_integer(m))
        return "-";
    return kgpu_queue_gpus_str(json_integer_value(m), buf, len);
}

/* Queue `parent` (NULL: the roots) and below it, depth first, indented by depth. */
static void print_queue_tree(json_t *queues, const char *parent, int depth)
{
    size_t i;
    json_t *q;
    json_array_foreach(queues, i, q)
    {
        const char *p = json_string_value(json_object_get(q, "parent"));
        if ((parent == NULL) != (p == NULL) || (parent != NULL && strcmp(parent, p) != 0))
            continue;
        const char *name = json_string_value(json_object_get(q, "name"));
        char label[96], g[32], l[32], u[32], b[32];
        snprintf(label, sizeof(label), "%*s%s", depth * 2, "", name ? name : "?");
        json_t *used = json_object_get(q, "used");
        printf("%-28s %9s %9s %9s %9s %10" PRId64 " %5" PRId64 " %7" PRId64 " %9" PRId64 "\n",
               label, gpus_of(json_object_get(q, "guarantee"), g, sizeof(g)),
               gpus_of(json_object_get(q, "limit"), l, sizeof(l)), gpus_of(used, u, sizeof(u)),
               gpus_of(json_object_get(q, "borrowed"), b, sizeof(b)), jint(used, "memory_mib"),
               jint(q, "pods"), jint(q, "pending"), jint(q, "evictions"));
        if (name != NULL && depth < KGPU_QUEUE_MAX_DEPTH)
            print_queue_tree(queues, name, depth + 1);
    }
}

static void print_queues(json_t *doc)
{
    json_t *queues = json_object_get(doc, "queues");
    if (!json_is_true(json_object_get(doc, "queues_enabled"))) {
        printf("no GPU queues: every pod is in queue default, and nothing is refused for quota\n");
        return;
    }
    printf("%-28s %9s %9s %9s %9s %10s %5s %7s %9s\n", "QUEUE", "GUARANTEE", "LIMIT", "USED",
           "BORROWED", "MEM MiB", "PODS", "PENDING", "EVICTIONS");
    print_queue_tree(queues, NULL, 0);
    size_t i;
    json_t *e;
    json_t *ev = json_object_get(doc, "queue_evictions");
    if (json_array_size(ev) > 0)
        printf("\nrecent evictions for reclaim (newest first):\n");
    json_array_foreach(ev, i, e)
    {
        char freed[32];
        printf("  %s  %s/%s (queue %s, %s GPUs on %s) for %s/%s (queue %s): %s\n",
               json_string_value(json_object_get(e, "time")),
               json_string_value(json_object_get(e, "namespace")),
               json_string_value(json_object_get(e, "pod")),
               json_string_value(json_object_get(e, "queue")),
               kgpu_queue_gpus_str(jint(e, "gpu_milli_freed"), freed, sizeof(freed)),
               json_string_value(json_object_get(e, "node")),
               json_string_value(json_object_get(e, "for_namespace")),
               json_string_value(json_object_get(e, "for_pod")),
               json_string_value(json_object_get(e, "for_queue")),
               json_string_value(json_object_get(e, "outcome")));
    }
}

int kgpu_cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        {"server", required_argument, NULL, 's'},
        {"kubeconfig", required_argument, NULL, 'k'},
        {"namespace", required_argument, NULL, 'n'},
        {"cacert", required_argument, NULL, 'A'},
        {"cert", required_argument, NULL, 'C'},
        {"key", required_argument, NULL, 'K'},
        {"detail", no_argument, NULL, 'd'},
        {"queues", no_argument, NULL, 'q'},
        {"json", no_argument, NULL, 'j'},
        {"clusters", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *server = getenv("KGPU_EXTENDER"), *kubeconfig = NULL, *ns = "kgpu-system";
    const char *cacert = NULL, *cert = NULL, *key = NULL, *clusters = NULL;
    bool detail = false, raw = false, queues = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            server = optarg;
            break;
        case 'k':
            kubeconfig = optarg;
            break;
        case 'n':
            ns = optarg;
            break;
        case 'A':
            cacert = optarg;
            break;
        case 'C':
            cert = optarg;
            break;
        case 'K':
            key = optarg;
            break;
        case 'd':
            detail = true;
            break;
        case 'j':
            raw = true;
            break;
        case 'q':
            queues = true;
            break;
        case 'c':
            clusters = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (clusters != NULL) {
        if (optind < argc || queues || detail || cacert || cert || kubeconfig) {
            fprintf(stderr, "kgpu inspect: --clusters takes only --json: each cluster's "
                            "address and certificates are in the file\n");
            return 2;
        }
        return kgpu_inspect_clusters(clusters, raw);
    }
    const char *node = optind < argc ? argv[optind++] : NULL;
    if (optind < argc || (queues && node != NULL)) {
        usage(stderr);
        return 2;
    }
    if ((cert != NULL) != (key != NULL)) {
        fprintf(stderr, "kgpu inspect: --cert and --key go together\n");
        return 2;
    }
    bool direct = server != NULL && kubeconfig == NULL;
    if (!direct && (cacert || cert)) {
        fprintf(stderr, "kgpu inspect: --cacert, --cert and --key are for --server: the API "
                        "server's service proxy would not pass them on\n");
        return 2;
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    kgpu_k8s_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    bool proxied = false;
    int rc;
    if (direct) {
        snprintf(cfg.server, sizeof(cfg.server), "%s", server);
        size_t l = strlen(cfg.server);
        while (l > 0 && cfg.server[l - 1] == '/')
            cfg.server[--l] = '\0';
        snprintf(cfg.ca_file, sizeof(cfg.ca_file), "%s", cacert ? cacert : "");
        snprintf(cfg.cert_file, sizeof(cfg.cert_file), "%s", cert ? cert : "");
        snprintf(cfg.key_file, sizeof(cfg.key_file), "%s", key ? key : "");
        rc = 0;
    } else {
        char path[1024];
        const char *home = getenv("HOME"), *env = getenv("KUBECONFIG");
        if (kubeconfig == NULL && env != NULL && *env) {
            snprintf(path, sizeof(path), "%s", env);
            char *colon = strchr(path, ':'); /* a list: the first file */
            if (colon)
                *colon = '\0';
            kubeconfig = path;
        } else if (kubeconfig == NULL && home != NULL) {
            snprintf(path, sizeof(path), "%s/.kube/config", home);
            kubeconfig = access(path, R_OK) == 0 ? path : NULL;
        }
        if (kubeconfig == NULL) {
            snprintf(cfg.server, sizeof(cfg.server), "http://127.0.0.1:12346");
            rc = 0;
        } else {
            rc = kgpu_k8s_config_kubeconfig(kubeconfig, &cfg, &err);
            proxied = true;
        }
    }
    kgpu_k8s *k = rc == 0 ? kgpu_k8s_new(&cfg, &err) : NULL;
    kgpu_k8s_config_clear(&cfg);
    if (k == NULL) {
        fprintf(stderr, "kgpu inspect: %s\n", err.msg);
        return 1;
    }
    char url[1024];
    kgpu_http_resp resp = {0};
    /* Through the proxy: https, then http if the API server could not speak
     * TLS to it (502/503: an extender with TLS off). */
    static const char *const schemes[] = {"https", "http"};
    for (size_t i = 0; i < (proxied ? 2u : 1u); i++) {
        char prefix[512] = "";
        if (proxied)
            snprintf(prefix, sizeof(prefix), PROXY, ns, schemes[i], "kgpu-extender", 12346);
        snprintf(url, sizeof(url), "%s/inspect%s%s", prefix, node ? "/" : "", node ? node : "");
        free(resp.body);
        memset(&resp, 0, sizeof(resp));
        rc = kgpu_k8s_request(k, "GET", url, NULL, NULL, &resp, &err);
        if (rc != 0 || (resp.status != 502 && resp.status != 503))
            break;
    }
    kgpu_k8s_free(k);
    if (rc != 0 || resp.status != 200) {
        if (rc != 0)
            fprintf(stderr, "kgpu inspect: %s\n", err.msg);
        else if (resp.status == 403 && proxied && resp.body &&
                 strstr(resp.body, "client certificate required"))
            fprintf(stderr,
                    "kgpu inspect: the extender requires a client certificate, and the API "
                    "server's service proxy presents none. Reach the extender directly:\n"
                    "  kubectl -n %s port-forward service/kgpu-extender 12346 &\n"
                    "  kgpu inspect --server https://127.0.0.1:12346 --cacert ca.crt "
                    "--cert NAME.crt --key NAME.key\n"
                    "(scripts/make-extender-certs.sh --client NAME makes the certificate)\n",
                    ns);
        else
            fprintf(stderr, "kgpu inspect: %s answered %ld: %.300s\n", url, resp.status,
                    resp.body ? resp.body : "");
        free(resp.body);
        return 1;
    }
    if (raw) {
        fputs(resp.body, stdout);
        fputc('\n', stdout);
        free(resp.body);
        return 0;
    }
    json_t *doc = json_loads(resp.body, 0, NULL);
    free(resp.body);
    if (doc == NULL) {
        fprintf(stderr, "kgpu inspect: the extender's answer is not JSON\n");
        return 1;
    }
    if (queues) {
        print_queues(doc);
        json_decref(doc);
        return 0;
    }
    printf("%-24s %3s  %-22s %22s  %14s  %4s\n", "NODE", "GPU", "MODEL", "MEMORY MiB (alloc/total)",
           "COMPUTE milli", "PODS");
    if (node != NULL) {
        print_node(doc, detail);
    } else {
        size_t i;
        json_t *n;
        json_array_foreach(json_object_get(doc, "nodes"), i, n) print_node(n, detail);
        json_t *t = json_object_get(doc, "totals");
        char mp[24], cp[24];
        pct(mp, sizeof(mp), jint(t, "memory_allocated_mib"), jint(t, "memory_mib"));
        pct(cp, sizeof(cp), jint(t, "milli_allocated"), jint(t, "gpus") * 1000);
        printf("\ncluster: %" PRId64 " nodes, %" PRId64 " GPUs, %" PRId64 " pods holding GPUs\n"
               "GPU memory allocated: %" PRId64 "/%" PRId64 " MiB (%s)\n"
               "GPU compute allocated: %" PRId64 "/%" PRId64 " milli (%s)\n",
               jint(t, "nodes"), jint(t, "gpus"), jint(t, "pods"), jint(t, "memory_allocated_mib"),
               jint(t, "memory_mib"), mp, jint(t, "milli_allocated"), jint(t, "gpus") * 1000, cp);
    }
    json_decref(doc);
    return 0;
}
