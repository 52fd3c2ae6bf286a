#include "tests/engine/reference_llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <fstream>

namespace pdserve::testing {
namespace {

void matmul(float* out, const float* x, const float* w, int n, int d) {
  for (int i = 0; i < d; ++i) {
    float v = 0.0f;
    for (int j = 0; j < n; ++j) v += w[i * n + j] * x[j];
    out[i] = v;
  }
}

void rmsnorm(float* o, const float* x, const float* w, int size) {
  float ss = 0.0f;
  for (int j = 0; j < size; ++j) ss += x[j] * x[j];
  ss = 1.0f / std::sqrt(ss / size + 1e-5f);
  for (int j = 0; j < size; ++j) o[j] = w[j] * (ss * x[j]);
}

void softmax(float* x, int size) {
  float mx = x[0];
  for (int i = 1; i < size; ++i) mx = std::max(mx, x[i]);
  float sum = 0.0f;
  for (int i = 0; i < size; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  for (int i = 0; i < size; ++i) x[i] /= sum;
}

}  // namespace

ReferenceLlama::ReferenceLlama(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    std::fprintf(stderr, "reference: cannot open %s\n", path.c_str());
    std::abort();
  }
  const size_t bytes = size_t(in.tellg());
  in.seekg(0);
  file_.resize(bytes / 4);
  in.read(reinterpret_cast<char*>(file_.data()), std::streamsize(bytes));
  const int* h = reinterpret_cast<const int*>(file_.data());
  dim_ = h[0], hidden_ = h[1], layers_ = h[2], heads_ = h[3], kv_heads_ = h[4];
  vocab_ = std::abs(h[5]), seq_len_ = h[6];
  head_size_ = dim_ / heads_;
  kv_dim_ = dim_ * kv_heads_ / heads_;
  const float* p = file_.data() + 7;
  const long L = layers_;
  emb_ = p; p += long(vocab_) * dim_;
  rms_att_ = p; p += L * dim_;
  wq_ = p; p += L * dim_ * dim_;
  wk_ = p; p += L * dim_ * kv_dim_;
  wv_ = p; p += L * dim_ * kv_dim_;
  wo_ = p; p += L * dim_ * dim_;
  rms_ffn_ = p; p += L * dim_;
  w1_ = p; p += L * dim_ * hidden_;
  w2_ = p; p += L * hidden_ * dim_;
  w3_ = p; p += L * dim_ * hidden_;
  rms_final_ = p; p += dim_;
  p += long(seq_len_) * head_size_;  // Legacy RoPE tables.
  wcls_ = h[5] > 0 ? emb_ : p;
  x_.resize(dim_); xb_.resize(dim_); xb2_.resize(dim_); hb_.resize(hidden_); hb2_.resize(hidden_);
  q_.resize(dim_); att_.resize(size_t(heads_) * seq_len_); logits_.resize(vocab_);
  key_cache_.resize(size_t(L) * seq_len_ * kv_dim_);
  value_cache_.resize(size_t(L) * seq_len_ * kv_dim_);
}

const std::vector<float>& ReferenceLlama::forward(int token, int pos) {
  const int kv_mul = heads_ / kv_heads_;
  std::copy_n(emb_ + long(token) * dim_, dim_, x_.data());
  for (int l = 0; l < layers_; ++l) {
    rmsnorm(xb_.data(), x_.data(), rms_att_ + l * dim_, dim_);
    const long loff = long(l) * seq_len_ * kv_dim_;
    float* k = key_cache_.data() + loff + long(pos) * kv_dim_;
    float* v = value_cache_.data() + loff + long(pos) * kv_dim_;
    matmul(q_.data(), xb_.data(), wq_ + long(l) * dim_ * dim_, dim_, dim_);
    matmul(k, xb_.data(), wk_ + long(l) * dim_ * kv_dim_, dim_, kv_dim_);
    matmul(v, xb_.data(), wv_ + long(l) * dim_ * kv_dim_, dim_, kv_dim_);
    for (int i = 0; i < dim_; i += 2) {
      const int head_dim = i % head_size_;
      const float freq = 1.0f / std::pow(10000.0f, head_dim / float(head_size_));
      const float val = pos * freq, fcr = std::cos(val), fci = std::sin(val);
      const int rotn = i < kv_dim_ ? 2 : 1;
      for (int r = 0; r < rotn; ++r) {
        float* vec = r == 0 ? q_.data() : k;
        const float v0 = vec[i], v1 = vec[i + 1];
        vec[i] = v0 * fcr - v1 * fci;
        vec[i + 1] = v0 * fci + v1 * fcr;
      }
    }
    for (int h = 0; h < heads_; ++h) {
      const float* qh = q_.data() + h * head_size_;
      float* att = att_.data() + long(h) * seq_len_;
      for (int t = 0; t <= pos; ++t) {
        const float* kt = key_cache_.data() + loff + long(t) * kv_dim_ + (h / kv_mul) * head_size_;
        float score = 0.0f;
        for (int i = 0; i < head_size_; ++i) score += qh[i] * kt[i];
        att[t] = score / std::sqrt(float(head_size_));
      }
      softmax(att, pos + 1);
      float* xb = xb_.data() + h * head_size_;
      std::fill(xb, xb + head_size_, 0.0f);
      for (int t = 0; t <= pos; ++t) {
        const float* vt = value_cache_.data() + loff + long(t) * kv_dim_ + (h / kv_mul) * head_size_;
        for (int i = 0; i < head_size_; ++i) xb[i] += att[t] * vt[i];
      }
    }
    matmul(xb2_.data(), xb_.data(), wo_ + long(l) * dim_ * dim_, dim_, dim_);
    for (int i = 0; i < dim_; ++i) x_[i] += xb2_[i];
    rmsnorm(xb_.data(), x_.data(), rms_ffn_ + l * dim_, dim_);
    matmul(hb_.data(), xb_.data(), w1_ + long(l) * dim_ * hidden_, dim_, hidden_);
    matmul(hb2_.data(), xb_.data(), w3_ + long(l) * dim_ * hidden_, dim_, hidden_);
    for (int i = 0; i < hidden_; ++i) {
      const float val = hb_[i];
      hb_[i] = val * (1.0f / (1.0f + std::exp(-val))) * hb2_[i];
    }
    matmul(xb_.data(), hb_.data(), w2_ + long(l) * dim_ * hidden_, hidden_, dim_);
    for (int i = 0; i < dim_; ++i) x_[i] += xb_[i];
  }
  rmsnorm(x_.data(), x_.data(), rms_final_, dim_);
  matmul(logits_.data(), x_.data(), wcls_, dim_, vocab_);
  return logits_;
}

std::vector<int> ReferenceLlama::greedy(const std::vector<int>& prompt, int max_new) {
  std::vector<int> out;
  int token = prompt[0];
  for (int pos = 0; pos < seq_len_; ++pos) {
    const std::vector<float>& logits = forward(token, pos);
    if (pos + 1 < int(prompt.size())) {
      token = prompt[pos + 1];
      continue;
    }
    int next = 0;
    for (int i = 1; i < vocab_; ++i)
      if (logits[i] > logits[next]) next = i;
    if (next == 1 || int(out.size()) == max_new) break;
    out.push_back(next);
    token = next;
    if (int(out.size()) == max_new) break;
  }
  return out;
}

}  // namespace pdserve::testing
