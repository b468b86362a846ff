/*
 * Unit tests of the CEL subset the extender reads in DRA selectors
 * (dra_cel.c): what it understands evaluates as CEL would, and what it
 * does not is refused with a reason, never guessed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base.h"

/* A device: attributes by name; memory capacity in bytes. */
typedef struct dev {
    const char *model, *profile;
    int64_t index, mem_mib;
    int mig; /* -1: no such attribute */
} dev;

static bool get(const void *ctx, bool cap, const char *name, ext_cel_value *out)
{
    const dev *d = ctx;
    memset(out, 0, sizeof(*out));
    if (cap && strcmp(name, "memory") == 0) {
        *out = (ext_cel_value){.type = EXT_CEL_QTY, .i = d->mem_mib * 1024 * 1024};
        return true;
    }
    if (cap)
        return false;
    if (strcmp(name, "productName") == 0 && d->model != NULL) {
        *out = (ext_cel_value){.type = EXT_CEL_STR, .s = d->model};
        return true;
    }
    if (strcmp(name, "profile") == 0 && d->profile != NULL) {
        *out = (ext_cel_value){.type = EXT_CEL_STR, .s = d->profile};
        return true;
    }
    if (strcmp(name, "index") == 0) {
        *out = (ext_cel_value){.type = EXT_CEL_INT, .i = d->index};
        return true;
    }
    if (strcmp(name, "computeCapability") == 0 && d->mig < 0) {
        *out = (ext_cel_value){.type = EXT_CEL_VER, .i = EXT_CEL_SEMVER(8, 0, 0)};
        return true;
    }
    if (strcmp(name, "mig") == 0 && d->mig >= 0) {
        *out = (ext_cel_value){.type = EXT_CEL_BOOL, .b = d->mig};
        return true;
    }
    return false;
}

static const dev A100 = {"A100-SXM4-40GB", NULL, 0, 40960, -1};
static const dev T4 = {"Tesla T4", NULL, 3, 15360, -1};
static const dev MIG3G = {"A100-SXM4-40GB", "3g.20gb", 0, 20096, 1};

/* The expression's value on d: 1, 0, -1 (CEL fails); fails the test when it does not compile. */
static int eval(const char *expr, const dev *d)
{
    char why[200] = "";
    ext_cel *e = ext_cel_compile(expr, why, sizeof(why));
    if (e == NULL)
        fail_msg("%s: %s", expr, why);
    ext_cel_device view = {.driver = "gpu.kgpu.io", .get = get, .ctx = d};
    int v = ext_cel_eval(e, &view);
    ext_cel_free(e);
    return v;
}

/* Asserts expr is refused, with `reason` in why. */
static void refused(const char *expr, const char *reason)
{
    char why[200] = "";
    ext_cel *e = ext_cel_compile(expr, why, sizeof(why));
    if (e != NULL)
        fail_msg("%s compiled", expr);
    if (strstr(why, reason) == NULL)
        fail_msg("%s: why is \"%s\", not about \"%s\"", expr, why, reason);
}

#define ATTR(n) "device.attributes[\"gpu.kgpu.io\"]." n

static void test_strings_and_ints(void **state)
{
    (void)state;
    assert_int_equal(eval(ATTR("productName") " == \"A100-SXM4-40GB\"", &A100), 1);
    assert_int_equal(eval(ATTR("productName") " == \"A100-SXM4-40GB\"", &T4), 0);
    assert_int_equal(eval(ATTR("productName") " != 'Tesla T4'", &T4), 0);
    assert_int_equal(eval(ATTR("productName") " in [\"Tesla T4\", \"L4\"]", &T4), 1);
    assert_int_equal(eval(ATTR("productName") " in [\"Tesla T4\", \"L4\"]", &A100), 0);
    assert_int_equal(eval("device.attributes[\"gpu.kgpu.io\"][\"index\"] >= 3", &T4), 1);
    assert_int_equal(eval(ATTR("index") " < 3", &T4), 0);
    assert_int_equal(eval(ATTR("index") " <= 0 && " ATTR("index") " > -1", &A100), 1);
    assert_int_equal(eval("device.driver == \"gpu.kgpu.io\"", &A100), 1);
    assert_int_equal(eval("device.driver == 'other.example.com'", &A100), 0);
    assert_int_equal(eval(ATTR("productName") " == \"a\\\"b\"", &A100), 0);
}

static void test_quantities(void **state)
{
    (void)state;
    const char *ge32 = "device.capacity[\"gpu.kgpu.io\"].memory.compareTo(quantity(\"32Gi\")) >= 0";
    assert_int_equal(eval(ge32, &A100), 1);
    assert_int_equal(eval(ge32, &T4), 0);
    assert_int_equal(
        eval("device.capacity['gpu.kgpu.io'].memory.isLessThan(quantity('16Gi'))", &T4), 1);
    assert_int_equal(
        eval("device.capacity['gpu.kgpu.io'].memory.isGreaterThan(quantity('40Gi'))", &A100), 0);
    assert_int_equal(
        eval("device.capacity['gpu.kgpu.io'].memory == quantity('40960Mi')", &A100), 1);
}

static void test_versions(void **state)
{
    (void)state;
    const char *cc = ATTR("computeCapability");
    char buf[300];
    snprintf(buf, sizeof(buf), "%s.compareTo(semver(\"8.0.0\")) >= 0", cc);
    assert_int_equal(eval(buf, &A100), 1);
    snprintf(buf, sizeof(buf), "%s.isLessThan(semver('9.0.0'))", cc);
    assert_int_equal(eval(buf, &A100), 1);
    snprintf(buf, sizeof(buf), "%s.isGreaterThan(semver('8.0.1'))", cc);
    assert_int_equal(eval(buf, &A100), 0);
    snprintf(buf, sizeof(buf), "%s == semver('8.0.0')", cc);
    assert_int_equal(eval(buf, &A100), 1);
    snprintf(buf, sizeof(buf), "%s.compareTo(semver('7.5.0')) > 0", cc);
    assert_int_equal(eval(buf, &MIG3G), -1); /* the device has none */
    snprintf(buf, sizeof(buf), "%s < semver('9.0.0')", cc);
    refused(buf, "ordering");
    snprintf(buf, sizeof(buf), "%s.compareTo(quantity('8')) > 0", cc);
    refused(buf, "two quantities or versions");
    refused("semver('8.0') == semver('8.0.0')", "no version");
    refused("semver('8.0.0-rc1') == semver('8.0.0')", "no version");
}

static void test_logic_and_missing_attributes(void **state)
{
    (void)state;
    const char *p3 = ATTR("profile") " == \"3g.20gb\"";
    assert_int_equal(eval(p3, &MIG3G), 1);
    assert_int_equal(eval(p3, &A100), -1); /* CEL fails: no such attribute */
    /* An error is forgiven where the other side decides, as in CEL. */
    char buf[400];
    snprintf(buf, sizeof(buf), "has(" ATTR("profile") ") && %s", p3);
    assert_int_equal(eval(buf, &A100), 0);
    assert_int_equal(eval(buf, &MIG3G), 1);
    snprintf(buf, sizeof(buf), "%s || " ATTR("index") " == 0", p3);
    assert_int_equal(eval(buf, &A100), 1);
    snprintf(buf, sizeof(buf), "%s || " ATTR("index") " == 9", p3);
    assert_int_equal(eval(buf, &A100), -1);
    assert_int_equal(eval("!(" ATTR("mig") " == true) || false", &MIG3G), 0);
    assert_int_equal(eval("!has(" ATTR("mig") ")", &A100), 1);
    /* The optional form install-dra.md advises under a class of one's own. */
    assert_int_equal(eval(ATTR("?profile.orValue(\"\")") " == \"3g.20gb\"", &A100), 0);
    assert_int_equal(eval(ATTR("?profile.orValue('')") " == '3g.20gb'", &MIG3G), 1);
    assert_int_equal(eval(ATTR("?index.orValue(7)") " == 0", &A100), 1);
    refused(ATTR("?profile.orValue(1)") " == 1", "another type");
    refused(ATTR("?profile") " == \"x\"", "without .orValue");
    refused(ATTR("?pciBusID.orValue('')") " == \"x\"", "optional attribute kgpu does not");
    /* The DeviceClasses' form of has(). */
    assert_int_equal(eval("\"mig\" in device.attributes[\"gpu.kgpu.io\"]", &MIG3G), 1);
    assert_int_equal(eval("!(\"mig\" in device.attributes[\"gpu.kgpu.io\"])", &A100), 1);
    refused("\"pciBusID\" in device.attributes[\"gpu.kgpu.io\"]", "name kgpu reads");
    refused("device.attributes[\"gpu.kgpu.io\"] == device.attributes[\"gpu.kgpu.io\"]",
            "map compared");
    refused("device.attributes[\"gpu.kgpu.io\"]", "not a bool");
    assert_int_equal(eval("((" ATTR("index") " == 0))", &A100), 1);
}

static void test_outside_the_subset_is_refused(void **state)
{
    (void)state;
    refused(ATTR("driverVersion") " == \"1\"", "attribute driverVersion is not one kgpu reads");
    refused("device.attributes[\"other.io\"].model == \"x\"", "domain other.io");
    refused(ATTR("model") ".startsWith(\"A\")", "method startsWith is not read");
    refused(ATTR("index") " == \"0\"", "unlike types");
    refused(ATTR("productName") " + \"x\" == \"y\"", "cannot read at");
    refused(ATTR("index") " == 0 &&", "ends early");
    refused(ATTR("index"), "not a bool");
    refused("", "ends early");
    refused(ATTR("index") " in [1, \"2\"]", "mixed types");
    refused("device.capacity['gpu.kgpu.io'].memory < quantity('1Gi')", "ordering");
    refused("quantity('lots') == quantity('1')", "quantity() of no quantity");
    refused(ATTR("model") " == \"unterminated", "does not end");
    refused(ATTR("index") " == 99999999999999999999", "int in range");
    refused("true && 1", "of something else than bools");
    /* Bounds a tenant cannot pass: nesting and length. */
    char deep[200] = "";
    for (int i = 0; i < EXT_CEL_DEPTH_MAX + 1; i++)
        strcat(deep, "(");
    strcat(deep, "true");
    for (int i = 0; i < EXT_CEL_DEPTH_MAX + 1; i++)
        strcat(deep, ")");
    refused(deep, "nested deeper");
    char nots[200] = "";
    for (int i = 0; i < 40; i++)
        strcat(nots, "!");
    strcat(nots, "true");
    refused(nots, "nested deeper");
    char *longer = malloc(EXT_CEL_LEN_MAX + 20);
    assert_non_null(longer);
    memset(longer, ' ', EXT_CEL_LEN_MAX + 10);
    strcpy(longer + EXT_CEL_LEN_MAX + 5, "true");
    refused(longer, "longer than");
    free(longer);
    char many[EXT_CEL_LEN_MAX] = "true";
    for (int i = 0; i < EXT_CEL_NODES_MAX; i++)
        strcat(many, "||true");
    refused(many, "terms");
    /* Within the bounds, a long chain compiles. */
    assert_int_equal(eval("true || true || false && true", &A100), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strings_and_ints),
        cmocka_unit_test(test_quantities),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_logic_and_missing_attributes),
        cmocka_unit_test(test_outside_the_subset_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
