#pragma once
// Machine files for the planner (`shardwise plan --machine FILE`): a JSON description of one rank's GEMM rate and
// memory bandwidth and of each mesh axis' link, read into planner::machine. Parsed with nlohmann::json.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "shardwise/core/error.hpp"
#include "shardwise/cost/planning.hpp"

namespace shardwise::planner {

/// The machine described by a JSON file: {"name", "gemm_flops", "gemm_half_rate_tokens", "memory_bandwidth",
/// "ranks_per_node", "tp": {"bandwidth", "latency"}, "dp": {...}, "pp": {...}}; a field left out keeps this
/// machine's measured value.
inline machine read_machine(std::filesystem::path const& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) shardwise::raise("shardwise::planner::read_machine: cannot open ", file.string(), "; give a machine file");
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(in);
  } catch (nlohmann::json::exception const& e) {
    shardwise::raise("shardwise::planner::read_machine: ", file.string(), " is not valid JSON (", e.what(),
                     "); see tools/machines/this_machine.json for the format");
  }
  machine m;
  auto const number = [&](nlohmann::json const& at, char const* field, double& into, bool zero_allowed = false) {
    if (!at.contains(field)) return;
    double const value = at[field].is_number() ? at[field].get<double>() : -1;
    if (!(value > 0 || (zero_allowed && value == 0)))
      shardwise::raise("shardwise::planner::read_machine: \"", field, "\" in ", file.string(), " must be a ",
                       zero_allowed ? "number, 0 or more" : "positive number");
    into = value;
  };
  if (root.contains("name") && root["name"].is_string()) m.name = root["name"].get<std::string>();
  if (root.contains("ranks_per_node")) {
    if (!root["ranks_per_node"].is_number_unsigned())
      shardwise::raise("shardwise::planner::read_machine: \"ranks_per_node\" in ", file.string(),
                       " must be a whole number (0: every rank on one node)");
    m.ranks_per_node = root["ranks_per_node"].get<std::size_t>();
  }
  number(root, "gemm_flops", m.gemm_flops), number(root, "memory_bandwidth", m.memory_bandwidth);
  number(root, "gemm_half_rate_tokens", m.gemm_half_rate_tokens, true);  // 0: a rate flat in the tokens
  for (auto [axis, into] : {std::pair{"tp", &m.tp}, std::pair{"dp", &m.dp}, std::pair{"pp", &m.pp}})
    if (root.contains(axis))
      number(root[axis], "bandwidth", into->bandwidth), number(root[axis], "latency", into->latency);
  return m;
}

}  // namespace shardwise::planner
