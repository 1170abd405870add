#include <cstdio>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>

namespace sw = shardwise;

int main() {
  bool ok = true;
  sw::run_threads(2, [&](auto& world) {
    auto mesh = sw::make_mesh<"tp">(world, {2});
    Eigen::MatrixXf full(4, 6);
    for (int i = 0; i < full.size(); ++i) full.data()[i] = float(i);  // the same on every rank
    auto sharded = sw::distribute<sw::Layout<sw::Shard<-1>>>(mesh, full);
    if (sharded.to_local().cols() != 3 || !sharded.full_tensor().isApprox(full)) ok = false;
  });
  std::puts(ok ? "consumer: ok" : "consumer: WRONG");
  return ok ? 0 : 1;
}
