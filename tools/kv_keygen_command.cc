#include "tools/kv_keygen_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "kvtransfer/control/curve.h"

namespace pdserve::tools {

void add_kv_keygen_command(CLI::App& app, int* exit_code) {
  auto out = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("kv-keygen", "Make a cluster key for the kvtransfer control channel (CURVE)");
  cmd->add_option("--out", *out, "Write it to this new file (mode 0600) instead of standard output");
  cmd->callback([out, exit_code] {
    auto key = kvtransfer::new_curve_secret();
    if (!key.ok()) {
      std::cerr << "error: " << key.status().message() << "\n";
      *exit_code = 1;
      return;
    }
    const std::string line = *key + "\n";
    if (out->empty()) {
      std::cout << line;
      return;
    }
    // O_EXCL: an existing key file is never overwritten (its workers would lose each other).
    const int fd = ::open(out->c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
      std::cerr << "error: " << *out << ": " << std::strerror(errno) << "\n";
      *exit_code = 1;
      return;
    }
    const bool written = ::write(fd, line.data(), line.size()) == ssize_t(line.size());
    const bool closed = ::close(fd) == 0;
    if (!written || !closed) {
      std::cerr << "error: writing " << *out << " failed\n";
      ::unlink(out->c_str());  // A partial key would make the next run refuse (it exists).
      *exit_code = 1;
      return;
    }
    std::cerr << "wrote " << *out << "\n";
  });
}

}  // namespace pdserve::tools
