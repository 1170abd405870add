// The Llama model trained in pipeline stages on the MPI mesh (CTest runs this under mpiexec -n 1, 2, 4 and 8:
// pp alone, pp x tp with sequence parallelism, dp x pp with ZeRO-1, dp x pp x tp, and FSDP within the stages at
// dp x pp and dp x pp x tp; the sequences cut over cp under FSDP and within stages at 2 and 4; a MoeLlama's stages
// at pp x ep) against the unsharded run (cases/llama_pipeline_cases.hpp, cases/llama_context_composed_cases.hpp,
// cases/moe_pipeline_cases.hpp).
#include <doctest/doctest.h>

#include "cases/llama_context_composed_cases.hpp"
#include "cases/llama_pipeline_cases.hpp"
#include "cases/moe_pipeline_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("Llama in pipeline stages: loss curves and parameters equal the unsharded run, MPI mesh") {
  llama_pipeline_cases::check_all(worlds::mpi(), llama_pipeline_cases::steps());
}

TEST_CASE("Llama in pipeline stages under FSDP: equal to the unsharded run, MPI mesh") {
  llama_pipeline_cases::check_all_sharded(worlds::mpi(), llama_pipeline_cases::steps());
}

TEST_CASE("Llama cut over cp under FSDP and within pipeline stages: equal to the unsharded run, MPI mesh") {
  llama_context_composed_cases::check_all(worlds::mpi(), llama_pipeline_cases::steps());
}

TEST_CASE("MoeLlama in pipeline stages with experts over the dp ranks: equal to the unsharded run, MPI mesh") {
  moe_pipeline_cases::check_all(worlds::mpi());
}
