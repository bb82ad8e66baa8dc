#pragma once
/// \file
/// The definitions of what driver/gradient_path.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/driver/gradient_path.hpp>

namespace xshard {

XSHARD_DECL gradient_path parse_gradient_path(std::string_view name) {
    for (auto p :
         {gradient_path::automatic, gradient_path::all_reduce, gradient_path::sharded_update})
        if (name == to_string(p))
            return p;
    throw error("xshard: gradient_path must be one of automatic, all_reduce, sharded_update, "
                "not '" +
                std::string(name) + "'");
}

namespace detail {

XSHARD_DECL gradient_path_prices price_weights(const std::vector<tensor_record>& weights,
                                               const machine_model& machine) {
    gradient_path_prices p;
    std::unique_ptr<redistribution_pricer> pricer; // memoises the routes of one mesh and element
    std::size_t priced_element = 0;
    machine_model m = machine; // its element: each weight's own
    for (const auto& w : weights) {
        m.element = w.element;
        if (!pricer || !(pricer->mesh() == w.mesh) || priced_element != w.element) {
            pricer = std::make_unique<redistribution_pricer>(w.mesh, machine.links, w.element);
            priced_element = w.element;
        }
        if (w.shape.size() < 1 || w.shape.size() > 4)
            continue;
        p.ranks = std::max(p.ranks, w.mesh.group_size(w.lay.replicated_axes(w.mesh)));
        for (const int level : {0, 2}) {
            op_cost c;
            price_parameter(c, w.lay, w.shape, level, m, *pricer);
            (level == 0 ? p.all_reduce : p.sharded_update) += c.synchronization;
        }
    }
    return p;
}

XSHARD_DECL bool sharded_update_pays(const std::vector<tensor_record>& weights,
                                     const gradient_options& gradients,
                                     const machine_model& machine) {
    const bool sixteen_bit = std::any_of(weights.begin(), weights.end(), [](const auto& w) {
        return w.type == typeid(float16) || w.type == typeid(bfloat16);
    });
    if (sixteen_bit && gradients.fp32_communication)
        return false;
    const auto p = price_weights(weights, machine);
    return p.ranks >= machine.sharded_update_min_ranks && p.sharded_update < p.all_reduce;
}

} // namespace detail

XSHARD_DECL hsdp_options sharded_update_options(const machine_model& machine) {
    return {.shard_size = -1,
            .threshold = std::int64_t(machine.hsdp_threshold_bytes / 1024),
            .optimizer_level = optimizer_level::level2};
}

} // namespace xshard

