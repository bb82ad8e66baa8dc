#pragma once
/// \file
/// The definitions of what graph/layouts.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/layouts.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL layout batch_layout(std::size_t r, const dim_axes& axes) {
    layout l = layout::replicated(r);
    if (r > 0)
        l.dims[0] = axes;
    return l;
}

XSHARD_DECL dim_axes dataset_axes_of(const layout_options& o, const mesh_shape& mesh) {
    dim_axes axes;
    if (o.dataset_axes.empty()) {
        for (std::size_t i = 0; i < mesh.ndim(); ++i)
            axes.push_back(mesh.names[i]);
        return axes;
    }
    for (const auto& a : o.dataset_axes) {
        if (!mesh.find(a))
            throw error("xshard: compile: the dataset axis '" + a + "' is not an axis of mesh(" +
                        mesh.to_string() + ")");
        axes.push_back(axis_name(a));
    }
    return axes;
}

XSHARD_DECL void shard_weights(const program& p, const mesh_shape& mesh,
                               const std::vector<std::string>& names, std::size_t min_bytes,
                               std::vector<layout>& values) {
    axis_set asked;
    for (const auto& a : names) {
        const auto i = mesh.find(a);
        if (!i)
            throw error("xshard: compile: weight_shard_axes names '" + a +
                        "', which is not an axis of mesh(" + mesh.to_string() + ")");
        if (mesh.sizes[*i] > 1)
            asked = asked.with(*i);
    }
    for (auto id : p.weights()) {
        const auto& v = p.value(id);
        if (double(volume(v.shape)) * double(element_bytes(v.type)) < double(min_bytes))
            continue;
        values[id] = sharded_layout(values[id], mesh, v.shape, asked - values[id].split_axes(mesh));
    }
}

XSHARD_DECL std::vector<layout> asked_layouts(const program_node& n, const op_rules* rules,
                                              std::span<const operand_type> types,
                                              const dim_axes& dataset, const mesh_shape& mesh,
                                              const std::vector<layout>& kept) {
    const auto& a = n.annotation;
    if (!a.in_layouts.empty())
        return a.in_layouts;
    if (!a.in_strategies.empty())
        return rules ? rules->resolve(a.in_strategies, mesh)
                     : resolve_each(a.in_strategies, mesh);
    std::vector<layout> asked;
    if (rules && rules->follows) {
        // (A weight not used before has no layout yet: replicated.)
        for (std::size_t i = 0; i < types.size(); ++i) {
            const auto& l = kept[n.operands[i]];
            asked.push_back(l.rank() == types[i].shape.size()
                                ? whole_terms(l)
                                : layout::replicated(types[i].shape.size()));
        }
        return asked;
    }
    for (std::size_t i = 0; i < types.size(); ++i) {
        const bool batched = rules ? rules->batched(n.attributes, types, i)
                                   : n.custom->batched(types, i);
        asked.push_back(batched ? batch_layout(types[i].shape.size(), dataset)
                                : layout::replicated(types[i].shape.size()));
    }
    return asked;
}

XSHARD_DECL void check_fits(const layout& l, std::size_t rank, const mesh_shape& mesh,
                            const std::string& what) {
    if (l.rank() != rank)
        throw std::invalid_argument(what + " " + l.to_string() + " has " +
                                    std::to_string(l.rank()) + " dimensions, not " +
                                    std::to_string(rank));
    l.validate(mesh);
}

XSHARD_DECL std::vector<bool> place_planned_weights(const program& p, const mesh_shape& mesh,
                                                    const layout_options& options,
                                                    std::vector<layout>& kept) {
    const auto& values = p.values();
    std::vector<bool> planned(values.size(), false);
    for (const auto& [name, l] : options.weight_layouts) {
        bool known = false;
        for (auto id : p.weights()) {
            if (values[id].name != name)
                continue;
            try {
                check_fits(l, values[id].shape.size(), mesh, "the layout");
            } catch (const std::invalid_argument& e) {
                throw error("xshard: compile: weight " + name + " " + shape_text(values[id].shape) +
                            ": " + e.what());
            }
            if (!l.partial.empty())
                throw error("xshard: compile: weight " + name + " is planned " + l.to_string() +
                            ", with pending sums; a weight holds values");
            kept[id] = l;
            planned[id] = known = true;
        }
        if (!known)
            throw error("xshard: compile: weight_layouts names '" + name +
                        "', which is not a weight of the program");
    }
    return planned;
}

} // namespace detail

XSHARD_DECL program_layouts assign_layouts(const program& p, const mesh_shape& mesh,
                                           const layout_options& options) {
    program_layouts out;
    const auto& values = p.values();
    out.values.resize(values.size());
    std::vector<bool> placed(values.size(), false);
    const auto dataset = detail::dataset_axes_of(options, mesh);
    for (auto id : p.inputs()) {
        const auto& v = values[id];
        auto it = options.input_layouts.find(v.name);
        layout l = it != options.input_layouts.end()
                       ? it->second
                       : detail::batch_layout(v.shape.size(), dataset);
        try {
            detail::check_fits(l, v.shape.size(), mesh, "the layout");
        } catch (const std::invalid_argument& e) {
            throw error("xshard: compile: input " + v.name + " " + shape_text(v.shape) + ": " +
                        e.what());
        }
        out.values[id] = l;
        placed[id] = true;
    }
    for (const auto& name_layout : options.input_layouts) {
        bool known = false;
        for (auto id : p.inputs())
            known = known || values[id].name == name_layout.first;
        if (!known)
            throw error("xshard: compile: input_layouts names '" + name_layout.first +
                        "', which is not an input of the program");
    }
    const auto planned = detail::place_planned_weights(p, mesh, options, out.values);
    for (std::size_t id = 0; id < values.size(); ++id)
        placed[id] = placed[id] || planned[id];
    for (const auto& n : p.nodes()) {
        const op_rules* rules = n.custom ? nullptr : &detail::rules_named(n.op);
        std::vector<operand_type> types;
        for (auto id : n.operands)
            types.push_back({values[id].shape, values[id].type,
                             values[id].kind == value_kind::weight});
        layout_choice c;
        try {
            auto asked = detail::asked_layouts(n, rules, types, dataset, mesh, out.values);
            if (n.annotation.empty())
                for (std::size_t i = 0; i < asked.size(); ++i)
                    if (planned[n.operands[i]])
                        asked[i] = out.values[n.operands[i]];
            for (std::size_t i = 0; i < asked.size(); ++i)
                detail::check_fits(asked[i], types[i].shape.size(), mesh,
                                   "operand " + std::to_string(i) + "'s layout");
            c = rules ? rules->rule(n.attributes, types, std::move(asked), mesh)
                      : n.custom->rule(types, std::move(asked), mesh);
            for (std::size_t i = 0; i < n.annotation.out_layouts.size(); ++i)
                detail::check_fits(n.annotation.out_layouts[i],
                                   values[n.results[i]].shape.size(), mesh,
                                   "result " + std::to_string(i) + "'s layout");
        } catch (const std::invalid_argument& e) {
            std::string what = e.what();
            if (what.rfind("xshard: ", 0) == 0)
                what = what.substr(8);
            throw error("xshard: compile: node " + n.name + " (" + n.op + ")" +
                        (n.annotation.empty() ? "" : " shard " + n.annotation.to_string()) +
                        " on mesh(" + mesh.to_string() + "): " + what);
        }
        for (std::size_t i = 0; i < n.operands.size(); ++i) {
            const auto id = n.operands[i];
            if (!placed[id] && values[id].kind == value_kind::weight) {
                out.values[id] = detail::whole_terms(c.operands[i]);
                placed[id] = true;
            }
        }
        for (std::size_t i = 0; i < n.results.size(); ++i) {
            const auto id = n.results[i];
            out.values[id] = i < n.annotation.out_layouts.size() ? n.annotation.out_layouts[i]
                                                                  : c.results[i];
            placed[id] = true;
        }
        out.nodes.push_back(std::move(c));
    }
    for (auto id : p.weights())
        if (!placed[id])
            out.values[id] = layout::replicated(values[id].shape.size());
    detail::shard_weights(p, mesh, options.weight_shard_axes, options.weight_shard_min_bytes,
                          out.values);
    return out;
}

} // namespace xshard

