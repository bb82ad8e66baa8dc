#pragma once
/// \file
/// The definitions of what graph/split.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/split.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::string value_names(const program& p, const std::set<std::size_t>& ids) {
    std::string out;
    for (auto id : ids)
        out += (out.empty() ? "" : ", ") + p.value_name(id);
    return out;
}

XSHARD_DECL program_node cut_node(std::string op, std::string name, std::vector<std::int64_t> ints,
                                  std::vector<std::size_t> operands) {
    program_node n;
    n.op = std::move(op);
    n.name = std::move(name);
    n.attributes.ints = std::move(ints);
    n.operands = std::move(operands);
    return n;
}

XSHARD_DECL void unpack_cut(const program& p, program& out, const std::string& module,
                            std::size_t packed, const std::vector<std::size_t>& carried,
                            std::map<std::size_t, std::size_t>& id) {
    std::size_t at = 0;
    for (std::size_t k = 0; k < carried.size(); ++k) {
        const auto& v = p.value(carried[k]);
        const std::size_t width = row_width(v.shape);
        auto piece = out.value(packed).shape;
        piece[1] = width;
        auto n = out.add_node(cut_node("slice", module + ".cut_in.slice_" + std::to_string(k),
                                       {1, std::int64_t(at), std::int64_t(at + width)}, {packed}),
                              {{piece, v.type}});
        auto got = out.nodes()[n].results[0];
        if (piece != v.shape) {
            n = out.add_node(cut_node("reshape", module + ".cut_in.reshape_" + std::to_string(k),
                                      {v.shape.begin(), v.shape.end()}, {got}),
                             {{v.shape, v.type}});
            got = out.nodes()[n].results[0];
        }
        id[carried[k]] = got;
        at += width;
    }
}

XSHARD_DECL std::size_t pack_cut(program& out, const std::string& module,
                                 const std::vector<std::size_t>& values, std::size_t rank) {
    std::vector<std::size_t> pieces;
    value_shape packed(rank, 1);
    packed[0] = out.value(values[0]).shape[0];
    packed[1] = 0;
    for (std::size_t k = 0; k < values.size(); ++k) {
        const auto& v = out.value(values[k]);
        value_shape piece(rank, 1);
        piece[0] = v.shape[0];
        piece[1] = row_width(v.shape);
        packed[1] += piece[1];
        if (piece == v.shape) {
            pieces.push_back(values[k]);
            continue;
        }
        const auto type = v.type;
        const auto n =
            out.add_node(cut_node("reshape", module + ".cut_out.reshape_" + std::to_string(k),
                                  {piece.begin(), piece.end()}, {values[k]}),
                         {{piece, type}});
        pieces.push_back(out.nodes()[n].results[0]);
    }
    const auto type = out.value(values[0]).type;
    const auto n =
        out.add_node(cut_node("concat", module + ".cut_out.concat", {1}, pieces), {{packed, type}});
    return out.nodes()[n].results[0];
}

XSHARD_DECL program module_program(const program& p, const std::string& module, std::size_t first,
                                   std::size_t last, const std::vector<std::size_t>& inputs,
                                   const std::vector<std::size_t>& outputs, std::size_t rank) {
    program out;
    std::map<std::size_t, std::size_t> id; // value of p -> value of out
    if (inputs.size() == 1) {
        const auto& in = p.value(inputs[0]);
        id[inputs[0]] =
            out.add_argument(value_kind::input, p.value_name(inputs[0]), in.shape, in.type);
    } else {
        value_shape packed(rank, 1);
        packed[0] = p.value(inputs[0]).shape[0];
        packed[1] = 0;
        for (auto v : inputs)
            packed[1] += row_width(p.value(v).shape);
        const auto arg = out.add_argument(value_kind::input, module + ".cut_in", packed,
                                          p.value(inputs[0]).type);
        unpack_cut(p, out, module, arg, inputs, id);
    }
    for (std::size_t n = first; n < last; ++n)
        for (auto v : p.nodes()[n].operands)
            if (p.value(v).kind == value_kind::weight && !id.count(v)) {
                const auto& w = p.value(v);
                id[v] = out.add_argument(value_kind::weight, w.name, w.shape, w.type, w.init);
            }
    for (std::size_t n = first; n < last; ++n) {
        program_node node = p.nodes()[n];
        for (auto& v : node.operands)
            v = id.at(v);
        std::vector<std::pair<value_shape, dtype>> results;
        for (auto r : node.results)
            results.emplace_back(p.value(r).shape, p.value(r).type);
        const auto old = node.results;
        node.results.clear();
        const auto k = out.add_node(std::move(node), results);
        for (std::size_t r = 0; r < old.size(); ++r)
            id[old[r]] = out.nodes()[k].results[r];
    }
    if (outputs.size() == 1) {
        out.add_output(id.at(outputs[0]));
    } else {
        std::vector<std::size_t> mine;
        for (auto v : outputs)
            mine.push_back(id.at(v));
        out.add_output(pack_cut(out, module, mine, rank));
    }
    return out;
}

} // namespace detail

XSHARD_DECL std::vector<program_module> split_modules(const program& p) {
    if (p.inputs().size() != 1 || p.outputs().size() != 1)
        throw error("xshard: program modules: the program has " +
                    std::to_string(p.inputs().size()) + " inputs and " +
                    std::to_string(p.outputs().size()) +
                    " outputs; a chain of modules takes one input and gives one output");
    if (p.nodes().empty())
        throw error("xshard: program modules: the program has no nodes");
    // Each module's node range, in order.
    std::vector<std::pair<std::string, std::pair<std::size_t, std::size_t>>> ranges;
    std::set<std::string> seen;
    for (std::size_t n = 0; n < p.nodes().size(); ++n) {
        const auto scope = detail::top_scope(p.nodes()[n].name);
        if (!ranges.empty() && ranges.back().first == scope) {
            ranges.back().second.second = n + 1;
            continue;
        }
        if (!seen.insert(scope).second)
            throw error("xshard: program modules: the nodes of " + scope +
                        " are not consecutive (node " + p.nodes()[n].name + " comes after " +
                        ranges.back().first + "'s); a module is one run of nodes");
        ranges.push_back({scope, {n, n + 1}});
    }
    std::vector<std::size_t> module_of_node(p.nodes().size());
    for (std::size_t m = 0; m < ranges.size(); ++m)
        for (std::size_t n = ranges[m].second.first; n < ranges[m].second.second; ++n)
            module_of_node[n] = m;
    const auto& result = p.value(p.outputs()[0]);
    if (result.kind != value_kind::result)
        throw error("xshard: program modules: the program's output " + result.name +
                    " is not computed by a node");
    // Each tensor's producing module (the input's is "before the first", 0 here, modules
    // counted from 1) and the last module that reads it (the output's: after the last).
    const std::size_t count = ranges.size();
    std::map<std::size_t, std::pair<std::size_t, std::size_t>> span; // value -> (made, last read)
    span[p.inputs()[0]] = {0, 0};
    std::map<std::size_t, std::size_t> weight_user;
    for (std::size_t n = 0; n < p.nodes().size(); ++n) {
        const auto m = module_of_node[n];
        for (auto v : p.nodes()[n].operands) {
            const auto& val = p.value(v);
            if (val.kind == value_kind::weight) {
                const auto [it, fresh] = weight_user.emplace(v, m);
                if (!fresh && it->second != m)
                    throw error("xshard: program modules: the weight " + val.name + " is used by " +
                                ranges[it->second].first + " and by " + ranges[m].first +
                                "; a weight belongs to one module");
                continue;
            }
            auto& s = span[v];
            s.second = std::max(s.second, m + 1);
        }
        for (auto r : p.nodes()[n].results)
            span[r] = {m + 1, m + 1};
    }
    span[p.outputs()[0]].second = count + 1;
    // What crosses cut c (into module c): made before module c, read from module c on.
    std::vector<std::vector<std::size_t>> cut(count + 1);
    for (const auto& [v, s] : span)
        for (std::size_t c = s.first; c < s.second && c <= count; ++c)
            cut[c].push_back(v);
    const auto rank = p.value(p.inputs()[0]).shape.size();
    for (std::size_t c = 1; c < count; ++c) {
        if (cut[c].empty())
            throw error("xshard: program modules: " + ranges[c].first + " reads nothing that " +
                        ranges[c - 1].first + " or a module before it makes");
        const auto& first = p.value(cut[c].front());
        for (auto v : cut[c]) {
            const auto& val = p.value(v);
            if (cut[c].size() > 1 && (rank < 2 || val.shape.empty() ||
                                      val.shape[0] != first.shape[0] || val.type != first.type))
                throw error(
                    "xshard: program modules: the cut between " + ranges[c - 1].first + " and " +
                    ranges[c].first + " carries " +
                    detail::value_names(p, std::set<std::size_t>(cut[c].begin(), cut[c].end())) +
                    ", packed into one tensor only when they have the same rows "
                    "(dimension 0), the same element type and the input has two "
                    "dimensions or more");
        }
    }
    std::vector<program_module> out;
    for (std::size_t m = 0; m < count; ++m) {
        const auto& name = ranges[m].first;
        for (std::size_t n = ranges[m].second.first; n < ranges[m].second.second; ++n)
            for (auto v : p.nodes()[n].operands)
                if (p.value(v).kind == value_kind::weight &&
                    p.value(v).name.rfind(name + ".", 0) != 0)
                    throw error("xshard: program modules: the weight " + p.value(v).name + " of " +
                                name +
                                " is not named inside it (declare it inside "
                                "name_scope(\"" +
                                name + "\"))");
        out.push_back(
            {name, detail::module_program(p, name, ranges[m].second.first, ranges[m].second.second,
                                          m == 0 ? std::vector<std::size_t>{p.inputs()[0]} : cut[m],
                                          m + 1 == count ? p.outputs() : cut[m + 1], rank)});
    }
    return out;
}

} // namespace xshard

