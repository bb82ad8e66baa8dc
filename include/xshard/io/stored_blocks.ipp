#pragma once
/// \file
/// The definitions of what io/stored_blocks.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/stored_blocks.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::string rank_file_name(int rank) {
    return "rank_" + std::to_string(rank) + ".safetensors";
}

XSHARD_DECL std::string rank_file(const std::string& dir, int rank) {
    return dir + "/" + rank_file_name(rank);
}

XSHARD_DECL bool checkpoint_file_name(const std::string& name) {
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

XSHARD_DECL std::vector<std::tuple<int, std::vector<std::size_t>, std::vector<std::size_t>>>
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

} // namespace detail

} // namespace xshard

