// SHA-256 (OpenSSL EVP), incrementally for data streamed from the network and for whole
// files, so downloaded model files can be checked against their published digests.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

struct evp_md_ctx_st;

namespace pdserve::engine {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t size);
  // The lowercase hex digest; the hasher cannot be updated afterwards.
  std::string hex_digest();

 private:
  evp_md_ctx_st* ctx_;
};

// The lowercase hex SHA-256 of the file at `path`.
StatusOr<std::string> sha256_file(const std::string& path);

}  // namespace pdserve::engine
