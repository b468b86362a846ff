/*
 * Unit tests of the MIG geometry (src/core/mig.c): the tables hold what the
 * MIG user guide says, overlapping placements and over-used compute are
 * refused, the layouts NVIDIA lists as valid fit, and kgpu's choice keeps
 * big profiles fitting where first-fit in NVML's order does not.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kgpu/mig.h"

static int index_of(const kgpu_mig_model *m, const char *name)
{
    const kgpu_mig_profile *p = kgpu_mig_profile_find(m, name);
    assert_non_null(p);
    return (int)(p - m->profiles);
}

static void tables_are_consistent(void **state)
{
    (void)state;
    assert_int_equal(kgpu_mig_model_count(), 4);
    for (int i = 0; i < kgpu_mig_model_count(); i++) {
        const kgpu_mig_model *m = kgpu_mig_model_at(i);
        assert_int_equal(m->nprofiles, 7);
        for (int k = 0; k < m->nprofiles; k++) {
            const kgpu_mig_profile *p = &m->profiles[k];
            /* Every start keeps the run of slices on the GPU; starts are multiples of the size. */
            for (int s = 0; s < p->nstarts; s++) {
                assert_int_not_equal(kgpu_mig_mask(p->starts[s], p->size), 0);
                assert_int_equal(p->starts[s] % (p->size == 8 ? 8 : p->size), 0);
            }
            assert_true(p->compute >= 1 && p->compute <= KGPU_MIG_COMPUTE_SLICES);
            assert_true(p->memory_mib > 0 && p->memory_mib <= m->max_mib);
            if (k > 0 && !p->media && !m->profiles[k - 1].media)
                assert_true(p->memory_mib >= m->profiles[k - 1].memory_mib);
        }
        assert_int_equal(kgpu_mig_profile_whole(m)->compute, 7);
        assert_int_equal(kgpu_mig_profile_whole(m)->size, 8);
    }
    const kgpu_mig_model *a = kgpu_mig_model_named("A100-40GB");
    const kgpu_mig_profile *p3 = kgpu_mig_profile_find(a, "3g.20gb");
    assert_int_equal(p3->id, 9);
    assert_int_equal(p3->nvml_profile, 2);
    assert_int_equal(p3->nstarts, 2);
    assert_int_equal(p3->starts[1], 4);
    assert_int_equal(p3->size, 4);
    assert_int_equal(kgpu_mig_profile_find(a, "1g.10gb")->nstarts, 4);
    assert_null(kgpu_mig_profile_find(a, "1g.10gb+me"));
    assert_non_null(kgpu_mig_profile_find(a, "1g.5gb+me"));
    assert_non_null(kgpu_mig_profile_find(kgpu_mig_model_named("H200-141GB"), "7g.141gb"));
}

static void models_are_found_by_name_and_memory(void **state)
{
    (void)state;
    assert_string_equal(kgpu_mig_model_find("NVIDIA A100-SXM4-40GB", 40960)->name, "A100-40GB");
    assert_string_equal(kgpu_mig_model_find("NVIDIA A100-SXM4-80GB", 81920)->name, "A100-80GB");
    assert_string_equal(kgpu_mig_model_find("NVIDIA A100 80GB PCIe", 81920)->name, "A100-80GB");
    assert_string_equal(kgpu_mig_model_find("NVIDIA H100 80GB HBM3", 81559)->name, "H100-80GB");
    assert_string_equal(kgpu_mig_model_find("NVIDIA H200", 143771)->name, "H200-141GB");
    assert_null(kgpu_mig_model_find("Tesla T4", 15360));
    assert_null(kgpu_mig_model_find("NVIDIA H100 NVL", 95830)); /* a 94 GB H100: no table */
    assert_null(kgpu_mig_model_find(NULL, 40960));
}

static void overlaps_and_compute_are_refused(void **state)
{
    (void)state;
    const kgpu_mig_model *m = kgpu_mig_model_named("A100-40GB");
    int g1 = index_of(m, "1g.5gb"), g2 = index_of(m, "2g.10gb"), g3 = index_of(m, "3g.20gb"),
        g4 = index_of(m, "4g.20gb"), g7 = index_of(m, "7g.40gb"), me = index_of(m, "1g.5gb+me");
    kgpu_mig_gpu g;
    memset(&g, 0, sizeof(g));
    assert_false(kgpu_mig_fits(m, &g, g3, 2)); /* not an allowed start */
    assert_false(kgpu_mig_fits(m, &g, g1, 7));
    kgpu_mig_take(m, &g, g2, 2);
    assert_false(kgpu_mig_fits(m, &g, g4, 0)); /* slices 2-3 taken */
    assert_false(kgpu_mig_fits(m, &g, g1, 3));
    assert_false(kgpu_mig_fits(m, &g, g7, 0));
    assert_true(kgpu_mig_fits(m, &g, g3, 4));
    kgpu_mig_give(m, &g, g2, 2);
    assert_true(kgpu_mig_fits(m, &g, g7, 0));
    /* 4g.20gb + 3g.20gb: all 7 compute slices; nothing else fits. */
    kgpu_mig_take(m, &g, g4, 0);
    kgpu_mig_take(m, &g, g3, 4);
    assert_int_equal(g.compute, 7);
    assert_int_equal(kgpu_mig_room(m, &g), 0);
    memset(&g, 0, sizeof(g));
    /* Seven 1g: every compute slice; slice 7 stays free but nothing can use it. */
    for (int s = 0; s < 7; s++)
        kgpu_mig_take(m, &g, g1, s);
    assert_int_equal(g.mem, 0x7f);
    assert_int_equal(kgpu_mig_room(m, &g), 0);
    memset(&g, 0, sizeof(g));
    /* One +me instance per GPU. */
    kgpu_mig_take(m, &g, me, 0);
    assert_false(kgpu_mig_fits(m, &g, me, 1));
    assert_true(kgpu_mig_fits(m, &g, g1, 1));
    /* Instance limits: 2g three times at most (compute allows 3). */
    memset(&g, 0, sizeof(g));
    for (int s = 0; s < 3; s++)
        kgpu_mig_take(m, &g, g2, 2 * s);
    assert_true(kgpu_mig_fits(m, &g, g1, 6));
    assert_false(kgpu_mig_fits(m, &g, g2, 6));
}

static void choice_keeps_big_profiles_fitting(void **state)
{
    (void)state;
    const kgpu_mig_model *m = kgpu_mig_model_named("H100-80GB");
    int g1 = index_of(m, "1g.10gb"), g2 = index_of(m, "2g.20gb"), g3 = index_of(m, "3g.40gb"),
        g4 = index_of(m, "4g.40gb");
    kgpu_mig_gpu ff, kg;
    memset(&ff, 0, sizeof(ff));
    memset(&kg, 0, sizeof(kg));
    /* 1g then 4g: first-fit puts the 1g at slot 0 and the 4g no longer fits. */
    int s_ff = kgpu_mig_first_fit(m, &ff, g1);
    int room = -1;
    int s_kg = kgpu_mig_choose(m, &kg, g1, &room);
    assert_int_equal(s_ff, 0);
    assert_int_equal(s_kg, 6);
    kgpu_mig_take(m, &ff, g1, s_ff);
    kgpu_mig_take(m, &kg, g1, s_kg);
    assert_int_equal(room, kgpu_mig_room(m, &kg));
    assert_int_equal(kgpu_mig_first_fit(m, &ff, g4), -1);
    assert_int_equal(kgpu_mig_choose(m, &kg, g4, NULL), 0);
    /* 2g then 3g: the 2g goes high, and a 3g still has slot 0. */
    memset(&kg, 0, sizeof(kg));
    assert_int_equal(kgpu_mig_choose(m, &kg, g2, NULL), 4);
    kgpu_mig_take(m, &kg, g2, 4);
    assert_int_equal(kgpu_mig_choose(m, &kg, g3, NULL), 0);
    /* Nothing fits a full GPU. */
    kgpu_mig_take(m, &kg, g3, 0);
    kgpu_mig_take(m, &kg, g1, 6);
    assert_int_equal(kgpu_mig_choose(m, &kg, g1, NULL), -1);
    assert_int_equal(kgpu_mig_first_fit(m, &kg, g1), -1);
}

static void slice_order_is_the_choice_repeated(void **state)
{
    (void)state;
    const kgpu_mig_model *m = kgpu_mig_model_named("A100-40GB");
    int out[KGPU_MIG_MAX_STARTS];
    assert_int_equal(kgpu_mig_slice_order(m, index_of(m, "1g.5gb"), out), 7);
    for (int i = 0; i < 7; i++)
        assert_int_equal(out[i], 6 - i);
    assert_int_equal(kgpu_mig_slice_order(m, index_of(m, "3g.20gb"), out), 2);
    assert_int_equal(out[0], 4);
    assert_int_equal(out[1], 0);
    assert_int_equal(kgpu_mig_slice_order(m, index_of(m, "2g.10gb"), out), 3);
    assert_int_equal(out[0], 4);
    /* The +me profile fits once; its other starts follow, highest first. */
    assert_int_equal(kgpu_mig_slice_order(m, index_of(m, "1g.5gb+me"), out), 7);
    assert_int_equal(out[0], 6);
    assert_int_equal(out[1], 5);
}

static void profile_fit_takes_the_smallest(void **state)
{
    (void)state;
    const kgpu_mig_model *m = kgpu_mig_model_named("A100-40GB");
    assert_string_equal(kgpu_mig_profile_fit(m, 1, 1000)->name, "1g.5gb");
    assert_string_equal(kgpu_mig_profile_fit(m, 1, 6000)->name, "1g.10gb");
    assert_string_equal(kgpu_mig_profile_fit(m, 2, 0)->name, "2g.10gb");
    assert_string_equal(kgpu_mig_profile_fit(m, 3, 0)->name, "3g.20gb");
    assert_string_equal(kgpu_mig_profile_fit(m, 1, 30000)->name, "7g.40gb");
    assert_string_equal(kgpu_mig_profile_fit(m, 5, 0)->name, "7g.40gb");
    assert_null(kgpu_mig_profile_fit(m, 8, 0));
    assert_null(kgpu_mig_profile_fit(m, 1, 50000));
}

static void cost_is_room_lost_then_slices_stranded(void **state)
{
    (void)state;
    const kgpu_mig_model *m = kgpu_mig_model_named("A100-40GB");
    int g1 = index_of(m, "1g.5gb"), g3 = index_of(m, "3g.20gb"), g4 = index_of(m, "4g.20gb");
    kgpu_mig_gpu beside4, beside3, empty;
    memset(&beside4, 0, sizeof(beside4));
    memset(&empty, 0, sizeof(empty));
    kgpu_mig_take(m, &beside4, g4, 0);
    beside3 = empty;
    kgpu_mig_take(m, &beside3, g3, 0);
    /* A 3g at 4 beside a 4g fills the GPU: nothing stranded. Beside a 3g: one slice left
     * that no profile can use (all memory slices taken). */
    assert_int_equal(kgpu_mig_stranded(m, &empty), 0);
    int64_t c4 = kgpu_mig_cost(m, &beside4, g3, 4), c3 = kgpu_mig_cost(m, &beside3, g3, 4);
    kgpu_mig_gpu after = beside3;
    kgpu_mig_take(m, &after, g3, 4);
    assert_int_equal(kgpu_mig_stranded(m, &after), 1);
    assert_int_equal(c3 % KGPU_MIG_STRANDED_SCALE, 1);
    assert_int_equal(c4 % KGPU_MIG_STRANDED_SCALE, 0);
    assert_int_equal(c4 / KGPU_MIG_STRANDED_SCALE, kgpu_mig_room(m, &beside4));
    /* On an empty GPU a 3g costs more room than beside a 4g: completing a GPU is cheapest. */
    assert_true(kgpu_mig_cost(m, &empty, g3, 4) > c4);
    assert_int_equal(kgpu_mig_cost(m, &beside4, g4, 0), -1);
    /* The allocator's pick in kgpu's slice order: the first listed start that fits. */
    int o1[KGPU_MIG_MAX_STARTS], o3[KGPU_MIG_MAX_STARTS];
    int n1 = kgpu_mig_slice_order(m, g1, o1), n3 = kgpu_mig_slice_order(m, g3, o3);
    assert_int_equal(kgpu_mig_slice_first(m, &empty, g1, o1, n1), 6);
    assert_int_equal(kgpu_mig_slice_first(m, &beside4, g3, o3, n3), 4);
    kgpu_mig_take(m, &empty, g1, 6);
    assert_int_equal(kgpu_mig_slice_first(m, &empty, g3, o3, n3), 0);
    assert_int_equal(kgpu_mig_slice_first(m, &after, g1, o1, n1), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tables_are_consistent),
        cmocka_unit_test(models_are_found_by_name_and_memory),
        cmocka_unit_test(overlaps_and_compute_are_refused),
        cmocka_unit_test(choice_keeps_big_profiles_fitting),
        cmocka_unit_test(slice_order_is_the_choice_repeated),
        cmocka_unit_test(profile_fit_takes_the_smallest),
        cmocka_unit_test(cost_is_room_lost_then_slices_stranded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
