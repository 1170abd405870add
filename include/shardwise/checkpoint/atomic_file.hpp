#pragma once
// Writing a file so that readers see the old one or the new one whole, never a part: the bytes go to a
// temporary file in the same directory, are flushed to disk (fsync), and the temporary is renamed over the
// target; the directory is then flushed so the rename itself survives a crash.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "shardwise/core/error.hpp"

namespace shardwise::detail {

/// fsync of a directory, so that files created or renamed in it are on disk.
inline void fsync_directory(std::filesystem::path const& dir) {
  int const fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    fail("shardwise::checkpoint: cannot open directory \"", dir.string(), "\" to flush it: ", std::strerror(errno),
         "; check that it exists and is writable");
  int const rc = ::fsync(fd);
  int const error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL)  // some file systems cannot fsync a directory: nothing more to do there
    fail("shardwise::checkpoint: cannot flush directory \"", dir.string(), "\": ", std::strerror(error));
}

/// Writes all of `bytes` to fd, retrying short writes; returns 0 or an errno value.
inline int write_all(int fd, std::span<std::byte const> bytes) {
  while (!bytes.empty()) {
    std::size_t const piece = bytes.size() < (std::size_t{1} << 30) ? bytes.size() : (std::size_t{1} << 30);
    ssize_t const n = ::write(fd, bytes.data(), piece);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  return 0;
}

/// Replaces `path` with the concatenation of `pieces`, atomically: until the rename, `path` (if it existed)
/// is untouched; a crash leaves at most a hidden temporary file ".<name>.tmp.XXXXXX" beside it.
inline void write_file_atomically(std::filesystem::path const& path,
                                  std::span<std::span<std::byte const> const> pieces) {
  std::filesystem::path const dir = path.parent_path();
  std::string temp = (dir / ("." + path.filename().string() + ".tmp.XXXXXX")).string();
  int const fd = ::mkstemp(temp.data());
  if (fd < 0)
    fail("shardwise::checkpoint: cannot create a temporary file beside \"", path.string(), "\": ", std::strerror(errno),
         "; check that the directory exists and is writable");
  auto const give_up = [&](char const* what, int error) {
    ::close(fd);
    ::unlink(temp.c_str());
    fail("shardwise::checkpoint: cannot ", what, " \"", path.string(), "\" (through \"", temp,
         "\"): ", std::strerror(error), "; the previous file, if any, is unchanged. Free space or fix permissions");
  };
  if (::fchmod(fd, 0644) != 0) give_up("set permissions of", errno);
  for (auto const& piece : pieces)
    if (int const error = write_all(fd, piece)) give_up("write", error);
  if (::fsync(fd) != 0) give_up("flush", errno);
  if (::close(fd) != 0) {
    int const error = errno;
    ::unlink(temp.c_str());
    fail("shardwise::checkpoint: cannot close \"", temp, "\" for \"", path.string(), "\": ", std::strerror(error));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int const error = errno;
    ::unlink(temp.c_str());
    fail("shardwise::checkpoint: cannot rename \"", temp, "\" to \"", path.string(), "\": ", std::strerror(error),
         "; the previous file, if any, is unchanged");
  }
  fsync_directory(dir);
}

}  // namespace shardwise::detail
