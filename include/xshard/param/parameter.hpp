#pragma once
/// \file
/// Parameters: named distributed tensors.

#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <optional>
#include <string>
#include <utility>

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

} // namespace xshard
