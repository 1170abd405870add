#pragma once
// A file mapped read-only into memory (POSIX mmap). Pages are read from disk only when touched, so reading a
// slice of one tensor costs that slice, not the file. read() copies a byte range with pread instead, which
// leaves no mapped page resident (what loaders use: a rank's memory then holds its shard, not the file too).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "shardwise/core/error.hpp"
#include "shardwise/core/read_file.hpp"

namespace shardwise {

/// A file mapped read-only into memory, unmapped when destroyed; movable, not copyable.
class mapped_file {
 public:
  mapped_file() = default;

  /// Maps `path` read-only; an empty file maps to an empty span.
  explicit mapped_file(std::string path) : path_(std::move(path)) {
    std::uint64_t size = 0;
    int const fd = detail::open_regular_file(path_, "shardwise::mapped_file", "give the path of a file", size);
    size_ = static_cast<std::size_t>(size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int const error = errno;
        ::close(fd);
        detail::fail("shardwise::mapped_file: cannot map \"", path_, "\" (", size_, " bytes): ", std::strerror(error));
      }
      data_ = static_cast<std::byte const*>(p);
      // No read-ahead around faults nor around reads (the kernel's window is megabytes): readers ask for the
      // ranges they need with will_need, so a slice costs the slice.
      (void)::madvise(p, size_, MADV_RANDOM);
      (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
      fd_ = fd;  // kept for read(): copies that leave the mapping's pages untouched
    } else {
      ::close(fd);
    }
  }

  /// Takes over `other`'s mapping, leaving `other` empty.
  mapped_file(mapped_file&& other) noexcept
      : path_(std::move(other.path_)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        fd_(std::exchange(other.fd_, -1)) {}
  /// Unmaps this file and takes over `other`'s mapping, leaving `other` empty.
  mapped_file& operator=(mapped_file&& other) noexcept {
    if (this != &other) {
      unmap();
      path_ = std::move(other.path_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  mapped_file(mapped_file const&) = delete;
  mapped_file& operator=(mapped_file const&) = delete;
  ~mapped_file() { unmap(); }

  [[nodiscard]] std::span<std::byte const> bytes() const { return {data_, size_}; }  ///< The whole file's bytes.
  [[nodiscard]] std::string const& path() const { return path_; }                    ///< The path it was opened with.

  /// Asks the kernel to read bytes [offset, offset + length) ahead, in the background (a hint; errors ignored).
  void will_need(std::size_t offset, std::size_t length) const {
    if (!data_ || length == 0 || offset >= size_) return;
    std::size_t const page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::size_t const start = offset / page * page;
    std::size_t const end = length > size_ - offset ? size_ : offset + length;
    (void)::madvise(const_cast<std::byte*>(data_) + start, end - start, MADV_WILLNEED);
  }

  /// Drops this process's pages of bytes [offset, offset + length) of the mapping (a hint; errors ignored): they
  /// stay in the page cache, and a later touch maps them again. A reader that has gone through a range whole (a
  /// checksum) calls it so that the file does not stay in its resident memory, one tensor after another.
  void release(std::size_t offset, std::size_t length) const {
    if (!data_ || length == 0 || offset >= size_) return;
    std::size_t const page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::size_t const start = offset / page * page;
    std::size_t const end = length > size_ - offset ? size_ : offset + length;
    (void)::madvise(const_cast<std::byte*>(data_) + start, end - start, MADV_DONTNEED);
  }

  /// Copies bytes [offset, offset + length) of the file into `out`. Through pread, not the mapping: a page of
  /// the mapping counts in the process's resident memory once touched (and, with MADV_RANDOM, is faulted in
  /// 4 KiB at a time), while a read copies from the page cache and leaves nothing resident but `out`.
  void read(std::size_t offset, std::size_t length, void* out) const {
    if (offset > size_ || length > size_ - offset)
      detail::fail("shardwise::mapped_file: \"", path_, "\": bytes [", offset, ", ", offset + length,
                   ") go beyond the file's ", size_, " bytes");
    auto* to = static_cast<std::byte*>(out);
    while (length > 0) {
      ssize_t const n = ::pread(fd_, to, length, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        detail::fail("shardwise::mapped_file: cannot read \"", path_, "\" at byte ", offset, ": ",
                     n < 0 ? std::strerror(errno) : "the file is shorter than when it was opened",
                     "; check the file and the disk");
      to += n, offset += static_cast<std::size_t>(n), length -= static_cast<std::size_t>(n);
    }
  }

 private:
  void unmap() {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
    data_ = nullptr;
    size_ = 0;
    fd_ = -1;
  }

  std::string path_;
  std::byte const* data_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;  // open while mapped
};

}  // namespace shardwise
