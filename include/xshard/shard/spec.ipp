#pragma once
/// \file
/// The definitions of what shard/spec.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/shard/spec.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL layout spec_layout(const strategy& s, std::size_t, const mesh_shape& mesh) {
    try {
        return resolve(s, mesh);
    } catch (const std::invalid_argument& e) {
        throw error(e.what());
    }
}

} // namespace detail

} // namespace xshard

