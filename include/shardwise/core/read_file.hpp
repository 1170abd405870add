#pragma once
// Reading a small file from outside (an index, a config, a machine file) so that no file can hang or exhaust the
// reader: it is opened without blocking, so a FIFO or a device in its place is refused instead of waited on; only
// a regular file is read; and its size is checked against a limit before a byte is allocated.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "shardwise/core/error.hpp"

namespace shardwise::detail {

/// The largest JSON file (an index, a config, a machine file) shardwise reads: 100 MB, as for a safetensors
/// header.
inline constexpr std::uint64_t max_json_file_bytes = 100'000'000;

/// An open file descriptor, closed when it goes.
class file_descriptor {
 public:
  explicit file_descriptor(int fd) : fd_(fd) {}
  file_descriptor(file_descriptor const&) = delete;
  file_descriptor& operator=(file_descriptor const&) = delete;
  ~file_descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_;
};

/// Opens `path` for reading without blocking and checks that it is a regular file: `who` ("shardwise::load_sharded")
/// names the reader in errors and `fix` says what to give instead. Returns the descriptor (blocking again) and
/// the file's size.
inline int open_regular_file(std::string const& path, std::string_view who, std::string_view fix, std::uint64_t& size) {
  int const fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO would block a plain open
  if (fd < 0) fail(who, ": cannot open \"", path, "\" (", std::strerror(errno), "); ", fix);
  struct stat info{};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    fail(who, ": \"", path, "\" is not a regular file (a FIFO, a device or a folder is never read); ", fix);
  }
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  size = static_cast<std::uint64_t>(info.st_size);
  return fd;
}

/// The whole of the regular file `path`, at most `limit` bytes, as text (see open_regular_file).
inline std::string read_regular_file(std::string const& path, std::string_view who, std::string_view fix,
                                     std::uint64_t limit = max_json_file_bytes) {
  std::uint64_t size = 0;
  file_descriptor const fd(open_regular_file(path, who, fix, size));
  if (size > limit)
    fail(who, ": \"", path, "\" is ", size, " bytes, above the limit of ", limit, " for this kind of file; ", fix);
  std::string text(static_cast<std::size_t>(size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t const n = ::read(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(who, ": reading \"", path, "\" failed (", std::strerror(errno), "); ", fix);
    if (n == 0) break;  // the file shrank while read: what is there is parsed, and checked like any text
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  return text;
}

}  // namespace shardwise::detail
