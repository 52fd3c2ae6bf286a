// `pdserve up`: starts a whole cluster on loopback — prefill and decode workers (or aggregated
// workers) and a router in front — waits until each says READY, prints the endpoints, and stops
// every process together: on Ctrl-C/SIGTERM (exit 0), or when any one dies (exit 1).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace pdserve::tools {

// Adds the subcommand to `app`; its callback sets `*exit_code`.
void add_up_command(CLI::App& app, int* exit_code);

// The path of a sibling program `name` of the running binary: beside it (an install), else in
// the build tree's `../<subdir>/` (build/tools/pdserve → build/router/pdserve-router).
std::string sibling_binary(const std::string& self, const std::string& subdir, const std::string& name);

}  // namespace pdserve::tools
