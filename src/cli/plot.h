/*
 * A small, dependency-free SVG line-chart writer: the picture operators
 * compare placement policies by (GPU allocation % against arrival %).
 * The output is one standalone SVG file any browser opens; no fonts,
 * scripts or images are fetched. Same input gives byte-identical output.
 */
#ifndef KGPU_CLI_PLOT_H
#define KGPU_CLI_PLOT_H

#include <stdio.h>

#include "kgpu/error.h"

/* One line of the chart. All pointers are borrowed for the duration of the call. */
typedef struct kgpu_plot_series {
    const char *label; /* legend text, UTF-8; NULL: "series <i+1>" */
    const double *x;   /* n values; NULL: x[i] = i */
    const double *y;   /* n values; NaN or infinite points break the line */
    int n;
    /*
     * Legend text after the label ("98.01 %"), never cut short: a long label
     * is cut to leave it room. NULL: none.
     */
    const char *value;
} kgpu_plot_series;

/* A chart. Borrowed by kgpu_plot_svg; nothing is retained after it returns. */
typedef struct kgpu_plot {
    const char *title, *xlabel, *ylabel; /* NULL: omitted */
    /*
     * Axis ranges. If ymin >= ymax, y auto-ranges from the data with a little
     * padding (never crossing zero for data on one side of it); likewise, if
     * xmin >= xmax, x auto-ranges to the data's extent. Points outside the
     * ranges are clipped to the plot area.
     */
    double xmin, xmax, ymin, ymax;
    const kgpu_plot_series *series;
    int nseries;
    /*
     * The legend's order: nseries distinct series indices, first row first
     * (e.g. ranked by result). A series keeps its colour whatever its row.
     * NULL: series order.
     */
    const int *legend_order;
    const char *legend_title; /* a heading over the legend (what the values are); NULL: none */
    /*
     * A detail panel below the chart: the same series over x in
     * [zoom_xmin, zoom_xmax], that window shaded on the main panel. Both 0
     * (the default): no detail panel; otherwise both must be finite and
     * zoom_xmin < zoom_xmax. The detail's y range is [zoom_ymin, zoom_ymax],
     * or, if zoom_ymin >= zoom_ymax, fitted to the points inside the x window
     * like the auto y range above. zoom_title heads the panel; NULL: it says
     * which x window it shows.
     */
    double zoom_xmin, zoom_xmax, zoom_ymin, zoom_ymax;
    const char *zoom_title;
} kgpu_plot;

/*
 * Writes a complete standalone SVG document (800x500 viewBox; 800x860 with
 * the detail panel) to f. Returns 0, KGPU_EINVAL for bad arguments (NULL f
 * or plot, n < 0, NULL y with n > 0, NaN or infinite ranges, a zoom window
 * that is empty or not finite, a legend_order that is not a permutation),
 * KGPU_ENOMEM, or KGPU_EIO when writing fails
 * (f is flushed before returning). Numbers are written in the C locale
 * whatever the process locale is. Thread-safe for distinct f.
 */
int kgpu_plot_svg(FILE *f, const kgpu_plot *plot, kgpu_error *err);

#endif
