/*
 * Unit tests for the SVG chart writer (src/cli/plot.c). The CLI sources are
 * not linked into unit tests, so the module is compiled in here directly.
 */
#include "../../src/cli/plot.c"

#include <locale.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

/* Renders plot into a heap string (caller frees); returns kgpu_plot_svg's result. */
static int render_to_string(const kgpu_plot *plot, char **out, kgpu_error *err)
{
    size_t len = 0;
    FILE *f = open_memstream(out, &len);
    int rc;

    assert_non_null(f);
    rc = kgpu_plot_svg(f, plot, err);
    assert_int_equal(fclose(f), 0);
    return rc;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;

    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static const double xs[] = {0, 10, 20, 40, 70, 100, 130};
static const double ya[] = {0, 9.5, 19, 38, 66, 88, 90};
static const double yb[] = {0, 10, 20, 40, 69, 93, 95};
static const double yc[] = {0, 8, 17, 35, 60, 80, 85};

static kgpu_plot sample_plot(kgpu_plot_series *s)
{
    s[0] = (kgpu_plot_series){"A&B", xs, ya, 7, NULL};
    s[1] = (kgpu_plot_series){"<FGD>", xs, yb, 7, NULL};
    s[2] = (kgpu_plot_series){"\"Best\" 'Fit'", xs, yc, 7, NULL};
    return (kgpu_plot){.title = "Allocation & arrival",
                       .xlabel = "Arrived GPU demand (% of cluster GPUs)",
                       .ylabel = "GPU allocation (%)",
                       .xmin = 0,
                       .xmax = 130,
                       .ymin = 0,
                       .ymax = 100,
                       .series = s,
                       .nseries = 3};
}

static void test_document_shape(void **state)
{
    kgpu_plot_series s[3];
    kgpu_plot p = sample_plot(s);
    kgpu_error err = {0};
    char *svg = NULL;
    size_t n;

    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_true(strncmp(svg, "<?xml", 5) == 0 || strncmp(svg, "<svg", 4) == 0);
    assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_non_null(strstr(svg, "viewBox=\"0 0 800 500\""));
    assert_non_null(strstr(svg, "font-family=\"sans-serif\""));
    n = strlen(svg);
    while (n > 0 && (svg[n - 1] == '\n' || svg[n - 1] == ' '))
        n--;
    assert_true(n >= 6);
    assert_memory_equal(svg + n - 6, "</svg>", 6);
    /* Nothing fetched from elsewhere. */
    assert_null(strstr(svg, "href"));
    assert_null(strstr(svg, "@import"));
    assert_non_null(strstr(svg, ">GPU allocation (%)</text>"));
    free(svg);
}

static void test_text_is_escaped(void **state)
{
    kgpu_plot_series s[3];
    kgpu_plot p = sample_plot(s);
    kgpu_error err = {0};
    char *svg = NULL;

    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_non_null(strstr(svg, ">A&amp;B</text>"));
    assert_non_null(strstr(svg, ">&lt;FGD&gt;</text>"));
    assert_non_null(strstr(svg, ">&quot;Best&quot; &apos;Fit&apos;</text>"));
    assert_non_null(strstr(svg, "<title>Allocation &amp; arrival</title>"));
    assert_null(strstr(svg, "A&B"));
    assert_null(strstr(svg, "<FGD>"));
    free(svg);
}

static void test_one_polyline_per_series(void **state)
{
    kgpu_plot_series s[3];
    kgpu_plot p = sample_plot(s);
    kgpu_error err = {0};
    char *svg = NULL;

    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_int_equal(count(svg, "<polyline"), 3);
    /* Each series in its own palette colour, legend included. */
    assert_int_equal(count(svg, plot_palette[0]), 2);
    assert_int_equal(count(svg, plot_palette[1]), 2);
    assert_int_equal(count(svg, plot_palette[2]), 2);
    free(svg);

    /* x omitted means x[i] = i: the first point sits on the left axis. */
    s[0].x = NULL;
    p.nseries = 1;
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_non_null(strstr(svg, "<polyline points=\"72.00,432.00 "));
    free(svg);
}

static void test_ticks_are_nice(void **state)
{
    kgpu_plot_series s[3];
    kgpu_plot p = sample_plot(s);
    kgpu_error err = {0};
    char *svg = NULL;
    plot_axis a = {.lo = 0, .hi = 130};
    double t[MAX_TICKS];

    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_non_null(strstr(svg, "text-anchor=\"middle\">0</text>"));
    assert_non_null(strstr(svg, "text-anchor=\"middle\">100</text>"));
    assert_non_null(strstr(svg, "text-anchor=\"end\">100</text>"));
    free(svg);

    axis_resolve(&a, 7);
    assert_true(a.step == 20.0);
    assert_int_equal(axis_ticks(&a, t), 7);
    assert_true(t[0] == 0.0 && t[5] == 100.0 && t[6] == 120.0);

    a = (plot_axis){.lo = 0, .hi = 1};
    axis_resolve(&a, 6);
    assert_true(fabs(a.step - 0.2) < 1e-12);
    assert_int_equal(a.decimals, 1);
    assert_int_equal(axis_ticks(&a, t), 6);

    a = (plot_axis){.lo = -0.3, .hi = 0.07};
    axis_resolve(&a, 6);
    assert_true(fabs(a.step - 0.05) < 1e-12);
    assert_int_equal(a.decimals, 2);
    assert_int_equal(axis_ticks(&a, t), 8); /* -0.30 .. 0.05 */
    assert_true(t[6] == 0.0);               /* exactly zero, never -0 */

    a = (plot_axis){.lo = 3e12, .hi = 9e12};
    axis_resolve(&a, 6);
    assert_true(a.use_g);
}

static void test_deterministic(void **state)
{
    kgpu_plot_series s[3];
    kgpu_plot p = sample_plot(s);
    kgpu_error err = {0};
    char *one = NULL, *two = NULL;

    assert_int_equal(render_to_string(&p, &one, &err), 0);
    assert_int_equal(render_to_string(&p, &two, &err), 0);
    assert_string_equal(one, two);
    free(two);

    /* A decimal-comma locale must not leak into the numbers (when one is installed). */
    if (setlocale(LC_NUMERIC, "de_DE.UTF-8") || setlocale(LC_NUMERIC, "fr_FR.UTF-8")) {
        assert_int_equal(render_to_string(&p, &two, &err), 0);
        setlocale(LC_NUMERIC, "C");
        assert_string_equal(one, two);
        free(two);
    }
    free(one);
}

static void test_nan_breaks_lines(void **state)
{
    const double y1[] = {1, 2, NAN, 4, 5};
    const double y2[] = {1, NAN, 3, 4, INFINITY, 6};
    kgpu_plot_series s[2] = {{"gap", NULL, y1, 5, NULL}, {"lone", NULL, y2, 6, NULL}};
    kgpu_plot p = {.xmin = 0, .xmax = 5, .ymin = 0, .ymax = 0, .series = s, .nseries = 1};
    kgpu_error err = {0};
    char *svg = NULL;

    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_int_equal(count(svg, "<polyline"), 2);
    assert_null(strstr(svg, "nan"));
    assert_null(strstr(svg, "inf"));
    free(svg);

    /* Lone points between gaps are drawn as dots, not dropped. */
    p.series = &s[1];
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_int_equal(count(svg, "<polyline"), 1);
    assert_int_equal(count(svg, "<circle"), 2);
    free(svg);
}

static void test_auto_range(void **state)
{
    const double y[] = {10, 30, 90};
    const double flat[] = {5, 5};
    kgpu_plot_series s = {"auto", NULL, y, 3, NULL};
    kgpu_plot p = {.ymin = 1, .ymax = 1, .series = &s, .nseries = 1};
    kgpu_error err = {0};
    char *svg = NULL;

    /* Padded but not below zero: data 10..90 gives 6..94, ticks 10 apart from 10. */
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_non_null(strstr(svg, "text-anchor=\"end\">20</text>"));
    assert_non_null(strstr(svg, "text-anchor=\"end\">80</text>"));
    assert_null(strstr(svg, "text-anchor=\"end\">-"));
    /* x auto-ranges to the data, 0..2. */
    assert_non_null(strstr(svg, "text-anchor=\"middle\">2.0</text>"));
    free(svg);

    s.y = flat, s.n = 2;
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    free(svg);

    /* No data at all still makes a valid, empty chart. */
    p.nseries = 0;
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_int_equal(count(svg, "<polyline"), 0);
    free(svg);
}

static void test_many_series_and_long_labels(void **state)
{
    kgpu_plot_series s[30];
    char labels[30][16];
    kgpu_plot p = {.xmin = 0, .xmax = 2, .ymin = 0, .ymax = 30, .series = s, .nseries = 30};
    kgpu_error err = {0};
    double y[30][3];
    char *svg = NULL;

    for (int i = 0; i < 30; i++) {
        snprintf(labels[i], sizeof(labels[i]), "policy-%d", i);
        for (int j = 0; j < 3; j++)
            y[i][j] = i + j * 0.1;
        s[i] = (kgpu_plot_series){labels[i], NULL, y[i], 3, NULL};
    }
    s[0].label = "an extremely long policy name that cannot fit";
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_int_equal(count(svg, "<polyline"), 30);
    assert_non_null(strstr(svg, "stroke-dasharray=\"8 4\"")); /* second colour cycle */
    assert_non_null(strstr(svg, "stroke-dasharray=\"2 3\"")); /* third */
    assert_non_null(strstr(svg, ">+7 more</text>"));          /* legend overflow */
    assert_non_null(strstr(svg, ">an extremely long pol&#x2026;</text>"));
    free(svg);
}

static void test_invalid_arguments(void **state)
{
    kgpu_plot_series s[3];
    kgpu_plot p = sample_plot(s), bad;
    kgpu_error err = {0};
    char *svg = NULL;
    FILE *f = open_memstream(&svg, &(size_t){0});

    assert_int_equal(kgpu_plot_svg(NULL, &p, &err), KGPU_EINVAL);
    assert_int_equal(err.code, KGPU_EINVAL);
    assert_int_equal(kgpu_plot_svg(f, NULL, &err), KGPU_EINVAL);
    assert_int_equal(kgpu_plot_svg(f, NULL, NULL), KGPU_EINVAL);

    bad = p, bad.nseries = -1;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    bad = p, bad.series = NULL;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    bad = p, bad.xmin = NAN;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "x range"));
    bad = p, bad.ymax = NAN;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    bad = p, bad.ymax = INFINITY;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    bad = p, bad.xmin = -1e308, bad.xmax = 1e308; /* span overflows */
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);

    s[1].n = -1;
    assert_int_equal(kgpu_plot_svg(f, &p, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "series 2"));
    s[1].n = 7, s[1].y = NULL;
    assert_int_equal(kgpu_plot_svg(f, &p, &err), KGPU_EINVAL);

    /* Nothing was written by the rejected calls. */
    assert_int_equal(fclose(f), 0);
    assert_string_equal(svg, "");
    free(svg);
}

static void test_write_failure(void **state)
{
    kgpu_plot_series s[3];
    kgpu_plot p = sample_plot(s);
    kgpu_error err = {0};
    FILE *f = fopen("/dev/full", "w");

    if (!f) {
        skip();
        return;
    }
    assert_int_equal(kgpu_plot_svg(f, &p, &err), KGPU_EIO);
    assert_int_equal(err.code, KGPU_EIO);
    assert_non_null(strstr(err.msg, "No space left"));
    fclose(f);
}

/* Whether xmllint accepts the chart as well-formed XML. */
static int xmllint_status(const kgpu_plot *p)
{
    kgpu_error err = {0};
    char path[] = "/tmp/kgpu-test-plot-XXXXXX";
    char cmd[128];
    int fd, rc;
    FILE *f;

    fd = mkstemp(path);
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    assert_non_null(f);
    assert_int_equal(kgpu_plot_svg(f, p, &err), 0);
    assert_int_equal(fclose(f), 0);
    snprintf(cmd, sizeof(cmd), "xmllint --noout '%s'", path);
    rc = system(cmd);
    unlink(path);
    return rc;
}

static void test_parses_as_xml(void **state)
{
    const double y[] = {1, 2, 3};
    const int order[] = {1, 0};
    /* Stray bytes, a control character and an overlong '/' must not break well-formedness. */
    kgpu_plot_series s[2] = {{"bad \xff\xfe bytes \x01 \xc0\xaf", NULL, y, 3, NULL},
                             {"caf\xc3\xa9 \xe2\x9c\x93 & <ok>", NULL, y, 3, NULL}};
    kgpu_plot p = {.title = "t<i>tle & \"q\"", .ymin = 0, .ymax = 0, .series = s, .nseries = 2};

    if (system("command -v xmllint >/dev/null 2>&1") != 0) {
        skip();
        return;
    }
    assert_int_equal(xmllint_status(&p), 0);

    /* With the detail panel, a ranked legend, its heading and values that need escaping. */
    s[0].value = "<1> & \xff";
    s[1].value = "2 %";
    p.legend_order = order;
    p.legend_title = "rank & <value>";
    p.zoom_xmin = 0.5, p.zoom_xmax = 2;
    p.zoom_title = "detail <of> & \"this\" \x01";
    assert_int_equal(xmllint_status(&p), 0);
    p.zoom_title = NULL;
    assert_int_equal(xmllint_status(&p), 0);
}

/*
 * The zoom panel's y tick values (the text-anchor="end" labels of the second
 * panel's tick-label group) into t; returns how many.
 */
static int zoom_y_ticks(const char *svg, double *t, int max)
{
    const char *grid = strstr(svg, "<g stroke=\"#e3e3e3\"");
    const char *labels, *end, *p;
    int n = 0;

    grid = grid ? strstr(grid + 1, "<g stroke=\"#e3e3e3\"") : NULL;
    assert_non_null(grid); /* a second panel */
    labels = strstr(grid, "<g font-size=\"11\" fill=\"#444444\">");
    assert_non_null(labels);
    end = strstr(labels, "</g>");
    assert_non_null(end);
    for (p = strstr(labels, "text-anchor=\"end\">"); p && p < end && n < max;
         p = strstr(p + 1, "text-anchor=\"end\">"))
        t[n++] = strtod(p + strlen("text-anchor=\"end\">"), NULL);
    return n;
}

static void test_zoom_panel(void **state)
{
    kgpu_plot_series s[3];
    kgpu_plot p = sample_plot(s);
    kgpu_error err = {0};
    char *svg = NULL, *again = NULL;
    double t[MAX_TICKS];
    int n;

    p.zoom_xmin = 100, p.zoom_xmax = 130;
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_non_null(strstr(svg, "viewBox=\"0 0 800 860\""));
    /* Two panels, each clipped to itself: every series drawn in both. */
    assert_int_equal(count(svg, "<clipPath "), 2);
    assert_int_equal(count(svg, "<clipPath id=\"kgpu-plot-area\">"), 1);
    assert_int_equal(count(svg, "<clipPath id=\"kgpu-plot-zoom\">"), 1);
    assert_int_equal(count(svg, "clip-path=\"url(#kgpu-plot-zoom)\""), 1);
    assert_int_equal(count(svg, "<polyline"), 6);
    assert_int_equal(count(svg, plot_palette[0]), 3); /* two lines and the legend's */
    /* The window is shaded on the main panel, and the detail says what it shows. */
    assert_int_equal(count(svg, "class=\"kgpu-zoom-window\""), 1);
    assert_non_null(strstr(svg, ">detail of the shaded window: x from 100 to 130</text>"));
    /* Axis labels under each panel; the legend stays once, right of the main panel. */
    assert_int_equal(count(svg, ">GPU allocation (%)</text>"), 2);
    assert_int_equal(count(svg, ">A&amp;B</text>"), 1);

    /* y fits the points with 100 <= x <= 130 (80..95), not the whole chart's 0..100. */
    n = zoom_y_ticks(svg, t, MAX_TICKS);
    assert_true(n >= 3);
    for (int i = 0; i < n; i++)
        assert_true(t[i] >= 80.0 - 0.75 && t[i] <= 95.0 + 0.75);

    /* Deterministic with the zoom too. */
    assert_int_equal(render_to_string(&p, &again, &err), 0);
    assert_string_equal(svg, again);
    free(again);
    free(svg);

    /* A y window given is used as is. */
    p.zoom_ymin = 86, p.zoom_ymax = 96;
    p.zoom_title = "policies near the top";
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_non_null(strstr(svg, ">policies near the top</text>"));
    n = zoom_y_ticks(svg, t, MAX_TICKS);
    assert_true(n >= 3);
    for (int i = 0; i < n; i++)
        assert_true(t[i] >= 86.0 && t[i] <= 96.0);
    assert_true(t[0] == 86.0 || t[0] == 88.0);
    free(svg);

    /* 0 and 0 (what existing callers leave) is no zoom: the same document as before. */
    p.zoom_xmin = p.zoom_xmax = 0;
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_non_null(strstr(svg, "viewBox=\"0 0 800 500\""));
    assert_int_equal(count(svg, "<clipPath "), 1);
    assert_int_equal(count(svg, "<polyline"), 3);
    assert_null(strstr(svg, "kgpu-zoom-window"));
    free(svg);
}

static void test_zoom_invalid(void **state)
{
    kgpu_plot_series s[3];
    kgpu_plot p = sample_plot(s), bad;
    kgpu_error err = {0};
    char *svg = NULL;
    FILE *f = open_memstream(&svg, &(size_t){0});

    bad = p, bad.zoom_xmin = NAN, bad.zoom_xmax = 130;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "zoom_xmin is nan, not a finite number"));
    bad = p, bad.zoom_xmin = 90, bad.zoom_xmax = INFINITY;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "zoom_xmax is inf"));
    bad = p, bad.zoom_xmin = 0, bad.zoom_xmax = NAN;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "zoom_xmax"));
    bad = p, bad.zoom_xmin = 130, bad.zoom_xmax = 90;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "zoom_xmin 130 is not below zoom_xmax 90"));
    bad = p, bad.zoom_xmin = 90, bad.zoom_xmax = 90;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "zoom_xmin 90 is not below zoom_xmax 90"));
    bad = p, bad.zoom_xmin = 90, bad.zoom_xmax = 130, bad.zoom_ymax = -INFINITY;
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "zoom_ymax is -inf"));
    bad = p, bad.zoom_xmin = -1e308, bad.zoom_xmax = 1e308; /* span overflows */
    assert_int_equal(kgpu_plot_svg(f, &bad, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "zoom x range"));

    /* Nothing was written by the rejected calls. */
    assert_int_equal(fclose(f), 0);
    assert_string_equal(svg, "");
    free(svg);
}

static void test_legend_ranked_with_values(void **state)
{
    kgpu_plot_series s[3];
    kgpu_plot p = sample_plot(s);
    const int order[] = {1, 0, 2}, repeat[] = {1, 1, 2}, outside[] = {0, 3, 1};
    kgpu_error err = {0};
    char *svg = NULL;
    const char *a, *b, *c, *line;

    s[0].value = "90.00 %", s[1].value = "95.00 %", s[2].value = "85.00 %";
    p.legend_order = order;
    p.legend_title = "at 130 %";
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_non_null(strstr(svg, "font-weight=\"bold\">at 130 %</text>"));
    b = strstr(svg, ">&lt;FGD&gt; 95.00 %</text>");
    a = strstr(svg, ">A&amp;B 90.00 %</text>");
    c = strstr(svg, ">&quot;Best&quot; &apos;Fit&apos; 85.00 %</text>");
    assert_true(b && a && c && b < a && a < c);
    /* A series keeps its colour in whatever row: the first row's line is series 2's. */
    line = strstr(svg, "stroke-linecap=\"round\" stroke=\"");
    assert_non_null(line);
    assert_memory_equal(line + strlen("stroke-linecap=\"round\" stroke=\""), plot_palette[1],
                        strlen(plot_palette[1]));
    /* The heading takes the first row; entries follow one row down. */
    assert_non_null(strstr(svg, "<text x=\"648.00\" y=\"78.00\" dy=\"0.35em\">&lt;FGD&gt;"));
    free(svg);

    /* A long label is cut, never its value. */
    s[1].label = "an extremely long policy name that cannot fit";
    assert_int_equal(render_to_string(&p, &svg, &err), 0);
    assert_non_null(strstr(svg, ">an extremely &#x2026; 95.00 %</text>"));
    free(svg);

    p.legend_order = repeat;
    assert_int_equal(render_to_string(&p, &svg, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "legend_order names series 2 twice"));
    free(svg);
    p.legend_order = outside;
    assert_int_equal(render_to_string(&p, &svg, &err), KGPU_EINVAL);
    assert_non_null(strstr(err.msg, "legend_order[1] is 3"));
    free(svg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_document_shape),
        cmocka_unit_test(test_text_is_escaped),
        cmocka_unit_test(test_one_polyline_per_series),
        cmocka_unit_test(test_ticks_are_nice),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_nan_breaks_lines),
        cmocka_unit_test(test_auto_range),
        cmocka_unit_test(test_many_series_and_long_labels),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_write_failure),
        cmocka_unit_test(test_parses_as_xml),
        cmocka_unit_test(test_zoom_panel),
        cmocka_unit_test(test_zoom_invalid),
        cmocka_unit_test(test_legend_ranked_with_values),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
