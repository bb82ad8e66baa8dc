#pragma once
/// \file
/// Convolutional primitives on NCHW activations, computed by ops/conv_kernels.hpp's kernels
/// (oneDNN or im2col + OpenBLAS for the convolution, loops for the poolings):
///  - conv2d(x [N, C, H, W], w [O, C / groups, kh, kw]) -> [N, O, H', W'] (attributes ints =
///    {stride h, w, padding top, bottom, left, right, dilation h, w, groups}: ops/conv.hpp's
///    `conv2d_options`);
///  - max_pool2d(x), avg_pool2d(x) -> [N, C, H', W'] (ints = {kernel h, w, stride h, w,
///    padding top, bottom, left, right, count_include_pad}: `pool2d_options`).
/// Global average pooling is the mean over dimensions 2 and 3 (graph/primitives/reduce.hpp).
///
/// Sharding. conv2d follows ops/conv_rule.hpp's `conv2d_rule`: the batch split (data
/// parallel: the weight's gradient is each rank's term), the output channels split (w
/// [mp, -, -, -]: the output's channels come out split, no message) and the input channels
/// split (x [.., mp, .., ..] with w [-, mp, -, -]: the output is a pending sum over their
/// axes, resolved on the edge to a consumer that needs whole values); the input takes the
/// weight's input-channel split, and a grouped convolution takes its channels whole.
/// MindSpore's Conv2D strategies ((n, i, h, w), (o, i, 1, 1)) resolve together on the device
/// matrix [n, i, h, w, o]. The poolings keep the batch's and the channels' splits. Height and
/// width are whole for all three: a window that straddles a band edge needs its neighbours'
/// rows (the halo step nn/'s layers run), which a program's edges do not plan, so the rules
/// ask for them whole and the compiler gathers them on the edge before the node. The
/// weight's kernel dimensions are whole.
///
/// VJPs, local, no communication: conv2d's are conv2d_backward_input (each rank's term of dx
/// where x is replicated over the output channels' axes) and conv2d_backward_weight (each
/// rank's term of dw over the batch's axes). max_pool2d keeps each window's argmax in the
/// node's scratch (one int32 per output element) and sends each cotangent to its winner;
/// avg_pool2d spreads it over the window.

#include <xshard/comm/error.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/primitives/elementwise.hpp>
#include <xshard/ops/conv_kernels.hpp>
#include <xshard/ops/conv_rule.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard::detail {

/// Attribute `i` of a window node (`fallback` when the node has fewer).
inline std::size_t window_attribute(const op_attributes& at, std::size_t i, std::size_t fallback) {
    return i < at.ints.size() && at.ints[i] >= 0 ? std::size_t(at.ints[i]) : fallback;
}

/// A per-thread buffer of `n` elements, grown as needed and kept: where a VJP whose kernel
/// overwrites computes a cotangent it must add.
template <class T>
T* window_temporary(std::size_t n) {
    thread_local std::vector<T> buffer;
    if (buffer.size() < n)
        buffer.resize(n);
    return buffer.data();
}

/// dst += src (n elements).
template <class T>
void add_into(T* dst, const T* src, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
        dst[i] += src[i];
}

inline void expect_nchw(std::span<const operand_type> ops, std::size_t i, std::string_view what) {
    if (ops[i].shape.size() != 4)
        throw std::invalid_argument(std::string(what) +
                                    " takes NCHW activations [N, C, H, W], not " +
                                    shape_text(ops[i].shape));
}

// Convolution.

/// The geometry of a conv2d node on an input of shape `x` and a weight of shape `w` (global
/// or local).
inline ops::conv2d_geometry conv_geometry(const op_attributes& at, const value_shape& x,
                                          const value_shape& w) {
    ops::conv2d_geometry g;
    g.batch = x[0];
    g.in_channels = x[1];
    g.in_h = x[2];
    g.in_w = x[3];
    g.out_channels = w[0];
    g.kernel_h = w[2];
    g.kernel_w = w[3];
    g.stride_h = window_attribute(at, 0, 1);
    g.stride_w = window_attribute(at, 1, 1);
    g.pad = {window_attribute(at, 2, 0), window_attribute(at, 3, 0), window_attribute(at, 4, 0),
             window_attribute(at, 5, 0)};
    g.dilation_h = window_attribute(at, 6, 1);
    g.dilation_w = window_attribute(at, 7, 1);
    g.groups = window_attribute(at, 8, 1);
    return g;
}

inline std::vector<result_spec> infer_conv2d(const op_attributes& at,
                                             std::span<const operand_type> ops) {
    expect_operands(ops, 2, "conv2d");
    expect_floating(ops, 0, "conv2d");
    expect_floating(ops, 1, "conv2d");
    if (ops[0].type != ops[1].type)
        throw std::invalid_argument("the operands have different element types");
    expect_nchw(ops, 0, "conv2d");
    if (ops[1].shape.size() != 4)
        throw std::invalid_argument("the weight must be [O, C / groups, kh, kw], not " +
                                    shape_text(ops[1].shape));
    const auto g = conv_geometry(at, ops[0].shape, ops[1].shape);
    if (g.groups == 0 || g.in_channels % g.groups != 0 || g.out_channels % g.groups != 0 ||
        ops[1].shape[1] * g.groups != g.in_channels)
        throw std::invalid_argument("the input " + shape_text(ops[0].shape) + " and the weight " +
                                    shape_text(ops[1].shape) + " do not convolve in " +
                                    std::to_string(g.groups) +
                                    " groups (the weight is [O, C / groups, kh, kw], C and O "
                                    "multiples of groups)");
    if (g.kernel_h == 0 || g.kernel_w == 0 || g.stride_h == 0 || g.stride_w == 0 ||
        g.dilation_h == 0 || g.dilation_w == 0)
        throw std::invalid_argument("kernel, stride and dilation must be positive");
    if (g.out_h() == 0 || g.out_w() == 0)
        throw std::invalid_argument("the window does not fit the padded input " +
                                    shape_text(ops[0].shape));
    return {{{g.batch, g.out_channels, g.out_h(), g.out_w()}, ops[0].type}};
}

inline layout_choice conv2d_layouts(const op_attributes& at, std::span<const operand_type>,
                                    std::vector<layout> asked, const mesh_shape&) {
    const std::size_t groups = window_attribute(at, 8, 1);
    layout x = whole_terms(asked[0]), w = whole_terms(asked[1]);
    x.dims[2] = x.dims[3] = w.dims[2] = w.dims[3] = {};
    if (groups > 1)
        x.dims[1] = w.dims[0] = w.dims[1] = {};
    const auto r = conv2d_rule(x, w, groups);
    // The input takes the weight's input-channel split (a mismatch is an edge's move).
    if (r.problem != conv_problem::none && r.problem != conv_problem::channel_mismatch) {
        try {
            raise_conv_problem(r.problem, "conv2d");
        } catch (const error& e) {
            throw std::invalid_argument(e.what());
        }
    }
    return {{r.x, r.w}, {r.out}};
}

inline bool conv2d_batched(const op_attributes&, std::span<const operand_type> ops, std::size_t i) {
    return i == 0 && !ops[0].is_weight;
}

/// MindSpore's Conv2D strategy ((n, i, h, w), (o, i, 1, 1)) on the device matrix
/// [n, i, h, w, o] (with repetition in front): both operands split the input channels over
/// the same axes.
inline std::vector<layout> conv2d_resolve(std::span<const strategy> s, const mesh_shape& mesh) {
    if (s.size() != 2 || s[0].rank() != 4 || s[1].rank() != 4)
        return resolve_each(s, mesh);
    const std::string what = "Conv2D strategy (" + s[0].to_string() + ", " + s[1].to_string() + ")";
    if (s[1].counts[1] != s[0].counts[1] || s[1].counts[2] != 1 || s[1].counts[3] != 1)
        throw std::invalid_argument(what + ": the strategies must be ((n, i, h, w), (o, i, 1, 1)) "
                                           "with the same input-channel count i");
    static_vector<int, max_tensor_rank + 2> counts;
    for (std::size_t d = 0; d < 4; ++d)
        counts.push_back(s[0].counts[d]);
    counts.push_back(s[1].counts[0]);
    try {
        const auto g = resolve_device_matrix(counts, mesh, what);
        layout x = layout::replicated(4), w = layout::replicated(4);
        for (std::size_t d = 0; d < 4; ++d)
            x.dims[d] = g[d];
        w.dims[0] = g[4];
        w.dims[1] = g[1];
        return {x, w};
    } catch (const std::invalid_argument& e) {
        // "xshard: Conv2D strategy ...": the caller names the node.
        std::string text = e.what();
        if (text.rfind("xshard: ", 0) == 0)
            text = text.substr(8);
        throw std::invalid_argument(text);
    }
}

inline double conv2d_flops(const op_attributes&, std::span<const shard_type> ops,
                           std::span<const shard_type> results) {
    const auto& w = ops[1].local;
    return 2.0 * double(results[0].count()) * double(w[1]) * double(w[2]) * double(w[3]);
}

inline constexpr op_rules conv2d_rules{.name = "conv2d",
                                       .infer = infer_conv2d,
                                       .rule = conv2d_layouts,
                                       .batched = conv2d_batched,
                                       .resolve = conv2d_resolve,
                                       .flops = conv2d_flops,
                                       .saves = saves_operand(0) | saves_operand(1)};

/// This rank's geometry: its blocks of x and w.
inline ops::conv2d_geometry local_conv_geometry(const node_shards& s) {
    return conv_geometry(s.node->attributes, s.operands[0].local, s.operands[1].local);
}

template <class T>
void conv2d_kernel(const forward_args& x) {
    ops::conv2d_forward(static_cast<const T*>(x.operands[0]), static_cast<const T*>(x.operands[1]),
                        static_cast<T*>(x.results[0]), local_conv_geometry(x.shards));
}

template <class T>
void conv2d_vjp(const vjp_args& v) {
    const auto& s = v.shards;
    const T* x = static_cast<const T*>(v.operands[0]);
    const T* w = static_cast<const T*>(v.operands[1]);
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    T* dw = static_cast<T*>(v.operand_cotangents[1]);
    if (!dy) {
        if (dx && !v.accumulate[0])
            std::fill_n(dx, s.operands[0].count(), T(0));
        if (dw && !v.accumulate[1])
            std::fill_n(dw, s.operands[1].count(), T(0));
        return;
    }
    const auto g = local_conv_geometry(s);
    if (dx) {
        const std::size_t n = s.operands[0].count();
        if (v.accumulate[0]) {
            T* tmp = window_temporary<T>(n);
            ops::conv2d_backward_input(dy, w, tmp, g);
            add_into(dx, tmp, n);
        } else {
            ops::conv2d_backward_input(dy, w, dx, g);
        }
    }
    if (dw)
        ops::conv2d_backward_weight(x, dy, dw, g, v.accumulate[1]);
}

// Pooling.

/// The geometry of a pooling node on an input of shape `x` (global or local).
inline ops::pool2d_geometry pool_geometry(const op_attributes& at, const value_shape& x) {
    ops::pool2d_geometry g;
    g.batch = x[0];
    g.channels = x[1];
    g.in_h = x[2];
    g.in_w = x[3];
    g.kernel_h = window_attribute(at, 0, 2);
    g.kernel_w = window_attribute(at, 1, 2);
    g.stride_h = window_attribute(at, 2, g.kernel_h);
    g.stride_w = window_attribute(at, 3, g.kernel_w);
    g.pad = {window_attribute(at, 4, 0), window_attribute(at, 5, 0), window_attribute(at, 6, 0),
             window_attribute(at, 7, 0)};
    return g;
}

inline bool counts_padding(const op_attributes& at) {
    return window_attribute(at, 8, 1) != 0;
}

inline std::vector<result_spec> infer_pool2d(const op_attributes& at,
                                             std::span<const operand_type> ops) {
    expect_operands(ops, 1, "a pooling");
    expect_floating(ops, 0, "a pooling");
    expect_nchw(ops, 0, "a pooling");
    const auto g = pool_geometry(at, ops[0].shape);
    if (g.kernel_h == 0 || g.kernel_w == 0 || g.stride_h == 0 || g.stride_w == 0)
        throw std::invalid_argument("kernel and stride must be positive");
    if (g.pad.top >= g.kernel_h || g.pad.bottom >= g.kernel_h || g.pad.left >= g.kernel_w ||
        g.pad.right >= g.kernel_w)
        throw std::invalid_argument(
            "the padding must be smaller than the window (a window of padding only)");
    if (g.out_h() == 0 || g.out_w() == 0)
        throw std::invalid_argument("the window does not fit the padded input " +
                                    shape_text(ops[0].shape));
    if (g.in_h * g.in_w > std::size_t(std::numeric_limits<std::int32_t>::max()))
        throw std::invalid_argument("a plane of " + shape_text(ops[0].shape) +
                                    " is too large for the argmax indices (int32)");
    return {{{g.batch, g.channels, g.out_h(), g.out_w()}, ops[0].type}};
}

inline layout_choice pool2d_layouts(const op_attributes&, std::span<const operand_type>,
                                    std::vector<layout> asked, const mesh_shape&) {
    layout x = whole_terms(asked[0]);
    x.dims[2] = x.dims[3] = {};
    return {{x}, {x}};
}

inline double pool2d_flops(const op_attributes& at, std::span<const shard_type>,
                           std::span<const shard_type> results) {
    return double(results[0].count()) * double(window_attribute(at, 0, 2)) *
           double(window_attribute(at, 1, 2));
}

inline constexpr op_rules max_pool2d_rules{.name = "max_pool2d",
                                           .infer = infer_pool2d,
                                           .rule = pool2d_layouts,
                                           .batched = first_batched,
                                           .resolve = resolve_each,
                                           .flops = pool2d_flops,
                                           .saves = 0};
inline constexpr op_rules avg_pool2d_rules{.name = "avg_pool2d",
                                           .infer = infer_pool2d,
                                           .rule = pool2d_layouts,
                                           .batched = first_batched,
                                           .resolve = resolve_each,
                                           .flops = pool2d_flops,
                                           .saves = 0};

inline ops::pool2d_geometry local_pool_geometry(const node_shards& s) {
    return pool_geometry(s.node->attributes, s.operands[0].local);
}

/// The argmax indices a max-pool node keeps: one per output element.
inline std::size_t max_pool2d_scratch(const node_shards& s) {
    return s.results[0].count() * sizeof(std::int32_t);
}

inline std::int32_t* argmax_of(const node_shards& s) {
    return reinterpret_cast<std::int32_t*>(s.scratch.data());
}

template <class T>
void max_pool2d_kernel(const forward_args& x) {
    ops::max_pool2d_forward(static_cast<const T*>(x.operands[0]), static_cast<T*>(x.results[0]),
                            argmax_of(x.shards), local_pool_geometry(x.shards));
}

template <class T>
void avg_pool2d_kernel(const forward_args& x) {
    ops::avg_pool2d_forward(static_cast<const T*>(x.operands[0]), static_cast<T*>(x.results[0]),
                            local_pool_geometry(x.shards),
                            counts_padding(x.shards.node->attributes));
}

/// Runs `backward(dy, out)` (a kernel that overwrites `out`) into dx, or adds its result to dx.
template <class T, class Backward>
void pool2d_vjp(const vjp_args& v, Backward backward) {
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    if (!dx)
        return;
    const std::size_t n = v.shards.operands[0].count();
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    if (!dy) {
        if (!v.accumulate[0])
            std::fill_n(dx, n, T(0));
        return;
    }
    if (!v.accumulate[0]) {
        backward(dy, dx);
        return;
    }
    T* tmp = window_temporary<T>(n);
    backward(dy, tmp);
    add_into(dx, tmp, n);
}

template <class T>
void max_pool2d_vjp(const vjp_args& v) {
    const auto g = local_pool_geometry(v.shards);
    const std::int32_t* argmax = argmax_of(v.shards);
    pool2d_vjp<T>(v, [&](const T* dy, T* out) { ops::max_pool2d_backward(dy, argmax, out, g); });
}

template <class T>
void avg_pool2d_vjp(const vjp_args& v) {
    const auto g = local_pool_geometry(v.shards);
    const bool include = counts_padding(v.shards.node->attributes);
    pool2d_vjp<T>(v, [&](const T* dy, T* out) { ops::avg_pool2d_backward(dy, out, g, include); });
}

template <class T>
void register_conv(auto&& add) {
    add(primitive<T>{&conv2d_rules, conv2d_kernel<T>, conv2d_vjp<T>});
    add(primitive<T>{&max_pool2d_rules, max_pool2d_kernel<T>, max_pool2d_vjp<T>,
                     max_pool2d_scratch});
    add(primitive<T>{&avg_pool2d_rules, avg_pool2d_kernel<T>, avg_pool2d_vjp<T>});
}

} // namespace xshard::detail
