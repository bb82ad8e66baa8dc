#pragma once
/// \file
/// The definitions of what search/operator_strategy.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/operator_strategy.hpp>

namespace xshard {

XSHARD_DECL operator_strategy make_operator_strategy(const network_spec& net,
                                                     const searched_strategy& plan) {
    operator_strategy s;
    s.network = net.description;
    s.batch = net.batch;
    s.degrees = plan.degrees;
    s.ranks = plan.degrees.dp * plan.degrees.tp * plan.degrees.pp;
    s.step_seconds = plan.step_seconds;
    s.memory_bytes = plan.memory_bytes;
    s.comm_bytes = plan.comm_bytes;
    for (std::size_t i = 0; i < net.ops.size(); ++i)
        s.operators.push_back({net.ops[i].name, std::string(to_string(net.ops[i].kind)),
                               plan.stage_of[i], plan.choices[i]});
    return s;
}

} // namespace xshard

