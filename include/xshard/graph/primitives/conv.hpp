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
/// matrix [n, i, h, w, o]. The poolings keep the batch's and the channels' splits. The
/// weight's kernel dimensions are whole.
///
/// Height and width may be split too (spatial parallelism, as nn/'s layers run it): each rank
/// holds a band of rows and columns, and the output keeps the split. A window that straddles a
/// band's edge needs a few of its neighbours' rows, so the node gathers its *halo* first
/// (redistribute/halo.hpp: a message to and from each neighbouring band, planned once when the
/// program is compiled, `primitive::prepare`) and runs the kernel on the band with the
/// band's padding (the image's at its border, none where a halo serves). Where bands are
/// thinner than the halo, or a convolution's spatial axes are its weight's channel axes, the
/// rules take height and width whole instead, and the compiler gathers them on the edge
/// before the node. The search prices the halos (`op_rules::kernel_seconds`).
///
/// VJPs: conv2d's are conv2d_backward_input (each rank's term of dx where x is replicated over
/// the output channels' axes) and conv2d_backward_weight (each rank's term of dw over the
/// batch's and the spatial axes). max_pool2d keeps each window's argmax in the node's scratch
/// (one int32 per output element) and sends each cotangent to its winner; avg_pool2d spreads
/// it over the window. Over a split height or width they write the band's cotangent and the
/// halo's adjoint sends each halo's entries back to the rank owning the rows; conv2d gathers
/// the band again for the weight's gradient. Without such a split the VJPs send nothing.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/primitives/elementwise.hpp>
#include <xshard/ops/conv_kernels.hpp>
#include <xshard/ops/conv_rule.hpp>
#include <xshard/ops/spatial.hpp>
#include <xshard/redistribute/halo.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
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
/// overwrites computes a cotangent it must add (role 0), and where a window over a split
/// height or width keeps its band (role 1) and the band's cotangent (role 2).
template <class T, int Role = 0>
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

XSHARD_DECL void expect_nchw(std::span<const operand_type> ops, std::size_t i,
                             std::string_view what);

// Splits of height and width.

/// A compiled program's mesh as a halo plan reads it (redistribute/halo.hpp, `halo_mesh`).
struct mesh_view_ref {
    const mesh_view* view;
    const mesh_shape& shape() const { return view->shape; }
    int rank() const { return view->rank; }
    const mesh_coords& coords() const { return view->coords; }
    const communicator& sub(axis_set a) const { return view->group(a); }
};

/// Those of `all` whose dimension `x` splits over more than one rank.
XSHARD_DECL windowed_dims split_windows(const windowed_dims& all, const layout& x,
                                        const mesh_shape& mesh);

/// Whether halos serve `x` (global `shape`) split by height or width as it is: every band
/// finds the rows its windows need in its neighbours' bands.
XSHARD_DECL bool halos_serve(const layout& x, const value_shape& shape, const windowed_dims& all,
                             const mesh_shape& mesh);

/// The halo plan of a window node whose input is split by height or width, or null.
template <class T>
halo_plan<T, 4>* halo_of(const node_shards& s) {
    return static_cast<halo_plan<T, 4>*>(s.state.get());
}

/// Builds the node's halo plan (`primitive::prepare`) when its input is split by height or
/// width; `Windows` gives the node's windows.
template <class T, windowed_dims (*Windows)(const node_shards&)>
void prepare_halo(node_shards& s) {
    const auto& x = s.operands[0];
    const auto dims = split_windows(Windows(s), x.l, s.mesh->shape);
    if (dims.empty())
        return;
    auto plan = std::make_shared<halo_plan<T, 4>>(
        mesh_view_ref{s.mesh}, std::array{x.global[0], x.global[1], x.global[2], x.global[3]}, x.l,
        dims);
    s.kernel_bytes = plan->summary().bytes_sent();
    s.state = std::move(plan);
}

/// `g` (this rank's geometry of a window node) on the band of `h`: the band's extents, and
/// along each split dimension the padding its window applies (the image's at its border, 0
/// where a halo serves).
template <class G, class T>
G on_band(G g, const halo_plan<T, 4>& h) {
    g.in_h = h.band().extent[2];
    g.in_w = h.band().extent[3];
    for (const auto& wd : h.windows()) {
        auto& before = wd.dim == 2 ? g.pad.top : g.pad.left;
        auto& after = wd.dim == 2 ? g.pad.bottom : g.pad.right;
        before = h.pad_before()[wd.dim];
        after = h.pad_after()[wd.dim];
    }
    return g;
}

/// Seconds of a window node's halo exchanges in a training step (`op_rules::kernel_seconds`):
/// per split dimension, the largest band's halo rows, `runs` times.
XSHARD_DECL double halo_seconds(const windowed_dims& all, const shard_type& x,
                                const mesh_shape& mesh, const cost_model& model, double runs);

// Convolution.

/// The geometry of a conv2d node on an input of shape `x` and a weight of shape `w` (global
/// or local).
XSHARD_DECL ops::conv2d_geometry conv_geometry(const op_attributes& at, const value_shape& x,
                                               const value_shape& w);

XSHARD_DECL std::vector<result_spec> infer_conv2d(const op_attributes& at,
                                                  std::span<const operand_type> ops);

inline windowed_dims conv_windows(const ops::conv2d_geometry& g) {
    return ops::windows_of(g);
}

XSHARD_DECL layout_choice conv2d_layouts(const op_attributes& at, std::span<const operand_type> ops,
                                         std::vector<layout> asked, const mesh_shape& mesh);

inline bool conv2d_batched(const op_attributes&, std::span<const operand_type> ops, std::size_t i) {
    return i == 0 && !ops[0].is_weight;
}

/// MindSpore's Conv2D strategy ((n, i, h, w), (o, i, 1, 1)) on the device matrix
/// [n, i, h, w, o] (with repetition in front): both operands split the input channels over
/// the same axes.
XSHARD_DECL std::vector<layout> conv2d_resolve(std::span<const strategy> s, const mesh_shape& mesh);

inline double conv2d_flops(const op_attributes&, std::span<const shard_type> ops,
                           std::span<const shard_type> results) {
    const auto& w = ops[1].local;
    return 2.0 * double(results[0].count()) * double(w[1]) * double(w[2]) * double(w[3]);
}

/// The smallest extent of the GEMM a convolution amounts to per group: its output channels,
/// its input channels times the window, and the batch times the output plane (im2col's
/// columns). The backward products multiply over the same three.
XSHARD_DECL double conv2d_gemm_dimension(const op_attributes& at, std::span<const shard_type> ops,
                                         std::span<const shard_type>);

/// im2col's columns, where the kernels run im2col and a GEMM (double, or float planes under
/// oneDNN's threshold): written and read forward, again for the weights' gradient, and
/// written by the GEMM and read by col2im for the input's.
XSHARD_DECL double conv2d_columns_bytes(const op_attributes& at, std::span<const shard_type> ops,
                                        std::span<const shard_type>);

/// The halo forward, and backward the band again (for the weight's gradient) and the adjoint.
inline double conv2d_halo_seconds(const op_attributes& at, std::span<const shard_type> ops,
                                  std::span<const shard_type>, const mesh_shape& mesh,
                                  const cost_model& model) {
    return halo_seconds(conv_windows(conv_geometry(at, ops[0].global, ops[1].global)), ops[0], mesh,
                        model, 3);
}

inline constexpr op_rules conv2d_rules{.name = "conv2d",
                                       .infer = infer_conv2d,
                                       .rule = conv2d_layouts,
                                       .batched = conv2d_batched,
                                       .resolve = conv2d_resolve,
                                       .flops = conv2d_flops,
                                       .gemm_dimension = conv2d_gemm_dimension,
                                       .scratch_traffic = conv2d_columns_bytes,
                                       .kernel_seconds = conv2d_halo_seconds,
                                       .saves = saves_operand(0) | saves_operand(1)};

/// This rank's geometry: its blocks of x and w.
inline ops::conv2d_geometry local_conv_geometry(const node_shards& s) {
    return conv_geometry(s.node->attributes, s.operands[0].local, s.operands[1].local);
}

inline windowed_dims conv2d_node_windows(const node_shards& s) {
    return conv_windows(
        conv_geometry(s.node->attributes, s.operands[0].global, s.operands[1].global));
}

/// Over a split height or width the input is this rank's band: its halo gathered (a message
/// to each neighbouring band), the kernel run on it with the band's padding.
template <class T>
void conv2d_kernel(const forward_args& x) {
    const auto& s = x.shards;
    const T* in = static_cast<const T*>(x.operands[0]);
    auto g = local_conv_geometry(s);
    if (auto* h = halo_of<T>(s)) {
        T* band = window_temporary<T, 1>(h->band().size());
        h->forward(in, band);
        if (s.results[0].count() == 0)
            return;
        in = band;
        g = on_band(g, *h);
    }
    ops::conv2d_forward(in, static_cast<const T*>(x.operands[1]), static_cast<T*>(x.results[0]), g);
}

/// conv2d's VJP over a split height or width: dx is the halo's adjoint of the band's
/// cotangent (each halo's entries sent back to the rank owning the rows), dw this band's term,
/// from the band gathered again.
template <class T>
void conv2d_band_vjp(const vjp_args& v, halo_plan<T, 4>& h, const T* dy, T* dx, T* dw) {
    const auto& s = v.shards;
    const T* x = static_cast<const T*>(v.operands[0]);
    const T* w = static_cast<const T*>(v.operands[1]);
    const auto g = on_band(local_conv_geometry(s), h);
    const bool any = s.results[0].count() > 0;
    const std::size_t nb = h.band().size();
    if (dx) {
        T* db = window_temporary<T, 2>(nb);
        if (any)
            ops::conv2d_backward_input(dy, w, db, g);
        else
            std::fill_n(db, nb, T(0));
        const std::size_t n = s.operands[0].count();
        T* out = v.accumulate[0] ? window_temporary<T>(n) : dx;
        h.adjoint(db, out);
        if (v.accumulate[0])
            add_into(dx, out, n);
    }
    if (dw) {
        T* band = window_temporary<T, 1>(nb);
        h.forward(x, band);
        if (any)
            ops::conv2d_backward_weight(band, dy, dw, g, v.accumulate[1]);
        else if (!v.accumulate[1])
            std::fill_n(dw, s.operands[1].count(), T(0));
    }
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
    if (auto* h = halo_of<T>(s)) {
        conv2d_band_vjp(v, *h, dy, dx, dw);
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
XSHARD_DECL ops::pool2d_geometry pool_geometry(const op_attributes& at, const value_shape& x);

inline bool counts_padding(const op_attributes& at) {
    return window_attribute(at, 8, 1) != 0;
}

XSHARD_DECL std::vector<result_spec> infer_pool2d(const op_attributes& at,
                                                  std::span<const operand_type> ops);

inline windowed_dims pool_windows(const ops::pool2d_geometry& g) {
    return ops::windows_of(g);
}

/// Height and width stay split where halos serve them, and are taken whole otherwise.
XSHARD_DECL layout_choice pool2d_layouts(const op_attributes& at, std::span<const operand_type> ops,
                                         std::vector<layout> asked, const mesh_shape& mesh);

inline double pool2d_flops(const op_attributes& at, std::span<const shard_type>,
                           std::span<const shard_type> results) {
    return double(results[0].count()) * double(window_attribute(at, 0, 2)) *
           double(window_attribute(at, 1, 2));
}

/// The halo forward and its adjoint backward.
inline double pool2d_halo_seconds(const op_attributes& at, std::span<const shard_type> ops,
                                  std::span<const shard_type>, const mesh_shape& mesh,
                                  const cost_model& model) {
    return halo_seconds(pool_windows(pool_geometry(at, ops[0].global)), ops[0], mesh, model, 2);
}

inline constexpr op_rules max_pool2d_rules{.name = "max_pool2d",
                                           .infer = infer_pool2d,
                                           .rule = pool2d_layouts,
                                           .batched = first_batched,
                                           .resolve = resolve_each,
                                           .flops = pool2d_flops,
                                           .kernel_seconds = pool2d_halo_seconds,
                                           .saves = 0};
inline constexpr op_rules avg_pool2d_rules{.name = "avg_pool2d",
                                           .infer = infer_pool2d,
                                           .rule = pool2d_layouts,
                                           .batched = first_batched,
                                           .resolve = resolve_each,
                                           .flops = pool2d_flops,
                                           .kernel_seconds = pool2d_halo_seconds,
                                           .saves = 0};

/// This rank's geometry: its block of x, or over a split height or width its band.
template <class T>
ops::pool2d_geometry local_pool_geometry(const node_shards& s) {
    const auto g = pool_geometry(s.node->attributes, s.operands[0].local);
    const auto* h = halo_of<T>(s);
    return h ? on_band(g, *h) : g;
}

inline windowed_dims pool2d_node_windows(const node_shards& s) {
    return pool_windows(pool_geometry(s.node->attributes, s.operands[0].global));
}

/// This rank's input to a pooling: its block, or over a split height or width its band
/// (gathered here), or null where the block of the output is empty.
template <class T>
const T* pool_input(const forward_args& x) {
    const T* in = static_cast<const T*>(x.operands[0]);
    if (auto* h = halo_of<T>(x.shards)) {
        T* band = window_temporary<T, 1>(h->band().size());
        h->forward(in, band);
        in = band;
    }
    return x.shards.results[0].count() == 0 ? nullptr : in;
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
    if (const T* in = pool_input<T>(x))
        ops::max_pool2d_forward(in, static_cast<T*>(x.results[0]), argmax_of(x.shards),
                                local_pool_geometry<T>(x.shards));
}

template <class T>
void avg_pool2d_kernel(const forward_args& x) {
    if (const T* in = pool_input<T>(x))
        ops::avg_pool2d_forward(in, static_cast<T*>(x.results[0]), local_pool_geometry<T>(x.shards),
                                counts_padding(x.shards.node->attributes));
}

/// Runs `backward(dy, out)` (a kernel that overwrites `out`) into dx, or adds its result to dx.
/// Over a split height or width it writes the band's cotangent, and the halo's adjoint sends
/// each halo's entries back to the rank owning the rows.
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
    T* out = v.accumulate[0] ? window_temporary<T>(n) : dx;
    if (auto* h = halo_of<T>(v.shards)) {
        const std::size_t nb = h->band().size();
        T* band = window_temporary<T, 2>(nb);
        if (v.shards.results[0].count() > 0)
            backward(dy, band);
        else
            std::fill_n(band, nb, T(0));
        h->adjoint(band, out);
    } else {
        backward(dy, out);
    }
    if (v.accumulate[0])
        add_into(dx, out, n);
}

template <class T>
void max_pool2d_vjp(const vjp_args& v) {
    const auto g = local_pool_geometry<T>(v.shards);
    const std::int32_t* argmax = argmax_of(v.shards);
    pool2d_vjp<T>(v, [&](const T* dy, T* out) { ops::max_pool2d_backward(dy, argmax, out, g); });
}

template <class T>
void avg_pool2d_vjp(const vjp_args& v) {
    const auto g = local_pool_geometry<T>(v.shards);
    const bool include = counts_padding(v.shards.node->attributes);
    pool2d_vjp<T>(v, [&](const T* dy, T* out) { ops::avg_pool2d_backward(dy, out, g, include); });
}

template <class T>
void register_conv(auto&& add) {
    add(primitive<T>{&conv2d_rules, conv2d_kernel<T>, conv2d_vjp<T>, nullptr,
                     prepare_halo<T, conv2d_node_windows>});
    add(primitive<T>{&max_pool2d_rules, max_pool2d_kernel<T>, max_pool2d_vjp<T>, max_pool2d_scratch,
                     prepare_halo<T, pool2d_node_windows>});
    add(primitive<T>{&avg_pool2d_rules, avg_pool2d_kernel<T>, avg_pool2d_vjp<T>, nullptr,
                     prepare_halo<T, pool2d_node_windows>});
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/primitives/conv.ipp>
#endif
