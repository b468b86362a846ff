/*
 * `kgpu simulate`: replay an Alibaba-format trace against placement policies
 * and report GPU allocation as the FGD study does (table, JSON, SVG plot).
 * All file I/O of the simulator lives here; the core only sees buffers.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "fileio.h"
#include "plot.h"
#include "study.h"

#define MAX_SEEDS    1000
#define MAX_POLICIES 32

int kgpu_read_file(const char *path, char **buf, size_t *len, kgpu_error *err)
{
    return kgpu_read_file_max(path, (size_t)1 << 30, buf, len, err);
}

int kgpu_parse_seeds(const char *text, uint64_t *seeds, int max, int *n, kgpu_error *err)
{
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        unsigned long long a = strtoull(p, &end, 10);
        if (end == p || errno != 0 || *p == '-')
            return kgpu_error_set(err, KGPU_EINVAL, "--seeds '%s': expected N, A-B or a list",
                                  text);
        unsigned long long b = a;
        if (*end == '-') {
            p = end + 1;
            errno = 0;
            b = strtoull(p, &end, 10);
            if (end == p || errno != 0 || *p == '-' || b < a)
                return kgpu_error_set(err, KGPU_EINVAL, "--seeds '%s': bad range", text);
        }
        for (unsigned long long s = a;; s++) {
            if (*n >= max)
                return kgpu_error_set(err, KGPU_ERANGE, "--seeds '%s': more than %d seeds", text,
                                      max);
            seeds[(*n)++] = s;
            if (s == b) /* not s <= b in the loop test: b may be the largest value */
                break;
        }
        if (*end == ',')
            end++;
        else if (*end != '\0')
            return kgpu_error_set(err, KGPU_EINVAL, "--seeds '%s': unexpected '%c'", text, *end);
        p = end;
    }
    if (*n == 0)
        return kgpu_error_set(err, KGPU_EINVAL, "--seeds is empty");
    return 0;
}

int kgpu_load_input(const char *nodes_path, const char *pods_path, kgpu_sim_input *in,
                    kgpu_error *err)
{
    char *nb = NULL, *pb = NULL;
    size_t nl = 0, pl = 0;
    kgpu_trace nodes, pods;
    memset(&nodes, 0, sizeof(nodes));
    memset(&pods, 0, sizeof(pods));
    int rc = kgpu_read_file(nodes_path, &nb, &nl, err);
    if (rc == 0)
        rc = kgpu_read_file(pods_path, &pb, &pl, err);
    if (rc == 0)
        rc = kgpu_trace_parse_nodes(nb, nl, nodes_path, &nodes, err);
    if (rc == 0)
        rc = kgpu_trace_parse_pods(pb, pl, pods_path, &pods, err);
    if (rc == 0)
        rc = kgpu_sim_prepare(&nodes, &pods, in, err);
    kgpu_trace_free(&nodes);
    kgpu_trace_free(&pods);
    free(nb);
    free(pb);
    return rc;
}

static json_t *real_array(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

json_t *kgpu_study_json(const kgpu_study *s, bool timing)
{
    json_t *root = json_object();
    json_object_set_new(root, "nodes", json_integer(kgpu_cluster_node_count(s->in->cluster)));
    json_object_set_new(root, "gpus", json_integer(s->in->gpus));
    json_object_set_new(root, "inflate", json_real(s->inflate));
    json_object_set_new(root, "pods_in_file", json_integer((json_int_t)s->in->nrequests));
    json_object_set_new(root, "target_shapes", json_integer(s->in->target.n));
    json_object_set_new(root, "tie_break", json_string(s->random_ties ? "random" : "seeded-order"));
    json_object_set_new(root, "target", json_string(s->online ? "online" : "trace"));
    json_t *results = json_array();
    for (int r = 0; r < s->nrows; r++) {
        const kgpu_study_row *row = &s->rows[r];
        json_t *o = json_object();
        json_t *seeds = json_array();
        double by_seed[MAX_SEEDS];
        for (int k = 0; k < s->nseeds; k++) {
            json_array_append_new(seeds, json_integer((json_int_t)s->seeds[k]));
            by_seed[k] = row->runs[k].alloc_pct_final;
        }
        json_object_set_new(o, "policy", json_string(row->policy));
        json_object_set_new(o, "online", json_boolean(s->nseeds > 0 && row->runs[0].online));
        json_object_set_new(o, "seeds", seeds);
        json_object_set_new(o, "alloc_pct_100", json_real(row->alloc_pct_100));
        json_object_set_new(o, "alloc_pct_130", json_real(row->alloc_pct_130));
        json_object_set_new(o, "alloc_pct_130_by_seed", real_array(by_seed, s->nseeds));
        json_object_set_new(o, "unallocated_gpus", json_real(row->unallocated_gpus));
        json_object_set_new(o, "frag_ratio_pct_90", json_real(row->frag_ratio_pct_90));
        json_object_set_new(o, "alloc_curve", real_array(row->curve, KGPU_SIM_CURVE_MAX + 1));
        json_object_set_new(o, "pods", json_real(row->pods));
        json_object_set_new(o, "pods_failed", json_real(row->pods_failed));
        json_object_set_new(o, "constrained_pods", json_real(row->constrained_pods));
        json_object_set_new(o, "constrained_pods_failed", json_real(row->constrained_failed));
        json_object_set_new(o, "wall_s", json_real(timing ? row->wall_s_total : 0.0));
        json_array_append_new(results, o);
    }
    json_object_set_new(root, "results", results);
    return root;
}

static void print_table(FILE *f, const kgpu_study *s, const char *pods_path)
{
    fprintf(f, "cluster: %d nodes, %d GPUs   workload: %s (%zu pods), inflated to %.2fx\n",
            kgpu_cluster_node_count(s->in->cluster), s->in->gpus, pods_path, s->in->nrequests,
            s->inflate);
    fprintf(f, "seeds: %" PRIu64, s->seeds[0]);
    if (s->nseeds > 1)
        fprintf(f, "..%" PRIu64 " (%d runs each, means shown)", s->seeds[s->nseeds - 1], s->nseeds);
    fprintf(f, "\n\n%-16s %11s %11s %13s %12s %9s %8s\n", "policy", "alloc@100%", "alloc@130%",
            "unalloc GPUs", "failed pods", "frag@90%", "wall s");
    for (int r = 0; r < s->nrows; r++) {
        const kgpu_study_row *row = &s->rows[r];
        char name[64];
        snprintf(name, sizeof(name), "%s%s", row->policy,
                 s->nseeds > 0 && row->runs[0].online ? " (online)" : "");
        fprintf(f, "%-16s %10.2f%% %10.2f%% %13.1f %12.1f %8.1f%% %8.2f\n", name,
                row->alloc_pct_100, row->alloc_pct_130, row->unallocated_gpus, row->pods_failed,
                row->frag_ratio_pct_90, row->wall_s_total);
    }
    fprintf(f, "\nalloc@N%%: GPU allocated / capacity when GPU demand arrived reached N%% of "
               "capacity.\nfrag@90%%: share of idle GPU compute the target workload cannot use.\n");
}

static int write_plot(const char *path, const kgpu_study *s, kgpu_error *err)
{
    kgpu_plot_series series[MAX_POLICIES];
    for (int r = 0; r < s->nrows; r++)
        series[r] = (kgpu_plot_series){.label = s->rows[r].policy,
                                       .x = NULL,
                                       .y = s->rows[r].curve,
                                       .n = KGPU_SIM_CURVE_MAX + 1};
    kgpu_plot plot = {.title = "GPU allocation as workload arrives (mean over seeds)",
                      .xlabel = "GPU demand arrived (% of capacity)",
                      .ylabel = "GPU allocated (% of capacity)",
                      .xmin = 0,
                      .xmax = KGPU_SIM_CURVE_MAX,
                      .ymin = 0,
                      .ymax = 100,
                      .series = series,
                      .nseries = s->nrows};
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return kgpu_error_set(err, KGPU_EIO, "cannot write %s: %s", path, strerror(errno));
    int rc = kgpu_plot_svg(f, &plot, err);
    if (fclose(f) != 0 && rc == 0)
        rc = kgpu_error_set(err, KGPU_EIO, "cannot write %s: %s", path, strerror(errno));
    return rc;
}

static void simulate_usage(FILE *f)
{
    fprintf(f, "usage: kgpu simulate --nodes NODES.csv --pods PODS.csv [options]\n"
               "\n"
               "Replays an Alibaba-format GPU trace against placement policies, as the FGD study\n"
               "(ATC '23) does, and reports how much of the cluster's GPU each policy allocates.\n"
               "\n"
               "  --nodes FILE      node list (sn,cpu_milli,memory_mib,gpu,model)\n"
               "  --pods FILE       pod list (11-column or 5-column layout)\n"
               "  --policy LIST     comma-separated policies (default: all):");
    for (const kgpu_policy_ops *const *p = kgpu_policy_list(); *p; p++)
        fprintf(f, " %s", (*p)->name);
    fprintf(f, "\n"
               "  --seeds SEEDS     N, A-B or a comma list (default 42-51)\n"
               "  --inflate X       workload GPU demand as a multiple of capacity (default 1.3)\n"
               "  --threads N       parallel runs (default: one per CPU)\n"
               "  --json            print the results as JSON on stdout\n"
               "  --no-timing       report wall_s as 0, so output is byte-identical per seed\n"
               "  --random-ties     break score ties at random per pod (kube-scheduler's way)\n"
               "                    instead of the study's fixed per-seed node order\n"
               "  --online          policies learn the workload from the pods arrived so far\n"
               "                    instead of the whole file's shape mix (kgpu always does)\n"
               "  --plot FILE.svg   write allocation %% against arrival %% for each policy\n");
}

int kgpu_cmd_simulate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"nodes", required_argument, NULL, 'n'},   {"pods", required_argument, NULL, 'p'},
        {"policy", required_argument, NULL, 'P'},  {"seeds", required_argument, NULL, 's'},
        {"inflate", required_argument, NULL, 'i'}, {"threads", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},          {"no-timing", no_argument, NULL, 'T'},
        {"plot", required_argument, NULL, 'o'},    {"help", no_argument, NULL, 'h'},
        {"random-ties", no_argument, NULL, 'R'},   {"online", no_argument, NULL, 'O'},
        {NULL, 0, NULL, 0},
    };
    const char *nodes_path = NULL, *pods_path = NULL, *plot_path = NULL;
    char *policy_text = NULL;
    const char *seeds_text = "42-51";
    double inflate = 1.3;
    int threads = 0;
    bool json = false, timing = true, random_ties = false, online = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'n':
            nodes_path = optarg;
            break;
        case 'p':
            pods_path = optarg;
            break;
        case 'P':
            free(policy_text);
            policy_text = strdup(optarg);
            break;
        case 's':
            seeds_text = optarg;
            break;
        case 'i':
            inflate = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(inflate > 0 && inflate <= 100)) {
                fprintf(stderr, "kgpu simulate: --inflate '%s': expected a number in (0, 100]\n",
                        optarg);
                free(policy_text);
                return 2;
            }
            break;
        case 't':
            threads = (int)strtol(optarg, &end, 10);
            if (end == optarg || *end != '\0' || threads < 1 || threads > 256) {
                fprintf(stderr, "kgpu simulate: --threads '%s': expected 1..256\n", optarg);
                free(policy_text);
                return 2;
            }
            break;
        case 'j':
            json = true;
            break;
        case 'T':
            timing = false;
            break;
        case 'o':
            plot_path = optarg;
            break;
        case 'R':
            random_ties = true;
            break;
        case 'O':
            online = true;
            break;
        case 'h':
            simulate_usage(stdout);
            free(policy_text);
            return 0;
        default:
            simulate_usage(stderr);
            free(policy_text);
            return 2;
        }
    }
    if (nodes_path == NULL || pods_path == NULL || optind < argc) {
        fprintf(stderr, "kgpu simulate: %s\n",
                optind < argc ? "unexpected argument" : "--nodes and --pods are required");
        simulate_usage(stderr);
        free(policy_text);
        return 2;
    }
    const char *policies[MAX_POLICIES];
    int npolicies = 0;
    if (policy_text == NULL) {
        for (const kgpu_policy_ops *const *p = kgpu_policy_list(); *p && npolicies < MAX_POLICIES;
             p++)
            policies[npolicies++] = (*p)->name;
    } else {
        for (char *save = NULL, *t = strtok_r(policy_text, ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            if (npolicies == MAX_POLICIES) {
                fprintf(stderr, "kgpu simulate: more than %d policies\n", MAX_POLICIES);
                free(policy_text);
                return 2;
            }
            if (kgpu_policy_find(t) == NULL) {
                fprintf(stderr, "kgpu simulate: unknown policy '%s' (see --help)\n", t);
                free(policy_text);
                return 2;
            }
            policies[npolicies++] = t;
        }
    }
    kgpu_error err;
    kgpu_error_clear(&err);
    uint64_t seeds[MAX_SEEDS];
    int nseeds = 0, status = 1;
    kgpu_sim_input in;
    memset(&in, 0, sizeof(in));
    kgpu_study study;
    memset(&study, 0, sizeof(study));
    if (npolicies == 0) {
        kgpu_error_set(&err, KGPU_EINVAL, "--policy is empty");
        goto out;
    }
    if (kgpu_parse_seeds(seeds_text, seeds, MAX_SEEDS, &nseeds, &err) != 0)
        goto out;
    if (kgpu_load_input(nodes_path, pods_path, &in, &err) != 0)
        goto out;
    if (kgpu_study_init(&study, &in, policies, npolicies, seeds, nseeds, inflate, &err) != 0)
        goto out;
    study.threads = threads;
    study.random_ties = random_ties;
    study.online = online;
    study.progress = isatty(STDERR_FILENO);
    if (kgpu_study_run(&study, &err) != 0)
        goto out;
    if (json) {
        json_t *root = kgpu_study_json(&study, timing);
        json_dumpf(root, stdout, JSON_PRESERVE_ORDER | JSON_INDENT(2) | JSON_REAL_PRECISION(10));
        fputc('\n', stdout);
        json_decref(root);
    } else {
        print_table(stdout, &study, pods_path);
    }
    if (plot_path != NULL && write_plot(plot_path, &study, &err) != 0)
        goto out;
    if (fflush(stdout) != 0) {
        kgpu_error_set(&err, KGPU_EIO, "cannot write the results: %s", strerror(errno));
        goto out;
    }
    status = 0;
out:
    if (status != 0)
        fprintf(stderr, "kgpu simulate: %s\n", err.msg[0] ? err.msg : kgpu_strerror(err.code));
    kgpu_study_free(&study);
    kgpu_sim_input_free(&in);
    free(policy_text);
    return status;
}
