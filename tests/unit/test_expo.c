/*
 * Unit tests of the text exposition reader (src/cli/expo.c) that `kgpu
 * report` reads the extender's /metrics with: samples, labels and their
 * escapes as the extender writes them, and each kind of malformed line
 * refused with its line number, never read past.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "expo.h"

typedef struct got {
    int n;
    kgpu_expo_sample s[8];
} got;

static int keep(void *ctx, const kgpu_expo_sample *s, kgpu_error *err)
{
    (void)err;
    got *g = ctx;
    if (g->n < 8)
        g->s[g->n] = *s;
    g->n++;
    return 0;
}

static int parse(const char *text, got *g, kgpu_error *err)
{
    memset(g, 0, sizeof(*g));
    return kgpu_expo_parse(text, strlen(text), "m.txt", keep, g, err);
}

static void samples_labels_and_comments(void **state)
{
    (void)state;
    got g;
    kgpu_error err;
    const char *text = "# HELP x y\n# TYPE x counter\n\n"
                       "kgpu_namespace_gpu_seconds_total{namespace=\"a\",queue=\"\",model=\"T4\","
                       "capacity_type=\"spot\"} 12.5\n"
                       "up 1 1700000000000\r\n"
                       "  spaced { a = \"1\" , b=\"2\", } +Inf\n"
                       "nan_one NaN\n"
                       "last -3e2";
    assert_int_equal(parse(text, &g, &err), 0);
    assert_int_equal(g.n, 5);
    assert_string_equal(g.s[0].name, "kgpu_namespace_gpu_seconds_total");
    assert_int_equal(g.s[0].nlabels, 4);
    assert_string_equal(kgpu_expo_label_value(&g.s[0], "model"), "T4");
    assert_string_equal(kgpu_expo_label_value(&g.s[0], "queue"), "");
    assert_null(kgpu_expo_label_value(&g.s[0], "currency"));
    assert_true(g.s[0].value == 12.5);
    assert_int_equal(g.s[0].line, 4);
    assert_true(g.s[1].value == 1);
    assert_int_equal(g.s[2].nlabels, 2);
    assert_string_equal(kgpu_expo_label_value(&g.s[2], "b"), "2");
    assert_true(isinf(g.s[2].value) && g.s[2].value > 0);
    assert_true(isnan(g.s[3].value));
    assert_true(g.s[4].value == -300);
}

static void escapes_in_label_values(void **state)
{
    (void)state;
    got g;
    kgpu_error err;
    assert_int_equal(parse("m{model=\"a\\\"b\\\\c\\nd\"} 1\n", &g, &err), 0);
    assert_int_equal(g.n, 1);
    assert_string_equal(g.s[0].label[0].value, "a\"b\\c\nd");
}

/* Each malformed line is refused, naming the file, the line and what is wrong. */
static void malformed_lines(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"ok 1\nm{a=\"x} 1\n", "m.txt:2: label a: value not closed"},
        {"m{a=\"x\\q\"} 1\n", "m.txt:1: label a: unknown escape"},
        {"m{a=\"x\\", "m.txt:1: label a: value not closed"},
        {"m{a=x} 1\n", "m.txt:1: label a: expected a quoted value"},
        {"m{a\"x\"} 1\n", "m.txt:1: label a: expected '='"},
        {"m{=\"x\"} 1\n", "m.txt:1: expected a label name"},
        {"m{a=\"1\" b=\"2\"} 1\n", "m.txt:1: expected ',' or '}' after label a"},
        {"m{a=\"1\",a=\"2\"} 1\n", "m.txt:1: label a given twice"},
        {"m{a=\"1\"}\n", "m.txt:1: expected a blank before the value"},
        {"m 1x\n", "m.txt:1: value '1x' is not a number"},
        {"m 0x10\n", "m.txt:1: value '0x10' is not a number"},
        {"m Infinity\n", "m.txt:1: value 'Infinity' is not a number"},
        {"m 1 2 3\n", "m.txt:1: unexpected text after the sample of m"},
        {"m 1 1.5\n", "m.txt:1: timestamp '1.5' is not a number"},
        {"1m 1\n", "m.txt:1: expected a metric name"},
        {"m\n", "m.txt:1: expected a blank before the value of m"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        got g;
        kgpu_error err;
        int rc = parse(bad[i].text, &g, &err);
        if (rc != KGPU_EPARSE || strstr(err.msg, bad[i].want) == NULL)
            fail_msg("%s: rc %d, message '%s', want '%s'", bad[i].text, rc, err.msg, bad[i].want);
    }
}

static void limits_hold(void **state)
{
    (void)state;
    got g;
    kgpu_error err;
    /* A label value one byte past the limit, a name past it, too many labels, a long line. */
    size_t big = KGPU_EXPO_LINE_MAX + 100;
    char *text = malloc(big + 64);
    assert_non_null(text);
    char *p = text + sprintf(text, "m{a=\"");
    memset(p, 'v', KGPU_EXPO_VALUE_MAX + 1);
    sprintf(p + KGPU_EXPO_VALUE_MAX + 1, "\"} 1\n");
    assert_int_equal(parse(text, &g, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "value longer than 256 bytes"));
    p[KGPU_EXPO_VALUE_MAX] = '"'; /* exactly the limit: read */
    sprintf(p + KGPU_EXPO_VALUE_MAX + 1, "} 1\n");
    assert_int_equal(parse(text, &g, &err), 0);
    assert_int_equal(strlen(g.s[0].label[0].value), KGPU_EXPO_VALUE_MAX);

    memset(text, 'n', KGPU_EXPO_NAME_MAX + 1);
    sprintf(text + KGPU_EXPO_NAME_MAX + 1, " 1\n");
    assert_int_equal(parse(text, &g, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "metric name longer than"));

    p = text + sprintf(text, "m{");
    for (int i = 0; i <= KGPU_EXPO_LABELS_MAX; i++)
        p += sprintf(p, "l%d=\"x\",", i);
    sprintf(p, "} 1\n");
    assert_int_equal(parse(text, &g, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "more than 16 labels"));

    sprintf(text, "# ok\n");
    memset(text + 5, '#', big);
    text[5 + big] = '\0';
    assert_int_equal(parse(text, &g, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "m.txt:2: line longer than"));
    free(text);
}

static void nul_byte_and_callback_stop(void **state)
{
    (void)state;
    got g;
    kgpu_error err;
    memset(&g, 0, sizeof(g));
    assert_int_equal(kgpu_expo_parse("m 1\nm\0 2\n", 9, "m.txt", keep, &g, &err), KGPU_EPARSE);
    assert_non_null(strstr(err.msg, "m.txt:2: a NUL byte"));
    assert_int_equal(g.n, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(samples_labels_and_comments),
        cmocka_unit_test(escapes_in_label_values),
        cmocka_unit_test(malformed_lines),
        cmocka_unit_test(limits_hold),
        cmocka_unit_test(nul_byte_and_callback_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
