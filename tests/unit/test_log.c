/*
 * src/common/log.c: the level filter, the line's form (time, level padded to
 * five, prefix, text) that the node agents' tests grep, and long lines
 * printed whole.
 */
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

/* Runs fn with stderr sent to a temporary file; returns what it printed (malloc'd). */
static char *captured(void (*fn)(void))
{
    fflush(stderr);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), STDERR_FILENO) >= 0);
    fn();
    fflush(stderr);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    long n = ftell(tmp);
    assert_true(n >= 0);
    char *buf = calloc(1, (size_t)n + 1);
    assert_non_null(buf);
    rewind(tmp);
    assert_int_equal(fread(buf, 1, (size_t)n, tmp), (size_t)n);
    fclose(tmp);
    return buf;
}

static void matches(const char *text, const char *pattern)
{
    regex_t re;
    assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NEWLINE), 0);
    int rc = regexec(&re, text, 0, NULL, 0);
    regfree(&re);
    if (rc != 0)
        fail_msg("'%s' does not match %s", text, pattern);
}

static void test_level_parse(void **state)
{
    (void)state;
    kgpu_log_level l;
    assert_int_equal(kgpu_log_level_parse("debug", &l), 0);
    assert_int_equal(l, KGPU_LOG_DEBUG);
    assert_int_equal(kgpu_log_level_parse("warn", &l), 0);
    assert_int_equal(l, KGPU_LOG_WARN);
    assert_int_equal(kgpu_log_level_parse("error", &l), 0);
    assert_int_equal(l, KGPU_LOG_ERROR);
    assert_int_equal(kgpu_log_level_parse("WARN", &l), -1);
    assert_int_equal(kgpu_log_level_parse("", &l), -1);
}

static void log_some(void)
{
    kgpu_log_set_level(KGPU_LOG_INFO);
    kgpu_log(KGPU_LOG_DEBUG, "not shown");
    kgpu_log(KGPU_LOG_INFO, "GPU %d: %s", 0, "healthy");
    kgpu_log(KGPU_LOG_WARN, "careful");
    kgpu_log_set_level(KGPU_LOG_ERROR);
    kgpu_log(KGPU_LOG_WARN, "not shown either");
    kgpu_log(KGPU_LOG_ERROR, "boom");
    kgpu_log_set_level(KGPU_LOG_INFO);
}

static void test_lines(void **state)
{
    (void)state;
    char *out = captured(log_some);
    /* As dp_log printed them: nanoseconds, the level padded to five. */
    matches(out, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{9}Z "
                 "info  GPU 0: healthy\n"
                 "[^ ]+Z warn  careful\n"
                 "[^ ]+Z error boom\n$");
    assert_null(strstr(out, "not shown"));
    free(out);
}

static void log_long(void)
{
    char big[5001];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    kgpu_log(KGPU_LOG_INFO, "<%s>", big);
}

static void test_long_line_whole(void **state)
{
    (void)state;
    char *out = captured(log_long);
    const char *lt = strchr(out, '<');
    assert_non_null(lt);
    assert_int_equal(strlen(lt), 5000 + 3); /* "<", the text, ">" and the newline */
    free(out);
}

static void log_formatted(void)
{
    kgpu_log_set_format(3, "ext: ");
    kgpu_log(KGPU_LOG_INFO, "listening");
    kgpu_log_set_format(9, "");
}

static void test_format(void **state)
{
    (void)state;
    char *out = captured(log_formatted);
    matches(out, "^[0-9-]{10}T[0-9:]{8}\\.[0-9]{3}Z info  ext: listening\n$");
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_level_parse),
        cmocka_unit_test(test_lines),
        cmocka_unit_test(test_long_line_whole),
        cmocka_unit_test(test_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
