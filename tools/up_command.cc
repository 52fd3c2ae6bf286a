#include "tools/up_command.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/tls.h"
#include "engine/backend.h"

namespace pdserve::tools {
namespace {

// One line on stderr in one write: the router and the workers write to the same stderr, and a
// line written in pieces comes out with theirs in between.
void say(const std::string& text) { std::cerr << (text + "\n") << std::flush; }

namespace fs = std::filesystem;
using Steady = std::chrono::steady_clock;

struct UpFlags {
  std::string model = "stories260K";
  int prefill = 0, prefill_tp = 1;
  int decode = 0, decode_tp = 1;
  int aggregated = 0, tp = 1;
  int cpu_threads = 1;
  std::string kv_mode = "push";
  std::string device = "cpu", prefill_device, decode_device;
  std::string kv_memory = "auto";
  std::string weight_dtype = "f32";
  std::string kv_dtype = "f32";
  std::string gemm_precision = "exact";
  bool decode_graphs = false;
  bool async_scheduling = false;
  std::string host = "127.0.0.1";
  int port = 8000;
  int block_size = 0;
  uint64_t kv_cache_bytes = 0;
  uint64_t host_kv_bytes = 0;
  std::string kv_offload_dir;
  uint64_t kv_offload_dir_bytes = 0;
  int64_t kv_load_timeout_ms = 0;
  bool kv_peer_tier = false;
  std::string prefix_caching = "on";
  std::string kv_events = "on";       // Workers publish KV events on free ports; the router subscribes.
  std::string placement = "cache";    // The router's --placement.
  int local_prefill_tokens = 512;     // The router's --local-prefill-tokens (P/D).
  bool local_prefill_given = false;
  std::string kv_hash_secret_file;
  int max_running = 0, max_waiting = -1;
  double request_timeout_s = 0;
  double startup_timeout_s = 120;
  std::string restart = "always";  // A child that dies is started again ("never": everything stops).
  std::vector<std::string> api_keys;  // Passed to the router (--api-key).
  std::string kv_key_file;            // Passed to every prefill and decode worker (--kv-key-file).
  TlsFiles tls;  // The router's --tls-*; with --tls-ca the workers' too (mutual TLS).
  std::string ready_file;  // Written once every process is ready: the endpoints, as JSON.

  // The backend of the workers of `role` ("prefill", "decode" or "aggregated").
  const std::string& device_of(std::string_view role) const {
    if (role == "prefill" && !prefill_device.empty()) return prefill_device;
    if (role == "decode" && !decode_device.empty()) return decode_device;
    return device;
  }
};

// A child restarted more often than this within kCrashWindow is crash-looping: `up` gives up.
constexpr int kMaxQuickRestarts = 5;
constexpr auto kCrashWindow = std::chrono::seconds(10);

// One child process: its stdout is read for the READY line, then echoed to our stderr.
struct Child {
  std::string name;
  std::vector<std::string> argv;
  pid_t pid = -1;
  Steady::time_point started;
  int quick_restarts = 0;  // Restarts in a row, each within kCrashWindow of the last start.
  int out = -1;
  std::string buffer;
  std::string address;  // From "READY grpc=ADDR".
  std::string ready_line;
  std::map<std::string, std::string> ready_fields;  // Its KEY=VALUE words (grpc, http, role, ...).
  bool exited = false;
  int status = 0;
};

std::unique_ptr<Child> spawn(const std::string& name, std::vector<std::string> argv, const sigset_t& blocked) {
  auto c = std::make_unique<Child>();
  c->name = name;
  c->argv = argv;
  c->started = Steady::now();
  int pipefd[2];
  if (pipe(pipefd) != 0) return c;
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  c->pid = fork();
  if (c->pid == 0) {
    // The children must not outlive `up` even when it is killed with SIGKILL.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    sigprocmask(SIG_UNBLOCK, &blocked, nullptr);
    dup2(pipefd[1], STDOUT_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    execv(args[0], args.data());
    std::perror(("exec " + argv[0]).c_str());
    _exit(127);
  }
  close(pipefd[1]);
  c->out = pipefd[0];
  fcntl(c->out, F_SETFL, O_NONBLOCK);
  return c;
}

// Reads what a child wrote; lines after its READY are echoed to stderr.
void drain(Child& c) {
  if (c.out < 0) return;
  char buf[4096];
  ssize_t n;
  while ((n = read(c.out, buf, sizeof buf)) > 0) c.buffer.append(buf, size_t(n));
  if (n == 0) {
    close(c.out);
    c.out = -1;
  }
  size_t nl;
  while ((nl = c.buffer.find('\n')) != std::string::npos) {
    std::string line = c.buffer.substr(0, nl);
    c.buffer.erase(0, nl + 1);
    if (c.ready_line.empty() && line.rfind("READY grpc=", 0) == 0) {
      c.ready_line = line;
      for (absl::string_view word : absl::StrSplit(absl::string_view(line).substr(6), ' ', absl::SkipEmpty()))
        if (const size_t eq = word.find('='); eq != absl::string_view::npos)
          c.ready_fields[std::string(word.substr(0, eq))] = std::string(word.substr(eq + 1));
      c.address = c.ready_fields["grpc"];
    } else {
      say(absl::StrCat("[", c.name, "] ", line));
    }
  }
}

bool reap(Child& c) {
  if (c.exited || c.pid <= 0) return c.exited;
  if (waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.exited = true;
  return c.exited;
}

// SIGTERM to all, a grace period, then SIGKILL to what is left; the router goes first so no
// request is sent to a worker that is already leaving.
void stop_all(std::vector<std::unique_ptr<Child>>& children) {
  for (auto it = children.rbegin(); it != children.rend(); ++it)
    if (!(*it)->exited && (*it)->pid > 0) kill((*it)->pid, SIGTERM);
  const auto deadline = Steady::now() + std::chrono::seconds(8);
  while (Steady::now() < deadline) {
    bool all = true;
    for (auto& c : children) all = reap(*c) && all;
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& c : children)
    if (!reap(*c)) {
      say(absl::StrCat("up: ", c->name, " did not stop; killing it"));
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &c->status, 0);
      c->exited = true;
    }
}

std::string describe_exit(const Child& c) {
  if (WIFSIGNALED(c.status)) return "killed by signal " + std::to_string(WTERMSIG(c.status));
  return "exited with status " + std::to_string(WEXITSTATUS(c.status));
}

// The endpoints of a ready cluster, for programs that drive it (`pdserve tune`): the router's
// READY fields and, per worker, its name and READY fields (grpc, role, tp, probe, ...).
// Written to a temporary file renamed into place, so a reader never sees half of it.
bool write_ready_file(const std::string& path, const Child& router, const std::vector<Child*>& workers) {
  nlohmann::json j;
  j["router"] = router.ready_fields;
  j["workers"] = nlohmann::json::array();
  for (const Child* c : workers) {
    nlohmann::json w = c->ready_fields;
    w["name"] = c->name;
    j["workers"].push_back(w);
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Waits until every child in `wanted` printed READY; false (with a message) when one exits or
// the time runs out, or (setting *signalled) a signal asks us to stop.
bool wait_ready(std::vector<Child*> wanted, const sigset_t& signals, Steady::time_point deadline, bool* signalled) {
  while (true) {
    bool all = true;
    for (Child* c : wanted) {
      drain(*c);
      if (!c->ready_line.empty()) continue;
      all = false;
      if (reap(*c)) {
        say(absl::StrCat("up: ", c->name, " ", describe_exit(*c), " before it was ready"));
        return false;
      }
    }
    if (all) return true;
    if (Steady::now() >= deadline) {
      std::cerr << "up: timed out waiting for the processes to be ready\n";
      return false;
    }
    const timespec tick{0, 20'000'000};
    if (int sig = sigtimedwait(&signals, nullptr, &tick); sig > 0) {
      std::cerr << "up: signal " << sig << " before the cluster was ready, stopping\n";
      *signalled = true;
      return false;
    }
  }
}

int run_up(const UpFlags& f) {
  const bool pd = f.aggregated == 0;
  if (pd && (f.prefill < 1 || f.decode < 1)) {
    std::cerr << "error: give --prefill N and --decode K (at least 1 each), or --aggregated K\n";
    return 2;
  }
  if (!pd && (f.prefill > 0 || f.decode > 0)) {
    std::cerr << "error: --aggregated cannot be combined with --prefill/--decode\n";
    return 2;
  }
  if (!pd && f.local_prefill_given) {
    std::cerr << "error: --local-prefill-tokens applies to P/D clusters (--prefill/--decode), not --aggregated\n";
    return 2;
  }
  if (!pd && f.kv_mode != "push") {  // push is the default: it cannot be told from a value given.
    std::cerr << "error: --kv-mode " << f.kv_mode << " applies to P/D clusters (--prefill/--decode), not --aggregated\n";
    return 2;
  }
  if (f.kv_mode == "pull-host" && f.host_kv_bytes == 0) {
    std::cerr << "error: --kv-mode pull-host reads prompts from the prefill workers' host KV tier: give --host-kv-bytes\n";
    return 2;
  }
  if (f.kv_peer_tier && (!pd || f.host_kv_bytes == 0 || f.kv_events != "on")) {
    std::cerr << "error: --kv-peer-tier needs a P/D cluster (--prefill/--decode) with --host-kv-bytes and KV events "
                 "(the router names a peer by its host-tier events)\n";
    return 2;
  }
  const bool cpu_worker =
      pd ? f.device_of("prefill") == "cpu" || f.device_of("decode") == "cpu" : f.device_of("aggregated") == "cpu";
  if (f.cpu_threads > 1 && !cpu_worker) {
    std::cerr << "error: --cpu-threads is for CPU workers, and every worker runs on a GPU\n";
    return 2;
  }
  if (f.gemm_precision == "bf16") {
    if (f.weight_dtype != "bf16") {
      std::cerr << "error: --gemm-precision bf16 multiplies bf16 activations by bf16 weights: it takes --weight-dtype "
                   "bf16\n";
      return 2;
    }
    if (cpu_worker) {
      std::cerr << "error: --gemm-precision bf16 needs GPU workers: CPU workers multiply f32 activations\n";
      return 2;
    }
  }
  // Decode steps are the decode workers' (and aggregated ones'): prefill workers run none.
  const std::string decoding_role = pd ? "decode" : "aggregated";
  if (f.decode_graphs && (f.device_of(decoding_role) == "cpu" || (pd ? f.decode_tp : f.tp) > 1)) {
    std::cerr << "error: --decode-graphs records GPU steps at TP 1: it needs " << decoding_role
              << " workers on a GPU at TP 1\n";
    return 2;
  }
  if (f.async_scheduling && f.device_of(decoding_role) == "cpu") {
    std::cerr << "error: --async-scheduling reads sampled tokens on a GPU: it needs " << decoding_role
              << " workers on a GPU (CPU workers sample on the host)\n";
    return 2;
  }
  if (f.kv_dtype != "f32" && cpu_worker) {
    std::cerr << "error: --kv-dtype " << f.kv_dtype << " needs GPU workers: CPU workers keep an f32 KV cache\n";
    return 2;
  }
  if (f.cpu_threads > 1) {
    // Each worker spins only while its own threads fit the cores; together they may not.
    int threads = 0;
    const auto add = [&](std::string_view role, int workers, int tp) {
      if (f.device_of(role) == "cpu") threads += workers * tp * f.cpu_threads;
    };
    add("prefill", f.prefill, f.prefill_tp);
    add("decode", f.decode, f.decode_tp);
    add("aggregated", f.aggregated, f.tp);
    const unsigned cores = std::thread::hardware_concurrency();
    if (cores > 0 && unsigned(threads) > cores)
      say("warning: the CPU workers compute with " + std::to_string(threads) +
          " threads (workers x TP x --cpu-threads " + std::to_string(f.cpu_threads) + ") on " + std::to_string(cores) +
          " cores: they will take turns");
  }
  // Checked here too, before any child starts: a bad file is one error, not a crash-looping router.
  auto tls = load_tls(f.tls);
  if (!tls.ok()) {
    std::cerr << "error: " << tls.status().message() << "\n";
    return 2;
  }
  std::vector<std::string> tls_args;
  if (tls->mode != TlsMode::kPlaintext) tls_args = {"--tls-cert", f.tls.cert, "--tls-key", f.tls.key};
  if (tls->mode == TlsMode::kMutual) tls_args.insert(tls_args.end(), {"--tls-ca", f.tls.ca});
  std::error_code ec;
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  const std::string prefill_bin = sibling_binary(self, "prefill_worker", "pdserve-prefill");
  const std::string decode_bin = sibling_binary(self, "decode_worker", "pdserve-decode");
  const std::string router_bin = sibling_binary(self, "router", "pdserve-router");
  for (const std::string& b : {pd ? prefill_bin : decode_bin, decode_bin, router_bin})
    if (access(b.c_str(), X_OK) != 0) {
      std::cerr << "error: " << b << " not found (build it, or install it beside pdserve)\n";
      return 1;
    }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  sigprocmask(SIG_BLOCK, &signals, nullptr);

  auto worker_args = [&](const std::string& bin, const std::string& role, int tp) {
    const std::string& device = f.device_of(role);
    std::vector<std::string> a = {bin, "--role", role, "--model", f.model, "--tp", std::to_string(tp),
                                  "--device", device, "--host", f.host, "--port", "0"};
    if (role != "aggregated") a.insert(a.end(), {"--kv-memory", f.kv_memory});
    if (device == "cpu") a.insert(a.end(), {"--cpu-threads", std::to_string(f.cpu_threads)});
    // bf16 GEMMs with a CPU worker were refused above.
    if (device != "cpu") a.insert(a.end(), {"--weight-dtype", f.weight_dtype, "--gemm-precision", f.gemm_precision});
    if (f.decode_graphs && role != "prefill") a.push_back("--decode-graphs");  // On a GPU at TP 1 (checked above).
    if (f.async_scheduling && role != "prefill") a.push_back("--async-scheduling");  // Likewise.
    a.insert(a.end(), {"--kv-dtype", f.kv_dtype});  // Every worker (bf16 with a CPU worker refused above).
    if (f.block_size > 0) a.insert(a.end(), {"--block-size", std::to_string(f.block_size)});
    if (f.kv_cache_bytes > 0) a.insert(a.end(), {"--kv-cache-bytes", std::to_string(f.kv_cache_bytes)});
    if (f.host_kv_bytes > 0) a.insert(a.end(), {"--host-kv-bytes", std::to_string(f.host_kv_bytes)});
    if (!f.kv_offload_dir.empty()) a.insert(a.end(), {"--kv-offload-dir", f.kv_offload_dir});
    if (f.kv_offload_dir_bytes > 0)
      a.insert(a.end(), {"--kv-offload-dir-bytes", std::to_string(f.kv_offload_dir_bytes)});
    if (f.kv_load_timeout_ms > 0)
      a.insert(a.end(), {"--kv-load-timeout-ms", std::to_string(f.kv_load_timeout_ms)});
    if (f.kv_peer_tier && role != "aggregated") a.push_back("--kv-peer-tier");
    a.insert(a.end(), {"--prefix-caching", f.prefix_caching});
    if (f.kv_events == "on") {
      const std::string any_port = "tcp://" + f.host + ":0";  // The worker advertises what it bound.
      a.insert(a.end(), {"--kv-events-endpoint", any_port, "--kv-replay-endpoint", any_port});
    }
    if (!f.kv_hash_secret_file.empty()) a.insert(a.end(), {"--kv-hash-secret-file", f.kv_hash_secret_file});
    if (tls->mode == TlsMode::kMutual) a.insert(a.end(), tls_args.begin(), tls_args.end());
    if (role != "aggregated" && !f.kv_key_file.empty()) a.insert(a.end(), {"--kv-key-file", f.kv_key_file});
    return a;
  };
  std::vector<std::unique_ptr<Child>> children;
  std::vector<Child*> prefill, decode, aggregated;
  for (int i = 0; i < f.prefill; ++i) {
    children.push_back(spawn("prefill" + std::to_string(i), worker_args(prefill_bin, "prefill", f.prefill_tp), signals));
    prefill.push_back(children.back().get());
  }
  for (int i = 0; i < f.decode; ++i) {
    children.push_back(spawn("decode" + std::to_string(i), worker_args(decode_bin, "decode", f.decode_tp), signals));
    decode.push_back(children.back().get());
  }
  for (int i = 0; i < f.aggregated; ++i) {
    children.push_back(spawn("aggregated" + std::to_string(i), worker_args(decode_bin, "aggregated", f.tp), signals));
    aggregated.push_back(children.back().get());
  }
  const auto deadline = Steady::now() + std::chrono::milliseconds(int64_t(f.startup_timeout_s * 1000));
  std::vector<Child*> workers;
  for (auto& c : children) workers.push_back(c.get());
  bool signalled = false;
  if (!wait_ready(workers, signals, deadline, &signalled)) {
    stop_all(children);
    return signalled ? 0 : 1;
  }
  for (Child* c : workers) say("up: " + c->ready_line.substr(6));

  std::vector<std::string> ra = {router_bin, "--model", f.model, "--host", f.host, "--port", std::to_string(f.port)};
  if (pd)
    ra.insert(ra.end(), {"--kv-mode", f.kv_mode, "--local-prefill-tokens", std::to_string(f.local_prefill_tokens)});
  ra.insert(ra.end(), {"--placement", f.placement});
  for (Child* c : prefill) ra.insert(ra.end(), {"--prefill", c->address});
  for (Child* c : decode) ra.insert(ra.end(), {"--decode", c->address});
  for (Child* c : aggregated) ra.insert(ra.end(), {"--aggregated", c->address});
  if (f.max_running > 0) ra.insert(ra.end(), {"--max-running", std::to_string(f.max_running)});
  for (const std::string& k : f.api_keys) ra.insert(ra.end(), {"--api-key", k});
  ra.insert(ra.end(), tls_args.begin(), tls_args.end());
  if (f.max_waiting >= 0) ra.insert(ra.end(), {"--max-waiting", std::to_string(f.max_waiting)});
  if (f.request_timeout_s > 0) ra.insert(ra.end(), {"--request-timeout", std::to_string(f.request_timeout_s)});
  children.push_back(spawn("router", ra, signals));
  Child* router = children.back().get();
  if (!wait_ready({router}, signals, deadline, &signalled)) {
    stop_all(children);
    return signalled ? 0 : 1;
  }
  if (!f.ready_file.empty() && !write_ready_file(f.ready_file, *router, workers)) {
    std::cerr << "error: cannot write " << f.ready_file << "\n";
    stop_all(children);
    return 1;
  }
  std::cout << router->ready_line << std::endl;
  std::cerr << "up: serving " << f.model << " ("
            << (pd ? std::to_string(f.prefill) + " prefill TP" + std::to_string(f.prefill_tp) + " + " +
                         std::to_string(f.decode) + " decode TP" + std::to_string(f.decode_tp) + ", KV " + f.kv_mode
                   : std::to_string(f.aggregated) + " aggregated TP" + std::to_string(f.tp))
            << "); Ctrl-C stops everything\n";

  while (true) {
    for (auto& c : children) {
      drain(*c);
      if (!reap(*c)) continue;
      if (f.restart == "never") {
        say(absl::StrCat("up: ", c->name, " ", describe_exit(*c), "; stopping the others"));
        stop_all(children);
        return 1;
      }
      const int quick = Steady::now() - c->started < kCrashWindow ? c->quick_restarts + 1 : 0;
      if (quick > kMaxQuickRestarts) {
        say(absl::StrCat("up: ", c->name, " ", describe_exit(*c), " again (", quick, " times in a row, each within ",
                         kCrashWindow.count(), " s of starting); stopping the others"));
        stop_all(children);
        return 1;
      }
      // On its old address, so the router (which lists it) finds it again; the router migrates
      // what the dead process was serving meanwhile.
      std::vector<std::string> argv = c->argv;
      if (!c->address.empty())
        for (size_t i = 0; i + 1 < argv.size(); ++i)
          if (argv[i] == "--port") argv[i + 1] = c->address.substr(c->address.rfind(':') + 1);
      // The router's HTTP port too (READY ... http=HOST:PORT), so that HTTP clients find it again.
      if (const auto http = c->ready_fields.find("http");
          http != c->ready_fields.end() && std::find(argv.begin(), argv.end(), "--http-port") == argv.end()) {
        argv.insert(argv.end(), {"--http-port", http->second.substr(http->second.rfind(':') + 1)});
      }
      say(absl::StrCat("up: ", c->name, " ", describe_exit(*c), "; restarting it",
                       c->address.empty() ? "" : " on " + c->address));
      const std::string name = c->name, address = c->address;
      if (c->out >= 0) close(c->out);
      c = spawn(name, argv, signals);
      c->address = address;
      c->quick_restarts = quick;
    }
    const timespec tick{0, 50'000'000};
    if (int sig = sigtimedwait(&signals, nullptr, &tick); sig > 0) {
      std::cerr << "up: signal " << sig << ", stopping\n";
      stop_all(children);
      return 0;
    }
  }
}

}  // namespace

std::string sibling_binary(const std::string& self, const std::string& subdir, const std::string& name) {
  const fs::path dir = fs::path(self).parent_path();
  if (fs::exists(dir / name)) return (dir / name).string();
  return (dir.parent_path() / subdir / name).string();
}

void add_up_command(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<UpFlags>();
  CLI::App* cmd = app.add_subcommand("up", "Start workers and a router on this machine");
  cmd->add_option("--model", f->model, "Model path or name")->capture_default_str();
  cmd->add_option("--api-key", f->api_keys, "Client API key the router requires (repeatable; also $PDSERVE_API_KEY, which the router reads)");
  cmd->add_option("--restart", f->restart,
                  "always: a worker or router that dies is started again on its address (requests it served are "
                  "migrated); never: one death stops the whole cluster")
      ->check(CLI::IsMember({"always", "never"}))
      ->capture_default_str();
  cmd->add_option("--prefill", f->prefill, "Prefill workers");
  cmd->add_option("--prefill-tp", f->prefill_tp, "TP ranks per prefill worker")->capture_default_str();
  cmd->add_option("--decode", f->decode, "Decode workers");
  cmd->add_option("--decode-tp", f->decode_tp, "TP ranks per decode worker")->capture_default_str();
  cmd->add_option("--aggregated", f->aggregated, "Aggregated workers (the non-disaggregated baseline)");
  cmd->add_option("--tp", f->tp, "TP ranks per aggregated worker")->capture_default_str();
  cmd->add_option("--cpu-threads", f->cpu_threads,
                  "Threads per rank of the workers on device cpu (GPU roles take none; see the workers)")
      ->check(CLI::Range(1, engine::kMaxCpuThreads))
      ->capture_default_str();
  cmd->add_option("--kv-mode", f->kv_mode,
                   "KV transfer: push (prefill writes), pull (decode reads) or pull-host (decode reads a copy in the "
                   "prefill worker's host tier; needs --host-kv-bytes)")
      ->check(CLI::IsMember({"push", "pull", "pull-host"}))->capture_default_str();
  cmd->add_option("--device", f->device, "Workers' compute backend: cpu, cuda or hip (emulated: tests)")
      ->check(CLI::IsMember({"cpu", "cuda", "hip", "emulated"}))
      ->capture_default_str();
  cmd->add_option("--prefill-device", f->prefill_device, "Prefill workers' backend (default: --device)")
      ->check(CLI::IsMember({"cpu", "cuda", "hip", "emulated"}));
  cmd->add_option("--decode-device", f->decode_device, "Decode workers' backend (default: --device)")
      ->check(CLI::IsMember({"cpu", "cuda", "hip", "emulated"}));
  cmd->add_option("--weight-dtype", f->weight_dtype, "GPU workers' GEMM weights: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--gemm-precision", f->gemm_precision,
                  "GPU workers' GEMM activations: exact (f32), or bf16 (the vendor bf16 GEMM, and on CUDA tensor-core "
                  "prefill attention; needs --weight-dtype bf16)")
      ->check(CLI::IsMember({"exact", "bf16"}))
      ->capture_default_str();
  cmd->add_flag("--decode-graphs", f->decode_graphs,
                "Decode (or aggregated) workers record decode steps as GPU graphs and replay them (GPU workers "
                "at TP 1 only)");
  cmd->add_flag("--async-scheduling", f->async_scheduling,
                "Decode (or aggregated) workers queue each step before reading the previous one's tokens (GPU "
                "workers only)");
  cmd->add_option("--kv-dtype", f->kv_dtype, "Every worker's KV cache elements: f32, or bf16 (GPU workers only)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--kv-memory", f->kv_memory, "P/D workers' KV for transfers: auto or staged (see the workers)")
      ->check(CLI::IsMember({"auto", "staged"}))
      ->capture_default_str();
  cmd->add_option("--host", f->host, "Address every process listens on")->capture_default_str();
  cmd->add_option("--port", f->port, "Router gRPC port (HTTP on port + 1; with 0, both any free ports)")->capture_default_str();
  cmd->add_option("--block-size", f->block_size, "Tokens per KV block (workers)");
  cmd->add_option("--kv-cache-bytes", f->kv_cache_bytes, "KV cache bytes per rank (workers)");
  cmd->add_option("--host-kv-bytes", f->host_kv_bytes, "Host tier of the KV cache, bytes per rank (workers)");
  cmd->add_option("--kv-offload-dir", f->kv_offload_dir,
                  "Filesystem tier of the KV cache (workers; one directory all of them share)");
  cmd->add_option("--kv-offload-dir-bytes", f->kv_offload_dir_bytes, "Bytes the filesystem tier keeps at most (workers)");
  cmd->add_flag("--kv-peer-tier", f->kv_peer_tier,
                "Peer tier of the KV cache (workers; needs --host-kv-bytes): a prefill worker reads a prompt's "
                "prefix from the worker whose host tier holds more of it (the decode worker of an earlier turn)");
  cmd->add_option("--kv-load-timeout-ms", f->kv_load_timeout_ms,
                  "How long a request may read the filesystem tier before computing the rest (workers; 0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--prefix-caching", f->prefix_caching, "Workers' prefix cache (docs/prefix_caching.md)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--kv-events", f->kv_events,
                  "Workers publish KV events (on free ports) and the router places by their caches "
                  "(docs/kv_events.md); off: no endpoints")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--placement", f->placement, "Router placement: cache (by cached prefix and load) or load")
      ->check(CLI::IsMember({"cache", "load"}))
      ->capture_default_str();
  cmd->add_option("--local-prefill-tokens", f->local_prefill_tokens,
                  "P/D: prompts whose uncached part on the chosen decode worker is at most this many tokens are "
                  "prefilled there (no prefill worker, no transfer); 0: always on a prefill worker")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--kv-hash-secret-file", f->kv_hash_secret_file,
                  "Workers: a secret mixed into every prefix-cache block key")
      ->check(CLI::ExistingFile);
  cmd->add_option("--max-running", f->max_running, "Router: requests out at the workers at once");
  cmd->add_option("--max-waiting", f->max_waiting, "Router: requests queued before refusing");
  cmd->add_option("--request-timeout", f->request_timeout_s, "Router: per-request timeout in seconds");
  cmd->add_option("--tls-cert", f->tls.cert, "Router: serve gRPC and HTTP over TLS with this PEM certificate");
  cmd->add_option("--tls-key", f->tls.key, "Router: the PEM private key of --tls-cert");
  cmd->add_option("--tls-ca", f->tls.ca,
                  "Mutual TLS between the router and the workers (all three use --tls-cert/--tls-key): this PEM CA");
  cmd->add_option("--kv-key-file", f->kv_key_file,
                  "Prefill and decode workers: CURVE-encrypt the KV control channel with this cluster key "
                  "(`pdserve kv-keygen`)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--ready-file", f->ready_file,
                  "Once every process is ready, write the router's and each worker's endpoints here as JSON");
  cmd->add_option("--startup-timeout", f->startup_timeout_s, "Seconds to wait for every process to be ready")
      ->capture_default_str();
  cmd->callback([f, exit_code, cmd] {
    f->local_prefill_given = cmd->count("--local-prefill-tokens") > 0;
    *exit_code = run_up(*f);
  });
}

}  // namespace pdserve::tools
