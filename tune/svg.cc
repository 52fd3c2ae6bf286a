#include "tune/svg.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pdserve::tune::svg {
namespace {

// Tableau 10: distinct, colour-blind-tolerant series colours, taken by index.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
const char* colour(size_t index) { return kPalette[index % kPaletteSize]; }

// Room around the plotting area for the title, tick labels, axis labels and the legend.
constexpr double kMarginLeft = 72, kMarginRight = 180, kMarginTop = 44, kMarginBottom = 56;
constexpr int kTargetTicks = 5;

std::string num(double v) { return format_number(v); }

// Builds the document: every element on its own line, attributes in a fixed order.
class Writer {
 public:
  Writer(int width, int height) {
    absl::StrAppend(&out_, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"",
                    width, "\" height=\"", height, "\" viewBox=\"0 0 ", width, " ", height,
                    "\" font-family=\"sans-serif\" font-size=\"12\">\n", "<rect x=\"0\" y=\"0\" width=\"", width,
                    "\" height=\"", height, "\" fill=\"white\"/>\n");
  }
  void raw(absl::string_view element) { absl::StrAppend(&out_, element, "\n"); }
  void line(double x1, double y1, double x2, double y2, absl::string_view stroke, double width,
            absl::string_view extra = "") {
    absl::StrAppend(&out_, "<line x1=\"", num(x1), "\" y1=\"", num(y1), "\" x2=\"", num(x2), "\" y2=\"", num(y2),
                    "\" stroke=\"", stroke, "\" stroke-width=\"", num(width), "\"", extra, "/>\n");
  }
  void rect(double x, double y, double w, double h, absl::string_view fill, absl::string_view extra = "") {
    absl::StrAppend(&out_, "<rect x=\"", num(x), "\" y=\"", num(y), "\" width=\"", num(w), "\" height=\"", num(h),
                    "\" fill=\"", fill, "\"", extra, "/>\n");
  }
  void circle(double x, double y, double r, absl::string_view fill) {
    absl::StrAppend(&out_, "<circle cx=\"", num(x), "\" cy=\"", num(y), "\" r=\"", num(r), "\" fill=\"", fill, "\"/>\n");
  }
  // `anchor`: start, middle or end. `extra`: further attributes, already formatted.
  void text(double x, double y, absl::string_view anchor, absl::string_view content, absl::string_view extra = "") {
    absl::StrAppend(&out_, "<text x=\"", num(x), "\" y=\"", num(y), "\" text-anchor=\"", anchor, "\"", extra, ">",
                    escape_xml(content), "</text>\n");
  }
  std::string finish() && {
    out_ += "</svg>\n";
    return std::move(out_);
  }

 private:
  std::string out_;
};

void title(Writer& w, int width, const std::string& text) {
  w.text(width / 2.0, 24, "middle", text, " font-size=\"16\" font-weight=\"bold\"");
}

// A y-axis label, rotated to read bottom-up along the axis.
void y_label(Writer& w, double x, double y, const std::string& text) {
  w.text(x, y, "middle", text, absl::StrCat(" transform=\"rotate(-90 ", num(x), " ", num(y), ")\""));
}

// Maps data values to pixels along one axis.
struct Mapping {
  Ticks ticks;
  AxisScale scale = AxisScale::kLinear;
  double from = 0, to = 1;  // Pixels of ticks.lo and ticks.hi.
  double t(double v) const { return scale == AxisScale::kLog10 ? std::log10(v) : v; }
  double operator()(double v) const { return from + (t(v) - t(ticks.lo)) / (t(ticks.hi) - t(ticks.lo)) * (to - from); }
};

bool drawable(double v, AxisScale scale) { return std::isfinite(v) && (scale == AxisScale::kLinear || v > 0); }

// The extent of the values that can be drawn on `scale`; [0, 1] (log: [1, 10]) without any.
Ticks extent_ticks(const std::vector<double>& values, AxisScale scale) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values)
    if (drawable(v, scale)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (lo > hi) return scale == AxisScale::kLog10 ? nice_ticks(1, 10, scale) : nice_ticks(0, 1, scale);
  return nice_ticks(lo, hi, scale);
}

std::string format_tick(double v, const Ticks& ticks) { return format_number(v, ticks.decimals); }

struct Rgb {
  int r, g, b;
};
// The heatmap's scale, light (low) to dark (high).
constexpr Rgb kLow{247, 251, 255}, kHigh{8, 48, 107};

std::string hex(Rgb c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
  return buf;
}
Rgb blend(double t) {
  t = std::clamp(t, 0.0, 1.0);
  auto mix = [t](int a, int b) { return static_cast<int>(std::lround(a + (b - a) * t)); };
  return Rgb{mix(kLow.r, kHigh.r), mix(kLow.g, kHigh.g), mix(kLow.b, kHigh.b)};
}

}  // namespace

std::string escape_xml(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string format_number(double value, int decimals) {
  if (!std::isfinite(value)) return "0";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::fixed, std::max(decimals, 0));
  if (ec != std::errc()) return "0";  // Beyond 64 characters: no plot coordinate is.
  std::string s(buf, end);
  if (s[0] == '-' && s.find_first_not_of("0.", 1) == std::string::npos) s.erase(0, 1);
  return s;
}

Ticks nice_ticks(double lo, double hi, AxisScale scale) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || hi < lo || (scale == AxisScale::kLog10 && lo <= 0))
    return scale == AxisScale::kLog10 ? nice_ticks(1, 10, scale) : nice_ticks(0, 1, scale);
  Ticks ticks;
  if (scale == AxisScale::kLog10) {
    const int first = static_cast<int>(std::floor(std::log10(lo)));
    int last = static_cast<int>(std::ceil(std::log10(hi)));
    if (last == first) ++last;
    for (int k = first; k <= last; ++k) ticks.values.push_back(std::pow(10.0, k));
    ticks.lo = ticks.values.front();
    ticks.hi = ticks.values.back();
    ticks.decimals = std::max(0, -first);
    return ticks;
  }
  if (hi <= lo) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / kTargetTicks;
  const int exponent = static_cast<int>(std::floor(std::log10(raw)));
  const double magnitude = std::pow(10.0, exponent);
  const double f = raw / magnitude;
  const double nice = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  const int step_exponent = nice == 10 ? exponent + 1 : exponent;
  const double step = (nice == 10 ? 1 : nice) * std::pow(10.0, step_exponent);
  // Ticks as integer multiples of the step, so that rounding does not accumulate.
  const auto first = static_cast<int64_t>(std::floor(lo / step + 1e-9));
  const auto last = static_cast<int64_t>(std::ceil(hi / step - 1e-9));
  for (int64_t i = first; i <= last; ++i) ticks.values.push_back(static_cast<double>(i) * step);
  ticks.lo = ticks.values.front();
  ticks.hi = ticks.values.back();
  ticks.decimals = std::max(0, -step_exponent);
  return ticks;
}

std::string render(const Plot& plot) {
  std::vector<double> xs, ys;
  for (const Series& s : plot.series)
    for (const Point& p : s.points) {
      if (!drawable(p.x, plot.x.scale) || !drawable(p.y, plot.y.scale)) continue;
      xs.push_back(p.x);
      ys.push_back(p.y);
      if (p.y_error > 0) ys.push_back(p.y + p.y_error), ys.push_back(p.y - p.y_error);
    }
  for (const ReferenceLine& r : plot.references)
    (r.orientation == Orientation::kHorizontal ? ys : xs).push_back(r.value);
  const double left = kMarginLeft, right = plot.width - kMarginRight;
  const double top = kMarginTop, bottom = plot.height - kMarginBottom;
  const Mapping mx{extent_ticks(xs, plot.x.scale), plot.x.scale, left, right};
  const Mapping my{extent_ticks(ys, plot.y.scale), plot.y.scale, bottom, top};
  // An error bar's lower end below a log axis's range is clipped to the axis.
  auto y_at = [&](double y) { return std::clamp(my(drawable(y, plot.y.scale) ? y : my.ticks.lo), top, bottom); };

  Writer w(plot.width, plot.height);
  title(w, plot.width, plot.title);
  for (double t : mx.ticks.values) {
    w.line(mx(t), top, mx(t), bottom, "#e0e0e0", 1);
    w.text(mx(t), bottom + 16, "middle", format_tick(t, mx.ticks));
  }
  for (double t : my.ticks.values) {
    w.line(left, my(t), right, my(t), "#e0e0e0", 1);
    w.text(left - 6, my(t) + 4, "end", format_tick(t, my.ticks));
  }
  w.rect(left, top, right - left, bottom - top, "none", " stroke=\"black\" stroke-width=\"1\"");
  w.text((left + right) / 2, plot.height - 16, "middle", plot.x.label);
  y_label(w, 18, (top + bottom) / 2, plot.y.label);

  for (const ReferenceLine& r : plot.references) {
    const bool horizontal = r.orientation == Orientation::kHorizontal;
    if (!drawable(r.value, horizontal ? plot.y.scale : plot.x.scale)) continue;
    if (horizontal) {
      w.line(left, my(r.value), right, my(r.value), "#333333", 1.5, " stroke-dasharray=\"6 4\"");
      w.text(right - 4, my(r.value) - 4, "end", r.label);
    } else {
      w.line(mx(r.value), top, mx(r.value), bottom, "#333333", 1.5, " stroke-dasharray=\"6 4\"");
      w.text(mx(r.value) + 4, top + 14, "start", r.label);
    }
  }

  for (size_t i = 0; i < plot.series.size(); ++i) {
    const Series& s = plot.series[i];
    std::vector<const Point*> points;
    for (const Point& p : s.points)
      if (drawable(p.x, plot.x.scale) && drawable(p.y, plot.y.scale)) points.push_back(&p);
    for (const Point* p : points) {
      if (p->y_error <= 0) continue;
      const double x = mx(p->x), y1 = y_at(p->y - p->y_error), y2 = y_at(p->y + p->y_error);
      w.line(x, y1, x, y2, colour(i), 1);
      w.line(x - 3, y1, x + 3, y1, colour(i), 1);
      w.line(x - 3, y2, x + 3, y2, colour(i), 1);
    }
    if (s.mark == Mark::kLine && points.size() >= 2) {
      std::string coords;
      for (const Point* p : points) absl::StrAppend(&coords, coords.empty() ? "" : " ", num(mx(p->x)), ",", num(my(p->y)));
      w.raw(absl::StrCat("<polyline points=\"", coords, "\" fill=\"none\" stroke=\"", colour(i), "\" stroke-width=\"2\"",
                         s.dashed ? " stroke-dasharray=\"6 4\"" : "", "/>"));
    } else {
      // Scatter points, and a line's single point, which has no segment to draw.
      for (const Point* p : points) w.circle(mx(p->x), my(p->y), 3.5, colour(i));
    }
  }

  for (size_t i = 0; i < plot.series.size(); ++i) {
    const double y = top + 8 + 18.0 * static_cast<double>(i);
    if (plot.series[i].mark == Mark::kLine)
      w.line(right + 12, y, right + 32, y, colour(i), 2, plot.series[i].dashed ? " stroke-dasharray=\"6 4\"" : "");
    else
      w.circle(right + 22, y, 3.5, colour(i));
    w.text(right + 38, y + 4, "start", plot.series[i].name);
  }
  return std::move(w).finish();
}

std::string render(const StackedBars& chart) {
  auto segment_value = [](const StackedBars::Bar& bar, size_t k) {
    const double v = k < bar.values.size() ? bar.values[k] : 0;
    return std::isfinite(v) && v > 0 ? v : 0.0;
  };
  std::vector<double> totals;
  for (const StackedBars::Bar& bar : chart.bars) {
    double total = 0;
    for (size_t k = 0; k < chart.segments.size(); ++k) total += segment_value(bar, k);
    totals.push_back(total);
  }
  const double max_total = totals.empty() ? 0 : *std::max_element(totals.begin(), totals.end());
  const double left = kMarginLeft, right = chart.width - kMarginRight;
  const double top = kMarginTop, bottom = chart.height - kMarginBottom;
  const Mapping my{nice_ticks(0, max_total > 0 ? max_total : 1, AxisScale::kLinear), AxisScale::kLinear, bottom, top};

  Writer w(chart.width, chart.height);
  title(w, chart.width, chart.title);
  for (double t : my.ticks.values) {
    w.line(left, my(t), right, my(t), "#e0e0e0", 1);
    w.text(left - 6, my(t) + 4, "end", format_tick(t, my.ticks));
  }
  y_label(w, 18, (top + bottom) / 2, chart.y_label);
  const double slot = chart.bars.empty() ? 0 : (right - left) / static_cast<double>(chart.bars.size());
  for (size_t b = 0; b < chart.bars.size(); ++b) {
    const double x = left + slot * (static_cast<double>(b) + 0.2), width = slot * 0.6;
    double base = 0;
    for (size_t k = 0; k < chart.segments.size(); ++k) {
      const double v = segment_value(chart.bars[b], k);
      if (v > 0) w.rect(x, my(base + v), width, my(base) - my(base + v), colour(k));
      base += v;
    }
    w.text(x + width / 2, my(totals[b]) - 4, "middle", format_number(totals[b], chart.value_decimals));
    w.text(x + width / 2, bottom + 16, "middle", chart.bars[b].label);
  }
  w.line(left, bottom, right, bottom, "black", 1);
  w.line(left, top, left, bottom, "black", 1);
  for (size_t k = 0; k < chart.segments.size(); ++k) {
    const double y = top + 8 + 18.0 * static_cast<double>(k);
    w.rect(right + 12, y - 6, 12, 12, colour(k));
    w.text(right + 30, y + 4, "start", chart.segments[k]);
  }
  return std::move(w).finish();
}

std::string render(const Heatmap& map) {
  auto cell_at = [&](size_t r, size_t c) -> const Heatmap::Cell* {
    if (r >= map.cells.size() || c >= map.cells[r].size()) return nullptr;
    return &map.cells[r][c];
  };
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (size_t r = 0; r < map.rows.size(); ++r)
    for (size_t c = 0; c < map.columns.size(); ++c)
      if (const Heatmap::Cell* cell = cell_at(r, c); cell && !cell->failed && std::isfinite(cell->value))
        lo = std::min(lo, cell->value), hi = std::max(hi, cell->value);
  const bool any_value = lo <= hi;
  auto scale_position = [&](double v) { return any_value && hi > lo ? (v - lo) / (hi - lo) : 0.5; };

  const double left = kMarginLeft + 40, right = map.width - kMarginRight;
  const double top = kMarginTop, bottom = map.height - kMarginBottom;
  const double columns = static_cast<double>(std::max<size_t>(map.columns.size(), 1));
  const double rows = static_cast<double>(std::max<size_t>(map.rows.size(), 1));
  const double cell_w = (right - left) / columns, cell_h = (bottom - top) / rows;

  Writer w(map.width, map.height);
  w.raw("<defs><pattern id=\"hatch\" width=\"8\" height=\"8\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
        "<rect x=\"0\" y=\"0\" width=\"8\" height=\"8\" fill=\"#f4f4f4\"/>"
        "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"8\" stroke=\"#b03030\" stroke-width=\"3\"/></pattern></defs>");
  title(w, map.width, map.title);
  for (size_t r = 0; r < map.rows.size(); ++r) {
    const double y = top + cell_h * static_cast<double>(r);
    w.text(left - 6, y + cell_h / 2 + 4, "end", map.rows[r]);
    for (size_t c = 0; c < map.columns.size(); ++c) {
      const Heatmap::Cell* cell = cell_at(r, c);
      if (!cell) continue;
      const double x = left + cell_w * static_cast<double>(c);
      const bool has_value = std::isfinite(cell->value);
      const double t = scale_position(cell->value);
      const std::string fill = cell->failed ? "url(#hatch)" : has_value ? hex(blend(t)) : "#dddddd";
      w.rect(x, y, cell_w, cell_h, fill, " stroke=\"white\" stroke-width=\"1\"");
      const std::string label = !cell->label.empty() ? cell->label
                                : cell->failed       ? "failed"
                                : has_value          ? format_number(cell->value, map.value_decimals)
                                                     : "n/a";
      const bool dark = !cell->failed && has_value && t > 0.5;
      w.text(x + cell_w / 2, y + cell_h / 2 + 4, "middle", label, dark ? " fill=\"white\"" : " fill=\"black\"");
    }
  }
  for (size_t c = 0; c < map.columns.size(); ++c)
    w.text(left + cell_w * (static_cast<double>(c) + 0.5), bottom + 16, "middle", map.columns[c]);
  w.text((left + right) / 2, map.height - 16, "middle", map.x_label);
  y_label(w, 18, (top + bottom) / 2, map.y_label);

  // The colour scale: ten steps from the lowest value (bottom) to the highest (top).
  constexpr int kSteps = 10;
  const double bar_x = right + 24, bar_h = (bottom - top) * 0.6;
  for (int s = 0; s < kSteps; ++s) {
    const double y = top + bar_h * (kSteps - 1 - s) / kSteps;
    w.rect(bar_x, y, 16, bar_h / kSteps, hex(blend((s + 0.5) / kSteps)));
  }
  w.text(bar_x + 22, top + 10, "start", any_value ? format_number(hi, map.value_decimals) : "n/a");
  w.text(bar_x + 22, top + bar_h, "start", any_value ? format_number(lo, map.value_decimals) : "n/a");
  w.text(bar_x, top + bar_h + 20, "start", map.value_label);
  w.rect(bar_x, top + bar_h + 32, 16, 16, "url(#hatch)");
  w.text(bar_x + 22, top + bar_h + 44, "start", "gate failed");
  return std::move(w).finish();
}

}  // namespace pdserve::tune::svg
