#pragma once
/// \file
/// How the driver synchronises a data-parallel model's gradients and updates its weights when
/// no optimizer sharding was asked for (auto_parallel's `gradient_path`):
///
///  * all_reduce: the gradients all-reduced, and every rank updates every weight whole;
///  * sharded_update: each weight's gradient reduce-scattered into a 1/p slice, the optimizer
///    run on that slice alone, the updated slices all-gathered (xshard::hsdp level2 with
///    MindSpore's default threshold and shard_size, train/hsdp.hpp);
///  * automatic (the default): sharded_update where the cost model prices it lower and the
///    data-parallel group reaches the machine model's `sharded_update_min_ranks` (8).
///
/// Both give the same weights (up to the order of the sums' terms). A reduce-scatter and an
/// all-gather move what an all-reduce moves, so the sharded path trades a few more messages
/// for an update p times smaller: at 16 ranks on one node, where every rank's whole update
/// contends for the node's memory bandwidth, the update is most of the weight-sized work.
///
/// The price of each path is the strategy search's (search/cost.hpp, `price_parameter`): per
/// weight, the planner's price of its collectives under the machine's alpha-beta links, and
/// the update and zero_grad as memory-bound work at the machine's bandwidth, with the
/// optimizer's state counted in weight-sized tensors. Every rank prices the same shapes and
/// layouts with the same model, so every rank chooses alike, with no communication.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/float16.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/param/tensor_record.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/search/cost.hpp>
#include <xshard/search/machine_model.hpp>
#include <xshard/search/redistribution_pricer.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/hsdp_options.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace xshard {

/// The driver's gradient path without hsdp() (see the file comment).
enum class gradient_path {
    automatic,      ///< sharded_update where the cost model prices it lower, else all_reduce
    all_reduce,     ///< all-reduce, the whole update on every rank
    sharded_update, ///< reduce-scatter, the update on each rank's slice, all-gather
};

/// "automatic", "all_reduce", "sharded_update".
constexpr std::string_view to_string(gradient_path p) {
    switch (p) {
    case gradient_path::automatic:
        return "automatic";
    case gradient_path::all_reduce:
        return "all_reduce";
    case gradient_path::sharded_update:
        return "sharded_update";
    }
    return "unknown";
}

/// The path named `name` ("automatic", "all_reduce" or "sharded_update"); throws
/// xshard::error naming the three otherwise.
XSHARD_DECL gradient_path parse_gradient_path(std::string_view name);

/// The predicted seconds per step of each path's gradient synchronisation and update, and
/// the largest data-parallel group (replicated mesh axes of more than one rank) of a weight.
struct gradient_path_prices {
    double all_reduce = 0;
    double sharded_update = 0;
    int ranks = 1;
};

namespace detail {

/// price_gradient_paths of the weights whose values `weights` records (weight_records).
XSHARD_DECL gradient_path_prices price_weights(const std::vector<tensor_record>& weights,
                                               const machine_model& machine);

/// shards_update's automatic choice for the weights whose values `weights` records.
XSHARD_DECL bool sharded_update_pays(const std::vector<tensor_record>& weights,
                                     const gradient_options& gradients,
                                     const machine_model& machine);

} // namespace detail

/// Prices both paths for the weights of `model` under `machine` (its links, memory
/// bandwidth, optimizer states and hsdp threshold; the element size is each weight's own).
/// Weights of 1 to 4 dimensions are priced (the pricer's ranks); the others add nothing to
/// either path (a scalar is never sharded). No communication.
template <parameter_container M>
gradient_path_prices price_gradient_paths(M& model, const machine_model& machine) {
    return detail::price_weights(weight_records(model), machine);
}

/// Whether the driver runs `model`'s steps on the sharded update under `path`: always for
/// sharded_update, never for all_reduce, and for automatic when `price_gradient_paths`
/// prices it lower, a weight's data-parallel group has at least the machine's
/// `sharded_update_min_ranks`, and the gradients' options allow it (hsdp level2 does not yet
/// communicate the gradients of 16-bit weights in fp32). No communication.
template <parameter_container M>
bool shards_update(M& model, gradient_path path, const gradient_options& gradients,
                   const machine_model& machine) {
    if (path != gradient_path::automatic)
        return path == gradient_path::sharded_update;
    return detail::sharded_update_pays(weight_records(model), gradients, machine);
}

/// The optimizer sharding of the sharded update: level2, MindSpore's default shard_size
/// (the weight's whole data-parallel group) and the machine's threshold.
XSHARD_DECL hsdp_options sharded_update_options(const machine_model& machine);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/driver/gradient_path.ipp>
#endif
