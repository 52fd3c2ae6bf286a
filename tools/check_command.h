// `pdserve check`: a cluster's smoke test from outside, as a deployment's `helm test` runs it
// with nothing but the pdserve image: the router's gRPC health is SERVING, the served model is
// listed (gRPC GetModelInfo and, with --http, GET /v1/models), and a 1-token greedy completion
// comes back over gRPC and, with --http, over POST /v1/completions. With --wait-s it retries
// until the cluster passes or the time is up. Prints one line per check; exit 0 when all pass.
#pragma once

#include <CLI/CLI.hpp>

namespace pdserve::tools {
// Adds the subcommand to `app`; its callback sets `*exit_code`.
void add_check_command(CLI::App& app, int* exit_code);
}  // namespace pdserve::tools
