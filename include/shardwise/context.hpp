#pragma once
// Context parallelism: sequences cut over a cp axis (context_split) and causal attention across it, by ring
// (ring_attention) or by all-to-all (ulysses_attention), forward and backward; a model cut over cp
// (context_parallelize). See docs/context-parallel.md.
#include "shardwise/context/context_parallel.hpp"
#include "shardwise/context/ring_attention.hpp"
#include "shardwise/context/split.hpp"
#include "shardwise/context/ulysses_attention.hpp"
