#pragma once
/// \file
/// The definitions of what nn/pooling.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/nn/pooling.hpp>

namespace xshard::nn {

namespace detail {

XSHARD_DECL ops::pool2d_geometry pool_geometry(const std::array<std::size_t, 4>& x,
                                               const pool_options& o) {
    ops::pool2d_geometry g;
    g.batch = x[0];
    g.channels = x[1];
    g.in_h = x[2];
    g.in_w = x[3];
    g.kernel_h = g.kernel_w = o.kernel;
    g.stride_h = g.stride_w = o.stride ? o.stride : o.kernel;
    g.pad = ops::padding2d::uniform(o.padding);
    return g;
}

} // namespace detail

} // namespace xshard::nn

