#pragma once
/// \file
/// Convolution and pooling as operations of `xshard::ops` on traced tensors (ops/annotated.hpp):
/// conv2d, max_pool2d, avg_pool2d and global_avg_pool2d on NCHW activations, recorded in the
/// program being traced with their window attributes. On distributed tensors the layers of
/// nn/ run them (nn/conv2d.hpp, nn/pooling.hpp, nn/global_pooling.hpp), with the same local
/// kernels (ops/conv_kernels.hpp).
///
///     auto y = ops::conv2d(x, w, {.stride = 2, .padding = 1});
///     auto z = ops::conv2d.with({.padding = 1}).shard({{2, 1, 1, 1}, {1, 1, 1, 1}})(y, w2);
///     auto p = ops::max_pool2d(z, {.kernel = 3, .stride = 2, .padding = 1});
///     auto f = ops::global_avg_pool2d(p);                   // [N, C, H, W] -> [N, C]
///
/// `.with(options)` binds the attributes; `.shard(...)` then annotates one use, as MindSpore's
/// `ops.Conv2D(...).shard(((n, i, h, w), (o, i, 1, 1)))`.

#include <xshard/comm/error.hpp>
#include <xshard/core/annotation.hpp>
#include <xshard/ops/annotated.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xshard::ops {

/// Two extents of a window, the height's and the width's: `2` (both) or `{2, 1}`.
struct extent2d {
    std::size_t h = 1, w = 1;

    constexpr extent2d(std::size_t both = 1) noexcept
        : h(both)
        , w(both) {}
    constexpr extent2d(std::size_t height, std::size_t width) noexcept
        : h(height)
        , w(width) {}
};

/// Padding of a window: `1` (every side), `{1, 2}` (rows above and below, columns left and
/// right), or each side on its own (`window_padding::sides(top, bottom, left, right)`).
struct window_padding {
    std::size_t top = 0, bottom = 0, left = 0, right = 0;

    constexpr window_padding(std::size_t every = 0) noexcept
        : top(every)
        , bottom(every)
        , left(every)
        , right(every) {}
    constexpr window_padding(std::size_t rows, std::size_t columns) noexcept
        : top(rows)
        , bottom(rows)
        , left(columns)
        , right(columns) {}
    static constexpr window_padding sides(std::size_t top, std::size_t bottom, std::size_t left,
                                          std::size_t right) noexcept {
        window_padding p;
        p.top = top;
        p.bottom = bottom;
        p.left = left;
        p.right = right;
        return p;
    }
};

/// A 2-D convolution's attributes (ops/conv_kernels.hpp's `conv2d_geometry`): x [N, C, H, W]
/// by w [O, C / groups, kh, kw].
struct conv2d_options {
    extent2d stride = 1;
    window_padding padding = 0;
    extent2d dilation = 1;
    std::size_t groups = 1;

    /// The attributes a conv2d node records: {stride h, w, padding top, bottom, left, right,
    /// dilation h, w, groups}.
    op_attributes attributes() const {
        return {{std::int64_t(stride.h), std::int64_t(stride.w), std::int64_t(padding.top),
                 std::int64_t(padding.bottom), std::int64_t(padding.left),
                 std::int64_t(padding.right), std::int64_t(dilation.h), std::int64_t(dilation.w),
                 std::int64_t(groups)},
                {}};
    }
};

/// A pooling window's attributes (ops/conv_kernels.hpp's `pool2d_geometry`); a stride of 0
/// is the kernel's.
struct pool2d_options {
    extent2d kernel = 2;
    extent2d stride = 0;
    window_padding padding = 0;
    /// avg_pool2d: the padding counts as zeros (PyTorch's default), else each window's mean
    /// is over its part inside the image.
    bool count_include_pad = true;

    /// The attributes a pooling node records: {kernel h, w, stride h, w, padding top, bottom,
    /// left, right, count_include_pad}.
    op_attributes attributes() const {
        return {{std::int64_t(kernel.h), std::int64_t(kernel.w),
                 std::int64_t(stride.h ? stride.h : kernel.h),
                 std::int64_t(stride.w ? stride.w : kernel.w), std::int64_t(padding.top),
                 std::int64_t(padding.bottom), std::int64_t(padding.left),
                 std::int64_t(padding.right), std::int64_t(count_include_pad)},
                {}};
    }
};

/// An operation with its attributes bound, for one use in a traced program: callable on
/// traced operands, and annotatable with `.shard(...)` as the operations of ops/annotated.hpp.
class configured {
public:
    configured(std::string_view op, op_attributes at)
        : op_(op)
        , at_(std::move(at)) {}

    /// Records the operation on traced operands.
    template <traced_operand... A>
    auto operator()(const A&... operands) const {
        return trace_call(op_, at_, op_annotation{}, operands...);
    }

    /// One MindSpore strategy per operand.
    annotated shard(std::initializer_list<strategy> in) const {
        return annotated(op_, op_annotation{std::vector<strategy>(in), {}, {}}, at_);
    }
    annotated shard(std::vector<strategy> in) const {
        return annotated(op_, op_annotation{std::move(in), {}, {}}, at_);
    }
    /// One layout per operand, and optionally one per result.
    annotated shard(std::initializer_list<layout> in,
                    std::initializer_list<layout> out = {}) const {
        return annotated(op_, op_annotation{{}, std::vector<layout>(in), std::vector<layout>(out)},
                         at_);
    }

private:
    std::string_view op_;
    op_attributes at_;
};

/// conv2d(x [N, C, H, W], w [O, C / groups, kh, kw], options) -> [N, O, H', W']: the
/// cross-correlation of every framework's conv2d. Sharding (graph/primitives/conv.hpp): the
/// batch and both channel dimensions split (an input-channel split leaves a pending sum),
/// height and width whole.
struct conv2d_fn : shardable<conv2d_fn> {
    static constexpr std::string_view name = "conv2d";

    template <traced_operand X, traced_operand W>
    auto operator()(const X& x, const W& w, const conv2d_options& o = {}) const {
        return trace_call(name, o.attributes(), op_annotation{}, x, w);
    }
    /// The operation with its attributes bound (to annotate it: `.with(o).shard(...)`).
    configured with(const conv2d_options& o) const { return configured(name, o.attributes()); }
};
inline constexpr conv2d_fn conv2d{};

/// A pooling window over NCHW activations: [N, C, H, W] -> [N, C, H', W']. Sharding: batch
/// and channels split, height and width whole.
template <bool Max>
struct pool2d_fn : shardable<pool2d_fn<Max>> {
    static constexpr std::string_view name = Max ? "max_pool2d" : "avg_pool2d";

    template <traced_operand X>
    auto operator()(const X& x, const pool2d_options& o = {}) const {
        return trace_call(name, o.attributes(), op_annotation{}, x);
    }
    /// The operation with its attributes bound (to annotate it: `.with(o).shard(...)`).
    configured with(const pool2d_options& o) const { return configured(name, o.attributes()); }
};
/// The maximum of each window (padding never wins).
inline constexpr pool2d_fn<true> max_pool2d{};
/// The mean of each window.
inline constexpr pool2d_fn<false> avg_pool2d{};

/// Global average pooling, [N, C, H, W] -> [N, C]: the mean of every plane, recorded as the
/// mean over dimensions 2 and 3 (graph/primitives/reduce.hpp: height and width may stay
/// split, the result then a pending sum over their axes). Throws xshard::error unless x has
/// four dimensions.
template <traced_operand X>
auto global_avg_pool2d(const X& x) {
    if (x.rank() != 4)
        throw error("xshard: global_avg_pool2d takes [N, C, H, W], not a tensor of " +
                    std::to_string(x.rank()) + " dimensions");
    return trace_call("mean", op_attributes{{0, 2, 3}, {}}, op_annotation{}, x);
}

} // namespace xshard::ops
