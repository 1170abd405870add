// Asynchronous sharded saves (sw::async_save) on the thread mesh: round trips bit for bit at TP 1, 2 and 4; a
// training step runs while the background write is held in flight, and the checkpoint holds the parameters as
// they were at the call; a failure of one rank's background write is raised at the next call on every rank
// with its words; a save killed in the background leaves the previous checkpoint loadable. Also the pieces the
// faster synchronous save is made of: the checksum computed in parts, the safetensors writer's runs.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <shardwise/checkpoint/async_save.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cases/async_save_cases.hpp"
#include "support/worlds.hpp"

namespace sw = shardwise;
namespace fs = std::filesystem;
using async_cases::Model;

namespace {

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(std::string const& name)
      : path(fs::temp_directory_path() / ("shardwise_test_async_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() { fs::remove_all(path); }
};

/// Commits go through the two renames, as on a filesystem without RENAME_EXCHANGE, while it lives.
struct without_rename_exchange {
  without_rename_exchange() { sw::detail::checkpoint_without_exchange = true; }
  ~without_rename_exchange() { sw::detail::checkpoint_without_exchange = false; }
};

/// Only the checkpoint "ckpt" and its lock file are in `folder`: no staging or replaced folder left behind.
void check_only_checkpoint_left(fs::path const& folder) {
  for (auto const& entry : fs::directory_iterator(folder))
    CHECK_MESSAGE((entry.path().filename() == "ckpt" || entry.path().filename() == ".ckpt.lock"), entry.path());
}

template <class Body>
void at_tp(int n, Body const& body) {
  worlds::run_threads(n, [&](auto& world) { body(sw::make_mesh<"dp", "tp">(world, {1, n})); });
}

}  // namespace

TEST_CASE("checksum64 in parts equals checksum64 of the whole, and its values are those files already hold") {
  std::vector<std::byte> bytes(1000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte((i * 131 + 7) & 255);
  // Computed by the one-pass checksum64 that saved every checkpoint before this change.
  std::pair<std::size_t, std::uint64_t> const known[] = {{0, 0x4a70095cbad66d25ull},  {1, 0xeeb8c653365c4726ull},
                                                         {31, 0x559542d0875591ccull}, {32, 0x96f09915bf270302ull},
                                                         {33, 0x408f8c86ea0e323bull}, {1000, 0xe5afbb510883f660ull}};
  for (auto const& [n, sum] : known) CHECK(sw::checksum64(std::span(bytes.data(), n)) == sum);
  std::mt19937 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::size_t const n = random() % bytes.size();
    sw::detail::checksum_stream parts;
    for (std::size_t at = 0; at < n;) {
      std::size_t const take = std::min<std::size_t>(n - at, random() % 70);
      parts.update(std::span(bytes.data() + at, take));
      at += take;
    }
    CHECK(parts.finish() == sw::checksum64(std::span(bytes.data(), n)));
  }
}

TEST_CASE("safetensors_writer: a tensor from several runs, and checksums computed while writing") {
  scratch_dir dir("writer");
  std::vector<float> rows(24);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = float(i) * 0.5f;
  auto const all = std::as_bytes(std::span(rows));
  sw::safetensors_writer writer;
  writer.add("a", sw::dtype::F32, {2, 4}, {all.subspan(64, 16), all.subspan(0, 16)});  // rows 4, then 0
  writer.add<float>("b", {3}, std::span<float const>(rows.data() + 9, 3));
  writer.write(dir.path / "t.safetensors", {{"format", "pt"}}, "sums");
  sw::safetensors_file in((dir.path / "t.safetensors").string());
  CHECK(in.read<float>("a") == std::vector<float>{8, 8.5f, 9, 9.5f, 0, 0.5f, 1, 1.5f});
  CHECK(in.read<float>("b") == std::vector<float>{4.5f, 5, 5.5f});
  auto const sums = nlohmann::json::parse(in.metadata().at("sums"));
  CHECK(sums.at("a") == sw::detail::hex64(sw::checksum64(in.raw("a"))));
  CHECK(sums.at("b") == sw::detail::hex64(sw::checksum64(in.raw("b"))));
  CHECK(in.metadata().at("format") == "pt");
}

// Sanitizers report an allocation this large as an error instead of throwing std::bad_alloc.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SHARDWISE_TEST_HUGE_ALLOCATION_THROWS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define SHARDWISE_TEST_HUGE_ALLOCATION_THROWS 0
#endif
#endif
#ifndef SHARDWISE_TEST_HUGE_ALLOCATION_THROWS
#define SHARDWISE_TEST_HUGE_ALLOCATION_THROWS 1
#endif

TEST_CASE("snapshot_buffer: an allocation that fails leaves it empty, and a smaller save then allocates anew") {
  sw::detail::snapshot_buffer buffer;
  REQUIRE(buffer.reserve(64) != nullptr);
  CHECK(buffer.capacity() == 64);
  if (SHARDWISE_TEST_HUGE_ALLOCATION_THROWS) {
    CHECK_THROWS_AS(buffer.reserve(std::size_t{1} << 62), sw::error);
    CHECK(buffer.capacity() == 0);  // not the 64 bytes it no longer holds
    std::byte* const again = buffer.reserve(32);
    REQUIRE(again != nullptr);
    again[31] = std::byte{1};  // written through, not through a null pointer
    CHECK(buffer.capacity() == 32);
  }
}

TEST_CASE("async save: round trips bit for bit at TP 1, 2 and 4; committed by wait() and by poll()") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    scratch_dir dir("round_trip_" + std::to_string(n));
    at_tp(n, [&](auto const& mesh) { async_cases::round_trip(mesh, dir.path / "ckpt"); });
    check_only_checkpoint_left(dir.path);
  }
}

TEST_CASE("async save: without RENAME_EXCHANGE, a save replaces the last one through the two renames") {
  without_rename_exchange const forced;
  scratch_dir dir("no_exchange");
  at_tp(2, [&](auto const& mesh) { async_cases::round_trip(mesh, dir.path / "ckpt"); });  // its second save replaces
  check_only_checkpoint_left(dir.path);  // the moved-aside folder removed by the clean-up
}

TEST_CASE("async save: without RENAME_EXCHANGE, the replaced checkpoint is off '.ckpt.previous' by the commit's end") {
  without_rename_exchange const forced;
  scratch_dir dir("no_exchange_handover");
  fs::path const ckpt = dir.path / "ckpt";
  at_tp(2, [&](auto const& mesh) {
    auto const tp = sw::submesh<"tp">(mesh);
    Model model(async_cases::config());
    sw::parallelize(model, tp);
    sw::async_save saver;
    sw::save_sharded(model, tp, ckpt, 1, saver);
    saver.wait();
    sw::save_sharded(model, tp, ckpt, 2, saver);
    while (!saver.poll()) std::this_thread::yield();  // committed; its clean-up thread may still be removing
    // The lock is released: the folder the clean-up removes must not be the name the next commit moves to.
    if (tp.rank() == 0) CHECK(!fs::exists(dir.path / ".ckpt.previous"));
    sw::save_sharded(model, tp, ckpt, 3);  // moves "ckpt" to ".ckpt.previous" while that clean-up may run
    CHECK(sw::load_sharded(model, tp, ckpt).step == 3);
    saver.wait();
  });
  check_only_checkpoint_left(dir.path);
}

TEST_CASE("async save: saved at TP 4, loaded at TP 2 and 1 into models that equal the saved one") {
  scratch_dir dir("reshard");
  fs::path const ckpt = dir.path / "ckpt";
  at_tp(4, [&](auto const& mesh) {
    auto const tp = sw::submesh<"tp">(mesh);
    Model model(async_cases::config());
    sw::parallelize(model, tp);
    sw::async_save saver;
    sw::save_sharded(model, tp, ckpt, 9, saver);
  });  // committed by the saver's destructor
  Model reference(async_cases::config());
  auto const expected = async_cases::parameter_bytes(reference);
  Model whole(async_cases::config(999));
  CHECK(sw::load_sharded(whole, sw::submesh<"tp">(sw::make_mesh<"tp">(sw::serial_world(), {1})), ckpt).step == 9);
  CHECK(async_cases::parameter_bytes(whole) == expected);
  at_tp(2, [&](auto const& mesh) {
    auto const tp = sw::submesh<"tp">(mesh);
    Model loaded(async_cases::config(999));
    sw::parallelize(loaded, tp);
    sw::load_sharded(loaded, tp, ckpt);
    Model twin(async_cases::config());
    sw::parallelize(twin, tp);
    CHECK(async_cases::parameter_bytes(loaded) == async_cases::parameter_bytes(twin));
  });
}

TEST_CASE("async save: a training step runs while the write is in flight; the checkpoint is the call's state") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    scratch_dir dir("overlap_" + std::to_string(n));
    async_cases::gated const gate(dir.path / "ckpt");
    at_tp(n, [&](auto const& mesh) { async_cases::overlaps_a_training_step(mesh, dir.path / "ckpt"); });
  }
}

TEST_CASE("async save: a failed background write is raised at the next call, on every rank, in its words") {
  for (bool at_next_save : {false, true})
    for (int n : {2, 4}) {
      CAPTURE(at_next_save);
      CAPTURE(n);
      int const owner = n - 1;
      scratch_dir dir("failure_" + std::to_string(n));
      async_cases::gated const gate(dir.path / "ckpt", owner);
      at_tp(n, [&](auto const& mesh) {
        async_cases::failure_is_raised_on_every_rank(mesh, dir.path / "ckpt", owner, at_next_save);
      });
    }
}

TEST_CASE("async save: a synchronous save of a folder this rank is still writing is refused, not a deadlock") {
  scratch_dir dir("same_folder");
  fs::path const ckpt = dir.path / "ckpt";
  async_cases::gated const gate(ckpt);
  at_tp(2, [&](auto const& mesh) {
    auto const tp = sw::submesh<"tp">(mesh);
    Model model(async_cases::config());
    sw::parallelize(model, tp);
    sw::async_save saver;
    async_cases::arm(tp);
    sw::save_sharded(model, tp, ckpt, 1, saver);
    std::string message;
    try {
      sw::save_sharded(model, tp, ckpt, 2);
    } catch (sw::error const& e) {
      message = e.what();
    }
    CHECK(message.find("an asynchronous save of \"" + ckpt.string() +
                       "\" from this rank (sw::async_save) is still in flight; call its wait() first") !=
          std::string::npos);
    async_cases::release(tp.rank());
    saver.wait();
    sw::save_sharded(model, tp, ckpt, 3);  // after wait(), the same folder saves synchronously
    CHECK(sw::load_sharded(model, tp, ckpt).step == 3);
  });
}

TEST_CASE("async save: a synchronous save of the in-flight folder under another spelling is refused too") {
  scratch_dir dir("same_folder_spelt_twice");
  fs::path const ckpt = dir.path / "ckpt";  // absolute
  fs::path const relative = fs::relative(ckpt);
  REQUIRE(relative.is_relative());
  async_cases::gated const gate(ckpt);
  at_tp(2, [&](auto const& mesh) {
    auto const tp = sw::submesh<"tp">(mesh);
    Model model(async_cases::config());
    sw::parallelize(model, tp);
    sw::async_save saver;
    async_cases::arm(tp);
    sw::save_sharded(model, tp, relative, 1, saver);  // in flight under the relative spelling
    std::string message;
    try {
      sw::save_sharded(model, tp, ckpt / ".", 2);  // the absolute one: it would wait for the leader's own lock
    } catch (sw::error const& e) {
      message = e.what();
    }
    CHECK_MESSAGE(message.find("\" from this rank (sw::async_save) is still in flight; call its wait() first") !=
                      std::string::npos,
                  message);
    async_cases::release(tp.rank());
    saver.wait();
    CHECK(sw::load_sharded(model, tp, ckpt).step == 1);
  });
}

namespace {
void kill_in_background(std::string_view stage, int) {
  if (stage == "rank_file_written") ::raise(SIGKILL);  // on a background thread; the whole process dies
}
}  // namespace

TEST_CASE("async save: killed (SIGKILL) while writing in the background, the previous checkpoint loads") {
  scratch_dir dir("killed");
  fs::path const ckpt = dir.path / "ckpt";
  at_tp(2, [&](auto const& mesh) {
    auto const tp = sw::submesh<"tp">(mesh);
    Model model(async_cases::config());
    sw::parallelize(model, tp);
    sw::save_sharded(model, tp, ckpt, 5);
  });
  pid_t const child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    sw::detail::checkpoint_save_hook = kill_in_background;
    try {
      at_tp(2, [&](auto const& mesh) {
        auto const tp = sw::submesh<"tp">(mesh);
        Model model(async_cases::config(4321));
        sw::parallelize(model, tp);
        sw::async_save saver;
        sw::save_sharded(model, tp, ckpt, 6, saver);
        saver.wait();
      });
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);  // not killed: the parent's check fails
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  CHECK(!async_cases::live_staging(ckpt).empty());  // the dead save's folder, beside the checkpoint
  Model reference(async_cases::config());
  Model loaded(async_cases::config(999));
  CHECK(sw::load_sharded(loaded, sw::submesh<"tp">(sw::make_mesh<"tp">(sw::serial_world(), {1})), ckpt).step == 5);
  CHECK(async_cases::parameter_bytes(loaded) == async_cases::parameter_bytes(reference));
  at_tp(2, [&](auto const& mesh) {  // the next save clears what the dead one left
    auto const tp = sw::submesh<"tp">(mesh);
    Model model(async_cases::config());
    sw::parallelize(model, tp);
    sw::async_save saver;
    sw::save_sharded(model, tp, ckpt, 7, saver);
    saver.wait();
  });
  CHECK(async_cases::live_staging(ckpt).empty());
}
