// `pdserve tune --import-profile` on arbitrary bytes: the profile reader (JSON, then the strict
// schema) gives an error or a profile, never a crash; an accepted profile writes back to the
// same profile, and the analytic model runs on it (every TP size aggregated, and each KV pair
// as a 1P+1D topology) without crashing or looping, whatever numbers it holds.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "tune/analytic.h"
#include "tune/profile_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j =
      nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  pdserve::StatusOr<pdserve::tune::Profile> p = pdserve::tune::profile_from_json(j);
  if (!p.ok()) return 0;
  const nlohmann::json again = pdserve::tune::profile_to_json(*p);
  pdserve::StatusOr<pdserve::tune::Profile> q = pdserve::tune::profile_from_json(again);
  if (!q.ok() || pdserve::tune::profile_to_json(*q) != again) __builtin_trap();
  pdserve::tune::Workload w;
  w.input = {pdserve::tune::LengthDist::Kind::kUniform, 16, 512, {}};
  w.output = {pdserve::tune::LengthDist::Kind::kFixed, 32, 32, {}};
  const pdserve::tune::Slo slo;
  for (const auto& [tp, t] : p->by_tp) {
    pdserve::tune::Topology agg;
    agg.aggregated = true;
    agg.tp_d = tp;
    (void)pdserve::tune::predict_analytic(*p, agg, w, slo, 1.0);
  }
  for (const pdserve::tune::KvPairProfile& k : p->kv) {
    pdserve::tune::Topology pd;
    pd.n_p = 1;
    pd.tp_p = k.tp_p;
    pd.tp_d = k.tp_d;
    pd.mode = k.mode;
    (void)pdserve::tune::predict_analytic(*p, pd, w, slo, 1.0);
  }
  return 0;
}
