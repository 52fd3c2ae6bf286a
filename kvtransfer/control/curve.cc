#include "kvtransfer/control/curve.h"

#include <iterator>
#include <vector>

#include <zmq_addon.hpp>

#include "absl/strings/ascii.h"

#include "common/logging.h"

namespace pdserve::kvtransfer {

StatusOr<CurveKey> parse_curve_key(std::string_view secret_z85) {
  const std::string secret(absl::StripAsciiWhitespace(absl::string_view(secret_z85.data(), secret_z85.size())));
  if (secret.size() != 40)
    return absl::InvalidArgumentError(absl::StrCat("a kvtransfer key is 40 Z85 characters, not ", secret.size(),
                                                   " (make one with `pdserve kv-keygen`)"));
  CurveKey key;
  key.secret_z85 = secret;
  char public_z85[41] = {};
  if (zmq_curve_public(public_z85, secret.c_str()) != 0)
    return absl::InvalidArgumentError("the kvtransfer key is not Z85 text (make one with `pdserve kv-keygen`)");
  key.public_z85 = public_z85;
  key.public_raw.resize(32);
  if (zmq_z85_decode(reinterpret_cast<uint8_t*>(key.public_raw.data()), public_z85) == nullptr)
    return absl::InternalError("cannot decode the derived public key");
  return key;
}

StatusOr<std::string> new_curve_secret() {
  char public_z85[41] = {}, secret_z85[41] = {};
  if (zmq_curve_keypair(public_z85, secret_z85) != 0)
    return absl::UnimplementedError("this libzmq has no CURVE support (built without libsodium)");
  return std::string(secret_z85);
}

void apply_curve(zmq::socket_t& socket, const CurveKey& key, bool server) {
  if (server) {
    socket.set(zmq::sockopt::curve_server, 1);
  } else {
    socket.set(zmq::sockopt::curve_serverkey, key.public_z85);
    socket.set(zmq::sockopt::curve_publickey, key.public_z85);
  }
  socket.set(zmq::sockopt::curve_secretkey, key.secret_z85);
}

ZapHandler::ZapHandler(zmq::context_t& context, CurveKey key)
    : key_(std::move(key)), socket_(context, zmq::socket_type::rep) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");  // The endpoint libzmq asks (RFC 27).
}

void ZapHandler::answer() {
  std::vector<zmq::message_t> frames;
  while (zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
    // version, request id, domain, address, identity, mechanism, credentials...
    const bool well_formed = frames.size() >= 6 && frames[0].to_string_view() == "1.0";
    const bool admitted = well_formed && frames[5].to_string_view() == "CURVE" && frames.size() == 7 &&
                          frames[6].to_string_view() == key_.public_raw;
    if (!admitted) {
      ++refused_;
      PD_LOG_WARN("kvtransfer control: refused a connection from {} without the cluster's kvtransfer key",
                  frames.size() > 3 ? frames[3].to_string() : std::string("?"));
    }
    std::vector<zmq::const_buffer> reply{zmq::str_buffer("1.0"),
                                         zmq::buffer(frames.size() > 1 ? frames[1].to_string_view() : ""),
                                         admitted ? zmq::str_buffer("200") : zmq::str_buffer("400"),
                                         admitted ? zmq::str_buffer("OK") : zmq::str_buffer("not the cluster key"),
                                         zmq::str_buffer(""), zmq::str_buffer("")};
    (void)zmq::send_multipart(socket_, reply);
    frames.clear();
  }
}

}  // namespace pdserve::kvtransfer
