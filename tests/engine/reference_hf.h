// An independent, deliberately plain implementation of the Hugging Face Llama-family forward
// pass (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) for tests: one sequence, dense KV,
// no batching, no TP, no paging, arithmetic in double. It reads config.json and
// model.safetensors with its own code and computes the RoPE frequencies itself from
// transformers' formulas (modeling_rope_utils) — never through the engine's rope_scaling — so
// the engine's logits are checked against the model definition, not against themselves.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace pdserve::testing {

class ReferenceHf {
 public:
  // Loads the HF directory `dir` (config.json + model.safetensors, f32 or bf16); aborts the test
  // binary on a file it cannot read or a feature it does not implement (test-only code).
  explicit ReferenceHf(const std::string& dir);
  // The logits after each token of `tokens`, fed from position 0: [tokens.size()][vocab].
  std::vector<std::vector<float>> logits(const std::vector<int>& tokens) const;
  int vocab_size() const { return vocab_; }
  // The per-pair inverse frequencies and the cos/sin scale this reference derived from config.json.
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  double attention_scale() const { return attention_scale_; }

 private:
  const std::vector<double>& tensor(const std::string& name) const;
  std::vector<double> linear(const std::string& weight, const std::vector<double>& x, const std::string& bias = "") const;
  std::vector<double> rms_norm(const std::vector<double>& x, const double* w) const;

  int dim_ = 0, hidden_ = 0, layers_ = 0, heads_ = 0, kv_heads_ = 0, head_dim_ = 0, vocab_ = 0;
  double eps_ = 0;
  bool bias_ = false, qk_norm_ = false, tied_ = false;
  std::vector<double> inv_freq_;
  double attention_scale_ = 1.0;
  std::map<std::string, std::vector<double>> tensors_;
};

}  // namespace pdserve::testing
