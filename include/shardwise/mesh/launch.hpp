#pragma once
// One program, two ways to run: under mpiexec it runs on MPI, started directly it runs its ranks as
// threads. Examples use this so they need no launcher by default and run unchanged under mpiexec.
#include <cstdlib>
#include <exception>
#include <string_view>

#include "shardwise/core/error.hpp"
#include "shardwise/mesh/runtime.hpp"
#include "shardwise/mesh/thread/comm.hpp"

namespace shardwise {

/// True when an MPI launcher (OpenMPI's mpiexec, or a PMI/PMIx one) started this process.
[[nodiscard]] inline bool launched_by_mpi() {
  for (char const* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(name)) return true;
  return false;
}

/// Runs fn(world) on every MPI rank when launched by mpiexec, otherwise on `threads` thread ranks
/// (SHARDWISE_THREADS overrides the number). `world` is a sw::RuntimeComm& either way, so fn — and the model code
/// it calls — is compiled once, not once per backend.
template <class Fn>
void launch(int& argc, char**& argv, int threads, Fn&& fn) {
  if (launched_by_mpi()) {
    RuntimeComm world(detail::mpi_side::world(argc, argv));
    try {
      fn(world);
    } catch (std::exception const& e) {
      detail::mpi_side::tell_peers(e.what());  // the other ranks raise it at their next collective
      throw;
    }
    return;
  }
  if (char const* text = std::getenv("SHARDWISE_THREADS")) {
    char* end = nullptr;
    long const n = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || n < 1 || n > 4096)
      detail::fail("shardwise::launch: SHARDWISE_THREADS=\"", text, "\" is not a rank count; use a number from 1");
    threads = static_cast<int>(n);
  }
  run_threads(threads, [&](ThreadComm& ranks) {
    RuntimeComm world(ranks);
    fn(world);
  });
}

}  // namespace shardwise
