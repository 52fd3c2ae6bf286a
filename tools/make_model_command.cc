#include "tools/make_model_command.h"

#include <iostream>
#include <memory>

#include "absl/strings/str_join.h"
#include "engine/model/make_model.h"

namespace pdserve::tools {

void add_make_model_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<engine::MakeModelOptions>();
  auto dtype = std::make_shared<std::string>("f32");
  CLI::App* cmd = app.add_subcommand("make-model", "Write a synthetic model or export a llama2.c checkpoint");
  cmd->add_option("--preset", opts->preset,
                  "Shape: " + absl::StrJoin(engine::make_model_presets(), ", "));
  cmd->add_option("--seed", opts->seed, "Random seed")->capture_default_str();
  cmd->add_option("--out", opts->out_dir, "Output directory")->required();
  cmd->add_option("--from", opts->from, "llama2.c checkpoint to export instead of a preset");
  cmd->add_option("--dtype", *dtype, "f32, bf16 or f16")->check(CLI::IsMember({"f32", "bf16", "f16"}))->capture_default_str();
  cmd->callback([opts, dtype, exit_code] {
    opts->dtype = *engine::dtype_from_name(*dtype);  // Checked by the flag.
    Status s = engine::make_model(*opts);
    if (!s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      *exit_code = 1;
      return;
    }
    std::cerr << "wrote " << opts->out_dir << "\n";
  });
}

}  // namespace pdserve::tools
