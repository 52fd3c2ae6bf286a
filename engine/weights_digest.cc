#include "engine/weights_digest.h"

#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace pdserve::engine {

std::array<uint8_t, 32> weights_digest(const WeightSource& weights) {
  constexpr size_t kWhole = 64 << 10, kWindows = 64, kWindow = 1 << 10;
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  auto put_u64 = [&](uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = uint8_t(v >> (8 * i));
    EVP_DigestUpdate(ctx.get(), b, sizeof(b));
  };
  std::vector<std::string> names = weights.names();
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (const std::string& name : names) {
    auto t = weights.tensor(name);
    if (!t.ok()) continue;
    put_u64(name.size());
    EVP_DigestUpdate(ctx.get(), name.data(), name.size());
    put_u64(uint64_t(t->dtype));
    put_u64(t->shape.size());
    for (int64_t d : t->shape) put_u64(uint64_t(d));
    const auto* bytes = static_cast<const uint8_t*>(t->data);
    const size_t size = t->bytes();
    if (size <= kWhole) {
      EVP_DigestUpdate(ctx.get(), bytes, size);
      continue;
    }
    for (size_t w = 0; w < kWindows; ++w) {
      const size_t at = (size - kWindow) * w / (kWindows - 1);
      EVP_DigestUpdate(ctx.get(), bytes + at, kWindow);
    }
  }
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), out.data(), &len);
  return out;
}

}  // namespace pdserve::engine
