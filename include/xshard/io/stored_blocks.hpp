#pragma once
/// \file
/// Where a checkpoint keeps each tensor's bytes. A checkpoint is a set of *stored blocks*: in
/// the integrated form, every tensor whole in one safetensors file; in the per-rank form, a
/// directory with the block of each tensor that each rank held in that rank's file,
/// `rank_<r>.safetensors` (a replicated block once: the copy of its first holder), beside
/// `strategy.json` and `checkpoint.json`. The stored blocks of a tensor are the blocks of its
/// layout's primary holders, so every process computes them from the strategy alone.

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
inline std::string rank_file_name(int rank) {
    return "rank_" + std::to_string(rank) + ".safetensors";
}
/// Rank `rank`'s file in per-rank checkpoint directory `dir`.
inline std::string rank_file(const std::string& dir, int rank) {
    return dir + "/" + rank_file_name(rank);
}

/// True for the names of a per-rank checkpoint's files ("rank_3.safetensors", "strategy.json",
/// "checkpoint.json", and the temporaries of the last two).
inline bool checkpoint_file_name(const std::string& name) {
    if (name == "strategy.json" || name == "checkpoint.json")
        return true;
    for (const char* json : {"strategy.json.tmp-", "checkpoint.json.tmp-"})
        if (name.rfind(json, 0) == 0 && name.size() == std::strlen(json) + 16)
            return true;
    const std::string prefix = "rank_", suffix = ".safetensors";
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        !name.ends_with(suffix))
        return false;
    const auto digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    return digits.find_first_not_of("0123456789") == std::string::npos;
}

/// The stored blocks of a tensor of `shape` with layout `lay` saved on `mesh`: the block of
/// each primary holder (coordinate 0 along the replicated axes), in mesh rank order, as
/// (rank, offset, extent). Work and memory in proportion to the number of blocks, whatever
/// the mesh's size.
inline std::vector<std::tuple<int, std::vector<std::size_t>, std::vector<std::size_t>>>
primary_blocks(const mesh_shape& mesh, const layout& lay, const std::vector<std::size_t>& shape) {
    const auto spread = lay.replicated_axes(mesh);
    const int count = mesh.size() / mesh.group_size(spread);
    std::vector<std::tuple<int, std::vector<std::size_t>, std::vector<std::size_t>>> out;
    out.reserve(std::size_t(count));
    auto c = mesh.coords(0);
    for (int g = 0; g < count; ++g) {
        // The g-th combination of the coordinates on the other axes (row-major).
        for (std::size_t a = mesh.ndim(), rest = std::size_t(g); a-- > 0;) {
            if (spread.contains(a))
                continue;
            c[a] = int(rest % std::size_t(mesh.sizes[a]));
            rest /= std::size_t(mesh.sizes[a]);
        }
        std::vector<std::size_t> offset, extent;
        for (std::size_t d = 0; d < shape.size(); ++d) {
            const auto k = std::size_t(lay.split_count(d, mesh)),
                       i = std::size_t(lay.block_index(d, mesh, c));
            offset.push_back(block_offset(shape[d], k, i));
            extent.push_back(block_extent(shape[d], k, i));
        }
        out.emplace_back(mesh.rank_of(c), std::move(offset), std::move(extent));
    }
    return out;
}

/// The number of stored blocks of a tensor with layout `lay` saved on `mesh`.
inline std::size_t primary_block_count(const mesh_shape& mesh, const layout& lay) {
    return std::size_t(mesh.size() / mesh.group_size(lay.replicated_axes(mesh)));
}

} // namespace detail

} // namespace xshard
