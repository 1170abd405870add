#pragma once
// Machine files for the planner (`shardwise plan --machine FILE`): a JSON description of one rank's GEMM rate and
// memory bandwidth and of each mesh axis' link, read into planner::machine. Parsed with nlohmann::json.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "shardwise/core/error.hpp"
#include "shardwise/cost/planner.hpp"

namespace shardwise::planner {

/// The machine described by a JSON file: {"name", "gemm_flops", "gemm_half_rate_tokens", "memory_bandwidth",
/// "ranks_per_node", "tp":
/// {"bandwidth", "latency"}, "dp": {...}, "pp": {...}}; a field left out keeps this machine's measured value.
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
  auto const number = [&](nlohmann::json const& at, char const* field, double& into) {
    if (!at.contains(field)) return;
    if (!at[field].is_number() || !(at[field].get<double>() > 0))
      shardwise::raise("shardwise::planner::read_machine: \"", field, "\" in ", file.string(),
                       " must be a positive number");
    into = at[field].get<double>();
  };
  if (root.contains("name") && root["name"].is_string()) m.name = root["name"].get<std::string>();
  if (root.contains("ranks_per_node")) {
    if (!root["ranks_per_node"].is_number_unsigned())
      shardwise::raise("shardwise::planner::read_machine: \"ranks_per_node\" in ", file.string(),
                       " must be a whole number (0: every rank on one node)");
    m.ranks_per_node = root["ranks_per_node"].get<std::size_t>();
  }
  number(root, "gemm_flops", m.gemm_flops), number(root, "memory_bandwidth", m.memory_bandwidth);
  if (root.contains("gemm_half_rate_tokens")) {  // 0: the GEMM rate does not depend on the tokens
    auto const& half = root["gemm_half_rate_tokens"];
    if (!half.is_number() || !(half.get<double>() >= 0))
      shardwise::raise("shardwise::planner::read_machine: \"gemm_half_rate_tokens\" in ", file.string(),
                       " must be a number of tokens, 0 or more");
    m.gemm_half_rate_tokens = half.get<double>();
  }
  for (auto [axis, into] : {std::pair{"tp", &m.tp}, std::pair{"dp", &m.dp}, std::pair{"pp", &m.pp}})
    if (root.contains(axis))
      number(root[axis], "bandwidth", into->bandwidth), number(root[axis], "latency", into->latency);
  return m;
}

}  // namespace shardwise::planner
