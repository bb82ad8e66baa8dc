#pragma once
/// \file
/// The definitions of what graph/program.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/program.hpp>

namespace xshard {

XSHARD_DECL std::string shape_text(const value_shape& s) {
    std::string t = "(";
    for (std::size_t i = 0; i < s.size(); ++i)
        t += (i ? ", " : "") + std::to_string(s[i]);
    return t + (s.size() == 1 ? ",)" : ")");
}

XSHARD_DECL program& program::shard(std::string_view name, std::vector<strategy> in_strategies) {
    auto& n = node(name);
    if (in_strategies.size() != n.operands.size())
        throw error("xshard: program: node " + n.name + " (" + n.op + ") has " +
                    std::to_string(n.operands.size()) + " operands but the strategy " +
                    op_annotation{in_strategies, {}, {}}.to_string() + " gives " +
                    std::to_string(in_strategies.size()));
    for (std::size_t i = 0; i < in_strategies.size(); ++i)
        if (in_strategies[i].rank() != values_[n.operands[i]].shape.size())
            throw error("xshard: program: node " + n.name + " (" + n.op + "): the strategy " +
                        in_strategies[i].to_string() + " of operand " + std::to_string(i) +
                        " has " + std::to_string(in_strategies[i].rank()) +
                        " dimensions, the operand " + shape_text(values_[n.operands[i]].shape) +
                        " has " + std::to_string(values_[n.operands[i]].shape.size()));
    n.annotation.in_strategies = std::move(in_strategies);
    n.annotation.in_layouts.clear();
    return *this;
}

XSHARD_DECL std::string program::value_name(std::size_t id) const {
    const auto& v = values_.at(id);
    if (v.kind != value_kind::result)
        return v.name;
    const auto& n = nodes_[v.node];
    return n.results.size() == 1 ? n.name : n.name + ":" + std::to_string(v.result_index);
}

XSHARD_DECL std::size_t program::add_argument(value_kind kind, std::string name, value_shape shape,
                                              dtype type, initializer init) {
    program_value v;
    v.kind = kind;
    v.name = std::move(name);
    v.shape = std::move(shape);
    v.type = type;
    v.init = init;
    values_.push_back(std::move(v));
    (kind == value_kind::input ? inputs_ : weights_).push_back(values_.size() - 1);
    return values_.size() - 1;
}

XSHARD_DECL std::size_t
program::add_node(program_node n, const std::vector<std::pair<value_shape, dtype>>& results) {
    const std::size_t index = nodes_.size();
    for (std::size_t i = 0; i < results.size(); ++i) {
        program_value v;
        v.shape = results[i].first;
        v.type = results[i].second;
        v.node = index;
        v.result_index = i;
        values_.push_back(std::move(v));
        n.results.push_back(values_.size() - 1);
    }
    nodes_.push_back(std::move(n));
    return index;
}

XSHARD_DECL std::optional<std::size_t> program::weight_named(std::string_view name) const {
    for (auto id : weights_)
        if (values_[id].name == name)
            return id;
    return std::nullopt;
}

XSHARD_DECL std::size_t program::node_index(std::string_view name) const {
    for (std::size_t i = 0; i < nodes_.size(); ++i)
        if (nodes_[i].name == name)
            return i;
    std::string near;
    for (const auto& n : nodes_)
        if (n.name.find(name) != std::string::npos || name.find(n.name) != std::string_view::npos)
            near += (near.empty() ? "" : ", ") + n.name;
    std::string all;
    for (std::size_t i = 0; i < nodes_.size() && i < 12; ++i)
        all += (i ? ", " : "") + nodes_[i].name;
    throw error("xshard: program: no node is named '" + std::string(name) + "'" +
                (near.empty() ? "; its nodes are " + all + (nodes_.size() > 12 ? ", ..." : "")
                              : "; did you mean " + near + "?"));
}

} // namespace xshard
