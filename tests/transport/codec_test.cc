// Unit tests of the control-channel envelope codec: round trips, and refusal (never a crash) of
// oversized, malformed, truncated, unknown-version, unknown-type and incomplete messages.
#include <string>

#include <gtest/gtest.h>

#include "engine/kv_spec.h"
#include "kvtransfer/control/codec.h"
#include "kvtransfer/control/compat.h"

namespace pdserve::kvtransfer {
namespace {

proto::Envelope handshake_envelope() {
  proto::Envelope e;
  auto* h = e.mutable_handshake();
  h->set_compat_hash(0x1234567890abcdefULL);
  h->set_role(proto::ROLE_PREFILL);
  h->set_tp_size(4);
  h->set_rank(3);
  h->set_worker_address(std::string(200, 'w'));
  auto* r = h->add_regions();
  r->set_name("kv");
  r->set_blob(std::string(64, 'k'));
  h->set_geometry("2 layers");
  h->mutable_arena()->set_num_blocks(8);
  h->mutable_arena()->set_arena_bytes(1 << 20);
  h->mutable_arena()->set_spec_fingerprint(0xfeedULL);
  return e;
}

bool same(const proto::Envelope& a, const proto::Envelope& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

TEST(CodecTest, RoundTripsEveryMessageType) {
  std::vector<proto::Envelope> all;
  all.push_back(handshake_envelope());
  {
    proto::Envelope e;
    auto* a = e.mutable_handshake_ack();
    a->set_accepted(true);
    a->set_role(proto::ROLE_DECODE);
    a->set_tp_size(2);
    a->set_rank(1);
    a->set_worker_address("addr");
    all.push_back(e);
  }
  {
    proto::Envelope e;
    e.mutable_handshake_ack()->set_error("incompatible KV geometry: x");
    all.push_back(e);
  }
  {
    proto::Envelope e;
    auto* w = e.mutable_write_done();
    w->set_request_id("r1");
    w->set_producer_rank(1);
    w->set_consumer_rank(5);
    w->set_sealed_count(96);
    w->set_first_token(7);
    w->add_producer_blocks(3);
    w->add_producer_blocks(1);
    w->add_block_checksums(0xcbf29ce484222325ULL);
    w->add_block_checksums(1);
    all.push_back(e);
  }
  {
    proto::Envelope e;
    auto* c = e.mutable_checksum_request();
    c->set_request_id("r1");
    c->set_consumer_rank(1);
    c->set_consumer_tp(2);
    c->set_producer_rank(0);
    c->add_consumer_blocks(6);
    all.push_back(e);
  }
  {
    proto::Envelope e;
    auto* b = e.mutable_block_checksums();
    b->set_request_id("r1");
    b->set_producer_rank(0);
    b->set_consumer_rank(1);
    b->add_checksums(42);
    all.push_back(e);
  }
  {
    proto::Envelope e;
    auto* r = e.mutable_release();
    r->set_request_id("r1");
    r->set_consumer_rank(7);
    r->set_consumer_tp(8);
    r->set_producer_rank(3);
    all.push_back(e);
  }
  {
    proto::Envelope e;
    e.mutable_abort()->set_request_id("r1");
    e.mutable_abort()->set_reason("lease expired");
    all.push_back(e);
  }
  {
    proto::Envelope e;
    e.mutable_heartbeat();
    all.push_back(e);
  }
  for (const auto& e : all) {
    auto decoded = decode_envelope(encode_envelope(e));
    ASSERT_TRUE(decoded.ok()) << message_type_name(e) << ": " << decoded.status();
    EXPECT_EQ(decoded->version(), kControlProtocolVersion);
    EXPECT_EQ(decoded->body_case(), e.body_case());
    proto::Envelope expected = e;
    expected.set_version(kControlProtocolVersion);
    EXPECT_TRUE(same(*decoded, expected)) << message_type_name(e);
  }
}

TEST(CodecTest, FirstTokenIsOptional) {
  proto::Envelope e;
  e.mutable_write_done()->set_request_id("r");
  auto decoded = decode_envelope(encode_envelope(e));
  ASSERT_TRUE(decoded.ok());
  EXPECT_FALSE(decoded->write_done().has_first_token());
}

TEST(CodecTest, RefusesOversized) {
  proto::Envelope e = handshake_envelope();
  const std::string bytes = encode_envelope(e);
  auto refused = decode_envelope(bytes, bytes.size() - 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(decode_envelope(bytes, bytes.size()).ok());

  e.mutable_handshake()->set_worker_address(std::string(kDefaultMaxMessageBytes, 'x'));
  EXPECT_EQ(decode_envelope(encode_envelope(e)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(CodecTest, RefusesMalformed) {
  for (std::string junk : {std::string("\xff\xff\xff\xff", 4), std::string("\x0a\x7f", 2),
                           std::string("hello world"), std::string(1, '\x00')}) {
    auto decoded = decode_envelope(junk);
    EXPECT_FALSE(decoded.ok()) << "accepted junk of " << junk.size() << " bytes";
  }
}

TEST(CodecTest, RefusesTruncated) {
  const std::string bytes = encode_envelope(handshake_envelope());
  // Cut inside the worker address.
  auto decoded = decode_envelope(std::string_view(bytes).substr(0, bytes.size() / 2));
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(decode_envelope("").status().code() == absl::StatusCode::kInvalidArgument);
}

TEST(CodecTest, NoPrefixDecodesAsTheWholeMessage) {
  const proto::Envelope original = handshake_envelope();
  const std::string bytes = encode_envelope(original);
  proto::Envelope full = original;
  full.set_version(kControlProtocolVersion);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto decoded = decode_envelope(std::string_view(bytes).substr(0, n));
    if (decoded.ok()) {
      EXPECT_FALSE(same(*decoded, full)) << "prefix " << n;
    }
  }
}

TEST(CodecTest, RefusesUnknownVersion) {
  proto::Envelope e;
  e.mutable_heartbeat();
  e.set_version(kControlProtocolVersion + 1);
  auto decoded = decode_envelope(e.SerializeAsString());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("version"), absl::string_view::npos);
  e.clear_version();  // A sender that sets no version at all.
  EXPECT_FALSE(decode_envelope(e.SerializeAsString()).ok());
}

TEST(CodecTest, RefusesUnknownMessageType) {
  // The current version, then field 99 (varint 1): a message type from a newer build.
  const char version = static_cast<char>(kControlProtocolVersion);
  const std::string bytes{'\x08', version, '\x98', '\x06', '\x01'};
  auto decoded = decode_envelope(bytes);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("unknown"), absl::string_view::npos);
  EXPECT_FALSE(decode_envelope(std::string{'\x08', version}).ok());  // No body at all.
}

TEST(CodecTest, RefusesMessagesMissingRequiredFields) {
  proto::Envelope bad_rank = handshake_envelope();
  bad_rank.mutable_handshake()->set_rank(4);
  EXPECT_FALSE(decode_envelope(encode_envelope(bad_rank)).ok());
  proto::Envelope no_address = handshake_envelope();
  no_address.mutable_handshake()->clear_worker_address();
  EXPECT_FALSE(decode_envelope(encode_envelope(no_address)).ok());
  proto::Envelope no_role = handshake_envelope();
  no_role.mutable_handshake()->set_role(proto::ROLE_UNSPECIFIED);
  EXPECT_FALSE(decode_envelope(encode_envelope(no_role)).ok());
  proto::Envelope write_done;
  write_done.mutable_write_done()->set_sealed_count(3);
  EXPECT_FALSE(decode_envelope(encode_envelope(write_done)).ok());
  proto::Envelope release;
  release.mutable_release()->set_request_id("r");
  EXPECT_FALSE(decode_envelope(encode_envelope(release)).ok());  // consumer_tp 0.
  proto::Envelope refusal;
  refusal.mutable_handshake_ack()->set_accepted(false);
  EXPECT_FALSE(decode_envelope(encode_envelope(refusal)).ok());  // No reason given.
  proto::Envelope abort;
  abort.mutable_abort()->set_reason("x");
  EXPECT_FALSE(decode_envelope(encode_envelope(abort)).ok());
  proto::Envelope ask;
  ask.mutable_checksum_request()->set_request_id("r");
  ask.mutable_checksum_request()->set_consumer_tp(2);
  ask.mutable_checksum_request()->set_consumer_rank(2);
  EXPECT_FALSE(decode_envelope(encode_envelope(ask)).ok());  // Rank not below the TP.
  proto::Envelope sums;
  sums.mutable_block_checksums()->add_checksums(1);
  EXPECT_FALSE(decode_envelope(encode_envelope(sums)).ok());  // No request id.
}

TEST(CompatHashTest, DependsOnModelAndEveryGeometryField) {
  engine::KvCacheSpec spec;
  engine::LayerKvSpec layer;
  layer.num_kv_heads = 8;
  layer.head_dim = 128;
  layer.v_head_dim = 128;
  spec.layers = {layer, layer};
  const uint64_t base = compat_hash("m", spec);
  EXPECT_EQ(base, compat_hash("m", spec));
  EXPECT_NE(base, compat_hash("n", spec));
  engine::KvCacheSpec other = spec;
  other.block_size = 32;
  EXPECT_NE(base, compat_hash("m", other));
  other = spec;
  other.layers[1].dtype = engine::DType::kBF16;
  EXPECT_NE(base, compat_hash("m", other));
  other = spec;
  other.layers[1].layout = engine::KvLayout::kInterleaved;  // Only the second layer differs.
  EXPECT_NE(base, compat_hash("m", other));
}

}  // namespace
}  // namespace pdserve::kvtransfer
