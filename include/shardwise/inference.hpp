#pragma once
// Inference: the key-value cache (inference/kv_cache.hpp), the attention kernel that uses it
// (inference/cached_attention.hpp), the sampling rule (inference/sampling.hpp) and sw::generate
// (inference/generate.hpp). docs/inference.md shows them at work.
#include "shardwise/inference/bf16_weights.hpp"
#include "shardwise/inference/cached_attention.hpp"
#include "shardwise/inference/generate.hpp"
#include "shardwise/inference/kv_cache.hpp"
#include "shardwise/inference/sampling.hpp"
