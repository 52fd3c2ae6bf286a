#include "tools/check_command.h"

#include <chrono>
#include <iostream>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "tools/router_client.h"

namespace pdserve::tools {
namespace {

using json = nlohmann::json;

struct CheckFlags {
  std::string router;  // gRPC HOST:PORT.
  std::string api_key;
  std::string http;    // HTTP HOST:PORT (optional).
  std::string prompt = "Once upon a time";
  double wait_s = 0;
  bool tls = false;    // --tls: the router serves TLS (system CAs), gRPC and HTTPS.
  std::string tls_ca;  // --tls-ca: ... signed by this CA.
};

// host and port of --http (port 80 when it names none).
std::pair<std::string, int> http_address(const std::string& host_port) {
  StatusOr<HostPort> split = split_host_port(host_port);
  if (!split.ok()) return {host_port, 80};
  return {split->host, std::atoi(split->port.c_str())};
}

// Runs every check once, appending one line per check to `lines`; the first failure.
Status run_checks(const CheckFlags& f, const ClientTls& tls, std::vector<std::string>& lines) {
  auto report = [&lines](const std::string& what, const Status& s) {
    lines.push_back((s.ok() ? "ok    " : "FAIL  ") + what + (s.ok() ? "" : ": " + std::string(s.message())));
    return s;
  };
  PD_RETURN_IF_ERROR(report("gRPC health " + f.router, grpc_health_serving(f.router, std::chrono::seconds(5), tls)));
  auto connected = connect_and_describe(f.router, "", api_key_or_env(f.api_key), tls);
  PD_RETURN_IF_ERROR(report("gRPC GetModelInfo", connected.status()));
  const std::string model = connected->model.name();
  v1::GenerateRequest req;
  req.set_text(f.prompt);
  req.mutable_sampling()->set_max_tokens(1);
  req.mutable_sampling()->set_temperature(0);
  int tokens = 0;
  bool finished = false;
  Status generated = connected->client->generate(req, [&](const v1::GenerateResponse& r) {
    tokens += r.token_ids_size();
    finished = finished || r.finished();
  });
  if (generated.ok() && (tokens != 1 || !finished))
    generated = absl::InternalError(absl::StrCat("expected 1 token and a finish, got ", tokens));
  PD_RETURN_IF_ERROR(report("gRPC 1-token completion (model " + model + ")", generated));
  if (f.http.empty()) return absl::OkStatus();

  const auto [host, port] = http_address(f.http);
  // HTTPS verifies the router's certificate (and its name) against the CA, or the system's.
  httplib::Client http = tls.enabled ? httplib::Client("https://" + f.http) : httplib::Client(host, port);
  if (!tls.ca_file.empty()) http.set_ca_cert_path(tls.ca_file);
  http.set_connection_timeout(5, 0);
  http.set_read_timeout(30, 0);
  if (const std::string key = api_key_or_env(f.api_key); !key.empty()) http.set_bearer_token_auth(key.c_str());
  Status listed = absl::OkStatus();
  if (auto r = http.Get("/v1/models"); !r) {
    listed = absl::UnavailableError(absl::StrCat("GET /v1/models: ", httplib::to_string(r.error())));
  } else if (r->status != 200) {
    listed = absl::UnavailableError(absl::StrCat("GET /v1/models: HTTP ", r->status, ": ", r->body));
  } else {
    const json body = json::parse(r->body, nullptr, false);
    bool found = false;
    if (body.is_object() && body.contains("data") && body["data"].is_array())
      for (const json& m : body["data"]) found = found || (m.is_object() && m.value("id", "") == model);
    if (!found) listed = absl::NotFoundError(absl::StrCat("GET /v1/models does not list ", model, ": ", r->body));
  }
  PD_RETURN_IF_ERROR(report("HTTP GET /v1/models " + f.http, listed));
  const json completion = {{"model", model}, {"prompt", f.prompt}, {"max_tokens", 1}, {"temperature", 0}};
  Status completed = absl::OkStatus();
  if (auto r = http.Post("/v1/completions", completion.dump(), "application/json"); !r) {
    completed = absl::UnavailableError(absl::StrCat("POST /v1/completions: ", httplib::to_string(r.error())));
  } else if (r->status != 200) {
    completed = absl::UnavailableError(absl::StrCat("POST /v1/completions: HTTP ", r->status, ": ", r->body));
  } else {
    const json body = json::parse(r->body, nullptr, false);
    const bool one = body.is_object() && body.contains("usage") && body["usage"].value("completion_tokens", -1) == 1;
    if (!one) completed = absl::InternalError(absl::StrCat("POST /v1/completions: expected 1 completion token: ", r->body));
  }
  return report("HTTP 1-token completion", completed);
}

int run_check(const CheckFlags& f) {
  auto tls = load_client_tls(f.tls, f.tls_ca);
  if (!tls.ok()) {
    std::cerr << "error: " << tls.status().message() << "\n";
    return 2;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(f.wait_s);
  while (true) {
    const bool last = std::chrono::steady_clock::now() >= deadline;
    // The lines of the passing run, or of the last try: a cluster still starting is not noise.
    std::vector<std::string> lines;
    const Status s = run_checks(f, *tls, lines);
    if (s.ok() || last) {
      for (const std::string& line : lines) std::cout << line << "\n";
      if (s.ok()) std::cout << "all checks passed\n";
      return s.ok() ? 0 : 1;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace

void add_check_command(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<CheckFlags>();
  CLI::App* cmd = app.add_subcommand("check", "Smoke-test a running cluster through its router (gRPC, and HTTP with --http)");
  cmd->add_option("--router", f->router, "The router's gRPC HOST:PORT")->required();
  cmd->add_option("--http", f->http, "The router's HTTP HOST:PORT (OpenAI API checks)");
  cmd->add_option("--api-key", f->api_key, "API key for the router (default: $PDSERVE_API_KEY)");
  cmd->add_flag("--tls", f->tls, "Connect to the router (gRPC and HTTPS) over TLS, trusting the system's CAs");
  cmd->add_option("--tls-ca", f->tls_ca, "Connect to the router (gRPC and HTTPS) over TLS, trusting only this PEM CA");
  cmd->add_option("--prompt", f->prompt, "Prompt of the 1-token completions")->capture_default_str();
  cmd->add_option("--wait-s", f->wait_s, "Retry for up to this many seconds until every check passes")
      ->capture_default_str();
  cmd->callback([f, exit_code] { *exit_code = run_check(*f); });
}

}  // namespace pdserve::tools
