// A stage whose output layout (Shard<0>: the tokens cut over tp) is not its input's (Replicate): the next stage
// would receive another layout than this one sends. run_pipeline_step refuses it at compile time.
#include <shardwise/mesh/serial.hpp>
#include <shardwise/nn.hpp>
#include <span>
namespace sw = shardwise;

struct Stage {
  SHARDWISE_CHILDREN()
  SHARDWISE_SAVED()
  using In = sw::Activation<double>;
#ifdef SHARDWISE_SHOULD_FAIL
  using Out = sw::Activation<double, sw::Shard<0>>;
#else
  using Out = sw::Activation<double>;
#endif
  Out forward(In const& x) { return Out{x.local}; }
  In backward(Out const& dy) { return In{dy.local}; }
};

int main() {
  auto const pp = sw::make_mesh<"pp">(sw::serial_world(), {1});
  Stage stage;
  auto input = [](int) { return sw::Activation<double>{sw::nn::matrix<double>::Zero(2, 2)}; };
  auto loss_gradient = [](int, auto const& y) { return y; };
  sw::run_pipeline_step(sw::GPipe{}, pp, std::span<Stage>(&stage, 1), 1, input, loss_gradient);
}
