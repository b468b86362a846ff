/*
 * kgpu-extender configuration: defaults, one YAML file (--config), then
 * flags, which have the last word.
 */
#include <ctype.h>
#include <getopt.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "base.h"
#include "kgpu/consolidate.h"
#include "podspec.h"
#include "nodegroups.h"
#include "pricefile.h"
#include "queuefile.h"
#include "yamljson.h"

#define ALLOCATE_WAIT_MAX 86400 /* a day: anything longer is a pod that will never start */
#define BIND_DOUBT_MAX    3600  /* an hour: far past any API server's request timeout */
#define MAX_CONNECTIONS   65536 /* descriptors, and libmicrohttpd's buffer each */
#define OPT_CONSOLIDATE      1101 /* long options without a short one */
#define OPT_SCALE_DOWN_GUARD 1102
#define OPT_CONSOLIDATE_NODES 1103
#define OPT_CLUSTER_NAME      1104
#define OPT_NODE_GROUPS       1105

void ext_config_defaults(ext_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->listen, sizeof(cfg->listen), "0.0.0.0:12346");
    snprintf(cfg->policy, sizeof(cfg->policy), "kgpu");
    cfg->memory_unit_mib = 1024;
    cfg->log_level = EXT_INFO;
    cfg->max_body_bytes = 8L << 20;
    cfg->max_json_depth = 64;
    cfg->max_connections = 2048;
    snprintf(cfg->probe_listen, sizeof(cfg->probe_listen), "0.0.0.0:12347");
    cfg->max_connections_per_client = 256;
    cfg->request_timeout_s = 30;
    cfg->max_buffered_bytes = 64L << 20;
    cfg->max_node_names = 20000;
    cfg->serve_threads = 2;
    cfg->handler_threads = 16;
    cfg->pending_pods_max = 1024;
    const char *ns = getenv("POD_NAMESPACE");
    snprintf(cfg->lease_ns, sizeof(cfg->lease_ns), "%.63s", ns && *ns ? ns : "kgpu-system");
    snprintf(cfg->lease_name, sizeof(cfg->lease_name), "kgpu-extender");
    cfg->lease_duration_s = 15;
    cfg->allocate_wait_s = 120;
    /* kube-apiserver's default --request-timeout: the longest a request it took may run. */
    cfg->bind_doubt_s = 60;
    cfg->scale_down_guard_s = 30;
}

static int parse_level(const char *s, int *out, kgpu_error *err)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    return kgpu_error_set(err, KGPU_EINVAL, "log level '%s': expected error, warn, info or debug",
                          s);
}

static int parse_unit(const char *s, int64_t *mib, kgpu_error *err)
{
    int64_t bytes;
    if (kgpu_quantity_value(s, &bytes, err) != 0)
        return err ? err->code : KGPU_EINVAL;
    if (bytes < (1 << 20) || bytes % (1 << 20) != 0 || bytes > (1LL << 40))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "memory unit '%s': a whole number of MiB between 1Mi and 1Ti", s);
    *mib = bytes >> 20;
    return 0;
}

static int set_path(char *dst, size_t len, const char *src, const char *what, kgpu_error *err)
{
    if (strlen(src) >= len)
        return kgpu_error_set(err, KGPU_EINVAL, "%s: path too long", what);
    snprintf(dst, len, "%s", src);
    return 0;
}

static int int_flag(const char *flag, const char *text, long min, long max, int *out,
                    kgpu_error *err)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end || v < min || v > max)
        return kgpu_error_set(err, KGPU_EINVAL, "%s '%s': %ld..%ld", flag, text, min, max);
    *out = (int)v;
    return 0;
}

void ext_config_free(ext_config *cfg)
{
    kgpu_queues_free(cfg->queues);
    cfg->queues = NULL;
    json_decref(cfg->namespace_queues);
    cfg->namespace_queues = NULL;
    free(cfg->prices);
    cfg->prices = NULL;
    free(cfg->node_groups);
    cfg->node_groups = NULL;
}

/* namespaceQueues: {namespace: queue}, both DNS labels; kept as given. */
static int parse_namespace_queues(ext_config *cfg, const char *path, json_t *v, kgpu_error *err)
{
    if (!json_is_object(v))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "%s: namespaceQueues: expected a mapping of namespace to queue",
                              path);
    const char *ns;
    json_t *q;
    json_object_foreach(v, ns, q)
    {
        const char *name = json_string_value(q);
        if (name == NULL || name[0] == '\0' || strlen(name) > KGPU_QUEUE_NAME_MAX ||
            strlen(ns) > 63)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "%s: namespaceQueues.%.63s: expected a queue name (at most %d "
                                  "characters)",
                                  path, ns, KGPU_QUEUE_NAME_MAX);
    }
    json_decref(cfg->namespace_queues);
    cfg->namespace_queues = json_deep_copy(v);
    if (cfg->namespace_queues == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    return 0;
}

/* routePodsTo: a scheduler's name as pods carry it, 1-63 of [a-z0-9.-], alphanumeric at the ends. */
static int check_scheduler_name(const char *name, kgpu_error *err)
{
    size_t n = strlen(name);
    bool ok = n >= 1 && n <= 63 && isalnum((unsigned char)name[0]) &&
              isalnum((unsigned char)name[n - 1]);
    for (size_t i = 0; ok && i < n; i++)
        ok = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
             name[i] == '-' || name[i] == '.';
    if (!ok)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "routePodsTo: '%.80s' is not a scheduler name (1-63 of a-z, 0-9, "
                              "'-', '.')",
                              name);
    return 0;
}

/* clusterName: a DNS-1123 label, as a MultiKueueCluster's name is. */
static int check_cluster_name(const char *name, kgpu_error *err)
{
    size_t n = strlen(name);
    bool ok = n >= 1 && n <= 63 && isalnum((unsigned char)name[0]) &&
              isalnum((unsigned char)name[n - 1]);
    for (size_t i = 0; ok && i < n; i++)
        ok = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
             name[i] == '-';
    if (!ok)
        return kgpu_error_set(err, KGPU_EINVAL,
                              "clusterName: '%.80s' is not a DNS label (1-63 of a-z, 0-9, '-')",
                              name);
    return 0;
}

static int check_policy(const char *name, kgpu_error *err)
{
    if (kgpu_policy_find(name) == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "unknown policy '%s'", name);
    return 0;
}

int ext_config_load_file(ext_config *cfg, const char *path, kgpu_error *err)
{
    json_t *root = kgpu_yaml_load_file(path, err);
    if (root == NULL)
        return err ? err->code : KGPU_EPARSE;
    int rc = 0;
    if (!json_is_object(root) && !json_is_null(root)) {
        rc = kgpu_error_set(err, KGPU_EPARSE, "%s: expected a mapping at the top", path);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        const char *s = json_string_value(v);
        if (strcmp(key, "listen") == 0 && s) {
            rc = set_path(cfg->listen, sizeof(cfg->listen), s, "listen", err);
        } else if (strcmp(key, "policy") == 0 && s) {
            rc = check_policy(s, err);
            if (rc == 0)
                snprintf(cfg->policy, sizeof(cfg->policy), "%s", s);
        } else if (strcmp(key, "memoryUnit") == 0 && (s || json_is_integer(v))) {
            char tmp[32];
            if (!s)
                snprintf(tmp, sizeof(tmp), "%lld", (long long)json_integer_value(v));
            rc = parse_unit(s ? s : tmp, &cfg->memory_unit_mib, err);
        } else if (strcmp(key, "clusterFile") == 0 && s) {
            rc = set_path(cfg->cluster_file, sizeof(cfg->cluster_file), s, key, err);
        } else if (strcmp(key, "kubeconfig") == 0 && s) {
            rc = set_path(cfg->kubeconfig, sizeof(cfg->kubeconfig), s, key, err);
        } else if (strcmp(key, "logLevel") == 0 && s) {
            rc = parse_level(s, &cfg->log_level, err);
        } else if (strcmp(key, "maxBodyBytes") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 1024) {
            cfg->max_body_bytes = (long)json_integer_value(v);
        } else if (strcmp(key, "maxJSONDepth") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 4 && json_integer_value(v) <= 1000) {
            cfg->max_json_depth = (int)json_integer_value(v);
        } else if (strcmp(key, "maxConnections") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 1 && json_integer_value(v) <= MAX_CONNECTIONS) {
            cfg->max_connections = (int)json_integer_value(v);
        } else if (strcmp(key, "maxConnectionsPerClient") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 1 && json_integer_value(v) <= MAX_CONNECTIONS) {
            cfg->max_connections_per_client = (int)json_integer_value(v);
        } else if (strcmp(key, "probeListen") == 0 && s) {
            rc = set_path(cfg->probe_listen, sizeof(cfg->probe_listen), s, "probeListen", err);
            cfg->probe_listen_given = true;
        } else if (strcmp(key, "requestTimeoutSeconds") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 1 && json_integer_value(v) <= 3600) {
            cfg->request_timeout_s = (int)json_integer_value(v);
        } else if (strcmp(key, "maxBufferedBytes") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 1024) {
            cfg->max_buffered_bytes = (long)json_integer_value(v);
        } else if (strcmp(key, "maxNodeNames") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 1 && json_integer_value(v) <= 1000000) {
            cfg->max_node_names = (int)json_integer_value(v);
        } else if (strcmp(key, "serveThreads") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 0 && json_integer_value(v) <= 64) {
            cfg->serve_threads = (int)json_integer_value(v);
        } else if (strcmp(key, "handlerThreads") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 1 && json_integer_value(v) <= 1024) {
            cfg->handler_threads = (int)json_integer_value(v);
        } else if (strcmp(key, "pendingPods") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 16 && json_integer_value(v) <= 1 << 20) {
            cfg->pending_pods_max = (int)json_integer_value(v);
        } else if (strcmp(key, "leaderElect") == 0 && json_is_boolean(v)) {
            cfg->leader_elect = json_is_true(v);
        } else if (strcmp(key, "leaseNamespace") == 0 && s && strlen(s) < sizeof(cfg->lease_ns)) {
            snprintf(cfg->lease_ns, sizeof(cfg->lease_ns), "%s", s);
        } else if (strcmp(key, "leaseName") == 0 && s && strlen(s) < sizeof(cfg->lease_name)) {
            snprintf(cfg->lease_name, sizeof(cfg->lease_name), "%s", s);
        } else if (strcmp(key, "leaseDurationSeconds") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 2 && json_integer_value(v) <= 3600) {
            cfg->lease_duration_s = (int)json_integer_value(v);
        } else if (strcmp(key, "allocateWaitSeconds") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 0 && json_integer_value(v) <= ALLOCATE_WAIT_MAX) {
            cfg->allocate_wait_s = (int)json_integer_value(v);
        } else if (strcmp(key, "bindDoubtSeconds") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 1 && json_integer_value(v) <= BIND_DOUBT_MAX) {
            cfg->bind_doubt_s = (int)json_integer_value(v);
        } else if (strcmp(key, "consolidateNodes") == 0 && json_is_boolean(v)) {
            cfg->consolidate_nodes = json_is_true(v);
        } else if (strcmp(key, "scaleDownGuardSeconds") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 0 && json_integer_value(v) <= 3600) {
            cfg->scale_down_guard_s = (int)json_integer_value(v);
        } else if (strcmp(key, "consolidateMoves") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 0 && json_integer_value(v) <= KGPU_MAX_MOVES) {
            cfg->consolidate_moves = (int)json_integer_value(v);
        } else if (strcmp(key, "routePodsTo") == 0 && s) {
            rc = check_scheduler_name(s, err);
            if (rc == 0)
                snprintf(cfg->route_pods_to, sizeof(cfg->route_pods_to), "%s", s);
        } else if (strcmp(key, "clusterName") == 0 && s) {
            rc = check_cluster_name(s, err);
            if (rc == 0)
                snprintf(cfg->cluster_name, sizeof(cfg->cluster_name), "%s", s);
        } else if (strcmp(key, "queues") == 0) {
            kgpu_queues *qs = NULL;
            rc = kgpu_queues_from_json(root, path, &qs, err);
            if (rc == 0) {
                kgpu_queues_free(cfg->queues);
                cfg->queues = qs;
            }
        } else if (strcmp(key, "nodeGroups") == 0 && s) {
            rc = set_path(cfg->node_groups_file, sizeof(cfg->node_groups_file), s, key, err);
        } else if (strcmp(key, "prices") == 0 && s) {
            rc = set_path(cfg->prices_file, sizeof(cfg->prices_file), s, key, err);
        } else if (strcmp(key, "namespaceQueues") == 0) {
            rc = parse_namespace_queues(cfg, path, v, err);
        } else if (strcmp(key, "tls") == 0 && json_is_object(v)) {
            const char *k2;
            json_t *v2;
            json_object_foreach(v, k2, v2)
            {
                const char *s2 = json_string_value(v2);
                if (s2 == NULL)
                    rc = kgpu_error_set(err, KGPU_EINVAL, "%s: tls.%s is not a string", path, k2);
                else if (strcmp(k2, "cert") == 0)
                    rc = set_path(cfg->tls_cert, sizeof(cfg->tls_cert), s2, "tls.cert", err);
                else if (strcmp(k2, "key") == 0)
                    rc = set_path(cfg->tls_key, sizeof(cfg->tls_key), s2, "tls.key", err);
                else if (strcmp(k2, "clientCA") == 0)
                    rc = set_path(cfg->tls_client_ca, sizeof(cfg->tls_client_ca), s2,
                                  "tls.clientCA", err);
                else
                    rc = kgpu_error_set(err, KGPU_EINVAL, "%s: unknown key tls.%s", path, k2);
                if (rc != 0)
                    break;
            }
        } else {
            static const char *known[] = {"listen",
                                          "policy",
                                          "memoryUnit",
                                          "clusterFile",
                                          "kubeconfig",
                                          "logLevel",
                                          "maxBodyBytes",
                                          "maxJSONDepth",
                                          "maxConnections",
                                          "maxConnectionsPerClient",
                                          "probeListen",
                                          "requestTimeoutSeconds",
                                          "maxBufferedBytes",
                                          "maxNodeNames",
                                          "serveThreads",
                                          "handlerThreads",
                                          "pendingPods",
                                          "tls",
                                          "leaderElect",
                                          "leaseNamespace",
                                          "leaseName",
                                          "leaseDurationSeconds",
                                          "allocateWaitSeconds",
                                          "routePodsTo",
                                          "clusterName",
                                          "nodeGroups",
                                          "prices"};
            bool is_known = false;
            for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
                is_known = is_known || strcmp(key, known[i]) == 0;
            rc = kgpu_error_set(err, KGPU_EINVAL, "%s: %s: %s", path, key,
                                is_known ? "wrong type or out of range" : "unknown key");
        }
        if (rc != 0)
            break;
    }
out:
    json_decref(root);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kgpu-extender [options]\n"
            "\n"
            "The kube-scheduler HTTP extender of kgpu: filter, prioritize, bind and preempt\n"
            "for pods that ask for nvidia.com/gpu, kgpu.io/gpu-mem (or aliyun.com/gpu-mem),\n"
            "kgpu.io/gpu-core and kgpu.io/gpu-count.\n"
            "\n"
            "  --listen ADDR:PORT     where to serve (default 0.0.0.0:12346)\n"
            "  --config FILE          YAML configuration (flags override it)\n"
            "  --cluster-file FILE    run without an API server: inventory from FILE, binds kept\n"
            "                         in memory\n"
            "  --kubeconfig FILE      API server from a kubeconfig (default: in-cluster)\n"
            "  --policy NAME          default placement policy (default kgpu): fgd, binpack, ...\n"
            "  --memory-unit QTY      size of one kgpu.io/gpu-mem unit (default 1Gi)\n"
            "  --tls-cert FILE --tls-key FILE   serve HTTPS\n"
            "  --tls-client-ca FILE   require client certificates signed by this CA\n"
            "  --log-level LEVEL      error, warn, info (default) or debug\n"
            "  --max-body-bytes N     largest request body accepted (default 8 MiB)\n"
            "  --max-buffered-bytes N request bodies held at once, all connections together\n"
            "                         (default 64 MiB); uploads past it get 503\n"
            "  --max-connections N    connections on --listen (default 2048)\n"
            "  --max-connections-per-client N  from one IP address (default 256)\n"
            "  --request-timeout S    seconds a connection has to send a whole request, from\n"
            "                         its accept or its previous answer (default 30)\n"
            "  --max-node-names N     node names per filter, prioritize or preempt call\n"
            "                         (default 20000)\n"
            "  --probe-listen ADDR:PORT  serve /healthz and /readyz here too, apart from the\n"
            "                         scheduling port (default 0.0.0.0:12347; '' none)\n"
            "  --serve-threads N      epoll threads reading requests (default 2; 0: one\n"
            "                         thread per connection)\n"
            "  --handler-threads N    threads answering requests (default 16)\n"
            "  --leader-elect         only the holder of a Lease binds (run several replicas)\n"
            "  --lease-namespace NS --lease-name NAME   the Lease (default: the pod's\n"
            "                         namespace, else kgpu-system; kgpu-extender)\n"
            "  --lease-duration S     seconds a standby waits after the last renewal (default 15)\n"
            "  --allocate-wait S      seconds a bound pod, until kubelet has allocated its\n"
            "                         devices, keeps pods asking the same amount off its node\n"
            "                         (default 120; 0 turns this off)\n"
            "  --bind-doubt S         seconds a Binding that got no usable answer (a timeout,\n"
            "                         a 5xx) keeps its GPUs, unless the API server shows\n"
            "                         the pod first (default 60)\n"
            "  --consolidate-nodes    with the guard, empty one node at a time whose GPU\n"
            "                         pods are all kgpu.io/restartable and could all run\n"
            "                         elsewhere, so that an autoscaler removes it\n"
            "  --scale-down-guard S   every S seconds, annotate GPU nodes whose GPU pods\n"
            "                         could not all run elsewhere so that Cluster Autoscaler\n"
            "                         and Karpenter keep them (default 30; 0: off)\n"
            "  --consolidate N        for a pod that fits no node, evict up to N (1..3)\n"
            "                         kgpu.io/restartable pods of one node so that it fits,\n"
            "                         each able to run elsewhere (default 0: off)\n"
            "  --route-pods-to NAME   answer POST /mutate/pods, the webhook giving GPU pods\n"
            "                         schedulerName NAME (kgpu's own scheduler; default off)\n"
            "  --prices FILE          prices per GPU-hour by model and capacity type: adds\n"
            "                         the cost per namespace and queue to /metrics, and\n"
            "                         prices to POST /estimate\n"
            "  --cluster-name NAME    this cluster's name in POST /estimate's answers\n"
            "  --node-groups FILE     the node groups an autoscaler can grow here: POST\n"
            "                         /estimate says how many more copies they could take\n"
            "  --service-account-dir DIR  token and ca.crt of the in-cluster service account\n"
            "  --help                 this text\n"
            "  --port-file FILE       write the port served once listening (for --listen :0)\n"
            "  --version              print the version\n");
}

int ext_config_parse_args(ext_config *cfg, int argc, char **argv, kgpu_error *err)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, 'l'},
        {"config", required_argument, NULL, 'c'},
        {"cluster-file", required_argument, NULL, 'f'},
        {"kubeconfig", required_argument, NULL, 'k'},
        {"policy", required_argument, NULL, 'p'},
        {"memory-unit", required_argument, NULL, 'u'},
        {"tls-cert", required_argument, NULL, 'C'},
        {"tls-key", required_argument, NULL, 'K'},
        {"tls-client-ca", required_argument, NULL, 'A'},
        {"log-level", required_argument, NULL, 'L'},
        {"max-body-bytes", required_argument, NULL, 'b'},
        {"service-account-dir", required_argument, NULL, 's'},
        {"port-file", required_argument, NULL, 'P'},
        {"leader-elect", no_argument, NULL, 'E'},
        {"lease-namespace", required_argument, NULL, 'N'},
        {"lease-name", required_argument, NULL, 'M'},
        {"lease-duration", required_argument, NULL, 'D'},
        {"allocate-wait", required_argument, NULL, 'W'},
        {"bind-doubt", required_argument, NULL, 'O'},
        {"route-pods-to", required_argument, NULL, 'r'},
        {"consolidate", required_argument, NULL, OPT_CONSOLIDATE},
        {"scale-down-guard", required_argument, NULL, OPT_SCALE_DOWN_GUARD},
        {"consolidate-nodes", no_argument, NULL, OPT_CONSOLIDATE_NODES},
        {"max-buffered-bytes", required_argument, NULL, 'B'},
        {"max-connections", required_argument, NULL, 'x'},
        {"max-connections-per-client", required_argument, NULL, 'X'},
        {"request-timeout", required_argument, NULL, 'T'},
        {"max-node-names", required_argument, NULL, 'n'},
        {"probe-listen", required_argument, NULL, 'R'},
        {"serve-threads", required_argument, NULL, 't'},
        {"handler-threads", required_argument, NULL, 'H'},
        {"prices", required_argument, NULL, 'Q'},
        {"cluster-name", required_argument, NULL, OPT_CLUSTER_NAME},
        {"node-groups", required_argument, NULL, OPT_NODE_GROUPS},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* The file first, whatever its place on the command line, so flags win. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *path = NULL;
        if (strcmp(a, "--config") == 0 && i + 1 < argc)
            path = argv[i + 1];
        else if (strncmp(a, "--config=", 9) == 0)
            path = a + 9;
        if (path != NULL) {
            int rc = set_path(cfg->config_file, sizeof(cfg->config_file), path, "--config", err);
            if (rc == 0)
                rc = ext_config_load_file(cfg, path, err);
            if (rc != 0)
                return rc;
        }
    }
    optind = 1;
    int c, rc = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'l':
            rc = set_path(cfg->listen, sizeof(cfg->listen), optarg, "--listen", err);
            break;
        case 'c':
            break;
        case 'f':
            rc = set_path(cfg->cluster_file, sizeof(cfg->cluster_file), optarg, "--cluster-file",
                          err);
            break;
        case 'k':
            rc = set_path(cfg->kubeconfig, sizeof(cfg->kubeconfig), optarg, "--kubeconfig", err);
            break;
        case 'p':
            rc = check_policy(optarg, err);
            if (rc == 0)
                snprintf(cfg->policy, sizeof(cfg->policy), "%s", optarg);
            break;
        case 'u':
            rc = parse_unit(optarg, &cfg->memory_unit_mib, err);
            break;
        case 'C':
            rc = set_path(cfg->tls_cert, sizeof(cfg->tls_cert), optarg, "--tls-cert", err);
            break;
        case 'K':
            rc = set_path(cfg->tls_key, sizeof(cfg->tls_key), optarg, "--tls-key", err);
            break;
        case 'A':
            rc = set_path(cfg->tls_client_ca, sizeof(cfg->tls_client_ca), optarg, "--tls-client-ca",
                          err);
            break;
        case 'L':
            rc = parse_level(optarg, &cfg->log_level, err);
            break;
        case 'b':
            cfg->max_body_bytes = strtol(optarg, &end, 10);
            if (end == optarg || *end || cfg->max_body_bytes < 1024)
                rc = kgpu_error_set(err, KGPU_EINVAL, "--max-body-bytes '%s': at least 1024",
                                    optarg);
            break;
        case 's':
            rc = set_path(cfg->sa_dir, sizeof(cfg->sa_dir), optarg, "--service-account-dir", err);
            break;
        case 'P':
            rc = set_path(cfg->port_file, sizeof(cfg->port_file), optarg, "--port-file", err);
            break;
        case 'E':
            cfg->leader_elect = true;
            break;
        case 'N':
            rc = set_path(cfg->lease_ns, sizeof(cfg->lease_ns), optarg, "--lease-namespace", err);
            break;
        case 'M':
            rc = set_path(cfg->lease_name, sizeof(cfg->lease_name), optarg, "--lease-name", err);
            break;
        case 'D':
            cfg->lease_duration_s = (int)strtol(optarg, &end, 10);
            if (end == optarg || *end || cfg->lease_duration_s < 2 || cfg->lease_duration_s > 3600)
                rc = kgpu_error_set(err, KGPU_EINVAL, "--lease-duration '%s': 2..3600 seconds",
                                    optarg);
            break;
        case OPT_CLUSTER_NAME:
            rc = check_cluster_name(optarg, err);
            if (rc == 0)
                snprintf(cfg->cluster_name, sizeof(cfg->cluster_name), "%s", optarg);
            break;
        case 'r':
            rc = check_scheduler_name(optarg, err);
            if (rc == 0)
                snprintf(cfg->route_pods_to, sizeof(cfg->route_pods_to), "%s", optarg);
            break;
        case 'W': {
            long wait = strtol(optarg, &end, 10);
            if (end == optarg || *end || wait < 0 || wait > ALLOCATE_WAIT_MAX)
                rc = kgpu_error_set(err, KGPU_EINVAL, "--allocate-wait '%s': 0..%d seconds", optarg,
                                    ALLOCATE_WAIT_MAX);
            else
                cfg->allocate_wait_s = (int)wait;
            break;
        }
        case OPT_CONSOLIDATE_NODES:
            cfg->consolidate_nodes = true;
            break;
        case OPT_SCALE_DOWN_GUARD:
            rc = int_flag("--scale-down-guard", optarg, 0, 3600, &cfg->scale_down_guard_s, err);
            break;
        case OPT_CONSOLIDATE:
            rc = int_flag("--consolidate", optarg, 0, KGPU_MAX_MOVES, &cfg->consolidate_moves,
                          err);
            break;
        case 'O':
            rc = int_flag("--bind-doubt", optarg, 1, BIND_DOUBT_MAX, &cfg->bind_doubt_s, err);
            break;
        case 'B':
            cfg->max_buffered_bytes = strtol(optarg, &end, 10);
            if (end == optarg || *end || cfg->max_buffered_bytes < 1024)
                rc = kgpu_error_set(err, KGPU_EINVAL, "--max-buffered-bytes '%s': at least 1024",
                                    optarg);
            break;
        case 'x':
            rc = int_flag("--max-connections", optarg, 1, MAX_CONNECTIONS, &cfg->max_connections,
                          err);
            break;
        case 'X':
            rc = int_flag("--max-connections-per-client", optarg, 1, MAX_CONNECTIONS,
                          &cfg->max_connections_per_client, err);
            break;
        case 'T':
            rc = int_flag("--request-timeout", optarg, 1, 3600, &cfg->request_timeout_s, err);
            break;
        case 'n':
            rc = int_flag("--max-node-names", optarg, 1, 1000000, &cfg->max_node_names, err);
            break;
        case 'R':
            rc = set_path(cfg->probe_listen, sizeof(cfg->probe_listen), optarg, "--probe-listen",
                          err);
            cfg->probe_listen_given = true;
            break;
        case 't':
            rc = int_flag("--serve-threads", optarg, 0, 64, &cfg->serve_threads, err);
            break;
        case 'H':
            rc = int_flag("--handler-threads", optarg, 1, 1024, &cfg->handler_threads, err);
            break;
        case 'Q':
            rc = set_path(cfg->prices_file, sizeof(cfg->prices_file), optarg, "--prices", err);
            break;
        case OPT_NODE_GROUPS:
            rc = set_path(cfg->node_groups_file, sizeof(cfg->node_groups_file), optarg,
                          "--node-groups", err);
            break;
        case 'V':
            printf("kgpu-extender %s\n", KGPU_VERSION);
            return 1;
        case 'h':
            usage(stdout);
            return 1;
        default:
            usage(stderr);
            return kgpu_error_set(err, KGPU_EINVAL, "bad command line");
        }
    }
    if (rc == 0 && optind < argc)
        rc = kgpu_error_set(err, KGPU_EINVAL, "unexpected argument '%s'", argv[optind]);
    if (rc == 0 && (cfg->tls_cert[0] != '\0') != (cfg->tls_key[0] != '\0'))
        rc = kgpu_error_set(err, KGPU_EINVAL, "--tls-cert and --tls-key go together");
    if (rc == 0 && !cfg->cluster_file[0] && (cfg->queues != NULL || cfg->namespace_queues != NULL))
        rc = kgpu_error_set(err, KGPU_EINVAL,
                            "%s: %s: queues come from GPUQueue objects in cluster mode, and "
                            "namespaces' queues from their kgpu.io/queue annotation (the file's "
                            "queues and namespaceQueues are for --cluster-file)",
                            cfg->config_file, cfg->queues != NULL ? "queues" : "namespaceQueues");
    if (rc == 0 && cfg->leader_elect && cfg->cluster_file[0])
        rc = kgpu_error_set(err, KGPU_EINVAL,
                            "--leader-elect needs an API server, not --cluster-file");
    if (rc == 0 && cfg->consolidate_nodes && cfg->scale_down_guard_s == 0)
        rc = kgpu_error_set(err, KGPU_EINVAL,
                            "--consolidate-nodes runs in the scale-down guard's rounds: it "
                            "needs --scale-down-guard above 0");
    /* A limit that cannot hold is refused rather than silently worked around. */
    if (rc == 0 && cfg->max_buffered_bytes < cfg->max_body_bytes)
        rc = kgpu_error_set(err, KGPU_EINVAL,
                            "maxBufferedBytes %ld is less than maxBodyBytes %ld: the largest "
                            "request could never be read",
                            cfg->max_buffered_bytes, cfg->max_body_bytes);
    if (rc == 0 && cfg->max_connections_per_client > cfg->max_connections)
        cfg->max_connections_per_client = cfg->max_connections;
    size_t ll = strlen(cfg->listen);
    bool any_port = ll >= 2 && strcmp(cfg->listen + ll - 2, ":0") == 0;
    /* --listen ...:0 asks for any free port (tests, several extenders on one machine): the
     * probes then take any free port too, unless told where. */
    if (rc == 0 && any_port && !cfg->probe_listen_given)
        snprintf(cfg->probe_listen, sizeof(cfg->probe_listen), "%s", cfg->listen);
    if (rc == 0 && cfg->probe_listen[0] && !any_port && strcmp(cfg->probe_listen, cfg->listen) == 0)
        rc = kgpu_error_set(err, KGPU_EINVAL, "--probe-listen must differ from --listen (%s)",
                            cfg->listen);
    if (rc == 0 && cfg->tls_client_ca[0] && !cfg->tls_cert[0])
        rc = kgpu_error_set(err, KGPU_EINVAL, "--tls-client-ca needs --tls-cert and --tls-key");
    if (rc == 0 && cfg->prices_file[0]) {
        /* Read once at start: a bad file stops the extender, naming the file and the field. */
        free(cfg->prices);
        cfg->prices = calloc(1, sizeof(*cfg->prices));
        if (cfg->prices == NULL)
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        else if ((rc = kgpu_prices_load_file(cfg->prices_file, cfg->prices, err)) != 0) {
            free(cfg->prices);
            cfg->prices = NULL;
        }
    }
    if (rc == 0 && cfg->node_groups_file[0]) {
        free(cfg->node_groups);
        cfg->node_groups = calloc(1, sizeof(*cfg->node_groups));
        if (cfg->node_groups == NULL)
            rc = kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        else if ((rc = kgpu_node_groups_load_file(cfg->node_groups_file, cfg->node_groups,
                                                  err)) != 0) {
            free(cfg->node_groups);
            cfg->node_groups = NULL;
        }
    }
    return rc;
}
