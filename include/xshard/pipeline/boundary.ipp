#pragma once
/// \file
/// The definitions of what pipeline/boundary.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/pipeline/boundary.hpp>

namespace xshard::pipeline {

namespace detail {

XSHARD_DECL std::array<char, 256> boundary_header(const std::string& text) {
    std::array<char, 256> h{};
    std::memcpy(h.data(), text.data(), std::min(text.size(), h.size() - 1));
    return h;
}

} // namespace detail

} // namespace xshard::pipeline

