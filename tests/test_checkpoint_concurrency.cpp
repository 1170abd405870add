// Checkpoints under concurrent use: two savers and a reader on one folder, and damage found by checksums.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/nn.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <thread>
#include <vector>

namespace sw = shardwise;
namespace fs = std::filesystem;

namespace {

struct Tiny {
  sw::Linear<float> first{8, 16, 1};
  sw::Linear<float> second{16, 4, 2};
  SHARDWISE_CHILDREN(first, second)
};

void fill(Tiny& model, float v) {
  sw::for_each_parameter(model, [&](std::string const&, auto& p) { p.value->setConstant(v); });
}

/// The one value every parameter holds, or -1 if they differ (parts of two saves).
float common_value(Tiny& model) {
  std::set<float> seen;
  sw::for_each_parameter(model, [&](std::string const&, auto& p) {
    for (Eigen::Index i = 0; i < p.value->size(); ++i) seen.insert(p.value->data()[i]);
  });
  return seen.size() == 1 ? *seen.begin() : -1.0f;
}

struct scratch {
  fs::path path = fs::temp_directory_path() / ("shardwise_concurrency_" + std::to_string(::getpid()));
  scratch() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch() { fs::remove_all(path); }
};

auto const serial_tp = [] { return sw::submesh<"tp">(sw::make_mesh<"tp">(sw::serial_world(), {1})); };

}  // namespace

TEST_CASE("two savers and a reader on one folder, 100 rounds: always one whole checkpoint, every load one save") {
  scratch dir;
  fs::path const ckpt = dir.path / "ckpt";
  int loads = 0;
  for (int round = 0; round < 100; ++round) {
    CAPTURE(round);
    float const a = 2.0f * round + 1, b = 2.0f * round + 2;
    std::atomic<int> saving{2};
    auto saver = [&](float value) {
      Tiny model;
      fill(model, value);
      sw::save_sharded(model, serial_tp(), ckpt, round);
      --saving;
    };
    std::vector<float> read;
    std::thread first(saver, a), second(saver, b);
    while (saving > 0) {                                            // the reader, while both save
      if (!fs::exists(ckpt / sw::checkpoint_index_name)) continue;  // round 0: nothing committed yet
      Tiny model;
      sw::load_sharded(model, serial_tp(), ckpt);
      read.push_back(common_value(model));
    }
    first.join();
    second.join();
    for (float v : read) {
      CHECK(v > 0.0f);       // never a mix of two saves
      CHECK(v <= b);         // never a value no save wrote
      CHECK(v >= a - 2.0f);  // this round's or the last one's
    }
    loads += static_cast<int>(read.size());
    Tiny model;
    sw::load_sharded(model, serial_tp(), ckpt);
    float const final_value = common_value(model);
    CHECK((final_value == a || final_value == b));
    CHECK(sw::verify_checkpoint(ckpt, true).empty());
    for (auto const& entry : fs::directory_iterator(dir.path)) {  // no staging folder left behind
      std::string const name = entry.path().filename().string();
      CHECK_MESSAGE((name == "ckpt" || name == ".ckpt.lock"), name);
    }
  }
  MESSAGE("loads during saves: ", loads);
  CHECK(loads > 0);
}

TEST_CASE("every single-byte flip in tensor data is reported by load and by verify_checkpoint") {
  scratch dir;
  fs::path const ckpt = dir.path / "ckpt";
  Tiny saved;
  fill(saved, 0.5f);
  sw::save_sharded(saved, serial_tp(), ckpt, 7);
  fs::path const file = ckpt / sw::rank_folder(0, 0) / "model.safetensors";
  std::vector<char> const original = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }();
  std::uint64_t header = 0;
  std::memcpy(&header, original.data(), 8);
  std::size_t const data_start = 8 + header;
  REQUIRE(original.size() - data_start == (8 * 16 + 16 + 16 * 4 + 4) * sizeof(float));
  for (std::size_t at = data_start; at < original.size(); ++at) {
    CAPTURE(at);
    std::vector<char> damaged = original;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x01);
    {
      std::ofstream out(file, std::ios::binary | std::ios::trunc);
      out.write(damaged.data(), static_cast<std::streamsize>(damaged.size()));
    }
    Tiny model;
    CHECK_THROWS_WITH_AS(sw::load_sharded(model, serial_tp(), ckpt),
                         doctest::Contains("does not match the checksum its save recorded"), sw::error);
    auto const problems = sw::verify_checkpoint(ckpt, true);
    REQUIRE(problems.size() == 1);
    CHECK(problems[0].find("does not match the checksum its save recorded") != std::string::npos);
  }
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(original.data(), static_cast<std::streamsize>(original.size()));
  }
  Tiny model;
  sw::load_sharded(model, serial_tp(), ckpt);
  CHECK(common_value(model) == 0.5f);
  CHECK(sw::verify_checkpoint(ckpt, true).empty());
}

namespace {
std::atomic<int> reads_begun{0};
void (*at_last_read)(fs::path const&) = nullptr;
fs::path last_read_dir;

/// Loads `ckpt` on four threads — two tp groups of two on one node, reading one rank at a time over the node
/// (sw::node_turns) — and runs `meanwhile` as the node's last rank starts to read, in the first attempt: each
/// rank's common value, or its error. A rank left waiting for peers gives up after 10 s (its error is returned).
std::vector<std::string> load_while(fs::path const& ckpt, void (*meanwhile)(fs::path const&)) {
  reads_begun = 0, at_last_read = meanwhile, last_read_dir = ckpt;
  sw::detail::checkpoint_load_hook = [](std::string_view stage, int) {
    if (stage == "read_begin" && ++reads_begun == 4) at_last_read(last_read_dir);
  };
  std::vector<std::string> outcome(4);
  try {
    sw::run_threads(4, [&](auto& world) {
      world.set_timeout(std::chrono::seconds(10));  // a wait the ranks could have agreed away fails the test
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"dp", "tp">(world, {2, 2}));
      sw::load_options const options{.ranks_per_step = 1, .turns = sw::node_turns(world)};
      auto& mine = outcome[static_cast<std::size_t>(world.rank())];
      Tiny model;
      try {
        sw::load_sharded(model, tp, ckpt, options);
        mine = std::to_string(common_value(model));
      } catch (sw::error const& e) {
        mine = e.what();
      }
    });
  } catch (std::exception const& e) {
    outcome.assign(1, std::string("run_threads: ") + e.what());
  }
  sw::detail::checkpoint_load_hook = nullptr;
  return outcome;
}

std::string each_rank(std::vector<std::string> const& outcome) {
  std::string text;
  for (std::size_t r = 0; r < outcome.size(); ++r) text += "\nrank " + std::to_string(r) + ": " + outcome[r];
  return text;
}
}  // namespace

TEST_CASE("a save between two ranks' reads: every rank of the node reads again, together, or fails alike") {
  scratch dir;
  fs::path const ckpt = dir.path / "ckpt";
  auto const save = [](fs::path const& where, float value) {
    Tiny model;
    fill(model, value);
    sw::save_sharded(model, serial_tp(), where, static_cast<std::int64_t>(value));
  };
  save(ckpt, 1.0f);
  // The last rank's tp group finds the folder replaced and reads again; the first group has read save 1 whole. Its
  // ranks share the node's turns, so they must read again too, or the others would wait for them.
  auto const replaced = load_while(ckpt, [](fs::path const& where) {
    Tiny model;
    fill(model, 2.0f);
    sw::save_sharded(model, serial_tp(), where, 2);
  });
  CHECK_MESSAGE(replaced == std::vector<std::string>(4, std::to_string(2.0f)), each_rank(replaced));
  // A file cut short before the last rank reads it: that group fails, the other read it whole; every rank raises
  // the same words, naming the file.
  save(ckpt, 3.0f);
  auto const damaged = load_while(ckpt, [](fs::path const& where) {
    fs::path const file = where / sw::rank_folder(0, 0) / "model.safetensors";
    fs::resize_file(file, fs::file_size(file) - 8);
  });
  INFO(each_rank(damaged));
  REQUIRE(damaged.size() == 4);
  CHECK(damaged[0].find(sw::rank_folder(0, 0)) != std::string::npos);
  CHECK(damaged[0].find("the file is truncated or corrupt") != std::string::npos);
  CHECK(damaged == std::vector<std::string>(4, damaged[0]));
}

// Run by CTest's cli.verify (with --no-skip and SHARDWISE_CLI set), where the command line is built.
TEST_CASE("a save that cannot remove the checkpoint it replaced says so, naming what is left behind") {
  for (bool const exchange : {true, false}) {
    CAPTURE(exchange);
    scratch dir;
    fs::path const ckpt = dir.path / "ckpt";
    Tiny saved;
    fill(saved, 0.25f);
    sw::save_sharded(saved, serial_tp(), ckpt, 1);
    fill(saved, 0.5f);
    sw::detail::checkpoint_without_exchange = !exchange;
    sw::detail::checkpoint_refuse_removal = true;  // as for a user who may not delete the old files
    std::string message = "(no error)";
    try {
      sw::save_sharded(saved, serial_tp(), ckpt, 2);
    } catch (sw::error const& e) {
      message = e.what();
    }
    sw::detail::checkpoint_refuse_removal = false;
    sw::detail::checkpoint_without_exchange = false;
    CAPTURE(message);
    CHECK(message.find("shardwise::save_sharded: the new checkpoint is in \"" + ckpt.string() +
                       "\" (committed), but the checkpoint it replaced, moved to \"" +
                       (dir.path / ".ckpt.").string()) != std::string::npos);
    CHECK(message.find("cannot be removed (Permission denied); it keeps its disk space until removed") !=
          std::string::npos);
    auto const left = [&] {
      int n = 0;
      for (auto const& entry : fs::directory_iterator(dir.path))
        n += entry.path().filename().string().starts_with(".ckpt.") && entry.is_directory() ? 1 : 0;
      return n;
    };
    CHECK(left() == 1);
    Tiny loaded;
    fill(loaded, 0.0f);
    sw::load_sharded(loaded, serial_tp(), ckpt);
    CHECK(common_value(loaded) == 0.5f);  // the new save is the checkpoint
    sw::save_sharded(saved, serial_tp(), ckpt, 3);
    CHECK(left() == 0);  // the next save removes what was left
  }
}

TEST_CASE("cli: `shardwise verify` and `shardwise inspect` report a damaged rank file, exit 1" * doctest::skip()) {
  char const* cli = std::getenv("SHARDWISE_CLI");
  REQUIRE_MESSAGE(cli != nullptr, "set SHARDWISE_CLI to the shardwise command");
  scratch dir;
  fs::path const ckpt = dir.path / "ckpt";
  Tiny saved;
  fill(saved, 0.25f);
  sw::save_sharded(saved, serial_tp(), ckpt, 1);
  fs::path const out = dir.path / "out.txt";
  auto run = [&](std::string const& command) {
    int const status = std::system(
        (std::string("'") + cli + "' " + command + " '" + ckpt.string() + "' > '" + out.string() + "' 2>&1").c_str());
    std::ifstream in(out);
    std::string const text((std::istreambuf_iterator<char>(in)), {});
    return std::pair{WEXITSTATUS(status), text};
  };
  auto [good_status, good_text] = run("verify");
  CHECK(good_status == 0);
  CHECK(good_text.find("every rank file and every checksum is as its save wrote it") != std::string::npos);
  fs::path const file = ckpt / sw::rank_folder(0, 0) / "model.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  auto const [bad_status, bad_output] = run("verify");
  std::string const bad_text = bad_output;  // doctest's CAPTURE is a lambda: clang 14 cannot capture a binding
  CAPTURE(bad_text);
  CHECK(bad_status == 1);
  CHECK(bad_text.find("tensor \"second.weight\" does not match the checksum its save recorded") != std::string::npos);
  fs::remove(ckpt / sw::rank_folder(0, 0) / "model.safetensors");
  auto const [gone_status, gone_output] = run("inspect");
  std::string const gone_text = gone_output;
  CAPTURE(gone_text);
  CHECK(gone_status == 1);
  CHECK(gone_text.find("1 problem(s) in the rank files") != std::string::npos);
}

TEST_CASE("cli: `shardwise consolidate` refuses damage and an output inside the checkpoint, exit 1" * doctest::skip()) {
  char const* cli = std::getenv("SHARDWISE_CLI");
  REQUIRE_MESSAGE(cli != nullptr, "set SHARDWISE_CLI to the shardwise command");
  scratch dir;
  fs::path const ckpt = dir.path / "ckpt";
  Tiny saved;
  fill(saved, 0.25f);
  sw::save_sharded(saved, serial_tp(), ckpt, 1);
  fs::path const log = dir.path / "out.txt";
  auto run = [&](std::string const& command) {
    int const status =
        std::system((std::string("'") + cli + "' " + command + " > '" + log.string() + "' 2>&1").c_str());
    std::ifstream in(log);
    return std::pair{WEXITSTATUS(status), std::string((std::istreambuf_iterator<char>(in)), {})};
  };
  std::string const source = "'" + ckpt.string() + "'";
  {  // into itself: refused before anything is written
    auto const [status, text] = run("consolidate " + source + " " + source);
    CHECK(status == 1);
    CHECK(text.find("is inside the checkpoint") != std::string::npos);
    CHECK(!fs::exists(ckpt / "model.safetensors"));
  }
  fs::path const out = dir.path / "out";
  {  // whole: written, with the count of tensors and the mesh; then verified and inspected
    auto const [status, text] = run("consolidate " + source + " '" + out.string() + "'");
    CHECK(status == 0);
    CHECK(text.find("4 tensors") != std::string::npos);
    CHECK(text.find("saved at tp 1 x pp 1 x dp 1") != std::string::npos);
    auto const [verified, verify_text] = run("verify '" + (out / "model.safetensors").string() + "'");
    CHECK(verified == 0);
    CHECK(verify_text.find("every tensor is as its writer wrote it") != std::string::npos);
    auto const [inspected, inspect_text] = run("inspect " + source);
    CHECK(inspected == 0);
    CHECK(inspect_text.find("mesh tp 1 x pp 1 x dp 1, 4 tensors") != std::string::npos);
  }
  {  // a flipped byte in the consolidated file: verify names the tensor
    std::fstream f(out / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  auto const [damaged_file, damaged_file_text] = run("verify '" + out.string() + "'");
  CHECK(damaged_file == 1);
  CHECK(damaged_file_text.find("does not match the checksum its writer recorded") != std::string::npos);
  {  // a flipped byte in the rank file: consolidate names the tensor and leaves the old output alone
    std::fstream f(ckpt / sw::rank_folder(0, 0) / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  auto const [status, output] = run("consolidate " + source + " '" + (dir.path / "again").string() + "'");
  std::string const text = output;  // doctest's CAPTURE is a lambda: clang 14 cannot capture a binding
  CAPTURE(text);
  CHECK(status == 1);
  CHECK(text.find("tensor \"second.weight\" does not match the checksum its save recorded") != std::string::npos);
  CHECK(!fs::exists(dir.path / "again/model.safetensors"));
}
