#pragma once
/// \file
/// The definitions of what graph/primitives/conv.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/primitives/conv.hpp>

namespace xshard::detail {

XSHARD_DECL void expect_nchw(std::span<const operand_type> ops, std::size_t i,
                             std::string_view what) {
    if (ops[i].shape.size() != 4)
        throw std::invalid_argument(std::string(what) +
                                    " takes NCHW activations [N, C, H, W], not " +
                                    shape_text(ops[i].shape));
}

XSHARD_DECL windowed_dims split_windows(const windowed_dims& all, const layout& x,
                                        const mesh_shape& mesh) {
    windowed_dims out;
    for (const auto& wd : all)
        if (x.split_count(wd.dim, mesh) > 1)
            out.push_back(wd);
    return out;
}

XSHARD_DECL bool halos_serve(const layout& x, const value_shape& shape, const windowed_dims& all,
                             const mesh_shape& mesh) {
    try {
        check_halo(x, mesh, std::array{shape[0], shape[1], shape[2], shape[3]},
                   split_windows(all, x, mesh));
        return true;
    } catch (const error&) {
        return false;
    }
}

XSHARD_DECL double halo_seconds(const windowed_dims& all, const shard_type& x,
                                const mesh_shape& mesh, const cost_model& model, double runs) {
    double seconds = 0;
    for (const auto& wd : split_windows(all, x.l, mesh)) {
        const auto d = wd.dim;
        const auto parts = std::size_t(x.l.split_count(d, mesh));
        std::size_t rows = 0;
        for (std::size_t i = 0; i < parts; ++i) {
            const auto b = band_of(x.global[d], parts, i, wd.window);
            rows = std::max(rows, b.halo_before() + b.halo_after());
        }
        std::size_t across = element_bytes(x.type);
        for (std::size_t k = 0; k < 4; ++k)
            if (k != d)
                across *= x.local[k];
        seconds +=
            model.seconds(step_kind::halo, mesh, x.l.split_axes(d, mesh), 2, rows * across, 0);
    }
    return runs * seconds;
}

XSHARD_DECL ops::conv2d_geometry conv_geometry(const op_attributes& at, const value_shape& x,
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

XSHARD_DECL std::vector<result_spec> infer_conv2d(const op_attributes& at,
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

XSHARD_DECL layout_choice conv2d_layouts(const op_attributes& at, std::span<const operand_type> ops,
                                         std::vector<layout> asked, const mesh_shape& mesh) {
    const std::size_t groups = window_attribute(at, 8, 1);
    layout x = whole_terms(asked[0]), w = whole_terms(asked[1]);
    w.dims[2] = w.dims[3] = {};
    if (groups > 1)
        x.dims[1] = w.dims[0] = w.dims[1] = {};
    // Height and width stay split where halos serve them and the weight's channels use
    // other axes; otherwise they are taken whole.
    auto r = conv2d_rule(x, w, groups);
    if (!x.dims[2].empty() || !x.dims[3].empty()) {
        if (r.problem == conv_problem::axis_conflict ||
            !halos_serve(x, ops[0].shape,
                         conv_windows(conv_geometry(at, ops[0].shape, ops[1].shape)), mesh)) {
            x.dims[2] = x.dims[3] = {};
            r = conv2d_rule(x, w, groups);
        }
    }
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

XSHARD_DECL std::vector<layout> conv2d_resolve(std::span<const strategy> s,
                                               const mesh_shape& mesh) {
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

XSHARD_DECL double conv2d_gemm_dimension(const op_attributes& at, std::span<const shard_type> ops,
                                         std::span<const shard_type>) {
    const auto g = conv_geometry(at, ops[0].local, ops[1].local);
    if (g.groups == 0)
        return 0;
    return double(
        std::min({g.out_channels / g.groups, g.in_channels / g.groups * g.kernel_h * g.kernel_w,
                  g.batch * g.out_h() * g.out_w()}));
}

XSHARD_DECL double conv2d_columns_bytes(const op_attributes& at, std::span<const shard_type> ops,
                                        std::span<const shard_type>) {
    const auto g = conv_geometry(at, ops[0].local, ops[1].local);
    if (ops[0].type == dtype::f32 &&
        ops::conv_detail::use_onednn<float>(ops::conv_backend::automatic, g))
        return 0;
    const double rows = double(g.in_channels) * double(g.kernel_h) * double(g.kernel_w);
    return 6 * rows * double(g.batch) * double(g.out_h() * g.out_w()) *
           double(element_bytes(ops[0].type));
}

XSHARD_DECL ops::pool2d_geometry pool_geometry(const op_attributes& at, const value_shape& x) {
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

XSHARD_DECL std::vector<result_spec> infer_pool2d(const op_attributes& at,
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

XSHARD_DECL layout_choice pool2d_layouts(const op_attributes& at, std::span<const operand_type> ops,
                                         std::vector<layout> asked, const mesh_shape& mesh) {
    layout x = whole_terms(asked[0]);
    if (!halos_serve(x, ops[0].shape, pool_windows(pool_geometry(at, ops[0].shape)), mesh))
        x.dims[2] = x.dims[3] = {};
    return {{x}, {x}};
}

} // namespace xshard::detail

