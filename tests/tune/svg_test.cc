#include "tune/svg.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace pdserve::tune::svg {
namespace {

namespace fs = std::filesystem;

// ---- A small XML well-formedness checker: balanced tags, quoted attributes, no raw '<' or
// stray '&' in text or attribute values, exactly one root element. Returns "" or the problem.

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' || c == '.'; }

// `s[i]` is '&': a known entity must follow.
bool valid_entity(absl::string_view s, size_t i) {
  for (absl::string_view e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
    if (s.substr(i, e.size()) == e) return true;
  return false;
}

std::string check_well_formed(absl::string_view doc) {
  std::vector<std::string> open;
  int roots = 0;
  size_t i = 0;
  if (doc.substr(0, 5) == "<?xml") {
    i = doc.find("?>");
    if (i == absl::string_view::npos) return "unterminated XML declaration";
    i += 2;
  }
  while (i < doc.size()) {
    const char c = doc[i];
    if (c == '&') {
      if (!valid_entity(doc, i)) return absl::StrCat("stray & at ", i);
      ++i;
      continue;
    }
    if (c == '>') return absl::StrCat("raw > at ", i);
    if (c != '<') {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(c))) return absl::StrCat("text outside the root at ", i);
      ++i;
      continue;
    }
    ++i;
    const bool closing = i < doc.size() && doc[i] == '/';
    if (closing) ++i;
    const size_t name_start = i;
    while (i < doc.size() && is_name_char(doc[i])) ++i;
    const std::string name(doc.substr(name_start, i - name_start));
    if (name.empty()) return absl::StrCat("tag without a name at ", name_start);
    if (closing) {
      if (i >= doc.size() || doc[i] != '>') return absl::StrCat("bad closing tag ", name);
      if (open.empty() || open.back() != name) return absl::StrCat("</", name, "> closes ", open.empty() ? "nothing" : open.back());
      open.pop_back();
      ++i;
      continue;
    }
    // Attributes: name="value", separated by whitespace.
    while (true) {
      const size_t before = i;
      while (i < doc.size() && std::isspace(static_cast<unsigned char>(doc[i]))) ++i;
      if (i >= doc.size()) return absl::StrCat("unterminated tag ", name);
      if (doc[i] == '>' || doc.substr(i, 2) == "/>") break;
      if (i == before) return absl::StrCat("attributes of ", name, " not separated at ", i);
      const size_t attr_start = i;
      while (i < doc.size() && is_name_char(doc[i])) ++i;
      if (i == attr_start || i >= doc.size() || doc[i] != '=') return absl::StrCat("bad attribute in ", name, " at ", attr_start);
      ++i;
      if (i >= doc.size() || (doc[i] != '"' && doc[i] != '\'')) return absl::StrCat("unquoted attribute in ", name, " at ", i);
      const char quote = doc[i++];
      while (i < doc.size() && doc[i] != quote) {
        if (doc[i] == '<') return absl::StrCat("raw < in an attribute of ", name);
        if (doc[i] == '&' && !valid_entity(doc, i)) return absl::StrCat("stray & in an attribute of ", name);
        ++i;
      }
      if (i >= doc.size()) return absl::StrCat("unterminated attribute in ", name);
      ++i;
    }
    const bool self_closing = doc[i] == '/';
    i += self_closing ? 2 : 1;
    if (open.empty() && ++roots > 1) return "more than one root element";
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return absl::StrCat("<", open.back(), "> is never closed");
  if (roots != 1) return "no root element";
  return "";
}

TEST(XmlChecker, RejectsMalformedDocuments) {
  const struct {
    const char* doc;
    bool ok;
  } cases[] = {
      {"<a><b x=\"1\"/>t &amp; u</a>", true},
      {"<?xml version=\"1.0\"?>\n<a/>\n", true},
      {"<a><b></a>", false},           // Unbalanced.
      {"<a>", false},                  // Never closed.
      {"<a x=1/>", false},             // Unquoted attribute.
      {"<a x=\"1\"y=\"2\"/>", false},  // Attributes run together.
      {"<a>&</a>", false},             // Stray ampersand.
      {"<a>1 < 2</a>", false},         // Raw '<' in text.
      {"<a>1 > 2</a>", false},         // Raw '>' in text.
      {"<a x=\"<\"/>", false},         // Raw '<' in an attribute.
      {"<a/><b/>", false},             // Two roots.
      {"", false},
  };
  for (const auto& c : cases) EXPECT_EQ(check_well_formed(c.doc).empty(), c.ok) << c.doc << ": " << check_well_formed(c.doc);
}

// ---- Helpers.

TEST(Svg, EscapesXml) {
  EXPECT_EQ(escape_xml("a&b<c>d\"e'f"), "a&amp;b&lt;c&gt;d&quot;e&apos;f");
  EXPECT_EQ(escape_xml("plain λ*"), "plain λ*");
}

TEST(Svg, FormatsNumbersFixedWithoutNegativeZeroOrNonFinite) {
  const struct {
    double value;
    int decimals;
    const char* expected;
  } cases[] = {
      {2.5, 2, "2.50"},         {-1.25, 2, "-1.25"},
      {1e6, 2, "1000000.00"},   {-0.0, 2, "0.00"},
      {-0.001, 2, "0.00"},      {-0.4, 0, "0"},
      {0.125, 3, "0.125"},      {std::nan(""), 2, "0"},
      {std::numeric_limits<double>::infinity(), 2, "0"},
      {-std::numeric_limits<double>::infinity(), 1, "0"},
  };
  for (const auto& c : cases) EXPECT_EQ(format_number(c.value, c.decimals), c.expected) << c.value;
}

TEST(Svg, NiceTicks) {
  const struct {
    double lo, hi;
    AxisScale scale;
    std::vector<double> ticks;
    int decimals;
  } cases[] = {
      {0, 1, AxisScale::kLinear, {0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}, 1},
      {3, 97, AxisScale::kLinear, {0, 20, 40, 60, 80, 100}, 0},
      {0.013, 0.049, AxisScale::kLinear, {0.01, 0.02, 0.03, 0.04, 0.05}, 2},
      {5, 5, AxisScale::kLinear, {4.4, 4.6000000000000005, 4.800000000000001, 5, 5.2, 5.4, 5.6000000000000005}, 1},
      {3, 4000, AxisScale::kLog10, {1, 10, 100, 1000, 10000}, 0},
      {0.02, 0.5, AxisScale::kLog10, {0.01, 0.1, 1}, 2},
      {10, 10, AxisScale::kLog10, {10, 100}, 0},
      {0, 10, AxisScale::kLog10, {1, 10}, 0},  // Not a log range: the default axis.
      {2, 1, AxisScale::kLinear, {0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}, 1},
  };
  for (const auto& c : cases) {
    const Ticks t = nice_ticks(c.lo, c.hi, c.scale);
    EXPECT_EQ(t.values, c.ticks) << c.lo << ".." << c.hi;
    EXPECT_EQ(t.decimals, c.decimals) << c.lo << ".." << c.hi;
    EXPECT_EQ(t.lo, c.ticks.front());
    EXPECT_EQ(t.hi, c.ticks.back());
  }
}

// ---- One chart of each kind, as the report draws them.

Plot ttft_plot() {
  Plot p;
  p.title = "TTFT vs rate: 2P<1D> & push";
  p.x.label = "rate (req/s)";
  p.y.label = "TTFT (s)";
  p.series.push_back({"predicted p50", Mark::kLine, false, {{0.5, 0.12}, {1, 0.15}, {1.5, 0.22}, {2, 0.41}}});
  p.series.push_back({"predicted p90", Mark::kLine, true, {{0.5, 0.2}, {1, 0.26}, {1.5, 0.4}, {2, 0.8}}});
  p.series.push_back({"measured p90", Mark::kScatter, false, {{0.5, 0.21, 0.02}, {1, 0.3, 0.05}, {2, 0.75, 0.1}}});
  p.references.push_back({Orientation::kHorizontal, 0.5, "SLO \"ttft\" 0.5 s"});
  p.references.push_back({Orientation::kVertical, 1.8, "λ* predicted"});
  return p;
}

Plot log_plot() {
  Plot p;
  p.title = "prefill step";
  p.x.label = "Σl (tokens)";
  p.x.scale = AxisScale::kLog10;
  p.y.label = "step (s)";
  p.y.scale = AxisScale::kLog10;
  p.series.push_back({"fit", Mark::kLine, false, {{16, 0.002}, {256, 0.004}, {4096, 0.03}}});
  p.series.push_back({"measured", Mark::kScatter, false, {{16, 0.0021, 0.003}, {256, 0.0039}, {0, 1}, {4096, 0.031}}});
  return p;
}

StackedBars ttft_breakdown() {
  StackedBars b;
  b.title = "TTFT breakdown";
  b.y_label = "seconds";
  b.segments = {"queue", "prefill", "transfer", "hand-off"};
  b.bars = {{"2P1D predicted", {0.05, 0.12, 0.01, 0.004}},
            {"2P1D measured", {0.07, 0.13, 0.012, 0.006}},
            {"agg measured", {0.2, 0.1}}};  // Missing segments are 0.
  return b;
}

Heatmap ratio_heatmap() {
  Heatmap h;
  h.title = "goodput/rank (TP 1→1)";
  h.x_label = "n_d";
  h.y_label = "n_p";
  h.value_label = "req/s/rank";
  h.columns = {"1", "2", "3"};
  h.rows = {"1", "2"};
  h.cells = {{{0.8}, {0.55}, {0.4, true, "gate <fail>"}},
             {{1.1}, {0.0, true}, {std::nan("")}}};
  return h;
}

// Compares with tests/tune/golden/NAME; PDSERVE_UPDATE_GOLDEN=1 rewrites the file instead
// (then review the diff and commit it).
void expect_golden(const std::string& name, const std::string& actual) {
  const char* source = std::getenv("PDSERVE_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "PDSERVE_SOURCE_DIR must name the source tree";
  const fs::path path = fs::path(source) / "tests" / "tune" / "golden" / name;
  const char* update = std::getenv("PDSERVE_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << actual;
    GTEST_SKIP() << "rewrote " << path;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << "missing " << path << " (PDSERVE_UPDATE_GOLDEN=1 writes it)";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(actual, expected.str()) << "differs from " << path << " (PDSERVE_UPDATE_GOLDEN=1 rewrites it)";
}

void expect_clean(const std::string& doc) {
  EXPECT_EQ(check_well_formed(doc), "");
  for (const char* bad : {"nan", "NaN", "inf", "Inf"}) EXPECT_EQ(doc.find(bad), std::string::npos) << bad << " in\n" << doc;
}

TEST(Svg, LinePlotMatchesGolden) {
  const std::string doc = render(ttft_plot());
  expect_clean(doc);
  expect_golden("ttft_vs_rate.svg", doc);
}

TEST(Svg, LogPlotMatchesGolden) {
  const std::string doc = render(log_plot());
  expect_clean(doc);
  expect_golden("profile_prefill.svg", doc);
}

TEST(Svg, StackedBarsMatchGolden) {
  const std::string doc = render(ttft_breakdown());
  expect_clean(doc);
  expect_golden("ttft_breakdown.svg", doc);
}

TEST(Svg, HeatmapMatchesGolden) {
  const std::string doc = render(ratio_heatmap());
  expect_clean(doc);
  expect_golden("ratio_heatmap.svg", doc);
}

TEST(Svg, RendersTheSameBytesTwice) {
  EXPECT_EQ(render(ttft_plot()), render(ttft_plot()));
  EXPECT_EQ(render(ttft_breakdown()), render(ttft_breakdown()));
  EXPECT_EQ(render(ratio_heatmap()), render(ratio_heatmap()));
}

TEST(Svg, EscapesUserText) {
  const std::string doc = render(ttft_plot());
  EXPECT_NE(doc.find("2P&lt;1D&gt; &amp; push"), std::string::npos);
  EXPECT_NE(doc.find("SLO &quot;ttft&quot;"), std::string::npos);
  EXPECT_NE(render(ratio_heatmap()).find("gate &lt;fail&gt;"), std::string::npos);
}

TEST(Svg, HatchesFailedCells) {
  const std::string doc = render(ratio_heatmap());
  size_t hatched = 0;
  for (size_t at = doc.find("fill=\"url(#hatch)\""); at != std::string::npos; at = doc.find("fill=\"url(#hatch)\"", at + 1)) ++hatched;
  EXPECT_EQ(hatched, 3u);  // Two failed cells and the legend's swatch.
  EXPECT_NE(doc.find(">failed</text>"), std::string::npos);  // The unlabelled failed cell.
  EXPECT_NE(doc.find(">n/a</text>"), std::string::npos);     // The cell without a value.
}

TEST(Svg, DegenerateInputHasNoNonFiniteNumbers) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  Plot empty;
  expect_clean(render(empty));
  Plot empty_series;
  empty_series.series.push_back({"none", Mark::kLine, false, {}});
  empty_series.series.push_back({"not finite", Mark::kScatter, false, {{nan, 1}, {1, inf}, {2, 3, nan}}});
  empty_series.references.push_back({Orientation::kHorizontal, nan, "not finite SLO"});
  expect_clean(render(empty_series));
  Plot single;
  single.series.push_back({"one", Mark::kLine, false, {{1, 1}}});
  single.y.scale = AxisScale::kLog10;
  single.series.push_back({"non-positive", Mark::kScatter, false, {{1, 0}, {2, -1}}});
  expect_clean(render(single));
  expect_clean(render(StackedBars{}));
  StackedBars zero;
  zero.segments = {"a"};
  zero.bars = {{"x", {nan}}, {"y", {-inf}}};
  expect_clean(render(zero));
  expect_clean(render(Heatmap{}));
  Heatmap all_failed;
  all_failed.rows = {"1"};
  all_failed.columns = {"1", "2"};
  all_failed.cells = {{{inf, true}, {nan, true}}};
  expect_clean(render(all_failed));
}

}  // namespace
}  // namespace pdserve::tune::svg
