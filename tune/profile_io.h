// The profile file (profile.json, schema "pdserve.tune.profile/v1"): a Profile (tune/types.h)
// to and from JSON, so a profile measured once (say on an MI355X lease) plans offline anywhere
// (`pdserve tune --import-profile`). Reading is strict — an unknown device or kv mode, a missing
// key, an unknown key or a negative capacity is an InvalidArgument naming the key — because a
// silently defaulted coefficient would skew every plan made from the file without a trace.
// Also the spellings of Device, DType and KvMode shared by the CLI, the report and the deploy outputs.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "tune/types.h"

namespace pdserve::tune {

inline constexpr absl::string_view kProfileSchema = "pdserve.tune.profile/v1";

// "cpu" | "cuda" | "hip" | "emulated": the workers' --device spelling.
absl::string_view device_name(Device device);
StatusOr<Device> parse_device(absl::string_view name);
// "f32" | "bf16" (engine::dtype_name): the --weight-dtype and --kv-dtype spelling; the tuner
// profiles and plans no other element type. The error names no field: the caller prefixes it.
StatusOr<engine::DType> parse_dtype(absl::string_view name);
// Whether workers on `device` run `weight` GEMM weights and a `kv` KV cache with GEMMs of
// `precision`: CPU workers compute in f32 (--weight-dtype reaches GPU backends only: bf16 there
// would silently be f32) and keep an f32 KV cache; bf16 GEMM precision takes bf16 weights.
Status check_dtypes_on(Device device, engine::DType weight, engine::DType kv,
                       engine::GemmPrecision precision = engine::GemmPrecision::kExact);
// "exact" | "bf16" (engine::gemm_precision_name): the --gemm-precision spelling.
StatusOr<engine::GemmPrecision> parse_gemm_precision(absl::string_view name);
// Whether `profile` measured what a cluster of `device`, `weight`, `kv` and `precision` runs:
// a plan, validation or deployment from a profile of another device, element type or GEMM
// precision would size it wrongly (KV capacity, step times). InvalidArgument naming both.
Status check_profile_fits(const Profile& profile, Device device, engine::DType weight, engine::DType kv,
                          engine::GemmPrecision precision);
// "push" | "pull": the router's and `pdserve up`'s --kv-mode spelling.
absl::string_view kv_mode_name(KvMode mode);
StatusOr<KvMode> parse_kv_mode(absl::string_view name);

// Every field of `profile`, under "schema": kProfileSchema. Decode::split = +inf (one regime)
// is written as null, since JSON has no infinity.
nlohmann::json profile_to_json(const Profile& profile);
// The inverse of profile_to_json. A top-level "note" (free text for whoever reads the file, e.g.
// that a fixture is synthetic) is accepted and not kept.
StatusOr<Profile> profile_from_json(const nlohmann::json& json);

// The file forms. save_profile writes the same bytes for the same profile (keys sorted, indent 2).
StatusOr<Profile> load_profile(const std::string& path);
Status save_profile(const std::string& path, const Profile& profile);

// What the profile was measured on, in one line for the report: model hash, device, device
// model, dtype, the profiled TP sizes and the pdserve version. Two profiles with the same key
// describe the same engine on the same hardware.
std::string profile_key(const Profile& profile);

}  // namespace pdserve::tune
