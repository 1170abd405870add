// Generation with the key-value cache under mpiexec at 2 and 4 ranks: the cases of test_generate.cpp
// (generate_cases::all_cases), sampling against tp 1 computed on every rank, the bad requests, and a MoeLlama whose
// experts are placed over the ranks.
#include <doctest/doctest.h>

#include "cases/generate_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("generate: every step equals the full forward, and sampling is the same as at tp 1 (MPI)") {
  auto const world = worlds::mpi();
  auto const alone = generate_cases::llama<float>(shardwise::serial_world(), generate_cases::llama_config(),
                                                  generate_cases::sampled());
  generate_cases::all_cases(world, alone);
}

TEST_CASE("generate: with bf16_weights, every step equals the full forward of the weights rounded to bf16 (MPI)") {
  generate_cases::bf16_weights_cases(worlds::mpi());
}

TEST_CASE("generate: bad requests are refused on every rank with the same words (MPI)") {
  generate_cases::bad_requests(worlds::mpi());
}

TEST_CASE("generate: a MoeLlama with its experts over every rank equals its full forward (MPI)") {
  generate_cases::placed_experts(worlds::mpi());
}
