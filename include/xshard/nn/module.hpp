#pragma once
/// \file
/// What the layers of xshard/nn/ share: activations, the gradient convention, and the
/// sequential container.
///
/// Activations are distributed tensors with run-time layouts, [tokens, features] (rows split
/// over the data-parallel axis, features split over the tensor-parallel axis or replicated).
/// A layer is a module: `forward(x)` returns its output and keeps what its backward needs;
/// `backward(dy)` takes the gradient of the output and returns that of the input, adding the
/// gradients of its weights to their `grad` (see `weight` in param/weight.hpp); a hidden
/// friend `visit_parameters` lists the weights, so that every parameter algorithm
/// (parameter_broadcast, synchronize_gradients over `gradients_of(model)`, norms, optimizers,
/// checkpoints) works on a model as on any parameter container.
///
/// Gradients are laid out as the duals of their tensors' layouts (core/layout.hpp, `dual`):
/// along an axis where a tensor is replicated, each rank holds its own term of the gradient,
/// the sum over the axis being the gradient. So a backward pass needs a collective only where
/// its forward pass had one (the adjoint redistribution, `redistribute_adjoint`), a weight's
/// gradient is each rank's term until `synchronize_gradients` sums it over the weight's
/// replicas (the data-parallel all-reduce, fused in buckets), and layers never hand-write
/// their backward collectives.

#include <xshard/compiled.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/ops/elementwise.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/ops/reduce.hpp>
#include <xshard/ops/shape.hpp>
#include <xshard/param/no_init.hpp>
#include <xshard/param/parameter.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/tensor/distribute.hpp>

#include <xtensor/xnoalias.hpp>

#include <cmath>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

namespace xshard::nn {

/// The mesh axis a layer splits its features, heads or vocabulary over ("" for none). The
/// rows (tokens, samples) keep whatever split the input has (the data-parallel axis).
struct axes {
    std::string tensor = "tp";
};

/// A distributed tensor of rank N with a run-time layout: what layers take and return.
template <class T, mesh_type Mesh, std::size_t N = 2>
using tensor = dtensor<T, Mesh, dynamic_layout(N)>;

/// "[dp, -]" from {"dp", ""}: a layout from the axis splitting each dimension ("" for none).
XSHARD_DECL layout make_layout(std::initializer_list<std::string> dims);

/// `l` with its features (dimension 1) split over `axis` ("" for whole), its rows as they
/// are, nothing pending: the layout a layer's output keeps from its input's.
XSHARD_DECL layout with_features(layout l, const std::string& axis);

/// A redistribution a layer runs at every step, Tpetra's discipline: its plan (the pricing
/// of candidate step sequences, the geometry, the datatypes) is built on first use and
/// reused while the tensors fit it (the same mesh, global shape and layouts, checked on
/// every rank alike without communication), rebuilt when they do not. A copy of a layer
/// starts without plans. Collective over the mesh, like `redistribute`.
template <class T, mesh_type Mesh, std::size_t N = 2>
class kept_redistribution {
public:
    using tensor_type = tensor<T, Mesh, N>;

    kept_redistribution() = default;
    kept_redistribution(const kept_redistribution&) noexcept {}
    kept_redistribution& operator=(const kept_redistribution&) noexcept {
        plan_.reset();
        return *this;
    }
    kept_redistribution(kept_redistribution&&) noexcept = default;
    kept_redistribution& operator=(kept_redistribution&&) noexcept = default;

    /// `t` laid out as `to`: `t` itself when it already is (moved when given an rvalue).
    template <class D>
        requires std::same_as<std::remove_cvref_t<D>, tensor_type>
    tensor_type operator()(D&& t, const layout& to) {
        if (t.layout() == to)
            return std::forward<D>(t);
        if (!plan_ || !plan_->fits(t, to))
            plan_.emplace(t, to);
        tensor_type out(xshard::detail::unchecked, t.mesh(), t.shape(),
                        tensor_type::local_type::from_shape(
                            plan_->plan().destination_block().extent),
                        to);
        // The layers' tensors keep the shapes their layouts give them; each rank checks its
        // own before the plan touches them.
        plan_->execute_unchecked(t, out);
        return out;
    }

    /// The gradient of the input of a redistribution from `from`, given `dy`, that of its
    /// output (see `redistribute_adjoint`).
    template <class D>
        requires std::same_as<std::remove_cvref_t<D>, tensor_type>
    tensor_type adjoint(D&& dy, const layout& from) {
        return (*this)(std::forward<D>(dy), dual(from, dy.mesh().shape()));
    }

    /// Whether a plan is kept (built by an earlier call).
    bool planned() const noexcept { return plan_.has_value(); }

private:
    std::optional<redistribution<tensor_type, dynamic_layout(N)>> plan_;
};

/// The gradient of a quantity held as `t` (every replica holding the whole gradient, as a
/// loss computes it), laid out as the gradient convention wants: the dual of `t`'s layout
/// (one term per replica; the others zero). Collective (local work only).
template <distributed_tensor D>
auto as_gradient(D&& t) {
    constexpr std::size_t rank = std::remove_cvref_t<D>::rank;
    const auto to = dual(t.layout(), t.mesh().shape());
    return redistribute<dynamic_layout(rank)>(std::forward<D>(t), to);
}

/// Adds the gradient `g` (any layout of the weight's global shape) to `w.grad`: brought to
/// the dual of the weight's layout, then each rank's term added locally (`w.grad` holds
/// terms afterwards, see `weight`).
template <class D, distributed_tensor G>
void accumulate(weight<D>& w, G&& g) {
    auto& grad = w.terms();
    if (xshard::detail::without_unit_sums(g.layout(), g.mesh().shape()) == grad.layout()) {
        xt::noalias(grad.local()) += g.local(); // already this rank's term
        return;
    }
    const auto term = redistribute<dynamic_layout(D::rank)>(std::forward<G>(g), grad.layout());
    xt::noalias(grad.local()) += term.local();
}

/// `accumulate(w, g)` with the redistribution's plan kept in `plan`, for a layer that adds
/// such a gradient at every step.
template <class D, class T, mesh_type Mesh, std::size_t N>
void accumulate(weight<D>& w, const tensor<T, Mesh, N>& g, kept_redistribution<T, Mesh, N>& plan) {
    auto& grad = w.terms();
    if (xshard::detail::without_unit_sums(g.layout(), g.mesh().shape()) == grad.layout()) {
        xt::noalias(grad.local()) += g.local();
        return;
    }
    xt::noalias(grad.local()) += plan(g, grad.layout()).local();
}

/// Adds the product a b (matmul operands) to `w.grad`: by BLAS straight into the gradient's
/// storage when the product comes out in the dual of the weight's layout (the usual case: x^T dy
/// of a linear layer), through `accumulate` otherwise.
template <class D, class A, class B>
void accumulate_product(weight<D>& w, const A& a, const B& b) {
    using G = typename weight<D>::gradient_type;
    auto& grad = w.terms();
    const auto product = matmul_rule(a.layout(), b.layout()).out;
    if (product == grad.layout()) {
        xshard::ops::matmul(a, b, grad, {.accumulate = true});
        return;
    }
    if (!(xshard::detail::without_unit_sums(product, grad.mesh().shape()) == grad.layout())) {
        accumulate(w, xshard::ops::matmul(a, b));
        return;
    }
    // The same terms, labelled with sums over axes of one rank: the gradient's storage, lent
    // to a tensor of the product's layout.
    G term(xshard::detail::unchecked, grad.mesh(), grad.shape(), std::move(grad.local()), product);
    try {
        xshard::ops::matmul(a, b, term, {.accumulate = true});
    } catch (...) {
        grad.local() = std::move(term.local());
        throw;
    }
    grad.local() = std::move(term.local());
}

/// A weight with values from `dist(std::mt19937(seed))` drawn in global row-major order (so
/// the same on any mesh and layout as serially), laid out as `l`. Under an
/// `xshard::no_init_parameters` guard, without values: this rank's block, holding NaN
/// (param/no_init.hpp).
template <class T, std::size_t N, mesh_type Mesh, class Distribution>
weight<tensor<T, Mesh, N>> make_weight(const Mesh& mesh, const std::array<std::size_t, N>& shape,
                                       const layout& l, unsigned seed, Distribution dist) {
    if (no_init_parameters::active())
        return weight<tensor<T, Mesh, N>>(full<T, dynamic_layout(N)>(
            mesh, shape,
            std::numeric_limits<T>::has_quiet_NaN ? std::numeric_limits<T>::quiet_NaN() : T{}, l));
    return weight<tensor<T, Mesh, N>>(
        generate<dynamic_layout(N)>(mesh, shape, std::mt19937(seed), dist, l));
}

/// A weight of constant `value`, laid out as `l`.
template <class T, std::size_t N, mesh_type Mesh>
weight<tensor<T, Mesh, N>> constant_weight(const Mesh& mesh,
                                           const std::array<std::size_t, N>& shape, const layout& l,
                                           T value) {
    return weight<tensor<T, Mesh, N>>(full<T, dynamic_layout(N)>(mesh, shape, value, l));
}

/// Layers applied one after the other; backward in reverse order. Its weights are named by
/// position ("0.weight", "1.bias", ...).
template <class... Layers>
class sequential {
public:
    explicit sequential(Layers... layers)
        : layers_(std::move(layers)...) {}

    /// The number of layers (train/hsdp.hpp runs them one at a time).
    static constexpr std::size_t layer_count = sizeof...(Layers);

    template <class X>
    auto forward(X x) {
        std::apply([&](auto&... l) { ((x = l.forward(x)), ...); }, layers_);
        return x;
    }

    template <class G>
    auto backward(G g) {
        backward_from<sizeof...(Layers)>(g);
        return g;
    }

    template <std::size_t I>
    auto& get() noexcept {
        return std::get<I>(layers_);
    }

    friend void visit_parameters(sequential& s, auto&& visit) {
        std::size_t i = 0;
        std::apply([&](auto&... l) { (visit(std::to_string(i++), l), ...); }, s.layers_);
    }

private:
    template <std::size_t I, class G>
    void backward_from(G& g) {
        if constexpr (I > 0) {
            g = std::get<I - 1>(layers_).backward(g);
            backward_from<I - 1>(g);
        }
    }

    std::tuple<Layers...> layers_;
};

} // namespace xshard::nn

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/nn/module.ipp>
#endif
