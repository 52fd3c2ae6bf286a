// The pdserve command line: one binary, a subcommand per job.
#include <CLI/CLI.hpp>

#include "common/logging.h"
#include "tools/bench_command.h"
#include "tools/check_command.h"
#include "tools/generate_command.h"
#include "tools/kv_keygen_command.h"
#include "tools/make_model_command.h"
#include "tools/tune_command.h"
#include "tools/up_command.h"

int main(int argc, char** argv) {
  pdserve::init_logging();
  CLI::App app{"pdserve: prefill/decode disaggregated LLM serving"};
  app.require_subcommand(1);
  int exit_code = 0;
  pdserve::tools::add_generate_command(app, &exit_code);
  pdserve::tools::add_make_model_command(app, &exit_code);
  pdserve::tools::add_up_command(app, &exit_code);
  pdserve::tools::add_bench_command(app, &exit_code);
  pdserve::tools::add_check_command(app, &exit_code);
  pdserve::tools::add_kv_keygen_command(app, &exit_code);
  pdserve::tools::add_tune_command(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
