#pragma once
// The umbrella header: everything that needs no third-party library. Add adapters/eigen.hpp,
// adapters/xtensor.hpp and mesh/mpi/comm.hpp (or mesh/launch.hpp) for what you use.
#include "shardwise/core/error.hpp"
#include "shardwise/core/fixed_string.hpp"
#include "shardwise/dtensor/dtensor.hpp"
#include "shardwise/layout/redistribute_plan.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/mesh/serial.hpp"
#include "shardwise/mesh/thread/comm.hpp"
#include "shardwise/pipeline/schedule.hpp"
#include "shardwise/placement/chunk.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/tensor/box.hpp"
#include "shardwise/tensor/concept.hpp"
#include "shardwise/tensor/extents.hpp"
