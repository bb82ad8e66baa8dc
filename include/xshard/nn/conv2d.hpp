#pragma once
/// \file
/// The 2-D convolution layer on NCHW activations (tensor<T, Mesh, 4>): stride, padding,
/// dilation, groups, optional bias. Its sharding rule is ops/conv_rule.hpp's `conv2d_rule`;
/// the layer chooses the weight's layout from `options::split`:
///
/// - `channel_split::none`: weight replicated; the input's batch split (data parallelism) is
///   kept. No message forward or backward (the weight gradient is each rank's term).
/// - `channel_split::output`: weight [axis, -, -, -]; the output's channels come out split
///   over `axis` (no message); the input's gradient is each rank's term (summed where the
///   forward pass copied: the adjoint of the slice, at the layer before).
/// - `channel_split::input`: weight [-, axis, -, -]; the input's channels are split over
///   `axis` (sliced for free when they are whole); the output is a pending sum over `axis`,
///   all-reduced to whole channels unless `resolve_output` is off (cost of the all-reduce:
///   2 (p-1)/p of the output block's bytes per rank; its adjoint, backward, the same).
///
/// Any of these combines with a height and/or width split of the input (spatial
/// parallelism, `[dp, -, sp, -]`): the layer gathers its extended band through the halo step
/// (nn/kept_halo.hpp), convolves it with the padding of its band edges and returns its block
/// of output rows, split like the input's (stride, dilation and uneven bands exact); backward
/// it sums the halo rows' gradients back (the step's adjoint). Cost per step: the halo rows,
/// (kernel - 1) dilation / 2 per side, of the local batch and channels, to and from each
/// neighbouring band, forward and backward. The weight gradient is each band's term (summed
/// over the spatial axes with the data-parallel ones by `synchronize_gradients`).
///
/// Local work is ops/conv_kernels.hpp's (oneDNN or im2col + GEMM).

#include <xshard/compiled.hpp>
#include <xshard/nn/kept_halo.hpp>
#include <xshard/nn/module.hpp>
#include <xshard/nn/step_profile.hpp>
#include <xshard/ops/conv_kernels.hpp>
#include <xshard/ops/conv_rule.hpp>

#include <optional>
#include <random>

namespace xshard::nn {

/// Which channels of a convolution's weight a mesh axis splits.
enum class channel_split : std::uint8_t { none, output, input };

/// The local geometry of a convolution of the local block `x` by the local block `w`.
XSHARD_DECL ops::conv2d_geometry local_conv_geometry(const std::array<std::size_t, 4>& x,
                                                     const std::array<std::size_t, 4>& w,
                                                     std::size_t stride, ops::padding2d pad,
                                                     std::size_t dilation, std::size_t groups);

/// The 2-D convolution layer: see the file comment.
template <class T, mesh_type Mesh>
class conv2d {
public:
    struct options {
        std::size_t stride = 1;
        std::size_t padding = 0;
        std::size_t dilation = 1;
        std::size_t groups = 1;
        bool bias = false;
        channel_split split = channel_split::none;
        std::string axis = "mp";
        bool resolve_output = true; ///< with channel_split::input: all-reduce the pending sum
    };

    /// Weights uniform in +-1/sqrt(fan_in) from `seed` (the same on any mesh and layout).
    conv2d(const Mesh& mesh, std::size_t in_channels, std::size_t out_channels, std::size_t kernel,
           unsigned seed, options o = {})
        : o_(std::move(o))
        , w_(make_weight<T>(mesh, std::array{out_channels, in_channels / o_.groups, kernel, kernel},
                            weight_layout(o_), seed,
                            std::uniform_real_distribution<T>(
                                -T(1) / std::sqrt(T(in_channels / o_.groups * kernel * kernel)),
                                T(1) / std::sqrt(T(in_channels / o_.groups * kernel * kernel))))) {
        if (o_.groups == 0 || in_channels % o_.groups != 0 || out_channels % o_.groups != 0)
            throw error("xshard: conv2d: " + std::to_string(in_channels) + " input and " +
                        std::to_string(out_channels) + " output channels do not split into " +
                        std::to_string(o_.groups) + " groups");
        if (o_.bias)
            b_.emplace(constant_weight<T>(
                mesh, std::array{out_channels},
                make_layout({o_.split == channel_split::output ? o_.axis : ""}), T(0)));
        const auto r = conv2d_rule(make_layout({"", "", "", ""}), w_.value.layout(), o_.groups);
        raise_rule_problem(r.problem, "conv2d");
    }

    tensor<T, Mesh, 4> forward(const tensor<T, Mesh, 4>& x_in) {
        const auto r = conv2d_rule(x_in.layout(), w_.value.layout(), o_.groups);
        raise_rule_problem(r.problem, "conv2d");
        x_layout_ = x_in.layout();
        x_ = to_input_(x_in, r.x);
        spatial_ = splits_image(r.x);
        const auto& xl = spatial_ ? halo_.band(*x_, windows()) : x_->local();
        const auto g = geometry(xl);
        const auto s = g.output_shape();
        typename tensor<T, Mesh, 4>::local_type y = tensor<T, Mesh, 4>::local_type::from_shape(s);
        {
            const profile_scope timed(step_part::conv_forward);
            ops::conv2d_forward(xl.data(), w_.value.local().data(), y.data(), g);
        }
        if (b_ && !r.out.is_partial())
            add_bias(y);
        const auto& shape = x_in.shape();
        const std::size_t k = w_.value.shape()[2], p = o_.padding;
        const std::array<std::size_t, 4> global{
            shape[0], w_.value.shape()[0],
            ops::window_output_extent(shape[2], p, p, k, o_.stride, o_.dilation),
            ops::window_output_extent(shape[3], p, p, k, o_.stride, o_.dilation)};
        tensor<T, Mesh, 4> out(xshard::detail::unchecked, x_in.mesh(), global, std::move(y), r.out);
        y_layout_ = r.out;
        if (r.out.is_partial() && o_.resolve_output) {
            auto whole = r.out;
            whole.partial.clear();
            out = resolve_(std::move(out), whole);
            if (b_)
                add_bias(out.local());
        }
        return out;
    }

    /// dy: the gradient of the output (in the dual of its layout); returns the input's, in
    /// the dual of the input's layout. Adds the weight's (and bias's) terms to their grad.
    tensor<T, Mesh, 4> backward(const tensor<T, Mesh, 4>& dy_in) {
        const auto& mesh = dy_in.mesh();
        tensor<T, Mesh, 4> dy = y_layout_.is_partial() && o_.resolve_output
                                    ? resolve_adjoint_.adjoint(dy_in, y_layout_)
                                    : dy_in;
        const auto& xl = spatial_ && !halo_.trivial() ? halo_.op().band() : x_->local();
        const auto g = geometry(xl);
        if (b_) {
            xt::xtensor<T, 1> db = xt::zeros<T>({g.out_channels});
            // The bias is added after the resolution: its gradient comes from dy_in's terms.
            const auto& d = dy_in.local();
            const std::size_t hw = g.out_h() * g.out_w();
            for (std::size_t n = 0; n < g.batch; ++n)
                for (std::size_t c = 0; c < g.out_channels; ++c)
                    for (std::size_t i = 0; i < hw; ++i)
                        db(c) += d.data()[(n * g.out_channels + c) * hw + i];
            auto bl = b_->value.layout();
            accumulate(*b_, tensor<T, Mesh, 1>(xshard::detail::unchecked, mesh, b_->value.shape(),
                                               std::move(db), dual(bl, mesh.shape())));
        }
        auto& grad = w_.terms();
        typename tensor<T, Mesh, 4>::local_type dx =
            tensor<T, Mesh, 4>::local_type::from_shape(xl.shape());
        {
            const profile_scope timed(step_part::conv_backward);
            ops::conv2d_backward_weight(xl.data(), dy.local().data(), grad.local().data(), g, true);
            ops::conv2d_backward_input(dy.local().data(), w_.value.local().data(), dx.data(), g);
        }
        if (spatial_ && !halo_.trivial())
            dx = halo_.adjoint(dx);
        tensor<T, Mesh, 4> dxt(xshard::detail::unchecked, mesh, x_->shape(), std::move(dx),
                               dual(x_->layout(), mesh.shape()));
        return to_input_.adjoint(std::move(dxt), x_layout_);
    }

    friend void visit_parameters(conv2d& l, auto&& visit) {
        visit("weight", l.w_);
        if (l.b_)
            visit("bias", *l.b_);
    }

    const weight<tensor<T, Mesh, 4>>& kernel() const noexcept { return w_; }

    /// Bytes this rank's halo exchanges sent so far (0 without a spatial split).
    std::size_t halo_bytes_sent() const noexcept { return halo_.bytes_sent(); }

private:
    static layout weight_layout(const options& o) {
        switch (o.split) {
        case channel_split::output:
            return make_layout({o.axis, "", "", ""});
        case channel_split::input:
            return make_layout({"", o.axis, "", ""});
        default:
            return make_layout({"", "", "", ""});
        }
    }

    /// The geometry of the local convolution of `xl` (the block, or the extended band with
    /// its edges' padding).
    template <class X>
    ops::conv2d_geometry geometry(const X& xl) const {
        return local_conv_geometry(ops::nchw_shape(xl.shape()),
                                   ops::nchw_shape(w_.value.local().shape()), o_.stride,
                                   spatial_ ? halo_.padding() : ops::padding2d::uniform(o_.padding),
                                   o_.dilation, o_.groups);
    }

    /// The windows along height and width: they depend on the kernel, stride, dilation and
    /// padding only, not on the image.
    windowed_dims windows() const {
        return ops::windows_of(local_conv_geometry({}, ops::nchw_shape(w_.value.shape()), o_.stride,
                                                   ops::padding2d::uniform(o_.padding), o_.dilation,
                                                   o_.groups));
    }

    template <class Y>
    void add_bias(Y& y) const {
        const auto& b = b_->value.local();
        const std::size_t n = y.shape()[0], c = y.shape()[1], hw = y.shape()[2] * y.shape()[3];
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t k = 0; k < c; ++k)
                for (std::size_t j = 0; j < hw; ++j)
                    y.data()[(i * c + k) * hw + j] += b(k);
    }

    options o_;
    weight<tensor<T, Mesh, 4>> w_;
    std::optional<weight<tensor<T, Mesh, 1>>> b_;
    std::optional<tensor<T, Mesh, 4>> x_;
    layout x_layout_, y_layout_;
    bool spatial_ = false;
    kept_halo<T, Mesh> halo_;
    kept_redistribution<T, Mesh, 4> to_input_, resolve_, resolve_adjoint_;
};

} // namespace xshard::nn

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/nn/conv2d.ipp>
#endif
