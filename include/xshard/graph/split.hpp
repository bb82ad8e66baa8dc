#pragma once
/// \file
/// A program cut into modules at its top-level scopes: the nodes named "block0.*" (or the one
/// node named "block0") make module "block0", in the program's order, and each module is a
/// program of its own whose one input is what the module before it passes on. This is how a
/// program becomes a chain of layers (graph/program_chain.hpp) that a pipeline cuts into
/// stages.
///
/// A module's program keeps the nodes' names and the weights' full names and initializers,
/// so its weights are drawn with the values the whole program's would have. A cut carries
/// one tensor: the program's one input enters the first module, each module's one result
/// used later enters the next, and the last module's is the program's one output. What does
/// not fit raises xshard::error naming the modules and values: a skip connection across a
/// cut, a weight used by two modules, a scope whose nodes are not consecutive.

#include <xshard/comm/error.hpp>
#include <xshard/graph/program.hpp>

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// One module of a cut program: its name (the top-level scope) and its program.
struct program_module {
    std::string name;
    program body;
};

namespace detail {

/// The top-level scope of a node's name: "block0" for "block0.fc.matmul" and for "block0".
inline std::string top_scope(const std::string& name) {
    return name.substr(0, name.find('.'));
}

/// "a, b, c" of the values' display names.
inline std::string value_names(const program& p, const std::set<std::size_t>& ids) {
    std::string out;
    for (auto id : ids)
        out += (out.empty() ? "" : ", ") + p.value_name(id);
    return out;
}

/// The module's program: nodes [first, last) of `p` reading `input` (a value of `p`), with
/// `output` its output.
inline program module_program(const program& p, std::size_t first, std::size_t last,
                              std::size_t input, std::size_t output) {
    program out;
    std::map<std::size_t, std::size_t> id; // value of p -> value of out
    const auto& in = p.value(input);
    id[input] = out.add_argument(value_kind::input, p.value_name(input), in.shape, in.type);
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
    out.add_output(id.at(output));
    return out;
}

} // namespace detail

/// `p` cut into its modules (see the file comment). `p` has one input and one output.
inline std::vector<program_module> split_modules(const program& p) {
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
    // The module of each value's producer, and the modules that read it.
    std::map<std::size_t, std::size_t> weight_user;
    std::vector<std::set<std::size_t>> reads(ranges.size()), passes(ranges.size());
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
            const std::size_t from =
                val.kind == value_kind::input ? ranges.size() : module_of_node[val.node];
            if (from != m) {
                reads[m].insert(v);
                if (from < ranges.size())
                    passes[from].insert(v);
            }
        }
    }
    const auto& result = p.value(p.outputs()[0]);
    if (result.kind != value_kind::result)
        throw error("xshard: program modules: the program's output " + result.name +
                    " is not computed by a node");
    passes[module_of_node[result.node]].insert(p.outputs()[0]);
    std::vector<program_module> out;
    for (std::size_t m = 0; m < ranges.size(); ++m) {
        const auto& name = ranges[m].first;
        const std::size_t input = m == 0 ? p.inputs()[0] : *passes[m - 1].begin();
        if (reads[m].size() > 1 || (reads[m].size() == 1 && *reads[m].begin() != input))
            throw error(
                "xshard: program modules: " + name + " reads " + detail::value_names(p, reads[m]) +
                ", but a module reads one tensor: " +
                (m == 0 ? "the program's input" : "what " + ranges[m - 1].first + " passes on") +
                " (put a skip connection inside one scope)");
        if (passes[m].size() != 1)
            throw error("xshard: program modules: " + name + " passes on " +
                        detail::value_names(p, passes[m]) +
                        ", but a module passes one tensor to the next" +
                        (m + 1 == ranges.size() ? " (the program's output)" : ""));
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
            {name, detail::module_program(p, ranges[m].second.first, ranges[m].second.second, input,
                                          *passes[m].begin())});
    }
    return out;
}

} // namespace xshard
