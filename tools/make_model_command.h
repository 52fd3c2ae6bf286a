// `pdserve make-model`: writes a Hugging Face model directory with seeded random weights at a
// named shape, or exports a llama2.c checkpoint (--from) as one.
#pragma once

#include <CLI/CLI.hpp>

namespace pdserve::tools {
// Adds the subcommand to `app`; its callback sets `*exit_code`.
void add_make_model_command(CLI::App& app, int* exit_code);
}  // namespace pdserve::tools
