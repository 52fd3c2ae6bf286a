// TLS for pdserve's gRPC and HTTP endpoints. The router and the workers take --tls-cert,
// --tls-key and --tls-ca; this reads and checks those files once at startup (so a bad file is a
// clear startup error, not a failed handshake later) and turns them into gRPC credentials and
// into an OpenSSL context for the HTTP server. The CLI clients take --tls / --tls-ca: see
// ClientTls. All files are PEM.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "common/status.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace pdserve {

// The files a process's --tls-cert, --tls-key and --tls-ca name (empty: not given).
struct TlsFiles {
  std::string cert;  // Its certificate, optionally followed by the intermediates of its chain.
  std::string key;   // The certificate's private key.
  std::string ca;    // The CA certificate(s) cluster peers' certificates must be signed by.
};

enum class TlsMode {
  kPlaintext,  // No TLS flag.
  kServer,     // --tls-cert and --tls-key: serve over TLS.
  kMutual,     // And --tls-ca: peers present certificates signed by the CA, and so does this process.
};

// The checked contents of TlsFiles.
struct TlsConfig {
  TlsMode mode = TlsMode::kPlaintext;
  std::string cert_pem, key_pem, ca_pem;
};

// Reads and checks `files`: the certificate and its key come together, and the CA only with them
// (a process presents its own certificate to the peers that the CA vouches for); the
// certificate, key and CA must parse and the key must be the certificate's. InvalidArgument
// naming the flag and the file otherwise.
StatusOr<TlsConfig> load_tls(const TlsFiles& files);

// Whether a TLS server asks its clients for certificates (TlsMode::kMutual only).
enum class ClientCerts {
  kOptional,  // Verified against the CA when presented; a client without one still connects.
  kRequired,  // Every client must present one signed by the CA.
};

// The credentials to listen with: insecure for kPlaintext; TLS with this certificate otherwise,
// for kMutual also asking clients for certificates as `client_certs` says.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsConfig& tls, ClientCerts client_certs);

// The credentials to dial a cluster peer with (the router its workers, a worker its router):
// for kMutual, TLS trusting only the CA and presenting this certificate; insecure otherwise
// (without --tls-ca the cluster's own connections are plaintext).
std::shared_ptr<grpc::ChannelCredentials> peer_channel_credentials(const TlsConfig& tls);

// Sets up `ctx` (an HTTPS server's) with the certificate chain and key of `tls`, TLS 1.2 at least.
Status configure_ssl_server(SSL_CTX& ctx, const TlsConfig& tls);

// A client's TLS (the CLI's --tls and --tls-ca): off, or on trusting the system's roots, or only
// the CA in ca_pem.
struct ClientTls {
  bool enabled = false;
  std::string ca_file, ca_pem;  // Empty: the system's roots.
};

// `tls` (--tls) or a CA file (--tls-ca, which implies TLS); InvalidArgument when the file cannot
// be read or holds no certificate.
StatusOr<ClientTls> load_client_tls(bool tls, const std::string& ca_file);

// Insecure, or TLS trusting what `tls` says.
std::shared_ptr<grpc::ChannelCredentials> client_channel_credentials(const ClientTls& tls);

}  // namespace pdserve
