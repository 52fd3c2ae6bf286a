// Writes a llama2.c checkpoint of seeded random weights (default: the 85M-parameter shape the
// CPU decode comparison with run.c uses: dim 768, 12 layers, hidden 2048, 12 heads, vocab 512,
// seq 512). Vocab 512 matches stories260K's tok512.bin, so both programs can print its text.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "engine/model/llama2c_checkpoint.h"

int main(int argc, char** argv) {
  pdserve::engine::Llama2cHeader h{768, 2048, 12, 12, 12, 512, 512};
  uint64_t seed = 1;
  std::string out;
  CLI::App app{"write a llama2.c checkpoint with seeded random weights"};
  app.add_option("--dim", h.dim)->capture_default_str();
  app.add_option("--hidden", h.hidden_dim)->capture_default_str();
  app.add_option("--layers", h.n_layers)->capture_default_str();
  app.add_option("--heads", h.n_heads)->capture_default_str();
  app.add_option("--kv-heads", h.n_kv_heads)->capture_default_str();
  app.add_option("--vocab", h.vocab_size, "Negative: an unshared classifier")->capture_default_str();
  app.add_option("--seq", h.seq_len)->capture_default_str();
  app.add_option("--seed", seed)->capture_default_str();
  app.add_option("--out", out, "Checkpoint file")->required();
  CLI11_PARSE(app, argc, argv);
  pdserve::Status s = pdserve::engine::write_random_llama2c_checkpoint(h, seed, out);
  if (!s.ok()) {
    std::fprintf(stderr, "write_llama2c: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
