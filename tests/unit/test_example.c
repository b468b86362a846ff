/*
 * Unit tests for the bundled synthetic example (src/cli/example.c): the files
 * are read back as text and checked against the trace formats and the
 * promised mix. The CLI sources are not linked into unit tests, so the
 * module is compiled in here directly.
 */
#include "../../src/cli/example.c"

#include <ftw.h>
#include <setjmp.h>
#include <stddef.h>

#include <cmocka.h>

#define NODES_HEADER "sn,cpu_milli,memory_mib,gpu,model"
#define PODS_HEADER                                                                                \
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"            \
    "deletion_time,scheduled_time"

typedef struct fixture {
    char root[64];
} fixture;

static int setup(void **state)
{
    fixture *fx = calloc(1, sizeof(*fx));

    if (!fx)
        return -1;
    strcpy(fx->root, "/tmp/kgpu-test-example-XXXXXX");
    if (!mkdtemp(fx->root)) {
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static int teardown(void **state)
{
    fixture *fx = *state;
    int rc = nftw(fx->root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);

    free(fx);
    return rc;
}

/* "<root>/<name>" as a heap string; caller frees. */
static char *under(const fixture *fx, const char *name)
{
    char *p = NULL;

    assert_true(asprintf(&p, "%s/%s", fx->root, name) > 0);
    return p;
}

/* Whole file as a NUL-terminated heap string; caller frees. */
static char *slurp(const char *dir, const char *file)
{
    char path[512];
    FILE *f;
    char *buf;
    long n;

    snprintf(path, sizeof(path), "%s/%s", dir, file);
    f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Splits a line (modified in place) at commas; returns the field count. */
static int split(char *line, char **fields, int max)
{
    int n = 0;
    char *p = line;

    while (p && n < max)
        fields[n++] = strsep(&p, ",");
    return p ? max + 1 : n;
}

typedef struct cluster_facts {
    int nodes;
    int64_t gpus;
    int eight_gpu_nodes;
    int max_gpus;
    char models[8][16];
    int nmodels;
} cluster_facts;

static bool has_model(const cluster_facts *c, const char *m)
{
    for (int i = 0; i < c->nmodels; i++)
        if (strcmp(c->models[i], m) == 0)
            return true;
    return false;
}

static void check_nodes(const char *dir, int want_nodes, cluster_facts *c)
{
    char *text = slurp(dir, "nodes.csv"), *save = NULL, *line;
    int row = 0;

    memset(c, 0, sizeof(*c));
    assert_true(text[strlen(text) - 1] == '\n');
    line = strtok_r(text, "\n", &save);
    assert_non_null(line);
    assert_string_equal(line, NODES_HEADER);
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *f[6], want_name[32];
        int gpus;

        assert_int_equal(split(line, f, 5), 5);
        snprintf(want_name, sizeof(want_name), "example-node-%04d", row);
        assert_string_equal(f[0], want_name);
        assert_true(atoll(f[1]) >= 64000);
        assert_true(atoll(f[2]) >= 131072);
        gpus = atoi(f[3]);
        assert_true(gpus == 1 || gpus == 2 || gpus == 4 || gpus == 8);
        assert_true(strlen(f[4]) > 0 && strlen(f[4]) < 16);
        c->gpus += gpus;
        c->eight_gpu_nodes += gpus == 8;
        if (gpus > c->max_gpus)
            c->max_gpus = gpus;
        if (!has_model(c, f[4])) {
            assert_true(c->nmodels < 8);
            strcpy(c->models[c->nmodels++], f[4]);
        }
        row++;
    }
    assert_int_equal(row, want_nodes);
    c->nodes = row;
    free(text);
}

typedef struct pod_facts {
    int pods, cpu_only, shares, whole, with_spec;
    int64_t demand_milli;
} pod_facts;

static void check_pods(const char *dir, const cluster_facts *c, pod_facts *p)
{
    char *text = slurp(dir, "pods.csv"), *save = NULL, *line;
    long long last_created = -1;

    memset(p, 0, sizeof(*p));
    line = strtok_r(text, "\n", &save);
    assert_non_null(line);
    assert_string_equal(line, PODS_HEADER);
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *f[12], want_name[32];
        int num_gpu, gpu_milli;
        long long created, deleted;

        assert_int_equal(split(line, f, 11), 11);
        snprintf(want_name, sizeof(want_name), "example-pod-%05d", p->pods);
        assert_string_equal(f[0], want_name);
        assert_true(atoll(f[1]) > 0 && atoll(f[2]) > 0);
        num_gpu = atoi(f[3]);
        gpu_milli = atoi(f[4]);
        assert_true(num_gpu >= 0 && num_gpu <= c->max_gpus);
        if (num_gpu == 0) {
            assert_int_equal(gpu_milli, 0);
            assert_string_equal(f[5], "");
            p->cpu_only++;
        } else if (gpu_milli < 1000) {
            assert_int_equal(num_gpu, 1);
            assert_true(gpu_milli >= 100);
            assert_true(atoll(f[1]) >= 2000 && atoll(f[1]) <= 12000);
            p->shares++;
        } else {
            assert_int_equal(gpu_milli, 1000);
            p->whole++;
        }
        if (f[5][0]) { /* every model named exists in the cluster */
            char *spec = f[5], *m;

            p->with_spec++;
            while ((m = strsep(&spec, "|")))
                assert_true(has_model(c, m));
        }
        assert_true(strcmp(f[6], "LS") == 0 || strcmp(f[6], "BE") == 0 ||
                    strcmp(f[6], "Burstable") == 0);
        assert_string_equal(f[7], "Running");
        created = atoll(f[8]);
        deleted = atoll(f[9]);
        assert_true(created > last_created);
        assert_true(deleted > created);
        assert_int_equal(atoll(f[10]), created);
        last_created = created;
        p->demand_milli += (int64_t)num_gpu * gpu_milli;
        p->pods++;
    }
    free(text);
}

static void test_writes_trace_files(void **state)
{
    fixture *fx = *state;
    char *dir = under(fx, "a");
    kgpu_error err = {0};
    cluster_facts c;
    pod_facts p;
    double ratio;

    assert_int_equal(kgpu_example_write(dir, 42, 200, &err), 0);
    check_nodes(dir, 200, &c);
    check_pods(dir, &c, &p);

    /* 45% of nodes have 8 GPUs; several GPU models are present. */
    assert_int_equal(c.eight_gpu_nodes, 90);
    assert_true(c.nmodels >= 4);

    ratio = (double)p.demand_milli / (double)(c.gpus * 1000);
    assert_true(ratio >= 0.85 && ratio <= 1.05);

    /* The mix, loosely: CPU-only ~13%, shares ~35%, whole GPUs ~52%, specs ~10% of GPU pods. */
    assert_true(p.cpu_only > p.pods * 0.08 && p.cpu_only < p.pods * 0.18);
    assert_true(p.shares > p.pods * 0.28 && p.shares < p.pods * 0.42);
    assert_true(p.whole > p.pods * 0.44 && p.whole < p.pods * 0.60);
    assert_true(p.with_spec > 0 && p.with_spec < (p.shares + p.whole) * 0.2);
    free(dir);
}

static void test_small_clusters(void **state)
{
    fixture *fx = *state;
    char *dir = under(fx, "one");
    kgpu_error err = {0};
    cluster_facts c;
    pod_facts p;

    /* Even one node gets pods that fit it, and the demand target holds. */
    for (int nodes = 1; nodes <= 12; nodes++) {
        assert_int_equal(kgpu_example_write(dir, (uint64_t)nodes, nodes, &err), 0);
        check_nodes(dir, nodes, &c);
        check_pods(dir, &c, &p);
        assert_true(p.pods > 0);
        assert_true(p.demand_milli >= c.gpus * 850 && p.demand_milli <= c.gpus * 1050);
    }
    free(dir);
}

static void test_deterministic(void **state)
{
    fixture *fx = *state;
    char *a = under(fx, "d1"), *b = under(fx, "d2"), *other = under(fx, "d3");
    kgpu_error err = {0};
    char *na, *nb, *pa, *pb, *po;

    assert_int_equal(kgpu_example_write(a, 7, 64, &err), 0);
    assert_int_equal(kgpu_example_write(b, 7, 64, &err), 0);
    assert_int_equal(kgpu_example_write(other, 8, 64, &err), 0);
    na = slurp(a, "nodes.csv"), nb = slurp(b, "nodes.csv");
    pa = slurp(a, "pods.csv"), pb = slurp(b, "pods.csv"), po = slurp(other, "pods.csv");
    assert_string_equal(na, nb);
    assert_string_equal(pa, pb);
    assert_true(strcmp(pa, po) != 0);
    free(na), free(nb), free(pa), free(pb), free(po);

    /* Writing again over existing files gives the same bytes. */
    assert_int_equal(kgpu_example_write(a, 8, 64, &err), 0);
    pa = slurp(a, "pods.csv"), po = slurp(other, "pods.csv");
    assert_string_equal(pa, po);
    free(pa), free(po);
    free(a), free(b), free(other);
}

static void test_creates_nested_dirs(void **state)
{
    fixture *fx = *state;
    char *dir = under(fx, "x/y/z/");
    kgpu_error err = {0};
    struct stat st;
    char *nodes = under(fx, "x/y/z/nodes.csv");

    assert_int_equal(kgpu_example_write(dir, 1, 3, &err), 0);
    assert_int_equal(stat(nodes, &st), 0);
    assert_true(S_ISREG(st.st_mode) && st.st_size > 0);
    free(nodes);
    free(dir);
}

static void test_io_errors(void **state)
{
    fixture *fx = *state;
    char *file = under(fx, "plain"), *below = under(fx, "plain/sub");
    kgpu_error err = {0};
    FILE *f = fopen(file, "w");

    assert_non_null(f);
    fclose(f);

    /* A directory under a regular file cannot be made. */
    assert_int_equal(kgpu_example_write(below, 1, 4, &err), KGPU_EIO);
    assert_int_equal(err.code, KGPU_EIO);
    assert_non_null(strstr(err.msg, below));
    assert_non_null(strstr(err.msg, strerror(ENOTDIR)));

    /* The directory itself is a regular file: the error names the file it tried to write. */
    kgpu_error_clear(&err);
    assert_int_equal(kgpu_example_write(file, 1, 4, &err), KGPU_EIO);
    assert_non_null(strstr(err.msg, "plain/nodes.csv"));
    assert_non_null(strstr(err.msg, strerror(ENOTDIR)));
    free(file);
    free(below);
}

static void test_invalid_arguments(void **state)
{
    fixture *fx = *state;
    char *dir = under(fx, "inval");
    kgpu_error err = {0};
    struct stat st;

    assert_int_equal(kgpu_example_write(dir, 1, 0, &err), KGPU_EINVAL);
    assert_int_equal(err.code, KGPU_EINVAL);
    assert_int_equal(kgpu_example_write(dir, 1, -5, &err), KGPU_EINVAL);
    assert_int_equal(kgpu_example_write(dir, 1, KGPU_EXAMPLE_MAX_NODES + 1, NULL), KGPU_EINVAL);
    assert_int_equal(kgpu_example_write(NULL, 1, 4, &err), KGPU_EINVAL);
    assert_int_equal(kgpu_example_write("", 1, 4, &err), KGPU_EINVAL);
    /* Rejected before touching the file system. */
    assert_int_equal(stat(dir, &st), -1);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_writes_trace_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_clusters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deterministic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_creates_nested_dirs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_io_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_arguments, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
