/* RFC 3339 timestamps as Kubernetes writes and reads them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "clock.h"

static void test_format(void **state)
{
    (void)state;
    char buf[64];
    kgpu_rfc3339(1764118927.5, 6, buf, sizeof(buf));
    assert_string_equal(buf, "2025-11-26T01:02:07.500000Z");
    kgpu_rfc3339(1764118927.25, 3, buf, sizeof(buf));
    assert_string_equal(buf, "2025-11-26T01:02:07.250Z");
    kgpu_rfc3339(0, 0, buf, sizeof(buf));
    assert_string_equal(buf, "1970-01-01T00:00:00Z");
    kgpu_rfc3339_now(buf, sizeof(buf));
    assert_int_equal(strlen(buf), strlen("2026-11-26T01:02:03.123456789Z"));
    double t;
    assert_true(kgpu_rfc3339_parse(buf, &t));
    assert_true(t > 1.7e9);
}

static void test_parse(void **state)
{
    (void)state;
    double t = 0;
    assert_true(kgpu_rfc3339_parse("2025-11-26T01:02:07.512345678Z", &t));
    assert_true(t > 1764118927.5123 && t < 1764118927.5124);
    assert_true(kgpu_rfc3339_parse("2025-11-26T03:02:07+02:00", &t));
    assert_true(t == 1764118927.0);
    assert_true(kgpu_rfc3339_parse("2025-11-25T23:02:07-02:00", &t));
    assert_true(t == 1764118927.0);
    const char *bad[] = {"", "2025-11-26", "2025-11-26T01:02:07", "2025-11-26T01:02:07Zx",
                         "2025-11-26T01:02:07+0200", "yesterday"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_false(kgpu_rfc3339_parse(bad[i], &t));
    assert_false(kgpu_rfc3339_parse(NULL, &t));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
