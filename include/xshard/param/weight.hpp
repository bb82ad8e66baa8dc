#pragma once
/// \file
/// Weights: the trainable tensors of layers, with their gradient and optimizer state.

#include <xshard/tensor/dtensor.hpp>

#include <utility>
#include <vector>

namespace xshard {

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
