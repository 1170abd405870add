#pragma once
// load_options::only_rank0_reads with load_options::turns = sw::node_turns(world): the node's first rank reads
// for every rank of the node — whatever its tp group, data-parallel replica or pipeline stage — so that a node
// opens the checkpoint once, as Accelerate's and optimum-neuron's per-node loading means. Each rank sends the
// reader the boxes its shard needs (their layouts: only it knows them, under FSDP's uneven rows or another
// stage's tensors); the reader reads one block at a time and sends it, so that it holds its own shard and one
// block, and the others only their shards.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "shardwise/checkpoint/checkpoint_reader.hpp"
#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/model_tensors.hpp"
#include "shardwise/checkpoint/read_turns.hpp"
#include "shardwise/checkpoint/sharded_layout.hpp"

namespace shardwise::detail {

/// One block a rank of the node asks its reader for: the tensor's layout at that rank, and its element size.
struct block_request {
  tensor_layout layout;
  std::size_t element_size = 0;
};

/// block_requests as bytes (the layouts' numbers, then each name's length and characters).
class request_bytes {
 public:
  request_bytes() = default;
  explicit request_bytes(std::vector<unsigned char> bytes) : bytes_(std::move(bytes)) {}

  void put(std::uint64_t value) {
    unsigned char raw[sizeof value];
    std::memcpy(raw, &value, sizeof value);
    bytes_.insert(bytes_.end(), raw, raw + sizeof value);
  }
  std::uint64_t take() {
    std::uint64_t value = 0;
    need(sizeof value);
    std::memcpy(&value, bytes_.data() + at_, sizeof value);
    at_ += sizeof value;
    return value;
  }
  void put(std::string const& text) {
    put(static_cast<std::uint64_t>(text.size()));
    bytes_.insert(bytes_.end(), text.begin(), text.end());
  }
  std::string take_text() {
    auto const length = static_cast<std::size_t>(take());
    need(length);
    std::string text(reinterpret_cast<char const*>(bytes_.data() + at_), length);
    at_ += length;
    return text;
  }
  [[nodiscard]] bool done() const { return at_ == bytes_.size(); }
  [[nodiscard]] std::vector<unsigned char> const& bytes() const { return bytes_; }

 private:
  void need(std::size_t count) const {
    if (count > bytes_.size() - at_)
      fail("shardwise::load_options::only_rank0_reads: a rank of the node sent a truncated request (", bytes_.size(),
           " bytes); every rank of the node must load the same checkpoint with the same options");
  }
  std::vector<unsigned char> bytes_;
  std::size_t at_ = 0;
};

inline request_bytes encode_requests(std::vector<block_request> const& requests) {
  request_bytes out;
  for (auto const& [t, element_size] : requests) {
    out.put(t.name);
    for (std::size_t n :
         {static_cast<std::size_t>(t.type), static_cast<std::size_t>(t.shard_dim + 1),
          static_cast<std::size_t>(t.is_vector), t.local_rows, t.local_cols, t.row_offset, t.col_offset,
          t.physical_rows, t.cols, t.stored_rows, t.copies, t.block, static_cast<std::size_t>(t.mirror), element_size})
      out.put(n);
  }
  return out;
}

inline std::vector<block_request> decode_requests(request_bytes in) {
  std::vector<block_request> requests;
  while (!in.done()) {
    block_request r;
    tensor_layout& t = r.layout;
    t.name = in.take_text();
    t.type = static_cast<dtype>(in.take());
    t.shard_dim = static_cast<int>(in.take()) - 1;
    t.is_vector = in.take() != 0;
    for (std::size_t* n : {&t.local_rows, &t.local_cols, &t.row_offset, &t.col_offset, &t.physical_rows, &t.cols,
                           &t.stored_rows, &t.copies, &t.block})
      *n = static_cast<std::size_t>(in.take());
    t.mirror = in.take() != 0;
    r.element_size = static_cast<std::size_t>(in.take());
    requests.push_back(std::move(r));
  }
  return requests;
}

/// The reader's side of one block: read into a zeroed buffer of the requester's element type (zeros after an
/// error, so that no rank waits for a block that will not come), then hand it to deliver(data, bytes).
template <class Deliver>
void read_block(checkpoint_reader& reader, checkpoint_index const& index, block_request const& r, std::string& error,
                Deliver&& deliver) {
  auto const serve = [&]<class T>(T) {
    std::vector<T> block(r.layout.local_rows * r.layout.local_cols, T{0}), box;
    if (error.empty()) {
      try {
        if (!index.find(r.layout.name))
          fail("shardwise::load_options::only_rank0_reads: a rank of the node asked for tensor \"", r.layout.name,
               "\", which the checkpoint does not hold; every rank of the node must load the same checkpoint");
        reader.read(r.layout, block.data(), box);
      } catch (std::exception const& e) {
        error = e.what();
      }
    }
    deliver(block.data(), block.size() * sizeof(T));
  };
  if (r.element_size == sizeof(float))
    serve(float{});
  else if (r.element_size == sizeof(double))
    serve(double{});
  else {  // zeros of its size, and the error, so that the rank does not wait for a block that will not come
    if (error.empty())
      error = concat("shardwise::load_options::only_rank0_reads: tensor \"", r.layout.name, "\" has ", r.element_size,
                     "-byte elements; a checkpoint loads into float or double tensors");
    std::vector<unsigned char> const zeros(r.layout.local_rows * r.layout.local_cols * r.element_size, 0);
    deliver(zeros.data(), zeros.size());
  }
}

/// The first error among the node's ranks (empty if none), known to every one of them.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string node_agreed_error(read_turns const& node, std::string error);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string node_agreed_error(read_turns const& node, std::string error) {
  auto const receive_text = [&](int from) {
    std::string text;
    node.receive(from, [&](std::size_t bytes) -> void* {
      text.resize(bytes);
      return text.data();
    });
    return text;
  };
  if (node.rank != 0) {
    node.send(error.data(), error.size(), 0);
    return receive_text(0);
  }
  for (int r = 1; r < node.size; ++r) {
    std::string theirs = receive_text(r);
    if (error.empty()) error = std::move(theirs);
  }
  for (int r = 1; r < node.size; ++r) node.send(error.data(), error.size(), r);
  return error;
}
#endif

/// The node's first rank reads every block the node's ranks ask for, rank by rank, then its own. Returns the
/// first read error (empty if none), which every rank of the node then knows.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string read_for_the_node(model_tensors const& model, int size, int rank,
                                                                checkpoint_reader& reader,
                                                                checkpoint_index const& index, read_turns const& node);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string read_for_the_node(model_tensors const& model, int size, int rank,
                                                                checkpoint_reader& reader,
                                                                checkpoint_index const& index, read_turns const& node) {
  std::string error;
  if (node.rank != 0) {
    std::vector<block_request> mine;
    model.for_each(size, rank, true, [&](tensor_layout const& t, tensor_values const& value) {
      if (index.find(t.name)) mine.push_back({t, dtype_size(value.type)});
    });
    request_bytes const requests = encode_requests(mine);
    node.send(requests.bytes().data(), requests.bytes().size(), 0);
    model.for_each(size, rank, true, [&](tensor_layout const& t, tensor_values const& value) {
      if (!index.find(t.name)) return;
      node.receive(0, [&](std::size_t bytes) -> void* {
        if (bytes != value.bytes())
          fail("shardwise::load_options::only_rank0_reads: the node's reader sent ", bytes, " bytes for tensor \"",
               t.name, "\"; every rank of the node must load the same checkpoint with the same options");
        return value.data;
      });
    });
    return node_agreed_error(node, error);
  }
  if (checkpoint_load_hook) checkpoint_load_hook("read_begin", 0);
  for (int r = 1; r < node.size; ++r) {
    std::vector<unsigned char> bytes;
    node.receive(r, [&](std::size_t count) -> void* {
      bytes.resize(count);
      return bytes.data();
    });
    for (auto const& request : decode_requests(request_bytes(std::move(bytes))))
      read_block(reader, index, request, error,
                 [&](void const* data, std::size_t count) { node.send(data, count, r); });
  }
  model.for_each(size, rank, true, [&](tensor_layout const& t, tensor_values const& value) {  // its own
    if (!index.find(t.name)) return;
    value.set_zero();
    if (error.empty()) {
      try {
        reader.read(t, value);
      } catch (std::exception const& e) {
        error = e.what();
      }
    }
  });
  reader.close();
  if (checkpoint_load_hook) checkpoint_load_hook("read_end", 0);
  return node_agreed_error(node, error);
}
#endif

}  // namespace shardwise::detail
