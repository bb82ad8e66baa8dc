#pragma once
/// \file
/// A searched strategy of a described network as the contents of an operator strategy file
/// (io/operator_strategy_file.hpp): what `xshard-plan search --model ... --save` writes.
///
///     xshard::save_operator_strategy(path, xshard::make_operator_strategy(net, *r.best));

#include <xshard/io/operator_strategy_file.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/searched_strategy.hpp>

#include <cstddef>
#include <string>

namespace xshard {

/// The file contents for `plan`, chosen for `net` on dp x tp x pp of its degrees ranks.
inline operator_strategy make_operator_strategy(const network_spec& net,
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
