// A throwaway PKI for the TLS tests, made with the openssl CLI in a fresh temporary directory:
// a CA and a certificate it signed (for localhost and 127.0.0.1, usable by servers and clients
// alike: the router and the workers share it), and a rogue CA with a certificate of its own for
// the same names, which the first CA does not vouch for.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/command_output.h"

namespace pdserve::testing {

class TestPki {
 public:
  TestPki() {
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("pdserve_pki_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "make.sh")
        << "set -e\n"
           "ca() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=$1 "
           "-keyout $1.key -out $1.crt; }\n"
           "leaf() {\n"
           "  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=$1 -keyout $1.key -out "
           "$1.csr\n"
           "  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > $1.ext\n"
           "  openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial -days 2 -extfile $1.ext -out "
           "$1.crt\n"
           "}\n"
           "ca ca; ca rogue-ca; leaf node ca; leaf rogue rogue-ca\n";
    ok_ = run_command("cd '" + dir_.string() + "' && sh make.sh >make.log 2>&1").exit_code == 0;
  }
  ~TestPki() { std::filesystem::remove_all(dir_); }
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;

  // Whether every file was made (the openssl CLI is installed and worked).
  bool ok() const { return ok_; }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  std::string ca() const { return file("ca.crt"); }
  std::string cert() const { return file("node.crt"); }  // Signed by ca().
  std::string key() const { return file("node.key"); }
  std::string rogue_cert() const { return file("rogue.crt"); }  // Signed by the rogue CA.
  std::string rogue_key() const { return file("rogue.key"); }

 private:
  std::filesystem::path dir_;
  bool ok_ = false;
};

}  // namespace pdserve::testing
