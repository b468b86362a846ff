/*
 * The Kubernetes API client (src/k8s) against apiserver_standin.py, a stand-in
 * with the real server's semantics: token auth, bind and its conflicts, merge
 * patch, paged lists (limit/continue from one snapshot, 410 Expired after a
 * compaction), list-then-watch with relists after dropped and expired
 * watches, and prompt stops. Also kubeconfig and in-cluster configuration
 * from temp files.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "k8s.h"

#define TOKEN   "secret-token"
#define STANDIN KGPU_SOURCE_DIR "/tests/integration/apiserver_standin.py"

static char tmp[256];      /* this run's scratch folder */
static pid_t standin = -1; /* the stand-in's pid */
static int port;
static kgpu_k8s *api; /* authorised client for the stand-in */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Writes `text` to tmp/name; returns the path in a static buffer per call slot. */
static const char *write_file(const char *name, const char *text)
{
    static char paths[8][512];
    static int slot;
    char *p = paths[slot++ % 8];
    snprintf(p, 512, "%s/%s", tmp, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

/* ---- the stand-in process ---- */

static void stop_standin(void)
{
    if (standin <= 0)
        return;
    kill(standin, SIGTERM);
    for (int i = 0; i < 300; i++) {
        if (waitpid(standin, NULL, WNOHANG) == standin) {
            standin = -1;
            return;
        }
        sleep_ms(10);
    }
    kill(standin, SIGKILL);
    waitpid(standin, NULL, 0);
    standin = -1;
}

static int start_standin(void)
{
    char portfile[300];
    snprintf(portfile, sizeof(portfile), "%s/port", tmp);
    pid_t parent = getpid();
    standin = fork();
    if (standin < 0)
        return -1;
    if (standin == 0) {
        /* Die with the test even if it crashes before its teardown. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        execl(KGPU_PYTHON, KGPU_PYTHON, STANDIN, "--port", "0", "--portfile", portfile, "--token",
              TOKEN, "--bookmark-interval", "0.5", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) { /* up to 10 s */
        FILE *f = fopen(portfile, "r");
        if (f != NULL) {
            int ok = fscanf(f, "%d", &port) == 1;
            fclose(f);
            if (ok && port > 0)
                return 0;
        }
        if (waitpid(standin, NULL, WNOHANG) == standin) {
            standin = -1;
            return -1;
        }
        sleep_ms(10);
    }
    stop_standin();
    return -1;
}

static kgpu_k8s *client_for(const char *token, long timeout_ms)
{
    kgpu_k8s_config cfg = {0};
    snprintf(cfg.server, sizeof(cfg.server), "http://127.0.0.1:%d", port);
    snprintf(cfg.token, sizeof(cfg.token), "%s", token);
    cfg.timeout_ms = timeout_ms;
    kgpu_error err = {0};
    kgpu_k8s *k = kgpu_k8s_new(&cfg, &err);
    if (k == NULL)
        fail_msg("kgpu_k8s_new: %s", err.msg);
    return k;
}

static int group_setup(void **state)
{
    snprintf(tmp, sizeof(tmp), "/tmp/kgpu-k8s-test.XXXXXX");
    if (mkdtemp(tmp) == NULL)
        return -1;
    if (start_standin() != 0) {
        fprintf(stderr, "cannot start %s %s\n", KGPU_PYTHON, STANDIN);
        return -1;
    }
    api = client_for(TOKEN, 5000);
    return 0;
}

static int group_teardown(void **state)
{
    kgpu_k8s_free(api);
    stop_standin();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- requests ---- */

/* METHOD path with `body`; asserts the status; returns the parsed body (caller decrefs). */
static json_t *call(const char *method, const char *path, const char *ctype, const char *body,
                    long want)
{
    kgpu_http_resp resp;
    kgpu_error err = {0};
    if (kgpu_k8s_request(api, method, path, ctype, body, &resp, &err) != 0)
        fail_msg("%s %s: %s", method, path, err.msg);
    if (resp.status != want)
        fail_msg("%s %s: HTTP %ld, want %ld: %s", method, path, resp.status, want, resp.body);
    json_t *doc = json_loadb(resp.body, resp.len, 0, NULL);
    free(resp.body);
    assert_non_null(doc);
    return doc;
}

static void control(const char *json)
{
    json_decref(call("POST", "/_control", NULL, json, 200));
}

static json_t *create_pod(const char *ns, const char *name, const char *annotations)
{
    char path[256], body[1024];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods", ns);
    snprintf(body, sizeof(body),
             "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"%s\","
             "\"annotations\":%s},\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"x\"}]}}",
             name, annotations ? annotations : "{}");
    return call("POST", path, NULL, body, 201);
}

static json_t *get_pod(const char *ns, const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", ns, name);
    return call("GET", path, NULL, NULL, 200);
}

static const char *annotation(json_t *pod, const char *key)
{
    return json_string_value(
        json_object_get(json_object_get(json_object_get(pod, "metadata"), "annotations"), key));
}

static const char *node_of(json_t *pod)
{
    return json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
}

static void test_token_required(void **state)
{
    kgpu_k8s *anon = client_for("", 0);
    kgpu_http_resp resp;
    kgpu_error err = {0};
    assert_int_equal(kgpu_k8s_request(anon, "GET", "/api/v1/pods", NULL, NULL, &resp, &err), 0);
    assert_int_equal(resp.status, 401);
    free(resp.body);
    kgpu_k8s_free(anon);

    kgpu_k8s *wrong = client_for("not-" TOKEN, 0);
    assert_int_equal(kgpu_k8s_request(wrong, "GET", "/api/v1/pods", NULL, NULL, &resp, &err), 0);
    assert_int_equal(resp.status, 401);
    free(resp.body);
    kgpu_k8s_free(wrong);

    json_t *list = call("GET", "/api/v1/pods", NULL, NULL, 200);
    assert_string_equal(json_string_value(json_object_get(list, "kind")), "PodList");
    assert_non_null(
        json_string_value(json_object_get(json_object_get(list, "metadata"), "resourceVersion")));
    json_decref(list);
}

static void test_transport_errors(void **state)
{
    /* A port nobody listens on. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(s, (struct sockaddr *)&a, &alen), 0);
    close(s);
    kgpu_k8s_config cfg = {0};
    snprintf(cfg.server, sizeof(cfg.server), "http://127.0.0.1:%d/", ntohs(a.sin_port));
    kgpu_error err = {0};
    kgpu_k8s *k = kgpu_k8s_new(&cfg, &err);
    assert_non_null(k);
    kgpu_http_resp resp;
    assert_int_equal(kgpu_k8s_request(k, "GET", "/api/v1/pods", NULL, NULL, &resp, &err), KGPU_EIO);
    char want[128];
    snprintf(want, sizeof(want), "GET http://127.0.0.1:%d/api/v1/pods: ", ntohs(a.sin_port));
    if (strncmp(err.msg, want, strlen(want)) != 0)
        fail_msg("error '%s' does not start with '%s'", err.msg, want);
    assert_null(resp.body);
    assert_true(resp.unsent); /* no connection: nothing can have been applied */
    kgpu_k8s_free(k);

    /* timeout_ms: the stand-in answers binds after 1.5 s. */
    json_decref(create_pod("default", "slow", NULL));
    control("{\"bind_delay_ms\":1500}");
    kgpu_k8s *quick = client_for(TOKEN, 300);
    double t0 = now_s();
    assert_int_equal(kgpu_k8s_bind(quick, "default", "slow", NULL, "n1", NULL, &resp, &err),
                     KGPU_EIO);
    assert_true(now_s() - t0 < 1.2);
    assert_non_null(strstr(err.msg, "timed out"));
    assert_false(resp.unsent); /* it went out: the server may apply it (and here does) */
    kgpu_k8s_free(quick);
    control("{\"bind_delay_ms\":0}");

    /* Bad arguments never reach the wire. */
    assert_int_equal(kgpu_k8s_request(api, "GET", "api/v1/pods", NULL, NULL, &resp, &err),
                     KGPU_EINVAL);
    assert_true(resp.unsent);
    cfg.server[0] = '\0';
    assert_null(kgpu_k8s_new(&cfg, &err));
    assert_int_equal(err.code, KGPU_EINVAL);
}

static void test_bind(void **state)
{
    json_t *pod = create_pod("default", "web-1", "{\"keep\":\"me\"}");
    const char *uid = json_string_value(json_object_get(json_object_get(pod, "metadata"), "uid"));
    assert_non_null(uid);
    json_t *ann = json_pack("{s:s, s:s}", "kgpu.io/gpu-ids", "0,1", "kgpu.io/milli", "500");
    kgpu_http_resp resp;
    kgpu_error err = {0};

    /* A 5xx the stand-in injects reaches the caller as a status. */
    control("{\"bind_status\":500,\"bind_count\":1}");
    assert_int_equal(kgpu_k8s_bind(api, "default", "web-1", uid, "node-a", ann, &resp, &err), 0);
    assert_int_equal(resp.status, 500);
    free(resp.body);
    json_t *got = get_pod("default", "web-1");
    assert_null(node_of(got));
    json_decref(got);

    assert_int_equal(kgpu_k8s_bind(api, "default", "web-1", uid, "node-a", ann, &resp, &err), 0);
    assert_int_equal(resp.status, 201);
    free(resp.body);
    got = get_pod("default", "web-1");
    assert_string_equal(node_of(got), "node-a");
    assert_string_equal(annotation(got, "kgpu.io/gpu-ids"), "0,1");
    assert_string_equal(annotation(got, "kgpu.io/milli"), "500");
    assert_string_equal(annotation(got, "keep"), "me");
    json_decref(got);

    /* Bound already: 409 and nothing changes. */
    json_t *other = json_pack("{s:s}", "kgpu.io/gpu-ids", "3");
    assert_int_equal(kgpu_k8s_bind(api, "default", "web-1", NULL, "node-b", other, &resp, &err), 0);
    assert_int_equal(resp.status, 409);
    assert_non_null(strstr(resp.body, "already assigned"));
    free(resp.body);
    got = get_pod("default", "web-1");
    assert_string_equal(node_of(got), "node-a");
    assert_string_equal(annotation(got, "kgpu.io/gpu-ids"), "0,1");
    json_decref(got);

    /* A uid that is not the pod's (deleted and recreated): 409, not bound. */
    json_decref(create_pod("default", "web-2", NULL));
    assert_int_equal(kgpu_k8s_bind(api, "default", "web-2", uid, "node-b", other, &resp, &err), 0);
    assert_int_equal(resp.status, 409);
    assert_non_null(strstr(resp.body, "Precondition failed"));
    free(resp.body);
    got = get_pod("default", "web-2");
    assert_null(node_of(got));
    json_decref(got);

    /* No such pod: 404. No annotations at all: fine. */
    assert_int_equal(kgpu_k8s_bind(api, "default", "ghost", NULL, "node-b", NULL, &resp, &err), 0);
    assert_int_equal(resp.status, 404);
    free(resp.body);
    assert_int_equal(kgpu_k8s_bind(api, "default", "web-2", "", "node-b", NULL, NULL, &err), 0);
    got = get_pod("default", "web-2");
    assert_string_equal(node_of(got), "node-b");
    json_decref(got);

    assert_int_equal(kgpu_k8s_bind(api, "default", "web-2", NULL, "", NULL, NULL, &err),
                     KGPU_EINVAL);
    json_decref(ann);
    json_decref(other);
    json_decref(pod);
}

static void test_get_pod(void **state)
{
    json_decref(create_pod("default", "getme", NULL));
    kgpu_error err = {0};
    long status = -1;
    json_t *got = kgpu_k8s_get_pod(api, "default", "getme", &status, &err);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(json_object_get(got, "metadata"),
                                                          "name")),
                        "getme");
    json_decref(got);
    assert_null(kgpu_k8s_get_pod(api, "default", "nope", &status, &err));
    assert_int_equal(status, 404);
    /* A name that is not a path segment is escaped, never a path of its own. */
    assert_null(kgpu_k8s_get_pod(api, "default", "getme/../x", &status, &err));
    assert_int_equal(status, 404);
    status = -1;
    assert_null(kgpu_k8s_get_pod(api, "", "getme", &status, &err));
    assert_int_equal(status, 0);
    assert_int_equal(err.code, KGPU_EINVAL);
}

static void test_annotate(void **state)
{
    json_decref(create_pod("default", "ann", "{\"a\":\"1\",\"b\":\"2\"}"));
    json_t *ann = json_pack("{s:s, s:n, s:s}", "a", "10", "b", "c", "3");
    kgpu_http_resp resp;
    kgpu_error err = {0};
    assert_int_equal(kgpu_k8s_annotate_pod(api, "default", "ann", ann, &resp, &err), 0);
    assert_int_equal(resp.status, 200);
    free(resp.body);
    json_t *got = get_pod("default", "ann");
    assert_string_equal(annotation(got, "a"), "10");
    assert_null(annotation(got, "b")); /* null deletes (merge patch) */
    assert_string_equal(annotation(got, "c"), "3");
    json_decref(got);
    assert_int_equal(kgpu_k8s_annotate_pod(api, "default", "nope", ann, &resp, &err), 0);
    assert_int_equal(resp.status, 404);
    free(resp.body);
    json_decref(ann);
}

/* An Event on a pod: where it goes, what it says, unique names; errors name the pod. */
static void test_pod_event(void **state)
{
    (void)state;
    kgpu_k8s_pod_event ev = {.ns = "default",
                             .pod = "waiting",
                             .uid = "uid-1",
                             .type = "Warning",
                             .reason = "GPUQueueReclaimBlocked",
                             .message = "reclaim is blocked by a PodDisruptionBudget",
                             .component = "kgpu-extender",
                             .instance = "kgpu-extender-0"};
    kgpu_error err = {0};
    assert_int_equal(kgpu_k8s_post_pod_event(api, &ev, &err), 0);
    assert_int_equal(kgpu_k8s_post_pod_event(api, &ev, &err), 0); /* a second, own name */
    json_t *list = call("GET", "/api/v1/namespaces/default/events", NULL, NULL, 200);
    json_t *items = json_object_get(list, "items");
    assert_int_equal(json_array_size(items), 2);
    const char *names[2];
    for (size_t i = 0; i < 2; i++) {
        json_t *e = json_array_get(items, i);
        json_t *io = json_object_get(e, "involvedObject");
        names[i] = json_string_value(json_object_get(json_object_get(e, "metadata"), "name"));
        assert_non_null(names[i]);
        assert_int_equal(strncmp(names[i], "waiting.", 8), 0);
        assert_string_equal(json_string_value(json_object_get(io, "kind")), "Pod");
        assert_string_equal(json_string_value(json_object_get(io, "name")), "waiting");
        assert_string_equal(json_string_value(json_object_get(io, "uid")), "uid-1");
        assert_string_equal(json_string_value(json_object_get(e, "type")), "Warning");
        assert_string_equal(json_string_value(json_object_get(e, "reason")), ev.reason);
        assert_string_equal(json_string_value(json_object_get(e, "message")), ev.message);
        assert_string_equal(json_string_value(json_object_get(e, "reportingComponent")),
                            "kgpu-extender");
        assert_non_null(json_string_value(json_object_get(e, "firstTimestamp")));
    }
    assert_string_not_equal(names[0], names[1]);
    json_decref(list);
    ev.ns = "";
    assert_int_not_equal(kgpu_k8s_post_pod_event(api, &ev, &err), 0);
    /* An Event that cannot be built is an error, not a crash. */
    ev.ns = "default";
    ev.reason = NULL;
    assert_int_not_equal(kgpu_k8s_post_pod_event(api, &ev, &err), 0);
}

/* The stand-in itself: replay from a resourceVersion, bookmarks, timeoutSeconds, 410. */
static void test_watch_protocol(void **state)
{
    json_t *stats = call("GET", "/_control/stats", NULL, NULL, 200);
    char rv0[32], path[256];
    snprintf(rv0, sizeof(rv0), "%s", json_string_value(json_object_get(stats, "resourceVersion")));
    json_decref(stats);
    json_decref(create_pod("raw", "p", NULL));

    snprintf(path, sizeof(path),
             "/api/v1/namespaces/raw/pods?watch=1&resourceVersion=%s&allowWatchBookmarks=true"
             "&timeoutSeconds=1",
             rv0);
    kgpu_http_resp resp;
    kgpu_error err = {0};
    assert_int_equal(kgpu_k8s_request(api, "GET", path, NULL, NULL, &resp, &err), 0);
    assert_int_equal(resp.status, 200);
    int added = 0, bookmarks = 0;
    for (char *line = strtok(resp.body, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *ev = json_loads(line, 0, NULL);
        assert_non_null(ev);
        const char *type = json_string_value(json_object_get(ev, "type"));
        added += strcmp(type, "ADDED") == 0;
        bookmarks += strcmp(type, "BOOKMARK") == 0;
        json_decref(ev);
    }
    free(resp.body);
    assert_int_equal(added, 1);
    assert_true(bookmarks >= 1);

    /* History forgotten: the same watch now gets the ERROR event, status 200. */
    control("{\"expire_history\":true}");
    assert_int_equal(kgpu_k8s_request(api, "GET", path, NULL, NULL, &resp, &err), 0);
    assert_int_equal(resp.status, 200);
    json_t *ev = json_loadb(resp.body, resp.len, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(ev, "type")), "ERROR");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(ev, "object"), "code")),
                     410);
    json_decref(ev);
    free(resp.body);
}

/* ---- the reflector ---- */

/* What a reflector told us, and the cache ("ns/name" -> pod) it implies. */
typedef struct recorder {
    pthread_mutex_t mu;
    json_t *cache;
    int resets, restarts, added, modified, deleted;
    char why[1024];
} recorder;

typedef struct reflector {
    pthread_t thread;
    bool running;
    atomic_bool stop;
    kgpu_k8s *k;
    const char *collection, *query;
    int rc;
    recorder rec;
} reflector;

static reflector *reflectors[4];

static void pod_key(json_t *obj, char *out, size_t outsz)
{
    json_t *meta = json_object_get(obj, "metadata");
    snprintf(out, outsz, "%s/%s", json_string_value(json_object_get(meta, "namespace")),
             json_string_value(json_object_get(meta, "name")));
}

static void rec_reset(void *ctx, json_t *items)
{
    recorder *r = ctx;
    pthread_mutex_lock(&r->mu);
    json_object_clear(r->cache);
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it)
    {
        char key[256];
        pod_key(it, key, sizeof(key));
        json_object_set(r->cache, key, it);
    }
    r->resets++;
    pthread_mutex_unlock(&r->mu);
}

static void rec_event(void *ctx, const char *type, json_t *obj)
{
    recorder *r = ctx;
    char key[256];
    pod_key(obj, key, sizeof(key));
    pthread_mutex_lock(&r->mu);
    if (strcmp(type, "DELETED") == 0) {
        json_object_del(r->cache, key);
        r->deleted++;
    } else {
        json_object_set(r->cache, key, obj);
        r->added += strcmp(type, "ADDED") == 0;
        r->modified += strcmp(type, "MODIFIED") == 0;
    }
    pthread_mutex_unlock(&r->mu);
}

static void rec_restart(void *ctx, const char *why)
{
    recorder *r = ctx;
    if (getenv("KGPU_TEST_VERBOSE") != NULL)
        fprintf(stderr, "reflector %p restart: %s\n", ctx, why);
    pthread_mutex_lock(&r->mu);
    r->restarts++;
    snprintf(r->why, sizeof(r->why), "%s", why);
    pthread_mutex_unlock(&r->mu);
}

static const kgpu_reflector_ops rec_ops = {rec_reset, rec_event, rec_restart, NULL};

static void *reflector_main(void *arg)
{
    reflector *f = arg;
    f->rc = kgpu_reflector_run(f->k, f->collection, f->query, &rec_ops, &f->rec, &f->stop);
    return NULL;
}

static reflector *reflector_start(kgpu_k8s *k, const char *collection, const char *query)
{
    reflector *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->k = k;
    f->collection = collection;
    f->query = query;
    f->rc = -100;
    pthread_mutex_init(&f->rec.mu, NULL);
    f->rec.cache = json_object();
    for (size_t i = 0; i < sizeof(reflectors) / sizeof(reflectors[0]); i++) {
        if (reflectors[i] == NULL) {
            reflectors[i] = f;
            break;
        }
    }
    assert_int_equal(pthread_create(&f->thread, NULL, reflector_main, f), 0);
    f->running = true;
    return f;
}

/* Sets *stop and joins; returns how long that took in seconds. */
static double reflector_stop(reflector *f)
{
    double t0 = now_s();
    atomic_store(&f->stop, true);
    if (f->running)
        pthread_join(f->thread, NULL);
    f->running = false;
    return now_s() - t0;
}

/* Per-test teardown: no reflector thread outlives a failed assertion. */
static int reflectors_teardown(void **state)
{
    for (size_t i = 0; i < sizeof(reflectors) / sizeof(reflectors[0]); i++) {
        reflector *f = reflectors[i];
        if (f == NULL)
            continue;
        reflector_stop(f);
        json_decref(f->rec.cache);
        pthread_mutex_destroy(&f->rec.mu);
        free(f);
        reflectors[i] = NULL;
    }
    return 0;
}

/* Waits up to 5 s for `cond`, evaluated with the recorder `r` locked. */
#define WAIT_FOR(r, cond)                                                                          \
    do {                                                                                           \
        bool ok_ = false;                                                                          \
        for (int i_ = 0; i_ < 500 && !ok_; i_++) {                                                 \
            pthread_mutex_lock(&(r)->mu);                                                          \
            ok_ = (cond);                                                                          \
            pthread_mutex_unlock(&(r)->mu);                                                        \
            if (!ok_)                                                                              \
                sleep_ms(10);                                                                      \
        }                                                                                          \
        if (!ok_)                                                                                  \
            fail_msg("timed out waiting for %s (last restart: %s)", #cond, (r)->why);              \
    } while (0)

static bool cached_with(recorder *r, const char *key, const char *ann, const char *val)
{
    json_t *pod = json_object_get(r->cache, key);
    if (pod == NULL)
        return false;
    if (ann == NULL)
        return true;
    const char *v = annotation(pod, ann);
    return v != NULL && strcmp(v, val) == 0;
}

static bool cached_on(recorder *r, const char *key, const char *node)
{
    const char *n = node_of(json_object_get(r->cache, key));
    return n != NULL && strcmp(n, node) == 0;
}

static long standin_stat(const char *name)
{
    json_t *stats = call("GET", "/_control/stats", NULL, NULL, 200);
    long v = (long)json_integer_value(json_object_get(stats, name));
    json_decref(stats);
    return v;
}

/* Waits until the stand-in has opened `n` watches in all, so that a fault
 * injected next reaches them (a watch opened later would not see it). */
static void wait_watches_opened(long n)
{
    for (int i = 0; i < 500 && standin_stat("watches_opened") < n; i++)
        sleep_ms(10);
    assert_true(standin_stat("watches_opened") >= n);
}

static void test_reflector(void **state)
{
    long opened = standin_stat("watches_opened");
    json_decref(create_pod("refl", "a", NULL));
    json_decref(create_pod("refl", "b", NULL));
    json_decref(create_pod("other", "x", NULL));
    reflector *all = reflector_start(api, "/api/v1/namespaces/refl/pods", NULL);
    reflector *unbound = reflector_start(api, "/api/v1/pods", "fieldSelector=spec.nodeName%3D");
    recorder *ra = &all->rec, *ru = &unbound->rec;

    /* The list: exactly what is there. */
    WAIT_FOR(ra, ra->resets == 1 && json_object_size(ra->cache) == 2);
    WAIT_FOR(ru, ru->resets == 1 && cached_with(ru, "refl/a", NULL, NULL) &&
                     cached_with(ru, "other/x", NULL, NULL) &&
                     !cached_with(ru, "default/web-1", NULL, NULL));

    /* Changes made through the API arrive as events. */
    json_decref(create_pod("refl", "c", NULL));
    WAIT_FOR(ra, ra->added == 1 && cached_with(ra, "refl/c", NULL, NULL));
    json_t *ann = json_pack("{s:s}", "x", "1");
    assert_int_equal(kgpu_k8s_annotate_pod(api, "refl", "a", ann, NULL, NULL), 0);
    WAIT_FOR(ra, ra->modified == 1 && cached_with(ra, "refl/a", "x", "1"));
    assert_int_equal(kgpu_k8s_bind(api, "refl", "b", NULL, "node-a", ann, NULL, NULL), 0);
    WAIT_FOR(ra, ra->modified == 2 && cached_on(ra, "refl/b", "node-a"));
    /* ...and a pod that leaves a field selector is DELETED for that watcher. */
    WAIT_FOR(ru, ru->deleted >= 1 && !cached_with(ru, "refl/b", NULL, NULL));
    json_decref(call("DELETE", "/api/v1/namespaces/refl/pods/c", NULL, NULL, 200));
    WAIT_FOR(ra, ra->deleted == 1 && json_object_size(ra->cache) == 2);
    json_decref(ann);

    /* A dropped watch: restart, relist, and changes keep coming. */
    wait_watches_opened(opened += 2);
    control("{\"drop_watches\":true}");
    WAIT_FOR(ra, ra->restarts == 1 && ra->resets == 2);
    assert_non_null(strstr(ra->why, "watch stream"));
    json_decref(create_pod("refl", "d", NULL));
    WAIT_FOR(ra, cached_with(ra, "refl/d", NULL, NULL));

    /* 410 Gone on an open watch: relist. */
    wait_watches_opened(opened += 2);
    control("{\"expire_watches\":true}");
    WAIT_FOR(ra, ra->restarts == 2 && ra->resets == 3);
    assert_non_null(strstr(ra->why, "410"));

    /* History forgotten and the watch dropped; lists failing for a while. */
    wait_watches_opened(opened += 2);
    control("{\"expire_history\":true,\"fail_lists\":2,\"drop_watches\":true}");
    WAIT_FOR(ra, ra->resets == 4 && ra->restarts >= 3);
    json_decref(create_pod("refl", "e", NULL));
    WAIT_FOR(ra, cached_with(ra, "refl/e", NULL, NULL) && json_object_size(ra->cache) == 4);
    WAIT_FOR(ru, cached_with(ru, "refl/e", NULL, NULL));
    pthread_mutex_lock(&ru->mu);
    int ru_restarts = ru->restarts; /* one of the failed lists may have been its */
    pthread_mutex_unlock(&ru->mu);
    assert_true(ru_restarts >= 3);

    /* Stop while blocked in an idle watch. */
    sleep_ms(200);
    assert_true(reflector_stop(all) < 1.0);
    assert_true(reflector_stop(unbound) < 1.0);
    assert_int_equal(all->rc, 0);
    assert_int_equal(unbound->rc, 0);
}

/* A watch event larger than the 16 MiB line cap ends the stream with a reason; the
 * relist (a list may be up to 64 MiB) still brings the object in. */
static void test_reflector_huge_event(void **state)
{
    reflector *f = reflector_start(api, "/api/v1/namespaces/big/pods", NULL);
    recorder *r = &f->rec;
    WAIT_FOR(r, r->resets == 1);
    size_t n = (size_t)17 << 20;
    char *blob = malloc(n + 1);
    assert_non_null(blob);
    memset(blob, 'x', n);
    blob[n] = '\0';
    json_t *pod =
        json_pack("{s:{s:s, s:{s:s}}}", "metadata", "name", "huge", "annotations", "blob", blob);
    free(blob);
    char *body = json_dumps(pod, JSON_COMPACT);
    json_decref(pod);
    json_decref(call("POST", "/api/v1/namespaces/big/pods", NULL, body, 201));
    free(body);
    WAIT_FOR(r, r->restarts == 1 && r->resets == 2 && cached_with(r, "big/huge", NULL, NULL));
    assert_non_null(strstr(r->why, "longer than 16 MiB"));
    assert_true(reflector_stop(f) < 1.0);
    json_decref(call("DELETE", "/api/v1/namespaces/big/pods/huge", NULL, NULL, 200));
}

static void test_reflector_stop_in_backoff(void **state)
{
    kgpu_k8s_config cfg = {0};
    snprintf(cfg.server, sizeof(cfg.server), "http://127.0.0.1:1");
    kgpu_k8s *k = kgpu_k8s_new(&cfg, NULL);
    assert_non_null(k);
    reflector *f = reflector_start(k, "/api/v1/pods", NULL);
    WAIT_FOR(&f->rec, f->rec.restarts >= 4 && /* backoff now 1.6 s */
                          strstr(f->rec.why,
                                 "list /api/v1/pods: GET http://127.0.0.1:1/api/v1/pods") != NULL);
    assert_true(reflector_stop(f) < 0.5);
    assert_int_equal(f->rec.resets, 0);
    kgpu_k8s_free(k);

    atomic_bool stop = false;
    assert_int_equal(kgpu_reflector_run(api, "api/v1/pods", NULL, &rec_ops, NULL, &stop),
                     KGPU_EINVAL);
}

/* ---- paged lists ---- */

#define PAGED_NS "pages"
#define PAGED_N  1234 /* pods in PAGED_NS: p-0000..p-1233; the first 100 on node-p */

/* Creates the PAGED_NS pods in one go (the stand-in's load), once. */
static void load_paged_pods(void)
{
    static bool loaded;
    if (loaded)
        return;
    json_t *pods = json_array();
    for (int i = 0; i < PAGED_N; i++) {
        char name[32];
        snprintf(name, sizeof(name), "p-%04d", i);
        json_t *pod = json_pack("{s:{s:s, s:s}, s:{s:[{s:s, s:s}]}, s:{s:s, s:[{s:s, s:s}]}}",
                                "metadata", "name", name, "namespace", PAGED_NS, "spec",
                                "containers", "name", "c", "image", "x", "status", "phase",
                                "Running", "conditions", "type", "Ready", "status", "True");
        if (i < 100)
            json_object_set_new(json_object_get(pod, "spec"), "nodeName", json_string("node-p"));
        json_array_append_new(pods, pod);
    }
    json_t *req = json_pack("{s:{s:o}}", "load", "pods", pods);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    control(body);
    free(body);
    loaded = true;
}

static char *standin_rv(void)
{
    json_t *stats = call("GET", "/_control/stats", NULL, NULL, 200);
    char *rv = strdup(json_string_value(json_object_get(stats, "resourceVersion")));
    json_decref(stats);
    return rv;
}

/* The last `n` list requests the stand-in logged (a new array), oldest first. */
static json_t *last_lists(size_t n)
{
    json_t *log = call("GET", "/_control/requests", NULL, NULL, 200);
    json_t *lists = json_object_get(log, "lists");
    assert_true(json_array_size(lists) >= n);
    json_t *out = json_array();
    for (size_t i = json_array_size(lists) - n; i < json_array_size(lists); i++)
        json_array_append(out, json_array_get(lists, i));
    json_decref(log);
    return out;
}

/* Asserts `items` holds exactly the pods p-<first>..p-<first+n-1>, each once. */
static void assert_names(json_t *items, int first, int n)
{
    assert_int_equal(json_array_size(items), (size_t)n);
    json_t *seen = json_object();
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it)
    {
        const char *name =
            json_string_value(json_object_get(json_object_get(it, "metadata"), "name"));
        assert_non_null(name);
        assert_null(json_object_get(seen, name));
        json_object_set_new(seen, name, json_true());
    }
    for (int k = first; k < first + n; k++) {
        char name[32];
        snprintf(name, sizeof(name), "p-%04d", k);
        if (json_object_get(seen, name) == NULL)
            fail_msg("%s missing from the list", name);
    }
    json_decref(seen);
}

static void test_list_pages(void **state)
{
    load_paged_pods();
    char *want_rv = standin_rv();
    json_t *items = NULL;
    char rv[KGPU_K8S_RV_MAX];
    kgpu_k8s_list_stats st;
    kgpu_error err = {0};

    /* Pages of 100: 13 requests, every one of the same snapshot, no resourceVersion sent. */
    kgpu_k8s_list_opts opts = {.limit = 100};
    if (kgpu_k8s_list(api, "/api/v1/namespaces/" PAGED_NS "/pods", NULL, &opts, &items, rv,
                      sizeof(rv), &st, &err) != 0)
        fail_msg("list: %s", err.msg);
    assert_names(items, 0, PAGED_N);
    json_decref(items);
    assert_int_equal(st.pages, 13);
    assert_int_equal(st.restarts, 0);
    assert_string_equal(rv, want_rv);
    json_t *log = last_lists(13);
    size_t i;
    json_t *e;
    json_array_foreach(log, i, e)
    {
        assert_string_equal(json_string_value(json_object_get(e, "limit")), "100");
        assert_true(json_is_null(json_object_get(e, "resourceVersion")));
        assert_true(json_is_null(json_object_get(e, "fieldSelector")));
        assert_int_equal(json_is_true(json_object_get(e, "continue")), i > 0);
        assert_string_equal(json_string_value(json_object_get(e, "rv")), want_rv);
        /* No selector: the server counts what remains, as the real one does. */
        if (i < 12)
            assert_int_equal(json_integer_value(json_object_get(e, "remainingItemCount")),
                             PAGED_N - 100 * (i + 1));
    }
    json_decref(log);

    /* The default page size is client-go's 500. */
    assert_int_equal(kgpu_k8s_list(api, "/api/v1/namespaces/" PAGED_NS "/pods", NULL, NULL, &items,
                                   rv, sizeof(rv), &st, &err),
                     0);
    assert_int_equal(json_array_size(items), PAGED_N);
    json_decref(items);
    assert_int_equal(st.pages, 3);

    /* A field selector is repeated on every page, unchanged. */
    opts.limit = 30;
    assert_int_equal(kgpu_k8s_list(api, "/api/v1/namespaces/" PAGED_NS "/pods",
                                   "fieldSelector=spec.nodeName%3Dnode-p", &opts, &items, rv,
                                   sizeof(rv), &st, &err),
                     0);
    assert_names(items, 0, 100);
    json_decref(items);
    assert_true(st.pages >= 4);
    log = last_lists(st.pages);
    json_array_foreach(log, i, e)
    {
        assert_string_equal(json_string_value(json_object_get(e, "fieldSelector")),
                            "spec.nodeName=node-p");
        assert_true(json_is_null(json_object_get(e, "resourceVersion")));
        assert_int_equal(json_is_true(json_object_get(e, "continue")), i > 0);
    }
    json_decref(log);

    /* A server that ignores limit answers everything at once: that is a list too. */
    control("{\"ignore_limit\":true}");
    opts.limit = 100;
    int rc = kgpu_k8s_list(api, "/api/v1/namespaces/" PAGED_NS "/pods", NULL, &opts, &items, rv,
                           sizeof(rv), &st, &err);
    control("{\"ignore_limit\":false}");
    assert_int_equal(rc, 0);
    assert_names(items, 0, PAGED_N);
    json_decref(items);
    assert_int_equal(st.pages, 1);

    /* The query is the caller's, paging is the list's. */
    assert_int_equal(
        kgpu_k8s_list(api, "/api/v1/pods", "limit=5", NULL, &items, rv, sizeof(rv), NULL, &err),
        KGPU_EINVAL);
    assert_null(items);
    assert_int_equal(kgpu_k8s_list(api, "/api/v1/pods", "a=b&resourceVersion=1", NULL, &items, rv,
                                   sizeof(rv), NULL, &err),
                     KGPU_EINVAL);
    assert_int_equal(
        kgpu_k8s_list(api, "api/v1/pods", NULL, NULL, &items, rv, sizeof(rv), NULL, &err),
        KGPU_EINVAL);
    /* An error names the list and the page. */
    control("{\"fail_lists\":1}");
    assert_int_equal(kgpu_k8s_list(api, "/api/v1/namespaces/" PAGED_NS "/pods", NULL, NULL, &items,
                                   rv, sizeof(rv), NULL, &err),
                     KGPU_EIO);
    assert_null(items);
    assert_non_null(strstr(err.msg, "list /api/v1/namespaces/" PAGED_NS "/pods: page 1: HTTP 500"));
    free(want_rv);
}

/* The trim hook of test_list_expired: the first time, changes the namespace and compacts. */
static int trims;
static void change_and_compact(void *ctx, json_t *item)
{
    if (trims++ == 0) {
        json_decref(call("DELETE", "/api/v1/namespaces/" PAGED_NS "/pods/p-0000", NULL, NULL, 200));
        json_decref(call("POST", "/api/v1/namespaces/" PAGED_NS "/pods", NULL,
                         "{\"metadata\":{\"name\":\"zz-new\"}}", 201));
        control("{\"compact\":true}");
    }
    json_object_del(item, "status");
}

static void test_list_expired(void **state)
{
    load_paged_pods();
    const char *ns_pods = "/api/v1/namespaces/" PAGED_NS "/pods";
    json_t *items = NULL;
    char rv[KGPU_K8S_RV_MAX];
    kgpu_k8s_list_stats st;
    kgpu_error err = {0};
    long expired = standin_stat("lists_expired");

    /* One token expired on the way: the list starts again, and has everything once. */
    control("{\"expire_continues\":1}");
    kgpu_k8s_list_opts opts = {.limit = 100};
    assert_int_equal(kgpu_k8s_list(api, ns_pods, NULL, &opts, &items, rv, sizeof(rv), &st, &err),
                     0);
    assert_names(items, 0, PAGED_N);
    json_decref(items);
    assert_int_equal(st.restarts, 1);
    assert_int_equal(st.pages, 14); /* one, then 13 */
    assert_int_equal(standin_stat("lists_expired"), expired + 1);

    /* A real compaction after the first page, with the namespace changed in between: the
     * result is the new snapshot, exactly, not the first page stitched to the rest. */
    trims = 0;
    opts.trim = change_and_compact;
    assert_int_equal(kgpu_k8s_list(api, ns_pods, NULL, &opts, &items, rv, sizeof(rv), &st, &err),
                     0);
    char *now = standin_rv();
    assert_string_equal(rv, now);
    free(now);
    assert_int_equal(st.restarts, 1);
    assert_int_equal(json_array_size(items), PAGED_N);
    size_t i;
    json_t *it;
    bool new_seen = false;
    json_array_foreach(items, i, it)
    {
        const char *name =
            json_string_value(json_object_get(json_object_get(it, "metadata"), "name"));
        assert_string_not_equal(name, "p-0000");
        new_seen |= strcmp(name, "zz-new") == 0;
        assert_null(json_object_get(it, "status")); /* trimmed as the pages came */
    }
    assert_true(new_seen);
    json_decref(items);
    assert_int_equal(standin_stat("lists_expired"), expired + 2);

    /* Expiring for ever: a bounded number of starts, then an error that says what failed. */
    control("{\"expire_continues\":1000}");
    opts = (kgpu_k8s_list_opts){.limit = 100, .restarts = 2};
    int rc = kgpu_k8s_list(api, ns_pods, NULL, &opts, &items, rv, sizeof(rv), &st, &err);
    control("{\"expire_continues\":0}");
    assert_int_equal(rc, KGPU_EIO);
    assert_null(items);
    assert_int_equal(st.restarts, 2);
    assert_int_equal(standin_stat("lists_expired"), expired + 5);
    if (strstr(err.msg, "list /api/v1/namespaces/" PAGED_NS "/pods: ") != err.msg ||
        strstr(err.msg, "HTTP 410 Expired") == NULL || strstr(err.msg, "3 times") == NULL ||
        strstr(err.msg, "after 1 pages and 100 items (1134 more to come)") == NULL)
        fail_msg("unclear error: %s", err.msg);

    /* Told to stop: no list. */
    atomic_bool stop = true;
    opts = (kgpu_k8s_list_opts){.stop = &stop};
    double t0 = now_s();
    assert_int_not_equal(
        kgpu_k8s_list(api, ns_pods, NULL, &opts, &items, rv, sizeof(rv), NULL, &err), 0);
    assert_true(now_s() - t0 < 1.0);
    assert_null(items);
}

/* The reflector lists in pages of 500, then watches from the list's resourceVersion. */
static void test_reflector_pages(void **state)
{
    load_paged_pods();
    json_t *items = NULL;
    char rv[KGPU_K8S_RV_MAX];
    assert_int_equal(kgpu_k8s_list(api, "/api/v1/namespaces/" PAGED_NS "/pods", NULL, NULL, &items,
                                   rv, sizeof(rv), NULL, NULL),
                     0);
    size_t want = json_array_size(items);
    json_decref(items);
    control("{\"reset_stats\":true}");
    reflector *f = reflector_start(api, "/api/v1/namespaces/" PAGED_NS "/pods", NULL);
    recorder *r = &f->rec;
    WAIT_FOR(r, r->resets == 1 && json_object_size(r->cache) == want);
    wait_watches_opened(1);
    json_t *log = call("GET", "/_control/requests", NULL, NULL, 200);
    json_t *lists = json_object_get(log, "lists"), *watches = json_object_get(log, "watches");
    assert_int_equal(json_array_size(lists), (want + 499) / 500);
    size_t i;
    json_t *e;
    json_array_foreach(lists, i, e)
    {
        assert_string_equal(json_string_value(json_object_get(e, "limit")), "500");
        assert_int_equal(json_is_true(json_object_get(e, "continue")), i > 0);
        assert_true(json_is_null(json_object_get(e, "resourceVersion")));
    }
    const char *list_rv = json_string_value(json_object_get(json_array_get(lists, 0), "rv"));
    assert_int_equal(json_array_size(watches), 1);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(watches, 0), "resourceVersion")), list_rv);
    json_decref(log);

    /* A relist whose token expires half-way still ends with everything, once. */
    control("{\"expire_continues\":1,\"drop_watches\":true}");
    WAIT_FOR(r, r->resets == 2 && json_object_size(r->cache) == want);
    assert_int_equal(standin_stat("lists_expired"), 1);
    json_decref(create_pod(PAGED_NS, "after", NULL));
    WAIT_FOR(r, json_object_size(r->cache) == want + 1);
    assert_true(reflector_stop(f) < 1.0);
    json_decref(call("DELETE", "/api/v1/namespaces/" PAGED_NS "/pods/after", NULL, NULL, 200));
}

/* ---- configuration ---- */

static void test_kubeconfig_token(void **state)
{
    const char *path = write_file("kc-token.yaml", "apiVersion: v1\n"
                                                   "kind: Config\n"
                                                   "current-context: prod\n"
                                                   "contexts:\n"
                                                   "- name: dev\n"
                                                   "  context: {cluster: devc, user: devu}\n"
                                                   "- name: prod\n"
                                                   "  context:\n"
                                                   "    cluster: prodc\n"
                                                   "    user: produ\n"
                                                   "    namespace: kube-system\n"
                                                   "clusters:\n"
                                                   "- name: devc\n"
                                                   "  cluster: {server: 'https://dev:6443'}\n"
                                                   "- name: prodc\n"
                                                   "  cluster:\n"
                                                   "    server: https://10.0.0.1:6443/\n"
                                                   "    insecure-skip-tls-verify: true\n"
                                                   "users:\n"
                                                   "- name: devu\n"
                                                   "  user: {token: devtoken}\n"
                                                   "- name: produ\n"
                                                   "  user:\n"
                                                   "    token: \"abc.def\"\n");
    kgpu_k8s_config cfg;
    kgpu_error err = {0};
    if (kgpu_k8s_config_kubeconfig(path, &cfg, &err) != 0)
        fail_msg("%s", err.msg);
    assert_string_equal(cfg.server, "https://10.0.0.1:6443");
    assert_string_equal(cfg.token, "abc.def");
    assert_string_equal(cfg.token_file, "");
    assert_true(cfg.insecure);
    assert_null(cfg.ca_data);
    assert_int_equal(cfg.timeout_ms, 10000);
    kgpu_k8s_config_clear(&cfg);
}

static void test_kubeconfig_files(void **state)
{
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/kc", tmp);
    mkdir(dir, 0700);
    write_file("kc/tok", TOKEN "\n");
    write_file("kc/ca.crt", "-----BEGIN CERTIFICATE-----\n");
    write_file("kc/client.crt", "cert");
    write_file("kc/client.key", "key");
    char text[1024];
    snprintf(text, sizeof(text),
             "current-context: local\n"
             "contexts: [{name: local, context: {cluster: standin, user: me}}]\n"
             "clusters:\n"
             "- name: standin\n"
             "  cluster:\n"
             "    server: http://127.0.0.1:%d\n"
             "    certificate-authority: ca.crt\n"
             "users:\n"
             "- name: me\n"
             "  user:\n"
             "    tokenFile: tok\n"
             "    client-certificate: %s/kc/client.crt\n"
             "    client-key: client.key\n",
             port, tmp);
    const char *path = write_file("kc/config", text);
    kgpu_k8s_config cfg;
    kgpu_error err = {0};
    if (kgpu_k8s_config_kubeconfig(path, &cfg, &err) != 0)
        fail_msg("%s", err.msg);
    char want[512];
    snprintf(want, sizeof(want), "%s/kc/tok", tmp);
    assert_string_equal(cfg.token_file, want);
    snprintf(want, sizeof(want), "%s/kc/ca.crt", tmp);
    assert_string_equal(cfg.ca_file, want);
    snprintf(want, sizeof(want), "%s/kc/client.crt", tmp);
    assert_string_equal(cfg.cert_file, want);
    snprintf(want, sizeof(want), "%s/kc/client.key", tmp);
    assert_string_equal(cfg.key_file, want);
    assert_string_equal(cfg.token, "");

    /* Against the stand-in (plain http: the TLS files go unused): the token
     * file is read on every request, its trailing newline dropped. */
    kgpu_k8s *k = kgpu_k8s_new(&cfg, &err);
    kgpu_k8s_config_clear(&cfg);
    assert_non_null(k);
    kgpu_http_resp resp;
    assert_int_equal(kgpu_k8s_request(k, "GET", "/api/v1/nodes", NULL, NULL, &resp, &err), 0);
    assert_int_equal(resp.status, 200);
    free(resp.body);
    write_file("kc/tok", "rotated-away\n");
    assert_int_equal(kgpu_k8s_request(k, "GET", "/api/v1/nodes", NULL, NULL, &resp, &err), 0);
    assert_int_equal(resp.status, 401);
    free(resp.body);
    write_file("kc/tok", TOKEN);
    assert_int_equal(kgpu_k8s_request(k, "GET", "/api/v1/nodes", NULL, NULL, &resp, &err), 0);
    assert_int_equal(resp.status, 200);
    free(resp.body);
    snprintf(want, sizeof(want), "%s/kc/tok", tmp);
    unlink(want);
    assert_int_equal(kgpu_k8s_request(k, "GET", "/api/v1/nodes", NULL, NULL, &resp, &err),
                     KGPU_EIO);
    assert_non_null(strstr(err.msg, "kc/tok"));
    kgpu_k8s_free(k);
}

static void test_kubeconfig_data(void **state)
{
    /* base64 of "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", split. */
    const char *path = write_file(
        "kc-data.yaml", "current-context: c\n"
                        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
                        "clusters:\n"
                        "- name: k\n"
                        "  cluster:\n"
                        "    server: https://[fd00::1]:443\n"
                        "    certificate-authority: /nonexistent/ignored-when-data-is-set\n"
                        "    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1J\n"
                        "      SUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=\n"
                        "users:\n"
                        "- name: u\n"
                        "  user:\n"
                        "    client-certificate-data: Y2VydA==\n"
                        "    client-key-data: a2V5\n");
    kgpu_k8s_config cfg;
    kgpu_error err = {0};
    if (kgpu_k8s_config_kubeconfig(path, &cfg, &err) != 0)
        fail_msg("%s", err.msg);
    assert_string_equal(cfg.server, "https://[fd00::1]:443");
    assert_string_equal(cfg.ca_data,
                        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
    assert_string_equal(cfg.ca_file, "");
    assert_string_equal(cfg.cert_data, "cert");
    assert_string_equal(cfg.key_data, "key");
    assert_false(cfg.insecure);
    kgpu_k8s *k = kgpu_k8s_new(&cfg, &err); /* copies the blobs */
    kgpu_k8s_config_clear(&cfg);
    assert_null(cfg.ca_data);
    assert_non_null(k);
    kgpu_k8s_free(k);
}

/* Loads `text` as a kubeconfig, expects failure with `code` and `want` in the message. */
static void kubeconfig_fails(const char *text, int code, const char *want)
{
    const char *path = write_file("kc-bad.yaml", text);
    kgpu_k8s_config cfg;
    kgpu_error err = {0};
    assert_int_equal(kgpu_k8s_config_kubeconfig(path, &cfg, &err), code);
    if (strstr(err.msg, want) == NULL || strstr(err.msg, "kc-bad.yaml") == NULL)
        fail_msg("error '%s' lacks '%s' or the file name", err.msg, want);
    assert_null(cfg.ca_data);
}

#define KC_HEAD "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"

static void test_kubeconfig_errors(void **state)
{
    kubeconfig_fails("current-context: nope\ncontexts: [{name: c, context: {cluster: k}}]\n",
                     KGPU_EPARSE, "no context 'nope'");
    kubeconfig_fails(KC_HEAD "clusters: [{name: k, cluster: {insecure-skip-tls-verify: true}}]\n",
                     KGPU_EPARSE, "cluster 'k' has no server");
    kubeconfig_fails(KC_HEAD "clusters: [{name: other, cluster: {server: 'https://x'}}]\n",
                     KGPU_EPARSE, "no cluster 'k'");
    kubeconfig_fails(KC_HEAD "clusters: [{name: k, cluster: {server: 'https://x'}}]\n", KGPU_EPARSE,
                     "no user 'u'");
    kubeconfig_fails("apiVersion: v1\nclusters:\n- name: k\n  cluster:\n    server: a: b\n",
                     KGPU_EPARSE, "line 5");
    kubeconfig_fails(KC_HEAD "clusters: [{name: k, cluster: {server: 'https://x', "
                             "certificate-authority-data: 'not*base64'}}]\n",
                     KGPU_EPARSE, "certificate-authority-data is not valid base64");
    kubeconfig_fails(KC_HEAD "clusters: [{name: k, cluster: {server: 'https://x', "
                             "certificate-authority: missing.crt}}]\n",
                     KGPU_ENOENT, "certificate-authority");
    kubeconfig_fails(KC_HEAD "clusters: [{name: k, cluster: {server: 'https://x'}}]\n"
                             "users: [{name: u, user: {exec: {command: aws}}}]\n",
                     KGPU_EINVAL, "exec");
    kubeconfig_fails("", KGPU_EPARSE, "empty");

    kgpu_k8s_config cfg;
    kgpu_error err = {0};
    assert_int_equal(kgpu_k8s_config_kubeconfig("/nonexistent/kubeconfig", &cfg, &err),
                     KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "/nonexistent/kubeconfig"));
}

static void test_in_cluster(void **state)
{
    char sa[300];
    snprintf(sa, sizeof(sa), "%s/sa", tmp);
    mkdir(sa, 0700);
    write_file("sa/token", TOKEN "\n");
    write_file("sa/ca.crt", "-----BEGIN CERTIFICATE-----\n");
    kgpu_k8s_config cfg;
    kgpu_error err = {0};

    unsetenv("KUBERNETES_SERVICE_HOST");
    unsetenv("KUBERNETES_SERVICE_PORT");
    assert_int_equal(kgpu_k8s_config_in_cluster(sa, &cfg, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "KUBERNETES_SERVICE_HOST"));

    setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "443", 1);
    assert_int_equal(kgpu_k8s_config_in_cluster(sa, &cfg, &err), 0);
    assert_string_equal(cfg.server, "https://[fd00:10:96::1]:443");

    char port_s[16], want[400];
    snprintf(port_s, sizeof(port_s), "%d", port);
    setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
    setenv("KUBERNETES_SERVICE_PORT", port_s, 1);
    assert_int_equal(kgpu_k8s_config_in_cluster(sa, &cfg, &err), 0);
    snprintf(want, sizeof(want), "https://127.0.0.1:%d", port);
    assert_string_equal(cfg.server, want);
    snprintf(want, sizeof(want), "%s/token", sa);
    assert_string_equal(cfg.token_file, want);
    snprintf(want, sizeof(want), "%s/ca.crt", sa);
    assert_string_equal(cfg.ca_file, want);
    assert_string_equal(cfg.token, "");

    /* The stand-in speaks plain http: same config otherwise, token from sa/token. */
    snprintf(cfg.server, sizeof(cfg.server), "http://127.0.0.1:%d", port);
    kgpu_k8s *k = kgpu_k8s_new(&cfg, &err);
    assert_non_null(k);
    kgpu_http_resp resp;
    assert_int_equal(kgpu_k8s_request(k, "GET", "/api/v1/pods", NULL, NULL, &resp, &err), 0);
    assert_int_equal(resp.status, 200);
    free(resp.body);
    kgpu_k8s_free(k);

    snprintf(want, sizeof(want), "%s/nosa", tmp);
    assert_int_equal(kgpu_k8s_config_in_cluster(want, &cfg, &err), KGPU_ENOENT);
    assert_non_null(strstr(err.msg, "nosa/token"));
    unsetenv("KUBERNETES_SERVICE_HOST");
    unsetenv("KUBERNETES_SERVICE_PORT");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kubeconfig_token),
        cmocka_unit_test(test_kubeconfig_data),
        cmocka_unit_test(test_kubeconfig_errors),
        cmocka_unit_test(test_kubeconfig_files),
        cmocka_unit_test(test_in_cluster),
        cmocka_unit_test(test_token_required),
        cmocka_unit_test(test_transport_errors),
        cmocka_unit_test(test_bind),
        cmocka_unit_test(test_get_pod),
        cmocka_unit_test(test_annotate),
        cmocka_unit_test(test_pod_event),
        cmocka_unit_test(test_watch_protocol),
        cmocka_unit_test_teardown(test_reflector, reflectors_teardown),
        cmocka_unit_test_teardown(test_reflector_huge_event, reflectors_teardown),
        cmocka_unit_test_teardown(test_reflector_stop_in_backoff, reflectors_teardown),
        cmocka_unit_test(test_list_pages),
        cmocka_unit_test(test_list_expired),
        cmocka_unit_test_teardown(test_reflector_pages, reflectors_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
