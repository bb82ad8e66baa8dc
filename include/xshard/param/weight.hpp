#pragma once
/// \file
/// Weights: the trainable tensors of layers, with their gradient and optimizer state.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <concepts>
#include <optional>
#include <utility>
#include <vector>

namespace xshard {

/// The type of the gradient of a weight whose value is a D: a tensor of D's element type,
/// mesh and rank with a run-time layout, since what the gradient holds, and so its layout,
/// changes during a step (see `weight`).
template <distributed_tensor D>
using gradient_t = dtensor<typename D::value_type, typename D::mesh_type, dynamic_layout(D::rank)>;

namespace detail {

/// `l` without its pending sums over mesh axes of size 1 (a sum of one term is complete).
XSHARD_DECL layout without_unit_sums(const layout& l, const mesh_shape& mesh);

} // namespace detail

/// This rank's share of a weight's update under optimizer sharding (MindSpore's hsdp,
/// xshard/train/hsdp.hpp): the master copy the update writes, the complete gradient and the
/// optimizer's state slots, all laid out as the weight's *sharded* layout (its value's layout
/// with data-parallel axes added to a dimension), so each rank keeps 1/dp of them. An
/// optimizer that finds a weight's `shard` updates it instead of the whole value.
template <distributed_tensor D>
struct weight_shard {
    using tensor_type = gradient_t<D>;
    using gradient_type = tensor_type;
    tensor_type value;
    tensor_type grad;
    std::vector<tensor_type> state;
};

/// A trainable tensor of a layer (xshard/nn/): its value, its gradient and an optimizer's
/// state (slots laid out like the value). Parameter traversals see the value;
/// `gradients_of(c)` and `for_each_weight` see the rest.
///
/// The gradient's layout says what it holds:
///  * after construction, `zero_grad()` and a backward pass: each rank's term of the sum
///    over the value's redundant copies, laid out as the *dual* of the value's layout (its
///    replicated axes of more than one rank pending sums, `term_layout()`). Gathering it
///    sums the terms; a norm or an optimizer step refuses it (a pending sum has neither),
///    on every rank alike.
///  * after `synchronize_gradients`: the complete gradient, laid out as the value.
/// On a mesh where the value has no replicated axis the two layouts are the same. A
/// backward pass adds its terms to a synchronised gradient too (`terms()`).
template <distributed_tensor D>
struct weight {
    using tensor_type = D;
    using gradient_type = gradient_t<D>;
    D value;
    gradient_type grad;
    std::vector<D> state;
    /// Set by optimizer sharding (train/hsdp.hpp): the sharded master copy, gradient and
    /// optimizer state the update works on; `state` then stays empty.
    std::optional<weight_shard<D>> shard = std::nullopt;

    explicit weight(D v)
        : value(std::move(v))
        , grad(detail::unchecked, value.mesh(), value.shape(),
               gradient_type::local_type::from_shape(value.local().shape()), term_layout()) {
        grad.local().fill(typename D::value_type(0));
    }

    /// The layout of the gradient's terms before synchronisation: the dual of the value's
    /// (pending sums over its replicated axes of more than one rank).
    layout term_layout() const {
        const auto& ms = value.mesh().shape();
        return detail::without_unit_sums(dual(value.layout(), ms), ms);
    }

    /// Sets the gradient to zero terms (laid out as `term_layout()`).
    void zero_grad() {
        grad.local().fill(typename D::value_type(0));
        relabel(term_layout());
    }

    /// The gradient as terms again, ready for a backward pass to add its own: a synchronised
    /// gradient keeps its values on one rank of each group of copies and zeros on the others
    /// (no communication), so the terms still sum to it. Returns the gradient.
    /// Throws xshard::error (on every rank alike) for a gradient laid out otherwise.
    gradient_type& terms() {
        const auto l = term_layout();
        if (!(grad.layout() == l)) {
            if (!(grad.layout() == value.layout()) || grad.shape() != value.shape())
                throw error("xshard: a gradient laid out " + grad.layout().to_string() + " " +
                            detail::shape_string(grad.shape()) + " takes no terms: neither the " +
                            "value's layout " + value.layout().to_string() + " nor its terms' " +
                            l.to_string());
            if (!detail::holds_term(l, value.mesh().shape(), value.mesh().coords()))
                grad.local().fill(typename D::value_type(0));
            relabel(l);
        }
        return grad;
    }

    /// Sets the gradient to `g`, a gradient computed elsewhere (of the value's element
    /// type, mesh and rank; it keeps its layout, which says what it holds).
    template <distributed_tensor G>
        requires std::same_as<typename G::value_type, typename D::value_type> &&
                 std::same_as<typename G::mesh_type, typename D::mesh_type> &&
                 (G::rank == D::rank)
    void set_gradient(G g) {
        const auto l = g.layout();
        grad = gradient_type(detail::unchecked, g.mesh(), g.shape(),
                             typename gradient_type::local_type(std::move(g).local()), l);
    }

    /// Internal: states that the gradient's storage now holds what layout `l` says (the
    /// storage stays where it is).
    void relabel(const layout& l) {
        if (!(grad.layout() == l))
            grad = gradient_type(detail::unchecked, grad.mesh(), grad.shape(),
                                 std::move(grad).local(), l);
    }
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/param/weight.ipp>
#endif
