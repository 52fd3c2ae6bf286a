// An independent, deliberately plain re-implementation of llama2.c's forward pass (one
// sequence, dense KV arrays, no batching, no TP, no paging), reading the checkpoint file with
// its own parser. Tests compare the engine's tokens against it on prompts nobody has seen.
#pragma once

#include <string>
#include <vector>

namespace pdserve::testing {

class ReferenceLlama {
 public:
  // Loads a llama2.c checkpoint; aborts the test binary on a bad file (test-only code).
  explicit ReferenceLlama(const std::string& path);
  // Logits for `token` at position `pos` (positions must be fed in order from 0).
  const std::vector<float>& forward(int token, int pos);
  // Greedy continuation of `prompt` (prompt tokens fed as llama2.c does), stopping at BOS (1)
  // or after `max_new` tokens or at the context end.
  std::vector<int> greedy(const std::vector<int>& prompt, int max_new);
  int seq_len() const { return seq_len_; }

 private:
  int dim_, hidden_, layers_, heads_, kv_heads_, vocab_, seq_len_, head_size_, kv_dim_;
  std::vector<float> file_;
  const float *emb_, *rms_att_, *wq_, *wk_, *wv_, *wo_, *rms_ffn_, *w1_, *w2_, *w3_, *rms_final_, *wcls_;
  std::vector<float> x_, xb_, xb2_, hb_, hb2_, q_, att_, logits_, key_cache_, value_cache_;
};

}  // namespace pdserve::testing
