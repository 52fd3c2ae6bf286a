// chat_template_render CASES.json: renders each case of the chat-template oracle test with
// pdserve's Jinja interpreter and prints the results as JSON, for tests/reference/
// chat_template_oracle.py to compare with jinja2's and @huggingface/jinja's.
//   CASES.json: [{"template": "...", "context": {...}, "now": <unix seconds>}, ...]
//   stdout:     [{"ok": true, "text": "..."} | {"ok": false, "error": "..."}, ...]
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/jinja/json_value.h"
#include "engine/jinja/template.h"

namespace {

using nlohmann::ordered_json;
using namespace pdserve;

ordered_json render_case(const ordered_json& c) {
  auto fail = [](const std::string& what) { return ordered_json{{"ok", false}, {"error", what}}; };
  if (!c.contains("template") || !c["template"].is_string() || !c.contains("context") || !c["context"].is_object())
    return fail("a case needs a template string and a context object");
  auto compiled = jinja::Template::compile(c["template"].get<std::string>());
  if (!compiled.ok()) return fail(std::string(compiled.status().message()));
  const jinja::Value context = jinja::from_json(c["context"]);
  jinja::RenderOptions options;
  options.now = std::chrono::system_clock::time_point(std::chrono::seconds(c.value("now", int64_t(0))));
  auto text = compiled->render(context.as_dict(), options);
  if (!text.ok()) return fail(std::string(text.status().message()));
  return ordered_json{{"ok", true}, {"text", *text}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: chat_template_render CASES.json\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::cerr << "chat_template_render: cannot read " << argv[1] << "\n";
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  const ordered_json cases = ordered_json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!cases.is_array()) {
    std::cerr << "chat_template_render: " << argv[1] << " is not a JSON list of cases\n";
    return 2;
  }
  ordered_json out = ordered_json::array();
  for (const ordered_json& c : cases) out.push_back(render_case(c));
  std::cout << out.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << "\n";
  return 0;
}
