/*
 * The limits file parser of libkgpu-limit.so: what the device plugin
 * writes parses to what it means; everything else is refused with the line
 * and field named, and nothing half-parsed comes back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "shimlimits.h"

static int parse(const char *text, kgpu_shim_limits *lim, kgpu_error *err)
{
    return kgpu_shim_limits_parse(text, strlen(text), "/etc/kgpu/limits", lim, err);
}

static void assert_refused(const char *text, const char *message)
{
    kgpu_shim_limits lim;
    kgpu_error err = {0};
    int rc = parse(text, &lim, &err);
    if (rc == KGPU_OK || strstr(err.msg, message) == NULL)
        fail_msg("input %s\nexpected an error containing: %s\ngot %d: %s", text, message, rc,
                 err.msg);
    assert_int_equal(lim.ndevices, 0);
}

static void plugin_output(void **state)
{
    kgpu_shim_limits lim;
    kgpu_error err = {0};
    const char *text = "# kgpu limits v1\n"
                       "device 0 uuid=GPU-8f3c1c2e-0000-1111-2222-333344445555 memory_mib=4096 "
                       "core_pct=25\n"
                       "device 1 uuid=GPU-2d71aaaa-0000-1111-2222-333344445555 memory_mib=2048 "
                       "core_pct=100\n";
    assert_int_equal(parse(text, &lim, &err), KGPU_OK);
    assert_int_equal(lim.ndevices, 2);
    assert_string_equal(lim.dev[0].uuid, "GPU-8f3c1c2e-0000-1111-2222-333344445555");
    assert_int_equal(lim.dev[0].memory_mib, 4096);
    assert_int_equal(lim.dev[0].core_pct, 25);
    assert_int_equal(lim.dev[1].memory_mib, 2048);
    assert_int_equal(lim.dev[1].core_pct, 100);
    assert_int_equal(kgpu_shim_limits_find(&lim, "gpu-2D71AAAA-0000-1111-2222-333344445555"), 1);
    assert_int_equal(kgpu_shim_limits_find(&lim, "GPU-nope"), -1);

    /* What format writes parses back to the same. */
    char buf[1024];
    size_t n = kgpu_shim_limits_format(&lim, buf, sizeof(buf));
    assert_int_equal(n, strlen(buf));
    assert_string_equal(buf, text);
}

static void lenient_where_harmless(void **state)
{
    kgpu_shim_limits lim;
    kgpu_error err = {0};
    const char *text = "# kgpu limits v1  \r\n"
                       "\n"
                       "# written by kgpu-device-plugin\n"
                       "   # indented comment\n"
                       "device 0 memory_mib=1 uuid=GPU-a future_field=7\r\n"
                       "\tdevice\t1\tuuid=GPU-b\tmemory_mib=0\n"
                       "device 2 uuid=MIG-c memory_mib=4294967296"; /* no final newline */
    assert_int_equal(parse(text, &lim, &err), KGPU_OK);
    assert_int_equal(lim.ndevices, 3);
    assert_string_equal(lim.dev[0].uuid, "GPU-a");
    assert_int_equal(lim.dev[0].core_pct, -1);
    assert_int_equal(lim.dev[1].memory_mib, 0);
    assert_int_equal(lim.dev[2].memory_mib, KGPU_SHIM_MAX_MEMORY_MIB);
}

/* The ceiling on an idle GPU: core_pct..100, absent as -1, and written back by format. */
static void a_compute_ceiling(void **state)
{
    kgpu_shim_limits lim;
    kgpu_error err = {0};
    const char *text = "# kgpu limits v1\n"
                       "device 0 uuid=GPU-a memory_mib=5 core_pct=30 core_limit_pct=50\n"
                       "device 1 uuid=GPU-b memory_mib=5 core_limit_pct=100 core_pct=100\n"
                       "device 2 uuid=GPU-c memory_mib=5 core_pct=30\n";
    assert_int_equal(parse(text, &lim, &err), KGPU_OK);
    assert_int_equal(lim.dev[0].core_limit_pct, 50);
    assert_int_equal(lim.dev[1].core_limit_pct, 100);
    assert_int_equal(lim.dev[2].core_limit_pct, -1);
    char buf[1024];
    kgpu_shim_limits_format(&lim, buf, sizeof(buf));
    assert_non_null(strstr(buf, "device 0 uuid=GPU-a memory_mib=5 core_pct=30 core_limit_pct=50\n"));
    assert_non_null(strstr(buf, "device 2 uuid=GPU-c memory_mib=5 core_pct=30\n"));
    kgpu_shim_limits back;
    assert_int_equal(kgpu_shim_limits_parse(buf, strlen(buf), "again", &back, &err), KGPU_OK);
    assert_memory_equal(&lim, &back, sizeof(lim));
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=5 core_pct=30 core_limit_pct=20\n",
                   ":2: core_limit_pct: 20 is below core_pct (30)");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=5 core_limit_pct=101\n",
                   ":2: core_limit_pct: 101 is above 100");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=5 core_limit_pct=5 "
                   "core_limit_pct=6\n",
                   ":2: core_limit_pct given twice");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=5 core_limit_pct=half\n",
                   ":2: core_limit_pct: 'half' is not a whole percent");
}

static void refusals_name_line_and_field(void **state)
{
    assert_refused("", "/etc/kgpu/limits:1: expected '# kgpu limits v1' first");
    assert_refused("device 0 uuid=GPU-a memory_mib=1\n", ":1: expected '# kgpu limits v1'");
    assert_refused("# kgpu limits v2\ndevice 0 uuid=GPU-a memory_mib=1\n",
                   ":1: unsupported format version 'v2'");
    assert_refused("# kgpu limits v1\n", "no device lines");
    assert_refused("# kgpu limits v1\n# only comments\n", "no device lines");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=lots\n",
                   ":2: memory_mib: 'lots' is not a whole number of MiB");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=-5\n", ":2: memory_mib: '-5'");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=4294967297\n",
                   ":2: memory_mib: 4294967297 is too large");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=99999999999999999999999\n",
                   ":2: memory_mib:");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=\n", ":2: memory_mib: ''");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a\n", ":2: device has no memory_mib=");
    assert_refused("# kgpu limits v1\ndevice 0 memory_mib=5\n", ":2: device has no uuid=");
    assert_refused("# kgpu limits v1\ndevice 0 uuid= memory_mib=5\n", ":2: uuid: empty");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a uuid=GPU-b memory_mib=5\n",
                   ":2: uuid given twice");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=5 memory_mib=6\n",
                   ":2: memory_mib given twice");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=5 core_pct=101\n",
                   ":2: core_pct: 101 is above 100");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=5 core_pct=x\n",
                   ":2: core_pct: 'x' is not a whole percent");
    assert_refused("# kgpu limits v1\ndevice 1 uuid=GPU-a memory_mib=5\n",
                   ":2: device index 1, expected 0");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=5\ndevice 0 uuid=GPU-b "
                   "memory_mib=5\n",
                   ":3: device index 0, expected 1");
    assert_refused("# kgpu limits v1\ndevice x uuid=GPU-a memory_mib=5\n",
                   ":2: device index 'x' is not a number");
    assert_refused("# kgpu limits v1\ndevice\n", ":2: device: index missing");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=5\ndevice 1 uuid=gpu-A "
                   "memory_mib=5\n",
                   ":3: uuid gpu-A is already device 0");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a memory_mib=5 junk\n",
                   ":2: field 'junk': expected key=value");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-a =5 memory_mib=5\n",
                   ":2: field '=5': expected key=value");
    assert_refused("# kgpu limits v1\nlimit 0 uuid=GPU-a memory_mib=5\n",
                   ":2: unknown line 'limit'");
    assert_refused("# kgpu limits v1\ndevice 0 uuid=GPU-\x01 memory_mib=5\n",
                   ":2: uuid: 'GPU-?' has a character that is not printable ASCII");
}

static void nul_bytes_and_limits(void **state)
{
    kgpu_shim_limits lim;
    kgpu_error err = {0};
    const char text[] = "# kgpu limits v1\ndevice 0 uuid=GPU-a\0 memory_mib=5\n";
    assert_int_equal(kgpu_shim_limits_parse(text, sizeof(text) - 1, "f", &lim, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "f:2: NUL byte"));

    /* Sixteen devices are fine, seventeen are not. */
    char big[4096] = "# kgpu limits v1\n";
    for (int i = 0; i < 17; i++) {
        char line[80];
        snprintf(line, sizeof(line), "device %d uuid=GPU-%d memory_mib=%d\n", i, i, i + 1);
        strcat(big, line);
        int rc = parse(big, &lim, &err);
        if (i < 16)
            assert_int_equal(rc, KGPU_OK);
        else
            assert_non_null(strstr(err.msg, ":18: more than 16 devices"));
    }
    /* A uuid longer than the field is refused, not cut. */
    char longu[256];
    snprintf(longu, sizeof(longu), "# kgpu limits v1\ndevice 0 uuid=GPU-%0100d memory_mib=5\n", 7);
    assert_refused(longu, ":2: uuid: 'GPU-0000");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plugin_output),
        cmocka_unit_test(lenient_where_harmless),
        cmocka_unit_test(a_compute_ceiling),
        cmocka_unit_test(refusals_name_line_and_field),
        cmocka_unit_test(nul_bytes_and_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
