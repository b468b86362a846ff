/*
 * kgpu-mig-check: kgpu's MIG profile tables (src/core/mig.c) against what a
 * driver's NVML reports, GPU by GPU. Read-only: it never changes the MIG
 * mode and never creates or destroys an instance, so it is safe on a
 * production node (scripts/mig-check.sh runs it; docs/install-dra.md).
 *
 *   kgpu-mig-check [--nvml-lib PATH] [--ctest-gpu]
 *
 * Prints each GPU's name, memory and MIG mode; with MIG, every GI profile
 * NVML reports beside kgpu's entry for it, and the instances that exist.
 * Exit status: 0 everything matched (or the profiles are readable only in
 * MIG mode, which is off), 1 a difference, 2 usage or an NVML failure, 77
 * no NVML here. --ctest-gpu (the CTest test labelled gpu) skips with 77
 * unless KGPU_REAL_NVML is set; a value with a '/' names the library.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "kgpu/mig.h"

#define MAX_PROFILES 24

/* NVML_GPU_INSTANCE_PROFILE_* kgpu's tables could hold (0..9); later ones are variants. */
#define KGPU_KNOWN_PROFILES 10

static void print_nvml(const kgpu_nvml_mig_profile *p)
{
    printf("    NVML  profile %d ID %d %-10s compute %d, instances %d, %lld MiB, %d SMs, "
           "placements",
           p->nvml_profile, p->id, p->name[0] ? p->name : "(no name)", p->slices, p->instances,
           (long long)p->memory_mib, p->multiprocessors);
    for (int i = 0; i < p->nplacements; i++)
        printf(" %d:%d", p->starts[i], p->sizes[i]);
    printf("\n");
}

static void print_kgpu(const kgpu_mig_profile *p)
{
    printf("    kgpu  profile %d ID %d %-10s compute %d, instances %d, %lld MiB, %d SMs, "
           "placements",
           p->nvml_profile, p->id, p->name, p->compute, p->instances, (long long)p->memory_mib,
           p->multiprocessors);
    for (int i = 0; i < p->nstarts; i++)
        printf(" %d:%d", p->starts[i], p->size);
    printf("\n");
}

/* What differs between NVML's profile and kgpu's, into why; 0 when they agree. */
static int differs(const kgpu_nvml_mig_profile *n, const kgpu_mig_profile *k, char *why,
                   size_t len)
{
    why[0] = '\0';
    size_t used = 0;
#define DIFF(cond, ...)                                                                            \
    do {                                                                                           \
        if ((cond) && used < len)                                                                  \
            used += (size_t)snprintf(why + used, len - used, __VA_ARGS__);                         \
    } while (0)
    DIFF(n->id != k->id, " ID %d vs %d;", n->id, k->id);
    DIFF(n->name[0] && strcmp(n->name, k->name) != 0, " name %s vs %s;", n->name, k->name);
    DIFF(n->slices != k->compute, " compute %d vs %d;", n->slices, k->compute);
    DIFF(n->instances != k->instances, " instances %d vs %d;", n->instances, k->instances);
    DIFF(n->memory_mib != k->memory_mib, " memory %lld vs %lld MiB;", (long long)n->memory_mib,
         (long long)k->memory_mib);
    DIFF(n->multiprocessors != k->multiprocessors, " SMs %d vs %d;", n->multiprocessors,
         k->multiprocessors);
    bool same = n->nplacements == k->nstarts;
    for (int i = 0; same && i < n->nplacements; i++)
        same = n->starts[i] == k->starts[i] && n->sizes[i] == k->size;
    DIFF(!same, " placements differ;");
#undef DIFF
    return why[0] != '\0';
}

/* One GPU: 0 agreed (or nothing to compare), 1 a difference. */
static int check_gpu(kgpu_nvml *nv, const kgpu_gpu_info *g)
{
    printf("GPU %d: %s, %lld MiB, MIG mode %s\n", g->index, g->model, (long long)g->memory_mib,
           g->mig_mode == 1 ? "enabled" : g->mig_mode == 0 ? "disabled" : "not supported");
    if (g->mig_mode < 0) {
        printf("  no MIG on this GPU: nothing to compare\n");
        return 0;
    }
    const kgpu_mig_model *model = kgpu_mig_model_find(g->model, g->memory_mib);
    printf("  kgpu's table: %s\n", model != NULL ? model->name : "none");
    kgpu_nvml_mig_profile prof[MAX_PROFILES];
    int n = 0;
    kgpu_error err = {0};
    int rc = kgpu_nvml_mig_profiles(nv, g->index, prof, MAX_PROFILES, &n, &err);
    if (rc == KGPU_ESTATE && g->mig_mode == 0) {
        printf("  %s\n  (MIG mode is off; kgpu does not turn it on)\n", err.msg);
        return 0;
    }
    if (rc != KGPU_OK) {
        printf("  DIFFERENCE: cannot read the profiles: %s\n", err.msg);
        return 1;
    }
    if (model == NULL) {
        printf("  DIFFERENCE: NVML reports %d MIG profiles and kgpu has no table for this GPU\n",
               n);
        for (int i = 0; i < n; i++)
            print_nvml(&prof[i]);
        return 1;
    }
    int bad = 0;
    bool matched[MAX_PROFILES] = {false};
    for (int p = 0; p < model->nprofiles; p++) {
        const kgpu_mig_profile *k = &model->profiles[p];
        const kgpu_nvml_mig_profile *got = NULL;
        for (int i = 0; i < n; i++)
            if (prof[i].nvml_profile == k->nvml_profile) {
                got = &prof[i];
                matched[i] = true;
            }
        char why[512];
        if (got == NULL) {
            printf("  %-10s DIFFERENCE: NVML does not offer it\n", k->name);
            print_kgpu(k);
            bad = 1;
        } else if (differs(got, k, why, sizeof(why))) {
            printf("  %-10s DIFFERENCE (NVML vs kgpu):%s\n", k->name, why);
            print_nvml(got);
            print_kgpu(k);
            bad = 1;
        } else {
            printf("  %-10s same\n", k->name);
            print_nvml(got);
        }
    }
    for (int i = 0; i < n; i++) {
        if (matched[i])
            continue;
        bool known = prof[i].nvml_profile < KGPU_KNOWN_PROFILES;
        printf("  %-10s %s: not in kgpu's table\n", prof[i].name[0] ? prof[i].name : "?",
               known ? "DIFFERENCE" : "note (a later variant kgpu does not use)");
        print_nvml(&prof[i]);
        bad |= known;
    }
    if (g->mig_mode == 1) {
        kgpu_nvml_mig inst[KGPU_NVML_MIG_MAX];
        int k = 0;
        if (kgpu_nvml_mig_list(nv, g->index, inst, KGPU_NVML_MIG_MAX, &k, &err) != KGPU_OK) {
            printf("  instances: cannot list: %s\n", err.msg);
            return 1;
        }
        printf("  instances: %d\n", k);
        for (int i = 0; i < k; i++) {
            const kgpu_mig_profile *kp = NULL;
            for (int p = 0; p < model->nprofiles; p++)
                if (model->profiles[p].nvml_profile == inst[i].nvml_profile)
                    kp = &model->profiles[p];
            printf("    GI %u CI %s%u %s at %d:%d %lld MiB %s\n", inst[i].gi_id,
                   inst[i].ci_id == UINT_MAX ? "none " : "",
                   inst[i].ci_id == UINT_MAX ? 0 : inst[i].ci_id, kp ? kp->name : "?",
                   inst[i].start, inst[i].size, (long long)inst[i].memory_mib,
                   inst[i].uuid[0] ? inst[i].uuid : "(no MIG device)");
        }
    }
    return bad;
}

int main(int argc, char **argv)
{
    const char *lib = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--nvml-lib") == 0 && i + 1 < argc) {
            lib = argv[++i];
        } else if (strcmp(argv[i], "--ctest-gpu") == 0) {
            const char *real = getenv("KGPU_REAL_NVML");
            if (real == NULL || *real == '\0') {
                printf("SKIPPED: set KGPU_REAL_NVML to check against a real GPU's NVML\n");
                return 77;
            }
            if (strchr(real, '/') != NULL)
                lib = real;
        } else {
            fprintf(stderr, "usage: kgpu-mig-check [--nvml-lib PATH] [--ctest-gpu]\n");
            return 2;
        }
    }
    kgpu_nvml *nv = NULL;
    kgpu_error err = {0};
    int rc = kgpu_nvml_open(lib, NULL, &nv, &err);
    if (rc == KGPU_ENOENT) {
        printf("SKIPPED: %s\n", err.msg);
        return 77;
    }
    if (rc != KGPU_OK) {
        fprintf(stderr, "kgpu-mig-check: %s\n", err.msg);
        return 2;
    }
    kgpu_gpu_info *gpus = NULL;
    int n = 0;
    if (kgpu_nvml_discover(nv, &gpus, &n, &err) != KGPU_OK) {
        fprintf(stderr, "kgpu-mig-check: %s\n", err.msg);
        kgpu_nvml_close(nv);
        return 2;
    }
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad |= check_gpu(nv, &gpus[i]);
    if (n < kgpu_nvml_device_count(nv)) {
        printf("left out: %s\n", kgpu_nvml_skipped(nv));
        bad = 1;
    }
    printf("%s: %d GPU(s)\n", bad ? "DIFFERENCES" : "OK", n);
    free(gpus);
    kgpu_nvml_close(nv);
    return bad ? 1 : 0;
}
