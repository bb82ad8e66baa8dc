#pragma once
/// \file
/// Laying a container's parameters out by name, in place: what a parameter strategy file
/// (MindSpore's load_param_strategy_file) or a parameter plan asks of a model whose
/// parameters already exist.
///
///     xshard::lay_out_parameters(model, {{"layer1.weight", layout("[-, mp]")}});
///
/// Each named parameter is redistributed into its layout (nothing moves where it is laid out
/// so already); a weight's gradient becomes zero terms of the new layout, and an optimizer's
/// state for it is dropped (the next step makes it again, as at the first step). A name no
/// parameter has, or a parameter whose layout is part of its type and differs, raises
/// `xshard::error` before anything moves. A container that lays its own weights out
/// (`c.lay_out_weights(layouts)`: a compiled program, compiled again with them) is asked
/// to. Collective over the parameters' mesh: every rank passes the same names and layouts.

#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/redistribute/redistribute.hpp>

#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

namespace xshard {

namespace detail {

/// Throws unless a tensor of type D may be laid out as `l` (its layout is a run-time value,
/// or `l` is its type's).
template <distributed_tensor D>
void check_relayable(const D& t, const std::string& name, const layout& l) {
    if constexpr (!D::static_layout.dynamic)
        if (!(t.layout() == l))
            throw error("xshard: parameter '" + name + "' is laid out " + t.layout().to_string() +
                        " by its type, which cannot become " + l.to_string());
}

} // namespace detail

/// Lays the parameters of `c` that `layouts` names out as it says (see the file comment).
template <parameter_container C>
void lay_out_parameters(C& c, const layout_dict& layouts) {
    if constexpr (requires { c.lay_out_weights(layouts); }) {
        c.lay_out_weights(layouts); // a compiled program: compiled again (graph/executable.hpp)
        return;
    }
    std::set<std::string> found;
    for_each_parameter(c, [&](const std::string& name, auto& t) {
        if (const auto it = layouts.find(name); it != layouts.end()) {
            detail::check_relayable(t, name, it->second);
            found.insert(name);
        }
    });
    for (const auto& [name, l] : layouts)
        if (!found.contains(name))
            throw error("xshard: the layouts name '" + name + "', which no parameter has");
    std::set<std::string> weights;
    for_each_weight(c, [&]<class D>(const std::string& name, weight<D>& w) {
        const auto it = layouts.find(name);
        weights.insert(name);
        if (it == layouts.end() || w.value.layout() == it->second)
            return;
        if constexpr (D::static_layout.dynamic) {
            weight<D> fresh(redistribute<D::static_layout>(w.value, it->second));
            w.value = std::move(fresh.value);
            w.grad = std::move(fresh.grad);
            w.state.clear();
            w.shard.reset();
        }
    });
    for_each_parameter(c, [&]<class D>(const std::string& name, D& t) {
        const auto it = layouts.find(name);
        if (weights.contains(name) || it == layouts.end() || t.layout() == it->second)
            return;
        if constexpr (D::static_layout.dynamic)
            t = redistribute<D::static_layout>(t, it->second);
    });
}

} // namespace xshard
