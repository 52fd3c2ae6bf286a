#include "common/tls.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace pdserve {
namespace {

// OpenSSL's most recent error, for a message; the queue is cleared.
std::string openssl_error() {
  const unsigned long e = ERR_peek_last_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

// A PEM file's contents; `flag` names it in the error.
StatusOr<std::string> read_pem_file(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

std::unique_ptr<BIO, BioFree> memory_bio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), int(pem.size())));
}

// Every certificate in `pem`, in order; empty when it holds none.
std::vector<X509Ptr> parse_certificates(const std::string& pem) {
  std::vector<X509Ptr> out;
  auto bio = memory_bio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  ERR_clear_error();  // The end of the input reads as an error.
  return out;
}

// A key file is never encrypted here: a process started by Kubernetes has nobody to ask for a
// passphrase (OpenSSL's default would prompt on the terminal).
int no_passphrase(char*, int, int, void*) { return 0; }

}  // namespace

StatusOr<TlsConfig> load_tls(const TlsFiles& files) {
  TlsConfig tls;
  if (files.cert.empty() && files.key.empty()) {
    if (!files.ca.empty())
      return absl::InvalidArgumentError("--tls-ca needs --tls-cert and --tls-key (the certificate shown to the peers)");
    return tls;
  }
  if (files.cert.empty() || files.key.empty())
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  PD_ASSIGN_OR_RETURN(tls.cert_pem, read_pem_file("--tls-cert", files.cert));
  PD_ASSIGN_OR_RETURN(tls.key_pem, read_pem_file("--tls-key", files.key));
  tls.mode = TlsMode::kServer;
  if (!files.ca.empty()) {
    PD_ASSIGN_OR_RETURN(tls.ca_pem, read_pem_file("--tls-ca", files.ca));
    if (parse_certificates(tls.ca_pem).empty())
      return absl::InvalidArgumentError(absl::StrCat("--tls-ca: ", files.ca, " holds no PEM certificate"));
    tls.mode = TlsMode::kMutual;
  }
  // The HTTPS server's own setup checks the certificate and the key, and that they match.
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_server_method()));
  if (!ctx) return absl::InternalError(absl::StrCat("TLS: ", openssl_error()));
  if (Status s = configure_ssl_server(*ctx, tls); !s.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " (--tls-cert ", files.cert, ", --tls-key ", files.key, ")"));
  return tls;
}

Status configure_ssl_server(SSL_CTX& ctx, const TlsConfig& tls) {
  std::vector<X509Ptr> chain = parse_certificates(tls.cert_pem);
  if (chain.empty()) return absl::InvalidArgumentError("the certificate file holds no PEM certificate");
  if (SSL_CTX_use_certificate(&ctx, chain.front().get()) != 1)
    return absl::InvalidArgumentError(absl::StrCat("unusable certificate: ", openssl_error()));
  for (size_t i = 1; i < chain.size(); ++i) {
    if (SSL_CTX_add1_chain_cert(&ctx, chain[i].get()) != 1)
      return absl::InvalidArgumentError(absl::StrCat("unusable chain certificate: ", openssl_error()));
  }
  auto bio = memory_bio(tls.key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  if (!key)
    return absl::InvalidArgumentError(
        absl::StrCat("the key file holds no unencrypted PEM private key: ", openssl_error()));
  if (SSL_CTX_use_PrivateKey(&ctx, key.get()) != 1 || SSL_CTX_check_private_key(&ctx) != 1)
    return absl::InvalidArgumentError(absl::StrCat("the key is not the certificate's: ", openssl_error()));
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsConfig& tls, ClientCerts client_certs) {
  if (tls.mode == TlsMode::kPlaintext) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  if (tls.mode == TlsMode::kMutual) {
    options.pem_root_certs = tls.ca_pem;
    options.client_certificate_request = client_certs == ClientCerts::kRequired
                                             ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                             : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> peer_channel_credentials(const TlsConfig& tls) {
  if (tls.mode != TlsMode::kMutual) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca_pem;
  options.pem_private_key = tls.key_pem;
  options.pem_cert_chain = tls.cert_pem;
  return grpc::SslCredentials(options);
}

StatusOr<ClientTls> load_client_tls(bool tls, const std::string& ca_file) {
  ClientTls out;
  out.enabled = tls || !ca_file.empty();
  if (ca_file.empty()) return out;
  PD_ASSIGN_OR_RETURN(out.ca_pem, read_pem_file("--tls-ca", ca_file));
  if (parse_certificates(out.ca_pem).empty())
    return absl::InvalidArgumentError(absl::StrCat("--tls-ca: ", ca_file, " holds no PEM certificate"));
  out.ca_file = ca_file;
  return out;
}

std::shared_ptr<grpc::ChannelCredentials> client_channel_credentials(const ClientTls& tls) {
  if (!tls.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca_pem;  // Empty: gRPC's default roots (the system's).
  return grpc::SslCredentials(options);
}

}  // namespace pdserve
