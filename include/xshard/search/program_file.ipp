#pragma once
/// \file
/// The definitions of what search/program_file.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/program_file.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::string_view initializer_kind_name(initializer::kind k) {
    switch (k) {
    case initializer::kind::constant:
        return "constant";
    case initializer::kind::uniform:
        return "uniform";
    case initializer::kind::normal:
        return "normal";
    case initializer::kind::he_uniform:
        return "he_uniform";
    }
    return "?";
}

XSHARD_DECL initializer::kind parse_initializer_kind(const std::string& name) {
    for (auto k : {initializer::kind::constant, initializer::kind::uniform,
                   initializer::kind::normal, initializer::kind::he_uniform})
        if (initializer_kind_name(k) == name)
            return k;
    throw io_error("xshard: no initializer is called '" + name +
                   "' (constant, uniform, normal, he_uniform)");
}

XSHARD_DECL dtype parse_dtype(const std::string& name) {
    for (auto t : {dtype::f32, dtype::f64, dtype::i64})
        if (to_string(t) == name)
            return t;
    throw io_error("xshard: no element type is called '" + name + "' (f32, f64, i64)");
}

XSHARD_DECL nlohmann::ordered_json argument_json(const program_value& v) {
    nlohmann::ordered_json e;
    e["name"] = v.name;
    e["type"] = std::string(to_string(v.type));
    e["shape"] = v.shape;
    if (v.kind == value_kind::weight)
        e["init"] = {{"kind", std::string(initializer_kind_name(v.init.how))},
                     {"a", v.init.a},
                     {"b", v.init.b}};
    return e;
}

XSHARD_DECL value_shape parse_shape(const nlohmann::json& a) {
    if (!a.is_array())
        throw io_error("xshard: a shape is not a list");
    value_shape s;
    for (const auto& e : a)
        s.push_back(std::size_t(json_count(e, "an extent")));
    volume(s); // overflow-checked
    return s;
}

XSHARD_DECL std::vector<layout> parse_node_layouts(const nlohmann::json& a) {
    std::vector<layout> ls;
    for (const auto& text : a)
        ls.push_back(layout::parse(text.get<std::string>()));
    return ls;
}

XSHARD_DECL void check_node_layouts(const std::vector<layout>& ls,
                                    const std::vector<std::size_t>& ranks, const char* key) {
    if (!ls.empty() && ls.size() != ranks.size())
        throw io_error("xshard: \"" + std::string(key) + "\" gives " + std::to_string(ls.size()) +
                       " layouts for " + std::to_string(ranks.size()) + " values");
    for (std::size_t i = 0; i < ls.size(); ++i)
        if (ls[i].rank() != ranks[i])
            throw io_error("xshard: the layout " + ls[i].to_string() + " in \"" + key +
                           "\" is for " + std::to_string(ls[i].rank()) +
                           " dimensions, its value has " + std::to_string(ranks[i]));
}

XSHARD_DECL std::vector<strategy> parse_strategies(const nlohmann::json& a) {
    std::vector<strategy> s;
    for (const auto& counts : a) {
        strategy st;
        for (const auto& c : counts) {
            if (st.counts.size() == max_tensor_rank)
                throw io_error("xshard: a strategy of more than " +
                               std::to_string(max_tensor_rank) + " dimensions");
            st.counts.push_back(int(json_count(c, "a split count", 1, INT_MAX)));
        }
        s.push_back(st);
    }
    return s;
}

} // namespace detail

XSHARD_DECL std::string program_json(const program& p) {
    nlohmann::ordered_json j;
    detail::write_envelope(j, detail::program_file_kind);
    auto inputs = nlohmann::ordered_json::array(), weights = nlohmann::ordered_json::array();
    for (auto id : p.inputs())
        inputs.push_back(detail::argument_json(p.value(id)));
    for (auto id : p.weights())
        weights.push_back(detail::argument_json(p.value(id)));
    j["inputs"] = std::move(inputs);
    j["weights"] = std::move(weights);
    auto nodes = nlohmann::ordered_json::array();
    for (const auto& n : p.nodes()) {
        if (n.custom)
            throw error("xshard: node " + n.name +
                        " is a custom-VJP node, whose forward and backward are the program's "
                        "own code: a program file cannot hold it");
        nlohmann::ordered_json e;
        e["name"] = n.name;
        e["op"] = n.op;
        auto operands = nlohmann::ordered_json::array();
        for (auto id : n.operands)
            operands.push_back(p.value_name(id));
        e["operands"] = std::move(operands);
        e["ints"] = n.attributes.ints;
        e["reals"] = n.attributes.reals;
        const auto& a = n.annotation;
        if (!a.in_strategies.empty()) {
            auto s = nlohmann::ordered_json::array();
            for (const auto& st : a.in_strategies)
                s.push_back(std::vector<int>(st.counts.begin(), st.counts.end()));
            e["strategies"] = std::move(s);
        }
        for (const auto& [key, ls] : {std::pair{"in", &a.in_layouts}, {"out", &a.out_layouts}})
            if (!ls->empty()) {
                auto s = nlohmann::ordered_json::array();
                for (const auto& l : *ls)
                    s.push_back(l.to_string());
                e[key] = std::move(s);
            }
        nodes.push_back(std::move(e));
    }
    j["nodes"] = std::move(nodes);
    auto outputs = nlohmann::ordered_json::array();
    for (auto id : p.outputs())
        outputs.push_back(p.value_name(id));
    j["outputs"] = std::move(outputs);
    return j.dump(1) + "\n";
}

XSHARD_DECL void save_program(const std::string& path, const program& p) {
    const auto text = program_json(p);
    try {
        detail::write_file_atomically(path, text);
    } catch (const io_error&) {
        throw;
    } catch (const std::exception& e) {
        throw io_error("xshard: cannot write the program file " + path + ": " + e.what());
    }
}

XSHARD_DECL program parse_program(std::string_view text, const std::string& path) {
    const auto& kind = detail::program_file_kind;
    return detail::read_json_file(kind, path, [&] {
        const auto doc = detail::read_envelope(text, kind);
        const auto& j = doc.json;
        program p;
        std::map<std::string, std::size_t> ids; // value names, as the listing writes them
        const auto define = [&](const std::string& name, std::size_t id) {
            if (!ids.emplace(name, id).second)
                throw io_error("xshard: the value name '" + name + "' appears twice");
        };
        for (const auto* list : {"inputs", "weights"})
            for (const auto& e : j.at(list)) {
                const bool weight = std::string_view(list) == "weights";
                initializer init = initializer::zeros();
                if (weight) {
                    const auto& i = e.at("init");
                    init = {detail::parse_initializer_kind(i.at("kind").get<std::string>()),
                            i.at("a").get<double>(), i.at("b").get<double>()};
                }
                const auto name = e.at("name").get<std::string>();
                define(name,
                       p.add_argument(weight ? value_kind::weight : value_kind::input, name,
                                      detail::parse_shape(e.at("shape")),
                                      detail::parse_dtype(e.at("type").get<std::string>()), init));
            }
        for (const auto& e : j.at("nodes")) {
            program_node n;
            n.name = e.at("name").get<std::string>();
            try {
                n.op = e.at("op").get<std::string>();
                n.attributes.ints = e.at("ints").get<std::vector<std::int64_t>>();
                n.attributes.reals = e.at("reals").get<std::vector<double>>();
                std::vector<operand_type> types;
                for (const auto& o : e.at("operands")) {
                    const auto it = ids.find(o.get<std::string>());
                    if (it == ids.end())
                        throw io_error("xshard: operand '" + o.get<std::string>() +
                                       "' is not a value defined before the node");
                    n.operands.push_back(it->second);
                    const auto& v = p.value(it->second);
                    types.push_back({v.shape, v.type, v.kind == value_kind::weight});
                }
                const auto results = detail::rules_named(n.op).infer(n.attributes, types);
                if (e.contains("in"))
                    n.annotation.in_layouts = detail::parse_node_layouts(e.at("in"));
                if (e.contains("out"))
                    n.annotation.out_layouts = detail::parse_node_layouts(e.at("out"));
                std::vector<std::size_t> in_ranks, out_ranks;
                for (const auto& t : types)
                    in_ranks.push_back(t.shape.size());
                for (const auto& r : results)
                    out_ranks.push_back(r.first.size());
                detail::check_node_layouts(n.annotation.in_layouts, in_ranks, "in");
                detail::check_node_layouts(n.annotation.out_layouts, out_ranks, "out");
                const std::size_t index = p.add_node(n, results);
                const auto& added = p.nodes()[index];
                for (std::size_t r = 0; r < added.results.size(); ++r)
                    define(added.results.size() == 1 ? n.name : n.name + ":" + std::to_string(r),
                           added.results[r]);
                if (e.contains("strategies"))
                    p.shard(n.name, detail::parse_strategies(e.at("strategies")));
            } catch (const std::exception& x) {
                throw io_error("xshard: node " + n.name + ": " +
                               std::string(detail::without_prefix(x.what())));
            }
        }
        for (const auto& o : j.at("outputs")) {
            const auto it = ids.find(o.get<std::string>());
            if (it == ids.end())
                throw io_error("xshard: the output '" + o.get<std::string>() +
                               "' is not a value of the program");
            p.add_output(it->second);
        }
        return p;
    });
}

} // namespace xshard

