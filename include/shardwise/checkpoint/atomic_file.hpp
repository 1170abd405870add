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
#include <utility>
#include <vector>

#include "shardwise/checkpoint/checksum.hpp"
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

/// Writes all of `bytes` to fd, retrying short writes; returns 0 or an errno value (EIO if a write wrote
/// nothing: it would only do so again).
inline int write_all(int fd, std::span<std::byte const> bytes) {
  while (!bytes.empty()) {
    std::size_t const piece = bytes.size() < (std::size_t{1} << 30) ? bytes.size() : (std::size_t{1} << 30);
    ssize_t const n = ::write(fd, bytes.data(), piece);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  return 0;
}

/// A file written in pieces that replaces `path` only at commit(); destroyed uncommitted (an error), it leaves
/// `path` as it was and removes its temporary ".<name>.tmp.XXXXXX". A crash leaves at most that temporary.
class atomic_file_writer {
 public:
  explicit atomic_file_writer(std::filesystem::path path) : path_(std::move(path)) {
    temp_ = (path_.parent_path() / ("." + path_.filename().string() + ".tmp.XXXXXX")).string();
    fd_ = ::mkstemp(temp_.data());
    if (fd_ < 0)
      fail("shardwise::checkpoint: cannot create a temporary file beside \"", path_.string(),
           "\": ", std::strerror(errno), "; check that the directory exists and is writable");
    if (::fchmod(fd_, 0644) != 0) give_up("set permissions of", errno);
  }
  atomic_file_writer(atomic_file_writer const&) = delete;
  atomic_file_writer& operator=(atomic_file_writer const&) = delete;
  ~atomic_file_writer() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(temp_.c_str());
    }
  }

  /// Appends `bytes`.
  void write(std::span<std::byte const> bytes) {
    if (int const error = write_all(fd_, bytes)) give_up("write", error);
  }

  /// Overwrites bytes already written, from `offset` (a header completed once the data after it is written).
  void write_at(std::size_t offset, std::span<std::byte const> bytes) {
    while (!bytes.empty()) {
      ssize_t const n = ::pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        give_up("write", errno);
      }
      if (n == 0) give_up("write", EIO);  // wrote nothing: it would only do so again
      bytes = bytes.subspan(static_cast<std::size_t>(n));
      offset += static_cast<std::size_t>(n);
    }
  }

  /// Flushes the bytes to disk and renames the temporary over the target, then flushes the directory.
  void commit() {
    if (::fsync(fd_) != 0) give_up("flush", errno);
    int const fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      int const error = errno;
      ::unlink(temp_.c_str());
      fail("shardwise::checkpoint: cannot close \"", temp_, "\" for \"", path_.string(), "\": ", std::strerror(error));
    }
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      int const error = errno;
      ::unlink(temp_.c_str());
      fail("shardwise::checkpoint: cannot rename \"", temp_, "\" to \"", path_.string(), "\": ", std::strerror(error),
           "; the previous file, if any, is unchanged");
    }
    fsync_directory(path_.parent_path());
  }

 private:
  [[noreturn]] void give_up(char const* what, int error) {
    ::close(std::exchange(fd_, -1));
    ::unlink(temp_.c_str());
    fail("shardwise::checkpoint: cannot ", what, " \"", path_.string(), "\" (through \"", temp_,
         "\"): ", std::strerror(error), "; the previous file, if any, is unchanged. Free space or fix permissions");
  }

  std::filesystem::path path_;
  std::string temp_;
  int fd_ = -1;
};

/// Replaces `path` with the concatenation of `pieces`, atomically: until the rename, `path` (if it existed)
/// is untouched; a crash leaves at most a hidden temporary file ".<name>.tmp.XXXXXX" beside it.
inline void write_file_atomically(std::filesystem::path const& path,
                                  std::span<std::span<std::byte const> const> pieces) {
  atomic_file_writer out(path);
  for (auto const& piece : pieces) out.write(piece);
  out.commit();
}

}  // namespace shardwise::detail

#include <sys/file.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <set>
#include <system_error>

namespace shardwise::detail {

/// An exclusive lock on a checkpoint folder's name (flock on the hidden sibling ".NAME.lock"), held by the one
/// rank that stages and commits a save, so that two savers of one folder take turns instead of interleaving.
/// flock locks belong to the open file, so savers in one process (threads) exclude each other too.
class directory_lock {
 public:
  directory_lock() = default;
  /// Blocks until no other saver of `target` holds the lock.
  explicit directory_lock(std::filesystem::path const& target) {
    std::filesystem::path const parent = target.parent_path().empty() ? "." : target.parent_path();
    std::filesystem::create_directories(parent);
    std::filesystem::path const file = parent / ("." + target.filename().string() + ".lock");
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      fail("shardwise::save_sharded: cannot create the lock file \"", file.string(), "\": ", std::strerror(errno),
           "; check that the folder is writable");
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      int const error = errno;
      ::close(fd_);
      fd_ = -1;
      fail("shardwise::save_sharded: cannot lock \"", file.string(), "\": ", std::strerror(error));
    }
  }
  directory_lock(directory_lock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  directory_lock& operator=(directory_lock&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  directory_lock(directory_lock const&) = delete;
  directory_lock& operator=(directory_lock const&) = delete;
  ~directory_lock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }

 private:
  int fd_ = -1;
};

/// Where the save of generation `g` stages its files: the hidden sibling ".NAME.incomplete.<generation>".
inline std::filesystem::path staging_dir(std::filesystem::path const& target, std::uint64_t g) {
  std::filesystem::path const parent = target.parent_path().empty() ? "." : target.parent_path();
  return parent / ("." + target.filename().string() + ".incomplete." + hex64(g));
}

/// The folders of replaced checkpoints that an asynchronous save's clean-up thread is removing in this process
/// (named as staging folders: a commit swaps the previous checkpoint into the new one's staging name).
struct folders_being_removed {
  std::mutex mutex;
  std::set<std::string> paths;
  static folders_being_removed& instance() {
    static folders_being_removed registry;
    return registry;
  }
};

/// Removes the staging folders of saves of `target` that died (call it holding the folder's lock), but those a
/// clean-up thread of this process is removing. Best effort: what cannot be removed stays for the next save.
inline void remove_stale_staging(std::filesystem::path const& target) {
  std::filesystem::path const parent = target.parent_path().empty() ? "." : target.parent_path();
  std::string const prefix = "." + target.filename().string() + ".incomplete";
  auto& removing = folders_being_removed::instance();
  for (auto const& entry : std::filesystem::directory_iterator(parent)) {
    if (entry.path().filename().string().rfind(prefix, 0) != 0) continue;
    {
      std::lock_guard const hold(removing.mutex);
      if (removing.paths.contains(entry.path().string())) continue;
    }
    std::error_code ignored;  // another process may be removing it too
    std::filesystem::remove_all(entry.path(), ignored);
  }
}

/// A number that names one save: different for every save, in every process, with overwhelming probability.
inline std::uint64_t new_generation() {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device device;
  std::uint64_t g = (std::uint64_t{device()} << 32) ^ device();
  g ^= static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
  g ^= (static_cast<std::uint64_t>(::getpid()) << 40) ^ counter.fetch_add(1);
  return g == 0 ? 1 : g;  // 0 means "none" (checkpoints written before generations)
}

}  // namespace shardwise::detail
