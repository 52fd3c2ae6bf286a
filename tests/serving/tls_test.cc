// common/tls: what the TLS flags accept (a certificate with its key, a CA only with them, files
// that parse and match), and the credentials they make, over real handshakes on loopback: the
// router's port takes clients with or without a certificate but its Registry service only
// workers with one the CA signed; a worker's port takes only clients with such a certificate.
#include "common/tls.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "router/registry_service.h"
#include "router/worker_registry.h"
#include "tests/serving/test_pki.h"

namespace pdserve {
namespace {

using testing::TestPki;

// InvalidArgument whose message holds `part`.
void expect_refused(const StatusOr<TlsConfig>& tls, const std::string& part) {
  ASSERT_FALSE(tls.ok()) << part;
  EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tls.status().message().find(part), std::string::npos) << tls.status().message();
}

TEST(TlsFlags, PartialUnreadableOrMismatchedFilesAreRefused) {
  TestPki pki;
  ASSERT_TRUE(pki.ok()) << "the openssl CLI made no certificates (scripts/setup.sh installs it)";
  expect_refused(load_tls({pki.cert(), "", ""}), "--tls-cert and --tls-key go together");
  expect_refused(load_tls({"", pki.key(), pki.ca()}), "--tls-cert and --tls-key go together");
  expect_refused(load_tls({"", "", pki.ca()}), "--tls-ca needs --tls-cert and --tls-key");
  expect_refused(load_tls({pki.file("missing.crt"), pki.key(), ""}), "--tls-cert: cannot read");
  expect_refused(load_tls({pki.cert(), pki.file("missing.key"), ""}), "--tls-key: cannot read");
  expect_refused(load_tls({pki.cert(), pki.key(), pki.file("missing.crt")}), "--tls-ca: cannot read");
  expect_refused(load_tls({pki.key(), pki.key(), ""}), "holds no PEM certificate");
  expect_refused(load_tls({pki.cert(), pki.cert(), ""}), "no unencrypted PEM private key");
  expect_refused(load_tls({pki.cert(), pki.rogue_key(), ""}), "the key is not the certificate's");
  expect_refused(load_tls({pki.cert(), pki.key(), pki.key()}), "--tls-ca: " + pki.key() + " holds no PEM certificate");

  auto none = load_tls({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->mode, TlsMode::kPlaintext);
  auto server = load_tls({pki.cert(), pki.key(), ""});
  ASSERT_TRUE(server.ok()) << server.status().message();
  EXPECT_EQ(server->mode, TlsMode::kServer);
  auto mutual = load_tls({pki.cert(), pki.key(), pki.ca()});
  ASSERT_TRUE(mutual.ok()) << mutual.status().message();
  EXPECT_EQ(mutual->mode, TlsMode::kMutual);
  EXPECT_NE(mutual->ca_pem.find("BEGIN CERTIFICATE"), std::string::npos);

  EXPECT_FALSE(load_client_tls(false, "")->enabled);
  EXPECT_TRUE(load_client_tls(true, "")->enabled);
  auto client = load_client_tls(false, pki.ca());
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(client->enabled);  // --tls-ca implies TLS.
  EXPECT_EQ(client->ca_file, pki.ca());
  EXPECT_FALSE(load_client_tls(false, pki.file("missing.crt")).ok());
  EXPECT_FALSE(load_client_tls(false, pki.key()).ok());
}

// A Registry service on loopback with the given credentials.
class RegistryServer {
 public:
  RegistryServer(const std::shared_ptr<grpc::ServerCredentials>& credentials, bool require_client_certificate)
      : registry_({}, {}, clock_),
        service_(registry_, {"stories260K"}, router::KvMode::kPush, {}, require_client_certificate) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", credentials, &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
  }
  // Register over a channel with `credentials` to 127.0.0.1 (its certificate is checked
  // against `server_name` when one is given).
  grpc::Status register_with(const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                             const std::string& server_name = "") {
    grpc::ChannelArguments args;
    if (!server_name.empty()) args.SetSslTargetNameOverride(server_name);
    auto stub =
        worker::Registry::NewStub(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_), credentials, args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    worker::RegisterRequest req;
    req.set_address("127.0.0.1:2001");
    req.set_role(worker::ROLE_DECODE);
    worker::RegisterResponse resp;
    return stub->Register(&ctx, req, &resp);
  }
  bool started() const { return server_ != nullptr && port_ != 0; }

 private:
  FakeClock clock_;
  router::WorkerRegistry registry_;
  router::RegistryService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// TLS trusting the test CA, presenting `cert` and `key` when given.
std::shared_ptr<grpc::ChannelCredentials> tls_client(const TestPki& pki, const std::string& cert = "",
                                                     const std::string& key = "") {
  TlsConfig c = *load_tls({cert.empty() ? pki.cert() : cert, key.empty() ? pki.key() : key, pki.ca()});
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = c.ca_pem;
  if (!cert.empty()) {
    o.pem_cert_chain = c.cert_pem;
    o.pem_private_key = c.key_pem;
  }
  return grpc::SslCredentials(o);
}

TEST(TlsCredentials, TheRoutersRegistryTakesOnlyWorkersWithACertificateOfTheCa) {
  TestPki pki;
  ASSERT_TRUE(pki.ok());
  auto tls = load_tls({pki.cert(), pki.key(), pki.ca()});
  ASSERT_TRUE(tls.ok()) << tls.status().message();
  RegistryServer router(server_credentials(*tls, ClientCerts::kOptional), /*require_client_certificate=*/true);
  ASSERT_TRUE(router.started());
  // Plaintext does not get through the handshake.
  EXPECT_EQ(router.register_with(grpc::InsecureChannelCredentials()).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A client without a certificate connects (end users do), but may not register.
  const grpc::Status anonymous = router.register_with(tls_client(pki));
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED) << anonymous.error_message();
  EXPECT_NE(anonymous.error_message().find("--tls-ca"), std::string::npos) << anonymous.error_message();
  // A certificate another CA signed is refused in the handshake.
  EXPECT_EQ(router.register_with(tls_client(pki, pki.rogue_cert(), pki.rogue_key())).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // The worker's credentials (the CA's certificate) register.
  const grpc::Status worker = router.register_with(peer_channel_credentials(*tls));
  EXPECT_TRUE(worker.ok()) << worker.error_message();
}

TEST(TlsCredentials, AWorkersPortTakesOnlyClientsWithACertificateOfTheCaUnderTheNameExpected) {
  TestPki pki;
  ASSERT_TRUE(pki.ok());
  auto tls = load_tls({pki.cert(), pki.key(), pki.ca()});
  ASSERT_TRUE(tls.ok()) << tls.status().message();
  RegistryServer worker(server_credentials(*tls, ClientCerts::kRequired), /*require_client_certificate=*/false);
  ASSERT_TRUE(worker.started());
  EXPECT_EQ(worker.register_with(grpc::InsecureChannelCredentials()).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(worker.register_with(tls_client(pki)).error_code(), grpc::StatusCode::UNAVAILABLE);  // No certificate.
  EXPECT_EQ(worker.register_with(tls_client(pki, pki.rogue_cert(), pki.rogue_key())).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  const grpc::Status router = worker.register_with(peer_channel_credentials(*tls));
  EXPECT_TRUE(router.ok()) << router.error_message();
  // The name checked may differ from the address dialed (--tls-worker-name), and must be the
  // certificate's.
  EXPECT_TRUE(worker.register_with(peer_channel_credentials(*tls), "localhost").ok());
  EXPECT_EQ(worker.register_with(peer_channel_credentials(*tls), "pdserve-worker").error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace pdserve
