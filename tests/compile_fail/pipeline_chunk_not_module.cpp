// A chunk that is not a module (here: a type without SHARDWISE_CHILDREN; in practice, a span of a sw::fully_shard
// wrapper) cannot be called through sw::forward. run_pipeline_step refuses it with one message that names the fix
// for both, before any other part of the step is instantiated.
#include <shardwise/mesh/serial.hpp>
#include <shardwise/nn.hpp>
#include <span>
namespace sw = shardwise;

struct Stage {
#ifndef SHARDWISE_SHOULD_FAIL
  SHARDWISE_CHILDREN()
  SHARDWISE_SAVED()
#endif
  using X = sw::Activation<double>;
  X forward(X const& x) { return x; }
  X backward(X const& dy) { return dy; }
};

int main() {
  auto const pp = sw::make_mesh<"pp">(sw::serial_world(), {1});
  Stage stage;
  auto input = [](int) { return sw::Activation<double>{sw::nn::matrix<double>::Zero(2, 2)}; };
  auto loss_gradient = [](int, auto const& y) { return y; };
  sw::run_pipeline_step(sw::GPipe{}, pp, std::span<Stage>(&stage, 1), 1, input, loss_gradient);
}
