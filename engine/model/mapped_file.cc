#include "engine/model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pdserve::engine {

StatusOr<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string why = std::strerror(err);
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    if (err == EACCES) return absl::PermissionDeniedError(absl::StrCat(path, ": ", why));
    return absl::InvalidArgumentError(absl::StrCat("cannot open ", path, ": ", why));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string why = std::strerror(errno);
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("cannot stat ", path, ": ", why));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  if (st.st_size == 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is empty"));
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  // The mapping keeps the file referenced, so the descriptor is not needed past this point.
  ::close(fd);
  if (p == MAP_FAILED)
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map ", path, " (", size, " bytes): ", std::strerror(err)));
  return std::unique_ptr<MappedFile>(new MappedFile(path, static_cast<const uint8_t*>(p), size));
}

MappedFile::~MappedFile() { ::munmap(const_cast<uint8_t*>(data_), size_); }

}  // namespace pdserve::engine
