/*
 * SVG line charts for `kgpu simulate`: one standalone file per chart, with
 * "nice" 1/2/5 x 10^k ticks, light grid lines, a legend and a fixed
 * colour-blind-friendly palette. Output is deterministic: numbers are
 * printed with fixed precision under the C locale, so a chart can be
 * diffed or checked in as a golden file. An optional detail panel below the
 * chart redraws a window of it at its own scale: curves that finish a point
 * apart are one line at the main panel's scale.
 */
#include "plot.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
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
/* The detail panel: below the main one's axis label, the full width (no legend beside it). */
#define ZOOM_H      860
#define ZOOM_LEFT   PLOT_LEFT
#define ZOOM_RIGHT  776.0
#define ZOOM_TOP    530.0
#define ZOOM_BOTTOM 796.0

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

/* One plot area: where it sits in the viewBox, its axes and the id of its clip path. */
typedef struct plot_panel {
    double left, right, top, bottom;
    plot_axis x, y;
    const char *clip_id;
} plot_panel;

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

static double map_x(const plot_panel *p, double v)
{
    return coord(p->left + (v - p->x.lo) / (p->x.hi - p->x.lo) * (p->right - p->left));
}

static double map_y(const plot_panel *p, double v)
{
    return coord(p->bottom - (v - p->y.lo) / (p->y.hi - p->y.lo) * (p->bottom - p->top));
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

/*
 * Picks an axis range: the caller's [lo, hi], or, if lo >= hi, one fitted to
 * the data (for y, the points within xaxis when given). name says which in
 * messages.
 */
static int axis_range(const kgpu_plot *plot, bool is_y, double lo, double hi, const char *name,
                      const plot_axis *xaxis, plot_axis *a, kgpu_error *err)
{
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

static bool zoom_on(const kgpu_plot *plot)
{
    return plot->zoom_xmin != 0.0 || plot->zoom_xmax != 0.0;
}

static int zoom_check(const kgpu_plot *plot, kgpu_error *err)
{
    const double v[] = {plot->zoom_xmin, plot->zoom_xmax, plot->zoom_ymin, plot->zoom_ymax};
    const char *const names[] = {"zoom_xmin", "zoom_xmax", "zoom_ymin", "zoom_ymax"};

    if (!zoom_on(plot))
        return 0;
    for (int i = 0; i < 4; i++)
        if (!isfinite(v[i]))
            return kgpu_error_set(err, KGPU_EINVAL, "plot: %s is %g, not a finite number", names[i],
                                  v[i]);
    if (!(plot->zoom_xmin < plot->zoom_xmax))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "plot: zoom_xmin %g is not below zoom_xmax %g (both 0: no zoom)",
                              plot->zoom_xmin, plot->zoom_xmax);
    return 0;
}

/* legend_order must name each series once: a repeat would leave another out of the legend. */
static int legend_check(const kgpu_plot *plot, kgpu_error *err)
{
    bool *seen;
    int rc = 0;

    if (!plot->legend_order || plot->nseries == 0)
        return 0;
    seen = calloc((size_t)plot->nseries, sizeof(*seen));
    if (!seen)
        return kgpu_error_set(err, KGPU_ENOMEM, "plot: out of memory checking legend_order");
    for (int i = 0; i < plot->nseries && rc == 0; i++) {
        int k = plot->legend_order[i];

        if (k < 0 || k >= plot->nseries)
            rc = kgpu_error_set(err, KGPU_EINVAL,
                                "plot: legend_order[%d] is %d, not a series index below %d", i, k,
                                plot->nseries);
        else if (seen[k])
            rc =
                kgpu_error_set(err, KGPU_EINVAL, "plot: legend_order names series %d twice", k + 1);
        else
            seen[k] = true;
    }
    free(seen);
    return rc;
}

static int plot_check(FILE *f, const kgpu_plot *plot, kgpu_error *err)
{
    int rc;

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
    if ((rc = zoom_check(plot, err)) < 0)
        return rc;
    return legend_check(plot, err);
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
static void out_series(svg_out *o, const kgpu_plot_series *s, int si, const plot_panel *p)
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
                map_x(p, x), map_y(p, y), plot_palette[si % PALETTE_N]);
        } else {
            out(o, "<polyline points=\"");
            for (int i = a; i < b; i++) {
                point_at(s, i, &x, &y);
                out(o, "%s%.2f,%.2f", i > a ? " " : "", map_x(p, x), map_y(p, y));
            }
            out(o, "\"/>\n");
        }
        a = b;
    }
    out(o, "</g>\n");
}

/* Code points in s as out_text writes it (a replaced byte counts as one). */
static size_t text_chars(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t chars = 0;

    while (*p) {
        size_t n = xml_char_len(p);

        p += n ? n : 1;
        chars++;
    }
    return chars;
}

static void out_legend(svg_out *o, const kgpu_plot *plot)
{
    double top = plot->legend_title ? LEGEND_TOP + LEGEND_ROW : LEGEND_TOP;
    int room = plot->legend_title ? LEGEND_MAX_ROWS - 1 : LEGEND_MAX_ROWS;
    int rows = plot->nseries;

    if (rows > room)
        rows = room - 1; /* the last row says how many are not shown */
    out(o, "<g font-size=\"12\" fill=\"#222222\">\n");
    if (plot->legend_title) {
        out(o, "<text x=\"%.2f\" y=\"%.2f\" dy=\"0.35em\" font-weight=\"bold\">", LEGEND_X,
            LEGEND_TOP);
        out_text(o, plot->legend_title, LEGEND_MAX_CHARS);
        out(o, "</text>\n");
    }
    for (int i = 0; i < rows; i++) {
        int si = plot->legend_order ? plot->legend_order[i] : i;
        const kgpu_plot_series *s = &plot->series[si];
        double y = top + i * LEGEND_ROW;
        size_t max_chars = LEGEND_MAX_CHARS;

        out(o,
            "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke-width=\"2.5\" "
            "stroke-linecap=\"round\"",
            LEGEND_X, y, LEGEND_X + 24.0, y);
        out_style(o, si);
        out(o, "/>\n<text x=\"%.2f\" y=\"%.2f\" dy=\"0.35em\">", LEGEND_X + 30.0, y);
        if (s->value) {
            /* The value stays whole; the label gets what is left, a few characters at least. */
            size_t need = text_chars(s->value) + 1;

            max_chars = need + 4 < LEGEND_MAX_CHARS ? LEGEND_MAX_CHARS - need : 4;
        }
        out_label(o, s, si, max_chars);
        if (s->value) {
            out(o, " ");
            out_text(o, s->value, 0);
        }
        out(o, "</text>\n");
    }
    if (rows < plot->nseries)
        out(o, "<text x=\"%.2f\" y=\"%.2f\" dy=\"0.35em\">+%d more</text>\n", LEGEND_X + 30.0,
            top + rows * LEGEND_ROW, plot->nseries - rows);
    out(o, "</g>\n");
}

static void out_clip(svg_out *o, const plot_panel *p)
{
    out(o,
        "<clipPath id=\"%s\"><rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
        "height=\"%.2f\"/></clipPath>",
        p->clip_id, p->left - CLIP_MARGIN, p->top - CLIP_MARGIN,
        p->right - p->left + 2 * CLIP_MARGIN, p->bottom - p->top + 2 * CLIP_MARGIN);
}

/*
 * One panel's grid, axes, ticks and clipped data; with mark, that panel's
 * window is shaded here so the reader sees what the detail panel enlarges.
 */
static void render_panel(svg_out *o, const kgpu_plot *plot, const plot_panel *p,
                         const plot_panel *mark)
{
    double xt[MAX_TICKS], yt[MAX_TICKS];
    int nx = axis_ticks(&p->x, xt), ny = axis_ticks(&p->y, yt);

    /* Grid first, so data draws over it. */
    out(o, "<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n");
    for (int i = 0; i < nx; i++)
        out(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", map_x(p, xt[i]), p->top,
            map_x(p, xt[i]), p->bottom);
    for (int i = 0; i < ny; i++)
        out(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", p->left,
            map_y(p, yt[i]), p->right, map_y(p, yt[i]));
    out(o, "</g>\n");

    if (mark) {
        double x0 = map_x(p, mark->x.lo), x1 = map_x(p, mark->x.hi);
        double y0 = map_y(p, mark->y.hi), y1 = map_y(p, mark->y.lo);

        out(o,
            "<rect class=\"kgpu-zoom-window\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
            "height=\"%.2f\" fill=\"#4d4d4d\" fill-opacity=\"0.10\" stroke=\"#4d4d4d\" "
            "stroke-width=\"1\" stroke-dasharray=\"4 3\" clip-path=\"url(#%s)\"/>\n",
            x0, y0, coord(x1 - x0), coord(y1 - y0), p->clip_id);
    }

    /* Axes and tick marks. */
    out(o,
        "<g stroke=\"#444444\" stroke-width=\"1\">\n"
        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n"
        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n",
        p->left, p->bottom, p->right, p->bottom, p->left, p->top, p->left, p->bottom);
    for (int i = 0; i < nx; i++)
        out(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", map_x(p, xt[i]),
            p->bottom, map_x(p, xt[i]), p->bottom + 5.0);
    for (int i = 0; i < ny; i++)
        out(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", p->left - 5.0,
            map_y(p, yt[i]), p->left, map_y(p, yt[i]));
    out(o, "</g>\n");

    /* Tick labels. */
    out(o, "<g font-size=\"11\" fill=\"#444444\">\n");
    for (int i = 0; i < nx; i++) {
        out(o, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">", map_x(p, xt[i]),
            p->bottom + 18.0);
        out_tick_label(o, &p->x, xt[i]);
        out(o, "</text>\n");
    }
    for (int i = 0; i < ny; i++) {
        out(o, "<text x=\"%.2f\" y=\"%.2f\" dy=\"0.35em\" text-anchor=\"end\">", p->left - 8.0,
            map_y(p, yt[i]));
        out_tick_label(o, &p->y, yt[i]);
        out(o, "</text>\n");
    }
    out(o, "</g>\n");

    /* Data, clipped to the plot area. */
    out(o,
        "<g clip-path=\"url(#%s)\" fill=\"none\" stroke-width=\"2\" "
        "stroke-linejoin=\"round\" stroke-linecap=\"round\">\n",
        p->clip_id);
    for (int i = 0; i < plot->nseries; i++)
        out_series(o, &plot->series[i], i, p);
    out(o, "</g>\n");
}

static void render_axis_labels(svg_out *o, const kgpu_plot *plot, const plot_panel *p)
{
    if (plot->xlabel) {
        out(o,
            "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" font-size=\"13\" "
            "fill=\"#222222\">",
            (p->left + p->right) / 2.0, p->bottom + 44.0);
        out_text(o, plot->xlabel, 0);
        out(o, "</text>\n");
    }
    if (plot->ylabel) {
        out(o,
            "<text transform=\"translate(20.00,%.2f) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"13\" fill=\"#222222\">",
            (p->top + p->bottom) / 2.0);
        out_text(o, plot->ylabel, 0);
        out(o, "</text>\n");
    }
}

/* zoom is NULL without a detail panel. */
static void render(svg_out *o, const kgpu_plot *plot, const plot_panel *main_p,
                   const plot_panel *zoom)
{
    int height = zoom ? ZOOM_H : PLOT_H;

    out(o,
        "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
        "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
        PLOT_W, height, PLOT_W, height);
    if (plot->title) {
        out(o, "<title>");
        out_text(o, plot->title, 0);
        out(o, "</title>\n");
    }
    out(o, "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n<defs>", PLOT_W, height);
    out_clip(o, main_p);
    if (zoom)
        out_clip(o, zoom);
    out(o, "</defs>\n");

    render_panel(o, plot, main_p, zoom);

    /* Words: title, axis labels, legend. */
    if (plot->title) {
        out(o,
            "<text x=\"%.2f\" y=\"28.00\" text-anchor=\"middle\" font-size=\"16\" "
            "font-weight=\"bold\" fill=\"#222222\">",
            (double)PLOT_W / 2.0);
        out_text(o, plot->title, 0);
        out(o, "</text>\n");
    }
    render_axis_labels(o, plot, main_p);
    out_legend(o, plot);

    if (zoom) {
        render_panel(o, plot, zoom, NULL);
        out(o,
            "<text x=\"%.2f\" y=\"%.2f\" font-size=\"13\" font-weight=\"bold\" "
            "fill=\"#222222\">",
            zoom->left, zoom->top - 14.0);
        if (plot->zoom_title) {
            out_text(o, plot->zoom_title, 0);
        } else {
            out(o, "detail of the shaded window: x from ");
            out_tick_label(o, &zoom->x, zoom->x.lo);
            out(o, " to ");
            out_tick_label(o, &zoom->x, zoom->x.hi);
        }
        out(o, "</text>\n");
        render_axis_labels(o, plot, zoom);
    }
    out(o, "</svg>\n");
}

int kgpu_plot_svg(FILE *f, const kgpu_plot *plot, kgpu_error *err)
{
    plot_panel main_p = {.left = PLOT_LEFT,
                         .right = PLOT_RIGHT,
                         .top = PLOT_TOP,
                         .bottom = PLOT_BOTTOM,
                         .clip_id = "kgpu-plot-area"};
    plot_panel zoom = {.left = ZOOM_LEFT,
                       .right = ZOOM_RIGHT,
                       .top = ZOOM_TOP,
                       .bottom = ZOOM_BOTTOM,
                       .clip_id = "kgpu-plot-zoom"};
    svg_out o = {.f = f};
    locale_t c_locale, saved;
    int rc;

    if ((rc = plot_check(f, plot, err)) < 0)
        return rc;
    if ((rc = axis_range(plot, false, plot->xmin, plot->xmax, "x", NULL, &main_p.x, err)) < 0)
        return rc;
    if ((rc = axis_range(plot, true, plot->ymin, plot->ymax, "y", &main_p.x, &main_p.y, err)) < 0)
        return rc;
    axis_resolve(&main_p.x, 7);
    axis_resolve(&main_p.y, 6);
    if (zoom_on(plot)) {
        if ((rc = axis_range(plot, false, plot->zoom_xmin, plot->zoom_xmax, "zoom x", NULL, &zoom.x,
                             err)) < 0)
            return rc;
        if ((rc = axis_range(plot, true, plot->zoom_ymin, plot->zoom_ymax, "zoom y", &zoom.x,
                             &zoom.y, err)) < 0)
            return rc;
        /* A wider, shorter panel than the main one: more x ticks, fewer y ticks. */
        axis_resolve(&zoom.x, 9);
        axis_resolve(&zoom.y, 5);
    }

    /* Per-thread switch to the C locale: a decimal comma would corrupt the SVG. */
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (c_locale == (locale_t)0)
        return kgpu_error_set(err, KGPU_ENOMEM, "plot: cannot create the C locale: %s",
                              strerror(errno));
    saved = uselocale(c_locale);
    render(&o, plot, &main_p, zoom_on(plot) ? &zoom : NULL);
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
