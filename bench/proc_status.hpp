#pragma once
// A field of /proc/self/status in MiB, for the benchmarks' memory columns, and a reset of its peak.
#include <cstdlib>
#include <fstream>
#include <string>

namespace bench {

/// VmRSS (resident now) or VmHWM (peak resident) of this process in MiB; 0 where there is none.
inline double status_mib(char const* field) {
  std::ifstream status("/proc/self/status");
  std::string const key = std::string(field) + ":";
  for (std::string line; std::getline(status, line);)
    if (line.rfind(key, 0) == 0) return std::strtod(line.c_str() + key.size(), nullptr) / 1024.0;
  return 0;
}

/// Resets VmHWM to the resident set now (Linux's clear_refs "5"), so the next VmHWM is this moment's peak and
/// not the process's since it began; false where the kernel does not offer it.
inline bool reset_peak() {
  std::ofstream clear("/proc/self/clear_refs");
  return static_cast<bool>(clear << "5" << std::flush);
}

}  // namespace bench
