#pragma once
// Where checkpoint IO's code is compiled. By default every file that saves or loads compiles it, inline. With
// SHARDWISE_SEPARATE_CHECKPOINT (CMake: link shardwise::separate_checkpoint) its entry points — the functions that
// the templates on a model or a mesh call (the sharded save and load, the Hugging Face folder's reading,
// consolidation, the config files) — are compiled once, in the one file that includes
// <shardwise/compile_checkpoint.hpp>; the other files see their declarations only, so none of the code
// behind them is compiled there (docs/build-time.md).
//
// SHARDWISE_DETAIL_CHECKPOINT_ENTRY precedes an entry point's declaration and its definition; the definition
// stands inside `#if SHARDWISE_DETAIL_CHECKPOINT_BODIES`.
#if defined(SHARDWISE_SEPARATE_CHECKPOINT) || defined(SHARDWISE_DETAIL_COMPILING_CHECKPOINT)
#define SHARDWISE_DETAIL_CHECKPOINT_ENTRY  // one definition, in the library
#else
#define SHARDWISE_DETAIL_CHECKPOINT_ENTRY inline
#endif
#if defined(SHARDWISE_SEPARATE_CHECKPOINT) && !defined(SHARDWISE_DETAIL_COMPILING_CHECKPOINT)
#define SHARDWISE_DETAIL_CHECKPOINT_BODIES 0
#else
#define SHARDWISE_DETAIL_CHECKPOINT_BODIES 1
#endif
