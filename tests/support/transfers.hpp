#pragma once
// A counting mesh's record as text, for a failed comparison with a cost's prediction.
#include <shardwise/cost/transfer.hpp>
#include <sstream>
#include <string>
#include <vector>

inline std::string listed(std::vector<shardwise::transfer> const& entries) {
  std::ostringstream out;
  for (auto const& t : entries) out << "  " << t << '\n';
  return out.str();
}
