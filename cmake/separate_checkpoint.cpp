// shardwise::separate_checkpoint: checkpoint IO's entry points (the sharded save and load, the Hugging Face folders'
// reading and writing, consolidation, the config files) compiled once for every file that links the target
// (SHARDWISE_SEPARATE_CHECKPOINT: they see the entry points' declarations only). docs/build-time.md says why.
#include <shardwise/compile_checkpoint.hpp>
