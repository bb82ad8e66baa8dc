#pragma once
/// \file
/// Layer normalisation over the features of [rows, features] activations whose features are
/// not split (rows may be): y = (x - mean) / sqrt(var + eps) * gamma + beta, per row. gamma
/// (ones) and beta (zeros) are replicated weights. Forward and backward are local; the
/// weights' gradients are each rank's term (summed over their replicas by
/// synchronize_gradients).

#include <xshard/nn/module.hpp>
#include <xshard/ops/reduce.hpp>

#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include <optional>

namespace xshard::nn {

/// The layer-normalisation layer (the operation on tensors is `ops::layer_norm`): see the
/// file comment.
template <class T, mesh_type Mesh>
class layer_normalization {
public:
    layer_normalization(const Mesh& mesh, std::size_t features, T eps = T(1e-5))
        : gamma_(constant_weight<T>(mesh, std::array{features}, make_layout({""}), T(1)))
        , beta_(constant_weight<T>(mesh, std::array{features}, make_layout({""}), T(0)))
        , eps_(eps) {}

    tensor<T, Mesh> forward(const tensor<T, Mesh>& x) {
        if (x.layout().is_split(1) || x.layout().is_partial())
            throw error(
                "xshard: layer_normalization needs its features whole and no pending sum, not " +
                x.layout().to_string());
        const auto& a = x.local();
        const std::size_t n = a.shape()[1];
        const xt::xtensor<T, 2> mean = xt::mean(a, {1}, xt::keep_dims);
        const xt::xtensor<T, 2> centred = a - mean;
        const xt::xtensor<T, 2> var = xt::sum(centred * centred, {1}, xt::keep_dims) / T(n);
        rstd_ = T(1) / xt::sqrt(var + eps_);
        xhat_ = centred * rstd_;
        auto y = x;
        y.local() = xhat_ * xt::view(gamma_.value.local(), xt::newaxis(), xt::all()) +
                    xt::view(beta_.value.local(), xt::newaxis(), xt::all());
        x_layout_ = x.layout();
        return y;
    }

    /// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy gamma, per row: linear in dy,
    /// so each rank's term of dy gives its term of dx.
    tensor<T, Mesh> backward(const tensor<T, Mesh>& dy_in) {
        const auto dy = to_terms_(dy_in, dual(x_layout_, dy_in.mesh().shape()));
        const auto& d = dy.local();
        const xt::xtensor<T, 2> g = d * xt::view(gamma_.value.local(), xt::newaxis(), xt::all());
        // Reductions with keep_dims are evaluated before broadcasting (xtensor 0.24 misreads
        // them inside a lazy expression).
        const xt::xtensor<T, 2> mean_g = xt::mean(g, {1}, xt::keep_dims);
        const xt::xtensor<T, 2> mean_gx = xt::mean(g * xhat_, {1}, xt::keep_dims);
        auto dx = dy;
        dx.local() = rstd_ * (g - mean_g - xhat_ * mean_gx);
        // The sums over this rank's rows of its terms: its terms of the sums over all rows.
        const auto terms = dual(make_layout({""}), dy.mesh().shape());
        auto sum_rows = [&](const xt::xtensor<T, 2>& a) {
            auto local = xt::xtensor<T, 1>::from_shape({a.shape()[1]});
            xshard::detail::sum_leading_rows(a.data(), a.shape()[0], a.shape()[1], local.data());
            return tensor<T, Mesh, 1>(xshard::detail::unchecked, dy.mesh(), gamma_.value.shape(),
                                      std::move(local), terms);
        };
        accumulate(gamma_, sum_rows(d * xhat_), to_gamma_terms_);
        accumulate(beta_, sum_rows(d), to_beta_terms_);
        return dx;
    }

    friend void visit_parameters(layer_normalization& l, auto&& visit) {
        visit("gamma", l.gamma_);
        visit("beta", l.beta_);
    }

private:
    weight<tensor<T, Mesh, 1>> gamma_, beta_;
    T eps_;
    xt::xtensor<T, 2> rstd_, xhat_;
    layout x_layout_;
    kept_redistribution<T, Mesh> to_terms_;
    kept_redistribution<T, Mesh, 1> to_gamma_terms_, to_beta_terms_;
};

} // namespace xshard::nn
