#pragma once
// safetensors (Hugging Face's format) for shardwise: memory-mapped reading of whole tensors or slices, and
// atomic writing, for F64, F32, F16, BF16, I64, I32, U8 and BOOL with string metadata.
//
//   sw::safetensors_writer out;
//   out.add("layers.0.weight", weight);                     // any shardwise tensor, or raw bytes with a dtype
//   out.write("model.safetensors", {{"format", "pt"}});     // temporary file, fsync, rename
//
//   sw::safetensors_file in("model.safetensors");           // mapped and checked; bad input throws sw::error
//   auto w = in.load<Eigen::MatrixXf>("layers.0.weight");   // whole tensor
//   in.read_rows("layers.0.weight", 128, 64, rows.data());  // rows 128..191, touching only their pages
#include "shardwise/checkpoint/dtype.hpp"
#include "shardwise/checkpoint/safetensors_header.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/safetensors_write.hpp"
