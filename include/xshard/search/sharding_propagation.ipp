#pragma once
/// \file
/// The definitions of what search/sharding_propagation.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/sharding_propagation.hpp>

namespace xshard {

XSHARD_DECL searched_strategy
propagate_strategies(const network_spec& net, const parallel_degrees& d,
                     const std::vector<std::optional<op_choice>>& given, search_options o) {
    if (given.size() > net.ops.size())
        throw std::invalid_argument("xshard: sharding_propagation: more strategies (" +
                                    std::to_string(given.size()) + ") than operators (" +
                                    std::to_string(net.ops.size()) + ")");
    o.fixed = given;
    o.degrees = d;
    o.ranks = d.dp * d.tp * d.pp;
    redistribution_pricer pricer(mesh_shape({axis_name("dp"), axis_name("tp")}, {d.dp, d.tp}),
                                 o.machine.links, o.machine.element);
    auto p = search_degrees(net, d, o, pricer);
    if (!p)
        throw std::invalid_argument(
            "xshard: sharding_propagation: the given strategies of " + net.description +
            " cannot be completed on dp=" + std::to_string(d.dp) + " tp=" + std::to_string(d.tp) +
            " pp=" + std::to_string(d.pp) +
            (std::isinf(o.memory_per_rank)
                 ? std::string()
                 : " within " + std::to_string(std::uint64_t(o.memory_per_rank)) +
                       " bytes per rank"));
    return *p;
}

} // namespace xshard

