#include "kvtransfer/ucx/ucx_resources.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include <ucp/api/ucp.h>

#include "absl/strings/str_cat.h"

namespace pdserve::kvtransfer {

std::vector<UcxResource> parse_ucx_resources(std::string_view context_info) {
  std::vector<UcxResource> out;
  // (Debian's abseil has its own string_view, so the splitting is by hand.)
  size_t start = 0;
  while (start < context_info.size()) {
    size_t end = context_info.find('\n', start);
    if (end == std::string_view::npos) end = context_info.size();
    const std::string_view line = context_info.substr(start, end - start);
    start = end + 1;
    if (line.find("resource ") == std::string_view::npos) continue;
    const size_t dashes = line.find("-- ");
    if (dashes == std::string_view::npos) continue;
    std::string_view name = line.substr(dashes + 3);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.remove_suffix(1);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.front()))) name.remove_prefix(1);
    const size_t slash = name.find('/');
    if (slash == std::string_view::npos || slash == 0) continue;
    out.push_back({std::string(name.substr(0, slash)), std::string(name.substr(slash + 1))});
  }
  return out;
}

bool is_rdma_transport(std::string_view transport) {
  // UD is left out: it has no RDMA read or write, so UCX would emulate RMA over messages.
  for (std::string_view prefix : {"rc", "dc", "srd", "gga"})
    if (transport.substr(0, prefix.size()) == prefix) return true;
  return false;
}

std::string describe_ucx_resources(const std::vector<UcxResource>& resources) {
  std::string out;
  for (const UcxResource& r : resources) out += (out.empty() ? "" : ", ") + r.transport + "/" + r.device;
  return out.empty() ? "none" : out;
}

StatusOr<std::vector<UcxResource>> query_ucx_resources() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return absl::UnavailableError(absl::StrCat("ucp_config_read: ", ucs_status_string(st)));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;  // As kvtransfer's transport asks.
  ucp_context_h context = nullptr;
  st = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (st != UCS_OK) return absl::UnavailableError(absl::StrCat("ucp_init: ", ucs_status_string(st)));
  // UCX lists its resources only as text, into a FILE.
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) {
    ucp_cleanup(context);
    return absl::InternalError("open_memstream failed");
  }
  ucp_context_print_info(context, stream);
  std::fclose(stream);
  ucp_cleanup(context);
  std::unique_ptr<char, decltype(&std::free)> owned(text, &std::free);
  return parse_ucx_resources(std::string_view(text, size));
}

}  // namespace pdserve::kvtransfer
