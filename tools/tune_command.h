// `pdserve tune`: sizes a deployment — profiles the real workers, ranks every prefill:decode
// topology within a rank budget with a queue-aware model and a simulator, gates each measured
// topology on exact tokens, validates the best live, and writes a report, plots, Helm values
// and an up.sh (docs/tune.md). Subcommands run one stage each.
#pragma once

#include <CLI/CLI.hpp>

namespace pdserve::tools {

// Adds the subcommand to `app`; its callback sets `*exit_code`.
void add_tune_command(CLI::App& app, int* exit_code);

}  // namespace pdserve::tools
