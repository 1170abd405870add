#pragma once
// Compiles checkpoint IO's entry points once (checkpoint/compiled_once.hpp). Include it in exactly one .cpp file of
// a program whose other files define SHARDWISE_SEPARATE_CHECKPOINT: they then call these instead of compiling the
// sharded save and load, the Hugging Face folders' reading and writing and consolidation themselves
// (docs/build-time.md). CMake's shardwise::separate_checkpoint target does both.
#if defined(SHARDWISE_DETAIL_CHECKPOINT_BODIES) && !defined(SHARDWISE_DETAIL_COMPILING_CHECKPOINT)
#error "shardwise: include <shardwise/compile_checkpoint.hpp> before any other shardwise header"
#endif
#define SHARDWISE_DETAIL_COMPILING_CHECKPOINT
#include "shardwise/checkpoint/consolidate.hpp"
#include "shardwise/checkpoint/optimizer_state.hpp"
#include "shardwise/checkpoint/peft.hpp"
#include "shardwise/checkpoint/pretrained.hpp"
#include "shardwise/checkpoint/sharded.hpp"
#include "shardwise/checkpoint/sharded_load.hpp"
#include "shardwise/checkpoint/verify.hpp"
#include "shardwise/models/gpt2_config_json.hpp"
#include "shardwise/models/llama_config_json.hpp"
