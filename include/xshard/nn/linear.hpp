#pragma once
/// \file
/// Tensor-parallel linear layers (Megatron's ColumnParallelLinear and RowParallelLinear):
/// y = x W + b with W [in, out].
///
/// column_parallel_linear: W split by output features over the tensor axis ([-, tp]); input
/// [dp, -] (any split of the rows), output [dp, tp], or [dp, -] with `gather_output` (an
/// all-gather; its backward, a reduce-scatter). Backward: dW = x^T dy is each data-parallel rank's
/// term; dx = dy W^T is each tensor-parallel rank's term, summed where the forward pass reduced.
///
/// row_parallel_linear: W split by input features ([tp, -]); input [dp, tp]; x W is a pending
/// sum over tp, all-reduced to [dp, -] (or reduce-scattered to `output` when the next region
/// splits the rows over tp too, Megatron's sequence parallelism), then the bias is added.
/// Backward: the adjoint of that reduction (all-reduce, or all-gather), then the products.
///
/// Weights are drawn uniformly in +-1/sqrt(in) (from `seed`, the same on any mesh), biases
/// start at zero.

#include <xshard/nn/module.hpp>

#include <optional>
#include <random>

namespace xshard::nn {

namespace detail {

/// x [rows, in] -> x W + b, and the gradients: the part both linear layers share.
template <class T, mesh_type Mesh>
struct affine {
    weight<tensor<T, Mesh, 2>> w;
    std::optional<weight<tensor<T, Mesh, 1>>> b;

    affine(const Mesh& mesh, std::size_t in, std::size_t out, const layout& wl, const layout& bl,
           bool bias, unsigned seed)
        : w(make_weight<T>(mesh, std::array{in, out}, wl, seed,
                           std::uniform_real_distribution<T>(-T(1) / std::sqrt(T(in)),
                                                             T(1) / std::sqrt(T(in))))) {
        if (bias)
            b.emplace(constant_weight<T>(mesh, std::array{out}, bl, T(0)));
    }

    tensor<T, Mesh> product(const tensor<T, Mesh>& x) const {
        return xshard::ops::matmul(x, w.value);
    }

    tensor<T, Mesh> add_bias(tensor<T, Mesh> y) const {
        if (b)
            y = xshard::ops::add(y, b->value);
        return y;
    }

    /// Adds db = the sum of dy's rows.
    void bias_backward(const tensor<T, Mesh>& dy) {
        if (b)
            accumulate(*b, xshard::ops::sum<0>(dy), to_bias_terms);
    }

    /// Visits "weight" and, if there is one, "bias".
    void visit(auto&& visit) {
        visit("weight", w);
        if (b)
            visit("bias", *b);
    }

    /// Adds dW = x^T dz; returns dx = dz W^T, laid out as x's gradient.
    tensor<T, Mesh> product_backward(const tensor<T, Mesh>& x, const tensor<T, Mesh>& dz) {
        weight_backward(x, dz);
        return input_backward(x, dz);
    }

    /// Adds dW = x^T dz (the weight half of `product_backward`).
    void weight_backward(const tensor<T, Mesh>& x, const tensor<T, Mesh>& dz) {
        accumulate_product(w, xshard::ops::transposed(x), dz);
    }

    /// Returns dx = dz W^T, laid out as x's gradient (the input half).
    tensor<T, Mesh> input_backward(const tensor<T, Mesh>& x, const tensor<T, Mesh>& dz) {
        return to_input_gradient(xshard::ops::matmul(dz, xshard::ops::transposed(w.value)),
                                 dual(x.layout(), x.mesh().shape()));
    }

    // The plans of the redistributions of every backward pass.
    kept_redistribution<T, Mesh, 1> to_bias_terms;
    kept_redistribution<T, Mesh> to_input_gradient;
};

} // namespace detail

template <class T, mesh_type Mesh>
class column_parallel_linear {
public:
    struct options {
        nn::axes axes = {};
        bool bias = true;
        bool gather_output = false;
    };

    column_parallel_linear(const Mesh& mesh, std::size_t in, std::size_t out, unsigned seed,
                           options o = {})
        : o_(std::move(o))
        , f_(mesh, in, out, make_layout({"", o_.axes.tensor}), make_layout({o_.axes.tensor}),
             o_.bias, seed) {}

    tensor<T, Mesh> forward(const tensor<T, Mesh>& x) {
        x_ = x;
        auto y = f_.add_bias(f_.product(x));
        y_layout_ = y.layout();
        if (o_.gather_output)
            return gather_(std::move(y), with_features(x.layout(), ""));
        return y;
    }

    tensor<T, Mesh> backward(const tensor<T, Mesh>& dy) {
        const auto g = o_.gather_output ? gather_adjoint_.adjoint(dy, y_layout_) : dy;
        f_.bias_backward(g);
        return f_.product_backward(*x_, g);
    }

    /// `backward` in two halves, for zero-bubble pipeline schedules: the input gradient
    /// now (returned), the weight and bias gradients at the next `backward_weight()`.
    tensor<T, Mesh> backward_input(const tensor<T, Mesh>& dy) {
        dz_ = o_.gather_output ? gather_adjoint_.adjoint(dy, y_layout_) : dy;
        return f_.input_backward(*x_, *dz_);
    }
    void backward_weight() {
        f_.bias_backward(*dz_);
        f_.weight_backward(*x_, *dz_);
        dz_.reset();
    }

    friend void visit_parameters(column_parallel_linear& l, auto&& visit) { l.f_.visit(visit); }

private:
    options o_;
    detail::affine<T, Mesh> f_;
    std::optional<tensor<T, Mesh>> x_, dz_; // dz_: between backward_input and backward_weight
    layout y_layout_;
    kept_redistribution<T, Mesh> gather_, gather_adjoint_; // with gather_output
};

template <class T, mesh_type Mesh>
class row_parallel_linear {
public:
    struct options {
        nn::axes axes = {};
        bool bias = true;
        /// The output's layout: the input's rows, whole features by default (all-reduce);
        /// [(dp, tp), -] for a sequence-parallel region (reduce-scatter).
        std::optional<layout> output = std::nullopt;
    };

    row_parallel_linear(const Mesh& mesh, std::size_t in, std::size_t out, unsigned seed,
                        options o = {})
        : o_(std::move(o))
        , f_(mesh, in, out, make_layout({o_.axes.tensor, ""}), make_layout({""}), o_.bias, seed) {}

    tensor<T, Mesh> forward(const tensor<T, Mesh>& x) {
        x_ = x;
        auto z = f_.product(x);
        z_layout_ = z.layout();
        const auto out = o_.output ? *o_.output : with_features(x.layout(), "");
        return f_.add_bias(reduce_(std::move(z), out));
    }

    tensor<T, Mesh> backward(const tensor<T, Mesh>& dy) {
        f_.bias_backward(dy);
        return f_.product_backward(*x_, reduce_adjoint_.adjoint(dy, z_layout_));
    }

    /// `backward` in two halves (see column_parallel_linear::backward_input).
    tensor<T, Mesh> backward_input(const tensor<T, Mesh>& dy) {
        dy_ = dy;
        dz_ = reduce_adjoint_.adjoint(dy, z_layout_);
        return f_.input_backward(*x_, *dz_);
    }
    void backward_weight() {
        f_.bias_backward(*dy_);
        f_.weight_backward(*x_, *dz_);
        dy_.reset();
        dz_.reset();
    }

    friend void visit_parameters(row_parallel_linear& l, auto&& visit) { l.f_.visit(visit); }

private:
    options o_;
    detail::affine<T, Mesh> f_;
    std::optional<tensor<T, Mesh>> x_, dy_, dz_; // dy_, dz_: until backward_weight
    layout z_layout_;
    kept_redistribution<T, Mesh> reduce_, reduce_adjoint_; // the pending sum and its adjoint
};

} // namespace xshard::nn
