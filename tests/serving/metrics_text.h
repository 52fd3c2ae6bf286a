// The router's Prometheus exposition as the multi-process tests read it: fetched from its HTTP
// port, and searched by metric name and label text (one parser instead of one per test file).
#pragma once

#include <httplib.h>

#include <optional>
#include <sstream>
#include <string>

namespace pdserve::testing {

// The router's /metrics body; nullopt without an answer.
inline std::optional<std::string> router_metrics_text(int http_port) {
  httplib::Client http("127.0.0.1", http_port);
  auto res = http.Get("/metrics");
  if (!res) return std::nullopt;
  return res->body;
}

// The value of the unlabelled sample `name` in `text`; 0 when absent.
inline double metric_value(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return 0;
}

// The sum of the labelled samples of `name` in `text` whose label set contains `labels`.
inline double metric_sum(const std::string& text, const std::string& name, const std::string& labels = "") {
  std::istringstream in(text);
  double sum = 0;
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name + "{", 0) == 0 && line.find(labels) != std::string::npos)
      sum += std::stod(line.substr(line.rfind(' ') + 1));
  return sum;
}

}  // namespace pdserve::testing
