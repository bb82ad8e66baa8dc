#pragma once
/// \file
/// Global average pooling (MindSpore's ReduceMean over H and W in ResNet's head): NCHW
/// [N, C, H, W] -> [N, C], the mean of every plane; the layout keeps the batch's and the
/// channels' splits ([dp, mp, -, -] -> [dp, mp]). Local forward and backward, unless height
/// or width is split (spatial parallelism, [dp, -, sp, -] -> [dp, -]): then each rank's
/// plane sums are all-reduced over the spatial axes (one all-reduce of N C values forward;
/// the output is replicated over them), and backward the output gradient's terms over the
/// spatial axes are summed first (one all-reduce of N C values) before each rank spreads it
/// over its band.

#include <xshard/comm/collectives.hpp>
#include <xshard/nn/module.hpp>
#include <xshard/ops/conv_rule.hpp>

#include <span>

namespace xshard::nn {

/// The global average pooling layer: see the file comment.
template <class T, mesh_type Mesh>
class global_avg_pool2d {
public:
    explicit global_avg_pool2d(const Mesh&) {}

    tensor<T, Mesh> forward(const tensor<T, Mesh, 4>& x) {
        const auto r = pool2d_rule(x.layout());
        raise_rule_problem(r.problem, "global_avg_pool2d");
        const auto& a = x.local();
        const std::size_t n = a.shape()[0], c = a.shape()[1], hw = a.shape()[2] * a.shape()[3];
        x_shape_ = x.shape();
        x_layout_ = x.layout();
        local_hw_ = {a.shape()[2], a.shape()[3]};
        const auto& ms = x.mesh().shape();
        spatial_axes_ = x.layout().split_axes(2, ms) | x.layout().split_axes(3, ms);
        const std::size_t plane = x_shape_[2] * x_shape_[3];
        xt::xtensor<T, 2> y = xt::zeros<T>({n, c});
        for (std::size_t i = 0; i < n * c; ++i) {
            T s = 0;
            for (std::size_t j = 0; j < hw; ++j)
                s += a.data()[i * hw + j];
            y.data()[i] = s;
        }
        if (!spatial_axes_.empty())
            allreduce(x.mesh().sub(spatial_axes_), std::span(y.data(), y.size()), reduction::sum);
        for (auto& v : y)
            v = plane ? v / T(plane) : T(0);
        layout out;
        out.dims.push_back(x.layout().dims[0]);
        out.dims.push_back(x.layout().dims[1]);
        return tensor<T, Mesh>(xshard::detail::unchecked, x.mesh(),
                               std::array{x_shape_[0], x_shape_[1]}, std::move(y), out);
    }

    tensor<T, Mesh, 4> backward(const tensor<T, Mesh>& dy_in) {
        // The output is replicated over the spatial axes: its gradient's terms there are
        // summed before every band takes its share.
        auto whole = dy_in.layout();
        whole.partial.clear();
        const auto& ms = dy_in.mesh().shape();
        for (const auto& a : dy_in.layout().partial)
            if (!spatial_axes_.contains(ms.index(a)))
                whole.partial.push_back(a);
        if (whole.partial.empty())
            whole.op = reduction::sum;
        const auto dy = resolve_(dy_in, whole);
        const auto& d = dy.local();
        const std::size_t n = d.shape()[0], c = d.shape()[1];
        const std::size_t hw = local_hw_[0] * local_hw_[1];
        const T plane = T(x_shape_[2] * x_shape_[3]);
        xt::xtensor<T, 4> dx = xt::xtensor<T, 4>::from_shape({n, c, local_hw_[0], local_hw_[1]});
        for (std::size_t i = 0; i < n * c; ++i)
            std::fill_n(dx.data() + i * hw, hw, d.data()[i] / plane);
        layout l = x_layout_;
        l.partial = dy.layout().partial;
        l.op = dy.layout().op;
        return tensor<T, Mesh, 4>(xshard::detail::unchecked, dy.mesh(), x_shape_, std::move(dx), l);
    }

    friend void visit_parameters(global_avg_pool2d&, auto&&) {}

private:
    std::array<std::size_t, 4> x_shape_{};
    std::array<std::size_t, 2> local_hw_{};
    layout x_layout_;
    axis_set spatial_axes_;
    kept_redistribution<T, Mesh, 2> resolve_;
};

} // namespace xshard::nn
