#include "tune/profile_io.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/str_join.h"

namespace pdserve::tune {
namespace {

using nlohmann::json;

// One JSON object being read, with its path from the file's root ("tp[1].decode.lo") so that
// every error names the exact key.
class ObjectReader {
 public:
  // Refuses a non-object and any key outside `known`: a misspelt key would otherwise be a
  // silently missing one.
  static StatusOr<ObjectReader> open(const json& value, std::string path, std::set<std::string> known) {
    if (!value.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, " must be an object"));
    for (const auto& [key, unused] : value.items())
      if (!known.count(key)) return absl::InvalidArgumentError(absl::StrCat("unknown key ", join(path, key)));
    return ObjectReader(value, std::move(path));
  }

  StatusOr<const json*> get(const std::string& key) const {
    const auto it = value_->find(key);
    if (it == value_->end()) return absl::InvalidArgumentError(absl::StrCat("missing key ", where(key)));
    return &*it;
  }
  StatusOr<ObjectReader> object(const std::string& key, std::set<std::string> known) const {
    PD_ASSIGN_OR_RETURN(const json* v, get(key));
    return open(*v, where(key), std::move(known));
  }
  StatusOr<double> number(const std::string& key, bool non_negative) const {
    PD_ASSIGN_OR_RETURN(const json* v, get(key));
    if (!v->is_number()) return absl::InvalidArgumentError(absl::StrCat(where(key), " must be a number"));
    const double d = v->get<double>();
    if (non_negative && d < 0) return absl::InvalidArgumentError(absl::StrCat(where(key), " must not be negative (got ", d, ")"));
    return d;
  }
  StatusOr<int64_t> integer(const std::string& key, int64_t min) const {
    PD_ASSIGN_OR_RETURN(const json* v, get(key));
    if (!v->is_number_integer()) return absl::InvalidArgumentError(absl::StrCat(where(key), " must be an integer"));
    const int64_t i = v->get<int64_t>();
    if (i < min) return absl::InvalidArgumentError(absl::StrCat(where(key), " must be at least ", min, " (got ", i, ")"));
    return i;
  }
  StatusOr<int> small_integer(const std::string& key, int min) const {
    PD_ASSIGN_OR_RETURN(const int64_t i, integer(key, min));
    if (i > std::numeric_limits<int>::max()) return absl::InvalidArgumentError(absl::StrCat(where(key), " is too large"));
    return static_cast<int>(i);
  }
  StatusOr<std::string> string(const std::string& key) const {
    PD_ASSIGN_OR_RETURN(const json* v, get(key));
    if (!v->is_string()) return absl::InvalidArgumentError(absl::StrCat(where(key), " must be a string"));
    return v->get<std::string>();
  }
  StatusOr<const json*> array(const std::string& key) const {
    PD_ASSIGN_OR_RETURN(const json* v, get(key));
    if (!v->is_array()) return absl::InvalidArgumentError(absl::StrCat(where(key), " must be an array"));
    return v;
  }
  std::string where(const std::string& key) const { return join(path_, key); }

 private:
  ObjectReader(const json& value, std::string path) : value_(&value), path_(std::move(path)) {}
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : absl::StrCat(path, ".", key);
  }
  const json* value_;
  std::string path_;
};

json fit_error_to_json(const FitError& e) {
  return {{"points", e.points}, {"held_out", e.held_out}, {"median_abs_rel", e.median_abs_rel}, {"p90_abs_rel", e.p90_abs_rel}};
}

StatusOr<FitError> fit_error_from(const ObjectReader& parent, const std::string& key) {
  PD_ASSIGN_OR_RETURN(const ObjectReader r, parent.object(key, {"points", "held_out", "median_abs_rel", "p90_abs_rel"}));
  FitError e;
  PD_ASSIGN_OR_RETURN(e.points, r.small_integer("points", 0));
  PD_ASSIGN_OR_RETURN(e.held_out, r.small_integer("held_out", 0));
  PD_ASSIGN_OR_RETURN(e.median_abs_rel, r.number("median_abs_rel", true));
  PD_ASSIGN_OR_RETURN(e.p90_abs_rel, r.number("p90_abs_rel", true));
  return e;
}

// a + b·x + c·x² (prefill) and each decode regime share the three non-negative coefficients:
// the fitter is non-negative least squares, so a negative one means the file was edited wrongly.
json abc_to_json(double a, double b, double c) { return {{"a", a}, {"b", b}, {"c", c}}; }

Status abc_from(const ObjectReader& parent, const std::string& key, double* a, double* b, double* c) {
  PD_ASSIGN_OR_RETURN(const ObjectReader r, parent.object(key, {"a", "b", "c"}));
  PD_ASSIGN_OR_RETURN(*a, r.number("a", true));
  PD_ASSIGN_OR_RETURN(*b, r.number("b", true));
  PD_ASSIGN_OR_RETURN(*c, r.number("c", true));
  return absl::OkStatus();
}

json tp_to_json(const TpProfile& t) {
  const json split = std::isinf(t.decode.split) ? json(nullptr) : json(t.decode.split);
  return {{"tp", t.tp},
          {"prefill", abc_to_json(t.prefill.a, t.prefill.b, t.prefill.c)},
          {"decode",
           {{"lo", abc_to_json(t.decode.lo.a, t.decode.lo.b, t.decode.lo.c)},
            {"hi", abc_to_json(t.decode.hi.a, t.decode.hi.b, t.decode.hi.c)},
            {"split", split}}},
          {"prefill_error", fit_error_to_json(t.prefill_error)},
          {"decode_error", fit_error_to_json(t.decode_error)},
          {"kv_tokens", t.kv_tokens},
          {"block_size", t.block_size},
          {"max_running", t.max_running},
          {"max_batch_tokens", t.max_batch_tokens},
          {"max_context", t.max_context}};
}

StatusOr<TpProfile> tp_from_json(const json& value, const std::string& path) {
  PD_ASSIGN_OR_RETURN(const ObjectReader r,
                      ObjectReader::open(value, path,
                                         {"tp", "prefill", "decode", "prefill_error", "decode_error", "kv_tokens",
                                          "block_size", "max_running", "max_batch_tokens", "max_context"}));
  TpProfile t;
  PD_ASSIGN_OR_RETURN(t.tp, r.small_integer("tp", 1));
  PD_RETURN_IF_ERROR(abc_from(r, "prefill", &t.prefill.a, &t.prefill.b, &t.prefill.c));
  PD_ASSIGN_OR_RETURN(const ObjectReader decode, r.object("decode", {"lo", "hi", "split"}));
  PD_RETURN_IF_ERROR(abc_from(decode, "lo", &t.decode.lo.a, &t.decode.lo.b, &t.decode.lo.c));
  PD_RETURN_IF_ERROR(abc_from(decode, "hi", &t.decode.hi.a, &t.decode.hi.b, &t.decode.hi.c));
  PD_ASSIGN_OR_RETURN(const json* split, decode.get("split"));
  if (split->is_null()) {
    t.decode.split = std::numeric_limits<double>::infinity();
  } else {
    PD_ASSIGN_OR_RETURN(t.decode.split, decode.number("split", true));
  }
  PD_ASSIGN_OR_RETURN(t.prefill_error, fit_error_from(r, "prefill_error"));
  PD_ASSIGN_OR_RETURN(t.decode_error, fit_error_from(r, "decode_error"));
  PD_ASSIGN_OR_RETURN(t.kv_tokens, r.integer("kv_tokens", 1));
  PD_ASSIGN_OR_RETURN(t.block_size, r.small_integer("block_size", 1));
  PD_ASSIGN_OR_RETURN(t.max_running, r.small_integer("max_running", 1));
  PD_ASSIGN_OR_RETURN(t.max_batch_tokens, r.small_integer("max_batch_tokens", 1));
  PD_ASSIGN_OR_RETURN(t.max_context, r.small_integer("max_context", 0));
  return t;
}

json kv_to_json(const KvPairProfile& k) {
  return {{"tp_p", k.tp_p},
          {"tp_d", k.tp_d},
          {"mode", std::string(kv_mode_name(k.mode))},
          {"law", {{"alpha", k.law.alpha}, {"per_token", k.law.per_token}}},
          {"error", fit_error_to_json(k.error)}};
}

StatusOr<KvPairProfile> kv_from_json(const json& value, const std::string& path) {
  PD_ASSIGN_OR_RETURN(const ObjectReader r, ObjectReader::open(value, path, {"tp_p", "tp_d", "mode", "law", "error"}));
  KvPairProfile k;
  PD_ASSIGN_OR_RETURN(k.tp_p, r.small_integer("tp_p", 1));
  PD_ASSIGN_OR_RETURN(k.tp_d, r.small_integer("tp_d", 1));
  PD_ASSIGN_OR_RETURN(const std::string mode, r.string("mode"));
  auto parsed = parse_kv_mode(mode);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(r.where("mode"), ": ", parsed.status().message()));
  k.mode = *parsed;
  PD_ASSIGN_OR_RETURN(const ObjectReader law, r.object("law", {"alpha", "per_token"}));
  PD_ASSIGN_OR_RETURN(k.law.alpha, law.number("alpha", true));
  PD_ASSIGN_OR_RETURN(k.law.per_token, law.number("per_token", true));
  PD_ASSIGN_OR_RETURN(k.error, fit_error_from(r, "error"));
  return k;
}

}  // namespace

absl::string_view device_name(Device device) {
  switch (device) {
    case Device::kCpu: return "cpu";
    case Device::kCuda: return "cuda";
    case Device::kHip: return "hip";
    case Device::kEmulated: return "emulated";
  }
  return "unknown";
}

StatusOr<Device> parse_device(absl::string_view name) {
  for (Device d : {Device::kCpu, Device::kCuda, Device::kHip, Device::kEmulated})
    if (device_name(d) == name) return d;
  return absl::InvalidArgumentError(absl::StrCat("device must be cpu, cuda, hip or emulated, not '", name, "'"));
}

StatusOr<engine::DType> parse_dtype(absl::string_view name) {
  for (engine::DType t : {engine::DType::kF32, engine::DType::kBF16})
    if (engine::dtype_name(t) == name) return t;
  return absl::InvalidArgumentError(absl::StrCat("must be f32 or bf16, not '", name, "'"));
}

StatusOr<engine::GemmPrecision> parse_gemm_precision(absl::string_view name) {
  std::optional<engine::GemmPrecision> p = engine::gemm_precision_from_name(std::string_view(name.data(), name.size()));
  if (!p.has_value()) return absl::InvalidArgumentError(absl::StrCat("must be exact or bf16, not '", name, "'"));
  return *p;
}

Status check_profile_fits(const Profile& p, Device device, engine::DType weight, engine::DType kv,
                          engine::GemmPrecision precision) {
  if (p.device != device)
    return absl::InvalidArgumentError(
        absl::StrCat("the profile was recorded on ", device_name(p.device), ", not --device ", device_name(device)));
  if (p.dtype != weight || p.kv_dtype != kv || p.gemm_precision != precision)
    return absl::InvalidArgumentError(
        absl::StrCat("the profile was recorded with ", engine::dtype_name(p.dtype), " weights and an ",
                     engine::dtype_name(p.kv_dtype), " KV cache (", engine::gemm_precision_name(p.gemm_precision),
                     " GEMMs), not --weight-dtype ", engine::dtype_name(weight), " --kv-dtype ", engine::dtype_name(kv),
                     " --gemm-precision ", engine::gemm_precision_name(precision)));
  return absl::OkStatus();
}

Status check_dtypes_on(Device device, engine::DType weight, engine::DType kv, engine::GemmPrecision precision) {
  if (precision == engine::GemmPrecision::kBf16 && weight != engine::DType::kBF16)
    return absl::InvalidArgumentError(absl::StrCat(
        "GEMM precision bf16 multiplies bf16 activations by bf16 weights, not ", engine::dtype_name(weight)));
  if (device != Device::kCpu) return absl::OkStatus();
  if (weight != engine::DType::kF32)
    return absl::InvalidArgumentError(absl::StrCat("weight dtype ", engine::dtype_name(weight),
                                                   " on device cpu needs GPU workers: CPU workers compute in f32"));
  if (kv != engine::DType::kF32)
    return absl::InvalidArgumentError(absl::StrCat(
        "KV dtype ", engine::dtype_name(kv), " on device cpu needs GPU workers: CPU workers keep an f32 KV cache"));
  return absl::OkStatus();
}

absl::string_view kv_mode_name(KvMode mode) { return mode == KvMode::kPush ? "push" : "pull"; }

StatusOr<KvMode> parse_kv_mode(absl::string_view name) {
  if (name == "push") return KvMode::kPush;
  if (name == "pull") return KvMode::kPull;
  return absl::InvalidArgumentError(absl::StrCat("kv mode must be push or pull, not '", name, "'"));
}

json profile_to_json(const Profile& p) {
  json tps = json::array();
  for (const auto& [tp, t] : p.by_tp) tps.push_back(tp_to_json(t));
  json kv = json::array();
  for (const KvPairProfile& k : p.kv) kv.push_back(kv_to_json(k));
  json j = {{"schema", std::string(kProfileSchema)},
            {"model", p.model},
            {"model_sha256", p.model_sha256},
            {"device", std::string(device_name(p.device))},
            {"device_model", p.device_model},
            {"dtype", engine::dtype_name(p.dtype)},
            {"pdserve_version", p.pdserve_version},
            {"tp", tps},
            {"kv", kv},
            {"router_overhead_s", p.router_overhead_s},
            {"pd_overhead_s", p.pd_overhead_s},
            {"handoff_s", p.handoff_s}};
  // Only when not f32: a reader from before the key reads an f32 profile as it always did, and
  // refuses a bf16 one (an unknown key) rather than plan its KV capacity as f32's.
  if (p.kv_dtype != engine::DType::kF32) j["kv_dtype"] = engine::dtype_name(p.kv_dtype);
  // Likewise only when not exact: an older reader refuses a bf16-precision profile.
  if (p.gemm_precision != engine::GemmPrecision::kExact)
    j["gemm_precision"] = engine::gemm_precision_name(p.gemm_precision);
  return j;
}

StatusOr<Profile> profile_from_json(const json& value) {
  PD_ASSIGN_OR_RETURN(const ObjectReader r,
                      ObjectReader::open(value, "",
                                         {"schema", "note", "model", "model_sha256", "device", "device_model", "dtype",
                                          "kv_dtype", "gemm_precision", "pdserve_version", "tp", "kv",
                                          "router_overhead_s", "pd_overhead_s", "handoff_s"}));
  // The schema first: a file of another version fails on that, not on whichever key moved.
  PD_ASSIGN_OR_RETURN(const std::string schema, r.string("schema"));
  if (schema != kProfileSchema)
    return absl::InvalidArgumentError(
        absl::StrCat("schema is '", schema, "'; this pdserve reads profiles of schema '", kProfileSchema, "'"));
  if (value.contains("note") && !value["note"].is_string()) return absl::InvalidArgumentError("note must be a string");
  Profile p;
  PD_ASSIGN_OR_RETURN(p.model, r.string("model"));
  PD_ASSIGN_OR_RETURN(p.model_sha256, r.string("model_sha256"));
  PD_ASSIGN_OR_RETURN(const std::string device, r.string("device"));
  auto parsed = parse_device(device);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("device: ", parsed.status().message()));
  p.device = *parsed;
  PD_ASSIGN_OR_RETURN(p.device_model, r.string("device_model"));
  auto read_dtype = [&r](const char* key, engine::DType* out) -> Status {
    PD_ASSIGN_OR_RETURN(const std::string name, r.string(key));
    StatusOr<engine::DType> dtype = parse_dtype(name);
    if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat(key, " ", dtype.status().message()));
    *out = *dtype;
    return absl::OkStatus();
  };
  PD_RETURN_IF_ERROR(read_dtype("dtype", &p.dtype));
  // Profiles recorded before the key existed kept an f32 KV cache.
  if (value.contains("kv_dtype")) PD_RETURN_IF_ERROR(read_dtype("kv_dtype", &p.kv_dtype));
  // And with exact GEMMs before that key.
  if (value.contains("gemm_precision")) {
    PD_ASSIGN_OR_RETURN(const std::string name, r.string("gemm_precision"));
    StatusOr<engine::GemmPrecision> precision = parse_gemm_precision(name);
    if (!precision.ok())
      return absl::InvalidArgumentError(absl::StrCat("gemm_precision ", precision.status().message()));
    p.gemm_precision = *precision;
  }
  PD_ASSIGN_OR_RETURN(p.pdserve_version, r.string("pdserve_version"));
  PD_ASSIGN_OR_RETURN(const json* tps, r.array("tp"));
  for (size_t i = 0; i < tps->size(); ++i) {
    PD_ASSIGN_OR_RETURN(TpProfile t, tp_from_json((*tps)[i], absl::StrCat("tp[", i, "]")));
    if (p.by_tp.count(t.tp)) return absl::InvalidArgumentError(absl::StrCat("tp[", i, "].tp ", t.tp, " appears twice"));
    p.by_tp.emplace(t.tp, std::move(t));
  }
  if (p.by_tp.empty()) return absl::InvalidArgumentError("tp must list at least one TP size");
  PD_ASSIGN_OR_RETURN(const json* kv, r.array("kv"));
  std::set<std::tuple<int, int, KvMode>> seen;
  for (size_t i = 0; i < kv->size(); ++i) {
    const std::string path = absl::StrCat("kv[", i, "]");
    PD_ASSIGN_OR_RETURN(KvPairProfile k, kv_from_json((*kv)[i], path));
    // A transfer law between TP sizes that were not profiled could never be used by a plan.
    for (const auto& [key, tp] : {std::pair{"tp_p", k.tp_p}, std::pair{"tp_d", k.tp_d}})
      if (!p.by_tp.count(tp))
        return absl::InvalidArgumentError(absl::StrCat(path, ".", key, " ", tp, " is not a profiled TP size"));
    if (!seen.insert({k.tp_p, k.tp_d, k.mode}).second)
      return absl::InvalidArgumentError(absl::StrCat(path, ": TP ", k.tp_p, " -> ", k.tp_d, " ", kv_mode_name(k.mode),
                                                     " appears twice"));
    p.kv.push_back(std::move(k));
  }
  PD_ASSIGN_OR_RETURN(p.router_overhead_s, r.number("router_overhead_s", false));
  PD_ASSIGN_OR_RETURN(p.pd_overhead_s, r.number("pd_overhead_s", false));
  PD_ASSIGN_OR_RETURN(p.handoff_s, r.number("handoff_s", false));
  return p;
}

StatusOr<Profile> load_profile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read profile ", path));
  std::stringstream text;
  text << in.rdbuf();
  const json value = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("profile ", path, " is not valid JSON"));
  auto profile = profile_from_json(value);
  if (!profile.ok()) return absl::InvalidArgumentError(absl::StrCat("profile ", path, ": ", profile.status().message()));
  return profile;
}

Status save_profile(const std::string& path, const Profile& profile) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << profile_to_json(profile).dump(2) << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write profile ", path));
  return absl::OkStatus();
}

std::string profile_key(const Profile& p) {
  std::vector<int> tps;
  for (const auto& [tp, unused] : p.by_tp) tps.push_back(tp);
  return absl::StrCat("model=", p.model_sha256, " device=", device_name(p.device), " device_model=\"", p.device_model,
                      "\" dtype=", engine::dtype_name(p.dtype), " kv_dtype=", engine::dtype_name(p.kv_dtype),
                      " gemm=", engine::gemm_precision_name(p.gemm_precision), " tp=", absl::StrJoin(tps, ","),
                      " pdserve=", p.pdserve_version);
}

}  // namespace pdserve::tune
