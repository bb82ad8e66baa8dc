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
#include <type_traits>
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

/// Prices both paths for the weights of `model` under `machine` (its links, memory
/// bandwidth, optimizer states and hsdp threshold; the element size is each weight's own).
/// Weights of 1 to 4 dimensions are priced (the pricer's ranks); the others add nothing to
/// either path (a scalar is never sharded). No communication.
template <parameter_container M>
gradient_path_prices price_gradient_paths(M& model, const machine_model& machine) {
    gradient_path_prices p;
    std::unique_ptr<redistribution_pricer> pricer; // memoises the routes of one mesh and element
    std::size_t priced_element = 0;
    machine_model m = machine; // its element: each weight's own
    for_each_weight(model, [&](const std::string&, auto& w) {
        using T = typename std::remove_cvref_t<decltype(w.value)>::value_type;
        m.element = sizeof(T);
        const auto& ms = w.value.mesh().shape();
        if (!pricer || !(pricer->mesh() == ms) || priced_element != sizeof(T)) {
            pricer = std::make_unique<redistribution_pricer>(ms, machine.links, sizeof(T));
            priced_element = sizeof(T);
        }
        const auto s = w.value.shape();
        if (s.size() < 1 || s.size() > 4)
            return;
        const std::vector<std::size_t> shape(s.begin(), s.end());
        const layout l = w.value.layout();
        p.ranks = std::max(p.ranks, ms.group_size(l.replicated_axes(ms)));
        for (const int level : {0, 2}) {
            op_cost c;
            detail::price_parameter(c, l, shape, level, m, *pricer);
            (level == 0 ? p.all_reduce : p.sharded_update) += c.synchronization;
        }
    });
    return p;
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
    bool sixteen_bit = false;
    for_each_weight(model, [&](const std::string&, auto& w) {
        using T = typename std::remove_cvref_t<decltype(w.value)>::value_type;
        sixteen_bit = sixteen_bit || sixteen_bit_float<T>;
    });
    if (sixteen_bit && gradients.fp32_communication)
        return false;
    const auto p = price_gradient_paths(model, machine);
    return p.ranks >= machine.sharded_update_min_ranks && p.sharded_update < p.all_reduce;
}

/// The optimizer sharding of the sharded update: level2, MindSpore's default shard_size
/// (the weight's whole data-parallel group) and the machine's threshold.
XSHARD_DECL hsdp_options sharded_update_options(const machine_model& machine);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/driver/gradient_path.ipp>
#endif
