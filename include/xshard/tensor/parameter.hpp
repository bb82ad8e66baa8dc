#pragma once
/// \file
/// Parameters: named distributed tensors.

#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// A named distributed tensor (a weight, a bias). `planned` records the layout a
/// shard() parameter plan gave it, so that another shard() that plans a different one is an
/// error naming the parameter and both layouts (MindSpore requires every operator's strategy
/// for a parameter to agree).
template <distributed_tensor D>
struct parameter {
    using tensor_type = D;
    std::string name;
    D value;
    std::optional<layout> planned = std::nullopt;
    /// Whether an optimizer updates it (strategy files and checkpoints keep only trainable
    /// parameters unless asked for all).
    bool trainable = true;

    /// Records that a plan lays the parameter out as `l`; throws (on every rank alike: the
    /// plans are the same data everywhere) if another plan said otherwise.
    void plan(const layout& l) {
        if (planned && !(*planned == l))
            throw error("xshard: parameter '" + name + "' is laid out " + planned->to_string() +
                        " by one shard() and " + l.to_string() + " by another");
        planned = l;
    }
};

template <distributed_tensor D>
parameter(std::string, D) -> parameter<D>;

/// A trainable tensor of a layer (xshard/nn/): its value, its gradient (same type and layout;
/// after a backward pass each rank holds its term of the sum over the value's redundant
/// copies, which synchronize_gradients completes) and an optimizer's state (slots laid out
/// like the value). Parameter traversals see the value; `gradients(c)` and `for_each_weight`
/// see the rest.
template <distributed_tensor D>
struct weight {
    using tensor_type = D;
    D value;
    D grad;
    std::vector<D> state;

    explicit weight(D v)
        : value(std::move(v))
        , grad(value) {
        grad.local().fill(typename D::value_type(0));
    }
    /// Sets the gradient to zero.
    void zero_grad() { grad.local().fill(typename D::value_type(0)); }
};

} // namespace xshard
