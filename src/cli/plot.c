/*
 * SVG line charts for `kgpu simulate`: one standalone file per chart, with
 * "nice" 1/2/5 x 10^k ticks, light grid lines, a legend and a fixed
 * colour-blind-friendly palette. Output is deterministic: numbers are
 * printed with fixed precision under the C locale, so a chart can be
 * diffed or checked in as a golden file.
 */
#include "plot.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Layout in viewBox units. The legend sits in the column right of the plot area. */
#define PLOT_W           800
#define PLOT_H           500
#define PLOT_LEFT        72.0
#define PLOT_RIGHT       600.0
#define PLOT_TOP         48.0
#define PLOT_BOTTOM      432.0
#define LEGEND_X         618.0
#define LEGEND_TOP       60.0
#define LEGEND_ROW       18.0
#define LEGEND_MAX_ROWS  24 /* rows that fit above the bottom edge */
#define LEGEND_MAX_CHARS 22 /* code points that fit in the legend column */
#define MAX_TICKS        60 /* guard against absurd ranges; nice steps give ~5-10 */
/* Lines running along the frame (0 %, 100 %) keep their full stroke width. */
#define CLIP_MARGIN 2.0
/* Pixel coordinates are clamped to this so far-away points cannot print 300-digit numbers. */
#define COORD_LIMIT 100000.0

/*
 * Okabe-Ito (without yellow, which vanishes on white) followed by Paul Tol's
 * muted scheme: distinguishable under the common colour-vision deficiencies.
 * Beyond the palette, colours repeat with a dash pattern per cycle.
 */
static const char *const plot_palette[] = {
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9",
    "#000000", "#882255", "#999933", "#332288", "#44AA99", "#AA4499",
};
#define PALETTE_N ((int)(sizeof(plot_palette) / sizeof(plot_palette[0])))
static const char *const plot_dashes[] = {NULL, "8 4", "2 3", "8 3 2 3"};
#define DASHES_N ((int)(sizeof(plot_dashes) / sizeof(plot_dashes[0])))

/* The output stream; the first failure is remembered and later writes are skipped. */
typedef struct svg_out {
    FILE *f;
    bool failed;
    int err_no;
} svg_out;

/* A resolved axis: its range, the tick step and how to print tick values. */
typedef struct plot_axis {
    double lo, hi, step;
    int decimals; /* for "%.*f" */
    bool use_g;   /* magnitudes where fixed notation would be unreadable */
} plot_axis;

static void out(svg_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void out(svg_out *o, const char *fmt, ...)
{
    va_list ap;

    if (o->failed)
        return;
    va_start(ap, fmt);
    if (vfprintf(o->f, fmt, ap) < 0) {
        o->failed = true;
        o->err_no = errno;
    }
    va_end(ap);
}

static void out_bytes(svg_out *o, const char *s, size_t n)
{
    if (o->failed || n == 0)
        return;
    if (fwrite(s, 1, n, o->f) != n) {
        o->failed = true;
        o->err_no = errno;
    }
}

/*
 * Length of the well-formed UTF-8 sequence at s that is also a legal XML 1.0
 * character, or 0 when s starts with anything else (stray bytes, overlong
 * forms, surrogates, control characters), which the caller replaces.
 */
static size_t xml_char_len(const unsigned char *s)
{
    uint32_t cp, min;
    size_t n;

    if (s[0] < 0x80) {
        if (s[0] < 0x20 && s[0] != '\t' && s[0] != '\n' && s[0] != '\r')
            return 0;
        return 1;
    }
    if ((s[0] & 0xE0) == 0xC0) {
        n = 2, cp = s[0] & 0x1F, min = 0x80;
    } else if ((s[0] & 0xF0) == 0xE0) {
        n = 3, cp = s[0] & 0x0F, min = 0x800;
    } else if ((s[0] & 0xF8) == 0xF0) {
        n = 4, cp = s[0] & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) /* also stops at the terminating NUL */
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0xFFFE || cp == 0xFFFF)
        return 0;
    return n;
}

/*
 * Writes s as XML character data, escaping the five specials and replacing
 * anything XML cannot hold with U+FFFD. With max_chars > 0, text longer than
 * that many characters is cut and ends in an ellipsis.
 */
static void out_text(svg_out *o, const char *s, size_t max_chars)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t chars = 0;

    while (*p) {
        size_t n = xml_char_len(p);

        if (max_chars > 0 && chars == max_chars - 1) {
            /* Room for one more: the last character, or the ellipsis if more follow. */
            if (p[n ? n : 1] != '\0') {
                out(o, "&#x2026;");
                return;
            }
        }
        switch (n ? *p : 0) {
        case '&':
            out(o, "&amp;");
            break;
        case '<':
            out(o, "&lt;");
            break;
        case '>':
            out(o, "&gt;");
            break;
        case '"':
            out(o, "&quot;");
            break;
        case '\'':
            out(o, "&apos;");
            break;
        case 0:
            out(o, "&#xFFFD;");
            break;
        default:
            out_bytes(o, (const char *)p, n);
            break;
        }
        p += n ? n : 1;
        chars++;
    }
}

/* Fixed two decimals; tiny values print as 0.00, never -0.00. */
static double coord(double v)
{
    if (v > COORD_LIMIT)
        return COORD_LIMIT;
    if (v < -COORD_LIMIT)
        return -COORD_LIMIT;
    if (fabs(v) < 0.005)
        return 0.0;
    return v;
}

static double map_x(const plot_axis *a, double v)
{
    return coord(PLOT_LEFT + (v - a->lo) / (a->hi - a->lo) * (PLOT_RIGHT - PLOT_LEFT));
}

static double map_y(const plot_axis *a, double v)
{
    return coord(PLOT_BOTTOM - (v - a->lo) / (a->hi - a->lo) * (PLOT_BOTTOM - PLOT_TOP));
}

/* A step of 1, 2 or 5 x 10^k that cuts [lo, hi] into about `target` intervals. */
static void axis_resolve(plot_axis *a, int target)
{
    double span = a->hi - a->lo;
    double raw = span / target;
    double mag = pow(10.0, floor(log10(raw)));
    double f = raw / mag;
    double step = (f < 1.5 ? 1.0 : f < 3.0 ? 2.0 : f < 7.0 ? 5.0 : 10.0) * mag;

    if (!isfinite(step) || step <= 0.0)
        step = span;
    a->step = step;
    a->decimals = step >= 1.0 ? 0 : (int)ceil(-log10(step) - 1e-9);
    a->use_g = a->decimals > 9 || fmax(fabs(a->lo), fabs(a->hi)) >= 1e9;
}

/* Fills ticks with the multiples of the step inside the axis range, lowest first; returns how many.
 */
static int axis_ticks(const plot_axis *a, double *ticks)
{
    double k0 = ceil(a->lo / a->step - 1e-9);
    double k1 = floor(a->hi / a->step + 1e-9);
    int n = 0;

    for (double i = 0; k0 + i <= k1 && n < MAX_TICKS; i++) {
        double v = (k0 + i) * a->step;

        if (fabs(v) < a->step * 1e-9)
            v = 0.0;
        ticks[n++] = v;
    }
    return n;
}

static void out_tick_label(svg_out *o, const plot_axis *a, double v)
{
    if (a->use_g)
        out(o, "%.6g", v);
    else
        out(o, "%.*f", a->decimals, v);
}

static bool point_at(const kgpu_plot_series *s, int i, double *x, double *y)
{
    *x = s->x ? s->x[i] : (double)i;
    *y = s->y[i];
    return isfinite(*x) && isfinite(*y);
}

/*
 * Extent of the finite data points; for y, only points whose x lies within
 * xrange (when given), so a fixed x window auto-ranges to what it shows.
 */
static bool data_extent(const kgpu_plot *plot, bool want_y, const plot_axis *xrange, double *lo,
                        double *hi)
{
    bool any = false;

    for (int si = 0; si < plot->nseries; si++) {
        const kgpu_plot_series *s = &plot->series[si];

        for (int i = 0; i < s->n; i++) {
            double x, y, v;

            if (!point_at(s, i, &x, &y))
                continue;
            if (xrange && (x < xrange->lo || x > xrange->hi))
                continue;
            v = want_y ? y : x;
            if (!any || v < *lo)
                *lo = v;
            if (!any || v > *hi)
                *hi = v;
            any = true;
        }
    }
    return any;
}

/* Picks the axis range: the caller's, or one fitted to the data. */
static int axis_range(const kgpu_plot *plot, bool is_y, const plot_axis *xaxis, plot_axis *a,
                      kgpu_error *err)
{
    double lo = is_y ? plot->ymin : plot->xmin;
    double hi = is_y ? plot->ymax : plot->xmax;
    const char *name = is_y ? "y" : "x";

    if (!isfinite(lo) || !isfinite(hi))
        return kgpu_error_set(err, KGPU_EINVAL, "plot: %s range [%g, %g] is not finite", name, lo,
                              hi);
    if (lo >= hi) {
        double dlo = 0.0, dhi = 0.0, pad;

        if (!data_extent(plot, is_y, xaxis, &dlo, &dhi)) {
            lo = 0.0, hi = 1.0;
        } else {
            /* Padding keeps lines off the frame, but never invents a sign the data lacks. */
            if (dlo == dhi)
                pad = dlo == 0.0 ? 1.0 : fabs(dlo) * 0.1;
            else
                pad = is_y ? (dhi - dlo) * 0.05 : 0.0;
            lo = dlo - pad, hi = dhi + pad;
            if (dlo >= 0.0 && lo < 0.0)
                lo = 0.0;
            if (dhi <= 0.0 && hi > 0.0 && lo < 0.0)
                hi = 0.0;
        }
    }
    if (!isfinite(hi - lo) || !(hi - lo > 0.0))
        return kgpu_error_set(err, KGPU_EINVAL, "plot: %s range [%g, %g] cannot be drawn", name, lo,
                              hi);
    a->lo = lo;
    a->hi = hi;
    return 0;
}

static int plot_check(FILE *f, const kgpu_plot *plot, kgpu_error *err)
{
    if (!f || !plot)
        return kgpu_error_set(err, KGPU_EINVAL, "plot: no %s given", f ? "plot" : "output stream");
    if (plot->nseries < 0 || (plot->nseries > 0 && !plot->series))
        return kgpu_error_set(err, KGPU_EINVAL, "plot: nseries is %d with series %s", plot->nseries,
                              plot->series ? "given" : "NULL");
    for (int i = 0; i < plot->nseries; i++) {
        const kgpu_plot_series *s = &plot->series[i];

        if (s->n < 0)
            return kgpu_error_set(err, KGPU_EINVAL, "plot: series %d has %d points", i + 1, s->n);
        if (s->n > 0 && !s->y)
            return kgpu_error_set(err, KGPU_EINVAL, "plot: series %d has no y values", i + 1);
    }
    return 0;
}

static void out_style(svg_out *o, int i)
{
    const char *dash = plot_dashes[(i / PALETTE_N) % DASHES_N];

    out(o, " stroke=\"%s\"", plot_palette[i % PALETTE_N]);
    if (dash)
        out(o, " stroke-dasharray=\"%s\"", dash);
}

static void out_label(svg_out *o, const kgpu_plot_series *s, int i, size_t max_chars)
{
    if (s->label)
        out_text(o, s->label, max_chars);
    else
        out(o, "series %d", i + 1);
}

/* The lines of one series: a polyline per run of finite points, a dot for a lone point. */
static void out_series(svg_out *o, const kgpu_plot_series *s, int si, const plot_axis *xa,
                       const plot_axis *ya)
{
    out(o, "<g");
    out_style(o, si);
    out(o, ">\n");
    for (int a = 0; a < s->n;) {
        double x, y;
        int b;

        if (!point_at(s, a, &x, &y)) {
            a++;
            continue;
        }
        for (b = a + 1; b < s->n && point_at(s, b, &x, &y); b++)
            ;
        if (b - a == 1) {
            point_at(s, a, &x, &y);
            out(o, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\" stroke=\"none\"/>\n",
                map_x(xa, x), map_y(ya, y), plot_palette[si % PALETTE_N]);
        } else {
            out(o, "<polyline points=\"");
            for (int i = a; i < b; i++) {
                point_at(s, i, &x, &y);
                out(o, "%s%.2f,%.2f", i > a ? " " : "", map_x(xa, x), map_y(ya, y));
            }
            out(o, "\"/>\n");
        }
        a = b;
    }
    out(o, "</g>\n");
}

static void out_legend(svg_out *o, const kgpu_plot *plot)
{
    int rows = plot->nseries;

    if (rows > LEGEND_MAX_ROWS)
        rows = LEGEND_MAX_ROWS - 1; /* the last row says how many are not shown */
    out(o, "<g font-size=\"12\" fill=\"#222222\">\n");
    for (int i = 0; i < rows; i++) {
        double y = LEGEND_TOP + i * LEGEND_ROW;

        out(o,
            "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke-width=\"2.5\" "
            "stroke-linecap=\"round\"",
            LEGEND_X, y, LEGEND_X + 24.0, y);
        out_style(o, i);
        out(o, "/>\n<text x=\"%.2f\" y=\"%.2f\" dy=\"0.35em\">", LEGEND_X + 30.0, y);
        out_label(o, &plot->series[i], i, LEGEND_MAX_CHARS);
        out(o, "</text>\n");
    }
    if (rows < plot->nseries)
        out(o, "<text x=\"%.2f\" y=\"%.2f\" dy=\"0.35em\">+%d more</text>\n", LEGEND_X + 30.0,
            LEGEND_TOP + rows * LEGEND_ROW, plot->nseries - rows);
    out(o, "</g>\n");
}

static void render(svg_out *o, const kgpu_plot *plot, const plot_axis *xa, const plot_axis *ya)
{
    double xt[MAX_TICKS], yt[MAX_TICKS];
    int nx = axis_ticks(xa, xt), ny = axis_ticks(ya, yt);
    double cx = (PLOT_LEFT + PLOT_RIGHT) / 2.0, cy = (PLOT_TOP + PLOT_BOTTOM) / 2.0;

    out(o,
        "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
        "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
        PLOT_W, PLOT_H, PLOT_W, PLOT_H);
    if (plot->title) {
        out(o, "<title>");
        out_text(o, plot->title, 0);
        out(o, "</title>\n");
    }
    out(o,
        "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n"
        "<defs><clipPath id=\"kgpu-plot-area\"><rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
        "height=\"%.2f\"/></clipPath></defs>\n",
        PLOT_W, PLOT_H, PLOT_LEFT - CLIP_MARGIN, PLOT_TOP - CLIP_MARGIN,
        PLOT_RIGHT - PLOT_LEFT + 2 * CLIP_MARGIN, PLOT_BOTTOM - PLOT_TOP + 2 * CLIP_MARGIN);

    /* Grid first, so data draws over it. */
    out(o, "<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n");
    for (int i = 0; i < nx; i++)
        out(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", map_x(xa, xt[i]),
            PLOT_TOP, map_x(xa, xt[i]), PLOT_BOTTOM);
    for (int i = 0; i < ny; i++)
        out(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", PLOT_LEFT,
            map_y(ya, yt[i]), PLOT_RIGHT, map_y(ya, yt[i]));
    out(o, "</g>\n");

    /* Axes and tick marks. */
    out(o,
        "<g stroke=\"#444444\" stroke-width=\"1\">\n"
        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n"
        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n",
        PLOT_LEFT, PLOT_BOTTOM, PLOT_RIGHT, PLOT_BOTTOM, PLOT_LEFT, PLOT_TOP, PLOT_LEFT,
        PLOT_BOTTOM);
    for (int i = 0; i < nx; i++)
        out(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", map_x(xa, xt[i]),
            PLOT_BOTTOM, map_x(xa, xt[i]), PLOT_BOTTOM + 5.0);
    for (int i = 0; i < ny; i++)
        out(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", PLOT_LEFT - 5.0,
            map_y(ya, yt[i]), PLOT_LEFT, map_y(ya, yt[i]));
    out(o, "</g>\n");

    /* Tick labels. */
    out(o, "<g font-size=\"11\" fill=\"#444444\">\n");
    for (int i = 0; i < nx; i++) {
        out(o, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">", map_x(xa, xt[i]),
            PLOT_BOTTOM + 18.0);
        out_tick_label(o, xa, xt[i]);
        out(o, "</text>\n");
    }
    for (int i = 0; i < ny; i++) {
        out(o, "<text x=\"%.2f\" y=\"%.2f\" dy=\"0.35em\" text-anchor=\"end\">", PLOT_LEFT - 8.0,
            map_y(ya, yt[i]));
        out_tick_label(o, ya, yt[i]);
        out(o, "</text>\n");
    }
    out(o, "</g>\n");

    /* Data, clipped to the plot area. */
    out(o, "<g clip-path=\"url(#kgpu-plot-area)\" fill=\"none\" stroke-width=\"2\" "
           "stroke-linejoin=\"round\" stroke-linecap=\"round\">\n");
    for (int i = 0; i < plot->nseries; i++)
        out_series(o, &plot->series[i], i, xa, ya);
    out(o, "</g>\n");

    /* Words: title, axis labels, legend. */
    if (plot->title) {
        out(o,
            "<text x=\"%.2f\" y=\"28.00\" text-anchor=\"middle\" font-size=\"16\" "
            "font-weight=\"bold\" fill=\"#222222\">",
            (double)PLOT_W / 2.0);
        out_text(o, plot->title, 0);
        out(o, "</text>\n");
    }
    if (plot->xlabel) {
        out(o,
            "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" font-size=\"13\" "
            "fill=\"#222222\">",
            cx, PLOT_BOTTOM + 44.0);
        out_text(o, plot->xlabel, 0);
        out(o, "</text>\n");
    }
    if (plot->ylabel) {
        out(o,
            "<text transform=\"translate(20.00,%.2f) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"13\" fill=\"#222222\">",
            cy);
        out_text(o, plot->ylabel, 0);
        out(o, "</text>\n");
    }
    out_legend(o, plot);
    out(o, "</svg>\n");
}

int kgpu_plot_svg(FILE *f, const kgpu_plot *plot, kgpu_error *err)
{
    plot_axis xa = {0}, ya = {0};
    svg_out o = {.f = f};
    locale_t c_locale, saved;
    int rc;

    if ((rc = plot_check(f, plot, err)) < 0)
        return rc;
    if ((rc = axis_range(plot, false, NULL, &xa, err)) < 0)
        return rc;
    if ((rc = axis_range(plot, true, &xa, &ya, err)) < 0)
        return rc;
    axis_resolve(&xa, 7);
    axis_resolve(&ya, 6);

    /* Per-thread switch to the C locale: a decimal comma would corrupt the SVG. */
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (c_locale == (locale_t)0)
        return kgpu_error_set(err, KGPU_ENOMEM, "plot: cannot create the C locale: %s",
                              strerror(errno));
    saved = uselocale(c_locale);
    render(&o, plot, &xa, &ya);
    uselocale(saved);
    freelocale(c_locale);

    if (!o.failed && fflush(f) != 0) {
        o.failed = true;
        o.err_no = errno;
    }
    if (o.failed || ferror(f))
        return kgpu_error_set(err, KGPU_EIO, "plot: writing the SVG failed: %s",
                              o.err_no ? strerror(o.err_no) : "stream error");
    return 0;
}
