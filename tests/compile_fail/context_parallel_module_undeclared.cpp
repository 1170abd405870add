// A module whose own code may mix tokens (here: it says nothing about how it treats a sequence) cannot have its
// sequences cut over cp ranks: sw::context_parallelize refuses it at compile time and names the module, and its plan
// path ("mixer"). Declaring it token-wise (the good twin) makes the same program compile.
#include <shardwise/context/context_parallel.hpp>
#include <shardwise/mesh/serial.hpp>
#include <shardwise/nn.hpp>
namespace sw = shardwise;

template <class Plan>
struct Mixer {
  sw::Linear<double, sw::layer_at<Plan, "proj">> proj{{4, 4, false}, 1};
  SHARDWISE_CHILDREN(proj)
  SHARDWISE_SAVED()
#ifndef SHARDWISE_SHOULD_FAIL
  SHARDWISE_HOOKS(token_wise)
  static constexpr bool shardwise_token_wise = true;
#endif
};

template <class Plan>
struct Model {
  Mixer<sw::subplan<Plan, "mixer">> mixer;
  SHARDWISE_CHILDREN(mixer)
  SHARDWISE_HOOKS(token_wise)
  SHARDWISE_SAVED()
  static constexpr bool shardwise_token_wise = true;
};

int main() {
  auto const cp = sw::make_mesh<"cp">(sw::serial_world(), {1});
  Model<sw::serial_plan> model;
  (void)sw::context_parallelize(model, cp, sw::context_split{8, 1});
}
