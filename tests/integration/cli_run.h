/*
 * Shared by the black-box tests of the kgpu binary (test_cli.c,
 * test_cli_churn.c): run `kgpu <args>` from the source tree and capture what
 * it prints, in a scratch folder each test program makes for itself.
 * Header-only; include it once per test program, after cmocka.h.
 */
#ifndef KGPU_TEST_CLI_RUN_H
#define KGPU_TEST_CLI_RUN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "kgpu/policy.h"

/* The scratch folder: set by cli_tmp_make, removed by cli_tmp_remove. */
static char tmp[256];

typedef struct run_result {
    int status; /* exit code, or -1 */
    char *out, *err;
} run_result;

static inline char *slurp(const char *path)
{
    char *buf = NULL;
    size_t len = 0;
    if (kgpu_read_file(path, &buf, &len, NULL) != 0)
        return strdup("");
    char *s = realloc(buf, len + 1);
    s[len] = '\0';
    return s;
}

/* Runs `kgpu <args>` from the source tree, capturing stdout and stderr. Free with run_free. */
static inline run_result run(const char *args)
{
    char cmd[8192], out[300], err[300];
    snprintf(out, sizeof(out), "%s/stdout", tmp);
    snprintf(err, sizeof(err), "%s/stderr", tmp);
    snprintf(cmd, sizeof(cmd), "cd '%s' && '%s' %s >'%s' 2>'%s' </dev/null", KGPU_SOURCE_DIR,
             KGPU_BIN, args, out, err);
    int st = system(cmd);
    run_result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(out), slurp(err)};
    return r;
}

static inline void run_free(run_result *r)
{
    free(r->out);
    free(r->err);
}

/* A fresh /tmp/<name>-XXXXXX as tmp; 0 or -1 (a cmocka group setup's answer). */
static inline int cli_tmp_make(const char *name)
{
    snprintf(tmp, sizeof(tmp), "/tmp/%s-XXXXXX", name);
    return mkdtemp(tmp) == NULL ? -1 : 0;
}

/* Removes tmp and all in it: usable as a cmocka group teardown. */
static inline int cli_tmp_remove(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

#define EXAMPLE "--nodes examples/nodes.csv --pods examples/pods.csv"

/*
 * `kgpu simulate <mode> EXAMPLE --seeds 42 --plot tmp/<svg>`: exits 0, prints
 * a row for every policy and `column` in its header, and writes a
 * well-formed SVG (xmllint where installed) that contains `in_svg`.
 */
static inline void check_table_and_plot(const char *mode, const char *svg, const char *column,
                                        const char *in_svg)
{
    char args[600], path[300];
    snprintf(path, sizeof(path), "%s/%s", tmp, svg);
    snprintf(args, sizeof(args), "simulate %s " EXAMPLE " --seeds 42 --plot '%s'", mode, path);
    run_result r = run(args);
    assert_int_equal(r.status, 0);
    for (const kgpu_policy_ops *const *p = kgpu_policy_list(); *p; p++) {
        char row[64];
        snprintf(row, sizeof(row), "\n%s ", (*p)->name);
        assert_non_null(strstr(r.out, row));
    }
    assert_non_null(strstr(r.out, column));
    char *text = slurp(path);
    assert_non_null(strstr(text, "<svg"));
    assert_non_null(strstr(text, in_svg));
    assert_non_null(strstr(text, "</svg>"));
    if (system("command -v xmllint >/dev/null 2>&1") == 0) {
        char cmd[400];
        snprintf(cmd, sizeof(cmd), "xmllint --noout '%s'", path);
        assert_int_equal(system(cmd), 0);
    }
    free(text);
    run_free(&r);
}

#endif
