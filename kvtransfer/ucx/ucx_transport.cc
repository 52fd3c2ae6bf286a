#include "kvtransfer/ucx/ucx_transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/logging.h"
#include "kvtransfer/ucx/stream_copy.h"

namespace pdserve::kvtransfer {
namespace {

// Remote descriptor wire format (host byte order; both ends run on the same architecture):
// magic "PDKR" | version u8 | memory kind u8 | 2 reserved bytes | address u64 | length u64 |
// rkey size u32 | packed rkey.
constexpr char kDescriptorMagic[4] = {'P', 'D', 'K', 'R'};
constexpr uint8_t kDescriptorVersion = 1;
constexpr size_t kDescriptorHeader = 4 + 1 + 1 + 2 + 8 + 8 + 4;

struct Descriptor {
  MemoryKind kind = MemoryKind::kHost;
  uint64_t addr = 0;
  uint64_t length = 0;
  std::string_view rkey;
};

template <typename T>
void append_raw(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
T read_raw(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}

std::string encode_descriptor(MemoryKind kind, uint64_t addr, uint64_t length, const void* rkey,
                              size_t rkey_size) {
  std::string out(kDescriptorMagic, sizeof(kDescriptorMagic));
  append_raw<uint8_t>(out, kDescriptorVersion);
  append_raw<uint8_t>(out, static_cast<uint8_t>(kind));
  append_raw<uint16_t>(out, 0);
  append_raw<uint64_t>(out, addr);
  append_raw<uint64_t>(out, length);
  append_raw<uint32_t>(out, static_cast<uint32_t>(rkey_size));
  out.append(static_cast<const char*>(rkey), rkey_size);
  return out;
}

StatusOr<Descriptor> decode_descriptor(std::string_view in) {
  if (in.size() < kDescriptorHeader || std::memcmp(in.data(), kDescriptorMagic, 4) != 0) {
    return absl::InvalidArgumentError("not a pdserve remote region descriptor");
  }
  const char* p = in.data();
  if (static_cast<uint8_t>(p[4]) != kDescriptorVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported region descriptor version ", static_cast<int>(p[4])));
  }
  Descriptor d;
  const uint8_t kind = static_cast<uint8_t>(p[5]);
  if (kind > static_cast<uint8_t>(MemoryKind::kRocm)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown memory kind ", kind));
  }
  d.kind = static_cast<MemoryKind>(kind);
  d.addr = read_raw<uint64_t>(p + 8);
  d.length = read_raw<uint64_t>(p + 16);
  const uint32_t rkey_size = read_raw<uint32_t>(p + 24);
  if (rkey_size == 0 || rkey_size != in.size() - kDescriptorHeader) {
    return absl::InvalidArgumentError("region descriptor has a truncated or oversized key");
  }
  d.rkey = in.substr(kDescriptorHeader);
  return d;
}

ucs_memory_type_t to_ucs_memory_type(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost: return UCS_MEMORY_TYPE_HOST;
    case MemoryKind::kCuda: return UCS_MEMORY_TYPE_CUDA;
    case MemoryKind::kRocm: return UCS_MEMORY_TYPE_ROCM;
  }
  return UCS_MEMORY_TYPE_UNKNOWN;
}

// [offset, offset + length) lies inside [0, size), without overflow.
bool in_bounds(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

Status ucs_error(std::string_view what, ucs_status_t status) {
  return absl::InternalError(absl::StrCat(std::string(what), ": ", ucs_status_string(status)));
}

// Longest idle sleep of the progress thread: bounds how late a passive target (tcp, emulated
// one-sided ops) starts serving after a quiet period it was not told would end
// (expect_remote_ops).
constexpr Duration kMaxIdleSleep = std::chrono::milliseconds(1);
// Longest sleep while this side has requests in flight.
constexpr Duration kMaxBusySleep = std::chrono::microseconds(50);

}  // namespace

StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::create(UcxTransportOptions options) {
  std::unique_ptr<UcxTransport> transport(new UcxTransport(std::move(options)));
  PD_RETURN_IF_ERROR(transport->init());
  return transport;
}

UcxTransport::UcxTransport(UcxTransportOptions options) : options_(std::move(options)) {}

Status UcxTransport::init() {
  const char* tls = std::getenv("UCX_TLS");
  tls_ = tls ? tls : "all";

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return ucs_error("ucp_config_read", st);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  // RMA covers put/get and endpoint flush; no tag matching or active messages are used.
  params.features = UCP_FEATURE_RMA;
  params.name = options_.name.c_str();
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return ucs_error("ucp_init", st);

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Every worker call happens under mu_, from whichever thread: serialized, never concurrent.
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) return ucs_error("ucp_worker_create", st);

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (st != UCS_OK) return ucs_error("ucp_worker_get_address", st);
  address_.assign(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(worker_, addr);

  if (options_.progress_thread) progress_thread_ = std::thread([this] { progress_loop(); });
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (progress_thread_.joinable()) progress_thread_.join();
  if (worker_ == nullptr) {
    if (context_ != nullptr) ucp_cleanup(context_);
    return;
  }

  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, peer] : peers_) {
    if (peer.error.ok()) fail_peer(id, peer, absl::CancelledError("transport destroyed"));
  }
  pending_callbacks_.clear();  // Nobody is left to tell.
  // Let force-closed endpoints and cancelled requests finish; bounded because requests on
  // endpoints without peer error handling may never complete.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while ((inflight_ > 0 || !closing_eps_.empty()) &&
         std::chrono::steady_clock::now() < deadline) {
    progress_locked();
  }
  for (auto& [id, region] : regions_) ucp_mem_unmap(context_, region.memh);
  regions_.clear();
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

std::string UcxTransport::describe() const { return absl::StrCat("ucx(UCX_TLS=", tls_, ")"); }

Status UcxTransport::check_memory_kind(MemoryKind kind) {
  if (kind == MemoryKind::kHost) return absl::OkStatus();
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  const ucs_status_t st = ucp_context_query(context_, &attr);
  if (st != UCS_OK) return ucs_error("ucp_context_query", st);
  if ((attr.memory_types & UCS_BIT(to_ucs_memory_type(kind))) == 0) {
    // Callers stage through host memory instead (worker/kv_ranks.cc, worker/kv_staging.h).
    return absl::UnimplementedError(
        absl::StrCat("this UCX build cannot register ", memory_kind_name(kind), " memory"));
  }
  return absl::OkStatus();
}

StatusOr<RegisteredRegion> UcxTransport::add_region(ucp_mem_h memh, void* addr, size_t length,
                                                    MemoryKind kind) {
  void* rkey = nullptr;
  size_t rkey_size = 0;
  const ucs_status_t st = ucp_rkey_pack(context_, memh, &rkey, &rkey_size);
  if (st != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    return ucs_error("ucp_rkey_pack", st);
  }
  RegisteredRegion out;
  out.id = next_id_++;
  out.descriptor =
      encode_descriptor(kind, reinterpret_cast<uintptr_t>(addr), length, rkey, rkey_size);
  ucp_rkey_buffer_release(rkey);
  regions_[out.id] = Region{memh, reinterpret_cast<uintptr_t>(addr), length, kind};
  return out;
}

StatusOr<RegisteredRegion> UcxTransport::register_region(const MemoryRegion& region) {
  if (region.addr == nullptr || region.length == 0) {
    return absl::InvalidArgumentError("cannot register an empty memory region");
  }
  std::lock_guard<std::mutex> lock(mu_);
  PD_RETURN_IF_ERROR(check_memory_kind(region.kind));
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = region.addr;
  params.length = region.length;
  params.memory_type = to_ucs_memory_type(region.kind);
  ucp_mem_h memh = nullptr;
  const ucs_status_t st = ucp_mem_map(context_, &params, &memh);
  if (st != UCS_OK) return ucs_error("ucp_mem_map", st);
  return add_region(memh, region.addr, region.length, region.kind);
}

StatusOr<AllocatedRegion> UcxTransport::allocate_region(size_t length, MemoryKind kind) {
  if (length == 0) return absl::InvalidArgumentError("cannot allocate an empty memory region");
  std::lock_guard<std::mutex> lock(mu_);
  PD_RETURN_IF_ERROR(check_memory_kind(kind));
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.length = length;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  params.memory_type = to_ucs_memory_type(kind);
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context_, &params, &memh);
  if (st != UCS_OK) return ucs_error("ucp_mem_map(ALLOCATE)", st);
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(memh, &attr);
  if (st != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    return ucs_error("ucp_mem_query", st);
  }
  // UCX may round the length up (to pages); the region is what the caller asked for.
  if (attr.length < length) {
    ucp_mem_unmap(context_, memh);
    return absl::InternalError(absl::StrCat("ucp_mem_map(ALLOCATE) gave ", attr.length,
                                            " bytes for ", length));
  }
  PD_ASSIGN_OR_RETURN(RegisteredRegion registered, add_region(memh, attr.address, length, kind));
  return AllocatedRegion{registered.id, attr.address, std::move(registered.descriptor)};
}

Status UcxTransport::deregister_region(RegionId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) return absl::NotFoundError(absl::StrCat("no region ", id));
  const ucs_status_t st = ucp_mem_unmap(context_, it->second.memh);
  regions_.erase(it);
  if (st != UCS_OK) return ucs_error("ucp_mem_unmap", st);
  return absl::OkStatus();
}

std::string UcxTransport::local_address() const { return address_; }

StatusOr<PeerId> UcxTransport::connect(std::string_view peer_address) {
  if (peer_address.empty()) return absl::InvalidArgumentError("empty peer address");
  std::lock_guard<std::mutex> lock(mu_);
  const std::string key(peer_address);
  if (auto it = peer_by_address_.find(key); it != peer_by_address_.end()) {
    if (peers_.at(it->second).error.ok()) return it->second;
    peer_by_address_.erase(it);  // A failed endpoint is replaced by a fresh one.
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(key.data());
  // Peer mode: a dead peer fails outstanding requests and calls on_ep_error instead of hanging.
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxTransport::on_ep_error;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  ucs_status_t st = UCS_ERR_UNREACHABLE;
  if (peer_mode_usable_) st = ucp_ep_create(worker_, &params, &ep);
  const bool detects_failure = st == UCS_OK;
  if (st == UCS_ERR_UNREACHABLE || st == UCS_ERR_UNSUPPORTED) {
    // Connect without peer mode: ops to a dead peer then fail only where the transport
    // notices, and otherwise the control channel's heartbeat detects the death and calls
    // disconnect(). UNREACHABLE: UCX 1.13's shared-memory transports cannot report a dead
    // peer, so peer mode finds no usable lane with them; remembered, so UCX logs its refusal
    // once per process. UNSUPPORTED: the peer already has an endpoint to us without peer mode
    // ("asymmetric endpoint configuration"); only this endpoint gives it up, so other peers
    // (e.g. over tcp) keep failure detection.
    if (st == UCS_ERR_UNREACHABLE) {
      if (peer_mode_usable_) {
        PD_LOG_WARN("{}: transports of {} cannot detect peer failure; relying on the control "
                    "channel for it", options_.name, describe());
      }
      peer_mode_usable_ = false;
    } else {
      PD_LOG_WARN("{}: peer's endpoint to us runs without peer error mode; connecting the same "
                  "way, relying on the control channel to detect its failure", options_.name);
    }
    params.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
    st = ucp_ep_create(worker_, &params, &ep);
  }
  if (st != UCS_OK) return ucs_error("ucp_ep_create", st);
  const PeerId id = next_id_++;
  Peer& peer = peers_[id];
  peer.ep = ep;
  peer.detects_failure = detects_failure;
  peer.address = key;
  peer_by_address_[key] = id;
  return id;
}

Status UcxTransport::disconnect(PeerId id, std::string_view reason) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return absl::NotFoundError(absl::StrCat("no peer ", id));
  if (it->second.error.ok()) {
    fail_peer(id, it->second,
              absl::CancelledError(absl::StrCat("disconnected: ", std::string(reason))));
  }
  run_callbacks(lock);
  return absl::OkStatus();
}

StatusOr<RemoteRegionId> UcxTransport::load_remote_region(PeerId id,
                                                          std::string_view descriptor) {
  PD_ASSIGN_OR_RETURN(Descriptor d, decode_descriptor(descriptor));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return absl::NotFoundError(absl::StrCat("no peer ", id));
  Peer& peer = it->second;
  if (!peer.error.ok()) return absl::UnavailableError(std::string(peer.error.message()));
  ucp_rkey_h rkey = nullptr;
  const ucs_status_t st = ucp_ep_rkey_unpack(peer.ep, d.rkey.data(), &rkey);
  if (st != UCS_OK) return ucs_error("ucp_ep_rkey_unpack", st);
  void* mapped = nullptr;
  if (d.kind != MemoryKind::kHost || ucp_rkey_ptr(rkey, d.addr, &mapped) != UCS_OK) mapped = nullptr;
  const RemoteRegionId remote_id = next_id_++;
  peer.remotes[remote_id] = RemoteRegion{d.addr, d.length, rkey, static_cast<uint8_t*>(mapped)};
  return remote_id;
}

BatchId UcxTransport::new_batch(PeerId peer) {
  const BatchId id = next_id_++;
  batches_[id].peer = peer;
  peers_.at(peer).open_batches.push_back(id);
  return id;
}

StatusOr<BatchId> UcxTransport::post(const TransferBatch& request) {
  std::unique_lock<std::mutex> lock(mu_);
  auto pit = peers_.find(request.peer);
  if (pit == peers_.end()) return absl::NotFoundError(absl::StrCat("no peer ", request.peer));
  Peer& peer = pit->second;
  if (!peer.error.ok()) return absl::UnavailableError(std::string(peer.error.message()));

  // Validate everything first, so that a bad op never leaves half a batch in flight. The batch
  // is copied here directly when every op can be: host memory on both sides, the peer's region
  // mapped into this process.
  bool direct = options_.direct_copy;
  resolved_ops_.clear();
  for (size_t i = 0; i < request.ops.size(); ++i) {
    const TransferOp& op = request.ops[i];
    auto lit = regions_.find(op.local);
    if (lit == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("op ", i, ": no local region ", op.local));
    }
    auto rit = peer.remotes.find(op.remote);
    if (rit == peer.remotes.end()) {
      return absl::NotFoundError(absl::StrCat("op ", i, ": no remote region ", op.remote,
                                              " for peer ", request.peer));
    }
    if (op.length == 0) return absl::InvalidArgumentError(absl::StrCat("op ", i, ": length 0"));
    if (!in_bounds(op.local_offset, op.length, lit->second.length)) {
      return absl::OutOfRangeError(absl::StrCat("op ", i, ": local [", op.local_offset, ", +",
                                                op.length, ") outside region of ",
                                                lit->second.length, " bytes"));
    }
    if (!in_bounds(op.remote_offset, op.length, rit->second.length)) {
      return absl::OutOfRangeError(absl::StrCat("op ", i, ": remote [", op.remote_offset, ", +",
                                                op.length, ") outside region of ",
                                                rit->second.length, " bytes"));
    }
    direct = direct && lit->second.kind == MemoryKind::kHost && rit->second.mapped != nullptr;
    resolved_ops_.push_back({&lit->second, &rit->second});
  }

  const BatchId id = new_batch(request.peer);
  Batch& batch = batches_.at(id);
  if (direct) {
    copy_directly(id, request);
    run_callbacks(lock);
    return id;
  }
  for (size_t i = 0; i < request.ops.size(); ++i) {
    const TransferOp& op = request.ops[i];
    const Region& local = *resolved_ops_[i].local;
    const RemoteRegion& remote = *resolved_ops_[i].remote;
    auto* ctx = new OpContext{this, id, op.opcode, op.length, false};
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxTransport::on_op_done;
    param.user_data = ctx;
    void* laddr = reinterpret_cast<void*>(local.addr + op.local_offset);
    const uint64_t raddr = remote.addr + op.remote_offset;
    ucs_status_ptr_t req =
        op.opcode == OpCode::kPut
            ? ucp_put_nbx(peer.ep, laddr, op.length, raddr, remote.rkey, &param)
            : ucp_get_nbx(peer.ep, laddr, op.length, raddr, remote.rkey, &param);
    ++counters_.ops_posted;
    track_request(req, ctx);
    if (batch.state == BatchState::kError) break;  // The endpoint refused; stop feeding it.
  }
  batch.posting = false;
  const bool in_flight = batch.pending > 0;
  maybe_finish(id, batch, EndedBy::kPostingCall);
  if (in_flight) {
    work_posted_ = true;
    cv_.notify_all();
  }
  run_callbacks(lock);
  return id;
}

void UcxTransport::copy_directly(BatchId id, const TransferBatch& request) {
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < request.ops.size(); ++i) {
    const TransferOp& op = request.ops[i];
    auto* local = reinterpret_cast<uint8_t*>(resolved_ops_[i].local->addr) + op.local_offset;
    uint8_t* remote = resolved_ops_[i].remote->mapped + op.remote_offset;
    if (op.opcode == OpCode::kPut) {
      stream_copy(remote, local, op.length);  // The peer reads these lines next, not us.
      counters_.bytes_put += op.length;
    } else {
      std::memcpy(local, remote, op.length);
      counters_.bytes_got += op.length;
    }
  }
  // The copies are remotely complete now: a peer told of them afterwards (over any channel)
  // must see them, so order them (the streaming stores too) before whatever this thread sends
  // next.
  stream_fence();
  std::atomic_thread_fence(std::memory_order_release);
  counters_.direct_copy_ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  counters_.ops_posted += request.ops.size();
  counters_.ops_completed += request.ops.size();
  counters_.ops_copied_directly += request.ops.size();
  Batch& batch = batches_.at(id);
  batch.posting = false;
  maybe_finish(id, batch, EndedBy::kPostingCall);
}

StatusOr<BatchId> UcxTransport::flush(PeerId id) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return absl::NotFoundError(absl::StrCat("no peer ", id));
  Peer& peer = it->second;
  if (!peer.error.ok()) return absl::UnavailableError(std::string(peer.error.message()));
  const BatchId batch_id = new_batch(id);
  auto* ctx = new OpContext{this, batch_id, OpCode::kPut, 0, true};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxTransport::on_op_done;
  param.user_data = ctx;
  ++counters_.flushes;
  track_request(ucp_ep_flush_nbx(peer.ep, &param), ctx);
  Batch& batch = batches_.at(batch_id);
  batch.posting = false;
  const bool in_flight = batch.pending > 0;
  maybe_finish(batch_id, batch, EndedBy::kPostingCall);
  if (in_flight) {
    work_posted_ = true;
    cv_.notify_all();
  }
  run_callbacks(lock);
  return batch_id;
}

void UcxTransport::track_request(ucs_status_ptr_t request, OpContext* ctx) {
  if (request == nullptr) {
    complete_op(*ctx, UCS_OK);
    delete ctx;
  } else if (UCS_PTR_IS_ERR(request)) {
    complete_op(*ctx, UCS_PTR_STATUS(request));
    delete ctx;
  } else {
    Batch& batch = batches_.at(ctx->batch);
    ++batch.pending;  // on_op_done owns ctx from now on.
    ++peers_.at(batch.peer).inflight;
    ++inflight_;
    ++inflight_live_;
  }
}

void UcxTransport::on_op_done(void* request, ucs_status_t status, void* user_data) {
  // UCX calls this from inside a worker call, which always runs under mu_.
  auto* ctx = static_cast<OpContext*>(user_data);
  UcxTransport* self = ctx->self;
  Batch& batch = self->batches_.at(ctx->batch);
  --batch.pending;
  Peer& peer = self->peers_.at(batch.peer);
  --peer.inflight;
  --self->inflight_;
  if (peer.error.ok()) --self->inflight_live_;
  self->complete_op(*ctx, status);
  ucp_request_free(request);
  delete ctx;
}

void UcxTransport::complete_op(const OpContext& op, ucs_status_t status) {
  Batch& batch = batches_.at(op.batch);
  if (status == UCS_OK) {
    if (!op.is_flush) {
      ++counters_.ops_completed;
      (op.opcode == OpCode::kPut ? counters_.bytes_put : counters_.bytes_got) += op.length;
    }
  } else {
    if (!op.is_flush) ++counters_.ops_failed;
    if (batch.state == BatchState::kInProgress) {
      batch.state = BatchState::kError;
      batch.error = op.is_flush ? absl::StrCat("flush failed: ", ucs_status_string(status))
                                : absl::StrCat(op.opcode == OpCode::kPut ? "put" : "get", " of ",
                                               op.length, " bytes failed: ",
                                               ucs_status_string(status));
      batch_ended();
    }
  }
  maybe_finish(op.batch, batch, EndedBy::kCompletion);
}

void UcxTransport::maybe_finish(BatchId id, Batch& batch, EndedBy by) {
  if (batch.posting || batch.pending > 0) return;
  if (batch.state == BatchState::kInProgress) {
    batch.state = BatchState::kDone;
    // Ended inside post()/flush(): its caller finds it done, so nobody is woken for it (one
    // futex wake of the progress thread and one wake-fd write per layer of a directly copied
    // push, which took a quarter of a 16-token request's time).
    if (by == EndedBy::kCompletion) batch_ended();
  }
  if (auto pit = peers_.find(batch.peer); pit != peers_.end()) {
    auto& open = pit->second.open_batches;
    open.erase(std::remove(open.begin(), open.end(), id), open.end());
  }
  if (batch.released) batches_.erase(id);
}

void UcxTransport::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  // Only queued: the endpoint is closed later, in progress_locked(), because UCX must not be
  // re-entered from its own callback. failed_mu_ rather than mu_, in case UCX calls this from
  // its async thread while a worker call holds mu_.
  auto* self = static_cast<UcxTransport*>(arg);
  std::lock_guard<std::mutex> lock(self->failed_mu_);
  self->failed_eps_.emplace_back(ep, status);
}

void UcxTransport::fail_peer(PeerId id, Peer& peer, const Status& error) {
  peer.error = error;
  ++counters_.peer_failures;
  // Requests of a failed peer may never complete (endpoints without peer error handling keep
  // them): the progress thread stops treating them as work in flight.
  inflight_live_ -= peer.inflight;
  if (!stop_) {
    PD_LOG_WARN("{}: peer {} failed: {}", options_.name, id, std::string(error.message()));
  }
  for (BatchId bid : peer.open_batches) {
    Batch& batch = batches_.at(bid);
    if (batch.state == BatchState::kInProgress) {
      batch.state = BatchState::kError;
      batch.error = std::string(error.message());
    }
  }
  peer.open_batches.clear();
  batch_ended();
  // Remote keys go before the endpoint they were unpacked on (UCX requires that order).
  for (auto& [rid, remote] : peer.remotes) ucp_rkey_destroy(remote.rkey);
  peer.remotes.clear();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(peer.ep, &param);
  if (UCS_PTR_IS_PTR(req)) closing_eps_.push_back(req);
  peer.ep = nullptr;
  pending_callbacks_.emplace_back(id, error);
}

unsigned UcxTransport::progress_locked() {
  unsigned events = ucp_worker_progress(worker_);
  std::vector<std::pair<ucp_ep_h, ucs_status_t>> failed;
  {
    std::lock_guard<std::mutex> lock(failed_mu_);
    failed.swap(failed_eps_);
  }
  if (!failed.empty()) {
    for (const auto& [ep, status] : failed) {
      for (auto& [id, peer] : peers_) {
        if (peer.ep == ep && peer.error.ok()) {
          fail_peer(id, peer,
                    absl::UnavailableError(absl::StrCat("peer endpoint failed: ",
                                                        ucs_status_string(status))));
        }
      }
    }
    events += failed.size();
  }
  for (auto it = closing_eps_.begin(); it != closing_eps_.end();) {
    if (ucp_request_check_status(*it) != UCS_INPROGRESS) {
      ucp_request_free(*it);
      it = closing_eps_.erase(it);
    } else {
      ++it;
    }
  }
  return events;
}

void UcxTransport::run_callbacks(std::unique_lock<std::mutex>& lock) {
  if (pending_callbacks_.empty()) return;
  auto calls = std::move(pending_callbacks_);
  pending_callbacks_.clear();
  PeerErrorCallback callback = peer_error_callback_;
  if (!callback) return;
  lock.unlock();
  for (const auto& [peer, error] : calls) callback(peer, error);
  lock.lock();
}

unsigned UcxTransport::progress() {
  std::unique_lock<std::mutex> lock(mu_);
  const unsigned events = progress_locked();
  run_callbacks(lock);
  return events;
}

void UcxTransport::progress_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  Duration sleep{0};
  while (!stop_) {
    const unsigned events = progress_locked();
    run_callbacks(lock);
    if (events > 0) {
      sleep = Duration{0};
      // Let posting threads in between bursts of events.
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
      continue;
    }
    const bool busy = inflight_live_ > 0 || !closing_eps_.empty() || remote_ops_expected_;
    // Back off exponentially while idle; short sleeps while our own requests are in flight.
    const Duration cap = busy ? kMaxBusySleep : kMaxIdleSleep;
    sleep = std::min(cap, std::max(Duration(std::chrono::microseconds(5)), sleep * 2));
    cv_.wait_for(lock, sleep, [this] { return stop_ || work_posted_; });
    if (work_posted_) sleep = Duration{0};
    work_posted_ = false;
  }
}

StatusOr<BatchStatus> UcxTransport::batch_status(BatchId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = batches_.find(id);
  if (it == batches_.end() || it->second.released) {
    return absl::NotFoundError(absl::StrCat("no batch ", id));
  }
  return BatchStatus{it->second.state, it->second.error};
}

Status UcxTransport::wait(BatchId id, Duration timeout) {
  const TimePoint deadline = options_.clock->now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto it = batches_.find(id);
    if (it == batches_.end() || it->second.released) {
      return absl::NotFoundError(absl::StrCat("no batch ", id));
    }
    if (it->second.state == BatchState::kDone) return absl::OkStatus();
    if (it->second.state == BatchState::kError) {
      return absl::UnavailableError(it->second.error);
    }
    const TimePoint now = options_.clock->now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("batch ", id, " still in progress"));
    }
    if (options_.progress_thread) {
      cv_.wait_for(lock, std::min<Duration>(deadline - now, std::chrono::milliseconds(1)));
    } else if (progress_locked() == 0) {
      run_callbacks(lock);
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      run_callbacks(lock);
    }
  }
}

Status UcxTransport::release_batch(BatchId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = batches_.find(id);
  if (it == batches_.end() || it->second.released) {
    return absl::NotFoundError(absl::StrCat("no batch ", id));
  }
  Batch& batch = it->second;
  if (batch.pending == 0 && !batch.posting) {
    if (auto pit = peers_.find(batch.peer); pit != peers_.end()) {
      auto& open = pit->second.open_batches;
      open.erase(std::remove(open.begin(), open.end(), id), open.end());
    }
    batches_.erase(it);
  } else {
    batch.released = true;  // Erased by maybe_finish when its last request completes.
  }
  return absl::OkStatus();
}

void UcxTransport::set_peer_error_callback(PeerErrorCallback callback) {
  std::lock_guard<std::mutex> lock(mu_);
  peer_error_callback_ = std::move(callback);
}

void UcxTransport::set_activity_callback(std::function<void()> callback) {
  std::lock_guard<std::mutex> lock(mu_);
  activity_callback_ = std::move(callback);
}

void UcxTransport::expect_remote_ops(bool expected) {
  std::lock_guard<std::mutex> lock(mu_);
  if (expected && !remote_ops_expected_) {
    work_posted_ = true;  // Ends an idle sleep now: the first op may already be on its way.
    cv_.notify_all();
  }
  remote_ops_expected_ = expected;
}

void UcxTransport::batch_ended() {
  cv_.notify_all();
  if (activity_callback_) activity_callback_();
}

TransportCounters UcxTransport::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

StatusOr<std::string> UcxTransport::endpoint_info(PeerId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return absl::NotFoundError(absl::StrCat("no peer ", id));
  if (it->second.ep == nullptr) return absl::UnavailableError("endpoint closed");
  char* buf = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buf, &size);
  if (stream == nullptr) return absl::InternalError("open_memstream failed");
  ucp_ep_print_info(it->second.ep, stream);
  std::fclose(stream);
  std::string out = absl::StrCat("peer failure detection by UCX: ",
                                 it->second.detects_failure ? "yes" : "no (control channel)",
                                 "\n", std::string(buf, size));
  std::free(buf);
  return out;
}

}  // namespace pdserve::kvtransfer
