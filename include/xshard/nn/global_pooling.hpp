#pragma once
/// \file
/// Global average pooling (MindSpore's ReduceMean over H and W in ResNet's head): NCHW
/// [N, C, H, W] -> [N, C], the mean of every plane; the layout keeps the batch's and the
/// channels' splits ([dp, mp, -, -] -> [dp, mp]). Local forward and backward.

#include <xshard/nn/module.hpp>
#include <xshard/ops/conv_rule.hpp>

namespace xshard::nn {

/// The global average pooling layer: see the file comment.
template <class T, mesh_type Mesh>
class global_avg_pool2d {
public:
    explicit global_avg_pool2d(const Mesh&) {}

    tensor<T, Mesh> forward(const tensor<T, Mesh, 4>& x) {
        const auto r = pool2d_rule(x.layout());
        raise_conv_problem(r.problem, "global_avg_pool2d");
        const auto& a = x.local();
        const std::size_t n = a.shape()[0], c = a.shape()[1], hw = a.shape()[2] * a.shape()[3];
        xt::xtensor<T, 2> y = xt::zeros<T>({n, c});
        for (std::size_t i = 0; i < n * c; ++i) {
            T s = 0;
            for (std::size_t j = 0; j < hw; ++j)
                s += a.data()[i * hw + j];
            y.data()[i] = hw ? s / T(hw) : T(0);
        }
        x_shape_ = x.shape();
        x_layout_ = x.layout();
        layout out;
        out.dims.push_back(x.layout().dims[0]);
        out.dims.push_back(x.layout().dims[1]);
        return tensor<T, Mesh>(xshard::detail::unchecked, x.mesh(),
                               std::array{x_shape_[0], x_shape_[1]}, std::move(y), out);
    }

    tensor<T, Mesh, 4> backward(const tensor<T, Mesh>& dy) {
        const auto& d = dy.local();
        const std::size_t n = d.shape()[0], c = d.shape()[1];
        const std::size_t hw = x_shape_[2] * x_shape_[3];
        xt::xtensor<T, 4> dx = xt::xtensor<T, 4>::from_shape({n, c, x_shape_[2], x_shape_[3]});
        for (std::size_t i = 0; i < n * c; ++i)
            std::fill_n(dx.data() + i * hw, hw, d.data()[i] / T(hw));
        layout l = x_layout_;
        l.partial = dy.layout().partial;
        l.op = dy.layout().op;
        return tensor<T, Mesh, 4>(xshard::detail::unchecked, dy.mesh(), x_shape_, std::move(dx), l);
    }

    friend void visit_parameters(global_avg_pool2d&, auto&&) {}

private:
    std::array<std::size_t, 4> x_shape_{};
    layout x_layout_;
};

} // namespace xshard::nn
