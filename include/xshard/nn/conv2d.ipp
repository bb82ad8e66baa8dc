#pragma once
/// \file
/// The definitions of what nn/conv2d.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/nn/conv2d.hpp>

namespace xshard::nn {

XSHARD_DECL ops::conv2d_geometry local_conv_geometry(const std::array<std::size_t, 4>& x,
                                                     const std::array<std::size_t, 4>& w,
                                                     std::size_t stride, ops::padding2d pad,
                                                     std::size_t dilation, std::size_t groups) {
    ops::conv2d_geometry g;
    g.batch = x[0];
    g.in_channels = x[1];
    g.in_h = x[2];
    g.in_w = x[3];
    g.out_channels = w[0];
    g.kernel_h = w[2];
    g.kernel_w = w[3];
    g.stride_h = g.stride_w = stride;
    g.dilation_h = g.dilation_w = dilation;
    g.pad = pad;
    g.groups = groups;
    return g;
}

} // namespace xshard::nn

