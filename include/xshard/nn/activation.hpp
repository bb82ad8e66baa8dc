#pragma once
/// \file
/// Elementwise activation layers: relu and gelu (exact, erf form, as xshard::ops::gelu). Any
/// layout without a pending sum; the backward pass is local: dx = dy f'(x), in dy's layout.

#include <xshard/nn/module.hpp>

#include <xtensor/xmath.hpp>

#include <optional>

namespace xshard::nn {

namespace detail {

/// A layer applying `F` (an xshard elementwise operation) whose derivative `D` maps x's
/// local block to f'(x).
template <class T, mesh_type Mesh, class F, class D, std::size_t N = 2>
class activation {
public:
    explicit activation(const Mesh&) {}

    tensor<T, Mesh, N> forward(const tensor<T, Mesh, N>& x) {
        x_ = x;
        return F{}(x);
    }

    tensor<T, Mesh, N> backward(const tensor<T, Mesh, N>& dy) {
        auto slope = *x_;
        slope.local() = D{}(x_->local());
        return xshard::ops::mul(dy, slope);
    }

    friend void visit_parameters(activation&, auto&&) {}

private:
    std::optional<tensor<T, Mesh, N>> x_;
};

struct relu_fn {
    template <class X>
    auto operator()(const X& x) const {
        return xshard::ops::relu(x);
    }
};
struct relu_slope {
    template <class X>
    auto operator()(const X& x) const {
        using V = typename X::value_type;
        return xt::eval(xt::where(x > V(0), V(1), V(0)));
    }
};

struct gelu_fn {
    template <class X>
    auto operator()(const X& x) const {
        return xshard::ops::gelu(x);
    }
};
/// d/dx x Phi(x) = Phi(x) + x phi(x).
struct gelu_slope {
    template <class X>
    auto operator()(const X& x) const {
        using V = typename X::value_type;
        const V inv_sqrt2 = V(1 / std::sqrt(2.0)),
                inv_sqrt_2pi = V(1 / std::sqrt(2 * 3.14159265358979323846));
        return xt::eval(V(0.5) * (V(1) + xt::erf(x * inv_sqrt2)) +
                        x * xt::exp(V(-0.5) * x * x) * inv_sqrt_2pi);
    }
};

} // namespace detail

/// The ReLU layer: `ops::relu` forward, its slope times dy backward (local, no messages).
/// N: the activations' rank (4 for NCHW).
template <class T, mesh_type Mesh, std::size_t N = 2>
using relu_activation = detail::activation<T, Mesh, detail::relu_fn, detail::relu_slope, N>;

/// The GELU layer (exact form): `ops::gelu` forward, its slope times dy backward (local).
template <class T, mesh_type Mesh>
using gelu_activation = detail::activation<T, Mesh, detail::gelu_fn, detail::gelu_slope>;

} // namespace xshard::nn
