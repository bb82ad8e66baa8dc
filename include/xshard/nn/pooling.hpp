#pragma once
/// \file
/// Window pooling layers on NCHW activations: `max_pool2d` and `avg_pool2d` (kernel, stride,
/// padding). Rule (ops/conv_rule.hpp, `pool2d_rule`): the output keeps the input's layout
/// (batch, channels, height and width split as they come); forward and backward are local
/// (ops/conv_kernels.hpp), no message, unless height or width is split (spatial
/// parallelism): then each rank pools its extended band, gathered by the halo step
/// (nn/kept_halo.hpp), into its block of output rows (strides and windows straddling band
/// edges exact), and backward sums the halo rows' gradients back.

#include <xshard/compiled.hpp>
#include <xshard/nn/kept_halo.hpp>
#include <xshard/nn/module.hpp>
#include <xshard/nn/step_profile.hpp>
#include <xshard/ops/conv_kernels.hpp>
#include <xshard/ops/conv_rule.hpp>

#include <cstdint>
#include <vector>

namespace xshard::nn {

/// Kernel, stride (0: the kernel) and padding of a pooling window.
struct pool_options {
    std::size_t kernel = 2;
    std::size_t stride = 0;
    std::size_t padding = 0;
    bool count_include_pad = true; ///< avg_pool2d: padding counts as zeros
};

namespace detail {

XSHARD_DECL ops::pool2d_geometry pool_geometry(const std::array<std::size_t, 4>& x,
                                               const pool_options& o);

/// The pooling layers' shared part: rule, geometry, output tensor.
template <class T, mesh_type Mesh, bool Max>
class pool2d {
public:
    pool2d(const Mesh&, pool_options o)
        : o_(o) {}

    tensor<T, Mesh, 4> forward(const tensor<T, Mesh, 4>& x) {
        const auto r = pool2d_rule(x.layout());
        raise_rule_problem(r.problem, Max ? "max_pool2d" : "avg_pool2d");
        const auto& xs = x.shape();
        auto global = pool_geometry(ops::nchw_shape(xs), o_);
        global.check(Max ? "max_pool2d" : "avg_pool2d");
        spatial_ = splits_image(x.layout());
        const auto& xl = spatial_ ? halo_.band(x, ops::windows_of(global)) : x.local();
        g_ = pool_geometry(ops::nchw_shape(xl.shape()), o_);
        if (spatial_)
            g_.pad = halo_.padding();
        typename tensor<T, Mesh, 4>::local_type y =
            tensor<T, Mesh, 4>::local_type::from_shape(g_.output_shape());
        const profile_scope timed(step_part::pool);
        if constexpr (Max) {
            argmax_.resize(y.size());
            ops::max_pool2d_forward(xl.data(), y.data(), argmax_.data(), g_);
        } else {
            ops::avg_pool2d_forward(xl.data(), y.data(), g_, o_.count_include_pad);
        }
        x_shape_ = xs;
        return tensor<T, Mesh, 4>(xshard::detail::unchecked, x.mesh(), global.output_shape(),
                                  std::move(y), x.layout());
    }

    tensor<T, Mesh, 4> backward(const tensor<T, Mesh, 4>& dy) {
        typename tensor<T, Mesh, 4>::local_type dx =
            tensor<T, Mesh, 4>::local_type::from_shape(g_.input_shape());
        {
            const profile_scope timed(step_part::pool);
            if constexpr (Max)
                ops::max_pool2d_backward(dy.local().data(), argmax_.data(), dx.data(), g_);
            else
                ops::avg_pool2d_backward(dy.local().data(), dx.data(), g_, o_.count_include_pad);
        }
        if (spatial_ && !halo_.trivial())
            dx = halo_.adjoint(dx);
        return tensor<T, Mesh, 4>(xshard::detail::unchecked, dy.mesh(), x_shape_, std::move(dx),
                                  dy.layout());
    }

    friend void visit_parameters(pool2d&, auto&&) {}

    /// Bytes this rank's halo exchanges sent so far (0 without a spatial split).
    std::size_t halo_bytes_sent() const noexcept { return halo_.bytes_sent(); }

private:
    pool_options o_;
    ops::pool2d_geometry g_;
    std::vector<std::int32_t> argmax_;
    std::array<std::size_t, 4> x_shape_{};
    bool spatial_ = false;
    kept_halo<T, Mesh> halo_;
};

} // namespace detail

/// Max pooling (MindSpore's MaxPool2d): the largest value of each window; backward, dy to
/// each window's winner.
template <class T, mesh_type Mesh>
using max_pool2d = detail::pool2d<T, Mesh, true>;

/// Average pooling (MindSpore's AvgPool2d): the mean of each window.
template <class T, mesh_type Mesh>
using avg_pool2d = detail::pool2d<T, Mesh, false>;

} // namespace xshard::nn

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/nn/pooling.ipp>
#endif
