// A small dependency-free SVG writer for the tuner's report plots (tune.md §6.7): line and
// scatter plots with error bars and reference lines, stacked bars and a heatmap. Output is
// deterministic — the same input gives the same bytes — so the plots can be golden-tested and
// diffed between runs: numbers are written with a fixed number of decimals by std::to_chars
// (locale-free), −0 is written as 0, nothing non-finite is ever written, there are no
// timestamps or ids that vary, and elements follow the input's order.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace pdserve::tune::svg {

// `text` with &, <, >, " and ' replaced by their entities, for text content and attributes.
std::string escape_xml(absl::string_view text);

// `value` in fixed notation with `decimals` digits after the point; −0 (and anything that
// rounds to it) is "0…", a non-finite value is "0" (callers drop non-finite data first; this
// only keeps the file well-formed).
std::string format_number(double value, int decimals = 2);

enum class AxisScale { kLinear, kLog10 };

// An axis's extent rounded out to "nice" ticks: 1, 2 or 5 × 10^k apart on a linear axis, one
// per decade on a log10 axis.
struct Ticks {
  double lo = 0, hi = 1;
  std::vector<double> values;
  int decimals = 0;  // Enough to tell the ticks apart.
};
// Around 5 ticks covering [lo, hi]; a one-point range is widened first. A range that is not
// one (hi < lo, not finite, or lo ≤ 0 on kLog10) gets the default axis, [0, 1] or [1, 10].
Ticks nice_ticks(double lo, double hi, AxisScale scale);

struct Axis {
  std::string label;
  AxisScale scale = AxisScale::kLinear;
};

struct Point {
  double x = 0, y = 0;
  double y_error = 0;  // Half-height of the point's error bar; 0: none.
};

enum class Mark { kLine, kScatter };

// Points that are not finite, or not positive on a log axis, are left out.
struct Series {
  std::string name;  // Legend entry.
  Mark mark = Mark::kLine;
  bool dashed = false;
  std::vector<Point> points;
};

enum class Orientation { kHorizontal, kVertical };

// A labelled line across the plot at y = value (horizontal) or x = value (vertical), e.g. an
// SLO or a λ* marker.
struct ReferenceLine {
  Orientation orientation = Orientation::kHorizontal;
  double value = 0;
  std::string label;
};

struct Plot {
  std::string title;
  Axis x, y;
  std::vector<Series> series;  // Coloured by index from a fixed palette.
  std::vector<ReferenceLine> references;
  int width = 720, height = 440;
};

std::string render(const Plot& plot);

// Bars of stacked segments (the TTFT breakdown: queue, prefill, transfer, hand-off), from 0 up.
struct StackedBars {
  struct Bar {
    std::string label;
    std::vector<double> values;  // One per segment name; missing, negative or non-finite: 0.
  };
  std::string title, y_label;
  std::vector<std::string> segments;  // Legend, bottom segment first.
  std::vector<Bar> bars;
  int value_decimals = 3;  // Of each bar's total, written above it.
  int width = 720, height = 440;
};

std::string render(const StackedBars& chart);

// A grid of cells coloured by value on a light-to-dark scale over the cells that have one
// (e.g. n_p × n_d → goodput/rank); a failed cell (gate failed) is hatched instead.
struct Heatmap {
  struct Cell {
    double value = 0;    // Not finite: no value (grey, "n/a").
    bool failed = false;
    std::string label;   // Written in the cell; empty: the value (or "failed").
  };
  std::string title, x_label, y_label, value_label;
  std::vector<std::string> columns, rows;  // Rows from the top.
  std::vector<std::vector<Cell>> cells;   // [row][column]; missing cells are left blank.
  int value_decimals = 2;
  int width = 720, height = 480;
};

std::string render(const Heatmap& map);

}  // namespace pdserve::tune::svg
