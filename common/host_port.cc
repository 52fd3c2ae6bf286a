#include "common/host_port.h"

#include "absl/strings/str_cat.h"

namespace pdserve {

StatusOr<HostPort> split_host_port(std::string_view host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == host_port.size())
    return absl::InvalidArgumentError(absl::StrCat("'", std::string(host_port), "' is not HOST:PORT"));
  std::string_view host = host_port.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return HostPort{std::string(host), std::string(host_port.substr(colon + 1))};
}

std::string bracket_host(std::string_view host) {
  if (host.find(':') != std::string_view::npos && host.front() != '[') return absl::StrCat("[", std::string(host), "]");
  return std::string(host);
}

}  // namespace pdserve
