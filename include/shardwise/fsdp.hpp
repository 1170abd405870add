#pragma once
// Fully sharded data parallelism: sw::fully_shard and its policy types (fsdp/policy.hpp, fsdp/fully_shard.hpp).
// Kept out of nn.hpp so that programs without FSDP do not compile it. Checkpoints of a sharded model (each rank
// saving and loading its shards): shardwise/fsdp/checkpoint.hpp.
#include "shardwise/fsdp/fully_shard.hpp"
#include "shardwise/fsdp/policy.hpp"
#include "shardwise/nn.hpp"
