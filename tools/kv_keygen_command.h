// `pdserve kv-keygen`: a new cluster key for the kvtransfer control channel (a CURVE secret key
// in Z85), printed or written to a file only its owner can read; every prefill and decode worker
// of the cluster gets the same file (--kv-key-file).
#pragma once

#include <CLI/CLI.hpp>

namespace pdserve::tools {
// Adds the subcommand to `app`; its callback sets `*exit_code`.
void add_kv_keygen_command(CLI::App& app, int* exit_code);
}  // namespace pdserve::tools
