#pragma once
// A file mapped read-only into memory (POSIX mmap). Pages are read from disk only when touched, so reading a
// slice of one tensor costs that slice, not the file.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "shardwise/core/error.hpp"

namespace shardwise {

class mapped_file {
 public:
  mapped_file() = default;

  /// Maps `path` read-only; an empty file maps to an empty span.
  explicit mapped_file(std::string path) : path_(std::move(path)) {
    int const fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      detail::fail("shardwise::mapped_file: cannot open \"", path_, "\": ", std::strerror(errno),
                   "; check the path and its permissions");
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
      int const error = errno;
      ::close(fd);
      detail::fail("shardwise::mapped_file: cannot stat \"", path_, "\": ", std::strerror(error));
    }
    if (!S_ISREG(info.st_mode)) {
      ::close(fd);
      detail::fail("shardwise::mapped_file: \"", path_, "\" is not a regular file; give the path of a file");
    }
    size_ = static_cast<std::size_t>(info.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int const error = errno;
        ::close(fd);
        detail::fail("shardwise::mapped_file: cannot map \"", path_, "\" (", size_, " bytes): ", std::strerror(error));
      }
      data_ = static_cast<std::byte const*>(p);
      // No read-ahead around faults (the kernel's window is megabytes): readers ask for the ranges they need
      // with will_need, so a slice costs the slice.
      (void)::madvise(p, size_, MADV_RANDOM);
    }
    ::close(fd);  // the mapping keeps the file alive
  }

  mapped_file(mapped_file&& other) noexcept
      : path_(std::move(other.path_)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  mapped_file& operator=(mapped_file&& other) noexcept {
    if (this != &other) {
      unmap();
      path_ = std::move(other.path_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  mapped_file(mapped_file const&) = delete;
  mapped_file& operator=(mapped_file const&) = delete;
  ~mapped_file() { unmap(); }

  [[nodiscard]] std::span<std::byte const> bytes() const { return {data_, size_}; }
  [[nodiscard]] std::string const& path() const { return path_; }

  /// Asks the kernel to read bytes [offset, offset + length) ahead, in the background (a hint; errors ignored).
  void will_need(std::size_t offset, std::size_t length) const {
    if (!data_ || length == 0 || offset >= size_) return;
    std::size_t const page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::size_t const start = offset / page * page;
    std::size_t const end = length > size_ - offset ? size_ : offset + length;
    (void)::madvise(const_cast<std::byte*>(data_) + start, end - start, MADV_WILLNEED);
  }

 private:
  void unmap() {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

  std::string path_;
  std::byte const* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace shardwise
