// `pdserve generate`: runs the engine in process (or asks a router, --router) on one prompt and streams the text, or prints
// one JSON object with --json.
#pragma once

#include <CLI/CLI.hpp>

namespace pdserve::tools {
// Adds the subcommand to `app`; its callback sets `*exit_code`.
void add_generate_command(CLI::App& app, int* exit_code);
}  // namespace pdserve::tools
