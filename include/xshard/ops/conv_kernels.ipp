#pragma once
/// \file
/// The definitions of what ops/conv_kernels.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/ops/conv_kernels.hpp>

namespace xshard::ops {

namespace conv_detail {

XSHARD_DECL tap_range tap_of(std::size_t k, std::size_t dilation, std::size_t pad,
                             std::size_t stride, std::size_t in, std::size_t out) {
    tap_range t;
    t.offset = std::ptrdiff_t(k * dilation) - std::ptrdiff_t(pad);
    // The first i with i * stride + offset >= bound.
    auto from = [&](std::ptrdiff_t bound) {
        const std::ptrdiff_t need = bound - t.offset;
        return need <= 0 ? std::size_t(0)
                         : std::min(out, (std::size_t(need) + stride - 1) / stride);
    };
    t.first = from(0);
    t.last = std::max(t.first, from(std::ptrdiff_t(in)));
    return t;
}

XSHARD_DECL onednn_conv& onednn_conv_for(const conv2d_geometry& g) {
    struct entry {
        conv2d_geometry g;
        onednn_conv conv;
    };
    thread_local std::vector<std::unique_ptr<entry>> cache;
    auto same = [&](const conv2d_geometry& h) {
        return h.batch == g.batch && h.in_channels == g.in_channels && h.in_h == g.in_h &&
               h.in_w == g.in_w && h.out_channels == g.out_channels && h.kernel_h == g.kernel_h &&
               h.kernel_w == g.kernel_w && h.stride_h == g.stride_h && h.stride_w == g.stride_w &&
               h.dilation_h == g.dilation_h && h.dilation_w == g.dilation_w && h.pad == g.pad &&
               h.groups == g.groups;
    };
    for (auto& e : cache)
        if (same(e->g))
            return e->conv;
    cache.push_back(std::make_unique<entry>(entry{g, onednn_conv(g)}));
    return cache.back()->conv;
}

XSHARD_DECL std::size_t avg_divisor(const pool2d_geometry& g, std::size_t i, std::size_t j,
                                    bool count_include_pad) {
    if (count_include_pad)
        return g.kernel_h * g.kernel_w;
    const std::ptrdiff_t r0 = std::ptrdiff_t(i * g.stride_h) - std::ptrdiff_t(g.pad.top);
    const std::ptrdiff_t c0 = std::ptrdiff_t(j * g.stride_w) - std::ptrdiff_t(g.pad.left);
    const std::ptrdiff_t rows =
        std::min<std::ptrdiff_t>(r0 + std::ptrdiff_t(g.kernel_h), std::ptrdiff_t(g.in_h)) -
        std::max<std::ptrdiff_t>(r0, 0);
    const std::ptrdiff_t cols =
        std::min<std::ptrdiff_t>(c0 + std::ptrdiff_t(g.kernel_w), std::ptrdiff_t(g.in_w)) -
        std::max<std::ptrdiff_t>(c0, 0);
    return std::size_t(std::max<std::ptrdiff_t>(rows, 0) * std::max<std::ptrdiff_t>(cols, 0));
}

} // namespace conv_detail

} // namespace xshard::ops

