#include "engine/tokenizer/post_processor.h"

#include <nlohmann/json.hpp>

#include "engine/tokenizer/json_fields.h"

namespace pdserve::engine {
namespace {

using json_fields::Json;

// A TemplateProcessing "single" template: SpecialToken items map, through "special_tokens",
// to their ids; the Sequence item (A) marks where the text goes.
Status parse_template(const Json& node, PostProcessor& out) {
  PD_ASSIGN_OR_RETURN(const Json* single, json_fields::array_member(node, "single"));
  PD_ASSIGN_OR_RETURN(const Json* special_tokens, json_fields::member(node, "special_tokens"));
  bool seen_sequence = false;
  for (const Json& item : *single) {
    if (item.is_object() && item.contains("Sequence")) {
      PD_ASSIGN_OR_RETURN(const std::string id, json_fields::string_member(item.at("Sequence"), "id"));
      if (id != "A" || seen_sequence) {
        return absl::InvalidArgumentError("TemplateProcessing single template must hold $A once");
      }
      seen_sequence = true;
      continue;
    }
    PD_ASSIGN_OR_RETURN(const Json* special, json_fields::member(item, "SpecialToken"));
    PD_ASSIGN_OR_RETURN(const std::string name, json_fields::string_member(*special, "id"));
    PD_ASSIGN_OR_RETURN(const Json* entry, json_fields::member(*special_tokens, name));
    PD_ASSIGN_OR_RETURN(const Json* ids, json_fields::array_member(*entry, "ids"));
    for (const Json& id : *ids) {
      PD_ASSIGN_OR_RETURN(const int value, json_fields::token_id(id, "a special token id"));
      (seen_sequence ? out.after : out.before).push_back(value);
    }
  }
  if (!seen_sequence) {
    return absl::InvalidArgumentError("TemplateProcessing single template has no $A");
  }
  return absl::OkStatus();
}

// BertProcessing / RobertaProcessing: "cls": [content, id], "sep": [content, id].
StatusOr<int> pair_id(const Json& node, std::string_view key) {
  PD_ASSIGN_OR_RETURN(const Json* pair, json_fields::array_member(node, key));
  if (pair->size() != 2) return absl::InvalidArgumentError(absl::StrCat("\"", std::string(key), "\" must be [token, id]"));
  return json_fields::token_id((*pair)[1], key);
}

Status parse_into(const Json& node, PostProcessor& out) {
  if (node.is_null()) return absl::OkStatus();
  PD_ASSIGN_OR_RETURN(const std::string type, json_fields::type_of(node, "post_processor"));
  if (type == "Sequence") {
    PD_ASSIGN_OR_RETURN(const Json* children, json_fields::array_member(node, "processors"));
    for (const Json& child : *children) {
      // Each wraps what the previous produced: its "before" goes outside.
      PostProcessor inner;
      PD_RETURN_IF_ERROR(parse_into(child, inner));
      out.before.insert(out.before.begin(), inner.before.begin(), inner.before.end());
      out.after.insert(out.after.end(), inner.after.begin(), inner.after.end());
    }
    return absl::OkStatus();
  }
  if (type == "TemplateProcessing") return parse_template(node, out);
  if (type == "ByteLevel") return absl::OkStatus();  // It only trims offsets.
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    PD_ASSIGN_OR_RETURN(const int cls, pair_id(node, "cls"));
    PD_ASSIGN_OR_RETURN(const int sep, pair_id(node, "sep"));
    out.before.push_back(cls);
    out.after.push_back(sep);
    return absl::OkStatus();
  }
  return json_fields::unsupported("post_processor", type);
}

}  // namespace

StatusOr<PostProcessor> PostProcessor::from_json(const Json& node) {
  PostProcessor processor;
  PD_RETURN_IF_ERROR(parse_into(node, processor));
  return processor;
}

PostProcessor PostProcessor::bos_eos(std::optional<int> bos, std::optional<int> eos) {
  PostProcessor processor;
  if (bos) processor.before.push_back(*bos);
  if (eos) processor.after.push_back(*eos);
  return processor;
}

std::vector<int> PostProcessor::apply(const std::vector<int>& ids) const {
  std::vector<int> out;
  out.reserve(before.size() + ids.size() + after.size());
  out.insert(out.end(), before.begin(), before.end());
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), after.begin(), after.end());
  return out;
}

}  // namespace pdserve::engine
