#pragma once
/// \file
/// Flatten (MindSpore's Flatten): NCHW [N, C, H, W] -> [N, C H W], row-major, the batch's
/// split kept. The channels must be whole unless H = W = 1 (then [dp, mp, -, -] -> [dp, mp]).
/// Local forward and backward (a reshape of the block). A height or width split (spatial
/// parallelism) is gathered first, the rows of C H W being whole only then (one all-gather
/// over the spatial axes forward, its adjoint, a reduce-scatter, backward).

#include <xshard/nn/module.hpp>
#include <xshard/ops/conv_rule.hpp>

namespace xshard::nn {

/// The flatten layer: see the file comment.
template <class T, mesh_type Mesh>
class flatten {
public:
    explicit flatten(const Mesh&) {}

    tensor<T, Mesh> forward(const tensor<T, Mesh, 4>& x_in) {
        const auto r = pool2d_rule(x_in.layout());
        raise_rule_problem(r.problem, "flatten");
        in_layout_ = x_in.layout();
        auto whole = x_in.layout();
        whole.dims[2].clear();
        whole.dims[3].clear();
        const auto x = gather_(x_in, whole);
        const auto& s = x.shape();
        if (x.layout().is_split(1) && s[2] * s[3] != 1)
            throw error("xshard: flatten: the channels are split (" + x.layout().to_string() +
                        ") and the planes larger than 1 x 1; gather the channels first");
        x_shape_ = s;
        x_layout_ = x.layout();
        const auto& a = x.local();
        xt::xtensor<T, 2> y = xt::xtensor<T, 2>::from_shape(
            {a.shape()[0], a.shape()[1] * a.shape()[2] * a.shape()[3]});
        std::copy_n(a.data(), a.size(), y.data());
        layout out;
        out.dims.push_back(x.layout().dims[0]);
        out.dims.push_back(x.layout().dims[1]);
        return tensor<T, Mesh>(xshard::detail::unchecked, x.mesh(),
                               std::array{s[0], s[1] * s[2] * s[3]}, std::move(y), out);
    }

    tensor<T, Mesh, 4> backward(const tensor<T, Mesh>& dy) {
        const auto& d = dy.local();
        xt::xtensor<T, 4> dx = xt::xtensor<T, 4>::from_shape(
            {d.shape()[0], d.shape()[1] / (x_shape_[2] * x_shape_[3]), x_shape_[2], x_shape_[3]});
        std::copy_n(d.data(), d.size(), dx.data());
        layout l = x_layout_;
        l.partial = dy.layout().partial;
        l.op = dy.layout().op;
        return gather_.adjoint(
            tensor<T, Mesh, 4>(xshard::detail::unchecked, dy.mesh(), x_shape_, std::move(dx), l),
            in_layout_);
    }

    friend void visit_parameters(flatten&, auto&&) {}

private:
    std::array<std::size_t, 4> x_shape_{};
    layout x_layout_, in_layout_;
    kept_redistribution<T, Mesh, 4> gather_;
};

} // namespace xshard::nn
