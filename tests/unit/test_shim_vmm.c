/*
 * The virtual memory table of libkgpu-limit.so: an allocation dies only when
 * its last handle is released, its last mapping unmapped and its last
 * export closed, as the driver frees it; imports of its own exports are the
 * same allocation; foreign imports are charged as far as they are mapped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "vmm.h"

#define MIB (1ULL << 20)

/* Which fake exports are open: tests flip these. */
static int open_fds[64];

static int fake_open(const kgpu_vmm_export *e)
{
    return e->fd >= 0 && e->fd < 64 && open_fds[e->fd] && e->ino == (uint64_t)(1000 + e->fd);
}

static kgpu_vmm_export exp_fd(int fd)
{
    kgpu_vmm_export e = {.fd = fd, .dev = 7, .ino = (uint64_t)(1000 + fd)};
    return e;
}

static uint64_t freed_total(const kgpu_vmm_freed *f)
{
    uint64_t n = 0;
    for (int d = 0; d < KGPU_SHIM_MAX_DEVICES; d++)
        n += f->bytes[d];
    return n;
}

static void release_while_mapped(void **state)
{
    kgpu_vmm v = KGPU_VMM_INIT(fake_open);
    kgpu_vmm_freed f = {0};
    uint64_t more;
    int dev = -1;
    assert_int_equal(kgpu_vmm_created(&v, 0x10, 64 * MIB, 1), 0);
    assert_int_equal(kgpu_vmm_map_cost(&v, 0x10, 0, 64 * MIB, &more, &dev), 1);
    assert_int_equal(more, 0); /* made here: charged at creation */
    assert_int_equal(dev, 1);
    assert_int_equal(kgpu_vmm_mapped(&v, 0x7000000, 32 * MIB, 0, 0x10, 0), 0);
    assert_int_equal(kgpu_vmm_mapped(&v, 0x9000000, 32 * MIB, 32 * MIB, 0x10, 0), 0);
    kgpu_vmm_released(&v, 0x10, &f);
    assert_int_equal(freed_total(&f), 0); /* still mapped: still memory */
    kgpu_vmm_unmapped(&v, 0x7000000, 32 * MIB, &f);
    assert_int_equal(freed_total(&f), 0);
    kgpu_vmm_unmapped(&v, 0x9000000, 32 * MIB, &f);
    assert_int_equal(f.bytes[1], 64 * MIB); /* the last mapping went */
    size_t a, h, m;
    kgpu_vmm_counts(&v, &a, &h, &m);
    assert_int_equal(a + h + m, 0);
    kgpu_vmm_clear(&v);
}

static void retain_and_release_pairs(void **state)
{
    kgpu_vmm v = KGPU_VMM_INIT(fake_open);
    kgpu_vmm_freed f = {0};
    assert_int_equal(kgpu_vmm_created(&v, 0x20, 8 * MIB, 0), 0);
    assert_int_equal(kgpu_vmm_mapped(&v, 0x1000000, 8 * MIB, 0, 0x20, 0), 0);
    /* NCCL's query: retain by address, release; then the owner's release. */
    assert_int_equal(kgpu_vmm_retained(&v, 0x20, 0x1000000 + 4096), 1);
    kgpu_vmm_released(&v, 0x20, &f);
    kgpu_vmm_released(&v, 0x20, &f);
    assert_int_equal(freed_total(&f), 0); /* mapped */
    /* All references gone, the mapping keeps the handle: retaining works again. */
    assert_int_equal(kgpu_vmm_knows(&v, 0x20), 0);
    assert_int_equal(kgpu_vmm_retained(&v, 0x99, 0x1000000), 0); /* not the mapped handle */
    assert_int_equal(kgpu_vmm_retained(&v, 0x20, 0x5000000), 0); /* nothing mapped there */
    assert_int_equal(kgpu_vmm_retained(&v, 0x20, 0x1000000 + 8 * MIB - 1), 1);
    assert_int_equal(kgpu_vmm_knows(&v, 0x20), 1);
    kgpu_vmm_unmapped(&v, 0x1000000, 8 * MIB, &f);
    assert_int_equal(freed_total(&f), 0); /* the retained reference */
    kgpu_vmm_released(&v, 0x20, &f);
    assert_int_equal(f.bytes[0], 8 * MIB);
    kgpu_vmm_clear(&v);
}

static void exports_keep_it_until_closed(void **state)
{
    kgpu_vmm v = KGPU_VMM_INIT(fake_open);
    kgpu_vmm_freed f = {0};
    assert_int_equal(kgpu_vmm_created(&v, 0x30, 16 * MIB, 2), 0);
    kgpu_vmm_export e = exp_fd(5);
    open_fds[5] = 1;
    kgpu_vmm_exported(&v, 0x30, &e);
    kgpu_vmm_released(&v, 0x30, &f);
    assert_int_equal(freed_total(&f), 0); /* the exported descriptor keeps it */
    /* Imported again in this process: the same allocation, not a new charge. */
    assert_int_equal(kgpu_vmm_imported(&v, 0x31, &e, 2), 0);
    uint64_t more;
    int dev;
    assert_int_equal(kgpu_vmm_map_cost(&v, 0x31, 0, 16 * MIB, &more, &dev), 1);
    assert_int_equal(more, 0);
    kgpu_vmm_released(&v, 0x31, &f);
    assert_int_equal(kgpu_vmm_sweep(&v, &f), 0); /* still open */
    assert_int_equal(freed_total(&f), 0);
    open_fds[5] = 0;
    assert_int_equal(kgpu_vmm_sweep(&v, &f), 1);
    assert_int_equal(f.bytes[2], 16 * MIB);
    /* An export that cannot be watched keeps the charge for good. */
    memset(&f, 0, sizeof(f));
    assert_int_equal(kgpu_vmm_created(&v, 0x40, MIB, 0), 0);
    kgpu_vmm_exported(&v, 0x40, NULL);
    kgpu_vmm_released(&v, 0x40, &f);
    assert_int_equal(kgpu_vmm_sweep(&v, &f), 0);
    assert_int_equal(freed_total(&f), 0);
    kgpu_vmm_clear(&v);
}

static void foreign_imports_charge_what_is_mapped(void **state)
{
    kgpu_vmm v = KGPU_VMM_INIT(fake_open);
    kgpu_vmm_freed f = {0};
    kgpu_vmm_export e = exp_fd(9); /* not exported here */
    assert_int_equal(kgpu_vmm_imported(&v, 0x50, &e, 3), 0);
    uint64_t more;
    int dev;
    assert_int_equal(kgpu_vmm_map_cost(&v, 0x50, 0, 10 * MIB, &more, &dev), 1);
    assert_int_equal(more, 10 * MIB);
    assert_int_equal(dev, 3);
    assert_int_equal(kgpu_vmm_mapped(&v, 0x2000000, 10 * MIB, 0, 0x50, more), 0);
    /* A second, overlapping mapping costs only what lies past the first. */
    assert_int_equal(kgpu_vmm_map_cost(&v, 0x50, 4 * MIB, 10 * MIB, &more, &dev), 1);
    assert_int_equal(more, 4 * MIB);
    /* Two threads charged the same growth: the second one's is given back. */
    assert_int_equal(kgpu_vmm_mapped(&v, 0x3000000, 10 * MIB, 4 * MIB, 0x50, more), 0);
    assert_int_equal(kgpu_vmm_mapped(&v, 0x4000000, 10 * MIB, 4 * MIB, 0x50, more),
                     (int64_t)(4 * MIB));
    assert_int_equal(kgpu_vmm_map_cost(&v, 0x77, 0, MIB, &more, &dev), 0); /* unknown handle */
    kgpu_vmm_released(&v, 0x50, &f);
    kgpu_vmm_unmapped(&v, 0x2000000, 0x3000000, &f); /* one call, all three mappings */
    assert_int_equal(f.bytes[3], 14 * MIB);
    size_t a, h, m;
    kgpu_vmm_counts(&v, &a, &h, &m);
    assert_int_equal(a + h + m, 0);
    kgpu_vmm_clear(&v);
}

static void sparse_tiles_keep_it_too(void **state)
{
    kgpu_vmm v = KGPU_VMM_INIT(fake_open);
    kgpu_vmm_freed f = {0};
    assert_int_equal(kgpu_vmm_created(&v, 0x60, 32 * MIB, 1), 0);
    assert_int_equal(kgpu_vmm_tile_mapped(&v, 0xa1, 7, 0x60), 1);
    assert_int_equal(kgpu_vmm_tile_mapped(&v, 0xa1, 8, 0x60), 1);
    assert_int_equal(kgpu_vmm_tile_mapped(&v, 0xa1, 9, 0x99), 0); /* unknown handle */
    kgpu_vmm_released(&v, 0x60, &f);
    kgpu_vmm_tile_unmapped(&v, 0xa1, 7, &f);
    assert_int_equal(freed_total(&f), 0); /* tile 8 still maps it */
    kgpu_vmm_tile_unmapped(&v, 0xa2, UINT64_MAX, &f); /* another array */
    assert_int_equal(freed_total(&f), 0);
    kgpu_vmm_tile_unmapped(&v, 0xa1, UINT64_MAX, &f); /* the array destroyed */
    assert_int_equal(f.bytes[1], 32 * MIB);
    kgpu_vmm_clear(&v);
}

static void many_handles_stay_sorted(void **state)
{
    kgpu_vmm v = KGPU_VMM_INIT(NULL);
    kgpu_vmm_freed f = {0};
    /* Handles and addresses arrive out of order; every one is found again. */
    for (uint64_t i = 0; i < 500; i++) {
        uint64_t h = (i * 7919) % 1009 + 1;
        assert_int_equal(kgpu_vmm_created(&v, h, MIB, (int)(i % 4)), 0);
        assert_int_equal(kgpu_vmm_mapped(&v, ((i * 31) % 500 + 1) << 30, MIB, 0, h, 0), 0);
    }
    for (uint64_t i = 0; i < 500; i++)
        kgpu_vmm_released(&v, (i * 7919) % 1009 + 1, &f);
    assert_int_equal(freed_total(&f), 0);
    for (uint64_t i = 0; i < 500; i++)
        kgpu_vmm_unmapped(&v, ((i * 31) % 500 + 1) << 30, MIB, &f);
    assert_int_equal(freed_total(&f), 500 * MIB);
    for (int d = 0; d < 4; d++)
        assert_int_equal(f.bytes[d], 125 * MIB);
    kgpu_vmm_clear(&v);
}

/*
 * Memory bound into a multicast object lives while bound: released handles
 * and unmapped memory stay until unbound (on their device, in the range) or
 * until the object's last handle and mapping are gone.
 */
static void multicast_bindings_keep_it(void **state)
{
    kgpu_vmm v = KGPU_VMM_INIT(fake_open);
    kgpu_vmm_freed f = {0};
    assert_int_equal(kgpu_vmm_mcast_created(&v, 0x90), 0);
    assert_int_equal(kgpu_vmm_created(&v, 0x10, 10 * MIB, 0), 0);
    assert_int_equal(kgpu_vmm_created(&v, 0x11, 20 * MIB, 1), 0);
    assert_int_equal(kgpu_vmm_created(&v, 0x12, 40 * MIB, 0), 0);
    assert_int_equal(kgpu_vmm_mcast_bound(&v, 0x90, 0, 10 * MIB, 0x10, 0), 1);
    assert_int_equal(kgpu_vmm_mcast_bound(&v, 0x90, 0, 20 * MIB, 0x11, 0), 1);
    assert_int_equal(kgpu_vmm_mapped(&v, 0x7000000, 40 * MIB, 0, 0x12, 0), 0);
    assert_int_equal(kgpu_vmm_mcast_bound(&v, 0x90, 32 * MIB, 40 * MIB, 0, 0x7000000 + 4096), 1);
    assert_int_equal(kgpu_vmm_mcast_bound(&v, 0x10, 0, 1, 0x11, 0), 0); /* not a multicast object */
    assert_int_equal(kgpu_vmm_mcast_bound(&v, 0x90, 0, 1, 0x99, 0), 0); /* unknown memory */
    kgpu_vmm_released(&v, 0x10, &f);
    kgpu_vmm_released(&v, 0x11, &f);
    kgpu_vmm_released(&v, 0x12, &f);
    kgpu_vmm_unmapped(&v, 0x7000000, 40 * MIB, &f);
    assert_int_equal(freed_total(&f), 0); /* all bound */
    kgpu_vmm_mcast_unbound(&v, 0x90, 1, 0, 32 * MIB, &f); /* device 1's binding only */
    assert_int_equal(f.bytes[1], 20 * MIB);
    assert_int_equal(f.bytes[0], 0);
    kgpu_vmm_released(&v, 0x90, &f); /* the object gone: its bindings with it */
    assert_int_equal(f.bytes[0], 50 * MIB);
    size_t a, h, m;
    kgpu_vmm_counts(&v, &a, &h, &m);
    assert_int_equal(a, 0);
    kgpu_vmm_clear(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(release_while_mapped),
        cmocka_unit_test(retain_and_release_pairs),
        cmocka_unit_test(exports_keep_it_until_closed),
        cmocka_unit_test(foreign_imports_charge_what_is_mapped),
        cmocka_unit_test(sparse_tiles_keep_it_too),
        cmocka_unit_test(many_handles_stay_sorted),
        cmocka_unit_test(multicast_bindings_keep_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
