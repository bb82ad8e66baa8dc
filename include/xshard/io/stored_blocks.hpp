#pragma once
/// \file
/// Where a checkpoint keeps each tensor's bytes. A checkpoint is a set of *stored blocks*: in
/// the integrated form, every tensor whole in one safetensors file; in the per-rank form, a
/// directory with the block of each tensor that each rank held in that rank's file,
/// `rank_<r>.safetensors` (a replicated block once: the copy of its first holder), beside
/// `strategy.json` and `checkpoint.json`. The stored blocks of a tensor are the blocks of its
/// layout's primary holders, so every process computes them from the strategy alone.

#include <xshard/compiled.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/json_envelope.hpp>

#include <cstddef>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace xshard {

/// The two forms of a checkpoint: one safetensors file holding every tensor whole, or a
/// directory of one file per rank (see the file comment).
enum class checkpoint_format { integrated, per_rank };

/// A stored block: which file (a source rank for the per-rank form, 0 for the integrated
/// form) holds which box of a tensor.
struct stored_block {
    int file = 0;
    std::vector<std::size_t> offset, extent;
    std::size_t index = 0; ///< its place among the tensor's stored blocks (blocks())

    std::size_t size() const { return volume(extent); }
};

namespace detail {

/// The envelope of a per-rank checkpoint's checkpoint.json (io/json_envelope.hpp): no mesh
/// (strategy.json has it).
inline constexpr json_file_kind checkpoint_json_kind{"xshard-checkpoint", 1, "checkpoint", false};

/// The name of rank `rank`'s file in a per-rank checkpoint directory.
XSHARD_DECL std::string rank_file_name(int rank);
/// Rank `rank`'s file in per-rank checkpoint directory `dir`.
XSHARD_DECL std::string rank_file(const std::string& dir, int rank);

/// True for the names of a per-rank checkpoint's files ("rank_3.safetensors", "strategy.json",
/// "checkpoint.json", and the temporaries of the last two).
XSHARD_DECL bool checkpoint_file_name(const std::string& name);

/// The stored blocks of a tensor of `shape` with layout `lay` saved on `mesh`: the block of
/// each primary holder (coordinate 0 along the replicated axes), in mesh rank order, as
/// (rank, offset, extent). Work and memory in proportion to the number of blocks, whatever
/// the mesh's size.
XSHARD_DECL std::vector<std::tuple<int, std::vector<std::size_t>, std::vector<std::size_t>>>
primary_blocks(const mesh_shape& mesh, const layout& lay, const std::vector<std::size_t>& shape);

/// The number of stored blocks of a tensor with layout `lay` saved on `mesh`.
inline std::size_t primary_block_count(const mesh_shape& mesh, const layout& lay) {
    return std::size_t(mesh.size() / mesh.group_size(lay.replicated_axes(mesh)));
}

} // namespace detail

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/stored_blocks.ipp>
#endif
