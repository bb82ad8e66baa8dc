#pragma once
/// \file
/// The definitions of what graph/schedule.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/schedule.hpp>

namespace xshard::detail {

XSHARD_DECL shard_type local_shard_of(const value_shape& global, const layout& l, dtype t,
                                      const mesh_view& mesh) {
    shard_type s{global, l, value_shape(global.size()), t};
    for (std::size_t d = 0; d < global.size(); ++d) {
        const auto k = std::size_t(l.split_count(d, mesh.shape));
        const auto i = std::size_t(l.block_index(d, mesh.shape, mesh.coords));
        s.local[d] = block_extent(global[d], k, i);
    }
    return s;
}

} // namespace xshard::detail

