// The JSON forms of what the tuner's stages hand each other through --out (plan.json,
// validation.json) and put in report.json: topologies, predictions, candidates, validations.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "tune/search.h"
#include "tune/types.h"
#include "tune/validate.h"

namespace pdserve::tune {

nlohmann::json topology_to_json(const Topology& t);
StatusOr<Topology> topology_from_json(const nlohmann::json& j);
nlohmann::json prediction_to_json(const Prediction& p);
Prediction prediction_from_json(const nlohmann::json& j);
nlohmann::json candidate_to_json(const Candidate& c);
StatusOr<Candidate> candidate_from_json(const nlohmann::json& j);
nlohmann::json validation_to_json(const Validation& v);
StatusOr<Validation> validation_from_json(const nlohmann::json& j);

// Reads a JSON file; NotFound / InvalidArgument naming it.
StatusOr<nlohmann::json> read_json_file(const std::string& path);
// Writes `text` to `path` (whole, or an error naming it).
Status write_text_file(const std::string& path, const std::string& text);

}  // namespace pdserve::tune
