#include "common/secrets.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"

namespace pdserve {

StatusOr<std::vector<std::string>> read_secret_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read the secret file ", path));
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    const absl::string_view s = absl::StripAsciiWhitespace(line);
    if (s.empty() || s.front() == '#') continue;
    out.emplace_back(s);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("the secret file ", path, " holds no secret"));
  return out;
}

bool secret_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace pdserve
