// Shared secrets read from files (API keys, the cluster token) and compared without leaking
// their contents through timing. A secret file holds one secret per line; blank lines and
// lines starting with '#' are skipped, and surrounding whitespace (a trailing newline from
// `echo`, a Kubernetes Secret's) is trimmed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve {

// The gRPC metadata key a worker sends its cluster token in (Registry calls).
inline constexpr char kClusterTokenMetadata[] = "x-pdserve-cluster-token";

// The secrets in `path`; InvalidArgument naming the file if it cannot be read or holds none.
StatusOr<std::vector<std::string>> read_secret_file(const std::string& path);
// Whether `a` equals `b`, in time that depends on their lengths only.
bool secret_equal(std::string_view a, std::string_view b);

}  // namespace pdserve
