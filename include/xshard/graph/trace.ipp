#pragma once
/// \file
/// The definitions of what graph/trace.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/trace.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL trace_state& current_trace(std::string_view what) {
    auto* s = active_trace();
    if (!s)
        throw error("xshard: " + std::string(what) +
                    " is called outside xshard::trace (it records into the program being traced)");
    return *s;
}

XSHARD_DECL std::string scoped_name(const trace_state& s, std::string_view name) {
    std::string out;
    for (const auto& part : s.scopes)
        out += part + ".";
    return out + std::string(name);
}

} // namespace detail

XSHARD_DECL std::vector<traced_tensor>
traced_tensor::record(std::string_view op, op_attributes attributes,
                      const op_annotation& annotation, const std::vector<traced_tensor>& operands,
                      std::shared_ptr<const custom_op_base> custom) {
    auto& s = detail::current_trace("xshard::ops::" + std::string(op));
    program& p = *s.target;
    std::vector<operand_type> types;
    for (const auto& o : operands) {
        if (&o.owner() != &p)
            throw error("xshard: trace: an operand of " + std::string(op) +
                        " belongs to another program than the one being traced");
        const auto& v = p.value(o.id());
        types.push_back({v.shape, v.type, v.kind == value_kind::weight});
    }
    program_node n;
    n.op = std::string(op);
    const std::string base = detail::scoped_name(s, op);
    const int k = s.used[base]++;
    n.name = k == 0 ? base : base + "_" + std::to_string(k);
    n.attributes = std::move(attributes);
    n.annotation = annotation;
    n.custom = custom;
    for (const auto& o : operands)
        n.operands.push_back(o.id());
    std::vector<result_spec> results;
    try {
        check_annotation(n, types);
        results =
            custom ? custom->infer(types) : detail::rules_named(op).infer(n.attributes, types);
    } catch (const std::invalid_argument& e) {
        throw error("xshard: trace: node " + n.name + " (" + n.op + "): " + e.what());
    }
    const std::size_t index = p.add_node(std::move(n), results);
    std::vector<traced_tensor> out;
    for (auto id : p.nodes()[index].results)
        out.emplace_back(&p, id);
    return out;
}

XSHARD_DECL void traced_tensor::check_annotation(const program_node& n,
                                                 std::span<const operand_type> types) {
    const auto& a = n.annotation;
    if (!a.in_strategies.empty() && a.in_strategies.size() != types.size())
        throw std::invalid_argument("the strategy " + a.to_string() + " gives " +
                                    std::to_string(a.in_strategies.size()) + " strategies for " +
                                    std::to_string(types.size()) + " operands");
    for (std::size_t i = 0; i < a.in_strategies.size(); ++i)
        if (a.in_strategies[i].rank() != types[i].shape.size())
            throw std::invalid_argument("the strategy " + a.in_strategies[i].to_string() +
                                        " of operand " + std::to_string(i) + " has " +
                                        std::to_string(a.in_strategies[i].rank()) +
                                        " dimensions, the operand " + shape_text(types[i].shape) +
                                        " has " + std::to_string(types[i].shape.size()));
    if (!a.in_layouts.empty() && a.in_layouts.size() != types.size())
        throw std::invalid_argument("the annotation gives " + std::to_string(a.in_layouts.size()) +
                                    " layouts for " + std::to_string(types.size()) + " operands");
    for (std::size_t i = 0; i < a.in_layouts.size(); ++i)
        if (a.in_layouts[i].rank() != types[i].shape.size())
            throw std::invalid_argument("the layout " + a.in_layouts[i].to_string() +
                                        " of operand " + std::to_string(i) +
                                        " does not have the operand's " +
                                        std::to_string(types[i].shape.size()) + " dimensions");
}

XSHARD_DECL traced_tensor param(std::string_view name, value_shape shape,
                                initializer init) {
    auto& s = detail::current_trace("xshard::param");
    const std::string full = detail::scoped_name(s, name);
    if (auto id = s.target->weight_named(full)) {
        if (s.target->value(*id).shape != shape)
            throw error("xshard: trace: the weight " + full + " is declared with shape " +
                        shape_text(shape) + " after " + shape_text(s.target->value(*id).shape));
        return traced_tensor(s.target, *id);
    }
    const auto id = s.target->add_argument(value_kind::weight, full, std::move(shape),
                                           s.floating.value_or(dtype::f64), init);
    return traced_tensor(s.target, id);
}

} // namespace xshard

